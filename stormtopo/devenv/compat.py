"""`make compat`: the compatibility scenario on the real control plane, for every served release combination.

Two axes: every served AIBrix x Volcano pair on Kubernetes v1.35.3, and the newest pair on every other
served Kubernetes release (kube-apiserver, kube-controller-manager and kube-scheduler of that release).
Each run is one dev cluster (examples/topology/aibrix-1730.yaml), started only while holding the shared
cluster lock, so the machine never runs two clusters. The scenario is the integration tests that prove the
README's promises (SCENARIO), run against that cluster with STORMTOPO_TEST_STATE_DIR. Each result is
written to COMPATIBILITY.md's first table, and pytest's output and the cluster's logs kept in build/compat/.

    python -m stormtopo.devenv.compat                           # every pair, and every Kubernetes release
    python -m stormtopo.devenv.compat --pair v0.6.0 v1.14.1     # one pair on Kubernetes v1.35.3
    python -m stormtopo.devenv.compat --kubernetes v1.30.14     # the newest pair on one Kubernetes release
"""

from __future__ import annotations

import argparse
import datetime
import fcntl
import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from stormtopo.devenv import cluster, components

TOPOLOGY = components.REPO_ROOT / "examples" / "topology" / "aibrix-1730.yaml"
COMPATIBILITY = components.REPO_ROOT / "COMPATIBILITY.md"
OUT = components.REPO_ROOT / "build" / "compat"
LOCK = Path(os.environ.get("STORMTOPO_CLUSTER_LOCK", "/tmp/stormtopo-cluster.lock"))

_TESTS = "tests/integration/test_topology_aware.py::"
# What each pair must do, in the README's words, and the integration test that shows it.
SCENARIO = {
    "seed scenario": _TESTS + "test_user_scenario_hard_tier1_keeps_prefill_and_decode_under_one_leaf",
    "3 replicas scaled to 4": _TESTS + "test_three_replicas_each_in_one_leaf_then_scale_to_four_then_delete",
    "nested placement": _TESTS + "test_stormservice_scope_with_nested_replica_tier",
    "multi-node role": _TESTS + "test_a_multi_node_prefill_role_joins_its_replicas_gang_within_one_leaf[strategy-on-role-only]",
    "bad input": _TESTS + "test_bad_annotations_get_a_warning_event_and_change_nothing",
}
# The "what ran" cell; the prose under COMPATIBILITY.md's table says what each part checks.
WHAT_RAN = "`make compat`: seed scenario, 3 replicas scaled to 4, nested placement, multi-node role, bad input"


@dataclass(frozen=True)
class Pair:
    """One run's releases: an AIBrix x Volcano pair on a Kubernetes release."""

    aibrix: str
    volcano: str
    kubernetes: str = components.DEFAULT_KUBERNETES

    @property
    def slug(self) -> str:
        return f"aibrix-{self.aibrix}_volcano-{self.volcano}_kubernetes-{self.kubernetes}"

    def __str__(self) -> str:
        return f"AIBrix {self.aibrix} x Volcano {self.volcano} on Kubernetes {self.kubernetes}"


@dataclass
class Outcome:
    pair: Pair
    result: str  # "passed", or "failed: ..." naming what failed
    build_s: float = 0.0
    up_s: float = 0.0
    scenario_s: float = 0.0
    tests: int = 0

    @property
    def passed(self) -> bool:
        return self.result == "passed"


def served_pairs() -> list[Pair]:
    return [Pair(a, v) for a in components.SERVED_AIBRIX for v in components.SERVED_VOLCANO]


def kubernetes_axis(releases: list[str] | None = None) -> list[Pair]:
    """The newest pair on each Kubernetes release (default: every served release but v1.35.3, which the pairs run on)."""
    if releases is None:
        releases = [k for k in components.SERVED_KUBERNETES if k != components.DEFAULT_KUBERNETES]
    return [Pair(components.SERVED_AIBRIX[-1], components.SERVED_VOLCANO[-1], k) for k in releases]


@contextmanager
def cluster_lock() -> Iterator[None]:
    """The machine-wide lock: one local cluster at a time (do not also wrap `make compat` in flock)."""
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def embedded_version(binary: Path, module: str) -> str:
    """The version of `module` compiled into a Go binary (`go version -m`): proof of what runs."""
    out = subprocess.run(["go", "version", "-m", str(binary)], capture_output=True, text=True, check=True).stdout
    found = re.search(rf"^\s+(?:mod|dep)\s+{re.escape(module)}\s+(\S+)", out, re.MULTILINE)
    return found.group(1) if found else "?"


def build(pair: Pair) -> float:
    """Build (or find cached) the pair's binaries, outside the lock; check each embeds the release asked for."""
    components.select_versions(pair.aibrix, pair.volcano, pair.kubernetes)
    started = time.monotonic()
    binaries = components.ensure_binaries()
    took = time.monotonic() - started
    for name, module, want in (
        ("kube-apiserver", "k8s.io/kubernetes", pair.kubernetes),
        ("kube-controller-manager", "k8s.io/kubernetes", pair.kubernetes),
        ("kube-scheduler", "k8s.io/kubernetes", pair.kubernetes),
        ("vc-scheduler", "volcano.sh/volcano", pair.volcano),
        ("vc-controller-manager", "volcano.sh/volcano", pair.volcano),
        ("aibrix-controller-manager", "github.com/vllm-project/aibrix", pair.aibrix),
    ):
        got = embedded_version(binaries[name], module)
        if got != want:
            raise components.BuildError(f"{binaries[name]} embeds {module} {got}, not {want}")
    return took


def run_scenario(pair: Pair, out: Path) -> tuple[int, list[str], float]:
    """Run SCENARIO's tests on the cluster in out/cluster: (tests run, names of the parts that failed, seconds)."""
    junit = out / "junit.xml"
    env = dict(os.environ, STORMTOPO_TEST_STATE_DIR=str(out / "cluster"))
    started = time.monotonic()
    with open(out / "pytest.log", "w") as log:
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", f"--junitxml={junit}", *SCENARIO.values()],
            cwd=components.REPO_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    took = time.monotonic() - started
    if not junit.exists():
        return 0, [f"pytest exited {proc.returncode} before running a test (see {out / 'pytest.log'})"], took
    cases = list(ET.parse(junit).getroot().iter("testcase"))
    failed = [str(c.get("name")) for c in cases if c.find("failure") is not None or c.find("error") is not None]
    parts = [part for part, node in SCENARIO.items() if any(name.startswith(_test_function(node)) for name in failed)]
    if proc.returncode != 0 and not parts:
        parts = [f"pytest exited {proc.returncode} (see {out / 'pytest.log'})"]
    return len(cases), parts, took


def _test_function(node: str) -> str:
    return node.split("::")[1].split("[")[0]


def run_pair(pair: Pair) -> Outcome:
    out = OUT / pair.slug
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    try:
        build_s = build(pair)
    except components.BuildError as exc:
        (out / "build.log").write_text(str(exc))
        return Outcome(pair, f"failed: build ({str(exc).splitlines()[0]})")
    outcome = Outcome(pair, "passed", build_s=build_s)
    with cluster_lock():
        started = time.monotonic()
        try:
            cluster.up(out / "cluster", TOPOLOGY)
        except (cluster.ClusterError, RuntimeError) as exc:
            cluster.down(out / "cluster")
            outcome.result = f"failed: dev up ({str(exc).splitlines()[0]})"
            return outcome
        outcome.up_s = time.monotonic() - started
        try:
            outcome.tests, failed, outcome.scenario_s = run_scenario(pair, out)
        finally:
            cluster.down(out / "cluster")
    if failed:
        outcome.result = "failed: " + ", ".join(failed)
    return outcome


def record(outcomes: list[Outcome], today: str, path: Path = COMPATIBILITY) -> None:
    """Write each run's row into the first table: a `make compat` row per pair and Kubernetes release, replaced on each run."""
    lines = path.read_text().splitlines()
    table = [i for i, line in enumerate(lines) if line.startswith("| ")]
    first = next(i for i in table if lines[i].startswith("| AIBrix"))
    end = first
    while end + 1 < len(lines) and lines[end + 1].startswith("|"):
        end += 1
    rows = {(o.pair.aibrix, o.pair.volcano, o.pair.kubernetes): o for o in outcomes}
    kept = [
        line
        for line in lines[first + 2 : end + 1]
        if not (tuple(cell.strip() for cell in line.split("|")[1:4]) in rows and "`make compat`" in line)
    ]
    added = [f"| {o.pair.aibrix} | {o.pair.volcano} | {o.pair.kubernetes} | {WHAT_RAN} | {describe(o)} | {today} |" for o in outcomes]
    path.write_text("\n".join([*lines[: first + 2], *kept, *added, *lines[end + 1 :]]) + "\n")


def describe(outcome: Outcome) -> str:
    timing = f"{outcome.tests} tests in {outcome.scenario_s:.0f} s, cluster up in {outcome.up_s:.0f} s"
    return f"{outcome.result} ({timing})" if outcome.tests else outcome.result


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m stormtopo.devenv.compat", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--pair", nargs=2, action="append", metavar=("AIBRIX", "VOLCANO"), help="run only this pair on Kubernetes v1.35.3 (repeatable)"
    )
    parser.add_argument(
        "--kubernetes", action="append", metavar="VERSION", help="run only the newest pair on this Kubernetes release (repeatable)"
    )
    parser.add_argument("--no-record", action="store_true", help="leave COMPATIBILITY.md alone")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.pair or args.kubernetes:
        pairs = [Pair(a, v) for a, v in args.pair or []] + kubernetes_axis(args.kubernetes or [])
    else:
        pairs = served_pairs() + kubernetes_axis()
    outcomes = []
    for pair in pairs:
        print(f"compat: {pair} ...", flush=True)
        outcome = run_pair(pair)
        print(f"compat: {pair}: {describe(outcome)}; build {outcome.build_s:.0f} s", flush=True)
        outcomes.append(outcome)
        if not args.no_record:  # pair by pair: an interrupted run keeps what it found
            record([outcome], datetime.date.today().isoformat())
    return 0 if all(o.passed for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
