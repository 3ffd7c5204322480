"""Lesson 02 — non-blocking exchange: a halo exchange, its two hazards, and the truth about overlap.

What to watch for:
  1. a halo (ghost cell) exchange on a ring of ranks: each rank owns LOCAL cells of a global line and
     keeps HALO copies of each neighbour's edge. All four transfers are posted (Irecv, Isend), then one
     Waitall. The ghost values are checked against the global index they must hold.
  2. the two hazards of a posted request: the receive buffer is not valid before the wait (the lesson
     reads it early and sees the old contents), and the send buffer must not be written before the
     wait (the lesson overwrites it and shows what the receiver got: undefined by the standard).
  3. overlap, measured: exchange a large message (rendezvous) and compute, four ways:
       (a) blocking exchange, then compute
       (b) post, compute, wait
       (c) post, compute in slices with Test between slices
       (d) (b) again in a second run with MPICH's progress thread (MPIR_CVAR_ASYNC_PROGRESS=1)
     overlap = (comm + compute - time) / min(comm, compute): 0 means none, 1 means all hidden.
     Posting a request does not move the data: with MPI, a large message moves only while some rank
     is inside an MPI call (progress). (c) gives it those calls; (d) gives it a thread. torch's gloo
     runs p2p on its own threads. On a GPU, NCCL runs on its own stream and copy engines, so compute
     on another stream overlaps it; the lesson measures that on GPU paths.

Run it:
  make lesson-02 NP=4                       (or API=torch)
  .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py lessons/02_isend_irecv.py --api mpi4py
"""
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import numpy as np  # noqa: E402

from common import bootstrap, report  # noqa: E402

LOCAL = 1000             # cells each rank owns
HALO = 4                 # ghost cells on each side
BIG = 1 << 19            # float64 values in the overlap message (4 MiB: rendezvous on any MPI)
REPEAT = 5               # timed runs of each overlap mode; the median is reported
SLICE = 1 << 15          # float64 values one compute slice works on
TO_LEFT, TO_RIGHT = 21, 22  # tags: with 2 ranks the left and right neighbour are the same rank


def torch_mods(ctx):
    import torch
    import torch.distributed as dist
    return torch, dist


# ---------------------------------------------------------------- 1. halo exchange
def halo_mpi(comm, u, left, right):
    """Fill u[:HALO] from the left neighbour's edge and u[-HALO:] from the right one's."""
    from mpi4py import MPI
    # >>> exercise: halo_exchange
    reqs = [comm.Irecv(u[:HALO], source=left, tag=TO_RIGHT),
            comm.Irecv(u[-HALO:], source=right, tag=TO_LEFT),
            comm.Isend(u[HALO:2 * HALO], dest=left, tag=TO_LEFT),
            comm.Isend(u[-2 * HALO:-HALO], dest=right, tag=TO_RIGHT)]
    MPI.Request.Waitall(reqs)  # only now may u's ghosts be read, or its edges written
    # <<< exercise: halo_exchange


def halo_nccl(ctx, u, left, right):
    import cupy
    from cupy.cuda import nccl
    comm, stream, f64 = ctx.nccl, cupy.cuda.get_current_stream(), nccl.NCCL_FLOAT64
    # nccl has no tags: the k-th send to a peer meets that peer's k-th receive from us, so with 2
    # ranks (left == right) receive in the order the peer sends: its to-left first
    nccl.groupStart()
    comm.send(u[HALO:2 * HALO].data.ptr, HALO, f64, left, stream.ptr)
    comm.send(u[-2 * HALO:-HALO].data.ptr, HALO, f64, right, stream.ptr)
    comm.recv(u[-HALO:].data.ptr, HALO, f64, right, stream.ptr)
    comm.recv(u[:HALO].data.ptr, HALO, f64, left, stream.ptr)
    nccl.groupEnd()
    stream.synchronize()  # nccl is async: wait before the host reads the ghosts


def halo_torch(u, left, right):
    _, dist = torch_mods(None)
    ops = [dist.P2POp(dist.isend, u[HALO:2 * HALO], left, tag=TO_LEFT),       # same order as nccl
           dist.P2POp(dist.isend, u[-2 * HALO:-HALO], right, tag=TO_RIGHT),
           dist.P2POp(dist.irecv, u[-HALO:], right, tag=TO_LEFT),
           dist.P2POp(dist.irecv, u[:HALO], left, tag=TO_RIGHT)]
    for work in dist.batch_isend_irecv(ops):  # one nccl group on GPU; plain isend/irecv on gloo
        work.wait()


def halo(ctx):
    """My line with ghosts: interior = global indices; returns (left ghosts, right ghosts) on host."""
    n, r = ctx.world_size, ctx.rank
    left, right = (r - 1) % n, (r + 1) % n
    u = np.full(LOCAL + 2 * HALO, -1.0)
    u[HALO:-HALO] = r * LOCAL + np.arange(LOCAL)
    if ctx.api == "torch":
        torch, _ = torch_mods(ctx)
        t = torch.from_numpy(u).to("cuda" if ctx.device == "gpu" else "cpu")
        halo_torch(t, left, right)
        u = t.cpu().numpy()
    elif ctx.device == "gpu":
        import cupy
        g = cupy.asarray(u)
        halo_nccl(ctx, g, left, right)
        u = cupy.asnumpy(g)
    else:
        halo_mpi(ctx.comm, u, left, right)
    return u[:HALO], u[-HALO:]


# ---------------------------------------------------------------- 2. hazards (host buffers)
def hazards(ctx, count):
    """(value read before the wait, value after it, what the receiver got after the sender
    overwrote its posted send buffer: 'new' or 'old')."""
    comm, n, r = ctx.comm, ctx.world_size, ctx.rank
    left, right = (r - 1) % n, (r + 1) % n
    got = np.full(count, -1.0)
    if ctx.api == "torch":
        torch, dist = torch_mods(ctx)
        group = dist.new_group(backend="gloo") if ctx.device == "gpu" else None
        got_t = torch.from_numpy(got)
        recv = dist.irecv(got_t, src=left, group=group, tag=TO_RIGHT)
        early = float(got[0])                    # hazard 1: read before recv.wait()
        comm.Barrier()                           # nobody sends before every rank has peeked
        dist.send(torch.full((count,), float(r), dtype=torch.float64), dst=right, group=group, tag=TO_RIGHT)
        recv.wait()
        after = float(got[0])
        buf = torch.full((count,), 1.0, dtype=torch.float64)
        send = dist.isend(buf, dst=right, group=group, tag=TO_LEFT)
        buf.fill_(2.0)                           # hazard 2: written before send.wait()
        comm.Barrier()
        dist.recv(got_t, src=left, group=group, tag=TO_LEFT)
        send.wait()
    else:
        from mpi4py import MPI
        req = comm.Irecv(got, source=left, tag=TO_RIGHT)
        early = float(got[0])                    # hazard 1: read before req.Wait()
        comm.Barrier()                           # nobody sends before every rank has peeked
        comm.Send(np.full(count, float(r)), dest=right, tag=TO_RIGHT)
        req.Wait()
        after = float(got[0])
        buf = np.full(count, 1.0)
        req = comm.Isend(buf, dest=right, tag=TO_LEFT)
        buf[:] = 2.0                             # hazard 2: written before req.Wait()
        comm.Barrier()
        MPI.Request.Waitall([comm.Irecv(got, source=left, tag=TO_LEFT), req])
    seen = {1.0: "old", 2.0: "new"}.get(float(got[0]), "mixed")
    if seen != "mixed" and not np.all(got == got[0]):
        seen = "mixed"
    return early, after, seen


# ---------------------------------------------------------------- 3. overlap
def backend_cpu_mpi(ctx, count):
    """post / wait / test / compute / sync for a ring exchange of `count` float64 over MPI."""
    from mpi4py import MPI
    comm, n, r = ctx.comm, ctx.world_size, ctx.rank
    sbuf, rbuf, work = np.ones(count), np.empty(count), np.ones(SLICE)
    post = lambda: [comm.Irecv(rbuf, source=(r - 1) % n), comm.Isend(sbuf, dest=(r + 1) % n)]  # noqa
    return dict(post=post, wait=MPI.Request.Waitall, test=MPI.Request.Testall,
                compute=lambda k: [np.sin(work, out=work) for _ in range(k)], sync=lambda: None)


def backend_torch(ctx, count):
    torch, dist = torch_mods(ctx)
    n, r = ctx.world_size, ctx.rank
    gpu = ctx.device == "gpu"
    dev = "cuda" if gpu else "cpu"
    sbuf, rbuf = torch.ones(count, dtype=torch.float64, device=dev), torch.empty(count, dtype=torch.float64, device=dev)
    if gpu:
        a = torch.ones(1024, 1024, device=dev)
        c = torch.empty_like(a)
        compute = lambda k: [torch.matmul(a, a, out=c) for _ in range(k)]  # noqa: E731
        sync = torch.cuda.synchronize
    else:
        work = torch.ones(SLICE, dtype=torch.float64)
        compute = lambda k: [torch.sin(work, out=work) for _ in range(k)]  # noqa: E731
        sync = lambda: None  # noqa: E731

    def post():
        return dist.batch_isend_irecv([dist.P2POp(dist.isend, sbuf, (r + 1) % n),
                                       dist.P2POp(dist.irecv, rbuf, (r - 1) % n)])

    def wait(works):
        for w in works:
            w.wait()
        sync()  # on nccl, wait() only orders the streams: the host syncs here

    return dict(post=post, wait=wait, test=lambda works: all(w.is_completed() for w in works),
                compute=compute, sync=sync)


def backend_nccl(ctx, count):
    import cupy
    from cupy.cuda import nccl
    n, r, comm = ctx.world_size, ctx.rank, ctx.nccl
    comm_stream = cupy.cuda.Stream(non_blocking=True)   # nccl gets its own stream
    sbuf, rbuf = cupy.ones(count), cupy.empty(count)
    a = cupy.ones((1024, 1024), dtype=cupy.float32)
    c = cupy.empty_like(a)

    def post():
        nccl.groupStart()
        comm.send(sbuf.data.ptr, count, nccl.NCCL_FLOAT64, (r + 1) % n, comm_stream.ptr)
        comm.recv(rbuf.data.ptr, count, nccl.NCCL_FLOAT64, (r - 1) % n, comm_stream.ptr)
        nccl.groupEnd()
        return comm_stream

    def compute(k):
        for _ in range(k):
            cupy.matmul(a, a, out=c)  # on the current (default) stream, not comm_stream

    sync = cupy.cuda.get_current_stream().synchronize
    return dict(post=post, wait=lambda s: s.synchronize(), test=lambda s: s.done,
                compute=compute, sync=sync)


def sliced(b, slices):
    works = b["post"]()
    for _ in range(slices):
        b["compute"](1)
        b["test"](works)     # each Test lets the library move the message a little further
    b["wait"](works)


MODES = {  # name -> what one timed run does
    "comm only": lambda b, k: b["wait"](b["post"]()),
    "compute only": lambda b, k: b["compute"](k),
    "(a) blocking, then compute": lambda b, k: (b["wait"](b["post"]()), b["compute"](k)),
    "(b) post, compute, wait": lambda b, k: (lambda w: (b["compute"](k), b["wait"](w)))(b["post"]()),
    "(c) post, compute + Test per slice": sliced,
}


def timed(ctx, b, mode, slices, repeat):
    """Median over `repeat` runs of the slowest rank's time for one mode."""
    from mpi4py import MPI
    times = []
    for _ in range(repeat):
        ctx.comm.Barrier()
        t0 = time.perf_counter()
        MODES[mode](b, slices)
        b["sync"]()
        times.append(ctx.comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    return statistics.median(times)


def measure_overlap(ctx, count, repeat, modes):
    """{mode: seconds} with the compute calibrated to last about as long as the exchange."""
    from mpi4py import MPI
    b = (backend_torch(ctx, count) if ctx.api == "torch" else
         backend_nccl(ctx, count) if ctx.device == "gpu" else backend_cpu_mpi(ctx, count))
    MODES["comm only"](b, 0)  # warm-up: connections, registration
    t_comm = timed(ctx, b, "comm only", 0, repeat)
    t_slice = timed(ctx, b, "compute only", 10, repeat) / 10  # ten slices: less timer noise
    slices = ctx.comm.allreduce(int(min(2000, max(1, round(t_comm / max(t_slice, 1e-7))))), op=MPI.MAX)
    out = {"comm only": t_comm, "compute only": timed(ctx, b, "compute only", slices, repeat)}
    for mode in modes:
        out[mode] = timed(ctx, b, mode, slices, repeat)
    return out, slices


def overlap_of(t, t_comm, t_comp):
    """Share of the shorter part hidden behind the longer: 0 none, 1 all."""
    return (t_comm + t_comp - t) / min(t_comm, t_comp)


def async_progress_run(ctx, args):
    """Mode (d): rerun (b) in a fresh MPICH job with its progress thread on. Rank 0 launches it;
    the other ranks wait without spinning. Returns {mode: seconds} or a reason it was not run."""
    from mpi4py import MPI
    reason, result = None, None
    if ctx.rank == 0:
        launcher = shutil.which("mpiexec", path=os.path.dirname(sys.executable))
        if args.async_progress == "skip":
            reason = "skipped (--async-progress skip)"
        elif "MPICH" not in MPI.Get_library_version():
            reason = "not MPICH: MPIR_CVAR_ASYNC_PROGRESS does not apply"
        elif not launcher:
            reason = "no mpiexec beside this python"
        else:
            result, reason = launch_async_child(ctx, args, launcher)
    done = MPI.COMM_WORLD.Ibarrier()
    while not done.Test():
        time.sleep(0.01)  # leave the cores to the child job
    return ctx.comm.bcast((result, reason), root=0)


def launch_async_child(ctx, args, launcher):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "MPIR_", "MPICH_", "TUTOR_"))}
    env["MPIR_CVAR_ASYNC_PROGRESS"] = "1"  # a progress thread per rank, started at MPI_Init
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "overlap.json")
        cmd = [launcher, "-n", str(ctx.world_size), sys.executable, "-m", "mpi4py", os.path.abspath(__file__),
               "--api", "mpi4py", "--device", "cpu", "--big", str(args.big), "--repeat", str(args.repeat),
               "--overlap-only", out]
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            return None, "the async-progress run took over 60 s and was stopped"
        if proc.returncode != 0 or not os.path.exists(out):
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            return None, f"the async-progress run failed: {last}"
        with open(out) as f:
            return json.load(f), None


def main():
    parser = bootstrap.lesson_parser(__file__, __doc__)
    parser.add_argument("--big", type=bootstrap.nonneg_int, default=BIG,
                        help=f"float64 values in the overlap message (default {BIG})")
    parser.add_argument("--repeat", type=bootstrap.nonneg_int, default=REPEAT,
                        help=f"timed runs of each overlap mode (default {REPEAT})")
    parser.add_argument("--async-progress", choices=["run", "skip"], default="run",
                        help="mode (d): rerun (b) in a second MPICH job with a progress thread")
    parser.add_argument("--overlap-only", metavar="PATH", help=argparse_hidden())
    args, ctx = bootstrap.start(__file__, parser)
    n = ctx.world_size
    if n < 2:
        ctx.fail("needs at least 2 ranks: a neighbour exchange needs neighbours (try -n 2)")
    if args.big < 1 or args.repeat < 1:
        ctx.fail("--big and --repeat must be at least 1")
    if args.overlap_only:  # the child job of mode (d): only (b), results to a file
        times, slices = measure_overlap(ctx, args.big, args.repeat, ["(b) post, compute, wait"])
        if ctx.rank == 0:
            report.write_json(args.overlap_only, {"times": times, "slices": slices})
        report.finish(ctx, {})
        return
    ctx.params = {"local": LOCAL, "halo": HALO, "big": args.big}

    report.section(ctx, f"1. halo exchange on a ring: {LOCAL} cells per rank, {HALO} ghosts a side")
    gl, gr = halo(ctx)
    report.say(ctx, f"left ghosts {gl.astype(int).tolist()}  right ghosts {gr.astype(int).tolist()}")

    report.section(ctx, f"2. hazards, on host buffers of {args.big * 8} B")
    early, after, seen = hazards(ctx, args.big)
    report.say(ctx, f"receive buffer read before the wait: {early:g} (stale); after: {after:g} "
                    f"(the left rank's id); overwritten send buffer arrived as: {seen}")
    if ctx.rank == 0:
        print("the receiver saw the sender's late write ('new') or not ('old'): the standard leaves it "
              "undefined,\nso never touch a posted send buffer, nor read a posted receive buffer, "
              "before the wait", flush=True)

    modes = [m for m in MODES if m.startswith("(")]
    report.section(ctx, f"3. overlap: exchange {args.big * 8} B with each neighbour while computing, "
                        f"median of {args.repeat}")
    times, slices = measure_overlap(ctx, args.big, args.repeat, modes)
    d_reason = "n/a: gloo already runs p2p on its own threads" if ctx.api == "torch" else \
        "n/a: on GPU, NCCL progresses on its own stream" if ctx.device == "gpu" else None
    d_ref = None
    if d_reason is None:
        child, d_reason = async_progress_run(ctx, args)
        if child:
            # the child's own comm/compute times: its progress thread changes both
            ct = child["times"]
            times["(d) (b) with MPICH async progress"] = ct["(b) post, compute, wait"]
            d_ref = (ct["comm only"], ct["compute only"])
    t_comm, t_comp = times["comm only"], times["compute only"]
    rows, overlap = [], {}
    for mode, t in times.items():
        ref = d_ref if mode.startswith("(d)") else (t_comm, t_comp)
        ov = overlap_of(t, *ref) if mode.startswith("(") else None
        overlap[mode[:3]] = ov
        rows.append([mode, round(t * 1e6, 1), "" if ov is None else f"{ov:+.2f}"])
    if ctx.rank == 0:
        print(f"compute = {slices} slices, calibrated to last about as long as the exchange")
        print(report.table(["mode", "time us", "overlap"], rows, align=[False, True, True]))
        if d_reason:
            print(f"(d) {d_reason}")
        else:
            print(f"(d)'s overlap is against that job's own comm only {d_ref[0] * 1e6:.1f} us and compute "
                  f"only {d_ref[1] * 1e6:.1f} us:\n    compare its time with (b)'s too")
        print("overlap = (comm + compute - time) / min(comm, compute); below about 0.2 is noise, not overlap.\n"
              "posting Isend/Irecv does not move a rendezvous message: MPI moves it only inside MPI calls\n"
              "(c's Test, the final Wait) or on a progress thread (d). on a loaded 2-core machine a\n"
              "progress thread competes with the compute for a core, so (d) may not help here.", flush=True)

    report.finish(ctx, {"ghost_left_first": float(gl[0]), "ghost_left_sum": float(gl.sum()),
                        "ghost_right_first": float(gr[0]), "ghost_right_sum": float(gr.sum()),
                        "early_read": early, "after_wait": after, "overwritten_send_seen": seen},
                  summary={"compute_slices": slices, "async_progress": d_reason or "run",
                           **{f"time_us{k}": round(t * 1e6, 1) for k, t in times.items()},
                           **{f"overlap{k}": v for k, v in overlap.items() if v is not None}})


def argparse_hidden():
    import argparse
    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
