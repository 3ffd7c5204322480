"""Lesson 13's tolerance budget per output entry, from common/tolerance.py and the run's own values.

    bound = entries(q, k, v, rows, causal, dtype, n)   # |ring - one process| <= bound, entry by entry

The ring (in `dtype`) and one process (float64, every score at once) compute o_i = sum_j w_j v_j,
w = softmax(s_i), s_ij = q_i . k_j / sqrt(d), over the keys row i sees. First order, per run and with
u the unit roundoff of the side's dtype (tolerance.unit_roundoff), each weight w_j carries a relative
error rho_j of at most
    gamma_(d+2) |q_i| . |k_j| / sqrt(d)  x 2   the score and the row's max (d products, the scale)
  + 2u R_i                                     s - m and the rescales' m_old - m_new (R_i: the row's
                                               spread of scores, max - min over what it sees)
  + 8u (T + 1)                                 T rescale exps and its own, 4 ulp each (T = 2N tiles)
and the sums l = sum p, o = sum p v add each term through at most K = L + 2T + 2 roundings (L keys:
the tile's dot product and adds, a rescale and an add per later tile), so with o = o / l rounded once:
    |do_ic| <= sum_j w_j (rho_j + gamma_K) (|v_jc| + |o_ic|) + u |o_ic|.
The budget is that bound with the ring's u plus the same with float64's (the reference's own error).
The exps are allowed 4 ulp each: NumPy's and torch's exp are that close or closer.
"""
import math

import numpy as np

from common import tolerance

ULPS = 4


def _side(u, s, w, absqk, v_abs, o_abs, d, n_keys, tiles):
    rho_score = 2 * tolerance.gamma(d + 2, u) * absqk / math.sqrt(d)
    seen = w > 0
    spread = np.where(seen, s, -np.inf).max(axis=1) - np.where(seen, s, np.inf).min(axis=1)
    rho = rho_score + 2 * u * spread[:, None] + 2 * ULPS * u * (tiles + 1) + tolerance.gamma(n_keys + 2 * tiles + 2, u)
    wr = np.where(seen, w * rho, 0.0)
    return wr @ v_abs + wr.sum(axis=1, keepdims=True) * o_abs + u * o_abs


def entries(q, k, v, rows, causal, dtype, n, sides=None):
    """The budget of |ring - one process| for my rows (len(rows) x d). sides: the dtypes of the two
    evaluations compared (default: this dtype's ring against float64's one process)."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    d = q.shape[1]
    s = q[rows] @ k.T / math.sqrt(d)
    if causal:
        s = np.where(rows[:, None] >= np.arange(len(k))[None, :], s, -np.inf)
    p = np.exp(s - s.max(axis=1, keepdims=True)) if s.size else s
    w = p / p.sum(axis=1, keepdims=True) if s.size else p
    o_abs = np.abs(w @ v)
    absqk = np.abs(q[rows]) @ np.abs(k).T
    sides = sides or (str(dtype), "float64")
    return sum(_side(tolerance.unit_roundoff(t), s, w, absqk, np.abs(v), o_abs, d, len(k), 2 * n) for t in sides)
