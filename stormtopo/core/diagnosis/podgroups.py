"""Opted-in StormServices' PodGroups: a sample of them against the networkTopology of their request, as the
operator's reconciler writes it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from stormtopo.core.capabilities import cluster_tiers
from stormtopo.core.diagnosis.findings import Finding, Level, _names, _plural
from stormtopo.core.diagnosis.snapshot import ServiceSample, Snapshot
from stormtopo.core.gang import template_spec
from stormtopo.core.narrowing import held_tier
from stormtopo.core.podgroup import desired_fields, service_fields, service_group_name
from stormtopo.core.request import ClusterTiers, RequestError, Scope, TopologyRequest, request_of, written_scope


def podgroup_names(stormservice: Mapping[str, Any], rolesets: Iterable[Mapping[str, Any]]) -> list[str]:
    """The PodGroups whose networkTopology `check_podgroups` compares: each replica's, or the service's own
    with scope StormService (what the shell reads)."""
    if written_scope(stormservice["metadata"].get("annotations")) is Scope.STORMSERVICE:
        return [service_group_name(stormservice["metadata"]["name"])]
    return sorted(str(r["metadata"]["name"]) for r in rolesets)


def _desired(sample: ServiceSample, request: TopologyRequest, tiers: ClusterTiers | None, now: float) -> dict[str, dict[str, Any]]:
    """PodGroup name -> the topology fields its spec should carry, as the operator's reconciler writes them."""
    stormservice = sample.stormservice
    if request.scope is Scope.STORMSERVICE:
        replicas = int((stormservice.get("spec") or {}).get("replicas") or 1)
        fields = service_fields(request, template_spec(stormservice), replicas)
        wanted = {"networkTopology": fields["networkTopology"]}
        if "subGroupPolicy" in fields:
            wanted["subGroupPolicy.networkTopology"] = fields["subGroupPolicy"][0]["networkTopology"]
        return {service_group_name(stormservice["metadata"]["name"]): wanted}
    out = {}
    for roleset in sample.rolesets:
        name = str(roleset["metadata"]["name"])
        held = held_tier(stormservice, name, sample.podgroups.get(name), request, tiers, now)
        fields = desired_fields(request, roleset.get("spec") or {}, held)
        out[name] = {"networkTopology": fields["networkTopology"]}
    return out


def _lacks(podgroup: Mapping[str, Any], wanted: Mapping[str, Any]) -> str | None:
    spec = podgroup.get("spec") or {}
    have = spec.get("networkTopology")
    if have is None:
        return "has no networkTopology"
    if have != wanted["networkTopology"]:
        return f"has networkTopology {have}, its request is {wanted['networkTopology']}"
    if "subGroupPolicy.networkTopology" in wanted:
        replica = [p.get("networkTopology") for p in spec.get("subGroupPolicy") or [] if isinstance(p, Mapping)]
        if wanted["subGroupPolicy.networkTopology"] not in replica:
            return f"has no replica networkTopology {wanted['subGroupPolicy.networkTopology']} in its subGroupPolicy"
    return None


def check_podgroups(snapshot: Snapshot) -> list[Finding]:
    """Opted-in StormServices (a sample of at most SAMPLE) whose PodGroups lack the networkTopology of their request."""
    check = "podgroups"
    if "stormservices" in snapshot.unreadable:
        return [
            Finding(
                Level.WARNING,
                check,
                f"StormServices could not be read ({snapshot.unreadable['stormservices']})",
                "check that AIBrix's CRDs are installed and that you may list stormservices, rolesets and podgroups",
            )
        ]
    tiers = None if "hypernodes" in snapshot.unreadable else cluster_tiers(snapshot.hypernodes, snapshot.podgroup_schema)
    lacking: list[str] = []
    invalid: list[str] = []
    for sample in snapshot.services:
        meta = sample.stormservice["metadata"]
        where = f"{meta.get('namespace')}/{meta['name']}"
        request = request_of(sample.stormservice, tiers)
        if isinstance(request, RequestError):
            invalid.append(f"{where} ({request})")
            continue
        if request is None:
            continue
        for name, wanted in sorted(_desired(sample, request, tiers, snapshot.now).items()):
            podgroup = sample.podgroups.get(name)
            problem = None if podgroup is None else _lacks(podgroup, wanted)  # none yet: AIBrix or the operator creates it
            if problem:
                lacking.append(f"StormService {where}: PodGroup {name} {problem}")
    checked = len(snapshot.services)
    scope = f"{_plural(checked, 'opted-in StormService')} checked" + (
        f" (a sample: the first {checked} found; others not checked)" if snapshot.services_more else ""
    )
    findings: list[Finding] = []
    if lacking:
        findings.append(
            Finding(
                Level.ERROR,
                check,
                f"{scope}; {_plural(len(lacking), 'PodGroup')} without the networkTopology of their request: {_names(lacking, 3)}; "
                "Volcano may place "
                "these replicas across any switch",
                "check that the operator runs and leads (see the webhooks and leader lines), then stormtopo explain NAMESPACE/NAME",
            )
        )
    if invalid:
        findings.append(
            Finding(
                Level.WARNING,
                check,
                f"{_plural(len(invalid), 'StormService')} with an invalid request (the last valid one stays applied): {_names(invalid, 3)}",
                "fix the annotations (README.md#the-annotations); the Warning Event on each says what is accepted",
            )
        )
    if not findings:
        findings.append(Finding(Level.OK, check, f"{scope}: every PodGroup carries the networkTopology of its request"))
    return findings
