"""Lesson 01 — send and receive: a chain, a deadlock that happens every time, and three ways out.

What to watch for:
  1. a blocking send/recv chain 0 -> 1 -> ... -> N-1: each rank waits for its left neighbour, applies
     x = 2x + rank, and passes x on. Rank r ends with 2^(r+2) - r - 2.
  2. the deadlock: every rank sends to its right neighbour first, then receives from its left. A
     synchronous send (Ssend) finishes only when the matching receive has started, and no rank ever
     reaches its receive: it blocks at any size and any N >= 2. The lesson watches the sends with a
     deadline instead of hanging, reports where each rank is stuck, then posts the receives.
  3. why a plain Send "sometimes works": small messages may go eagerly (copied into a buffer at the
     receiver), large ones wait for the receiver (rendezvous). The lesson measures the largest
     head-to-head Send that completes with no receive posted: a setting of the MPI library and its
     transport, not a law. By the standard any Send may block until matched.
  4. three fixes for the ring, each verified and timed: an order of the blocking calls chosen by
     each rank's parity (the exercise, below), Sendrecv, and Isend/Irecv + Waitall. The parity
     fix first runs on a communicator that buffers nothing, so an order that only works thanks to
     eager buffering fails with a clear error, on any MPI and at any size.
  torch: dist.send is isend(...).wait(); whether gloo buffers is measured. NCCL: a send waits on the
  GPU for its receive; sends and receives that must progress together go in one group
  (groupStart/groupEnd, or batch_isend_irecv), or are ordered (the parity fix works on NCCL too).

Run it:
  make lesson-01 NP=4                       (or API=torch)
  .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py lessons/01_send_recv_deadlock.py --api mpi4py
Read next: lesson 02 (non-blocking calls). Beside this page: send_recv_deadlock/watch.py (the deadline
watchers, the communicator that buffers nothing) and send_recv_deadlock/show.py (what it prints).
"""
import os
import statistics
import sys
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import numpy as np  # noqa: E402

from common import bootstrap, report, timing  # noqa: E402
from lessons.send_recv_deadlock import show  # noqa: E402
from lessons.send_recv_deadlock.watch import InMpiWords, Unbuffered, deadlock, wait_until  # noqa: E402

COUNT = 1 << 16          # float64 values per message (512 KiB: above common default eager limits)
DEADLINE_S = 0.5         # an unmatched send this old, on every rank at once, is called a deadlock
PROBE_WAIT_S = 0.05      # how long the eager probe waits for one size to complete on its own
PROBE_MAX = 1 << 22      # largest message (bytes) the eager probe tries
REPEAT = 5               # timed runs of each fix; the median is reported
TAG = 11


def pattern(owner, count):
    """The values rank `owner` sends: distinct per rank, so a message from the wrong rank shows."""
    return owner * 1000.0 + np.arange(count, dtype=np.float64)


def parity_mpi(comm, buf, got, left, right):
    """Send `buf` to `right` with comm.Ssend and receive `got` from `left` with comm.Recv, in an order
    that cannot deadlock. (Ssend first on EVERY rank is section 2's deadlock: a cycle of waits.)"""
    # >>> exercise: parity_order
    if comm.rank % 2 == 0:
        comm.Ssend(buf, dest=right, tag=TAG)
        comm.Recv(got, source=left, tag=TAG)
    else:
        comm.Recv(got, source=left, tag=TAG)
        comm.Ssend(buf, dest=right, tag=TAG)
    # <<< exercise: parity_order


def torch_mods(ctx):
    import torch
    import torch.distributed as dist
    return torch, dist, ("cuda" if ctx.device == "gpu" else "cpu")


# ---------------------------------------------------------------- 1. the chain
def chain(ctx):
    """Rank r receives x from r-1, sets x = 2x + r, sends it to r+1. Returns my x."""
    n, r = ctx.world_size, ctx.rank
    if ctx.api == "torch":
        torch, dist, dev = torch_mods(ctx)
        x = torch.ones(1, dtype=torch.int64, device=dev)
        if r > 0:
            dist.recv(x, src=r - 1)          # blocks until rank r-1 has sent
        x = 2 * x + r
        if r < n - 1:
            dist.send(x, dst=r + 1)
        return int(x.item())
    if ctx.device == "gpu":
        import cupy
        from cupy.cuda import nccl
        stream = cupy.cuda.get_current_stream()
        x = cupy.ones(1, dtype=cupy.int64)
        if r > 0:
            ctx.nccl.recv(x.data.ptr, 1, nccl.NCCL_INT64, r - 1, stream.ptr)
        x = 2 * x + r                        # same stream: runs after the receive landed
        if r < n - 1:
            ctx.nccl.send(x.data.ptr, 1, nccl.NCCL_INT64, r + 1, stream.ptr)
        stream.synchronize()                 # nccl is async: wait before the host reads x
        return int(x.get()[0])
    x = np.ones(1, dtype=np.int64)
    if r > 0:
        ctx.comm.Recv(x, source=r - 1, tag=TAG)
    x = 2 * x + r
    if r < n - 1:
        ctx.comm.Send(x, dest=r + 1, tag=TAG)
    return int(x[0])


# ---------------------------------------------------------------- 2. the deadlock, watched
def deadlock_mpi(ctx, count, deadline):
    """Everyone Ssends right first. Returns (stuck, blocked-in text, message arrived, data ok)."""
    from mpi4py import MPI
    comm, n, r = ctx.comm, ctx.world_size, ctx.rank
    right, left = (r + 1) % n, (r - 1) % n
    buf, got = pattern(r, count), np.empty(count)
    # comm.Ssend(buf, dest=right) would block here forever; Issend is the same send with a handle
    req = comm.Issend(buf, dest=right, tag=TAG)
    stuck = not wait_until(req.Test, deadline)
    arrived = comm.Iprobe(source=left, tag=TAG)      # the left's message is announced, nobody takes it
    everyone = comm.allreduce(stuck, op=MPI.LAND)    # safe: the pending send is non-blocking
    where = (f"comm.Ssend(dest={right}) for {deadline:g} s, never reached comm.Recv(source={left})"
             if stuck else f"comm.Ssend(dest={right}) completed (unexpected for a synchronous send)")
    # MPI_Cancel of a send is deprecated (MPI-4) and unreliable; the clean way out is the receive
    # each rank would have reached, which matches its left neighbour's pending send
    comm.Recv(got, source=left, tag=TAG)
    req.Wait()
    return everyone, where, bool(arrived), bool(np.array_equal(got, pattern(left, count)))


def deadlock_torch(ctx, count, deadline):
    """The same head-to-head over gloo: dist.send is isend().wait(), so poll the isend instead."""
    torch, dist, _ = torch_mods(ctx)
    n, r = ctx.world_size, ctx.rank
    right, left = (r + 1) % n, (r - 1) % n
    # nccl would hang a GPU stream with no way back; the demo always runs over a gloo group
    group = dist.new_group(backend="gloo") if ctx.device == "gpu" else None
    buf, got = torch.from_numpy(pattern(r, count)), torch.empty(count, dtype=torch.float64)
    work = dist.isend(buf, dst=right, group=group, tag=TAG)   # what dist.send(buf, right) waits on
    stuck = not wait_until(work.is_completed, deadline)
    flags = ctx.comm.allgather(stuck)                         # over MPI: gloo is busy with our send
    where = (f"dist.send(dst={right}) for {deadline:g} s, never reached dist.recv(src={left})"
             if stuck else f"dist.send(dst={right}) returned: gloo buffered it without a receiver")
    dist.recv(got, src=left, group=group, tag=TAG)            # the way out: the receive
    work.wait()
    return all(flags), where, None, bool(np.array_equal(got.numpy(), pattern(left, count)))


# ---------------------------------------------------------------- 3. eager or rendezvous?
def eager_limit(ctx):
    """Largest size (bytes) for which a head-to-head plain send completes with no receive posted.

    Each size: start the send (Isend = Send with a handle), give it PROBE_WAIT_S, then post the
    receive so nothing is left pending. Stop at the first size that did not complete on every rank.
    """
    n, r = ctx.world_size, ctx.rank
    right, left = (r + 1) % n, (r - 1) % n
    sbuf, rbuf = np.zeros(PROBE_MAX, dtype=np.uint8), np.empty(PROBE_MAX, dtype=np.uint8)
    limit, size, tried = 0, 1, []
    if ctx.api == "torch":
        torch, dist, _ = torch_mods(ctx)
        group = dist.new_group(backend="gloo") if ctx.device == "gpu" else None
        sbuf, rbuf = torch.from_numpy(sbuf), torch.from_numpy(rbuf)
    while size <= PROBE_MAX:
        if ctx.api == "torch":
            work = dist.isend(sbuf[:size], dst=right, group=group, tag=TAG)
            done = wait_until(work.is_completed, PROBE_WAIT_S)
            dist.recv(rbuf[:size], src=left, group=group, tag=TAG)
            work.wait()
        else:
            req = ctx.comm.Isend(sbuf[:size], dest=right, tag=TAG)
            done = wait_until(req.Test, PROBE_WAIT_S)
            ctx.comm.Recv(rbuf[:size], source=left, tag=TAG)
            req.Wait()
        tried.append(size)
        if not all(ctx.comm.allgather(done)):
            return limit, size, tried
        limit, size = size, size * 2
    return limit, None, tried


# ---------------------------------------------------------------- 4. three fixes
def fixes_mpi(ctx):
    """name -> one ring exchange (send right, receive left) that cannot deadlock."""
    from mpi4py import MPI
    comm = ctx.comm

    def sendrecv(buf, got, left, right):
        comm.Sendrecv(buf, dest=right, sendtag=TAG, recvbuf=got, source=left, recvtag=TAG)

    def nonblocking(buf, got, left, right):
        reqs = [comm.Irecv(got, source=left, tag=TAG), comm.Issend(buf, dest=right, tag=TAG)]
        MPI.Request.Waitall(reqs)  # both are posted before either must finish

    return {"parity Ssend/Recv": lambda *a: parity_mpi(comm, *a),
            "Sendrecv": sendrecv, "Isend/Irecv+Waitall": nonblocking}


def parity_unbuffered(ctx, count, seconds):
    """The parity fix once on a communicator that buffers nothing: (the left's data arrived intact)."""
    n, r = ctx.world_size, ctx.rank
    got = np.full(count, -1.0)
    parity_mpi(Unbuffered(ctx.comm, seconds), pattern(r, count), got, (r - 1) % n, (r + 1) % n)
    return bool(np.array_equal(got, pattern((r - 1) % n, count)))


def fixes_nccl(ctx):
    import cupy
    from cupy.cuda import nccl
    comm, stream = ctx.nccl, cupy.cuda.get_current_stream()
    f64 = nccl.NCCL_FLOAT64

    in_mpi_words = InMpiWords(ctx.rank, ctx.world_size,
                              lambda buf, dest: comm.send(buf.data.ptr, buf.size, f64, dest, stream.ptr),
                              lambda got, src: comm.recv(got.data.ptr, got.size, f64, src, stream.ptr))

    def parity(buf, got, left, right):
        parity_mpi(in_mpi_words, buf, got, left, right)  # the exercise, on nccl's send and recv
        stream.synchronize()

    def grouped(buf, got, left, right):
        nccl.groupStart()  # in one group the send and the receive progress together: no order to get wrong
        comm.send(buf.data.ptr, buf.size, f64, right, stream.ptr)
        comm.recv(got.data.ptr, got.size, f64, left, stream.ptr)
        nccl.groupEnd()
        stream.synchronize()

    return {"parity send/recv": parity, "groupStart/send/recv/groupEnd": grouped}


def fixes_torch(ctx, seconds):
    torch, dist, _ = torch_mods(ctx)

    def waited(work, call):
        """dist.send / dist.recv are isend / irecv and a wait: on gloo, wait with a deadline, so a
        wrong order stops with the deadlock named instead of hanging until the runner's timeout."""
        try:
            work.wait(timeout=timedelta(seconds=seconds))
        except RuntimeError as exc:
            raise deadlock(ctx.rank, call, seconds) from exc

    if ctx.device == "gpu":  # nccl: the plain calls (a timed-out nccl wait leaves its stream behind)
        in_mpi_words = InMpiWords(ctx.rank, ctx.world_size, lambda buf, dest: dist.send(buf, dst=dest),
                                  lambda got, src: dist.recv(got, src=src))
    else:
        in_mpi_words = InMpiWords(
            ctx.rank, ctx.world_size,
            lambda buf, dest: waited(dist.isend(buf, dst=dest), f"dist.send(dst={dest})"),
            lambda got, src: waited(dist.irecv(got, src=src), f"dist.recv(src={src})"))

    def parity(buf, got, left, right):
        parity_mpi(in_mpi_words, buf, got, left, right)  # the exercise, on dist.send and dist.recv

    def batched(buf, got, left, right):
        ops = [dist.P2POp(dist.isend, buf, right), dist.P2POp(dist.irecv, got, left)]
        for work in dist.batch_isend_irecv(ops):  # on nccl: one group, both progress together
            work.wait()

    def nonblocking(buf, got, left, right):
        works = [dist.irecv(got, src=left), dist.isend(buf, dst=right)]
        for work in works:
            work.wait()

    fixes = {"parity send/recv": parity, "batch_isend_irecv": batched}
    # unbatched isend/irecv on nccl queue one after another on a stream: a ring's receive-first waits
    # for a send queued behind the left neighbour's own receive, so it would hang; gloo runs each
    # on its own, so it does not
    if ctx.device != "gpu":
        fixes["isend/irecv+wait"] = nonblocking
    return fixes


def run_fix(ctx, fix, count, repeat):
    """Run one fix `repeat` times; return (median seconds, data ok)."""
    n, r = ctx.world_size, ctx.rank
    right, left = (r + 1) % n, (r - 1) % n
    want = pattern(left, count)
    if ctx.api == "torch":
        torch, dist, dev = torch_mods(ctx)
        buf = torch.from_numpy(pattern(r, count)).to(dev)
        got = torch.full((count,), -1.0, dtype=torch.float64, device=dev)
        to_host = lambda t: t.cpu().numpy()  # noqa: E731
    elif ctx.device == "gpu":
        import cupy
        buf, got = cupy.asarray(pattern(r, count)), cupy.full(count, -1.0)
        to_host = cupy.asnumpy
    else:
        buf, got = pattern(r, count), np.full(count, -1.0)
        to_host = np.asarray
    sync = timing.syncer(ctx)  # a gpu call returns before its work is done: time the work, not the launch
    times = []
    for _ in range(repeat):
        ctx.comm.Barrier()
        t0 = timing.now(sync)
        fix(buf, got, left, right)
        times.append(timing.now(sync) - t0)
    return statistics.median(times), bool(np.array_equal(to_host(got), want))


def time_fixes(ctx, fixes, count, repeat):
    """Run every fix: ({name: the slowest rank's median seconds}, {name: ranks with wrong data}, all ok here)."""
    seconds, wrong, ok_all = {}, {}, True
    for name, fix in fixes.items():
        sec, ok = run_fix(ctx, fix, count, repeat)
        seconds[name] = max(ctx.comm.allgather(sec))
        wrong[name] = sum(not o for o in ctx.comm.allgather(ok))
        ok_all = ok_all and ok
    return seconds, wrong, ok_all


def flags():
    parser = bootstrap.lesson_parser(__file__, __doc__)
    parser.add_argument("--count", type=bootstrap.nonneg_int, default=COUNT,
                        help=f"float64 values per message (default {COUNT})")
    parser.add_argument("--deadline", type=float, default=DEADLINE_S,
                        help=f"seconds before an unmatched send counts as deadlocked (default {DEADLINE_S})")
    parser.add_argument("--repeat", type=bootstrap.nonneg_int, default=REPEAT,
                        help=f"timed runs of each fix (default {REPEAT})")
    return parser


def main():
    args, ctx = bootstrap.start(__file__, flags())
    n, count = ctx.world_size, args.count
    if n < 2:
        ctx.fail("needs at least 2 ranks: point-to-point needs a partner (try -n 2)")
    if not 0 < args.deadline <= 60 or args.repeat < 1:
        ctx.fail("--deadline must be in (0, 60] seconds and --repeat at least 1")
    ctx.params = {"count": count, "deadline_s": args.deadline}

    report.section(ctx, "1. a blocking chain 0 -> 1 -> ... : each rank sets x = 2x + rank, passes it on")
    x = chain(ctx)
    report.say(ctx, f"x = {x}   (closed form 2^(r+2) - r - 2 = {2 ** (ctx.rank + 2) - ctx.rank - 2})")

    show.head_to_head(ctx, count)                                      # 2. every rank sends first
    watched = deadlock_torch if ctx.api == "torch" else deadlock_mpi
    stuck_all, where, arrived, rescued = watched(ctx, count, args.deadline)
    show.deadlock(ctx, stuck_all, where, arrived, ctx.comm.allreduce(rescued) == n)

    show.eager_title(ctx)                                              # 3. eager or rendezvous
    limit, first_blocked, tried = eager_limit(ctx)
    show.eager(ctx, limit, first_blocked, tried)                       # and the setting behind it

    report.section(ctx, f"4. three fixes for the ring (send right, receive left), {count} x float64, "
                        f"median of {args.repeat}")
    unbuffered_ok = None
    if ctx.api == "mpi4py" and ctx.device == "cpu":                    # the exercise, no buffering
        unbuffered_ok = parity_unbuffered(ctx, count, max(2.0, 10 * args.deadline))
        show.unbuffered(ctx, unbuffered_ok)
    fixes = (fixes_torch(ctx, max(2.0, 10 * args.deadline)) if ctx.api == "torch" else
             fixes_nccl(ctx) if ctx.device == "gpu" else fixes_mpi(ctx))
    seconds, wrong, ok_all = time_fixes(ctx, fixes, count, args.repeat)
    show.fixes(ctx, count, seconds, wrong)                             # the table, and ratios

    report.finish(ctx, {"chain_value": x, "deadlock_detected": bool(stuck_all),
                        "rescued_ok": rescued, "fixes_ok": ok_all, "fixes_run": len(fixes),
                        "parity_unbuffered_ok": unbuffered_ok},
                  summary={"eager_limit_B": limit, "eager_first_blocked_B": first_blocked,
                           **{f"fix_time_us[{k}]": round(v * 1e6, 1) for k, v in seconds.items()}})


if __name__ == "__main__":
    main()
