"""Tier 1: the pure parts of bootstrap, devices, report and rank_processes (no MPI)."""
import json
import os
import sys
import threading

import pytest

from common import bootstrap, report, text
from common.plumbing import devices
from common.runner import rank_processes
from common.runner.catalog import ROOT


def test_decide():
    assert devices.decide("cpu", True, "x")[0] == "cpu"
    assert devices.decide("auto", True, "gpus")[:2] == ("gpu", "gpus")
    assert devices.decide("auto", False, "none")[:2] == ("cpu", "auto chose cpu: none")
    device, _, error = devices.decide("gpu", False, "no driver")
    assert device is None and "--device gpu: no usable GPU: no driver" == error


def test_hidden_gpus(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert devices.visible_gpus()[0] == 0
    assert devices.gpu_ready("torch", 1)[0] is False


def test_transport_table():
    assert devices.TRANSPORT[("torch", "cpu")] == "gloo"
    assert devices.TRANSPORT[("mpi4py", "gpu")] == "nccl"


@pytest.mark.parametrize("var", bootstrap.RANK_VARS)
def test_env_rank(monkeypatch, var):
    for v in bootstrap.RANK_VARS:
        monkeypatch.delenv(v, raising=False)
    assert bootstrap.env_rank() == 0
    monkeypatch.setenv(var, "3")
    assert bootstrap.env_rank() == 3


def test_nonneg_int():
    import argparse
    assert bootstrap.nonneg_int("0") == 0
    for bad in ("-1", "x", "1.5"):
        with pytest.raises(argparse.ArgumentTypeError):
            bootstrap.nonneg_int(bad)


def test_table_aligns_numbers_right():
    lines = text.table(["name", "n"], [("a", 1), ("bbb", 100)]).splitlines()
    assert lines[0].startswith("name") and lines[2].endswith("  1") and lines[3].endswith("100")


def test_write_json_is_atomic(tmp_path):
    path = str(tmp_path / "r.json")
    stop = threading.Event()
    seen = []

    def reader():
        while not stop.is_set():
            if os.path.exists(path):
                with open(path) as f:
                    seen.append(json.load(f)["i"])  # never a half-written file
    t = threading.Thread(target=reader)
    t.start()
    for i in range(200):
        report.write_json(path, {"i": i, "pad": "x" * 5000})
    stop.set()
    t.join()
    assert seen and os.listdir(tmp_path) == ["r.json"]


def test_parse_stack_main_thread_innermost_first():
    dump = ('Thread 0x01 (most recent call first):\n  File "/x/other.py", line 3 in spin\n\n'
            'Current thread 0x02 (most recent call first):\n'
            '  File "/usr/lib/site-packages/torch/x.py", line 9 in recv\n'
            f'  File "{ROOT}/lessons/05_x.py", line 42 in ring\n'
            f'  File "{ROOT}/lessons/05_x.py", line 80 in main\n')
    frames = rank_processes.parse_stack(dump)
    assert frames[0] == ("recv", "/usr/lib/site-packages/torch/x.py:9")
    own, inner = rank_processes.blocked_at(frames)
    assert own == ("ring", "lessons/05_x.py:42") and inner == frames[0]


def test_the_command_shown_fits_100_columns_and_stays_one_shell_command():
    from common.runner import lesson_run
    cmd = [".venv/bin/mpiexec", "-n", "4", ".venv/bin/python", "-m", "mpi4py"] + ["lessons/x.py"] * 12
    shown = lesson_run.shown(cmd)
    assert max(map(len, shown.splitlines())) <= 100 and shown.count("\n") >= 1
    assert shown.replace(" \\\n   ", "") == "$ " + " ".join(cmd)  # the shell reads it back as one line
    assert lesson_run.shown(["a", "b"]) == "$ a b"


def test_a_lesson_module_loaded_by_threads_at_once_is_whole_in_each():
    # lesson 09's ring on threads (tests/test_09_reduce_scatter_alltoall.py) loads lesson 05 from every
    # thread at once: none may get the module while another thread is still executing it
    name = bootstrap.lesson_module("05").__name__
    for attempt in range(20):
        del sys.modules[name]
        start, got = threading.Barrier(6), []

        def load():
            start.wait()
            got.append(hasattr(bootstrap.lesson_module("05"), "ring_allreduce"))
        threads = [threading.Thread(target=load) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert got == [True] * 6, f"attempt {attempt}: a thread got a half-loaded lesson 05"
