"""Why a hard gang is Pending, as data: per allowed tier, the best domain's free GPUs against the need.

Volcano keeps the HyperNode it tried in scheduler memory and says only "network topology not
satisfied". The operator's Event and `stormtopo explain` both render this one explanation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from stormtopo.core.packing import DomainFit, best_tier, domains_at_tier
from stormtopo.core.preemption import Holder, Preemption, plan_preemption
from stormtopo.core.request import Mode, TierLimit, TopologyRequest
from stormtopo.core.topology.tree import Topology
from stormtopo.core.victims import GangSize
from stormtopo.core.volcano_conf import SchedulerConf


@dataclass(frozen=True)
class TierVerdict:
    tier: int
    best: DomainFit


@dataclass(frozen=True)
class Explanation:
    pods: tuple[int, ...]  # GPUs of each pod of the gang
    highest_tier: int
    tiers: tuple[TierVerdict, ...]  # allowed tiers, lowest first, up to the first that fits
    wider_tier: int | None  # the lowest tier beyond the limit that would hold the gang
    preemption: Preemption | None = None  # what it could preempt within its tier (when the pods it could preempt were read)

    @property
    def need(self) -> int:
        return sum(self.pods)

    @property
    def fits(self) -> bool:
        return any(v.best.fits for v in self.tiers)

    @property
    def exact(self) -> bool:
        """False when a domain's check ran out of its search budget and first-fit said no."""
        return all(v.best.fit.exact for v in self.tiers)

    def render(self) -> str:
        shape = " + ".join(str(p) for p in sorted(self.pods, reverse=True))
        lines = [f"the gang needs {len(self.pods)} pods with {shape} GPUs ({self.need} GPUs) within tier {self.highest_tier}"]
        for verdict in self.tiers:
            best = verdict.best
            nodes = ", ".join(f"{n}: {g}" for n, g in sorted(best.free_per_node.items()) if g > 0) or "none"
            if best.fits:
                lines.append(f"tier {verdict.tier}: {best.switch.name} fits it (free GPUs {nodes})")
                return "; ".join(lines)
            short = max(0, self.need - best.free_gpus)
            why = f"{short} GPUs short" if short else "free GPUs are spread too thin across its nodes"
            if not best.fit.exact:
                why += " (by first-fit; the exact check ran out of its time budget)"
            lines.append(f"tier {verdict.tier}: best is {best.switch.name} with {best.free_gpus} free GPUs ({nodes}), {why}")
        if self.wider_tier is not None:
            lines.append(f"it would fit within tier {self.wider_tier}; or free capacity in one tier-{self.highest_tier} domain")
        else:
            lines.append("no domain of the cluster has room now; it fits once enough GPUs in one domain are freed")
        if self.preemption is not None:
            lines.append(self.preemption.render())
        return "; ".join(lines)


def explain(
    topology: Topology,
    free: Mapping[str, int],
    pods: Sequence[int],
    highest_tier: int,
    holders: Mapping[str, Sequence[Holder]] | None = None,
    priority: int | None = None,
    gangs: Mapping[str, GangSize] | None = None,
    volcano: SchedulerConf | None = None,
) -> Explanation:
    """Why the gang does not fit now; with `holders` (the pods holding each node's GPUs) and the gang's
    `priority`, also what it could preempt within its tier (a victim of one of `gangs` costs its gang), and,
    with Volcano's scheduler configuration, whether anything there would preempt for it."""
    verdicts = []
    for tier in range(1, min(highest_tier, topology.tiers) + 1):
        domains = domains_at_tier(topology, free, pods, tier)
        if not domains:
            continue
        verdicts.append(TierVerdict(tier, domains[0]))
        if domains[0].fits:
            break
    explanation = Explanation(tuple(pods), highest_tier, tuple(verdicts), None)
    if explanation.fits:
        return explanation
    wider = best_tier(topology, free, pods)
    beyond = wider if wider is not None and wider > highest_tier else None
    preemption = None
    if holders is not None and priority is not None:
        preemption = plan_preemption(topology, free, holders, pods, priority, highest_tier, gangs)
        if volcano is not None:
            preemption = replace(preemption, nothing_preempts=volcano.no_topology_preemption())
    return Explanation(tuple(pods), highest_tier, tuple(verdicts), beyond, preemption)


def limit_tier(limit: TierLimit, topology: Topology) -> int | None:
    """A limit's tier number, a tier name resolved through the tree's tierNames (ClusterTiers.number does the
    same from the HyperNodes alone); None if it names none."""
    return limit.tier if limit.tier is not None else topology.tier_of_name(limit.tier_name)


def allowed_tier(request: TopologyRequest, topology: Topology) -> int | None:
    """The tier number a request allows."""
    return limit_tier(request.limit, topology)


@dataclass(frozen=True)
class Pending:
    """A hard replica that Volcano holds back, explained."""

    tier: int
    explanation: Explanation


def is_explainable(request: TopologyRequest, pods: Sequence[int], pods_created: int) -> bool:
    """Whether a Pending replica can be explained at all, before reading the cluster's free GPUs:
    only a hard request holds a gang back, and only once all its pods exist."""
    return request.mode is Mode.HARD and pods_created >= len(pods)


def plan_pending(
    request: TopologyRequest,
    pods: Sequence[int],
    pods_created: int,
    topology: Topology,
    free: Mapping[str, int],
    holders: Mapping[str, Sequence[Holder]] | None = None,
    priority: int | None = None,
    gangs: Mapping[str, GangSize] | None = None,
    volcano: SchedulerConf | None = None,
) -> Pending | None:
    """Why a hard replica is Pending; None when there is nothing to explain yet (or ever: soft
    requests never hold a gang back, and Volcano calls a gang unschedulable while AIBrix is still
    creating its pods). With `holders` and the gang's `priority`, also what it could preempt; with `volcano`,
    whether Volcano's scheduler preempts for it at all."""
    if not is_explainable(request, pods, pods_created):
        return None
    tier = allowed_tier(request, topology)
    if tier is None:
        return None
    return Pending(tier, explain(topology, free, pods, tier, holders, priority, gangs, volcano))
