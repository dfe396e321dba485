"""Healing a placement, as one decision per StormService: which replica, if any, moves into one domain now.

A replica that landed wider than its request (a soft replica above its tier, a hard one in violation)
stays there for the rest of its life unless something moves it. With `stormtopo.io/heal: "true"` on
its StormService, stormtopo evicts the whole replica, through the Eviction API, once its own packing
check finds a domain within the tier that holds the whole replica now; AIBrix re-creates the pods and
Volcano places them again as one gang, held `hard` to the target's tier while it moves (core/moves.py).
Every pod, not one: a gang with a running pod is placed around it, back into the old domain.

Safe by construction, as the descheduler is: one replica of a service moving at a time; never below
the service's replicas minus its budget (AIBrix's maxUnavailable, resolved as AIBrix resolves it);
every PodDisruptionBudget checked before the first eviction (and enforced by the Eviction API); a
cool-down per replica, recorded on the StormService so a restarted operator keeps it, and doubled
after a move that did not land within the tier; a back-off after a refused eviction. A replica moves
to make room for another service's only if its own service lends room (lends_room: its choice, never
below max(1, replicas - 1) ready replicas, never with one replica), once per wide replica within the
cool-down (room_made_for, read back from the move records).
"""

from __future__ import annotations

import datetime
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from stormtopo.core.explanation import allowed_tier
from stormtopo.core.gang import gpus_per_pod, replica_pods
from stormtopo.core.jsonpatch import set_spec_fields
from stormtopo.core.moves import CLOCK_SKEW, HOLD, annotation_table, asks_healing, recorded_moves, recorded_seconds
from stormtopo.core.moves import MOVE_DEADLINE as MOVE_DEADLINE  # the hold's deadline too (core/moves.py); the shell's import
from stormtopo.core.node_fit import NodeFacts, nodes_for, pod_requests, without_pins
from stormtopo.core.packing import DomainFit, domains_at_tier
from stormtopo.core.placement import is_live
from stormtopo.core.podgroup import desired_fields
from stormtopo.core.priority import replica_priority
from stormtopo.core.request import ClusterTiers, Mode, Scope, TopologyRequest, valid_request
from stormtopo.core.room import Resident, freed, placed_elsewhere
from stormtopo.core.switches import switched_on
from stormtopo.core.topology.selectors import label_requirements
from stormtopo.core.topology.tree import Topology
from stormtopo.core.vocabulary import HEAL_ANNOTATION, LEND_ROOM_ANNOTATION, PLACEMENT_ANNOTATION, REVISION_LABEL, ROLE_LABEL
from stormtopo.core.writes import EvictPod, PatchPodGroup, PostEvent, RecordMove, Say, Write

COOLDOWN = 900.0  # seconds: a replica is not moved again within this of its last move
COOLDOWN_MAX = 4 * 3600.0  # the cool-down doubles after each move that did not land within the tier, up to this
# Moves in a row that did not land within the tier, after which a replica is not moved again (one Event says
# so): what keeps a replica from landing is not what its move can change (issue 34, item 4). A rollout's
# new replicas start afresh.
GIVE_UP_AFTER = 3
BACKOFF = 30.0  # seconds after a refused eviction before the replica is tried again; doubled per refusal
BACKOFF_MAX = 1800.0
ROOM_SEARCHES = 4  # packing searches per service and pass (each up to ~20 ms; they run on the operator's loop)
NO_ROOM_RECHECKS = 3  # healing passes skipped for a service whose wide replicas had nowhere to go
NO_ROOM_RECHECK = 30.0  # seconds: NO_ROOM_RECHECKS passes at the default --heal-interval


class Why(StrEnum):
    """Why a replica moves: the metric's label and the Event's words."""

    SOFT_WIDE = "soft-above-tier"
    VIOLATION = "hard-violation"
    MAKE_ROOM = "make-room"  # within its tier, it moves to another domain so that a wide replica fits (core/room.py)
    # A hard replica with a pod Pending past --heal-stranded-after in a domain that cannot hold it, while another
    # domain within its tier holds it whole: Volcano keeps a gang with a running pod in its HyperNode (issue 35).
    STRANDED = "stranded"


class Block(StrEnum):
    """Why a wide replica does not move now: said once per kind, whatever the numbers in the message."""

    MOVING = "another-moving"
    COOLDOWN = "cool-down"
    BACKOFF = "back-off"
    BUDGET = "service-budget"
    DISRUPTION_BUDGET = "pod-disruption-budget"
    NEXT = "one-at-a-time"
    NO_ROOM = "no-room"
    ROLLOUT = "rollout"
    UNCHECKED = "not-checked"  # wide and free to move, but this pass searched enough others
    CLUSTER_CAP = "cluster-cap"  # as many replicas are moving in the cluster as may at once
    GAVE_UP = "gave-up"  # its last GIVE_UP_AFTER moves did not land within its tier


def wants_healing(stormservice: Mapping[str, Any]) -> bool:
    return asks_healing(stormservice)


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


def lender_budget(stormservice: Mapping[str, Any]) -> tuple[int, int]:
    """A lender's replicas and how many may be unavailable when one moves to make room for another
    service: its own budget (replica_budget, where an unset maxUnavailable resolves to 1), but never
    below max(1, replicas - 1) ready, so at most one, and none for a service with one replica."""
    replicas, budget = replica_budget(stormservice)
    return replicas, max(0, min(budget, replicas - max(1, replicas - 1)))


def wide_replica(namespace: str, stormservice: str, replica: str) -> str:
    """How a move to make room names the wide replica it is for (MakeRoom.wide, the record's "for")."""
    return f"StormService {namespace}/{stormservice} replica {replica}"


_WIDE_REPLICA = re.compile(r"StormService ([^/\s]+)/(\S+) replica (\S+)")


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
            found = _WIDE_REPLICA.fullmatch(str(move.get("for") or ""))
            if move.get("reason") != Why.MAKE_ROOM or found is None:
                continue
            key = (found.group(1), found.group(2), found.group(3))
            out[key] = max(at, out.get(key, at))
    return out


def trusted_moves(stormservice: Mapping[str, Any], now: float) -> list[tuple[Mapping[str, Any], float]]:
    """The move records of a StormService that may count in what healing knows of the whole cluster (the
    cap on moves at once, a move to make room under way, room made for whom), each with its start.

    A StormService's owner can write its annotations, so its records are input, not stormtopo's word:
    they count only on a service that asks for healing (whose moves the healer settles at each look),
    not being deleted, each with a readable start no further ahead of `now` than CLOCK_SKEW (a record
    dated in the future would otherwise count until then)."""
    if is_being_deleted(stormservice) or not asks_healing(stormservice):
        return []
    out = []
    for move in recorded_moves(stormservice).values():
        at = _seconds(move.get("at"))
        if at is not None and at - now <= CLOCK_SKEW:
            out.append((move, at))
    return out


def _under_way(move: Mapping[str, Any], at: float, now: float) -> bool:
    return not move.get("done") and now - at <= MOVE_DEADLINE


STRANDED_AFTER = 300.0  # seconds a pod of a hard replica waits, its other pods running, before the replica is stranded
MAX_MOVING = 2  # replicas moving at once in the whole cluster (--heal-max-moving): a recovery is no synchronised restart


def is_being_deleted(stormservice: Mapping[str, Any]) -> bool:
    """A StormService being deleted (alone, or with its namespace) heals nothing, and its moves, which
    go with it, hold back no other service's."""
    return bool((stormservice.get("metadata") or {}).get("deletionTimestamp"))


def moving_in_cluster(stormservices: Iterable[Mapping[str, Any]], now: float) -> int:
    """Replicas moving now across the cluster: trusted moves (trusted_moves), not settled, within their
    deadline; at most one per service, as the healer moves one replica of a service at a time (so a
    service's forged records take no more of the cap than its own healing could)."""
    return sum(
        1
        for stormservice in stormservices
        if any(_under_way(m, at, now) and m.get("toTier") is not None for m, at in trusted_moves(stormservice, now))
    )


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


def pending_since(pods: Sequence[Mapping[str, Any]]) -> float | None:
    """Of one replica's live pods: since when the longest-waiting unbound one has been found
    unschedulable by the scheduler (its PodScheduled condition False), if another is bound (a gang with
    a running pod is kept in its domain by Volcano); None otherwise. A pod held at a scheduling gate
    (stormtopo's own: a router, a spread replica not let go yet) is not waiting for room."""
    bound = [p for p in pods if (p.get("spec") or {}).get("nodeName")]
    waiting = [t for p in pods if (t := _unschedulable_since(p)) is not None]
    return min(waiting) if bound and waiting else None


def _unschedulable_since(pod: Mapping[str, Any]) -> float | None:
    spec, meta = pod.get("spec") or {}, pod.get("metadata") or {}
    if spec.get("nodeName") or spec.get("schedulingGates") or meta.get("deletionTimestamp"):
        return None
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False" and condition.get("reason") != "SchedulingGated":
            return _seconds(condition.get("lastTransitionTime"))
    return None


@dataclass(frozen=True)
class Replica:
    """One RoleSet and every pod carrying its label, as read from the API."""

    roleset: Mapping[str, Any]
    pods: tuple[Mapping[str, Any], ...]

    @property
    def name(self) -> str:
        return str(self.roleset["metadata"]["name"])

    def own(self) -> list[Mapping[str, Any]]:
        """Its pods: those the RoleSet controls, where the RoleSet's uid is known (another tool's pod
        that copies AIBrix's labels is never evicted); by label otherwise."""
        uid = (self.roleset.get("metadata") or {}).get("uid")
        if not uid:
            return list(self.pods)
        return [p for p in self.pods if any(o.get("uid") == uid for o in (p.get("metadata") or {}).get("ownerReferences") or [])]

    def live(self) -> list[Mapping[str, Any]]:
        return [p for p in self.own() if is_live(p)]

    def bound(self) -> list[Mapping[str, Any]]:
        return [p for p in self.live() if (p.get("spec") or {}).get("nodeName")]

    def pending_since(self) -> float | None:
        """When the longest-waiting of its pods was created, if some of its pods run and that one is not
        bound (a replacement Volcano keeps in the gang's domain); None otherwise."""
        return pending_since(self.live())

    def wanted(self) -> list[int]:
        return replica_pods(self.roleset.get("spec") or {})

    def complete(self) -> bool:
        """Exactly the pods it should have are bound, and none is on its way out (a finished pod left
        behind, say one the kubelet evicted, is neither); surge pods of a rollout are not complete."""
        terminating = any((p.get("metadata") or {}).get("deletionTimestamp") for p in self.own())
        return bool(self.wanted()) and len(self.bound()) == len(self.wanted()) == len(self.live()) and not terminating

    def ready(self) -> bool:
        return self.complete() and all(_is_ready(p) for p in self.bound())

    def nodes(self) -> list[str]:
        return sorted(p["spec"]["nodeName"] for p in self.bound())

    def requests_by_node(self) -> dict[str, dict[str, int]]:
        """What its bound pods request per node, every resource (milli-units): free again once it moves."""
        held: dict[str, dict[str, int]] = {}
        for pod in self.bound():
            on = held.setdefault(pod["spec"]["nodeName"], {})
            for resource, amount in pod_requests(pod["spec"]).items():
                on[resource] = on.get(resource, 0) + amount
        return held

    def gpus_by_node(self) -> dict[str, int]:
        """What its bound pods hold per node: free again once it moves."""
        per_role = gpus_per_pod(self.roleset.get("spec") or {})
        held: dict[str, int] = {}
        for pod in self.bound():
            role = ((pod.get("metadata") or {}).get("labels") or {}).get(ROLE_LABEL, "")
            held[pod["spec"]["nodeName"]] = held.get(pod["spec"]["nodeName"], 0) + per_role.get(role, 0)
        return held


@dataclass(frozen=True)
class MakeRoom:
    """The shell's order (from core/room.py's search over every opted-in service): move `replica` of
    this service, within its tier, so that `wide` fits in `frees`."""

    replica: str
    wide: str  # "namespace/stormservice replica name"
    frees: str  # the HyperNode it makes room in


@dataclass(frozen=True)
class HealSnapshot:
    """A StormService that may heal, read now: the StormService as the API server has it (the moves
    record decides what may move), its replicas with all their pods and PodGroups, every node's free
    GPUs (schedulable nodes only), and the PodDisruptionBudgets of its namespace."""

    stormservice: Mapping[str, Any]
    replicas: tuple[Replica, ...]
    tiers: ClusterTiers
    topology: Topology
    free: Mapping[str, int]  # free GPUs per schedulable node, counting every bound pod of the cluster
    budgets: tuple[Mapping[str, Any], ...] = ()
    now: float = 0.0  # wall-clock seconds (the cool-down is recorded on the StormService, across restarts)
    cooldown: float = COOLDOWN
    podgroups: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # replica -> its PodGroup
    recheck: float = NO_ROOM_RECHECK  # seconds before a service with nowhere to go is read again
    make_room: MakeRoom | None = None
    allocatable: Mapping[str, int] = field(default_factory=dict)  # GPUs per node (else its size in the tree)
    # Replicas of other StormServices moving now (moving_in_cluster), and how many may move at once.
    moving_elsewhere: int = 0
    max_moving: int = MAX_MOVING
    # Per node, what decides whether the replica's pods may run there, GPUs aside (taints, labels, other
    # resources left; core/node_fit.py); None: not read, every node in `free` counts.
    nodes: Mapping[str, NodeFacts] | None = None
    stranded_after: float = STRANDED_AFTER  # --heal-stranded-after

    @property
    def request(self) -> TopologyRequest | None:
        return valid_request(self.stormservice, self.tiers)

    @property
    def healing_tier(self) -> int | None:
        """The tier its replicas must be within, if it opted in to healing."""
        return tier_to_heal(self.stormservice, self.tiers, self.topology, opted_in_only=True)


@dataclass(frozen=True)
class HealMemory:
    """Per replica: the back-off after a refused eviction. Say-once. When the service is next worth a look."""

    next_try: Mapping[str, float] = field(default_factory=dict)
    backoff: Mapping[str, float] = field(default_factory=dict)
    said: Mapping[str, str] = field(default_factory=dict)  # "replica/kind" -> the message said
    quiet_until: float = float("-inf")  # no move under way and nowhere to go: no reading before this

    def refused(self, replica: str, now: float) -> HealMemory:
        """An eviction of `replica` was refused: wait, twice as long as last time."""
        wait = min(BACKOFF_MAX, 2 * self.backoff[replica]) if replica in self.backoff else BACKOFF
        return replace(self, next_try={**self.next_try, replica: now + wait}, backoff={**self.backoff, replica: wait})


@dataclass(frozen=True)
class Verdict:
    """What healing makes of one replica: wide or not, and if wide whether it moves now, and why not."""

    replica: str
    span: str  # where it is: "s4, tier 2"
    why: Why | None  # None: within its request (or not judged: `blocked` says why)
    target: DomainFit | None = None  # the domain with room, lowest tier first, most free GPUs first
    blocked: str = ""  # why it does not move now ("" when it does, or is within its request)
    block: Block | None = None

    @property
    def moves(self) -> bool:
        return self.why is not None and self.target is not None and not self.blocked


@dataclass(frozen=True)
class Settled:
    """A move that finished: its replica bound and ready again, or given up."""

    replica: str
    unavailable: float | None  # seconds from the move to all pods ready again; None: it did not come back in time
    landed: bool  # within its tier


@dataclass(frozen=True)
class HealPlan:
    verdicts: tuple[Verdict, ...] = ()
    writes: tuple[Write, ...] = ()  # Events, the records, the PodGroups held or let go, then the evictions
    memory: HealMemory = HealMemory()
    moving: Verdict | None = None
    settled: tuple[Settled, ...] = ()
    one_at_a_time: bool = False  # evictions one after another (a PodDisruptionBudget covers a pod), else together


def may_need_healing(stormservice: Mapping[str, Any], tiers: ClusterTiers, topology: Topology) -> bool:
    """Whether a StormService is worth a healing pass, from what the index holds (no API read): it opted
    in with a valid request, and its placement record shows a replica above its tier, or a move of
    one of its replicas has not settled yet."""
    tier = tier_to_heal(stormservice, tiers, topology, opted_in_only=True)
    if tier is None:
        return False
    if any(not move.get("done") for move in recorded_moves(stormservice).values()):
        return True
    return any(
        not isinstance(r.get("tier"), int) or r["tier"] > tier for r in annotation_table(stormservice, PLACEMENT_ANNOTATION).values()
    )


def tier_to_heal(stormservice: Mapping[str, Any], tiers: ClusterTiers, topology: Topology, opted_in_only: bool) -> int | None:
    """The tier a replica of this service must be within, if healing applies to it at all."""
    if opted_in_only and not wants_healing(stormservice):
        return None
    request = valid_request(stormservice, tiers)
    if request is None or request.scope is not Scope.ROLESET:
        return None
    return allowed_tier(request, topology)  # None: soft with no tier, any placement is within it


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
    last, retry = _seconds(move.get("at")), _seconds(move.get("retryAt"))
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
    priority = replica_priority(roleset.get("spec") or {}, dict(tiers.priority_values))
    return Resident(namespace, str(stormservice["metadata"]["name"]), name, replica.gpus_by_node(), tuple(replica.wanted()), tier, priority)


def set_aside(
    free: Mapping[str, int],
    topology: Topology,
    stormservice: Mapping[str, Any],
    rolesets: Sequence[Mapping[str, Any]],
    placed_since: Mapping[str, int],
) -> dict[str, int]:
    """Free GPUs with room set aside for this service's replicas that are moving and not yet placed:
    their pods are evicted and pending, so nothing of theirs reads as used, but their target is taken.
    Without this, a second service's replica, planned in the same pass or the next, would be moved into
    the same room, and one of the two would wait, held, for nothing. `placed_since`: per replica, its
    pods bound since its move began. Each pod is set aside on the target's node with the least room
    that holds it, as the packing check would place it."""
    out = dict(free)
    spec_of = {str(r["metadata"]["name"]): r.get("spec") or {} for r in rolesets}
    for replica, move in recorded_moves(stormservice).items():
        target = move.get("to")
        if move.get("done") or not isinstance(target, str) or target not in topology.switches or replica not in spec_of:
            continue
        wanted = sorted(replica_pods(spec_of[replica]), reverse=True)[placed_since.get(replica, 0) :]
        nodes = [n for n in topology.nodes_under(target) if n in out]
        for gpus in wanted:
            fitting = [n for n in nodes if out[n] >= gpus]
            if fitting:
                node = min(fitting, key=lambda n: (out[n], n))
                out[node] -= gpus
    return out


def placed_since(pods: Sequence[Mapping[str, Any]], stormservice: Mapping[str, Any], replica: str) -> int:
    """Pods of a moving replica bound since its move began (set_aside's `placed_since`)."""
    at = str((recorded_moves(stormservice).get(replica) or {}).get("at") or "")
    return sum(
        1
        for p in pods
        if (p.get("spec") or {}).get("nodeName")
        and not (p.get("metadata") or {}).get("deletionTimestamp")
        and str((p.get("metadata") or {}).get("creationTimestamp") or "") >= at
    )


def plan_healing(snapshot: HealSnapshot, memory: HealMemory, opted_in_only: bool = True) -> HealPlan:
    """Moves under way looked after (finished, resumed, settled), then at most one replica to move now.

    `opted_in_only=False` (`stormtopo heal --dry-run`) judges a service that has not opted in as if it had."""
    request = snapshot.request
    tier = tier_to_heal(snapshot.stormservice, snapshot.tiers, snapshot.topology, opted_in_only)
    if request is None or tier is None:
        return HealPlan(memory=memory)
    moves = recorded_moves(snapshot.stormservice)
    writes: list[Write] = []
    settled: list[Settled] = []
    in_flight: list[str] = []
    for replica in snapshot.replicas:
        move = moves.get(replica.name)
        if move is None or move.get("done"):
            continue
        outcome = _settled(snapshot, replica, move, tier)
        if outcome is None:
            in_flight.append(replica.name)
            writes += _resume(snapshot, replica, move)
            continue
        settled.append(outcome)
        cooldown = _cooldown(move, snapshot.cooldown)
        done = {**move, "done": True, "landed": outcome.landed, "unavailableSeconds": outcome.unavailable}
        done["misses"] = 0 if outcome.landed else _misses(move) + 1
        done["cooldown"] = snapshot.cooldown if outcome.landed else min(COOLDOWN_MAX, 2 * cooldown)  # a move that did not help waits longer
        writes.append(_record(snapshot, replica.name, done))
        writes += _hold(snapshot, request, replica.name, None)  # the gang back to what its request asks
    verdicts = _verdicts(snapshot, request, tier, moves, memory, in_flight)
    room = snapshot.make_room
    says = [
        (v, _not_moved(v, request, tier, room))
        for v in verdicts
        if v.why not in (None, Why.MAKE_ROOM) and v.target is not None and v.blocked  # a donor is not wide: nothing to say
    ]
    moving = next((v for v in verdicts if v.moves), None)
    if moving is not None and moving.target is not None:
        replica = next(r for r in snapshot.replicas if r.name == moving.replica)
        record = {
            "at": _timestamp(snapshot.now),
            "from": moving.span,
            "to": moving.target.switch.name,
            "toTier": moving.target.switch.tier,
            "reason": str(moving.why),
            "pods": sorted(str(p["metadata"].get("uid", "")) for p in replica.live()),
            "cooldown": _cooldown(moves.get(moving.replica) or {}, snapshot.cooldown),
            "misses": _misses(moves.get(moving.replica) or {}),  # moves in a row that did not land, before this one
        }
        if moving.why is Why.MAKE_ROOM and snapshot.make_room is not None:
            record["for"] = snapshot.make_room.wide
            record["left"] = domain_left(snapshot.topology, replica.nodes(), tier)
        says.append((moving, Say("Normal", "ReplicaMoving", _moving(moving, request, tier, replica, snapshot.make_room))))
        writes.append(_record(snapshot, moving.replica, record))
        writes += _hold(snapshot, request, moving.replica, moving.target.switch.tier)
        writes += _evictions(snapshot, replica.live())
    said_writes, memory = _say_once(memory, snapshot.stormservice, says)
    if not in_flight and moving is None and any(v.block is Block.NO_ROOM for v in verdicts):
        memory = replace(memory, quiet_until=snapshot.now + snapshot.recheck)
    return HealPlan(verdicts, tuple(said_writes + writes), memory, moving, tuple(settled), _one_at_a_time(snapshot, writes))


def _one_at_a_time(snapshot: HealSnapshot, writes: Sequence[Write]) -> bool:
    """Whether the evictions go one after another: when a PodDisruptionBudget covers one of the pods.
    Together, Volcano cannot place a re-created pod while an old one still runs; but evictions under one
    budget conflict on its status (the API server retries each after 500 ms, and a refusal midway would
    leave the others evicted)."""
    evicted = {w.name for w in writes if isinstance(w, EvictPod)}
    pods = [p for r in snapshot.replicas for p in r.pods if p["metadata"]["name"] in evicted]
    return any(_selects(budget, pod) for budget in snapshot.budgets for pod in pods)


def plan_refused(
    snapshot: HealSnapshot, plan: HealPlan, pod: str, message: str, memory: HealMemory, evicted: int = 0
) -> tuple[list[Write], HealMemory]:
    """The API server refused to evict `pod` of the moving replica (a PodDisruptionBudget changed since
    it was read): the move is over and recorded so (the others need not wait for its deadline), said
    as a Warning, and the replica backs off. With no pod evicted yet it never moved: its cool-down
    stays as it was and the back-off alone decides when it is tried again."""
    assert plan.moving is not None
    replica = plan.moving.replica
    memory = memory.refused(replica, snapshot.now)
    before = recorded_moves(snapshot.stormservice).get(replica) or {}
    base: Mapping[str, Any] = (
        next((w.record for w in plan.writes if isinstance(w, RecordMove) and w.replica == replica), {}) if evicted else before
    )
    record = {**base, "done": True, "refused": message[:300], "retryAt": _timestamp(memory.next_try[replica])}
    say = Say("Warning", "ReplicaNotMoved", f"replica {replica} is not moved: the eviction of pod {pod} was refused: {message[:300]}")
    writes: list[Write] = [PostEvent(snapshot.stormservice, say), _record(snapshot, replica, record)]
    return writes + _hold(snapshot, snapshot.request, replica, None), memory


def _verdicts(
    snapshot: HealSnapshot,
    request: TopologyRequest,
    tier: int,
    moves: Mapping[str, Mapping[str, Any]],
    memory: HealMemory,
    in_flight: Sequence[str],
) -> tuple[Verdict, ...]:
    """Every replica judged, the cheap reasons not to move first. The packing search runs for wide
    replicas free to move until one has a domain to go to (at most ROOM_SEARCHES a pass), and for the
    first blocked one, so that why it waits is said only where it has somewhere to go."""
    out = []
    chosen: str | None = None
    searches = 0
    said_for_blocked = False
    for replica in snapshot.replicas:
        verdict = _verdict(snapshot, request, tier, replica, moves, memory, in_flight)
        if verdict.why is not None and verdict.block is None:
            if chosen is not None:
                verdict = replace(verdict, blocked=f"one replica moves at a time: {chosen} first", block=Block.NEXT)
            elif searches >= ROOM_SEARCHES:
                verdict = replace(verdict, blocked="not checked for room in this pass", block=Block.UNCHECKED)
            elif verdict.why is Why.MAKE_ROOM:
                chosen = replica.name
            else:
                searches += 1
                target = _room(snapshot, replica, tier, elsewhere=verdict.why is Why.STRANDED)
                if target is not None:
                    chosen = replica.name
                    verdict = replace(verdict, target=target)
                else:
                    verdict = replace(
                        verdict, blocked=f"no domain within tier {tier} has room for the whole replica now", block=Block.NO_ROOM
                    )
        elif verdict.why is not None and verdict.block is not Block.MOVING and not said_for_blocked:
            said_for_blocked = True
            verdict = replace(verdict, target=_room(snapshot, replica, tier, elsewhere=verdict.why is Why.STRANDED))
        out.append(verdict)
    return tuple(out)


def _verdict(
    snapshot: HealSnapshot,
    request: TopologyRequest,
    tier: int,
    replica: Replica,
    moves: Mapping[str, Mapping[str, Any]],
    memory: HealMemory,
    in_flight: Sequence[str],
) -> Verdict:
    if replica.name in in_flight:
        return Verdict(replica.name, "moving", None, blocked="its move is under way", block=Block.MOVING)
    if not replica.complete():
        since = replica.pending_since()
        if request.mode is Mode.HARD and since is not None and snapshot.now - since >= snapshot.stranded_after:
            span = snapshot.topology.span(replica.nodes())
            where = f"{span.hypernode}, tier {span.tier}" if span.hypernode else "no common HyperNode"
            blocked, block = _blocked(snapshot, replica, moves, memory, in_flight, stranded=True)
            return Verdict(replica.name, where, Why.STRANDED, None, blocked, block)
        return Verdict(replica.name, "incomplete", None, blocked="not every pod is bound (or one is on its way out)")
    nodes = replica.nodes()
    unknown = [n for n in nodes if n not in snapshot.topology.nodes]
    if unknown:  # a node no HyperNode lists (yet): nothing shows it is wide
        return Verdict(replica.name, "unknown", None, blocked=f"node {unknown[0]} is in no HyperNode")
    span = snapshot.topology.span(nodes)
    where = f"{span.hypernode}, tier {span.tier}" if span.hypernode else "no common HyperNode"
    if span.tier is not None and span.tier <= tier:
        if snapshot.make_room is not None and snapshot.make_room.replica == replica.name:
            return _making_room(snapshot, replica, tier, where, moves, memory, in_flight)
        return Verdict(replica.name, where, None)
    why = Why.VIOLATION if request.mode is Mode.HARD else Why.SOFT_WIDE
    blocked, block = _blocked(snapshot, replica, moves, memory, in_flight)
    return Verdict(replica.name, where, why, None, blocked, block)


def _making_room(
    snapshot: HealSnapshot,
    replica: Replica,
    tier: int,
    where: str,
    moves: Mapping[str, Mapping[str, Any]],
    memory: HealMemory,
    in_flight: Sequence[str],
) -> Verdict:
    """A replica within its tier that the shell chose to make room: it moves, under every rule a wide
    one moves under, only if its service lends room (lends_room, for another service than itself), the
    lender keeps max(1, replicas - 1) ready replicas (lender_budget), it is ready, and Volcano would
    place it in another domain of its tier, read again now."""
    meta = snapshot.stormservice["metadata"]
    wide = _WIDE_REPLICA.fullmatch(snapshot.make_room.wide) if snapshot.make_room is not None else None
    own = wide is not None and (wide.group(1), wide.group(2)) == (str(meta.get("namespace", "")), str(meta["name"]))
    why = "a service makes no room for its own replicas" if own else not_lending(snapshot.stormservice)
    if why:
        return Verdict(replica.name, where, Why.MAKE_ROOM, None, why, Block.NO_ROOM)
    blocked, block = _blocked(snapshot, replica, moves, memory, in_flight, lending=True)
    target = placed_elsewhere(
        snapshot.topology, room_for(snapshot, replica), snapshot.allocatable, replica.wanted(), tier, replica.gpus_by_node()
    )
    if not blocked and not replica.ready():
        blocked, block = "not every pod is ready", Block.NO_ROOM
    elif not blocked and target is None:
        blocked, block = "Volcano might place it back where it is now", Block.NO_ROOM
    return Verdict(replica.name, where, Why.MAKE_ROOM, target, blocked, block)


def room_of(free: Mapping[str, int], nodes: Mapping[str, NodeFacts] | None, replica: Replica) -> Mapping[str, int]:
    """The free GPUs of the nodes the replica's pods could run on (their taints, selectors, affinity and
    every other resource they request: core/node_fit.py), as Volcano's predicates would leave them.
    `nodes` None: not read, every node counts."""
    if nodes is None:
        return free
    specs = [without_pins(p.get("spec") or {}) for p in replica.live()]
    eligible = nodes_for(specs, nodes, replica.requests_by_node())
    return {node: gpus for node, gpus in free.items() if node in eligible}


def room_for(snapshot: HealSnapshot, replica: Replica) -> Mapping[str, int]:
    return room_of(snapshot.free, snapshot.nodes, replica)


def domain_left(topology: Topology, nodes: Sequence[str], tier: int) -> str | None:
    """The domain of `tier` that holds `nodes` (a replica within its tier): what a move to make room leaves."""
    if not nodes or nodes[0] not in topology.nodes:
        return None
    at = [s for s in topology.ancestors(nodes[0]) if topology.switches[s].tier == tier]
    return at[0] if at and all(n in topology.nodes_under(at[0]) for n in nodes) else None


def _room(snapshot: HealSnapshot, replica: Replica, tier: int, elsewhere: bool = False) -> DomainFit | None:
    """The best domain within `tier` that holds the whole replica now, counting what it holds itself
    as free (it leaves those nodes when it moves); lowest tier first. `elsewhere` (a stranded replica):
    not a domain with its running pods in it, where it is stuck already."""
    free = freed(room_for(snapshot, replica), replica.gpus_by_node())
    stuck_on = set(replica.nodes()) if elsewhere else set()
    for t in range(1, tier + 1):
        domains = domains_at_tier(snapshot.topology, free, replica.wanted(), t)  # those that fit first
        domains = [d for d in domains if not stuck_on & set(snapshot.topology.nodes_under(d.switch.name))]
        if domains and domains[0].fits:
            return domains[0]
    return None


def plan_stranded(snapshot: HealSnapshot, memory: HealMemory) -> tuple[list[Write], HealMemory]:
    """A service that does not ask for healing: a Warning (once) for each replica stranded (see
    Why.STRANDED) where another domain within its tier holds it whole, saying where; nothing moves."""
    request = snapshot.request
    tier = tier_to_heal(snapshot.stormservice, snapshot.tiers, snapshot.topology, opted_in_only=False)
    if request is None or tier is None or request.mode is not Mode.HARD:
        return [], memory
    says = []
    for replica in snapshot.replicas:
        since = replica.pending_since()
        if since is None or snapshot.now - since < snapshot.stranded_after:
            continue
        target = _room(snapshot, replica, tier, elsewhere=True)
        if target is None:
            continue
        span = snapshot.topology.span(replica.nodes())
        where = f"{span.hypernode}, tier {span.tier}" if span.hypernode else "no common HyperNode"
        verdict = Verdict(replica.name, where, Why.STRANDED, target)
        message = (
            f"replica {replica.name} is stranded: a pod of it has waited since {_timestamp(since)} in {where}, which cannot "
            f"hold it (Volcano keeps a gang with a running pod in its domain); {target.switch.name} (tier {target.switch.tier}) "
            f'holds the whole replica now. With {HEAL_ANNOTATION}: "true" stormtopo moves it there, whole'
        )
        says.append((verdict, Say("Warning", "ReplicaStranded", message)))
    writes, memory = _say_once(memory, snapshot.stormservice, says)
    return writes, memory


def _blocked(
    snapshot: HealSnapshot,
    replica: Replica,
    moves: Mapping[str, Mapping[str, Any]],
    memory: HealMemory,
    in_flight: Sequence[str],
    lending: bool = False,
    stranded: bool = False,
) -> tuple[str, Block | None]:
    """Why a wide replica (or, `lending`, a replica ordered to make room) does not move now, cheapest
    check first; ("", None) when it may."""
    if in_flight:
        return f"replica {in_flight[0]} is moving; one replica of a StormService moves at a time", Block.MOVING
    if snapshot.moving_elsewhere >= snapshot.max_moving:
        return (
            f"{snapshot.moving_elsewhere} replicas of other StormServices are moving; "
            f"at most {snapshot.max_moving} move at once in the cluster",
            Block.CLUSTER_CAP,
        )
    move = moves.get(replica.name) or {}
    misses = _misses(move) if (move.get("reason") == Why.STRANDED) == stranded else 0  # per kind: wide or stranded
    if misses >= GIVE_UP_AFTER:
        return (
            f"its last {misses} moves did not land within its tier (Volcano placed it wide again each time); "
            "stormtopo does not move it again (a rollout's new replicas start afresh)",
            Block.GAVE_UP,
        )
    last = _seconds(move.get("at"))
    cooldown = _cooldown(move, snapshot.cooldown)
    if last is not None and snapshot.now - last < cooldown:
        # Timestamps, not "n s ago": the message stays the same from pass to pass, and is said once.
        return f"it moved at {_timestamp(last)}; its cool-down of {cooldown:.0f} s ends at {_timestamp(last + cooldown)}", Block.COOLDOWN
    retry = max(memory.next_try.get(replica.name, float("-inf")), _seconds(move.get("retryAt")) or float("-inf"))
    if snapshot.now < retry:
        return f"an eviction was refused; trying again at {_timestamp(retry)}", Block.BACKOFF
    rollout = rollout_under_way(snapshot.stormservice, [r.roleset for r in snapshot.replicas])
    if rollout:
        return f"a rollout is under way ({rollout}); no replica moves until AIBrix has finished it", Block.ROLLOUT
    replicas, budget = lender_budget(snapshot.stormservice) if lending else replica_budget(snapshot.stormservice)
    ready_others = sum(1 for r in snapshot.replicas if r.name != replica.name and r.ready())
    if ready_others < replicas - budget and not stranded:  # a stranded replica serves nothing now: moving it costs none
        why = "max(1, replicas - 1) when it lends room" if lending else f"maxUnavailable {budget}"
        return (
            f"{ready_others} other replicas are ready and the service keeps at least {replicas - budget} of {replicas} ({why})",
            Block.BUDGET,
        )
    return _disruption_budgets(snapshot.budgets, replica.live())


def _disruption_budgets(budgets: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]]) -> tuple[str, Block | None]:
    """Whether evicting `pods` at once is within every PodDisruptionBudget, as the Eviction API counts:
    a pod under more than one budget is refused outright, a budget not yet observed by its controller
    refuses every eviction, and each budget must allow as many disruptions as it covers pods."""
    for pod in pods:
        covering = [b["metadata"]["name"] for b in budgets if _selects(b, pod)]
        if len(covering) > 1:
            return (
                f"pod {pod['metadata']['name']} is covered by PodDisruptionBudgets {', '.join(sorted(covering))}: "
                "the Eviction API refuses a pod under more than one",
                Block.DISRUPTION_BUDGET,
            )
    for pdb in budgets:
        covered = [p for p in pods if _selects(pdb, p)]
        if not covered:
            continue
        status = pdb.get("status") or {}
        name = pdb["metadata"]["name"]
        if int(status.get("observedGeneration") or 0) < int((pdb.get("metadata") or {}).get("generation") or 0):
            return (
                f"PodDisruptionBudget {name} is not yet observed by its controller, and refuses every eviction until it is",
                Block.DISRUPTION_BUDGET,
            )
        allowed = int(status.get("disruptionsAllowed") or 0)
        if allowed < len(covered):
            return (
                f"PodDisruptionBudget {name} allows {allowed} disruptions and moving the replica evicts {len(covered)} of its pods",
                Block.DISRUPTION_BUDGET,
            )
    return "", None


def rollout_under_way(stormservice: Mapping[str, Any], rolesets: Sequence[Mapping[str, Any]] = ()) -> str:
    """What shows AIBrix rolling the StormService out, "" if nothing does: a spec it has not observed
    yet; RoleSets of two revisions (status.currentRevision, which AIBrix v0.7.0 sets to updateRevision
    once no RoleSet of the old one is left); or a RoleSet labelled with another revision than the one
    it updates to (an in-place update relabels every RoleSet at once; a third revision while the second
    rolls out). A move meanwhile would take a replica down beside the ones the rollout replaces, beyond
    what either budget counts. Not updatedReplicas: it dips whenever a pod is re-created, a move's own
    included. A paused service (spec.paused) rolls nothing out: only an unobserved spec counts."""
    status = stormservice.get("status") or {}
    generation = int((stormservice.get("metadata") or {}).get("generation") or 0)
    if int(status.get("observedGeneration") or 0) < generation:
        return f"generation {generation} not yet observed"
    if (stormservice.get("spec") or {}).get("paused"):
        return ""
    current, update = status.get("currentRevision"), status.get("updateRevision")
    if current and update and current != update:
        return f"revision {current} to {update}"
    for roleset in rolesets:
        meta = roleset.get("metadata") or {}
        revision = (meta.get("labels") or {}).get(REVISION_LABEL)
        if update and revision and revision != update:
            return f"RoleSet {meta.get('name')} of revision {revision}, updating to {update}"
    return ""


def replica_budget(stormservice: Mapping[str, Any]) -> tuple[int, int]:
    """The service's replicas and how many may be unavailable, as AIBrix resolves its update strategy's
    maxSurge and maxUnavailable (pkg/controller/stormservice/utils.go, ResolveFenceposts): both default
    to 0, a percentage rounds (maxSurge up, maxUnavailable down), and if both come to 0, one may be
    unavailable. A value AIBrix refuses (a string without %, a fraction) leaves none unavailable."""
    spec = stormservice.get("spec") or {}
    replicas = spec.get("replicas", 1)
    replicas = replicas if isinstance(replicas, int) and not isinstance(replicas, bool) and replicas >= 0 else 1
    strategy = spec.get("updateStrategy") or {}
    surge = _scaled(strategy.get("maxSurge"), replicas, round_up=True)
    unavailable = _scaled(strategy.get("maxUnavailable"), replicas, round_up=False)
    if surge is None or unavailable is None:
        return replicas, 0
    if surge == 0 and unavailable == 0:
        unavailable = 1
    return replicas, min(unavailable, replicas)


_PERCENT = re.compile(r"([0-9]+)%")


def _scaled(value: object, total: int, round_up: bool) -> int | None:
    """intstr.GetScaledValueFromIntOrPercent: an int as it is, "<int>%" of `total`; None if refused."""
    if value is None:
        return 0
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    found = _PERCENT.fullmatch(value) if isinstance(value, str) else None
    if found is None:
        return None
    share = int(found.group(1)) * total / 100
    return math.ceil(share) if round_up else math.floor(share)


def _selects(pdb: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    """Whether a PodDisruptionBudget covers the pod: policy/v1, an empty selector selects every pod of
    its namespace; one Kubernetes would refuse selects none."""
    selector = (pdb.get("spec") or {}).get("selector")
    if selector is None:
        return False
    requirements = label_requirements(selector)
    if requirements is None:
        return False
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return all(r.matches(labels) for r in requirements)


def _settled(snapshot: HealSnapshot, replica: Replica, move: Mapping[str, Any], tier: int) -> Settled | None:
    """A move settles once the replica is ready again on pods other than those it had (by uid: no two
    clocks compared); or, still not bound HOLD seconds after the move, the hold on its gang is let go
    (it is placed wherever there is room, as before); or at the deadline."""
    at = _seconds(move.get("at"))
    if at is None:
        return Settled(replica.name, None, False)
    old = set(move.get("pods") or ())
    fresh = bool(replica.live()) and not any(str(p["metadata"].get("uid", "")) in old for p in replica.live())
    if replica.ready() and fresh:
        ready_at = [t for p in replica.bound() if (t := _ready_since(p)) is not None]
        span = snapshot.topology.span(replica.nodes())
        landed = span.tier is not None and span.tier <= tier
        left = move.get("left")
        if landed and isinstance(left, str) and left in snapshot.topology.switches:  # made room: it must not be back
            landed = not set(replica.nodes()) & set(snapshot.topology.nodes_under(left))
        return Settled(replica.name, max(0.0, max(ready_at) - at) if ready_at else None, landed)
    if snapshot.now - at > MOVE_DEADLINE or (snapshot.now - at > HOLD and not replica.complete() and fresh):
        return Settled(replica.name, None, False)
    return None


def _resume(snapshot: HealSnapshot, replica: Replica, move: Mapping[str, Any]) -> list[Write]:
    """A move cut short (the API server unreachable, the operator restarted between two evictions):
    its pods from before the move that still run are evicted too, within the budgets, or the gang is
    placed around them, back where it was."""
    old = set(move.get("pods") or ())
    left = [p for p in replica.live() if str(p["metadata"].get("uid", "")) in old and not p["metadata"].get("deletionTimestamp")]
    if not left or _disruption_budgets(snapshot.budgets, left)[1] is not None:
        return []
    return _evictions(snapshot, left)


def _evictions(snapshot: HealSnapshot, pods: Sequence[Mapping[str, Any]]) -> list[Write]:
    namespace = snapshot.stormservice["metadata"].get("namespace", "")
    ordered = sorted(pods, key=lambda p: p["metadata"]["name"])
    return [EvictPod(namespace, p["metadata"]["name"], str(p["metadata"].get("uid") or "")) for p in ordered]


def _hold(snapshot: HealSnapshot, request: TopologyRequest | None, replica: str, tier: int | None) -> list[Write]:
    """The replica's PodGroup held hard within `tier` while it moves (None: as its request asks). The
    reconciler writes the same once it sees the move record; written here first, so that no session of
    Volcano between the evictions and that event places the gang soft."""
    podgroup = snapshot.podgroups.get(replica)
    roleset = next((r.roleset for r in snapshot.replicas if r.name == replica), None)
    if podgroup is None or roleset is None or request is None:
        return []
    ops = set_spec_fields(
        podgroup.get("spec"), desired_fields(request, roleset.get("spec") or {}, tier, dict(snapshot.tiers.priority_values))
    )
    namespace = snapshot.stormservice["metadata"].get("namespace", "")
    return [PatchPodGroup(namespace, podgroup["metadata"]["name"], ops)] if ops else []


def _misses(move: Mapping[str, Any]) -> int:
    value = move.get("misses")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _cooldown(move: Mapping[str, Any], default: float) -> float:
    value = move.get("cooldown")
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value > 0 else default


def _record(snapshot: HealSnapshot, replica: str, record: Mapping[str, object]) -> RecordMove:
    meta = snapshot.stormservice["metadata"]
    return RecordMove(
        meta.get("namespace", ""),
        meta["name"],
        replica,
        record,
        tuple(r.name for r in snapshot.replicas),
        meta.get("resourceVersion"),
    )


def _moving(verdict: Verdict, request: TopologyRequest, tier: int, replica: Replica, make_room: MakeRoom | None) -> str:
    assert verdict.target is not None
    target = verdict.target
    return (
        f"replica {verdict.replica} moves from {verdict.span} to {target.switch.name} (tier {target.switch.tier}): "
        f"{_because(verdict, request, tier, make_room)}; {target.switch.name} has {target.free_gpus} free GPUs for its "
        f"{len(replica.wanted())} pods ({sum(replica.wanted())} GPUs). Its pods are evicted and placed again as one gang"
    )


def _not_moved(verdict: Verdict, request: TopologyRequest, tier: int, make_room: MakeRoom | None) -> Say:
    kind = "Warning" if verdict.block in (Block.DISRUPTION_BUDGET, Block.BACKOFF, Block.GAVE_UP) else "Normal"
    return Say(
        kind,
        "ReplicaNotMoved",
        f"replica {verdict.replica} spans {verdict.span} and is not moved: "
        f"{verdict.blocked} ({_because(verdict, request, tier, make_room)})",
    )


def _because(verdict: Verdict, request: TopologyRequest, tier: int, make_room: MakeRoom | None = None) -> str:
    if verdict.why is Why.MAKE_ROOM and make_room is not None:
        return f"it makes room in {make_room.frees} for {make_room.wide}, which no domain within its tier holds now"
    if verdict.why is Why.VIOLATION:
        return f"it violates its hard request ({request.describe()})"
    if verdict.why is Why.STRANDED:
        return (
            f"a pod of it has waited in {verdict.span} since its other pods ran there, which cannot hold it, and "
            f"Volcano keeps a gang with a running pod in its domain ({request.describe()})"
        )
    return f"it landed above tier {tier} ({request.describe()})"


def _say_once(memory: HealMemory, about: Mapping[str, Any], says: Sequence[tuple[Verdict, Say]]) -> tuple[list[Write], HealMemory]:
    """Why a replica is not moved is said once per kind of reason (the check repeats every pass, and
    the numbers in the message change); a move, every time."""
    out: list[Write] = []
    said = dict(memory.said)
    for verdict, say in says:
        key = f"{verdict.replica}/{say.reason}"
        kind = str(verdict.block or "")
        if say.reason != "ReplicaMoving" and said.get(key) == kind:
            continue
        said[key] = kind
        out.append(PostEvent(about, say))
    return out, replace(memory, said=said)


def _is_ready(pod: Mapping[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in (pod.get("status") or {}).get("conditions") or [])


def _ready_since(pod: Mapping[str, Any]) -> float | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready" and c.get("status") == "True":
            return _seconds(c.get("lastTransitionTime"))
    return None


def _timestamp(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _seconds(text: object) -> float | None:
    return recorded_seconds(text)


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return (obj.get("metadata") or {}).get("annotations") or {}
