"""What a Pending gang could preempt, as data: the domain Volcano's gangpreempt would take it in, and how
many pods of which priority, or why no domain qualifies.

Volcano v1.15.1's `preempt` skips every job with a network topology; `gangpreempt` (opt-in, docs/install.md)
looks for victims per HyperNode domain: bound pods of jobs of the same queue whose priority is lower than
the gang's, that are not marked `volcano.sh/preemptable: "false"`. Volcano says none of this when it does
not preempt. This module reads the same rule over what the operator or the CLI read of the cluster: each
node's free GPUs and the pods that hold its GPUs. Three approximations, said in docs/install.md: a pod's
own priority stands for its job's (Volcano ranks by the PodGroup's class; for Volcano's own jobs and for
stormtopo's PodGroups the two agree), queues are not read (gangreclaim takes across queues), and a
victim of a gang costs the gang as `gangs` says (the operator takes every gang at its minimum: a pod of
a gang the caller does not know is counted alone).

The victims counted are the fewest that let the gang fit in the domain (core/victims.py), a gang's pods
counted whole once it would fall below its minimum; Volcano may take more (BENCHMARKS.md, "Preemption").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stormtopo.core.packing import fits
from stormtopo.core.topology.tree import Topology
from stormtopo.core.victims import Budget, Candidate, Cost, Fewest, GangSize, Victims, fewest_victims
from stormtopo.core.vocabulary import VOLCANO_SCHEDULER

PREEMPTABLE = "volcano.sh/preemptable"  # on a pod, annotation first, then label; Volcano's default: true
CLUSTER = ""  # the domain of a soft gang that may span the whole cluster
_GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})  # strconv.ParseBool's true; anything else is false


@dataclass(frozen=True, slots=True)  # one per bound GPU pod of the cluster, in the leader's free-room reading
class Holder:
    """A bound pod that holds GPUs on a node, as preemption sees it."""

    gpus: int
    priority: int
    preemptable: bool  # scheduled by Volcano, and not marked volcano.sh/preemptable: "false"
    gang: str | None = None  # its gang, where the caller knows it (with its GangSize); None: counted alone
    leaving: bool = False  # being deleted (so not preemptable): its room is on its way

    @property
    def namespace(self) -> str | None:
        """Its gang's namespace (a gang is named "namespace/PodGroup"); None without a gang."""
        return None if self.gang is None else self.gang.partition("/")[0]


@dataclass(frozen=True)
class DomainVictims:
    domain: str
    tier: int
    by_priority: tuple[tuple[int, int], ...]  # (priority, pods lost), lowest priority first
    gpus: int  # GPUs the pods lost hold
    chosen: tuple[tuple[str, int], ...] = ()  # (node, index among that node's holders) of each pod to preempt
    cost: Cost = (0, 0, 0)  # as core/victims.py compares them: domains compare by it too

    @property
    def pods(self) -> int:
        return sum(n for _, n in self.by_priority)


@dataclass(frozen=True)
class Protected:
    """Of the best domain (the most GPUs free once every candidate is gone), what stays out of reach."""

    domain: str
    tier: int
    short: int  # GPUs still missing with every candidate gone (0: enough, but spread too thin over nodes)
    higher: int  # GPUs held by pods of equal or higher priority
    not_preemptable: int  # GPUs held by pods Volcano does not preempt (marked, or not scheduled by Volcano)


@dataclass(frozen=True)
class Preemption:
    priority: int
    victims: DomainVictims | None  # the domain it would take, with the fewest victims
    protected: Protected | None  # when no domain qualifies
    # Why Volcano preempts nothing for the gang whatever the victims (its configuration runs no gangpreempt,
    # core/volcano_conf.py); None where it does, or where its configuration was not read.
    nothing_preempts: str | None = None

    def render(self) -> str:
        if self.victims is not None:
            v = self.victims
            pods = ", ".join(f"{n} of priority {p}" for p, n in v.by_priority)
            where = "across the cluster" if v.domain == CLUSTER else f"in tier-{v.tier} {v.domain}"
            if self.nothing_preempts is not None:
                return (
                    f"at priority {self.priority}, the fewest victims would be {where}: {v.pods} pod(s) holding "
                    f"{v.gpus} GPUs ({pods}); but {self.nothing_preempts}"
                )
            return (
                f"at priority {self.priority}, the fewest victims are {where}: preempting {v.pods} pod(s) holding "
                f"{v.gpus} GPUs ({pods}); Volcano's gangpreempt may take more"
            )
        if self.protected is None:
            return f"at priority {self.priority}, no domain of its tier has nodes to preempt on"
        p = self.protected
        held = f"{p.higher} GPUs are held by pods of priority {self.priority} or higher, {p.not_preemptable} by pods it does not preempt"
        gap = f"{p.short} GPUs short" if p.short else "the GPUs it could free are spread too thin across its nodes"
        return f"at priority {self.priority}, no domain qualifies for preemption: in the best, tier-{p.tier} {p.domain}, {held}; {gap}"


def rank_of(pod: Mapping[str, Any]) -> tuple[int, bool]:
    """(priority, preemptable) of a bound pod as gangpreempt judges it: its priority as admitted (from its
    class), and whether Volcano may take it: scheduled by Volcano (other schedulers' pods belong to no job
    of its), not marked false (an unreadable mark counts as false, as in Volcano's GetPodPreemptable)."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    priority = spec.get("priority")
    ranked = priority if isinstance(priority, int) else 0
    if spec.get("schedulerName") != VOLCANO_SCHEDULER:
        return ranked, False
    return ranked, marked_preemptable(meta)


def marked_preemptable(meta: Mapping[str, Any]) -> bool:
    """A pod's or PodGroup's `volcano.sh/preemptable` as Volcano reads it: the annotation, then the label,
    parsed as Go's strconv.ParseBool (unreadable: false); unmarked: true."""
    for marks in (meta.get("annotations") or {}, meta.get("labels") or {}):
        if PREEMPTABLE in marks:
            return str(marks[PREEMPTABLE]) in _GO_TRUE
    return True


def is_candidate(holder: Holder, priority: int) -> bool:
    return holder.preemptable and holder.priority < priority


def plan_preemption(
    topology: Topology,
    free: Mapping[str, int],
    holders: Mapping[str, Sequence[Holder]],
    pods: Sequence[int],
    priority: int,
    tier: int,
    gangs: Mapping[str, GangSize] | None = None,
    soft: bool = False,
    fewest: Fewest = Fewest.PODS,
) -> Preemption:
    """Hard: the domain of `tier` or below (the lowest tier first: a hard gang stays within its tier) where
    the gang fits once candidates are preempted, with the fewest victims. Soft: the fewest victims of any
    domain or of the whole cluster (it may span domains, and takes only as much as it must), the lowest
    tier of equals. Else what protects the best domain. The fewest pods first, or the fewest GPUs (`fewest`)."""
    best: Protected | None = None
    best_room = -1
    found: list[DomainVictims] = []
    budget = Budget()
    for level in range(1, (topology.tiers if soft else min(tier, topology.tiers)) + 1):
        for switch in sorted(topology.switches.values(), key=lambda s: s.name):
            if switch.tier != level:
                continue
            nodes = sorted(topology.nodes_under(switch.name))
            victims = _fewest_victims(nodes, free, holders, pods, priority, gangs or {}, budget, fewest)
            if victims is not None:
                found.append(DomainVictims(switch.name, level, victims.lost, victims.gpus, victims.chosen, victims.cost))
                continue
            room = sum(max(0, free.get(n, 0)) + _gpus(holders, n, lambda h: is_candidate(h, priority)) for n in nodes)
            if room > best_room:
                best_room = room
                best = Protected(
                    switch.name,
                    level,
                    max(0, sum(pods) - room),
                    sum(_gpus(holders, n, lambda h: h.preemptable and h.priority >= priority) for n in nodes),
                    sum(_gpus(holders, n, lambda h: not h.preemptable) for n in nodes),
                )
        if found and not soft:
            break
    if soft:
        victims = _fewest_victims(sorted(topology.nodes), free, holders, pods, priority, gangs or {}, budget, fewest)
        if victims is not None:
            found.append(DomainVictims(CLUSTER, topology.tiers + 1, victims.lost, victims.gpus, victims.chosen, victims.cost))
    if found:
        return Preemption(priority, min(found, key=lambda v: (fewest.rank(v.cost), v.tier, v.domain)), None)
    return Preemption(priority, None, best)


def _gpus(holders: Mapping[str, Sequence[Holder]], node: str, which: Callable[[Holder], bool]) -> int:
    return sum(h.gpus for h in holders.get(node, ()) if which(h))


def _fewest_victims(
    nodes: Sequence[str],
    free: Mapping[str, int],
    holders: Mapping[str, Sequence[Holder]],
    pods: Sequence[int],
    priority: int,
    gangs: Mapping[str, GangSize],
    budget: Budget,
    fewest: Fewest = Fewest.PODS,
) -> Victims | None:
    """The fewest victims in these nodes that make room for the gang (core/victims.py); None if it does not
    fit even with every candidate gone. Indices in the answer are those of each node's holders."""
    candidates: dict[str, list[Candidate]] = {}
    index: dict[str, list[int]] = {}
    for n in nodes:
        for i, h in enumerate(holders.get(n, ())):
            if is_candidate(h, priority):
                candidates.setdefault(n, []).append(Candidate(h.gpus, h.priority, h.gang))
                index.setdefault(n, []).append(i)
    if not fits([max(0, free.get(n, 0)) + sum(c.gpus for c in candidates.get(n, ())) for n in nodes], pods):
        return None
    found = fewest_victims(nodes, free, candidates, pods, gangs, budget, fewest)
    if found is None:
        return None  # the search found no packing where one exists: say nothing rather than guess
    return Victims(tuple((n, index[n][i]) for n, i in found.chosen), found.cost, found.lost)
