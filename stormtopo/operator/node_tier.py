"""Keeping the node tier's short list current (--node-tier): every pass, the leader takes the
GPUs in use per node (the free-room reading, room.py, which follows pods and nodes by watch) and the
HyperNodes, and writes what core/topology/node_tier.py plans, so that the tier-0 HyperNodes follow pods
as they come and go. A steady state plans nothing and writes nothing, and reads nothing from the API
server: the readings are current to the last event (no list of every pod at rest).

Once a pod of an opted-in service is bound or gone (the index sees it within milliseconds), the loop is
woken (at most twice a second while replicas are being placed, NODE_TIER_MIN_GAP); a change of another
tenant's pods is planned over at the next pass (NODE_TIER_INTERVAL)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from stormtopo.core.node_tier_pass import NodeTierMemory, NodeTierPlan, NodeTierReading, plan_off, plan_pass, refusals_to_say
from stormtopo.kube.client import Api
from stormtopo.operator.events import Report
from stormtopo.operator.index import Index
from stormtopo.operator.room import NodeRoom
from stormtopo.operator.writer import HyperNodeWritesRefused, execute_hypernode_writes

log = logging.getLogger("stormtopo.node_tier")
NODE_TIER_INTERVAL = 1.0  # seconds between two passes unless woken; a pass with nothing new reuses the cached readings
NODE_TIER_OFF_INTERVAL = 5.0  # seconds between two looks, node tier off, at whether a leaf still names one of its HyperNodes
NODE_TIER_MIN_GAP = 0.5  # seconds between the starts of two woken passes: at most two fresh readings a second


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
    # Reads the nodes' labels into the index when the tree depends on them (labelMatch, regexMatch members):
    # operator/replica.py read_nodes, from the free-room reading, the one owner of node labels.
    read_nodes: Callable[[], Awaitable[None]] | None = None
    _memory: NodeTierMemory = field(default_factory=NodeTierMemory)  # as the planners returned it (core/node_tier_pass.py)
    # Its passes are planned here (at 16,384 nodes a pass where anything moved is 150 to 190 ms): on the event loop
    # they would hold every admission that long; in asyncio's default pool, a worker the API calls need.
    _planner: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="node-tier-planner"))

    async def check(self) -> None:
        """One pass (a loop of the operator runs it every NODE_TIER_INTERVAL); an exception goes to the
        loop, which logs it and backs off."""
        if not self.leading():
            return
        if not self.enabled:
            hypernodes = tuple(self.index.hypernodes.values())
            plan = await self._planned(plan_off, hypernodes, self.index.hypernode_changes, self._memory)
            if plan.writes:
                log.info("node tier off: %d HyperNode writes put the leaves back", len(plan.writes))
            await self._carry_out(plan)
            return
        if self.read_nodes is not None and self.index.selects_by_label():
            await self.read_nodes()  # (the tree over the labels its HyperNodes' selectors read now)
        # Nodes that take new pods only: no other node is listed.
        free = await self.room.free_gpus(taking_new_pods=True)
        allocatable = await self.room.allocatable_gpus()
        reading = NodeTierReading(
            tuple(self.index.hypernodes.values()),  # (planned on a thread: the watch goes on changing the index's)
            self.index.hypernode_changes,
            free,
            allocatable,
            tuple(self.index.stormservices_in_play().values()) if self.keep_runs else (),
            # The labels labelMatch members read (every node's, as the free-room reading holds them).
            node_labels=self._node_labels(),
            node_reads=self.index.node_reads,
            named_leaves=self.named_leaves,
            keep_runs=self.keep_runs,
        )
        plan = await self._planned(plan_pass, reading, self._memory)
        self._memory = plan.memory
        for line in plan.said:
            log.warning("node tier: %s", line)
        if plan.writes and not self.leading():  # lost while the room was read (each read may wait on a slow API server)
            return
        if plan.writes:
            log.info("node tier: %d HyperNode writes", len(plan.writes))
        await self._carry_out(plan)

    async def _planned(self, planner: Callable[..., NodeTierPlan], *args: object) -> NodeTierPlan:
        return await asyncio.get_running_loop().run_in_executor(self._planner, planner, *args)

    def _node_labels(self) -> Mapping[str, Mapping[str, str]] | None:
        """The labels labelMatch members read; None (planned blind: such a member may select any node, and no
        node it might select is listed) while none are read."""
        return self.index.nodes or None

    async def _carry_out(self, plan: NodeTierPlan) -> None:
        """The plan's writes; what they were planned over is remembered only once written, so that a failed
        write is planned again at the next pass. A refused one is said as a Warning Event on its HyperNode
        (where an admin looks: `kubectl describe hypernode`), once per kind of refusal, then left to the loop."""
        if plan.planned is None:
            return
        try:
            if plan.writes:
                await execute_hypernode_writes(self.api, list(plan.writes))
        except HyperNodeWritesRefused as refused:
            say, self._memory = refusals_to_say(refused.refusals, self._memory)
            for name, kind, why in say:
                if self.report is not None:
                    hypernode = self.index.hypernodes.get(name) or {"metadata": {"name": name}}
                    body = {"apiVersion": "topology.volcano.sh/v1alpha1", "kind": "HyperNode", **hypernode}
                    self.report(body, "Warning", "NodeTierWriteRefused", f"the node tier's {kind} of HyperNode {name} was refused: {why}")
            raise
        self._memory = plan.carried_out(self._memory)
