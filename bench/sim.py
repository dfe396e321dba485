"""`make bench-sim`: Volcano's own allocate action and plugins at scale, without a cluster (issue 21).

The simulator is a Go test, tools/volcano-sim/sim, built against the Volcano the dev cluster runs
(v1.15.1, the same module requirements and volcano.sh/apis shim as tools/k8s135) and configured with
the scheduler conf the dev cluster ships (stormtopo/devenv/cluster.py). This driver writes its spec
(fabric, starting state, the packing bench's stream of replicas, HyperNode layouts and plugin settings),
runs the compiled test (cached in ~/.cache/stormtopo/sim, keyed by its sources), and reduces what it
reports to bench/results/sim.json and a table (bench/results/sim.md).

Per fabric size, start, setting and layout:
- node level: replicas whose pods share one node, against the offline optimum (the Go test computes an
  upper bound and a best-fit witness; `exact` when the witness meets every bound);
- leaf level: replicas within one leaf (all of them, for a hard tier-1 topology that placed them);
- packing: nodes and leaves in use at the end of the stream, against the offline node-first best-fit
  witness (each replica that fits one node on the fullest node that holds it, any other in the fullest
  leaf that holds it): min(witness / actual) over nodes and leaves; 1.0 = as tight as the witness. The
  same against the plain lower bound (GPUs asked over GPUs per node or leaf, ignoring node-first) is
  reported too: it is conservative, as node-first must open a node for a replica no used node holds;
- allocate time per replica with a topology (all; those that fit one node; those that do not), and per
  gang without one, means, as ratios against the leaf-only layout with the shipped conf in the same run.
  The layouts take turns (replica i in every layout, then replica i+1), so a noisy shared machine
  loads them alike.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.fabric import fragmentation
from bench.packing import arrivals
from stormtopo.core.topology.node_tier import SPARE_EMPTY
from stormtopo.devenv import cluster, components

RESULTS = Path(__file__).resolve().parent / "results"
SIM_MODULE = components.TOOLS_DIR / "volcano-sim"
VOLCANO = "v1.15.1"
LEAF_SIZE = 32
LEAVES_PER_SPINE = 16
NODE_GPUS = 8
STREAM_SEED = 29  # the packing bench's stream
NORMAL_SEED = 31
FRAGMENTATION_SEED = 7  # the packing bench's fragmented start

LAYOUTS = ("leaf", "node-all", "node-partial", "node-partial-next", "node-bucket")
# Arguments added to network-topology-aware's in the shipped conf. The shipped conf weighs GPUs 2 and
# leaves CPU and memory at Volcano's default 1.
SETTINGS: dict[str, dict[str, Any]] = {
    "shipped": {},
    "normal-pod-off": {"hypernode.binpack.normal-pod.enable": False},
    "gpu-only": {"hypernode.binpack.cpu": 0, "hypernode.binpack.memory": 0},
    "gpu-only+normal-pod-off": {"hypernode.binpack.cpu": 0, "hypernode.binpack.memory": 0, "hypernode.binpack.normal-pod.enable": False},
}
DEFAULT_SETTINGS = ("shipped", "normal-pod-off")
# nodes -> (replicas with a topology, gangs without one, layouts). Every layout with a HyperNode per
# node costs Volcano time quadratic in the nodes; at 16,384 only the layouts that keep few HyperNodes.
DEFAULT_SIZES: dict[int, tuple[int, int, tuple[str, ...]]] = {
    1024: (64, 32, LAYOUTS),
    4096: (24, 8, ("leaf", "node-partial-next", "node-bucket")),
    16384: (8, 4, ("leaf", "node-bucket")),
}


# The node tier's rules: stormtopo's ("fewest-pairs": every replica that fits one node gets one, partly used
# nodes listed so as to keep pairs), and --node-tier-keep-runs ("-pairs": runs of empty nodes kept too).
SHIPPED = "fewest-pairs"


def spec(
    sizes: Mapping[int, tuple[int, int, Sequence[str]]],
    starts: Sequence[str],
    settings: Sequence[str],
    out: Path,
    batch: int = 1,
    opening: str = SHIPPED,
) -> dict[str, Any]:
    cases = []
    for nodes, (gangs, normal, layouts) in sizes.items():
        names = [f"node-{i:05d}" for i in range(nodes)]  # the Go test names nodes the same way
        for start in starts:
            used = fragmentation(names, seed=FRAGMENTATION_SEED, gpus=NODE_GPUS) if start == "fragmented" else {}
            cases.append(
                {
                    "name": f"{nodes}-{start}",
                    "nodes": nodes,
                    "leaf_size": LEAF_SIZE,
                    "leaves_per_spine": LEAVES_PER_SPINE,
                    "node_gpus": NODE_GPUS,
                    "start": start,
                    "init_used": [used.get(n, 0) for n in names],
                    "gangs": [_gang(a.name, a.shape, a.pod_gpus) for a in arrivals(gangs, seed=STREAM_SEED)],
                    "normal": [_gang(f"plain-{a.name}", a.shape, a.pod_gpus) for a in arrivals(normal, seed=NORMAL_SEED)],
                    "layouts": list(layouts),
                    # The operator knows how many replicas are pending: as many interchangeable nodes per free
                    # amount, and as many next empty nodes, as replicas may arrive in one session.
                    "bucket_per_free": max(2, batch),
                    "next_empty": batch,
                    "spare_empty": SPARE_EMPTY,
                    "batch": batch,
                    "opening": opening,
                }
            )
    return {
        "scheduler_conf": cluster.SCHEDULER_CONF,
        "cases": cases,
        "settings": [{"name": name, "args": SETTINGS[name]} for name in settings],
        "out": str(out),
    }


# The packing bench's full run uses the 64 nodes under one spine: 8 leaves of 8 nodes.
PACKING_LEAVES, PACKING_LEAF_SIZE = 8, 8
OPENINGS = (SHIPPED, "-pairs")
# Every rule the Go test's Case.Opening knows (N: a whole number).
OPENING_RULES = r"(|fewest)(-lonely|-pairs)?|keep-all|keep-runs-upto|runs-2k|spare-runs-\d+|per-size(\d+)?"


def packing_spec(
    seeds: Sequence[int],
    openings: Sequence[str],
    out: Path,
    replicas: int = 60,
    repeats: int = 1,
    next_empty: int = 1,
    spare_empty: int = SPARE_EMPTY,
    sticky: bool = False,
) -> dict[str, Any]:
    """The packing bench's full run (python -m bench packing) in the simulator, for other streams:
    one case per stream seed, start and opening rule; leaf only once per stream and start. `repeats`:
    each case again (Volcano breaks ties in Go map order: the same case varies by a replica or two)."""
    nodes = PACKING_LEAVES * PACKING_LEAF_SIZE
    names = [f"node-{i:05d}" for i in range(nodes)]
    cases = []
    for seed in seeds:
        gangs = [_gang(a.name, a.shape, a.pod_gpus) for a in arrivals(replicas, seed=seed)]
        for start in ("empty", "fragmented"):
            used = fragmentation(names, seed=FRAGMENTATION_SEED, gpus=NODE_GPUS) if start == "fragmented" else {}
            for i, opening in enumerate(openings):
                cases.append(
                    {
                        "name": f"{seed}/{start}/{opening or 'shipped'}",
                        "nodes": nodes,
                        "leaf_size": PACKING_LEAF_SIZE,
                        "leaves_per_spine": PACKING_LEAVES,
                        "node_gpus": NODE_GPUS,
                        "start": start,
                        "init_used": [used.get(n, 0) for n in names],
                        "gangs": gangs,
                        "normal": [],
                        "layouts": ["leaf", "node-bucket"] if i == 0 else ["node-bucket"],
                        "bucket_per_free": 2,
                        "next_empty": next_empty,
                        "spare_empty": spare_empty,
                        "sticky": sticky,
                        "batch": 1,
                        "opening": opening,
                    }
                )
    cases = [{**case, "name": f"{case['name']}#{i}"} for i in range(repeats) for case in cases] if repeats > 1 else cases
    return {"scheduler_conf": cluster.SCHEDULER_CONF, "cases": cases, "settings": [{"name": "shipped", "args": {}}], "out": str(out)}


def packing_rows(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per record: replicas placed within their leaf before the first that was not, as bench.packing
    counts them; and of those that one node could hold when they arrived, the fraction on one node."""
    rows = []
    for r in records:
        gangs = r["gangs"]
        within = next((i for i, g in enumerate(gangs) if not g["placed"] or not g["one_leaf"]), len(gangs))
        fitting = [g for g in gangs[:within] if g.get("fits_free_node")]
        seed, start, opening = r["case"].partition("#")[0].split("/")
        rows.append(
            {
                "seed": int(seed),
                "start": start,
                "rule": "leaf only" if r["layout"] == "leaf" else opening,
                "before_first_wait": within,
                "one_node_where_one_fits": round(sum(g["one_node"] for g in fitting) / len(fitting), 2) if fitting else None,
                "list_changes_per_replica": round(r.get("list_changes", 0) / len(gangs), 2) if gangs else None,
            }
        )
    return rows


def _gang(name: str, kind: str, pods: Sequence[int]) -> dict[str, Any]:
    return {"name": name, "kind": kind, "pods": list(pods)}


def build() -> Path:
    """The compiled simulator, built once per version of its sources (outside the checkout)."""
    module = components.prepare_volcano_module(VOLCANO)
    digest = hashlib.sha256()
    sources = [SIM_MODULE / "go.mod", SIM_MODULE / "go.sum", *sorted((SIM_MODULE / "sim").glob("*.go"))]
    sources += sorted((module / "apis-compat").glob("*.go"))
    for path in sources:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    binary = components.cache_root() / "sim" / f"volcano-{VOLCANO}-{digest.hexdigest()[:12]}" / "sim.test"
    if binary.exists():
        return binary
    binary.parent.mkdir(parents=True, exist_ok=True)
    print(f"bench-sim: building the simulator (cached in {binary.parent})", flush=True)
    # -p 1: the machine is shared; a cold build of Volcano's scheduler takes a few minutes either way.
    cmd = ["go", "test", "-c", "-p", "1", "-trimpath", "-o", str(binary) + ".tmp", "./sim"]
    proc = subprocess.run(cmd, cwd=SIM_MODULE, env=components.go_env(), capture_output=True, text=True)
    if proc.returncode != 0:
        raise components.BuildError(f"building the simulator failed:\n{proc.stderr[-4000:]}")
    Path(str(binary) + ".tmp").rename(binary)
    return binary


def run(
    sizes: Mapping[int, tuple[int, int, Sequence[str]]],
    starts: Sequence[str],
    settings: Sequence[str],
    batch: int = 1,
    opening: str = SHIPPED,
) -> list[dict[str, Any]]:
    """Run the simulator; one record per (size, start, setting, layout), as the Go test writes them."""
    return _run(lambda out: spec(sizes, starts, settings, out, batch, opening))


def _run(make_spec: Callable[[Path], dict[str, Any]]) -> list[dict[str, Any]]:
    binary = build()
    work = Path(tempfile.mkdtemp(prefix="stormtopo-sim-"))
    out = work / "results.jsonl"
    (work / "spec.json").write_text(json.dumps(make_spec(out)))
    env = {**components.go_env(), "SIM_SPEC": str(work / "spec.json")}
    command = [str(binary), "-test.run", "^TestSim$", "-test.v", "-test.timeout", "0"]
    with subprocess.Popen(command, cwd=work, env=env, text=True, stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:  # one line per (size, start, setting, layout) as it finishes
            print(line.rstrip(), flush=True)
    if proc.returncode != 0:
        raise RuntimeError(f"the simulator failed (exit {proc.returncode}); its spec is in {work}")
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b else None


def summarise(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per record; times as ratios against leaf-only with the first setting (shipped) in its case."""
    baseline = {}
    for r in records:
        if r["layout"] == "leaf" and r["case"] not in baseline:
            baseline[r["case"]] = r
    rows = []
    for r in records:
        gangs, opt = r["gangs"], r["optimum"]
        base = baseline.get(r["case"])
        base_gangs = base["gangs"] if base else []
        topo_s, base_topo = _mean([g["allocate_s"] for g in gangs]), _mean([g["allocate_s"] for g in base_gangs])
        fit_s, base_fit = (_mean([g["allocate_s"] for g in gs if g["fits_node"]]) for gs in (gangs, base_gangs))
        big_s, base_big = (_mean([g["allocate_s"] for g in gs if not g["fits_node"]]) for gs in (gangs, base_gangs))
        normal_s = _mean(r["normal_allocate_s"])
        base_normal = _mean(base["normal_allocate_s"]) if base else None
        one_node = sum(g["one_node"] for g in gangs)
        packing = {
            reference: min(
                opt[f"used_nodes_{reference}"] / r["used_nodes"] if r["used_nodes"] else 1.0,
                opt[f"used_leaves_{reference}"] / r["used_leaves"] if r["used_leaves"] else 1.0,
            )
            for reference in ("lower", "greedy")
        }
        rows.append(
            {
                "nodes": r["nodes"],
                "start": r["start"],
                "setting": r["setting"],
                "layout": r["layout"],
                "replicas": len(gangs),
                "placed": sum(g["placed"] for g in gangs),
                "one_node": one_node,
                "one_node_optimum": opt["one_node_greedy"],
                "node_level": round(one_node / opt["one_node_greedy"], 2) if opt["one_node_greedy"] else 1.0,
                "leaf_level": round(sum(g["one_leaf"] for g in gangs) / len(gangs), 2) if gangs else 1.0,
                "used_nodes": r["used_nodes"],
                "used_nodes_witness": opt["used_nodes_greedy"],
                "used_nodes_lower": opt["used_nodes_lower"],
                "used_leaves": r["used_leaves"],
                "used_leaves_witness": opt["used_leaves_greedy"],
                "used_leaves_lower": opt["used_leaves_lower"],
                "packing": round(packing["greedy"], 2),
                "packing_vs_lower_bound": round(packing["lower"], 2),
                "optimum_exact": opt["exact"],
                "hypernodes_mean": round(statistics.fmean([g["hypernodes"] for g in gangs]) or 0),
                "allocate_ms_per_replica": round(topo_s * 1000, 1) if topo_s is not None else None,
                "allocate_vs_leaf": _ratio(topo_s, base_topo),
                "allocate_vs_leaf_fits_node": _ratio(fit_s, base_fit),
                "allocate_vs_leaf_multi_node": _ratio(big_s, base_big),
                "allocate_median_vs_leaf": _ratio(
                    _median([g["allocate_s"] for g in gangs]), _median([g["allocate_s"] for g in base_gangs])
                ),
                "plain_ms_per_gang": round(normal_s * 1000, 1) if normal_s is not None else None,
                "plain_vs_leaf": _ratio(normal_s, base_normal),
                "plain_median_vs_leaf": _ratio(_median(r["normal_allocate_s"]), _median(base["normal_allocate_s"]) if base else None),
                "plain_placed": f"{r['normal_placed']}/{len(r['normal_allocate_s'] or [])}",
                "plain_opened_nodes": r.get("normal_opened_nodes"),
            }
        )
    return rows


COLUMNS = (
    ("nodes", "nodes"),
    ("start", "start"),
    ("setting", "setting"),
    ("layout", "layout"),
    ("placed", "placed"),
    ("one node / optimum", None),
    ("node level", "node_level"),
    ("leaf level", "leaf_level"),
    ("nodes used / witness / bound", None),
    ("leaves used / witness / bound", None),
    ("packing", "packing"),
    ("packing vs bound", "packing_vs_lower_bound"),
    ("HyperNodes", "hypernodes_mean"),
    ("allocate ms / replica", "allocate_ms_per_replica"),
    ("vs leaf", "allocate_vs_leaf"),
    ("vs leaf: fits a node / not", None),
    ("plain ms / gang", "plain_ms_per_gang"),
    ("vs leaf (plain)", "plain_vs_leaf"),
    ("plain: empty nodes opened", "plain_opened_nodes"),
)


def table(rows: Sequence[Mapping[str, Any]]) -> str:
    lines = ["| " + " | ".join(title for title, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        cells = []
        for title, key in COLUMNS:
            if title == "one node / optimum":
                cells.append(f"{row['one_node']}/{row['one_node_optimum']}")
            elif title.startswith(("nodes used", "leaves used")):
                what = title.split()[0]
                cells.append(f"{row[f'used_{what}']}/{row[f'used_{what}_witness']}/{row[f'used_{what}_lower']}")
            elif title.startswith("vs leaf: fits"):
                fits, big = row["allocate_vs_leaf_fits_node"], row["allocate_vs_leaf_multi_node"]
                cells.append(f"{'—' if fits is None else fits} / {'—' if big is None else big}")
            elif key == "placed":
                cells.append(f"{row['placed']}/{row['replicas']}")
            else:
                value = row[key]  # type: ignore[index]
                cells.append("—" if value is None else f"{value:,}" if isinstance(value, int) else str(value))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _sizes(text: str | None) -> dict[int, tuple[int, int, tuple[str, ...]]]:
    """--sizes 1024,4096=16 -> those sizes (with N replicas where given), defaults otherwise."""
    if not text:
        return dict(DEFAULT_SIZES)
    out = {}
    for item in text.split(","):
        nodes_text, _, gangs_text = item.partition("=")
        nodes = int(nodes_text)
        gangs, normal, layouts = DEFAULT_SIZES.get(nodes, (16, 4, LAYOUTS))
        out[nodes] = (int(gangs_text) if gangs_text else gangs, normal, layouts)
    return out


def scale(
    sizes: Mapping[int, tuple[int, int, Sequence[str]]],
    starts: Sequence[str],
    settings: Sequence[str],
    batch: int = 1,
    opening: str = SHIPPED,
) -> dict[str, Any]:
    """`python -m bench sim`: every size, start, setting and layout; the result and its rows."""
    started = time.monotonic()
    records = run(sizes, starts, settings, batch, opening)
    return {
        "volcano": VOLCANO,
        "fabric": {"leaf_size": LEAF_SIZE, "leaves_per_spine": LEAVES_PER_SPINE, "node_gpus": NODE_GPUS},
        "settings": {name: SETTINGS[name] for name in settings},
        "batch": batch,
        "opening": opening,
        "seconds": round(time.monotonic() - started, 1),
        "rows": summarise(records),
        "records": records,
    }


def dump(result: Mapping[str, Any]) -> str:
    """One line per row and per record: the per-replica records make an indented file large."""
    rows, records = result["rows"], result["records"]
    lines = [json.dumps({k: v for k, v in result.items() if k not in ("rows", "records")})[:-1] + ', "rows": [']
    lines.append(",\n".join(json.dumps(row) for row in rows) + '], "records": [')
    lines.append(",\n".join(json.dumps(record, separators=(",", ":")) for record in records) + "]}")
    return "\n".join(lines) + "\n"


def packing(
    seeds: Sequence[int],
    openings: Sequence[str],
    repeats: int = 1,
    next_empty: int = 1,
    spare_empty: int = SPARE_EMPTY,
    sticky: bool = False,
) -> dict[str, Any]:
    """`python -m bench sim-packing`: the packing bench's full run for these stream seeds, leaf only and
    each opening rule."""
    started = time.monotonic()
    rows = packing_rows(
        _run(lambda out: packing_spec(seeds, openings, out, repeats=repeats, next_empty=next_empty, spare_empty=spare_empty, sticky=sticky))
    )
    return {
        "volcano": VOLCANO,
        "seeds": list(seeds),
        "repeats": repeats,
        "next_empty": next_empty,
        "spare_empty": spare_empty,
        "sticky": sticky,
        "seconds": round(time.monotonic() - started, 1),
        "rows": rows,
    }


def packing_table(result: Mapping[str, Any]) -> str:
    rows, seeds, repeats = result["rows"], result["seeds"], result["repeats"]
    rules = list(dict.fromkeys(r["rule"] for r in rows))
    heading = (
        "placed, lowest-highest over the repeats (one node where one fits, mean)" if repeats > 1 else "placed (one node where one fits)"
    )
    lines = ["| start | seed | " + " | ".join(f"{rule}: {heading}" for rule in rules) + " |", "|---|---|" + "---|" * len(rules)]
    for start in ("empty", "fragmented"):
        for seed in seeds:
            cells = []
            for rule in rules:
                runs = [r for r in rows if r["seed"] == seed and r["start"] == start and r["rule"] == rule]
                placed = sorted(r["before_first_wait"] for r in runs)
                fractions = [r["one_node_where_one_fits"] for r in runs if r["one_node_where_one_fits"] is not None]
                span = str(placed[0]) if placed[0] == placed[-1] else f"{placed[0]}-{placed[-1]}"
                cells.append(f"{span} ({round(statistics.fmean(fractions), 2) if fractions else '—'})")
            lines.append(f"| {start} | {seed} | " + " | ".join(cells) + " |")
        totals = [sum(r["before_first_wait"] for r in rows if r["start"] == start and r["rule"] == rule) / repeats for rule in rules]
        lines.append(f"| {start} | all, mean | " + " | ".join(f"{t:g}" for t in totals) + " |")
    return "\n".join(lines)
