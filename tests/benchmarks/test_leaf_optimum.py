"""The exact within-leaf optimum (bench/leaf_optimum.py) against the exhaustive search of bench/packing.py."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.leaf_optimum import fits_leaf, most_within_leaves, size_classes
from bench.packing import _PrefixSearch

PODS = st.sampled_from([1, 2, 4, 8])
REPLICA = st.lists(PODS, min_size=1, max_size=3).map(tuple)
LEAF = st.lists(st.integers(0, 8), min_size=1, max_size=3).map(tuple)


def test_a_leaf_holds_pods_by_whole_multiples_of_each_size() -> None:
    assert fits_leaf((8,), [(4, 4)])
    assert not fits_leaf((6, 2), [(4, 4)])  # 8 GPUs free, but only one node offers 4
    assert fits_leaf((6, 2), [(4, 2), (2,)])
    assert not fits_leaf((7, 7), [(8,)])


def test_pod_sizes_that_do_not_divide_each_other_are_refused() -> None:
    with pytest.raises(ValueError, match="3 is not a multiple of 2"):
        size_classes([2, 3])
    with pytest.raises(ValueError, match="at least one GPU"):
        size_classes([0, 2])


@settings(max_examples=300, deadline=None)
@given(st.lists(LEAF, min_size=1, max_size=3), st.lists(REPLICA, min_size=1, max_size=5))
def test_the_program_finds_what_the_exhaustive_search_finds(leaves: list[tuple[int, ...]], replicas: list[tuple[int, ...]]) -> None:
    subsets = (s for k in range(len(replicas) + 1) for s in itertools.combinations(replicas, k))
    best = max((len(s) for s in subsets if _PrefixSearch(10**6).fits(tuple(leaves), list(s))), default=0)
    assert most_within_leaves(leaves, replicas) == best
