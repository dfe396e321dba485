"""bench/hindsight.py: the longest prefix placed in order within leaves, with few replicas off one node."""

from __future__ import annotations

from bench.hindsight import _may_fit, full_run_leaves, longest_prefix


def test_a_replica_that_fits_one_node_takes_the_node_a_later_replica_does_not_need() -> None:
    # 4 + 4 fits an empty node of either leaf; only the empty node of the second keeps the first leaf's
    # pair for the 8 + 8 after it.
    found = longest_prefix([[8, 8], [8, 4, 4]], [(4, 4), (8, 8)], misses=0)
    assert (found.replicas, found.exact) == (2, True)


def test_a_miss_allowed_can_buy_a_later_replica() -> None:
    # With no miss the 4 + 4 must take an empty node, and the 8 + 8 then finds no pair.
    assert longest_prefix([[8, 8], [4, 4]], [(4, 4), (8, 8)], misses=0).replicas == 1
    one = longest_prefix([[8, 8], [4, 4]], [(4, 4), (8, 8)], misses=1)
    assert one.replicas == 2
    assert one.schedule[0].startswith("leaf")


def test_a_replica_no_leaf_holds_ends_the_prefix() -> None:
    found = longest_prefix([[8], [8]], [(4,), (8, 8), (1,)], misses=0)
    assert (found.replicas, found.exact) == (1, True)


def test_out_of_steps_is_a_lower_bound() -> None:
    found = longest_prefix([[8, 8], [8, 4, 4]], [(4, 4), (8, 8)], misses=0, budget=1)
    assert not found.exact
    assert found.replicas <= 2


def test_the_full_runs_leaves_are_the_benchs() -> None:
    assert full_run_leaves("empty") == [[8] * 8] * 8
    fragmented = full_run_leaves("fragmented")
    assert len(fragmented) == 8 and sum(n == 8 for leaf in fragmented for n in leaf) == 15


def test_replicas_of_whole_node_pods_need_disjoint_runs_in_one_leaf() -> None:
    three = (8, 8, 8)
    assert _may_fit(((8, 8, 8), (8, 8, 8)), [three, three])
    # GPUs and empty nodes enough, but four and two empty nodes are one run of three, not two.
    assert not _may_fit(((8, 8, 8, 8), (8, 8)), [three, three])
    assert not _may_fit(((8, 8, 8), (8, 8)), [three, (8, 8), (4,)])  # GPUs short
    assert _may_fit(((8, 8, 8), (8, 8)), [three, (8, 8)])
