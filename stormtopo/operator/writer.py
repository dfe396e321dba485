"""Executes the writes a planner decided, through the API client, counting each in the metrics."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from stormtopo.core.placement import merge_placements
from stormtopo.core.preempting import pick_victims
from stormtopo.core.topology.node_tier import exact_name
from stormtopo.core.vocabulary import AIBRIX, MOVES_ANNOTATION, NODE_TIER_LABEL, PLACEMENT_ANNOTATION, VOLCANO_TOPOLOGY
from stormtopo.core.writes import (
    AdoptPod,
    CreateHyperNode,
    CreatePodGroup,
    DeleteHyperNode,
    DeleteUnboundPod,
    EvictPod,
    LabelPod,
    ListOptedIn,
    PatchPod,
    PatchPodGroup,
    PostEvent,
    PreemptPods,
    RecordMove,
    RecordPlacement,
    SetHyperNodeMembers,
    Write,
)
from stormtopo.kube.client import Api, ApiError, Conflict, Forbidden, Invalid, KubeError, NotFound
from stormtopo.operator import metrics
from stormtopo.operator.events import Report
from stormtopo.operator.optin import OptedInList

log = logging.getLogger("stormtopo.writer")
RECORD_ATTEMPTS = 5  # conflicting writers of one StormService's placement annotation, re-read and merged each time


async def execute(api: Api, writes: Iterable[Write], report: Report | None = None, opted_in: OptedInList | None = None) -> None:
    """Carry out what a planner decided, in order: Events through `report` (queued, never blocking),
    listings through `opted_in` (none: no admission policy to feed), the rest through the API."""
    for write in writes:
        match write:
            case PostEvent(about, say):
                if report is not None:
                    report(about, say.type, say.reason, say.message)
            case ListOptedIn(namespace, stormservice, scope):
                if opted_in is None:
                    continue
                try:
                    await opted_in.record(namespace, stormservice, scope)
                except (KubeError, OSError) as exc:  # retried at the next resync; the PodGroups go on
                    log.warning("could not update the opted-in list for %s/%s: %s", namespace, stormservice, exc)
            case CreatePodGroup(body):
                if await asyncio.to_thread(api.create_podgroup, dict(body)):
                    metrics.PODGROUP_WRITES.labels("create").inc()
            case PatchPodGroup(namespace, name, ops):
                await asyncio.to_thread(api.patch_podgroup, namespace, name, [dict(op) for op in ops])
                metrics.PODGROUP_WRITES.labels("patch").inc()
            case LabelPod(namespace, name, labels):
                await asyncio.to_thread(api.label_pod, namespace, name, dict(labels))
            case PatchPod(namespace, name, ops):
                try:
                    await asyncio.to_thread(api.patch_pod, namespace, name, [dict(op) for op in ops])
                except NotFound:
                    continue  # gone
                except Invalid as exc:
                    # Released already (its "test" op failed), or a patch the API server refuses: say which.
                    log.warning("pod %s/%s not patched: %s", namespace, name, exc)
            case AdoptPod(namespace, name, labels, annotations):
                try:
                    await asyncio.to_thread(api.patch_pod_metadata, namespace, name, dict(labels), dict(annotations))
                except NotFound:
                    continue  # gone meanwhile
            case RecordPlacement():
                await asyncio.to_thread(record_placement, api, write)
            case RecordMove():
                await asyncio.to_thread(record_placement, api, write, MOVES_ANNOTATION)
            case EvictPod(namespace, name, uid):
                try:
                    await asyncio.to_thread(api.evict_pod, namespace, name, uid)
                except (NotFound, Conflict):
                    continue  # gone already, or replaced by a pod of the same name: as good as evicted
                metrics.EVICTIONS.inc()
            case PreemptPods():
                await _preempt(api, write)
            case DeleteUnboundPod(namespace, name, resource_version):
                try:
                    await asyncio.to_thread(_delete_unbound, api, namespace, name, resource_version)
                except (Forbidden, Invalid) as exc:
                    log.warning("pod %s/%s not deleted to be held again (refused): %s", namespace, name, exc)
            case CreateHyperNode():
                await _create_ours(api, write)
            case SetHyperNodeMembers(name, members, resource_version):
                try:
                    await asyncio.to_thread(api.set_hypernode_members, name, [dict(m) for m in members], resource_version)
                except NotFound:
                    continue  # deleted meanwhile: the next pass plans without it
                metrics.NODE_TIER_WRITES.labels("update").inc()
            case DeleteHyperNode(name, resource_version):
                try:
                    if await asyncio.to_thread(api.delete_hypernode, name, resource_version):
                        metrics.NODE_TIER_WRITES.labels("delete").inc()
                except Conflict:
                    log.info("HyperNode %s changed since it was read: not deleted, planned again at the next pass", name)


async def _preempt(api: Api, write: PreemptPods) -> None:
    """Evict the planned victims: the pods on their nodes read now (a node at a time, selected on the
    server), matched by GPUs, priority and gang (core/preempting.py pick_victims). A refusal (a disruption
    budget, a policy) or an error is logged and the rest go on; nothing here stops the replica's release,
    which comes next: Volcano's own preemption takes what is still missing."""
    pods_on: dict[str, list[dict[str, Any]]] = {}
    try:
        for node in sorted({v.node for v in write.victims}):
            pods_on[node] = await asyncio.to_thread(api.raw_list, "/api/v1/pods", fieldSelector=f"spec.nodeName={node}")
    except (KubeError, OSError) as exc:
        log.warning(
            "no victims preempted for replica %s/%s: the pods of their nodes could not be read: %s", write.namespace, write.replica, exc
        )
        return
    for evict in pick_victims(write.victims, pods_on, write.namespaces):
        try:
            await asyncio.to_thread(api.evict_pod, evict.namespace, evict.name, evict.uid)
        except (NotFound, Conflict):
            continue  # gone already, or replaced by another pod of that name
        except (KubeError, OSError) as exc:
            log.warning("pod %s/%s not preempted for replica %s/%s: %s", evict.namespace, evict.name, write.namespace, write.replica, exc)
            continue
        metrics.PREEMPTIONS.inc()


def _delete_unbound(api: Api, namespace: str, name: str, resource_version: str, tries: int = 3) -> None:
    """Delete the pod at the version read; on a Conflict (Volcano rewrites a waiting pod's status at each
    of its tries) read it again, and delete it at that version while it is still unbound."""
    for _ in range(tries):
        try:
            api.delete_unbound_pod(namespace, name, resource_version)
            return
        except NotFound:
            return  # gone already
        except Conflict:
            try:
                pod = api.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
            except NotFound:
                return
            if (pod.get("spec") or {}).get("nodeName"):
                return  # bound meanwhile: it stays
            resource_version = str(pod["metadata"]["resourceVersion"])
    raise RuntimeError(f"pod {namespace}/{name} not deleted to be held again: it changed at each of {tries} tries")


class HyperNodeWritesRefused(RuntimeError):
    """Some of a pass's HyperNode writes were refused; the others were carried out. `refusals`: per
    refused write, (HyperNode, what was refused: verb and status, the API server's words)."""

    def __init__(self, message: str, refusals: Sequence[tuple[str, str, str]] = ()) -> None:
        super().__init__(message)
        self.refusals = tuple(refusals)


async def execute_hypernode_writes(api: Api, writes: Sequence[Write]) -> None:
    """The node tier's writes, each on its own: one refused (Volcano's webhook down, a policy, RBAC) is
    counted and the others go on, so one leaf's refusal does not hold up the rest. A leaf changed by
    another writer since the plan read it (Conflict) is left as they made it and planned again. While a
    leaf's write failed, no tier-0 HyperNode is deleted (the leaf may still name it; the next pass plans
    the deletes again). Raises HyperNodeWritesRefused once all were tried, for the loop to record."""
    refused: list[str] = []
    refusals: list[tuple[str, str, str]] = []
    leaf_failed = False
    missing: set[str] = set()  # tier-0 HyperNodes whose create failed: no leaf is pointed at them
    for write in writes:
        if isinstance(write, DeleteHyperNode) and leaf_failed:
            continue
        if isinstance(write, SetHyperNodeMembers) and missing & {exact_name(m) for m in write.members if m.get("type") == "HyperNode"}:
            leaf_failed = True
            continue
        try:
            if isinstance(write, CreateHyperNode):
                if not await _create_ours(api, write):
                    missing.add(_hypernode_name(write))
                    why = "a HyperNode of that name exists and is not the node tier's"
                    refused.append(f"create {_hypernode_name(write)}: {why}")
                    refusals.append((_hypernode_name(write), "create (exists)", why))
                continue
            await execute(api, [write])
        except Conflict:
            leaf_failed = True
            log.info("HyperNode %s changed meanwhile (another writer): planned again from what it is now", getattr(write, "name", "?"))
        except (ApiError, KubeError, OSError) as exc:
            leaf_failed = leaf_failed or isinstance(write, SetHyperNodeMembers)
            if isinstance(write, CreateHyperNode):
                missing.add(_hypernode_name(write))
            verb = _HYPERNODE_VERBS[type(write)]
            metrics.NODE_TIER_WRITES_REFUSED.labels(verb).inc()
            refused.append(f"{verb} {_hypernode_name(write)}: {exc}")
            if isinstance(exc, ApiError) and exc.refusal:  # refused, not unavailable
                refusals.append((_hypernode_name(write), f"{verb} ({exc.status})", str(exc)[:300]))
    if refused:
        more = f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""
        raise HyperNodeWritesRefused(f"{len(refused)} of {len(writes)} HyperNode writes refused: {refused[0][:300]}{more}", refusals)


async def _create_ours(api: Api, write: CreateHyperNode) -> bool:
    """Create a tier-0 HyperNode; True if it exists now as the node tier's (created, or another leader's)."""
    if await asyncio.to_thread(api.create_hypernode, dict(write.body)):
        metrics.NODE_TIER_WRITES.labels("create").inc()
        return True
    existing = await asyncio.to_thread(api.get, VOLCANO_TOPOLOGY, "hypernodes", None, _hypernode_name(write))
    labels = ((existing or {}).get("metadata") or {}).get("labels") or {}
    return existing is not None and labels.get(NODE_TIER_LABEL) == "true"


_HYPERNODE_VERBS: dict[type, str] = {CreateHyperNode: "create", SetHyperNodeMembers: "update", DeleteHyperNode: "delete"}


def _hypernode_name(write: Write) -> str:
    if isinstance(write, CreateHyperNode):
        return str(write.body["metadata"]["name"])
    return str(getattr(write, "name", "?"))


def record_placement(api: Api, write: RecordPlacement | RecordMove, annotation: str = PLACEMENT_ANNOTATION) -> None:
    """Set a replica's record in one of the StormService's tables (where it landed; its last move). Two
    replicas of one StormService are placed concurrently: each write is conditional on the version it
    merged into, and a conflict re-reads and merges again, so neither record overwrites the other."""
    for _ in range(RECORD_ATTEMPTS):
        current = api.get(AIBRIX, "stormservices", write.namespace, write.stormservice)
        if current is None:
            return  # deleted meanwhile
        meta = current["metadata"]
        recorded = (meta.get("annotations") or {}).get(annotation)
        value = merge_placements(recorded, write.replica, write.record, write.live)
        if value == recorded:
            return
        try:
            api.annotate_stormservice(write.namespace, write.stormservice, annotation, value, meta.get("resourceVersion"))
            return
        except Conflict:
            continue  # another replica's record landed first: merge into it
    log.warning(
        "%s of %s not recorded on %s/%s: %d conflicting writes",
        annotation,
        write.replica,
        write.namespace,
        write.stormservice,
        RECORD_ATTEMPTS,
    )


def record_moves(api: Api, writes: Sequence[RecordMove]) -> dict[str, Any]:
    """A plan's move records in one write of the move table, conditional on the version the plan read
    (Conflict otherwise): the records merged into the table as it was then. The one writer of a move
    begun; a record after a refused eviction merges into what is there (execute, RecordMove)."""
    first = writes[0]
    current = api.get(AIBRIX, "stormservices", first.namespace, first.stormservice)
    if current is None:
        return {}
    meta = current["metadata"]
    if first.resource_version and meta.get("resourceVersion") != first.resource_version:
        raise Conflict(409, "PATCH", f"stormservices/{first.stormservice}", "changed since the plan was made")
    value = (meta.get("annotations") or {}).get(MOVES_ANNOTATION)
    for write in writes:
        value = merge_placements(value, write.replica, write.record, write.live)
    return api.annotate_stormservice(first.namespace, first.stormservice, MOVES_ANNOTATION, value or "{}", meta.get("resourceVersion"))


@dataclass(frozen=True)
class Evicted:
    """What became of a replica's evictions: how many went through, and each that failed with its error."""

    evicted: int
    failed: tuple[tuple[EvictPod, BaseException], ...]


async def evict(
    api: Api, evictions: Sequence[EvictPod], one_at_a_time: bool, still_leading: Callable[[], bool], report: Report | None = None
) -> Evicted | None:
    """A replica's evictions, only while this replica of the operator still leads (None: it stopped
    there, deposed): one after another where a PodDisruptionBudget covers a pod, the first failure
    ending them; otherwise together."""
    evicted = 0
    failed: list[tuple[EvictPod, BaseException]] = []
    if one_at_a_time:
        for write in evictions:
            if not still_leading():
                return None
            try:
                await execute(api, [write], report)
                evicted += 1
            except Exception as exc:
                failed.append((write, exc))
                break
        return Evicted(evicted, tuple(failed))
    if not still_leading():
        return None
    # All at once: one at a time, Volcano may place a re-created pod while the replica's last old pod
    # still runs, and a gang is placed around its running pods (back into the old domain).
    outcomes = await asyncio.gather(*(execute(api, [w], report) for w in evictions), return_exceptions=True)
    failed = [(w, o) for w, o in zip(evictions, outcomes, strict=True) if isinstance(o, BaseException)]
    return Evicted(len(evictions) - len(failed), tuple(failed))
