"""The node tier on the real control plane (issue 21): the short list of tier-0 HyperNodes that
core/topology/node_tier.py renders, applied by hand, is accepted by Volcano's webhook and controller (a
leaf then names both nodes and tier-0 HyperNodes), and sends a hard tier-1 replica that one node holds to
one node, where the leaf alone splits it; stormtopo reads that tree back as the tree it knows. Then the
operator's --node-tier, on a cluster of its own: it renders the list itself and keeps it current, and a
replaced decode pod returns to its prefill's node.

The feature request's tree: leaves s0..s3 of two 8-GPU nodes each. node0 and node2 have 1 GPU free,
node1 is empty, the rest full: s0 is the only leaf with room for a 1 + 1 GPU replica, and binpack sends
its first pod to node0 and its second to node1. With node1 (the next empty node) at tier 0, Volcano
tries it first and the whole replica fits there.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stormtopo.core.topology.hypernodes import topology_from_hypernodes
from stormtopo.core.topology.node_tier import NODE_TIER, node_tier_manifests, shortlist
from stormtopo.core.topology.tree import Topology
from stormtopo.core.vocabulary import HIGHEST_TIER, MODE, NODE_TIER_LABEL, REPLICA_HIGHEST_TIER, SCOPE
from stormtopo.devenv import cluster as devenv
from stormtopo.devenv.client import DevCluster, node_names
from stormtopo.devenv.workloads import Role, filler_pod, stormservice
from tests.conftest import TOPOLOGY_FILE
from tests.integration.chart import InstalledOperator

GROUP, VERSION, PLURAL = "topology.volcano.sh", "v1alpha1", "hypernodes"
ONE_EACH = (Role("prefill", gpus=1), Role("decode", gpus=1))


def apply(cluster: DevCluster, manifests: list[dict[str, Any]], before: dict[str, dict[str, Any]]) -> None:
    """Create the HyperNodes that are new, replace the ones that changed, delete the ones left out."""
    wanted = {m["metadata"]["name"]: m for m in manifests}
    for name, manifest in wanted.items():  # tier 0 first: a leaf never names a HyperNode that is not there
        if name not in before:
            cluster.custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, manifest)
        elif manifest["spec"] != before[name]["spec"]:
            current = cluster.custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, name)
            cluster.custom.replace_cluster_custom_object(GROUP, VERSION, PLURAL, name, {**current, "spec": manifest["spec"]})
    for name in set(before) - set(wanted):
        cluster.custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, name)


@pytest.fixture
def node_tier(cluster: DevCluster, topology: Topology) -> Iterator[list[str]]:
    """The short list applied to the cluster's HyperNodes for the duration of the test, then taken back."""
    original = {h["metadata"]["name"]: copy.deepcopy(h) for h in cluster.hypernodes()}
    listed: list[str] = []
    try:
        yield listed
    finally:
        now = {h["metadata"]["name"]: h for h in cluster.hypernodes()}
        apply(cluster, [{"metadata": {"name": n}, "spec": h["spec"]} for n, h in original.items()], now)
        cluster.wait(lambda: {h["metadata"]["name"] for h in cluster.hypernodes()} == set(original), 30, "the tree as it was")


def placed(cluster: DevCluster, namespace: str, name: str) -> tuple[list[str], list[Any]]:
    """Where a replica's two pods were bound, and the tiers its placement record gives."""
    pods = cluster.bound_pods(namespace, f"storm-service-name={name}", 2, timeout=90)

    def recorded() -> list[Any]:
        raw = (cluster.stormservice(namespace, name)["metadata"].get("annotations") or {}).get("stormtopo.io/placement")
        return [r.get("tier") for r in json.loads(raw).values()] if raw else []

    return node_names(pods), cluster.wait(recorded, 60, f"the placement record of {name}")


def test_a_short_list_of_tier0_hypernodes_is_accepted_and_puts_a_replica_on_one_node(
    cluster: DevCluster, topology: Topology, namespace: str, node_tier: list[str]
) -> None:
    used = {"node0": 7, "node2": 7, **{n: 8 for n in ("node3", "node4", "node5", "node6", "node7")}}
    for node, gpus in used.items():
        cluster.create(filler_pod(f"busy-{node}", namespace, node, gpus))
    cluster.bound_pods(namespace, "stormtopo.io/filler=true", len(used))
    hard_leaf = {MODE: "hard", HIGHEST_TIER: "1"}

    # The leaf alone: s0 is the only leaf with room; binpack sends the first pod to node0 (1 GPU free).
    split = f"split-{namespace}"
    cluster.create(stormservice(split, namespace, roles=ONE_EACH, annotations=hard_leaf))
    assert placed(cluster, namespace, split) == (["node0", "node1"], [1])
    cluster.delete_stormservice(namespace, split)
    cluster.wait(lambda: not cluster.pods(namespace, f"storm-service-name={split}"), 60, f"{split}'s pods gone")

    node_tier.extend(shortlist(topology, used))
    assert node_tier == ["node2", "node0", "node1"]  # partly used nodes (fullest leaf first), then the next empty one
    before = {h["metadata"]["name"]: h for h in cluster.hypernodes()}
    # Without the node tier's label: the operator (its node tier off) takes a tier-0 HyperNode labelled as its own for
    # one a run with the node tier on left behind, and puts the leaves back, as soon as it notices (a fresh-clone
    # run placed the replica after that). Volcano reads no label; this is Volcano's part alone.
    manifests = node_tier_manifests(list(before.values()), node_tier)
    for manifest in manifests:
        (manifest["metadata"].get("labels") or {}).pop(NODE_TIER_LABEL, None)
    apply(cluster, manifests, before)
    applied = cluster.hypernodes()
    assert sorted(h["metadata"]["name"] for h in applied if int(h["spec"]["tier"]) == NODE_TIER) == sorted(f"{n}.node" for n in node_tier)
    s1 = next(h for h in applied if h["metadata"]["name"] == "s1")
    assert sorted(m["type"] for m in s1["spec"]["members"]) == ["HyperNode", "Node"], s1["spec"]  # a mixed leaf, accepted
    # stormtopo reads the tree back as it was: each tier-0 HyperNode folded into its node.
    back = topology_from_hypernodes(applied)
    assert back.nodes.keys() == topology.nodes.keys() and back.nodes["node1"].switch == "s0"

    # With the node tier: Volcano tries the tier-0 HyperNodes first, and node1 holds the whole replica.
    one = f"one-{namespace}"
    cluster.create(stormservice(one, namespace, roles=ONE_EACH, annotations=hard_leaf))
    # The placement record reads the tree with the node tier folded away: one node is within the leaf, tier 1.
    assert placed(cluster, namespace, one) == (["node1", "node1"], [1])


@pytest.fixture(scope="module")
def operator_node_tier(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    """A cluster of its own (the feature request's tree) whose operator runs as the chart runs it with
    `nodeTier.enabled=true` (its ServiceAccount, RBAC and policies, the Deployment's arguments)."""
    state: Path = tmp_path_factory.mktemp("node-tier")
    devenv.up(state, TOPOLOGY_FILE, timeout=300)
    try:
        InstalledOperator(state, tmp_path_factory.mktemp("node-tier-as-installed")).start("nodeTier.enabled=true")
        yield DevCluster(state)
    finally:
        devenv.down(state)


def listed_by_operator(cluster: DevCluster) -> list[str]:
    """The nodes whose tier-0 HyperNode the operator made and a leaf names (the short list in force)."""
    hypernodes = cluster.hypernodes()
    named = {m["selector"]["exactMatch"]["name"] for h in hypernodes for m in h["spec"]["members"] if m["type"] == "HyperNode"}
    return sorted(
        h["spec"]["members"][0]["selector"]["exactMatch"]["name"]
        for h in hypernodes
        if int(h["spec"]["tier"]) == NODE_TIER and h["metadata"]["labels"].get(NODE_TIER_LABEL) == "true" and h["metadata"]["name"] in named
    )


def test_the_operator_keeps_the_short_list_current_and_a_replica_lands_on_one_node(operator_node_tier: DevCluster) -> None:
    cluster = operator_node_tier
    namespace = f"t-{uuid.uuid4().hex[:8]}"
    cluster.create_namespace(namespace)

    def becomes(nodes: list[str], what: str) -> None:
        last = listed_by_operator(cluster)
        cluster.wait(lambda: listed_by_operator(cluster) == nodes, 45, f"{what}: the node tier {nodes} (before: {last})")

    # The fragmented start of the first test: the operator lists node0 and node2 (1 GPU free each) and
    # node1, the next empty node. Without the node tier the replica splits over node0 and node1 (above).
    used = {"node0": 7, "node2": 7, **{n: 8 for n in ("node3", "node4", "node5", "node6", "node7")}}
    for node, gpus in used.items():
        cluster.create(filler_pod(f"busy-{node}", namespace, node, gpus))
    cluster.bound_pods(namespace, "stormtopo.io/filler=true", len(used))
    becomes(["node0", "node1", "node2"], "partly used nodes and the next empty one")

    one = f"one-{namespace}"
    cluster.create(stormservice(one, namespace, roles=ONE_EACH, annotations={MODE: "hard", HIGHEST_TIER: "1"}))
    assert placed(cluster, namespace, one) == (["node1", "node1"], [1])
    # The tree stormtopo reads back is the one it was given: every tier-0 HyperNode folded into its node.
    back = topology_from_hypernodes(cluster.hypernodes())
    assert {n: s.switch for n, s in back.nodes.items()} == {f"node{i}": f"s{i // 2}" for i in range(8)}

    # A replaced decode returns to its prefill's node: node1, partly used, keeps its tier-0 HyperNode,
    # which Volcano takes as the gang's allocated HyperNode (the leaf alone sent it to an empty node).
    (decode,) = [p for p in cluster.pods(namespace, f"storm-service-name={one}") if p["metadata"]["labels"].get("role-name") == "decode"]
    cluster.core.delete_namespaced_pod(decode["metadata"]["name"], namespace, grace_period_seconds=0)

    def replaced() -> list[dict[str, Any]]:
        pods = cluster.pods(namespace, f"storm-service-name={one}")
        bound = [p for p in pods if p["spec"].get("nodeName")]
        return pods if len(bound) == 2 and decode["metadata"]["uid"] not in {p["metadata"]["uid"] for p in pods} else []

    pods = cluster.wait(replaced, 90, "the decode re-created and bound")
    assert node_names(pods) == ["node1", "node1"], node_names(pods)

    # A filler deleted: node3 is empty, s0 (9 GPUs used) now fuller than s1 (7), and node3 the next empty node.
    cluster.core.delete_namespaced_pod("busy-node3", namespace, grace_period_seconds=0)
    becomes(["node0", "node1", "node2", "node3"], "the list after a filler's deletion")
    # The replica gone: node1 empty again and the next empty node; node3's tier-0 HyperNode is deleted.
    cluster.delete_stormservice(namespace, one)
    cluster.wait(lambda: not cluster.pods(namespace, f"storm-service-name={one}"), 60, f"{one}'s pods gone")
    becomes(["node0", "node1", "node2"], "the list after the replica's deletion")
    # Deleted after its leaf stops naming it (the same pass, last): waited for, not read at once.
    cluster.wait(lambda: not [h for h in cluster.hypernodes() if h["metadata"]["name"] == "node3.node"], 45, "node3.node deleted")


def test_nested_placement_keeps_its_meaning_beside_the_node_tier(operator_node_tier: DevCluster, topology: Topology) -> None:
    """Scope StormService within tier 2, each replica within tier 1 (PodGroup subGroupPolicy), on the
    cluster whose operator keeps the node tier: tier 1 is still the leaf, and the service stays within
    a tier-2 switch, each replica within one leaf."""
    cluster = operator_node_tier
    namespace = f"t-{uuid.uuid4().hex[:8]}"
    cluster.create_namespace(namespace)
    name = f"nested-{namespace}"
    annotations = {MODE: "hard", HIGHEST_TIER: "2", SCOPE: "StormService", REPLICA_HIGHEST_TIER: "1"}
    cluster.create(stormservice(name, namespace, roles=ONE_EACH, replicas=2, annotations=annotations))
    pods = cluster.bound_pods(namespace, f"storm-service-name={name}", 4, timeout=90)
    service_domain = topology.lowest_common_switch(node_names(pods))
    assert service_domain is not None and service_domain.tier <= 2, node_names(pods)
    by_replica: dict[str, list[str]] = {}
    for pod in pods:
        by_replica.setdefault(pod["metadata"]["labels"]["roleset-name"], []).append(pod["spec"]["nodeName"])
    assert len(by_replica) == 2
    for nodes in by_replica.values():
        leaf = topology.lowest_common_switch(nodes)
        assert leaf is not None and leaf.tier == 1, by_replica  # (one node: its leaf)

    def recorded() -> list[Any]:
        raw = (cluster.stormservice(namespace, name)["metadata"].get("annotations") or {}).get("stormtopo.io/placement")
        table = json.loads(raw) if raw else {}
        return [r.get("tier") for r in table.values()] if len(table) == 2 else []

    assert cluster.wait(recorded, 60, f"the placement record of {name}") == [1, 1]  # the node tier folded away
