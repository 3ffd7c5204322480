"""Lesson 10's pure pieces, without MPI: the padded shards, the layer math its three trainings share
(against finite differences), and the measured bytes held; the budget (lessons/zero3_fsdp/budget.py)
against a training in another dtype and in real runs. The runs themselves are in test_lessons.py
and the wrong answers in tests/wrong_answers/10_zero3_fsdp.yaml."""
import gc
import math
import types

import numpy as np
import pytest

from common import bootstrap, text, tolerance
from conftest import check_nps, worst_over_seeds
from lessons.zero3_fsdp import budget

ten = bootstrap.lesson_module("10")  # importing a lesson starts no MPI


@pytest.mark.parametrize("items", [1, 7, 24, 91, 154])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_shards_are_equal_and_hold_the_layer_once_then_zeros(items, n):
    flat = np.arange(1.0, items + 1)
    got = [ten.pad_and_shard(flat, r, n) for r in range(n)]
    size = -(-items // n)
    assert {s.size for s in got} == {size}
    whole = np.concatenate(got)
    assert np.array_equal(whole[:items], flat) and not whole[items:].any()  # padding is zeros
    got[0][0] = -1.0
    assert flat[0] == 1.0  # a shard is a copy: stepping it never writes into the caller's vector


def test_unflatten_ignores_the_padding():
    flat = np.arange(20.0)  # a 3+1 x 4 layer has 16 items; 4 more of padding
    w, b = ten.unflatten(flat, 3, 4)
    assert w.shape == (3, 4) and np.array_equal(b, [12, 13, 14, 15])


@pytest.mark.parametrize("last", [False, True])
def test_backward_layer_matches_finite_differences(last):
    rng = np.random.default_rng(0)
    fan_in, fan_out, rows = 3, 4, 5
    x, t = rng.standard_normal((rows, fan_in)), rng.standard_normal((rows, fan_out))
    flat = rng.standard_normal(ten.layer_items(fan_in, fan_out) + 2)  # + padding

    def loss(params, inputs):
        y = ten.forward_layer(np, inputs, params, fan_in, fan_out, last)
        return float(((y - t) ** 2).sum()) / rows

    y = ten.forward_layer(np, x, flat, fan_in, fan_out, last)
    grad = np.zeros_like(flat)
    gx = ten.backward_layer(x, y, ten.loss_grad(y, t, rows), flat, grad, fan_in, fan_out, last)
    h = 1e-6
    for i in range(flat.size):
        e = np.zeros_like(flat)
        e[i] = h
        assert grad[i] == pytest.approx((loss(flat + e, x) - loss(flat - e, x)) / (2 * h), abs=1e-7)
    assert not grad[-2:].any()  # the padding's gradient is 0, so it never moves
    for i, j in [(0, 0), (4, 2)]:
        e = np.zeros_like(x)
        e[i, j] = h
        assert gx[i, j] == pytest.approx((loss(flat, x + e) - loss(flat, x - e)) / (2 * h), abs=1e-7)


def test_held_bytes_are_measured_until_python_frees_the_array():
    held = ten.Held()
    keep = held(np.zeros(10))             # 80 B
    a = held(np.zeros(5))                 # 40 B
    del a
    gc.collect()
    b = held(np.zeros(5))
    assert (held.now, held.peak) == (120, 120)  # a was freed before b came
    c = held(np.zeros(1))
    assert held.peak == 128
    del keep, b, c
    gc.collect()
    assert held.now == 0


def test_bad_sizes_are_refused_in_one_line():
    import argparse
    assert ten.widths("6,13,3") == [6, 13, 3]
    for bad in ("6", "6,0,3", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            ten.widths(bad)


def test_rows_equal_on_consecutive_ranks_print_once():
    assert text.once([(0, 1.0), (1, 1.0)]) == [("all", 1.0)]
    assert text.once([(0, 1, "a"), (1, 1, "a"), (2, 1, "a"), (3, 2, "b")]) == [("0-2", 1, "a"), (3, 2, "b")]
    assert text.once([(0, 1), (1, 2), (2, 1)]) == [(0, 1), (1, 2), (2, 1)]  # only neighbours merge


ONE = types.SimpleNamespace(api="mpi4py", device="cpu", world_size=1)  # one process, NumPy, no MPI


def small(dtype, seed, sgd=3, adam=3):
    sizes = ten.widths(ten.SIZES)
    dims, flats = ten.layer_dims(sizes), ten.init_flats(sizes, np.dtype(dtype), seed)
    x, t = ten.make_data(sizes, ten.BATCH, np.dtype(dtype), seed)
    schedule = [("sgd", ten.LR_SGD, 0)] * sgd + [("adam", ten.LR_ADAM, k + 1) for k in range(adam)]
    return dims, flats, x, t, schedule


def test_the_budgets_gradients_and_hessian_are_the_lessons():
    dims, flats, x, t, _ = small("float64", 0)
    flat = np.concatenate(flats)
    h = budget.hessian(flat, dims, x, t, ten.BATCH)
    assert np.allclose(h, h.T, atol=1e-7)
    after = ten.reference_train(ONE, np, flats, dims, x, t, ten.BATCH, [("sgd", 1.0, 0)])[0]
    assert np.allclose(flat - np.concatenate(after), budget.gradients(flat[None], dims, x, t, ten.BATCH)[0])


@pytest.mark.parametrize("steps", [1, 2, 3, 5])
def test_adams_step_is_at_most_its_cap_whatever_the_gradients(steps):
    rng = np.random.default_rng(steps)
    g = rng.standard_normal((steps, 10000)) * rng.choice([1e-6, 1.0, 1e3], (steps, 10000))
    m = sum((1 - ten.B1) * ten.B1 ** (steps - 1 - i) * g[i] for i in range(steps))
    v = sum((1 - ten.B2) * ten.B2 ** (steps - 1 - i) * g[i] ** 2 for i in range(steps))
    bias = math.sqrt(1 - ten.B2 ** steps) / (1 - ten.B1 ** steps)
    assert (np.abs(m) / np.sqrt(v) * bias).max() <= budget.adam_cap(steps, ten.B1, ten.B2) * (1 + 1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_float32_is_inside_half_the_budget_of_float64_and_a_wrong_step_is_not(seed):
    """Each training is held within E = budget / 2 of exact arithmetic: one process in float32 against
    float64 on the same float32 values (nearly exact) must be inside it, Adam's amplification too."""
    dims, flats, x, t, schedule = small("float32", seed)
    bound = budget.trajectory(flats, dims, x, t, ten.BATCH, schedule, "float32", 1, (ten.B1, ten.B2, ten.EPS))
    narrow = ten.reference_train(ONE, np, flats, dims, x, t, ten.BATCH, schedule)[-1]
    wide = ten.reference_train(ONE, np, [f.astype(np.float64) for f in flats], dims, x.astype(np.float64),
                               t.astype(np.float64), ten.BATCH, schedule)[-1]
    assert tolerance.worst_ratio(np.concatenate(narrow) - np.concatenate(wide), bound / 2) <= 1
    dims, flats, x, t, schedule = small("float64", seed, 1, 1)
    bound = budget.trajectory(flats, dims, x, t, ten.BATCH, schedule, "float64", 3, (ten.B1, ten.B2, ten.EPS))
    right = ten.reference_train(ONE, np, flats, dims, x, t, ten.BATCH, schedule)[-1]
    wrong = ten.reference_train(ONE, np, flats, dims, x, t, ten.BATCH, [("sgd", ten.LR_SGD / 3, 0)] + schedule[1:])[-1]
    assert tolerance.worst_ratio(np.concatenate(right) - np.concatenate(wrong), bound) > 1   # a gradient / N


GRADED = ("end_vs_single_ratio", "end_vs_dp_ratio", "library_vs_single_ratio")


def graded(doc):
    """The worst of one run's budget ratios, over its ranks: the ZeRO-3 training's end against one
    process and against data parallel, the library's against one process."""
    return max(rank[k] for rank in doc["ranks"] for k in GRADED)


def grade_runs(tmp_path, n, seeds):
    assert worst_over_seeds(tmp_path, "10", n, seeds, graded) <= 1


@pytest.mark.slow  # 6 real runs: ~30 s of CPU on 2 cores
@pytest.mark.parametrize("n", [2, 3])
def test_correct_runs_stay_inside_the_budget_for_3_seeds(tmp_path, n):
    grade_runs(tmp_path, n, range(3))


@pytest.mark.sweep  # the check NPs x 20 seeds: minutes an NP; pytest -m sweep
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("n", check_nps("10"))
def test_correct_runs_stay_inside_the_budget_for_20_seeds(tmp_path, n):
    """The issue's bar (41): the NPs `bin/tutor check` runs (the YAML's np.check), 20 seeds each
    (float32 and float64 in turn)."""
    grade_runs(tmp_path, n, range(20))
