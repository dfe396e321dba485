"""The one reading of free room: every node's GPUs and what bound pods use of them, kept current from
the API server's events.

The node tier, healing, making room and the explanations of pending gangs all need every node's free
GPUs. Listing every pod and node of the cluster for each of them, every few seconds, would cost the
API server for ever. This reading lists them once (a page at a time, selected on the server: bound pods that have not finished,
and nodes), then follows the watch; an idle cluster costs a watch, not a list. It starts the first time
someone asks (the leader: the node tier, healing, a stranded replica or a pending gang to explain), so a
follower never reads a pod of another tenant.

Per bound pod it keeps its node, its GPUs and its other requests (shared between pods that request the
same); per node its GPUs, labels, taints and allocatable resources: enough to say where a replica's pods
could run at all (core/node_fit.py), not the pods themselves.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from stormtopo.core.gang import container_gpus, gpu_count
from stormtopo.core.node_fit import NodeFacts, milli, pod_requests
from stormtopo.core.packing import takes_new_pods
from stormtopo.core.preemption import Holder, rank_of
from stormtopo.core.victims import GangSize
from stormtopo.core.vocabulary import GPU, GROUP_NAME_ANNOTATION
from stormtopo.kube.client import Api
from stormtopo.kube.watch import WatchStreams
from stormtopo.operator import collector, watch
from stormtopo.operator.collector import LongLived
from stormtopo.operator.index import Key, key_of
from stormtopo.operator.loops import Loops

log = logging.getLogger("stormtopo.room")
BOUND = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"  # pods that hold room on a node
FIRST_READING_TIMEOUT = 120.0  # seconds a caller waits for the first list (the API server away): then its loop fails and retries


def _bound(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("spec") or {}).get("nodeName")) and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def pod_gpus(pod: Mapping[str, Any], resource: str = GPU) -> tuple[str, int] | None:
    """(node, GPUs requested) of a pod that holds GPUs on a node, None for one that holds none (not
    bound, finished, or asking for no GPUs). Containers only, as Api.free_gpus counts."""
    if not _bound(pod):
        return None
    spec = pod.get("spec") or {}
    node = spec.get("nodeName")
    gpus = container_gpus(spec, resource)
    return (str(node), gpus) if gpus else None


def node_facts(node: Mapping[str, Any]) -> tuple[Mapping[str, str], tuple[Mapping[str, str], ...], Mapping[str, int]]:
    """(labels, taints, allocatable per resource in milli-units)."""
    meta, spec, status = node.get("metadata") or {}, node.get("spec") or {}, node.get("status") or {}
    taints = tuple({k: str(v) for k, v in t.items() if k in ("key", "value", "effect")} for t in spec.get("taints") or [])
    allocatable = {resource: milli(value) for resource, value in (status.get("allocatable") or {}).items()}
    return dict(meta.get("labels") or {}), taints, allocatable


def node_gpus(node: Mapping[str, Any], resource: str = GPU) -> tuple[int, bool]:
    """(allocatable GPUs, whether the node takes new pods)."""
    try:
        gpus = gpu_count(((node.get("status") or {}).get("allocatable") or {}).get(resource, "0"))
    except ValueError:
        gpus = 0
    return gpus, takes_new_pods(node)


@dataclass
class NodeRoom:
    """Every node's allocatable and used GPUs, from a list and then the watch of pods and nodes."""

    api: Api
    loops: Loops
    resource: str = GPU
    # The dicts of only strings, numbers and tuples of them are LongLived: once frozen, they stay out of the
    # collector's passes (operator/collector.py). Bound pods holding GPUs: their node.
    _pods: LongLived[Key, str] = field(default_factory=LongLived)
    _nodes: LongLived[str, tuple[int, bool]] = field(default_factory=LongLived)  # (allocatable GPUs, takes new pods)
    _used: dict[str, int] = field(default_factory=dict)  # GPUs held per node, the sum of _pods
    # Kept as each event changes them (one node or gang at a time), never rebuilt whole: at 16,384 nodes a rebuild
    # of any of them took 30 to 90 ms of the event loop.
    _node_pods: dict[str, dict[Key, Holder]] = field(default_factory=dict)  # of _pods, per node: how preemption ranks each
    _holders: dict[str, tuple[Holder, ...]] = field(default_factory=dict)  # per node, the values of _node_pods
    _gangs: dict[str, GangSize] = field(default_factory=dict)  # per gang ("namespace/PodGroup"), its pods in _pods
    # Every bound pod's node and other requests; per node its labels, taints, allocatable, and what pods request.
    _holds: LongLived[Key, tuple[str, tuple[tuple[str, int], ...]]] = field(default_factory=LongLived)
    _shared: dict[tuple[tuple[str, int], ...], tuple[tuple[tuple[str, int], ...], int]] = field(default_factory=dict)  # (copy, pods)
    _facts: dict[str, tuple[Mapping[str, str], tuple[Mapping[str, str], ...], Mapping[str, int]]] = field(default_factory=dict)
    _requested: dict[str, dict[str, int]] = field(default_factory=dict)
    _node_facts: dict[str, NodeFacts] = field(default_factory=dict)  # per node, from _facts less _requested
    # The copies last handed out, at `changes`: a reader (a planner on a thread) holds one while the watch goes on.
    _copies: dict[str, tuple[int, dict[str, Any]]] = field(default_factory=dict)
    _leaving: set[Key] = field(default_factory=set)  # of pods in _pods: those being deleted
    changes: int = 0  # counts every change of the reading: a plan over an unchanged reading need not be made again
    label_changes: int = 0  # counts every change of a node's labels (a node come or gone too)
    _nodes_changed: int = 0  # counts nodes come or gone
    # Per label key some reader asked a version of (label_version: the HyperNodes' selectors', written by admins),
    # its changes on any node; other keys are not counted (whoever may label a node could add keys without end).
    _key_changes: dict[str, int] = field(default_factory=dict)
    _labels: tuple[int, dict[str, Mapping[str, str]]] | None = None  # every node's labels as last handed out, at label_changes
    _streams: WatchStreams | None = None
    _listed: dict[str, asyncio.Event] = field(default_factory=dict)
    _frozen: bool = False  # what the first lists brought is frozen out of the collector's passes

    def _start(self, kinds: tuple[str, ...] = ("Pod", "Node")) -> None:
        """Follow these kinds (each once): the nodes alone where only their labels are needed."""
        if self._streams is None:
            self._streams = WatchStreams(self.api)
        for kind in kinds:
            if kind in self._listed:
                continue
            self._listed[kind] = asyncio.Event()
            if kind == "Pod":
                name = "room-pods"
                stream = watch.ListWatch(
                    self.api, self._streams, "Pod", "v1", "/api/v1/pods", "", self._on_pod, self._pod_gone, field_selector=BOUND
                )
            else:
                name = "room-nodes"
                stream = watch.ListWatch(self.api, self._streams, "Node", "v1", "/api/v1/nodes", "", self._on_node, self._node_gone)
            stream.on_listed = functools.partial(self._on_listed, kind)
            self.loops.supervise(name, watch.PERIOD, stream.run)
            log.info("following %s for the free-room reading", "bound pods" if kind == "Pod" else "nodes")

    def _on_listed(self, kind: str) -> None:
        """A complete list of `kind`. The first time both pods and nodes are (not at a re-list), what the reading
        holds is frozen out of the collector's passes (operator/collector.py), as what the operator loaded by the
        time it was ready is: at 16,384 nodes the first full pass over it would hold the event loop about 45 ms."""
        self._listed.setdefault(kind, asyncio.Event()).set()
        if not self._frozen and {"Pod", "Node"} <= self._listed.keys() and all(e.is_set() for e in self._listed.values()):
            self._frozen = True
            collector.freeze()

    def listed(self) -> bool:
        """Whether the first list is done (started if it was not): a pass over many services checks
        this once rather than wait for it per service."""
        self._start()
        return all(event.is_set() for event in self._listed.values())

    async def _ready(self, kinds: tuple[str, ...] = ("Pod", "Node")) -> None:
        self._start(kinds)
        async with asyncio.timeout(FIRST_READING_TIMEOUT):
            for kind in kinds:
                await self._listed[kind].wait()

    async def node_labels(self) -> Mapping[str, Mapping[str, str]]:
        """Every node's labels, current to the last event of the node watch (bound pods are not needed,
        nor waited for: a tree that selects nodes by label reads only this). The operator's one reading of
        them: the index builds the switch tree over this very mapping (not a copy), which is never changed: a
        node's labels changing makes a new one, so a reader may keep it (label_version says when to rebuild)."""
        await self._ready(("Node",))
        return self.labels_now()

    def label_version(self, keys: frozenset[str]) -> tuple[int, tuple[tuple[str, int], ...]]:
        """A version of these labels of every node: it changes when a node comes or goes or one of them changes
        on some node, not for any other label (a tree over them need not be rebuilt for those)."""
        for key in keys - self._key_changes.keys():  # counted from now: the key set itself is part of the version
            self._key_changes[key] = 0
        return self._nodes_changed, tuple((key, self._key_changes[key]) for key in sorted(keys))

    def labels_now(self) -> Mapping[str, Mapping[str, str]]:
        if self._labels is None or self._labels[0] != self.label_changes:
            self._labels = (self.label_changes, {name: labels for name, (labels, _, _) in self._facts.items()})
        return self._labels[1]

    @classmethod
    def read(cls, api: Api) -> NodeRoom:
        """One reading now, by list, no watch: for a command (`stormtopo heal --dry-run`) to judge
        room as the operator does."""
        room = cls(api, Loops())
        for page in api.pages("/api/v1/nodes"):
            for node in page:
                room._on_node(None, node)
        for page in api.pages("/api/v1/pods", fieldSelector=BOUND):
            for pod in page:
                room._on_pod(None, pod)
        return room

    async def free_gpus(self, taking_new_pods: bool = True) -> dict[str, int]:
        """Free GPUs of every node (`taking_new_pods`: only those a new pod may go to), current to the
        last event the watch delivered."""
        await self._ready()
        return self.free_now(taking_new_pods)

    def free_now(self, taking_new_pods: bool = True) -> dict[str, int]:
        return {node: gpus - self._used.get(node, 0) for node, (gpus, taking) in self._nodes.items() if taking or not taking_new_pods}

    async def node_facts(self) -> dict[str, NodeFacts]:
        """Per node, what decides whether a pod may run there, GPUs aside: labels, taints, and what is left
        of each resource once every bound pod's requests are taken (core/node_fit.py)."""
        await self._ready()
        return self.facts_now()

    def facts_now(self) -> dict[str, NodeFacts]:
        """Read only (a healing pass reads it for every service): one copy per change of the reading."""
        return self._copy("facts", self._node_facts)

    async def allocatable_gpus(self) -> dict[str, int]:
        """Allocatable GPUs of every node (what a HyperNode's binpack divides by)."""
        await self._ready()
        return {node: gpus for node, (gpus, _) in self._nodes.items()}

    def holders_now(self) -> dict[str, tuple[Holder, ...]]:
        """Per node, the pods holding its GPUs as preemption ranks them (core/preemption.py), each with its
        Volcano gang (its PodGroup) where it names one. Read only: one copy per change of the reading."""
        return self._copy("holders", self._holders)

    def _copy(self, what: str, of: dict[str, Any]) -> dict[str, Any]:
        """A copy of `of` (a thread may read it while the watch changes `of`), made once per change."""
        copied = self._copies.get(what)
        if copied is None or copied[0] != self.changes:
            copied = self._copies[what] = (self.changes, dict(of))
        return copied[1]

    def releasing_now(self) -> dict[str, int]:
        """Per node, the GPUs of pods being deleted: free once they end (Volcano places onto them already)."""
        out: dict[str, int] = {}
        for key in self._leaving:
            node = self._pods.get(key)
            if node is not None:
                out[node] = out.get(node, 0) + self._node_pods[node][key].gpus
        return out

    def gangs_now(self) -> dict[str, GangSize]:
        """Each gang that holds GPUs: its running pods and their GPUs, taken as its minimum (the operator
        keeps no other team's PodGroup: a gang is assumed to run at its minMember, so preemption counts a
        victim of a gang as the whole gang lost, never less). Read only: one copy per change of the reading."""
        return self._copy("gangs", self._gangs)

    def _on_pod(self, event: str | None, pod: dict[str, Any]) -> None:
        key = key_of(pod)
        meta = pod.get("metadata") or {}
        held = None if event == "DELETED" else pod_gpus(pod, self.resource)
        leaving = held is not None and bool(meta.get("deletionTimestamp"))
        changed = leaving != (key in self._leaving)
        (self._leaving.add if leaving else self._leaving.discard)(key)
        placed = None
        if held is not None:
            priority, preemptable = rank_of(pod)
            group = (meta.get("annotations") or {}).get(GROUP_NAME_ANNOTATION)
            # being deleted: its room is on its way, never a victim again
            placed = (held[0], Holder(held[1], priority, preemptable and not leaving, f"{key[0]}/{group}" if group else None, leaving))
        changed |= self._set_pod(key, placed)
        if self._set_requests(key, None if event == "DELETED" else pod) or changed:
            self.changes += 1

    def _pod_gone(self, key: Key) -> None:
        self._leaving.discard(key)
        if self._set_pod(key, None) | self._set_requests(key, None):
            self.changes += 1

    def _set_requests(self, key: Key, pod: Mapping[str, Any] | None) -> bool:
        holds = None
        if pod is not None and _bound(pod):
            holds = (str(pod["spec"]["nodeName"]), tuple(sorted(pod_requests(pod.get("spec") or {}).items())))
        was = self._holds.get(key)
        if was == holds:
            return False
        if was is not None:
            on = self._requested.get(was[0], {})
            for resource, amount in was[1]:
                on[resource] = on.get(resource, 0) - amount
                if not on[resource]:
                    del on[resource]
            if not on:
                self._requested.pop(was[0], None)  # (nothing kept of a node no pod requests anything of)
            del self._holds[key]
            self._unshare(was[1])
        if holds is not None:
            holds = (holds[0], self._share(holds[1]))
            self._holds[key] = holds
            on = self._requested.setdefault(holds[0], {})
            for resource, amount in holds[1]:
                on[resource] = on.get(resource, 0) + amount
        for node in {was[0] if was else None, holds[0] if holds else None} - {None}:
            self._refresh_facts(str(node))
        return True

    def _share(self, asked: tuple[tuple[str, int], ...]) -> tuple[tuple[str, int], ...]:
        """One copy of requests alike, counted: kept while a pod asks for them (a tenant whose every pod asks
        for other amounts adds nothing that outlives its pods)."""
        shared, pods = self._shared.get(asked, (asked, 0))
        self._shared[asked] = (shared, pods + 1)
        return shared

    def _unshare(self, asked: tuple[tuple[str, int], ...]) -> None:
        shared, pods = self._shared.get(asked, (asked, 1))
        if pods > 1:
            self._shared[asked] = (shared, pods - 1)
        else:
            self._shared.pop(asked, None)

    def _refresh_facts(self, node: str) -> None:
        """The node's facts again, after its own change or a change of what its pods request."""
        if node not in self._facts:
            self._node_facts.pop(node, None)
            return
        labels, taints, allocatable = self._facts[node]
        requested = self._requested.get(node, {})
        self._node_facts[node] = NodeFacts(labels, taints, {r: amount - requested.get(r, 0) for r, amount in allocatable.items()})

    def _set_pod(self, key: Key, held: tuple[str, Holder] | None) -> bool:
        """Where a pod holds GPUs, and as what (None: nowhere); whether that changed."""
        node = self._pods.get(key)
        was = None if node is None else (node, self._node_pods[node][key])
        if was == held:
            return False
        if was is not None:
            self._take_off(key, *was)
        if held is not None:
            self._put_on(key, *held)
        return True

    def _put_on(self, key: Key, node: str, holder: Holder) -> None:
        self._pods[key] = node
        self._used[node] = self._used.get(node, 0) + holder.gpus
        on = self._node_pods.setdefault(node, {})
        on[key] = holder
        self._holders[node] = tuple(on.values())
        if holder.gang is not None:
            size = self._gangs.get(holder.gang, GangSize(0, 0, 0))
            self._gangs[holder.gang] = GangSize(size.running + 1, size.min_member + 1, size.gpus + holder.gpus)

    def _take_off(self, key: Key, node: str, holder: Holder) -> None:
        del self._pods[key]
        left = self._used.get(node, 0) - holder.gpus
        if left:
            self._used[node] = left
        else:
            self._used.pop(node, None)
        on = self._node_pods.get(node, {})
        on.pop(key, None)
        if on:
            self._holders[node] = tuple(on.values())
        else:
            self._node_pods.pop(node, None)
            self._holders.pop(node, None)
        if holder.gang is not None:
            size = self._gangs.get(holder.gang, GangSize(1, 1, holder.gpus))
            if size.running > 1:
                self._gangs[holder.gang] = GangSize(size.running - 1, size.min_member - 1, size.gpus - holder.gpus)
            else:
                self._gangs.pop(holder.gang, None)

    def _on_node(self, event: str | None, node: dict[str, Any]) -> None:
        name = str((node.get("metadata") or {}).get("name"))
        if event == "DELETED":
            self._node_gone(("", name))
            return
        reading, facts = node_gpus(node, self.resource), node_facts(node)
        if self._nodes.get(name) != reading or self._facts.get(name) != facts:
            was = self._facts.get(name)
            if was is None:
                self.label_changes += 1
                self._nodes_changed += 1
            elif was[0] != facts[0]:
                self.label_changes += 1
                for key in self._key_changes.keys() & {k for k in was[0].keys() | facts[0].keys() if was[0].get(k) != facts[0].get(k)}:
                    self._key_changes[key] += 1
            self._nodes[name], self._facts[name] = reading, facts
            self._refresh_facts(name)
            self.changes += 1

    def _node_gone(self, key: Key) -> None:
        if self._facts.pop(key[1], None) is not None:
            self.label_changes += 1
            self._nodes_changed += 1
        self._node_facts.pop(key[1], None)
        if self._nodes.pop(key[1], None) is not None:
            self.changes += 1

    async def close(self) -> None:
        if self._streams is not None:
            await self._streams.close()
