"""What the operator knows of the cluster: StormServices, RoleSets and HyperNodes, kept from watch events.

The webhook answers from here so an admission costs no API round trip; on a miss (an object created
moments before its watch event arrives) it reads through to the API server.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import logging
import sys
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from stormtopo.core.capabilities import cluster_tiers
from stormtopo.core.heal_pass import in_play
from stormtopo.core.movable import roleset_prefix
from stormtopo.core.ownership import roleset_name, stormservice_name
from stormtopo.core.podgroup import carries_constraint, service_group_name
from stormtopo.core.priority import priority_values
from stormtopo.core.reconciliation import ServiceSnapshot
from stormtopo.core.replica import KnownNodes, ReplicaSnapshot
from stormtopo.core.replica_pods import Replica
from stormtopo.core.request import ClusterTiers
from stormtopo.core.topology.hypernodes import TreeMemo, selector_label_keys, selects_among_nodes, topology_from_hypernodes
from stormtopo.core.topology.tree import Topology
from stormtopo.core.vocabulary import (
    AIBRIX,
    HOSTNAME_LABEL,
    OPTED_IN_LABEL,
    PODGROUP_CRD,
    REPLICA_SPREAD_TIER,
    REPLICA_SPREAD_TIER_NAME,
    VOLCANO_SCHEDULING,
    VOLCANO_TOPOLOGY,
)
from stormtopo.kube.client import Api, Forbidden, NotFound, Unauthorized
from stormtopo.operator import metrics
from stormtopo.operator.collector import LongLived
from stormtopo.operator.loops import yielding

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, name)
_KINDS = {"stormservices": "StormService", "rolesets": "RoleSet"}


LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"  # a whole copy of the object


def slim(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What the index keeps of an object: its metadata without managedFields, of StormService and
    RoleSet specs only what the gang is made of, and of a status only a PodGroup's phase and
    conditions. Full objects would dominate the operator's memory at a thousand StormServices. Every
    key and short string is interned: each object the API server sends has its own copies of the
    same label keys, namespaces, role and node names (BENCHMARKS.md, "Memory")."""
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
    if LAST_APPLIED in (meta.get("annotations") or {}):
        meta["annotations"] = {k: v for k, v in meta["annotations"].items() if k != LAST_APPLIED}
    out = {k: v for k, v in obj.items() if k not in ("status", "metadata", "spec")}
    out["metadata"] = meta
    if obj.get("kind") == "Pod":
        pod: dict[str, Any] = _interned(_slim_pod(obj, meta))
        if set(pod["spec"]) == {"nodeName"}:  # a bound pod: one spec object per node, shared
            pod["spec"] = _BOUND_TO.setdefault(pod["spec"]["nodeName"], _Shared(pod["spec"]))
        return pod
    if obj.get("kind") == "PodGroup" and obj.get("status"):
        out["status"] = {k: v for k, v in obj["status"].items() if k in ("phase", "conditions")}
    if "spec" in obj:
        out["spec"] = _slim_spec(obj["spec"] or {}) if obj.get("kind") in ("StormService", "RoleSet") else obj["spec"]
    shared: dict[str, Any] = _interned(out)
    return shared


class _Shared(dict[str, Any]):
    """A dict that can be shared weakly: gone once no kept object refers to it."""

    __slots__ = ("__weakref__",)


_BOUND_TO: weakref.WeakValueDictionary[str, _Shared] = weakref.WeakValueDictionary()  # node -> {"nodeName": node}
INTERNED_LENGTH = 64  # longer strings (a last-applied copy, a message) are rarely repeated


def _interned(value: Any) -> Any:
    """A copy of a JSON value with its keys and short strings interned (one object per distinct string)."""
    if isinstance(value, str):
        return sys.intern(value) if len(value) <= INTERNED_LENGTH else value
    if isinstance(value, dict):
        return {sys.intern(k) if isinstance(k, str) else k: _interned(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_interned(v) for v in value]
    return value


def slim_listed_pods(items: Iterable[Mapping[str, Any]]) -> tuple[dict[str, Any], ...]:
    """Pods from a list response as the index keeps them: list items carry no kind, and a pod slimmed
    without it would lose its status (a Failed pod would look live)."""
    return tuple(slim({**item, "kind": "Pod"}) for item in items)


def _slim_pod(pod: Mapping[str, Any], meta: Mapping[str, Any]) -> dict[str, Any]:
    """Of a pod, where it is bound and when: what a placement check and its metric read."""
    # The PodScheduled condition: its time (the placement metric); while not scheduled, why (a stranded
    # replica, a released pod that cannot be placed). Nothing else of a bound pod's conditions.
    scheduled = [
        {
            k: c[k]
            for k in ("type", "status", "reason", "lastTransitionTime", *(("message",) if c.get("status") != "True" else ()))
            if k in c
        }
        for c in (pod.get("status") or {}).get("conditions") or []
        if c.get("type") == "PodScheduled"
    ]
    spec = pod.get("spec") or {}
    # An unbound pod's version and node affinity too (pods waiting are few): a held pod's release narrows
    # its affinity, and a spread replica Volcano cannot place is held again at the version read.
    unbound = ("resourceVersion",) if not spec.get("nodeName") else ()
    kept = {k: meta[k] for k in ("name", "namespace", "labels", "creationTimestamp", "deletionTimestamp", *unbound) if k in meta}
    # Where it is bound; and, for a pod held at stormtopo's gate, what releasing it must patch.
    kept_spec = {k: spec[k] for k in ("nodeName", "schedulingGates") if spec.get(k)}
    if not spec.get("nodeName"):
        # Where it may run (exact preemption takes victims only there), and its priority (it preempts at no
        # more than its pods were admitted at): pods waiting are few.
        kept_spec |= {k: spec[k] for k in ("affinity", "nodeSelector", "tolerations") if spec.get(k)}
        if isinstance(spec.get("priority"), int):
            kept_spec["priority"] = spec["priority"]
    return {
        "kind": "Pod",
        "metadata": kept,
        "spec": kept_spec,
        "status": {"conditions": scheduled, "phase": (pod.get("status") or {}).get("phase")},
    }


def _slim_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in spec.items() if k not in ("roles", "template", "selector")}
    if "roles" in spec:
        out["roles"] = [_slim_role(role) for role in spec["roles"] or []]
    if "template" in spec:
        out["template"] = {"spec": _slim_spec((spec["template"] or {}).get("spec") or {})}
    return out


def _slim_role(role: Mapping[str, Any]) -> dict[str, Any]:
    pod_spec = (role.get("template") or {}).get("spec") or {}
    kept = {k: role[k] for k in ("name", "replicas", "podGroupSize") if k in role}
    kept["template"] = {"spec": {"containers": [{"resources": c.get("resources") or {}} for c in pod_spec.get("containers") or []]}}
    if pod_spec.get("priorityClassName"):  # the replica's PodGroup carries it (core/priority.py)
        kept["template"]["spec"]["priorityClassName"] = pod_spec["priorityClassName"]
    labels = ((role.get("template") or {}).get("metadata") or {}).get("labels") or {}
    if OPTED_IN_LABEL in labels:  # held by its label, not listed (core/optin.py)
        kept["template"]["metadata"] = _LABELLED
    return kept


_LABELLED = {"labels": {OPTED_IN_LABEL: "true"}}  # shared by every labelled role the index keeps


def service_key_of(roleset: Mapping[str, Any]) -> Key:
    """The StormService a RoleSet belongs to."""
    return roleset["metadata"].get("namespace", ""), stormservice_name(roleset) or ""


def _member(groups: dict[Key, set[str]], group: Key, name: str, present: bool) -> None:
    """Keep `name` in (or out of) the set of `group`, dropping sets that empty."""
    if present:
        groups.setdefault(group, set()).add(name)
        return
    names = groups.get(group, set())
    names.discard(name)
    if not names:
        groups.pop(group, None)


def key_of(obj: Mapping[str, Any]) -> Key:
    meta = obj["metadata"]
    return meta.get("namespace", ""), meta["name"]


SHARED_SPECS = ("StormService", "RoleSet")  # a service's RoleSets carry one spec: the index keeps it once


@dataclass
class SharedSpecs:
    """One copy of each distinct slimmed spec, shared by every StormService and RoleSet that carries it (the
    RoleSets of one service, services made from one template), counted so that the last to go takes it.
    The index's objects are read only: a shared spec is never changed in place."""

    _by_text: dict[str, tuple[dict[str, Any], int]] = field(default_factory=dict)
    _text_of: dict[int, str] = field(default_factory=dict)  # id of a shared spec (alive while counted) -> its text

    def share(self, obj: dict[str, Any]) -> dict[str, Any]:
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            return obj
        text = json.dumps(spec, sort_keys=True, separators=(",", ":"))
        shared, count = self._by_text.get(text, (spec, 0))
        self._by_text[text] = (shared, count + 1)
        self._text_of[id(shared)] = text
        return {**obj, "spec": shared}

    def release(self, obj: Mapping[str, Any] | None) -> None:
        """The spec of an object the index drops or replaces: a shared one, so its text is known, not made again."""
        text = self._text_of.get(id((obj or {}).get("spec")))
        if text is None:
            return
        shared, count = self._by_text[text]
        if count <= 1:
            del self._by_text[text], self._text_of[id(shared)]
        else:
            self._by_text[text] = (shared, count - 1)

    def __len__(self) -> int:
        return len(self._by_text)


# The kinds kopf watches whose missed events the re-list delivers (operator/handlers.py relist).
DELIVERED_BY_RELIST = ("StormService", "RoleSet", "HyperNode")
PRUNE_SLICE = 2048  # keys a re-list's prune judges between two yields of the loop (about 1 ms)


def _same_version(held: Mapping[str, Any] | None, obj: Mapping[str, Any]) -> bool:
    version = (obj.get("metadata") or {}).get("resourceVersion")
    return held is not None and bool(version) and (held.get("metadata") or {}).get("resourceVersion") == version


def _built_tree(hypernodes: list[dict[str, Any]], labels: Mapping[str, Mapping[str, str]], memo: TreeMemo) -> tuple[Topology, KnownNodes]:
    tree = topology_from_hypernodes(hypernodes, labels, memo)
    hostnames = {node: node_labels.get(HOSTNAME_LABEL, "") for node, node_labels in labels.items()}
    return tree, KnownNodes(hostnames, shapes_tree=selects_among_nodes(hypernodes))


@dataclass
class Index:
    api: Api
    stormservices: dict[Key, dict[str, Any]] = field(default_factory=dict)
    rolesets: dict[Key, dict[str, Any]] = field(default_factory=dict)
    hypernodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    podgroups: dict[Key, dict[str, Any]] = field(default_factory=dict)  # replica and stormtopo-owned ones
    pods: dict[Key, dict[str, Any]] = field(default_factory=dict)  # pods stormtopo admitted
    # (namespace, RoleSet) -> names of its admitted pods: a placement check reads one replica's pods.
    _pods_by_replica: dict[Key, set[str]] = field(default_factory=dict)
    # (namespace, StormService) -> names of its RoleSets: reconciling one service must not scan them all.
    _rolesets_by_service: dict[Key, set[str]] = field(default_factory=dict)
    # The StormServices healing and the node tier look at: those that opted in (a request annotation),
    # and those that still carry move records (one that opted out mid-move still counts against the cap
    # and the room made). A pass costs what these cost, whatever the tenants that never opted in hold.
    _in_play: set[Key] = field(default_factory=set)
    # Per namespace, every StormService's RoleSet name prefix with its name, sorted: who shares a prefix.
    _prefixes: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    _in_play_sorted: list[Key] | None = None  # sorted once per change of the set, not per call
    # kind -> key -> when last observed: per kind, so that a re-list of one kind walks its own keys only (100,000
    # admitted pods beside 50,000 RoleSets). LongLived, as _deleted_since: frozen for good (operator/collector.py).
    _seen: dict[str, LongLived[Key, int]] = field(default_factory=dict)
    _clock: int = 0
    _specs: SharedSpecs = field(default_factory=SharedSpecs)  # the StormServices' and RoleSets' specs, one copy each
    # Admitted pods that held a node and are gone: healing reads free GPUs afresh when this moves,
    # rather than wait out a cached reading while a new arrival takes the room.
    pods_freed: int = 0
    pods_bound: int = 0  # admitted pods seen bound to a node: the node tier renders its list again
    on_pods_moved: Callable[[], None] | None = None  # called when either count moves (the node tier's wake-up)
    podgroup_schema: dict[str, Any] | None = None  # the PodGroup CRD's schema; None until read
    # Every admission and placement check reads the tiers: computed again only when a HyperNode or the
    # schema changes, not per request (a pass over every HyperNode).
    _hypernode_changes: int = 0
    _tiers: tuple[int, object, object, ClusterTiers] | None = None  # (_hypernode_changes, podgroup_schema, priority_values, tiers)
    priority_values: tuple[tuple[str, int], ...] = ()  # every PriorityClass's value, read with Volcano's fields
    # True once the first complete list of StormServices and RoleSets is in (operator/app.py catch_up):
    # /readyz waits for it, and nothing is judged absent (the stale opted-in keys) before it.
    caught_up: bool = False
    _deleted_early: set[tuple[str, Key]] = field(default_factory=set)  # deletions seen before caught up: a list must not revive them
    # Objects of kopf's kinds deleted since the last re-list began (kind, key) -> when: a re-list must not revive them.
    _deleted_since: LongLived[tuple[str, Key], int] = field(default_factory=LongLived)
    _priorities_refused: bool = False
    # Node name -> its labels, as the free-room reading (operator/room.py) holds them: their one owner; this is
    # its mapping itself, not a copy, handed over by the placement shell when a placement check needs them
    # (regexMatch and labelMatch HyperNodes select among all nodes, and a release pins by hostname).
    nodes: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    nodes_read_at: float = float("-inf")  # monotonic; -inf: never, or HyperNodes changed since
    _node_version: object = None  # of the labels the tree reads, as the reading counts their changes
    _node_reads: int = 0
    _selects: tuple[int, bool] | None = None  # (_hypernode_changes, some HyperNode selects by label or pattern)
    _topology: tuple[int, int, Topology, KnownNodes] | None = None  # (_hypernode_changes, _node_reads, tree, nodes)
    _tree_memo: TreeMemo = field(default_factory=TreeMemo)  # what the last build resolved, for the next

    # -- watch events --------------------------------------------------------------------------
    def observe(self, kind: str, event_type: str | None, obj: Mapping[str, Any]) -> None:
        deleted = event_type == "DELETED"
        self._clock += 1
        metrics.OBSERVED.labels(kind).inc()
        seen = self._seen_of(kind)
        if deleted:
            seen.pop(key_of(obj), None)
            if not self.caught_up:
                self._deleted_early.add((kind, key_of(obj)))
            if kind in DELIVERED_BY_RELIST:
                self._deleted_since[(kind, key_of(obj))] = self._clock
        else:
            seen[key_of(obj)] = self._clock
        if kind == "HyperNode":
            name = obj["metadata"]["name"]
            if not deleted and _same_version(self.hypernodes.get(name), obj):
                return  # a re-list's or a watch restart's copy: the tree and what was planned over it stand
            if deleted:
                self.hypernodes.pop(name, None)
            else:
                self.hypernodes[name] = slim(obj)
            self._hypernode_changes += 1
            self.nodes_read_at = float("-inf")  # its selectors may read labels changed since: read them at the next look
            return
        store = {"StormService": self.stormservices, "RoleSet": self.rolesets, "PodGroup": self.podgroups, "Pod": self.pods}[kind]
        key = key_of(obj)
        if kind == "Pod":
            _member(self._pods_by_replica, (key[0], roleset_name(obj) or ""), key[1], not deleted)
            node = (obj.get("spec") or {}).get("nodeName")
            freed = deleted and bool(node)
            bound = not deleted and bool(node) and not ((self.pods.get(key) or {}).get("spec") or {}).get("nodeName")
            self.pods_freed += freed
            self.pods_bound += bound
            if (freed or bound) and self.on_pods_moved is not None:
                self.on_pods_moved()
        if kind == "RoleSet":
            _member(self._rolesets_by_service, service_key_of(obj), key[1], not deleted)
        if kind == "StormService":
            self._keep_prefix(key, present=not deleted)
            playing = not deleted and in_play(obj)
            if playing and key not in self._in_play:
                self._in_play.add(key)
                self._in_play_sorted = None
            elif not playing and key in self._in_play:
                self._in_play.discard(key)
                self._in_play_sorted = None
        if kind in SHARED_SPECS:
            self._specs.release(store.get(key))
        if deleted:
            store.pop(key, None)
        else:
            store[key] = self._specs.share(slim(obj)) if kind in SHARED_SPECS else slim(obj)

    @property
    def hypernode_changes(self) -> int:
        """HyperNode events seen so far: what was planned over the HyperNodes is stale once this moves."""
        return self._hypernode_changes

    def catch_up(self, kind: str, page: Iterable[Mapping[str, Any]]) -> int:
        """One page of the first list of `kind` (StormService or RoleSet): each object the watch has not
        delivered yet is recorded (an event, newer or a deletion, wins over the list). Returns how many."""
        store = self._store(kind)
        added = 0
        for obj in page:
            key = key_of(obj)
            if key not in store and key not in self._seen_of(kind) and (kind, key) not in self._deleted_early:
                self.observe(kind, None, obj)
                added += 1
        return added

    # -- re-lists ------------------------------------------------------------------------------
    def mark(self) -> int:
        """A point in the event stream: what is observed after it is newer than a list started now."""
        return self._clock

    def missed(self, kind: str, obj: Mapping[str, Any], mark: int) -> bool:
        """An object of a list started at `mark` that the watch never delivered: not held, or held at another
        version, and nothing observed of it since the list began (a newer event or a deletion wins over
        the list). kopf's watch of StormServices or RoleSets can be down for long (a 403, 5xx) while
        lists work: what it missed is delivered by the re-list."""
        key = (kind, key_of(obj))
        if self._seen_of(kind).get(key[1], 0) > mark or self._deleted_since.get(key, -1) > mark:
            return False
        held = self._store(kind).get(key[1][1] if kind == "HyperNode" else key[1])  # HyperNodes: by name
        version = (obj.get("metadata") or {}).get("resourceVersion")
        return held is None or ((held.get("metadata") or {}).get("resourceVersion") != version)

    def relisted(self, kind: str, mark: int) -> None:
        """A re-list of `kind` begun at `mark` is done: deletions before it are no longer needed."""
        for key, when in list(self._deleted_since.items()):
            if key[0] == kind and when <= mark:
                del self._deleted_since[key]

    async def prune(self, kind: str, listed: set[Key], mark: int, forgotten: Callable[[Key], None] = lambda _: None) -> list[Key]:
        """Forget objects of `kind` that a list (started at `mark`) no longer has: deleted while a watch
        was down, their DELETED event never came. Objects observed after `mark` are kept. Its keys are walked
        a slice at a time (100,000 admitted pods: 30 ms of the loop in one go), each judged as it is now, and
        `forgotten` told of each at once: after a yield the name may be back, a new object that must not be."""
        seen = self._seen_of(kind)
        gone: list[Key] = []
        async for key in yielding(list(seen), every=PRUNE_SLICE):
            if key not in listed and seen.get(key, mark + 1) <= mark:
                namespace, name = key
                stored = self._store(kind).get(name if kind == "HyperNode" else key)
                self.observe(kind, "DELETED", stored or {"metadata": {"namespace": namespace, "name": name}})
                forgotten(key)
                gone.append(key)
        return gone

    def _seen_of(self, kind: str) -> LongLived[Key, int]:
        seen = self._seen.get(kind)
        if seen is None:
            seen = self._seen[kind] = LongLived()
        return seen

    def _store(self, kind: str) -> Mapping[Any, dict[str, Any]]:
        stores: dict[str, Mapping[Any, dict[str, Any]]] = {
            "HyperNode": self.hypernodes,
            "StormService": self.stormservices,
            "RoleSet": self.rolesets,
            "PodGroup": self.podgroups,
            "Pod": self.pods,
        }
        return stores[kind]

    def pods_of(self, namespace: str, roleset: str) -> list[dict[str, Any]]:
        """The admitted pods of one replica."""
        names = self._pods_by_replica.get((namespace, roleset), set())
        return [self.pods[(namespace, n)] for n in sorted(names) if (namespace, n) in self.pods]

    def _keep_prefix(self, key: Key, present: bool) -> None:
        prefixes = self._prefixes.setdefault(key[0], [])
        entry = (roleset_prefix(key[1]), key[1])
        at = bisect.bisect_left(prefixes, entry)
        there = at < len(prefixes) and prefixes[at] == entry
        if present and not there:
            prefixes.insert(at, entry)
        elif not present and there:
            del prefixes[at]
            if not prefixes:
                del self._prefixes[key[0]]

    def roleset_prefix_shared(self, namespace: str, stormservice: str) -> str | None:
        """Another StormService of the namespace whose pods the chart's eviction policy could take for this
        one's, or the other way round (core/movable.py): one of their RoleSet name prefixes begins the
        other (the same, once AIBrix cuts both to ROLESET_PREFIX characters, or "<this>-roleset-<more>")."""
        return next(iter(self.prefix_neighbours(namespace, stormservice)), None)

    def prefix_neighbours(self, namespace: str, stormservice: str) -> list[str]:
        """Every other StormService of the namespace whose RoleSet name prefix begins this one's or that this
        one's begins: whether either is movable depends on the other, so when one comes or goes the others are
        reconciled again. O(log n) and the few found."""
        own = roleset_prefix(stormservice)
        prefixes = self._prefixes.get(namespace, [])
        out = []
        for prefix, name in prefixes[bisect.bisect_left(prefixes, (own, "")) :]:  # those that begin with this one's
            if not prefix.startswith(own):
                break
            if name != stormservice:
                out.append(name)
        # Those this one's begins with: its whole prefix (found above) or a head ending in "-roleset-".
        heads = {own[: at + len("-roleset-")] for at in range(len(own)) if own.startswith("-roleset-", at)} - {own}
        for head in sorted(heads):
            for prefix, name in prefixes[bisect.bisect_left(prefixes, (head, "")) :]:
                if prefix != head:
                    break
                if name != stormservice:
                    out.append(name)
        return out

    def stormservices_in_play(self) -> dict[Key, dict[str, Any]]:
        """What healing and the node tier look at, by key: the StormServices that opted in, and those that
        still carry move records."""
        if self._in_play_sorted is None:
            self._in_play_sorted = sorted(self._in_play)
        return {key: self.stormservices[key] for key in self._in_play_sorted if key in self.stormservices}

    def rolesets_of(self, namespace: str, stormservice: str) -> list[dict[str, Any]]:
        names = self._rolesets_by_service.get((namespace, stormservice), set())
        return [self.rolesets[(namespace, n)] for n in sorted(names) if (namespace, n) in self.rolesets]

    def snapshot_of(self, stormservice: Mapping[str, Any]) -> ServiceSnapshot:
        """One StormService as the index sees it now, for the reconciliation planner."""
        namespace, name = key_of(stormservice)
        rolesets = tuple(self.rolesets_of(namespace, name))
        names = [service_group_name(name), *(r["metadata"]["name"] for r in rolesets)]
        podgroups = {n: self.podgroups[(namespace, n)] for n in names if (namespace, n) in self.podgroups}
        return ServiceSnapshot(stormservice, rolesets, podgroups, self.cluster_tiers(), self.roleset_prefix_shared(namespace, name))

    def last_valid_podgroup(self, podgroup: Mapping[str, Any]) -> dict[str, Any] | None:
        """A PodGroup of the same StormService that carries stormtopo's constraint: what a new replica
        keeps while its StormService's request looks invalid."""
        namespace = podgroup["metadata"].get("namespace", "")
        service = stormservice_name(podgroup)
        if service is None:
            roleset = self.rolesets.get((namespace, roleset_name(podgroup) or ""))
            service = stormservice_name(roleset) if roleset else None
        for roleset in self.rolesets_of(namespace, service or ""):
            sibling = self.podgroups.get((namespace, roleset["metadata"]["name"]))
            if carries_constraint(sibling):
                return sibling
        return None

    def replica_snapshot(self, key: Key, now: float, fresh_within: float = 0.0) -> ReplicaSnapshot | None:
        """One replica as the index sees it now, for the placement planner; None if its RoleSet or
        StormService is not known (deleted, or its event on the way)."""
        roleset = self.rolesets.get(key)
        stormservice = self.stormservices.get(service_key_of(roleset)) if roleset else None
        if roleset is None or stormservice is None:
            return None
        rolesets = self.rolesets_of(*service_key_of(roleset))
        return ReplicaSnapshot(
            roleset,
            stormservice,
            tuple(self.pods_of(*key)),
            self.podgroups.get(key),
            self.cluster_tiers(),
            self.topology(),
            self.known_nodes(now - self.nodes_read_at <= fresh_within),
            tuple(r["metadata"]["name"] for r in rolesets),
            now=now,
            siblings=self._siblings(stormservice, key, rolesets),
        )

    def _siblings(self, stormservice: Mapping[str, Any], key: Key, rolesets: list[dict[str, Any]]) -> tuple[Replica, ...]:
        """The StormService's other replicas with their pods, only where it asks for a spread (core/spread.py):
        other placement checks need not walk a large service's pods."""
        annotations = (stormservice.get("metadata") or {}).get("annotations") or {}
        if REPLICA_SPREAD_TIER not in annotations and REPLICA_SPREAD_TIER_NAME not in annotations:
            return ()
        return tuple(Replica(r, tuple(self.pods_of(key[0], r["metadata"]["name"]))) for r in rolesets if r["metadata"]["name"] != key[1])

    def set_nodes(self, labels: Mapping[str, Mapping[str, str]], read_at: float, version: object = None) -> None:
        """The nodes' labels as read at `read_at` (operator/room.py node_labels: its mapping, not a copy); the
        tree is rebuilt only if what it reads of them changed: the node_label_keys' `version`, as the reading
        counts their changes (None: compared whole)."""
        self.nodes_read_at = read_at
        changed = labels != self.nodes if version is None else version != self._node_version
        self.nodes, self._node_version = labels, version
        if changed:
            self._node_reads += 1

    @property
    def node_reads(self) -> int:
        """How many times the nodes' labels (as kept) changed: a version of them, as hypernode_changes is of the tree."""
        return self._node_reads

    def selects_by_label(self) -> bool:
        """Some HyperNode selects its nodes by label or pattern: the tree depends on the nodes' labels. Kept per
        version of the HyperNodes (a scan of them, not a rebuild of the tree)."""
        if self._selects is None or self._selects[0] != self._hypernode_changes:
            self._selects = (self._hypernode_changes, selects_among_nodes(self.hypernodes.values()))
        return self._selects[1]

    def node_label_keys(self) -> frozenset[str]:
        """What the tree and a release read of a node's labels: its hostname and what the HyperNodes' labelMatch reads."""
        return selector_label_keys(self.hypernodes.values()) | {HOSTNAME_LABEL}

    def topology(self) -> Topology:
        """The switch tree the HyperNodes describe, over every node read: built once per HyperNode or
        node change, like the tiers, not per placement check."""
        return self._tree()[0]

    def known_nodes(self, fresh: bool) -> KnownNodes:
        return replace(self._tree()[1], fresh=fresh)

    def _tree(self) -> tuple[Topology, KnownNodes]:
        changes, reads = self._hypernode_changes, self._node_reads
        if self._topology is None or self._topology[:2] != (changes, reads):
            self._topology = (changes, reads, *_built_tree(list(self.hypernodes.values()), self.nodes, self._tree_memo))
        return self._topology[2], self._topology[3]

    async def build_tree(self) -> None:
        """The switch tree built now, on a thread, and kept if nothing it was built from changed meanwhile. A whole
        build over 16,384 nodes is 30 to 55 ms, too long for the loop the webhooks share: a leader's first (after
        the HyperNodes are primed) and one over node labels just read (labelMatch members) are built here; a
        placement check then reads it, or rebuilds on the loop from its memo what changed since (a few ms)."""
        changes, reads = self._hypernode_changes, self._node_reads
        if self._topology is not None and self._topology[:2] == (changes, reads):
            return
        # Both are replaced, never changed, when they change (room.py node_labels; observe): read safely on a thread.
        hypernodes, labels = list(self.hypernodes.values()), self.nodes
        memo = TreeMemo(self._tree_memo.resolved, self._tree_memo.specs)  # (the build only reads these, then sets its own)
        tree, known = await asyncio.to_thread(_built_tree, hypernodes, labels, memo)
        if (self._hypernode_changes, self._node_reads) == (changes, reads):
            self._tree_memo, self._topology = memo, (changes, reads, tree, known)

    def cluster_tiers(self) -> ClusterTiers:
        # Keyed by what it is computed from, read first: HyperNodes primed or a schema re-read on a
        # thread while this computes leave a key that no longer matches, so the next call recomputes.
        changes, schema, priorities = self._hypernode_changes, self.podgroup_schema, self.priority_values
        if self._tiers is None or self._tiers[0] != changes or self._tiers[1] is not schema or self._tiers[2] is not priorities:
            tiers = replace(cluster_tiers(list(self.hypernodes.values()), schema), priority_values=priorities)
            self._tiers = (changes, schema, priorities, tiers)
        return self._tiers[3]

    def detect_volcano_fields(self) -> None:
        """Read the installed PodGroup CRD: which fields Volcano offers (networkTopology >= 1.12; names, subgroups >= 1.14)."""
        self.podgroup_schema = self.api.crd_schema(PODGROUP_CRD) or {}
        self.read_priority_classes()

    def read_priority_classes(self) -> None:
        """Every PriorityClass's value (a short list, read at each look for Volcano's fields). Refused
        (an RBAC without it): the values stay as they were, and a replica whose roles differ gets the
        class first by name (core/priority.py), once a warning is logged."""
        try:
            classes = self.api.list_objects(("scheduling.k8s.io", "v1"), "priorityclasses")
        except (Unauthorized, Forbidden, NotFound) as exc:
            if not self._priorities_refused:
                log.warning("PriorityClasses cannot be read (%s): roles at different classes get the first by name", exc.status)
            self._priorities_refused = True
            return
        values = tuple(sorted(priority_values(classes).items()))
        if values != self.priority_values:
            self.priority_values = values

    def list_hypernodes(self) -> list[dict[str, Any]]:
        """Every HyperNode, read from the API (on a thread: Index.prime loads them)."""
        return list(self.api.list_objects(VOLCANO_TOPOLOGY, "hypernodes"))

    def prime(self, hypernodes: list[dict[str, Any]]) -> None:
        """Load HyperNodes before the webhook serves, so the first admission knows the cluster's tiers. On the event
        loop: the index is the loop's (a thread observing while the loop reads it would change what the loop iterates)."""
        for hypernode in hypernodes:
            self.observe("HyperNode", None, hypernode)

    # -- lookups for admission -----------------------------------------------------------------
    async def read_roleset(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._read_through(self.rolesets, "rolesets", namespace, name)

    async def read_podgroup(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A PodGroup, read through on a miss: a replica that just started must not admit a pod into a
        PodGroup it has not seen yet (one created unconstrained while stormtopo was down)."""
        found = self.podgroups.get((namespace, name))
        if found is None:
            read = await asyncio.to_thread(self.api.get, VOLCANO_SCHEDULING, "podgroups", namespace, name)
            found = slim(read) if read is not None else None
        return found

    async def read_stormservice(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._read_through(self.stormservices, "stormservices", namespace, name)

    async def _read_through(self, store: dict[Key, dict[str, Any]], plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        found = store.get((namespace, name))
        if found is None:
            read = await asyncio.to_thread(self.api.get, AIBRIX, plural, namespace, name)
            if read is not None and (namespace, name) not in store:  # (its watch event may have come meanwhile)
                # Recorded as an event would be, so a re-list forgets it once it is gone.
                self.observe(_KINDS[plural], None, read)
            found = store.get((namespace, name))
        return found

    async def service_of_group(self, namespace: str, group: str) -> str | None:
        """The StormService a PodGroup belongs to, by its labels or its RoleSet's; None if unknown."""
        podgroup = self.podgroups.get((namespace, group))
        if podgroup is None:
            return None
        service = stormservice_name(podgroup)
        if service is None and roleset_name(podgroup):
            roleset = await self.read_roleset(namespace, roleset_name(podgroup) or "")
            service = stormservice_name(roleset) if roleset else None
        return service

    async def owners_of(self, obj: Mapping[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """The RoleSet and StormService an AIBrix pod or PodGroup belongs to."""
        namespace = (obj.get("metadata") or {}).get("namespace", "")
        replica = roleset_name(obj)
        roleset = await self.read_roleset(namespace, replica) if replica else None
        service = stormservice_name(obj) or (stormservice_name(roleset) if roleset else None)
        stormservice = await self.read_stormservice(namespace, service) if service else None
        return roleset, stormservice
