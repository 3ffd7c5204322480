"""Lesson 07's printing (rank 0): section 1's table and closed forms, section 2's model beside the
measurements and what this run measured that the model leaves out. The tuner's race (section 3)
prints in tuner.show_race.

    counts(every)                                   one row per algorithm and count, ranges over ranks
    closed_forms(ctx, args, results, eps)          the tree's root bytes against a star's; dbt's k
    measured_vs_model(ctx, args, model, mrows, walk)  section 2: the ping-pong, the fit, pred vs measured
    reasons(ctx, model, walk, mrows, algos)        each thing the model leaves out, where numbers show it
"""
import math

import numpy as np

from common import bandwidth, plot, report, text
from common.timing import BATCHES, usable_cores
from lessons.allreduce_algorithms.model import KMAX, SMALL, ping_step
from lessons.allreduce_algorithms.schedules import dbt_depth

OFF = 2.0                    # a row off by more than this (or 1/this) from both predictions is starred


def wrap(line, indent=""):
    return text.wrapped(line, indent=indent, hang=4)


def counts(every):
    """Section 1's table from every rank's rows (algo, count, rounds, msgs, bytes sent, all ranks sent,
    #differ, max rel err): one row per algorithm and count, the range over ranks."""
    def spread(values):
        lo, hi = min(values), max(values)
        return lo if lo == hi else f"{lo}-{hi}"
    print(text.table(["algo", "count", "rounds", "msgs", "bytes sent", "all ranks sent", "#differ",
                      "max rel err"],
                     [(algo, count, spread([r[i][2] for r in every]), spread([r[i][3] for r in every]),
                       spread([r[i][4] for r in every]), total, sum(r[i][6] for r in every),
                       max(r[i][7] for r in every))
                      for i, (algo, count, _, _, _, total, _, _) in enumerate(every[0])],
                     align=[False] + [True] * 7))
    print("rounds, msgs, bytes sent: per rank, lowest-highest over the ranks; #differ: over all ranks",
          flush=True)


def closed_forms(ctx, args, results, eps):
    """Under section 1's table: the float tolerance, the bytes through the tree's root, dbt's k."""
    if ctx.rank != 0:
        return
    n, itemsize, c = ctx.world_size, np.dtype(args.dtype).itemsize, args.counts[-1]
    lg = math.ceil(math.log2(n)) if n > 1 else 0
    print(f"floats: each algorithm adds in its own order; allow (N-1)*eps = {(n - 1) * eps:.2g} relative.")
    root = results["tree"][-1]["bytes_sent"] + results["tree"][-1]["bytes_recv"] if "tree" in results else "-"
    print(wrap(f"bytes through the root (tree, count {c}): binomial 2*ceil(lg N)*count*itemsize = "
               f"{2 * lg * c * itemsize} B, measured on rank 0: {root} B; a parameter server (a star) "
               f"would move 2(N-1)*count*itemsize = {2 * (n - 1) * c * itemsize} B"))
    if "dbt" in results and n > 1:
        print(wrap(f"dbt: depth D = {dbt_depth(n)}, k per count = "
                   f"{[(i['count'], i['k']) for i in results['dbt']]} (k = sqrt((2D-1)*2n*beta/alpha), "
                   f"1..{KMAX}, alpha and beta with every rank talking)"), flush=True)


def reasons(ctx, model, walk, mrows, algos):
    """What this run measured that the model leaves out, each said only where the numbers show it."""
    n, cores = ctx.world_size, usable_cores()
    out = []
    if n > cores:
        out.append(f"(a) {n} ranks on {cores} cores: ranks take turns on the cores, so every round also waits "
                   "for the scheduler (the model assumes a core per rank)")
    ratio = model["beta_ring"] / model["beta"] if model["beta"] > 0 else float("nan")
    head = (f"(b) beta with every rank exchanging at once (ring neighbours, 4 MiB): "
            f"{model['beta_ring'] * 1e12:.1f} ps/B vs the lone ping-pong's {model['beta'] * 1e12:.1f} ps/B "
            f"(x{ratio:.2f}): ")
    if not ratio > 0:  # a beta of 0: the 4 MiB exchange took no longer than one item, within the noise
        out.append(head + "one beta measured 0 (its bytes took no time beyond the noise), so the two are "
                   "not compared")
    elif ratio > 1.5:
        why = ("the ranks' time-sharing of the cores, (a), can explain that alone" if n > cores else
               "with a core per rank, what they share is the node's memory system" if ctx.single_node and
               ctx.transport in ("mpi", "gloo") else "something the links share slows them")
        out.append(head + f"the links are not independent, as the model assumes. {why[0].upper()}{why[1:]}")
    elif ratio < 1 / 1.5:
        out.append(head + f"every rank talking moved bytes {1 / ratio:.1f}x faster than the lone ping-pong: the "
                   "two betas disagree, and a prediction is no better than the beta it uses")
    else:
        out.append(head + "within 1.5x, so sharing the links is not what the model misses here")
    step = ping_step(model["pingpong"], model["alpha"], model["beta"])
    if step:
        s0, s1, t0, t1, pred = step
        why = {"mpi": "on MPI a step like this is often the switch from eager to rendezvous (lesson 01 "
                      "measures where this MPI switches)",
               "nccl": "NCCL changes protocol (LL, LL128, Simple) with size; NCCL_PROTO=Simple pins one",
               "gloo": "this run cannot say why"}[ctx.transport]
        out.append(f"(c) a step in the ping-pong: {t0 * 1e6:.2f} us at {s0} B, {t1 * 1e6:.2f} us at {s1} B, where "
                   f"the slope predicts +{pred * 1e6:.2f} us: one straight line does not fit both sides; {why}")
    rates = [(b, b / t / 1e9) for b, t in model["pingpong"] if b >= 65536 and t > 0]
    if rates and max(r for _, r in rates) > 1.5 * min(r for _, r in rates):
        fitted = 1e-9 / model["beta"] if model["beta"] > 0 else 0.0
        out.append("(d) beta depends on size: ping-pong GB/s " + ", ".join(f"{bandwidth.human(b)} {r:.2f}"
                                                                            for b, r in rates)
                   + f" (the fit: {fitted:.2f}): one slope cannot describe them all; where the measured rate is "
                   "below the fit's, the model predicts too little")
    walked = [(r[f"{a}_rounds"] * walk * 1e6 / r[f"{a}_us"], a, r["size"])
              for r in mrows for a in algos if r[f"{a}_us"] > 0]  # every round is walked, empty or not
    share = max(walked, default=(0.0, "", 0))
    if share[0] >= 0.25:
        out.append(f"(e) Python walks each round: {walk * 1e6:.1f} us per round, measured with nothing to send "
                   f"(the ring on count 0), is outside alpha ({model['alpha'] * 1e6:.1f} us: one exchange, "
                   f"Python call included); it is up to {share[0]:.0%} of a measured time ({share[1]} at "
                   f"{share[2]} B): many-round algorithms pay it most")
    return out


def alpha_note(ctx):
    """What a ping-pong round trip holds besides the transport's latency, where that is a lot (NCCL)."""
    if ctx.transport == "nccl":
        return ("on NCCL each round trip timed here is two group launches from the host (the ping's send, "
                "the pong's receive) and a device sync before rank 0 reads its clock: alpha, half a round "
                "trip, holds one launch and half a sync besides NCCL's own latency")
    return None


def measured_vs_model(ctx, args, model, mrows, walk):
    """Section 2 (rank 0): the model measured here, each algorithm's prediction beside its time, the
    reasons they differ; --plot draws them. One rank has no ping-pong partner, so no model."""
    if ctx.world_size == 1:
        report.section(ctx, "2. one rank: no ping-pong partner, so no alpha or beta")
        print("the model has nothing to predict: the algorithms below only walk their empty schedules",
              flush=True)
        return
    a, b, g = model["alpha"], model["beta"], model["gamma"]
    report.section(ctx, "2. the alpha-beta model, measured on this machine")
    print(wrap("ping-pong rank 0 <-> 1 (half round trip: median of the round trips rank 0 timed; the "
               "other ranks sleep meanwhile):"))
    print(text.table(["bytes", "half RTT us"], [(s, round(t * 1e6, 2)) for s, t in model["pingpong"]]))
    print(wrap(f"alpha = least half RTT of the sizes <= {SMALL} B = {a * 1e6:.2f} us; beta = least-squares "
               f"slope over >= 64 KiB = {b * 1e12:.1f} ps/B ({1e-9 / b if b > 0 else 0:.2f} GB/s); gamma = "
               f"dst += src on 1 MiB, every rank at once = {g * 1e12:.1f} ps/B"))
    if alpha_note(ctx):
        print(wrap(alpha_note(ctx)))
    print(wrap(f"measured: best of {BATCHES} interleaved batches of time_op (slowest rank's mean); pred: the "
               "formulas in model.py's predict with these alpha, beta, gamma (dbt: read off its schedule, k per row); "
               f"all talking: the same with alpha and beta measured while every rank talks at once (a "
               f"1-element and a 4 MiB neighbour exchange: {model['alpha_all'] * 1e6:.2f} us, "
               f"{model['beta_ring'] * 1e12:.1f} ps/B)"))
    found = reasons(ctx, model, walk, mrows, args.algos)  # said first: the table is read with them
    print("What this run measured that the model leaves out (the measured times below include it):")
    for line in found:
        print(wrap(line, "  "))
    body, beyond = [], 0
    for row in mrows:
        for i, algo in enumerate(args.algos):
            m, p, q = row[f"{algo}_us"], row[f"{algo}_pred_us"], row[f"{algo}_pred_all_us"]
            ratio, ratio_all = (m / p if p > 0 else 0.0), (m / q if q > 0 else 0.0)
            far = all(r > OFF or r < 1 / OFF for r in (ratio, ratio_all))  # from both predictions
            beyond += far
            body.append([row["size"] if i == 0 else "", algo, row["k"] if algo == "dbt" else "", round(m, 1),
                         round(p, 1), round(ratio, 2), f"{ratio_all:.2f}{' *' if far else ''}"])
    print(text.table(["size B", "algo", "dbt k", "measured us", "pred us", "meas/pred", "meas/pred all talking"],
                     body, align=[True, False, True, True, True, True, True]))
    print(f"* {beyond} of {len(body)} rows are off by more than {OFF:g}x from both predictions, even the one "
          "with every rank talking" if beyond else
          f"every row is within {OFF:g}x of one of its two predictions (lone, or with every rank talking)")
    if args.plot:
        pairs = {a: ([r[f"{a}_us"] * 1e-6 for r in mrows], [r[f"{a}_pred_us"] * 1e-6 for r in mrows])
                 for a in args.algos}  # measured, predicted
        print(plot.times_png(args.plot, [r["size"] for r in mrows], pairs,
                             f"all-reduce on {ctx.world_size} ranks, api {ctx.api} ({ctx.transport}): measured "
                             "vs alpha-beta model"))
