"""A replica (Replica): one RoleSet and its pods, the one model healing, spread and the index share;
which of them are its own, live, bound and ready, where they run and what they hold there, and which
form its gang as Volcano places it (members, placed, let go).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from stormtopo.core.gang import followers, gang_of, gpus_per_pod, replica_pods
from stormtopo.core.node_fit import pod_requests
from stormtopo.core.ownership import roleset_name
from stormtopo.core.placement import is_held, is_live
from stormtopo.core.request import Mode, TopologyRequest
from stormtopo.core.stranded import pending_since
from stormtopo.core.vocabulary import ROLE_LABEL, ROLESET_LABEL


@dataclass(frozen=True)
class Replica:
    """One RoleSet and every pod carrying its label, as read from the API."""

    roleset: Mapping[str, Any]
    pods: tuple[Mapping[str, Any], ...]

    @classmethod
    def of(cls, roleset: Mapping[str, Any], pods: Iterable[Mapping[str, Any]]) -> Replica:
        """The RoleSet with those of `pods` (its StormService's, read by label) that carry its label."""
        name = roleset["metadata"]["name"]
        return cls(roleset, tuple(p for p in pods if ((p.get("metadata") or {}).get("labels") or {}).get(ROLESET_LABEL) == name))

    @property
    def name(self) -> str:
        return str(self.roleset["metadata"]["name"])

    def own(self) -> list[Mapping[str, Any]]:
        """Its pods: those the RoleSet controls, where the RoleSet's uid is known (another tool's pod
        that copies AIBrix's labels is never evicted); by label otherwise."""
        uid = (self.roleset.get("metadata") or {}).get("uid")
        if not uid:
            return list(self.pods)
        return [p for p in self.pods if any(o.get("uid") == uid for o in (p.get("metadata") or {}).get("ownerReferences") or [])]

    def live(self) -> list[Mapping[str, Any]]:
        return [p for p in self.own() if is_live(p)]

    def bound(self) -> list[Mapping[str, Any]]:
        return [p for p in self.live() if (p.get("spec") or {}).get("nodeName")]

    def pending_since(self) -> float | None:
        """When the longest-waiting of its pods was created, if some of its pods run and that one is not
        bound (a replacement Volcano keeps in the gang's domain); None otherwise."""
        return pending_since(self.live())

    def wanted(self) -> list[int]:
        return replica_pods(self.roleset.get("spec") or {})

    def complete(self) -> bool:
        """Exactly the pods it should have are bound, and none is on its way out (a finished pod left
        behind, say one the kubelet evicted, is neither); surge pods of a rollout are not complete."""
        terminating = any((p.get("metadata") or {}).get("deletionTimestamp") for p in self.own())
        return bool(self.wanted()) and len(self.bound()) == len(self.wanted()) == len(self.live()) and not terminating

    def ready(self) -> bool:
        return self.complete() and all(_is_ready(p) for p in self.bound())

    def nodes(self) -> list[str]:
        return sorted(p["spec"]["nodeName"] for p in self.bound())

    def requests_by_node(self) -> dict[str, dict[str, int]]:
        """What its bound pods request per node, every resource (milli-units): free again once it moves."""
        held: dict[str, dict[str, int]] = {}
        for pod in self.bound():
            on = held.setdefault(pod["spec"]["nodeName"], {})
            for resource, amount in pod_requests(pod["spec"]).items():
                on[resource] = on.get(resource, 0) + amount
        return held

    def gpus_by_node(self) -> dict[str, int]:
        """What its bound pods hold per node: free again once it moves."""
        per_role = gpus_per_pod(self.roleset.get("spec") or {})
        held: dict[str, int] = {}
        for pod in self.bound():
            role = ((pod.get("metadata") or {}).get("labels") or {}).get(ROLE_LABEL, "")
            held[pod["spec"]["nodeName"]] = held.get(pod["spec"]["nodeName"], 0) + per_role.get(role, 0)
        return held

    def members(self, request: TopologyRequest | None) -> list[Mapping[str, Any]]:
        """Its live pods that Volcano places as its gang. Routers (roles that ask for no resources) are in a
        soft gang; otherwise they follow the gang into its domain later, as the last valid request asked
        (core/placement.py), so they are not let go here."""
        following = self._following(request)
        return [p for p in self.pods if is_live(p) and roleset_name(p) == self.name and _role(p) not in following]

    def expected(self, request: TopologyRequest | None) -> int:
        return gang_of(self.roleset.get("spec") or {}, self._following(request)).min_member

    def _following(self, request: TopologyRequest | None) -> frozenset[str]:
        soft = request is not None and request.mode is Mode.SOFT
        return frozenset() if soft else followers(self.roleset.get("spec") or {})

    def bound_nodes(self, request: TopologyRequest | None) -> list[str]:
        return [str(p["spec"]["nodeName"]) for p in self.members(request) if (p.get("spec") or {}).get("nodeName")]

    def placed(self, request: TopologyRequest | None) -> bool:
        """Every pod of its gang is bound: where it is will not change."""
        return len(self.bound_nodes(request)) >= max(1, self.expected(request))

    def let_go(self, request: TopologyRequest | None) -> bool:
        """Some pod of its gang is past the gate and not bound: Volcano is placing it."""
        return any(not is_held(p) and not (p.get("spec") or {}).get("nodeName") for p in self.members(request))


def _is_ready(pod: Mapping[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in (pod.get("status") or {}).get("conditions") or [])


def _role(pod: Mapping[str, Any]) -> str | None:
    return ((pod.get("metadata") or {}).get("labels") or {}).get(ROLE_LABEL)
