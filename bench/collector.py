"""`python -m bench collector`: the garbage collector's full passes while the operator's readings grow to 10,000
StormServices and 100,000 admitted pods on 4,096 nodes, then churn (issue 42, item 3: the event loop never blocks
longer than 50 ms), simulated.

CPython 3.11's collector is not incremental: a full pass holds every thread, the event loop that answers the
webhooks with them, for as long as it walks every object tracked. A child process (a fresh interpreter) imports the
operator, freezes what it loaded (as the operator does once ready, on an empty cluster), then feeds the leader's
readings (the index and the free-room reading) the objects a watch would deliver, shaped as bench/memory.py
shapes them: every StormService, RoleSet and admitted pod, one at a time (growth); then every pod replaced by a new
one (a rollout of every replica: churn). Each full pass is timed by a gc callback.

Two children in the same run: the operator's policy (operator/collector.py: a full pass longer than 20 ms freezes
what survived it) against none (the baseline: everything since ready in every full pass). Also reported: what a
last full pass over everything, the frozen included, finds unreachable at the end: garbage the freezes kept from
the collector (the policy's price), against the baseline's.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def child(services: int, replicas: int, nodes: int, policy: bool) -> dict[str, Any]:
    """In the child: the readings grown, then churned, with the full passes timed."""
    from typing import cast

    from bench.memory import admitted_pod, delivered, node_of, roleset_of, stormservice_of
    from stormtopo.operator import collector
    from stormtopo.operator.index import Index
    from stormtopo.operator.loops import Loops
    from stormtopo.operator.room import NodeRoom

    timed = collector.Passes(slow=float("inf"))  # times every full pass, freezes nothing
    gc.callbacks.append(timed)
    if policy:
        collector.install()
    index, room = Index(cast(Any, None)), NodeRoom(cast(Any, None), Loops())
    collector.freeze()  # the operator ready on an empty cluster
    phases: dict[str, Any] = {}

    def phase(name: str, started: float, full: int, freezes: int) -> None:
        phases[name] = {
            "seconds": round(time.monotonic() - started, 1),
            "full_passes": timed.full - full,
            "freezes": collector.PASSES.freezes - freezes,
            "tracked_objects": len(gc.get_objects()),
        }

    started, full, freezes = time.monotonic(), timed.full, collector.PASSES.freezes
    for n in range(nodes):
        room._on_node("ADDED", node_of(n))
    pods: list[dict[str, Any]] = []
    for kind, obj in delivered(services, replicas, nodes):
        index.observe(kind, "ADDED", obj)
        if kind == "Pod":
            room._on_pod("ADDED", obj)
            pods.append({"metadata": {"name": obj["metadata"]["name"], "namespace": obj["metadata"]["namespace"]}})
    longest_growing = timed.longest
    phase("growth", started, full, freezes)
    started, full, freezes = time.monotonic(), timed.full, collector.PASSES.freezes
    for i, gone in enumerate(pods):  # every replica rolled: each pod replaced by one of a new name
        index.observe("Pod", "DELETED", gone)
        room._pod_gone((gone["metadata"]["namespace"], gone["metadata"]["name"]))
        roleset = roleset_of(stormservice_of(i // (2 * replicas), f"team-{(i // (2 * replicas)) % 100:03d}"), (i // 2) % replicas)
        pod = admitted_pod(roleset, ("prefill", "decode")[i % 2], f"node-{(i + 1) % nodes:05d}", 4)
        pod["metadata"]["name"] += "-2"
        index.observe("Pod", "ADDED", pod)
        room._on_pod("ADDED", pod)
    phase("churn", started, full, freezes)
    gc.callbacks.clear()  # (the last pass is not the operator's)
    gc.unfreeze()
    started = time.perf_counter()
    found = gc.collect()
    return {
        "policy": policy,
        "pods": len(pods),
        "phases": phases,
        "longest_full_pass_ms": round(1000 * timed.longest, 1),
        "longest_full_pass_growing_ms": round(1000 * longest_growing, 1),
        "last_pass_over_everything": {"ms": round(1000 * (time.perf_counter() - started), 1), "unreachable_found": found},
        "kept": {"stormservices": len(index.stormservices), "rolesets": len(index.rolesets), "pods": sum(1 for _ in index.pods.values())},
    }


def _in_child(services: int, replicas: int, nodes: int, policy: bool) -> dict[str, Any]:
    args = [str(services), str(replicas), str(nodes), str(int(policy))]
    env = {"MALLOC_ARENA_MAX": "2", "PATH": "", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, __file__, *args], cwd=REPO, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def run(services: int = 10_000, replicas: int = 5, nodes: int = 4_096) -> dict[str, Any]:
    """The baseline (no freezing after slow passes) and the policy, each in a fresh child."""
    out: dict[str, Any] = {"services": services, "rolesets": services * replicas, "admitted_pods": services * replicas * 2, "nodes": nodes}
    for name, policy in (("baseline", False), ("policy", True)):
        out[name] = _in_child(services, replicas, nodes, policy)
        print(f"  {name}: longest full pass {out[name]['longest_full_pass_ms']} ms", flush=True)
    base, pol = out["baseline"], out["policy"]
    out["longest_full_pass_ratio"] = round(pol["longest_full_pass_ms"] / base["longest_full_pass_ms"], 4)
    return out


if __name__ == "__main__":  # the child: the operator's modules loaded as it loads them, then fed
    import stormtopo.operator.app  # noqa: F401  (kopf, aiohttp and every module the operator imports)

    services_, replicas_, nodes_, policy_ = (int(a) for a in sys.argv[1:5])
    print(json.dumps(child(services_, replicas_, nodes_, bool(policy_))))
