"""What a planner decides to write: plain values the operator's shell executes, in order.

Planners return these instead of calling the API, so every decision is a pure function that unit
tests can check without a cluster.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CreatePodGroup:
    body: Mapping[str, Any]


@dataclass(frozen=True)
class PatchPodGroup:
    namespace: str
    name: str
    ops: Sequence[Mapping[str, Any]]  # JSON patch


@dataclass(frozen=True)
class LabelPod:
    namespace: str
    name: str
    labels: Mapping[str, str]


@dataclass(frozen=True)
class PatchPod:
    namespace: str
    name: str
    ops: Sequence[Mapping[str, Any]]  # JSON patch


@dataclass(frozen=True)
class AdoptPod:
    """Take a running pod into its replica's gang as stormtopo would have admitted it: its StormService
    opted in after the pod was created. Metadata only: its Volcano task and gang, and the admitted label."""

    namespace: str
    name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]


@dataclass(frozen=True)
class RecordPlacement:
    """Set one replica's record in its StormService's placement annotation, dropping replicas that no
    longer exist (`live`); merged into the stored value, so concurrent records of two replicas both stay."""

    namespace: str
    stormservice: str
    replica: str
    record: Mapping[str, object]
    live: Sequence[str]


@dataclass(frozen=True)
class RecordMove:
    """Set one replica's last move in its StormService's moves annotation. Conditional on the version
    the plan was made from (`resource_version`): the move table is what keeps moves one at a time and
    apart by their cool-down, so it is written only over what was read, never merged blindly."""

    namespace: str
    stormservice: str
    replica: str
    record: Mapping[str, object]
    live: Sequence[str]
    resource_version: str | None = None


@dataclass(frozen=True)
class EvictPod:
    """Evict a pod through the Eviction API, which honours its PodDisruptionBudgets (a refusal is an error).
    `uid`: the pod decided on; another pod of the same name since (AIBrix reuses a stateful role's pod
    names) is never evicted in its place."""

    namespace: str
    name: str
    uid: str = ""


@dataclass(frozen=True)
class Victim:
    """A pod to preempt, as the free-room reading knows it: on this node, holding these GPUs, at this priority."""

    node: str
    gpus: int
    priority: int
    gang: str | None = None  # "namespace/PodGroup" of its Volcano gang, where it names one


@dataclass(frozen=True)
class PreemptPods:
    """Evict, for replica `replica`, one pod per victim: a bound pod on its node that Volcano may preempt,
    with its GPUs, priority and gang (core/preempting.py). Through the Eviction API, by uid. A victim
    refused or gone is skipped (Volcano's own preemption takes what is still missing), and the writes after
    it (the replica's release) are carried out whatever happened here."""

    namespace: str
    replica: str
    victims: tuple[Victim, ...]
    namespaces: tuple[str, ...] | None = None  # the only namespaces a victim may be in (None: any)


@dataclass(frozen=True)
class DeleteUnboundPod:
    """Delete a pod that no node runs, so that its owner makes it again (a spread replica held once more:
    core/spread.py). Only at the version read: a pod bound meanwhile is never deleted (the Conflict is
    left to the next plan, which sees it bound); the chart's policy refuses a bound pod all the same."""

    namespace: str
    name: str
    resource_version: str


@dataclass(frozen=True)
class ListOptedIn:
    """What the opted-in list (the outage policy's parameter) says of a StormService: its scope, or
    nothing (None: unlisted)."""

    namespace: str
    stormservice: str
    scope: str | None


@dataclass(frozen=True)
class Say:
    """An Event on the StormService the plan is about."""

    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True)
class PostEvent:
    """An Event on `about` (the StormService a plan is about)."""

    about: Mapping[str, Any]
    say: Say


@dataclass(frozen=True)
class CreateHyperNode:
    """A tier-0 HyperNode of the node tier (an existing one of that name is left as it is)."""

    body: Mapping[str, Any]


@dataclass(frozen=True)
class SetHyperNodeMembers:
    """Replace a leaf's members (a merge patch of spec.members: the rest of the HyperNode is not touched),
    only if the leaf is still at `resource_version` (what the plan read): another writer's change in
    between is kept, and the leaf planned again."""

    name: str
    members: Sequence[Mapping[str, Any]]
    resource_version: str | None = None


@dataclass(frozen=True)
class DeleteHyperNode:
    """Delete a tier-0 HyperNode of the node tier that no leaf names any more (one gone already is fine),
    at the version read: one changed since (by another writer) is not deleted, and read again next pass."""

    name: str
    resource_version: str | None = None


Write = (
    CreatePodGroup
    | PatchPodGroup
    | LabelPod
    | PatchPod
    | AdoptPod
    | RecordPlacement
    | RecordMove
    | EvictPod
    | PreemptPods
    | DeleteUnboundPod
    | ListOptedIn
    | PostEvent
    | CreateHyperNode
    | SetHyperNodeMembers
    | DeleteHyperNode
)
