"""Lesson 16 — scale on paper: predict collectives on real clusters from link specs, and check each
prediction against a published measurement.

The idea: lesson 07's alpha-beta formulas need only a latency and a bandwidth per link. Take them
from data sheets (NVLink per GPU, one NIC per GPU or a few per node), take ONE protocol efficiency
(what NCCL gets out of a link: 370 of NVLink 4's 450 GB/s, said by NCCL's maintainer), and the
ring's busbw on a cluster is the slowest link class it crosses: inside a node the GPU's NVLink,
across nodes the node's NICs shared by its rings. Nothing is fitted to the figures it is checked
against; the published figures come with the address where they were read (lessons/scale_on_paper/links.py).

What to watch for:
  * section 1: the link classes, then predicted / published / ratio / source for seven all-reduce
    busbw figures, each held within +-15% by the runner (those bound by NICs sit low: NCCL gets more
    of a NIC than of NVLink, and the model has one efficiency). Then the two it misses, NVLink SHARP
    (the switch itself reduces), and why: the busbw it reaches implies a lower efficiency per link
    than the ring's, which a model of links alone cannot know.
  * section 2: a training step of an 8B- and a 70B-shaped transformer on 8 to 1024 GPUs: data
    parallelism (lesson 08; flat ring vs the two-level hierarchy), ZeRO-3 / FSDP (lesson 10), and 3D:
    tensor parallelism in the node (lesson 11), pipeline stages across nodes (lesson 12), data
    parallelism across the rest. Communication time beside compute at a stated FLOP rate: the step
    lies between max(compute, comm) (all overlapped) and their sum (none).
  * section 3: the same step dry-run at world size 1024 in this one process through the kit's
    counting communicator (common/counting.py; nothing moves): its counts equal the closed forms.
    FSDP's root stays gathered from forward to backward, as torch's fully_shard keeps it (2L+1
    all-gathers, not 2(L+1)): tests/test_scale_on_paper.py counts torch's own calls on its fake
    process group at 1024 ranks to hold the dry run to that.
  * section 4 (2+ ranks): the model with THIS machine's alpha and beta (lesson 07's measurement)
    predicts the ring all-reduce of lessons 05 and 07, timed here, size by size.
  * your cluster: --gpus-per-node, --nodes, --intra-GBps, --nic-Gbps, --nics-per-node describe it;
    section 5 prices an all-reduce of --size on it and section 2 uses it.

Run it:
  make lesson-16 NP=2                 (ARGS="--nodes 16 --nic-Gbps 200 --nics-per-node 4")
  .venv/bin/mpiexec -n 2 .venv/bin/python -m mpi4py lessons/16_scale_on_paper.py --api mpi4py
Read after it: lessons/scale_on_paper/links.py (links, prices, the figures), lessons/scale_on_paper/step.py (the step),
lessons/scale_on_paper/dry.py (the dry run).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import numpy as np  # noqa: E402

from common import bandwidth, bootstrap, buffers, p2p, report  # noqa: E402
from common.timing import best_of  # noqa: E402
from lessons.allreduce_algorithms.model import measure_model, predict, wrapped  # noqa: E402
from lessons.allreduce_algorithms.schedules import checked_plan, ring_schedule  # noqa: E402
from lessons.scale_on_paper import dry as scale_dry, links as sm, step as st  # noqa: E402

WORLDS = (8, 64, 1024)       # GPUs in section 2's table
DRY_WORLD = 1024             # the dry run's world size
CALIB = (4096, 65536, 1 << 20)  # section 4: all-reduce sizes timed here, bytes
ITERS = 5                    # section 4: timed calls per batch
PING_ITERS = 10              # section 4: round trips per ping-pong size
HBM_GB = 80                  # H100 SXM memory: "80 GB HBM3 (5 stacks)", glennklockwood.com/garden/processors/h100


def short(url):
    return url.replace("https://", "").replace("github.com/", "gh:")


# ---- section 1: the cluster from its data sheet, against published figures ---------------------

def figure_rows(rows):
    """The reported rows: the cluster's shape and raw link specs (the runner recomputes the price from
    them), the prediction, the published figure and where it was read."""
    out = []
    for row in rows:
        intra, nic, predicted = sm.LINKS[row["intra"]], sm.LINKS[row["nic"]], sm.price(row)
        out.append(dict(label=row["label"], algo=row["algo"], gpus_per_node=row["gpus_per_node"],
                        nodes=row["nodes"], nics_per_node=row["nics_per_node"], per_nic=row["per_nic"],
                        size=row["size"], intra_GBps=intra["GBps"], nic_GBps=nic["GBps"],
                        alpha_intra_us=intra["alpha_us"], alpha_nic_us=nic["alpha_us"],
                        predicted=predicted, published=row["published"], ratio=predicted / row["published"],
                        source=row["source"], phrase=row["phrase"]))
    return out


def show_links():
    print(wrapped(f"one protocol efficiency for every link: {sm.EFFICIENCY:.3f} (370 of 450 GB/s, "
                  f"{short(sm.EFFICIENCY_SOURCE)}); so that sentence's H100 ring figure is not a check"))
    print(report.table(["link class", "GB/s one way", "alpha us", "read at (full address: the JSON)"],
                       [(v["what"], v["GBps"], v["alpha_us"], short(v["source"]).split("/")[0])
                        for v in sm.LINKS.values()]))
    print(wrapped(f"alpha: the upper end of the latency ranges read at {short(sm.ALPHA_SOURCE)}; the "
                  "figures are at GiB sizes, where it moves no busbw by 1%"))


def show_figures(figures, misses):
    head = ["cluster (all-reduce busbw, GB/s)", "pred", "publ", "ratio", "source"]
    print(report.table(head, [(f["label"], round(f["predicted"], 1), f["published"], round(f["ratio"], 2),
                               short(f["source"])) for f in figures],
                       align=[False, True, True, True, False]))
    inside = sum(0.85 <= f["ratio"] <= 1.15 for f in figures)
    print(f"{inside} of {len(figures)} within +-15% (the runner checks every one)")
    nic_bound = [f for f in figures if f["nodes"] > 1 and f["nics_per_node"] * f["nic_GBps"] < f["intra_GBps"]]
    if any(f["ratio"] < 0.9 for f in nic_bound):  # what those figures say NCCL gets out of a NIC
        got = [f["published"] / f["nic_GBps"] / (1 if f["per_nic"] else f["nics_per_node"]) for f in nic_bound]
        print(wrapped(f"the rows bound by the NICs imply NCCL gets {', '.join(f'{x:.2f}' for x in got)} of "
                      f"the NICs' line rate, against the {sm.EFFICIENCY:.2f} of NVLink the model uses for "
                      "every link: one efficiency is the model's simplification, and why those rows sit "
                      "low, some near -15%"))
    print("\nwhat the model misses:")
    print(report.table(head, [(f["label"], round(f["predicted"], 1), f["published"], round(f["ratio"], 2),
                               short(f["source"])) for f in misses],
                       align=[False, True, True, True, False]))
    implied = []
    for f in misses:
        g = f["gpus_per_node"]  # algbw = busbw n/(2(n-1)); the link carries (n+1)/n of that
        implied.append(f["published"] * g / (2 * (g - 1)) * (g + 1) / g / f["intra_GBps"])
    if misses:
        print(wrapped(f"why: the model moves (n+1)/n of the buffer over each GPU's link at the ring's "
                      f"efficiency ({sm.EFFICIENCY:.2f}); the published busbw implies "
                      f"{', '.join(f'{x:.2f}' for x in implied)} of the line rate: the switch reducing and "
                      "multicasting costs more than the wire, and a model of links alone cannot see the "
                      "switch"))


# ---- section 2: a training step -----------------------------------------------------------------

def cluster_for(args, nodes):
    return sm.Cluster(args.gpus_per_node, nodes, "yours_intra" if args.intra_GBps else "nvlink4",
                      "yours_nic" if args.nic_Gbps else "ndr", args.nics_per_node)


def step_rows(args):
    rows = []
    for name, shape in st.SHAPES.items():
        for world in WORLDS:
            if world % args.gpus_per_node:
                continue
            c = cluster_for(args, world // args.gpus_per_node)
            for strategy in ("dp", "fsdp", "3d"):
                r = st.step(strategy, shape, c)
                rows.append(dict(r, model=name, strategy=strategy, world=r["world"], params=r["params"],
                                 tokens=r["tokens"], flops=r["flops"], comm_bytes=r["comm_bytes"],
                                 comm_s=r["comm_s"], compute_s=r["compute_s"], busy_s=r["busy_s"],
                                 step_lo=r["step_lo"], step_hi=r["step_hi"], state_gb=r["state_gb"],
                                 block_params=r.get("block_params", 0), root_params=r.get("root_params", 0)))
    return rows


def show_step(rows, args):
    print(wrapped(f"{st.SEQS} sequences of {st.SEQ} tokens per step at any GPU count; bf16 on the wire; "
                  f"compute at {st.FLOPS / 1e12:.1f} TFLOP/s per GPU (H100 BF16 dense peak, "
                  f"{short(st.FLOPS_SOURCE)}): the least it can take, so the hardest to hide behind. "
                  f"3D: TP {min(st.TP, args.gpus_per_node)} in a node, PP up to {st.PP} stages across nodes, "
                  "DP the rest; "
                  f"{args.gpus_per_node} GPUs a node"))
    body = []
    for r in rows:
        if r["strategy"] == "dp":  # the faster of the two DP prices
            where = "ring" if r["ring_s"] <= r["two_level_s"] else "2-level"
        elif r["strategy"] == "3d":  # the largest of its three parts
            where = max(("tp", r["tp_s"]), ("pp", r["pp_s"]), ("dp", r["dp_s"]), key=lambda kv: kv[1])[0]
        else:
            where = "3 passes"  # gather, gather again, reduce-scatter (the root: 2)
        body.append((r["model"], r["world"], r["strategy"], round(r["comm_bytes"] / 1e9, 1), round(r["comm_s"], 3),
                     round(r["busy_s"], 3), f"{r['step_lo']:.3g}-{r['step_hi']:.3g}", round(r["state_gb"], 1),
                     where))
    print(report.table(["model", "GPUs", "plan", "GB sent", "comm s", "compute s", "step s", "state GB",
                        "most comm"], body, align=[False, True, False, True, True, True, False, True, False]))
    over = [f"{r['model']} {r['strategy']} on {r['world']}" for r in rows if r["state_gb"] > HBM_GB]
    if over:
        print(wrapped(f"state over an H100's {HBM_GB} GB (weights and optimizer alone): " + ", ".join(over)))
    print(wrapped("GB sent: per GPU per step; compute s: with the pipeline's bubble for 3D; step s: all "
                  "comm hidden - none hidden; state GB: "
                  f"{st.STATE} B a parameter (bf16 weight and grad, fp32 master and Adam) per GPU, "
                  "activations left out. DP's comm s is the faster of the flat ring (bandwidth of the "
                  "slowest link, 2(N-1) latencies) and the two levels (fewer latencies, but the node's "
                  "NICs are shared by its GPUs while NVLink waits); the JSON keeps every part"))


# ---- section 3: the dry run ---------------------------------------------------------------------

def closed_forms(d):
    """[(count, dry run, closed form, formula)], the closed forms from the shapes alone."""
    L, P, N, B = d["layers"], d["params"], d["world"], d["bytes"]
    per = (L // d["pp"]) * d["micro"]
    return [("DP all-reduce calls (25 MiB buckets)", d["dp_allreduce_calls"], -(-B * P // d["bucket"]),
             "ceil(2P / bucket)"),
            ("FSDP all-gathers", d["fsdp_all_gather_calls"], 2 * L + 1, "2 layers + root"),
            ("FSDP reduce-scatters", d["fsdp_reduce_scatter_calls"], L + 1, "layers + root"),
            ("FSDP bytes sent", d["fsdp_bytes"], (N - 1) * B * (3 * L * d["block_shard"] + 2 * d["root_shard"]),
             "(N-1) B (3 L blk + 2 root)"),
            ("3D: TP all-reduces", d["tp_allreduce_calls"], 4 * per, "4 layers/pp micro"),
            ("3D: PP sends (a middle stage)", d["pp_send_calls"], 2 * d["micro"], "2 micro"),
            ("3D: PP receives", d["pp_recv_calls"], 2 * d["micro"], "2 micro"),
            ("3D: DP all-reduce calls", d["dp3_allreduce_calls"],
             -(-(B * P // (d["tp"] * d["pp"])) // d["bucket"]), "ceil(2P/(tp pp) / bucket)")]


def show_dry(dry):
    for name, d in dry.items():
        print(f"{name}: world {d['world']} = tp {d['tp']} x pp {d['pp']} x dp {d['dp']}, "
              f"{d['micro']} microbatches, {d['params'] / 1e9:.2f}B parameters")
        rows = [(what, got, want, "yes" if got == want else "NO", formula)
                for what, got, want, formula in closed_forms(d)]
        print(report.table(["count", "dry run", "closed form", "same", "formula"], rows,
                           align=[False, True, True, False, False]))
        differ = [r[0] for r in rows if r[3] == "NO"]
        if differ:  # the runner's checks fail on these too (computed again from the shapes alone)
            print(wrapped(f"the dry run disagrees with the closed form at: {', '.join(differ)}"))


def reported_dry(dry):
    """One row per model: the shapes and layout the runner's closed forms need, and the counts."""
    return [dict(d, model=name, world=d["world"], layers=d["layers"], params=d["params"], bucket=d["bucket"],
                 bytes=d["bytes"], tp=d["tp"], pp=d["pp"], micro=d["micro"], block_shard=d["block_shard"],
                 root_shard=d["root_shard"], dp_allreduce_calls=d["dp_allreduce_calls"],
                 fsdp_all_gather_calls=d["fsdp_all_gather_calls"],
                 fsdp_reduce_scatter_calls=d["fsdp_reduce_scatter_calls"], fsdp_bytes=d["fsdp_bytes"],
                 tp_allreduce_calls=d["tp_allreduce_calls"], pp_send_calls=d["pp_send_calls"],
                 pp_recv_calls=d["pp_recv_calls"], dp3_allreduce_calls=d["dp3_allreduce_calls"])
            for name, d in dry.items()]


# ---- section 4: calibrated here ------------------------------------------------------------------

def calibrate(ctx, be):
    """Lesson 07's alpha, beta, gamma measured here, then the ring of lessons 05/07 timed and predicted."""
    n = ctx.world_size
    model = measure_model(ctx, be, "float32", PING_ITERS)
    rows = []
    for size in CALIB:
        count = size // 4
        ring_buf = buffers.on_device(ctx, np.zeros(count, np.float32))
        lib = buffers.on_device(ctx, np.zeros(count, np.float32))
        plan = checked_plan(ctx, [ring_schedule(q, n, count) for q in range(n)], ring_buf, "float32",
                            "the ring schedule does not match")
        t = best_of(ctx, be, {"ring": lambda: plan.run(be), "lib": lambda: be.allreduce(lib)}, 1, ITERS)
        a, b, g = model["alpha"], model["beta"], model["gamma"]
        # >>> exercise: calibrate
        pred = predict("ring", n, size, a, b, g)  # lesson 07's ring formula, this machine's numbers
        pred_all = predict("ring", n, size, model["alpha_all"], model["beta_ring"], g)
        # <<< exercise: calibrate
        rows.append(dict(size=size, ring_us=t["ring"] * 1e6, lib_us=t["lib"] * 1e6, alpha_us=a * 1e6,
                         beta_us=b * 1e6, gamma_us=g * 1e6, ring_pred_us=pred * 1e6,
                         ring_pred_all_us=pred_all * 1e6))
    return model, rows


def show_calibration(ctx, model, rows):
    print(wrapped(f"lesson 07's model measured here: alpha {model['alpha'] * 1e6:.2f} us, beta "
                  f"{model['beta'] * 1e12:.1f} ps/B, gamma {model['gamma'] * 1e12:.1f} ps/B (ping-pong, "
                  f"ranks 0 and 1); all talking: alpha {model['alpha_all'] * 1e6:.2f} us, beta "
                  f"{model['beta_ring'] * 1e12:.1f} ps/B; {ctx.world_size} ranks, {ctx.transport}"))
    print(report.table(["size B", "ring us", "pred us", "ring/pred", "pred all us", "ring/all", "lib us"],
                       [(r["size"], round(r["ring_us"], 1), round(r["ring_pred_us"], 1),
                         round(r["ring_us"] / r["ring_pred_us"], 2) if r["ring_pred_us"] > 0 else "-",
                         round(r["ring_pred_all_us"], 1),
                         round(r["ring_us"] / r["ring_pred_all_us"], 2) if r["ring_pred_all_us"] > 0 else "-",
                         round(r["lib_us"], 1)) for r in rows]))
    ratios = [r["ring_us"] / r["ring_pred_all_us"] for r in rows if r["ring_pred_all_us"] > 0]
    if ratios:
        near = sum(0.5 <= x <= 2 for x in ratios)
        print(wrapped(f"with the all-talking alpha and beta the ring lands within 2x of its prediction at "
                      f"{near} of {len(ratios)} sizes on this run; lesson 07's section 2 names, run by run, "
                      "what its model of one alpha and one beta leaves out on this machine"))


# ---- section 5: your cluster ---------------------------------------------------------------------

def show_yours(args):
    c = cluster_for(args, args.nodes)
    priced = [("ring (NCCL's, every rank)", sm.ring_time(c, args.size)),
              ("two levels (hierarchy)", sm.two_level(c, args.size))]
    if args.nodes == 1:
        priced.append(("NVLink SHARP (if the switch has it)", sm.nvls_time(c, args.size)))
    print(f"{args.nodes} x {args.gpus_per_node} GPUs; all-reduce of {args.size} B:")
    print(report.table(["algorithm", "time us", "busbw GB/s"],
                       [(name, round(t * 1e6, 1), round(bandwidth.busbw("allreduce", args.size, t, c.n), 1))
                        for name, t in priced], align=[False, True, True]))


def main():
    parser = bootstrap.lesson_parser(__file__, __doc__)
    parser.add_argument("--gpus-per-node", type=bootstrap.positive(int), default=8, metavar="G")
    parser.add_argument("--nodes", type=bootstrap.positive(int), default=None, metavar="M",
                        help="nodes of your cluster (section 5; default: not shown)")
    parser.add_argument("--intra-GBps", type=bootstrap.positive(float), default=None, metavar="X",
                        help="each GPU's link into the node, one direction, GB/s (default NVLink 4: 450)")
    parser.add_argument("--nic-Gbps", type=bootstrap.positive(float), default=None, metavar="Y",
                        help="one NIC's line rate, Gb/s (default 400: NDR)")
    parser.add_argument("--nics-per-node", type=bootstrap.positive(int), default=8, metavar="K")
    parser.add_argument("--size", type=bandwidth.parse_size, default=1 << 30, metavar="BYTES",
                        help="section 5's all-reduce size (default 1G)")
    args, ctx = bootstrap.start(__file__, parser)
    if args.intra_GBps:
        sm.LINKS["yours_intra"] = dict(GBps=args.intra_GBps, alpha_us=2.0, what="yours (in the node)",
                                       source="--intra-GBps")
    if args.nic_Gbps:
        sm.LINKS["yours_nic"] = dict(GBps=args.nic_Gbps / 8, alpha_us=5.0, what="yours (a NIC)",
                                     source="--nic-Gbps")
    yours = any(v is not None for v in (args.nodes, args.intra_GBps, args.nic_Gbps))
    args.nodes = args.nodes or 1
    n = ctx.world_size
    figures, misses = figure_rows(sm.FIGURES), figure_rows(sm.MISSES)
    steps = step_rows(args)
    dry = {name: scale_dry.dry_run(shape, DRY_WORLD) for name, shape in st.SHAPES.items()}
    if ctx.rank == 0:
        report.section(ctx, "1. a cluster from its data sheet, against published all-reduce busbw")
        show_links()
        show_figures(figures, misses)
        report.section(ctx, "2. a training step at scale, on paper" +
                       (" (your cluster)" if yours else " (8 x H100 a node, 8 x 400G NICs)"))
        show_step(steps, args)
        report.section(ctx, f"3. the same step dry-run at {DRY_WORLD} ranks in one process (common/counting.py)")
        show_dry(dry)
    calib, model = [], None
    if n > 1:
        report.section(ctx, "4. calibrated here: this machine's alpha and beta predict the ring, timed here")
        model, calib = calibrate(ctx, p2p.backend(ctx))
        if ctx.rank == 0:
            show_calibration(ctx, model, calib)
    if yours and ctx.rank == 0:
        report.section(ctx, "5. your cluster")
        show_yours(args)
    summary = {"links": sm.LINKS, "efficiency_source": sm.EFFICIENCY_SOURCE, "figures": figures,
               "misses": misses, "step": steps, "calib": calib, "dry": reported_dry(dry)}
    params = {"eff": sm.EFFICIENCY, "modeled": int(n > 1), "dry_world": DRY_WORLD}
    report.finish(ctx, {}, summary=summary, params=params)


if __name__ == "__main__":
    main()
