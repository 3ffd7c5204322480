"""What lesson 16 prints on rank 0: the link classes, the figures against their prediction, the step
table, the dry run against closed forms, the calibration, your cluster's prices."""
from common import bandwidth, report, text
from lessons.scale_on_paper import links, step

HBM_GB = 80                  # H100 SXM memory: "80 GB HBM3 (5 stacks)", glennklockwood.com/garden/processors/h100


def say(paragraph):
    print(text.wrapped(paragraph, hang=4))  # continuation lines 4 in, as lesson 07 prints


def short(url):
    return url.replace("https://", "").replace("github.com/", "gh:")


# ---- section 1: the cluster from its data sheet, against published figures ---------------------

def link_classes(classes):
    say(f"one protocol efficiency for every link: {links.EFFICIENCY:.3f} (370 of 450 GB/s, "
        f"{short(links.EFFICIENCY_SOURCE)}); so that sentence's H100 ring figure is not a check")
    print(report.table(["link class", "GB/s one way", "alpha us", "read at (full address: the JSON)"],
                       [(v["what"], v["GBps"], v["alpha_us"], short(v["source"]).split("/")[0])
                        for v in classes.values()]))
    say(f"alpha: the upper end of the latency ranges read at {short(links.ALPHA_SOURCE)}; the "
        "figures are at GiB sizes, where it moves no busbw by 1%")


def figures(rows, misses):
    head = ["cluster (all-reduce busbw, GB/s)", "pred", "publ", "ratio", "source"]
    print(report.table(head, [(f["label"], round(f["predicted"], 1), f["published"], round(f["ratio"], 2),
                               short(f["source"])) for f in rows],
                       align=[False, True, True, True, False]))
    inside = sum(0.85 <= f["ratio"] <= 1.15 for f in rows)
    print(f"{inside} of {len(rows)} within +-15% (the runner checks every one)")
    nic_bound = [f for f in rows if f["nodes"] > 1 and f["nics_per_node"] * f["nic_GBps"] < f["intra_GBps"]]
    if any(f["ratio"] < 0.9 for f in nic_bound):  # what those figures say NCCL gets out of a NIC
        got = [f["published"] / f["nic_GBps"] / (1 if f["per_nic"] else f["nics_per_node"]) for f in nic_bound]
        say(f"the rows bound by the NICs imply NCCL gets {', '.join(f'{x:.2f}' for x in got)} of "
            f"the NICs' line rate, against the {links.EFFICIENCY:.2f} of NVLink the model uses for "
            "every link: one efficiency is the model's simplification, and why those rows sit "
            "low, some near -15%")
    print("\nwhat the model misses:")
    print(report.table(head, [(f["label"], round(f["predicted"], 1), f["published"], round(f["ratio"], 2),
                               short(f["source"])) for f in misses],
                       align=[False, True, True, True, False]))
    implied = []
    for f in misses:
        g = f["gpus_per_node"]  # algbw = busbw n/(2(n-1)); the link carries (n+1)/n of that
        implied.append(f["published"] * g / (2 * (g - 1)) * (g + 1) / g / f["intra_GBps"])
    if misses:  # what the model lacks; no cause claimed (two figures, one switch generation)
        say(f"the model has no term for a switch that reduces: it moves (n+1)/n of the buffer over each "
            f"GPU's link at the ring's efficiency ({links.EFFICIENCY:.2f}) and predicts "
            f"{', '.join(format(f['ratio'], '.2f') for f in misses)} x the published busbw, which implies "
            f"{', '.join(f'{x:.2f}' for x in implied)} of the line rate. Where the rest goes, these "
            "figures do not say; nor can two figures on one switch generation say whether the gap is "
            "a constant: no factor is fitted")


# ---- section 2: a training step -----------------------------------------------------------------

def steps(rows, gpus_per_node, refused=None):
    tps = "/".join(str(t) for t in sorted({r["tp"] for r in rows if r["strategy"] == "3d"}))
    say(f"{step.SEQS} sequences of {step.SEQ} tokens per step at any GPU count; bf16 on the wire; "
        f"compute at {step.FLOPS / 1e12:.1f} TFLOP/s per GPU (H100 BF16 dense peak, "
        f"{short(step.FLOPS_SOURCE)}): the least it can take, so the hardest to hide behind. "
        f"3D: TP {tps or '-'} in a node (its GPUs and the heads split evenly, at most {step.TP}), PP up "
        f"to {step.PP} stages across nodes (the layers split evenly), DP the rest; {gpus_per_node} GPUs "
        "a node, GPU counts in whole nodes")
    for world, why in (refused or {}).items():  # a count no plan can take is said, not dropped
        say(f"not priced: {why}")
    body = []
    for r in rows:
        if r["strategy"] == "dp":  # the faster of the two DP prices
            where = "ring" if r["ring_s"] <= r["two_level_s"] else "2-level"
        elif r["strategy"] == "3d":  # the largest of its three parts
            where = max(("tp", r["tp_s"]), ("pp", r["pp_s"]), ("dp", r["dp_s"]), key=lambda kv: kv[1])[0]
        else:
            where = "3 passes"  # gather, gather again, reduce-scatter (the root: 2)
        body.append((r["model"], r["world"], r["strategy"], r["calls"], round(r["comm_bytes"] / 1e9, 1),
                     round(r["comm_s"], 3), round(r["latency_s"], 3), round(r["busy_s"], 3),
                     f"{r['step_lo']:.3g}-{r['step_hi']:.3g}", round(r["state_gb"], 1), where))
    print(report.table(["model", "GPUs", "plan", "calls", "GB sent", "comm s", "alpha s", "compute s", "step s",
                        "state GB", "most comm"], body,
                       align=[False, True, False, True, True, True, True, True, False, True, False]))
    over = [f"{r['model']} {r['strategy']} on {r['world']}" for r in rows if r["state_gb"] > HBM_GB]
    if over:
        say(f"state over an H100's {HBM_GB} GB (weights and optimizer alone): " + ", ".join(over))
    say("per GPU per step: GB sent, and calls: the collectives (3D: and the pipeline's sends) as "
        "section 3's dry run counts them; comm s = calls x each call's latencies (alpha s) + bytes / "
        "bandwidth, rings only (no tree); compute s: 3D's with its bubble; step s: all comm hidden - "
        f"none hidden; state GB: {step.STATE} B a parameter (bf16 weight and grad, fp32 master and "
        "Adam), activations left out. DP: the faster of the flat ring (the slowest link's bandwidth, "
        "2(N-1) latencies a bucket) and two levels (fewer latencies, the node's NICs shared by its "
        "GPUs); the JSON keeps every part")
    exposed = [r for r in rows if r["comm_s"] > r["busy_s"]]
    if exposed:  # the verdict the prices give: communication no overlap can hide
        say("comm longer than compute, so not all of it can hide (comm s > compute s, latency's share): " +
            ", ".join(f"{r['model']} {r['strategy']} on {r['world']} ({r['comm_s']:.3g} > {r['busy_s']:.3g}, "
                      f"{r['latency_s'] / r['comm_s']:.0%})" for r in exposed))


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
        print(report.table(["count", "dry run", "closed form", "same", "formula"], rows,
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
    print(report.table(["size B", "ring us", "pred us", "ring/pred", "pred all us", "ring/all", "lib us"],
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

def yours(c, size):
    """An all-reduce of `size` bytes on cluster c, priced every way the model knows."""
    priced = [("ring (NCCL's, every rank)", links.ring_time(c, size)),
              ("two levels (hierarchy)", links.two_level(c, size))]
    if c.nodes == 1:
        priced.append(("NVLink SHARP (if the switch has it)", links.nvls_time(c, size)))
    print(f"{c.nodes} x {c.gpus_per_node} GPUs; all-reduce of {size} B:")
    print(report.table(["algorithm", "time us", "busbw GB/s"],
                       [(name, round(t * 1e6, 1), round(bandwidth.busbw("allreduce", size, t, c.n), 1))
                        for name, t in priced], align=[False, True, True]))
