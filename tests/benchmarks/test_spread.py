"""The replica-spread benchmark (bench/spread.py) on hand-made cases whose answers are known (pure: no cluster)."""

from __future__ import annotations

import pytest

from bench import spread
from bench.leaf_optimum import most_within_leaves

# 2 spines x 2 leaves x 1 node of 8 GPUs.
TINY = spread.Size((2, 2, 1), hours=1.0, live=1, lifetime=3600.0, failures_per_hour=0.0, repair=0.0, samples=1)


def _placed(mode: str, *services: spread.Service) -> spread.Cluster:
    cluster = spread.Cluster(spread.topology_of(TINY), spread.MODES[mode])
    for service in services:
        cluster.arrive(service)
    return cluster


FOUR = spread.Service("a", "1P1D", 1, 4, 0.0, 10.0)  # 4 replicas of 1 + 1 GPUs


def test_without_spread_binpack_puts_every_replica_in_one_leaf() -> None:
    cluster = _placed("off", FOUR)
    e = spread.exposure(cluster, FOUR)
    assert (e.placed, e.leaf_share, e.spine_share) == (4, 1.0, 1.0)
    assert (e.leaf_even, e.spine_even) == (0.25, 0.5)
    assert e.leaf_room and e.leaf_avoidable  # the other leaves were empty all along


def test_the_leaf_spread_puts_one_replica_per_leaf() -> None:
    e = spread.exposure(_placed("leaf", FOUR), FOUR)
    assert (e.placed, e.leaf_share, e.spine_share) == (4, 0.25, 0.5)
    assert not e.leaf_avoidable


def test_the_spine_spread_puts_two_per_spine_packed_in_a_leaf() -> None:
    e = spread.exposure(_placed("spine", FOUR), FOUR)
    assert (e.placed, e.leaf_share, e.spine_share) == (4, 0.5, 0.5)


def test_a_replica_goes_where_it_fits_when_no_less_held_leaf_has_room() -> None:
    full = spread.Service("big", "2P2D", 2, 3, 0.0, 10.0)  # 8 GPUs a replica: a whole leaf each
    small = spread.Service("s", "1P1D", 2, 2, 1.0, 10.0)  # 4 GPUs a replica
    cluster = _placed("leaf", full, small)
    assert len(cluster.placed["big"]) == 3
    e = spread.exposure(cluster, small)
    assert (e.placed, e.leaf_share) == (2, 1.0)  # only the fourth leaf had room: both replicas there
    assert not e.leaf_avoidable and not e.leaf_room


def test_a_failed_leaf_takes_its_replicas_and_they_are_placed_again() -> None:
    cluster = _placed("leaf", FOUR)
    leaf = next(where for where, _ in cluster.placed["a"].values())
    cluster.fail(leaf)
    assert len(cluster.placed["a"]) == 4 and leaf not in {w for w, _ in cluster.placed["a"].values()}
    e = spread.exposure(cluster, FOUR)
    assert (e.leaf_share, e.leaf_even) == (0.5, 0.5)  # 4 replicas over 3 live leaves: 2 in one is the even share


def test_the_optimum_under_the_spread_cap() -> None:
    leaves = [[8], [8]]
    # a: 2 replicas of 4 + 4 GPUs; b: 2 replicas of 2 + 2. Without a cap: a and both b (8 + 4 + 4): 3.
    assert most_within_leaves(leaves, [(4, 4), (4, 4), (2, 2), (2, 2)]) == 3
    services = [((4, 4), 2, 9), ((2, 2), 2, 9)]
    assert spread.most_placed(leaves, ["l0", "l1"], services) == 3
    # At most one of each service per leaf: b's second replica cannot join its first: 2.
    assert spread.most_placed(leaves, ["l0", "l1"], [((4, 4), 2, 1), ((2, 2), 2, 1)]) == 2
    # Both leaves in one domain, one of each per domain: 2.
    assert spread.most_placed(leaves, ["s", "s"], [((4, 4), 2, 1), ((2, 2), 2, 1)]) == 2


@pytest.mark.parametrize("mode", list(spread.MODES))
def test_a_seeded_run_is_reproducible_and_summarised(mode: str) -> None:
    size = spread.SIZES["quick"]
    one, two = spread.run_seed(size, 3, [mode]), spread.run_seed(size, 3, [mode])
    assert one["modes"][mode]["samples"] == two["modes"][mode]["samples"]
    out = spread.summary([one], mode)
    assert out["service_samples"] > 0
    assert 0 < out["packing"]["worst"] <= out["packing"]["median"]
    assert out["packing_unconstrained"]["median"] <= 1.0
    if mode == "leaf":
        assert out["leaf"]["above_even_avoidable"] == 0  # the rule never shares a leaf while a less-held one has room
    if mode == "spine":
        assert out["spine"]["above_even_avoidable"] == 0
