"""What a scheduler that knew the whole stream could do in the packing bench's full run (issue 21): the
longest prefix of the stream placed within leaves, in arrival order, with at most `misses` replicas off one
node although one node could hold them when they arrived (the reference of `kv_time_vs_node_optimal`).

`packing_vs_optimal` counts the prefix placed within leaves, against the offline optimum that ignores nodes;
`kv_time_vs_node_optimal` counts the replicas off one node where one node could hold them. Whether both
targets can hold at once on a stream is this search's answer with `misses` 0 or 1. It is exhaustive: replicas
in order, each either on one node (each distinct amount of free GPUs of each distinct leaf tried) or, where no
node holds it or a miss is left, spread over one leaf (every distinct packing); states are leaves of free
GPUs per node, canonical, so equal leaves and equal nodes are tried once, and a state that failed is not
tried again. A step budget per prefix length bounds it; past the budget the answer is a lower bound (`exact` false).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from bench.fabric import fabric_yaml, fragmentation
from bench.leaf_optimum import most_within_leaves
from bench.packing import FULL, Leaves, _canonical, _OutOfBudget, _packings, arrivals

NODE_GPUS = 8  # the bench's nodes


@dataclass(frozen=True)
class Hindsight:
    misses: int  # replicas allowed off one node where one node could hold them when they arrived
    replicas: int  # the longest prefix found
    exact: bool  # false: the search ran out of steps at replicas + 1, which may still be possible
    optimum: int | None  # the longest prefix with nodes ignored (each replica within one leaf): a ceiling
    schedule: tuple[str, ...]  # per replica: "node <free before>" or "leaf <free after, per node>"
    steps: int
    seconds: float


class _Search:
    def __init__(self, stream: Sequence[tuple[int, ...]], node_gpus: int) -> None:
        self.stream = stream
        self.node_gpus = node_gpus
        self.left = 0  # steps left for the target being searched
        self.steps = 0
        # (replica index, misses left, state) -> the shortest target it failed for: it fails for longer ones too
        self.failed: dict[tuple[int, int, Leaves], int] = {}
        self.path: list[str] = []

    def fits(self, state: Leaves, target: int, misses: int, budget: int) -> bool:
        self.path = []
        self.left = budget
        return self._place(state, 0, target, misses)

    def _place(self, state: Leaves, i: int, target: int, misses: int) -> bool:
        if i == target:
            return True
        key = (i, misses, state)
        if self.failed.get(key, target + 1) <= target:
            return False
        self.left -= 1
        self.steps += 1
        if self.left < 0:
            raise _OutOfBudget
        pods = self.stream[i]
        total = sum(pods)
        free = [n for leaf in state for n in leaf]
        if not _may_fit(state, self.stream[i:target], self.node_gpus):
            self.failed[key] = target
            return False
        one_node_fits = any(n >= total for n in free)
        tried: set[tuple[int, ...]] = set()
        for li, leaf in enumerate(state):
            if leaf in tried:
                continue
            tried.add(leaf)
            for room in sorted({n for n in leaf if n >= total}):  # best fit first
                ni = leaf.index(room)
                after = tuple(sorted((*leaf[:ni], room - total, *leaf[ni + 1 :]), reverse=True))
                self.path.append(f"node {room}")
                if self._place(_canonical((*state[:li], after, *state[li + 1 :])), i + 1, target, misses):
                    return True
                self.path.pop()
            if one_node_fits and misses == 0:
                continue
            for after in _packings(leaf, sorted(pods, reverse=True)):
                self.path.append(f"leaf {after}")
                if self._place(_canonical((*state[:li], after, *state[li + 1 :])), i + 1, target, misses - int(one_node_fits)):
                    return True
                self.path.pop()
        self.failed[key] = target
        return False


def _may_fit(state: Leaves, replicas: Sequence[tuple[int, ...]], node_gpus: int) -> bool:
    """Necessary conditions for placing `replicas` from `state` (nodes of `node_gpus` GPUs): GPUs enough; a
    node each for the pods larger than half a node (no two share one); and for each k, the replicas of k or
    more whole-node pods no more than the disjoint sets of k empty nodes in one leaf."""
    free = [n for leaf in state for n in leaf]
    pods = [p for r in replicas for p in r]
    if sum(pods) > sum(free) or sum(1 for p in pods if 2 * p > node_gpus) > sum(1 for n in free if 2 * n > node_gpus):
        return False
    whole = [sum(1 for p in r if p >= node_gpus) for r in replicas]
    empty = [sum(1 for n in leaf if n >= node_gpus) for leaf in state]
    return all(sum(1 for w in whole if w >= k) <= sum(e // k for e in empty) for k in set(whole) if k >= 2)


def prefix_optimum(leaves: Sequence[Sequence[int]], stream: Sequence[tuple[int, ...]]) -> int | None:
    """The longest prefix of `stream` that fits at once, each replica within one leaf, nodes ignored (exact,
    bench/leaf_optimum.py); None where pod sizes do not divide each other, which that method needs."""
    try:
        return next(k for k in range(len(stream) + 1) if k == len(stream) or most_within_leaves(leaves, stream[: k + 1]) <= k)
    except ValueError:
        return None


def longest_prefix(
    leaves: Sequence[Sequence[int]], stream: Sequence[tuple[int, ...]], misses: int, budget: int = 1_000_000, node_gpus: int = NODE_GPUS
) -> Hindsight:
    """The longest prefix of `stream` placed in order within leaves with at most `misses` replicas off one
    node where one could hold them when they came. `budget`: search steps for each prefix length; it stops
    at the optimum with nodes ignored, which no schedule passes."""
    if any(free > node_gpus for leaf in leaves for free in leaf):
        raise ValueError(f"a node with more than {node_gpus} GPUs free: pass node_gpus, the nodes' size")
    started = time.monotonic()
    search = _Search(stream, node_gpus)
    state = _canonical(leaves)
    optimum = prefix_optimum(leaves, stream)
    best: tuple[str, ...] = ()
    exact = True
    for target in range(1, (len(stream) if optimum is None else optimum) + 1):
        try:
            if not search.fits(state, target, misses, budget):
                break
        except _OutOfBudget:
            exact = False
            break
        best = tuple(search.path)
    return Hindsight(misses, len(best), exact, optimum, best, search.steps, round(time.monotonic() - started, 1))


def full_run_leaves(start: str) -> list[list[int]]:
    """The full packing run's 64 nodes (the 8 leaves under spine-0), empty or fragmented as the bench makes them."""
    from stormtopo.core.topology.fabric import parse_topology

    topology = parse_topology(fabric_yaml(*FULL.fabric))
    inside = topology.nodes_under(FULL.region) if FULL.region else sorted(topology.nodes)
    used = fragmentation(sorted(inside), seed=7) if start == "fragmented" else {}
    leaves: dict[str, list[int]] = {}
    for node in sorted(inside):
        leaves.setdefault(topology.nodes[node].switch, []).append(topology.nodes[node].gpus - used.get(node, 0))
    return list(leaves.values())


def search(
    seeds: Sequence[int],
    misses: Sequence[int] = (0,),
    starts: Sequence[str] = ("fragmented", "empty"),
    budget: int = 1_000_000,
    keep: Callable[[dict[str, object]], object] | None = None,
) -> dict[str, object]:
    """`python -m bench hindsight`: per stream seed and start, the longest prefix for each number of
    replicas allowed off one node. `keep` is given what was found after each stream (a long run keeps it)."""
    streams: dict[int, dict[str, list[dict[str, object]]]] = {}
    out: dict[str, object] = {"budget": budget, "streams": streams}
    for seed in seeds:
        stream = [a.pod_gpus for a in arrivals(80, seed)]
        found: dict[str, list[dict[str, object]]] = {}
        for start in starts:
            found[start] = [asdict(longest_prefix(full_run_leaves(start), stream, m, budget)) for m in misses]
            for row in found[start]:
                found_text = f"{row['replicas']} replicas{'' if row['exact'] else ' or more'}"
                print(f"seed {seed}, {start}: misses <= {row['misses']}: {found_text} ({row['seconds']} s)", file=sys.stderr)
        streams[seed] = found
        if keep:
            keep(out)
    return out
