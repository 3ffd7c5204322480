"""Lesson 10's second idea: torch's own FSDP (torch.distributed.fsdp.fully_shard) on the same model, from
the same weights and batch slices as the ZeRO-3 written by hand, so the two can be compared.

fully_shard shards each parameter tensor along its first dimension (rows of weight, items of bias),
not one flat vector per layer as the page does. torch is imported only here, only on --api torch."""


def train(ctx, flats, dims, x, t, batch, schedule, unflatten, adam):
    """fully_shard on the page's MLP. flats: each layer's flat parameters (the page's layout, read with
    its `unflatten`); adam: (beta1, beta2, eps). Returns (the gathered flat parameters after the last
    step, the items of each parameter this rank holds)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    n, dtype, dev = ctx.world_size, x.dtype, x.device
    b1, b2, eps = adam
    # the run's own device: without mesh=, fully_shard builds its mesh on torch's accelerator, which is
    # cuda on a GPU node even when this run is on the CPU
    mesh = init_device_mesh(dev.type, (n,))
    linears = [torch.nn.Linear(fi, fo, dtype=dtype, device=dev) for fi, fo in dims]
    with torch.no_grad():
        for lin, flat, (fi, fo) in zip(linears, flats, dims):
            w, b = unflatten(torch.from_numpy(flat), fi, fo)
            lin.weight.copy_(w.T)  # torch keeps weight as (out, in)
            lin.bias.copy_(b)
    layers = []
    for lin in linears:
        layers += [lin, torch.nn.Tanh()]
    net = torch.nn.Sequential(*layers[:-1])
    for lin in linears:
        fully_shard(lin, mesh=mesh)  # each layer its own unit: gathered before it runs, freed after
    fully_shard(net, mesh=mesh)
    optimizers = {}
    for opt, lr, _ in schedule:
        if opt not in optimizers:  # a fresh optimizer when the schedule turns to Adam, as (a)-(c)
            make = torch.optim.SGD if opt == "sgd" else torch.optim.Adam
            optimizers[opt] = make(net.parameters(), lr=lr, **({} if opt == "sgd" else {
                "betas": (b1, b2), "eps": eps}))
        # fully_shard divides the summed gradients by N: local loss N / B * sum makes it the full mean
        (((net(x) - t) ** 2).sum() * n / batch).backward()
        optimizers[opt].step()
        optimizers[opt].zero_grad()
    params = [p.full_tensor().detach() for p in net.parameters()]  # weight, bias per layer
    flat = [torch.cat([w.T.reshape(-1), b]).cpu().numpy() for w, b in zip(params[::2], params[1::2])]
    held = [int(p.to_local().numel()) for p in net.parameters()]
    return flat, held
