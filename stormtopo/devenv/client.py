"""A client for a cluster started by `stormtopo dev up`: what the tests, the demo and the benchmarks share."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from stormtopo.core.vocabulary import AIBRIX, GPU, MANAGED_BY, OPTED_IN_CONFIGMAP, STORMSERVICE_LABEL, VOLCANO_SCHEDULING, VOLCANO_TOPOLOGY
from stormtopo.kube.client import Api

T = TypeVar("T")


class Timeout(AssertionError):
    pass


class DevCluster:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = Path(state_dir)
        self.kubeconfig = self.state_dir / "kubeconfig"
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(self.kubeconfig), client_configuration=cfg)
        cfg.connection_pool_maxsize = 16
        self.api_client = client.ApiClient(cfg)
        self.core = client.CoreV1Api(self.api_client)
        self.custom = client.CustomObjectsApi(self.api_client)

    # -- objects -------------------------------------------------------------------------------
    def create_namespace(self, name: str) -> None:
        self.core.create_namespace({"metadata": {"name": name, "labels": {"stormtopo.io/test": "true"}}})

    def delete_namespace(self, name: str, wait: float = 60.0) -> None:
        """Delete a namespace and wait until none of its pods hold node resources any more."""
        try:
            self.custom.delete_collection_namespaced_custom_object(*AIBRIX, name, "stormservices")
            self.core.delete_namespace(name)
        except ApiException as exc:
            if exc.status != 404:
                raise

        def pods_gone() -> bool:
            # Fake pods need no grace period; the namespace itself may finish deleting later.
            self.core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
            return not self.core.list_namespaced_pod(name).items

        started = time.monotonic()
        self.wait(pods_gone, wait, f"the pods of namespace {name} to be deleted", interval=0.5)

        def aibrix_gone() -> bool:
            # AIBrix v0.7.0 finds a StormService's RoleSets by label in every namespace: a RoleSet still
            # finalizing here would count for a same-named StormService of the next test.
            for plural in ("stormservices", "rolesets"):
                try:
                    if self.custom.list_namespaced_custom_object(*AIBRIX, name, plural)["items"]:
                        return False
                except ApiException as exc:
                    if exc.status != 404:  # no such kind on this cluster
                        raise
            return True

        left = max(10.0, wait - (time.monotonic() - started))
        self.wait(aibrix_gone, left, f"the StormServices and RoleSets of {name} to be deleted", interval=0.5)

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        kind = obj["kind"]
        ns = obj["metadata"].get("namespace")
        if kind == "StormService":
            # 503 says "retry": the API server answers it for a moment after it starts, until it has loaded the
            # CRD's schema that the opt-in label policy needs (docs/failures.md), as clients of a real cluster retry.
            deadline = time.monotonic() + 30
            while True:
                try:
                    return dict(self.custom.create_namespaced_custom_object(*AIBRIX, ns, "stormservices", obj))
                except ApiException as exc:
                    if exc.status != 503 or time.monotonic() > deadline:
                        raise
                time.sleep(0.2)
        if kind == "Pod":
            return dict(self.api_client.sanitize_for_serialization(self.core.create_namespaced_pod(ns, obj)))
        if kind == "Node":
            return dict(self.api_client.sanitize_for_serialization(self.core.create_node(obj)))
        if kind == "HyperNode":
            return dict(self.custom.create_cluster_custom_object(*VOLCANO_TOPOLOGY, "hypernodes", obj))
        if kind == "PodGroup":
            return dict(self.custom.create_namespaced_custom_object(*VOLCANO_SCHEDULING, ns, "podgroups", obj))
        if kind == "PodDisruptionBudget":
            return dict(
                self.api_client.sanitize_for_serialization(
                    client.PolicyV1Api(self.api_client).create_namespaced_pod_disruption_budget(ns, obj)
                )
            )
        raise ValueError(f"DevCluster.create does not know kind {kind}")

    def stormservices(self, namespace: str) -> list[dict[str, Any]]:
        """Every StormService of the namespace, in one list: one moment's state of all of them."""
        return list(self.custom.list_namespaced_custom_object(*AIBRIX, namespace, "stormservices")["items"])

    def stormservice(self, namespace: str, name: str) -> dict[str, Any]:
        return dict(self.custom.get_namespaced_custom_object(*AIBRIX, namespace, "stormservices", name))

    def patch_stormservice(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return dict(self.custom.patch_namespaced_custom_object(*AIBRIX, namespace, "stormservices", name, patch))

    def delete_stormservice(self, namespace: str, name: str) -> None:
        self.custom.delete_namespaced_custom_object(*AIBRIX, namespace, "stormservices", name, propagation_policy="Foreground")

    def rolesets(self, namespace: str, stormservice: str | None = None) -> list[dict[str, Any]]:
        selector = f"{STORMSERVICE_LABEL}={stormservice}" if stormservice else ""
        out = self.custom.list_namespaced_custom_object(*AIBRIX, namespace, "rolesets", label_selector=selector)
        return list(out["items"])

    def only(self, listing: Callable[[], list[dict[str, Any]]], what: str, timeout: float = 60.0) -> dict[str, Any]:
        """Wait until `listing` returns exactly one object and return it. AIBrix sometimes makes a
        replica's RoleSet twice and deletes the first; its PodGroup then goes by garbage collection."""

        last: list[str] = []

        def single() -> list[dict[str, Any]]:
            items = listing()
            last[:] = [i["metadata"]["name"] for i in items]
            return items if len(items) == 1 else []

        try:
            return self.wait(single, timeout, f"exactly one {what}")[0]
        except Timeout as exc:
            raise Timeout(f"{exc}; last seen: {last}") from None

    def podgroups(self, namespace: str) -> list[dict[str, Any]]:
        return list(self.custom.list_namespaced_custom_object(*VOLCANO_SCHEDULING, namespace, "podgroups")["items"])

    def pods(self, namespace: str, selector: str = "") -> list[dict[str, Any]]:
        items = self.core.list_namespaced_pod(namespace, label_selector=selector).items
        return [self.api_client.sanitize_for_serialization(p) for p in items]

    def opted_in(self) -> dict[str, str]:
        """What every namespace's opted-in list says, by "<namespace>.<stormservice>" (core/optin.py)."""
        lists = self.core.list_config_map_for_all_namespaces(field_selector=f"metadata.name={OPTED_IN_CONFIGMAP}").items
        return {f"{cm.metadata.namespace}.{name}": value for cm in lists for name, value in (cm.data or {}).items()}

    def list_opted_in(self, namespace: str, stormservice: str, scope: str) -> None:
        """Write a listing as the operator would (a test's stand-in for a stale or forged one)."""
        patch = {"data": {stormservice: scope}}
        try:
            self.core.patch_namespaced_config_map(OPTED_IN_CONFIGMAP, namespace, patch)
        except ApiException as exc:
            if exc.status != 404:
                raise
            meta = {"name": OPTED_IN_CONFIGMAP, "namespace": namespace, "labels": dict(MANAGED_BY)}
            self.core.create_namespaced_config_map(namespace, {"metadata": meta, **patch})

    def events(self, namespace: str, name: str) -> list[dict[str, Any]]:
        items = self.core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items
        return [self.api_client.sanitize_for_serialization(e) for e in items]

    def hypernodes(self) -> list[dict[str, Any]]:
        return list(self.custom.list_cluster_custom_object(*VOLCANO_TOPOLOGY, "hypernodes")["items"])

    def gpu_capacity(self, resource: str = GPU) -> tuple[dict[str, int], dict[str, int]]:
        """(free, total) GPUs per node, counted as the operator counts them."""
        return self.api.free_gpus(resource), self.api.gpu_totals(resource)

    @functools.cached_property
    def api(self) -> Api:
        """stormtopo's own API client, for what the operator reads the same way."""
        return Api(str(self.kubeconfig))

    # -- waiting -------------------------------------------------------------------------------
    @staticmethod
    def wait(check: Callable[[], T], timeout: float, what: str, interval: float = 0.2) -> T:
        """Call `check` until it returns something true. An answer the API server could not give now (429,
        5xx, a connection refused or reset on a loaded machine) is "not yet"; any other error is raised."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                result = check()
            except (ApiException, urllib3.exceptions.HTTPError) as exc:
                if isinstance(exc, ApiException) and exc.status is not None and exc.status != 429 and exc.status < 500:
                    raise
                if time.monotonic() > deadline:
                    raise Timeout(f"timed out after {timeout:.0f}s waiting for {what} (last: {exc})") from exc
                time.sleep(interval)
                continue
            if result:
                return result
            if time.monotonic() > deadline:
                raise Timeout(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(interval)

    def api_ready(self) -> bool:
        """The API server's own /readyz: every path installed, etcd reachable; False while it cannot answer."""
        try:
            response = self.api_client.call_api("/readyz", "GET", auth_settings=["BearerToken"], _preload_content=False, _request_timeout=3)
            return bool(response[1] == 200)
        except Exception:  # refused, reset, timed out: not ready
            return False

    def bound_pods(self, namespace: str, selector: str, count: int, timeout: float = 60.0) -> list[dict[str, Any]]:
        """Wait until `count` pods matching `selector` are bound to nodes and Running; return them."""

        def check() -> list[dict[str, Any]]:
            pods = [p for p in self.pods(namespace, selector) if p["spec"].get("nodeName") and p["status"].get("phase") == "Running"]
            return pods if len(pods) >= count else []

        return self.wait(check, timeout, f"{count} running pods matching {selector!r} in {namespace}")


def node_names(pods: Iterable[dict[str, Any]]) -> list[str]:
    return sorted(p["spec"]["nodeName"] for p in pods)
