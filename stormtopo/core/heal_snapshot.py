"""What one StormService's healing plan reads (HealSnapshot): the StormService as the API server has it,
its replicas with their pods and PodGroups, the room and the moves under way in the cluster, the
PodDisruptionBudgets of its namespace, and the shell's order to make room, if any.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from stormtopo.core.cluster_moves import MAX_MOVING
from stormtopo.core.cooldown import COOLDOWN, NO_ROOM_RECHECK
from stormtopo.core.heal_request import tier_to_heal
from stormtopo.core.lending import MakeRoom
from stormtopo.core.node_fit import NodeFacts
from stormtopo.core.replica_pods import Replica
from stormtopo.core.request import ClusterTiers, TopologyRequest, valid_request
from stormtopo.core.stranded import STRANDED_AFTER
from stormtopo.core.topology.tree import Topology


@dataclass(frozen=True)
class HealSnapshot:
    """A StormService that may heal, read now: the StormService as the API server has it (the moves
    record decides what may move), its replicas with all their pods and PodGroups, every node's free
    GPUs (schedulable nodes only), and the PodDisruptionBudgets of its namespace."""

    stormservice: Mapping[str, Any]
    replicas: tuple[Replica, ...]
    tiers: ClusterTiers
    topology: Topology
    free: Mapping[str, int]  # free GPUs per schedulable node, counting every bound pod of the cluster
    budgets: tuple[Mapping[str, Any], ...] = ()
    now: float = 0.0  # wall-clock seconds (the cool-down is recorded on the StormService, across restarts)
    cooldown: float = COOLDOWN
    podgroups: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # replica -> its PodGroup
    recheck: float = NO_ROOM_RECHECK  # seconds before a service with nowhere to go is read again
    make_room: MakeRoom | None = None
    allocatable: Mapping[str, int] = field(default_factory=dict)  # GPUs per node (else its size in the tree)
    # Replicas of other StormServices moving now (moving_in_cluster), and how many may move at once.
    moving_elsewhere: int = 0
    max_moving: int = MAX_MOVING
    # Per node, what decides whether the replica's pods may run there, GPUs aside (taints, labels, other
    # resources left; core/node_fit.py); None: not read, every node in `free` counts.
    nodes: Mapping[str, NodeFacts] | None = None
    stranded_after: float = STRANDED_AFTER  # --heal-stranded-after

    @property
    def request(self) -> TopologyRequest | None:
        return valid_request(self.stormservice, self.tiers)

    @property
    def healing_tier(self) -> int | None:
        """The tier its replicas must be within, if it opted in to healing."""
        return tier_to_heal(self.stormservice, self.tiers, self.topology, opted_in_only=True)
