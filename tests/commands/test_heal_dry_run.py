"""`stormtopo heal --dry-run`'s report of making room (pure: the readings are passed in)."""

from __future__ import annotations

import json
from typing import Any

from stormtopo.commands.heal import Lenders, render, rooms_made
from stormtopo.core.heal_pass import ServicePlan, plan_alone
from stormtopo.core.heal_snapshot import HealSnapshot
from stormtopo.core.room import Resident
from tests.builders import service
from tests.core.healing_cases import BIG, BUSY, NOW, SOFT1, WIDE, snap, stamp

# node0 holds a small replica of another service: s0 holds the wide replica only once it leaves; node4
# has room for that small replica in s2, which Volcano then surely prefers (tests/core/test_room.py).
STUCK = {**BUSY, "node0": 2, "node4": 4}
SMALL = Resident("other", "small", "small-0", {"node0": 2}, (1, 1), 1)
KEY = ("ns", "svc")


def planned(snapshot: HealSnapshot) -> ServicePlan:
    """What the dry run plans: the operator's pass over this one service (core/heal_pass.py plan_alone)."""
    return plan_alone(snapshot, KEY, {}, ())


def in_play(snapshot: HealSnapshot, *others: dict[str, Any]) -> dict[tuple[str, str], Any]:
    return {KEY: snapshot.stormservice, **{("other", o["metadata"]["name"]): o for o in others}}


def test_a_wide_replica_with_nowhere_to_go_says_which_replica_would_make_room() -> None:
    snapshot = snap(service(SOFT1, BIG, update_strategy="RollingUpdate"), WIDE, busy=STUCK)
    plan = planned(snapshot)
    assert plan.plan.moving is None  # no leaf holds it now
    rooms = rooms_made(snapshot, plan, in_play(snapshot), lambda: Lenders((SMALL,), {}))
    assert rooms == {"svc-a": {"replica": "small-0", "stormservice": "other/small", "to": "s2", "frees": "s0"}}
    entry = {
        "replica": "svc-a",
        "span": "s4, tier 2",
        "wide": True,
        "why": "soft-above-tier",
        "wouldMove": False,
        "makeRoom": rooms["svc-a"],
    }
    lines = render({"namespace": "ns", "stormservice": "svc", "request": "soft, tier 1", "healing": True, "replicas": [entry]})
    assert "with --heal-make-room: replica small-0 of StormService other/small would first move to s2, making room in s0" in lines[2]


def test_others_are_read_only_when_a_wide_replica_has_nowhere_to_go() -> None:
    snapshot = snap(service(SOFT1, BIG, update_strategy="RollingUpdate"), WIDE)  # s0 has room: it moves without help

    def unread() -> Lenders:
        raise AssertionError("read")

    assert rooms_made(snapshot, planned(snapshot), in_play(snapshot), unread) == {}


def test_the_dry_run_says_when_the_installed_policy_would_refuse_the_move() -> None:
    """Issue 34, item 1: the chart's own-keys-only policy before issue 34 let stormtopo write only its
    placement record; the dry run says the move would be refused, naming the policy."""
    from stormtopo.commands.heal import refusing_policy

    old = {"metadata": {"name": "rel-stormtopo-own-keys-only"}, "spec": {"validations": [{"expression": "k == 'stormtopo.io/placement'"}]}}
    new = {
        "metadata": {"name": "rel-stormtopo-own-keys-only"},
        "spec": {"validations": [{"expression": "['stormtopo.io/placement', 'stormtopo.io/moves']"}]},
    }
    other = {"metadata": {"name": "someone-elses"}, "spec": {"validations": [{"expression": "'stormtopo.io/placement'"}]}}
    refusal = refusing_policy([other, old])
    assert refusal is not None and "rel-stormtopo-own-keys-only" in refusal and "stormtopo.io/moves" in refusal
    assert refusing_policy([new, other]) is None and refusing_policy([]) is None


def test_the_dry_run_says_when_a_service_asking_for_healing_may_not_be_moved() -> None:
    """The operator heals a service only while no other StormService of its namespace shares its RoleSet name
    prefix (core/movable.py); the dry run says so, with the operator's own words, before what it would do."""
    from stormtopo.core.movable import not_movable_reason

    reason = not_movable_reason("svc-a", "svc-a-roleset-x")
    entry = {
        "replica": "svc-a-1",
        "span": "s4, tier 2",
        "wide": True,
        "why": "soft-above-tier",
        "wouldMove": True,
        "to": "s0",
        "toTier": 1,
        "freeGPUs": 8,
    }
    report = {"namespace": "ns", "stormservice": "svc-a", "request": "soft, tier 1", "healing": True, "replicas": [entry]}
    lines = render({**report, "notMovable": reason})
    assert lines[1] == f"  {reason}: the operator moves nothing; as if it did:"
    assert "'svc-a-roleset-x'" in lines[1] and "rename one of them" in lines[1]
    assert not any("healing stays off" in line for line in render(report))


def test_without_the_right_to_list_every_namespace_the_dry_run_says_what_it_could_not_count() -> None:
    entry = {"replica": "svc-a", "span": "s4, tier 2", "wide": True, "why": "soft-above-tier", "wouldMove": False}
    report = {"namespace": "ns", "stormservice": "svc", "request": "soft, tier 1", "healing": True, "replicas": [entry]}
    lines = render({**report, "movesUnknown": "HTTP 403: stormservices is forbidden"})
    assert any(line.startswith("  planned as if no other replica were moving") and "HTTP 403" in line for line in lines)


def test_the_dry_run_offers_only_whom_the_operators_search_would() -> None:
    """The same search as the operator's make_room (core/room_search.py next_offer): never a resident of higher
    priority than the wide replica, nor one on the node tier's short list."""
    from dataclasses import replace

    snapshot = snap(service(SOFT1, BIG, update_strategy="RollingUpdate"), WIDE, busy=STUCK)
    plan, services = planned(snapshot), in_play(snapshot)
    assert rooms_made(snapshot, plan, services, lambda: Lenders((SMALL,), {})) != {}
    assert rooms_made(snapshot, plan, services, lambda: Lenders((replace(SMALL, priority=1000),), {})) == {}  # the wide replica runs at 0
    assert rooms_made(snapshot, plan, services, lambda: Lenders((SMALL,), {}, listed=frozenset({"node0"}))) == {}


def test_the_dry_run_offers_no_room_where_the_operators_pass_would_make_none_now() -> None:
    """The wide replicas the pass would make room for are its own (HealPass.no_room, then wide_waiting): none while
    another move to make room is under way in the cluster (one at a time), none for a replica room was made for
    within its cool-down. The dry run once judged its own copy of the rule and offered room the pass would not make."""
    snapshot = snap(service(SOFT1, BIG, update_strategy="RollingUpdate"), WIDE, busy=STUCK)
    plan, lenders = planned(snapshot), (lambda: Lenders((SMALL,), {}))
    assert [(key, replica.name) for key, replica, _ in plan.heal_pass.no_room] == [(KEY, "svc-a")]
    lending = {**SOFT1, "stormtopo.io/lend-room": "true"}
    under_way = {"x-0": {"v": 2, "at": stamp(NOW - 30), "reason": "make-room", "toTier": 1, "for": {"namespace": "elsewhere"}}}
    lender = service(
        {**lending, "stormtopo.io/moves": json.dumps(under_way)}, BIG, name="lender", replicas=2, update_strategy="RollingUpdate"
    )
    assert rooms_made(snapshot, plan, in_play(snapshot, lender), lenders) == {}  # one move to make room at a time
    made = {"x-0": {**under_way["x-0"], "done": True, "for": {"namespace": "ns", "stormService": "svc", "replica": "svc-a"}}}
    recently = service({**lending, "stormtopo.io/moves": json.dumps(made)}, BIG, name="lender", replicas=2, update_strategy="RollingUpdate")
    assert rooms_made(snapshot, plan, in_play(snapshot, recently), lenders) == {}  # made for svc-a within its cool-down
    assert rooms_made(snapshot, plan, in_play(snapshot), lenders) != {}
