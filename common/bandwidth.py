"""Bandwidth the way nccl-tests reports it: algbw, busbw, size sweeps, a timing loop, a terminal chart
(the PNG of the same is common/plot.py's).

    algbw = bytes / time                     (GB/s, GB = 1e9: what the caller saw)
    busbw = algbw * factor(op, n)            (what each link carried; comparable across n)
    factor: all-reduce 2(n-1)/n; all-gather, reduce-scatter, all-to-all (n-1)/n;
            broadcast, reduce, sendrecv 1.

    sizes("8", "128M", 2)   -> [8, 16, ..., 134217728]   (like nccl-tests' -b 8 -e 128M -f 2)
    seconds = time_op(comm, fn, 5, 20, timing.syncer(ctx))   (collective: the slowest rank's mean)
    add_sweep_flags(parser, BENCH); pick, sizes_b = sweep_plan(args, DEFAULT, BENCH)   (a lesson's sweep)
"""
FACTORS = {  # op -> (busbw factor as a function of n, the formula in words)
    "allreduce": (lambda n: 2 * (n - 1) / n, "2(n-1)/n"),
    "allgather": (lambda n: (n - 1) / n, "(n-1)/n"),
    "reducescatter": (lambda n: (n - 1) / n, "(n-1)/n"),
    "alltoall": (lambda n: (n - 1) / n, "(n-1)/n"),
    "broadcast": (lambda n: 1.0, "1"),
    "reduce": (lambda n: 1.0, "1"),
    "sendrecv": (lambda n: 1.0, "1"),
}
UNITS = {"": 1, "B": 1, "K": 1024, "KB": 1024, "M": 1024 ** 2, "MB": 1024 ** 2, "G": 1024 ** 3, "GB": 1024 ** 3}


def factor(op, n):
    if op not in FACTORS:
        raise ValueError(f"unknown op {op!r}; one of {', '.join(FACTORS)}")
    if n < 1:
        raise ValueError(f"ranks must be >= 1, got {n}")
    return FACTORS[op][0](n)


def algbw(nbytes, seconds):
    """GB/s (1e9) for nbytes moved in `seconds`; 0 when nothing was timed."""
    return nbytes / seconds / 1e9 if seconds > 0 else 0.0


def busbw(op, nbytes, seconds, n):
    return algbw(nbytes, seconds) * factor(op, n)


def parse_size(text):
    """'8' -> 8, '64K' -> 65536, '128M' -> 134217728 (binary units, as nccl-tests reads them)."""
    s = str(text).strip().upper()
    digits = s.rstrip("BKMG")
    unit = s[len(digits):]
    if not digits.isdigit() or unit not in UNITS:
        raise ValueError(f"bad size {text!r}: use a whole number with an optional K, M or G")
    return int(digits) * UNITS[unit]


def sizes(begin, end, mult):
    """Byte sizes begin, begin*mult, ... up to end (inclusive), like -b/-e/-f."""
    b, e = parse_size(begin), parse_size(end)
    if b < 1 or e < b:
        raise ValueError(f"need 1 <= -b <= -e, got -b {b} -e {e}")
    if int(mult) < 2:
        raise ValueError(f"-f must be >= 2, got {mult}")
    out = [b]
    while out[-1] * int(mult) <= e:
        out.append(out[-1] * int(mult))
    return out


def add_sweep_flags(parser, bench):
    """nccl-tests' -b/-e/-f/-n/-w, and --bench for the plan `bench` (a dict of those five), on a parser."""
    from common.bootstrap import nonneg_int
    parser.add_argument("--bench", action="store_true", help="the full sweep: -b {begin} -e {end} -f {mult} "
                        "-n {iters} -w {warmup}".format(**bench))
    parser.add_argument("-b", dest="begin", metavar="SIZE", help="smallest size in bytes (K, M, G ok)")
    parser.add_argument("-e", dest="end", metavar="SIZE", help="largest size in bytes")
    parser.add_argument("-f", dest="mult", type=nonneg_int, help="size multiplier per row")
    parser.add_argument("-n", dest="iters", type=nonneg_int, help="timed iterations per size")
    parser.add_argument("-w", dest="warmup", type=nonneg_int, help="warm-up iterations per size")


def sweep_plan(args, default, bench):
    """(pick, byte sizes): the flags given win over the plan's (--bench's, else `default`);
    ValueError with one line when they make no sweep."""
    pick = {k: getattr(args, k) if getattr(args, k) is not None else v
            for k, v in (bench if args.bench else default).items()}
    if pick["iters"] == 0:
        raise ValueError("-n must be at least 1 timed iteration")
    return pick, sizes(pick["begin"], pick["end"], pick["mult"])


def human(nbytes):
    for unit, scale in (("G", 1024 ** 3), ("M", 1024 ** 2), ("K", 1024)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return str(nbytes)


def time_op(comm, fn, warmup, iters, sync):
    """Seconds per call of fn(): warm-up calls, a barrier, `iters` timed calls, this rank's mean,
    then the slowest rank's mean (MAX all-reduce over MPI comm). Collective over comm.
    sync: timing.syncer(ctx) (gpu work is async: both clock reads wait for it), or timing.HOST."""
    from mpi4py import MPI

    from common import flight, timing
    for _ in range(warmup):
        fn()
    sync()
    comm.Barrier()
    with flight.get().timed(iters):  # warm-up calls were recorded one by one; the timed ones are one slot
        t0 = timing.now(sync)
        for _ in range(iters):
            fn()
        mean = (timing.now(sync) - t0) / max(iters, 1)
    return comm.allreduce(mean, op=MPI.MAX)


def explain(op, nbytes, time_us, n):
    """The arithmetic behind one nccl-tests line, spelled out (for `bin/tutor busbw`)."""
    f = factor(op, n)
    if nbytes < 0 or not 0 < time_us < float("inf"):  # nan fails this too
        raise ValueError(f"need --bytes >= 0 and a finite --time-us > 0, got --bytes {nbytes} --time-us {time_us:g}")
    alg = algbw(nbytes, time_us * 1e-6)
    return "\n".join([
        f"op {op}, {n} ranks, {nbytes} B in {time_us:g} us",
        f"algbw = bytes / time = {nbytes} B / {time_us:g} us = {alg:.4g} GB/s   (GB = 1e9 B)",
        f"busbw = algbw * {FACTORS[op][1]} = {alg:.4g} * {f:.4g} = {alg * f:.4g} GB/s",
        "busbw is what each rank's link carried; it stays comparable as n grows, algbw does not"
        + (" (n = 1: no link is used, the factor is 0)" if f == 0 else ""),
    ])


def chart(sizes_b, series, width=40):
    """A terminal bar chart of busbw vs size: series = {label: [GB/s per size]}, one bar each."""
    marks = "#=*+"
    top = max([v for vals in series.values() for v in vals] + [1e-12])
    lines = [f"busbw GB/s, full bar = {top:.3g}   " +
             "   ".join(f"{marks[i % 4]} {label}" for i, label in enumerate(series))]
    for j, size in enumerate(sizes_b):
        for i, (label, vals) in enumerate(series.items()):
            bar = marks[i % 4] * int(round(width * vals[j] / top))
            lines.append(f"{human(size) if i == 0 else '':>6} |{bar} {vals[j]:.3g}")
    return "\n".join(lines)

