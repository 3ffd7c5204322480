"""Lesson 05 — the ring all-reduce by hand: reduce-scatter, then all-gather, neighbours only.

The idea: cut the buffer into N chunks. Each rank talks only to its neighbours: it sends to the
right (rank+1) and receives from the left (rank-1).
  * reduce-scatter, N-1 steps: at step s rank r sends chunk (r-s) mod N and adds the chunk
    (r-s-1) mod N that arrives from the left to its own. After N-1 steps rank r holds the full
    sum of chunk (r+1) mod N.
  * all-gather, N-1 more steps: the finished chunks travel once around the ring, overwriting.
So 2(N-1) steps, and each rank sends every chunk but one in each phase: about 2(N-1)/N of the
buffer, whatever N is. That is why busbw = algbw * 2(N-1)/N, and why the ring is bandwidth-optimal.

What to watch for:
  * section 1 runs the ring on several counts (0, 1, N-1, 7, 1000003 by default: counts N does not
    divide, and counts smaller than N, give uneven and empty chunks) and compares each result with
    the library's all-reduce on the same data. Integers must match exactly. Floats may differ in
    the last bits: the ring adds the N pieces of chunk j in ring order, the library in its own
    order, and float addition is not associative (error <= (N-1)*eps*sum|x|, shown).
  * the runner then grades the algorithm, not only the sum: steps = 2(N-1), every message goes to
    rank+1, all ranks together send exactly 2(N-1) buffers, and each rank sends 2(N-1)/N of its buffer
    give or take a chunk's rounding. Any correct ring passes: where the finished chunks land (chunk
    r+1 on rank r here; chunk r on rank r in MPI_Reduce_scatter_block and NCCL's ReduceScatter) is a
    convention, and it only decides which two chunks a rank never sends.
  * --trace draws the whiteboard: rank 0's data is A, rank 1's B, ...; `AC1` is chunk 1 summed
    over ranks A and C so far. NP <= 8. --trace-png PATH draws the same run as a picture, ranks down,
    steps across: which slice each rank sent to whom, and which it received and added.
  * section 2 races the ring against the library (MPI_Allreduce, gloo or NCCL all-reduce) with
    nccl-tests' columns; section 3 measures one neighbour exchange (alpha) and sets the ring's
    smallest-size time beside 2(N-1)*alpha and the library's, saying what the numbers show on this
    run and transport. --bench runs the full sweep (-b 8 -e 128M -f 2).

Run it:
  make lesson-05 NP=4                   (API=torch; ARGS="--trace"; ARGS="--dtype int32 --counts 5,9")
  .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py lessons/05_ring_allreduce.py --api mpi4py
The full race is a benchmark (minutes on a small machine): run it raw, or give bin/tutor a --timeout:
  .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py lessons/05_ring_allreduce.py --bench --csv r.csv
  (--plot r.png: busbw vs size, ring and library; --json PATH keeps every row and every rank's counts
  from common/counting.py; -b/-e/-f/-n/-w as in nccl-tests)
Read any nccl-tests line:  bin/tutor busbw --op allreduce --bytes B --time-us T --ranks N
"""
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import numpy as np  # noqa: E402

from common import bandwidth, bootstrap, buffers, counting, guard, p2p, plot, report, shards  # noqa: E402

DTYPES = ("float32", "float64", "int32")
EPS = {"float32": 1.2e-7, "float64": 2.3e-16, "int32": 0.0}  # machine epsilon (ints: exact)
SEED = 5                   # rank r's data comes from seed SEED + r
TRACE_MAX_NP = 8           # letters A..H on the whiteboard
LETTERS, DIGITS = "ABCDEFGH", "0123456789"
RACE = dict(begin="8", end="16M", mult=8, iters=5, warmup=2)        # default run: a short race
LIBRARY = {"mpi": "MPI_Allreduce", "gloo": "gloo all_reduce", "nccl": "ncclAllReduce"}  # who we race
BENCH = dict(begin="8", end="128M", mult=2, iters=20, warmup=5)     # --bench: nccl-tests' defaults


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


def chunk_sizes(sizes, width=24):
    """`1 1 0 0`, or runs with a count where that is too wide: `200001x3 200000x2`."""
    plain = " ".join(map(str, sizes))
    if len(plain) <= width:
        return plain
    runs = []
    for s in sizes:
        if runs and runs[-1][0] == s:
            runs[-1][1] += 1
        else:
            runs.append([s, 1])
    return " ".join(f"{s}x{k}" if k > 1 else str(s) for s, k in runs)


def ring_allreduce(buf, scratch, bounds, rank, n, exchange, add, after_step=None,
                   phases=("reduce-scatter", "all-gather")):
    """In place: buf becomes the sum over ranks. Works on NumPy, CuPy, torch (and the whiteboard).
    phases: run only these halves (lesson 09's reduce-scatter and all-gather are the ring's halves)."""
    right, left = (rank + 1) % n, (rank - 1) % n
    for phase, step, send, recv in ring_schedule(rank, n):
        if phase not in phases:
            continue
        (a, b), (c, d) = bounds[send], bounds[recv]
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


def traced(exchange, bounds, grid):
    """--trace-png: an exchange and an after_step that note, step by step, the slices this rank sent
    (to whom) and received (from whom; added or copied), as the ring ran them."""
    last = {}

    def send_recv(out, into, dest, source):
        last.update(dest=dest, source=source)
        exchange(out, into, dest, source)

    def after_step(phase, step, send, recv):
        op = "add" if phase == "reduce-scatter" else "copy"
        grid.append(([(*bounds[send], last["dest"])], [(*bounds[recv], last["source"], op)]))
    return send_recv, after_step


def check_counts(ctx, args, be, drawn=None):
    """Section 1: the ring vs the library on every count; per-count values for the runner, derived from
    what the counting communicator saw this rank send. Returns (runs, the steps of count `drawn`)."""
    n, rank, runs, rows, grid = ctx.world_size, ctx.rank, [], [], []
    counted = counting.Counted(be, n)  # every exchange the ring makes goes through it and is counted
    for i, count in enumerate(args.counts):
        label = f"run {i}: count {count}"  # one phase per run: a count may be listed twice (N-1 = 1)
        x = buffers.seeded(SEED + rank, count, args.dtype)
        bounds = shards.chunk_bounds(count, n)
        ring = buffers.on_device(ctx, x.copy())
        lib = buffers.on_device(ctx, x.copy())
        scratch = buffers.empty(ctx, max(b - a for a, b in bounds), args.dtype)
        exchange, after = counted.exchange, None
        if count == drawn and not grid:
            exchange, after = traced(counted.exchange, bounds, grid)
        with counted.phase(label):
            ring_allreduce(ring, scratch, bounds, rank, n, exchange, inplace_add, after)
        be.allreduce(lib)
        be.sync()  # gpu work is async: finish before the host reads
        got, want = buffers.to_host(ring).astype(np.float64), buffers.to_host(lib).astype(np.float64)
        diff = np.abs(got - want)
        rel = float((diff / np.maximum(np.abs(want), 1e-30)).max()) if count else 0.0
        seen = counted.counts.get(label, {}).get("exchange", {"calls": 0, "bytes": 0, "peers": []})  # 1 rank: none
        # calls: the ring's steps; bytes: what this rank sent; peers: the ranks it sent a non-empty chunk to
        runs.append({"rank": rank, "count": count, "steps": seen["calls"], "bytes_sent": seen["bytes"],
                     "total_sent": ctx.comm.allreduce(seen["bytes"]),  # every rank's, added
                     "dest_lo": min(seen["peers"], default=-1), "dest_hi": max(seen["peers"], default=-1),
                     "mismatches": int((diff > 0).sum()), "max_rel_err": rel})
        sizes = chunk_sizes([b - a for a, b in bounds])
        share = round(seen["bytes"] / x.nbytes, 3) if count else "-"
        rows.append([count, sizes, rank, seen["calls"], seen["bytes"], share,
                     ",".join(map(str, seen["peers"])) or "-", int((diff > 0).sum()), rel])
    every = ctx.comm.gather(rows, root=0)
    if rank == 0:  # one table: a count's shared columns once, then one row per rank
        table = [row if r == 0 else ["", ""] + row[2:] for i in range(len(rows)) for r, row in
                 enumerate(mine[i] for mine in every)]
        print(report.table(["count", "chunk sizes", "rank", "steps", "bytes sent", "x buffer", "to",
                            "#differ", "max rel err"], table,
                           align=[True, False, True, True, True, True, False, True, True]))
        print(f"x buffer: bytes sent / buffer bytes, 2(N-1)/N = {2 * (n - 1) / n:.3g} give or take "
              "a chunk's rounding\nto: the ranks this rank sent a non-empty chunk to", flush=True)
    return runs, counted.counts, grid


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

    def show(phase, step, send, recv):
        report.section(ctx, f"step {step + 1}/{2 * (n - 1)}  {phase}")
        report.say(ctx, f"chunk {send} -> {(rank + 1) % n}, chunk {recv} <- {(rank - 1) % n}   now: "
                        + " ".join(board))

    report.section(ctx, f"whiteboard: {n} ranks, count {count} in chunks of "
                        f"{[b - a for a, b in shards.chunk_bounds(count, n)]}; start")
    report.say(ctx, " ".join(board))
    ring_allreduce(board, scratch, bounds, rank, n, exchange, add, after_step=show)


def race(ctx, args, be, pick, sweep):
    """Section 2: ring vs library over a size sweep, nccl-tests' columns; returns the rows."""
    n, rank = ctx.world_size, ctx.rank
    itemsize = np.dtype(args.dtype).itemsize
    rows = []
    for size in sweep:
        count = max(size // itemsize, 1)
        x = buffers.seeded(SEED + rank, count, args.dtype, small_ints=True)
        bounds = shards.chunk_bounds(count, n)
        ring, lib = buffers.on_device(ctx, x.copy()), buffers.on_device(ctx, x.copy())
        scratch = buffers.empty(ctx, max(b - a for a, b in bounds), args.dtype)
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
        rows.append({"size": nb, "count": count, "type": args.dtype, "redop": "sum",
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


def mpi_library():
    """'MPICH', 'Open MPI' or the first words of whatever MPI this is (its own version string)."""
    from mpi4py import MPI
    text = MPI.Get_library_version().strip()
    return next((name for name in ("MPICH", "Open MPI") if text.startswith(name)), " ".join(text.split()[:2]))


def library_story(ctx, small, alpha):
    """What the library's smallest-size time says, in the words of the transport that ran it."""
    n, lib_alphas = ctx.world_size, small["lib_us"] / (alpha * 1e6)
    steps, lg = 2 * (n - 1), math.ceil(math.log2(n))
    said = f"library at {small['size']} B: {small['lib_us']:.1f} us = {lib_alphas:.1f} alphas. "
    if ctx.transport == "gloo":  # torch calls gloo's allreduce with no algorithm: gloo runs its ring
        return [said + "gloo's all-reduce, as torch calls it, is a ring",
                f"  too, driven from C++: {small['lib_us'] / steps:.1f} us per step, against {alpha * 1e6:.1f} us "
                "for one of our exchanges", "  (each a call from Python)"]
    if ctx.transport == "nccl":
        return [said + "NCCL picks ring or tree, and a protocol, per call",
                "  from its own cost model (NCCL_ALGO / NCCL_PROTO force one; NCCL_DEBUG=INFO",
                "  NCCL_DEBUG_SUBSYS=TUNING shows its choice)"]
    name = mpi_library()
    if name != "MPICH":
        return [said + f"{name} picks its algorithm per size;", "  this run does not show which"]
    head = [said + "MPICH's classic pick below",
            "  MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE (2048 B; its tuning may choose another) is recursive",
            f"  doubling: ceil(lg N) = {lg} exchanges, not {steps};"]
    if lib_alphas < small["ring_us"] / (alpha * 1e6):
        return head + ["  it took fewer alphas than the ring, as such an algorithm would"]
    return head + ["  here it took no fewer alphas than the ring: this run does not show it"]


def latency_story(ctx, rows, alpha):
    """Section 3's lines: the ring's smallest size against 2(N-1)*alpha, the library's, the largest size."""
    n, cores = ctx.world_size, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    small, big, steps = rows[0], rows[-1], 2 * (n - 1)
    model = steps * alpha * 1e6
    meas = small["ring_us"] / model if model > 0 else float("nan")
    lines = [f"alpha = one neighbour exchange of 1 element, made as the ring makes them: {alpha * 1e6:.1f} us",
             f"at {small['size']} B the ring makes {steps} = 2(N-1) in a row: 2(N-1)*alpha = {model:.1f} us, "
             f"measured {small['ring_us']:.1f} us ({meas:.2f}x)"]
    if 1 / 1.5 <= meas <= 1.5:
        lines.append("  within 1.5x: the ring's small-message time is its 2(N-1) latencies, as the model says")
    elif meas > 1.5:
        lines.append("  over 1.5x the model: a step in the ring costs more than a lone exchange here"
                     + (f" ({n} ranks, {cores} cores)" if n > cores else ""))
    else:
        lines.append("  under the model: a lone exchange costs more than a step inside the ring here")
    lines += library_story(ctx, small, alpha)
    share = model / big["ring_us"] if big["ring_us"] > 0 else 0.0
    lines.append(f"at {bandwidth.human(big['size'])}, 2(N-1)*alpha is {share:.0%} of the ring's time: " +
                 ("bandwidth, not latency, decides there" if share < 0.25 else
                  "latency still counts; --bench goes larger"))
    return lines


def main():
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
    args, ctx = bootstrap.start(__file__, parser)
    n = ctx.world_size
    if args.counts is None:
        args.counts = [0, 1, n - 1, 7, 1000003]
    args.counts = list(dict.fromkeys(args.counts))  # each count once (at NP 2, N-1 is 1)
    if args.trace and n > TRACE_MAX_NP:
        ctx.fail(f"--trace draws at most {TRACE_MAX_NP} ranks (letters A..H), got {n}")
    try:
        pick, sweep = bandwidth.sweep_plan(args, RACE, BENCH)  # -b/-e/-f/-n/-w given win over the plan's
    except ValueError as exc:
        ctx.fail(str(exc))
    raced = not args.no_race and n > 1
    if args.csv and guard.refusal(args.csv, "CSV"):  # said before any work, not after the race
        ctx.fail(f"--csv {guard.refusal(args.csv, 'CSV')}")
    for flag, path in (("--plot", args.plot), ("--trace-png", args.trace_png)):
        problem = path and plot.cannot_write(path)  # said before any work, not after the race
        if problem or (flag == "--plot" and path and not raced):
            ctx.fail(f"{flag} {problem or 'draws the race: it needs 2+ ranks and no --no-race'}")
    be = p2p.backend(ctx)  # exchange: comm.Sendrecv / grouped ncclSend+ncclRecv / batch_isend_irecv
    itemsize = np.dtype(args.dtype).itemsize
    drawn = min(args.counts, key=lambda c: (c < n, c))  # the smallest count with a chunk for every rank
    params = {"dtype": args.dtype, "itemsize": itemsize, "race": int(raced), "counts": args.counts}

    if args.trace:
        whiteboard(ctx, drawn)

    report.section(ctx, f"1. the ring on {n} ranks, {args.dtype}, api {ctx.api} ({ctx.transport}), "
                        f"vs the library's all-reduce")
    runs, counts, grid = check_counts(ctx, args, be, drawn)
    if args.dtype != "int32" and ctx.rank == 0:
        print(f"floats: the ring adds chunk j's N pieces in ring order, the library in its own; float\n"
              f"addition is not associative, so allow (N-1)*eps = {(n - 1) * EPS[args.dtype]:.2g} of sum|x|",
              flush=True)
    grids = ctx.comm.gather(grid, root=0)  # every rank's steps, as it ran them
    if args.trace_png and ctx.rank == 0:
        print(plot.schedule_png(args.trace_png, {f"ring all-reduce, count {drawn}": grids}, drawn,
                                f"who sends which slice to whom: {n} ranks, api {ctx.api} ({ctx.transport})"),
              flush=True)
    summary = {}
    if raced:
        rows = race(ctx, args, be, pick, sweep)
        alpha = latency(ctx, be, args.dtype, max(pick["iters"], 20))
        if ctx.rank == 0:
            report.section(ctx, f"2. the race: ring vs {LIBRARY[ctx.transport]}, in place")
            print(f"time: the slowest rank's mean of {pick['iters']} after {pick['warmup']} warm-up\n"
                  f"busbw = algbw*2(N-1)/N; ring/lib = ring busbw / lib busbw")
            print(report.table(["size B", "count", "type", "redop", "ring us", "algbw", "busbw",
                                "lib us", "algbw", "busbw", "#wrong", "ring/lib"],
                               [(r["size"], r["count"], r["type"], r["redop"], round(r["ring_us"], 1),
                                 round(r["ring_algbw"], 3), round(r["ring_busbw"], 3), round(r["lib_us"], 1),
                                 round(r["lib_algbw"], 3), round(r["lib_busbw"], 3), r["wrong"],
                                 round(r["ratio"], 2)) for r in rows]))
            print(bandwidth.chart([r["size"] for r in rows], {"ring": [r["ring_busbw"] for r in rows],
                                                              "library": [r["lib_busbw"] for r in rows]}))
            print("\n".join(["", "== 3. where the ring loses: latency"] + latency_story(ctx, rows, alpha)),
                  flush=True)
            if args.csv:
                report.write_csv(args.csv, rows)
                print(f"wrote {args.csv}")
            if args.plot:
                print(plot.busbw_png(args.plot, [r["size"] for r in rows],
                                     {"ring (by hand)": [r["ring_busbw"] for r in rows],
                                      LIBRARY[ctx.transport]: [r["lib_busbw"] for r in rows]},
                                     f"all-reduce busbw, {n} ranks, api {ctx.api} ({ctx.transport})"))
        big = rows[-1]
        summary = {"race": rows, "alpha_us": alpha * 1e6, "busbw_ring_GBps": big["ring_busbw"],
                   "busbw_lib_GBps": big["lib_busbw"], "race_wrong": sum(r["wrong"] for r in rows)}
    elif not args.no_race and ctx.rank == 0:  # one rank: said, not skipped in silence (--bench asked it)
        print(f"\nno race on one rank: its ring sends nothing and busbw's 2(N-1)/N is 0"
              f"{'; --bench' if args.bench else '; the race'} needs -n 2 or more", flush=True)
    report.finish(ctx, {"runs": runs, "comm": counts}, summary=summary, params=params)


if __name__ == "__main__":
    main()
