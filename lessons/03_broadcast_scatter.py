"""Lesson 03 — broadcast, scatter and gather: one array from one rank to all, or one piece to each.

The idea:
  * broadcast copies the root's whole buffer into every rank's buffer ("one tensor from one GPU to
    all the others": initial weights, a config, a batch of prompts). Any rank can be the root;
  * scatter cuts the root's array into N pieces and sends piece r to rank r; when the count does not
    divide by N the pieces differ in size (MPI: Scatterv with counts and displacements; torch and
    NCCL: pad every piece to the largest, or pair sends with receives). shard_sizes, the exercise,
    says how many items each rank gets and where its piece starts;
  * gather is the inverse: piece r comes back to position r of the root's array;
  * if each rank needs only its slice, broadcast-then-slice makes every non-root receive the whole
    array instead of its 1/N, so N times the bytes cross the wire, and every rank holds the whole
    array for a moment. Section 3 does both by hand with point-to-point calls (a binomial-tree
    broadcast, a scatter in which the root sends each piece), counts the bytes each rank sends and
    receives as it sends them, and times them beside the library's own broadcast and scatter.

What to watch for: the root's values arriving on every rank (sections 1-2); in section 3, the
per-rank table of bytes sent, received and peak bytes held (about the whole array vs 1/N of it),
the total on the wire, and the time ratio, which is smaller than the byte ratio when the tree's
ranks send at the same time. With 1 rank every collective is a local copy.

Run it:
  make lesson-03 NP=4                       (or API=torch, ARGS="--root 2 --big 1048576")
  .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py lessons/03_broadcast_scatter.py --api mpi4py
Read next: lesson 04 (all-gather, and the all-reduces of softmax and the L2 norm). Beside this page:
broadcast_scatter/measure.py (bytes, peaks, times) and broadcast_scatter/show.py (section 3's table).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import numpy as np  # noqa: E402

from common import bootstrap, buffers, report, text  # noqa: E402
from common.shards import chunk_bounds  # noqa: E402
from lessons.broadcast_scatter import show  # noqa: E402
from lessons.broadcast_scatter.measure import PeakBytes, Wire, median_time  # noqa: E402

COUNT = 10          # items in the broadcast and the uneven scatter (10 over 4 ranks: 3, 3, 2, 2)
CHUNK = 4           # items per rank in the equal scatter
BIG = 1 << 22       # float32 items in the broadcast-then-slice vs scatter comparison (16.8 MB)
REPS = 5            # timed repetitions of each; the median is reported
SHOWN = 10          # a list of up to this many items prints whole; a longer one is shortened
TAG = 1000          # root r's broadcast data is TAG*r + 0, 1, 2 ...: the values name their sender


def shard_sizes(count, n):
    """(counts, displs): how many of `count` items each of n ranks gets, and where its piece starts.
    The kit's convention (as numpy.array_split and torch.tensor_split): the first count % n ranks
    get one item more."""
    # >>> exercise: shard_sizes
    base, extra = divmod(count, n)
    counts = [base + (1 if r < extra else 0) for r in range(n)]  # the first count % n ranks: one more
    displs = [sum(counts[:r]) for r in range(n)]                  # piece r starts where r-1 ended
    # <<< exercise: shard_sizes
    return counts, displs


def broadcast(ctx, buf, root):
    """Every rank's `buf` becomes a copy of the root's. Collective."""
    if ctx.api == "torch":
        import torch.distributed as dist
        dist.broadcast(buf, src=root)
    elif ctx.device == "gpu":
        import cupy
        stream = cupy.cuda.get_current_stream()
        ctx.nccl.bcast(buf.data.ptr, buf.size, buffers.nccl_dtype(buf), root, stream.ptr)
        stream.synchronize()  # nccl is asynchronous: wait before the host reads buf
    else:
        ctx.comm.Bcast(buf, root=root)


def nccl_pairs(ctx, sends, recvs):
    """CuPy's NCCL binding has no scatter/gather: grouped point-to-point (peer, array) pairs do it."""
    import cupy
    from cupy.cuda import nccl
    stream = cupy.cuda.get_current_stream()
    nccl.groupStart()  # inside a group the sends and receives are matched together, no deadlock
    for peer, a in sends:
        ctx.nccl.send(a.data.ptr, a.size, buffers.nccl_dtype(a), peer, stream.ptr)
    for peer, a in recvs:
        ctx.nccl.recv(a.data.ptr, a.size, buffers.nccl_dtype(a), peer, stream.ptr)
    nccl.groupEnd()
    stream.synchronize()


def scatter_equal(ctx, full, recv, root):
    """Rank r's `recv` gets full[r*c:(r+1)*c], c = recv's size; `full` matters only on the root."""
    n, c = ctx.world_size, len(recv)
    if ctx.api == "torch":
        import torch.distributed as dist
        pieces = [full[r * c:(r + 1) * c] for r in range(n)] if ctx.rank == root else None
        dist.scatter(recv, scatter_list=pieces, src=root)
    elif ctx.device == "gpu":
        if ctx.rank == root:
            recv[:] = full[root * c:(root + 1) * c]  # the root's own piece never leaves the GPU
        sends = [(r, full[r * c:(r + 1) * c]) for r in range(n) if r != root] if ctx.rank == root else []
        nccl_pairs(ctx, sends, [(root, recv)] if ctx.rank != root and c else [])
    else:
        ctx.comm.Scatter(full if ctx.rank == root else None, recv, root=root)


def scatter_uneven(ctx, full, count, dtype, root):
    """Rank r gets its near-equal share of the root's `full` (count items in all).

    Returns (my piece, the receive buffer the collective filled): they differ where pieces are padded."""
    n = ctx.world_size
    counts, displs = shard_sizes(count, n)
    mine = counts[ctx.rank]
    if ctx.api == "torch":
        import torch.distributed as dist
        # gloo/nccl scatter wants equal sizes: pad every piece to the largest, then trim
        recv = buffers.empty(ctx, max(counts), dtype)
        pieces = None
        if ctx.rank == root:
            pieces = [buffers.empty(ctx, max(counts), dtype) for _ in range(n)]
            for piece, c, d in zip(pieces, counts, displs):
                piece[:c] = full[d:d + c]
        dist.scatter(recv, scatter_list=pieces, src=root)
        return recv[:mine], recv
    if ctx.device == "gpu":
        recv = buffers.empty(ctx, mine, dtype)
        if ctx.rank == root:
            recv[:] = full[displs[root]:displs[root] + mine]  # the root's own piece stays local
        sends = [(r, full[d:d + c]) for r, (c, d) in enumerate(zip(counts, displs))
                 if r != root and c] if ctx.rank == root else []
        nccl_pairs(ctx, sends, [(root, recv)] if ctx.rank != root and mine else [])
        return recv, recv
    from mpi4py.util.dtlib import from_numpy_dtype
    recv = np.empty(mine, dtype=dtype)
    send = [full, counts, displs, from_numpy_dtype(dtype)] if ctx.rank == root else None
    ctx.comm.Scatterv(send, recv, root=root)  # rank r gets counts[r] items from offset displs[r]
    return recv, recv


def gather_uneven(ctx, piece, count, dtype, root):
    """The inverse of scatter_uneven: the root gets every rank's piece in rank order; others None."""
    n = ctx.world_size
    counts, displs = shard_sizes(count, n)
    bounds = [(d, d + c) for c, d in zip(counts, displs)]
    if ctx.api == "torch":
        import torch.distributed as dist
        width = max(counts)
        padded = buffers.empty(ctx, width, dtype)
        padded[:len(piece)] = piece
        parts = [buffers.empty(ctx, width, dtype) for _ in range(n)] if ctx.rank == root else None
        dist.gather(padded, gather_list=parts, dst=root)
        if ctx.rank != root:
            return None
        import torch
        return torch.cat([p[:b - a] for p, (a, b) in zip(parts, bounds)])
    if ctx.device == "gpu":
        out = buffers.empty(ctx, count, dtype) if ctx.rank == root else None
        if ctx.rank == root:
            a, b = bounds[root]
            out[a:b] = piece
        recvs = [(r, out[lo:hi]) for r, (lo, hi) in enumerate(bounds)
                 if r != root and hi > lo] if ctx.rank == root else []
        nccl_pairs(ctx, [(root, piece)] if ctx.rank != root and len(piece) else [], recvs)
        return out
    from mpi4py.util.dtlib import from_numpy_dtype
    out = np.empty(count, dtype=dtype) if ctx.rank == root else None
    recv = [out, counts, displs, from_numpy_dtype(dtype)] if ctx.rank == root else None
    ctx.comm.Gatherv(piece, recv, root=root)
    return out


def tree_broadcast(ctx, wire, buf, root):
    """Binomial tree: in the round of `step`, every rank that holds the data sends it `step` ranks on,
    so the number of holders doubles each round and log2(N) rounds reach everyone."""
    n = ctx.world_size
    v = (ctx.rank - root) % n  # my distance from the root
    step = 1
    while step < n:
        if v < step and v + step < n:
            wire.group([(buf, (ctx.rank + step) % n)], [])
        elif step <= v < 2 * step:
            wire.group([], [(buf, (ctx.rank - step) % n)])
        step *= 2


def bcast_then_slice(ctx, wire, data, big, root, meter):
    """Everyone receives the whole array down the tree, then keeps its slice."""
    counts, displs = shard_sizes(big, ctx.world_size)
    full = data if ctx.rank == root else buffers.empty(ctx, big, np.float32)
    tree_broadcast(ctx, wire, full, root)
    a = displs[ctx.rank]
    mine = buffers.empty(ctx, counts[ctx.rank], np.float32)
    mine[:] = full[a:a + counts[ctx.rank]]  # a copy, so `full` could be freed; until then both are held
    meter.sample()
    return mine


def scatter_by_hand(ctx, wire, data, big, root, meter):
    """The root sends piece r to rank r; every other rank receives only its own piece."""
    counts, displs = shard_sizes(big, ctx.world_size)
    mine = buffers.empty(ctx, counts[ctx.rank], np.float32)
    if ctx.rank == root:
        mine[:] = data[displs[root]:displs[root] + counts[root]]  # the root's own piece stays local
        wire.group([(data[d:d + c], r) for r, (c, d) in enumerate(zip(counts, displs)) if r != root], [])
    else:
        wire.group([], [(mine, root)])
    meter.sample()
    return mine


def library_bcast_then_slice(ctx, data, big, root):
    counts, displs = shard_sizes(big, ctx.world_size)
    full = data if ctx.rank == root else buffers.empty(ctx, big, np.float32)
    broadcast(ctx, full, root)
    mine = buffers.empty(ctx, counts[ctx.rank], np.float32)
    mine[:] = full[displs[ctx.rank]:displs[ctx.rank] + counts[ctx.rank]]
    return mine


def section_broadcast(ctx, args):
    """Section 1: a broadcast from --root, then one from the next rank into a second buffer, checked."""
    n, rank, root, count = ctx.world_size, ctx.rank, args.root, args.count
    root2 = (root + 1) % n
    report.section(ctx, f"1. broadcast from rank {root}, then from rank {root2} into a second buffer"
                   + ("\n   (1 rank: both roots are rank 0, a broadcast is a no-op)" if n == 1 else ""))
    # every non-root starts with -1s, so a broadcast that never arrived shows up as -1
    a_host = TAG * root + np.arange(count, dtype=np.float64) if rank == root else np.full(count, -1.0)
    b_host = TAG * root2 + np.arange(count, dtype=np.float64) if rank == root2 else np.full(count, -1.0)
    buf_a, buf_b = buffers.on_device(ctx, a_host), buffers.on_device(ctx, b_host)
    # per API: comm.Bcast(buf, root) | dist.broadcast(t, src) | nccl bcast(ptr, n, type, root, stream)
    broadcast(ctx, buf_a, root)
    broadcast(ctx, buf_b, root2)
    got_a, got_b = buffers.to_host(buf_a), buffers.to_host(buf_b)
    report.say(ctx, f"buffer a = {text.brief(got_a, SHOWN)}\nbuffer b = {text.brief(got_b, SHOWN)}")
    want_a = TAG * root + np.arange(count)
    want_b = TAG * root2 + np.arange(count)
    assert np.array_equal(got_a, want_a) and np.array_equal(got_b, want_b), "a broadcast went wrong"
    return got_a, got_b


def section_scatter(ctx, args):
    """Section 2: an equal scatter, an uneven one, and a gather back; (equal piece, uneven piece, gathered)."""
    n, rank, root, count, c = ctx.world_size, ctx.rank, args.root, args.count, args.chunk
    report.section(ctx, f"2. scatter from rank {root}: {c} items each, then {count} unevenly "
                   f"({text.brief(shard_sizes(count, n)[0], SHOWN)}), gather them back")
    full = np.arange(n * c, dtype=np.float64) if rank == root else None
    piece = buffers.empty(ctx, c, np.float64)
    scatter_equal(ctx, buffers.on_device(ctx, full) if rank == root else None, piece, root)
    piece = buffers.to_host(piece)
    uneven_full = np.arange(count, dtype=np.float64) if rank == root else None
    upiece, _ = scatter_uneven(ctx, buffers.on_device(ctx, uneven_full) if rank == root else None,
                               count, np.float64, root)
    back = gather_uneven(ctx, upiece, count, np.float64, root)
    upiece = buffers.to_host(upiece)
    lo, hi = chunk_bounds(count, n)[rank]
    report.say(ctx, f"equal piece {text.brief(piece, SHOWN)}   "
                    f"uneven piece {text.brief(upiece, SHOWN)} (items {lo}..{hi - 1})")
    assert np.array_equal(piece, np.arange(rank * c, (rank + 1) * c)), "equal scatter: wrong piece"
    assert np.array_equal(upiece, np.arange(lo, hi)), (
        f"uneven scatter: wrong piece: rank {rank} got {upiece.size} items {upiece[:3]}..., want items "
        f"{lo}..{hi - 1}: each rank gets count // N, the first count % N one more, each piece starting "
        "where the one before ended")
    gathered = buffers.to_host(back) if rank == root else np.zeros(0)
    if rank == root:
        report_line = f"gathered back on rank {root}: {text.brief(gathered, SHOWN)}"
        assert np.array_equal(gathered, np.arange(count)), "gather did not invert the scatter"
    else:
        report_line = "sent my piece to the root, hold nothing gathered"
    report.say(ctx, report_line)
    return piece, upiece, gathered


def section_compare(ctx, args):
    """Section 3: each way by hand once, counted (bytes, peak held), then timed, and the library's two
    ways timed. Returns (my results by way, wire bytes, slowest hand times, slowest library times)."""
    n, rank, root, big = ctx.world_size, ctx.rank, args.root, args.big
    show.compare_title(ctx, big)
    data = buffers.on_device(ctx, np.arange(big, dtype=np.float32)) if rank == root else None
    a, b = chunk_bounds(big, n)[rank]
    want = np.arange(a, b, dtype=np.float32)
    results = {}
    for name, way in (("bcast+slice", bcast_then_slice), ("scatter", scatter_by_hand)):
        meter, wire = PeakBytes(ctx), Wire(ctx)
        meter.start()  # one untimed, counted pass measures memory and bytes; tracing would slow the rest
        mine = way(ctx, wire, data, big, root, meter)
        wire.be.sync()  # nccl is asynchronous: wait before the host reads `mine`
        mine = buffers.to_host(mine)
        peak = meter.stop()
        err = float(np.max(np.abs(mine - want), initial=0)) if mine.size == want.size else float("inf")
        assert ctx.comm.allreduce(wire.sent) == ctx.comm.allreduce(wire.received), \
            f"{name}: the bytes sent and the bytes received by all ranks differ"
        secs = median_time(ctx, args.reps, lambda: way(ctx, Wire(ctx, wire.be), data, big, root, meter))
        results[name] = {"sent_B": wire.sent, "recv_B": wire.received, "peak_B": peak, "err": err,
                         "time_us": 1e6 * secs}
    library_us = {"bcast+slice": 1e6 * median_time(
                      ctx, args.reps, lambda: library_bcast_then_slice(ctx, data, big, root)),
                  "scatter": 1e6 * median_time(
                      ctx, args.reps, lambda: scatter_uneven(ctx, data, big, np.float32, root))}
    everyone = ctx.comm.allgather(results)  # one table, rank by rank, printed by rank 0
    wire_B = {m: sum(r[m]["recv_B"] for r in everyone) for m in results}
    hand_us = {m: max(r[m]["time_us"] for r in everyone) for m in results}  # ends when its last rank does
    lib_us = {m: max(ctx.comm.allgather(t)) for m, t in library_us.items()}
    show.compare(ctx, everyone, wire_B, hand_us, lib_us, args.reps)
    return results, wire_B, hand_us, lib_us


def flags():
    parser = bootstrap.lesson_parser(__file__, __doc__)
    parser.add_argument("--root", type=bootstrap.nonneg_int, default=0, help="the broadcasting rank")
    parser.add_argument("--count", type=bootstrap.nonneg_int, default=COUNT,
                        help="items in the broadcast and the uneven scatter")
    parser.add_argument("--chunk", type=bootstrap.nonneg_int, default=CHUNK,
                        help="items per rank in the equal scatter")
    parser.add_argument("--big", type=bootstrap.nonneg_int, default=BIG,
                        help="float32 items in the bytes/time comparison")
    parser.add_argument("--reps", type=bootstrap.nonneg_int, default=REPS, help="timed repetitions")
    return parser


def main():
    args, ctx = bootstrap.start(__file__, flags())
    n, root, c = ctx.world_size, args.root, args.chunk
    if root >= n:
        ctx.fail(f"--root {root} is not a rank: with {n} rank(s) the root must be 0..{n - 1}")
    if args.big < n or args.chunk < 1 or args.reps < 1:
        ctx.fail(f"--big must be at least the number of ranks ({n}); --chunk and --reps at least 1")
    ctx.params = {"root": root, "count": args.count, "chunk": c, "big": args.big, "reps": args.reps}

    got_a, got_b = section_broadcast(ctx, args)                        # 1. from two roots
    piece, upiece, gathered = section_scatter(ctx, args)               # 2. equal, uneven, and back
    results, wire_B, hand_us, lib_us = section_compare(ctx, args)      # 3. bcast+slice vs scatter

    bs, sc = results["bcast+slice"], results["scatter"]
    report.finish(ctx, {
        "bcast_a_sum": float(got_a.sum()), "bcast_b_sum": float(got_b.sum()),
        "scatter_sum": float(piece.sum()), "scatter_first": float(piece[0]) if c else -1.0,
        "scatterv_n": int(upiece.size), "scatterv_sum": float(upiece.sum()),
        "gather_wsum": float((np.arange(gathered.size) * gathered).sum()),
        "gather_n": int(gathered.size),
        "bcast_sent_B": bs["sent_B"], "bcast_recv_B": bs["recv_B"],
        "scatter_sent_B": sc["sent_B"], "scatter_recv_B": sc["recv_B"],
        "bcast_peak_B": bs["peak_B"], "scatter_peak_B": sc["peak_B"],
        "big_max_err": max(bs["err"], sc["err"]),
        "bcast_us": bs["time_us"], "scatter_us": sc["time_us"]},
        summary={"bcast_wire_B": wire_B["bcast+slice"], "scatter_wire_B": wire_B["scatter"],
                 "bcast_us_slowest": hand_us["bcast+slice"], "scatter_us_slowest": hand_us["scatter"],
                 "library_bcast_us_slowest": lib_us["bcast+slice"],
                 "library_scatter_us_slowest": lib_us["scatter"]})


if __name__ == "__main__":
    main()
