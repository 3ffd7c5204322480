"""What lesson 12's rank 0 prints: the split, the grids, the checks against one process, the bubble on
the clock and in ticks, the cost, and torch's pipelining. Tables and the sentences that explain them,
each chosen by what this run measured. Pure printing: the values come in as arguments.

`every` is the rows rank 0 gathered, one per rank: (rank, layers, {schedule: loss_err},
{schedule: grad_err}, {schedule: the run's results row}).
"""
import os

from common import text, timing
from lessons.pipeline_parallel import schedules

TITLE = {"gpipe": "GPipe", "1f1b": "1F1B"}  # the schedules, in the order they run and print
GROUP = {("mpi4py", "cpu"): "comm.Isend and comm.Irecv, then MPI.Request.Waitall (common/p2p.py)",
         ("mpi4py", "gpu"): "ncclSend and ncclRecv between nccl.groupStart() and groupEnd() (common/p2p.py)",
         ("torch", "cpu"): "dist.batch_isend_irecv of P2POps, then wait() on each (gloo; common/p2p.py)",
         ("torch", "gpu"): "dist.batch_isend_irecv of P2POps, then wait() on each (nccl; common/p2p.py)"}


def split(ctx, dims, layers, micro, args, itemsize, layer_items):
    """1. Which layers each stage holds, and how the batch is cut. layer_items(fan_in, fan_out): the
    parameters of one layer (lesson 10's)."""
    n = ctx.world_size
    rows = []
    for s, (lo, hi) in enumerate(layers):
        widths = [dims[lo][0]] + [dims[k][1] for k in range(lo, hi)]
        items = sum(layer_items(*dims[k]) for k in range(lo, hi))
        rows.append((s, f"{lo}-{hi - 1}" if hi - lo > 1 else str(lo), hi - lo,
                     " -> ".join(map(str, widths)), items))
    print(text.table(["stage = rank", "layers", "count", "widths", "parameters"], rows,
                     align=[True, False, True, False, True]))
    sizes = [b - a for a, b in micro]
    extra = len(dims) % n
    print(f"{len(dims)} layers on {n} stage(s): {len(dims) // n} each"
          + (f", the first {extra} one more" if extra else "") + " (shards.chunk_bounds)")
    extra = args.batch % args.micro
    print(f"{args.batch} rows in {args.micro} micro-batches: {text.brief(sizes)}"
          + (f", the first {extra} one row more" if extra else ""))
    print(f"an activation or gradient message: a micro-batch's rows x {args.hidden} x {itemsize} B"
          if n > 1 else "one stage: it sends nothing, but runs the schedules all the same", flush=True)


def grids(ctx, plans, m, full):
    """2. Each schedule's rank x tick grid (cut to its first block of ticks unless `full`)."""
    n = ctx.world_size
    print("F3: forward of micro-batch 3, B3: its backward, .: idle; one op per tick, each at the "
          "earliest\ntick its inputs allow")
    for name in TITLE:
        pl = plans[name]
        lines = schedules.render(pl.grid, text.WIDTH)
        idle = schedules.bubble(pl.grid)
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


def equal(ctx, every, ref_loss, dtype):
    """3. Every rank's loss and gradients against one process's, as |difference| / budget."""
    rows = [(r, lay) + tuple(f"{x[name]:.2g}" for name in TITLE for x in (loss, grad))
            for r, lay, loss, grad, *_ in every]
    print(text.table(["rank", "layers"] + [f"{TITLE[n]} {w}" for n in TITLE for w in
                                           ("loss/budget", "grads/budget")], rows,
                     align=[True, False, True, True, True, True]))
    print(text.wrapped(f"ref: one process, the whole batch through the whole model: loss {ref_loss:.12g}. A "
                       f"stage sums its gradient micro-batch by micro-batch, one process in one product: "
                       f"|difference| / budget, the worst entry; budget: common/tolerance.py's parity of B "
                       f"row terms, 2 gamma_k * sum|row terms| ({dtype}, lessons/pipeline_parallel/budget.py)",
                       hang=0), flush=True)


def bubble(ctx, every, formula, cores=None):
    """4. The bubble in ticks (graded) and on each rank's clock; where the clock does not show the
    formula, the causes this run measured, each only where its numbers show it. cores: those this
    process may run on (default: its affinity)."""
    if cores is None:
        cores = timing.usable_cores()
    n, rows = ctx.world_size, []
    for r, _, _, _, runs in every:
        rows.append((r,) + tuple(x for name in TITLE for x in (
            f"{runs[name]['ran']}/{runs[name]['ticks']}", round(runs[name]["bubble"], 3),
            round(runs[name]["wall_idle"], 3), round(runs[name]["waited_s"] / runs[name]["wall_s"], 3))))
    print(text.table(["rank"] + [w for nm in TITLE for w in
                                 (f"{TITLE[nm]} busy/ticks", "idle", "wall idle", "in msgs")], rows,
                     align=[True] * 9))
    print(text.wrapped(f"(p-1)/(m+p-1) = {formula:.4f}. idle: idle ticks / ticks walked, in the run (graded). "
                       "wall idle: 1 - time in ops / time of the walk; in msgs: time in message groups (the "
                       "transfer, and the wait for a neighbour) / time of the walk; each on its rank's clock "
                       "(reported only)"))
    if n == 1:
        print("one stage: no one to wait for, no bubble", flush=True)
        return
    runs = [runs[nm] for *_, runs in every for nm in TITLE]
    walls, msgs = [r["wall_idle"] for r in runs], [r["waited_s"] / r["wall_s"] for r in runs]
    other = [1 - (r["busy_s"] + r["waited_s"]) / r["wall_s"] for r in runs]
    op_us = [1e6 * sum(runs[nm]["busy_s"] for nm in TITLE) / max(sum(runs[nm]["ran"] for nm in
             TITLE), 1) for *_, runs in every]           # per rank: one op, on average
    ops = f"an op took {min(op_us):.0f}-{max(op_us):.0f} us (mean per rank)"
    if all(abs(w - formula) <= 0.05 + 0.2 * formula for w in walls):
        print(text.wrapped(f"the wall clock shows the bubble too: every rank's wall idle is within 0.05 + "
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
          + "\n".join(text.wrapped("- " + line) for line in why), flush=True)


def cost(ctx, every, m, itemsize, args):
    """5. Messages each stage sent, and the activations it held at the peak (measured)."""
    n = ctx.world_size
    same = all(r[4]["gpipe"]["phases"] == r[4]["1f1b"]["phases"] for r in every)
    rows = []
    for r, _, _, _, runs in every:
        f, b = runs["gpipe"]["phases"]
        rows.append((r, f["msgs"], f["bytes"], b["msgs"], b["bytes"], runs["gpipe"]["peak"],
                     runs["1f1b"]["peak"], min(n - r, m), runs["gpipe"]["peak_bytes"],
                     runs["1f1b"]["peak_bytes"]))
    print(text.table(["rank", "fwd msgs", "fwd B", "bwd msgs", "bwd B", "held: GPipe", "1F1B",
                      "min(p-s,m)", "GPipe B", "1F1B B"], rows, align=[True] * 10))
    per = args.batch * args.hidden * itemsize
    print(("sent: the same for GPipe and 1F1B. " if same else "sent: GPipe's (1F1B's differ: the JSON "
           "has them). ") + (f"Closed form: m = {m} messages, B x hidden x itemsize = {per} B\n"
                             "in all, each way; no activation leaves the last stage, no gradient the "
                             "first" if n > 1 else "One stage: nothing to send"))
    print("held: micro-batches whose activations a stage holds at the peak (measured), and their bytes",
          flush=True)
    if "1f1b few" in every[0][4]:
        few(ctx, [runs["1f1b few"] for *_, runs in every])


def few(ctx, got):
    """5. 1F1B with fewer micro-batches than stages: what each stage held, and whether it was right.
    got: every stage's results row of that run."""
    n, m = ctx.world_size, got[0]["micro"]
    held = [g["peak"] for g in got]
    want = [min(n - s, m) for s in range(n)]
    batches = f"{m} micro-batch" + ("es" if m > 1 else "")
    print(f"1F1B again with m = {batches}, fewer than the {n} stages (graded like the main run):\n"
          f"  warm-up min(p-s-1, m); held at the peak, stage 0..{n - 1}: {' '.join(map(str, held))} "
          f"(min(p-s, m): {' '.join(map(str, want))});\n  idle ticks {got[0]['bubble']:.3f} of stage 0's "
          f"((p-1)/(m+p-1) = {(n - 1) / (m + n - 1):.3f})", flush=True)


def torch(ctx, rows, names, m, used, batch):
    """6. torch.distributed.pipelining against one process. rows: (rank or ranks, max |torch - ref| per
    schedule run), identical rows once; used: the rows of the batch it ran on."""
    print(text.table(["rank"] + [f"{TITLE[name]}: |torch - ref| / budget" for name in names], rows,
                     align=[True] * 3))
    if len(names) < len(TITLE):
        print(f"Schedule1F1B not run: torch refuses fewer micro-batches ({m}) than stages ({ctx.world_size})")
    print("over the loss and my layers' gradients; PipelineStage(net, s, p), scale_grads=False"
          + ("" if used == batch else
             f"\non the first {used} rows (m x floor(B/m)): its stages size their receive "
             "buffers from the\nfirst micro-batch, so every micro-batch must have as many "
             "rows; ref: one process on those rows"), flush=True)
