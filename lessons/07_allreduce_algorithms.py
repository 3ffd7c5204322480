"""Lesson 07 — the all-reduce zoo: five algorithms on the same point-to-point bricks, priced by the
alpha-beta model, then a tuner that picks one per message size (as NCCL and MPICH do).

The idea: every all-reduce algorithm is a *schedule*: for rank r of N, a list of rounds, each round a
few sends (lo, hi, peer) and receives (lo, hi, peer, add|copy) on slices of the buffer. One executor
runs any schedule (all messages of a round in flight at once, adds after the round's wait): tree
(binomial reduce, then broadcast), rd (recursive doubling), rabenseifner (recursive halving, then
doubling: you write its halving below), ring (lesson 05's), dbt (NCCL's double binary tree). Each
schedule's docstring says its rounds and bytes; model.py's predict prices each one (alpha-beta-gamma).

What to watch for:
  * section 1 runs every algorithm on several counts (0, 1, N-1, 7, 1000003 by default) against the
    library's all-reduce on the same data, and counts rounds, messages and bytes. Every rank first
    checks all ranks' schedules against each other: a broken one stops every rank with one line.
  * section 2 measures alpha (ping-pong rank 0 <-> 1), beta (its slope), gamma (dst += src), says
    what the model leaves out where numbers show it (more ranks than cores, shared links, a step in
    the ping-pong, Python per round), then each algorithm's predicted time beside its measured one.
  * section 3 builds a switch table (fastest algorithm per size) and races the tuned all-reduce against
    the library's, in the same run: lib time / tuned time >= 1 means the tuned one is at least as fast.

Run it:
  make lesson-07 NP=4                   (API=torch; ARGS="--dtype int32 --counts 5,9"; ARGS="--algos rd,ring")
  .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py lessons/07_allreduce_algorithms.py --api mpi4py
The full sweep is a benchmark (minutes on a small machine): run it raw (--plot, --trace-png: see --help)
  .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py lessons/07_allreduce_algorithms.py --bench --csv t.csv

Read next: lessons/allreduce_algorithms/ (schedules.py: the other schedules and the executor; model.py:
the model and its measurement; tuner.py: the race; show.py: the tables), then lesson 08.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import numpy as np  # noqa: E402

from common import bandwidth, bootstrap, buffers, counting, p2p, plot, report, shards  # noqa: E402
from common.timing import best_of  # noqa: E402
from lessons.allreduce_algorithms import show  # noqa: E402
from lessons.allreduce_algorithms.model import (dbt_chunks, iterations, measure_model, predict,  # noqa: E402
                                                round_overhead)
from lessons.allreduce_algorithms.schedules import (checked_plan, dbt_depth, dbt_schedule, fold,  # noqa: E402
                                                    pre_post, rd_schedule, ring_schedule, to_real, to_virtual,
                                                    tree_schedule)
from lessons.allreduce_algorithms.tuner import show_race, switch_points, tuned_race  # noqa: E402

ALGOS = ("tree", "rd", "rabenseifner", "ring", "dbt")
DTYPES = ("float32", "float64", "int32")
EPS = {"float32": 1.2e-7, "float64": 2.3e-16, "int32": 0.0}  # machine epsilon (ints: exact)
SEED = 7                     # rank r's data comes from seed SEED + r
SWEEP = dict(begin="4K", end="1M", mult=16, iters=6, warmup=1)     # default: a short sweep
BENCH = dict(begin="4K", end="128M", mult=2, iters=30, warmup=3)   # --bench: the sweep
PING_ITERS = 10              # round trips per ping-pong size at least (more with -n)
NO_MODEL = dict(alpha=0.0, beta=0.0, gamma=0.0, alpha_all=0.0, beta_ring=0.0)  # one rank: no ping-pong partner
OUTPUTS = {"--csv": "CSV", "--plot": "PNG", "--trace-png": "PNG"}  # refused before any work if unwritable


# ---- the schedules (allreduce_algorithms/schedules.py holds the others): a round is (sends, recvs) -----
# sends: [(lo, hi, peer)]; recvs: [(lo, hi, peer, "add" | "copy")]. Every rank gets the same number
# of rounds (some empty), so the ranks stay in step.

def rabenseifner_schedule(rank, n, count):
    """Reduce-scatter by recursive halving, all-gather by recursive doubling: 2 lg N rounds, about
    2(N-1)/N of the buffer sent in all (folded to N' = 2^floor(lg N) ranks first: schedules.pre_post)."""
    p2, r = fold(n)
    v = to_virtual(rank, r)
    bounds = shards.chunk_bounds(count, p2)  # chunk j ends up finished on virtual rank j

    def span(a, b):  # elements of chunks a..b-1
        return bounds[a][0], bounds[b - 1][1]
    core, lo, hi = [], 0, p2  # [lo, hi): the chunks this rank is still responsible for
    mask = p2 // 2
    while mask >= 1:  # reduce-scatter by recursive halving
        rnd = ([], [])
        if v is not None:
            peer = to_real(v ^ mask, r)
            # >>> exercise: halving
            mid = (lo + hi) // 2
            if v & mask:  # upper partner keeps the upper half
                keep, give = (mid, hi), (lo, mid)
            else:
                keep, give = (lo, mid), (mid, hi)
            rnd = ([(*span(*give), peer)], [(*span(*keep), peer, "add")])
            lo, hi = keep
            # <<< exercise: halving
        core.append(rnd)
        mask //= 2
    mask = 1
    while mask < p2:  # all-gather by recursive doubling: swap finished blocks, the block doubles
        rnd = ([], [])
        if v is not None:
            peer = to_real(v ^ mask, r)
            plo = (v ^ mask) & ~(mask - 1)  # the partner's block starts here
            rnd = ([(*span(lo, hi), peer)], [(*span(plo, plo + mask), peer, "copy")])
            lo, hi = min(lo, plo), max(hi, plo + mask)
        core.append(rnd)
        mask <<= 1
    return pre_post(rank, n, count, core)


def schedule(algo, rank, n, count, k=1):
    if algo == "dbt":
        return dbt_schedule(rank, n, count, k)
    return {"tree": tree_schedule, "rd": rd_schedule, "rabenseifner": rabenseifner_schedule,
            "ring": ring_schedule}[algo](rank, n, count)


def plan(ctx, algo, count, k, buf, dtype):
    """This rank's Plan for `algo`, once every rank's schedule is known to meet its peers' (one pure
    check on every rank: a broken schedule stops them all with the same line instead of hanging)."""
    every = [schedule(algo, q, ctx.world_size, count, k) for q in range(ctx.world_size)]
    return checked_plan(ctx, every, buf, dtype, f"the {algo} schedule does not match on count {count}")


# ---- section 1: every algorithm against the library, every message counted ----------------------

def check_counts(ctx, args, be, model, drawn=None):
    """Every algorithm on every count against the library; the values the runner grades are read off
    common/counting.py's counts of each run (a round that talks is one call). Returns (results per
    algorithm, the counts, {algo: the rounds this rank ran on count `drawn`} for --trace-png)."""
    n, rank, itemsize = ctx.world_size, ctx.rank, np.dtype(args.dtype).itemsize
    results, rows, traces = {a: [] for a in args.algos}, [], {}
    counted = counting.Counted(be, n)
    for i, count in enumerate(args.counts):
        x = buffers.seeded(SEED + rank, count, args.dtype)
        lib = buffers.on_device(ctx, x.copy())
        be.allreduce(lib)
        be.sync()
        want = buffers.to_host(lib).astype(np.float64)
        k = dbt_chunks(n, count * itemsize, model["alpha_all"], model["beta_ring"])  # dbt's pipeline depth
        for algo in args.algos:
            buf = buffers.on_device(ctx, x.copy())
            label = f"{algo} run {i}: count {count}"  # one phase per run: a count may be listed twice
            trace = traces.setdefault(algo, []) if count == drawn and algo not in traces else None
            with counted.phase(label):
                plan(ctx, algo, count, k, buf, args.dtype).run(counted, trace)
            be.sync()  # gpu work is async: finish before the host reads
            tally = {"rounds": counted.total([label], field="calls"), "msgs": counted.total([label], field="msgs"),
                     "bytes_sent": counted.total([label]), "bytes_recv": counted.total([label], field="recv_bytes")}
            diff = np.abs(buffers.to_host(buf).astype(np.float64) - want)
            rel = float((diff / np.maximum(np.abs(want), 1e-30)).max()) if count else 0.0
            item = {"count": count, "mismatches": int((diff > 0).sum()), "max_rel_err": rel, **tally,
                    "total_sent": ctx.comm.allreduce(tally["bytes_sent"])}
            if algo == "dbt":
                item.update(k=k, depth=dbt_depth(n) if n > 1 else 0)
            results[algo].append(item)
            rows.append((algo, count, tally["rounds"], tally["msgs"], tally["bytes_sent"], item["total_sent"],
                         item["mismatches"], rel))
    every = ctx.comm.gather(rows, root=0)
    if rank == 0:  # one row per algorithm and count: the range over ranks (every rank's value is in the JSON)
        show.counts(every)
    return results, counted.counts, traces


def sweep_times(ctx, args, be, pick, sizes, model):
    """{size: {algo: seconds}}, identical on every rank."""
    n, itemsize = ctx.world_size, np.dtype(args.dtype).itemsize
    times = {}
    for size in sizes:
        count = max(size // itemsize, 1)
        x = np.zeros(count, dtype=args.dtype)  # timed in place, over and over: zeros never overflow
        k = dbt_chunks(n, count * itemsize, model["alpha_all"], model["beta_ring"])
        plans = {algo: plan(ctx, algo, count, k, buffers.on_device(ctx, x.copy()), args.dtype)
                 for algo in args.algos}
        times[size] = best_of(ctx, be, {a: (lambda p=p: p.run(be)) for a, p in plans.items()},
                              pick["warmup"], iterations(pick, size))
        del plans
    return times


def model_rows(ctx, args, model, sizes, times):
    """Section 2's rows: per size, each algorithm's measured time beside the model's prediction (with
    the lone ping-pong's alpha and beta, and with those measured while every rank talks)."""
    n, itemsize = ctx.world_size, np.dtype(args.dtype).itemsize
    a, b, g = model["alpha"], model["beta"], model["gamma"]
    mrows = []
    for size in sizes if n > 1 else []:
        nb = max(size // itemsize, 1) * itemsize
        k = dbt_chunks(n, nb, model["alpha_all"], model["beta_ring"])
        row = {"size": nb, "alpha_us": a * 1e6, "beta_us": b * 1e6, "gamma_us": g * 1e6, "k": k}
        for algo in args.algos:
            row[f"{algo}_pred_us"] = predict(algo, n, nb, a, b, g, k) * 1e6
            row[f"{algo}_pred_all_us"] = predict(algo, n, nb, model["alpha_all"], model["beta_ring"], g, k) * 1e6
            row[f"{algo}_us"] = times[size][algo] * 1e6
            row[f"{algo}_rounds"] = len(schedule(algo, 0, n, max(size // itemsize, 1), k))
        mrows.append(row)
    return mrows


def draw_rounds(ctx, args, traces, count):
    """--trace-png: every rank's rounds on `count`, as each ran them, one panel per algorithm."""
    every = ctx.comm.gather(traces, root=0)
    if args.trace_png and ctx.rank == 0:
        grids = {f"{algo}, count {count}": [mine[algo] for mine in every] for algo in args.algos}
        print(plot.schedule_png(args.trace_png, grids, count, f"who sends which slice to whom: {ctx.world_size} "
                                f"ranks, api {ctx.api} ({ctx.transport})"), flush=True)


# ---- section 3: the tuner (allreduce_algorithms/tuner.py races it) ------------------------------------------

def switch_table(times):
    """[(size, algo)]: at every measured size the fastest algorithm (times: {size: {algo: s}})."""
    table = []
    for size in sorted(times):
        # >>> exercise: pick
        best = min(times[size], key=lambda a: (times[size][a], a))
        # <<< exercise: pick
        table.append((size, best))
    return table


def race(ctx, args, be, pick, table, model, times):
    """The tuned all-reduce against the library's at every size of the table (tuner.py races them),
    with the sweep's times beside each row for the argmin check."""
    rows = tuned_race(ctx, args, be, pick, table, model,
                      lambda algo, count, k, buf: plan(ctx, algo, count, k, buf, args.dtype), SEED)
    for r, (size, _) in zip(rows, table):
        r.update({f"{algo}_us": times[size][algo] * 1e6 for algo in args.algos})
        r["chosen_us"] = times[size][r["chosen"]] * 1e6
    return rows


def results_of(ctx, args, model, walk, call, table, rows, mrows):
    """(summary, params) for the runner's checks."""
    summary = {"round_walk_us": walk * 1e6, "round_call_us": call * 1e6, "tuned": rows,
               "switch": switch_points(table), "tuned_wrong": sum(r["wrong"] for r in rows)}
    if ctx.world_size > 1:
        summary.update(alpha_us=model["alpha"] * 1e6, beta_ps_per_B=model["beta"] * 1e12,
                       gamma_ps_per_B=model["gamma"] * 1e12, alpha_all_us=model["alpha_all"] * 1e6,
                       beta_ring_ps_per_B=model["beta_ring"] * 1e12, model=mrows)
    params = {"dtype": args.dtype, "itemsize": np.dtype(args.dtype).itemsize, "modeled": int(ctx.world_size > 1),
              "counts": args.counts, "all_algos": int(len(args.algos) == len(ALGOS)),
              **{f"has_{a}": int(a in args.algos) for a in ALGOS}}
    return summary, params


def name_list(text, allowed, what):
    items = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in allowed]
    if bad or not items:
        raise argparse.ArgumentTypeError(f"pick {what} from {','.join(allowed)}, got {text!r}")
    return items


def flags():
    parser = bootstrap.lesson_parser(__file__, __doc__)
    parser.add_argument("--counts", type=bootstrap.count_list, default=None, metavar="C,C,...",
                        help="element counts for section 1 (default 0,1,N-1,7,1000003)")
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    parser.add_argument("--algos", type=lambda t: name_list(t, ALGOS, "algorithms"), default=list(ALGOS),
                        metavar="A,A,...", help=f"a subset of {','.join(ALGOS)}")
    bandwidth.add_sweep_flags(parser, BENCH)
    parser.add_argument("--csv", metavar="PATH", help="write the section-3 table as CSV")
    parser.add_argument("--plot", metavar="PNG", help="measured vs predicted time per algorithm, as a PNG "
                        "(needs 2+ ranks)")
    parser.add_argument("--trace-png", metavar="PNG", help="every algorithm's rounds on one count as run "
                        "(the smallest count N chunks fit in), ranks down, rounds across, as a PNG")
    return parser


def settle(ctx, args):
    """The algorithms in one order, the counts (each once: at NP 2, N-1 is 1), the sweep's plan."""
    args.algos = [a for a in ALGOS if a in args.algos]  # one order on every rank
    args.counts = list(dict.fromkeys([0, 1, ctx.world_size - 1, 7, 1000003] if args.counts is None else args.counts))
    if args.plot and ctx.world_size < 2:
        ctx.fail("--plot draws the model: it needs 2+ ranks (one rank has no alpha or beta)")
    try:
        return bandwidth.sweep_plan(args, SWEEP, BENCH)  # -b/-e/-f/-n/-w given win over the plan's
    except ValueError as exc:
        ctx.fail(str(exc))


def main():
    args, ctx = bootstrap.start(__file__, flags(), outputs=OUTPUTS)
    pick, sizes = settle(ctx, args)                                     # counts, algorithms, sweep sizes
    be = p2p.backend(ctx)  # group: Isend+Irecv+Waitall / grouped ncclSend+ncclRecv / batch_isend_irecv
    # alpha and beta first: dbt's chunk count k comes from them (identical on every rank: slowest mean)
    model = measure_model(ctx, be, args.dtype, max(pick["iters"], PING_ITERS)) if ctx.world_size > 1 else NO_MODEL

    report.section(ctx, f"1. {', '.join(args.algos)} on {ctx.world_size} ranks, {args.dtype}, {ctx.api} "
                        f"({ctx.transport}), vs the library")
    drawn = min(args.counts, key=lambda c: (c < ctx.world_size, c))  # --trace-png: smallest count N chunks fit
    results, counts, traces = check_counts(ctx, args, be, model, drawn)  # 1. every algorithm vs the library
    show.closed_forms(ctx, args, results, EPS[args.dtype])             #    the root's bytes, dbt's k
    draw_rounds(ctx, args, traces, drawn)                              #    --trace-png: who sends what
    walk, call = round_overhead(ctx, be, args.dtype)                   # 2. Python per round, outside alpha
    times = sweep_times(ctx, args, be, pick, sizes, model)             #    every algorithm at every size
    mrows = model_rows(ctx, args, model, sizes, times)                 #    measured beside predicted
    table = switch_table({s: times[s] for s in sizes})                 # 3. the fastest algorithm per size
    rows = race(ctx, args, be, pick, table, model, times)              #    tuned vs the library's
    if ctx.rank == 0:
        show.measured_vs_model(ctx, args, model, mrows, walk)          #    section 2 printed (--plot)
        show_race(ctx, args, table, rows, walk + call)                 #    section 3 printed (--csv)
    summary, params = results_of(ctx, args, model, walk, call, table, rows, mrows)
    report.finish(ctx, {**results, "comm": counts}, summary=summary, params=params)


if __name__ == "__main__":
    main()
