"""The ranks' half of the watchdog: leave the runner a pid, a stack dump on demand, and the error line.

When the runner gives a run folder (TUTOR_RUN_DIR, common/plumbing/run_folder.py), each rank writes there
  rankR.pid    its process id, so the runner can signal and end it even if mpiexec is gone;
  rankR.stack  a faulthandler dump of every thread, written when the runner sends SIGUSR1;
  rankR.error  the exception that killed it, one line, with the lesson's file:line (mpi4py's own
               errors as "MPI.Exception: MPI_ERR_CLASS: ...": the runner reads the class to tell the
               rank's own mistake from a possible echo of a dead peer).
"""
import faulthandler
import os
import signal
import socket
import sys
import traceback

from common.mpilib import mpi_classes
from common.plumbing import run_folder

_keep = []  # faulthandler writes to this file later: it must stay open


def install(rank):
    run_dir = run_folder.given()
    if run_dir and not os.path.isdir(run_dir):  # launched on a node that does not share it
        sys.stderr.write(f"rank {rank} on {socket.gethostname()} cannot see the run folder: set TUTOR_RUN_ROOT "
                         "to one all nodes see\n")
    if not run_dir or not os.path.isdir(run_dir):
        return
    error = run_folder.rank_file(run_dir, rank, "error")
    with open(run_folder.rank_file(run_dir, rank, "pid"), "w") as f:
        f.write(str(os.getpid()))
    stack = open(run_folder.rank_file(run_dir, rank, "stack"), "w")
    _keep.append(stack)
    faulthandler.register(signal.SIGUSR1, file=stack, all_threads=True)
    previous = sys.excepthook
    classes = mpi_classes()  # now, while the heap is sound: the hook must allocate as little as it can

    def hook(kind, value, tb):
        line = (str(value).strip().splitlines() or [""])[0]
        name = kind.__name__
        if kind.__module__ == "mpi4py.MPI":
            name, line = "MPI." + name, with_class(value, line, classes)
        write(error, f"{name}: {line}\n")  # at once: an MPI error may have broken the heap
        frames = [fr for fr in traceback.extract_tb(tb) if "site-packages" not in fr.filename
                  and os.path.isfile(fr.filename)]  # not mpi4py's own .pyx sources, named but absent
        if frames:
            write(error, f"{name}: {line} ({os.path.relpath(frames[-1].filename)}:"
                         f"{frames[-1].lineno})\n")
        previous(kind, value, tb)

    sys.excepthook = hook


def write(path, text):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)  # no file object: less to allocate
    try:
        os.write(fd, text.encode(errors="replace"))
    finally:
        os.close(fd)


def with_class(exc, line, classes):
    """'MPI_ERR_TRUNCATE: message truncated': an mpi4py error's line led by its MPI error class, which
    says whether the rank's own call went wrong (a truncated receive, a bad count) or it may echo a
    dead peer (common/runner/verdict.py reads it)."""
    try:
        name = classes.get(exc.Get_error_class())
    except Exception:  # not a real MPI.Exception
        name = None
    if name is None:
        return line
    line = line.removesuffix(", error stack:")  # MPICH's first line announces a stack printed below
    return line if line.startswith(name) else f"{name}: {line}"
