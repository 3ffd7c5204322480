"""Lesson 11 — tensor parallelism in an MLP block (Megatron-LM), then sequence parallelism.

The idea: one transformer MLP block, z = x + GeLU(LN(x) @ A + a) @ B + b, on a (tokens x hidden)
activation x, split over N ranks so that each holds 1/N of the weights A (hidden x F) and
B (F x hidden). Four ways, each by hand, forward and backward (each way's theory is the docstring
of its *_forward): (1) naive, A and B by columns; (2) Megatron-LM, A by columns and B by rows, one
all-reduce each way (g after B, f before A); (3) sequence parallelism, g's all-reduce as a
reduce-scatter and an all-gather around the token-wise parts; (4) (3), keeping my tokens of LN(x).
The collectives are the learner's own (lesson 05's ring all-reduce, lesson 09's all-gather and
reduce-scatter, on common/p2p); common/counting counts the bytes each rank sends, pass by pass.
The loss is sum(W * z) with W seeded, so dz = W on every rank, known without a message.

What to watch for:
  1. the split: who holds which columns of A (and a), rows of B, tokens and (1)'s output columns.
     The defaults (22 tokens, hidden 10, F = 4 x hidden) leave uneven shares at NP 3 and 4.
  2. the collectives per block (counted): each way's calls in order and the bytes each rank sent;
     x, in units of one all-gather of the activation: (1) 5 forward and 6 backward, (2) 2 and 2, (3) 2
     and 2 (the same bytes as (2), rank by rank), (4) 2 and 3.
  3. what each rank keeps for backward (measured): (2) every token's LN(x) and output, (4) its share.
  4. equal to one process (checked): z, dx and every gradient of every way, entry by entry, inside
     a budget made from the run's values (sums added in another order: tensor_parallel/budget.py);
     (lib) on the library's calls. Why g waits for B: split A by rows and GeLU sees partial sums.
  5. on --api torch: torch's own ColwiseParallel, RowwiseParallel and SequenceParallel, same block.

Run it:
  make lesson-11 NP=4                      (API=torch; ARGS="--dtype float32 --tokens 9 --ffn 30")
  .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py lessons/11_tensor_parallel.py --api mpi4py
Read next: lessons/tensor_parallel/ (collectives.py: the calls to lessons 05 and 09; torch_tp.py:
torch's plans; show.py: the tables), then lesson 12, pipeline parallelism.
"""
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import bootstrap, buffers, report, shards, timing, tolerance  # noqa: E402
from lessons.tensor_parallel import budget, show, torch_tp  # noqa: E402
from lessons.tensor_parallel.collectives import Collectives  # noqa: E402

five = bootstrap.lesson_module("05")  # ring_allreduce, inplace_add
nine = bootstrap.lesson_module("09")  # ring_chunks, all_gather, reduce_scatter

SEED = 11                 # weights, x and W come from this seed (--seed), identical on every rank
TOKENS = 22               # batch x sequence: 22 % 3 == 1, 22 % 4 == 2, so token shares are uneven
HIDDEN = 10               # 10 % 3, 10 % 4 != 0: the naive way's output columns are uneven too
FFN_PER_HIDDEN = 4        # F = 4 x hidden (40: 40 % 3 == 1), the transformer's usual MLP width
LN_EPS = 1e-5             # torch.nn.LayerNorm's default
GELU_C, GELU_K = math.sqrt(2 / math.pi), 0.044715  # GeLU's tanh form, as GPT-2's
DTYPES = ("float32", "float64")  # graded against common/tolerance.py's budget (tensor_parallel/budget.py)
PASSES = ("forward", "backward", "grads")  # counted apart; grads: (3), (4)'s all-reduce of dgamma, dbeta, db


# ---------------------------------------------------------------- (1) naive: every layer by columns
def naive_forward(ops, xp, p, x, split):
    """(1) naive: A and B both split by columns. Rank r computes its columns of h = GeLU(LN(x) @ A + a),
    but its columns of B need every column of h: all-gather h (tokens x F) between the layers, then
    all-gather z's columns at the end. Backward mirrors it: the gradient of h is a sum over ranks, of
    which each keeps its columns (a reduce-scatter), and dLN(x) is all-reduced."""
    fcols, hcols = split["fcols"], split["hcols"]
    (flo, fhi), (hlo, hhi) = fcols[ops.rank], hcols[ops.rank]
    y, saved = layer_norm(x, p["gamma"], p["beta"])
    u = y @ p["A"][:, flo:fhi] + p["a"][flo:fhi]
    h = gather_columns(ops, gelu(xp, u), fcols, "h")   # B's columns need every column of h
    mine = h @ p["B"][:, hlo:hhi] + p["b"][hlo:hhi]    # my columns of the output
    z = x + gather_columns(ops, mine, hcols, "z")       # the next block needs all of them
    return z, dict(saved, y=y, u=u, h=h)


def naive_backward(ops, xp, p, s, dz, split):
    fcols, hcols = split["fcols"], split["hcols"]
    (flo, fhi), (hlo, hhi) = fcols[ops.rank], hcols[ops.rank]
    dmine = dz[:, hlo:hhi]  # every rank holds all of dz: the last all-gather's backward is a slice
    g = {"dB": s["h"].T @ dmine, "db": dmine.sum(0)}
    dh = scatter_columns(ops, dmine @ p["B"][:, hlo:hhi].T, fcols, "dh")  # sum of the ranks' parts
    du = dh * gelu_grad(xp, s["u"])
    g["dA"], g["da"] = s["y"].T @ du, du.sum(0)
    dy = ops.all_reduce(du @ p["A"][:, flo:fhi].T, "dLN(x)")  # my columns' part of dLN(x)
    dxn, g["dgamma"], g["dbeta"] = layer_norm_backward(dy, p["gamma"], s)
    return dz + dxn, g


# ---------------------------------------------------------------- (2) Megatron: f and g
def megatron_forward(ops, xp, p, x, split):
    """(2) Megatron-LM (Shoeybi et al. 2019): A by columns, B by rows. GeLU acts on each column of
    u = LN(x) @ A + a alone, and rank r holds whole columns of A, so it runs GeLU on its columns with no
    message at all. h_r @ B_r is rank r's share of z, a partial sum: one all-reduce after B, the
    operator g, makes z (and b is added once, after it). Its twin f stands before A: the identity
    forward (every rank has all of LN(x)), an all-reduce of dLN(x) backward (each rank's columns give a
    partial sum of it). One all-reduce each way per block; g's backward and f's forward cost nothing."""
    lo, hi = split["fcols"][ops.rank]
    A, a, B = p["A"][:, lo:hi], p["a"][lo:hi], p["B"][lo:hi]  # my columns of A and a, my rows of B
    y, saved = layer_norm(x, p["gamma"], p["beta"])            # f: the identity, all of y on every rank
    # >>> exercise: megatron_forward
    u = y @ A + a
    part = gelu(xp, u) @ B                   # my columns' share of every output: a partial sum
    z = x + ops.all_reduce(part, "z (g)") + p["b"]   # g: the sum over ranks; b once, after it
    # <<< exercise: megatron_forward
    return z, dict(saved, y=y, u=u)


def megatron_backward(ops, xp, p, s, dz, split):
    lo, hi = split["fcols"][ops.rank]
    A, B = p["A"][:, lo:hi], p["B"][lo:hi]
    # >>> exercise: megatron_backward
    dpart = dz                               # g's backward: the identity (every rank holds all of dz)
    g = {"dB": gelu(xp, s["u"]).T @ dpart, "db": dz.sum(0)}
    du = (dpart @ B.T) * gelu_grad(xp, s["u"])
    g["dA"], g["da"] = s["y"].T @ du, du.sum(0)
    dy = ops.all_reduce(du @ A.T, "dLN(x) (f)")      # f's backward: my columns give part of dLN(x)
    # <<< exercise: megatron_backward
    dxn, g["dgamma"], g["dbeta"] = layer_norm_backward(dy, p["gamma"], s)
    return dz + dxn, g


# ---------------------------------------------------------------- (3), (4) sequence parallelism
def sequence_forward(ops, xp, p, x, split, keep=True):
    """(3) sequence parallelism (Korthikanti et al. 2022): outside A and B every token is on its own
    (layer norm, residual, bias), so there each rank keeps only its tokens. g's all-reduce falls apart
    into its two halves: a reduce-scatter after B (the sum, for my tokens only), then the residual and
    the next layer norm on my tokens, and an all-gather just before A. Backward swaps them. The same
    bytes as (2), since an all-reduce is a reduce-scatter plus an all-gather, for 1/N of the layer
    norm's and the residual's activations. The layer norm's and b's gradients come from my tokens
    alone: partial sums, all-reduced once (3 x hidden items).
    x: my tokens. keep: hand backward the gathered LN(x) of every token (3), or my tokens' (4)."""
    fcols, rows = split["fcols"], split["rows"]
    lo, hi = fcols[ops.rank]
    A, a, B = p["A"][:, lo:hi], p["a"][lo:hi], p["B"][lo:hi]
    y, saved = layer_norm(x, p["gamma"], p["beta"])            # my tokens only
    # >>> exercise: sequence_forward
    every = gather_tokens(ops, y, rows, "LN(x)")    # A's columns need every token
    u = every @ A + a
    z = x + scatter_tokens(ops, gelu(xp, u) @ B, rows, "z") + p["b"]  # the sum, for my tokens
    # <<< exercise: sequence_forward
    return z, dict(saved, y=every if keep else y, u=u)


def sequence_backward(ops, xp, p, s, dz, split, keep=True):
    fcols, rows = split["fcols"], split["rows"]
    lo, hi = fcols[ops.rank]
    A, B = p["A"][:, lo:hi], p["B"][lo:hi]
    # >>> exercise: sequence_backward
    dall = gather_tokens(ops, dz, rows, "dz")       # B's rows act on every token
    every = s["y"] if keep else gather_tokens(ops, s["y"], rows, "LN(x) again")
    g = {"dB": gelu(xp, s["u"]).T @ dall}
    du = (dall @ B.T) * gelu_grad(xp, s["u"])
    g["dA"], g["da"] = every.T @ du, du.sum(0)
    dy = scatter_tokens(ops, du @ A.T, rows, "dLN(x)")  # the sum, for my tokens
    dxn, dgamma, dbeta = layer_norm_backward(dy, p["gamma"], s)
    with ops.phase("grads"):                   # from my tokens alone: partial sums, one all-reduce
        k = dz.shape[1]  # hidden
        mine = ops.empty(3 * k)
        mine[:k], mine[k:2 * k], mine[2 * k:] = dgamma, dbeta, dz.sum(0)
        summed = ops.all_reduce(mine, "dgamma, dbeta, db")
    g["dgamma"], g["dbeta"], g["db"] = summed[:k], summed[k:2 * k], summed[2 * k:]
    # <<< exercise: sequence_backward
    return dz + dxn, g


def sequence_regather_forward(ops, xp, p, x, split):
    """(4) (3) as Megatron-LM runs it: backward needs LN(x) of every token for dA = LN(x)^T du. (3)
    keeps the gathered copy (tokens x hidden on every rank); (4) keeps its own tokens and all-gathers
    them again in backward: one more all-gather, for 1/N of that activation too."""
    return sequence_forward(ops, xp, p, x, split, keep=False)


def sequence_regather_backward(ops, xp, p, s, dz, split):
    return sequence_backward(ops, xp, p, s, dz, split, keep=False)


WAYS = {"naive": (naive_forward, naive_backward), "megatron": (megatron_forward, megatron_backward),
        "sequence": (sequence_forward, sequence_backward),
        "sequence_regather": (sequence_regather_forward, sequence_regather_backward)}


# ---------------------------------------------------------------- tokens and columns, in blocks
def gather_tokens(ops, mine, rows, what):
    """(my tokens x hidden) -> (tokens x hidden): a token's row is contiguous, so blocks are rows."""
    hidden = mine.shape[1]
    return ops.all_gather(mine, [(hi - lo) * hidden for lo, hi in rows], what).reshape(rows[-1][1], hidden)


def scatter_tokens(ops, full, rows, what):
    """(tokens x hidden) partial sums -> (my tokens x hidden), summed over ranks."""
    hidden = full.shape[1]
    lo, hi = rows[ops.rank]
    return ops.reduce_scatter(full, [(b - a) * hidden for a, b in rows], what).reshape(hi - lo, hidden)


def gather_columns(ops, mine, cols, what):
    """(tokens x my columns) -> (tokens x all columns). Columns are not contiguous in a row-major
    array: each rank's block travels as its own contiguous (tokens x c_r) piece, then lands in place."""
    tokens = mine.shape[0]
    flat = ops.all_gather(mine, [tokens * (hi - lo) for lo, hi in cols], what)
    out = ops.empty(tokens * cols[-1][1]).reshape(tokens, cols[-1][1])
    for lo, hi in cols:
        out[:, lo:hi] = flat[tokens * lo:tokens * hi].reshape(tokens, hi - lo)
    return out


def scatter_columns(ops, full, cols, what):
    """(tokens x all columns) partial sums -> (tokens x my columns), summed over ranks."""
    tokens = full.shape[0]
    packed = ops.empty(buffers.size(full))
    for lo, hi in cols:
        packed[tokens * lo:tokens * hi] = full[:, lo:hi].reshape(-1)
    lo, hi = cols[ops.rank]
    return ops.reduce_scatter(packed, [tokens * (b - a) for a, b in cols], what).reshape(tokens, hi - lo)


# ---------------------------------------------------------------- the block's math, xp-free
def gelu(xp, u):
    return 0.5 * u * (1 + xp.tanh(GELU_C * (u + GELU_K * u ** 3)))


def gelu_grad(xp, u):
    t = xp.tanh(GELU_C * (u + GELU_K * u ** 3))
    return 0.5 * (1 + t) + 0.5 * u * (1 - t * t) * GELU_C * (1 + 3 * GELU_K * u * u)


def layer_norm(x, gamma, beta):
    """Each token (row) to mean 0, variance 1 over hidden, then scaled and shifted. Returns (y, what
    backward needs: x-hat and 1/sigma per token)."""
    hidden = x.shape[1]
    centred = x - x.sum(1)[:, None] / hidden
    rstd = 1 / ((centred * centred).sum(1)[:, None] / hidden + LN_EPS) ** 0.5
    xhat = centred * rstd
    return xhat * gamma + beta, {"xhat": xhat, "rstd": rstd}


def layer_norm_backward(dy, gamma, saved):
    """(dx, dgamma, dbeta) for y = layer_norm(x): a token's dx needs only that token's dy."""
    xhat, rstd = saved["xhat"], saved["rstd"]
    hidden = xhat.shape[1]
    g = dy * gamma
    dx = rstd * (g - g.sum(1)[:, None] / hidden - xhat * (g * xhat).sum(1)[:, None] / hidden)
    return dx, (dy * xhat).sum(0), dy.sum(0)


def reference(p, x, dz):
    """One process, the unsplit block, NumPy: (z, dx, {gradient name: array})."""
    y, ln = layer_norm(x, p["gamma"], p["beta"])
    u = y @ p["A"] + p["a"]
    h = gelu(np, u)
    z = x + h @ p["B"] + p["b"]
    du = (dz @ p["B"].T) * gelu_grad(np, u)
    dxn, dgamma, dbeta = layer_norm_backward(du @ p["A"].T, p["gamma"], ln)
    grads = {"dA": y.T @ du, "da": du.sum(0), "dB": h.T @ dz, "db": dz.sum(0), "dgamma": dgamma,
             "dbeta": dbeta}
    return z, dz + dxn, grads


def make_block(tokens, hidden, ffn, dtype, seed=SEED):
    """The block's parameters, x and the loss weights W (so dz = W), seeded, as NumPy arrays."""
    rng = np.random.default_rng(seed)
    p = {"gamma": 1 + 0.1 * rng.standard_normal(hidden), "beta": 0.1 * rng.standard_normal(hidden),
         "A": rng.standard_normal((hidden, ffn)) / math.sqrt(hidden), "a": 0.1 * rng.standard_normal(ffn),
         "B": rng.standard_normal((ffn, hidden)) / math.sqrt(ffn), "b": 0.1 * rng.standard_normal(hidden)}
    x, w = rng.standard_normal((tokens, hidden)), rng.standard_normal((tokens, hidden))
    return {k: v.astype(dtype) for k, v in p.items()}, x.astype(dtype), w.astype(dtype)


# ---------------------------------------------------------------- one way, run and graded
def run_way(way, ops, xp, p, x, dz, split):
    """Forward and backward of one way; returns (z, dx, grads, held) as this rank holds them."""
    forward, backward = WAYS[way]
    mine = slice(*split["rows"][ops.rank]) if way.startswith("sequence") else slice(None)  # (3), (4): mine
    with ops.phase("forward"):
        z, saved = forward(ops, xp, p, x[mine], split)
    held = held_bytes(saved, z)
    with ops.phase("backward"):
        dx, grads = backward(ops, xp, p, saved, dz[mine], split)
    ops.be.sync()  # gpu: nccl is async; the host reads the results next
    return z, dx, grads, held


def held_bytes(saved, z):
    """Measured: the bytes of the arrays a forward handed its backward, by part, and of its output."""
    parts = {"LN": ("xhat", "rstd"), "input": ("y",), "MLP": ("u", "h")}
    out = {part: sum(buffers.nbytes(saved[k]) for k in keys if k in saved) for part, keys in parts.items()}
    out["output"] = buffers.nbytes(z)
    return out


def graded_reference(p, x, w, dtype):
    """One process's values and their budgets, by name (z, dx, dA, da, dB, db, dgamma, dbeta)."""
    z, dx, grads = reference(p, x, w)
    return {"z": z, "dx": dx, **grads}, budget.entries(p, x, w, dtype, LN_EPS, GELU_C, GELU_K)


def ratio(ref, name, got, cut=slice(None)):
    """The worst entry's |got - one process| / its budget, over the slice `cut` (got from any device)."""
    want, bound = ref
    return tolerance.worst_ratio(buffers.to_host(got).astype(np.float64) - want[name][cut], bound[name][cut])


GRADED = {"z_ratio": ("z",), "dx_ratio": ("dx",), "dA_ratio": ("dA", "da"), "dB_ratio": ("dB", "db"),
          "dln_ratio": ("dgamma", "dbeta")}  # the JSON's fields: the names each grades


def errors(way, rank, split, ref, z, dx, grads):
    """Each array against the same slice of one process's, inside its budget: worst |diff| / budget."""
    f = slice(*split["fcols"][rank])  # my columns of A and a, my rows of B
    cols = slice(*split["hcols"][rank]) if way == "naive" else slice(None)  # the naive way's B, b: my columns
    rows = slice(*split["rows"][rank]) if way.startswith("sequence") else slice(None)  # (3), (4): my tokens
    cut = {"z": rows, "dx": rows, "dA": (slice(None), f), "da": f, "dB": (slice(None), cols) if way == "naive"
           else f, "db": cols, "dgamma": slice(None), "dbeta": slice(None)}
    got = {"z": z, "dx": dx, **grads}
    return {key: max(ratio(ref, name, got[name], cut[name]) for name in names) for key, names in GRADED.items()}


def run_ways(ctx, args, host, x, w, ref, split):
    """Every way on the learner's collectives (counted and tallied), then on the library's. Returns this
    rank's row (its "ways" keep each call's tally for the table) and the library's Collectives."""
    xp, dtype, (lo, hi) = buffers.array_module(ctx), np.dtype(args.dtype), split["rows"][ctx.rank]
    p = {k: buffers.on_device(ctx, v) for k, v in host.items()}
    xd, dz = buffers.on_device(ctx, x), buffers.on_device(ctx, w)
    ways, library = [], []
    for way in WAYS:
        ops = Collectives(ctx, dtype, five, nine)
        z, dx, grads, held = run_way(way, ops, xp, p, xd, dz, split)
        ways.append({"way": way, **errors(way, ctx.rank, split, ref, z, dx, grads),
                     **{f"{ph}_calls": ops.called(ph) for ph in PASSES},
                     **{f"{ph}_bytes": ops.be.total(phases=[ph]) for ph in PASSES},
                     "held": held, "held_bytes": sum(held.values()),
                     "tokens_held": hi - lo if way.startswith("sequence") else args.tokens,
                     "calls": ops.calls})
        lib = Collectives(ctx, dtype, five, nine, library=True)
        z, dx, grads, _ = run_way(way, lib, xp, p, xd, dz, split)
        library.append({"way": way, "ratio": max(errors(way, ctx.rank, split, ref, z, dx, grads).values()),
                        "calls": " | ".join(lib.called(ph) for ph in ("forward", "backward"))})
    worst = {name: float(b.max(initial=0)) for name, b in ref[1].items()}  # the budget's largest entry
    return {"ways": ways, "library": library, "tokens": args.tokens, "budget": worst}, lib



# ---------------------------------------------------------------- why g waits for B, measured
def gelu_of_sums(p, x, n):
    """Split A by rows over n ranks instead: u is then a sum of n partial products. Relative gap
    between GeLU of the sum (what the block needs) and the sum of the GeLUs (what each rank could do
    alone)."""
    y, _ = layer_norm(x, p["gamma"], p["beta"])
    parts = [y[:, lo:hi] @ p["A"][lo:hi] for lo, hi in shards.chunk_bounds(y.shape[1], n)]
    parts[0] = parts[0] + p["a"]
    whole = gelu(np, sum(parts))
    return float(np.abs(sum(gelu(np, q) for q in parts) - whole).max() / np.abs(whole).max())


def flags():
    parser = bootstrap.lesson_parser(__file__, __doc__)
    parser.add_argument("--tokens", type=bootstrap.positive(int), default=TOKENS,
                        help=f"tokens, batch x sequence (default {TOKENS})")
    parser.add_argument("--hidden", type=bootstrap.positive(int), default=HIDDEN,
                        help=f"hidden size (default {HIDDEN})")
    parser.add_argument("--ffn", type=bootstrap.positive(int), default=None,
                        help=f"MLP width F (default {FFN_PER_HIDDEN} x hidden)")
    parser.add_argument("--dtype", choices=DTYPES, default="float64")
    parser.add_argument("--seed", type=int, default=SEED, help=f"weights, x and W's seed (default {SEED})")
    return parser


def main():
    args, ctx = bootstrap.start(__file__, flags())
    args.ffn = args.ffn or FFN_PER_HIDDEN * args.hidden
    n, rank, dtype = ctx.world_size, ctx.rank, np.dtype(args.dtype)
    host, x, w = make_block(args.tokens, args.hidden, args.ffn, dtype, args.seed)  # the same on every rank
    ref = graded_reference(host, x, w, args.dtype)                       # one process, NumPy; budgets
    split = {"fcols": shards.chunk_bounds(args.ffn, n), "hcols": shards.chunk_bounds(args.hidden, n),
             "rows": shards.chunk_bounds(args.tokens, n)}                # uneven where N does not divide
    row, lib = run_ways(ctx, args, host, x, w, ref, split)               # the four ways, by hand and (lib)
    every = ctx.comm.gather(row, root=0)                                 # every rank's row, to rank 0

    report.section(ctx, f"1. the split: {args.tokens} tokens x hidden {args.hidden}, MLP width "
                        f"{args.ffn}, {args.dtype}, {n} rank(s)")
    if rank == 0:
        show.split(ctx, split)                                           # who holds which columns, tokens
    report.section(ctx, "2. the collectives per block: calls (tallied) and bytes (counted)")
    if rank == 0:
        show.collectives(ctx, args, every, dtype.itemsize)               # (1) 5 + 6, (2) = (3) 2 + 2
    report.section(ctx, "3. what each rank keeps for backward, and its output")
    if rank == 0:
        show.held(ctx, every)                                            # (4) keeps 1/N of (2)'s
    report.section(ctx, "4. equal to one process: the unsplit block, on every rank")
    if rank == 0:
        show.equal(ctx, args, every, lib, gelu_of_sums(host, x, n) if n > 1 else None)
    if ctx.api == "torch":                                               # 5. torch's own plans, same block
        report.section(ctx, "5. torch's own tensor parallelism on the same block "
                            "(torch.distributed.tensor.parallel)")
        row["torch_api"] = torch_tp.torch_own(ctx, host, x, w, LN_EPS, lambda name, got: ratio(ref, name, got))
        got = ctx.comm.gather(row["torch_api"], root=0)
        if rank == 0:
            show.torch_plans(ctx, got)
    timing.syncer(ctx)()
    params = {"tokens": args.tokens, "hidden": args.hidden, "ffn": args.ffn, "dtype": args.dtype,
              "itemsize": dtype.itemsize, "seed": args.seed}
    report.finish(ctx, dict(row, ways=[{k: v for k, v in r.items() if k != "calls"} for r in row["ways"]]),
                  params=params)


if __name__ == "__main__":
    main()
