"""A replica's priority reaches its PodGroup (Volcano ranks and preempts jobs by the PodGroup's class)."""

from __future__ import annotations

from typing import Any

from stormtopo.core.admission import admit_podgroup
from stormtopo.core.podgroup import owned_podgroup, service_podgroup
from stormtopo.core.priority import replica_priority_class
from stormtopo.core.reconciliation import ServiceSnapshot, plan_stormservice
from stormtopo.core.request import ClusterTiers, parse_request
from stormtopo.core.vocabulary import HIGHEST_TIER, MODE, SCOPE
from stormtopo.devenv.workloads import Role
from tests.builders import aibrix_roleset, service

HARD1 = {MODE: "hard", HIGHEST_TIER: "1"}
VALUES = {"inference-high": 1_000_000, "batch-low": 100, "zz-unknown-later": 5}
CLUSTER = ClusterTiers(frozenset({1, 2, 3}), priority_values=tuple(sorted(VALUES.items())))


def spec(*classes: str | None, strategy: str | None = None) -> dict[str, Any]:
    roles = tuple(Role(f"r{i}", priority_class=c) for i, c in enumerate(classes))
    out = service(HARD1, roles)["spec"]["template"]["spec"]
    if strategy is not None:
        out["schedulingStrategy"]["volcanoSchedulingStrategy"]["priorityClassName"] = strategy
    return dict(out)


def test_the_roles_class_the_highest_where_they_differ_and_aibrixs_own_setting_first() -> None:
    assert replica_priority_class(spec(None, None), VALUES) is None  # nothing anywhere: Volcano's default, as without stormtopo
    assert replica_priority_class(spec("batch-low", "batch-low"), VALUES) == "batch-low"
    assert replica_priority_class(spec("batch-low", "inference-high"), VALUES) == "inference-high"
    assert replica_priority_class(spec("inference-high", None), VALUES) == "inference-high"
    # A class whose value is not known ranks below every known one; unknown ones by name (every replica agrees).
    assert replica_priority_class(spec("aa-unknown", "batch-low"), VALUES) == "batch-low"
    assert replica_priority_class(spec("b-unknown", "a-unknown"), {}) == "a-unknown"
    # AIBrix's strategy names the PodGroup's class itself, on every sync: it stays the one.
    assert replica_priority_class(spec("inference-high", strategy="batch-low"), VALUES) == "batch-low"


def test_the_webhook_gives_aibrixs_podgroup_the_class_and_keeps_it_through_its_rewrites() -> None:
    ss = service(HARD1, (Role("prefill", priority_class="batch-low"), Role("decode", priority_class="inference-high")))
    rs = aibrix_roleset(spec=ss["spec"]["template"]["spec"])
    aibrix_spec = {"minMember": 2, "queue": "default", "minResources": {}}  # AIBrix's whole spec, no class
    decision = admit_podgroup({"metadata": {"name": rs["metadata"]["name"]}, "spec": aibrix_spec}, rs, ss, CLUSTER)
    ops = {op["path"]: op for op in decision.patch}
    assert ops["/spec/priorityClassName"]["value"] == "inference-high"
    stored = {"metadata": {"name": rs["metadata"]["name"]}, "spec": {**aibrix_spec, "priorityClassName": "inference-high"}}
    again = admit_podgroup({"metadata": {"name": rs["metadata"]["name"]}, "spec": dict(aibrix_spec)}, rs, ss, CLUSTER, old=stored)
    assert {"op": "add", "path": "/spec/priorityClassName", "value": "inference-high"} in again.patch
    # Without a request, stormtopo writes nothing: the service is as AIBrix made it.
    plain = service(None, (Role("prefill", priority_class="batch-low"),))
    assert admit_podgroup({"metadata": {"name": "x"}, "spec": dict(aibrix_spec)}, rs, plain, CLUSTER).patch == []


def test_podgroups_stormtopo_creates_carry_the_class_and_the_reconciler_adds_it_to_an_existing_one() -> None:
    ss = service(HARD1, (Role("prefill", priority_class="inference-high"), Role("decode")), volcano_strategy=False)
    ss["metadata"]["uid"] = "svc-uid"
    rs = aibrix_roleset(spec=ss["spec"]["template"]["spec"])
    request = parse_request(HARD1, CLUSTER)
    assert not isinstance(request, Exception) and request is not None
    assert owned_podgroup(rs, request)["spec"]["priorityClassName"] == "inference-high"
    scoped = {**HARD1, SCOPE: "StormService"}
    service_request = parse_request(scoped, CLUSTER)
    assert not isinstance(service_request, Exception) and service_request is not None
    assert service_podgroup(ss, service_request)["spec"]["priorityClassName"] == "inference-high"
    existing = {"metadata": {"name": rs["metadata"]["name"], "annotations": {}}, "spec": {"minMember": 2, "queue": "default"}}
    plan = plan_stormservice(ServiceSnapshot(ss, (rs,), {rs["metadata"]["name"]: existing}, CLUSTER))
    ops = [op for w in plan.writes for op in getattr(w, "ops", [])]
    assert {"op": "add", "path": "/spec/priorityClassName", "value": "inference-high"} in ops


def test_a_class_the_roles_no_longer_name_comes_off_the_podgroups_stormtopo_made_but_not_off_aibrixs() -> None:
    """The roles dropped their class (an in-place update): a PodGroup stormtopo created loses the class it gave
    it, or the gang kept outranking the batch work it no longer ranks above. One AIBrix made is left to AIBrix."""
    from stormtopo.core.vocabulary import MANAGED_BY_LABEL, OPERATOR_NAME

    ss = service(HARD1, (Role("prefill"), Role("decode")), volcano_strategy=False)
    rs = aibrix_roleset(spec=ss["spec"]["template"]["spec"])
    name = rs["metadata"]["name"]
    spec = {"minMember": 2, "queue": "default", "priorityClassName": "inference-high"}
    ours = {"metadata": {"name": name, "annotations": {}, "labels": {MANAGED_BY_LABEL: OPERATOR_NAME}}, "spec": spec}
    plan = plan_stormservice(ServiceSnapshot(ss, (rs,), {name: ours}, CLUSTER))
    assert {"op": "remove", "path": "/spec/priorityClassName"} in [op for w in plan.writes for op in getattr(w, "ops", [])]
    theirs = {"metadata": {"name": name, "annotations": {}}, "spec": spec}
    plan = plan_stormservice(ServiceSnapshot(ss, (rs,), {name: theirs}, CLUSTER))
    assert not [op for w in plan.writes for op in getattr(w, "ops", []) if op["path"] == "/spec/priorityClassName"]


def test_a_job_naming_no_class_or_an_unknown_one_ranks_at_the_clusters_default_as_volcano_ranks_it() -> None:
    """Volcano v1.15.1 ranks a job at its PodGroup's class's value, else at the globalDefault class's (0 without
    one): so do the priorities healing, making room and exact preemption compare (core/priority.py)."""
    from stormtopo.core.priority import DEFAULT_CLASS, job_priority, replica_priority

    values = {"batch": 100, DEFAULT_CLASS: 1000}  # the operator's reading, the globalDefault class's value under ""
    assert job_priority("batch", values) == 100
    assert job_priority("", values) == job_priority("deleted-class", values) == 1000
    assert job_priority("", {}) == 0
    classless = {"roles": [{"name": "r", "template": {"spec": {}}}]}
    assert replica_priority(classless, values) == 1000 and replica_priority(classless, {"batch": 100}) == 0
