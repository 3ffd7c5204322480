"""Lesson 09 — reduce-scatter, all-gather and all-to-all by hand, then a mixture-of-experts dispatch.

The idea: all-reduce is two halves, and modern training uses them apart. ZeRO-3 / FSDP all-gathers a
layer's parameters before use and reduce-scatters its gradients (lesson 10); a mixture-of-experts
layer sends each token to the rank that holds its expert, an all-to-all.
  * reduce-scatter: every rank has a buffer of N blocks; rank r ends with block r summed over ranks.
    It is the first half of lesson 05's ring, run here from lesson 05's own code: its N-1 steps leave
    rank r holding chunk r+1, so block r is called chunk r+1 and the ring stops halfway. Each rank
    sends every block but its own: (N-1)/N of the buffer.
  * all-gather: the second half of that ring; block r starts on rank r, and after N-1 steps every
    rank has every block. all-reduce = reduce-scatter + all-gather: 2(N-1)/N of the buffer per rank.
  * all-to-all: rank r has one block for each rank j. Pairwise exchange: in round k (1 .. N-1) rank r
    sends its block for r+k while receiving from r-k, so every pair meets once. Blocks may differ in
    size (Alltoallv): a receiver must know the sizes first, so uneven exchanges start by exchanging
    the counts.

What to watch for:
  * section 1 runs the hand-made reduce-scatter and all-gather on several layouts (near-equal blocks
    of --counts items, some empty when count < N; and --skew: rank r's block is r*skew items, rank
    0's empty) and compares each with a one-process reference (every rank's data regenerated from
    its seed) and with the library's call. The data are small integers, so every sum is exact: any
    difference is a bug. Rounds and bytes come from common/counting.py, which saw every message.
  * section 2 does the same for all-to-all with uneven blocks: rank r sends j*unit items to rank j.
  * section 3 runs reduce-scatter then all-gather against one all-reduce: same answer, same bytes as
    lesson 05's ring, and the library's two halves timed against its whole.
  * section 4 races each hand-made collective against the library with nccl-tests' columns (busbw
    = algbw * (N-1)/N for all three); where a library lacks a call, one line says what stands in.
  * section 5 is a mixture-of-experts layer: a seeded top-1 router sends each token to one expert
    (expert e lives on rank e). Counts first, then the tokens (uneven all-to-all), the expert is
    applied, the results come back the same way; the output equals one process running the whole
    layer. The table shows the load the router put on each rank.

Run it:
  make lesson-09 NP=4                   (API=torch; ARGS="--counts 5,1000 --skew 3")
  .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py lessons/09_reduce_scatter_alltoall.py --api mpi4py
  (--bench: the full race, -b 8 -e 128M -f 2: minutes; run it raw, or bin/tutor run 09 --timeout 900)
Lesson 10 imports reduce_scatter, all_gather and all_to_all from here (bootstrap.lesson_module("09")).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import numpy as np  # noqa: E402

from common import bandwidth, bootstrap, buffers, collectives, counting, p2p, report, shards  # noqa: E402

SEED = 9                  # rank r's data comes from seed SEED + r
DTYPES = ("float32", "float64", "int32")
SKEW = 1000               # --skew: rank r's block holds r*SKEW items
UNIT = 1000               # all-to-all: rank r sends j*UNIT items to rank j
AR_COUNT = 1 << 18        # section 3's all-reduce buffer (items)
TOKENS, DMODEL = 512, 16  # section 5: tokens per rank, features per token (float64)
MOE_SEED = 90             # router and experts
RACE = dict(begin="4K", end="1M", mult=16, iters=3, warmup=1)      # default run: a short race
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


class _Halfway(Exception):
    """Stops lesson 05's ring after its reduce-scatter phase (its ring_allreduce runs both)."""


def reduce_scatter(be, send, recv, counts, rank, n):
    """recv (counts[rank] items) = the sum over ranks of block `rank` of send (sum(counts) items, left
    unchanged). Lesson 05's ring, its first N-1 steps. be: a common/p2p backend (or one Counted)."""
    five = bootstrap.lesson_module("05")
    chunks = ring_chunks(counts, n)
    work, scratch = _copy(send), _copy(send[:max(counts, default=0)])  # the ring adds in place

    def stop(phase, step, sent, got):
        if step == n - 2:  # the last reduce-scatter step: chunk rank+1 is finished here
            raise _Halfway
    try:
        five.ring_allreduce(work, scratch, chunks, rank, n, be.exchange, five.inplace_add, stop)
    except _Halfway:
        pass
    a, b = chunks[(rank + 1) % n]  # = block `rank`
    recv[:] = work[a:b]


def all_gather(be, send, recv, counts, rank, n):
    """recv (sum(counts) items) = every rank's send (counts[r] items from rank r), in rank order: lesson
    05's all-gather steps on the same chunk labels."""
    five = bootstrap.lesson_module("05")
    chunks = ring_chunks(counts, n)
    a, b = chunks[(rank + 1) % n]
    recv[a:b] = send  # my block, where the ring's all-gather expects the chunk I finished
    right, left = (rank + 1) % n, (rank - 1) % n
    for phase, step, out, into in five.ring_schedule(rank, n):
        if phase == "all-gather":
            (a, b), (c, d) = chunks[out], chunks[into]
            be.exchange(recv[a:b], recv[c:d], right, left)  # a finished block: passed on, no adding


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


def per_rank(values):
    """A row's per-rank numbers: all of them up to 4 ranks, else lowest .. highest."""
    return " ".join(map(str, values)) if len(values) <= 4 else f"{min(values)} .. {max(values)}"


def show_halves(ctx, runs, itemsize):
    every = ctx.comm.gather(runs, root=0)
    if ctx.rank:
        return
    n, rows = ctx.world_size, []
    for i, run in enumerate(runs):
        mine = [r[i] for r in every]
        bad = sum(m[k] for m in mine for k in ("rs_wrong_ref", "rs_wrong_lib", "ag_wrong_ref", "ag_wrong_lib",
                                               "send_changed"))
        rows.append([run["layout"], per_rank([m["mine"] for m in mine]),
                     per_rank(sorted({m["rs_rounds"] for m in mine} | {m["ag_rounds"] for m in mine})),
                     per_rank([m["rs_bytes"] for m in mine]), per_rank([m["ag_bytes"] for m in mine]), bad])
    print(report.table(["layout", "blocks (items)", "rounds", "RS bytes sent", "AG bytes sent", "#wrong"],
                       rows, align=[0, 0, 0, 0, 0, 1]))
    print(f"per rank, {itemsize} B per item. A rank's reduce-scatter sends every block but its own:\n"
          f"  (N-1)/N = {(n - 1) / n:.3g} of the buffer when blocks are equal. #wrong: items differing from\n"
          "  one process or from the library (both halves), plus send buffers the call changed", flush=True)


def main():
    parser = bootstrap.lesson_parser(__file__, __doc__)
    parser.add_argument("--counts", type=bootstrap.count_list, default=[0, 1, 7, 10007], metavar="C,C,...",
                        help="buffer sizes (items) split into near-equal blocks (default 0,1,7,10007)")
    parser.add_argument("--skew", type=bootstrap.nonneg_int, default=SKEW,
                        help=f"also a layout where rank r's block is r*SKEW items (0: none; default {SKEW})")
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    args, ctx = bootstrap.start(__file__, parser)
    n, rank = ctx.world_size, ctx.rank
    itemsize = np.dtype(args.dtype).itemsize
    be = counting.Counted(p2p.backend(ctx), n, rank=rank)  # exchange: Sendrecv / ncclSend+Recv / batch_isend_irecv
    library = collectives.library(ctx)
    lib = counting.Counted(library, n, rank=rank)
    params = {"dtype": args.dtype, "itemsize": itemsize, "counts": args.counts, "skew_items": args.skew}

    report.section(ctx, f"1. reduce-scatter and all-gather by hand on {n} ranks, {args.dtype}, api {ctx.api} "
                        f"({ctx.transport})")
    runs = halves(ctx, args, be, lib)
    show_halves(ctx, runs, itemsize)
    report.finish(ctx, {"halves": runs, "comm": be.counts, "lib_comm": lib.counts}, params=params)


if __name__ == "__main__":
    main()
