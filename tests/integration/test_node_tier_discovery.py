"""The node tier beside Volcano's own HyperNode discovery (issue 33, item 2), on the real control plane:
vc-controller-manager runs the `hyperNode-controller` with label discovery on, the operator run as the
chart runs it with `nodeTier.enabled=true` (its ServiceAccount, RBAC and admission policies, the
Deployment's arguments), and hard StormServices come and go.

How Volcano v1.15.1 discovers (pkg/controllers/hypernode): the hyperNode-controller reads its
configuration from the ConfigMap `volcano-controller-configmap` in `volcano-system` (`$HELM_RELEASE_NAME`
and `$KUBE_POD_NAMESPACE` when set), key `volcano-controller.conf`, `networkTopologyDiscovery`, and
follows it with an informer: creating the ConfigMap after the controller started turns discovery on. Source
`label`: per `networkTopologyTypes` entry, the node labels from the top tier down to
`kubernetes.io/hostname`; a node with the first label below the hostname is a Node member of a tier-1
HyperNode per value (`hypernode-<type>-tier1-<random>`), that one a member of a tier-2 HyperNode per value
of the next label, and so on. Label discovery ignores `interval`: it runs once when it starts, when a node
with one of those labels is added or deleted or those labels change, and when any HyperNode is deleted
(its informer's delete handler). Each run the controller creates or rewrites (spec and status replaced)
the HyperNodes it discovered, labelled `volcano.sh/network-topology-source: label`, and deletes every
HyperNode with that label that this run did not discover.

Here: the seed's tree (s0..s6, node0..node7, made by `dev up`, no source label) beside a discovered tree
of four more nodes (lnode0..lnode3 under two ToR labels and one spine label). The node tier lists only
nodes under the seed's leaves (the discovered leaves are another writer's, not named), and its tier-0
HyperNodes carry stormtopo's two labels only, so each discovery run leaves them alone. A watch records
every HyperNode version throughout.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest
import yaml
from kubernetes import watch
from kubernetes.client.exceptions import ApiException

from stormtopo.core.topology.hypernodes import topology_from_hypernodes
from stormtopo.core.topology.node_tier import NODE_TIER, NODE_TIER_SUFFIX
from stormtopo.core.topology.tree import NodeSpec
from stormtopo.core.vocabulary import HIGHEST_TIER, MANAGED_BY, MODE, NODE_TIER_LABEL, TOPOLOGY_SOURCE_LABEL
from stormtopo.devenv import cluster as devenv
from stormtopo.devenv.client import DevCluster, node_names
from stormtopo.devenv.nodes import node_manifest
from stormtopo.devenv.workloads import Role, filler_pod, stormservice
from tests.conftest import TOPOLOGY_FILE
from tests.integration.chart import InstalledOperator

GROUP, VERSION, PLURAL = "topology.volcano.sh", "v1alpha1", "hypernodes"
ONE_EACH = (Role("prefill", gpus=1), Role("decode", gpus=1))
TWO_EACH = (Role("prefill", gpus=2), Role("decode", gpus=2))
HARD_LEAF = {MODE: "hard", HIGHEST_TIER: "1"}

# Volcano's defaults (pkg/controllers/hypernode/config/loader.go and configmap_handler.go).
VOLCANO_NAMESPACE = "volcano-system"
DISCOVERY_CONFIGMAP = "volcano-controller-configmap"
DISCOVERY_KEY = "volcano-controller.conf"
TYPE = "dc"  # the networkTopologyTypes entry: HyperNodes hypernode-dc-tier<N>-<random>
SPINE, TOR = "example.com/spine", "example.com/tor"
DISCOVERY_CONF = {
    "networkTopologyDiscovery": [
        {
            "source": "label",
            "enabled": True,
            # Top tier first, kubernetes.io/hostname last (the nodes themselves).
            "config": {"networkTopologyTypes": {TYPE: [{"nodeLabel": SPINE}, {"nodeLabel": TOR}, {"nodeLabel": "kubernetes.io/hostname"}]}},
        }
    ]
}
# The discovered nodes: ToR label value -> nodes, all under one spine.
DISCOVERED = {"tor0": ("lnode0", "lnode1"), "tor1": ("lnode2", "lnode3")}
# The node tier's HyperNode writes per placed replica: BENCHMARKS.md ("Not re-measured") recalls about 4;
# docs/node-tier.md says "a few per placement that moves the list". The bound is twice that: here the
# deletions move the list too, and the discovered tree's events make the operator re-plan.
WRITES_PER_REPLICA = 8.0
# klog's structured lines of the hyperNode-controller (hypernode_controller.go, reconcileTopology).
DELETING = re.compile(r'"Deleting HyperNode" name="([^"]+)"')
SYNCED = re.compile(r'"Topology reconciliation completed" source="label"')


@dataclass
class Discovery:
    cluster: DevCluster
    installed: InstalledOperator
    leaves: dict[str, str] = field(default_factory=dict)  # ToR label value -> the discovered leaf's name
    root: str = ""


def log(cluster: DevCluster, name: str) -> str:
    path = cluster.state_dir / "logs" / f"{name}.log"
    return path.read_text(errors="replace") if path.exists() else ""


def exact(member: Mapping[str, Any]) -> str:
    return str(((member.get("selector") or {}).get("exactMatch") or {}).get("name") or "")


def discovered_tree(cluster: DevCluster) -> tuple[dict[str, str], str] | None:
    """The label discovery's tree once it is whole: (ToR value -> leaf name, the spine's name)."""
    mine = [h for h in cluster.hypernodes() if (h["metadata"].get("labels") or {}).get(TOPOLOGY_SOURCE_LABEL) == "label"]
    leaves: dict[str, str] = {}
    for h in mine:
        tor = h["metadata"]["labels"].get(TOR)
        members = h["spec"].get("members") or []
        if int(h["spec"]["tier"]) == 1 and tor in DISCOVERED and {exact(m) for m in members} == set(DISCOVERED[tor]):
            leaves[tor] = h["metadata"]["name"]
    roots = [h for h in mine if int(h["spec"]["tier"]) == 2 and {exact(m) for m in h["spec"].get("members") or []} == set(leaves.values())]
    # One leaf per ToR value: while the race below leaves two (the second about to be deleted), the tree
    # may name the one that goes, for the moment between the two runs.
    per_tor = [h["metadata"]["labels"].get(TOR) for h in mine if int(h["spec"]["tier"]) == 1]
    if any(per_tor.count(tor) != 1 for tor in DISCOVERED):
        return None
    if len(leaves) == len(DISCOVERED) and len(roots) == 1:
        return leaves, roots[0]["metadata"]["name"]
    return None


@pytest.fixture(scope="module")
def discovery(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Discovery]:
    """A cluster of its own: the seed's tree, the hyperNode-controller with label discovery of four more
    nodes, and the operator as installed with `nodeTier.enabled=true`."""
    state: Path = tmp_path_factory.mktemp("node-tier-discovery")
    devenv.up(
        state,
        TOPOLOGY_FILE,
        timeout=300,
        vc_controllers=("queue-controller", "pg-controller", "hyperNode-controller"),
    )
    try:
        cluster = DevCluster(state)
        installed = InstalledOperator(state, tmp_path_factory.mktemp("discovery-as-installed"))
        installed.start("nodeTier.enabled=true")
        for tor, nodes in DISCOVERED.items():
            for node in nodes:
                manifest = node_manifest(NodeSpec(node, tor, 8, "96", "1Ti"))
                manifest["metadata"]["labels"] |= {SPINE: "sp0", TOR: tor}
                cluster.create(manifest)

        def ready() -> bool:
            nodes = [cluster.core.read_node(n) for names in DISCOVERED.values() for n in names]
            return all(any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or []) for n in nodes)

        cluster.wait(ready, 120, "the discovered nodes Ready")
        try:
            cluster.core.create_namespace({"metadata": {"name": VOLCANO_NAMESPACE}})
        except ApiException as exc:
            if exc.status != 409:
                raise
        cluster.core.create_namespaced_config_map(
            VOLCANO_NAMESPACE,
            {"metadata": {"name": DISCOVERY_CONFIGMAP}, "data": {DISCOVERY_KEY: yaml.safe_dump(DISCOVERY_CONF)}},
        )
        # Volcano v1.15.1's first runs can race their own informer: two runs a few ms apart, the second not
        # yet seeing the leaf the first created, create a second leaf for one ToR value (two parents for its
        # nodes) and keep both until the next run. A run follows any HyperNode deletion: nudged until whole.
        nudged = [time.monotonic()]

        def whole() -> tuple[dict[str, str], str] | None:
            tree = discovered_tree(cluster)
            if tree is None and time.monotonic() - nudged[0] > 20:
                trigger_discovery(cluster)
                nudged[0] = time.monotonic()
            return tree

        tree = cluster.wait(whole, 240, "label discovery's HyperNodes, one leaf per ToR value")
        stable_by = time.monotonic() + 120
        while time.monotonic() < stable_by:  # the same tree at two looks 3 s apart: no run racing its informer now
            time.sleep(3)
            again = cluster.wait(whole, 240, "label discovery's HyperNodes, one leaf per ToR value")
            if again == tree:
                break
            tree = again
        assert tree is not None
        yield Discovery(cluster, installed, *tree)
    finally:
        devenv.down(state)


@pytest.fixture
def namespace(discovery: Discovery) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    discovery.cluster.create_namespace(name)
    try:
        yield name
    finally:
        discovery.cluster.delete_namespace(name, wait=180)


class HyperNodeVersions:
    """Every HyperNode version the API server stores, in order (a watch sees them all; it resumes from
    the last version it saw when the server ends it)."""

    def __init__(self, cluster: DevCluster) -> None:
        self.cluster = cluster
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.gaps: list[str] = []  # a watch that had to start over: versions may be missing there
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._record, daemon=True)

    def _record(self) -> None:
        version: str | None = None
        while not self._stop.is_set():
            stream = watch.Watch()
            kwargs: dict[str, Any] = {"timeout_seconds": 20, **({"resource_version": version} if version else {})}
            if version is None and self.events:
                self.events.append(("RESTART", {}))  # listed afresh: every HyperNode ADDED again
            try:
                for event in stream.stream(self.cluster.custom.list_cluster_custom_object, GROUP, VERSION, PLURAL, **kwargs):
                    version = event["object"]["metadata"]["resourceVersion"]
                    self.events.append((event["type"], event["object"]))
                    if self._stop.is_set():
                        stream.stop()
            except ApiException as exc:  # 410 Gone (the version compacted away): list again
                self.gaps.append(f"{exc.status} {exc.reason}")
                version = None if exc.status == 410 else version
                time.sleep(1)
            except Exception as exc:  # the API server slow to answer on a loaded machine: resume
                self.gaps.append(repr(exc))
                time.sleep(1)

    def __enter__(self) -> HyperNodeVersions:
        self._thread.start()
        # The watch's first events are every HyperNode there is (ADDED): it is running once they arrive.
        DevCluster.wait(lambda: self.events, 30, "the HyperNode watch")
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(30)

    def problems(self, discovery: Discovery, named: frozenset[str] = frozenset()) -> list[str]:
        """Replayed in order: a tier-0 HyperNode of the node tier deleted while a HyperNode named it (the
        operator unnames before it deletes: such a delete is someone else's), one with labels other than
        stormtopo's two, a discovered HyperNode (not in `named`) with other members than the discovery
        gives it, and any HyperNode named by two."""
        expected = {name: {*DISCOVERED[tor]} for tor, name in discovery.leaves.items()}
        expected[discovery.root] = set(discovery.leaves.values())
        state: dict[str, dict[str, Any]] = {}
        found: list[str] = []
        seen_twice: list[list[str]] = []  # said once each
        for kind, obj in self.events:
            if kind == "RESTART":
                state.clear()
                continue
            name = obj["metadata"]["name"]
            labels = obj["metadata"].get("labels") or {}
            if kind == "DELETED":
                if labels.get(NODE_TIER_LABEL) == "true":
                    namers = sorted(n for n, h in state.items() if n != name and name in hypernode_members(h))
                    if namers:
                        found.append(f"{name} deleted while {namers} named it")
                state.pop(name, None)
                continue
            state[name] = obj
            members = obj["spec"].get("members") or []
            if labels.get(NODE_TIER_LABEL) == "true" and labels != {**MANAGED_BY, NODE_TIER_LABEL: "true"}:
                found.append(f"tier-0 {name} with labels {labels}")
            if name in expected and name not in named:
                wanted_type = "Node" if name in discovery.leaves.values() else "HyperNode"
                if {exact(m) for m in members} != expected[name] or any(m.get("type") != wanted_type for m in members):
                    found.append(f"discovered {name} rewritten: {[(m.get('type'), exact(m)) for m in members]}")
            twice = [n for n, count in parents(state.values()).items() if count > 1]
            if twice and not any(twice == seen for seen in seen_twice):
                seen_twice.append(twice)
                found.append(f"after {kind} {name}: {twice} named by two HyperNodes")
        return found


def hypernode_members(hn: Mapping[str, Any]) -> set[str]:
    return {exact(m) for m in (hn.get("spec") or {}).get("members") or [] if m.get("type") == "HyperNode"}


def parents(hypernodes: Any) -> Counter[str]:
    return Counter(child for h in hypernodes for child in hypernode_members(h))


def writes(cluster: DevCluster) -> dict[str, float]:
    """stormtopo_node_tier_writes_total per verb, from the operator's /metrics."""
    port = json.loads((cluster.state_dir / "cluster.json").read_text())["ports"]["operator_metrics"]
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("stormtopo_node_tier_writes_total{"):
            verb = re.search(r'verb="([^"]*)"', line)
            out[verb.group(1) if verb else ""] = float(line.rsplit(" ", 1)[1])
    return out


def violations(cluster: DevCluster) -> float:
    port = json.loads((cluster.state_dir / "cluster.json").read_text())["ports"]["operator_metrics"]
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("stormtopo_topology_violations_total "))


def settled_writes(cluster: DevCluster) -> dict[str, float]:
    """The writes once the node tier has stopped writing: the same figures twice, 5 s apart."""
    seen: list[dict[str, float]] = []

    def steady() -> list[dict[str, float]]:
        seen.append(writes(cluster))
        return seen[-1:] if len(seen) > 1 and seen[-2] == seen[-1] else []

    return DevCluster.wait(steady, 180, "the node tier's writes to settle", interval=5)[0]


def trigger_discovery(cluster: DevCluster) -> int:
    """Make label discovery run once more (it runs on every HyperNode deletion); return the runs logged before."""
    before = len(SYNCED.findall(log(cluster, "vc-controller-manager")))
    name = f"sync-trigger-{uuid.uuid4().hex[:6]}"
    # A leaf of a node that does not exist: no node gains a parent, and the node tier lists nothing from it.
    body = {"spec": {"tier": 1, "members": [{"type": "Node", "selector": {"exactMatch": {"name": f"no-such-node-{name}"}}}]}}
    cluster.custom.create_cluster_custom_object(
        GROUP, VERSION, PLURAL, {"apiVersion": f"{GROUP}/{VERSION}", "kind": "HyperNode", "metadata": {"name": name}, **body}
    )
    cluster.custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, name)
    return before


def discovery_runs(cluster: DevCluster) -> int:
    return len(SYNCED.findall(log(cluster, "vc-controller-manager")))


def node_tier_deleted_by_volcano(cluster: DevCluster, since: int) -> list[str]:
    return [n for n in DELETING.findall(log(cluster, "vc-controller-manager")[since:]) if n.endswith(NODE_TIER_SUFFIX)]


def tier0(cluster: DevCluster) -> list[str]:
    return sorted(
        h["metadata"]["name"]
        for h in cluster.hypernodes()
        if int(h["spec"]["tier"]) == NODE_TIER and (h["metadata"].get("labels") or {}).get(NODE_TIER_LABEL) == "true"
    )


def place(cluster: DevCluster, namespace: str, name: str, roles: tuple[Role, ...]) -> list[str]:
    """Create a hard tier-1 StormService of one replica; wait for its pods to bind; the nodes, which one
    leaf holds (the tree read back folds the node tier's HyperNodes into their nodes)."""
    cluster.create(stormservice(name, namespace, roles=roles, annotations=HARD_LEAF))
    nodes = node_names(cluster.bound_pods(namespace, f"storm-service-name={name}", len(roles), timeout=240))
    switch = topology_from_hypernodes(cluster.hypernodes()).lowest_common_switch(nodes)
    assert switch is not None and switch.tier <= 1, (name, nodes, switch)
    return nodes


def remove(cluster: DevCluster, namespace: str, name: str) -> None:
    cluster.delete_stormservice(namespace, name)
    cluster.wait(lambda: not cluster.pods(namespace, f"storm-service-name={name}"), 120, f"{name}'s pods gone")


def topology_violated(cluster: DevCluster, namespace: str) -> list[str]:
    items = cluster.core.list_namespaced_event(namespace, field_selector="reason=TopologyViolated").items
    return [f"{e.involved_object.name}: {e.message}" for e in items]


@pytest.mark.timeout(1800)
def test_discovery_leaves_the_node_tier_alone_and_the_node_tier_leaves_discovered_leaves_alone(
    discovery: Discovery, namespace: str
) -> None:
    """Label discovery and the node tier side by side through a churn of hard services: Volcano deletes no
    tier-0 HyperNode of the node tier (its log, and none deleted while a leaf named it), the discovered
    HyperNodes keep the members the discovery gives them in every version stored, no HyperNode gets a
    second parent, every new hard replica binds within one leaf, no TopologyViolated, and the node tier's
    HyperNode writes per placed replica stay within WRITES_PER_REPLICA."""
    cluster = discovery.cluster
    scheduler_from = len(log(cluster, "vc-scheduler"))
    controller_from = len(log(cluster, "vc-controller-manager"))

    # The control: a HyperNode with the source label that the discovery did not make is deleted at its
    # next run, and the log says so (what a tier-0 HyperNode with a copied label would meet).
    decoy = "decoy-copied-source-label"
    body = {"tier": 1, "members": [{"type": "Node", "selector": {"exactMatch": {"name": "no-such-node"}}}]}
    cluster.custom.create_cluster_custom_object(
        GROUP,
        VERSION,
        PLURAL,
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "HyperNode",
            "metadata": {"name": decoy, "labels": {TOPOLOGY_SOURCE_LABEL: "label"}},
            "spec": body,
        },
    )
    trigger_discovery(cluster)
    cluster.wait(lambda: decoy not in {h["metadata"]["name"] for h in cluster.hypernodes()}, 120, "the discovery to delete the decoy")
    assert decoy in DELETING.findall(log(cluster, "vc-controller-manager")[controller_from:])

    violations_before = violations(cluster)
    with HyperNodeVersions(cluster) as versions:
        writes_before = settled_writes(cluster)
        runs_before = discovery_runs(cluster)
        # The churn: a replica placed each round, one removed every other round; some of 2 + 2 GPUs.
        alive: list[str] = []
        placed: dict[str, list[str]] = {}
        for i in range(8):
            name = f"hard-{i}"
            placed[name] = place(cluster, namespace, name, TWO_EACH if i % 3 == 2 else ONE_EACH)
            alive.append(name)
            if i % 2 == 1:
                remove(cluster, namespace, alive.pop(0))
        cluster.wait(lambda: tier0(cluster), 60, "the node tier's HyperNodes")
        # One discovery run at least while they exist, whatever the churn triggered (each delete does).
        before = trigger_discovery(cluster)
        cluster.wait(lambda: discovery_runs(cluster) > before, 120, "one more discovery run")
        writes_after = settled_writes(cluster)
    runs = discovery_runs(cluster) - runs_before

    spent = {verb: writes_after.get(verb, 0) - writes_before.get(verb, 0) for verb in writes_after}
    per_replica = sum(spent.values()) / len(placed)
    print(
        f"\nnode tier: {sum(spent.values()):.0f} HyperNode writes {spent} for {len(placed)} placed replicas: {per_replica:.2f} per replica"
    )
    print(f"placements: {placed}")
    print(f"label discovery runs during the churn: {runs}; watch restarts: {versions.gaps}")

    assert not node_tier_deleted_by_volcano(cluster, controller_from), "Volcano's discovery deleted a tier-0 HyperNode of the node tier"
    assert not versions.problems(discovery), versions.problems(discovery)
    assert runs >= 1
    assert "already has a parent" not in log(cluster, "vc-scheduler")[scheduler_from:]
    assert not topology_violated(cluster, namespace)
    assert violations(cluster) <= violations_before
    assert per_replica <= WRITES_PER_REPLICA, f"{per_replica:.2f} HyperNode writes per placed replica"
    for name in alive:
        remove(cluster, namespace, name)


@pytest.mark.timeout(900)
def test_a_named_discovered_leaf_its_tier0_hypernodes_outlive_each_discovery_run(discovery: Discovery, namespace: str) -> None:
    """A discovered leaf named (chart value nodeTier.leaves, --node-tier-leaf): the node tier lists a node under it, and the tier-0
    HyperNode it makes (stormtopo's labels only) survives each discovery run, which writes the leaf's own
    members back (docs: "a fight with the discovery"); the node tier names it again, no HyperNode gets a
    second parent, and a new hard replica binds."""
    cluster = discovery.cluster
    leaf = discovery.leaves["tor1"]
    scheduler_from = len(log(cluster, "vc-scheduler"))
    controller_from = len(log(cluster, "vc-controller-manager"))
    discovery.installed.start("nodeTier.enabled=true", f"nodeTier.leaves={{{leaf}}}")  # the chart's way to name it

    def names(node: str) -> bool:
        current = next((h for h in cluster.hypernodes() if h["metadata"]["name"] == leaf), {})
        return node + NODE_TIER_SUFFIX in hypernode_members(current)

    with HyperNodeVersions(cluster) as versions:
        cluster.create(filler_pod("busy-lnode2", namespace, "lnode2", 2))  # partly used: listed
        cluster.bound_pods(namespace, "stormtopo.io/filler=true", 1)
        cluster.wait(lambda: names("lnode2"), 90, f"{leaf} naming lnode2.node")
        before = trigger_discovery(cluster)
        cluster.wait(lambda: discovery_runs(cluster) > before, 120, "one more discovery run")
        cluster.wait(lambda: names("lnode2"), 90, f"{leaf} naming lnode2.node again after the discovery's run")
        place(cluster, namespace, "after", ONE_EACH)
    print(f"\nnode tier writes with {leaf} named: {writes(cluster)}; watch restarts: {versions.gaps}")

    assert not node_tier_deleted_by_volcano(cluster, controller_from), "Volcano's discovery deleted a tier-0 HyperNode of the node tier"
    # The fight: a version of the leaf with its nodes back (the discovery's) after one naming lnode2.node.
    leaf_versions = [hypernode_members(obj) for kind, obj in versions.events if kind == "MODIFIED" and obj["metadata"]["name"] == leaf]
    named_at = next((i for i, members in enumerate(leaf_versions) if "lnode2.node" in members), None)
    written_back = sum(1 for members in leaf_versions[(named_at or 0) + 1 :] if not members)
    print(f"{leaf}: {len(leaf_versions)} versions, written back to its nodes {written_back} times by the discovery")
    assert named_at is not None and written_back >= 1, leaf_versions
    deleted = [obj["metadata"]["name"] for kind, obj in versions.events if kind == "DELETED" and obj["metadata"]["name"] == "lnode2.node"]
    assert not deleted, "lnode2.node deleted while lnode2 was partly used"
    assert not versions.problems(discovery, named=frozenset({leaf})), versions.problems(discovery, named=frozenset({leaf}))
    assert "already has a parent" not in log(cluster, "vc-scheduler")[scheduler_from:]
    assert not topology_violated(cluster, namespace)
