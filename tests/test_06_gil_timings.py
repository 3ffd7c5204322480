"""Unit tests for lesson 06's pure parts (no MPI: the lesson imports MPI only inside main), and for the
sentences its show.py picks from the numbers."""
import pytest

from conftest import load_lesson
from lessons.gil_timings import show


@pytest.fixture(scope="module")
def lesson():
    return load_lesson("06_gil_timings.py")


@pytest.mark.parametrize("total,parts", [(0, 1), (1, 3), (10, 3), (12, 4), (1_000_001, 2), (7, 7), (5, 8)])
def test_split_range_covers_contiguously_and_balanced(lesson, total, parts):
    pieces = [lesson.split_range(total, parts, i) for i in range(parts)]
    assert pieces[0][0] == 0 and pieces[-1][1] == total
    for (lo, hi), (nlo, _) in zip(pieces, pieces[1:]):
        assert hi == nlo  # no gap, no overlap
    sizes = [hi - lo for lo, hi in pieces]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_cpu_task_is_the_arithmetic_series(lesson):
    assert lesson.cpu_task((0, 1001)) == 1000 * 1001 // 2
    assert lesson.cpu_task((10, 20)) == sum(range(10, 20))
    assert lesson.cpu_task((5, 5)) == 0


def test_numpy_task_counts_elements_across_blocks(lesson):
    n = 2 * lesson.NUMPY_BLOCK + 17  # a partial last block
    assert lesson.numpy_task((3, 3 + n)) == pytest.approx(n, rel=1e-12)


def test_wait_task_and_ratio(lesson):
    assert lesson.wait_task(0) == 1
    assert lesson.ratio(3.0, 1.5) == 2.0
    assert lesson.ratio(1.0, 0.0) != lesson.ratio(1.0, 0.0)  # nan, not a crash


def test_race_keeps_the_best_time_and_a_result(lesson):
    calls = []
    best = lesson.race({"a": lambda: calls.append("a") or 7, "b": lambda: calls.append("b") or 8}, 3)
    assert calls == ["a", "b"] * 3  # the runs take turns
    assert best["a"][1] == 7 and best["b"][1] == 8 and best["a"][0] >= 0


def test_interpreter_reports_gil_state(lesson):
    text, gil_on, free_build = lesson.interpreter()
    assert ("GIL ON" in text) == gil_on and isinstance(free_build, bool)
    assert gil_on or free_build  # the GIL can only be off on a free-threaded build


def test_flag_types_refuse_bad_input(lesson):
    import argparse
    with pytest.raises(argparse.ArgumentTypeError):
        lesson.workers_count("1")
    with pytest.raises(argparse.ArgumentTypeError):
        lesson.positive_int("0")
    with pytest.raises(argparse.ArgumentTypeError):
        lesson.positive_int("-5")
    assert lesson.workers_count("3") == 3


def ctx(api="mpi4py", transport="mpi", device="cpu", world_size=2):
    from types import SimpleNamespace
    return SimpleNamespace(api=api, transport=transport, device=device, world_size=world_size)


def test_conclusions_follow_the_numbers():
    speed = {"cpu_threads": 0.95, "cpu_processes": 1.9, "cpu_ranks": 1.8, "numpy_threads": 1.6,
             "wait_threads": 2.0}
    got = {"recv_fraction": 0.97, "hold_fraction": 0.02, "recv_cpu_ms": 2.0, "recv_cpu_ms_least": 1.0,
           "recv_waited_ms": 200.0}
    text = "\n".join(show.conclusions(ctx(), speed, got, True, 2))
    assert "0.95x (no real gain)" in text and "97%" in text and "one process per GPU" in text
    assert "released the GIL" in text and "little cpu" in text and "freeze" in text
    text = "\n".join(show.conclusions(ctx(), {**speed, "cpu_threads": 1.9}, {}, False, 2))
    assert "1.90x (gain)" in text and "noisy" not in text


def test_one_rank_reads_no_speedup_from_its_ranks_column():
    """On a lent H100 node at -n 1, 'MPI ranks: 0.84x ... is the machine busy?' printed: one rank times
    the same loop again, so its column is noise, not a split; the processes' 2.5x of 4 workers is read."""
    speed = {"cpu_threads": 1.0, "cpu_processes": 2.53, "cpu_ranks": 0.84, "numpy_threads": 2.5,
             "wait_threads": 3.9}
    one = "\n".join(show.conclusions(ctx(world_size=1), speed, {}, True, 16))
    assert "MPI ranks:" not in one and "busy" not in one and "splits nothing" in one, one
    two = "\n".join(show.conclusions(ctx(world_size=2), speed, {}, True, 16))
    assert "MPI ranks: 0.84x" in two and "is the machine busy?" in two, two


@pytest.mark.parametrize("kept, cpu, says, not_said", [
    (0.9, 180.0, ["released the GIL", "it polled rather than slept"], ["little cpu"]),
    (0.3, 5.0, ["only 30%", "little cpu"], ["released the GIL", "polled"]),
])
def test_the_receive_is_told_as_measured(kept, cpu, says, not_said):
    got = {"recv_fraction": kept, "recv_cpu_ms": cpu, "recv_cpu_ms_least": 1.0, "recv_waited_ms": 193.0}
    text = " ".join(show.wait_story(ctx(), got))
    assert all(s in text for s in says) and not any(s in text for s in not_said), text


def test_the_receive_row_names_what_it_waits_in():
    assert show.recv_label(ctx()) == "main thread blocked in MPI Recv"
    assert "(host memory)" in show.recv_label(ctx(device="gpu", transport="nccl"))
    assert "gloo" in show.recv_label(ctx("torch", "gloo"))
    assert "CUDA sync" in show.recv_label(ctx("torch", "nccl", "gpu"))
    got = {"recv_fraction": 0.9, "recv_cpu_ms": 190.0, "recv_cpu_ms_least": 150.0, "recv_waited_ms": 200.0}
    assert "CUDA sync" in " ".join(show.wait_story(ctx("torch", "nccl", "gpu"), got))


def test_cpu_task_counts_what_it_loops_over(lesson):
    lesson.LOOPED[0] = 0
    lesson.cpu_task((10, 20))
    lesson.cpu_task((5, 5))
    assert lesson.LOOPED[0] == 10
