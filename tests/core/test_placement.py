"""Placement maths (pure): bin packing, tiers, explanations."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from stormtopo.core.explanation import explain
from stormtopo.core.packing import _first_fit_decreasing, best_tier, fits
from stormtopo.core.topology.fabric import parse_topology
from stormtopo.core.topology.hypernodes import hypernode_manifests, topology_from_hypernodes

EXAMPLE = parse_topology((Path(__file__).resolve().parents[2] / "examples" / "topology" / "aibrix-1730.yaml").read_text())


def test_fits_is_exact_where_first_fit_decreasing_is_not() -> None:
    # FFD fills 5+4 then 4+3+2 and strands the last 2; 5+3+2 | 4+4+2 fits both nodes exactly.
    assert not _first_fit_decreasing([10, 10], [5, 4, 4, 3, 2, 2])
    assert fits([10, 10], [5, 4, 4, 3, 2, 2])
    assert not fits([8, 8], [6, 4, 3, 3])  # 16 of 16 GPUs, but 6 leaves a hole no pod fills
    assert not fits([1, 1], [2])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 8), min_size=1, max_size=5), st.lists(st.integers(1, 8), min_size=1, max_size=6))
def test_a_gang_that_fits_has_a_placement_and_one_that_does_not_never_fits_with_less(free: list[int], pods: list[int]) -> None:
    result = fits(free, pods)
    if result:
        assert sum(pods) <= sum(free)
        assert max(pods) <= max(free)
    assert fits([f + 1 for f in free], pods) or not result  # more room never hurts


def test_best_tier_and_explanation_on_the_feature_requests_tree() -> None:
    free = {f"node{i}": 8 for i in range(8)} | {"node0": 4, "node2": 4, "node4": 4, "node6": 4}
    assert best_tier(EXAMPLE, free, [6, 6]) == 2
    explanation = explain(EXAMPLE, free, [6, 6], 1)
    text = explanation.render()
    assert not explanation.fits
    assert "the gang needs 2 pods with 6 + 6 GPUs (12 GPUs) within tier 1" in text
    assert "tier 1: best is s0 with 12 free GPUs (node0: 4, node1: 8), free GPUs are spread too thin" in text
    assert "it would fit within tier 2" in text
    explanation = explain(EXAMPLE, free, [1, 1], 1)
    assert explanation.fits and "tier 1: s0 fits it" in explanation.render()


def test_tree_read_back_from_hypernodes_matches_the_description() -> None:
    back = topology_from_hypernodes(hypernode_manifests(EXAMPLE))
    assert {n: s.tier for n, s in back.switches.items()} == {n: s.tier for n, s in EXAMPLE.switches.items()}
    assert back.lowest_common_switch(["node0", "node3"]).name == "s4"  # type: ignore[union-attr]
    assert back.tier_names == {1: "leaf", 2: "spine", 3: "core"}


def test_domain_labels_and_placement_record() -> None:
    from stormtopo.core.placement import domain_labels, merge_placements, placement_record

    assert domain_labels(EXAMPLE, "node5") == {
        "stormtopo.io/hypernode-tier-1": "s2",
        "stormtopo.io/hypernode-tier-2": "s5",
        "stormtopo.io/hypernode-tier-3": "s6",
    }
    assert domain_labels(EXAMPLE, "elsewhere") == {}
    assert placement_record(EXAMPLE, ["node4", "node5"]) == {"v": 1, "hyperNode": "s2", "tier": 1, "nodes": ["node4", "node5"]}
    merged = merge_placements('{"gone": {"tier": 3}, "a": {"tier": 2}}', "b", {"tier": 1}, live=["a"])
    assert merged == '{"a":{"tier":2},"b":{"tier":1}}'
    assert merge_placements("not json", "b", {"tier": 1}, live=[]) == '{"b":{"tier":1}}'


def test_a_recorded_placement_is_found_only_when_the_replica_has_a_record() -> None:
    from stormtopo.core.placement import recorded_placement

    table = '{"a":{"hyperNode":"s2","tier":1,"nodes":["node4"]}}'
    assert recorded_placement(table, "a") == {"v": 1, "hyperNode": "s2", "tier": 1, "nodes": ["node4"]}  # the release before's
    versioned = '{"a":{"v":1,"hyperNode":"s2","tier":1,"nodes":["node4"]},"b":{"v":2,"hyperNode":"s2","tier":1,"nodes":[]}}'
    assert recorded_placement(versioned, "a") == {"v": 1, "hyperNode": "s2", "tier": 1, "nodes": ["node4"]}
    assert recorded_placement(versioned, "b") is None  # a later release's: not read
    assert recorded_placement(table, "b") is None
    assert recorded_placement(None, "a") is None
    assert recorded_placement("not json", "a") is None
    assert recorded_placement('["a"]', "a") is None
    assert recorded_placement('{"a": "s2"}', "a") is None
