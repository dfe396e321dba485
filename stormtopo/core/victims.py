"""The fewest victims that let a gang fit on a set of nodes: which pods to preempt, as a gang's loss is counted.

Volcano v1.15.1's gangpreempt takes victims by bundles until the domain's sum of free and freed resources
covers the gang, then evicts every bundle it took, on nodes the gang will not use as well (BENCHMARKS.md,
"Preemption": 3 to 4 times the fewest pods at the median). This search finds the fewest.

A victim's cost is what its gang loses: a pod of a gang with slack (running pods above its minMember) costs
itself; one pod more than the slack leaves the gang below its minimum, and then every pod it runs is lost
(Volcano's "whole" bundle). Costs compare as (pods lost, GPUs lost, the sum of their priorities): the fewest
pods, then the least work, then the lowest priorities; or, asked for the fewest GPUs (Fewest.GPUS), as (GPUs
lost, pods lost, priorities). The two are different choices in a fragmented cluster (one 8-GPU pod, or two
pods holding 3 between them), and no choice is near both (BENCHMARKS.md, "Preemption"): an SRE who would
rather disrupt fewer jobs keeps the default, one who would rather lose less GPU work asks for GPUs.

The search: each assignment of the gang's pods to nodes (pods of equal size in node order, on the
NODES_TRIED nodes that are cheapest to free on their own), then for every node the assignment uses, its
minimal sets of victims that free what it lacks; the combination with the lowest cost over its union wins
(a gang with pods on two used nodes is counted once). Cost never falls as victims are added, so an
assignment whose dearest node alone costs more than the best found is skipped. A Budget of steps bounds
the search, shared by every domain one plan judges; within it the answer is exact for the nodes tried.
Past it, and for gangs of more than EXACT_PODS pods, the ladder: each pod, largest first, to the node where
it costs the fewest victims.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from itertools import product

EXACT_PODS = 4  # gangs up to this many pods are searched; larger ones take the ladder
NODES_TRIED = 8  # of a larger domain, the nodes cheapest to free on their own
OPTIONS_PER_NODE = 8  # minimal victim sets kept per node and need, cheapest first
SUBSET_LIMIT = 4096  # ways to choose among one node's candidates enumerated; beyond it, the node's ladder only
BUDGET = 200_000  # steps one plan may spend over all its domains (well under a second of Python)

Cost = tuple[int, int, int]  # pods lost, GPUs lost, the sum of their priorities
NEVER: Cost = (1 << 60, 1 << 60, 0)


class Fewest(Enum):
    """What a choice of victims minimises first (--exact-preemption-fewest)."""

    PODS = "pods"
    GPUS = "gpus"

    def rank(self, cost: Cost) -> Cost:
        """The cost as this choice compares it: pods first, or GPUs first."""
        return cost if self is Fewest.PODS else (cost[1], cost[0], cost[2])


@dataclass(frozen=True)
class Candidate:
    """A pod that may be preempted for the gang: preemptable, of lower priority."""

    gpus: int
    priority: int
    gang: str | None = None  # its gang; None: a pod that stands alone


@dataclass(frozen=True)
class GangSize:
    """A running victim gang: it loses everything once fewer than min_member of its pods run."""

    running: int
    min_member: int
    gpus: int  # GPUs its running pods hold

    @property
    def slack(self) -> int:
        return max(0, self.running - self.min_member)


@dataclass(frozen=True)
class Victims:
    chosen: tuple[tuple[str, int], ...]  # (node, index among that node's candidates) of each pod to preempt
    cost: Cost
    lost: tuple[tuple[int, int], ...]  # (priority, pods lost), lowest priority first

    @property
    def pods(self) -> int:
        return self.cost[0]

    @property
    def gpus(self) -> int:
        return self.cost[1]


def cost_of(
    chosen: Sequence[tuple[str, int]], candidates: Mapping[str, Sequence[Candidate]], gangs: Mapping[str, GangSize]
) -> tuple[Cost, Counter[int]]:
    """What preempting these pods loses: each alone, or a gang whole once it falls below its minimum."""
    pods = gpus = weight = 0
    lost: Counter[int] = Counter()
    taken: dict[str, list[Candidate]] = {}
    for node, i in chosen:
        c = candidates[node][i]
        size = gangs.get(c.gang) if c.gang is not None else None
        if size is None:
            pods, gpus, weight = pods + 1, gpus + c.gpus, weight + c.priority
            lost[c.priority] += 1
        else:
            taken.setdefault(c.gang, []).append(c)  # type: ignore[arg-type]
    for gang, members in taken.items():
        size = gangs[gang]
        priority = members[0].priority
        if len(members) <= size.slack:
            n, g = len(members), sum(c.gpus for c in members)
        else:
            n, g = max(size.running, len(members)), max(size.gpus, sum(c.gpus for c in members))
        pods, gpus, weight = pods + n, gpus + g, weight + n * priority
        lost[priority] += n
    return (pods, gpus, weight), lost


def fewest_victims(
    nodes: Sequence[str],
    free: Mapping[str, int],
    candidates: Mapping[str, Sequence[Candidate]],
    pods: Sequence[int],
    gangs: Mapping[str, GangSize] | None = None,
    budget: Budget | None = None,
    fewest: Fewest = Fewest.PODS,
) -> Victims | None:
    """The cheapest victims on these nodes that let pods of these GPU requests fit, the fewest pods or GPUs
    first; None when no choice of candidates does (or none was found within the budget)."""
    gangs = gangs or {}
    budget = budget or Budget()
    demand = sorted((p for p in pods if p > 0), reverse=True)
    room = {n: max(0, free.get(n, 0)) for n in nodes}
    if not demand:
        return Victims((), (0, 0, 0), ())
    if len(demand) > EXACT_PODS or not budget.spend(len(nodes)):
        return _ladder(nodes, room, candidates, demand, gangs)
    search = _Search(room, candidates, gangs, budget, fewest)
    tried = search.cheapest_nodes(nodes, demand[0])
    best: tuple[Cost, tuple[tuple[str, int], ...]] | None = None  # (ranked cost, victims)
    for assignment in _assignments(tried, demand, search.capacity):
        if not budget.spend():
            break
        needs = {n: d - room[n] for n, d in assignment.items() if d > room[n]}
        options = [search.options(n, need) for n, need in needs.items()]
        if any(not o for o in options):
            continue
        floor = max((o[0][0] for o in options), default=(0, 0, 0))
        if best is not None and floor >= best[0]:
            continue
        for combination in product(*options):
            if not budget.spend():
                break
            chosen = tuple(sorted(v for _, picked in combination for v in picked))
            cost = fewest.rank(cost_of(chosen, candidates, gangs)[0])
            if best is None or (cost, chosen) < best:
                best = (cost, chosen)
        if not budget.left or (best is not None and best[0][0] == 0):
            break
    if best is None:
        return _ladder(nodes, room, candidates, demand, gangs)
    return _victims(best[1], candidates, gangs)


def _victims(chosen: Sequence[tuple[str, int]], candidates: Mapping[str, Sequence[Candidate]], gangs: Mapping[str, GangSize]) -> Victims:
    cost, lost = cost_of(chosen, candidates, gangs)
    return Victims(tuple(sorted(chosen)), cost, tuple(sorted(lost.items())))


class Budget:
    """Steps one planner may spend, shared by the searches of every domain it judges: past it, each search
    takes the ladder, so that a plan over thousands of domains stays bounded."""

    def __init__(self, steps: int = BUDGET) -> None:
        self.left = steps

    def spend(self, steps: int = 1) -> bool:
        """Spend steps; False once the budget is gone (the steps are not spent then)."""
        if self.left < steps:
            self.left = 0
            return False
        self.left -= steps
        return True


class _Search:
    def __init__(
        self,
        room: Mapping[str, int],
        candidates: Mapping[str, Sequence[Candidate]],
        gangs: Mapping[str, GangSize],
        budget: Budget,
        fewest: Fewest = Fewest.PODS,
    ) -> None:
        self.room, self.candidates, self.gangs, self.budget, self.fewest = room, candidates, gangs, budget, fewest
        self._options: dict[tuple[str, int], list[tuple[Cost, tuple[tuple[str, int], ...]]]] = {}

    def capacity(self, node: str) -> int:
        return self.room[node] + sum(c.gpus for c in self.candidates.get(node, ()))

    def options(self, node: str, need: int) -> list[tuple[Cost, tuple[tuple[str, int], ...]]]:
        """The node's minimal victim sets that free `need` GPUs, cheapest first (OPTIONS_PER_NODE of them), each
        with its cost as ranked."""
        key = (node, need)
        if key not in self._options:
            found = [
                (self.fewest.rank(cost_of(picked, self.candidates, self.gangs)[0]), picked) for picked in self._minimal_sets(node, need)
            ]
            self._options[key] = sorted(found)[:OPTIONS_PER_NODE]
        return self._options[key]

    def _minimal_sets(self, node: str, need: int) -> Iterator[tuple[tuple[str, int], ...]]:
        """Sets of the node's candidates that free `need` GPUs, none of whose members could be spared. Pods
        alike (GPUs, priority, gang) are interchangeable, so sets are counts of each kind: eight 1-GPU pods
        of one job offer one way to free four GPUs, not seventy."""
        held = self.candidates.get(node, ())
        kinds: dict[tuple[int, int, str | None], list[int]] = {}
        for i, c in enumerate(held):
            kinds.setdefault((c.gpus, c.priority, c.gang), []).append(i)
        keys = list(kinds)
        ways = 1
        for k in keys:
            ways *= len(kinds[k]) + 1
        if ways > SUBSET_LIMIT or not self.budget.spend(ways):
            # Too many to enumerate: the lowest priority first, largest first, as few as cover the need.
            picked: list[int] = []
            freed = 0
            for i in _lowest_first(held):
                if freed >= need:
                    break
                picked.append(i)
                freed += held[i].gpus
            if freed >= need:
                yield tuple((node, i) for i in sorted(picked))
            return
        for counts in product(*(range(len(kinds[k]) + 1) for k in keys)):
            freed = sum(n * k[0] for n, k in zip(counts, keys, strict=True))
            if freed < need or any(n and freed - k[0] >= need for n, k in zip(counts, keys, strict=True)):
                continue  # too little, or one pod of a kind could be spared
            yield tuple(sorted((node, i) for n, k in zip(counts, keys, strict=True) for i in kinds[k][:n]))

    def cheapest_nodes(self, nodes: Sequence[str], largest: int) -> list[str]:
        """The nodes worth trying: all of a small domain; of a larger one, those cheapest to free for its largest pod."""
        usable = [n for n in nodes if self.capacity(n) > 0]
        if len(usable) <= NODES_TRIED:
            return usable

        def alone(node: str) -> Cost:
            need = largest - self.room[node]
            if need <= 0:
                return (0, 0, 0)
            options = self.options(node, need)
            return options[0][0] if options else NEVER

        return sorted(usable, key=lambda n: (alone(n), n))[:NODES_TRIED]


def _assignments(nodes: Sequence[str], demand: Sequence[int], capacity: Callable[[str], int]) -> Iterator[dict[str, int]]:
    """Every way to put the pods (largest first) on the nodes, pods of equal size in node order; GPUs per node."""
    cap = {n: capacity(n) for n in nodes}
    load: dict[str, int] = {}

    def place(i: int, start: int) -> Iterator[dict[str, int]]:
        if i == len(demand):
            yield {n: g for n, g in load.items() if g}
            return
        first = start if i > 0 and demand[i] == demand[i - 1] else 0
        for j in range(first, len(nodes)):
            node = nodes[j]
            if load.get(node, 0) + demand[i] > cap[node]:
                continue
            load[node] = load.get(node, 0) + demand[i]
            yield from place(i + 1, j)
            load[node] -= demand[i]

    yield from place(0, 0)


def _ladder(
    nodes: Sequence[str],
    room: Mapping[str, int],
    candidates: Mapping[str, Sequence[Candidate]],
    demand: Sequence[int],
    gangs: Mapping[str, GangSize],
) -> Victims | None:
    """Each pod, largest first, to the node where it costs the fewest victims (then the tightest fit), a
    node's victims taken lowest priority first, largest first. Pods x nodes steps."""
    have = dict(room)
    ladders = {n: _lowest_first(candidates.get(n, ())) for n in nodes}
    used = dict.fromkeys(nodes, 0)
    chosen: list[tuple[str, int]] = []
    for pod in demand:
        best: tuple[tuple[int, int], str] | None = None
        for node in nodes:
            free, k, ladder = have[node], 0, ladders[node]
            while free < pod and used[node] + k < len(ladder):
                free += candidates[node][ladder[used[node] + k]].gpus
                k += 1
            if free >= pod and (best is None or (k, free - pod) < best[0]):
                best = ((k, free - pod), node)
        if best is None:
            return None
        (k, _), node = best
        for i in ladders[node][used[node] : used[node] + k]:
            chosen.append((node, i))
            have[node] += candidates[node][i].gpus
        used[node] += k
        have[node] -= pod
    return _victims(chosen, candidates, gangs)


def _lowest_first(held: Sequence[Candidate]) -> list[int]:
    """Indices of a node's candidates, lowest priority first, largest first: the order Volcano takes them."""
    return sorted(range(len(held)), key=lambda i: (held[i].priority, -held[i].gpus))
