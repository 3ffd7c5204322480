"""Lesson 13 — ring attention (context parallelism): keys and values travel, softmax streams.

The idea: a sequence too long for one device is split over N ranks by tokens. Each rank keeps its
queries; the keys and values (one block of rows per rank, k and v side by side) go round the ring: at
every step a rank STARTS sending the block it holds to rank+1 and receiving the next from rank-1
(p2p's start: Isend/Irecv, ncclSend/ncclRecv on a stream of their own, batch_isend_irecv), computes
attention of its queries against the block it holds while that transfer is in flight, then waits.
After N-1 transfers every query has met every key; a rank sent (N-1)/N of them (equal blocks).
  online softmax   keys come a block at a time, so each query row keeps a running max m, a running
                   sum l of exp(s - m) and an output o = sum exp(s - m) v; when a block raises the max
                   to m', l and o are rescaled by exp(m - m') first; at the end out = o / l. Lesson
                   04's stable softmax, streamed: every exponent stays <= 0, so nothing overflows.
  causal masking   query i sees keys 0..i. A tile (a chunk of queries against a chunk of keys) with
                   every key before every query is computed whole; every key after: skipped; both:
                   computed, then the keys after each query masked to -inf.
  load imbalance   split contiguously, the last rank computes N blocks, rank 0 one, and every step
                   waits for the busiest. Zig-zag cuts 2N chunks and gives rank r chunks r and 2N-1-r.
  (Ring Attention, Liu et al. 2023; FlashAttention keeps the same running max and sum on one GPU.)

What to watch for: 1. the split (1001 tokens: blocks differ by a row at 3 and 4 ranks); 2. no mask:
every rank's rows against one process, bytes sent, the order (s c w: start, compute, wait: the graded
overlap), and how much of the transfers the clock says the overlap hid; 3. causal: q.k products
computed, kept and skipped, contiguous vs zig-zag; 4. large logits: a naive exp(s) / sum exp(s)
overflows, the online softmax does not; 5. --api torch: torch's scaled_dot_product_attention too.

Run it:
  make lesson-13 NP=4                    (API=torch; ARGS="--seq 4099 --dim 32 --dtype float32")
  .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py lessons/13_ring_attention.py --api mpi4py
Next: lesson 14 finds which rank a hung job waits for.
"""
import math
import os
import sys

import numpy as np  # the runner gives each rank one BLAS thread: threads spin, 4x as long at NP 4 on 2 cores

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import bootstrap, buffers, counting, p2p, report, shards, timing, tolerance  # noqa: E402
from lessons.ring_attention import budget, show  # noqa: E402
from lessons.ring_attention.order import Order  # noqa: E402

SEED = 13                 # q, k and v of the whole sequence come from this seed, the same on every rank
SEQ = 1001                # tokens: 1001 % 3, % 4, % 6 and % 8 are not 0: uneven blocks and chunks
DIM = 64                  # head dimension d; scores are q.k / sqrt(d)
LOGIT_SCALE = 1000.0      # section 4: q times this, so scores reach thousands
REPS = 3                  # the clock: best of this many
DTYPES = ("float32", "float64")  # graded against common/tolerance.py's budget (lessons/ring_attention/budget.py)


# ---------------------------------------------------------------- the split
def split_chunks(seq, n, split):
    """Each rank's token ranges [(lo, hi), ...] (global positions), in the order its rows are kept."""
    if split == "contiguous":
        return [[bounds] for bounds in shards.chunk_bounds(seq, n)]
    # >>> exercise: zigzag
    chunks = shards.chunk_bounds(seq, 2 * n)  # 2N chunks; rank r takes one from each end
    return [[chunks[r], chunks[2 * n - 1 - r]] for r in range(n)]
    # <<< exercise: zigzag


def positions(chunks):
    """The global positions of a rank's rows, in order."""
    return np.concatenate([np.arange(lo, hi) for lo, hi in chunks]).astype(np.int64)


def make_qkv(seq, dim, dtype, seed=SEED):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((seq, dim)).astype(dtype) for _ in "qkv"]


# ---------------------------------------------------------------- one process, the reference
def full_attention(q, k, v, rows, causal):
    """Rows `rows` of softmax(q k^T / sqrt(d)) v over the whole sequence, in float64, one process:
    every score at once, the max subtracted per row (the stable softmax of lesson 04)."""
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    s = q[rows] @ k.T / math.sqrt(q.shape[1])
    if causal:
        s = np.where(rows[:, None] >= np.arange(len(k))[None, :], s, -np.inf)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p / p.sum(axis=1, keepdims=True)) @ v


def naive_attention(q, k, v, rows):
    """exp(s) / sum exp(s), no max subtracted: right on paper, nan once a score passes ln(max float)."""
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(q[rows] @ k.T / np.asarray(math.sqrt(q.shape[1]), q.dtype))
        return (e / e.sum(axis=1, keepdims=True)) @ v


# ---------------------------------------------------------------- attention, one tile at a time
def tile(a0, a1, b0, b1, causal):
    """How queries a0..a1-1 see keys b0..b1-1 (global positions): 'full' (every key at or before
    every query), 'masked' (every key after every query: skipped), 'diagonal' (computed, then the
    keys after each query masked), or 'empty' (no rows or no keys)."""
    if a0 == a1 or b0 == b1:
        return "empty"
    # >>> exercise: tile
    if not causal or b1 - 1 <= a0:  # the last key is not after the first query
        return "full"
    if b0 > a1 - 1:                 # the first key is after the last query
        return "masked"
    return "diagonal"
    # <<< exercise: tile


def visible(a0, a1, b0, b1):
    """How many of the tile's (query, key) pairs have key <= query: the useful products."""
    return sum(min(max(i - b0 + 1, 0), b1 - b0) for i in range(a0, a1))


def online_softmax(xp, state, rows, s, v):
    """Fold one tile's scores s (the rows' queries x the tile's keys) and its values v into those rows'
    running max m, running sum l and output o. xp-free: NumPy, CuPy and torch alike."""
    m, l, o = state
    # >>> exercise: online_softmax
    m_new = xp.maximum(m[rows], xp.amax(s, -1))  # the max over every key seen so far
    fix = xp.exp(m[rows] - m_new)                # old terms were exp(s - m): make them exp(s - m_new)
    p = xp.exp(s - m_new[:, None])               # every exponent <= 0: nothing overflows
    l[rows] = fix * l[rows] + p.sum(-1)
    o[rows] = fix[:, None] * o[rows] + p @ v
    m[rows] = m_new
    # <<< exercise: online_softmax


def attend(xp, state, q, block, q_chunks, kv_chunks, q_pos, kv_pos, causal, work):
    """Fold one block of keys | values into my query rows' state, tile by tile; count the work."""
    d, scale = q.shape[1], 1 / math.sqrt(q.shape[1])
    assert block.shape[0] == kv_pos.shape[0], (
        f"a block of {block.shape[0]} rows computed as one of {kv_pos.shape[0]}: not the block this step "
        "holds")
    top = 0
    for a0, a1 in q_chunks:
        rows, left = slice(top, top + a1 - a0), 0
        for b0, b1 in kv_chunks:
            cols, kind = slice(left, left + b1 - b0), tile(a0, a1, b0, b1, causal)
            left += b1 - b0
            if kind == "masked":
                work["skipped"] += 1  # never computed: its keys all come after its queries
            if kind in ("masked", "empty"):
                continue
            s = (q[rows] @ block[cols, :d].T) * scale
            if kind == "diagonal":  # global positions: mask the keys after each query
                s = xp.where(q_pos[rows][:, None] >= kv_pos[cols][None, :], s, float("-inf"))
            online_softmax(xp, state, rows, s, block[cols, d:])
            work["tiles"] += 1
            work["computed"] += (a1 - a0) * (b1 - b0)
            work["useful"] += visible(a0, a1, b0, b1) if kind == "diagonal" else (a1 - a0) * (b1 - b0)
        top += a1 - a0


# ---------------------------------------------------------------- the ring
def ring_pass(be, kv, sizes, bufs, rank, n, fold):
    """Every rank's block of keys | values passes through this rank once: fold(block, source) runs on
    each, mine first, while the next block is already on its way. N-1 transfers, each to rank+1."""
    right, left = (rank + 1) % n, (rank - 1) % n
    held = kv
    # >>> exercise: ring
    for step in range(n):
        source = (rank - step) % n                   # the rank whose block I hold now
        if step < n - 1:                             # pass it on, and receive the next, in the background
            into = bufs[step % 2][:sizes[(source - 1) % n]]
            pending = be.start([(held, right)], [(into, left)])
        fold(held, source)                           # compute while the transfer is in flight
        if step < n - 1:
            pending.wait()                           # only now may held be overwritten and into be read
            held = into
    # <<< exercise: ring


class Attention:
    """My query rows' attention over every rank's block, on this API's arrays: the running state,
    the work counted, and fold(block, source) for ring_pass."""

    def __init__(self, ctx, xp, q, layout, causal, dtype):
        self.xp, self.q, self.layout, self.causal, self.rank = xp, q, layout, causal, ctx.rank
        rows = q.shape[0]
        self.state = [buffers.on_device(ctx, np.full(rows, -np.inf, dtype)),     # m
                      buffers.on_device(ctx, np.zeros(rows, dtype)),             # l
                      buffers.on_device(ctx, np.zeros((rows, q.shape[1]), dtype))]  # o
        self.pos = [buffers.on_device(ctx, positions(c)) for c in layout]
        self.work = {"tiles": 0, "skipped": 0, "computed": 0, "useful": 0}

    def fold(self, block, source):
        attend(self.xp, self.state, self.q, block, self.layout[self.rank], self.layout[source],
               self.pos[self.rank], self.pos[source], self.causal, self.work)

    def output(self):
        _, l, o = self.state
        return o / l[:, None]


def blocks_of(ctx, q, k, v, layout, rank):
    """My rows of q, and my block of keys | values side by side (one message per step), on the API."""
    rows = positions(layout[rank])
    return (buffers.on_device(ctx, np.ascontiguousarray(q[rows])),
            buffers.on_device(ctx, np.concatenate([k[rows], v[rows]], axis=1)))


def receive_buffers(ctx, layout, dim, dtype):
    """Two receive buffers as large as the largest block: one fills while the other is computed on."""
    most = max(len(positions(c)) for c in layout)
    return [buffers.empty(ctx, most * 2 * dim, dtype).reshape(most, 2 * dim) for _ in range(2)]


def run_ring(ctx, xp, be, q, k, v, layout, causal, phase):
    """One ring attention of my rows; (output on the host, work counted, bytes, transfers and the order
    of starts, computes and waits)."""
    n, rank = ctx.world_size, ctx.rank
    mine, kv = blocks_of(ctx, q, k, v, layout, rank)
    att = Attention(ctx, xp, mine, layout, causal, q.dtype)
    sizes = [len(positions(c)) for c in layout]
    order = Order(be, att.fold)
    with be.phase(phase):
        ring_pass(order, kv, sizes, receive_buffers(ctx, layout, q.shape[1], q.dtype), rank, n, order.fold)
    out = att.output()
    be.sync()  # gpu: the host reads the output next
    seen = be.counts.get(phase, {}).get("start", {"calls": 0, "bytes": 0, "msgs": 0, "peers": []})
    sent = {"bytes_sent": seen["bytes"], "transfers": seen["calls"], "msgs": seen["msgs"],
            "peers": seen["peers"], "order": "".join(order.seen), "clobbered": order.clobbered}
    return buffers.to_host(out).copy(), dict(att.work), sent


def graded(ctx, out, q, k, v, rows, causal):
    """My rows against one process: the largest |error|, and the worst entry's |error| / its budget."""
    want = full_attention(q, k, v, rows, causal)
    return {"err": float(np.abs(out - want).max()) if out.size else 0.0,
            "ratio": tolerance.worst_ratio(out - want, budget.entries(q, k, v, rows, causal, q.dtype, ctx.world_size))}


# ---------------------------------------------------------------- the clock
def quickest(ctx, reps, fn):
    """The quickest of `reps` timed runs of fn on this rank, each started together (a barrier): one
    function, so not common.timing.best_of, which interleaves several in batches."""
    sync, best = timing.syncer(ctx), float("inf")
    for _ in range(reps):
        ctx.comm.Barrier()
        t0 = timing.now(sync)
        fn()
        best = min(best, timing.now(sync) - t0)
    return best


def clock(ctx, xp, be, q, k, v, layout, causal, reps):
    """Seconds, this rank: the ring with overlap, its compute alone (every block made here, no
    transfer) and its transfers alone (no compute). What a transfer costs next to its compute depends
    on the machine: on the kit's 2 shared cores, NP 2 took 2.8 ms of transfers against 3.7 of compute,
    NP 4 11.1 against 10.1 in one run and 34.6 against 2.0 in the next (a transfer waits for a core)."""
    n, rank = ctx.world_size, ctx.rank
    mine, kv = blocks_of(ctx, q, k, v, layout, rank)
    sizes = [len(positions(c)) for c in layout]
    bufs = receive_buffers(ctx, layout, q.shape[1], q.dtype)
    every = [blocks_of(ctx, q, k, v, layout, r)[1] for r in range(n)]

    def compute_alone():
        att = Attention(ctx, xp, mine, layout, causal, q.dtype)
        for step in range(n):
            att.fold(every[(rank - step) % n], (rank - step) % n)
        att.output()

    def ring():  # the same compute, on the blocks as they arrive
        att = Attention(ctx, xp, mine, layout, causal, q.dtype)
        ring_pass(be, kv, sizes, bufs, rank, n, att.fold)
        att.output()
    return {"ring": quickest(ctx, reps, ring), "compute": quickest(ctx, reps, compute_alone),
            "transfers": quickest(ctx, reps, lambda: ring_pass(be, kv, sizes, bufs, rank, n,
                                                                lambda block, source: None))}


def logit_range(q, k, rows):
    s = q[rows].astype(np.float64) @ k.T.astype(np.float64) / math.sqrt(q.shape[1])
    return float(np.abs(s).max()) if s.size else 0.0


def sdpa(q, k, v, rows, causal):
    """torch's own attention on the whole sequence, one process: my rows of it."""
    import torch
    import torch.nn.functional as F
    t = [torch.from_numpy(a)[None, None] for a in (q, k, v)]
    return F.scaled_dot_product_attention(*t, is_causal=causal)[0, 0].numpy()[rows]


# ---------------------------------------------------------------- the sections
def layouts_of(seq, n):
    """Both splits, each checked to hold every token on exactly one rank."""
    layouts = {split: split_chunks(seq, n, split) for split in ("contiguous", "zigzag")}
    for split, layout in layouts.items():
        assert sorted(positions([c for chunks in layout for c in chunks])) == list(range(seq)), (
            f"the {split} split does not hold every token exactly once")
    return layouts


def no_mask(ctx, xp, be, raw, q, k, v, layout, args):
    """2. The ring without a mask against one process, what it sent and in what order; then the clock
    (raw: the uncounted backend). (my results, my output rows, rank 0's part of the summary)"""
    rank = ctx.rank
    out, _, sent = run_ring(ctx, xp, be, q, k, v, layout, False, "no mask")
    full = {**graded(ctx, out, q, k, v, positions(layout[rank]), False), **sent}
    rows = ctx.comm.gather((rank, full["err"], f"{full['ratio']:.2g}", sent["bytes_sent"], sent["transfers"],
                            sent["peers"]), root=0)
    orders = ctx.comm.gather(sent["order"], root=0)
    if rank == 0:
        show.full(ctx, rows, 2 * q.shape[0] * q.shape[1] * q.dtype.itemsize, args.dtype)
        show.order(orders, ctx.world_size)
    t = clock(ctx, xp, raw, q, k, v, layout, False, args.reps)
    every = ctx.comm.gather({**t, "reps": args.reps}, root=0)
    if rank:
        return full, out, {}
    lines, hidden = show.overlap_lines(ctx, every, timing.usable_cores())
    print("\n".join(lines), flush=True)
    return full, out, {"hidden": hidden, "ring_s": max(r["ring"] for r in every),
                       "compute_s": max(r["compute"] for r in every),
                       "transfers_s": max(r["transfers"] for r in every)}


def causal_splits(ctx, xp, be, raw, q, k, v, layouts, args):
    """3. The causal ring on each split against one process, the work each rank computed, and the clock.
    (my results per split, my output rows per split, rank 0's part of the summary)"""
    from mpi4py import MPI
    rank, causal, got, timings, ring_s, outs = ctx.rank, {}, {}, {}, {}, {}
    for split, layout in layouts.items():
        outs[split], work, sent = run_ring(ctx, xp, be, q, k, v, layout, True, f"causal {split}")
        causal[split] = {**graded(ctx, outs[split], q, k, v, positions(layout[rank]), True), **work, **sent}
        err = f"{causal[split]['ratio']:.2g}"  # the worst entry's |error| / its budget
        tc = clock(ctx, xp, raw, q, k, v, layout, True, args.reps)
        causal[split]["compute_s"] = tc["compute"]
        ring_s[split] = ctx.comm.allreduce(tc["ring"], op=MPI.MAX)  # the slowest rank's
        got[split] = ctx.comm.gather((rank, err, work["computed"], work["useful"], work["skipped"]), root=0)
        timings[split] = ctx.comm.gather(tc["compute"], root=0)
    if rank:
        return causal, outs, {}
    balance = show.causal(ctx, got, timings)
    totals = [sum(r[2] for r in got[split]) for split in layouts]
    busiest = {split: max(timings[split]) for split in layouts}
    print(end="".join(line + "\n" for line in show.causal_ring_lines(
        ctx, ring_s["contiguous"], ring_s["zigzag"], totals, timing.usable_cores(), busiest)), flush=True)
    return causal, outs, {"useful_totals": [sum(r[3] for r in got[split]) for split in layouts],
                          "ring_s": ring_s, "balance": balance}


def large_logits(ctx, xp, be, q, k, v, layout, args):
    """4. q scaled so scores reach thousands: the naive softmax overflows, the online one stays right."""
    dtype, mine = q.dtype, positions(layout[ctx.rank])
    big_q = (q * dtype.type(args.logit_scale)).astype(dtype)
    out, _, _ = run_ring(ctx, xp, be, big_q, k, v, layout, True, "large logits")
    large = {**graded(ctx, out, big_q, k, v, mine, True), "max_logit": logit_range(big_q, k, mine),
             "naive_nonfinite": int((~np.isfinite(naive_attention(big_q, k, v, mine))).any(axis=1).sum())}
    rows = ctx.comm.gather((ctx.rank, round(large["max_logit"], 1), large["naive_nonfinite"], len(mine),
                            large["err"], f"{large['ratio']:.2g}"), root=0)
    if ctx.rank == 0:
        show.large(rows, args)
    return large


def against_sdpa(ctx, q, k, v, layouts, outs):
    """5. The no-mask ring's rows (contiguous) and the causal zig-zag's against torch's own attention."""
    report.section(ctx, "5. torch's own scaled_dot_product_attention, whole sequence, one process")
    rank = ctx.rank
    twice = (str(q.dtype),) * 2  # both in the run's dtype: the ring's budget and sdpa's
    err = max(tolerance.worst_ratio(outs[split] - sdpa(q, k, v, rows, causal),
                                    budget.entries(q, k, v, rows, causal, q.dtype, ctx.world_size, twice))
              for split, causal, rows in (("full", False, positions(layouts["contiguous"][rank])),
                                          ("zigzag", True, positions(layouts["zigzag"][rank]))))
    rows = ctx.comm.gather((rank, f"{err:.2g}"), root=0)
    if rank == 0:
        show.sdpa(rows)
    return err


def flags():
    parser = bootstrap.lesson_parser(__file__, __doc__)
    parser.add_argument("--seq", type=bootstrap.positive(int), default=SEQ,
                        help=f"tokens in the sequence (default {SEQ})")
    parser.add_argument("--dim", type=bootstrap.positive(int), default=DIM,
                        help=f"head dimension d (default {DIM})")
    parser.add_argument("--dtype", choices=DTYPES, default="float64")
    parser.add_argument("--seed", type=int, default=SEED, help=f"q, k and v's seed (default {SEED})")
    parser.add_argument("--logit-scale", type=bootstrap.positive(float), default=LOGIT_SCALE,
                        help=f"section 4: q times this (default {LOGIT_SCALE:g})")
    parser.add_argument("--reps", type=bootstrap.positive(int), default=REPS,
                        help=f"the clock: best of this many (default {REPS})")
    return parser


def main():
    args, ctx = bootstrap.start(__file__, flags())
    n, dtype = ctx.world_size, np.dtype(args.dtype)
    xp = buffers.array_module(ctx)  # numpy, cupy or torch (one thread per rank)
    q, k, v = make_qkv(args.seq, args.dim, dtype, args.seed)         # the whole sequence, the same on every rank
    layouts = layouts_of(args.seq, n)                      # contiguous and zig-zag, every token once
    be = counting.Counted(p2p.backend(ctx), n)  # start: Isend+Irecv / ncclSend+Recv / batch_isend_irecv
    raw = p2p.backend(ctx)                                 # uncounted, for the clock

    report.section(ctx, f"1. the split: {args.seq} tokens, head dim {args.dim}, {n} rank(s), {args.dtype}, "
                        f"{ctx.api} ({ctx.transport})")
    if ctx.rank == 0:
        show.split(ctx, layouts)
    report.section(ctx, "2. ring attention, no mask: every query against every key")
    full, out_full, clocked = no_mask(ctx, xp, be, raw, q, k, v, layouts["contiguous"], args)
    report.section(ctx, "3. causal: query i sees keys 0..i; contiguous vs zig-zag split")
    causal, outs, balance = causal_splits(ctx, xp, be, raw, q, k, v, layouts, args)
    report.section(ctx, f"4. large logits: q times {args.logit_scale:g}, the causal ring on the zig-zag "
                        "split")
    large = large_logits(ctx, xp, be, q, k, v, layouts["zigzag"], args)
    row = {"full": full, "contiguous": causal["contiguous"], "zigzag": causal["zigzag"], "large": large,
           "comm": be.counts}
    if ctx.api == "torch":                                 # 5. torch's own attention, a second reference
        row["sdpa_ratio"] = against_sdpa(ctx, q, k, v, layouts, {"full": out_full, **outs})
    summary = {} if ctx.rank else {
        "useful_totals": balance["useful_totals"], "hidden": clocked["hidden"],
        "ring_s": {"no mask": clocked["ring_s"], **balance["ring_s"]}, "compute_s": clocked["compute_s"],
        "transfers_s": clocked["transfers_s"], **balance["balance"]}
    params = {"seq": args.seq, "dim": args.dim, "dtype": args.dtype, "itemsize": dtype.itemsize, "seed": args.seed,
              "logit_scale": args.logit_scale, "reps": args.reps}
    report.finish(ctx, row, summary=summary, params=params)


if __name__ == "__main__":
    main()
