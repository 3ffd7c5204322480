"""Lesson 11's pure pieces, without MPI: the block's hand-written backward (against finite
differences), which every way and the one-process reference share, and the measured GeLU gap. The runs
themselves are in test_lessons.py and the wrong answers in tests/wrong_answers/11_tensor_parallel.yaml;
the budget (lessons/tensor_parallel/budget.py) against an evaluation in another dtype and in real runs."""
import numpy as np
import pytest

from common import bootstrap, tolerance
from conftest import check_nps, worst_over_seeds
from lessons.tensor_parallel import budget, show

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


def test_gelu_second_derivative_in_the_budget_is_the_derivative_of_gelu_grad():
    u, h, c, k = np.linspace(-5, 5, 101), 1e-6, eleven.GELU_C, eleven.GELU_K
    numeric = (eleven.gelu_grad(np, u + h) - eleven.gelu_grad(np, u - h)) / (2 * h)
    t, dt = np.tanh(c * (u + k * u ** 3)), c * (1 + 3 * k * u * u)
    assert np.allclose((1 - t * t) * dt * (1 - u * t * dt) + 3 * c * k * u * u * (1 - t * t), numeric, atol=1e-8)


@pytest.mark.parametrize("seed", range(5))
def test_float32_is_inside_half_the_budget_of_exact_and_a_wrong_gradient_is_not(seed):
    """Each side of the parity is held within E = budget / 2 of exact arithmetic on its inputs: one
    process in float32 against float64 on the same float32 values (nearly exact) must be inside it."""
    p, x, w = eleven.make_block(22, 10, 40, np.float32, seed)
    bound = budget.entries(p, x, w, "float32", eleven.LN_EPS, eleven.GELU_C, eleven.GELU_K)
    z, dx, grads = eleven.reference(p, x, w)
    wide = eleven.reference({k: v.astype(np.float64) for k, v in p.items()}, x.astype(np.float64),
                            w.astype(np.float64))
    got, want = {"z": z, "dx": dx, **grads}, {"z": wide[0], "dx": wide[1], **wide[2]}
    assert set(bound) == set(got) and all(bound[k].shape == got[k].shape for k in got)
    assert max(tolerance.worst_ratio(got[k] - want[k], bound[k] / 2) for k in got) <= 1
    p, x, w = eleven.make_block(22, 10, 40, np.float64, seed)
    bound = budget.entries(p, x, w, "float64", eleven.LN_EPS, eleven.GELU_C, eleven.GELU_K)
    _, _, grads = eleven.reference(p, x, w)
    assert tolerance.worst_ratio(grads["dB"] * 1e-6, bound["dB"]) > 1   # one part in a million off


def graded(doc):
    """The worst of one run's budget ratios, over its ranks: each way's GRADED values, the library's
    ratios and, in --api torch runs, those of torch's own tensor parallel."""
    ways = [w[k] for rank in doc["ranks"] for w in rank["ways"] for k in eleven.GRADED]
    return max(ways + [w["ratio"] for rank in doc["ranks"]
                       for w in rank["library"] + rank.get("torch_api", [])])


def grade_runs(tmp_path, n, seeds, api="mpi4py"):
    assert worst_over_seeds(tmp_path, "11", n, seeds, graded, api=api) <= 1


@pytest.mark.slow  # 6 real runs: ~20 s of CPU on 2 cores
@pytest.mark.parametrize("n", [3, 5])
def test_correct_runs_stay_inside_the_budget_for_3_seeds(tmp_path, n):
    grade_runs(tmp_path, n, range(3))


@pytest.mark.sweep  # the check NPs x 20 seeds: minutes an NP; pytest -m sweep
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("n", check_nps("11"))
def test_correct_runs_stay_inside_the_budget_for_20_seeds(tmp_path, n):
    """The issue's bar (41): the NPs `bin/tutor check` runs (the YAML's np.check), 20 seeds each
    (float32 and float64 in turn)."""
    grade_runs(tmp_path, n, range(20))
