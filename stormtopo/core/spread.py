"""Spread a StormService's replicas over the domains of one tier, each replica still packed.

With `stormtopo.io/replica-spread-tier: "1"`, one leaf switch failing takes down one replica, not all
of them: replicas go to different HyperNodes of the spread tier while one holds the whole replica within
its own request. When none does, the replica is placed anyway, and a Warning names the domain that now
holds two.

The design, and why (Volcano v1.15.1):

- **The lever is a required node affinity.** Volcano's allocate tries each HyperNode of a hard gang's
  allowed tiers and keeps those where every task passes the predicates
  (pkg/scheduler/actions/allocate/allocate.go, allocateForJob and allocateResourcesForTasks), and the
  predicates plugin runs Kubernetes' NodeAffinity filter (plugins/predicates/predicates.go,
  nodeAffinityEnable, on by default). A replica whose pods may not use the nodes of its siblings' domains
  therefore lands in another domain, the best one by Volcano's own HyperNode scoring; soft gangs are
  placed node by node through the same predicates. PodGroup fields cannot say "not there".
- **Decided when the replica is let go, not at admission.** AIBrix creates the pods of many replicas at
  once (scale 0 to 4): at admission none is placed, so an affinity computed then keeps nothing out, and
  Volcano's binpack puts all four into the fullest leaf. And every operator replica serves the webhook,
  each from its own index: no record they all read is consistent without a write per admission. So
  the webhook only holds every pod of such a replica at stormtopo's scheduling gate (DOMAIN_GATE, the
  gate the chart's admission policy already lets stormtopo remove), and the leader lets replicas go one
  at a time per StormService: a replica is let go once every pod of its gang exists and no sibling is
  settling (let go, not yet bound), with a required node affinity that keeps out the spread-tier domains
  where its siblings' pods are bound. Kubernetes lets a gated pod's affinity be narrowed; the release
  sets it and removes the gate in one patch, as for a router (core/placement.py).
- **Settling is remembered by the leader.** Its index shows a release only once the watch delivers it,
  so the leader keeps each replica it let go (or saw let go) and since when; the shell reads and writes
  that memory around the plan with no await between, so two workers never let two siblings go together.
  A sibling stops counting after SETTLE_SECONDS unbound (it cannot be placed now: the others need not
  wait for it), and its domain is kept out once it is bound.
- **Fewest replicas first, and only while they have room.** The domains kept out are those holding more
  replicas of the service than the least-held domains that have room for the whole replica within its
  own request (a HyperNode of the replica's own tier that packs its gang into the free GPUs,
  core/packing.py). So four replicas over two spines go two and two, a fifth over four full leaves goes
  to any leaf, and a replica goes where it fits rather than wait. Once placed in a domain that holds
  another replica, its Warning names that domain. A rolling update's old replicas count until they are
  deleted: the new ones balance against them, and fill the domains they leave.

- **A replica let go and not placed is held again, once.** The room it was let go for may be gone by
  the time Volcano tries it, or be room by GPUs that a taint or a selector closes. A pod's node affinity
  cannot be widened once its gate is gone, so a replica whose gang Volcano finds unschedulable
  SPREAD_GIVE_UP after it was let go with domains kept out (its pods labelled SPREAD_KEPT_OUT_LABEL by
  the release), none of its gang bound, has its unbound pods deleted (at the version read: never a bound
  one; the chart's policy lets stormtopo delete only unbound pods so labelled). AIBrix makes them
  again, the webhook holds them, and the leader lets them go with no domain kept out, with a Warning
  (ReplicaSpreadUnplaced). The leader remembers such replicas until they are placed (a new leader may
  hold one again once more).

A replacement pod of a replica that is already bound is let go at once, unconstrained: its gang keeps
its domain. What it costs: while the leader is away, a new replica of a spread service waits at the gate;
a scale-up of N replicas takes N placements one after another (a Volcano session and a watch event
each); a node added to a kept-out domain later is not kept out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stormtopo.core.explanation import limit_tier
from stormtopo.core.gang import replica_pods
from stormtopo.core.packing import fits
from stormtopo.core.placement import by_hostname, is_held
from stormtopo.core.replica_pods import Replica
from stormtopo.core.request import TopologyRequest
from stormtopo.core.topology.tree import Topology
from stormtopo.core.vocabulary import DOMAIN_GATE, HOSTNAME_LABEL, SPREAD_KEPT_OUT_LABEL
from stormtopo.core.writes import DeleteUnboundPod, PatchPod, Say

# Seconds a replica that was let go keeps its siblings waiting while it is not bound. Volcano binds a gang
# that fits within a session or two (about a second each); one that waits longer cannot be placed now.
SETTLE_SECONDS = 20.0
# Seconds a replica let go with domains kept out may stay unplaced, its gang unschedulable, before it is
# held again and let go without them: a few of Volcano's retries, each with the cluster as it is then.
SPREAD_GIVE_UP = 60.0


def spread_tier(request: TopologyRequest | None, topology: Topology) -> int | None:
    """The spread tier as a number (a tier name through the HyperNodes' tierNames); None: no spread."""
    if request is None or request.spread is None:
        return None
    return limit_tier(request.spread, topology)


def own_tier(request: TopologyRequest, topology: Topology, spread: int) -> int:
    """The tier within which the replica must fit, for the room check: its own limit (a soft request
    without one: the spread tier), never above the spread tier."""
    own = limit_tier(request.limit, topology)
    return min(own, spread) if own is not None else spread


def domains_of(topology: Topology, nodes: Iterable[str], tier: int) -> set[str]:
    """The HyperNodes of `tier` above these nodes (nodes the tree does not know have none)."""
    out = set()
    for node in nodes:
        if node in topology.nodes:
            out |= {s for s in topology.ancestors(node) if topology.switches[s].tier == tier}
    return out


def replicas_per_domain(topology: Topology, tier: int, placed: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """Every HyperNode of `tier` and the replicas with a pod under it (replica -> its nodes): what
    `stormtopo explain` shows. Empty domains are listed too: they are where the next replica goes."""
    out: dict[str, list[str]] = {s.name: [] for s in topology.switches.values() if s.tier == tier}
    for replica, nodes in sorted(placed.items()):
        for domain in sorted(domains_of(topology, nodes, tier)):
            out.setdefault(domain, []).append(replica)
    return dict(sorted(out.items()))


def settling_since(
    replicas: Iterable[Replica], request: TopologyRequest | None, remembered: Mapping[str, float], now: float
) -> dict[str, float]:
    """The replicas let go and not yet placed, and since when: as remembered (the index may not show a
    release yet), or from now for one the index shows let go that was not remembered (a former leader's)."""
    out = {}
    for replica in replicas:
        if replica.placed(request):
            continue
        if replica.name in remembered:
            out[replica.name] = remembered[replica.name]
        elif replica.let_go(request):
            out[replica.name] = now
    return out


@dataclass(frozen=True)
class SpreadMemory:
    """What the leader keeps of one StormService's spread between plans: its replicas let go and not placed
    yet (-> since when, monotonic), and those held again after a spread that did not place."""

    settling: Mapping[str, float] = field(default_factory=dict)
    unspread: frozenset[str] = frozenset()

    @property
    def empty(self) -> bool:
        return not self.settling and not self.unspread

    def concerns(self, replica: str) -> bool:
        return replica in self.settling or replica in self.unspread

    def without(self, replica: str) -> SpreadMemory:
        """A replica deleted: nothing is kept of it."""
        return SpreadMemory({r: t for r, t in self.settling.items() if r != replica}, self.unspread - {replica})


@dataclass(frozen=True)
class SpreadPlan:
    writes: tuple[PatchPod, ...] = ()
    settling: Mapping[str, float] = field(default_factory=dict)  # the StormService's settling replicas, to remember
    waiting_for: str | None = None  # a sibling still settling
    recheck_in: float | None = None  # seconds until that sibling no longer counts
    kept_out: tuple[str, ...] = ()  # the domains the replica was let go without
    needs_room: bool = False  # the free GPUs are needed to decide: read them and plan again
    # The StormService's replicas to let go without keeping a domain out (held again after a spread that
    # did not place), to remember; None: nothing to remember (no spread tier).
    unspread: frozenset[str] | None = None
    held_again: tuple[DeleteUnboundPod, ...] = ()  # this replica's unbound pods, deleted to be held again
    says: tuple[Say, ...] = ()


def plan_spread(
    request: TopologyRequest | None,
    topology: Topology,
    replica: Replica,
    siblings: Sequence[Replica],
    remembered: Mapping[str, float],
    now: float,
    free: Mapping[str, int] | None = None,
    hostnames: Mapping[str, str] | None = None,
    unschedulable: bool = False,
    unspread: frozenset[str] = frozenset(),
    give_up: float = SPREAD_GIVE_UP,
) -> SpreadPlan:
    """Let this replica's held gang go, if it is its turn, with its siblings' domains kept out while
    another domain has room; hold it again if it was let go so and Volcano cannot place it. `request`
    None: no valid request (opted out or invalid); a held gang goes unconstrained then, as it does once
    the spread annotation is removed. `unschedulable`: Volcano's word on the replica's gang; `unspread`:
    the replicas held again, remembered by the leader (let go without keeping a domain out)."""
    held = [p for p in replica.members(request) if is_held(p)]
    tier = spread_tier(request, topology)
    settling = settling_since([*siblings, replica], request, remembered, now) if tier is not None else {}
    if tier is not None and request is not None:
        unspread = frozenset(r.name for r in (*siblings, replica) if r.name in unspread and not r.placed(request))
    if not held:
        if tier is None or request is None or replica.name in unspread or replica.name not in settling:
            return SpreadPlan(settling=settling, unspread=unspread if tier is not None else None)
        return _unplaced(request, tier, replica, settling, now, unschedulable, unspread, give_up)
    if request is None or tier is None or replica.bound_nodes(request):
        # No spread in effect, or a replacement pod of a replica already in its domain: its gang keeps it there.
        return SpreadPlan(tuple(_let_go(p, [], None) for p in held), settling, unspread=unspread if tier is not None else None)
    if len(replica.members(request)) < replica.expected(request):
        return SpreadPlan(settling=settling, unspread=unspread)  # every pod of the gang goes together: wait for AIBrix
    for name, since in sorted(settling.items(), key=lambda item: item[1]):
        if now - since < SETTLE_SECONDS:
            return SpreadPlan(settling=settling, waiting_for=name, recheck_in=SETTLE_SECONDS - (now - since), unspread=unspread)
    taken = {} if replica.name in unspread else _taken(topology, tier, siblings, request)
    if taken and free is None:
        return SpreadPlan(settling=settling, needs_room=True, unspread=unspread)
    kept_out = _kept_out(topology, tier, own_tier(request, topology, tier), replica, taken, free or {})
    nodes = sorted(n for domain in kept_out for n in topology.nodes_under(domain))
    hosts = by_hostname(nodes, hostnames or {}) if nodes else None
    writes = tuple(_let_go(p, nodes, hosts) for p in held)
    return SpreadPlan(writes, {**settling, replica.name: now}, kept_out=tuple(sorted(kept_out)), unspread=unspread)


def _unplaced(
    request: TopologyRequest,
    tier: int,
    replica: Replica,
    settling: Mapping[str, float],
    now: float,
    unschedulable: bool,
    unspread: frozenset[str],
    give_up: float = SPREAD_GIVE_UP,
) -> SpreadPlan:
    """A replica let go with domains kept out and not placed: past `give_up` (SPREAD_GIVE_UP unless
    configured), its gang unschedulable, held again (its unbound pods deleted); before, looked at again then."""
    waiting = [p for p in replica.members(request) if not (p.get("spec") or {}).get("nodeName") and _kept_out_of(p)]
    if not waiting or replica.bound_nodes(request):
        # Let go with nothing kept out; or a pod of its gang bound (the rest may be binding now): it stays.
        return SpreadPlan(settling=settling, unspread=unspread)
    waited = now - settling[replica.name]
    if waited < give_up or not unschedulable:
        recheck = give_up - waited if waited < give_up else SETTLE_SECONDS
        return SpreadPlan(settling=settling, recheck_in=recheck, unspread=unspread)
    deletes = tuple(
        DeleteUnboundPod(p["metadata"].get("namespace", ""), p["metadata"]["name"], str(p["metadata"].get("resourceVersion", "")))
        for p in waiting
        if p["metadata"].get("resourceVersion")
    )
    say = Say(
        "Warning",
        "ReplicaSpreadUnplaced",
        f"replica {replica.name} was let go to spread over tier {tier}, keeping out the domains that hold its siblings, "
        f"and Volcano could not place it there in {waited:.0f} s: its {len(deletes)} unbound pods are made again and "
        f"let go without keeping any domain out ({request.describe()})",
    )
    rest = {name: since for name, since in settling.items() if name != replica.name}
    return SpreadPlan(settling=rest, unspread=unspread | {replica.name}, held_again=deletes, says=(say,))


def kept_out_left_behind(request: TopologyRequest | None, topology: Topology, replica: Replica) -> tuple[DeleteUnboundPod, ...]:
    """A replica let go with its siblings' domains kept out, when no spread applies any more (the owner
    removed it, opted out, or the request turned invalid): its unbound pods keep an affinity that nothing
    will take back, and may wait for ever. They are deleted (at the version read, never a bound one;
    none while a pod of its gang is bound), AIBrix makes them again, and they go without it."""
    if spread_tier(request, topology) is not None:
        return ()
    members = replica.members(request)
    if any((p.get("spec") or {}).get("nodeName") for p in members):
        return ()
    return tuple(
        DeleteUnboundPod(p["metadata"].get("namespace", ""), p["metadata"]["name"], str(p["metadata"]["resourceVersion"]))
        for p in members
        if _kept_out_of(p) and not (p.get("spec") or {}).get("nodeName") and p["metadata"].get("resourceVersion")
    )


def _kept_out_of(pod: Mapping[str, Any]) -> bool:
    """The pod was let go with domains kept out (its release labelled it so): a node affinity of the
    user's own is never taken for stormtopo's."""
    return ((pod.get("metadata") or {}).get("labels") or {}).get(SPREAD_KEPT_OUT_LABEL) == "true"


def _taken(topology: Topology, tier: int, siblings: Sequence[Replica], request: TopologyRequest) -> dict[str, list[Replica]]:
    """Each spread-tier domain where a sibling has a bound pod, and those siblings."""
    out: dict[str, list[Replica]] = {}
    for sibling in siblings:
        for domain in domains_of(topology, sibling.bound_nodes(request), tier):
            out.setdefault(domain, []).append(sibling)
    return out


def _kept_out(
    topology: Topology, tier: int, own: int, replica: Replica, taken: Mapping[str, Sequence[Replica]], free: Mapping[str, int]
) -> set[str]:
    """The domains holding more siblings than the least-held domains with room for the whole replica;
    none when only the most-held ones have room (or none has: Volcano keeps it Pending, or packs it)."""
    need = replica_pods(replica.roleset.get("spec") or {})
    held = {s.name: len(taken.get(s.name, ())) for s in topology.switches.values() if s.tier == tier}
    for level in sorted(set(held.values()))[:-1]:  # at the highest level nothing is kept out
        kept_out = {domain for domain, count in held.items() if count > level}
        if _room_outside(topology, tier, own, need, free, kept_out):
            return kept_out
    return set()


def _room_outside(topology: Topology, tier: int, own: int, need: Sequence[int], free: Mapping[str, int], kept_out: set[str]) -> bool:
    """Some HyperNode of the replica's own tier, under a spread-tier domain not kept out, packs its gang."""
    for switch in topology.switches.values():
        if switch.tier != own:
            continue
        domain = _above(topology, switch.name, tier)
        if domain is None or domain in kept_out:
            continue
        if fits([max(0, free.get(n, 0)) for n in topology.nodes_under(switch.name)], need):
            return True
    return False


def _above(topology: Topology, switch: str, tier: int) -> str | None:
    """The HyperNode of `tier` at or above `switch`."""
    current: str | None = switch
    while current is not None and topology.switches[current].tier != tier:
        current = topology.switches[current].parent
    return current


def shared_domain(
    request: TopologyRequest | None, topology: Topology, replica: str, nodes: Sequence[str], siblings: Sequence[Replica]
) -> Say | None:
    """A Warning when a placed replica shares a spread-tier domain with a sibling: said where it lands."""
    tier = spread_tier(request, topology)
    if request is None or tier is None:
        return None
    for domain in sorted(domains_of(topology, nodes, tier)):
        others = sorted(s.name for s in siblings if domain in domains_of(topology, s.bound_nodes(request), tier))
        if others:
            return Say(
                "Warning",
                "ReplicasShareDomain",
                f"replica {replica} placed in {domain}, which also holds replica {', '.join(others)}: the replicas are to "
                f"spread over tier {tier}, and no tier-{tier} domain holding fewer of them could hold the whole replica "
                f"({request.describe()})",
            )
    return None


def _let_go(pod: Mapping[str, Any], kept_out: Sequence[str], hosts: Sequence[str] | None) -> PatchPod:
    """The gate removed and, with domains kept out, their nodes excluded by a required node affinity:
    one requirement by hostname, or one per node by name (a node-name field requirement takes one value)."""
    spec = pod.get("spec") or {}
    gate = next(i for i, g in enumerate(spec.get("schedulingGates") or []) if g.get("name") == DOMAIN_GATE)
    ops: list[dict[str, Any]] = [
        {"op": "test", "path": f"/spec/schedulingGates/{gate}/name", "value": DOMAIN_GATE},
        {"op": "remove", "path": f"/spec/schedulingGates/{gate}"},
    ]
    if kept_out:
        ops += _excluding(spec, kept_out, hosts)
        ops.append({"op": "add", "path": "/metadata/labels/" + SPREAD_KEPT_OUT_LABEL.replace("/", "~1"), "value": "true"})
    meta = pod["metadata"]
    return PatchPod(meta.get("namespace", ""), meta["name"], ops)


def _excluding(spec: Mapping[str, Any], nodes: Sequence[str], hosts: Sequence[str] | None) -> list[dict[str, Any]]:
    if hosts is not None:
        kind, requirements = "matchExpressions", [{"key": HOSTNAME_LABEL, "operator": "NotIn", "values": list(hosts)}]
    else:
        kind, requirements = "matchFields", [{"key": "metadata.name", "operator": "NotIn", "values": [n]} for n in nodes]
    affinity = spec.get("affinity") or {}
    node_affinity = affinity.get("nodeAffinity") or {}
    terms = (node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
    if terms:
        # A gated pod's terms may only be narrowed (terms are ORed): each gets the exclusion.
        base = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms"
        ops: list[dict[str, Any]] = []
        for i, term in enumerate(terms):
            if term.get(kind):
                ops += [{"op": "add", "path": f"{base}/{i}/{kind}/-", "value": r} for r in requirements]
            else:
                ops.append({"op": "add", "path": f"{base}/{i}/{kind}", "value": requirements})
        return ops
    required = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{kind: requirements}]}}
    if node_affinity:
        path = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution"
        return [{"op": "add", "path": path, "value": required["requiredDuringSchedulingIgnoredDuringExecution"]}]
    if affinity:
        return [{"op": "add", "path": "/spec/affinity/nodeAffinity", "value": required}]
    return [{"op": "add", "path": "/spec/affinity", "value": {"nodeAffinity": required}}]
