"""Priority is part of placement: a high-priority replica in a full cluster preempts lower-priority work
within one domain of its tier, and takes exactly that domain's worth, on the real control plane.

The cluster is the feature request's (8 nodes x 8 GPUs, leaves s0..s3 of two nodes each), every GPU held
by low-priority Volcano pods of 4 GPUs (two a node). Volcano v1.15.1's `preempt` skips every job with a
network topology; `gangpreempt`, in the configuration `stormtopo dev up` runs and docs/install.md
recommends, picks its victims within one HyperNode of the job's tier. It ranks jobs by their PodGroup's
priority class, which stormtopo gives the replica's PodGroup from its pods' (core/priority.py).

The operator runs as the chart runs it (its ServiceAccount, RBAC and admission policies): reading the
PriorityClasses and writing a PodGroup's priorityClassName are rights the chart grants.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from stormtopo.core.topology.tree import Switch, Topology
from stormtopo.core.vocabulary import HIGHEST_TIER, MODE, NARROWED_ANNOTATION, ROLESET_LABEL
from stormtopo.devenv import cluster as dev
from stormtopo.devenv.client import DevCluster, Timeout, node_names
from stormtopo.devenv.workloads import Role, stormservice
from tests.builders import BATCH_LABEL, batch_pod
from tests.conftest import stormtopo
from tests.integration.chart import InstalledOperator, running_as_installed

HIGH, LOW = "stormtopo-test-inference", "stormtopo-test-batch"
BATCH = f"{BATCH_LABEL}=true"


@pytest.fixture(scope="module", autouse=True)
def as_installed(cluster_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InstalledOperator]:
    with running_as_installed(cluster_dir, tmp_path_factory.mktemp("priority-as-installed")) as installed:
        yield installed


@pytest.fixture(scope="module")
def priority_classes(cluster: DevCluster) -> Iterator[None]:
    api = client.SchedulingV1Api(cluster.api_client)
    for name, value in ((HIGH, 1_000_000), (LOW, 100)):
        with contextlib.suppress(ApiException):  # 409: left by an earlier run on a reused cluster
            body = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name}, "value": value}
            api.create_priority_class(body)
    yield
    for name in (HIGH, LOW):
        with contextlib.suppress(ApiException):
            api.delete_priority_class(name)


def fill_with_batch(
    cluster: DevCluster, namespace: str, nodes: int, priority_class: str = LOW, queue: str | None = None
) -> dict[str, tuple[str, str]]:
    """Every GPU held by batch pods, two a node (4 + 4 GPUs fill a node of 8): pod -> (uid, node)."""
    for i in range(2 * nodes):
        cluster.create(batch_pod(f"batch-{i:02d}", namespace, priority_class, queue=queue))
    bound = cluster.bound_pods(namespace, BATCH, 2 * nodes, timeout=120)
    return {p["metadata"]["name"]: (p["metadata"]["uid"], p["spec"]["nodeName"]) for p in bound}


def test_a_high_priority_hard_replica_preempts_exactly_one_leafs_batch_pods(
    cluster: DevCluster, topology: Topology, namespace: str, priority_classes: None
) -> None:
    nodes = len(topology.nodes)
    before = fill_with_batch(cluster, namespace, nodes)
    roles = (Role("prefill", gpus=8, priority_class=HIGH), Role("decode", gpus=8, priority_class=HIGH))
    cluster.create(stormservice("urgent", namespace, roles, annotations={MODE: "hard", HIGHEST_TIER: "1"}))

    # The priority reaches Volcano: the replica's PodGroup carries its pods' class.
    group = cluster.wait(
        lambda: next((g for g in cluster.podgroups(namespace) if g["spec"].get("priorityClassName") == HIGH), None),
        60,
        "the replica's PodGroup with its pods' priority class",
    )
    assert group["spec"]["networkTopology"] == {"mode": "hard", "highestTierAllowed": 1}

    # Exactly the four batch pods of that leaf were preempted: none elsewhere, none more.
    runs_in_one_leaf_taking_its_four(cluster, topology, namespace, "urgent", before)


def runs_in_one_leaf_taking_its_four(
    cluster: DevCluster, topology: Topology, namespace: str, name: str, before: dict[str, tuple[str, str]]
) -> list[str]:
    """StormService `name`'s replica runs within one leaf, within two minutes, and the batch pods gone are exactly
    the four that leaf held: none elsewhere, none more. Its nodes."""
    placed = cluster.bound_pods(namespace, f"storm-service-name={name}", 2, timeout=120)
    domain = topology.lowest_common_switch(node_names(placed))
    assert domain is not None and domain.tier == 1, f"the replica crossed its leaf: {node_names(placed)}"
    gone = preempted(cluster, namespace, BATCH, before)
    expected = {pod for pod, (_, node) in before.items() if node in set(topology.nodes_under(domain.name))}
    assert gone == expected and len(gone) == 4, f"took {sorted(gone)}; the leaf {domain.name} held {sorted(expected)}"
    return node_names(placed)


def test_a_replica_reclaims_its_queues_share_from_another_team_within_one_leaf(
    cluster: DevCluster, topology: Topology, namespace: str, priority_classes: None
) -> None:
    """Issue 41, item 2, across queues: another team's queue (team-b, the same weight as the default one) holds
    every GPU with batch pods of the replica's own priority, which gangpreempt never takes (another queue, and
    no lower). The replica's queue is owed its share: Volcano's gangreclaim, in the configuration `stormtopo dev
    up` runs and docs/install.md recommends, takes it back within one leaf: exactly that leaf's four pods, and
    the replica runs there."""
    api = client.CustomObjectsApi(cluster.api_client)
    queue = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": "team-b"}, "spec": {"weight": 1}}
    with contextlib.suppress(ApiException):  # 409: left by an earlier test or run
        api.create_cluster_custom_object("scheduling.volcano.sh", "v1beta1", "queues", queue)
    before = fill_with_batch(cluster, namespace, len(topology.nodes), priority_class=HIGH, queue="team-b")
    roles = (Role("prefill", gpus=8, priority_class=HIGH), Role("decode", gpus=8, priority_class=HIGH))
    cluster.create(stormservice("owed", namespace, roles, annotations={MODE: "hard", HIGHEST_TIER: "1"}))
    runs_in_one_leaf_taking_its_four(cluster, topology, namespace, "owed", before)


def test_a_replica_that_no_preemption_can_place_says_why_in_its_warning_and_in_explain(
    cluster: DevCluster, topology: Topology, namespace: str, priority_classes: None
) -> None:
    """Issue 41, item 4: every GPU held by batch pods of the replica's own priority, which gangpreempt never
    takes. The replica stays Pending; its TopologyUnsatisfiable Warning and `stormtopo explain` say that no
    domain qualifies for preemption and why: in the best leaf, all 16 GPUs are held by pods of its
    priority or higher. Nothing is preempted."""
    before = fill_with_batch(cluster, namespace, len(topology.nodes), priority_class=HIGH)
    why = "no domain qualifies for preemption: in the best, tier-1 s0, 16 GPUs are held by pods of priority 1000000 or higher"
    message = pending_with_warning(cluster, namespace, "equal", why)
    assert why in message and "0 by pods it does not preempt; 16 GPUs short" in message, message
    out = stormtopo("explain", f"{namespace}/equal", "--kubeconfig", str(cluster.kubeconfig)).stdout
    assert why in " ".join(out.split()), out  # the console wraps long lines
    assert not preempted(cluster, namespace, BATCH, before)
    print(f"\n  {message}")


def test_a_soft_replica_no_preemption_can_place_is_let_go_and_its_event_says_why(
    cluster: DevCluster, topology: Topology, namespace: str, priority_classes: None
) -> None:
    """Issue 41, item 4, soft: every GPU held by batch pods of the replica's own priority. Narrowing finds no leaf
    whose victims gangpreempt would take: the replica is let go as it is (soft, to Volcano), not held, and its
    ReplicaNotNarrowed Event says why. Nothing is preempted."""
    before = fill_with_batch(cluster, namespace, len(topology.nodes), priority_class=HIGH)
    roles = (Role("prefill", gpus=8, priority_class=HIGH), Role("decode", gpus=8, priority_class=HIGH))
    cluster.create(stormservice("equal-soft", namespace, roles, annotations={MODE: "soft", HIGHEST_TIER: "1"}))
    why = "no domain qualifies for preemption: in the best, tier-1 s0, 16 GPUs are held by pods of priority 1000000 or higher"

    def said() -> str | None:
        return next((e["message"] for e in cluster.events(namespace, "equal-soft") if e["reason"] == "ReplicaNotNarrowed"), None)

    message = cluster.wait(said, 60, "the replica's ReplicaNotNarrowed Event")
    assert message is not None and why in message, message
    pods = cluster.pods(namespace, "storm-service-name=equal-soft")
    assert len(pods) == 2 and not any(p["spec"].get("schedulingGates") for p in pods), "let go: no stormtopo gate left"
    assert not preempted(cluster, namespace, BATCH, before)


def test_without_the_annotations_volcanos_preempt_still_takes_room_for_it(
    cluster: DevCluster, topology: Topology, namespace: str, priority_classes: None
) -> None:
    """Issue 41, item 5: a cluster that runs Volcano's preempt keeps it for every job without a topology.
    The same full cluster and replica, not opted in, its class named where AIBrix copies it to the
    PodGroup (its scheduling strategy): Volcano's preempt makes room, wherever it finds it."""
    nodes = len(topology.nodes)
    before = fill_with_batch(cluster, namespace, nodes)
    roles = (Role("prefill", gpus=8, priority_class=HIGH), Role("decode", gpus=8, priority_class=HIGH))
    service = stormservice("plain", namespace, roles)
    service["spec"]["template"]["spec"]["schedulingStrategy"]["volcanoSchedulingStrategy"]["priorityClassName"] = HIGH
    cluster.create(service)
    placed = cluster.bound_pods(namespace, "storm-service-name=plain", 2, timeout=120)
    gone = sorted(preempted(cluster, namespace, BATCH, before))
    assert len(gone) >= 4, gone  # two whole nodes freed
    domain = topology.lowest_common_switch(node_names(placed))
    where = domain.name if domain else "?"
    print(f"\n  without stormtopo: {len(gone)} batch pods preempted; the replica on {node_names(placed)}, under {where}")


def test_where_volcano_runs_no_gangpreempt_the_warning_and_explain_say_nothing_will_preempt_for_it(
    cluster: DevCluster, cluster_dir: Path, topology: Topology, namespace: str, priority_classes: None
) -> None:
    """Issue 41, items 4 and 5: a Volcano whose actions lack gangpreempt (its default configuration has none)
    preempts nothing for a job with a network topology. The full cluster and the high-priority hard replica
    of the first test: it stays Pending and nothing is preempted; its Warning and `stormtopo explain` say
    that Volcano runs no gangpreempt, where that was read (the ConfigMap, read under the chart's Role), and
    the actions to set, rather than naming victims nobody takes. With gangpreempt back, it preempts and runs."""
    without = dev.SCHEDULER_CONF.replace(
        'actions: "enqueue, allocate, preempt, gangpreempt, gangreclaim, backfill"', 'actions: "enqueue, allocate, preempt, backfill"'
    )
    assert without != dev.SCHEDULER_CONF
    loaded = scheduler_loads(cluster_dir)
    dev.set_scheduler_conf(cluster_dir, without)
    try:
        cluster.wait(lambda: scheduler_loads(cluster_dir) > loaded, 60, "vc-scheduler reloading its configuration")
        assert last_loaded_actions(cluster_dir) == "enqueue allocate preempt backfill"
        before = fill_with_batch(cluster, namespace, len(topology.nodes))
        why = "Volcano's scheduler runs no gangpreempt (ConfigMap volcano-system/volcano-scheduler-configmap key volcano-scheduler.conf"
        message = pending_with_warning(cluster, namespace, "stuck", why)
        assert "the fewest victims would be in tier-1 s0: 4 pod(s) holding 16 GPUs (4 of priority 100)" in message, message
        assert 'set actions: "enqueue, allocate, preempt, gangpreempt, backfill"' in message, message
        out = " ".join(stormtopo("explain", f"{namespace}/stuck", "--kubeconfig", str(cluster.kubeconfig)).stdout.split())
        assert why in out and "so nothing is preempted for it" in out, out  # (the console wraps long lines)
        assert not preempted(cluster, namespace, BATCH, before)
        assert not [p["metadata"]["name"] for p in cluster.pods(namespace, "storm-service-name=stuck") if p["spec"].get("nodeName")]
        print(f"\n  {message}")
    finally:
        dev.set_scheduler_conf(cluster_dir, dev.SCHEDULER_CONF)
    # gangpreempt back: it preempts one leaf's batch pods and runs there.
    placed = cluster.bound_pods(namespace, "storm-service-name=stuck", 2, timeout=120)
    domain = topology.lowest_common_switch(node_names(placed))
    assert domain is not None and domain.tier == 1, f"the replica crossed its leaf: {node_names(placed)}"
    assert len(preempted(cluster, namespace, BATCH, before)) == 4


def pending_with_warning(cluster: DevCluster, namespace: str, name: str, why: str) -> str:
    """A high-priority hard tier-1 replica of 2 x 8 GPUs created; its TopologyUnsatisfiable Warning once it says `why`."""
    roles = (Role("prefill", gpus=8, priority_class=HIGH), Role("decode", gpus=8, priority_class=HIGH))
    cluster.create(stormservice(name, namespace, roles, annotations={MODE: "hard", HIGHEST_TIER: "1"}))

    def warning() -> str | None:
        said = [e["message"] for e in cluster.events(namespace, name) if e["reason"] == "TopologyUnsatisfiable"]
        return next((m for m in said if why in m), None)

    message = cluster.wait(warning, 120, f"the replica's Warning saying {why!r}")
    assert message is not None
    return message


LOADED = "Finished loading scheduler config. Final state: actions=["


def scheduler_loads(cluster_dir: Path) -> int:
    """How many times vc-scheduler has loaded its configuration (its log, at -v=2)."""
    return (cluster_dir / "logs" / "vc-scheduler.log").read_text(errors="replace").count(LOADED)


def last_loaded_actions(cluster_dir: Path) -> str:
    text = (cluster_dir / "logs" / "vc-scheduler.log").read_text(errors="replace")
    return text[text.rindex(LOADED) + len(LOADED) :].split("]", 1)[0]


def what_happened(cluster: DevCluster, namespace: str, name: str) -> str:
    """StormService `name`'s Events, its replicas' PodGroups (topology, narrowing, phase) and pods: a failure's story."""
    lines = [f"{e['reason']}: {e['message']}" for e in cluster.events(namespace, name)]
    for group in cluster.podgroups(namespace):
        if group["metadata"]["name"].startswith(f"{name}-"):
            narrowed = (group["metadata"].get("annotations") or {}).get(NARROWED_ANNOTATION)
            lines.append(
                f"PodGroup {group['metadata']['name']}: {group['spec'].get('networkTopology')} {narrowed} {group.get('status', {})}"
            )
    for pod in cluster.pods(namespace, f"storm-service-name={name}"):
        spec = pod["spec"]
        lines.append(f"pod {pod['metadata']['name']}: {spec.get('nodeName')} {pod['status'].get('phase')} {spec.get('schedulingGates')}")
    return "\n".join(lines)


def preempted(cluster: DevCluster, namespace: str, selector: str, before: dict[str, tuple[str, str]]) -> set[str]:
    """The pods of `before` (name -> (uid, node)) no longer running as they were: deleted, or replaced."""
    running = [p for p in cluster.pods(namespace, selector) if not p["metadata"].get("deletionTimestamp")]
    left = {p["metadata"]["name"]: p["metadata"]["uid"] for p in running}
    return {name for name, (uid, _) in before.items() if left.get(name) != uid}


def test_a_high_priority_soft_replica_preempts_in_the_best_leaf_and_only_as_much_as_it_must(
    cluster: DevCluster, topology: Topology, namespace: str, priority_classes: None
) -> None:
    """Issue 41, item 2, soft: the same full cluster and replica with `soft` runs within two minutes within one
    leaf, and the pods preempted are exactly that leaf's four. Volcano v1.15.1's gangpreempt treats a soft job
    as one without a topology (alone it took four or six batch pods, on nodes of two leaves, and the replica
    ran across the spine); stormtopo narrows the replica, as installed, before its pods go (core/narrowing.py):
    its PodGroup is held hard within tier 1, so gangpreempt takes one leaf's worth, and the ReplicaNarrowed
    Event says so."""
    before = fill_with_batch(cluster, namespace, len(topology.nodes))
    roles = (Role("prefill", gpus=8, priority_class=HIGH), Role("decode", gpus=8, priority_class=HIGH))
    cluster.create(stormservice("soft", namespace, roles, annotations={MODE: "soft", HIGHEST_TIER: "1"}))
    placed = runs_in_one_leaf_taking_its_four(cluster, topology, namespace, "soft", before)
    said = [e["message"] for e in cluster.events(namespace, "soft") if e["reason"] == "ReplicaNarrowed"]
    assert said and "held hard within tier 1 for at most 120 s" in said[0], said
    # Its PodGroup carries the narrowing; the webhook and the reconciler give it back its request after 120 s.
    [group] = [g for g in cluster.podgroups(namespace) if g["spec"].get("priorityClassName") == HIGH]
    assert json.loads(group["metadata"]["annotations"][NARROWED_ANNOTATION])["tier"] == 1
    print(f"\n  soft: one leaf's four batch pods preempted; the replica on {placed}")


@pytest.mark.parametrize("mode", ["hard", "soft"])
def test_a_service_scaled_to_two_replicas_takes_two_leaves_one_each_and_only_their_batch_pods(
    cluster: DevCluster, topology: Topology, namespace: str, priority_classes: None, mode: str
) -> None:
    """Issue 41, item 2, two replicas at once (a service created with two, or scaled up, on a full cluster): each
    replica runs within a leaf of its own within two minutes, and the pods preempted are exactly those two
    leaves' eight: never a third leaf's, never more."""
    before = fill_with_batch(cluster, namespace, len(topology.nodes))
    roles = (Role("prefill", gpus=8, priority_class=HIGH), Role("decode", gpus=8, priority_class=HIGH))
    name = f"pair-{mode}"
    cluster.create(stormservice(name, namespace, roles, replicas=2, annotations={MODE: mode, HIGHEST_TIER: "1"}))
    placed = cluster.bound_pods(namespace, f"storm-service-name={name}", 4, timeout=150)
    replicas: dict[str, list[dict[str, Any]]] = {}
    for pod in placed:
        replicas.setdefault(pod["metadata"]["labels"][ROLESET_LABEL], []).append(pod)
    leaves = {}
    for roleset, pods in replicas.items():
        domain = topology.lowest_common_switch(node_names(pods))
        assert domain is not None and domain.tier == 1, f"replica {roleset} crossed its leaf: {node_names(pods)}"
        leaves[roleset] = domain.name
    assert len(set(leaves.values())) == 2, f"two replicas, one leaf each: {leaves}"
    gone = preempted(cluster, namespace, BATCH, before)
    under = {node for leaf in leaves.values() for node in topology.nodes_under(leaf)}
    expected = {pod for pod, (_, node) in before.items() if node in under}
    assert gone == expected and len(gone) == 8, f"took {sorted(gone)}; the leaves {sorted(leaves.values())} held {sorted(expected)}"


def test_of_two_soft_replicas_where_one_leaf_can_be_taken_one_is_narrowed_there_and_the_other_goes_at_once(
    cluster: DevCluster, topology: Topology, namespace: str, priority_classes: None
) -> None:
    """Issue 41, item 5, two soft replicas at once where one leaf only holds enough lower-priority work: in
    every other leaf one node is held at the replicas' own priority. The first replica is narrowed into that
    leaf and takes its four batch pods; the second must not wait, held hard within tier 1, on the victims the
    first takes (up to the narrowing's 120 s): it goes as it is, soft, and Volcano preempts for it across
    leaves, as without stormtopo (Volcano's gangpreempt treats a soft job as one without a topology: across
    the spine as well). Both run within a minute; before the narrowing claimed its victims, the second waited
    120 s (narrowed onto the same leaf as the first)."""
    leaves = sorted(name for name, switch in topology.switches.items() if switch.tier == 1)
    first = leaves[0]
    for leaf in leaves:
        for n, node in enumerate(sorted(topology.nodes_under(leaf))):
            held = HIGH if leaf != first and n == 0 else LOW  # one node a leaf at the replicas' priority, but in `first`
            for i in range(2):
                cluster.create(batch_pod(f"batch-{node}-{i}", namespace, held, node=node))
    bound = cluster.bound_pods(namespace, BATCH, 2 * len(topology.nodes), timeout=120)
    before = {p["metadata"]["name"]: (p["metadata"]["uid"], p["spec"]["nodeName"]) for p in bound}
    roles = (Role("prefill", gpus=8, priority_class=HIGH), Role("decode", gpus=8, priority_class=HIGH))
    cluster.create(stormservice("two-soft", namespace, roles, replicas=2, annotations={MODE: "soft", HIGHEST_TIER: "1"}))
    try:
        placed = cluster.bound_pods(namespace, "storm-service-name=two-soft", 4, timeout=60)
    except Timeout:
        raise AssertionError(what_happened(cluster, namespace, "two-soft")) from None
    replicas: dict[str, list[str]] = {}
    for pod in placed:
        replicas.setdefault(pod["metadata"]["labels"][ROLESET_LABEL], []).append(pod["spec"]["nodeName"])
    spans = sorted((topology.lowest_common_switch(nodes) or Switch("?", 9, None)).tier for nodes in replicas.values())
    assert spans[0] == 1 and spans[1] >= 2, f"one replica within the leaf that could be taken, the other across leaves: {replicas}"
    gone = preempted(cluster, namespace, BATCH, before)
    assert set(topology.nodes_under(first)) <= {before[pod][1] for pod in gone}, f"the first leaf's batch pods taken: {sorted(gone)}"
    print(f"\n  two soft replicas: {replicas}; {len(gone)} batch pods preempted")


def test_a_lower_priority_stormservice_replica_is_preempted_whole_and_placed_again_whole(
    cluster: DevCluster, topology: Topology, namespace: str, priority_classes: None
) -> None:
    """Issue 41, item 2, the victim a StormService: four low-priority hard replicas fill the four leaves.
    A high-priority hard replica preempts exactly one of them, both its pods (a gang is preempted whole,
    never half of it), and the others are untouched; once the high one goes, the preempted replica is
    placed again whole, within one leaf, by the normal path."""
    low = (Role("prefill", gpus=8, priority_class=LOW), Role("decode", gpus=8, priority_class=LOW))
    leaves = len(topology.nodes) // 2
    cluster.create(stormservice("batchy", namespace, low, replicas=leaves, annotations={MODE: "hard", HIGHEST_TIER: "1"}))
    filled = cluster.bound_pods(namespace, "storm-service-name=batchy", 2 * leaves, timeout=180)
    before = {p["metadata"]["name"]: (p["metadata"]["uid"], p["spec"]["nodeName"]) for p in filled}
    rolesets = {p["metadata"]["name"]: p["metadata"]["labels"][ROLESET_LABEL] for p in filled}

    high = (Role("prefill", gpus=8, priority_class=HIGH), Role("decode", gpus=8, priority_class=HIGH))
    cluster.create(stormservice("urgent", namespace, high, annotations={MODE: "hard", HIGHEST_TIER: "1"}))
    placed = cluster.bound_pods(namespace, "storm-service-name=urgent", 2, timeout=120)
    domain = topology.lowest_common_switch(node_names(placed))
    assert domain is not None and domain.tier == 1, f"the replica crossed its leaf: {node_names(placed)}"

    gone = preempted(cluster, namespace, "storm-service-name=batchy", before)
    assert len(gone) == 2 and len({rolesets[name] for name in gone}) == 1, f"preempted {sorted(gone)}: one replica, whole"
    assert {before[name][1] for name in gone} == set(topology.nodes_under(domain.name))
    [victim] = {rolesets[name] for name in gone}

    # The high one goes: AIBrix's new pods of the preempted replica are placed again, whole, within a leaf.
    cluster.delete_stormservice(namespace, "urgent")
    again = cluster.bound_pods(namespace, f"{ROLESET_LABEL}={victim}", 2, timeout=180)
    home = topology.lowest_common_switch(node_names(again))
    assert home is not None and home.tier == 1, f"the preempted replica came back across its leaf: {node_names(again)}"
