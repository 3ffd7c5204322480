"""torch's end at exit (issue 23, item 6): no run dies of SIGABRT after every check passed.

The abort was a gloo worker thread dropping a finished collective's tensors (which takes the GIL)
after the interpreter had begun to shut down: Python ends such a thread with pthread_exit, which C++
cannot unwind through a destructor, so std::terminate. It happened whenever the process group was
still alive at shutdown (DDP's import of torch.distributed.nn.functional and DTensor's caches held
it) and a worker was late. common/plumbing/teardown.end_torch frees the group at exit while Python runs.

test_no_torch_thread_outlives_python proves the cause is gone, every time: a probe trains one DDP
step and one fully_shard step as lessons 08 and 10 do, and at the very end of Python's exit handlers
(after the kit's) lists the threads init_torch started that still run: there must be none. The
stress tests repeat real runs of lessons 08 and 10 under a busy core, where 2 runs in 15 (lesson 10,
NP 3, MPICH) and 1 in 10 (lesson 08, NP 2, Open MPI) aborted before.
They take about 7 minutes of a test worker on 2 cores (a third of `make test-torch`), so they run
by hand (`pytest -m stress`); the probe holds the cause in CI.
"""
import os
import signal
import subprocess

import pytest

from common.runner import supervise
from conftest import ROOT, tutor

pytestmark = pytest.mark.torch

PROBE = r'''
import atexit, os
from common import bootstrap, report  # PYTHONPATH holds the kit
out = os.environ["PROBE_OUT"]

def tids():
    return set(os.listdir("/proc/self/task"))

group = set()
real_init = bootstrap.init_torch
def init_torch(ctx):  # the threads born here are the process group's and its store's
    import torch.distributed  # noqa: F401  (not torch's own: an import starts threads of its own)
    before = tids()
    real_init(ctx)
    group.update(tids() - before)
bootstrap.init_torch = init_torch

def left():  # registered before the kit's handler, so it runs after it (last in, first out)
    names = []
    for tid in sorted(group & tids()):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:  # ended meanwhile
            pass
    rank = os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    with open(f"{out}.{rank}", "w") as f:
        f.write(f"{len(group)}\n" + "\n".join(names))
atexit.register(left)

def main():  # as a lesson does: the models are main's, gone when it returns
    args, ctx = bootstrap.start(__file__, bootstrap.lesson_parser(__file__, "probe"))
    import torch
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel
    ddp = DistributedDataParallel(torch.nn.Linear(4, 4))  # as lesson 08
    ddp(torch.ones(2, 4)).sum().backward()
    net = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 2))
    for layer in net:
        fully_shard(layer)  # as lesson 10
    fully_shard(net)
    net(torch.ones(3, 4)).sum().backward()
    report.finish(ctx, {"ok": 1})


main()
'''


def test_no_torch_thread_outlives_python(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    cmd = supervise.command(str(probe), 2, ["--api", "torch", "--device", "cpu"])
    env = {**os.environ, "PYTHONPATH": ROOT, "PROBE_OUT": str(tmp_path / "threads")}
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    for rank in (0, 1):
        started, *left = (tmp_path / f"threads.{rank}").read_text().split()
        assert int(started) > 0, f"rank {rank}: torch started no thread: the probe sees nothing"
        assert left == [], (f"rank {rank}: torch's threads {left} still ran when Python began to shut "
                            "down; one finishing a collective then would abort the process")


def _busy_core():
    """One core kept busy, as a learner's other work would (the abort needs a late worker thread)."""
    return subprocess.Popen(["sh", "-c", "while :; do :; done"], start_new_session=True)


# runs per lesson (TUTOR_STRESS_RUNS): 16 in all catch a 1-in-15 abort 2 times in 3 (24 runs took 9 min
# on 2 cores shared with five other suites); the probe above catches the cause every time.
# TUTOR_STRESS_RUNS=30 is the bar: 30 passes in a row
RUNS = int(os.environ.get("TUTOR_STRESS_RUNS", "8"))


@pytest.mark.stress
@pytest.mark.timeout(60 * RUNS)
@pytest.mark.parametrize("lesson, np", [("08", 2), ("10", 3)])
def test_torch_runs_end_cleanly_under_load(lesson, np):
    busy = _busy_core()
    bad = []
    try:
        for i in range(RUNS):
            run = tutor("run", lesson, "-n", str(np), "--api", "torch", timeout=240)
            if run.returncode != 0:
                tail = [line for line in run.stdout.splitlines()[-4:] if line.strip()]
                bad.append(f"run {i + 1}: exit {run.returncode}: {' | '.join(tail)}")
    finally:
        os.killpg(busy.pid, signal.SIGKILL)
        busy.wait()
    assert not bad, f"{len(bad)} of {RUNS} runs of lesson {lesson} at NP {np} failed:\n" + "\n".join(bad)


FAILING = r'''
import time
import torch
import torch.distributed as dist
from common import bootstrap

args, ctx = bootstrap.start(__file__, bootstrap.lesson_parser(__file__, "failing"))
if ctx.rank == 1:
    dist.all_reduce(torch.ones(4), async_op=True)  # a collective rank 0 never joins
    raise RuntimeError("a learner's mistake")
time.sleep(60)
'''


def test_a_failing_rank_still_takes_every_rank_down_at_once(tmp_path):
    """A rank that dies of an uncaught error with a collective in flight aborts every rank at exit: the
    group's end would wait for that collective, which no peer will ever join (before, the run hung at
    Python's end until the runner's timeout, on the old code as well)."""
    probe = tmp_path / "failing.py"
    probe.write_text(FAILING)
    cmd = supervise.command(str(probe), 2, ["--api", "torch", "--device", "cpu"])
    done = supervise.supervise(cmd, 45, echo=False, env={"PYTHONPATH": ROOT})
    assert not done.timed_out, "the failing rank hung at exit instead of aborting the run"
    assert done.rc != 0 and "a learner's mistake" in done.errors.get(1, ""), (done.rc, done.errors)
