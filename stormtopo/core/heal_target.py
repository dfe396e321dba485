"""Where a replica may move: the free GPUs of the nodes its pods could run on (room_of, room_for), the
best domain within its tier that holds the whole replica now (_room), and the domain a move to make room
leaves (domain_left).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from stormtopo.core.heal_snapshot import HealSnapshot
from stormtopo.core.node_fit import NodeFacts, nodes_for, without_pins
from stormtopo.core.packing import DomainFit, domains_at_tier
from stormtopo.core.replica_pods import Replica
from stormtopo.core.room import freed
from stormtopo.core.topology.tree import Topology


def room_of(free: Mapping[str, int], nodes: Mapping[str, NodeFacts] | None, replica: Replica) -> Mapping[str, int]:
    """The free GPUs of the nodes the replica's pods could run on (their taints, selectors, affinity and
    every other resource they request: core/node_fit.py), as Volcano's predicates would leave them.
    `nodes` None: not read, every node counts."""
    if nodes is None:
        return free
    specs = [without_pins(p.get("spec") or {}) for p in replica.live()]
    eligible = nodes_for(specs, nodes, replica.requests_by_node())
    return {node: gpus for node, gpus in free.items() if node in eligible}


def room_for(snapshot: HealSnapshot, replica: Replica) -> Mapping[str, int]:
    return room_of(snapshot.free, snapshot.nodes, replica)


def domain_left(topology: Topology, nodes: Sequence[str], tier: int) -> str | None:
    """The domain of `tier` that holds `nodes` (a replica within its tier): what a move to make room leaves."""
    if not nodes or nodes[0] not in topology.nodes:
        return None
    at = [s for s in topology.ancestors(nodes[0]) if topology.switches[s].tier == tier]
    return at[0] if at and all(n in topology.nodes_under(at[0]) for n in nodes) else None


def _room(snapshot: HealSnapshot, replica: Replica, tier: int, elsewhere: bool = False) -> DomainFit | None:
    """The best domain within `tier` that holds the whole replica now, counting what it holds itself
    as free (it leaves those nodes when it moves); lowest tier first. `elsewhere` (a stranded replica):
    not a domain with its running pods in it, where it is stuck already."""
    free = freed(room_for(snapshot, replica), replica.gpus_by_node())
    stuck_on = set(replica.nodes()) if elsewhere else set()
    for t in range(1, tier + 1):
        domains = domains_at_tier(snapshot.topology, free, replica.wanted(), t)  # those that fit first
        domains = [d for d in domains if not stuck_on & set(snapshot.topology.nodes_under(d.switch.name))]
        if domains and domains[0].fits:
            return domains[0]
    return None
