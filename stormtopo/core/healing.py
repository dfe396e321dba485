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
to make room for another service's only if its own service lends room (core/lending.py).

Here the planner itself: moves under way looked after, every replica judged, at most one moved. What
it reads and returns: core/heal_snapshot.py, core/heal_plan.py; the budgets: core/disruption.py; the
cluster's moves under way: core/cluster_moves.py; where a replica may go: core/heal_target.py; what
it says: core/heal_events.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from stormtopo.core.cooldown import COOLDOWN_MAX, GIVE_UP_AFTER, _cooldown, _misses
from stormtopo.core.disruption import _disruption_budgets, _selects, lender_budget, replica_budget, rollout_under_way
from stormtopo.core.heal_events import _moving, _not_moved, _say_once
from stormtopo.core.heal_plan import HealMemory, HealPlan, Settled
from stormtopo.core.heal_request import tier_to_heal
from stormtopo.core.heal_snapshot import HealSnapshot
from stormtopo.core.heal_target import _room, domain_left, room_for
from stormtopo.core.jsonpatch import set_spec_fields
from stormtopo.core.lending import not_lending
from stormtopo.core.moves import HOLD, MOVE_RECORD_VERSION, asks_healing, recorded_moves, recorded_seconds, recorded_time, request_topology
from stormtopo.core.moves import MOVE_DEADLINE as MOVE_DEADLINE  # the hold's deadline too (core/moves.py); the shell's import
from stormtopo.core.podgroup import desired_fields
from stormtopo.core.replica_pods import Replica
from stormtopo.core.request import Mode, TopologyRequest
from stormtopo.core.room import placed_elsewhere
from stormtopo.core.verdict import Block, Verdict, Why
from stormtopo.core.vocabulary import HEAL_ANNOTATION
from stormtopo.core.writes import EvictPod, PatchPodGroup, PostEvent, RecordMove, Say, Write

ROOM_SEARCHES = 4  # packing searches per service and pass (each up to ~20 ms; they run on the operator's loop)


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
            "v": MOVE_RECORD_VERSION,
            "at": recorded_time(snapshot.now),
            "from": moving.span,
            "to": moving.target.switch.name,
            "toTier": moving.target.switch.tier,
            "reason": str(moving.why),
            "pods": sorted(str(p["metadata"].get("uid", "")) for p in replica.live()),
            "cooldown": _cooldown(moves.get(moving.replica) or {}, snapshot.cooldown),
            "misses": _misses(moves.get(moving.replica) or {}),  # moves in a row that did not land, before this one
            # What its PodGroup asks once the hold ends, should the service's request turn invalid meanwhile.
            "request": request_topology(request),
        }
        if moving.why is Why.MAKE_ROOM and snapshot.make_room is not None:
            record["for"] = snapshot.make_room.wide.record()
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
    record = {**base, "done": True, "refused": message[:300], "retryAt": recorded_time(memory.next_try[replica])}
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
    wide = snapshot.make_room.wide if snapshot.make_room is not None else None
    own = wide is not None and (wide.namespace, wide.stormservice) == (str(meta.get("namespace", "")), str(meta["name"]))
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


def plan_stranded(snapshot: HealSnapshot, memory: HealMemory) -> tuple[list[Write], HealMemory]:
    """A service that does not ask for healing: a Warning (once) for each replica stranded (see
    Why.STRANDED) where another domain within its tier holds it whole, saying where; nothing moves."""
    request = snapshot.request
    tier = tier_to_heal(snapshot.stormservice, snapshot.tiers, snapshot.topology, opted_in_only=False)
    if request is None or tier is None or request.mode is not Mode.HARD:
        return [], memory
    # A service here that asks for healing is one stormtopo may not move (core/movable.py): say so, not "set heal".
    then = (
        "It is not moved: healing stays off for this StormService, as its InvalidHealAnnotation Warning says"
        if asks_healing(snapshot.stormservice)
        else f'With {HEAL_ANNOTATION}: "true" stormtopo moves it there, whole'
    )
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
            f"replica {replica.name} is stranded: a pod of it has waited since {recorded_time(since)} in {where}, which cannot "
            f"hold it (Volcano keeps a gang with a running pod in its domain); {target.switch.name} (tier {target.switch.tier}) "
            f"holds the whole replica now. {then}"
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
        ends = recorded_time(last + cooldown)
        return f"it moved at {recorded_time(last)}; its cool-down of {cooldown:.0f} s ends at {ends}", Block.COOLDOWN
    retry = max(memory.next_try.get(replica.name, float("-inf")), _seconds(move.get("retryAt")) or float("-inf"))
    if snapshot.now < retry:
        return f"an eviction was refused; trying again at {recorded_time(retry)}", Block.BACKOFF
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


def _ready_since(pod: Mapping[str, Any]) -> float | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready" and c.get("status") == "True":
            return _seconds(c.get("lastTransitionTime"))
    return None


def _seconds(text: object) -> float | None:
    return recorded_seconds(text)
