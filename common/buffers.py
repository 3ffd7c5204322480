"""One array, three homes: a NumPy array (mpi4py on CPU), a CuPy array (NCCL), a torch tensor.

    x = buffers.on_device(ctx, np.arange(8.0))   # the API's own buffer, same values
    y = buffers.empty(ctx, 8, np.float64)         # an uninitialised receive buffer
    x = buffers.seeded(SEED + rank, count, "float32")   # each rank's own reproducible data
    buffers.to_host(y)                            # back to NumPy, for printing and checks
    xp = buffers.array_module(ctx)                # numpy, cupy or torch: the math written once

torch and CuPy are imported only on the paths that use them, so an mpi4py CPU run never loads them.
On torch + CPU the tensor shares the NumPy array's memory, so tracemalloc still sees its bytes.
"""
import numpy as np


def seeded(seed, count, dtype, small_ints=False):
    """Test data: floats in [0, 1) (so the sum is also the sum of |x|), ints in [-1000, 1000);
    small_ints: 0..7 in any dtype, so every sum is exact whatever the order of additions."""
    rng = np.random.default_rng(seed)
    if small_ints:
        return rng.integers(0, 8, count).astype(dtype)
    if np.dtype(dtype).kind == "i":
        return rng.integers(-1000, 1000, count).astype(dtype)
    return rng.random(count).astype(dtype)


def array_module(ctx):
    """The module whose arrays this run computes on: numpy (CPU), cupy (NCCL) or torch (either
    device). torch gets one thread per rank: N ranks with a thread pool each fight over the cores."""
    if ctx.api == "torch":
        import torch
        torch.set_num_threads(1)
        return torch
    if ctx.device == "gpu":
        import cupy
        return cupy
    return np


def on_device(ctx, a):
    """The API's buffer holding NumPy array `a` (shared, not copied, where the API allows)."""
    if ctx.api == "torch":
        import torch
        t = torch.from_numpy(np.ascontiguousarray(a))
        return t.cuda() if ctx.device == "gpu" else t
    if ctx.device == "gpu":
        import cupy
        return cupy.asarray(a)
    return a


def empty(ctx, count, dtype):
    """An uninitialised receive buffer of `count` items, allocated where the API communicates."""
    if ctx.device == "gpu":
        if ctx.api == "torch":
            import torch
            return torch.empty(count, dtype=getattr(torch, np.dtype(dtype).name), device="cuda")
        import cupy
        return cupy.empty(count, dtype=dtype)
    return on_device(ctx, np.empty(count, dtype=dtype))


def to_host(x):
    """A NumPy copy (or the array itself) of a NumPy, CuPy or torch buffer."""
    if isinstance(x, np.ndarray):
        return x
    if type(x).__module__.startswith("torch"):
        return x.detach().cpu().numpy()
    return x.get()  # cupy: device to host


def nccl_dtype(x):
    """The cupy.cuda.nccl datatype constant for CuPy array `x`."""
    from cupy.cuda import nccl
    return {"float32": nccl.NCCL_FLOAT32, "float64": nccl.NCCL_FLOAT64,
            "int32": nccl.NCCL_INT32, "int64": nccl.NCCL_INT64}[x.dtype.name]


def size(x):
    """Number of items in a NumPy, CuPy or torch buffer."""
    return x.numel() if hasattr(x, "numel") else x.size


def nbytes(x):
    """Bytes in a NumPy, CuPy or torch buffer."""
    return x.numel() * x.element_size() if hasattr(x, "numel") else x.nbytes
