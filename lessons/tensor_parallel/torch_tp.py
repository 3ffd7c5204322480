"""Lesson 11's second idea: torch's own tensor parallelism (torch.distributed.tensor.parallel) on the
same block, from the same weights, beside the collectives torch ran.

    torch_own(ctx, p, x, w, eps, ratio)          per plan: the worst |difference| / budget against one process,
                                                 the collectives torch ran forward and backward, the
                                                 gradients left as Partial(sum), my share of tokens

(2) is ColwiseParallel on fc1 + RowwiseParallel on fc2 over a DeviceMesh; (3) puts SequenceParallel
around them (tokens sharded on dim 0). The collectives are noted as they run, as CommDebugMode does.
"""
import numpy as np


def torch_block(torch, p, dtype, device, eps):
    """torch.nn modules holding the same weights (torch keeps a Linear's weight as out x in)."""
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            hidden, ffn = p["A"].shape
            self.ln = torch.nn.LayerNorm(hidden, eps=eps, dtype=dtype, device=device)
            self.fc1 = torch.nn.Linear(hidden, ffn, dtype=dtype, device=device)
            self.fc2 = torch.nn.Linear(ffn, hidden, dtype=dtype, device=device)

        def forward(self, x):
            h = torch.nn.functional.gelu(self.fc1(self.ln(x)), approximate="tanh")
            return x + self.fc2(h)
    block = Block()
    with torch.no_grad():
        for param, value in ((block.ln.weight, p["gamma"]), (block.ln.bias, p["beta"]),
                             (block.fc1.weight, p["A"].T), (block.fc1.bias, p["a"]),
                             (block.fc2.weight, p["B"].T), (block.fc2.bias, p["b"])):
            param.copy_(torch.from_numpy(np.ascontiguousarray(value)))
    return block


def collectives_seen(torch):
    """A dispatch mode that notes every collective DTensor runs (the c10d functional ops under it), as
    torch's own CommDebugMode does, without the 2 s that importing CommDebugMode costs each rank."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.calls = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            space, _, name = func._schema.name.partition("::")
            if space == "_c10d_functional" and name != "wait_tensor" and not name.startswith("_"):
                self.calls.append(name)
            return func(*args, **(kwargs or {}))
    return Seen


def torch_own(ctx, p, x, w, eps, ratio):
    """torch.distributed.tensor.parallel on the same block: (2) as ColwiseParallel + RowwiseParallel,
    (3) with SequenceParallel around them. Returns, per way, the worst |difference| / budget against
    one process (z, dx, every gradient), the collectives torch ran forward and backward, and my share
    of tokens. eps: the layer norm's; ratio(name, got): the page's grade of a whole array by name."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module
    device = "cuda" if ctx.device == "gpu" else "cpu"
    mesh = init_device_mesh(device, (ctx.world_size,))
    dtype, seen = getattr(torch, x.dtype.name), collectives_seen(torch)
    plans = {  # use_local_output=False: a DTensor knows its uneven shards, a plain local tensor does not
        "megatron": {"fc1": ColwiseParallel(use_local_output=False), "fc2": RowwiseParallel()},
        "sequence": {"ln": SequenceParallel(sequence_dim=0, use_local_output=False),
                     "fc1": ColwiseParallel(input_layouts=Shard(0), use_local_output=False),
                     "fc2": RowwiseParallel(output_layouts=Shard(0), use_local_output=False)}}

    def full(t):
        t = t.full_tensor() if isinstance(t, DTensor) else t
        return t.detach().cpu().numpy()
    out = []
    for way, plan in plans.items():
        block = parallelize_module(torch_block(torch, p, dtype, device, eps), mesh, plan)
        xt, wt = (torch.from_numpy(a).to(device) for a in (x, w))
        if way == "sequence":  # tokens sharded the way torch cuts them (torch.chunk: ceil first)
            xt, wt = (distribute_tensor(t, mesh, [Shard(0)]) for t in (xt, wt))
        xt.requires_grad_()
        with seen() as fwd:
            z = block(xt)
        loss = (z * wt).sum()
        with seen() as bwd:
            loss.backward()
        partial = [name for name, prm in block.named_parameters()  # left as a sum still to be made
                   if any(pl.is_partial() for pl in getattr(prm.grad, "placements", ()))]
        got = {"z": full(z), "dx": full(xt.grad), "dA": full(block.fc1.weight.grad).T, "da": full(block.fc1.bias.grad),
               "dB": full(block.fc2.weight.grad).T, "db": full(block.fc2.bias.grad),
               "dgamma": full(block.ln.weight.grad), "dbeta": full(block.ln.bias.grad)}
        out.append({"way": way, "ratio": max(ratio(k, got[k]) for k in got), "forward_calls": " ".join(fwd.calls),
                    "backward_calls": " ".join(bwd.calls), "partial_grads": " ".join(partial),
                    "tokens_held": xt.to_local().shape[0] if isinstance(xt, DTensor) else x.shape[0]})
    return out
