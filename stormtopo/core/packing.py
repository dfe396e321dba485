"""Does a gang fit in a network domain: bin packing of GPU requests onto nodes' free GPUs.

GPUs decide where an inference replica fits, so capacity is counted in GPUs per node. The exact
search is exponential in the worst case; it gets a step budget, and beyond it (or beyond EXACT_LIMIT
pods) first-fit-decreasing answers, which can say "does not fit" where a packing exists. Callers
that must never stall (the operator serves admissions on the same process) rely on that bound.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stormtopo.core.topology.tree import Switch, Topology

EXACT_LIMIT = 12  # pods; beyond this, first-fit-decreasing
SEARCH_BUDGET = 20_000  # search steps (about 20 ms of Python); beyond this, first-fit-decreasing


@dataclass(frozen=True)
class Fit:
    fits: bool
    exact: bool  # False: first-fit-decreasing answered, and "does not fit" may be wrong

    def __bool__(self) -> bool:
        return self.fits


def fits(free: Sequence[int], pods: Sequence[int], budget: int = SEARCH_BUDGET) -> Fit:
    """Can pods with these GPU requests be placed on nodes with these free GPUs?"""
    demand = sorted((p for p in pods if p > 0), reverse=True)
    if sum(demand) > sum(free):
        return Fit(False, True)
    if len(demand) > EXACT_LIMIT:
        return _first_fit_decreasing(list(free), demand)
    search = _Search(budget)
    try:
        return Fit(search.place(tuple(sorted(free, reverse=True)), demand, 0), True)
    except _OutOfBudget:
        return _first_fit_decreasing(list(free), demand)


def _first_fit_decreasing(free: list[int], demand: list[int]) -> Fit:
    free.sort(reverse=True)
    for pod in demand:
        for i, room in enumerate(free):
            if room >= pod:
                free[i] -= pod
                break
        else:
            return Fit(False, False)
    return Fit(True, True)  # a packing was found: that answer is exact


class _OutOfBudget(Exception):
    pass


class _Search:
    def __init__(self, budget: int) -> None:
        self.left = budget

    def place(self, free: tuple[int, ...], demand: list[int], i: int) -> bool:
        if i == len(demand):
            return True
        self.left -= 1
        if self.left < 0:
            raise _OutOfBudget
        tried = set()
        for n, room in enumerate(free):
            if room >= demand[i] and room not in tried:  # nodes with equal room are interchangeable
                tried.add(room)
                rest = (*free[:n], room - demand[i], *free[n + 1 :])
                if self.place(rest, demand, i + 1):
                    return True
        return False


def takes_new_pods(node: Mapping[str, Any]) -> bool:
    """A node a scheduler may place a new pod on: not cordoned (drained), and Ready. A node's taints
    are not judged: GPU nodes are commonly tainted for GPU pods, which tolerate them."""
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    conditions = (node.get("status") or {}).get("conditions") or []
    return all(c.get("status") == "True" for c in conditions if c.get("type") == "Ready")


@dataclass(frozen=True)
class DomainFit:
    switch: Switch
    free_gpus: int
    free_per_node: Mapping[str, int]
    fit: Fit

    @property
    def fits(self) -> bool:
        return self.fit.fits


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
