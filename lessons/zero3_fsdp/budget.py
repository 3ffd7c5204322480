"""Lesson 10's tolerance budget: how far two correct trainings may end apart, per parameter.

    bound = trajectory(flats, dims, x, t, batch, schedule, dtype, n, betas)   # flat, every layer's
                                                                               # parameters in turn

Every training here ((a) ZeRO-3, (b) one process, (c) data parallel, (d) the library's calls, torch's
FSDP) runs the same steps on the same values in `dtype`, adding the gradient's B row terms in an
order of its own. Each is held within E of exact arithmetic, first order, u the dtype's unit
roundoff, values from an exact (float64) replay of the schedule; the budget is the parity E + E.
Per step, with e the parameters' bound so far (0 at the start):
  * the gradient: e_g = |H| e + R. H is the loss's Hessian at this step's parameters (central
    differences of the gradient, float64): an error e in the parameters moves the gradient by at
    most |H| e, entry by entry. R is the step's own rounding: each layer's dot products and bias add
    (gamma_(fan_in+1)), tanh (4 ulp), the loss's gradient (5 roundings: a scaled loss as torch's),
    and the gradient's sum over the batch and the ranks (gamma_(B+N+2)), carried layer to layer
    with |W| as in lessons 12 and 13.
  * SGD: e += lr e_g (and the step's roundings).
  * Adam: the step lr/c1 m / (sqrt(v/c2) + eps) is a function of this run's Adam gradients g_1..g_t;
    its exact derivative by each, from the run's m and v, times that gradient's e_g, summed (so g/|g|
    at t = 1 is flat where |g| >> eps, and steep where |g| is near eps), plus m's and v's roundings.
    Where the gradient's bound reaches |g| its sign is not settled: the derivative is no bound there,
    and the step's size is: |m_hat| / sqrt(v_hat) <= C_t (Cauchy-Schwarz over the steps), so two
    steps differ by at most 2 lr C_t. The error then reaches every later gradient through |H|.
The bound holds first order; it grows step by step with |H| (the feedback) and is loose where Adam's
sign is open: in float32 after 3 SGD and 3 Adam steps a few parameters' budgets reach the whole step.
"""
import math

import numpy as np

from common import tolerance

ULPS = 4    # tanh: NumPy's and torch's are within 4 ulp of the exact one
STEP = 1e-5  # central differences of the gradient: h^2 and 1e-16 / h both far below what is bounded


def _layers(flat, dims):
    """(w, b) per layer of a (K x items) batch of flat parameter vectors, as (K, in, out), (K, out)."""
    out, at = [], 0
    for fan_in, fan_out in dims:
        out.append((flat[:, at:at + fan_in * fan_out].reshape(-1, fan_in, fan_out),
                    flat[:, at + fan_in * fan_out:at + (fan_in + 1) * fan_out]))
        at += (fan_in + 1) * fan_out
    return out


def gradients(flat, dims, x, t, batch):
    """The loss's gradient (sum over the batch of |y - t|^2, / B) for each row of a (K x items) batch
    of flat parameter vectors, in float64: (K x items)."""
    last, acts, layers = len(dims) - 1, [np.broadcast_to(x, (flat.shape[0],) + x.shape)], _layers(flat, dims)
    for k, (w, b) in enumerate(layers):
        z = acts[-1] @ w + b[:, None, :]
        acts.append(z if k == last else np.tanh(z))
    gy, grads = 2 * (acts[-1] - t) / batch, [None] * len(dims)
    for k in reversed(range(len(dims))):
        gz = gy if k == last else gy * (1 - acts[k + 1] ** 2)
        grads[k] = np.concatenate([(acts[k].transpose(0, 2, 1) @ gz).reshape(len(flat), -1), gz.sum(1)], 1)
        gy = gz @ layers[k][0].transpose(0, 2, 1)
    return np.concatenate(grads, 1)


def hessian(flat, dims, x, t, batch, block=128):
    """The loss's Hessian at `flat` (items x items), by central differences of the gradient."""
    n = flat.size
    h = np.empty((n, n))
    for lo in range(0, n, block):
        hi = min(n, lo + block)
        nudge = np.zeros((hi - lo, n))
        nudge[np.arange(hi - lo), np.arange(lo, hi)] = STEP
        h[:, lo:hi] = ((gradients(flat + nudge, dims, x, t, batch)
                        - gradients(flat - nudge, dims, x, t, batch)) / (2 * STEP)).T
    return h


def rounding(flat, dims, x, t, batch, u, n):
    """R: the parity of one gradient's own roundings (two evaluations, each in an order of its own),
    per parameter, at exact parameters `flat`."""
    def g(r):
        return tolerance.gamma(r, u)
    last, layers = len(dims) - 1, [(w[0], b[0]) for w, b in _layers(flat[None], dims)]
    acts, err = [x], [np.zeros_like(x)]
    for k, (w, b) in enumerate(layers):
        z = acts[-1] @ w + b
        a = z if k == last else np.tanh(z)
        slope = 1.0 if k == last else 1 - a * a
        ez = err[-1] @ np.abs(w) + 2 * g(dims[k][0] + 1) * (np.abs(acts[-1]) @ np.abs(w) + np.abs(b))
        err.append(slope * ez + (0 if k == last else 2 * ULPS * u * np.abs(a)))
        acts.append(a)
    gy = 2 * (acts[-1] - t) / batch
    egy, out = 2 * err[-1] / batch + 2 * g(5) * np.abs(gy), [None] * len(dims)
    k_sum = batch + n + 2  # a product, the batch's adds, the ranks' partial sums, a scaling
    for k in reversed(range(len(dims))):
        w, a = layers[k][0], acts[k + 1]
        if k == last:
            gz, egz = gy, egy
        else:
            gz = gy * (1 - a * a)
            egz = (egy * np.abs(1 - a * a) + 2 * np.abs(gy * a) * err[k + 1]
                   + 2 * u * np.abs(gy) * (a * a + np.abs(1 - a * a)) + 2 * u * np.abs(gz))
        absx = np.abs(acts[k])
        egw = absx.T @ egz + err[k].T @ np.abs(gz) + 2 * g(k_sum) * (absx.T @ np.abs(gz))
        out[k] = np.concatenate([egw.ravel(), egz.sum(0) + 2 * g(k_sum) * np.abs(gz).sum(0)])
        egy = egz @ np.abs(w).T + 2 * g(dims[k][1]) * (np.abs(gz) @ np.abs(w).T)
        gy = gz @ w.T
    return np.concatenate(out)


def adam_cap(t, b1, b2):
    """C_t >= |m_hat| / sqrt(v_hat) after t steps of any gradients (Cauchy-Schwarz over the steps)."""
    return ((1 - b1) / math.sqrt(1 - b2) * math.sqrt(sum((b1 * b1 / b2) ** j for j in range(t)))
            * math.sqrt(1 - b2 ** t) / (1 - b1 ** t))


def trajectory(flats, dims, x, t, batch, schedule, dtype, n, betas):
    """The budget of |one training - another| per parameter after `schedule` (flat: layer by layer).
    schedule: [(opt, lr, t_adam)]; betas: (b1, b2, eps); n: the ranks (their partial sums)."""
    b1, b2, eps = betas
    u = tolerance.unit_roundoff(dtype)
    flat = np.concatenate([np.asarray(f, np.float64) for f in flats])
    x, t = np.asarray(x, np.float64), np.asarray(t, np.float64)
    e, seen = np.zeros_like(flat), []  # seen: (g, its bound) of each Adam step so far
    for opt, lr, step in schedule:
        g = gradients(flat[None], dims, x, t, batch)[0]
        eg = np.abs(hessian(flat, dims, x, t, batch)) @ e + rounding(flat, dims, x, t, batch, u, n)
        if opt == "sgd":
            flat = flat - lr * g
            e = e + lr * eg + 2 * u * (np.abs(lr * g) + np.abs(flat))
            continue
        seen = [] if step == 1 else seen  # a fresh Adam, as every training makes one
        seen.append((g, eg))
        c1, c2 = 1 - b1 ** step, 1 - b2 ** step
        first = [(1 - b1) * b1 ** (step - 1 - i) for i in range(step)]   # m = sum first_i g_i
        second = [(1 - b2) * b2 ** (step - 1 - i) for i in range(step)]  # v = sum second_i g_i^2
        m = sum(c * gi for c, (gi, _) in zip(first, seen))
        v = sum(c * gi * gi for c, (gi, _) in zip(second, seen))
        s = np.sqrt(v / c2)
        d, move = s + eps, lr / c1 * m / (s + eps)
        em = 2 * tolerance.gamma(3 * step, u) * sum(c * np.abs(gi) for c, (gi, _) in zip(first, seen))
        ev = 2 * tolerance.gamma(4 * step, u) * v
        with np.errstate(divide="ignore", invalid="ignore"):
            per_v = np.where(s > 0, np.abs(m) / d ** 2 / (2 * c2 * s), np.inf)  # |d move / d v| / (lr / c1)
            slope = sum(np.abs(a / d - m / d ** 2 * c * gi / (c2 * s)) * egi
                        for a, c, (gi, egi) in zip(first, second, seen))
            lin = lr / c1 * (slope + em / d + np.nan_to_num(per_v * ev, nan=np.inf))
        lin = np.where(np.isnan(lin), np.inf, lin)
        flat = flat - move
        e = e + np.minimum(lin, 2 * lr * adam_cap(step, b1, b2)) + 2 * tolerance.gamma(4, u) * np.abs(move) \
            + 2 * u * np.abs(flat)
    return e
