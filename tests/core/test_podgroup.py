"""Desired PodGroups and admission patches (pure)."""

from __future__ import annotations

from stormtopo.core.admission import admit_pod, admit_podgroup
from stormtopo.core.gang import gang_of
from stormtopo.core.jsonpatch import set_spec_fields as spec_patch
from stormtopo.core.podgroup import owned_podgroup
from stormtopo.core.request import ClusterTiers, parse_request
from stormtopo.core.vocabulary import HIGHEST_TIER, MODE
from stormtopo.devenv.workloads import Role
from tests.builders import HARD_TIER_1_RECORD, aibrix_roleset, service

CLUSTER = ClusterTiers(frozenset({1, 2, 3}))
HARD1 = {MODE: "hard", HIGHEST_TIER: "1"}


def test_gang_counts_every_pod_of_every_role() -> None:
    spec = aibrix_roleset((Role("prefill", replicas=2, pod_group_size=4), Role("decode", replicas=3)))["spec"]
    gang = gang_of(spec)
    assert gang.min_member == 2 * 4 + 3
    assert dict(gang.min_task_member) == {"prefill": 8, "decode": 3}


def test_podgroup_admission_adds_constraint_and_gang_and_survives_aibrix_spec_replacement() -> None:
    ss = service(HARD1)
    aibrix_spec = {"minMember": 2, "queue": "default", "minResources": {}}
    decision = admit_podgroup({"metadata": {"name": "svc-roleset-abcde"}, "spec": aibrix_spec}, aibrix_roleset(), ss, CLUSTER)
    ops = {op["path"]: op for op in decision.patch}
    assert ops["/spec/networkTopology"]["value"] == {"mode": "hard", "highestTierAllowed": 1}
    assert ops["/spec/minTaskMember"]["value"] == {"prefill": 1, "decode": 1}
    assert "/spec/minMember" not in ops  # already right
    assert ops["/metadata/annotations"]["value"] == {"stormtopo.io/request": HARD_TIER_1_RECORD}


def test_podgroup_of_a_service_without_annotations_or_with_bad_ones_is_left_alone() -> None:
    pg = {"metadata": {"name": "x"}, "spec": {"minMember": 2}}
    assert admit_podgroup(pg, aibrix_roleset(), service(), CLUSTER).patch == []
    bad = service({MODE: "hard", HIGHEST_TIER: "abc"})
    assert admit_podgroup(pg, aibrix_roleset(), bad, CLUSTER).patch == []


def test_pod_admission_sets_task_group_and_scheduler() -> None:
    pod = {
        "metadata": {"labels": {"role-name": "decode", "roleset-name": "svc-roleset-abcde"}},
        "spec": {"schedulerName": "default-scheduler"},
    }
    decision = admit_pod(pod, aibrix_roleset(), service(HARD1), CLUSTER)
    assert decision.allowed
    value = decision.patch[0]["value"]
    assert value == {"scheduling.k8s.io/group-name": "svc-roleset-abcde", "volcano.sh/task-spec": "decode"}
    assert {"op": "add", "path": "/metadata/labels/stormtopo.io~1admitted", "value": "true"} in decision.patch
    assert decision.patch[-1] == {"op": "add", "path": "/spec/schedulerName", "value": "volcano"}


def test_a_multi_node_instance_pod_joins_its_replicas_gang_instead_of_its_podset_group() -> None:
    # AIBrix points each instance of a multi-node role (podGroupSize > 1, role-level strategy) at its
    # PodSet's own PodGroup; the replica is one gang only if its pods join the replica's PodGroup.
    annotations = {"scheduling.k8s.io/group-name": "svc-roleset-abcde-prefill-7d9f-0"}
    pod = {"metadata": {"labels": {"role-name": "prefill", "storm-service-name": "svc"}, "annotations": annotations}, "spec": {}}
    decision = admit_pod(pod, aibrix_roleset(), service(HARD1), CLUSTER, named_group_service="svc")
    assert decision.allowed
    assert {"op": "add", "path": "/metadata/annotations/scheduling.k8s.io~1group-name", "value": "svc-roleset-abcde"} in decision.patch


def test_a_pod_naming_another_stormservices_podgroup_is_denied() -> None:
    annotations = {"scheduling.k8s.io/group-name": "theirs-roleset-x"}
    pod = {"metadata": {"labels": {"role-name": "decode", "storm-service-name": "svc"}, "annotations": annotations}, "spec": {}}
    decision = admit_pod(pod, aibrix_roleset(), service(HARD1), CLUSTER, named_group_service="theirs")
    assert not decision.allowed and "'theirs-roleset-x'" in decision.message and "'theirs'" in decision.message


def test_owned_podgroup_is_owned_by_the_roleset() -> None:
    request = parse_request(HARD1, CLUSTER)
    assert request is not None
    pg = owned_podgroup(aibrix_roleset(), request)
    assert pg["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert pg["spec"]["minMember"] == 2 and pg["spec"]["networkTopology"]["highestTierAllowed"] == 1


def test_spec_patch_is_empty_when_nothing_differs() -> None:
    desired = {"minMember": 2, "networkTopology": {"mode": "soft"}}
    assert spec_patch(dict(desired), desired) == []
    assert spec_patch(None, desired) == [{"op": "add", "path": "/spec", "value": desired}]


def test_stormservice_scope_makes_one_gang_of_all_replicas_with_replica_subgroups() -> None:
    from stormtopo.core.podgroup import service_podgroup
    from stormtopo.core.vocabulary import REPLICA_HIGHEST_TIER, SCOPE

    annotations = {MODE: "hard", HIGHEST_TIER: "2", SCOPE: "StormService", REPLICA_HIGHEST_TIER: "1"}
    ss = service(annotations, replicas=3)
    ss["metadata"]["uid"] = "ss-uid"
    request = parse_request(annotations, CLUSTER)
    assert request is not None
    pg = service_podgroup(ss, request)
    assert pg["metadata"]["name"] == "svc" and pg["metadata"]["ownerReferences"][0]["uid"] == "ss-uid"
    assert pg["spec"]["minMember"] == 6 and pg["spec"]["networkTopology"]["highestTierAllowed"] == 2
    [policy] = pg["spec"]["subGroupPolicy"]
    assert policy["matchLabelKeys"] == ["roleset-name"] and policy["subGroupSize"] == 2 and policy["minSubGroups"] == 3
    assert "minTaskMember" not in pg["spec"]
    # Pods of every replica join the service's group; AIBrix's per-replica groups are left as they are.
    pod = {"metadata": {"labels": {"role-name": "decode"}, "annotations": {"scheduling.k8s.io/group-name": "svc-roleset-abcde"}}}
    decision = admit_pod(pod, aibrix_roleset(), ss, CLUSTER)
    assert decision.allowed and decision.patch[0]["value"] == "svc"
    assert admit_podgroup({"metadata": {}, "spec": {"minMember": 2}}, aibrix_roleset(), ss, CLUSTER).patch == []


def test_pod_of_one_stormservice_cannot_join_anothers_group_even_without_a_request() -> None:
    pod = {"metadata": {"labels": {"storm-service-name": "b"}, "annotations": {"scheduling.k8s.io/group-name": "a-roleset-x"}}}
    decision = admit_pod(pod, None, service(name="b"), CLUSTER, named_group_service="a")
    assert not decision.allowed and "belongs to StormService 'a'" in decision.message
    assert admit_pod(pod, None, service(name="b"), CLUSTER, named_group_service="b").allowed


def test_a_moving_replicas_podgroup_is_held_hard_within_the_targets_tier_by_the_webhook_too() -> None:
    import json

    soft = service({MODE: "soft", HIGHEST_TIER: "2", "stormtopo.io/heal": "true"})
    rs = aibrix_roleset()
    podgroup = {"metadata": {"name": rs["metadata"]["name"], "namespace": "ns"}, "spec": {"minMember": 2}}
    as_asked = admit_podgroup(podgroup, rs, soft, CLUSTER).patch
    assert {"op": "add", "path": "/spec/networkTopology", "value": {"mode": "soft", "highestTierAllowed": 2}} in as_asked
    soft["metadata"]["annotations"]["stormtopo.io/moves"] = json.dumps(
        {rs["metadata"]["name"]: {"toTier": 1, "at": "2026-12-01T00:00:00Z"}}
    )
    held = admit_podgroup(podgroup, rs, soft, CLUSTER).patch
    assert {"op": "add", "path": "/spec/networkTopology", "value": {"mode": "hard", "highestTierAllowed": 1}} in held
    soft["metadata"]["annotations"]["stormtopo.io/moves"] = json.dumps({rs["metadata"]["name"]: {"toTier": 1, "done": True}})
    assert admit_podgroup(podgroup, rs, soft, CLUSTER).patch == as_asked  # settled: as its request asks again


def test_the_webhook_lets_a_hold_go_at_the_moves_deadline_as_the_reconciler_does() -> None:
    """Issue 34, item 2: both shells pass the same clock; past MOVE_DEADLINE the webhook holds no more."""
    import datetime
    import json

    from stormtopo.core.moves import MOVE_DEADLINE

    soft = service({MODE: "soft", HIGHEST_TIER: "2", "stormtopo.io/heal": "true"})
    rs = aibrix_roleset()
    podgroup = {"metadata": {"name": rs["metadata"]["name"], "namespace": "ns"}, "spec": {"minMember": 2}}
    began = datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC)
    soft["metadata"]["annotations"]["stormtopo.io/moves"] = json.dumps({rs["metadata"]["name"]: {"toTier": 1, "at": began.isoformat()}})
    hard = {"op": "add", "path": "/spec/networkTopology", "value": {"mode": "hard", "highestTierAllowed": 1}}
    assert hard in admit_podgroup(podgroup, rs, soft, CLUSTER, now=began.timestamp() + 10).patch
    late = admit_podgroup(podgroup, rs, soft, CLUSTER, now=began.timestamp() + MOVE_DEADLINE + 1).patch
    assert {"op": "add", "path": "/spec/networkTopology", "value": {"mode": "soft", "highestTierAllowed": 2}} in late
    # Recorded by a clock far ahead (a leader's clock gone wrong): not held for as long as it was ahead.
    ahead = admit_podgroup(podgroup, rs, soft, CLUSTER, now=began.timestamp() - 3600).patch
    assert {"op": "add", "path": "/spec/networkTopology", "value": {"mode": "soft", "highestTierAllowed": 2}} in ahead


def test_a_pod_of_a_service_that_opted_out_loses_the_opt_in_label_and_nothing_else() -> None:
    """Its role templates keep stormtopo.io/opted-in (taking it off would roll every replica): the pod
    goes as if stormtopo were not installed, out of the labelled-pods policy's reach."""
    pod = {"metadata": {"labels": {"role-name": "decode", "stormtopo.io/opted-in": "true"}}, "spec": {}}
    decision = admit_pod(pod, aibrix_roleset(), service(), CLUSTER)
    assert decision.allowed and decision.patch == [{"op": "remove", "path": "/metadata/labels/stormtopo.io~1opted-in"}]
    # Still opted in: the label stays, and the pod is admitted into its gang.
    decision = admit_pod(pod, aibrix_roleset(), service(HARD1), CLUSTER)
    assert not any(op["op"] == "remove" for op in decision.patch)
    assert {"op": "add", "path": "/metadata/labels/stormtopo.io~1admitted", "value": "true"} in decision.patch
    # A StormService it names but nobody could find: nothing changes (the policy holds the pod until stormtopo knows).
    named = {"metadata": {"labels": {**pod["metadata"]["labels"], "storm-service-name": "svc"}}, "spec": {}}
    assert admit_pod(named, aibrix_roleset(), None, CLUSTER).patch == []
    # A RoleSet of its own (no StormService; AIBrix labels its pods with an empty name): goes free.
    alone = {"metadata": {"labels": {**pod["metadata"]["labels"], "storm-service-name": ""}}, "spec": {}}
    assert admit_pod(alone, aibrix_roleset(), None, CLUSTER).patch == [{"op": "remove", "path": "/metadata/labels/stormtopo.io~1opted-in"}]
