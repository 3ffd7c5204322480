"""Lesson 11's tolerance budgets, per entry, from common/tolerance.py and the run's own values.

    bound = entries(p, x, w, dtype, eps, c, k)   # {"z", "dx", "dA", "da", "dB", "db", "dgamma", "dbeta"}
                                                 # |a way - one process| <= bound[name], entry by entry

A way and one process compute the same block on the same inputs in `dtype`; what differs is the
order of the sums: the ranks' partial sums of a row-parallel product added by a ring or a reduce-
scatter, the partial gradients all-reduced, and any product whose kernel adds in another order for
another shape (torch's kernels too). So each side is held within E of exact arithmetic on its
inputs, E from the run's values (float64), first order, u the dtype's unit roundoff, and the budget
is the parity E + E (both sides the same bound). A sum of n terms in any order, with r roundings on
a term's path (the product, n - 1 adds, a bias or a division), is within gamma_r sum|terms|
(tolerance.gamma); an input already off by e reaches the output through |the derivative| e, and
through a product as |W|^T e (lessons 12, 13). Per value:
  LN:    mean H adds (gamma_H), x - mean, var (gamma_(H+2) + the mean's 2|x - mean| e), rsqrt 3u;
         one side may form it as x*rstd - mean*rstd (torch's): roundings on |x| + |mean|, not |x - mean|
  u      = LN(x) @ A + a     gamma_(H+1) (|y| @ |A| + |a|)  + e_y @ |A|
  h      = GeLU(u)           |GeLU'(u)| e_u + its own: tanh's input 5 roundings, tanh 4 ulp, 2 products
  z      = x + h @ B + b     gamma_(F+2) (|h| @ |B| + |b| + |x|)  + e_h @ |B|   (F over the ranks)
  dh     = dz @ B^T          gamma_H (|dz| @ |B|^T)                            (dz = W: exact)
  du     = dh * GeLU'(u)     e_dh |GeLU'| + |dh| (|GeLU''| e_u + GeLU''s own, ~8 roundings) + u
  dA, da = y^T du, sum du    gamma_T over T tokens, + e_y^T |du| + |y|^T e_du
  dB, db = h^T dz, sum dz    gamma_T over T tokens, + e_h^T |dz|
  dLN(x) = du @ A^T          gamma_F (|du| @ |A|^T) + e_du @ |A|^T             (F over the ranks)
  LN's backward: its two means over H, rstd times the difference, dgamma and dbeta over T tokens
  dx     = dz + dLN's dx     one add
"""
import numpy as np

from common import tolerance

ULPS = 4  # each side's tanh: within 4 ulp (8u relative) of the exact one, NumPy's and torch's


def entries(p, x, w, dtype, eps, c, k):
    """The budget of |a way - one process| for the whole block, per entry, float64 arrays shaped as
    the reference's: z, dx (tokens x hidden), dA (hidden x F), da (F), dB (F x hidden), db, dgamma,
    dbeta (hidden). p: the block's parameters; w: the loss weights (dz); c, k: GeLU's tanh constants."""
    p = {name: np.asarray(v, np.float64) for name, v in p.items()}
    x, dz = np.asarray(x, np.float64), np.asarray(w, np.float64)
    u = tolerance.unit_roundoff(dtype)

    def g(r):
        return tolerance.gamma(r, u)
    (tokens, hidden), ffn = x.shape, p["A"].shape[1]
    A, B, gam = np.abs(p["A"]), np.abs(p["B"]), np.abs(p["gamma"])

    # layer norm forward, per token (row)
    mean = x.mean(1, keepdims=True)
    cen = x - mean
    var = (cen * cen).mean(1, keepdims=True) + eps
    rstd = var ** -0.5
    xhat = cen * rstd
    y = xhat * p["gamma"] + p["beta"]
    loose = (np.abs(x) + np.abs(mean)) * rstd  # |x-hat| as one side may round it: x*rstd - mean*rstd
    e_mean = g(hidden) * np.abs(x).mean(1, keepdims=True)
    e_cen = e_mean + u * (np.abs(x) + np.abs(mean))
    e_var = 2 * (np.abs(cen) * e_cen).mean(1, keepdims=True) + g(hidden + 2) * var
    e_rstd = rstd * (e_var / (2 * var) + g(3))
    e_xhat = e_cen * rstd + np.abs(cen) * e_rstd + u * np.abs(xhat)
    e_y = gam * e_xhat + g(3) * (loose * gam + np.abs(p["beta"]))

    # A, GeLU, B
    pre = y @ p["A"] + p["a"]
    e_pre = g(hidden + 1) * (np.abs(y) @ A + np.abs(p["a"])) + e_y @ A
    t = np.tanh(c * (pre + k * pre ** 3))
    dt = c * (1 + 3 * k * pre * pre)                      # d(tanh's input)/du
    d1 = 0.5 * (1 + t) + 0.5 * pre * (1 - t * t) * dt     # GeLU'
    d2 = (1 - t * t) * dt * (1 - pre * t * dt) + 0.5 * pre * (1 - t * t) * 6 * c * k * pre  # GeLU''
    h = 0.5 * pre * (1 + t)
    e_t = (1 - t * t) * g(5) * c * (np.abs(pre) + k * np.abs(pre) ** 3) + 2 * ULPS * u * np.abs(t)
    e_h = np.abs(d1) * e_pre + 0.5 * np.abs(pre) * e_t + g(2) * np.abs(h)
    z_bound = g(ffn + 2) * (np.abs(h) @ B + np.abs(p["b"]) + np.abs(x)) + e_h @ B

    # backward: B, GeLU', A
    dh = dz @ p["B"].T
    e_dh = g(hidden) * (np.abs(dz) @ B.T)
    half = 0.5 * np.abs(pre) * np.abs(dt)                 # GeLU''s second term is half * (1 - t^2)
    e_d1 = (np.abs(d2) * e_pre + (0.5 + 2 * np.abs(t) * half) * e_t
            + u * (0.5 * np.abs(1 + t) + half * (t * t + (1 - t * t))) + g(8) * half * (1 - t * t) + u * np.abs(d1))
    du = dh * d1
    e_du = e_dh * np.abs(d1) + np.abs(dh) * e_d1 + u * np.abs(du)
    dy = du @ p["A"].T
    e_dy = g(ffn) * (np.abs(du) @ A.T) + e_du @ A.T

    # layer norm backward
    gg = dy * p["gamma"]
    e_gg = e_dy * gam + u * np.abs(gg)
    m1, m2 = gg.mean(1, keepdims=True), (gg * xhat).mean(1, keepdims=True)
    e_m1 = e_gg.mean(1, keepdims=True) + g(hidden) * np.abs(gg).mean(1, keepdims=True)
    e_m2 = ((e_gg * np.abs(xhat) + np.abs(gg) * e_xhat).mean(1, keepdims=True)
            + g(hidden + 4) * (np.abs(gg) * loose).mean(1, keepdims=True))
    inner = gg - m1 - xhat * m2
    e_inner = (e_gg + e_m1 + e_xhat * np.abs(m2) + loose * e_m2
               + g(3) * (np.abs(gg) + np.abs(m1) + loose * np.abs(m2)))
    dxn = rstd * inner
    e_dxn = e_rstd * np.abs(inner) + rstd * e_inner + u * np.abs(dxn)

    e = {"z": z_bound, "dx": e_dxn + u * (np.abs(dz) + np.abs(dxn)),
         "dA": g(tokens) * (np.abs(y).T @ np.abs(du)) + e_y.T @ np.abs(du) + np.abs(y).T @ e_du,
         "da": g(tokens) * np.abs(du).sum(0) + e_du.sum(0),
         "dB": g(tokens) * (np.abs(h).T @ np.abs(dz)) + e_h.T @ np.abs(dz),
         "db": g(tokens) * np.abs(dz).sum(0),
         "dgamma": (e_dy * np.abs(xhat) + np.abs(dy) * e_xhat).sum(0) + g(tokens + 2) * (np.abs(dy) * loose).sum(0),
         "dbeta": e_dy.sum(0) + g(tokens) * np.abs(dy).sum(0)}
    return {name: 2 * bound for name, bound in e.items()}  # parity: each side within E of exact
