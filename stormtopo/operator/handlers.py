"""kopf handlers: watch events feed the index and trigger reconciliation.

Only raw event handlers are used: they keep no state on the watched objects, so the operator never
writes kopf's bookkeeping annotations into a user's StormService or AIBrix's RoleSets.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

import kopf

from stormtopo.operator.index import Index
from stormtopo.operator.leader import Leadership
from stormtopo.operator.placement_report import PlacementReporter
from stormtopo.operator.reconcile import Reconciler

log = logging.getLogger("stormtopo.handlers")
RESYNC_SECONDS = 30.0
_background: set[asyncio.Task[None]] = set()  # keeps the resync task referenced


def report(obj: dict[str, Any], event_type: str, reason: str, message: str) -> None:
    body = {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"), "metadata": obj["metadata"]}
    kopf.event(cast(kopf.Body, body), type=event_type, reason=reason, message=message)


def register(
    registry: kopf.OperatorRegistry, index: Index, reconciler: Reconciler, reporter: PlacementReporter, leadership: Leadership
) -> None:
    """Every replica keeps its index warm (the webhook answers from it); only the leader writes."""

    @kopf.on.event("orchestration.aibrix.ai", "v1alpha1", "stormservices", registry=registry)
    async def stormservice_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        obj = dict(body)
        index.observe("StormService", event.get("type"), obj)
        if event.get("type") != "DELETED" and leadership.is_leader:
            await reconciler.stormservice(obj)

    @kopf.on.event("orchestration.aibrix.ai", "v1alpha1", "rolesets", registry=registry)
    async def roleset_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        obj = dict(body)
        index.observe("RoleSet", event.get("type"), obj)
        if event.get("type") != "DELETED" and leadership.is_leader:
            await reconciler.roleset_changed(obj)

    @kopf.on.event("scheduling.volcano.sh", "v1beta1", "podgroups", labels={"roleset-name": kopf.PRESENT}, registry=registry)
    async def podgroup_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        index.observe("PodGroup", event.get("type"), dict(body))
        if event.get("type") != "DELETED" and leadership.is_leader:
            await reporter.podgroup_changed(dict(body))

    # The PodGroups stormtopo owns for StormService-scoped requests carry no roleset-name label.
    @kopf.on.event("scheduling.volcano.sh", "v1beta1", "podgroups", labels={"app.kubernetes.io/managed-by": "stormtopo"}, registry=registry)
    async def owned_podgroup_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        index.observe("PodGroup", event.get("type"), dict(body))

    @kopf.on.event("topology.volcano.sh", "v1alpha1", "hypernodes", registry=registry)
    async def hypernode_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        index.observe("HyperNode", event.get("type"), dict(body))

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # A custom registry has none of kopf's default login handlers: log in as the API client does.
        if index.api.in_cluster:
            return kopf.login_with_service_account(**kwargs)
        creds = index.api.credentials
        return kopf.ConnectionInfo(
            server=creds.server,
            ca_path=creds.ca_path,
            insecure=creds.insecure,
            token=creds.bearer(),
            certificate_path=creds.cert_path,
            private_key_path=creds.key_path,
        )

    @kopf.on.startup(registry=registry)
    async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.level = logging.WARNING  # Events go to the objects they are about, not to kopf's log
        settings.watching.server_timeout = 300
        settings.networking.request_timeout = 30
        # Per-object workers: a bounded number, gone soon after the last event. Each holds a task, a
        # queue and a body; thousands of them at once were most of the operator's peak memory.
        settings.queueing.worker_limit = 64
        settings.queueing.idle_timeout = 0.5
        leadership.on_elected = reconciler.resync  # a new leader catches up at once
        _background.add(asyncio.create_task(_resync_forever(reconciler, leadership)))
        _background.add(asyncio.create_task(leadership.run()))


async def _resync_forever(reconciler: Reconciler, leadership: Leadership) -> None:
    # Catches what a dropped watch or a failed write left behind; cheap, it reads only the index.
    while True:
        await asyncio.sleep(RESYNC_SECONDS)
        if leadership.is_leader:
            await reconciler.resync()
