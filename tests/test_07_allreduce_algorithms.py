"""Lesson 07 and its modules (lessons/allreduce_algorithms/: schedules, model, tuner, show) in one process (no
MPI): every schedule's sums, matching messages, closed forms, the double binary tree's shape, the TRG
formulas, the reasons the model misses, and the tuner's switch table."""
import math

import numpy as np
import pytest

from conftest import load_lesson
from lessons.allreduce_algorithms import model as costs, schedules as sched, show, tuner as tuner

zoo = load_lesson("07_allreduce_algorithms.py")  # the schedules' dispatch, Rabenseifner's, the switch table
ALGOS = zoo.ALGOS


def scheds(algo, n, count, k=3):
    return [sched.canonical(zoo.schedule(algo, r, n, count, k)) for r in range(n)]


def simulate(algo, n, count, k=3):
    """Run every rank's schedule in lockstep: a round's sends read the buffers as they were at the
    round's start; adds and copies land after. Returns (buffers, per-rank tallies)."""
    data = [np.arange(count, dtype=np.int64) * (r + 1) + 7 * r for r in range(n)]
    bufs = [d.copy() for d in data]
    ss = scheds(algo, n, count, k)
    assert len({len(s) for s in ss}) <= 1, "every rank must run the same number of rounds"
    tally = [dict(rounds=0, sent=0, recv=0) for _ in range(n)]
    for i in range(len(ss[0]) if ss else 0):
        msgs = {}
        for r in range(n):
            sends, recvs = ss[r][i]
            for lo, hi, peer in sends:
                msgs.setdefault((r, peer), []).append((lo, hi, bufs[r][lo:hi].copy()))
                tally[r]["sent"] += hi - lo
            if sends or recvs:
                tally[r]["rounds"] += 1
        for r in range(n):
            for lo, hi, peer, op in ss[r][i][1]:
                queue = msgs.get((peer, r), [])
                assert queue, f"{algo} n={n} round {i}: rank {r} waits for {peer}, who sends nothing"
                slo, shi, payload = queue.pop(0)  # posting order: the same size on both sides
                assert (slo, shi) == (lo, hi), f"{algo} n={n} round {i}: {peer}->{r} sizes differ"
                if op == "add":
                    bufs[r][lo:hi] += payload
                else:
                    bufs[r][lo:hi] = payload
                tally[r]["recv"] += hi - lo
        assert all(not q for q in msgs.values()), f"{algo} n={n} round {i}: a send nobody receives"
    return data, bufs, tally


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("n", range(1, 18))
def test_every_rank_holds_the_exact_sum(algo, n):
    for count in sorted({0, 1, max(n - 1, 0), n + 1, 1000, 1001}):
        for k in ((1, 4) if algo == "dbt" else (1,)):
            data, bufs, _ = simulate(algo, n, count, k)
            want = np.sum(data, axis=0) if count else np.zeros(0, np.int64)
            for r in range(n):
                assert np.array_equal(bufs[r], want), f"{algo} n={n} count={count} k={k} rank {r}"


def lg(n):
    return math.ceil(math.log2(n)) if n > 1 else 0


@pytest.mark.parametrize("n", range(1, 18))
def test_closed_forms_rounds_and_bytes(n):
    count = 64 * 1024  # divisible by every power of two <= 16
    p2, r = sched.fold(n)
    fl = p2.bit_length() - 1
    # ring: 2(n-1) rounds, 2(n-1)/n of the buffer
    _, _, t = simulate("ring", n, count)
    assert [x["rounds"] for x in t] == [2 * (n - 1)] * n
    assert sum(x["sent"] for x in t) == 2 * (n - 1) * count
    # rd: busiest rank floor(lg n) + 2 rounds when n is not a power of two
    _, _, t = simulate("rd", n, count)
    assert max(x["rounds"] for x in t) == fl + 2 * (r > 0)
    for q in range(n):
        sits_out = q < 2 * r and q % 2 == 0
        want = count if sits_out else fl * count + (count if q < 2 * r else 0)
        assert t[q]["sent"] == want and t[q]["recv"] == want
    # rabenseifner, count divisible by p2: 2(p2-1)/p2 of the buffer in the core
    _, _, t = simulate("rabenseifner", n, count)
    core = 2 * (p2 - 1) * count // p2
    for q in range(n):
        sits_out = q < 2 * r and q % 2 == 0
        assert t[q]["sent"] == (count if sits_out else core + (count if q < 2 * r else 0))
    # tree: the root moves 2 ceil(lg n) buffers; all ranks together 2(n-1)
    _, _, t = simulate("tree", n, count)
    assert t[0]["sent"] + t[0]["recv"] == 2 * lg(n) * count
    assert sum(x["sent"] for x in t) == 2 * (n - 1) * count
    assert t[0]["rounds"] == 2 * lg(n)
    # dbt: every non-root sends its half up once and gets it once, in each tree
    for k in (1, 5):
        _, _, t = simulate("dbt", n, count, k)
        assert sum(x["sent"] for x in t) == 2 * (n - 1) * count
        if n > 1:
            assert len(scheds("dbt", n, count, k)[0]) == k + 2 * sched.dbt_depth(n) - 1


@pytest.mark.parametrize("n", range(2, 18))
def test_double_binary_tree_shape(n):
    first, second = sched.dbt_trees(n)
    for tree in (first, second):
        assert sum(1 for r in tree if tree[r][0] < 0) == 1  # one root
        assert all(len(tree[r][1]) <= 2 for r in tree)  # binary
        for r in tree:  # parent and child agree
            for kid in tree[r][1]:
                assert tree[kid][0] == r
        assert len(sched.depths(tree)) == n  # every rank reaches the root
    inner = lambda t: {r for r in t if t[r][1]}  # noqa: E731
    both = inner(first) & inner(second)
    if n % 2 == 0:
        assert not both, f"n={n}: ranks {both} are inner in both trees"
    else:
        assert len(both) <= 1  # odd n: the shift leaves at most one rank inner twice
    assert sched.dbt_depth(n) == max(sched.depths(first).values())


def test_trg_formulas_at_a_hand_computed_point():
    a, b, g, n, nb = 2e-6, 1e-9, 5e-10, 4, 1000
    assert costs.predict("ring", n, nb, a, b, g) == pytest.approx(6 * a + 1.5 * nb * b + 0.75 * nb * g)
    assert costs.predict("rd", n, nb, a, b, g) == pytest.approx(2 * (a + nb * b + nb * g))
    assert costs.predict("rabenseifner", n, nb, a, b, g) == pytest.approx(4 * a + 1.5 * nb * b + 0.75 * nb * g)
    assert costs.predict("tree", n, nb, a, b, g) == pytest.approx(4 * (a + nb * b) + 2 * nb * g)
    # n = 5: rd on the 4-rank core plus the pre/post steps
    assert costs.predict("rd", 5, nb, a, b, g) == pytest.approx(2 * (a + nb * b + nb * g) + 2 * a + 2 * nb * b + nb * g)
    assert costs.predict("tree", 5, nb, a, b, g) == pytest.approx(6 * (a + nb * b) + 3 * nb * g)


@pytest.mark.parametrize("algo", ["tree", "rd", "rabenseifner", "ring"])
@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
def test_schedule_cost_agrees_with_trg(algo, n):
    a, b, g, nb = 3e-6, 2e-10, 4e-10, 840 * 64  # every n here divides it
    per_rank = [zoo.schedule(algo, r, n, nb) for r in range(n)]
    assert costs.schedule_cost(per_rank, a, b, g) == pytest.approx(costs.predict(algo, n, nb, a, b, g))


def test_dbt_chunks_rule():
    assert costs.dbt_chunks(1, 1 << 20, 1e-6, 1e-10) == 1
    D = sched.dbt_depth(4)
    assert costs.dbt_chunks(4, 1 << 20, 1e-6, 1e-10) == round(math.sqrt((2 * D - 1) * 2 * (1 << 20) * 1e-10 / 1e-6))
    assert costs.dbt_chunks(4, 1 << 30, 1e-6, 1e-9) == costs.KMAX


def test_switch_table_on_made_up_timings():
    times = {4096: {"rd": 1.0, "ring": 3.0, "tree": 2.0}, 65536: {"rd": 5.0, "ring": 4.0, "tree": 6.0},
             1 << 20: {"rd": 50.0, "ring": 20.0, "tree": 60.0}, 1 << 24: {"rd": 500.0, "ring": 300.0, "tree": 200.0}}
    table = zoo.switch_table(times)
    assert table == [(4096, "rd"), (65536, "ring"), (1 << 20, "ring"), (1 << 24, "tree")]
    assert tuner.switch_points(table) == "<= 4K: rd, <= 1M: ring, else tree"
    assert tuner.choose(table, 100) == "rd"  # below the table: the smallest size's choice
    assert tuner.choose(table, 65535) == "rd" and tuner.choose(table, 65536) == "ring"
    assert tuner.choose(table, 1 << 30) == "tree"


def test_a_long_switch_table_fits_100_columns(capsys):
    """--bench's 16 sizes may change algorithm at every size: the line wraps, each '<= size: algo' whole."""
    from types import SimpleNamespace
    algos = ["rabenseifner", "rd", "tree"]
    table = [(4096 << i, algos[i % 3]) for i in range(16)]
    ctx = SimpleNamespace(world_size=4, transport="gloo", rank=0)
    tuner.show_race(ctx, SimpleNamespace(dtype="float32", csv=None, algos=algos), table, [], 1e-6)
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 100, out
    said = out.split("switch table")[1].split("\ngloo")[0]
    assert len(said.splitlines()) > 1, said  # it did need the wrap
    for line in said.splitlines()[1:]:
        assert line.startswith("    <= ") or line.startswith("    else "), said
    assert " ".join(said.split()).endswith(tuner.switch_points(table)), said


@pytest.mark.parametrize("tuned, lib, noise, rounds, verdict", [
    (30.0, 29.5, 1.0, 2, "a tie"),          # lost by 0.5 us, batches wander by 1 us
    (30.0, 25.0, 1.0, 4, "at least half Python"),  # 4 rounds x 1 us is at least half the 5 us gap
    (30.0, 20.0, 1.0, 2, "over twice the Python"),  # 2 us priced: a lower bound, it rules nothing out
])
def test_a_lost_size_is_told_apart_from_noise_and_python(tuned, lib, noise, rounds, verdict):
    row = {"tuned_us": tuned, "lib_us": lib, "noise_us": noise, "rounds": rounds}
    assert tuner.gap_verdict(row, overhead=1e-6).startswith(verdict)


def said(model, n=2, cores=2, transport="mpi", walk=1e-7, mrows=(), algos=()):
    """The reasons section's lines for a made-up run (affinity patched to `cores`)."""
    import os
    from types import SimpleNamespace
    ctx = SimpleNamespace(world_size=n, transport=transport, single_node=True)
    real = os.sched_getaffinity
    os.sched_getaffinity = lambda pid: set(range(cores))
    try:
        return show.reasons(ctx, model, walk, list(mrows), list(algos))
    finally:
        os.sched_getaffinity = real


def line_model(beta_ring=1e-10, step_at=None, jump=0.0):
    """A ping-pong on one straight line (alpha 2 us, 10 GB/s), with an optional step up after `step_at` B."""
    pts = [(b, 2e-6 + b * 1e-10 + (jump if step_at is not None and b > step_at else 0.0)) for b in costs.PING]
    return dict(alpha=2e-6, beta=1e-10, gamma=1e-11, beta_ring=beta_ring, pingpong=pts)


@pytest.mark.parametrize("beta_ring, n, cores, says, not_said", [
    (4e-10, 2, 2, "the node's memory system", "(a)"),          # a core per rank: the shared memory system
    (4e-10, 4, 2, "time-sharing of the cores, (a)", "memory"),  # oversubscribed: that alone can explain it
    (2.5e-11, 2, 2, "4.0x faster than the lone", "memory"),
    (1.1e-10, 2, 2, "within 1.5x", "memory"),
    (0.0, 2, 2, "not compared", "faster")])  # a busy machine measured the 4 MiB exchange at alpha's time
def test_the_concurrent_beta_is_told_by_what_the_run_shows(beta_ring, n, cores, says, not_said):
    (b,) = [line for line in said(line_model(beta_ring), n, cores) if line.startswith("(b)")]
    assert says in b and not_said not in b, b


@pytest.mark.parametrize("transport, why", [("mpi", "eager to rendezvous"), ("gloo", "cannot say why"),
                                            ("nccl", "NCCL_PROTO")])
def test_a_step_in_the_ping_pong_is_found_where_it_is_and_named_per_transport(transport, why):
    model = line_model(step_at=8192, jump=6e-6)  # +6 us from 8 KiB to 16 KiB: the slope predicts +0.8 us
    assert costs.ping_step(model["pingpong"], 2e-6, 1e-10)[:2] == (8192, 16384)
    (c,) = [line for line in said(model, transport=transport) if line.startswith("(c)")]
    assert "at 8192 B" in c and "at 16384 B" in c and why in c, c
    if transport != "mpi":
        assert "eager" not in c


def test_no_step_no_protocol_story():
    assert costs.ping_step(line_model()["pingpong"], 2e-6, 1e-10) is None
    spike = line_model()["pingpong"]
    spike[5] = (spike[5][0], spike[5][1] + 50e-6)  # one noisy size, back on the line after it
    assert costs.ping_step(spike, 2e-6, 1e-10) is None
    assert not [line for line in said(line_model()) if line.startswith(("(c)", "(d)", "(a)"))]

def test_the_reasons_come_before_the_table_and_only_rows_off_from_both_predictions_are_starred(capsys, monkeypatch):
    import os
    from types import SimpleNamespace
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    ctx = SimpleNamespace(world_size=4, transport="mpi", single_node=True, rank=0, api="mpi4py")
    args = SimpleNamespace(algos=["rd", "ring"], plot=None)
    row = {"size": 4096, "k": 1, "alpha_us": 2.0, "beta_us": 1e-4, "gamma_us": 1e-5,
           "rd_us": 50.0, "rd_pred_us": 10.0, "rd_pred_all_us": 40.0,        # 5x the lone one, 1.25x all talking
           "ring_us": 90.0, "ring_pred_us": 10.0, "ring_pred_all_us": 30.0,  # 9x and 3x: off from both
           "rd_rounds": 2, "ring_rounds": 6}
    show.measured_vs_model(ctx, args, dict(line_model(4e-10), alpha_all=1e-5), [row], 1e-8)
    lines = capsys.readouterr().out.splitlines()
    head = next(i for i, line in enumerate(lines) if "size B" in line and "meas/pred" in line)
    assert any("leaves out" in line for line in lines[:head]) and any(line.startswith("  (a)") for line in lines[:head])
    rd, ring = (next(line for line in lines[head:] if f" {a} " in f" {line} ") for a in ("rd", "ring"))
    assert not rd.endswith("*") and ring.endswith("3.00 *"), (rd, ring)
    assert lines[-1].startswith("* 1 of 2 rows are off by more than 2x from both predictions"), lines[-1]



def test_python_per_round_is_said_only_where_it_weighs():
    row = {"size": 4096, "k": 1, "ring_us": 10.0, "ring_rounds": 6}
    heavy = said(line_model(), n=4, cores=4, walk=1e-6, mrows=[row], algos=["ring"])   # 6 rounds x 1 us of 10 us
    light = said(line_model(), n=4, cores=4, walk=1e-8, mrows=[row], algos=["ring"])
    assert any(line.startswith("(e)") and "60%" in line for line in heavy)
    assert not any(line.startswith("(e)") for line in light)


def test_mismatch_accepts_every_schedule_and_names_a_broken_one():
    for algo in ALGOS:
        for n in (1, 2, 3, 5, 8):
            assert sched.mismatch(scheds(algo, n, 10)) is None, (algo, n)
    broken = scheds("ring", 3, 9)
    sends, recvs = broken[0][0]
    broken[0][0] = ([(0, 2, sends[0][2])], recvs)  # rank 0 sends a slice its neighbour does not expect
    assert sched.mismatch(broken) == "round 0: rank 0 sends slices [(0, 2)] to rank 1, which expects [(0, 3)]"
    assert "different numbers of rounds" in sched.mismatch([scheds("ring", 3, 9)[0][:-1]] + scheds("ring", 3, 9)[1:])


@pytest.mark.parametrize("n", range(2, 18))
def test_dbt_cost_bound_from_the_docstring(n):
    """Busiest rank per round: at most 4 chunks sent and 2 added, so the cost is bounded as stated."""
    k, half = 8, 1000
    per_rank = [sched.dbt_schedule(r, n, 2 * k * half, k) for r in range(n)]
    for rounds in per_rank:
        for sends, recvs in rounds:
            assert sum(hi - lo for lo, hi, _ in sends) <= 4 * half
            assert sum(hi - lo for lo, hi, _, op in recvs if op == "add") <= 2 * half
    a, b, g, nb, D = 1e-6, 1e-9, 1e-9, 2 * k * half, sched.dbt_depth(n)
    assert costs.schedule_cost(per_rank, a, b, g) <= (k + 2 * D - 1) * (a + 2 * nb / k * b + nb / k * g) + 1e-15
