"""Lesson 01 — send and receive: a chain, a deadlock that happens every time, and three ways out.

What to watch for:
  1. a blocking send/recv chain 0 -> 1 -> ... -> N-1: each rank waits for its left neighbour, applies
     x = 2x + rank, and passes x on. Rank r ends with 2^(r+2) - r - 2.
  2. the deadlock: every rank sends to its right neighbour first, then receives from its left. With a
     synchronous send (Ssend) a send finishes only when the matching receive has started, and no rank
     ever reaches its receive: it blocks at any size and any N >= 2. The lesson watches the sends with a
     deadline instead of hanging, reports the call each rank is stuck in, then breaks the cycle by
     posting the receives.
  3. why a plain Send "sometimes works": small messages may go eagerly (copied into a buffer at the
     receiver), large ones wait for the receiver (rendezvous). The lesson measures, live, the largest
     message a head-to-head Send completes with no receive posted. That limit is a setting of the
     MPI library and its transport, not a law; by the standard any Send may block until matched, so
     a program that relies on buffering is wrong.
  4. three fixes for the ring, each verified and timed: order by rank parity (even ranks send first,
     odd ranks receive first), Sendrecv, and Isend/Irecv + Waitall. Odd N works too. The parity
     fix (the exercise) is first run on a communicator that buffers nothing, as the standard allows:
     every Send waits for its receive, so an order that only works thanks to eager buffering fails
     here with a clear error, on any MPI and at any size.
  torch: the same head-to-head exchange with dist.isend (dist.send is isend(...).wait()); whether
  gloo buffers is measured. NCCL: a send waits on the GPU for its receive; sends and receives that
  must progress together go in one group (groupStart/groupEnd, or batch_isend_irecv), or are
  ordered so that every send meets a posted receive (the parity fix works on NCCL too).

Run it:
  make lesson-01 NP=4                       (or API=torch)
  .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py lessons/01_send_recv_deadlock.py --api mpi4py
"""
import os
import statistics
import sys
import textwrap
import time
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import numpy as np  # noqa: E402

from common import bootstrap, mpilib, report, timing  # noqa: E402

COUNT = 1 << 16          # float64 values per message (512 KiB: above common default eager limits)
DEADLINE_S = 0.5         # an unmatched send this old, on every rank at once, is called a deadlock
PROBE_WAIT_S = 0.05      # how long the eager probe waits for one size to complete on its own
PROBE_MAX = 1 << 22      # largest message (bytes) the eager probe tries
REPEAT = 5               # timed runs of each fix; the median is reported
TAG = 11


def pattern(owner, count):
    """The values rank `owner` sends: distinct per rank, so a message from the wrong rank shows."""
    return owner * 1000.0 + np.arange(count, dtype=np.float64)


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
def wait_until(done, seconds):
    """Poll done() until it is true or the deadline passes; True if it completed."""
    left = timing.deadline(seconds)
    while left() > 0:
        if done():
            return True
        time.sleep(0.002)  # yield the core: on a loaded machine the peers need it
    return bool(done())


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


def _land():
    from mpi4py import MPI
    return MPI.LAND


def eager_setting(lib):
    """What sets the measured limit, on the library that ran (common/mpilib names it): lowering each
    one-node setting named here lowered the limit with it."""
    if lib.kind == "mpich":
        return ("on one node MPICH's shared-memory settings, such as MPIR_CVAR_CH4_IPC_CMA_P2P_THRESHOLD: "
                "above it the receiver copies the message out of the sender's memory, so the send waits "
                "for it; between nodes, its network's (UCX_RNDV_THRESH with ch4:ucx)")
    if lib.kind == "openmpi":
        return ("on one node Open MPI's btl_sm_eager_limit, its shared-memory transport's, header included "
                "(`ompi_info --param btl sm --level 4`); between nodes, its network transport's")
    return "each MPI library and transport has its own"


# ---------------------------------------------------------------- 4. three fixes
def deadlock(rank, call, seconds):
    """The error a blocking call that waited `seconds` for its partner stops the run with."""
    return RuntimeError(
        f"deadlock: rank {rank}'s {call} waited {seconds:g} s for a matching call that never came. "
        "A send may wait for its receive (MPI may, gloo does): did every rank send first (or receive "
        "first), or do the partners not match?")


class Unbuffered:
    """A communicator that buffers nothing, as the MPI standard allows: Send behaves as Ssend (it
    returns once its receive has started), whatever the size. Each blocking call waits with a
    deadline, so a cycle of waits stops every rank with one clear error instead of hanging."""

    def __init__(self, comm, seconds):
        self.comm, self.seconds = comm, seconds
        self.rank, self.size = comm.rank, comm.size

    def __getattr__(self, name):  # anything else (Sendrecv, Get_rank, Isend ...) is the real call
        return getattr(self.comm, name)

    def _wait(self, req, call):
        if not wait_until(req.Test, self.seconds):
            raise deadlock(self.rank, call, self.seconds)

    def Send(self, buf, dest, tag=0):
        self._wait(self.comm.Issend(buf, dest=dest, tag=tag), f"Send(dest={dest})")

    Ssend = Send

    def Recv(self, buf, source, tag=0, status=None):
        self._wait(self.comm.Irecv(buf, source=source, tag=tag), f"Recv(source={source})")


class InMpiWords:
    """Another library's blocking send and receive under MPI's names, so the NCCL and torch paths
    run the exercise's own parity_mpi: the parity logic is written once, in the exercise."""

    def __init__(self, rank, size, send, recv):
        self.rank, self.size, self._send, self._recv = rank, size, send, recv

    def Ssend(self, buf, dest, tag=0):
        self._send(buf, dest)

    Send = Ssend

    def Recv(self, buf, source, tag=0, status=None):
        self._recv(buf, source)


def parity_mpi(comm, buf, got, left, right):
    """Even ranks send then receive, odd ranks receive then send: every Ssend meets a Recv."""
    # >>> exercise: parity_order
    if comm.rank % 2 == 0:
        comm.Ssend(buf, dest=right, tag=TAG)
        comm.Recv(got, source=left, tag=TAG)
    else:
        comm.Recv(got, source=left, tag=TAG)
        comm.Ssend(buf, dest=right, tag=TAG)
    # <<< exercise: parity_order


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


def main():
    parser = bootstrap.lesson_parser(__file__, __doc__)
    parser.add_argument("--count", type=bootstrap.nonneg_int, default=COUNT,
                        help=f"float64 values per message (default {COUNT})")
    parser.add_argument("--deadline", type=float, default=DEADLINE_S,
                        help=f"seconds before an unmatched send counts as deadlocked (default {DEADLINE_S})")
    parser.add_argument("--repeat", type=bootstrap.nonneg_int, default=REPEAT,
                        help=f"timed runs of each fix (default {REPEAT})")
    args, ctx = bootstrap.start(__file__, parser)
    n, count = ctx.world_size, args.count
    if n < 2:
        ctx.fail("needs at least 2 ranks: point-to-point needs a partner (try -n 2)")
    if not 0 < args.deadline <= 60 or args.repeat < 1:
        ctx.fail("--deadline must be in (0, 60] seconds and --repeat at least 1")
    ctx.params = {"count": count, "deadline_s": args.deadline}

    report.section(ctx, "1. a blocking chain 0 -> 1 -> ... : each rank sets x = 2x + rank, passes it on")
    x = chain(ctx)
    report.say(ctx, f"x = {x}   (closed form 2^(r+2) - r - 2 = {2 ** (ctx.rank + 2) - ctx.rank - 2})")

    report.section(ctx, f"2. head-to-head: every rank sends {count * 8} B right first, then receives")
    if ctx.rank == 0:
        print("the send: " + ("dist.send, which is dist.isend(...).wait(); watched with is_completed()"
                              if ctx.api == "torch" else
                              "comm.Ssend, synchronous: it returns once the matching receive has started"),
              flush=True)
        if ctx.transport == "nccl":
            print("nccl: a send waits on the GPU for its receive, so this would hang the stream with no "
                  "way back;\nthe demo runs " + ("over a gloo group" if ctx.api == "torch" else
                                                  "over MPI on host buffers"), flush=True)
    if ctx.api == "torch":
        stuck_all, where, arrived, rescued = deadlock_torch(ctx, count, args.deadline)
    else:
        stuck_all, where, arrived, rescued = deadlock_mpi(ctx, count, args.deadline)
    report.say(ctx, f"blocked in {where}" + ("" if arrived is None else
                    f"\n  the left's message is announced (Iprobe): {arrived}"))
    if ctx.rank == 0:
        print("DEADLOCK DETECTED: no rank can proceed, every send waits for a receive nobody posts"
              if stuck_all else "no deadlock: the sends completed without receivers (buffered)")
        print("way out: each rank posts the receive it never reached; data received intact: "
              + ("yes" if ctx.comm.allreduce(rescued) == n else "NO"), flush=True)
    else:
        ctx.comm.allreduce(rescued)

    where = "a gloo group" if ctx.api == "torch" else "MPI, host buffers"
    report.section(ctx, "3. eager or rendezvous: largest head-to-head plain send that completes alone"
                   + (f"\n   (over {where})" if ctx.transport == "nccl" else ""))
    limit, first_blocked, tried = eager_limit(ctx)
    if ctx.rank == 0:
        lib = "gloo" if ctx.api == "torch" else mpilib.current().name
        if limit == 0:
            print(f"{lib}: even a {first_blocked} B send waited for its receive: no send was buffered")
        else:
            print(f"{lib}: sends up to {limit} B completed with no receive posted;\n  "
                  + (f"{first_blocked} B waited for the receiver" if first_blocked else
                     f"every size up to {tried[-1]} B did"))
        if ctx.api == "mpi4py":
            print(textwrap.fill(f"that limit is a setting, not a law: {eager_setting(mpilib.current())}. "
                                "The standard lets any Send wait until it is matched, and calls a program "
                                "that needs buffering to finish unsafe", 100), flush=True)
        if not ctx.single_node:  # the ring's sends within a node and between nodes take two transports
            print("on several nodes the ring's sends cross two transports, shared memory within a node "
                  "and the\nnetwork between nodes, each with limits of its own: the sizes above are where "
                  "every\nsend of the ring completed at once", flush=True)

    report.section(ctx, f"4. three fixes for the ring (send right, receive left), {count} x float64, "
                        f"median of {args.repeat}")
    unbuffered_ok = None
    if ctx.api == "mpi4py" and ctx.device == "cpu":
        seconds = max(2.0, 10 * args.deadline)
        unbuffered_ok = parity_unbuffered(ctx, count, seconds)
        everyone = ctx.comm.allreduce(unbuffered_ok, op=_land())
        if ctx.rank == 0:
            print("the parity fix on a communicator that buffers nothing (every Send waits for its "
                  "receive):\ncompleted, the left's data intact on every rank: "
                  + ("yes" if everyone else "NO"),
                  flush=True)
    fixes = (fixes_torch(ctx, max(2.0, 10 * args.deadline)) if ctx.api == "torch" else
             fixes_nccl(ctx) if ctx.device == "gpu" else fixes_mpi(ctx))
    rows, ok_all, results = [], True, {}
    for name, fix in fixes.items():
        sec, ok = run_fix(ctx, fix, count, args.repeat)
        secs = ctx.comm.allgather(sec)
        oks = ctx.comm.allgather(ok)
        ok_all = ok_all and ok
        results[name] = max(secs)
        rows.append([name, count * 8, count, "float64", round(max(secs) * 1e6, 1),
                     round(count * 8 / max(secs) / 1e9, 3) if max(secs) > 0 else 0.0,
                     sum(not o for o in oks)])
    if ctx.rank == 0:
        print(report.table(["fix", "size B", "count", "type", "time us", "algbw GB/s", "#wrong"], rows))
        fastest = min(results, key=results.get)
        print("ratios to the fastest:", ", ".join(f"{k} {v / results[fastest]:.2f}x"
                                                 for k, v in results.items()), flush=True)
        print("(timings are noisy on a shared machine; the data check is what matters)", flush=True)

    report.finish(ctx, {"chain_value": x, "deadlock_detected": bool(stuck_all),
                        "rescued_ok": rescued, "fixes_ok": ok_all, "fixes_run": len(fixes),
                        "parity_unbuffered_ok": unbuffered_ok},
                  summary={"eager_limit_B": limit, "eager_first_blocked_B": first_blocked,
                           **{f"fix_time_us[{k}]": round(v * 1e6, 1) for k, v in results.items()}})


if __name__ == "__main__":
    main()
