"""Lesson 11 — tensor parallelism in an MLP block (Megatron-LM), then sequence parallelism.

The idea: one transformer MLP block, z = x + GeLU(LN(x) @ A + a) @ B + b, on a (tokens x hidden)
activation x, split over N ranks so that each holds 1/N of the weights A (hidden x F) and
B (F x hidden). Four ways, each by hand, forward and backward:
  (1) naive: A and B both split by columns. Rank r computes its columns of h = GeLU(LN(x) @ A + a),
      but its columns of B need every column of h: all-gather h (tokens x F) between the layers,
      then all-gather z's columns at the end. Backward mirrors it: the gradient of h is a sum over
      ranks, of which each keeps its columns (a reduce-scatter), and dLN(x) is all-reduced.
  (2) Megatron-LM (Shoeybi et al. 2019): A by columns, B by rows. GeLU acts on each column of
      u = LN(x) @ A + a alone, and rank r holds whole columns of A, so it runs GeLU on its columns
      with no message at all. h_r @ B_r is rank r's share of z, a partial sum: one all-reduce
      after B, the operator g, makes z (and b is added once, after it). Its twin f stands before A:
      the identity forward (every rank has all of LN(x)), an all-reduce of dLN(x) backward (each
      rank's columns give a partial sum of it). One all-reduce each way per block; g's backward
      and f's forward cost nothing.
  (3) sequence parallelism (Korthikanti et al. 2022): outside A and B every token is on its own
      (layer norm, residual, bias), so there each rank keeps only its tokens. g's all-reduce falls
      apart into its two halves: a reduce-scatter after B (the sum, for my tokens only), then the
      residual and the next layer norm on my tokens, and an all-gather just before A. Backward
      swaps them. The same bytes as (2), since an all-reduce is a reduce-scatter plus an
      all-gather, for 1/N of the layer norm's and the residual's activations. The layer norm's and
      b's gradients come from my tokens alone: partial sums, all-reduced once (3 x hidden items).
  (4) (3) as Megatron-LM runs it: backward needs LN(x) of every token for dA = LN(x)^T du. (3)
      keeps the gathered copy (tokens x hidden on every rank); (4) keeps its own tokens and
      all-gathers them again in backward: one more all-gather, for 1/N of that activation too.
The collectives are the learner's own: lesson 05's ring all-reduce and lesson 09's all-gather and
reduce-scatter, on common/p2p. common/counting counts the bytes each rank sends, pass by pass, and
the lesson tallies every collective call by name and what it moved.

What to watch for:
  1. the split: the columns of A (and a), the rows of B, the tokens and the naive way's output
     columns each rank holds. The defaults (22 tokens, hidden 10, F = 4 x hidden = 40) leave
     remainders at NP 3 and 4: the shares are uneven, and every formula below is exact for them.
  2. the collectives per block (counted): each way's calls, in the order they ran, and the bytes
     each rank sent, forward and backward. x: the mean over ranks in units of (N-1)/N x tokens x
     hidden x itemsize, one all-gather of the activation: (1) 5 forward and 6 backward with
     F = 4 x hidden, (2) 2 and 2, (3) 2 and 2, (4) 2 and 3. The all-reduce is lesson 05's ring on
     chunks of whole tokens: it sends exactly what (3)'s two halves send, rank by rank.
  3. what each rank keeps for backward, measured: the bytes of the arrays each way's forward hands
     to its backward, and of its output (the next block's input). (2) keeps every token of the
     layer norm and of the output, (4) its share of the tokens; the MLP's u is 1/N already in (2).
  4. equal to one process (checked): z, dx, dA, da, dB, db, dgamma, dbeta of every way against the
     unsplit block that every rank computes alone (NumPy, in --dtype), as relative differences;
     (lib) the same four ways on the library's calls (common/collectives and the library's
     all-reduce). Tolerance: the same sums in another order than one process's; measured up to
     ~7e-16 in float64 and ~4e-7 in float32, allowed 1e-12 and 1e-5. And why g must wait for B,
     measured on this run's data: split A by rows instead and GeLU would see partial sums.
  5. on --api torch: torch's own tensor parallelism (torch.distributed.tensor.parallel:
     ColwiseParallel, RowwiseParallel, SequenceParallel on a DeviceMesh) runs the same block from
     the same weights, beside the collectives torch ran (its c10d functional ops, noted as they
     run, as CommDebugMode does).
The loss is sum(W * z) with W seeded, so dz = W on every rank, known without a message.

Run it:
  make lesson-11 NP=4                      (API=torch; ARGS="--dtype float32 --tokens 9 --ffn 30")
  .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py lessons/11_tensor_parallel.py --api mpi4py
"""
import contextlib
import math
import os
import sys
import textwrap
import types

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import bootstrap, buffers, collectives, counting, p2p, report, shards, timing  # noqa: E402

SEED = 11                 # weights, x and W come from this seed, identical on every rank
TOKENS = 22               # batch x sequence: 22 % 3 == 1, 22 % 4 == 2, so token shares are uneven
HIDDEN = 10               # 10 % 3, 10 % 4 != 0: the naive way's output columns are uneven too
FFN_PER_HIDDEN = 4        # F = 4 x hidden (40: 40 % 3 == 1), the transformer's usual MLP width
LN_EPS = 1e-5             # torch.nn.LayerNorm's default
GELU_C, GELU_K = math.sqrt(2 / math.pi), 0.044715  # GeLU's tanh form, as GPT-2's
TOL = {"float64": 1e-12, "float32": 1e-5}  # max relative difference from one process (see above)
WAYS = (("naive", "(1) naive"), ("megatron", "(2) Megatron"), ("sequence", "(3) sequence par."),
        ("sequence_regather", "(4) (3), LN(x) again"))
WIDTH_COLS = 100
ALLREDUCE = {"mpi": "MPI_Allreduce", "gloo": "gloo all_reduce", "nccl": "ncclAllReduce"}


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


def make_block(tokens, hidden, ffn, dtype):
    """The block's parameters, x and the loss weights W (so dz = W), seeded, as NumPy arrays."""
    rng = np.random.default_rng(SEED)
    p = {"gamma": 1 + 0.1 * rng.standard_normal(hidden), "beta": 0.1 * rng.standard_normal(hidden),
         "A": rng.standard_normal((hidden, ffn)) / math.sqrt(hidden), "a": 0.1 * rng.standard_normal(ffn),
         "B": rng.standard_normal((ffn, hidden)) / math.sqrt(ffn), "b": 0.1 * rng.standard_normal(hidden)}
    x, w = rng.standard_normal((tokens, hidden)), rng.standard_normal((tokens, hidden))
    return {k: v.astype(dtype) for k, v in p.items()}, x.astype(dtype), w.astype(dtype)


# ---------------------------------------------------------------- the collectives, counted and tallied
class Collectives:
    """The three collectives the ways call. By hand: lesson 05's ring all-reduce and lesson 09's
    all-gather and reduce-scatter on common/p2p; or the library's (library=True). Bytes are counted
    per pass by common/counting; every call is tallied here by name and by what it moved."""

    def __init__(self, ctx, dtype, library=False):
        self.ctx, self.n, self.rank, self.dtype, self.library = ctx, ctx.world_size, ctx.rank, dtype, library
        self.five, self.nine = bootstrap.lesson_module("05"), bootstrap.lesson_module("09")
        if library:
            lib, be = collectives.library(ctx), p2p.backend(ctx)
            self.names = dict(lib.names, all_reduce=ALLREDUCE[ctx.transport])
            self.missing = lib.missing  # {call: what stands in for it on this library}
            raw = types.SimpleNamespace(all_gather=lib.all_gather, reduce_scatter=lib.reduce_scatter,
                                        allreduce=be.allreduce, sync=lib.sync)
        else:
            raw = p2p.backend(ctx)  # exchange: Sendrecv / ncclSend+Recv / batch_isend_irecv
        self.be = counting.Counted(raw, self.n)
        self.calls, self.now = {}, "main"

    @contextlib.contextmanager
    def phase(self, name):
        self.now = name
        with self.be.phase(name):
            yield

    def _tally(self, name, what):
        self.calls.setdefault(self.now, []).append((name, what))

    def empty(self, count):
        return buffers.empty(self.ctx, count, self.dtype)

    def all_reduce(self, buf, what):
        """The sum over ranks of buf (a new array, same shape). By hand: lesson 05's ring on chunks of
        whole rows (tokens), labelled as lesson 09's halves: its reduce-scatter leaves rank r the sum
        of its own tokens, then its all-gather spreads them, so it sends what (3)'s pair sends."""
        self._tally("all_reduce", what)
        out = self.empty(buffers.size(buf))
        out[:] = buf.reshape(-1)  # a copy: the ring adds in place, and buf may be a caller's input
        if self.library:
            self.be.allreduce(out)
        else:
            rows = buf.shape[0]
            per_row = buffers.size(buf) // rows if rows else 0
            counts = [(hi - lo) * per_row for lo, hi in shards.chunk_bounds(rows, self.n)]
            scratch = self.empty(max(counts))
            self.five.ring_allreduce(out, scratch, self.nine.ring_chunks(counts, self.n), self.rank,
                                     self.n, self.be.exchange, self.five.inplace_add)
        return out.reshape(buf.shape)

    def all_gather(self, mine, counts, what):
        """Every rank's `mine` (counts[r] items from rank r), in rank order, as one vector."""
        self._tally("all_gather", what)
        out = self.empty(sum(counts))
        if self.library:
            self.be.all_gather(out, mine.reshape(-1), counts)
        else:
            self.nine.all_gather(self.be, mine.reshape(-1), out, counts, self.rank, self.n)
        return out

    def reduce_scatter(self, full, counts, what):
        """The sum over ranks of block `rank` of the vector `full` (counts[r] items in block r)."""
        self._tally("reduce_scatter", what)
        out = self.empty(counts[self.rank])
        if self.library:
            self.be.reduce_scatter(out, full.reshape(-1), counts)
        else:
            self.nine.reduce_scatter(self.be, full.reshape(-1), out, counts, self.rank, self.n)
        return out


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


# ---------------------------------------------------------------- (1) naive: every layer by columns
def naive_forward(ops, xp, p, x, fcols, hcols):
    (flo, fhi), (hlo, hhi) = fcols[ops.rank], hcols[ops.rank]
    y, saved = layer_norm(x, p["gamma"], p["beta"])
    u = y @ p["A"][:, flo:fhi] + p["a"][flo:fhi]
    h = gather_columns(ops, gelu(xp, u), fcols, "h")   # B's columns need every column of h
    mine = h @ p["B"][:, hlo:hhi] + p["b"][hlo:hhi]    # my columns of the output
    z = x + gather_columns(ops, mine, hcols, "z")       # the next block needs all of them
    return z, dict(saved, y=y, u=u, h=h)


def naive_backward(ops, xp, p, s, dz, fcols, hcols):
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
def megatron_forward(ops, xp, p, x, fcols):
    lo, hi = fcols[ops.rank]
    A, a, B = p["A"][:, lo:hi], p["a"][lo:hi], p["B"][lo:hi]  # my columns of A and a, my rows of B
    y, saved = layer_norm(x, p["gamma"], p["beta"])            # f: the identity, all of y on every rank
    # >>> exercise: megatron_forward
    u = y @ A + a
    part = gelu(xp, u) @ B                   # my columns' share of every output: a partial sum
    z = x + ops.all_reduce(part, "z (g)") + p["b"]   # g: the sum over ranks; b once, after it
    # <<< exercise: megatron_forward
    return z, dict(saved, y=y, u=u)


def megatron_backward(ops, xp, p, s, dz, fcols):
    lo, hi = fcols[ops.rank]
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
def sequence_forward(ops, xp, p, x, fcols, rows, keep):
    """x: my tokens. keep: hand backward the gathered LN(x) of every token (3), or my tokens' (4)."""
    lo, hi = fcols[ops.rank]
    A, a, B = p["A"][:, lo:hi], p["a"][lo:hi], p["B"][lo:hi]
    y, saved = layer_norm(x, p["gamma"], p["beta"])            # my tokens only
    # >>> exercise: sequence_forward
    every = gather_tokens(ops, y, rows, "LN(x)")    # A's columns need every token
    u = every @ A + a
    z = x + scatter_tokens(ops, gelu(xp, u) @ B, rows, "z") + p["b"]  # the sum, for my tokens
    # <<< exercise: sequence_forward
    return z, dict(saved, y=every if keep else y, u=u)


def sequence_backward(ops, xp, p, s, dz, fcols, rows, keep):
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


# ---------------------------------------------------------------- one way, run and graded
def rel_err(got, want):
    """max |got - want| / max |want| (0 for empty arrays), got from any device."""
    got = buffers.to_host(got)
    if want.size == 0:
        return 0.0
    return float(np.abs(got.astype(np.float64) - want).max() / max(float(np.abs(want).max()), 1e-300))


def held_bytes(saved, z):
    """Measured: the bytes of the arrays a forward handed its backward, by part, and of its output."""
    parts = {"LN": ("xhat", "rstd"), "input": ("y",), "MLP": ("u", "h")}
    out = {part: sum(buffers.nbytes(saved[k]) for k in keys if k in saved) for part, keys in parts.items()}
    out["output"] = buffers.nbytes(z)
    return out


def run_way(way, ops, xp, p, x, dz, split):
    """Forward and backward of one way; returns (z, dx, grads, held) as this rank holds them."""
    fcols, hcols, rows = split["fcols"], split["hcols"], split["rows"]
    lo, hi = rows[ops.rank]
    with ops.phase("forward"):
        if way == "naive":
            z, saved = naive_forward(ops, xp, p, x, fcols, hcols)
        elif way == "megatron":
            z, saved = megatron_forward(ops, xp, p, x, fcols)
        else:
            z, saved = sequence_forward(ops, xp, p, x[lo:hi], fcols, rows, way == "sequence")
    held = held_bytes(saved, z)
    with ops.phase("backward"):
        if way == "naive":
            dx, grads = naive_backward(ops, xp, p, saved, dz, fcols, hcols)
        elif way == "megatron":
            dx, grads = megatron_backward(ops, xp, p, saved, dz, fcols)
        else:
            dx, grads = sequence_backward(ops, xp, p, saved, dz[lo:hi], fcols, rows, way == "sequence")
    ops.be.sync()  # gpu: nccl is async; the host reads the results next
    return z, dx, grads, held


def errors(way, rank, split, ref, z, dx, grads):
    """Relative differences from one process: each array against the same slice of the reference."""
    (flo, fhi), (hlo, hhi), (tlo, thi) = (split[k][rank] for k in ("fcols", "hcols", "rows"))
    zref, dxref, g = ref
    cols = slice(hlo, hhi) if way == "naive" else slice(None)  # the naive way's B and b: my columns
    rows = slice(tlo, thi) if way.startswith("sequence") else slice(None)  # (3), (4): my tokens
    return {"z_err": rel_err(z, zref[rows]), "dx_err": rel_err(dx, dxref[rows]),
            "dA_err": max(rel_err(grads["dA"], g["dA"][:, flo:fhi]), rel_err(grads["da"], g["da"][flo:fhi])),
            "dB_err": max(rel_err(grads["dB"], g["dB"][flo:fhi] if way != "naive" else g["dB"][:, cols]),
                          rel_err(grads["db"], g["db"][cols])),
            "dln_err": max(rel_err(grads["dgamma"], g["dgamma"]), rel_err(grads["dbeta"], g["dbeta"]))}


def calls_of(ops, phase):
    return " ".join(name for name, _ in ops.calls.get(phase, []))


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


# ---------------------------------------------------------------- (5) torch's own tensor parallelism
def torch_block(torch, p, dtype, device):
    """torch.nn modules holding the same weights (torch keeps a Linear's weight as out x in)."""
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            hidden, ffn = p["A"].shape
            self.ln = torch.nn.LayerNorm(hidden, eps=LN_EPS, dtype=dtype, device=device)
            self.fc1 = torch.nn.Linear(hidden, ffn, dtype=dtype, device=device)
            self.fc2 = torch.nn.Linear(ffn, hidden, dtype=dtype, device=device)

        def forward(self, x):
            h = torch.nn.functional.gelu(self.fc1(self.ln(x)), approximate="tanh")
            return x + self.fc2(h)
    block = Block()
    with torch.no_grad():
        for param, value in ((block.ln.weight, p["gamma"]), (block.ln.bias, p["beta"]),
                             (block.fc1.weight, p["A"].T), (block.fc1.bias, p["a"]),
                             (block.fc2.weight, p["B"].T), (block.fc2.bias, p["b"])):
            param.copy_(torch.from_numpy(np.ascontiguousarray(value)))
    return block


def collectives_seen(torch):
    """A dispatch mode that notes every collective DTensor runs (the c10d functional ops under it), as
    torch's own CommDebugMode does, without the 2 s that importing CommDebugMode costs each rank."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.calls = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            space, _, name = func._schema.name.partition("::")
            if space == "_c10d_functional" and name != "wait_tensor" and not name.startswith("_"):
                self.calls.append(name)
            return func(*args, **(kwargs or {}))
    return Seen


def torch_own(ctx, p, x, w, ref):
    """torch.distributed.tensor.parallel on the same block: (2) as ColwiseParallel + RowwiseParallel,
    (3) with SequenceParallel around them. Returns, per way, the relative difference from one process
    (z, dx, every gradient), the collectives torch ran forward and backward, and my share of tokens."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, SequenceParallel,
                                                   parallelize_module)
    device = "cuda" if ctx.device == "gpu" else "cpu"
    mesh = init_device_mesh(device, (ctx.world_size,))
    dtype, seen = getattr(torch, x.dtype.name), collectives_seen(torch)
    plans = {  # use_local_output=False: a DTensor knows its uneven shards, a plain local tensor does not
        "megatron": {"fc1": ColwiseParallel(use_local_output=False), "fc2": RowwiseParallel()},
        "sequence": {"ln": SequenceParallel(sequence_dim=0, use_local_output=False),
                     "fc1": ColwiseParallel(input_layouts=Shard(0), use_local_output=False),
                     "fc2": RowwiseParallel(output_layouts=Shard(0), use_local_output=False)}}

    def full(t):
        t = t.full_tensor() if isinstance(t, DTensor) else t
        return t.detach().cpu().numpy()
    out = []
    for way, plan in plans.items():
        block = parallelize_module(torch_block(torch, p, dtype, device), mesh, plan)
        xt, wt = (torch.from_numpy(a).to(device) for a in (x, w))
        if way == "sequence":  # tokens sharded the way torch cuts them (torch.chunk: ceil first)
            xt, wt = (distribute_tensor(t, mesh, [Shard(0)]) for t in (xt, wt))
        xt.requires_grad_()
        with seen() as fwd:
            z = block(xt)
        loss = (z * wt).sum()
        with seen() as bwd:
            loss.backward()
        partial = [name for name, prm in block.named_parameters()  # left as a sum still to be made
                   if any(pl.is_partial() for pl in getattr(prm.grad, "placements", ()))]
        zref, dxref, g = ref
        got = {"dA": full(block.fc1.weight.grad).T, "da": full(block.fc1.bias.grad),
               "dB": full(block.fc2.weight.grad).T, "db": full(block.fc2.bias.grad),
               "dgamma": full(block.ln.weight.grad), "dbeta": full(block.ln.bias.grad)}
        err = max([rel_err(full(z), zref), rel_err(full(xt.grad), dxref)]
                  + [rel_err(got[k], g[k]) for k in got])
        out.append({"way": way, "err": err, "forward_calls": " ".join(fwd.calls),
                    "backward_calls": " ".join(bwd.calls), "partial_grads": " ".join(partial),
                    "tokens_held": xt.to_local().shape[0] if isinstance(xt, DTensor) else x.shape[0]})
    return out


# ---------------------------------------------------------------- what rank 0 prints
def span(bounds):
    lo, hi = bounds
    return f"{lo}:{hi} ({hi - lo})"


def per_rank(values):
    """A row's per-rank numbers: all of them up to 4 ranks, else lowest .. highest."""
    values = list(values)
    if len(set(values)) == 1:
        return f"{values[0]} each"
    return " ".join(map(str, values)) if len(values) <= 4 else f"{min(values)} .. {max(values)}"


def show_split(ctx, split):
    rows = [(r, span(split["fcols"][r]), span(split["fcols"][r]), span(split["rows"][r]),
             span(split["hcols"][r])) for r in range(ctx.world_size)]
    print(report.table(["rank", "A, a: columns", "B: rows", "(3), (4): tokens", "(1): B, b, z columns"],
                       rows, align=[True, False, False, False, False]))
    print("(2) adds b once, after g's sum (every rank holds the same sum); (3) and (4) add it to the sum\n"
          "for my tokens, after the reduce-scatter; (1) adds my columns of b to my columns of z",
          flush=True)


SHORT = {"all_reduce": "AR", "all_gather": "AG", "reduce_scatter": "RS"}


def show_collectives(ctx, args, every, itemsize):
    n = ctx.world_size
    unit = (n - 1) * args.tokens * args.hidden * itemsize  # N x one all-gather of the activation
    rows = []
    for i, (way, label) in enumerate(WAYS):
        mine = [r["ways"][i] for r in every]
        for ph in ("forward", "backward", "grads"):
            sent = [m[f"{ph}_bytes"] for m in mine]
            said = ", ".join(f"{SHORT[name]} {what}" for name, what in mine[0]["calls"].get(ph, []))
            if ph == "grads" and not said:
                continue
            rows.append((label if ph == "forward" else "", ph, said or "-", per_rank(sent),
                         f"{sum(sent) / unit:.2f}" if unit else "-"))
    print(report.table(["way", "pass", "collectives, in order", "bytes sent per rank", "x"], rows,
                       align=[False, False, False, True, True]))
    print(f"AG all-gather, RS reduce-scatter, AR all-reduce (lesson 05's ring on whole tokens);\n"
          f"bytes: counted by common/counting; x: mean per rank in units of (N-1)/N x tokens x hidden "
          f"x {itemsize} B", flush=True)
    if n == 1:
        print("one rank: every collective is called, and sends nothing")
        return
    same = all(r["ways"][1][f"{ph}_bytes"] == r["ways"][2][f"{ph}_bytes"] for r in every
               for ph in ("forward", "backward"))
    if same:
        print("(2) and (3) send the same bytes on every rank: g's all-reduce = (3)'s reduce-scatter "
              "+ all-gather")
    total = {(i, ph): sum(r["ways"][i][f"{ph}_bytes"] for r in every) for i in (0, 1)
             for ph in ("forward", "backward")}
    if total[1, "forward"] and total[1, "backward"]:
        print(f"(1) sends {total[0, 'forward'] / total[1, 'forward']:.2f} x (2)'s bytes forward and "
              f"{total[0, 'backward'] / total[1, 'backward']:.2f} x backward: it moves h, tokens x F "
              f"(F = {args.ffn}),\nwhere (2) moves only sums of tokens x hidden")
    print(end="", flush=True)


def show_held(ctx, every):
    rows = []
    for i, (way, label) in enumerate(WAYS):
        h = every[0]["ways"][i]["held"]
        rows.append((label, h["LN"], h["input"], h["MLP"], h["output"],
                     per_rank(r["ways"][i]["held_bytes"] for r in every)))
    print(report.table(["way", "LN: x-hat, 1/sigma", "A's input", "MLP: u (h)", "output z",
                        "total, every rank"], rows, align=[False, True, True, True, True, True]))
    print("rank 0's parts; the last column is every rank's total (bytes, measured: the arrays each\n"
          "forward hands to its backward, and its output)", flush=True)
    if ctx.world_size > 1:
        r0 = every[0]["ways"]
        keep = [r0[k]["held"]["LN"] + r0[k]["held"]["input"] + r0[k]["held"]["output"] for k in (1, 3)]
        mine, tokens = r0[3]["tokens_held"], every[0]["tokens"]
        print(f"in (4) rank 0 keeps {keep[1] / keep[0]:.3f} of (2)'s LN, input and output bytes; its "
              f"share of the tokens:\n{mine}/{tokens} = {mine / tokens:.3f}")
    print(end="", flush=True)


def show_equal(ctx, args, every, lib, gap):
    heads = ["way", "z", "dx", "dA, da", "dB, db", "dgamma, dbeta", "(lib) all"]
    rows = []
    for i, (way, label) in enumerate(WAYS):
        worst = {k: max(r["ways"][i][k] for r in every) for k in ("z_err", "dx_err", "dA_err", "dB_err",
                                                                    "dln_err")}
        rows.append([label] + list(worst.values()) + [max(r["library"][i]["err"] for r in every)])
    print(report.table(heads, rows, align=[False] + [True] * 6))
    print(f"max relative difference over ranks; tolerance {TOL[args.dtype]:g} ({args.dtype}): the same "
          "sums in\nanother order than one process's (the ranks' partial sums; (1) adds b before x)")
    names = [lib.names[k] for k in ("all_reduce", "all_gather", "reduce_scatter")]
    print(textwrap.fill(f"(lib): the same code on {', '.join(names)}" + (
        " (MPI_Allgatherv, MPI_Reduce_scatter for uneven blocks)" if ctx.transport == "mpi" else ""),
        WIDTH_COLS, subsequent_indent="  "))
    for call in ("all_gather", "reduce_scatter"):
        if call in lib.missing:
            print(textwrap.fill(f"  {lib.missing[call]}", WIDTH_COLS, subsequent_indent="  "))
    if gap is not None and gap > TOL[args.dtype]:
        print(f"g waits for B: GeLU acts on each column of u alone, and each rank holds whole columns of "
              f"A.\nSplit A by rows instead and u is a sum over ranks: here GeLU(sum) and the sum of "
              f"GeLUs\ndiffer by {gap:.3g} (relative), so the sum must come first", flush=True)


TORCH_SHORT = {"all_reduce": "AR", "all_gather_into_tensor": "AG", "reduce_scatter_tensor": "RS"}


def show_torch(ctx, got):
    rows = []
    for r0 in got[0]:
        way = r0["way"]
        calls = [", ".join(TORCH_SHORT.get(c, c) for c in r0[f"{ph}_calls"].split()) or "-"
                 for ph in ("forward", "backward")]
        rows.append(("(2) ColwiseParallel + RowwiseParallel" if way == "megatron" else
                     "(3) the same + SequenceParallel", max(g["err"] for mine in got for g in mine
                                                            if g["way"] == way), *calls))
    print(report.table(["torch's plan", "max rel diff", "forward", "backward"], rows,
                       align=[False, True, False, False]))
    shares = [mine[1]["tokens_held"] for mine in got]
    print("the same weights; relative difference from one process over z, dx and every gradient;\n"
          "forward, backward: the collectives torch ran (its c10d functional ops, rank 0's)\n"
          f"torch cuts the tokens as torch.chunk does: {' '.join(map(str, shares))}", flush=True)
    partial = got[0][1]["partial_grads"]
    if partial:
        print(f"in (3) torch leaves the gradients of {', '.join(partial.split())} as Partial(sum) "
              "DTensors:\nsummed over ranks only when read (full_tensor here), where (3) all-reduces "
              "them at once", flush=True)


def main():
    parser = bootstrap.lesson_parser(__file__, __doc__)
    parser.add_argument("--tokens", type=bootstrap.positive(int), default=TOKENS,
                        help=f"tokens, batch x sequence (default {TOKENS})")
    parser.add_argument("--hidden", type=bootstrap.positive(int), default=HIDDEN,
                        help=f"hidden size (default {HIDDEN})")
    parser.add_argument("--ffn", type=bootstrap.positive(int), default=None,
                        help=f"MLP width F (default {FFN_PER_HIDDEN} x hidden)")
    parser.add_argument("--dtype", choices=sorted(TOL), default="float64")
    args, ctx = bootstrap.start(__file__, parser)
    args.ffn = args.ffn or FFN_PER_HIDDEN * args.hidden
    n, rank = ctx.world_size, ctx.rank
    xp = buffers.array_module(ctx)  # numpy, cupy or torch (one thread per rank)
    dtype = np.dtype(args.dtype)
    host, x, w = make_block(args.tokens, args.hidden, args.ffn, dtype)
    ref = reference(host, x, w)  # one process, NumPy, in --dtype
    p = {k: buffers.on_device(ctx, v) for k, v in host.items()}
    xd, dz = buffers.on_device(ctx, x), buffers.on_device(ctx, w)
    split = {"fcols": shards.chunk_bounds(args.ffn, n), "hcols": shards.chunk_bounds(args.hidden, n),
             "rows": shards.chunk_bounds(args.tokens, n)}
    lo, hi = split["rows"][rank]

    ways, library = [], []
    for way, _ in WAYS:
        ops = Collectives(ctx, dtype)
        z, dx, grads, held = run_way(way, ops, xp, p, xd, dz, split)
        ways.append({"way": way, **errors(way, rank, split, ref, z, dx, grads),
                     **{f"{ph}_calls": calls_of(ops, ph) for ph in ("forward", "backward", "grads")},
                     **{f"{ph}_bytes": ops.be.total(phases=[ph]) for ph in ("forward", "backward", "grads")},
                     "held": held, "held_bytes": sum(held.values()),
                     "tokens_held": hi - lo if way.startswith("sequence") else args.tokens,
                     "calls": ops.calls})
        lib = Collectives(ctx, dtype, library=True)
        z, dx, grads, _ = run_way(way, lib, xp, p, xd, dz, split)
        library.append({"way": way, "err": max(errors(way, rank, split, ref, z, dx, grads).values()),
                        "calls": " | ".join(calls_of(lib, ph) for ph in ("forward", "backward"))})
    row = {"ways": [{k: v for k, v in r.items() if k != "calls"} for r in ways], "library": library,
           "tokens": args.tokens}

    report.section(ctx, f"1. the split: {args.tokens} tokens x hidden {args.hidden}, MLP width "
                        f"{args.ffn}, {args.dtype}, {n} rank(s)")
    if rank == 0:
        print("z = x + GeLU(LN(x) @ A + a) @ B + b, A: hidden x F, B: F x hidden; loss = sum(W * z), "
              "W seeded,\nso dz = W on every rank without a message", flush=True)
        show_split(ctx, split)
    every = ctx.comm.gather(dict(row, ways=ways), root=0)
    report.section(ctx, "2. the collectives per block: calls (tallied) and bytes (counted)")
    if rank == 0:
        show_collectives(ctx, args, every, dtype.itemsize)
    report.section(ctx, "3. what each rank keeps for backward, and its output")
    if rank == 0:
        show_held(ctx, every)
    report.section(ctx, "4. equal to one process: the unsplit block, on every rank")
    if rank == 0:
        show_equal(ctx, args, every, lib, gelu_of_sums(host, x, n) if n > 1 else None)

    if ctx.api == "torch":
        report.section(ctx, "5. torch's own tensor parallelism on the same block "
                            "(torch.distributed.tensor.parallel)")
        mine = torch_own(ctx, host, x, w, ref)
        row["torch_api"] = mine
        got = ctx.comm.gather(mine, root=0)
        if rank == 0:
            show_torch(ctx, got)
    timing.syncer(ctx)()
    params = {"tokens": args.tokens, "hidden": args.hidden, "ffn": args.ffn, "dtype": args.dtype,
              "itemsize": dtype.itemsize, "tol": TOL[args.dtype]}
    report.finish(ctx, row, params=params)


if __name__ == "__main__":
    main()
