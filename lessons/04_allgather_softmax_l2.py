"""Lesson 04 — all-gather, and two all-reduces ML runs on sharded vectors: softmax and the L2 norm.

The idea:
  * softmax of a vector sharded across ranks (a vocabulary-parallel output layer: each GPU holds the
    logits of its slice of the vocabulary) hands the all-reduces only two scalars per rank: a MAX
    all-reduce of the local maxima, then a SUM all-reduce of the local sums of exp(x - max). The naive
    exp(x)/sum exp(x) overflows once a logit passes ln(max float32) = 88.72; subtracting the global
    max makes every exponent <= 0, so nothing overflows;
  * the L2 norm of a sharded gradient: a SUM all-reduce of local sums of squares, then a square root;
    every rank gets the same norm and so the same clip factor. In float32 a square overflows above
    1.8e19, is subnormal below 1.1e-19 and rounds to 0 below about 2.6e-23; dividing by the global
    max |g| first (one more scalar MAX all-reduce) keeps every square in [0, 1];
  * all-gather: every rank contributes a piece and every rank ends with all pieces, in rank order
    (broadcast spreads ONE rank's data; gather collects all on ONE rank). Uneven pieces: agree on the
    sizes first, then MPI's Allgatherv places them; torch and NCCL pad to the largest and trim;
  * contrast: an element-wise softmax ACROSS ranks (position i normalised over the N ranks' values at
    i) is a different operation: full-length vectors are all-reduced.

What to watch for: the all-gathered arrays (identical everywhere), the softmax error against a
float64 single-process reference, the naive softmax turning into nan, the norm table across
magnitudes (naive: 0, imprecise or inf away from 1), one clip factor on every rank. With 1 rank the
all-reduces return their input, and the element-wise softmax across one rank is 1 everywhere.

Run it:
  make lesson-04 NP=4                       (or API=torch, ARGS="--scale 1e30 --vocab 50000")
  .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py lessons/04_allgather_softmax_l2.py --api mpi4py
Read next: lesson 05 (the ring all-reduce by hand). What it prints: allgather_softmax_l2/show.py.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import numpy as np  # noqa: E402

from common import bootstrap, buffers, report, text  # noqa: E402
from common.shards import chunk_bounds  # noqa: E402
from lessons.allgather_softmax_l2 import show  # noqa: E402

PIECE = 3           # items each rank contributes to the equal all-gather
COUNT = 10          # items in the uneven all-gather (10 over 4 ranks: 3, 3, 2, 2)
VOCAB = 32000       # length of the sharded logit / gradient vectors
SCALE = 1000.0      # logits are uniform in [-scale, 0.99*scale]; the one at vocab//2 is +scale
MAX_NORM = 1.0      # gradient clipping threshold, as in clip_grad_norm_(params, max_norm)
MAGNITUDES = (0.0, 1e-30, 1e-22, 1.0, 1e30)  # all zero; squares round to 0, subnormal, normal, inf
SEED = 4            # every rank draws the same full logit vector, then keeps its shard
SHOWN = 12          # a list of up to this many items prints whole; a longer one is shortened
HANDED = [0]        # bytes this rank has handed to collectives so far (what it asked them to move)


def allreduce(ctx, a, op):
    """Element-wise MAX or SUM of NumPy array `a` over all ranks; every rank gets the result."""
    buf = buffers.on_device(ctx, a.copy())
    HANDED[0] += a.nbytes
    if ctx.api == "torch":
        import torch.distributed as dist
        dist.all_reduce(buf, op={"max": dist.ReduceOp.MAX, "sum": dist.ReduceOp.SUM}[op])
    elif ctx.device == "gpu":
        import cupy
        from cupy.cuda import nccl
        stream = cupy.cuda.get_current_stream()
        ctx.nccl.allReduce(buf.data.ptr, buf.data.ptr, buf.size, buffers.nccl_dtype(buf),
                           {"max": nccl.NCCL_MAX, "sum": nccl.NCCL_SUM}[op], stream.ptr)
        stream.synchronize()  # nccl is asynchronous: wait before the host reads buf
    else:
        from mpi4py import MPI
        ctx.comm.Allreduce(MPI.IN_PLACE, buf, op={"max": MPI.MAX, "sum": MPI.SUM}[op])
    return buffers.to_host(buf)


def distributed_softmax(ctx, x):
    """Softmax of the whole sharded vector; `x` is my shard, the result my shard of it."""
    # >>> exercise: softmax
    local_max = np.max(x, initial=-np.inf).astype(x.dtype)  # an empty shard must not win the MAX
    m = allreduce(ctx, np.array([local_max], x.dtype), "max")[0]
    with np.errstate(over="ignore"):  # x - m may round to -inf near float32's limit: exp gives 0, right
        e = np.exp(x - m)  # every exponent <= 0: nothing can overflow
    s = allreduce(ctx, np.array([e.sum()], x.dtype), "sum")[0]
    return e / s
    # <<< exercise: softmax


def naive_softmax(ctx, x):
    """exp(x) / (sum of exp(x) over all ranks): right on paper, inf/nan for large logits."""
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(x)
        return e / allreduce(ctx, np.array([e.sum()], x.dtype), "sum")[0]


def distributed_l2(ctx, g):
    """||g|| over all ranks' shards, right for any finite float32 g, all zeros included: no square may
    overflow or round to 0 (section 3's table shows the naive sum of squares doing both)."""
    # >>> exercise: l2_norm
    scale = allreduce(ctx, np.array([np.max(np.abs(g), initial=0)], g.dtype), "max")[0]
    if scale == 0:  # scale is global, so every rank takes this branch together
        return g.dtype.type(0)
    local = np.sum(np.square(g / scale))
    return scale * np.sqrt(allreduce(ctx, np.array([local], g.dtype), "sum")[0])
    # <<< exercise: l2_norm


def naive_l2(ctx, g):
    with np.errstate(over="ignore", under="ignore"):
        return np.sqrt(allreduce(ctx, np.array([np.sum(np.square(g))], g.dtype), "sum")[0])


def gradient_shard(lo, hi, vocab, mag):
    """g[i] = (-1)^i * mag * 2(i+1)/vocab over global indices: a ramp up to 2*mag, so every shard has
    its own max |g| (a norm scaled by a rank's own max is wrong, and shows it)."""
    i = np.arange(lo, hi)
    return (mag * 2.0 * (i + 1) / vocab * np.where(i % 2, -1.0, 1.0)).astype(np.float32)


def allgather(ctx, piece):
    """Every rank's equal-size `piece`, concatenated in rank order, on every rank."""
    n, k = ctx.world_size, len(piece)
    send, out = buffers.on_device(ctx, piece.copy()), buffers.empty(ctx, n * k, piece.dtype)
    HANDED[0] += piece.nbytes
    if ctx.api == "torch":
        import torch.distributed as dist
        dist.all_gather([out[r * k:(r + 1) * k] for r in range(n)], send)
    elif ctx.device == "gpu":
        import cupy
        stream = cupy.cuda.get_current_stream()
        ctx.nccl.allGather(send.data.ptr, out.data.ptr, k, buffers.nccl_dtype(send), stream.ptr)
        stream.synchronize()
    else:
        ctx.comm.Allgather(send, out)
    return buffers.to_host(out)


def gather(ctx, piece, root=0):
    """The same pieces collected on `root` only (others get an empty array)."""
    n, k = ctx.world_size, len(piece)
    send = buffers.on_device(ctx, piece.copy())
    HANDED[0] += piece.nbytes
    out = buffers.empty(ctx, n * k, piece.dtype) if ctx.rank == root else None
    if ctx.api == "torch":
        import torch.distributed as dist
        parts = [out[r * k:(r + 1) * k] for r in range(n)] if ctx.rank == root else None
        dist.gather(send, gather_list=parts, dst=root)
    elif ctx.device == "gpu":
        import cupy
        from cupy.cuda import nccl
        stream, t = cupy.cuda.get_current_stream(), buffers.nccl_dtype(send)
        nccl.groupStart()  # cupy's nccl has no gather: the root receives from each rank, grouped
        if ctx.rank == root:
            out[root * k:(root + 1) * k] = send
            for r in (r for r in range(n) if r != root):
                ctx.nccl.recv(out[r * k:(r + 1) * k].data.ptr, k, t, r, stream.ptr)
        else:
            ctx.nccl.send(send.data.ptr, k, t, root, stream.ptr)
        nccl.groupEnd()
        stream.synchronize()
    else:
        ctx.comm.Gather(send, out, root=root)
    return buffers.to_host(out) if ctx.rank == root else np.zeros(0, piece.dtype)


def broadcast(ctx, piece, root=0):
    """The root's `piece` on every rank."""
    buf = buffers.on_device(ctx, piece.copy())
    HANDED[0] += piece.nbytes
    if ctx.api == "torch":
        import torch.distributed as dist
        dist.broadcast(buf, src=root)
    elif ctx.device == "gpu":
        import cupy
        stream = cupy.cuda.get_current_stream()
        ctx.nccl.bcast(buf.data.ptr, buf.size, buffers.nccl_dtype(buf), root, stream.ptr)
        stream.synchronize()
    else:
        ctx.comm.Bcast(buf, root=root)
    return buffers.to_host(buf)


def allgather_uneven(ctx, piece):
    """All-gather of pieces whose sizes differ: first every rank learns every size."""
    sizes = allgather(ctx, np.array([len(piece)], dtype=np.int64))
    if ctx.api == "mpi4py" and ctx.device == "cpu":
        from mpi4py.util.dtlib import from_numpy_dtype
        out = np.empty(int(sizes.sum()), dtype=piece.dtype)
        displs = np.concatenate(([0], np.cumsum(sizes)[:-1]))
        HANDED[0] += piece.nbytes
        ctx.comm.Allgatherv(piece, [out, sizes, displs, from_numpy_dtype(piece.dtype)])
        return out
    # torch and nccl all-gather equal sizes: pad to the largest piece, gather, trim each
    width = max(1, int(sizes.max()))
    padded = np.zeros(width, dtype=piece.dtype)
    padded[:len(piece)] = piece
    parts = allgather(ctx, padded).reshape(ctx.world_size, width)
    return np.concatenate([p[:s] for p, s in zip(parts, sizes)])


def section_gather(ctx):
    """Section 1: all-gather, broadcast and gather of the same pieces, then an uneven all-gather."""
    n, rank = ctx.world_size, ctx.rank
    report.section(ctx, f"1. all-gather vs broadcast vs gather, on the same {PIECE}-item pieces"
                   + ("\n   (1 rank: each returns my own data)" if n == 1 else ""))
    piece = rank * PIECE + np.arange(PIECE, dtype=np.float64)  # pieces in rank order make 0, 1, 2 ...
    # the call, per API: comm.Allgather(piece, out) | dist.all_gather(parts, t) | nccl allGather(...)
    everyone = allgather(ctx, piece)
    from_root = broadcast(ctx, piece)  # only rank 0's piece travels
    on_root = gather(ctx, piece)       # every piece, but only rank 0 holds them
    gathered = text.brief(on_root, SHOWN) if rank == 0 else "(nothing: not the root)"
    # one line per result: say prints a line every rank holds alike once, as [all ranks]
    report.say(ctx, f"mine {text.brief(piece, SHOWN)}\nall-gather {text.brief(everyone, SHOWN)}\n"
                    f"broadcast {text.brief(from_root, SHOWN)}\ngather {gathered}")
    lo, hi = chunk_bounds(COUNT, n)[rank]
    uneven = allgather_uneven(ctx, np.arange(lo, hi, dtype=np.float64))
    report.say(ctx, f"uneven: my {hi - lo} items {lo}..{hi - 1}\n"
                    f"uneven, all-gathered {text.brief(uneven, SHOWN)}")
    assert np.array_equal(everyone, np.arange(n * PIECE)), "all-gather: wrong pieces or order"
    assert np.array_equal(uneven, np.arange(COUNT)), "uneven all-gather: wrong pieces or order"
    return everyone, from_root, on_root, uneven


def section_softmax(ctx, vocab, scale, a, b):
    """Section 2: the sharded softmax (my shard a..b-1) against a float64 reference, and the naive one.
    Returns (my values, the run's values) for the results JSON."""
    from mpi4py import MPI
    report.section(ctx, f"2. softmax of a {vocab}-logit float32 vector sharded over {ctx.world_size} rank(s), "
                   f"logits in [-{scale:g}, {scale:g}]")
    rng = np.random.default_rng(SEED)
    logits = (rng.uniform(-1.0, 0.99, vocab) * scale).astype(np.float32)
    logits[vocab // 2] = scale  # the one largest logit sits mid-vector, on a middle rank
    x = logits[a:b]
    before = HANDED[0]
    p = distributed_softmax(ctx, x)
    softmax_bytes = HANDED[0] - before
    naive = naive_softmax(ctx, x)
    # reference: one process, float64, log-sum-exp by pairwise logaddexp (a different route)
    x64 = logits.astype(np.float64)
    ref = np.exp(x64 - np.logaddexp.reduce(x64))[a:b]
    err = float(np.max(np.abs(p - ref), initial=0))
    # p / reference where both are normal float32 numbers: one factor (1) on every shard when the
    # shift and the denominator are global; a shard that used its own max is off by its own factor
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = (p / ref)[(ref > 1e-30) & (p > 1e-30)]
    shard_factor = float(np.median(ratios)) if ratios.size else None
    naive_err = float(np.max(np.abs(naive - ref), initial=0))  # nan where naive made inf/inf
    # bookkeeping over MPI's object calls (not the lesson's subject): totals and the global argmax
    naive_ok = ctx.comm.allreduce(bool(np.isfinite(naive).all() and naive_err <= 1e-6), op=MPI.LAND)
    mass = ctx.comm.allreduce(float(p.astype(np.float64).sum()))
    mine = (float(p.max()), a + int(np.argmax(p))) if len(p) else (-1.0, -1)
    p_max, argmax = max(ctx.comm.allgather(mine))
    factors = [f for f in ctx.comm.allgather(shard_factor) if f is not None and np.isfinite(f)]
    factor_spread = max(factors) / min(factors) if factors and min(factors) > 0 else None
    span = f"{a}..{b - 1}" if b > a else "(empty)"
    report.say(ctx, f"shard {span}  local max {np.max(x, initial=-np.inf):.6g}  "
                    f"max |p - ref| {err:.1e}  naive: max |p - ref| {naive_err:.1e}")
    show.softmax(ctx, naive_ok, mass, p_max, argmax, factor_spread, softmax_bytes, vocab)
    return ({"softmax_max_abs_err": err, "softmax_finite": bool(np.isfinite(p).all()), "naive_ok": naive_ok,
             "softmax_handed_B": softmax_bytes, "softmax_shard_factor": shard_factor},
            {"prob_total": mass, "argmax": argmax, "p_max": p_max, "shard_factor_spread": factor_spread})


def section_l2(ctx, args, a, b):
    """Section 3: the scaled and the naive norm at each magnitude, then the clip factor.
    Returns ({magnitude: (scaled norm, naive norm)}, my clip factor, every rank's clip factor)."""
    vocab = args.vocab
    report.section(ctx, f"3. L2 norm of a sharded float32 gradient g[i] = (-1)^i mag 2(i+1)/{vocab}, "
                        "and the clip factor")
    rows, norms = [], {}
    for mag in MAGNITUDES:
        g = gradient_shard(a, b, vocab, mag)
        robust, plain = float(distributed_l2(ctx, g)), float(naive_l2(ctx, g))
        exact = np.sqrt(ctx.comm.allreduce(float(np.sum(np.square(g.astype(np.float64))))))
        norms[mag] = (robust, plain)
        rows.append(show.norm_row(ctx, mag, g, robust, plain, exact))  # collective: counts the squares
    show.norms(ctx, rows, vocab)
    norm = norms[1.0][0]
    clip = min(1.0, args.max_norm / (norm + 1e-6))  # as torch's clip_grad_norm_: max_norm/(norm+eps)
    report.say(ctx, f"||g|| = {norm:.6g}  clip factor = min(1, {args.max_norm:g} / (||g|| + 1e-6)) "
                    f"= {clip:.9g}")
    return norms, clip, ctx.comm.allgather(clip)


def section_across(ctx, vocab):
    """Section 4: softmax ACROSS ranks at each position: (my p_r, the sums of p over the ranks)."""
    report.section(ctx, "4. not the same thing: softmax ACROSS ranks at each position"
                   + ("\n   (1 rank: every p is 1)" if ctx.world_size == 1 else ""))
    xr = ctx.rank * np.arange(4, dtype=np.float32)  # rank r holds x_r[i] = r*i at positions 0..3
    m = allreduce(ctx, xr, "max")                   # element-wise: 4 values travel, not 1
    e = np.exp(xr - m)
    pr = e / allreduce(ctx, e, "sum")
    col = allreduce(ctx, pr.astype(np.float64), "sum")
    show.across(ctx, xr, pr, col, vocab)
    return pr, col


def flags():
    parser = bootstrap.lesson_parser(__file__, __doc__)
    parser.add_argument("--vocab", type=bootstrap.nonneg_int, default=VOCAB,
                        help="length of the sharded logit and gradient vectors")
    parser.add_argument("--scale", type=float, default=SCALE, help="largest logit magnitude")
    parser.add_argument("--max-norm", type=float, default=MAX_NORM, help="gradient clipping threshold")
    return parser


def main():
    args, ctx = bootstrap.start(__file__, flags())
    vocab, scale = args.vocab, args.scale
    if vocab < 1 or not 0 < scale <= float(np.finfo(np.float32).max) or not args.max_norm > 0:
        ctx.fail("--vocab must be >= 1, --scale a positive float32 (<= 3.4e38), --max-norm > 0")
    ctx.params = {"vocab": vocab, "scale": scale, "max_norm": args.max_norm, "piece": PIECE,
                  "count": COUNT}

    everyone, from_root, on_root, uneven = section_gather(ctx)        # 1. all-gather vs bcast, gather
    a, b = chunk_bounds(vocab, ctx.world_size)[ctx.rank]               # my shard of the vocabulary
    softmax, softmax_run = section_softmax(ctx, vocab, scale, a, b)    # 2. two scalars per rank
    norms, clip, clips = section_l2(ctx, args, a, b)                   # 3. the norm, any magnitude
    pr, col = section_across(ctx, vocab)                               # 4. the contrast

    report.finish(ctx, {
        "allgather_n": int(everyone.size),
        "allgather_wsum": float((np.arange(everyone.size) * everyone).sum()),
        "bcast_sum": float(from_root.sum()), "gather_n": int(on_root.size),
        "allgatherv_n": int(uneven.size),
        "allgatherv_wsum": float((np.arange(uneven.size) * uneven).sum()),
        **softmax,
        "l2_zero": norms[0.0][0], "l2_tiny": norms[1e-30][0], "l2_subnormal": norms[1e-22][0], "l2_one": norms[1.0][0],
        "l2_huge": norms[1e30][0],
        "naive_l2_tiny": norms[1e-30][1], "naive_l2_huge_finite": bool(np.isfinite(norms[1e30][1])),
        "clip": clip, "elem_p0": float(pr[0]), "elem_colsum_err": float(np.max(np.abs(col - 1)))},
        summary={**softmax_run, "clip_spread": max(clips) - min(clips)})


if __name__ == "__main__":
    main()
