"""The local control plane: real AIBrix, Volcano and kwok doing their jobs (issue 2)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from stormtopo.core.topology.tree import NodeSpec, Topology
from stormtopo.devenv import processes
from stormtopo.devenv.client import DevCluster, node_names
from stormtopo.devenv.nodes import node_manifest
from stormtopo.devenv.workloads import IMAGE, stormservice
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


def test_a_pod_that_names_no_scheduler_is_bound_to_a_kwok_node_by_kube_scheduler(
    cluster: DevCluster, namespace: str, topology: Topology
) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "plain", "namespace": namespace},
        "spec": {"containers": [{"name": "app", "image": IMAGE, "resources": {"requests": {"cpu": "100m"}}}]},
    }
    created = cluster.create(pod)
    assert created["spec"]["schedulerName"] == "default-scheduler"  # defaulted: the pod never asked for Volcano

    [bound] = cluster.bound_pods(namespace, "", 1, timeout=60)
    assert bound["spec"]["nodeName"] in topology.nodes  # a kwok node, and kwok ran the pod
    scheduled = [e for e in cluster.events(namespace, "plain") if e["reason"] == "Scheduled"]
    assert scheduled, "no Scheduled event"
    assert {e.get("reportingComponent") or e["source"].get("component") for e in scheduled} == {"default-scheduler"}


def test_owner_references_permission_enforcement_refuses_block_owner_deletion_without_finalizers_permission(
    cluster: DevCluster, namespace: str
) -> None:
    owner = _kubectl(cluster, "create", "configmap", "owner", "-n", namespace, "-o", "json")
    # A user who may create ConfigMaps, but not update the owner's finalizers subresource.
    role: dict[str, Any] = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "creator", "namespace": namespace},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "create"]}],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "creator", "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "creator"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "limited"}],
    }
    _kubectl(cluster, "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": [role, binding]}))

    def child(name: str, block: bool) -> subprocess.CompletedProcess[str]:
        uid = json.loads(owner)["metadata"]["uid"]
        ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid, "blockOwnerDeletion": block}
        obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace, "ownerReferences": [ref]}}
        return _run_kubectl(cluster, "create", "--as=limited", "-f", "-", stdin=json.dumps(obj))

    # RBAC takes effect through the authorizer's cache: wait until the plain owner reference is allowed.
    cluster.wait(lambda: child("plain", block=False).returncode == 0, 30, "user limited to be allowed to create ConfigMaps")
    refused = child("blocking", block=True)
    assert refused.returncode != 0
    assert "cannot set blockOwnerDeletion" in refused.stderr and "finalizers" in refused.stderr, refused.stderr

    role["rules"].append({"apiGroups": [""], "resources": ["configmaps/finalizers"], "verbs": ["update"]})
    _kubectl(cluster, "apply", "-f", "-", stdin=json.dumps(role))
    cluster.wait(lambda: child("blocking", block=True).returncode == 0, 30, "blockOwnerDeletion to be allowed with finalizers")


def _run_kubectl(cluster: DevCluster, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(cluster.state_dir / "bin" / "kubectl"), *args], input=stdin, capture_output=True, text=True)


def _kubectl(cluster: DevCluster, *args: str, stdin: str | None = None) -> str:
    proc = _run_kubectl(cluster, *args, stdin=stdin)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


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
        # etcd, apiserver, kcm, kube-scheduler, 2x Volcano, AIBrix, kwok
        assert "operator" not in names and "kube-scheduler" in names and len(names) == 8, names
    finally:
        stormtopo("dev", "down", "--state-dir", str(state))
    assert not [p.name for p in started if p.alive()]  # (a zombie awaiting its reaper counts as gone)
    used = {v for k, v in ports.items() if not k.startswith("operator")}
    assert not used & _listening_ports()
