"""Whether stormtopo may move a StormService's replicas (movable): it asks for healing, and the chart's
eviction policy can tell its pods from every other StormService's of its namespace. AIBrix names a replica's
RoleSets and pods after the StormService, cut to a length; an eviction names only the pod, so two services
whose names agree that far (or one named "<other>-roleset-...") cannot be told apart, and neither is moved."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from stormtopo.core.moves import asks_healing

# AIBrix v0.7.0 names a replica's RoleSet "<stormservice>-roleset-" cut to this many characters, then 5 random
# ones (utils.Shorten); its pods "<RoleSet>-<role>-...". An eviction names only the pod, so the chart's eviction
# policy knows a service's pods by that prefix.
ROLESET_PREFIX = 58


def roleset_prefix(stormservice: str) -> str:
    return f"{stormservice}-roleset-"[:ROLESET_PREFIX]


def shares_prefix_with(stormservice: str, others: Iterable[str]) -> str | None:
    """The first of `others` (StormServices of the same namespace) whose pods the eviction policy could take for
    this one's, or the other way round: one's RoleSet name prefix begins the other's (as operator/index.py finds
    them by bisection, for the operator; this is the plain scan a command makes once)."""
    own = roleset_prefix(stormservice)
    return next((o for o in others if o != stormservice and (own.startswith(p := roleset_prefix(o)) or p.startswith(own))), None)


def prefix_sharing(names: Iterable[str]) -> set[str]:
    """Of the StormServices of one namespace, those that share a RoleSet name prefix with another (as
    shares_prefix_with says of each), in O(n log n): sorted, the prefixes a prefix begins come right after it,
    and the prefixes that begin it end in "-roleset-" (or equal it, cut to ROLESET_PREFIX)."""
    pairs = sorted((roleset_prefix(n), n) for n in set(names))
    count = Counter(p for p, _ in pairs)
    shared = set()
    for at, (prefix, name) in enumerate(pairs):
        later = pairs[at + 1][0] if at + 1 < len(pairs) else ""
        heads = {prefix[: i + len("-roleset-")] for i in range(len(prefix)) if prefix.startswith("-roleset-", i)} - {prefix}
        if count[prefix] > 1 or (later != prefix and later.startswith(prefix)) or any(h in count for h in heads):
            shared.add(name)
    return shared


def not_movable_reason(stormservice: str, shared_with: str) -> str:
    """Why healing stays off for a service that asks for it, while `shared_with` shares its RoleSet name prefix."""
    return (
        f"stormtopo.io/heal is on, but healing stays off: the RoleSets of StormService {shared_with!r} are named "
        f"with the same prefix as this one's ({roleset_prefix(stormservice)!r}: AIBrix cuts "
        f"'<name>-roleset-' to {ROLESET_PREFIX} characters), and an eviction names only the pod, so stormtopo could not be "
        "kept from evicting that service's pods; rename one of them so that neither name with '-roleset-' after it begins "
        "the other's prefix"
    )


def movable(stormservice: Mapping[str, Any] | None, prefix_shared_with: str | None = None) -> bool:
    """Its pods may be evicted to move its replicas: it asks for healing (lending room needs healing too),
    and no other StormService of its namespace has a RoleSet name prefix that begins its own or that its
    own begins (names that agree in their first 58 characters, or one named "<other>-roleset-..."): the
    eviction policy could not tell their pods apart."""
    return asks_healing(stormservice) and prefix_shared_with is None
