"""The node tier (tier-0 HyperNodes for a short list of nodes): which nodes, the manifests, and reading them back."""

from __future__ import annotations

from stormtopo.core.topology.fabric import parse_topology
from stormtopo.core.topology.hypernodes import hypernode_manifests, topology_from_hypernodes
from stormtopo.core.topology.node_tier import NODE_TIER, node_hypernode_name, node_tier_manifests, shortlist
from stormtopo.core.topology.tree import NAME_MAX, is_name

# Two leaves of four 8-GPU nodes under one spine.
FABRIC = parse_topology("switches:\n  spine:\n    leaf-a: [a0, a1, a2, a3]\n    leaf-b: [b0, b1, b2, b3]\n")


def test_an_empty_cluster_lists_only_the_first_node_of_the_first_leaf() -> None:
    assert shortlist(FABRIC, {}) == ["a0"]
    assert shortlist(FABRIC, {}, next_empty=3) == ["a0", "a1", "a2"]


def test_partly_used_nodes_are_listed_per_free_amount_fullest_leaf_first() -> None:
    # leaf-b is fuller (14 GPUs) than leaf-a (9): its nodes come first. b0 and b1 both have 2 free,
    # a1 too: with per_free=2 the third node with 2 free (a1) is left out. Full nodes (b2) never; the
    # next empty node is leaf-b's b3.
    used = {"a0": 3, "a1": 6, "b0": 6, "b1": 6, "b2": 8}
    assert shortlist(FABRIC, used, per_free=2) == ["b0", "b1", "a0", "b3"]
    assert shortlist(FABRIC, used, per_free=1) == ["b0", "a0", "b3"]


def test_listed_nodes_get_a_tier0_hypernode_that_their_leaf_names_instead() -> None:
    manifests = node_tier_manifests(hypernode_manifests(FABRIC), ["a1", "b3"])
    names = [m["metadata"]["name"] for m in manifests]
    assert names[:2] == ["a1.node", "b3.node"]  # before the leaves that name them
    a1 = manifests[0]
    assert a1["spec"] == {"tier": NODE_TIER, "members": [{"type": "Node", "selector": {"exactMatch": {"name": "a1"}}}]}
    leaf_a = next(m for m in manifests if m["metadata"]["name"] == "leaf-a")
    assert leaf_a["spec"]["tier"] == 1  # the leaf keeps tier 1: highestTierAllowed 1 still means the leaf
    assert [m["type"] for m in leaf_a["spec"]["members"]] == ["Node", "HyperNode", "Node", "Node"]
    # The tree rendered without the node tier is untouched.
    assert hypernode_manifests(FABRIC)[0]["spec"]["members"][1]["type"] == "Node"


def test_reading_back_folds_the_node_tier_into_the_nodes() -> None:
    with_tier = topology_from_hypernodes(node_tier_manifests(hypernode_manifests(FABRIC), ["a1", "b3"]))
    plain = topology_from_hypernodes(hypernode_manifests(FABRIC))
    assert with_tier.switches == plain.switches
    assert with_tier.nodes["a1"].switch == "leaf-a"
    assert with_tier.span(["a1"]).tier == 0 and with_tier.span(["a1", "a2"]).tier == 1


def test_a_long_node_name_still_gives_a_valid_hypernode_name() -> None:
    node = "n" * NAME_MAX
    name = node_hypernode_name(node)
    assert is_name(name) and len(name) <= NAME_MAX and name != node_hypernode_name("n" * (NAME_MAX - 1))
