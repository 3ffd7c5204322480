"""Lesson 08's tolerance budgets, from common/tolerance.py and the run's own values (no hand-picked constant).

    drift = Drift(torch, dtype, batch, lr, momentum)   before training
    dg = drift.step(model, opt, x, y)    before each opt.step(): the reference model, its optimizer, the batch
    drift.after(opt)                     after it: the update's roundings, the momentum and parameter budgets
    drift.dp                             per element: how far (a), (b), (c) may be apart after the steps
    ratio = tolerance.worst_ratio(a - b, budget)                      the checks' value: <= 1 inside

The gradient: (a) by hand (each rank sum / B over its rows, then an all-reduce), (b) one process
(the mean over all B rows) and (c) DDP (N / B * sum, the all-reduce, / N) evaluate one sum of B
per-sample terms g_i / B, each in its own order: at most B - 1 additions and 3 scalings (/ B, * N,
/ N) on any term's path, so k = B + 2 and |g_a - g_b| <= 2 gamma_k * sum_i |g_i| / B per element
(tolerance.parity), with the per-sample gradients g_i computed at the reference's parameters.
SGD with momentum then evaluates v <- mu v + g and p <- p - lr v on both sides, 2 roundings each:
    dv <- mu dv + dg + 2 gamma_2 (mu |v| + |g|),     dp <- dp + lr dv + 2 gamma_2 (|p| + lr |v|).
First order: a parameter difference feeds back into the next gradient (lr * L * dp per step, L the
gradient's Lipschitz constant), left out; with K * lr * L << 1 (5 steps of lr 0.05 here) it is a
small fraction of dp, and correct runs land far inside (typically 1e-2 of the budget).
"""
from common import tolerance


def per_sample_abs(torch, model, x, y, batch):
    """sum_i |d(l_i / batch)/dparams| over the rows of (x, y), per element, flat in parameters() order."""
    from torch.func import functional_call, grad, vmap
    params = {k: p.detach() for k, p in model.named_parameters()}

    def loss(p, xi, yi):
        return ((functional_call(model, p, (xi[None],)) - yi[None]) ** 2).sum() / batch
    g = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
    return torch.cat([g[k].abs().sum(0).reshape(-1) for k in params]).to(torch.float64)


class Drift:
    """Per-element budget of the parameters' differences after K steps (module docstring)."""

    def __init__(self, torch, dtype, batch, lr, momentum):
        self.torch, self.dtype, self.batch, self.lr, self.mu = torch, dtype, batch, lr, momentum
        self.g2 = tolerance.gamma(2, tolerance.unit_roundoff(dtype))
        self.dv = self.dp = 0.0
        self.first = None

    def step(self, model, opt, x, y):
        """The gradient budget at the reference's current parameters (before its opt.step())."""
        flat = self.torch.cat
        self.p = flat([p.detach().reshape(-1) for p in model.parameters()]).abs().double()
        self.g = flat([p.grad.reshape(-1) for p in model.parameters()]).abs().double()
        self.v = flat([opt.state[p]["momentum_buffer"].reshape(-1) if "momentum_buffer" in opt.state[p]
                       else self.torch.zeros_like(p).reshape(-1) for p in model.parameters()]).abs().double()
        abs_sum = per_sample_abs(self.torch, model, x, y, self.batch)
        self.dg = tolerance.parity(self.dtype, self.batch + 2, abs_sum)
        if self.first is None:
            self.first = self.dg
        return self.dg

    def after(self, opt, model):
        """The momentum and parameter budgets once the reference took its step."""
        v_new = self.torch.cat([opt.state[p]["momentum_buffer"].reshape(-1)
                                for p in model.parameters()]).abs().double()
        self.dv = self.mu * self.dv + self.dg + 2 * self.g2 * (self.mu * self.v + self.g)
        self.dp = self.dp + self.lr * self.dv + 2 * self.g2 * (self.p + self.lr * v_new)


def ratio(torch, got, want, bound):
    """max over elements of |got - want| / bound, got and want lists of tensors (parameters() order)."""
    diff = torch.cat([(a.detach() - b.detach()).reshape(-1) for a, b in zip(got, want)]).double()
    return tolerance.worst_ratio(diff.cpu().numpy(), bound.cpu().numpy() if hasattr(bound, "cpu") else bound)


def across_ranks(ctx, torch, tensors, dtype):
    """Collective: the parity budget of two all-reduces of these per-rank tensors, per element, flat:
    2 gamma_{N-1} * sum over ranks |t_r| (the abs sum added in float64, far finer than the budget)."""
    import numpy as np
    from mpi4py import MPI
    mine = torch.cat([t.detach().reshape(-1) for t in tensors]).abs().double().cpu().numpy()
    total = np.empty_like(mine)
    ctx.comm.Allreduce(mine, total, op=MPI.SUM)
    return tolerance.parity(dtype, tolerance.depth(ctx.world_size, "ring"), total)
