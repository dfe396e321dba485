"""A StormService's topology request, parsed from its annotations.

Volcano's own vocabulary where it has one (as KubeRay does on RayCluster):
  volcano.sh/network-topology-mode             hard | soft
  volcano.sh/network-topology-highest-tier     whole number >= 1  (PodGroup highestTierAllowed)
  volcano.sh/network-topology-highest-tier-name  a HyperNode tierName (Volcano >= 1.14: highestTierName)
and stormtopo's for what Volcano has no word for:
  stormtopo.io/topology-scope                  RoleSet (default: one gang per replica) | StormService
  stormtopo.io/replica-highest-tier            with scope StormService: each replica within this tier
  stormtopo.io/replica-highest-tier-name       ... or within this tier name (needs subGroupPolicy)
  stormtopo.io/replica-spread-tier             with scope RoleSet: replicas in different HyperNodes of this tier
  stormtopo.io/replica-spread-tier-name        ... or of this tier name (core/spread.py)

A StormService with none of these annotations is not opted in. Parsing is pure: the tiers a cluster
has are passed in, so "a tier deeper than any HyperNode" is caught here too.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from stormtopo.core.tier import tier_number, tier_of_name
from stormtopo.core.vocabulary import (
    HIGHEST_TIER,
    HIGHEST_TIER_NAME,
    MODE,
    REPLICA_HIGHEST_TIER,
    REPLICA_HIGHEST_TIER_NAME,
    REPLICA_SPREAD_TIER,
    REPLICA_SPREAD_TIER_NAME,
    REQUEST_ANNOTATIONS,
    SCOPE,
)


class Mode(StrEnum):
    HARD = "hard"
    SOFT = "soft"


class Scope(StrEnum):
    ROLESET = "RoleSet"
    STORMSERVICE = "StormService"


@dataclass(frozen=True)
class TierLimit:
    """How far a gang may spread: a tier number or a tier name (exactly one, or neither for soft)."""

    tier: int | None = None
    tier_name: str | None = None

    def record(self) -> dict[str, object]:
        if self.tier is not None:
            return {"highestTierAllowed": self.tier}
        return {"highestTierName": self.tier_name} if self.tier_name is not None else {}

    def describe(self) -> str:
        if self.tier is not None:
            return f"tier {self.tier}"
        if self.tier_name is not None:
            return f"tier {self.tier_name!r}"
        return "any tier"


@dataclass(frozen=True)
class TopologyRequest:
    mode: Mode
    limit: TierLimit
    scope: Scope = Scope.ROLESET
    replica_limit: TierLimit | None = None  # nested placement: each replica within this, the service within `limit`
    defaults: tuple[tuple[str, object], ...] = ()  # the CRD's defaults for networkTopology fields
    spread: TierLimit | None = None  # replicas in different domains of this tier, each within `limit` (core/spread.py)

    def network_topology(self) -> dict[str, object]:
        """The PodGroup spec.networkTopology for the outer gang, as the API server will store it."""
        return {**dict(self.defaults), **network_topology_of(self.mode, self.limit)}

    def replica_network_topology(self) -> dict[str, object] | None:
        if self.replica_limit is None:
            return None
        return network_topology_of(self.mode, self.replica_limit)

    def record(self) -> str:
        """What its PodGroups carry in `stormtopo.io/request`: the request as data, with a version (read back by
        recorded_request, to decide when a move's or a narrowing's hold ends; `kubectl get -o yaml` shows it)."""
        record: dict[str, object] = {"v": RECORD_VERSION, "mode": self.mode.value, **self.limit.record(), "scope": self.scope.value}
        if self.replica_limit:
            record["replica"] = self.replica_limit.record()
        if self.spread:
            record["spread"] = self.spread.record()
        return json.dumps(record, separators=(",", ":"))

    def describe(self) -> str:
        text = f"{self.mode.value} within {self.limit.describe()}, scope {self.scope.value}"
        if self.replica_limit:
            text += f", each replica within {self.replica_limit.describe()}"
        if self.spread:
            text += f", replicas spread over {self.spread.describe()}"
        return text


def network_topology_of(mode: Mode, limit: TierLimit) -> dict[str, object]:
    """A PodGroup's spec.networkTopology for this mode and limit, before the API server's defaults."""
    out: dict[str, object] = {"mode": mode.value}
    if limit.tier is not None:
        out["highestTierAllowed"] = limit.tier
    if limit.tier_name is not None:
        out["highestTierName"] = limit.tier_name
    return out


@dataclass(frozen=True)
class ClusterTiers:
    """What the cluster's HyperNodes offer: tier numbers and tier names, and Volcano's PodGroup fields."""

    tiers: frozenset[int] = frozenset()
    tier_names: frozenset[str] = frozenset()
    has_network_topology: bool = True  # PodGroup spec.networkTopology (Volcano >= 1.12)
    has_tier_name_field: bool = True  # PodGroup spec.networkTopology.highestTierName (Volcano >= 1.14)
    has_subgroup_policy: bool = True  # PodGroup spec.subGroupPolicy (Volcano >= 1.14)
    # What the API server fills into networkTopology when a field is left out (1.12 and 1.13 default
    # highestTierAllowed to 1): desired objects carry them too, or every comparison would differ forever.
    network_topology_defaults: tuple[tuple[str, object], ...] = ()
    tier_of_name: tuple[tuple[str, int], ...] = ()  # each tierName and its tier: a spread tier is compared by number
    # Each PriorityClass and its value (not tiers, but read with them): a replica whose roles run at
    # different classes gives its PodGroup the highest (core/priority.py).
    priority_values: tuple[tuple[str, int], ...] = ()

    def number(self, limit: TierLimit) -> int | None:
        """A limit's tier number, a tier name resolved through the HyperNodes; None if it names none."""
        if limit.tier is not None:
            return limit.tier
        return tier_of_name(limit.tier_name, self.tier_of_name)


RECORD_VERSION = 1  # of the `stormtopo.io/request` record; a record of another version is not read
RECORD_LIMIT = 512  # characters: a record stormtopo writes is under 150; longer is not read


def recorded_request(recorded: object, defaults: tuple[tuple[str, object], ...] = ()) -> TopologyRequest | None:
    """A replica's request read back from its PodGroup's `stormtopo.io/request` (TopologyRequest.record), its
    mode and limit; None if it is not one stormtopo could have written. The release before wrote a sentence
    (TopologyRequest.describe: "soft within tier 2, scope RoleSet"): read too, for one release."""
    if not isinstance(recorded, str) or len(recorded) > RECORD_LIMIT:
        return None
    text = recorded.strip()
    mode_limit = _read_record(text) if text.startswith("{") else _read_sentence(text)
    if mode_limit is None:
        return None
    mode, limit = mode_limit
    if mode is Mode.HARD and limit == TierLimit():
        return None  # hard needs a tier: not something stormtopo wrote
    return TopologyRequest(mode, limit, Scope.ROLESET, None, defaults)


def _read_record(text: str) -> tuple[Mode, TierLimit] | None:
    try:
        record = json.loads(text)
    except ValueError:
        return None
    if not isinstance(record, dict) or record.get("v") != RECORD_VERSION or record.get("mode") not in (Mode.HARD, Mode.SOFT):
        return None
    tier, name = record.get("highestTierAllowed"), record.get("highestTierName")
    if tier is not None and name is not None:
        return None
    if tier is not None and not (isinstance(tier, int) and not isinstance(tier, bool) and tier >= 1):
        return None
    if name is not None and not (isinstance(name, str) and name):
        return None
    return Mode(record["mode"]), TierLimit(tier, name)


_DESCRIBED = re.compile(r"(hard|soft) within (?:tier ([0-9]+)|tier ('.*'|\".*\")|any tier)(?:, scope RoleSet)?")


def _read_sentence(text: str) -> tuple[Mode, TierLimit] | None:
    found = _DESCRIBED.fullmatch(text)
    if found is None:
        return None
    mode, tier, name = found.groups()
    if tier is not None:
        return Mode(mode), TierLimit(tier=int(tier))
    if name is None:
        return Mode(mode), TierLimit()
    try:
        value = ast.literal_eval(name)
    except (ValueError, SyntaxError):
        return None
    return (Mode(mode), TierLimit(tier_name=value)) if isinstance(value, str) else None


@dataclass
class RequestError(ValueError):
    """Bad annotations: each problem names the annotation, the bad value and what is accepted."""

    problems: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return "; ".join(self.problems)


def is_opted_in(annotations: Mapping[str, str] | None) -> bool:
    return any(key in (annotations or {}) for key in REQUEST_ANNOTATIONS)


def written_scope(annotations: Mapping[str, str] | None) -> Scope:
    """The scope the annotations name, valid request or not: StormService only when written so."""
    return Scope.STORMSERVICE if (annotations or {}).get(SCOPE, "").strip() == Scope.STORMSERVICE.value else Scope.ROLESET


def parse_request(annotations: Mapping[str, str] | None, cluster: ClusterTiers | None = None) -> TopologyRequest | None:
    """The request these annotations state, None if not opted in; RequestError listing every problem."""
    annotations = annotations or {}
    if not is_opted_in(annotations):
        return None
    problems: list[str] = []

    mode_text = annotations.get(MODE)
    mode = Mode.HARD
    if mode_text is None:
        problems.append(f"annotation {MODE} is missing; accepted: hard or soft (the other network-topology annotations need it)")
    elif mode_text.strip() not in ("hard", "soft"):
        problems.append(f"annotation {MODE}: {mode_text!r} is not a mode; accepted: hard or soft")
    else:
        mode = Mode(mode_text.strip())

    scope_text = annotations.get(SCOPE, Scope.ROLESET.value).strip()
    scope = Scope.ROLESET
    if scope_text not in (Scope.ROLESET.value, Scope.STORMSERVICE.value):
        problems.append(f"annotation {SCOPE}: {scope_text!r} is not a scope; accepted: RoleSet (each replica one gang) or StormService")
    else:
        scope = Scope(scope_text)

    limit = _tier_limit(annotations, HIGHEST_TIER, HIGHEST_TIER_NAME, cluster, problems)
    if mode is Mode.HARD and limit == TierLimit() and mode_text is not None:
        problems.append(f"annotation {MODE}: hard needs {HIGHEST_TIER} (a tier number) or {HIGHEST_TIER_NAME} (a tier name)")

    replica_limit = None
    if REPLICA_HIGHEST_TIER in annotations or REPLICA_HIGHEST_TIER_NAME in annotations:
        replica_limit = _tier_limit(annotations, REPLICA_HIGHEST_TIER, REPLICA_HIGHEST_TIER_NAME, cluster, problems)
        if scope is not Scope.STORMSERVICE:
            problems.append(
                f"annotation {REPLICA_HIGHEST_TIER}: nests replicas inside the service's domain, so it needs {SCOPE}: StormService"
            )
        elif limit.tier is not None and replica_limit.tier is not None and replica_limit.tier > limit.tier:
            problems.append(
                f"annotation {REPLICA_HIGHEST_TIER}: {replica_limit.tier} is above the service's tier {limit.tier}; "
                f"accepted: a tier from 1 to {limit.tier}"
            )
        if cluster is not None and not cluster.has_subgroup_policy:
            problems.append(
                f"annotation {REPLICA_HIGHEST_TIER}: nested placement needs PodGroup subGroupPolicy, which this cluster's "
                "Volcano does not have; upgrade Volcano to 1.14 or newer"
            )
    spread = _spread(annotations, scope, limit, cluster, problems)
    if cluster is not None and not cluster.has_network_topology:
        problems.append(
            f"annotation {MODE}: this cluster's Volcano PodGroup has no networkTopology field; upgrade Volcano to 1.12 or newer"
        )
    if problems:
        raise RequestError(problems)
    return TopologyRequest(mode, limit, scope, replica_limit, cluster.network_topology_defaults if cluster else (), spread)


def _spread(
    annotations: Mapping[str, str], scope: Scope, limit: TierLimit, cluster: ClusterTiers | None, problems: list[str]
) -> TierLimit | None:
    """The spread tier: at or above the replica's own tier (a replica within one domain of it), at most
    the tree's top, and only where each replica is a gang of its own (scope RoleSet)."""
    if REPLICA_SPREAD_TIER not in annotations and REPLICA_SPREAD_TIER_NAME not in annotations:
        return None
    key = REPLICA_SPREAD_TIER if REPLICA_SPREAD_TIER in annotations else REPLICA_SPREAD_TIER_NAME
    spread = _tier_limit(annotations, REPLICA_SPREAD_TIER, REPLICA_SPREAD_TIER_NAME, cluster, problems)
    if scope is not Scope.ROLESET:
        problems.append(f"annotation {key}: spreads replicas that are each a gang of their own, so it needs {SCOPE}: RoleSet (the default)")
    numbers = cluster if cluster is not None else ClusterTiers()
    own, wide = numbers.number(limit), numbers.number(spread)
    if own is not None and wide is not None and wide < own:
        top = max(cluster.tiers) if cluster and cluster.tiers else None
        accepted = f"a tier from {own} to {top}" if top else f"a tier of {own} or more"
        problems.append(
            f"annotation {key}: {annotations[key]!r} is below the replica's own tier {own}, so a replica could not keep within one "
            f"domain of it; accepted: {accepted}"
        )
    return spread


def request_of(stormservice: Mapping[str, Any] | None, cluster: ClusterTiers | None) -> TopologyRequest | RequestError | None:
    """A StormService's request: valid, invalid (the error says why), or None when it asks for none."""
    if stormservice is None:
        return None
    try:
        return parse_request((stormservice.get("metadata") or {}).get("annotations"), cluster)
    except RequestError as exc:
        return exc


def _tier_limit(
    annotations: Mapping[str, str], tier_key: str, name_key: str, cluster: ClusterTiers | None, problems: list[str]
) -> TierLimit:
    tier_text = annotations.get(tier_key)
    name_text = annotations.get(name_key)
    if tier_text is not None and name_text is not None:
        problems.append(f"annotations {tier_key} and {name_key} are both set; accepted: one of them")
        return TierLimit()
    if tier_text is not None:
        known = sorted(cluster.tiers) if cluster and cluster.tiers else None
        accepted = f"a whole number from 1 to {max(known)} (the tiers of this cluster's HyperNodes)" if known else "a whole number >= 1"
        tier = tier_number(tier_text)
        if tier is None:
            problems.append(f"annotation {tier_key}: {tier_text!r} is not a tier; accepted: {accepted}")
            return TierLimit()
        if known is not None and tier > max(known):
            problems.append(f"annotation {tier_key}: {tier_text!r} is deeper than any HyperNode; accepted: {accepted}")
            return TierLimit()
        return TierLimit(tier=tier)
    if name_text is not None:
        name = name_text.strip()
        if cluster is not None and not cluster.has_tier_name_field:
            problems.append(
                f"annotation {name_key}: tier names need PodGroup highestTierName, which this cluster's Volcano does not have; "
                f"upgrade Volcano to 1.14 or newer, or use {tier_key}"
            )
            return TierLimit()
        if cluster is not None and not cluster.tier_names:
            # Volcano drops a tier name that no HyperNode has, and the gang runs unconstrained.
            problems.append(
                f"annotation {name_key}: {name_text!r} names no tier: no HyperNode of this cluster has a tierName; "
                f"accepted: {tier_key} with a tier number, or give the HyperNodes tierNames"
            )
            return TierLimit()
        if not name or (cluster is not None and name not in cluster.tier_names):
            names = ", ".join(sorted(cluster.tier_names)) if cluster else "the tierName of a HyperNode"
            problems.append(f"annotation {name_key}: {name_text!r} is not a tier name of this cluster; accepted: {names}")
            return TierLimit()
        return TierLimit(tier_name=name)
    return TierLimit()


def valid_request(stormservice: Mapping[str, Any] | None, cluster: ClusterTiers | None) -> TopologyRequest | None:
    """The StormService's request if it is valid; None if it has none or it is invalid."""
    request = request_of(stormservice, cluster)
    return request if isinstance(request, TopologyRequest) else None
