"""`stormtopo doctor` (issue 45) on the local control plane: no error on the healthy dev cluster, then one
problem per check, each an error line and exit 1, and the cluster put back after each."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import yaml

from stormtopo.core.topology.tree import Topology
from stormtopo.core.vocabulary import HIGHEST_TIER, MODE, REQUEST_ANNOTATION, VOLCANO_SCHEDULING, VOLCANO_TOPOLOGY
from stormtopo.devenv import cluster as dev
from stormtopo.devenv import components
from stormtopo.devenv.client import DevCluster
from stormtopo.devenv.workloads import stormservice
from stormtopo.kube.errors import ApiError
from tests.conftest import stormtopo

HARD_LEAF = {MODE: "hard", HIGHEST_TIER: "1"}


def doctor(cluster_dir: Path, *args: str) -> tuple[int, list[dict[str, Any]]]:
    """Exit code and findings of `python -m stormtopo.cli doctor -o json`."""
    proc = stormtopo("doctor", "--kubeconfig", str(cluster_dir / "kubeconfig"), "-o", "json", *args, check=False)
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    return proc.returncode, json.loads(proc.stdout)["checks"]


def errors(findings: list[dict[str, Any]], check: str) -> list[str]:
    return [f"{f['found']} -- {f['todo']}" for f in findings if f["check"] == check and f["level"] == "error"]


def placed(cluster: DevCluster, namespace: str) -> str:
    """An opted-in StormService with its one replica bound; its name."""
    name = f"doctor-{namespace}"
    cluster.create(stormservice(name, namespace, annotations=HARD_LEAF))
    cluster.bound_pods(namespace, f"storm-service-name={name}", 2, timeout=120)
    return name


def test_the_healthy_dev_cluster_has_no_error(cluster: DevCluster, cluster_dir: Path, namespace: str) -> None:
    placed(cluster, namespace)
    text = stormtopo("doctor", "--kubeconfig", str(cluster_dir / "kubeconfig"), check=False)
    assert text.returncode == 0, text.stdout + text.stderr
    *lines, summary = text.stdout.splitlines()
    assert lines and all(line.split()[0] in ("ok", "warning") for line in lines), text.stdout
    assert summary.startswith("0 error(s)")
    # No ConfigMap here: vc-scheduler reads the file `dev up` wrote, and the doctor asks for it.
    assert any(line.startswith("warning scheduler-config") and "--scheduler-config FILE" in line for line in lines), text.stdout

    conf = cluster_dir / "volcano-scheduler.conf"
    code, findings = doctor(cluster_dir, "--scheduler-config", str(conf))
    assert code == 0 and all(f["level"] in ("ok", "warning") for f in findings), findings
    (scheduler,) = [f for f in findings if f["check"] == "scheduler-config" and f["found"].startswith(f"file {conf}")]
    assert "network-topology-aware" in scheduler["found"] and scheduler["level"] in ("ok", "warning")
    (podgroups,) = [f for f in findings if f["check"] == "podgroups"]
    assert podgroups["level"] == "ok" and "checked" in podgroups["found"], podgroups

    # kubectl's plugin runs the same parser (the kubeconfig from $KUBECONFIG).
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    run = [str(components.ensure_binary("kubectl")), "stormtopo", "doctor", "-o", "json"]
    plugin = subprocess.run(run, capture_output=True, text=True, env=env, timeout=120)
    assert plugin.returncode == 0, plugin.stdout + plugin.stderr
    assert {f["check"] for f in json.loads(plugin.stdout)["checks"]} == {f["check"] for f in findings}


def test_a_node_with_a_second_parent_is_an_error(cluster: DevCluster, cluster_dir: Path, topology: Topology) -> None:
    node = sorted(topology.nodes)[0]
    name = f"doctor-{uuid.uuid4().hex[:6]}"
    extra = {
        "apiVersion": "/".join(VOLCANO_TOPOLOGY),
        "kind": "HyperNode",
        "metadata": {"name": name},
        "spec": {"tier": 1, "members": [{"type": "Node", "selector": {"exactMatch": {"name": node}}}]},
    }
    cluster.create(extra)
    try:
        code, findings = doctor(cluster_dir)
    finally:
        cluster.custom.delete_cluster_custom_object(*VOLCANO_TOPOLOGY, "hypernodes", name)
    assert code == 1
    (error,) = errors(findings, "hypernodes")
    assert (
        f"node {node} (in " in error
        and name in error
        and topology.nodes[node].switch in error
        and "two parents" in error
        and "remove it from all but one" in error
    )


def test_a_scheduler_config_without_network_topology_aware_is_an_error(cluster_dir: Path, tmp_path: Path) -> None:
    conf = yaml.safe_load(dev.SCHEDULER_CONF)
    for tier in conf["tiers"]:
        tier["plugins"] = [p for p in tier["plugins"] if p["name"] != "network-topology-aware"]
    path = tmp_path / "volcano-scheduler.conf"
    path.write_text(yaml.safe_dump(conf))
    code, findings = doctor(cluster_dir, "--scheduler-config", str(path))
    assert code == 1
    (error,) = errors(findings, "scheduler-config")
    assert f"file {path}" in error and "network-topology-aware plugin is not enabled" in error and "add `- name:" in error
    missing = stormtopo(
        "doctor", "--kubeconfig", str(cluster_dir / "kubeconfig"), "--scheduler-config", str(tmp_path / "none"), check=False
    )
    assert missing.returncode == 2 and "--scheduler-config" in missing.stderr


def test_an_opted_in_podgroup_without_its_constraint_is_an_error(cluster: DevCluster, cluster_dir: Path, namespace: str) -> None:
    """With the operator stopped (its webhooks fail open; the admission policy only keeps a PodGroup that still
    carries stormtopo's request annotation), the annotation and then networkTopology are taken off a replica's
    PodGroup; the operator, started again, puts both back."""
    name = placed(cluster, namespace)
    roleset = cluster.only(lambda: cluster.rolesets(namespace, name), f"RoleSet of {name}")
    group = roleset["metadata"]["name"]
    dev.stop_component(cluster_dir, "operator", kill=True)
    try:
        annotation = "/metadata/annotations/" + REQUEST_ANNOTATION.replace("~", "~0").replace("/", "~1")
        cluster.api.patch_podgroup(namespace, group, [{"op": "remove", "path": annotation}])

        def stripped() -> bool:
            spec = cluster.api.get(VOLCANO_SCHEDULING, "podgroups", namespace, group) or {}
            if "networkTopology" not in (spec.get("spec") or {}):
                return True
            try:  # AIBrix may rewrite the spec in between: then read again
                cluster.api.patch_podgroup(namespace, group, [{"op": "remove", "path": "/spec/networkTopology"}])
            except ApiError:
                return False
            return False

        cluster.wait(stripped, 30, f"PodGroup {group} without networkTopology")
        code, findings = doctor(cluster_dir)
    finally:
        dev.start_operator(cluster_dir)
    assert code == 1
    (error,) = errors(findings, "podgroups")
    assert f"StormService {namespace}/{name}: PodGroup {group} has no networkTopology" in error and "stormtopo explain" in error

    def restored() -> bool:
        podgroup = cluster.api.get(VOLCANO_SCHEDULING, "podgroups", namespace, group) or {}
        return (podgroup.get("spec") or {}).get("networkTopology") == {"mode": "hard", "highestTierAllowed": 1}

    cluster.wait(restored, 60, f"the operator to give PodGroup {group} its networkTopology back")
