"""`python -m bench collector`: the garbage collector's passes while the operator's readings grow to 10,000
StormServices and 100,000 admitted pods on 4,096 nodes, then churn (issue 42, item 3: the event loop never blocks
longer than 50 ms), simulated.

CPython 3.11's collector is not incremental: a pass holds every thread, the event loop that answers the webhooks
with them, for as long as it walks every object of the generations it collects. A child process (a fresh
interpreter) imports the operator of its source tree, installs what that operator installs at its start, freezes
what it loaded (as the operator does once ready, on an empty cluster), then feeds the leader's readings (the index
and the free-room reading) the objects a watch would deliver, shaped as bench/memory.py shapes them: every
StormService, RoleSet and admitted pod, one at a time (growth); then every pod replaced by a new one (a rollout of
every replica: churn), as fast as the readings take them (about 10,000 pods a second: faster than an API server
delivers). The child times every pass of every generation with a callback of its own.

Three arms, each in its own child, alternating, RUNS each: `none` (this checkout without the collector policy:
what CPython does, the freeze at ready alone), `before` (the operator of commit BEFORE, from `git archive`, with
its policy: a full pass over 20 ms of CPU froze what survived it) and `policy` (this checkout's,
operator/collector.py). Also reported: the seconds spent in passes in all (what the policy costs in CPU) and what a
last full pass over everything, the frozen included, finds unreachable at the end: garbage the freezes kept from
the collector (the feed makes none: this shows nothing of that price).
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BEFORE = "5e46538"  # full passes judged alone; the readings' dicts untracked and tracked again
RUNS = 2
ARMS = ("none", "before", "policy")


class Timed:
    """Every pass of every generation: how many, the longest (wall), the seconds in all."""

    def __init__(self) -> None:
        self.passes, self.longest, self.seconds = [0, 0, 0], [0.0, 0.0, 0.0], 0.0
        self._started: tuple[int, float] | None = None

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        generation = int(info["generation"])
        if phase == "start":
            self._started = (generation, time.perf_counter())
        elif self._started is not None and self._started[0] == generation:
            took = time.perf_counter() - self._started[1]
            self._started = None
            self.passes[generation] += 1
            self.longest[generation] = max(self.longest[generation], took)
            self.seconds += took


def child(services: int, replicas: int, nodes: int, policy: bool) -> dict[str, Any]:
    """In the child: the readings grown, then churned, with every pass timed."""
    from typing import cast

    from bench.memory import admitted_pod, delivered, node_of, roleset_of, stormservice_of
    from stormtopo.operator import collector
    from stormtopo.operator.index import Index
    from stormtopo.operator.loops import Loops
    from stormtopo.operator.room import NodeRoom

    if policy:
        collector.install()  # (operator/app.py's run installs it first)
    index, room = Index(cast(Any, None)), NodeRoom(cast(Any, None), Loops())
    collector.freeze()  # the operator ready on an empty cluster
    phases: dict[str, Any] = {}

    def timed_phase(name: str, feed: Any) -> None:
        timed, freezes, started = Timed(), collector.PASSES.freezes, time.monotonic()
        gc.callbacks.append(timed)
        feed()
        gc.callbacks.remove(timed)
        phases[name] = {
            "seconds": round(time.monotonic() - started, 1),
            "passes": timed.passes,
            "longest_pass_ms": [round(1000 * s, 1) for s in timed.longest],
            "seconds_in_passes": round(timed.seconds, 2),
            "freezes": collector.PASSES.freezes - freezes,
            "tracked_objects": len(gc.get_objects()),
        }

    pods: list[tuple[str, str]] = []

    def grow() -> None:
        for n in range(nodes):
            room._on_node("ADDED", node_of(n))
        for kind, obj in delivered(services, replicas, nodes):
            index.observe(kind, "ADDED", obj)
            if kind == "Pod":
                room._on_pod("ADDED", obj)
                pods.append((obj["metadata"]["namespace"], obj["metadata"]["name"]))

    def churn() -> None:
        for i, (namespace, name) in enumerate(pods):  # every replica rolled: each pod replaced by one of a new name
            index.observe("Pod", "DELETED", {"metadata": {"name": name, "namespace": namespace}})
            room._pod_gone((namespace, name))
            service = stormservice_of(i // (2 * replicas), f"team-{(i // (2 * replicas)) % 100:03d}")
            pod = admitted_pod(roleset_of(service, (i // 2) % replicas), ("prefill", "decode")[i % 2], f"node-{(i + 1) % nodes:05d}", 4)
            pod["metadata"]["name"] += "-2"
            index.observe("Pod", "ADDED", pod)
            room._on_pod("ADDED", pod)

    timed_phase("growth", grow)
    timed_phase("churn", churn)
    gc.unfreeze()
    started = time.perf_counter()
    found = gc.collect()
    return {
        "pods": len(pods),
        "phases": phases,
        "longest_pass_ms": max(max(p["longest_pass_ms"]) for p in phases.values()),
        "last_pass_over_everything": {"ms": round(1000 * (time.perf_counter() - started), 1), "unreachable_found": found},
    }


def _in_child(source: Path, services: int, replicas: int, nodes: int, policy: bool) -> dict[str, Any]:
    args = [str(services), str(replicas), str(nodes), str(int(policy))]
    env = {"MALLOC_ARENA_MAX": "2", "PATH": "", "PYTHONPATH": f"{source}:{REPO}"}
    done = subprocess.run([sys.executable, __file__, *args], cwd=source, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def run(services: int = 10_000, replicas: int = 5, nodes: int = 4_096, before: str = BEFORE) -> dict[str, Any]:
    """Each arm RUNS times in fresh children, alternating; per arm the worst run's longest pass."""
    from bench.room_stall import operator_of

    out: dict[str, Any] = {"services": services, "rolesets": services * replicas, "admitted_pods": services * replicas * 2, "nodes": nodes}
    out["before_commit"] = before
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory() as tmp:
        sources = {"none": REPO, "before": operator_of(before, Path(tmp)), "policy": REPO}
        for _ in range(RUNS):
            for arm in ARMS:
                runs[arm].append(_in_child(sources[arm], services, replicas, nodes, arm != "none"))
                print(f"  {arm}: longest pass {runs[arm][-1]['longest_pass_ms']} ms", flush=True)
    out["runs"] = runs
    for arm in ARMS:
        worst = max(runs[arm], key=lambda r: float(r["longest_pass_ms"]))
        out[arm] = {
            "longest_pass_ms": worst["longest_pass_ms"],
            **{
                f"longest_pass_{phase}_ms": max(max(r["phases"][phase]["longest_pass_ms"]) for r in runs[arm])
                for phase in ("growth", "churn")
            },
            "seconds_in_passes": max(sum(p["seconds_in_passes"] for p in r["phases"].values()) for r in runs[arm]),
            "freezes": max(sum(p["freezes"] for p in r["phases"].values()) for r in runs[arm]),
        }
    for arm in ("none", "before"):
        out[f"longest_pass_ratio_to_{arm}"] = round(out["policy"]["longest_pass_ms"] / out[arm]["longest_pass_ms"], 4)
    return out


if __name__ == "__main__":  # the child: the operator's modules loaded as it loads them, then fed
    import stormtopo.operator.app  # noqa: F401  (kopf, aiohttp and every module the operator imports)

    services_, replicas_, nodes_, policy_ = (int(a) for a in sys.argv[1:5])
    print(json.dumps(child(services_, replicas_, nodes_, bool(policy_))))
