"""`python -m bench memory`: what the operator keeps in memory for 10,000 StormServices and 100,000 admitted
pods on 4,096 nodes (issue 42, item 5), simulated: the machine holds no cluster of that size.

A child process (a fresh interpreter, so one run's garbage does not count in the next) imports the operator,
then feeds its own readings the objects the API server would send it, one at a time as a watch delivers them:
- every replica: the index (StormServices, RoleSets and the pods stormtopo admitted, slimmed as it keeps them);
- the leader also: the free-room reading (every node, every bound pod holding GPUs: its node, GPUs, other
  requests and how preemption ranks it).
The objects are shaped as AIBrix v0.7.0 and the kubelet make them (labels, annotations, owner references,
managed fields, five conditions): the index keeps what it keeps of real ones. The baseline is the same child
with nothing fed (the interpreter, kopf, aiohttp and the operator's modules). Not in it: kopf's per-object
state and the watch streams' buffers (measured on the real control plane at 1,000 services, BENCHMARKS.md).

Reported: RSS after a full collection (what stays), the high-water mark (VmHWM), and the bytes per admitted
pod above the baseline, for the follower and the leader; and the chart's memory limit beside them.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from stormtopo.core.vocabulary import (
    ADMITTED_LABEL,
    GPU,
    GROUP_NAME_ANNOTATION,
    HIGHEST_TIER,
    HOSTNAME_LABEL,
    MODE,
    TASK_SPEC_ANNOTATION,
)

REPO = Path(__file__).resolve().parents[1]
AIBRIX_API = "orchestration.aibrix.ai/v1alpha1"


def _status_kib(field: str) -> int:
    return int(next(line.split()[1] for line in Path("/proc/self/status").read_text().splitlines() if line.startswith(field + ":")))


def stormservice_of(i: int, namespace: str) -> dict[str, Any]:
    from stormtopo.devenv.workloads import stormservice

    svc = stormservice(f"svc-{i:05d}", namespace, annotations={MODE: "hard", HIGHEST_TIER: "1"})
    svc["metadata"].update(uid=f"00000000-0000-0000-0000-{i:012d}", resourceVersion=str(1000 + i), generation=1)
    return svc


def roleset_of(svc: dict[str, Any], r: int) -> dict[str, Any]:
    name = f"{svc['metadata']['name']}-roleset-{r:05d}"
    return {
        "apiVersion": "orchestration.aibrix.ai/v1alpha1",
        "kind": "RoleSet",
        "metadata": {
            "name": name,
            "namespace": svc["metadata"]["namespace"],
            "uid": f"{svc['metadata']['uid'][:-6]}{r:06d}",
            "resourceVersion": "1",
            "labels": {"storm-service-name": svc["metadata"]["name"], "roleset-index": str(r)},
            "ownerReferences": [{"apiVersion": AIBRIX_API, "kind": "StormService", "name": svc["metadata"]["name"]}],
        },
        "spec": svc["spec"]["template"]["spec"],
    }


def admitted_pod(roleset: dict[str, Any], role: str, node: str, gpus: int) -> dict[str, Any]:
    """An AIBrix pod after stormtopo admitted it, bound and running, as the API server sends it."""
    meta = roleset["metadata"]
    name = f"{meta['name']}-{role}-7d9f8"
    stamp = "2026-12-05T00:00:00Z"
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "generateName": f"{meta['name']}-{role}-",
            "namespace": meta["namespace"],
            "uid": f"{meta['uid'][:-6]}{hash(role) % 1_000_000:06d}",
            "resourceVersion": "123456",
            "creationTimestamp": stamp,
            "labels": {
                "storm-service-name": meta["labels"]["storm-service-name"],
                "roleset-name": meta["name"],
                "role-name": role,
                "role-replica-index": "0",
                "role-template-hash": "5b6c7d8e9f",
                "stormservice-revision": "svc-6f7b9c",
                ADMITTED_LABEL: "true",
            },
            "annotations": {GROUP_NAME_ANNOTATION: meta["name"], TASK_SPEC_ANNOTATION: role},
            "ownerReferences": [{"apiVersion": AIBRIX_API, "kind": "RoleSet", "name": meta["name"], "uid": meta["uid"]}],
            "managedFields": [{"manager": "aibrix", "operation": "Update", "fieldsV1": {"f:metadata": {"f:labels": {}}}}] * 3,
        },
        "spec": {
            "schedulerName": "volcano",
            "priority": 0,
            "nodeName": node,
            "containers": [
                {
                    "name": role,
                    "image": "vllm/vllm-openai:v0.9.1",
                    "args": ["--model", "/models/llama-3-70b", "--tensor-parallel-size", str(gpus)],
                    "resources": {"requests": {GPU: str(gpus), "cpu": "8", "memory": "64Gi"}, "limits": {GPU: str(gpus)}},
                }
            ],
        },
        "status": {
            "phase": "Running",
            "hostIP": "10.0.0.1",
            "podIP": "10.1.0.1",
            "startTime": stamp,
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": stamp, "lastProbeTime": None}
                for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
            ],
        },
    }


def node_of(i: int) -> dict[str, Any]:
    return {
        "kind": "Node",
        "metadata": {"name": f"node-{i:05d}", "resourceVersion": "1", "labels": {HOSTNAME_LABEL: f"node-{i:05d}", "type": "kwok"}},
        "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
        "status": {
            "allocatable": {GPU: "8", "cpu": "96", "memory": "1Ti", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def delivered(services: int, replicas: int, nodes: int) -> Iterator[tuple[str, dict[str, Any]]]:
    """(kind, object) of every StormService, RoleSet and admitted pod, in the order their watches deliver them:
    `replicas` RoleSets a service over 100 namespaces, a prefill and a decode pod each, spread over `nodes`."""
    pods = 0
    for i in range(services):
        svc = stormservice_of(i, f"team-{i % 100:03d}")
        yield "StormService", svc
        for r in range(replicas):
            roleset = roleset_of(svc, r)
            yield "RoleSet", roleset
            for role in ("prefill", "decode"):
                yield "Pod", admitted_pod(roleset, role, f"node-{pods % nodes:05d}", 4)
                pods += 1


def child(services: int, replicas: int, nodes: int, leader: bool, feed: bool) -> dict[str, Any]:
    """In the child: the readings fed (or not: the baseline), then what the process holds."""
    from typing import cast

    from stormtopo.operator.index import Index
    from stormtopo.operator.loops import Loops
    from stormtopo.operator.room import NodeRoom

    index = Index(cast(Any, None))
    room = NodeRoom(cast(Any, None), Loops())
    gc.collect()
    before = _status_kib("VmRSS")
    pods = 0
    started = time.monotonic()
    if feed:
        if leader:
            for n in range(nodes):
                room._on_node("ADDED", node_of(n))
        for kind, obj in delivered(services, replicas, nodes):
            index.observe(kind, "ADDED", obj)
            if kind == "Pod":
                if leader:
                    room._on_pod("ADDED", obj)
                pods += 1
    gc.collect()
    return {
        "pods": pods,
        "seconds": round(time.monotonic() - started, 1),
        "rss_before_kib": before,
        "rss_kib": _status_kib("VmRSS"),
        "hwm_kib": _status_kib("VmHWM"),
        "kept": {"stormservices": len(index.stormservices), "rolesets": len(index.rolesets), "pods": sum(1 for _ in index.pods.values())},
    }


def _in_child(services: int, replicas: int, nodes: int, leader: bool, feed: bool, source: Path = REPO) -> dict[str, Any]:
    """`child` in a fresh interpreter, importing the operator of `source` (a checkout: this one, or an older
    commit's for the figures before)."""
    args = [str(services), str(replicas), str(nodes), str(int(leader)), str(int(feed))]
    env = {"MALLOC_ARENA_MAX": "2", "PATH": "", "PYTHONPATH": str(source)}
    done = subprocess.run([sys.executable, __file__, *args], cwd=source, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def chart_limit_mib() -> int:
    values = yaml.safe_load((REPO / "deploy/helm/stormtopo/values.yaml").read_text())
    limit = str(values["resources"]["limits"]["memory"])
    return int(limit.removesuffix("Mi")) if limit.endswith("Mi") else int(limit.removesuffix("Gi")) * 1024


def run(services: int = 10_000, replicas: int = 5, nodes: int = 4_096, source: Path = REPO) -> dict[str, Any]:
    """Follower and leader, each against the baseline measured in the same run."""
    baseline = _in_child(services, replicas, nodes, leader=True, feed=False, source=source)
    out: dict[str, Any] = {
        "services": services,
        "rolesets": services * replicas,
        "admitted_pods": services * replicas * 2,
        "nodes": nodes,
        "baseline": baseline,
        "chart_limit_mib": chart_limit_mib(),
    }
    for role, leader in (("follower", False), ("leader", True)):
        got = _in_child(services, replicas, nodes, leader=leader, feed=True, source=source)
        got["rss_mib"] = round(got["rss_kib"] / 1024, 1)
        got["hwm_mib"] = round(got["hwm_kib"] / 1024, 1)
        got["over_baseline"] = round(got["rss_kib"] / baseline["rss_kib"], 3)
        got["bytes_per_pod"] = round((got["rss_kib"] - baseline["rss_kib"]) * 1024 / max(1, got["pods"]))
        got["hwm_of_chart_limit"] = round(got["hwm_kib"] / 1024 / out["chart_limit_mib"], 3)
        out[role] = got
        print(f"  {role}: RSS {got['rss_mib']} MiB (peak {got['hwm_mib']}), {got['bytes_per_pod']} B per admitted pod", flush=True)
    return out


if __name__ == "__main__":  # the child: the operator's modules loaded as it loads them, then fed
    import stormtopo.operator.app  # noqa: F401  (kopf, aiohttp and every module the operator imports)

    services_, replicas_, nodes_, leader_, feed_ = (int(a) for a in sys.argv[1:6])
    print(json.dumps(child(services_, replicas_, nodes_, bool(leader_), bool(feed_))))
