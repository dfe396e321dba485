"""The operator's Kubernetes API access: a thin, synchronous layer over the official client.

Async code calls these through asyncio.to_thread; each function is one API request.
"""

from __future__ import annotations

import json
import os
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

AIBRIX = ("orchestration.aibrix.ai", "v1alpha1")
VOLCANO_SCHEDULING = ("scheduling.volcano.sh", "v1beta1")
VOLCANO_TOPOLOGY = ("topology.volcano.sh", "v1alpha1")
USER_AGENT = "stormtopo-operator"


class Api:
    def __init__(self, kubeconfig: str | None = None) -> None:
        self.in_cluster = not (kubeconfig or os.environ.get("KUBECONFIG"))
        if not self.in_cluster:
            cfg = client.Configuration()
            config.load_kube_config(config_file=kubeconfig or os.environ["KUBECONFIG"], client_configuration=cfg)
        else:
            config.load_incluster_config()
            cfg = client.Configuration.get_default_copy()
        cfg.connection_pool_maxsize = 32
        self.client = client.ApiClient(cfg)
        self.client.user_agent = USER_AGENT
        self.custom = client.CustomObjectsApi(self.client)
        self.core = client.CoreV1Api(self.client)
        self.admission = client.AdmissionregistrationV1Api(self.client)
        self.extensions = client.ApiextensionsV1Api(self.client)

    # -- reads ---------------------------------------------------------------------------------
    def get(self, group_version: tuple[str, str], plural: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        try:
            if namespace is None:
                return dict(self.custom.get_cluster_custom_object(*group_version, plural, name))
            return dict(self.custom.get_namespaced_custom_object(*group_version, namespace, plural, name))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def list_objects(
        self, group_version: tuple[str, str], plural: str, namespace: str | None = None, label_selector: str = ""
    ) -> list[dict[str, Any]]:
        if namespace is None:
            out = self.custom.list_cluster_custom_object(*group_version, plural, label_selector=label_selector)
        else:
            out = self.custom.list_namespaced_custom_object(*group_version, namespace, plural, label_selector=label_selector)
        return list(out.get("items", []))

    def crd_schema(self, name: str) -> dict[str, Any] | None:
        try:
            crd = self.extensions.read_custom_resource_definition(name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        served = [v for v in crd.spec.versions if v.served]
        return self.client.sanitize_for_serialization(served[-1].schema.open_apiv3_schema) if served else None

    def raw_list(self, path: str, **query: str) -> list[dict[str, Any]]:
        """A list as plain JSON: the client's typed models cost several times the memory and CPU,
        which matters when the operator reads every pod of a large cluster."""
        response = self.client.call_api(
            path,
            "GET",
            query_params=list(query.items()),
            auth_settings=["BearerToken"],
            _preload_content=False,
            _return_http_data_only=True,
        )
        return list(json.loads(response.data).get("items", []))

    def free_gpus(self, resource: str = "nvidia.com/gpu") -> dict[str, int]:
        """Free GPUs per node: allocatable minus what bound, unfinished pods request."""
        free = {
            n["metadata"]["name"]: _quantity((n.get("status", {}).get("allocatable") or {}).get(resource, "0"))
            for n in self.raw_list("/api/v1/nodes")
        }
        for pod in self.raw_list("/api/v1/pods", fieldSelector="spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"):
            node = pod["spec"].get("nodeName")
            if node in free:
                for c in pod["spec"].get("containers") or []:
                    free[node] -= _quantity(((c.get("resources") or {}).get("requests") or {}).get(resource, "0"))
        return free

    def pods_of_group(self, namespace: str, roleset: str) -> list[dict[str, Any]]:
        return self.raw_list(f"/api/v1/namespaces/{namespace}/pods", labelSelector=f"roleset-name={roleset}")

    def node_labels(self) -> dict[str, dict[str, str]]:
        return {n.metadata.name: dict(n.metadata.labels or {}) for n in self.core.list_node().items}

    # -- writes --------------------------------------------------------------------------------
    def create_podgroup(self, body: dict[str, Any]) -> bool:
        """Create a PodGroup; False if it exists already (another writer won the race)."""
        try:
            self.custom.create_namespaced_custom_object(*VOLCANO_SCHEDULING, body["metadata"]["namespace"], "podgroups", body)
            return True
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise

    def server_side_apply(self, path: str, body: dict[str, Any], field_manager: str = "stormtopo") -> None:
        """Create or update an object by server-side apply: stormtopo owns exactly the fields it sets."""
        self.client.call_api(
            path,
            "PATCH",
            query_params=[("fieldManager", field_manager), ("force", "true")],
            header_params={"Content-Type": "application/apply-patch+yaml", "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
            response_type="object",
            _return_http_data_only=True,
        )

    def apply_hypernode(self, body: dict[str, Any]) -> None:
        self.server_side_apply(f"/apis/topology.volcano.sh/v1alpha1/hypernodes/{body['metadata']['name']}", body)

    def delete_hypernode(self, name: str) -> None:
        try:
            self.custom.delete_cluster_custom_object(*VOLCANO_TOPOLOGY, "hypernodes", name)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def label_pod(self, namespace: str, name: str, labels: dict[str, str]) -> None:
        self.core.patch_namespaced_pod(name, namespace, {"metadata": {"labels": labels}})

    def annotate_stormservice(self, namespace: str, name: str, key: str, value: str) -> None:
        """Merge-patch one annotation: stormtopo's own key, nothing else of the StormService."""
        self.custom.patch_namespaced_custom_object(*AIBRIX, namespace, "stormservices", name, {"metadata": {"annotations": {key: value}}})

    def patch_podgroup(self, namespace: str, name: str, ops: list[dict[str, Any]]) -> None:
        self.custom.api_client.call_api(
            f"/apis/scheduling.volcano.sh/v1beta1/namespaces/{namespace}/podgroups/{name}",
            "PATCH",
            header_params={"Content-Type": "application/json-patch+json", "Accept": "application/json"},
            body=ops,
            auth_settings=["BearerToken"],
            response_type="object",
            _return_http_data_only=True,
        )


def _quantity(text: str) -> int:
    return int(float(str(text)))  # GPU counts are whole numbers
