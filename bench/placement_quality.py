"""Placement quality: which tier each replica's pods end up spanning, against the offline optimum."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from bench.workload import Request
from stormtopo.core.packing import best_tier
from stormtopo.core.topology.tree import Topology
from stormtopo.core.vocabulary import HIGHEST_TIER, MODE
from stormtopo.devenv.client import DevCluster, Timeout
from stormtopo.devenv.workloads import stormservice
from stormtopo.kvtransfer import KVModel, crossed_tier

MODES: dict[str, dict[str, str]] = {
    "baseline": {},
    "hard": {MODE: "hard", HIGHEST_TIER: "1"},
    "soft": {MODE: "soft"},
    "diy": {},  # Volcano's own pod annotations, read by vc-controller-manager's PodGroup controller
}
DIY_POD_ANNOTATIONS = {MODE: "hard", HIGHEST_TIER: "1"}


@dataclass(frozen=True)
class ReplicaResult:
    name: str
    shape: str
    optimum: int | None  # lowest tier whose one domain had room for the whole gang when it was created
    achieved: int | None  # tier the placed pods span (0: one node); None: stayed Pending


def replica_tier(topology: Topology, nodes: list[str]) -> int:
    return crossed_tier(topology.span(nodes), topology.tiers)


def run_mode(
    client: DevCluster, topology: Topology, requests: list[Request], mode: str, namespace: str, wait: float
) -> list[ReplicaResult]:
    results = []
    for req in requests:
        free, _ = client.gpu_capacity()
        optimum = best_tier(topology, free, req.pod_gpus)
        optimum = 0 if optimum is not None and _fits_one_node(free, req.pod_gpus) else optimum
        if mode == "diy":  # no gang strategy: the PodGroup controller makes one PodGroup per pod from its annotations
            manifest = stormservice(req.name, namespace, req.roles, volcano_strategy=False, pod_annotations=DIY_POD_ANNOTATIONS)
        else:
            manifest = stormservice(req.name, namespace, req.roles, annotations=MODES[mode])
        client.create(manifest)
        try:
            pods = client.bound_pods(namespace, f"storm-service-name={req.name}", len(req.pod_gpus), timeout=wait)
            achieved: int | None = replica_tier(topology, [p["spec"]["nodeName"] for p in pods])
        except Timeout:
            achieved = None
            client.delete_stormservice(namespace, req.name)  # a pending gang must not land later, unmeasured
        results.append(ReplicaResult(req.name, req.shape, optimum, achieved))
    return results


def _fits_one_node(free: dict[str, int], pods: list[int]) -> bool:
    return any(room >= sum(pods) for room in free.values())


def summarize(results: list[ReplicaResult], kv: KVModel) -> dict[str, Any]:
    placed = [r for r in results if r.achieved is not None]
    feasible_tier1 = [r for r in results if r.optimum is not None and r.optimum <= 1]
    within_tier1 = [r for r in feasible_tier1 if r.achieved is not None and r.achieved <= 1]
    tiers: dict[str, int] = {}
    for r in results:
        key = "pending" if r.achieved is None else f"tier{r.achieved}"
        tiers[key] = tiers.get(key, 0) + 1
    both = [r for r in placed if r.optimum is not None]
    achieved_kv = [kv.seconds(r.achieved) for r in both if r.achieved is not None]
    optimal_kv = [kv.seconds(r.optimum) for r in both if r.optimum is not None]
    # HyperNode tiers start at 1: a gang that fits on one node is still "within tier 1" to Volcano.
    achieved_hn = [kv.seconds(max(1, r.achieved)) for r in both if r.achieved is not None]
    optimal_hn = [kv.seconds(max(1, r.optimum)) for r in both if r.optimum is not None]
    return {
        "replicas": len(results),
        "placed": len(placed),
        "feasible_within_tier1": len(feasible_tier1),
        "tier1_fraction": round(len(within_tier1) / len(feasible_tier1), 4) if feasible_tier1 else None,
        "tier_distribution": dict(sorted(tiers.items())),
        "kv_ms_median": round(statistics.median(achieved_kv) * 1000, 2) if achieved_kv else None,
        "kv_time_vs_optimal": round(statistics.fmean(achieved_hn) / statistics.fmean(optimal_hn), 4) if optimal_hn else None,
        "kv_time_vs_node_optimal": round(statistics.fmean(achieved_kv) / statistics.fmean(optimal_kv), 4) if optimal_kv else None,
        "at_optimum_fraction": round(sum(1 for r in both if r.achieved == r.optimum) / len(both), 4) if both else None,
    }
