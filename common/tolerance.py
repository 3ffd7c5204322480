"""How far may a correct floating-point sum across ranks be from the exact one? A budget, per element.

    u = tolerance.unit_roundoff("bfloat16")                 # 2**-8: half the gap between 1 and the next
    k = tolerance.depth(n, "ring")                          # additions on the longest path: n-1; tree: ceil(log2 n)
    b = tolerance.budget("float32", n, "ring", abs_sum)     # |computed - exact| <= b, element by element
    b = tolerance.budget("bfloat16", n, "ring", abs_sum, accumulate="float32")   # add in fp32, round once
    m = tolerance.mean_budget("float32", n, "tree", abs_sum, divisor=n)          # the sum, then / divisor
    p = tolerance.parity("float64", k, abs_sum)     # two correct evaluations of one sum, each its own order
    r = tolerance.worst_ratio(abs(a - b), p)        # max |a - b| / budget over elements: <= 1 inside

The derivation (the standard one: a rounded operation is the exact one times (1 + d), |d| <= u):
  * every addition a + b of numbers already in the dtype returns (a + b)(1 + d), |d| <= u, where u is
    the unit roundoff: 2**-24 for float32, 2**-11 for float16, 2**-8 for bfloat16, 2**-53 for float64.
  * a sum of n values evaluated as any binary tree of additions (a ring's chunk is a chain: depth n-1;
    a balanced tree: depth ceil(log2 n)) gives each x_i a factor prod(1 + d_j) over the additions on
    its path to the root, at most k of them, k the tree's depth. With |d_j| <= u,
    |prod(1 + d_j) - 1| <= gamma_k = k*u / (1 - k*u)  (when k*u < 1).
  * so |computed - exact| <= sum_i |x_i| |prod_i - 1| <= gamma_k * sum_i |x_i|.
  * accumulate in a wider dtype (u_acc), round once to the output dtype (u_out): the wide sum is within
    gamma_k(u_acc) * S of exact (S = sum|x_i|), and the final rounding adds u_out * |wide sum|, at most
    u_out * (1 + gamma_k(u_acc)) * S.
  * a mean: the sum within B, then one division: |fl(s'/d) - s/d| <= (B + u * (S + B)) / d.
  * two runs that should agree (by hand against one process, a bucket against a tensor) each evaluate
    the same sum in an order of their own, each within gamma_k * S of the exact sum, so
    |a - b| <= 2 gamma_k * S (parity). k counts every rounding on a term's path: the additions and any
    scaling on the way (a division by B, a multiplication by N); a dot product of length m is a sum of
    m rounded products: k = m.
The bound is for the order a run used, whatever it was: a library that does not say its order gets the
ring's depth n-1 (no order of n-1 additions is deeper). It is a worst case: typical errors are near
sqrt(k) * u * sqrt(sum x_i**2), far inside it; a wrong answer (a rank left out, a division twice)
is off by a whole term, far outside it. It says nothing about the inputs' own rounding to the dtype: the
exact sum it is held against is the sum of the values the ranks really held.
"""
import math

import numpy as np

UNIT_ROUNDOFF = {"float64": 2.0 ** -53, "float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}
ALGORITHMS = ("ring", "tree")   # ring: a chain of additions (any order: the worst case); tree: balanced


def unit_roundoff(dtype):
    """u of a dtype name ("float32", "bfloat16", ...): ValueError for a dtype with no rounding rule here."""
    name = str(dtype).replace("torch.", "")
    if name not in UNIT_ROUNDOFF:
        raise ValueError(f"no unit roundoff for {dtype!r}: one of {', '.join(UNIT_ROUNDOFF)}")
    return UNIT_ROUNDOFF[name]


def depth(n, algorithm):
    """Additions on the longest path from one of n values to the sum: n-1 (ring), ceil(log2 n) (tree)."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    if n <= 1:
        return 0
    return n - 1 if algorithm == "ring" else math.ceil(math.log2(n))


def gamma(k, u):
    """gamma_k = k*u / (1 - k*u): the relative error of a product of k factors (1 + d), |d| <= u."""
    return math.inf if k * u >= 1 else k * u / (1 - k * u)


def budget(dtype, n, algorithm, abs_sum, accumulate=None):
    """The largest |computed - exact| a correct sum of n values may show, per element: abs_sum is
    sum_i |x_i| (a number or a NumPy array). accumulate: the dtype the additions ran in, when it is
    wider than `dtype` and the sum was rounded to `dtype` once at the end."""
    k = depth(n, algorithm)
    if accumulate is None:
        return gamma(k, unit_roundoff(dtype)) * abs_sum
    g = gamma(k, unit_roundoff(accumulate))
    return (g + unit_roundoff(dtype) * (1 + g)) * abs_sum


def mean_budget(dtype, n, algorithm, abs_sum, divisor, accumulate=None):
    """The budget of (the sum) / divisor, the division rounded in `dtype`."""
    b = budget(dtype, n, algorithm, abs_sum, accumulate)
    return (b + unit_roundoff(dtype) * (abs_sum + b)) / divisor


def parity(dtype, k, abs_sum, accumulate=None):
    """The largest |a - b| between two correct evaluations of one sum, each in an order of its own with
    at most k roundings on any term's path (additions, scalings): each is within gamma_k * S of the
    exact sum, S = abs_sum = sum_i |x_i| (a number or an array, per element), so 2 gamma_k * S.
    accumulate: as in budget(), the rounding to `dtype` once after adds in a wider dtype."""
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    g = gamma(k, unit_roundoff(accumulate or dtype))
    return 2 * (g if accumulate is None else g + unit_roundoff(dtype) * (1 + g)) * abs_sum


def worst_ratio(err, bound):
    """max over elements of |err| / bound (NumPy arrays or numbers of one shape): <= 1 when every element
    is inside its budget; an element with err 0 counts 0 even where its bound is 0, one with err > 0 and
    bound 0 counts inf (a correct run cannot differ where no rounding happened)."""
    err, bound = np.abs(np.asarray(err, dtype=np.float64)), np.asarray(bound, dtype=np.float64)
    err, bound = np.broadcast_arrays(err, bound)
    if err.size == 0:
        return 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(err == 0, 0.0, err / bound)
    return float(np.where(np.isnan(r), np.inf, r).max())  # a NaN difference is outside any budget
