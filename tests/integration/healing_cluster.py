"""Healing on the real control plane, what its test modules share: the operator as the chart runs it
(a module fixture), the one-leaf replica and its requests, filling and freeing nodes, and reading where
replicas landed and what was said of them."""

from __future__ import annotations

import datetime
import json
import re
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from stormtopo.core.topology.fabric import parse_topology
from stormtopo.core.topology.hypernodes import hypernode_manifests
from stormtopo.core.topology.tree import Topology
from stormtopo.core.vocabulary import HEAL_ANNOTATION, HIGHEST_TIER, MODE
from stormtopo.devenv.client import DevCluster, node_names
from stormtopo.devenv.nodes import node_manifests
from stormtopo.devenv.workloads import Role, filler_pod
from tests.integration.chart import InstalledOperator

HYPERNODES = ("topology.volcano.sh", "v1alpha1", "hypernodes")
INSTALLED: dict[Path, InstalledOperator] = {}  # the operator as installed, per cluster, while a healing module runs


@pytest.fixture(scope="module")
def as_installed(cluster: DevCluster, cluster_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InstalledOperator]:
    """Every test of healing and making room runs the operator as the chart runs it (issue 34, item 1):
    the chart's ServiceAccount, RBAC and admission policies, the Deployment's arguments."""
    installed = InstalledOperator(cluster_dir, tmp_path_factory.mktemp("as-installed"))
    installed.start()
    INSTALLED[cluster_dir] = installed
    try:
        yield installed
    finally:
        INSTALLED.pop(cluster_dir, None)
        installed.stop()


BIG = (Role("prefill", gpus=8), Role("decode", gpus=8))  # one whole leaf
SOFT_LEAF = {MODE: "soft", HIGHEST_TIER: "1"}
HARD_LEAF = {MODE: "hard", HIGHEST_TIER: "1"}
HEAL = {HEAL_ANNOTATION: "true"}
MOVE_WITHIN = 60.0  # the bound, from the leaf freed to the replica bound within one leaf


def fill(cluster: DevCluster, namespace: str, nodes: list[str]) -> None:
    for node in nodes:
        cluster.create(filler_pod(f"busy-{node}", namespace, node, 8))
    cluster.bound_pods(namespace, "stormtopo.io/filler=true", len(nodes))


def free(cluster: DevCluster, namespace: str, node: str) -> None:
    cluster.core.delete_namespaced_pod(f"busy-{node}", namespace, grace_period_seconds=0)

    def gone() -> bool:
        return f"busy-{node}" not in {p["metadata"]["name"] for p in cluster.pods(namespace, "stormtopo.io/filler=true")}

    cluster.wait(gone, 30, f"the filler on {node} gone")


def replicas(cluster: DevCluster, namespace: str, name: str) -> dict[str, list[dict[str, Any]]]:
    """Each replica's live pods."""
    out: dict[str, list[dict[str, Any]]] = {}
    for pod in cluster.pods(namespace, f"storm-service-name={name}"):
        if not pod["metadata"].get("deletionTimestamp"):
            out.setdefault(pod["metadata"]["labels"]["roleset-name"], []).append(pod)
    return out


def in_one_leaf(topology: Topology, pods: list[dict[str, Any]], count: int = 2) -> bool:
    nodes = node_names(p for p in pods if p["spec"].get("nodeName"))
    if len(nodes) < count:
        return False
    switch = topology.lowest_common_switch(nodes)
    return switch is not None and switch.tier == 1


def wide_placement(cluster: DevCluster, topology: Topology, namespace: str, name: str, count: int = 1) -> dict[str, list[str]]:
    """Wait until every replica is bound across leaves (and recorded so); replica -> pod UIDs."""

    def placed() -> dict[str, list[str]]:
        found = replicas(cluster, namespace, name)
        bound = {r: p for r, p in found.items() if len(node_names(x for x in p if x["spec"].get("nodeName"))) == 2}
        if len(bound) < count:
            return {}
        assert not any(in_one_leaf(topology, p) for p in bound.values()), "a leaf had room: the setup is wrong"
        raw = (cluster.stormservice(namespace, name)["metadata"].get("annotations") or {}).get("stormtopo.io/placement")
        if not raw or len(json.loads(raw)) < count:
            return {}
        return {r: sorted(x["metadata"]["uid"] for x in p) for r, p in bound.items()}

    return cluster.wait(placed, 120, f"{count} replica(s) placed across leaves and recorded")


def events(cluster: DevCluster, namespace: str, name: str, reason: str) -> list[str]:
    return [e["message"] for e in cluster.events(namespace, name) if e["reason"] == reason]


def healing_passes(cluster_dir: Path) -> float:
    port = json.loads((cluster_dir / "cluster.json").read_text())["ports"]["operator_metrics"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    found = re.search(r"^stormtopo_healing_passes_total ([0-9.e+]+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def ready_replicas(cluster: DevCluster, namespace: str, name: str) -> list[str]:
    """Replicas with both pods bound and Ready."""

    def ready(pods: list[dict[str, Any]]) -> bool:
        return len(pods) == 2 and all(
            p["spec"].get("nodeName") and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or [])
            for p in pods
        )

    return [r for r, pods in replicas(cluster, namespace, name).items() if ready(pods)]


def parse_time(text: str) -> float:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@contextmanager
def watching_ready_replicas(cluster: DevCluster, namespace: str, name: str) -> Iterator[list[int]]:
    """Counts the service's ready replicas (both pods bound and Ready) in the background, as often as it can."""
    seen: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.append(len(ready_replicas(cluster, namespace, name)))
            stop.wait(0.2)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join()


@contextmanager
def making_room(cluster_dir: Path) -> Iterator[None]:
    """The operator as installed, restarted with the chart's healing.makeRoom (--heal-make-room, off by
    default), then as it was."""
    installed = INSTALLED[cluster_dir]
    installed.start("healing.makeRoom=true")
    try:
        yield
    finally:
        installed.start()


def move_records(stormservice: dict[str, Any]) -> dict[str, Any]:
    """The service's move records (stormtopo.io/moves), by replica."""
    raw = (stormservice["metadata"].get("annotations") or {}).get("stormtopo.io/moves")
    return dict(json.loads(raw)) if raw else {}


# The seed's tree grown for the cap's test: six more leaves of two 8-GPU nodes under two more spines.
GROWN = """
tierNames: {1: leaf, 2: spine, 3: core}
nodeDefaults: {gpus: 8, cpu: "96", memory: 1Ti}
switches:
  s6:
    s4: {s0: [node0, node1], s1: [node2, node3]}
    s5: {s2: [node4, node5], s3: [node6, node7]}
    s7: {t0: [x0, x1], t1: [x2, x3], t2: [x4, x5]}
    s8: {t3: [x6, x7], t4: [x8, x9], t5: [x10, x11]}
"""


@pytest.fixture
def grown(cluster: DevCluster, topology: Topology) -> Iterator[Topology]:
    """The shared cluster's tree with six more leaves (12 more nodes) for one test, then as it was."""
    tree = parse_topology(GROWN)
    before = {h["metadata"]["name"]: h for h in cluster.hypernodes()}
    added = [n for n in node_manifests(tree) if n["metadata"]["name"] not in topology.nodes]
    for node in added:
        cluster.create(node)
    hypernodes = hypernode_manifests(tree)
    for manifest in sorted(hypernodes, key=lambda h: h["spec"]["tier"]):  # a parent never names one not there
        name = manifest["metadata"]["name"]
        if name not in before:
            cluster.custom.create_cluster_custom_object(*HYPERNODES, manifest)
        elif manifest["spec"] != before[name]["spec"]:
            current = cluster.custom.get_cluster_custom_object(*HYPERNODES, name)
            cluster.custom.replace_cluster_custom_object(*HYPERNODES, name, {**current, "spec": manifest["spec"]})

    def ready() -> bool:
        nodes = [cluster.core.read_node(n["metadata"]["name"]) for n in added]
        return all(any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or []) for n in nodes)

    cluster.wait(ready, 120, "the added nodes Ready")
    try:
        yield tree
    finally:
        current = cluster.custom.get_cluster_custom_object(*HYPERNODES, "s6")
        cluster.custom.replace_cluster_custom_object(*HYPERNODES, "s6", {**current, "spec": before["s6"]["spec"]})
        for manifest in sorted(hypernodes, key=lambda h: -h["spec"]["tier"]):
            if manifest["metadata"]["name"] not in before:
                cluster.custom.delete_cluster_custom_object(*HYPERNODES, manifest["metadata"]["name"])
        for node in added:
            cluster.core.delete_node(node["metadata"]["name"])
