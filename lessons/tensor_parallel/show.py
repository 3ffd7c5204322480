"""What lesson 11's rank 0 prints: its tables and the sentences the numbers support.

    split(ctx, cuts)                            1. who holds which columns, rows and tokens
    collectives(ctx, args, every, itemsize)     2. each way's calls and the bytes each rank sent
    held(ctx, every)                            3. what each rank keeps for backward
    equal(ctx, args, every, lib, gap)           4. every way against one process; why g waits for B
    torch_plans(ctx, got)                       5. torch's own plans (--api torch)

`every` is the rows gathered from every rank ({"ways": [...], "library": [...], "tokens": T}); the
rows are read by way name ("naive", "megatron", "sequence", "sequence_regather").
"""
from common import text

LABEL = {"naive": "(1) naive", "megatron": "(2) Megatron", "sequence": "(3) sequence par.",
         "sequence_regather": "(4) (3), LN(x) again"}
SHORT = {"all_reduce": "AR", "all_gather": "AG", "reduce_scatter": "RS"}
TORCH_SHORT = {"all_reduce": "AR", "all_gather_into_tensor": "AG", "reduce_scatter_tensor": "RS"}


def span(bounds):
    lo, hi = bounds
    return f"{lo}:{hi} ({hi - lo})"


def per_rank(values):
    """A row's per-rank numbers: all of them up to 4 ranks, else lowest .. highest."""
    values = list(values)
    if len(set(values)) == 1:
        return f"{values[0]} each"
    return " ".join(map(str, values)) if len(values) <= 4 else f"{min(values)} .. {max(values)}"


def by_way(rows):
    """{way name: row} of a list of rows that each name their way."""
    return {r["way"]: r for r in rows}


def split(ctx, cuts):
    print("z = x + GeLU(LN(x) @ A + a) @ B + b, A: hidden x F, B: F x hidden; loss = sum(W * z), "
          "W seeded,\nso dz = W on every rank without a message", flush=True)
    rows = [(r, span(cuts["fcols"][r]), span(cuts["fcols"][r]), span(cuts["rows"][r]),
             span(cuts["hcols"][r])) for r in range(ctx.world_size)]
    print(text.table(["rank", "A, a: columns", "B: rows", "(3), (4): tokens", "(1): B, b, z columns"],
                     rows, align=[True, False, False, False, False]))
    print("(2) adds b once, after g's sum (every rank holds the same sum); (3) and (4) add it to the sum\n"
          "for my tokens, after the reduce-scatter; (1) adds my columns of b to my columns of z",
          flush=True)


def collectives(ctx, args, every, itemsize):
    n = ctx.world_size
    ways = [by_way(r["ways"]) for r in every]  # per rank
    unit = (n - 1) * args.tokens * args.hidden * itemsize  # N x one all-gather of the activation
    rows = []
    for way, label in LABEL.items():
        mine = [w[way] for w in ways]
        for ph in ("forward", "backward", "grads"):
            sent = [m[f"{ph}_bytes"] for m in mine]
            said = ", ".join(f"{SHORT[name]} {what}" for name, what in mine[0]["calls"].get(ph, []))
            if ph == "grads" and not said:
                continue
            rows.append((label if ph == "forward" else "", ph, said or "-", per_rank(sent),
                         f"{sum(sent) / unit:.2f}" if unit else "-"))
    print(text.table(["way", "pass", "collectives, in order", "bytes sent per rank", "x"], rows,
                     align=[False, False, False, True, True]))
    print(f"AG all-gather, RS reduce-scatter, AR all-reduce (lesson 05's ring on whole tokens);\n"
          f"bytes: counted by common/counting; x: mean per rank in units of (N-1)/N x tokens x hidden "
          f"x {itemsize} B", flush=True)
    if n == 1:
        print("one rank: every collective is called, and sends nothing")
        return
    same = all(w["megatron"][f"{ph}_bytes"] == w["sequence"][f"{ph}_bytes"] for w in ways
               for ph in ("forward", "backward"))
    if same:
        print("(2) and (3) send the same bytes on every rank: g's all-reduce = (3)'s reduce-scatter "
              "+ all-gather")
    total = {(way, ph): sum(w[way][f"{ph}_bytes"] for w in ways) for way in ("naive", "megatron")
             for ph in ("forward", "backward")}
    if total["megatron", "forward"] and total["megatron", "backward"]:
        print(f"(1) sends {total['naive', 'forward'] / total['megatron', 'forward']:.2f} x (2)'s bytes "
              f"forward and {total['naive', 'backward'] / total['megatron', 'backward']:.2f} x backward: "
              f"it moves h, tokens x F (F = {args.ffn}),\nwhere (2) moves only sums of tokens x hidden")
    print(end="", flush=True)


def held(ctx, every):
    ways = [by_way(r["ways"]) for r in every]  # per rank
    rows = []
    for way, label in LABEL.items():
        h = ways[0][way]["held"]
        rows.append((label, h["LN"], h["input"], h["MLP"], h["output"],
                     per_rank(w[way]["held_bytes"] for w in ways)))
    print(text.table(["way", "LN: x-hat, 1/sigma", "A's input", "MLP: u (h)", "output z",
                      "total, every rank"], rows, align=[False, True, True, True, True, True]))
    print("rank 0's parts; the last column is every rank's total (bytes, measured: the arrays each\n"
          "forward hands to its backward, and its output)", flush=True)
    if ctx.world_size > 1:
        r0 = ways[0]
        keep = {way: r0[way]["held"]["LN"] + r0[way]["held"]["input"] + r0[way]["held"]["output"]
                for way in ("megatron", "sequence_regather")}
        mine, tokens = r0["sequence_regather"]["tokens_held"], every[0]["tokens"]
        print(f"in (4) rank 0 keeps {keep['sequence_regather'] / keep['megatron']:.3f} of (2)'s LN, input "
              f"and output bytes; its share of the tokens:\n{mine}/{tokens} = {mine / tokens:.3f}")
    print(end="", flush=True)


def equal(ctx, args, every, lib, gap):
    """lib: the library's Collectives (its names and what it lacks); gap: gelu_of_sums, None on 1 rank."""
    heads = ["way", "z", "dx", "dA, da", "dB, db", "dgamma, dbeta", "(lib) all"]
    ways, library = [by_way(r["ways"]) for r in every], [by_way(r["library"]) for r in every]
    rows = []
    for way, label in LABEL.items():
        worst = [max(w[way][k] for w in ways) for k in ("z_ratio", "dx_ratio", "dA_ratio", "dB_ratio", "dln_ratio")]
        rows.append([label] + [f"{r:.2g}" for r in worst] + [f"{max(lb[way]['ratio'] for lb in library):.2g}"])
    print(text.table(heads, rows, align=[False] + [True] * 6))
    print("worst |difference| / budget over every entry and rank, <= 1 inside: the same sums in\n"
          "another order than one process's (the ranks' partial sums; (1) adds b before x)")
    print(f"budget: parity of two orders, per entry, {args.dtype} (lessons/tensor_parallel/budget.py)")
    names = [lib.names[k] for k in ("all_reduce", "all_gather", "reduce_scatter")]
    print(text.wrapped(f"(lib): the same code on {', '.join(names)}" + (
        " (MPI_Allgatherv, MPI_Reduce_scatter for uneven blocks)" if ctx.transport == "mpi" else "")))
    for call in ("all_gather", "reduce_scatter"):
        if call in lib.missing:
            print(text.wrapped(lib.missing[call], indent="  ", hang=0))
    if gap:
        print(f"g waits for B: GeLU acts on each column of u alone, and each rank holds whole columns of "
              f"A.\nSplit A by rows instead and u is a sum over ranks: here GeLU(sum) and the sum of "
              f"GeLUs\ndiffer by {gap:.3g} (relative), so the sum must come first", flush=True)


def torch_plans(ctx, got):
    """got: every rank's torch_tp.torch_own rows, rank order."""
    mine = [by_way(rows) for rows in got]  # per rank
    rows = []
    for way, r0 in mine[0].items():
        calls = [", ".join(TORCH_SHORT.get(c, c) for c in r0[f"{ph}_calls"].split()) or "-"
                 for ph in ("forward", "backward")]
        rows.append(("(2) ColwiseParallel + RowwiseParallel" if way == "megatron" else
                     "(3) the same + SequenceParallel", f"{max(m[way]['ratio'] for m in mine):.2g}", *calls))
    print(text.table(["torch's plan", "diff/budget", "forward", "backward"], rows,
                     align=[False, True, False, False]))
    shares = [m["sequence"]["tokens_held"] for m in mine]
    print("the same weights; worst |difference| / budget against one process, z, dx, every gradient;\n"
          "forward, backward: the collectives torch ran (its c10d functional ops, rank 0's)\n"
          f"torch cuts the tokens as torch.chunk does: {' '.join(map(str, shares))}", flush=True)
    partial = mine[0]["sequence"]["partial_grads"]
    if partial:
        print(f"in (3) torch leaves the gradients of {', '.join(partial.split())} as Partial(sum) "
              "DTensors:\nsummed over ranks only when read (full_tensor here), where (3) all-reduces "
              "them at once", flush=True)
