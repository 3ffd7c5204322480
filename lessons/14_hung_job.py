"""Lesson 14 — a hung job, diagnosed: the flight recorder, and the first call where the ranks diverged.

The worst hour of distributed training is a job that hangs: one rank skipped a collective, called
another one, or passed another count, and every other rank waits forever. Where each rank is stuck
(its stack) says little; *why* is in the order of the calls. Every rank here keeps a flight recorder
(common/flight.py): its last calls, each with its number on its communicator (#k), op, dtype, count,
root or peers, communicator, and state (started, enqueued on a GPU, completed), in a small file
written before each call starts, so it is on disk even while the rank is blocked inside MPI or NCCL.

What to watch for:
  1. a small training job: per step an all-reduce of the gradients (float32 x COUNT), an all-reduce
     of the loss (float64 x 1), a broadcast of the parameters from rank 0 and one point-to-point swap
     between rank R and its neighbour. Then rank 0's record of it, and what recording cost per call.
  2. `--fault NAME --fault-rank R` plants one fault on rank R in step 2: skip (R skips the gradient
     all-reduce, #7), op (R calls all-gather instead), count, dtype, root (R broadcasts from another
     root, #9), subgroup (R's all-reduce goes to a two-rank group), p2p-cycle (R receives before it
     sends: a head-to-head receive, lesson 01's deadlock), straggler (R computes 1 s longer: slow, not
     stuck). Once every rank has waited in a call, nothing moving, for STUCK_S seconds, the runner ends
     the run and reads every rank's record: it names the rank, the call and the field that differ.
     The lesson's checks grade that diagnosis against the fault planted. A straggler's run passes and
     the lesson names who was slow from the records' arrival times.
  3. `--debug-collectives` (every lesson has it): before each collective the ranks compare its
     fingerprint (#k, op, dtype, count, root, communicator) and stop at the first mismatch, in under
     2 s, instead of hanging: TORCH_DISTRIBUTED_DEBUG=DETAIL's idea, for mpi4py and torch alike.
  4. your reading (`bin/tutor practice 14`): write first_divergence, which reads records as the
     runner's diagnosis does; the lesson plants each fault in this run's records on paper (no hang)
     and checks that yours names its rank, #k and field, and reports nothing for the clean run.
A fault's behaviour is the library's: MPI may hang, fail with MPI_ERR_TRUNCATE, or return garbage
(the lesson checks every sum, so garbage stops it too); the record says why in every case.
`bin/tutor why` shows the last run's diagnosis again.

Run it:
  make lesson-14 NP=4                  bin/tutor run 14 -n 4 -- --fault skip --fault-rank 3
  .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py lessons/14_hung_job.py --api mpi4py
"""
import os
import sys
import time
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import numpy as np  # noqa: E402

from common import bootstrap, buffers, flight, report, timing  # noqa: E402

COUNT = 1024             # float32 gradients per step
STEPS = 4                # training steps; the fault goes in step FAULT_STEP
FAULT_STEP = 2           # after two clean steps, so the record shows the pattern the fault breaks
PER_STEP = 3             # world collectives per step: gradients, loss, parameters
STUCK_S = 1.0            # a planted hang ends once every rank has waited this long, nothing moving
SLOW_S = 1.0             # the straggler's extra compute
COST_ITERS = 100         # recorded and bare calls timed for the recorder's cost (x10 for it alone)
FAULTS = ("none", "skip", "op", "count", "dtype", "root", "subgroup", "p2p-cycle", "straggler")
# where each fault shows: the world collective it breaks (#k) and the field the diagnosis must name
FIELD = {"skip": "skip", "op": "op", "count": "count", "dtype": "dtype", "root": "root",
         "subgroup": "comm", "p2p-cycle": "p2p-cycle"}


def partner(rank, n):
    """Rank R's neighbour in the point-to-point swap (and its two-rank subgroup)."""
    return rank + 1 if rank + 1 < n else rank - 1


FIELDS = ("op", "dtype", "count", "root", "comm")  # what a call's record holds, compared in this order


def first_divergence(records):
    """Your reading of a hang. `records` is {rank: [(seq, op, dtype, count, root, comm, site), ...]},
    each rank's world collectives in order (#seq, as the recorder numbers them; site: file:line).
    Return (rank, seq, field) for the first #seq where the ranks disagree: the one rank whose call
    there differs from the others' (or that has none), and what differs: "skip" when its call at #seq
    is one the others make later (the same site: it skipped the call they wait in), else the first
    of FIELDS that differs. None when every rank made the same calls."""
    # >>> exercise: divergence
    at = {rank: {call[0]: call[1:] for call in calls} for rank, calls in records.items()}
    for seq in sorted({call[0] for calls in records.values() for call in calls}):
        here = {rank: calls.get(seq) for rank, calls in at.items()}
        usual, votes = Counter(here.values()).most_common(1)[0]
        if votes == len(here):
            continue  # every rank made this call alike
        odd = min(rank for rank, call in here.items() if call != usual)
        mine = here[odd]
        later = {call[6] for rank, calls in records.items() if rank != odd for call in calls if call[0] > seq}
        if mine is None or (mine[5] != usual[5] and mine[5] in later):
            return odd, seq, "skip"
        return odd, seq, next((f for f, a, b in zip(FIELDS, mine, usual) if a != b), "site")
    return None
    # <<< exercise: divergence


def planted_records(template, world, R, fault):
    """A world of `world` ranks that made this run's world collectives (`template`: one rank's), with
    one fault on rank R as --fault plants it: what a hung run's records would hold, without the hang."""
    records = {rank: [tuple(call) for call in template] for rank in range(world)}
    k = PER_STEP * FAULT_STEP + (PER_STEP if fault == "root" else 1)
    mine = []
    for call in records[R]:
        seq, op, dtype, count, root, comm, site = call
        if seq == k and fault == "skip":
            continue
        if seq > k and fault == "skip":
            seq -= 1
        if seq == k:
            op, dtype, count, root = {"op": ("all_gather", dtype, count * world, root),
                                      "count": (op, dtype, count // 2, root),
                                      "dtype": (op, "float64", count, root),
                                      "root": (op, dtype, count, 1)}.get(fault, (op, dtype, count, root))
        mine.append((seq, op, dtype, count, root, comm, site))
    records[R] = mine
    return records, k


def reading(ctx, entries, R):
    """Your first_divergence on the clean run's records and on each fault planted in them (on paper)."""
    template = [(e["seq"], e["op"], e["dtype"], e["count"], e["root"], e["comm"], e["site"])
                for e in entries if e["kind"] == "coll" and e["comm"] == "world"]
    world = max(ctx.world_size, 3)  # three ranks at least: the odd one out needs two that agree
    clean = first_divergence({rank: list(template) for rank in range(world)})
    cases = []
    for fault in ("skip", "op", "count", "dtype", "root"):
        records, k = planted_records(template, world, R, fault)
        got = first_divergence(records) or (None, None, None)
        cases.append({"fault": fault, "want_rank": R, "want_seq": k, "want_field": fault,
                      "rank": got[0], "seq": got[1], "field": got[2]})
    return ("none" if clean is None else list(clean)), cases


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
    """Seconds per call: a 1-item all-reduce bare and recorded, and the recording alone."""
    one = zeros(1, "float32")

    def bare():
        calls["all_reduce"](one)

    def recorded():
        with rec.call("all_reduce", one):
            calls["all_reduce"](one)
    out = {}
    for name, fn in (("bare", bare), ("recorded", recorded), ("bare", bare), ("recorded", recorded)):
        ctx.comm.Barrier()
        t0 = timing.now(sync)
        for _ in range(COST_ITERS):
            fn()
        out[name] = min(out.get(name, 1e9), (timing.now(sync) - t0) / COST_ITERS)
    t0 = timing.now(timing.HOST)
    for _ in range(10 * COST_ITERS):
        rec.end(rec.begin("cost", "p2p", one, comm="local"))  # as any call, no communicator
    out["record"] = (timing.now(timing.HOST) - t0) / (10 * COST_ITERS)
    return out


def main():
    parser = bootstrap.lesson_parser(__file__, __doc__)
    parser.add_argument("--fault", choices=FAULTS, default="none", help="the fault to plant on rank R")
    parser.add_argument("--fault-rank", type=bootstrap.nonneg_int, default=1, metavar="R",
                        help="the rank that gets the fault (default 1)")
    args, ctx = bootstrap.start(__file__, parser)
    n, rank, R = ctx.world_size, ctx.rank, args.fault_rank
    if n < 2 or R >= n:
        ctx.fail(f"--fault-rank {R} needs NP >= 2 and R < NP (NP = {n})")
    from mpi4py import MPI  # bootstrap has joined the world
    rec, device_sync = flight.get(), timing.syncer(ctx)

    def sync():  # the GPU finished what this rank queued: its enqueued calls are completed
        device_sync()
        rec.synced()
    members = sorted((R, partner(R, n)))
    sub = subgroup(ctx, members)
    calls = torch_calls(ctx, sub) if ctx.api == "torch" else mpi_calls(ctx, sub)
    zeros, host = arrays(ctx)
    seq = PER_STEP * FAULT_STEP + (PER_STEP if args.fault == "root" else 1)
    ctx.params = {"fault": args.fault, "fault_rank": R, "fault_peer": partner(R, n), "fault_seq": seq,
                  "fault_field": FIELD.get(args.fault, "none"), "count": COUNT, "steps": STEPS}
    if rank == 0 and args.fault in FIELD:  # tell the runner: end it once stuck, then grade the diagnosis
        flight.plant(n, STUCK_S, ctx.params)
    report.section(ctx, f"a training job, {STEPS} steps, fault: {args.fault}"
                        + (f" on rank {R} in step {FAULT_STEP}" if args.fault != "none" else ""))
    t0 = timing.now(sync)
    job(ctx, args, calls, rec, zeros, host, sync)
    seconds = timing.now(sync) - t0
    entries = [e for e in rec.entries() if e["comm"] != "local"]
    everyone = ctx.comm.gather(entries, root=0)
    slow = ctx.comm.bcast(arrivals(everyone) if rank == 0 else None, root=0)
    report.say(ctx, f"{len(entries)} calls recorded, {sum(e['state'] != 'completed' for e in entries)} "
                    f"not completed; the job took {seconds:.2f} s")
    if rank == 0:
        print("rank 0's record, last 6 calls:")
        print(report.table(["#", "op", "dtype", "count", "root/peers", "comm", "state", "at"],
                           [(e["seq"], e["op"], e["dtype"], e["count"], e["peers"] or
                             (e["root"] if e["root"] >= 0 else ""), e["comm"], e["state"], e["site"])
                            for e in entries[-6:]]))
    if args.fault == "straggler":
        report.section(ctx, "slow, not stuck: who arrived last at the collectives")
        if rank == 0:
            print(f"rank {slow[0]} arrived last; the others waited {slow[1]:.2f} s for it\n"
                  "(from the median arrival to its own, summed over the world collectives)", flush=True)
    clean, cases = reading(ctx, entries, R) if args.fault == "none" else ("none", [])
    if cases:
        report.section(ctx, "your reading: first_divergence on these records, each fault planted on paper")
        if rank == 0:
            print(f"the clean run: {'nothing to report' if clean == 'none' else clean}")
            print(report.table(["fault", "planted (rank, #k, field)", "yours", ""],
                               [(c["fault"], f"{c['want_rank']}, #{c['want_seq']}, {c['want_field']}",
                                 f"{c['rank']}, #{c['seq']}, {c['field']}",
                                 "ok" if (c["rank"], c["seq"], c["field"]) ==
                                 (c["want_rank"], c["want_seq"], c["want_field"]) else "WRONG")
                                for c in cases]))
    c = {"record": 0.0, "bare": 0.0, "recorded": 0.0}
    if args.fault == "none":  # a planted fault's record is the runner's to read: not overwritten
        report.section(ctx, f"what recording costs ({COST_ITERS} calls each, best of 2)")
        c = cost(ctx, calls, rec, zeros, sync)
        worst = {k: ctx.comm.allreduce(v, op=MPI.MAX) for k, v in c.items()}  # the slowest rank's
        if rank == 0:  # the slowest rank's figures, the same on every rank
            print(f"recording alone: {worst['record'] * 1e6:.1f} us per call (slowest rank)\n"
                  f"an all-reduce of 1 float: {worst['bare'] * 1e6:.1f} us bare, "
                  f"{worst['recorded'] * 1e6:.1f} us recorded"
                  + (" and checked (--debug-collectives)" if args.debug_collectives else ""), flush=True)
    report.finish(ctx, {"calls": len(entries), "open": sum(e["state"] != "completed" for e in entries),
                        "record_us": c["record"] * 1e6, "bare_us": c["bare"] * 1e6,
                        "recorded_us": c["recorded"] * 1e6, "clean_reading": clean, "reading": cases},
                  summary={"slowest_rank": slow[0], "slow_s": slow[1], "seconds": seconds})


if __name__ == "__main__":
    main()
