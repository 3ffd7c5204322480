"""Lesson 16 — scale on paper: predict collectives on real clusters from link specs, and check each
prediction against a published measurement.

The idea: lesson 07's alpha-beta formulas need only a latency and a bandwidth per link. Take them
from data sheets (NVLink per GPU, one NIC per GPU or a few per node), take ONE protocol efficiency
(what NCCL gets out of a link: 370 of NVLink 4's 450 GB/s, said by NCCL's maintainer), and the
ring's busbw on a cluster is the slowest link class it crosses: inside a node the GPU's NVLink,
across nodes the node's NICs shared by its rings. Nothing is fitted to the figures it is checked
against; each published figure comes with the address where it was read.

What to watch for:
  * section 1: the link classes, then predicted / published / ratio / source for seven all-reduce
    busbw figures, each held within +-15%; then the two it misses (NVLink SHARP, where the switch
    itself reduces: the model has no term for that).
  * section 2: a training step of an 8B- and a 70B-shaped transformer on 8 to 1024 GPUs: data
    parallelism (08), ZeRO-3 / FSDP (10), and 3D: tensor parallelism in the node (11), pipeline
    stages across nodes (12), data parallelism across the rest, each priced per call (calls x
    alpha + bytes / bandwidth); the step lies between max(compute, comm) and their sum.
  * section 3: the same step dry-run at 1024 ranks in this one process through the kit's counting
    communicator (common/counting.py; nothing moves): its counts equal the closed forms.
  * section 4 (2+ ranks): the model with THIS machine's alpha and beta (lesson 07's measurement)
    predicts the ring all-reduce of lessons 05 and 07, timed here, size by size: your exercise.
  * your cluster (--help): section 5 prices an all-reduce of --size on it, and section 2 uses it.

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

WORLDS = (8, 64, 1024)       # GPUs in section 2's table
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


def figure_rows(rows):
    """The reported rows: the cluster's shape and raw link specs (the runner recomputes the price from
    them), the prediction, the published figure and where it was read."""
    out = []
    for row in rows:
        intra, nic, predicted = links.LINKS[row["intra"]], links.LINKS[row["nic"]], links.price(row)
        out.append(dict(label=row["label"], algo=row["algo"], gpus_per_node=row["gpus_per_node"],
                        nodes=row["nodes"], nics_per_node=row["nics_per_node"], per_nic=row["per_nic"],
                        size=row["size"], intra_GBps=intra["GBps"], nic_GBps=nic["GBps"],
                        alpha_intra_us=intra["alpha_us"], alpha_nic_us=nic["alpha_us"],
                        predicted=predicted, published=row["published"], ratio=predicted / row["published"],
                        source=row["source"], phrase=row["phrase"]))
    return out


def link_classes(args):
    """The data sheets' link classes, and yours where --intra-GBps / --nic-Gbps describe them."""
    classes = dict(links.LINKS)
    if args.intra_GBps:
        classes["yours_intra"] = dict(GBps=args.intra_GBps, alpha_us=2.0, what="yours (in the node)",
                                      source="--intra-GBps")
    if args.nic_Gbps:
        classes["yours_nic"] = dict(GBps=args.nic_Gbps / 8, alpha_us=5.0, what="yours (a NIC)", source="--nic-Gbps")
    return classes


def cluster_for(args, nodes, classes):
    return links.Cluster(args.gpus_per_node, nodes, "yours_intra" if args.intra_GBps else "nvlink4",
                         "yours_nic" if args.nic_Gbps else "ndr", args.nics_per_node, classes)


def step_rows(args, classes):
    """Every model x GPU count x plan of section 2, as step.step() prices it on your (or the default)
    cluster, at WORLDS rounded to whole nodes and your own; and {GPU count: why not} for those refused."""
    counts, refused = step.worlds(WORLDS, args.gpus_per_node, args.nodes)
    rows = []
    for name, shape in step.SHAPES.items():
        for world in counts:
            c = cluster_for(args, world // args.gpus_per_node, classes)
            for strategy in ("dp", "fsdp", "3d"):
                r = step.step(strategy, shape, c)  # the plan's bytes and seconds, the overlap bound
                rows.append(dict(r, model=name))
    return rows, refused


def paper(ctx, args, classes, yours):
    """Sections 1-3, one process's arithmetic: (figures, misses, step rows, dry runs by model)."""
    figures, misses = figure_rows(links.FIGURES), figure_rows(links.MISSES)
    steps, refused = step_rows(args, classes)
    counted = {name: dry.dry_run(shape, DRY_WORLD) for name, shape in step.SHAPES.items()}
    if ctx.rank == 0:
        report.section(ctx, "1. a cluster from its data sheet, against published all-reduce busbw")
        show.link_classes(classes)
        show.figures(figures, misses)
        report.section(ctx, "2. a training step at scale, on paper" +
                       (" (your cluster)" if yours else " (8 x H100 a node, 8 x 400G NICs)"))
        show.steps(steps, args.gpus_per_node, refused)
        report.section(ctx, f"3. the same step dry-run at {DRY_WORLD} ranks in one process (common/counting.py)")
        show.dry_runs(counted)
    return figures, misses, steps, counted


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
    parser.add_argument("--size", type=bandwidth.parse_size, default=1 << 30, metavar="BYTES",
                        help="section 5's all-reduce size (default 1G)")
    return parser


def main():
    args, ctx = bootstrap.start(__file__, flags())
    yours = any(v is not None for v in (args.nodes, args.intra_GBps, args.nic_Gbps)) or \
        (args.gpus_per_node, args.nics_per_node) != (8, 8)
    args.nodes = args.nodes or 1
    classes = link_classes(args)                                  # the data sheets' links, and yours
    figures, misses, steps, counted = paper(ctx, args, classes, yours)  # 1-3. priced, stepped, dry-run
    calib, model = [], None
    if ctx.world_size > 1:
        report.section(ctx, "4. calibrated here: this machine's alpha and beta predict the ring, timed here")
        model, calib = calibrate(ctx, p2p.backend(ctx))           # 4. this machine's alpha and beta
        if ctx.rank == 0:
            show.calibration(model, calib, ctx.world_size, ctx.transport)
    if yours and ctx.rank == 0:
        report.section(ctx, "5. your cluster")
        show.yours(cluster_for(args, args.nodes, classes), args.size)  # 5. your cluster's prices
    summary = {"links": classes, "efficiency_source": links.EFFICIENCY_SOURCE, "figures": figures,
               "misses": misses, "step": steps, "calib": calib,
               "dry": [dict(d, model=name) for name, d in counted.items()]}
    params = {"eff": links.EFFICIENCY, "modeled": int(ctx.world_size > 1), "dry_world": DRY_WORLD}
    report.finish(ctx, {}, summary=summary, params=params)


if __name__ == "__main__":
    main()
