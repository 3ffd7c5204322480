"""Lesson 10 — ZeRO-3 / FSDP by hand: each rank keeps 1/N of the model, gathers a layer only to use it.

The idea: data parallelism (lesson 08) keeps a whole copy of the parameters, the gradients and the
optimizer state on every rank, and all-reduces the gradients. ZeRO stage 3 (DeepSpeed) and FSDP
(torch) keep on each rank only a shard of all three. Here each layer's parameters (weight, then bias)
are one flat vector, padded with zeros to a multiple of N and cut into N equal shards, one per rank.
  forward   all-gather the layer's parameters just before it runs; free them right after
  backward  all-gather them again (forward freed them), compute this rank's gradient of the whole layer
            on its slice of the batch, then reduce-scatter it: each rank keeps the sum over ranks of
            its own shard's gradient, and frees the rest
  step      the optimizer (SGD, then Adam) updates each shard alone: both are elementwise, so N shard
            steps are the full step, and Adam's moments too live only for the shard (1/N of them)
The collectives are lesson 09's ring all-gather and reduce-scatter, counted phase by phase.

What to watch for: 1. the shards: per layer its items, the padded size and what each rank holds (the
last shard ends in padding: zeros whose gradient is 0). 2. a seeded MLP trained SGD then Adam four
ways ends equal: (a) ZeRO-3 by hand, (b) one process on the whole batch, (c) data parallelism (each
layer's gradient reduce-scattered, then all-gathered), (d) (a)'s code on the library's all-gather and
reduce-scatter, which take one count for every rank: the padding to equal shards is what lets FSDP
call them. 3. the ZeRO table: bytes sent per step, phase by phase, in units of one ring all-gather of
the padded parameters (ZeRO-3: 1 in forward, 2 in backward; data parallelism: 2, all in backward),
and the bytes held, measured (ZeRO-3: my shards plus one gathered layer). 4. on --api torch, torch's
own FSDP (fully_shard) trains the same model from the same weights and must end where (a) ends.

Run it:
  make lesson-10 NP=4                      (API=torch; ARGS="--dtype float32 --sizes 5,9,2")
  .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py lessons/10_zero3_fsdp.py --api mpi4py
Next: lesson 12 pipelines this MLP. torch's FSDP: zero3_fsdp/torch_fsdp.py; the tables: zero3_fsdp/show.py
"""
import math
import os
import sys
import types
import weakref

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import bootstrap, buffers, collectives, counting, p2p, report, shards, timing, tolerance  # noqa: E402
from lessons.zero3_fsdp import budget, show, torch_fsdp  # noqa: E402

nine = bootstrap.lesson_module("09")  # reduce_scatter, all_gather: the ring halves lesson 09 built

SEED = 10                 # weights and data come from this seed (--seed), identical on every rank
SIZES = "6,13,11,9,7,3"   # MLP widths, tanh between; layer items 91, 154, 108, 70, 24 (447)
BATCH = 50                # global batch: 50 % 3 == 2, 50 % 4 == 2, so the slices are uneven at NP 3, 4
SGD_STEPS, ADAM_STEPS = 3, 3
LR_SGD, LR_ADAM = 0.1, 0.01
B1, B2, EPS = 0.9, 0.999, 1e-8  # Adam's betas and eps, as torch.optim.Adam's defaults
DTYPES = ("float32", "float64")  # graded against common/tolerance.py's budget (zero3_fsdp/budget.py)


# ---------------------------------------------------------------- the shards
def pad_and_shard(flat, rank, n):
    """This rank's shard of a layer's flat parameters: N equal shards of ceil(items / N), the flat
    vector padded with zeros to N of them (equal counts: every all-gather and reduce-scatter is even)."""
    # >>> exercise: pad_and_shard
    size = -(-flat.size // n)                  # ceil(items / N)
    padded = np.zeros(size * n, flat.dtype)    # zeros past the end: their gradient is 0, they stay 0
    padded[:flat.size] = flat
    return padded[rank * size:(rank + 1) * size].copy()
    # <<< exercise: pad_and_shard


# ---------------------------------------------------------------- the model, one layer at a time
def layer_dims(sizes):
    """[(fan_in, fan_out)] of the MLP's linear layers."""
    return list(zip(sizes[:-1], sizes[1:]))


def layer_items(fan_in, fan_out):
    return (fan_in + 1) * fan_out  # weight (fan_in x fan_out), then bias (fan_out)


def init_flats(sizes, dtype, seed=SEED):
    """Each layer's parameters as one flat NumPy vector: weight row by row, then bias. Seeded."""
    rng = np.random.default_rng(seed)
    flats = []
    for fan_in, fan_out in layer_dims(sizes):
        w = rng.standard_normal((fan_in, fan_out)) / math.sqrt(fan_in)
        b = 0.1 * rng.standard_normal(fan_out)
        flats.append(np.concatenate([w.ravel(), b]).astype(dtype))
    return flats


def make_data(sizes, batch, dtype, seed=SEED):
    rng = np.random.default_rng(seed + 1)
    x = rng.standard_normal((batch, sizes[0]))
    t = np.tanh(x @ rng.standard_normal((sizes[0], sizes[-1])))
    return x.astype(dtype), t.astype(dtype)


def unflatten(flat, fan_in, fan_out):
    """Views of a layer's weight and bias in its flat parameters (padding past the end is ignored)."""
    k = fan_in * fan_out
    return flat[:k].reshape(fan_in, fan_out), flat[k:k + fan_out]


def forward_layer(xp, x, flat, fan_in, fan_out, last):
    w, b = unflatten(flat, fan_in, fan_out)
    y = x @ w + b
    return y if last else xp.tanh(y)


def backward_layer(x, y, gy, flat, grad, fan_in, fan_out, last):
    """Given d loss / d y for this layer's output y = act(x @ w + b), write d loss / d (w, b) into the
    flat `grad` (same layout as `flat`) and return d loss / d x. xp-free: NumPy, CuPy and torch alike."""
    w, _ = unflatten(flat, fan_in, fan_out)
    gz = gy if last else gy * (1 - y * y)  # tanh' = 1 - tanh^2
    gw, gb = unflatten(grad, fan_in, fan_out)
    gw[...] = x.T @ gz
    gb[...] = gz.sum(0)
    return gz @ w.T


def loss_grad(y, t, batch):
    """d loss / d y for loss = sum over the GLOBAL batch of |y - t|^2, divided by B_global: each rank's
    local loss is its samples' sum / B_global, so the sums over ranks need no division by N."""
    return 2 * (y - t) / batch


def new_held():
    return {k: Held() for k in ("params", "grads", "state")}


def zeros(ctx, count, dtype):
    return buffers.on_device(ctx, np.zeros(count, dtype))


# ---------------------------------------------------------------- (a) ZeRO-3 by hand
def fsdp_train(ctx, xp, be, nine, flats, dims, x, t, batch, schedule, held):
    """(a) ZeRO-3 on this rank's batch slice (x, t). Returns host copies of my shards after each step;
    per layer: the bytes counted in forward and backward, my shard's items, Adam's bytes for it."""
    n, rank, dtype = ctx.world_size, ctx.rank, flats[0].dtype
    mine = []
    for flat in flats:
        host = pad_and_shard(flat, rank, n)
        assert host.size * n >= flat.size, (
            f"{n} shards of {host.size} items hold {host.size * n} of a layer's {flat.size} parameters: "
            "the rest are lost; pad the flat vector to a multiple of N")
        mine.append(held["params"](buffers.on_device(ctx, host)))
    counts = [[buffers.size(s)] * n for s in mine]
    gshards = [held["grads"](zeros(ctx, buffers.size(s), dtype)) for s in mine]
    state = [None] * len(dims)
    sent = [{"forward": 0, "backward": 0} for _ in dims]
    after = []

    def gather(layer):
        """All-gather a layer's full (padded) parameters into a new buffer, just before use."""
        full = held["params"](buffers.empty(ctx, n * buffers.size(mine[layer]), dtype))
        nine.all_gather(be, mine[layer], full, counts[layer], rank, n)  # lesson 09's ring
        return full

    last = len(dims) - 1
    for opt, lr, t_adam in schedule:
        acts = [x]
        with be.phase("forward"):
            for layer, (fan_in, fan_out) in enumerate(dims):
                before = be.total()
                # >>> exercise: forward
                full = gather(layer)    # the whole layer, just before it runs
                acts.append(forward_layer(xp, acts[-1], full, fan_in, fan_out, layer == last))
                del full                # and freed: from here on I hold only my shard
                # <<< exercise: forward
                sent[layer]["forward"] += be.total() - before
        gy = loss_grad(acts[-1], t, batch)
        with be.phase("backward"):
            for layer in reversed(range(len(dims))):
                fan_in, fan_out = dims[layer]
                before = be.total()
                # >>> exercise: backward
                full = gather(layer)    # again: forward freed it
                grad = held["grads"](zeros(ctx, buffers.size(full), dtype))  # my slice's, whole layer
                gy = backward_layer(acts[layer], acts[layer + 1], gy, full, grad, fan_in, fan_out,
                                    layer == last)
                del full
                nine.reduce_scatter(be, grad, gshards[layer], counts[layer], rank, n)  # my shard's sum
                del grad
                # <<< exercise: backward
                sent[layer]["backward"] += be.total() - before
        with be.phase("step"):
            for layer, (p, g) in enumerate(zip(mine, gshards)):
                # >>> exercise: sharded_step
                if opt == "sgd":
                    p -= lr * g                   # my shard, with the sum of its gradient over ranks
                    continue
                if state[layer] is None:          # Adam's moments, for my shard only
                    state[layer] = [held["state"](zeros(ctx, buffers.size(p), dtype)) for _ in "mv"]
                m, v = state[layer]
                m *= B1
                m += (1 - B1) * g
                v *= B2
                v += (1 - B2) * g * g
                p -= lr / (1 - B1 ** t_adam) * m / ((v / (1 - B2 ** t_adam)) ** 0.5 + EPS)
                # <<< exercise: sharded_step
        be.sync()  # gpu: nccl is async; the host reads the shards next
        after.append([buffers.to_host(s).copy() for s in mine])
    moments = [sum(buffers.nbytes(a) for a in s) if s else 0 for s in state]
    return after, sent, [buffers.size(s) for s in mine], moments


def gathered(ctx, host_shards, flats):
    """The full parameters from every rank's host shards (plain MPI, uncounted: for checking only)."""
    every = ctx.comm.allgather(host_shards)
    return [np.concatenate([r[k] for r in every])[:flat.size] for k, flat in enumerate(flats)]


# ---------------------------------------------------------------- bytes held, measured
class Held:
    """The bytes this rank holds in arrays of one kind, measured: an array counts from hold() until
    Python frees it (weakref.finalize), so a buffer kept alive by mistake shows in the peak."""

    def __init__(self):
        self.now = self.peak = 0

    def __call__(self, buf):
        nbytes = buffers.nbytes(buf)
        self.now += nbytes
        self.peak = max(self.peak, self.now)
        weakref.finalize(buf, self._drop, nbytes)
        return buf

    def _drop(self, nbytes):
        self.now -= nbytes


# ---------------------------------------------------------------- (b) one process, (c) data parallel
def reference_train(ctx, xp, flats, dims, x, t, batch, schedule, allreduce=None, held=None):
    """Whole parameters on every rank. (b): the whole batch, allreduce=None. (c): my slice of the batch,
    each layer's gradient all-reduced. Its own SGD and Adam (written as torch.optim.Adam computes it).
    Returns host copies of the parameters after each step."""
    keep = held or {k: (lambda buf: buf) for k in ("params", "grads", "state")}
    n = ctx.world_size if allreduce else 1
    params = [keep["params"](buffers.on_device(ctx, f.copy())) for f in flats]
    state, after, last = None, [], len(dims) - 1
    for opt, lr, t_adam in schedule:
        acts = [x]
        for layer, (fan_in, fan_out) in enumerate(dims):
            acts.append(forward_layer(xp, acts[-1], params[layer], fan_in, fan_out, layer == last))
        gy, grads = loss_grad(acts[-1], t, batch), [None] * len(dims)
        for layer in reversed(range(len(dims))):
            fan_in, fan_out = dims[layer]
            padded = -(-layer_items(fan_in, fan_out) // n) * n  # ring all-reduce in N equal chunks
            grads[layer] = keep["grads"](zeros(ctx, padded, flats[0].dtype))
            gy = backward_layer(acts[layer], acts[layer + 1], gy, params[layer], grads[layer], fan_in,
                                fan_out, layer == last)
            if allreduce:
                allreduce(grads[layer])
        if opt == "adam" and state is None:
            state = [[keep["state"](zeros(ctx, f.size, f.dtype)) for _ in "mv"] for f in flats]
        for layer, p in enumerate(params):
            g = grads[layer][:p.shape[0]]
            if opt == "sgd":
                p -= lr * g
                continue
            m, v = state[layer]
            m *= B1
            m += (1 - B1) * g
            v *= B2
            v += (1 - B2) * g * g
            p -= (lr / (1 - B1 ** t_adam)) * m / (v ** 0.5 / math.sqrt(1 - B2 ** t_adam) + EPS)
        timing.syncer(ctx)()  # gpu: the host reads the parameters next
        after.append([buffers.to_host(p).copy() for p in params])
    return after


def ring_allreduce(ctx, be, nine, buf, dtype):
    """All-reduce = reduce-scatter, then all-gather (lesson 09), on N equal chunks of `buf`."""
    n, rank = ctx.world_size, ctx.rank
    chunk = buffers.size(buf) // n
    mine = buffers.empty(ctx, chunk, dtype)
    nine.reduce_scatter(be, buf, mine, [chunk] * n, rank, n)
    nine.all_gather(be, mine, buf, [chunk] * n, rank, n)


# (d): lesson 09's signatures on the library's own calls, so fsdp_train runs unchanged on them
ON_LIBRARY = types.SimpleNamespace(
    all_gather=lambda be, send, recv, counts, rank, n: be.all_gather(recv, send, counts),
    reduce_scatter=lambda be, send, recv, counts, rank, n: be.reduce_scatter(recv, send, counts))


def library_backend(ctx, n):
    """The library's all-gather and reduce-scatter (common/collectives), counted; its all-reduce too."""
    lib, be = collectives.library(ctx), p2p.backend(ctx)
    calls = types.SimpleNamespace(all_gather=lib.all_gather, reduce_scatter=lib.reduce_scatter,
                                  allreduce=be.allreduce, sync=lib.sync)
    return lib, counting.Counted(calls, n, rules=lib.rules)  # rules: gloo's reduce-scatter is an all-reduce


# ---------------------------------------------------------------- what the run reports
def max_diff(a, b):
    return max(float(np.abs(p - q).max()) if p.size else 0.0 for p, q in zip(a, b))


def ratio(a, b, bound):
    """The worst parameter's |a - b| / its budget (lessons/zero3_fsdp/budget.py), over every layer."""
    return tolerance.worst_ratio(np.concatenate(a).astype(np.float64) - np.concatenate(b), bound)


def compare(name, a, b, bound):
    """{name: max |a - b|, name_ratio: the worst parameter's |a - b| / budget}."""
    return {name: max_diff(a, b), f"{name}_ratio": ratio(a, b, bound)}


def oracle(ctx, args, flats, dims, schedule):
    """The budget of |one training - another| per parameter (lessons/zero3_fsdp/budget.py, from an
    exact replay of the run): rank 0's, sent to every rank (plain MPI, uncounted)."""
    x, t = make_data(args.sizes, args.batch, flats[0].dtype, args.seed)
    bound = budget.trajectory(flats, dims, x, t, args.batch, schedule, args.dtype, ctx.world_size, (B1, B2, EPS)) \
        if ctx.rank == 0 else None
    return ctx.comm.bcast(bound, root=0)


def results(ctx, args, dims, trained, full_a, after_b, after_c, full_d, counted, held, held_dp, bound):
    """This rank's results row: how far the trainings end apart (and against the budget `bound`),
    bytes sent per step (counted), bytes held (measured). trained: fsdp_train's (after, sent, shard
    sizes, moments); counted: (a)'s, (c)'s, (d)'s Counted backends."""
    _, sent, sizes_held, moments = trained
    be, be_dp, be_lib = counted
    steps, itemsize = args.sgd_steps + args.adam_steps, np.dtype(args.dtype).itemsize
    at_sgd, shard_bytes = args.sgd_steps - 1, sum(sizes_held) * itemsize
    layers = [{"items": layer_items(fan_in, fan_out), "shard": size, "state_bytes": moments[k],
               "forward_bytes": sent[k]["forward"] // steps, "backward_bytes": sent[k]["backward"] // steps}
              for k, ((fan_in, fan_out), size) in enumerate(zip(dims, sizes_held))]
    per_step = {name: {ph: c.total(phases=[ph]) // steps for ph in ("forward", "backward", "step")}
                for name, c in (("sent", be), ("dp_sent", be_dp), ("library_sent", be_lib))}
    row = {"sgd_vs_single": max_diff(full_a[at_sgd], after_b[at_sgd]) if args.sgd_steps else None,
           **compare("end_vs_single", full_a[-1], after_b[-1], bound),
           **compare("end_vs_dp", full_a[-1], after_c[-1], bound),
           "dp_vs_single": max_diff(after_c[-1], after_b[-1]),
           **compare("library_vs_single", full_d, after_b[-1], bound),
           "budget_max": float(bound.max(initial=0)), "budget_median": float(np.median(bound)),
           "layers": layers, "shard_bytes": shard_bytes,
           "peak_param_bytes": held["params"].peak, "peak_gathered_bytes": held["params"].peak - shard_bytes,
           "peak_grad_bytes": held["grads"].peak, "peak_layer_grad_bytes": held["grads"].peak - shard_bytes,
           "state_bytes": held["state"].peak,
           "dp_param_bytes": held_dp["params"].peak, "dp_grad_bytes": held_dp["grads"].peak,
           "dp_state_bytes": held_dp["state"].peak, **per_step,
           "comm": {"zero3": be.counts, "dp": be_dp.counts, "zero3_library": be_lib.counts}}
    row["library_total"] = sum(row["library_sent"].values())
    dp_per_step = be_dp.total() // steps
    row["zero3_over_dp"] = sum(row["sent"].values()) / dp_per_step if dp_per_step else None
    return row


def params(args, dims, sizes_held, n):
    """The run's parameters, as the YAML's expressions name them."""
    itemsize = np.dtype(args.dtype).itemsize
    return {"sizes": args.sizes, "batch": args.batch, "sgd_steps": args.sgd_steps,
            "adam_steps": args.adam_steps, "steps": args.sgd_steps + args.adam_steps, "dtype": args.dtype,
            "itemsize": itemsize, "seed": args.seed, "largest_layer_items": max(layer_items(*d) for d in dims),
            "padded_bytes": sum(size * n for size in sizes_held) * itemsize}


# ---------------------------------------------------------------- what rank 0 prints
def widths(text):
    """--sizes: the MLP's widths, input first, e.g. 6,13,11,3 (at least 2, each >= 1)."""
    import argparse
    sizes = bootstrap.count_list(text)
    if len(sizes) < 2 or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"expected at least two widths >= 1, e.g. {SIZES}, got {text!r}")
    return sizes


def flags():
    parser = bootstrap.lesson_parser(__file__, __doc__)
    parser.add_argument("--sizes", type=widths, default=widths(SIZES),
                        help=f"the MLP's widths, input first (default {SIZES})")
    parser.add_argument("--batch", type=bootstrap.positive(int), default=BATCH,
                        help=f"global batch (default {BATCH})")
    parser.add_argument("--sgd-steps", type=bootstrap.nonneg_int, default=SGD_STEPS,
                        help=f"SGD steps first (default {SGD_STEPS})")
    parser.add_argument("--adam-steps", type=bootstrap.nonneg_int, default=ADAM_STEPS,
                        help=f"then Adam steps (default {ADAM_STEPS})")
    parser.add_argument("--dtype", choices=DTYPES, default="float64")
    parser.add_argument("--seed", type=int, default=SEED, help=f"weights and data's seed (default {SEED})")
    return parser


def main():
    args, ctx = bootstrap.start(__file__, flags())
    if args.sgd_steps + args.adam_steps == 0:
        ctx.fail("--sgd-steps and --adam-steps are both 0: nothing to train")
    n, rank, dtype, xp = ctx.world_size, ctx.rank, np.dtype(args.dtype), buffers.array_module(ctx)  # np, cupy, torch
    dims, flats = layer_dims(args.sizes), init_flats(args.sizes, dtype, args.seed)
    x, t = (buffers.on_device(ctx, a) for a in make_data(args.sizes, args.batch, dtype, args.seed))
    lo, hi = shards.chunk_bounds(args.batch, n)[rank]  # my slice of the global batch
    schedule = ([("sgd", LR_SGD, 0)] * args.sgd_steps
                + [("adam", LR_ADAM, k + 1) for k in range(args.adam_steps)])
    mine = (flats, dims, x[lo:hi], t[lo:hi], args.batch, schedule)  # what every training but (b) takes
    bound = oracle(ctx, args, flats, dims, schedule)                   # the budget of |dparam|, per parameter

    be, be_dp = counting.Counted(p2p.backend(ctx), n), counting.Counted(p2p.backend(ctx), n)  # (a)'s, (c)'s sends
    held, held_dp = new_held(), new_held()
    trained = fsdp_train(ctx, xp, be, nine, *mine, held)                    # (a) ZeRO-3 by hand
    after_b = reference_train(ctx, xp, flats, dims, x, t, args.batch, schedule)  # (b) one process
    with be_dp.phase("backward"):                                           # (c) data parallel
        after_c = reference_train(ctx, xp, *mine, held=held_dp,
                                  allreduce=lambda g: ring_allreduce(ctx, be_dp, nine, g, dtype))
    lib, be_lib = library_backend(ctx, n)                                   # (d) (a) on the library's calls
    after_d = fsdp_train(ctx, xp, be_lib, ON_LIBRARY, *mine, new_held())[0]
    full_a = [gathered(ctx, a, flats) for a in trained[0]]
    row = results(ctx, args, dims, trained, full_a, after_b, after_c, gathered(ctx, after_d[-1], flats),
                  (be, be_dp, be_lib), held, held_dp, bound)

    report.section(ctx, f"1. the shards: MLP {' -> '.join(map(str, args.sizes))}, {args.dtype}, {n} rank(s)")
    show.shards(ctx, dims, [layer_items(*d) for d in dims], trained[2], dtype.itemsize)
    report.section(ctx, f"2. {args.sgd_steps} SGD steps (lr {LR_SGD}), then {args.adam_steps} Adam "
                        f"steps (lr {LR_ADAM}), batch {args.batch}, {ctx.api} ({ctx.transport})")
    show.equal(ctx, args, row, lib)                                   # (a) = (b) = (c) = (d)
    report.section(ctx, "3. the ZeRO table: bytes each rank sends per step, and holds")
    largest = max(-(-layer_items(*d) // n) * n for d in dims) * dtype.itemsize  # the largest padded layer
    show.zero_table(ctx, row, params(args, dims, trained[2], n)["padded_bytes"], largest, lib)
    if ctx.api == "torch":
        report.section(ctx, "4. torch's own FSDP: fully_shard on the same model, weights and slices")
        theirs, items = torch_fsdp.train(ctx, *mine, unflatten, (B1, B2, EPS))
        row.update(torch_items_held=items, **compare("torch_vs_hand", theirs, full_a[-1], bound))
        show.torch_fsdp(ctx, row)
    report.finish(ctx, row, params=params(args, dims, trained[2], n))


if __name__ == "__main__":
    main()
