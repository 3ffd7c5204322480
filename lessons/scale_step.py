"""Lesson 16's training step at scale: the bytes lessons 08-12 counted, for a named model's shapes,
priced on a cluster of lessons/scale_model.py, and the same step dry-run through the kit's counting
communicator at world size 1024 in one process (no data moves: every buffer is a zero-stride view).

    params(shape)                      parameters of a decoder-only transformer of these shapes
    plan(strategy, shape, world)       bytes and calls per GPU per step, closed forms (lessons 08-12)
    step(strategy, shape, cluster)     communication and compute seconds, and the overlap bound
    dry_run(shape, world)              the same step through common/counting.py: {count: value}
"""
import math

import numpy as np

from common import counting
from lessons.scale_model import Cluster, bottleneck, predict, reduce_scatter_time, ring_time, two_level

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
BUCKET = 25 * 1024 * 1024    # torch DDP's default bucket: _DEFAULT_BUCKET_CAP_MB = 25 (MiB), in
#                              torch/nn/parallel/distributed.py of the installed torch 2.13.0
FLOPS = 989.4e12             # H100 SXM BF16 dense tensor FLOP/s: "BF16 | 133.8 | 989.4 | 1978.9"
FLOPS_SOURCE = "https://glennklockwood.com/garden/processors/h100"
STATE = 16                   # bytes of model state per parameter: bf16 weight + grad, fp32 master + Adam


def layer_params(s):
    attn = s["d"] * s["d"] * (2 + 2 * s["kv_heads"] / s["heads"])  # q, o and the smaller k, v
    return int(attn + 3 * s["d"] * s["ffn"] + 2 * s["d"])           # gated MLP, two norms


def params(s):
    return s["layers"] * layer_params(s) + 2 * s["vocab"] * s["d"] + s["d"]  # + embeddings, head, norm


def layout(world):
    """(tp, pp, dp) of the 3D plan on `world` GPUs, 8 to a node."""
    tp = min(TP, world)
    pp = max(1, min(PP, world // tp))
    return tp, pp, world // (tp * pp)


def plan(strategy, s, world):
    """Bytes each GPU sends per step, and what they are, from lessons 08-12's closed forms."""
    p, n = params(s), world
    if strategy == "dp":  # lesson 08: all-reduce the gradient, 2(N-1)/N of it per rank
        return dict(comm_bytes=2 * (n - 1) / n * BYTES * p, state_gb=STATE * p / 1e9)
    if strategy == "fsdp":  # lesson 10: all-gather forward, again backward, reduce-scatter gradients;
        blocks = s["layers"] * layer_params(s)  # fully_shard keeps the root gathered for backward
        return dict(comm_bytes=(n - 1) / n * BYTES * (3 * blocks + 2 * (p - blocks)), state_gb=STATE * p / n / 1e9,
                    block_params=blocks, root_params=p - blocks)
    tp, pp, dp = layout(world)
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
    out = dict(plan(strategy, s, n), strategy=strategy, world=n, params=p, tokens=SEQ * SEQS, flops=FLOPS)
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
        node = Cluster(tp, 1, c.intra, c.nic, c.nics_per_node)
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


# ---- the dry run: one rank's calls at world size 1024, through common/counting.py ----------------

class Nothing:
    """A backend that moves nothing: the counting communicator wraps it and counts every call."""

    def allreduce(self, buf):
        pass

    def all_gather(self, out, inp):
        pass

    def reduce_scatter(self, out, inp):
        pass

    def send(self, buf, dest):
        pass

    def recv(self, buf, source):
        pass

    def sync(self):
        pass


def ghost(count):
    """`count` bf16 items that take no memory: a zero-stride view reports nbytes = count * 2."""
    return np.broadcast_to(np.zeros(1, np.uint16), (int(count),))


def units(s):
    """fully_shard's units: the root (embeddings, head, final norm), then each transformer block."""
    return [params(s) - s["layers"] * layer_params(s)] + [layer_params(s)] * s["layers"]


def buckets(be, total):
    """DDP: the gradient all-reduced bucket by bucket, BUCKET bytes each (the last one shorter)."""
    left = total
    while left > 0:
        be.allreduce(ghost(min(left, BUCKET) // BYTES))
        left -= BUCKET


def dry_run(s, world):
    """Rank 0's calls for one step of each strategy at `world` ranks (3D: a middle pipeline stage)."""
    out = {"world": world, "layers": s["layers"], "params": params(s), "bucket": BUCKET, "bytes": BYTES}
    dp = counting.Counted(Nothing(), world)
    with dp.phase("dp"):
        buckets(dp, BYTES * params(s))
    fsdp = counting.Counted(Nothing(), world)
    shards = [math.ceil(u / world) for u in units(s)]  # items of each unit's shard, padded
    with fsdp.phase("forward"):
        for sh in shards:
            fsdp.all_gather(ghost(sh * world), ghost(sh))
    with fsdp.phase("backward"):
        for i, sh in reversed(list(enumerate(shards))):
            if i > 0:  # the root stays gathered from forward to backward (torch's _fsdp_state.py:
                fsdp.all_gather(ghost(sh * world), ghost(sh))  # "For the root, do not reshard after forward")
            fsdp.reduce_scatter(ghost(sh), ghost(sh * world))
    tp_n, pp_n, dp_n = layout(world)
    micro, act = SEQS // dp_n, SEQ * s["d"]
    tp, pp, dp3 = (counting.Counted(Nothing(), k) for k in (tp_n, pp_n, dp_n))
    stage, x = min(1, pp_n - 1), ghost(act)  # a middle stage talks both ways
    for _ in range(micro):
        with pp.phase("forward"):
            if stage > 0:
                pp.recv(x, stage - 1)
        with tp.phase("forward"):
            for _ in range(s["layers"] // pp_n):
                tp.allreduce(x)  # g after attention
                tp.allreduce(x)  # g after the MLP
        with pp.phase("forward"):
            if stage < pp_n - 1:
                pp.send(x, stage + 1)
    for _ in range(micro):
        with pp.phase("backward"):
            if stage < pp_n - 1:
                pp.recv(x, stage + 1)
        with tp.phase("backward"):
            for _ in range(s["layers"] // pp_n):
                tp.allreduce(x)  # f's backward, twice a layer
                tp.allreduce(x)
        with pp.phase("backward"):
            if stage > 0:
                pp.send(x, stage - 1)
    with dp3.phase("dp"):
        buckets(dp3, BYTES * params(s) // (tp_n * pp_n))
    out.update(dp_allreduce_calls=dp.total(field="calls"), dp_allreduce_bytes=dp.total(),
               fsdp_all_gather_calls=fsdp.total(names=["all_gather"], field="calls"),
               fsdp_reduce_scatter_calls=fsdp.total(names=["reduce_scatter"], field="calls"),
               fsdp_bytes=fsdp.total(), units=len(shards), root_shard=shards[0], block_shard=shards[1],
               tp=tp_n, pp=pp_n, dp=dp_n, micro=micro, stage=stage,
               tp_allreduce_calls=tp.total(field="calls"), pp_send_calls=pp.total(names=["send"], field="calls"),
               pp_recv_calls=pp.total(names=["recv"], field="calls"), dp3_allreduce_calls=dp3.total(field="calls"))
    return out
