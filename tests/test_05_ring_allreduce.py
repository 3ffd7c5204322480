"""Lesson 05's ring, simulated in one process: the schedule, uneven chunks, bytes per rank (no MPI)."""
import argparse

import numpy as np
import pytest

from common import bootstrap, shards
from conftest import load_lesson

ring = load_lesson("05_ring_allreduce.py")


def simulate(n, count, dtype=np.int64, schedule=ring.ring_schedule):
    """Run every rank's schedule in lockstep; a message is what rank r sends to (r+1) at that step."""
    data = [np.arange(count, dtype=dtype) * (r + 1) + r for r in range(n)]
    bufs = [d.copy() for d in data]
    bounds = shards.chunk_bounds(count, n)
    scheds = [schedule(r, n) for r in range(n)]
    sent = [0] * n
    for step in range(len(scheds[0])):
        msgs = {}
        for r in range(n):
            phase, s, send, _ = scheds[r][step]
            a, b = bounds[send]
            msgs[(r + 1) % n] = (send, bufs[r][a:b].copy())
            sent[r] += (b - a)
        for r in range(n):
            phase, s, _, recv = scheds[r][step]
            chunk, payload = msgs[r]
            assert chunk == recv, f"rank {r} expects chunk {recv}, its left neighbour sent {chunk}"
            c, d = bounds[recv]
            if phase == "reduce-scatter":
                bufs[r][c:d] += payload
            else:
                bufs[r][c:d] = payload
    return data, bufs, sent


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8])
def test_schedule_has_2n_minus_2_steps_in_two_phases(n):
    for r in range(n):
        sched = ring.ring_schedule(r, n)
        assert len(sched) == 2 * (n - 1)
        assert [p for p, *_ in sched] == ["reduce-scatter"] * (n - 1) + ["all-gather"] * (n - 1)
        assert [s for _, s, *_ in sched] == list(range(2 * (n - 1)))


@pytest.mark.parametrize("n", [2, 3, 4, 5, 7])
def test_each_phase_sends_every_chunk_but_one(n):
    for r in range(n):
        sched = ring.ring_schedule(r, n)
        rs = {send for p, _, send, _ in sched if p == "reduce-scatter"}
        ag = {send for p, _, send, _ in sched if p == "all-gather"}
        assert rs == set(range(n)) - {(r + 1) % n}  # it keeps the chunk it finishes
        assert ag == set(range(n)) - {(r + 2) % n}  # its right neighbour's finished chunk never comes back


@pytest.mark.parametrize("n,count", [(1, 0), (1, 5), (2, 0), (2, 1), (3, 2), (4, 3), (4, 7), (5, 7),
                                     (4, 1000), (5, 1003), (8, 3)])
def test_simulated_ring_sums_and_sends_the_closed_form(n, count):
    data, bufs, sent = simulate(n, count)
    want = sum(data)
    for r in range(n):
        np.testing.assert_array_equal(bufs[r], want)
        size = lambda j: count // n + (1 if j < count % n else 0)  # noqa: E731
        assert sent[r] == 2 * count - size((r + 1) % n) - size((r + 2) % n)


def shifted(offset):
    """A ring where rank r finishes chunk (r + offset) mod n: offset 1 is the lesson's, 0 is
    MPI_Reduce_scatter_block's and NCCL's convention; every offset is a correct ring."""
    def schedule(rank, n):
        rs = [("reduce-scatter", s, (rank + offset - 1 - s) % n, (rank + offset - 2 - s) % n) for s in range(n - 1)]
        return rs + [("all-gather", n - 1 + s, (rank + offset - s) % n, (rank + offset - 1 - s) % n)
                     for s in range(n - 1)]
    return schedule


@pytest.mark.parametrize("n,count", [(1, 5), (2, 1), (3, 2), (4, 7), (5, 1003), (8, 3)])
@pytest.mark.parametrize("offset", [0, 1, 2])
def test_every_finishing_convention_passes_the_yaml_byte_checks(n, count, offset):
    """The YAML checks the total (exactly 2(n-1) buffers) and a per-rank band, not which chunks a rank
    skips: any correct ring passes, and the lesson's own ring is offset 1."""
    if offset == 1:
        assert shifted(1)(2, 5) == ring.ring_schedule(2, 5)
    data, bufs, sent = simulate(n, count, schedule=shifted(offset))
    for r in range(n):
        np.testing.assert_array_equal(bufs[r], sum(data))
        assert 2 * (count - -(-count // n)) <= sent[r] <= 2 * (count - count // n)
    assert sum(sent) == 2 * (n - 1) * count


@pytest.mark.parametrize("count,parts", [(0, 1), (0, 4), (1, 4), (3, 4), (7, 4), (1000003, 5), (10, 3)])
def test_chunks_cover_the_buffer_evenly(count, parts):
    bounds = shards.chunk_bounds(count, parts)
    assert len(bounds) == parts and bounds[0][0] == 0 and bounds[-1][1] == count
    assert all(a1 == b0 for (_, b0), (a1, _) in zip(bounds, bounds[1:]))
    sizes = [b - a for a, b in bounds]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_count_list_flag():
    assert bootstrap.count_list("0,1,7") == [0, 1, 7]
    for bad in ("", ",", "-5", "1,x"):
        with pytest.raises(argparse.ArgumentTypeError):
            bootstrap.count_list(bad)


def test_chunk_sizes_shorten_runs_only_when_too_wide():
    from lessons.ring_allreduce import show
    assert show.chunk_sizes([1, 1, 0, 0]) == "1 1 0 0"
    assert show.chunk_sizes([250001] * 3 + [250000]) == "250001x3 250000"
