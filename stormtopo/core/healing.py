"""Healing a placement, as one decision per StormService: which replica, if any, moves into one domain now.

A replica that landed wider than its request (a soft replica above its tier, a hard one in violation)
stays there for the rest of its life unless something moves it. With `stormtopo.io/heal: "true"` on
its StormService, stormtopo evicts the whole replica, through the Eviction API, once its own packing
check finds a domain within the tier that holds the whole replica now; AIBrix re-creates the pods and
Volcano places them again as one gang. Evicting every pod, not one, matters: a gang with a running pod
is placed around it, back into the old domain.

Safe by construction, as the descheduler is: one replica of a service moving at a time; never below
the service's replicas minus its budget (AIBrix's maxUnavailable, resolved as AIBrix resolves it);
every PodDisruptionBudget checked before the first eviction (and enforced by the Eviction API); a
cool-down per replica, recorded on the StormService so a restarted operator keeps it; a back-off
after a refused eviction.
"""

from __future__ import annotations

import datetime
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from stormtopo.core.explanation import allowed_tier
from stormtopo.core.gang import gpus_per_pod, replica_pods
from stormtopo.core.packing import DomainFit, domains_at_tier
from stormtopo.core.placement import is_live
from stormtopo.core.request import ClusterTiers, Mode, Scope, TopologyRequest, valid_request
from stormtopo.core.topology.selectors import label_requirements
from stormtopo.core.topology.tree import Topology
from stormtopo.core.vocabulary import HEAL_ANNOTATION, MOVES_ANNOTATION, PLACEMENT_ANNOTATION, ROLE_LABEL
from stormtopo.core.writes import EvictPod, PostEvent, RecordMove, Say, Write

COOLDOWN = 900.0  # seconds: a replica is not moved again within this of its last move
MOVE_DEADLINE = 600.0  # seconds: a move not settled by then (its pods never ready again) no longer holds the others back
BACKOFF = 30.0  # seconds after a refused eviction before the replica is tried again; doubled per refusal
BACKOFF_MAX = 1800.0


class Why(StrEnum):
    """Why a replica moves: the metric's label and the Event's words."""

    SOFT_WIDE = "soft-above-tier"
    VIOLATION = "hard-violation"


def wants_healing(stormservice: Mapping[str, Any]) -> bool:
    return str(_annotations(stormservice).get(HEAL_ANNOTATION, "")).strip().lower() == "true"


@dataclass(frozen=True)
class Replica:
    """One RoleSet and every live or terminating pod carrying its label, as read from the API."""

    roleset: Mapping[str, Any]
    pods: tuple[Mapping[str, Any], ...]

    @property
    def name(self) -> str:
        return str(self.roleset["metadata"]["name"])

    def live(self) -> list[Mapping[str, Any]]:
        return [p for p in self.pods if is_live(p)]

    def bound(self) -> list[Mapping[str, Any]]:
        return [p for p in self.live() if (p.get("spec") or {}).get("nodeName")]

    def wanted(self) -> list[int]:
        return replica_pods(self.roleset.get("spec") or {})

    def complete(self) -> bool:
        """Every pod it should have is bound, and none is on its way out (a finished pod left behind, say
        one the kubelet evicted, is neither)."""
        terminating = any((p.get("metadata") or {}).get("deletionTimestamp") for p in self.pods)
        return len(self.bound()) >= len(self.wanted()) and not terminating

    def ready(self) -> bool:
        return self.complete() and all(_is_ready(p) for p in self.bound())

    def nodes(self) -> list[str]:
        return sorted(p["spec"]["nodeName"] for p in self.bound())

    def gpus_by_node(self) -> dict[str, int]:
        """What its bound pods hold per node: free again once it moves."""
        per_role = gpus_per_pod(self.roleset.get("spec") or {})
        held: dict[str, int] = {}
        for pod in self.bound():
            role = ((pod.get("metadata") or {}).get("labels") or {}).get(ROLE_LABEL, "")
            held[pod["spec"]["nodeName"]] = held.get(pod["spec"]["nodeName"], 0) + per_role.get(role, 0)
        return held


@dataclass(frozen=True)
class HealSnapshot:
    """A StormService that may heal, read now: its replicas with all their pods, every node's free GPUs,
    and the PodDisruptionBudgets of its namespace."""

    stormservice: Mapping[str, Any]
    replicas: tuple[Replica, ...]
    tiers: ClusterTiers
    topology: Topology
    free: Mapping[str, int]  # free GPUs per node, counting every bound pod of the cluster
    budgets: tuple[Mapping[str, Any], ...] = ()
    now: float = 0.0  # wall-clock seconds (the cool-down is recorded on the StormService, across restarts)
    cooldown: float = COOLDOWN

    @property
    def request(self) -> TopologyRequest | None:
        return valid_request(self.stormservice, self.tiers)


@dataclass(frozen=True)
class HealMemory:
    """Per replica: no attempt before (after a refused eviction), and the back-off it is on. Say-once."""

    next_try: Mapping[str, float] = field(default_factory=dict)
    backoff: Mapping[str, float] = field(default_factory=dict)
    said: Mapping[str, str] = field(default_factory=dict)

    def refused(self, replica: str, now: float) -> HealMemory:
        """An eviction of `replica` was refused: wait, twice as long as last time."""
        wait = min(BACKOFF_MAX, 2 * self.backoff[replica]) if replica in self.backoff else BACKOFF
        return replace(self, next_try={**self.next_try, replica: now + wait}, backoff={**self.backoff, replica: wait})


@dataclass(frozen=True)
class Verdict:
    """What healing makes of one replica: wide or not, and if wide whether it moves now, and why not."""

    replica: str
    span: str  # where it is: "s4, tier 2"
    why: Why | None  # None: within its request
    target: DomainFit | None = None  # the domain with room, lowest tier first, most free GPUs first
    blocked: str = ""  # why it does not move now ("" when it does, or is within its request)

    @property
    def moves(self) -> bool:
        return self.why is not None and self.target is not None and not self.blocked


@dataclass(frozen=True)
class Settled:
    """A move that finished: its replica bound and ready again (or the deadline passed)."""

    replica: str
    unavailable: float | None  # seconds from the move to all pods ready again; None: it did not come back in time


@dataclass(frozen=True)
class HealPlan:
    verdicts: tuple[Verdict, ...] = ()
    writes: tuple[Write, ...] = ()  # Events, the move's record, then the evictions
    memory: HealMemory = HealMemory()
    moving: Verdict | None = None
    settled: tuple[Settled, ...] = ()


def may_need_healing(stormservice: Mapping[str, Any], tiers: ClusterTiers, topology: Topology) -> bool:
    """Whether a StormService is worth a healing pass, from what the index holds (no API read): it opted
    in with a valid request, and its placement record shows a replica above its tier, or a move of
    one of its replicas has not settled yet."""
    if not wants_healing(stormservice):
        return False
    request = valid_request(stormservice, tiers)
    if request is None or request.scope is not Scope.ROLESET:
        return False
    tier = allowed_tier(request, topology)
    if tier is None:
        return False
    if any(not move.get("done") for move in recorded_moves(stormservice).values()):
        return True
    return any(not isinstance(r.get("tier"), int) or r["tier"] > tier for r in _table(stormservice, PLACEMENT_ANNOTATION).values())


def plan_refused(snapshot: HealSnapshot, plan: HealPlan, pod: str, message: str, memory: HealMemory) -> tuple[list[Write], HealMemory]:
    """The API server refused to evict `pod` of the moving replica (its PodDisruptionBudget, checked
    moments ago, changed): the move is over and recorded so (the others need not wait for its deadline),
    said as a Warning, and the replica backs off."""
    assert plan.moving is not None
    replica = plan.moving.replica
    moves = recorded_moves(snapshot.stormservice)
    live = [r.name for r in snapshot.replicas]
    record = {**(moves.get(replica) or {}), "at": _timestamp(snapshot.now), "done": True, "refused": message[:300]}
    say = Say("Warning", "ReplicaNotMoved", f"replica {replica} is not moved: the eviction of pod {pod} was refused: {message[:300]}")
    return [PostEvent(snapshot.stormservice, say), _record(snapshot, replica, record, live)], memory.refused(replica, snapshot.now)


def plan_healing(snapshot: HealSnapshot, memory: HealMemory, opted_in_only: bool = True) -> HealPlan:
    """At most one replica of the StormService to move now, and the records of moves that settled.

    `opted_in_only=False` (`stormtopo heal --dry-run`) judges a service that has not opted in as if it had."""
    request = snapshot.request
    if (opted_in_only and not wants_healing(snapshot.stormservice)) or request is None or request.scope is not Scope.ROLESET:
        return HealPlan(memory=memory)
    tier = allowed_tier(request, snapshot.topology)
    if tier is None:  # soft with no tier: any placement is within it
        return HealPlan(memory=memory)
    moves = recorded_moves(snapshot.stormservice)
    live = [r.name for r in snapshot.replicas]
    writes: list[Write] = []
    settled = []
    in_flight = []
    for replica in snapshot.replicas:
        move = moves.get(replica.name)
        if move is None or move.get("done"):
            continue
        outcome = _settled(replica, move, snapshot.now)
        if outcome is None:
            in_flight.append(replica.name)
            continue
        settled.append(outcome)
        writes.append(_record(snapshot, replica.name, {**move, "done": True, "unavailableSeconds": outcome.unavailable}, live))
    verdicts = tuple(_verdict(snapshot, request, tier, replica, moves, memory, in_flight) for replica in snapshot.replicas)
    says: list[tuple[str, Say]] = []  # (replica, what to say of it)
    for verdict in verdicts:
        if verdict.why is not None and verdict.target is not None and verdict.blocked:
            kind = "Warning" if _is_refusal(verdict.blocked) else "Normal"
            says.append((verdict.replica, Say(kind, "ReplicaNotMoved", _not_moved(verdict, request, tier))))
    moving = next((v for v in verdicts if v.moves), None)
    if moving is not None:
        replica = next(r for r in snapshot.replicas if r.name == moving.replica)
        says.append((moving.replica, Say("Normal", "ReplicaMoving", _moving(moving, request, tier, replica))))
        record = {
            "at": _timestamp(snapshot.now),
            "from": moving.span,
            "to": moving.target.switch.name if moving.target else "",
            "reason": str(moving.why),
        }
        writes.append(_record(snapshot, moving.replica, record, live))
        namespace = snapshot.stormservice["metadata"].get("namespace", "")
        writes += [EvictPod(namespace, p["metadata"]["name"]) for p in sorted(replica.live(), key=lambda p: p["metadata"]["name"])]
    said_writes, memory = _say_once(memory, snapshot.stormservice, says)
    return HealPlan(verdicts, tuple(said_writes + writes), memory, moving, tuple(settled))


def _verdict(
    snapshot: HealSnapshot,
    request: TopologyRequest,
    tier: int,
    replica: Replica,
    moves: Mapping[str, Mapping[str, Any]],
    memory: HealMemory,
    in_flight: Sequence[str],
) -> Verdict:
    if not replica.complete():
        return Verdict(replica.name, "not all bound", None)
    span = snapshot.topology.span(replica.nodes())
    where = f"{span.hypernode}, tier {span.tier}" if span.hypernode else "no common HyperNode"
    if span.tier is not None and span.tier <= tier:
        return Verdict(replica.name, where, None)
    why = Why.VIOLATION if request.mode is Mode.HARD else Why.SOFT_WIDE
    target = _room(snapshot, replica, tier)
    if target is None:
        return Verdict(replica.name, where, why, None, f"no domain within tier {tier} has room for the whole replica now")
    blocked = _blocked(snapshot, replica, moves, memory, in_flight)
    return Verdict(replica.name, where, why, target, blocked)


def _room(snapshot: HealSnapshot, replica: Replica, tier: int) -> DomainFit | None:
    """The best domain within `tier` that holds the whole replica now, counting what it holds itself
    as free (it leaves those nodes when it moves); lowest tier first."""
    free = dict(snapshot.free)
    for node, gpus in replica.gpus_by_node().items():
        free[node] = free.get(node, 0) + gpus
    for t in range(1, tier + 1):
        domains = domains_at_tier(snapshot.topology, free, replica.wanted(), t)
        if domains and domains[0].fits:
            return domains[0]
    return None


def _blocked(
    snapshot: HealSnapshot,
    replica: Replica,
    moves: Mapping[str, Mapping[str, Any]],
    memory: HealMemory,
    in_flight: Sequence[str],
) -> str:
    """Why a wide replica with a domain to go to does not move now; "" when it may."""
    if in_flight:
        return f"replica {in_flight[0]} is moving; one replica of a StormService moves at a time"
    last = _seconds((moves.get(replica.name) or {}).get("at"))
    if last is not None and snapshot.now - last < snapshot.cooldown:
        # Timestamps, not "n s ago": the message stays the same from pass to pass, and is said once.
        return f"it moved at {_timestamp(last)}; the cool-down of {snapshot.cooldown:.0f} s ends at {_timestamp(last + snapshot.cooldown)}"
    if snapshot.now < memory.next_try.get(replica.name, float("-inf")):
        return f"an eviction was refused; trying again at {_timestamp(memory.next_try[replica.name])}"
    replicas, budget = replica_budget(snapshot.stormservice)
    ready_others = sum(1 for r in snapshot.replicas if r.name != replica.name and r.ready())
    if ready_others < replicas - budget:
        return (
            f"{ready_others} other replicas are ready and the service keeps at least {replicas - budget} "
            f"of {replicas} (maxUnavailable {budget})"
        )
    for pdb in snapshot.budgets:
        covered = [p for p in replica.live() if _selects(pdb, p)]
        if not covered:
            continue
        allowed = int(((pdb.get("status") or {}).get("disruptionsAllowed")) or 0)
        if allowed < len(covered):
            name = pdb["metadata"]["name"]
            return f"PodDisruptionBudget {name} allows {allowed} disruptions and moving the replica evicts {len(covered)} of its pods"
    return ""


def _is_refusal(blocked: str) -> bool:
    return blocked.startswith("PodDisruptionBudget") or blocked.startswith("an eviction")


def replica_budget(stormservice: Mapping[str, Any]) -> tuple[int, int]:
    """The service's replicas and how many may be unavailable, as AIBrix resolves its update strategy's
    maxSurge and maxUnavailable (pkg/controller/stormservice/utils.go, ResolveFenceposts): both default
    to 0, a percentage of maxUnavailable rounds down, and if both come to 0, one may be unavailable."""
    spec = stormservice.get("spec") or {}
    replicas = _scaled(spec.get("replicas", 1), 0, round_up=False)
    strategy = spec.get("updateStrategy") or {}
    surge = _scaled(strategy.get("maxSurge"), replicas, round_up=True)
    unavailable = _scaled(strategy.get("maxUnavailable"), replicas, round_up=False)
    if surge == 0 and unavailable == 0:
        unavailable = 1
    return replicas, min(unavailable, replicas)


def _scaled(value: object, total: int, round_up: bool) -> int:
    if value is None:
        return 0
    text = str(value).strip()
    if text.endswith("%"):
        try:
            share = float(text[:-1]) * total / 100
        except ValueError:
            return 0
        return math.ceil(share) if round_up else math.floor(share)
    try:
        return int(text)
    except ValueError:
        return 0


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


def _settled(replica: Replica, move: Mapping[str, Any], now: float) -> Settled | None:
    """A move settles once the replica is ready again on pods created since, or at its deadline."""
    at = _seconds(move.get("at"))
    if at is None:
        return Settled(replica.name, None)
    fresh = all((_seconds((p.get("metadata") or {}).get("creationTimestamp")) or 0) >= math.floor(at) for p in replica.live())
    if replica.ready() and fresh:
        ready_at = [t for p in replica.bound() if (t := _ready_since(p)) is not None]
        return Settled(replica.name, max(0.0, max(ready_at) - at) if ready_at else None)
    if now - at > MOVE_DEADLINE:
        return Settled(replica.name, None)
    return None


def recorded_moves(stormservice: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The last move of each replica, from the StormService's moves annotation (unreadable: none)."""
    return _table(stormservice, MOVES_ANNOTATION)


def _table(stormservice: Mapping[str, Any], annotation: str) -> dict[str, Mapping[str, Any]]:
    """A per-replica table stormtopo keeps in an annotation of the StormService (unreadable: empty)."""
    try:
        table = json.loads(_annotations(stormservice).get(annotation) or "{}")
    except ValueError:
        return {}
    if not isinstance(table, dict):
        return {}
    return {str(k): v for k, v in table.items() if isinstance(v, dict)}


def _record(snapshot: HealSnapshot, replica: str, record: Mapping[str, object], live: Sequence[str]) -> RecordMove:
    meta = snapshot.stormservice["metadata"]
    return RecordMove(meta.get("namespace", ""), meta["name"], replica, record, tuple(live))


def _moving(verdict: Verdict, request: TopologyRequest, tier: int, replica: Replica) -> str:
    assert verdict.target is not None
    target = verdict.target
    return (
        f"replica {verdict.replica} moves from {verdict.span} to {target.switch.name} (tier {target.switch.tier}): "
        f"{_because(verdict, request, tier)}; {target.switch.name} has {target.free_gpus} free GPUs for its "
        f"{len(replica.wanted())} pods ({sum(replica.wanted())} GPUs). Its pods are evicted and placed again as one gang"
    )


def _not_moved(verdict: Verdict, request: TopologyRequest, tier: int) -> str:
    return f"replica {verdict.replica} spans {verdict.span} and is not moved: {verdict.blocked} ({_because(verdict, request, tier)})"


def _because(verdict: Verdict, request: TopologyRequest, tier: int) -> str:
    if verdict.why is Why.VIOLATION:
        return f"it violates its hard request ({request.describe()})"
    return f"it landed above tier {tier} ({request.describe()})"


def _say_once(memory: HealMemory, about: Mapping[str, Any], says: Sequence[tuple[str, Say]]) -> tuple[list[Write], HealMemory]:
    """Why a replica is not moved is said once per message (the check repeats every pass); a move,
    every time."""
    out: list[Write] = []
    said = dict(memory.said)
    for replica, say in says:
        key = f"{say.reason}/{replica}"
        if say.reason != "ReplicaMoving" and said.get(key) == say.message:
            continue
        said[key] = say.message
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
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return (obj.get("metadata") or {}).get("annotations") or {}
