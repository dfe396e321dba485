"""Making room (core/room.py, and its move in core/healing.py): a wide replica that no leaf holds gets
one when a smaller replica of another service that lends room moves to a leaf Volcano surely prefers. On
the feature request's tree: leaves s0..s3 of two 8-GPU nodes each (s0: node0, node1; s1: node2, node3; ...)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from stormtopo.core.disruption import lender_budget
from stormtopo.core.heal_plan import HealMemory
from stormtopo.core.heal_snapshot import HealSnapshot
from stormtopo.core.healing import plan_healing
from stormtopo.core.lending import MakeRoom, recorded_for, resident, room_made_for, wide_replica
from stormtopo.core.packing import domains_at_tier
from stormtopo.core.replica_pods import Replica
from stormtopo.core.room import Resident, room_by_moving, take
from stormtopo.core.verdict import Block, Why
from stormtopo.core.vocabulary import HEAL_ANNOTATION, LEND_ROOM_ANNOTATION, MOVES_ANNOTATION, PLACEMENT_ANNOTATION
from stormtopo.core.writes import EvictPod, PostEvent, RecordMove
from stormtopo.devenv.workloads import Role
from tests import builders
from tests.builders import pod, roleset, running
from tests.core.healing_cases import NOW, SOFT1, TIERS, TOPOLOGY, stamp

# The wide replica: 8 + 8 GPUs, prefill on node1 (s0), decode on node3 (s1).
WIDE_PODS, WIDE_HELD = (8, 8), {"node1": 8, "node3": 8}
SMALL = Resident("other", "small", "small-0", {"node0": 2}, (1, 1), 1)  # on node0 (s0), 6 GPUs free beside it


def free(**gpus: int) -> dict[str, int]:
    """Free GPUs per node: the ones named, every other node full (the residents' own GPUs counted used)."""
    return {n: gpus.get(n, 0) for n in TOPOLOGY.nodes}


def test_a_small_replica_moves_to_a_fuller_leaf_and_the_wide_one_then_fits_where_it_was() -> None:
    # s2 has 4 free on node4: Volcano scores it 16/16 while the old pods terminate (they count in the gang's
    # request again: 12 used + 2 + 2), s0 14/16; and 14/16 against 10/16 once they are gone.
    room = room_by_moving(WIDE_PODS, WIDE_HELD, 1, [SMALL], free(node0=6, node4=4), {}, TOPOLOGY)
    assert room is not None and room.resident == SMALL
    assert room.to.switch.name == "s2" and room.frees.switch.name == "s0"


def test_with_the_node_tier_no_resident_on_a_listed_node_is_offered() -> None:
    """Issue 34, item 4: on a node the node tier lists as a tier-0 HyperNode, where Volcano places the moved
    resident again is decided over tier 0 too, which the prediction does not model: it is not offered."""
    assert room_by_moving(WIDE_PODS, WIDE_HELD, 1, [SMALL], free(node0=6, node4=4), {}, TOPOLOGY, listed={"node0"}) is None
    assert room_by_moving(WIDE_PODS, WIDE_HELD, 1, [SMALL], free(node0=6, node4=4), {}, TOPOLOGY, listed={"node4"}) is not None


def test_a_resident_of_higher_priority_is_never_moved_for_a_wide_replica_of_lower() -> None:
    """Issue 41, item 4: GPU clusters run inference above batch; room is made by the less important for
    the more important, or among equals, never the other way."""
    import dataclasses

    important = dataclasses.replace(SMALL, priority=1000)
    gpus = free(node0=6, node4=4)
    assert room_by_moving(WIDE_PODS, WIDE_HELD, 1, [important], gpus, {}, TOPOLOGY, priority=10) is None
    assert room_by_moving(WIDE_PODS, WIDE_HELD, 1, [important], gpus, {}, TOPOLOGY, priority=1000) is not None
    assert room_by_moving(WIDE_PODS, WIDE_HELD, 1, [SMALL], gpus, {}, TOPOLOGY, priority=10) is not None  # batch for inference


def test_no_move_where_volcano_would_send_the_resident_straight_back() -> None:
    # s2 with 8 free is emptier than s0 (6 free while its old pods terminate): binpack picks s0 again.
    assert room_by_moving(WIDE_PODS, WIDE_HELD, 1, [SMALL], free(node0=6, node4=8), {}, TOPOLOGY) is None
    # A tie (s2 with 6 free) goes to the domain holding the gang's old pods, then to Go's map order.
    assert room_by_moving(WIDE_PODS, WIDE_HELD, 1, [SMALL], free(node0=6, node4=6), {}, TOPOLOGY) is None
    # s2 with exactly the 2 GPUs it needs: while its old pods terminate, Volcano asks for 4 and scores s2 0
    # (what sent it back on the local control plane).
    assert room_by_moving(WIDE_PODS, WIDE_HELD, 1, [SMALL], free(node0=6, node4=2), {}, TOPOLOGY) is None
    # Its old leaf cannot hold it while its old pods terminate, but once they are gone it is as full as s2.
    whole = Resident("other", "whole", "whole-0", {"node0": 8}, (4, 4), 1)
    assert room_by_moving(WIDE_PODS, WIDE_HELD, 1, [whole], free(node4=4, node5=4), {}, TOPOLOGY) is None


def test_domains_are_scored_on_the_nodes_allocatable_gpus_not_the_trees() -> None:
    # s2 (4 + 5 free of 16) beats s0 (6 free of 16) by a little; were s0's nodes 16-GPU nodes (the operator
    # reads allocatable GPUs; a tree read from HyperNodes knows no sizes), s0 (6 of 32) ties with it.
    assert room_by_moving(WIDE_PODS, WIDE_HELD, 1, [SMALL], free(node0=6, node4=5), {}, TOPOLOGY) is not None
    bigger_s0 = {"node0": 16, "node1": 16}
    assert room_by_moving(WIDE_PODS, WIDE_HELD, 1, [SMALL], free(node0=6, node4=5), bigger_s0, TOPOLOGY) is None


def test_a_resident_refused_by_its_own_plan_is_skipped_for_the_next_in_line() -> None:
    gpus = free(node0=6, node4=4)
    assert room_by_moving(WIDE_PODS, WIDE_HELD, 1, [SMALL], gpus, {}, TOPOLOGY) is not None
    assert room_by_moving(WIDE_PODS, WIDE_HELD, 1, [SMALL], gpus, {}, TOPOLOGY, skip={"other/small/small-0"}) is None
    # Two residents on node0 (4 free): moving either alone leaves node0 short of the 8 the wide replica needs.
    other = Resident("other", "other", "other-0", {"node0": 2}, (1, 1), 1)
    assert room_by_moving(WIDE_PODS, WIDE_HELD, 1, [SMALL, other], free(node0=4, node4=4), {}, TOPOLOGY) is None


def test_take_says_when_its_greedy_placement_cannot_place_every_pod() -> None:
    (s0,) = [d for d in domains_at_tier(TOPOLOGY, free(node0=3, node1=3), [3, 3], 1) if d.switch.name == "s0"]
    assert take(free(node0=3, node1=3), s0, [3, 3]) == free()
    assert take(free(node0=3, node1=3), s0, [4]) is None


def test_the_resident_moves_first_so_it_never_counts_on_the_room_the_wide_replica_leaves() -> None:
    # No other leaf has room for it now; node3's GPUs are the wide replica's until it moves itself.
    assert room_by_moving(WIDE_PODS, WIDE_HELD, 1, [SMALL], free(node0=6), {}, TOPOLOGY) is None


def test_the_smallest_resident_that_helps_is_chosen_and_one_that_cannot_help_is_skipped() -> None:
    far = Resident("other", "far", "far-0", {"node7": 2}, (1, 1), 1)  # in s3: leaving it opens nothing near 16 GPUs
    three = Resident("other", "three", "three-0", {"node2": 3}, (1, 1, 1), 1)  # in s1, beside the wide decode
    gpus = free(node0=6, node2=5, node4=4, node6=3)
    room = room_by_moving(WIDE_PODS, WIDE_HELD, 1, [three, far, SMALL], gpus, {}, TOPOLOGY)
    assert room is not None and room.resident == SMALL and room.to.switch.name == "s2" and room.frees.switch.name == "s0"
    room = room_by_moving(WIDE_PODS, WIDE_HELD, 1, [three, far], gpus, {}, TOPOLOGY)
    # Its old pods counted twice, only s0 takes it (16/16) while they terminate; s3 once they are gone.
    assert room is not None and room.resident == three and room.to.switch.name == "s0" and room.frees.switch.name == "s1"
    assert room_by_moving(WIDE_PODS, WIDE_HELD, 1, [far], gpus, {}, TOPOLOGY) is None


# -- the resident's own plan -------------------------------------------------------------------------

ONE_EACH = (Role("prefill", gpus=1), Role("decode", gpus=1))


LEND = {LEND_ROOM_ANNOTATION: "true"}


def small_service(moves: dict[str, Any] | None = None, replicas: int = 2, lends: bool = True) -> dict[str, Any]:
    """The smaller service: by default a lender of two replicas (small-0 is the one ordered to move)."""
    annotations = {**SOFT1, **(LEND if lends else {})}
    svc = builders.service(annotations, ONE_EACH, name="small", namespace="other", replicas=replicas, update_strategy="RollingUpdate")
    if moves:
        svc["metadata"]["annotations"][MOVES_ANNOTATION] = json.dumps(moves)
    return svc


def small_replica(prefill: str, decode: str, name: str = "small-0", ready: bool = True) -> Replica:
    pods = tuple(
        pod(
            f"{name}-{role}-0",
            role,
            node,
            replica=name,
            service="small",
            namespace="other",
            labels={},
            status=running(ready, stamp(NOW - 3500)),
            uid=f"{name}-{role}",
            created=stamp(NOW - 3600),
            owner_uid=f"{name}-uid",
            kind=None,
        )
        for role, node in (("prefill", prefill), ("decode", decode))
    )
    return Replica(roleset(name, ONE_EACH, service="small", namespace="other", uid=f"{name}-uid", kind=None), pods)


SIBLING = small_replica("node6", "node6", name="small-1")  # the lender's other replica, ready, in s3


ORDER = MakeRoom("small-0", wide_replica("ns", "svc", "svc-a"), "s0")


def plan_for(svc: dict[str, Any], free_gpus: dict[str, int], order: MakeRoom | None = ORDER, *others: Replica) -> Any:
    from stormtopo.core.heal_snapshot import HealSnapshot

    replicas = (small_replica("node0", "node0"), *(others or (SIBLING,)))
    return plan_healing(HealSnapshot(svc, replicas, TIERS, TOPOLOGY, free_gpus, now=NOW, make_room=order), HealMemory())


def test_ordered_to_make_room_a_replica_within_its_tier_moves_whole_and_says_for_whom() -> None:
    plan = plan_for(small_service(), free(node0=6, node4=4))  # s2 fuller than s0, its old pods terminating or gone
    assert plan.moving is not None and plan.moving.why is Why.MAKE_ROOM
    assert plan.moving.target is not None and plan.moving.target.switch.name == "s2"
    assert sorted(w.name for w in plan.writes if isinstance(w, EvictPod)) == ["small-0-decode-0", "small-0-prefill-0"]
    (record,) = [w.record for w in plan.writes if isinstance(w, RecordMove)]
    assert record["reason"] == "make-room" and record["for"] == ORDER.wide.record()
    assert record["for"] == {"namespace": "ns", "stormService": "svc", "replica": "svc-a"}
    assert record["v"] == 2
    (moving,) = [w.say.message for w in plan.writes if isinstance(w, PostEvent) and w.say.reason == "ReplicaMoving"]
    assert "makes room in s0 for StormService ns/svc replica svc-a" in moving


def test_unordered_or_blocked_a_replica_within_its_tier_never_moves() -> None:
    assert plan_for(small_service(), free(node0=6, node4=4), order=None).moving is None
    cooling = small_service({"small-0": {"at": stamp(NOW - 60), "done": True}})
    plan = plan_for(cooling, free(node0=6, node4=4))
    assert plan.moving is None and plan.verdicts[0].block is Block.COOLDOWN
    # Read again now, Volcano would put it back where it is (s0, 6 free beside it, fuller than s2).
    plan = plan_for(small_service(), free(node0=6, node4=8))
    assert plan.moving is None and plan.verdicts[0].block is Block.NO_ROOM


def test_a_move_to_make_room_that_went_back_to_the_domain_it_left_did_not_land() -> None:
    record = {"small-0": {"at": stamp(NOW - 120), "pods": ["old-a", "old-b"], "reason": "make-room", "left": "s0", "cooldown": 900}}
    back = plan_for(small_service(record), free(node0=6, node4=4), order=None)  # its new pods are on node0 again
    assert [(s.replica, s.landed) for s in back.settled] == [("small-0", False)]
    (done,) = [w.record for w in back.writes if isinstance(w, RecordMove)]
    assert done["done"] and done["cooldown"] == 1800  # it did not help: its next move waits twice as long


def test_a_replica_not_ready_is_not_moved_to_make_room() -> None:
    svc = small_service()
    rs = small_replica("node0", "node0")
    unready = replace(rs, pods=tuple({**p, "status": {"phase": "Running", "conditions": []}} for p in rs.pods))
    from stormtopo.core.heal_snapshot import HealSnapshot

    plan = plan_healing(
        HealSnapshot(svc, (unready, SIBLING), TIERS, TOPOLOGY, free(node0=6, node4=4), now=NOW, make_room=ORDER), HealMemory()
    )
    assert plan.moving is None and plan.verdicts[0].blocked == "not every pod is ready"
    assert not [w for w in plan.writes if isinstance(w, PostEvent)]  # a donor is not wide: nothing said on it


def test_a_resident_is_read_from_the_index_only_when_whole_within_its_tier_and_free_to_move() -> None:
    svc, rs = small_service(), small_replica("node0", "node0")
    found = resident(svc, rs.roleset, rs.pods, TIERS, TOPOLOGY, NOW)
    assert found == Resident("other", "small", "small-0", {"node0": 2}, (1, 1), 1)
    assert resident({**svc, "metadata": {**svc["metadata"], "annotations": {}}}, rs.roleset, rs.pods, TIERS, TOPOLOGY, NOW) is None
    cooling = small_service({"small-0": {"at": stamp(NOW - 60), "done": True}})
    assert resident(cooling, rs.roleset, rs.pods, TIERS, TOPOLOGY, NOW) is None
    moving = small_service({"small-1": {"at": stamp(NOW - 60)}})  # another replica of it moving
    assert resident(moving, rs.roleset, rs.pods, TIERS, TOPOLOGY, NOW) is None
    assert resident(svc, rs.roleset, rs.pods[:1], TIERS, TOPOLOGY, NOW) is None  # not whole
    backing_off = small_service({"small-0": {"at": stamp(NOW - 7200), "done": True, "retryAt": stamp(NOW + 60)}})
    assert resident(backing_off, rs.roleset, rs.pods, TIERS, TOPOLOGY, NOW) is None
    waiting = small_service()
    waiting["metadata"]["annotations"][PLACEMENT_ANNOTATION] = json.dumps({"small-1": {"tier": 2}})  # another replica wide
    assert resident(waiting, rs.roleset, rs.pods, TIERS, TOPOLOGY, NOW) is None
    wide = replace(rs, pods=(rs.pods[0], {**rs.pods[1], "spec": {"nodeName": "node2"}}))
    assert resident(svc, wide.roleset, wide.pods, TIERS, TOPOLOGY, NOW) is None  # itself above its tier
    unread = replace(
        rs,
        roleset={
            **rs.roleset,
            "spec": {
                **rs.roleset["spec"],
                "roles": [
                    {**role, "template": {**role["template"], "spec": {**role["template"]["spec"], "priorityClassName": "just-made"}}}
                    for role in rs.roleset["spec"]["roles"]
                ],
            },
        },
    )
    assert resident(svc, unread.roleset, unread.pods, TIERS, TOPOLOGY, NOW) is None  # its class not read: might rank high


# -- lending room is the lender's choice (issue 34, item 3) ----------------------------------------

ROOM = free(node0=6, node4=4)  # s2 fuller than s0: small-0 would go there, and make room in s0


def test_a_service_that_did_not_opt_in_to_lending_is_never_chosen_to_make_room() -> None:
    rs = small_replica("node0", "node0")
    declined = small_service()
    declined["metadata"]["annotations"][LEND_ROOM_ANNOTATION] = "false"
    for svc in (small_service(lends=False), declined):
        assert resident(svc, rs.roleset, rs.pods, TIERS, TOPOLOGY, NOW) is None
        plan = plan_for(svc, ROOM)  # ordered all the same (an operator of before): its own plan refuses
        assert plan.moving is None and not [w for w in plan.writes if isinstance(w, EvictPod | RecordMove)]
        assert "did not opt in to lending room (stormtopo.io/lend-room" in plan.verdicts[0].blocked
    # Lending without healing is no lending: a lender's move is a healing move, held, settled and cooled down as one.
    lends_only = small_service()
    del lends_only["metadata"]["annotations"][HEAL_ANNOTATION]
    assert resident(lends_only, rs.roleset, rs.pods, TIERS, TOPOLOGY, NOW) is None
    assert resident(small_service(), rs.roleset, rs.pods, TIERS, TOPOLOGY, NOW) is not None  # the same, lending


def test_a_lender_with_one_replica_never_makes_room() -> None:
    svc, rs = small_service(replicas=1), small_replica("node0", "node0")
    assert resident(svc, rs.roleset, rs.pods, TIERS, TOPOLOGY, NOW) is None
    plan = plan_healing(HealSnapshot(svc, (rs,), TIERS, TOPOLOGY, ROOM, now=NOW, make_room=ORDER), HealMemory())
    assert plan.moving is None and plan.verdicts[0].blocked == "a service with one replica never lends room"
    assert lender_budget(svc) == (1, 0)


def test_a_lender_keeps_all_but_one_replica_ready_whatever_its_own_budget_allows() -> None:
    three = small_service(replicas=3)
    three["spec"]["updateStrategy"] = {"type": "RollingUpdate", "maxUnavailable": 2}  # its own budget: 2 of 3
    assert lender_budget(three) == (3, 1)
    unready = small_replica("node6", "node6", name="small-2", ready=False)
    plan = plan_for(three, ROOM, ORDER, SIBLING, unready)
    assert plan.moving is None and plan.verdicts[0].block is Block.BUDGET
    assert "1 other replicas are ready and the service keeps at least 2 of 3 (max(1, replicas - 1)" in plan.verdicts[0].blocked
    ready = small_replica("node6", "node6", name="small-2")
    assert plan_for(three, ROOM, ORDER, SIBLING, ready).moving is not None  # both others ready: it lends one
    # Never more than its own budget: maxUnavailable 0 (and a surge) leaves nothing to lend.
    three["spec"]["updateStrategy"] = {"type": "RollingUpdate", "maxSurge": 1, "maxUnavailable": 0}
    assert lender_budget(three) == (3, 0) and plan_for(three, ROOM, ORDER, SIBLING, ready).moving is None


def test_a_service_never_makes_room_for_its_own_wide_replica() -> None:
    own = MakeRoom("small-0", wide_replica("other", "small", "small-1"), "s0")
    plan = plan_for(small_service(), ROOM, own)
    assert plan.moving is None and plan.verdicts[0].blocked == "a service makes no room for its own replicas"


def test_a_make_room_record_written_by_the_release_before_is_understood() -> None:
    """Issue 44, item 2: records are data with a version ("v": 2, "for" an object); the release before
    wrote "for" as a sentence and no version, and a leader of this release still counts the room it made."""
    before = {
        "at": stamp(NOW - 30),
        "from": "s0, tier 1",
        "to": "s1",
        "toTier": 1,
        "reason": "make-room",
        "pods": ["u1"],
        "for": "StormService ns/svc replica svc-a",
        "left": "s0",
    }
    lender = small_service({"small-0": before})
    assert room_made_for([lender], NOW) == {("ns", "svc", "svc-a"): NOW - 30}
    assert recorded_for(before) == wide_replica("ns", "svc", "svc-a")
    assert recorded_for({"for": {"namespace": "ns", "stormService": "svc", "replica": "svc-a"}}) == wide_replica("ns", "svc", "svc-a")
    for unreadable in ("svc-a", {"namespace": "ns", "replica": "svc-a"}, {"namespace": 1, "stormService": "s", "replica": "r"}, None):
        assert recorded_for({"for": unreadable}) is None
    assert str(wide_replica("ns", "svc", "svc-a")) == "StormService ns/svc replica svc-a"  # the prose of Events


def test_room_made_for_a_wide_replica_is_read_back_from_the_lenders_record() -> None:
    plan = plan_for(small_service(), ROOM)
    (record,) = [w.record for w in plan.writes if isinstance(w, RecordMove)]
    lender = small_service({"small-0": dict(record)})
    assert room_made_for([lender], NOW) == {("ns", "svc", "svc-a"): NOW}
    # Settled, refused after its first eviction or not: room was made; the latest move counts.
    older = small_service({"small-1": {**record, "at": stamp(NOW - 600), "done": True}})
    assert room_made_for([older, lender], NOW) == {("ns", "svc", "svc-a"): NOW}
    healed = small_service({"small-0": {**record, "reason": "soft-above-tier"}})
    assert room_made_for([healed, small_service()], NOW) == {}  # a move of its own, for no one


def test_of_the_wide_replicas_waiting_for_room_the_one_volcano_ranks_highest_comes_first() -> None:
    """One move to make room runs in the cluster at a time: it goes to the highest priority waiting, the
    cluster's default class for one naming none; of equals, the order the pass found them in."""
    from stormtopo.core.priority import DEFAULT_CLASS
    from stormtopo.core.room_search import wide_waiting

    def wide(name: str, priority_class: str | None) -> Any:
        roles = (Role("prefill", gpus=8, priority_class=priority_class), Role("decode", gpus=8, priority_class=priority_class))
        return (("ns", name), Replica(roleset(f"{name}-rs", roles, service=name), ()), 1)

    waiting = [wide("batchy", "batch"), wide("plain", None), wide("urgent", "inference"), wide("also-batch", "batch")]
    values = {"batch": 100, "inference": 1_000_000, DEFAULT_CLASS: 500}
    order = [w[0][1] for w in wide_waiting(waiting, [], NOW, 900.0, values)]
    assert order == ["urgent", "plain", "batchy", "also-batch"]
