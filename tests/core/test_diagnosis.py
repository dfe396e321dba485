"""`stormtopo doctor`'s checks (core/diagnosis.py): for each, a snapshot with the problem and one without;
the finding's level, and that its message names the object and what to do."""

from __future__ import annotations

import dataclasses
import datetime
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from stormtopo.core.capabilities import TESTED_AIBRIX, TESTED_VOLCANO
from stormtopo.core.diagnosis import (
    SAMPLE,
    Finding,
    Level,
    ServiceSample,
    Snapshot,
    Source,
    check_admission,
    check_hypernodes,
    check_leader,
    check_podgroups,
    check_scheduler_config,
    check_versions,
    diagnose,
    exit_code,
    image_tag,
    podgroup_names,
)
from stormtopo.core.topology.fabric import parse_topology
from stormtopo.core.topology.hypernodes import hypernode_manifests
from stormtopo.core.topology.node_tier import node_tier_manifests
from stormtopo.core.vocabulary import HIGHEST_TIER, MODE, REPLICA_HIGHEST_TIER, SCOPE, TOPOLOGY_SOURCE_LABEL
from stormtopo.devenv.cluster import SCHEDULER_CONF
from stormtopo.operator.webhook import configuration
from tests import builders
from tests.builders import aibrix_roleset
from tests.core.volcano_crds import podgroup_schema

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = parse_topology((REPO / "examples" / "topology" / "aibrix-1730.yaml").read_text())
HYPERNODES = tuple(hypernode_manifests(EXAMPLE))
NODES = {name: {"kubernetes.io/hostname": name} for name in EXAMPLE.nodes}
NOW = 1_800_000_000.0
HARD1 = {MODE: "hard", HIGHEST_TIER: "1"}
# What the doctor expects, as it computes it, where the API server serves MutatingAdmissionPolicy (as dev up runs it).
EXPECTED = tuple(configuration(b"", label_policy="v1beta1"))
REGISTERED = tuple(configuration(b"ca", url_base="https://127.0.0.1:9443", label_policy="v1beta1"))
IMAGES = (
    ("volcano-system/volcano-scheduler", "docker.io/volcanosh/vc-scheduler:v1.15.1"),
    ("volcano-system/volcano-controllers", "docker.io/volcanosh/vc-controller-manager:v1.15.1"),
    ("aibrix-system/aibrix-controller-manager", "aibrix/controller-manager:v0.7.0"),
)


def rfc3339(when: float) -> str:
    return datetime.datetime.fromtimestamp(when, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease(renewed: float, holder: str = "stormtopo-7d9-abc", duration: int = 15) -> dict[str, Any]:
    return {
        "metadata": {"name": "stormtopo-operator", "namespace": "stormtopo-system"},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": duration, "renewTime": rfc3339(renewed)},
    }


def podgroup(name: str, topology: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    """A gang of two in the default queue, with `topology` where given."""
    body: dict[str, Any] = {"minMember": 2, "queue": "default", **spec}
    if topology is not None:
        body["networkTopology"] = topology
    return builders.podgroup(name, spec=body)


def sample(topology: dict[str, Any] | None = None, annotations: dict[str, str] | None = None) -> ServiceSample:
    replica = aibrix_roleset()
    return ServiceSample(
        builders.service(HARD1 if annotations is None else annotations),
        (replica,),
        {replica["metadata"]["name"]: podgroup(replica["metadata"]["name"], topology)},
    )


HARD1_TOPOLOGY = {"mode": "hard", "highestTierAllowed": 1}


def healthy(**changes: Any) -> Snapshot:
    base = Snapshot(
        now=NOW,
        scheduler_config=Source("file volcano-scheduler.conf", SCHEDULER_CONF),
        hypernodes=HYPERNODES,
        nodes=NODES,
        podgroup_schema=podgroup_schema("v1.15.1"),
        images=IMAGES,
        admission=REGISTERED,
        expected_admission=EXPECTED,
        leases=(lease(NOW - 2),),
        services=(sample(HARD1_TOPOLOGY),),
    )
    return dataclasses.replace(base, **changes)


def only(findings: list[Finding], level: Level) -> Finding:
    assert [f.level for f in findings] == [level], findings
    return findings[0]


def test_a_healthy_cluster_has_no_error_and_exits_0() -> None:
    findings = diagnose(healthy())
    assert {f.check for f in findings} == {"scheduler-config", "hypernodes", "versions", "webhooks", "leader", "podgroups"}
    assert all(f.level is Level.OK for f in findings), findings
    assert exit_code(findings) == 0
    assert exit_code([*findings, Finding(Level.WARNING, "x", "y")]) == 0
    assert exit_code([*findings, Finding(Level.ERROR, "x", "y")]) == 1


# -- 1. Volcano's scheduler configuration ------------------------------------------------------


def without(plugin: str) -> str:
    conf = yaml.safe_load(SCHEDULER_CONF)
    for tier in conf["tiers"]:
        tier["plugins"] = [p for p in tier["plugins"] if p["name"] != plugin]
    return yaml.safe_dump(conf)


def with_plugin(option: dict[str, Any]) -> str:
    conf = yaml.safe_load(without(option["name"]))
    conf["tiers"][-1]["plugins"].append(option)
    return yaml.safe_dump(conf)


def test_scheduler_config_with_network_topology_aware_is_ok() -> None:
    finding = only(check_scheduler_config(healthy()), Level.OK)
    assert "network-topology-aware enabled" in finding.found and "file volcano-scheduler.conf" in finding.found


def test_scheduler_config_without_network_topology_aware_is_an_error() -> None:
    finding = only(check_scheduler_config(healthy(scheduler_config=Source("file x.conf", without("network-topology-aware")))), Level.ERROR)
    assert "file x.conf" in finding.found and "network-topology-aware plugin is not enabled" in finding.found
    assert "add `- name: network-topology-aware`" in finding.todo


def test_a_disabled_hypernode_gradient_is_an_error() -> None:
    text = with_plugin({"name": "network-topology-aware", "enabledHyperNodeGradient": False})
    finding = only(check_scheduler_config(healthy(scheduler_config=Source("file x.conf", text))), Level.ERROR)
    assert "enabledHyperNodeGradient: false" in finding.found and "remove enabledHyperNodeGradient" in finding.todo


def test_task_topology_is_an_error() -> None:
    text = with_plugin({"name": "task-topology"})
    finding = only(check_scheduler_config(healthy(scheduler_config=Source("file x.conf", text))), Level.ERROR)
    assert "task-topology plugin is enabled" in finding.found and "remove task-topology" in finding.todo


def test_missing_recommended_actions_and_plugins_are_a_warning() -> None:
    conf = yaml.safe_load(without("binpack"))
    conf["actions"] = "enqueue, allocate, preempt, gangpreempt"
    finding = only(check_scheduler_config(healthy(scheduler_config=Source("file x.conf", yaml.safe_dump(conf)))), Level.WARNING)
    assert "action backfill" in finding.found and "plugin binpack" in finding.found and "docs/install.md#volcano" in finding.todo


def test_gangpreempt_without_the_plugins_it_needs_is_a_warning() -> None:
    """gangpreempt finds no victim without priority, and ignores the queues' shares without proportion."""
    conf = yaml.safe_load(without("proportion"))
    for tier in conf["tiers"]:
        tier["plugins"] = [p for p in tier["plugins"] if p["name"] != "priority"]
    finding = only(check_scheduler_config(healthy(scheduler_config=Source("file x.conf", yaml.safe_dump(conf)))), Level.WARNING)
    assert "plugin priority (for gangpreempt), plugin proportion (for gangpreempt)" in finding.found, finding.found
    conf["tiers"][-1]["plugins"] += [{"name": "priority"}, {"name": "capacity"}]  # capacity in place of proportion
    findings = check_scheduler_config(healthy(scheduler_config=Source("file x.conf", yaml.safe_dump(conf))))
    assert not any("(for gangpreempt)" in f.found for f in findings), findings
    conf["actions"] = "enqueue, allocate, backfill"  # no gangpreempt: its plugins are not asked for (its absence is)
    findings = check_scheduler_config(healthy(scheduler_config=Source("file x.conf", yaml.safe_dump(conf))))
    assert not any("(for gangpreempt)" in f.found for f in findings)


def with_actions(actions: str) -> Source:
    conf = yaml.safe_load(SCHEDULER_CONF)
    conf["actions"] = actions
    return Source("file x.conf", yaml.safe_dump(conf))


@pytest.mark.parametrize(
    ("actions", "said", "todo"),
    [
        (
            "enqueue, allocate, backfill",
            "no gangpreempt action: Volcano's preempt skips every job with a network topology",
            'actions: "enqueue, allocate, preempt, gangpreempt, backfill"',
        ),
        (
            "enqueue, allocate, preempt, backfill",
            "a high-priority replica in a full cluster stays Pending",
            'actions: "enqueue, allocate, preempt, gangpreempt, backfill"',
        ),
        (
            "enqueue, allocate, gangpreempt, preempt, backfill",
            "gangpreempt runs before preempt",
            'actions: "enqueue, allocate, preempt, gangpreempt, backfill"',
        ),
    ],
)
def test_a_scheduler_config_without_topology_preemption_is_a_warning_with_the_actions_to_set(actions: str, said: str, todo: str) -> None:
    """Issue 41: opting in must not cost a replica its preemption; the doctor names the fix, actions in place."""
    finding = only(check_scheduler_config(healthy(scheduler_config=with_actions(actions))), Level.WARNING)
    assert said in finding.found and todo in finding.todo and "#priority-and-preemption" in finding.todo


def test_the_dev_clusters_actions_preempt_for_topology_jobs_and_others() -> None:
    actions = [a.strip() for a in yaml.safe_load(SCHEDULER_CONF)["actions"].split(",")]
    assert actions.index("preempt") < actions.index("gangpreempt")
    only(check_scheduler_config(healthy(scheduler_config=with_actions(", ".join(actions)))), Level.OK)


def test_an_unreadable_scheduler_config_is_a_warning_asking_for_the_file() -> None:
    source = Source("ConfigMap volcano-system/volcano-scheduler-configmap key volcano-scheduler.conf", problem="HTTP 403: not allowed")
    finding = only(check_scheduler_config(healthy(scheduler_config=source)), Level.WARNING)
    assert "volcano-scheduler-configmap" in finding.found and "HTTP 403" in finding.found
    assert "--scheduler-config FILE" in finding.todo


def test_a_scheduler_config_that_is_not_yaml_is_an_error() -> None:
    finding = only(check_scheduler_config(healthy(scheduler_config=Source("file x.conf", "actions: [enqueue\n"))), Level.ERROR)
    assert "file x.conf: not valid YAML" in finding.found and finding.todo


def test_the_node_tier_without_volcanos_setting_is_a_warning() -> None:
    tier0 = tuple(node_tier_manifests(HYPERNODES, ["node0"]))
    finding = only(check_scheduler_config(healthy(hypernodes=tier0)), Level.WARNING)
    assert "node tier is on" in finding.found and "hypernode.binpack.normal-pod.enable: false" in finding.todo
    text = with_plugin({"name": "network-topology-aware", "arguments": {"hypernode.binpack.normal-pod.enable": False}})
    only(check_scheduler_config(healthy(hypernodes=tier0, scheduler_config=Source("file x.conf", text))), Level.OK)


# -- 2. The HyperNode tree ---------------------------------------------------------------------


def hypernode(name: str, tier: int, nodes: tuple[str, ...] = (), children: tuple[str, ...] = (), **labels: str) -> dict[str, Any]:
    members = [{"type": "Node", "selector": {"exactMatch": {"name": n}}} for n in nodes]
    members += [{"type": "HyperNode", "selector": {"exactMatch": {"name": c}}} for c in children]
    return {"metadata": {"name": name, "labels": dict(labels)}, "spec": {"tier": tier, "members": members}}


def test_the_seed_tree_is_ok_with_and_without_the_node_tier() -> None:
    finding = only(check_hypernodes(healthy()), Level.OK)
    assert "7 HyperNodes, tiers up to 3, over 8 nodes" in finding.found
    only(check_hypernodes(healthy(hypernodes=tuple(node_tier_manifests(HYPERNODES, ["node0", "node5"])))), Level.OK)


def test_a_node_with_a_second_parent_is_an_error() -> None:
    finding = only(check_hypernodes(healthy(hypernodes=(*HYPERNODES, hypernode("extra", 1, ("node0",))))), Level.ERROR)
    assert "node node0 (in extra, s0)" in finding.found and "two parents" in finding.found
    assert "remove it from all but one" in finding.todo


def test_a_tier_0_hypernode_with_a_second_parent_is_an_error() -> None:
    tier0 = tuple(node_tier_manifests(HYPERNODES, ["node0"]))
    finding = only(check_hypernodes(healthy(hypernodes=(*tier0, hypernode("extra", 1, children=("node0.node",))))), Level.ERROR)
    assert "HyperNode node0.node (in extra, s0)" in finding.found


def test_a_hypernode_with_a_second_parent_is_an_error() -> None:
    finding = only(check_hypernodes(healthy(hypernodes=(*HYPERNODES, hypernode("spine9", 2, children=("s0",))))), Level.ERROR)
    assert "HyperNode s0 (in s4, spine9)" in finding.found and "skips every gang with a network topology" in finding.found


def test_a_cycle_is_an_error() -> None:
    tree = (hypernode("a", 2, children=("b",)), hypernode("b", 1, ("node0",), children=("a",)))
    findings = check_hypernodes(healthy(hypernodes=tree))
    cycle = next(f for f in findings if "cycle" in f.found)
    assert cycle.level is Level.ERROR and "a -> b -> a" in cycle.found and "points back up" in cycle.todo


def test_a_leaf_naming_a_node_that_does_not_exist_is_a_warning() -> None:
    finding = only(check_hypernodes(healthy(hypernodes=(*HYPERNODES, hypernode("s9", 1, ("node99",))))), Level.WARNING)
    assert "s9 names node node99" in finding.found and "remove them" in finding.todo


def test_a_tier_that_means_different_depths_is_a_warning() -> None:
    # s9 is tier 2 right above nodes, where the seed tree's tier 2 (s4, s5) is two levels above them.
    finding = only(
        check_hypernodes(healthy(hypernodes=(*HYPERNODES, hypernode("s9", 2, ("node8",))), nodes={**NODES, "node8": {}})), Level.WARNING
    )
    assert "tier 2 is 1 level above the nodes at s9 but 2 levels above the nodes at s4, s5" in finding.found
    assert "same tier in every tree" in finding.todo


def test_volcanos_discovery_beside_the_node_tier_is_a_warning() -> None:
    def discovered(tree: list[dict[str, Any]], leaf: str) -> tuple[dict[str, Any], ...]:
        """`tree` with `leaf` labelled as Volcano's label discovery labels what it wrote."""
        labels = {TOPOLOGY_SOURCE_LABEL: "label"}
        return tuple({**hn, "metadata": {"name": leaf, "labels": labels}} if hn["metadata"]["name"] == leaf else hn for hn in tree)

    tier0 = list(node_tier_manifests(HYPERNODES, ["node0"]))
    finding = only(check_hypernodes(healthy(hypernodes=discovered(tier0, "s3"))), Level.WARNING)
    assert "Volcano's HyperNode discovery (1 HyperNode labelled volcano.sh/network-topology-source (s3))" in finding.found
    assert "beside stormtopo's node tier (1 tier-0 HyperNode)" in finding.found and "--node-tier-leaf" in finding.todo
    # A discovered leaf that names a tier-0 HyperNode: it was named with --node-tier-leaf, and the two fight.
    finding = only(check_hypernodes(healthy(hypernodes=discovered(tier0, "s0"))), Level.WARNING)
    assert "discovered leaves naming tier-0 HyperNodes (named with --node-tier-leaf): s0" in finding.found
    # The same discovery without the node tier is no concern of stormtopo's.
    only(check_hypernodes(healthy(hypernodes=discovered(list(HYPERNODES), "s3"))), Level.OK)
    controller = Source(
        "ConfigMap volcano-system/volcano-controller-configmap", "networkTopologyDiscovery:\n- {source: label, enabled: true}\n"
    )
    finding = only(check_hypernodes(healthy(hypernodes=tuple(tier0), controller_config=controller)), Level.WARNING)
    assert "source label in ConfigMap volcano-system/volcano-controller-configmap" in finding.found


def test_no_hypernodes_is_an_error_and_unreadable_ones_a_warning() -> None:
    finding = only(check_hypernodes(healthy(hypernodes=())), Level.ERROR)
    assert "no HyperNodes" in finding.found and "stormtopo topology apply" in finding.todo
    finding = only(check_hypernodes(healthy(hypernodes=(), unreadable={"hypernodes": "not found"})), Level.WARNING)
    assert "could not be read (not found)" in finding.found


# -- 3. Versions --------------------------------------------------------------------------------


def test_tested_releases_are_ok() -> None:
    findings = check_versions(healthy())
    assert [f.level for f in findings] == [Level.OK, Level.OK]
    assert "Volcano v1.15.1 (volcano-system/volcano-controllers, volcano-system/volcano-scheduler): tested" in findings[0].found
    assert "AIBrix v0.7.0 (aibrix-system/aibrix-controller-manager): tested" in findings[1].found


def test_an_untested_release_is_a_warning_and_one_before_1_12_an_error() -> None:
    images = (("volcano-system/volcano-scheduler", "volcanosh/vc-scheduler:v1.13.3"), IMAGES[2])
    finding = check_versions(healthy(images=images))[0]
    assert finding.level is Level.WARNING and "Volcano v1.13.3 (volcano-system/volcano-scheduler) was not tested" in finding.found
    assert "v1.15.1" in finding.todo and "COMPATIBILITY.md" in finding.todo
    images = (("volcano-system/volcano-scheduler", "registry.local:5000/volcanosh/vc-scheduler:v1.11.0"), IMAGES[2])
    finding = check_versions(healthy(images=images))[0]
    assert finding.level is Level.ERROR and "Volcano v1.11.0" in finding.found and "upgrade Volcano" in finding.todo


def test_an_unknown_release_is_a_warning() -> None:
    findings = check_versions(healthy(images=()))
    assert [f.level for f in findings] == [Level.WARNING, Level.WARNING]
    assert "Volcano unknown (no Deployment in volcano-system" in findings[0].found and "1.14 or newer" in findings[0].found
    assert "AIBrix unknown (no Deployment in aibrix-system" in findings[1].found and "v0.6.0" in findings[1].todo
    pinned = (("volcano-system/volcano-scheduler", "volcanosh/vc-scheduler@sha256:abc"), IMAGES[2])
    assert "carries no release tag" in check_versions(healthy(images=pinned))[0].found


def test_controllers_of_different_releases_are_a_warning() -> None:
    images = (
        ("volcano-system/volcano-scheduler", "volcanosh/vc-scheduler:v1.15.1"),
        ("volcano-system/c", "volcanosh/vc-controller-manager:v1.14.1"),
    )
    finding = check_versions(healthy(images=(*images, IMAGES[2])))[0]
    assert finding.level is Level.WARNING and "v1.14.1, v1.15.1" in finding.found and "run one release" in finding.todo


def test_a_podgroup_crd_without_network_topology_is_an_error() -> None:
    old = podgroup_schema("v1.15.1")
    del old["properties"]["spec"]["properties"]["networkTopology"]
    finding = check_versions(healthy(podgroup_schema=old))[0]
    assert finding.level is Level.ERROR and "PodGroup CRD has no spec.networkTopology" in finding.found


def test_image_tags() -> None:
    assert image_tag("registry.local:5000/volcanosh/vc-scheduler:v1.15.1") == ("registry.local:5000/volcanosh/vc-scheduler", "v1.15.1")
    assert image_tag("registry.local:5000/volcanosh/vc-scheduler") == ("registry.local:5000/volcanosh/vc-scheduler", None)
    assert image_tag("vc-scheduler:v1.15.1@sha256:abc") == ("vc-scheduler", "v1.15.1")


def test_the_tested_releases_are_compatibility_mds_pairs() -> None:
    text = (REPO / "COMPATIBILITY.md").read_text()
    table = text.split("## Runs on the real control plane", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:3] for line in table.splitlines() if re.match(r"\| v\d", line)]
    assert {a.strip() for a, _ in rows} == set(TESTED_AIBRIX)
    assert {v.strip() for _, v in rows} == set(TESTED_VOLCANO)


# -- 4. Webhooks and the leader Lease -------------------------------------------------------------


def chart_named(objects: tuple[dict[str, Any], ...], release: str = "rel") -> tuple[dict[str, Any], ...]:
    """As the chart names them (templates/webhook.yaml): <release>-stormtopo, and policies prefixed with it."""

    def named(name: str) -> str:
        return f"{release}-stormtopo" if name == "stormtopo" else f"{release}-stormtopo-{name.removeprefix('stormtopo-')}"

    out = []
    for obj in objects:
        renamed: dict[str, Any] = {**obj, "metadata": {**obj["metadata"], "name": named(obj["metadata"]["name"])}}
        if "policyName" in (obj.get("spec") or {}):  # a binding names its release's policy
            renamed["spec"] = {**obj["spec"], "policyName": named(obj["spec"]["policyName"])}
        out.append(renamed)
    return tuple(out)


def test_registered_webhooks_and_policies_are_ok_by_the_operators_names_and_the_charts() -> None:
    finding = only(check_admission(healthy()), Level.OK)
    assert "MutatingWebhookConfiguration stormtopo, ValidatingWebhookConfiguration stormtopo" in finding.found
    assert (
        "admission policies stormtopo-labelled-pods, stormtopo-opted-in-pods, stormtopo-constrained-podgroups, stormtopo-opt-in-label "
        "with their bindings" in finding.found
    )
    finding = only(check_admission(healthy(admission=chart_named(REGISTERED))), Level.OK)
    assert "MutatingWebhookConfiguration rel-stormtopo" in finding.found and "rel-stormtopo-opted-in-pods" in finding.found


def test_an_api_server_without_mutating_admission_policies_is_a_warning_that_says_what_it_costs_and_how_to_serve_them() -> None:
    """Issue 42, item 2: opted-in creates cost what plain ones do only where the policy labels them; elsewhere (Kubernetes
    1.34 and 1.35 as installed) stormtopo's webhook does, a call per create: the doctor says so, and how to change it."""
    without = tuple(configuration(b""))
    registered = tuple(configuration(b"ca", url_base="https://127.0.0.1:9443"))
    findings = check_admission(healthy(expected_admission=without, admission=registered))
    assert [f.level for f in findings] == [Level.OK, Level.WARNING]
    assert "no MutatingAdmissionPolicy of stormtopo's" in findings[1].found and "refused while stormtopo is down" in findings[1].found
    assert "helm upgrade" in findings[1].todo
    assert "--feature-gates=MutatingAdmissionPolicy=true" in findings[1].todo
    assert exit_code(findings) == 0  # a warning: the webhook does the same work


def test_a_missing_webhook_or_policy_is_an_error() -> None:
    left = tuple(o for o in REGISTERED if o["kind"] != "MutatingWebhookConfiguration")
    finding = only(check_admission(healthy(admission=left)), Level.ERROR)
    assert "MutatingWebhookConfiguration with opt-in.stormservices.stormtopo.io, podgroups.stormtopo.io, pods.stormtopo.io" in finding.found
    assert "no task, gang or networkTopology" in finding.found and "install the chart" in finding.todo
    left = tuple(o for o in REGISTERED if not o["metadata"]["name"].endswith("opted-in-pods"))
    finding = only(check_admission(healthy(admission=left)), Level.ERROR)
    assert "ValidatingAdmissionPolicy *stormtopo-opted-in-pods" in finding.found and "not held while stormtopo is down" in finding.found


def test_a_policy_whose_own_binding_is_gone_is_an_error_though_another_installs_binding_of_a_like_name_stays() -> None:
    """Two installs (the operator's own registration and a chart release): deleting the operator's binding of a policy
    leaves that policy inert, whatever the chart's binding of its own policy of a like name does."""
    gone = tuple(
        o for o in REGISTERED if not (o["kind"].endswith("Binding") and o["metadata"]["name"] == "stormtopo-constrained-podgroups")
    )
    findings = check_admission(healthy(admission=(*gone, *chart_named(REGISTERED))))
    (error,) = [f for f in findings if f.level is Level.ERROR]
    assert (
        "not registered: ValidatingAdmissionPolicyBinding *stormtopo-constrained-podgroups for stormtopo-constrained-podgroups"
        in error.found
    )
    assert "may strip networkTopology" in error.found


def test_webhooks_registered_twice_or_without_a_ca_are_a_warning() -> None:
    finding = only(check_admission(healthy(admission=(*REGISTERED, *chart_named(REGISTERED)))), Level.WARNING)
    assert "registered more than once" in finding.found and "rel-stormtopo, stormtopo" in finding.found and "uninstall one" in finding.todo
    no_ca = chart_named(tuple(configuration(b"", service=("stormtopo-system", "rel-stormtopo-webhook", 443), label_policy="v1beta1")))
    finding = only(check_admission(healthy(admission=no_ca)), Level.WARNING)
    assert "webhook pods.stormtopo.io of MutatingWebhookConfiguration rel-stormtopo has no caBundle" in finding.found
    assert "cert-manager" in finding.todo


def test_a_fresh_lease_is_ok_and_a_stale_one_an_error() -> None:
    finding = only(check_leader(healthy()), Level.OK)
    assert "Lease stormtopo-system/stormtopo-operator: held by stormtopo-7d9-abc, renewed 2 s ago" in finding.found
    finding = only(check_leader(healthy(leases=(lease(NOW - 300),))), Level.ERROR)
    assert "Lease stormtopo-system/stormtopo-operator: last renewed 300 s ago by stormtopo-7d9-abc" in finding.found
    assert "no replica leads" in finding.found and "operator's pods in stormtopo-system" in finding.todo


def test_no_lease_or_a_just_released_one_is_a_warning() -> None:
    finding = only(check_leader(healthy(leases=())), Level.WARNING)
    assert "no Lease stormtopo-operator" in finding.found and "operator pod runs" in finding.todo
    finding = only(check_leader(healthy(leases=(lease(NOW - 1, holder=""),))), Level.WARNING)
    assert "Lease stormtopo-system/stormtopo-operator: released 1 s ago and not taken over" in finding.found
    # Released long ago: the leader stopped cleanly, and what runs now (if anything) runs without leader election.
    assert only(check_leader(healthy(leases=(lease(NOW - 3600, holder=""),))), Level.WARNING).todo


# -- 5. Opted-in StormServices' PodGroups ----------------------------------------------------------


def test_podgroups_carrying_their_request_are_ok() -> None:
    finding = only(check_podgroups(healthy()), Level.OK)
    assert "1 opted-in StormService checked: every PodGroup carries" in finding.found


def test_a_podgroup_without_its_network_topology_is_an_error() -> None:
    finding = only(check_podgroups(healthy(services=(sample(None),))), Level.ERROR)
    assert "StormService ns/svc: PodGroup svc-roleset-abcde has no networkTopology" in finding.found
    assert "stormtopo explain" in finding.todo
    finding = only(check_podgroups(healthy(services=(sample({"mode": "hard", "highestTierAllowed": 2}),))), Level.ERROR)
    assert "has networkTopology {'mode': 'hard', 'highestTierAllowed': 2}, its request is" in finding.found


def test_a_replica_without_a_podgroup_yet_and_a_service_not_opted_in_are_not_errors() -> None:
    waiting = dataclasses.replace(sample(None), podgroups={})
    only(check_podgroups(healthy(services=(waiting,))), Level.OK)
    only(check_podgroups(healthy(services=(sample(None, annotations={}),))), Level.OK)


def test_an_invalid_request_is_a_warning() -> None:
    finding = only(check_podgroups(healthy(services=(sample(None, annotations={MODE: "hard"}),))), Level.WARNING)
    assert "ns/svc" in finding.found and "invalid request" in finding.found and "fix the annotations" in finding.todo


def test_a_service_scoped_podgroup_is_compared_with_its_replica_tier() -> None:
    annotations = {MODE: "hard", HIGHEST_TIER: "2", SCOPE: "StormService", REPLICA_HIGHEST_TIER: "1"}
    service = builders.service(annotations)
    replica = aibrix_roleset()
    assert podgroup_names(service, [replica]) == ["svc"]
    assert podgroup_names(builders.service(HARD1), [replica]) == ["svc-roleset-abcde"]
    outer = {"mode": "hard", "highestTierAllowed": 2}
    whole = podgroup("svc", outer, subGroupPolicy=[{"name": "replica", "networkTopology": HARD1_TOPOLOGY}])
    only(check_podgroups(healthy(services=(ServiceSample(service, (replica,), {"svc": whole}),))), Level.OK)
    flat = podgroup("svc", outer)
    finding = only(check_podgroups(healthy(services=(ServiceSample(service, (replica,), {"svc": flat}),))), Level.ERROR)
    assert "PodGroup svc has no replica networkTopology" in finding.found


def test_a_full_sample_says_how_many_were_checked() -> None:
    finding = only(check_podgroups(healthy(services=(sample(HARD1_TOPOLOGY),) * SAMPLE, services_more=True)), Level.OK)
    assert f"{SAMPLE} opted-in StormServices checked (a sample: the first {SAMPLE} found; others not checked)" in finding.found
    finding = only(check_podgroups(healthy(services=(), unreadable={"stormservices": "not found"})), Level.WARNING)
    assert "StormServices could not be read (not found)" in finding.found and "AIBrix's CRDs" in finding.todo


@pytest.mark.parametrize(
    "check", [check_scheduler_config, check_hypernodes, check_versions, check_admission, check_leader, check_podgroups]
)
def test_every_problem_says_what_to_do(check: Any) -> None:
    broken = healthy(
        scheduler_config=Source("file x.conf", without("network-topology-aware")),
        hypernodes=(*HYPERNODES, hypernode("extra", 1, ("node0", "node99"))),
        images=(),
        admission=(),
        leases=(lease(NOW - 600),),
        services=(sample(None),),
    )
    findings = check(broken)
    assert findings and all(f.level is not Level.OK and f.todo for f in findings), findings
