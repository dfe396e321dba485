"""Critical path: does scheduling ever wait for stormtopo, and what does the webhook add to pod creation?"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

from kubernetes import watch

from stormtopo.core.vocabulary import HIGHEST_TIER, MODE
from stormtopo.devenv.client import DevCluster
from stormtopo.devenv.workloads import stormservice

HARD = {MODE: "hard", HIGHEST_TIER: "1"}


def _first(
    cluster: DevCluster, namespace: str, kind: str, prefix: str, ready: threading.Event, out: dict[str, float], t0: list[float]
) -> None:
    w = watch.Watch()
    if kind == "podgroup":
        stream = w.stream(
            cluster.custom.list_namespaced_custom_object, "scheduling.volcano.sh", "v1beta1", namespace, "podgroups", timeout_seconds=60
        )
    else:
        stream = w.stream(cluster.core.list_namespaced_pod, namespace, timeout_seconds=60)
    ready.set()
    for event in stream:
        obj: Any = event["object"]
        name = obj["metadata"]["name"] if kind == "podgroup" else obj.metadata.name
        if not name.startswith(prefix):
            continue  # another sample's leftovers
        if kind == "podgroup" and "networkTopology" in (obj.get("spec") or {}):
            out["podgroup"] = time.perf_counter() - t0[0]
        elif kind == "pod":
            out["pod"] = time.perf_counter() - t0[0]
        if kind in out:
            w.stop()
            return


def podgroup_vs_first_pod(cluster: DevCluster, namespace: str, samples: int) -> dict[str, Any]:
    """Seconds from StormService creation until its PodGroup carries the constraint, and until AIBrix's
    first pod exists, both seen on watches started before the create."""
    ratios, pg_times, pod_times = [], [], []
    for i in range(samples):
        out: dict[str, float] = {}
        t0 = [0.0]
        started = [threading.Event(), threading.Event()]
        threads = [
            threading.Thread(target=_first, args=(cluster, namespace, kind, f"cp-{i}-", started[j], out, t0), daemon=True)
            for j, kind in enumerate(("podgroup", "pod"))
        ]
        for t in threads:
            t.start()
        for s in started:
            s.wait(10)
        time.sleep(0.2)  # let both watches reach the server
        t0[0] = time.perf_counter()
        cluster.create(stormservice(f"cp-{i}", namespace, annotations=HARD))
        for t in threads:
            t.join(60)
        cluster.delete_stormservice(namespace, f"cp-{i}")
        cluster.wait(lambda: not cluster.pods(namespace) and not cluster.podgroups(namespace), 60, "the sample's pods and PodGroup to go")
        pg_times.append(out["podgroup"])
        pod_times.append(out["pod"])
        ratios.append(out["podgroup"] / out["pod"])
    return {
        "samples": samples,
        "podgroup_constraint_s_median": round(statistics.median(pg_times), 4),
        "first_pod_s_median": round(statistics.median(pod_times), 4),
        "ratio_median": round(statistics.median(ratios), 4),
        "ratio_max": round(max(ratios), 4),
    }


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def webhook_latency(cluster: DevCluster, namespace: str, service: str, roleset: str, count: int) -> dict[str, Any]:
    """Pod-create latency (server-side dry run: full admission, no storage) with and without the webhook,
    interleaved so both see the same machine noise. Opted-in pods carry the StormService's labels."""

    def pod(i: int, through_webhook: bool) -> dict[str, Any]:
        labels = {"storm-service-name": service, "roleset-name": roleset, "role-name": "decode"} if through_webhook else {}
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"lat-{i}", "namespace": namespace, "labels": labels},
            "spec": {"containers": [{"name": "c", "image": "x"}]},
        }

    timings: dict[bool, list[float]] = {True: [], False: []}
    for i in range(count):
        for through in (True, False):
            start = time.perf_counter()
            cluster.core.create_namespaced_pod(namespace, pod(i, through), dry_run="All")
            timings[through].append(time.perf_counter() - start)
    with_p = {q: _percentile(timings[True], q) for q in (0.5, 0.99)}
    without_p = {q: _percentile(timings[False], q) for q in (0.5, 0.99)}
    return {
        "count": count,
        "with_webhook_ms": {"p50": round(with_p[0.5] * 1000, 2), "p99": round(with_p[0.99] * 1000, 2)},
        "without_webhook_ms": {"p50": round(without_p[0.5] * 1000, 2), "p99": round(without_p[0.99] * 1000, 2)},
        "p50_ratio": round(with_p[0.5] / without_p[0.5], 3),
        "p99_ratio": round(with_p[0.99] / without_p[0.99], 3),
    }
