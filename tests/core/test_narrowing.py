"""A narrowing's record (core/narrowing.py), as the webhook and the reconciler read it: a soft replica's PodGroup
held hard within the recorded tier for NARROWED_FOR seconds, through AIBrix's rewrites, then as its request asks
again; a record anyone could write buys nothing its request does not allow."""

from __future__ import annotations

import json
from typing import Any

import pytest

from stormtopo.core.admission import admit_podgroup
from stormtopo.core.narrowing import NARROWED_FOR, narrowed_tier, narrowing_record
from stormtopo.core.reconciliation import ServiceSnapshot, plan_stormservice
from stormtopo.core.request import ClusterTiers, Mode, Scope, TierLimit, TopologyRequest
from stormtopo.core.vocabulary import HIGHEST_TIER, HIGHEST_TIER_NAME, MODE, NARROWED_ANNOTATION
from stormtopo.core.writes import PatchPodGroup
from tests.builders import aibrix_roleset, podgroup, service

TIERS = ClusterTiers(frozenset({1, 2, 3}), frozenset({"leaf", "spine"}), tier_of_name=(("leaf", 1), ("spine", 2)))
NOW = 1_800_000_000.0
SOFT2 = TopologyRequest(Mode.SOFT, TierLimit(tier=2))
AS_ASKED = {"mode": "soft", "highestTierAllowed": 2}
HELD1 = {"mode": "hard", "highestTierAllowed": 1}


def narrowed_group(record: str | None, topology: dict[str, Any] | None = None) -> dict[str, Any]:
    rs = aibrix_roleset()["metadata"]["name"]
    annotations = {NARROWED_ANNOTATION: record} if record is not None else None
    return podgroup(rs, spec={"minMember": 2, "networkTopology": topology or AS_ASKED}, annotations=annotations)


@pytest.mark.parametrize(
    ("record", "request_", "now", "tier"),
    [
        (narrowing_record(1, NOW), SOFT2, NOW + 10, 1),
        (narrowing_record(2, NOW), SOFT2, NOW, 2),
        (narrowing_record(1, NOW), SOFT2, NOW + NARROWED_FOR + 1, None),  # over: as its request asks again
        (narrowing_record(1, NOW), SOFT2, NOW - 3600, None),  # dated by a clock far ahead: not for as long as it was
        (narrowing_record(1, NOW), SOFT2, None, 1),  # no clock: no deadline, for the webhook and reconciler alike
        (narrowing_record(3, NOW), SOFT2, NOW, None),  # beyond its request's tier: a tenant's record buys nothing
        (narrowing_record(0, NOW), SOFT2, NOW, None),
        (narrowing_record(1, NOW), TopologyRequest(Mode.HARD, TierLimit(tier=2)), NOW, None),  # hard already
        (narrowing_record(1, NOW), TopologyRequest(Mode.SOFT, TierLimit(tier=2), Scope.STORMSERVICE), NOW, None),
        (narrowing_record(1, NOW), TopologyRequest(Mode.SOFT, TierLimit(tier_name="spine")), NOW, 1),
        (narrowing_record(2, NOW), TopologyRequest(Mode.SOFT, TierLimit(tier_name="leaf")), NOW, None),
        (narrowing_record(1, NOW), TopologyRequest(Mode.SOFT, TierLimit()), NOW, None),  # no tier asked: none to narrow in
        (json.dumps({"v": 1, "tier": True, "at": "2027-01-15T08:00:00Z"}), SOFT2, NOW, None),
        (json.dumps({"v": 2, "tier": 1, "at": "2027-01-15T08:00:00Z"}), SOFT2, NOW, None),  # a version it does not know
        (json.dumps({"v": 1, "tier": 1}), SOFT2, NOW, None),  # no time to count from
        ("hard within tier 1", SOFT2, NOW, None),
        ("[1]", SOFT2, NOW, None),
        (narrowing_record(1, NOW, over=True), SOFT2, NOW, None),  # ended before its time: held no more
        ("[" * 200_000, SOFT2, NOW, None),  # anyone who may write the PodGroup writes this: no recursion, no crash
        (narrowing_record(1, NOW) + " " * 300, SOFT2, NOW, None),  # longer than any record stormtopo writes
    ],
)
def test_a_record_holds_a_soft_replica_only_within_its_request_and_its_time(
    record: str, request_: TopologyRequest, now: float | None, tier: int | None
) -> None:
    assert narrowed_tier(narrowed_group(record), request_, TIERS, now) == tier


def test_the_webhook_keeps_a_narrowing_through_aibrixs_rewrite_and_lets_it_go_when_it_is_over() -> None:
    soft = service({MODE: "soft", HIGHEST_TIER: "2"})
    stored = narrowed_group(narrowing_record(1, NOW), HELD1)
    # AIBrix's rewrite: its own spec, soft, without stormtopo's annotations; the stored PodGroup has the record.
    rewrite = podgroup(stored["metadata"]["name"], spec={"minMember": 2, "queue": "default"})
    patch = admit_podgroup(rewrite, aibrix_roleset(), soft, TIERS, old=stored, now=NOW + 10).patch
    assert {"op": "add", "path": "/spec/networkTopology", "value": HELD1} in patch
    kept = [op["value"] for op in patch if op["path"] == "/metadata/annotations"]
    assert kept and kept[0][NARROWED_ANNOTATION] == narrowing_record(1, NOW)  # the record stays for the next rewrite
    over = admit_podgroup(rewrite, aibrix_roleset(), soft, TIERS, old=stored, now=NOW + NARROWED_FOR + 1).patch
    assert {"op": "add", "path": "/spec/networkTopology", "value": AS_ASKED} in over
    # stormtopo's own write of the narrowing passes the webhook as written.
    own = admit_podgroup(stored, aibrix_roleset(), soft, TIERS, old=narrowed_group(None), now=NOW).patch
    assert not [op for op in own if op["path"] == "/spec/networkTopology"]


def test_the_reconciler_keeps_a_narrowing_within_its_time_and_writes_the_request_back_after() -> None:
    soft = service({MODE: "soft", HIGHEST_TIER: "2"})
    rs = aibrix_roleset()
    name = rs["metadata"]["name"]

    def written(pg: dict[str, Any], now: float) -> object:
        plan = plan_stormservice(ServiceSnapshot(soft, (rs,), {name: pg}, TIERS), now=now)
        ops = [op for w in plan.writes if isinstance(w, PatchPodGroup) for op in w.ops if op["path"] == "/spec/networkTopology"]
        return ops[0]["value"] if ops else None

    held = narrowed_group(narrowing_record(1, NOW), HELD1)
    assert written(held, NOW + 10) is None  # held, and so it stays
    assert written(narrowed_group(narrowing_record(1, NOW)), NOW + 10) == HELD1  # AIBrix's rewrite seen first
    assert written(held, NOW + NARROWED_FOR + 1) == AS_ASKED
    assert written(narrowed_group(narrowing_record(1, NOW), HELD1), NOW + 10) is None
    other = service({MODE: "soft", HIGHEST_TIER_NAME: "leaf"})
    plan = plan_stormservice(ServiceSnapshot(other, (rs,), {name: narrowed_group(narrowing_record(2, NOW), HELD1)}, TIERS), now=NOW)
    ops = [op["value"] for w in plan.writes if isinstance(w, PatchPodGroup) for op in w.ops if op["path"] == "/spec/networkTopology"]
    assert ops == [{"mode": "soft", "highestTierName": "leaf"}]  # a record beyond the request's tier: not honoured


def test_a_request_made_invalid_while_narrowed_lets_the_narrowing_go_to_the_last_valid_request() -> None:
    """Bad input changes nothing, but a hold is no request: the webhook and the reconciler both give the PodGroup
    the networkTopology of the last valid request it records, as they do for a move's hold."""
    typo = service({MODE: "sotf", HIGHEST_TIER: "2"})
    rs = aibrix_roleset()
    stored = narrowed_group(narrowing_record(1, NOW), HELD1)
    stored["metadata"]["annotations"]["stormtopo.io/request"] = "soft within tier 2, scope RoleSet"
    rewrite = podgroup(stored["metadata"]["name"], spec={"minMember": 2, "queue": "default"})
    patch = admit_podgroup(rewrite, rs, typo, TIERS, last_valid=stored, old=stored, now=NOW).patch
    assert {"op": "add", "path": "/spec/networkTopology", "value": AS_ASKED} in patch
    plan = plan_stormservice(ServiceSnapshot(typo, (rs,), {stored["metadata"]["name"]: stored}, TIERS), now=NOW)
    ops = [op for w in plan.writes if isinstance(w, PatchPodGroup) for op in w.ops]
    assert ops == [{"op": "replace", "path": "/spec/networkTopology", "value": AS_ASKED}]


def test_explain_says_a_pending_replica_is_held_hard_until_its_narrowing_ends() -> None:
    from stormtopo.commands.explain import render

    entry = {"replica": "rs", "podGroup": "rs", "phase": "Pending", "bound": 0, "pods": 2}
    narrowed = entry | {"narrowed": {"tier": 1, "until": "2027-01-15T08:02:00Z"}}
    lines = render({"namespace": "ns", "stormservice": "svc", "request": "soft within tier 2, scope RoleSet", "replicas": [narrowed]})
    assert "    held hard within tier 1 until 2027-01-15T08:02:00Z, so that Volcano's gangpreempt takes its victims" in "\n".join(lines)
    plain = render({"namespace": "ns", "stormservice": "svc", "request": "soft within tier 2, scope RoleSet", "replicas": [entry]})
    assert not any("held hard" in line for line in plain)
    assert not any("gate" in line for line in plain)
    # Pods at stormtopo's gates, which Volcano does not see yet: why, and which Events say what was decided.
    gated = entry | {"held": {"room": 2, "spread": 0}}
    lines = render({"namespace": "ns", "stormservice": "svc", "request": "soft within tier 2, scope RoleSet", "replicas": [gated]})
    assert "    2 pod(s) held at stormtopo's gate stormtopo.io/room while it plans how the replica preempts" in "\n".join(lines)
    assert "ReplicaWaitingForRoom" in "\n".join(lines) and "stormtopo.io/domain" not in "\n".join(lines)


def test_a_plan_narrows_when_it_writes_the_record_whether_or_not_the_podgroup_had_annotations() -> None:
    from stormtopo.core.narrowing import narrow, narrows

    request = TopologyRequest(Mode.SOFT, TierLimit(tier=2))
    bare = podgroup("rs", spec={"networkTopology": AS_ASKED})
    annotated = podgroup("rs", spec={"networkTopology": AS_ASKED}, annotations={"stormtopo.io/request": "soft within tier 2"})
    assert narrows([narrow("ns", bare, request, 1, NOW)]) and narrows([narrow("ns", annotated, request, 1, NOW)])
    assert not narrows([PatchPodGroup("ns", "rs", [{"op": "replace", "path": "/spec/networkTopology", "value": HELD1}])])
    from stormtopo.core.narrowing import unnarrow

    held = podgroup("rs", spec={"networkTopology": HELD1}, annotations={NARROWED_ANNOTATION: narrowing_record(1, NOW)})
    assert not narrows([unnarrow("ns", held, request)])  # ending one is no narrowing
