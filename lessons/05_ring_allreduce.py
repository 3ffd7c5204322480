"""Lesson 05 — the ring all-reduce by hand: reduce-scatter, then all-gather, neighbours only.

The idea: cut the buffer into N chunks. Each rank talks only to its neighbours: it sends to the
right (rank+1) and receives from the left (rank-1).
  * reduce-scatter, N-1 steps: at step s rank r sends chunk (r-s) mod N and adds the chunk
    (r-s-1) mod N that arrives from the left to its own. After N-1 steps rank r holds the full
    sum of chunk (r+1) mod N.
  * all-gather, N-1 more steps: the finished chunks travel once around the ring, overwriting.
So 2(N-1) steps, and each rank sends every chunk but one in each phase: about 2(N-1)/N of the
buffer, whatever N is. That is why busbw = algbw * 2(N-1)/N, and why the ring is bandwidth-optimal.

What to watch for: section 1 runs the ring on counts N does not divide (uneven and empty chunks)
against the library: integers match exactly, floats within (N-1)*eps of sum|x| (float addition is
not associative). --trace draws the whiteboard (`AC1`: chunk 1 summed over ranks A and C). Section 2
races ring and library (nccl-tests' columns); 3 sets the smallest size's time beside 2(N-1)*alpha.

Run it:
  make lesson-05 NP=4                   (API=torch; ARGS="--trace"; ARGS="--dtype int32 --counts 5,9")
  .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py lessons/05_ring_allreduce.py --api mpi4py
  (--bench: the full race, minutes; --csv, --plot, --trace-png, -b/-e/-f/-n/-w: see --help)
Read next: common/p2p.py (the exchange), lesson 07 (the other all-reduce algorithms).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import numpy as np  # noqa: E402

from common import bandwidth, bootstrap, buffers, counting, p2p, report, shards  # noqa: E402
from lessons.ring_allreduce import show, trace  # noqa: E402

DTYPES = ("float32", "float64", "int32")
EPS = {"float32": 1.2e-7, "float64": 2.3e-16, "int32": 0.0}  # machine epsilon (ints: exact)
SEED = 5                   # rank r's data comes from seed SEED + r
TRACE_MAX_NP = 8           # letters A..H on the whiteboard
LETTERS, DIGITS = "ABCDEFGH", "0123456789"
RACE = dict(begin="8", end="16M", mult=8, iters=5, warmup=2)        # default run: a short race
BENCH = dict(begin="8", end="128M", mult=2, iters=20, warmup=5)     # --bench: nccl-tests' defaults
OUTPUTS = {"--csv": "CSV", "--plot": "PNG", "--trace-png": "PNG"}  # refused before any work if unwritable


def ring_schedule(rank, n):
    """[(phase, step, chunk I send right, chunk I receive from the left)] for rank `rank` of n."""
    steps = []
    # >>> exercise: schedule
    for s in range(n - 1):  # reduce-scatter: pass partial sums along, adding as they arrive
        steps.append(("reduce-scatter", s, (rank - s) % n, (rank - s - 1) % n))
    for s in range(n - 1):  # all-gather: rank r finished chunk r+1; pass finished chunks along
        steps.append(("all-gather", n - 1 + s, (rank + 1 - s) % n, (rank - s) % n))
    # <<< exercise: schedule
    return steps


def ring_allreduce(buf, scratch, bounds, rank, n, exchange, add, after_step=None,
                   phases=("reduce-scatter", "all-gather")):
    """In place: buf becomes the sum over ranks. Works on NumPy, CuPy, torch (and the whiteboard).
    phases: run only these halves (lesson 09's reduce-scatter and all-gather are the ring's halves)."""
    right, left = (rank + 1) % n, (rank - 1) % n
    for phase, step, send, recv in ring_schedule(rank, n):
        if phase not in phases:
            continue
        (a, b), (c, d) = bounds[send], bounds[recv]
        # exchange(out, into, right, left) sends right while it receives from the left (common/p2p.py):
        #   comm.Sendrecv(out, dest=right, recvbuf=into, source=left)      mpi4py on the cpu
        #   ncclSend(out, right) + ncclRecv(into, left) in one NCCL group   mpi4py on the gpu
        #   dist.batch_isend_irecv([P2POp(isend, out, right), P2POp(irecv, into, left)])   torch
        # >>> exercise: step
        if phase == "reduce-scatter":
            exchange(buf[a:b], scratch[:d - c], right, left)
            add(buf[c:d], scratch[:d - c])  # my partial sum of chunk `recv` plus the left's
        else:
            exchange(buf[a:b], buf[c:d], right, left)  # a finished chunk: overwrite, no add
        # <<< exercise: step
        if after_step:
            after_step(phase, step, send, recv)


def inplace_add(dst, src):
    dst += src  # numpy, cupy and torch all add in place into the view


def whiteboard(ctx, count):
    """--trace: the same ring on symbols. Chunk j of rank r starts as letter(r)+j; an add joins the
    letters (`AC1` is chunk 1 of ranks A and C added)."""
    n, rank = ctx.world_size, ctx.rank
    letter = LETTERS[rank]
    bounds = [(j, j + 1) for j in range(n)]  # one symbol per chunk
    board = np.array([f"{letter}{j}" for j in range(n)], dtype=object)
    scratch = np.empty(n, dtype=object)

    def exchange(out, into, right, left):  # symbols travel as real messages, over MPI
        into[:] = ctx.comm.sendrecv(list(out), dest=right, source=left)

    def add(dst, src):  # chunk j on both sides: join the letters, keep the j
        dst[:] = ["".join(sorted(a.rstrip(DIGITS) + b.rstrip(DIGITS))) + a.lstrip(LETTERS) for a, b in zip(dst, src)]

    def show_step(phase, step, send, recv):
        report.section(ctx, f"step {step + 1}/{2 * (n - 1)}  {phase}")
        report.say(ctx, f"chunk {send} -> {(rank + 1) % n}, chunk {recv} <- {(rank - 1) % n}   now: "
                        + " ".join(board))

    report.section(ctx, f"whiteboard: {n} ranks, count {count} in chunks of "
                        f"{[b - a for a, b in shards.chunk_bounds(count, n)]}; start")
    report.say(ctx, " ".join(board))
    ring_allreduce(board, scratch, bounds, rank, n, exchange, add, after_step=show_step)


def check_counts(ctx, counts, dtype, be, drawn=None):
    """Section 1: the ring vs the library on every count, each exchange counted (common/counting.py).
    Returns (a row per count for the runner, what the counter saw per count, every count's counts,
    the steps of count `drawn` as the ring ran them)."""
    n, rank, runs, seen, grid = ctx.world_size, ctx.rank, [], [], []
    counted = counting.Counted(be, n)  # every exchange the ring makes goes through it and is counted
    for i, count in enumerate(counts):
        label = f"run {i}: count {count}"  # one phase per run: a count may be listed twice (N-1 = 1)
        x = buffers.seeded(SEED + rank, count, dtype)
        bounds = shards.chunk_bounds(count, n)
        ring = buffers.on_device(ctx, x.copy())
        lib = buffers.on_device(ctx, x.copy())
        scratch = buffers.empty(ctx, max(b - a for a, b in bounds), dtype)
        exchange, after = counted.exchange, None
        if count == drawn and not grid:  # --trace-png: note this count's steps
            exchange, after = trace.traced(counted.exchange, bounds, grid)
        with counted.phase(label):
            ring_allreduce(ring, scratch, bounds, rank, n, exchange, inplace_add, after)
        be.allreduce(lib)
        be.sync()  # gpu work is async: finish before the host reads
        seen.append(counted.counts.get(label, {}).get("exchange", {"calls": 0, "bytes": 0, "peers": []}))
        runs.append(compared(ctx, count, ring, lib, seen[-1]))  # 1 rank: no exchange, nothing seen
    return runs, seen, counted.counts, grid


def compared(ctx, count, ring, lib, seen):
    """One count's row for the runner: the ring against the library, and what this rank sent
    (calls: the ring's steps; bytes: what it sent; peers: the ranks it sent a non-empty chunk to)."""
    got, want = buffers.to_host(ring).astype(np.float64), buffers.to_host(lib).astype(np.float64)
    diff = np.abs(got - want)
    rel = float((diff / np.maximum(np.abs(want), 1e-30)).max()) if count else 0.0
    return {"rank": ctx.rank, "count": count, "steps": seen["calls"], "bytes_sent": seen["bytes"],
            "total_sent": ctx.comm.allreduce(seen["bytes"]),  # every rank's, added
            "dest_lo": min(seen["peers"], default=-1), "dest_hi": max(seen["peers"], default=-1),
            "mismatches": int((diff > 0).sum()), "max_rel_err": rel,
            "step_sum": sum(step for _, step, _, _ in ring_schedule(ctx.rank, ctx.world_size))}  # 0..2N-3


def race(ctx, dtype, be, pick, sweep):
    """Section 2: ring vs library over a size sweep, nccl-tests' columns; returns the rows."""
    n, rank = ctx.world_size, ctx.rank
    itemsize = np.dtype(dtype).itemsize
    rows = []
    for size in sweep:
        count = max(size // itemsize, 1)
        x = buffers.seeded(SEED + rank, count, dtype, small_ints=True)
        bounds = shards.chunk_bounds(count, n)
        ring, lib = buffers.on_device(ctx, x.copy()), buffers.on_device(ctx, x.copy())
        scratch = buffers.empty(ctx, max(b - a for a, b in bounds), dtype)
        ring_allreduce(ring, scratch, bounds, rank, n, be.exchange, inplace_add)  # once, for #wrong
        be.allreduce(lib)
        be.sync()
        wrong = int((buffers.to_host(ring) != buffers.to_host(lib)).sum())
        wrong = ctx.comm.allreduce(wrong)
        # timed in place, over and over: values grow, the work per call does not
        t_ring = bandwidth.time_op(ctx.comm, lambda: ring_allreduce(ring, scratch, bounds, rank, n,
                                                                    be.exchange, inplace_add),
                                   pick["warmup"], pick["iters"], be.sync)
        t_lib = bandwidth.time_op(ctx.comm, lambda: be.allreduce(lib), pick["warmup"], pick["iters"], be.sync)
        nb = count * itemsize
        rows.append({"size": nb, "count": count, "type": dtype, "redop": "sum",
                     "ring_us": t_ring * 1e6, "ring_algbw": bandwidth.algbw(nb, t_ring),
                     "ring_busbw": bandwidth.busbw("allreduce", nb, t_ring, n),
                     "lib_us": t_lib * 1e6, "lib_algbw": bandwidth.algbw(nb, t_lib),
                     "lib_busbw": bandwidth.busbw("allreduce", nb, t_lib, n),
                     "wrong": wrong, "ratio": t_lib / t_ring if t_ring > 0 else 0.0})
    return rows


def latency(ctx, be, dtype, iters):
    """Section 3: alpha = one neighbour exchange of one element (slowest rank's mean)."""
    n, rank = ctx.world_size, ctx.rank
    one = buffers.on_device(ctx, np.ones(1, dtype=dtype))
    got = buffers.empty(ctx, 1, dtype)
    return bandwidth.time_op(ctx.comm, lambda: be.exchange(one, got, (rank + 1) % n, (rank - 1) % n),
                             3, iters, be.sync)


def race_summary(rows, alpha):
    """The race for the runner: every row, alpha, the largest size's busbw, #wrong over all sizes."""
    big = rows[-1]
    return {"race": rows, "alpha_us": alpha * 1e6, "busbw_ring_GBps": big["ring_busbw"],
            "busbw_lib_GBps": big["lib_busbw"], "race_wrong": sum(r["wrong"] for r in rows)}


def flags():
    parser = bootstrap.lesson_parser(__file__, __doc__)
    parser.add_argument("--counts", type=bootstrap.count_list, default=None, metavar="C,C,...",
                        help="element counts to run the ring on (default 0,1,N-1,7,1000003)")
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    parser.add_argument("--trace", action="store_true", help="the symbolic whiteboard, per step and rank")
    parser.add_argument("--trace-png", metavar="PNG", help="the ring's steps as a rank x step picture")
    bandwidth.add_sweep_flags(parser, BENCH)
    parser.add_argument("--no-race", action="store_true", help="only the checked ring (section 1)")
    parser.add_argument("--csv", metavar="PATH", help="write the race table as CSV")
    parser.add_argument("--plot", metavar="PNG", help="busbw vs size, ring and library, as a PNG")
    return parser


def plan(ctx, args):
    """(the race's pick and sizes, whether it runs): the flags' other refusals, each one line, now."""
    if args.trace and ctx.world_size > TRACE_MAX_NP:
        ctx.fail(f"--trace draws at most {TRACE_MAX_NP} ranks (letters A..H), got {ctx.world_size}")
    try:
        pick, sweep = bandwidth.sweep_plan(args, RACE, BENCH)  # -b/-e/-f/-n/-w given win over the plan's
    except ValueError as exc:
        ctx.fail(str(exc))
    raced = not args.no_race and ctx.world_size > 1
    if args.plot and not raced:
        ctx.fail("--plot draws the race: it needs 2+ ranks and no --no-race")
    return pick, sweep, raced


def main():
    args, ctx = bootstrap.start(__file__, flags(), outputs=OUTPUTS)  # a bad --csv/--plot path: one line, now
    n, be = ctx.world_size, p2p.backend(ctx)  # be.exchange: comm.Sendrecv / ncclSend+ncclRecv / batch_isend_irecv
    counts = list(dict.fromkeys(args.counts or [0, 1, n - 1, 7, 1000003]))  # each once (at NP 2, N-1 is 1)
    pick, sweep, raced = plan(ctx, args)
    drawn = min(counts, key=lambda c: (c < n, c))  # the smallest count with a chunk for every rank
    if args.trace:
        whiteboard(ctx, drawn)                                                 # the ring on letters, step by step
    show.heading(ctx, args.dtype)
    runs, seen, comm, grid = check_counts(ctx, counts, args.dtype, be, drawn)  # 1. the ring == the library?
    show.counts(ctx, runs, seen, args.dtype, EPS[args.dtype])                  #    a row per count and rank
    trace.draw(ctx, args.trace_png, grid, drawn)                               #    --trace-png: the steps run
    summary = {}
    if raced:
        rows = race(ctx, args.dtype, be, pick, sweep)                          # 2. ring vs library, by size
        alpha = latency(ctx, be, args.dtype, max(pick["iters"], 20))           # 3. one neighbour exchange
        show.race(ctx, rows, alpha, pick, args.csv, args.plot)                 #    tables, chart, what they say
        summary = race_summary(rows, alpha)
    elif not args.no_race:
        show.no_race(ctx, args.bench)                                          # one rank: no race, and why
    params = {"dtype": args.dtype, "itemsize": np.dtype(args.dtype).itemsize, "race": int(raced), "counts": counts}
    report.finish(ctx, {"runs": runs, "comm": comm}, summary=summary, params=params)


if __name__ == "__main__":
    main()
