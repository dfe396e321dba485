"""Placement maths: does a gang fit in a network domain, which tier is the best achievable, and why not.

GPUs are the resource that decides placement for inference replicas, so free capacity is counted in
GPUs per node. Fitting pods onto nodes is bin packing: exact by search for the small gangs of a
StormService replica, first-fit-decreasing beyond that.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from stormtopo.core.request import TopologyRequest
from stormtopo.core.topology.tree import Switch, Topology
from stormtopo.core.vocabulary import DOMAIN_LABEL_PREFIX

EXACT_LIMIT = 12  # pods; beyond this, first-fit-decreasing


def fits(free: Sequence[int], pods: Sequence[int]) -> bool:
    """Can pods with these GPU requests be placed on nodes with these free GPUs (one pod per slot)?"""
    demand = sorted((p for p in pods if p > 0), reverse=True)
    if sum(demand) > sum(free):
        return False
    if len(demand) > EXACT_LIMIT:
        return _first_fit_decreasing(list(free), demand)
    return _search(tuple(sorted(free, reverse=True)), demand, 0)


def _first_fit_decreasing(free: list[int], demand: list[int]) -> bool:
    free.sort(reverse=True)
    for pod in demand:
        for i, room in enumerate(free):
            if room >= pod:
                free[i] -= pod
                break
        else:
            return False
    return True


def _search(free: tuple[int, ...], demand: list[int], i: int) -> bool:
    if i == len(demand):
        return True
    tried = set()
    for n, room in enumerate(free):
        if room >= demand[i] and room not in tried:  # nodes with equal room are interchangeable
            tried.add(room)
            rest = (*free[:n], room - demand[i], *free[n + 1 :])
            if _search(rest, demand, i + 1):
                return True
    return False


@dataclass(frozen=True)
class DomainFit:
    switch: Switch
    free_gpus: int
    free_per_node: Mapping[str, int]
    fits: bool


def domains_at_tier(topology: Topology, free: Mapping[str, int], pods: Sequence[int], tier: int) -> list[DomainFit]:
    """Every HyperNode of `tier` with its free GPUs and whether the gang fits, best first."""
    out = []
    for switch in topology.switches.values():
        if switch.tier != tier:
            continue
        per_node = {n: max(0, free.get(n, 0)) for n in topology.nodes_under(switch.name)}
        out.append(DomainFit(switch, sum(per_node.values()), per_node, fits(list(per_node.values()), pods)))
    return sorted(out, key=lambda d: (not d.fits, -d.free_gpus, d.switch.name))


def best_tier(topology: Topology, free: Mapping[str, int], pods: Sequence[int]) -> int | None:
    """The lowest tier at which some HyperNode holds the whole gang (the offline optimum); None if none."""
    for tier in range(1, topology.tiers + 1):
        if any(d.fits for d in domains_at_tier(topology, free, pods, tier)):
            return tier
    return None


def explain(topology: Topology, free: Mapping[str, int], pods: Sequence[int], highest_tier: int) -> tuple[bool, str]:
    """(fits, text): for each allowed tier, the best HyperNode's free GPUs against what the gang needs."""
    need = sum(pods)
    shape = " + ".join(str(p) for p in sorted(pods, reverse=True))
    lines = [f"the gang needs {len(pods)} pods with {shape} GPUs ({need} GPUs) within tier {highest_tier}"]
    for tier in range(1, min(highest_tier, topology.tiers) + 1):
        domains = domains_at_tier(topology, free, pods, tier)
        if not domains:
            continue
        best = domains[0]
        nodes = ", ".join(f"{n}: {g}" for n, g in sorted(best.free_per_node.items()) if g > 0) or "none"
        if best.fits:
            lines.append(f"tier {tier}: {best.switch.name} fits it (free GPUs {nodes})")
            return True, "; ".join(lines)
        short = max(0, need - best.free_gpus)
        why = f"{short} GPUs short" if short else "free GPUs are spread too thin across its nodes"
        lines.append(f"tier {tier}: best is {best.switch.name} with {best.free_gpus} free GPUs ({nodes}), {why}")
    wider = best_tier(topology, free, pods)
    if wider is not None and wider > highest_tier:
        lines.append(f"it would fit within tier {wider}; or free capacity in one tier-{highest_tier} domain")
    else:
        lines.append("no domain of the cluster has room now; it fits once enough GPUs in one domain are freed")
    return False, "; ".join(lines)


def allowed_tier(request: TopologyRequest, topology: Topology) -> int | None:
    """The tier number a request allows, resolving a tier name through the HyperNodes' tierNames."""
    if request.limit.tier is not None:
        return request.limit.tier
    names = {name: tier for tier, name in topology.tier_names.items()}
    return names.get(request.limit.tier_name or "")


def domain_labels(topology: Topology, node: str) -> dict[str, str]:
    """One label per tier naming the HyperNode above `node`, so a router can pair prefill and decode
    within a domain (as llm-d's and Dynamo's topology-aware routing read such labels)."""
    if node not in topology.nodes:
        return {}
    return {f"{DOMAIN_LABEL_PREFIX}{topology.switches[s].tier}": s for s in topology.ancestors(node)}


def placement_record(topology: Topology, nodes: Sequence[str]) -> dict[str, object]:
    """Where one replica landed: its lowest common HyperNode, that tier, and its nodes."""
    known = bool(nodes) and all(n in topology.nodes for n in nodes)
    domain = topology.lowest_common_switch(nodes) if known else None
    return {"hyperNode": domain.name if domain else None, "tier": domain.tier if domain else None, "nodes": sorted(set(nodes))}


def recorded_placement(current: str | None, replica: str) -> Mapping[str, object] | None:
    """`replica`'s record in the placement annotation, if it has one."""
    try:
        table = json.loads(current) if current else {}
    except ValueError:
        return None
    record = table.get(replica) if isinstance(table, dict) else None
    return record if isinstance(record, dict) else None


def merge_placements(current: str | None, replica: str, record: Mapping[str, object], live: Iterable[str]) -> str:
    """The placement annotation with `replica`'s record set and replicas that no longer exist dropped."""
    try:
        table = json.loads(current) if current else {}
        if not isinstance(table, dict):
            table = {}
    except ValueError:
        table = {}
    keep = set(live) | {replica}
    table = {k: v for k, v in table.items() if k in keep}
    table[replica] = dict(record)
    return json.dumps(table, sort_keys=True, separators=(",", ":"))
