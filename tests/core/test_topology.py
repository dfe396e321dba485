"""The switch-tree description: parsing, validation with line numbers, HyperNodes, tree maths."""

from __future__ import annotations

from pathlib import Path

import pytest

from stormtopo.core.topology.fabric import parse_topology
from stormtopo.core.topology.hypernodes import hypernode_manifests
from stormtopo.core.topology.tree import TopologyError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "topology" / "aibrix-1730.yaml"


def test_example_is_the_feature_requests_tree() -> None:
    topo = parse_topology(EXAMPLE.read_text())
    assert sorted(topo.nodes) == [f"node{i}" for i in range(8)]
    assert {s.name: s.tier for s in topo.switches.values()} == {"s0": 1, "s1": 1, "s2": 1, "s3": 1, "s4": 2, "s5": 2, "s6": 3}
    assert topo.lowest_common_switch(["node0", "node1"]).name == "s0"  # type: ignore[union-attr]
    assert topo.lowest_common_switch(["node1", "node2"]).name == "s4"  # type: ignore[union-attr]
    assert topo.lowest_common_switch(["node0", "node7"]).name == "s6"  # type: ignore[union-attr]
    assert topo.nodes_under("s5") == ["node4", "node5", "node6", "node7"]


def test_hypernodes_use_exact_match_members_and_come_leaves_first() -> None:
    manifests = hypernode_manifests(parse_topology(EXAMPLE.read_text()))
    assert [m["spec"]["tier"] for m in manifests] == [1, 1, 1, 1, 2, 2, 3]
    s0 = manifests[0]
    assert s0["metadata"]["name"] == "s0" and s0["spec"]["tierName"] == "leaf"
    assert s0["spec"]["members"] == [
        {"type": "Node", "selector": {"exactMatch": {"name": "node0"}}},
        {"type": "Node", "selector": {"exactMatch": {"name": "node1"}}},
    ]
    assert manifests[-1]["spec"]["members"][0] == {"type": "HyperNode", "selector": {"exactMatch": {"name": "s4"}}}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("switches:\n  s0: [a, b]\n  s1: [b, c]\n", "line 3: node 'b' appears twice (first on line 2)"),
        ("switches:\n  top:\n    s0: [a]\n    s1:\n      x: [b]\n", "line 2: switch 'top' has children on different tiers"),
        ("switches:\n  S0: [node0]\n", "line 2: switch 'S0' is not a valid Kubernetes object name"),
        ("switches:\n  s0: []\n", "line 2: switch 's0' has an empty node list"),
        ("switches:\n  s0: [{name: n, gpus: many}]\n", "line 2: node 'n': gpus must be a whole number"),
        ("switches:\n  s0: [{name: n, nics: 2}]\n", "unknown field(s) ['nics']"),
        ("switch:\n  s0: [n]\n", "line 1: unknown top-level key(s) ['switch']"),
        ("switches: [a, b]\n", "line 1: switches must be a mapping"),
        ("switches:\n  s0: [a]\ntierNames: {2: spine}\n", "tierNames names tier(s) [2] that no switch has"),
        ('switches:\n  s0: [a]\ntierNames: {"\u00b9": leaf}\n', "line 3: tierNames key '\u00b9' must be a tier number >= 1"),
        ("", "empty"),
        ("switches:\n  s0: [a\n", "not valid YAML"),
    ],
)
def test_bad_descriptions_name_the_offending_line_and_item(text: str, expected: str) -> None:
    with pytest.raises(TopologyError) as caught:
        parse_topology(text)
    assert expected in str(caught.value)


def test_a_tier_name_resolves_on_the_tree_as_on_the_hypernodes_alone_the_highest_where_two_tiers_share_it() -> None:
    """Topology.tier_of_name (explanations, spread, healing) and ClusterTiers.number (request checking) agree,
    whatever order the HyperNodes came in."""
    from stormtopo.core.capabilities import cluster_tiers
    from stormtopo.core.request import TierLimit
    from stormtopo.core.topology.hypernodes import topology_from_hypernodes

    def hypernode(name: str, tier: int, tier_name: str, members: list[dict[str, object]]) -> dict[str, object]:
        return {"metadata": {"name": name}, "spec": {"tier": tier, "tierName": tier_name, "members": members}}

    leaf = hypernode("r0", 1, "rack", [{"type": "Node", "selector": {"exactMatch": {"name": "n0"}}}])
    spine = hypernode("s0", 2, "rack", [{"type": "HyperNode", "selector": {"exactMatch": {"name": "r0"}}}])
    zone = hypernode("z0", 3, "zone", [{"type": "HyperNode", "selector": {"exactMatch": {"name": "s0"}}}])
    for hypernodes in ([leaf, spine, zone], [zone, spine, leaf]):
        tree = topology_from_hypernodes(hypernodes, {"n0": {}})
        tiers = cluster_tiers(hypernodes, None)
        for name in ("rack", "zone", "nowhere"):
            assert tree.tier_of_name(name) == tiers.number(TierLimit(tier_name=name)), (name, [h["metadata"] for h in hypernodes])
    assert topology_from_hypernodes([leaf, spine], {"n0": {}}).tier_of_name("rack") == 2
