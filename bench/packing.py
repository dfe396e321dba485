"""Packing over time: replicas of mixed shapes arrive one at a time; how many are placed within tier 1
(one leaf) before the first must wait, against the offline optimum of the same stream.

The optimum is exact: the largest k such that the first k replicas of the stream can all be placed at
once, each within one leaf, on the free GPUs the run started from. Any online scheduler that places k
replicas within their tier before the first wait has produced such a placement, so no scheduler can beat
it. It is found by a search over replica -> leaf and pod -> node assignments with symmetry breaking
(leaves, and nodes, with equal free GPUs are interchangeable) and memoised failures; a step budget
bounds it, and beyond the budget a relaxation (GPU count, and pods too big to share a node) gives an
upper bound instead, reported as such.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import yaml

from bench.fabric import fragmentation
from bench.workload import pod_gpus
from stormtopo.core.topology.tree import Topology
from stormtopo.core.vocabulary import HIGHEST_TIER, MODE
from stormtopo.demo import DEFAULT_KV_CONFIG
from stormtopo.devenv.client import DevCluster, Timeout
from stormtopo.devenv.workloads import Role, filler_pod, stormservice
from stormtopo.kvtransfer import KVModel, crossed_tier, parse_kv_model

# Shapes seen in P/D serving: 1P1D at every tensor-parallel size of one node, a 2P1D, and a prefill
# instance spread over two full nodes. Weights: small and medium replicas are the common case.
SHAPES: dict[str, tuple[Role, ...]] = {
    "1P1D-1": (Role("prefill", 1, 1), Role("decode", 1, 1)),
    "1P1D-2": (Role("prefill", 1, 2), Role("decode", 1, 2)),
    "1P1D-4": (Role("prefill", 1, 4), Role("decode", 1, 4)),
    "1P1D-8": (Role("prefill", 1, 8), Role("decode", 1, 8)),
    "2P1D": (Role("prefill", 2, 2), Role("decode", 1, 4)),
    "mnP1D": (Role("prefill", 1, 8, pod_group_size=2), Role("decode", 1, 8)),  # multi-node prefill
}
WEIGHTS = {"1P1D-1": 2, "1P1D-2": 3, "1P1D-4": 3, "1P1D-8": 2, "2P1D": 2, "mnP1D": 1}
MODES = ("hard", "baseline", "diy")
HARD = {MODE: "hard", HIGHEST_TIER: "1"}


@dataclass(frozen=True)
class Arrival:
    name: str
    shape: str

    @property
    def roles(self) -> tuple[Role, ...]:
        return SHAPES[self.shape]

    @property
    def pod_gpus(self) -> tuple[int, ...]:
        return tuple(pod_gpus(self.roles))


def arrivals(count: int, seed: int) -> list[Arrival]:
    rng = random.Random(seed)
    shapes = list(WEIGHTS)
    return [Arrival(f"rep-{i:03d}", rng.choices(shapes, weights=[WEIGHTS[s] for s in shapes])[0]) for i in range(count)]


# -- the offline optimum ------------------------------------------------------------------------

Leaves = tuple[tuple[int, ...], ...]  # per leaf, its nodes' free GPUs (non-zero, largest first)


@dataclass(frozen=True)
class Optimum:
    replicas: int  # the optimum when `exact`, else an upper bound
    exact: bool
    lower: int  # the longest prefix proven to fit
    seconds: float


class _OutOfBudget(Exception):
    pass


class _PrefixSearch:
    """Can these replicas all be placed at once, each within one leaf? Exhaustive, with a step budget."""

    def __init__(self, budget: int) -> None:
        self.left = budget
        self.failed: set[tuple[int, Leaves]] = set()

    def fits(self, leaves: Leaves, replicas: Sequence[tuple[int, ...]]) -> bool:
        # Biggest first: they have the fewest places to go, so a dead end shows early.
        order = sorted(replicas, key=lambda pods: (sum(pods), max(pods)), reverse=True)
        return self._place(_canonical(leaves), order, 0, sum(sum(p) for p in order))

    def _place(self, leaves: Leaves, replicas: list[tuple[int, ...]], i: int, demand: int) -> bool:
        if i == len(replicas):
            return True
        if demand > sum(sum(leaf) for leaf in leaves) or (i, leaves) in self.failed:
            return False
        self.left -= 1
        if self.left < 0:
            raise _OutOfBudget
        pods = replicas[i]
        for li in _distinct(leaves):
            for rest in _packings(leaves[li], sorted(pods, reverse=True)):
                after = _canonical((*leaves[:li], rest, *leaves[li + 1 :]))
                if self._place(after, replicas, i + 1, demand - sum(pods)):
                    return True
        self.failed.add((i, leaves))
        return False


def _canonical(leaves: Sequence[Sequence[int]]) -> Leaves:
    return tuple(sorted((tuple(sorted((n for n in leaf if n > 0), reverse=True)) for leaf in leaves), reverse=True))


def _distinct(leaves: Leaves) -> list[int]:
    seen: set[tuple[int, ...]] = set()
    out = []
    for i, leaf in enumerate(leaves):
        if leaf not in seen:  # two leaves with the same free GPUs per node are interchangeable
            seen.add(leaf)
            out.append(i)
    return out


def _packings(nodes: tuple[int, ...], pods: list[int]) -> list[tuple[int, ...]]:
    """Every distinct free-GPU state of one leaf after placing all `pods` on its nodes."""
    states = {tuple(sorted(nodes, reverse=True))}
    for pod in pods:
        nxt = set()
        for state in states:
            for n, room in enumerate(state):
                if room >= pod and (n == 0 or state[n - 1] != room):  # equal rooms: try one
                    nxt.add(tuple(sorted((*state[:n], room - pod, *state[n + 1 :]), reverse=True)))
        states = nxt
    return sorted(states)


def relaxation_fits(leaves: Leaves, replicas: Sequence[tuple[int, ...]], node_gpus: int) -> bool:
    """Necessary conditions only: enough GPUs in all, and pods larger than half a node, which never
    share one, have a node each."""
    free = [n for leaf in leaves for n in leaf]
    pods = [p for r in replicas for p in r]
    if sum(pods) > sum(free):
        return False
    for size in range(node_gpus // 2 + 1, node_gpus + 1):
        if sum(1 for p in pods if p >= size) > sum(1 for n in free if n >= size):
            return False
    return all(any(sum(leaf) >= sum(r) for leaf in leaves) for r in replicas)


def offline_optimum(
    topology: Topology, free: Mapping[str, int], stream: Sequence[Arrival], node_gpus: int = 8, budget: int = 200_000
) -> Optimum:
    """The longest prefix of `stream` that fits at once, each replica within one leaf."""
    started = time.monotonic()
    leaves = _canonical([[free.get(n, 0) for n in s.nodes] for s in topology.switches.values() if s.tier == 1])
    lower = 0
    for k in range(1, len(stream) + 1):
        prefix = [a.pod_gpus for a in stream[:k]]
        if not relaxation_fits(leaves, prefix, node_gpus):
            return Optimum(k - 1, lower == k - 1, lower, round(time.monotonic() - started, 2))
        if lower == k - 1:  # still exact so far: search
            try:
                if _PrefixSearch(budget).fits(leaves, prefix):
                    lower = k
                else:
                    return Optimum(k - 1, True, lower, round(time.monotonic() - started, 2))
            except _OutOfBudget:
                pass  # from here on, only the relaxation bounds the optimum
    return Optimum(len(stream), lower == len(stream), lower, round(time.monotonic() - started, 2))


# -- the run on the real control plane ---------------------------------------------------------


@dataclass(frozen=True)
class PodPlacement:
    role: str
    pod: str
    node: str
    gpus: int


@dataclass
class Outcome:
    mode: str
    placed: list[dict[str, Any]] = field(default_factory=list)  # name, shape, tier, pods (in arrival order)
    waited: str | None = None  # the first replica that stayed Pending

    @property
    def within_tier_before_first_miss(self) -> int:
        """Replicas placed within one leaf before the first that waited or crossed a leaf."""
        n = 0
        for r in self.placed:
            if r["tier"] > 1:
                break
            n += 1
        return n


def _manifest(arrival: Arrival, namespace: str, mode: str) -> dict[str, Any]:
    if mode == "diy":  # Volcano's own route: pod annotations, one PodGroup per pod (vc-controller-manager)
        return stormservice(arrival.name, namespace, arrival.roles, volcano_strategy=False, pod_annotations=HARD)
    return stormservice(arrival.name, namespace, arrival.roles, annotations=HARD if mode == "hard" else {})


def run_mode(
    client: DevCluster,
    topology: Topology,
    stream: Sequence[Arrival],
    mode: str,
    namespace: str,
    wait: float,
    free: Mapping[str, int] | None = None,
) -> Outcome:
    """Create the replicas one at a time, each once the previous is bound, until one stays Pending.
    `free`: the free GPUs per node at the start; each replica then records whether one node had room
    for all of it when it arrived (the node-level optimum bench-quick's placement run measures against)."""
    outcome = Outcome(mode)
    room = dict(free or {})
    for arrival in stream:
        fits_one_node = any(gpus >= sum(arrival.pod_gpus) for gpus in room.values()) if free is not None else None
        client.create(_manifest(arrival, namespace, mode))
        selector = f"storm-service-name={arrival.name}"
        try:
            pods = client.bound_pods(namespace, selector, len(arrival.pod_gpus), timeout=wait)
        except Timeout:
            outcome.waited = arrival.name
            break
        gpus = {r.name: r.gpus for r in arrival.roles}
        placements = [
            PodPlacement(role, p["metadata"]["name"], p["spec"]["nodeName"], gpus.get(role, 0))
            for p in sorted(pods, key=lambda p: str(p["metadata"]["name"]))
            for role in [str(p["metadata"]["labels"].get("role", "?"))]
        ]
        span = topology.span(pp.node for pp in placements)
        for pp in placements:
            room[pp.node] = room.get(pp.node, 0) - pp.gpus
        outcome.placed.append(
            {
                "name": arrival.name,
                "shape": arrival.shape,
                "tier": crossed_tier(span, topology.tiers),
                "fits_one_node": fits_one_node,
                "pods": [asdict(pp) for pp in placements],
            }
        )
    return outcome


def scenario(
    client: DevCluster, topology: Topology, stream: Sequence[Arrival], label: str, wait: float, modes: Sequence[str] = MODES
) -> dict[str, Any]:
    """One starting state: the optimum from the free GPUs now, then every mode from the same state."""
    free, _ = client.gpu_capacity()
    optimum = offline_optimum(topology, free, stream)
    out: dict[str, Any] = {"free_gpus": sum(free.values()), "optimum": asdict(optimum), "modes": {}}
    for mode in modes:
        ns = f"pack-{label}-{mode}"
        client.create_namespace(ns)
        outcome = run_mode(client, topology, stream[: optimum.replicas + 1], mode, ns, wait, free)
        placed = len(outcome.placed)
        within = outcome.within_tier_before_first_miss
        fitting = [r for r in outcome.placed[:within] if r["fits_one_node"]]
        out["modes"][mode] = {
            "placed_before_first_wait": placed,
            "within_tier1_before_first_miss": within,
            "crossed_leaf": sum(1 for r in outcome.placed if r["tier"] > 1),
            "first_waiting": outcome.waited,
            "vs_optimal": round(within / optimum.replicas, 4) if optimum.replicas else None,
            # Of the replicas before the first miss that one node could hold when they arrived, those on one node.
            "fit_one_node": len(fitting),
            "on_one_node": sum(1 for r in fitting if r["tier"] == 0),
            "replicas": outcome.placed,
        }
        client.delete_namespace(ns, wait=120)
    return out


def run(
    client: DevCluster,
    topology: Topology,
    region: Sequence[str] | None = None,
    seed: int = 29,
    wait: float = 4.0,
    modes: Sequence[str] = MODES,
) -> dict[str, Any]:
    """Both starting states, empty and fragmented, on `region` (default: every node; the others are
    filled whole, so the exact optimum stays small enough to compute), for each of `modes`."""
    started = time.monotonic()
    nodes = sorted(topology.nodes)
    inside = set(region if region is not None else nodes)
    stream = arrivals(200, seed)
    client.create_namespace("pack-fill")
    fillers = 0
    for node in nodes:
        if node not in inside:
            client.create(filler_pod(f"full-{node}", "pack-fill", node, topology.nodes[node].gpus))
            fillers += 1
    if fillers:
        client.bound_pods("pack-fill", "stormtopo.io/filler=true", fillers, timeout=120)
    out: dict[str, Any] = {"nodes": len(inside), "leaves": len({topology.nodes[n].switch for n in inside}), "seed": seed}
    out["tree"] = tree_of(topology)  # the fabric, for the KV-transfer simulation (bench/kvflow.py)
    out["empty"] = scenario(client, topology, stream, "empty", wait, modes)
    used = fragmentation(sorted(inside), seed=7)
    for node, gpus in used.items():
        client.create(filler_pod(f"busy-{node}", "pack-fill", node, gpus))
    client.bound_pods("pack-fill", "stormtopo.io/filler=true", fillers + len(used), timeout=120)
    out["fragmented"] = scenario(client, topology, stream, "frag", wait, modes)
    client.delete_namespace("pack-fill", wait=120)
    for mode in modes:
        out["packing_vs_optimal" if mode == "hard" else f"{mode}_packing_vs_optimal"] = packing_vs_optimal(out, mode)
    if "hard" in modes:
        out["one_node_where_one_fits"] = one_node_where_one_fits(out, "hard")
        kv = parse_kv_model(yaml.safe_load(DEFAULT_KV_CONFIG.read_text()))
        out["kv_time_vs_node_optimal"] = kv_time_vs_node_optimal(out, "hard", kv)
    out["seconds"] = round(time.monotonic() - started, 1)
    return out


def tree_of(topology: Topology) -> dict[str, Any]:
    return {
        "switches": {s.name: {"tier": s.tier, "parent": s.parent} for s in topology.switches.values()},
        "nodes": {n.name: {"switch": n.switch, "gpus": n.gpus} for n in topology.nodes.values()},
    }


def packing_vs_optimal(out: Mapping[str, Any], mode: str) -> float | None:
    """Replicas placed within tier before the first wait, summed over both starting states, / the optimum."""
    optimum = sum(out[s]["optimum"]["replicas"] for s in ("empty", "fragmented"))
    achieved = sum(out[s]["modes"][mode]["within_tier1_before_first_miss"] for s in ("empty", "fragmented"))
    return round(achieved / optimum, 4) if optimum else None


def one_node_where_one_fits(out: Mapping[str, Any], mode: str) -> float | None:
    """Of the replicas placed before the first wait that one node could hold when they arrived (both
    starting states), the fraction placed on one node: the node-level optimum of bench-quick's placement
    run, per arrival. It is not reachable together with the packing optimum where the empty nodes are
    too few for both (BENCHMARKS.md)."""
    fit = sum(out[s]["modes"][mode].get("fit_one_node", 0) for s in ("empty", "fragmented"))
    one = sum(out[s]["modes"][mode].get("on_one_node", 0) for s in ("empty", "fragmented"))
    return round(one / fit, 4) if fit else None


def kv_time_vs_node_optimal(out: Mapping[str, Any], mode: str, kv: KVModel) -> float | None:
    """bench-quick's `hard_kv_time_vs_node_optimal` over this run: the modeled KV-transfer time of the
    replicas placed before the first wait (both starting states), against each on one node where one
    node could hold it when it arrived, else within one leaf."""
    achieved, optimal = [], []
    for start in ("empty", "fragmented"):
        result = out[start]["modes"][mode]
        for r in result["replicas"][: result["within_tier1_before_first_miss"]]:
            achieved.append(kv.seconds(r["tier"]))
            optimal.append(kv.seconds(0 if r["fits_one_node"] else 1))
    return round(statistics.fmean(achieved) / statistics.fmean(optimal), 4) if optimal else None


@dataclass(frozen=True)
class Size:
    fabric: tuple[int, int, int]  # spines x leaves per spine x nodes per leaf
    region: str | None  # the switch whose nodes the replicas may use; None: every node
    wait: float  # seconds a replica may take to bind before it counts as waiting

    def nodes(self, topology: Topology) -> list[str] | None:
        return topology.nodes_under(self.region) if self.region else None


QUICK = Size((2, 2, 4), None, 5.0)  # 16 nodes, all of them: about a minute
FULL = Size((4, 8, 8), "spine-0", 8.0)  # the full bench's 256 nodes; the 64 under one spine are used


SIZES = {"quick": QUICK, "full": FULL}


def standalone(size_name: str, node_tier: bool = False) -> dict[str, Any]:
    """`python -m bench packing`: only this benchmark, on its own cluster."""
    import tempfile
    from pathlib import Path

    from bench.fabric import fabric_yaml
    from stormtopo.core.topology.fabric import parse_topology
    from stormtopo.devenv import cluster

    size = SIZES[size_name]
    description = fabric_yaml(*size.fabric)
    topology = parse_topology(description)
    state = Path(tempfile.mkdtemp(prefix="stormtopo-packing-"))
    (state / "fabric.yaml").write_text(description)
    operator_args = ("--node-tier",) if node_tier else ()
    cluster.up(state, state / "fabric.yaml", vc_controllers=("queue-controller", "pg-controller"), timeout=300, operator_args=operator_args)
    try:
        modes = ("hard",) if node_tier else MODES
        return run(DevCluster(state), topology, size.nodes(topology), wait=size.wait, modes=modes)
    finally:
        cluster.down(state)
