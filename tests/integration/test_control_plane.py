"""The local control plane: real AIBrix, Volcano and kwok doing their jobs (issue 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stormtopo.core.topology.tree import NodeSpec, Topology
from stormtopo.devenv import processes
from stormtopo.devenv.client import DevCluster, node_names
from stormtopo.devenv.nodes import node_manifest
from stormtopo.devenv.workloads import stormservice
from tests.conftest import stormtopo


def test_stormservice_pods_are_created_by_aibrix_bound_by_volcano_and_run_on_kwok(cluster: DevCluster, namespace: str) -> None:
    cluster.create(stormservice("smoke", namespace))

    pods = cluster.bound_pods(namespace, "storm-service-name=smoke", 2, timeout=60)
    roleset = cluster.only(lambda: cluster.rolesets(namespace, "smoke"), "RoleSet")["metadata"]["name"]  # one replica
    assert [g["metadata"]["name"] for g in cluster.podgroups(namespace)] == [roleset]  # ... and its PodGroup
    assert sorted(p["metadata"]["labels"]["role-name"] for p in pods) == ["decode", "prefill"]
    for pod in pods:
        assert pod["spec"]["schedulerName"] == "volcano"
        assert pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == roleset
        ready = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
        assert ready.get("Ready") == "True"  # kwok ran it
    assert all(n.startswith("node") for n in node_names(pods))


def test_every_example_node_and_hypernode_exists(cluster: DevCluster, topology: Topology) -> None:
    nodes = {n.metadata.name: n for n in cluster.core.list_node().items}
    assert set(topology.nodes) <= set(nodes)
    for name in topology.nodes:
        conditions = {c.type: c.status for c in nodes[name].status.conditions}
        assert conditions["Ready"] == "True"
        assert nodes[name].status.allocatable["nvidia.com/gpu"] == "8"
    tiers = {h["metadata"]["name"]: h["spec"]["tier"] for h in cluster.hypernodes()}
    assert tiers == {"s0": 1, "s1": 1, "s2": 1, "s3": 1, "s4": 2, "s5": 2, "s6": 3}


def _listening_ports() -> set[int]:
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


@pytest.mark.timeout(300)
def test_bare_cluster_accepts_api_created_nodes_then_down_leaves_nothing(tmp_path: Path) -> None:
    state = tmp_path / "bare"
    stormtopo("dev", "up", "--state-dir", str(state), "--without-operator")
    try:
        again = stormtopo("dev", "up", "--state-dir", str(state), "--without-operator", check=False)
        assert again.returncode == 1 and "already running" in again.stderr
        assert (state / "bin" / "kubectl").exists()
        bare = DevCluster(state)
        assert bare.core.list_node().items == []
        bare.create(node_manifest(NodeSpec("api-node", "leaf", 4, "16", "64Gi")))
        bare.wait(
            lambda: any(c.type == "Ready" and c.status == "True" for c in (bare.core.read_node("api-node").status.conditions or [])),
            60,
            "kwok to make the API-created node Ready",
        )
        ports = json.loads((state / "cluster.json").read_text())["ports"]
        started = processes.tracked(state)
        names = sorted(p.name for p in processes.tracked(state))
        assert "operator" not in names and len(names) == 7, names  # etcd, apiserver, kcm, 2x Volcano, AIBrix, kwok
    finally:
        stormtopo("dev", "down", "--state-dir", str(state))
    assert not [p.name for p in started if p.alive()]  # (a zombie awaiting its reaper counts as gone)
    used = {v for k, v in ports.items() if not k.startswith("operator")}
    assert not used & _listening_ports()
