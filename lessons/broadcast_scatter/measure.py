"""Lesson 03's meters: the payload bytes a rank's schedule sends and receives, the peak bytes it
holds, and the median time of a repeated run."""
import tracemalloc

import numpy as np

from common import buffers, p2p, timing


class PeakBytes:
    """Peak bytes allocated since start(): tracemalloc on CPU (it sees NumPy buffers, and torch
    tensors made with torch.from_numpy), the CUDA allocator's own counters on GPU."""

    def __init__(self, ctx):
        self.ctx = ctx

    def start(self):
        if self.ctx.device != "gpu":
            tracemalloc.start()
        elif self.ctx.api == "torch":
            import torch
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        else:
            import cupy
            self.base, self.peak = cupy.get_default_memory_pool().used_bytes(), 0

    def sample(self):
        """GPU with CuPy keeps no peak: call this where the peak happens (a no-op elsewhere)."""
        if self.ctx.device == "gpu" and self.ctx.api != "torch":
            import cupy
            self.peak = max(self.peak, cupy.get_default_memory_pool().used_bytes() - self.base)

    def stop(self):
        if self.ctx.device != "gpu":
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            return peak
        if self.ctx.api == "torch":
            import torch
            return torch.cuda.max_memory_allocated() - self.base
        self.sample()
        return self.peak


class Wire:
    """The payload bytes this rank's schedule sends and receives, counted as each call is made (what
    crosses the wire, headers aside), around common.p2p's group of sends and receives. `be`: a backend
    made before (making one on torch + NCCL runs an all-reduce: never inside a timed region)."""

    def __init__(self, ctx, be=None):
        self.be, self.sent, self.received = be or p2p.backend(ctx), 0, 0

    def group(self, sends, recvs):
        self.sent += sum(buffers.nbytes(b) for b, _ in sends)
        self.received += sum(buffers.nbytes(b) for b, _ in recvs)
        self.be.group(sends, recvs)


def median_time(ctx, reps, run):
    """Median seconds of `reps` runs, each started together and read after the GPU finished."""
    sync = timing.syncer(ctx)
    times = []
    for _ in range(reps):
        ctx.comm.Barrier()  # start together, so one rank's lateness is not counted as the method's
        t0 = timing.now(sync)
        run()
        times.append(timing.now(sync) - t0)  # sync: a GPU call returns once queued, not done
    return float(np.median(times))
