"""Lifecycle of a topology-aware StormService on the real control plane (issue 3): annotations changing
on a live service, role replica changes and rolling updates, and the operator going away and back."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

from kubernetes.client.exceptions import ApiException

from stormtopo.core.topology.tree import Topology
from stormtopo.core.vocabulary import HIGHEST_TIER, MODE
from stormtopo.devenv import cluster as dev
from stormtopo.devenv.client import DevCluster, node_names
from stormtopo.devenv.workloads import stormservice
from tests.integration.watching import PodGroupVersions

HARD_LEAF = {MODE: "hard", HIGHEST_TIER: "1"}


def only_group(cluster: DevCluster, namespace: str) -> dict:  # type: ignore[type-arg]
    return cluster.only(lambda: cluster.podgroups(namespace), "PodGroup")


def test_annotations_added_changed_and_removed_on_a_live_service_never_evict(cluster: DevCluster, namespace: str) -> None:
    cluster.create(stormservice("live", namespace))
    before = node_names(cluster.bound_pods(namespace, "storm-service-name=live", 2))
    assert "networkTopology" not in only_group(cluster, namespace)["spec"]

    cluster.patch_stormservice(namespace, "live", {"metadata": {"annotations": HARD_LEAF}})
    cluster.wait(lambda: only_group(cluster, namespace)["spec"].get("networkTopology", {}).get("highestTierAllowed") == 1, 90, "tier 1")
    cluster.patch_stormservice(namespace, "live", {"metadata": {"annotations": {HIGHEST_TIER: "2"}}})
    cluster.wait(lambda: only_group(cluster, namespace)["spec"].get("networkTopology", {}).get("highestTierAllowed") == 2, 90, "tier 2")
    cluster.patch_stormservice(namespace, "live", {"metadata": {"annotations": {MODE: None, HIGHEST_TIER: None}}})
    cluster.wait(lambda: "networkTopology" not in only_group(cluster, namespace)["spec"], 90, "the constraint to be withdrawn")
    assert "stormtopo.io/request" not in (only_group(cluster, namespace)["metadata"].get("annotations") or {})

    after = cluster.pods(namespace, "storm-service-name=live")
    assert node_names(after) == before and all(p["status"]["phase"] == "Running" for p in after)  # nobody was evicted


def test_role_replica_change_rolls_out_replicas_whose_gang_follows(cluster: DevCluster, topology, namespace: str) -> None:  # type: ignore[no-untyped-def]
    cluster.create(stormservice("grow", namespace, annotations=HARD_LEAF))
    cluster.bound_pods(namespace, "storm-service-name=grow", 2)
    template = cluster.stormservice(namespace, "grow")["spec"]["template"]
    template["spec"]["roles"][1]["replicas"] = 2  # decode 1 -> 2
    template["spec"]["schedulingStrategy"]["volcanoSchedulingStrategy"]["minMember"] = 3
    cluster.patch_stormservice(namespace, "grow", {"spec": {"template": template}})

    def settled() -> bool:
        rolesets = cluster.rolesets(namespace, "grow")
        groups = {g["metadata"]["name"]: g for g in cluster.podgroups(namespace)}
        pods = [p for p in cluster.pods(namespace, "storm-service-name=grow") if p["status"].get("phase") == "Running"]
        return (
            len(rolesets) == 1
            and rolesets[0]["metadata"]["name"] in groups
            and groups[rolesets[0]["metadata"]["name"]]["spec"].get("minTaskMember") == {"prefill": 1, "decode": 2}
            and len(pods) == 3
        )

    cluster.wait(settled, 90, "the new replica with 1 prefill + 2 decode and a gang of 3")
    roleset = cluster.only(lambda: cluster.rolesets(namespace, "grow"), "RoleSet")
    group = next(g for g in cluster.podgroups(namespace) if g["metadata"]["name"] == roleset["metadata"]["name"])
    assert group["spec"]["minMember"] == 3 and group["spec"]["networkTopology"]["highestTierAllowed"] == 1
    nodes = node_names(cluster.pods(namespace, f"roleset-name={roleset['metadata']['name']}"))
    domain = topology.lowest_common_switch(nodes)
    assert domain is not None and domain.tier == 1, nodes


def test_operator_down_blocks_only_opted_in_work_and_restart_converges_without_duplicates(
    cluster: DevCluster, cluster_dir: Path, topology: Topology, namespace: str
) -> None:
    """With stormtopo down, a StormService that never opted in works as if stormtopo were not
    installed; an opted-in one waits (its new pods, a new opted-in StormService: created where the API
    server labels it, its pods held), never placed unconstrained; once stormtopo is back every replica
    converges within its tier."""
    cluster.create(stormservice("before", namespace, annotations=HARD_LEAF))
    cluster.bound_pods(namespace, "storm-service-name=before", 2)
    dev.stop_component(cluster_dir, "operator", kill=True)
    try:
        cluster.create(stormservice("plain", namespace))
        cluster.bound_pods(namespace, "storm-service-name=plain", 2, timeout=90)  # as if stormtopo were not installed
        try:
            # Where MutatingAdmissionPolicy is served (as here), the API server labels its role templates itself:
            # created, its pods held like those below. Elsewhere the webhook that labels them is down: refused.
            cluster.create(stormservice("during", namespace, annotations=HARD_LEAF))
            created_during = True
        except ApiException as refused:
            assert "stormservices.stormtopo.io" in str(refused.body)
            created_during = False
        cluster.patch_stormservice(namespace, "before", {"spec": {"replicas": 2}})
        cluster.wait(lambda: len(cluster.rolesets(namespace, "before")) == 2, 60, "AIBrix to create the second RoleSet")
        if created_during:
            cluster.wait(lambda: cluster.rolesets(namespace, "during"), 60, "AIBrix to create the RoleSet of the new service")
        time.sleep(3)  # AIBrix keeps trying; the admission policies refuse the pods stormtopo did not admit
        assert len(cluster.pods(namespace, "storm-service-name=before")) == 2
        assert not cluster.pods(namespace, "storm-service-name=during")
    finally:
        dev.start_operator(cluster_dir)
    if not created_during:
        cluster.create(stormservice("during", namespace, annotations=HARD_LEAF))
    for name, count in (("before", 4), ("during", 2)):
        pods = cluster.bound_pods(namespace, f"storm-service-name={name}", count, timeout=90)
        assert all(p["metadata"]["annotations"]["volcano.sh/task-spec"] for p in pods)
        for replica in {p["metadata"]["labels"]["roleset-name"] for p in pods}:
            nodes = node_names(p for p in pods if p["metadata"]["labels"]["roleset-name"] == replica)
            domain = topology.lowest_common_switch(nodes)
            assert domain is not None and domain.tier == 1, (name, replica, nodes)
    groups = {g["metadata"]["name"]: g for g in cluster.podgroups(namespace) if g["metadata"]["name"].startswith(("before", "during"))}
    assert len(groups) == 3 and all(g["spec"]["networkTopology"] == {"mode": "hard", "highestTierAllowed": 1} for g in groups.values())
    # Restart once more: the new operator finds nothing to write (idempotent).
    dev.stop_component(cluster_dir, "operator", kill=True)
    dev.start_operator(cluster_dir)
    time.sleep(3)
    port = json.loads((cluster_dir / "cluster.json").read_text())["ports"]["operator_metrics"]
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    writes = [line for line in metrics.splitlines() if line.startswith("stormtopo_podgroup_writes_total{")]
    assert all(line.endswith(" 0.0") for line in writes), writes
    again = {g["metadata"]["name"]: g["spec"] for g in cluster.podgroups(namespace) if g["metadata"]["name"] in groups}
    assert again == {name: g["spec"] for name, g in groups.items()}


def test_no_version_of_an_opted_in_podgroup_ever_lacks_its_constraint(cluster: DevCluster, namespace: str) -> None:
    """Every PodGroup version the API server ever stored for an opted-in StormService, from its creation
    through AIBrix's rewrites on scale and rollout, carries networkTopology (a watch sees them all)."""
    with PodGroupVersions(cluster, namespace) as versions:
        cluster.create(stormservice("watched", namespace, annotations=HARD_LEAF))
        cluster.bound_pods(namespace, "storm-service-name=watched", 2)
        cluster.patch_stormservice(namespace, "watched", {"spec": {"replicas": 2}})
        cluster.bound_pods(namespace, "storm-service-name=watched", 4)
        template = cluster.stormservice(namespace, "watched")["spec"]["template"]
        template["spec"]["roles"][0]["template"]["spec"]["containers"][0]["image"] = "vllm/vllm-openai:v0.9.1"  # a rollout
        cluster.patch_stormservice(namespace, "watched", {"spec": {"template": template}})
        time.sleep(5)
    assert len(versions.stored()) >= 4
    assert not versions.without_constraint()
