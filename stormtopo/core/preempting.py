"""Exact preemption: a replica that must preempt takes the fewest victims, in the domain they free, and no more.

Volcano v1.15.1's gangpreempt adds victims bundle after bundle until a domain's sum of room covers the gang,
then evicts all it took: 3 to 4 times the fewest pods at the median (BENCHMARKS.md, "Preemption"). With
`--exact-preemption`, the webhook holds every pod of an opted-in replica that may preempt at the room gate
(core/admission.py), and this plan lets it go once all its pods exist:

- where a domain of its tier holds it now, at once, as it is: Volcano places it without preempting;
- where the fewest victims (core/preemption.py over the free-room reading; a victim of a gang costs its
  whole gang, as its PodGroup's minMember is not read) make room, they are evicted
  first and the replica is let go into the domain they leave (a required node affinity to its nodes). With
  the victims releasing, Volcano's allocate pipelines the replica onto their room, so gangpreempt finds it
  no longer starving and takes nothing more (in the simulator, in every case; BENCHMARKS.md);
- where no domain qualifies, as it is: Volcano decides, and the Pending replica's explanation says why.

A replica is never held longer than the hold's limit (its pods not all created, the class's value not read
yet, a write that failed): then it goes as it is, to Volcano's own preemption. One plan evicts for a replica
once; a second look while its victims terminate only lets it go.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stormtopo.core.gang import container_gpus
from stormtopo.core.packing import domains_at_tier, fits
from stormtopo.core.placement import release_into
from stormtopo.core.preemption import CLUSTER, Holder, plan_preemption, rank_of
from stormtopo.core.request import Mode, TopologyRequest
from stormtopo.core.topology.tree import Topology
from stormtopo.core.victims import GangSize
from stormtopo.core.vocabulary import GROUP_NAME_ANNOTATION, ROOM_GATE
from stormtopo.core.writes import EvictPod, PreemptPods, Say, Victim, Write

HOLD_MAX = 30.0  # seconds a replica is held at the room gate at most (--exact-preemption-hold)


@dataclass(frozen=True)
class RoomHold:
    """What the leader remembers of one held replica."""

    since: float  # monotonic seconds: first seen held
    preempted: bool = False  # victims were evicted for it: never again for this hold


@dataclass(frozen=True)
class RoomPlan:
    writes: tuple[Write, ...] = ()
    says: tuple[Say, ...] = ()
    hold: RoomHold | None = None  # None: nothing held any more
    needs_room: bool = False  # every node's free GPUs and the pods holding them are needed: read them and plan again
    recheck_in: float | None = None  # seconds until the hold's limit: plan again then


def plan_room(
    namespace: str,
    replica: str,
    request: TopologyRequest | None,
    allowed_tier: int | None,
    topology: Topology,
    hostnames: Mapping[str, str],
    held: Sequence[Mapping[str, Any]],
    wanted: Sequence[int],
    created: int,
    bound: int,
    priority: int | None,
    free: Mapping[str, int] | None,
    holders: Mapping[str, Sequence[Holder]] | None,
    gangs: Mapping[str, GangSize] | None,
    hold: RoomHold | None,
    now: float,
    hold_max: float = HOLD_MAX,
) -> RoomPlan:
    """For a replica with pods at the room gate: wait, let it go, or evict its fewest victims and let it go."""
    if not held:
        return RoomPlan()
    hold = hold or RoomHold(now)
    let_go = RoomPlan(tuple(release_into([], hostnames, held, ROOM_GATE)))
    if request is None or allowed_tier is None or bound or hold.preempted:
        return let_go  # opted out or invalid; part of it placed already; or its victims are on their way out
    if now - hold.since >= hold_max:
        why = f"replica {replica} let go after {hold_max:.0f} s at the room gate, to Volcano's own preemption"
        return RoomPlan(let_go.writes, (Say("Normal", "ReplicaLetGo", why),))
    wait = RoomPlan(hold=hold, recheck_in=hold_max - (now - hold.since))
    if created < len(wanted) or priority is None:
        return wait  # the gang is judged whole, at its class's value
    if free is None or holders is None:
        return RoomPlan(hold=hold, needs_room=True)
    soft = request.mode is Mode.SOFT
    if any(d.fits for level in range(1, allowed_tier + 1) for d in domains_at_tier(topology, free, wanted, level)[:1]):
        return let_go
    if soft and fits(list(free.values()), wanted):
        return let_go
    plan = plan_preemption(topology, free, holders, wanted, priority, allowed_tier, gangs, soft=soft)
    if plan.victims is None:
        return let_go
    v = plan.victims
    victims = tuple(Victim(node, holders[node][i].gpus, holders[node][i].priority, holders[node][i].gang) for node, i in v.chosen)
    domain = [] if v.domain == CLUSTER else sorted(topology.nodes_under(v.domain))
    if set(domain) == set(topology.nodes):
        domain = []  # the whole cluster: nothing to keep it within
    where = "across the cluster" if v.domain == CLUSTER else f"in tier-{v.tier} {v.domain}"
    pods = ", ".join(f"{n} of priority {p}" for p, n in v.by_priority)
    message = f"replica {replica} preempts {v.pods} pod(s) holding {v.gpus} GPUs ({pods}) {where}, the fewest that make room for it"
    says = (Say("Normal", "ReplicaPreempting", message),)
    writes: tuple[Write, ...] = (PreemptPods(namespace, replica, victims), *release_into(domain, hostnames, held, ROOM_GATE))
    return RoomPlan(writes, says, RoomHold(hold.since, preempted=True))


def pick_victims(victims: Sequence[Victim], pods_on: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[EvictPod]:
    """The pods to evict for the planned victims: on each victim's node, a bound pod Volcano may preempt
    with its GPUs and priority, not being deleted, each taken once (the oldest first: the same choice on
    every replica of the operator). A victim with no such pod left is skipped."""
    taken: set[str] = set()
    out = []
    for victim in victims:
        candidates = sorted(
            (p for p in pods_on.get(victim.node, ()) if _matches(p, victim) and p["metadata"].get("uid") not in taken),
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
