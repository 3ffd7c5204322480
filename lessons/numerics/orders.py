"""Which simple order did the library's sum follow? Candidates computed here, compared bit for bit.

    orders.matching(got, every, dtype, ring)   # names of the candidates equal to `got` at every element

every[r] is rank r's values (float64 holding values of dtype). Each candidate adds as the ring's adds
do (float32, then rounded to dtype: lessons/numerics/bf16.py), in its own order. A match says only that
this run's result is what that order gives on these values; no match says the order is none of these
(the library may split the buffer, or order each part otherwise). Nothing here reads the library.
"""
import numpy as np

from lessons.numerics.bf16 import host_add, round_to


def _chain(values, dtype):
    acc = values[0]
    for x in values[1:]:
        acc = host_add(acc, x, dtype)
    return acc


def _pairs(values, dtype):
    """Neighbours added pairwise, then pairs of pairs (recursive doubling's order for a power of two)."""
    while len(values) > 1:
        values = [host_add(values[i], values[i + 1], dtype) if i + 1 < len(values) else values[i]
                  for i in range(0, len(values), 2)]
    return values[0]


def candidates(every, dtype):
    return {"rank order 0,1,..,N-1, each add rounded": _chain(every, dtype),
            "rank order N-1,..,0, each add rounded": _chain(every[::-1], dtype),
            "neighbour pairs, then pairs of pairs": _pairs(list(every), dtype),
            "float32 adds in rank order, rounded once": round_to(np.sum(np.array(every, np.float32), axis=0,
                                                                        dtype=np.float32), dtype)}


def matching(got, every, dtype, ring):
    """[names] of the orders whose result equals `got` bit for bit, lesson 05's ring (`ring`) among them."""
    if len(every) < 2:
        return []  # one rank: nothing was added
    found = [name for name, want in candidates(every, dtype).items() if np.array_equal(got, want)]
    return found + (["lesson 05's ring"] if np.array_equal(got, ring) else [])
