"""Only opted-in StormServices depend on stormtopo, and none of them is ever placed unconstrained.

The mutating webhooks fail open (failurePolicy Ignore): while stormtopo is down every other
StormService works as if it were not installed. What keeps an opted-in replica from being placed
without its constraint then is Kubernetes itself:

- a ValidatingAdmissionPolicy (CEL, evaluated inside the API server, so it cannot be down) refuses
  a pod of a StormService listed in the opted-in ConfigMap of its namespace unless stormtopo admitted it
  (ADMITTED_LABEL), and refuses an update that strips networkTopology from a PodGroup that
  stormtopo constrained; AIBrix retries both;
- which pods: a StormService created with a request carries OPTED_IN_LABEL on every role template, so
  on every pod (a mutating webhook that fails closed adds it on the create, and keeps it through updates
  that would drop it); the policy matches that label. A create writes nothing but itself: what it costs
  does not grow with the services opted in before it, and a review nobody sent writes nothing.
- a service opted in by an update keeps its templates (labelling them would roll every replica): a
  validating webhook that fails closed lists it first in its namespace's ConfigMap, `stormtopo-opted-in`,
  which the policy reads too. The list also marks the services that ask for healing ("+heal"), the only
  ones whose pods the chart's eviction policy lets stormtopo evict.

So a namespace's list holds only the services opted in by an update, and those that heal (written by the
reconciler, off the create path). Why not one object per StormService: a policy evaluates a selected set
of params each on its own and needs all to pass, so "this pod's service is listed as healing" (the
eviction policy) cannot be said over one object per service (docs/security.md).

This module is the pure part: keys, the label and the policy objects (the gate's decisions: core/gate.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from stormtopo.core.jsonpatch import pointer
from stormtopo.core.movable import movable
from stormtopo.core.request import is_opted_in, written_scope
from stormtopo.core.vocabulary import (
    ADMITTED_LABEL,
    AIBRIX,
    MANAGED_BY,
    OPTED_IN_CONFIGMAP,
    OPTED_IN_LABEL,
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
LABELLED_PODS_POLICY = "stormtopo-labelled-pods"
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


def _roles(stormservice: Mapping[str, Any] | None) -> list[Any]:
    spec = ((stormservice or {}).get("spec") or {}).get("template") or {}
    roles = (spec.get("spec") or {}).get("roles") if isinstance(spec, Mapping) else None
    return roles if isinstance(roles, list) else []


def _role_labels(role: Any) -> Mapping[str, Any]:
    template = role.get("template") if isinstance(role, Mapping) else None
    meta = template.get("metadata") if isinstance(template, Mapping) else None
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    return labels if isinstance(labels, Mapping) else {}


def labelled(stormservice: Mapping[str, Any] | None) -> bool:
    """It has roles, and every role template carries OPTED_IN_LABEL: every pod of the service does, and
    the admission policy holds it without a list."""
    roles = _roles(stormservice)
    return bool(roles) and all(OPTED_IN_LABEL in _role_labels(role) for role in roles)


def label_roles(stormservice: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The JSON patch that puts OPTED_IN_LABEL on every role template lacking it; the other labels stay."""
    ops: list[dict[str, Any]] = []
    for i, role in enumerate(_roles(stormservice)):
        if not isinstance(role, Mapping) or OPTED_IN_LABEL in _role_labels(role):
            continue
        path = pointer("spec", "template", "spec", "roles", str(i), "template")
        template = role.get("template")
        if not isinstance(template, Mapping):
            ops.append({"op": "add", "path": path, "value": {"metadata": {"labels": {OPTED_IN_LABEL: "true"}}}})
        elif not isinstance(template.get("metadata"), Mapping):
            ops.append({"op": "add", "path": path + "/metadata", "value": {"labels": {OPTED_IN_LABEL: "true"}}})
        elif not isinstance(template["metadata"].get("labels"), Mapping):
            ops.append({"op": "add", "path": path + "/metadata/labels", "value": {OPTED_IN_LABEL: "true"}})
        else:
            ops.append({"op": "add", "path": path + pointer("metadata", "labels", OPTED_IN_LABEL), "value": "true"})
    return ops


def opt_in_patch(operation: str, stormservice: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """What the mutating webhook writes on a StormService (labels_roles_condition, decided again here: a
    review may come from anyone): the opt-in label on its role templates, if it asks for a topology and is
    new, or was labelled on every role before this update."""
    annotations = _meta(stormservice).get("annotations") or {}
    if not is_opted_in(annotations) or not _roles(stormservice):
        return []  # no role to label (an update of one without roles, a finalizer: never waits on stormtopo)
    if operation != "CREATE" and not (operation == "UPDATE" and (labelled(old) or not _roles(old))):
        return []
    return label_roles(stormservice)


def listing(
    stormservice: Mapping[str, Any] | None, prefix_shared_with: str | None = None, rolesets: Iterable[Mapping[str, Any]] = ()
) -> str | None:
    """What its namespace's ConfigMap says of a StormService: nothing unless it carries a network-topology
    annotation (valid or not: an invalid one keeps its last valid constraint). Then its scope, with
    MOVABLE after it while it is movable (the chart's eviction policy lets stormtopo evict pods of those
    services only); a service whose role templates all carry OPTED_IN_LABEL is held by that label, and
    listed only while it is movable, or while one of its `rolesets` (its replicas, as the reconciler knows
    them) still has a role without it: a service opted in by an update whose owner labelled its templates in a
    rollout stays listed until its last replica of the old templates is gone (AIBrix may still make pods of
    it, which carry no label)."""
    annotations = ((stormservice or {}).get("metadata") or {}).get("annotations") or {}
    if not is_opted_in(annotations):
        return None
    if movable(stormservice, prefix_shared_with):
        return written_scope(annotations).value + MOVABLE
    held_by_label = labelled(stormservice) and all(_roleset_labelled(r) for r in rolesets)
    return None if held_by_label else written_scope(annotations).value


def _roleset_labelled(roleset: Mapping[str, Any]) -> bool:
    roles = (roleset.get("spec") or {}).get("roles")
    return isinstance(roles, list) and bool(roles) and all(OPTED_IN_LABEL in _role_labels(role) for role in roles)


def _has_all(of: str, *fields: str) -> str:
    """CEL: every field on the path exists (has() tests only its last one; a missing middle one is an error)."""
    return " && ".join(f"has({of}.{'.'.join(fields[: i + 1])})" for i in range(len(fields)))


def labelled_condition(of: str) -> str:
    """CEL: labelled() of `object` or `oldObject`."""
    roles = f"{of}.spec.template.spec.roles"
    return (
        f"{_has_all(of, 'spec', 'template', 'spec', 'roles')} && size({roles}) > 0 "
        f"&& {roles}.all(r, has(r.template) && has(r.template.metadata) "
        f"&& has(r.template.metadata.labels) && '{OPTED_IN_LABEL}' in r.template.metadata.labels)"
    )


def _opted_in_condition(of: str) -> str:
    keys = "[" + ", ".join(f"'{k}'" for k in REQUEST_ANNOTATIONS) + "]"
    return f"has({of}.metadata.annotations) && {keys}.exists(k, k in {of}.metadata.annotations)"


def _has_roles(of: str) -> str:
    roles = f"{of}.spec.template.spec.roles"
    return f"({_has_all(of, 'spec', 'template', 'spec', 'roles')} && size({roles}) > 0)"


def labels_roles_condition() -> str:
    """CEL for the mutating webhook that labels role templates: a StormService that carries a request and
    a role template without the label, on its create, or on an update whose stored version had the label
    on every role or no role at all (a re-apply of a manifest without it, a new role). A service opted in
    by an update keeps its templates unlabelled (labelling them would roll its replicas): the list holds
    it instead."""
    return (
        f"({_opted_in_condition('object')}) && !({labelled_condition('object')}) "
        f"&& {_has_roles('object')} && (request.operation == 'CREATE' || ({labelled_condition('oldObject')}) "
        f"|| !{_has_roles('oldObject')})"
    )


LABEL_POLICY = "stormtopo-opt-in-label"


def opt_in_label_policy(api_version: str) -> list[dict[str, Any]]:
    """The MutatingAdmissionPolicy (admissionregistration.k8s.io/`api_version`: v1 from Kubernetes 1.36, v1beta1
    in 1.34 and 1.35 where enabled) with its binding that puts OPTED_IN_LABEL on role templates, as
    opt_in_patch does, inside the API server: a create costs no webhook call. Fails open, to the webhook."""
    roles = "object.spec.template.spec.roles"
    role = "r"
    path = '"/spec/template/spec/roles/" + string(i) + "/template'
    key = OPTED_IN_LABEL.replace("~", "~0").replace("/", "~1")
    labels = f'{{"{OPTED_IN_LABEL}": "true"}}'

    def add(to: str, value: str) -> str:
        return f'JSONPatch{{op: "add", path: {path}{to}", value: {value}}}'

    in_template = '{"metadata": {"labels": ' + labels + "}}"
    in_metadata = '{"labels": ' + labels + "}"
    true = '"true"'
    patch = (
        f"!has({role}.template) ? {add('', in_template)}"
        f" : !has({role}.template.metadata) ? {add('/metadata', in_metadata)}"
        f" : !has({role}.template.metadata.labels) ? {add('/metadata/labels', labels)}"
        f" : {add('/metadata/labels/' + key, true)}"
    )
    carries = (
        f"has({role}.template) && has({role}.template.metadata) && has({role}.template.metadata.labels) "
        f"&& '{OPTED_IN_LABEL}' in {role}.template.metadata.labels"
    )
    group, version = AIBRIX
    policy = {
        "apiVersion": f"admissionregistration.k8s.io/{api_version}",
        "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": LABEL_POLICY, "labels": dict(MANAGED_BY)},
        "spec": {
            # Ignore: a create the policy cannot label (the API server just restarted and has not loaded the CRD's
            # schema yet) goes on to the webhook, which labels it, or refuses it while stormtopo is down; and a
            # StormService that never opted in never waits on it.
            "failurePolicy": "Ignore",
            "reinvocationPolicy": "IfNeeded",
            "matchConstraints": {
                "resourceRules": [
                    {"apiGroups": [group], "apiVersions": [version], "operations": ["CREATE", "UPDATE"], "resources": ["stormservices"]}
                ]
            },
            "matchConditions": [
                {"name": "has-roles", "expression": _has_all("object", "spec", "template", "spec", "roles")},
                {"name": "labels-roles", "expression": labels_roles_condition()},
            ],
            "mutations": [
                {
                    "patchType": "JSONPatch",
                    # transformList (a two-variable comprehension, Kubernetes 1.33 on): index and role together, every role.
                    "jsonPatch": {"expression": f"{roles}.transformList(i, r, !({carries}), {patch})"},
                }
            ],
        },
    }
    binding = {
        "apiVersion": f"admissionregistration.k8s.io/{api_version}",
        "kind": "MutatingAdmissionPolicyBinding",
        "metadata": {"name": LABEL_POLICY, "labels": dict(MANAGED_BY)},
        "spec": {"policyName": LABEL_POLICY},
    }
    return [policy, binding]


def requests_topology_condition() -> str:
    """CEL for the gate: a StormService that carries a network-topology annotation on role templates without
    OPTED_IN_LABEL, on an update that opts it in or changes its scope (what the list says of it), or on a
    create with roles (validating webhooks see the object once mutated: its labelling failed, see
    unlabelled_create). Other updates of an opted-in StormService (scaling, a rollout) never call it, so
    those go on while stormtopo is down."""
    opted_in = _opted_in_condition("object")
    was_opted_in = _opted_in_condition("oldObject")

    def scope(of: str) -> str:
        return f"(has({of}.metadata.annotations) && '{SCOPE}' in {of}.metadata.annotations ? {of}.metadata.annotations['{SCOPE}'] : '')"

    return (
        f"({opted_in}) && !({labelled_condition('object')}) && (request.operation == 'CREATE' ? {_has_roles('object')} "
        f": (!({was_opted_in}) || {scope('object')} != {scope('oldObject')}))"
    )


def admission_policy() -> list[dict[str, Any]]:
    """Three ValidatingAdmissionPolicies with their bindings (admissionregistration.k8s.io/v1,
    Kubernetes >= 1.30), each matching only objects with a label (an object selector):
    - pods carrying OPTED_IN_LABEL must have been admitted by stormtopo;
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
    # A pod of a StormService created with a request carries the label: held by it, with no list to read.
    labelled_pods = _policy(
        LABELLED_PODS_POLICY,
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]},
        (OPTED_IN_LABEL, STORMSERVICE_LABEL),  # an AIBrix pod: the only ones stormtopo's pod webhook sees
        {
            "expression": f"has(object.metadata.labels) && '{ADMITTED_LABEL}' in object.metadata.labels",
            "messageExpression": (
                "'this pod carries " + OPTED_IN_LABEL + " (its StormService asks for a network topology), and stormtopo has "
                "not admitted it (is the stormtopo webhook running?); it is created once stormtopo is back'"
            ),
            "reason": "Forbidden",
        },
    )
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
    return [*labelled_pods, *pods, *podgroups]


def _policy(
    name: str,
    rule: dict[str, Any],
    label: str | tuple[str, ...],
    validation: dict[str, str],
    variables: list[dict[str, str]] | None = None,
) -> list[dict[str, Any]]:
    labels = (label,) if isinstance(label, str) else label
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name, "labels": dict(MANAGED_BY)},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [rule],
                "objectSelector": {"matchExpressions": [{"key": key, "operator": "Exists"} for key in labels]},
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


def _meta(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return (obj or {}).get("metadata") or {}
