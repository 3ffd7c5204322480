"""Which MPI library this run is on, so that what a lesson says about MPI's insides (eager limits,
rendezvous, progress, settings, the algorithm it picks) is said of the library that ran.

    lib = mpilib.current()    # once MPI is up (after bootstrap.start)
    lib.kind                  "mpich", "openmpi", or "other" (Intel MPI, MVAPICH, Cray MPICH derive
                              from MPICH but have settings and defaults of their own: "other")
    lib.name                  "MPICH 5.0.2", "Open MPI 5.0.11", or the library's first line, cleaned
    mpilib.moves_large(lib)   where a started large message moves on it, in a few words
    mpilib.mpi_classes()      {error class: "MPI_ERR_..."}, to name an mpi4py error by its class

Get_library_version() is the library's own text: several lines for MPICH, one long line ending in a
NUL for Open MPI 5. A name printed from it is one line, printable, within 100 columns.
"""
import re
import sys
from dataclasses import dataclass

from common.text import one_line


@dataclass(frozen=True)
class Library:
    kind: str
    name: str
    version: str = ""

    @property
    def major(self):
        head = self.version.split(".")[0]
        return int(head) if head.isdigit() else None


def parse(text):
    """A Library from Get_library_version()'s text (pure)."""
    first = one_line((text.replace("\0", "").strip().splitlines() or [""])[0], width=10 ** 6)
    mpich = re.match(r"MPICH Version:\s*(\S+)", first)
    if mpich:
        return Library("mpich", f"MPICH {mpich[1]}", mpich[1])
    ompi = re.match(r"Open MPI v(\d[\w.]*)", first)
    if ompi:
        return Library("openmpi", f"Open MPI {ompi[1]}", ompi[1])
    return Library("other", one_line(first) or "an MPI library that does not name itself")


def current():
    from mpi4py import MPI
    return parse(MPI.Get_library_version())


def mpi_classes():
    """{error class: 'MPI_ERR_...'} of the MPI library mpi4py runs on ({} before mpi4py is imported)."""
    MPI = sys.modules.get("mpi4py.MPI")
    if MPI is None:
        return {}
    return {getattr(MPI, k): "MPI_" + k for k in sorted(dir(MPI), reverse=True)  # first name wins a tie
            if k.startswith("ERR_") and k != "ERR_LASTCODE" and isinstance(getattr(MPI, k), int)}


def moves_large(lib, progress_thread=False):
    """Where a started large (rendezvous) message, or a non-blocking collective, moves on `lib`,
    as a clause: "only inside MPI calls ...". progress_thread: MPICH's progress thread is on."""
    if lib.kind == "mpich":
        return ("on MPICH's progress thread (MPIR_CVAR_ASYNC_PROGRESS is set), which needs a free core"
                if progress_thread else "only inside MPI calls (MPICH's progress thread is off; "
                "MPIR_CVAR_ASYNC_PROGRESS=1 turns it on)")
    if lib.kind == "openmpi" and lib.major is not None and lib.major <= 5:
        return f"only inside MPI calls ({lib.name} runs no progress thread for it)"
    return ("inside MPI calls, and between them only where the library runs a progress thread or its "
            "network moves the data itself: that depends on the library and its transport")
