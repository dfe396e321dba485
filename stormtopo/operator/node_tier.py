"""Keeping the node tier's short list current (--node-tier): every pass, the leader takes the
GPUs in use per node (the free-room reading, room.py, which follows pods and nodes by watch) and the
HyperNodes, and writes what core/topology/node_tier.py plans, so that the tier-0 HyperNodes follow pods
as they come and go. A steady state plans nothing and writes nothing, and reads nothing from the API
server: the readings are current to the last event (no list of every pod at rest).

Once a pod of an opted-in service is bound or gone (the index sees it within milliseconds), the loop is
woken (at most twice a second while replicas are being placed, NODE_TIER_MIN_GAP); a change of another
tenant's pods is planned over at the next pass (NODE_TIER_INTERVAL)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from stormtopo.core.gang import replica_pods, template_spec
from stormtopo.core.request import is_opted_in
from stormtopo.core.topology.node_tier import plan_node_tier, unusable_named_leaves
from stormtopo.core.writes import Write
from stormtopo.kube.client import Api
from stormtopo.operator.events import Report
from stormtopo.operator.index import Index
from stormtopo.operator.room import NodeRoom
from stormtopo.operator.writer import HyperNodeWritesRefused, execute_hypernode_writes

log = logging.getLogger("stormtopo.node_tier")
NODE_TIER_INTERVAL = 1.0  # seconds between two passes unless woken; a pass with nothing new reuses the cached readings
NODE_TIER_OFF_INTERVAL = 5.0  # seconds between two looks, node tier off, at whether a leaf still names one of its HyperNodes
NODE_TIER_MIN_GAP = 0.5  # seconds between the starts of two woken passes: at most two fresh readings a second


def _generation(stormservice: Mapping[str, Any]) -> tuple[str, str, str]:
    """(namespace, name, generation): one template of one StormService."""
    meta = stormservice.get("metadata") or {}
    return str(meta.get("namespace")), str(meta.get("name")), str(meta.get("generation"))


def _shape(stormservice: Mapping[str, Any], warned: set[tuple[str, str, str]]) -> tuple[int, ...]:
    """The GPUs of each pod of one replica; () for a template that gives no count (said in the log once
    per generation of the StormService: one such StormService must not stop the list for every other)."""
    try:
        return tuple(sorted(replica_pods(template_spec(stormservice))))
    except (ValueError, TypeError, AttributeError) as exc:
        key = _generation(stormservice)
        if key not in warned:
            warned.add(key)
            log.warning("node tier: StormService %s/%s: no GPU count in its template (%s)", key[0], key[1], exc)
        return ()


@dataclass
class NodeTier:
    index: Index  # its HyperNodes, as the watch has them (the node tier's own included)
    api: Api
    room: NodeRoom  # every node's free and allocatable GPUs, followed by watch
    leading: Callable[[], bool] = lambda: True
    # --node-tier-keep-runs: keep runs of empty nodes for replicas of whole-node pods (packs more from a
    # fragmented start, puts fewer replicas that one node holds on one node; docs/node-tier.md).
    keep_runs: bool = False
    # --node-tier-leaf: leaves another writer keeps (Volcano's discovery, GitOps) that the user lets the node tier change
    named_leaves: frozenset[str] = frozenset()
    # False: the node tier is off (not asked for): every leaf gets its nodes back and the tier-0
    # HyperNodes go, once, from the watched HyperNodes alone (no GPU reading); then nothing to write.
    enabled: bool = True
    report: Report | None = None  # a refused write is said on its HyperNode, once per kind of refusal
    _refused: dict[str, str] = field(default_factory=dict)  # HyperNode -> the kind of refusal last said
    _planned: tuple[object, ...] | None = None  # what the last pass planned over
    _unusable: dict[str, str] = field(default_factory=dict)  # named leaves it cannot change, last said
    # (namespace, name, generation) of the StormServices whose template gave no GPU count, said once each;
    # kept only for those the index still has.
    _warned: set[tuple[str, str, str]] = field(default_factory=set)

    async def check(self) -> None:
        """One pass (a loop of the operator runs it every NODE_TIER_INTERVAL); an exception goes to the
        loop, which logs it and backs off."""
        if not self.leading():
            return
        if not self.enabled:
            if self._planned != (changes := (self.index.hypernode_changes,)):
                writes = plan_node_tier(list(self.index.hypernodes.values()), {}, {}, enabled=False)
                if writes:
                    log.info("node tier off: %d HyperNode writes put the leaves back", len(writes))
                    await self._execute(writes)
                self._planned = changes
            return
        # Nodes that take new pods only: no other node is listed.
        free = await self.room.free_gpus(taking_new_pods=True)
        allocatable = await self.room.allocatable_gpus()
        unusable = unusable_named_leaves(self.index.hypernodes.values(), self.named_leaves, allocatable.keys())
        if unusable != self._unusable:  # said once per change, not every pass
            for name, why in unusable.items():
                log.warning("node tier: --node-tier-leaf=%s is not used: %s", name, why)
            self._unusable = unusable
        taking = {node: gpus for node, gpus in allocatable.items() if node in free}
        used = {node: gpus - free[node] for node, gpus in taking.items()}
        # The shapes of the replicas that ask for a topology: whether one needs a run of empty nodes in one
        # leaf (a gang without one takes empty nodes anywhere).
        services = list(self.index.stormservices_in_play().values()) if self.keep_runs else []
        self._warned &= {_generation(s) for s in services}
        replicas = frozenset(
            shape for s in services if is_opted_in(s["metadata"].get("annotations")) and (shape := _shape(s, self._warned))
        )
        # A node's allocatable GPUs change the list too (a device plugin registering late, a GPU lost).
        planned = (self.index.hypernode_changes, tuple(sorted(used.items())), tuple(sorted(taking.items())), replicas)
        if planned == self._planned:
            return  # nothing moved since the last plan was carried out
        writes = plan_node_tier(
            list(self.index.hypernodes.values()),
            used,
            taking,
            replicas=replicas,  # the rest of the rule: plan_node_tier's defaults
            # The labels labelMatch members read (Index.node_label_keys); none read yet: such members may
            # select any node, and no node they might select is listed.
            node_labels=dict(self.index.nodes) if self.index.nodes else None,
            named_leaves=self.named_leaves,
        )
        if writes and not self.leading():  # lost while the room was read (each read may wait on a slow API server)
            return
        if writes:
            log.info("node tier: %d HyperNode writes", len(writes))
            await self._execute(writes)
        self._planned = planned  # only once written: a failed write is planned again at the next pass

    async def _execute(self, writes: list[Write]) -> None:
        """Carry out the writes; a refused one is said as a Warning Event on its HyperNode (where an
        admin looks: `kubectl describe hypernode`), once per kind of refusal, then left to the loop."""
        try:
            await execute_hypernode_writes(self.api, writes)
        except HyperNodeWritesRefused as refused:
            said = {}
            for name, kind, why in refused.refusals:
                said[name] = kind
                if self._refused.get(name) != kind and self.report is not None:
                    hypernode = self.index.hypernodes.get(name) or {"metadata": {"name": name}}
                    body = {"apiVersion": "topology.volcano.sh/v1alpha1", "kind": "HyperNode", **hypernode}
                    self.report(body, "Warning", "NodeTierWriteRefused", f"the node tier's {kind} of HyperNode {name} was refused: {why}")
            self._refused = said
            raise
        self._refused = {}
