"""Lesson 07's tuner race: the fastest measured algorithm per size, raced against the library's
all-reduce in the same run, and what the run can say about the sizes it lost.

    switch_points(table)       '<= 16K: rd, <= 1M: rabenseifner, else ring' from [(size, algo)]
    choose(table, nbytes)      the algorithm the table picks for nbytes
    tuned_race(...)            nccl-tests' columns for the tuned all-reduce and the library's
    show_race(...)             the table, the library's own rule in its words, the lost sizes explained
"""
import os

import numpy as np

from common import bandwidth, buffers, report, text
from common.collectives import ALLREDUCE_NAME
from common.timing import BATCHES, best_of, usable_cores
from lessons.allreduce_algorithms.model import dbt_chunks, iterations
from lessons.allreduce_algorithms.schedules import copy_into


def choose(table, nbytes):
    """The algorithm for nbytes: the choice of the nearest measured size at or below (the smallest
    measured size's choice below the table)."""
    chosen = table[0][1]
    for size, algo in table:
        if size <= nbytes:
            chosen = algo
    return chosen


def switch_points(table):
    """'<= 16K: rd, <= 1M: rabenseifner, else ring' from the per-size table."""
    parts = []
    for i, (size, algo) in enumerate(table):
        if i + 1 < len(table) and table[i + 1][1] == algo:
            continue
        last = i + 1 == len(table)
        parts.append(f"else {algo}" if last and parts else (f"{algo}" if last else
                                                              f"<= {bandwidth.human(size)}: {algo}"))
    return ", ".join(parts)


def tuned_race(ctx, args, be, pick, table, model, make_plan, seed):
    """One row per size of the table: the chosen algorithm (make_plan(algo, count, k, buf): a checked
    Plan) and the library's, checked once on seeded small integers, then timed in place on zeros."""
    from mpi4py import MPI
    n, rank, itemsize = ctx.world_size, ctx.rank, np.dtype(args.dtype).itemsize
    rows = []
    for size, _ in table:
        count = max(size // itemsize, 1)
        algo = choose(table, size)
        k = dbt_chunks(n, count * itemsize, model["alpha_all"], model["beta_ring"])
        x = buffers.seeded(seed + rank, count, args.dtype, small_ints=True)
        mine, lib = buffers.on_device(ctx, x.copy()), buffers.on_device(ctx, x.copy())
        plan = make_plan(algo, count, k, mine)
        plan.run(be)  # once, for #wrong
        be.allreduce(lib)
        be.sync()
        wrong = ctx.comm.allreduce(int((buffers.to_host(mine) != buffers.to_host(lib)).sum()))
        zeros = buffers.on_device(ctx, np.zeros(count, dtype=args.dtype))
        copy_into(mine, zeros)  # then timed in place, over and over: zeros never overflow
        copy_into(lib, zeros)
        spread = {}
        t = best_of(ctx, be, {"tuned": lambda: plan.run(be), "lib": lambda: be.allreduce(lib)},
                    pick["warmup"], iterations(pick, size), spread)
        t_tuned, t_lib = t["tuned"], t["lib"]
        talks = sum(1 for out, into, _, _ in plan.rounds if out or into)  # rounds this rank sends or receives in
        active = ctx.comm.allreduce(talks, op=MPI.MAX)
        rows.append(dict(size=count * itemsize, count=count, type=args.dtype, redop="sum", chosen=algo, rounds=active,
                         tuned_us=t_tuned * 1e6, lib_us=t_lib * 1e6, noise_us=max(spread.values()) * 1e6,
                         wrong=wrong,
                         algbw=bandwidth.algbw(count * itemsize, t_tuned),
                         busbw=bandwidth.busbw("allreduce", count * itemsize, t_tuned, n),
                         lib_busbw=bandwidth.busbw("allreduce", count * itemsize, t_lib, n),
                         ratio=t_lib / t_tuned if t_tuned > 0 else 0.0))
    return rows


def gap_verdict(row, overhead):
    """Why the tuned all-reduce lost to the library at one size (a race row), as far as this run can tell:
    by less than its own noise, or how the gap compares with the Python priced per round. That price is
    a lower bound (the library call's own Python is not all of it), so it can show that Python is at
    least half the gap, never that Python is not the cause."""
    gap = row["tuned_us"] - row["lib_us"]
    if gap <= row["noise_us"]:
        return "a tie: within this run's noise"
    if row["rounds"] * overhead * 1e6 >= 0.5 * gap:
        return "at least half Python"
    return "over twice the Python priced"


def library_words(ctx):
    """How the library racing us picks its algorithm, in the words of the transport that ran."""
    if ctx.transport == "gloo":
        return ["gloo's all_reduce, as torch calls it, runs one ring at every size (no switch by size)"]
    if ctx.transport == "nccl":
        forced = sorted(f"{k}={v}" for k, v in os.environ.items() if k in ("NCCL_ALGO", "NCCL_PROTO"))
        return ["NCCL's tuner prices ring vs tree (and its LL/LL128/Simple protocols) per size with its own "
                "alpha-beta model; it ran with " + (", ".join(forced) if forced else "its own choices (no "
                                                     "NCCL_ALGO or NCCL_PROTO set)")]
    from mpi4py import MPI
    if not MPI.Get_library_version().startswith("MPICH"):
        return ["this MPI picks its all-reduce algorithm per size with its own rules"]
    forced = sorted(f"{k}={v}" for k, v in os.environ.items() if k.startswith("MPIR_CVAR_"))
    return ["MPICH's classic rule: recursive doubling up to MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE (2048 B), "
            "Rabenseifner above, unless MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM or its tuning choose otherwise; it "
            "ran with " + (", ".join(forced) if forced else "its own choices (no MPIR_CVAR_* set; "
                           "MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM=ring, for one, races MPICH's C ring)")]


def show_race(ctx, args, table, race, overhead):
    report.section(ctx, f"3. the size-tuned all-reduce vs {ALLREDUCE_NAME[ctx.transport]} (same run)")
    if ctx.world_size == 1:  # every schedule is empty: a "fastest" among them is the clock's noise
        print("one rank: every algorithm's schedule is empty, so the tuned column times a call that moves "
              "nothing;\n    its choice per size is noise, not a switch point")
    else:
        whole = ", ".join(p.replace(" ", "\xa0") for p in switch_points(table).split(", "))  # "<= 4K: rd" unbroken
        print(text.wrapped("switch table (fastest measured per size): " + whole, hang=4).replace("\xa0", " "))
    for line in library_words(ctx):
        print(text.wrapped(line, hang=4))
    # type and redop are nccl-tests' columns too, but one value for the whole race: said once, so that
    # the rows fit 100 columns with rabenseifner's name and a GPU's 4-digit algbw
    print(f"type {args.dtype}, redop sum (nccl-tests' columns, the same on every row)")
    print(text.table(["size B", "count", "algo", "time us", "algbw", "busbw",
                      "lib us", "lib busbw", "#wrong", "lib/tuned"],
                     [(r["size"], r["count"], r["chosen"],
                       round(r["tuned_us"], 1), round(r["algbw"], 3), round(r["busbw"], 3),
                       round(r["lib_us"], 1), round(r["lib_busbw"], 3), r["wrong"], round(r["ratio"], 2))
                      for r in race]))
    slow = [r for r in race if r["ratio"] < 1]
    if slow:
        # the one cost we can price: the Python of each round (measured above); the library's rounds are C
        rows = [(bandwidth.human(r["size"]), r["chosen"], r["rounds"], round(r["tuned_us"] - r["lib_us"], 1),
                 round(r["noise_us"], 1), round(r["rounds"] * overhead * 1e6, 1), gap_verdict(r, overhead))
                for r in slow]
        ties = sum(v.startswith("a tie") for *_, v in rows)
        what = ("walking a round plus a library call that moves nothing" if ctx.transport == "mpi" else
                "walking a round; the call into the library itself is not measured here")
        print(text.wrapped(f"tuned slower than the library at {len(slow)} of {len(race)} sizes, {ties} of them by "
                           f"less than this run's noise (noise: the larger spread between one contender's "
                           f"{BATCHES} batches). The part we can price: ~{overhead * 1e6:.1f} us of Python per "
                           f"round ({what}), which the library's C rounds do not pay:", hang=4))
        print(text.table(["size", "algo", "rounds", "gap us", "noise us", "Python us", "so the gap is"], rows,
                         align=[False, False, True, True, True, True, False]))
        cores = usable_cores()
        if any(r[-1].startswith("over twice") for r in rows):
            crowd = (f"; and {ctx.world_size} ranks share {cores} cores, so every round also waits for the "
                     "scheduler" if ctx.world_size > cores else "")
            print(text.wrapped("where the gap is over twice the Python priced, this run cannot say what the rest "
                               "is: more Python than that lower bound, or how the library moves its bytes, which "
                               "it does not measure; the schedule is not to blame (ours was the fastest of the "
                               f"{len(args.algos)} raced at that size)" + crowd, hang=4))
    if args.csv:
        report.write_csv(args.csv, race)
        print(f"wrote {args.csv}")
