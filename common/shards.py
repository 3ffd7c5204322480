"""Splitting `count` items into near-equal shards, one per rank: pure arithmetic, no MPI.

    chunk_bounds(10, 4)  ->  [(0, 3), (3, 6), (6, 8), (8, 10)]   # the first count % parts: one more
    counts_displs(10, 4) ->  ([3, 3, 2, 2], [0, 3, 6, 8])         # as Scatterv/Gatherv/Allgatherv take
"""


def chunk_bounds(count, parts):
    """[(start, stop)] for `parts` contiguous shards covering range(count); sizes differ by at most 1."""
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    base, extra = divmod(count, parts)
    bounds, start = [], 0
    for p in range(parts):
        stop = start + base + (1 if p < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def counts_displs(count, parts):
    """(counts, displacements) of chunk_bounds, as MPI's v-collectives take them."""
    bounds = chunk_bounds(count, parts)
    return [b - a for a, b in bounds], [a for a, _ in bounds]
