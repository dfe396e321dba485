"""A replica's placement path as one decision: from what is known of the replica now (a snapshot) and
what was said and checked of it before (its memory) to what to write, what to say and when to look again.

It runs for every change of a replica's pods or PodGroup, for as long as the replica lives: pods held at
stormtopo's gate are released into their anchors' domain, a bound replica is recorded and its pods get
domain labels, a hard replica beyond its tier is a violation, and a Pending hard gang is explained, at
doubling intervals while the explanation stays the same. `stormtopo explain` reads the same state.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from stormtopo.core.explanation import Pending, allowed_tier, is_explainable
from stormtopo.core.gang import followers, gang_of, replica_pods
from stormtopo.core.moves import moving_tier
from stormtopo.core.node_fit import without_pins
from stormtopo.core.ownership import roleset_name, stormservice_name
from stormtopo.core.placement import EMPTY_TOPOLOGY, is_held, is_held_for_room, is_live, plan_placed, plan_release, recorded_placement
from stormtopo.core.podgroup import service_group_name
from stormtopo.core.preempting import HOLD_MAX, HeldReplica, RoomHold, RoomPlan, RoomReading, plan_room, queue_of
from stormtopo.core.priority import known_replica_priority
from stormtopo.core.replica_pods import Replica
from stormtopo.core.request import ClusterTiers, Mode, Scope, TopologyRequest, is_opted_in, valid_request
from stormtopo.core.spread import SPREAD_GIVE_UP, SpreadMemory, kept_out_left_behind, plan_spread, shared_domain, spread_tier
from stormtopo.core.topology.tree import Topology
from stormtopo.core.victims import Fewest
from stormtopo.core.vocabulary import ADMITTED_LABEL, GROUP_NAME_ANNOTATION, PLACEMENT_ANNOTATION, ROLE_LABEL, TASK_SPEC_ANNOTATION
from stormtopo.core.writes import AdoptPod, DeleteUnboundPod, PostEvent, RecordPlacement, Say, Write

# Seconds between two capacity checks of one pending gang; doubled while its explanation stays the
# same (a gang pending for an hour is explained about every EXPLAIN_INTERVAL_MAX, not 360 times).
EXPLAIN_INTERVAL = 10.0
EXPLAIN_INTERVAL_MAX = 160.0


@dataclass(frozen=True)
class KnownNodes:
    """The cluster's nodes as last handed to the index (operator/room.py watches them): each node's hostname label."""

    hostnames: Mapping[str, str] = field(default_factory=dict)  # node -> its kubernetes.io/hostname label ("" if none)
    fresh: bool = False  # read moments ago: a node missing from it is not in the cluster
    shapes_tree: bool = False  # HyperNodes select nodes by pattern or label: the tree is only as current as this reading

    def stale_for(self, nodes: Iterable[str]) -> bool:
        """Whether the tree may not know these nodes yet (a node added since the last reading)."""
        return self.shapes_tree and not self.fresh and any(n not in self.hostnames for n in nodes)


@dataclass(frozen=True)
class ReplicaSnapshot:
    """One replica as the operator sees it now. `pods` are its pods as known: those stormtopo admitted,
    or every pod carrying its RoleSet's label when they were read from the API (pods created before
    the StormService opted in were never admitted). `topology` is built from every node of the cluster."""

    roleset: Mapping[str, Any]
    stormservice: Mapping[str, Any]
    pods: tuple[Mapping[str, Any], ...]
    podgroup: Mapping[str, Any] | None
    tiers: ClusterTiers
    topology: Topology
    nodes: KnownNodes = KnownNodes()
    live_replicas: tuple[str, ...] = ()  # names of the StormService's RoleSets (the placement record keeps only these)
    all_pods: bool = False  # `pods` were read from the API: every pod of the replica, admitted or not
    now: float = 0.0  # monotonic seconds, for the back-off
    # With a spread tier (core/spread.py): the StormService's other replicas, the leader's memory of those
    # let go and not yet placed (replica -> since, monotonic), and every node's free GPUs once asked for.
    siblings: tuple[Replica, ...] = ()
    settling: Mapping[str, float] = field(default_factory=dict)
    free_gpus: Mapping[str, int] | None = None
    unspread: frozenset[str] = frozenset()  # replicas held again after a spread that did not place (the leader's memory)
    spread_give_up: float = SPREAD_GIVE_UP  # seconds a replica let go with domains kept out may stay unplaced (--spread-give-up)
    # With exact preemption (core/preempting.py): whether it is on, the free-room reading once asked for,
    # how long a replica may be held at the room gate, and the wall clock (pods' creation is dated by it).
    exact_preemption: bool = False
    narrowing: bool = False  # soft replicas that must preempt are narrowed first (core/narrowing.py)
    room: RoomReading | None = None
    room_hold: float = HOLD_MAX
    exact_fewest: Fewest = Fewest.PODS  # what its victims minimise first (--exact-preemption-fewest)
    wall: float = 0.0

    @property
    def key(self) -> tuple[str, str]:
        meta = self.roleset["metadata"]
        return meta.get("namespace", ""), meta["name"]

    @property
    def request(self) -> TopologyRequest | None:
        return valid_request(self.stormservice, self.tiers)

    def live_pods(self) -> list[Mapping[str, Any]]:
        """Its pods that hold or will hold a node, and that belong to its own StormService: a pod of
        another service that carries this RoleSet's name is no anchor of its domain."""
        service = self.stormservice["metadata"]["name"]
        replica = self.roleset["metadata"]["name"]
        return [p for p in self.pods if is_live(p) and roleset_name(p) == replica and stormservice_name(p) in (None, service)]


@dataclass(frozen=True)
class ReplicaMemory:
    """What was said and checked of one replica before: say-once, and the explanation back-off."""

    said: Mapping[str, str] = field(default_factory=dict)  # reason -> message last said
    next_check: float = 0.0  # monotonic seconds: no capacity check before
    interval: float = EXPLAIN_INTERVAL
    unsatisfiable: bool = False  # counted in the pending-gangs gauge
    recorded: Mapping[str, object] | None = None  # the record last written, until the StormService's event shows it
    pods_read_at: float = float("-inf")  # when every pod of the replica was last read from the API (monotonic)
    room: RoomHold | None = None  # held at the room gate (core/preempting.py)


@dataclass(frozen=True)
class Explain:
    """Ask the explanation worker why this hard gang is Pending (it reads every node's free GPUs)."""

    request: TopologyRequest
    pods: tuple[int, ...]  # GPUs of each pod of the gang
    created: int
    priority: int | None = None  # the gang's, as Volcano ranks it (its PodGroup's class); None: not known yet


@dataclass(frozen=True)
class FirstPlacement:
    """A replica recorded for the first time: what the placement metrics observe."""

    tier: int | None
    seconds: float | None


@dataclass(frozen=True)
class ReplicaPlan:
    writes: tuple[Write, ...] = ()  # in order: releases, domain labels, then the record
    says: tuple[Say, ...] = ()  # Events on the StormService, each said once
    memory: ReplicaMemory = ReplicaMemory()
    explain: Explain | None = None
    first: FirstPlacement | None = None
    violations: int = 0  # TopologyViolated Warnings newly said
    needs_all_pods: bool = False  # pods are held and their anchors are not all known: read every pod and plan again
    needs_nodes: bool = False  # a bound pod is on a node the last reading did not have: read the nodes and plan again
    needs_room: bool = False  # a spread release needs every node's free GPUs: read them and plan again
    needs_groups: frozenset[str] = frozenset()  # a held replica's victims' gangs: read their PodGroups and plan again
    settling: Mapping[str, float] | None = None  # with a spread tier: the StormService's replicas let go, to remember
    unspread: frozenset[str] | None = None  # with a spread tier: the StormService's replicas held again, to remember
    spread_over: SpreadMemory = field(default_factory=SpreadMemory)  # the spread memory the plan was made over
    wake: tuple[str, ...] = ()  # sibling replicas held for the spread: plan them again (this one took its domain)
    recheck_in: float | None = None  # seconds until a sibling no longer holds this replica back: plan it again then

    def all_writes(self, stormservice: Mapping[str, Any]) -> tuple[Write, ...]:
        """Everything to carry out, in order: the Events on the StormService, then the writes."""
        return tuple(PostEvent(stormservice, say) for say in self.says) + self.writes

    def memory_before_writes(self, kept: ReplicaMemory) -> ReplicaMemory:
        """The replica's memory to keep before the writes: what was said stays said even if a write fails,
        but the placement record as it was until it is written (a failed one is written again next time);
        after the writes, `memory` whole."""
        return replace(self.memory, recorded=kept.recorded)

    def spread_memory(self, kept: SpreadMemory) -> SpreadMemory | None:
        """The StormService's spread memory after this plan, kept now as `kept`: what the plan says, and what
        other workers kept since the plan was made (a sibling let go meanwhile stays let go: the shell may
        keep this after awaits); None: the plan says nothing of the spread."""
        if self.settling is None and self.unspread is None:
            return None
        over = self.spread_over
        settling = dict(self.settling if self.settling is not None else over.settling)
        settling |= {r: t for r, t in kept.settling.items() if r not in over.settling and r not in settling}
        unspread = (self.unspread if self.unspread is not None else over.unspread) | (kept.unspread - over.unspread)
        return SpreadMemory(settling, unspread)

    @property
    def spread_kept_first(self) -> bool:
        """When the shell keeps the spread memory: before the writes, so that two workers never let two
        siblings go together; but for a replica held again, only once its pods are deleted (after the
        writes), so that a delete that failed is planned again."""
        return not any(isinstance(w, DeleteUnboundPod) for w in self.writes)


@dataclass(frozen=True)
class ReplicaState:
    """Where a replica stands, as `stormtopo explain` prints it and the planner decides from it."""

    wanted: tuple[int, ...]  # GPUs of every pod it should have
    created: int  # its live pods
    bound: tuple[Mapping[str, Any], ...]
    held: tuple[Mapping[str, Any], ...]

    @property
    def complete(self) -> bool:
        return len(self.bound) >= len(self.wanted)


def replica_state(snapshot: ReplicaSnapshot) -> ReplicaState:
    pods = snapshot.live_pods()
    return ReplicaState(
        tuple(replica_pods(snapshot.roleset.get("spec") or {})),
        len(pods),
        tuple(p for p in pods if (p.get("spec") or {}).get("nodeName")),
        tuple(p for p in pods if is_held(p)),
    )


def gang_name(stormservice: Mapping[str, Any], roleset: Mapping[str, Any], request: TopologyRequest | None) -> str:
    """The PodGroup a replica's pods join: the StormService's own with scope StormService, else the replica's."""
    if request is not None and request.scope is Scope.STORMSERVICE:
        return service_group_name(stormservice["metadata"]["name"])
    return str(roleset["metadata"]["name"])


def is_unschedulable(podgroup: Mapping[str, Any] | None) -> bool:
    """Volcano says the gang cannot be placed now (while pending or in queue)."""
    status = (podgroup or {}).get("status") or {}
    if status.get("phase") not in (None, "Pending", "Inqueue"):
        return False
    return any(c.get("type") == "Unschedulable" and c.get("status") == "True" for c in status.get("conditions") or [])


def plan_replica(snapshot: ReplicaSnapshot, memory: ReplicaMemory) -> ReplicaPlan:
    """Everything the placement path decides for one replica, but the explanation itself (which needs
    every node's free GPUs: see `plan_explained`)."""
    state = replica_state(snapshot)
    if snapshot.nodes.stale_for(p["spec"]["nodeName"] for p in state.bound):
        return ReplicaPlan(memory=memory, needs_nodes=True)  # never release into, or judge by, a tree that lacks a node
    if _has_unadmitted_pods(snapshot, state, memory):
        return ReplicaPlan(memory=memory, needs_all_pods=True)
    writes: list[Write] = list(_adoptions(snapshot))
    request = snapshot.request
    replica = Replica(snapshot.roleset, tuple(snapshot.live_pods()))
    spreading = spread_tier(request, snapshot.topology) is not None
    spread = None
    if is_opted_in(snapshot.stormservice["metadata"].get("annotations") or {}):
        spread = plan_spread(
            request,
            snapshot.topology,
            replica,
            snapshot.siblings,
            snapshot.settling,
            snapshot.now,
            snapshot.free_gpus,
            snapshot.nodes.hostnames,
            is_unschedulable(snapshot.podgroup),
            snapshot.unspread,
            snapshot.spread_give_up,
        )
        if spread.needs_room:
            return ReplicaPlan(memory=memory, needs_room=True)
        writes += spread.writes
        writes += spread.held_again  # and said only once its pods are deleted:
        writes += tuple(PostEvent(snapshot.stormservice, say) for say in spread.says)
    writes += kept_out_left_behind(request, snapshot.topology, replica)  # a spread no longer asked for leaves nothing behind
    let_go = {w.name for w in spread.writes} if spread else set()
    held = tuple(p for p in state.held if p["metadata"]["name"] not in let_go)  # (the rest: routers, released below)
    if held:
        release = _release(snapshot, replace(state, held=held))
        if release is None:
            return ReplicaPlan(memory=memory, needs_all_pods=True)
        writes += release
    room = _room(snapshot, state, memory)
    if room.needs_room or room.needs_groups:
        return ReplicaPlan(memory=memory, needs_room=room.needs_room, needs_groups=room.needs_groups)
    writes += room.writes
    writes += tuple(PostEvent(snapshot.stormservice, say) for say in room.says)
    memory = replace(memory, room=room.hold)
    spread_fields: dict[str, Any] = {}
    if spreading and spread is not None:
        spread_fields = {"settling": spread.settling, "recheck_in": spread.recheck_in, "unspread": spread.unspread}
        spread_fields["spread_over"] = SpreadMemory(snapshot.settling, snapshot.unspread)
        if replica.placed(request):  # its domain is taken now: a sibling held for the spread may go
            spread_fields["wake"] = tuple(s.name for s in snapshot.siblings if any(is_held(p) for p in s.members(request)))
    if room.recheck_in is not None and not spreading:
        spread_fields["recheck_in"] = room.recheck_in  # the hold's limit: plan again then
    if request is None:  # opted out, or invalid: nothing to explain, so not counted as unsatisfiable
        return ReplicaPlan(tuple(writes), memory=replace(memory, unsatisfiable=False), **spread_fields)
    says: list[Say] = []
    first = None
    violations = 0
    if state.bound:
        placed = plan_placed(snapshot.topology, request, allowed_tier(request, snapshot.topology), snapshot.key[1], state.bound)
        assert placed is not None  # something is bound
        recorded = recorded_placement(_annotation(snapshot.stormservice, PLACEMENT_ANNOTATION), snapshot.key[1]) or memory.recorded
        for say in placed.says:
            if say.reason == "ReplicaPlaced" and (not state.complete or recorded == placed.record):
                continue  # said once the whole replica is bound, and not again after a restart
            said, memory = _say_once(memory, say)
            if said:
                says.append(say)
                violations += say.reason == "TopologyViolated"
        writes += placed.labels  # so a router can pair prefill and decode within a domain
        if state.complete and recorded != placed.record:
            shared = shared_domain(request, snapshot.topology, snapshot.key[1], replica.bound_nodes(request), snapshot.siblings)
            if shared is not None:
                said, memory = _say_once(memory, shared)
                if said:
                    says.append(shared)
            namespace, name = snapshot.stormservice["metadata"].get("namespace", ""), snapshot.stormservice["metadata"]["name"]
            writes.append(RecordPlacement(namespace, name, snapshot.key[1], placed.record, snapshot.live_replicas))
            memory = replace(memory, recorded=placed.record)
            if recorded is None:
                tier = placed.record["tier"]
                first = FirstPlacement(tier if isinstance(tier, int) else None, placement_seconds(state.bound))
    for pod_name, say in _unplaceable_followers(snapshot, request):
        said, memory = _say_once(memory, say, pod_name)
        if said:
            says.append(say)
    plan = ReplicaPlan(tuple(writes), tuple(says), memory, first=first, violations=violations, **spread_fields)
    if state.complete:
        return replace(plan, memory=replace(plan.memory, unsatisfiable=False))
    if spreading and any(is_held(p) for p in replica.members(request)):
        return plan  # held for the spread: Volcano has not tried it yet, there is nothing to explain
    if is_unschedulable(snapshot.podgroup) and snapshot.now >= memory.next_check and is_explainable(request, state.wanted, state.created):
        # Checked again in EXPLAIN_INTERVAL at the latest: the explanation may stretch that.
        checked = replace(plan.memory, next_check=snapshot.now + EXPLAIN_INTERVAL)
        priority = known_replica_priority(snapshot.roleset.get("spec") or {}, dict(snapshot.tiers.priority_values))
        return replace(plan, memory=checked, explain=Explain(request, state.wanted, state.created, priority))
    return plan


def plan_explained(
    key: tuple[str, str], request: TopologyRequest, pending: Pending | None, memory: ReplicaMemory, now: float
) -> ReplicaPlan:
    """What to say of a Pending hard gang once the worker explained it. Said once per message; while the
    explanation stays the same the next check waits twice as long, up to EXPLAIN_INTERVAL_MAX."""
    if pending is None:
        return ReplicaPlan(memory=memory)
    if pending.explanation.fits:  # room again: Volcano binds it at its next session
        return ReplicaPlan(memory=replace(memory, unsatisfiable=False, interval=EXPLAIN_INTERVAL))
    message = (
        f"replica {key[1]} stays Pending: no domain within tier {pending.tier} has room for the whole gang "
        f"({request.describe()}); {pending.explanation.render()}"
    )
    said, memory = _say_once(replace(memory, unsatisfiable=True), Say("Warning", "TopologyUnsatisfiable", message))
    if said:  # something changed: the back-off starts over
        return ReplicaPlan(says=(Say("Warning", "TopologyUnsatisfiable", message),), memory=replace(memory, interval=EXPLAIN_INTERVAL))
    interval = min(2 * memory.interval, EXPLAIN_INTERVAL_MAX)  # nothing changed: look again later
    return ReplicaPlan(memory=replace(memory, next_check=now + interval, interval=interval))


def _say_once(memory: ReplicaMemory, say: Say, about: str = "") -> tuple[bool, ReplicaMemory]:
    """The same check repeats with every pod event: an Event is said once per message and replica (and
    per pod, for what is said of one pod)."""
    key = f"{say.reason}/{about}" if about else say.reason
    if memory.said.get(key) == say.message:
        return False, memory
    return True, replace(memory, said={**memory.said, key: say.message})


ADOPTION_READ_INTERVAL = 30.0  # seconds between two reads of a placed replica's pods in search of unadmitted ones


def _has_unadmitted_pods(snapshot: ReplicaSnapshot, state: ReplicaState, memory: ReplicaMemory) -> bool:
    """A placed replica (its gang Running) with fewer pods known than it has: some ran before its
    StormService opted in, so stormtopo never admitted, nor watches, them. Volcano counts them in no
    role of minTaskMember, so the gang turns invalid and no replacement pod is placed: read them."""
    if snapshot.all_pods or snapshot.request is None or state.created >= len(state.wanted):
        return False
    running = ((snapshot.podgroup or {}).get("status") or {}).get("phase") == "Running"
    return running and snapshot.now - memory.pods_read_at >= ADOPTION_READ_INTERVAL


def _adoptions(snapshot: ReplicaSnapshot) -> list[AdoptPod]:
    """Pods read from the API that stormtopo never admitted (created before the opt-in): given what
    admission would have given them, so that Volcano counts them in their role of the gang and the
    watch of admitted pods follows them from now on."""
    request = snapshot.request
    if not snapshot.all_pods or request is None:
        return []
    gang = gang_name(snapshot.stormservice, snapshot.roleset, request)
    adopted = []
    for pod in snapshot.live_pods():
        meta = pod.get("metadata") or {}
        if ADMITTED_LABEL in (meta.get("labels") or {}):
            continue
        annotations = {GROUP_NAME_ANNOTATION: gang}
        role = (meta.get("labels") or {}).get(ROLE_LABEL)
        if role:
            annotations[TASK_SPEC_ANNOTATION] = role
        adopted.append(AdoptPod(meta.get("namespace", ""), meta["name"], {ADMITTED_LABEL: "true"}, annotations))
    return adopted


def anchors_of(snapshot: ReplicaSnapshot) -> list[Mapping[str, Any]]:
    """The live pods of the roles Volcano places as the gang: the domain their nodes span is where the
    held pods go."""
    following = followers(snapshot.roleset.get("spec") or {})
    return [p for p in snapshot.live_pods() if ((p.get("metadata") or {}).get("labels") or {}).get(ROLE_LABEL) not in following]


def _release(snapshot: ReplicaSnapshot, state: ReplicaState) -> list[Write] | None:
    """Release pods held at stormtopo's gate: into their anchors' domain once those are bound (the
    request valid, or invalid and its last valid constraint kept), or at once when the StormService
    no longer asks for a topology. None: not every anchor is known (some were created before the
    StormService opted in, so stormtopo never admitted them) and every pod must be read first."""
    if not is_opted_in(snapshot.stormservice["metadata"].get("annotations") or {}):
        return list(plan_release(EMPTY_TOPOLOGY, [], 0, state.held))
    spec = snapshot.roleset.get("spec") or {}
    expected = gang_of(spec, followers(spec)).min_member
    anchors = anchors_of(snapshot)
    if len(anchors) < expected and not snapshot.all_pods:
        return None  # (anchors known but not bound yet need no read: their events will come)
    return list(plan_release(snapshot.topology, anchors, expected, state.held, snapshot.nodes.hostnames))


def _room(snapshot: ReplicaSnapshot, state: ReplicaState, memory: ReplicaMemory) -> RoomPlan:
    """Exact preemption for a replica held at the room gate (core/preempting.py)."""
    held = [p for p in snapshot.live_pods() if is_held_for_room(p)]
    if not held:
        return RoomPlan()
    request = snapshot.request if is_opted_in(snapshot.stormservice["metadata"].get("annotations") or {}) else None
    spec = snapshot.roleset.get("spec") or {}
    created = [_time((p.get("metadata") or {}).get("creationTimestamp")) for p in held]
    oldest = min((t.timestamp() for t in created if t is not None), default=snapshot.wall)
    specs = [without_pins(p.get("spec") or {}) for p in held]  # as admitted: what admission added counts
    held_for = snapshot.wall - oldest
    replica = HeldReplica(
        *snapshot.key, held, state.wanted, state.created, len(state.bound), specs, held_for, queue_of(snapshot.podgroup), snapshot.podgroup
    )
    return plan_room(
        replica,
        request,
        allowed_tier(request, snapshot.topology) if request is not None else None,
        snapshot.topology,
        snapshot.nodes.hostnames,
        preemptor_priority(spec, dict(snapshot.tiers.priority_values), held),
        snapshot.room,
        memory.room,
        snapshot.exact_preemption,
        snapshot.room_hold,
        snapshot.exact_fewest,
        dict(snapshot.tiers.priority_values),
        moving_tier(snapshot.stormservice, snapshot.key[1], snapshot.wall) is not None,
        snapshot.narrowing,
        snapshot.wall,
    )


def preemptor_priority(roleset_spec: Mapping[str, Any], values: Mapping[str, int], held: Sequence[Mapping[str, Any]]) -> int | None:
    """The priority a held replica preempts at: its gang's (its PodGroup's class, as Volcano ranks it), but
    never above what its pods were admitted at (their own classes, which quota governs): a class named in
    the scheduling strategy alone buys no victims. None while the class's value is not read yet."""
    gang = known_replica_priority(roleset_spec, values)
    if gang is None:
        return None
    admitted = [(p.get("spec") or {}).get("priority") for p in held]
    return min([gang, *(a if isinstance(a, int) else 0 for a in admitted)])


def _unplaceable_followers(snapshot: ReplicaSnapshot, request: TopologyRequest) -> list[tuple[str, Say]]:
    """A released pod that the scheduler cannot place within its domain (no pod slots left there, a
    taint) stays Pending: say so once, with the scheduler's reason, rather than nothing."""
    following = followers(snapshot.roleset.get("spec") or {})
    if not following or request.mode is not Mode.HARD:
        return []
    says = []
    for pod in snapshot.live_pods():
        role = ((pod.get("metadata") or {}).get("labels") or {}).get(ROLE_LABEL)
        if role not in following or is_held(pod) or (pod.get("spec") or {}).get("nodeName"):
            continue
        for condition in (pod.get("status") or {}).get("conditions") or []:
            if (
                condition.get("type") == "PodScheduled"
                and condition.get("status") == "False"
                and condition.get("reason") == "Unschedulable"
            ):
                says.append(
                    (
                        pod["metadata"]["name"],
                        Say(
                            "Warning",
                            "ReleasedPodUnschedulable",
                            f"pod {pod['metadata']['name']} of replica {snapshot.key[1]} was released into its replica's domain and "
                            f"cannot be placed there: {condition.get('message') or 'no reason given'}",
                        ),
                    )
                )
    return says


def placement_seconds(pods: Sequence[Mapping[str, Any]]) -> float | None:
    """From the first pod's creation to the last pod's binding (PodScheduled), in seconds."""
    created = [t for p in pods if (t := _time((p.get("metadata") or {}).get("creationTimestamp")))]
    bound = [
        t
        for p in pods
        for c in (p.get("status") or {}).get("conditions") or []
        if c.get("type") == "PodScheduled" and c.get("status") == "True" and (t := _time(c.get("lastTransitionTime")))
    ]
    if not pods or len(created) < len(pods) or len(bound) < len(pods):
        return None
    return max(0.0, (max(bound) - min(created)).total_seconds())


def _time(text: str | None) -> datetime.datetime | None:
    return datetime.datetime.fromisoformat(text) if text else None


def _annotation(obj: Mapping[str, Any], key: str) -> str | None:
    value = ((obj.get("metadata") or {}).get("annotations") or {}).get(key)
    return str(value) if value is not None else None
