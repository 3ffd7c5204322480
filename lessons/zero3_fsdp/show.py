"""What lesson 10's rank 0 prints: the shards, the four trainings compared, the ZeRO table and torch's
FSDP. Collective where a function gathers (every rank calls it; rank 0 prints). The page passes in
what it owns (the run's numbers): nothing here imports the page."""
from common import text


def shards(ctx, dims, items, sizes_held, itemsize):
    """Section 1: per layer its items, the padded size, what each rank holds and the padding."""
    if ctx.rank:
        return
    n = ctx.world_size
    rows = [(f"{fan_in}+1 x {fan_out}", k, size * n, size, size * n - k)
            for (fan_in, fan_out), k, size in zip(dims, items, sizes_held)]
    print(text.table(["layer (in+1) x out", "items", "padded to", "per rank", "padding"], rows))
    total, mine = sum(r[1] for r in rows), sum(r[3] for r in rows)
    print(f"every rank holds {mine} of the model's {total} parameters ({mine * itemsize} B); the "
          f"last shard of a layer\nends in its padding, zeros whose gradient is 0", flush=True)


def equal(ctx, args, row, lib):
    """Section 2: max |dparam| between the four trainings, per rank (equal ranks once), and the worst
    parameter's |dparam| / budget."""
    rows = ctx.comm.gather((ctx.rank, row["sgd_vs_single"], row["end_vs_single"], row["end_vs_dp"],
                            row["dp_vs_single"], row["library_vs_single"],
                            *(f"{row[k + '_ratio']:.2g}" for k in ("end_vs_single", "end_vs_dp", "library_vs_single"))),
                           root=0)
    if ctx.rank:
        return
    print("(a) ZeRO-3 by hand  (b) one process, whole batch  (d) (a) on the library's collectives"
          "\n(c) data parallel: each layer's gradient all-reduced (reduce-scatter, then all-gather)")
    rows = [(r[0], "-" if r[1] is None else f"{r[1]:.3g}") + tuple(f"{d:.3g}" for d in r[2:6]) + tuple(r[6:])
            for r in rows]  # no SGD steps: -
    print(text.table(["rank", "SGD: |a-b|", "end: |a-b|", "end: |a-c|", "end: |c-b|", "end: |d-b|",
                      "a-b/budget", "a-c/budget", "d-b/budget"], text.once(rows), align=[True] * 9))
    print(f"max |dparam| after the {args.sgd_steps} SGD steps and at the end; /budget: the worst "
          "parameter's,\n<= 1 inside: the ring adds the ranks' partial sums in its own order, not "
          "the single process's")
    print(f"budget: parity per parameter, |H| feedback + Adam's slope, {args.dtype} (zero3_fsdp/budget.py)"
          f"\n  largest {row['budget_max']:.2g}, median {row['budget_median']:.2g}", flush=True)
    print(f"(d) = (a)'s code on the library's calls: {lib.names['all_gather']}, "
          f"{lib.names['reduce_scatter']}")
    for op in ("all_gather", "reduce_scatter"):
        if op in lib.missing:  # a line on padding gets what it means here: no padding is needed
            said = lib.missing[op] + ("; the padded shards are equal, so it takes them as they are"
                                      if "padded" in lib.missing[op] else "")
            print(text.wrapped(said, indent="  ", hang=0))
    print(end="", flush=True)


def ratio(x, unit):
    return f"{x / unit:.2f}" if unit else "-"


def zero_table(ctx, row, padded_bytes, largest, lib):
    """Section 3: the standard ZeRO table, counted and measured on this run: rank 0's figures (all
    ranks' when they differ). largest: the largest layer's padded bytes."""
    rows = ctx.comm.gather({k: row[k] for k in row if k not in ("comm", "layers")}, root=0)
    if ctx.rank:
        return
    n = ctx.world_size
    unit = padded_bytes * (n - 1) // n  # one ring all-gather or reduce-scatter of every layer
    same = all(r == rows[0] for r in rows)
    for rank, r in enumerate(rows if not same else rows[:1]):
        table = [(f"sent in {ph}", r["dp_sent"][ph], ratio(r["dp_sent"][ph], unit), r["sent"][ph],
                  ratio(r["sent"][ph], unit), r["library_sent"][ph])
                 for ph in ("forward", "backward", "step")]
        dp_total, z_total = sum(r["dp_sent"].values()), sum(r["sent"].values())
        table.append(("sent in all", dp_total, ratio(dp_total, unit), z_total, ratio(z_total, unit),
                      sum(r["library_sent"].values())))
        table += [("held: parameters (peak)", r["dp_param_bytes"], "", r["peak_param_bytes"], "", ""),
                  ("held: gradients (peak)", r["dp_grad_bytes"], "", r["peak_grad_bytes"], "", ""),
                  ("held: Adam's m and v", r["dp_state_bytes"], "", r["state_bytes"], "", "")]
        if not same:
            print(f"rank {rank}:")
        print(text.table(["per rank, per step", "data parallel B", "x", "ZeRO-3 B", "x", "(d) nominal B"],
                         table, align=[False, True, True, True, True, True]))
    if n == 1:
        print("one rank: nothing to send, and its shards are the whole model")
    else:
        print(f"x: in units of P (N-1)/N = {unit} B, P = {padded_bytes} B the padded parameters; "
              + ("the same on every rank" if same else "the ranks differ"))
        gloo = "reduce_scatter" in lib.rules
        print(text.wrapped(f"(d) nominal: what the library's algorithm sends for its calls, "
                           f"{ratio(sum(rows[0]['library_sent'].values()), unit)} x" + (
                               ": gloo's reduce-scatter is an all-reduce that keeps one block, 2 units where a "
                               "ring's is 1 (lesson 09 measures its bytes)" if gloo else
                               " (a ring's volume: the library does not say what it sent)")))
    r = rows[0]
    extra = r["peak_gathered_bytes"]
    if extra == largest:
        print(f"ZeRO-3's parameter peak = my shards ({r['shard_bytes']} B) + one gathered layer, the "
              f"largest ({largest} B):\nforward and backward free each layer before gathering the next")
    else:
        print(f"ZeRO-3's parameter peak = my shards ({r['shard_bytes']} B) + {extra} B of gathered "
              f"layers held at once\n(the largest layer alone is {largest} B)")
    print(end="", flush=True)


def torch_fsdp(ctx, row):
    """Section 4: how far torch's fully_shard ends from (a), and the items each rank holds."""
    got = ctx.comm.gather((ctx.rank, row["torch_vs_hand"], f"{row['torch_vs_hand_ratio']:.2g}",
                           sum(row["torch_items_held"]), row["torch_items_held"]), root=0)
    if ctx.rank:
        return
    print(text.table(["rank", "max |torch - a|", "/budget", "items held", "per parameter (w, b, ...)"],
                     text.once([(r, d, q, s, str(h)) for r, d, q, s, h in got]),
                     align=[True, True, True, True, False]))
    uneven = len({s for _, _, _, s, _ in got}) > 1
    print("fully_shard cuts each parameter tensor along its first dimension (rows of weight, "
          "items of bias),\nnot one flat vector per layer" + (
              ": here N does not divide some of them, so the ranks hold unequal parts"
              if uneven else ""), flush=True)
