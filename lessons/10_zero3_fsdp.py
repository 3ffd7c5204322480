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
The collectives are lesson 09's ring all-gather and reduce-scatter, run on common/p2p's send/recv and
counted by common/counting.Counted, phase by phase.

What to watch for:
  1. the shards: per layer its items ((in + 1) x out), the padded size, and what each rank holds. The
     default sizes leave remainders at NP 3 and 4, so the last shard ends in padding (zeros whose
     gradient is zero: they never change, and they are cut off when a layer is unflattened).
  2. equal to one process and to data parallelism (checked): a seeded MLP trained --sgd-steps SGD
     steps then --adam-steps Adam steps three ways in the same run: (a) ZeRO-3 by hand, (b) one process
     on the whole batch (every rank computes it: the model is tiny), (c) data parallelism, each layer's
     gradient all-reduced as a reduce-scatter then an all-gather (lesson 09's ring), and (d) (a)'s
     own code on the library's all-gather and reduce-scatter (common/collectives: MPI_Allgather and
     MPI_Reduce_scatter_block, NCCL's allGather and reduceScatter, torch's all_gather_single and
     reduce_scatter_single). NCCL's and torch's take one count for every rank: the padding to
     equal shards is what lets FSDP call them.
     The local loss is (sum of my per-sample losses) / B_global, so sums over ranks need no division.
     Tolerance: the ring adds the ranks' partial sums in its own order, not the single process's,
     so results differ in the last bits (measured: ~1e-16 in float64, ~6e-8 in float32); the
     checks allow 1e-10 / 1e-5: an unreduced or misplaced gradient moves the parameters far more.
  3. the ZeRO table (counted, measured): bytes each rank sent per step, phase by phase, beside data
     parallelism's, in units of the padded parameter bytes P times (N-1)/N, the volume of one ring
     all-gather or reduce-scatter: ZeRO-3 sends 1 in forward and 2 in backward (3 in all), data
     parallelism 2, all in backward; (d)'s column is nominal: what the library's algorithm sends for
     its calls, a ring's volume, except on gloo, whose reduce-scatter is an all-reduce that keeps one
     block (2 units, so 4 in all: lesson 09 measures it). And the bytes each rank holds:
     parameters (peak, measured by tracking every array until Python frees it: my shards plus one
     gathered layer), gradients (peak: my gradient shards plus one layer's full gradient), Adam's m
     and v (2 x my shards).
  4. on --api torch: torch's own FSDP (torch.distributed.fsdp.fully_shard) trains the same model from
     the same weights; its parameters must equal (a)'s. It shards each parameter tensor along its first
     dimension instead of one flat vector per layer: the items each rank holds are shown.

Run it:
  make lesson-10 NP=4                      (API=torch; ARGS="--dtype float32 --sizes 5,9,2")
  .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py lessons/10_zero3_fsdp.py --api mpi4py
"""
import math
import os
import sys
import textwrap
import types
import weakref

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import bootstrap, buffers, collectives, counting, p2p, report, shards, timing  # noqa: E402

SEED = 10                 # weights and data come from this seed, identical on every rank
SIZES = "6,13,11,9,7,3"   # MLP widths, tanh between; layer items 91, 154, 108, 70, 24 (447)
BATCH = 50                # global batch: 50 % 3 == 2, 50 % 4 == 2, so the slices are uneven at NP 3, 4
SGD_STEPS, ADAM_STEPS = 3, 3
LR_SGD, LR_ADAM = 0.1, 0.01
B1, B2, EPS = 0.9, 0.999, 1e-8  # Adam's betas and eps, as torch.optim.Adam's defaults
TOL = {"float64": 1e-10, "float32": 1e-5}  # max |dparam| allowed (summation order, see above)
WIDTH_COLS = 100


# ---------------------------------------------------------------- the model, one layer at a time
def layer_dims(sizes):
    """[(fan_in, fan_out)] of the MLP's linear layers."""
    return list(zip(sizes[:-1], sizes[1:]))


def layer_items(fan_in, fan_out):
    return (fan_in + 1) * fan_out  # weight (fan_in x fan_out), then bias (fan_out)


def init_flats(sizes, dtype):
    """Each layer's parameters as one flat NumPy vector: weight row by row, then bias. Seeded."""
    rng = np.random.default_rng(SEED)
    flats = []
    for fan_in, fan_out in layer_dims(sizes):
        w = rng.standard_normal((fan_in, fan_out)) / math.sqrt(fan_in)
        b = 0.1 * rng.standard_normal(fan_out)
        flats.append(np.concatenate([w.ravel(), b]).astype(dtype))
    return flats


def make_data(sizes, batch, dtype):
    rng = np.random.default_rng(SEED + 1)
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
    """d loss / d y for loss = sum over the GLOBAL batch of |y - t|^2, divided by B_global."""
    return 2 * (y - t) / batch


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


def zeros(ctx, count, dtype):
    return buffers.on_device(ctx, np.zeros(count, dtype))


# ---------------------------------------------------------------- (a) ZeRO-3 by hand
def pad_and_shard(flat, rank, n):
    """This rank's shard of a layer's flat parameters: N equal shards of ceil(items / N), the flat
    vector padded with zeros to N of them (equal counts: every all-gather and reduce-scatter is even)."""
    # >>> exercise: pad_and_shard
    size = -(-flat.size // n)                  # ceil(items / N)
    padded = np.zeros(size * n, flat.dtype)    # zeros past the end: their gradient is 0, they stay 0
    padded[:flat.size] = flat
    return padded[rank * size:(rank + 1) * size].copy()
    # <<< exercise: pad_and_shard


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


def max_diff(a, b):
    return max(float(np.abs(p - q).max()) if p.size else 0.0 for p, q in zip(a, b))


# ---------------------------------------------------------------- (d) torch's own FSDP
def torch_fsdp(ctx, flats, dims, x, t, batch, schedule):
    """torch.distributed.fsdp.fully_shard on the same model, weights and batch slices. Returns (the
    gathered flat parameters after the last step, the items of each parameter this rank holds)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    n, dtype, dev = ctx.world_size, x.dtype, x.device
    # the run's own device: without mesh=, fully_shard builds its mesh on torch's accelerator, which is
    # cuda on a GPU node even when this run is on the CPU
    mesh = init_device_mesh(dev.type, (n,))
    linears = [torch.nn.Linear(fi, fo, dtype=dtype, device=dev) for fi, fo in dims]
    with torch.no_grad():
        for lin, flat, (fi, fo) in zip(linears, flats, dims):
            w, b = unflatten(torch.from_numpy(flat), fi, fo)
            lin.weight.copy_(w.T)  # torch keeps weight as (out, in)
            lin.bias.copy_(b)
    layers = []
    for lin in linears:
        layers += [lin, torch.nn.Tanh()]
    net = torch.nn.Sequential(*layers[:-1])
    for lin in linears:
        fully_shard(lin, mesh=mesh)  # each layer its own unit: gathered before it runs, freed after
    fully_shard(net, mesh=mesh)
    optimizers = {}
    for opt, lr, _ in schedule:
        if opt not in optimizers:  # a fresh optimizer when the schedule turns to Adam, as (a)-(c)
            make = torch.optim.SGD if opt == "sgd" else torch.optim.Adam
            optimizers[opt] = make(net.parameters(), lr=lr, **({} if opt == "sgd" else {
                "betas": (B1, B2), "eps": EPS}))
        # fully_shard divides the summed gradients by N: local loss N / B * sum makes it the full mean
        (((net(x) - t) ** 2).sum() * n / batch).backward()
        optimizers[opt].step()
        optimizers[opt].zero_grad()
    params = [p.full_tensor().detach() for p in net.parameters()]  # weight, bias per layer
    flat = [torch.cat([w.T.reshape(-1), b]).cpu().numpy() for w, b in zip(params[::2], params[1::2])]
    held = [int(p.to_local().numel()) for p in net.parameters()]
    return flat, held


# ---------------------------------------------------------------- what rank 0 prints
def once(rows):
    """Rows (rank, values...) from every rank, in rank order: consecutive ranks with equal values make
    one row ('0-2'; 'all' when every rank's are equal)."""
    groups = []
    for r in rows:
        if groups and tuple(groups[-1][-1][1:]) == tuple(r[1:]):
            groups[-1].append(r)
        else:
            groups.append([r])
    if len(groups) == 1:
        return [("all",) + tuple(rows[0][1:])]
    return [(f"{g[0][0]}-{g[-1][0]}" if len(g) > 1 else g[0][0],) + tuple(g[0][1:]) for g in groups]


def show_shards(ctx, dims, sizes_held, itemsize):
    n = ctx.world_size
    rows = []
    for (fan_in, fan_out), size in zip(dims, sizes_held):
        items = layer_items(fan_in, fan_out)
        rows.append((f"{fan_in}+1 x {fan_out}", items, size * n, size, size * n - items))
    print(report.table(["layer (in+1) x out", "items", "padded to", "per rank", "padding"], rows))
    total, mine = sum(r[1] for r in rows), sum(r[3] for r in rows)
    print(f"every rank holds {mine} of the model's {total} parameters ({mine * itemsize} B); the "
          f"last shard of a layer\nends in its padding, zeros whose gradient is 0", flush=True)


def show_equal(ctx, args, rows, lib):
    rows = [(r[0], "-" if r[1] is None else r[1]) + tuple(r[2:]) for r in rows]  # no SGD steps: -
    print(report.table(["rank", "SGD: |a-b|", "end: |a-b|", "end: |a-c|", "end: |c-b|", "end: |d-b|"],
                       once(rows), align=[True] * 6))
    print(f"max |dparam| after the {args.sgd_steps} SGD steps and at the end; tolerance "
          f"{TOL[args.dtype]:g} ({args.dtype}):\nthe ring adds the ranks' partial sums in its own "
          "order, not the single process's", flush=True)
    print(f"(d) = (a)'s code on the library's calls: {lib.names['all_gather']}, "
          f"{lib.names['reduce_scatter']}")
    for op in ("all_gather", "reduce_scatter"):
        if op in lib.missing:  # a line on padding gets what it means here: no padding is needed
            print(wrapped(f"  {lib.missing[op]}" + ("; the padded shards are equal, so it takes them as "
                                                     "they are" if "padded" in lib.missing[op] else "")))
    print(end="", flush=True)


def wrapped(text):
    return textwrap.fill(text, WIDTH_COLS, subsequent_indent="  ", break_on_hyphens=False)


def ratio(x, unit):
    return f"{x / unit:.2f}" if unit else "-"


def show_zero_table(ctx, mine, rows, padded_bytes, lib):
    """The standard ZeRO table, counted and measured on this run: rank 0's figures (all ranks' when
    they differ)."""
    n = ctx.world_size
    unit = padded_bytes * (n - 1) // n  # one ring all-gather or reduce-scatter of every layer
    same = all(r == rows[0] for r in rows)
    for rank, r in enumerate(rows if not same else rows[:1]):
        table = [(f"sent in {ph}", r["dp_sent"][ph], ratio(r["dp_sent"][ph], unit), r["sent"][ph],
                  ratio(r["sent"][ph], unit), r["library_sent"][ph])
                 for ph in ("forward", "backward", "step")]
        dp_total, z_total = sum(r["dp_sent"].values()), sum(r["sent"].values())
        table.append(("sent in all", dp_total, ratio(dp_total, unit), z_total, ratio(z_total, unit),
                      sum(r["library_sent"].values())))
        table += [("held: parameters (peak)", r["dp_param_bytes"], "", r["peak_param_bytes"], "", ""),
                  ("held: gradients (peak)", r["dp_grad_bytes"], "", r["peak_grad_bytes"], "", ""),
                  ("held: Adam's m and v", r["dp_state_bytes"], "", r["state_bytes"], "", "")]
        if not same:
            print(f"rank {rank}:")
        print(report.table(["per rank, per step", "data parallel B", "x", "ZeRO-3 B", "x", "(d) nominal B"],
                           table, align=[False, True, True, True, True, True]))
    if n == 1:
        print("one rank: nothing to send, and its shards are the whole model")
    else:
        print(f"x: in units of P (N-1)/N = {unit} B, P = {padded_bytes} B the padded parameters; "
              + ("the same on every rank" if same else "the ranks differ"))
        gloo = "reduce_scatter" in lib.rules
        print(wrapped(f"(d) nominal: what the library's algorithm sends for its calls, "
                      f"{ratio(sum(rows[0]['library_sent'].values()), unit)} x" + (
                          ": gloo's reduce-scatter is an all-reduce that keeps one block, 2 units where a "
                          "ring's is 1 (lesson 09 measures its bytes)" if gloo else
                          " (a ring's volume: the library does not say what it sent)")))
    r = rows[0]
    extra = r["peak_gathered_bytes"]
    largest = mine["largest_padded_bytes"]
    if extra == largest:
        print(f"ZeRO-3's parameter peak = my shards ({r['shard_bytes']} B) + one gathered layer, the "
              f"largest ({largest} B):\nforward and backward free each layer before gathering the next")
    else:
        print(f"ZeRO-3's parameter peak = my shards ({r['shard_bytes']} B) + {extra} B of gathered "
              f"layers held at once\n(the largest layer alone is {largest} B)")
    print(end="", flush=True)


def widths(text):
    """--sizes: the MLP's widths, input first, e.g. 6,13,11,3 (at least 2, each >= 1)."""
    import argparse
    sizes = bootstrap.count_list(text)
    if len(sizes) < 2 or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"expected at least two widths >= 1, e.g. {SIZES}, got {text!r}")
    return sizes


def main():
    parser = bootstrap.lesson_parser(__file__, __doc__)
    parser.add_argument("--sizes", type=widths, default=widths(SIZES),
                        help=f"the MLP's widths, input first (default {SIZES})")
    parser.add_argument("--batch", type=bootstrap.positive(int), default=BATCH,
                        help=f"global batch (default {BATCH})")
    parser.add_argument("--sgd-steps", type=bootstrap.nonneg_int, default=SGD_STEPS,
                        help=f"SGD steps first (default {SGD_STEPS})")
    parser.add_argument("--adam-steps", type=bootstrap.nonneg_int, default=ADAM_STEPS,
                        help=f"then Adam steps (default {ADAM_STEPS})")
    parser.add_argument("--dtype", choices=sorted(TOL), default="float64")
    args, ctx = bootstrap.start(__file__, parser)
    steps = args.sgd_steps + args.adam_steps
    if steps == 0:
        ctx.fail("--sgd-steps and --adam-steps are both 0: nothing to train")
    n, rank = ctx.world_size, ctx.rank
    xp = buffers.array_module(ctx)  # numpy, cupy or torch (one thread per rank)
    nine = bootstrap.lesson_module("09")  # the ring all-gather and reduce-scatter lesson 09 built
    dtype = np.dtype(args.dtype)
    dims, flats = layer_dims(args.sizes), init_flats(args.sizes, dtype)
    host_x, host_t = make_data(args.sizes, args.batch, dtype)
    x, t = buffers.on_device(ctx, host_x), buffers.on_device(ctx, host_t)
    lo, hi = shards.chunk_bounds(args.batch, n)[rank]
    schedule = ([("sgd", LR_SGD, 0)] * args.sgd_steps
                + [("adam", LR_ADAM, k + 1) for k in range(args.adam_steps)])

    be = counting.Counted(p2p.backend(ctx), n)     # exchange: Sendrecv / ncclSend+Recv / batch_isend_irecv
    be_dp = counting.Counted(p2p.backend(ctx), n)
    held = {k: Held() for k in ("params", "grads", "state")}
    held_dp = {k: Held() for k in ("params", "grads", "state")}
    after_a, sent, sizes_held, moments = fsdp_train(ctx, xp, be, nine, flats, dims, x[lo:hi], t[lo:hi],
                                                    args.batch, schedule, held)
    after_b = reference_train(ctx, xp, flats, dims, x, t, args.batch, schedule)
    with be_dp.phase("backward"):
        after_c = reference_train(ctx, xp, flats, dims, x[lo:hi], t[lo:hi], args.batch, schedule,
                                  allreduce=lambda g: ring_allreduce(ctx, be_dp, nine, g, dtype),
                                  held=held_dp)

    lib, be_lib = library_backend(ctx, n)  # (d): the same ZeRO-3 code on the library's collectives
    after_d = fsdp_train(ctx, xp, be_lib, ON_LIBRARY, flats, dims, x[lo:hi], t[lo:hi], args.batch,
                         schedule, {k: Held() for k in ("params", "grads", "state")})[0]

    full_a = [gathered(ctx, a, flats) for a in after_a]
    full_d = gathered(ctx, after_d[-1], flats)
    at_sgd = args.sgd_steps - 1
    itemsize = dtype.itemsize
    layers = []
    for k, ((fan_in, fan_out), size) in enumerate(zip(dims, sizes_held)):
        layers.append({"items": layer_items(fan_in, fan_out), "shard": size, "state_bytes": moments[k],
                       "forward_bytes": sent[k]["forward"] // steps,
                       "backward_bytes": sent[k]["backward"] // steps})
    dp_per_step = be_dp.total() // steps
    shard_bytes = sum(sizes_held) * itemsize
    padded_bytes = sum(size * n for size in sizes_held) * itemsize
    row = {"sgd_vs_single": max_diff(full_a[at_sgd], after_b[at_sgd]) if args.sgd_steps else None,
           "end_vs_single": max_diff(full_a[-1], after_b[-1]),
           "end_vs_dp": max_diff(full_a[-1], after_c[-1]),
           "dp_vs_single": max_diff(after_c[-1], after_b[-1]),
           "library_vs_single": max_diff(full_d, after_b[-1]),
           "layers": layers, "shard_bytes": shard_bytes,
           "peak_param_bytes": held["params"].peak, "peak_gathered_bytes": held["params"].peak - shard_bytes,
           "peak_grad_bytes": held["grads"].peak, "peak_layer_grad_bytes": held["grads"].peak - shard_bytes,
           "state_bytes": held["state"].peak,
           "dp_param_bytes": held_dp["params"].peak, "dp_grad_bytes": held_dp["grads"].peak,
           "dp_state_bytes": held_dp["state"].peak,
           "sent": {ph: be.total(phases=[ph]) // steps for ph in ("forward", "backward", "step")},
           "dp_sent": {ph: be_dp.total(phases=[ph]) // steps for ph in ("forward", "backward", "step")},
           "library_sent": {ph: be_lib.total(phases=[ph]) // steps for ph in ("forward", "backward",
                                                                               "step")},
           "comm": {"zero3": be.counts, "dp": be_dp.counts, "zero3_library": be_lib.counts}}
    row["library_total"] = sum(row["library_sent"].values())
    row["zero3_over_dp"] = sum(row["sent"].values()) / dp_per_step if dp_per_step else None

    report.section(ctx, f"1. the shards: MLP {' -> '.join(map(str, args.sizes))}, {args.dtype}, "
                        f"{n} rank(s)")
    if rank == 0:
        show_shards(ctx, dims, sizes_held, itemsize)
    report.section(ctx, f"2. {args.sgd_steps} SGD steps (lr {LR_SGD}), then {args.adam_steps} Adam "
                        f"steps (lr {LR_ADAM}), batch {args.batch}, {ctx.api} ({ctx.transport})")
    if rank == 0:
        print("(a) ZeRO-3 by hand  (b) one process, whole batch  (d) (a) on the library's collectives"
              "\n(c) data parallel: each layer's gradient all-reduced (reduce-scatter, then all-gather)",
              flush=True)
    rows = ctx.comm.gather((rank, row["sgd_vs_single"], row["end_vs_single"], row["end_vs_dp"],
                            row["dp_vs_single"], row["library_vs_single"]), root=0)
    if rank == 0:
        show_equal(ctx, args, rows, lib)
    report.section(ctx, "3. the ZeRO table: bytes each rank sends per step, and holds")
    largest = max(-(-layer_items(*d) // n) * n for d in dims) * itemsize
    every = ctx.comm.gather({k: row[k] for k in row if k not in ("comm", "layers")}, root=0)
    if rank == 0:
        show_zero_table(ctx, {"largest_padded_bytes": largest}, every, padded_bytes, lib)

    if ctx.api == "torch":
        report.section(ctx, "4. torch's own FSDP: fully_shard on the same model, weights and slices")
        theirs, items_held = torch_fsdp(ctx, flats, dims, x[lo:hi], t[lo:hi], args.batch, schedule)
        row["torch_vs_hand"] = max_diff(theirs, full_a[-1])
        row["torch_items_held"] = items_held
        got = ctx.comm.gather((rank, row["torch_vs_hand"], sum(items_held), items_held), root=0)
        if rank == 0:
            print(report.table(["rank", "max |torch - a|", "items held", "per parameter (w, b, ...)"],
                               once([(r, d, s, str(h)) for r, d, s, h in got]),
                               align=[True, True, True, False]))
            uneven = len({s for _, _, s, _ in got}) > 1
            print("fully_shard cuts each parameter tensor along its first dimension (rows of weight, "
                  "items of bias),\nnot one flat vector per layer" + (
                      ": here N does not divide some of them, so the ranks hold unequal parts"
                      if uneven else ""), flush=True)
    params = {"sizes": args.sizes, "batch": args.batch, "sgd_steps": args.sgd_steps,
              "adam_steps": args.adam_steps, "steps": steps, "dtype": args.dtype, "itemsize": itemsize,
              "tol": TOL[args.dtype], "largest_layer_items": max(layer_items(*d) for d in dims),
              "padded_bytes": padded_bytes}
    report.finish(ctx, row, params=params)


if __name__ == "__main__":
    main()
