"""The node tier in a cluster it shares (issue 33): trees it did not make, other writers, Volcano's discovery.

Volcano v1.15.1 refuses a HyperNode with a second parent and then places no gang with a network topology
anywhere in the cluster, so the planner must never make one, whatever the tree: overlapping leaves, nodes
selected by regex or label beside exactMatch, leaves kept by another writer."""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from stormtopo.core.placement import plan_placed
from stormtopo.core.request import parse_request
from stormtopo.core.topology.hypernodes import topology_from_hypernodes
from stormtopo.core.topology.node_tier import NODE_TIER, foreign_owner, plan_node_tier, unusable_named_leaves
from stormtopo.core.topology.selectors import selected_nodes
from stormtopo.core.vocabulary import HIGHEST_TIER, MANAGED_BY_LABEL, MODE, NODE_TIER_LABEL, OPERATOR_NAME, TOPOLOGY_SOURCE_LABEL
from stormtopo.core.writes import CreateHyperNode, DeleteHyperNode, SetHyperNodeMembers, Write


def hypernode(name: str, tier: int, members: list[dict[str, Any]], labels: dict[str, str] | None = None, rv: str = "1") -> dict[str, Any]:
    return {
        "apiVersion": "topology.volcano.sh/v1alpha1",
        "kind": "HyperNode",
        "metadata": {"name": name, "labels": dict(labels or {}), "resourceVersion": rv},
        "spec": {"tier": tier, "members": members},
    }


def node(name: str) -> dict[str, Any]:
    return {"type": "Node", "selector": {"exactMatch": {"name": name}}}


def child(name: str) -> dict[str, Any]:
    return {"type": "HyperNode", "selector": {"exactMatch": {"name": name}}}


def seed_tree() -> list[dict[str, Any]]:
    """The seed's tree: leaves s0..s3 of two 8-GPU nodes each, two spines, a root."""
    leaves = [hypernode(f"s{i}", 1, [node(f"node{2 * i}"), node(f"node{2 * i + 1}")]) for i in range(4)]
    spines = [hypernode("spine0", 2, [child("s0"), child("s1")]), hypernode("spine1", 2, [child("s2"), child("s3")])]
    return [*leaves, *spines, hypernode("root", 3, [child("spine0"), child("spine1")])]


GPUS = {f"node{i}": 8 for i in range(8)}


def applied(hypernodes: list[dict[str, Any]], writes: list[Write]) -> list[dict[str, Any]]:
    state = {h["metadata"]["name"]: copy.deepcopy(h) for h in hypernodes}
    for write in writes:
        match write:
            case CreateHyperNode(body):
                state[body["metadata"]["name"]] = copy.deepcopy(dict(body))
            case SetHyperNodeMembers(name, members, _):
                state[name]["spec"]["members"] = copy.deepcopy(list(members))
            case DeleteHyperNode(name):
                state.pop(name, None)
    return list(state.values())


def parents(hypernodes: list[dict[str, Any]]) -> Counter[str]:
    """How many HyperNodes name each HyperNode: Volcano refuses two."""
    return Counter(
        m["selector"]["exactMatch"]["name"]
        for h in hypernodes
        for m in h["spec"]["members"]
        if m["type"] == "HyperNode" and "exactMatch" in m["selector"]
    )


def mine(hypernodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [h for h in hypernodes if h["spec"]["tier"] == NODE_TIER and h["metadata"]["labels"].get(NODE_TIER_LABEL) == "true"]


def test_an_overlapping_leaf_never_gives_a_tier0_hypernode_a_second_parent() -> None:
    """The issue's case: rack-x = {node0, node2} beside s0..s3, node0 partly used. Before the fix the
    operator wrote node2.node into both rack-x and s1, and Volcano then placed no topology gang at all."""
    tree = [*seed_tree(), hypernode("rack-x", 1, [node("node0"), node("node2")])]
    after = applied(tree, plan_node_tier(tree, {"node0": 4}, GPUS, sticky=True, keep_pairs=True))
    assert max(parents(after).values()) == 1
    listed = {h["spec"]["members"][0]["selector"]["exactMatch"]["name"] for h in mine(after)}
    assert listed and not listed & {"node0", "node2"}  # in two leaves: never listed
    rack = next(h for h in after if h["metadata"]["name"] == "rack-x")
    assert rack["spec"]["members"] == [node("node0"), node("node2")]  # untouched


def test_a_node_a_regex_or_label_member_selects_too_is_not_listed() -> None:
    tree = [*seed_tree(), hypernode("nvl", 1, [{"type": "Node", "selector": {"regexMatch": {"pattern": "^node[45]$"}}}])]
    labels = {n: ({"rack": "r1"} if n == "node6" else {}) for n in GPUS}
    tree.append(hypernode("by-label", 1, [{"type": "Node", "selector": {"labelMatch": {"matchLabels": {"rack": "r1"}}}}]))
    used = {"node4": 2, "node6": 2, "node1": 2}
    listed = {
        h["spec"]["members"][0]["selector"]["exactMatch"]["name"]
        for h in mine(applied(tree, plan_node_tier(tree, used, GPUS, node_labels=labels)))
    }
    assert "node1" in listed and not listed & {"node4", "node5", "node6"}
    # The nodes' labels unknown: a labelMatch member may select any node, so none is listed.
    assert mine(applied(tree, plan_node_tier(tree, used, GPUS, node_labels=None))) == []


def test_tier0_hypernodes_carry_only_stormtopos_labels() -> None:
    """Volcano's discovery deletes every HyperNode labelled network-topology-source that it did not
    discover: a copied label would have it delete the node tier's."""
    tree = [hypernode("s0", 1, [node("node0"), node("node1")], labels={"team": "infra", MANAGED_BY_LABEL: OPERATOR_NAME})]
    created = [w.body for w in plan_node_tier(tree, {"node0": 2}, GPUS) if isinstance(w, CreateHyperNode)]
    assert created and all(b["metadata"]["labels"] == {MANAGED_BY_LABEL: OPERATOR_NAME, NODE_TIER_LABEL: "true"} for b in created)


def test_a_leaf_another_writer_keeps_is_left_alone_unless_named() -> None:
    discovered = {TOPOLOGY_SOURCE_LABEL: "label"}
    tree = [hypernode("s0", 1, [node("node0"), node("node1")], labels=discovered), hypernode("s1", 1, [node("node2"), node("node3")])]
    assert foreign_owner(tree[0]) is not None and foreign_owner(tree[1]) is None
    gitops = hypernode("g", 1, [node("x")])
    gitops["metadata"]["annotations"] = {"argocd.argoproj.io/tracking-id": "app:topology.volcano.sh/HyperNode:g"}
    owned = hypernode("o", 1, [node("x")])
    owned["metadata"]["ownerReferences"] = [{"kind": "Topology", "name": "t"}]
    helm = hypernode("h", 1, [node("x")], labels={MANAGED_BY_LABEL: "Helm"})
    argo = hypernode("a", 1, [node("x")], labels={"app.kubernetes.io/instance": "fabric"})  # Argo CD's label tracking
    assert all(foreign_owner(h) is not None for h in (gitops, owned, helm, argo))
    used = {"node0": 2, "node2": 2}
    touched = {w.name for w in plan_node_tier(tree, used, GPUS) if isinstance(w, SetHyperNodeMembers)}
    assert touched == {"s1"}
    touched = {w.name for w in plan_node_tier(tree, used, GPUS, named_leaves={"s0"}) if isinstance(w, SetHyperNodeMembers)}
    assert touched == {"s0", "s1"}


def test_a_leaf_taken_over_by_another_writer_gets_its_nodes_back() -> None:
    tree = seed_tree()
    on = applied(tree, plan_node_tier(tree, {"node0": 2}, GPUS))
    assert any(m["type"] == "HyperNode" for m in next(h for h in on if h["metadata"]["name"] == "s0")["spec"]["members"])
    s0 = next(h for h in on if h["metadata"]["name"] == "s0")
    s0["metadata"]["labels"][TOPOLOGY_SOURCE_LABEL] = "label"  # discovery took it over
    back = applied(on, plan_node_tier(on, {"node0": 2}, GPUS))
    assert next(h for h in back if h["metadata"]["name"] == "s0")["spec"]["members"] == [node("node0"), node("node1")]
    assert "node0.node" not in {h["metadata"]["name"] for h in back}


def test_leaf_writes_are_conditional_on_the_version_read() -> None:
    tree = [hypernode("s0", 1, [node("node0"), node("node1")], rv="42")]
    (update,) = [w for w in plan_node_tier(tree, {"node0": 2}, GPUS) if isinstance(w, SetHyperNodeMembers)]
    assert update.resource_version == "42"


def test_turned_off_every_leaf_gets_its_nodes_back_before_the_tier0_hypernodes_go() -> None:
    tree = seed_tree()
    on = applied(tree, plan_node_tier(tree, {"node0": 2, "node3": 6}, GPUS))
    assert mine(on)
    writes = plan_node_tier(on, {}, {}, enabled=False)
    kinds = [type(w).__name__ for w in writes]
    assert kinds == sorted(kinds, key=lambda k: k != "SetHyperNodeMembers")  # leaves first, deletes after
    off = applied(on, writes)
    assert sorted(off, key=lambda h: h["metadata"]["name"]) == sorted(tree, key=lambda h: h["metadata"]["name"])
    assert plan_node_tier(off, {}, {}, enabled=False) == []


def test_a_leaf_naming_a_missing_tier0_hypernode_is_a_gap_not_a_violation() -> None:
    """A deposed leader's stale write, or a tier-0 HyperNode just deleted: node0 is in no HyperNode for a
    moment. A bound hard replica there is not TopologyViolated (its alert is critical)."""
    tree = seed_tree()
    tree[0]["spec"]["members"] = [child("node0.node"), node("node1")]
    topology = topology_from_hypernodes(tree)
    assert topology.gaps == frozenset({"node0.node"}) and "node0" not in topology.nodes
    request = parse_request({MODE: "hard", HIGHEST_TIER: "1"})
    assert request is not None
    pods = [{"metadata": {"name": f"p{i}", "namespace": "ns"}, "spec": {"nodeName": n}} for i, n in enumerate(["node0", "node1"])]
    placed = plan_placed(topology, request, 1, "r", pods)
    assert placed is not None and not placed.violated and all(s.reason != "TopologyViolated" for s in placed.says)
    # Without a gap, a node outside every HyperNode is still a violation.
    whole = topology_from_hypernodes(seed_tree())
    pods[0]["spec"]["nodeName"] = "stray"
    placed = plan_placed(whole, request, 1, "r", pods)
    assert placed is not None and placed.violated


# --- generated trees ------------------------------------------------------------------------------------

NODES = [f"n{i}" for i in range(10)]


@st.composite
def shared_trees(draw: st.DrawFn) -> tuple[list[dict[str, Any]], dict[str, dict[str, str]]]:
    """A tree of leaves (each HyperNode with at most one parent, as Volcano requires) whose nodes overlap:
    a node may be in several leaves, by exactMatch, regexMatch or labelMatch; some leaves kept by
    Volcano's discovery; spines above some leaves."""
    labels = {n: {"rack": draw(st.sampled_from(["a", "b", "c"]))} for n in NODES}
    leaves = []
    for i in range(draw(st.integers(1, 5))):
        chosen = draw(st.lists(st.sampled_from(NODES), min_size=1, max_size=4, unique=True))
        members: list[dict[str, Any]] = [node(n) for n in chosen]
        kind = draw(st.sampled_from(["exact", "exact", "regex", "label", "mixed"]))
        if kind == "regex":
            members = [{"type": "Node", "selector": {"regexMatch": {"pattern": f"^n[{draw(st.integers(0, 9))}-9]$"}}}]
        elif kind == "label":
            members = [{"type": "Node", "selector": {"labelMatch": {"matchLabels": {"rack": draw(st.sampled_from(["a", "b"]))}}}}]
        elif kind == "mixed":
            members.append({"type": "Node", "selector": {"regexMatch": {"pattern": f"^n{draw(st.integers(0, 9))}$"}}})
        extra = {TOPOLOGY_SOURCE_LABEL: "label"} if draw(st.booleans()) and draw(st.booleans()) else {}
        leaves.append(hypernode(f"leaf{i}", 1, members, labels=extra))
    names = [h["metadata"]["name"] for h in leaves]
    split = draw(st.integers(0, len(names)))
    spines = [hypernode("spine0", 2, [child(n) for n in names[:split]])] if split else []
    if split < len(names) and draw(st.booleans()):
        spines.append(hypernode("spine1", 2, [child(n) for n in names[split:]]))
    return leaves + spines, labels


@settings(max_examples=300, deadline=None)
@given(
    shared_trees(),
    st.lists(st.dictionaries(st.sampled_from(NODES), st.integers(0, 8), max_size=10), min_size=1, max_size=4),
    st.lists(st.booleans(), min_size=4, max_size=4),
)
def test_generated_trees_with_overlaps_never_get_a_second_parent(
    tree_and_labels: tuple[list[dict[str, Any]], dict[str, dict[str, str]]], usages: list[dict[str, int]], losses: list[bool]
) -> None:
    tree, labels = tree_and_labels
    gpus = {n: 8 for n in NODES}
    state = tree
    for used, lost in zip(usages, losses, strict=False):  # the list moving as pods come and go
        if lost and mine(state):  # one of its tier-0 HyperNodes deleted behind its back: a gap
            state = [h for h in state if h is not mine(state)[0]]
        state = applied(state, plan_node_tier(state, used, gpus, sticky=True, keep_pairs=True, node_labels=labels))
        gaps = {m["selector"]["exactMatch"]["name"] for h in state for m in h["spec"]["members"] if m["type"] == "HyperNode"}
        assert gaps <= {h["metadata"]["name"] for h in state}  # every gap closed by the next pass
        assert max(parents(state).values(), default=0) <= 1
        for tier0 in mine(state):
            assert set(tier0["metadata"]["labels"]) == {MANAGED_BY_LABEL, NODE_TIER_LABEL}
            selected = tier0["spec"]["members"][0]["selector"]["exactMatch"]["name"]
            # Its node is selected by no HyperNode but its tier-0 one (whatever the selector).
            others = [
                h
                for h in state
                if h is not tier0
                and any(m["type"] == "Node" and selected in selected_nodes(m["selector"], labels) for m in h["spec"]["members"])
            ]
            assert others == []
        for leaf in state:
            if TOPOLOGY_SOURCE_LABEL in leaf["metadata"]["labels"]:
                assert leaf == next(h for h in tree if h["metadata"]["name"] == leaf["metadata"]["name"])  # discovery's: untouched
    off = applied(state, plan_node_tier(state, {}, {}, enabled=False))
    assert sorted(off, key=lambda h: h["metadata"]["name"]) == sorted(tree, key=lambda h: h["metadata"]["name"])


def test_a_leaf_naming_a_gone_tier0_hypernode_is_repaired_on_and_off() -> None:
    """Review: node0.node deleted behind the node tier's back (by hand, a deposed leader's late delete):
    node0 was in no domain for good, even after turning the node tier off."""
    tree = seed_tree()
    on = applied(tree, plan_node_tier(tree, {"node0": 2, "node1": 2}, GPUS))
    assert {"node0.node", "node1.node"} <= {h["metadata"]["name"] for h in mine(on)}
    gone = [h for h in on if h["metadata"]["name"] != "node0.node"]
    again = applied(gone, plan_node_tier(gone, {"node0": 2, "node1": 2}, GPUS))
    assert "node0.node" in {h["metadata"]["name"] for h in again}  # created again, the leaf names it
    off = applied(gone, plan_node_tier(gone, {}, {}, enabled=False))
    assert sorted(off, key=lambda h: h["metadata"]["name"]) == sorted(tree, key=lambda h: h["metadata"]["name"])


def test_a_named_leaf_the_node_tier_cannot_change_is_said_with_why() -> None:
    """--node-tier-leaf with a typo, a spine, a tier-0 HyperNode or a regex leaf: each said with why; a
    leaf whose nodes are all listed (named by their tier-0 HyperNodes) is still a leaf."""
    tree = seed_tree()
    tree.append(hypernode("rx", 1, [{"type": "Node", "selector": {"regexMatch": {"pattern": "lnode.*"}}}]))
    listed = applied(tree, plan_node_tier(tree, {"node0": 2, "node1": 2}, GPUS))
    assert {m["type"] for h in listed if h["metadata"]["name"] == "s0" for m in h["spec"]["members"]} == {"HyperNode"}
    tier0 = next(h["metadata"]["name"] for h in listed if h["spec"]["tier"] == NODE_TIER)
    why = unusable_named_leaves(listed, {"s0", "s1", "s9", "spine0", tier0, "rx"}, GPUS.keys())
    assert set(why) == {"s9", "spine0", tier0, "rx"}
    assert "no HyperNode" in why["s9"] and "not a leaf" in why["spine0"] and "not a leaf" in why[tier0]
    assert "exactMatch" in why["rx"]
    # Every tier-0 HyperNode of s0's deleted by hand: s0 is still a leaf (the planner names them again).
    stripped = [h for h in listed if h["spec"]["tier"] != NODE_TIER]
    assert "s0" not in unusable_named_leaves(stripped, {"s0"}, GPUS.keys())
    # ... but a spine naming a deleted "rack1.node" (no node rack1) is still no leaf.
    spine = hypernode("spine9", 2, [child("rack1.node")])
    assert "not a leaf" in unusable_named_leaves([*stripped, spine], {"spine9"}, GPUS.keys())["spine9"]
    assert any(isinstance(w, CreateHyperNode) for w in plan_node_tier(stripped, {"node0": 2, "node1": 2}, GPUS, named_leaves={"s0"}))
