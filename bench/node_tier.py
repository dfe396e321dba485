"""The node tier on the real control plane at 1,024 nodes (issue 21), beside the simulator's figures: the
same cluster, fragmented as the simulator's is (bench.fabric.fragmentation, seed 7), with the operator run
without and with --node-tier, and Volcano as shipped here and with hypernode.binpack.normal-pod.enable off
(RUNS: leaf only as shipped first and last, as the machine is shared and drifts).

For each layout, a seeded stream of hard tier-1 StormServices (bench/workload.py's shapes), each created once
the previous one is bound, then the same stream without a topology (plain AIBrix + Volcano gangs). What is
read:

- where each replica landed against the offline optimum of its moment (one node where one node held it:
  `kv_time_vs_node_optimal`, as bench-quick reports it);
- Volcano's own time in its allocate action, from vc-scheduler's
  `volcano_action_scheduling_latency_milliseconds{action="allocate"}`: the sum over every session while
  the stream ran, per replica placed. Idle sessions (every 200 ms here) count in both layouts alike.

    python -m bench node-tier [--replicas 24] [--plain 12]      # about 10 minutes on 2 cores
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from bench import placement_quality
from bench.fabric import fabric_yaml, fragmentation
from bench.workload import Request, stream
from stormtopo.core.topology.fabric import parse_topology
from stormtopo.core.topology.tree import Topology
from stormtopo.demo import DEFAULT_KV_CONFIG
from stormtopo.devenv import cluster
from stormtopo.devenv.client import DevCluster
from stormtopo.devenv.workloads import filler_pod
from stormtopo.kvtransfer import KVModel, parse_kv_model

# (layout, Volcano setting): leaf only as shipped first and last (the machine drifts), the rest between.
RUNS = (("leaf", "shipped"), ("node-tier", "shipped"), ("node-tier", "normal-pod-off"), ("leaf", "normal-pod-off"), ("leaf", "shipped"))
NORMAL_POD_OFF = "      hypernode.binpack.normal-pod.enable: false\n"
SHAPE = (8, 8, 16)  # spines x leaves per spine x nodes per leaf: 1,024 nodes, the simulator's first size
ALLOCATE = re.compile(r'^volcano_action_scheduling_latency_milliseconds_(sum|count)\{action="allocate"\} (\S+)$', re.MULTILINE)


def allocate_ms(port: int) -> tuple[float, float]:
    """vc-scheduler's allocate action so far: (milliseconds in all, sessions)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    found = dict(ALLOCATE.findall(text))
    return float(found.get("sum", 0.0)), float(found.get("count", 0.0))


def measure(
    client: DevCluster, topology: Topology, port: int, requests: list[Request], mode: str, namespace: str, kv: KVModel
) -> dict[str, Any]:
    client.create_namespace(namespace)
    (ms0, sessions0), started = allocate_ms(port), time.monotonic()
    results = placement_quality.run_mode(client, topology, requests, mode, namespace, wait=20.0)
    ms1, sessions1 = allocate_ms(port)
    seconds = time.monotonic() - started
    client.delete_namespace(namespace, wait=300)
    summary = placement_quality.summarize(results, kv)
    placed = summary["placed"]
    return {
        **summary,
        "allocate_ms": round(ms1 - ms0, 1),
        "sessions": int(sessions1 - sessions0),
        "allocate_ms_per_replica": round((ms1 - ms0) / placed, 2) if placed else None,
        "allocate_ms_per_session": round((ms1 - ms0) / (sessions1 - sessions0), 3) if sessions1 > sessions0 else None,
        "seconds": round(seconds, 1),
        "replicas_detail": [r.__dict__ for r in results],
    }


def node_tier_listed(client: DevCluster) -> int:
    return sum(1 for h in client.hypernodes() if int(h["spec"]["tier"]) == 0)


def run(replicas: int, plain: int) -> dict[str, Any]:
    description = fabric_yaml(*SHAPE)
    topology = parse_topology(description)
    kv = parse_kv_model(yaml.safe_load(DEFAULT_KV_CONFIG.read_text()))
    state = Path(tempfile.mkdtemp(prefix="stormtopo-node-tier-"))
    (state / "fabric.yaml").write_text(description)
    started = time.monotonic()
    cluster.up(state, state / "fabric.yaml", timeout=600)
    out: dict[str, Any] = {"nodes": len(topology.nodes), "replicas": replicas, "plain": plain, "runs": []}
    try:
        client = DevCluster(state)
        port = json.loads((state / "cluster.json").read_text())["ports"]["scheduler_metrics"]
        client.create_namespace("nt-fill")
        used = fragmentation(sorted(topology.nodes), seed=7)
        for node, gpus in used.items():
            client.create(filler_pod(f"busy-{node}", "nt-fill", node, gpus))
        client.bound_pods("nt-fill", "stormtopo.io/filler=true", len(used), timeout=600)
        hard, plain_requests = stream(replicas, seed=11), stream(plain, seed=13)
        for i, (layout, setting) in enumerate(RUNS):
            scheduler_setting(state, setting)
            cluster.stop_component(state, "operator")
            cluster.start_operator(state, extra=("--node-tier",) if layout == "node-tier" else ())
            if layout == "node-tier":
                client.wait(lambda: node_tier_listed(client) > 0, 120, "the node tier's first list")
            else:  # the operator without the flag leaves the last list: the tree as rendered, without it
                apply = ["topology", "apply", "-f", str(state / "fabric.yaml"), "--kubeconfig", str(state / "kubeconfig")]
                subprocess.run([sys.executable, "-m", "stormtopo.cli", *apply], check=True, capture_output=True)
                client.wait(lambda: node_tier_listed(client) == 0, 60, "the tree without the node tier")
            run_out = {
                "layout": layout,
                "setting": setting,
                "tier0_hypernodes": node_tier_listed(client),
                # Names differ per run: AIBrix v0.7.0 gives no RoleSet to a StormService named as one elsewhere.
                "hard": measure(client, topology, port, named(hard, f"h{i}-"), "hard", f"nt-hard-{i}", kv),
                "plain": measure(client, topology, port, named(plain_requests, f"p{i}-"), "baseline", f"nt-plain-{i}", kv),
            }
            out["runs"].append(run_out)
            shown = ("layout", "setting", "tier0_hypernodes")
            print(json.dumps({k: v for k, v in run_out.items() if k in shown} | summary_of(run_out)), flush=True)
        out["ratios"] = ratios(out["runs"])
    finally:
        cluster.down(state)
        out["seconds"] = round(time.monotonic() - started, 1)
    return out


def named(requests: list[Request], prefix: str) -> list[Request]:
    return [replace(r, name=prefix + r.name) for r in requests]


def summary_of(run_out: dict[str, Any]) -> dict[str, Any]:
    keys = ("placed", "kv_time_vs_node_optimal", "allocate_ms_per_replica", "allocate_ms_per_session", "seconds")
    return {mode: {k: run_out[mode][k] for k in keys} for mode in ("hard", "plain")}


def ratios(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Allocate time per replica of each run over the mean of the leaf-only runs as shipped (the first and
    the last), with a topology and without; and node-level placement."""
    leaf = [r for r in runs if (r["layout"], r["setting"]) == ("leaf", "shipped")]

    def ratio(run: dict[str, Any], mode: str) -> float | None:
        base = [r[mode]["allocate_ms_per_replica"] for r in leaf if r[mode]["allocate_ms_per_replica"]]
        value = run[mode]["allocate_ms_per_replica"]
        return round(value / (sum(base) / len(base)), 3) if base and value else None

    return {
        f"{r['layout']}/{r['setting']}": {
            "allocate_with_topology_vs_leaf": ratio(r, "hard"),
            "allocate_plain_vs_leaf": ratio(r, "plain"),
            "hard_kv_time_vs_node_optimal": r["hard"]["kv_time_vs_node_optimal"],
        }
        for r in runs[1:-1]
    }


def scheduler_setting(state: Path, setting: str) -> None:
    """vc-scheduler restarted over the shipped configuration, or with pods without a topology left out of
    HyperNode binpack (README: the node tier's recommended setting)."""
    conf = cluster.SCHEDULER_CONF
    if setting == "normal-pod-off":
        resources = "      hypernode.binpack.resources: nvidia.com/gpu\n"
        conf = conf.replace(resources, NORMAL_POD_OFF + resources)
        assert NORMAL_POD_OFF in conf
    path = state / "volcano-scheduler.conf"
    if path.read_text() == conf:
        return
    path.write_text(conf)
    cluster.restart_component(state, "vc-scheduler")
    port = json.loads((state / "cluster.json").read_text())["ports"]["scheduler_metrics"]
    DevCluster(state).wait(lambda: _answers(port), 60, "vc-scheduler's metrics after its restart")


def _answers(port: int) -> bool:
    try:
        allocate_ms(port)
        return True
    except OSError:
        return False
