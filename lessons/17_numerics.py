"""Lesson 17 — is it rounding or a bug? A sum across ranks: measured, made reproducible, budgeted.

A rounded addition is not associative, so a sum across ranks depends on its order and on the dtype
it adds in. A correct answer is not the exact one; a bug is one outside the rounding budget.
  * measure: lesson 05's ring and the library's all-reduce in float32, bfloat16 and float16 against
    float64 (RMS error). In bfloat16 each hop of a ring rounds: the error grows like N; added in
    float32 and rounded once, like sqrt(N). Section 2 fits both slopes in one process (N = 2..16).
  * build (a): bfloat16 on the wire, float32 in the adder: lesson 09's all-to-all hands rank r block
    r from every rank, rank r adds in float32 and rounds once, lesson 09's all-gather spreads them.
  * build (b): a reproducible all-reduce. A fixed binary tree over the world's M numbered
    contributions decides every addition (numerics/tree.py); each rank sums the nodes inside its
    block, the nodes are all-gathered, every rank finishes the same tree: the same bits at any NP.
  * the oracle (common/tolerance.py, derived there): gamma_k * sum|x|, k = N-1 for a ring (or an
    order not known), ceil(log2 N) for a tree. Every result here is held to it, element by element.
  * silent corruption: replicas of data-parallel SGD must stay bitwise equal. After each step every
    rank fingerprints each tensor, the prints are gathered, and the rank outside the majority is
    named with the tensor and the step (at NP 2 neither can be blamed). A flipped bit and a swap are
    planted (--flip-rank, --flip-step): an XOR of the words misses the swap, sha256 does not.
NumPy has no bfloat16: on --api mpi4py it is emulated (numerics/bf16.py), travels as uint16 and is
summed by a user-defined MPI.Op; torch has bfloat16 of its own, and gloo sums it.

What to watch: the RMS columns (bf16 ring against float32); which order the library matched bit
for bit; section 3's bytes, the ring's; section 4's digest, alike at every -n; section 5's names.

Run it:
  make lesson-17 NP=4                   (API=torch; ARGS="--flip-rank 3 --flip-step 1")
  .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py lessons/17_numerics.py --api mpi4py
Tables: lessons/numerics/show.py; the faults: numerics/silent.py; the budget: common/tolerance.py.
"""
import collections
import hashlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import numpy as np  # noqa: E402

from common import bandwidth, bootstrap, buffers, collectives, counting, p2p, report, shards, tolerance  # noqa: E402
from lessons.numerics import bf16, orders, show, silent, tree, wire  # noqa: E402

five = bootstrap.lesson_module("05")  # ring_allreduce: the ring whose rounding section 1 measures
nine = bootstrap.lesson_module("09")  # all_to_all, all_gather: the wire of build (a)

COUNT = 16384              # values per rank
SEED = 17                  # rank r's values: seed SEED + r; contribution j of build (b): SEED * 1000 + j
CONTRIBUTIONS = 12         # build (b): the world's contributions, split over the ranks
FIT_N = (2, 4, 8, 16)      # section 2: the N of the one-process fit
ITERS = 5                  # section 4: timed calls of each all-reduce
SHAPES = {"w1": (5, 7), "b1": (7,), "w2": (7, 3)}  # section 5: the replicas' parameters (float32)
STEPS = 5                  # section 5: SGD steps, the replicas compared after each
LR = 0.25                  # section 5: the learning rate


def draw(seed, count):
    """Standard normal values (signs mixed, so a sum grows like sqrt(N), as gradients' sums do)."""
    return np.random.default_rng(seed).standard_normal(count)


# ---------------------------------------------------------------- build (a): bf16 wire, fp32 adder
def accumulate(parts, kind):
    """One block from every rank (the wire's dtype), added in float32 and rounded to that dtype once."""
    # >>> exercise: accumulate
    acc = kind.widen(parts[0])
    for part in parts[1:]:
        acc = acc + kind.widen(part)  # float32 + float32: no rounding to bfloat16 on the way
    return kind.narrow(acc)
    # <<< exercise: accumulate


def reduce_scatter_wide(be, kind, x, rank, n):
    """Rank r ends with block r of the sum: the blocks cross in the wire's dtype (an all-to-all: block
    j to rank j, every rank's block r back), and accumulate() adds the N copies of block r."""
    counts = [b - a for a, b in shards.chunk_bounds(buffers.size(x), n)]
    c = counts[rank]
    recv = kind.zeros(n * c)
    nine.all_to_all(be, x, counts, recv, [c] * n, rank, n)  # lesson 09's pairwise exchange
    return accumulate([recv[j * c:(j + 1) * c] for j in range(n)], kind), counts


# ---------------------------------------------------------------- build (b): a reproducible all-reduce
def reproducible_allreduce(ctx, lib, mine, m, count):
    """The float32 sum of the world's m contributions (mine: {j: values} for this rank's block), each
    addition fixed by the tree over 0..m-1, so bitwise the same at any NP. Every rank knows every rank's
    nodes (tree.owned is a function of m and the split), so only their values travel."""
    n, rank = ctx.world_size, ctx.rank
    nodes = [tree.owned(m, a, b) for a, b in shards.chunk_bounds(m, n)]
    # >>> exercise: reproducible
    local = [tree.node_sum(mine, a, b) for a, b in nodes[rank]]  # this rank's part of the tree
    send = np.concatenate(local) if local else np.zeros(0, np.float32)
    got = buffers.on_device(ctx, np.zeros(sum(map(len, nodes)) * count, np.float32))
    lib.all_gather(got, buffers.on_device(ctx, send), [len(x) * count for x in nodes])
    values = np.split(buffers.to_host(got), sum(map(len, nodes)))
    known = dict(zip([node for x in nodes for node in x], values))  # node (lo, hi) -> its sum
    return tree.finish(known, m)  # the nodes above: the same additions on every rank
    # <<< exercise: reproducible


def mean(total, m):
    """The world's mean contribution from its sum (float32)."""
    # >>> exercise: mean
    return total / np.float32(m)
    # <<< exercise: mean


# ---------------------------------------------------------------- section 1: the ring and the library
def errors(name, got, exact, budget):
    """RMS error against float64, and the elements outside the oracle's budget (and how far, worst)."""
    err = np.abs(got - exact)
    worst = float(np.max(err / np.where(budget > 0, budget, 1.0))) if err.size else 0.0
    return {f"{name}_rms": float(np.sqrt(np.mean(err ** 2))), f"{name}_over": int((err > budget).sum()),
            f"{name}_worst": worst}


def measure(ctx, be, counted, dtype, count):
    """One dtype: lesson 05's ring and the library's all-reduce on the same values, against float64."""
    n, rank = ctx.world_size, ctx.rank
    kind = wire.kind(ctx, dtype, be)
    every = [bf16.round_to(draw(SEED + r, count), dtype) for r in range(n)]  # the values ranks hold
    exact, abs_sum = np.sum(every, axis=0), np.sum(np.abs(every), axis=0)
    bounds = shards.chunk_bounds(count, n)
    ring, lib = kind.put(every[rank]), kind.put(every[rank])
    scratch = kind.zeros(max(b - a for a, b in bounds))
    with counted.phase(dtype):
        five.ring_allreduce(ring, scratch, bounds, rank, n, counted.exchange, kind.add)  # each add rounds
    kind.allreduce(lib)  # comm.Allreduce / dist.all_reduce
    budget = tolerance.budget(dtype, n, "ring", abs_sum)  # the library's order unknown: depth N-1
    got = kind.get(lib)
    digests = ctx.comm.allgather(hashlib.sha256(got.tobytes()).hexdigest())
    return {"dtype": dtype, "itemsize": wire.ITEMSIZE[dtype], **errors("ring", kind.get(ring), exact, budget),
            **errors("lib", got, exact, budget), "lib_alike": int(len(set(digests)) == 1),
            "lib_matches": orders.matching(got, every, dtype, kind.get(ring)),
            "ring_total": ctx.comm.allreduce(sent(counted, dtype))}


def sent(counted, phase):
    return counted.counts.get(phase, {}).get("exchange", {}).get("bytes", 0)


# ---------------------------------------------------------------- section 2: error against N, fitted
def fit(count):
    """One process, bfloat16: N values summed as a ring's hops do (each add rounds) and by accumulate()
    (float32, one rounding); the slope of log2(RMS error) against log2(N) for each, with its noise."""
    host, rows = wire.host("bfloat16"), []
    for k in FIT_N:
        every = [bf16.round_to(draw(SEED + r, count), "bfloat16") for r in range(k)]
        exact, hop = np.sum(every, axis=0), host.put(every[0])
        for x in every[1:]:
            host.add(hop, host.put(x))
        wide = accumulate([host.put(x) for x in every], host)
        rows.append({"n": k, "hop_rms": rms(host.get(hop) - exact), "acc_rms": rms(host.get(wide) - exact)})
    out = {"fit": rows}
    for key in ("hop", "acc"):
        (slope, _), cov = np.polyfit(np.log2(FIT_N), np.log2([r[f"{key}_rms"] for r in rows]), 1, cov=True)
        out[f"{key}_slope"], out[f"{key}_noise"] = float(slope), float(np.sqrt(cov[0, 0]))
    out["slope_gap"] = out["hop_slope"] - out["acc_slope"]
    return out


def rms(x):
    return float(np.sqrt(np.mean(np.square(x)))) if np.size(x) else 0.0


# ---------------------------------------------------------------- section 3: build (a), measured
def wide_sum(ctx, be, counted, count):
    """Build (a) on section 1's bfloat16 values: error, budget (float32 adds, one rounding), bytes."""
    n, rank = ctx.world_size, ctx.rank
    kind = wire.kind(ctx, "bfloat16", be)
    every = [bf16.round_to(draw(SEED + r, count), "bfloat16") for r in range(n)]
    exact, abs_sum = np.sum(every, axis=0), np.sum(np.abs(every), axis=0)
    full = kind.zeros(count)
    with counted.phase("wide"):
        mine, counts = reduce_scatter_wide(counted, kind, kind.put(every[rank]), rank, n)
        nine.all_gather(counted, mine, full, counts, rank, n)  # lesson 09's ring half: bf16 blocks
    got = kind.get(full)
    budget = tolerance.budget("bfloat16", n, "ring", abs_sum, accumulate="float32")
    once = rms(bf16.round_to(exact, "bfloat16") - exact)  # the exact sum, rounded to bfloat16 once
    out = errors("rs", got, exact, budget)
    return {**out, "rs_once": once, "rs_ratio": (out["rs_rms"] + 1e-30) / (once + 1e-30),
            "rs_sent": sent(counted, "wide"), "rs_total": ctx.comm.allreduce(sent(counted, "wide"))}


# ---------------------------------------------------------------- section 4: build (b), measured
def reproducible(ctx, be, m, count):
    """Build (b) against one process's tree, the oracle, and the library's all-reduce (same run)."""
    n, rank, lib = ctx.world_size, ctx.rank, collectives.library(ctx)
    world = [draw(SEED * 1000 + j, count).astype(np.float32) for j in range(m)]
    lo, hi = shards.chunk_bounds(m, n)[rank]
    mine = {j: world[j] for j in range(lo, hi)}
    total = reproducible_allreduce(ctx, lib, mine, m, count)
    exact = np.sum(np.array(world, np.float64), axis=0)
    abs_sum = np.sum(np.abs(np.array(world, np.float64)), axis=0)
    avg = mean(total, m)

    def library():  # the usual way: this rank's block added in order, then the library's all-reduce
        part = buffers.on_device(ctx, np.sum(np.array([mine[j] for j in range(lo, hi)] or [np.zeros(count)],
                                                      np.float32), axis=0, dtype=np.float32))
        be.allreduce(part)
        return buffers.to_host(part)
    t_repro = bandwidth.time_op(ctx.comm, lambda: reproducible_allreduce(ctx, lib, mine, m, count), 1, ITERS, be.sync)
    t_lib = bandwidth.time_op(ctx.comm, library, 1, ITERS, be.sync)
    return {"mismatches": int((total.view(np.uint32) != tree.one_process(world).view(np.uint32)).sum()),
            "lib_differs": int((library() != total).sum()), "digest": hashlib.sha256(total.tobytes()).hexdigest()[:16],
            **errors("tree", total.astype(np.float64), exact, tolerance.budget("float32", m, "tree", abs_sum)),
            **errors("mean", avg.astype(np.float64), exact / m,
                     tolerance.mean_budget("float32", m, "tree", abs_sum, m)),
            "repro_us": t_repro * 1e6, "lib_us": t_lib * 1e6, "cost_ratio": t_repro / max(t_lib, 1e-9)}


# ---------------------------------------------------------------- section 5: silent corruption
def fingerprint(values):
    """One tensor's fingerprint, from this rank's float32 NumPy view of it: two replicas' prints are
    equal when their bytes are, in the same order (a swap of two elements changes it, as a bit)."""
    # >>> exercise: fingerprint
    return hashlib.sha256(np.ascontiguousarray(values).tobytes()).hexdigest()[:16]
    # <<< exercise: fingerprint


def suspects(prints, names):
    """(tensor, ranks) for the first tensor, in names' order, whose replicas disagree (prints[r]:
    rank r's {name: fingerprint}): the ranks outside a strict majority, or every rank where no print
    holds one (two replicas that disagree cannot say which is wrong). None when all agree."""
    # >>> exercise: majority
    for name in names:
        votes = collections.Counter(p[name] for p in prints)
        if len(votes) > 1:
            held, count = votes.most_common(1)[0]
            if 2 * count <= len(prints):  # no strict majority: no print outvotes another
                return name, list(range(len(prints)))
            return name, [r for r, p in enumerate(prints) if p[name] != held]
    return None
    # <<< exercise: majority


def gather_prints(ctx, mine):
    """Every rank's {tensor: fingerprint}, in rank order, on every rank."""
    if ctx.api == "torch":
        import torch.distributed as dist
        every = [None] * ctx.world_size
        dist.all_gather_object(every, mine)  # gloo: each rank's pickled dict, its size first
        return every
    return ctx.comm.allgather(mine)  # mpi4py's lowercase call: pickled objects


def train(ctx, be, plant=None):
    """STEPS steps of data-parallel SGD; rank r's loss 0.5 |p - its targets|^2, so its gradient is
    p minus its targets. After each update the plant, if its step has come, then the replicas'
    prints compared. Returns ([(step, tensor, suspects)] where they disagreed, {tensor: values})."""
    n, rank = ctx.world_size, ctx.rank
    params = {name: buffers.on_device(ctx, draw((SEED, i), shape).astype(np.float32))
              for i, (name, shape) in enumerate(SHAPES.items())}  # the same start on every replica
    seen = []
    for step in range(STEPS):
        for i, (name, p) in enumerate(params.items()):
            mine = draw((SEED, rank, step, i), SHAPES[name]).astype(np.float32)  # this rank's data
            g = buffers.on_device(ctx, buffers.to_host(p) - mine)
            be.allreduce(g)       # comm.Allreduce / dist.all_reduce: the sum, alike on every rank
            p -= g * (LR / n)     # the mean gradient's step: replicas stay bitwise equal
        if plant and (plant["planted_on"], plant["step"]) == (rank, step):
            silent.apply(buffers.to_host(params[plant["tensor"]]), plant)  # this rank only
        mine = {name: fingerprint(buffers.to_host(p)) for name, p in params.items()}
        prints = gather_prints(ctx, mine)
        odd = suspects(prints, list(SHAPES))
        if odd:
            seen.append((step, *odd))
    return seen, {name: buffers.to_host(p).copy() for name, p in params.items()}


def silent_corruption(ctx, be, flip_rank, flip_step):
    """A clean run, then a run per plant: what each named (rank, tensor, step); the hashes shown."""
    clean, params = train(ctx, be)
    runs = [{**plant, **silent.named(train(ctx, be, plant)[0])}
            for plant in silent.plants(ctx.world_size, STEPS, flip_rank, flip_step)]
    return {"clean_named": len(clean), "plants": runs, "paper_tie": silent.on_paper(suspects),
            "hashes": silent.hashes(params, fingerprint)}


def flags():
    parser = bootstrap.lesson_parser(__file__, __doc__)
    parser.add_argument("--count", type=bootstrap.positive(int, most=1 << 22), default=COUNT,
                        help=f"values per rank (default {COUNT})")
    parser.add_argument("--contributions", type=bootstrap.positive(int, most=4096),
                        default=CONTRIBUTIONS, help=f"build (b): the world's M contributions (default {CONTRIBUTIONS})")
    parser.add_argument("--flip-rank", type=bootstrap.nonneg_int, metavar="R",
                        help="section 5: plant faults on rank R only (default: rank 0, last rank)")
    parser.add_argument("--flip-step", type=bootstrap.nonneg_int, metavar="S",
                        help=f"section 5: plant them right after step S, 0..{STEPS - 1} (default: "
                             f"rank 0's after the first, the last's after the last; "
                             f"with R, {STEPS // 2})")
    return parser


def main():
    args, ctx = bootstrap.start(__file__, flags())
    if ctx.device == "gpu":  # the emulated bfloat16 is NumPy's; NCCL's own bf16 is another lesson
        ctx.fail("lesson 17 measures on the CPU: run it with --device cpu", blocked=True)
    if (args.flip_rank or 0) >= ctx.world_size:  # section 5's flags, refused before section 1 runs
        ctx.fail(f"--flip-rank {args.flip_rank}: a rank from 0 to {ctx.world_size - 1} (NP = "
                 f"{ctx.world_size})")
    if (args.flip_step or 0) >= STEPS:
        ctx.fail(f"--flip-step {args.flip_step}: a step from 0 to {STEPS - 1}")
    be = p2p.backend(ctx)                          # be.exchange: comm.Sendrecv / batch_isend_irecv
    counted = counting.Counted(be, ctx.world_size)  # every exchange of the ring and of build (a), counted
    sums = [measure(ctx, be, counted, d, args.count) for d in wire.DTYPES]  # 1. ring and library vs fp64
    show.sums(ctx, sums, args.count)                                       #    and the library's order
    slopes = fit(args.count)                                               # 2. error against N, fitted
    show.fit(ctx, slopes)
    rs = wide_sum(ctx, be, counted, args.count)                            # 3. build (a): bf16 wire, fp32 adds
    show.wide(ctx, rs, sums[wire.DTYPES.index("bfloat16")], args.count)
    rp = reproducible(ctx, be, args.contributions, args.count)            # 4. build (b): reproducible
    show.reproducible(ctx, rp, args.contributions)
    sc = silent_corruption(ctx, be, args.flip_rank, args.flip_step)       # 5. replicas compared
    show.silent(ctx, sc, SHAPES, STEPS)                                   #    and XOR, shown
    params = {"count": args.count, "contributions": args.contributions, "flip_bit": silent.FLIP[2],
              "flip_rank": -1 if args.flip_rank is None else args.flip_rank,
              "flip_step": -1 if args.flip_step is None else args.flip_step}
    summary = {k: slopes[k] for k in ("hop_slope", "acc_slope", "slope_gap", "hop_noise", "acc_noise")}
    values = {"sums": sums, "rs": rs, "repro": rp, "silent": sc}
    report.finish(ctx, values, summary=summary, params=params)


if __name__ == "__main__":
    main()
