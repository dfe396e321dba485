"""Watch events feed the index and trigger reconciliation.

StormServices, RoleSets and HyperNodes come from kopf. Only raw event handlers are used: they keep no
state on the watched objects, so the operator never writes kopf's bookkeeping annotations into a
user's StormService or AIBrix's RoleSets. Pods and PodGroups come from the operator's own list+watch
(operator/watch.py), which selects them on the server: kopf would list and stream every pod of the
cluster and filter them in the client.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from stormtopo.core.ownership import roleset_name
from stormtopo.core.vocabulary import (
    ADMITTED_LABEL,
    AIBRIX,
    MANAGED_BY_LABEL,
    OPERATOR_NAME,
    ROLESET_LABEL,
    VOLCANO_SCHEDULING,
    VOLCANO_TOPOLOGY,
)
from stormtopo.kube.client import Api, KubeError
from stormtopo.kube.watch import WatchStreams
from stormtopo.operator import metrics, watch
from stormtopo.operator.config import RELIST_SECONDS, RESYNC_SECONDS
from stormtopo.operator.index import DELIVERED_BY_RELIST, Index, Key, key_of, service_key_of
from stormtopo.operator.leader import Leadership
from stormtopo.operator.loops import Loops, yielding
from stormtopo.operator.reconciliation import Reconciler
from stormtopo.operator.replica import PlacementReporter
from stormtopo.operator.workqueue import WorkQueue

log = logging.getLogger("stormtopo.handlers")
RESYNC_CHUNK = 512  # keys queued by the resync between two yields to the event loop
# What the index holds, and where the API lists it.
_LISTS = {
    "StormService": (AIBRIX, "stormservices"),
    "RoleSet": (AIBRIX, "rolesets"),
    "PodGroup": (VOLCANO_SCHEDULING, "podgroups"),
    "HyperNode": (VOLCANO_TOPOLOGY, "hypernodes"),
    "Pod": (("", "v1"), "pods"),
}
# Selected on the server: only the pods stormtopo admitted; the PodGroups of AIBrix's replicas, and those
# stormtopo owns for StormService-scoped requests (they carry no roleset-name label).
OWNED_PODGROUPS = f"{MANAGED_BY_LABEL}={OPERATOR_NAME},!{ROLESET_LABEL}"
_SELECTORS = {"Pod": (ADMITTED_LABEL,), "PodGroup": (ROLESET_LABEL, OWNED_PODGROUPS)}


@dataclass
class Operator:
    """The index, the two work queues and what their workers call. Every replica keeps its index warm
    (the webhook answers from it); only the leader reconciles and reports."""

    index: Index
    reconciler: Reconciler
    reporter: PlacementReporter
    leadership: Leadership

    loops: Loops = field(default_factory=Loops)
    resync_seconds: float = RESYNC_SECONDS
    relist_seconds: float = RELIST_SECONDS
    watch_missed: dict[str, int] = field(default_factory=dict)  # kind -> objects the re-lists delivered that the watch had not
    _missed_before: dict[str, bool] = field(default_factory=dict)  # kind -> whether the last re-list delivered any
    _behind: dict[str, bool] = field(default_factory=dict)  # kind -> whether the last two re-lists both delivered some

    def __post_init__(self) -> None:
        self.stormservices: WorkQueue[Key] = WorkQueue("stormservices", self._reconcile, workers=4)
        self.placements: WorkQueue[Key] = WorkQueue("placements", self._report, workers=4)
        self.streams: WatchStreams | None = None  # created at start, on the event loop

    async def _reconcile(self, key: Key) -> None:
        stormservice = self.index.stormservices.get(key)
        if stormservice is not None and self.leadership.is_leader:  # None: deleted, or its own event is on the way
            await self.reconciler.reconcile(stormservice)

    async def _report(self, key: Key) -> None:
        if self.leadership.is_leader:
            await self.reporter.replica_changed(key)

    async def resync(self) -> None:
        await self.reconciler.refresh_opted_in()
        async for key in yielding(list(self.index.stormservices), RESYNC_CHUNK):
            self.stormservices.add(key)
        # Every replica too: placements a former leader did not report, pending gangs explained again.
        async for replica in yielding(list(self.index.rolesets), RESYNC_CHUNK):
            self.placements.add(replica)

    def follow(self, kind: str, event: Mapping[str, Any], body: Mapping[str, Any]) -> None:
        """Record the object, and queue what it changes if this replica leads: a StormService or a
        RoleSet its StormService's PodGroups; a pod or a replica's PodGroup that replica's placement."""
        deleted = event.get("type") == "DELETED"
        known = kind == "StormService" and key_of(body) in self.index.stormservices
        self.index.observe(kind, event.get("type"), body)
        if deleted:
            self.forget(kind, key_of(body))
        if not self.leadership.is_leader:
            return
        if kind == "StormService" and not deleted and not known:  # come, however it was delivered (gone: forget)
            self.prefix_changed(key_of(body))
        if kind == "StormService" and not deleted:
            self.stormservices.add(key_of(body))
        elif kind == "RoleSet":  # (gone too: its service may leave its namespace's list, core/optin.py listing)
            self.stormservices.add(service_key_of(body))
            if not deleted:
                self.placements.add(key_of(body))
        elif kind in ("Pod", "PodGroup") and roleset_name(body):
            self.placements.add((key_of(body)[0], roleset_name(body) or ""))

    def prefix_changed(self, key: Key) -> None:
        """A StormService's name came or went: another of its namespace whose RoleSet prefix it shares may be
        movable now, or no longer (core/movable.py). Reconciled again, if this replica leads."""
        if self.leadership.is_leader:
            for name in self.index.prefix_neighbours(*key):
                self.stormservices.add((key[0], name))

    def forget(self, kind: str, key: Key) -> None:
        if kind == "StormService":
            self.reconciler.forget(key)
            self.prefix_changed(key)
        elif kind == "RoleSet":
            self.reporter.forget(key)

    async def relist(self, api: Api) -> None:
        """Drop what a re-list no longer has: a watch that was down never delivered those deletions. Of
        StormServices, RoleSets and HyperNodes (kopf's watches), also deliver what it has that the watch did not: a
        watch refused (403) or failing (5xx) for long while lists work leaves no replica unreconciled; of
        HyperNodes too, so the tree is not stale."""
        for kind, (group_version, plural) in _LISTS.items():
            mark = self.index.mark()
            listed: set[Key] = set()
            try:
                for selector in _SELECTORS.get(kind, ("",)):
                    path = api.path(group_version, plural)
                    if kind in DELIVERED_BY_RELIST:
                        listed |= await self._deliver_missed(api, kind, path, mark)
                    else:
                        listed |= await asyncio.to_thread(_keys, api, path, selector)
            except (KubeError, OSError) as exc:
                log.warning("re-list of %s failed, retried in %.0f s: %s", plural, self.relist_seconds, exc)
                continue
            await self.index.prune(kind, listed, mark, functools.partial(self._forgotten, kind))
            if kind in DELIVERED_BY_RELIST:
                self.index.relisted(kind, mark)

    def _forgotten(self, kind: str, key: Key) -> None:
        log.info("forgot %s %s/%s: deleted while a watch was down", kind, *key)
        self.forget(kind, key)

    async def _deliver_missed(self, api: Api, kind: str, path: str, mark: int) -> set[Key]:
        """The keys a list of `kind` has, a page at a time; each object the watch missed is followed as
        if its event had come (recorded, and queued if this replica leads)."""
        listed: set[Key] = set()
        missed = 0
        pages = api.pages(path)
        while (page := await asyncio.to_thread(next, pages, None)) is not None:
            for obj in page:
                listed.add(key_of(obj))
                if self.index.missed(kind, obj, mark):
                    self.follow(kind, {"type": "MODIFIED"}, {"kind": kind, **obj})
                    missed += 1
            await asyncio.sleep(0)  # the webhooks and probes share this loop
        # One re-list may meet events still in flight; two in a row that find some, a watch that is down.
        again = bool(missed) and self._missed_before.get(kind, False)
        if missed:
            metrics.WATCH_MISSED.labels(kind).inc(missed)
            self.watch_missed[kind] = self.watch_missed.get(kind, 0) + missed
            level = logging.WARNING if again else logging.INFO
            log.log(level, "the %s watch had not delivered %d that the re-list found%s; delivered now", kind, missed, " again" * again)
        self._missed_before[kind] = bool(missed)
        self._behind[kind] = again
        metrics.WATCH_BEHIND.labels(kind).set(int(again))
        return listed

    def watch_report(self) -> dict[str, Any]:
        """kopf's watches as the re-lists see them, for /healthz: per kind, what the re-lists delivered that the watch
        had not; and the kinds whose last two re-lists both found some (behind: changes come only at each re-list).
        Information, never a failure: a watch the API server refuses is not fixed by restarting stormtopo."""
        return {
            "missed, delivered by the re-list": dict(sorted(self.watch_missed.items())),
            "behind": sorted(kind for kind, behind in self._behind.items() if behind),
        }

    def watches(self) -> list[watch.ListWatch]:
        """The server-selected list+watch streams of pods and PodGroups, feeding what kopf's handlers fed."""
        assert self.streams is not None

        def following(kind: str) -> Callable[[str | None, dict[str, Any]], None]:
            return lambda event_type, obj: self.follow(kind, {"type": event_type, "object": obj}, obj)

        def recording(kind: str) -> Callable[[str | None, dict[str, Any]], None]:
            return lambda event_type, obj: self.index.observe(kind, event_type, obj)

        def gone(kind: str, record: Callable[[str | None, dict[str, Any]], None]) -> Callable[[Key], None]:
            store = self.index.pods if kind == "Pod" else self.index.podgroups

            def deleted(key: Key) -> None:
                body = store.get(key)  # what the index knows of it: its labels say which replica it was in
                if body is not None:
                    log.info("forgot %s %s/%s: deleted while the watch was down", kind, *key)
                    record("DELETED", body)

            return deleted

        api, podgroups = self.index.api, Api.path(VOLCANO_SCHEDULING, "podgroups")
        version = "/".join(VOLCANO_SCHEDULING)
        streams = [
            ("Pod", "v1", "/api/v1/pods", ADMITTED_LABEL, following("Pod")),
            ("PodGroup", version, podgroups, ROLESET_LABEL, following("PodGroup")),
            # Of these only the index needs to know: no replica's placement hangs on them.
            ("PodGroup", version, podgroups, OWNED_PODGROUPS, recording("PodGroup")),
        ]
        return [
            watch.ListWatch(api, self.streams, kind, api_version, path, selector, record, gone(kind, record))
            for kind, api_version, path, selector, record in streams
        ]

    def start(self) -> None:
        """The work queues and every background loop, supervised (operator/loops.py)."""
        self.stormservices.start()
        self.placements.start()
        self.loops.probe("queue-stormservices", self.stormservices.stuck)
        self.loops.probe("queue-placements", self.placements.stuck)
        self.reporter.wake = self.placements.add  # a replica's placement lets a sibling held for the spread go
        self.leadership.on_elected = self.resync  # a new leader catches up at once
        self.loops.every("resync", self.resync_seconds, self.resync, lambda: self.leadership.is_leader)
        self.loops.every("relist", self.relist_seconds, lambda: self.relist(self.index.api))
        # kopf's watches of StormServices and RoleSets, as the re-lists see them: what they missed is
        # delivered (never a reason to restart: a watch the API server refuses is not stormtopo's fault).
        self.loops.note("kopf-watches", self.watch_report)
        for kind in DELIVERED_BY_RELIST:  # a series from the start (0), not only once a re-list found one behind
            metrics.WATCH_BEHIND.labels(kind).set(int(self._behind.get(kind, False)))
        if self.leadership.api is not None:  # election on (--leader-elect)
            self.loops.supervise("leader-election", self.leadership.retry_period, self.leadership.run)
        self.streams = WatchStreams(self.index.api)
        names = ("watch-pods", "watch-replica-podgroups", "watch-owned-podgroups")
        for name, stream in zip(names, self.watches(), strict=True):
            self.loops.supervise(name, watch.PERIOD, stream.run)

    async def stop_queues(self) -> None:
        await self.stormservices.stop()
        await self.placements.stop()

    async def close(self) -> None:
        await self.stop_queues()
        if self.streams is not None:
            await self.streams.close()


class ForeverBackoffs:
    """kopf's waits between the attempts of one request: 1, 1, 2, ... 21 s, then every 30 s without end. kopf
    gives a request up, a watch stream's too, once its backoffs run out, and a watch given up ends kopf and
    the process with it (its orchestrator re-raises a watcher's error); so a watch now outlasts an outage of
    any length and resumes within 30 s of the API server's return. Its other requests are the resource
    discovery and the CRD watch, which retry the same way (raw event handlers only: no patch, no diff base,
    no peering; events post with their own backoffs). Every wait is a cancellable sleep: a stop is not held."""

    def __iter__(self) -> Iterator[float]:
        return itertools.chain((1, 1, 2, 3, 5, 8, 13, 21), itertools.repeat(30))


def _keys(api: Api, path: str, selector: str) -> set[Key]:
    query = {"labelSelector": selector} if selector else {}
    return {key_of(obj) for page in api.pages(path, **query) for obj in page}  # a page at a time, reduced to keys


def register(
    registry: kopf.OperatorRegistry,
    index: Index,
    reconciler: Reconciler,
    reporter: PlacementReporter,
    leadership: Leadership,
    loops: Loops | None = None,
    resync_seconds: float = RESYNC_SECONDS,
    relist_seconds: float = RELIST_SECONDS,
) -> Operator:
    """A handler only records the object and queues a key: the work happens in the queues' few workers,
    so kopf's per-object workers end at once and never pile up event bodies during a burst. Handlers
    are coroutines that never await: kopf would run plain functions on threads, and the index and
    queues belong to the event loop."""
    operator = Operator(index, reconciler, reporter, leadership, loops or Loops(), resync_seconds, relist_seconds)

    @kopf.on.event(*AIBRIX, "stormservices", registry=registry)
    async def stormservice_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        operator.follow("StormService", event, body)

    @kopf.on.event(*AIBRIX, "rolesets", registry=registry)
    async def roleset_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        operator.follow("RoleSet", event, body)

    @kopf.on.event(*VOLCANO_TOPOLOGY, "hypernodes", registry=registry)
    async def hypernode_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        index.observe("HyperNode", event.get("type"), body)

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return _login(index.api, **kwargs)

    @kopf.on.startup(registry=registry)
    async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        _configure(settings)
        operator.start()

    return operator


def _login(api: Api, **kwargs: Any) -> kopf.ConnectionInfo | None:
    """A custom registry has none of kopf's default login handlers: log in as the API client does."""
    if api.in_cluster:
        return kopf.login_with_service_account(**kwargs)
    creds = api.credentials
    return kopf.ConnectionInfo(
        server=creds.server,
        ca_path=creds.ca_path,
        insecure=creds.insecure,
        token=creds.bearer(),
        certificate_path=creds.cert_path,
        private_key_path=creds.key_path,
    )


class NoDiffBase(kopf.DiffBaseStorage):
    """No change detection. kopf deep-copies every watched object on every event to find what changed
    for change handlers; stormtopo has only raw event handlers, so that copy is never read. Measured
    under bench --admission with 20 hard gangs pending: a quarter of the operator's CPU."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


def _configure(settings: kopf.OperatorSettings) -> None:
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.posting.level = logging.WARNING  # Events go to the objects they are about, not to kopf's log
    # Events are posted a few at a time: kopf's client opens one TLS connection per post in flight,
    # and a burst of a thousand at once cost tens of MB of connection buffers.
    settings.posting.worker_limit = 4
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 30
    settings.networking.error_backoffs = ForeverBackoffs()
    # Per-object workers: a bounded number, gone soon after the last event. A worker holds its slot for
    # its idle timeout after each event, so the limit over the timeout caps kopf's throughput: 0.5 s let
    # through 128 objects a second, and a restart at 40,000 StormServices and RoleSets took 6 minutes to
    # deliver them (BENCHMARKS.md, Scale: the loop-stall rows on the local control plane).
    settings.queueing.worker_limit = 64
    settings.queueing.idle_timeout = 0.02
