"""An MPI error raised in a learner's code is reported as that error, on that rank, on any MPI
(issue 23, item 5).

On Open MPI 5 a truncated receive (lesson 09's "counts not exchanged first") raised MPI_ERR_TRUNCATE
on ranks 0 and 2, then rank 0 died of SIGSEGV inside its exception hook (the error had left its heap
broken) before writing its error file. The runner called rank 0's signal the culprit and the real
MPI_ERR_TRUNCATE the echo of a dead peer. Now each rank writes its error line first, led by the MPI
error class, and only classes a dead peer can cause are read as echoes.
"""
import os
import subprocess

from common.plumbing import run_folder
from common.runner import mpi_launchers, supervise, verdict
from conftest import ROOT

TRUNC = "MPI.Exception: MPI_ERR_TRUNCATE: message truncated"
OMPI_BANNER = ["--------------------------------------------------------------------------",
               "prterun noticed that process rank 0 with PID 8707 on node vm exited on",
               "signal 11 (Segmentation fault).",
               "--------------------------------------------------------------------------"]


def outcome(errors, tail=OMPI_BANNER, statuses=None):
    return supervise.Outcome(rc=139, seconds=1.0, pids={0: 8707, 1: 8708, 2: 8709}, errors=errors, tail=tail,
                          statuses=statuses)


def test_a_truncated_receive_is_the_rank_own_error_not_a_dead_peer_echo():
    # what Open MPI 5 left before the fix: rank 0 died before writing its error, rank 2 wrote its own
    lines = verdict.explain(None, outcome({2: TRUNC + " (common/p2p.py:61)"}), None)
    assert lines[0] == f"rank 2 failed: {TRUNC} (common/p2p.py:61)", lines
    assert "rank 0 (pid 8707) was killed by signal 11 (SIGSEGV) as well" in lines, lines
    assert not any("peer was gone" in line for line in lines), lines


def test_both_ranks_errors_first_then_the_signal_that_followed():
    lines = verdict.explain(None, outcome({0: TRUNC, 2: TRUNC + " (common/p2p.py:61)"}), None)
    assert lines[:2] == [f"rank 0 failed: {TRUNC}", f"rank 2 failed: {TRUNC} (common/p2p.py:61)"], lines
    assert lines[2] == "rank 0 (pid 8707) was then killed by signal 11 (SIGSEGV)", lines


def test_an_error_a_dead_peer_causes_is_still_read_as_its_echo():
    lines = verdict.explain(None, outcome({2: "MPI.Exception: MPI_ERR_OTHER: connection closed (x.py:3)"},
                                          tail=[], statuses=[11 << 0, 9, 256]), None)
    assert lines[0].startswith("rank 0 (pid 8707) was killed by signal 11 (SIGSEGV)"), lines
    assert lines[1].startswith("rank 2 then failed (a peer was gone): MPI.Exception: MPI_ERR_OTHER"), lines


def test_open_mpi_report_wrapped_anywhere_names_its_own_launcher():
    said = verdict.killed_rank(outcome({}))
    assert said == "rank 0 (pid 8707) was killed by signal 11 (SIGSEGV); prterun then ended the other ranks"


HOOKED = r'''
import os, sys
from mpi4py import MPI
from common.plumbing import watchdog
watchdog.install(0)
def receive_too_little():
    raise MPI.Exception(MPI.ERR_TRUNCATE)
receive_too_little()
'''


def test_the_rank_writes_its_mpi_error_with_class_and_line(tmp_path):
    script = tmp_path / "truncated.py"
    script.write_text(HOOKED)
    env = {**os.environ, run_folder.ENV: str(tmp_path), "PYTHONPATH": ROOT}
    run = subprocess.run([mpi_launchers.python(), str(script)], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=60)
    assert run.returncode != 0
    line = open(run_folder.rank_file(tmp_path, 0, "error")).read()
    assert line.startswith("MPI.Exception: MPI_ERR_TRUNCATE: "), line
    assert line.rstrip().endswith(f"({os.path.relpath(script, ROOT)}:7)"), line  # not mpi4py's .pyx


RING = r'''
import numpy as np
from common import bootstrap
args, ctx = bootstrap.start(__file__, bootstrap.lesson_parser(__file__, "truncated"))
right, left = (ctx.rank + 1) % ctx.world_size, (ctx.rank - 1) % ctx.world_size
ctx.comm.Sendrecv(np.ones(64), dest=right, recvbuf=np.empty(8), source=left)  # 8 slots for 64 values
'''


def test_a_real_truncated_receive_is_named_on_the_mpi_installed(tmp_path):
    script = tmp_path / "ring.py"
    script.write_text(RING)
    cmd = supervise.command(str(script), 2, ["--api", "mpi4py", "--device", "cpu"])
    done = supervise.supervise(cmd, 60, echo=False, env={"PYTHONPATH": ROOT})
    lines = verdict.explain(None, done, None)
    assert done.rc != 0 and lines, lines
    assert "failed: MPI.Exception: MPI_ERR_TRUNCATE" in lines[0], lines
    assert not any("peer was gone" in line for line in lines), lines
