"""Lesson 07's alpha-beta(-gamma) model: the prediction for each algorithm, and the measurement of
alpha, beta and gamma on this machine that the prediction uses.

    predict(algo, n, nbytes, alpha, beta, gamma, k)   each algorithm's formula (its docstring holds them)
    schedule_cost(every rank's schedule, a, b, g)      the same read off any schedule, round by round
    measure_model(ctx, be, dtype, iters)               ping-pong, a += b, every rank exchanging at once
    ping_step(...), round_overhead(...)                what the model leaves out (show.py says it)
"""
import math
import time

import numpy as np

from common import bandwidth, buffers, timing
from common.timing import BATCHES, best_of
from lessons.allreduce_algorithms.schedules import Plan, dbt_depth, dbt_schedule, fold, ring_schedule

KMAX = 64                    # most pipeline chunks per dbt tree
ITER_BYTES = 1 << 30         # big sizes: at most this many bytes per algorithm timing
PING = [8, 64, 256, 1024, 2048, 4096, 8192, 16384, 65536, 262144, 1 << 20, 4 << 20]  # ping-pong sizes, B
SMALL = 1024                 # ping-pong sizes up to this are pure latency: alpha is the least of them
STEP = 3.0                   # a ping-pong jump this many times what the slope predicts is a step


def dbt_chunks(n, nbytes, alpha, beta):
    """dbt's k: the k that minimises (k + 2D - 1)*(alpha + 4*(n/2k)*beta), k = sqrt((2D-1)*2n*beta/alpha),
    rounded, clamped to 1..KMAX; the lesson passes alpha and beta measured while every rank talks at once
    (what a dbt round costs; on an oversubscribed machine far more than the ping-pong's)."""
    if n < 2 or alpha <= 0 or nbytes == 0:
        return 1
    D = dbt_depth(n)
    return max(1, min(KMAX, round(math.sqrt((2 * D - 1) * 2 * nbytes * beta / alpha))))


def predict(algo, n, nbytes, alpha, beta, gamma, k=1):
    """Predicted seconds for N = n ranks and nbytes, by the alpha-beta(-gamma) model (Thakur,
    Rabenseifner, Gropp 2005): a message of n bytes costs alpha + n*beta, adding n bytes costs n*gamma.
      tree          2*ceil(lg N)*(alpha + n*beta) + ceil(lg N)*n*gamma
      rd            lg N*(alpha + n*beta + n*gamma)
      rabenseifner  2 lg N*alpha + 2(N-1)/N*n*beta + (N-1)/N*n*gamma
      ring          2(N-1)*alpha + 2(N-1)/N*n*beta + (N-1)/N*n*gamma
      non-power-of-two (rd, rabenseifner: lg -> floor(lg N) on N'): + 2*alpha + 2*n*beta + n*gamma (pre, post)
      dbt           read off its schedule (schedule_cost): (k + 2D - 1) rounds, per round
                    alpha + s*(n/2k)*beta + a*(n/2k)*gamma with s <= 4 chunks sent and a <= 2 added by the
                    busiest rank, so at most (k + 2D - 1)*(alpha + 2n/k*beta + n/k*gamma)."""
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
