"""The planners: every decision the operator makes, as a pure function of a snapshot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stormtopo.core.admission import admit_podgroup
from stormtopo.core.capabilities import cluster_tiers
from stormtopo.core.explanation import plan_pending
from stormtopo.core.jsonpatch import pointer, set_annotations
from stormtopo.core.ownership import roleset_name, stormservice_name
from stormtopo.core.packing import Fit, fits
from stormtopo.core.placement import label_value, plan_placed
from stormtopo.core.reconciliation import ServiceSnapshot, plan_stormservice
from stormtopo.core.request import ClusterTiers, TopologyRequest, parse_request
from stormtopo.core.topology.fabric import parse_topology
from stormtopo.core.vocabulary import HIGHEST_TIER, MODE, REQUEST_ANNOTATION, SCOPE
from stormtopo.core.writes import CreatePodGroup, LabelPod, PatchPodGroup
from tests.builders import HARD_TIER_1_RECORD, aibrix_roleset, pod, podgroup, service

EXAMPLE = parse_topology((Path(__file__).resolve().parents[2] / "examples" / "topology" / "aibrix-1730.yaml").read_text())
TIERS = ClusterTiers(frozenset({1, 2, 3}))
HARD1 = {MODE: "hard", HIGHEST_TIER: "1"}


def request(annotations: dict[str, str]) -> TopologyRequest:
    parsed = parse_request(annotations, TIERS)
    assert parsed is not None
    return parsed


def constrained_podgroup() -> dict[str, Any]:
    return podgroup(
        "svc-roleset-abcde",
        annotations={REQUEST_ANNOTATION: HARD_TIER_1_RECORD},
        spec={"minMember": 2, "minTaskMember": {"prefill": 1, "decode": 1}, "networkTopology": {"mode": "hard", "highestTierAllowed": 1}},
    )


# -- reconciliation ------------------------------------------------------------------------------


def test_a_replica_without_a_strategy_gets_a_podgroup_and_one_with_a_strategy_waits_for_aibrixs() -> None:
    without = plan_stormservice(
        ServiceSnapshot(service(HARD1, volcano_strategy=False, uid="svc-uid"), (aibrix_roleset(volcano_strategy=False),), {}, TIERS)
    )
    assert [type(w) for w in without.writes] == [CreatePodGroup]
    assert without.say is not None and without.say.reason == "TopologyRequest"
    with_strategy = plan_stormservice(ServiceSnapshot(service(HARD1, uid="svc-uid"), (aibrix_roleset(),), {}, TIERS))
    assert with_strategy.writes == ()


def test_a_podgroup_that_matches_plans_nothing_and_what_was_said_is_not_said_again() -> None:
    first = plan_stormservice(
        ServiceSnapshot(service(HARD1, uid="svc-uid"), (aibrix_roleset(),), {"svc-roleset-abcde": constrained_podgroup()}, TIERS)
    )
    assert first.writes == ()
    again = plan_stormservice(
        ServiceSnapshot(service(HARD1, uid="svc-uid"), (aibrix_roleset(),), {"svc-roleset-abcde": constrained_podgroup()}, TIERS),
        first.verdict,
    )
    assert again.say is None and again.verdict == first.verdict


def test_a_stripped_podgroup_is_patched_back() -> None:
    stripped = constrained_podgroup()
    del stripped["spec"]["networkTopology"]
    plan = plan_stormservice(ServiceSnapshot(service(HARD1, uid="svc-uid"), (aibrix_roleset(),), {"svc-roleset-abcde": stripped}, TIERS))
    assert plan.writes == (
        PatchPodGroup(
            "ns", "svc-roleset-abcde", [{"op": "add", "path": "/spec/networkTopology", "value": {"mode": "hard", "highestTierAllowed": 1}}]
        ),
    )


def test_opting_out_withdraws_the_constraint() -> None:
    plan = plan_stormservice(
        ServiceSnapshot(service(None, uid="svc-uid"), (aibrix_roleset(),), {"svc-roleset-abcde": constrained_podgroup()}, TIERS)
    )
    # Two writes, the annotation first: the admission policy refuses stripping a PodGroup that carries it.
    assert plan.writes == (
        PatchPodGroup("ns", "svc-roleset-abcde", [{"op": "remove", "path": "/metadata/annotations/stormtopo.io~1request"}]),
        PatchPodGroup("ns", "svc-roleset-abcde", [{"op": "remove", "path": "/spec/networkTopology"}]),
    )
    assert plan.say is None and plan.verdict is None


def test_an_invalid_request_writes_nothing_and_says_the_last_valid_one_stays() -> None:
    bad = {MODE: "hard", HIGHEST_TIER: "7"}
    plan = plan_stormservice(
        ServiceSnapshot(service(bad, uid="svc-uid"), (aibrix_roleset(),), {"svc-roleset-abcde": constrained_podgroup()}, TIERS)
    )
    assert plan.writes == () and plan.invalid
    assert plan.say is not None and plan.say.type == "Warning"
    assert "the last valid request stays applied" in plan.say.message and "'7' is deeper than any HyperNode" in plan.say.message
    fresh = plan_stormservice(ServiceSnapshot(service(bad, uid="svc-uid"), (aibrix_roleset(),), {}, TIERS))
    assert fresh.say is not None and "nothing changed" in fresh.say.message


def test_scope_stormservice_creates_the_services_podgroup_owned_by_it() -> None:
    plan = plan_stormservice(ServiceSnapshot(service({**HARD1, SCOPE: "StormService"}, uid="svc-uid"), (aibrix_roleset(),), {}, TIERS))
    (create,) = plan.writes
    assert isinstance(create, CreatePodGroup)
    assert create.body["metadata"]["name"] == "svc" and create.body["metadata"]["ownerReferences"][0]["kind"] == "StormService"


# -- admission while a request is invalid -------------------------------------------------------


def test_aibrixs_update_keeps_the_last_valid_constraint_while_the_request_is_invalid() -> None:
    old = constrained_podgroup()
    aibrix_update = {"metadata": {"name": "svc-roleset-abcde", "namespace": "ns"}, "spec": {"minMember": 2, "queue": "default"}}
    decision = admit_podgroup(
        aibrix_update, aibrix_roleset(), service({MODE: "hard", HIGHEST_TIER: "typo"}, uid="svc-uid"), TIERS, last_valid=old, old=old
    )
    ops = {op["path"]: op["value"] for op in decision.patch}
    assert ops["/spec/networkTopology"] == {"mode": "hard", "highestTierAllowed": 1}
    assert ops["/spec/minTaskMember"] == {"prefill": 1, "decode": 1}
    assert ops["/metadata/annotations"] == {REQUEST_ANNOTATION: HARD_TIER_1_RECORD}


def test_aibrixs_rewrite_of_a_pending_replica_keeps_volcanos_status_and_foreign_metadata() -> None:
    """AIBrix rebuilds its PodGroup from scratch: no status, only its own label. Kept from the stored
    PodGroup, the rewrite changes nothing and the API server stores no new version."""
    stored = constrained_podgroup()
    stored["metadata"]["labels"] = {"roleset-name": "svc-roleset-abcde", "team": "a"}
    stored["metadata"]["annotations"]["volcano.sh/job-allocated-hypernode"] = "s2"
    stored["status"] = {"phase": "Pending", "conditions": [{"type": "Unschedulable", "status": "True"}]}
    stored["spec"]["queue"] = "default"
    rewrite = {
        "metadata": {"name": "svc-roleset-abcde", "namespace": "ns", "labels": {"roleset-name": "svc-roleset-abcde"}},
        "spec": {"minMember": 2, "queue": "default"},
        "status": {},
    }
    moved = admit_podgroup(
        {**rewrite, "spec": {"minMember": 2, "queue": "other"}}, aibrix_roleset(), service(HARD1, uid="svc-uid"), TIERS, stored, stored
    )
    assert "/status" not in {op["path"] for op in moved.patch}  # a new queue is admitted anew: no status kept
    decision = admit_podgroup(rewrite, aibrix_roleset(), service(HARD1, uid="svc-uid"), TIERS, last_valid=stored, old=stored)
    ops = {op["path"]: op["value"] for op in decision.patch}
    assert ops["/status"] == stored["status"]
    assert ops["/metadata/labels/team"] == "a"
    assert ops["/metadata/annotations"] == {"volcano.sh/job-allocated-hypernode": "s2", REQUEST_ANNOTATION: request(HARD1).record()}
    assert "/spec/networkTopology" in ops


def test_a_new_replica_takes_only_the_topology_of_a_sibling_while_the_request_is_invalid() -> None:
    new = {"metadata": {"name": "svc-roleset-fghij", "namespace": "ns"}, "spec": {"minMember": 4, "queue": "default"}}
    decision = admit_podgroup(
        new, aibrix_roleset(), service({MODE: "hard", HIGHEST_TIER: "typo"}, uid="svc-uid"), TIERS, last_valid=constrained_podgroup()
    )
    paths = {op["path"] for op in decision.patch}
    assert "/spec/networkTopology" in paths and "/spec/minMember" not in paths


# -- placement -----------------------------------------------------------------------------------


def test_a_replica_within_its_tier_is_recorded_and_labelled_without_a_warning() -> None:
    placed = plan_placed(EXAMPLE, request(HARD1), 1, "r1", [pod("p", "prefill", "node4"), pod("d", "decode", "node5")])
    assert placed is not None and not placed.violated
    assert placed.record == {"v": 1, "hyperNode": "s2", "tier": 1, "nodes": ["node4", "node5"]}
    assert [s.reason for s in placed.says] == ["ReplicaPlaced"]
    assert (
        LabelPod(
            "ns", "p", {"stormtopo.io/hypernode-tier-1": "s2", "stormtopo.io/hypernode-tier-2": "s5", "stormtopo.io/hypernode-tier-3": "s6"}
        )
        in placed.labels
    )


def test_a_hard_replica_across_its_tier_is_a_violation_naming_pods_and_nodes() -> None:
    placed = plan_placed(EXAMPLE, request(HARD1), 1, "r1", [pod("p", "prefill", "node0"), pod("d", "decode", "node4")])
    assert placed is not None and placed.violated and placed.record["violated"] is True
    warning = placed.says[-1]
    assert warning.reason == "TopologyViolated" and warning.type == "Warning"
    assert "p on node0" in warning.message and "d on node4" in warning.message and "tier 1" in warning.message


def test_a_soft_replica_is_never_a_violation_and_nothing_bound_plans_nothing() -> None:
    placed = plan_placed(EXAMPLE, request({MODE: "soft"}), None, "r1", [pod("p", "prefill", "node0"), pod("d", "decode", "node4")])
    assert placed is not None and not placed.violated
    assert plan_placed(EXAMPLE, request(HARD1), 1, "r1", [{"metadata": {"name": "p"}, "spec": {}}]) is None


def test_labels_already_there_are_not_written_again_and_long_names_fit_a_label_value() -> None:
    labels = {"stormtopo.io/hypernode-tier-1": "s2", "stormtopo.io/hypernode-tier-2": "s5", "stormtopo.io/hypernode-tier-3": "s6"}
    placed = plan_placed(EXAMPLE, request(HARD1), 1, "r1", [pod("p", "prefill", "node4", labels=labels)])
    assert placed is not None and placed.labels == ()
    long = "leaf-" + "x" * 120
    value = label_value(long)
    assert len(value) <= 63 and value != label_value(long + "y") and label_value("s2") == "s2"


# -- pending -------------------------------------------------------------------------------------


def test_a_pending_hard_gang_is_explained_only_once_all_its_pods_exist() -> None:
    free = {f"node{i}": 8 for i in range(8)} | {"node0": 4, "node2": 4, "node4": 4, "node6": 4}
    assert plan_pending(request(HARD1), [6, 6], 1, EXAMPLE, free) is None  # AIBrix still creating the pods
    assert plan_pending(request({MODE: "soft"}), [6, 6], 2, EXAMPLE, free) is None
    pending = plan_pending(request(HARD1), [6, 6], 2, EXAMPLE, free)
    assert pending is not None and pending.tier == 1 and not pending.explanation.fits
    assert pending.explanation.wider_tier == 2


def test_the_exact_search_stops_at_its_budget_and_says_so() -> None:
    # Exact search finds 5+3+2 | 4+4+2; with no budget first-fit answers, wrongly, and says it is unsure.
    assert fits([10, 10], [5, 4, 4, 3, 2, 2]) == Fit(True, True)
    assert fits([10, 10], [5, 4, 4, 3, 2, 2], budget=1) == Fit(False, False)


# -- small shared pieces -------------------------------------------------------------------------


def test_json_pointers_escape_tilde_and_slash() -> None:
    assert pointer("metadata", "annotations", "a~b/c") == "/metadata/annotations/a~0b~1c"
    assert set_annotations({"metadata": {"annotations": {"k": "v"}}}, {"k": "v"}) == []


def test_owners_by_label_then_owner_reference() -> None:
    by_ref = {"metadata": {"ownerReferences": [{"kind": "StormService", "name": "svc"}, {"kind": "RoleSet", "name": "r"}]}}
    assert stormservice_name(by_ref) == "svc" and roleset_name(by_ref) == "r"
    by_label = {
        "metadata": {"labels": {"storm-service-name": "a", "roleset-name": "b"}, "ownerReferences": by_ref["metadata"]["ownerReferences"]}
    }
    assert stormservice_name(by_label) == "a" and roleset_name(by_label) == "b"
    assert stormservice_name({"metadata": {}}) is None


def test_capabilities_come_from_the_podgroup_crd() -> None:
    hypernodes = [{"spec": {"tier": 1, "tierName": "leaf"}}, {"spec": {"tier": 2}}]
    old = {"properties": {"spec": {"properties": {"networkTopology": {"properties": {"mode": {}, "highestTierAllowed": {}}}}}}}
    tiers = cluster_tiers(hypernodes, old)
    assert tiers.tiers == {1, 2} and tiers.tier_names == {"leaf"}
    assert tiers.has_network_topology and not tiers.has_tier_name_field and not tiers.has_subgroup_policy
    assert cluster_tiers(hypernodes, None).has_subgroup_policy


def test_node_labels_are_needed_only_when_a_hypernode_selects_nodes_by_label() -> None:
    from stormtopo.core.topology.hypernodes import hypernode_manifests, selects_by_label

    assert not selects_by_label(hypernode_manifests(EXAMPLE))
    by_label = {"spec": {"tier": 1, "members": [{"type": "Node", "selector": {"labelMatch": {"matchLabels": {"rack": "a"}}}}]}}
    assert selects_by_label([*hypernode_manifests(EXAMPLE), by_label])


# -- roles whose pods ask for no resources -------------------------------------------------------


def router_replica() -> dict[str, Any]:
    from stormtopo.devenv.workloads import Role

    return aibrix_roleset((Role("prefill", gpus=2), Role("router", replicas=2, requests=False)))


def test_roles_without_requests_follow_the_gang_under_a_hard_request() -> None:
    from stormtopo.core.gang import followers
    from stormtopo.core.podgroup import desired_fields

    spec = router_replica()["spec"]
    assert followers(spec) == {"router"}
    assert desired_fields(request(HARD1), spec)["minTaskMember"] == {"prefill": 1}
    assert desired_fields(request({MODE: "soft"}), spec)["minTaskMember"] == {"prefill": 1, "router": 2}
    only_idle = {"roles": [{"name": "a", "template": {"spec": {"containers": [{}]}}}]}
    assert followers(only_idle) == frozenset()  # nothing to follow: every role is the gang


def test_a_pod_without_requests_is_held_at_stormtopos_gate_and_one_with_requests_is_not() -> None:
    from stormtopo.core.admission import admit_pod

    router = {"metadata": {"labels": {"role-name": "router", "storm-service-name": "svc"}}, "spec": {"containers": [{}]}}
    decision = admit_pod(router, router_replica(), service(HARD1, uid="svc-uid"), TIERS)
    assert {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": "stormtopo.io/domain"}]} in decision.patch
    prefill = {"metadata": {"labels": {"role-name": "prefill", "storm-service-name": "svc"}}, "spec": {"containers": [{}]}}
    assert not any(
        "schedulingGates" in op["path"] for op in admit_pod(prefill, router_replica(), service(HARD1, uid="svc-uid"), TIERS).patch
    )
    gated = {**router, "spec": {"containers": [{}], "schedulingGates": [{"name": "stormtopo.io/domain"}]}}
    assert not any("schedulingGates" in op["path"] for op in admit_pod(gated, router_replica(), service(HARD1, uid="svc-uid"), TIERS).patch)
    soft = admit_pod(router, router_replica(), service({MODE: "soft"}, uid="svc-uid"), TIERS)
    assert not any("schedulingGates" in op["path"] for op in soft.patch)


def test_held_pods_are_released_into_their_anchors_domain_once_every_anchor_is_bound() -> None:
    from stormtopo.core.placement import plan_release

    held = {
        "metadata": {"name": "router-0", "namespace": "ns"},
        "spec": {"schedulingGates": [{"name": "other"}, {"name": "stormtopo.io/domain"}]},
    }
    assert plan_release(EXAMPLE, [pod("p", "prefill", "node4")], 2, [held]) == []  # one anchor of two bound
    (release,) = plan_release(EXAMPLE, [pod("p", "prefill", "node4"), pod("d", "decode", "node5")], 2, [held])
    assert release.ops[:2] == [
        {"op": "test", "path": "/spec/schedulingGates/1/name", "value": "stormtopo.io/domain"},
        {"op": "remove", "path": "/spec/schedulingGates/1"},
    ]
    # Hostnames unknown: one term per node of leaf s2 (a node-name field selector takes exactly one value).
    terms = [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [n]}]} for n in ("node4", "node5")]
    assert release.ops[2] == {
        "op": "add",
        "path": "/spec/affinity",
        "value": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}},
    }


def test_a_held_pods_own_node_affinity_is_narrowed_never_replaced() -> None:
    from stormtopo.core.placement import plan_release

    terms = [
        {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node4"]}]},
    ]
    held = {
        "metadata": {"name": "router-0", "namespace": "ns"},
        "spec": {
            "schedulingGates": [{"name": "stormtopo.io/domain"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}},
        },
    }
    (release,) = plan_release(EXAMPLE, [pod("p", "prefill", "node4")], 1, [held])
    base = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms"
    assert [op["path"] for op in release.ops[2:]] == [f"{base}/0/matchExpressions/-", f"{base}/1/matchExpressions"]
    assert release.ops[2]["value"] == {"key": "kubernetes.io/hostname", "operator": "In", "values": ["node4", "node5"]}


def test_a_hard_replica_of_roles_that_all_ask_for_nothing_is_said_to_be_unenforceable() -> None:
    from stormtopo.devenv.workloads import Role

    idle = service(HARD1, (Role("sim", requests=False), Role("router", requests=False)))
    plan = plan_stormservice(ServiceSnapshot(idle, (), {}, TIERS))
    assert plan.say is not None and plan.say.type == "Warning" and plan.say.reason == "TopologyNotEnforceable"
    assert "roles sim, router" in plan.say.message and not plan.invalid


def test_pods_prefer_the_node_of_their_replicas_other_pods_added_to_what_they_prefer() -> None:
    from stormtopo.core.admission import admit_pod, prefer_replica_peers

    bare = {"metadata": {"labels": {"role-name": "decode", "storm-service-name": "svc"}}, "spec": {}}
    assert not [
        op
        for op in admit_pod(bare, aibrix_roleset(), service(HARD1, uid="svc-uid"), TIERS).patch
        if op["path"].startswith("/spec/affinity")
    ]
    asked = service({**HARD1, "stormtopo.io/prefer-same-node": "true"}, uid="svc-uid")
    (op,) = [op for op in admit_pod(bare, aibrix_roleset(), asked, TIERS).patch if op["path"].startswith("/spec/affinity")]
    term = op["value"]["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert term == {
        "weight": 100,
        "podAffinityTerm": {
            "labelSelector": {"matchLabels": {"roleset-name": "svc-roleset-abcde"}},
            "topologyKey": "kubernetes.io/hostname",
        },
    }
    theirs = {"weight": 5, "podAffinityTerm": {"labelSelector": {}, "topologyKey": "zone"}}
    own = {"spec": {"affinity": {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [theirs]}}}}
    assert prefer_replica_peers(own, "r") == [
        {
            "op": "add",
            "path": "/spec/affinity/podAffinity/preferredDuringSchedulingIgnoredDuringExecution/-",
            "value": {
                "weight": 100,
                "podAffinityTerm": {"labelSelector": {"matchLabels": {"roleset-name": "r"}}, "topologyKey": "kubernetes.io/hostname"},
            },
        }
    ]


def test_switching_to_scope_stormservice_withdraws_the_replicas_own_constraint() -> None:
    snapshot = ServiceSnapshot(
        service({**HARD1, SCOPE: "StormService"}, uid="svc-uid"), (aibrix_roleset(),), {"svc-roleset-abcde": constrained_podgroup()}, TIERS
    )
    writes = plan_stormservice(snapshot).writes
    assert isinstance(writes[0], CreatePodGroup)
    assert PatchPodGroup("ns", "svc-roleset-abcde", [{"op": "remove", "path": "/metadata/annotations/stormtopo.io~1request"}]) in writes


def test_terminating_or_finished_pods_are_no_anchor_and_held_pods_of_an_opted_out_service_go_free() -> None:
    from stormtopo.core.placement import EMPTY_TOPOLOGY, is_live, plan_release

    assert is_live(pod("p", "prefill", "node4"))
    assert not is_live({**pod("p", "prefill", "node4"), "metadata": {"name": "p", "deletionTimestamp": "2026-11-30T00:00:00Z"}})
    assert not is_live({**pod("p", "prefill", "node4"), "status": {"phase": "Failed"}})
    held = {"metadata": {"name": "router-0", "namespace": "ns"}, "spec": {"schedulingGates": [{"name": "stormtopo.io/domain"}]}}
    (release,) = plan_release(EMPTY_TOPOLOGY, [], 0, [held])
    assert [op["op"] for op in release.ops] == ["test", "remove"]  # the gate goes, no affinity is set


def test_the_listing_and_the_event_are_writes_carried_out_first() -> None:
    from stormtopo.core.writes import ListOptedIn, PostEvent

    ss = service(HARD1, volcano_strategy=False, uid="svc-uid")
    plan = plan_stormservice(ServiceSnapshot(ss, (aibrix_roleset(volcano_strategy=False),), {}, TIERS))
    first, listed, create = plan.all_writes(ss)
    assert isinstance(first, PostEvent) and first.say.reason == "TopologyRequest"
    assert listed == ListOptedIn("ns", "svc", "RoleSet") and isinstance(create, CreatePodGroup)
    invalid = plan_stormservice(ServiceSnapshot(service({MODE: "hard", HIGHEST_TIER: "7"}, uid="svc-uid"), (aibrix_roleset(),), {}, TIERS))
    assert invalid.listing == ListOptedIn("ns", "svc", "RoleSet")  # still listed: its last valid constraint is kept
    plain = plan_stormservice(ServiceSnapshot(service(None, uid="svc-uid"), (aibrix_roleset(),), {}, TIERS))
    assert plain.all_writes(service(None, uid="svc-uid")) == (ListOptedIn("ns", "svc", None),)


def test_a_heal_annotation_that_is_not_understood_is_said_and_healing_stays_off() -> None:
    from stormtopo.core.heal_request import wants_healing

    typo = service({**HARD1, "stormtopo.io/heal": "yes"}, uid="svc-uid")
    plan = plan_stormservice(ServiceSnapshot(typo, (aibrix_roleset(),), {}, TIERS))
    assert plan.say is not None and plan.say.reason == "InvalidHealAnnotation" and plan.say.type == "Warning"
    assert "stormtopo.io/heal: 'yes' is not understood" in plan.say.message and 'accepted: "true" or "false"' in plan.say.message
    assert (
        not wants_healing(typo)
        and plan.writes == plan_stormservice(ServiceSnapshot(service(HARD1, uid="svc-uid"), (aibrix_roleset(),), {}, TIERS)).writes
    )
    scoped = service({**HARD1, SCOPE: "StormService", "stormtopo.io/heal": "true"}, uid="svc-uid")
    said = plan_stormservice(ServiceSnapshot(scoped, (aibrix_roleset(),), {}, TIERS)).say
    assert said is not None and "applies to scope RoleSet only" in said.message
    ok = plan_stormservice(
        ServiceSnapshot(service({**HARD1, "stormtopo.io/heal": "true"}, uid="svc-uid"), (aibrix_roleset(),), {}, TIERS)
    ).say
    assert ok is not None and ok.reason == "TopologyRequest"


# -- every hold ends (issue 34, item 2) ----------------------------------------------------------

NOW = 1_800_000_000.0
SOFT2_HEAL = {MODE: "soft", HIGHEST_TIER: "2", "stormtopo.io/heal": "true"}
AS_ASKED = {"mode": "soft", "highestTierAllowed": 2}  # what the soft request asks
HELD = {"mode": "hard", "highestTierAllowed": 1}  # what the move's hold asks


def moving(annotations: dict[str, str], at: float = NOW - 30, **record: object) -> dict[str, Any]:
    """The StormService while its replica moves into tier 1 (the healer's record, begun at `at`)."""
    import datetime
    import json

    ss = service(annotations, uid="svc-uid")
    began = datetime.datetime.fromtimestamp(at, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    move = {"at": began, "to": "s0", "toTier": 1, "reason": "soft-above-tier", "pods": ["old"], **record}
    ss["metadata"]["annotations"]["stormtopo.io/moves"] = json.dumps({"svc-roleset-abcde": move})
    return ss


def held_podgroup(recorded: str = '{"v":1,"mode":"soft","highestTierAllowed":2,"scope":"RoleSet"}') -> dict[str, Any]:
    pg = constrained_podgroup()
    pg["metadata"]["annotations"] = {REQUEST_ANNOTATION: recorded}
    pg["spec"]["networkTopology"] = dict(HELD)
    return pg


def planned_topology(ss: dict[str, Any], podgroup: dict[str, Any], now: float | None = NOW) -> object:
    """The networkTopology the reconciler writes on the replica's PodGroup; None if it writes none."""
    plan = plan_stormservice(ServiceSnapshot(ss, (aibrix_roleset(),), {"svc-roleset-abcde": podgroup}, TIERS), now=now)
    ops = [op for w in plan.writes if isinstance(w, PatchPodGroup) for op in w.ops if op["path"] == "/spec/networkTopology"]
    assert len(ops) <= 1, plan.writes
    return ops[0].get("value", "removed") if ops else None


def test_while_the_service_asks_for_healing_the_moving_replica_stays_held() -> None:
    assert planned_topology(moving(SOFT2_HEAL), held_podgroup()) is None  # held already: nothing to write
    as_asked = {**held_podgroup(), "spec": {**held_podgroup()["spec"], "networkTopology": dict(AS_ASKED)}}
    assert planned_topology(moving(SOFT2_HEAL), as_asked) == HELD  # the reconciler holds it too (AIBrix's rewrite)


def test_removing_the_heal_annotation_ends_the_hold() -> None:
    removed = moving({MODE: "soft", HIGHEST_TIER: "2"})
    assert planned_topology(removed, held_podgroup()) == AS_ASKED
    assert planned_topology(removed, held_podgroup(), now=None) == AS_ASKED  # no clock needed for this


def test_heal_false_ends_the_hold() -> None:
    assert planned_topology(moving({**SOFT2_HEAL, "stormtopo.io/heal": "false"}), held_podgroup()) == AS_ASKED


def test_a_heal_annotation_not_understood_ends_the_hold() -> None:
    typo = moving({**SOFT2_HEAL, "stormtopo.io/heal": "ture"})
    assert planned_topology(typo, held_podgroup()) == AS_ASKED
    plan = plan_stormservice(ServiceSnapshot(typo, (aibrix_roleset(),), {"svc-roleset-abcde": held_podgroup()}, TIERS), now=NOW)
    assert plan.say is not None and plan.say.reason == "InvalidHealAnnotation"  # and said


def test_switching_to_scope_stormservice_ends_the_hold() -> None:
    scoped = moving({**SOFT2_HEAL, SCOPE: "StormService"})
    plan = plan_stormservice(ServiceSnapshot(scoped, (aibrix_roleset(),), {"svc-roleset-abcde": held_podgroup()}, TIERS), now=NOW)
    # The replica's PodGroup carries no constraint now (the service's own PodGroup does): no hold left.
    assert PatchPodGroup("ns", "svc-roleset-abcde", [{"op": "remove", "path": "/spec/networkTopology"}]) in plan.writes
    assert not [op for w in plan.writes if isinstance(w, PatchPodGroup) for op in w.ops if op.get("value") == HELD]
    from stormtopo.core.moves import moving_tier

    assert moving_tier(scoped, "svc-roleset-abcde", NOW) is None  # nor does the webhook hold it


def test_an_invalid_request_lets_the_hold_go_to_the_last_valid_request_and_keeps_the_rest() -> None:
    bad = moving({MODE: "soft", HIGHEST_TIER: "7", "stormtopo.io/heal": "true"})
    sibling = {**constrained_podgroup(), "metadata": {**constrained_podgroup()["metadata"], "name": "svc-roleset-fghij"}}
    other = {**aibrix_roleset(), "metadata": {**aibrix_roleset()["metadata"], "name": "svc-roleset-fghij"}}
    groups = {"svc-roleset-abcde": held_podgroup(), "svc-roleset-fghij": sibling}
    plan = plan_stormservice(ServiceSnapshot(bad, (aibrix_roleset(), other), groups, TIERS), now=NOW)
    assert plan.invalid and plan.say is not None and "the last valid request stays applied" in plan.say.message
    # Only the held PodGroup is written, only its networkTopology, back to what it records of its last valid request.
    assert plan.writes == (
        PatchPodGroup("ns", "svc-roleset-abcde", [{"op": "replace", "path": "/spec/networkTopology", "value": AS_ASKED}]),
    )
    # Its last valid request hard within a tier name, or soft within any tier: read back as well.
    by_name = '{"v":1,"mode":"hard","highestTierName":"leaf","scope":"RoleSet"}'
    assert planned_topology(bad, held_podgroup(by_name)) == {"mode": "hard", "highestTierName": "leaf"}
    assert planned_topology(bad, held_podgroup('{"v":1,"mode":"soft","scope":"RoleSet"}')) == {"mode": "soft"}
    # As the release before recorded it (a sentence), and before scopes were written: read for one release.
    assert planned_topology(bad, held_podgroup("soft within tier 2, scope RoleSet")) == AS_ASKED
    assert planned_topology(bad, held_podgroup("hard within tier 'leaf', scope RoleSet")) == {"mode": "hard", "highestTierName": "leaf"}
    assert planned_topology(bad, held_podgroup("soft within any tier")) == {"mode": "soft"}
    # What it records cannot be read back: left as it is, rather than given a topology guessed from nothing.
    for unreadable in (
        "something else",
        '{"v":2,"mode":"soft","highestTierAllowed":2}',  # a version this release does not know
        '{"v":1,"mode":"hard","scope":"RoleSet"}',  # hard without a tier
        '{"v":1,"mode":"soft","highestTierAllowed":true}',
        '{"v":1,"mode":"soft","highestTierAllowed":2,"highestTierName":"leaf"}',
        '{"v":1,"mode":"soft","highestTierAllowed":' + "9" * 600 + "}",  # longer than any record written
    ):
        assert planned_topology(bad, held_podgroup(unreadable)) is None, unreadable
    # Let go already (or never held): nothing to write.
    assert planned_topology(bad, {**held_podgroup(), "spec": {**held_podgroup()["spec"], "networkTopology": dict(AS_ASKED)}}) is None


def test_the_request_a_move_records_is_data_read_where_the_podgroups_record_cannot_be() -> None:
    """Issue 44, item 2: a move records what its replica asked as data ("request"). The PodGroup's own
    record goes first (it follows a valid change of the request made while the replica moved); the move's
    where that cannot be read; a "request" edited into anything else is not read."""
    bad = {MODE: "soft", HIGHEST_TIER: "7", "stormtopo.io/heal": "true"}
    recorded = moving(bad, request={"mode": "soft", "highestTierAllowed": 2})
    assert planned_topology(recorded, held_podgroup("something else")) == AS_ASKED
    changed_since = moving(bad, request={"mode": "hard", "highestTierAllowed": 1})  # asked hard 1 when it began, soft 2 since
    assert planned_topology(changed_since, held_podgroup()) == AS_ASKED
    by_name = moving(bad, request={"mode": "hard", "highestTierName": "leaf"})
    assert planned_topology(by_name, held_podgroup("something else")) == {"mode": "hard", "highestTierName": "leaf"}
    for junk in ({"mode": "hard"}, {"mode": "soft", "highestTierAllowed": 0}, {"mode": "soft", "highestTierAllowed": True},
                 {"mode": "hard", "highestTierAllowed": 1, "highestTierName": "leaf"}, {"mode": "x"}, "soft within tier 2",
                 {"mode": "soft", "highestTierAllowed": 2, "extra": 1}):  # fmt: skip
        assert planned_topology(moving(bad, request=junk), held_podgroup()) == AS_ASKED  # the sentence, as before
        assert planned_topology(moving(bad, request=junk), held_podgroup("something else")) is None


def test_the_hold_ends_at_the_moves_deadline() -> None:
    from stormtopo.core.moves import MOVE_DEADLINE

    assert planned_topology(moving(SOFT2_HEAL, at=NOW - MOVE_DEADLINE + 5), held_podgroup()) is None  # still held
    assert planned_topology(moving(SOFT2_HEAL, at=NOW - MOVE_DEADLINE - 1), held_podgroup()) == AS_ASKED
    assert planned_topology(moving(SOFT2_HEAL, at=NOW - MOVE_DEADLINE - 1), held_podgroup(), now=None) is None  # no clock: not judged
    assert planned_topology(moving(SOFT2_HEAL, at=NOW - 30, done=True), held_podgroup()) == AS_ASKED  # settled


def test_the_webhook_lets_go_of_a_service_that_no_longer_asks_for_healing() -> None:
    rewrite = {"metadata": {"name": "svc-roleset-abcde", "namespace": "ns"}, "spec": {"minMember": 2, "queue": "default"}}

    def admitted(ss: dict[str, Any]) -> object:
        return {op["path"]: op["value"] for op in admit_podgroup(rewrite, aibrix_roleset(), ss, TIERS).patch}["/spec/networkTopology"]

    assert admitted(moving(SOFT2_HEAL)) == HELD
    assert admitted(moving({MODE: "soft", HIGHEST_TIER: "2"})) == AS_ASKED
    assert admitted(moving({**SOFT2_HEAL, "stormtopo.io/heal": "no"})) == AS_ASKED


def test_a_lend_room_or_prefer_same_node_typo_is_said_and_stays_off() -> None:
    """Issue 44, item 3: one rule for the three on/off annotations; a typo is said, never silently off."""
    from stormtopo.core.lending import lends_room
    from stormtopo.core.switches import switched_on

    typo = service({**HARD1, "stormtopo.io/lend-room": "yes", "stormtopo.io/prefer-same-node": "on"}, uid="svc-uid")
    plan = plan_stormservice(ServiceSnapshot(typo, (aibrix_roleset(),), {}, TIERS))
    assert plan.say is not None and plan.say.reason == "InvalidAnnotation" and plan.say.type == "Warning"
    assert "stormtopo.io/lend-room: 'yes' is not understood, it lends no room" in plan.say.message
    assert "stormtopo.io/prefer-same-node: 'on' is not understood" in plan.say.message
    assert not lends_room(typo) and not switched_on(typo, "stormtopo.io/prefer-same-node")
    # The same rule everywhere: "True" is on for each (prefer-same-node was case-sensitive before).
    upper = service({**HARD1, "stormtopo.io/prefer-same-node": " True "}, uid="svc-uid")
    assert switched_on(upper, "stormtopo.io/prefer-same-node")
    said = plan_stormservice(ServiceSnapshot(upper, (aibrix_roleset(),), {}, TIERS)).say
    assert said is not None and said.reason == "TopologyRequest"


def test_a_service_whose_roleset_prefix_another_shares_is_listed_without_heal_and_told_why() -> None:
    """Issue 43, item 3: the eviction policy knows a service's pods by that prefix only."""
    heals = service({**HARD1, "stormtopo.io/heal": "true"}, uid="svc-uid")
    plan = plan_stormservice(ServiceSnapshot(heals, (aibrix_roleset(),), {}, TIERS))
    assert plan.listing is not None and plan.listing.scope == "RoleSet+heal"
    shared = plan_stormservice(ServiceSnapshot(heals, (aibrix_roleset(),), {}, TIERS, prefix_shared_with="svc-twin"))
    assert shared.listing is not None and shared.listing.scope == "RoleSet"
    assert shared.say is not None and shared.say.type == "Warning" and "'svc-twin'" in shared.say.message and "rename" in shared.say.message
    quiet = plan_stormservice(ServiceSnapshot(service(HARD1, uid="svc-uid"), (aibrix_roleset(),), {}, TIERS, prefix_shared_with="svc-twin"))
    assert quiet.say is not None and quiet.say.type == "Normal"  # no healing asked: nothing to say
