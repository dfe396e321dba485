"""The node tier (tier-0 HyperNodes for a short list of nodes): which nodes, the manifests, and reading them back."""

from __future__ import annotations

import copy
from typing import Any

from stormtopo.core.topology.fabric import parse_topology
from stormtopo.core.topology.hypernodes import hypernode_diff, hypernode_manifests, topology_from_hypernodes
from stormtopo.core.topology.node_tier import (
    NODE_TIER,
    node_hypernode_name,
    node_tier_manifests,
    shortlist,
    whole_node_run,
)
from stormtopo.core.topology.node_tier import (
    plan_node_tier as shipped_plan,
)
from stormtopo.core.topology.tree import NAME_MAX, is_name
from stormtopo.core.vocabulary import HYPERNODE_API, NODE_TIER_LABEL
from stormtopo.core.writes import CreateHyperNode, DeleteHyperNode, SetHyperNodeMembers, Write

# Two leaves of four 8-GPU nodes under one spine.
FABRIC = parse_topology("switches:\n  spine:\n    leaf-a: [a0, a1, a2, a3]\n    leaf-b: [b0, b1, b2, b3]\n")
FABRIC_SWITCHES = topology_from_hypernodes(hypernode_manifests(FABRIC)).switches


def plan_node_tier(*args: Any, **kwargs: Any) -> list[Write]:
    """The rule without the refinements it ships with (a spare empty node, sticky, pairs kept), which
    the tests below turn on one at a time."""
    return shipped_plan(*args, **{"spare_empty": 0, "sticky": False, "keep_pairs": False, **kwargs})


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


def test_an_empty_node_is_opened_where_its_leaf_has_the_fewest_empty_nodes() -> None:
    # leaf-a is fuller (8 GPUs on a0) but keeps three empty nodes, room for a replica of three whole-node
    # pods; leaf-b's only empty node (b3) is opened first, whatever its leaf's fullness.
    used = {"a0": 8, "b0": 2, "b1": 2, "b2": 2}
    assert shortlist(FABRIC, used, per_free=1) == ["b0", "b3"]
    assert shortlist(FABRIC, used, per_free=1, next_empty=2) == ["b0", "b3", "a1"]


def test_a_replica_of_whole_node_pods_needs_a_run_of_empty_nodes() -> None:
    assert whole_node_run([(4, 4), (8, 8)], node_gpus=8) == 2  # 1P1D of whole nodes: two empty nodes in one leaf
    assert whole_node_run([(8, 8), (8, 8, 8)], node_gpus=8) == 3
    assert whole_node_run([(4, 4), (8,), (2, 2, 4)], node_gpus=8) == 0  # one whole-node pod needs no run
    assert whole_node_run([(8, 8)], node_gpus=16) == 0  # half a node each: they share one
    assert whole_node_run([(8, 8)], node_gpus=0) == 0 and whole_node_run([], node_gpus=8) == 0


def test_with_whole_node_replicas_a_run_they_may_need_is_not_broken() -> None:
    # leaf-a has three empty nodes (a run), leaf-b one: b3 is listed either way. Once b3 is taken, leaf-a's
    # run of three is room for one replica of two whole-node pods (or of three): kept, so a replica that fits
    # one node goes to its leaf. A run longer than twice the largest such replica is still opened.
    used = {"a0": 8, "b0": 2, "b1": 2, "b2": 2}
    assert shortlist(FABRIC, used, per_free=1, next_empty=2, whole_node_run=2) == ["b0", "b3"]
    taken = {**used, "b3": 8}
    assert shortlist(FABRIC, taken, per_free=1) == ["b0", "a1"]
    assert shortlist(FABRIC, taken, per_free=1, whole_node_run=2) == ["b0"]
    assert shortlist(FABRIC, {"b0": 2}, per_free=1, whole_node_run=2) == ["b0"]  # runs of four and three: kept
    wide = parse_topology("switches:\n  spine:\n    leaf-a: [a0, a1, a2, a3, a4, a5]\n    leaf-b: [b0, b1]\n")
    # leaf-b's lone empty node first, then leaf-a's run of six: room for three replicas of two, one may go.
    assert shortlist(wide, {"b0": 2}, per_free=1, next_empty=2, whole_node_run=2) == ["b0", "b1", "a0"]
    assert shortlist(wide, {"b0": 2}, per_free=1, next_empty=2, whole_node_run=3) == ["b0", "b1"]
    # The planner reads it from the replicas in the cluster.
    base = hypernode_manifests(FABRIC)
    assert tier0(applied(base, plan_node_tier(base, taken, GPUS, replicas=[(4, 4)]))) == ["a1.node", "b0.node", "b1.node"]
    assert tier0(applied(base, plan_node_tier(base, taken, GPUS, replicas=[(4, 4), (8, 8)]))) == ["b0.node", "b1.node"]


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


# -- keeping the short list current: the planner ----------------------------------------------------
GPUS = {n: 8 for n in FABRIC.nodes}


def applied(hypernodes: list[dict[str, Any]], writes: list[Write]) -> list[dict[str, Any]]:
    """The HyperNodes after `writes`, as the API server would have them; checks no leaf ever names a
    HyperNode that is not there, after any write."""
    state = {h["metadata"]["name"]: copy.deepcopy(h) for h in hypernodes}
    for write in writes:
        match write:
            case CreateHyperNode(body):
                assert body["metadata"]["name"] not in state
                state[body["metadata"]["name"]] = copy.deepcopy(dict(body))
            case SetHyperNodeMembers(name, members):
                state[name]["spec"]["members"] = copy.deepcopy(list(members))
            case DeleteHyperNode(name):
                del state[name]
        named = {m["selector"]["exactMatch"]["name"] for h in state.values() for m in h["spec"]["members"] if m["type"] == "HyperNode"}
        assert named <= state.keys(), write
    return list(state.values())


def tier0(hypernodes: list[dict[str, Any]]) -> list[str]:
    return sorted(h["metadata"]["name"] for h in hypernodes if h["spec"]["tier"] == NODE_TIER)


def test_the_planner_renders_the_short_list_and_then_writes_nothing() -> None:
    base = hypernode_manifests(FABRIC)
    used = {"a0": 3, "b0": 6, "b2": 8}
    writes = plan_node_tier(base, used, GPUS)
    # Creates first, then the leaves that name them; nothing to delete.
    assert [type(w).__name__ for w in writes] == ["CreateHyperNode"] * 3 + ["SetHyperNodeMembers"] * 2
    after = applied(base, writes)
    assert tier0(after) == ["a0.node", "b0.node", "b1.node"]  # b0, a0 partly used; b1 the next empty node (fullest leaf)
    created = next(h for h in after if h["metadata"]["name"] == "b0.node")
    assert created["metadata"]["labels"][NODE_TIER_LABEL] == "true" and created["apiVersion"] == HYPERNODE_API
    assert topology_from_hypernodes(after).switches == topology_from_hypernodes(base).switches
    # A steady state: the same usage again writes nothing, however often it is planned.
    assert plan_node_tier(after, used, GPUS) == []


def test_a_node_filling_up_moves_the_list_in_order_create_update_delete() -> None:
    used = {"a0": 3, "b0": 6, "b2": 8}
    before = applied(hypernode_manifests(FABRIC), plan_node_tier(hypernode_manifests(FABRIC), used, GPUS))
    # b1, the listed empty node, takes a replica of 8: it is full, and the next empty node is b3.
    used = {**used, "b1": 8}
    writes = plan_node_tier(before, used, GPUS)
    assert writes == [
        CreateHyperNode(writes[0].body) if isinstance(writes[0], CreateHyperNode) else None,
        SetHyperNodeMembers("leaf-b", writes[1].members) if isinstance(writes[1], SetHyperNodeMembers) else None,
        DeleteHyperNode("b1.node"),
    ]
    assert isinstance(writes[0], CreateHyperNode) and writes[0].body["metadata"]["name"] == "b3.node"
    # A delete is at the version read: one another writer changed since is not deleted (issue 43, item 5).
    versioned = [{**h, "metadata": {**h["metadata"], "resourceVersion": "7"}} if h["metadata"]["name"] == "b1.node" else h for h in before]
    assert DeleteHyperNode("b1.node", "7") in plan_node_tier(versioned, used, GPUS)
    after = applied(before, writes)
    assert tier0(after) == ["a0.node", "b0.node", "b3.node"]
    assert plan_node_tier(after, used, GPUS) == []
    # Every pod gone: back to the first node of the first leaf, the rest taken back.
    empty = applied(after, plan_node_tier(after, {}, GPUS))
    assert tier0(empty) == ["a0.node"]
    assert topology_from_hypernodes(empty).switches == FABRIC_SWITCHES


def test_a_users_own_tier0_hypernode_and_a_selector_based_leaf_are_left_alone() -> None:
    base = hypernode_manifests(FABRIC)
    leaf_b = next(h for h in base if h["metadata"]["name"] == "leaf-b")
    leaf_b["spec"]["members"] = [{"type": "Node", "selector": {"regexMatch": {"pattern": "^b"}}}]
    mine = {
        "apiVersion": HYPERNODE_API,
        "kind": "HyperNode",
        "metadata": {"name": "a1.node", "labels": {}},  # the name the node tier would give a1: not ours
        "spec": {"tier": NODE_TIER, "members": [{"type": "Node", "selector": {"exactMatch": {"name": "a1"}}}]},
    }
    leaf_a = next(h for h in base if h["metadata"]["name"] == "leaf-a")
    leaf_a["spec"]["members"][1] = {"type": "HyperNode", "selector": {"exactMatch": {"name": "a1.node"}}}
    hypernodes = [mine, *base]
    used = {"a0": 3, "a1": 2, "a2": 5, "b0": 6}
    writes = plan_node_tier(hypernodes, used, GPUS)
    after = applied(hypernodes, writes)
    assert next(h for h in after if h["metadata"]["name"] == "leaf-b") == leaf_b  # selector-based: untouched, b0 not listed
    assert next(h for h in after if h["metadata"]["name"] == "a1.node") == mine  # the user's: neither listed nor deleted
    assert tier0(after) == ["a0.node", "a1.node", "a2.node", "a3.node"]
    assert DeleteHyperNode("a1.node") not in plan_node_tier(after, {}, GPUS) + writes
    # A tier-0 HyperNode with our label but not our shape is not ours either.
    odd = {**mine, "metadata": {"name": "x.node", "labels": {NODE_TIER_LABEL: "true"}}, "spec": {"tier": NODE_TIER, "members": []}}
    assert not any(isinstance(w, DeleteHyperNode) for w in plan_node_tier([odd, *base], {}, GPUS))


def test_a_node_that_takes_no_new_pods_is_never_listed() -> None:
    base = hypernode_manifests(FABRIC)
    cordoned = {n: g for n, g in GPUS.items() if n != "a0"}
    assert tier0(applied(base, plan_node_tier(base, {}, cordoned))) == ["a1.node"]
    assert tier0(applied(base, plan_node_tier(base, {"a1": 4}, cordoned))) == ["a1.node", "a2.node"]


def test_applying_the_tree_again_takes_the_node_tier_back() -> None:
    base = hypernode_manifests(FABRIC)
    with_tier = applied(base, plan_node_tier(base, {"a0": 3}, GPUS))
    diff = hypernode_diff(base, with_tier)  # what `stormtopo topology apply` does: leaves first, then the prune
    assert diff.create == [] and sorted(m["metadata"]["name"] for m in diff.update) == ["leaf-a"]
    assert diff.delete == ["a0.node", "a1.node"]


def test_runs_are_of_the_largest_nodes_of_the_tree() -> None:
    # leaf-a's nodes have 4 GPUs, leaf-b's 8; a 16-GPU node is outside the tree. Empty: a1-a3 and b2-b3.
    base = hypernode_manifests(FABRIC)
    sizes = {**dict.fromkeys(["a0", "a1", "a2", "a3"], 4), **dict.fromkeys(["b0", "b1", "b2", "b3"], 8), "elsewhere": 16}
    used = {"a0": 4, "b0": 8, "b1": 8}
    # No replica of whole-node pods: leaf-b has the fewest empty nodes, b2 opens.
    assert tier0(applied(base, plan_node_tier(base, used, sizes, replicas=[(4, 4)]))) == ["b2.node"]
    # Pods of 8 take a whole node of this tree (the node outside it does not count): leaf-b's pair is their
    # run; leaf-a's 4-GPU nodes are no run for them and one of those opens instead.
    assert tier0(applied(base, plan_node_tier(base, used, sizes, replicas=[(4, 4), (8, 8)]))) == ["a1.node"]


def test_a_run_is_opened_when_the_other_leaves_hold_room_to_spare() -> None:
    # Three empty leaves of four hold two replicas of two whole-node pods each: six elsewhere, so leaf-a's
    # run of two is opened for a replica that fits one node (fewest empty nodes first). Asked to keep room
    # for seven, every run of 2..4 is kept and no empty node is listed.
    four = parse_topology("switches:\n  spine:\n" + "".join(f"    leaf-{x}: [{x}0, {x}1, {x}2, {x}3]\n" for x in "acde"))
    used = {"a0": 8, "a1": 8}
    assert shortlist(four, used, per_free=1, whole_node_run=2) == ["a2"]
    assert shortlist(four, used, per_free=1, whole_node_run=2, spare_runs=7) == []
    assert shortlist(four, used, per_free=1, whole_node_run=2, spare_runs=6) == ["a2"]
    # For replicas of three the other leaves hold one each, three in all: short of four, every run is kept.
    assert shortlist(four, used, per_free=1, whole_node_run=3, spare_runs=4) == []
    assert shortlist(four, used, per_free=1, whole_node_run=3, spare_runs=3) == ["a2"]


def test_a_spare_empty_node_is_listed_from_the_leaf_of_the_next_to_open() -> None:
    # leaf-b's lone empty node b3 is the next to open; with nothing else empty in leaf-b, no spare. Once b3
    # is taken, leaf-a opens next: a1, and a2 beside it for a replica that comes before the list follows.
    used = {"a0": 8, "b0": 2, "b1": 2, "b2": 2}
    assert shortlist(FABRIC, used, per_free=1, spare_empty=1) == ["b0", "b3"]
    taken = {**used, "b3": 8}
    assert shortlist(FABRIC, taken, per_free=1, spare_empty=1) == ["b0", "a1", "a2"]
    base = hypernode_manifests(FABRIC)
    assert tier0(applied(base, plan_node_tier(base, taken, GPUS, spare_empty=1))) == ["a1.node", "a2.node", "b0.node", "b1.node"]


def test_a_listed_node_keeps_its_place_while_it_qualifies() -> None:
    # b0 (6 GPUs free) is listed from leaf-b, the fuller leaf, and b1 is the next empty node; a0, as free,
    # is not (one place per amount). Then leaf-a fills and is the fuller: a list chosen afresh swaps b0 for
    # a0, a sticky one keeps b0 (and lists a3, the only node with 7 free, either way).
    used = {"b0": 2, "b2": 8, "b3": 8, "a0": 2}
    assert shortlist(FABRIC, used, per_free=1) == ["b0", "b1"]
    fuller = {**used, "a1": 8, "a2": 8, "a3": 1}
    assert shortlist(FABRIC, fuller, per_free=1) == ["a0", "a3", "b1"]
    assert shortlist(FABRIC, fuller, per_free=1, keep={"b0", "b1"}) == ["b0", "a3", "b1"]
    base = hypernode_manifests(FABRIC)
    now = applied(base, plan_node_tier(base, used, GPUS, per_free=1))
    assert tier0(applied(now, plan_node_tier(now, fuller, GPUS, per_free=1))) == ["a0.node", "a3.node", "b1.node"]
    assert tier0(applied(now, plan_node_tier(now, fuller, GPUS, per_free=1, sticky=True))) == ["a3.node", "b0.node", "b1.node"]


def test_keeping_pairs_lists_a_node_whose_taking_costs_no_pair_first() -> None:
    # leaf-a's a0 and a1 (4 free each) hold a replica of 4 + 4 between them; leaf-b's b0 (6 free) is alone
    # with half a node or more. A replica that fits one of them goes to b0: a0 and a1 are not listed.
    used = {"a0": 4, "a1": 4, "a2": 8, "a3": 8, "b0": 2, "b1": 8, "b2": 8}
    assert shortlist(FABRIC, used) == ["a0", "a1", "b0", "b3"]
    assert shortlist(FABRIC, used, keep_pairs=True) == ["b0", "b3"]
    # Once b0 is taken, no node costs nothing: the pair is listed again (a replica still gets one node).
    taken = {**used, "b0": 6}
    assert shortlist(FABRIC, taken, keep_pairs=True) == ["b0", "a0", "a1", "b3"]
    # Three roomy nodes in a leaf: one of them can go without costing the pair.
    three = {"a0": 4, "a1": 4, "a2": 4, "a3": 8, "b0": 8, "b1": 8, "b2": 8}
    assert shortlist(FABRIC, three, keep_pairs=True) == ["a0", "a1", "b3"]
    base = hypernode_manifests(FABRIC)
    assert tier0(applied(base, plan_node_tier(base, used, GPUS, keep_pairs=True))) == ["b0.node", "b3.node"]


def test_keeping_pairs_ties_unlist_the_pair_and_a_listed_node_of_a_pair_is_not_kept() -> None:
    # a0, a1: a pair with 4 free; b0 alone in its leaf with 4 free as well: as much room, so the pair goes.
    used = {"a0": 4, "a1": 4, "a2": 8, "a3": 8, "b0": 4, "b1": 8, "b2": 8}
    assert shortlist(FABRIC, used, keep_pairs=True) == ["b0", "b3"]
    # A node listed before (sticky) that now costs a pair is not kept.
    assert shortlist(FABRIC, used, keep_pairs=True, keep={"a0", "b3"}) == ["b0", "b3"]


def test_keeping_pairs_counts_only_nodes_of_the_largest_size() -> None:
    # leaf-a: two 8-GPU nodes with 4 free and a 4-GPU node with 2 free: still a pair of the large nodes.
    mixed = parse_topology(
        "nodeDefaults: {gpus: 8}\nswitches:\n  spine:\n    leaf-a: [a0, a1, {name: a2, gpus: 4}]\n    leaf-b: [b0, b1]\n"
    )
    used = {"a0": 4, "a1": 4, "a2": 2, "b0": 2, "b1": 8}
    assert shortlist(mixed, used, keep_pairs=True) == ["a2", "b0"]
