"""Level-triggered reconciliation of a StormService's PodGroups: snapshot, plan, execute.

Runs from the work queue for every watch event of a StormService or its RoleSets and on a periodic
resync. The decisions are core.reconciliation's; this only reads the index and executes. The queue
never hands one StormService to two workers at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from stormtopo.core.reconciliation import plan_stormservice
from stormtopo.operator import metrics
from stormtopo.operator.events import Report
from stormtopo.operator.index import Index, Key, key_of
from stormtopo.operator.writer import execute


@dataclass
class Reconciler:
    index: Index
    report: Report
    _said: dict[Key, str] = field(default_factory=dict)  # what was last said of each request
    _invalid: set[Key] = field(default_factory=set)

    async def stormservice(self, stormservice: Mapping[str, Any]) -> None:
        key = key_of(stormservice)
        plan = plan_stormservice(self.index.snapshot_of(stormservice), self._said.get(key))
        if plan.verdict is None:
            self._said.pop(key, None)
        else:
            self._said[key] = plan.verdict
        if plan.say is not None:
            self.report(stormservice, plan.say.type, plan.say.reason, plan.say.message)
        if plan.invalid:
            self._invalid.add(key)
        else:
            self._invalid.discard(key)
        metrics.INVALID_REQUESTS.set(len(self._invalid))
        await execute(self.index.api, plan.writes)

    def forget(self, key: Key) -> None:
        """A StormService was deleted: drop what was said about it."""
        self._said.pop(key, None)
        self._invalid.discard(key)
        metrics.INVALID_REQUESTS.set(len(self._invalid))
