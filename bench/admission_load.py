"""Admission under explanation load: do pending hard gangs slow the webhook?

The operator explains every pending hard gang (free GPUs of every node, then a bounded packing
search per domain) while the same process answers admissions. On 1,024 fragmented nodes, rounds
alternate: A with no gang pending, B with 20 hard tier-1 gangs of 12 pods that no leaf can hold.
Each round times server-side dry-run creates of an opted-in pod (through the webhook) and of a plain
pod (not through it: the machine's noise), interleaved. p99 of B against A, same run, same cluster.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.fabric import fabric_yaml, fragmentation
from stormtopo.core.explanation import plan_pending
from stormtopo.core.request import Mode, parse_request
from stormtopo.core.topology.fabric import parse_topology
from stormtopo.core.topology.tree import Topology
from stormtopo.core.vocabulary import ADMITTED_LABEL, HIGHEST_TIER, MODE
from stormtopo.devenv import cluster, processes
from stormtopo.devenv.client import DevCluster
from stormtopo.devenv.workloads import Role, filler_pod, stormservice
from stormtopo.kube.client import Api

HARD = {MODE: "hard", HIGHEST_TIER: "1"}

# 12-pod gangs of mixed GPU sizes that no leaf of the fragmented LARGE fabric (seed 7) can hold,
# though most leaves have the GPUs in sum: each needs the packing search. Found offline: the
# costliest to explain of ~17,000 random shapes (10-40 ms each); checked again against the live cluster.
GANGS: tuple[tuple[int, ...], ...] = (
    (7, 7, 7, 6, 6, 6, 6, 5, 5, 4, 2, 2),
    (6, 6, 6, 6, 6, 6, 6, 6, 3, 3, 3, 2),
    (7, 7, 7, 7, 7, 5, 5, 5, 5, 5, 5, 5),
    (6, 6, 6, 5, 5, 5, 5, 5, 5, 2, 2, 2),
    (7, 7, 7, 6, 6, 6, 6, 6, 5, 5, 4, 2),
    (7, 5, 5, 5, 5, 5, 5, 5, 4, 4, 4, 1),
    (6, 5, 5, 5, 5, 5, 5, 5, 5, 5, 4, 2),
    (7, 7, 5, 5, 5, 5, 5, 5, 5, 5, 5, 3),
    (7, 7, 7, 7, 7, 7, 5, 5, 5, 5, 5, 5),
    (7, 7, 6, 6, 6, 6, 6, 5, 5, 1, 1, 1),
    (6, 6, 6, 6, 5, 5, 5, 5, 5, 2, 2, 2),
    (6, 6, 6, 6, 5, 5, 5, 5, 5, 5, 5, 2),
    (7, 7, 7, 7, 6, 6, 6, 6, 5, 4, 2, 1),
    (7, 6, 6, 6, 6, 6, 6, 6, 6, 3, 2, 1),
    (7, 7, 7, 7, 5, 5, 5, 5, 5, 3, 2, 1),
    (7, 7, 5, 5, 5, 5, 5, 5, 5, 3, 1, 1),
    (5, 5, 5, 5, 5, 5, 5, 5, 4, 4, 4, 4),
    (6, 6, 5, 5, 5, 5, 5, 5, 5, 5, 4, 2),
    (6, 6, 6, 6, 6, 5, 5, 5, 5, 2, 1, 1),
    (7, 7, 7, 7, 7, 6, 6, 6, 6, 5, 5, 5),
)


def gang_roles(pods: tuple[int, ...]) -> tuple[Role, ...]:
    """One role per GPU size, with as many replicas as pods of that size."""
    return tuple(Role(f"gpu{gpus}", replicas=count, gpus=gpus) for gpus, count in sorted(Counter(pods).items(), reverse=True))


def _quantile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000, method="inclusive")[round(q * 1000) - 1]


def _ms(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(_quantile(values, 0.5) * 1000, 2),
        "p99": round(_quantile(values, 0.99) * 1000, 2),
        "max": round(max(values) * 1000, 2),
    }


class Probe:
    """Reads the operator from outside: its metrics port and its CPU time."""

    def __init__(self, state: Path) -> None:
        ports = json.loads((state / "cluster.json").read_text())["ports"]
        self.url = f"http://127.0.0.1:{ports['operator_metrics']}/metrics"
        self.pids = {p.name: p.pid for p in processes.tracked(state)}

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url, timeout=10) as response:
            return str(response.read().decode())

    def pending_gangs(self) -> float:
        return next((float(line.split()[-1]) for line in self.metrics().splitlines() if line.startswith("stormtopo_pending_gangs ")), -1.0)

    def admission_buckets(self, kind: str = "pod") -> dict[str, float]:
        """The webhook's own admission histogram for `kind` (cumulative counts by upper bound)."""
        prefix = f'stormtopo_admission_seconds_bucket{{kind="{kind}",le="'
        return {
            line[len(prefix) :].split('"')[0]: float(line.split()[-1]) for line in self.metrics().splitlines() if line.startswith(prefix)
        }

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds of every component so far: which one a phase keeps busy."""
        return {name: _cpu(pid) for name, pid in self.pids.items()}


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _dry_run(client: DevCluster, namespace: str, pod: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    start = time.perf_counter()
    response = client.core.create_namespaced_pod(namespace, pod, dry_run="All", _preload_content=False)
    elapsed = time.perf_counter() - start
    return elapsed, json.loads(response.data)


def measure(client: DevCluster, probe: Probe, namespace: str, service: str, roleset: str, seconds: float) -> dict[str, Any]:
    """Dry-run pod creates for `seconds`, alternating an opted-in pod (the webhook answers it) and a
    plain one (no webhook), with what the operator did meanwhile."""
    opted_in = {"storm-service-name": service, "roleset-name": roleset, "role-name": "decode"}
    times: dict[bool, list[float]] = {True: [], False: []}
    admitted = 0
    buckets, podgroups = probe.admission_buckets(), probe.admission_buckets("podgroup").get("+Inf", 0.0)
    cpu, started = probe.cpu_seconds(), time.monotonic()
    i = 0
    while time.monotonic() - started < seconds:
        for through in (True, False):
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"adm-{i}", "namespace": namespace, "labels": opted_in if through else {}},
                "spec": {"containers": [{"name": "c", "image": "x"}]},
            }
            elapsed, created = _dry_run(client, namespace, pod)
            times[through].append(elapsed)
            admitted += through and (created["metadata"].get("labels") or {}).get(ADMITTED_LABEL) == "true"
        i += 1
    wall = time.monotonic() - started
    after = probe.admission_buckets()
    return {
        "seconds": round(wall, 1),
        "webhook": times[True],
        "plain": times[False],
        "admitted_by_webhook": admitted,  # failurePolicy Ignore: a timed-out answer would pass unmutated
        "cpu_share": {name: round((seconds - cpu[name]) / wall, 3) for name, seconds in probe.cpu_seconds().items()},
        "operator_admission_buckets": {le: after[le] - buckets.get(le, 0.0) for le in after},
        # AIBrix rewrites a pending replica's PodGroup about twice a second: the webhook answers each
        "podgroup_admissions_per_s": round((probe.admission_buckets("podgroup").get("+Inf", 0.0) - podgroups) / wall, 1),
        "pending_gangs_after": probe.pending_gangs(),
    }


def _wait_pending(client: DevCluster, probe: Probe, namespace: str, names: list[str], timeout: float) -> float:
    """Until the operator reports every gang unsatisfiable (gauge and Events); returns seconds waited."""
    started = time.monotonic()

    def explained() -> bool:
        events = client.core.list_namespaced_event(namespace, field_selector="reason=TopologyUnsatisfiable").items
        said = {e.involved_object.name for e in events}
        return said >= set(names) and probe.pending_gangs() == len(names)

    client.wait(explained, timeout, f"{len(names)} TopologyUnsatisfiable gangs", interval=2.0)
    return time.monotonic() - started


def explanation_cost(state: Path, topology: Topology, gangs: tuple[tuple[int, ...], ...]) -> dict[str, Any]:
    """What one explanation costs the operator, outside it: its free-GPU read (the same call), and the
    packing search for each gang on that reading. Every gang must be unsatisfiable at tier 1."""
    api = Api(str(state / "kubeconfig"))
    reads = []
    for _ in range(3):
        start = time.perf_counter()
        free = api.free_gpus()
        reads.append(time.perf_counter() - start)
    request = parse_request(HARD)
    assert request is not None and request.mode is Mode.HARD
    searches = []
    for pods in gangs:
        start = time.perf_counter()
        pending = plan_pending(request, pods, len(pods), topology, free)
        searches.append(time.perf_counter() - start)
        if pending is None or pending.explanation.fits:
            raise AssertionError(f"gang {pods} fits a leaf of this cluster: it would not stay Pending")
    return {
        "free_gpus_read_s_median": round(statistics.median(reads), 3),
        "search_ms": {"median": round(statistics.median(searches) * 1000, 1), "max": round(max(searches) * 1000, 1)},
        "search_s_all_gangs": round(sum(searches), 2),
    }


def _in_parallel(work: Callable[[dict[str, Any]], object], objects: list[dict[str, Any]]) -> None:
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(work, objects))


def run(shape: tuple[int, int, int], rounds: int = 2, seconds: float = 45.0) -> dict[str, Any]:
    """Rounds A/B/A/B on a fresh cluster of `shape` (spines, leaves per spine, nodes per leaf).
    `seconds` per round: longer than a resync (30 s), so every gang is re-explained during a B round."""
    description = fabric_yaml(*shape)
    topology = parse_topology(description)
    state = Path(tempfile.mkdtemp(prefix="stormtopo-admission-"))
    (state / "fabric.yaml").write_text(description)
    started = time.monotonic()
    cluster.up(state, state / "fabric.yaml", timeout=300)
    out: dict[str, Any] = {"nodes": len(topology.nodes), "gangs": len(GANGS), "pods_per_gang": len(GANGS[0]), "seconds_per_round": seconds}
    try:
        client = DevCluster(state)
        probe = Probe(state)
        client.create_namespace("bench-fill")
        used = fragmentation(sorted(topology.nodes), seed=7)
        _in_parallel(client.create, [filler_pod(f"busy-{node}", "bench-fill", node, gpus) for node, gpus in used.items()])
        client.bound_pods("bench-fill", "stormtopo.io/filler=true", len(used), timeout=300)
        client.create_namespace("bench-adm")
        client.create(stormservice("lat-svc", "bench-adm", annotations=HARD))
        client.bound_pods("bench-adm", "app=lat-svc", 2, timeout=120)
        roleset = client.only(lambda: client.rolesets("bench-adm", "lat-svc"), "RoleSet of lat-svc")["metadata"]["name"]
        out["explanation_cost"] = explanation_cost(state, topology, GANGS)

        phases: dict[str, list[dict[str, Any]]] = {"A": [], "B": []}
        for r in range(rounds):
            phases["A"].append(measure(client, probe, "bench-adm", "lat-svc", roleset, seconds))
            namespace = f"bench-gangs-{r}"
            client.create_namespace(namespace)
            names = [f"gang-{i:02d}" for i in range(len(GANGS))]
            _in_parallel(
                client.create,
                [stormservice(name, namespace, roles=gang_roles(pods), annotations=HARD) for name, pods in zip(names, GANGS, strict=True)],
            )
            explained_after = _wait_pending(client, probe, namespace, names, timeout=600)
            phases["B"].append(
                {**measure(client, probe, "bench-adm", "lat-svc", roleset, seconds), "explained_after_s": round(explained_after, 1)}
            )
            if r < rounds - 1:
                client.delete_namespace(namespace, wait=300)
                client.wait(lambda: probe.pending_gangs() == 0, 300, "the pending-gang gauge to drop to 0", interval=1.0)
        out.update(summarize(phases))
    finally:
        cluster.down(state)
        out["seconds"] = round(time.monotonic() - started, 1)
    return out


def summarize(phases: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Percentiles over every sample of a phase, the B/A ratios, and each round without its raw samples."""
    webhook = {p: [t for r in rounds for t in r["webhook"]] for p, rounds in phases.items()}
    plain = {p: [t for r in rounds for t in r["plain"]] for p, rounds in phases.items()}
    a, b = _ms(webhook["A"]), _ms(webhook["B"])
    pa, pb = _ms(plain["A"]), _ms(plain["B"])
    return {
        "samples_per_phase": {p: len(v) for p, v in webhook.items()},
        "webhook_ms": {"A": a, "B": b},
        "plain_ms": {"A": pa, "B": pb},
        "p99_ratio": round(b["p99"] / a["p99"], 3),
        "p50_ratio": round(b["p50"] / a["p50"], 3),
        "plain_p99_ratio": round(pb["p99"] / pa["p99"], 3),
        "plain_p50_ratio": round(pb["p50"] / pa["p50"], 3),
        # the webhook's share once the cluster's own slowdown (the plain path) is divided out
        "p99_ratio_over_plain": round((b["p99"] / pb["p99"]) / (a["p99"] / pa["p99"]), 3),
        "p50_ratio_over_plain": round((b["p50"] / pb["p50"]) / (a["p50"] / pa["p50"]), 3),
        "rounds": [
            {
                "phase": p,
                **{k: v for k, v in r.items() if k not in ("webhook", "plain")},
                "webhook_ms": _ms(r["webhook"]),
                "plain_ms": _ms(r["plain"]),
            }
            for i in range(max(len(v) for v in phases.values()))
            for p in ("A", "B")
            if i < len(phases[p])
            for r in [phases[p][i]]
        ],
    }
