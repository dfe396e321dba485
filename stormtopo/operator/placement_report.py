"""Where each replica landed, whether it keeps to its request, and why one is Pending: Events on the
StormService, the placement record, and domain labels on its pods.

Volcano keeps the chosen HyperNode in scheduler memory and says only "network topology not satisfied";
this reads the index (the replica's pods, from a watch of the pods stormtopo admitted; HyperNodes) and
says it in domain terms. It runs for every change of a replica's pods, for as long as the replica
lives: a replacement pod gets its domain labels, and a pod bound outside the tier is reported.
"""

from __future__ import annotations

import asyncio
import datetime
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stormtopo.core.admission import valid_request
from stormtopo.core.explanation import allowed_tier, is_explainable
from stormtopo.core.gang import followers, gang_of, replica_pods
from stormtopo.core.placement import EMPTY_TOPOLOGY, is_held, is_live, merge_placements, plan_placed, plan_release, recorded_placement
from stormtopo.core.request import TopologyRequest, is_opted_in
from stormtopo.core.topology.hypernodes import selects_by_label, topology_from_hypernodes
from stormtopo.core.topology.tree import Topology
from stormtopo.core.vocabulary import AIBRIX, PLACEMENT_ANNOTATION, ROLE_LABEL
from stormtopo.core.writes import Say
from stormtopo.kube.client import ApiError
from stormtopo.operator import metrics
from stormtopo.operator.events import Report
from stormtopo.operator.explainer import NODE_LABELS_TTL, Explainer
from stormtopo.operator.index import Index, Key, key_of, service_key_of
from stormtopo.operator.writer import execute

# Seconds between two capacity checks of one pending gang; doubled while its explanation stays the
# same (a gang pending for an hour is explained about every EXPLAIN_INTERVAL_MAX, not 360 times).
EXPLAIN_INTERVAL = 10.0
EXPLAIN_INTERVAL_MAX = 160.0


def is_unschedulable(podgroup: Mapping[str, Any] | None) -> bool:
    status = (podgroup or {}).get("status") or {}
    if status.get("phase") not in (None, "Pending", "Inqueue"):
        return False
    return any(c.get("type") == "Unschedulable" and c.get("status") == "True" for c in status.get("conditions") or [])


@dataclass
class PlacementReporter:
    index: Index
    report: Report
    explainer: Explainer
    _next_check: dict[Key, tuple[float, float]] = field(default_factory=dict)  # replica -> (when, interval)
    _said: dict[tuple[Key, str], str] = field(default_factory=dict)  # (replica, reason) -> message
    _unsatisfiable: set[Key] = field(default_factory=set)
    _labels: tuple[float, dict[str, dict[str, str]]] = (0.0, {})

    async def _topology(self, nodes: Iterable[str]) -> Topology:
        """The tree the HyperNodes describe. Node labels are read (at most every NODE_LABELS_TTL) only
        when a HyperNode selects its nodes by label."""
        hypernodes = self.index.hypernodes.values()
        if not selects_by_label(hypernodes):
            return topology_from_hypernodes(hypernodes, nodes)
        read_at, labels = self._labels
        if time.monotonic() - read_at > NODE_LABELS_TTL:
            labels = await asyncio.to_thread(self.index.api.node_labels)
            self._labels = (time.monotonic(), labels)
        return topology_from_hypernodes(hypernodes, labels)

    async def replica_changed(self, key: Key) -> None:
        """From the placements queue, a few replicas at a time: a pod of replica `key` (namespace,
        RoleSet) was admitted, bound or deleted, or its PodGroup changed."""
        roleset = self.index.rolesets.get(key)
        stormservice = self.index.stormservices.get(service_key_of(roleset)) if roleset else None
        if roleset is None or stormservice is None:
            return
        pods = [p for p in self.index.pods_of(*key) if is_live(p)]
        held = [p for p in pods if is_held(p)]
        if held:
            await self._release(roleset, stormservice, pods, held)
        request = valid_request(stormservice, self.index.cluster_tiers())
        if request is None:  # opted out, or invalid: nothing to explain, so not counted as unsatisfiable
            self._settle(key)
            return
        wanted = replica_pods(roleset.get("spec") or {})
        bound = [p for p in pods if p["spec"].get("nodeName")]
        if bound:
            await self._placed(key, stormservice, request, bound, complete=len(bound) >= len(wanted))
        if len(bound) >= len(wanted):
            self._settle(key)
        elif is_unschedulable(self.index.podgroups.get(key)):
            await self._pending(key, roleset, stormservice, request, wanted, len(pods))

    async def _release(
        self,
        roleset: Mapping[str, Any],
        stormservice: Mapping[str, Any],
        pods: Sequence[Mapping[str, Any]],
        held: Sequence[Mapping[str, Any]],
    ) -> None:
        """Release pods held at stormtopo's gate: into their anchors' domain once those are bound (the
        request valid, or invalid and its last valid constraint kept), or at once when the StormService
        no longer asks for a topology."""
        if not is_opted_in((stormservice["metadata"].get("annotations")) or {}):
            await execute(self.index.api, plan_release(EMPTY_TOPOLOGY, [], 0, held))
            return
        following = followers(roleset.get("spec") or {})
        anchors = [p for p in pods if (p["metadata"].get("labels") or {}).get(ROLE_LABEL) not in following]
        topology = await self._topology([p["spec"].get("nodeName") or "" for p in anchors])
        expected = gang_of(roleset.get("spec") or {}, following).min_member
        await execute(self.index.api, plan_release(topology, anchors, expected, held))

    def forget(self, key: Key) -> None:
        """A replica was deleted: drop what was said and checked about it."""
        for said in [k for k in self._said if k[0] == key]:
            del self._said[said]
        self._next_check.pop(key, None)
        self._settle(key)

    def _settle(self, key: Key) -> None:
        if key in self._unsatisfiable:
            self._unsatisfiable.discard(key)
            metrics.PENDING_GANGS.set(len(self._unsatisfiable))

    def _say(self, key: Key, stormservice: Mapping[str, Any], say: Say) -> bool:
        """Post an Event, once per message and replica: the same check repeats with every pod event."""
        if self._said.get((key, say.reason)) == say.message:
            return False
        self._said[(key, say.reason)] = say.message
        self.report(stormservice, say.type, say.reason, say.message)
        return True

    async def _pending(
        self,
        key: Key,
        roleset: Mapping[str, Any],
        stormservice: Mapping[str, Any],
        request: TopologyRequest,
        wanted: list[int],
        created: int,
    ) -> None:
        now = time.monotonic()
        when, interval = self._next_check.get(key, (0.0, EXPLAIN_INTERVAL))
        if now < when or not is_explainable(request, wanted, created):
            return  # (AIBrix still creating its pods: no cluster-wide read of free GPUs for nothing)
        self._next_check[key] = (now + EXPLAIN_INTERVAL, EXPLAIN_INTERVAL)
        pending = await self.explainer.explain(request, wanted, created, list(self.index.hypernodes.values()))
        if pending is None:
            return
        if pending.explanation.fits:  # room again: Volcano binds it at its next session
            self._settle(key)
            return
        self._unsatisfiable.add(key)
        metrics.PENDING_GANGS.set(len(self._unsatisfiable))
        message = (
            f"replica {key[1]} stays Pending: no domain within tier {pending.tier} has room for the whole gang "
            f"({request.describe()}); {pending.explanation.render()}"
        )
        if not self._say(key, stormservice, Say("Warning", "TopologyUnsatisfiable", message)):
            interval = min(2 * interval, EXPLAIN_INTERVAL_MAX)  # nothing changed: look again later
            self._next_check[key] = (time.monotonic() + interval, interval)

    async def _placed(
        self, key: Key, stormservice: Mapping[str, Any], request: TopologyRequest, bound: Sequence[Mapping[str, Any]], complete: bool
    ) -> None:
        topology = await self._topology([p["spec"]["nodeName"] for p in bound])
        placed = plan_placed(topology, request, allowed_tier(request, topology), key[1], bound)
        if placed is None:
            return
        recorded = recorded_placement((stormservice["metadata"].get("annotations") or {}).get(PLACEMENT_ANNOTATION), key[1])
        for say in placed.says:
            if say.reason == "ReplicaPlaced" and (not complete or recorded == placed.record):
                continue  # said once the whole replica is bound, and not again after a restart
            if self._say(key, stormservice, say) and say.reason == "TopologyViolated":
                metrics.TOPOLOGY_VIOLATIONS.inc()
        await execute(self.index.api, placed.labels)  # domain labels, so a router can pair prefill and decode within a domain
        if not complete or recorded == placed.record:
            return
        if recorded is None:
            if isinstance(placed.record["tier"], int):
                metrics.REPLICAS_BY_TIER.labels(str(placed.record["tier"])).inc()
            seconds = _placement_seconds(bound)
            if seconds is not None:
                metrics.PLACEMENT_SECONDS.observe(seconds)
        live = [r["metadata"]["name"] for r in self.index.rolesets_of(*key_of(stormservice))]  # read on the loop, not the thread
        await asyncio.to_thread(self._record, stormservice, key[1], placed.record, live)

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


def _placement_seconds(pods: Sequence[Mapping[str, Any]]) -> float | None:
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
