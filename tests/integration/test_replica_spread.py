"""A service's replicas spread over a tier, each still packed (issue 35, item 1), on the real control plane.

The cluster is the feature request's: 8 nodes x 8 GPUs, leaves s0..s3 (tier 1, two nodes each), spines
s4 (s0, s1) and s5 (s2, s3), s6 on top. Without the spread, Volcano's HyperNode binpack puts the four
replicas of a hard tier-1 1P1D service (1 + 1 GPUs) into one leaf: one leaf switch failing takes all four.

The spread releases pods from stormtopo's gate and deletes unbound ones to hold them again: every test runs
the operator as the chart runs it (its ServiceAccount, RBAC and admission policies, the Deployment's
arguments).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from stormtopo.core.topology.tree import Topology
from stormtopo.core.vocabulary import HIGHEST_TIER, MODE, REPLICA_SPREAD_TIER
from stormtopo.devenv.client import DevCluster
from stormtopo.devenv.workloads import filler_pod, stormservice
from tests.conftest import TEST_PERIODS, stormtopo
from tests.integration.chart import InstalledOperator, running_as_installed


@pytest.fixture(scope="module", autouse=True)
def as_installed(cluster: DevCluster, cluster_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InstalledOperator]:
    with running_as_installed(cluster_dir, tmp_path_factory.mktemp("spread-as-installed")) as installed:
        yield installed


def spread(tier: int) -> dict[str, str]:
    return {MODE: "hard", HIGHEST_TIER: "1", REPLICA_SPREAD_TIER: str(tier)}


def replicas_by_leaf(cluster: DevCluster, topology: Topology, namespace: str, name: str, replicas: int) -> dict[str, str]:
    """Replica -> the leaf holding both its pods, once all `replicas` are bound (each whole in one leaf)."""
    cluster.bound_pods(namespace, f"storm-service-name={name}", 2 * replicas, timeout=180)
    nodes: dict[str, list[str]] = {}
    for pod in cluster.pods(namespace, f"storm-service-name={name}"):
        nodes.setdefault(pod["metadata"]["labels"]["roleset-name"], []).append(pod["spec"]["nodeName"])
    leaves = {replica: topology.lowest_common_switch(on) for replica, on in nodes.items()}
    assert all(leaf is not None and leaf.tier == 1 for leaf in leaves.values()), f"a replica split across leaves: {nodes}"
    return {replica: leaf.name for replica, leaf in leaves.items() if leaf is not None}


def spine_of(topology: Topology, leaf: str) -> str:
    parent = topology.switches[leaf].parent
    assert parent is not None
    return parent


def test_four_replicas_spread_over_tier_one_take_four_leaves_and_a_fifth_lands_with_a_warning(
    cluster: DevCluster, topology: Topology, namespace: str
) -> None:
    name = f"leaves-{namespace}"  # unique: AIBrix v0.7.0 counts same-named StormServices' RoleSets in any namespace
    cluster.create(stormservice(name, namespace, replicas=4, annotations=spread(1)))
    leaves = replicas_by_leaf(cluster, topology, namespace, name, 4)
    assert sorted(leaves.values()) == ["s0", "s1", "s2", "s3"], leaves

    out = stormtopo("explain", f"{namespace}/{name}", "--kubeconfig", str(cluster.kubeconfig)).stdout
    assert "replicas per tier-1 domain (spread over tier 1):" in out
    for replica, leaf in leaves.items():
        assert f"    {leaf}: {replica}" in out, out

    # Every leaf holds a replica: the fifth is placed anyway, and the Warning names the leaf it now shares.
    cluster.patch_stormservice(namespace, name, {"spec": {"replicas": 5}})
    leaves = replicas_by_leaf(cluster, topology, namespace, name, 5)
    shared = [leaf for leaf, count in Counter(leaves.values()).items() if count == 2]
    assert len(shared) == 1 and len(set(leaves.values())) == 4, leaves

    def warning() -> str:
        said = [e["message"] for e in cluster.events(namespace, name) if e["reason"] == "ReplicasShareDomain"]
        return said[0] if said else ""

    message = cluster.wait(warning, 60, "a ReplicasShareDomain Warning on the StormService")
    (fifth,) = [r for r, leaf in leaves.items() if leaf == shared[0] and f"replica {r} placed in" in message]
    (other,) = [r for r, leaf in leaves.items() if leaf == shared[0] and r != fifth]
    assert message.startswith(f"replica {fifth} placed in {shared[0]}, which also holds replica {other}"), message
    (event,) = [e for e in cluster.events(namespace, name) if e["reason"] == "ReplicasShareDomain"]
    assert event["type"] == "Warning"


def test_four_replicas_spread_over_tier_two_go_two_under_each_spine(cluster: DevCluster, topology: Topology, namespace: str) -> None:
    name = f"spines-{namespace}"
    cluster.create(stormservice(name, namespace, replicas=4, annotations=spread(2)))
    leaves = replicas_by_leaf(cluster, topology, namespace, name, 4)  # each replica still within one leaf
    assert sorted(Counter(spine_of(topology, leaf) for leaf in leaves.values()).items()) == [("s4", 2), ("s5", 2)], leaves


def test_a_replica_let_go_where_volcano_cannot_place_it_is_held_again_and_placed_beside_a_sibling(
    cluster: DevCluster, topology: Topology, namespace: str
) -> None:
    """Leaves s2 and s3 full, s1's nodes tainted (free by GPUs, closed to the pods): the first replica lands
    in s0; the second is let go with s0 kept out, where only s1 has GPUs, and Volcano cannot place it.
    Past the give-up (--spread-give-up, as the tests run the operator) its unbound pods are deleted (as
    installed: the policy delete-unbound-only), made again by AIBrix, and let go with nothing kept out: it
    lands in s0 beside the first, with a ReplicaSpreadUnplaced and a ReplicasShareDomain Warning. No bound
    pod was deleted."""
    name = f"held-again-{namespace}"
    for node in ("node4", "node5", "node6", "node7"):
        cluster.create(filler_pod(f"busy-{node}", namespace, node, 8))
    cluster.bound_pods(namespace, "stormtopo.io/filler=true", 4)
    taint = {"key": "example.com/maintenance", "value": "true", "effect": "NoSchedule"}
    for node in ("node2", "node3"):
        cluster.core.patch_node(node, {"spec": {"taints": [taint]}})
    try:
        cluster.create(stormservice(name, namespace, replicas=1, annotations=spread(1)))
        first = replicas_by_leaf(cluster, topology, namespace, name, 1)
        assert list(first.values()) == ["s0"], first
        first_pods = {p["metadata"]["uid"] for p in cluster.pods(namespace, f"storm-service-name={name}")}
        cluster.patch_stormservice(namespace, name, {"spec": {"replicas": 2}})

        def said(reason: str) -> list[str]:
            return [e["message"] for e in cluster.events(namespace, name) if e["reason"] == reason]

        unplaced = cluster.wait(
            lambda: said("ReplicaSpreadUnplaced"), TEST_PERIODS["spread-give-up"] + 90, "a ReplicaSpreadUnplaced Warning"
        )
        assert "spread over tier 1" in unplaced[0] and "made again" in unplaced[0], unplaced
        leaves = replicas_by_leaf(cluster, topology, namespace, name, 2)
        assert sorted(leaves.values()) == ["s0", "s0"], leaves
        cluster.wait(lambda: said("ReplicasShareDomain"), 60, "a ReplicasShareDomain Warning")
        assert len(said("ReplicaSpreadUnplaced")) == 1  # held again once
        assert first_pods <= {p["metadata"]["uid"] for p in cluster.pods(namespace, f"storm-service-name={name}")}
    finally:
        for node in ("node2", "node3"):
            cluster.core.patch_node(node, {"spec": {"taints": None}})
