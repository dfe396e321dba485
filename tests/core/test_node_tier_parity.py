"""One rule, one source (issue 33, item 7): the node tier's rule in Python (stormtopo/core/topology/node_tier.py,
what the operator ships) and in Go (tools/volcano-sim/sim/nodetier.go, what the simulator behind
BENCHMARKS.md's figures runs) give the same list on the same generated cases, and the parameters the
operator ships are the ones the Go side calls shipped.

The Go side runs as tools/volcano-sim/cmd/nodetier (JSON cases on stdin, the lists on stdout). It imports
the standard library only and builds in seconds; the binary is cached outside the checkout
(~/.cache/stormtopo/nodetier, or $STORMTOPO_CACHE_DIR), keyed by a digest of the Go sources and the Go
version, so a run after the first costs well under a second."""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import os
import random
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, fields
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from stormtopo.core import node_tier_pass
from stormtopo.core.topology import node_tier
from stormtopo.core.topology.node_tier import (
    node_hypernode_name,
    node_tier_members,
    plan_node_tier,
    shortlist,
    whole_node_run,
)
from stormtopo.core.topology.tree import NodeSpec, Switch, Topology
from stormtopo.core.vocabulary import MANAGED_BY, NODE_TIER_LABEL
from stormtopo.core.writes import CreateHyperNode, DeleteHyperNode
from stormtopo.operator.config import OperatorConfig, parse_args
from stormtopo.operator.node_tier import NodeTier

pytestmark = pytest.mark.skipif(shutil.which("go") is None, reason="go is not on PATH: the Go side of the node-tier rule cannot be built")

ROOT = Path(__file__).resolve().parents[2]
SIM_MODULE = ROOT / "tools" / "volcano-sim"
CASES = 1000
PARAMS = ("per_free", "next_empty", "spare_runs", "spare_empty", "sticky", "keep_pairs", "keep_runs")


# ---- the Go side -----------------------------------------------------------------------------------------


def _go_env() -> dict[str, str]:
    # As stormtopo/devenv/components.go_env: every module is pinned in go.mod; a local toolchain only.
    return {**os.environ, "GOFLAGS": "-mod=mod", "CGO_ENABLED": "0", "GOTOOLCHAIN": os.environ.get("GOTOOLCHAIN", "local")}


def _cache_root() -> Path:
    return Path(os.environ.get("STORMTOPO_CACHE_DIR", Path.home() / ".cache" / "stormtopo"))


@pytest.fixture(scope="module")
def go_rule() -> Path:
    """The built command, from the cache when its sources have not changed."""
    sources = [
        SIM_MODULE / "go.mod",
        SIM_MODULE / "go.sum",
        *sorted(p for p in (SIM_MODULE / "sim").glob("*.go") if not p.name.endswith("_test.go")),
        *sorted((SIM_MODULE / "cmd" / "nodetier").glob("*.go")),
    ]
    version = subprocess.run(["go", "env", "GOVERSION"], env=_go_env(), capture_output=True, text=True, check=True).stdout.strip()
    digest = hashlib.sha256(version.encode())
    for path in sources:
        digest.update(str(path.relative_to(SIM_MODULE)).encode() + b"\0" + path.read_bytes() + b"\0")
    binary = _cache_root() / "nodetier" / digest.hexdigest()[:16] / "nodetier"
    if not binary.exists():
        binary.parent.mkdir(parents=True, exist_ok=True)
        # A unique temporary name, then an atomic rename: two runs building at once both succeed.
        fd, tmp = tempfile.mkstemp(dir=binary.parent, prefix=".nodetier-")
        os.close(fd)
        proc = subprocess.run(
            ["go", "build", "-trimpath", "-o", tmp, "./cmd/nodetier"], cwd=SIM_MODULE, env=_go_env(), capture_output=True, text=True
        )
        if proc.returncode != 0:
            os.unlink(tmp)
            pytest.fail(f"building tools/volcano-sim/cmd/nodetier failed:\n{proc.stderr[-4000:]}")
        os.replace(tmp, binary)
    return binary


def _go(binary: Path, args: Sequence[str] = (), stdin: str = "") -> Any:
    proc = subprocess.run([str(binary), *args], input=stdin, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"nodetier {' '.join(args)} failed: {proc.stderr}"
    return json.loads(proc.stdout)


# ---- generated cases -------------------------------------------------------------------------------------


def _case(seed: int) -> dict[str, Any]:
    """One cluster state and one set of parameters: leaves (in no particular order, some empty), nodes of
    one size or of several (a GPU lost, a node with none), GPUs in use from none to more than the node
    has, replicas of whole-node pods or not, the nodes listed before; a quarter with the shipped parameters."""
    rng = random.Random(seed)
    sizes = rng.choice([[8], [8], [8], [4], [8, 4], [8, 4, 2], [8, 8, 8, 0], [8, 7]])
    leaves, gpus, used = [], {}, {}
    names = rng.sample(range(100), rng.randint(1, 7))
    count = 0
    for i in names:
        nodes = []
        for _ in range(rng.choice([0, 1, 2, 3, 4, 4, 6, 8, 8] if len(names) > 1 else [1, 4, 8])):
            node = f"node-{rng.randint(0, 99):02d}{count:03d}"
            count += 1
            size = rng.choice(sizes)
            gpus[node] = size
            roll = rng.random()
            if roll < 0.4:
                pass  # empty (left out of used, or 0)
            elif roll < 0.5:
                used[node] = 0
            elif roll < 0.6:
                used[node] = size  # full
            elif roll < 0.62:
                used[node] = size + rng.randint(1, 4)  # allocatable dropped below what runs there
            elif size > 0:
                used[node] = rng.choice([size // 2, rng.randint(1, size)])
            nodes.append(node)
        leaves.append({"name": f"leaf-{rng.choice('abcxyz')}{i:02d}", "nodes": nodes})
    if rng.random() < 0.25:
        params: dict[str, Any] = {}  # the shipped parameters, filled in by the test
    else:
        params = {
            "per_free": rng.choice([0, 1, 2, 2, 3]),
            "next_empty": rng.choice([0, 1, 1, 2, 3]),
            "spare_runs": rng.choice([0, 1, 2, 6, 6, 8]),
            "spare_empty": rng.choice([0, 1, 1, 2]),
            "sticky": rng.random() < 0.5,
            "keep_pairs": rng.random() < 0.5,
            "keep_runs": rng.random() < 0.5,
        }
    largest = max(sizes)
    replicas = [
        [rng.choice([largest, largest, largest // 2, 1, 2, largest + 1]) for _ in range(rng.randint(1, 5))]
        for _ in range(rng.randint(0, 3))
    ]
    every = [n for leaf in leaves for n in leaf["nodes"]]
    keep = rng.sample(every, rng.randint(0, min(len(every), 6)))
    return {"leaves": leaves, "gpus": gpus, "used": used, "params": params, "replicas": replicas, "keep": keep}


def _python_list(case: Mapping[str, Any]) -> list[str]:
    """The Python rule on a case: shortlist, the run of whole-node pods taken as the operator takes it."""
    p = case["params"]
    switches = {leaf["name"]: Switch(leaf["name"], 1, None, (), tuple(leaf["nodes"])) for leaf in case["leaves"]}
    nodes = {n: NodeSpec(n, leaf["name"], case["gpus"][n], "0", "0") for leaf in case["leaves"] for n in leaf["nodes"]}
    largest = max((spec.gpus for spec in nodes.values()), default=0)
    run = whole_node_run(case["replicas"], largest) if p["keep_runs"] else 0
    return shortlist(
        Topology(switches, nodes),
        case["used"],
        per_free=p["per_free"],
        next_empty=p["next_empty"],
        whole_node_run=run,
        spare_runs=p["spare_runs"],
        spare_empty=p["spare_empty"],
        keep=set(case["keep"]) if p["sticky"] else (),
        keep_pairs=p["keep_pairs"],
    )


def _first_difference(cases: Sequence[Mapping[str, Any]], ours: Sequence[Any], theirs: Sequence[Any], what: str) -> str:
    for i, (case, a, b) in enumerate(zip(cases, ours, theirs, strict=True)):
        if a != b:
            diff = sum(x != y for x, y in zip(ours, theirs, strict=True))
            shown = json.dumps(case, indent=1)
            return f"{diff} of {len(cases)} cases differ ({what}); the first, case {i}:\n{shown}\nPython: {a}\nGo:     {b}"
    return ""


# ---- what the operator ships -----------------------------------------------------------------------------


def _defaults(function: Callable[..., Any]) -> dict[str, Any]:
    return {name: p.default for name, p in inspect.signature(function).parameters.items() if p.default is not inspect.Parameter.empty}


def _operator_call(keep_runs: bool = NodeTier.keep_runs) -> dict[str, Any]:
    """The arguments the operator's node tier passes to plan_node_tier in one pass (with a StormService
    asking for a topology for a replica of two whole-node pods), captured."""
    calls: list[dict[str, Any]] = []

    def capture(*args: Any, **kwargs: Any) -> list[Any]:
        calls.append(kwargs)
        return []

    async def free_gpus(*args: Any, **kwargs: Any) -> dict[str, int]:
        return {"n1": 8}

    async def allocatable_gpus(*args: Any, **kwargs: Any) -> dict[str, int]:
        return {"n1": 8}

    service = {
        "metadata": {"namespace": "ns", "name": "svc", "generation": 1, "annotations": {"stormtopo.io/topology": "hard"}},
        "spec": {"replicas": 1, "template": {}},
    }
    services = {("ns", "svc"): service}
    index = SimpleNamespace(
        pods_bound=0,
        pods_freed=0,
        hypernode_changes=1,
        hypernodes={},
        stormservices=services,
        nodes={},
        nodes_read_at=0.0,
        node_reads=0,
        stormservices_in_play=lambda: services,
    )
    # Whatever else the node tier is given to read the GPUs with (its fields without a default but the index).
    readings = SimpleNamespace(free_gpus=free_gpus, allocatable_gpus=allocatable_gpus)
    given = {f.name: readings for f in fields(NodeTier) if f.init and f.default is MISSING and f.default_factory is MISSING}
    tier = NodeTier(**{**given, "index": index, "keep_runs": keep_runs})
    mp = pytest.MonkeyPatch()
    mp.setattr(node_tier_pass, "plan_node_tier", capture)  # the pass's planner, as the operator's shell calls it
    mp.setattr(node_tier_pass, "replica_shape", lambda s: ((8, 8), None))
    mp.setattr(node_tier_pass, "is_opted_in", lambda annotations: True)
    try:
        asyncio.run(tier.check())
    finally:
        mp.undo()
    assert len(calls) == 1, calls
    return calls[0]


def _shipped_python() -> dict[str, Any]:
    """The rule's parameters as the operator runs it, with the chart's and the flags' defaults: what
    plan_node_tier takes by default, what the operator passes instead, and what shortlist takes by
    default where plan_node_tier has no say (spare_runs)."""
    call = {**_defaults(plan_node_tier), **_operator_call()}
    return {
        "per_free": call["per_free"],
        "next_empty": call["next_empty"],
        "spare_runs": _defaults(shortlist)["spare_runs"],
        "spare_empty": call["spare_empty"],
        "sticky": call["sticky"],
        "keep_pairs": call["keep_pairs"],
        # --node-tier-keep-runs: the operator passes the replicas' shapes only with it (see the test below)
        "keep_runs": bool(call["replicas"]),
    }


# ---- the tests -------------------------------------------------------------------------------------------


def test_python_and_go_give_the_same_list(go_rule: Path) -> None:
    shipped = _go(go_rule, ["-shipped"])
    cases = [_case(seed) for seed in range(CASES)]
    for case in cases:
        case["params"] = case["params"] or dict(shipped)
    theirs = _go(go_rule, stdin=json.dumps({"cases": cases}))["lists"]
    ours = [_python_list(case) for case in cases]
    assert not (problem := _first_difference(cases, ours, theirs, "the list, in order")), problem
    # The cases are not all alike: most list something, many list empty nodes and partly used ones.
    assert sum(bool(x) for x in ours) > CASES * 0.8
    assert len({json.dumps(case["params"], sort_keys=True) for case in cases}) > CASES // 2


def test_the_planner_lists_what_the_go_rule_lists(go_rule: Path) -> None:
    """Through plan_node_tier, as the operator calls it (its HyperNodes, the tier-0 ones it made for the
    nodes listed before): after its writes, the tier-0 HyperNodes are those of the Go rule's list."""
    shipped = _go(go_rule, ["-shipped"])
    call = _operator_call()
    cases = [_case(seed) for seed in range(CASES, CASES + 100)]
    ours, theirs = [], []
    for case in cases:
        case["params"] = dict(shipped)
        hypernodes: list[dict[str, Any]] = []
        for n in case["keep"]:
            member = {"type": "Node", "selector": {"exactMatch": {"name": n}}}
            labels = {**MANAGED_BY, NODE_TIER_LABEL: "true"}
            hypernodes.append({"metadata": {"name": node_hypernode_name(n), "labels": labels}, "spec": {"tier": 0, "members": [member]}})
        for leaf in case["leaves"]:
            members = [
                {"type": "HyperNode", "selector": {"exactMatch": {"name": node_hypernode_name(n)}}}
                if n in case["keep"]
                else {"type": "Node", "selector": {"exactMatch": {"name": n}}}
                for n in leaf["nodes"]
            ]
            hypernodes.append({"metadata": {"name": leaf["name"]}, "spec": {"tier": 1, "members": members}})
        kwargs = {k: v for k, v in call.items() if k not in ("replicas", "node_labels", "named_leaves")}
        writes = plan_node_tier(hypernodes, case["used"], case["gpus"], replicas=case["replicas"] if shipped["keep_runs"] else (), **kwargs)
        tier0 = {node_hypernode_name(n) for n in case["keep"]}
        tier0 |= {w.body["metadata"]["name"] for w in writes if isinstance(w, CreateHyperNode)}
        tier0 -= {w.name for w in writes if isinstance(w, DeleteHyperNode)}
        names = node_tier_members(hn for hn in hypernodes if hn["spec"]["tier"] == 0)
        names |= {node_hypernode_name(n): n for n in case["gpus"]}
        ours.append(sorted(names[name] for name in tier0))
    theirs = [sorted(x) for x in _go(go_rule, stdin=json.dumps({"cases": cases}))["lists"]]
    assert not (problem := _first_difference(cases, ours, theirs, "the nodes with a tier-0 HyperNode after the planner's writes")), problem


def test_the_shipped_rule_is_one(go_rule: Path) -> None:
    """The operator's parameters (chart and flag defaults) are the Go side's shipped ones; the chart's
    nodeTier values are the flags' defaults."""
    assert _shipped_python() == _go(go_rule, ["-shipped"])
    assert set(PARAMS) == set(_go(go_rule, ["-shipped"]))
    values = yaml.safe_load((ROOT / "deploy" / "helm" / "stormtopo" / "values.yaml").read_text())["nodeTier"]
    config = parse_args([])
    assert config == OperatorConfig()
    assert (values["enabled"], values["keepRuns"], tuple(values["leaves"])) == (
        config.node_tier,
        config.node_tier_keep_runs,
        config.node_tier_leaf,
    )
    assert NodeTier.keep_runs == config.node_tier_keep_runs
    # keep_runs: the operator passes the replicas' shapes (the run of whole-node pods) with it, none without.
    assert _operator_call(keep_runs=False)["replicas"] == frozenset()
    assert _operator_call(keep_runs=True)["replicas"] == frozenset({(8, 8)})


def test_the_planners_defaults_are_the_shipped_rule(go_rule: Path) -> None:
    planner = _defaults(plan_node_tier)
    shipped = _go(go_rule, ["-shipped"])
    assert {k: planner[k] for k in ("per_free", "next_empty", "spare_empty", "sticky", "keep_pairs")} == {
        k: shipped[k] for k in ("per_free", "next_empty", "spare_empty", "sticky", "keep_pairs")
    }
    assert _defaults(shortlist)["spare_runs"] == node_tier.SPARE_RUNS == shipped["spare_runs"]
