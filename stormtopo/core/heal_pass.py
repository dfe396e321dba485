"""A healing pass, planned as the placement path plans a replica: what the index holds of each
StormService is read once, pure choices are made over it, and the pass's state is a value handed from
one service to the next (operator/healing.py reads, calls these, executes and stores what they return).

Which services a pass looks at (plan_look): nothing is read from the API for a service until its own
placement record shows a wide replica, a move of it is under way, or a replica of it is stranded. A
service whose wide replicas had nowhere to go stays quiet (HealMemory.quiet_until) unless room is being
made for it, or pods left their nodes since the last pass (room may have been freed): then it is looked
at again, at most once a quiet spell, so that a churning cluster does not read every stuck service every
pass. A stranded service that does not ask for healing is said where it would fit, once per set of
waiting pods.

The pass's reading of free room (HealPass.free) is taken once, at the first service read, less the
targets of moves under way whose pods are not placed yet (core/cluster_moves.py set_aside); a move begun in
the pass takes its target for the rest of it. Its moves count against the cluster's cap at once, before
the index shows them (HealPass.moving_elsewhere). A service looked at is read by the shell and planned
in one call (plan_service: core/healing.py over the pass's room and moves), which returns the pass as it
goes on.

Making room (core/room_search.py): for this pass's wide replicas with nowhere to go (HealPass.no_room).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, TypeVar

from stormtopo.core.cluster_moves import is_being_deleted, moving_in_cluster, placed_since, set_aside
from stormtopo.core.heal_plan import HealMemory, HealPlan
from stormtopo.core.heal_request import may_need_healing, tier_to_heal
from stormtopo.core.heal_snapshot import HealSnapshot
from stormtopo.core.healing import MOVE_DEADLINE, plan_healing, plan_stranded
from stormtopo.core.lending import room_made_for
from stormtopo.core.movable import movable
from stormtopo.core.request import ClusterTiers, is_opted_in
from stormtopo.core.room_search import NoRoom, ServiceKey
from stormtopo.core.stranded import pending_since
from stormtopo.core.topology.tree import Topology
from stormtopo.core.verdict import Block, Why
from stormtopo.core.vocabulary import MOVES_ANNOTATION
from stormtopo.core.writes import Write

Pod = Mapping[str, Any]
V = TypeVar("V")


@dataclass(frozen=True)
class ServiceReading:
    """One StormService as the index holds it, each RoleSet with its admitted pods: what a pass decides
    from before any API read."""

    key: ServiceKey
    stormservice: Mapping[str, Any]
    replicas: tuple[tuple[Mapping[str, Any], tuple[Pod, ...]], ...] = ()
    prefix_shared_with: str | None = None  # its pods could be taken for this service's: not movable (core/optin.py)


@dataclass(frozen=True)
class HealerMemory:
    """What the healer keeps from one pass to the next, as the planners return it."""

    services: Mapping[ServiceKey, HealMemory] = field(default_factory=dict)  # per service healing (plan_healing)
    stranded: Mapping[ServiceKey, HealMemory] = field(default_factory=dict)  # said of stranded replicas of services not healing
    stranded_pods: Mapping[ServiceKey, frozenset[str]] = field(default_factory=dict)  # the waiting pods it was said for
    woken: Mapping[ServiceKey, float] = field(default_factory=dict)  # service -> when a freed node last ended its quiet
    freed_seen: int = -1  # the index's count of admitted pods gone from their nodes, at the last pass

    def of(self, key: ServiceKey) -> HealMemory:
        return self.services.get(key, HealMemory())

    def healed(self, key: ServiceKey, memory: HealMemory) -> HealerMemory:
        return replace(self, services={**self.services, key: memory})

    def noticed(self, key: ServiceKey, memory: HealMemory) -> HealerMemory:
        return replace(self, stranded={**self.stranded, key: memory})

    def unnoticed(self, key: ServiceKey) -> HealerMemory:
        """A stranded notice that could not be planned (its read failed): looked at again at the next pass."""
        return replace(self, stranded_pods=_without(self.stranded_pods, key))

    def forget(self, key: ServiceKey) -> HealerMemory:
        """Nothing to look at in the service any more: what was remembered of it goes (not its waking)."""
        if key not in self.services and key not in self.stranded and key not in self.stranded_pods:
            return self  # the common case, a service with nothing wide: no copy per service and pass
        return replace(
            self,
            services=_without(self.services, key),
            stranded=_without(self.stranded, key),
            stranded_pods=_without(self.stranded_pods, key),
        )

    def kept(self, keys: Collection[ServiceKey], now: float, recheck: float) -> HealerMemory:
        """At the end of a pass: services deleted are forgotten, and wakings older than a quiet spell."""
        return replace(
            self,
            services={k: m for k, m in self.services.items() if k in keys},
            stranded={k: m for k, m in self.stranded.items() if k in keys},
            stranded_pods={k: p for k, p in self.stranded_pods.items() if k in keys},
            woken={k: t for k, t in self.woken.items() if now - t < recheck},
        )


@dataclass(frozen=True)
class HealPass:
    """One pass's state, handed from one service to the next."""

    now: float
    fresh: bool  # pods left their nodes since the last pass: room may have been freed
    awaited: frozenset[ServiceKey]  # services room is being made for (from the lenders' records): looked at every pass
    recheck: float  # seconds a service with nowhere to go stays quiet
    stranded_after: float
    listed: bool | None = None  # the free-room reading's first list is done; None: not asked yet this pass
    free: Mapping[str, int] | None = None  # free GPUs per node, less the targets of moves under way; None: not read yet
    started: frozenset[ServiceKey] = frozenset()  # services that began a move (the index may not show it yet)
    no_room: tuple[NoRoom, ...] = ()

    def with_room(self, free: Mapping[str, int], services: Iterable[ServiceReading], topology: Topology) -> HealPass:
        """The pass's reading of free GPUs, less the targets of every service's moves under way."""
        return replace(self, free=set_aside_moves(free, topology, services))

    def planned(self, key: ServiceKey, snapshot: HealSnapshot, plan: HealPlan, opted_in_only: bool = True) -> HealPass:
        """After a service's plan: a move it began counts at once; its wide replicas with nowhere to go
        wait for room to be made (not those of a lender's plan, which was ordered to make room)."""
        started = self.started | {key} if plan.moving is not None else self.started
        tier = tier_to_heal(snapshot.stormservice, snapshot.tiers, snapshot.topology, opted_in_only)
        no_room = self.no_room
        if tier is not None and plan.moving is None and snapshot.make_room is None:
            no_room += tuple(
                (key, next(r for r in snapshot.replicas if r.name == v.replica), tier)
                for v in plan.verdicts
                if v.block is Block.NO_ROOM and v.why in (Why.SOFT_WIDE, Why.VIOLATION)
            )
        return replace(self, started=started, no_room=no_room)

    def moved(self, service: Iterable[ServiceReading], topology: Topology) -> HealPass:
        """A move recorded: its target is taken for the rest of this pass."""
        return self if self.free is None else replace(self, free=set_aside_moves(self.free, topology, service))

    def moving_elsewhere(self, key: ServiceKey, stormservices: Iterable[tuple[ServiceKey, Mapping[str, Any]]], now: float) -> int:
        """Replicas of other services moving now: their records, and this pass's moves that the index may
        not show yet (counted twice rather than not at all: the cap is a ceiling)."""
        return moving_in_cluster([s for k, s in stormservices if k != key], now) + len(self.started - {key})


@dataclass(frozen=True)
class ServiceRead:
    """One service read from the API for its plan. Its snapshot's free room and the cluster's moves are
    the pass's (plan_service fills them in); `free`: the reading of free room taken now, where the pass
    had none yet, with every service as the index holds it (`readings`) for the moves to set aside."""

    key: ServiceKey
    snapshot: HealSnapshot
    others: tuple[tuple[ServiceKey, Mapping[str, Any]], ...]  # every StormService the index holds: the moves in the cluster
    free: Mapping[str, int] | None = None
    readings: tuple[ServiceReading, ...] = ()


@dataclass(frozen=True)
class ServicePlan:
    snapshot: HealSnapshot
    plan: HealPlan
    heal_pass: HealPass


def plan_service(heal_pass: HealPass, read: ServiceRead, memory: HealMemory, opted_in_only: bool = True) -> ServicePlan:
    """One service's healing plan (core/healing.py) over the pass's free room and moves, and the pass as
    it goes on. `opted_in_only=False`: `stormtopo heal --dry-run` of a service that does not ask for healing."""
    snapshot, heal_pass = _in_pass(heal_pass, read)
    plan = plan_healing(snapshot, memory, opted_in_only)
    return ServicePlan(snapshot, plan, heal_pass.planned(read.key, snapshot, plan, opted_in_only))


def plan_alone(
    snapshot: HealSnapshot, key: ServiceKey, in_play: Mapping[ServiceKey, Mapping[str, Any]], moving: tuple[ServiceReading, ...]
) -> ServicePlan:
    """`stormtopo heal --dry-run`: the plan a pass would make of this one service now (plan_service), over
    `snapshot.free` less the targets of the moves under way (`moving`: the services with move records, with
    their replicas), against the cap counted over every StormService `in_play`; as if the service asked for
    healing where it does not. Its pass's `no_room` is what the pass would then make room for (wide_waiting)."""
    services = {**in_play, key: snapshot.stormservice}
    heal_pass, _ = begin_pass(HealerMemory(), services.values(), 0, snapshot.now, snapshot.recheck, snapshot.stranded_after)
    read = ServiceRead(key, snapshot, tuple(services.items()), snapshot.free, moving)
    return plan_service(heal_pass, read, HealMemory(), opted_in_only=False)


def plan_notice(heal_pass: HealPass, read: ServiceRead, memory: HealMemory) -> tuple[list[Write], HealMemory, HealPass]:
    """A service not healing: where its stranded replicas would fit, said once (core/healing.py plan_stranded)."""
    snapshot, heal_pass = _in_pass(heal_pass, read)
    writes, memory = plan_stranded(snapshot, memory)
    return writes, memory, heal_pass


def _in_pass(heal_pass: HealPass, read: ServiceRead) -> tuple[HealSnapshot, HealPass]:
    if read.free is not None:
        heal_pass = heal_pass.with_room(read.free, read.readings, read.snapshot.topology)
    assert heal_pass.free is not None  # read with the pass's first service
    moving = heal_pass.moving_elsewhere(read.key, read.others, read.snapshot.now)
    return replace(read.snapshot, free=heal_pass.free, moving_elsewhere=moving), heal_pass


def in_play(stormservice: Mapping[str, Any]) -> bool:
    """What a healing pass looks at: a StormService opted in, or one still carrying move records."""
    annotations = (stormservice.get("metadata") or {}).get("annotations") or {}
    return is_opted_in(annotations) or MOVES_ANNOTATION in annotations


def begin_pass(
    memory: HealerMemory, stormservices: Iterable[Mapping[str, Any]], pods_freed: int, now: float, recheck: float, stranded_after: float
) -> tuple[HealPass, HealerMemory]:
    """A pass begins: whether room may have been freed since the last, and which services room is being
    made for (read every pass until it is there, or the move's deadline passes)."""
    awaited = frozenset((ns, name) for (ns, name, _), at in room_made_for(stormservices, now).items() if now - at < MOVE_DEADLINE)
    return HealPass(now, pods_freed != memory.freed_seen, awaited, recheck, stranded_after), replace(memory, freed_seen=pods_freed)


class Look(StrEnum):
    """What a pass does with one StormService."""

    NOTHING = "nothing"  # nothing wide, moving or stranded: what was remembered of it is forgotten
    READ_ROOM = "read-room"  # ask whether the free-room reading's first list is done, then plan again
    NOT_YET = "not-yet"  # that first list is under way: this pass waits for none of it and looks no further
    QUIET = "quiet"  # nowhere to go at its last look, or its stranded replicas said already for these pods
    NOTICE = "notice"  # stranded, and not asking for healing: say where it would fit
    HEAL = "heal"


def plan_look(
    heal_pass: HealPass, memory: HealerMemory, service: ServiceReading, tiers: ClusterTiers, topology: Topology
) -> tuple[Look, HealerMemory]:
    key, stormservice = service.key, service.stormservice
    if is_being_deleted(stormservice):
        return Look.NOTHING, memory.forget(key)
    if not may_need_healing(stormservice, tiers, topology) and not stranded(service, heal_pass.now, heal_pass.stranded_after):
        return Look.NOTHING, memory.forget(key)
    if heal_pass.listed is None:
        return Look.READ_ROOM, memory
    if not heal_pass.listed:
        return Look.NOT_YET, memory
    if not movable(stormservice, service.prefix_shared_with):  # the request's Event says why, where it asks
        waiting = waiting_pods(service)
        if memory.stranded_pods.get(key) == waiting:
            return Look.QUIET, memory  # no read every pass for as long as these pods wait
        return Look.NOTICE, replace(memory, stranded_pods={**memory.stranded_pods, key: waiting})
    if heal_pass.now < memory.of(key).quiet_until and key not in heal_pass.awaited:
        if not heal_pass.fresh or heal_pass.now - memory.woken.get(key, float("-inf")) < heal_pass.recheck:
            return Look.QUIET, memory
        memory = replace(memory, woken={**memory.woken, key: heal_pass.now})  # room may have been freed: once a quiet spell
    return Look.HEAL, memory


def stranded(service: ServiceReading, now: float, after: float) -> bool:
    """From the index: a replica of the service has a pod waiting past `after` beside running ones
    (core/healing.py, Why.STRANDED; the plan judges the rest on a fresh read)."""
    return any((since := pending_since(pods)) is not None and now - since >= after for _, pods in service.replicas)


def waiting_pods(service: ServiceReading) -> frozenset[str]:
    """The pods of the service that wait unbound."""
    return frozenset(p["metadata"]["name"] for _, pods in service.replicas for p in pods if not (p.get("spec") or {}).get("nodeName"))


def set_aside_moves(free: Mapping[str, int], topology: Topology, services: Iterable[ServiceReading]) -> dict[str, int]:
    """Free GPUs less the targets of the services' moves under way whose pods are not placed yet."""
    out = dict(free)
    for service in services:
        rolesets = [roleset for roleset, _ in service.replicas]
        placed = {
            str(roleset["metadata"]["name"]): placed_since(pods, service.stormservice, str(roleset["metadata"]["name"]))
            for roleset, pods in service.replicas
        }
        out = set_aside(out, topology, service.stormservice, rolesets, placed)
    return out


def _without(mapping: Mapping[ServiceKey, V], key: ServiceKey) -> dict[ServiceKey, V]:
    return {k: v for k, v in mapping.items() if k != key}
