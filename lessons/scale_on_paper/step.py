"""Lesson 16's training step at scale: the bytes lessons 08-12 counted, for a named model's shapes,
priced on a cluster of lessons/scale_on_paper/links.py.

    params(shape)                      parameters of a decoder-only transformer of these shapes
    plan(strategy, shape, world)       bytes and calls per GPU per step, closed forms (lessons 08-12)
    step(strategy, shape, cluster)     communication and compute seconds, and the overlap bound
The same step dry-run through the counting communicator: lessons/scale_on_paper/dry.py.
"""
from lessons.allreduce_algorithms.model import predict
from lessons.scale_on_paper.links import Cluster, bottleneck, reduce_scatter_time, ring_time, two_level

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
FLOPS = 989.4e12             # H100 SXM BF16 dense tensor FLOP/s: "BF16 | 133.8 | 989.4 | 1978.9"
FLOPS_SOURCE = "https://glennklockwood.com/garden/processors/h100"
STATE = 16                   # bytes of model state per parameter: bf16 weight + grad, fp32 master + Adam


def layer_params(s):
    attn = s["d"] * s["d"] * (2 + 2 * s["kv_heads"] / s["heads"])  # q, o and the smaller k, v
    return int(attn + 3 * s["d"] * s["ffn"] + 2 * s["d"])           # gated MLP, two norms


def params(s):
    return s["layers"] * layer_params(s) + 2 * s["vocab"] * s["d"] + s["d"]  # + embeddings, head, norm


def layout(world, gpus_per_node=8):
    """(tp, pp, dp) of the 3D plan on `world` GPUs: tensor parallelism never leaves a node."""
    tp = min(TP, world, gpus_per_node)
    pp = max(1, min(PP, world // tp))
    return tp, pp, world // (tp * pp)


def plan(strategy, s, world, gpus_per_node=8):
    """Bytes each GPU sends per step, and what they are, from lessons 08-12's closed forms."""
    p, n = params(s), world
    if strategy == "dp":  # lesson 08: all-reduce the gradient, 2(N-1)/N of it per rank
        return dict(comm_bytes=2 * (n - 1) / n * BYTES * p, state_gb=STATE * p / 1e9)
    if strategy == "fsdp":  # lesson 10: all-gather forward, again backward, reduce-scatter gradients;
        blocks = s["layers"] * layer_params(s)  # fully_shard keeps the root gathered for backward
        return dict(comm_bytes=(n - 1) / n * BYTES * (3 * blocks + 2 * (p - blocks)), state_gb=STATE * p / n / 1e9,
                    block_params=blocks, root_params=p - blocks)
    tp, pp, dp = layout(world, gpus_per_node)
    micro = SEQS // dp
    act = SEQ * s["d"] * BYTES  # one microbatch's activation at a layer boundary
    tp_calls = 4 * (s["layers"] // pp) * micro  # lesson 11: f and g, forward and backward, per layer
    return dict(tp=tp, pp=pp, dp=dp, micro=micro, tp_calls=tp_calls, act_bytes=act,
                tp_bytes=tp_calls * 2 * (tp - 1) / tp * act,
                pp_bytes=(2 * micro * act) if pp > 1 else 0,  # lesson 12: activations on, gradients back
                dp_bytes=2 * (dp - 1) / dp * BYTES * p / (tp * pp),
                state_gb=STATE * p / (tp * pp) / 1e9)


def step(strategy, s, c):
    """{comm_s, compute_s, busy_s, step_lo, step_hi, ...} for one step on cluster c."""
    p, n = params(s), c.n
    out = dict(plan(strategy, s, n, c.gpus_per_node), strategy=strategy, world=n, params=p, tokens=SEQ * SEQS,
               flops=FLOPS)
    out["compute_s"] = 6 * p * SEQ * SEQS / n / FLOPS  # forward 2, backward 4 FLOPs per parameter-token
    out["busy_s"] = out["compute_s"]
    if strategy == "dp":
        g = BYTES * p
        out["ring_s"], out["two_level_s"] = ring_time(c, g), two_level(c, g)
        out["comm_s"] = min(out["ring_s"], out["two_level_s"])
    elif strategy == "fsdp":  # three passes, each a reduce-scatter's worth on the ring across nodes
        alpha = c.alpha(c.nic) if c.nodes > 1 else c.alpha(c.intra)
        out["comm_s"] = 3 * reduce_scatter_time(n, BYTES * p, alpha, bottleneck(c))
    else:
        tp, pp, dp, m = out["tp"], out["pp"], out["dp"], out["micro"]
        node = Cluster(tp, 1, c.intra, c.nic, c.nics_per_node, c.links)  # one node of c
        t_tp = out["tp_calls"] * ring_time(node, out["act_bytes"])
        nic = min(c.bw(c.nic) * c.nics_per_node / c.gpus_per_node, c.bw(c.intra))  # this GPU's NIC share
        t_pp = 2 * m * (c.alpha(c.nic) + out["act_bytes"] / nic) if pp > 1 else 0.0
        t_dp = predict("ring", dp, BYTES * p / (tp * pp), c.alpha(c.nic), 1 / nic, 0.0)
        out.update(tp_s=t_tp, pp_s=t_pp, dp_s=t_dp, comm_s=t_tp + t_pp + t_dp)
        out["busy_s"] = out["compute_s"] * (m + pp - 1) / m  # lesson 12's bubble: (p-1)/(m+p-1) idle
    out["comm_bytes"] = out.get("comm_bytes", out.get("tp_bytes", 0) + out.get("pp_bytes", 0) +
                                out.get("dp_bytes", 0))
    out["step_lo"] = max(out["busy_s"], out["comm_s"])   # every byte hidden behind compute, at best
    out["step_hi"] = out["busy_s"] + out["comm_s"]       # nothing hidden, at worst
    return out
