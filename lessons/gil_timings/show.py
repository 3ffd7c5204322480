"""What lesson 06's rank 0 prints: each part's title and table, and the sentences its numbers support.

    show.interpreter(ctx, text, gil_on, cores)      part 0: which Python, how busy the machine is
    show.part(ctx, k, args, cores)                  part k's title (k = 1..4), before its work
    show.three_ways(timed, pids, started, busy)     part 1's lines;  show.over_ranks(...) part 2's
    show.waits(ctx, best, cpus, repeat)             part 3's table;  show.speedups(...) part 4's
"""
import os

from common import report, text


def interpreter(ctx, said, gil_on, cores):
    """Part 0: the interpreter and its GIL, and a warning when the machine is busier than its cores."""
    report.section(ctx, f"0. the interpreter: {said}; {cores} usable core(s) on rank 0")
    if ctx.rank != 0:
        return
    if hasattr(os, "getloadavg") and os.getloadavg()[0] > cores:  # more runnable work than cores
        print(text.wrapped(f"the machine is busy (load average {os.getloadavg()[0]:.1f} on {cores} cores): "
                           "other work competes for the cores, so the speedups will be lower and noisier; "
                           "run it again on an idle machine for cleaner ones"))
    if gil_on:
        print(text.wrapped("with the GIL on, only one thread runs Python bytecode at a time: expect the "
                           "pure-Python thread column near 1x"))
    else:
        print(text.wrapped("the GIL is OFF: threads run Python in parallel, so the pure-Python thread column "
                           "is expected to scale like the process column"))


def part(ctx, k, args, cores):
    """Part k's title, printed before its work."""
    n, workers = ctx.world_size, args.workers
    report.section(ctx, {
        1: f"1. the same work serially, with {workers} threads, with {workers} processes "
           f"(rank 0; best of {args.repeat})",
        2: f"2. the pure-Python loop split across the {n} MPI rank(s) (best of {args.repeat}, barrier to all-reduce)",
        3: f"3. a pure-Python thread computes while the main thread waits {args.hold_ms} ms "
           f"(rank 0; best of {args.repeat})",
        4: f"4. speedups vs serial ({workers} workers, {n} rank(s), {cores} usable core(s))"}[k])


def autogroup_note():
    try:
        with open("/proc/sys/kernel/sched_autogroup_enabled") as f:
            on = f.read().strip() == "1"
    except OSError:
        return ""
    return ": linux autogroup is on here, so cpu is shared per session" if on else ""


def three_ways(timed, pids, started, busy):
    """Part 1 (rank 0): how the worker processes started, and how many cores the threads kept busy."""
    print(text.wrapped(f"started {pids} worker processes in {started * 1e3:.0f} ms (not in the "
                       "timings); each in its own session, as mpiexec starts ranks" + autogroup_note()))
    print(text.wrapped(f"pure-Python threads kept {busy:.2f} cores busy, serial "
                       f"{timed['cpu']['serial'][2]:.2f} (cpu seconds per wall second of rank 0; the GIL caps "
                       "threads at 1 however many cores are free)"))


def over_ranks(ctx, lo, hi, looped, whole, timed, best, speed):
    """Part 2: each rank's part (rank-ordered), then, on rank 0, the time against part 1's serial one."""
    report.say(ctx, f"pid {os.getpid()}  my part [{lo}, {hi})  looped over {looped}\nall parts' sum {whole}")
    if ctx.rank == 0:
        print(f"serial (part 1): {timed['cpu']['serial'][0] * 1e3:.1f} ms, split across {ctx.world_size} "
              f"rank(s): {best * 1e3:.1f} ms -> {speed['cpu_ranks']:.2f}x"
              + (" (one rank: no split)" if ctx.world_size < 2 else ""))


def recv_label(ctx):
    """What part 3's main thread really waits in, per API and transport."""
    if ctx.api == "mpi4py":
        return "main thread blocked in MPI Recv" + (" (host memory)" if ctx.device == "gpu" else "")
    if ctx.transport == "nccl":
        return "main thread in the CUDA sync after dist.recv"
    return "main thread blocked in dist.recv (gloo)"


def waits(ctx, best, cpus, repeat):
    """Part 3's table on rank 0: each wait's best turn (rate, ms, cpu ms, sum) and every turn's cpu."""
    if ctx.rank != 0:
        return
    if ctx.world_size < 2:
        print("(with 1 rank there is no one to send a message: the Recv rows need NP >= 2)")
    label = {"sleep": "solo: main thread idle in time.sleep", "recv": recv_label(ctx),
             "hold": "main thread in a C call that keeps the GIL"}
    solo = best["sleep"][0]
    rows = [(label[how], best[how][1], f"{min(cpus[how]):.1f}" + (f"-{max(cpus[how]):.1f}" if repeat > 1 else ""),
             round(best[how][0]), round(best[how][0] / solo if solo > 0 else float("nan"), 2)) for how in best]
    print(text.table(["main thread", "waited ms", "its cpu ms", "thread batches/s", "of solo"],
                     rows, align=[False, True, True, True, True]))
    print(text.wrapped("the compute thread keeps its speed only when the wait releases the GIL; 'its cpu ms' "
                       "is the cpu the waiting thread itself used (a polling wait shows up here)"))


def speedups(ctx, timed, ranks_s, speed, got, gil_on, cores):
    """Part 4 on rank 0: every time and speedup against serial in one table, then the conclusions."""
    if ctx.rank != 0:
        return
    rows = []
    for kind, modes in timed.items():
        rows.append([kind, round(modes["serial"][0] * 1e3, 1), round(modes["threads"][0] * 1e3, 1),
                     round(modes["processes"][0] * 1e3, 1), round(speed[f"{kind}_threads"], 2),
                     round(speed[f"{kind}_processes"], 2)])
        rows[-1] += [round(ranks_s * 1e3, 1), round(speed["cpu_ranks"], 2)] if kind == "cpu" else ["", ""]
    print(text.table(["work", "serial ms", "threads ms", "procs ms", "threads x", "procs x",
                      "ranks ms", "ranks x"], rows,
                     align=[False, True, True, True, True, True, True, True]))
    for line in conclusions(ctx, speed, got, gil_on, cores):
        print(text.wrapped("* " + line))


def gains(x):
    """How a measured speedup reads: the thresholds the YAML uses for its relations."""
    return "gain" if x >= 1.3 else "no real gain"


def wait_story(ctx, got):
    """What part 3's receive shows: whether the compute thread kept going, and whether the waiting
    thread slept or spun (a released GIL is not an idle core)."""
    kept, cpu, least, waited = (got[k] for k in ("recv_fraction", "recv_cpu_ms", "recv_cpu_ms_least",
                                                  "recv_waited_ms"))
    where = ("in MPI Recv" if ctx.api == "mpi4py" else "in dist.recv" if ctx.transport == "gloo" else
             "after dist.recv (on nccl it only queues the receive; the host waited in the CUDA sync that "
             "reads the sum)")
    if kept >= 0.6:
        lines = [f"a compute thread kept {kept:.0%} of its speed while its rank waited {where}: the wait "
                 "released the GIL"]
    elif kept > 0.4:
        lines = [f"a compute thread kept {kept:.0%} of its speed while its rank waited {where}: the GIL "
                 "was released, but the thread did not get a core to itself"]
    else:
        lines = [f"a compute thread kept only {kept:.0%} of its speed while its rank waited {where}: this "
                 "wait held the GIL, or left the thread no core"]
    if waited > 0 and cpu / waited > 0.5:
        lines.append(f"yet the waiting thread was not always idle: in one turn it used {cpu:.0f} ms of cpu "
                     f"in about {waited:.0f} ms (it polled rather than slept; least {least:.0f} ms). A released "
                     "GIL is not a free core: where no core is spare, polling takes cpu from the other threads")
    else:
        lines.append(f"and the waiting thread used little cpu: at most {cpu:.0f} ms in about {waited:.0f} ms")
    return lines


def conclusions(ctx, speed, got, gil_on, cores):
    """Sentences the measured numbers support (speed: {kind_mode: x vs serial}; got: part 3)."""
    cpu_t, cpu_p, ranks = speed["cpu_threads"], speed["cpu_processes"], speed["cpu_ranks"]
    want = "no real gain" if gil_on else "gain"
    lines = [f"pure-Python threads: {cpu_t:.2f}x ({gains(cpu_t)}); with the GIL "
             f"{'on one thread runs Python at a time' if gil_on else 'off they should scale'}"
             + ("" if gains(cpu_t) == want else ": not what the GIL state predicts, a noisy run?")]
    split = getattr(ctx, "world_size", 2) > 1  # one rank runs the whole loop again: no speedup to read
    busy = "" if min(cpu_p, ranks if split else cpu_p) >= 1.3 or cores < 2 else \
        ": less than the cores allow, is the machine busy?"
    lines.append(f"processes: {cpu_p:.2f}x" + (f", MPI ranks: {ranks:.2f}x" if split else "") +
                 f" on {cores} usable core(s): each has its own interpreter and GIL{busy}" +
                 ("" if split else "; one MPI rank splits nothing (its column times the same loop again)"))
    lines.append(f"NumPy threads: {speed['numpy_threads']:.2f}x ({gains(speed['numpy_threads'])})" +
                 (": its loops run in C with the GIL released" if speed["numpy_threads"] >= 1.3 else
                  ": NumPy releases the GIL in its loops, but this run shows no gain from it"))
    lines.append(f"waits in threads: {speed['wait_threads']:.2f}x" +
                 (": a sleeping thread holds no GIL, so waits overlap whatever the GIL does"
                  if speed["wait_threads"] >= 1.3 else ": the waits did not overlap here, a noisy run?"))
    if "recv_fraction" in got:
        lines += wait_story(ctx, got)
    if "hold_fraction" in got:
        lines.append(f"a C call that kept the GIL left the compute thread {got['hold_fraction']:.0%} of its "
                     "speed" + (": a comm library that held the GIL while waiting would freeze every other "
                                "thread of the rank" if got["hold_fraction"] < 0.4 else
                                ", not the freeze the GIL predicts: a noisy run?"))
    if gil_on and cpu_t < 1.3:
        shown = "as the process column shows" if max(cpu_p, ranks if split else cpu_p) >= 1.3 else \
            "which this run's busy cores hide, but the thread column still shows the GIL"
        lines.append("so PyTorch's DistributedDataParallel runs one process per GPU, not one thread: the "
                     "Python a step runs (the forward's module calls, the loss, the optimizer's update, the "
                     "loop) holds the GIL, so threads would take turns on it while processes run side by "
                     f"side ({shown}). Not backward (autograd's engine is C++), nor data loading "
                     "(DataLoader's workers are processes)")
    return lines
