"""A StormService's topology request reaches Volcano and holds (issue 3), on the real control plane.

The cluster is the feature request's: 8 nodes x 8 GPUs, leaves s0..s3 (tier 1), s4/s5 (tier 2), s6.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from stormtopo.core.topology.tree import Topology
from stormtopo.core.vocabulary import HIGHEST_TIER, HIGHEST_TIER_NAME, MODE, REPLICA_HIGHEST_TIER, SCOPE
from stormtopo.devenv.client import DevCluster, node_names
from stormtopo.devenv.workloads import Role, filler_pod, stormservice

HARD_LEAF = {MODE: "hard", HIGHEST_TIER: "1"}
BIG_PD = (Role("prefill", gpus=6), Role("decode", gpus=6))  # two pods that cannot share a node


def fill(cluster: DevCluster, namespace: str, used: dict[str, int]) -> None:
    for node, gpus in used.items():
        cluster.create(filler_pod(f"busy-{node}", namespace, node, gpus))
    cluster.bound_pods(namespace, "stormtopo.io/filler=true", len(used))


def placement(cluster: DevCluster, topology: Topology, namespace: str, name: str, pods: int) -> tuple[list[str], Any]:
    bound = cluster.bound_pods(namespace, f"storm-service-name={name}", pods, timeout=60)
    nodes = node_names(bound)
    return nodes, topology.lowest_common_switch(nodes)


def replicas_placement(cluster: DevCluster, topology: Topology, namespace: str, name: str) -> dict[str, Any]:
    by_replica: dict[str, list[str]] = {}
    for pod in cluster.pods(namespace, f"storm-service-name={name}"):
        by_replica.setdefault(pod["metadata"]["labels"]["roleset-name"], []).append(pod["spec"]["nodeName"])
    return {rs: topology.lowest_common_switch(nodes) for rs, nodes in by_replica.items()}


def placement_table(cluster: DevCluster, namespace: str, name: str, replicas: int) -> dict[str, str]:
    """The StormService's placement annotation, once it has `replicas` records: replica -> HyperNode."""

    def table() -> dict[str, str]:
        raw = (cluster.stormservice(namespace, name)["metadata"].get("annotations") or {}).get("stormtopo.io/placement")
        records = json.loads(raw) if raw else {}
        return {replica: record["hyperNode"] for replica, record in records.items()} if len(records) == replicas else {}

    return cluster.wait(table, 90, f"{replicas} records in the placement annotation")


def test_user_scenario_hard_tier1_keeps_prefill_and_decode_under_one_leaf(
    cluster: DevCluster, topology: Topology, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Free GPUs: node0 1, node2 1, node5 2; everything else is busy. A topology-unaware placement packs
    # onto the fullest nodes (node0 + node2, across s4); only s2 (node5) holds the whole pair.
    fill(cluster, namespace, {"node0": 7, "node1": 8, "node2": 7, "node3": 8, "node4": 8, "node5": 6, "node6": 8, "node7": 8})

    cluster.create(stormservice("pd-hard", namespace, annotations=HARD_LEAF))
    nodes, domain = placement(cluster, topology, namespace, "pd-hard", 2)
    assert domain is not None and domain.tier == 1, f"hard/tier 1 split prefill and decode: {nodes}"
    group = cluster.podgroups(namespace)[0]
    assert group["spec"]["networkTopology"] == {"mode": "hard", "highestTierAllowed": 1}
    assert group["spec"]["minTaskMember"] == {"prefill": 1, "decode": 1}

    cluster.create(stormservice("pd-plain", namespace))
    plain_nodes, plain_domain = placement(cluster, topology, namespace, "pd-plain", 2)
    with capsys.disabled():
        print(f"\n  with hard/tier 1: {nodes} under {domain.name} (tier {domain.tier})")
        print(f"  without annotations: {plain_nodes} under {plain_domain.name} (tier {plain_domain.tier})")  # type: ignore[union-attr]
    assert plain_domain is not None and plain_domain.tier > 1  # the contrast: it had to cross the spine


def test_without_scheduling_strategy_the_operator_owns_the_podgroup(cluster: DevCluster, topology: Topology, namespace: str) -> None:
    cluster.create(stormservice("pd-own", namespace, roles=BIG_PD, annotations=HARD_LEAF, volcano_strategy=False))
    nodes, domain = placement(cluster, topology, namespace, "pd-own", 2)
    assert domain is not None and domain.tier == 1, nodes
    group = cluster.only(lambda: cluster.podgroups(namespace), "PodGroup")
    roleset = cluster.only(lambda: cluster.rolesets(namespace, "pd-own"), "RoleSet")
    assert group["metadata"]["ownerReferences"][0]["uid"] == roleset["metadata"]["uid"]
    assert group["spec"]["minMember"] == 2 and group["spec"]["networkTopology"]["highestTierAllowed"] == 1
    for pod in cluster.pods(namespace, "storm-service-name=pd-own"):
        annotations = pod["metadata"]["annotations"]
        assert annotations["scheduling.k8s.io/group-name"] == roleset["metadata"]["name"]
        assert annotations["volcano.sh/task-spec"] == pod["metadata"]["labels"]["role-name"]


def test_three_replicas_each_in_one_leaf_then_scale_to_four_then_delete(cluster: DevCluster, topology: Topology, namespace: str) -> None:
    cluster.create(stormservice("pd3", namespace, roles=BIG_PD, replicas=3, annotations=HARD_LEAF))
    cluster.bound_pods(namespace, "storm-service-name=pd3", 6, timeout=90)
    domains = replicas_placement(cluster, topology, namespace, "pd3")
    assert len(domains) == 3 and all(d is not None and d.tier == 1 for d in domains.values()), domains
    # Replicas placed at the same moment each keep their record: no write overwrites another's.
    assert placement_table(cluster, namespace, "pd3", 3) == {r: d.name for r, d in domains.items() if d is not None}

    cluster.patch_stormservice(namespace, "pd3", {"spec": {"replicas": 4}})
    cluster.bound_pods(namespace, "storm-service-name=pd3", 8, timeout=90)
    domains = replicas_placement(cluster, topology, namespace, "pd3")
    assert len(domains) == 4 and all(d is not None and d.tier == 1 for d in domains.values()), domains
    assert len({d.name for d in domains.values()}) == 4  # 6+6 GPUs per replica: one replica per leaf
    assert placement_table(cluster, namespace, "pd3", 4) == {r: d.name for r, d in domains.items() if d is not None}

    cluster.delete_stormservice(namespace, "pd3")
    cluster.wait(lambda: not cluster.podgroups(namespace), 60, "every PodGroup to be deleted with the StormService")


@pytest.mark.parametrize(
    ("annotations", "bad_key"),
    [
        ({MODE: "strict", HIGHEST_TIER: "1"}, MODE),
        ({MODE: "hard", HIGHEST_TIER: "0"}, HIGHEST_TIER),
        ({MODE: "hard", HIGHEST_TIER: "-1"}, HIGHEST_TIER),
        ({MODE: "hard", HIGHEST_TIER: "abc"}, HIGHEST_TIER),
        ({MODE: "hard", HIGHEST_TIER: "4"}, HIGHEST_TIER),  # deeper than any HyperNode
        ({MODE: "hard", HIGHEST_TIER_NAME: "rack"}, HIGHEST_TIER_NAME),
        ({MODE: "hard", HIGHEST_TIER: "1", HIGHEST_TIER_NAME: "leaf"}, HIGHEST_TIER_NAME),
        ({MODE: "hard", HIGHEST_TIER: "1", SCOPE: "Zone"}, SCOPE),
    ],
)
def test_bad_annotations_get_a_warning_event_and_change_nothing(
    cluster: DevCluster, namespace: str, annotations: dict[str, str], bad_key: str
) -> None:
    # Names unique to the case: AIBrix v0.7.0 counts the RoleSets of a same-named StormService in any
    # namespace (its list has no namespace filter). The last case's RoleSet, still terminating once its
    # pods were gone, left this one none, and AIBrix never looked again (a loaded machine: "createBudget 0").
    bad, good = f"bad-{namespace}", f"good-{namespace}"
    cluster.create(stormservice(bad, namespace, annotations=annotations))

    def warning() -> str:
        messages = [e["message"] for e in cluster.events(namespace, bad) if e["reason"] == "InvalidTopologyRequest"]
        return messages[0] if messages else ""

    message = cluster.wait(warning, 90, "a Warning Event on the StormService")
    assert bad_key in message and "accepted" in message
    assert "nothing changed" in message
    groups = cluster.wait(lambda: cluster.podgroups(namespace), 90, "AIBrix's own PodGroup")
    for group in groups:  # (AIBrix may briefly have made a replica twice)
        assert "networkTopology" not in group["spec"] and group["spec"]["minMember"] == 2  # exactly what AIBrix wrote
    # The operator still serves everyone else: a good StormService next to it gets its constraint.
    cluster.create(stormservice(good, namespace, annotations=HARD_LEAF))
    cluster.bound_pods(namespace, f"storm-service-name={good}", 2)


def test_infeasible_hard_request_stays_pending_whole_and_says_why(cluster: DevCluster, namespace: str) -> None:
    # Each leaf has one node with 8 free GPUs and one with 4: no leaf holds 6 + 6, but s4 (tier 2) does.
    fill(cluster, namespace, {"node0": 4, "node2": 4, "node4": 4, "node6": 4})
    cluster.create(stormservice("pd-tight", namespace, roles=BIG_PD, annotations=HARD_LEAF))

    def unsatisfiable() -> str:
        found = [e["message"] for e in cluster.events(namespace, "pd-tight") if e["reason"] == "TopologyUnsatisfiable"]
        return found[0] if found else ""

    message = cluster.wait(unsatisfiable, 60, "a TopologyUnsatisfiable Event")
    assert "stays Pending" in message and "tier 1" in message and "would fit within tier 2" in message
    assert not [p for p in cluster.pods(namespace, "storm-service-name=pd-tight") if p["spec"].get("nodeName")]  # never split


def test_placed_replica_gets_an_event_naming_its_domain(cluster: DevCluster, topology: Topology, namespace: str) -> None:
    cluster.create(stormservice("pd-seen", namespace, roles=BIG_PD, annotations=HARD_LEAF))
    _, domain = placement(cluster, topology, namespace, "pd-seen", 2)

    def placed() -> str:
        found = [e["message"] for e in cluster.events(namespace, "pd-seen") if e["reason"] == "ReplicaPlaced"]
        return found[0] if found else ""

    message = cluster.wait(placed, 90, "a ReplicaPlaced Event")
    assert f"placed in {domain.name}, tier 1" in message


def test_stormservice_scope_with_nested_replica_tier(cluster: DevCluster, topology: Topology, namespace: str) -> None:
    annotations = {MODE: "hard", HIGHEST_TIER: "2", SCOPE: "StormService", REPLICA_HIGHEST_TIER: "1"}
    cluster.create(stormservice("pd-svc", namespace, roles=BIG_PD, replicas=2, annotations=annotations))
    pods = cluster.bound_pods(namespace, "storm-service-name=pd-svc", 4, timeout=90)
    assert {p["metadata"]["annotations"]["scheduling.k8s.io/group-name"] for p in pods} == {"pd-svc"}  # one gang
    service_domain = topology.lowest_common_switch(node_names(pods))
    assert service_domain is not None and service_domain.tier <= 2, node_names(pods)
    domains = replicas_placement(cluster, topology, namespace, "pd-svc")
    assert len(domains) == 2 and all(d is not None and d.tier == 1 for d in domains.values()), domains
    group = next(g for g in cluster.podgroups(namespace) if g["metadata"]["name"] == "pd-svc")
    assert group["spec"]["minMember"] == 4
    assert group["spec"]["subGroupPolicy"][0]["networkTopology"] == {"mode": "hard", "highestTierAllowed": 1}
    # Scope StormService records and reports each replica as scope RoleSet does.
    table = placement_table(cluster, namespace, "pd-svc", 2)
    assert set(table) == set(domains) and all(table[r] == d.name for r, d in domains.items())


def test_placement_is_recorded_on_the_stormservice_labels_and_metrics(cluster: DevCluster, cluster_dir, namespace: str) -> None:  # type: ignore[no-untyped-def]
    import json
    import urllib.request

    cluster.create(stormservice("pd-rec", namespace, roles=BIG_PD, annotations=HARD_LEAF))
    pods = cluster.bound_pods(namespace, "storm-service-name=pd-rec", 2)
    roleset = cluster.only(lambda: cluster.rolesets(namespace, "pd-rec"), "RoleSet")
    name = roleset["metadata"]["name"]

    def recorded() -> dict:  # type: ignore[type-arg]
        raw = (cluster.stormservice(namespace, "pd-rec")["metadata"].get("annotations") or {}).get("stormtopo.io/placement")
        return json.loads(raw) if raw else {}

    table = cluster.wait(recorded, 90, "the placement annotation")
    leaf = table[name]["hyperNode"]
    assert table[name]["tier"] == 1 and sorted(table[name]["nodes"]) == node_names(pods)

    def labelled() -> bool:
        return all(
            p["metadata"]["labels"].get("stormtopo.io/hypernode-tier-1") == leaf
            for p in cluster.pods(namespace, "storm-service-name=pd-rec")
        )

    cluster.wait(labelled, 90, "domain labels on the pods")
    spine = cluster.pods(namespace, "storm-service-name=pd-rec")[0]["metadata"]["labels"]["stormtopo.io/hypernode-tier-2"]
    assert spine in ("s4", "s5")
    port = json.loads((cluster_dir / "cluster.json").read_text())["ports"]["operator_metrics"]

    def counted() -> str:  # (counted once the writes the test waited for returned: a moment later)
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        return text if 'stormtopo_replicas_placed_total{tier="1"}' in text else ""

    text = cluster.wait(counted, 30, "the placement counted in stormtopo_replicas_placed_total")
    assert "stormtopo_placement_seconds_count" in text and "stormtopo_pending_gangs" in text


def test_a_pod_bound_outside_the_tier_is_reported_as_a_violation_within_30_s(
    cluster: DevCluster, topology: Topology, namespace: str
) -> None:
    """Placement is checked for as long as the replica lives: a pod of the replica bound by hand on a
    node across the core (no scheduler involved) is a TopologyViolated Warning naming pod, node and tier.

    The pod is of a role the RoleSet does not have ("debug"): AIBrix v0.7.0 deletes a surplus pod of one
    of its own roles within milliseconds (rolesyncer: toDelete), which raced the check (CI, 2026-12-03)."""
    cluster.create(stormservice("pd-kept", namespace, roles=BIG_PD, annotations=HARD_LEAF))
    nodes, domain = placement(cluster, topology, namespace, "pd-kept", 2)
    replica = cluster.only(lambda: cluster.rolesets(namespace, "pd-kept"), "RoleSet")["metadata"]["name"]
    far = next(n for n in sorted(topology.nodes) if topology.lowest_common_switch([n, nodes[0]]).tier == topology.tiers)  # type: ignore[union-attr]
    labels = {"storm-service-name": "pd-kept", "roleset-name": replica, "role-name": "debug"}
    cluster.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "pinned-elsewhere", "namespace": namespace, "labels": labels},
            "spec": {"nodeName": far, "containers": [{"name": "c", "image": "x"}]},
        }
    )

    def violation() -> str:
        found = [e["message"] for e in cluster.events(namespace, "pd-kept") if e["reason"] == "TopologyViolated"]
        return found[0] if found else ""

    message = cluster.wait(violation, 30, "a TopologyViolated Event")
    assert f"pinned-elsewhere on {far}" in message and "tier 1" in message, message
    assert domain is not None and domain.tier == 1


@pytest.mark.parametrize(
    ("service_strategy", "role_strategy"),
    [(True, True), (False, True), (False, False)],
    ids=["strategy-on-service-and-role", "strategy-on-role-only", "no-strategy"],
)
def test_a_multi_node_prefill_role_joins_its_replicas_gang_within_one_leaf(
    cluster: DevCluster, topology: Topology, namespace: str, service_strategy: bool, role_strategy: bool
) -> None:
    """AIBrix gives each instance of a multi-node role with its own strategy a PodSet PodGroup and
    points its pods there; stormtopo makes the whole replica one gang, placed within the tier."""
    roles = (Role("prefill", gpus=2, pod_group_size=2, strategy=role_strategy), Role("decode", gpus=2, stateful=False))
    name = f"multi-{int(service_strategy)}{int(role_strategy)}"
    cluster.create(stormservice(name, namespace, roles=roles, annotations=HARD_LEAF, volcano_strategy=service_strategy))
    pods = cluster.bound_pods(namespace, f"storm-service-name={name}", 3, timeout=90)
    replica = cluster.only(lambda: cluster.rolesets(namespace, name), "RoleSet")["metadata"]["name"]
    assert {p["metadata"]["annotations"]["scheduling.k8s.io/group-name"] for p in pods} == {replica}
    domain = topology.lowest_common_switch(node_names(pods))
    assert domain is not None and domain.tier == 1, node_names(pods)
    gang = next(g for g in cluster.podgroups(namespace) if g["metadata"]["name"] == replica)
    assert gang["spec"]["minMember"] == 3 and gang["spec"]["minTaskMember"] == {"prefill": 2, "decode": 1}
    assert gang["spec"]["networkTopology"] == {"mode": "hard", "highestTierAllowed": 1}


def test_pods_without_resource_requests_stay_within_their_replicas_leaf(cluster: DevCluster, topology: Topology, namespace: str) -> None:
    """Volcano places pods that ask for nothing in its backfill action, which ignores HyperNodes.
    stormtopo holds them at a scheduling gate until the replica's other pods are placed, then gives
    them a required node affinity to that domain."""
    roles = (Role("prefill", gpus=2), Role("decode", gpus=2), Role("router", replicas=3, requests=False))
    cluster.create(stormservice("routed", namespace, roles=roles, annotations=HARD_LEAF))
    pods = cluster.bound_pods(namespace, "storm-service-name=routed", 5, timeout=90)
    domain = topology.lowest_common_switch(node_names(pods))
    assert domain is not None and domain.tier == 1, [(p["metadata"]["name"], p["spec"]["nodeName"]) for p in pods]
    routers = [p for p in pods if p["metadata"]["labels"]["role-name"] == "router"]
    for router in routers:
        terms = router["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        (term,) = terms  # one term: the domain's nodes by hostname
        assert term["matchExpressions"] == [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": sorted(topology.nodes_under(domain.name))}
        ]
        assert not router["spec"].get("schedulingGates")
    replica = cluster.only(lambda: cluster.rolesets(namespace, "routed"), "RoleSet")["metadata"]["name"]
    gang = next(g for g in cluster.podgroups(namespace) if g["metadata"]["name"] == replica)
    assert gang["spec"]["minTaskMember"] == {"prefill": 1, "decode": 1}


def test_a_replacement_pod_gets_its_domain_labels(cluster: DevCluster, topology: Topology, namespace: str) -> None:
    cluster.create(stormservice("pd-again", namespace, roles=BIG_PD, annotations=HARD_LEAF))
    pods = cluster.bound_pods(namespace, "storm-service-name=pd-again", 2)
    first = {p["metadata"]["uid"] for p in pods}
    cluster.core.delete_namespaced_pod(pods[0]["metadata"]["name"], namespace, grace_period_seconds=0)

    def replaced_and_labelled() -> list[dict[str, Any]]:
        now = cluster.pods(namespace, "storm-service-name=pd-again")
        new = [p for p in now if p["metadata"]["uid"] not in first and p["spec"].get("nodeName")]
        return [p for p in new if "stormtopo.io/hypernode-tier-1" in p["metadata"]["labels"]]

    (replacement,) = cluster.wait(replaced_and_labelled, 90, "the replacement pod with its domain labels")
    leaf = topology.ancestors(replacement["spec"]["nodeName"])[0]
    assert replacement["metadata"]["labels"]["stormtopo.io/hypernode-tier-1"] == leaf


def test_leaves_that_select_nodes_by_pattern_place_and_pin_as_exact_ones(cluster: DevCluster, topology: Topology, namespace: str) -> None:
    """Leaves whose members select nodes by regexMatch (as Volcano's samples and UFM trees do): the
    operator learns which nodes they select from its free-room reading (a watch of the nodes, no list
    of its own), reports the replica's leaf and pins its routers to that leaf's nodes."""
    hypernodes = "topology.volcano.sh", "v1alpha1", "hypernodes"
    leaves = {h["metadata"]["name"]: h for h in cluster.hypernodes() if int(h["spec"]["tier"]) == 1}
    try:
        for name, leaf in leaves.items():
            nodes = sorted(m["selector"]["exactMatch"]["name"] for m in leaf["spec"]["members"])
            members = [{"type": "Node", "selector": {"regexMatch": {"pattern": "^(" + "|".join(nodes) + ")$"}}}]
            cluster.custom.patch_cluster_custom_object(*hypernodes, name, {"spec": {"members": members}})
        roles = (Role("prefill", gpus=6), Role("decode", gpus=6), Role("router", requests=False))
        cluster.create(stormservice("by-pattern", namespace, roles=roles, annotations=HARD_LEAF))
        pods = cluster.bound_pods(namespace, "storm-service-name=by-pattern", 3, timeout=90)
        domain = topology.lowest_common_switch(node_names(pods))
        assert domain is not None and domain.tier == 1, [(p["metadata"]["name"], p["spec"]["nodeName"]) for p in pods]
        (router,) = [p for p in pods if p["metadata"]["labels"]["role-name"] == "router"]
        (term,) = router["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert term["matchExpressions"][0]["values"] == sorted(topology.nodes_under(domain.name))

        def placed() -> str:
            found = [e["message"] for e in cluster.events(namespace, "by-pattern") if e["reason"] == "ReplicaPlaced"]
            return found[0] if found else ""

        assert f"placed in {domain.name}, tier 1" in cluster.wait(placed, 90, "a ReplicaPlaced Event")
    finally:
        for name, leaf in leaves.items():
            cluster.custom.patch_cluster_custom_object(*hypernodes, name, {"spec": {"members": leaf["spec"]["members"]}})
