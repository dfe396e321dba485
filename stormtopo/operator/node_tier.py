"""Keeping the node tier's short list current (--node-tier, issue 21): every pass, the leader reads the
GPUs in use per node and the HyperNodes, and writes what core/topology/node_tier.py plans, so that the
tier-0 HyperNodes follow pods as they come and go. A steady state plans nothing and writes nothing."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from stormtopo.core.topology.node_tier import plan_node_tier
from stormtopo.kube.client import Api
from stormtopo.operator.explainer import Explainer
from stormtopo.operator.index import Index
from stormtopo.operator.writer import execute

log = logging.getLogger("stormtopo.node_tier")
NODE_TIER_INTERVAL = 2.0  # seconds between two passes; the GPU readings it uses are cached for FREE_GPUS_TTL


@dataclass
class NodeTier:
    index: Index  # its HyperNodes, as the watch has them (the node tier's own included)
    api: Api
    explainer: Explainer  # its worker reads every node's free and allocatable GPUs
    leading: Callable[[], bool] = lambda: True

    async def check(self) -> None:
        """One pass (a loop of the operator runs it every NODE_TIER_INTERVAL); an exception goes to the
        loop, which logs it and backs off."""
        if not self.leading():
            return
        free = await self.explainer.free_gpus()  # nodes that take new pods only: no other node is listed
        allocatable = await self.explainer.allocatable_gpus()
        taking = {node: gpus for node, gpus in allocatable.items() if node in free}
        used = {node: gpus - free[node] for node, gpus in taking.items()}
        writes = plan_node_tier(list(self.index.hypernodes.values()), used, taking)
        if writes:
            log.info("node tier: %d HyperNode writes", len(writes))
            await execute(self.api, writes)
