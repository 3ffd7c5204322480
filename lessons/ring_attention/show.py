"""What lesson 13's rank 0 prints: the split, the ring against one process and its order, what the clock
says about overlap, the causal work of each split and what the clock says about balance, the large
logits, torch's own attention. Tables and the sentences that explain them, each said only where this
run's numbers support it. Pure printing: the values come in as arguments.
"""
import math

import numpy as np

from common import text

OVERFLOW = {"float64": math.log(np.finfo(np.float64).max), "float32": math.log(np.finfo(np.float32).max)}


def rows_of(chunks):
    return sum(hi - lo for lo, hi in chunks)


def overlap_lines(ctx, t, cores):
    """What the clock says about overlap, in words the measurement supports."""
    n = ctx.world_size
    ring, comp, comm = (max(r[key] for r in t) for key in ("ring", "compute", "transfers"))
    lines = [f"the clock (slowest rank, best of {t[0]['reps']}): the ring with overlap {ring * 1e3:.2f} ms; "
             f"its compute alone\n  {comp * 1e3:.2f} ms; its transfers alone {comm * 1e3:.2f} ms"]
    if n == 1:
        return lines + ["one rank: no transfers, nothing to hide"], None
    hidden = (comp + comm - ring) / comm if comm > 0 else 0.0
    shown = min(max(hidden, 0.0), 1.0)
    lines.append(f"hidden = (compute + transfers - ring) / transfers = {hidden:.2f}"
                 + (f", clipped to {shown:.0%}" if shown != hidden else f" ({shown:.0%})"))
    if comm < 0.1 * ring:
        lines.append(f"  the transfers are {comm / ring:.0%} of the ring's time here: too little next to "
                     "the compute, and to the\n  clock's noise, to say how much of them the overlap hid")
    elif hidden >= 0.5:
        lines.append(f"  the ring took {(comp + comm - ring) * 1e3:.2f} ms less than its compute and its "
                     f"transfers one after the other:\n  {shown:.0%} of the transfer time ran while the "
                     "ranks computed")
    elif hidden <= 0.2 and ctx.transport == "mpi":
        lines.append("  little was hidden on this run: the clock does not show why. One possible cause, "
                     "not measured:\n  an MPI library without a progress thread moves a large message "
                     "only inside an MPI call,\n  here the Waitall after the compute")
    elif hidden <= 0.2:
        lines.append("  little was hidden on this run: the clock does not show why")
    else:
        lines.append("  some of the transfer time was hidden, not most")
    if n > cores and comm >= 0.1 * ring:
        lines.append(f"  ({n} ranks share {cores} cores: a transfer's time here includes waiting for "
                     "a core)")
    return lines, hidden


def spans(chunks):
    return ", ".join(f"{lo}-{hi - 1}" if hi > lo else "none" for lo, hi in chunks)


def split(ctx, layouts):
    """1. The tokens each rank holds, contiguous and zig-zag."""
    n = ctx.world_size
    rows = [(r, spans(layouts["contiguous"][r]), rows_of(layouts["contiguous"][r]),
             spans(layouts["zigzag"][r]), rows_of(layouts["zigzag"][r])) for r in range(n)]
    if n > 8:  # the first four ranks and the last two; the JSON has them all
        rows = rows[:4] + [("...", "", "", "", "")] + rows[-2:]
    print(text.table(["rank", "contiguous: tokens", "rows", "zig-zag: tokens", "rows"], rows,
                     align=[True, False, True, False, True]))
    print(f"zig-zag: {2 * n} chunks; rank r holds chunk r and chunk {2 * n - 1}-r")
    print(f"step s: rank r holds the block of rank r-s, starts sending it to r+1 and receiving the next"
          f"\nfrom r-1, computes on it, waits: {n - 1} transfers" if n > 1 else
          "one rank: it holds every block, and computes on it in one step", flush=True)


def full(ctx, rows, kv_bytes, dtype):
    """2. Every rank's rows against one process, and what it sent."""
    n = ctx.world_size
    print(text.table(["rank", "max |ring - one process|", "err/budget", "bytes sent", "x K,V bytes",
                      "transfers", "to"], [(r, e, x, b, f"{b / kv_bytes:.3f}", t, ",".join(map(str, p)) or "-")
                                           for r, e, x, b, t, p in rows], align=[True] * 6 + [False]))
    print(text.wrapped(f"err/budget: the worst entry's |error| over its budget ({dtype}; common/tolerance.py "
                       "via lessons/ring_attention/budget.py): the ring adds the same terms as one process in "
                       "another order, so each weight may be off by its score's dot product (gamma_(d+2)), "
                       "the rescales and the exps, and each sum by gamma_K, K = keys + 2 x tiles + 2",
                       hang=0))
    print(f"x K,V bytes: of all keys and values ({kv_bytes} B); every block but the one that arrives "
          f"last\n  is sent on: (N-1)/N = {(n - 1) / n:.3f} when the blocks are equal", flush=True)


def order(orders, n):
    """The order each rank started, computed and waited in (graded: the ring's structure, not the clock)."""
    seen, want = sorted(set(orders)), "scw" * (n - 1) + "c"
    print(text.wrapped("order" + (" on every rank" if len(seen) == 1 else "s") + ": "
                       + "; ".join(" ".join(o) if len(o) <= 24 else f"{' '.join(o[:21])} ... ({len(o)})" for o in seen)
                       + " (s: a transfer started, c: a block computed on, w: a transfer waited for)"))
    if n > 1:
        print(text.wrapped(("overlap: " if seen == [want] else "NOT the ring's overlap, which is: ") + "each step "
                           "but the last starts the next transfer, computes, then waits (s c w)"), flush=True)


def bar(value, most, width=12):
    return "#" * round(width * value / most) if most else ""


def causal(ctx, got, timings):
    """3. Per split, each rank's error and work, and its compute alone on the clock; returns the busiest
    rank over the mean of both. got: {split: [(rank, err, computed, useful, skipped), ...]}; timings:
    {split: [s per rank]}."""
    out = {}
    for split, rows in got.items():
        comp = [r[2] for r in rows]
        mean = sum(comp) / len(comp)
        out[split] = {"busiest_over_mean": max(comp) / mean if mean else 1.0,
                      "time_busiest_over_mean": max(timings[split]) / (sum(timings[split]) / len(comp))}
        print(f"{'contiguous' if split == 'contiguous' else 'zig-zag'}:")
        print(text.table(["rank", "err/budget", "q.k computed", "useful", "tiles skipped", "compute ms",
                          "computed"],
                         [(r, e, c, u, s, round(t * 1e3, 2), bar(c, max(comp)))
                          for (r, e, c, u, s), t in zip(rows, timings[split])],
                         align=[True] * 6 + [False]))
    c, z = out["contiguous"], out["zigzag"]
    print(f"busiest rank / mean: q.k computed {c['busiest_over_mean']:.2f} contiguous, "
          f"{z['busiest_over_mean']:.2f} zig-zag\n  compute ms (measured): {c['time_busiest_over_mean']:.2f} "
          f"contiguous, {z['time_busiest_over_mean']:.2f} zig-zag")
    print("q.k computed: (hi - lo) x hi for each chunk of queries lo..hi-1, every key up to its last one"
          "\nuseful: the products the mask keeps, hi(hi+1)/2 - lo(lo+1)/2 per chunk; the rest is the masked"
          "\n  half of each diagonal tile, computed and thrown away; skipped: tiles whose keys all come after"
          "\n  their queries", flush=True)
    return out


def causal_ring_lines(ctx, t_contig, t_zig, totals, cores, busiest):
    """The causal rings' times, contiguous vs zig-zag, and what they show (when they show it). busiest:
    {split: the busiest rank's measured compute alone, s}: the load-balance reason needs it to agree."""
    n = ctx.world_size
    if n == 1:
        return []
    ratio = t_contig / t_zig if t_zig > 0 else float("nan")
    lines = [f"the causal ring with overlap, slowest rank: contiguous {t_contig * 1e3:.2f} ms, zig-zag "
             f"{t_zig * 1e3:.2f} ms ({ratio:.2f}x)",
             f"  q.k computed over all ranks: contiguous {totals[0]}, zig-zag {totals[1]}"]
    lead = busiest["contiguous"] / busiest["zigzag"] if busiest["zigzag"] > 0 else float("nan")
    said = (f"busiest rank's compute alone: contiguous {busiest['contiguous'] * 1e3:.2f} ms, zig-zag "
            f"{busiest['zigzag'] * 1e3:.2f} ms")
    if ratio >= 1.2 and lead >= 1.2:
        lines.append(text.wrapped(f"zig-zag was faster, and the {said}: each step waits for the busiest "
                                  "rank, and contiguous's last rank computes at every step", indent="  ", hang=0))
    elif ratio >= 1.2:
        lines.append(text.wrapped(f"zig-zag was faster, but the {said}: the busiest rank's compute does not "
                                  "show the load balance as the reason here", indent="  ", hang=0))
    elif ratio > 1 / 1.2 and n > cores:
        lines.append(f"  about the same: {n} ranks share {cores} cores, and a rank waiting for its "
                     "neighbour leaves its\n  core to a busy one, so the total work sets the time more "
                     "than the busiest rank does")
    elif ratio > 1 / 1.2:
        lines.append("  about the same on this run: the clock does not show the imbalance here")
    else:
        lines.append("  zig-zag took longer on this run: the clock does not show the balance here"
                     + (f" ({n} ranks,\n  {cores} cores)" if n > cores else ""))
    return lines


def large(rows, args):
    """4. Each rank's largest score, the naive softmax's rows that are not finite, the online one's error."""
    print(text.table(["rank", "largest |score|", "naive: rows not finite", "of rows",
                      "online: max |err|", "err/budget"], rows, align=[True] * 6))
    print(f"exp overflows past {OVERFLOW[args.dtype]:.2f} in {args.dtype}: naive exp(s) / sum exp(s) "
          f"gives inf / inf = nan.\nThe online softmax subtracts the running max first. The budget grows "
          f"with the scores:\na score's dot product is rounded to about gamma_(d+2) x |q|.|k|, and the "
          "scores are that much larger", flush=True)


def sdpa(rows):
    """5. Every rank's rows against torch's scaled_dot_product_attention on one process."""
    print(text.table(["rank", "|ring - sdpa| / budget"], rows, align=[True, True]))
    print("no mask (contiguous) and causal (zig-zag); the budget: the ring's and sdpa's, in the run's "
          "dtype", flush=True)
