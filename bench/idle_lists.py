"""The node tier's cost at rest (issue 33, item 5): the operator's list calls on pods and nodes per idle
minute, counted by the API server (its audit log), with the node tier on, four hard replicas placed, and
2,000 bound pods of another tenant beside them.

Nothing is being placed during the minutes counted: every list then is a cost of being installed. A
list is *full* when it asks for every pod (or every bound pod) or every node, *selected* when a label
selector keeps it to stormtopo's own objects. Watches are counted too (a watch re-opened every few
minutes is what following events costs). Run once with the checkout's operator and once with an older
one (`--operator-source DIR`) for the before/after ratio in the same session.
"""

from __future__ import annotations

import calendar
import json
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from bench.fabric import fabric_yaml
from stormtopo.core.vocabulary import HIGHEST_TIER, MODE
from stormtopo.devenv import cluster
from stormtopo.devenv.client import DevCluster
from stormtopo.devenv.workloads import stormservice
from stormtopo.kube.client import Api

SHAPE = (2, 4, 8)  # 64 nodes
OTHERS = "others"
HARD = {MODE: "hard", HIGHEST_TIER: "1"}
SETTLE = 45.0  # seconds after the last bind: kwok's status updates and the operator's first passes end
OPERATOR_AGENTS = ("stormtopo-operator", "kopf/")
KINDS = [f"{r}_{k}" for r in ("pods", "nodes") for k in ("full_lists", "selected_lists", "watches")]


def other_tenant_pod(name: str, node: str) -> dict[str, Any]:
    """A pod of another tenant, bound by its own scheduler (nodeName set): what the free-room reading
    must count, and stormtopo must never list again and again."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": OTHERS, "labels": {"app": "other-tenant"}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox", "resources": {"requests": {"cpu": "10m"}}}]},
    }


def requests_of_operator(audit_log: Path, since: float) -> list[dict[str, Any]]:
    """The operator's requests (its user agents) that the API server logged after `since` (epoch s)."""
    out = []
    with audit_log.open() as f:
        for line in f:
            entry = json.loads(line)
            if not entry.get("userAgent", "").startswith(OPERATOR_AGENTS):
                continue
            stamp = entry.get("requestReceivedTimestamp", "")
            at = calendar.timegm(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")) if stamp else 0.0  # UTC
            if at >= since:
                out.append(entry)
    return out


def classify(entries: list[dict[str, Any]]) -> dict[str, int]:
    """Counts by kind of call: full/selected lists and watches of pods and nodes, and everything else."""
    counts = dict.fromkeys(KINDS, 0)  # what is never called is said as 0
    for entry in entries:
        resource = (entry.get("objectRef") or {}).get("resource", "")
        verb = entry.get("verb", "")
        query = parse_qs(urlsplit(entry.get("requestURI", "")).query)
        if resource in ("pods", "nodes") and verb in ("list", "watch"):
            if verb == "list":
                label = "selected" if query.get("labelSelector") else "full"
                key = f"{resource}_{label}_lists"
            else:
                key = f"{resource}_watches"
        else:
            key = f"other_{verb}"
        counts[key] = counts.get(key, 0) + 1
    return counts


def run(others: int = 2000, idle_seconds: float = 120.0) -> dict[str, Any]:
    state = Path(tempfile.mkdtemp(prefix="stormtopo-idle-lists-"))
    (state / "fabric.yaml").write_text(fabric_yaml(*SHAPE))
    cluster.up(state, state / "fabric.yaml", timeout=300, audit=True, operator_args=("--node-tier",))
    try:
        client = DevCluster(state)
        api = Api(str(state / "kubeconfig"))
        nodes = sorted(n["metadata"]["name"] for page in api.pages("/api/v1/nodes") for n in page)
        client.create_namespace(OTHERS)
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(
                pool.map(
                    lambda i: api.request(
                        "POST", f"/api/v1/namespaces/{OTHERS}/pods", other_tenant_pod(f"p{i:05d}", nodes[i % len(nodes)])
                    ),
                    range(others),
                )
            )
        client.create_namespace("mine")
        for i in range(4):
            client.create(stormservice(f"svc{i}", "mine", annotations=HARD))
        client.bound_pods("mine", "", 8, timeout=300)
        time.sleep(SETTLE)
        since = time.time()
        time.sleep(idle_seconds)
        counts = classify(requests_of_operator(state / "logs" / "audit.log", since))
    finally:
        cluster.down(state)
    per_minute = {key: round(n * 60.0 / idle_seconds, 2) for key, n in sorted(counts.items())}
    return {"nodes": len(nodes), "other_tenant_pods": others, "idle_seconds": idle_seconds, "per_idle_minute": per_minute}
