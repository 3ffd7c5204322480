"""Lesson 12's tolerance budgets, from common/tolerance.py and the run's own values.

    loss_bound, grad_bounds = bounds(dims, flats, x, t, batch, dtype)   # grad_bounds[k]: layer k, flat

A stage's gradient is the sum over micro-batches of each micro-batch's sum over its rows; one
process sums all B rows in one product. Both are one sum of B per-row terms |x_i^T gz_i| (a layer's
input row times its output gradient row; gz_i alone for the bias), added in two orders:
tolerance.parity, 2 gamma_k * S per entry with S = |x|^T @ |gz| (|gz| summed for the bias), from
the reference's activations. k counts every rounding on a term's path: B - 1 additions and its
product, and, since a row's forward and backward may run in other kernels (torch's, or another row
count), each layer's dot products on the way (fan_in forward, fan_out backward) plus 10 for its bias
add, tanh (4 ulp) and tanh's derivative. First order: cancellation inside a row is not amplified.
The loss is the sum of B x OUT squares / B: parity over those terms, the same path added.
"""
import numpy as np

from common import tolerance


def bounds(dims, flats, x, t, batch, dtype):
    """The loss's budget (a number) and each layer's gradient budget (flat, the parameters' layout)."""
    last, acts, ws = len(dims) - 1, [np.asarray(x, np.float64)], []
    for k, (fan_in, fan_out) in enumerate(dims):
        flat = np.asarray(flats[k], np.float64)
        w, b = flat[:fan_in * fan_out].reshape(fan_in, fan_out), flat[fan_in * fan_out:fan_in * fan_out + fan_out]
        ws.append(w)
        y = acts[-1] @ w + b
        acts.append(y if k == last else np.tanh(y))
    path = sum(fan_in + fan_out + 10 for fan_in, fan_out in dims)
    r = acts[-1] - np.asarray(t, np.float64)
    loss_bound = tolerance.parity(dtype, r.size + 1 + path, float((r * r).sum()) / batch)
    g, grads = 2 * np.abs(r) / batch, [None] * len(dims)
    for k in reversed(range(len(dims))):
        y = acts[k + 1]
        gz = g if k == last else g * np.abs(1 - y * y)
        grads[k] = tolerance.parity(dtype, batch + 1 + path,
                                    np.concatenate([(np.abs(acts[k]).T @ gz).ravel(), gz.sum(0)]))
        g = gz @ np.abs(ws[k]).T
    return loss_bound, grads
