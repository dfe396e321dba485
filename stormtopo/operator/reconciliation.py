"""Level-triggered reconciliation of a StormService's PodGroups: snapshot, plan, execute.

Runs from the work queue for every watch event of a StormService or its RoleSets and on a periodic
resync. The decisions are core.reconciliation's; this only reads the index and executes. The queue
never hands one StormService to two workers at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from stormtopo.core.optin import opted_in_key, split_key
from stormtopo.core.reconciliation import plan_stormservice
from stormtopo.core.writes import ListOptedIn
from stormtopo.kube.client import Api, KubeError
from stormtopo.operator import metrics
from stormtopo.operator.collector import LongLived
from stormtopo.operator.events import Report
from stormtopo.operator.index import Index, Key, key_of
from stormtopo.operator.optin import OptedInList
from stormtopo.operator.writer import execute

log = logging.getLogger("stormtopo.reconcile")


@dataclass
class Reconciler:
    index: Index
    api: Api  # the planned writes are executed through this
    report: Report
    opted_in: OptedInList | None = None  # None: no admission policy to feed (tests of the planner's shell)
    _said: LongLived[Key, str] = field(default_factory=LongLived)  # what was last said of each request (operator/collector.py)
    _invalid: set[Key] = field(default_factory=set)
    _unlisting: set[asyncio.Task[None]] = field(default_factory=set)

    async def reconcile(self, stormservice: Mapping[str, Any]) -> None:
        key = key_of(stormservice)
        plan = plan_stormservice(self.index.snapshot_of(stormservice), self._said.get(key), now=time.time())
        if plan.verdict is None:
            self._said.pop(key, None)
        else:
            self._said[key] = plan.verdict
        if plan.invalid:
            self._invalid.add(key)
        else:
            self._invalid.discard(key)
        metrics.INVALID_REQUESTS.set(len(self._invalid))
        await execute(self.api, plan.all_writes(stormservice), self.report, self.opted_in)

    async def refresh_opted_in(self) -> None:
        """Re-read the opted-in list: every replica's webhook adds to it."""
        if self.opted_in is None:
            return
        try:
            await asyncio.to_thread(self.opted_in.refresh)
        except (KubeError, OSError) as exc:
            log.warning("could not read the opted-in list: %s", exc)
            return
        if not self.index.caught_up:
            return  # before the first complete list, a StormService not known yet is no stale one
        present = {opted_in_key(*key): None for key in self.index.stormservices}
        stale: dict[str, list[str]] = {}
        for key in self.opted_in.stale(present):
            namespace, name = split_key(key)
            stale.setdefault(namespace, []).append(name)
        for namespace, names in stale.items():  # one write per namespace, however many keys it lists
            try:
                await self.opted_in.unlist(namespace, names)
            except (KubeError, OSError) as exc:  # retried at the next resync
                log.warning("could not unlist %d stale StormServices of %s: %s", len(names), namespace, exc)

    def forget(self, key: Key) -> None:
        """A StormService was deleted: drop what was said about it."""
        self._said.pop(key, None)
        self._invalid.discard(key)
        metrics.INVALID_REQUESTS.set(len(self._invalid))
        if self.opted_in is not None:
            task = asyncio.get_running_loop().create_task(execute(self.api, [ListOptedIn(*key, None)], opted_in=self.opted_in))
            self._unlisting.add(task)
            task.add_done_callback(self._unlisting.discard)
