"""`kubectl stormtopo ...` (issue 22, in part): kubectl finds `kubectl-stormtopo` on PATH and runs it,
with kubectl's habits on the read commands: -n/--namespace, --context, -o json|yaml."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from stormtopo.core.topology.tree import Topology
from stormtopo.core.vocabulary import HIGHEST_TIER, MODE
from stormtopo.devenv import components
from stormtopo.devenv.client import DevCluster
from stormtopo.devenv.workloads import stormservice


def kubectl(cluster: DevCluster, *args: str) -> subprocess.CompletedProcess[str]:
    # kubectl refuses global flags before a plugin's name: the kubeconfig comes from $KUBECONFIG.
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run([str(components.ensure_binary("kubectl")), *args], capture_output=True, text=True, env=env, timeout=120)


def test_kubectl_stormtopo_shows_the_tree_and_explains_with_kubectls_flags(cluster: DevCluster, topology: Topology, namespace: str) -> None:
    listed = kubectl(cluster, "plugin", "list")
    assert "kubectl-stormtopo" in listed.stdout, listed.stdout + listed.stderr
    shown = kubectl(cluster, "stormtopo", "topology", "show", "-o", "json")
    assert shown.returncode == 0, shown.stderr
    assert set(topology.switches) <= {h["name"] for h in json.loads(shown.stdout)["hyperNodes"]}

    name = f"plugin-{namespace}"
    cluster.create(stormservice(name, namespace, annotations={MODE: "hard", HIGHEST_TIER: "1"}))
    cluster.bound_pods(namespace, f"storm-service-name={name}", 2, timeout=120)
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    context = config["current-context"]

    def placed() -> dict:  # type: ignore[type-arg]
        run = kubectl(cluster, "stormtopo", "explain", name, "-n", namespace, "--context", context, "-o", "yaml")
        assert run.returncode == 0, run.stderr
        report = yaml.safe_load(run.stdout)
        return report if report["replicas"] and all("placed" in r for r in report["replicas"]) else {}

    report = cluster.wait(placed, 60, "the replica explained as placed")
    (replica,) = report["replicas"]
    assert report["request"].startswith("hard within tier 1") and replica["placed"]["tier"] in (0, 1)
    unknown = kubectl(cluster, "stormtopo", "explain", name, "-n", namespace, "--context", "nowhere")
    assert unknown.returncode == 1 and "context 'nowhere'" in unknown.stderr and "Traceback" not in unknown.stderr
