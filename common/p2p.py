"""Point-to-point primitives per API, the bricks the hand-made collectives (lessons 05, 07) stand on.

    be = p2p.backend(ctx)
    be.exchange(out, into, dest, source)   # send `out` to dest while receiving `into` from source
    be.group([(buf, dest)], [(buf, source)])   # any number of sends and receives, all in flight at once
    h = be.start([(buf, dest)], [(buf, source)])   # the same, but it returns at once: work, then
    h.wait()                               # wait before touching those buffers (send or receive) again
    be.allreduce(buf)                      # the library's own all-reduce (SUM, in place), to race or check
    be.sync()                              # gpu: wait for queued work (timing.syncer) before the host reads

    mpi4py, cpu:  comm.Sendrecv / comm.Send / comm.Recv; Isend + Irecv + Request.Waitall for a group
    mpi4py, gpu:  ncclSend + ncclRecv between nccl.groupStart() and groupEnd() (CuPy arrays)
    torch:        dist.batch_isend_irecv of P2POps (gloo on cpu, nccl on gpu)

start() is the non-blocking group, for overlapping a transfer with compute (lesson 13):
    mpi4py, cpu:  comm.Isend / comm.Irecv return requests; wait() is Request.Waitall
    mpi4py, gpu:  the grouped ncclSend / ncclRecv go on a communication stream of their own, which first
                  waits (an event) for what the compute stream queued so far; wait() makes the compute
                  stream wait for an event recorded after the group: the GPU orders it, the host never
                  blocks
    torch:        dist.batch_isend_irecv's works; wait() waits each (on nccl: the current stream waits)
Between start() and wait() a send buffer must not be written and a receive buffer not read.

Empty buffers are skipped on both sides (gloo rejects empty tensors), so both sides must agree on the
sizes; messages between the same two ranks match in the order they are posted (NCCL has no tags).
"""
import functools
import types

from common import buffers, timing
from common.plumbing import recorded


def _has(buf):
    return buf is not None and buffers.size(buf) > 0


def _nonempty(pairs):
    return [(buf, peer) for buf, peer in pairs if _has(buf)]


class Started:
    """A started transfer: wait() returns once it is done (on the GPU: once the compute stream is
    ordered after it). It keeps its buffers alive until then; a second wait() does nothing."""

    def __init__(self, finish, buffers):
        self._finish, self._buffers = finish, buffers

    def wait(self):
        if self._finish is not None:
            self._finish()
            self._finish = self._buffers = None


def mpi_backend(ctx):
    from mpi4py import MPI
    comm = ctx.comm

    def exchange(out, into, dest, source):  # the timed hot path of lessons 05 and 07: no lists
        if _has(out):
            if _has(into):
                comm.Sendrecv(out, dest=dest, recvbuf=into, source=source)
            else:
                comm.Send(out, dest=dest)
        elif _has(into):
            comm.Recv(into, source=source)

    def group(sends, recvs):
        reqs = [comm.Isend(buf, dest=peer) for buf, peer in _nonempty(sends)]
        reqs += [comm.Irecv(buf, source=peer) for buf, peer in _nonempty(recvs)]
        MPI.Request.Waitall(reqs)

    def start(sends, recvs):
        reqs = [comm.Isend(buf, dest=peer) for buf, peer in _nonempty(sends)]
        reqs += [comm.Irecv(buf, source=peer) for buf, peer in _nonempty(recvs)]
        return Started(functools.partial(MPI.Request.Waitall, reqs), (sends, recvs))

    def allreduce(buf):
        comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
    return types.SimpleNamespace(exchange=exchange, group=group, start=start, allreduce=allreduce,
                                 sync=timing.HOST)


def nccl_backend(ctx):
    import cupy
    from cupy.cuda import nccl
    stream = cupy.cuda.get_current_stream()

    def group(sends, recvs):
        nccl.groupStart()  # grouped: every send and recv progresses together, none blocks another
        for buf, peer in _nonempty(sends):
            ctx.nccl.send(buf.data.ptr, buf.size, buffers.nccl_dtype(buf), peer, stream.ptr)
        for buf, peer in _nonempty(recvs):
            ctx.nccl.recv(buf.data.ptr, buf.size, buffers.nccl_dtype(buf), peer, stream.ptr)
        nccl.groupEnd()

    comm_stream = []  # made on first start(): a stream that never waits for the compute stream on its own

    def start(sends, recvs):
        if not comm_stream:
            comm_stream.append(cupy.cuda.Stream(non_blocking=True))
        side = comm_stream[0]
        side.wait_event(stream.record())  # the sends read what compute wrote; receives overwrite what it read
        nccl.groupStart()
        for buf, peer in _nonempty(sends):
            ctx.nccl.send(buf.data.ptr, buf.size, buffers.nccl_dtype(buf), peer, side.ptr)
        for buf, peer in _nonempty(recvs):
            ctx.nccl.recv(buf.data.ptr, buf.size, buffers.nccl_dtype(buf), peer, side.ptr)
        nccl.groupEnd()
        done = side.record()
        return Started(lambda: stream.wait_event(done), (sends, recvs))  # the GPU waits, not the host

    def allreduce(buf):
        ctx.nccl.allReduce(buf.data.ptr, buf.data.ptr, buf.size, buffers.nccl_dtype(buf), nccl.NCCL_SUM,
                           stream.ptr)
    return types.SimpleNamespace(exchange=lambda out, into, dest, source: group([(out, dest)], [(into, source)]),
                                 group=group, start=start, allreduce=allreduce, sync=timing.syncer(ctx))


def torch_backend(ctx):
    import torch
    import torch.distributed as dist

    def group(sends, recvs):
        ops = [dist.P2POp(dist.isend, buf, peer) for buf, peer in _nonempty(sends)]
        ops += [dist.P2POp(dist.irecv, buf, peer) for buf, peer in _nonempty(recvs)]
        for req in dist.batch_isend_irecv(ops) if ops else []:
            req.wait()

    def start(sends, recvs):
        ops = [dist.P2POp(dist.isend, buf, peer) for buf, peer in _nonempty(sends)]
        ops += [dist.P2POp(dist.irecv, buf, peer) for buf, peer in _nonempty(recvs)]
        works = dist.batch_isend_irecv(ops) if ops else []
        return Started(lambda: [work.wait() for work in works], (sends, recvs))

    def allreduce(buf):
        dist.all_reduce(buf, op=dist.ReduceOp.SUM)
    if ctx.device == "gpu":
        dist.all_reduce(torch.zeros(1, device="cuda"))  # nccl: let every rank join before any p2p batch
    return types.SimpleNamespace(exchange=lambda out, into, dest, source: group([(out, dest)], [(into, source)]),
                                 group=group, start=start, allreduce=allreduce, sync=timing.syncer(ctx))


def backend(ctx):
    """The ctx's backend, each call recorded by this rank's flight recorder (common/plumbing/recorded.py)."""
    if ctx.api == "torch":
        return recorded.wrap(torch_backend(ctx))
    return recorded.wrap(nccl_backend(ctx) if ctx.device == "gpu" else mpi_backend(ctx))
