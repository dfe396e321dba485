"""The operator's own list+watch, for the kinds whose objects it selects on the server.

kopf's `labels=` filter is applied in the client, after a full unpaged list and a watch of every object
of the kind (nolar/kopf#1311): the operator's memory and CPU then grow with every pod in the cluster,
stormtopo's or not. This loop asks the API server for the selected objects only: it lists them a page
at a time, watches from the list's resourceVersion with bookmarks, re-lists when that version is gone
(410), and is run by `Loops.supervise`, which restarts it with a backoff after any error.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stormtopo.kube.client import PAGE_SIZE, Api, ApiError, Forbidden, Gone, NotFound, Unauthorized
from stormtopo.kube.watch import READ_SLACK, WatchStreams
from stormtopo.operator.index import Key, key_of
from stormtopo.operator.loops import Loop, backoff

log = logging.getLogger("stormtopo.watch")
WATCH_SECONDS = 300  # the server ends each watch request after about this long (jittered); it is re-opened
PERIOD = WATCH_SECONDS + READ_SLACK  # a healthy stream makes progress (an event, a bookmark, an end) this often


class Expired(Exception):
    """The resourceVersion to watch from is gone (410): list again."""


@dataclass
class ListWatch:
    """Keeps a sink informed of every object matching `selector`: `on_event(type, object)` for each listed
    object (type None), then for each watch event (ADDED, MODIFIED, DELETED), and `on_gone(key)` for an
    object a re-list no longer has (its deletion happened while the watch was down)."""

    api: Api
    streams: WatchStreams
    kind: str  # the object's kind, set on listed items (a list's items carry none)
    api_version: str
    path: str
    selector: str
    on_event: Callable[[str | None, dict[str, Any]], None]
    on_gone: Callable[[Key], None]
    field_selector: str = ""  # and these fields (e.g. bound pods only), also selected on the server
    on_listed: Callable[[], None] = lambda: None  # told after each complete list
    resource_version: str = ""
    known: set[Key] = field(default_factory=set)  # what this stream says exists now

    def _query(self) -> dict[str, str]:
        return {
            **({"labelSelector": self.selector} if self.selector else {}),
            **({"fieldSelector": self.field_selector} if self.field_selector else {}),
        }

    async def run(self, loop: Loop) -> None:
        """List, then watch, forever; returns never. Errors propagate to the supervisor, which backs off
        and calls this again: it resumes from the last resourceVersion, or lists again if that is gone."""
        not_served = 0  # consecutive lists answered 404
        while True:
            if not self.resource_version:
                try:
                    await self.relist(loop)
                    not_served = 0
                except NotFound:
                    # The CRD is not installed (yet), or the API server has just restarted and does not serve
                    # its kind yet (it answers 404 for a few seconds): not an error of this loop. Retry soon
                    # first (1, 2, 4 ... s), so the watch resumes with the API server, then every 30 s.
                    not_served += 1
                    delay = backoff(not_served)
                    if not_served == 1:
                        log.warning(
                            "%s not served (CRD not installed, or the API server starting?); listing again in %.0f s", self.path, delay
                        )
                    loop.alive()
                    await asyncio.sleep(delay)
                    continue
            try:
                await self.watch(loop)
            except Expired:
                log.info("watch of %s (%s) expired at resourceVersion %s: listing again", self.path, self.selector, self.resource_version)
                self.resource_version = ""

    async def relist(self, loop: Loop) -> None:
        listed: set[Key] = set()
        token, version = "", ""
        while True:
            query = {**self._query(), "limit": str(PAGE_SIZE), **({"continue": token} if token else {})}
            page = await asyncio.to_thread(self.api.request, "GET", self.path, **query) or {}
            meta = page.get("metadata") or {}
            version = meta.get("resourceVersion") or version
            for obj in page.get("items") or []:
                obj.setdefault("kind", self.kind)
                obj.setdefault("apiVersion", self.api_version)
                listed.add(key_of(obj))
                self._deliver(None, obj)
            del page  # a page at a time: never the whole list in memory
            token = meta.get("continue") or ""
            if not token:
                break
            await asyncio.sleep(0)  # let the webhook answer between pages
        for key in self.known - listed:
            self._gone(key)
        self.known = listed
        self.resource_version = version
        loop.succeeded()
        self.on_listed()

    async def watch(self, loop: Loop) -> None:
        seconds = random.randint(WATCH_SECONDS * 4 // 5, WATCH_SECONDS)  # replicas do not all reconnect at once
        events = self.streams.events(self.path, self.resource_version, seconds, **self._query())
        try:
            async with contextlib.aclosing(events):
                async for event in events:
                    self._handle(event)
                    loop.succeeded()
        except ApiError as exc:
            if isinstance(exc, Gone):
                raise Expired() from exc
            if isinstance(exc, (Unauthorized, Forbidden)):
                # Refused (RBAC granting list but not watch, a token rotated): the next try lists again,
                # so a reading never stays frozen at its last list while the loop fails.
                self.resource_version = ""
            raise
        loop.succeeded()  # the server ended the request at its timeout: watch on from where it stopped

    def _handle(self, event: dict[str, Any]) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":  # the watch's own Status: typed as an answer to a request would be
            error = ApiError.of(int(obj.get("code") or 500), "WATCH", self.path, json.dumps(obj))
            if isinstance(error, Gone):
                raise Expired()
            raise error
        version = (obj.get("metadata") or {}).get("resourceVersion") or self.resource_version
        if kind != "BOOKMARK":
            key = key_of(obj)
            if kind == "DELETED":
                self.known.discard(key)
            else:
                self.known.add(key)
            self._deliver(str(kind), obj)
        self.resource_version = version

    def _deliver(self, kind: str | None, obj: dict[str, Any]) -> None:
        # A failure of what the sink does with one object must not stall the stream for all others.
        try:
            self.on_event(kind, obj)
        except Exception:
            log.exception("recording %s %s/%s failed", self.kind, *key_of(obj))

    def _gone(self, key: Key) -> None:
        try:
            self.on_gone(key)
        except Exception:
            log.exception("forgetting %s %s/%s failed", self.kind, *key)
