"""Every wall clock a lesson reads, read after the GPU has finished what this rank queued on it.

    sync = timing.syncer(ctx)        # cudaDeviceSynchronize on a GPU run, nothing on the CPU
    t0 = timing.now(sync)
    ...work...
    seconds = timing.now(sync) - t0  # the work, not just its launch
    timing.now(timing.HOST)          # code that ran on the host alone says so

A GPU call returns once its work is queued, so a clock read straight after it measures the launch.
Lessons read clocks only through here (tests/test_timing.py holds them to it); a deadline that is not
a measurement uses timing.deadline().
"""
import os
import time


def usable_cores():
    """The cores this process may run on (its affinity mask where the OS has one), not the machine's
    total: what a timing's ranks share."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def HOST():
    """The sync of host-only work: nothing is queued anywhere, so nothing to wait for."""


def syncer(ctx):
    """A callable that returns once every stream of this rank's GPU is idle (a no-op on the CPU).

    One device-wide sync covers NCCL's streams, CuPy's and torch's alike: they share the device."""
    if ctx.device != "gpu":
        return HOST
    if ctx.api == "torch":
        import torch
        return torch.cuda.synchronize
    import cupy
    return lambda: cupy.cuda.Device().synchronize()


def now(sync):
    """Seconds on the performance clock, read after sync() returned."""
    sync()
    return time.perf_counter()


def deadline(seconds):
    """A function that says how many seconds are left (<= 0 once the deadline has passed)."""
    end = time.monotonic() + seconds
    return lambda: end - time.monotonic()


BATCHES = 3  # best_of: the best of this many interleaved batches


def best_of(ctx, be, fns, warmup, iters, spread=None):
    """{name: seconds}: each fn timed in BATCHES interleaved batches (bandwidth.time_op: the slowest
    rank's mean), the best batch kept, so a burst of load from elsewhere hits every contender alike.
    If `spread` is a dict it gets each name's slowest minus fastest batch: how much this run's own
    timings wander (a difference smaller than that is noise)."""
    from common import bandwidth  # bandwidth reads its clocks through this module
    batches = {name: [] for name in fns}
    for b in range(BATCHES):
        for name, fn in fns.items():
            batches[name].append(bandwidth.time_op(ctx.comm, fn, warmup if b == 0 else 0, iters, be.sync))
    if spread is not None:
        spread.update({name: max(ts) - min(ts) for name, ts in batches.items()})
    return {name: min(ts) for name, ts in batches.items()}
