"""Lesson 06 — the GIL, timed: threads, processes and MPI ranks on the same work, and why PyTorch
runs one process per GPU.

CPython's global interpreter lock (GIL) lets one thread at a time run Python bytecode. C code may
let go of it while it works without touching Python objects: NumPy does for large arrays,
time.sleep and blocking I/O do, and so do communication libraries (mpi4py, torch.distributed) while
they wait. The lesson measures what that means:
  1. a pure-Python loop, a large NumPy operation and a wait (a sleep standing for I/O or a comm call),
     each done serially, by T threads and by P processes (T = P = --workers), inside rank 0;
  2. the same pure-Python work split across the MPI ranks of this run: ranks are processes too;
  3. a pure-Python thread computing while the main thread waits for a message (MPI Recv, dist.recv,
     or on NCCL the CUDA sync that reads it), against a C call that keeps the GIL; 'its cpu ms' shows
     whether the waiting thread slept or spun (a released GIL is not an idle core);
  4. a speedup table against one serial time, and the conclusions these numbers support.

Why one process per GPU (DistributedDataParallel), not one thread per GPU (the old DataParallel):
the Python a training step runs (module calls, loss, optimizer, the loop) holds the GIL, so threads
would take turns on it, as the pure-Python thread column shows. Not backward (autograd's engine runs
in C++), nor data loading (DataLoader's workers are processes already).

What to watch for: pure-Python threads gain nothing (about 1x) while the GIL is on; processes and
ranks scale with the usable cores; NumPy threads and waits overlap; a blocking receive keeps the
compute thread's speed, a wait that holds the GIL stops it; a free-threaded Python (3.13t+) makes
the thread column scale too. On a loaded machine times are noisy: each is the best of --repeat.

Run it:
  make lesson-06 NP=2                       (or API=torch)
  .venv/bin/mpiexec -n 2 .venv/bin/python -m mpi4py lessons/06_gil_timings.py --api mpi4py
Read next: lesson 07 (all-reduce algorithms, built on the exchanges of lesson 05).
"""
import argparse
import ctypes
import ctypes.util
import os
import sys
import sysconfig
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from multiprocessing import get_context

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import numpy as np  # noqa: E402

from common import bootstrap, report, timing  # noqa: E402
from lessons.gil_timings import show  # noqa: E402

LOOP = 4_000_000          # pure-Python loop iterations in all (split over the tasks)
NUMPY_COUNT = 4_000_000   # float64 elements in all for sin^2 + cos^2
NUMPY_BLOCK = 65_536      # elements per NumPy call: long C loops, small cache-friendly temporaries
WAIT_MS = 200             # total sleep, split over the tasks
HOLD_MS = 200             # how long the main thread waits in part 3
REPEAT = 3                # each time is the best of this many runs
MSG_COUNT = 1024          # int64 elements in part 3's message
BATCH = 2_000             # loop iterations per unit of the compute thread's progress
TAG = 6
LOOPED = [0]              # items cpu_task looped over in this process since the last reset


def interpreter():
    """(text, gil_on, free_threaded_build) for the running Python."""
    free_build = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
    gil_on = sys._is_gil_enabled() if hasattr(sys, "_is_gil_enabled") else True  # 3.13+
    build = "free-threaded build" if free_build else "standard build"
    text = (f"{sys.implementation.name} {sys.version.split()[0]}, {build}, "
            f"GIL {'ON' if gil_on else 'OFF'}")
    return text, gil_on, free_build


def positive_int(text):
    try:
        value = bootstrap.nonneg_int(text)
    except argparse.ArgumentTypeError:
        value = -1
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value


def workers_count(text):
    value = bootstrap.nonneg_int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"need at least 2 workers to compare with serial, got {value}")
    return value


def split_range(total, parts, index):
    """[lo, hi) of part `index` when range(total) is cut into `parts` contiguous, balanced pieces."""
    # >>> exercise: split_range
    base, extra = divmod(total, parts)
    lo = index * base + min(index, extra)  # the first `extra` parts take one more item
    hi = lo + base + (1 if index < extra else 0)
    # <<< exercise: split_range
    return lo, hi


# the three kinds of work: module-level functions, so a spawned process can find them by name

def cpu_task(bounds):
    """Pure Python: the interpreter runs every iteration, holding the GIL throughout."""
    lo, hi = bounds
    s = 0
    for k in range(lo, hi):
        s += k
    LOOPED[0] += max(hi - lo, 0)  # part 2 checks that each rank looped over its own part only
    return s


def numpy_task(bounds):
    """Large NumPy expressions: the ufuncs let go of the GIL while they loop in C."""
    total = 0.0
    for a in range(bounds[0], bounds[1], NUMPY_BLOCK):  # blocks: temporaries stay small
        x = np.arange(a, min(a + NUMPY_BLOCK, bounds[1]), dtype=np.float64)
        total += float(np.sum(np.sin(x) ** 2 + np.cos(x) ** 2))  # = len(x), up to rounding
    return total


def wait_task(seconds):
    """A wait: time.sleep releases the GIL, as a blocking read or a comm call does."""
    time.sleep(seconds)
    return 1


_started = None  # in each worker process: a barrier shared by all P workers


def join_pool(barrier, parent):
    """Runs first in each worker: its own session (as mpiexec gives each rank), and an exit if
    rank 0 dies, so no worker outlives the lesson."""
    global _started
    _started = barrier
    if hasattr(os, "setsid"):
        os.setsid()  # linux autogroup shares cpu per session: without this, P workers get one share
    threading.Thread(target=exit_with_parent, args=(parent,), daemon=True).start()


def exit_with_parent(parent):
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


def whoami(_):
    _started.wait(timeout=120)  # returns only when all P workers are up: one call per process
    return os.getpid()


def race(runs, repeat):
    """{name: (best seconds, result, cores)}: the runs take turns, so a burst of load hits them all
    alike; the best of `repeat` turns is the least disturbed one. cores = this process's cpu seconds
    per wall second in that turn (its threads only: worker processes are not counted)."""
    best = {name: (float("inf"), None, 0.0) for name in runs}
    for _ in range(repeat):
        for name, run in runs.items():
            t0, c0 = timing.now(timing.HOST), time.process_time()
            result = run()
            seconds, cpu = timing.now(timing.HOST) - t0, time.process_time() - c0
            if seconds < best[name][0]:
                best[name] = (seconds, result, cpu / seconds)
    return best


def ratio(a, b):
    return a / b if b > 0 else float("nan")


def quiet_barrier(comm):
    """A barrier that sleeps between tests: a blocking MPI wait may poll, taking rank 0's cpu."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(0.002)


def race_three_ways(kinds, workers, repeat, procs):
    """{kind: {serial, threads, processes: (seconds, result, cores)}} for each (kind, task, args)."""
    out = {}
    with ThreadPoolExecutor(workers) as threads:
        for kind, task, args in kinds:
            out[kind] = race({
                "serial": lambda: sum(map(task, args)),
                "threads": lambda: sum(threads.map(task, args)),     # one interpreter, one GIL
                "processes": lambda: sum(procs.map(task, args)),     # P interpreters, P GILs
            }, repeat)
    return out


def torch_device(ctx):
    return "cuda" if ctx.device == "gpu" else "cpu"  # nccl moves cuda tensors only


def sum_over_ranks(ctx, total):
    """The pure-Python loop over range(total), split across the ranks; (my bounds, the total sum)."""
    # >>> exercise: split_across_ranks
    lo, hi = split_range(total, ctx.world_size, ctx.rank)
    mine = cpu_task((lo, hi))
    if ctx.api == "torch":
        import torch
        import torch.distributed as dist
        t = torch.tensor([mine], dtype=torch.int64, device=torch_device(ctx))
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        whole = int(t.item())
    else:
        from mpi4py import MPI
        buf = np.array([mine], dtype=np.int64)  # host MPI even on a gpu run: the point is the gil
        ctx.comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        whole = int(buf[0])
    # <<< exercise: split_across_ranks
    return (lo, hi), whole


class Spinner(threading.Thread):
    """A pure-Python compute thread: counts BATCH-sized loops until told to stop."""

    def __init__(self):
        super().__init__(daemon=True)
        self.stop, self.batches = threading.Event(), 0

    def run(self):
        while not self.stop.is_set():
            s = 0
            for k in range(BATCH):
                s += k
            self.batches += 1


def gil_holding_sleep():
    """libc usleep called through ctypes.PyDLL, which (unlike CDLL) does not release the GIL."""
    try:
        libc = ctypes.PyDLL(ctypes.util.find_library("c") or None)
        return libc.usleep
    except (OSError, AttributeError):
        return None


def wait_for_message(ctx, buf):
    """Rank 0's main thread blocks until rank 1's message is in buf; returns the sum it got."""
    if ctx.api == "torch":
        import torch.distributed as dist
        dist.recv(buf, src=1)                      # gloo: waits in C++ with the GIL released;
        return int(buf.sum())                      # nccl: recv only queued, the host waits in this sync
    ctx.comm.Recv(buf, source=1, tag=TAG)          # waits in MPI with the GIL released (host memory)
    return int(buf.sum())


def send_message(ctx):
    if ctx.api == "torch":
        import torch
        import torch.distributed as dist
        dist.send(torch.arange(MSG_COUNT, dtype=torch.int64, device=torch_device(ctx)), dst=0)
    else:
        ctx.comm.Send(np.arange(MSG_COUNT, dtype=np.int64), dest=0, tag=TAG)


def message_buffer(ctx):
    if ctx.api == "torch":
        import torch
        return torch.zeros(MSG_COUNT, dtype=torch.int64, device=torch_device(ctx))
    return np.zeros(MSG_COUNT, dtype=np.int64)


def wait_once(ctx, how, hold_s, holder):
    """Rank 0: the compute thread's batches/s while the main thread waits `how`; (rate, ms, cpu ms, sum)."""
    spinner = Spinner()
    spinner.start()
    buf = message_buffer(ctx)
    sync = timing.syncer(ctx)  # the buffer may be a cuda tensor: queued work finishes before the clock
    time.sleep(0.01)  # let the thread get going
    b0, t0, c0 = spinner.batches, timing.now(sync), time.thread_time()  # count only during the wait
    got = None
    if how == "sleep":
        time.sleep(hold_s)
    elif how == "hold":
        holder(int(hold_s * 1e6))
    else:
        got = wait_for_message(ctx, buf)
    b1, waited, cpu = spinner.batches, timing.now(sync) - t0, time.thread_time() - c0
    spinner.stop.set()
    spinner.join()
    return (b1 - b0) / waited, round(waited * 1e3, 1), round(cpu * 1e3, 1), got


def keep_computing(ctx, hold_s, repeat):
    """Part 3: the compute thread's speed while the main thread waits in three ways, taking turns;
    the best of `repeat` turns for each (the least disturbed by other work on the machine).
    Rank 0: (results for the runner, {how: its best turn}, {how: every turn's cpu ms})."""
    holder = gil_holding_sleep()
    waits = [("sleep", False), ("recv", True), ("hold", False)]  # (how the main thread waits, needs rank 1)
    waits = [w for w in waits if not (w[1] and ctx.world_size < 2)]  # a message needs a second rank
    waits = [w for w in waits if not (w[0] == "hold" and holder is None)]
    best, cpus = {}, {}  # cpu: every turn's, as a polling wait burns more in some turns than others
    for _ in range(repeat):
        for how, needs_peer in waits:  # every rank walks the same list: barriers stay matched
            quiet_barrier(ctx.comm)
            if ctx.rank == 1 and needs_peer:
                time.sleep(hold_s + 0.01)  # the message "arrives later" (rank 0 starts 10 ms late)
                send_message(ctx)
            if ctx.rank == 0:
                turn = wait_once(ctx, how, hold_s, holder)
                cpus.setdefault(how, []).append(turn[2])
                if how not in best or turn[0] > best[how][0]:
                    best[how] = turn
    if ctx.rank != 0:
        return {}, best, cpus
    solo = best["sleep"][0]
    got = {f"{how}_fraction": round(ratio(best[how][0], solo), 3) for how in best if how != "sleep"}
    if "recv" in best:
        got.update(recv_sum=best["recv"][3], recv_waited_ms=best["recv"][1], recv_cpu_ms=max(cpus["recv"]),
                   recv_cpu_ms_least=min(cpus["recv"]))
    return got, best, cpus


def three_ways(args):
    """Part 1, on rank 0: the three kinds of work, each serially, in T threads and in P processes;
    {kind: {mode: (best seconds, result, cores)}}, the worker pids, and how long they took to start.
    The workers are spawned fresh (no copy of this rank's MPI state), each in its own session."""
    workers, t0 = args.workers, timing.now(timing.HOST)
    spawn = get_context("spawn")  # fresh interpreters: no copy of this rank's MPI or threads
    procs = ProcessPoolExecutor(workers, mp_context=spawn, initializer=join_pool,
                                initargs=(spawn.Barrier(workers), os.getpid()))
    try:
        pids = set(procs.map(whoami, range(workers)))  # start them all now, outside the timings
        started = timing.now(timing.HOST) - t0
        cut = [split_range(args.loop, workers, i) for i in range(workers)]
        np_cut = [split_range(args.numpy_count, workers, i) for i in range(workers)]
        kinds = [("cpu", cpu_task, cut), ("numpy", numpy_task, np_cut),
                 ("wait", wait_task, [args.wait_ms / 1e3 / workers] * workers)]
        return race_three_ways(kinds, workers, args.repeat, procs), pids, started
    finally:
        procs.shutdown()


def tally(timed, pids):
    """Part 1's results for the runner ({kind}_result_{mode}, {kind}_time_{mode}, ...) and the speedups
    against serial ({kind}_threads, {kind}_processes)."""
    summary, speed = {"worker_pids": len(pids - {os.getpid()})}, {}
    for kind, modes in timed.items():
        serial = modes["serial"][0]
        for mode, (seconds, result, _) in modes.items():
            summary[f"{kind}_result_{mode}"] = result
            summary[f"{kind}_time_{mode}"] = round(seconds, 4)
        speed[f"{kind}_threads"] = ratio(serial, modes["threads"][0])
        speed[f"{kind}_processes"] = ratio(serial, modes["processes"][0])
    summary["cpu_threads_cores"] = round(timed["cpu"]["threads"][2], 3)
    return summary, speed


def over_ranks(ctx, total, repeat):
    """Part 2: sum_over_ranks, best of `repeat`; (my bounds, the whole sum, items I looped over, seconds)."""
    sync, best = timing.syncer(ctx), float("inf")
    for _ in range(repeat):
        quiet_barrier(ctx.comm)
        LOOPED[0] = 0  # cpu_task counts the items it loops over from here
        t0 = timing.now(sync)
        bounds, whole = sum_over_ranks(ctx, total)
        best = min(best, timing.now(sync) - t0)
    return bounds, whole, LOOPED[0], best


def flags(cores):
    parser = bootstrap.lesson_parser(__file__, __doc__)
    parser.add_argument("--workers", type=workers_count, default=max(2, min(4, cores)),
                        help="T threads = P processes = tasks (default: min(4, usable cores), at least 2)")
    parser.add_argument("--loop", type=positive_int, default=LOOP, help="pure-Python iterations in all")
    parser.add_argument("--numpy-count", type=positive_int, default=NUMPY_COUNT,
                        help="float64 elements in all for the NumPy work")
    parser.add_argument("--wait-ms", type=positive_int, default=WAIT_MS, help="total sleep in ms")
    parser.add_argument("--hold-ms", type=positive_int, default=HOLD_MS,
                        help="how long part 3's main thread waits, in ms")
    parser.add_argument("--repeat", type=positive_int, default=REPEAT, help="best of this many runs")
    return parser


def main():
    cores = timing.usable_cores()
    args, ctx = bootstrap.start(__file__, flags(cores))
    said, gil_on, free_build = interpreter()
    ctx.params = {"workers": args.workers, "loop": args.loop, "numpy_count": args.numpy_count,
                  "wait_ms": args.wait_ms, "hold_ms": args.hold_ms, "repeat": args.repeat,
                  "msg_count": MSG_COUNT, "cores": cores, "gil": gil_on, "free_threaded_build": free_build}
    show.interpreter(ctx, said, gil_on, cores)                               # 0. which Python, how busy
    show.part(ctx, 1, args, cores)                                           # 1. serial, threads, processes
    summary, speed, timed = {}, {}, {}
    if ctx.rank == 0:                                                        #    all inside rank 0
        timed, pids, started = three_ways(args)
        summary, speed = tally(timed, pids)                                  #    the results, the speedups
        show.three_ways(timed, len(pids), started, summary["cpu_threads_cores"])
    quiet_barrier(ctx.comm)                                                  #    the other ranks sleep meanwhile
    show.part(ctx, 2, args, cores)                                           # 2. the same loop over the ranks
    (lo, hi), whole, looped, best = over_ranks(ctx, args.loop, args.repeat)
    if ctx.rank == 0:                                                        #    against part 1's serial time
        speed["cpu_ranks"], summary["cpu_time_ranks"] = ratio(timed["cpu"]["serial"][0], best), round(best, 4)
    show.over_ranks(ctx, lo, hi, looped, whole, timed, best, speed)
    show.part(ctx, 3, args, cores)                                           # 3. compute while the rank waits
    got, turns, cpus = keep_computing(ctx, args.hold_ms / 1e3, args.repeat)
    show.waits(ctx, turns, cpus, args.repeat)
    summary.update(got)
    show.part(ctx, 4, args, cores)                                           # 4. the speedups, what they show
    show.speedups(ctx, timed, best, speed, got, gil_on, cores)
    if ctx.rank == 0:
        summary.update({f"{k}_speedup": round(v, 3) for k, v in speed.items()})
    report.finish(ctx, {"lo": lo, "hi": hi, "looped": looped, "ranks_sum": whole}, summary=summary)


if __name__ == "__main__":
    main()
