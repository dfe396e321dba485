"""Write traffic on a pending replica's PodGroup: AIBrix rewrites it about twice a second (its spec
never equals what it built, and the rewrite drops Volcano's status). Counted as stored versions
(watch events) of one pending replica without stormtopo and one with, in the same time window."""

from __future__ import annotations

import threading
import time
from typing import Any

from kubernetes import watch

from stormtopo.core.vocabulary import HIGHEST_TIER, MODE, VOLCANO_SCHEDULING
from stormtopo.devenv.client import DevCluster
from stormtopo.devenv.workloads import Role, stormservice

TOO_BIG = (Role("prefill", gpus=64), Role("decode", gpus=64))  # no node has 64 GPUs: pending for good


def pending_podgroup_writes(client: DevCluster, namespace: str, seconds: float = 20.0) -> dict[str, Any]:
    services = {"baseline": None, "stormtopo": {MODE: "hard", HIGHEST_TIER: "1"}}
    for name, request in services.items():
        client.create(stormservice(f"churn-{name}", namespace, roles=TOO_BIG, annotations=request))
    client.wait(lambda: len(client.podgroups(namespace)) >= 2, 60, "both pending replicas' PodGroups")
    time.sleep(3)  # past the creation burst
    versions = {name: 0 for name in services}
    stream = watch.Watch()

    def count() -> None:
        for event in stream.stream(
            client.custom.list_namespaced_custom_object, *VOLCANO_SCHEDULING, namespace, "podgroups", timeout_seconds=int(seconds) + 5
        ):
            owner = event["object"]["metadata"].get("labels", {}).get("roleset-name", "")
            for name in services:
                if event["type"] == "MODIFIED" and owner.startswith(f"churn-{name}-"):
                    versions[name] += 1

    thread = threading.Thread(target=count, daemon=True)
    thread.start()
    time.sleep(seconds)
    stream.stop()
    thread.join(10)
    baseline = max(versions["baseline"], 1)
    return {
        "seconds": seconds,
        "stored_versions": versions,
        "ratio": round(versions["stormtopo"] / baseline, 3),
    }
