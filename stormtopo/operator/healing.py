"""Healing's shell: every few seconds, for each StormService that opted in and has a replica wider than
its request (or a move under way), read what the planner needs, plan (core/healing.py), execute.

Nothing is read for a service until its own placement record shows a wide replica: a cluster where
every replica landed within its request costs one pass over the index. A service that needs a look
costs one list of its own pods, one of its namespace's PodDisruptionBudgets, and a reading of every
node's free GPUs, taken in the explanation worker's process (so its parsing never delays an admission)
and shared with the explanations for a few seconds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from stormtopo.core.healing import (
    COOLDOWN,
    HealMemory,
    HealPlan,
    HealSnapshot,
    Replica,
    may_need_healing,
    plan_healing,
    plan_refused,
)
from stormtopo.core.vocabulary import ROLESET_LABEL, STORMSERVICE_LABEL
from stormtopo.core.writes import EvictPod, Write
from stormtopo.kube.client import Api, ApiError
from stormtopo.operator import metrics
from stormtopo.operator.events import Report
from stormtopo.operator.explainer import Explainer
from stormtopo.operator.index import Index, Key
from stormtopo.operator.writer import execute

log = logging.getLogger("stormtopo.healing")


@dataclass
class Healer:
    index: Index
    api: Api
    report: Report
    explainer: Explainer  # its worker reads every node's free GPUs
    read_nodes: Callable[[], Awaitable[None]]  # the tree is only as current as the last reading of the nodes
    cooldown: float = COOLDOWN
    leading: Callable[[], bool] = lambda: True
    _memory: dict[Key, HealMemory] = field(default_factory=dict)

    async def check(self) -> None:
        """One pass over the StormServices (a loop of the operator runs it every --heal-interval)."""
        if not self.leading():
            return
        tiers, topology = self.index.cluster_tiers(), self.index.topology()
        for key, stormservice in list(self.index.stormservices.items()):
            if not may_need_healing(stormservice, tiers, topology):
                self._memory.pop(key, None)
                continue
            try:
                await self.heal(key)
            except Exception:  # one service's failure is logged; the others still get their pass
                log.exception("healing %s/%s failed; trying again at the next pass", *key)
        for gone in set(self._memory) - set(self.index.stormservices):
            del self._memory[gone]
        metrics.HEALING_PASSES.inc()

    async def heal(self, key: Key) -> HealPlan | None:
        snapshot = await self.snapshot(key)
        if snapshot is None:
            return None
        memory = self._memory.get(key, HealMemory())
        plan = plan_healing(snapshot, memory)
        self._memory[key] = plan.memory
        for settled in plan.settled:
            if settled.unavailable is not None:
                metrics.MOVE_UNAVAILABLE_SECONDS.observe(settled.unavailable)
        await self.carry_out(key, snapshot, plan)
        return plan

    async def snapshot(self, key: Key) -> HealSnapshot | None:
        if self.index.known_nodes(fresh=False).shapes_tree:  # HyperNodes select nodes by pattern or label
            await self.read_nodes()
        stormservice = self.index.stormservices.get(key)
        if stormservice is None:
            return None
        namespace, name = key
        pods = await asyncio.to_thread(
            self.api.raw_list, f"/api/v1/namespaces/{namespace}/pods", labelSelector=f"{STORMSERVICE_LABEL}={name}"
        )
        budgets = await asyncio.to_thread(self.api.disruption_budgets, namespace)
        free = await self.explainer.free_gpus()
        replicas = tuple(
            Replica(
                roleset, tuple(p for p in pods if (p["metadata"].get("labels") or {}).get(ROLESET_LABEL) == roleset["metadata"]["name"])
            )
            for roleset in self.index.rolesets_of(namespace, name)
        )
        return HealSnapshot(
            stormservice, replicas, self.index.cluster_tiers(), self.index.topology(), free, tuple(budgets), time.time(), self.cooldown
        )

    async def carry_out(self, key: Key, snapshot: HealSnapshot, plan: HealPlan) -> None:
        """The Events and records first, then the evictions in order; the first refused eviction stops
        the move: said, recorded as over, and the replica backs off."""
        first: list[Write] = [w for w in plan.writes if not isinstance(w, EvictPod)]
        await execute(self.api, first, self.report)
        if plan.moving is None:
            return
        metrics.REPLICA_MOVES.labels(str(plan.moving.why)).inc()
        for write in plan.writes:
            if not isinstance(write, EvictPod):
                continue
            try:
                await execute(self.api, [write], self.report)
            except ApiError as exc:
                metrics.EVICTIONS_REFUSED.inc()
                writes, memory = plan_refused(snapshot, plan, write.name, exc.body or str(exc), self._memory.get(key, HealMemory()))
                self._memory[key] = memory
                await execute(self.api, writes, self.report)
                return
