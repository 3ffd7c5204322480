"""Lesson 13's pure pieces, without MPI: the online softmax streamed over tiles against one softmax of
every score, the causal tiles against a brute-force mask, and every rank's attention over every
block (the ring's work without the ring) against one process, with the work the YAML's closed forms
expect. The runs themselves are in test_lessons.py, the wrong answers in
tests/wrong_answers/13_ring_attention.yaml."""
import itertools
import math

import numpy as np
import pytest

from common import bootstrap, tolerance
from conftest import check_nps, worst_over_seeds
from lessons.ring_attention import budget, show

lesson = bootstrap.lesson_module("13")  # importing a lesson starts no MPI


def softmax_rows(s, v):
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return p / p.sum(axis=1, keepdims=True) @ v


@pytest.mark.parametrize("scale", [1.0, 1e4])
def test_the_online_softmax_streamed_over_tiles_is_one_softmax(scale):
    """Keys in uneven tiles, in an order that raises and lowers the running max; scores up to 1e5,
    where exp(s) alone overflows."""
    rng = np.random.default_rng(0)
    rows, keys, d = 5, 23, 3
    s, v = rng.standard_normal((rows, keys)) * scale, rng.standard_normal((keys, d))
    s[:, 7] += 10 * scale  # one key far above the others, met in the middle of the stream
    state = [np.full(rows, -np.inf), np.zeros(rows), np.zeros((rows, d))]
    for a, b in [(10, 23), (0, 4), (4, 10)]:
        lesson.online_softmax(np, state, slice(0, rows), s[:, a:b], v[a:b])
    _, l, o = state
    assert np.allclose(o / l[:, None], softmax_rows(s, v), rtol=0, atol=1e-12)
    with np.errstate(over="ignore", invalid="ignore"):
        naive = np.exp(s) / np.exp(s).sum(axis=1, keepdims=True) @ v
    assert scale == 1.0 or not np.isfinite(naive).all()  # the case the running max is for


@pytest.mark.parametrize("a0, a1", [(0, 4), (3, 7), (5, 6)])
def test_tiles_and_their_useful_products_agree_with_a_brute_force_mask(a0, a1):
    for b0, b1 in itertools.combinations(range(10), 2):
        seen = np.arange(a0, a1)[:, None] >= np.arange(b0, b1)[None, :]
        kind = lesson.tile(a0, a1, b0, b1, True)
        want = "full" if seen.all() else "masked" if not seen.any() else "diagonal"
        assert kind == want, (a0, a1, b0, b1)
        assert lesson.visible(a0, a1, b0, b1) == seen.sum()
        assert lesson.tile(a0, a1, b0, b1, False) == "full"
    assert lesson.tile(3, 3, 0, 5, True) == lesson.tile(0, 5, 2, 2, True) == "empty"


def chunk(c, parts, seq):
    """Chunk c of `parts` as the YAML writes it: seq//parts items, one more for the first seq%parts."""
    lo = c * (seq // parts) + min(c, seq % parts)
    return lo, lo + seq // parts + (1 if c < seq % parts else 0)


@pytest.mark.parametrize("seq", [1, 5, 29])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("split", ["contiguous", "zigzag"])
def test_every_block_folded_in_gives_causal_attention_and_the_work_of_the_closed_form(seq, n, split):
    """The ring's compute without the ring: each rank folds every rank's block, its own first."""
    d = 4
    q, k, v = lesson.make_qkv(seq, d, np.float64)
    layout = lesson.split_chunks(seq, n, split)
    assert sorted(lesson.positions([c for r in layout for c in r])) == list(range(seq))
    parts = n if split == "contiguous" else 2 * n
    for rank in range(n):
        mine = [chunk(rank, parts, seq)]
        if split == "zigzag":
            mine.append(chunk(2 * n - 1 - rank, parts, seq))
        assert layout[rank] == mine
        rows = lesson.positions(layout[rank])
        state = [np.full(len(rows), -np.inf), np.zeros(len(rows)), np.zeros((len(rows), d))]
        work = {"tiles": 0, "skipped": 0, "computed": 0, "useful": 0}
        pos = [lesson.positions(c) for c in layout]
        for step in range(n):
            src = (rank - step) % n
            block = np.concatenate([k[pos[src]], v[pos[src]]], axis=1)
            lesson.attend(np, state, q[rows], block, layout[rank], layout[src], pos[rank], pos[src], True,
                          work)
        if len(rows):
            _, l, o = state
            assert np.allclose(o / l[:, None], lesson.full_attention(q, k, v, rows, True), atol=1e-13)
        assert work["computed"] == sum((hi - lo) * hi for lo, hi in mine)  # every key up to its last token
        assert work["useful"] == sum(hi * (hi + 1) // 2 - lo * (lo + 1) // 2 for lo, hi in mine)


def folded(q, k, v, layout, rank, causal, dtype):
    """Rank `rank`'s rows by the ring's arithmetic in `dtype` (every block folded in, its own first)."""
    n, d = len(layout), q.shape[1]
    q, k, v = (a.astype(dtype) for a in (q, k, v))
    rows = lesson.positions(layout[rank])
    state = [np.full(len(rows), -np.inf, dtype), np.zeros(len(rows), dtype), np.zeros((len(rows), d), dtype)]
    work = {"tiles": 0, "skipped": 0, "computed": 0, "useful": 0}
    pos = [lesson.positions(c) for c in layout]
    for step in range(n):
        src = (rank - step) % n
        block = np.concatenate([k[pos[src]], v[pos[src]]], axis=1)
        lesson.attend(np, state, q[rows], block, layout[rank], layout[src], pos[rank], pos[src], causal, work)
    return rows, state[2] / state[1][:, None]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("n", range(1, 9))
def test_the_rings_arithmetic_stays_inside_the_budget_for_20_seeds(n, dtype):
    """The ring's compute at NP 1-8 (the transfers copy bits: they add no rounding), 20 seeds, both
    splits, causal or not, scores up to ~1e3: every entry inside budget.entries (the oracle's bound)."""
    seq, d, worst = 97, 16, 0.0
    for seed in range(20):
        q, k, v = lesson.make_qkv(seq, d, np.dtype(dtype), seed)
        if seed % 4 == 3:
            q = (q * np.dtype(dtype).type(300)).astype(dtype)  # large logits
        split, causal = ("contiguous", "zigzag")[seed % 2], seed % 3 != 0
        layout = lesson.split_chunks(seq, n, split)
        for rank in range(n):
            rows, out = folded(q, k, v, layout, rank, causal, dtype)
            bound = budget.entries(q, k, v, rows, causal, dtype, n)
            worst = max(worst, tolerance.worst_ratio(out - lesson.full_attention(q, k, v, rows, causal), bound))
    assert worst <= 1


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_budget_rejects_a_missing_rescale_and_a_dropped_key(dtype, monkeypatch):
    """Two wrong answers of the page: o not rescaled when the max grows; one key left out of a row."""
    q, k, v = lesson.make_qkv(97, 16, np.dtype(dtype), 5)
    layout = lesson.split_chunks(97, 3, "zigzag")
    rows, out = folded(q, k, v, layout, 1, True, dtype)
    bound = budget.entries(q, k, v, rows, True, dtype, 3)
    want = lesson.full_attention(q, k, v, rows, True)
    assert tolerance.worst_ratio(out - want, bound) <= 1
    keep = np.arange(97) != 40                                    # key 40 dropped from every row
    s = q[rows].astype(np.float64) @ k.T.astype(np.float64) / math.sqrt(16)
    s = np.where((rows[:, None] >= np.arange(97)[None, :]) & keep[None, :], s, -np.inf)
    short = softmax_rows(s, v.astype(np.float64))
    assert tolerance.worst_ratio(short - want, bound) > 10

    def no_rescale(xp, state, rows, s, v):
        m, l, o = state
        m_new = xp.maximum(m[rows], xp.amax(s, -1))
        p = xp.exp(s - m_new[:, None])
        l[rows] = xp.exp(m[rows] - m_new) * l[rows] + p.sum(-1)
        o[rows] = o[rows] + p @ v                                 # the wrong answer: o keeps the old max
        m[rows] = m_new
    monkeypatch.setattr(lesson, "online_softmax", no_rescale)
    _, bad = folded(q, k, v, layout, 1, True, dtype)
    assert tolerance.worst_ratio(bad - want, bound) > 10


def graded(doc):
    """The worst of one run's budget ratios, over its ranks: the ring without a mask, causal on each
    split, with large logits, and against torch's own attention (sdpa_ratio: --api torch runs only)."""
    return max([r[k]["ratio"] for r in doc["ranks"] for k in ("full", "contiguous", "zigzag", "large")]
               + [r["sdpa_ratio"] for r in doc["ranks"] if "sdpa_ratio" in r])


@pytest.mark.slow  # 6 real runs: ~60 s of CPU on 2 cores, over make test's share
@pytest.mark.parametrize("n", [3, 5])
def test_correct_runs_stay_inside_the_budget_for_3_seeds(tmp_path, n):
    """Real runs (small sizes, one timed rep): every check passes, the budget's included."""
    assert worst_over_seeds(tmp_path, "13", n, range(3), graded, timeout=120,
                            args=("--seq", "101", "--dim", "16", "--reps", "1")) <= 1


@pytest.mark.sweep  # the check NPs x 20 seeds: minutes; pytest -m sweep
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("n", check_nps("13"))
def test_correct_runs_stay_inside_the_budget_for_20_seeds(tmp_path, n):
    """The issue's bar (41): every NP `bin/tutor check` runs (the YAML's np.check), 20 seeds each
    (float32 and float64 in turn), the check's run (its YAML's --reps 1, the default sizes: 1001
    tokens, uneven blocks). --api mpi4py loads no torch, so no torch mark (and no sdpa_ratio)."""
    assert worst_over_seeds(tmp_path, "13", n, range(20), graded, args=("--reps", "1")) <= 1


def test_the_reference_is_one_softmax_of_every_score():
    q, k, v = lesson.make_qkv(6, 2, np.float64)
    rows = np.array([0, 3, 5])
    s = q[rows] @ k.T / math.sqrt(2)
    s[np.arange(6)[None, :] > rows[:, None]] = -np.inf
    assert np.allclose(lesson.full_attention(q, k, v, rows, True), softmax_rows(s, v), atol=1e-15)


@pytest.mark.parametrize("transport", ["mpi", "gloo", "nccl"])
@pytest.mark.parametrize("ring, compute, transfers, says", [
    (10.0, 9.9, 0.5, "too little next to the compute"),        # 5% of the ring: no reading
    (10.0, 9.5, 2.0, "75% of the transfer time ran while"),     # hidden (9.5 + 2 - 10) / 2
    (11.9, 10.0, 2.0, "little was hidden"),                     # hidden 0.05
    (11.3, 10.0, 2.0, "some of the transfer time was hidden"),  # hidden 0.35
])
def test_the_overlap_is_read_only_as_far_as_the_clock_goes(transport, ring, compute, transfers, says):
    ctx = type("Ctx", (), {"world_size": 4, "transport": transport})()
    times = [{"ring": ring / 1e3, "compute": compute / 1e3, "transfers": transfers / 1e3, "reps": 3}] * 4
    lines, hidden = show.overlap_lines(ctx, times, cores=2)
    text = "\n".join(lines)
    assert says in text and all(len(line) <= 100 for line in text.splitlines()), text
    assert ("progress thread" in text) == (transport == "mpi" and says == "little was hidden")
    assert ("share 2 cores" in text) == (says != "too little next to the compute")
    assert hidden == pytest.approx((compute + transfers - ring) / transfers)


@pytest.mark.parametrize("contig, zig, busiest_c, busiest_z, says", [
    (30.0, 20.0, 12.0, 6.0, "each step waits for the busiest rank"),         # the compute agrees
    (30.0, 20.0, 6.0, 6.5, "does not show the load balance"),  # the ring alone
    (20.0, 20.0, 12.0, 6.0, "about the same"),
])
def test_the_load_balance_reason_needs_the_busiest_ranks_compute_to_agree(contig, zig, busiest_c, busiest_z,
                                                                          says):
    ctx = type("Ctx", (), {"world_size": 4})()
    lines = show.causal_ring_lines(ctx, contig / 1e3, zig / 1e3, (100, 60), 2,
                                   {"contiguous": busiest_c / 1e3, "zigzag": busiest_z / 1e3})
    text = "\n".join(lines)
    assert says in text and all(len(line) <= 100 for line in text.splitlines()), text
    assert ("each step waits for the busiest rank" in text) == (busiest_c >= 1.2 * busiest_z and contig >= 1.2 * zig)


class Loopback:
    """A one-rank stand-in for p2p's backend: start() copies each send into the receive at wait()."""

    def start(self, sends, recvs):
        class Handle:
            def wait(self):
                for (out, _), (into, _) in zip(sends, recvs):
                    into[...] = out
        return Handle()


@pytest.mark.parametrize("one_buffer", [False, True])
def test_the_order_counts_a_receive_landing_in_a_block_in_use(one_buffer):
    """ring_pass with its two receive buffers taking turns clobbers nothing; the same buffer twice (a
    learner's `bufs[0]`, or `step % 1`) receives the next block into the one being sent and computed on."""
    from lessons.ring_attention.order import Order
    n, rows = 4, 5
    kv = np.arange(rows * 2.0).reshape(rows, 2)
    two = [np.zeros((rows, 2)) for _ in range(2)]
    seen = []
    order = Order(Loopback(), lambda block, source: seen.append(source))
    lesson.ring_pass(order, kv, [rows] * n, [two[0], two[0]] if one_buffer else two, 1, n, order.fold)
    assert "".join(order.seen) == "scw" * (n - 1) + "c" and seen == [1, 0, 3, 2]
    assert order.clobbered == (2 * (n - 2) if one_buffer else 0)  # steps 1, 2: its send and its compute
