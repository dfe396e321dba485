"""Where each replica landed, and why one is Pending: Events on the StormService.

Volcano keeps the chosen HyperNode in scheduler memory and says only "network topology not satisfied";
this reads the cluster (HyperNodes, free GPUs, the replica's pods) and says it in domain terms.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from stormtopo.core.placement import allowed_tier, explain
from stormtopo.core.podgroup import REQUEST_ANNOTATION, replica_pods
from stormtopo.core.request import Mode, RequestError, TopologyRequest, parse_request
from stormtopo.core.topology import topology_from_hypernodes
from stormtopo.operator import metrics
from stormtopo.operator.index import Index, Key, key_of

EXPLAIN_INTERVAL = 10.0  # seconds between two capacity checks of one pending gang


def _is_unschedulable(podgroup: Mapping[str, Any]) -> bool:
    status = podgroup.get("status") or {}
    if status.get("phase") not in (None, "Pending", "Inqueue"):
        return False
    return any(c.get("type") == "Unschedulable" and c.get("status") == "True" for c in status.get("conditions") or [])


@dataclass
class PlacementReporter:
    index: Index
    report: Any  # (object, event type, reason, message)
    _checked: dict[Key, float] = field(default_factory=dict)
    _said: dict[Key, str] = field(default_factory=dict)
    _unsatisfiable: set[Key] = field(default_factory=set)

    async def podgroup_changed(self, podgroup: Mapping[str, Any]) -> None:
        if REQUEST_ANNOTATION not in (podgroup["metadata"].get("annotations") or {}):
            return
        phase = (podgroup.get("status") or {}).get("phase")
        if phase == "Running":
            await self._placed(podgroup)
        elif _is_unschedulable(podgroup):
            await self._pending(podgroup)

    async def _context(self, podgroup: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any], TopologyRequest] | None:
        roleset, stormservice = await self.index.owners_of(podgroup)
        if roleset is None or stormservice is None:
            return None
        try:
            request = parse_request(stormservice["metadata"].get("annotations"), self.index.cluster_tiers())
        except RequestError:
            return None
        return (roleset, stormservice, request) if request else None

    def _say_once(self, key: Key, stormservice: Mapping[str, Any], event_type: str, reason: str, message: str) -> None:
        if self._said.get(key) != message:
            self._said[key] = message
            self.report(stormservice, event_type, reason, message)

    async def _pending(self, podgroup: Mapping[str, Any]) -> None:
        key = key_of(podgroup)
        now = time.monotonic()
        if now - self._checked.get(key, 0.0) < EXPLAIN_INTERVAL:
            return
        self._checked[key] = now
        context = await self._context(podgroup)
        if context is None:
            return
        roleset, stormservice, request = context
        if request.mode is not Mode.HARD:
            return  # a soft request never holds a gang back
        free = await asyncio.to_thread(self.index.api.free_gpus)
        topology = topology_from_hypernodes(self.index.hypernodes.values(), free)
        tier = allowed_tier(request, topology)
        if tier is None:
            return
        ok, text = explain(topology, free, replica_pods(roleset.get("spec") or {}), tier)
        if not ok:
            self._unsatisfiable.add(key)
            metrics.PENDING_GANGS.set(len(self._unsatisfiable))
            name = roleset["metadata"]["name"]
            message = (
                f"replica {name} stays Pending: no domain within tier {tier} has room for the whole gang ({request.describe()}); {text}"
            )
            self._say_once(key, stormservice, "Warning", "TopologyUnsatisfiable", message)

    async def _placed(self, podgroup: Mapping[str, Any]) -> None:
        key = key_of(podgroup)
        self._unsatisfiable.discard(key)
        metrics.PENDING_GANGS.set(len(self._unsatisfiable))
        if " placed in " in self._said.get(key, ""):
            return
        context = await self._context(podgroup)
        if context is None:
            return
        _roleset, stormservice, _ = context
        namespace, name = key
        pods = await asyncio.to_thread(self.index.api.pods_of_group, namespace, name)
        nodes = sorted({p.spec.node_name for p in pods if p.spec.node_name})
        if not nodes:
            return
        topology = topology_from_hypernodes(self.index.hypernodes.values(), nodes)
        domain = topology.lowest_common_switch(nodes) if all(n in topology.nodes for n in nodes) else None
        where = f"{domain.name}, tier {domain.tier}" if domain else "no common HyperNode"
        self._say_once(key, stormservice, "Normal", "ReplicaPlaced", f"replica {name} placed in {where} on {', '.join(nodes)}")
        if domain:
            metrics.REPLICAS_BY_TIER.labels(str(domain.tier)).inc()
