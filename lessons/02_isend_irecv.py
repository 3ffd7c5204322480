"""Lesson 02 — non-blocking exchange: a halo exchange, its two hazards, and the truth about overlap.

What to watch for:
  1. a halo (ghost cell) exchange on a ring of ranks: each rank owns LOCAL cells of a global line and
     keeps HALO copies of each neighbour's edge. All four transfers are posted (Irecv, Isend), then one
     Waitall. The ghost values are checked against the global index they must hold.
  2. the two hazards of a posted request: a receive buffer is undefined until the wait (the lesson
     reads it right after posting and again after the matching send was posted: old contents, new,
     or part of each), and a send buffer must not be written before the wait (the lesson overwrites
     it and shows what the receiver got: undefined as well). Then both again under --sanitize
     (common/sanitize.py): each now fails the same way every run, and is named by its line.
  3. overlap, measured: exchange a large message and compute, four ways, interleaved run by run:
       (a) blocking exchange, then compute: no overlap by construction, the control
       (b) post, compute, wait
       (c) post, compute in slices with a test of the requests between slices
       (d) (b) again in a second MPICH job with a progress thread (MPIR_CVAR_ASYNC_PROGRESS=1);
           Open MPI 5 has no such thread for point-to-point, so there (d) says so instead
     hidden = ((a) - time) / min(comm, compute): the share of the shorter part a mode saved against
     (a) in the same rounds; 1 all of it, 0 none, below 0 slower than (a). (a) should take comm +
     compute: how far it is off is this run's noise, and a reading counts only beyond it. The
     lesson then says why, for the transport that ran:
     MPI moves a large message only inside MPI calls (unless a thread or the network card does),
     gloo on threads of its own, NCCL with kernels that share the GPU with the compute.

Run it:
  make lesson-02 NP=4                       (or API=torch)
  .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py lessons/02_isend_irecv.py --api mpi4py
Read next: lesson 03 (broadcast and scatter). Beside this page: isend_irecv/show.py (what it prints)
and isend_irecv/progress_job.py (mode (d)'s second job).
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import numpy as np  # noqa: E402

from common import bootstrap, mpilib, report, timing  # noqa: E402
from lessons.isend_irecv import progress_job, sanitized, show  # noqa: E402

LOCAL = 1000             # cells each rank owns
HALO = 4                 # ghost cells on each side
BIG = 1 << 19            # float64 values in the overlap message (4 MiB: above common eager limits)
REPEAT = 5               # timed runs of each overlap mode; the median is reported
SLICE = 1 << 15          # float64 values one compute slice works on
TO_LEFT, TO_RIGHT = 21, 22  # tags: with 2 ranks the left and right neighbour are the same rank


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


def torch_mods(ctx):
    import torch
    import torch.distributed as dist
    return torch, dist


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
    return u[:HALO].copy(), u[-HALO:].copy()  # what the ghosts hold now, when the exchange returned


# ---------------------------------------------------------------- 2. hazards (host buffers)
def contents(a, old, new):
    """'old', 'new', 'part new' or 'poison' (NaN: a sanitized receive): what buffer `a` holds."""
    if np.all(np.isnan(a)):
        return "poison"
    if np.all(a == old):
        return "old"
    return "new" if np.all(a == new) else "part new"


def hazards(ctx, comm, count):
    """What a posted receive buffer held right after posting and after the matching send was posted
    (both before the wait), what it held after the wait, and what the receiver got from a send buffer
    overwritten before its wait. comm: ctx.comm, or the same under common/sanitize.py."""
    n, r = ctx.world_size, ctx.rank
    left, right = (r - 1) % n, (r + 1) % n
    got = np.full(count, -1.0)
    mine = np.full(count, float(r))
    if ctx.api == "torch":
        torch, dist = torch_mods(ctx)
        group = dist.new_group(backend="gloo") if ctx.device == "gpu" else None
        got_t = torch.from_numpy(got)
        recv = dist.irecv(got_t, src=left, group=group, tag=TO_RIGHT)
        early = contents(got, -1.0, left)        # hazard 1: read before recv.wait()
        send = dist.isend(torch.from_numpy(mine), dst=right, group=group, tag=TO_RIGHT)
        comm.Barrier()                           # every send is posted; gloo's threads move them
        later = contents(got, -1.0, left)        # still before recv.wait()
        recv.wait()
        send.wait()
        after = contents(got, -1.0, left)
        buf = torch.full((count,), 1.0, dtype=torch.float64)
        send = dist.isend(buf, dst=right, group=group, tag=TO_LEFT)
        buf.fill_(2.0)                           # hazard 2: written before send.wait()
        comm.Barrier()
        dist.recv(got_t, src=left, group=group, tag=TO_LEFT)
        send.wait()
    else:
        from mpi4py import MPI
        req = comm.Irecv(got, source=left, tag=TO_RIGHT)
        early = contents(got, -1.0, left)        # hazard 1: read before req.Wait()
        sreq = comm.Isend(mine, dest=right, tag=TO_RIGHT)
        comm.Barrier()                           # every send is posted, and MPI made progress inside
        later = contents(got, -1.0, left)        # still before req.Wait()
        MPI.Request.Waitall([req, sreq])
        after = contents(got, -1.0, left)
        buf = np.full(count, 1.0)
        req = comm.Isend(buf, dest=right, tag=TO_LEFT)
        buf[:] = 2.0                             # hazard 2: written before req.Wait()
        comm.Barrier()
        MPI.Request.Waitall([comm.Irecv(got, source=left, tag=TO_LEFT), req])
    return early, later, after, contents(got, 1.0, 2.0)


# ---------------------------------------------------------------- 3. overlap
def backend_cpu_mpi(ctx, count):
    """post / wait / test / compute / sync for a ring exchange of `count` float64 over MPI."""
    from mpi4py import MPI
    comm, n, r = ctx.comm, ctx.world_size, ctx.rank
    sbuf, rbuf, work = np.ones(count), np.empty(count), np.ones(SLICE)
    post = lambda: [comm.Irecv(rbuf, source=(r - 1) % n), comm.Isend(sbuf, dest=(r + 1) % n)]  # noqa
    return dict(post=post, wait=MPI.Request.Waitall, test=MPI.Request.Testall,
                compute=lambda k: [np.sin(work, out=work) for _ in range(k)])


def backend_torch(ctx, count):
    torch, dist = torch_mods(ctx)
    n, r = ctx.world_size, ctx.rank
    gpu = ctx.device == "gpu"
    dev = "cuda" if gpu else "cpu"
    sbuf = torch.ones(count, dtype=torch.float64, device=dev)
    rbuf = torch.empty(count, dtype=torch.float64, device=dev)
    if gpu:
        a = torch.ones(1024, 1024, device=dev)
        c = torch.empty_like(a)
        compute = lambda k: [torch.matmul(a, a, out=c) for _ in range(k)]  # noqa: E731
    else:
        work = torch.ones(SLICE, dtype=torch.float64)
        compute = lambda k: [torch.sin(work, out=work) for _ in range(k)]  # noqa: E731

    def post():
        return dist.batch_isend_irecv([dist.P2POp(dist.isend, sbuf, (r + 1) % n),
                                       dist.P2POp(dist.irecv, rbuf, (r - 1) % n)])

    def wait(works):
        for w in works:
            w.wait()  # on nccl, wait() only orders the streams; the clock's sync waits for the GPU

    return dict(post=post, wait=wait, test=lambda works: all(w.is_completed() for w in works),
                compute=compute)


def backend_nccl(ctx, count):
    import cupy
    from cupy.cuda import nccl
    n, r, comm = ctx.world_size, ctx.rank, ctx.nccl
    comm_stream = cupy.cuda.Stream(non_blocking=True)   # nccl gets its own stream
    sbuf, rbuf = cupy.ones(count), cupy.empty(count)
    a = cupy.ones((1024, 1024), dtype=cupy.float32)
    c = cupy.empty_like(a)
    # sbuf was filled by a kernel on the current stream, and a non_blocking stream does not wait for
    # it: without this, nccl could send sbuf before the fill ran. The event marks the fill's end.
    filled = cupy.cuda.get_current_stream().record()
    comm_stream.wait_event(filled)

    def post():
        nccl.groupStart()
        comm.send(sbuf.data.ptr, count, nccl.NCCL_FLOAT64, (r + 1) % n, comm_stream.ptr)
        comm.recv(rbuf.data.ptr, count, nccl.NCCL_FLOAT64, (r - 1) % n, comm_stream.ptr)
        nccl.groupEnd()
        return comm_stream

    def compute(k):
        for _ in range(k):
            cupy.matmul(a, a, out=c)  # on the current (default) stream, not comm_stream

    return dict(post=post, wait=lambda s: s.synchronize(), test=lambda s: s.done, compute=compute)


def sliced(b, slices):
    works = b["post"]()
    for _ in range(slices):
        b["compute"](1)
        b["test"](works)     # MPI: progress happens inside Test; gloo, nccl: it only asks
    b["wait"](works)


MODES = {  # name -> what one timed run does
    "comm only": lambda b, k: b["wait"](b["post"]()),
    "compute only": lambda b, k: b["compute"](k),
    "(a) blocking, then compute (control)": lambda b, k: (b["wait"](b["post"]()), b["compute"](k)),
    "(b) post, compute, wait": lambda b, k: (lambda w: (b["compute"](k), b["wait"](w)))(b["post"]()),
    "(c) post, compute + Test per slice": sliced,
}


def timed(ctx, b, modes, slices, repeat):
    """{mode: median over `repeat` rounds of the slowest rank's seconds}; each round runs every mode
    once, so a slow spell of a shared machine falls on all modes alike."""
    from mpi4py import MPI
    sync = timing.syncer(ctx)  # a GPU call returns once queued: the clock waits for the work
    times = {m: [] for m in modes}
    for _ in range(repeat):
        for mode in modes:
            ctx.comm.Barrier()
            t0 = timing.now(sync)
            MODES[mode](b, slices)
            times[mode].append(ctx.comm.allreduce(timing.now(sync) - t0, op=MPI.MAX))
    return {m: statistics.median(t) for m, t in times.items()}


def measure_overlap(ctx, count, repeat, modes, slices=None):
    """{mode: seconds} with the compute calibrated to last about as long as the exchange (or given)."""
    from mpi4py import MPI
    b = (backend_torch(ctx, count) if ctx.api == "torch" else
         backend_nccl(ctx, count) if ctx.device == "gpu" else backend_cpu_mpi(ctx, count))
    MODES["comm only"](b, 0)  # warm-up: connections, registration
    if not slices:
        t_comm = timed(ctx, b, ["comm only"], 0, repeat)["comm only"]
        t_slice = timed(ctx, b, ["compute only"], 10, repeat)["compute only"] / 10  # ten: less noise
        slices = ctx.comm.allreduce(int(min(2000, max(1, round(t_comm / max(t_slice, 1e-7))))), op=MPI.MAX)
    return timed(ctx, b, ["comm only", "compute only", *modes], slices, repeat), slices


CONTROL, D_MODE = "(a) blocking, then compute (control)", "(d) (b) with MPICH async progress"


def d_not_here(ctx):
    """Why mode (d) does not run on this transport (None where it runs: MPI)."""
    if ctx.transport == "gloo":
        return "n/a: an MPI progress thread is for MPI; gloo moves p2p on its own threads"
    if ctx.transport == "nccl":  # on either API
        return "n/a: an MPI progress thread does not drive NCCL's kernels"
    return None


def hidden_of(t, t_control, t_comm, t_comp):
    """Share of the shorter part (comm or compute) a mode saved against the control: 1 all of it,
    0 none, below 0 the mode took longer than doing one after the other."""
    return (t_control - t) / min(t_comm, t_comp)


def noise_of(times):
    """How far the control is from comm + compute, in the same unit as hidden: the run's noise."""
    return abs(times["comm only"] + times["compute only"] - times[CONTROL]) / min(times["comm only"],
                                                                             times["compute only"])


NOISE_MARGIN = 0.2  # a reading must stand this far beyond the noise to count


def what_was_seen(times, hidden, noise, child):
    """One line per mode, saying what the numbers show and no more. (d) is held to its own job's control
    and noise, and to this job's (a) for the time it took in all."""
    lines = []
    for mode, t in times.items():
        key = mode[:3]
        if key == "(a)" or not mode.startswith("("):
            continue
        h, bar, vs, whose = hidden[key], noise + NOISE_MARGIN, " of the shorter part", ""
        if key == "(d)":
            bar, vs, whose = noise_of(child["times"]) + NOISE_MARGIN, " vs its own job's (a)", "that job's "
        verdict = (f"beyond {whose}noise ({bar:.2f}), a real overlap" if h > bar else
                   f"below -{bar:.2f}: slower than (a), the parts slowed each other" if h < -bar else
                   f"within {whose}noise ({bar:.2f}), no gain or loss")
        lines.append(f"seen: {key} hid {h:+.2f}{vs}: {verdict}")
        if key == "(d)" and hidden_of(t, times[CONTROL], times["comm only"], times["compute only"]) < -(
                noise + NOISE_MARGIN):
            ct = child["times"]
            lines.append(f"  but that job's comm and compute took {ct['comm only'] / times['comm only']:.1f} x and "
                         f"{ct['compute only'] / times['compute only']:.1f} x this job's: in all (d) took "
                         f"{t / times[CONTROL]:.2f} x (a)")
    return lines


def overlap_section(ctx, args):
    """Section 3's numbers: ({mode: seconds}, {"(a)": hidden, ...}, noise, compute slices, (d)'s job,
    why no (d))."""
    modes = [m for m in MODES if m.startswith("(")]
    times, slices = measure_overlap(ctx, args.big, args.repeat, modes)
    d_reason, child = d_not_here(ctx), None
    if d_reason is None:
        child, d_reason = progress_job.run(ctx, args, slices, mpilib.current(), os.path.abspath(__file__))
        if child:
            times[D_MODE] = child["times"]["(b) post, compute, wait"]
    ref = (times[CONTROL], times["comm only"], times["compute only"])
    hidden = {m[:3]: hidden_of(t, *ref) for m, t in times.items() if m.startswith("(")}
    if child:  # (d) against its own job's control: its progress thread changes comm and compute
        ct = child["times"]
        hidden["(d)"] = hidden_of(times[D_MODE], ct[CONTROL], ct["comm only"], ct["compute only"])
    return times, hidden, noise_of(times), slices, child, d_reason


def overlap_only(ctx, args):
    """The child job of mode (d): (a) and (b) with the parent's compute, to a file."""
    times, slices = measure_overlap(ctx, args.big, args.repeat, [CONTROL, "(b) post, compute, wait"],
                                    slices=args.slices)
    if ctx.rank == 0:
        report.write_json(args.overlap_only, {"times": times, "slices": slices})
    report.finish(ctx, {})


def flags():
    parser = bootstrap.lesson_parser(__file__, __doc__)
    parser.add_argument("--big", type=bootstrap.nonneg_int, default=BIG,
                        help=f"float64 values in the overlap message (default {BIG})")
    parser.add_argument("--repeat", type=bootstrap.nonneg_int, default=REPEAT,
                        help=f"timed runs of each overlap mode (default {REPEAT})")
    parser.add_argument("--async-progress", choices=["run", "skip"], default="run",
                        help="mode (d): rerun (b) in a second MPICH job with a progress thread")
    parser.add_argument("--overlap-only", metavar="PATH", help=argparse.SUPPRESS)
    parser.add_argument("--slices", type=bootstrap.nonneg_int, help=argparse.SUPPRESS)
    return parser


def main():
    args, ctx = bootstrap.start(__file__, flags())
    if ctx.world_size < 2:
        ctx.fail("needs at least 2 ranks: a neighbour exchange needs neighbours (try -n 2)")
    if args.big < 1 or args.repeat < 1:
        ctx.fail("--big and --repeat must be at least 1")
    if args.overlap_only:
        return overlap_only(ctx, args)                                 # mode (d)'s own job
    ctx.params = {"local": LOCAL, "halo": HALO, "big": args.big}

    report.section(ctx, f"1. halo exchange on a ring: {LOCAL} cells per rank, {HALO} ghosts a side")
    gl, gr = halo(ctx)                                                 # the exercise
    report.say(ctx, f"left ghosts {gl.astype(int).tolist()}  right ghosts {gr.astype(int).tolist()}")

    over = " (over MPI)" if ctx.api == "mpi4py" else " (a gloo group)"
    report.section(ctx, f"2. hazards, on host buffers of {args.big * 8} B"
                   + (over if ctx.transport == "nccl" else ""))
    plain, checked, reports = sanitized.twice(ctx, hazards, args.big)   # plain, then sanitized
    early, later, after, seen = plain
    show.hazards(ctx, ctx.comm.gather(plain, root=0), ctx.comm.gather((checked, reports), root=0))

    report.section(ctx, f"3. overlap: exchange {args.big * 8} B with each neighbour while computing, "
                        f"median of {args.repeat}")
    times, hidden, noise, slices, child, d_reason = overlap_section(ctx, args)
    show.overlap(ctx, times, hidden, noise, slices, child, d_reason, what_was_seen(times, hidden, noise, child))

    report.finish(ctx, {"ghost_left_first": float(gl[0]), "ghost_left_sum": float(gl.sum()),
                        "ghost_right_first": float(gr[0]), "ghost_right_sum": float(gr.sum()),
                        "early_read": early, "read_after_barrier": later, "after_wait": after,
                        "overwritten_send_seen": seen, "sanitized_early_read": checked[0],
                        "sanitized_send_seen": checked[3], "sanitized_reports": len(reports)},
                  summary={"compute_slices": slices, "async_progress": d_reason or "run",
                           **{f"time_us{k}": round(t * 1e6, 1) for k, t in times.items()},
                           "noise": noise, **{f"hidden{k}": v for k, v in hidden.items()}})


if __name__ == "__main__":
    main()
