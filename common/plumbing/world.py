"""A run proves its world before it teaches: this process must be one of the ranks the launcher
started, all in one world. When the launcher belongs to another MPI than the one mpi4py was built for,
each process comes up as a world of one, rank 0 of 1, and would teach (and pass) alone.

The size the world must have comes from the runner (TUTOR_NP, its -n) or else from the launcher's own
variables (PMI_SIZE: hydra, Intel MPI, srun's PMI; OMPI_COMM_WORLD_SIZE: Open MPI's mpirun).
"""
import os
import sys

from common import mpilib
from common.plumbing import run_folder

SIZE_VARS = ("TUTOR_NP", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE")


def expected():
    """(size, who said so) for the world this process should be in, or (None, None) when unknown."""
    for var in SIZE_VARS:
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var]), var
    return None, None


def launcher_words():
    """The launcher, as the runner named it (TUTOR_LAUNCHER) or as its variables suggest."""
    if os.environ.get("TUTOR_LAUNCHER"):
        return os.environ["TUTOR_LAUNCHER"]
    if any(v.startswith(("OMPI_", "PMIX_")) for v in os.environ):
        return "Open MPI's (OMPI_ variables set)"
    if "PMI_SIZE" in os.environ:
        return "a PMI one (MPICH hydra, Intel MPI, srun)"
    return "one that set no MPI variables"


def confirm(comm, MPI):
    """Stop before any output unless COMM_WORLD has the size the launcher was asked for: one line,
    exit status 3, and (under the runner) a mark in the run folder that makes the run a crash, never
    a pass, however the launcher itself exits. Every process of a wrong world is rank 0 of its own."""
    want, source = expected()
    if want is None or comm.size == want:
        return
    line = (f"wrong world: {comm.size} rank(s) of the {want} started ({source}); mpi4py's MPI is "
            f"{mpilib.current().name}, the launcher is {launcher_words()}")
    if not marked(line):
        print(line, file=sys.stderr, flush=True)
    MPI.Finalize()  # after Finalize, mpi4py's -m exits with our status instead of calling MPI_Abort
    sys.exit(3)


def marked(line):
    """True when the runner's run folder holds the mark (the runner then says the line, once)."""
    run_dir = run_folder.seen()
    if not run_dir:
        return False
    try:
        fd = os.open(run_folder.wrong_world(run_dir), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return True
    except OSError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(line)
    return True
