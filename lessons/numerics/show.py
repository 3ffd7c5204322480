"""What lesson 17's rank 0 prints: a table per section, and sentences chosen by this run's numbers.

Collective where a function gathers (every rank calls it; rank 0 prints)."""
from common import report, text, tolerance


def _g(x):
    return f"{x:.3g}"


def sums(ctx, rows, count):
    """Section 1: RMS error of the ring and the library per dtype, the budget's use, the library's order."""
    n = ctx.world_size
    report.section(ctx, f"1. a sum of {n} ranks' {count} values, api {ctx.api} ({ctx.transport}): "
                        f"error against float64")
    every = ctx.comm.gather(rows, root=0)
    if ctx.rank:
        return
    table = []
    for i, row in enumerate(rows):
        mine = [r[i] for r in every]
        table.append([row["dtype"], _g(tolerance.unit_roundoff(row["dtype"])), _g(max(m["ring_rms"] for m in mine)),
                      _g(max(m["lib_rms"] for m in mine)), _g(max(max(m["ring_worst"], m["lib_worst"]) for m in mine)),
                      sum(m["ring_over"] + m["lib_over"] for m in mine)])
    print(text.table(["dtype", "u", "ring RMS", "library RMS", "worst/budget", "#over"], table,
                     align=[0, 1, 1, 1, 1, 1]))
    print(text.wrapped(f"RMS over elements, largest over ranks. budget: gamma_k * sum|x| per element, k = "
                       f"N-1 = {n - 1} (common/tolerance.py); worst/budget: the largest |error| / budget; "
                       "#over: elements outside it, all ranks"), flush=True)
    if n == 1:
        print("one rank: nothing is added, so nothing rounds", flush=True)
        return
    said = {}  # what the run showed -> the dtypes it showed it for
    for i, row in enumerate(rows):
        seen = {tuple(r[i]["lib_matches"]) for r in every}
        alike = "the same bits on every rank" if all(r[i]["lib_alike"] for r in every) else \
            "different bits on different ranks"
        order = ("equal, bit for bit, to: " + "; ".join(next(iter(seen))) if len(seen) == 1 and seen != {()}
                 else "none of the simple orders tried (lessons/numerics/orders.py)")
        said.setdefault(f"{alike}, {order}", []).append(row["dtype"])
    for what, dtypes in said.items():
        print(text.wrapped(f"the library's {', '.join(dtypes)}: {what}"), flush=True)


def fit(ctx, out):
    """Section 2: RMS error against N in one process, and the two fitted slopes."""
    report.section(ctx, "2. one process, bfloat16: each hop rounds (a ring) vs float32 adds, one rounding")
    if ctx.rank:
        return
    print(text.table(["N", "hop by hop RMS", "fp32 adds RMS"],
                     [[r["n"], _g(r["hop_rms"]), _g(r["acc_rms"])] for r in out["fit"]], align=[1, 1, 1]))
    gap, noise = out["slope_gap"], out["hop_noise"] + out["acc_noise"]
    said = (f"slope of log2 RMS against log2 N: hop by hop {out['hop_slope']:.2f} +- {out['hop_noise']:.2f}, "
            f"fp32 adds {out['acc_slope']:.2f} +- {out['acc_noise']:.2f} (the fit's standard errors). ")
    if gap > 2 * noise:
        said += f"The ring's error grows faster, by {gap:.2f} in the exponent, beyond the fit's noise."
    else:
        said += "This run cannot tell the two slopes apart beyond the fit's noise."
    print(text.wrapped(said), flush=True)


def wide(ctx, rs, ring, count):
    """Section 3: build (a) against the bfloat16 ring of section 1."""
    n = ctx.world_size
    report.section(ctx, "3. build (a): bfloat16 on the wire, float32 adds (all-to-all, add, all-gather)")
    every = ctx.comm.gather(rs, root=0)
    rings = ctx.comm.gather(ring, root=0)
    if ctx.rank:
        return
    print(text.table(["", "RMS error", "bytes sent, all ranks", "#over"],
                     [["bf16 ring (section 1)", _g(max(r["ring_rms"] for r in rings)), rings[0]["ring_total"],
                       sum(r["ring_over"] for r in rings)],
                      ["build (a)", _g(max(r["rs_rms"] for r in every)), every[0]["rs_total"],
                       sum(r["rs_over"] for r in every)],
                      ["exact sum rounded once", _g(every[0]["rs_once"]), "-", "-"]], align=[0, 1, 1, 1]))
    print(text.wrapped(f"want: 2 B x 2(N-1) x {count} = {4 * (n - 1) * count} B over all ranks for both. "
                       "build (a)'s budget: float32 adds, one rounding to bfloat16 (common/tolerance.py)"),
          flush=True)


def reproducible(ctx, rp, m):
    """Section 4: build (b) against one process's tree and the library."""
    n = ctx.world_size
    ranks = f"{n} rank" + ("s" if n > 1 else "")
    report.section(ctx, f"4. build (b): a reproducible all-reduce of {m} contributions over {ranks}")
    every = ctx.comm.gather(rp, root=0)
    if ctx.rank:
        return
    rows = text.once([(r, e["digest"], e["mismatches"], e["lib_differs"], e["tree_over"] + e["mean_over"])
                      for r, e in enumerate(every)])
    print(text.table(["rank", "digest (sha256, first 16)", "#differ from tree", "#library differs", "#over"],
                     rows, align=[0, 0, 1, 1, 1]))
    r0 = every[0]
    print(text.wrapped(
        f"#differ from tree: elements not bitwise equal to one process's tree sum; run -n 1, 2, 3 ... and the "
        f"digest stays. The library's all-reduce of each rank's block sum differs in "
        f"{r0['lib_differs']} elements: the same values added in another order. Cost: "
        f"{r0['repro_us']:.0f} us against the library's {r0['lib_us']:.0f} us, {r0['cost_ratio']:.2f}x "
        f"(slowest rank's mean, this run)."), flush=True)


def silent(ctx, sc, shapes, steps):
    """Section 5: what each run named, and three hashes against a flip and a swap."""
    n = ctx.world_size
    report.section(ctx, f"5. silent corruption: {steps} SGD steps on {n} replica{'s' if n > 1 else ''}, "
                        f"the fingerprints after each (api {ctx.api}, {ctx.transport})")
    if ctx.rank:
        return
    sizes = ", ".join(f"{k} {'x'.join(map(str, s))}" for k, s in shapes.items())
    print(text.wrapped(f"{sizes} in float32, SGD on the all-reduced mean gradient. After each "
                       "step every rank's fingerprint() of every tensor is gathered; suspects() "
                       "names the odd one out."))
    if n == 1:
        print("one rank: no replica to compare with, so nothing can be named (run -n 3)")
    else:
        plants = sc["plants"]
        rows = [["none (a clean run)", "-", "-", "-", sc["clean_named"]]]
        rows += [[p["plant"], _who(p["suspects"]), p["named_tensor"], _step(p["named_step"]),
                  p["steps_off"]] for p in plants]
        print(text.table(["planted", "named: rank", "tensor", "step", "steps off"], rows,
                           align=[0, 1, 1, 1, 1]))
        said = "steps off: after how many steps the replicas disagreed"
        if all(p["steps_off"] == steps - p["step"] for p in plants):
            said += " (each from its plant to the end: every replica takes the same mean step)"
        if n == 2:
            said += (". Two replicas that disagree cannot say which is wrong: both are named, "
                     "neither is blamed; a third replica (run -n 3) breaks the tie.")
        elif all(p["named_rank"] == p["planted_on"] for p in plants):
            said += ". Each rank named is the one its plant went to, outside the majority."
        said += ("" if said.endswith(".") else ".") + (f" On paper, 2 prints against 2 of 4 ranks: "
                                                      f"{sc['paper_tie']} of 4 are suspects.")
        print(text.wrapped(said))
    rows, seen = [], {}
    for kind, h in sc["hashes"].items():
        for key, label in (("xor", "XOR of 32-bit words"), ("sum", "float32 sum"),
                           ("fingerprint", "fingerprint()")):
            before, after = h[key]
            seen[key, kind] = before != after
            rows.append([label, h["what"], before[:16], after[:16],
                         "differs" if seen[key, kind] else "same"])
    print(text.table(["hash of one tensor", "the plant, on a copy", "before", "after", ""], rows))
    print(text.wrapped(_hash_sentence(seen)), flush=True)


def _who(ranks):
    if len(ranks) < 2:
        return str(ranks[0]) if ranks else "none"
    return " or ".join(map(str, ranks[:2])) + (f" (+{len(ranks) - 2})" if len(ranks) > 2 else "")


def _step(step):
    return "none" if step < 0 else step


def _hash_sentence(seen):
    """What the run's numbers show about the three hashes (seen[(hash, kind)]: it changed)."""
    out = []
    if seen["xor", "flip"] and not seen["xor", "swap"]:
        out.append("XOR is commutative: a swap moves two words and changes none, so their XOR "
                   "stays, where one flipped bit changes it.")
    if seen["sum", "swap"]:
        out.append("A float sum saw the swap only as rounding: the same values in another order.")
    else:
        out.append("A float sum misses the swap too: the same values, added again.")
    if seen["fingerprint", "swap"] and seen["fingerprint", "flip"]:
        out.append("A hash that reads the words in order sees both: sha256 of the bytes, or a "
                   "position-weighted sum of the words, sum (i+1) x word_i mod 2**64.")
    else:
        out.append("Your fingerprint() misses a plant here: it must read every word, in order.")
    return " ".join(out)
