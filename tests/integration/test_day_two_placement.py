"""Day two on the real control plane (issue 20, items 3 and 4): a typo strands no pod, and a running
service that opts in keeps its router within the domain of its replica's other pods."""

from __future__ import annotations

from typing import Any

import pytest

from stormtopo.core.topology.tree import Topology
from stormtopo.core.vocabulary import HIGHEST_TIER, MODE, SCOPE
from stormtopo.devenv.client import DevCluster, node_names
from stormtopo.devenv.workloads import Role, stormservice
from tests.conftest import stormtopo


@pytest.mark.parametrize(
    ("annotations", "strategy"),
    [
        ({MODE: "hard"}, False),  # no tier, and no AIBrix PodGroup: the pods named one nobody creates
        ({MODE: "hard", HIGHEST_TIER: "9", SCOPE: "StormService"}, True),  # AIBrix's gang; the service's PodGroup never came
    ],
)
def test_an_invalid_request_still_gets_its_pods_bound_with_the_warning(
    cluster: DevCluster, namespace: str, annotations: dict[str, str], strategy: bool
) -> None:
    name = f"typo-{namespace}"  # AIBrix v0.7.0 counts same-named RoleSets across namespaces
    cluster.create(stormservice(name, namespace, annotations=annotations, volcano_strategy=strategy))

    def warning() -> str:
        found = [e["message"] for e in cluster.events(namespace, name) if e["reason"] == "InvalidTopologyRequest"]
        return found[0] if found else ""

    assert "nothing changed" in cluster.wait(warning, 90, "the InvalidTopologyRequest Warning")
    pods = cluster.bound_pods(namespace, f"storm-service-name={name}", 2, timeout=120)
    assert all("stormtopo.io/admitted" in p["metadata"]["labels"] for p in pods)  # the outage policy lets them through


def test_a_running_service_that_opts_in_keeps_its_replaced_router_within_its_replicas_domain(
    cluster: DevCluster, topology: Topology, namespace: str
) -> None:
    name = f"live-{namespace}"
    roles = (Role("prefill", gpus=2), Role("decode", gpus=2), Role("router", requests=False))
    cluster.create(stormservice(name, namespace, roles=roles))  # not opted in: nothing of stormtopo's
    pods = cluster.bound_pods(namespace, f"storm-service-name={name}", 3, timeout=120)
    anchors = [p for p in pods if p["metadata"]["labels"]["role-name"] != "router"]
    assert not any("stormtopo.io/admitted" in p["metadata"]["labels"] for p in pods)
    cluster.patch_stormservice(namespace, name, {"metadata": {"annotations": {MODE: "hard", HIGHEST_TIER: "1"}}})

    def accepted() -> bool:
        return any(e["reason"] == "TopologyRequest" for e in cluster.events(namespace, name))

    cluster.wait(accepted, 90, "the request accepted")
    (router,) = [p for p in pods if p["metadata"]["labels"]["role-name"] == "router"]
    cluster.core.delete_namespaced_pod(router["metadata"]["name"], namespace, grace_period_seconds=0)

    def replaced() -> list[dict[str, Any]]:
        now = cluster.pods(namespace, f"storm-service-name={name},role-name=router")
        return [p for p in now if p["metadata"]["uid"] != router["metadata"]["uid"] and p["spec"].get("nodeName")]

    (new,) = cluster.wait(replaced, 120, "the replacement router bound (it is held at stormtopo's gate first)")
    domain = topology.lowest_common_switch(node_names(anchors))
    assert domain is not None
    assert new["spec"]["nodeName"] in topology.nodes_under(domain.name), (new["spec"]["nodeName"], domain.name)
    assert new["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]


def test_release_held_frees_pods_held_at_stormtopos_gate_after_an_uninstall(cluster: DevCluster, namespace: str) -> None:
    # What helm uninstall leaves behind: a pod stormtopo admitted and holds at its gate, with nobody to release it.
    held = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "orphan-router", "namespace": namespace, "labels": {"stormtopo.io/admitted": "true"}},
        "spec": {
            "schedulingGates": [{"name": "stormtopo.io/domain"}],
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
        },
    }
    cluster.create(held)
    dry = stormtopo("release-held", "--namespace", namespace, "--dry-run", "--kubeconfig", str(cluster.kubeconfig))
    assert f"would release {namespace}/orphan-router" in dry.stdout
    assert cluster.core.read_namespaced_pod("orphan-router", namespace).spec.scheduling_gates
    done = stormtopo("release-held", "--namespace", namespace, "--kubeconfig", str(cluster.kubeconfig))
    assert f"released {namespace}/orphan-router" in done.stdout
    (pod,) = cluster.bound_pods(namespace, "stormtopo.io/admitted=true", 1, timeout=60)
    assert not pod["spec"].get("schedulingGates")
