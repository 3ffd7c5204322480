"""Lesson 07's alpha-beta(-gamma) model: the prediction for each algorithm, and the measurement of
alpha, beta and gamma on this machine that the prediction uses.

    predict(algo, n, nbytes, alpha, beta, gamma, k)   the formulas in lesson 07's docstring
    schedule_cost(every rank's schedule, a, b, g)      the same read off any schedule, round by round
    measure_model(ctx, be, dtype, iters)               ping-pong, a += b, every rank exchanging at once
    reasons(...), show_model(...)                      what the run measured that the model leaves out
"""
import math
import os
import textwrap
import time

import numpy as np

from common import bandwidth, buffers, report, timing
from common.timing import BATCHES, best_of
from lessons.allreduce_algorithms.schedules import Plan, dbt_depth, dbt_schedule, fold, ring_schedule

KMAX = 64                    # most pipeline chunks per dbt tree
ITER_BYTES = 1 << 30         # big sizes: at most this many bytes per algorithm timing
PING = [8, 64, 256, 1024, 2048, 4096, 8192, 16384, 65536, 262144, 1 << 20, 4 << 20]  # ping-pong sizes, B
SMALL = 1024                 # ping-pong sizes up to this are pure latency: alpha is the least of them
STEP = 3.0                   # a ping-pong jump this many times what the slope predicts is a step
WIDTH = 100                  # printed lines wrap here
OFF = 2.0                    # a measured/predicted ratio beyond this (or 1/this) gets its reasons


def dbt_chunks(n, nbytes, alpha, beta):
    """k from the model's optimum of (k + 2D - 1)(alpha + 4*(n/2k)*beta)."""
    if n < 2 or alpha <= 0 or nbytes == 0:
        return 1
    D = dbt_depth(n)
    return max(1, min(KMAX, round(math.sqrt((2 * D - 1) * 2 * nbytes * beta / alpha))))


def predict(algo, n, nbytes, alpha, beta, gamma, k=1):
    """Predicted seconds (TRG formulas above; dbt read off its schedule)."""
    if n == 1:
        return 0.0
    lg, (p2, r) = math.ceil(math.log2(n)), fold(n)
    fl = int(math.log2(p2))
    extra = (2 * alpha + 2 * nbytes * beta + nbytes * gamma) if r else 0.0  # pre + post steps
    if algo == "tree":
        return 2 * lg * (alpha + nbytes * beta) + lg * nbytes * gamma
    if algo == "rd":
        return fl * (alpha + nbytes * beta + nbytes * gamma) + extra
    if algo == "rabenseifner":
        return 2 * fl * alpha + 2 * (p2 - 1) / p2 * nbytes * beta + (p2 - 1) / p2 * nbytes * gamma + extra
    if algo == "ring":
        return 2 * (n - 1) * alpha + 2 * (n - 1) / n * nbytes * beta + (n - 1) / n * nbytes * gamma
    return schedule_cost([dbt_schedule(q, n, nbytes, k) for q in range(n)], alpha, beta, gamma)


def schedule_cost(per_rank, alpha, beta, gamma, itemsize=1):
    """The cost read off any schedule: per round alpha (if anyone talks) + the busiest rank's bytes
    sent * beta + the busiest rank's bytes added * gamma (a rank sends one message at a time)."""
    total = 0.0
    for rnd in zip(*per_rank):
        sent = [sum(hi - lo for lo, hi, _ in s) for s, _ in rnd]
        added = [sum(hi - lo for lo, hi, _, op in rv if op == "add") for _, rv in rnd]
        if any(s for s, _ in rnd):
            total += alpha + max(sent) * itemsize * beta + max(added) * itemsize * gamma
    return total


def fit(points):
    """Least squares t = a + b*x over [(x, t)]: (a, b)."""
    xs, ts = np.array([p[0] for p in points], float), np.array([p[1] for p in points], float)
    b, a = np.polyfit(xs, ts, 1)
    return float(a), float(b)


def quiet_barrier(comm):
    """A barrier that sleeps while it waits: an idle rank must not spin on a core the others need."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(0.0002)


def pingpong(ctx, be, dtype, iters):
    """[(bytes, half round trip s)] between ranks 0 and 1: per size the median of `iters` round trips,
    the sweep done twice and the lower median kept (load from elsewhere only ever adds time). The other
    ranks sleep meanwhile, so the two have the cores to themselves."""
    itemsize = np.dtype(dtype).itemsize
    best = {}
    ctx.comm.Barrier()
    for _ in range(2):
        for size in PING:
            msg = buffers.on_device(ctx, np.zeros(max(size // itemsize, 1), dtype=dtype))
            reps = iters if size <= 65536 else max(5, iters // 4)
            trips = []
            for i in range(reps + 2):  # two warm-up trips
                t0 = timing.now(be.sync)
                if ctx.rank == 0:
                    be.exchange(msg, None, 1, 1)  # ping
                    be.exchange(None, msg, 1, 1)  # pong
                elif ctx.rank == 1:
                    be.exchange(None, msg, 0, 0)
                    be.exchange(msg, None, 0, 0)
                trips.append(timing.now(be.sync) - t0)
            half = float(np.median(trips[2:])) / 2
            best[size] = min(best.get(size, half), half)
    quiet_barrier(ctx.comm)
    out = [(max(size // itemsize, 1) * itemsize, best[size]) for size in PING]
    return ctx.comm.bcast(out, root=0)  # rank 0's clock: it saw each whole round trip


def measure_model(ctx, be, dtype, iters):
    n, rank = ctx.world_size, ctx.rank
    pts = pingpong(ctx, be, dtype, iters)
    alpha = min(t for b, t in pts if b <= SMALL)  # every size up to SMALL is latency-bound: each is alpha
    beta = fit([p for p in pts if p[0] >= 65536])[1]  # the large-message slope
    big = 1 << 20
    itemsize = np.dtype(dtype).itemsize
    a = buffers.on_device(ctx, np.ones(big // itemsize, dtype=dtype))
    b = buffers.on_device(ctx, np.ones(big // itemsize, dtype=dtype))

    def add():
        a.__iadd__(b)  # a += b, in place on numpy, cupy and torch
    gamma = best_of(ctx, be, {"add": add}, 2, iters)["add"] / big
    # the same two numbers with every rank talking at once, as in a round of any all-reduce
    one, got = buffers.on_device(ctx, np.zeros(1, dtype=dtype)), buffers.empty(ctx, 1, dtype)
    x = buffers.on_device(ctx, np.zeros((4 << 20) // itemsize, dtype=dtype))
    y = buffers.empty(ctx, (4 << 20) // itemsize, dtype)
    right, left = (rank + 1) % n, (rank - 1) % n
    t = best_of(ctx, be, {"one": lambda: be.exchange(one, got, right, left),  # timed like the algorithms
                          "big": lambda: be.exchange(x, y, right, left)}, 2, iters)
    alpha_all, t = t["one"], t["big"]
    beta_ring = max(t - alpha_all, 0.0) / (4 << 20)
    return dict(alpha=alpha, beta=beta, gamma=gamma, alpha_all=alpha_all, beta_ring=beta_ring, pingpong=pts)


def ping_step(pts, alpha, beta):
    """The biggest step in the ping-pong: (from B, to B, from s, to s, the slope's +s) where the half RTT
    jumps at least STEP times what the slope predicts and by at least alpha/2, and stays up (a step, not
    a spike); None when there is none."""
    best = None
    for i in range(len(pts) - 1):
        (s0, t0), (s1, t1) = pts[i], pts[i + 1]
        pred = (s1 - s0) * max(beta, 0.0)
        jump = t1 - t0
        stays = all(t >= 0.9 * t1 for _, t in pts[i + 1:])
        if jump >= STEP * pred and jump >= alpha / 2 and stays:
            if best is None or jump / max(pred, 1e-15) > best[0]:
                best = (jump / max(pred, 1e-15), (s0, s1, t0, t1, pred))
    return best[1] if best else None


def round_overhead(ctx, be, dtype):
    """(walk, call) seconds of Python per round. walk: the executor going through a round with nothing to
    send (the ring on count 0: every message is empty and skipped). call: one library call that moves
    nothing (MPI: Sendrecv to MPI_PROC_NULL; not measured, 0, on the other transports)."""
    n = ctx.world_size
    plan = Plan(ctx, ring_schedule(ctx.rank, n, 0), buffers.empty(ctx, 0, dtype), dtype)
    walk = bandwidth.time_op(ctx.comm, lambda: plan.run(be), 5, 200, be.sync) / max(2 * (n - 1), 1)
    call = 0.0
    if ctx.transport == "mpi":
        from mpi4py import MPI
        one, got = np.zeros(1, dtype=dtype), np.zeros(1, dtype=dtype)
        call = bandwidth.time_op(ctx.comm, lambda: ctx.comm.Sendrecv(one, dest=MPI.PROC_NULL, recvbuf=got,
                                                                     source=MPI.PROC_NULL), 5, 200, timing.HOST)
    return walk, call


def iterations(pick, size):
    """Timed calls per batch: the plan's, fewer for big sizes (at least one)."""
    return max(1, min(pick["iters"], ITER_BYTES // size) // BATCHES)


def wrapped(text, indent=""):
    return textwrap.fill(text, WIDTH, initial_indent=indent, subsequent_indent=indent + "    ", break_on_hyphens=False)


def reasons(ctx, model, walk, mrows, algos):
    """What this run measured that the model leaves out, each said only where the numbers show it."""
    n, cores = ctx.world_size, len(os.sched_getaffinity(0))
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


def show_model(ctx, args, model, mrows, walk):
    a, b, g = model["alpha"], model["beta"], model["gamma"]
    report.section(ctx, "2. the alpha-beta model, measured on this machine")
    print(wrapped("ping-pong rank 0 <-> 1 (half round trip: median of the round trips rank 0 timed; the "
                  "other ranks sleep meanwhile):"))
    print(report.table(["bytes", "half RTT us"], [(s, round(t * 1e6, 2)) for s, t in model["pingpong"]]))
    print(wrapped(f"alpha = least half RTT of the sizes <= {SMALL} B = {a * 1e6:.2f} us; beta = least-squares "
                  f"slope over >= 64 KiB = {b * 1e12:.1f} ps/B ({1e-9 / b if b > 0 else 0:.2f} GB/s); gamma = "
                  f"dst += src on 1 MiB, every rank at once = {g * 1e12:.1f} ps/B"))
    if alpha_note(ctx):
        print(wrapped(alpha_note(ctx)))
    print(wrapped(f"measured: best of {BATCHES} interleaved batches of time_op (slowest rank's mean); pred: the "
                  "docstring's formulas with these alpha, beta, gamma (dbt: read off its schedule, k per row); "
                  f"all talking: the same with alpha and beta measured while every rank talks at once (a "
                  f"1-element and a 4 MiB neighbour exchange: {model['alpha_all'] * 1e6:.2f} us, "
                  f"{model['beta_ring'] * 1e12:.1f} ps/B)"))
    body, off = [], False
    for row in mrows:
        for i, algo in enumerate(args.algos):
            m, p, q = row[f"{algo}_us"], row[f"{algo}_pred_us"], row[f"{algo}_pred_all_us"]
            ratio = m / p if p > 0 else 0.0
            off |= ratio > OFF or ratio < 1 / OFF
            body.append([row["size"] if i == 0 else "", algo, row["k"] if algo == "dbt" else "", round(m, 1),
                         round(p, 1), f"{ratio:.2f}{' *' if ratio > OFF or ratio < 1 / OFF else ''}",
                         round(m / q, 2) if q > 0 else 0.0])
    print(report.table(["size B", "algo", "dbt k", "measured us", "pred us", "meas/pred", "meas/pred all talking"],
                       body, align=[True, False, True, True, True, True, True]))
    found = reasons(ctx, model, walk, mrows, args.algos)
    print(f"* off by more than {OFF:g}x. What this run measured that the model leaves out:" if off else
          f"the model is within {OFF:g}x everywhere in this run. What it measured that the model leaves out:")
    for line in found:
        print(wrapped(line, "  "))
