"""Lesson 15 — hierarchy: all-reduce and a mixture-of-experts dispatch across nodes, two levels.

The idea: a cluster has two networks, a fast one inside a node (shared memory, NVLink) and a slower
one between nodes. Split the world twice, N = M nodes x K local ranks; libraries do it two ways:
  * leader-based (Open MPI's coll/han, MPICH's SMP all-reduce): reduce to one leader per node,
    all-reduce among the M leaders, broadcast back: one rank and one link per node carry it all;
  * reduce-scatter, all-reduce, all-gather (NCCL's CollNet Direct, Horovod's hierarchical allreduce)
    as here: 1. reduce-scatter inside the node (lesson 09): local rank l holds shard l of the
    node's sum; 2. all-reduce shard l across nodes, one ring per local rank (lesson 05): M ranks
    each; 3. all-gather inside the node (lesson 09). K ranks, K links per node carry it.
  NCCL's tree is neither: a chain inside each node, a double binary tree across nodes.
Across nodes, each rank here sends about 2(M-1)/M x C/K (C: the buffer), a flat ring's edge rank
2(N-1)/N x C. Per node it is about 2(M-1)/M x C in either variant, and 2(N-1)/N x C for a flat ring
placed in blocks: hardly more. The gain is K links sharing those bytes, not fewer bytes. A
mixture-of-experts dispatch has this shape too: a token bound for experts on another node crosses
once, to my local rank there, then fans out inside (DeepEP's layered dispatch): fewer bytes across.

What to watch for:
  * section 1 finds the nodes (comm.Split_type(COMM_TYPE_SHARED)); on one machine, one node, the
    ranks are split into groups that stand in for nodes (--groups MxK:placement, --ranks-per-node).
  * section 2 counts what each rank and each node sent across (by where the peer runs); checks hold
    each rank's reduce-scatter and ring bytes, and the totals, to closed forms (uneven shards too).
  * section 3 races flat ring, two levels and the library, on real nodes beside an alpha-beta
    prediction from this run's own links (hierarchy/model.py); section 4 the dispatch, both ways.

Run it:  make lesson-15 NP=6 ARGS="--groups 3x2:round-robin"  (API=torch; 2x3:block: 2 groups of 3)
  .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py lessons/15_hierarchy.py --ranks-per-node 2
  bin/tutor testbed run --link-gbit 0.8 -- bin/tutor run 15 -n 4   (two real nodes, a slow link)
Read after: lessons/hierarchy/reference.py (where ranks really run, the routing's reference).
"""
import contextlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import numpy as np  # noqa: E402

from common import bandwidth, bootstrap, buffers, p2p, report, shards, subgroups, timing  # noqa: E402
from lessons.hierarchy import model, show  # noqa: E402
from lessons.hierarchy.reference import (DMODEL, EXPERTS, PLACEMENTS, TOKENS, delivered, group_for,  # noqa: E402
                                         moe_one_process, moe_tokens, parse_groups, placement_of,
                                         pretend_node, route, row, truth)

five, nine = bootstrap.lesson_module("05"), bootstrap.lesson_module("09")
SEED = 15                 # rank r's data comes from seed SEED + r
COUNT = 10007             # all-reduce items: odd, so shards are uneven at K = 2, 3 and M = 2, 3
DTYPES = ("float32", "float64")
EPS = {"float32": 1.2e-7, "float64": 2.3e-16}
RACE = dict(begin="256K", end="4M", mult=16, iters=3, warmup=1)    # default run: two sizes
BENCH = dict(begin="8", end="128M", mult=2, iters=20, warmup=5)    # --bench: nccl-tests' defaults


# ---------------------------------------------------------------- section 1: nodes
def find_node(ctx, args):
    """(my node's communicator, 'real' | 'pretend', my node's label): the ranks that share my memory,
    found by MPI; on one machine (one node), a group of K ranks standing in for a node, as placed."""
    from mpi4py import MPI
    node = ctx.comm.Split_type(MPI.COMM_TYPE_SHARED, key=ctx.rank)  # the ranks on my machine
    lowest = node.allreduce(ctx.rank, op=MPI.MIN)
    if len(set(ctx.comm.allgather(lowest))) > 1 or args.ranks_per_node == ctx.world_size:
        return node, "real", lowest
    node.Free()
    label = pretend_node(ctx.rank, ctx.world_size, args.ranks_per_node, args.placement)
    return ctx.comm.Split(color=label, key=ctx.rank), "pretend", label


def layout(ctx, node):
    """(node_id, local_rank): nodes numbered in the order of their lowest world rank, and my place in
    my node's communicator (which MPI ordered by world rank)."""
    from mpi4py import MPI
    # >>> exercise: layout
    local_rank = node.Get_rank()
    lowest = node.allreduce(ctx.rank, op=MPI.MIN)
    node_id = sorted(set(ctx.comm.allgather(lowest))).index(lowest)
    # <<< exercise: layout
    return node_id, local_rank


def make_groups(ctx, mesh, node_id, local_rank):
    """(my node's group, my local rank's group across nodes): mesh[j][l] = world rank of (node j, l)."""
    if ctx.api == "torch":
        import torch.distributed as dist
        # new_group is collective over the world: every rank makes every group, in the same order
        inside = [dist.new_group(ranks=row) for row in mesh]
        across = [dist.new_group(ranks=[row[l] for row in mesh]) for l in range(len(mesh[0]))]
        return inside[node_id], across[local_rank]
    inside = ctx.comm.Split(color=node_id, key=local_rank)   # my node, ordered by local rank
    across = ctx.comm.Split(color=local_rank, key=node_id)   # local rank l of every node, by node
    return inside, across


def nodes(ctx, args):
    """Section 1. Returns everything later sections need, as one namespace-like dict."""
    node, kind, label = find_node(ctx, args)
    home = ctx.comm.allgather(label)
    node_id, local_rank = layout(ctx, node)
    node.Free()
    where = ctx.comm.allgather((node_id, local_rank))
    m, k = max(j for j, _ in where) + 1, max(l for _, l in where) + 1
    mesh = [[None] * k for _ in range(m)]
    for r, (j, l) in enumerate(where):
        if j < m and l < k:
            mesh[j][l] = r
    if any(r is None for row in mesh for r in row) or m * k != ctx.world_size:
        ctx.fail(f"nodes of unequal sizes ({where}): two levels need K ranks on every node")
    if k * EXPERTS > 52:
        ctx.fail(f"{k} ranks per node x {EXPERTS} experts: a token's expert mask needs more than 52 bits")
    places = truth(home)
    placement = args.placement if kind == "pretend" else placement_of(places, k, m)
    inside, across = make_groups(ctx, mesh, node_id, local_rank)
    me = places[ctx.rank]
    lay = {"kind": kind, "home": home, "places": places, "mesh": mesh, "m": m, "k": k,
           "node_id": node_id, "local_rank": local_rank, "inside": inside, "across": across,
           "placement": placement, "node": me[0], "local": me[1],
           "spans": len({home[r] for r in mesh[node_id]}) - 1}
    if ctx.rank == 0:
        show.nodes(lay, places, args, ctx.transport)
    return lay


# ---------------------------------------------------------------- section 2: two levels, counted
def two_level(ctx, nets, buf, counts, lay, phase, dtype):
    """In place: buf (sum(counts) items of dtype) becomes the sum over every rank. counts[l]: local
    rank l's shard. nets: (inside my node, across nodes, the world) backends; phase: the meter's."""
    inner, outer, world = nets
    node_id, local_rank, k, m = lay["node_id"], lay["local_rank"], lay["k"], lay["m"]
    shard = buffers.empty(ctx, counts[local_rank], dtype)
    scratch = buffers.empty(ctx, counts[local_rank] // m + 1, dtype)  # the ring's largest chunk
    # >>> exercise: two_level
    with phase("1 reduce-scatter"):  # inside my node: shard l of the node's sum lands on local rank l
        nine.reduce_scatter(inner, buf, shard, counts, local_rank, k)
    with phase("2 across"):  # shard l around the ring of local rank l's M ranks, one per node
        five.ring_allreduce(shard, scratch, shards.chunk_bounds(counts[local_rank], m), node_id, m,
                            outer.exchange, five.inplace_add)
    with phase("3 all-gather"):  # inside my node again: every finished shard to every local rank
        nine.all_gather(inner, shard, buf, counts, local_rank, k)
    # <<< exercise: two_level


def flat(ctx, world, buf, phase, dtype):
    """Lesson 05's ring over all N ranks, as the world numbers them."""
    n = ctx.world_size
    scratch = buffers.empty(ctx, buffers.size(buf) // n + 1, dtype)
    with phase("flat"):
        five.ring_allreduce(buf, scratch, shards.chunk_bounds(buffers.size(buf), n), ctx.rank, n,
                            world.exchange, five.inplace_add)


def rel_err(got, want):
    got = buffers.to_host(got).astype(np.float64)
    return float((np.abs(got - want) / np.maximum(np.abs(want), 1e-30)).max()) if want.size else 0.0


def allreduce_counted(ctx, args, lay, meter, nets, world_raw):
    n, rank, count = ctx.world_size, ctx.rank, args.count
    every = [buffers.seeded(SEED + r, count, args.dtype) for r in range(n)]
    want = np.sum([e.astype(np.float64) for e in every], axis=0)  # one process, in float64
    mine = buffers.on_device(ctx, every[rank].copy())
    lib = buffers.on_device(ctx, every[rank].copy())
    ring = buffers.on_device(ctx, every[rank].copy())
    counts = shards.counts_displs(count, lay["k"])[0]
    two_level(ctx, nets, mine, counts, lay, meter.phase, args.dtype)
    flat(ctx, nets[2], ring, meter.phase, args.dtype)
    world_raw.allreduce(lib)
    world_raw.sync()
    sent = {p: meter.sent(p) for p in ("1 reduce-scatter", "2 across", "3 all-gather", "flat")}
    two = [sent[p] for p in ("1 reduce-scatter", "2 across", "3 all-gather")]
    return {"shard": counts[lay["local_rank"]], "two_steps": sum(s["steps"] for s in two),
            "rs_bytes": sent["1 reduce-scatter"]["inside"], "ag_bytes": sent["3 all-gather"]["inside"],
            "cross_bytes": sent["2 across"]["across"],
            "in_node_steps_across": sent["1 reduce-scatter"]["across"] + sent["3 all-gather"]["across"],
            "cross_inside": sent["2 across"]["inside"],
            "two_across": sum(s["across"] for s in two), "two_inside": sum(s["inside"] for s in two),
            "flat_steps": sent["flat"]["steps"], "flat_across": sent["flat"]["across"],
            "flat_inside": sent["flat"]["inside"],
            "err_ref": rel_err(mine, want), "err_lib": rel_err(mine, buffers.to_host(lib).astype(np.float64)),
            "flat_err_ref": rel_err(ring, want)}


def count_summary(ctx, mine, lay, itemsize, count):
    """Section 2 gathered to rank 0, which prints it: the totals the checks read ({} on the others)."""
    every = ctx.comm.gather(mine, root=0)
    if ctx.rank:
        return {}
    tot = {key: sum(e[key] for e in every) for key in ("two_across", "two_inside", "flat_across",
                                                         "flat_inside", "ag_bytes")}
    per_node = {key: [sum(e[key] for e, (j, _) in zip(every, lay["places"]) if j == node)
                      for node in range(lay["m"])] for key in ("flat_across", "two_across")}
    sums = {"two_across_total": tot["two_across"], "two_inside_total": tot["two_inside"],
            "flat_across_total": tot["flat_across"], "flat_total": tot["flat_across"] + tot["flat_inside"],
            "ag_total": tot["ag_bytes"], "flat_across_max": max(e["flat_across"] for e in every),
            "two_across_max": max(e["two_across"] for e in every), "buffer_bytes": count * itemsize,
            "flat_across_per_node": per_node["flat_across"], "two_across_per_node": per_node["two_across"],
            "flat_across_node_max": max(per_node["flat_across"]),
            "two_across_node_max": max(per_node["two_across"])}
    show.counts(every, sums, lay, ctx.world_size, itemsize, count)
    return sums


# ---------------------------------------------------------------- section 3: the race
def race(ctx, args, lay, raw, pick, sweep):
    n, rank, itemsize = ctx.world_size, ctx.rank, np.dtype(args.dtype).itemsize
    none = lambda label: contextlib.nullcontext()  # noqa: E731  (uncounted, for the clock)
    rows = []
    for size in sweep:
        count = max(size // itemsize, 1)
        x = buffers.seeded(SEED + rank, count, args.dtype)
        bufs = {name: buffers.on_device(ctx, x.copy()) for name in ("flat ring", "two levels", "library")}
        counts = shards.counts_displs(count, lay["k"])[0]
        fns = {"flat ring": lambda: flat(ctx, raw[2], bufs["flat ring"], none, args.dtype),
               "two levels": lambda: two_level(ctx, raw, bufs["two levels"], counts, lay, none, args.dtype),
               "library": lambda: raw[2].allreduce(bufs["library"])}
        for fn in fns.values():
            fn()
        raw[2].sync()
        want = buffers.to_host(bufs["library"]).astype(np.float64)
        tol = 2 * (n - 1) * EPS[args.dtype]
        bad = {name: ctx.comm.allreduce(int((np.abs(buffers.to_host(b).astype(np.float64) - want)
                                             > tol * np.abs(want)).sum())) for name, b in bufs.items()}
        spread = {}
        secs = timing.best_of(ctx, raw[2], fns, pick["warmup"], pick["iters"], spread)
        for name, t in secs.items():
            rows.append({"size": count * itemsize, "count": count, "type": args.dtype, "redop": "sum",
                         "algo": name, "time_us": t * 1e6, "algbw": bandwidth.algbw(count * itemsize, t),
                         "busbw": bandwidth.busbw("allreduce", count * itemsize, t, n),
                         "wrong": bad[name], "noise_us": spread[name] * 1e6,
                         "vs_flat": secs["flat ring"] / t if t > 0 else 0.0})
    real = lay["kind"] == "real" and lay["m"] > 1  # real nodes: the alpha-beta model, from these links
    return rows, model.calibrate(ctx, raw, lay) if real else None


# ---------------------------------------------------------------- section 4: mixture-of-experts dispatch
def send_rows(ctx, be, per, me, n, phase, label):
    """per[j]: the rows for peer j (of n, me among them): the counts first (lesson 09), then the rows."""
    w = DMODEL + 2
    send_counts = np.array([len(p) for p in per], dtype=np.int64)
    with phase(label + " counts"):
        got = buffers.empty(ctx, n, np.int64)
        nine.all_to_all(be, buffers.on_device(ctx, send_counts), [1] * n, got, [1] * n, me, n)
        be.sync()
        recv_counts = buffers.to_host(got).astype(np.int64)
    flat_rows = np.concatenate([np.reshape(p, (-1, w)) for p in per]).ravel()
    with phase(label):
        into = buffers.empty(ctx, int(recv_counts.sum()) * w, np.float64)
        nine.all_to_all(be, buffers.on_device(ctx, flat_rows), list(send_counts * w), into,
                        list(recv_counts * w), me, n)
        be.sync()
    return buffers.to_host(into).reshape(-1, w)


def flat_dispatch(ctx, world, x, chosen, phase):
    """One copy of a token per rank that holds any of its experts, straight there."""
    n, gid0 = ctx.world_size, ctx.rank * len(x)
    per = [[] for _ in range(n)]
    for t, experts in enumerate(chosen):
        for dest in sorted({int(e) // EXPERTS for e in experts}):
            per[dest].append(row(x[t], gid0 + t, sum(1 << (int(e) % EXPERTS) for e in experts
                                                      if int(e) // EXPERTS == dest)))
    return send_rows(ctx, world, per, ctx.rank, n, phase, "moe flat")


def layered_dispatch(ctx, nets, x, chosen, lay, phase):
    """One copy of a token per node that holds any of its experts, to my local rank there; that rank
    fans it out inside its node. Masks: node-wide bits (local rank l's experts at l*EXPERTS ...)."""
    inner, outer, _ = nets
    k, m, gid0 = lay["k"], lay["m"], ctx.rank * len(x)
    pos = {w: (j, l) for j, ranks in enumerate(lay["mesh"]) for l, w in enumerate(ranks)}  # world -> (node, local)
    ones = (1 << EXPERTS) - 1
    # >>> exercise: layered
    per_node = [[] for _ in range(m)]
    for t, experts in enumerate(chosen):
        owners = [pos[int(e) // EXPERTS] + (int(e) % EXPERTS,) for e in experts]  # (node, local, slot)
        for j in sorted({o[0] for o in owners}):
            per_node[j].append(row(x[t], gid0 + t, sum(1 << (l * EXPERTS + s) for o, l, s in owners if o == j)))
    held = send_rows(ctx, outer, per_node, lay["node_id"], m, phase, "moe across")
    per_local = [[] for _ in range(k)]
    for r in held:
        for l in range(k):
            bits = (int(r[-1]) >> (l * EXPERTS)) & ones
            if bits:
                per_local[l].append(row(r[:DMODEL], r[DMODEL], bits))
    return send_rows(ctx, inner, per_local, lay["local_rank"], k, phase, "moe fan-out")
    # <<< exercise: layered


def moe(ctx, args, lay, meter, nets):
    x = moe_tokens(ctx.rank, args.tokens)
    chosen = route(x, ctx.world_size)
    got_flat = delivered(flat_dispatch(ctx, nets[2], x, chosen, meter.phase))
    got_layered = delivered(layered_dispatch(ctx, nets, x, chosen, lay, meter.phase))
    want, rank_pairs, node_pairs = moe_one_process(ctx, args.tokens, lay["places"])
    differ = lambda a, b: len(set(a) ^ set(b)) + sum(a[g] != b[g] for g in set(a) & set(b))  # noqa: E731
    s = {p: meter.sent(p) for p in ("moe flat", "moe across", "moe fan-out")}
    return {"remote_rank_pairs": rank_pairs, "remote_node_pairs": node_pairs,
            "moe_flat_across": s["moe flat"]["across"], "moe_layered_across": s["moe across"]["across"],
            "moe_fan_across": s["moe fan-out"]["across"], "moe_fan_inside": s["moe fan-out"]["inside"],
            "moe_wrong_flat": differ(got_layered, got_flat), "moe_wrong_ref": differ(got_layered, want),
            "moe_rows": len(got_layered)}


def moe_summary(ctx, mine, tokens):
    """Section 4 gathered to rank 0, which prints it: this routing's de-duplication, and the bytes'."""
    every = ctx.comm.gather(mine, root=0)
    if ctx.rank:
        return {}
    pairs = [sum(e[k] for e in every) for k in ("remote_rank_pairs", "remote_node_pairs")]
    sent = [sum(e[k] for e in every) for k in ("moe_flat_across", "moe_layered_across")]
    dedup = pairs[0] / pairs[1] if pairs[1] else 1.0
    ratio = sent[0] / sent[1] if sent[1] else 1.0
    sums = {"moe_dedup": dedup, "moe_across_ratio": ratio, "moe_ratio_over_dedup": ratio / dedup}
    show.moe(every, sums, tokens)
    return sums


def flags():
    parser = bootstrap.lesson_parser(__file__, __doc__)
    parser.add_argument("--groups", type=parse_groups, metavar="MxK:PLACEMENT,...",
                        help="on one machine: M groups of K ranks stand in for nodes, placed block or "
                        "round-robin; the entry of N = M x K ranks is used (e.g. 3x2:round-robin,2x4:block)")
    parser.add_argument("--ranks-per-node", type=bootstrap.positive(int), metavar="K",
                        help="on one machine: groups of K ranks stand in for nodes (default: two groups when "
                        "N is even, else one); real nodes win when MPI finds them")
    parser.add_argument("--placement", choices=PLACEMENTS,
                        help="with --ranks-per-node: ranks 0..K-1 in group 0 (block, the default) or rank r in "
                        "group r mod N/K (round-robin), as a launcher may place them")
    parser.add_argument("--count", type=bootstrap.positive(int), default=COUNT,
                        help=f"all-reduce items per rank (default {COUNT})")
    parser.add_argument("--tokens", type=bootstrap.nonneg_int, default=TOKENS,
                        help=f"mixture of experts: tokens per rank (default {TOKENS})")
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    bandwidth.add_sweep_flags(parser, BENCH)
    parser.add_argument("--no-race", action="store_true", help="skip section 3's race")
    return parser


def networks(ctx, lay):
    """(raw, meter, nets): the backends inside my node, across nodes (my local rank's ring) and over
    the world, and the same three metered: every byte counted by where its peer really runs."""
    world_raw = p2p.backend(ctx)
    raw = (subgroups.backend(ctx, lay["inside"]), subgroups.backend(ctx, lay["across"]), world_raw)
    meter = subgroups.Meter(lay["home"], lay["home"][ctx.rank])
    nets = (meter.wrap(raw[0], lay["mesh"][lay["node_id"]]),
            meter.wrap(raw[1], [ranks[lay["local_rank"]] for ranks in lay["mesh"]]),
            meter.wrap(world_raw, range(ctx.world_size)))
    return raw, meter, nets


def shape(ctx, args):
    """Settle --groups / --ranks-per-node / --placement into args.ranks_per_node, args.placement and
    args.shape_from (what section 1 says they came from); returns N."""
    n = ctx.world_size
    if args.groups and (args.ranks_per_node or args.placement):
        ctx.fail("--groups sets K and the placement: give it, or --ranks-per-node and --placement")
    picked = group_for(args.groups, n)
    args.asked = bool(args.groups or args.ranks_per_node or args.placement)  # said when real nodes win
    if picked:
        args.ranks_per_node, args.placement = picked
        args.shape_from = f"--groups {n // picked[0]}x{picked[0]}:{picked[1]}"
    elif args.ranks_per_node:
        args.shape_from = f"--ranks-per-node {args.ranks_per_node}"
    else:  # two groups when N is even; --groups names no layout of N ranks, or was not given
        args.ranks_per_node = n // 2 if n % 2 == 0 else n
        args.shape_from = "the default" + (f" (--groups has no layout of {n} ranks)" if args.groups else "")
    args.placement = args.placement or "block"
    if n % args.ranks_per_node:
        ctx.fail(f"--ranks-per-node {args.ranks_per_node} does not divide {n} ranks: nodes must be equal")
    return n


def main():
    args, ctx = bootstrap.start(__file__, flags())
    n = shape(ctx, args)                                          # K and placement of the groups
    try:
        pick, sweep = bandwidth.sweep_plan(args, RACE, BENCH)
    except ValueError as exc:
        ctx.fail(str(exc))
    itemsize = np.dtype(args.dtype).itemsize

    report.section(ctx, f"1. nodes: {n} ranks, api {ctx.api} ({ctx.transport})")
    lay = nodes(ctx, args)                                        # 1. the nodes, my place in them
    raw, meter, nets = networks(ctx, lay)                         #    inside, across, the world
    params = {"dtype": args.dtype, "itemsize": itemsize, "count": args.count, "k": lay["k"], "nodes": lay["m"],
              "real": int(lay["kind"] == "real"), "placement": lay["placement"], "tokens": args.tokens,
              "dmodel": DMODEL, "race": int(not args.no_race and n > 1)}
    report.section(ctx, f"2. all-reduce in two levels: {lay['m']} nodes x {lay['k']} ranks, counted")
    values = allreduce_counted(ctx, args, lay, meter, nets, raw[2])  # 2. two levels, every byte counted
    summary = count_summary(ctx, values, lay, itemsize, args.count)
    if params["race"]:
        report.section(ctx, "3. the race: flat ring, two levels, the library (all-reduce, in place)")
        rows, cal = race(ctx, args, lay, raw, pick, sweep)        # 3. flat, two levels, the library
        ratios = cal and model.table(rows, cal, lay, n)           #    and the model, on real nodes
        if ctx.rank == 0:
            show.race(rows, lay, summary, pick, ctx.transport, cal, ratios)
        summary.update(race=rows, race_wrong=sum(r["wrong"] for r in rows if r["algo"] == "two levels"),
                       race_model=[{"size": s, "measured": a, "predicted": b} for s, a, b in ratios or []])
    report.section(ctx, "4. mixture-of-experts dispatch: flat, and layered (once per node, then fan out)")
    values.update(moe(ctx, args, lay, meter, nets))               # 4. the dispatch, flat and layered
    summary.update(moe_summary(ctx, values, args.tokens))
    values.update(node=lay["node"], local=lay["local"], node_id=lay["node_id"], local_rank=lay["local_rank"],
                  spans=lay["spans"], host=ctx.host)
    report.finish(ctx, values, summary=summary, params=params)


if __name__ == "__main__":
    main()
