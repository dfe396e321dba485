"""Exact preemption: a replica that must preempt takes the fewest victims, and no more.

Volcano v1.15.1's gangpreempt adds victims bundle after bundle until a domain's sum of room covers the gang,
then evicts all it took: 3 to 4 times the fewest pods at the median (BENCHMARKS.md, "Preemption"). With
`--exact-preemption`, the webhook holds every pod of an opted-in replica that may preempt at the room gate
(core/admission.py), and this plan lets it go once all its pods exist:

- where a domain of its tier holds it now, at once: Volcano places it without preempting;
- where the fewest victims (core/preemption.py over the free-room reading; a victim of a gang costs its
  whole gang, every gang taken at its minimum) make room, they are evicted first and the replica is let go
  after them. With the victims releasing, Volcano's allocate pipelines the replica onto their room, so
  gangpreempt finds it no longer starving and takes nothing more (in the simulator, in every case, and in
  the victims' domain). It is not pinned there: a replica whose room another job took would wait for ever,
  where unpinned Volcano's own preemption still finds it room;
- where no domain qualifies, as it is: Volcano decides, and the Pending replica's explanation says why.

A replica is never held longer than the hold's limit from its oldest pod's creation (its pods not all
created, the class's value not read yet, a leader busy or away): then it goes as it is. One plan evicts for
a replica once. A pod being deleted is never a victim and its GPUs count as free, so a new leader finds that
room on its way instead of taking more; the leader plans held replicas one at a time and keeps the room it
took for one from the next (operator/replica.py). A replica preempts at the lower of its class's value and
its pods' own priorities (admitted from their classes, which quota governs), so naming a higher class in the
scheduling strategy buys no victims; victims are only in the namespaces the operator is given, and only on
nodes that take new pods and where the held pods could run.

Victims are jobs Volcano ranks below the replica, in the replica's own queue, as gangpreempt takes them:
a job's rank is its PodGroup's class (a pod's own priority only orders tasks within its job), and across
queues a team's share is Volcano's to judge (gangreclaim, from queues marked reclaimable), not stormtopo's.
The free-room reading knows each victim's gang but not its PodGroup, and reading every gang's PodGroup
would cost a list of every team's jobs per plan: so the plan asks for the PodGroups of the gangs it would
take (`needs_groups`), the shell reads them, and the plan runs again over what it learnt, a few rounds at
most (GROUP_ROUNDS); a gang whose PodGroup is still not known after them is left alone.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from stormtopo.core.gang import container_gpus
from stormtopo.core.moves import recorded_seconds
from stormtopo.core.narrowing import NARROWED_FOR, is_narrowed_to, narrow, narrowed_since, narrowing_held, unnarrow
from stormtopo.core.node_fit import NodeFacts, nodes_for
from stormtopo.core.packing import domains_at_tier, fits
from stormtopo.core.placement import release_into
from stormtopo.core.preemption import CLUSTER, DomainVictims, Holder, marked_preemptable, plan_preemption, rank_of
from stormtopo.core.priority import job_priority
from stormtopo.core.request import Mode, TopologyRequest
from stormtopo.core.topology.tree import Topology
from stormtopo.core.victims import Fewest, GangSize
from stormtopo.core.vocabulary import GROUP_NAME_ANNOTATION, ROOM_GATE
from stormtopo.core.writes import EvictPod, PreemptPods, Say, Victim, Write

K = TypeVar("K")  # a replica's key in the shell
HOLD_MAX = 30.0  # seconds a replica is held at the room gate at most, from its oldest pod's creation (--exact-preemption-hold)
DEFAULT_QUEUE = "default"  # Volcano's queue for a PodGroup that names none
NO_GANGPREEMPT = "Volcano's scheduler runs no gangpreempt, and its preempt skips every job with a network topology"
GROUP_ROUNDS = 4  # reads of victims' PodGroups one plan may ask for, before a gang not read is left alone
CLAIMED_RECHECK = 2.0  # seconds: a soft replica that would go anywhere while another's room is claimed looks again


@dataclass(frozen=True)
class RoomReading:
    """The free-room reading as exact preemption plans over it."""

    free: Mapping[str, int]  # free GPUs per node, those of pods being deleted included (room on its way)
    # Never preemptable while being deleted; None: not read yet (a replica that fits now is let go without it; one
    # that does not asks for it: needs_room).
    holders: Mapping[str, Sequence[Holder]] | None
    gangs: Mapping[str, GangSize]
    nodes: Mapping[str, NodeFacts] | None = None  # labels and taints: where the replica's pods could run at all
    namespaces: frozenset[str] | None = None  # where victims may be (the chart's victimNamespaces); None: anywhere
    groups: Mapping[str, VictimGroup] = field(default_factory=dict)  # gang -> its PodGroup, as read so far
    groups_read: bool = False  # no more reads: a gang whose PodGroup is not known is not taken
    gangpreempt: bool = True  # Volcano's scheduler runs gangpreempt (as its configuration reads; unread: assumed)
    # Nodes where another held replica's room or victims are claimed (RoomClaim): Volcano is making room for it there.
    claimed_elsewhere: frozenset[str] = frozenset()


@dataclass(frozen=True)
class RoomHold:
    """What the leader remembers of one held replica."""

    preempted: bool = False  # victims were evicted for it: never again for this hold
    narrowed_at: float | None = None  # wall seconds its PodGroup's narrowing was first written (core/narrowing.py)
    let_go: bool = False  # let go after narrowing was judged: a plan before its pods' events is not said again
    # The victims its narrowing counts on gangpreempt to take: kept from the next held replica's reading (narrowing_claim).
    counts_on: tuple[Victim, ...] = ()
    waited: bool = False  # it waited for room another replica's narrowing counts on: said once per hold


@dataclass(frozen=True)
class RoomPlan:
    writes: tuple[Write, ...] = ()
    says: tuple[Say, ...] = ()
    hold: RoomHold | None = None  # None: nothing held any more
    needs_room: bool = False  # the free-room reading is needed: read it and plan again
    needs_groups: frozenset[str] = frozenset()  # gangs it would take whose PodGroup is not known: read them, plan again
    recheck_in: float | None = None  # seconds until the hold's limit: plan again then


@dataclass(frozen=True)
class HeldReplica:
    """A replica with pods at the room gate, as the plan sees it."""

    namespace: str
    name: str
    held: Sequence[Mapping[str, Any]]
    wanted: Sequence[int]  # GPUs of every pod it should have
    created: int
    bound: int
    specs: Sequence[Mapping[str, Any]]  # its held pods' specs: where they could run
    held_for: float  # seconds since its oldest held pod was created
    queue: str | None = DEFAULT_QUEUE  # its PodGroup's queue; None: its PodGroup not known yet
    podgroup: Mapping[str, Any] | None = None  # its PodGroup as stored (a narrowing is written there)


def plan_room(
    replica: HeldReplica,
    request: TopologyRequest | None,
    allowed_tier: int | None,
    topology: Topology,
    hostnames: Mapping[str, str],
    priority: int | None,
    reading: RoomReading | None,
    hold: RoomHold | None,
    enabled: bool = True,
    hold_max: float = HOLD_MAX,
    fewest: Fewest = Fewest.PODS,
    values: Mapping[str, int] | None = None,
    moving: bool = False,
    narrowing: bool = False,
    wall: float = 0.0,
) -> RoomPlan:
    """For a replica with pods at the room gate: wait, let it go, or evict its fewest victims and let it go
    (`enabled`: exact preemption); or, `narrowing` alone, narrow a soft replica that must preempt and let it go
    (core/narrowing.py; `wall`: the clock its record is dated by)."""
    if not replica.held:
        return RoomPlan()
    values = values or {}
    hold = hold or RoomHold()
    let_go = RoomPlan(tuple(release_into([], hostnames, replica.held, ROOM_GATE)))
    if not enabled and not (narrowing and request is not None and request.mode is Mode.SOFT):
        return let_go  # turned off (for this mode): no pod of it waits
    if request is None or allowed_tier is None or replica.bound or hold.preempted or hold.let_go or moving:
        # Turned off; opted out or invalid; part of it placed already; its victims on their way out; or moved by
        # healing, which is voluntary: a move never costs other work its pods (it goes where room was).
        return let_go
    if replica.held_for >= hold_max:
        why = f"replica {replica.name} let go after {hold_max:.0f} s at the room gate, to Volcano's own preemption"
        return RoomPlan(let_go.writes, (Say("Normal", "ReplicaLetGo", why),))
    wait = RoomPlan(hold=hold, recheck_in=hold_max - replica.held_for)
    if replica.created < len(replica.wanted) or priority is None or replica.queue is None:
        return wait  # the gang is judged whole, at its priority, in its queue
    if reading is None:
        return RoomPlan(hold=hold, needs_room=True)
    free = reading.free  # nodes that take new pods only
    if reading.nodes is not None:  # only nodes every pod could run on (selectors, affinity, taints): GPUs elsewhere are no room
        eligible = nodes_for([placement_of(spec) for spec in replica.specs], reading.nodes)
        free = {n: g for n, g in free.items() if n in eligible}
    soft = request.mode is Mode.SOFT
    wanted = replica.wanted
    # Where it fits now, it goes at once: the cheapest check first (soft: the cluster's free GPUs together), and
    # nothing of the victims read (at 16,384 nodes that is most of a plan's time).
    if soft and fits(list(free.values()), wanted):  # (a narrowing left on its PodGroup is taken off first: soft goes across)
        undo = _undo_narrowing(replica, request, wait) if narrowing and not enabled else None
        return undo or let_go
    if any(d.fits for level in range(1, allowed_tier + 1) for d in domains_at_tier(topology, free, wanted, level)[:1]):
        return let_go
    if reading.holders is None:
        return RoomPlan(hold=hold, needs_room=True)
    # Never victims where the replica cannot go, nor of another queue or a job Volcano ranks as high (nor of a gang
    # whose PodGroup cannot be known).
    holders = {
        n: [h for h in hs if _takeable(h, replica.queue, priority, reading, values)] for n, hs in reading.holders.items() if n in free
    }
    # Ranked as Volcano ranks them: by their job's priority where their PodGroup was read (ties, the Event).
    ranked = {n: [_as_job(h, reading, values) for h in hs] for n, hs in holders.items()}
    if not enabled:  # narrowing: gangpreempt takes the victims, within one domain of the tier this finds
        within = plan_preemption(topology, free, ranked, wanted, priority, allowed_tier, reading.gangs, fewest=fewest).victims
        why = NO_GANGPREEMPT
        if within is None and reading.gangpreempt:  # why none qualifies, with every pod that is there counted
            judged = {
                n: [_judged(h, replica.queue, priority, reading, values) for h in hs] for n, hs in reading.holders.items() if n in free
            }
            why = plan_preemption(topology, free, judged, wanted, priority, allowed_tier, reading.gangs, fewest=fewest).render()
        return _narrowed(replica, request, within, why, holders, reading, replace(wait, writes=let_go.writes), wall, free)
    plan = plan_preemption(topology, free, ranked, wanted, priority, allowed_tier, reading.gangs, soft=soft, fewest=fewest)
    if plan.victims is None:
        return let_go
    v = plan.victims
    unknown = frozenset(h.gang for node, i in v.chosen if (h := holders[node][i]).gang is not None and h.gang not in reading.groups)
    if unknown:
        return RoomPlan(hold=hold, needs_groups=unknown)
    victims = tuple(Victim(node, holders[node][i].gpus, holders[node][i].priority, holders[node][i].gang) for node, i in v.chosen)
    where = "across the cluster" if v.domain == CLUSTER else f"in tier-{v.tier} {v.domain}"
    pods = ", ".join(f"{n} of priority {p}" for p, n in v.by_priority)
    fewest_of = "pods" if fewest is Fewest.PODS else "GPUs"
    taken = f"{v.pods} pod(s) holding {v.gpus} GPUs ({pods}) {where}"
    message = f"replica {replica.name} preempts {taken}, the fewest {fewest_of} that make room for it"
    namespaces = None if reading.namespaces is None else tuple(sorted(reading.namespaces))
    # Let go as it is, not pinned to the victims' domain: Volcano places it onto their room as they leave
    # (in every case of BENCHMARKS.md); pinned, a replica whose room another took would wait for ever.
    preempt = PreemptPods(replica.namespace, replica.name, victims, namespaces)
    return RoomPlan((preempt, *let_go.writes), (Say("Normal", "ReplicaPreempting", message),), RoomHold(preempted=True))


def _narrowed(
    replica: HeldReplica,
    request: TopologyRequest,
    victims: DomainVictims | None,
    why: str,
    holders: Mapping[str, Sequence[Holder]],
    reading: RoomReading,
    waiting: RoomPlan,
    wall: float,
    free: Mapping[str, int],
) -> RoomPlan:
    """A soft replica that must preempt: its PodGroup narrowed to the lowest tier where one domain's victims make
    room, then its pods let go; where none does, let go as it is (gangpreempt then takes room anywhere), and the
    Event says why (`why`: no domain qualifies, or no gangpreempt). `waiting`: the hold as it stands, with the
    writes that let the replica go; `free`: the nodes where its pods could run."""
    let_go = RoomPlan(waiting.writes)
    hold = waiting.hold or RoomHold()
    if replica.podgroup is None:
        return let_go
    if victims is None or not reading.gangpreempt:
        undo = _undo_narrowing(replica, request, waiting)  # a narrowing left on its PodGroup comes off first
        if undo is not None:
            return undo
        if reading.gangpreempt and not reading.claimed_elsewhere.isdisjoint(free):
            # Let go soft, gangpreempt would take its victims anywhere: those another replica's narrowing counts on
            # too (on the local control plane it did, and that one then waited out its narrowing). It waits until
            # that one is placed, within its hold's limit.
            claimed = len(reading.claimed_elsewhere.intersection(free))
            message = (
                f"replica {replica.name} must preempt (no room for its whole gang anywhere now) and is not narrowed: {why}; "
                f"it waits while another replica's narrowing counts on lower-priority work on {claimed} node(s) where its pods "
                f"could run (let go as it is, Volcano's gangpreempt could take that work for it), until that replica is placed, "
                f"at the latest until its hold ends; then it goes as it is"
            )
            says = () if hold.waited else (Say("Normal", "ReplicaWaitingForRoom", message),)
            recheck = min(CLAIMED_RECHECK, waiting.recheck_in or CLAIMED_RECHECK)
            return RoomPlan(says=says, hold=replace(hold, counts_on=(), waited=True), recheck_in=recheck)
        message = f"replica {replica.name} must preempt (no room for its whole gang anywhere now), but is not narrowed: {why}; let go"
        return RoomPlan(let_go.writes, (Say("Normal", "ReplicaNotNarrowed", message),), replace(hold, let_go=True, counts_on=()))
    unknown = frozenset(h.gang for node, i in victims.chosen if (h := holders[node][i]).gang is not None and h.gang not in reading.groups)
    if unknown:
        return RoomPlan(hold=hold, needs_groups=unknown)
    tier = victims.tier
    counts_on = tuple(Victim(node, (h := holders[node][i]).gpus, h.priority, h.gang) for node, i in victims.chosen)
    if not is_narrowed_to(replica.podgroup, request, tier, wall):  # narrowed first; let go once its PodGroup shows it
        at = narrowed_since(hold.narrowed_at, wall)
        narrowed = narrow(replica.namespace, replica.podgroup, request, tier, at)
        return RoomPlan((narrowed,), hold=replace(hold, narrowed_at=at, counts_on=counts_on), recheck_in=waiting.recheck_in)
    pods = ", ".join(f"{n} of priority {p}" for p, n in victims.by_priority)
    message = (
        f"replica {replica.name} must preempt (no room for its whole gang anywhere now): its PodGroup is held hard "
        f"within tier {tier} for at most {NARROWED_FOR:.0f} s, so that Volcano's gangpreempt takes its victims within "
        f"one domain of that tier, not across the cluster (the fewest are in tier-{tier} {victims.domain}: "
        f"{victims.pods} pod(s) holding {victims.gpus} GPUs, {pods}); then its request ({request.describe()}) again"
    )
    return RoomPlan(let_go.writes, (Say("Normal", "ReplicaNarrowed", message),), replace(hold, let_go=True, counts_on=counts_on))


@dataclass(frozen=True)
class VictimGroup:
    """A victim gang's PodGroup as Volcano ranks its job: its queue, its priority class ("": none named), whether
    Volcano may preempt it (`volcano.sh/preemptable`, gangpreempt's IsJobPreemptableForGangEviction), and
    whether it was made so lately that a class it names may not be read yet."""

    queue: str
    priority_class: str = ""
    preemptable: bool = True
    young: bool = False


UNREADABLE = VictimGroup("", preemptable=False)  # a PodGroup gone, or not to be read: its gang is never taken
CLASS_GRACE = 60.0  # seconds a PodGroup naming a class the operator has not read is spared (then: the default)


def group_of(podgroup: Mapping[str, Any] | None, now: float | None = None) -> VictimGroup:
    """What of a victim's PodGroup preemption judges by, read at `now` (wall seconds); UNREADABLE without one."""
    if podgroup is None:
        return UNREADABLE
    meta, spec = podgroup.get("metadata") or {}, podgroup.get("spec") or {}
    created = recorded_seconds(meta.get("creationTimestamp"))
    young = now is not None and (created is None or now - created < CLASS_GRACE)
    return VictimGroup(queue_of(podgroup) or "", str(spec.get("priorityClassName") or ""), marked_preemptable(meta), young)


def _as_job(holder: Holder, reading: RoomReading, values: Mapping[str, int]) -> Holder:
    """The holder at its job's priority, where its PodGroup was read."""
    group = reading.groups.get(holder.gang) if holder.gang is not None else None
    return replace(holder, priority=job_priority(group.priority_class, values)) if group is not None else holder


def _undo_narrowing(replica: HeldReplica, request: TopologyRequest, waiting: RoomPlan) -> RoomPlan | None:
    """Before a replica goes as its request asks: its PodGroup's narrowing taken off, where one (left by an earlier
    hold of the same RoleSet, or this one's) still holds it hard, the replica let go once its PodGroup shows it;
    None where none does (it may go now)."""
    if narrowing_held(replica.podgroup) is None or replica.podgroup is None:
        return None
    hold = replace(waiting.hold or RoomHold(), counts_on=())
    return RoomPlan((unnarrow(replica.namespace, replica.podgroup, request),), hold=hold, recheck_in=waiting.recheck_in)


def _judged(holder: Holder, queue: str, priority: int, reading: RoomReading, values: Mapping[str, int]) -> Holder:
    """A holder as the reason no domain qualifies counts it: at its job's priority; one it may not take for
    another reason than its rank (another queue, marked, not read) as a pod it does not preempt."""
    job = _as_job(holder, reading, values)
    if _takeable(holder, queue, priority, reading, values) or job.priority >= priority:
        return job
    return replace(job, preemptable=False)


def _takeable(holder: Holder, queue: str, priority: int, reading: RoomReading, values: Mapping[str, int]) -> bool:
    """A holder the replica may take as its job is ranked: in the victims' namespaces, of its queue and a lower job
    priority (its PodGroup's class, as Volcano ranks jobs), or of a gang whose PodGroup is still to be read."""
    if holder.gang is None:
        return False  # no PodGroup named: no job Volcano would preempt
    if reading.namespaces is not None and holder.namespace not in reading.namespaces:
        return False  # outside the victims' namespaces (the chart's victimNamespaces)
    group = reading.groups.get(holder.gang)
    if group is None:
        return not reading.groups_read
    if not group.preemptable or group.queue != queue:
        return False  # (UNREADABLE is never preemptable)
    if group.priority_class and group.priority_class not in values and group.young:
        return False  # a class made a moment ago, not read yet, may rank its job above the replica: spared a while
    return job_priority(group.priority_class, values) < priority  # a class that does not exist: the default


def queue_of(podgroup: Mapping[str, Any] | None) -> str | None:
    """A PodGroup's queue as Volcano reads it (none named: the default queue); None without a PodGroup."""
    if podgroup is None:
        return None
    return str((podgroup.get("spec") or {}).get("queue") or DEFAULT_QUEUE)


def placement_of(pod_spec: Mapping[str, Any]) -> Mapping[str, Any]:
    """What of a pod's spec says where it may run, its requests aside (victims free those)."""
    return {k: pod_spec[k] for k in ("nodeSelector", "affinity", "tolerations") if k in pod_spec}


def pick_victims(
    victims: Sequence[Victim], pods_on: Mapping[str, Sequence[Mapping[str, Any]]], namespaces: Collection[str] | None = None
) -> list[EvictPod]:
    """The pods to evict for the planned victims: on each victim's node, a bound pod Volcano may preempt
    with its GPUs, priority and gang, not being deleted, in one of `namespaces` (None: any), each taken
    once (the oldest first: the same choice on every replica of the operator). A victim with no such pod
    left is skipped."""
    taken: set[str] = set()
    out = []
    for victim in victims:
        candidates = sorted(
            (
                p
                for p in pods_on.get(victim.node, ())
                if _matches(p, victim)
                and p["metadata"].get("uid") not in taken
                and (namespaces is None or p["metadata"].get("namespace", "") in namespaces)
            ),
            key=lambda p: (p["metadata"].get("creationTimestamp") or "", p["metadata"].get("namespace", ""), p["metadata"]["name"]),
        )
        if candidates:
            pod = candidates[0]
            taken.add(pod["metadata"].get("uid"))
            out.append(EvictPod(pod["metadata"].get("namespace", ""), pod["metadata"]["name"], pod["metadata"].get("uid", "")))
    return out


def _matches(pod: Mapping[str, Any], victim: Victim) -> bool:
    if (pod.get("metadata") or {}).get("deletionTimestamp") or (pod.get("spec") or {}).get("nodeName") != victim.node:
        return False
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return False
    priority, preemptable = rank_of(pod)
    meta = pod.get("metadata") or {}
    group = (meta.get("annotations") or {}).get(GROUP_NAME_ANNOTATION)
    gang = f"{meta.get('namespace', '')}/{group}" if group else None
    return preemptable and priority == victim.priority and container_gpus(pod.get("spec") or {}) == victim.gpus and gang == victim.gang


@dataclass(frozen=True)
class RoomClaim:
    """The room a held replica's victims free, kept from the next held replica's reading (so that none takes
    the same victims again or counts their room as its own) until the replica is placed, gone, or past its
    hold (monotonic `until`)."""

    gpus: Mapping[str, int]  # per node
    until: float
    victims: tuple[Victim, ...] = ()  # who frees it: never a victim for the next replica either
    counting: bool = False  # a narrowing's: victims Volcano is to take (not evicted by stormtopo), as counted now


def room_claim(writes: Sequence[Write], now: float, hold: float) -> RoomClaim | None:
    """The claim of a plan that preempts: its victims' GPUs per node, for as long as its hold."""
    taken = next((w for w in writes if isinstance(w, PreemptPods)), None)
    return None if taken is None else _claim(taken.victims, now + hold)


def narrowing_claim(hold: RoomHold | None, now: float) -> RoomClaim | None:
    """The claim of a replica narrowed (core/narrowing.py): the victims it counts on gangpreempt to take, for as
    long as its narrowing. Without it the next soft replica that must preempt would count on the same victims,
    be narrowed too, and wait hard for room the first takes, up to the narrowing's end, where Volcano would have
    preempted for it elsewhere at once."""
    return None if hold is None or not hold.counts_on else _claim(hold.counts_on, now + NARROWED_FOR, counting=True)


def kept_claim(kept: RoomClaim | None, exact: RoomClaim | None, hold: RoomHold | None, now: float) -> RoomClaim | None:
    """A replica's claim after a plan: `exact`'s where it preempted; a narrowing's as its hold counts now (the one
    `kept` while it counts on the same victims, so its time runs from the first); none once its hold counts on
    nothing (let go without narrowing, its narrowing undone); else as `kept` (until it is placed, gone or past it)."""
    if exact is not None:
        return exact
    counted = narrowing_claim(hold, now)
    if counted is not None:
        return kept if kept is not None and kept.victims == counted.victims else counted
    if hold is not None and kept is not None and kept.counting:
        return None
    return kept


def _claim(victims: tuple[Victim, ...], until: float, counting: bool = False) -> RoomClaim:
    gpus: dict[str, int] = {}
    for victim in victims:
        gpus[victim.node] = gpus.get(victim.node, 0) + victim.gpus
    return RoomClaim(gpus, until, victims, counting)


def claimed_room(
    claims: Mapping[K, RoomClaim], now: float, settled: Collection[K], but: K | None = None
) -> tuple[dict[str, int], dict[K, RoomClaim]]:
    """The GPUs per node still claimed by any replica `but` this one, and the claims kept: those of replicas not
    `settled` (placed or gone) and within their hold."""
    kept = {key: claim for key, claim in claims.items() if now <= claim.until and key not in settled}
    total: dict[str, int] = {}
    for key, claim in kept.items():
        if key == but:
            continue  # (its own room)
        for node, gpus in claim.gpus.items():
            total[node] = total.get(node, 0) + gpus
    return total, kept


def room_left(
    key: K, claims: Mapping[K, RoomClaim], settled: Collection[K], free: Mapping[str, int], releasing: Mapping[str, int], now: float
) -> tuple[dict[str, int], dict[K, RoomClaim], tuple[RoomClaim, ...]]:
    """The room replica `key` may plan with, per node: the free GPUs and those of pods being deleted (on their way:
    no plan takes more for them), less what the leader's other held replicas count on; with the claims kept (not
    `settled`: placed or gone; within their hold) and the others' among them (their victims are not this one's)."""
    claimed, kept = claimed_room(claims, now, settled, but=key)
    room = {node: max(0, gpus + releasing.get(node, 0) - claimed.get(node, 0)) for node, gpus in free.items()}
    return room, kept, tuple(claim for replica, claim in kept.items() if replica != key)


def unclaimed(holders: Mapping[str, Sequence[Holder]], claims: Collection[RoomClaim]) -> Mapping[str, Sequence[Holder]]:
    """Who holds each node's GPUs, less the victims claimed for another replica: for each, one holder alike (its
    GPUs, priority and gang) that is still a victim, unless one alike is leaving already (that one is the victim
    claimed: evicted for it). `holders` itself where nothing is claimed (a reading is not copied)."""
    claimed = [victim for claim in claims for victim in claim.victims]
    if not claimed:
        return holders
    out = {node: list(holders.get(node, ())) for node in {victim.node for victim in claimed}}
    gone: dict[str, list[Holder]] = {node: [] for node in out}  # leaving holders taken for a claimed victim
    for victim in claimed:
        alike = [h for h in out[victim.node] if (h.gpus, h.priority, h.gang) == (victim.gpus, victim.priority, victim.gang)]
        leaving = next((h for h in alike if h.leaving and not any(h is g for g in gone[victim.node])), None)
        if leaving is not None:
            gone[victim.node].append(leaving)
            continue
        taken = next((h for h in alike if h.preemptable), None)
        if taken is not None:
            out[victim.node] = [h for h in out[victim.node] if h is not taken]
    return {**holders, **{node: tuple(hs) for node, hs in out.items()}}
