"""Lesson 10's pure pieces, without MPI: the padded shards, the layer math its three trainings share
(against finite differences), and the measured bytes held. The runs themselves are in test_lessons.py
and the wrong answers in tests/wrong_answers/10_zero3_fsdp.yaml."""
import gc

import numpy as np
import pytest

from common import bootstrap, text

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
