"""Making room's search: for a healing pass's wide replicas with nowhere to go (HealPass.no_room), the
residents (replicas of services that lend room, core/lending.py) whose move would make room (core/room.py),
offered one after another until one's own plan moves it (core/heal_pass.py plan_service, ordered by a
MakeRoom); the dry run (commands/heal.py) asks the same search."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from stormtopo.core.heal_plan import HealPlan
from stormtopo.core.heal_target import room_of
from stormtopo.core.lending import MakeRoom, making_room_under_way, resident, room_made_for, wide_replica
from stormtopo.core.node_fit import NodeFacts
from stormtopo.core.priority import known_replica_priority, replica_priority
from stormtopo.core.replica_pods import Replica
from stormtopo.core.request import ClusterTiers
from stormtopo.core.room import Resident, Room, resident_key, room_by_moving
from stormtopo.core.topology.tree import Topology
from stormtopo.core.verdict import Why

ServiceKey = tuple[str, str]  # (namespace, StormService)
Pod = Mapping[str, Any]
UNRANKED = -(1 << 62)  # below every PriorityClass value (they are 32-bit)
NoRoom = tuple[ServiceKey, Replica, int]  # a wide replica with nowhere to go, and the tier it must be within
WIDE_TRIED = 2  # wide replicas a pass looks for a resident to move for (each search ~0.1 s at 1,000 nodes)
DONORS_TRIED = 3  # residents offered in turn to one wide replica, when the first ones' own plans refuse


def wide_waiting(
    no_room: Iterable[NoRoom],
    stormservices: Collection[Mapping[str, Any]],
    now: float,
    cooldown: float,
    priorities: Mapping[str, int] | None = None,
) -> tuple[NoRoom, ...]:
    """This pass's wide replicas with nowhere to go that room may be made for now, the highest priority first
    (one move to make room runs in the cluster at a time: it goes to the replica Volcano ranks highest):
    none while a move to make room is under way, and none made for the same wide replica within its
    cool-down (both read from the move records, so a new leader knows them as the last one did)."""
    if making_room_under_way(stormservices, now):
        return ()
    made = room_made_for(stormservices, now)
    waiting = [(k, r, t) for k, r, t in no_room if now - made.get((*k, r.name), float("-inf")) >= cooldown]
    values = priorities or {}
    return tuple(sorted(waiting, key=lambda w: -replica_priority(w[1].roleset.get("spec") or {}, values)))  # (stable)


def _rank(replica: Replica, priorities: Mapping[str, int]) -> int:
    """The wide replica's priority; while its class is not read yet, below every lender's (no room is made)."""
    known = known_replica_priority(replica.roleset.get("spec") or {}, priorities)
    return known if known is not None else UNRANKED


def lenders(
    found: Iterable[tuple[Mapping[str, Any], Mapping[str, Any], Iterable[Pod]]],
    tiers: ClusterTiers,
    topology: Topology,
    now: float,
    cooldown: float,
) -> list[Resident]:
    """Of (StormService, RoleSet, its pods) as the index holds them, the replicas that may be moved to make room."""
    return [r for svc, rs, pods in found if (r := resident(svc, rs, list(pods), tiers, topology, now, cooldown))]


@dataclass(frozen=True)
class RoomSearch:
    """Making room's search: the wide replicas waiting (at most WIDE_TRIED), each offered the residents
    whose move makes room for it, one after another (at most DONORS_TRIED), skipping those refused."""

    waiting: tuple[NoRoom, ...]
    residents: tuple[Resident, ...]
    allocatable: Mapping[str, int]
    nodes: Mapping[str, NodeFacts] | None
    topology: Topology
    listed: frozenset[str]  # the node tier's short list: a resident on one is not offered (core/room.py)
    priorities: Mapping[str, int] = field(default_factory=dict)  # each PriorityClass's value: no resident above the wide replica
    wide: int = 0  # the one of `waiting` offered residents now
    tries: int = 0  # residents offered to it so far
    skip: frozenset[str] = frozenset()  # residents its own plan refused


@dataclass(frozen=True)
class Offer:
    """A resident offered: its service, the order its plan moves it under, and where it would go."""

    lender: ServiceKey
    order: MakeRoom
    room: Room
    search: RoomSearch

    def refused(self) -> RoomSearch:
        """Its own plan refused (the lender's budget, not ready, Volcano might put it back): the next one."""
        return replace(self.search, tries=self.search.tries + 1, skip=self.search.skip | {resident_key(self.room.resident)})


def next_offer(search: RoomSearch, free: Mapping[str, int]) -> Offer | None:
    """The next resident to offer over the pass's free GPUs, None once every wide replica was tried."""
    while search.wide < min(len(search.waiting), WIDE_TRIED):
        if search.tries < DONORS_TRIED:
            key, replica, tier = search.waiting[search.wide]
            room = room_by_moving(
                replica.wanted(),
                replica.gpus_by_node(),
                tier,
                search.residents,
                room_of(free, search.nodes, replica),  # where the wide replica's pods could run at all
                search.allocatable,
                search.topology,
                search.skip,
                search.listed,
                _rank(replica, search.priorities),
            )
            if room is not None:
                order = MakeRoom(room.resident.replica, wide_replica(*key, replica.name), room.frees.switch.name)
                return Offer((room.resident.namespace, room.resident.stormservice), order, room, search)
        search = replace(search, wide=search.wide + 1, tries=0, skip=frozenset())
    return None


def made_room(plan: HealPlan | None) -> bool:
    """The lender's plan moved the resident to make room: its record now limits the next pass."""
    return plan is not None and plan.moving is not None and plan.moving.why is Why.MAKE_ROOM
