"""A healing pass (core/heal_pass.py), with no shell: which services it looks at, what it remembers
between passes, its moves counted against the cluster's cap, and the room search's order of offers."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from stormtopo.core.heal_pass import HealerMemory, HealPass, Look, ServiceRead, ServiceReading, begin_pass, plan_look, plan_service
from stormtopo.core.heal_plan import HealMemory, HealPlan
from stormtopo.core.healing import plan_healing
from stormtopo.core.lending import MakeRoom, wide_replica
from stormtopo.core.room import Resident
from stormtopo.core.room_search import RoomSearch, made_room, next_offer
from stormtopo.core.verdict import Verdict, Why
from stormtopo.core.vocabulary import MOVES_ANNOTATION
from tests.builders import service
from tests.core.healing_cases import BIG, NOW, SOFT1, TIERS, TOPOLOGY, WIDE, free, snap, stamp, wide_service

KEY = ("ns", "svc")


def a_pass(**fields: Any) -> HealPass:
    return replace(HealPass(NOW, False, frozenset(), 30.0, 300.0, listed=True), **fields)


def look(heal_pass: HealPass, memory: HealerMemory, svc: dict[str, Any]) -> tuple[Look, HealerMemory]:
    return plan_look(heal_pass, memory, ServiceReading(KEY, svc), TIERS, TOPOLOGY)


def test_a_service_with_nothing_wide_is_not_looked_at_and_is_forgotten() -> None:
    memory = HealerMemory().healed(KEY, HealMemory(quiet_until=NOW + 60))
    verdict, memory = look(a_pass(), memory, service(SOFT1, BIG, update_strategy="RollingUpdate"))
    assert verdict is Look.NOTHING and KEY not in memory.services


def test_the_reading_of_room_is_asked_for_only_once_a_service_needs_a_look() -> None:
    assert look(a_pass(listed=None), HealerMemory(), service(SOFT1, BIG, update_strategy="RollingUpdate"))[0] is Look.NOTHING
    assert look(a_pass(listed=None), HealerMemory(), wide_service())[0] is Look.READ_ROOM
    assert look(a_pass(listed=False), HealerMemory(), wide_service())[0] is Look.NOT_YET
    assert look(a_pass(), HealerMemory(), wide_service())[0] is Look.HEAL


def test_a_quiet_service_wakes_once_a_quiet_spell_when_room_may_have_been_freed() -> None:
    memory = HealerMemory().healed(KEY, HealMemory(quiet_until=NOW + 3600))
    assert look(a_pass(), memory, wide_service())[0] is Look.QUIET
    verdict, memory = look(a_pass(fresh=True), memory, wide_service())
    assert verdict is Look.HEAL and memory.woken[KEY] == NOW
    assert look(a_pass(fresh=True, now=NOW + 10), memory, wide_service())[0] is Look.QUIET  # within the spell
    assert look(a_pass(awaited=frozenset({KEY})), memory, wide_service())[0] is Look.HEAL  # room is being made for it


def test_a_service_whose_roleset_prefix_another_shares_is_never_healed() -> None:
    """Issue 43, item 3: its pods could not be told from the other's by the eviction policy; the request's
    Event says why (core/reconciliation.py not_movable)."""
    reading = ServiceReading(KEY, wide_service(), prefix_shared_with="svc-twin")
    assert look(a_pass(), HealerMemory(), wide_service())[0] is Look.HEAL
    assert plan_look(a_pass(), HealerMemory(), reading, TIERS, TOPOLOGY)[0] in (Look.NOTICE, Look.QUIET)


def test_a_stormservice_being_deleted_is_not_looked_at() -> None:
    deleted = wide_service()
    deleted["metadata"]["deletionTimestamp"] = "2026-12-03T16:00:00Z"
    verdict, memory = look(a_pass(), HealerMemory().healed(KEY, HealMemory()), deleted)
    assert verdict is Look.NOTHING and KEY not in memory.services


def test_a_pass_is_fresh_when_pods_left_their_nodes_since_the_last() -> None:
    first, memory = begin_pass(HealerMemory(), [], 0, NOW, 30.0, 300.0)
    second, memory = begin_pass(memory, [], 0, NOW + 10, 30.0, 300.0)
    third, _ = begin_pass(memory, [], 1, NOW + 20, 30.0, 300.0)
    assert (first.fresh, second.fresh, third.fresh) == (True, False, True)


def test_what_is_kept_between_passes_drops_services_gone_and_old_wakings() -> None:
    memory = replace(HealerMemory().healed(KEY, HealMemory()).healed(("ns", "gone"), HealMemory()), woken={KEY: NOW - 60})
    kept = memory.kept({KEY}, NOW, 30.0)
    assert set(kept.services) == {KEY} and not kept.woken


def test_a_move_begun_in_the_pass_counts_against_the_cap_before_the_index_shows_it() -> None:
    snapshot = snap(service(SOFT1, BIG, update_strategy="RollingUpdate"), WIDE)
    plan = plan_healing(snapshot, HealMemory())
    assert plan.moving is not None
    heal_pass = a_pass().planned(KEY, snapshot, plan)
    assert heal_pass.moving_elsewhere(("ns", "other"), [], NOW) == 1 and heal_pass.moving_elsewhere(KEY, [], NOW) == 0
    moving = service(SOFT1, BIG, update_strategy="RollingUpdate")
    moving["metadata"]["annotations"][MOVES_ANNOTATION] = json.dumps({"svc-a": {"at": stamp(NOW - 5), "toTier": 1}})
    assert heal_pass.moving_elsewhere(("ns", "other"), [(KEY, moving)], NOW) == 2  # counted twice rather than not at all


def test_a_wide_replica_with_nowhere_to_go_waits_for_room_to_be_made() -> None:
    busy = {"node0": 8, "node1": 8, "node2": 8, "node3": 8, "node4": 8, "node5": 8, "node6": 8, "node7": 8}
    snapshot = snap(service(SOFT1, BIG, update_strategy="RollingUpdate"), WIDE, busy=busy)
    plan = plan_healing(snapshot, HealMemory())
    assert plan.moving is None
    assert a_pass().planned(KEY, snapshot, plan).no_room == ((KEY, WIDE, 1),)
    lender = replace(snapshot, make_room=MakeRoom("svc-a", wide_replica("ns", "x", "x-0"), "s0"))
    assert a_pass().planned(KEY, lender, plan_healing(lender, HealMemory())).no_room == ()  # a lender's plan waits for none


def test_residents_are_offered_smallest_first_and_one_refused_is_followed_by_the_next() -> None:
    residents = (
        Resident("other", "second", "second-0", {"node2": 2}, (1, 1), 1),
        Resident("other", "small", "small-0", {"node0": 2}, (1, 1), 1),
    )
    room = free({n: 8 - g for n, g in {"node0": 6, "node2": 6, "node4": 4}.items()})
    search = RoomSearch(((KEY, WIDE, 1),), residents, {}, None, TOPOLOGY, frozenset())
    first = next_offer(search, room)
    assert first is not None and first.lender == ("other", "second") and first.order.wide == wide_replica(*KEY, "svc-a")
    second = next_offer(first.refused(), room)
    assert second is not None and second.lender == ("other", "small")
    assert next_offer(second.refused(), room) is None  # nobody else makes room


def test_room_is_made_only_by_a_move_to_make_room() -> None:
    assert made_room(HealPlan(moving=Verdict("small-0", "s0, tier 1", Why.MAKE_ROOM)))
    assert not made_room(HealPlan(moving=Verdict("small-0", "s0, tier 1", Why.SOFT_WIDE))) and not made_room(None)


def test_a_service_is_planned_over_the_passs_room_read_with_its_first_service() -> None:
    read = ServiceRead(
        KEY,
        replace(snap(service(SOFT1, BIG, update_strategy="RollingUpdate"), WIDE), free={}),
        others=(),
        free=snap(service(SOFT1, BIG, update_strategy="RollingUpdate"), WIDE).free,
    )
    first = plan_service(a_pass(), read, HealMemory())
    assert first.plan.moving is not None and first.snapshot.free == read.free and first.heal_pass.started == {KEY}
    # The next service is planned over the pass's reading (the move's target is set aside once recorded: HealPass.moved).
    second = plan_service(first.heal_pass, replace(read, key=("ns", "other"), free=None), HealMemory())
    assert second.snapshot.free == first.heal_pass.free and second.snapshot.moving_elsewhere == 1


def test_the_dry_run_plans_one_service_as_a_pass_would_against_the_clusters_moves() -> None:
    """`stormtopo heal --dry-run` (plan_alone): the same planner as the operator's pass, so the cap counts the
    cluster's moves under way and their targets are not offered as room; a service that does not ask for
    healing is judged as if it did."""
    from stormtopo.core.heal_pass import plan_alone
    from stormtopo.core.verdict import Block

    snapshot = replace(snap(service(SOFT1, BIG, update_strategy="RollingUpdate"), WIDE), max_moving=2)
    assert plan_alone(snapshot, KEY, {}, ()).plan.moving is not None  # alone in the cluster: it moves, as plan_healing says
    movers = {}
    for name in ("a", "b"):  # two services that ask for healing, each with a move under way
        mover = service(
            {**SOFT1, MOVES_ANNOTATION: json.dumps({f"{name}-0": {"at": stamp(NOW - 5), "toTier": 1}})},
            BIG,
            update_strategy="RollingUpdate",
        )
        mover["metadata"]["name"] = name
        movers[("other", name)] = mover
    capped = plan_alone(snapshot, KEY, movers, ()).plan
    assert capped.moving is None and any(v.block is Block.CLUSTER_CAP for v in capped.verdicts)
    assert plan_healing(snapshot, HealMemory()).moving is not None  # what the dry run said before: a move the pass would not make
    plain = replace(
        snapshot, stormservice=service({k: v for k, v in SOFT1.items() if k != "stormtopo.io/heal"}, BIG, update_strategy="RollingUpdate")
    )
    assert plan_alone(plain, KEY, {}, ()).plan.moving is not None  # judged as if it asked


def test_a_stranded_notice_whose_read_failed_is_looked_at_again_at_the_next_pass() -> None:
    """plan_look marks the waiting pods as said before the shell reads the service; a read that fails takes that
    back (HealerMemory.unnoticed), else every next pass would be quiet for as long as those pods wait."""
    reading = ServiceReading(KEY, wide_service(), prefix_shared_with="svc-twin")  # not movable: noticed, not healed
    first, memory = plan_look(a_pass(), HealerMemory(), reading, TIERS, TOPOLOGY)
    assert first is Look.NOTICE
    assert plan_look(a_pass(), memory, reading, TIERS, TOPOLOGY)[0] is Look.QUIET  # said: quiet while they wait
    assert plan_look(a_pass(), memory.unnoticed(KEY), reading, TIERS, TOPOLOGY)[0] is Look.NOTICE


def test_only_a_service_with_a_move_under_way_has_its_replicas_read_for_the_dry_run() -> None:
    """Settled records stay on a StormService for ever: the dry run reads the replicas of those moving now."""
    from stormtopo.core.cluster_moves import moves_under_way

    moving = service(
        {**SOFT1, MOVES_ANNOTATION: json.dumps({"svc-a": {"at": stamp(NOW - 5), "toTier": 1}})}, BIG, update_strategy="RollingUpdate"
    )
    settled = service(
        {**SOFT1, MOVES_ANNOTATION: json.dumps({"svc-a": {"at": stamp(NOW - 5), "toTier": 1, "done": True}})},
        BIG,
        update_strategy="RollingUpdate",
    )
    forged = service(
        {k: v for k, v in SOFT1.items() if k != "stormtopo.io/heal"} | {MOVES_ANNOTATION: "{}"}, BIG, update_strategy="RollingUpdate"
    )
    assert moves_under_way(moving, NOW) and not moves_under_way(settled, NOW) and not moves_under_way(forged, NOW)
