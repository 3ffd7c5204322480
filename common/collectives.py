"""The library's own reduce-scatter, all-gather and all-to-all, per API: what lesson 09 races against.

    lib = collectives.library(ctx)
    lib.reduce_scatter(out, inp, counts)      # out (counts[rank] items) = sum over ranks of block rank
    lib.all_gather(out, inp, counts)          # out (sum(counts) items) = every rank's inp, rank order
    lib.all_to_all(out, inp, out_counts, inp_counts)   # inp_counts[j] items to rank j; out from each
    lib.missing                               # {operation: one line}: what this library lacks, and
                                              # what stands in for it here
    lib.rules                                 # counting rules where the library's algorithm sends
                                              # other than a ring: Counted(lib, n, rules=lib.rules)
    lib.on_sockets                            # True where a call's bytes are this process's socket
                                              # writes (gloo): wire_bytes(comm, lib, calls) measures them
Block r of a buffer is items sum(counts[:r]) .. sum(counts[:r+1]). Output first, input second, as in
torch.distributed's calls (and common/counting.py's rules). Every rank passes the same counts.

    mpi4py, cpu:  comm.Reduce_scatter_block / Reduce_scatter, comm.Allgather / Allgatherv,
                  comm.Alltoall / Alltoallv
    mpi4py, gpu:  NCCL's reduceScatter and allGather (one count for every rank), all-to-all as
                  grouped ncclSend/ncclRecv (NCCL has no all-to-all call in CuPy)
    torch:        dist.reduce_scatter_single / reduce_scatter (a list, for uneven blocks),
                  dist.all_gather_single, dist.all_to_all_single with split sizes
Where a library takes one count for every rank, uneven blocks are padded to the largest and cut
back: `missing` says so. gloo (torch 2.13) has no reduce-scatter of its own: torch clones the input,
all-reduces it whole and copies this rank's block out (both the single and the list form), so it sends
2(N-1)/N of the buffer, an all-reduce's bytes, not (N-1)/N; its all-gather wants equal sizes.
Measured (written() around one call, N = 3, a 12 MiB float32 buffer): reduce_scatter_single wrote
16,779,520 B per rank, all_reduce 16,779,520 B, all_gather_single 8,389,184 B (ring: 16 MiB and 8 MiB).
"""
import types

from common import buffers, timing
from common.plumbing import recorded

# the library's all-reduce, in its own words, by transport: what a hand-made all-reduce races against
ALLREDUCE_NAME = {"mpi": "MPI_Allreduce", "gloo": "gloo all_reduce", "nccl": "ncclAllReduce"}


def bounds(counts):
    """[(start, stop)] of each rank's block: block r is items sum(counts[:r]) .. sum(counts[:r+1])."""
    out, start = [], 0
    for c in counts:
        out.append((start, start + c))
        start += c
    return out


def written():
    """Bytes this process has handed to write-like system calls so far (/proc/self/io's wchar, every
    thread's, sockets included), or None where the file is missing. Around one gloo call with nothing
    else writing, the difference is what gloo sent to its sockets (each message's header included)."""
    try:
        with open("/proc/self/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("wchar:"))
    except (OSError, StopIteration, ValueError):
        return None



def wire_bytes(comm, lib, calls):
    """{name: bytes this rank wrote to its sockets during one call of calls[name]()}, measured where the
    library's traffic is this process's socket writes (lib.on_sockets: gloo); {} elsewhere (MPI's shared
    memory and NCCL make no such writes). Collective over MPI comm: the barrier comes before the first
    reading, so nothing else writes between the two."""
    out = {}
    if not lib.on_sockets or written() is None:
        return out
    for name, fn in calls.items():
        comm.Barrier()
        before = written()
        fn()
        lib.sync()
        out[name] = written() - before
    return out

def _even(counts):
    return len(set(counts)) <= 1


def _padded_reduce_scatter(rs_even, zeros, out, inp, counts, rank):
    """Uneven blocks on a library with one count: pad each block to the largest, reduce, cut back."""
    n, m = len(counts), max(counts)
    pad, mine = zeros(n * m, inp), zeros(m, inp)
    for r, (a, b) in enumerate(bounds(counts)):
        pad[r * m:r * m + b - a] = inp[a:b]
    rs_even(mine, pad, m)
    out[:] = mine[:counts[rank]]


def _padded_all_gather(ag_even, zeros, out, inp, counts, rank):
    n, m = len(counts), max(counts)
    mine, pad = zeros(m, inp), zeros(n * m, inp)
    mine[:counts[rank]] = inp
    ag_even(pad, mine, m)
    for r, (a, b) in enumerate(bounds(counts)):
        out[a:b] = pad[r * m:r * m + b - a]


def mpi_library(ctx):
    from mpi4py import MPI
    comm = ctx.comm

    def reduce_scatter(out, inp, counts):
        if _even(counts):
            comm.Reduce_scatter_block(inp, out, op=MPI.SUM)
        else:
            comm.Reduce_scatter(inp, out, recvcounts=counts, op=MPI.SUM)

    def all_gather(out, inp, counts):
        if _even(counts):
            comm.Allgather(inp, out)
        else:
            comm.Allgatherv(inp, [out, (counts, [a for a, _ in bounds(counts)])])

    def all_to_all(out, inp, out_counts, inp_counts):
        if _even(out_counts) and _even(inp_counts):
            comm.Alltoall(inp, out)
        else:
            comm.Alltoallv([inp, (inp_counts, [a for a, _ in bounds(inp_counts)])],
                           [out, (out_counts, [a for a, _ in bounds(out_counts)])])
    names = {"reduce_scatter": "MPI_Reduce_scatter_block", "all_gather": "MPI_Allgather",
             "all_to_all": "MPI_Alltoall"}
    return types.SimpleNamespace(reduce_scatter=reduce_scatter, all_gather=all_gather,
                                 all_to_all=all_to_all, missing={}, names=names, sync=timing.HOST,
                                 rules={}, on_sockets=False)


def nccl_library(ctx):
    import cupy
    from cupy.cuda import nccl
    stream, rank = cupy.cuda.get_current_stream(), ctx.rank

    def zeros(count, like):
        return cupy.zeros(count, dtype=like.dtype)

    def rs_even(out, inp, count):
        ctx.nccl.reduceScatter(inp.data.ptr, out.data.ptr, count, buffers.nccl_dtype(inp), nccl.NCCL_SUM,
                               stream.ptr)

    def ag_even(out, inp, count):
        ctx.nccl.allGather(inp.data.ptr, out.data.ptr, count, buffers.nccl_dtype(inp), stream.ptr)

    def reduce_scatter(out, inp, counts):
        if not max(counts, default=0):
            return  # nothing anywhere
        if _even(counts):
            rs_even(out, inp, counts[0])
        else:
            _padded_reduce_scatter(rs_even, zeros, out, inp, counts, rank)

    def all_gather(out, inp, counts):
        if not max(counts, default=0):
            return
        if _even(counts):
            ag_even(out, inp, counts[0])
        else:
            _padded_all_gather(ag_even, zeros, out, inp, counts, rank)

    def all_to_all(out, inp, out_counts, inp_counts):
        nccl.groupStart()  # grouped: every send and receive is in flight at once, none waits for another
        for peer, ((a, b), (c, d)) in enumerate(zip(bounds(inp_counts), bounds(out_counts))):
            if b > a:
                ctx.nccl.send(inp[a:b].data.ptr, b - a, buffers.nccl_dtype(inp), peer, stream.ptr)
            if d > c:
                ctx.nccl.recv(out[c:d].data.ptr, d - c, buffers.nccl_dtype(out), peer, stream.ptr)
        nccl.groupEnd()
    missing = {"reduce_scatter": "NCCL's reduceScatter takes one count: uneven blocks padded to the largest",
               "all_gather": "NCCL's allGather takes one count: uneven blocks padded to the largest",
               "all_to_all": "no all-to-all call in CuPy's NCCL: grouped ncclSend/ncclRecv, one per peer"}
    names = {"reduce_scatter": "ncclReduceScatter", "all_gather": "ncclAllGather",
             "all_to_all": "grouped ncclSend/Recv"}
    return types.SimpleNamespace(reduce_scatter=reduce_scatter, all_gather=all_gather,
                                 all_to_all=all_to_all, missing=missing, names=names,
                                 sync=timing.syncer(ctx), rules={}, on_sockets=False)


def torch_library(ctx):
    import torch
    import torch.distributed as dist
    rank, backend = ctx.rank, dist.get_backend()

    def zeros(count, like):
        return torch.zeros(count, dtype=like.dtype, device=like.device)

    # torch 2.13 names the one-tensor forms *_single (its *_tensor names warn, deprecated); a site's
    # older torch (TUTOR_PYTHON; 2.11 on the GPU node this kit first ran on) has only *_tensor
    rs_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    ag_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

    def reduce_scatter(out, inp, counts):
        if not max(counts, default=0):
            return  # gloo rejects empty tensors; there is nothing to reduce
        if _even(counts):
            rs_single(out, inp, op=dist.ReduceOp.SUM)
        else:
            dist.reduce_scatter(out, list(inp.split(counts)), op=dist.ReduceOp.SUM)

    def ag_even(out, inp, count):
        ag_single(out, inp)

    def all_gather(out, inp, counts):
        if not max(counts, default=0):
            return
        if _even(counts):
            ag_even(out, inp, counts[0])
        else:  # all_gather takes a list of equal tensors on gloo: pad, as FSDP pads its shards
            _padded_all_gather(ag_even, zeros, out, inp, counts, rank)

    def all_to_all(out, inp, out_counts, inp_counts):
        dist.all_to_all_single(out, inp, out_counts, inp_counts)
    missing = {"all_gather": "all_gather_single takes equal blocks: uneven ones padded to the largest"}
    names = {"reduce_scatter": f"{backend} reduce_scatter", "all_gather": f"{backend} all_gather",
             "all_to_all": f"{backend} all_to_all"}
    rules = {}
    if backend == "gloo":  # its traffic is this process's socket writes: written() can measure it
        missing["reduce_scatter"] = ("gloo has no reduce-scatter: torch all-reduces the whole buffer "
                                     "and keeps this rank's block, so it sends an all-reduce's bytes")
        rules["reduce_scatter"] = lambda n, out, inp, *a, **k: 2 * (n - 1) * buffers.nbytes(inp) // n
    return types.SimpleNamespace(reduce_scatter=reduce_scatter, all_gather=all_gather,
                                 all_to_all=all_to_all, missing=missing, names=names,
                                 sync=timing.syncer(ctx), rules=rules, on_sockets=backend == "gloo")


def library(ctx):
    """The ctx's library, each call recorded by this rank's flight recorder (common/plumbing/recorded.py)."""
    if ctx.api == "torch":
        return recorded.wrap(torch_library(ctx))
    return recorded.wrap(nccl_library(ctx) if ctx.device == "gpu" else mpi_library(ctx))
