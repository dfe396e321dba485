"""The benchmarks that share one cluster of the local control plane: `python -m bench quick` (make bench-quick),
`full` (256 nodes) and `large` (placement quality on 1,024 nodes); and `expressions` on its own cluster.

Every number is a ratio against a baseline measured in the same run (the machine is shared and noisy).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench import churn, critical_path, expressions, packing, placement_quality
from bench.fabric import fabric_yaml, fragmentation
from bench.workload import stream
from stormtopo.core.topology.fabric import parse_topology
from stormtopo.core.topology.tree import Topology
from stormtopo.demo import DEFAULT_KV_CONFIG
from stormtopo.devenv import cluster
from stormtopo.devenv.client import DevCluster
from stormtopo.devenv.workloads import filler_pod, stormservice
from stormtopo.kvtransfer import parse_kv_model

LARGE = (8, 8, 16)  # 1,024 nodes


def run(quick: bool, large: bool = False, node_tier: bool = False) -> dict[str, Any]:
    """Every benchmark on 256 nodes (16 with `quick`); with `large`, placement quality only, on 1,024.
    `node_tier`: the operator keeps the node tier's short list (--node-tier, issue 21)."""
    kv = parse_kv_model(yaml.safe_load(DEFAULT_KV_CONFIG.read_text()))
    # spines x leaves per spine x nodes per leaf
    shape = LARGE if large else (2, 2, 4) if quick else (4, 8, 8)
    count = 10 if quick else 120 if large else 60
    description = fabric_yaml(*shape)
    topology = parse_topology(description)
    state = Path(tempfile.mkdtemp(prefix="stormtopo-bench-"))
    topo_file = state / "fabric.yaml"
    topo_file.write_text(description)
    started = time.monotonic()
    operator_args = ("--node-tier",) if node_tier else ()
    controllers = ("queue-controller", "pg-controller")
    cluster.up(state, topo_file, vc_controllers=controllers, timeout=300 if large else 120, operator_args=operator_args)
    out: dict[str, Any] = {"quick": quick, "large": large, "node_tier": node_tier, "nodes": len(topology.nodes)}
    try:
        client = DevCluster(state)
        if not large:  # before the fillers: it starts from an empty cluster, then fragments it itself
            size = packing.QUICK if quick else packing.FULL
            out["packing"] = packing.run(client, topology, size.nodes(topology), wait=size.wait)
        client.create_namespace("bench-fill")
        used = fragmentation(sorted(topology.nodes), seed=7)
        for node, gpus in used.items():
            client.create(filler_pod(f"busy-{node}", "bench-fill", node, gpus))
        client.bound_pods("bench-fill", "stormtopo.io/filler=true", len(used), timeout=120)
        requests = stream(count, seed=11)
        quality: dict[str, Any] = {}
        for mode in ("baseline", "hard") if quick else ("baseline", "hard", "soft", "diy"):
            ns = f"bench-{mode}"
            client.create_namespace(ns)
            results = placement_quality.run_mode(client, topology, requests, mode, ns, wait=4.0 if quick else 8.0)
            quality[mode] = placement_quality.summarize(results, kv)
            quality[mode]["replicas_detail"] = [r.__dict__ for r in results]
            client.delete_namespace(ns, wait=120)
        out["placement"] = quality
        if large:
            return out

        client.create_namespace("bench-cp")
        out["critical_path"] = critical_path.podgroup_vs_first_pod(client, "bench-cp", samples=3 if quick else 10)
        client.create(stormservice("lat-svc", "bench-cp", annotations=critical_path.HARD))
        roleset = client.wait(lambda: client.rolesets("bench-cp", "lat-svc"), 30, "the latency StormService's RoleSet")[0]
        if not quick:
            client.create_namespace("bench-expr")
            out["expressions"] = expressions.compare(client, "bench-expr", replicas=16, rounds=3)
        out["webhook"] = critical_path.webhook_latency(client, "bench-cp", "lat-svc", roleset["metadata"]["name"], 150 if quick else 1000)
        client.create_namespace("bench-churn")
        out["churn"] = churn.pending_podgroup_writes(client, "bench-churn", seconds=20.0 if quick else 40.0)
        if quick and not node_tier:
            client.delete_namespace("bench-churn", wait=120)
            out["node_tier"] = node_tier_phase(client, state, topology, requests, kv)
    finally:
        cluster.down(state)
        out["seconds"] = round(time.monotonic() - started, 1)
    return out


def node_tier_phase(client: DevCluster, state: Path, topology: Topology, requests: list[Any], kv: Any) -> dict[str, Any]:
    """bench-quick's last part: the operator restarted with --node-tier (issue 21), then packing (hard
    only, from the empty and the fragmented start) and placement quality (hard) again, on the same
    cluster and streams as above; the operator is left as it is (the cluster goes down next)."""
    started = time.monotonic()
    cluster.stop_component(state, "operator")
    cluster.start_operator(state, extra=("--node-tier",))
    client.delete_namespace("bench-fill", wait=120)  # packing starts from an empty cluster
    packed = packing.run(client, topology, packing.QUICK.nodes(topology), wait=packing.QUICK.wait, modes=("hard",))
    client.create_namespace("bench-fill")
    used = fragmentation(sorted(topology.nodes), seed=7)
    for node, gpus in used.items():
        client.create(filler_pod(f"busy-{node}", "bench-fill", node, gpus))
    client.bound_pods("bench-fill", "stormtopo.io/filler=true", len(used), timeout=120)
    client.create_namespace("bench-nt-hard")
    results = placement_quality.run_mode(client, topology, requests, "hard", "bench-nt-hard", wait=4.0)
    hard = placement_quality.summarize(results, kv)
    hard["replicas_detail"] = [r.__dict__ for r in results]
    return {"packing": packed, "placement": {"hard": hard}, "seconds": round(time.monotonic() - started, 1)}


def expressions_at_scale(shape: tuple[int, int, int] = (8, 8, 16), replicas: int = 32, rounds: int = 3) -> dict[str, Any]:
    state = Path(tempfile.mkdtemp(prefix="stormtopo-expr-"))
    (state / "fabric.yaml").write_text(fabric_yaml(*shape))
    cluster.up(state, state / "fabric.yaml", timeout=300)
    try:
        client = DevCluster(state)
        client.create_namespace("expr")
        return {"nodes": shape[0] * shape[1] * shape[2], **expressions.compare(client, "expr", replicas=replicas, rounds=rounds)}
    finally:
        cluster.down(state)


def headline(out: dict[str, Any]) -> dict[str, Any]:
    p = out["placement"]
    return {
        "hard_tier1_fraction": p["hard"]["tier1_fraction"],
        "baseline_tier1_fraction": p["baseline"]["tier1_fraction"],
        "hard_kv_time_vs_optimal": p["hard"]["kv_time_vs_optimal"],
        "baseline_kv_time_vs_optimal": p["baseline"]["kv_time_vs_optimal"],
        "hard_kv_time_vs_node_optimal": p["hard"]["kv_time_vs_node_optimal"],
        "podgroup_ready_vs_first_pod": out["critical_path"]["ratio_median"],
        "webhook_p99_ratio": out["webhook"]["p99_ratio"],
        "webhook_p50_ratio": out["webhook"]["p50_ratio"],
        "pending_podgroup_writes_vs_baseline": out["churn"]["ratio"],
        "packing_vs_optimal": out["packing"]["packing_vs_optimal"],
        "baseline_packing_vs_optimal": out["packing"]["baseline_packing_vs_optimal"],
        "diy_packing_vs_optimal": out["packing"]["diy_packing_vs_optimal"],
        **_node_tier_headline(out.get("node_tier")),
        "nodes": out["nodes"],
        "seconds": out["seconds"],
    }


def _node_tier_headline(phase: dict[str, Any] | None) -> dict[str, Any]:
    if not phase:
        return {}
    hard = phase["placement"]["hard"]
    return {
        "node_tier_hard_kv_time_vs_node_optimal": hard["kv_time_vs_node_optimal"],
        "node_tier_packing_vs_optimal": phase["packing"]["packing_vs_optimal"],
        "node_tier_packing_one_node_where_one_fits": phase["packing"].get("one_node_where_one_fits"),
        "node_tier_hard_tier1_fraction": hard["tier1_fraction"],
    }
