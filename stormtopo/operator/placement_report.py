"""The placement path's shell: for a replica whose pods or PodGroup changed, read its snapshot, call the
planner (core/replica.py), execute what it returns.

Volcano keeps the chosen HyperNode in scheduler memory and says only "network topology not satisfied";
the planner says it in domain terms. Explanations (every node's free GPUs, a packing search) run in a
queue and a worker process of their own, so a release never waits behind one.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace

from stormtopo.core.replica import Explain, ReplicaMemory, ReplicaPlan, ReplicaSnapshot, plan_explained, plan_replica
from stormtopo.core.topology.tree import Topology
from stormtopo.operator import metrics
from stormtopo.operator.events import Report
from stormtopo.operator.explainer import Explainer
from stormtopo.operator.index import Index, Key, slim
from stormtopo.operator.workqueue import WorkQueue
from stormtopo.operator.writer import execute

NODES_TTL = 30.0  # seconds a reading of every node's labels is reused for the switch tree


@dataclass
class PlacementReporter:
    index: Index
    report: Report
    explainer: Explainer
    _memory: dict[Key, ReplicaMemory] = field(default_factory=dict)
    _asks: dict[Key, tuple[Explain, Topology]] = field(default_factory=dict)  # explanations waiting for the worker
    _explanations: WorkQueue[Key] | None = None

    async def replica_changed(self, key: Key) -> None:
        """From the placements queue, a few replicas at a time: a pod of replica `key` (namespace,
        RoleSet) was admitted, bound or deleted, or its PodGroup changed."""
        snapshot = await self._snapshot(key)
        if snapshot is None:
            return
        plan = plan_replica(snapshot, self._memory.get(key, ReplicaMemory()))
        if plan.needs_all_pods:  # anchors created before the opt-in were never admitted: read them all
            pods = await asyncio.to_thread(self.index.api.pods_of_group, *key)
            snapshot = replace(snapshot, pods=tuple(slim(p) for p in pods), all_pods=True)
            plan = plan_replica(snapshot, self._memory.get(key, ReplicaMemory()))
        await self._carry_out(key, snapshot, plan)
        if plan.explain is not None:
            self._asks[key] = (plan.explain, snapshot.topology)
            self._explanation_queue().add(key)

    async def _snapshot(self, key: Key) -> ReplicaSnapshot | None:
        if time.monotonic() - self.index.nodes_read_at > NODES_TTL:
            read_at = time.monotonic()
            self.index.set_nodes(await asyncio.to_thread(self.index.api.node_labels), read_at)
        return self.index.replica_snapshot(key, time.monotonic())

    async def _carry_out(self, key: Key, snapshot: ReplicaSnapshot, plan: ReplicaPlan) -> None:
        self._remember(key, plan.memory)
        for say in plan.says:
            self.report(snapshot.stormservice, say.type, say.reason, say.message)
        metrics.TOPOLOGY_VIOLATIONS.inc(plan.violations)
        await execute(self.index.api, plan.writes)
        if plan.first is not None:
            if plan.first.tier is not None:
                metrics.REPLICAS_BY_TIER.labels(str(plan.first.tier)).inc()
            if plan.first.seconds is not None:
                metrics.PLACEMENT_SECONDS.observe(plan.first.seconds)

    def _remember(self, key: Key, memory: ReplicaMemory) -> None:
        was = self._memory.get(key, ReplicaMemory()).unsatisfiable
        self._memory[key] = memory
        if was != memory.unsatisfiable:
            metrics.PENDING_GANGS.set(sum(m.unsatisfiable for m in self._memory.values()))

    def _explanation_queue(self) -> WorkQueue[Key]:
        if self._explanations is None:
            # One worker: explanations queue behind each other (the worker process takes one at a time).
            self._explanations = WorkQueue("explanations", self._explain, workers=1)
            self._explanations.start()
        return self._explanations

    async def _explain(self, key: Key) -> None:
        ask = self._asks.pop(key, None)
        if ask is None:
            return  # forgotten meanwhile
        explain, topology = ask
        pending = await self.explainer.explain(explain.request, explain.pods, explain.created, topology)
        if key not in self._memory:
            return  # the replica was deleted while it was explained
        plan = plan_explained(key, explain.request, pending, self._memory[key], time.monotonic())
        snapshot = self.index.replica_snapshot(key, time.monotonic())
        if snapshot is not None:
            await self._carry_out(key, snapshot, plan)

    def forget(self, key: Key) -> None:
        """A replica was deleted: drop what was said and checked about it."""
        self._asks.pop(key, None)
        self._remember(key, ReplicaMemory())
        del self._memory[key]
