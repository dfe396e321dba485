"""Healing under churn (issue 23): the same seeded stream of soft tier-1 StormServices arriving and
leaving on a fragmented 256-node cluster, run twice on the real control plane (Volcano, AIBrix, kwok,
stormtopo's operator): without `stormtopo.io/heal` and with it. The moves are the operator's own.

Time is compressed by a factor F: the stream's inter-arrival times and lifetimes, the operator's
--heal-cooldown (900 s) and --heal-interval (10 s, with a floor of 1 s: a shorter pass would load the
2-core machine) are divided by F. Everything else runs in real time (a move's eviction, re-creation and
placement; the operator's 5 s reading of free GPUs), so a move costs F times more simulated
unavailability than it would at F = 1: the comparison is, if anything, unfair to healing.

What is measured, from the pods sampled every few seconds (each replica's pods' nodes):

- replica-time within tier 1: the integral over simulated time of the replicas bound within one leaf,
  over the integral of the replicas that exist (services created and not yet deleted);
- against the offline optimum: the integral of `optimum(t)`, the largest number of the replicas existing
  at t that could each be within one leaf at once on the GPUs the fillers leave. Any schedule, online or
  offline, with or without moves, places the replicas existing at t somewhere on those GPUs, so it has at
  most `optimum(t)` of them within a leaf: the integral bounds every schedule's. It is exact (bench/leaf_optimum.py:
  an integer program; before 2026-12-02 a step-bounded search, beyond whose budget an upper bound was
  used, which only lowered the reported ratio);
- moves: pod sets of a replica replaced while its service lives (nothing else evicts here), and the
  operator's stormtopo_replica_moves_total; per replica per simulated hour, and the most moves of one
  replica within any simulated hour;
- unavailability: replica-seconds a replica that had been ready spent not ready (sampled, simulated
  seconds and real seconds), and the operator's stormtopo_move_unavailable_seconds (real seconds);
- the p99 KV-transfer time of bench/kvflow.py's flow simulation on the placements at a few moments,
  for the replicas placed in both runs.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import json
import random
import re
import statistics
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from bench import kvflow
from bench.fabric import fabric_yaml, fragmentation
from bench.leaf_optimum import most_within_leaves
from bench.packing import SHAPES, WEIGHTS, Leaves, _canonical, tree_of
from stormtopo.core.cooldown import COOLDOWN
from stormtopo.core.topology.fabric import parse_topology
from stormtopo.core.topology.tree import Topology
from stormtopo.core.vocabulary import HEAL_ANNOTATION, HIGHEST_TIER, MODE
from stormtopo.demo import DEFAULT_KV_CONFIG
from stormtopo.devenv import cluster
from stormtopo.devenv.client import DevCluster
from stormtopo.devenv.workloads import filler_pod, stormservice
from stormtopo.kvtransfer import crossed_tier, parse_kv_model
from stormtopo.operator.config import HEAL_INTERVAL

SOFT_LEAF = {MODE: "soft", HIGHEST_TIER: "1"}
HOUR = 3600.0


@dataclass(frozen=True)
class Size:
    fabric: tuple[int, int, int]  # spines x leaves per spine x nodes per leaf
    factor: float  # simulated seconds per real second
    hours: float  # simulated churn after the warm-up
    live: int  # replicas at the start, and on average
    lifetime: float  # mean lifetime, simulated seconds (exponential)
    sample: float  # real seconds between two samples
    requests: int  # KV transfers simulated per snapshot
    snapshots: int  # moments whose placements feed the flow simulation


QUICK = Size((4, 16, 4), factor=60.0, hours=2.0, live=64, lifetime=HOUR, sample=1.0, requests=1000, snapshots=4)
FULL = Size((4, 16, 4), factor=30.0, hours=6.0, live=64, lifetime=HOUR, sample=1.0, requests=2000, snapshots=8)
SMOKE = Size((2, 2, 4), factor=60.0, hours=0.5, live=6, lifetime=900.0, sample=2.0, requests=200, snapshots=2)  # plumbing only


# -- the stream --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Service:
    name: str
    shape: str
    arrive: float  # simulated seconds; 0 for the starting population (created during the warm-up)
    leave: float

    @property
    def pod_gpus(self) -> tuple[int, ...]:
        return tuple(r.gpus for r in SHAPES[self.shape] for _ in range(r.replicas * r.pod_group_size))


def churn(live: int, lifetime: float, duration: float, seed: int) -> list[Service]:
    """`live` services at the start with exponential (memoryless) remaining lifetimes, then Poisson
    arrivals at live / lifetime per second, so about `live` exist at any time (seeded)."""
    rng = random.Random(seed)
    shapes = list(WEIGHTS)
    weights = [WEIGHTS[s] for s in shapes]
    out: list[Service] = []
    t = 0.0
    while True:
        arrive = 0.0 if len(out) < live else t
        if len(out) >= live:
            t += rng.expovariate(live / lifetime)
            arrive = t
            if arrive >= duration:
                return out
        out.append(Service(f"svc-{len(out):03d}", rng.choices(shapes, weights=weights)[0], arrive, arrive + rng.expovariate(1 / lifetime)))


def existing(stream: Sequence[Service], t: float) -> list[Service]:
    return [s for s in stream if s.arrive <= t < s.leave]


def epochs(stream: Sequence[Service], duration: float) -> list[tuple[float, float, tuple[Service, ...]]]:
    """(start, end, services existing) between two consecutive arrivals or departures."""
    cuts = sorted({0.0, duration, *(s.arrive for s in stream if 0 < s.arrive < duration), *(s.leave for s in stream if s.leave < duration)})
    return [(a, b, tuple(existing(stream, a))) for a, b in itertools.pairwise(cuts) if b > a]


# -- the offline optimum at one moment ---------------------------------------------------------


@dataclass(frozen=True)
class Bound:
    replicas: int  # the optimum when `exact`, else an upper bound
    exact: bool
    lower: int  # replicas proven to fit at once, each within one leaf


def leaves_free(topology: Topology, free: Mapping[str, int]) -> Leaves:
    return _canonical([[free.get(n, 0) for n in s.nodes] for s in topology.switches.values() if s.tier == 1])


def within_leaf_optimum(leaves: Leaves, replicas: Sequence[tuple[int, ...]]) -> Bound:
    """The largest number of `replicas` that fit at once, each within one leaf: exact
    (bench/leaf_optimum.py). Until 2026-12-02 a step-bounded search gave it, and beyond its budget only
    an upper bound (every replica that fits some leaf alone, as many as the GPUs hold)."""
    most = most_within_leaves(leaves, replicas)
    return Bound(most, True, most)


# -- sampling the real cluster ------------------------------------------------------------------


@dataclass
class Sample:
    t: float  # simulated seconds
    replicas: dict[str, dict[str, Any]]  # service -> {tier, ready, uids, pods}


def read_replicas(client: DevCluster, namespace: str, topology: Topology, stream: Mapping[str, Service], prefix: str) -> dict[str, Any]:
    """Each service's replica as its live pods say: every pod bound (and on which nodes), all ready."""
    by_service: dict[str, list[dict[str, Any]]] = {}
    for pod in client.pods(namespace):
        labels = pod["metadata"].get("labels") or {}
        name = str(labels.get("storm-service-name", ""))
        if name.startswith(prefix) and not pod["metadata"].get("deletionTimestamp"):
            by_service.setdefault(name[len(prefix) :], []).append(pod)
    out: dict[str, Any] = {}
    for name, pods in by_service.items():
        service = stream.get(name)
        if service is None:
            continue
        gpus = {r.name: r.gpus for r in SHAPES[service.shape]}
        bound = [p for p in pods if p["spec"].get("nodeName")]
        complete = len(bound) == len(pods) == len(service.pod_gpus)
        ready = complete and all(_ready(p) for p in pods)
        tier = crossed_tier(topology.span(p["spec"]["nodeName"] for p in bound), topology.tiers) if complete else None
        out[name] = {
            "tier": tier,
            "ready": ready,
            "uids": sorted(p["metadata"]["uid"] for p in pods) if complete else [],
            "pods": [
                {"role": str(p["metadata"]["labels"].get("role", "?")), "pod": p["metadata"]["name"], "node": p["spec"]["nodeName"]}
                | {"gpus": gpus.get(str(p["metadata"]["labels"].get("role", "?")), 0)}
                for p in sorted(bound, key=lambda p: str(p["metadata"]["name"]))
            ]
            if complete
            else [],
        }
    return out


def _ready(pod: Mapping[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in (pod.get("status") or {}).get("conditions") or [])


# -- what the samples say -----------------------------------------------------------------------


@dataclass
class Summary:
    existing_seconds: float = 0.0  # simulated: services created and not deleted
    replica_seconds: float = 0.0  # simulated: from a replica's first placement to its service's deletion
    within_tier1_seconds: float = 0.0
    optimum_seconds: float = 0.0  # the optimum's bound over the replicas counted in replica_seconds
    unavailable_seconds: float = 0.0  # simulated: a replica once ready, not ready
    moves: dict[str, list[float]] = field(default_factory=dict)  # service -> simulated times its pods were replaced
    moved_wide: int = 0  # moves after which the replica was placed across leaves again


def summarize(samples: Sequence[Sample], stream: Mapping[str, Service], optimum: Callable[[float], int] | None = None) -> Summary:
    """Integrate the samples over simulated time, each sample holding until the next.

    A replica counts from its first placement: the seconds a new replica waits for Volcano are the
    same with and without healing, and F times longer than they would be uncompressed. A replica
    that has been placed and is not bound in one leaf (moving, or wide) counts against it.
    `optimum(t)` bounds how many of the services existing at t can be within one leaf at once; of a
    subset (the ones placed), at most that many and at most all of them."""
    out = Summary()
    placed: set[str] = set()
    seen_ready: set[str] = set()
    last_uids: dict[str, list[str]] = {}
    for here, nxt in itertools.pairwise(samples):
        dt = nxt.t - here.t
        counted = 0
        for service in stream.values():
            if not service.arrive <= here.t < service.leave:
                continue
            out.existing_seconds += dt
            r = here.replicas.get(service.name) or {"tier": None, "ready": False, "uids": []}
            if r["tier"] is not None:
                placed.add(service.name)
            if service.name not in placed:
                continue
            counted += 1
            out.replica_seconds += dt
            if r["tier"] is not None and r["tier"] <= 1:
                out.within_tier1_seconds += dt
            if r["ready"]:
                seen_ready.add(service.name)
            elif service.name in seen_ready:
                out.unavailable_seconds += dt
            if r["uids"]:
                before = last_uids.get(service.name)
                if before is not None and not set(before) & set(r["uids"]):
                    out.moves.setdefault(service.name, []).append(here.t)
                    out.moved_wide += r["tier"] > 1
                last_uids[service.name] = r["uids"]
        out.optimum_seconds += dt * (counted if optimum is None else min(counted, optimum(here.t)))
    return out


def most_moves_in_an_hour(moves: Mapping[str, Sequence[float]], window: float = HOUR) -> int:
    """The most moves of one replica within any window of `window` simulated seconds."""
    best = 0
    for times in moves.values():
        ordered = sorted(times)
        j = 0
        for i, t in enumerate(ordered):
            while t - ordered[j] >= window:
                j += 1
            best = max(best, i - j + 1)
    return best


def optimum_bounds(stream: Sequence[Service], duration: float, leaves: Leaves) -> tuple[Callable[[float], int], dict[str, Any]]:
    """The within-leaf optimum of the services existing in each epoch of the stream (the same for both
    runs), as a function of simulated time, and what it comes to in all."""
    cache: dict[tuple[tuple[int, ...], ...], Bound] = {}
    starts: list[float] = []
    values: list[int] = []
    total = exact = existing_seconds = 0.0
    for a, b, services in epochs(stream, duration):
        key = tuple(sorted(s.pod_gpus for s in services))
        if key not in cache:
            cache[key] = within_leaf_optimum(leaves, list(key))
        bound = cache[key]
        starts.append(a)
        values.append(bound.replicas)
        total += bound.replicas * (b - a)
        exact += (b - a) if bound.exact else 0.0
        existing_seconds += len(services) * (b - a)

    def at(t: float) -> int:
        i = bisect.bisect_right(starts, t) - 1
        return values[max(0, min(i, len(values) - 1))]

    return at, {
        "optimum_replica_seconds": round(total, 1),
        "existing_replica_seconds": round(existing_seconds, 1),
        "optimum_share_of_existing": round(total / existing_seconds, 4) if existing_seconds else None,
        "exact_share_of_time": round(exact / duration, 4) if duration else None,
    }


# -- one run --------------------------------------------------------------------------------------


def _metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(float(m.group(1)) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M))


def _moves_by_reason(port: int) -> dict[str, float]:
    """The operator's stormtopo_replica_moves_total per reason (soft-above-tier, hard-violation, make-room)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    found = re.finditer(r'^stormtopo_replica_moves_total\{reason="([^"]+)"\} ([0-9.e+-]+)$', text, re.M)
    return {m.group(1): float(m.group(2)) for m in found}


def run_mode(
    state: Path, topology: Topology, stream: Sequence[Service], size: Size, heal: bool, metrics_port: int
) -> tuple[list[Sample], dict[str, Any]]:
    """The stream on the cluster: the starting population created and bound, then the clock starts."""
    mode = "heal" if heal else "off"
    prefix = f"{mode}-"  # AIBrix counts same-named RoleSets across namespaces: names differ per run
    namespace = f"heal-bench-{mode}"
    client, sampler = DevCluster(state), DevCluster(state)
    client.create_namespace(namespace)
    annotations = {**SOFT_LEAF, HEAL_ANNOTATION: "true"} if heal else SOFT_LEAF
    by_name = {s.name: s for s in stream}
    duration = size.hours * HOUR
    warmup_started = time.monotonic()
    starting = [s for s in stream if s.arrive == 0]
    for s in starting:
        client.create(stormservice(prefix + s.name, namespace, SHAPES[s.shape], annotations=SOFT_LEAF))
        # One at a time, each once the previous is placed (or after 10 s: no room, it waits): the same start in both runs.
        with contextlib.suppress(AssertionError):
            client.bound_pods(namespace, f"storm-service-name={prefix}{s.name}", len(s.pod_gpus), timeout=10)
    warmup = time.monotonic() - warmup_started
    before = {m: _metric(metrics_port, m) for m in METRICS}
    reasons_before = _moves_by_reason(metrics_port)
    if heal:  # the opt-in once the start is in place: healing acts from the clock's start, on the same start
        for s in starting:
            client.patch_stormservice(namespace, prefix + s.name, {"metadata": {"annotations": {HEAL_ANNOTATION: "true"}}})
    samples: list[Sample] = []
    stop = threading.Event()
    start = time.monotonic()

    def sample() -> None:
        while not stop.is_set():
            t = (time.monotonic() - start) * size.factor
            try:
                samples.append(Sample(t, read_replicas(sampler, namespace, topology, by_name, prefix)))
            except Exception as exc:  # a slow API server: the next sample covers the gap
                print(f"sample at {t:.0f}s failed: {exc}", flush=True)
            stop.wait(size.sample)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    creates = [(s.arrive, "create", s) for s in stream if 0 < s.arrive < duration]
    actions = sorted(creates + [(s.leave, "delete", s) for s in stream if s.leave < duration], key=lambda a: a[0])
    late = 0.0
    for at, action, s in actions:
        wait = start + at / size.factor - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        else:
            late = max(late, -wait)
        if action == "create":
            client.create(stormservice(prefix + s.name, namespace, SHAPES[s.shape], annotations=annotations))
        else:
            try:
                client.delete_stormservice(namespace, prefix + s.name)
            except Exception as exc:  # already gone
                print(f"delete {s.name}: {exc}", flush=True)
    time.sleep(max(0.0, start + duration / size.factor - time.monotonic()))
    stop.set()
    thread.join()
    after = {m: _metric(metrics_port, m) for m in METRICS}
    reasons = {r: n - reasons_before.get(r, 0.0) for r, n in _moves_by_reason(metrics_port).items() if n > reasons_before.get(r, 0.0)}
    said = healing_events(client, namespace)
    client.delete_namespace(namespace, wait=180)
    facts = {
        "warmup_s": round(warmup, 1),
        "real_s": round(time.monotonic() - start, 1),
        "most_late_s": round(late, 2),
        "samples": len(samples),
        "operator": {m: round(after[m] - before[m], 3) for m in METRICS},
        "moves_by_reason": reasons,
        "events": said,
    }
    return samples, facts


WHY_NOT = {  # the planner's reasons a wide replica is not moved, by the words of its Event
    "no room": "no domain within tier",
    "another replica moving": "is moving; one replica",
    "cool-down": "the cool-down of",
    "back-off": "an eviction was refused",
    "service budget": "other replicas are ready",
    "PodDisruptionBudget": "PodDisruptionBudget",
}


def healing_events(client: DevCluster, namespace: str) -> dict[str, int]:
    """The operator's healing Events in the namespace, by reason (and why not moved)."""
    counts: dict[str, int] = {}
    for event in client.core.list_namespaced_event(namespace).items:
        if event.reason == "ReplicaNotMoved":
            why = next((k for k, words in WHY_NOT.items() if words in (event.message or "")), "other")
            key = f"ReplicaNotMoved: {why}"
        elif event.reason in ("ReplicaMoving", "ReplicaPlaced"):
            key = event.reason
        else:
            continue
        counts[key] = counts.get(key, 0) + (event.count or 1)
    return dict(sorted(counts.items()))


METRICS = (
    "stormtopo_replica_moves_total",
    "stormtopo_move_unavailable_seconds_sum",
    "stormtopo_move_unavailable_seconds_count",
    "stormtopo_healing_passes_total",
)


# -- the flow simulation on sampled placements ---------------------------------------------------


def _nearest(samples: Sequence[Sample], t: float) -> Sample:
    return min(samples, key=lambda s: abs(s.t - t))


def kv_transfer(
    topology: Topology, stream: Mapping[str, Service], runs: Mapping[str, Sequence[Sample]], size: Size, seed: int = 5
) -> dict[str, Any]:
    """p50/p99 of the flow simulation at oversubscription 2:1 and loads 60% and 90%, pooled over
    `size.snapshots` moments; at each, the replicas bound in both runs (same names, same shapes, so the
    same requests)."""
    kv = parse_kv_model(yaml.safe_load(DEFAULT_KV_CONFIG.read_text()))
    duration = size.hours * HOUR
    moments = [duration * (i + 1) / (size.snapshots + 1) for i in range(size.snapshots)]
    out: dict[str, Any] = {"moments_s": [round(m) for m in moments], "oversubscription": 2, "rows": []}
    placed: dict[str, list[list[kvflow.Replica]]] = {mode: [] for mode in runs}
    pairs: dict[str, dict[str, int]] = {mode: {} for mode in runs}
    for moment in moments:
        here = {mode: _nearest(samples, moment).replicas for mode, samples in runs.items()}
        common = sorted(set.intersection(*({n for n, r in reps.items() if r["tier"] is not None} for reps in here.values())))
        for mode, reps in here.items():
            records = [{"shape": stream[n].shape, "pods": reps[n]["pods"]} for n in common]
            placed[mode].append(kvflow.replicas_from(records))
            for n in common:
                tier = f"tier{reps[n]['tier']}"
                pairs[mode][tier] = pairs[mode].get(tier, 0) + 1
    out["replicas_per_moment"] = [len(p) for p in next(iter(placed.values()))]
    out["replica_tiers"] = pairs
    warmup = size.requests // 10
    for load in (0.6, 0.9):
        row: dict[str, Any] = {"load": load}
        for mode, moments_placed in placed.items():
            times: list[float] = []
            for i, replicas in enumerate(moments_placed):
                if not replicas:
                    continue
                fabric = kvflow.Fabric(topology, kv, 2)
                reqs = kvflow.arrivals(replicas, kv, load, size.requests, seed + i)
                times += kvflow.simulate(fabric, replicas, reqs)[warmup:]
            row[mode] = {
                "p50_ms": round(kvflow.percentile(times, 50) * 1e3, 3) if times else None,
                "p99_ms": round(kvflow.percentile(times, 99) * 1e3, 3) if times else None,
                "mean_ms": round(statistics.fmean(times) * 1e3, 3) if times else None,
            }
        out["rows"].append(row)
    return out


# -- the benchmark ------------------------------------------------------------------------------


def report(summary: Summary, facts: Mapping[str, Any], size: Size) -> dict[str, Any]:
    moves = sum(len(v) for v in summary.moves.values())
    replica_hours = summary.replica_seconds / HOUR
    return {
        "within_tier1_fraction": round(summary.within_tier1_seconds / summary.replica_seconds, 4) if summary.replica_seconds else None,
        "within_tier1_vs_optimum": round(summary.within_tier1_seconds / summary.optimum_seconds, 4) if summary.optimum_seconds else None,
        "within_tier1_of_existing": round(summary.within_tier1_seconds / summary.existing_seconds, 4) if summary.existing_seconds else None,
        "placed_share_of_existing": round(summary.replica_seconds / summary.existing_seconds, 4) if summary.existing_seconds else None,
        "replica_hours": round(replica_hours, 2),
        "moves_sampled": moves,
        "moves_operator": facts["operator"]["stormtopo_replica_moves_total"],
        "moves_per_replica_hour": round(moves / replica_hours, 4) if replica_hours else None,
        "replicas_moved": len(summary.moves),
        "moves_landing_across_leaves": summary.moved_wide,
        "most_moves_of_one_replica_in_an_hour": most_moves_in_an_hour(summary.moves),
        "unavailable_replica_seconds_simulated": round(summary.unavailable_seconds, 1),
        "unavailable_replica_seconds_real": round(summary.unavailable_seconds / size.factor, 1),
        "operator_move_unavailable_seconds_real": facts["operator"]["stormtopo_move_unavailable_seconds_sum"],
        "operator_moves_settled": facts["operator"]["stormtopo_move_unavailable_seconds_count"],
        "run": dict(facts),
    }


def setting(size: Size, seed: int) -> tuple[Topology, list[Service], dict[str, int], dict[str, int]]:
    """What a run of `size` and `seed` is made of: the fabric, the stream, the fillers' GPUs per node and
    the GPUs they leave free."""
    topology = parse_topology(fabric_yaml(*size.fabric))
    nodes = sorted(topology.nodes)
    used = fragmentation(nodes, seed=7)
    free = {n: topology.nodes[n].gpus - used.get(n, 0) for n in nodes}
    return topology, churn(size.live, size.lifetime, size.hours * HOUR, seed), used, free


def run(size: Size, seed: int = 23, node_tier: bool = False, make_room: bool = False) -> dict[str, Any]:
    started = time.monotonic()
    description = fabric_yaml(*size.fabric)
    topology, stream, used, free = setting(size, seed)
    nodes = sorted(topology.nodes)
    duration = size.hours * HOUR
    by_name = {s.name: s for s in stream}
    interval = max(1.0, HEAL_INTERVAL / size.factor)
    cooldown = COOLDOWN / size.factor
    out: dict[str, Any] = {
        "seed": seed,
        "size": asdict(size),
        "nodes": len(nodes),
        "gpus": sum(topology.nodes[n].gpus for n in nodes),
        "filler_gpus": sum(used.values()),
        "services": len(stream),
        "heal_interval_s": interval,
        "heal_cooldown_s": cooldown,
        "tree": tree_of(topology),
    }
    state = Path(tempfile.mkdtemp(prefix="stormtopo-heal-"))
    (state / "fabric.yaml").write_text(description)
    operator_args = (
        f"--heal-interval={interval}",
        f"--heal-cooldown={cooldown}",
        *(("--node-tier",) if node_tier else ()),
        *(("--heal-make-room",) if make_room else ()),
    )
    out["node_tier"], out["make_room"] = node_tier, make_room
    cluster.up(state, state / "fabric.yaml", timeout=300, operator_args=operator_args)
    runs: dict[str, list[Sample]] = {}
    facts: dict[str, dict[str, Any]] = {}
    try:
        client = DevCluster(state)
        port = json.loads((state / "cluster.json").read_text())["ports"]["operator_metrics"]
        client.create_namespace("heal-fill")
        for node, gpus in used.items():
            client.create(filler_pod(f"busy-{node}", "heal-fill", node, gpus))
        client.bound_pods("heal-fill", "stormtopo.io/filler=true", len(used), timeout=300)
        for heal in (False, True):
            mode = "heal" if heal else "off"
            runs[mode], facts[mode] = run_mode(state, topology, stream, size, heal, port)
    finally:
        cluster.down(state)
    # After the cluster is down: the optimum's search takes minutes of CPU, and the lock is others' too.
    optimum_at, out["optimum"] = optimum_bounds(stream, duration, leaves_free(topology, free))
    for mode, samples in runs.items():
        out[mode] = report(summarize(samples, by_name, optimum_at), facts[mode], size)
        print(json.dumps({mode: {k: v for k, v in out[mode].items() if k != "run"}}), flush=True)
    out["kv_transfer"] = kv_transfer(topology, by_name, runs, size)
    out["seconds"] = round(time.monotonic() - started, 1)
    out["samples"] = {mode: [compact(s) for s in samples] for mode, samples in runs.items()}
    return out


def compact(sample: Sample) -> list[Any]:
    """A sample as summarize reads it (tier, ready, the pods' uids shortened), for a later summary
    against another bound of the optimum without running the cluster again."""
    return [round(sample.t, 1), {k: [r["tier"], r["ready"], [u[:8] for u in r["uids"]]] for k, r in sample.replicas.items()}]


def expand(row: Sequence[Any]) -> Sample:
    return Sample(row[0], {k: {"tier": t, "ready": ready, "uids": uids} for k, (t, ready, uids) in row[1].items()})


def markdown(out: Mapping[str, Any]) -> str:
    off, on = out["off"], out["heal"]
    rows = [
        ("replica-time within tier 1 (from each replica's first placement)", "within_tier1_fraction"),
        ("... vs the offline optimum", "within_tier1_vs_optimum"),
        ("... of the time services existed (placement waits included)", "within_tier1_of_existing"),
        ("moves (sampled / operator's counter)", None),
        ("moves per replica per simulated hour", "moves_per_replica_hour"),
        ("moves after which the replica landed across leaves again", "moves_landing_across_leaves"),
        ("most moves of one replica in a simulated hour", "most_moves_of_one_replica_in_an_hour"),
        ("unavailable replica-seconds, simulated (real)", None),
        ("operator's stormtopo_move_unavailable_seconds, real: sum / moves settled", None),
    ]
    lines = ["| | without heal | with heal |", "|---|---|---|"]
    for label, key in rows:
        if key:
            lines.append(f"| {label} | {off[key]} | {on[key]} |")
        elif label.startswith("moves ("):
            moves = [f"{r['moves_sampled']} / {r['moves_operator']:.0f}" for r in (off, on)]
            lines.append(f"| {label} | {moves[0]} | {moves[1]} |")
        elif label.startswith("unavailable"):
            lines.append(
                f"| {label} | {off['unavailable_replica_seconds_simulated']} ({off['unavailable_replica_seconds_real']}) "
                f"| {on['unavailable_replica_seconds_simulated']} ({on['unavailable_replica_seconds_real']}) |"
            )
        else:
            lines.append(
                f"| {label} | {off['operator_move_unavailable_seconds_real']} / {off['operator_moves_settled']:.0f} "
                f"| {on['operator_move_unavailable_seconds_real']} / {on['operator_moves_settled']:.0f} |"
            )
    for row in out["kv_transfer"]["rows"]:
        lines.append(
            f"| KV transfer p99 (p50), 2:1, load {row['load']:.0%} | {row['off']['p99_ms']} ms ({row['off']['p50_ms']} ms) "
            f"| {row['heal']['p99_ms']} ms ({row['heal']['p50_ms']} ms) |"
        )
    return "\n".join(lines)


SIZES = {"smoke": SMOKE, "quick": QUICK, "full": FULL}


def result_name(size: str, seed: int, factor: float | None, node_tier: bool, make_room: bool) -> str:
    """bench/results/NAME.json of a run: healing[-quick|-smoke][-seedN][-xF][-node-tier][-make-room]."""
    name = "healing" if size == "full" else f"healing-{size}"
    name += "" if seed == 23 else f"-seed{seed}"
    name += f"-x{factor:g}" if factor else ""
    return name + ("-node-tier" if node_tier else "") + ("-make-room" if make_room else "")


def run_size(
    size_name: str, seed: int = 23, node_tier: bool = False, factor: float | None = None, make_room: bool = False
) -> dict[str, Any]:
    """A run of a named size; `factor` overrides its time factor (a lower factor: a move's real seconds
    cost fewer simulated ones, and the run takes longer)."""
    size = SIZES[size_name]
    if factor:
        size = replace(size, factor=factor)
    return run(size, seed, node_tier, make_room)


def rescore(path: Path) -> dict[str, Any]:
    """A finished run's result file summarized again from its samples (the file beside it) against the
    optimum as computed now; the file is rewritten, its former optimum and ratios kept under "before"."""
    out: dict[str, Any] = json.loads(path.read_text())
    samples = json.loads(path.with_name(path.name.replace(".json", "-samples.json")).read_text())
    size = Size(**{**out["size"], "fabric": tuple(out["size"]["fabric"])})
    topology, stream, _, free = setting(size, out["seed"])
    before = {"optimum": out["optimum"], **{mode: out[mode]["within_tier1_vs_optimum"] for mode in samples}}
    optimum_at, out["optimum"] = optimum_bounds(stream, size.hours * HOUR, leaves_free(topology, free))
    by_name = {s.name: s for s in stream}
    for mode, rows in samples.items():
        out[mode] = report(summarize([expand(r) for r in rows], by_name, optimum_at), out[mode]["run"], size)
    out.setdefault("before", before)
    path.write_text(json.dumps(out, indent=2, default=str))
    return out
