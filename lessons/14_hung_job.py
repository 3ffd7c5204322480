"""Lesson 14 — a hung job, diagnosed: the flight recorder, and the first call where the ranks diverged.

The worst hour of distributed training is a hung job: one rank skipped a collective, called
another one or passed another count, and the others wait forever. Where each rank is stuck says
little; *why* is in the order of the calls. Each rank keeps a flight recorder (common/flight.py):
its last calls, each with its #k on its communicator, op, dtype, count, root or peers, communicator
and state, written to a file before each call starts: on disk while the rank is blocked in a call.
States follow the host: started (in the call), enqueued (a GPU call returned, unsynced), completed.
torch's (FlightRecorder.hpp) follow the GPU: scheduled (our started, or enqueued but not begun),
started (the kernel began; only with TORCH_NCCL_ENABLE_TIMING=1), completed.

What to watch for:
  1. a small training job: per step an all-reduce of the gradients and one of the loss, a broadcast
     of the parameters from rank 0, a point-to-point swap between rank R and its neighbour. Then
     rank 0's record of it, and what recording costs a call, against this run's noise.
  2. `--fault NAME --fault-rank R` plants one fault on rank R in step 2 (see --help). Once every
     rank has waited STUCK_S seconds, nothing moving, the runner ends the run and reads every rank's
     record: it names the rank, the call (#k) and the field that differ (at NP 2, no majority: the
     program's own order breaks the tie). A straggler is slow, not stuck: the arrival times name it.
  3. `--debug-collectives` (every lesson has it): the ranks compare each collective's fingerprint
     before the call and stop at the first mismatch, in under 2 s, instead of hanging.
  4. your reading (`bin/tutor practice 14`): first_divergence, graded on faults planted on paper
     (lessons/hung_job/reading.py) on both of 2 ranks, and on rank 0, a middle and the last of NP.
A fault's behaviour is the library's: it may hang, fail (MPI_ERR_TRUNCATE), return garbage (every
sum is checked: that stops it too) or finish with the right values by luck (MPICH's broadcast did,
--fault root --fault-rank 3 at NP 4); the record says why in every case.
Run it:                                (`bin/tutor why` shows the last run's diagnosis again)
  make lesson-14 NP=4                  bin/tutor run 14 -n 4 -- --fault skip --fault-rank 3
  .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py lessons/14_hung_job.py --api mpi4py
"""
import os
import sys
import tempfile
import time
from collections import Counter
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import bootstrap, buffers, flight, report, timing  # noqa: E402
from lessons.hung_job import reading, show  # noqa: E402

COUNT = 1024             # float32 gradients per step
STEPS = 4                # training steps; the fault goes in step FAULT_STEP
FAULT_STEP = 2           # after two clean steps, so the record shows the pattern the fault breaks
PER_STEP = 3             # world collectives per step: gradients, loss, parameters
STUCK_S = 1.0            # a planted hang ends once every rank has waited this long, nothing moving
SLOW_S = 1.0             # the straggler's extra compute
COST_ITERS = 100         # recorded and bare calls timed for the recorder's cost (x10 for it alone)
FAULTS = ("none", "skip", "op", "count", "dtype", "root", "subgroup", "p2p-cycle", "straggler")
FIELDS = ("op", "dtype", "count", "root", "comm")  # what a call's record holds, compared in this order
# where each fault shows: the field the diagnosis must name (at the world collective #k it breaks)
FIELD = {"skip": "skip", "op": "op", "count": "count", "dtype": "dtype", "root": "root",
         "subgroup": "comm", "p2p-cycle": "p2p-cycle"}


def first_divergence(records):
    """Your reading of a hang. `records` is {rank: [Call(seq, op, dtype, count, root, comm, site), ...]},
    each rank's world collectives in order (#seq, as the recorder numbers them; site: file:line; a Call
    is a namedtuple: call.seq, call.site, ..., lessons/hung_job/reading.py).
    Return (rank, seq, field) for the first #seq where the ranks disagree: the rank whose call there is
    not the usual one (or that has none; the lowest, if several), and what differs. The usual call is
    the one most ranks made; at a tie (two ranks: no majority) it is the one the program made before,
    the same call right after the same line, earlier in the records. field: "skip" when the rank's call
    at #seq comes from a line the others called from at another # (it skipped ahead; a hang's records
    end at the call each rank waits in, so the others made that line's call earlier), else the first
    of FIELDS that differs. None when every rank made the same calls."""
    # >>> exercise: divergence
    at = {rank: {call.seq: call for call in calls} for rank, calls in records.items()}
    for seq in sorted({call.seq for calls in records.values() for call in calls}):
        here = {rank: calls.get(seq) for rank, calls in at.items()}
        votes = Counter(here.values())
        if len(votes) == 1:
            continue  # every rank made this call alike
        # (the line before, the call but its #) for every call made before #seq: the program's own order
        before = {(a.site, b._replace(seq=0)) for calls in records.values() for a, b in zip(calls, calls[1:])
                  if b.seq < seq}

        def usual(rank):  # how many ranks made this call, then: did the program make it so before?
            mine, last = here[rank], at[rank].get(seq - 1)
            return votes[mine], mine is not None and last is not None and (last.site, mine._replace(seq=0)) in before
        odd, ref = min(here, key=usual), here[max(here, key=usual)]
        mine = here[odd]
        elsewhere = {c.site for rank, calls in records.items() if rank != odd for c in calls if c.seq != seq}
        if mine is None or (mine.site != ref.site and mine.site in elsewhere):
            return odd, seq, "skip"
        return odd, seq, next((f for f in FIELDS if getattr(mine, f) != getattr(ref, f)), "site")
    return None
    # <<< exercise: divergence


def planted_seq(fault):
    """#k of the world collective a fault in step FAULT_STEP breaks: its gradient all-reduce, or for
    root its broadcast (the step's third)."""
    return PER_STEP * FAULT_STEP + (PER_STEP if fault == "root" else 1)


def partner(rank, n):
    """Rank R's neighbour in the point-to-point swap (and its two-rank subgroup)."""
    return rank + 1 if rank + 1 < n else rank - 1


def mpi_calls(ctx, sub):
    """The job's calls on mpi4py: MPI on NumPy buffers, or NCCL on CuPy arrays (one communicator each)."""
    from mpi4py import MPI
    comm = ctx.comm
    if ctx.device == "gpu":
        import cupy
        from cupy.cuda import nccl
        stream = cupy.cuda.get_current_stream()
        sub_nccl = bootstrap.nccl_comm(sub) if sub is not None else None

        def all_reduce(buf, on_sub=False):
            c = sub_nccl if on_sub else ctx.nccl
            c.allReduce(buf.data.ptr, buf.data.ptr, buf.size, buffers.nccl_dtype(buf), nccl.NCCL_SUM, stream.ptr)
        return dict(
            all_reduce=all_reduce,
            broadcast=lambda buf, root: ctx.nccl.bcast(buf.data.ptr, buf.size, buffers.nccl_dtype(buf), root,
                                                       stream.ptr),
            all_gather=lambda out, buf: ctx.nccl.allGather(buf.data.ptr, out.data.ptr, buf.size,
                                                           buffers.nccl_dtype(buf), stream.ptr),
            send=lambda buf, peer: ctx.nccl.send(buf.data.ptr, buf.size, buffers.nccl_dtype(buf), peer, stream.ptr),
            recv=lambda buf, peer: ctx.nccl.recv(buf.data.ptr, buf.size, buffers.nccl_dtype(buf), peer, stream.ptr))
    return dict(
        all_reduce=lambda buf, on_sub=False: (sub if on_sub else comm).Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM),
        broadcast=lambda buf, root: comm.Bcast(buf, root=root),
        all_gather=lambda out, buf: comm.Allgather(buf, out),
        send=lambda buf, peer: comm.Send(buf, dest=peer),
        recv=lambda buf, peer: comm.Recv(buf, source=peer))


def torch_calls(ctx, sub):
    """The same calls on torch.distributed (gloo on the CPU, nccl on the GPU)."""
    import torch.distributed as dist
    return dict(
        all_reduce=lambda t, on_sub=False: dist.all_reduce(t, op=dist.ReduceOp.SUM, group=sub if on_sub else None),
        broadcast=lambda t, root: dist.broadcast(t, src=root),
        all_gather=lambda out, t: dist.all_gather(list(out.chunk(ctx.world_size)), t),
        send=lambda t, peer: dist.send(t, dst=peer),
        recv=lambda t, peer: dist.recv(t, src=peer))


def subgroup(ctx, members):
    """The two-rank group the subgroup fault uses, made by every rank up front (collective)."""
    if ctx.api == "torch":
        import torch.distributed as dist
        return dist.new_group(members)
    inside = ctx.rank in members
    sub = ctx.comm.Split(0 if inside else 1, key=ctx.rank)
    return sub if inside else None


def arrays(ctx):
    """zeros(count, dtype) and host(x) for this path's buffers (NumPy, CuPy or torch)."""
    if ctx.api == "torch":
        import torch
        dev = "cuda" if ctx.device == "gpu" else "cpu"
        return (lambda count, dtype: torch.zeros(count, dtype=getattr(torch, dtype), device=dev),
                buffers.to_host)
    xp = buffers.array_module(ctx)
    return lambda count, dtype: xp.zeros(count, dtype=dtype), buffers.to_host


def job(ctx, args, calls, rec, zeros, host, sync):
    """The training job, with the planted fault on rank R in step FAULT_STEP; every sum is checked."""
    n, rank, R = ctx.world_size, ctx.rank, args.fault_rank
    peer, sub_name = partner(R, n), "group[%d,%d]" % tuple(sorted((R, partner(R, n))))
    for step in range(STEPS):
        fault = args.fault if step == FAULT_STEP and rank == R else "none"
        if fault == "straggler":
            time.sleep(SLOW_S)  # "compute" that takes longer on this rank only
        grad, want = zeros(COUNT, "float32"), n * (n + 1) / 2 + n * step
        grad += rank + 1 + step
        if fault == "skip":
            pass  # this rank never makes step 2's gradient all-reduce
        elif fault == "op":
            out = zeros(COUNT * n, "float32")
            with rec.call("all_gather", grad):
                calls["all_gather"](out, grad)
        elif fault in ("count", "dtype"):
            odd = zeros(COUNT // 2, "float32") if fault == "count" else zeros(COUNT, "float64")
            with rec.call("all_reduce", odd):
                calls["all_reduce"](odd)
        elif fault == "subgroup":
            with rec.call("all_reduce", grad, comm=sub_name):
                calls["all_reduce"](grad, True)
        else:
            with rec.call("all_reduce", grad):
                calls["all_reduce"](grad)
            sync()
            assert (host(grad) == want).all(), f"step {step}: gradient sum {host(grad)[:3]}..., want {want}"
        loss = zeros(1, "float64")
        loss += rank
        with rec.call("all_reduce", loss):
            calls["all_reduce"](loss)
        params = zeros(COUNT, "float32")
        params += rank + 10 * step
        root = 1 % n if fault == "root" else 0
        with rec.call("broadcast", params, root=root):
            calls["broadcast"](params, root)
        sync()
        assert (host(params) == 10 * step).all(), f"step {step}: broadcast gave {host(params)[:3]}..."
        if rank in (R, peer):
            swap(calls, rec, zeros, rank, R, peer, fault == "p2p-cycle", sync)
        rec.synced()


def swap(calls, rec, zeros, rank, R, peer, cycle, sync):
    """R sends first, its neighbour receives first; the p2p-cycle fault makes R receive first too."""
    other = peer if rank == R else R
    out, into = zeros(256, "float32"), zeros(256, "float32")
    out += rank
    order = ("recv", "send") if rank != R or cycle else ("send", "recv")
    for what in order:
        buf = out if what == "send" else into
        with rec.call(what, buf, kind="p2p", peers=f"{what[0]}{other}"):
            calls[what](buf, other)
    sync()


def arrivals(entries_by_rank):
    """From every rank's record: (the rank that arrived last at the world collectives most, by how
    many seconds in total the others waited for it)."""
    late = {}
    by_seq = {}
    for rank, entries in enumerate(entries_by_rank):
        for e in entries:
            if e["kind"] == "coll" and e["comm"] == "world":
                by_seq.setdefault(e["seq"], {})[rank] = e["t0"]
    for seq, t0 in by_seq.items():
        if len(t0) == len(entries_by_rank):
            last = max(t0, key=t0.get)
            late[last] = late.get(last, 0.0) + t0[last] - sorted(t0.values())[(len(t0) - 1) // 2]
    slowest = max(late, key=late.get)
    return slowest, late[slowest]


def cost(ctx, calls, rec, zeros, sync):
    """({name: seconds per call}, {name: noise}) for a 1-item all-reduce bare and recorded, and the
    recording alone: the slowest rank's, the best of timing.BATCHES interleaved batches, and how far
    the batches wandered. On a recorder of its own: a timed loop turns the rank's recorder off."""
    one = zeros(1, "float32")

    def recorded():
        with mine.call("all_reduce", one):
            calls["all_reduce"](one)

    def record():  # the same recording around no call (no communicator: nothing to check)
        with mine.call("all_reduce", one, comm="local", kind="p2p"):
            pass
    fns = {"bare": lambda: calls["all_reduce"](one), "recorded": recorded, "record": record}
    spread = {}
    with tempfile.TemporaryDirectory() as tmp:  # on file through mmap, as the rank's own is; kept while timed
        mine = flight.Recorder(ctx.rank, os.path.join(tmp, "cost.flight"), rec.gpu, rec.check)
        be = SimpleNamespace(sync=lambda: (sync(), mine.synced()))
        return timing.best_of(ctx, be, fns, 5, COST_ITERS, spread), spread


def recorder(ctx):
    """This rank's flight recorder, and sync(): the GPU finished what this rank queued, so its
    enqueued calls are completed."""
    rec, device_sync = flight.get(), timing.syncer(ctx)

    def sync():
        device_sync()
        rec.synced()
    return rec, sync


def your_reading(ctx, entries):
    """Your first_divergence on this run's records, with each fault planted in them on paper."""
    report.section(ctx, "your reading: first_divergence on these records, each fault planted on paper")
    clean, cases = reading.grade(first_divergence, entries, ctx.world_size, planted_seq)
    if ctx.rank == 0:
        show.reading(clean, cases)
    return clean, cases


def recording_cost(ctx, args, calls, rec, zeros, sync):
    """The slowest rank's seconds per call, and the noise; rank 0 says whether recording costs more."""
    report.section(ctx, f"what recording costs ({COST_ITERS} calls a batch, best of {timing.BATCHES} batches)")
    secs, noise = cost(ctx, calls, rec, zeros, sync)  # the same on every rank
    verdict = show.cost_verdict(secs, noise)
    if ctx.rank == 0:
        show.cost(secs, noise, verdict, args.debug_collectives)
    return {**{f"{k}_us": v * 1e6 for k, v in secs.items()}, **{f"{k}_noise_us": v * 1e6 for k, v in noise.items()},
            "cost_verdict": verdict}


def flags():
    parser = bootstrap.lesson_parser(__file__, __doc__)
    parser.add_argument("--fault", choices=FAULTS, default="none",
                        help=f"the fault to plant on rank R in step {FAULT_STEP}: skip (R skips the gradient "
                        "all-reduce, #7), op (R calls all-gather instead), count, dtype, root (R broadcasts "
                        "from another root, #9), subgroup (R's all-reduce goes to a two-rank group), p2p-cycle "
                        "(R receives before it sends: a head-to-head receive, lesson 01's deadlock), straggler "
                        f"(R computes {SLOW_S:g} s longer: slow, not stuck)")
    parser.add_argument("--fault-rank", type=bootstrap.nonneg_int, default=1, metavar="R",
                        help="the rank that gets the fault (default 1)")
    return parser


def main():
    args, ctx = bootstrap.start(__file__, flags())
    n, rank, R = ctx.world_size, ctx.rank, args.fault_rank
    if n < 2 or R >= n:
        ctx.fail(f"--fault-rank {R} needs NP >= 2 and R < NP (NP = {n})")
    rec, sync = recorder(ctx)
    sub = subgroup(ctx, sorted((R, partner(R, n))))  # every rank makes it, the subgroup fault uses it
    calls = torch_calls(ctx, sub) if ctx.api == "torch" else mpi_calls(ctx, sub)
    zeros, host = arrays(ctx)
    ctx.params = {"fault": args.fault, "fault_rank": R, "fault_peer": partner(R, n),
                  "fault_seq": planted_seq(args.fault), "fault_field": FIELD.get(args.fault, "none"),
                  "count": COUNT, "steps": STEPS}
    if args.fault in FIELD:  # tell the runner: end it once stuck, grade the diagnosis, sum up the errors
        show.errors_aside(rank)
        if rank == 0:
            flight.plant(n, STUCK_S, ctx.params)
    report.section(ctx, f"a training job, {STEPS} steps, fault: {args.fault}"
                        + (f" on rank {R} in step {FAULT_STEP}" if args.fault != "none" else ""))
    t0 = timing.now(sync)
    job(ctx, args, calls, rec, zeros, host, sync)                    # 1. the job, the fault on rank R
    seconds = timing.now(sync) - t0
    entries = [e for e in rec.entries() if e["comm"] != "local"]     #    what this rank's recorder holds
    everyone = ctx.comm.gather(entries, root=0)
    slow = ctx.comm.bcast(arrivals(everyone) if rank == 0 else None, root=0)  # who arrived last
    report.say(ctx, f"{len(entries)} calls recorded, {sum(e['state'] != 'completed' for e in entries)} "
                    f"not completed; the job took {seconds:.2f} s")
    if rank == 0:  # a planted fault that gets here did not stop the run: the library let it through
        show.record(entries, lucky=args.fault in FIELD)
    if args.fault == "straggler":                                    # 2. slow, not stuck: who was late
        report.section(ctx, "slow, not stuck: who arrived last at the collectives")
        if rank == 0:
            show.straggler(slow)
    clean, cases, costs = "none", [], {}
    if args.fault == "none":  # a planted fault's record is the runner's to read
        clean, cases = your_reading(ctx, entries)                    # 3. your reading, faults on paper
        costs = recording_cost(ctx, args, calls, rec, zeros, sync)   # 4. what recording costs
    report.finish(ctx, {"calls": len(entries), "open": sum(e["state"] != "completed" for e in entries),
                        "clean_reading": clean, "reading": cases, **costs},
                  summary={"slowest_rank": slow[0], "slow_s": slow[1], "seconds": seconds})

if __name__ == "__main__":
    main()
