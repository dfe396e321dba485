"""The uninstall at size (issue 43, item 5): `python -m stormtopo.operator.uninstall`, as the chart's hook
runs it, over a cluster holding N pods that stormtopo admitted (one in every GATED_EVERY still held at its
gate), measured as a child process: its peak RSS and its wall time, at each size in one run, on one local
control plane. The ratio of the largest size to the smallest is what grows with the pods; `--operator-source
DIR` runs another checkout's uninstall (e.g. one before it read page by page) for a before/after pair.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes.client.exceptions import ApiException

from stormtopo.core.vocabulary import ADMITTED_LABEL, DOMAIN_GATE
from stormtopo.devenv import cluster
from stormtopo.devenv.client import DevCluster

GATED_EVERY = 100  # one pod in a hundred still held at stormtopo's gate: the writes the uninstall makes
NAMESPACES = 8
CLIENTS = 8


def admitted_pod(name: str, namespace: str, gated: bool) -> dict[str, Any]:
    """About the size of an AIBrix pod as stored (labels, annotations, an environment), never scheduled."""
    labels = {ADMITTED_LABEL: "true", "storm-service-name": "svc", "roleset-name": f"svc-roleset-{name}", "role-name": "decode"}
    env = [{"name": f"ENGINE_OPTION_{i}", "value": "x" * 40} for i in range(20)]
    spec: dict[str, Any] = {
        "schedulerName": "nobody",  # never bound: nothing but the uninstall reads them
        "containers": [{"name": "engine", "image": "vllm/vllm-openai:v0.9.0", "env": env}],
    }
    if gated:
        spec["schedulingGates"] = [{"name": DOMAIN_GATE}]
    annotations = {"stormtopo.io/placement": "leaf s0 (tier 1), nodes node0,node1", "aibrix.ai/role-revision": "svc-7d9f"}
    metadata = {"name": name, "namespace": namespace, "labels": labels, "annotations": annotations}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def grow_to(admin: DevCluster, have: int, want: int) -> None:
    """Create admitted pods `have`..`want`-1, spread over the namespaces, from CLIENTS threads."""

    def create(i: int) -> None:
        admin.create(admitted_pod(f"pod-{i:06d}", f"tenant-{i % NAMESPACES}", gated=i % GATED_EVERY == 0))

    with ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(create, range(have, want)))


def regate(admin: DevCluster, upto: int) -> None:
    """Put the gate back on the pods the last uninstall released: each size's run has the same share to undo.
    Gates cannot be added to a pod once made, so those pods are made again (a pod never bound goes at once)."""
    for i in range(0, upto, GATED_EVERY):
        name, namespace = f"pod-{i:06d}", f"tenant-{i % NAMESPACES}"
        admin.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        pod = admitted_pod(name, namespace, gated=True)
        admin.wait(functools.partial(_made, admin, pod), 60, f"{namespace}/{name} made again")


def _made(admin: DevCluster, pod: dict[str, Any]) -> bool:
    try:
        admin.create(pod)
    except ApiException as exc:
        if exc.status == 409:  # the old one not gone yet
            return False
        raise
    return True


# The hook's command, then its own high-water mark (VmHWM): a child's ru_maxrss would count the pages it
# shared with this process between fork and exec.
HOOK = """
import runpy, sys
sys.argv = ["stormtopo.operator.uninstall", *sys.argv[1:]]
try:
    runpy.run_module("stormtopo.operator.uninstall", run_name="__main__")
except SystemExit as exc:
    code = exc.code
else:
    code = 0
hwm = next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(f"VmHWM {hwm}", file=sys.stderr)
sys.exit(code)
"""


def uninstall_once(state: Path, operator_source: str | None) -> dict[str, Any]:
    """One run of the hook's command; its peak RSS (VmHWM, kB) and wall time."""
    env = dict(os.environ)
    if operator_source:
        env["PYTHONPATH"] = str(Path(operator_source).resolve())
    command = [sys.executable, "-c", HOOK, f"--kubeconfig={state / 'kubeconfig'}", "--namespace=default"]
    started = time.monotonic()
    cwd = operator_source or state  # `-c` puts the working directory first on sys.path
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=cwd)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(f"the uninstall exited {done.returncode}: {done.stdout}\n{done.stderr[-2000:]}")
    peak_kib = int(done.stderr.rsplit("VmHWM ", 1)[1].split()[0])
    return {"peak_rss_mib": round(peak_kib / 1024, 1), "seconds": round(seconds, 2), "printed": done.stdout.strip()}


def run(sizes: tuple[int, ...] = (1_000, 10_000), operator_source: str | None = None) -> dict[str, Any]:
    state = Path(tempfile.mkdtemp(prefix="stormtopo-bench-uninstall-"))
    cluster.up(state, with_operator=False)
    try:
        admin = DevCluster(state)
        for i in range(NAMESPACES):
            admin.create_namespace(f"tenant-{i}")
        runs, have = [], 0
        for size in sorted(sizes):
            started = time.monotonic()
            grow_to(admin, have, size)
            if have:
                regate(admin, have)
            have = size
            created = time.monotonic() - started
            measured = uninstall_once(state, operator_source)
            pods = admin.core.list_pod_for_all_namespaces(label_selector=f"{ADMITTED_LABEL}=true").items
            left = [p for p in pods if p.spec.scheduling_gates]
            assert len(pods) == size and not left, f"{len(pods)} admitted pods, {len(left)} still gated after the uninstall"
            gated = len(range(0, size, GATED_EVERY))
            runs.append({"admitted_pods": size, "gated": gated, "created_in_seconds": round(created, 1), **measured})
            print(f"  {size} admitted pods: peak RSS {measured['peak_rss_mib']} MiB, {measured['seconds']} s", flush=True)
        small, large = runs[0], runs[-1]
        return {
            "runs": runs,
            "rss_ratio_largest_to_smallest": round(large["peak_rss_mib"] / small["peak_rss_mib"], 3),
            "pods_ratio_largest_to_smallest": round(large["admitted_pods"] / small["admitted_pods"], 1),
            "operator_source": operator_source or "",
        }
    finally:
        cluster.down(state)
