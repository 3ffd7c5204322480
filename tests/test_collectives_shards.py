"""Unit tests for common/shards.py: near-equal shards for uneven counts (no MPI)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common.shards import chunk_bounds, counts_displs  # noqa: E402


def test_uneven_split_gives_the_first_ranks_one_more():
    assert chunk_bounds(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert counts_displs(10, 4) == ([3, 3, 2, 2], [0, 3, 6, 8])


def test_even_split_and_single_part():
    assert chunk_bounds(8, 4) == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert chunk_bounds(7, 1) == [(0, 7)]


def test_fewer_items_than_parts_leaves_empty_shards_at_the_end():
    assert chunk_bounds(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]
    assert chunk_bounds(0, 3) == [(0, 0), (0, 0), (0, 0)]


@pytest.mark.parametrize("count", [0, 1, 5, 17, 1000, 1001])
@pytest.mark.parametrize("parts", [1, 2, 3, 4, 7])
def test_shards_tile_the_range_and_differ_by_at_most_one(count, parts):
    bounds = chunk_bounds(count, parts)
    assert len(bounds) == parts
    assert bounds[0][0] == 0 and bounds[-1][1] == count
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))  # contiguous, no gaps or overlaps
    sizes = [b - a for a, b in bounds]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_bad_input_is_refused():
    with pytest.raises(ValueError):
        chunk_bounds(5, 0)
    with pytest.raises(ValueError):
        chunk_bounds(-1, 2)
