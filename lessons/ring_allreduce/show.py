"""What lesson 05's rank 0 prints: section 1's table, the race's table and chart, and the sentences
that say what section 3's latency numbers show, in the words of the transport that ran them.

    show.heading(ctx, dtype)                        section 1's title, before the ring runs
    show.counts(ctx, runs, seen, dtype, eps)        one row per count and rank (collective)
    show.race(ctx, rows, alpha, pick, csv, png)     section 2's table and chart, section 3's story
    show.no_race(ctx, bench)                        one rank: why there is no race
"""
import math

import numpy as np

from common import bandwidth, plot, report, shards, text, timing
from common.collectives import ALLREDUCE_NAME


def heading(ctx, dtype):
    report.section(ctx, f"1. the ring on {ctx.world_size} ranks, {dtype}, api {ctx.api} ({ctx.transport}), "
                        f"vs the library's all-reduce")


def chunk_sizes(sizes, width=24):
    """`1 1 0 0`, or runs with a count where that is too wide: `200001x3 200000x2`."""
    plain = " ".join(map(str, sizes))
    if len(plain) <= width:
        return plain
    runs = []
    for s in sizes:
        if runs and runs[-1][0] == s:
            runs[-1][1] += 1
        else:
            runs.append([s, 1])
    return " ".join(f"{s}x{k}" if k > 1 else str(s) for s, k in runs)


def counts(ctx, runs, seen, dtype, eps):
    """Section 1's table: a count's shared columns once, then one row per rank (collective: every rank
    hands its rows to rank 0). runs: check_counts' rows for the YAML; seen: what the counter saw."""
    n, itemsize = ctx.world_size, np.dtype(dtype).itemsize
    rows = []
    for run, saw in zip(runs, seen):
        count = run["count"]
        sizes = chunk_sizes([b - a for a, b in shards.chunk_bounds(count, n)])
        share = round(run["bytes_sent"] / (count * itemsize), 3) if count else "-"
        rows.append([count, sizes, ctx.rank, run["steps"], run["bytes_sent"], share,
                     ",".join(map(str, saw["peers"])) or "-", run["mismatches"], run["max_rel_err"]])
    every = ctx.comm.gather(rows, root=0)
    if ctx.rank != 0:
        return
    table = [row if r == 0 else ["", ""] + row[2:] for i in range(len(rows)) for r, row in
             enumerate(mine[i] for mine in every)]
    print(text.table(["count", "chunk sizes", "rank", "steps", "bytes sent", "x buffer", "to",
                      "#differ", "max rel err"], table,
                     align=[True, False, True, True, True, True, False, True, True]))
    print(f"x buffer: bytes sent / buffer bytes, 2(N-1)/N = {2 * (n - 1) / n:.3g} give or take "
          "a chunk's rounding\nto: the ranks this rank sent a non-empty chunk to", flush=True)
    if dtype != "int32":
        print(f"floats: the ring adds chunk j's N pieces in ring order, the library in its own; float\n"
              f"addition is not associative, so allow (N-1)*eps = {(n - 1) * eps:.2g} of sum|x|", flush=True)


def gbps(value):
    """A bandwidth in at most 6 characters with 2-3 significant digits: 6.2e-6 for a tiny one, never 0."""
    if value >= 100 or value == 0:
        return f"{value:.0f}"
    if value >= 0.001:
        return f"{value:.3g}" if value >= 0.01 else f"{value:.2g}"
    return f"{value:.1e}".replace("e-0", "e-")


def race(ctx, rows, alpha, pick, csv=None, png=None):
    """Sections 2 and 3 on rank 0: nccl-tests' columns, a busbw chart, what alpha says; --csv, --plot."""
    if ctx.rank != 0:
        return
    library = ALLREDUCE_NAME[ctx.transport]
    report.section(ctx, f"2. the race: ring vs {library}, in place, redop {rows[0]['redop']}")
    print(f"time: the slowest rank's mean of {pick['iters']} after {pick['warmup']} warm-up\n"
          f"algbw = size B / time (GB/s); busbw = algbw*2(N-1)/N; ring/lib = ring busbw / lib busbw")
    print(text.table(["size B", "count", "type", "ring us", "algbw", "busbw",
                      "lib us", "algbw", "busbw", "#wrong", "ring/lib"],
                     [(r["size"], r["count"], r["type"], round(r["ring_us"], 1),
                       gbps(r["ring_algbw"]), gbps(r["ring_busbw"]), round(r["lib_us"], 1),
                       gbps(r["lib_algbw"]), gbps(r["lib_busbw"]), r["wrong"],
                       round(r["ratio"], 2)) for r in rows], align=[True, True, False] + [True] * 8))
    sizes = [r["size"] for r in rows]
    print(bandwidth.chart(sizes, {"ring": [r["ring_busbw"] for r in rows],
                                  "library": [r["lib_busbw"] for r in rows]}))
    print("\n".join(["", "== 3. where the ring loses: latency"] + latency_story(ctx, rows, alpha)), flush=True)
    if csv:
        report.write_csv(csv, rows)
        print(f"wrote {csv}")
    if png:
        print(plot.busbw_png(png, sizes, {"ring (by hand)": [r["ring_busbw"] for r in rows],
                                          library: [r["lib_busbw"] for r in rows]},
                             f"all-reduce busbw, {ctx.world_size} ranks, api {ctx.api} ({ctx.transport})"))


def no_race(ctx, bench):
    """One rank: said, not skipped in silence (--bench asked for it)."""
    if ctx.rank == 0:
        print(f"\nno race on one rank: its ring sends nothing and busbw's 2(N-1)/N is 0"
              f"{'; --bench' if bench else '; the race'} needs -n 2 or more", flush=True)


def mpi_library():
    """'MPICH', 'Open MPI' or the first words of whatever MPI this is (its own version string)."""
    from mpi4py import MPI
    version = MPI.Get_library_version().strip()
    return next((name for name in ("MPICH", "Open MPI") if version.startswith(name)), " ".join(version.split()[:2]))


def library_story(ctx, small, alpha):
    """What the library's smallest-size time says, in the words of the transport that ran it."""
    n, lib_alphas = ctx.world_size, small["lib_us"] / (alpha * 1e6)
    steps, lg = 2 * (n - 1), math.ceil(math.log2(n))
    said = f"library at {small['size']} B: {small['lib_us']:.1f} us = {lib_alphas:.1f} alphas. "
    if ctx.transport == "gloo":  # torch calls gloo's allreduce with no algorithm: gloo runs its ring
        return [said + "gloo's all-reduce, as torch calls it, is a ring",
                f"  too, driven from C++: {small['lib_us'] / steps:.1f} us per step, against {alpha * 1e6:.1f} us "
                "for one of our exchanges", "  (each a call from Python)"]
    if ctx.transport == "nccl":
        return [said + "NCCL picks ring or tree, and a protocol, per call",
                "  from its own cost model (NCCL_ALGO / NCCL_PROTO force one; NCCL_DEBUG=INFO",
                "  NCCL_DEBUG_SUBSYS=TUNING shows its choice)"]
    name = mpi_library()
    if name != "MPICH":
        return [said + f"{name} picks its algorithm per size;", "  this run does not show which"]
    head = [said + "MPICH's classic pick below",
            "  MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE (2048 B; its tuning may choose another) is recursive",
            f"  doubling: ceil(lg N) = {lg} exchanges, not {steps};"]
    if lib_alphas < small["ring_us"] / (alpha * 1e6):
        return head + ["  it took fewer alphas than the ring, as such an algorithm would"]
    return head + ["  here it took no fewer alphas than the ring: this run does not show it"]


def latency_story(ctx, rows, alpha):
    """Section 3's lines: the ring's smallest size against 2(N-1)*alpha, the library's, the largest size."""
    n, cores = ctx.world_size, timing.usable_cores()
    small, big, steps = rows[0], rows[-1], 2 * (n - 1)
    model = steps * alpha * 1e6
    meas = small["ring_us"] / model if model > 0 else float("nan")
    lines = [f"alpha = one neighbour exchange of 1 element, made as the ring makes them: {alpha * 1e6:.1f} us",
             f"at {small['size']} B the ring makes {steps} = 2(N-1) in a row: 2(N-1)*alpha = {model:.1f} us, "
             f"measured {small['ring_us']:.1f} us ({meas:.2f}x)"]
    if 1 / 1.5 <= meas <= 1.5:
        lines.append("  within 1.5x: the ring's small-message time is its 2(N-1) latencies, as the model says")
    elif meas > 1.5:
        lines.append("  over 1.5x the model: a step in the ring costs more than a lone exchange here"
                     + (f" ({n} ranks, {cores} cores)" if n > cores else ""))
    else:
        lines.append("  under the model: a lone exchange costs more than a step inside the ring here")
    lines += library_story(ctx, small, alpha)
    share = model / big["ring_us"] if big["ring_us"] > 0 else 0.0
    lines.append(f"at {bandwidth.human(big['size'])}, 2(N-1)*alpha is {share:.0%} of the ring's time: " +
                 ("bandwidth, not latency, decides there" if share < 0.25 else
                  "latency still counts; --bench goes larger"))
    return lines
