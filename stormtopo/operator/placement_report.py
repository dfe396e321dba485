"""Where each replica landed, and why one is Pending: Events on the StormService.

Volcano keeps the chosen HyperNode in scheduler memory and says only "network topology not satisfied";
this reads the cluster (HyperNodes, free GPUs, the replica's pods) and says it in domain terms.
"""

from __future__ import annotations

import asyncio
import datetime
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from stormtopo.core.placement import allowed_tier, domain_labels, explain, merge_placements, placement_record, recorded_placement
from stormtopo.core.podgroup import replica_pods
from stormtopo.core.request import Mode, RequestError, TopologyRequest, parse_request
from stormtopo.core.topology.hypernodes import topology_from_hypernodes
from stormtopo.core.vocabulary import AIBRIX, PLACEMENT_ANNOTATION, REQUEST_ANNOTATION
from stormtopo.kube.client import ApiError
from stormtopo.operator import metrics
from stormtopo.operator.events import Report
from stormtopo.operator.index import Index, Key, key_of

EXPLAIN_INTERVAL = 10.0  # seconds between two capacity checks of one pending gang
FREE_GPUS_TTL = 5.0  # seconds a reading of every node's free GPUs is reused


def _is_unschedulable(podgroup: Mapping[str, Any]) -> bool:
    status = podgroup.get("status") or {}
    if status.get("phase") not in (None, "Pending", "Inqueue"):
        return False
    return any(c.get("type") == "Unschedulable" and c.get("status") == "True" for c in status.get("conditions") or [])


@dataclass
class PlacementReporter:
    index: Index
    report: Report
    _checked: dict[Key, float] = field(default_factory=dict)
    _said: dict[Key, str] = field(default_factory=dict)
    _reported_placed: set[Key] = field(default_factory=set)  # replicas whose placement is reported or was recorded before
    _unsatisfiable: set[Key] = field(default_factory=set)
    _free: tuple[float, dict[str, int]] = (0.0, {})
    _free_read: asyncio.Lock = field(default_factory=asyncio.Lock)  # one reading shared by the gangs waiting for it

    async def _free_gpus(self) -> dict[str, int]:
        """Free GPUs per node, read at most every few seconds however many gangs are pending."""
        async with self._free_read:
            read_at, free = self._free
            if time.monotonic() - read_at > FREE_GPUS_TTL:
                free = await asyncio.to_thread(self.index.api.free_gpus)
                self._free = (time.monotonic(), free)
            return free

    async def podgroup_changed(self, podgroup: Mapping[str, Any]) -> None:
        """Called from the placement work queue, a few PodGroups at a time (each reads pods and writes labels)."""
        if REQUEST_ANNOTATION not in (podgroup["metadata"].get("annotations") or {}):
            return
        phase = (podgroup.get("status") or {}).get("phase")
        if phase == "Running":
            if key_of(podgroup) in self._reported_placed:
                return  # said already: no API reads for the status updates that follow
            await self._placed(podgroup)
        elif _is_unschedulable(podgroup):
            await self._pending(podgroup)

    def forget(self, key: Key) -> None:
        """A PodGroup was deleted: drop what was said and checked about it."""
        self._said.pop(key, None)
        self._reported_placed.discard(key)
        self._checked.pop(key, None)
        if key in self._unsatisfiable:
            self._unsatisfiable.discard(key)
            metrics.PENDING_GANGS.set(len(self._unsatisfiable))

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
        wanted = replica_pods(roleset.get("spec") or {})
        if len(await asyncio.to_thread(self.index.api.pods_of_group, *key)) < len(wanted):
            return  # Volcano reports a gang unschedulable while AIBrix is still creating its pods
        free = await self._free_gpus()
        topology = topology_from_hypernodes(self.index.hypernodes.values(), free)
        tier = allowed_tier(request, topology)
        if tier is None:
            return
        ok, text = explain(topology, free, wanted, tier)
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
        if key in self._reported_placed:
            return
        context = await self._context(podgroup)
        if context is None:
            return
        _roleset, stormservice, _ = context
        namespace, name = key
        if recorded_placement((stormservice["metadata"].get("annotations") or {}).get(PLACEMENT_ANNOTATION), name) is not None:
            self._reported_placed.add(key)  # reported before a restart or a change of leader: bound pods never move
            return
        pods = await asyncio.to_thread(self.index.api.pods_of_group, namespace, name)
        nodes = sorted(p["spec"]["nodeName"] for p in pods if p["spec"].get("nodeName"))
        if not nodes:
            return
        topology = topology_from_hypernodes(self.index.hypernodes.values(), nodes)
        record = placement_record(topology, nodes)
        where = f"{record['hyperNode']}, tier {record['tier']}" if record["hyperNode"] else "no common HyperNode"
        self._say_once(key, stormservice, "Normal", "ReplicaPlaced", f"replica {name} placed in {where} on {', '.join(sorted(set(nodes)))}")
        if record["tier"] is not None:
            metrics.REPLICAS_BY_TIER.labels(str(record["tier"])).inc()
        seconds = _placement_seconds(pods)
        if seconds is not None:
            metrics.PLACEMENT_SECONDS.observe(seconds)
        for pod in pods:  # domain labels, so a router can pair prefill and decode within a domain
            wanted = domain_labels(topology, pod["spec"].get("nodeName") or "")
            if wanted and any((pod["metadata"].get("labels") or {}).get(k) != v for k, v in wanted.items()):
                await asyncio.to_thread(self.index.api.label_pod, namespace, pod["metadata"]["name"], wanted)
        live = [r["metadata"]["name"] for r in self.index.rolesets_of(*key_of(stormservice))]  # read on the loop, not the thread
        await asyncio.to_thread(self._record, stormservice, name, record, live)
        self._reported_placed.add(key)

    def _record(self, stormservice: Mapping[str, Any], replica: str, record: Mapping[str, object], live: list[str]) -> None:
        """Set the replica's record in the StormService's placement annotation. Two replicas of one
        StormService are placed concurrently: each write is conditional on the version it merged
        into, and a conflict re-reads and merges again, so neither record overwrites the other."""
        namespace, name = key_of(stormservice)
        current: Mapping[str, Any] | None = stormservice
        for _ in range(5):
            if current is None:
                return  # deleted meanwhile
            meta = current["metadata"]
            recorded = (meta.get("annotations") or {}).get(PLACEMENT_ANNOTATION)
            value = merge_placements(recorded, replica, record, live)
            if value == recorded:
                return
            try:
                self.index.api.annotate_stormservice(namespace, name, PLACEMENT_ANNOTATION, value, meta.get("resourceVersion"))
                return
            except ApiError as exc:
                if exc.status != 409:
                    raise
            current = self.index.api.get(AIBRIX, "stormservices", namespace, name)


def _placement_seconds(pods: list[dict[str, Any]]) -> float | None:
    """From the first pod's creation to the last pod's binding (PodScheduled), in seconds."""
    created = [t for p in pods if (t := _time(p["metadata"].get("creationTimestamp")))]
    bound = [
        t
        for p in pods
        for c in (p.get("status") or {}).get("conditions") or []
        if c.get("type") == "PodScheduled" and c.get("status") == "True" and (t := _time(c.get("lastTransitionTime")))
    ]
    if not pods or len(created) < len(pods) or len(bound) < len(pods):
        return None
    return max(0.0, (max(bound) - min(created)).total_seconds())


def _time(text: str | None) -> datetime.datetime | None:
    return datetime.datetime.fromisoformat(text) if text else None
