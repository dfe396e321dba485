"""The operator's Kubernetes API access: plain JSON over HTTPS, one function per request.

Deliberately not the official client: its typed models cost the operator about 50 MB of memory on
import alone and several times the CPU per object (measured in BENCHMARKS.md). Async code calls
these through asyncio.to_thread.
"""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import urllib3

from stormtopo.core.gang import gpu_count
from stormtopo.core.packing import takes_new_pods
from stormtopo.core.vocabulary import AIBRIX, GPU, ROLESET_LABEL, VOLCANO_SCHEDULING, VOLCANO_TOPOLOGY
from stormtopo.kube.credentials import Credentials, CredentialsError, IssuedCredential, load_credentials, materialize
from stormtopo.kube.errors import (
    ApiError,
    ApiUnavailable,
    BudgetRefused,
    Conflict,
    Forbidden,
    Gone,
    Invalid,
    KubeError,
    NotFound,
    ServerError,
    TooManyRequests,
    Unauthorized,
)

# Where callers found these before credentials and errors had modules of their own.
__all__ = [
    "Api",
    "ApiError",
    "ApiUnavailable",
    "BudgetRefused",
    "Conflict",
    "Credentials",
    "CredentialsError",
    "Forbidden",
    "Gone",
    "Invalid",
    "IssuedCredential",
    "KubeError",
    "NotFound",
    "ServerError",
    "TooManyRequests",
    "Unauthorized",
]

USER_AGENT = "stormtopo-operator"
JSON = "application/json"
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"


PAGE_SIZE = 250  # objects per list request


class Api:
    def __init__(self, kubeconfig: str | None = None, context: str | None = None) -> None:
        self.credentials = load_credentials(kubeconfig, context)
        self.in_cluster = self.credentials.in_cluster
        creds = self.credentials
        ctx = ssl.create_default_context(cafile=creds.ca_path)
        if creds.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if creds.cert_path:
            ctx.load_cert_chain(creds.cert_path, creds.key_path)
        self.ssl_context = ctx
        self._client_cert = creds.exec_plugin.issued if creds.exec_plugin else None
        self.http = urllib3.PoolManager(maxsize=32, ssl_context=ctx, timeout=urllib3.Timeout(connect=5, read=30), retries=False)

    def _renew_client_certificate(self) -> None:
        """An exec plugin's client certificate expires too: load the new one for the next connections."""
        plugin = self.credentials.exec_plugin
        if plugin is None:
            return
        issued = plugin.current()
        if issued is not self._client_cert and issued.cert_pem and issued.key_pem:
            cert = materialize(issued.cert_pem, None, Path("."), encoded=False)
            key = materialize(issued.key_pem, None, Path("."), encoded=False)
            assert cert and key
            self.ssl_context.load_cert_chain(cert, key)
            self.http.clear()  # pooled connections still present the old certificate
        self._client_cert = issued

    def request(self, method: str, path: str, body: Any = None, content_type: str = JSON, **query: str) -> Any:
        self._renew_client_certificate()
        headers = {"Accept": JSON, "User-Agent": USER_AGENT}
        token = self.credentials.bearer()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body).encode()
        url = f"{self.credentials.server}{path}" + (f"?{urlencode(query)}" if query else "")
        try:
            response = self.http.request(method, url, body=data, headers=headers)
        except urllib3.exceptions.HTTPError as exc:
            raise ApiUnavailable(method, path, getattr(exc, "reason", None) or exc) from exc
        if response.status >= 400:
            raise ApiError.of(response.status, method, path, response.data.decode(errors="replace"))
        return json.loads(response.data) if response.data else None

    # -- reads ---------------------------------------------------------------------------------
    @staticmethod
    def path(group_version: tuple[str, str], plural: str, namespace: str | None = None, name: str | None = None) -> str:
        group, version = group_version
        out = f"/apis/{group}/{version}" if group else f"/api/{version}"
        if namespace:
            out += f"/namespaces/{namespace}"
        out += f"/{plural}"
        return f"{out}/{name}" if name else out

    def get(self, group_version: tuple[str, str], plural: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        try:
            return dict(self.request("GET", self.path(group_version, plural, namespace, name)))
        except NotFound:
            return None

    def list_objects(
        self, group_version: tuple[str, str], plural: str, namespace: str | None = None, label_selector: str = ""
    ) -> list[dict[str, Any]]:
        query = {"labelSelector": label_selector} if label_selector else {}
        return self.raw_list(self.path(group_version, plural, namespace), **query)

    def raw_list(self, path: str, **query: str) -> list[dict[str, Any]]:
        return [item for page in self.pages(path, **query) for item in page]

    def pages(self, path: str, **query: str) -> Iterator[list[dict[str, Any]]]:
        """A list, a page at a time: a caller that reduces each page never holds every pod or node of
        a large cluster at once (a full pod list of 4,000 pods is tens of MB once parsed)."""
        token = ""
        while True:
            page = self.request("GET", path, **query, limit=str(PAGE_SIZE), **({"continue": token} if token else {})) or {}
            yield list(page.get("items", []))
            token = (page.get("metadata") or {}).get("continue") or ""
            if not token:
                return

    def crd_schema(self, name: str) -> dict[str, Any] | None:
        crd = self.get(("apiextensions.k8s.io", "v1"), "customresourcedefinitions", None, name)
        if crd is None:
            return None
        served = [v for v in crd["spec"]["versions"] if v.get("served")]
        return dict(served[-1].get("schema", {}).get("openAPIV3Schema") or {}) if served else None

    def free_gpus(self, resource: str = GPU, taking_new_pods: bool = False) -> dict[str, int]:
        """Free GPUs per node: allocatable minus what bound, unfinished pods request. `taking_new_pods`:
        only nodes a new pod may be placed on (not cordoned, Ready), for a decision to move pods there."""
        free = self.gpu_totals(resource, taking_new_pods)
        bound = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
        for page in self.pages("/api/v1/pods", fieldSelector=bound):
            for pod in page:
                node = pod["spec"].get("nodeName")
                if node in free:
                    for c in pod["spec"].get("containers") or []:
                        free[node] -= gpu_count(((c.get("resources") or {}).get("requests") or {}).get(resource, "0"))
        return free

    def gpu_totals(self, resource: str = GPU, taking_new_pods: bool = False) -> dict[str, int]:
        return {
            n["metadata"]["name"]: gpu_count((n.get("status", {}).get("allocatable") or {}).get(resource, "0"))
            for page in self.pages("/api/v1/nodes")
            for n in page
            if not taking_new_pods or takes_new_pods(n)
        }

    def pods_of_group(self, namespace: str, roleset: str) -> list[dict[str, Any]]:
        return self.raw_list(f"/api/v1/namespaces/{namespace}/pods", labelSelector=f"{ROLESET_LABEL}={roleset}")

    def node_labels(self) -> dict[str, dict[str, str]]:
        return {n["metadata"]["name"]: dict(n["metadata"].get("labels") or {}) for n in self.raw_list("/api/v1/nodes")}

    # -- writes --------------------------------------------------------------------------------
    def create_podgroup(self, body: dict[str, Any]) -> bool:
        """Create a PodGroup; False if it exists already (another writer won the race) or its
        namespace is being deleted."""
        try:
            self.request("POST", self.path(VOLCANO_SCHEDULING, "podgroups", body["metadata"]["namespace"]), body)
            return True
        except Conflict:
            return False
        except Forbidden as exc:
            if exc.namespace_terminating:
                return False
            raise

    def patch_podgroup(self, namespace: str, name: str, ops: list[dict[str, Any]]) -> None:
        self.request("PATCH", self.path(VOLCANO_SCHEDULING, "podgroups", namespace, name), ops, JSON_PATCH)

    def create_hypernode(self, body: dict[str, Any]) -> bool:
        """Create a HyperNode; False if one of that name exists already (an earlier pass made it)."""
        try:
            self.request("POST", self.path(VOLCANO_TOPOLOGY, "hypernodes"), body)
            return True
        except Conflict:
            return False

    def set_hypernode_members(self, name: str, members: list[dict[str, Any]], resource_version: str | None = None) -> None:
        """Merge-patch a HyperNode's spec.members (a list: replaced whole), nothing else of it; with
        `resource_version`, only if it is still that version (Conflict otherwise)."""
        body: dict[str, Any] = {"spec": {"members": members}}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        self.request("PATCH", self.path(VOLCANO_TOPOLOGY, "hypernodes", None, name), body, MERGE_PATCH)

    def delete_hypernode(self, name: str, resource_version: str | None = None) -> bool:
        """Delete a HyperNode (at `resource_version`: Conflict if it changed since); False if it was gone already."""
        body = (
            {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"resourceVersion": resource_version}}
            if resource_version
            else None
        )
        try:
            self.request("DELETE", self.path(VOLCANO_TOPOLOGY, "hypernodes", None, name), body)
            return True
        except NotFound:
            return False

    def server_side_apply(self, path: str, body: dict[str, Any], field_manager: str = "stormtopo") -> None:
        """Create or update an object by server-side apply: stormtopo owns exactly the fields it sets."""
        self.request("PATCH", path, body, APPLY_PATCH, fieldManager=field_manager, force="true")

    def patch_pod(self, namespace: str, name: str, ops: list[dict[str, Any]]) -> None:
        self.request("PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}", ops, JSON_PATCH)

    def patch_pod_metadata(self, namespace: str, name: str, labels: dict[str, str], annotations: dict[str, str]) -> None:
        body = {"metadata": {"labels": labels, "annotations": annotations}}
        self.request("PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}", body, MERGE_PATCH)

    def label_pod(self, namespace: str, name: str, labels: dict[str, str]) -> None:
        self.request("PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}", {"metadata": {"labels": labels}}, MERGE_PATCH)

    def annotate_stormservice(self, namespace: str, name: str, key: str, value: str, resource_version: str | None = None) -> dict[str, Any]:
        """Merge-patch one annotation: stormtopo's own key, nothing else of the StormService. With a
        resourceVersion the patch applies only to that version (409 otherwise): a read-modify-write."""
        meta: dict[str, Any] = {"annotations": {key: value}}
        if resource_version:
            meta["resourceVersion"] = resource_version
        return dict(self.request("PATCH", self.path(AIBRIX, "stormservices", namespace, name), {"metadata": meta}, MERGE_PATCH) or {})

    def evict_pod(self, namespace: str, name: str, uid: str = "") -> None:
        """Evict through the Eviction API, which honours the pod's PodDisruptionBudgets: a refusal is
        an ApiError with status 429 (or 500 when several budgets cover the pod). With `uid`, only that
        pod (Conflict if the pod of that name is another one now)."""
        body: dict[str, Any] = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
        if uid:
            body["deleteOptions"] = {"preconditions": {"uid": uid}}
        self.request("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/eviction", body)

    def delete_unbound_pod(self, namespace: str, name: str, resource_version: str) -> None:
        """Delete a pod only if it is still at `resource_version` (Conflict otherwise): not bound since."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"resourceVersion": resource_version}}
        self.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", body)

    def disruption_budgets(self, namespace: str) -> list[dict[str, Any]]:
        return self.list_objects(("policy", "v1"), "poddisruptionbudgets", namespace)

    def create_event(self, event: Mapping[str, Any], instance: str) -> None:
        """A core/v1 Event: `event` has involvedObject, type, reason and message."""
        involved = event["involvedObject"]
        now = micro_time()
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{involved['name']}.", "namespace": involved["namespace"] or "default"},
            **event,
            "source": {"component": "stormtopo"},
            "reportingComponent": "stormtopo",
            "reportingInstance": instance,
            "firstTimestamp": now[:19] + "Z",
            "lastTimestamp": now[:19] + "Z",
            "count": 1,
        }
        self.request("POST", f"/api/v1/namespaces/{body['metadata']['namespace']}/events", body)

    # -- leases --------------------------------------------------------------------------------
    def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.get(("coordination.k8s.io", "v1"), "leases", namespace, name)

    def create_lease(self, body: dict[str, Any]) -> None:
        self.request("POST", self.path(("coordination.k8s.io", "v1"), "leases", body["metadata"]["namespace"]), body)

    def replace_lease(self, body: dict[str, Any]) -> None:
        """PUT carries resourceVersion: a concurrent renewal makes it fail with 409."""
        meta = body["metadata"]
        self.request("PUT", self.path(("coordination.k8s.io", "v1"), "leases", meta["namespace"], meta["name"]), body)


def micro_time(when: float | None = None) -> str:
    """A Kubernetes MicroTime (RFC 3339, microseconds, UTC)."""
    t = time.time() if when is None else when
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int((t % 1) * 1e6):06d}Z"
