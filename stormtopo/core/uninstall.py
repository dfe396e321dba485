"""Leaving the cluster as it was: what stormtopo wrote that changes scheduling, and the
writes that take it back when stormtopo is uninstalled or stopped for good.

- pods held at stormtopo's scheduling gate: the gate removed (they are scheduled as without stormtopo);
- PodGroups held `hard` by a move of healing: back to what their StormService asks (nothing, if it asks
  for nothing valid any more); held by a soft replica's narrowing (core/narrowing.py): back to the request
  the PodGroup records;
- the node tier: every leaf gets its nodes back, then the tier-0 HyperNodes go.

Everything else stormtopo wrote either follows its owner (its PodGroups are owned by their RoleSet) or
changes no scheduling (the placement labels and annotations). A planner over one snapshot, as the
others: the shell (operator/uninstall.py) reads and executes. It reads the cluster a page at a time
(plan_uninstall_in_pages): the uninstall holds one page of pods or PodGroups, the StormServices with a
move under way and their RoleSets, and the HyperNodes, never every pod of a large cluster.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stormtopo.core.jsonpatch import set_spec_fields
from stormtopo.core.moves import recorded_moves, released_topology
from stormtopo.core.narrowing import released_narrowing
from stormtopo.core.podgroup import desired_fields, withdraw
from stormtopo.core.request import ClusterTiers, RequestError, Scope, TopologyRequest, request_of
from stormtopo.core.topology.node_tier import plan_node_tier
from stormtopo.core.vocabulary import ROLESET_LABEL, STORMSERVICE_LABEL, STORMTOPO_GATES
from stormtopo.core.writes import PatchPod, PatchPodGroup, Write


@dataclass(frozen=True)
class ClusterSnapshot:
    hypernodes: tuple[Mapping[str, Any], ...]
    pods: tuple[Mapping[str, Any], ...]  # stormtopo's admitted pods (the only ones it may have gated)
    stormservices: tuple[Mapping[str, Any], ...]
    rolesets: tuple[Mapping[str, Any], ...]
    podgroups: tuple[Mapping[str, Any], ...]
    tiers: ClusterTiers


@dataclass(frozen=True)
class ClusterPages:
    """What the uninstall reads, each list a page at a time (iterables of pages, read as they are planned)."""

    hypernodes: tuple[Mapping[str, Any], ...]
    pods: Iterable[Sequence[Mapping[str, Any]]]  # stormtopo's admitted pods (the only ones it may have gated)
    stormservices: Iterable[Sequence[Mapping[str, Any]]]
    rolesets: Iterable[Sequence[Mapping[str, Any]]]
    podgroups: Iterable[Sequence[Mapping[str, Any]]]
    tiers: ClusterTiers


def plan_uninstall(snapshot: ClusterSnapshot) -> list[Write]:
    """Gates first (a held pod waits for nobody once stormtopo is gone), then the holds (narrowings, moves), then
    the node tier's HyperNodes (leaves before the tier-0 HyperNodes they name)."""
    one_page = ClusterPages(
        snapshot.hypernodes, [snapshot.pods], [snapshot.stormservices], [snapshot.rolesets], [snapshot.podgroups], snapshot.tiers
    )
    return [write for batch in plan_uninstall_in_pages(one_page) for write in batch]


def plan_uninstall_in_pages(cluster: ClusterPages) -> Iterator[list[Write]]:
    """plan_uninstall, a batch of writes per page read: what it keeps beyond one page is the StormServices
    with a move under way and their RoleSets (only their PodGroups can be held by a move), and the HyperNodes;
    a narrowing is judged from its PodGroup alone."""
    for pods in cluster.pods:
        if gates := release_gates(pods):
            yield list(gates)
    moving = tuple(s for page in cluster.stormservices for s in page if _moving(s))
    rolesets: tuple[Mapping[str, Any], ...] = ()
    if moving:
        keys = {(s["metadata"].get("namespace"), s["metadata"]["name"]) for s in moving}
        rolesets = tuple(
            r
            for page in cluster.rolesets
            for r in page
            if (r["metadata"].get("namespace"), (r["metadata"].get("labels") or {}).get(STORMSERVICE_LABEL)) in keys
        )
    for podgroups in cluster.podgroups:
        holds = release_narrowings(podgroups)
        if moving:
            holds += release_holds(ClusterSnapshot((), (), moving, rolesets, tuple(podgroups), cluster.tiers))
        if holds:
            yield list(holds)
    if node_tier := plan_node_tier(cluster.hypernodes, {}, {}, enabled=False):
        yield list(node_tier)


def _moving(service: Mapping[str, Any]) -> bool:
    """A move recorded on it and not settled: the only StormServices whose PodGroups a move may hold."""
    return any(not (move or {}).get("done") for move in recorded_moves(service).values())


def release_gates(pods: Sequence[Mapping[str, Any]]) -> list[PatchPod]:
    """Remove stormtopo's gates from every pod that still has one (only if it still has it: the test op)."""
    out = []
    for pod in pods:
        gates = (pod.get("spec") or {}).get("schedulingGates") or []
        ours = [(i, g["name"]) for i, g in enumerate(gates) if g.get("name") in STORMTOPO_GATES]
        if not ours:
            continue
        ops: list[dict[str, Any]] = []
        for i, name in reversed(ours):  # the last first: removing one does not move those before it
            ops += [
                {"op": "test", "path": f"/spec/schedulingGates/{i}/name", "value": name},
                {"op": "remove", "path": f"/spec/schedulingGates/{i}"},
            ]
        out.append(PatchPod(pod["metadata"].get("namespace", ""), pod["metadata"]["name"], ops))
    return out


def release_narrowings(podgroups: Iterable[Mapping[str, Any]]) -> list[PatchPodGroup]:
    """Each PodGroup a narrowing holds, back to the request it records: judged from the PodGroup alone, a page at
    a time (its StormService is not needed: the narrowing would end by itself, but no one is left to end it)."""
    out = []
    for podgroup in podgroups:
        released = released_narrowing(podgroup)
        ops = [] if released is None else set_spec_fields(podgroup.get("spec"), {"networkTopology": released})
        if ops:
            meta = podgroup["metadata"]
            out.append(PatchPodGroup(str(meta.get("namespace", "")), meta["name"], ops))
    return out


def release_holds(snapshot: ClusterSnapshot) -> list[PatchPodGroup]:
    """Each replica's PodGroup that a move holds (hard within exactly the move's target tier): what its
    StormService asks without the move; while its request is invalid, its last valid request (as the
    reconciler lets a hold go); asking for nothing, the constraint withdrawn, its request annotation
    first (the admission policy refuses stripping a PodGroup that still carries it)."""
    services = {(s["metadata"].get("namespace"), s["metadata"]["name"]): s for s in snapshot.stormservices}
    rolesets = {(r["metadata"].get("namespace"), r["metadata"]["name"]): r for r in snapshot.rolesets}
    out: list[PatchPodGroup] = []
    for podgroup in snapshot.podgroups:
        meta = podgroup["metadata"]
        labels = meta.get("labels") or {}
        namespace, replica = meta.get("namespace"), labels.get(ROLESET_LABEL) or meta["name"]
        roleset = rolesets.get((namespace, replica))
        service_name = ((roleset or {}).get("metadata", {}).get("labels") or {}).get(STORMSERVICE_LABEL)
        service = services.get((namespace, service_name))
        if service is None or roleset is None or not _held(podgroup, recorded_moves(service).get(replica)):
            continue
        request = request_of(service, snapshot.tiers)
        spec = podgroup.get("spec") or {}
        if isinstance(request, TopologyRequest) and request.scope is Scope.ROLESET:
            ops = set_spec_fields(spec, desired_fields(request, roleset.get("spec") or {}))
        elif isinstance(request, RequestError) and (released := released_topology(podgroup, service, replica)) is not None:
            ops = set_spec_fields(spec, {"networkTopology": released})
        else:
            out += withdraw(str(namespace), podgroup)
            continue
        if ops:
            out.append(PatchPodGroup(str(namespace), meta["name"], ops))
    return out


def _held(podgroup: Mapping[str, Any], move: Mapping[str, Any] | None) -> bool:
    """A move recorded and not settled, and the PodGroup held to its target: hard within exactly its tier
    (the operator that would have let it go is stopped)."""
    tier = (move or {}).get("toTier")
    topology = (podgroup.get("spec") or {}).get("networkTopology") or {}
    return (
        bool(move)
        and not (move or {}).get("done")
        and isinstance(tier, int)
        and not isinstance(tier, bool)
        and topology.get("mode") == "hard"
        and topology.get("highestTierAllowed") == tier
    )
