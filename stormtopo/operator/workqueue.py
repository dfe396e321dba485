"""Keys of objects to reconcile, each at most once in the queue: client-go's workqueue, in small.

Watch handlers only record an object in the index and add its key; a few workers reconcile from the
index. A burst of a thousand StormServices then costs a thousand keys rather than a thousand queued
event bodies and a thousand handlers in flight (that was most of the operator's peak memory), and a
key that changes five times while it waits is reconciled once, with its latest state. A key is never
handled by two workers at once, so reconciliation of one object needs no lock.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

from stormtopo.operator import metrics

log = logging.getLogger("stormtopo.workqueue")
K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    def __init__(
        self, name: str, handle: Callable[[K], Awaitable[None]], workers: int = 4, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.name = name
        self.clock = clock
        self._busy_since: dict[K, float] = {}  # keys being handled -> since when: a wedged worker shows here
        self._handle = handle
        self._workers = workers
        self._queue: asyncio.Queue[K] = asyncio.Queue()
        self._waiting: set[K] = set()  # added and not yet taken by a worker
        self._active: set[K] = set()  # being handled now
        self._tasks: list[asyncio.Task[None]] = []

    def add(self, key: K) -> None:
        if key in self._waiting:
            return
        self._waiting.add(key)
        metrics.QUEUE_DEPTH.labels(self.name).set(len(self._waiting))
        if key not in self._active:  # else it goes back in when its current run ends
            self._queue.put_nowait(key)

    def __len__(self) -> int:
        return len(self._waiting) + len(self._active)

    def stuck(self, hang: float) -> str | None:
        """Why the queue counts as stuck (/healthz): a worker handling one key for longer than `hang` (an
        await that never returns), or a worker task that ended; None while it works."""
        ended = [t for t in self._tasks if t.done()]
        if ended:
            return f"{len(ended)} of its {len(self._tasks)} workers ended"
        now = self.clock()
        wedged = [(key, now - since) for key, since in self._busy_since.items() if now - since > hang]
        if wedged:
            key, seconds = max(wedged, key=lambda kw: kw[1])
            return f"a worker has handled {key} for {seconds:.0f} s (allowed {hang:.0f} s)"
        return None

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._work(), name=f"{self.name} worker {i}") for i in range(self._workers)]

    async def stop(self) -> None:
        """Cancel the workers and wait until they have ended (a key being handled is left to the resync)."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def drained(self) -> None:
        """Wait until nothing is waiting or being handled (for tests)."""
        while len(self):
            await asyncio.sleep(0.05)

    async def _work(self) -> None:
        while True:
            key = await self._queue.get()
            self._waiting.discard(key)
            self._active.add(key)
            self._busy_since[key] = self.clock()
            metrics.QUEUE_DEPTH.labels(self.name).set(len(self._waiting))
            try:
                await self._handle(key)
            except Exception:  # one broken object must not stop the others; the resync retries it
                log.exception("%s: handling %s failed", self.name, key)
            finally:
                self._active.discard(key)
                self._busy_since.pop(key, None)
                if key in self._waiting:
                    self._queue.put_nowait(key)
            # A handler with nothing to do never awaits, and get() does not suspend while keys wait: without
            # this, a resync of 30,000 keys would hold the event loop (webhooks, /healthz) until all are done.
            await asyncio.sleep(0)
