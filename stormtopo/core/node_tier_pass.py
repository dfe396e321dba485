"""One pass of the node tier, planned as the other paths are: what the leader read (NodeTierReading) and
what it remembers of the last pass (NodeTierMemory) in; the HyperNode writes, what to say, and the memory
to keep out. operator/node_tier.py reads, calls these, says and writes, and keeps what they return.

A steady state plans nothing: a pass over the same readings as the last one carried out (its HyperNodes'
version, the GPUs in use and allocatable per node, the shapes of the replicas) returns no writes. What is
said (a named leaf that cannot be used, a template without a GPU count, a refused write) is said once per
change, not every pass."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from stormtopo.core.gang import replica_pods, template_spec
from stormtopo.core.request import is_opted_in
from stormtopo.core.topology.node_tier import plan_node_tier, unusable_named_leaves
from stormtopo.core.writes import Write

Generation = tuple[str, str, str]  # (namespace, name, generation): one template of one StormService


@dataclass(frozen=True)
class NodeTierMemory:
    """What the node tier keeps from one pass to the next."""

    planned: tuple[object, ...] | None = None  # what the last pass carried out was planned over
    unusable: Mapping[str, str] = field(default_factory=dict)  # named leaves it cannot change, as last said
    # Templates whose GPU count could not be read, said once each; kept only for the services still in play.
    warned: frozenset[Generation] = frozenset()
    refused: Mapping[str, str] = field(default_factory=dict)  # HyperNode -> the kind of refusal last said


@dataclass(frozen=True)
class NodeTierReading:
    """What one pass reads: the HyperNodes as the watch has them, and the GPUs per node from the free-room
    reading (`free`: nodes that take new pods only)."""

    hypernodes: Collection[Mapping[str, Any]]  # (a tuple of the index's: planned on a thread while the watch goes on)
    hypernode_changes: int  # the index's count of HyperNode changes: the tree's version
    free: Mapping[str, int] = field(default_factory=dict)
    allocatable: Mapping[str, int] = field(default_factory=dict)
    stormservices: tuple[Mapping[str, Any], ...] = ()  # in play, read only with keep_runs
    node_labels: Mapping[str, Mapping[str, str]] | None = None  # what labelMatch members read; None: not read yet
    node_reads: int = 0  # their version: labels read anew that changed plan the list again
    named_leaves: frozenset[str] = frozenset()  # --node-tier-leaf
    keep_runs: bool = False  # --node-tier-keep-runs


@dataclass(frozen=True)
class NodeTierPlan:
    memory: NodeTierMemory  # to keep now, written or not
    writes: tuple[Write, ...] = ()
    said: tuple[str, ...] = ()  # warnings for the log
    planned: tuple[object, ...] | None = None  # to remember once the writes are carried out; None: nothing new

    def carried_out(self, memory: NodeTierMemory) -> NodeTierMemory:
        """Once its writes are done: what it was planned over is remembered (a write that failed is planned
        again at the next pass), and the refusals said are forgotten once a write went through."""
        return replace(memory, planned=self.planned, refused={} if self.writes else memory.refused)


def generation(stormservice: Mapping[str, Any]) -> Generation:
    meta = stormservice.get("metadata") or {}
    return str(meta.get("namespace")), str(meta.get("name")), str(meta.get("generation"))


def replica_shape(stormservice: Mapping[str, Any]) -> tuple[tuple[int, ...], str | None]:
    """The GPUs of each pod of one replica, or () and why a template gives no count (one such StormService
    must not stop the list for every other)."""
    try:
        return tuple(sorted(replica_pods(template_spec(stormservice)))), None
    except (ValueError, TypeError, AttributeError) as exc:
        return (), str(exc)


def plan_pass(reading: NodeTierReading, memory: NodeTierMemory) -> NodeTierPlan:
    """The node tier on: the writes that keep each leaf's short list current, if anything moved since the
    last pass carried out."""
    said: list[str] = []
    unusable = unusable_named_leaves(reading.hypernodes, reading.named_leaves, reading.allocatable.keys())
    if unusable != memory.unusable:
        said += [f"--node-tier-leaf={name} is not used: {why}" for name, why in unusable.items()]
    taking = {node: gpus for node, gpus in reading.allocatable.items() if node in reading.free}
    used = {node: gpus - reading.free[node] for node, gpus in taking.items()}
    # The shapes of the replicas that ask for a topology: whether one needs a run of empty nodes in one
    # leaf (a gang without one takes empty nodes anywhere).
    services = reading.stormservices if reading.keep_runs else ()
    warned = memory.warned & {generation(s) for s in services}
    shapes = set()
    for stormservice in services:
        if not is_opted_in(stormservice["metadata"].get("annotations")):
            continue
        shape, problem = replica_shape(stormservice)
        if problem is not None and (key := generation(stormservice)) not in warned:
            warned |= {key}
            said.append(f"StormService {key[0]}/{key[1]}: no GPU count in its template ({problem})")
        if shape:
            shapes.add(shape)
    memory = replace(memory, unusable=unusable, warned=warned)
    # A node's allocatable GPUs change the list too (a device plugin registering late, a GPU lost).
    planned = (reading.hypernode_changes, reading.node_reads, tuple(sorted(used.items())), tuple(sorted(taking.items())), frozenset(shapes))
    if planned == memory.planned:
        return NodeTierPlan(memory, said=tuple(said))  # nothing moved since the last plan was carried out
    writes = plan_node_tier(
        list(reading.hypernodes),
        used,
        taking,
        replicas=frozenset(shapes),  # the rest of the rule: plan_node_tier's defaults
        # No labels read yet: labelMatch members may select any node, and no node they might select is listed.
        node_labels=dict(reading.node_labels) if reading.node_labels else None,
        named_leaves=reading.named_leaves,
    )
    return NodeTierPlan(memory, tuple(writes), tuple(said), planned)


def plan_off(hypernodes: Iterable[Mapping[str, Any]], hypernode_changes: int, memory: NodeTierMemory) -> NodeTierPlan:
    """The node tier off (or never on): every leaf gets its nodes back and the tier-0 HyperNodes go, from
    the HyperNodes alone, once per change of them."""
    planned = (hypernode_changes,)
    if planned == memory.planned:
        return NodeTierPlan(memory)
    return NodeTierPlan(memory, tuple(plan_node_tier(list(hypernodes), {}, {}, enabled=False)), planned=planned)


def refusals_to_say(refusals: Iterable[tuple[str, str, str]], memory: NodeTierMemory) -> tuple[list[tuple[str, str, str]], NodeTierMemory]:
    """Of the writes refused (HyperNode, kind of write, why), those to say: once per kind of refusal of a
    HyperNode, until a pass writes without one."""
    said = {name: kind for name, kind, _ in refusals}
    new = [(name, kind, why) for name, kind, why in refusals if memory.refused.get(name) != kind]
    return new, replace(memory, refused=said)
