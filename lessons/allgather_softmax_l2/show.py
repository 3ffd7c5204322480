"""What lesson 04 prints: the softmax's summary, the norm table across magnitudes, the contrast."""
import numpy as np

from common import report, text


def softmax(ctx, naive_ok, mass, p_max, argmax, factor_spread, handed, vocab):
    """Rank 0: the naive softmax's fate, the totals, one factor or not, and the bytes handed in."""
    if ctx.rank != 0:
        return
    n = ctx.world_size
    print(f"naive exp(x)/sum(exp(x)): {'right at this scale' if naive_ok else 'WRONG (inf/nan)'}; "
          f"exp overflows float32 above ln(max) = {np.log(np.finfo(np.float32).max):.2f}.\n"
          f"sum of all probabilities {mass:.9f}, largest {p_max:.6g} at position {argmax};\n"
          "p / reference per shard: " + ("no shard has a finite factor" if factor_spread is None else
                                          f"{'one factor' if factor_spread < 1 + 1e-4 else 'DIFFERS'}"
                                          f" (max/min {factor_spread:.6g})") + ".\n"
          f"handed to all-reduce per rank: {handed} B (MAX, then SUM, of one float32 each). "
          "What crosses\nthe wire for them is the library's choice of algorithm (lesson 07): "
          "a few small messages.\n"
          f"all-gathering the logits instead would bring each rank (N-1)/N x 4 B x {vocab} = "
          f"{4 * vocab * (n - 1) // n} B.\nvocabulary-parallel output layers (Megatron-style) do "
          "the former: each GPU holds a slice of the\nvocabulary, and the full logit row never "
          "exists on one GPU.", flush=True)


def squares_in_float32(ctx, g):
    """Which way g's float32 squares go, over all ranks: '100% normal', '87% subnormal, 13% 0' ..."""
    from mpi4py import MPI
    with np.errstate(over="ignore", under="ignore"):
        sq = np.square(g)
    mine = np.array([np.sum(np.isinf(sq)), np.sum((sq > 0) & (sq < np.finfo(np.float32).tiny)),
                     np.sum(sq == 0), sq.size], dtype=np.int64)
    total = np.empty_like(mine)
    ctx.comm.Allreduce(mine, total, op=MPI.SUM)  # bookkeeping for the table, not the lesson's subject
    parts = [f"{100 * k / max(1, total[3]):.0f}% {what}"
             for k, what in zip(total[:3], ("inf", "subnormal", "0")) if k]
    return ", ".join(parts) or "100% normal"


def norm_row(ctx, mag, g, robust, plain, exact):
    """One row of the norm table (collective: the squares are counted over all ranks)."""
    rel = [abs(v - exact) / exact if np.isfinite(v) and exact else 0.0 if v == exact else float("inf")
           for v in (robust, plain)]  # a zero gradient's norm is right only as 0 (nan is not)
    return (f"{mag:g}", squares_in_float32(ctx, g), robust, f"{rel[0]:.1e}", plain, f"{rel[1]:.1e}")


def norms(ctx, rows, vocab):
    """Rank 0: the norm table, and where float32 squares overflow, go subnormal and vanish."""
    if ctx.rank != 0:
        return
    f32 = np.finfo(np.float32)
    print(text.table(["mag", "float32 squares", "scaled norm", "rel err", "naive norm", "rel err"],
                     rows, align=[False, False, True, True, True, True]))
    print(f"rel err: against the root of the float64 sum of squares. A float32 square overflows "
          f"above\nsqrt(max) = {np.sqrt(f32.max):.1e}, is subnormal below sqrt(tiny) = "
          f"{np.sqrt(f32.tiny):.1e} and rounds to 0 below\nsqrt(smallest subnormal / 2) = "
          f"{np.sqrt(float(f32.smallest_subnormal) / 2):.1e}; a sum of n squares overflows once "
          f"|g| ~ sqrt(max / n)\n= {np.sqrt(f32.max / vocab):.1e} for n = {vocab}. The scaled norm "
          f"works for any finite float32 g whose norm is\nitself below max = {f32.max:.2e}.",
          flush=True)


def across(ctx, xr, pr, col, vocab):
    """Section 4: each rank's values and probabilities, and the sums over the ranks."""
    k = len(xr)
    report.say(ctx, f"x_r = {xr}  p_r = {np.round(pr, 4)}")
    if ctx.rank == 0:
        print(f"each position i is normalised over the {ctx.world_size} ranks: sum over ranks of p_r[i] = "
              f"{np.round(col, 6)};\nthe sharded softmax of section 2 normalises one vector over all "
              f"{vocab} positions\n(its total is 1, not {k}). Here 2 x {k} floats per rank are handed "
              "to all-reduce, there 2 scalars.",
              flush=True)
