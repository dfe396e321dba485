"""The PodGroup of each gang exact preemption would take a victim of (its queue and priority class, as Volcano
ranks the job), read as the plan asks (core/preempting.py `needs_groups`): a few GETs at a time, at once,
and kept a while, so that a burst of held replicas, or a tenant with many one-pod gangs in a victims'
namespace, costs a bounded number of reads and no more than one round trip per round.

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

from stormtopo.core.preempting import UNREADABLE, VictimGroup, group_of
from stormtopo.core.vocabulary import VOLCANO_SCHEDULING
from stormtopo.kube.client import Api
from stormtopo.kube.errors import Forbidden, KubeError, NotFound

GROUPS_TTL = 10.0  # seconds a gang's PodGroup is reused: its class may change (AIBrix's strategy, stormtopo's roles)
GROUPS_KEPT = 4096  # gangs remembered at most (least recently read go first)
READS_AT_ONCE = 8  # GETs in flight together
ROUND_DEADLINE = 10.0  # seconds one round of reads may take before it counts as no answer


@dataclass
class VictimGroups:
    api: Api
    ttl: float = GROUPS_TTL
    kept: int = GROUPS_KEPT
    _groups: OrderedDict[str, tuple[float, VictimGroup]] = field(default_factory=OrderedDict)  # gang -> (read at, group)

    async def read(self, gangs: Collection[str]) -> dict[str, VictimGroup] | None:
        """Each gang's PodGroup (UNREADABLE: gone or refused); None when the API server did not answer."""
        now = time.monotonic()
        known: dict[str, VictimGroup] = {}
        for gang in gangs:
            kept = self._groups.get(gang)
            if kept is not None and now - kept[0] < self.ttl:
                known[gang] = kept[1]
        missing = sorted(set(gangs) - set(known))
        limit = asyncio.Semaphore(READS_AT_ONCE)

        async def one(gang: str) -> VictimGroup:
            async with limit:
                return await asyncio.to_thread(self._get, gang)

        try:
            read = await asyncio.wait_for(asyncio.gather(*(one(g) for g in missing)), ROUND_DEADLINE)
        except (KubeError, TimeoutError):
            return None
        for gang, group in zip(missing, read, strict=True):
            self._groups[gang] = (now, group)
            self._groups.move_to_end(gang)
        while len(self._groups) > self.kept:
            self._groups.popitem(last=False)
        return known | dict(zip(missing, read, strict=True))

    def _get(self, gang: str) -> VictimGroup:
        namespace, _, name = gang.partition("/")
        try:
            return group_of(self.api.get(VOLCANO_SCHEDULING, "podgroups", namespace, name), time.time())
        except (NotFound, Forbidden):
            return UNREADABLE
