"""The placement planner (core/replica.py): every decision of a replica's placement path, through
`plan_replica` and `plan_explained`: release and its anchors, placed, pending, violation, say-once
and back-off. Snapshots are built by the operator's index, as the shell builds them."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from stormtopo.core.admission import admit_pod
from stormtopo.core.explanation import Explanation, Pending
from stormtopo.core.reconciliation import ServiceSnapshot, plan_stormservice
from stormtopo.core.replica import EXPLAIN_INTERVAL, ReplicaMemory, ReplicaSnapshot, plan_explained, plan_replica
from stormtopo.core.request import ClusterTiers
from stormtopo.core.vocabulary import HIGHEST_TIER, MODE, PLACEMENT_ANNOTATION, REQUEST_ANNOTATION, SCOPE
from stormtopo.core.writes import AdoptPod, LabelPod, PatchPod, PatchPodGroup, RecordPlacement
from stormtopo.devenv.workloads import Role
from stormtopo.operator.index import Index
from tests.builders import HARD_TIER_1_RECORD, pod, podgroup, roleset, service
from tests.example_index import index_of

HARD1 = {MODE: "hard", HIGHEST_TIER: "1"}
ROUTED = (Role("prefill"), Role("decode"), Role("router", requests=False))
KEY = ("ns", "svc-rs")


def snapshot(index: Index, now: float = 100.0) -> ReplicaSnapshot:
    found = index.replica_snapshot(KEY, now)
    assert found is not None
    return found


def released_to(plan_writes: tuple[object, ...]) -> list[str]:
    (patch,) = [w for w in plan_writes if isinstance(w, PatchPod)]
    affinity = next(op for op in patch.ops if op["path"] == "/spec/affinity")["value"]
    (term,) = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    (requirement,) = term["matchExpressions"]
    return list(requirement["values"])


def regex_leaf(pattern: str) -> dict[str, Any]:
    """A tier-1 HyperNode whose nodes are those whose names match `pattern`."""
    return {
        "kind": "HyperNode",
        "metadata": {"name": "leaf0"},
        "spec": {"tier": 1, "members": [{"type": "Node", "selector": {"regexMatch": {"pattern": pattern}}}]},
    }


# -- release ---------------------------------------------------------------------------------------


def test_a_held_router_goes_to_the_whole_regexmatch_leaf_not_only_its_anchors_node() -> None:
    # Measured before: leaf ^node[01]$, prefill and decode on node1, and the router pinned to node1
    # alone (the tree was built from the anchors' own nodes), Pending while node0 was empty.
    leaf = regex_leaf("^node[01]$")
    index = index_of(
        service(HARD1, ROUTED), roleset(roles=ROUTED),
        pod("p", "prefill", "node1"), pod("d", "decode", "node1"), pod("r", "router", held=True),
        hypernodes=[leaf], nodes=["node0", "node1", "node2"],
    )  # fmt: skip
    assert released_to(plan_replica(snapshot(index), ReplicaMemory()).writes) == ["node0", "node1"]


def test_a_held_router_waits_for_every_anchor_and_is_pinned_by_hostname() -> None:
    index = index_of(
        service(HARD1, ROUTED), roleset(roles=ROUTED), pod("p", "prefill", "node4"), pod("d", "decode"), pod("r", "router", held=True)
    )
    plan = plan_replica(snapshot(index), ReplicaMemory())
    assert not plan.needs_all_pods  # every anchor is known: no API read, its binding comes as an event
    assert not [w for w in plan.writes if isinstance(w, PatchPod)]
    index.observe("Pod", "MODIFIED", pod("d", "decode", "node5"))
    assert released_to(plan_replica(snapshot(index), ReplicaMemory()).writes) == ["node4", "node5"]  # leaf s2


def test_without_unique_hostnames_a_release_pins_by_node_name() -> None:
    index = index_of(
        service(HARD1, ROUTED), roleset(roles=ROUTED),
        pod("p", "prefill", "node4"), pod("d", "decode", "node5"), pod("r", "router", held=True),
    )  # fmt: skip
    index.set_nodes(
        {**{f"node{i}": {"kubernetes.io/hostname": f"node{i}"} for i in range(8)}, "node6": {"kubernetes.io/hostname": "node4"}}, 0
    )
    (patch,) = [w for w in plan_replica(snapshot(index), ReplicaMemory()).writes if isinstance(w, PatchPod)]
    terms = patch.ops[2]["value"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [n]}]} for n in ("node4", "node5")]


def test_a_node_the_last_reading_lacked_is_read_again_before_a_release_or_a_verdict() -> None:
    leaf = regex_leaf("^node[0-9]$")
    index = index_of(
        service(HARD1, ROUTED), roleset(roles=ROUTED),
        pod("p", "prefill", "node1"), pod("d", "decode", "node9"), pod("r", "router", held=True),
        hypernodes=[leaf], nodes=["node0", "node1"],
    )  # fmt: skip
    plan = plan_replica(snapshot(index), ReplicaMemory())
    assert plan.needs_nodes and plan.writes == () and plan.says == ()  # node9 is newer than the reading
    index.set_nodes({n: {"kubernetes.io/hostname": n} for n in ("node0", "node1", "node9")}, 100.0)
    assert released_to(plan_replica(snapshot(index), ReplicaMemory()).writes) == ["node0", "node1", "node9"]


def test_anchors_created_before_the_opt_in_are_read_and_release_the_router() -> None:
    # Live opt-in: prefill and decode ran before, so stormtopo never admitted (nor watches) them.
    index = index_of(service(HARD1, ROUTED), roleset(roles=ROUTED), pod("r", "router", held=True))
    plan = plan_replica(snapshot(index), ReplicaMemory())
    assert plan.needs_all_pods and plan.writes == ()
    unadmitted = [pod("p", "prefill", "node4"), pod("d", "decode", "node5")]
    for p in unadmitted:
        del p["metadata"]["labels"]["stormtopo.io/admitted"]
    read = replace(snapshot(index), pods=(*unadmitted, pod("r", "router", held=True)), all_pods=True)
    assert released_to(plan_replica(read, ReplicaMemory()).writes) == ["node4", "node5"]


def test_a_placed_replica_with_pods_from_before_the_opt_in_reads_and_adopts_them_once() -> None:
    # Volcano counts a pod without volcano.sh/task-spec in no role: with minTaskMember the gang turns
    # invalid, and no replacement pod of it is ever placed (measured: router Pending, "actual: map[:2]").
    running = {**unschedulable_group(), "status": {"phase": "Running"}}
    index = index_of(service(HARD1, ROUTED), roleset(roles=ROUTED), running, pod("r", "router", "node4"))
    plan = plan_replica(snapshot(index, now=100.0), ReplicaMemory())
    assert plan.needs_all_pods
    old = [pod("p", "prefill", "node4"), pod("d", "decode", "node5")]
    for p in old:
        del p["metadata"]["labels"]["stormtopo.io/admitted"]
    read = replace(snapshot(index, now=100.0), pods=(*old, pod("r", "router", "node4")), all_pods=True)
    adopted = [w for w in plan_replica(read, ReplicaMemory(pods_read_at=100.0)).writes if isinstance(w, AdoptPod)]
    assert adopted == [
        AdoptPod(
            "ns", "p", {"stormtopo.io/admitted": "true"}, {"scheduling.k8s.io/group-name": "svc-rs", "volcano.sh/task-spec": "prefill"}
        ),
        AdoptPod(
            "ns", "d", {"stormtopo.io/admitted": "true"}, {"scheduling.k8s.io/group-name": "svc-rs", "volcano.sh/task-spec": "decode"}
        ),
    ]
    assert not plan_replica(snapshot(index, now=110.0), ReplicaMemory(pods_read_at=100.0)).needs_all_pods  # not again within 30 s
    plain = index_of(service(None, ROUTED), roleset(roles=ROUTED), running, pod("r", "router", "node4"))
    assert not plan_replica(snapshot(plain), ReplicaMemory()).needs_all_pods  # never for a service that did not opt in


def test_a_pod_of_another_service_with_this_rolesets_name_is_no_anchor() -> None:
    stranger = pod("x", "prefill", "node0", service="other")
    index = index_of(service(HARD1, ROUTED), roleset(roles=ROUTED), stranger, pod("d", "decode", "node4"), pod("r", "router", held=True))
    unbound = plan_replica(replace(snapshot(index), all_pods=True), ReplicaMemory())
    assert not [w for w in unbound.writes if isinstance(w, PatchPod)]  # its own prefill is not bound
    index.observe("Pod", "ADDED", pod("p", "prefill", "node5"))
    assert released_to(plan_replica(snapshot(index), ReplicaMemory()).writes) == ["node4", "node5"]


def test_held_pods_of_a_service_that_opted_out_go_free_without_affinity() -> None:
    index = index_of(service(None, ROUTED), roleset(roles=ROUTED), pod("r", "router", held=True))
    (release,) = plan_replica(snapshot(index), ReplicaMemory()).writes
    assert isinstance(release, PatchPod) and [op["op"] for op in release.ops] == ["test", "remove"]


def test_a_released_router_that_cannot_fit_its_domain_is_said_once() -> None:
    unschedulable = {
        "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/2 nodes: Too many pods"}]
    }
    index = index_of(
        service(HARD1, ROUTED), roleset(roles=ROUTED),
        pod("p", "prefill", "node4"), pod("d", "decode", "node5"), pod("r", "router", status=unschedulable),
    )  # fmt: skip
    plan = plan_replica(snapshot(index), ReplicaMemory())
    (warning,) = [s for s in plan.says if s.reason == "ReleasedPodUnschedulable"]
    assert "pod r" in warning.message and "Too many pods" in warning.message
    assert not [s for s in plan_replica(snapshot(index), plan.memory).says if s.reason == "ReleasedPodUnschedulable"]


# -- placed and violated --------------------------------------------------------------------------


def test_a_complete_replica_is_said_recorded_and_labelled_once() -> None:
    index = index_of(service(HARD1), roleset(), pod("p", "prefill", "node4"), pod("d", "decode", "node5"))
    plan = plan_replica(snapshot(index), ReplicaMemory())
    assert [s.reason for s in plan.says] == ["ReplicaPlaced"]
    (record,) = [w for w in plan.writes if isinstance(w, RecordPlacement)]
    assert record.record == {"v": 1, "hyperNode": "s2", "tier": 1, "nodes": ["node4", "node5"]} and record.live == ("svc-rs",)
    assert plan.first is not None and plan.first.tier == 1
    assert any(isinstance(w, LabelPod) for w in plan.writes)
    again = plan_replica(snapshot(index), plan.memory)
    assert again.says == () and again.first is None  # said once
    # After a restart (no memory) the record on the StormService keeps it from being said or recorded again.
    recorded = service(HARD1)
    recorded["metadata"].setdefault("annotations", {})[PLACEMENT_ANNOTATION] = (
        '{"svc-rs":{"hyperNode":"s2","nodes":["node4","node5"],"tier":1,"v":1}}'
    )
    index.observe("StormService", "MODIFIED", recorded)
    restarted = plan_replica(snapshot(index), ReplicaMemory())
    assert restarted.says == () and not [w for w in restarted.writes if isinstance(w, RecordPlacement)]
    # Nor after an upgrade from the release before, whose records carry no version: not said nor written again.
    recorded["metadata"]["annotations"][PLACEMENT_ANNOTATION] = '{"svc-rs":{"hyperNode":"s2","nodes":["node4","node5"],"tier":1}}'
    index.observe("StormService", "MODIFIED", recorded)
    upgraded = plan_replica(snapshot(index), ReplicaMemory())
    assert upgraded.says == () and not [w for w in upgraded.writes if isinstance(w, RecordPlacement)]


def test_a_partly_bound_replica_is_not_said_placed_yet() -> None:
    index = index_of(service(HARD1), roleset(), pod("p", "prefill", "node4"), pod("d", "decode"))
    plan = plan_replica(snapshot(index), ReplicaMemory())
    assert plan.says == () and not [w for w in plan.writes if isinstance(w, RecordPlacement)]


def test_a_violation_is_said_once_and_counted_once() -> None:
    index = index_of(service(HARD1), roleset(), pod("p", "prefill", "node0"), pod("d", "decode", "node4"))
    plan = plan_replica(snapshot(index), ReplicaMemory())
    assert [s.reason for s in plan.says] == ["ReplicaPlaced", "TopologyViolated"] and plan.violations == 1
    again = plan_replica(snapshot(index), plan.memory)
    assert again.says == () and again.violations == 0


# -- pending, say-once and back-off ---------------------------------------------------------------


def unschedulable_group() -> dict[str, Any]:
    return podgroup("svc-rs", labels={"roleset-name": "svc-rs"}, spec={}, unschedulable="", kind=True)


def test_a_pending_hard_gang_is_explained_once_all_its_pods_exist_and_not_before_its_next_check() -> None:
    index = index_of(service(HARD1), roleset(), unschedulable_group(), pod("p", "prefill"))
    assert plan_replica(snapshot(index), ReplicaMemory()).explain is None  # AIBrix still creating decode
    index.observe("Pod", "ADDED", pod("d", "decode"))
    plan = plan_replica(snapshot(index, now=100.0), ReplicaMemory())
    assert plan.explain is not None and plan.explain.pods == (1, 1) and plan.memory.next_check == 100.0 + EXPLAIN_INTERVAL
    assert plan_replica(snapshot(index, now=105.0), plan.memory).explain is None
    assert plan_replica(snapshot(index, now=111.0), plan.memory).explain is not None


def test_an_explanation_is_said_once_then_checked_at_doubling_intervals_and_settles_when_it_fits() -> None:
    index = index_of(service(HARD1), roleset(), unschedulable_group(), pod("p", "prefill"), pod("d", "decode"))
    ask = plan_replica(snapshot(index), ReplicaMemory()).explain
    assert ask is not None
    short = Pending(1, Explanation((1, 1), 1, (), None))
    first = plan_explained(KEY, ask.request, short, ReplicaMemory(), 100.0)
    assert [s.reason for s in first.says] == ["TopologyUnsatisfiable"] and first.memory.unsatisfiable
    second = plan_explained(KEY, ask.request, short, first.memory, 110.0)
    assert second.says == () and second.memory.interval == 2 * EXPLAIN_INTERVAL and second.memory.next_check == 110.0 + 20.0
    third = plan_explained(KEY, ask.request, short, second.memory, 130.0)
    assert third.memory.interval == 4 * EXPLAIN_INTERVAL
    shorter = Pending(1, Explanation((1, 1, 1), 1, (), None))  # a new message: said, and the back-off starts over
    changed = plan_explained(KEY, ask.request, shorter, third.memory, 170.0)
    assert changed.says and changed.memory.interval == EXPLAIN_INTERVAL
    bound = plan_replica(snapshot(index), third.memory)
    assert bound.memory.unsatisfiable  # still pending
    index.observe("Pod", "MODIFIED", pod("p", "prefill", "node4"))
    index.observe("Pod", "MODIFIED", pod("d", "decode", "node5"))
    assert not plan_replica(snapshot(index), third.memory).memory.unsatisfiable  # placed: leaves the gauge


def test_an_invalid_request_settles_the_replica_and_explains_nothing() -> None:
    index = index_of(service({MODE: "hard", HIGHEST_TIER: "9"}), roleset(), unschedulable_group(), pod("p", "prefill"), pod("d", "decode"))
    plan = plan_replica(snapshot(index), ReplicaMemory(unsatisfiable=True))
    assert plan.explain is None and not plan.memory.unsatisfiable and plan.says == ()


# -- a typo strands nothing; withdrawing survives a half-done withdrawal ---------------------------

TIERS = ClusterTiers(frozenset({1, 2, 3}))


def test_an_invalid_request_without_a_kept_constraint_leaves_the_pod_as_without_stormtopo() -> None:
    typo = {MODE: "hard"}  # no tier
    bare = {
        "metadata": {"labels": {"role-name": "router", "storm-service-name": "svc"}},
        "spec": {"containers": [{}], "schedulerName": "default-scheduler"},
    }
    decision = admit_pod(bare, roleset(roles=ROUTED), service(typo, ROUTED), TIERS)
    assert decision.patch == [{"op": "add", "path": "/metadata/labels/stormtopo.io~1admitted", "value": "true"}]
    aibrix = {**bare, "metadata": {**bare["metadata"], "annotations": {"scheduling.k8s.io/group-name": "svc-rs"}}}
    scoped = admit_pod(aibrix, roleset(roles=ROUTED), service({MODE: "hard", HIGHEST_TIER: "9", SCOPE: "StormService"}, ROUTED), TIERS)
    assert [op["path"] for op in scoped.patch] == ["/metadata/labels/stormtopo.io~1admitted"]  # stays in AIBrix's gang
    kept = {
        "metadata": {"name": "svc-rs", "annotations": {REQUEST_ANNOTATION: "hard within tier 1"}},
        "spec": {"networkTopology": {"mode": "hard"}},
    }
    joined = admit_pod(bare, roleset(roles=ROUTED), service(typo, ROUTED), TIERS, podgroups={"svc-rs": kept})
    assert any(op["path"] == "/metadata/annotations" for op in joined.patch)  # the last valid constraint keeps its gang


def test_withdrawing_from_a_half_withdrawn_own_podgroup_still_removes_its_topology() -> None:
    own = {"metadata": {"name": "svc-rs", "namespace": "ns", "labels": {"app.kubernetes.io/managed-by": "stormtopo"}, "annotations": {}},
           "spec": {"networkTopology": {"mode": "hard", "highestTierAllowed": 1}}}  # fmt: skip
    plan = plan_stormservice(ServiceSnapshot(service(None), (roleset(),), {"svc-rs": own}, TIERS))
    assert plan.writes == (PatchPodGroup("ns", "svc-rs", [{"op": "remove", "path": "/spec/networkTopology"}]),)
    aibrixs = {**own, "metadata": {"name": "svc-rs", "namespace": "ns", "annotations": {}}}
    assert plan_stormservice(ServiceSnapshot(service(None), (roleset(),), {"svc-rs": aibrixs}, TIERS)).writes == ()


def test_a_podgroup_with_the_topology_but_without_the_request_annotation_gets_it_back() -> None:
    spec = {"minMember": 2, "minTaskMember": {"prefill": 1, "decode": 1}, "networkTopology": {"mode": "hard", "highestTierAllowed": 1}}
    bare = {"metadata": {"name": "svc-rs", "namespace": "ns", "annotations": {}}, "spec": spec}
    (write,) = plan_stormservice(ServiceSnapshot(service(HARD1), (roleset(),), {"svc-rs": bare}, TIERS)).writes
    assert isinstance(write, PatchPodGroup) and write.ops == [
        {"op": "add", "path": "/metadata/annotations", "value": {REQUEST_ANNOTATION: HARD_TIER_1_RECORD}}
    ]
