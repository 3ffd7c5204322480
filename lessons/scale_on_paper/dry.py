"""Lesson 16's dry run: one rank's calls for a training step at world size 1024, in one process,
through the kit's counting communicator (common/counting.py) wrapped round a backend that moves nothing;
every buffer is a zero-stride view, so a 70B model's gradient takes no memory.

    dry_run(shape, world)     {count: value} for DP, FSDP (torch's fully_shard units) and 3D
"""
import math

import numpy as np

from common import counting
from lessons.scale_on_paper.step import BUCKET, BYTES, SEQ, SEQS, layer_params, layout, params


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
    tp_n, pp_n, dp_n = layout(world, s=s)
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
