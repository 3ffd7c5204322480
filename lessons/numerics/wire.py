"""One dtype, each API's way: the buffers lesson 17 sums, the add the ring makes, the library's sum.

    kind = wire.kind(ctx, "bfloat16", be)
    buf = kind.put(x)           # float64 values -> this API's buffer of the dtype (via float32)
    kind.get(buf)               # -> float64 NumPy
    kind.add(dst, src)          # in place, rounded to the dtype (lesson 05's ring calls it)
    kind.allreduce(buf)         # the library's all-reduce (SUM, in place)
    kind.widen(buf)             # -> float32 buffer;  kind.narrow(acc) -> the dtype again

mpi4py: NumPy float32 / float16 (MPI sums them: MPI_FLOAT, and MPICH's float16 type); bfloat16 as uint16
bit patterns (lessons/numerics/bf16.py), summed by a user-defined MPI.Op, since MPI has no bfloat16.
torch: torch.float32 / bfloat16 / float16 tensors, and dist.all_reduce (gloo) sums them itself.
"""
import types

import numpy as np

from lessons.numerics import bf16

DTYPES = ("float32", "bfloat16", "float16")
ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}


def host(dtype):
    """NumPy's kind (the one-process sums of the lesson use it, on any API)."""
    if dtype == "bfloat16":
        return types.SimpleNamespace(put=lambda x: bf16.encode(np.asarray(x, np.float64).astype(np.float32)),
                                     get=lambda b: bf16.decode(b).astype(np.float64), add=bf16.add,
                                     widen=bf16.decode, narrow=bf16.encode,
                                     zeros=lambda n: np.zeros(n, np.uint16))
    return types.SimpleNamespace(put=lambda x: np.asarray(x, np.float64).astype(np.float32).astype(dtype),
                                 get=lambda b: np.asarray(b).astype(np.float64), add=_inplace_add,
                                 widen=lambda b: b.astype(np.float32), narrow=lambda a: a.astype(dtype),
                                 zeros=lambda n: np.zeros(n, dtype))


def _inplace_add(dst, src):
    dst += src


def kind(ctx, dtype, be):
    if ctx.api == "torch":
        return _torch(dtype)
    k = host(dtype)
    if dtype == "bfloat16":
        from mpi4py import MPI

        def allreduce(buf):
            op = bf16.mpi_sum()
            ctx.comm.Allreduce(MPI.IN_PLACE, buf, op=op)  # the library's order, our bfloat16 add
            op.Free()
        k.allreduce = allreduce
    else:
        k.allreduce = be.allreduce  # comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
    return k


def _torch(dtype):
    import torch
    import torch.distributed as dist
    dt = getattr(torch, dtype)
    return types.SimpleNamespace(put=lambda x: torch.from_numpy(np.asarray(x, np.float64).astype(np.float32)).to(dt),
                                 get=lambda t: t.double().numpy(), add=_inplace_add,
                                 allreduce=lambda t: dist.all_reduce(t, op=dist.ReduceOp.SUM),
                                 widen=lambda t: t.float(), narrow=lambda a: a.to(dt),
                                 zeros=lambda n: torch.zeros(n, dtype=dt))
