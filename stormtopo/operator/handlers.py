"""kopf handlers: watch events feed the index and trigger reconciliation.

Only raw event handlers are used: they keep no state on the watched objects, so the operator never
writes kopf's bookkeeping annotations into a user's StormService or AIBrix's RoleSets.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import kopf

from stormtopo.core.vocabulary import AIBRIX, MANAGED_BY, ROLESET_LABEL, VOLCANO_SCHEDULING, VOLCANO_TOPOLOGY
from stormtopo.operator.index import Index, Key, key_of, service_key_of
from stormtopo.operator.leader import Leadership
from stormtopo.operator.placement_report import PlacementReporter
from stormtopo.operator.reconcile import Reconciler
from stormtopo.operator.workqueue import WorkQueue

log = logging.getLogger("stormtopo.handlers")
RESYNC_SECONDS = 30.0
_background: set[asyncio.Task[None]] = set()  # keeps the resync task referenced


def register(
    registry: kopf.OperatorRegistry, index: Index, reconciler: Reconciler, reporter: PlacementReporter, leadership: Leadership
) -> None:
    """Every replica keeps its index warm (the webhook answers from it); only the leader writes.

    A handler only records the object and queues a key: the work happens in the queues' few workers,
    so kopf's per-object workers end at once and never pile up event bodies during a burst. Handlers
    are coroutines that never await: kopf would run plain functions on threads, and the index and
    queues belong to the event loop."""

    async def reconcile_stormservice(key: Key) -> None:
        stormservice = index.stormservices.get(key)
        if stormservice is not None and leadership.is_leader:  # None: deleted, or its own event is on the way
            await reconciler.stormservice(stormservice)

    async def report_placement(key: Key) -> None:
        podgroup = index.podgroups.get(key)
        if podgroup is not None and leadership.is_leader:
            await reporter.podgroup_changed(podgroup)

    stormservices: WorkQueue[Key] = WorkQueue("stormservices", reconcile_stormservice, workers=4)
    placements: WorkQueue[Key] = WorkQueue("placements", report_placement, workers=4)

    async def resync() -> None:
        await reconciler.refresh_opted_in()
        for key in list(index.stormservices):
            stormservices.add(key)
        for key in list(index.podgroups):  # placements a former leader did not report; pending gangs re-explained
            placements.add(key)

    def follow(kind: str, event: kopf.RawEvent, body: kopf.Body, queue: WorkQueue[Key], forget: Callable[[Key], None]) -> None:
        """Record the object; queue its key if this replica leads, or forget what was said of it once deleted."""
        index.observe(kind, event.get("type"), body)
        if event.get("type") == "DELETED":
            forget(key_of(body))
        elif leadership.is_leader:
            queue.add(key_of(body))

    @kopf.on.event(*AIBRIX, "stormservices", registry=registry)
    async def stormservice_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        follow("StormService", event, body, stormservices, reconciler.forget)

    @kopf.on.event(*AIBRIX, "rolesets", registry=registry)
    async def roleset_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        index.observe("RoleSet", event.get("type"), body)
        if event.get("type") != "DELETED" and leadership.is_leader:
            stormservices.add(service_key_of(body))

    @kopf.on.event(*VOLCANO_SCHEDULING, "podgroups", labels={ROLESET_LABEL: kopf.PRESENT}, registry=registry)
    async def podgroup_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        follow("PodGroup", event, body, placements, reporter.forget)

    # The PodGroups stormtopo owns for StormService-scoped requests carry no roleset-name label.
    @kopf.on.event(*VOLCANO_SCHEDULING, "podgroups", labels=dict(MANAGED_BY), registry=registry)
    async def owned_podgroup_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        index.observe("PodGroup", event.get("type"), body)

    @kopf.on.event(*VOLCANO_TOPOLOGY, "hypernodes", registry=registry)
    async def hypernode_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        index.observe("HyperNode", event.get("type"), body)

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
        # Events are posted a few at a time: kopf's client opens one TLS connection per post in flight,
        # and a burst of a thousand at once cost tens of MB of connection buffers.
        settings.posting.worker_limit = 4
        settings.watching.server_timeout = 300
        settings.networking.request_timeout = 30
        # Per-object workers: a bounded number, gone soon after the last event.
        settings.queueing.worker_limit = 64
        settings.queueing.idle_timeout = 0.5
        stormservices.start()
        placements.start()
        leadership.on_elected = resync  # a new leader catches up at once
        _background.add(asyncio.create_task(_resync_forever(resync, leadership)))
        _background.add(asyncio.create_task(leadership.run()))


async def _resync_forever(resync: Callable[[], Awaitable[None]], leadership: Leadership) -> None:
    # Catches what a dropped watch or a failed write left behind; cheap, it reads only the index.
    while True:
        await asyncio.sleep(RESYNC_SECONDS)
        if leadership.is_leader:
            await resync()
