"""The Volcano queue of each gang exact preemption would take a victim of, read from its PodGroup as the plan
asks (core/preempting.py `needs_queues`): a few GETs at a time, at once, and kept a while, so that a burst
of held replicas, or a tenant with many one-pod gangs in a victims' namespace, costs a bounded number of
reads and no more than one round trip per round.

An answer that says the PodGroup is not to be had (gone, or refused) is an answer: its gang is not taken.
Anything else (the API server slow, throttling, a 5xx) is no answer: the plan evicts nothing on a half-read
cluster and is tried again shortly.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Collection
from dataclasses import dataclass, field

from stormtopo.core.preempting import queue_of
from stormtopo.core.vocabulary import VOLCANO_SCHEDULING
from stormtopo.kube.client import Api
from stormtopo.kube.errors import Forbidden, KubeError, NotFound

QUEUES_TTL = 60.0  # seconds a gang's queue is reused: a PodGroup's queue does not change while it runs
QUEUES_KEPT = 4096  # gangs remembered at most (least recently read go first)
READS_AT_ONCE = 8  # GETs in flight together
ROUND_DEADLINE = 10.0  # seconds one round of reads may take before it counts as no answer


@dataclass
class VictimQueues:
    api: Api
    ttl: float = QUEUES_TTL
    kept: int = QUEUES_KEPT
    _queues: OrderedDict[str, tuple[float, str]] = field(default_factory=OrderedDict)  # gang -> (read at, queue; "": none)

    async def read(self, gangs: Collection[str]) -> dict[str, str] | None:
        """Each gang's queue ("": its PodGroup gone or refused); None when the API server did not answer."""
        now = time.monotonic()
        known: dict[str, str] = {}
        for gang in gangs:
            kept = self._queues.get(gang)
            if kept is not None and now - kept[0] < self.ttl:
                known[gang] = kept[1]
        missing = sorted(set(gangs) - set(known))
        limit = asyncio.Semaphore(READS_AT_ONCE)

        async def one(gang: str) -> str:
            async with limit:
                return await asyncio.to_thread(self._get, gang)

        try:
            read = await asyncio.wait_for(asyncio.gather(*(one(g) for g in missing)), ROUND_DEADLINE)
        except (KubeError, TimeoutError):
            return None
        for gang, queue in zip(missing, read, strict=True):
            self._queues[gang] = (now, queue)
            self._queues.move_to_end(gang)
        while len(self._queues) > self.kept:
            self._queues.popitem(last=False)
        return known | dict(zip(missing, read, strict=True))

    def _get(self, gang: str) -> str:
        namespace, _, name = gang.partition("/")
        try:
            return queue_of(self.api.get(VOLCANO_SCHEDULING, "podgroups", namespace, name)) or ""
        except (NotFound, Forbidden):
            return ""
