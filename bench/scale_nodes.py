"""Scale with nodes: time from StormService creation to every pod bound, with and without stormtopo.

One cluster per fabric size (4,096 then 1,024 kwok GPU nodes), one after the other in the same run.
In each, batches of N StormServices (1 prefill + 1 decode, 1 GPU each, AIBrix's Volcano strategy)
alternate between hard / tier 1 (through stormtopo) and plain (no annotations: the webhooks select
opted-in objects only, so stormtopo never sees them). A batch is created by 8 client threads and
timed from the first create until every pod of the batch is bound; its namespace is then deleted
and its pods are gone before the next batch. Two batch sizes show growth with services; two fabric
sizes show growth with nodes. The operator's RSS after each batch, its peak (VmHWM) and CPU, and
the CPU of the other components per batch and while idle, from /proc.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.fabric import fabric_yaml
from bench.scale import HARD, _proc
from stormtopo.core.topology.fabric import parse_topology
from stormtopo.core.topology.tree import Topology
from stormtopo.devenv import cluster, processes
from stormtopo.devenv.client import DevCluster, Timeout
from stormtopo.devenv.workloads import stormservice

SHAPES: tuple[tuple[int, int, int], ...] = ((16, 16, 16), (8, 8, 16))  # spines x leaves per spine x nodes per leaf; the largest first
BATCHES: tuple[int, ...] = (16, 32)
MODES = ("stormtopo", "plain")
BIND_TIMEOUT = 300.0  # a batch not bound by then is recorded as unfinished, with how many pods were bound
IDLE_SECONDS = 30.0  # how long each idle cluster is watched for its steady CPU (kwok's node leases)


def _rss_mb(pid: int) -> float:
    """Current resident set of a process in MB (VmRSS)."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024  # type: ignore[union-attr]


def _cpu_all(pids: Mapping[str, int]) -> dict[str, float]:
    return {name: _proc(pid)[1] for name, pid in pids.items()}


def _cores(before: Mapping[str, float], after: Mapping[str, float], seconds: float) -> dict[str, float]:
    """Average cores each component used between two CPU readings."""
    return {name: round((after[name] - before[name]) / seconds, 3) for name in sorted(after)}


def within_leaf(pods: Iterable[Mapping[str, Any]], topology: Topology) -> float:
    """Fraction of StormServices (label app) whose bound pods all sit under one leaf switch."""
    leaves: dict[str, set[str]] = {}
    for pod in pods:
        leaves.setdefault(pod["metadata"]["labels"]["app"], set()).add(topology.nodes[pod["spec"]["nodeName"]].switch)
    return round(sum(len(s) == 1 for s in leaves.values()) / len(leaves), 3) if leaves else 0.0


def _all_bound(client: DevCluster, namespace: str, count: int) -> list[dict[str, Any]]:
    """The namespace's pods once `count` of them are bound to nodes, else []."""
    bound = [p for p in client.pods(namespace) if p["spec"].get("nodeName")]
    return bound if len(bound) >= count else []


def batch(client: DevCluster, topology: Topology, pids: Mapping[str, int], namespace: str, services: int, mode: str) -> dict[str, Any]:
    """Create `services` StormServices at once, time until every pod is bound, then delete them all."""
    client.create_namespace(namespace)
    annotations = HARD if mode == "stormtopo" else None
    # Names of their own: AIBrix v0.7.0 gives no RoleSet to a StormService named as one in another namespace,
    # and the last batch's may still be there (a namespace of 4,096 nodes' cluster takes minutes to go).
    manifests = [stormservice(f"{namespace}-s{i:03d}", namespace, annotations=annotations) for i in range(services)]
    cpu = _cpu_all(pids)
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(client.create, manifests))
    created = time.monotonic() - started
    # Every batch is polled the same way, so the polling's own load is the same with and without.
    bound: float | None
    try:
        pods = client.wait(lambda: _all_bound(client, namespace, 2 * services), BIND_TIMEOUT, "every pod bound", interval=0.25)
        bound = time.monotonic() - started
    except Timeout:
        pods, bound = _all_bound(client, namespace, 0), None
    used = _cores(cpu, _cpu_all(pids), time.monotonic() - started)
    deleting = time.monotonic()
    client.delete_namespace(namespace, wait=600)
    return {
        "mode": mode,
        "services": services,
        "create_s": round(created, 2),
        "all_bound_s": None if bound is None else round(bound, 2),
        "pods_bound": len(pods),
        "within_one_leaf": within_leaf(pods, topology),
        "cores_while_binding": used,
        "delete_s": round(time.monotonic() - deleting, 1),
        "operator_rss_mb_after": round(_rss_mb(pids["operator"]), 1),
    }


def order(rounds: int, sizes: Sequence[int]) -> list[tuple[int, int, str]]:
    """(round, services, mode) in run order: sizes in turn, with and without interleaved, and which
    goes first alternating by round, so neither mode always runs on the warmer cluster."""
    return [(r, n, mode) for r in range(rounds) for n in sizes for mode in (MODES if (r + sizes.index(n)) % 2 == 0 else MODES[::-1])]


def summarize(batches: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Median time to every pod bound per (services, mode), and with / without per batch size. A mode
    with an unfinished batch (None) has no median: its time is only known to exceed the timeout."""
    out: dict[str, Any] = {}
    for n in sorted({b["services"] for b in batches}):
        times = {m: [b["all_bound_s"] for b in batches if b["services"] == n and b["mode"] == m] for m in MODES}
        medians = {m: round(statistics.median(t), 2) for m, t in times.items() if t and None not in t}
        out[str(n)] = {
            "all_bound_s_median": medians,
            "all_bound_s_rounds": times,
            "per_service_ms_median": {m: round(v / n * 1000, 1) for m, v in medians.items()},
            "ratio_with_without": round(medians["stormtopo"] / medians["plain"], 3) if len(medians) == 2 else None,
        }
    return out


def run_cluster(shape: tuple[int, int, int], sizes: Sequence[int], rounds: int, up_timeout: float) -> dict[str, Any]:
    description = fabric_yaml(*shape)
    topology = parse_topology(description)
    state = Path(tempfile.mkdtemp(prefix="stormtopo-scale-nodes-"))
    (state / "fabric.yaml").write_text(description)
    started = time.monotonic()
    # Volcano's own schedule period: at 200ms its sessions alone took 0.44 of a core at 4,096 idle nodes.
    cluster.up(state, state / "fabric.yaml", timeout=up_timeout, schedule_period="1s")
    out: dict[str, Any] = {"nodes": len(topology.nodes), "shape": list(shape), "up_s": round(time.monotonic() - started, 1)}
    try:
        client = DevCluster(state)
        pids = {p.name: p.pid for p in processes.tracked(state)}
        out["operator_rss_mb_idle"] = round(_rss_mb(pids["operator"]), 1)
        cpu, idle_started = _cpu_all(pids), time.monotonic()
        time.sleep(IDLE_SECONDS)  # measuring the idle cluster: there is no condition to wait for
        out["idle_cores"] = _cores(cpu, _cpu_all(pids), time.monotonic() - idle_started)
        batches = []
        for r, n, mode in order(rounds, sizes):
            batches.append({"round": r, **batch(client, topology, pids, f"b{n}-{mode}-{r}", n, mode)})
            print(json.dumps({"nodes": out["nodes"], **batches[-1]}), file=sys.stderr, flush=True)  # progress of a long run
        peak, cpu_s = _proc(pids["operator"])
        out |= {"operator_peak_rss_mb": round(peak, 1), "operator_cpu_s": round(cpu_s, 1), "by_services": summarize(batches)}
        out["batches"] = batches
    finally:
        cluster.down(state)
        out["seconds"] = round(time.monotonic() - started, 1)
    return out


def run(
    shapes: Sequence[tuple[int, int, int]] = SHAPES,
    sizes: Sequence[int] = BATCHES,
    rounds: int = 2,
    up_timeout: float = 900.0,
    done: Callable[[list[dict[str, Any]]], object] = lambda clusters: None,
) -> dict[str, Any]:
    """Every shape in turn; `done` gets the clusters measured so far after each one (a long run keeps
    what it measured if a later cluster fails)."""
    started = time.monotonic()
    clusters: list[dict[str, Any]] = []
    for shape in shapes:
        clusters.append(run_cluster(shape, sizes, rounds, up_timeout))
        done(clusters)
    return {"clusters": clusters, "growth": growth(clusters), "seconds": round(time.monotonic() - started, 1)}


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def growth(clusters: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Largest cluster over smallest (nodes), and largest batch over smallest (services), per mode
    (None where a batch did not finish)."""
    small, large = min(clusters, key=lambda c: c["nodes"]), max(clusters, key=lambda c: c["nodes"])

    def median(c: Mapping[str, Any], n: str, mode: str) -> float | None:
        value = c["by_services"][n]["all_bound_s_median"].get(mode)
        return None if value is None else float(value)

    out: dict[str, Any] = {"nodes": f"{large['nodes']} / {small['nodes']}"}
    for m in MODES:
        out[f"all_bound_{m}_with_nodes"] = {n: _ratio(median(large, n, m), median(small, n, m)) for n in small["by_services"]}
        out[f"all_bound_{m}_with_services"] = {}
        for c in clusters:
            sizes = sorted(c["by_services"], key=int)
            lo, hi = sizes[0], sizes[-1]
            out[f"all_bound_{m}_with_services"][str(c["nodes"])] = _ratio(median(c, hi, m), median(c, lo, m))
    out["operator_peak_rss_with_nodes"] = _ratio(large["operator_peak_rss_mb"], small["operator_peak_rss_mb"])
    out["idle_cores_with_nodes"] = {k: _ratio(large["idle_cores"][k], max(small["idle_cores"][k], 1e-3)) for k in small["idle_cores"]}
    return out
