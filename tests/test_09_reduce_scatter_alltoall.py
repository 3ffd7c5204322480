"""Lesson 09's hand-made collectives as pure functions: N ranks as N threads on an in-process wire, so
every NP from 1 to 6 and every layout (uneven, empty, skewed blocks) runs in milliseconds, no MPI.
Bytes and rounds are read from common/counting.py, as the lesson's YAML checks read them."""
import json
import queue
import threading
import types

import numpy as np
import pytest

from common import bootstrap, collectives, counting, tolerance
from conftest import check_nps, tutor
from lessons.reduce_scatter_alltoall import budget, show

nine = bootstrap.lesson_module("09")


def wire(n):
    """One backend per rank: exchange() sends a copy down a FIFO per (from, to) pair and receives from
    the source's; empty buffers are skipped on both sides, as common/p2p.py skips them."""
    pipes = {(a, b): queue.Queue() for a in range(n) for b in range(n)}

    def backend(rank):
        def exchange(out, into, dest, source):
            if out is not None and out.size:
                pipes[rank, dest].put(out.copy())
            if into is not None and into.size:
                got = pipes[source, rank].get(timeout=5)
                assert got.size == into.size, f"rank {rank}: {got.size} items from {source} into {into.size}"
                into[:] = got
        return counting.Counted(types.SimpleNamespace(exchange=exchange, sync=lambda: None), n, rank=rank)
    return [backend(r) for r in range(n)]


def run(n, fn):
    """fn(rank, be) on n threads; their results in rank order (a rank's exception is raised here)."""
    bes, out, errors = wire(n), [None] * n, []

    def one(rank):
        try:
            out[rank] = fn(rank, bes[rank])
        except Exception as exc:  # noqa: BLE001 - handed to the test
            errors.append(exc)
    threads = [threading.Thread(target=one, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    if errors:
        raise errors[0]
    return out, bes


LAYOUTS = [lambda n: [3] * n, lambda n: [r % 3 for r in range(n)], lambda n: [0] * n,
           lambda n: [r * 5 for r in range(n)], lambda n: [7] + [0] * (n - 1)]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6])
@pytest.mark.parametrize("layout", range(len(LAYOUTS)))
def test_reduce_scatter_then_all_gather_on_any_layout(n, layout):
    counts = LAYOUTS[layout](n)
    total, blocks = sum(counts), collectives.bounds(counts)
    data = [np.random.default_rng(r).integers(0, 8, total).astype(np.float64) for r in range(n)]

    def rank_fn(rank, be):
        send = data[rank].copy()
        mine, full = np.full(counts[rank], -1.0), np.full(total, -1.0)
        with be.phase("rs"):
            nine.reduce_scatter(be, send, mine, counts, rank, n)
        with be.phase("ag"):
            nine.all_gather(be, mine, full, counts, rank, n)
        assert (send == data[rank]).all(), "the send buffer changed"
        return mine, full
    out, bes = run(n, rank_fn)
    whole = sum(data)
    for rank, (mine, full) in enumerate(out):
        assert (mine == whole[slice(*blocks[rank])]).all() and (full == whole).all()
        rs = bes[rank].counts.get("rs", {}).get("exchange", {"calls": 0, "bytes": 0})
        assert rs["calls"] == n - 1 and rs["bytes"] == 8 * (total - counts[rank])  # every block but mine
    ag_sent = sum(b.counts.get("ag", {}).get("exchange", {"bytes": 0})["bytes"] for b in bes)
    assert ag_sent == 8 * (n - 1) * total  # each block to the N-1 others, once


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_all_to_all_with_uneven_asymmetric_counts(n):
    rng = np.random.default_rng(n)
    table = rng.integers(0, 4, (n, n))  # table[i, j]: items rank i sends to rank j (zeros too)
    data = [np.arange(table[r].sum()) + 100.0 * r for r in range(n)]

    def rank_fn(rank, be):
        got = np.full(table[:, rank].sum(), -1.0)
        nine.all_to_all(be, data[rank], list(table[rank]), got, list(table[:, rank]), rank, n)
        return got
    out, bes = run(n, rank_fn)
    for rank, got in enumerate(out):
        want = [data[j][slice(*collectives.bounds(table[j])[rank])] for j in range(n)]
        assert (got == np.concatenate(want)).all()
        seen = bes[rank].counts["main"]["exchange"] if n > 1 else {"calls": 0, "bytes": 0}
        assert seen["calls"] == n - 1 and seen["bytes"] == 8 * (table[rank].sum() - table[rank, rank])


def test_chunks_that_ignore_the_counts_are_refused_in_one_line(monkeypatch):
    counts = [0, 5, 10]
    monkeypatch.setattr(nine, "ring_chunks", lambda c, n: [(0, 5), (5, 10), (10, 15)])
    with pytest.raises(AssertionError, match="chunk bounds must come from the counts"):
        run(3, lambda rank, be: nine.reduce_scatter(be, np.zeros(15), np.zeros(counts[rank]), counts, rank, 3))


@pytest.mark.parametrize("n", [1, 3, 4])
def test_the_mixture_of_experts_equals_one_process(n):
    router, experts = nine.moe_weights(n, nine.DMODEL)

    def rank_fn(rank, be):
        ctx = types.SimpleNamespace(world_size=n, rank=rank, api="mpi4py", device="cpu")
        x = nine.moe_tokens(rank, 40, nine.DMODEL)
        return nine.moe_layer(ctx, be, x, router, experts[rank], nine.DMODEL)
    out, _ = run(n, rank_fn)
    want = nine.moe_one_process(n, 40, nine.DMODEL)
    assert np.allclose(np.concatenate([y for y, _, _ in out]), want, rtol=0, atol=1e-12)
    sent = np.array([s for _, s, _ in out])
    assert all((got == sent[:, r]).all() for r, (_, _, got) in enumerate(out))  # counts went first
    assert sent.sum() == 40 * n


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_moe_budget_holds_another_order_and_not_a_token_out_of_place(seed):
    """The layer in float32 products summed in float64 one term at a time (another order, and coarser
    products than the budget's float64: so scaled to float32's u here by hand) stays inside; the layer
    itself against a reversed-feature evaluation in float64 stays inside; a token's output swapped with
    its neighbour's lands far outside."""
    n, d = 4, nine.DMODEL
    router, experts = nine.moe_weights(n, d, seed)
    x = nine.moe_tokens(1, 200, d, seed)
    expert, gate = nine.route(x, router)
    want = nine.moe_one_process(n, 200, d, seed)[200:400]
    y = np.empty_like(x)
    for e, w in enumerate(experts):
        rows = expert == e
        s = sum(x[rows][:, i, None] * w[None, i] for i in reversed(range(d)))  # one product at a time, reversed
        y[rows] = np.tanh(s)
    y *= gate[:, None]
    bound = budget.moe_entries(x, router, experts, expert, gate)
    assert tolerance.worst_ratio(y - want, bound) <= 1
    assert tolerance.worst_ratio(y[::-1] - want, bound) > 1e6


@pytest.mark.slow  # 6 real runs: ~60 s of CPU on 2 cores, over make test's share
@pytest.mark.parametrize("n", [3, 5])
def test_correct_runs_stay_inside_the_moe_budget_for_3_seeds(tmp_path, n):
    """Real runs, section 5 only in effect (small buffers, no race): every check passes, the budget's too."""
    for seed in range(3):
        out = tmp_path / f"r{seed}.json"
        done = tutor("run", "09", "-n", str(n), "--json", str(out), "--", "--no-race", "--counts", "1",
                     "--skew", "0", "--unit", "1", "--tokens", "64", "--seed", str(seed), timeout=120)
        doc = json.loads(out.read_text())
        assert done.returncode == 0 and doc["status"] == "pass", done.stdout[-2000:] + done.stderr
        assert max(r["moe"]["moe_ratio"] for r in doc["ranks"]) <= 1


@pytest.mark.sweep  # the check NPs x 20 seeds: minutes an NP; pytest -m sweep
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("n", check_nps("09"))
def test_correct_runs_stay_inside_the_moe_budget_for_20_seeds(tmp_path, n):
    """The issue's bar (41): the NPs `bin/tutor check` runs (the YAML's np.check), 20 seeds each,
    the default sizes but the race."""
    for seed in range(20):
        out = tmp_path / f"r{seed}.json"
        done = tutor("run", "09", "-n", str(n), "--json", str(out), "--", "--no-race", "--seed", str(seed),
                     timeout=300)
        doc = json.loads(out.read_text())
        assert done.returncode == 0 and doc["status"] == "pass", done.stdout[-2000:] + done.stderr


def test_written_counts_what_this_process_writes(tmp_path):
    """collectives.written(), the meter lesson 09 reads around one gloo call: this process's writes."""
    from common import collectives
    before = collectives.written()
    if before is None:
        pytest.skip("no /proc/self/io here")
    with open(tmp_path / "out", "wb", buffering=0) as f:
        f.write(b"x" * 100_000)
    assert 100_000 <= collectives.written() - before < 100_000 + 4096


@pytest.mark.parametrize("real, wire, rs_ag, whole, noise, says", [
    (False, {"reduce_scatter": 350680}, 5588.0, 1223.0, 10.0, "no race of halves against the whole"),
    (True, {}, 25451.0, 7556.0, 11501.0, "the one call beats its halves"),      # a gap beyond the noise
    (True, {}, 9000.0, 7556.0, 11501.0, "a tie within this run's noise"),       # within it: no verdict
    (True, {}, 5000.0, 7556.0, 1000.0, "the halves beat the one call"),
])
def test_the_halves_race_the_whole_only_where_they_are_real_and_beyond_the_noise(real, wire, rs_ag, whole, noise,
                                                                                 says):
    w = {"lib_halves_real": real, "lib_wire": wire, "lib_rs_ag_us": rs_ag, "lib_allreduce_us": whole,
         "lib_rs_ag_noise_us": noise, "lib_allreduce_noise_us": noise / 2}
    text = show.halves_verdict(w)
    assert says in text, text
    assert ("a tie" in text) == (real and abs(rs_ag - whole) <= noise)
