"""Lesson 00 — hello, ranks: who am I, a first all-reduce, and communicators split in two.

What to watch for:
  * every rank is its own process: its own rank, local_rank (its index on this node) and device;
  * MPI splits the world by node (the ranks that share memory): on two nodes of 2 ranks, 2 + 2;
  * the API numbers its processes 0..N-1, each id once (torch and NCCL take MPI's numbering here);
  * an all-reduce of the rank ids leaves the same sum, N(N-1)/2, on every rank;
  * splitting the world into two halves gives each half its own communicator: the same all-reduce
    inside a half only sums that half's ranks, and each rank gets a new id inside its half, ordered
    by the key it passed;
  * on a GPU, NCCL is bootstrapped over MPI: rank 0 makes a unique id, MPI broadcasts it, every rank
    joins with it. The lesson shows that handshake step by step.

Run it:
  make lesson-00 NP=4                       (or API=torch)
  .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py lessons/00_hello.py --api mpi4py

Practice it: `bin/tutor practice 00` writes practice/00_hello.py with split_in_halves left for you;
`bin/tutor check 00 --mine` checks your copy, `bin/tutor hint 00` helps.
Read next: lesson 01, send and receive between two ranks (and a deadlock). What it prints: hello/show.py.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import numpy as np  # noqa: E402

from common import bootstrap, report  # noqa: E402
from lessons.hello import show  # noqa: E402


def allreduce_sum(ctx, value, group=None):
    """Sum one integer over the ranks of `group` (an MPI comm, a torch group or an NCCL comm)."""
    if ctx.api == "torch":
        import torch
        import torch.distributed as dist
        t = torch.tensor([value], dtype=torch.int64, device="cuda" if ctx.device == "gpu" else "cpu")
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
        return int(t.item())
    if ctx.device == "gpu":
        import cupy
        from cupy.cuda import nccl
        x = cupy.array([value], dtype=cupy.int64)
        y = cupy.empty_like(x)
        stream = cupy.cuda.get_current_stream()
        group.allReduce(x.data.ptr, y.data.ptr, 1, nccl.NCCL_INT64, nccl.NCCL_SUM, stream.ptr)
        stream.synchronize()  # nccl is asynchronous: wait before the host reads y
        return int(y.get()[0])
    from mpi4py import MPI
    x = np.array([value], dtype=np.int64)
    y = np.empty_like(x)
    group.Allreduce(x, y, op=MPI.SUM)
    return int(y[0])


def rank_in(ctx, group):
    """This process's id as `group` numbers it (an MPI comm, a torch group or None, an NCCL comm)."""
    if ctx.api == "torch":
        import torch.distributed as dist
        return dist.get_rank(group)  # -1 for a group this rank is not in
    return group.rank_id() if ctx.device == "gpu" else group.Get_rank()


def split_in_halves(ctx, half):
    """A communicator for my half of the world, in the chosen API's own terms."""
    # half 0 is ranks 0..ceil(N/2)-1; torch returns (its group, []), MPI leaves its communicator in `sub`
    # >>> exercise: split_in_halves
    lower = list(range((ctx.world_size + 1) // 2))
    upper = list(range(len(lower), ctx.world_size))
    if ctx.api == "torch":
        import torch.distributed as dist
        # every rank must create every group, in the same order, even groups it is not in
        groups = [dist.new_group(ranks=lower), dist.new_group(ranks=upper) if upper else None]
        return groups[half], []
    sub = ctx.comm.Split(color=half, key=ctx.rank)  # an MPI communicator per color
    # <<< exercise: split_in_halves
    if ctx.device != "gpu":
        return sub, []
    steps = []
    comm = bootstrap.nccl_comm(sub, log=steps.append)  # unique id from sub-rank 0, over MPI
    steps.append(f"NcclCommunicator({sub.size}, uid, {sub.rank}) joined")
    return comm, steps


def ranks_on_my_node(ctx):
    """The world ranks on this rank's node: MPI splits the world by the memory its processes share."""
    from mpi4py import MPI
    node = ctx.comm.Split_type(MPI.COMM_TYPE_SHARED, key=ctx.rank)  # local_rank is my id in `node`
    ranks = node.allgather(ctx.rank)
    node.Free()
    return ranks


def flags():
    return bootstrap.lesson_parser(__file__, __doc__)  # the kit's own flags: --api, --device, --json


def main():
    args, ctx = bootstrap.start(__file__, flags())
    n = ctx.world_size

    report.section(ctx, f"1. who am I  ({n} ranks, api {ctx.api})")
    world = None if ctx.api == "torch" else (ctx.nccl if ctx.device == "gpu" else ctx.comm)
    my_id = rank_in(ctx, world)  # the id the chosen API gives me, not MPI's (unless MPI is the API)
    node_ranks = ranks_on_my_node(ctx)                               # the ranks sharing my node's memory
    distinct = len({i for i in ctx.comm.allgather(my_id) if 0 <= i < n})  # ids in 0..N-1, each once
    show.who_am_i(ctx, my_id, node_ranks, distinct)                  # my ids, one line per node

    report.section(ctx, "2. all-reduce (SUM) of the rank ids: every rank should get N(N-1)/2")
    rank_sum = allreduce_sum(ctx, ctx.rank, world)
    report.say(ctx, f"sum of ranks = {rank_sum}   (formula {n}*{n - 1}/2 = {n * (n - 1) // 2})")
    assert rank_sum == n * (n - 1) // 2, "the all-reduce gave a wrong sum"

    m = (n + 1) // 2
    half = 0 if ctx.rank < m else 1
    show.halves(ctx, m)                                              # 3. the world cut in two
    group, steps = split_in_halves(ctx, half)                        # the exercise
    half_sum, sub_rank = allreduce_sum(ctx, ctx.rank, group), rank_in(ctx, group)
    members = range(m) if half == 0 else range(m, n)
    show.my_half(ctx, half, sub_rank, half_sum, sum(members), steps)
    assert half_sum == sum(members), (
        f"the all-reduce inside the half gave a wrong sum: rank {ctx.rank} got {half_sum}, want "
        f"{sum(members)}, the sum of ranks {members.start}..{members.stop - 1}: those ranks, and "
        "only they, must share a color (a group)")

    report.finish(ctx, {"world_size": n, "api_rank": my_id, "sub_rank": sub_rank,
                        "local_rank": ctx.local_rank, "node_ranks": node_ranks, "host": ctx.host,
                        "device": ctx.device,
                        "transport": ctx.transport, "rank_sum": rank_sum, "half": half, "half_sum": half_sum},
                  summary={"halves": 2 if n > 1 else 1, "distinct_ids": distinct})


if __name__ == "__main__":
    main()
