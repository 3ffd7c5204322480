"""Lesson 16's training step at scale: the bytes lessons 08-12 counted, for a named model's shapes,
priced on a cluster of lessons/scale_on_paper/links.py.

    params(shape)                      parameters of a decoder-only transformer of these shapes
    plan(strategy, shape, world)       bytes and calls per GPU per step, closed forms (lessons 08-12)
    step(strategy, shape, cluster)     communication and compute seconds, and the overlap bound
Every call pays its latencies: a plan is priced calls x alpha + bytes / bandwidth, with the calls the
dry run counts (the same step through the counting communicator: lessons/scale_on_paper/dry.py); DP's
buckets as NCCL runs them, its tuner's pick of ring and tree (links.nccl_times), FSDP and 3D as rings.
"""
import math

from lessons.scale_on_paper.links import (
    Cluster,
    bottleneck,
    nccl_times,
    pick,
    reduce_scatter_time,
    ring,
    ring_time,
    specs,
    two_level,
)

# shapes of the 8B and 70B size class (grouped-query attention: kv_heads of heads; untied embeddings)
SHAPES = {
    "8B": dict(layers=32, d=4096, ffn=14336, heads=32, kv_heads=8, vocab=128256),
    "70B": dict(layers=80, d=8192, ffn=28672, heads=64, kv_heads=8, vocab=128256),
}
BYTES = 2                    # bf16 parameters, gradients and activations on the wire
SEQ = 4096                   # tokens per sequence (one sequence per microbatch)
SEQS = 1024                  # sequences per step, whatever the GPU count (strong scaling)
TP = 8                       # tensor parallelism: the GPUs of one node (NVLink), as in lesson 11
PP = 4                       # pipeline stages across nodes, as in lesson 12 (fewer if fewer nodes)
PEAK = 989.4e12              # H100 SXM BF16 dense tensor FLOP/s: "BF16 | 133.8 | 989.4 | 1978.9"
PEAK_SOURCE = "https://glennklockwood.com/garden/processors/h100"
# model FLOPs utilisation (6N FLOPs a token), each end a published BF16 run on H100s. The slow end:
# Llama 3 405B on 8,192 to 16,384 H100s sustained 380 to 430 TFLOPS a GPU (SC'24 slide of Meta's P. Balaji,
# read at the address below; the run of "The Llama 3 Herd of Models", arXiv 2407.21783): its slowest, 380.
# The fast end: NVIDIA's GPT-3 175B recipe (96 layers, hidden 12288, vocab 51200: N = 12 L h^2 + V h),
# BF16 on 128 H100s, "| Throughput in tokens per second | 63099 |": 6N x 63099 / 128 = 516 TFLOP/s a GPU
GPT3_175B = 12 * 96 * 12288 ** 2 + 51200 * 12288
MFU = (380e12 / PEAK, 6 * GPT3_175B * 63099 / 128 / PEAK)
MFU_SOURCE = "https://glennklockwood.com/garden/llama-3.1"
DGXC = "https://github.com/NVIDIA/dgxc-benchmarking/blob/"  # NVIDIA's DGX Cloud recipes, pinned commits
MFU_HI_SOURCE = DGXC + "741c886025a7665a1d690c05ff12ac29c1be7252/nemo_megatron/README_175b.md"
STATE = 16                   # bytes of model state per parameter: bf16 weight + grad, fp32 master + Adam
BUCKET = 25 * 1024 * 1024    # torch DDP's default bucket: _DEFAULT_BUCKET_CAP_MB = 25 (MiB), in
#                              torch/nn/parallel/distributed.py of the installed torch 2.13.0
# published steps of these shapes, tokens a second a GPU, each priced as its own run (its sequences of
# its length a step; 8 H100s a node, 8 NDR NICs). NVIDIA's Llama 3.1 recipes, BF16, NeMo 24.09 (8B: TP 1,
# PP 1, CP 2, its distributed optimizer moving an all-reduce's bytes: priced as DP; 70B: TP 4, PP 4, CP 2,
# VP 5: priced as the lesson's 3D plan), the page's tokens a second over its GPUs; and torchtitan's
# Llama 3.1 8B, FSDP, BF16 (no torch.compile, no Float8), local batch 2 of 8192 tokens (its Tables 1, 3)
TORCHTITAN = "https://github.com/pytorch/torchtitan/blob/main/docs/performance.md"
LLAMA31 = DGXC + "143b90dd91f9be958fed4773ae95d941a3356a82/llama3.1/README_"


def _run(model, strategy, world, gbs, seq_len, total, source, phrase, why=""):
    """A published step: `gbs` sequences of `seq_len` tokens a step on `world` GPUs, `total` tokens a
    second in all (published: a GPU's share); why: for a miss, the reason a learner can check."""
    return dict(model=model, strategy=strategy, world=world, gbs=gbs, seq_len=seq_len, total=total,
                published=total / world, source=source, phrase=phrase, why=why)


STEP_FIGURES = [
    _run("8B", "dp", 8, 128, 8192, 81222, LLAMA31 + "8b.md", "| Throughput in tokens per second | 81222 |"),
    _run("8B", "dp", 128, 2048, 8192, 1280704, LLAMA31 + "8b.md", "| ... | 1280704 |  (128x H100, GBS=2048)"),
    _run("70B", "3d", 64, 128, 8192, 71235, LLAMA31 + "70b.md", "| Throughput in tokens per second | 71235 |"),
    _run("70B", "3d", 1024, 2048, 8192, 1124478, LLAMA31 + "70b.md", "| ... | 1124478 |  (1024x H100, GBS=2048)"),
    _run("8B", "fsdp", 8, 2 * 8, 8192, 5762 * 8, TORCHTITAN, "5,762 TPS/GPU (8 GPUs)",
         why="torchtitan's page: its H100s ran at a 500 W power limit (700 W TDP) with HBM2e, their peak "
             "'between SXM and NVL'; it states 33-39% MFU counting attention too, under the slow end here"),
    _run("8B", "fsdp", 128, 2 * 128, 8192, 5605 * 128, TORCHTITAN, "5,605 TPS/GPU (128 GPUs)",
         why="the same hosts and power limit as its 8-GPU row"),
]
# every row carries every plan's parts (0 where the plan has none), so the runner's checks read them all
PARTS = ("tp", "pp", "dp", "micro", "tp_calls", "pp_calls", "dp_calls", "tp_bytes", "pp_bytes", "dp_bytes",
         "tp_s", "pp_s", "dp_s", "ring_s", "two_level_s", "block_params", "root_params", "bucket", "last_bucket",
         "nccl_ring_s", "nccl_tree_s", "last_ring_s", "last_tree_s")


def layer_params(s):
    attn = s["d"] * s["d"] * (2 + 2 * s["kv_heads"] / s["heads"])  # q, o and the smaller k, v
    return int(attn + 3 * s["d"] * s["ffn"] + 2 * s["d"])           # gated MLP, two norms


def params(s):
    return s["layers"] * layer_params(s) + 2 * s["vocab"] * s["d"] + s["d"]  # + embeddings, head, norm


def layout(world, gpus_per_node=8, s=None):
    """(tp, pp, dp) of the 3D plan on `world` GPUs, tp x pp x dp = world: tensor parallelism never
    leaves a node and splits the heads evenly (at most TP); the stages split the layers evenly (at most
    PP); data parallelism takes the rest. On 6 GPUs a node (Summit's), 32 heads: TP 2."""
    def largest(n, most, *shares):  # the largest divisor of n, at most `most`, dividing each share
        return max(k for k in range(1, min(n, most) + 1) if n % k == 0 and all(x % k == 0 for x in shares))
    s = s or SHAPES["8B"]
    tp = largest(math.gcd(world, gpus_per_node), TP, s["heads"], s["kv_heads"])
    pp = largest(world // tp, PP, s["layers"])
    return tp, pp, world // (tp * pp)


def priced(world, gpus_per_node=8):
    """None when every plan can be priced on `world` GPUs, else why not (one line): 3D's data-parallel
    replicas must each get at least one of the step's SEQS sequences."""
    dp = max(layout(world, gpus_per_node, s)[2] for s in SHAPES.values())
    if dp > SEQS:
        return (f"on {world} GPUs, 3D's {dp} data-parallel replicas would each get less than one of the "
                f"step's {SEQS} sequences")
    return None


def worlds(wanted, gpus_per_node, nodes=None):
    """The GPU counts section 2 prices: each wanted count rounded to whole nodes (at least one), and
    the learner's own cluster (`nodes`) where given; those no plan can take go to `refused` with why."""
    counts = {gpus_per_node * max(1, round(w / gpus_per_node)) for w in wanted}
    counts |= {gpus_per_node * nodes} if nodes else set()
    refused = {w: priced(w, gpus_per_node) for w in sorted(counts) if priced(w, gpus_per_node)}
    return [w for w in sorted(counts) if w not in refused], refused


def plan(strategy, s, world, gpus_per_node=8, seq=SEQ, seqs=SEQS):
    """Bytes each GPU sends per step, and what they are, from lessons 08-12's closed forms: a step of
    `seqs` sequences of `seq` tokens (3D's bytes depend on them; DP's and FSDP's do not)."""
    p, n = params(s), world
    if strategy == "dp":  # lesson 08: all-reduce the gradient, 2(N-1)/N of it per rank, bucket by bucket
        return dict(comm_bytes=2 * (n - 1) / n * BYTES * p, calls=math.ceil(BYTES * p / BUCKET),
                    state_gb=STATE * p / 1e9)
    if strategy == "fsdp":  # lesson 10: all-gather forward, again backward, reduce-scatter gradients;
        blocks = s["layers"] * layer_params(s)  # fully_shard keeps the root gathered for backward
        return dict(comm_bytes=(n - 1) / n * BYTES * (3 * blocks + 2 * (p - blocks)), state_gb=STATE * p / n / 1e9,
                    calls=(2 * s["layers"] + 1) + (s["layers"] + 1),  # all-gathers + reduce-scatters, a unit each
                    block_params=blocks, root_params=p - blocks)
    tp, pp, dp = layout(world, gpus_per_node, s)
    micro = seqs // dp
    act = seq * s["d"] * BYTES  # one microbatch's activation at a layer boundary
    # calls that move something (a group of one sends nothing); pp: a middle stage's sends
    tp_calls = 4 * (s["layers"] // pp) * micro if tp > 1 else 0  # lesson 11: f and g, forward and backward
    pp_calls = 2 * micro if pp > 1 else 0  # lesson 12: each microbatch's activation on, its gradient back
    dp_calls = math.ceil(BYTES * p // (tp * pp) / BUCKET) if dp > 1 else 0  # DDP buckets its gradient
    return dict(tp=tp, pp=pp, dp=dp, micro=micro, act_bytes=act, tp_calls=tp_calls, pp_calls=pp_calls,
                dp_calls=dp_calls, calls=tp_calls + pp_calls + dp_calls,
                tp_bytes=tp_calls * 2 * (tp - 1) / tp * act,
                pp_bytes=pp_calls * act,
                dp_bytes=2 * (dp - 1) / dp * BYTES * p / (tp * pp),
                state_gb=STATE * p / (tp * pp) / 1e9)


def step(strategy, s, c, peak=PEAK, mfu=MFU, seq=SEQ, seqs=SEQS):
    """{comm_s, latency_s, compute_s, busy_s, step_lo, step_hi, ...} for one step on cluster c: each
    plan's calls x the latencies each call pays + its bytes / bandwidth; compute at the peak FLOP/s
    times a published run's MFU, the slow end (compute_s) and the fast (compute_fast_s); a step of
    `seqs` sequences of `seq` tokens (section 2's, or a published run's)."""
    p, n, tokens = params(s), c.n, seq * seqs
    out = dict(dict.fromkeys(PARTS, 0), **plan(strategy, s, n, c.gpus_per_node, seq, seqs), **specs(c),
               strategy=strategy, bucket_algo="", world=n, params=p, tokens=tokens, peak_flops=peak,
               mfu_lo=mfu[0], mfu_hi=mfu[1],
               layers=s["layers"], d=s["d"], seq=seq, seqs=seqs)
    out["compute_s"] = 6 * p * tokens / n / (peak * mfu[0])  # forward 2, backward 4 FLOPs per parameter-token
    out["compute_fast_s"] = 6 * p * tokens / n / (peak * mfu[1])
    out["busy_s"], out["busy_fast_s"] = out["compute_s"], out["compute_fast_s"]
    calls, g = out["calls"], BYTES * p
    if strategy == "dp":  # every bucket as NCCL runs it: its tuner's pick of ring and tree (no NVLS)
        last = g - BUCKET * (calls - 1)  # the last bucket holds the rest of the gradient
        full, tail, alphas = nccl_times(c, BUCKET), nccl_times(c, last), nccl_times(c, 0)
        out.update(bucket=BUCKET, last_bucket=last, nccl_ring_s=full["ring"], nccl_tree_s=full["tree"],
                   last_ring_s=tail["ring"], last_tree_s=tail["tree"], bucket_algo=pick(full),
                   comm_s=(calls - 1) * full[pick(full)] + tail[pick(tail)],
                   latency_s=(calls - 1) * alphas[pick(full)] + alphas[pick(tail)],
                   ring_s=ring_time(c, g, calls), two_level_s=two_level(c, g, calls))  # lessons 07, 15: beside it
    elif strategy == "fsdp":  # a ring across every rank per call, (N-1) steps each
        alpha = c.alpha(c.nic) if c.nodes > 1 else c.alpha(c.intra)
        passes = BYTES * (3 * out["block_params"] + 2 * out["root_params"])  # whole units, summed over calls
        out["comm_s"] = reduce_scatter_time(n, passes, alpha, bottleneck(c), calls)
        out["latency_s"] = reduce_scatter_time(n, 0, alpha, bottleneck(c), calls)
    else:
        tp, pp, dp, m, act = out["tp"], out["pp"], out["dp"], out["micro"], out["act_bytes"]
        node = Cluster(tp, 1, c.intra, c.nic, c.nics_per_node, c.links)  # one node of c
        nic = min(c.bw(c.nic) * c.nics_per_node / c.gpus_per_node, c.bw(c.intra))  # this GPU's NIC share
        k_tp, k_pp, k_dp = out["tp_calls"], out["pp_calls"], out["dp_calls"]
        out["tp_s"] = ring_time(node, k_tp * act, k_tp)                 # each call the node's ring
        out["pp_s"] = k_pp * c.alpha(c.nic) + out["pp_bytes"] / nic      # each call one message
        out["dp_s"] = ring(dp, g / (tp * pp), c.alpha(c.nic), nic, k_dp)  # each bucket a ring over dp
        out["comm_s"] = out["tp_s"] + out["pp_s"] + out["dp_s"]
        out["latency_s"] = ring_time(node, 0, k_tp) + k_pp * c.alpha(c.nic) + ring(dp, 0, c.alpha(c.nic), nic, k_dp)
        bubble = (m + pp - 1) / m  # lesson 12's bubble: (p-1)/(m+p-1) idle
        out["busy_s"], out["busy_fast_s"] = out["compute_s"] * bubble, out["compute_fast_s"] * bubble
    out["comm_bytes"] = out.get("comm_bytes", out["tp_bytes"] + out["pp_bytes"] + out["dp_bytes"])
    out["step_lo"] = max(out["busy_fast_s"], out["comm_s"])  # every byte hidden, the fast MFU: at best
    out["step_hi"] = out["busy_s"] + out["comm_s"]           # nothing hidden, the slow MFU: at worst
    return out
