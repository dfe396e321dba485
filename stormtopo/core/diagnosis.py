"""`stormtopo doctor`: read-only checks of a cluster, as pure functions over what the doctor read.

The shell (commands/doctor.py) reads the cluster into a `Snapshot`; each check here turns it into
findings, one line each: a level (ok, warning, error), the check's name, what was found and what to
do. A check that finds nothing wrong says so in one `ok` line. An error is something that silently
breaks topology-aware scheduling; a warning is something to look at.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import yaml

from stormtopo.core.capabilities import MIN_VOLCANO, TESTED_AIBRIX, TESTED_VOLCANO, TIER_NAMES_VOLCANO, cluster_tiers
from stormtopo.core.gang import template_spec
from stormtopo.core.moves import moving_tier
from stormtopo.core.optin import PODGROUPS_POLICY, PODS_POLICY, listing
from stormtopo.core.podgroup import desired_fields, service_fields, service_group_name
from stormtopo.core.request import RequestError, Scope, TopologyRequest, request_of
from stormtopo.core.topology.hypernodes import topology_from_hypernodes
from stormtopo.core.topology.node_tier import exact_name
from stormtopo.core.topology.selectors import selected_nodes
from stormtopo.core.topology.tree import Topology
from stormtopo.core.vocabulary import MANAGED_BY_LABEL, NODE_TIER_LABEL, OPERATOR_NAME, TOPOLOGY_SOURCE_LABEL

# Where Volcano's own install keeps its configuration (its chart, release "volcano").
VOLCANO_NAMESPACE = "volcano-system"
SCHEDULER_CONFIGMAP = "volcano-scheduler-configmap"
SCHEDULER_CONFIG_KEY = "volcano-scheduler.conf"
CONTROLLER_CONFIGMAP = "volcano-controller-configmap"
CONTROLLER_CONFIG_KEY = "volcano-controller.conf"
AIBRIX_NAMESPACE = "aibrix-system"

# Opted-in StormServices whose PodGroups are compared: bounded, so the doctor stays cheap at 10,000 services.
SAMPLE = 200
LEASE_GRACE = 30.0  # seconds beyond a Lease's duration before it counts as stale: clocks of two machines differ
LISTED = 5  # names quoted per finding; the rest are counted

NTA = "network-topology-aware"
# docs/install.md, "Volcano": Volcano's default actions (backfill places pods that ask for no resources), and the
# plugins stormtopo relies on or recommends beside network-topology-aware.
RECOMMENDED_ACTIONS = ("enqueue", "allocate", "backfill")
RECOMMENDED_PLUGINS = ("gang", "predicates", "nodeorder", "binpack")
GPU_RESOURCE = "nvidia.com/gpu"


class Level(StrEnum):
    OK = "ok"
    WARNING = "warning"
    ERROR = "error"


@dataclass(frozen=True)
class Finding:
    level: Level
    check: str
    found: str
    todo: str = ""  # what to do; empty for ok


@dataclass(frozen=True)
class Source:
    """A configuration text, or why it could not be read; `where` names the file or the ConfigMap."""

    where: str
    text: str | None = None
    problem: str | None = None


@dataclass(frozen=True)
class ServiceSample:
    stormservice: Mapping[str, Any]
    rolesets: tuple[Mapping[str, Any], ...]
    podgroups: Mapping[str, Mapping[str, Any]]  # by name, in the StormService's namespace


@dataclass(frozen=True)
class Snapshot:
    """What the doctor read. `unreadable`: what could not be read (hypernodes, nodes, podgroup-crd,
    deployments, admission, leases, stormservices) -> why (HTTP 403, not found); its fields are then empty."""

    now: float  # wall-clock seconds, to judge the Lease's renewTime and moves' deadlines
    scheduler_config: Source
    controller_config: Source | None = None
    hypernodes: tuple[Mapping[str, Any], ...] = ()
    nodes: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # name -> labels
    podgroup_schema: Mapping[str, Any] | None = None
    images: tuple[tuple[str, str], ...] = ()  # (namespace/deployment, image) in Volcano's and AIBrix's namespaces
    admission: tuple[Mapping[str, Any], ...] = ()  # webhook configurations, admission policies and bindings
    expected_admission: tuple[Mapping[str, Any], ...] = ()  # what stormtopo registers (operator/webhook.py)
    lease_name: str = "stormtopo-operator"
    leases: tuple[Mapping[str, Any], ...] = ()
    services: tuple[ServiceSample, ...] = ()
    services_more: bool = False  # more opted-in StormServices exist than were sampled
    unreadable: Mapping[str, str] = field(default_factory=dict)


def _names(items: Sequence[str], limit: int = LISTED) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


# -- 1. Volcano's scheduler configuration ------------------------------------------------------


def _arguments(option: Mapping[str, Any]) -> Mapping[str, Any]:
    arguments = option.get("arguments")
    return arguments if isinstance(arguments, Mapping) else {}


def check_scheduler_config(snapshot: Snapshot) -> list[Finding]:
    """network-topology-aware enabled (else a hard networkTopology is not enforced), no task-topology
    (panics vc-scheduler), and the actions and plugins docs/install.md recommends."""
    check, source = "scheduler-config", snapshot.scheduler_config
    if source.text is None:
        return [
            Finding(
                Level.WARNING,
                check,
                f"Volcano's scheduler configuration could not be read ({source.where}: {source.problem})",
                "pass the file vc-scheduler runs with (its --scheduler-conf) as --scheduler-config FILE",
            )
        ]
    try:
        conf = yaml.safe_load(source.text)
    except yaml.YAMLError as exc:
        conf, problem = None, f"not valid YAML ({str(exc).splitlines()[0]})"
    else:
        problem = "not a mapping with actions and tiers"
    if not isinstance(conf, Mapping):
        return [
            Finding(
                Level.ERROR,
                check,
                f"{source.where}: {problem}; vc-scheduler keeps its previous configuration, at start Volcano's default (without {NTA})",
                "fix the file",
            )
        ]
    plugins: dict[str, Mapping[str, Any]] = {}
    for tier in conf.get("tiers") or []:
        options = tier.get("plugins") if isinstance(tier, Mapping) else None
        for option in options if isinstance(options, list) else []:
            if isinstance(option, Mapping) and option.get("name"):
                plugins.setdefault(str(option["name"]), option)
    actions = [a.strip() for a in str(conf.get("actions") or "").split(",") if a.strip()]
    findings: list[Finding] = []
    nta = plugins.get(NTA)
    install = "docs/install.md#volcano"
    if nta is None:
        findings.append(
            Finding(
                Level.ERROR,
                check,
                f"{source.where}: the {NTA} plugin is not enabled, so Volcano does not enforce a hard networkTopology: "
                "replicas are placed across any switch",
                f"add `- name: {NTA}` to a tier's plugins ({install})",
            )
        )
    elif nta.get("enabledHyperNodeGradient") is False:
        findings.append(
            Finding(
                Level.ERROR,
                check,
                f"{source.where}: {NTA} has enabledHyperNodeGradient: false, so Volcano does not keep a gang within its tier",
                "remove enabledHyperNodeGradient from the plugin's options",
            )
        )
    if "task-topology" in plugins:
        findings.append(
            Finding(
                Level.ERROR,
                check,
                f"{source.where}: the task-topology plugin is enabled; in Volcano v1.15.1 it panics vc-scheduler as soon as a "
                "gang with a hard network topology has more than one HyperNode it could go to (volcano-sh/volcano#4003)",
                f"remove task-topology ({install})",
            )
        )
    missing = [f"action {a}" for a in RECOMMENDED_ACTIONS if a not in actions]
    missing += [f"plugin {p}" for p in RECOMMENDED_PLUGINS if p not in plugins]
    binpack = plugins.get("binpack")
    if binpack is not None and GPU_RESOURCE not in str(_arguments(binpack).get("binpack.resources", "")):
        missing.append(f"binpack.resources: {GPU_RESOURCE} (GPUs packed rather than spread)")
    if missing:
        findings.append(
            Finding(
                Level.WARNING,
                check,
                f"{source.where}: recommended but missing: {', '.join(missing)}",
                f"add them as the local control plane runs them ({install})",
            )
        )
    if nta is not None and _node_tier(snapshot.hypernodes):
        normal = str(_arguments(nta).get("hypernode.binpack.normal-pod.enable", "")).lower()
        if normal != "false":
            findings.append(
                Finding(
                    Level.WARNING,
                    check,
                    f"{source.where}: the node tier is on (tier-0 HyperNodes of stormtopo's) and {NTA} scores pods without a "
                    "topology over every HyperNode, the tier-0 ones included, which slows them",
                    f"set hypernode.binpack.normal-pod.enable: false in {NTA}'s arguments (docs/node-tier.md#volcanos-setting)",
                )
            )
    if not findings:
        findings.append(
            Finding(Level.OK, check, f"{source.where}: {NTA} enabled; actions {', '.join(actions)}; recommended plugins present")
        )
    return findings


# -- 2. The HyperNode tree ---------------------------------------------------------------------


def _node_tier(hypernodes: Iterable[Mapping[str, Any]]) -> list[str]:
    """The tier-0 HyperNodes stormtopo's node tier wrote."""
    out = []
    for hn in hypernodes:
        labels = (hn.get("metadata") or {}).get("labels") or {}
        if labels.get(NODE_TIER_LABEL) == "true" and labels.get(MANAGED_BY_LABEL) == OPERATOR_NAME:
            out.append(str(hn["metadata"]["name"]))
    return sorted(out)


def _discovery(snapshot: Snapshot) -> list[str]:
    """Volcano's HyperNode discovery, wherever it shows: enabled sources in the controller's (or scheduler's)
    configuration, and HyperNodes with its source label."""
    sources: set[str] = set()
    for config in (snapshot.controller_config, snapshot.scheduler_config):
        if config is None or not config.text:
            continue
        try:
            conf = yaml.safe_load(config.text)
        except yaml.YAMLError:
            continue
        entries = conf.get("networkTopologyDiscovery") if isinstance(conf, Mapping) else None
        for entry in entries if isinstance(entries, list) else []:
            if isinstance(entry, Mapping) and entry.get("enabled") is True:
                sources.add(f"source {entry.get('source')} in {config.where}")
    labelled = sorted(
        str(hn["metadata"]["name"])
        for hn in snapshot.hypernodes
        if TOPOLOGY_SOURCE_LABEL in ((hn.get("metadata") or {}).get("labels") or {})
    )
    if labelled:
        sources.add(f"{_plural(len(labelled), 'HyperNode')} labelled {TOPOLOGY_SOURCE_LABEL} ({_names(labelled)})")
    return sorted(sources)


def _cycles(children: Mapping[str, Sequence[str]]) -> list[list[str]]:
    """Each cycle of HyperNodes naming one another, once, as the path that closes it."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    found: list[list[str]] = []
    for root in sorted(children):
        if state.get(root):
            continue
        path: list[str] = [root]
        stack: list[Iterator[str]] = [iter(sorted(children.get(root, ())))]
        state[root] = 1
        while stack:
            child = next(stack[-1], None)
            if child is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(child) == 1:
                found.append([*path[path.index(child) :], child])
            elif not state.get(child) and child in children:
                state[child] = 1
                path.append(child)
                stack.append(iter(sorted(children.get(child, ()))))
    return found


def _heights(topology: Topology) -> dict[str, int]:
    """Levels of HyperNodes from each HyperNode down to its nodes (a leaf: 1). Call only on a tree without cycles."""
    heights: dict[str, int] = {}

    def height(name: str) -> int:
        if name not in heights:
            switch = topology.switches[name]
            below = [height(c) for c in switch.children if c in topology.switches]
            heights[name] = 1 + max(below, default=0)
        return heights[name]

    for name, switch in topology.switches.items():
        if switch.children or switch.nodes:  # an empty HyperNode means no depth
            height(name)
    return heights


def check_hypernodes(snapshot: Snapshot) -> list[Finding]:
    """Two parents and cycles (Volcano then places no gang with a network topology), leaves naming nodes
    or HyperNodes that do not exist, tiers meaning different depths, discovery beside the node tier."""
    check = "hypernodes"
    if "hypernodes" in snapshot.unreadable:
        return [
            Finding(
                Level.WARNING,
                check,
                f"HyperNodes could not be read ({snapshot.unreadable['hypernodes']})",
                "check that Volcano's CRDs are installed and that you may list hypernodes.topology.volcano.sh",
            )
        ]
    hypernodes = {str(hn["metadata"]["name"]): hn for hn in snapshot.hypernodes}
    if not hypernodes:
        return [
            Finding(
                Level.ERROR,
                check,
                "no HyperNodes: Volcano has no tree to keep a gang within, so no topology request can be met",
                "describe the switch tree: stormtopo topology apply -f FILE, or stormtopo topology from-labels (docs/install.md)",
            )
        ]
    nodes_known = "nodes" not in snapshot.unreadable
    parents: dict[str, set[str]] = {}  # a HyperNode member -> the HyperNodes naming it
    node_parents: dict[str, set[str]] = {}
    children: dict[str, list[str]] = {}
    missing_nodes: list[str] = []
    missing_members: list[str] = []
    tiers: dict[str, int] = {name: int((hn.get("spec") or {}).get("tier", 1)) for name, hn in hypernodes.items()}
    for name, hn in sorted(hypernodes.items()):
        for member in (hn.get("spec") or {}).get("members") or []:
            selector = member.get("selector") or {}
            if member.get("type") == "HyperNode":
                child = (selector.get("exactMatch") or {}).get("name")  # Volcano resolves HyperNode members by exactMatch only
                if not child:
                    continue
                parents.setdefault(child, set()).add(name)
                children.setdefault(name, []).append(child)
                if child not in hypernodes:
                    missing_members.append(f"{name} names HyperNode {child}")
            elif member.get("type") == "Node":
                for node in selected_nodes(selector, snapshot.nodes):
                    node_parents.setdefault(node, set()).add(name)
                named = exact_name(member)
                if nodes_known and named and named not in snapshot.nodes:
                    missing_nodes.append(f"{name} names node {named}")
    findings: list[Finding] = []
    twice = [f"HyperNode {c} (in {', '.join(sorted(p))})" for c, p in sorted(parents.items()) if len(p) > 1 and c in hypernodes]
    nodes_twice = [f"node {n} (in {', '.join(sorted(p))})" for n, p in sorted(node_parents.items()) if len(p) > 1]
    if twice or nodes_twice:
        why = []
        if twice:
            why.append("Volcano refuses a HyperNode with two parents and then skips every gang with a network topology")
        if nodes_twice:
            why.append("a node in two HyperNodes is in two domains at once, so a tier no longer means one switch")
        findings.append(
            Finding(
                Level.ERROR,
                check,
                f"{_plural(len(twice) + len(nodes_twice), 'member')} with two parents: {_names(twice + nodes_twice)}; {'; '.join(why)}",
                "keep each node and HyperNode in exactly one HyperNode: remove it from all but one (kubectl edit hypernode NAME)",
            )
        )
    cycles = _cycles({name: children.get(name, []) for name in hypernodes})
    if cycles:
        findings.append(
            Finding(
                Level.ERROR,
                check,
                f"HyperNodes name one another in a cycle: {_names([' -> '.join(c) for c in cycles])}; Volcano cannot build the tree",
                "remove the member that points back up the tree",
            )
        )
    if missing_nodes or missing_members:
        findings.append(
            Finding(
                Level.WARNING,
                check,
                f"members that do not exist: {_names(missing_nodes + missing_members)}; they add nothing to their domain",
                "remove them, or re-render the tree from its source (stormtopo topology apply -f FILE); a node the node tier "
                "just removed is named again by its next pass",
            )
        )
    upward = [
        f"{c} (tier {tiers[c]}) in {p} (tier {tiers[p]})"
        for p, cs in sorted(children.items())
        for c in cs
        if c in tiers and tiers[c] >= tiers[p]
    ]
    if not cycles:
        topology = topology_from_hypernodes(hypernodes.values(), snapshot.nodes)
        heights = _heights(topology)
        by_tier: dict[int, dict[int, list[str]]] = {}
        for name, h in sorted(heights.items()):
            by_tier.setdefault(topology.switches[name].tier, {}).setdefault(h, []).append(name)
        mixed = [
            f"tier {tier} is "
            + " but ".join(f"{_plural(h, 'level')} above the nodes at {_names(names, 2)}" for h, names in sorted(hs.items()))
            for tier, hs in sorted(by_tier.items())
            if len(hs) > 1
        ]
        if mixed or upward:
            findings.append(
                Finding(
                    Level.WARNING,
                    check,
                    "tiers mean different depths in different trees: " + "; ".join([*mixed, *(f"{u}" for u in upward)]),
                    "give each level of switches the same tier in every tree, below its parent's: a request's tier then spans "
                    "the same switches wherever its replicas land",
                )
            )
    discovery, node_tier = _discovery(snapshot), _node_tier(hypernodes.values())
    if discovery and node_tier:
        fought = sorted(
            name
            for name, hn in hypernodes.items()
            if TOPOLOGY_SOURCE_LABEL in ((hn.get("metadata") or {}).get("labels") or {})
            and any(c in node_tier for c in children.get(name, []))
        )
        also = f"; discovered leaves naming tier-0 HyperNodes (named with --node-tier-leaf): {_names(fought)}" if fought else ""
        findings.append(
            Finding(
                Level.WARNING,
                check,
                f"Volcano's HyperNode discovery ({'; '.join(discovery)}) runs beside stormtopo's node tier "
                f"({_plural(len(node_tier), 'tier-0 HyperNode')}){also}",
                "leave discovered leaves out of --node-tier-leaf (chart: nodeTier.leaves): the discovery writes their members "
                "back at every sync and the two fight; with two networkTopologyTypes the node tier lists nothing "
                "(COMPATIBILITY.md#volcanos-hypernode-discovery)",
            )
        )
    if not findings:
        depth = max(tiers.values(), default=0)
        findings.append(
            Finding(
                Level.OK,
                check,
                f"{_plural(len(hypernodes), 'HyperNode')}, tiers up to {depth}, over {_plural(len(node_parents), 'node')}: "
                "one parent each, no cycles, every member exists",
            )
        )
    return findings


# -- 3. Versions --------------------------------------------------------------------------------

_VERSION = re.compile(r"v?(\d+)\.(\d+)\.(\d+)(?:[-+][0-9A-Za-z.-]+)?")


def image_tag(image: str) -> tuple[str, str | None]:
    """An image's repository (without registry port confusion) and tag; tag None when pinned by digest alone."""
    reference = image.split("@", 1)[0]
    repository, _, tag = reference.rpartition(":")
    if not repository or "/" in tag:  # no tag: the colon was a registry's port
        return reference, None
    return repository, tag


def parse_version(text: str | None) -> tuple[int, int, int] | None:
    match = _VERSION.fullmatch(text or "")
    return (int(match[1]), int(match[2]), int(match[3])) if match else None


def _component_images(images: Iterable[tuple[str, str]]) -> dict[str, list[tuple[str, str | None]]]:
    """Volcano's and AIBrix's controller images, as (deployment, tag)."""
    out: dict[str, list[tuple[str, str | None]]] = {"Volcano": [], "AIBrix": []}
    for deployment, image in images:
        repository, tag = image_tag(image)
        base = repository.rsplit("/", 1)[-1]
        if base in ("vc-scheduler", "vc-controller-manager"):
            out["Volcano"].append((deployment, tag))
        elif base == "controller-manager" and "aibrix" in repository:
            out["AIBrix"].append((deployment, tag))
    return out


def check_versions(snapshot: Snapshot) -> list[Finding]:
    """AIBrix's and Volcano's releases (from their controllers' images) against COMPATIBILITY.md's tested pairs
    (core/capabilities.py), and what the installed PodGroup CRD offers."""
    check = "versions"
    findings: list[Finding] = []
    found = _component_images(snapshot.images)
    schema_known = snapshot.podgroup_schema is not None
    offers = cluster_tiers((), snapshot.podgroup_schema)
    if schema_known and not offers.has_network_topology:
        findings.append(
            Finding(
                Level.ERROR,
                check,
                "the PodGroup CRD has no spec.networkTopology (Volcano older than 1.12): no topology can be requested",
                "upgrade Volcano to 1.12 or newer (1.14 or newer for tier names and nested placement)",
            )
        )
    for component, tested, namespace in (("Volcano", TESTED_VOLCANO, VOLCANO_NAMESPACE), ("AIBrix", TESTED_AIBRIX, AIBRIX_NAMESPACE)):
        tags = sorted({tag or "no tag" for _, tag in found[component]})
        where = ", ".join(sorted({d for d, _ in found[component]}))
        matrix = f"{', '.join(tested)} (COMPATIBILITY.md)"
        if len(tags) > 1:
            findings.append(
                Finding(
                    Level.WARNING, check, f"{component}: controllers run different releases ({where}: {', '.join(tags)})", "run one release"
                )
            )
            continue
        version = parse_version(tags[0]) if tags else None
        if version is None:
            why = (
                f"unknown (the image of {where} carries no release tag)"
                if tags
                else f"unknown (no Deployment in {namespace} runs its controller image)"
            )
            if "deployments" in snapshot.unreadable:
                why = f"unknown (Deployments in {namespace} could not be read: {snapshot.unreadable['deployments']})"
            if component == "Volcano" and schema_known:
                why += "; its PodGroup CRD has " + (
                    "highestTierName and subGroupPolicy (1.14 or newer)"
                    if offers.has_tier_name_field
                    else "no highestTierName (1.12 or 1.13)"
                )
            findings.append(Finding(Level.WARNING, check, f"{component} {why}", f"check it by hand; tested: {matrix}"))
            continue
        release = tags[0] if tags[0].startswith("v") else f"v{tags[0]}"
        if component == "Volcano" and version[:2] < MIN_VOLCANO:
            findings.append(
                Finding(
                    Level.ERROR, check, f"Volcano {release} ({where}) has no PodGroup networkTopology", "upgrade Volcano to 1.12 or newer"
                )
            )
        elif release in tested:
            note = "; tier names and nested placement need 1.14" if component == "Volcano" and version[:2] < TIER_NAMES_VOLCANO else ""
            findings.append(Finding(Level.OK, check, f"{component} {release} ({where}): tested{note}"))
        else:
            findings.append(
                Finding(
                    Level.WARNING,
                    check,
                    f"{component} {release} ({where}) was not tested with stormtopo",
                    f"prefer a tested release: {matrix}",
                )
            )
    return findings


# -- 4. Webhooks and the leader Lease -------------------------------------------------------------

# Why each admission object matters, by its kind (webhook configurations) or name (policies).
_CONSEQUENCE = {
    "MutatingWebhookConfiguration": "opted-in pods and PodGroups get no task, gang or networkTopology at admission",
    "ValidatingWebhookConfiguration": "a new opted-in StormService is not listed before it exists, so its pods are not held while "
    "stormtopo is down",
    PODS_POLICY: "pods of opted-in StormServices are not held while stormtopo is down, and may be placed unconstrained",
    PODGROUPS_POLICY: "an update may strip networkTopology from a constrained PodGroup while stormtopo is down",
}


def _webhook_names(obj: Mapping[str, Any]) -> set[str]:
    return {str(w.get("name")) for w in obj.get("webhooks") or []}


def check_admission(snapshot: Snapshot) -> list[Finding]:
    """stormtopo's webhook configurations (found by their webhooks' names) and admission policies with their
    bindings (by name: the chart prefixes them with its release), as operator/webhook.py registers them."""
    check = "webhooks"
    if "admission" in snapshot.unreadable:
        return [
            Finding(
                Level.WARNING,
                check,
                f"admission configuration could not be read ({snapshot.unreadable['admission']})",
                "use a kubeconfig that may list mutatingwebhookconfigurations, validatingwebhookconfigurations and "
                "validatingadmissionpolicies(bindings)",
            )
        ]
    missing: list[str] = []
    why: list[str] = []
    problems: list[str] = []
    twice: list[str] = []
    policies: list[str] = []
    present: list[str] = []  # webhook configurations, then policies with their bindings
    for expected in snapshot.expected_admission:
        kind, name = str(expected.get("kind")), str(expected["metadata"]["name"])
        same_kind = [o for o in snapshot.admission if o.get("kind") == kind]
        if kind.endswith("WebhookConfiguration"):
            hooks = _webhook_names(expected)
            matches = [o for o in same_kind if hooks <= _webhook_names(o)]
            what = f"{kind} with {', '.join(sorted(hooks))}"
            consequence = _CONSEQUENCE.get(kind, "")
            for obj in matches:
                wanted = {str(w["name"]): w for w in expected.get("webhooks") or []}
                for hook in obj.get("webhooks") or []:
                    want = wanted.get(str(hook.get("name")))
                    if want is None:
                        continue
                    config = hook.get("clientConfig") or {}
                    where = f"webhook {hook['name']} of {kind} {obj['metadata']['name']}"
                    if not config.get("caBundle") and "service" in config:
                        problems.append(f"{where} has no caBundle, so the API server cannot verify it and every call fails")
                    if want.get("failurePolicy") and hook.get("failurePolicy") != want["failurePolicy"]:
                        problems.append(f"{where} has failurePolicy {hook.get('failurePolicy')}, not {want['failurePolicy']}")
        elif kind.startswith("ValidatingAdmissionPolicy"):
            matches = [o for o in same_kind if str(o["metadata"]["name"]).endswith(name)]
            what = f"{kind} *{name}"
            policy = name if kind == "ValidatingAdmissionPolicy" else str((expected.get("spec") or {}).get("policyName", ""))
            consequence = _CONSEQUENCE.get(policy, "")
        else:
            continue  # the opted-in ConfigMap: the operator writes it in its own namespace
        if not matches:
            missing.append(what)
            if consequence and consequence not in why:
                why.append(consequence)
        elif len(matches) > 1:
            twice.append(f"{what}: {', '.join(sorted(str(o['metadata']['name']) for o in matches))}")
        elif kind.endswith("WebhookConfiguration"):
            present.append(f"{kind} {matches[0]['metadata']['name']}")
        elif kind == "ValidatingAdmissionPolicy":
            policies.append(str(matches[0]["metadata"]["name"]))
    findings: list[Finding] = []
    if missing:
        findings.append(
            Finding(
                Level.ERROR,
                check,
                f"not registered: {_names(missing, 6)}; so {'; '.join(why)}",
                "install the chart (docs/install.md, step 3), or start the operator with webhook registration on",
            )
        )
    if problems:
        findings.append(
            Finding(
                Level.WARNING,
                check,
                "; ".join(problems),
                "reinstall the chart (helm upgrade); with certMode certManager, check cert-manager's CA injector",
            )
        )
    if twice:
        findings.append(
            Finding(
                Level.WARNING,
                check,
                f"registered more than once (two installs?): {'; '.join(twice)}",
                "uninstall one of them (stormtopo uninstall --delete-webhooks, or helm uninstall)",
            )
        )
    if not findings:
        policies_text = f"admission policies {', '.join(policies)} with their bindings" if policies else ""
        findings.append(Finding(Level.OK, check, f"registered: {', '.join([*present, policies_text] if policies else present)}"))
    return findings


def _timestamp(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def check_leader(snapshot: Snapshot) -> list[Finding]:
    """The operator's Lease: held and renewed within its duration, or nobody reconciles."""
    check, name = "leader", snapshot.lease_name
    if "leases" in snapshot.unreadable:
        return [
            Finding(
                Level.WARNING,
                check,
                f"Lease {name} could not be read ({snapshot.unreadable['leases']})",
                "use a kubeconfig that may list leases",
            )
        ]
    if not snapshot.leases:
        return [
            Finding(
                Level.WARNING,
                check,
                f"no Lease {name}: the operator runs without --leader-elect (one replica, as `stormtopo dev up` runs it) or not at all",
                "check that an operator pod runs (the chart runs two, with leader election)",
            )
        ]
    findings: list[Finding] = []
    for lease in snapshot.leases:
        meta, spec = lease.get("metadata") or {}, lease.get("spec") or {}
        where = f"Lease {meta.get('namespace')}/{meta.get('name')}"
        holder = str(spec.get("holderIdentity") or "")
        renewed = _timestamp(spec.get("renewTime") or spec.get("acquireTime"))
        duration = float(spec.get("leaseDurationSeconds") or 15)
        age = None if renewed is None else snapshot.now - renewed
        todo = f"check the operator's pods in {meta.get('namespace')} and their logs; a Lease left by an uninstalled release can be deleted"
        if not holder:
            # A leader that stops releases the Lease: a clean shutdown, or an operator now run without --leader-elect.
            when = "" if age is None else f" {max(age, 0.0):.0f} s ago"
            findings.append(
                Finding(
                    Level.WARNING,
                    check,
                    f"{where}: released{when} and not taken over: no replica with leader election runs (an operator "
                    "without --leader-elect does not use it)",
                    todo,
                )
            )
        elif age is None or age > duration + LEASE_GRACE:
            last = "never renewed" if age is None else f"last renewed {age:.0f} s ago"
            findings.append(
                Finding(
                    Level.ERROR,
                    check,
                    f"{where}: {last} by {holder}, duration {duration:.0f} s: no replica leads, so PodGroups are not "
                    "reconciled (admission goes on)",
                    todo,
                )
            )
        else:
            findings.append(Finding(Level.OK, check, f"{where}: held by {holder}, renewed {max(age, 0.0):.0f} s ago"))
    return findings


# -- 5. Opted-in StormServices' PodGroups ----------------------------------------------------------


def podgroup_names(stormservice: Mapping[str, Any], rolesets: Iterable[Mapping[str, Any]]) -> list[str]:
    """The PodGroups whose networkTopology `check_podgroups` compares: each replica's, or the service's own
    with scope StormService (what the shell reads)."""
    if (listing(stormservice) or "").startswith(Scope.STORMSERVICE.value):
        return [service_group_name(stormservice["metadata"]["name"])]
    return sorted(str(r["metadata"]["name"]) for r in rolesets)


def _desired(sample: ServiceSample, request: TopologyRequest, now: float) -> dict[str, dict[str, Any]]:
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
        fields = desired_fields(request, roleset.get("spec") or {}, moving_tier(stormservice, name, now))
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
        for name, wanted in sorted(_desired(sample, request, snapshot.now).items()):
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


CHECKS: tuple[Callable[[Snapshot], list[Finding]], ...] = (
    check_scheduler_config,
    check_hypernodes,
    check_versions,
    check_admission,
    check_leader,
    check_podgroups,
)


def diagnose(snapshot: Snapshot) -> list[Finding]:
    return [finding for check in CHECKS for finding in check(snapshot)]


def exit_code(findings: Iterable[Finding]) -> int:
    """0 when no finding is an error, 1 otherwise."""
    return 1 if any(f.level is Level.ERROR for f in findings) else 0
