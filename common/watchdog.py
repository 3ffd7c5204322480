"""The ranks' half of the watchdog: leave the runner a pid, a stack dump on demand, and the error line.

When the runner sets TUTOR_RUN_DIR, each rank writes there
  rankR.pid    its process id, so the runner can signal and end it even if mpiexec is gone;
  rankR.stack  a faulthandler dump of every thread, written when the runner sends SIGUSR1;
  rankR.error  the exception that killed it, one line, with the lesson's file:line (mpi4py's own
               errors as "MPI.Exception: ...": the runner reads those as a possible echo of a dead peer).
"""
import faulthandler
import os
import signal
import sys
import traceback

_keep = []  # faulthandler writes to this file later: it must stay open


def install(rank):
    run_dir = os.environ.get("TUTOR_RUN_DIR")
    if not run_dir or not os.path.isdir(run_dir):
        return
    base = os.path.join(run_dir, f"rank{rank}")
    with open(base + ".pid", "w") as f:
        f.write(str(os.getpid()))
    stack = open(base + ".stack", "w")
    _keep.append(stack)
    faulthandler.register(signal.SIGUSR1, file=stack, all_threads=True)
    previous = sys.excepthook

    def hook(kind, value, tb):
        frames = [fr for fr in traceback.extract_tb(tb) if "site-packages" not in fr.filename
                  and not fr.filename.startswith("<")]
        where = f" ({os.path.relpath(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""
        line = (str(value).strip().splitlines() or [""])[0]
        name = f"MPI.{kind.__name__}" if kind.__module__ == "mpi4py.MPI" else kind.__name__
        with open(base + ".error", "w") as f:
            f.write(f"{name}: {line}{where}\n")
        previous(kind, value, tb)

    sys.excepthook = hook
