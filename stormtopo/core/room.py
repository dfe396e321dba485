"""Making room: a wide replica that no domain of its tier can hold now gets one, by moving a replica of
another StormService that lends room out of the way.

Lending is the lender's choice, and costs it at most one replica at a time: only a service that opted in
(`stormtopo.io/lend-room: "true"`, with healing) is ever moved for another, never below max(1, replicas
- 1) ready replicas, and a service with one replica never (core/lending.py lends_room, core/disruption.py lender_budget);
a service never makes room for its own wide replica. One move to make room per wide replica within the
cool-down, read back from the lenders' move records (core/lending.py room_made_for), so that a new
leader does not make room again for a replica the last one already made room for.

In a fragmented cluster the room a wide replica needs is often there in pieces: a leaf would hold it
but for a small replica that would fit in another leaf as well. Healing alone moves a replica only into
room that exists; this finds the one smaller replica (a *resident*) whose move makes room, as KAI's
consolidation moves running jobs for pending ones. The resident stays within its own tier: it moves
from one domain of that tier to another.

Volcano, not stormtopo, places the resident again, and its HyperNode binpack sends a gang to the
fullest domain that holds it: `(used + the gang's requests) / allocatable`, 0 where that exceeds 1 (on
GPUs here; Volcano v1.15.1, network_topology_aware.go getSubJobHyperNodeBinPackingScore). AIBrix
re-creates evicted pods at once, so Volcano may place them while the old ones still terminate, and then
it counts the old pods twice: as used where they are, and in the gang's requests (it sums every task of
the gang); a tie goes to the domain holding the gang's tasks (scoreWithTaskNum), then to Go map order.
Or it places them once the old ones are gone. So a resident is chosen only where, in both views, its old
domain cannot hold it again or scores surely lower than where it goes; otherwise it goes straight back
(as it did on the local control plane, every time, before this was modelled), and the room closes.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from stormtopo.core.packing import DomainFit, domains_at_tier
from stormtopo.core.topology.tree import Topology

RESIDENTS_TRIED = 24  # of those near enough to help, smallest first: packing searches are ~ms each


@dataclass(frozen=True)
class Resident:
    """A replica of a StormService that lends room, bound within its tier, that may be moved to make room."""

    namespace: str
    stormservice: str
    replica: str
    held: Mapping[str, int]  # GPUs per node its pods hold
    pods: tuple[int, ...]  # GPUs per pod
    tier: int  # the tier it must stay within
    priority: int = 0  # its gang's priority (core/priority.py): never moved for a replica of lower priority


@dataclass(frozen=True)
class Room:
    resident: Resident
    to: DomainFit  # where Volcano places the resident once it has left
    frees: DomainFit  # the domain that then holds the wide replica


def freed(free: Mapping[str, int], held: Mapping[str, int]) -> dict[str, int]:
    """Free GPUs once a replica holding `held` has left (a node left out of `free` is not schedulable)."""
    out = dict(free)
    for node, gpus in held.items():
        if node in out:
            out[node] += gpus
    return out


def volcano_choices(
    topology: Topology,
    free: Mapping[str, int],
    allocatable: Mapping[str, int],
    pods: Sequence[int],
    tier: int,
    terminating: Mapping[str, int] | None = None,
) -> list[tuple[float, DomainFit]]:
    """Where Volcano may place a gang held within `tier`: the domains of the lowest tier that hold its
    `pods` now, each with its HyperNode binpack score, best first (Volcano takes the best). The gang's
    old pods still `terminating` (GPUs per node, counted used in `free`) count in its request again.
    `allocatable`: GPUs per node (a node not in it: its size in the tree)."""
    request = sum(pods) + sum((terminating or {}).values())
    for t in range(1, tier + 1):
        fitting = [d for d in domains_at_tier(topology, free, pods, t) if d.fits]
        if fitting:
            scored = []
            for d in fitting:
                size = sum(allocatable.get(n, topology.nodes[n].gpus) for n in d.free_per_node) or 1
                used = size - d.free_gpus
                scored.append((0.0 if used + request > size else (used + request) / size, d))
            return sorted(scored, key=lambda sd: (-sd[0], sd[1].switch.name))
    return []


def placed_elsewhere(
    topology: Topology, free: Mapping[str, int], allocatable: Mapping[str, int], pods: Sequence[int], tier: int, held: Mapping[str, int]
) -> DomainFit | None:
    """The domain Volcano places a gang evicted from the nodes it `held` in (its old pods counted in
    `free` as used), if that is surely not the domain it leaves, whether its old pods still terminate
    or are gone: None where it may go back (the best, or tied with it, in either view)."""
    chosen = None
    for view, terminating in ((free, held), (freed(free, held), {})):
        choices = volcano_choices(topology, view, allocatable, pods, tier, terminating)
        if not choices:
            return None
        best = choices[0][0]
        if any(score >= best and any(n in d.free_per_node for n in held) for score, d in choices):
            return None
        chosen = chosen or choices[0][1]
    return chosen


def take(free: Mapping[str, int], domain: DomainFit, pods: Sequence[int]) -> dict[str, int] | None:
    """Free GPUs once `pods` are placed in `domain`, each on the node with the least room that holds it;
    None if this greedy placement cannot place them all (the packing search may have found a way)."""
    out = dict(free)
    for gpus in sorted(pods, reverse=True):
        fitting = [n for n in domain.free_per_node if out.get(n, 0) >= gpus]
        if not fitting:
            return None
        node = min(fitting, key=lambda n: (out[n], n))
        out[node] -= gpus
    return out


def room_by_moving(
    pods: Sequence[int],
    held: Mapping[str, int],
    tier: int,
    residents: Sequence[Resident],
    free: Mapping[str, int],
    allocatable: Mapping[str, int],
    topology: Topology,
    skip: Collection[str] = (),
    listed: Collection[str] = (),
    priority: int | None = None,
) -> Room | None:
    """The smallest resident whose move makes room within `tier` for a wide replica (its `pods`, and the
    GPUs it `held`, free once it moves too), with where the resident goes; None if no single one does.
    The resident moves first, while the wide replica still holds its GPUs: it goes where there is room
    now; the wide replica then fits in what both leave. Residents near enough to help are searched, at
    most RESIDENTS_TRIED of them; `skip`: residents (namespace/stormservice/replica) not to offer.
    `listed`: the nodes the node tier lists as tier-0 HyperNodes; a resident on one is not offered:
    where Volcano places it again is then decided over tier 0 too, which this prediction does not model.
    `priority`: the wide replica's; a resident of higher priority is never moved for it (GPU clusters run
    inference above batch: room is made by the less important for the more, or among equals)."""
    need = sum(pods)
    both_gone = freed(free, held)
    near = [
        r
        for r in sorted(residents, key=lambda r: (sum(r.pods), r.namespace, r.stormservice, r.replica))
        if resident_key(r) not in skip
        and not set(r.held) & set(listed)
        and (priority is None or r.priority <= priority)
        and _could_help(topology, both_gone, r, need, tier)
    ]
    for resident in near[:RESIDENTS_TRIED]:
        to = placed_elsewhere(topology, free, allocatable, resident.pods, resident.tier, resident.held)
        if to is None:
            continue  # nowhere else to go, or (maybe) straight back where it was
        moved = take(freed(free, resident.held), to, resident.pods)
        if moved is None:
            continue
        placed = freed(moved, held)
        for t in range(1, tier + 1):
            domains = domains_at_tier(topology, placed, pods, t)
            if domains and domains[0].fits:
                return Room(resident, to, domains[0])
    return None


def resident_key(resident: Resident) -> str:
    return f"{resident.namespace}/{resident.stormservice}/{resident.replica}"


def _could_help(topology: Topology, free: Mapping[str, int], resident: Resident, need: int, tier: int) -> bool:
    """A cheap first look: some domain within `tier` around the resident has as many free GPUs as the
    wide replica needs once the resident has left."""
    for node in resident.held:
        if node not in topology.nodes:
            return False
    for node in resident.held:
        for switch in topology.ancestors(node):
            if topology.switches[switch].tier > tier:
                break
            under = topology.nodes_under(switch)
            if sum(free.get(n, 0) for n in under) + sum(g for n, g in resident.held.items() if n in under) >= need:
                return True
    return False
