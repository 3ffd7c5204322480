"""Lesson 12 — pipeline parallelism with send/recv: GPipe and 1F1B, their bubble and their memory.

The idea: cut the model's layers into p stages, one per rank (stage s on rank s), and the batch into m
micro-batches. A micro-batch's forward runs stage 0, 1, ..., p-1: each stage sends its output (the
activation) to the next. Its backward runs the other way: each stage sends the gradient of its input
to the previous one. Only neighbours talk, and only micro-batch activations travel, never parameters.
  GPipe  every stage runs all m forwards, then all m backwards (here B(m-1) .. B0, last in first out;
         B0 .. B(m-1) on every stage takes as long). Here, without re-materialization, each stage
         holds every activation of all m micro-batches until their backwards. GPipe's paper
         re-materializes: a stage keeps only each micro-batch's input and recomputes the rest in the
         backward, so it holds m inputs plus one micro-batch's activations, for a second forward.
  1F1B   stage s runs a warm-up of min(p-s-1, m) forwards, then alternates one forward, one backward,
         then a cool-down of the backwards left. A micro-batch's activations are freed by its backward
         as soon as it can run, so stage s holds at most min(p-s, m) of them (PipeDream-Flush, the
         schedule Megatron-LM runs).
Both finish in the same time. The bubble, the fraction of a stage's time spent idle while the pipe
fills and drains, is (p-1)/(m+p-1) for both (GPipe's paper): with one op per tick each stage is busy
2m of the 2(m+p-1) ticks; with a backward of tB ticks and a forward of tF it is idle (p-1)(tF+tB) of
(m+p-1)(tF+tB) ticks, the same fraction. More micro-batches shrink the bubble; 1F1B keeps the memory.
The loss is the sum over the whole batch of |y - t|^2, divided by B (the whole batch, not the
micro-batch): so each micro-batch's gradients are already its share, and a stage adds them up
(accumulates) over the m micro-batches to get the whole batch's gradient.

The schedule is pure (lessons/pipeline_parallel/schedules.py, as lesson 07's): from every stage's order of ops it
places each op at the earliest tick its inputs allow, which gives a rank x tick grid, and the messages
of every tick. Every rank computes every stage's, and checks that every send meets its receive in the
same tick, before anything runs: a broken order (a backward before its forward) stops every rank with
one error naming who waits for what, instead of hanging. Then each rank walks its row of the grid: in
each tick it posts that tick's forward messages as one group (an activation out to s+1, one in from
s-1), then its backward messages as another, every rank in that order, so the groups of a tick meet.
A group posts its sends and receives together (p2p.group: Isend/Irecv + Waitall on MPI; ncclSend /
ncclRecv between groupStart and groupEnd on NCCL; dist.batch_isend_irecv on torch), so a stage's
receive never waits behind its own send: the tick's messages move at once, not one after another
down the chain. Then it runs its op. A message travels in the tick its consumer runs: the sender
keeps it until then (an activation it keeps anyway for its own backward; a gradient in an outbox).

What to watch for:
  1. the split: L layers on p stages as evenly as possible (shards.chunk_bounds: the first L % p
     stages take one more layer), B rows in m micro-batches the same way (the first B % m take one
     more row). Every activation that crosses a stage boundary is a micro-batch's rows x the hidden
     width (all layers but the first and last are hidden x hidden).
  2. the grids, GPipe's and 1F1B's (F3: forward of micro-batch 3, B3 its backward, .: idle), the
     same length; the idle cells are the bubble, the pipe filling and draining (1F1B's first stages
     also wait for their first backward). --grid prints them even when wide.
  3. equal to one process (checked): the loss and every layer's gradient, for both schedules,
     against one process running the whole batch through the whole model. Tolerance: a stage adds
     its gradient micro-batch by micro-batch, one process in one product, so sums differ in the last
     bits (measured: below 5e-16 in float64, 2e-7 in float32); the checks allow 1e-12 / 1e-5.
  4. the bubble, two ways: in ticks, counted in the executed run (each rank counts the ticks it
     walked and those it ran an op in), graded against (p-1)/(m+p-1); and in wall-clock time (the
     time outside ops, and the time in message groups, over the time of the whole walk), reported
     only: a sentence says so when it shows the formula, and when it does not, the causes this run
     measured (time in message groups beyond the bubble, stages of unequal work and how much of the
     walk it can explain, Python between ops, more ranks than cores, a load average above them).
  5. the cost (counted by common/counting.Counted, measured by tracking every stashed array until
     Python frees it): stage s < p-1 sends m activations, B x hidden x itemsize bytes in all; stage
     s > 0 sends m gradients, as many bytes; activations held at the peak, in micro-batches: GPipe m
     on every stage, 1F1B min(p-s, m). Then 1F1B again with m = p-2 micro-batches (p >= 3), fewer
     than the stages, graded by the same checks: its warm-up must stop at m.
  6. on --api torch: torch.distributed.pipelining (PipelineStage, ScheduleGPipe, Schedule1F1B) runs the
     same stages from the same weights; its loss and gradients must equal one process's (checked).
     Its stages size their receive buffers from the first micro-batch, so every micro-batch must have
     as many rows: it runs on the first m x floor(B/m) rows, against one process on those.
     scale_grads=False keeps it from dividing the summed gradients by m (our loss is already / B).
Try: ARGS="--micro 2" (a bubble of (p-1)/(p+1)); ARGS="--micro 30" (small bubble, GPipe holds 30).
To see the bubble on the wall clock, give an op more work than a message costs, on a machine with a
core per rank (the runner starts each rank with one BLAS thread): ARGS="--hidden 1024 --batch 4096"
(section 4 says whether the clock then shows it, and what it measured if not).

Run it:
  make lesson-12 NP=4                      (API=torch; ARGS="--micro 4 --grid"; ARGS="--dtype float32")
  .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py lessons/12_pipeline_parallel.py --api mpi4py
"""
import os
import sys
import textwrap
import weakref

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import bootstrap, buffers, counting, p2p, report, shards, timing  # noqa: E402
from lessons.pipeline_parallel.schedules import ScheduleError, bubble, plan, render  # noqa: E402

IN_WIDTH, OUT_WIDTH = 6, 3  # the model's input and output widths
HIDDEN = 32               # every other width: what an activation message carries per row
LAYERS = 7                # 7 % 3 == 1, 7 % 4 == 3: uneven stages at NP 3 and 4
BATCH = 30                # rows in the batch
MICRO = 8                 # micro-batches: 30 % 8 == 6, so they are uneven (4 and 3 rows)
TOL = {"float64": 1e-12, "float32": 1e-5}  # max |difference| allowed against one process (see 3.)
SCHEDULES = ("gpipe", "1f1b")
TITLE = {"gpipe": "GPipe", "1f1b": "1F1B"}
WIDTH_COLS = 100
GROUP = {("mpi4py", "cpu"): "comm.Isend and comm.Irecv, then MPI.Request.Waitall (common/p2p.py)",
         ("mpi4py", "gpu"): "ncclSend and ncclRecv between nccl.groupStart() and groupEnd() (common/p2p.py)",
         ("torch", "cpu"): "dist.batch_isend_irecv of P2POps, then wait() on each (gloo; common/p2p.py)",
         ("torch", "gpu"): "dist.batch_isend_irecv of P2POps, then wait() on each (nccl; common/p2p.py)"}


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
        return plan([ORDERS[name](s, p, m) for s in range(p)], m, f"the {TITLE[name]} schedule{label}")
    except ScheduleError as exc:
        raise RuntimeError(str(exc)) from None


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
    """What stage s (rank s) owns: layers [lo, hi) of the model and their parameters, on the device.
    ten: lesson 10's module, whose forward_layer and backward_layer run the layers."""

    def __init__(self, ctx, xp, ten, dims, flats, layers):
        self.ctx, self.xp, self.ten, self.dims = ctx, xp, ten, dims
        self.lo, self.hi = layers
        self.last, self.dtype = len(dims) - 1, flats[0].dtype
        self.params = {k: buffers.on_device(ctx, flats[k]) for k in range(self.lo, self.hi)}

    def forward(self, x, i, stash):
        """The forward of micro-batch i through my layers; every activation stashed for the backward."""
        acts = [stash(i, x)]
        for k in range(self.lo, self.hi):
            fan_in, fan_out = self.dims[k]
            acts.append(stash(i, self.ten.forward_layer(self.xp, acts[-1], self.params[k], fan_in,
                                                        fan_out, k == self.last)))
        return acts

    def backward(self, acts, gy, grads):
        """The backward of one micro-batch through my layers, given d loss / d (my output); each layer's
        gradient added to grads[k]. Returns d loss / d (my input), for the previous stage."""
        for k in reversed(range(self.lo, self.hi)):
            fan_in, fan_out, j = *self.dims[k], k - self.lo
            g = buffers.empty(self.ctx, buffers.size(self.params[k]), self.dtype)  # every item written
            gy = self.ten.backward_layer(acts[j], acts[j + 1], gy, self.params[k], g, fan_in, fan_out,
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


def run_schedule(ctx, stage, name, pl, x, t, micro, asked, args, ref_loss, ref_grads, comm, label=None):
    """Walk one schedule's plan, counted; its results row (micro: the m this run was asked for, which the
    checks' closed forms read: micro-batches cut wrong still fail them)."""
    be = counting.Counted(p2p.backend(ctx), ctx.world_size)
    loss, grads, seen = walk(ctx, stage, pl, be, x, t, micro, args.batch, args.hidden)
    loss = ctx.comm.bcast(loss, root=ctx.world_size - 1)  # plain MPI, uncounted: for checking only
    comm[label or name] = be.counts
    return {"schedule": label or name, "micro": asked, "loss": loss, "loss_err": abs(loss - ref_loss),
            "grad_err": max_diff(grads, ref_grads),
            "ticks": seen["ticks"], "ran": seen["ran"], "bubble": 1 - seen["ran"] / seen["ticks"],
            "peak": seen["held"].peak, "peak_bytes": seen["held"].peak_bytes,
            "busy_s": seen["busy"], "waited_s": seen["waited"], "wall_s": seen["total"],
            "quickest_group_s": seen["quickest"],
            "groups": be.total(field="calls"), "wall_idle": 1 - seen["busy"] / seen["total"],
            "phases": [{"phase": ph, "msgs": be.total([ph], field="msgs"),
                        "bytes": be.total([ph]), "recv_bytes": be.total([ph], field="recv_bytes")}
                       for ph in ("forward", "backward")]}


# ---------------------------------------------------------------- one process, the whole batch
def one_process(ten, dims, flats, x, t, batch):
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


# ---------------------------------------------------------------- torch's own pipelining
def torch_pipelining(ctx, stage, name, x, t, m, batch):
    """torch.distributed.pipelining on my layers, from the same weights, batch (x, t) in m equal
    micro-batches: (its loss, its gradients as {layer: flat})."""
    import torch
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    s, p = ctx.rank, ctx.world_size
    mods = []
    for k in range(stage.lo, stage.hi):
        fan_in, fan_out = stage.dims[k]
        lin = torch.nn.Linear(fan_in, fan_out, dtype=x.dtype, device=x.device)
        w, b = stage.ten.unflatten(stage.params[k], fan_in, fan_out)
        with torch.no_grad():
            lin.weight.copy_(w.T)  # torch keeps weight as (out, in)
            lin.bias.copy_(b)
        mods += [lin] + ([torch.nn.Tanh()] if k != stage.last else [])
    net = torch.nn.Sequential(*mods)
    kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[name]
    # our loss is already divided by B: scale_grads=False, or torch divides the sum by m once more
    schedule = kind(PipelineStage(net, s, p, x.device), n_microbatches=m,
                    loss_fn=lambda y, target: ((y - target) ** 2).sum() / batch, scale_grads=False)
    losses = []
    if p == 1:
        schedule.step(x, target=t, losses=losses)
    elif s == 0:
        schedule.step(x)
    elif s == p - 1:
        schedule.step(target=t, losses=losses)
    else:
        schedule.step()
    lins = [mod for mod in net if isinstance(mod, torch.nn.Linear)]
    grads = {k: torch.cat([lin.weight.grad.T.reshape(-1), lin.bias.grad]).detach()
             for k, lin in zip(range(stage.lo, stage.hi), lins)}
    return float(sum(loss.detach() for loss in losses)) if losses else 0.0, grads


# ---------------------------------------------------------------- what rank 0 prints
def show_split(ctx, ten, dims, split, micro, args, itemsize):
    n = ctx.world_size
    rows = []
    for s, (lo, hi) in enumerate(split):
        widths = [dims[lo][0]] + [dims[k][1] for k in range(lo, hi)]
        items = sum(ten.layer_items(*dims[k]) for k in range(lo, hi))
        rows.append((s, f"{lo}-{hi - 1}" if hi - lo > 1 else str(lo), hi - lo,
                     " -> ".join(map(str, widths)), items))
    print(report.table(["stage = rank", "layers", "count", "widths", "parameters"], rows,
                       align=[True, False, True, False, True]))
    sizes = [b - a for a, b in micro]
    extra = len(dims) % n
    print(f"{len(dims)} layers on {n} stage(s): {len(dims) // n} each"
          + (f", the first {extra} one more" if extra else "") + " (shards.chunk_bounds)")
    extra = args.batch % args.micro
    print(f"{args.batch} rows in {args.micro} micro-batches: {report.brief(sizes)}"
          + (f", the first {extra} one row more" if extra else ""))
    print(f"an activation or gradient message: a micro-batch's rows x {args.hidden} x {itemsize} B"
          if n > 1 else "one stage: it sends nothing, but runs the schedules all the same", flush=True)


def show_grids(ctx, plans, m, full):
    n = ctx.world_size
    print("F3: forward of micro-batch 3, B3: its backward, .: idle; one op per tick, each at the "
          "earliest\ntick its inputs allow")
    for name, pl in plans.items():
        lines = render(pl.grid, WIDTH_COLS)
        idle = bubble(pl.grid)
        print(f"{TITLE[name]}: {pl.ticks} ticks, each stage busy {2 * m}, idle {pl.ticks - 2 * m} "
              f"({idle[0]:.3f} of its ticks)")
        blocks = sum(line.startswith("ticks ") for line in lines)
        if blocks <= 1 or full:
            print("\n".join(lines))
        else:
            print("\n".join(lines[:n + 1]) + f"\n  ... {blocks - 1} more block(s) of ticks: --grid "
                  "prints them")
    nmsg = sum(len(st[ph][0]) for row in plans["gpipe"].steps for st in row
               for ph in ("forward", "backward"))  # 2 m (p-1): the same for both schedules
    if nmsg:
        print(f"checked before anything ran: each of a schedule's {nmsg} messages meets its receive in "
              f"the tick\nits consumer runs. A tick's forward messages go as one group, then its "
              f"backward ones:\n{GROUP[(ctx.api, ctx.device)]}", flush=True)
    else:
        print("checked before anything ran: one stage, no messages", flush=True)


def show_equal(ctx, every, ref_loss, tol, dtype):
    rows = [(r, lay) + tuple(x for name in SCHEDULES for x in (loss[name], grad[name]))
            for r, lay, loss, grad, *_ in every]
    print(report.table(["rank", "layers"] + [f"{TITLE[n]} {w}" for n in SCHEDULES for w in
                                             ("|loss - ref|", "max |grad - ref|")], rows,
                       align=[True, False, True, True, True, True]))
    print(f"ref: one process, the whole batch through the whole model: loss {ref_loss:.12g}. "
          f"Tolerance {tol:g}\n({dtype}): a stage sums its gradient micro-batch by micro-batch, one "
          "process in one product", flush=True)


def show_bubble(ctx, every, formula, cores):
    n, rows = ctx.world_size, []
    for r, _, _, _, runs in every:
        rows.append((r,) + tuple(x for name in SCHEDULES for x in (
            f"{runs[name]['ran']}/{runs[name]['ticks']}", round(runs[name]["bubble"], 3),
            round(runs[name]["wall_idle"], 3), round(runs[name]["waited_s"] / runs[name]["wall_s"], 3))))
    print(report.table(["rank"] + [w for nm in SCHEDULES for w in
                                   (f"{TITLE[nm]} busy/ticks", "idle", "wall idle", "in msgs")], rows,
                       align=[True] * 9))
    print(wrapped(f"(p-1)/(m+p-1) = {formula:.4f}. idle: idle ticks / ticks walked, in the run (graded). "
                  "wall idle: 1 - time in ops / time of the walk; in msgs: time in message groups (the "
                  "transfer, and the wait for a neighbour) / time of the walk; each on its rank's clock "
                  "(reported only)"))
    if n == 1:
        print("one stage: no one to wait for, no bubble", flush=True)
        return
    runs = [runs[nm] for *_, runs in every for nm in SCHEDULES]
    walls, msgs = [r["wall_idle"] for r in runs], [r["waited_s"] / r["wall_s"] for r in runs]
    other = [1 - (r["busy_s"] + r["waited_s"]) / r["wall_s"] for r in runs]
    op_us = [1e6 * sum(runs[nm]["busy_s"] for nm in SCHEDULES) / max(sum(runs[nm]["ran"] for nm in
             SCHEDULES), 1) for *_, runs in every]           # per rank: one op, on average
    ops = f"an op took {min(op_us):.0f}-{max(op_us):.0f} us (mean per rank)"
    if all(abs(w - formula) <= 0.05 + 0.2 * formula for w in walls):
        print(wrapped(f"the wall clock shows the bubble too: every rank's wall idle is within 0.05 + "
                      f"20% of (p-1)/(m+p-1); {ops}"), flush=True)
        return
    why, beyond = [], 0.05 + 1.2 * formula  # each reason only where this run's numbers show it
    if min(msgs) > beyond:
        why.append(f"every rank spent {min(msgs):.0%}-{max(msgs):.0%} of its walk in message groups, where "
                   f"the ticks leave {formula:.0%} idle: the messages, and the waits behind them, cost "
                   "that much (the formula counts messages free)")
    worst = (max(op_us) - min(op_us)) * every[0][4]["gpipe"]["ran"] / 1e6  # s: each of 2m ops, waited
    share = worst / min(r["wall_s"] for r in runs)
    if max(op_us) > 1.25 * min(op_us) and share > 0.05:
        why.append(f"{ops}: stages of unequal work, so the others wait for the slowest, at most "
                   f"{share:.0%} of a walk (the formula counts equal stages)")
    if max(other) > 0.1:
        why.append(f"up to {max(other):.0%} of a walk was neither an op nor a message group: Python "
                   "walking the grid, between them")
    if n > cores:
        why.append(f"{n} ranks share {cores} core(s): a rank's clock also runs while another rank "
                   "has its core")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if load > max(n, cores):
        why.append(f"the load average is {load:.1f} on {cores} core(s), more than this run's {n} "
                   "ranks: other processes share the cores")
    if not why:
        why.append(f"{ops}; no cause this run can name")
    print("the wall clock does not show the formula here (the ticks do):\n"
          + "\n".join(wrapped("- " + line) for line in why), flush=True)


def wrapped(text):
    return textwrap.fill(text, WIDTH_COLS, subsequent_indent="  ", break_on_hyphens=False)


def show_cost(ctx, every, m, itemsize, args):
    n = ctx.world_size
    same = all(r[4]["gpipe"]["phases"] == r[4]["1f1b"]["phases"] for r in every)
    rows = []
    for r, _, _, _, runs in every:
        f, b = runs["gpipe"]["phases"]
        rows.append((r, f["msgs"], f["bytes"], b["msgs"], b["bytes"], runs["gpipe"]["peak"],
                     runs["1f1b"]["peak"], min(n - r, m), runs["gpipe"]["peak_bytes"],
                     runs["1f1b"]["peak_bytes"]))
    print(report.table(["rank", "fwd msgs", "fwd B", "bwd msgs", "bwd B", "held: GPipe", "1F1B",
                        "min(p-s,m)", "GPipe B", "1F1B B"], rows, align=[True] * 10))
    per = args.batch * args.hidden * itemsize
    print(("sent: the same for GPipe and 1F1B. " if same else "sent: GPipe's (1F1B's differ: the JSON "
           "has them). ") + (f"Closed form: m = {m} messages, B x hidden x itemsize = {per} B\n"
                             "in all, each way; no activation leaves the last stage, no gradient the "
                             "first" if n > 1 else "One stage: nothing to send"))
    print("held: micro-batches whose activations a stage holds at the peak (measured), and their bytes",
          flush=True)


def show_few(ctx, run, few):
    """1F1B with fewer micro-batches than stages: what each stage held, and whether it was right."""
    n = ctx.world_size
    got = ctx.comm.gather((run["peak"], run["bubble"]), root=0)
    if ctx.rank:
        return
    held = [g[0] for g in got]
    want = [min(n - s, few) for s in range(n)]
    batches = f"{few} micro-batch" + ("es" if few > 1 else "")
    print(f"1F1B again with m = {batches}, fewer than the {n} stages (graded like the main run):\n"
          f"  warm-up min(p-s-1, m); held at the peak, stage 0..{n - 1}: {' '.join(map(str, held))} "
          f"(min(p-s, m): {' '.join(map(str, want))});\n  idle ticks {got[0][1]:.3f} of stage 0's "
          f"((p-1)/(m+p-1) = {(n - 1) / (few + n - 1):.3f})", flush=True)


def main():
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
    parser.add_argument("--dtype", choices=sorted(TOL), default="float64")
    parser.add_argument("--grid", action="store_true", help="print the grids even when they are wide")
    args, ctx = bootstrap.start(__file__, parser)
    n, rank, m = ctx.world_size, ctx.rank, args.micro
    if args.layers < n:
        ctx.fail(f"--layers {args.layers} cannot fill {n} stages: give at least one layer per rank")
    if m > args.batch:
        ctx.fail(f"--micro {m} is more than --batch {args.batch}: a micro-batch needs a row")
    xp = buffers.array_module(ctx)  # numpy, cupy or torch (one thread per rank)
    ten = bootstrap.lesson_module("10")  # lesson 10's seeded MLP: forward_layer, backward_layer
    dtype = np.dtype(args.dtype)
    sizes = [IN_WIDTH] + [args.hidden] * (args.layers - 1) + [OUT_WIDTH]
    dims, flats = ten.layer_dims(sizes), ten.init_flats(sizes, dtype)
    host_x, host_t = ten.make_data(sizes, args.batch, dtype)
    x, t = buffers.on_device(ctx, host_x), buffers.on_device(ctx, host_t)
    split = shards.chunk_bounds(args.layers, n)    # stage s holds layers split[s]
    micro = shards.chunk_bounds(args.batch, m)     # micro-batch i is rows micro[i]
    plans = {name: checked_plan(name, n, m) for name in SCHEDULES}
    few = n - 2 if n >= 3 else 0  # m < p - 1: a warm-up of p - s - 1 forwards would not fit in m
    few_plan = few and checked_plan("1f1b", n, few,
                                    f" with m = {few} micro-batch(es) for {n} stages (a warm-up stops at m)")
    ref_loss, ref_grads = one_process(ten, dims, flats, host_x, host_t, args.batch)
    stage = Stage(ctx, xp, ten, dims, flats, split[rank])
    itemsize, tol = dtype.itemsize, TOL[args.dtype]

    head = f"{args.dtype}, {ctx.api} ({ctx.transport})"
    report.section(ctx, f"1. the pipeline: {args.layers} layers on {n} stage(s), batch {args.batch} in "
                        f"{m} micro-batches, {head}")
    if rank == 0:
        show_split(ctx, ten, dims, split, micro, args, itemsize)
    report.section(ctx, "2. the schedules: rank x tick grids")
    if rank == 0:
        show_grids(ctx, plans, m, args.grid)

    runs, comm = [], {}
    for name in SCHEDULES:
        runs.append(run_schedule(ctx, stage, name, plans[name], x, t, micro, args.micro, args, ref_loss,
                                 ref_grads, comm))
    if few:  # also graded: 1F1B with fewer micro-batches than stages, where the warm-up must stop at m
        runs.append(run_schedule(ctx, stage, "1f1b", few_plan, x, t, shards.chunk_bounds(args.batch, few),
                                 few, args, ref_loss, ref_grads, comm, label="1f1b few"))

    report.section(ctx, "3. the loss and every layer's gradient, against one process")
    lo, hi = split[rank]
    layers = f"{lo}-{hi - 1}" if hi - lo > 1 else str(lo)
    mine = (rank, layers, {r["schedule"]: r["loss_err"] for r in runs},
            {r["schedule"]: r["grad_err"] for r in runs},
            {r["schedule"]: r for r in runs})
    every = ctx.comm.gather(mine, root=0)
    if rank == 0:
        show_equal(ctx, every, ref_loss, tol, args.dtype)
    formula = (n - 1) / (m + n - 1)
    report.section(ctx, "4. the bubble: idle ticks in the run (graded), idle wall-clock time (reported)")
    if rank == 0:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        show_bubble(ctx, every, formula, cores)
    report.section(ctx, "5. the cost: messages each stage sent, activations it held")
    if rank == 0:
        show_cost(ctx, every, m, itemsize, args)
    if few:
        show_few(ctx, runs[-1], few)

    torch_runs = []
    if ctx.api == "torch":
        report.section(ctx, "6. torch.distributed.pipelining: the same stages, ScheduleGPipe and "
                            "Schedule1F1B")
        # its stages size their receive buffers from the first micro-batch: every micro-batch must
        # have as many rows, so it gets the largest batch m divides, and its own one-process reference
        rows = m * (args.batch // m)
        ref_loss_t, ref_grads_t = one_process(ten, dims, flats, host_x[:rows], host_t[:rows], rows)
        got = []
        # torch's Schedule1F1B refuses fewer micro-batches than stages (a ValueError): not run then
        names = [name for name in SCHEDULES if name == "gpipe" or m >= n]
        for name in names:
            loss, grads = torch_pipelining(ctx, stage, name, x[:rows], t[:rows], m, rows)
            loss = ctx.comm.bcast(loss, root=n - 1)  # plain MPI, uncounted: for checking only
            got.append({"schedule": name, "torch_vs_ref": max(abs(loss - ref_loss_t),
                                                              max_diff(grads, ref_grads_t))})
        torch_runs = got
        every = ctx.comm.gather((rank, *(g["torch_vs_ref"] for g in got)), root=0)
        if rank == 0:
            print(report.table(["rank"] + [f"{TITLE[name]}: max |torch - ref|" for name in names],
                               ten.once(every), align=[True] * 3))
            if len(names) < len(SCHEDULES):
                print(f"Schedule1F1B not run: torch refuses fewer micro-batches ({m}) than stages ({n})")
            print(f"over the loss and my layers' gradients; PipelineStage(net, s, p), scale_grads=False"
                  + ("" if rows == args.batch else
                     f"\non the first {rows} rows (m x floor(B/m)): its stages size their receive "
                     "buffers from the\nfirst micro-batch, so every micro-batch must have as many "
                     "rows; ref: one process on those rows"), flush=True)
    params = {"layers": args.layers, "hidden": args.hidden, "batch": args.batch, "micro": args.micro,
              "dtype": args.dtype, "itemsize": itemsize, "tol": tol}
    report.finish(ctx, {"first_layer": split[rank][0], "stage_layers": split[rank][1] - split[rank][0],
                        "runs": runs, "torch": torch_runs, "comm": comm}, params=params)


if __name__ == "__main__":
    main()
