"""Lesson 09 — reduce-scatter, all-gather and all-to-all by hand, then a mixture-of-experts dispatch.

The idea: all-reduce is two halves, and modern training uses them apart. ZeRO-3 / FSDP all-gathers a
layer's parameters before use and reduce-scatters its gradients (lesson 10); a mixture-of-experts
layer sends each token to the rank that holds its expert, an all-to-all.
  * reduce-scatter: every rank has a buffer of N blocks; rank r ends with block r summed over ranks.
    It is the first half of lesson 05's ring, run from lesson 05's own code: its N-1 steps leave rank
    r holding chunk r+1, so block r is called chunk r+1 and the ring stops halfway. Each rank sends
    every block but its own: (N-1)/N of the buffer.
  * all-gather: the second half of that ring; block r starts on rank r, and after N-1 steps every
    rank has every block. all-reduce = reduce-scatter + all-gather: 2(N-1)/N of the buffer per rank.
  * all-to-all: rank r has one block for each rank j. Pairwise exchange: in round k (1 .. N-1) rank r
    sends its block for r+k while receiving from r-k, so every pair meets once. Blocks may differ in
    size (Alltoallv): a receiver must know the sizes first, so uneven exchanges send the counts first.

What to watch for: 1. the hand-made halves on uneven, empty and skewed blocks, against one process and
the library, with the rounds and bytes common/counting.py saw; 2. the same for an uneven all-to-all;
3. reduce-scatter + all-gather against one all-reduce: the same answer and bytes as lesson 05's ring,
and the library's halves timed against its whole, a verdict only beyond this run's noise (gloo has no
reduce-scatter: the lesson measures what each call wrote to its sockets); 4. a race against the
library in nccl-tests' columns; 5. a mixture-of-experts layer: counts first, then the tokens, the
expert applied, the results back the same way; it equals one process, and the table shows the load
the router put on each rank.

Run it:
  make lesson-09 NP=4                   (API=torch; ARGS="--counts 5,1000 --skew 3")
  .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py lessons/09_reduce_scatter_alltoall.py --api mpi4py
  (--bench: the full race, minutes; run it raw, or bin/tutor run 09 --timeout 900)
Next: lesson 10 builds ZeRO-3 on this reduce_scatter and all_gather. Tables: reduce_scatter_alltoall/show.py
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import numpy as np  # noqa: E402

from common import bandwidth, bootstrap, buffers, collectives, counting, p2p, report, shards, timing, tolerance  # noqa: E402
from lessons.reduce_scatter_alltoall import budget, show  # noqa: E402

five = bootstrap.lesson_module("05")  # ring_allreduce, inplace_add: the ring this lesson cuts in half

SEED = 9                  # rank r's data comes from seed SEED + r
DTYPES = ("float32", "float64", "int32")
SKEW = 1000               # --skew: rank r's block holds r*SKEW items
UNIT = 1000               # all-to-all: rank r sends j*UNIT items to rank j
AR_COUNT = 1 << 16        # section 3's all-reduce buffer (items)
TOKENS, DMODEL = 512, 16  # section 5: tokens per rank, features per token (float64)
MOE_SEED = 90             # router, experts and tokens (--seed)
MOE_SHIFT = 0.5           # the tokens' shared offset: the router favours some experts
RACE = dict(begin="4K", end="1M", mult=256, iters=3, warmup=1)     # default run: two sizes
BENCH = dict(begin="8", end="128M", mult=2, iters=20, warmup=5)    # --bench: nccl-tests' defaults


# ---------------------------------------------------------------- the collectives, by hand
def ring_chunks(counts, n):
    """Block bounds in lesson 05's chunk labels: its ring leaves rank r holding chunk (r+1) mod N, so
    chunk r+1 must be block r (and the ring takes any bounds, uneven and empty ones too)."""
    blocks = collectives.bounds(counts)
    # >>> exercise: ring_chunks
    return [blocks[(j - 1) % n] for j in range(n)]
    # <<< exercise: ring_chunks


def _copy(buf):
    return buf.clone() if hasattr(buf, "clone") else buf.copy()  # torch | numpy, cupy


def reduce_scatter(be, send, recv, counts, rank, n):
    """recv (counts[rank] items) = the sum over ranks of block `rank` of send (sum(counts) items, left
    unchanged). Lesson 05's ring, its reduce-scatter half. be: a common/p2p backend (or one Counted)."""
    chunks = ring_chunks(counts, n)
    work, scratch = _copy(send), _copy(send[:max(counts, default=0)])  # the ring adds in place
    five.ring_allreduce(work, scratch, chunks, rank, n, be.exchange, five.inplace_add,
                        phases=("reduce-scatter",))
    a, b = chunks[(rank + 1) % n]  # = block `rank`, the chunk lesson 05's ring finishes on this rank
    assert b - a == counts[rank], (f"rank {rank}: the ring's chunk for block {rank} holds {b - a} items, "
                                   f"the block {counts[rank]}: chunk bounds must come from the counts")
    recv[:] = work[a:b]


def all_gather(be, send, recv, counts, rank, n):
    """recv (sum(counts) items) = every rank's send (counts[r] items from rank r), in rank order: lesson
    05's ring, its all-gather half, on the same chunk labels."""
    chunks = ring_chunks(counts, n)
    a, b = chunks[(rank + 1) % n]
    recv[a:b] = send  # my block, where the ring's all-gather expects the chunk it finished here
    five.ring_allreduce(recv, None, chunks, rank, n, be.exchange, five.inplace_add, phases=("all-gather",))


def all_to_all(be, send, send_counts, recv, recv_counts, rank, n):
    """Pairwise exchange: send_counts[j] items of send go to rank j, recv_counts[j] items arrive from
    rank j, in rank order. N-1 rounds; every rank's counts must agree (j's send_counts[r] =
    r's recv_counts[j])."""
    sends, recvs = collectives.bounds(send_counts), collectives.bounds(recv_counts)
    (a, b), (c, d) = sends[rank], recvs[rank]
    recv[c:d] = send[a:b]  # my block for me: a copy, no message
    # >>> exercise: pairwise
    for k in range(1, n):  # round k: to rank+k, from rank-k; over the N-1 rounds every pair meets once
        dest, source = (rank + k) % n, (rank - k) % n
        (a, b), (c, d) = sends[dest], recvs[source]
        be.exchange(send[a:b], recv[c:d], dest, source)
    # <<< exercise: pairwise


# ---------------------------------------------------------------- section 1: reduce-scatter, all-gather
def layouts(args, n):
    """[(label, skew, counts)]: near-equal blocks of each --counts total, then rank r's block r*skew."""
    out = [(f"{c}", 0, shards.counts_displs(c, n)[0]) for c in args.counts]
    if args.skew:
        out.append((f"skew {args.skew}", args.skew, [r * args.skew for r in range(n)]))
    return out


def wrong(got, want):
    return int((buffers.to_host(got) != want).sum()) if want.size else 0


def seen(counted, phase, name="exchange"):
    """What common/counting.py saw under `phase` (no calls at all on one rank: zeros)."""
    return counted.counts.get(phase, {}).get(name, {"calls": 0, "bytes": 0, "peers": []})


def halves(ctx, args, be, lib):
    """Hand-made reduce-scatter and all-gather on every layout, against the reference and the library."""
    n, rank, runs = ctx.world_size, ctx.rank, []
    for label, skew, counts in layouts(args, n):
        total, (a, b) = sum(counts), collectives.bounds(counts)[rank]
        every = [buffers.seeded(SEED + r, total, args.dtype, small_ints=True) for r in range(n)]
        want_rs, want_ag = sum(every)[a:b], sum(every)  # one process: every rank's data, added
        x = buffers.on_device(ctx, every[rank].copy())
        mine, lib_mine = buffers.empty(ctx, counts[rank], args.dtype), buffers.empty(ctx, counts[rank], args.dtype)
        full, lib_full = buffers.empty(ctx, total, args.dtype), buffers.empty(ctx, total, args.dtype)
        with be.phase(f"reduce_scatter {label}"):
            reduce_scatter(be, x, mine, counts, rank, n)
        with be.phase(f"all_gather {label}"):
            all_gather(be, mine, full, counts, rank, n)
        with lib.phase(f"{label}"):
            lib.reduce_scatter(lib_mine, x, counts)
            lib.all_gather(lib_full, lib_mine, counts)
        lib.sync()
        rs, ag = seen(be, f"reduce_scatter {label}"), seen(be, f"all_gather {label}")
        runs.append({"layout": label, "count": total, "skew": skew, "mine": counts[rank],
                     "rs_rounds": rs["calls"], "rs_bytes": rs["bytes"], "ag_rounds": ag["calls"],
                     "ag_bytes": ag["bytes"], "ag_total": ctx.comm.allreduce(ag["bytes"]),
                     "rs_wrong_ref": wrong(mine, want_rs), "rs_wrong_lib": wrong(mine, buffers.to_host(lib_mine)),
                     "ag_wrong_ref": wrong(full, want_ag), "ag_wrong_lib": wrong(full, buffers.to_host(lib_full)),
                     "send_changed": wrong(x, every[rank])})
    return runs


# ---------------------------------------------------------------- section 2: all-to-all, uneven
def exchange_all(ctx, args, be, lib):
    """Rank r sends j*unit items to rank j (so it receives r*unit from each): by hand and by library."""
    n, rank, unit = ctx.world_size, ctx.rank, args.unit
    send_counts, recv_counts = [j * unit for j in range(n)], [rank * unit] * n
    every = [buffers.seeded(SEED + r, unit * n * (n - 1) // 2, args.dtype, small_ints=True) for r in range(n)]
    want = np.concatenate([every[j][slice(*collectives.bounds(send_counts)[rank])] for j in range(n)])
    x = buffers.on_device(ctx, every[rank].copy())
    got, lib_got = buffers.empty(ctx, rank * unit * n, args.dtype), buffers.empty(ctx, rank * unit * n, args.dtype)
    with be.phase("all_to_all"):
        all_to_all(be, x, send_counts, got, recv_counts, rank, n)
    with lib.phase("all_to_all"):
        lib.all_to_all(lib_got, x, recv_counts, send_counts)
    lib.sync()
    mine = seen(be, "all_to_all")
    return {"unit": unit, "rounds": mine["calls"], "bytes": mine["bytes"],
            "recv_bytes": mine.get("recv_bytes", 0), "peers": len(mine["peers"]),
            "wrong_ref": wrong(got, want), "wrong_lib": wrong(got, buffers.to_host(lib_got)),
            "send_changed": wrong(x, every[rank])}


# ---------------------------------------------------------------- section 3: all-reduce from its halves
def halves_make_whole(ctx, args, be, library, pick):
    """reduce-scatter + all-gather vs all-reduce: the same sum, the same bytes as lesson 05's ring,
    the time of the library's two halves against its whole, and (gloo) what each call really sent."""
    n, rank = ctx.world_size, ctx.rank
    counts = shards.counts_displs(args.ar_count, n)[0]
    host = buffers.seeded(SEED + rank, args.ar_count, args.dtype, small_ints=True)
    x, whole = buffers.on_device(ctx, host.copy()), buffers.on_device(ctx, host.copy())
    mine = buffers.empty(ctx, counts[rank], args.dtype)
    out, ring = buffers.empty(ctx, args.ar_count, args.dtype), buffers.on_device(ctx, host.copy())
    scratch = buffers.empty(ctx, max(counts), args.dtype)
    raw = p2p.backend(ctx)  # uncounted, for the clock
    with be.phase("rs+ag"):
        reduce_scatter(be, x, mine, counts, rank, n)
        all_gather(be, mine, out, counts, rank, n)
    with be.phase("ring 05"):  # lesson 05's all-reduce on its own chunks
        five.ring_allreduce(ring, scratch, shards.chunk_bounds(args.ar_count, n), rank, n, be.exchange,
                            five.inplace_add)
    raw.allreduce(whole)
    raw.sync()
    bad = wrong(out, buffers.to_host(whole))  # before the clock: the timed calls run in place, again and again
    sent = {k: seen(be, k)["bytes"] for k in ("rs+ag", "ring 05")}
    wire = collectives.wire_bytes(ctx.comm, library, {  # gloo: what each call wrote to its sockets
        "reduce_scatter": lambda: library.reduce_scatter(mine, x, counts),
        "all_gather": lambda: library.all_gather(out, mine, counts), "allreduce": lambda: raw.allreduce(whole)})
    t = {"hand_rs_ag": lambda: (reduce_scatter(raw, x, mine, counts, rank, n),
                                all_gather(raw, mine, out, counts, rank, n)),
         "hand_ring": lambda: five.ring_allreduce(ring, scratch, shards.chunk_bounds(args.ar_count, n), rank,
                                                  n, raw.exchange, five.inplace_add),
         "lib_rs_ag": lambda: (library.reduce_scatter(mine, x, counts), library.all_gather(out, mine, counts)),
         "lib_allreduce": lambda: raw.allreduce(whole)}
    spread = {}  # lesson 07's rule: best of interleaved batches, and how far this run's batches wander
    secs = timing.best_of(ctx, raw, t, pick["warmup"], pick["iters"], spread)
    return {"ar_count": args.ar_count, "wrong": bad, "rs_ag_bytes": sent["rs+ag"],
            "ring_bytes": sent["ring 05"], "rs_ag_total": ctx.comm.allreduce(sent["rs+ag"]),
            "ring_total": ctx.comm.allreduce(sent["ring 05"]), "lib_wire": wire,
            "lib_halves_real": (wire["reduce_scatter"] < 0.75 * wire["allreduce"] if wire  # a ring's: 0.5
                                else "reduce_scatter" not in library.rules),
            **{f"{k}_us": v * 1e6 for k, v in secs.items()}, **{f"{k}_noise_us": v * 1e6 for k, v in spread.items()}}


# ---------------------------------------------------------------- section 4: the race
def race(ctx, args, be, library, pick, sweep):
    """Each hand-made collective vs the library's on equal blocks, nccl-tests' columns; size = the
    whole buffer (the reduce-scatter's input, the all-gather's output, the all-to-all's send)."""
    n, rank, itemsize = ctx.world_size, ctx.rank, np.dtype(args.dtype).itemsize
    rows = []
    for op in ("reduce_scatter", "all_gather", "all_to_all"):
        for size in sweep:
            each = max(size // itemsize // n, 1)
            counts, count = [each] * n, each * n
            x = buffers.on_device(ctx, buffers.seeded(SEED + rank, count, args.dtype, small_ints=True))
            small, big = buffers.empty(ctx, each, args.dtype), buffers.empty(ctx, count, args.dtype)
            lib_small, lib_big = buffers.empty(ctx, each, args.dtype), buffers.empty(ctx, count, args.dtype)
            hand, lib = {
                "reduce_scatter": (lambda: reduce_scatter(be, x, small, counts, rank, n),
                                   lambda: library.reduce_scatter(lib_small, x, counts)),
                "all_gather": (lambda: all_gather(be, x[:each], big, counts, rank, n),
                               lambda: library.all_gather(lib_big, x[:each], counts)),
                "all_to_all": (lambda: all_to_all(be, x, counts, big, counts, rank, n),
                               lambda: library.all_to_all(lib_big, x, counts, counts))}[op]
            hand()
            lib()
            be.sync()
            got, want = (small, lib_small) if op == "reduce_scatter" else (big, lib_big)
            bad = ctx.comm.allreduce(wrong(got, buffers.to_host(want)))
            t_hand = bandwidth.time_op(ctx.comm, hand, pick["warmup"], pick["iters"], be.sync)
            t_lib = bandwidth.time_op(ctx.comm, lib, pick["warmup"], pick["iters"], be.sync)
            nb, kind = count * itemsize, op.replace("_", "")
            rows.append({"op": op, "size": nb, "count": count, "type": args.dtype,
                         "redop": "sum" if op == "reduce_scatter" else "none",
                         "hand_us": t_hand * 1e6, "hand_algbw": bandwidth.algbw(nb, t_hand),
                         "hand_busbw": bandwidth.busbw(kind, nb, t_hand, n), "lib_us": t_lib * 1e6,
                         "lib_algbw": bandwidth.algbw(nb, t_lib), "lib_busbw": bandwidth.busbw(kind, nb, t_lib, n),
                         "wrong": bad, "ratio": t_lib / t_hand if t_hand > 0 else 0.0})
    return rows


# ---------------------------------------------------------------- section 5: mixture of experts
def moe_weights(n, d, seed=MOE_SEED):
    """The router (d x N: one logit per expert) and N experts (d x d each); expert e lives on rank e."""
    router = np.random.default_rng(seed).standard_normal((d, n))
    experts = [np.random.default_rng(seed + 1 + e).standard_normal((d, d)) / np.sqrt(d) for e in range(n)]
    return router, experts


def moe_tokens(rank, count, d, seed=MOE_SEED):
    """Rank r's tokens; the shared offset tilts the router towards some experts, as real ones drift."""
    return np.random.default_rng(seed + SEED + 10 + rank).standard_normal((count, d)) + MOE_SHIFT


def route(x, router):
    """Top-1 routing: each token's expert, and its gate (that expert's softmax probability)."""
    logits = x @ router
    expert = logits.argmax(axis=1)
    z = np.exp(logits - logits.max(axis=1, keepdims=True))
    return expert, (z / z.sum(axis=1, keepdims=True))[np.arange(len(x)), expert]


def expert_apply(w, x):
    return np.tanh(x @ w)


def moe_one_process(n, count, d, seed=MOE_SEED):
    """The whole layer in one process, on every rank's tokens: the reference."""
    router, experts = moe_weights(n, d, seed)
    x = np.concatenate([moe_tokens(r, count, d, seed) for r in range(n)])
    expert, gate = route(x, router)
    y = np.empty_like(x)
    for e, w in enumerate(experts):
        y[expert == e] = expert_apply(w, x[expert == e])
    return y * gate[:, None]


def moe_layer(ctx, be, x, router, w_mine, d):
    """Distributed: route my tokens, send each to its expert's rank, apply mine, send results back.
    Returns (my tokens' outputs, tokens I sent to each rank, tokens each rank sent me)."""
    n, rank = ctx.world_size, ctx.rank
    expert, gate = route(x, router)
    order = np.argsort(expert, kind="stable")  # my tokens grouped by destination rank, in token order
    send_counts = np.bincount(expert, minlength=n).astype(np.int64)
    ones = [1] * n
    # >>> exercise: dispatch
    with be.phase("moe counts"):  # counts first: a receiver must know how much is coming from whom
        got_counts = buffers.empty(ctx, n, np.int64)
        all_to_all(be, buffers.on_device(ctx, send_counts), ones, got_counts, ones, rank, n)
        be.sync()  # gpu: nccl is async; the host reads the counts next
        recv_counts = buffers.to_host(got_counts).astype(np.int64)
    with be.phase("moe tokens"):  # then the tokens, uneven: send_counts[j] tokens of d features to rank j
        tokens = buffers.empty(ctx, int(recv_counts.sum()) * d, x.dtype)
        all_to_all(be, buffers.on_device(ctx, x[order].ravel()), list(send_counts * d), tokens,
                   list(recv_counts * d), rank, n)
    # <<< exercise: dispatch
    be.sync()
    out = expert_apply(w_mine, buffers.to_host(tokens).reshape(-1, d))  # my expert, on every rank's tokens
    with be.phase("moe results"):  # back the way they came: the counts swap roles
        back = buffers.empty(ctx, len(x) * d, x.dtype)
        all_to_all(be, buffers.on_device(ctx, out.ravel()), list(recv_counts * d), back, list(send_counts * d),
                   rank, n)
    be.sync()
    y = np.empty_like(x)
    y[order] = buffers.to_host(back).reshape(-1, d)
    return y * gate[:, None], send_counts, recv_counts


def moe(ctx, args, be):
    n, rank, d = ctx.world_size, ctx.rank, DMODEL
    router, experts = moe_weights(n, d, args.seed)
    x = moe_tokens(rank, args.tokens, d, args.seed)
    y, sent, got = moe_layer(ctx, be, x, router, experts[rank], d)
    want = moe_one_process(n, args.tokens, d, args.seed)[rank * args.tokens:(rank + 1) * args.tokens]
    bound = budget.moe_entries(x, router, experts, *route(x, router))  # the oracle's, per entry
    return {"moe_err": float(np.abs(y - want).max()) if y.size else 0.0,
            "moe_ratio": tolerance.worst_ratio(y - want, bound), "moe_budget": float(bound.max(initial=0)),
            "tokens_in": int(got.sum()),
            "kept": int(sent[rank]), "count_rounds": seen(be, "moe counts")["calls"],
            "count_bytes": seen(be, "moe counts")["bytes"], "token_bytes": seen(be, "moe tokens")["bytes"],
            "result_bytes": seen(be, "moe results")["bytes"]}


def params(args, itemsize, raced):
    """The run's parameters, as the YAML's expressions name them."""
    return {"dtype": args.dtype, "itemsize": itemsize, "counts": args.counts, "skew_items": args.skew,
            "unit": args.unit, "ar_count": args.ar_count, "tokens": args.tokens, "dmodel": DMODEL,
            "race": int(raced)}


def flags():
    parser = bootstrap.lesson_parser(__file__, __doc__)
    parser.add_argument("--counts", type=bootstrap.count_list, default=[0, 1, 7, 10007], metavar="C,C,...",
                        help="buffer sizes (items) split into near-equal blocks (default 0,1,7,10007)")
    parser.add_argument("--skew", type=bootstrap.nonneg_int, default=SKEW,
                        help=f"also a layout where rank r's block is r*SKEW items (0: none; default {SKEW})")
    parser.add_argument("--unit", type=bootstrap.nonneg_int, default=UNIT,
                        help=f"all-to-all: rank r sends j*UNIT items to rank j (default {UNIT})")
    parser.add_argument("--ar-count", type=bootstrap.positive(int), default=AR_COUNT,
                        help=f"section 3's all-reduce buffer, items (default {AR_COUNT})")
    parser.add_argument("--tokens", type=bootstrap.nonneg_int, default=TOKENS,
                        help=f"mixture of experts: tokens per rank (default {TOKENS})")
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    parser.add_argument("--seed", type=int, default=MOE_SEED, help=f"mixture of experts' seed (default {MOE_SEED})")
    bandwidth.add_sweep_flags(parser, BENCH)
    parser.add_argument("--no-race", action="store_true", help="skip the timed sections 3 and 4's race")
    return parser


def main():
    args, ctx = bootstrap.start(__file__, flags())
    n, rank = ctx.world_size, ctx.rank
    try:
        pick, sweep = bandwidth.sweep_plan(args, RACE, BENCH)
    except ValueError as exc:
        ctx.fail(str(exc))
    itemsize, raced = np.dtype(args.dtype).itemsize, not args.no_race and n > 1
    be = counting.Counted(p2p.backend(ctx), n, rank=rank)  # exchange: Sendrecv / ncclSend+Recv / batch_isend_irecv
    library = collectives.library(ctx)
    lib = counting.Counted(library, n, rank=rank, rules=library.rules)  # the library's calls, counted too
    values, summary = {}, {}

    report.section(ctx, f"1. reduce-scatter and all-gather by hand, {n} ranks, {args.dtype}, api {ctx.api} "
                        f"({ctx.transport})")
    values["halves"] = halves(ctx, args, be, lib)                   # by hand vs one process vs the library
    show.halves(ctx, values["halves"], itemsize, library.missing)
    report.section(ctx, "2. all-to-all by hand, pairwise: uneven blocks")
    values["a2a"] = exchange_all(ctx, args, be, lib)                # uneven blocks, the same three ways
    show.exchange(ctx, values["a2a"], itemsize)
    if raced:
        report.section(ctx, "3. all-reduce = reduce-scatter + all-gather")
        values["whole"] = halves_make_whole(ctx, args, be, library, pick)  # the halves make the whole
        show.whole(ctx, values["whole"], itemsize)
        report.section(ctx, "4. the race: by hand vs the library, equal blocks")
        rows = race(ctx, args, p2p.backend(ctx), library, pick, sweep)    # nccl-tests' columns
        show.race(ctx, rows, pick, library)
        summary.update(race=rows, race_wrong=sum(r["wrong"] for r in rows))
    report.section(ctx, "5. a mixture-of-experts layer: tokens to their experts and back (all-to-all)")
    values["moe"] = moe(ctx, args, be)                              # counts, tokens, expert, results back
    values["moe_kept"] = values["moe"]["kept"]  # a scalar of the rank's own item: a YAML check reads it
    summary.update(show.moe(ctx, values["moe"], args.tokens, DMODEL) or {})
    values.update(comm=be.counts, lib_comm=lib.counts)
    report.finish(ctx, values, summary=summary, params=params(args, itemsize, raced))


if __name__ == "__main__":
    main()
