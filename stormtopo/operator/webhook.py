"""The mutating admission webhook: HTTPS server, AdmissionReview plumbing, and its configuration.

Failure policy: Fail, but only for objects AIBrix labels as StormService pods (storm-service-name) and
replica PodGroups (roleset-name). While the webhook is down those are rejected and AIBrix retries, so an
opted-in pod is never scheduled without its constraint; every other pod in the cluster is untouched.
"""

from __future__ import annotations

import base64
import json
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from stormtopo.core.admission import Decision, admit_pod, admit_podgroup, carries_constraint
from stormtopo.core.request import ClusterTiers
from stormtopo.core.vocabulary import GROUP_NAME_ANNOTATION, MANAGED_BY, ROLESET_LABEL, STORMSERVICE_LABEL, VOLCANO_SCHEDULING
from stormtopo.kube.client import Api
from stormtopo.operator import metrics
from stormtopo.operator.index import Index

CONFIGURATION_NAME = "stormtopo"
PODS_PATH = "/mutate/pods"
PODGROUPS_PATH = "/mutate/podgroups"


def review_response(uid: str, decision: Decision) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": uid, "allowed": decision.allowed}
    if not decision.allowed:
        response["status"] = {"code": 403, "reason": "Forbidden", "message": decision.message}
    elif decision.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(decision.patch).encode()).decode()
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


def build_app(index: Index) -> web.Application:
    async def handle(request: web.Request, kind: str, admit: Callable[..., Awaitable[Decision]]) -> web.Response:
        started = time.perf_counter()
        review = await request.json()
        req = review.get("request") or {}
        obj = req.get("object") or {}
        try:
            roleset, stormservice = await index.owners_of(obj)
            decision = await admit(obj, req.get("oldObject"), roleset, stormservice, index.cluster_tiers())
        finally:
            metrics.ADMISSION_SECONDS.labels(kind).observe(time.perf_counter() - started)
        return web.json_response(review_response(str(req.get("uid", "")), decision))

    async def pods(request: web.Request) -> web.Response:
        async def admit(pod: dict[str, Any], _old: Any, roleset: Any, stormservice: Any, tiers: ClusterTiers) -> Decision:
            meta = pod.get("metadata") or {}
            named = (meta.get("annotations") or {}).get(GROUP_NAME_ANNOTATION)
            owner = await index.service_of_group(meta.get("namespace", ""), named) if named else None
            return admit_pod(pod, roleset, stormservice, tiers, owner)

        return await handle(request, "pod", admit)

    async def podgroups(request: web.Request) -> web.Response:
        async def admit(podgroup: dict[str, Any], old: Any, roleset: Any, stormservice: Any, tiers: ClusterTiers) -> Decision:
            last_valid = old if carries_constraint(old) else index.last_valid_podgroup(podgroup)
            return admit_podgroup(podgroup, roleset, stormservice, tiers, last_valid)

        return await handle(request, "podgroup", admit)

    app = web.Application()
    app.router.add_post(PODS_PATH, pods)
    app.router.add_post(PODGROUPS_PATH, podgroups)
    return app


def tls_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert_file, key_file)
    return ctx


def client_config(ca_bundle: bytes, path: str, url_base: str | None, service: tuple[str, str, int] | None) -> dict[str, Any]:
    config: dict[str, Any] = {"caBundle": base64.b64encode(ca_bundle).decode()}
    if service is not None:
        namespace, name, port = service
        config["service"] = {"namespace": namespace, "name": name, "path": path, "port": port}
    else:
        config["url"] = f"{url_base}{path}"
    return config


def configuration(ca_bundle: bytes, url_base: str | None = None, service: tuple[str, str, int] | None = None) -> dict[str, Any]:
    def webhook(name: str, path: str, rule: dict[str, Any], label: str) -> dict[str, Any]:
        return {
            "name": name,
            "clientConfig": client_config(ca_bundle, path, url_base, service),
            "rules": [rule],
            "objectSelector": {"matchExpressions": [{"key": label, "operator": "Exists"}]},
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 5,
            "matchPolicy": "Equivalent",
            "reinvocationPolicy": "IfNeeded",
        }

    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": CONFIGURATION_NAME, "labels": dict(MANAGED_BY)},
        "webhooks": [
            webhook(
                "pods.stormtopo.io",
                PODS_PATH,
                {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"], "scope": "Namespaced"},
                STORMSERVICE_LABEL,
            ),
            webhook(
                "podgroups.stormtopo.io",
                PODGROUPS_PATH,
                {
                    "apiGroups": [VOLCANO_SCHEDULING[0]],
                    "apiVersions": [VOLCANO_SCHEDULING[1]],
                    "operations": ["CREATE", "UPDATE"],
                    "resources": ["podgroups"],
                    "scope": "Namespaced",
                },
                ROLESET_LABEL,
            ),
        ],
    }


def register(api: Api, body: dict[str, Any]) -> None:
    """Create or replace the MutatingWebhookConfiguration (server-side apply keeps it idempotent)."""
    path = f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{CONFIGURATION_NAME}"
    api.server_side_apply(path, body, field_manager="stormtopo-operator")
