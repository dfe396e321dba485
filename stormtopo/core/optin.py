"""Only opted-in StormServices depend on stormtopo, and none of them is ever placed unconstrained.

The mutating webhooks fail open (failurePolicy Ignore): while stormtopo is down every other
StormService works as if it were not installed. What keeps an opted-in replica from being placed
without its constraint then is Kubernetes itself:

- a ValidatingAdmissionPolicy (CEL, evaluated inside the API server, so it cannot be down) refuses
  a pod of a StormService listed in the opted-in ConfigMap of its namespace unless stormtopo admitted it
  (ADMITTED_LABEL), and refuses an update that strips networkTopology from a PodGroup that
  stormtopo constrained; AIBrix retries both;
- a validating webhook that fails closed, but only for StormServices that carry a request (a CEL
  matchCondition on their own annotations), lists a StormService in that ConfigMap before it exists.

One ConfigMap per namespace, `stormtopo-opted-in`, its keys the namespace's opted-in StormServices (the
policy's paramRef names it without a namespace: the API server reads the one in the admitted object's
namespace). A listing is one small merge patch of one namespace's list: what it costs does not grow
with the services of other namespaces, a namespace that never opted in has no list, and the API server
evaluates each pod against its own namespace's list only. Why not one object per StormService: a
policy evaluates a selected set of params each on its own and needs all to pass, so "this pod's service
is listed as healing" (the eviction policy) cannot be said over one object per service (docs/security.md).

This module is the pure part: keys, the policy objects, and the gate's decision.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from stormtopo.core.moves import asks_healing
from stormtopo.core.request import Scope, is_opted_in
from stormtopo.core.vocabulary import (
    ADMITTED_LABEL,
    MANAGED_BY,
    OPTED_IN_CONFIGMAP,
    REQUEST_ANNOTATION,
    REQUEST_ANNOTATIONS,
    ROLESET_LABEL,
    SCOPE,
    STORMSERVICE_LABEL,
    VOLCANO_SCHEDULING,
)

# The suffix of a listing whose replicas stormtopo may move (evict): the chart's policy
# <release>-evict-opted-in-only reads it (templates/admission-policy.yaml).
MOVABLE = "+heal"
PODS_POLICY = "stormtopo-opted-in-pods"
PODGROUPS_POLICY = "stormtopo-constrained-podgroups"


def opted_in_key(namespace: str, stormservice: str) -> str:
    """How stormtopo names a listing in memory: namespaces hold no dots, so the first dot separates the
    two. In the cluster the key is the StormService's name, in its namespace's ConfigMap."""
    return f"{namespace}.{stormservice}"


_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_NAMESPACE = re.compile(f"^{_LABEL}$")
_NAME = re.compile(rf"^{_LABEL}(\.{_LABEL})*$")


def valid_names(namespace: str, stormservice: str) -> bool:
    """A namespace the API server would accept (a DNS-1123 label) and a StormService name (a DNS-1123
    subdomain): what a review names goes into request paths, and a made-up one ("victim/configmaps/...#")
    must not reach another namespace's list."""
    return len(namespace) <= 63 and bool(_NAMESPACE.match(namespace)) and len(stormservice) <= 253 and bool(_NAME.match(stormservice))


def split_key(key: str) -> tuple[str, str]:
    """(namespace, StormService) of an opted_in_key."""
    namespace, _, stormservice = key.partition(".")
    return namespace, stormservice


def listing(stormservice: Mapping[str, Any] | None) -> str | None:
    """What the ConfigMap says of a StormService: its scope while it carries any network-topology
    annotation, valid or not (an invalid one keeps its last valid constraint), else nothing; with
    MOVABLE after it while the service asks for healing (lending room needs healing too): the chart's
    eviction policy lets stormtopo evict pods of those services only."""
    annotations = ((stormservice or {}).get("metadata") or {}).get("annotations") or {}
    if not is_opted_in(annotations):
        return None
    scope = Scope.STORMSERVICE.value if annotations.get(SCOPE, "").strip() == Scope.STORMSERVICE.value else Scope.ROLESET.value
    return scope + MOVABLE if asks_healing(stormservice) else scope


def requests_topology_condition() -> str:
    """CEL for the gate: a StormService that carries a network-topology annotation and is new, newly
    opted in, or changes its scope (what the list says of it). Other updates of an opted-in
    StormService (scaling, a rollout) never call the gate, so they go on while stormtopo is down."""
    keys = "[" + ", ".join(f"'{k}'" for k in REQUEST_ANNOTATIONS) + "]"
    opted_in = f"has(object.metadata.annotations) && {keys}.exists(k, k in object.metadata.annotations)"
    was_opted_in = f"has(oldObject.metadata.annotations) && {keys}.exists(k, k in oldObject.metadata.annotations)"

    def scope(of: str) -> str:
        return f"(has({of}.metadata.annotations) && '{SCOPE}' in {of}.metadata.annotations ? {of}.metadata.annotations['{SCOPE}'] : '')"

    return f"({opted_in}) && (request.operation == 'CREATE' || !({was_opted_in}) || {scope('object')} != {scope('oldObject')})"


def admission_policy() -> list[dict[str, Any]]:
    """Two ValidatingAdmissionPolicies with their bindings (admissionregistration.k8s.io/v1,
    Kubernetes >= 1.30), each matching only AIBrix's objects (an object selector on AIBrix's labels):
    - pods of a StormService listed in its namespace's opted-in ConfigMap must have been admitted by stormtopo;
    - an update must not strip networkTopology from a PodGroup that stormtopo constrained."""
    labels = "object.metadata.labels"
    key = f"has({labels}) && '{STORMSERVICE_LABEL}' in {labels} ? {labels}['{STORMSERVICE_LABEL}'] : ''"
    pods = _policy(
        PODS_POLICY,
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]},
        STORMSERVICE_LABEL,
        {
            "expression": (f"!variables.optedIn || (has(object.metadata.labels) && '{ADMITTED_LABEL}' in object.metadata.labels)"),
            "messageExpression": (
                "'StormService ' + object.metadata.labels['" + STORMSERVICE_LABEL + "'] + ' asks for a network topology, "
                "and stormtopo has not admitted this pod (is the stormtopo webhook running?); it is created once stormtopo is back'"
            ),
            "reason": "Forbidden",
        },
        variables=[
            {"name": "key", "expression": key},
            {"name": "optedIn", "expression": "variables.key != '' && has(params.data) && variables.key in params.data"},
        ],
    )
    pods[0]["spec"]["paramKind"] = {"apiVersion": "v1", "kind": "ConfigMap"}
    # No namespace: the list of the pod's own namespace. None there (nothing opted in, or stormtopo
    # uninstalled): nothing is refused.
    pods[1]["spec"]["paramRef"] = {"name": OPTED_IN_CONFIGMAP, "parameterNotFoundAction": "Allow"}
    constrained_before = (
        f"has(oldObject.metadata.annotations) && '{REQUEST_ANNOTATION}' in oldObject.metadata.annotations "
        "&& has(oldObject.spec.networkTopology)"
    )
    podgroups = _policy(
        PODGROUPS_POLICY,
        {
            "apiGroups": [VOLCANO_SCHEDULING[0]],
            "apiVersions": [VOLCANO_SCHEDULING[1]],
            "operations": ["UPDATE"],
            "resources": ["podgroups"],
        },
        ROLESET_LABEL,
        {
            "expression": f"!({constrained_before}) || has(object.spec.networkTopology)",
            "message": (
                "this PodGroup carries a network-topology constraint from stormtopo, and this update would strip it "
                "(is the stormtopo webhook running?); retry once stormtopo is back"
            ),
            "reason": "Forbidden",
        },
    )
    return [*pods, *podgroups]


def _policy(
    name: str, rule: dict[str, Any], label: str, validation: dict[str, str], variables: list[dict[str, str]] | None = None
) -> list[dict[str, Any]]:
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name, "labels": dict(MANAGED_BY)},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [rule],
                "objectSelector": {"matchExpressions": [{"key": label, "operator": "Exists"}]},
            },
            "variables": variables or [],
            "validations": [validation],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name, "labels": dict(MANAGED_BY)},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }
    return [policy, binding]


def opted_in_configmap(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": OPTED_IN_CONFIGMAP, "namespace": namespace, "labels": dict(MANAGED_BY)},
    }


def listing_change(listed: Mapping[str, str], key: str, want: str | None) -> dict[str, str | None] | None:
    """The merge patch of its namespace's ConfigMap's data that lists `key` as `want` (None: unlists);
    None if nothing changes."""
    if listed.get(key) == want:
        return None
    return {split_key(key)[1]: want}


# -- what the gate may list ----------------------------------------------------------------------
#
# The gate cannot tell a review the API server sent from one anybody on the cluster network made up,
# unless the API server authenticates itself with a client certificate (webhook.py). So what it lists
# is checked against the cluster first, and never more than the cluster can confirm soon after:
# - it never unlists (only the reconciler does, from the StormService it watches);
# - a CREATE of a StormService that exists already lists nothing (the create fails, or was made up);
# - an UPDATE lists only if the stored StormService is the review's oldObject (same uid and
#   resourceVersion): a made-up or replayed one names a version that is not, or no longer, stored;
# - a listing the cluster has not confirmed within CONFIRM_SECONDS (the StormService stored with a
#   request) is taken back, and at most UNCONFIRMED_LIMIT are unconfirmed at a time: made-up names
#   cannot grow the ConfigMap, nor etcd with its rewrites;
# - a listing is claimed for one uid (a validating review of a create sees the uid the API server gave
#   the new object, which nobody can predict): once the StormService exists under another uid, the
#   create it was listed for never happened, and it is taken back at once, not after CONFIRM_SECONDS.
#   So a review made up for a name a tenant is about to use holds none of that tenant's pods.

CONFIRM_SECONDS = 10.0  # a real create or update is stored, and watched, in well under a second
UNCONFIRMED_LIMIT = 32  # listings awaiting confirmation, per operator replica
REFUTED_LIMIT = 1024  # versions remembered as falsely listed (an LRU: bounded memory)


def _meta(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return (obj or {}).get("metadata") or {}


def gate_listing(
    operation: str,
    obj: Mapping[str, Any] | None,
    old: Mapping[str, Any] | None,
    stored: Mapping[str, Any] | None,
    refuted: str | None = None,
) -> tuple[str | None, str]:
    """What the gate may list for one review, and why: (scope, reason), scope None listing nothing.
    `stored` is the StormService as the cluster holds it (None: it does not exist); `refuted` a
    resourceVersion of it already found falsely listed (a review naming it again is a replay)."""
    want = listing(obj)
    if want is None:
        return None, "no request annotation: the gate never unlists (the reconciler does)"
    if not _meta(obj).get("name"):
        return None, "the review names no StormService"
    if operation == "CREATE":
        if stored is not None:
            return None, "a StormService of that name exists already: this create fails, or the review was made up"
        return want, "a new StormService that asks for a network topology"
    if operation != "UPDATE":
        return None, f"operation {operation!r} never lists"
    if stored is None:
        return None, "no such StormService: the review was made up"
    version = _meta(stored).get("resourceVersion")
    if _meta(old).get("uid") != _meta(stored).get("uid") or _meta(old).get("resourceVersion") != version:
        return None, "the review's oldObject is not the stored StormService: stale, replayed or made up"
    if refuted is not None and refuted == version:
        return None, "this version was listed once and the update never came: a replay"
    return want, "an update of the stored StormService that asks for a network topology"


def confirmed(stored: Mapping[str, Any] | None, listed: str | None = None) -> bool:
    """The cluster confirms a listing once the StormService is stored with a request, and (`listed`:
    what the gate listed) one that lists the same (a made-up review must not keep `+heal` on the list of
    a service that asks for no healing); the reconciler then keeps its listing from the StormService."""
    want = listing(stored) if stored is not None else None
    return want is not None and (listed is None or want == listed)


def uid_of(obj: Mapping[str, Any] | None) -> str:
    return str(_meta(obj).get("uid") or "")


def claimed_uid(operation: str, obj: Mapping[str, Any] | None, stored: Mapping[str, Any] | None) -> str:
    """The uid a listing is for: the new object's on a CREATE, the stored one's on an UPDATE."""
    return uid_of(obj) if operation == "CREATE" else uid_of(stored)


def still_at(stormservice: Mapping[str, Any] | None, version: str) -> bool:
    """The StormService is still at the version an UPDATE review named as its old one: the update it
    reviewed has not happened (after a moment: a made-up or replayed review, or one refused after)."""
    return bool(version) and stormservice is not None and _meta(stormservice).get("resourceVersion") == version


def contradicted(stormservice: Mapping[str, Any] | None, claimed: str) -> bool:
    """The StormService exists under another uid than the listing was claimed for: the reviewed create
    never happened (a made-up review, or one whose create failed). A claim without a uid is contradicted
    by any StormService of the name (a genuine review always has one)."""
    return stormservice is not None and (not claimed or uid_of(stormservice) != claimed)


@dataclass
class Unconfirmed:
    """The gate's listings that the cluster has not confirmed yet, with when each was written (pure:
    the caller passes the clock) and the uid each was claimed for, and the versions found falsely listed."""

    limit: int = UNCONFIRMED_LIMIT
    ttl: float = CONFIRM_SECONDS
    since: dict[str, float] = field(default_factory=dict)
    claims: dict[str, str] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)  # an UPDATE listing: the version its review named as old
    refuted: OrderedDict[str, str] = field(default_factory=OrderedDict)

    def has_room(self, key: str) -> bool:
        return key in self.since or len(self.since) < self.limit

    def add(self, key: str, now: float, uid: str = "", version: str = "") -> bool:
        """Reserve a slot for `key`, claimed for `uid` (and, an UPDATE, from `version`; the caller checked
        has_room); True if new. A key's clock is never restarted: reviews repeated within ttl cannot keep
        an unconfirmed listing alive. Its claim is the last review's: a genuine one after a made-up one
        keeps the genuine uid."""
        self.claims[key] = uid
        self.versions[key] = version
        if key in self.since:
            return False
        self.since[key] = now
        return True

    def drop(self, key: str) -> None:
        self.since.pop(key, None)
        self.claims.pop(key, None)
        self.versions.pop(key, None)

    def due(self, now: float) -> list[str]:
        """Keys unconfirmed for ttl or longer, oldest first: check each against the cluster."""
        return self.older_than(self.ttl, now)

    def older_than(self, age: float, now: float, limit: int | None = None) -> list[str]:
        """Keys unconfirmed for `age` or longer, oldest first (at most `limit`)."""
        return sorted((k for k, t in self.since.items() if now - t >= age), key=self.since.__getitem__)[:limit]

    def refute(self, key: str, version: str | None) -> None:
        """`key` was listed but its StormService, at `version`, asks for nothing: never again for it."""
        if version is None:
            return
        self.refuted[key] = version
        self.refuted.move_to_end(key)
        while len(self.refuted) > REFUTED_LIMIT:
            self.refuted.popitem(last=False)


def expiry_verdict(stored: Mapping[str, Any] | None, listed: str | None = None) -> str:
    """What becomes of a listing (`listed`) unconfirmed for ttl, given the StormService as stored now:
    'keep' (it exists with a request: the reconciler owns the listing), 'relist-refuted' (listed `+heal`
    but it asks for a topology without healing: a made-up or replayed update; list what it asks),
    'unlist-refuted' (it exists without a request: the same) or 'unlist' (it does not exist)."""
    if stored is None:
        return "unlist"
    want = listing(stored)
    if want is None:
        return "unlist-refuted"
    # Only ever narrowed here (`+heal` taken off): this read may race the reconciler of another replica
    # writing what the service asks now, and a widening written from a stale read could outlive it.
    return "relist-refuted" if listed == want + MOVABLE else "keep"
