"""The GPU path's pure parts, which need no GPU: which GPU a rank drives, when two ranks would share
one, doctor's verdicts (and that it never prints a traceback), and that every clock a lesson reads
waits for the GPU first."""
import ast
import os
import subprocess
import sys

import pytest

from common import timing
from common.plumbing import devices
from common.runner import doctor, mpi_launchers
from conftest import ROOT, TUTOR


def test_two_ranks_on_one_gpu_are_refused_with_both_named():
    assert devices.shared(["0000:3b:00.0", "0000:5e:00.0"], 2) is None
    said = devices.shared(["0000:3b:00.0", "0000:5e:00.0", "0000:3b:00.0"], 2)
    assert said.startswith("3 ranks on this node but 2 GPU(s): ranks 0 and 2 would share one")


def test_per_rank_visibility_is_not_a_shortage():
    """srun --gpus-per-task=1: every rank sees one GPU (device 0), but each a different one."""
    assert devices.shared(["0000:3b:00.0", "0000:5e:00.0", "0000:86:00.0", "0000:af:00.0"], 1) is None


def test_stacks_follow_the_api_and_the_lesson():
    assert devices.stacks("torch") == ("torch",)
    assert devices.stacks("mpi4py") == ("cupy",)
    assert devices.stacks("mpi4py", uses_torch=True) == ("cupy", "torch")


@pytest.mark.parametrize("args, said", [
    ((13, 13, "2.29.7", "2.29.7"), ["CUDA 13 for both", "one NCCL, 2.29.7"]),
    ((13, 12, None, None), ["DISAGREE: torch is built for CUDA 13, CuPy for CUDA 12: install cupy-cuda13x "
                            "(make setup does)"]),
    ((13, 13, "2.29.7", "2.25.1"), ["CUDA 13 for both", "two NCCL builds: torch's 2.29.7, CuPy's 2.25.1"]),
    ((None, 13, None, None), []),
])
def test_doctor_says_whether_torch_and_cupy_agree(args, said):
    assert doctor.agreement(*args) == said


def test_doctor_never_prints_a_traceback(tmp_path):
    """A CuPy and a torch that blow up on import, on a machine where nvidia-smi lists a GPU."""
    for name, error in (("cupy", "RuntimeError('CUDA driver version is insufficient')"),
                        ("torch", "OSError('libcudart.so.13: cannot open shared object file')")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"raise {error}\n")
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\necho 'GPU 0: Fake GPU (UUID: GPU-0)'\n")
    smi.chmod(0o755)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}",
           "PATH": f"{smi.parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run([sys.executable, TUTOR, "doctor"], capture_output=True, text=True, timeout=120,
                          env=env, cwd=ROOT)
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out and proc.returncode in (0, 1), out
    words = " ".join(out.split())  # doctor wraps long values
    assert "NOT USABLE: OSError: libcudart.so.13" in words
    assert "cupy GPU stack not usable: RuntimeError: CUDA driver version is insufficient" in words
    assert max(len(line) for line in out.splitlines()) <= 100


# ---- clocks ------------------------------------------------------------------------------------

WALL_CLOCKS = {"perf_counter", "perf_counter_ns", "time", "time_ns", "monotonic", "monotonic_ns"}


def clock_reads(source):
    """(line, name) of every direct wall-clock read: time.perf_counter() and friends, or a bare
    perf_counter() imported from time."""
    tree = ast.parse(source)
    imported = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and node.module == "time" for a in node.names if a.name in WALL_CLOCKS}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in WALL_CLOCKS and \
                isinstance(node.value, ast.Name) and node.value.id == "time":
            found.append((node.lineno, f"time.{node.attr}"))
        elif isinstance(node, ast.Name) and node.id in imported:
            found.append((node.lineno, node.id))
    return found


def test_lessons_read_clocks_only_through_the_timing_helper():
    """A clock read straight after GPU work measures the launch (lesson 03's timed loop did, on torch
    + GPU). Lessons read wall clocks through common/timing.py, which syncs first."""
    bad = []
    for name in sorted(os.listdir(os.path.join(ROOT, "lessons"))):
        if name.endswith(".py"):
            with open(os.path.join(ROOT, "lessons", name)) as f:
                bad += [f"lessons/{name}:{line}: {call}" for line, call in clock_reads(f.read())]
    assert not bad, "read clocks through common/timing.py (timing.now(sync)):\n" + "\n".join(bad)


def test_the_clock_check_catches_what_lesson_03_did():
    before = ("import time\nfor _ in range(reps):\n    t0 = time.perf_counter()\n    way(ctx)\n"
              "    times.append(time.perf_counter() - t0)\n")
    assert clock_reads(before) == [(3, "time.perf_counter"), (5, "time.perf_counter")]
    assert clock_reads("from time import monotonic as m\nx = m()\n") == [(2, "m")]
    assert clock_reads("import time\ntime.sleep(1)\nc = time.process_time()\n") == []


def test_now_waits_for_the_device_before_reading_the_clock(monkeypatch):
    events = []
    monkeypatch.setattr(timing.time, "perf_counter", lambda: events.append("clock") or 1.0)
    timing.now(lambda: events.append("sync"))
    assert events == ["sync", "clock"]


# ---- choosing the GPU, under the GPU double ----------------------------------------------------

HELLO = os.path.join(ROOT, "lessons", "00_hello.py")


@pytest.fixture(scope="module")
def double(tmp_path_factory):
    from gpu_double import env
    return {**os.environ, **env(str(tmp_path_factory.mktemp("gpu_double")))}


def hello(env, *per_rank, device="gpu"):
    """Lesson 00 at one rank per entry of per_rank: each rank's own extra environment (hydra's MPMD
    form, as srun --gpus-per-task gives each rank its own CUDA_VISIBLE_DEVICES)."""
    cmd = mpi_launchers.found()
    if mpi_launchers.flavour(cmd[0]) != "hydra":
        pytest.skip(f"per-rank -env is hydra's (MPICH) form; the launcher here is {mpi_launchers.identify(cmd[0]).mpi}")
    for i, extra in enumerate(per_rank):
        cmd += ([":"] if i else []) + ["-n", "1"] + [a for k, v in extra.items() for a in ("-env", k, v)]
        cmd += [sys.executable, "-m", "mpi4py", HELLO, "--device", device]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)


def test_each_rank_driving_its_own_visible_gpu_runs_on_nccl(double):
    """Every rank sees exactly one GPU (its device 0), each a different physical one: that is a GPU run."""
    proc = hello(double, {"CUDA_VISIBLE_DEVICES": "3"}, {"CUDA_VISIBLE_DEVICES": "5"})
    assert proc.returncode == 0 and "nccl" in proc.stdout, proc.stdout + proc.stderr


def test_two_ranks_seeing_one_gpu_are_refused(double):
    proc = hello(double, {"CUDA_VISIBLE_DEVICES": "2"}, {"CUDA_VISIBLE_DEVICES": "2"})
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "00_hello: --device gpu: no usable GPU: 2 ranks on this node but 1 GPU(s): ranks 0 and 1 would "
        "share one, and NCCL needs one GPU per rank (lower NP or use --device cpu)"], proc.stderr


def test_auto_says_once_why_it_chose_the_cpu_although_gpus_were_seen(double):
    proc = hello(double, {"CUDA_VISIBLE_DEVICES": "2"}, {"CUDA_VISIBLE_DEVICES": "2"}, device="auto")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    notes = [line for line in proc.stdout.splitlines() if line.startswith("note: GPUs were seen")]
    assert len(notes) == 1 and "but --device auto runs this on the CPU: 2 ranks" in notes[0], proc.stdout
