"""Section 5's tolerance budget, per output entry, from common/tolerance.py and the run's own values.

    bound = moe_entries(x, router, experts, expert, gate)   # |y - want| <= bound, entry by entry

y = tanh(x @ W_e) * gate runs twice, by hand (my tokens on their expert's rank) and in one process
(everyone's tokens at once). Moving tokens rounds nothing, but each matrix product may add its d
products in another order (another row count, another kernel): two evaluations of a dot product of
length d are within parity = 2 gamma_d * (|x| @ |W|) (tolerance.parity: d roundings on a term's
path). The rest, first order in those differences, with u float64's unit roundoff:
  * tanh is 1-Lipschitz; each side's tanh is allowed 4 ulp (8u relative) of the exact one;
  * the gate, softmax's probability p of the chosen expert, moves by at most 2 p max_j |d logit_j|,
    and each side's softmax (a max, N exps of 4 ulp, N-1 adds, a division) rounds within gamma_(N+10) p;
  * the product tanh * gate rounds once on each side: 2u |y|.
A token whose two largest logits are closer than their budget could pick another expert: far rarer
than a seed can show with standard-normal weights; such a run would fail loudly, not pass wrongly.
"""
import numpy as np

from common import tolerance

U = tolerance.unit_roundoff("float64")
ULPS = 4  # each side's tanh and exp: within 4 ulp (8u relative) of the exact function


def moe_entries(x, router, experts, expert, gate):
    """The budget of |y - want| per entry of my tokens' outputs (len(x) x d), float64."""
    d, n = x.shape[1], router.shape[1]
    ax = np.abs(x)
    d_logit = tolerance.parity("float64", d, ax @ np.abs(router)).max(axis=1)
    d_gate = 2 * gate * d_logit + 2 * tolerance.gamma(n + 10, U) * gate
    bound = np.zeros_like(x)
    for e, w in enumerate(experts):
        rows = expert == e
        t = np.abs(np.tanh(x[rows] @ w))
        d_t = tolerance.parity("float64", d, ax[rows] @ np.abs(w)) + 2 * 2 * ULPS * U * t
        g = gate[rows, None]
        bound[rows] = g * d_t + t * d_gate[rows, None] + 2 * U * t * g
    return bound
