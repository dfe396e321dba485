"""The opted-in lists: in each namespace with a StormService opted in by an update or asking for healing, the
ConfigMap the admission policies read (which services' pods must have been admitted by stormtopo, whose pods
it may evict; see core/optin.py for why they exist), and what the fail-closed gate may add to them (checked
against the cluster: core/gate.py)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from stormtopo.core.gate import (
    Unconfirmed,
    confirmed,
    contradicted,
    expiry_verdict,
    gate_listing,
    still_at,
    uid_of,
    unlabelled_create,
)
from stormtopo.core.optin import labelled, listing, opted_in_configmap, opted_in_key, split_key, valid_names
from stormtopo.core.request import is_opted_in
from stormtopo.core.vocabulary import MANAGED_BY, OPTED_IN_CONFIGMAP
from stormtopo.kube.client import MERGE_PATCH, Api, Conflict, NotFound
from stormtopo.kube.watch import WatchStreams
from stormtopo.operator.loops import UNAVAILABLE_CAP, Loops, backoff
from stormtopo.operator.watch import PERIOD, ListWatch

log = logging.getLogger("stormtopo.optin")


def configmaps_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{quote(namespace, safe='')}/configmaps"


def list_path(namespace: str) -> str:
    return f"{configmaps_path(namespace)}/{OPTED_IN_CONFIGMAP}"


def every_list(api: Api) -> list[dict[str, Any]]:
    """Every namespace's opted-in list, a page at a time (the chart's RBAC grants list by this name only). Since
    Kubernetes 1.31 (consistent reads from the watch cache) the API server filters by name in its cache."""
    return api.raw_list("/api/v1/configmaps", fieldSelector=f"metadata.name={OPTED_IN_CONFIGMAP}")


# On a list, the names its last write by a gate (re)listed, and when: a name listed again while still
# listed changes no data, and every replica must still see its listing as new (a genuine opt-in's update is
# stored only after the gate has answered).
GATE_LISTED = "stormtopo.io/gate-listed"


def gate_listed(value: str | None) -> frozenset[str]:
    try:
        names = json.loads(value or "{}").get("names") or []
    except (ValueError, AttributeError):
        return frozenset()
    return frozenset(str(n) for n in names) if isinstance(names, list) else frozenset()


# The names kept of one namespace's list: a tenant may write its own namespace's list (docs/security.md), and
# every replica decodes what it watches; past this, further names are not known here (their pods are held by
# the policy while listed, as without this reading).
NAMES_KEPT = 4096
MANAGED_BY_SELECTOR = ",".join(f"{key}={value}" for key, value in MANAGED_BY.items())


class ListsSeen:
    """The names every namespace's list holds, as its watch last said, and since when: what the admission
    policy reads, on every replica. A listing another replica's gate wrote (from a review this one never saw)
    is known here too, so the pod webhook can tell a pod the policy would hold for nothing (its service, as
    stored, asks for no topology: a forged or replayed review, or an opt-out not unlisted yet) and let it
    through."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._since: dict[str, dict[str, float]] = {}  # namespace -> name -> when this replica first saw it listed

    def on_event(self, event_type: str | None, configmap: Mapping[str, Any]) -> None:
        """A listed object (event None: a first list or a re-list after a gap, when a name may have been
        listed again unseen) and the names a gate has just (re)listed (GATE_LISTED) count from now."""
        meta = configmap.get("metadata") or {}
        namespace = str(meta.get("namespace") or "")
        if event_type == "DELETED":
            self._since.pop(namespace, None)
            return
        before, now = ({} if event_type is None else self._since.get(namespace, {})), self.clock()
        fresh = gate_listed((meta.get("annotations") or {}).get(GATE_LISTED))
        names = sorted(configmap.get("data") or {})[:NAMES_KEPT]
        self._since[namespace] = {name: now if name in fresh else before.get(name, now) for name in names}

    def on_gone(self, key: tuple[str, str]) -> None:
        self._since.pop(key[0], None)

    def listed_since(self, namespace: str, stormservice: str) -> float | None:
        return self._since.get(namespace, {}).get(stormservice)


@dataclass
class _Batch:
    """Changes to one namespace's list that go in one merge patch, and when it is written."""

    done: asyncio.Future[None]
    changes: dict[str, str | None] = field(default_factory=dict)
    by_gate: set[str] = field(default_factory=set)  # names a gate (re)lists in this write (GATE_LISTED)


def _retrieved(done: asyncio.Future[None]) -> None:
    """Its failure is its callers' to raise; one whose callers were all cancelled is not logged as lost."""
    if not done.cancelled():
        done.exception()


class OptedInList:
    """What every namespace's list says, by opted_in_key, as this replica last read or wrote it."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.listed: dict[str, str] = {}  # as last read or written by this replica
        self._absent: set[str] = set()  # keys absent from the index at the last check
        self._open: dict[str, _Batch] = {}  # per namespace, the changes gathered for its next write
        self._writers: dict[str, asyncio.Task[None]] = {}  # per namespace, the task writing its list
        self._writing: dict[str, _Batch] = {}  # per namespace, the batch being written now
        self.seen = ListsSeen()  # every replica's writes too, once `follow` runs
        self._streams: WatchStreams | None = None

    def follow(self, loops: Loops) -> None:
        """Watch every namespace's list (by name: the chart's RBAC grants list and watch of that name only)."""
        self._streams = WatchStreams(self.api)
        stream = ListWatch(
            self.api,
            self._streams,
            "ConfigMap",
            "v1",
            "/api/v1/configmaps",
            MANAGED_BY_SELECTOR,  # stormtopo's own lists: one a tenant made without the label is not decoded here
            self.seen.on_event,
            self.seen.on_gone,
            field_selector=f"metadata.name={OPTED_IN_CONFIGMAP}",
        )
        loops.supervise("watch-opted-in-lists", PERIOD, stream.run)

    async def close(self) -> None:
        if self._streams is not None:
            await self._streams.close()

    def listed_since(self, namespace: str, stormservice: str) -> float | None:
        """Since when the policy may hold the service's pods, as this replica knows: now for a listing it is
        writing, else when the watch first showed it (any replica's). Not `listed`: on a follower, whose
        reconciler never refreshes it, what its gate once wrote would stay listed there for ever."""
        namespace_batches = (self._open.get(namespace), self._writing.get(namespace))
        if any(batch is not None and batch.changes.get(stormservice) is not None for batch in namespace_batches):
            return self.seen.clock()
        return self.seen.listed_since(namespace, stormservice)

    def refresh(self) -> None:
        """Read every namespace's list (other replicas' webhooks add to them too)."""
        self.listed = {
            opted_in_key(str(cm["metadata"].get("namespace")), str(name)): str(value)
            for cm in every_list(self.api)
            for name, value in (cm.get("data") or {}).items()
        }

    async def record(self, namespace: str, stormservice: str, want: str | None, force: bool = False, by_gate: bool = False) -> None:
        """Say in its namespace's list what it says of a StormService: its scope, or nothing (None,
        unlisted). Writes only on a change unless `force` (this replica's copy may be stale).

        One write of a namespace's list at a time: what is recorded while one is under way goes in the
        next, together. A burst of creates in one namespace (a GitOps sync) then costs a few patches of
        its list, not one each queued on one etcd key; each caller returns once its change is written."""
        if not force and self.current(opted_in_key(namespace, stormservice)) == want:
            return
        batch = self._batch(namespace)
        batch.changes[stormservice] = want
        if by_gate and want is not None:
            batch.by_gate.add(stormservice)
        await asyncio.shield(batch.done)

    async def unlist(self, namespace: str, stormservices: list[str]) -> None:
        """Take these out of their namespace's list in one write, however many (a list a tenant filled with
        junk costs one write per resync, not one per key), by the same writer as every other change of that
        list: an unlisting never lands after a listing recorded later."""
        batch = self._batch(namespace)
        batch.changes.update(dict.fromkeys(stormservices))
        await asyncio.shield(batch.done)

    def _batch(self, namespace: str) -> _Batch:
        """The namespace's batch still open for changes, and its writer."""
        batch = self._open.get(namespace)
        if batch is None:
            batch = self._open[namespace] = _Batch(asyncio.get_running_loop().create_future())
            batch.done.add_done_callback(_retrieved)
            if namespace not in self._writers:
                self._writers[namespace] = asyncio.create_task(self._drain(namespace))
        return batch

    def current(self, key: str) -> str | None:
        """What the list says of `key` once the writes under way and gathered are done: a change still to
        be written must not be skipped as "already so" by what was last written."""
        namespace, name = split_key(key)
        for batch in (self._open.get(namespace), self._writing.get(namespace)):
            if batch is not None and name in batch.changes:
                return batch.changes[name]
        return self.listed.get(key)

    async def _drain(self, namespace: str) -> None:
        """The namespace's writer: the open batch, then the one gathered meanwhile, until none is left."""
        try:
            while (batch := self._open.pop(namespace, None)) is not None:
                self._writing[namespace] = batch
                try:
                    await asyncio.to_thread(self._write, namespace, batch.changes, frozenset(batch.by_gate))
                except Exception as exc:  # each caller refuses (the gate) or retries (the reconciler)
                    batch.done.set_exception(exc)
                else:
                    batch.done.set_result(None)
                finally:
                    self._writing.pop(namespace, None)
        finally:
            self._writers.pop(namespace, None)

    def _write(self, namespace: str, changes: Mapping[str, str | None], by_gate: frozenset[str] = frozenset()) -> None:
        patch: dict[str, Any] = {"data": dict(changes)}
        if by_gate:  # a new value each time (its time), so the write is never a no-op every replica misses
            marker = json.dumps({"at": round(time.time(), 3), "write": uuid.uuid4().hex[:12], "names": sorted(by_gate)})
            patch["metadata"] = {"annotations": {GATE_LISTED: marker}}
        try:
            self.api.request("PATCH", list_path(namespace), patch, MERGE_PATCH)
        except NotFound:
            listed = {name: want for name, want in changes.items() if want is not None}
            if listed:
                try:
                    body = {**opted_in_configmap(namespace), "data": listed}
                    if by_gate:
                        body["metadata"] = {**body["metadata"], **patch["metadata"]}
                    self.api.request("POST", configmaps_path(namespace), body)
                except Conflict:
                    # Another replica (or this one's other admission) created it meanwhile: add to theirs.
                    self.api.request("PATCH", list_path(namespace), patch, MERGE_PATCH)
        for name, want in changes.items():
            key = opted_in_key(namespace, name)
            if want is None:
                self.listed.pop(key, None)
            else:
                self.listed[key] = want

    def stale(self, present: Mapping[str, object]) -> list[str]:
        """Listed keys whose StormService was absent at this and the previous check (`present`: the
        keys of the StormServices known now): deleted while stormtopo was down, or never created
        (the gate lists a StormService before it exists). Two checks, so one just created survives."""
        absent = {key for key in self.listed if key not in present}
        gone = sorted(absent & self._absent)
        self._absent = absent - set(gone)
        return gone


Lookup = Callable[[str, str], Awaitable[dict[str, Any] | None]]  # (namespace, name) -> the StormService or None
# How often unconfirmed listings are checked against the watch (each is due CONFIRM_SECONDS after it was
# written, or at once when the watch contradicts it): with none unconfirmed a check costs nothing.
SWEEP_SECONDS = 0.25
ROOM_WAIT = 2.0  # seconds a review waits for the watch to confirm listings when the unconfirmed ones are at their bound
ROOM_POLL = 0.05
# While a review waits for room, each sweep reads from the API server the oldest listings the watch has
# not confirmed for WATCH_LAG (a replica just started, or a loaded API server, can lag by seconds), at
# most READS_FOR_ROOM of them: a made-up name reads as not found and keeps its slot until it falls due.
WATCH_LAG = 0.5
READS_FOR_ROOM = 8
# A listing read and not found stored (a made-up name, or a create refused after this webhook admitted it)
# is read again only after this long: the next oldest are read meanwhile, and the reads stay bounded.
READ_AGAIN = 1.0
# An UPDATE listing whose StormService the watch still shows at the version the review named as old, this
# long after: the update has not happened (a forged or replayed review); read, and taken back at once.
UPDATE_LAG = 2.0
# A review for a listing this replica wrote longer ago than this writes it again (its mark, GATE_LISTED): a
# replay just before the owner's own opt-in from the same version must not make the genuine one look old to
# the pod webhook (operator/listed_pods.py judges listings a second old). A replayed version lives UPDATE_LAG.
MARK_AGAIN = 0.5


def fair_share(keys: list[str]) -> list[str]:
    """Keys oldest first within each namespace, the namespaces taking turns: a namespace full of replays
    does not take every read from another's waiting opt-ins."""
    turn: Counter[str] = Counter()
    ranked = []
    for i, key in enumerate(keys):
        namespace = split_key(key)[0]
        ranked.append((turn[namespace], i, key))
        turn[namespace] += 1
    return [key for _, _, key in sorted(ranked)]


class Gate:
    """What the StormService gate lists, per operator replica. `indexed` answers from the watch (may
    lag by a moment), `stored` reads the API server (authoritative). A review is never trusted by
    itself: see core/gate.py."""

    def __init__(
        self,
        opted_in: OptedInList,
        indexed: Callable[[str, str], Mapping[str, Any] | None],
        stored: Lookup,
        unconfirmed: Unconfirmed | None = None,
        clock: Callable[[], float] = time.monotonic,
        room_wait: float = ROOM_WAIT,
    ) -> None:
        self.opted_in = opted_in
        self.indexed = indexed
        self.stored = stored
        self.unconfirmed = unconfirmed or Unconfirmed()
        self.clock = clock
        self.room_wait = room_wait
        self._sweeping = asyncio.Lock()
        self._waiting: dict[str, int] = {}  # namespace -> reviews waiting for room among its unconfirmed listings
        self._read_at: dict[str, float] = {}  # unconfirmed key -> when it was last read for room
        self._confirmed_at = float("-inf")  # monotonic: the waiting reviews' last look at the index

    async def review(self, request: Mapping[str, Any]) -> str | None:
        """List what an AdmissionReview's request may list; a refusal message, or None to allow.
        Refusing is safe: the gate fails closed, and only for StormServices that carry a request."""
        obj = request.get("object") or {}
        meta = obj.get("metadata") or {}
        namespace, name = str(request.get("namespace") or meta.get("namespace") or ""), str(meta.get("name") or "")
        operation = str(request.get("operation") or "")
        if operation == "CREATE":
            return unlabelled_create(obj)  # a create is never listed: held by its label, or refused
        if request.get("dryRun") or not valid_names(namespace, name):
            return None  # a real review names a valid namespace and StormService: a made-up one lists nothing
        key = opted_in_key(namespace, name)
        if operation != "UPDATE" or listing(obj) is None or labelled(obj):
            return None  # nothing to list whatever is stored (gate_listing): no read, no room taken
        self._confirm_from_index()
        current = self.indexed(namespace, name)
        if not self._is_oldobject(request, current):
            current = await self.stored(namespace, name)  # the index may lag an update
        want, why = gate_listing(operation, obj, request.get("oldObject"), current, self.unconfirmed.refuted.get(key))
        if want is None:
            log.debug("gate lists nothing for %s (%s): %s", key, operation, why)
            return None
        if not await self._room_for(key):  # re-checked: other reviews may have filled it meanwhile
            return self._full(key)
        old_meta = (request.get("oldObject") or {}).get("metadata") or {}
        version = str(old_meta.get("resourceVersion") or "") if operation == "UPDATE" else ""  # what an UPDATE was listed from
        # An opt-in not stored yet is marked on the list (GATE_LISTED); one of a service stored opted in is not
        # (its listing is the reconciler's, and a replay of it must cost no write).
        unstored = not is_opted_in(((current or {}).get("metadata") or {}).get("annotations"))
        listed_at = self.unconfirmed.since.get(key)
        new = self.unconfirmed.add(key, self.clock(), uid_of(current), version)
        recent = listed_at is not None and self.clock() - listed_at < MARK_AGAIN
        if not new and self.opted_in.current(key) == want and (recent or not unstored):
            return None  # listed by this replica moments ago: no rewrite of the ConfigMap
        try:
            # force: this replica's copy of the list may be stale (another replica's reconciler unlisted it)
            await self.opted_in.record(namespace, name, want, force=True, by_gate=unstored)
        except Exception as exc:  # any failure refuses: the API server retries nothing for us
            if new:
                self.unconfirmed.drop(key)
            return f"stormtopo could not list this StormService as opted in, retry: {exc}"
        return None

    @staticmethod
    def _is_oldobject(request: Mapping[str, Any], current: Mapping[str, Any] | None) -> bool:
        """The index holds exactly the version the UPDATE review names: no API read is needed to judge it."""
        if current is None:
            return False
        old = (request.get("oldObject") or {}).get("metadata") or {}
        return bool(old.get("resourceVersion")) and old.get("resourceVersion") == (current.get("metadata") or {}).get("resourceVersion")

    async def _room_for(self, key: str) -> bool:
        """Room for `key` among the unconfirmed listings, waiting up to ROOM_WAIT for the watch to confirm
        some: a burst of genuine opt-ins (a GitOps sync) outruns the watch by a moment and is then let in;
        replays stay bounded (each waits, then is refused)."""
        deadline = time.monotonic() + self.room_wait  # real time: the watch's lag, not the listings' clock
        namespace = split_key(key)[0]
        self._waiting[namespace] = self._waiting.get(namespace, 0) + 1  # the sweep reads its oldest listings meanwhile
        try:
            while not self.unconfirmed.has_room(key):
                if time.monotonic() >= deadline:
                    return False
                await asyncio.sleep(ROOM_POLL)
                if time.monotonic() - self._confirmed_at >= ROOM_POLL:  # once a poll for all the reviews waiting
                    self._confirmed_at = time.monotonic()
                    self._confirm_from_index()
            return True
        finally:
            self._waiting[namespace] -= 1
            if not self._waiting[namespace]:
                del self._waiting[namespace]

    def _full(self, key: str) -> str:
        return (
            f"stormtopo already holds {self.unconfirmed.in_namespace(key)} listings of StormServices of this namespace "
            f"({len(self.unconfirmed.since)} in all) that the cluster has not confirmed yet (its limit: a burst of "
            f"opt-ins, or reviews that did not come from the API server); retry in {self.unconfirmed.ttl:.0f} s"
        )

    def _confirm_from_index(self) -> None:
        for key in list(self.unconfirmed.since):
            namespace, name = split_key(key)
            if confirmed(self.indexed(namespace, name), self.opted_in.listed.get(key)):
                self.unconfirmed.drop(key)

    def _contradicted_by_index(self) -> list[str]:
        """Unconfirmed listings whose StormService the watch shows under another uid than claimed."""
        claims = self.unconfirmed.claims
        return [key for key in self.unconfirmed.since if contradicted(self.indexed(*split_key(key)), claims.get(key, ""))]

    async def _confirm_by_reading(self) -> None:
        """Confirm, from the API server, the oldest listings the watch has not confirmed yet: each stored
        with the uid it was claimed for and asking for what was listed."""
        now = self.clock()
        self._read_at = {k: t for k, t in self._read_at.items() if k in self.unconfirmed.since}  # at most the bound
        anywhere = len(self.unconfirmed.since) >= self.unconfirmed.total  # else only a waiting namespace's free its room
        due = [
            k
            for k in self.unconfirmed.older_than(WATCH_LAG, now)
            if (anywhere or split_key(k)[0] in self._waiting) and now - self._read_at.get(k, float("-inf")) >= READ_AGAIN
        ]
        for key in fair_share(due)[:READS_FOR_ROOM]:
            self._read_at[key] = now
            token = (self.unconfirmed.since.get(key), self.unconfirmed.claims.get(key))
            stored = await self.stored(*split_key(key))
            if token[0] is None or (self.unconfirmed.since.get(key), self.unconfirmed.claims.get(key)) != token:
                continue  # confirmed, or claimed again, while it was read
            if confirmed(stored, self.opted_in.listed.get(key)) and not contradicted(stored, token[1] or ""):
                self.unconfirmed.drop(key)

    def _unchanged_by_index(self) -> list[str]:
        """UPDATE listings whose StormService the watch still shows, UPDATE_LAG after, at the version their
        review named as old: the update they were listed for has not happened."""
        versions = self.unconfirmed.versions
        return [
            key
            for key in self.unconfirmed.older_than(UPDATE_LAG, self.clock())
            if still_at(self.indexed(*split_key(key)), versions.get(key, ""))
        ]

    async def sweep(self) -> None:
        """Take back each listing unconfirmed for CONFIRM_SECONDS, or contradicted by the StormService's uid,
        whose StormService, read from the API server, does not exist or asks for nothing; while a review
        waits for room, confirm the oldest by reading them."""
        async with self._sweeping:
            self._confirm_from_index()
            if self._waiting:
                await self._confirm_by_reading()
            due = self.unconfirmed.due(self.clock())
            early = [key for key in self._contradicted_by_index() if key not in due]
            unchanged = [key for key in self._unchanged_by_index() if key not in due and key not in early]
            for key in due + early + unchanged:
                namespace, name = split_key(key)
                token = (self.unconfirmed.since.get(key), self.unconfirmed.claims.get(key))
                version = self.unconfirmed.versions.get(key, "")
                stored = await self.stored(namespace, name)
                if token[0] is None or (self.unconfirmed.since.get(key), self.unconfirmed.claims.get(key)) != token:
                    continue  # confirmed, or claimed again, while it was read: this read judges nothing now
                if key in early and not contradicted(stored, self.unconfirmed.claims.get(key, "")):
                    continue  # the watch lagged a delete and the create this listing is for: not due yet
                if key in unchanged and not still_at(stored, version):
                    self.unconfirmed.versions[key] = ""  # the update happened, the watch lags: not read again for it
                    continue
                verdict = expiry_verdict(stored, self.opted_in.listed.get(key))
                if verdict != "keep":
                    if verdict.endswith("-refuted") and key not in early:  # a made-up create replays no version
                        self.unconfirmed.refute(key, ((stored or {}).get("metadata") or {}).get("resourceVersion"))
                    # A real opt-in racing this is listed again by the reconciler at its watch event.
                    asked = listing(stored) if verdict == "relist-refuted" else None
                    await self.opted_in.record(namespace, name, asked, force=True)
                    log.info(
                        "took back the listing of %s: %s",
                        key,
                        "no such StormService" if stored is None else f"it asks for {asked}" if asked else "it asks for no topology",
                    )
                self.unconfirmed.drop(key)

    async def run(self, interval: float = SWEEP_SECONDS) -> None:
        """Sweep forever; any failure (the API server restarting) is logged and retried after a backoff
        doubling from `interval` to at most UNAVAILABLE_CAP (not four tracebacks a second through an outage)."""
        failures = 0
        while True:
            await asyncio.sleep(backoff(failures, interval, UNAVAILABLE_CAP) if failures else interval)
            try:
                await self.sweep()
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception:  # a loop that must not end
                failures += 1
                wait = backoff(failures, interval, UNAVAILABLE_CAP)
                log.exception("checking unconfirmed opted-in listings failed; retrying in %.2f s", wait)
