"""Nothing hangs, nothing is left behind, nothing collides; bad input gets one clear line.

Each bad input is answered by one line naming the problem and a non-zero exit, without a traceback."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from common import bootstrap, timing
from common.plumbing import run_folder
from common.runner import catalog, mpi_launchers, preflight, supervise, verdict
from conftest import FIXTURES, ROOT, TUTOR, processes_running, tutor

# these tests look for the fixture lessons' processes by name: under pytest-xdist (make test) they
# share one worker, so one test never sees another's run of the same fixture as its own leftover
pytestmark = pytest.mark.xdist_group("fixture_processes")

FIX = {"TUTOR_LESSONS": FIXTURES}
CEILING = preflight.np_ceiling()  # None with MPIEXEC set: a cluster launcher's ranks may go to other nodes
needs_ceiling = pytest.mark.skipif(CEILING is None, reason="MPIEXEC is set: no rank ceiling to pass")


def one_line_error(proc, *fragments, code=None):
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert code is None or proc.returncode == code, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stdout + proc.stderr
    lines = [l for l in proc.stderr.split("-" * 20)[0].splitlines() if l.strip()]  # Open MPI's own
    # banner (between rules of dashes: a process exited non-zero) follows the line when run by hand
    assert len(lines) == 1, proc.stderr
    assert code is None or len(lines[0]) <= 100, f"{len(lines[0])} columns: {lines[0]}"
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.mark.parametrize("args, fragments", [
    (["run", "1", "-n", "0"], ["NP must be at least 1, got 0"]),
    (["run", "1", "-n", "-3"], ["NP must be at least 1, got -3"]),
    (["run", "1", "-n", "four"], ["NP must be a whole number, got 'four'"]),
    (["run", "1", "-n", "9"], ["01_pass runs with NP 1..4, got 9"]),
    (["run", "2", "-n", "1"], ["02_wrong runs with NP at least 2, got 1"]),
    (["run", "pas"], ["no lesson 'pas'", "did you mean", "pass"]),
    (["run", "1", "--api", "jax"], ["offers --api mpi4py, not 'jax'"]),
    (["run", "1", "--timeout", "-1"], ["--timeout must be positive"]),
    (["run", "1", "--timeout", "nan"], ["--timeout must be positive", "not nan", "cannot be switched off"]),
    (["run", "1", "--timeout", "inf"], ["--timeout must be positive", "not inf"]),
    (["run", "1", "--timeout", "1e400"], ["--timeout must be positive", "not inf"]),
    (["run", "1", "--timeout", "86401"], ["at most 86400 s"]),
    (["run", "1", "--", "--api", "torch"], ["`--api` after `--` would override the runner's --api"]),
    (["run", "1", "--", "--ap=torch"], ["`--ap` after `--`", "--api"]),
    (["run", "1", "--", "--dev", "cpu"], ["runner's --device"]),
    (["run", "1", "--", "--json", "x.json"], ["runner's --json"]),
])
def test_bad_runner_input(args, fragments):
    one_line_error(tutor(*args, env={**FIX, "CUDA_VISIBLE_DEVICES": ""}), *fragments, code=verdict.EXIT["usage"])


@pytest.mark.parametrize("args, fragments", [
    (["run", "1", "--device", "gpu"], ["blocked: CUDA_VISIBLE_DEVICES hides every GPU; use --device cpu"]),
    pytest.param(["run", "2", "-n", str((CEILING or 0) + 1)], ["blocked: -n", "more ranks than", "--force"],
                 marks=needs_ceiling),
])
def test_what_this_machine_lacks_is_blocked(args, fragments, tmp_path):
    """Not the learner's mistake, not the lesson's: one line, exit 4, nothing launched, and the
    verdict kept in the results JSON like any other."""
    out = tmp_path / "out.json"
    proc = tutor(*args, "--json", str(out), env={**FIX, "CUDA_VISIBLE_DEVICES": ""})
    one_line_error(proc, *fragments, code=verdict.EXIT["blocked"])
    assert "$ " not in proc.stdout, "it launched a run this machine cannot make"
    doc = json.loads(out.read_text())
    assert doc["status"] == "blocked" and doc["ok"] is False and doc["checks"] == [], doc
    assert doc["why"] == [proc.stderr.strip().removeprefix("tutor: ")]


def test_a_missing_library_is_blocked(monkeypatch):
    lesson = catalog.resolve("01", FIXTURES)
    real = preflight.importlib.util.find_spec
    monkeypatch.setattr(preflight.importlib.util, "find_spec", lambda name: None if name == "torch" else real(name))
    with pytest.raises(preflight.Blocked, match="cannot import torch .*use --api mpi4py"):
        preflight.needs(lesson, 2, "torch", "cpu")
    preflight.needs(lesson, 2, "mpi4py", "cpu")  # the MPI path needs no torch


@pytest.mark.parametrize("module", ["mpi4py", "numpy"])
def test_a_python_without_mpi4py_is_blocked_before_the_launch(monkeypatch, module):
    """TUTOR_PYTHON without mpi4py was launched anyway, and MPI's abort banner hid the ImportError
    (issue 38 L6): needs() looks it up (find_spec, made to miss it here) and says so in one line."""
    lesson = catalog.resolve("01", FIXTURES)
    real = preflight.importlib.util.find_spec
    monkeypatch.setattr(preflight.importlib.util, "find_spec", lambda name: None if name == module else real(name))
    with pytest.raises(preflight.Blocked, match=f"cannot import {module}, which every lesson needs: .*pip install"):
        preflight.needs(lesson, 2, "mpi4py", "cpu")


@pytest.fixture
def fake_gpu(tmp_path):
    """A stand-in nvidia-smi that lists one GPU, so the NCCL rank-per-GPU rule can be exercised."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: Fake GPU (UUID: GPU-0)'\n")
    smi.chmod(0o755)
    return {"PATH": f"{tmp_path}:{os.environ['PATH']}"}


def test_more_local_ranks_than_gpus(fake_gpu):
    proc = tutor("run", "1", "-n", "2", "--device", "gpu", env={**FIX, **fake_gpu})
    one_line_error(proc, "blocked: 2 ranks, 1 GPU(s) here", "one GPU per rank", code=verdict.EXIT["blocked"])


def test_lesson_refuses_gpu_itself_when_launched_by_hand():
    cmd = [*mpi_launchers.mpiexec(2), "-n", "2", sys.executable, "-m", "mpi4py",
           os.path.join(FIXTURES, "01_pass.py"), "--device", "gpu"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    one_line_error(proc, "01_pass: --device gpu: no usable GPU")


def test_one_gpu_probe_per_node_not_per_rank(tmp_path):
    calls = tmp_path / "calls"
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho \"$*\" >> {calls}\necho 'GPU 0: Fake GPU (UUID: GPU-0)'\n")
    smi.chmod(0o755)
    cmd = [*mpi_launchers.mpiexec(3), "-n", "3", sys.executable, "-m", "mpi4py",
           os.path.join(FIXTURES, "01_pass.py"), "--device", "gpu"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"})
    one_line_error(proc, "01_pass: --device gpu: no usable GPU: ")  # each rank then probed its own stack
    # local rank 0 asked (the listing, then the driver's version) and told the node's other ranks
    assert calls.read_text().splitlines() == ["-L", "--query-gpu=driver_version --format=csv,noheader"]


@pytest.mark.parametrize("count", ["-5", "many"])
def test_bad_lesson_flag_is_one_line_from_the_lesson(count):
    proc = tutor("run", "1", "-n", "2", "--", "--count", count, env=FIX)
    assert proc.returncode == verdict.EXIT["usage"] and "Traceback" not in proc.stdout + proc.stderr
    said = [l for l in proc.stdout.splitlines() if "--count" in l and "expected a whole number" in l]
    assert len(said) == 1, proc.stdout          # once, from rank 0 only, not once per rank
    assert "the lesson refused to run" in proc.stderr


def test_missing_mpiexec():
    one_line_error(tutor("run", "1", env={**FIX, "MPIEXEC": "/nonexistent/mpiexec"}),
                   "MPIEXEC='/nonexistent/mpiexec'", "not a program")


def test_a_run_folder_that_cannot_be_made_is_one_line(tmp_path):
    """TUTOR_RUN_ROOT that is no folder (it is never made for you), or a state folder where runs/ cannot
    be made (a file in the way): one line naming the setting, nothing started, nothing made."""
    one_line_error(tutor("run", "1", env={**FIX, "TUTOR_RUN_ROOT": str(tmp_path / "absent")}),
                   "TUTOR_RUN_ROOT=", "no such folder")
    (tmp_path / "state").write_text("")
    launcher = os.path.join(ROOT, mpi_launchers.found()[0])  # the real one: MPIEXEC set puts runs/ in the state
    one_line_error(tutor("run", "1", env={**FIX, "MPIEXEC": launcher, "TUTOR_STATE": str(tmp_path / "state")}),
                   "runs", "TUTOR_RUN_ROOT")
    assert sorted(os.listdir(tmp_path)) == ["state"]


def test_malformed_yaml_names_file_and_line(tmp_path):
    for name in ("01_pass.py", "01_pass.yaml"):
        (tmp_path / name).write_text(open(os.path.join(FIXTURES, name)).read())
    text = (tmp_path / "01_pass.yaml").read_text().replace("apis: [mpi4py]", "apis: [mpi4py")
    (tmp_path / "01_pass.yaml").write_text(text)
    one_line_error(tutor("run", "1", env={"TUTOR_LESSONS": str(tmp_path)}), "01_pass.yaml:4", "malformed YAML")


@pytest.mark.parametrize("change, line, fragment", [
    (("timeout_s: 30", "timeout_s: soon"), 4, "timeout_s must be a number of seconds"),
    (("timeout_s: 30", "timeout_s: 0"), 4, "got 0"),   # was read as 'hung before joining MPI'
])   # every other YAML limit: tests/test_catalog.py, without a subprocess each
def test_yaml_limits_are_checked_on_load(tmp_path, change, line, fragment):
    for name in ("01_pass.py", "01_pass.yaml"):
        (tmp_path / name).write_text(open(os.path.join(FIXTURES, name)).read())
    text = (tmp_path / "01_pass.yaml").read_text()
    assert change[0] in text
    (tmp_path / "01_pass.yaml").write_text(text.replace(*change))
    proc = tutor("run", "1", env={"TUTOR_LESSONS": str(tmp_path)}, timeout=60)
    one_line_error(proc, f"01_pass.yaml:{line}:", fragment)
    assert "$ " not in proc.stdout, "it launched a lesson whose YAML is wrong"


@needs_ceiling
def test_more_ranks_than_the_ceiling_with_force():
    lesson = catalog.resolve("02", FIXTURES)
    n = CEILING + 1
    assert preflight.parse_np(str(n), lesson) == n
    with pytest.raises(preflight.Blocked, match="--force"):
        preflight.needs(lesson, n, "mpi4py", "cpu")
    preflight.needs(lesson, n, "mpi4py", "cpu", force=True)


def test_yaml_expression_that_is_not_arithmetic_is_refused(tmp_path):
    for name in ("01_pass.py", "01_pass.yaml"):
        (tmp_path / name).write_text(open(os.path.join(FIXTURES, name)).read())
    text = (tmp_path / "01_pass.yaml").read_text().replace("equals: np*(np+1)//2",
                                                           "equals: __import__('os').system('touch pwned')")
    (tmp_path / "01_pass.yaml").write_text(text)
    one_line_error(tutor("run", "1", env={"TUTOR_LESSONS": str(tmp_path)}), "not plain arithmetic")
    assert not os.path.exists(os.path.join(ROOT, "pwned"))


def test_ctrl_c_ends_every_rank_and_exits_130():
    # as a terminal's foreground job gets it: a shell without job control starts its background jobs
    # with SIGINT ignored, and an ignored signal stays ignored (the runner keeps nohup's choice)
    proc = subprocess.Popen([sys.executable, TUTOR, "run", "4", "--timeout", "60"], cwd=ROOT,
                            env={**os.environ, **FIX}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 30
    while len(processes_running("-m mpi4py tests/fixtures/04_hang.py")) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)                                   # mpiexec and two ranks are up
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130, out
    assert "interrupted" in out.decode()
    assert not processes_running("tests/fixtures/04_hang.py")


@pytest.mark.torch
def test_two_torch_runs_at_the_same_moment_both_pass():
    procs = [subprocess.Popen([sys.executable, TUTOR, "run", "00", "-n", "2", "--api", "torch", "--device", "cpu"],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for _ in range(2)]
    outs = [p.communicate(timeout=120)[0].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs


def test_two_checks_at_once_do_not_mix_results():
    procs = [subprocess.Popen([sys.executable, TUTOR, "check", "1"], cwd=ROOT, env={**os.environ, **FIX},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for _ in range(2)]
    outs = [p.communicate(timeout=120)[0].decode() for p in procs]
    assert all("2 passed, 0 failed" in o for o in outs), outs


def test_oversubscription_is_announced():
    n = min(timing.usable_cores() + 1, 4)
    if n <= timing.usable_cores():
        pytest.skip("this machine has more than 3 usable cores")
    proc = tutor("run", "1", "-n", str(n), env=FIX)
    assert proc.returncode == 0 and "timings will be distorted" in proc.stdout


def test_open_mpi_gets_oversubscribe(tmp_path, monkeypatch):
    fake = tmp_path / "mpirun"
    fake.write_text("#!/bin/sh\necho 'mpirun (Open MPI) 5.0.5'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("MPIEXEC", str(fake))
    argv = mpi_launchers.mpiexec(np=timing.usable_cores() + 1)
    assert "--oversubscribe" in argv
    assert ("--allow-run-as-root" in argv) == (os.geteuid() == 0)


def test_torch_store_listens_on_loopback_on_one_node():
    ctx = bootstrap.Ctx(lesson="x", comm=None, rank=0, world_size=2, local_rank=0, local_size=2,
                        host="h", api="torch", device="cpu", transport="gloo", why="")
    assert bootstrap.store_host(ctx)[:2] == ("127.0.0.1", "lo")  # gloo kept on loopback too


@pytest.mark.parametrize("line, statuses", [
    ("[mpiexec@vm] Exit codes: [vm] 0,9\n", [0, 9]),
    ("[mpiexec@node-1] Exit codes: [node-1] 768,0,0\n", [768, 0, 0]),
    ("[mpiexec@a] Exit codes: [a] 0,9 [b] 0,0\n", None),   # two hosts: ranks cannot be placed
    ("rank 0 says Exit codes: [vm] 0,9\n", None),
])
def test_hydra_status_line_is_read_per_rank(line, statuses):
    assert supervise.hydra_statuses(line) == statuses


def test_open_mpi_names_the_killed_rank_itself():
    said = verdict.killed_rank(supervise.Outcome(rc=137, seconds=0.1, pids={0: 10, 1: 11}, tail=[
        "mpirun noticed that process rank 1 with PID 0 on node", "vm exited on signal 9 (Killed)."]))
    assert said == "rank 1 (pid 11) was killed by signal 9 (SIGKILL); mpirun then ended the other ranks"


@pytest.mark.parametrize("statuses, expected", [
    ([0, 9], "rank 1 (pid 11) was killed by signal 9 (SIGKILL); mpiexec then ended the other ranks"),
    ([9, 11, 9], "rank 1 (pid 11) was killed by signal 11 (SIGSEGV); mpiexec then ended the other ranks"),
    ([9, 9], "rank 0 (pid 10) and rank 1 (pid 11) were killed by signal 9 (SIGKILL): one of them died"),
    ([11, 6, 9], "rank 0 (pid 10) was killed by signal 11 (SIGSEGV); rank 1 (pid 11) was killed by signal 6 "
                 "(SIGABRT); mpiexec"),
    ([9, 768], "rank 1 (pid 11) exited with status 3; mpiexec"),  # os._exit(3): rank 0's SIGKILL is cleanup
    ([0, 768], "rank 1 (pid 11) exited with status 3; mpiexec"),
    ([512, 512], None),                # every rank exited 2: the lesson refused, no one rank to name
    (None, "rank 0 (pid 10) was killed by signal 9 (SIGKILL)"),  # no statuses: the banner's PID
])
def test_the_rank_a_signal_killed_is_told_from_the_statuses(statuses, expected):
    banner = ["=   PID 10 RUNNING AT vm", "=   EXIT CODE: 9",
              "YOUR APPLICATION TERMINATED WITH THE EXIT STRING: Killed (signal 9)"]
    out = supervise.Outcome(rc=9, seconds=0.1, tail=banner, pids={0: 10, 1: 11, 2: 12}, statuses=statuses)
    said = verdict.killed_rank(out)
    assert said == expected if expected is None else said.startswith(expected), said


def test_on_bad_flags_the_other_ranks_leave_only_after_rank_0_said_why(tmp_path):
    """A rank that exits before rank 0 has printed its one line lets Open MPI's launcher end the run
    first, and the line was lost (CI, 1 run in ~700): rank 0 leaves a mark once it has said it, and
    the others wait for that mark (at most bootstrap.REFUSAL_WAIT_S) before they exit 2."""
    code = (f"import sys; sys.path.insert(0, {ROOT!r}); from common import bootstrap; "
            "p = bootstrap.LessonParser(prog='x'); p.add_argument('--count', type=int); "
            "p.parse_args(['--count', 'many'])")
    env = {**os.environ, run_folder.ENV: str(tmp_path), "PMI_RANK": "1"}
    other = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)
    assert other.poll() is None, "rank 1 left before rank 0 said why"
    first = subprocess.run([sys.executable, "-c", code], env={**env, "PMI_RANK": "0"}, capture_output=True,
                           text=True, timeout=30)
    assert first.returncode == 2 and "x: argument --count: invalid int value: 'many'" in first.stderr
    assert other.wait(timeout=5) == 2 and other.stderr.read() == ""  # one line, from rank 0 only


# ---- --debug-collectives: slow is not stuck, and the lesson's line is named (issue 38 L10, L11) ----

LATE = """import os, sys, time
sys.path.insert(0, {root!r})
import numpy as np
from common import bootstrap, flight
args, ctx = bootstrap.start(__file__, bootstrap.lesson_parser(__file__, "one rank late or stuck"))
from mpi4py import MPI
rec, buf = flight.get(), np.ones(4)
if ctx.rank == 1 and {mode!r} == "late":
    time.sleep({late})  # computing: slow, not stuck
elif ctx.rank == 1:
    with rec.call("recv", buf, kind="p2p", peers="0"):  # waits in a call of its own: stuck
        ctx.comm.Recv(buf, source=0, tag=5)
with rec.call("all_reduce", buf):
    ctx.comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
if ctx.rank == 0:  # one rank prints: two would interleave their lines
    print("sum", buf[0], flush=True)
"""


@pytest.mark.parametrize("mode", ["late", "stuck"])
def test_debug_collectives_waits_for_a_slow_rank_and_stops_a_stuck_one(tmp_path, mode):
    """A rank 2.2 s late (1.5 s was the old limit) is slow: the run passes. A rank waiting in another
    call is stuck: the run stops within a few seconds, naming where that rank waits and the script's
    line of the collective, not common/plumbing/collcheck.py."""
    script = tmp_path / f"{mode}.py"
    script.write_text(LATE.format(root=ROOT, mode=mode, late=2.2))
    cmd = supervise.command(str(script), 2, ["--api", "mpi4py", "--device", "cpu", "--debug-collectives"])
    outcome = supervise.supervise(cmd, 60, echo=False)
    said = "\n".join(outcome.tail[-20:]) + str(outcome.errors)
    assert not outcome.timed_out, said
    if mode == "late":
        assert outcome.rc == 0 and "sum 2.0" in said and "CollectiveMismatch" not in said, said
    else:
        assert outcome.rc != 0 and outcome.seconds < 20, said
        line = outcome.errors[0]
        assert "rank 1 has not come: it waits in recv #1 on world, stuck.py:" in line, line
        assert line.endswith(f"({os.path.relpath(script, ROOT)}:13)") and "collcheck.py" not in line, line


def test_the_test_beds_launcher_line_keeps_a_path_with_a_space_whole(monkeypatch):
    """`testbed run` in a checkout at '/…/my checkout' said '/…/my is not a program' (issue 38 L5):
    MPIEXEC is split as a shell splits it, so the bed's line quotes its paths."""
    import shlex

    from common.runner import testbed
    monkeypatch.setattr(testbed, "ROOT", "/home/me/my checkout")
    bed = testbed.Bed("tutb000000", "tutb000000", [("tutb000000-a", "10.1.2.10"), ("tutb000000-b", "10.1.2.11")],
                      "/tmp/a folder/ssh", 2)
    argv = shlex.split(bed.mpiexec)
    assert argv[:3] == ["/home/me/my checkout/.venv/bin/mpiexec", "-bootstrap-exec", "/tmp/a folder/ssh"], argv
    assert argv[-2:] == ["UCX_TLS", "tcp,self"]
