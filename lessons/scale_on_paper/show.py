"""What lesson 16 prints on rank 0: the link classes, the figures against their prediction, the step
table, the dry run against closed forms, the calibration, your cluster's prices."""
import re

from common import text
from lessons.scale_on_paper import links, step


def say(paragraph):
    print(text.wrapped(paragraph, hang=4))  # continuation lines 4 in, as lesson 07 prints


def short(url):
    return url.replace("https://", "").replace("github.com/", "gh:")


def issue(url):
    """gh:NVIDIA/nccl-tests/issues/212 -> nccl-tests#212; a file in a repository -> its owner
    (gh:Azure/AI-benchmarking-guide/blob/... -> Azure); any other address as short() writes it."""
    tag = re.sub(r"^gh:NVIDIA/([\w-]+)/issues/(\d+)$", r"\1#\2", short(url))
    return re.sub(r"^gh:([\w-]+)/[\w.-]+/blob/.*$", r"\1", tag)


# ---- section 1: the cluster from its data sheet, against published figures ---------------------

def link_classes(classes):
    print(text.table(["link class", "GB/s", "eff", "alpha us", "rate read at", "eff from"],
                     [(v["what"], v["GBps"], round(v["eff"], 3), v["alpha_us"], short(v["source"]).split("/")[0],
                       (issue if "/issues/" in v["eff_source"] else short)(v["eff_source"]).split("/")[-1])
                      for v in classes.values()]))
    say("GB/s: a GPU's link, one direction. Efficiency per kind of link: NVLink at the rate NCCL "
        "itself prices a link (topo.h: 20.0 GB/s on A100, 20.6 on H100, of 25), a NIC at 24 of 25 GB/s "
        "(NCCL's maintainer, nccl-tests#119); alpha: NCCL's own latency of a ring step (tuning.cc); "
        "full addresses in the JSON")


ALGO_WHY = {"ring": "2(n-1)/n of the buffer over the slowest link class",
            "tree": "chain in the node, double binary tree across nodes, at .92",
            "nvls": "NVLink SHARP: (n+1)/n over each link, at NVLS's 0.85",
            "nvls_tree": "NVLS in the node, a tree across nodes, under NCCL's cap a channel"}


def _view(f, name):
    return next(v for v in f["views"] if v["view"] == name)


def _why(f):
    """Why this algorithm: held to it by NCCL_ALGO, or the least time NCCL's tuner prices (from its own
    link table) among those the cluster has; the next best beside it."""
    if f["forced"]:
        return f"held to {f['forced']}" if f["chosen_by"] == "NCCL_ALGO" else f["chosen_by"]
    tuner = _view(f, "tuner")
    others = [(tuner[a + "_bw"], a) for a in links.ALGOS if tuner[a + "_bw"] and a != f["algo"]]
    return "> {1} {0:.0f}".format(*max(others)) if others else ""


def _rows(rows):
    return [(f["label"], f["algo"], _why(f), round(f["predicted"], 1), f["published"], round(f["ratio"], 2),
             issue(f["source"])) for f in rows]


def figures(every, sources=()):
    """The figures predicted, then the misses (a figure whose `why` is said), each with its reason."""
    rows, misses = [f for f in every if not f["why"]], [f for f in every if f["why"]]
    head = ["all-reduce busbw, GB/s", "NCCL runs", "why", "pred", "publ", "ratio", "source"]
    align = [False, False, False, True, True, True, False]
    print(text.table(head, _rows(rows), align=align))
    inside = sum(0.9 <= f["ratio"] <= 1.1 for f in rows)
    say(f"{inside} of {len(rows)} within +-10% (the runner checks every one). NCCL runs the algorithm its "
        "tuner prices fastest (tuning.cc), the next best beside it (the JSON keeps every one's busbw), "
        "unless held to one or, on AWS p5, told by AWS's tuner plugin (aws-ofi-nccl: regions of size and "
        "ranks measured on p5; the file's busbw jumps where they switch to the ring):")
    for algo, why in ALGO_WHY.items():
        print(f"  {algo:9s} {why}")
    slow = [f for f in rows if f["node_ring_GBps"]]
    if slow:  # nodes whose NVLink runs under NCCL's table: the table's pick, run at their own rate
        one = min(slow, key=lambda f: f["nodes"])
        said = [f"{issue(one['source'])}'s nodes run their ring at {one['node_ring_GBps']:g} GB/s on one node, "
                f"where NCCL's table prices {_view(one, 'tuner')['ring_bw']:.0f}: NCCL picks from its table, "
                "the nodes run at their own rate"]
        for f in slow:
            bw, best = max((_view(f, "runs")[a + "_bw"], a) for a in links.ALGOS)
            if best != f["algo"]:
                said.append(f"on {f['nodes']} nodes the table's {f['algo']} runs {f['predicted']:.0f}, "
                            f"where {best} would run {bw:.0f}")
        say("; ".join(said))
    for f in sources:
        of = "these nodes' NVLink rate" if f["node_ring_GBps"] else "the NIC efficiency"
        say(f"not a check: {f['label']}, {f['published']} GB/s ({issue(f['source'])}) is {of}'s own source "
            f"(the model gives {f['predicted']:.1f})")
    if misses:
        print("\nwhat the model misses, and why (read it at the source):")
        print(text.table(head, _rows(misses), align=align))
        for f in misses:
            say(f"{f['label']}: {f['why']}")


# ---- section 2: a training step -----------------------------------------------------------------

def steps(rows, args, refused=None):
    gpus_per_node, hbm = args.gpus_per_node, args.hbm_GB
    tps = "/".join(str(t) for t in sorted({r["tp"] for r in rows if r["strategy"] == "3d"}))
    lo, hi = args.mfu
    mfu = (f"{lo:.1%}-{hi:.1%} of it: from Llama 3 405B's slowest, 380 TFLOP/s a GPU "
           f"({short(step.MFU_SOURCE)}), to NVIDIA's GPT-3 175B recipe, {hi * step.PEAK / 1e12:.0f} TFLOP/s of 6N "
           "FLOPs (gh:NVIDIA/dgxc-benchmarking)" if tuple(args.mfu) == step.MFU else f"{lo:.1%}-{hi:.1%} of it (--mfu)")
    peak = f"H100 BF16 dense peak, {short(step.PEAK_SOURCE)}" if args.tflops * 1e12 == step.PEAK else "--tflops"
    say(f"{step.SEQS} sequences of {step.SEQ} tokens per step at any GPU count; bf16 on the wire; "
        f"compute at {args.tflops:.1f} TFLOP/s per GPU ({peak}) times a published run's model FLOPs "
        f"utilisation, {mfu}. "
        f"3D: TP {tps or '-'} in a node (its GPUs and the heads split evenly, at most {step.TP}), PP up "
        f"to {step.PP} stages across nodes (the layers split evenly), DP the rest; {gpus_per_node} GPUs "
        "a node, GPU counts in whole nodes")
    for world, why in (refused or {}).items():  # a count no plan can take is said, not dropped
        say(f"not priced: {why}")
    body = []
    for r in rows:
        if r["strategy"] == "dp":  # what NCCL runs for a full bucket
            where = r["bucket_algo"]
        elif r["strategy"] == "3d":  # the largest of its three parts
            where = max(("tp", r["tp_s"]), ("pp", r["pp_s"]), ("dp", r["dp_s"]), key=lambda kv: kv[1])[0]
        else:
            where = "3 passes"  # gather, gather again, reduce-scatter (the root: 2)
        body.append((r["model"], r["world"], r["strategy"], r["calls"], round(r["comm_bytes"] / 1e9, 1),
                     round(r["comm_s"], 3), round(r["latency_s"], 3), f"{r['busy_fast_s']:.3g}-{r['busy_s']:.3g}",
                     f"{r['step_lo']:.3g}-{r['step_hi']:.3g}", round(r["state_gb"], 1), where))
    print(text.table(["model", "GPUs", "plan", "calls", "GB sent", "comm s", "alpha s", "compute s", "step s",
                      "state GB", "most comm"], body,
                     align=[False, True, False, True, True, True, True, True, False, True, False]))
    over = [f"{r['model']} {r['strategy']} on {r['world']}" for r in rows if r["state_gb"] > hbm]
    if over:
        say(f"state over a GPU's {hbm:g} GB (weights and optimizer alone): " + ", ".join(over))
    say("per GPU per step: GB sent, and calls: the collectives (3D: and the pipeline's sends) as "
        "section 3's dry run counts them; comm s = calls x each call's latencies (alpha s) + bytes / "
        "bandwidth; compute s: at the fast - slow MFU, 3D's with its bubble; step s: all comm hidden "
        "at the fast MFU - none hidden at the slow; state GB: "
        f"{step.STATE} B a parameter (bf16 weight and grad, fp32 master and Adam), activations left "
        "out. DP: each 25 MiB bucket as NCCL runs it, the ring or the tree its tuner prices faster "
        "(section 1's prices, no NVLS; most comm: a full bucket's pick); FSDP and 3D: rings. The JSON "
        "keeps every part, and DP's flat ring (07) and two levels (15) beside it")
    exposed = [r for r in rows if r["comm_s"] > r["busy_s"]]
    if exposed:  # the verdict the prices give: communication no overlap can hide
        say("comm longer than compute, so not all of it can hide (comm s > compute s, latency's share): " +
            ", ".join(f"{r['model']} {r['strategy']} on {r['world']} ({r['comm_s']:.3g} > {r['busy_s']:.3g}, "
                      f"{r['latency_s'] / r['comm_s']:.0%})" for r in exposed))


def step_figures(rows):
    """Published steps against the step's range, each priced as its own run (its tokens a step)."""
    print("\npublished BF16 steps on H100s, tokens a second a GPU, each priced as its own run (its MFU: 6N):")
    print(text.table(["model", "GPUs", "plan", "tokens/step", "range tok/s/GPU", "publ", "its MFU", "inside",
                      "source"],
                     [(f["model"], f["world"], f["strategy"], f["tokens"], f"{f['slow_tps']:.0f}-{f['fast_tps']:.0f}",
                       round(f["published"]), f"{f['published_mfu']:.1%}", "yes" if f["inside"] else "NO",
                       short(f["source"]).split("/blob")[0]) for f in rows],
                     align=[False, True, False, True, False, True, True, False, False]))
    say("NVIDIA's recipes: 8B's distributed optimizer moves an all-reduce's bytes (priced as dp); 70B's "
        "TP 4 x PP 4 x CP 2 priced as this lesson's 3D plan")
    for f in rows:
        if not f["inside"]:
            say(f"missed: {f['model']} {f['strategy']} on {f['world']}: {f['why']}")


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


def dry_runs(counted):
    for name, d in counted.items():
        print(f"{name}: world {d['world']} = tp {d['tp']} x pp {d['pp']} x dp {d['dp']}, "
              f"{d['micro']} microbatches, {d['params'] / 1e9:.2f}B parameters")
        rows = [(what, got, want, "yes" if got == want else "NO", formula)
                for what, got, want, formula in closed_forms(d)]
        print(text.table(["count", "dry run", "closed form", "same", "formula"], rows,
                         align=[False, True, True, False, False]))
        differ = [r[0] for r in rows if r[3] == "NO"]
        if differ:  # the runner's checks fail on these too (computed again from the shapes alone)
            say(f"the dry run disagrees with the closed form at: {', '.join(differ)}")


# ---- section 4: calibrated here ------------------------------------------------------------------

def calibration(model, rows, world_size, transport):
    say(f"lesson 07's model measured here: alpha {model['alpha'] * 1e6:.2f} us, beta "
        f"{model['beta'] * 1e12:.1f} ps/B, gamma {model['gamma'] * 1e12:.1f} ps/B (ping-pong, "
        f"ranks 0 and 1); all talking: alpha {model['alpha_all'] * 1e6:.2f} us, beta "
        f"{model['beta_ring'] * 1e12:.1f} ps/B; {world_size} ranks, {transport}")
    print(text.table(["size B", "ring us", "pred us", "ring/pred", "pred all us", "ring/all", "lib us"],
                     [(r["size"], round(r["ring_us"], 1), round(r["ring_pred_us"], 1),
                       round(r["ring_us"] / r["ring_pred_us"], 2) if r["ring_pred_us"] > 0 else "-",
                       round(r["ring_pred_all_us"], 1),
                       round(r["ring_us"] / r["ring_pred_all_us"], 2) if r["ring_pred_all_us"] > 0 else "-",
                       round(r["lib_us"], 1)) for r in rows]))
    ratios = [r["ring_us"] / r["ring_pred_all_us"] for r in rows if r["ring_pred_all_us"] > 0]
    if ratios:
        near = sum(0.5 <= x <= 2 for x in ratios)
        say(f"with the all-talking alpha and beta the ring lands within 2x of its prediction at "
            f"{near} of {len(ratios)} sizes on this run; lesson 07's section 2 names, run by run, "
            "what its model of one alpha and one beta leaves out on this machine")


# ---- section 5: your cluster ---------------------------------------------------------------------

def yours(doc):
    """Section 5: an all-reduce of --size on your cluster, every algorithm NCCL prices, and its pick."""
    y = doc["allreduce"][0]
    n = y["gpus_per_node"] * y["nodes"]
    nics = f"{y['nics_per_node']} NIC{'s' if y['nics_per_node'] != 1 else ''}"
    print(f"{y['nodes']} x {y['gpus_per_node']} GPUs, {nics} a node"
          f"{', NVLink SHARP' if y['nvls'] else ''}; all-reduce of {y['size']} B:")
    print(text.table(["algorithm", "busbw GB/s", "algbw GB/s", "NCCL runs"],
                     [(a, round(y[a + "_bw"], 1), round(y[a + "_bw"] * n / (2 * (n - 1)), 1) if n > 1 else "-",
                       "<- least time" if a == y["algo"] else "") for a in links.ALGOS if y[a + "_bw"]],
                     align=[False, True, True, False]))
    say(f"NCCL runs {y['algo']} ({ALGO_WHY[y['algo']]}); section 2's step rows on {n} GPUs and these "
        "numbers are in the results JSON under summary.yours")
