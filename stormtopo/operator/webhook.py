"""The admission webhooks: HTTPS server, AdmissionReview plumbing, and their configuration.

The mutating webhooks (AIBrix's StormService pods and replica PodGroups) fail open: while stormtopo
is down, StormServices that never opted in work as if it were not installed. Opted-in ones are held
by an admission policy evaluated inside the API server (core/optin.py), and a validating webhook
that fails closed only for StormServices carrying a request lists each before it exists.

The gate has a side effect (it writes the opted-in list with stormtopo's identity), so a review that
anyone on the cluster network made up must not change what another tenant depends on: what it lists
is checked against the cluster (operator/optin.py, Gate), and where the API server authenticates
itself to webhooks with a client certificate (its AdmissionConfiguration), setting CLIENT_CA_ENV to
that certificate's CA makes the gate answer only callers that present one. The mutating webhooks only
answer: a made-up review there changes nothing in the cluster.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from stormtopo.core.admission import (
    Decision,
    admit_pod,
    admit_podgroup,
    carries_constraint,
    joined_gang,
    marked_admitted,
    strips_opt_in_label,
)
from stormtopo.core.optin import admission_policy, labels_roles_condition, opt_in_label_policy, opt_in_patch, requests_topology_condition
from stormtopo.core.request import ClusterTiers, is_opted_in
from stormtopo.core.vocabulary import AIBRIX, GROUP_NAME_ANNOTATION, MANAGED_BY, ROLESET_LABEL, STORMSERVICE_LABEL, VOLCANO_SCHEDULING
from stormtopo.kube.client import Api, Forbidden, NotFound
from stormtopo.operator import metrics
from stormtopo.operator.index import Index
from stormtopo.operator.listed_pods import Listed, ListedPods
from stormtopo.operator.optin import Gate, OptedInList

CONFIGURATION_NAME = "stormtopo"
PODS_PATH = "/mutate/pods"
PODGROUPS_PATH = "/mutate/podgroups"
STORMSERVICES_PATH = "/validate/stormservices"
LABEL_ROLES_PATH = "/mutate/stormservices"
LABEL_WEBHOOK = "opt-in.stormservices.stormtopo.io"  # where the API server runs no MutatingAdmissionPolicy
# PEM file of the CA that signed the API server's webhook client certificate. Set: the gate answers
# only callers presenting a certificate it signed (the chart's webhook.clientAuth; `dev up` sets it).
CLIENT_CA_ENV = "STORMTOPO_WEBHOOK_CLIENT_CA"


def review_response(uid: str, decision: Decision) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": uid, "allowed": decision.allowed}
    if not decision.allowed:
        response["status"] = {"code": 403, "reason": "Forbidden", "message": decision.message}
    elif decision.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(decision.patch).encode()).decode()
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


def client_ca_file() -> str | None:
    return os.environ.get(CLIENT_CA_ENV) or None


def build_app(
    index: Index,
    opted_in: OptedInList,
    client_ca: str | None = None,
    gate: Gate | None = None,
    draining: Callable[[], bool] = lambda: False,
    exact_preemption: bool = False,
    narrowing: bool = False,
    leader_known: Callable[[], bool] = lambda: True,
) -> web.Application:
    """The webhook routes. `client_ca` (default: CLIENT_CA_ENV): the gate requires a verified client
    certificate, which tls_context asks every caller for when the same variable is set. While `draining`
    (the replica stops), every answer closes its connection: the API server's next review opens a new one,
    to a replica that stays, instead of meeting this one's close under a review in flight."""
    client_ca = client_ca if client_ca is not None else client_ca_file()

    def room_gate() -> tuple[bool, bool]:
        """(exact preemption, narrowing) for this pod: neither while no replica is known to lead (a pod held at
        the room gate waits for the leader; without one, it goes to Volcano as it is)."""
        known = (exact_preemption or narrowing) and leader_known()
        return exact_preemption and known, narrowing and known

    async def read_stored(namespace: str, name: str) -> dict[str, Any] | None:
        return await asyncio.to_thread(index.api.get, AIBRIX, "stormservices", namespace, name)

    gate = gate or Gate(opted_in, lambda namespace, name: index.stormservices.get((namespace, name)), read_stored)

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

    listed_pods = ListedPods(opted_in, read_stored)

    async def pods(request: web.Request) -> web.Response:
        async def admit(pod: dict[str, Any], _old: Any, roleset: Any, stormservice: Any, tiers: ClusterTiers) -> Decision:
            meta = pod.get("metadata") or {}
            named = (meta.get("annotations") or {}).get(GROUP_NAME_ANNOTATION)
            namespace = meta.get("namespace", "")
            listed = await listed_pods.judge(namespace, stormservice) if roleset is not None else Listed.NOT
            if listed is Listed.CATCHING_UP:  # as the policy would refuse it: the PodGroups may lag as the index does
                return Decision(allowed=False, message="its StormService asks for a network topology now; stormtopo is catching up, retry")
            owner = await index.service_of_group(namespace, named) if named else None
            groups: dict[str, dict[str, Any]] = {}
            # Any request annotation, valid or not: the PodGroup of the gang the pod would join (the
            # replica's, or the StormService's with scope StormService), read through on a miss.
            if roleset is not None and stormservice is not None and is_opted_in(stormservice["metadata"].get("annotations")):
                group = joined_gang(roleset, stormservice, tiers)
                gang = await index.read_podgroup(namespace, group)
                groups = {group: gang} if gang is not None else {}
            decision = admit_pod(pod, roleset, stormservice, tiers, owner, groups, *room_gate())
            if listed is Listed.FOR_NOTHING:  # read from the API server just now: asks for nothing
                return marked_admitted(pod, decision)
            if stormservice is not None and strips_opt_in_label(decision):
                # The index may lag an opt-in again: only the API server's copy lets a labelled pod go free.
                stored = await read_stored(namespace, str(stormservice["metadata"]["name"]))
                if is_opted_in(((stored or {}).get("metadata") or {}).get("annotations")):
                    return Decision(
                        allowed=False, message="its StormService asks for a network topology again; stormtopo is catching up, retry"
                    )
            return decision

        return await handle(request, "pod", admit)

    async def podgroups(request: web.Request) -> web.Response:
        async def admit(podgroup: dict[str, Any], old: Any, roleset: Any, stormservice: Any, tiers: ClusterTiers) -> Decision:
            last_valid = old if carries_constraint(old) else index.last_valid_podgroup(podgroup)
            return admit_podgroup(podgroup, roleset, stormservice, tiers, last_valid, old, now=time.time())

        return await handle(request, "podgroup", admit)

    async def label_roles(request: web.Request) -> web.Response:
        """No side effect and no read: a patch of the reviewed object only, so a made-up review changes nothing."""
        started = time.perf_counter()
        req = (await request.json()).get("request") or {}
        try:
            patch = opt_in_patch(str(req.get("operation") or ""), req.get("object") or {}, req.get("oldObject"))
        finally:
            metrics.ADMISSION_SECONDS.labels("stormservice").observe(time.perf_counter() - started)
        return web.json_response(review_response(str(req.get("uid", "")), Decision(patch=patch)))

    async def stormservices(request: web.Request) -> web.Response:
        """Lists an opted-in StormService before it exists, so the admission policy holds its pods from
        the first one on, even if stormtopo goes down right after; never what the cluster contradicts."""
        review = await request.json()
        req = review.get("request") or {}
        decision = Decision()
        if client_ca and not _peer_certificate(request):
            decision = Decision(
                allowed=False,
                message=(
                    "stormtopo's StormService gate answers only the API server, which presents a client certificate "
                    f"signed by the CA in {CLIENT_CA_ENV}; this caller presented none (is the API server's "
                    "AdmissionConfiguration kubeConfigFile set?)"
                ),
            )
        else:
            refusal = await gate.review(req)
            if refusal is not None:
                decision = Decision(allowed=False, message=refusal)
        return web.json_response(review_response(str(req.get("uid", "")), decision))

    async def start_sweeping(app: web.Application) -> None:
        app[_SWEEPER] = asyncio.get_running_loop().create_task(gate.run())

    async def stop_sweeping(app: web.Application) -> None:
        app[_SWEEPER].cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await app[_SWEEPER]

    @web.middleware
    async def close_while_draining(request: web.Request, handler: Handler) -> web.StreamResponse:
        response = await handler(request)
        if draining():
            response.force_close()
        return response

    app = web.Application(middlewares=[close_while_draining])
    app.on_startup.append(start_sweeping)
    app.on_cleanup.append(stop_sweeping)
    app.router.add_post(PODS_PATH, pods)
    app.router.add_post(PODGROUPS_PATH, podgroups)
    app.router.add_post(STORMSERVICES_PATH, stormservices)
    app.router.add_post(LABEL_ROLES_PATH, label_roles)
    return app


_SWEEPER = web.AppKey("sweeper", asyncio.Task[None])
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _peer_certificate(request: web.Request) -> bool:
    """The caller presented a certificate that tls_context verified against the client CA."""
    transport = request.transport
    return bool(transport is not None and transport.get_extra_info("peercert"))


def tls_context(cert_file: str, key_file: str, client_ca: str | None = None) -> ssl.SSLContext:
    """The serving context. With a client CA (default: CLIENT_CA_ENV) every caller is asked for a
    certificate, and one that CA did not sign fails the handshake; a caller without one is still
    served (the mutating webhooks and benchmarks need none), and the gate refuses it."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert_file, key_file)
    client_ca = client_ca if client_ca is not None else client_ca_file()
    if client_ca:
        ctx.load_verify_locations(cafile=client_ca)
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


def client_config(ca_bundle: bytes, path: str, url_base: str | None, service: tuple[str, str, int] | None) -> dict[str, Any]:
    config: dict[str, Any] = {"caBundle": base64.b64encode(ca_bundle).decode()}
    if service is not None:
        namespace, name, port = service
        config["service"] = {"namespace": namespace, "name": name, "path": path, "port": port}
    else:
        config["url"] = f"{url_base}{path}"
    return config


def configuration(
    ca_bundle: bytes, url_base: str | None = None, service: tuple[str, str, int] | None = None, label_policy: str | None = None
) -> list[dict[str, Any]]:
    """Every admission object stormtopo registers: the mutating webhooks, the StormService gate, the
    admission policies with their bindings (the opted-in lists are written per namespace, as services opt in).
    With `label_policy` (the version of MutatingAdmissionPolicy the API server serves), a policy labels new
    opted-in StormServices' role templates inside the API server, before the webhook, which then labels only
    what the policy did not."""

    def webhook(name: str, path: str, rule: dict[str, Any], label: str, conditions: list[dict[str, str]]) -> dict[str, Any]:
        return {
            "name": name,
            "clientConfig": client_config(ca_bundle, path, url_base, service),
            "rules": [rule],
            "objectSelector": {"matchExpressions": [{"key": label, "operator": "Exists"}]},
            "matchConditions": conditions,
            "failurePolicy": "Ignore",  # the admission policy, not this webhook, holds opted-in objects
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 3,
            "matchPolicy": "Equivalent",
            "reinvocationPolicy": "IfNeeded",
        }

    def rule(group_version: tuple[str, str], resource: str, operations: list[str]) -> dict[str, Any]:
        group, version = group_version
        return {"apiGroups": [group], "apiVersions": [version], "operations": operations, "resources": [resource], "scope": "Namespaced"}

    mutating = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": CONFIGURATION_NAME, "labels": dict(MANAGED_BY)},
        "webhooks": [
            webhook("pods.stormtopo.io", PODS_PATH, rule(("", "v1"), "pods", ["CREATE"]), STORMSERVICE_LABEL, []),
            webhook(
                "podgroups.stormtopo.io",
                PODGROUPS_PATH,
                rule(VOLCANO_SCHEDULING, "podgroups", ["CREATE", "UPDATE"]),
                ROLESET_LABEL,
                # Volcano writes status through the main resource (the CRD has no status subresource): skip those.
                [{"name": "spec-written", "expression": "request.operation == 'CREATE' || object.spec != oldObject.spec"}],
            ),
            {
                # A new opted-in StormService's role templates get the opt-in label, so its pods are held by
                # the admission policy from the first on, with no list to write (core/optin.py). Where the API
                # server runs the MutatingAdmissionPolicy, it labels them first (policies run before webhooks) and
                # this is not called: only for what it left unlabelled (just installed, or its feature gate off).
                "name": LABEL_WEBHOOK,
                "clientConfig": client_config(ca_bundle, LABEL_ROLES_PATH, url_base, service),
                "rules": [rule(AIBRIX, "stormservices", ["CREATE", "UPDATE"])],
                "matchConditions": [{"name": "labels-roles", "expression": labels_roles_condition()}],
                "failurePolicy": "Fail",  # only StormServices that ask for a topology, and lack the label
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 5,
                "matchPolicy": "Equivalent",
                "reinvocationPolicy": "IfNeeded",
            },
        ],
    }
    gate = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": CONFIGURATION_NAME, "labels": dict(MANAGED_BY)},
        "webhooks": [
            {
                "name": "stormservices.stormtopo.io",
                "clientConfig": client_config(ca_bundle, STORMSERVICES_PATH, url_base, service),
                "rules": [rule(AIBRIX, "stormservices", ["CREATE", "UPDATE"])],
                "matchConditions": [{"name": "requests-topology", "expression": requests_topology_condition()}],
                "failurePolicy": "Fail",  # only StormServices that ask for a topology
                "sideEffects": "NoneOnDryRun",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 5,
                "matchPolicy": "Equivalent",
            }
        ],
    }
    return [mutating, gate, *admission_policy(), *(opt_in_label_policy(label_policy) if label_policy else [])]


_PLURALS = {
    "MutatingWebhookConfiguration": "mutatingwebhookconfigurations",
    "ValidatingWebhookConfiguration": "validatingwebhookconfigurations",
    "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
    "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings",
    "MutatingAdmissionPolicy": "mutatingadmissionpolicies",
    "MutatingAdmissionPolicyBinding": "mutatingadmissionpolicybindings",
}


def _path(obj: dict[str, Any]) -> str:
    return f"/apis/{obj['apiVersion']}/{_PLURALS[obj['kind']]}/{obj['metadata']['name']}"


def served_label_policy(api: Api) -> str | None:
    """The version of MutatingAdmissionPolicy the API server serves (v1 from Kubernetes 1.36; v1beta1 in 1.34
    and 1.35 where enabled), or None: then the webhook labels new opted-in StormServices' role templates."""
    for version in ("v1", "v1beta1"):
        try:
            resources = api.request("GET", f"/apis/admissionregistration.k8s.io/{version}")
        except (NotFound, Forbidden):
            continue
        if any(r.get("name") == "mutatingadmissionpolicies" for r in (resources or {}).get("resources") or []):
            return version
    return None


def register(api: Api, objects: list[dict[str, Any]]) -> None:
    """Create or update each object by server-side apply (idempotent)."""
    for obj in objects:
        api.server_side_apply(_path(obj), obj, field_manager="stormtopo-operator")


def unregister(api: Api, objects: list[dict[str, Any]]) -> None:
    """Delete what `register` created (uninstall without the chart); one gone already is fine."""
    for obj in objects:
        with contextlib.suppress(NotFound):
            api.request("DELETE", _path(obj))
