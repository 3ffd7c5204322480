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
"""
import argparse
import math
import os
import sys
import textwrap
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import numpy as np  # noqa: E402

from common import bandwidth, bootstrap, buffers, p2p, report, shards, timing  # noqa: E402

ALGOS = ("tree", "rd", "rabenseifner", "ring", "dbt")
DTYPES = ("float32", "float64", "int32")
EPS = {"float32": 1.2e-7, "float64": 2.3e-16, "int32": 0.0}  # machine epsilon (ints: exact)
SEED = 7                     # rank r's data comes from seed SEED + r
KMAX = 64                    # most pipeline chunks per dbt tree
SWEEP = dict(begin="4K", end="1M", mult=16, iters=6, warmup=1)     # default: a short sweep
BENCH = dict(begin="4K", end="128M", mult=2, iters=30, warmup=3)   # --bench: the sweep
ITER_BYTES = 1 << 30         # big sizes: at most this many bytes per algorithm timing
BATCHES = 3                  # timings: best of this many interleaved batches
PING = [8, 64, 256, 1024, 2048, 4096, 8192, 16384, 65536, 262144, 1 << 20, 4 << 20]  # ping-pong sizes, B
SMALL = 1024                 # ping-pong sizes up to this are pure latency: alpha is the least of them
PING_ITERS = 10              # round trips per ping-pong size at least (more with -n)
STEP = 3.0                   # a ping-pong jump this many times what the slope predicts is a step
WIDTH = 100                  # printed lines wrap here
OFF = 2.0                    # a measured/predicted ratio beyond this (or 1/this) gets its reasons
LIBRARY = {"mpi": "MPI_Allreduce", "gloo": "gloo all_reduce", "nccl": "ncclAllReduce"}


def name_list(text, allowed, what):
    items = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in allowed]
    if bad or not items:
        raise argparse.ArgumentTypeError(f"pick {what} from {','.join(allowed)}, got {text!r}")
    return items


# ---- schedules: pure functions of (rank, n, count); a round is (sends, recvs) ----------------------
# sends: [(lo, hi, peer)]; recvs: [(lo, hi, peer, "add" | "copy")]. Every rank gets the same number
# of rounds (some empty), so the ranks stay in step.

def fold(n):
    """(N', r): the largest power of two <= n, and how many ranks the pre step folds away."""
    p2 = 1 << (n.bit_length() - 1)
    return p2, n - p2


def to_virtual(rank, r):
    """Rank in the power-of-two core, or None for an even rank < 2r that sits out."""
    if rank < 2 * r:
        return None if rank % 2 == 0 else rank // 2
    return rank - r


def to_real(v, r):
    return 2 * v + 1 if v < r else v + r


def pre_post(rank, n, count, core):
    """Wrap the core rounds with the non-power-of-two pre and post steps (none when n is a power of 2)."""
    p2, r = fold(n)
    if r == 0:
        return core
    pre, post = ([], []), ([], [])
    if rank < 2 * r and rank % 2 == 0:  # sits out: hands its data over, gets the result back
        pre[0].append((0, count, rank + 1))
        post[1].append((0, count, rank + 1, "copy"))
    elif rank < 2 * r:
        pre[1].append((0, count, rank - 1, "add"))
        post[0].append((0, count, rank - 1))
    return [pre] + core + [post]


def rd_schedule(rank, n, count):
    p2, r = fold(n)
    v = to_virtual(rank, r)
    core = []
    mask = 1
    while mask < p2:
        rnd = ([], [])
        if v is not None:
            peer = to_real(v ^ mask, r)
            rnd = ([(0, count, peer)], [(0, count, peer, "add")])
        core.append(rnd)
        mask <<= 1
    return pre_post(rank, n, count, core)


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


def ring_schedule(rank, n, count):
    bounds = shards.chunk_bounds(count, n)
    right, left = (rank + 1) % n, (rank - 1) % n
    rounds = []
    for s in range(n - 1):  # reduce-scatter
        rounds.append(([(*bounds[(rank - s) % n], right)], [(*bounds[(rank - s - 1) % n], left, "add")]))
    for s in range(n - 1):  # all-gather: rank r finished chunk r+1
        rounds.append(([(*bounds[(rank + 1 - s) % n], right)], [(*bounds[(rank - s) % n], left, "copy")]))
    return rounds


def tree_schedule(rank, n, count):
    masks = [1 << i for i in range(max(n - 1, 0).bit_length())]  # 1, 2, 4, ... < n: ceil(lg n) rounds
    low = rank & -rank if rank else 1 << 30  # rank's lowest set bit: its parent is rank - low
    rounds = []
    for m in masks:  # reduce towards rank 0
        if low == m:
            rounds.append(([(0, count, rank - m)], []))
        elif low > m and rank + m < n:
            rounds.append(([], [(0, count, rank + m, "add")]))
        else:
            rounds.append(([], []))
    for m in reversed(masks):  # broadcast from rank 0, the same edges backwards
        if low == m:
            rounds.append(([], [(0, count, rank - m, "copy")]))
        elif low > m and rank + m < n:
            rounds.append(([(0, count, rank + m)], []))
        else:
            rounds.append(([], []))
    return rounds


def btree(n, rank):
    """(parent, [children]) in NCCL's binary tree over 0..n-1: odd ranks are leaves, root 0."""
    if rank == 0:
        bit = 1
        while bit < n:
            bit <<= 1
        return -1, ([bit >> 1] if n > 1 else [])
    low = rank & -rank
    up = rank ^ low | low << 1
    if up >= n:
        up = rank ^ low
    kids, half = [], low >> 1
    if half:
        kids.append(rank - half)
        while half and rank + half >= n:  # the right child may be out of range: take a smaller step
            half >>= 1
        if half:
            kids.append(rank + half)
    return up, kids


def dbt_trees(n):
    """Two trees as {rank: (parent, children)}: the second is the first mirrored (n even) or shifted by
    one (n odd), so a rank inner in one tree is mostly a leaf in the other."""
    first = {r: btree(n, r) for r in range(n)}
    if n % 2 == 0:
        f = lambda x: n - 1 - x  # noqa: E731  mirror, its own inverse
        g = f
    else:
        f = lambda x: (x + 1) % n  # noqa: E731  shift
        g = lambda x: (x - 1) % n  # noqa: E731
    second = {}
    for r in range(n):
        up, kids = first[g(r)]
        second[r] = (-1 if up < 0 else f(up), [f(k) for k in kids])
    return [first, second]


def depths(tree):
    out = {}
    for r in tree:
        d, x = 0, r
        while tree[x][0] >= 0:
            x, d = tree[x][0], d + 1
        out[r] = d
    return out


def dbt_depth(n):
    return max(max(depths(t).values()) for t in dbt_trees(n))


def dbt_schedule(rank, n, count, k):
    """Each tree all-reduces one half in k chunks: chunk c goes up from depth d at round c + D - d and
    comes down from depth d at round c + D + d; k + 2D - 1 rounds in all."""
    if n == 1:
        return []
    trees, D = dbt_trees(n), dbt_depth(n)
    rounds = [([], []) for _ in range(k + 2 * D - 1)]
    for t, (hlo, hhi) in enumerate(shards.chunk_bounds(count, 2)):
        tree, dep = trees[t], depths(trees[t])
        parent, kids = tree[rank]
        d = dep[rank]
        chunks = [(hlo + a, hlo + b) for a, b in shards.chunk_bounds(hhi - hlo, k)]
        for tick, (sends, recvs) in enumerate(rounds):
            c = tick - (D - d)  # reduce: my chunk c goes up once my children's chunk c has arrived
            if parent >= 0 and 0 <= c < k:
                sends.append((*chunks[c], parent))
            c = tick - (D - d - 1)
            for kid in kids:
                if 0 <= c < k:
                    recvs.append((*chunks[c], kid, "add"))
            c = tick - D - d  # broadcast: the finished chunk c goes down
            for kid in kids:
                if 0 <= c < k:
                    sends.append((*chunks[c], kid))
            c = tick - D - d + 1
            if parent >= 0 and 0 <= c < k:
                recvs.append((*chunks[c], parent, "copy"))
    return rounds


def dbt_chunks(n, nbytes, alpha, beta):
    """k from the model's optimum of (k + 2D - 1)(alpha + 4*(n/2k)*beta)."""
    if n < 2 or alpha <= 0 or nbytes == 0:
        return 1
    D = dbt_depth(n)
    return max(1, min(KMAX, round(math.sqrt((2 * D - 1) * 2 * nbytes * beta / alpha))))


def schedule(algo, rank, n, count, k=1):
    if algo == "dbt":
        return dbt_schedule(rank, n, count, k)
    return {"tree": tree_schedule, "rd": rd_schedule, "rabenseifner": rabenseifner_schedule,
            "ring": ring_schedule}[algo](rank, n, count)


def canonical(rounds):
    """Sends and receives in offset order: two messages to the same peer in one round match in the
    order they are posted (MPI per source, NCCL has no tags), so both sides must post alike."""
    return [(sorted(s, key=lambda m: m[:2]), sorted(r, key=lambda m: m[:2])) for s, r in rounds]


def mismatch(per_rank):
    """None if every non-empty send meets a receive of the same slice on its peer in the same round
    (in posting order), else the first problem in words. Pure, so every rank finds the same answer
    and all can stop together: a schedule that does not match would otherwise hang or truncate."""
    n = len(per_rank)
    if len({len(s) for s in per_rank}) > 1:
        return f"the ranks run different numbers of rounds: {[len(s) for s in per_rank]}"
    for i, rnd in enumerate(zip(*per_rank)):
        pairs = set()
        for q, (sends, recvs) in enumerate(rnd):
            pairs |= {(q, p) for _, _, p in sends} | {(p, q) for _, _, p, _ in recvs}
        for src, dst in sorted(pairs):
            if not (0 <= src < n and 0 <= dst < n):
                return f"round {i}: a message between ranks {src} and {dst}, but there are {n} ranks"
            out = [m[:2] for m in rnd[src][0] if m[2] == dst and m[1] > m[0]]
            got = [m[:2] for m in rnd[dst][1] if m[2] == src and m[1] > m[0]]
            if out != got:
                return f"round {i}: rank {src} sends slices {out} to rank {dst}, which expects {got}"
    return None


# ---- the model -------------------------------------------------------------------------------------

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
    return schedule_cost([schedule("dbt", q, n, nbytes, k) for q in range(n)], alpha, beta, gamma)


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


# ---- one executor for every schedule ---------------------------------------------------------------

def copy_into(dst, src):
    if hasattr(dst, "copy_"):
        dst.copy_(src)  # torch
    else:
        dst[...] = src  # numpy, cupy


class Plan:
    """A schedule bound to one buffer: views made once, so a timed call only talks and adds."""

    def __init__(self, ctx, rounds, buf, dtype):
        self.buf, self.rounds = buf, []
        rounds = canonical(rounds)
        need = max([sum(hi - lo for lo, hi, _, _ in self._via_scratch(s, rv)) for s, rv in rounds] + [0])
        scratch = buffers.empty(ctx, need, dtype)
        for sends, recvs in rounds:
            via = self._via_scratch(sends, recvs)
            out = [(buf[lo:hi], peer) for lo, hi, peer in sends]
            into, after, pos = [], [], 0
            for m in recvs:
                lo, hi, peer, op = m
                if m in via:  # adds always, copies only where they overlap a send of this round
                    tmp = scratch[pos:pos + hi - lo]
                    pos += hi - lo
                    into.append((tmp, peer))
                    after.append((buf[lo:hi], tmp, op == "add"))
                else:
                    into.append((buf[lo:hi], peer))
            self.rounds.append((out, into, after, (sends, recvs)))

    @staticmethod
    def _via_scratch(sends, recvs):
        return [m for m in recvs if m[3] == "add" or any(m[0] < b and a < m[1] for a, b, _ in sends)]

    def run(self, be, tally=None):
        for out, into, after, raw in self.rounds:
            if len(out) <= 1 and len(into) <= 1 and (out or into):  # one each way: the cheaper call
                be.exchange(out[0][0] if out else None, into[0][0] if into else None,
                            out[0][1] if out else 0, into[0][1] if into else 0)
            elif out or into:
                be.group(out, into)  # every message of the round in flight at once, then wait
            for dst, src, add in after:
                if add:
                    dst += src  # the reduction: gamma per byte
                else:
                    copy_into(dst, src)
            if tally is not None and (raw[0] or raw[1]):
                tally["rounds"] += 1
                tally["msgs"] += sum(1 for lo, hi, _ in raw[0] if hi > lo)
                tally["bytes_sent"] += sum(buffers.nbytes(b) for b, _ in out)
                tally["bytes_recv"] += sum(buffers.nbytes(b) for b, _ in into)


def checked_plan(ctx, algo, count, k, buf, dtype):
    """This rank's Plan, once every rank's schedule is known to match. Every rank finds the same problem
    (mismatch is pure), so every rank stops on the same self-check error, before anything hangs."""
    n = ctx.world_size
    every = [canonical(schedule(algo, q, n, count, k)) for q in range(n)]
    problem = mismatch(every)
    if problem:
        raise RuntimeError(f"the {algo} schedule does not match on count {count}: {problem}")
    return Plan(ctx, every[ctx.rank], buf, dtype)


# ---- section 1: every algorithm against the library ------------------------------------------------

def check_counts(ctx, args, be, model):
    n, rank, itemsize = ctx.world_size, ctx.rank, np.dtype(args.dtype).itemsize
    results, rows = {a: [] for a in args.algos}, []
    for count in args.counts:
        x = buffers.seeded(SEED + rank, count, args.dtype)
        lib = buffers.on_device(ctx, x.copy())
        be.allreduce(lib)
        be.sync()
        want = buffers.to_host(lib).astype(np.float64)
        k = dbt_chunks(n, count * itemsize, model["alpha_all"], model["beta_ring"])  # dbt's pipeline depth
        for algo in args.algos:
            buf = buffers.on_device(ctx, x.copy())
            tally = dict(rounds=0, msgs=0, bytes_sent=0, bytes_recv=0)
            checked_plan(ctx, algo, count, k, buf, args.dtype).run(be, tally)
            be.sync()  # gpu work is async: finish before the host reads
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
    return results


# ---- section 2: alpha, beta, gamma, measured -------------------------------------------------------

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


def best_of(ctx, be, fns, warmup, iters, spread=None):
    """{name: seconds}: each fn timed in BATCHES interleaved batches (time_op: the slowest rank's mean),
    the best batch kept, so a burst of load from elsewhere hits every contender alike. If `spread` is a
    dict it gets each name's slowest minus fastest batch: how much this run's own timings wander."""
    batches = {name: [] for name in fns}
    for b in range(BATCHES):
        for name, fn in fns.items():
            batches[name].append(bandwidth.time_op(ctx.comm, fn, warmup if b == 0 else 0, iters, be.sync))
    if spread is not None:
        spread.update({name: max(ts) - min(ts) for name, ts in batches.items()})
    return {name: min(ts) for name, ts in batches.items()}


def sweep_times(ctx, args, be, pick, sizes, model):
    """{size: {algo: seconds}}, identical on every rank."""
    n, rank, itemsize = ctx.world_size, ctx.rank, np.dtype(args.dtype).itemsize
    times = {}
    for size in sizes:
        count = max(size // itemsize, 1)
        x = np.zeros(count, dtype=args.dtype)  # timed in place, over and over: zeros never overflow
        k = dbt_chunks(n, count * itemsize, model["alpha_all"], model["beta_ring"])
        plans = {algo: checked_plan(ctx, algo, count, k, buffers.on_device(ctx, x.copy()), args.dtype)
                 for algo in args.algos}
        times[size] = best_of(ctx, be, {a: (lambda p=p: p.run(be)) for a, p in plans.items()},
                              pick["warmup"], iterations(pick, size))
        del plans
    return times


# ---- section 3: the tuner --------------------------------------------------------------------------

def switch_table(times):
    """[(size, algo)]: at every measured size the fastest algorithm (times: {size: {algo: s}})."""
    table = []
    for size in sorted(times):
        # >>> exercise: pick
        best = min(times[size], key=lambda a: (times[size][a], a))
        # <<< exercise: pick
        table.append((size, best))
    return table


def choose(table, nbytes):
    """The algorithm for nbytes: the choice of the nearest measured size at or below (the smallest
    measured size's choice below the table)."""
    chosen = table[0][1]
    for size, algo in table:
        if size <= nbytes:
            chosen = algo
    return chosen


def switch_points(table):
    """'<= 16K: rd, <= 1M: rabenseifner, else ring' from the per-size table."""
    parts = []
    for i, (size, algo) in enumerate(table):
        if i + 1 < len(table) and table[i + 1][1] == algo:
            continue
        last = i + 1 == len(table)
        parts.append(f"else {algo}" if last and parts else (f"{algo}" if last else
                                                              f"<= {bandwidth.human(size)}: {algo}"))
    return ", ".join(parts)


def tuned_race(ctx, args, be, pick, table, model):
    from mpi4py import MPI
    n, rank, itemsize = ctx.world_size, ctx.rank, np.dtype(args.dtype).itemsize
    rows = []
    for size, _ in table:
        count = max(size // itemsize, 1)
        algo = choose(table, size)
        k = dbt_chunks(n, count * itemsize, model["alpha_all"], model["beta_ring"])
        x = buffers.seeded(SEED + rank, count, args.dtype, small_ints=True)
        mine, lib = buffers.on_device(ctx, x.copy()), buffers.on_device(ctx, x.copy())
        plan = checked_plan(ctx, algo, count, k, mine, args.dtype)
        plan.run(be)  # once, for #wrong
        be.allreduce(lib)
        be.sync()
        wrong = ctx.comm.allreduce(int((buffers.to_host(mine) != buffers.to_host(lib)).sum()))
        zeros = buffers.on_device(ctx, np.zeros(count, dtype=args.dtype))
        copy_into(mine, zeros)  # then timed in place, over and over: zeros never overflow
        copy_into(lib, zeros)
        spread = {}
        t = best_of(ctx, be, {"tuned": lambda: plan.run(be), "lib": lambda: be.allreduce(lib)},
                    pick["warmup"], iterations(pick, size), spread)
        t_tuned, t_lib = t["tuned"], t["lib"]
        talks = sum(1 for out, into, _, _ in plan.rounds if out or into)  # rounds this rank sends or receives in
        active = ctx.comm.allreduce(talks, op=MPI.MAX)
        rows.append(dict(size=count * itemsize, count=count, type=args.dtype, redop="sum", chosen=algo, rounds=active,
                         tuned_us=t_tuned * 1e6, lib_us=t_lib * 1e6, noise_us=max(spread.values()) * 1e6,
                         wrong=wrong,
                         algbw=bandwidth.algbw(count * itemsize, t_tuned),
                         busbw=bandwidth.busbw("allreduce", count * itemsize, t_tuned, n),
                         lib_busbw=bandwidth.busbw("allreduce", count * itemsize, t_lib, n),
                         ratio=t_lib / t_tuned if t_tuned > 0 else 0.0))
    return rows


def gap_verdict(row, overhead):
    """Why the tuned all-reduce lost to the library at one size (a race row), as far as this run can tell:
    by less than its own noise, by about the Python it spends per round, or by something else."""
    gap = row["tuned_us"] - row["lib_us"]
    if gap <= row["noise_us"]:
        return "a tie: within this run's noise"
    if row["rounds"] * overhead * 1e6 >= 0.5 * gap:
        return "mostly Python"
    return "not Python: unexplained here"


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
    if ratio > 1.5:
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
    walked = [(len(schedule(a, 0, n, r["size"], r["k"])) * walk * 1e6 / r[f"{a}_us"], a, r["size"])
              for r in mrows for a in algos if r[f"{a}_us"] > 0]  # every round is walked, empty or not
    share = max(walked, default=(0.0, "", 0))
    if share[0] >= 0.25:
        out.append(f"(e) Python walks each round: {walk * 1e6:.1f} us per round, measured with nothing to send "
                   f"(the ring on count 0), is outside alpha ({model['alpha'] * 1e6:.1f} us: one exchange, "
                   f"Python call included); it is up to {share[0]:.0%} of a measured time ({share[1]} at "
                   f"{share[2]} B): many-round algorithms pay it most")
    return out


def show_model(ctx, args, model, mrows, walk):
    a, b, g = model["alpha"], model["beta"], model["gamma"]
    report.section(ctx, "2. the alpha-beta model, measured on this machine")
    print(wrapped("ping-pong rank 0 <-> 1 (half round trip: median of the round trips rank 0 timed; the "
                  "other ranks sleep meanwhile):"))
    print(report.table(["bytes", "half RTT us"], [(s, round(t * 1e6, 2)) for s, t in model["pingpong"]]))
    print(wrapped(f"alpha = least half RTT of the sizes <= {SMALL} B = {a * 1e6:.2f} us; beta = least-squares "
                  f"slope over >= 64 KiB = {b * 1e12:.1f} ps/B ({1e-9 / b if b > 0 else 0:.2f} GB/s); gamma = "
                  f"dst += src on 1 MiB, every rank at once = {g * 1e12:.1f} ps/B"))
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


def library_words(ctx):
    """How the library racing us picks its algorithm, in the words of the transport that ran."""
    if ctx.transport == "gloo":
        return ["gloo's all_reduce, as torch calls it, runs one ring at every size (no switch by size)"]
    if ctx.transport == "nccl":
        forced = sorted(f"{k}={v}" for k, v in os.environ.items() if k in ("NCCL_ALGO", "NCCL_PROTO"))
        return ["NCCL's tuner prices ring vs tree (and its LL/LL128/Simple protocols) per size with its own "
                "alpha-beta model; it ran with " + (", ".join(forced) if forced else "its own choices (no "
                                                     "NCCL_ALGO or NCCL_PROTO set)")]
    from mpi4py import MPI
    if not MPI.Get_library_version().startswith("MPICH"):
        return ["this MPI picks its all-reduce algorithm per size with its own rules"]
    forced = sorted(f"{k}={v}" for k, v in os.environ.items() if k.startswith("MPIR_CVAR_"))
    return ["MPICH's classic rule: recursive doubling up to MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE (2048 B), "
            "Rabenseifner above, unless MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM or its tuning choose otherwise; it "
            "ran with " + (", ".join(forced) if forced else "its own choices (no MPIR_CVAR_* set; "
                           "MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM=ring, for one, races MPICH's C ring)")]


def show_race(ctx, args, table, race, overhead):
    report.section(ctx, f"3. the size-tuned all-reduce vs {LIBRARY[ctx.transport]} (same run)")
    print("switch table (fastest measured per size): " + switch_points(table))
    for line in library_words(ctx):
        print(wrapped(line))
    print(f"redop {race[0]['redop'] if race else 'sum'} (nccl-tests' column, the same on every row)")
    print(report.table(["size B", "count", "type", "algo", "time us", "algbw", "busbw",
                        "lib us", "lib busbw", "#wrong", "lib/tuned"],
                       [(r["size"], r["count"], r["type"], r["chosen"],
                         round(r["tuned_us"], 1), round(r["algbw"], 3), round(r["busbw"], 3),
                         round(r["lib_us"], 1), round(r["lib_busbw"], 3), r["wrong"], round(r["ratio"], 2))
                        for r in race]))
    slow = [r for r in race if r["ratio"] < 1]
    if slow:
        # the one cost we can price: the Python of each round (measured above); the library's rounds are C
        rows = [(bandwidth.human(r["size"]), r["chosen"], r["rounds"], round(r["tuned_us"] - r["lib_us"], 1),
                 round(r["noise_us"], 1), round(r["rounds"] * overhead * 1e6, 1), gap_verdict(r, overhead))
                for r in slow]
        ties = sum(v.startswith("a tie") for *_, v in rows)
        what = ("walking a round plus a library call that moves nothing" if ctx.transport == "mpi" else
                "walking a round; the call into the library itself is not measured here")
        print(wrapped(f"tuned slower than the library at {len(slow)} of {len(race)} sizes, {ties} of them by less "
                      f"than this run's noise (noise: the larger spread between one contender's {BATCHES} "
                      f"batches). The part we can price: ~{overhead * 1e6:.1f} us of Python per round ({what}), "
                      "which the library's C rounds do not pay:"))
        print(report.table(["size", "algo", "rounds", "gap us", "noise us", "Python us", "so the gap is"], rows,
                           align=[False, False, True, True, True, True, False]))
        cores = len(os.sched_getaffinity(0))
        if any(r[-1].startswith("not Python") for r in rows):
            crowd = (f"; and {ctx.world_size} ranks share {cores} cores, so every round also waits for the "
                     "scheduler" if ctx.world_size > cores else "")
            print(wrapped("where it is not Python, the schedule is not to blame either (ours was the fastest of "
                          f"the {len(args.algos)} raced at that size): the rest is how the library moves its "
                          "bytes, which this run does not measure" + crowd))
    if args.csv:
        report.write_csv(args.csv, race)
        print(f"wrote {args.csv}")


def main():
    parser = bootstrap.lesson_parser(__file__, __doc__)
    parser.add_argument("--counts", type=bootstrap.count_list, default=None, metavar="C,C,...",
                        help="element counts for section 1 (default 0,1,N-1,7,1000003)")
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    parser.add_argument("--algos", type=lambda t: name_list(t, ALGOS, "algorithms"), default=list(ALGOS),
                        metavar="A,A,...", help=f"a subset of {','.join(ALGOS)}")
    bandwidth.add_sweep_flags(parser, BENCH)
    parser.add_argument("--csv", metavar="PATH", help="write the section-3 table as CSV")
    args, ctx = bootstrap.start(__file__, parser)
    n, rank = ctx.world_size, ctx.rank
    args.algos = [a for a in ALGOS if a in args.algos]  # one order on every rank
    if args.counts is None:
        args.counts = [0, 1, n - 1, 7, 1000003]
    try:
        pick, sizes = bandwidth.sweep_plan(args, SWEEP, BENCH)  # -b/-e/-f/-n/-w given win over the plan's
    except ValueError as exc:
        ctx.fail(str(exc))
    if args.csv and not os.path.isdir(os.path.dirname(os.path.abspath(args.csv))):
        ctx.fail(f"--csv {args.csv}: no such folder")
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
    results = check_counts(ctx, args, be, model)
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
        mrows.append(row)
    table = switch_table({s: times[s] for s in sizes})
    race = tuned_race(ctx, args, be, pick, table, model)
    for r, (size, _) in zip(race, table):  # the sweep's times beside each race row, for the argmin check
        r.update({f"{algo}_us": times[size][algo] * 1e6 for algo in args.algos})
        r["chosen_us"] = times[size][r["chosen"]] * 1e6
    if rank == 0:
        if modeled:
            show_model(ctx, args, model, mrows, walk)
        else:
            report.section(ctx, "2. one rank: no ping-pong partner, so no alpha or beta; the model has nothing "
                                "to predict (the algorithms below only walk their empty schedules)")
        show_race(ctx, args, table, race, walk + call)
    summary = {"round_walk_us": walk * 1e6, "round_call_us": call * 1e6, "tuned": race, "switch": switch_points(table),
               "tuned_wrong": sum(r["wrong"] for r in race)}
    if modeled:
        summary.update(alpha_us=a * 1e6, beta_ps_per_B=b * 1e12, gamma_ps_per_B=g * 1e12,
                       alpha_all_us=model["alpha_all"] * 1e6, beta_ring_ps_per_B=model["beta_ring"] * 1e12,
                       model=mrows)
    report.finish(ctx, results, summary=summary, params=params)


if __name__ == "__main__":
    main()
