"""Lesson 12's idea in torch's own words: torch.distributed.pipelining (PipelineStage, ScheduleGPipe,
Schedule1F1B) on the same stages, from the same weights, so its loss and gradients can be checked
against one process like the lesson's own pipeline.

    loss, grads = torch_pipelining.run(ctx, stage, "1f1b", x, t, m, batch, unflatten)

Its stages size their receive buffers from the first micro-batch, so every micro-batch must have as
many rows: the lesson gives it the largest part of the batch that m divides.
"""


def run(ctx, stage, name, x, t, m, batch, unflatten):
    """torch.distributed.pipelining on my layers (stage: the lesson's Stage), batch (x, t) in m equal
    micro-batches: (its loss, its gradients as {layer: flat}). unflatten(flat, fan_in, fan_out): a
    layer's (w, b) views (lesson 10's)."""
    import torch
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    s, p = ctx.rank, ctx.world_size
    mods = []
    for k in range(stage.lo, stage.hi):
        fan_in, fan_out = stage.dims[k]
        lin = torch.nn.Linear(fan_in, fan_out, dtype=x.dtype, device=x.device)
        w, b = unflatten(stage.params[k], fan_in, fan_out)
        with torch.no_grad():
            lin.weight.copy_(w.T)  # torch keeps weight as (out, in)
            lin.bias.copy_(b)
        mods += [lin] + ([torch.nn.Tanh()] if k != stage.last else [])
    net = torch.nn.Sequential(*mods)
    kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[name]
    # our loss is already divided by B: scale_grads=False, or torch divides the sum by m once more
    schedule = kind(PipelineStage(net, s, p, x.device), n_microbatches=m,
                    loss_fn=lambda y, target: ((y - target) ** 2).sum() / batch, scale_grads=False)
    losses = []
    if p == 1:
        schedule.step(x, target=t, losses=losses)
    elif s == 0:
        schedule.step(x)
    elif s == p - 1:
        schedule.step(target=t, losses=losses)
    else:
        schedule.step()
    lins = [mod for mod in net if isinstance(mod, torch.nn.Linear)]
    grads = {k: torch.cat([lin.weight.grad.T.reshape(-1), lin.bias.grad]).detach()
             for k, lin in zip(range(stage.lo, stage.hi), lins)}
    return float(sum(loss.detach() for loss in losses)) if losses else 0.0, grads
