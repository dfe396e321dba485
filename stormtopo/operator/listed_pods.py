"""A pod of a StormService that is listed (so the admission policy would refuse it unless stormtopo admits
it) while the service asks for no topology: a review forged or replayed at its current version made the
gate list it, or an opt-out is not unlisted yet. The pod webhook asks the stored StormService, once the
listing is old enough for a genuine opt-in to be stored, and lets such a pod through (docs/security.md)."""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from stormtopo.core.request import is_opted_in
from stormtopo.operator.optin import OptedInList

log = logging.getLogger("stormtopo.webhook")

# A genuine opt-in's listing is written by the gate before its update is stored (the rest of its admission,
# then the write): a pod of a listed service that, as stored, asks for nothing is judged only once its listing
# is this old (seconds; within the pod webhook's 3 s timeout, with STORED_READ_TIMEOUT).
LISTING_SETTLES = 1.0
STORED_READ_TIMEOUT = 1.5
STORED_READS = 4  # at once, over every service: the executor's threads are shared with the writer and the index
READ_FAILURE_LOG_EVERY = 60.0


class Listed(enum.Enum):
    NOT = "not listed, or asks for a topology"
    FOR_NOTHING = "listed, and as stored asks for nothing"
    CATCHING_UP = "listed, and as stored asks for a topology the index has not seen"


class StoredServices:
    """The API server's copy of a StormService, for the pod webhook. A review never takes the answer of a read
    that started before it came (it may predate an opt-in stored since): while one read of a service is under
    way, reviews that come join the one read that starts after it (the pods of a replica come together, and a
    forged pod review costs no more than a real one). At most STORED_READS at once, each slot held until its
    read's thread ends (a slow API server cannot pile up threads that the writer and the gate share); a review
    waits STORED_READ_TIMEOUT at most, for a slot and its read."""

    def __init__(self, read: Callable[[str, str], Awaitable[dict[str, Any] | None]]) -> None:
        self.read = read
        self._slots = asyncio.Semaphore(STORED_READS)
        self._under_way: dict[tuple[str, str], asyncio.Future[dict[str, Any] | None]] = {}
        self._next: dict[tuple[str, str], asyncio.Future[dict[str, Any] | None]] = {}  # starts once the read under way ends
        self._logged_at = float("-inf")

    async def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        key = (namespace, name)
        future = self._next.get(key)
        if future is None:
            future = asyncio.ensure_future(self._read(key, self._under_way.get(key)))
            if key in self._under_way:
                self._next[key] = future
            else:
                self._under_way[key] = future
            future.add_done_callback(lambda done: self._done(key, done))
        return await asyncio.wait_for(asyncio.shield(future), STORED_READ_TIMEOUT)

    async def _read(self, key: tuple[str, str], after: asyncio.Future[dict[str, Any] | None] | None) -> dict[str, Any] | None:
        if after is not None:
            await asyncio.wait([after])
            this = self._next.pop(key)  # it starts now: reviews that come from now on wait for the next one
            self._under_way[key] = this
        async with self._slots:
            return await self.read(*key)

    def _done(self, key: tuple[str, str], done: asyncio.Future[dict[str, Any] | None]) -> None:
        if not done.cancelled():
            done.exception()  # retrieved: each waiter still there has had it raised
        if self._under_way.get(key) is done:
            del self._under_way[key]

    def failed(self, namespace: str, name: str, exc: BaseException) -> None:
        """Logged at most once a minute: a pod review each would flood the log while the API server is slow."""
        now = time.monotonic()
        if now - self._logged_at >= READ_FAILURE_LOG_EVERY:
            self._logged_at = now
            what = "listed but asking for nothing, failed (its pods are held until retried)"
            log.warning("reading StormService %s/%s, %s: %r", namespace, name, what, exc)


class ListedPods:
    def __init__(self, opted_in: OptedInList, read: Callable[[str, str], Awaitable[dict[str, Any] | None]]) -> None:
        self.opted_in = opted_in
        self.stored = StoredServices(read)

    async def judge(self, namespace: str, stormservice: Mapping[str, Any] | None) -> Listed:
        """Whether the policy would hold this pod for nothing: its service, as indexed, asks for no topology
        but is listed (a review forged or replayed at its current version, or an opt-out not unlisted yet).
        Only then is the stored service read (the index may lag a genuine opt-in), once the listing is
        LISTING_SETTLES old: a genuine opt-in's listing is written before its update is stored."""
        if stormservice is None or is_opted_in((stormservice.get("metadata") or {}).get("annotations")):
            return Listed.NOT
        name = str(stormservice["metadata"]["name"])
        since = self.opted_in.listed_since(namespace, name)
        if since is None:
            return Listed.NOT
        wait = since + LISTING_SETTLES - self.opted_in.seen.clock()
        if wait > 0:
            await asyncio.sleep(wait)
        try:
            stored = await self.stored.get(namespace, name)
        except Exception as exc:  # not known: as before, the policy holds the pod until it is retried
            self.stored.failed(namespace, name, exc)
            return Listed.NOT
        if stored is not None and is_opted_in((stored.get("metadata") or {}).get("annotations")):
            return Listed.CATCHING_UP  # a genuine opt-in the index has not seen yet
        return Listed.FOR_NOTHING
