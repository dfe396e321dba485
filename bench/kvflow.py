"""KV-transfer time under load: a flow-level simulation of prefill -> decode KV transfers on the
leaf-spine fabric, fed with the placements of a real scheduling run (bench/packing.py's JSON).

The model (every assumption is also written beside the numbers it produces):

- Each GPU has one NIC of the tier-1 bandwidth and NVLink of the tier-0 bandwidth of
  stormtopo/data/kv_transfer.yaml, per direction; a pod's NICs (and its NVLink) are one link of
  GPUs x that bandwidth, so flows of one pod share them.
- A leaf's uplinks carry 1/r of its nodes' NIC bandwidth (oversubscription r:1), and a spine's uplinks
  1/r of its leaves' uplinks. At r = 2 a GPU's fair share through the spine (25 GB/s) and the core
  (12.5 GB/s) is what kv_transfer.yaml assumes for tiers 2 and 3.
- Links are full duplex; every flow gets its max-min fair share of every link it crosses
  (progressive filling), recomputed at every arrival and completion. No packet-level effects.
- A request ships kv_bytes_per_token x prompt_tokens from one prefill instance (a multi-node one sends
  an equal share from each of its pods) to one decode pod, both chosen uniformly within the replica.
  Its transfer time is when the last byte lands, plus the one-way latency of the tier it crosses.
- Requests arrive as one Poisson process per replica, at `load` x the replica's own NIC bandwidth on
  its narrower side (prefill or decode) / bytes per request: the same offered load with and without
  stormtopo, and every replica stable on its own at load < 1 on a non-blocking fabric. The same seeded
  arrivals are used with and without stormtopo.
- Only the KV transfers load the fabric: no other traffic, and the fillers' GPUs send nothing.

networkx is not used: in a tree the path between two nodes is their two chains of ancestors up to the
lowest common switch, which stormtopo's Topology already gives.
"""

from __future__ import annotations

import heapq
import json
import math
import random
import statistics
from collections import defaultdict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from bench.packing import SHAPES
from stormtopo.core.topology.tree import NodeSpec, Switch, Topology
from stormtopo.demo import DEFAULT_KV_CONFIG
from stormtopo.kvtransfer import KVModel, crossed_tier, parse_kv_model

F = TypeVar("F", bound=Hashable)
L = TypeVar("L", bound=Hashable)

OVERSUBSCRIPTION = (1, 2, 4)
LOADS = (0.3, 0.6, 0.9)


def max_min_rates(paths: Mapping[F, Sequence[L]], capacity: Mapping[L, float]) -> dict[F, float]:
    """Max-min fair rates by progressive filling: raise every unfrozen flow's rate together until a link
    is full; freeze the flows through it at its fair share; repeat with what the others left."""
    remaining = {link: capacity[link] for links in paths.values() for link in links}
    users: dict[L, set[F]] = defaultdict(set)
    for flow, links in paths.items():
        for link in links:
            users[link].add(flow)
    # A heap of (fair share, version, link); an entry is stale once the link's version moved on.
    version = dict.fromkeys(users, 0)
    heap = [(remaining[link] / len(flows), 0, n, link) for n, (link, flows) in enumerate(users.items())]
    order = {link: n for n, link in enumerate(users)}  # ties break by a number: links need not be ordered
    heapq.heapify(heap)
    rates: dict[F, float] = {}
    while heap:
        share, v, _, link = heapq.heappop(heap)
        if v != version[link] or not users[link]:
            continue
        for flow in list(users[link]):
            rates[flow] = max(0.0, share)
            for other in paths[flow]:
                remaining[other] -= share
                users[other].discard(flow)
                version[other] += 1
                if users[other] and other != link:
                    heapq.heappush(heap, (remaining[other] / len(users[other]), version[other], order[other], other))
    return rates


# -- the fabric -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fabric:
    topology: Topology
    kv: KVModel
    oversubscription: float

    def uplink_capacity(self, switch: str) -> float:
        """Bytes/s one way on a switch's uplinks: 1/r of what comes in from below."""
        s = self.topology.switches[switch]
        if s.nodes:
            below = sum(self.topology.nodes[n].gpus for n in s.nodes) * self.kv.link(1).bandwidth_gbps * 1e9
        else:
            below = sum(self.uplink_capacity(c) for c in s.children)
        return below / self.oversubscription

    def path(self, src: str, dst: str) -> list[tuple[str, str]]:
        """The shared links a transfer from node `src` to node `dst` crosses (pod NICs not included)."""
        if src == dst:
            return []
        up, down = self.topology.ancestors(src), self.topology.ancestors(dst)
        common = next(s for s in up if s in down)
        return [("up", s) for s in up[: up.index(common)]] + [("down", s) for s in down[: down.index(common)]]

    def tier(self, src: str, dst: str) -> int:
        return crossed_tier(self.topology.span([src, dst]), self.topology.tiers)


@dataclass(frozen=True)
class Pod:
    name: str
    node: str
    gpus: int


@dataclass(frozen=True)
class Replica:
    prefill: tuple[tuple[Pod, ...], ...]  # instances, each of one or more pods
    decode: tuple[Pod, ...]


def replicas_from(placed: Sequence[Mapping[str, Any]]) -> list[Replica]:
    """Replicas as bench/packing.py recorded them: pods by role, a multi-node instance's pods together."""
    out = []
    for r in placed:
        per_instance = {role.name: role.pod_group_size for role in SHAPES[r["shape"]]}
        pods = {role: [Pod(p["pod"], p["node"], p["gpus"]) for p in r["pods"] if p["role"] == role] for role in ("prefill", "decode")}
        size = per_instance["prefill"]
        instances = tuple(tuple(pods["prefill"][i : i + size]) for i in range(0, len(pods["prefill"]), size))
        out.append(Replica(instances, tuple(pods["decode"])))
    return out


def tree_topology(tree: Mapping[str, Any]) -> Topology:
    """The Topology bench/packing.py recorded (`tree_of`)."""
    switches = tree["switches"]
    nodes = tree["nodes"]
    children: dict[str, list[str]] = defaultdict(list)
    members: dict[str, list[str]] = defaultdict(list)
    for name, s in switches.items():
        if s["parent"]:
            children[s["parent"]].append(name)
    for name, n in nodes.items():
        members[n["switch"]].append(name)
    return Topology(
        {
            name: Switch(name, s["tier"], s["parent"], tuple(sorted(children[name])), tuple(sorted(members[name])))
            for name, s in switches.items()
        },
        {name: NodeSpec(name, n["switch"], n["gpus"], "", "") for name, n in nodes.items()},
    )


# -- the simulation -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    at: float
    replica: int
    instance: int
    decode: int


def nic_bytes_per_second(pods: Sequence[Pod], kv: KVModel) -> float:
    return sum(p.gpus for p in pods) * kv.link(1).bandwidth_gbps * 1e9


def request_rate(replica: Replica, kv: KVModel, load: float) -> float:
    """Requests/s at which the replica offers `load` of its narrower side's NIC bandwidth."""
    prefill = nic_bytes_per_second([p for inst in replica.prefill for p in inst], kv)
    decode = nic_bytes_per_second(replica.decode, kv)
    return load * min(prefill, decode) / kv.request_bytes


def arrivals(replicas: Sequence[Replica], kv: KVModel, load: float, count: int, seed: int) -> list[Request]:
    """`count` requests: the superposition of one Poisson process per replica (seeded)."""
    rng = random.Random(seed)
    rates = [request_rate(r, kv, load) for r in replicas]
    total = sum(rates)
    t = 0.0
    out = []
    for _ in range(count):
        t += rng.expovariate(total)
        i = rng.choices(range(len(replicas)), weights=rates)[0]
        out.append(Request(t, i, rng.randrange(len(replicas[i].prefill)), rng.randrange(len(replicas[i].decode))))
    return out


def simulate(fabric: Fabric, replicas: Sequence[Replica], requests: Sequence[Request]) -> list[float]:
    """Each request's KV-transfer time in seconds, in arrival order."""
    kv = fabric.kv
    capacity: dict[tuple[str, str], float] = {}
    flows: dict[int, list[tuple[str, str]]] = {}  # flow -> links
    left: dict[int, float] = {}  # flow -> bytes still to send
    owner: dict[int, int] = {}  # flow -> request
    pending = dict.fromkeys(range(len(requests)), 0)  # request -> flows in flight
    finished = [math.nan] * len(requests)
    next_flow = 0

    def add(req_index: int) -> None:
        nonlocal next_flow
        req = requests[req_index]
        replica = replicas[req.replica]
        dst = replica.decode[req.decode]
        senders = replica.prefill[req.instance]
        for src in senders:
            same = src.node == dst.node
            bandwidth = kv.link(0 if same else 1).bandwidth_gbps * 1e9
            medium = "nvlink" if same else "nic"
            links = [(f"{medium}-tx", src.name), (f"{medium}-rx", dst.name), *fabric.path(src.node, dst.node)]
            capacity[links[0]] = src.gpus * bandwidth
            capacity[links[1]] = dst.gpus * bandwidth
            for link in links[2:]:
                if link not in capacity:
                    capacity[link] = fabric.uplink_capacity(link[1])
            flows[next_flow] = links
            left[next_flow] = kv.request_bytes / len(senders)
            owner[next_flow] = req_index
            pending[req_index] += 1
            next_flow += 1

    now, i = 0.0, 0
    rates: dict[int, float] = {}
    while i < len(requests) or flows:
        next_arrival = requests[i].at if i < len(requests) else math.inf
        next_done = min((left[f] / rates[f] for f in flows if rates.get(f, 0) > 0), default=math.inf)
        step = min(next_arrival - now, next_done)
        for f in flows:
            left[f] -= rates.get(f, 0.0) * step
        now += step
        for f in [f for f in flows if left[f] <= 1.0]:  # within a byte: done
            del flows[f], left[f]
            r = owner.pop(f)
            pending[r] -= 1
            if pending[r] == 0:
                finished[r] = now
        while i < len(requests) and requests[i].at <= now:
            add(i)
            i += 1
        rates = max_min_rates(flows, capacity)
    out = []
    for r, req in enumerate(requests):
        replica = replicas[req.replica]
        dst = replica.decode[req.decode]
        tier = max(fabric.tier(src.node, dst.node) for src in replica.prefill[req.instance])
        out.append(finished[r] - req.at + kv.link(tier).latency_us * 1e-6)
    return out


def offered_peak(fabric: Fabric, replicas: Sequence[Replica], load: float) -> float:
    """The busiest switch uplink's expected utilization (above 1: the queue grows without bound)."""
    kv = fabric.kv
    carried: dict[tuple[str, str], float] = defaultdict(float)
    for replica in replicas:
        rate = request_rate(replica, kv, load) * kv.request_bytes
        pairs = [(inst, d) for inst in replica.prefill for d in replica.decode]
        for inst, d in pairs:
            for src in inst:
                for link in fabric.path(src.node, d.node):
                    carried[link] += rate / len(pairs) / len(inst)
    return max((v / fabric.uplink_capacity(link[1]) for link, v in carried.items()), default=0.0)


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


# -- the report ------------------------------------------------------------------------------------

PLACEMENTS = {"hard": "stormtopo hard, tier 1", "baseline": "no topology"}


def compare(packing: Mapping[str, Any], scenario: str, requests: int, seed: int = 5) -> dict[str, Any]:
    """p50/p99 per oversubscription and load, with and without stormtopo, for the replicas both
    placed (the same first replicas of the stream: only their placement differs)."""
    kv = parse_kv_model(yaml.safe_load(DEFAULT_KV_CONFIG.read_text()))
    topology = tree_topology(packing["tree"])
    modes = packing[scenario]["modes"]
    common = min(len(modes[m]["replicas"]) for m in PLACEMENTS)
    placed = {m: replicas_from(modes[m]["replicas"][:common]) for m in PLACEMENTS}
    warmup = requests // 10  # the network starts empty: drop the first tenth
    rows = []
    for r in OVERSUBSCRIPTION:
        for load in LOADS:
            row: dict[str, Any] = {"oversubscription": r, "load": load}
            for mode, reps in placed.items():
                fabric = Fabric(topology, kv, r)
                reqs = arrivals(reps, kv, load, requests, seed)  # identical for both: same shapes, same seed
                times = simulate(fabric, reps, reqs)[warmup:]
                row[mode] = {
                    "p50_ms": round(percentile(times, 50) * 1e3, 3),
                    "p99_ms": round(percentile(times, 99) * 1e3, 3),
                    "mean_ms": round(statistics.fmean(times) * 1e3, 3),
                    "peak_uplink_utilization": round(offered_peak(fabric, reps, load), 3),
                }
            row["p50_ratio"] = round(row["baseline"]["p50_ms"] / row["hard"]["p50_ms"], 3)
            row["p99_ratio"] = round(row["baseline"]["p99_ms"] / row["hard"]["p99_ms"], 3)
            rows.append(row)
    return {
        "scenario": scenario,
        "replicas": common,
        "pairs_tier": {m: _tiers(topology, reps) for m, reps in placed.items()},
        "requests": requests,
        "warmup": warmup,
        "idle_transfer_ms": {t: round(kv.seconds(t) * 1e3, 3) for t in range(topology.tiers + 2)},
        "rows": rows,
    }


def _tiers(topology: Topology, replicas: Sequence[Replica]) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for r in replicas:
        for inst in r.prefill:
            for d in r.decode:
                counts[f"tier{max(crossed_tier(topology.span([p.node, d.node]), topology.tiers) for p in inst)}"] += 1
    return dict(sorted(counts.items()))


def markdown(result: Mapping[str, Any]) -> str:
    lines = [
        f"Scenario `{result['scenario']}`: {result['replicas']} replicas placed by both, "
        f"{result['requests']} requests per cell ({result['warmup']} warm-up dropped). "
        f"Prefill->decode pairs by tier crossed: stormtopo {result['pairs_tier']['hard']}, "
        f"no topology {result['pairs_tier']['baseline']}.",
        "",
        "| oversubscription | load | p50 stormtopo | p50 no topology | p50 ratio | p99 stormtopo | p99 no topology | p99 ratio "
        "| peak uplink util. (storm / none) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        h, b = row["hard"], row["baseline"]
        lines.append(
            f"| {row['oversubscription']}:1 | {row['load']:.0%} | {h['p50_ms']} ms | {b['p50_ms']} ms | {row['p50_ratio']}x "
            f"| {h['p99_ms']} ms | {b['p99_ms']} ms | {row['p99_ratio']}x "
            f"| {h['peak_uplink_utilization']} / {b['peak_uplink_utilization']} |"
        )
    return "\n".join(lines)


def plot(results: Sequence[Mapping[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4.2), squeeze=False)
    for ax, result in zip(axes[0], results, strict=True):
        for r, colour in zip(OVERSUBSCRIPTION, ("tab:green", "tab:orange", "tab:red"), strict=True):
            rows = [row for row in result["rows"] if row["oversubscription"] == r]
            loads = [row["load"] * 100 for row in rows]
            ax.plot(loads, [row["baseline"]["p99_ms"] for row in rows], "--o", color=colour, label=f"no topology, {r}:1")
            ax.plot(loads, [row["hard"]["p99_ms"] for row in rows], "-s", color=colour, label=f"stormtopo, {r}:1")
        ax.set_yscale("log")
        ax.set_xlabel("offered load, % of each replica's NIC bandwidth")
        ax.set_ylabel("p99 KV-transfer time (ms)")
        ax.set_title(f"{result['scenario']} cluster, {result['replicas']} replicas")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write(
    packing: Mapping[str, Any], source: str, stem: Path, requests: int = 2000, provenance: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Both starting states of a packing run: STEM.json (after `provenance`, bench/record.py's) and the plot STEM.png."""
    out = [compare(packing, scenario, requests) for scenario in ("empty", "fragmented")]
    stem.with_suffix(".json").write_text(json.dumps({**(provenance or {}), "source": source, "results": out}, indent=2) + "\n")
    plot(out, stem.with_suffix(".png"))
    return out
