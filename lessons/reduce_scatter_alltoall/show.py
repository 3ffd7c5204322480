"""What lesson 09's rank 0 prints: a table per section, and the sentences chosen by the numbers.

Collective where a function gathers (every rank calls it; rank 0 prints). The page passes in what it
owns (the library's notes): nothing here imports the page."""
from common import text, timing


def halves(ctx, runs, itemsize, missing):
    """Section 1: blocks, rounds and bytes of the hand-made reduce-scatter and all-gather per layout."""
    every = ctx.comm.gather(runs, root=0)
    if ctx.rank:
        return
    n, rows = ctx.world_size, []
    for i, run in enumerate(runs):
        mine = [r[i] for r in every]
        bad = sum(m[k] for m in mine for k in ("rs_wrong_ref", "rs_wrong_lib", "ag_wrong_ref", "ag_wrong_lib",
                                               "send_changed"))
        rows.append([run["layout"], text.per_rank([m["mine"] for m in mine]),
                     text.per_rank(sorted({m["rs_rounds"] for m in mine} | {m["ag_rounds"] for m in mine})),
                     text.per_rank([m["rs_bytes"] for m in mine]),
                     text.per_rank([m["ag_bytes"] for m in mine]), bad])
    print(text.table(["layout", "blocks (items)", "rounds", "RS bytes sent", "AG bytes sent", "#wrong"],
                     rows, align=[0, 0, 0, 0, 0, 1]))
    print(f"per rank, {itemsize} B per item. A rank's reduce-scatter sends every block but its own:\n"
          f"  (N-1)/N = {(n - 1) / n:.3g} of the buffer when blocks are equal. #wrong: items differing from\n"
          "  one process or from the library (both halves), plus send buffers the call changed", flush=True)
    if missing:
        print("\n".join(text.wrapped(f"the library here: {line}") for line in missing.values()), flush=True)


def exchange(ctx, a2a, itemsize):
    """Section 2: what each rank received, sent and should have sent in the uneven all-to-all."""
    every = ctx.comm.gather(a2a, root=0)
    if ctx.rank:
        return
    n, unit = ctx.world_size, a2a["unit"]
    rows = [[r, f"{r * unit} from each" if n > 1 else "-", m["rounds"], m["peers"], m["bytes"],
             itemsize * unit * (n * (n - 1) // 2 - r), m["wrong_ref"] + m["wrong_lib"] + m["send_changed"]]
            for r, m in enumerate(every)]
    print(f"rank r sends j*{unit} items to rank j (none to rank 0), so it receives r*{unit} from each")
    print(text.table(["rank", "receives (items)", "rounds", "peers", "bytes sent", "want", "#wrong"], rows))
    print(f"want: {itemsize} B x {unit} x (0+1+...+(N-1) - r): every block but the one it keeps. #wrong:\n"
          "  items differing from one process or from the library, plus a send buffer changed", flush=True)


def halves_verdict(w):
    """One line on the library's halves against its whole: said only where the halves are real (a
    reduce-scatter that sends (N-1)/N) and the gap is beyond this run's noise (lesson 07's rule)."""
    if not w["lib_halves_real"]:
        return ("its reduce-scatter sends what its all-reduce sends" + (" (measured above)" if w["lib_wire"] else "")
                + ": it is an all-reduce that keeps one block. Its RS + AG is an all-reduce, then an all-gather, "
                "not the two halves of one: no race of halves against the whole here")
    gap = w["lib_rs_ag_us"] - w["lib_allreduce_us"]
    noise = max(w["lib_rs_ag_noise_us"], w["lib_allreduce_noise_us"])
    said = (f"RS + AG {w['lib_rs_ag_us']:.1f} us, all-reduce {w['lib_allreduce_us']:.1f} us, noise {noise:.1f} us "
            f"(the larger spread between one call's {timing.BATCHES} batches): ")
    if abs(gap) <= noise:
        return said + "a tie within this run's noise"
    return said + ("the one call beats its halves called apart" if gap > 0 else "the halves beat the one call")


def whole(ctx, w, itemsize):
    """Section 3: the halves against lesson 05's ring and the library's all-reduce: bytes, time, verdict."""
    every = ctx.comm.gather(w, root=0)
    if ctx.rank:
        return
    n, size, wire = ctx.world_size, w["ar_count"] * itemsize, w["lib_wire"]
    lib_rs_ag, lib_ar = "-", "-"
    if wire:
        lib_rs_ag = text.per_rank([m["lib_wire"]["reduce_scatter"] + m["lib_wire"]["all_gather"] for m in every])
        lib_ar = text.per_rank([m["lib_wire"]["allreduce"] for m in every])
    print(f"{w['ar_count']} items ({size} B) per rank; the library's all-reduce is the reference")
    print(text.table(["", "bytes sent per rank", "all ranks", "time us", "#wrong"],
                     [["RS + AG by hand", text.per_rank([m["rs_ag_bytes"] for m in every]), w["rs_ag_total"],
                       round(w["hand_rs_ag_us"], 1), sum(m["wrong"] for m in every)],
                      ["lesson 05's ring", text.per_rank([m["ring_bytes"] for m in every]), w["ring_total"],
                       round(w["hand_ring_us"], 1), "-"],
                      ["library RS + AG", lib_rs_ag, "-", round(w["lib_rs_ag_us"], 1), "-"],
                      ["library all-reduce", lib_ar, "-", round(w["lib_allreduce_us"], 1), "-"]],
                     align=[0, 0, 1, 1, 1]))
    print(f"all ranks: 2(N-1) x {size} B = {2 * (n - 1) * size} B, both ways: the ring is the two halves\n"
          f"time: best of {timing.BATCHES} interleaved batches (the slowest rank's mean of each)")
    if wire:
        print(text.wrapped(f"library bytes: measured, what each rank wrote to its sockets in one call (headers "
                           f"included): reduce-scatter {wire['reduce_scatter']} B, all-gather {wire['all_gather']} B, "
                           f"all-reduce {wire['allreduce']} B on rank 0; a ring sends (N-1)/N = "
                           f"{(n - 1) * size // n} B for either half"))
    if n > 1:
        print(text.wrapped("library: " + halves_verdict(w)), flush=True)


def race(ctx, rows, pick, library):
    """Section 4: hand-made against the library in nccl-tests' columns."""
    if ctx.rank:
        return
    ops = ("reduce_scatter", "all_gather", "all_to_all")
    print(f"time: the slowest rank's mean of {pick['iters']} after {pick['warmup']} warm-up; size: the whole "
          f"buffer of {rows[0]['type'] if rows else ''}\nbusbw = algbw x (N-1)/N for all three; "
          "hand/lib = hand busbw / library busbw\nthe library: "
          + ", ".join(library.names[op] for op in ops))
    print(text.table(["op", "size B", "count", "hand us", "algbw", "busbw", "lib us", "algbw", "busbw",
                      "#wrong", "hand/lib"],
                     [(r["op"].replace("_", "-"), r["size"], r["count"], round(r["hand_us"], 1),
                       round(r["hand_algbw"], 3), round(r["hand_busbw"], 3), round(r["lib_us"], 1),
                       round(r["lib_algbw"], 3), round(r["lib_busbw"], 3), r["wrong"], round(r["ratio"], 2))
                      for op in ops for r in rows if r["op"] == op]), flush=True)


def moe(ctx, mine, tokens, dmodel):
    """Section 5: the load the router put on each rank. Returns (rank 0) the summary's MoE values."""
    every = ctx.comm.gather(mine, root=0)
    if ctx.rank:
        return None
    n = ctx.world_size
    loads = [m["tokens_in"] for m in every]
    print(f"{tokens} tokens of {dmodel} features (float64) per rank; top-1 router; expert e on rank e")
    print(text.table(["rank", "its expert got", "load", "kept", "sent away", "bytes out",
                      "bytes back", "max |err|", "err/budget"],
                     [[r, m["tokens_in"], "#" * round(15 * m["tokens_in"] / max(max(loads), 1)), m["kept"],
                       tokens - m["kept"], m["token_bytes"], m["result_bytes"], f'{m["moe_err"]:.3g}',
                       f'{m["moe_ratio"]:.2g}'] for r, m in enumerate(every)], align=[1, 1, 0, 1, 1, 1, 1, 1, 1]))
    busiest = max(loads) / (sum(loads) / n) if sum(loads) else 0.0
    print(text.wrapped(f"max |err|: against one process running the whole layer; err/budget: the worst entry's "
                       f"|err| over its budget (lessons/reduce_scatter_alltoall/budget.py: two orders of "
                       f"each length-{dmodel} dot product, 2 gamma_{dmodel} * (|x| @ |W|), through tanh and the "
                       f"gate). The busiest expert got {busiest:.2f}x the mean", hang=0))
    if busiest > 1.2:
        print("  load: its rank computes longest and receives most, and every rank waits for it at the\n"
              "  results all-to-all; real MoE layers cap it (a capacity factor) or train the router to spread")
    print(end="", flush=True)
    return {"moe_tokens": sum(loads), "moe_load": loads, "moe_busiest_over_mean": busiest}
