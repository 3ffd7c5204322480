"""Lesson 11's pure pieces, without MPI: the block's hand-written backward (against finite
differences), which every way and the one-process reference share, and the measured GeLU gap. The runs
themselves are in test_lessons.py and the wrong answers in tests/wrong_answers/11_tensor_parallel.yaml."""
import numpy as np
import pytest

from common import bootstrap
from lessons.tensor_parallel import show

eleven = bootstrap.lesson_module("11")  # importing a lesson starts no MPI


def loss(p, x, w):
    y, _ = eleven.layer_norm(x, p["gamma"], p["beta"])
    z = x + eleven.gelu(np, y @ p["A"] + p["a"]) @ p["B"] + p["b"]
    return float((w * z).sum())


@pytest.mark.parametrize("tokens, hidden, ffn", [(5, 4, 7), (3, 1, 2)])
def test_the_reference_backward_matches_finite_differences(tokens, hidden, ffn):
    p, x, w = eleven.make_block(tokens, hidden, ffn, np.float64)
    z, dx, grads = eleven.reference(p, x, w)
    assert z.shape == x.shape and loss(p, x, w) == pytest.approx(float((w * z).sum()))
    h = 1e-6

    def numeric(array, index, args):
        keep = array[index]
        array[index] = keep + h
        up = loss(*args)
        array[index] = keep - h
        down = loss(*args)
        array[index] = keep
        return (up - down) / (2 * h)

    rng = np.random.default_rng(0)
    for name, array in [("x", x)] + [(k, p[k]) for k in ("gamma", "beta", "A", "a", "B", "b")]:
        got = dx if name == "x" else grads["d" + name]
        assert got.shape == array.shape
        for _ in range(4):
            index = tuple(int(rng.integers(s)) for s in array.shape)
            assert got[index] == pytest.approx(numeric(array, index, (p, x, w)), abs=1e-6), (name, index)


def test_gelu_grad_is_the_derivative_of_gelu():
    u = np.linspace(-4, 4, 41)
    h = 1e-6
    numeric = (eleven.gelu(np, u + h) - eleven.gelu(np, u - h)) / (2 * h)
    assert np.allclose(eleven.gelu_grad(np, u), numeric, atol=1e-8)


def test_gelu_of_a_sum_is_not_the_sum_of_gelus_unless_nothing_is_split():
    p, x, _ = eleven.make_block(22, 10, 40, np.float64)
    assert eleven.gelu_of_sums(p, x, 1) == 0.0
    assert eleven.gelu_of_sums(p, x, 2) > 0.1


def test_held_bytes_are_the_arrays_handed_to_backward_by_part():
    saved = {"xhat": np.zeros((3, 4)), "rstd": np.zeros((3, 1)), "y": np.zeros((6, 4)),
             "u": np.zeros((6, 2))}
    held = eleven.held_bytes(saved, np.zeros((3, 4)))
    assert held == {"LN": 8 * 15, "input": 8 * 24, "MLP": 8 * 12, "output": 8 * 12}


def test_per_rank_says_a_shared_value_once():
    assert show.per_rank([5, 5, 5]) == "5 each"
    assert show.per_rank([1, 2, 3, 4]) == "1 2 3 4"
    assert show.per_rank(range(8)) == "0 .. 7"
