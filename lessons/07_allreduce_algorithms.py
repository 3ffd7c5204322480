"""Lesson 07 — the all-reduce zoo: five algorithms on the same point-to-point bricks, priced by the
alpha-beta model, then a tuner that picks one per message size (as NCCL and MPICH do).

The idea: every all-reduce algorithm is a *schedule*: for rank r of N, a list of rounds, each round a
few sends (lo, hi, peer) and receives (lo, hi, peer, add|copy) on slices of the buffer. One executor
runs any schedule (all messages of a round in flight at once, adds after the round's wait).
  * tree          binomial reduce to rank 0, then binomial broadcast: 2*ceil(lg N) rounds of the WHOLE
                  buffer; the root receives ceil(lg N) buffers and sends ceil(lg N) (a parameter server,
                  a star, would receive N-1 and send N-1: the tree spreads that over lg N levels)
  * rd            recursive doubling: lg N rounds, partner = rank XOR mask, whole buffer each round
  * rabenseifner  reduce-scatter by recursive halving, all-gather by recursive doubling: 2 lg N rounds,
                  about 2(N-1)/N of the buffer sent in all
  * ring          reduce-scatter + all-gather over neighbours: 2(N-1) rounds, 2(N-1)/N of the buffer
  * dbt           double binary tree (NCCL): two binary trees, the second the first mirrored (N even) or
                  shifted by one (N odd), so a rank inner in one is a leaf in the other; each tree
                  all-reduces half of the buffer in k chunks, reduce up and broadcast down overlapped:
                  chunk c leaves depth d upwards at round c + D - d and downwards at round c + D + d,
                  k + 2D - 1 rounds in all (D = the trees' depth)
N not a power of two (rd, rabenseifner): N' = 2^floor(lg N), r = N - N'. Pre step: among the first 2r
ranks, even ranks send their buffer to rank+1 and sit out; post step: rank+1 sends the result back.

The alpha-beta(-gamma) model (Thakur, Rabenseifner, Gropp 2005): a message of n bytes costs
alpha + n*beta, adding n bytes costs n*gamma. For N ranks and n bytes:
  tree          2*ceil(lg N)*(alpha + n*beta) + ceil(lg N)*n*gamma
  rd            lg N*(alpha + n*beta + n*gamma)
  rabenseifner  2 lg N*alpha + 2(N-1)/N*n*beta + (N-1)/N*n*gamma
  ring          2(N-1)*alpha + 2(N-1)/N*n*beta + (N-1)/N*n*gamma
  non-power-of-two (rd, rabenseifner, lg -> floor(lg N) on N'): + 2*alpha + 2*n*beta + n*gamma (pre, post)
  dbt (read off this schedule): (k + 2D - 1) rounds; per round alpha + s*(n/2k)*beta + a*(n/2k)*gamma,
                  s <= 4 chunks sent and a <= 2 added by the busiest rank (up + 2 down in the tree where
                  it is inner, up in the one where it is a leaf), so at most
                  (k + 2D - 1)*(alpha + 2n/k*beta + n/k*gamma); the lesson sums it round by round.
  dbt's k: the k that minimises (k + 2D - 1)*(alpha + 4*(n/2k)*beta):  k = sqrt((2D-1)*2n*beta/alpha),
                  rounded, clamped to 1..64, with alpha and beta measured while every rank talks at once
                  (what a dbt round costs; on an oversubscribed machine far more than the ping-pong's).

What to watch for:
  * section 1 runs every algorithm on several counts (0, 1, N-1, 7, 1000003 by default) against the
    library's all-reduce on the same data, and counts rounds, messages and bytes. The runner grades the
    algorithm by closed forms (rounds, bytes per rank, bytes through the root), not only the sum.
    Before any schedule runs, every rank checks all ranks' schedules against each other (each send
    meets a receive of the same slice in the same round): a broken one stops every rank with the
    same error naming the round and the slices, no hang.
  * section 2 measures alpha (ping-pong rank 0 <-> 1), beta (slope of the ping-pong), gamma (dst += src)
    and prints each algorithm's predicted time beside its measured one (best of 3 interleaved batches),
    then what this run measured that the model leaves out, each only where the numbers show it: more
    ranks than cores, links slower when every rank talks, a step in the ping-pong (on MPI often the
    eager/rendezvous switch of lesson 01), a per-byte cost that changes with size, and the Python each
    round costs (walking the round plus, on MPI, a library call that moves nothing).
  * section 3 builds a switch table (fastest algorithm per size) and races the tuned all-reduce against
    the library's, in the same run: lib time / tuned time >= 1 means the tuned one is at least as fast.

Run it:
  make lesson-07 NP=4                   (API=torch; ARGS="--dtype int32 --counts 5,9"; ARGS="--algos rd,ring")
  .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py lessons/07_allreduce_algorithms.py --api mpi4py
The full sweep is a benchmark (minutes on a small machine): run it raw, or give bin/tutor a --timeout:
  .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py lessons/07_allreduce_algorithms.py --bench --csv t.csv
  (--plot m.png: measured vs predicted time per algorithm; --trace-png s.png: every algorithm's rounds
  on one count as run, ranks down, rounds across; --json PATH keeps each rank's counted messages)

Where the rest is: this file holds the idea you write (Rabenseifner's halving, the tuner's pick), the
checks of section 1 and main(). lessons/allreduce_algorithms/schedules.py holds the other schedules and the executor,
allreduce_algorithms/model.py the model and its measurement (section 2), allreduce_algorithms/tuner.py the race (section 3).
"""
import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import numpy as np  # noqa: E402

from common import bandwidth, bootstrap, buffers, counting, guard, p2p, plot, report, shards  # noqa: E402
from common.timing import best_of  # noqa: E402
from lessons.allreduce_algorithms.model import (KMAX, dbt_chunks, iterations, measure_model, predict,  # noqa: E402
                               round_overhead, show_model, wrapped)
from lessons.allreduce_algorithms.schedules import (checked_plan, dbt_depth, dbt_schedule, fold, pre_post,  # noqa: E402
                                   rd_schedule, ring_schedule, to_real, to_virtual, tree_schedule)
from lessons.allreduce_algorithms.tuner import show_race, switch_points, tuned_race  # noqa: E402

ALGOS = ("tree", "rd", "rabenseifner", "ring", "dbt")
DTYPES = ("float32", "float64", "int32")
EPS = {"float32": 1.2e-7, "float64": 2.3e-16, "int32": 0.0}  # machine epsilon (ints: exact)
SEED = 7                     # rank r's data comes from seed SEED + r
SWEEP = dict(begin="4K", end="1M", mult=16, iters=6, warmup=1)     # default: a short sweep
BENCH = dict(begin="4K", end="128M", mult=2, iters=30, warmup=3)   # --bench: the sweep
PING_ITERS = 10              # round trips per ping-pong size at least (more with -n)


def name_list(text, allowed, what):
    items = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in allowed]
    if bad or not items:
        raise argparse.ArgumentTypeError(f"pick {what} from {','.join(allowed)}, got {text!r}")
    return items


# ---- the schedules (lessons/allreduce_algorithms/schedules.py holds the others): a round is (sends, recvs) ----------
# sends: [(lo, hi, peer)]; recvs: [(lo, hi, peer, "add" | "copy")]. Every rank gets the same number
# of rounds (some empty), so the ranks stay in step.

def rabenseifner_schedule(rank, n, count):
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
        def spread(values):
            lo, hi = min(values), max(values)
            return lo if lo == hi else f"{lo}-{hi}"
        print(report.table(["algo", "count", "rounds", "msgs", "bytes sent", "all ranks sent", "#differ",
                            "max rel err"],
                           [(algo, count, spread([r[i][2] for r in every]), spread([r[i][3] for r in every]),
                             spread([r[i][4] for r in every]), total, sum(r[i][6] for r in every),
                             max(r[i][7] for r in every))
                            for i, (algo, count, _, _, _, total, _, _) in enumerate(rows)],
                           align=[False] + [True] * 7))
        print("rounds, msgs, bytes sent: per rank, lowest-highest over the ranks; #differ: over all ranks",
              flush=True)
    return results, counted.counts, traces


def sweep_times(ctx, args, be, pick, sizes, model):
    """{size: {algo: seconds}}, identical on every rank."""
    n, rank, itemsize = ctx.world_size, ctx.rank, np.dtype(args.dtype).itemsize
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


def main():
    parser = bootstrap.lesson_parser(__file__, __doc__)
    parser.add_argument("--counts", type=bootstrap.count_list, default=None, metavar="C,C,...",
                        help="element counts for section 1 (default 0,1,N-1,7,1000003)")
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    parser.add_argument("--algos", type=lambda t: name_list(t, ALGOS, "algorithms"), default=list(ALGOS),
                        metavar="A,A,...", help=f"a subset of {','.join(ALGOS)}")
    bandwidth.add_sweep_flags(parser, BENCH)
    parser.add_argument("--csv", metavar="PATH", help="write the section-3 table as CSV")
    parser.add_argument("--plot", metavar="PNG", help="measured vs predicted time per algorithm, as a PNG")
    parser.add_argument("--trace-png", metavar="PNG", help="each algorithm's rounds as a rank x round picture")
    args, ctx = bootstrap.start(__file__, parser)
    n, rank = ctx.world_size, ctx.rank
    args.algos = [a for a in ALGOS if a in args.algos]  # one order on every rank
    if args.counts is None:
        args.counts = [0, 1, n - 1, 7, 1000003]
    args.counts = list(dict.fromkeys(args.counts))  # each count once (at NP 2, N-1 is 1)
    try:
        pick, sizes = bandwidth.sweep_plan(args, SWEEP, BENCH)  # -b/-e/-f/-n/-w given win over the plan's
    except ValueError as exc:
        ctx.fail(str(exc))
    if args.csv and guard.refusal(args.csv, "CSV"):  # no folder, or a file the kit did not write
        ctx.fail(f"--csv {guard.refusal(args.csv, 'CSV')}")
    for flag, path in (("--plot", args.plot), ("--trace-png", args.trace_png)):
        problem = path and plot.cannot_write(path)  # said before any work, not after the sweep
        if problem or (flag == "--plot" and path and n < 2):
            ctx.fail(f"{flag} {problem or 'draws the model: it needs 2+ ranks (one rank has no alpha or beta)'}")
    be = p2p.backend(ctx)  # group: Isend+Irecv+Waitall / grouped ncclSend+ncclRecv / batch_isend_irecv
    itemsize = np.dtype(args.dtype).itemsize
    modeled = n > 1  # the ping-pong needs a partner
    params = {"dtype": args.dtype, "itemsize": itemsize, "modeled": int(modeled), "counts": args.counts,
              "all_algos": int(len(args.algos) == len(ALGOS)), **{f"has_{a}": int(a in args.algos) for a in ALGOS}}
    # alpha and beta first: dbt's chunk count k comes from them (identical on every rank: slowest mean)
    model = measure_model(ctx, be, args.dtype, max(pick["iters"], PING_ITERS)) if modeled else \
        dict(alpha=0.0, beta=0.0, gamma=0.0, alpha_all=0.0, beta_ring=0.0)

    report.section(ctx, f"1. {', '.join(args.algos)} on {n} ranks, {args.dtype}, {ctx.api} ({ctx.transport}), "
                        "vs the library")
    drawn = min(args.counts, key=lambda c: (c < n, c))  # --trace-png: the smallest count N chunks fit in
    results, counts, traces = check_counts(ctx, args, be, model, drawn)
    if rank == 0:
        lg = math.ceil(math.log2(n)) if n > 1 else 0
        c = args.counts[-1]
        print(f"floats: each algorithm adds in its own order; allow (N-1)*eps = {(n - 1) * EPS[args.dtype]:.2g}"
              " relative.")
        root = results["tree"][-1]["bytes_sent"] + results["tree"][-1]["bytes_recv"] if "tree" in results else "-"
        print(wrapped(f"bytes through the root (tree, count {c}): binomial 2*ceil(lg N)*count*itemsize = "
                      f"{2 * lg * c * itemsize} B, measured on rank 0: {root} B; a parameter server (a star) "
                      f"would move 2(N-1)*count*itemsize = {2 * (n - 1) * c * itemsize} B"))
        if "dbt" in results and n > 1:
            print(wrapped(f"dbt: depth D = {dbt_depth(n)}, k per count = "
                          f"{[(i['count'], i['k']) for i in results['dbt']]} (k = sqrt((2D-1)*2n*beta/alpha), "
                          f"1..{KMAX}, alpha and beta with every rank talking)"), flush=True)
    draw_rounds(ctx, args, traces, drawn)
    walk, call = round_overhead(ctx, be, args.dtype)
    times = sweep_times(ctx, args, be, pick, sizes, model)
    a, b, g = model["alpha"], model["beta"], model["gamma"]
    mrows = []
    for size in sizes if modeled else []:
        nb = max(size // itemsize, 1) * itemsize
        k = dbt_chunks(n, nb, model["alpha_all"], model["beta_ring"])
        row = {"size": nb, "alpha_us": a * 1e6, "beta_us": b * 1e6, "gamma_us": g * 1e6, "k": k}
        for algo in args.algos:
            row[f"{algo}_pred_us"] = predict(algo, n, nb, a, b, g, k) * 1e6
            row[f"{algo}_pred_all_us"] = predict(algo, n, nb, model["alpha_all"], model["beta_ring"], g, k) * 1e6
            row[f"{algo}_us"] = times[size][algo] * 1e6
            row[f"{algo}_rounds"] = len(schedule(algo, 0, n, max(size // itemsize, 1), k))
        mrows.append(row)
    table = switch_table({s: times[s] for s in sizes})
    race = tuned_race(ctx, args, be, pick, table, model,
                      lambda algo, count, k, buf: plan(ctx, algo, count, k, buf, args.dtype), SEED)
    for r, (size, _) in zip(race, table):  # the sweep's times beside each race row, for the argmin check
        r.update({f"{algo}_us": times[size][algo] * 1e6 for algo in args.algos})
        r["chosen_us"] = times[size][r["chosen"]] * 1e6
    if rank == 0:
        if modeled:
            show_model(ctx, args, model, mrows, walk)
            if args.plot:
                pairs = {a: ([r[f"{a}_us"] * 1e-6 for r in mrows], [r[f"{a}_pred_us"] * 1e-6 for r in mrows])
                         for a in args.algos}  # measured, predicted
                print(plot.times_png(args.plot, [r["size"] for r in mrows], pairs,
                                     f"all-reduce on {n} ranks, api {ctx.api} ({ctx.transport}): measured vs "
                                     "alpha-beta model"))
        else:
            report.section(ctx, "2. one rank: no ping-pong partner, so no alpha or beta")
            if ctx.rank == 0:
                print("the model has nothing to predict: the algorithms below only walk their empty schedules",
                      flush=True)
        show_race(ctx, args, table, race, walk + call)
    summary = {"round_walk_us": walk * 1e6, "round_call_us": call * 1e6, "tuned": race, "switch": switch_points(table),
               "tuned_wrong": sum(r["wrong"] for r in race)}
    if modeled:
        summary.update(alpha_us=a * 1e6, beta_ps_per_B=b * 1e12, gamma_ps_per_B=g * 1e12,
                       alpha_all_us=model["alpha_all"] * 1e6, beta_ring_ps_per_B=model["beta_ring"] * 1e12,
                       model=mrows)
    report.finish(ctx, {**results, "comm": counts}, summary=summary, params=params)


if __name__ == "__main__":
    main()
