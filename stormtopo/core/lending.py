"""Lending room: which StormServices let their replicas be moved to make room for another service's wide
replica (lends_room), and which of their replicas may be (resident); the shell's order to make room
(MakeRoom); and, read back from the lenders' move records, for which wide replica room was made
(room_made_for) and whether a move to make room is under way (making_room_under_way).

A replica moves to make room for another service's only if its own service lends room (lends_room: its
choice, never below max(1, replicas - 1) ready replicas, never with one replica), once per wide replica
within the cool-down (room_made_for). The search for the resident whose move makes room is core/room.py's;
its move, under every rule a wide replica's moves under, is healing's (core/healing.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stormtopo.core.cluster_moves import _under_way, trusted_moves
from stormtopo.core.cooldown import COOLDOWN, _cooldown
from stormtopo.core.disruption import replica_budget
from stormtopo.core.heal_request import may_need_healing, tier_to_heal, wants_healing
from stormtopo.core.moves import recorded_moves, recorded_seconds
from stormtopo.core.priority import known_replica_priority
from stormtopo.core.replica_pods import Replica
from stormtopo.core.request import ClusterTiers
from stormtopo.core.room import Resident
from stormtopo.core.switches import switched_on
from stormtopo.core.topology.tree import Topology
from stormtopo.core.verdict import Why
from stormtopo.core.vocabulary import HEAL_ANNOTATION, LEND_ROOM_ANNOTATION


def lends_room(stormservice: Mapping[str, Any]) -> bool:
    """Whether a service lets its replicas be moved to make room for another service's wide replica: its
    own choice, `stormtopo.io/lend-room: "true"`, with healing (`stormtopo.io/heal: "true"`: a lender's
    move is a healing move, held, settled and cooled down as one) and more than one replica (a lender
    keeps max(1, replicas - 1) ready: see lender_budget).

    A service never makes room for its own wide replica, lender or not: while one of its replicas is
    wide (or moving) it waits for room and gives none (see resident), as a replica moving out of the way
    of its sibling would cost the same tenant two restarts for one, and its replicas move one at a time."""
    return not not_lending(stormservice)


def not_lending(stormservice: Mapping[str, Any]) -> str:
    """Why a service lends no room ("" if it does: see lends_room)."""
    if not switched_on(stormservice, LEND_ROOM_ANNOTATION):
        return f'it did not opt in to lending room ({LEND_ROOM_ANNOTATION}: "true")'
    if not wants_healing(stormservice):
        return f'it lends room only with healing ({HEAL_ANNOTATION}: "true")'
    if replica_budget(stormservice)[0] <= 1:
        return "a service with one replica never lends room"
    return ""


@dataclass(frozen=True)
class WideReplica:
    """The wide replica a move to make room is for: data in the move's record ("for"), prose in Events."""

    namespace: str
    stormservice: str
    replica: str

    def __str__(self) -> str:
        return f"StormService {self.namespace}/{self.stormservice} replica {self.replica}"

    def record(self) -> dict[str, str]:
        return {"namespace": self.namespace, "stormService": self.stormservice, "replica": self.replica}


@dataclass(frozen=True)
class MakeRoom:
    """The shell's order (from core/room.py's search over every opted-in service): move `replica` of
    this service, within its tier, so that `wide` fits in `frees`."""

    replica: str
    wide: WideReplica
    frees: str  # the HyperNode it makes room in


def wide_replica(namespace: str, stormservice: str, replica: str) -> WideReplica:
    return WideReplica(namespace, stormservice, replica)


# How the release before named it, as a sentence: read for one release, so that room made by a leader of
# that release still counts once this one leads.
_SAID_FOR = re.compile(r"StormService ([^/\s]+)/(\S+) replica (\S+)")


def recorded_for(move: Mapping[str, Any]) -> WideReplica | None:
    """The wide replica a make-room record is for; None if it names none readably."""
    named = move.get("for")
    if isinstance(named, Mapping):
        fields = (named.get("namespace"), named.get("stormService"), named.get("replica"))
        return WideReplica(*fields) if all(isinstance(f, str) and f for f in fields) else None  # type: ignore[arg-type]
    found = _SAID_FOR.fullmatch(named) if isinstance(named, str) else None
    return WideReplica(*found.groups()) if found is not None else None


def room_made_for(stormservices: Iterable[Mapping[str, Any]], now: float) -> dict[tuple[str, str, str], float]:
    """When room was last made for each wide replica, by (namespace, stormservice, replica): the latest
    start of a move to make room recorded for it (its "for") on a service that lends room, settled or not.
    From the move records the StormServices keep, not from the operator's memory: a new leader, or a
    restarted operator, knows that room was made as well as the one that made it, and makes room at most
    once per wide replica within the cool-down. (A move refused before its first eviction moved nothing:
    its record keeps no "for", and it does not count.) Only trusted records count (trusted_moves)."""
    out: dict[tuple[str, str, str], float] = {}
    for stormservice in stormservices:
        if not lends_room(stormservice):
            continue  # only a lender's moves make room: a record on any other service is not one
        for move, at in trusted_moves(stormservice, now):
            wide = recorded_for(move)
            if move.get("reason") != Why.MAKE_ROOM or wide is None:
                continue
            key = (wide.namespace, wide.stormservice, wide.replica)
            out[key] = max(at, out.get(key, at))
    return out


# Here rather than in core/cluster_moves.py: it asks lends_room, and the cluster's moves sit below lending.
def making_room_under_way(stormservices: Iterable[Mapping[str, Any]], now: float) -> bool:
    """A move to make room, trusted (trusted_moves) on a service that lends room, not settled yet and not
    past its deadline (a record its service's healing no longer settles, say healing turned off
    meanwhile, does not block making room for ever)."""
    return any(
        m.get("reason") == Why.MAKE_ROOM and _under_way(m, at, now)
        for stormservice in stormservices
        if lends_room(stormservice)
        for m, at in trusted_moves(stormservice, now)
    )


def resident(
    stormservice: Mapping[str, Any],
    roleset: Mapping[str, Any],
    pods: Sequence[Mapping[str, Any]],
    tiers: ClusterTiers,
    topology: Topology,
    now: float,
    cooldown: float = COOLDOWN,
) -> Resident | None:
    """A replica that may be moved to make room (core/room.py), from what the index holds: its service
    opted in to healing and to lending (lends_room: its own choice, more than one replica), has no
    replica wide or moving, and the replica is whole, within its tier and out of its cool-down and
    back-off. Its own plan checks the rest (the lender's budget, readiness) on a fresh read."""
    if not lends_room(stormservice):
        return None  # only a service that chose to lend is ever moved for another
    tier = tier_to_heal(stormservice, tiers, topology, opted_in_only=True)
    moves = recorded_moves(stormservice)
    name = str(roleset["metadata"]["name"])
    if tier is None or may_need_healing(stormservice, tiers, topology):
        return None  # not opted in; or wide itself, or moving: it waits for room, it does not give it
    move = moves.get(name) or {}
    last, retry = recorded_seconds(move.get("at")), recorded_seconds(move.get("retryAt"))
    if (last is not None and now - last < _cooldown(move, cooldown)) or (retry is not None and now < retry):
        return None
    # The index keeps no owner references: the replica's pods are those carrying its label.
    meta = {k: v for k, v in (roleset.get("metadata") or {}).items() if k != "uid"}
    replica = Replica({**roleset, "metadata": meta}, tuple(pods))
    nodes = replica.nodes()
    if not replica.complete() or not set(nodes) <= topology.nodes.keys():
        return None
    span = topology.span(nodes)
    if span.tier is None or span.tier > tier:
        return None
    namespace = str(stormservice["metadata"].get("namespace", ""))
    priority = known_replica_priority(roleset.get("spec") or {}, dict(tiers.priority_values))
    if priority is None:
        return None  # its class not read yet: it might rank above the replica it would make room for
    return Resident(namespace, str(stormservice["metadata"]["name"]), name, replica.gpus_by_node(), tuple(replica.wanted()), tier, priority)
