"""Level-triggered reconciliation of a StormService's replica PodGroups.

Runs from the work queue for every watch event of a StormService or its RoleSets and on a periodic
resync; it reads from the index and writes only when the cluster differs from what it should be, so
it is idempotent across operator restarts (no duplicates, no orphans: owned PodGroups carry owner
references). The queue never hands one StormService to two workers at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from stormtopo.core.podgroup import (
    desired_fields,
    has_scheduling_strategy,
    owned_podgroup,
    service_group_name,
    service_podgroup,
    spec_patch,
)
from stormtopo.core.request import RequestError, Scope, TopologyRequest, parse_request
from stormtopo.core.vocabulary import REQUEST_ANNOTATION
from stormtopo.operator import metrics
from stormtopo.operator.events import Report
from stormtopo.operator.index import Index, Key, key_of


@dataclass
class Reconciler:
    index: Index
    report: Report
    _reported: dict[Key, str] = field(default_factory=dict)

    @property
    def podgroups(self) -> dict[Key, dict[str, Any]]:
        return self.index.podgroups

    def rolesets_of(self, stormservice: Mapping[str, Any]) -> list[dict[str, Any]]:
        return self.index.rolesets_of(*key_of(stormservice))

    def request_for(self, stormservice: Mapping[str, Any]) -> TopologyRequest | RequestError | None:
        annotations = stormservice["metadata"].get("annotations") or {}
        try:
            return parse_request(annotations, self.index.cluster_tiers())
        except RequestError as exc:
            return exc

    async def stormservice(self, stormservice: Mapping[str, Any]) -> None:
        key = key_of(stormservice)
        request = self.request_for(stormservice)
        self._report_request(stormservice, request)
        if isinstance(request, RequestError):
            return  # bad input changes nothing; the Warning Event says why
        if request is not None and request.scope is Scope.STORMSERVICE:
            await self._service_group(stormservice, request)
            return
        await self._withdraw(self.podgroups.get((key[0], service_group_name(key[1]))))
        for roleset in self.rolesets_of(stormservice):
            await self._roleset(roleset, request)

    def forget(self, key: Key) -> None:
        """A StormService was deleted: drop what was said about it."""
        self._reported.pop(key, None)
        metrics.INVALID_REQUESTS.set(sum(1 for t in self._reported.values() if t.startswith("invalid")))

    def _report_request(self, stormservice: Mapping[str, Any], request: TopologyRequest | RequestError | None) -> None:
        key = key_of(stormservice)
        if isinstance(request, RequestError):
            text = f"invalid network-topology request, nothing changed: {request}"
            if self._reported.get(key) != text:
                self.report(stormservice, "Warning", "InvalidTopologyRequest", text)
                self._reported[key] = text
        elif request is not None:
            text = f"network-topology request accepted: {request.describe()}"
            if self._reported.get(key) != text:
                self.report(stormservice, "Normal", "TopologyRequest", text)
                self._reported[key] = text
        else:
            self._reported.pop(key, None)
        metrics.INVALID_REQUESTS.set(sum(1 for t in self._reported.values() if t.startswith("invalid")))

    async def _service_group(self, stormservice: Mapping[str, Any], request: TopologyRequest) -> None:
        desired = service_podgroup(stormservice, request)
        namespace, name = desired["metadata"]["namespace"], desired["metadata"]["name"]
        current = self.podgroups.get((namespace, name))
        if current is None:
            if await asyncio.to_thread(self.index.api.create_podgroup, desired):
                metrics.PODGROUP_WRITES.labels("create").inc()
            return
        ops = spec_patch(current.get("spec"), {k: v for k, v in desired["spec"].items() if k != "queue"})
        if ops:
            await asyncio.to_thread(self.index.api.patch_podgroup, namespace, name, ops)
            metrics.PODGROUP_WRITES.labels("patch").inc()

    async def _roleset(self, roleset: Mapping[str, Any], request: TopologyRequest | None) -> None:
        namespace, name = key_of(roleset)
        current = self.podgroups.get((namespace, name))
        spec = roleset.get("spec") or {}
        if request is None:
            await self._withdraw(current)
            return
        if current is None:
            if not has_scheduling_strategy(spec):
                created = await asyncio.to_thread(self.index.api.create_podgroup, owned_podgroup(roleset, request))
                if created:
                    metrics.PODGROUP_WRITES.labels("create").inc()
            return  # AIBrix creates its own; the webhook gives it the constraint at creation
        ops = spec_patch(current.get("spec"), desired_fields(request, spec))
        if ops:
            await asyncio.to_thread(self.index.api.patch_podgroup, namespace, name, ops)
            metrics.PODGROUP_WRITES.labels("patch").inc()

    async def _withdraw(self, podgroup: Mapping[str, Any] | None) -> None:
        """The StormService no longer asks for a topology: take the constraint off its PodGroups."""
        if podgroup is None:
            return
        annotations = podgroup["metadata"].get("annotations") or {}
        if REQUEST_ANNOTATION not in annotations:
            return
        ops: list[dict[str, Any]] = [{"op": "remove", "path": "/metadata/annotations/" + REQUEST_ANNOTATION.replace("/", "~1")}]
        if "networkTopology" in (podgroup.get("spec") or {}):
            ops.append({"op": "remove", "path": "/spec/networkTopology"})
        namespace, name = key_of(podgroup)
        await asyncio.to_thread(self.index.api.patch_podgroup, namespace, name, ops)
        metrics.PODGROUP_WRITES.labels("patch").inc()
