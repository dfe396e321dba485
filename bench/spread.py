"""A replica's blast radius, simulated (issue 35, item 3): how much of a service one leaf or one spine failure
takes down, with and without `stormtopo.io/replica-spread-tier`, and what the spread costs in packing.

No cluster. Seeded StormServices of hard tier-1 replicas (1P1D or 2P2D, 1, 2, 4 or 8 GPUs a pod, 2 to 8
replicas) arrive and leave (Poisson arrivals, exponential lifetimes) on a 3-tier fabric, while leaves fail
and come back (Poisson failures, a fixed repair time). Each mode replays the same stream and failures:

- **Placement is Volcano's HyperNode binpack** as the repo models it (core/room.py `volcano_choices`):
  a hard tier-1 gang goes to the fullest leaf that packs it (`(used + request) / allocatable`, ties by
  name), each pod on the node with the least room that holds it (core/room.py `take`). A failed leaf's
  nodes take no pod. A replica that fits no leaf waits; waiting replicas are tried again, oldest service
  first, after every departure, failure and repair. A failed leaf's replicas are re-created and placed
  again as new replicas (their pods are gone, so the operator's spread applies to them again).
- **Without spread** (`off`): that choice. **With spread** (`leaf`: tier 1, `spine`: tier 2): the same
  choice among the leaves outside the domains the operator keeps out, as decided by the operator's own
  function (core/spread.py `_kept_out`, called with the replica's RoleSet spec, the siblings placed per
  spread-tier domain and the free GPUs of the live nodes): the domains holding more siblings than the
  least-held ones that have room for the whole replica within its own tier; none when no less-held
  domain has room. Replicas of one service are let go one at a time, each after the previous is placed,
  as the operator does; the time that takes (a Volcano session and a watch event per replica) is not
  modelled.

Measured at evenly spaced moments, per service with a placed replica (r replicas): the share of its
replicas one leaf failure takes down, max over leaves of its replicas there / r, and one spine failure
(the same over spines), against the even share ceil(r / live domains) / r; services above it while a
domain holding fewer than the even count has room for one of its replicas now ("room to spread").
Packing: replicas placed against the offline optimum of the same moment, exact (an integer program over
the live leaves, empty: every existing service's replicas re-placed at will, each within one leaf, with
pod sizes dividing each other, bench/leaf_optimum.py), under the same constraint: at most the even count
of a service per spread-tier domain; and against the optimum without that constraint.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from bench.fabric import fabric_yaml
from bench.leaf_optimum import demand, most_integer, most_within_leaves, room, size_classes
from stormtopo.core.packing import fits
from stormtopo.core.replica_pods import Replica
from stormtopo.core.room import take, volcano_choices
from stormtopo.core.spread import _kept_out
from stormtopo.core.topology.fabric import parse_topology
from stormtopo.core.topology.tree import Topology
from stormtopo.core.vocabulary import GPU

MODES: dict[str, int | None] = {"off": None, "leaf": 1, "spine": 2}  # the spread tier of each mode
POD_GPUS = (1, 2, 4, 8)
PODS_PER_ROLE = {"1P1D": 1, "2P2D": 2}
HOUR = 3600.0


@dataclass(frozen=True)
class Size:
    fabric: tuple[int, int, int]  # spines x leaves per spine x nodes per leaf (8 GPUs a node)
    hours: float  # simulated
    live: int  # services at the start, and on average
    lifetime: float  # mean lifetime of a service, simulated seconds (exponential)
    failures_per_hour: float  # leaf failures (Poisson), each a leaf drawn at random
    repair: float  # seconds a failed leaf stays down
    samples: int  # moments measured, evenly spaced


SIZES = {
    "quick": Size((2, 4, 2), hours=4.0, live=4, lifetime=2 * HOUR, failures_per_hour=0.5, repair=HOUR, samples=4),
    "full": Size((4, 8, 4), hours=48.0, live=14, lifetime=4 * HOUR, failures_per_hour=0.5, repair=HOUR, samples=24),
}


@dataclass(frozen=True)
class Service:
    name: str
    shape: str  # 1P1D or 2P2D
    gpus: int  # per pod
    replicas: int
    arrive: float
    leave: float

    @property
    def pods(self) -> tuple[int, ...]:
        return (self.gpus,) * (2 * PODS_PER_ROLE[self.shape])

    def roleset_spec(self) -> dict[str, Any]:
        """One replica's RoleSet spec, as core/spread.py reads it (core/gang.py replica_pods)."""
        container = {"resources": {"requests": {GPU: str(self.gpus)}}}
        return {
            "roles": [
                {"name": role, "replicas": PODS_PER_ROLE[self.shape], "template": {"spec": {"containers": [container]}}}
                for role in ("prefill", "decode")
            ]
        }


@dataclass(frozen=True)
class Failure:
    leaf: str
    at: float
    until: float


def stream(size: Size, leaves: Sequence[str], seed: int) -> tuple[list[Service], list[Failure]]:
    """`live` services at time 0, then Poisson arrivals at live / lifetime a second (about `live` exist at
    any time); leaf failures at `failures_per_hour`, each lasting `repair` (seeded)."""
    rng = random.Random(seed)
    duration = size.hours * HOUR
    services: list[Service] = []
    t = 0.0
    while True:
        if len(services) >= size.live:
            t += rng.expovariate(size.live / size.lifetime)
            if t >= duration:
                break
        shape = rng.choice(list(PODS_PER_ROLE))
        gpus = rng.choice(POD_GPUS)
        replicas = rng.randint(2, 8)
        services.append(Service(f"svc-{len(services):03d}", shape, gpus, replicas, t, t + rng.expovariate(1 / size.lifetime)))
    failures: list[Failure] = []
    t = 0.0
    while size.failures_per_hour > 0:
        t += rng.expovariate(size.failures_per_hour / HOUR)
        if t >= duration:
            break
        failures.append(Failure(rng.choice(list(leaves)), t, t + size.repair))
    return services, failures


class Cluster:
    """The fabric's free GPUs, the failed leaves, where each replica is, and the replicas waiting."""

    def __init__(self, topology: Topology, spread: int | None) -> None:
        self.topology = topology
        self.spread = spread
        self.allocatable = {n: spec.gpus for n, spec in topology.nodes.items()}
        self.free = dict(self.allocatable)
        self.leaves = sorted(s.name for s in topology.switches.values() if s.tier == 1)
        self.domain = {leaf: {t: _above(topology, leaf, t) for t in range(1, topology.tiers + 1)} for leaf in self.leaves}
        self.down: set[str] = set()
        self.services: dict[str, Service] = {}
        self.placed: dict[str, dict[int, tuple[str, dict[str, int]]]] = {}  # service -> replica -> (leaf, GPUs per node)
        self.waiting: set[tuple[str, int]] = set()
        self.decisions: list[float] = []  # seconds per call of the operator's rule
        # Per tier (1, 2): replicas placed in a domain holding more of their siblings than the least-held
        # domain with room for them then (avoidable), and than the least-held live domain (shared).
        self.avoidable: dict[int, set[tuple[str, int]]] = {1: set(), 2: set()}
        self.shared: dict[int, int] = {1: 0, 2: 0}

    def view(self) -> dict[str, int]:
        """Free GPUs as Volcano sees them: a failed leaf's nodes are not ready."""
        out = dict(self.free)
        for leaf in self.down:
            for node in self.topology.nodes_under(leaf):
                out[node] = 0
        return out

    def place(self, service: Service, index: int) -> bool:
        view = self.view()
        choices = [d for _, d in volcano_choices(self.topology, view, self.allocatable, service.pods, 1)]
        with_room = [d.switch.name for d in choices]
        siblings = self.placed.setdefault(service.name, {})
        if self.spread is not None and choices and siblings:
            tier = self.spread
            taken: dict[str, list[Replica]] = {}
            for other, (leaf, _) in sorted(siblings.items()):
                taken.setdefault(self.domain[leaf][tier], []).append(_replica(service, other))
            started = time.perf_counter()
            kept = _kept_out(self.topology, tier, 1, _replica(service, index), taken, view)
            self.decisions.append(time.perf_counter() - started)
            choices = [d for d in choices if self.domain[d.switch.name][tier] not in kept]
        for d in choices:
            after = take(view, d, service.pods)
            if after is None:
                continue
            held = {n: view[n] - after[n] for n in d.free_per_node if after[n] != view[n]}
            for tier in (1, 2):
                counts = self.counts(service.name, tier)
                here = counts.get(self.domain[d.switch.name][tier], 0)
                if here > min(counts.get(self.domain[leaf][tier], 0) for leaf in with_room):
                    self.avoidable[tier].add((service.name, index))
                if here > min(counts.get(self.domain[leaf][tier], 0) for leaf in self.leaves if leaf not in self.down):
                    self.shared[tier] += 1
            for n, gpus in held.items():
                self.free[n] -= gpus
            siblings[index] = (d.switch.name, held)
            return True
        return False

    def counts(self, service: str, tier: int) -> Counter[str]:
        return Counter(self.domain[leaf][tier] for leaf, _ in self.placed.get(service, {}).values())

    def release(self, service: str, index: int) -> None:
        _, held = self.placed[service].pop(index)
        for tier in (1, 2):
            self.avoidable[tier].discard((service, index))
        for n, gpus in held.items():
            self.free[n] += gpus

    def retry(self) -> None:
        """Every waiting replica tried again, oldest service first; a replica that fits no leaf does not
        block the others (Volcano tries each pending gang in a session)."""
        for name, index in sorted(self.waiting, key=lambda w: (self.services[w[0]].arrive, w)):
            if self.place(self.services[name], index):
                self.waiting.discard((name, index))

    def arrive(self, service: Service) -> None:
        self.services[service.name] = service
        self.waiting |= {(service.name, i) for i in range(service.replicas)}
        self.retry()

    def leave(self, service: Service) -> None:
        for index in list(self.placed.get(service.name, {})):
            self.release(service.name, index)
        self.placed.pop(service.name, None)
        self.waiting = {w for w in self.waiting if w[0] != service.name}
        del self.services[service.name]
        self.retry()

    def fail(self, leaf: str) -> None:
        self.down.add(leaf)
        for name, replicas in self.placed.items():
            for index, (where, _) in list(replicas.items()):
                if where == leaf:
                    self.release(name, index)
                    self.waiting.add((name, index))
        self.retry()

    def repair(self, leaf: str) -> None:
        self.down.discard(leaf)
        self.retry()


def _above(topology: Topology, switch: str, tier: int) -> str:
    current: str | None = switch
    while current is not None and topology.switches[current].tier != tier:
        current = topology.switches[current].parent
    if current is None:
        raise ValueError(f"no tier-{tier} switch above {switch}")
    return current


def _replica(service: Service, index: int) -> Replica:
    return Replica({"metadata": {"name": f"{service.name}-{index}"}, "spec": service.roleset_spec()}, ())


# -- measuring one moment ------------------------------------------------------------------------


@dataclass(frozen=True)
class Exposure:
    service: str
    replicas: int
    placed: int
    leaf_share: float  # max over leaves of its replicas there / replicas
    leaf_even: float  # ceil(replicas / live leaves) / replicas
    leaf_room: bool  # above the even share while a leaf holding fewer than the even count has room for a replica
    leaf_avoidable: bool  # above the even share, and a replica of it was placed where a less-held leaf had room then
    spine_share: float
    spine_even: float
    spine_room: bool
    spine_avoidable: bool


def exposure(cluster: Cluster, service: Service) -> Exposure:
    r = service.replicas
    placed = cluster.placed.get(service.name, {})
    view = cluster.view()
    out: dict[str, Any] = {}
    for tier, key in ((1, "leaf"), (2, "spine")):
        counts = cluster.counts(service.name, tier)
        live = sorted({cluster.domain[leaf][tier] for leaf in cluster.leaves if leaf not in cluster.down})
        even = math.ceil(r / len(live))
        share = max(counts.values(), default=0) / r
        room_now = False
        if share > even / r:
            under = {d for d in live if counts.get(d, 0) < even}
            room_now = any(
                cluster.domain[leaf][tier] in under and fits([view[n] for n in cluster.topology.nodes_under(leaf)], service.pods).fits
                for leaf in cluster.leaves
                if leaf not in cluster.down
            )
        avoidable = share > even / r and any((service.name, i) in cluster.avoidable[tier] for i in placed)
        out |= {f"{key}_share": share, f"{key}_even": even / r, f"{key}_room": room_now, f"{key}_avoidable": avoidable}
    return Exposure(service.name, r, len(placed), **out)


def most_placed(
    leaves: Sequence[Sequence[int]],
    groups: Sequence[str],
    services: Sequence[tuple[tuple[int, ...], int, int]],
) -> int:
    """The most replicas placed at once, each within one leaf, with at most `cap` of a service per group
    of leaves (its spread-tier domain): exact, the integer program of bench/leaf_optimum.py with a
    variable per (service, leaf). `leaves`: free GPUs per node; `groups`: each leaf's domain;
    `services`: (pods of one replica, replicas, cap per domain)."""
    wanted = [(pods, r, cap) for pods, r, cap in services if r > 0 and cap > 0 and pods]
    if not wanted or not leaves:
        return 0
    sizes = size_classes([p for pods, _, _ in wanted for p in pods])
    n_leaves = len(leaves)
    variables = len(wanted) * n_leaves  # x[s * n_leaves + l]: replicas of service s within leaf l
    rows, upper = [], []
    for s, (_, r, cap) in enumerate(wanted):
        row = np.zeros(variables)
        row[s * n_leaves : (s + 1) * n_leaves] = 1
        rows.append(row)
        upper.append(r)
        for group in sorted(set(groups)):
            row = np.zeros(variables)
            for leaf, g in enumerate(groups):
                if g == group:
                    row[s * n_leaves + leaf] = 1
            rows.append(row)
            upper.append(cap)
    for leaf, free in enumerate(leaves):
        for size in sizes:
            row = np.zeros(variables)
            for s, (pods, _, _) in enumerate(wanted):
                row[s * n_leaves + leaf] = demand(pods, size)
            rows.append(row)
            upper.append(room(free, size))
    return most_integer(variables, rows, upper, "the spread packing program")


def optimum(cluster: Cluster, tier: int | None) -> int:
    """The offline optimum of this moment: every existing service's replicas on the live leaves, empty,
    each within one leaf; with a spread tier, at most the even count of a service per live domain of it."""
    live = [leaf for leaf in cluster.leaves if leaf not in cluster.down]
    leaves = [[cluster.allocatable[n] for n in cluster.topology.nodes_under(leaf)] for leaf in live]
    services = list(cluster.services.values())
    if tier is None:
        return most_within_leaves(leaves, [s.pods for s in services for _ in range(s.replicas)])
    groups = [cluster.domain[leaf][tier] for leaf in live]
    domains = len(set(groups))
    return most_placed(leaves, groups, [(s.pods, s.replicas, math.ceil(s.replicas / domains)) for s in services])


# -- a run ---------------------------------------------------------------------------------------


def topology_of(size: Size) -> Topology:
    return parse_topology(fabric_yaml(*size.fabric))


def run_seed(size: Size, seed: int, modes: Sequence[str] = tuple(MODES)) -> dict[str, Any]:
    """Every mode on one seed's stream: what each sample measured."""
    topology = topology_of(size)
    leaves = sorted(s.name for s in topology.switches.values() if s.tier == 1)
    services, failures = stream(size, leaves, seed)
    duration = size.hours * HOUR
    events: list[tuple[float, int, str, Any]] = []  # (time, order at that time, kind, what)
    events += [(s.arrive, 3, "arrive", s) for s in services]
    events += [(s.leave, 0, "leave", s) for s in services if s.leave < duration]
    events += [(f.at, 2, "fail", f.leaf) for f in failures]
    events += [(f.until, 1, "repair", f.leaf) for f in failures if f.until < duration]
    events += [(duration * (k + 1) / size.samples, 4, "sample", k) for k in range(size.samples)]
    events.sort(key=lambda e: (e[0], e[1], getattr(e[3], "name", str(e[3]))))
    out: dict[str, Any] = {"seed": seed, "services": len(services), "failures": len(failures), "modes": {}}
    for mode in modes:
        started = time.monotonic()
        cluster = Cluster(topology, MODES[mode])
        samples = []
        for t, _, kind, what in events:
            if kind == "arrive":
                cluster.arrive(what)
            elif kind == "leave":
                cluster.leave(what)
            elif kind == "fail":
                if what not in cluster.down:
                    cluster.fail(what)
            elif kind == "repair":
                cluster.repair(what)
            else:
                existing = sorted(cluster.services.values(), key=lambda s: s.name)
                samples.append(
                    {
                        "t": t,
                        "down": sorted(cluster.down),
                        "wanted": sum(s.replicas for s in existing),
                        "placed": sum(len(cluster.placed.get(s.name, {})) for s in existing),
                        "optimum": optimum(cluster, MODES[mode]),
                        "optimum_unconstrained": optimum(cluster, None),
                        "used_gpus": sum(cluster.allocatable.values()) - sum(cluster.free.values()),
                        "exposure": [asdict(exposure(cluster, s)) for s in existing if cluster.placed.get(s.name)],
                    }
                )
        out["modes"][mode] = {
            "samples": samples,
            "avoidable_placements": {tier: len(v) for tier, v in cluster.avoidable.items()},
            "shared_placements": cluster.shared,
            "decisions": len(cluster.decisions),
            "decision_ms": _ms(cluster.decisions),
            "seconds": round(time.monotonic() - started, 2),
        }
    return out


def _ms(seconds: Sequence[float]) -> dict[str, float | None]:
    if not seconds:
        return {"mean": None, "p99": None}
    ordered = sorted(seconds)
    return {"mean": round(1000 * statistics.fmean(ordered), 3), "p99": round(1000 * ordered[int(0.99 * (len(ordered) - 1))], 3)}


def summary(runs: Sequence[Mapping[str, Any]], mode: str) -> dict[str, Any]:
    """Over every seed and sample: the shares one leaf and one spine failure take (median, mean, worst,
    how often at the even share, above it with room to spread), and packing against both optima."""
    samples = [s for r in runs for s in r["modes"][mode]["samples"]]
    exposures = [e for s in samples for e in s["exposure"]]
    out: dict[str, Any] = {"service_samples": len(exposures)}
    for key in ("leaf", "spine"):
        shares = [e[f"{key}_share"] for e in exposures]
        above = [e for e in exposures if e[f"{key}_share"] > e[f"{key}_even"] + 1e-9]
        out[key] = {
            "median": round(statistics.median(shares), 4) if shares else None,
            "mean": round(statistics.fmean(shares), 4) if shares else None,
            "worst": round(max(shares), 4) if shares else None,
            "even_share_median": round(statistics.median(e[f"{key}_even"] for e in exposures), 4) if exposures else None,
            "at_even": round(1 - len(above) / len(exposures), 4) if exposures else None,
            "above_even": len(above),
            "above_even_avoidable": sum(1 for e in above if e[f"{key}_avoidable"]),
            "above_even_with_room_now": sum(1 for e in above if e[f"{key}_room"]),
            "worst_excess": round(max((e[f"{key}_share"] - e[f"{key}_even"] for e in exposures), default=0.0), 4),
        }
    for key, opt in (("packing", "optimum"), ("packing_unconstrained", "optimum_unconstrained")):
        ratios = [s["placed"] / s[opt] for s in samples if s[opt]]
        out[key] = {
            "median": round(statistics.median(ratios), 4) if ratios else None,
            "worst": round(min(ratios), 4) if ratios else None,
            "total": round(sum(s["placed"] for s in samples) / max(1, sum(s[opt] for s in samples)), 4),
        }
    out["placed_of_wanted"] = round(sum(s["placed"] for s in samples) / max(1, sum(s["wanted"] for s in samples)), 4)
    out["used_gpus_mean"] = round(statistics.fmean(s["used_gpus"] for s in samples), 1) if samples else None
    for key, tier in (("leaf", 1), ("spine", 2)):
        out[key]["shared_placements"] = sum(r["modes"][mode]["shared_placements"][tier] for r in runs)
    decisions = [r["modes"][mode]["decision_ms"]["mean"] for r in runs if r["modes"][mode]["decision_ms"]["mean"] is not None]
    out["decision_ms_mean"] = round(statistics.fmean(decisions), 3) if decisions else None
    out["decision_ms_p99_worst"] = max(
        (r["modes"][mode]["decision_ms"]["p99"] for r in runs if r["modes"][mode]["decision_ms"]["p99"] is not None), default=None
    )
    out["seconds"] = round(sum(r["modes"][mode]["seconds"] for r in runs), 2)
    return out


def run(size_name: str, seeds: Sequence[int]) -> dict[str, Any]:
    size = SIZES[size_name]
    started = time.monotonic()
    runs = [run_seed(size, seed) for seed in seeds]
    topology = topology_of(size)
    return {
        "size": size_name,
        "setting": asdict(size),
        "nodes": len(topology.nodes),
        "gpus": sum(n.gpus for n in topology.nodes.values()),
        "seeds": list(seeds),
        "summary": {mode: summary(runs, mode) for mode in MODES},
        "runs": [_compact(r) for r in runs],
        "seconds": round(time.monotonic() - started, 1),
    }


def _compact(run: Mapping[str, Any]) -> dict[str, Any]:
    """A seed's run as written: each sample without its per-service exposures (summarised; megabytes)."""
    modes = {
        mode: {**m, "samples": [{k: v for k, v in sample.items() if k != "exposure"} for sample in m["samples"]]}
        for mode, m in run["modes"].items()
    }
    return {**run, "modes": modes}


def headline(out: Mapping[str, Any]) -> dict[str, Any]:
    return {
        mode: {k: s[k] for k in ("leaf", "spine", "packing", "packing_unconstrained", "placed_of_wanted", "used_gpus_mean")}
        for mode, s in out["summary"].items()
    } | {"seconds": out["seconds"]}


def markdown(out: Mapping[str, Any]) -> str:
    lines = [
        "| mode | one leaf: median; worst share (even: median) | above even (avoidable; room now) | one spine: median; worst | "
        "packing vs optimum, same constraint: median; worst | vs unconstrained |",
        "|---|---|---|---|---|---|",
    ]
    for mode, s in out["summary"].items():
        leaf, spine, free = s["leaf"], s["spine"], s["packing_unconstrained"]
        lines.append(
            f"| {mode} | {leaf['median']}; {leaf['worst']} ({leaf['even_share_median']}) | {leaf['above_even']} "
            f"({leaf['above_even_avoidable']}; {leaf['above_even_with_room_now']}) | {spine['median']}; {spine['worst']} | "
            f"{s['packing']['median']}; {s['packing']['worst']} | {free['median']}; {free['worst']} |"
        )
    return "\n".join(lines)
