"""Record every PodGroup version the API server stores in a namespace (a watch sees them all)."""

from __future__ import annotations

import threading
import time
from types import TracebackType

from kubernetes import watch

from stormtopo.devenv.client import DevCluster


class PodGroupVersions:
    def __init__(self, cluster: DevCluster, namespace: str) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.seen: list[tuple[str, str, bool]] = []  # (event type, name, has networkTopology)
        self._watch = watch.Watch()
        self._thread = threading.Thread(target=self._record, daemon=True)

    def _record(self) -> None:
        stream = self._watch.stream(
            self.cluster.custom.list_namespaced_custom_object,
            "scheduling.volcano.sh",
            "v1beta1",
            self.namespace,
            "podgroups",
            timeout_seconds=300,
        )
        for event in stream:
            obj = event["object"]
            self.seen.append((event["type"], obj["metadata"]["name"], "networkTopology" in obj.get("spec", {})))

    def __enter__(self) -> PodGroupVersions:
        self._thread.start()
        time.sleep(0.5)  # the watch reaches the server before anything is created
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        time.sleep(1)
        self._watch.stop()
        self._thread.join(10)

    def stored(self) -> list[tuple[str, str, bool]]:
        return [s for s in self.seen if s[0] != "DELETED"]

    def without_constraint(self) -> list[tuple[str, str, bool]]:
        return [s for s in self.stored() if not s[2]]
