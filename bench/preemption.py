"""`python -m bench preemption`: Volcano's topology-aware preemption against the fewest victims that would do
(issue 41 item 3, "never more than needed, measured").

A cluster of nodes with 8 GPUs each, under leaves of 2 to 8 nodes (HyperNodes of tier 1) and spines of up to
8 leaves (tier 2), is filled with running jobs: single pods and multi-pod gangs (minMember all of their pods,
or one fewer), pods of 1, 2, 4 or 8 GPUs, at priorities 10 to 40, and some at the preemptor's own priority
(never victims), all in one queue, until no node has 4 GPUs free: what is free is scattered. Then one gang of
priority 100 arrives, a replica of 2 pods x 8 GPUs or 2 x 4, with a hard tier-1 networkTopology (within one
leaf) or a soft one (anywhere). Volcano v1.15.1 runs the scheduler conf the dev cluster ships (enqueue,
allocate, preempt, gangpreempt, backfill; tools/volcano-sim/sim/preempt_test.go) for up to 4 sessions, the
evicted pods ending between sessions, and records its victims and where the gang landed.

The anchor is exact: a mixed-integer program (HiGHS through scipy's milp, as bench/leaf_optimum.py) that finds
the fewest victim pods, and separately the fewest victim GPUs, such that the gang fits within one leaf (hard)
or anywhere (soft), taking only pods of strictly lower priority. A victim job whose running pods would fall
below its minMember is lost whole: all its pods count, as Volcano's gang bundles treat it
(pkg/scheduler/actions/utils/bundle.go: a "whole" bundle). Volcano's victims are counted the same way: the pods
it evicted, and the rest of every job it left below its minMember.
"""

from __future__ import annotations

import json
import random
import subprocess
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from stormtopo.core.preemption import Holder, plan_preemption
from stormtopo.core.topology.tree import NodeSpec, Switch, Topology
from stormtopo.core.victims import Fewest, GangSize

NODE_GPUS = 8
PREEMPTOR_PRIORITY = 100
VICTIM_PRIORITIES = (10, 20, 30, 40)
LEAVES_PER_SPINE = 8
SHAPES: tuple[tuple[int, ...], ...] = ((8, 8), (4, 4))
MODES = ("hard", "soft")
# volcano: Volcano alone picks the victims. stormtopo: stormtopo's plan (core/preemption.py, as exact
# preemption runs it: core/preempting.py) is evicted first, then the gang goes to Volcano, which finds the room
# releasing. stormtopo-gpus: the same, asked for the fewest GPUs first (--exact-preemption-fewest gpus).
# narrowed (soft only): nothing evicted by stormtopo; the gang goes to Volcano hard within tier 1 where some leaf's
# lower-priority work can make room (core/narrowing.py, on by default), else soft as it is; Volcano picks the victims.
ARMS = ("volcano", "stormtopo", "stormtopo-gpus", "narrowed")
SESSIONS = 4
NEAR = 1.1  # the bound: victims within 1.1 times the minimum
# Per size: nodes -> seeds. quick: 64 nodes only.
SIZES: dict[str, dict[int, tuple[int, ...]]] = {
    "quick": {64: (1, 2, 3)},
    "full": {64: tuple(range(1, 21)), 1024: tuple(range(1, 11))},
}


@dataclass(frozen=True)
class Pod:
    job: str
    index: int
    node: str
    gpus: int

    @property
    def name(self) -> str:
        return f"{self.job}-{self.index}"


@dataclass(frozen=True)
class Job:
    name: str
    priority: int
    min_member: int
    pods: tuple[Pod, ...]


@dataclass(frozen=True)
class Cluster:
    leaves: dict[str, tuple[str, ...]]  # leaf -> its nodes
    spine_of: dict[str, str]  # leaf -> spine
    jobs: tuple[Job, ...]
    node_gpus: int = NODE_GPUS

    @property
    def leaf_of(self) -> dict[str, str]:
        return {n: leaf for leaf, nodes in self.leaves.items() for n in nodes}

    def free(self) -> dict[str, int]:
        used: Counter[str] = Counter()
        for job in self.jobs:
            for pod in job.pods:
                used[pod.node] += pod.gpus
        return {n: self.node_gpus - used[n] for nodes in self.leaves.values() for n in nodes}


@dataclass(frozen=True)
class Gang:
    pods: tuple[int, ...]
    mode: str  # hard: within one leaf; soft: anywhere
    priority: int = PREEMPTOR_PRIORITY


@dataclass(frozen=True)
class Minimum:
    """The exact minimum: `cost` pods (or GPUs) lost, `pods` and `gpus` of that choice, `victims` their names;
    None where no choice of victims lets the gang fit."""

    cost: int
    pods: int
    gpus: int
    victims: tuple[str, ...]


# ---- the cluster ------------------------------------------------------------------------------------------


def fabric(nodes: int, seed: int) -> tuple[dict[str, tuple[str, ...]], dict[str, str]]:
    """Leaves of 2 to 8 nodes (seeded), LEAVES_PER_SPINE leaves a spine."""
    rng = random.Random(f"fabric-{seed}")
    leaves: dict[str, tuple[str, ...]] = {}
    spine_of: dict[str, str] = {}
    i = 0
    while i < nodes:
        size = min(rng.randint(2, 8), nodes - i)
        if nodes - i - size == 1:  # never a leaf of one node
            size += 1 if size < 8 else -1
        leaf = f"leaf-{len(leaves):04d}"
        leaves[leaf] = tuple(f"node-{j:05d}" for j in range(i, i + size))
        spine_of[leaf] = f"spine-{len(spine_of) // LEAVES_PER_SPINE:03d}"
        i += size
    return leaves, spine_of


def fill(leaves: Mapping[str, Sequence[str]], seed: int, node_gpus: int = NODE_GPUS, busy: float = 0.9) -> tuple[Job, ...]:
    """Running jobs until `busy` of the GPUs are taken, then single small pods until no node has 4 GPUs free.
    A gang's pods go to one leaf where it can (as a tier-1 replica would), else anywhere. 15% of the jobs run at
    the preemptor's priority."""
    rng = random.Random(f"fill-{seed}")
    nodes = [n for ns in leaves.values() for n in ns]
    free = dict.fromkeys(nodes, node_gpus)
    jobs: list[Job] = []

    def job(pods: Sequence[tuple[str, int]], min_member: int) -> None:
        name = f"job-{len(jobs):05d}"
        priority = PREEMPTOR_PRIORITY if rng.random() < 0.15 else rng.choice(VICTIM_PRIORITIES)
        for n, g in pods:
            free[n] -= g
        jobs.append(Job(name, priority, min_member, tuple(Pod(name, i, n, g) for i, (n, g) in enumerate(pods))))

    def place(count: int, gpus: int, where: Sequence[str]) -> list[tuple[str, int]] | None:
        room = dict(free)
        out = []
        for _ in range(count):
            fits = [n for n in where if room[n] >= gpus]
            if not fits:
                return None
            n = rng.choice(fits)
            room[n] -= gpus
            out.append((n, gpus))
        return out

    total, failures = node_gpus * len(nodes), 0
    while sum(free.values()) > (1 - busy) * total and failures < 200:
        count = rng.choice((1, 1, 1, 1, 2, 2, 3, 4))
        gpus = rng.choice((1, 2, 2, 4, 4, 8))
        leaf = rng.choice(list(leaves))
        pods = place(count, gpus, leaves[leaf]) or place(count, gpus, nodes)
        if pods is None:
            failures += 1
            continue
        job(pods, count if count == 1 or rng.random() < 0.75 else count - 1)
    for n in nodes:  # scatter what is left: no node keeps 4 GPUs free
        while free[n] >= 4:
            job([(n, rng.choice([g for g in (1, 2, 4) if g <= free[n] - 1] or [1]))], 1)
    return tuple(jobs)


def cluster(nodes: int, seed: int) -> Cluster:
    leaves, spine_of = fabric(nodes, seed)
    return Cluster(leaves, spine_of, fill(leaves, seed))


# ---- stormtopo's choice -----------------------------------------------------------------------------------


def topology_of(c: Cluster) -> Topology:
    """The cluster's HyperNodes as stormtopo reads them: leaves of tier 1 under spines of tier 2."""
    switches = {leaf: Switch(leaf, 1, c.spine_of[leaf], (), tuple(nodes)) for leaf, nodes in c.leaves.items()}
    for spine in sorted(set(c.spine_of.values())):
        switches[spine] = Switch(spine, 2, None, tuple(leaf for leaf in c.leaves if c.spine_of[leaf] == spine), ())
    nodes = {n: NodeSpec(n, leaf, c.node_gpus, "96", "1Ti") for leaf, ns in c.leaves.items() for n in ns}
    return Topology(switches=switches, nodes=nodes)


def stormtopo_victims(c: Cluster, gang: Gang, fewest: Fewest = Fewest.PODS) -> tuple[list[str], float]:
    """The pods stormtopo preempts for the gang (its plan over the cluster as the operator reads it: every
    pod's GPUs, priority and gang, each gang taken to run at its minMember, as the operator reads no other
    team's PodGroup: operator/room.py gangs_now), and the seconds the plan took."""
    holders: dict[str, list[Holder]] = defaultdict(list)
    names: dict[str, list[str]] = defaultdict(list)
    for job in c.jobs:
        for pod in job.pods:
            holders[pod.node].append(Holder(pod.gpus, job.priority, True, job.name))
            names[pod.node].append(pod.name)
    gangs = {j.name: GangSize(len(j.pods), len(j.pods), sum(p.gpus for p in j.pods)) for j in c.jobs}
    started = time.perf_counter()
    plan = plan_preemption(topology_of(c), c.free(), holders, gang.pods, gang.priority, 1, gangs, soft=gang.mode == "soft", fewest=fewest)
    seconds = time.perf_counter() - started
    return ([] if plan.victims is None else sorted(names[n][i] for n, i in plan.victims.chosen)), seconds


def narrowed(c: Cluster, gang: Gang) -> Gang:
    """The gang as narrowing sends it to Volcano: hard within tier 1 where some leaf's lower-priority work makes
    room for it (the operator's rule: core/preempting.py over the same reading), else as it is."""
    if gang.mode != "soft" or not stormtopo_victims(c, replace(gang, mode="hard"))[0]:
        return gang
    return replace(gang, mode="hard")


# ---- the exact minimum ------------------------------------------------------------------------------------


def minimum(c: Cluster, gang: Gang, objective: str = "pods", pods_at_most: int | None = None) -> Minimum | None:
    """The fewest victim pods (objective "pods") or GPUs ("gpus") that let the gang fit: within one leaf
    (hard; each leaf solved on its own, the least kept) or anywhere (soft), losing at most `pods_at_most` pods
    where given. None: no choice does."""
    if gang.mode == "soft":
        return _solve(c, gang, c.free(), list(c.leaf_of), objective, pods_at_most=pods_at_most)
    best: Minimum | None = None
    free = c.free()
    for nodes in c.leaves.values():
        if len(nodes) * c.node_gpus < sum(gang.pods) or (best is not None and best.cost == 0):
            continue
        found = _solve(c, gang, free, list(nodes), objective, bound=None if best is None else best.cost, pods_at_most=pods_at_most)
        if found is not None and (best is None or (found.cost, found.victims) < (best.cost, best.victims)):
            best = found
    return best


def near_both(c: Cluster, gang: Gang, fewest: Minimum | None, least: Minimum | None, within: float = NEAR) -> bool | None:
    """Whether any choice of victims is within `within` of both minima at once (pods and GPUs): the fewest GPUs
    among choices losing at most `within` times the fewest pods, against `within` times the fewest GPUs."""
    if fewest is None or least is None:
        return None
    joint = minimum(c, gang, "gpus", pods_at_most=int(within * fewest.cost + 1e-9))
    return joint is not None and joint.cost <= int(within * least.cost + 1e-9)


def minimum_in_leaf(c: Cluster, gang: Gang, leaf: str, objective: str = "pods") -> Minimum | None:
    """The exact minimum within one given leaf (where Volcano placed a hard gang)."""
    return _solve(c, gang, c.free(), list(c.leaves[leaf]), objective)


def _solve(
    c: Cluster,
    gang: Gang,
    free: Mapping[str, int],
    nodes: Sequence[str],
    objective: str,
    bound: int | None = None,
    pods_at_most: int | None = None,
) -> Minimum | None:
    """One program: the gang's pods on `nodes`, victims among the pods of lower priority (a job left below its
    minMember evicted whole, wherever its other pods run)."""
    on = set(nodes)
    jobs = [j for j in c.jobs if j.priority < gang.priority and any(p.node in on for p in j.pods)]
    pods = [p for j in jobs for p in j.pods]
    sizes = sorted(Counter(gang.pods).items())
    n_pods, n_jobs, n_place = len(pods), len(jobs), len(sizes) * len(nodes)
    variables = n_pods + n_jobs + n_place  # x[pod] evicted, w[job] lost whole, c[size, node] gang pods placed
    index = {p.name: i for i, p in enumerate(pods)}
    rows: list[np.ndarray[Any, Any]] = []
    lower: list[float] = []
    upper: list[float] = []

    def row() -> np.ndarray[Any, Any]:
        return np.zeros(variables)

    for k, n in enumerate(nodes):  # the gang's pods on n within its free GPUs and those its victims free
        r = row()
        for s, (size, _) in enumerate(sizes):
            r[n_pods + n_jobs + s * len(nodes) + k] = size
        for p in pods:
            if p.node == n:
                r[index[p.name]] = -p.gpus
        rows.append(r)
        lower.append(-np.inf)
        upper.append(free[n])
    for s, (_, count) in enumerate(sizes):  # every pod of the gang placed
        r = row()
        r[n_pods + n_jobs + s * len(nodes) : n_pods + n_jobs + (s + 1) * len(nodes)] = 1
        rows.append(r)
        lower.append(count)
        upper.append(count)
    for j, job in enumerate(jobs):
        # Up to its surplus (running pods over minMember) evicted alone; beyond it, the job is lost whole.
        r = row()
        for p in job.pods:
            r[index[p.name]] = 1
            whole = row()
            whole[index[p.name]] = 1
            whole[n_pods + j] = -1
            rows.append(whole)
            lower.append(0)
            upper.append(np.inf)
        r[n_pods + j] = -len(job.pods)
        rows.append(r)
        lower.append(-np.inf)
        upper.append(len(job.pods) - job.min_member)
    cost = np.zeros(variables)
    for p in pods:
        cost[index[p.name]] = 1 if objective == "pods" else p.gpus
    if bound is not None:  # a leaf that cannot beat the best so far is not worth solving to the end
        rows.append(cost.copy())
        lower.append(-np.inf)
        upper.append(bound)
    if pods_at_most is not None:  # the pods lost, bounded (is anything near both minima?)
        r = row()
        r[:n_pods] = 1
        rows.append(r)
        lower.append(-np.inf)
        upper.append(pods_at_most)
    high = np.concatenate([np.ones(n_pods + n_jobs), np.full(n_place, max(gang.pods.count(s) for s, _ in sizes))])
    result = milp(
        c=cost,
        constraints=LinearConstraint(np.array(rows), np.array(lower), np.array(upper)),
        integrality=np.ones(variables),
        bounds=Bounds(0, high),
    )
    if result.status != 0 or result.x is None:
        return None
    chosen = [p for p in pods if result.x[index[p.name]] > 0.5]
    return Minimum(round(float(result.fun)), len(chosen), sum(p.gpus for p in chosen), tuple(sorted(p.name for p in chosen)))


# ---- Volcano's victims, reduced ---------------------------------------------------------------------------


def lost(c: Cluster, evicted: Iterable[str]) -> list[Pod]:
    """The pods a set of evictions costs: those evicted, and every other pod of a job left below its minMember."""
    gone = set(evicted)
    out = []
    for job in c.jobs:
        left = sum(p.name not in gone for p in job.pods)
        whole = left < job.min_member and left < len(job.pods)
        out += [p for p in job.pods if whole or p.name in gone]
    return out


def reduce(c: Cluster, gang: Gang, record: Mapping[str, Any], fewest: Minimum | None, least_gpus: Minimum | None) -> dict[str, Any]:
    """One case: Volcano's victims against the exact minimum."""
    leaf_of = c.leaf_of
    evicted = [v["pod"] for v in record["victims"]]
    victims = lost(c, evicted)
    priority = {j.name: j.priority for j in c.jobs}
    placed_leaves = sorted({leaf_of[n] for n in record.get("nodes") or []})
    evicted_gpus = sum(v["gpus"] for v in record["victims"])
    out: dict[str, Any] = {
        "evicted_pods": len(evicted),
        "evicted_by_volcano": sum(v.get("session", 1) > 0 for v in record["victims"]),
        "evicted_gpus": evicted_gpus,
        "victim_pods": len(victims),
        "victim_gpus": sum(p.gpus for p in victims),
        "victim_priorities": dict(sorted(Counter(priority[p.job] for p in victims).items())),
        "victim_leaves": sorted({leaf_of[v["node"]] for v in record["victims"]}),
        "victim_spines": sorted({c.spine_of[leaf_of[v["node"]]] for v in record["victims"]}),
        "placed": bool(record["placed"]),
        "placed_leaves": placed_leaves,
        "sessions": len(record["sessions"]),
        "minimum_pods": None if fewest is None else fewest.cost,
        "minimum_gpus": None if least_gpus is None else least_gpus.cost,
        "minimum_victims": [] if fewest is None else list(fewest.victims),
    }
    # Hard, placed in one leaf: the minimum within that leaf too. Volcano's victims over it is what its choice
    # of victims within the leaf costs; that minimum over the cluster's, what its choice of leaf costs.
    in_leaf = minimum_in_leaf(c, gang, placed_leaves[0]) if gang.mode == "hard" and len(placed_leaves) == 1 else None
    out["minimum_pods_in_its_leaf"] = None if in_leaf is None else in_leaf.cost
    out["pods_vs_minimum_in_its_leaf"] = _ratio(out["victim_pods"], out["minimum_pods_in_its_leaf"])
    out["pods_vs_minimum"] = _ratio(out["victim_pods"], out["minimum_pods"])
    out["gpus_vs_minimum"] = _ratio(out["victim_gpus"], out["minimum_gpus"])
    out["missed"] = fewest is not None and not out["placed"]  # the solver finds a way, Volcano placed nothing
    out["evicted_in_vain"] = bool(evicted) and not out["placed"]
    return out


def _ratio(a: int, b: int | None) -> float | None:
    if b is None:
        return None
    if b == 0:
        return 1.0 if a == 0 else float("inf")
    return round(a / b, 3)


def _quantile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, max(0, int(np.ceil(q * len(ordered))) - 1))], 3)


def summarise(cases: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per size and mode: victims over the minimum (pods; GPUs) at the median and p95, the share of placed
    hard cases whose victims span more than one leaf, and the cases where the solver finds a way and Volcano
    placed nothing."""
    groups: dict[tuple[int, str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for case in cases:
        groups[(case["nodes"], case["mode"], case.get("arm", "volcano"))].append(case)
    rows = []
    for (nodes, mode, arm), group in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], ARMS.index(kv[0][2]))):
        plans = [g["plan_seconds"] for g in group if "plan_seconds" in g]
        placed = [g for g in group if g["placed"]]
        pods = [g["pods_vs_minimum"] for g in placed if g["pods_vs_minimum"] is not None]
        gpus = [g["gpus_vs_minimum"] for g in placed if g["gpus_vs_minimum"] is not None]
        in_leaf = [g["pods_vs_minimum_in_its_leaf"] for g in placed if g.get("pods_vs_minimum_in_its_leaf") is not None]
        rows.append(
            {
                "nodes": nodes,
                "mode": mode,
                "arm": arm,
                "cases": len(group),
                "placed": len(placed),
                "solvable": sum(g["minimum_pods"] is not None for g in group),
                "pods_vs_minimum_median": _quantile(pods, 0.5),
                "pods_vs_minimum_p95": _quantile(pods, 0.95),
                "gpus_vs_minimum_median": _quantile(gpus, 0.5),
                "gpus_vs_minimum_p95": _quantile(gpus, 0.95),
                "at_minimum": sum(p == 1.0 for p in pods),
                "pods_vs_minimum_in_its_leaf_median": _quantile(in_leaf, 0.5),
                "pods_vs_minimum_in_its_leaf_p95": _quantile(in_leaf, 0.95),
                "its_leaf_is_a_minimum_leaf": sum(
                    g["minimum_pods_in_its_leaf"] == g["minimum_pods"] for g in placed if g["mode"] == "hard"
                ),
                "victims_span_leaves": round(sum(len(g["victim_leaves"]) > 1 for g in placed) / len(placed), 3) if placed else None,
                "missed": [g["case"] for g in group if g["missed"]],
                "evicted_in_vain": [g["case"] for g in group if g["evicted_in_vain"]],
                "victim_pods_total": sum(g["victim_pods"] for g in group),
                "minimum_pods_total": sum(g["minimum_pods"] or 0 for g in group),
                "evicted_pods_total": sum(g["evicted_pods"] for g in group),
                "evicted_by_volcano_total": sum(g["evicted_by_volcano"] for g in group),
                "plan_seconds_median": _quantile(plans, 0.5),
                "plan_seconds_max": max(plans) if plans else None,
                "broken_gang_cases": sum(g["victim_pods"] > g["evicted_pods"] for g in group),
                "victim_gpus_total": sum(g["victim_gpus"] for g in group),
                "minimum_gpus_total": sum(g["minimum_gpus"] or 0 for g in group),
                "sessions_max": max(g["sessions"] for g in group),
                # Cases where some choice of victims is within NEAR of both minima at once (any arm: the same).
                "near_both_minima": sum(g.get("near_both_minima_exists") is True for g in group),
                "near_both_minima_of": sum(g.get("near_both_minima_exists") is not None for g in group),
            }
        )
    return rows


def table(rows: Sequence[Mapping[str, Any]]) -> str:
    head = (
        "| nodes | mode | victims chosen by | cases | placed / solvable | victim pods / minimum: median, p95 "
        "| victim GPUs / minimum: median, p95 "
        "| at the minimum | hard: victim pods / minimum in Volcano's leaf: median, p95 | hard: Volcano's leaf holds a minimum "
        "| victims over more than one leaf | not placed though the solver finds a way |"
    )
    lines = [head, "|" + "---|" * 12]
    for r in rows:
        span = "—" if r["victims_span_leaves"] is None else str(r["victims_span_leaves"])
        lines.append(
            f"| {r['nodes']:,} | {r['mode']} | {r.get('arm', 'volcano')} | {r['cases']} | {r['placed']}/{r['solvable']} "
            f"| {r['pods_vs_minimum_median']}, {r['pods_vs_minimum_p95']} | {r['gpus_vs_minimum_median']}, {r['gpus_vs_minimum_p95']} "
            f"| {r['at_minimum']}/{r['placed']} | {_pair(r, 'pods_vs_minimum_in_its_leaf')} "
            f"| {r['its_leaf_is_a_minimum_leaf'] if r['mode'] == 'hard' else '—'} | {span} | {len(r['missed'])} |"
        )
    return "\n".join(lines)


def _pair(row: Mapping[str, Any], key: str) -> str:
    median, p95 = row[f"{key}_median"], row[f"{key}_p95"]
    return "—" if median is None else f"{median}, {p95}"


# ---- running it -------------------------------------------------------------------------------------------


def case_name(nodes: int, seed: int, gang: Gang, arm: str = "volcano") -> str:
    return f"{nodes}/{seed}/{'x'.join(map(str, gang.pods))}/{gang.mode}" + ("" if arm == "volcano" else f"/{arm}")


def spec_case(name: str, c: Cluster, gang: Gang, evicted: Sequence[str] = ()) -> dict[str, Any]:
    return {
        "evicted": list(evicted),
        "name": name,
        "node_gpus": c.node_gpus,
        "leaves": [{"name": leaf, "spine": c.spine_of[leaf], "nodes": list(nodes)} for leaf, nodes in c.leaves.items()],
        "jobs": [
            {"name": j.name, "priority": j.priority, "min_member": j.min_member, "pods": [{"node": p.node, "gpus": p.gpus} for p in j.pods]}
            for j in c.jobs
        ],
        "gang": {"name": "preemptor", "priority": gang.priority, "pods": list(gang.pods), "mode": gang.mode, "tier": 1},
        "sessions": SESSIONS,
    }


def simulate(cases: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Run the Go test on these cases (the simulator bench/sim.py builds and caches); one record per case."""
    from bench import sim
    from stormtopo.devenv import cluster as devcluster
    from stormtopo.devenv import components

    binary = sim.build()
    work = Path(tempfile.mkdtemp(prefix="stormtopo-preempt-"))
    out = work / "results.jsonl"
    (work / "spec.json").write_text(json.dumps({"scheduler_conf": devcluster.SCHEDULER_CONF, "cases": list(cases), "out": str(out)}))
    env = {**components.go_env(), "PREEMPT_SPEC": str(work / "spec.json")}
    command = ["nice", "-n", "19", str(binary), "-test.run", "^TestPreempt$", "-test.v", "-test.timeout", "0"]
    # Volcano's own error lines (the predicates plugin's VolumeBinding Reserve finds no PVC lister entry for the
    # victims it puts back after a trial) go to stderr.log beside the spec, not to the terminal.
    with (
        (work / "stderr.log").open("w") as errors,
        subprocess.Popen(command, cwd=work, env=env, text=True, stdout=subprocess.PIPE, stderr=errors) as proc,
    ):
        assert proc.stdout is not None
        for line in proc.stdout:
            print(line.rstrip(), flush=True)
    if proc.returncode != 0:
        raise RuntimeError(f"the simulator failed (exit {proc.returncode}); its spec and stderr.log are in {work}")
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


def run(size: str) -> dict[str, Any]:
    started = time.monotonic()
    clusters: dict[tuple[int, int], Cluster] = {}
    specs, gangs, planned = [], {}, {}
    for nodes, seeds in SIZES[size].items():
        for seed in seeds:
            c = clusters[(nodes, seed)] = cluster(nodes, seed)
            for shape in SHAPES:
                for mode in MODES:
                    gang = Gang(shape, mode)
                    for arm in ARMS:
                        if arm == "narrowed" and mode != "soft":
                            continue
                        name = case_name(nodes, seed, gang, arm)
                        gangs[name] = (nodes, seed, gang, arm)
                        evicted: list[str] = []
                        if arm.startswith("stormtopo"):
                            fewest = Fewest.GPUS if arm == "stormtopo-gpus" else Fewest.PODS
                            evicted, planned[name] = stormtopo_victims(c, gang, fewest)
                        specs.append(spec_case(name, c, narrowed(c, gang) if arm == "narrowed" else gang, evicted))
    records = simulate(specs)
    simulated = time.monotonic() - started
    cases = []
    minima: dict[tuple[int, int, Gang], tuple[Minimum | None, Minimum | None]] = {}
    near: dict[tuple[int, int, Gang], bool | None] = {}
    for record in records:
        nodes, seed, gang, arm = gangs[record["case"]]
        c = clusters[(nodes, seed)]
        if (nodes, seed, gang) not in minima:
            minima[(nodes, seed, gang)] = fewest_pods, least_gpus = minimum(c, gang, "pods"), minimum(c, gang, "gpus")
            near[(nodes, seed, gang)] = near_both(c, gang, fewest_pods, least_gpus)
        reduced = reduce(c, gang, record, *minima[(nodes, seed, gang)]) | {"near_both_minima_exists": near[(nodes, seed, gang)]}
        extra = {"plan_seconds": round(planned[record["case"]], 4)} if record["case"] in planned else {}
        case = {"case": record["case"], "nodes": nodes, "seed": seed, "shape": list(gang.pods), "mode": gang.mode, "arm": arm}
        cases.append(case | reduced | extra)
    rows = summarise(cases)
    return {
        "volcano": "v1.15.1",
        "size": size,
        "fabric": {"node_gpus": NODE_GPUS, "leaf_nodes": "2-8", "leaves_per_spine": LEAVES_PER_SPINE},
        "preemptor_priority": PREEMPTOR_PRIORITY,
        "victim_priorities": list(VICTIM_PRIORITIES),
        "sessions": SESSIONS,
        "seconds": round(time.monotonic() - started, 1),
        "simulator_seconds": round(simulated, 1),
        "rows": rows,
        "cases": cases,
        "records": records,
    }


def headline(result: Mapping[str, Any]) -> dict[str, Any]:
    return {
        f"{r['nodes']}-{r['mode']}-{r.get('arm', 'volcano')}": {
            k: r[k] for k in ("pods_vs_minimum_median", "pods_vs_minimum_p95", "gpus_vs_minimum_median", "victims_span_leaves", "missed")
        }
        for r in result["rows"]
    } | {"seconds": result["seconds"]}
