"""Point-to-point inside a sub-communicator, and a meter of what each send crossed (lesson 15).

    be = subgroups.backend(ctx, sub)          # sub: an MPI communicator (comm.Split) or a torch group
    be.exchange(out, into, dest, source)      # (dist.new_group); dest, source: ranks *inside* sub
    meter = subgroups.Meter(home, home[rank]) # home[w]: the node world rank w really runs on
    inner = meter.wrap(be, members)           # members[i]: the world rank of sub's rank i
    with meter.phase("reduce-scatter"):
        lesson_09.reduce_scatter(inner, ...)
    meter.sent("reduce-scatter")              # {"steps", "inside", "across"}: calls, bytes sent

    mpi4py, cpu:  common/p2p's MPI backend on `sub` (Sendrecv with sub's own rank numbers)
    mpi4py, gpu:  an NCCL communicator over `sub` (its unique id broadcast over sub): collective
    torch:        dist.batch_isend_irecv of P2POp(..., group=sub, group_peer=i): torch numbers peers
                  by world rank unless told the group's number

The meter counts with common/counting.py, one counter for sends that stay on this rank's node and one
for sends that leave it, chosen by where the destination really is, not by what the caller believes:
a sub-communicator built from wrong node ids is seen sending across nodes.
"""
import contextlib
import types

from common import bootstrap, counting, p2p, timing


def backend(ctx, sub):
    if ctx.api == "torch":
        return _torch(ctx, sub)
    if ctx.device == "gpu":
        return p2p.nccl_backend(types.SimpleNamespace(nccl=bootstrap.nccl_comm(sub), device="gpu",
                                                      api="mpi4py"))
    return p2p.mpi_backend(types.SimpleNamespace(comm=sub))


def _torch(ctx, group):
    import torch
    import torch.distributed as dist
    if ctx.device == "gpu":  # nccl: the group's first call is one every member joins, then p2p batches
        dist.all_reduce(torch.zeros(1, device="cuda"), group=group)

    def batch(sends, recvs):
        ops = [dist.P2POp(dist.isend, buf, group=group, group_peer=peer) for buf, peer in p2p._nonempty(sends)]
        ops += [dist.P2POp(dist.irecv, buf, group=group, group_peer=peer) for buf, peer in p2p._nonempty(recvs)]
        for req in dist.batch_isend_irecv(ops) if ops else []:
            req.wait()
    return types.SimpleNamespace(exchange=lambda out, into, dest, source: batch([(out, dest)], [(into, source)]),
                                 group=batch, sync=timing.syncer(ctx))


class Meter:
    """Every send of the backends it wraps, counted per phase as inside this rank's node or across."""

    def __init__(self, home, mine):
        self.home, self.mine, self._counters = list(home), mine, []

    def wrap(self, be, members):
        """A backend with exchange() and sync() whose sends are counted; members: sub rank -> world."""
        plain = types.SimpleNamespace(exchange=be.exchange, sync=be.sync)
        inside, across = counting.Counted(plain, len(members)), counting.Counted(plain, len(members))
        self._counters.append((inside, across))
        members = list(members)

        def exchange(out, into, dest, source):
            (inside if self.home[members[dest]] == self.mine else across).exchange(out, into, dest, source)
        return types.SimpleNamespace(exchange=exchange, sync=be.sync)

    @contextlib.contextmanager
    def phase(self, label):
        with contextlib.ExitStack() as stack:
            for pair in self._counters:
                for counted in pair:
                    stack.enter_context(counted.phase(label))
            yield

    def sent(self, label):
        """{"steps": exchange calls, "inside": bytes to this node, "across": bytes to other nodes}."""
        out = {"steps": 0, "inside": 0, "across": 0}
        for inside, across in self._counters:
            for key, counted in (("inside", inside), ("across", across)):
                out["steps"] += counted.total([label], field="calls")
                out[key] += counted.total([label])
        return out
