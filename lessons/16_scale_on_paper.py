"""Lesson 16 — scale on paper: predict collectives on real clusters from link specs, and check each
prediction against a published measurement.

The idea: lesson 07's alpha-beta formulas need only a latency and a bandwidth per link. Take them
from data sheets, take an efficiency per KIND of link from its own source (NVLink at the rate NCCL
prices it in topo.h, a NIC at what NCCL's maintainer says it reaches), price each algorithm NCCL
has (ring, tree, NVLS, NVLS tree) as its tuner does (tuning.cc), and predict the one it picks: the
least time. Nothing is fitted to the figures it is checked against; each comes with its address.

What to watch for:
  * section 1: the link classes, then NCCL's pick / why / predicted / published / ratio / source for
    18 all-reduce busbw figures (1-16 nodes; InfiniBand, RoCE, AWS EFA, Azure), each held within
    +-10%; then the misses, each with its reason.
  * section 2: a training step of an 8B- and a 70B-shaped transformer on 8 to 1024 GPUs: data
    parallelism (08), ZeRO-3 / FSDP (10), and 3D (11, 12), each priced per call; compute at
    published MFUs (Llama 3 405B's slowest to NVIDIA's GPT-3 175B); the step lies between
    max(compute, comm) and their sum; published Llama 3.1 8B and 70B steps fall in that range.
  * section 3: the same step dry-run at 1024 ranks in this one process through the kit's counting
    communicator (common/counting.py; nothing moves): its counts equal the closed forms.
  * section 4 (2+ ranks): the model with THIS machine's alpha and beta (lesson 07's measurement)
    predicts the ring all-reduce of lessons 05 and 07, timed here, size by size: your exercise.
  * your cluster (--help): section 5 prices an all-reduce of --size on it; summary.yours keeps it.

Run it:
  make lesson-16 NP=2                 (ARGS="--nodes 16 --nic-Gbps 200 --nics-per-node 4")
  .venv/bin/mpiexec -n 2 .venv/bin/python -m mpi4py lessons/16_scale_on_paper.py --api mpi4py
Read after it: lessons/scale_on_paper/links.py (links, prices, the figures), step.py (the step),
dry.py (the dry run).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import numpy as np  # noqa: E402

from common import bandwidth, bootstrap, buffers, p2p, report  # noqa: E402
from common.timing import best_of  # noqa: E402
from lessons.allreduce_algorithms.model import measure_model, predict  # noqa: E402
from lessons.allreduce_algorithms.schedules import checked_plan, ring_schedule  # noqa: E402
from lessons.scale_on_paper import dry, links, show, step  # noqa: E402

WORLDS = [8, 64, 1024]       # GPUs in section 2's table (--worlds)
DRY_WORLD = 1024             # the dry run's world size
CALIB = (4096, 65536, 1 << 20)  # section 4: all-reduce sizes timed here, bytes
ITERS = 5                    # section 4: timed calls per batch
PING_ITERS = 10              # section 4: round trips per ping-pong size


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
                         alpha_all_us=model["alpha_all"] * 1e6, beta_ring_us=model["beta_ring"] * 1e6,
                         ring_pred_all_us=pred_all * 1e6))
    return model, rows


def link_classes(args):
    """The data sheets' link classes, and yours where --intra-GBps / --nic-Gbps describe them."""
    classes = dict(links.LINKS)
    if args.intra_GBps:
        classes["yours_intra"] = dict(links.LINKS["nvlink4"], GBps=args.intra_GBps, what="yours (in the node)",
                                      source="--intra-GBps")  # priced as NVLink: its efficiency, its latency
    if args.nic_Gbps:
        classes["yours_nic"] = dict(links.LINKS["ndr"], GBps=args.nic_Gbps / 8, what="yours (a NIC)",
                                    source="--nic-Gbps")
    return classes


def cluster_for(args, nodes, classes):
    return links.Cluster(args.gpus_per_node, nodes, "yours_intra" if args.intra_GBps else "nvlink4",
                         "yours_nic" if args.nic_Gbps else "ndr", args.nics_per_node, classes)


def step_rows(args, classes):
    """Every model x GPU count x plan of section 2, as step.step() prices it on your (or the default)
    cluster, at WORLDS rounded to whole nodes and your own; and {GPU count: why not} for those refused."""
    counts, refused = step.worlds(args.worlds, args.gpus_per_node, args.nodes)
    rows = []
    for name, shape in step.SHAPES.items():
        for world in counts:
            c = cluster_for(args, world // args.gpus_per_node, classes)
            for strategy in ("dp", "fsdp", "3d"):
                r = step.step(strategy, shape, c, args.tflops * 1e12, args.mfu)  # bytes, seconds, overlap
                rows.append(dict(r, model=name))
    return rows, refused


def step_figures():
    """Each published step priced as its own run (its sequences of its length, 8 H100s a node, 8 NDR NICs),
    as tokens a second a GPU: the step's range turned round (its fast end is step_lo)."""
    out = []
    for f in step.STEP_FIGURES:
        c = links.Cluster(8, f["world"] // 8, "nvlink4", "ndr", 8)
        r = step.step(f["strategy"], step.SHAPES[f["model"]], c, seq=f["seq_len"], seqs=f["gbs"])
        fast, slow = r["tokens"] / (r["world"] * r["step_lo"]), r["tokens"] / (r["world"] * r["step_hi"])
        mfu = 6 * r["params"] * f["published"] / r["peak_flops"]  # the published step's own MFU, 6N FLOPs
        out.append(dict(r, **f, fast_tps=fast, slow_tps=slow, published_mfu=mfu,
                        inside=int(slow <= f["published"] <= fast)))
    return out


def paper(ctx, args, classes, yours):
    """Sections 1-3, one process's arithmetic: figures (misses too), step rows, published steps, dry runs."""
    figures = [links.reported(f) for f in links.FIGURES + links.MISSES]  # a miss: its `why` said
    steps, refused = step_rows(args, classes)
    stepped = step_figures()
    counted = {name: dry.dry_run(shape, DRY_WORLD) for name, shape in step.SHAPES.items()}
    if ctx.rank == 0:
        report.section(ctx, "1. a cluster from its data sheet, against published all-reduce busbw")
        show.link_classes(classes)
        show.figures(figures, [links.reported(f) for f in links.SOURCE_ROWS])
        report.section(ctx, "2. a training step at scale, on paper" +
                       (" (your cluster)" if yours else " (8 x H100 a node, 8 x 400G NICs)"))
        show.steps(steps, args, refused)
        show.step_figures(stepped)
        report.section(ctx, f"3. the same step dry-run at {DRY_WORLD} ranks in one process (common/counting.py)")
        show.dry_runs(counted)
    return dict(figures=figures, step=steps, step_figures=stepped,
                mfu_sources=[step.MFU_SOURCE, step.MFU_HI_SOURCE],  # the MFU's slow and fast ends
                dry=[dict(d, model=name) for name, d in counted.items()])


def your_cluster(args, classes, steps):
    """Section 5's numbers, as summary.yours keeps them: allreduce[0], every algorithm's busbw at --size
    (0 where the cluster has none) and NCCL's pick; the FLOP rate, MFU and memory; step, section 2's rows
    on your cluster's own world size by "model plan"."""
    c = cluster_for(args, args.nodes, classes)
    bw, times = links.busbws(c, args.size, args.nvls)
    busbw = {f"{a}_bw": bw.get(a, 0.0) for a in links.ALGOS}
    mine = [r for r in steps if r["world"] == c.n]
    pick = links.pick(times)
    row = dict(links.specs(c), **busbw, size=args.size, nvls=int(args.nvls), algo=pick, algo_busbw=busbw[pick + "_bw"])
    return dict(allreduce=[row], peak_flops=args.tflops * 1e12, mfu_lo=args.mfu[0], mfu_hi=args.mfu[1],
                hbm_GB=args.hbm_GB, step={f"{r['model']} {r['strategy']}": r for r in mine})


def flags():
    parser = bootstrap.lesson_parser(__file__, __doc__)
    parser.add_argument("--gpus-per-node", type=bootstrap.positive(int, most=4096), default=8, metavar="G",
                        help="GPUs of one node, sharing its NVLink (sections 2 and 5; default 8)")
    parser.add_argument("--nodes", type=bootstrap.positive(int, most=10 ** 6), default=None, metavar="M",
                        help="nodes of your cluster (section 5, and a row of section 2; default: not shown)")
    parser.add_argument("--intra-GBps", type=bootstrap.positive(float, least=1e-3, most=1e6), default=None,
                        metavar="X", help="each GPU's link into the node, one direction, GB/s (default NVLink 4: 450)")
    parser.add_argument("--nic-Gbps", type=bootstrap.positive(float, least=1e-3, most=1e6), default=None,
                        metavar="Y", help="one NIC's line rate, Gb/s (default 400: NDR)")
    parser.add_argument("--nics-per-node", type=bootstrap.positive(int, most=4096), default=8, metavar="K",
                        help="NICs of one node, shared by its GPUs' rings across nodes (default 8)")
    parser.add_argument("--nvls", action="store_true",
                        help="the node's switch has NVLink SHARP (NVSwitch 3, H100 on): NCCL may run NVLS")
    parser.add_argument("--size", type=bandwidth.parse_size, default=1 << 30, metavar="BYTES",
                        help="section 5's all-reduce size (default 1G)")
    parser.add_argument("--tflops", type=bootstrap.positive(float, least=1e-3, most=1e6), default=step.PEAK / 1e12,
                        metavar="F", help="a GPU's dense BF16 peak, TFLOP/s (default H100 SXM's 989.4)")
    parser.add_argument("--mfu", type=bootstrap.positive(float, most=1.0), nargs=2, default=step.MFU,
                        metavar=("LO", "HI"), help="the share of peak a step sustains, its slow and fast end "
                        "(default Llama 3 405B's 380 and GPT-3 175B's 516 of 989.4 TFLOP/s)")
    parser.add_argument("--hbm-GB", type=bootstrap.positive(float, most=1e6), default=80.0, metavar="H",
                        help="a GPU's memory, GB, the state column is held to (default H100's 80)")
    parser.add_argument("--worlds", type=bootstrap.positive(int, most=10 ** 7), nargs="+", default=WORLDS,
                        metavar="N", help="GPU counts section 2 prices, rounded to whole nodes (default 8 64 1024)")
    return parser


def main():
    args, ctx = bootstrap.start(__file__, flags())
    if args.mfu[0] > args.mfu[1]:
        ctx.fail(f"--mfu: the slow end {args.mfu[0]:g} is above the fast end {args.mfu[1]:g}")
    yours = any(v is not None for v in (args.nodes, args.intra_GBps, args.nic_Gbps)) or args.nvls or \
        (args.gpus_per_node, args.nics_per_node) != (8, 8)
    args.nodes = args.nodes or 1
    classes = link_classes(args)                                  # the data sheets' links, and yours
    summary = dict(links=classes, **paper(ctx, args, classes, yours))  # 1-3. priced, stepped, dry-run
    calib, model = [], None
    if ctx.world_size > 1:
        report.section(ctx, "4. calibrated here: this machine's alpha and beta predict the ring, timed here")
        model, calib = calibrate(ctx, p2p.backend(ctx))           # 4. this machine's alpha and beta
        if ctx.rank == 0:
            show.calibration(model, calib, ctx.world_size, ctx.transport)
    summary["calib"] = calib
    if yours:
        summary["yours"] = your_cluster(args, classes, summary["step"])  # 5. your cluster's prices
        if ctx.rank == 0:
            report.section(ctx, "5. your cluster")
            show.yours(summary["yours"])
    params = dict(links.TUNER, modeled=int(ctx.world_size > 1), dry_world=DRY_WORLD, yours=int(yours))
    report.finish(ctx, {}, summary=summary, params=params)


if __name__ == "__main__":
    main()
