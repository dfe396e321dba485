"""Foreign pods (issue 20, item 2): the operator beside 10,000 pods it never admitted.

A GPU cluster runs thousands of pods stormtopo has nothing to do with (DaemonSets, other tenants). The
operator must not keep, list or even receive them: its peak memory after a restart beside them is
compared with the same restart without them, in the same run, and its CPU is measured while they churn.

The foreign pods are unbound (schedulerName nobody: no scheduler or kwok works on them) and carry a
5 KB annotation, so that a client that lists or watches them pays what a real pod costs.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.fabric import fabric_yaml
from stormtopo.core.vocabulary import HIGHEST_TIER, MODE
from stormtopo.devenv import cluster, processes
from stormtopo.devenv.client import DevCluster
from stormtopo.devenv.workloads import stormservice
from stormtopo.kube.client import Api, KubeError

NAMESPACE = "foreign"
HARD = {MODE: "hard", HIGHEST_TIER: "1"}


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _cpu_seconds(pid: int) -> float:
    """CPU of the operator and its children (the explanation worker)."""
    pids = [pid]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int(_stat(int(entry.name))[1]) == pid:
                    pids.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    total = 0.0
    for p in pids:
        try:
            fields = _stat(p)
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _memory_mb(pid: int, field: str) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(rf"{field}:\s+(\d+)", status).group(1)) / 1024  # type: ignore[union-attr]


def _operator(state: Path) -> processes.Tracked:
    return next(p for p in processes.tracked(state) if p.name == "operator")


def _observed(state: Path) -> dict[str, float]:
    """stormtopo_observed_objects_total by kind: what the operator's index recorded."""
    import urllib.request

    port = json.loads((state / "cluster.json").read_text())["ports"]["operator_metrics"]
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        match = re.match(r'stormtopo_observed_objects_total\{kind="(\w+)"\} (\S+)', line)
        if match:
            out[match.group(1)] = float(match.group(2))
    return out


def restart_and_settle(state: Path, quiet_cores: float = 0.03, longest: float = 180.0) -> dict[str, Any]:
    """Restart the operator, wait until it is ready and its CPU has settled (its initial lists done),
    then read its peak resident memory (VmHWM)."""
    cluster.stop_component(state, "operator")
    started = time.monotonic()
    operator = cluster.start_operator(state, timeout=120)
    ready = time.monotonic() - started
    deadline = time.monotonic() + longest
    cpu = _cpu_seconds(operator.pid)
    while time.monotonic() < deadline:
        time.sleep(5)
        now = _cpu_seconds(operator.pid)
        if (now - cpu) / 5 < quiet_cores and time.monotonic() - started > 20:
            break
        cpu = now
    return {
        "ready_s": round(ready, 1),
        "settled_s": round(time.monotonic() - started, 1),
        "peak_rss_mb": round(_memory_mb(operator.pid, "VmHWM"), 1),
        "rss_mb": round(_memory_mb(operator.pid, "VmRSS"), 1),
        "cpu_s": round(_cpu_seconds(operator.pid), 1),
        "observed": _observed(state),
    }


def foreign_pod(name: str, payload: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app": "foreign"}, "annotations": {"bench/payload": payload}},
        "spec": {"schedulerName": "nobody", "containers": [{"name": "c", "image": "registry.example/foreign:1"}]},
    }


def _retrying(call: Any, *args: Any) -> None:
    for attempt in range(10):
        try:
            call(*args)
            return
        except KubeError as exc:
            if getattr(exc, "status", 0) == 409:
                return
            if attempt == 9:
                raise
            time.sleep(0.5)


def create_foreign(api: Api, count: int, size: int) -> float:
    payload = "x" * size
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(lambda i: _retrying(api.request, "POST", path, foreign_pod(f"f{i:05d}", payload)), range(count)))
    return time.monotonic() - started


def churn(api: Api, state: Path, count: int, size: int, seconds: float, rate: float) -> dict[str, Any]:
    """Foreign pods updated (an annotation), deleted and re-created at `rate` changes a second; the
    operator's CPU over that time."""
    from stormtopo.kube.client import MERGE_PATCH

    pid = _operator(state).pid
    payload = "y" * size
    cpu, started = _cpu_seconds(pid), time.monotonic()
    done = 0
    with ThreadPoolExecutor(max_workers=8) as pool:
        while time.monotonic() - started < seconds:
            tick = time.monotonic()
            batch = []
            for _ in range(int(rate)):
                i = done % count
                name = f"f{i:05d}"
                path = f"/api/v1/namespaces/{NAMESPACE}/pods/{name}"
                if done % 10 == 9:  # every tenth change replaces the pod
                    batch.append(pool.submit(_replace, api, path, name, payload))
                else:
                    batch.append(
                        pool.submit(
                            _retrying, api.request, "PATCH", path, {"metadata": {"annotations": {"bench/tick": str(done)}}}, MERGE_PATCH
                        )
                    )
                done += 1
            for future in batch:
                future.result()
            time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
    wall = time.monotonic() - started
    used = _cpu_seconds(pid) - cpu
    return {"seconds": round(wall, 1), "changes": done, "changes_per_s": round(done / wall, 1), "operator_cores": round(used / wall, 4)}


def _replace(api: Api, path: str, name: str, payload: str) -> None:
    try:
        api.request("DELETE", path, {"gracePeriodSeconds": 0})
    except KubeError as exc:
        if getattr(exc, "status", 0) != 404:
            raise
    for _ in range(50):  # the old pod may take a moment to go
        try:
            api.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", foreign_pod(name, payload))
            return
        except KubeError as exc:
            if getattr(exc, "status", 0) != 409:
                raise
            time.sleep(0.1)


def run(count: int = 10_000, size: int = 5_000, churn_seconds: float = 60.0, rate: float = 50.0) -> dict[str, Any]:
    state = Path(tempfile.mkdtemp(prefix="stormtopo-foreign-"))
    (state / "fabric.yaml").write_text(fabric_yaml(2, 2, 4))
    began = time.monotonic()
    cluster.up(state, state / "fabric.yaml", timeout=180)
    out: dict[str, Any] = {"foreign_pods": count, "pod_bytes": size, "operator_source": os.environ.get("PYTHONPATH", "")}
    try:
        client = DevCluster(state)
        api = Api(str(state / "kubeconfig"))
        # Some work of its own, so that its index is not empty: two opted-in replicas, placed.
        client.create_namespace("mine")
        for name in ("a", "b"):
            client.create(stormservice(name, "mine", annotations=HARD, volcano_strategy=name == "a"))
        client.bound_pods("mine", "stormtopo.io/admitted", 4, timeout=120)
        out["without"] = restart_and_settle(state)
        client.create_namespace(NAMESPACE)
        out["create_s"] = round(create_foreign(api, count, size), 1)
        out["with"] = restart_and_settle(state)
        idle_cpu, idle_started = _cpu_seconds(_operator(state).pid), time.monotonic()
        time.sleep(30)
        out["idle_operator_cores"] = round((_cpu_seconds(_operator(state).pid) - idle_cpu) / (time.monotonic() - idle_started), 4)
        out["churn"] = churn(api, state, count, size, churn_seconds, rate)
        out["peak_rss_ratio"] = round(out["with"]["peak_rss_mb"] / out["without"]["peak_rss_mb"], 3)
        log = (state / "logs" / "operator.log").read_text(errors="replace")
        out["operator_log_errors"] = len(re.findall(r" ERROR ", log))
    finally:
        cluster.down(state)
        out["seconds"] = round(time.monotonic() - began, 1)
    return out
