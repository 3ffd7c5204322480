"""Lesson 12's schedules in one process (no MPI): GPipe's and 1F1B's orders, placed on ticks, their
bubble and peak memory against the closed forms, their messages, and the checks that stop a broken
order before anything runs (lessons/pipeline_parallel/schedules.py). The runs are in test_lessons.py, the wrong
answers in tests/wrong_answers/12_pipeline_parallel.yaml."""
import numpy as np
import pytest

from common import shards, tolerance
from conftest import check_nps, load_lesson, worst_over_seeds
from lessons.pipeline_parallel import budget, schedules as ps, show

twelve = load_lesson("12_pipeline_parallel.py")  # importing a lesson starts no MPI
SHAPES = [(1, 1), (1, 5), (2, 1), (2, 5), (3, 8), (4, 3), (4, 8), (5, 2), (6, 13)]


def orders(name, p, m):
    return [twelve.ORDERS[name](s, p, m) for s in range(p)]


def held(order):
    """The most micro-batches between their forward and their backward, walking one stage's order."""
    live = peak = 0
    for kind, _ in order:
        live += 1 if kind == "F" else -1
        peak = max(peak, live)
    return peak


@pytest.mark.parametrize("p, m", SHAPES)
@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_both_schedules_take_2_m_plus_p_minus_1_ticks_and_idle_the_formula(name, p, m):
    pl = ps.plan(orders(name, p, m), m)
    assert pl.ticks == 2 * (m + p - 1)
    assert all(sum(op is not None for op in row) == 2 * m for row in pl.grid)
    assert ps.bubble(pl.grid) == pytest.approx([(p - 1) / (m + p - 1)] * p, rel=1e-12)


@pytest.mark.parametrize("p, m", SHAPES)
@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_a_backward_twice_as_long_leaves_the_same_fraction_idle(name, p, m):
    cost = {"F": 1, "B": 2}
    start = ps.place(orders(name, p, m), cost)
    assert ps.ticks_of(start, cost) == 3 * (m + p - 1)
    assert ps.bubble(ps.grid(orders(name, p, m), start, cost)) == pytest.approx([(p - 1) / (m + p - 1)] * p)


@pytest.mark.parametrize("p, m", SHAPES)
def test_gpipe_holds_every_micro_batch_1f1b_at_most_p_minus_s(p, m):
    assert [held(o) for o in orders("gpipe", p, m)] == [m] * p
    assert [held(o) for o in orders("1f1b", p, m)] == [min(p - s, m) for s in range(p)]


def test_the_1f1b_grid_has_its_warm_up_steady_state_and_cool_down():
    pl = ps.plan(orders("1f1b", 4, 8), 8)
    row = [ps.name(op) if op else "." for op in pl.grid[0]]
    assert row[:8] == ["F0", "F1", "F2", "F3", ".", ".", ".", "B0"]   # warm-up 3, then F3, wait for B0
    assert row[-7:] == ["B4", ".", "B5", ".", "B6", ".", "B7"]  # cool-down: one backward per 2 ticks
    assert [ps.name(op) for op in pl.grid[3][3:7]] == ["F0", "B0", "F1", "B1"]  # the last stage: 1F1B


@pytest.mark.parametrize("p, m", SHAPES)
@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_each_stage_sends_m_activations_and_m_gradients_to_its_neighbours(name, p, m):
    pl = ps.plan(orders(name, p, m), m)
    for s, row in enumerate(pl.steps):
        sent = {ph: [msg for st in row for msg in st[ph][0]] for ph in ("forward", "backward")}
        got = {ph: [msg for st in row for msg in st[ph][1]] for ph in ("forward", "backward")}
        assert sorted(sent["forward"]) == ([(i, s + 1) for i in range(m)] if s < p - 1 else [])
        assert sorted(sent["backward"]) == ([(i, s - 1) for i in range(m)] if s > 0 else [])
        assert sorted(got["forward"]) == ([(i, s - 1) for i in range(m)] if s > 0 else [])
        assert sorted(got["backward"]) == ([(i, s + 1) for i in range(m)] if s < p - 1 else [])


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_a_message_travels_in_the_tick_its_consumer_runs_and_after_it_is_made(name):
    p, m = 4, 8
    pl = ps.plan(orders(name, p, m), m)
    for s, row in enumerate(pl.steps):
        for t, st in enumerate(row):
            for i, frm in st["forward"][1]:
                assert pl.grid[s][t] == ("F", i) and pl.start[(frm, ("F", i))] < t
            for i, frm in st["backward"][1]:
                assert pl.grid[s][t] == ("B", i) and pl.start[(frm, ("B", i))] < t


def test_1f1b_without_warm_up_is_valid_but_runs_one_micro_batch_at_a_time():
    p, m = 4, 8
    serial = [[op for i in range(m) for op in (("F", i), ("B", i))] for _ in range(p)]
    pl = ps.plan(serial, m)
    assert pl.ticks == 2 * m * p and ps.bubble(pl.grid) == pytest.approx([(p - 1) / p] * p)


def test_one_warm_up_forward_too_many_holds_one_micro_batch_more():
    p, m = 4, 8

    def order(s):
        w = min(p - s, m)
        return ([("F", i) for i in range(w)] + [op for i in range(m - w) for op in (("F", w + i), ("B", i))]
                + [("B", i) for i in range(m - w, m)])
    every = [order(s) for s in range(p)]
    ps.plan(every, m)  # valid
    assert [held(o) for o in every] == [min(p - s + 1, m) for s in range(p)]


def test_a_backward_before_its_own_forward_deadlocks_and_says_who_waits_for_what():
    p, m = 3, 2
    broken = orders("1f1b", p, m)
    broken[2] = [("B", 0), ("F", 0), ("F", 1), ("B", 1)]
    with pytest.raises(ps.ScheduleError, match=r"the schedule: the orders deadlock: .*stage 2 waits to run "
                                               r"B0, which needs F0 on stage 2, its own, later in its order"):
        ps.plan(broken, m, "the schedule")


def test_orders_that_wait_on_each_other_deadlock_and_orders_that_only_wait_are_slow():
    p, m = 2, 3
    every = orders("gpipe", p, m)
    every[1] = [("F", i) for i in range(m)] + [("B", i) for i in range(m)]  # stage 0 waits for B2 first
    pl = ps.plan(every, m)  # valid: stage 0 only waits
    assert pl.ticks > 2 * (m + p - 1)
    every = [[("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2)],   # B0 before F1 here,
             [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("B", 2)]]   # F1 before B0 there
    with pytest.raises(ps.ScheduleError, match=r"deadlock: stage 0 waits to run B0, which needs B0 on "
                                               r"stage 1; stage 1 waits to run F1, which needs F1 on stage 0"):
        ps.plan(every, m)


@pytest.mark.parametrize("order, said", [
    ([("F", 0), ("B", 0), ("F", 1)], "stage 0's order never runs B1"),
    ([("F", 0), ("F", 0), ("B", 0), ("F", 1), ("B", 1)], "stage 0's order runs F0 2 times"),
    ([("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2)], "stage 0's order runs F2, not an op of 2"),
])
def test_an_order_must_run_every_op_once(order, said):
    with pytest.raises(ps.ScheduleError, match=said):
        ps.plan([order], 2)


def test_a_send_no_one_receives_is_named_with_its_tick():
    p, m = 3, 2
    pl = ps.plan(orders("gpipe", p, m), m)
    steps = pl.steps
    t = next(t for t, st in enumerate(steps[1]) if st["backward"][0])
    (i, peer), = steps[1][t]["backward"][0]
    steps[1][t]["backward"][0].append((i, 2))  # the gradient sent up as well as down
    assert ps.mismatch(steps, pl.start) == (f"tick {t}: stage 1 sends the gradient of micro-batch {i} "
                                            "to stage 2, which receives no such thing then")
    steps[1][t]["backward"][0][:] = []  # and not at all
    assert ps.mismatch(steps, pl.start) == (f"tick {t}: stage 0 waits for the gradient of micro-batch "
                                            f"{i} from stage 1, which sends no such thing then")


def test_a_message_sent_before_it_is_made_is_refused():
    p, m = 2, 2
    pl = ps.plan(orders("gpipe", p, m), m)
    start = dict(pl.start)
    start[(0, ("F", 1))] = 5  # as if stage 0 made F1's activation late
    assert "which it makes only by tick 6" in ps.mismatch(pl.steps, start)


def test_the_grid_fits_the_width_in_blocks_of_ticks():
    pl = ps.plan(orders("gpipe", 4, 40), 40)
    lines = ps.render(pl.grid, 100)
    assert max(map(len, lines)) <= 100
    blocks = [line for line in lines if line.startswith("ticks ")]
    assert len(blocks) > 1 and blocks[0].startswith("ticks 0-")
    cells = sum(len(line.split()) - 2 for line in lines if line.startswith("rank 0"))
    assert cells == pl.ticks
    assert ps.render(ps.plan(orders("1f1b", 2, 3), 3).grid)[0] == "rank 0 F0 F1 .  B0 F2 B1 .  B2"


def test_gpipe_backwards_in_forward_order_on_every_stage_take_as_long():
    p, m = 4, 8
    fifo = [[("F", i) for i in range(m)] + [("B", i) for i in range(m)] for _ in range(p)]
    pl = ps.plan(fifo, m)
    assert pl.ticks == 2 * (m + p - 1) and [held(o) for o in fifo] == [m] * p


def bubble_rows(op_us, msgs_share, p=4, m=8):
    """Section 4's gathered rows for ranks whose ops took op_us[r] each and who spent msgs_share of the
    walk in message groups (the quickest group: 1 us, as on a machine where a lone exchange is cheap)."""
    rows = []
    for r, op in enumerate(op_us):
        busy = 2 * m * op * 1e-6
        wall = busy / (1 - msgs_share)
        run = {"ran": 2 * m, "ticks": 2 * (m + p - 1), "bubble": (p - 1) / (m + p - 1), "busy_s": busy,
               "waited_s": wall * msgs_share, "wall_s": wall, "wall_idle": 1 - busy / wall,
               "quickest_group_s": 1e-6}
        rows.append((r, "0", {}, {}, {"gpipe": run, "1f1b": run}))
    return rows


@pytest.mark.parametrize("op_us, msgs, says, not_said", [
    ([40, 40, 40, 40], 0.95, "of its walk in message groups", "unequal work"),    # messages, measured
    ([40, 42, 41, 43], 0.95, "of its walk in message groups", "unequal work"),    # 3 us apart: too little
    ([20, 50, 20, 20], 0.45, "stages of unequal work", "Python walking"),
])
def test_the_wall_clock_reasons_rest_on_what_was_measured(op_us, msgs, says, not_said, capsys, monkeypatch):
    monkeypatch.setattr(show.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    ctx = type("Ctx", (), {"world_size": 4})()
    show.bubble(ctx, bubble_rows(op_us, msgs), 3 / 11, cores=8)
    text = capsys.readouterr().out
    assert says in text and not_said not in text, text
    assert all(len(line) <= 100 for line in text.splitlines()), text


# ---- the oracle's budget (lessons/pipeline_parallel/budget.py) --------------------------------------

def micro_batched(dims, flats, x, t, batch, m, scale=1.0):
    """The loss and gradients summed micro-batch by micro-batch, one process (the stages' arithmetic)."""
    ten, last = twelve.ten, len(dims) - 1
    loss, grads = 0.0, [np.zeros_like(f) for f in flats]
    for lo, hi in shards.chunk_bounds(batch, m):
        acts = [x[lo:hi]]
        for k, (fi, fo) in enumerate(dims):
            acts.append(ten.forward_layer(np, acts[-1], flats[k], fi, fo, k == last))
        part, gy = twelve.micro_loss(acts[-1], t[lo:hi], batch)
        loss, gy = loss + part, gy * scale
        for k in reversed(range(len(dims))):
            g = np.zeros_like(flats[k])
            gy = ten.backward_layer(acts[k], acts[k + 1], gy, flats[k], g, *dims[k], k == last)
            grads[k] += g
    return float(loss), grads


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("seed", range(5))
def test_micro_batches_stay_inside_the_budget_and_a_wrong_scale_does_not(dtype, seed):
    ten, batch = twelve.ten, 30
    sizes = [twelve.IN_WIDTH] + [twelve.HIDDEN] * 6 + [twelve.OUT_WIDTH]
    dims, flats = ten.layer_dims(sizes), ten.init_flats(sizes, np.dtype(dtype), seed)
    x, t = ten.make_data(sizes, batch, np.dtype(dtype), seed)
    ref_loss, ref_grads = twelve.one_process(dims, flats, x, t, batch)
    loss_b, grad_b = budget.bounds(dims, flats, x, t, batch, dtype)
    for m in (1, 7, 30):
        loss, grads = micro_batched(dims, flats, x, t, batch, m)
        assert tolerance.worst_ratio(loss - ref_loss, loss_b) <= 1
        assert max(tolerance.worst_ratio(g - r, b) for g, r, b in zip(grads, ref_grads, grad_b)) <= 1
    _, grads = micro_batched(dims, flats, x, t, batch, 7, scale=1 + 1e-3)   # a gradient 0.1% off
    assert max(tolerance.worst_ratio(g - r, b) for g, r, b in zip(grads, ref_grads, grad_b)) > 1


def graded(doc):
    """The worst of one run's budget ratios, over its ranks and schedules: loss and gradients."""
    return max(r[k] for rank in doc["ranks"] for r in rank["runs"]
               for k in ("loss_ratio", "grad_ratio"))


def grade_runs(tmp_path, n, seeds):
    """At least one layer a stage: --layers max(the default, n)."""
    assert worst_over_seeds(tmp_path, "12", n, seeds, graded,
                            args=("--layers", str(max(twelve.LAYERS, n)))) <= 1


@pytest.mark.slow  # 6 real runs: ~60 s of CPU on 2 cores, over make test's share
@pytest.mark.parametrize("n", [3, 5])
def test_correct_runs_stay_inside_the_budget_for_3_seeds(tmp_path, n):
    grade_runs(tmp_path, n, range(3))


@pytest.mark.sweep  # the check NPs x 20 seeds: minutes an NP; pytest -m sweep
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("n", check_nps("12"))
def test_correct_runs_stay_inside_the_budget_for_20_seeds(tmp_path, n):
    """The issue's bar (41): the NPs `bin/tutor check` runs (the YAML's np.check), 20 seeds each
    (float32 and float64 in turn)."""
    grade_runs(tmp_path, n, range(20))
