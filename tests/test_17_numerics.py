"""Lesson 17's pieces as pure functions, no MPI: the bfloat16 emulation, the oracle's formula against
hand-computed cases (common/tolerance.py), the reproducible sum's bitwise identity across splits, and
section 5's fingerprint, majority and plants. Then section 5 in real runs: each plant named on both
APIs, on rank 0 and the last rank, a clean run naming nothing, a flag out of range refused."""
import math
import random

import numpy as np
import pytest

from common import bootstrap, shards, tolerance
from common.runner import catalog, lesson_run, verdict
from conftest import torch_marks
from lessons.numerics import bf16, orders, silent, tree, wire

seventeen = bootstrap.lesson_module("17")
U32, U16 = 2.0 ** -24, 2.0 ** -8


def f32(bits):
    return np.array([bits], np.uint32).view(np.float32)


# ---------------------------------------------------------------- bfloat16 on NumPy
@pytest.mark.parametrize("bits, want", [
    (0x3F800000, 0x3F80),   # 1.0: exact
    (0x3F808000, 0x3F80),   # 1 + 2**-8: a tie, to the even neighbour (down)
    (0x3F818000, 0x3F82),   # 1 + 3 * 2**-8: a tie, to the even neighbour (up)
    (0x3F808001, 0x3F81),   # just above the tie: up
    (0x3F807FFF, 0x3F80),   # just below: down
    (0xBF818000, 0xBF82),   # the sign rides along
    (0x7F800000, 0x7F80),   # infinity stays infinity
    (0x7F7FFFFF, 0x7F80),   # the largest float32 rounds up to infinity, as round-to-nearest does
])
def test_bf16_rounds_to_nearest_even(bits, want):
    assert int(bf16.encode(f32(bits))[0]) == want


def test_bf16_nan_stays_nan_and_decode_is_exact():
    assert np.isnan(bf16.decode(bf16.encode(np.array([np.nan], np.float32))))[0]
    bits = np.arange(0, 0x7F80, 7, dtype=np.uint16)  # finite positives, every 7th pattern
    assert np.array_equal(bf16.encode(bf16.decode(bits)), bits)


def test_bf16_is_the_nearest_of_its_two_neighbours():
    x = np.random.default_rng(0).standard_normal(20000).astype(np.float32)
    got = bf16.decode(bf16.encode(x)).astype(np.float64)
    down = bf16.decode((x.view(np.uint32) >> 16).astype(np.uint16)).astype(np.float64)  # toward zero
    up = bf16.decode(((x.view(np.uint32) >> 16) + 1).astype(np.uint16)).astype(np.float64)
    x64 = x.astype(np.float64)
    assert np.all(np.abs(got - x64) <= np.minimum(np.abs(down - x64), np.abs(up - x64)))
    assert np.all(np.abs(got - x64) <= U16 * np.abs(x64))  # within the unit roundoff the oracle uses


def test_bf16_add_rounds_once_per_add():
    a, b = bf16.encode(np.float32([1.0])), bf16.encode(np.float32([2.0 ** -9]))  # half of half an ulp
    bf16.add(a, b)
    assert bf16.decode(a)[0] == 1.0  # lost: below half an ulp of 1 in bf16


# ---------------------------------------------------------------- the oracle, by hand
@pytest.mark.parametrize("n, algorithm, k", [(1, "ring", 0), (2, "ring", 1), (5, "ring", 4), (1, "tree", 0),
                                             (2, "tree", 1), (5, "tree", 3), (8, "tree", 3), (9, "tree", 4)])
def test_depth(n, algorithm, k):
    assert tolerance.depth(n, algorithm) == k


def test_budget_by_hand():
    assert tolerance.gamma(3, U32) == pytest.approx(3 * U32 / (1 - 3 * U32), rel=1e-15)
    assert tolerance.budget("float32", 4, "ring", 10.0) == pytest.approx(10 * 3 * U32 / (1 - 3 * U32), rel=1e-15)
    assert tolerance.budget("float32", 4, "tree", 10.0) == pytest.approx(10 * 2 * U32 / (1 - 2 * U32), rel=1e-15)
    g = 2 * U32 / (1 - 2 * U32)  # 3 values, fp32 adds, one rounding to bf16
    assert tolerance.budget("bfloat16", 3, "ring", 1.0, accumulate="float32") == pytest.approx(g + U16 * (1 + g))
    b = 2 * U32 / (1 - 2 * U32) * 6.0
    assert tolerance.mean_budget("float32", 3, "ring", 6.0, 3) == pytest.approx((b + U32 * (6.0 + b)) / 3)
    assert tolerance.budget("float16", 1, "ring", 5.0) == 0  # nothing added: nothing rounds
    assert math.isinf(tolerance.gamma(256, U16))  # k*u >= 1: no bound at all


def test_budget_refuses_what_it_does_not_know():
    with pytest.raises(ValueError, match="unit roundoff"):
        tolerance.budget("int8", 4, "ring", 1.0)
    with pytest.raises(ValueError, match="algorithm"):
        tolerance.depth(4, "butterfly")


@pytest.mark.parametrize("dtype", wire.DTYPES)
@pytest.mark.parametrize("n", [2, 3, 7])
def test_budget_holds_a_chain_and_not_a_missing_term(dtype, n):
    every = [bf16.round_to(np.random.default_rng(s).standard_normal(4096), dtype) for s in range(n)]
    exact, abs_sum = np.sum(every, axis=0), np.sum(np.abs(every), axis=0)
    budget = tolerance.budget(dtype, n, "ring", abs_sum)
    chain = orders.candidates(every, dtype)["rank order 0,1,..,N-1, each add rounded"]
    assert np.all(np.abs(chain - exact) <= budget)
    assert np.mean(np.abs(np.sum(every[1:], axis=0) - exact) > budget) > 0.9  # one rank left out


def test_parity_by_hand_and_worst_ratio():
    g = 4 * U32 / (1 - 4 * U32)
    assert tolerance.parity("float32", 4, 3.0) == pytest.approx(2 * g * 3.0, rel=1e-15)
    g64 = 4 * 2.0 ** -53 / (1 - 4 * 2.0 ** -53)
    assert tolerance.parity("bfloat16", 4, 1.0, accumulate="float64") == pytest.approx(2 * (g64 + U16 * (1 + g64)))
    assert tolerance.parity("float64", 0, 5.0) == 0  # nothing rounds: two runs must agree exactly
    with pytest.raises(ValueError, match="k must be"):
        tolerance.parity("float32", -1, 1.0)
    assert tolerance.worst_ratio([0.0, 1.0, -3.0], [0.0, 2.0, 2.0]) == 1.5
    assert tolerance.worst_ratio([0.0, 0.0], [0.0, 1.0]) == 0.0      # 0/0 inside: nothing differed
    assert math.isinf(tolerance.worst_ratio([1e-300], [0.0]))        # a difference where none may be
    assert tolerance.worst_ratio([], []) == 0.0


@pytest.mark.parametrize("m", [2, 7, 130])
def test_parity_holds_two_orders_of_a_dot_product_and_not_a_dropped_term(m):
    """A dot product of length m in two orders (forward, and pairwise by NumPy) in float32: inside
    2 gamma_m * sum|a_i b_i|; the same with one product left out falls outside on most entries."""
    rng = np.random.default_rng(m)
    a, b = rng.standard_normal((4096, m)).astype(np.float32), rng.standard_normal((4096, m)).astype(np.float32)
    prods = a * b                                                # each product rounded once: part of k = m
    chain = np.zeros(4096, np.float32)
    for i in range(m):
        chain = chain + prods[:, i]
    pairwise = np.sum(prods[:, ::-1], axis=1, dtype=np.float32)
    bound = tolerance.parity("float32", m, np.sum(np.abs(a.astype(np.float64) * b), axis=1))
    assert tolerance.worst_ratio(chain - pairwise, bound) <= 1
    assert np.mean(np.abs(chain - prods[:, 1:].sum(axis=1)) > bound) > 0.9


# ---------------------------------------------------------------- the reproducible sum
@pytest.mark.parametrize("m", [1, 2, 5, 12, 17])
def test_owned_nodes_cover_every_contribution_once(m):
    for n in range(1, 9):
        covered = sorted(j for lo, hi in shards.chunk_bounds(m, n) for a, b in tree.owned(m, lo, hi)
                         for j in range(a, b))
        assert covered == list(range(m)), (m, n)


@pytest.mark.parametrize("m", [3, 12, 17])
def test_the_tree_sum_is_bitwise_the_same_at_every_split(m):
    world = [np.random.default_rng(100 + j).standard_normal(2048).astype(np.float32) for j in range(m)]
    want = tree.one_process(world)
    for n in range(1, 9):
        known = {}
        for lo, hi in shards.chunk_bounds(m, n):  # each "rank" sums its own nodes
            mine = {j: world[j] for j in range(lo, hi)}
            known.update({(a, b): tree.node_sum(mine, a, b) for a, b in tree.owned(m, lo, hi)})
        assert np.array_equal(tree.finish(known, m).view(np.uint32), want.view(np.uint32)), n
    chain = np.zeros(2048, np.float32)
    for x in world:
        chain = chain + x
    assert m <= 3 or not np.array_equal(chain, want)  # telling: past 3 values, a chain is another order


def test_the_tree_is_log_deep():
    def deepest(a, b):
        return 0 if b - a == 1 else 1 + max(deepest(a, tree.split(a, b)), deepest(tree.split(a, b), b))
    assert [deepest(0, m) for m in (1, 2, 3, 8, 9, 12)] == [tolerance.depth(m, "tree") for m in (1, 2, 3, 8, 9, 12)]


def test_accumulate_rounds_once():
    host = wire.host("bfloat16")
    every = [bf16.round_to(np.random.default_rng(s).standard_normal(4096), "bfloat16") for s in range(5)]
    got = host.get(seventeen.accumulate([host.put(x) for x in every], host))
    assert np.array_equal(got, bf16.round_to(np.sum(np.array(every, np.float32), axis=0, dtype=np.float32),
                                             "bfloat16"))


# ---------------------------------------------------------------- section 5: fingerprints, by hand
def tensor(seed=5, shape=(7, 3)):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def planted(values, kind):
    """A copy of values with section 5's plant of that kind made (its element positions, its bit)."""
    plant = next(p for p in silent.plants(1, 1, rank=0) if p["kind"] == kind)
    out = values.copy()
    silent.apply(out, plant)
    return out


@pytest.mark.parametrize("kind", ["flip", "swap"])
def test_the_fingerprint_sees_a_flipped_bit_and_a_swap_and_not_a_copy(kind):
    x = tensor()
    assert seventeen.fingerprint(x.copy()) == seventeen.fingerprint(x)
    assert seventeen.fingerprint(planted(x, kind)) != seventeen.fingerprint(x)


def test_the_flip_changes_one_bit_and_the_swap_moves_two_words():
    x = tensor()
    diff = x.view(np.uint32) ^ planted(x, "flip").view(np.uint32)
    name, i, bit = silent.FLIP
    assert np.count_nonzero(diff) == 1 and diff.reshape(-1)[i] == 1 << bit
    got = planted(x, "swap").reshape(-1)
    _, i, j = silent.SWAP
    assert (got[i], got[j]) == (x.reshape(-1)[j], x.reshape(-1)[i]) and sorted(got) == sorted(x.reshape(-1))
    with pytest.raises(AssertionError, match="two equal values"):  # a no-op is not a plant
        silent.apply(np.ones(7, np.float32), {"kind": "swap", "elements": [0, 1]})


def test_an_xor_of_the_words_and_a_float_sum_miss_the_swap_and_sha256_does_not():
    for seed in range(20):
        x = tensor(seed, (7,))
        y = planted(x, "swap")
        assert silent.xor_words(y) == silent.xor_words(x)
        assert np.sum(y, dtype=np.float32) == np.sum(x, dtype=np.float32)  # a0 + a1 == a1 + a0
        assert silent.xor_words(planted(x, "flip")) != silent.xor_words(x)
    shown = silent.hashes({"w2": tensor(), "b1": tensor(1, (7,))}, seventeen.fingerprint)
    assert shown["swap"]["xor"][0] == shown["swap"]["xor"][1]
    assert shown["swap"]["fingerprint"][0] != shown["swap"]["fingerprint"][1]
    assert all(shown["flip"][h][0] != shown["flip"][h][1] for h in ("xor", "sum", "fingerprint"))


def prints(*per_rank):
    """[{"w1": a, "b1": b}] per rank from "ab" strings: each letter one tensor's print."""
    return [{"w1": p[0], "b1": p[1]} for p in per_rank]


@pytest.mark.parametrize("given, want", [
    (prints("aa", "aa", "aa"), None),                     # all alike: nothing named
    (prints("aa"), None),                                 # one rank: nothing to compare
    (prints("ax", "aa", "aa"), ("b1", [0])),              # rank 0 is the odd one: the majority says so
    (prints("aa", "aa", "aa", "xa"), ("w1", [3])),        # the last rank
    (prints("ax", "ay", "ax", "ax"), ("b1", [1])),
    (prints("xy", "aa", "aa"), ("w1", [0])),              # the first tensor that differs, in names' order
    (prints("ax", "aa"), ("b1", [0, 1])),                 # two replicas: no majority, both suspects
    (prints("xa", "xa", "aa", "aa"), ("w1", [0, 1, 2, 3])),  # 2 against 2: no strict majority
    (prints("xa", "ya", "aa"), ("w1", [0, 1, 2])),        # three prints, each alone
])
def test_suspects_are_the_ranks_outside_a_strict_majority(given, want):
    assert seventeen.suspects(given, ["w1", "b1"]) == want


def test_named_takes_the_first_disagreement_and_names_one_rank_only():
    assert silent.named([]) == {"named_rank": -1, "named_tensor": "none", "named_step": -1, "suspects": [],
                                "steps_off": 0}
    got = silent.named([(2, "w2", [3]), (3, "w2", [3]), (4, "b1", [3])])
    assert (got["named_rank"], got["named_tensor"], got["named_step"], got["steps_off"]) == (3, "w2", 2, 3)
    assert silent.named([(0, "b1", [0, 1])])["named_rank"] == -1  # a tie blames no one


def test_on_paper_counts_the_suspects_of_a_two_against_two_split():
    assert silent.on_paper(seventeen.suspects) == 4
    assert silent.on_paper(lambda prints, names: ("w1", [2, 3])) == 2  # the last two blamed: a wrong answer
    assert silent.on_paper(lambda prints, names: None) == 0


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_the_default_plants_go_on_rank_0_first_and_the_last_rank_last_at_the_edge_steps(n):
    got = silent.plants(n, 5)
    assert [(p["kind"], p["planted_on"], p["step"]) for p in got] == [
        ("flip", 0, 0), ("swap", 0, 0), ("flip", n - 1, 4), ("swap", n - 1, 4)]
    assert len({p["plant"] for p in got}) == 4  # the label names each plant in the checks table
    assert [p["tensor"] for p in got] == ["w2", "b1", "w2", "b1"]  # never the first tensor, w1
    assert [(p["planted_on"], p["step"]) for p in silent.plants(n, 5, rank=n - 1)] == [(n - 1, 2)] * 2
    assert [(p["planted_on"], p["step"]) for p in silent.plants(n, 5, step=3)] == [(0, 3), (0, 3), (n - 1, 3),
                                                                                  (n - 1, 3)]


# ---------------------------------------------------------------- section 5, real runs
LIMIT = 180  # seconds: the five sections at --count 1024 take a few on an idle machine
SMALL = ["--count", "1024", "--contributions", "5"]
APIS = [pytest.param(a, marks=torch_marks("17_numerics", a)) for a in ("mpi4py", "torch")]


def run(n, api, *args):
    lesson = catalog.resolve("17")
    outcome, checks = lesson_run.run_lesson(lesson, n, api, "cpu", [*SMALL, *args], echo=False, timeout=LIMIT)
    said = "\n".join(outcome.tail[-30:] + verdict.explain(lesson, outcome, checks))
    return outcome, checks, said


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("n, R", [(3, 0), (4, 3)])
def test_a_planted_flip_is_named_rank_tensor_and_step_and_a_clean_run_names_nothing(n, R, api):
    S = random.randrange(5)
    outcome, checks, said = run(n, api, "--flip-rank", R, "--flip-step", S)
    where = f"--flip-rank {R} --flip-step {S}, np {n}, {api}"
    assert verdict.status(outcome, checks) == "pass", f"{where}:\n{said}"
    for mine in outcome.results["ranks"]:
        got = mine["silent"]
        assert got["clean_named"] == 0, f"{where}: the clean run named something"
        assert [(p["kind"], p["named_rank"], p["named_tensor"], p["named_step"]) for p in got["plants"]] == \
            [("flip", R, "w2", S), ("swap", R, "b1", S)], where
    assert f"flipped on rank {R} after step {S}" in said


@pytest.mark.parametrize("api", APIS)
def test_at_np_2_both_replicas_are_suspects_and_no_rank_is_blamed(api):
    outcome, checks, said = run(2, api)
    assert verdict.status(outcome, checks) == "pass", said
    plants = outcome.results["ranks"][0]["silent"]["plants"]
    assert [(p["suspects"], p["named_rank"]) for p in plants] == [([0, 1], -1)] * 4
    assert "cannot say which is wrong" in said


@pytest.mark.parametrize("args, says", [(["--flip-rank", "3"], "--flip-rank 3: a rank from 0 to 2"),
                                        (["--flip-step", "5"], "--flip-step 5: a step from 0 to 4")])
def test_a_flag_out_of_range_is_one_line_and_a_failed_run(args, says):
    outcome, checks, said = run(3, "mpi4py", *args)
    assert outcome.rc != 0 and checks is None, said
    assert says in said, said
