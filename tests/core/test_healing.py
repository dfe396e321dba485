"""The healing planner (core/healing.py): which replica of a StormService moves into one domain, and
when nothing moves: not opted in, no room, a PodDisruptionBudget, the service's budget, one at a time,
the cool-down and the back-off. On the feature request's tree: leaves s0..s3 of two 8-GPU nodes each."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from stormtopo.core.cooldown import BACKOFF, NO_ROOM_RECHECK
from stormtopo.core.disruption import replica_budget
from stormtopo.core.heal_plan import HealMemory
from stormtopo.core.heal_request import may_need_healing
from stormtopo.core.heal_snapshot import HealSnapshot
from stormtopo.core.healing import plan_healing, plan_refused
from stormtopo.core.replica_pods import Replica
from stormtopo.core.verdict import Block, Why
from stormtopo.core.vocabulary import HEAL_ANNOTATION, HIGHEST_TIER, LEND_ROOM_ANNOTATION, MODE, MOVES_ANNOTATION, PLACEMENT_ANNOTATION
from stormtopo.core.writes import EvictPod, PatchPodGroup, PostEvent, RecordMove
from tests.builders import pdb, pod, service
from tests.core.healing_cases import BIG, BUSY, NOW, SOFT1, TIERS, TOPOLOGY, WIDE, free, replica, snap, stamp

HARD1 = {MODE: "hard", HIGHEST_TIER: "1", HEAL_ANNOTATION: "true"}


def evictions(plan: Any) -> list[str]:
    return [w.name for w in plan.writes if isinstance(w, EvictPod)]


def said(plan: Any, reason: str) -> list[str]:
    return [w.say.message for w in plan.writes if isinstance(w, PostEvent) and w.say.reason == reason]


def test_a_soft_replica_above_its_tier_moves_whole_into_the_leaf_that_has_room() -> None:
    plan = plan_healing(snap(service(SOFT1, BIG, update_strategy="RollingUpdate"), WIDE), HealMemory())
    assert plan.moving is not None and plan.moving.why is Why.SOFT_WIDE
    assert plan.moving.target is not None and plan.moving.target.switch.name == "s0"
    assert evictions(plan) == ["svc-a-decode-0", "svc-a-prefill-0"]  # every pod: the gang is placed again as one
    # Each eviction names the pod decided on by uid: a later pod of the same name (a stateful role) is not it.
    assert all(w.uid for w in plan.writes if isinstance(w, EvictPod))
    (moving,) = said(plan, "ReplicaMoving")
    assert "from s4, tier 2 to s0 (tier 1)" in moving and "landed above tier 1" in moving
    records = [w for w in plan.writes if isinstance(w, RecordMove)]
    assert records and records[0].record["at"] == stamp(NOW) and not records[0].record.get("done")
    # The record comes before the evictions: a restart in between still knows the move began.
    assert plan.writes.index(records[0]) < min(plan.writes.index(w) for w in plan.writes if isinstance(w, EvictPod))


def test_no_new_move_while_as_many_replicas_move_in_the_cluster_as_may_at_once() -> None:
    """Issue 34, item 5: after a leaf or power outage, not one replica of every service restarted together."""
    import dataclasses

    from stormtopo.core.cluster_moves import moving_in_cluster
    from stormtopo.core.verdict import Block

    capped = dataclasses.replace(snap(service(SOFT1, BIG, update_strategy="RollingUpdate"), WIDE), moving_elsewhere=2, max_moving=2)
    plan = plan_healing(capped, HealMemory())
    assert plan.moving is None and evictions(plan) == []
    assert any(v.block is Block.CLUSTER_CAP for v in plan.verdicts)
    below = dataclasses.replace(capped, moving_elsewhere=1)
    assert plan_healing(below, HealMemory()).moving is not None
    # What counts: moves recorded, not settled, within their deadline.
    moves = {"a": {"toTier": 1, "at": stamp(NOW - 10)}, "b": {"toTier": 1, "at": stamp(NOW - 10), "done": True}}
    old = {"c": {"toTier": 1, "at": stamp(NOW - 10_000)}}
    services = [service({**SOFT1, MOVES_ANNOTATION: json.dumps(m)}, BIG, update_strategy="RollingUpdate") for m in (moves, old)]
    assert moving_in_cluster(services, NOW) == 1
    services[0]["metadata"]["deletionTimestamp"] = stamp(NOW - 1)  # its move goes with it
    assert moving_in_cluster(services, NOW) == 0


def test_records_a_tenant_can_forge_take_no_more_of_the_cap_than_its_own_healing_could() -> None:
    """A StormService's owner can write stormtopo.io/moves: what it writes there counts in the cluster-wide
    facts only on a service that asks for healing, with a readable start not in the future, and at most
    one move per service (the healer moves one replica of a service at a time)."""
    from stormtopo.core.cluster_moves import moving_in_cluster
    from stormtopo.core.lending import making_room_under_way, room_made_for

    now_moving = {"toTier": 1, "at": stamp(NOW - 10)}
    two = json.dumps({"a": now_moving, "b": now_moving})
    # never opted in to healing
    plain = service({MODE: "soft", HIGHEST_TIER: "1", MOVES_ANNOTATION: two}, BIG, update_strategy="RollingUpdate")
    assert moving_in_cluster([plain], NOW) == 0
    healing = service({**SOFT1, MOVES_ANNOTATION: two}, BIG, update_strategy="RollingUpdate")
    assert moving_in_cluster([healing], NOW) == 1  # two forged moves on one service: one slot, as its healer would take
    future = service(
        {**SOFT1, MOVES_ANNOTATION: json.dumps({"a": {"toTier": 1, "at": stamp(NOW + 3600)}})}, BIG, update_strategy="RollingUpdate"
    )
    undated = service({**SOFT1, MOVES_ANNOTATION: json.dumps({"a": {"toTier": 1}})}, BIG, update_strategy="RollingUpdate")
    garbled = service({**SOFT1, MOVES_ANNOTATION: json.dumps({"a": {"toTier": 1, "at": "soon"}})}, BIG, update_strategy="RollingUpdate")
    assert moving_in_cluster([future, undated, garbled], NOW) == 0
    skewed = service(
        {**SOFT1, MOVES_ANNOTATION: json.dumps({"a": {"toTier": 1, "at": stamp(NOW + 30)}})}, BIG, update_strategy="RollingUpdate"
    )
    assert moving_in_cluster([skewed], NOW) == 1  # within the clock skew two replicas may have
    # Making room: an unsettled make-room record, or room said to be made for someone, counts only on a
    # service that lends room (healing on, lend-room on, more than one replica).
    room = {"x-0": {"at": stamp(NOW - 5), "reason": "make-room", "for": "StormService ns/svc replica svc-a"}}
    forged = service({**SOFT1, MOVES_ANNOTATION: json.dumps(room)}, BIG, update_strategy="RollingUpdate")
    assert not making_room_under_way([forged], NOW) and room_made_for([forged], NOW) == {}
    lender = service(
        {**SOFT1, LEND_ROOM_ANNOTATION: "true", MOVES_ANNOTATION: json.dumps(room)}, BIG, replicas=2, update_strategy="RollingUpdate"
    )
    assert making_room_under_way([lender], NOW) and room_made_for([lender], NOW) == {("ns", "svc", "svc-a"): NOW - 5}
    dated_later = {"x-0": {**room["x-0"], "at": stamp(NOW + 3600)}}
    lender["metadata"]["annotations"][MOVES_ANNOTATION] = json.dumps(dated_later)
    assert not making_room_under_way([lender], NOW) and room_made_for([lender], NOW) == {}


def test_nothing_moves_without_the_opt_in_but_the_dry_run_says_what_would() -> None:
    svc = service({MODE: "soft", HIGHEST_TIER: "1"}, BIG, update_strategy="RollingUpdate")
    assert plan_healing(snap(svc, WIDE), HealMemory()).writes == ()
    dry = plan_healing(snap(svc, WIDE), HealMemory(), opted_in_only=False)
    assert dry.moving is not None and dry.moving.replica == "svc-a"


def test_a_replica_within_its_tier_stays() -> None:
    placed = replica("svc-a", "node0", "node1")
    plan = plan_healing(
        snap(service(SOFT1, BIG, update_strategy="RollingUpdate"), placed, busy={**BUSY, "node0": 8, "node3": 0}), HealMemory()
    )
    assert plan.moving is None and plan.writes == ()
    assert plan.verdicts[0].why is None


def test_no_move_while_no_leaf_holds_the_whole_replica() -> None:
    plan = plan_healing(snap(service(SOFT1, BIG, update_strategy="RollingUpdate"), WIDE, busy={**BUSY, "node0": 4}), HealMemory())
    assert plan.moving is None and evictions(plan) == []
    assert "no domain within tier 1 has room" in plan.verdicts[0].blocked
    assert said(plan, "ReplicaNotMoved") == []  # nothing to say while there is nowhere to go


def test_its_own_gpus_count_as_free_where_it_leaves() -> None:
    # s0 has 8 free GPUs (node0) and 8 held by the replica itself (node1): enough once it moves.
    plan = plan_healing(snap(service(SOFT1, BIG, update_strategy="RollingUpdate"), WIDE), HealMemory())
    assert plan.moving is not None and plan.moving.target is not None and plan.moving.target.free_gpus == 16


def test_a_leaf_counts_as_room_only_where_the_pods_could_run() -> None:
    """Issue 34, item 4: node0 frees up, but a taint the pods do not tolerate, a CPU it lacks or a selector
    it fails keeps them off it: s0 is no room, nothing moves; a toleration makes it room again."""
    import dataclasses

    from stormtopo.core.node_fit import NodeFacts, milli

    plain = {n: NodeFacts({"gpu": "a100"}, (), {"cpu": milli("64")}) for n in TOPOLOGY.nodes}
    anywhere = dataclasses.replace(snap(service(SOFT1, BIG, update_strategy="RollingUpdate"), WIDE), nodes=plain)
    assert plan_healing(anywhere, HealMemory()).moving is not None
    taint = {"key": "maintenance", "value": "true", "effect": "NoSchedule"}
    for node0 in (NodeFacts({"gpu": "a100"}, (taint,), {"cpu": milli("64")}), NodeFacts({"gpu": "a100"}, (), {"cpu": 0})):
        nodes = {**plain, "node0": node0}
        pods = tuple({**p, "spec": {**p["spec"], "containers": [{"resources": {"requests": {"cpu": "1"}}}]}} for p in WIDE.pods)
        wide = Replica(WIDE.roleset, pods)
        plan = plan_healing(
            dataclasses.replace(snap(service(SOFT1, BIG, update_strategy="RollingUpdate"), wide), nodes=nodes), HealMemory()
        )
        assert plan.moving is None and "no domain within tier 1 has room" in plan.verdicts[0].blocked
    tolerant = tuple({**p, "spec": {**p["spec"], "tolerations": [{"key": "maintenance", "operator": "Exists"}]}} for p in WIDE.pods)
    nodes = {**plain, "node0": NodeFacts({"gpu": "a100"}, (taint,), {"cpu": milli("64")})}
    assert plan_healing(
        dataclasses.replace(snap(service(SOFT1, BIG, update_strategy="RollingUpdate"), Replica(WIDE.roleset, tolerant)), nodes=nodes),
        HealMemory(),
    ).moving


def test_a_hard_replica_in_violation_moves_back_within_its_tier() -> None:
    plan = plan_healing(snap(service(HARD1, BIG, update_strategy="RollingUpdate"), WIDE), HealMemory())
    assert plan.moving is not None and plan.moving.why is Why.VIOLATION
    assert "violates its hard request" in said(plan, "ReplicaMoving")[0]


def test_a_disruption_budget_that_forbids_the_eviction_stops_the_move_and_says_so_once() -> None:
    budgets = (pdb("other", 0, {"matchLabels": {"app": "elsewhere"}}), pdb("keep-one", 1, {"matchLabels": {"app": "svc"}}))
    plan = plan_healing(snap(service(SOFT1, BIG, update_strategy="RollingUpdate"), WIDE, budgets=budgets), HealMemory())
    assert plan.moving is None and evictions(plan) == []
    (message,) = said(plan, "ReplicaNotMoved")
    assert "PodDisruptionBudget keep-one allows 1 disruptions" in message and "evicts 2 of its pods" in message
    again = plan_healing(snap(service(SOFT1, BIG, update_strategy="RollingUpdate"), WIDE, budgets=budgets), plan.memory)
    assert said(again, "ReplicaNotMoved") == []


def test_a_budget_with_room_for_every_pod_lets_it_move_one_pod_after_another() -> None:
    budgets = (pdb("two", 2, {"matchExpressions": [{"key": "app", "operator": "In", "values": ["svc"]}]}),)
    plan = plan_healing(snap(service(SOFT1, BIG, update_strategy="RollingUpdate"), WIDE, budgets=budgets), HealMemory())
    assert plan.moving is not None and plan.one_at_a_time  # evictions under one budget conflict on its status
    unrelated = (pdb("other", 0, {"matchLabels": {"app": "elsewhere"}}),)
    together = plan_healing(snap(service(SOFT1, BIG, update_strategy="RollingUpdate"), WIDE, budgets=unrelated), HealMemory())
    assert not together.one_at_a_time


def test_two_wide_replicas_move_one_at_a_time() -> None:
    other = replica("svc-b", "node5", "node7")
    busy = {**BUSY, "node4": 0, "node6": 8}  # s2 has node4 free too
    svc = service(SOFT1, BIG, replicas=2, update_strategy="RollingUpdate")
    first = plan_healing(snap(svc, WIDE, other, busy=busy), HealMemory())
    assert first.moving is not None and first.moving.replica == "svc-a"
    assert evictions(first) == ["svc-a-decode-0", "svc-a-prefill-0"]
    # While svc-a is on its way (its record not settled, its new pods not ready), svc-b waits.
    moving = {"svc-a": {"at": stamp(NOW), "from": "s4, tier 2", "reason": "soft-above-tier"}}
    svc[("metadata")]["annotations"][MOVES_ANNOTATION] = json.dumps(moving)
    back = replica("svc-a", None, None)
    later = plan_healing(replace(snap(svc, back, other, busy=busy), now=NOW + 5), first.memory)
    assert later.moving is None
    assert "svc-a is moving" in later.verdicts[1].blocked


def test_never_below_the_services_replicas_minus_its_budget() -> None:
    svc = service(SOFT1, BIG, replicas=2, update_strategy="RollingUpdate")
    svc["spec"]["updateStrategy"] = {"type": "RollingUpdate", "maxSurge": 1, "maxUnavailable": 0}
    unready = replica("svc-b", "node5", "node7", ready=False)
    plan = plan_healing(snap(svc, WIDE, unready), HealMemory())
    assert plan.moving is None
    assert "keeps at least 2 of 2 (maxUnavailable 0)" in plan.verdicts[0].blocked


def test_not_twice_within_the_cool_down_even_after_a_restart() -> None:
    svc = service(SOFT1, BIG, update_strategy="RollingUpdate")
    svc["metadata"]["annotations"][MOVES_ANNOTATION] = json.dumps({"svc-a": {"at": stamp(NOW - 100), "done": True}})
    plan = plan_healing(snap(svc, WIDE), HealMemory())  # a new operator: empty memory, the record on the StormService
    assert plan.moving is None and "its cool-down of 900 s ends at" in plan.verdicts[0].blocked
    assert plan_healing(replace(snap(svc, WIDE), now=NOW + 900), HealMemory()).moving is not None


def test_a_move_settles_once_its_replica_is_ready_on_new_pods() -> None:
    svc = service(SOFT1, BIG, update_strategy="RollingUpdate")
    old = [p["metadata"]["uid"] for p in WIDE.pods]
    svc["metadata"]["annotations"][MOVES_ANNOTATION] = json.dumps({"svc-a": {"at": stamp(NOW - 30), "pods": old}})
    moved = replica("svc-a", "node0", "node1", created=NOW - 28)
    plan = plan_healing(snap(svc, moved, busy={**BUSY, "node0": 8, "node3": 0}), HealMemory())
    (settled,) = plan.settled
    assert settled.unavailable == pytest.approx(7.0)  # ready 5 s after its pods were created, 2 s after the move
    (record,) = [w for w in plan.writes if isinstance(w, RecordMove)]
    assert record.record["done"] is True and record.record["landed"] is True
    # Old pods still running (a partial eviction) do not count as the move's end.
    assert plan_healing(snap(svc, WIDE), HealMemory()).settled == ()


def test_a_refused_eviction_ends_the_move_and_backs_off() -> None:
    snapshot = snap(service(SOFT1, BIG, update_strategy="RollingUpdate"), WIDE)
    plan = plan_healing(snapshot, HealMemory())
    writes, memory = plan_refused(
        snapshot, plan, "svc-a-decode-0", "Cannot evict pod as it would violate the pod's disruption budget.", plan.memory
    )
    record = next(w for w in writes if isinstance(w, RecordMove))
    assert record.record["done"] is True and "disruption budget" in str(record.record["refused"])
    assert "eviction of pod svc-a-decode-0 was refused" in next(w.say.message for w in writes if isinstance(w, PostEvent))
    assert memory.next_try["svc-a"] == NOW + BACKOFF
    assert "trying again at" in plan_healing(replace(snapshot, now=NOW + 1), memory).verdicts[0].blocked
    assert plan_refused(snapshot, plan, "x", "again", memory)[1].backoff["svc-a"] == 2 * BACKOFF


@pytest.mark.parametrize(
    ("strategy", "replicas", "budget"),
    [
        ({}, 3, 1),  # both 0: one may be unavailable
        ({"maxUnavailable": "50%"}, 3, 1),  # rounds down
        ({"maxUnavailable": 2}, 3, 2),
        ({"maxSurge": 1, "maxUnavailable": 0}, 3, 0),
        ({"maxUnavailable": 5}, 2, 2),  # never more than it has
        ({"maxUnavailable": "2"}, 3, 0),  # AIBrix refuses a string without %: none unavailable
        ({"maxUnavailable": "50.5%"}, 3, 0),
    ],
)
def test_the_budget_is_resolved_as_aibrix_resolves_it(strategy: dict[str, Any], replicas: int, budget: int) -> None:
    svc = {"spec": {"replicas": replicas, "updateStrategy": strategy}}
    assert replica_budget(svc) == (replicas, budget)


def test_a_service_needs_a_pass_only_with_a_wide_record_or_a_move_under_way() -> None:
    svc = service(SOFT1, BIG, update_strategy="RollingUpdate")
    assert not may_need_healing(svc, TIERS, TOPOLOGY)  # nothing recorded yet
    svc["metadata"]["annotations"][PLACEMENT_ANNOTATION] = json.dumps({"svc-a": {"hyperNode": "s0", "tier": 1}})
    assert not may_need_healing(svc, TIERS, TOPOLOGY)
    svc["metadata"]["annotations"][PLACEMENT_ANNOTATION] = json.dumps({"svc-a": {"hyperNode": "s4", "tier": 2}})
    assert may_need_healing(svc, TIERS, TOPOLOGY)
    svc["metadata"]["annotations"][HEAL_ANNOTATION] = "false"
    assert not may_need_healing(svc, TIERS, TOPOLOGY)


def test_a_finished_pod_left_behind_neither_blocks_a_move_nor_its_settling() -> None:
    evicted_by_kubelet = {
        "metadata": {
            "name": "svc-a-decode-old",
            "namespace": "ns",
            "creationTimestamp": stamp(NOW - 7200),
            "labels": {"roleset-name": "svc-a"},
        },
        "spec": {"nodeName": "node6"},
        "status": {"phase": "Failed"},
    }
    wide = replace(WIDE, pods=(*WIDE.pods, evicted_by_kubelet))
    assert plan_healing(snap(service(SOFT1, BIG, update_strategy="RollingUpdate"), wide), HealMemory()).moving is not None
    svc = service(SOFT1, BIG, update_strategy="RollingUpdate")
    old = [p["metadata"]["uid"] for p in WIDE.pods]
    svc["metadata"]["annotations"][MOVES_ANNOTATION] = json.dumps({"svc-a": {"at": stamp(NOW - 30), "pods": old}})
    moved = replica("svc-a", "node0", "node1", created=NOW - 28)
    moved = replace(moved, pods=(*moved.pods, evicted_by_kubelet))
    svc["metadata"]["annotations"][MOVES_ANNOTATION] = json.dumps({"svc-a": {"at": stamp(NOW - 30), "pods": ["svc-a-decode-old"]}})
    assert len(plan_healing(snap(svc, moved, busy={**BUSY, "node0": 8, "node3": 0}), HealMemory()).settled) == 1


# -- the review's findings, each a test that failed before its fix ---------------------------------


def test_while_it_moves_its_podgroup_is_held_hard_within_the_targets_tier_then_let_go() -> None:
    podgroup = {
        "metadata": {"name": "svc-a", "namespace": "ns"},
        "spec": {"minMember": 2, "networkTopology": {"mode": "soft", "highestTierAllowed": 1}},
    }
    snapshot = replace(snap(service(SOFT1, BIG, update_strategy="RollingUpdate"), WIDE), podgroups={"svc-a": podgroup})
    plan = plan_healing(snapshot, HealMemory())
    (held,) = [w for w in plan.writes if isinstance(w, PatchPodGroup)]
    assert {"op": "replace", "path": "/spec/networkTopology", "value": {"mode": "hard", "highestTierAllowed": 1}} in held.ops
    # Before the evictions: no Volcano session between them sees the gang soft.
    assert plan.writes.index(held) < min(plan.writes.index(w) for w in plan.writes if isinstance(w, EvictPod))
    record = next(w for w in plan.writes if isinstance(w, RecordMove)).record
    assert record["toTier"] == 1 and sorted(record["pods"]) == sorted(p["metadata"]["uid"] for p in WIDE.pods)  # type: ignore[arg-type]
    assert record["v"] == 2 and record["request"] == {"mode": "soft", "highestTierAllowed": 1}  # data: what its PodGroup asks after
    # Settled: the PodGroup is let go back to soft.
    svc = service(SOFT1, BIG, update_strategy="RollingUpdate")
    svc["metadata"]["annotations"][MOVES_ANNOTATION] = json.dumps({"svc-a": dict(record)})
    hard = {**podgroup, "spec": {"minMember": 2, "networkTopology": {"mode": "hard", "highestTierAllowed": 1}}}
    moved = replica("svc-a", "node0", "node1", created=NOW + 5)
    after = plan_healing(
        replace(snap(svc, moved, busy={**BUSY, "node0": 8, "node3": 0}), now=NOW + 30, podgroups={"svc-a": hard}), HealMemory()
    )
    (let_go,) = [w for w in after.writes if isinstance(w, PatchPodGroup)]
    assert {"op": "replace", "path": "/spec/networkTopology", "value": {"mode": "soft", "highestTierAllowed": 1}} in let_go.ops


def test_a_gang_still_unplaced_after_the_hold_is_let_go_soft_and_its_cool_down_doubles() -> None:
    svc = service(SOFT1, BIG, update_strategy="RollingUpdate")
    svc["metadata"]["annotations"][MOVES_ANNOTATION] = json.dumps({"svc-a": {"at": stamp(NOW - 130), "toTier": 1, "pods": ["gone"]}})
    pending = replace(
        replica("svc-a", None, None), pods=tuple({**p, "spec": {}} for p in replica("svc-a", "node0", "node1", created=NOW - 120).pods)
    )
    plan = plan_healing(snap(svc, pending), HealMemory())
    (settled,) = plan.settled
    assert not settled.landed
    record = next(w for w in plan.writes if isinstance(w, RecordMove)).record
    assert record["done"] is True and record["cooldown"] == 2 * 900


def test_after_three_moves_that_did_not_land_it_is_given_up_with_one_warning() -> None:
    """Issue 34, item 4: not a restart every 4 hours forever. The misses count across moves (each new
    record carries them), a landed move starts afresh, and the third miss stops the moves."""
    from stormtopo.core.cooldown import GIVE_UP_AFTER
    from stormtopo.core.verdict import Block

    svc = service(SOFT1, BIG, update_strategy="RollingUpdate")
    svc["metadata"]["annotations"][MOVES_ANNOTATION] = json.dumps(
        {"svc-a": {"at": stamp(NOW - 130), "toTier": 1, "pods": ["gone"], "misses": GIVE_UP_AFTER - 1}}
    )
    pending = replace(
        replica("svc-a", None, None), pods=tuple({**p, "spec": {}} for p in replica("svc-a", "node0", "node1", created=NOW - 120).pods)
    )
    record = next(w for w in plan_healing(snap(svc, pending), HealMemory()).writes if isinstance(w, RecordMove)).record
    assert record["misses"] == GIVE_UP_AFTER and not record["landed"]
    # Long after its cool-down, still wide with room in s0: given up, said once as a Warning.
    svc["metadata"]["annotations"][MOVES_ANNOTATION] = json.dumps({"svc-a": {**record, "at": stamp(NOW - 10 * 3600)}})
    plan = plan_healing(snap(svc, WIDE), HealMemory())
    assert plan.moving is None and evictions(plan) == [] and plan.verdicts[0].block is Block.GAVE_UP
    (warning,) = [w for w in plan.writes if isinstance(w, PostEvent)]
    assert warning.say.type == "Warning" and "did not land" in warning.say.message
    assert [w for w in plan_healing(snap(svc, WIDE), plan.memory).writes if isinstance(w, PostEvent)] == []  # once
    # One miss short of it: it moves, and the new record carries the misses so far.
    svc["metadata"]["annotations"][MOVES_ANNOTATION] = json.dumps({"svc-a": {**record, "misses": 1, "at": stamp(NOW - 10 * 3600)}})
    moving = plan_healing(snap(svc, WIDE), HealMemory())
    assert moving.moving is not None and next(w for w in moving.writes if isinstance(w, RecordMove)).record["misses"] == 1


def test_a_refused_eviction_backs_off_30_s_not_the_whole_cool_down() -> None:
    svc = service(SOFT1, BIG, update_strategy="RollingUpdate")
    snapshot = snap(svc, WIDE)
    plan = plan_healing(snapshot, HealMemory())
    writes, memory = plan_refused(snapshot, plan, "svc-a-decode-0", "Cannot evict pod ...", plan.memory)
    record = next(w for w in writes if isinstance(w, RecordMove))
    svc["metadata"]["annotations"][MOVES_ANNOTATION] = json.dumps({"svc-a": dict(record.record)})
    assert "at" not in record.record  # it never moved
    assert "trying again at" in plan_healing(replace(snap(svc, WIDE), now=NOW + 10), HealMemory()).verdicts[0].blocked  # a restart keeps it
    assert plan_healing(replace(snap(svc, WIDE), now=NOW + BACKOFF + 1), memory).moving is not None


def test_a_replica_on_nodes_the_tree_does_not_know_is_not_evicted() -> None:
    unknown = replica("svc-a", "new-node-a", "new-node-b")
    plan = plan_healing(
        snap(service(SOFT1, BIG, update_strategy="RollingUpdate"), unknown, busy={**BUSY, "node1": 0, "node3": 0}), HealMemory()
    )
    assert plan.moving is None and "is in no HyperNode" in plan.verdicts[0].blocked


def test_a_pod_covered_by_two_budgets_is_not_begun() -> None:
    budgets = (pdb("service", 5, {"matchLabels": {"app": "svc"}}), pdb("prefill", 5, {"matchLabels": {"role-name": "prefill"}}))
    plan = plan_healing(snap(service(SOFT1, BIG, update_strategy="RollingUpdate"), WIDE, budgets=budgets), HealMemory())
    assert plan.moving is None and evictions(plan) == []
    assert "covered by PodDisruptionBudgets prefill, service" in said(plan, "ReplicaNotMoved")[0]


def test_a_budget_its_controller_has_not_observed_refuses_as_the_eviction_api_does() -> None:
    unobserved = pdb("new", 5, {"matchLabels": {"app": "svc"}})
    unobserved["metadata"]["generation"] = 2
    unobserved["status"]["observedGeneration"] = 1
    assert (
        plan_healing(snap(service(SOFT1, BIG, update_strategy="RollingUpdate"), WIDE, budgets=(unobserved,)), HealMemory()).moving is None
    )


def test_settling_compares_pods_not_clocks() -> None:
    svc = service(SOFT1, BIG, update_strategy="RollingUpdate")
    svc["metadata"]["annotations"][MOVES_ANNOTATION] = json.dumps(
        {"svc-a": {"at": stamp(NOW - 30), "pods": [p["metadata"]["uid"] for p in WIDE.pods]}}
    )
    moved = replica("svc-a", "node0", "node1", created=NOW - 32)  # the API server's clock 3 s behind the operator's
    assert plan_healing(snap(svc, moved, busy={**BUSY, "node0": 8, "node3": 0}), HealMemory()).settled


def test_a_changing_count_in_the_reason_is_said_once() -> None:
    posted = 0
    memory = HealMemory()
    for allowed in (1, 0, 1, 0, 1):
        plan = plan_healing(
            snap(
                service(SOFT1, BIG, update_strategy="RollingUpdate"), WIDE, budgets=(pdb("keep", allowed, {"matchLabels": {"app": "svc"}}),)
            ),
            memory,
        )
        memory = plan.memory
        posted += len(said(plan, "ReplicaNotMoved"))
    assert posted == 1


def test_a_half_evicted_replica_is_finished() -> None:
    svc = service(SOFT1, BIG, update_strategy="RollingUpdate")
    old = [p["metadata"]["uid"] for p in WIDE.pods]
    svc["metadata"]["annotations"][MOVES_ANNOTATION] = json.dumps({"svc-a": {"at": stamp(NOW - 60), "to": "s0", "toTier": 1, "pods": old}})
    old_prefill = WIDE.pods[0]
    new_decode = replica("svc-a", None, "node3", created=NOW - 50).pods[0]
    plan = plan_healing(snap(svc, replace(WIDE, pods=(old_prefill, new_decode))), HealMemory())
    assert evictions(plan) == ["svc-a-prefill-0"]
    assert plan.moving is None  # resumed, not begun again


def test_a_replica_blocked_by_its_cool_down_does_not_hold_back_the_next() -> None:
    other = replica("svc-b", "node5", "node7")
    svc = service(SOFT1, BIG, replicas=2, update_strategy="RollingUpdate")
    svc["metadata"]["annotations"][MOVES_ANNOTATION] = json.dumps({"svc-a": {"at": stamp(NOW - 100), "done": True}})
    busy = {**BUSY, "node4": 0, "node6": 8}
    plan = plan_healing(snap(svc, WIDE, other, busy=busy), HealMemory())
    assert plan.moving is not None and plan.moving.replica == "svc-b"


def test_an_empty_replica_and_a_drained_node_never_move_anything() -> None:
    empty = Replica({"metadata": {"name": "svc-e", "namespace": "ns"}, "spec": {"roles": []}}, ())
    assert plan_healing(snap(service(SOFT1, BIG, update_strategy="RollingUpdate"), empty), HealMemory()).moving is None
    drained = {n: g for n, g in free(BUSY).items() if n != "node0"}  # a cordoned node is left out of the reading
    assert (
        plan_healing(replace(snap(service(SOFT1, BIG, update_strategy="RollingUpdate"), WIDE), free=drained), HealMemory()).moving is None
    )


def test_nowhere_to_go_quiets_the_service_for_a_while() -> None:
    plan = plan_healing(snap(service(SOFT1, BIG, update_strategy="RollingUpdate"), WIDE, busy={**BUSY, "node0": 4}), HealMemory())
    assert plan.memory.quiet_until == NOW + NO_ROOM_RECHECK
    # The operator passes NO_ROOM_RECHECKS times its interval: a faster loop looks again sooner.
    faster = plan_healing(
        replace(snap(service(SOFT1, BIG, update_strategy="RollingUpdate"), WIDE, busy={**BUSY, "node0": 4}), recheck=3.0), HealMemory()
    )
    assert faster.memory.quiet_until == NOW + 3.0


def test_a_move_under_way_takes_its_target_so_no_second_service_is_moved_into_the_same_room() -> None:
    from stormtopo.core.cluster_moves import set_aside

    svc = service(SOFT1, BIG, update_strategy="RollingUpdate")
    plan = plan_healing(snap(svc, WIDE), HealMemory())
    record = next(w for w in plan.writes if isinstance(w, RecordMove)).record
    svc["metadata"]["annotations"][MOVES_ANNOTATION] = json.dumps({"svc-a": dict(record)})
    # Its pods evicted and pending: node0, node1 and node3 read free. Another service's wide replica holds
    # node3 and node5; planned against the raw reading it would be moved into s0 too.
    evicted = free({**BUSY, "node1": 0})
    taken = set_aside(evicted, TOPOLOGY, svc, [WIDE.roleset], {})
    assert taken["node0"] + taken["node1"] == 0
    other = replica("svc-a", "node3", "node5")
    assert (
        plan_healing(replace(snap(service(SOFT1, BIG, update_strategy="RollingUpdate"), other), free=evicted), HealMemory()).moving
        is not None
    )
    assert plan_healing(replace(snap(service(SOFT1, BIG, update_strategy="RollingUpdate"), other), free=taken), HealMemory()).moving is None
    assert set_aside(evicted, TOPOLOGY, svc, [WIDE.roleset], {"svc-a": 2}) == evicted  # placed: nothing set aside


def test_no_move_while_aibrix_rolls_the_service_out() -> None:
    svc = service(SOFT1, BIG, update_strategy="RollingUpdate")
    svc["metadata"]["generation"] = 3
    svc["status"] = {"observedGeneration": 3, "currentRevision": "svc-7c9", "updateRevision": "svc-5d4", "updatedReplicas": 0}
    plan = plan_healing(snap(svc, WIDE), HealMemory())
    assert plan.moving is None and evictions(plan) == []
    assert plan.verdicts[0].block is Block.ROLLOUT and "revision svc-7c9 to svc-5d4" in plan.verdicts[0].blocked
    svc["status"]["observedGeneration"] = 2  # a new spec AIBrix has not seen yet
    svc["status"]["currentRevision"] = "svc-5d4"
    assert "generation 3 not yet observed" in plan_healing(snap(svc, WIDE), HealMemory()).verdicts[0].blocked
    svc["status"] = {"observedGeneration": 3, "currentRevision": "svc-5d4", "updateRevision": "svc-5d4", "updatedReplicas": 0}
    plan = plan_healing(snap(svc, WIDE), HealMemory())  # done (a re-created pod makes updatedReplicas dip: no rollout)
    assert plan.moving is not None and plan.moving.replica == "svc-a"
    # An in-place update relabels RoleSets while the status already names one revision: a RoleSet of another.
    old = Replica({**WIDE.roleset, "metadata": {**WIDE.roleset["metadata"], "labels": {"storm-service-revision": "svc-7c9"}}}, WIDE.pods)
    assert "RoleSet svc-a of revision svc-7c9" in plan_healing(snap(svc, old), HealMemory()).verdicts[0].blocked
    # Paused: AIBrix rolls nothing out, whatever the revisions.
    svc["spec"]["paused"] = True
    svc["status"]["currentRevision"] = "svc-7c9"
    assert plan_healing(snap(svc, WIDE), HealMemory()).moving is not None


def _stranded(created: float) -> Replica:
    """Prefill running on node0 (s0); its decode re-created (its node gone) and Pending since `created`."""
    running = replica("svc-a", "node0", None)
    # Volcano found it unschedulable (its gang kept in s0) as soon as it was created.
    unschedulable = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "lastTransitionTime": stamp(created)}]
    pending = pod(
        "svc-a-decode-0",
        "decode",
        replica="svc-a",
        labels={"app": "svc"},
        status={"phase": "Pending", "conditions": unschedulable},
        uid=f"svc-a-decode-{created:.0f}",
        created=stamp(created),
        kind=None,
    )
    return Replica(running.roleset, (*running.pods, pending))


# node1 gone from s0 (not in the free reading), s0's node0 full with the prefill; s1 empty; the rest busy.
STRANDED_FREE = {n: g for n, g in free({"node0": 8, "node4": 8, "node5": 8, "node6": 8, "node7": 8}).items() if n != "node1"}


def test_a_stranded_hard_replica_moves_whole_into_a_domain_that_holds_it() -> None:
    """Issue 35, item 2: a pod Pending past the threshold in a domain that cannot hold it, while another
    leaf holds the whole replica: every pod of it is evicted (the running prefill too) and the gang is
    held within that leaf's tier."""
    from stormtopo.core.stranded import STRANDED_AFTER

    stale = NOW - STRANDED_AFTER - 1
    snapshot = HealSnapshot(
        service(HARD1, BIG, update_strategy="RollingUpdate"), (_stranded(stale),), TIERS, TOPOLOGY, STRANDED_FREE, (), NOW
    )
    plan = plan_healing(snapshot, HealMemory())
    assert plan.moving is not None and plan.moving.why is Why.STRANDED
    assert plan.moving.target is not None and plan.moving.target.switch.name == "s1"
    assert evictions(plan) == ["svc-a-decode-0", "svc-a-prefill-0"]  # the pending one too: the gang starts afresh
    (moving,) = said(plan, "ReplicaMoving")
    assert "keeps a gang with a running pod in its domain" in moving
    # Not before the threshold, and not a soft replica (Volcano places a soft one's pod outside its domain).
    early = HealSnapshot(
        service(HARD1, BIG, update_strategy="RollingUpdate"), (_stranded(NOW - 60),), TIERS, TOPOLOGY, STRANDED_FREE, (), NOW
    )
    assert plan_healing(early, HealMemory()).moving is None
    soft = HealSnapshot(service(SOFT1, BIG, update_strategy="RollingUpdate"), (_stranded(stale),), TIERS, TOPOLOGY, STRANDED_FREE, (), NOW)
    assert plan_healing(soft, HealMemory()).moving is None
    # A pod held at a scheduling gate (stormtopo's own: a router, a spread replica not let go yet) waits for no room.
    gated = _stranded(NOW - STRANDED_AFTER - 1)
    held = tuple({**p, "spec": {"schedulingGates": [{"name": "stormtopo.io/domain"}]}} if not p["spec"] else p for p in gated.pods)
    gate = HealSnapshot(
        service(HARD1, BIG, update_strategy="RollingUpdate"), (Replica(gated.roleset, held),), TIERS, TOPOLOGY, STRANDED_FREE, (), NOW
    )
    assert plan_healing(gate, HealMemory()).moving is None
    # A router pinned to s0 by stormtopo's release (its hostname affinity) does not make s1 no room.
    pinned = tuple(
        {
            **p,
            "spec": {
                **p["spec"],
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["node0", "node1"]}]}
                            ]
                        }
                    }
                },
            },
        }
        if p["spec"].get("nodeName")
        else p
        for p in _stranded(NOW - STRANDED_AFTER - 1).pods
    )
    from stormtopo.core.node_fit import NodeFacts

    facts = {n: NodeFacts({"kubernetes.io/hostname": n}) for n in TOPOLOGY.nodes}
    with_pin = HealSnapshot(
        service(HARD1, BIG, update_strategy="RollingUpdate"),
        (Replica(gated.roleset, pinned),),
        TIERS,
        TOPOLOGY,
        STRANDED_FREE,
        (),
        NOW,
        nodes=facts,
    )
    plan = plan_healing(with_pin, HealMemory())
    assert plan.moving is not None and plan.moving.target is not None and plan.moving.target.switch.name == "s1"
    # No other leaf holds it: it stays, and nothing is evicted.
    full = {**STRANDED_FREE, "node2": 0, "node3": 0}
    none = HealSnapshot(
        service(HARD1, BIG, update_strategy="RollingUpdate"), (_stranded(NOW - STRANDED_AFTER - 1),), TIERS, TOPOLOGY, full, (), NOW
    )
    assert plan_healing(none, HealMemory()).moving is None and evictions(plan_healing(none, HealMemory())) == []


def test_without_healing_a_stranded_replica_is_said_once_with_where_it_would_fit() -> None:
    from stormtopo.core.healing import plan_stranded
    from stormtopo.core.stranded import STRANDED_AFTER

    svc = service({MODE: "hard", HIGHEST_TIER: "1"}, BIG, update_strategy="RollingUpdate")
    snapshot = HealSnapshot(svc, (_stranded(NOW - STRANDED_AFTER - 1),), TIERS, TOPOLOGY, STRANDED_FREE, (), NOW)
    assert plan_healing(snapshot, HealMemory()).writes == ()  # nothing moves without the opt-in
    writes, memory = plan_stranded(snapshot, HealMemory())
    (event,) = writes
    assert isinstance(event, PostEvent) and event.say.reason == "ReplicaStranded" and event.say.type == "Warning"
    assert "s1 (tier 1) holds the whole replica now" in event.say.message and "stormtopo.io/heal" in event.say.message
    assert plan_stranded(snapshot, memory)[0] == []  # once
    # A service that asks for healing but may not be moved (its RoleSet names share a prefix with another's): the
    # notice says it is not moved and why, not to set what is set.
    asking = replace(
        snapshot, stormservice=service({MODE: "hard", HIGHEST_TIER: "1", HEAL_ANNOTATION: "true"}, BIG, update_strategy="RollingUpdate")
    )
    (event,) = plan_stranded(asking, HealMemory())[0]
    assert isinstance(event, PostEvent) and "s1 (tier 1) holds the whole replica now" in event.say.message
    assert (
        "not moved" in event.say.message
        and "InvalidHealAnnotation" in event.say.message
        and "With stormtopo.io/heal" not in event.say.message
    )


def test_a_replica_volcano_is_preempting_is_not_healed_meanwhile() -> None:
    """A replica whose pods Volcano is evicting for a higher-priority gang (a deletion under way, the
    DisruptionTarget condition Kubernetes sets on a preempted pod) is not moved: no eviction of its
    other pod, no move begun; once its pods are gone AIBrix makes new ones, placed by the normal path."""
    preempted = replica("svc-a", "node1", "node3")
    victim = dict(preempted.pods[0])
    victim["metadata"] = {**victim["metadata"], "deletionTimestamp": stamp(NOW - 1)}
    victim["status"] = {
        **victim["status"],
        "conditions": [*victim["status"]["conditions"], {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}],
    }
    plan = plan_healing(
        snap(service(SOFT1, BIG, update_strategy="RollingUpdate"), replace(preempted, pods=(victim, *preempted.pods[1:]))), HealMemory()
    )
    assert plan.moving is None and evictions(plan) == [] and not said(plan, "ReplicaMoving")
    # the same replica, not preempted, moves
    assert evictions(plan_healing(snap(service(SOFT1, BIG, update_strategy="RollingUpdate"), preempted), HealMemory())) != []
