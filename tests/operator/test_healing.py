"""Healing's shell: a move's writes run in order, its evictions together, and an eviction the API server
refuses (a PodDisruptionBudget that changed since it was read) ends the move, is said, and backs the
replica off."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any, cast

import pytest

from stormtopo.core.cooldown import BACKOFF
from stormtopo.core.heal_plan import HealMemory
from stormtopo.core.healing import plan_healing
from stormtopo.core.lending import WideReplica
from stormtopo.core.vocabulary import MOVES_ANNOTATION
from stormtopo.kube.errors import ApiError
from stormtopo.operator.healing import Healer
from tests.builders import pdb, service
from tests.core.healing_cases import BIG, NOW, SOFT1, TIERS, TOPOLOGY, WIDE, free, snap, stamp, wide_service


class RecordingApi:
    """Records each call; the prefill pod's eviction is refused as a PodDisruptionBudget refuses it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def evict_pod(self, namespace: str, name: str, uid: str = "") -> None:
        self.calls.append(("evict", name))
        if name.endswith("-prefill-0"):
            raise ApiError.of(
                429,
                "POST",
                f"/api/v1/namespaces/{namespace}/pods/{name}/eviction",
                "Cannot evict pod as it would violate the pod's disruption budget.",
            )

    def get(self, *args: Any) -> dict[str, Any]:
        self.calls.append(("get", args[-1]))
        return {"metadata": {"name": "svc", "namespace": "ns", "resourceVersion": "1", "annotations": {}}}

    def annotate_stormservice(self, namespace: str, name: str, key: str, value: str, version: str | None = None) -> dict[str, Any]:
        self.calls.append(("annotate", key, value))
        return {}


def test_a_refused_eviction_ends_the_move_says_why_and_backs_off() -> None:
    api = RecordingApi()
    said: list[tuple[str, str]] = []
    healer = Healer(
        cast(Any, None),
        cast(Any, api),
        lambda _obj, kind, reason, message: said.append((reason, message)),
        cast(Any, None),
        cast(Any, None),
    )
    snapshot = snap(service(SOFT1, BIG, update_strategy="RollingUpdate"), WIDE, budgets=(pdb("two", 2, {"matchLabels": {"app": "svc"}}),))
    plan = plan_healing(snapshot, HealMemory())
    healer._memory = healer._memory.healed(("ns", "svc"), plan.memory)
    asyncio.run(healer.carry_out(("ns", "svc"), snapshot, plan))
    assert [c[1] for c in api.calls if c[0] == "evict"] == ["svc-a-decode-0", "svc-a-prefill-0"]  # one after another, under a budget
    annotations = [c[2] for c in api.calls if c[0] == "annotate"]
    assert '"done":true' not in annotations[0] and '"done":true' in annotations[-1]  # the move begun, then recorded over
    assert [r for r, _ in said] == ["ReplicaMoving", "ReplicaNotMoved"]
    assert "eviction of pod svc-a-prefill-0 was refused" in said[-1][1]
    assert healer._memory.of(("ns", "svc")).next_try["svc-a"] == NOW + BACKOFF


def test_a_replicas_pods_are_evicted_together() -> None:
    """Each eviction waits until every other one is in flight: one at a time, this times out."""
    evicting = threading.Barrier(2, timeout=10)

    class Together(RecordingApi):
        def evict_pod(self, namespace: str, name: str, uid: str = "") -> None:
            self.calls.append(("evict", name))
            evicting.wait()

    api = Together()
    healer = Healer(cast(Any, None), cast(Any, api), lambda *_: None, cast(Any, None), cast(Any, None))
    snapshot = snap(service(SOFT1, BIG, update_strategy="RollingUpdate"), WIDE)
    assert asyncio.run(healer.carry_out(("ns", "svc"), snapshot, plan_healing(snapshot, HealMemory())))
    assert sorted(c[1] for c in api.calls if c[0] == "evict") == ["svc-a-decode-0", "svc-a-prefill-0"]
    assert not evicting.broken


def test_evictions_wait_for_the_move_to_be_recorded_over_what_was_read() -> None:
    class Moved(RecordingApi):
        def get(self, *args: Any) -> dict[str, Any]:
            return {"metadata": {"name": "svc", "namespace": "ns", "resourceVersion": "2", "annotations": {}}}  # changed since

    api = Moved()
    healer = Healer(cast(Any, None), cast(Any, api), lambda *_: None, cast(Any, None), cast(Any, None))
    svc = service(SOFT1, BIG, update_strategy="RollingUpdate")
    svc["metadata"]["resourceVersion"] = "1"
    snapshot = snap(svc, WIDE)
    asyncio.run(healer.carry_out(("ns", "svc"), snapshot, plan_healing(snapshot, HealMemory())))
    assert not [c for c in api.calls if c[0] in ("evict", "annotate")], api.calls


def test_an_error_that_is_no_budget_refusal_leaves_the_move_under_way() -> None:
    class Forbidden(RecordingApi):
        def evict_pod(self, namespace: str, name: str, uid: str = "") -> None:
            self.calls.append(("evict", name))
            raise ApiError.of(403, "POST", "/eviction", '{"kind":"Status","message":"pods \\"x\\" is forbidden"}')

    api = Forbidden()
    said: list[str] = []
    healer = Healer(cast(Any, None), cast(Any, api), lambda _o, _k, reason, _m: said.append(reason), cast(Any, None), cast(Any, None))
    snapshot = snap(service(SOFT1, BIG, update_strategy="RollingUpdate"), WIDE)
    with pytest.raises(ApiError):
        asyncio.run(healer.carry_out(("ns", "svc"), snapshot, plan_healing(snapshot, HealMemory())))
    # No budget refusal said or recorded (the next pass resumes the move), but the refusal is: a Warning, once.
    assert said == ["ReplicaMoving", "HealingRefused"]
    assert len([c for c in api.calls if c[0] == "annotate"]) == 1


def test_evictions_in_a_namespace_being_deleted_end_the_move_without_a_warning() -> None:
    """The namespace goes with everything in it: no HealingRefused (its Event would be refused too), no retry."""

    class Terminating(RecordingApi):
        def evict_pod(self, namespace: str, name: str, uid: str = "") -> None:
            self.calls.append(("evict", name))
            body = '{"kind":"Status","message":"unable to create new content in namespace ns because it is being terminated",'
            raise ApiError.of(403, "POST", "/eviction", body + '"details":{"causes":[{"reason":"NamespaceTerminating"}]}}')

    api = Terminating()
    said: list[str] = []
    healer = Healer(cast(Any, None), cast(Any, api), lambda _o, _k, reason, _m: said.append(reason), cast(Any, None), cast(Any, None))
    snapshot = snap(service(SOFT1, BIG, update_strategy="RollingUpdate"), WIDE)
    assert asyncio.run(healer.carry_out(("ns", "svc"), snapshot, plan_healing(snapshot, HealMemory())))
    assert [c for c in api.calls if c[0] == "evict"] and said == ["ReplicaMoving"]


def test_a_move_record_the_policy_refuses_moves_nothing_and_says_so() -> None:
    """Issue 34, item 1: under a policy that forbids stormtopo.io/moves (the chart before issue 34), the
    move is not begun, no pod is evicted, and a Warning on the StormService says why (not only a log)."""

    class Refusing(RecordingApi):
        def annotate_stormservice(self, namespace: str, name: str, key: str, value: str, version: str | None = None) -> dict[str, Any]:
            self.calls.append(("annotate", key, value))
            raise ApiError.of(422, "PATCH", "/stormservices/svc", '{"kind":"Status","message":"denied by rel-stormtopo-own-keys-only"}')

    api = Refusing()
    said: list[tuple[str, str]] = []
    healer = Healer(
        cast(Any, None), cast(Any, api), lambda _o, _k, reason, message: said.append((reason, message)), cast(Any, None), cast(Any, None)
    )
    snapshot = snap(service(SOFT1, BIG, update_strategy="RollingUpdate"), WIDE)
    assert asyncio.run(healer.carry_out(("ns", "svc"), snapshot, plan_healing(snapshot, HealMemory()))) is False
    assert not [c for c in api.calls if c[0] == "evict"]
    ((reason, message),) = said
    assert reason == "HealingRefused" and "own-keys-only" in message and "stormtopo.io/moves" in message


# -- making room: which resident is offered, and when none is -------------------------------------


def lender_record(replica: str, wide: str | WideReplica, at: float, done: bool = True) -> dict[str, Any]:
    """A lender's StormService whose `replica` moved at `at` to make room for `wide`, as the healer records it."""
    import json

    from stormtopo.core.vocabulary import LEND_ROOM_ANNOTATION, MOVES_ANNOTATION

    # only a lender's record says room was made
    svc = service({**SOFT1, LEND_ROOM_ANNOTATION: "true"}, BIG, replicas=2, update_strategy="RollingUpdate")
    # A sentence: as the release before wrote it (still read); the healer's own records hold data.
    record = {"at": stamp(at), "reason": "make-room", "for": wide.record() if isinstance(wide, WideReplica) else wide, "done": done}
    svc["metadata"]["annotations"][MOVES_ANNOTATION] = json.dumps({replica: record})
    return svc


WIDE_SVC_A = "StormService ns/svc replica svc-a"


def making_room_healer(services: dict[Any, Any], verdicts: list[Any]) -> Any:
    """A Healer over a fixed index whose residents are two replicas of other services (s0's node0 and
    s1's node2, each with 6 GPUs free beside it, s2 with 4 free); each plan the residents' services
    get is the next of `verdicts` (a Verdict moving, or None: its own plan refused). A move carried
    out leaves its record in the index, settled, as the healer's own write does."""
    import time

    from stormtopo.core.heal_pass import HealPass
    from stormtopo.core.heal_plan import HealPlan
    from stormtopo.core.room import Resident
    from stormtopo.operator.healing import Healed

    class Index:
        stormservices = services
        hypernodes: dict[str, Any] = {}  # no node tier

        def stormservices_in_play(self) -> dict[Any, dict[str, Any]]:
            return opted_in_only(self.stormservices)

        def topology(self) -> Any:
            return TOPOLOGY

        def cluster_tiers(self) -> Any:
            return TIERS

    class Room:
        async def allocatable_gpus(self) -> dict[str, int]:
            return {}

        async def node_facts(self) -> None:
            return None  # not read: every node counts (core/heal_target.py room_of)

    class Probe(Healer):
        async def _residents(self, waiting: set[Any], now: float) -> list[Any]:
            return [
                Resident("other", "second", "second-0", {"node2": 2}, (1, 1), 1),
                Resident("other", "small", "small-0", {"node0": 2}, (1, 1), 1),
            ]

        async def heal(self, key: Any, heal_pass: Any, make_room: Any = None, allocatable: Any = None) -> Any:
            self.offered.append(make_room.replica)
            verdict = verdicts.pop(0)
            if verdict is not None:
                services[key] = lender_record(make_room.replica, make_room.wide, time.time())
            return Healed(HealPlan(moving=verdict), heal_pass)

    healer = Probe(cast(Any, Index()), cast(Any, None), lambda *_: None, cast(Any, Room()), cast(Any, None))
    healer.offered = []  # type: ignore[attr-defined]
    healer.heal_pass = HealPass(  # type: ignore[attr-defined]
        time.time(),
        False,
        frozenset(),
        30.0,
        300.0,
        free=free({n: 8 - g for n, g in {"node0": 6, "node2": 6, "node4": 4}.items()}),
        no_room=((("ns", "svc"), WIDE, 1),),
    )
    return healer


def test_a_resident_refused_by_its_own_plan_is_followed_by_the_next_and_room_is_made_once() -> None:
    from stormtopo.core.verdict import Verdict, Why

    services: dict[Any, Any] = {}
    healer = making_room_healer(services, [None, Verdict("small-0", "s0, tier 0", Why.MAKE_ROOM)])
    asyncio.run(healer.make_room(healer.heal_pass))
    assert healer.offered == ["second-0", "small-0"]  # the first in line refused by its own plan, then the next
    (record,) = json.loads(services[("other", "small")]["metadata"]["annotations"][MOVES_ANNOTATION]).values()
    assert record["for"] == {"namespace": "ns", "stormService": "svc", "replica": "svc-a"}  # data; the older records here are sentences
    asyncio.run(healer.make_room(healer.heal_pass))
    assert healer.offered == ["second-0", "small-0"]  # not again for the same wide replica within its cool-down


def test_room_made_once_per_wide_replica_survives_a_leader_change() -> None:
    """A new leader (nothing in memory) reads the limit back from the lender's move record."""
    import time

    from stormtopo.core.cooldown import COOLDOWN
    from stormtopo.core.healing import MOVE_DEADLINE
    from stormtopo.core.verdict import Verdict, Why

    made = {("other", "small"): lender_record("small-0", WIDE_SVC_A, time.time() - 60)}
    healer = making_room_healer(made, [Verdict("second-0", "s1, tier 1", Why.MAKE_ROOM)])
    asyncio.run(healer.make_room(healer.heal_pass))
    assert healer.offered == []
    # Past the cool-down, room may be made for it again; room made for another wide replica is no limit on it.
    for stale in (
        lender_record("small-0", WIDE_SVC_A, time.time() - COOLDOWN - 1),
        lender_record("small-0", "StormService ns/other replica other-a", time.time() - 60),
        # Another's move to make room never settled (its service stopped healing): past its deadline, under way no more.
        lender_record("small-0", "StormService ns/other replica other-a", time.time() - MOVE_DEADLINE - 1, done=False),
    ):
        healer = making_room_healer({("other", "small"): stale}, [Verdict("second-0", "s1, tier 1", Why.MAKE_ROOM)])
        asyncio.run(healer.make_room(healer.heal_pass))
        assert healer.offered == ["second-0"], stale


def test_no_room_is_made_while_a_move_to_make_room_is_under_way() -> None:
    import time

    busy = lender_record("x-0", "StormService ns/other replica other-a", time.time() - 5, done=False)
    healer = making_room_healer({("other", "busy"): busy}, [])
    asyncio.run(healer.make_room(healer.heal_pass))
    assert healer.offered == []


def opted_in_only(stormservices: dict[Any, dict[str, Any]]) -> dict[Any, dict[str, Any]]:
    """As the index keeps them: the services with a request annotation."""
    from stormtopo.core.request import is_opted_in

    return {k: s for k, s in stormservices.items() if is_opted_in(s["metadata"].get("annotations"))}


# -- a freed node: the quiet services are read again, over a fresh reading --------------------------


class _Index:
    """What a healing pass reads of the index when it only decides which services to look at."""

    def __init__(self, stormservices: dict[Any, dict[str, Any]]) -> None:
        self.stormservices = stormservices
        self.pods_freed = 0

    def stormservices_in_play(self) -> dict[Any, dict[str, Any]]:
        return opted_in_only(self.stormservices)

    def topology(self) -> Any:
        return TOPOLOGY

    def cluster_tiers(self) -> Any:
        return TIERS

    def rolesets_of(self, namespace: str, stormservice: str) -> list[dict[str, Any]]:
        return []  # no replica stranded

    def roleset_prefix_shared(self, namespace: str, stormservice: str) -> str | None:
        return None


def probed(stormservices: dict[Any, dict[str, Any]]) -> tuple[_Index, Healer, list[Any]]:
    """A healer over `stormservices` whose heal only records which service it was asked to look at
    (and, in `healer.passes`, the pass it was looked at in)."""
    from stormtopo.operator.healing import Healed

    looked: list[Any] = []

    class Probe(Healer):
        passes: list[Any]

        async def heal(self, key: Any, heal_pass: Any, make_room: Any = None, allocatable: Any = None) -> Any:
            looked.append(key)
            self.passes.append(heal_pass)
            return Healed(None, heal_pass)

    class Listed:  # the free-room reading, its first list done
        def listed(self) -> bool:
            return True

    index = _Index(stormservices)
    healer = Probe(cast(Any, index), cast(Any, None), lambda *_: None, cast(Any, Listed()), cast(Any, None))
    healer.passes = []
    return index, healer, looked


def test_a_pod_gone_from_its_node_ends_the_quiet_of_services_with_nowhere_to_go() -> None:
    import time

    wide = wide_service()

    index, healer, looked = probed({("ns", "svc"): wide})
    asyncio.run(healer.check())
    assert looked == [("ns", "svc")] and healer.passes[-1].fresh  # type: ignore[attr-defined]  # the first pass knows nothing of the past
    healer._memory = healer._memory.healed(("ns", "svc"), HealMemory(quiet_until=time.time() + 3600))  # nowhere to go, for now
    asyncio.run(healer.check())
    assert looked == [("ns", "svc")]  # quiet: not read
    index.pods_freed += 1  # an admitted pod left its node
    asyncio.run(healer.check())
    assert looked == [("ns", "svc")] * 2 and healer.passes[-1].fresh  # type: ignore[attr-defined]  # read again, over a fresh reading
    asyncio.run(healer.check())
    assert looked == [("ns", "svc")] * 2  # and quiet again after
    index.pods_freed += 1
    asyncio.run(healer.check())
    assert looked == [("ns", "svc")] * 2  # once a quiet spell: churn does not read it every pass


def test_a_service_room_is_being_made_for_is_read_every_pass_from_the_lenders_record() -> None:
    """Not from the healer's memory: a new leader looks at it every pass too, until the move's deadline."""
    import time

    from stormtopo.core.healing import MOVE_DEADLINE

    wide = wide_service()

    index, healer, looked = probed({("ns", "svc"): wide, ("other", "small"): lender_record("small-0", WIDE_SVC_A, time.time() - 60)})
    healer._memory = healer._memory.healed(("ns", "svc"), HealMemory(quiet_until=time.time() + 3600))  # nowhere to go, for now
    asyncio.run(healer.check())
    asyncio.run(healer.check())
    assert looked == [("ns", "svc")] * 2  # quiet, but room is being made for it
    index.stormservices[("other", "small")] = lender_record("small-0", WIDE_SVC_A, time.time() - MOVE_DEADLINE - 1)
    healer._memory = healer._memory.healed(("ns", "svc"), HealMemory(quiet_until=time.time() + 3600))
    asyncio.run(healer.check())
    assert looked == [("ns", "svc")] * 2  # past the move's deadline: quiet again


def test_a_pass_that_loses_the_lease_looks_at_no_further_service() -> None:
    """Each service's read may wait out a slow API server, and the Lease can go meanwhile: the rest of the
    pass is the next leader's, never two replicas moving replicas at once."""
    _index, healer, looked = probed({("ns", f"svc{i}"): wide_service() for i in range(3)})
    leading = [True]
    healer.leading = lambda: leading[0]
    original = healer.heal

    async def heal_then_lose(key: Any, heal_pass: Any, make_room: Any = None, allocatable: Any = None) -> Any:
        leading[0] = False  # the Lease went while this service was read
        return await original(key, heal_pass)

    healer.heal = heal_then_lose  # type: ignore[method-assign]
    asyncio.run(healer.check())
    assert looked == [("ns", "svc0")]
    assert len(healer.passes) == 1  # type: ignore[attr-defined]


def test_a_replica_deposed_while_it_read_a_service_records_and_writes_nothing_for_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A read may wait 30 s on a slow API server and the Lease can go meanwhile: the plan made from it is
    not recorded (the next leader would carry out a move decided from this replica's reading)."""
    from types import SimpleNamespace

    from stormtopo.operator import healing as shell

    recorded: list[Any] = []

    class Deposed(Healer):
        async def read(self, key: Any, heal_pass: Any, make_room: Any = None, allocatable: Any = None) -> Any:
            self.leading = lambda: False  # the Lease went during the read
            return object()

        async def record_plan(self, snapshot: Any, plan: Any) -> bool:
            recorded.append(plan)
            return True

    planned = SimpleNamespace(snapshot=None, plan=SimpleNamespace(memory=HealMemory(), moving=None), heal_pass="the pass")
    monkeypatch.setattr(shell, "plan_service", lambda *_: planned)
    healer = Deposed(cast(Any, None), cast(Any, None), lambda *_: None, cast(Any, None), cast(Any, None))
    healed = asyncio.run(healer.heal(("ns", "svc"), cast(Any, "the pass")))
    assert recorded == [] and healed.plan is None and healed.error is None
