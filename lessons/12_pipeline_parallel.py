"""Lesson 12 — pipeline parallelism with send/recv: GPipe and 1F1B, their bubble and their memory.

The idea: cut the model's layers into p stages, one per rank, and the batch into m micro-batches. A
micro-batch's forward runs stage 0, 1, ..., p-1, each sending its activation to the next; its backward
runs back, each sending the gradient of its input to the previous one. Only neighbours talk, and only
micro-batch activations travel, never parameters.
  GPipe  every forward, then every backward: each stage holds all m micro-batches' activations (GPipe's
         paper re-materializes instead: it keeps m inputs and recomputes the rest in the backward).
  1F1B   a warm-up of min(p-s-1, m) forwards, then one forward, one backward, then the backwards left:
         stage s holds at most min(p-s, m) micro-batches (PipeDream-Flush, as Megatron-LM runs it).
Both leave a stage idle (p-1)/(m+p-1) of its time while the pipe fills and drains: the bubble. The loss
is sum |y - t|^2 / B over the WHOLE batch, so a micro-batch's gradient is its share, and a stage adds
them up (accumulates) over the m micro-batches. The orders are pure (lessons/pipeline_parallel/
schedules.py places each op at the earliest tick its inputs allow and matches every send to its
receive before anything runs); each rank then walks its row of the grid, a tick's messages posted as
one group (p2p.group: Isend/Irecv + Waitall, grouped ncclSend/ncclRecv, dist.batch_isend_irecv).

What to watch for: 1. the split (uneven: the first stages take a layer more, the first micro-batches a
row); 2. the grids (F3, B3, .: idle), the same length; 3. the loss and every gradient equal one
process's, both schedules; 4. the bubble in ticks (graded) and on the wall clock (reported, with the
causes this run measured where the clock differs); 5. messages sent, and activations held: GPipe m,
1F1B min(p-s, m), then 1F1B again with m = p-2; 6. on --api torch, torch.distributed.pipelining.
Try: ARGS="--micro 2" (bubble (p-1)/(p+1)); ARGS="--micro 30"; ARGS="--hidden 1024 --batch 4096".

Run it:
  make lesson-12 NP=4                      (API=torch; ARGS="--micro 4 --grid"; ARGS="--dtype float32")
  .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py lessons/12_pipeline_parallel.py --api mpi4py
Next: lesson 13 passes blocks round a ring while it computes (ring attention).
"""
import os
import sys
import weakref

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import bootstrap, buffers, counting, p2p, report, shards, text, timing, tolerance  # noqa: E402
from lessons.pipeline_parallel import budget, show, torch_pipelining  # noqa: E402
from lessons.pipeline_parallel.schedules import ScheduleError, plan  # noqa: E402

# lesson 10's seeded MLP: layer_dims, init_flats, make_data, forward_layer, backward_layer, loss_grad;
# unflatten (for torch's pipelining) and layer_items (for the tables)
ten = bootstrap.lesson_module("10")

IN_WIDTH, OUT_WIDTH = 6, 3  # the model's input and output widths
HIDDEN = 32               # every other width: what an activation message carries per row
LAYERS = 7                # 7 % 3 == 1, 7 % 4 == 3: uneven stages at NP 3 and 4
BATCH = 30                # rows in the batch
MICRO = 8                 # micro-batches: 30 % 8 == 6, so they are uneven (4 and 3 rows)
DTYPES = ("float32", "float64")  # graded against common/tolerance.py's budget (lessons/pipeline_parallel/budget.py)
SCHEDULES = ("gpipe", "1f1b")


# ---------------------------------------------------------------- the schedules: each stage's order
def gpipe_order(stage, p, m):
    """GPipe: every forward, then every backward (last in, first out)."""
    return [("F", i) for i in range(m)] + [("B", i) for i in reversed(range(m))]


def one_f_one_b_order(stage, p, m):
    """1F1B: a warm-up of forwards that fills the pipe below this stage, then one forward, one
    backward, then the backwards left. Stage s holds at most min(p - s, m) micro-batches."""
    # >>> exercise: one_f_one_b
    warmup = min(p - stage - 1, m)       # micro-batch 0 needs p-s-1 more stages before its backward
    order = [("F", i) for i in range(warmup)]
    for i in range(m - warmup):          # steady state: the next forward, then the oldest backward
        order += [("F", warmup + i), ("B", i)]
    order += [("B", i) for i in range(m - warmup, m)]  # cool-down
    return order
    # <<< exercise: one_f_one_b


ORDERS = {"gpipe": gpipe_order, "1f1b": one_f_one_b_order}


def checked_plan(name, p, m, label=""):
    """Every stage's order, placed on ticks and its messages matched: the same on every rank, so a
    broken order stops every rank with the same error before a message is posted."""
    try:
        return plan([ORDERS[name](s, p, m) for s in range(p)], m, f"the {show.TITLE[name]} schedule{label}")
    except ScheduleError as exc:
        raise RuntimeError(str(exc)) from None


def plans_for(p, m):
    """Every schedule's plan, checked on every rank before a message moves: GPipe and 1F1B at m, then
    (p >= 3) 1F1B again at m = p - 2, fewer micro-batches than stages, where the warm-up must stop at m."""
    plans = {name: checked_plan(name, p, m) for name in SCHEDULES}
    if p >= 3:
        plans["1f1b few"] = checked_plan("1f1b", p, p - 2, f" with m = {p - 2} micro-batch(es) for {p} "
                                         "stages (a warm-up stops at m)")
    return plans


# ---------------------------------------------------------------- the model (lesson 10's layers)
def micro_loss(y, t, batch):
    """This micro-batch's share of the loss and d loss / d y, for loss = sum over the WHOLE batch of
    |y - t|^2, divided by B: the shares add up to the loss, their gradients to its gradient."""
    # >>> exercise: micro_loss
    loss = ((y - t) ** 2).sum() / batch
    return loss, 2 * (y - t) / batch
    # <<< exercise: micro_loss


class Stashed:
    """The activations a stage holds, measured: every array stashed for micro-batch i counts from
    stash(i, array) until Python frees it (weakref.finalize), so an array kept by mistake shows in the
    peak. Counted in micro-batches (those with any array alive) and in bytes."""

    def __init__(self):
        self.alive, self.now, self.peak, self.bytes, self.peak_bytes = {}, 0, 0, 0, 0

    def __call__(self, i, buf):
        if not self.alive.get(i):
            self.now += 1
            self.peak = max(self.peak, self.now)
        self.alive[i] = self.alive.get(i, 0) + 1
        nbytes = buffers.nbytes(buf)
        self.bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.bytes)
        weakref.finalize(buf, self._drop, i, nbytes)
        return buf

    def _drop(self, i, nbytes):
        self.alive[i] -= 1
        self.now -= not self.alive[i]
        self.bytes -= nbytes


def empty_rows(ctx, rows, cols, dtype):
    return buffers.empty(ctx, rows * cols, dtype).reshape(rows, cols)


def zeros(ctx, count, dtype):
    return buffers.on_device(ctx, np.zeros(count, dtype))


class Stage:
    """What stage s (rank s) owns: layers [lo, hi) of the model and their parameters, on the device;
    lesson 10's forward_layer and backward_layer run them."""

    def __init__(self, ctx, xp, dims, flats, layers):
        self.ctx, self.xp, self.dims = ctx, xp, dims
        self.lo, self.hi = layers
        self.last, self.dtype = len(dims) - 1, flats[0].dtype
        self.params = {k: buffers.on_device(ctx, flats[k]) for k in range(self.lo, self.hi)}

    def forward(self, x, i, stash):
        """The forward of micro-batch i through my layers; every activation stashed for the backward."""
        acts = [stash(i, x)]
        for k in range(self.lo, self.hi):
            fan_in, fan_out = self.dims[k]
            acts.append(stash(i, ten.forward_layer(self.xp, acts[-1], self.params[k], fan_in, fan_out,
                                                   k == self.last)))
        return acts

    def backward(self, acts, gy, grads):
        """The backward of one micro-batch through my layers, given d loss / d (my output); each layer's
        gradient added to grads[k]. Returns d loss / d (my input), for the previous stage."""
        for k in reversed(range(self.lo, self.hi)):
            fan_in, fan_out, j = *self.dims[k], k - self.lo
            g = buffers.empty(self.ctx, buffers.size(self.params[k]), self.dtype)  # every item written
            gy = ten.backward_layer(acts[j], acts[j + 1], gy, self.params[k], g, fan_in, fan_out,
                                    k == self.last)
            # >>> exercise: accumulate
            grads[k] += g      # summed over micro-batches: the whole batch's gradient
            # <<< exercise: accumulate
        return gy

# ---------------------------------------------------------------- walking my row of the grid
def talk(be, phase, sends, recvs, rows, stash, inbox, outbox, ctx, width, dtype):
    """One tick's messages of one direction, in flight together: what I made that my neighbour runs
    now (my output, or my input's gradient) out; what my own op needs now in."""
    out = [(stash[i][-1] if phase == "forward" else outbox.pop(i), peer) for i, peer in sends]
    into = []
    for i, peer in recvs:
        inbox[i] = empty_rows(ctx, rows[i], width, dtype)
        into.append((inbox[i], peer))
    with be.phase(phase):
        be.group(out, into)  # Isend+Irecv+Waitall | grouped ncclSend/ncclRecv | batch_isend_irecv


def walk(ctx, stage, pl, be, x, t, micro, batch, hidden):
    """Run my row of the plan, tick by tick. Returns my loss (last stage; 0 elsewhere), my layers'
    gradients summed over the micro-batches, and what was counted and measured on the way."""
    s, p = ctx.rank, ctx.world_size
    rows = [b - a for a, b in micro]
    stash_of, held = {}, Stashed()
    inbox = {"forward": {}, "backward": {}}
    outbox, loss, ran = {}, 0.0, 0
    grads = {k: zeros(ctx, buffers.size(w), stage.dtype) for k, w in stage.params.items()}
    sync = timing.syncer(ctx)
    busy = waited = 0.0
    quickest = float("inf")  # the quickest group: about what a message costs with no one to wait for
    ctx.comm.Barrier()  # every stage starts the walk together
    start = timing.now(sync)
    for tick, step in enumerate(pl.steps[s]):
        for phase in ("forward", "backward"):  # the same order on every rank, so the groups meet
            sends, recvs = step[phase]
            if sends or recvs:
                t0 = timing.now(sync)
                talk(be, phase, sends, recvs, rows, stash_of, inbox[phase], outbox, ctx, hidden,
                     stage.dtype)
                spent = timing.now(sync) - t0
                waited += spent
                quickest = min(quickest, spent)
        op = pl.grid[s][tick]
        if op is None:
            continue  # an idle tick: the bubble
        kind, i = op
        a, b = micro[i]
        t0 = timing.now(sync)
        if kind == "F":
            stash_of[i] = stage.forward(x[a:b] if s == 0 else inbox["forward"].pop(i), i, held)
            if s == p - 1:
                loss += float(micro_loss(stash_of[i][-1], t[a:b], batch)[0])
        else:
            acts = stash_of.pop(i)  # the backward frees micro-batch i's activations
            gy = micro_loss(acts[-1], t[a:b], batch)[1] if s == p - 1 else inbox["backward"].pop(i)
            gx = stage.backward(acts, gy, grads)
            del acts, gy
            if s > 0:
                outbox[i] = gx  # leaves when stage s-1 runs B(i)
            del gx
        busy += timing.now(sync) - t0
        ran += 1
    total = timing.now(sync) - start
    left = [f"{what} {sorted(d)}" for what, d in (("stashed", stash_of), ("outbox", outbox),
                                                   ("inbox", {**inbox["forward"], **inbox["backward"]}))
            if d]
    assert not left, f"stage {s} ends its walk still holding {', '.join(left)}"
    return loss, grads, dict(ticks=len(pl.steps[s]), ran=ran, held=held, busy=busy, waited=waited,
                             quickest=quickest if quickest < float("inf") else 0.0,
                             total=total)


def run_schedule(ctx, stage, name, pl, x, t, micro, asked, args, ref, comm):
    """Walk one schedule's plan, counted; its results row (micro: the m this run was asked for, which the
    checks' closed forms read: micro-batches cut wrong still fail them)."""
    be = counting.Counted(p2p.backend(ctx), ctx.world_size)
    loss, grads, seen = walk(ctx, stage, pl, be, x, t, micro, args.batch, args.hidden)
    loss = ctx.comm.bcast(loss, root=ctx.world_size - 1)  # plain MPI, uncounted: for checking only
    comm[name] = be.counts
    return {"schedule": name, "micro": asked, "loss": loss, "loss_err": abs(loss - ref[0]),
            "grad_err": max_diff(grads, ref[1]), **ratios(loss, grads, ref),
            "ticks": seen["ticks"], "ran": seen["ran"], "bubble": 1 - seen["ran"] / seen["ticks"],
            "peak": seen["held"].peak, "peak_bytes": seen["held"].peak_bytes,
            "busy_s": seen["busy"], "waited_s": seen["waited"], "wall_s": seen["total"],
            "quickest_group_s": seen["quickest"],
            "groups": be.total(field="calls"), "wall_idle": 1 - seen["busy"] / seen["total"],
            "phases": [{"phase": ph, "msgs": be.total([ph], field="msgs"),
                        "bytes": be.total([ph]), "recv_bytes": be.total([ph], field="recv_bytes")}
                       for ph in ("forward", "backward")]}


def run_all(ctx, stage, plans, x, t, micro, args, ref, layers):
    """Every plan walked in turn (after GPipe and 1F1B: m = p - 2, cut into its own micro-batches); the
    results rows, what each run counted, and on rank 0 every rank's rows, gathered for the tables."""
    runs, comm = [], {}
    for name, pl in plans.items():
        few = ctx.world_size - 2 if name == "1f1b few" else 0
        cut, asked = (shards.chunk_bounds(args.batch, few), few) if few else (micro, args.micro)
        runs.append(run_schedule(ctx, stage, name, pl, x, t, cut, asked, args, ref, comm))
    lo, hi = layers
    mine = (ctx.rank, f"{lo}-{hi - 1}" if hi - lo > 1 else str(lo), {r["schedule"]: r["loss_ratio"] for r in runs},
            {r["schedule"]: r["grad_ratio"] for r in runs}, {r["schedule"]: r for r in runs})
    return runs, comm, ctx.comm.gather(mine, root=0)


# ---------------------------------------------------------------- one process, the whole batch
def one_process(dims, flats, x, t, batch):
    """The loss and every layer's gradient, on the host, whole batch, whole model (the reference)."""
    last, acts = len(dims) - 1, [x]
    for k, (fan_in, fan_out) in enumerate(dims):
        acts.append(ten.forward_layer(np, acts[-1], flats[k], fan_in, fan_out, k == last))
    loss = float(((acts[-1] - t) ** 2).sum() / batch)
    gy, grads = ten.loss_grad(acts[-1], t, batch), [None] * len(dims)
    for k in reversed(range(len(dims))):
        grads[k] = np.zeros_like(flats[k])
        gy = ten.backward_layer(acts[k], acts[k + 1], gy, flats[k], grads[k], *dims[k], k == last)
    return loss, grads


def max_diff(mine, ref):
    return max([float(np.abs(buffers.to_host(g) - ref[k]).max()) for k, g in mine.items()] + [0.0])


def ratios(loss, grads, ref):
    """|difference| / the oracle's budget (lessons/pipeline_parallel/budget.py): the loss, and the worst
    entry of my layers' gradients. ref: (loss, grads, loss budget, grad budgets)."""
    return {"loss_ratio": tolerance.worst_ratio(loss - ref[0], ref[2]),
            "grad_ratio": max([tolerance.worst_ratio(buffers.to_host(g) - ref[1][k], ref[3][k])
                               for k, g in grads.items()] + [0.0])}


def torch_section(ctx, stage, dims, flats, host, x, t, m, batch):
    """6. torch.distributed.pipelining on the same stages, from the same weights, against one process.
    Its stages size their receive buffers from the first micro-batch, so every micro-batch must have as
    many rows: it gets the largest part of the batch m divides, and its own one-process reference."""
    report.section(ctx, "6. torch.distributed.pipelining: the same stages, ScheduleGPipe and Schedule1F1B")
    n, rows = ctx.world_size, m * (batch // m)
    ref = (*one_process(dims, flats, host[0][:rows], host[1][:rows], rows),
           *budget.bounds(dims, flats, host[0][:rows], host[1][:rows], rows, str(flats[0].dtype)))
    names = [name for name in SCHEDULES if name == "gpipe" or m >= n]  # torch's 1F1B refuses m < p
    got = []
    for name in names:
        loss, grads = torch_pipelining.run(ctx, stage, name, x[:rows], t[:rows], m, rows, ten.unflatten)
        loss = ctx.comm.bcast(loss, root=n - 1)  # plain MPI, uncounted: for checking only
        got.append({"schedule": name, "torch_vs_ref": max(ratios(loss, grads, ref).values())})
    every = ctx.comm.gather((ctx.rank, *(f"{g['torch_vs_ref']:.2g}" for g in got)), root=0)
    if ctx.rank == 0:
        show.torch(ctx, text.once(every), names, m, rows, batch)
    return got


def flags():
    parser = bootstrap.lesson_parser(__file__, __doc__)
    parser.add_argument("--layers", type=bootstrap.positive(int), default=LAYERS,
                        help=f"linear layers, at least one per stage (default {LAYERS})")
    parser.add_argument("--hidden", type=bootstrap.positive(int), default=HIDDEN,
                        help=f"the hidden width: every layer's but the first's input and the last's "
                             f"output (default {HIDDEN})")
    parser.add_argument("--batch", type=bootstrap.positive(int), default=BATCH,
                        help=f"rows in the batch (default {BATCH})")
    parser.add_argument("--micro", type=bootstrap.positive(int), default=MICRO,
                        help=f"micro-batches, at most --batch (default {MICRO})")
    parser.add_argument("--dtype", choices=DTYPES, default="float64")
    parser.add_argument("--seed", type=int, default=ten.SEED, help=f"weights and data's seed (default {ten.SEED})")
    parser.add_argument("--grid", action="store_true", help="print the grids even when they are wide")
    return parser


def main():
    args, ctx = bootstrap.start(__file__, flags())
    n, rank, m, dtype = ctx.world_size, ctx.rank, args.micro, np.dtype(args.dtype)
    if args.layers < n:
        ctx.fail(f"--layers {args.layers} cannot fill {n} stages: give at least one layer per rank")
    if m > args.batch:
        ctx.fail(f"--micro {m} is more than --batch {args.batch}: a micro-batch needs a row")
    sizes = [IN_WIDTH] + [args.hidden] * (args.layers - 1) + [OUT_WIDTH]
    dims, flats = ten.layer_dims(sizes), ten.init_flats(sizes, dtype, args.seed)  # lesson 10's seeded MLP
    host = ten.make_data(sizes, args.batch, dtype, args.seed)                    # the batch (x, t), on the host
    x, t = (buffers.on_device(ctx, a) for a in host)
    split = shards.chunk_bounds(args.layers, n)    # stage s holds layers split[s]
    micro = shards.chunk_bounds(args.batch, m)     # micro-batch i is rows micro[i]
    plans = plans_for(n, m)                                            # every send meets its receive
    ref = (*one_process(dims, flats, *host, args.batch),              # (loss, grads): the reference,
           *budget.bounds(dims, flats, *host, args.batch, args.dtype))  # and the oracle's budgets
    stage = Stage(ctx, buffers.array_module(ctx), dims, flats, split[rank])  # my layers, on my device

    report.section(ctx, f"1. the pipeline: {args.layers} layers on {n} stage(s), batch {args.batch} in "
                        f"{m} micro-batches, {args.dtype}, {ctx.api} ({ctx.transport})")
    if rank == 0:
        show.split(ctx, dims, split, micro, args, dtype.itemsize, ten.layer_items)
    report.section(ctx, "2. the schedules: rank x tick grids")
    if rank == 0:
        show.grids(ctx, plans, m, args.grid)
    runs, comm, every = run_all(ctx, stage, plans, x, t, micro, args, ref, split[rank])  # walk each grid
    report.section(ctx, "3. the loss and every layer's gradient, against one process")
    if rank == 0:
        show.equal(ctx, every, ref[0], args.dtype)
    report.section(ctx, "4. the bubble: idle ticks in the run (graded), idle wall-clock time (reported)")
    if rank == 0:
        show.bubble(ctx, every, (n - 1) / (m + n - 1))
    report.section(ctx, "5. the cost: messages each stage sent, activations it held")
    if rank == 0:
        show.cost(ctx, every, m, dtype.itemsize, args)                 # and 1F1B's at m = p - 2
    torch_runs = torch_section(ctx, stage, dims, flats, host, x, t, m, args.batch) if ctx.api == "torch" else []
    params = {"layers": args.layers, "hidden": args.hidden, "batch": args.batch, "micro": args.micro,
              "dtype": args.dtype, "itemsize": dtype.itemsize}
    report.finish(ctx, {"first_layer": split[rank][0], "stage_layers": split[rank][1] - split[rank][0],
                        "runs": runs, "torch": torch_runs, "comm": comm}, params=params)


if __name__ == "__main__":
    main()
