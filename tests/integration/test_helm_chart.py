"""The Helm chart renders, applies with server-side validation, and its ServiceAccount is enough, and
no more than enough, for the operator: run under that identity, with two replicas and leader election
(issues 6 and 7)."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from stormtopo.core.optin import MOVABLE
from stormtopo.core.topology.fabric import parse_topology
from stormtopo.core.topology.hypernodes import hypernode_manifests
from stormtopo.core.vocabulary import HIGHEST_TIER, MANAGED_BY, MODE, OPTED_IN_LABEL
from stormtopo.core.volcano_conf import SCHEDULER_CONFIGMAP, VOLCANO_NAMESPACE
from stormtopo.devenv import components, processes
from stormtopo.devenv.client import DevCluster
from stormtopo.devenv.nodes import node_manifests
from stormtopo.devenv.workloads import Role, stormservice
from stormtopo.operator import webhook
from tests.conftest import CHART_IMAGE, REPO
from tests.integration.chart import (
    NAMESPACE,
    RELEASE,
    SA,
    hook_of,
    http_ok,
    install,
    kubectl,
    of_kind,
    provided_certificates,
    render,
    service_account_kubeconfig,
    without_hooks,
    without_operator,
)

# templates/admission-policy.yaml
CHART_POLICIES = [
    "own-keys-only",
    "own-podgroup-fields",
    "node-tier-only",
    "evict-opted-in-only",
    "opted-in-lists-only",
    "delete-unbound-only",
]
OPERATOR_POLICIES = [o["metadata"]["name"] for o in webhook.configuration(b"") if o["kind"] == "ValidatingAdmissionPolicy"]


@pytest.fixture(scope="module")
def chart_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, DevCluster]]:
    state = tmp_path_factory.mktemp("chart")
    with without_operator(state) as admin:
        yield state, admin


def test_chart_renders_for_every_certificate_mode_and_rejects_a_bad_one() -> None:
    generated = list(yaml.safe_load_all(render()))
    kinds = sorted(d["kind"] for d in generated if d)
    assert kinds == sorted(
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "Deployment",
            "MutatingWebhookConfiguration",
            "ValidatingWebhookConfiguration",
            *["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"] * len(CHART_POLICIES),  # the ServiceAccount's limits
            *["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"] * len(OPERATOR_POLICIES),  # the operator's
            "Role",  # leader election
            "RoleBinding",
            "ClusterRole",  # the opted-in lists, in every namespace, by name
            "ClusterRoleBinding",
            "Role",  # the uninstall hook stops the Deployment
            "RoleBinding",
            "ClusterRole",  # Volcano's scheduler configuration, read (ConfigMaps of its one name)
            "ClusterRoleBinding",
            "PodDisruptionBudget",  # two replicas
            "Secret",
            "Service",
            "Service",
            "ServiceAccount",
            "Job",  # the pre-delete hook: helm uninstall leaves the cluster as it was
        ]
    )
    # The operator's admission objects, addressed to the chart's Service and the release namespace.
    for configuration in (d for d in generated if d and d["kind"].endswith("WebhookConfiguration")):
        for hook in configuration["webhooks"]:
            assert hook["clientConfig"]["service"]["name"] == f"{RELEASE}-stormtopo-webhook" and hook["clientConfig"]["caBundle"]
    policies = {d["metadata"]["name"] for d in generated if d and d["kind"] == "ValidatingAdmissionPolicy"}
    bindings = [d for d in generated if d and d["kind"] == "ValidatingAdmissionPolicyBinding"]
    expected = {f"{SA}-{name}" for name in CHART_POLICIES} | {f"{SA}-{name.removeprefix('stormtopo-')}" for name in OPERATOR_POLICIES}
    assert policies == expected  # one name each, per release
    assert {b["spec"]["policyName"] for b in bindings} == policies
    # Each reads the opted-in list of the admitted object's own namespace (a paramRef without a namespace).
    refs = [b["spec"]["paramRef"] for b in bindings if "paramRef" in b["spec"]]
    assert len(refs) == 2 and all(r["name"] == "stormtopo-opted-in" and "namespace" not in r for r in refs), refs
    deployment = next(d for d in generated if d and d["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] >= 2 and "--leader-elect" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    cm = [d["kind"] for d in yaml.safe_load_all(render("webhook.certMode=certManager")) if d]
    assert "Certificate" in cm and "Secret" not in cm
    helm = components.ensure_binary("helm")
    bad = subprocess.run(
        [
            str(helm),
            "template",
            "x",
            str(REPO / "deploy/helm/stormtopo"),
            "--kube-version",
            "1.35.3",
            "--set",
            "webhook.certMode=nope",
            "--set",
            CHART_IMAGE,
        ],
        capture_output=True,
        text=True,
    )
    assert bad.returncode != 0 and "must be generated, certManager or provided" in bad.stderr


def test_operator_under_the_charts_service_account_with_leader_election(chart_cluster: tuple[Path, DevCluster], tmp_path: Path) -> None:
    state, admin = chart_cluster
    port = processes.free_port()
    certs = tmp_path / "tls"
    rendered = render(*provided_certificates(certs), f"webhook.url=https://127.0.0.1:{port}")
    install(state, rendered)

    sa_kubeconfig = service_account_kubeconfig(state, tmp_path)
    # Least privilege, negatively: no Secrets, no writes to what others own.
    who = f"system:serviceaccount:{NAMESPACE}:{SA}"
    for verb, resource in (
        ("get", "secrets"),
        ("list", "secrets"),
        ("delete", "stormservices.orchestration.aibrix.ai"),
        ("patch", "nodes"),
        ("create", "hypernodes.topology.volcano.sh"),
    ):
        assert kubectl(state, "auth", "can-i", verb, resource, "-A", f"--as={who}").stdout.strip() == "no", (verb, resource)
    # The uninstall hook frees the pods of StormServices created opted in: it may delete that one binding, no other.
    bindings = "validatingadmissionpolicybindings.admissionregistration.k8s.io"
    for binding, allowed in ((f"{SA}-labelled-pods", "yes"), (f"{SA}-opted-in-pods", "no"), ("someone-elses", "no")):
        assert kubectl(state, "auth", "can-i", "delete", f"{bindings}/{binding}", f"--as={who}").stdout.strip() == allowed, binding
    for verb in ("create", "patch", "list"):
        assert kubectl(state, "auth", "can-i", verb, f"{bindings}/{SA}-labelled-pods", f"--as={who}").stdout.strip() == "no", verb
    denied = kubectl(state, "get", "secrets", "-n", NAMESPACE, kubeconfig=sa_kubeconfig)
    assert denied.returncode != 0 and "forbidden" in denied.stderr.lower()

    topology = parse_topology("switches:\n  leaf-a: [w0, w1]\n  leaf-b: [w2, w3]\n")
    for obj in node_manifests(topology) + hypernode_manifests(topology):
        admin.create(obj)

    def operator(identity: str) -> processes.Tracked:
        return processes.start(
            tmp_path,
            identity,
            [
                sys.executable,
                "-m",
                "stormtopo.operator",
                f"--kubeconfig={sa_kubeconfig}",
                f"--cert-dir={certs}",
                "--webhook-host=127.0.0.1",
                f"--webhook-port={port}",
                f"--metrics-port={processes.free_port()}",
                "--no-register-webhook",
                "--leader-elect",
                f"--leader-election-namespace={NAMESPACE}",
                "--lease-duration=4",
                f"--identity={identity}",
            ],
        )

    leases = client.CoordinationV1Api(admin.api_client)

    def lease() -> dict:  # type: ignore[type-arg]
        return dict(admin.api_client.sanitize_for_serialization(leases.read_namespaced_lease("stormtopo-operator", NAMESPACE)))

    first = operator("op-a")
    second = None
    try:
        admin.wait(lambda: _holder(lease) == "op-a", 60, "op-a to lead")  # before op-b starts: op-b follows
        second = operator("op-b")
        admin.create_namespace("chart-ns")
        big = (Role("prefill", gpus=6), Role("decode", gpus=6))
        created = admin.create(
            stormservice("sa-svc", "chart-ns", roles=big, annotations={MODE: "hard", HIGHEST_TIER: "1"}, volcano_strategy=False)
        )
        # Rendered for an API server without MutatingAdmissionPolicy: the webhook labels the role templates.
        assert all(r["template"]["metadata"]["labels"][OPTED_IN_LABEL] == "true" for r in created["spec"]["template"]["spec"]["roles"])
        pods = admin.bound_pods("chart-ns", "storm-service-name=sa-svc", 2, timeout=90)
        leaf = topology.lowest_common_switch([p["spec"]["nodeName"] for p in pods])
        assert leaf is not None and leaf.tier == 1  # w0+w1 or w2+w3: one leaf
        group = admin.only(lambda: admin.podgroups("chart-ns"), "PodGroup")
        assert group["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "stormtopo"  # created by the SA-run leader

        processes.stop(first, kill=True)  # the leader dies; the follower takes over within a lease duration
        admin.wait(lambda: _holder(lease) == "op-b", 30, "op-b to take the lease over")
        admin.create(stormservice("after", "chart-ns", annotations={MODE: "hard", HIGHEST_TIER: "1"}, volcano_strategy=False))
        admin.bound_pods("chart-ns", "storm-service-name=after", 2, timeout=90)
        groups = [g["metadata"]["name"] for g in admin.podgroups("chart-ns")]
        assert len(groups) == 2 and len(set(groups)) == 2  # one PodGroup per replica, none twice

        # SIGTERM: the leader hands the Lease back on its way out (no follower waits out a duration).
        processes.stop(second)
        assert _holder(lease) == "" and lease()["spec"]["leaseDurationSeconds"] == 1
    finally:
        for p in (first, second):
            if p is not None:
                processes.stop(p, kill=True)


def _holder(read) -> str:  # type: ignore[no-untyped-def]
    try:
        return str(read()["spec"]["holderIdentity"])
    except Exception:
        return ""


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_where_the_api_server_serves_mutating_policies_a_policy_labels_new_opted_in_services_before_the_webhook(version: str) -> None:
    """Issue 42, item 2: a create of an opted-in StormService then costs no webhook call."""
    served = tuple(yaml.safe_load_all(render(api_versions=(f"admissionregistration.k8s.io/{version}/MutatingAdmissionPolicy",))))
    policy = next(d for d in served if d and d["kind"] == "MutatingAdmissionPolicy")
    binding = next(d for d in served if d and d["kind"] == "MutatingAdmissionPolicyBinding")
    assert policy["apiVersion"] == binding["apiVersion"] == f"admissionregistration.k8s.io/{version}"
    assert policy["metadata"]["name"] == binding["spec"]["policyName"] == f"{SA}-opt-in-label"
    assert policy["spec"]["failurePolicy"] == "Ignore"  # to the webhook, which fails closed
    # The webhook stays, for what the policy leaves unlabelled (just installed, its feature gate off): never
    # called for what the policy labelled (its condition: a role template without the label).
    hooks = {h["name"]: h for d in served if d and d["kind"] == "MutatingWebhookConfiguration" for h in d["webhooks"]}
    assert set(hooks) == {"pods.stormtopo.io", "podgroups.stormtopo.io", "opt-in.stormservices.stormtopo.io"}
    assert OPTED_IN_LABEL in hooks["opt-in.stormservices.stormtopo.io"]["matchConditions"][0]["expression"]
    older = tuple(yaml.safe_load_all(render()))  # Kubernetes 1.30-1.35 as shipped: the webhook does it
    assert not any(d and "MutatingAdmissionPolicy" in d["kind"] for d in older)
    hooks = {h["name"] for d in older if d and d["kind"] == "MutatingWebhookConfiguration" for h in d["webhooks"]}
    assert "opt-in.stormservices.stormtopo.io" in hooks


def test_generated_ca_is_kept_when_the_chart_is_rendered_again(chart_cluster: tuple[Path, DevCluster]) -> None:
    """Proves: an upgrade (a render against a cluster with the release's Secret) keeps the CA, the serving
    pair and the caBundle; without the Secret every render makes a new CA (so this test could fail)."""
    state, _ = chart_cluster
    kubectl(state, "delete", "secret", f"{SA}-webhook-tls", "-n", NAMESPACE, "--ignore-not-found")
    first, second = render(cluster=state), render(cluster=state)
    assert of_kind(first, "Secret")["data"]["ca.crt"] != of_kind(second, "Secret")["data"]["ca.crt"]  # nothing installed yet

    install(state, first)
    installed = of_kind(first, "Secret")["data"]
    for again in (render(cluster=state), render(cluster=state)):
        assert of_kind(again, "Secret")["data"] == installed
        for hook in of_kind(again, "MutatingWebhookConfiguration")["webhooks"]:
            assert hook["clientConfig"]["caBundle"] == installed["ca.crt"]


def _refused(result: subprocess.CompletedProcess[str]) -> bool:
    return result.returncode != 0 and ("forbidden" in result.stderr.lower() or "denied" in result.stderr.lower())


def test_service_account_may_change_only_stormtopo_keys(chart_cluster: tuple[Path, DevCluster], tmp_path: Path) -> None:
    """Proves the limit RBAC cannot express (issue 14, item 4): as the chart's ServiceAccount, a pod's
    image and command, a StormService's replicas and a label not under stormtopo.io/ cannot be changed;
    the domain label on a pod and the placement annotation on a StormService can."""
    state, admin = chart_cluster
    install(state, render())
    sa = service_account_kubeconfig(state, tmp_path)
    ns = "vap-ns"
    admin.create_namespace(ns)
    admin.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p", "namespace": ns, "labels": {"app": "x"}},
            "spec": {"schedulerName": "nobody", "containers": [{"name": "c", "image": "registry.example/a:1", "command": ["serve"]}]},
        }
    )
    admin.create(stormservice("svc", ns, scheduler_name="nobody"))

    def patch(kind: str, name: str, body: Any, patch_type: str = "merge") -> subprocess.CompletedProcess[str]:
        return kubectl(state, "patch", kind, name, "-n", ns, f"--type={patch_type}", "-p", json.dumps(body), kubeconfig=sa)

    # The policy takes effect once the API server has loaded it: probe with a harmless annotation
    # (a new value each time, so that an accepted probe is never a no-op) until it is refused.
    probes = iter(range(1000))

    def probe_refused() -> bool:
        return _refused(patch("pod", "p", {"metadata": {"annotations": {"example.com/probe": str(next(probes))}}}))

    admin.wait(probe_refused, 30, "the policy to be in force")
    image = {"spec": {"containers": [{"name": "c", "image": "evil.example/miner:1"}]}}
    denied = patch("pod", "p", image, "strategic")
    assert _refused(denied) and "own-keys-only" in denied.stderr and "spec" in denied.stderr, denied.stderr
    command = {"spec": {"containers": [{"name": "c", "command": ["sh", "-c", "id"]}]}}
    assert _refused(patch("pod", "p", command, "strategic"))
    assert _refused(patch("pod", "p", {"metadata": {"labels": {"app": "y"}}}))
    assert _refused(patch("pod", "p", {"metadata": {"labels": {"team": "z"}}}))
    assert _refused(patch("pod", "p", {"metadata": {"annotations": {"example.com/x": "1"}}}))
    replicas = patch("stormservice", "svc", {"spec": {"replicas": 5}})
    assert _refused(replicas) and "own-keys-only" in replicas.stderr, replicas.stderr
    assert _refused(patch("stormservice", "svc", {"metadata": {"labels": {"team": "z"}}}))

    allowed = patch("pod", "p", {"metadata": {"labels": {"stormtopo.io/hypernode-tier-1": "s0"}}})
    assert allowed.returncode == 0, allowed.stderr
    placed = patch("stormservice", "svc", {"metadata": {"annotations": {"stormtopo.io/placement": "{}"}}})
    assert placed.returncode == 0, placed.stderr
    pod = admin.core.read_namespaced_pod("p", ns)
    assert pod.spec.containers[0].image == "registry.example/a:1" and pod.spec.containers[0].command == ["serve"]
    assert pod.metadata.labels == {"app": "x", "stormtopo.io/hypernode-tier-1": "s0"}
    svc = admin.stormservice(ns, "svc")
    assert svc["spec"]["replicas"] == 1 and svc["metadata"]["annotations"]["stormtopo.io/placement"] == "{}"
    # The admin, whom the policy does not match, still may.
    assert kubectl(state, "label", "pod", "p", "-n", ns, "team=z").returncode == 0

    # Never a request annotation: the ServiceAccount cannot opt a StormService in or change its scope.
    assert _refused(patch("stormservice", "svc", {"metadata": {"annotations": {"stormtopo.io/topology-scope": "StormService"}}}))
    # A pod held at stormtopo's gate may be released (its gate removed, its node affinity set), no more.
    gates = [{"name": "stormtopo.io/domain"}, {"name": "example.com/other"}]
    admin.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "held", "namespace": ns},
            "spec": {"schedulerName": "nobody", "schedulingGates": gates, "containers": [{"name": "c", "image": "registry.example/a:1"}]},
        }
    )
    assert _refused(patch("pod", "held", [{"op": "remove", "path": "/spec/schedulingGates/1"}], "json"))  # someone else's gate
    within = {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["w0"]}]}]}
    release = [
        {"op": "remove", "path": "/spec/schedulingGates/0"},
        {"op": "add", "path": "/spec/affinity", "value": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": within}}},
    ]
    released = patch("pod", "held", release, "json")
    assert released.returncode == 0, released.stderr
    assert admin.core.read_namespaced_pod("held", ns).spec.scheduling_gates[0].name == "example.com/other"
    # The same for the room gate of exact preemption; and never a change beside the release.
    room = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "held-for-room", "namespace": ns}}
    room["spec"] = {
        "schedulerName": "nobody",
        "schedulingGates": [{"name": "stormtopo.io/room"}],
        "containers": [{"name": "c", "image": "registry.example/a:1"}],
    }
    admin.create(room)
    sneaky = [*release, {"op": "replace", "path": "/spec/containers/0/image", "value": "registry.example/b:1"}]
    assert _refused(patch("pod", "held-for-room", sneaky, "json"))
    released = patch("pod", "held-for-room", release, "json")
    assert released.returncode == 0, released.stderr
    assert not admin.core.read_namespaced_pod("held-for-room", ns).spec.scheduling_gates
    # PodGroups: only the gang and topology fields, never the queue.
    admin.create(
        {
            "apiVersion": "scheduling.volcano.sh/v1beta1",
            "kind": "PodGroup",
            "metadata": {"name": "pg", "namespace": ns, "labels": {"roleset-name": "pg"}},
            "spec": {"minMember": 1, "queue": "default"},
        }
    )
    assert _refused(patch("podgroup", "pg", {"spec": {"queue": "other"}}))
    assert patch("podgroup", "pg", {"spec": {"minMember": 2}}).returncode == 0


def _tree(admin: DevCluster) -> None:
    """leaf-a [w0, w1] and leaf-b [w2, w3] with their nodes, unless an earlier test of the module made them."""
    topology = parse_topology("switches:\n  leaf-a: [w0, w1]\n  leaf-b: [w2, w3]\n")
    have = {h["metadata"]["name"] for h in admin.hypernodes()}
    nodes = {n.metadata.name for n in admin.core.list_node().items}
    for obj in node_manifests(topology) + hypernode_manifests(topology):
        if obj["metadata"]["name"] not in (have if obj["kind"] == "HyperNode" else nodes):
            admin.create(obj)


def test_service_account_writes_only_the_node_tiers_hypernodes(chart_cluster: tuple[Path, DevCluster], tmp_path: Path) -> None:
    """Issue 33, item 8: as the chart's ServiceAccount, deleting a HyperNode that is not a tier-0 one of the
    node tier, changing a leaf's tier or labels, creating a tier-0 HyperNode with a foreign label, or
    adding a regex member are refused, and so are (issue 43) a node's tier-0 HyperNode named in a spine or in
    another leaf (a second parent), a node added to another leaf, or one taken out of its leaf; creating its
    own tier-0 HyperNode and swapping a leaf's node for it (and back) are allowed."""
    state, admin = chart_cluster
    install(state, render("nodeTier.enabled=true"))
    sa = service_account_kubeconfig(state, tmp_path)
    _tree(admin)
    spine = {"apiVersion": "topology.volcano.sh/v1alpha1", "kind": "HyperNode", "metadata": {"name": "spine-x"}}
    spine["spec"] = {"tier": 2, "members": [{"type": "HyperNode", "selector": {"exactMatch": {"name": "leaf-a"}}}]}
    admin.create(spine)

    def as_sa(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return kubectl(state, *args, stdin=stdin, kubeconfig=sa)

    def patch(name: str, body: Any, patch_type: str = "merge") -> subprocess.CompletedProcess[str]:
        return as_sa("patch", "hypernode", name, f"--type={patch_type}", "-p", json.dumps(body))

    node = {"type": "Node", "selector": {"exactMatch": {"name": "w0"}}}
    mine = {
        "apiVersion": "topology.volcano.sh/v1alpha1",
        "kind": "HyperNode",
        "metadata": {"name": "w0.node", "labels": {"app.kubernetes.io/managed-by": "stormtopo", "stormtopo.io/node-tier": "true"}},
        "spec": {"tier": 0, "members": [node]},
    }
    foreign = json.loads(json.dumps(mine))
    foreign["metadata"]["name"] = "w1.node"
    foreign["metadata"]["labels"]["volcano.sh/network-topology-source"] = "label"
    try:
        admin.wait(lambda: _refused(as_sa("delete", "hypernode", "spine-x", "--dry-run=server")), 30, "the policy to be in force")
        denied = as_sa("delete", "hypernode", "spine-x")
        assert _refused(denied) and "node-tier-only" in denied.stderr, denied.stderr
        assert _refused(patch("leaf-a", {"spec": {"tier": 2}}))
        assert _refused(patch("leaf-a", {"metadata": {"labels": {"team": "x"}}}))
        assert _refused(as_sa("create", "-f", "-", stdin=json.dumps(foreign)))
        regex = [*admin.custom.get_cluster_custom_object("topology.volcano.sh", "v1alpha1", "hypernodes", "leaf-b")["spec"]["members"]]
        regex.append({"type": "Node", "selector": {"regexMatch": {"pattern": ".*"}}})
        assert _refused(patch("leaf-b", {"spec": {"members": regex}}))

        # Issue 43, item 2: never a second parent, never a node taken out of its leaf.
        leaf_b = admin.custom.get_cluster_custom_object("topology.volcano.sh", "v1alpha1", "hypernodes", "leaf-b")["spec"]["members"]
        w0_node = {"type": "HyperNode", "selector": {"exactMatch": {"name": "w0.node"}}}
        spine_members = [{"type": "HyperNode", "selector": {"exactMatch": {"name": "leaf-a"}}}, w0_node]
        second_parent = patch("spine-x", {"spec": {"members": spine_members}})
        assert _refused(second_parent) and "never the set of nodes under it" in second_parent.stderr, second_parent.stderr
        assert _refused(patch("leaf-b", {"spec": {"members": [*leaf_b, w0_node]}}))  # w0's tier-0 HyperNode in another leaf
        assert _refused(patch("leaf-b", {"spec": {"members": [*leaf_b, node]}}))  # w0 itself in another leaf
        assert _refused(patch("leaf-b", {"spec": {"members": leaf_b[:1]}}))  # a node taken out

        created = as_sa("create", "-f", "-", stdin=json.dumps(mine))
        assert created.returncode == 0, created.stderr
        w1 = {"type": "Node", "selector": {"exactMatch": {"name": "w1"}}}
        swapped = [{"type": "HyperNode", "selector": {"exactMatch": {"name": "w0.node"}}}, w1]
        assert patch("leaf-a", {"spec": {"members": swapped}}).returncode == 0
        back = [node, w1]
        assert patch("leaf-a", {"spec": {"members": back}}).returncode == 0
        assert as_sa("delete", "hypernode", "w0.node").returncode == 0
        # One an older release made, with its leaf's labels copied (before issue 33): still its own to delete.
        older = json.loads(json.dumps(mine))
        older["metadata"]["labels"] = {"team": "infra", "stormtopo.io/node-tier": "true"}
        admin.create(older)
        deleted = as_sa("delete", "hypernode", "w0.node")
        assert deleted.returncode == 0, deleted.stderr
    finally:
        kubectl(state, "delete", "hypernode", "spine-x", "w0.node", "w1.node", "--ignore-not-found")


def test_helm_uninstall_leaves_the_cluster_as_it_was(chart_cluster: tuple[Path, DevCluster], tmp_path: Path) -> None:
    """Issue 32, item 3: installed with the node tier and healing on, the operator run as the chart's
    Deployment runs it (its ServiceAccount, policies and arguments): a replica placed and held by a move, a
    pod held at stormtopo's gate, tier-0 HyperNodes written. Then helm uninstall: the operator stopped,
    the pre-delete hook's command run as the Job runs it, the chart's objects deleted. The HyperNode tree
    equals the one before install, no gate or hold is left, and a new replica AIBrix creates is scheduled
    as without stormtopo."""
    state, admin = chart_cluster
    _tree(admin)
    before = {h["metadata"]["name"]: h["spec"] for h in admin.hypernodes()}
    port = processes.free_port()
    certs = tmp_path / "tls"
    rendered = render(*provided_certificates(certs), f"webhook.url=https://127.0.0.1:{port}", "nodeTier.enabled=true", "replicaCount=1")
    install(state, rendered)
    sa = service_account_kubeconfig(state, tmp_path)
    deployment = of_kind(rendered, "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    replaced = {
        "--cert-dir": str(certs),
        "--webhook-port": str(port),
        "--metrics-port": str(processes.free_port()),
        "--metrics-host": "127.0.0.1",
    }
    argv = [f"{a.split('=')[0]}={replaced[a.split('=')[0]]}" if a.split("=")[0] in replaced else a for a in args]
    operator = processes.start(
        tmp_path, "operator", [sys.executable, "-m", "stormtopo.operator", f"--kubeconfig={sa}", "--webhook-host=127.0.0.1", *argv]
    )
    ns = "uninstall-ns"
    admin.create_namespace(ns)
    try:
        metrics = next(a for a in argv if a.startswith("--metrics-port=")).split("=")[1]
        admin.wait(lambda: http_ok(f"http://127.0.0.1:{metrics}/readyz"), 60, "the operator ready")
        soft = {MODE: "soft", HIGHEST_TIER: "1", "stormtopo.io/heal": "true"}
        admin.create(stormservice("moved", ns, annotations=soft))
        pods = admin.bound_pods(ns, "storm-service-name=moved", 2, timeout=90)
        assert all(p["metadata"]["labels"].get("stormtopo.io/admitted") == "true" for p in pods)
        # A router that asks for nothing beside a prefill no node holds: held at stormtopo's gate.
        roles = (Role("prefill", gpus=64), Role("router", requests=False))
        admin.create(stormservice("held", ns, roles=roles, annotations={MODE: "hard", HIGHEST_TIER: "1"}))

        def gated() -> list[str]:
            return [
                p["metadata"]["name"]
                for p in admin.pods(ns, "storm-service-name=held")
                if any(g["name"] == "stormtopo.io/domain" for g in p["spec"].get("schedulingGates") or [])
            ]

        admin.wait(gated, 60, "the router held at stormtopo's gate")
        # A move under way (as healing records it): the replica's PodGroup is held hard within tier 1.
        (replica,) = {p["metadata"]["labels"]["roleset-name"] for p in pods}
        moves = {replica: {"toTier": 1, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}}
        admin.custom.patch_namespaced_custom_object(
            "orchestration.aibrix.ai",
            "v1alpha1",
            ns,
            "stormservices",
            "moved",
            {"metadata": {"annotations": {"stormtopo.io/moves": json.dumps(moves)}}},
        )

        def group(name: str) -> dict[str, Any]:
            return next((g for g in admin.podgroups(ns) if g["metadata"]["name"] == name), {})

        def mode() -> str | None:
            return (group(replica).get("spec") or {}).get("networkTopology", {}).get("mode")

        admin.wait(lambda: mode() == "hard", 60, "the PodGroup held hard")
        admin.wait(lambda: [h for h in admin.hypernodes() if h["spec"]["tier"] == 0], 60, "the node tier's HyperNodes")

        # helm uninstall: the Deployment's pods end (here, the operator this test runs), the hook runs, the objects go.
        processes.stop(operator)
        job = hook_of(rendered, "pre-delete")
        container = job["spec"]["template"]["spec"]["containers"][0]
        assert job["spec"]["template"]["spec"]["serviceAccountName"] == SA
        done = subprocess.run(
            [sys.executable, *container["command"][1:], *container["args"], f"--kubeconfig={sa}"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        # Helm deletes the chart's objects. The admission policies are left here (the tests after this one use
        # them, and deleting policies with params beside others made kube-apiserver v1.35.3 lose the others'
        # params): they match only the chart's ServiceAccount, and with the opted-in list gone they refuse no
        # pod, so what is asserted below holds with them or without.
        kept = [d for d in yaml.safe_load_all(without_hooks(rendered)) if d and not d["kind"].startswith("ValidatingAdmissionPolicy")]
        assert kubectl(state, "delete", "-f", "-", "--ignore-not-found", "--wait=false", stdin=yaml.safe_dump_all(kept)).returncode == 0

        assert {h["metadata"]["name"]: h["spec"] for h in admin.hypernodes()} == before
        assert not gated()
        assert mode() != "hard"
        assert not admin.core.list_namespaced_pod(NAMESPACE, label_selector="app.kubernetes.io/name=stormtopo").items
        # A new replica, after stormtopo: AIBrix's pods, scheduled by Volcano without any gate or label of stormtopo's.
        admin.custom.patch_namespaced_custom_object(
            "orchestration.aibrix.ai", "v1alpha1", ns, "stormservices", "moved", {"spec": {"replicas": 2}}
        )
        after = admin.bound_pods(ns, "storm-service-name=moved", 4, timeout=120)
        fresh = [p for p in after if p["metadata"]["labels"]["roleset-name"] != replica]
        assert len(fresh) == 2 and not any(p["metadata"]["labels"].get("stormtopo.io/admitted") for p in fresh)
    finally:
        processes.stop(operator, kill=True)
        admin.delete_namespace(ns)


def test_with_exact_preemption_the_service_account_evicts_in_the_victim_namespaces_only_and_by_uid(
    chart_cluster: tuple[Path, DevCluster], tmp_path: Path
) -> None:
    """preemption.exact.victimNamespaces, both ways: as the ServiceAccount, a pod of a listed namespace may be
    evicted by its uid, not by its name alone; a pod of another namespace (kube-system, a team's) is refused as
    without exact preemption; the chart refuses to render exact preemption without the list."""
    state, admin = chart_cluster
    with pytest.raises(AssertionError, match=r"preemption\.exact\.enabled needs preemption\.exact\.victimNamespaces"):
        render("preemption.exact.enabled=true")
    install(state, render("preemption.exact.enabled=true", "preemption.exact.victimNamespaces={victims-ns}"))
    sa = service_account_kubeconfig(state, tmp_path)
    for ns in ("victims-ns", "team-ns"):
        admin.create_namespace(ns)
        body = {
            "metadata": {"name": "batch", "namespace": ns},
            "spec": {"schedulerName": "nobody", "containers": [{"name": "c", "image": "x"}]},
        }
        admin.core.create_namespaced_pod(ns, body)

    def evict(namespace: str, name: str, by_uid: bool = True) -> subprocess.CompletedProcess[str]:
        eviction: dict[str, Any] = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
        options: dict[str, Any] = {"dryRun": ["All"]}
        if by_uid:
            options["preconditions"] = {"uid": admin.core.read_namespaced_pod(name, namespace).metadata.uid}
        eviction["deleteOptions"] = options
        path = f"/api/v1/namespaces/{namespace}/pods/{name}/eviction"
        return kubectl(state, "create", "--raw", path, "-f", "-", stdin=json.dumps(eviction), kubeconfig=sa)

    try:
        admin.wait(
            lambda: evict("victims-ns", "batch").returncode == 0 and _refused(evict("team-ns", "batch")), 60, "the policies in force"
        )
        by_name = evict("victims-ns", "batch", by_uid=False)
        assert _refused(by_name) and "only by the uid" in by_name.stderr, by_name.stderr
        assert "evict-opted-in-only" in evict("team-ns", "batch").stderr
    finally:
        for ns in ("victims-ns", "team-ns"):
            admin.delete_namespace(ns)
        install(state, render())  # the module's other tests see the chart without exact preemption


def test_service_account_evicts_only_pods_of_opted_in_stormservices(chart_cluster: tuple[Path, DevCluster], tmp_path: Path) -> None:
    """Issue 34, item 6: RBAC grants pods/eviction cluster-wide; the policy evict-opted-in-only lets the
    ServiceAccount evict only pods of StormServices listed as healing: a kube-system pod, a pod of a
    StormService that never opted in, or of one that asks for a topology but not for healing, or of one
    whose name only begins with a healing one's RoleSet prefix, is refused; a replica's pod of a healing
    one is evicted, a long-named one's too (AIBrix cuts its RoleSets' prefix to 58 characters), each only by
    its uid (an eviction naming no uid is refused). Deleting a pod:
    only one stormtopo let go for a spread (labelled so) that no node runs."""
    state, admin = chart_cluster
    install(state, render())
    sa = service_account_kubeconfig(state, tmp_path)
    ns = "evict-ns"
    admin.create_namespace(ns)
    # svc heals (its listing marked as core/optin.py writes it); plain asks for a topology but not for healing.
    # a heals too, and a service named a-roleset-foo (pods a-roleset-foo-roleset-...) does not; a long name
    # heals, whose RoleSets AIBrix names from "<name>-roleset-" cut to 58 characters.
    long = "l" * 52
    data = {"svc": "RoleSet" + MOVABLE, "plain": "RoleSet", "a": "RoleSet" + MOVABLE, long: "RoleSet" + MOVABLE}
    long_pod = (long + "-roleset-")[:58] + "bcdfg-prefill-7d9f-0"
    # A stateless pod of that long name: "<RoleSet>-<role>-" cut to 58 by generateName, then 5 random characters.
    long_stateless = (long + "-roleset-")[:58] + "x7k2p"
    # The list of the pods' own namespace (the operator writes one per namespace); another namespace has none.
    admin.core.create_namespaced_config_map(ns, {"metadata": {"name": "stormtopo-opted-in", "namespace": ns}, "data": data})
    elsewhere = "evict-other-ns"
    admin.create_namespace(elsewhere)

    def pod(namespace: str, name: str) -> None:
        body = {
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"schedulerName": "nobody", "containers": [{"name": "c", "image": "x"}]},
        }
        admin.core.create_namespaced_pod(namespace, body)

    def evict(namespace: str, name: str, dry_run: bool = False, by_uid: bool = True) -> subprocess.CompletedProcess[str]:
        """Evict as stormtopo does: by the pod's uid (`by_uid`), or by its name alone."""
        eviction: dict[str, Any] = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
        options: dict[str, Any] = {"dryRun": ["All"]} if dry_run else {}
        if by_uid:
            options["preconditions"] = {"uid": admin.core.read_namespaced_pod(name, namespace).metadata.uid}
        if options:
            eviction["deleteOptions"] = options
        path = f"/api/v1/namespaces/{namespace}/pods/{name}/eviction"
        return kubectl(state, "create", "--raw", path, "-f", "-", stdin=json.dumps(eviction), kubeconfig=sa)

    pod("kube-system", "system-critical")
    pod(ns, "other-roleset-abcde-prefill-0")  # a StormService that never opted in
    pod(ns, "plain-roleset-abcde-prefill-0")  # one that asks for a topology, not for healing
    pod(ns, "svc-roleset-abcde-prefill-0")
    pod(ns, "a-roleset-foo-roleset-abcde-prefill-0")  # of a-roleset-foo, which never asked for healing
    pod(ns, long_pod)
    pod(ns, long_stateless)
    pod(elsewhere, "svc-roleset-abcde-prefill-0")  # another namespace's svc: its namespace lists nothing
    try:
        # In force, and its params (the opted-in list) read: probed with dry runs, which evict nothing.
        def in_force() -> bool:
            allowed = evict(ns, "svc-roleset-abcde-prefill-0", True).returncode == 0
            return allowed and _refused(evict("kube-system", "system-critical", True))

        admin.wait(in_force, 60, "the policy in force with its params")
        refused = evict("kube-system", "system-critical")
        assert "evict-opted-in-only" in refused.stderr, refused.stderr
        assert _refused(evict(ns, "other-roleset-abcde-prefill-0"))
        assert _refused(evict(ns, "plain-roleset-abcde-prefill-0"))
        assert _refused(evict(ns, "a-roleset-foo-roleset-abcde-prefill-0"))
        assert _refused(evict(elsewhere, "svc-roleset-abcde-prefill-0"))
        by_name = evict(ns, "svc-roleset-abcde-prefill-0", by_uid=False)  # a healing service's pod, by name alone
        assert _refused(by_name) and "only by the uid" in by_name.stderr, by_name.stderr
        allowed = evict(ns, "svc-roleset-abcde-prefill-0")
        assert allowed.returncode == 0, allowed.stderr
        allowed = evict(ns, long_pod)
        assert allowed.returncode == 0, allowed.stderr
        allowed = evict(ns, long_stateless)
        assert allowed.returncode == 0, allowed.stderr

        # Deletions (RBAC grants pods delete): only a pod stormtopo let go for a spread that no node runs.
        spread = {"stormtopo.io/admitted": "true", "stormtopo.io/spread-kept-out": "true"}
        for name, labels, node in (
            ("let-go", spread, None),
            ("let-go-bound", spread, "w0"),
            ("admitted-only", {"stormtopo.io/admitted": "true"}, None),
        ):
            spec: dict[str, Any] = {"schedulerName": "nobody", "containers": [{"name": "c", "image": "x"}]}
            if node:
                spec["nodeName"] = node
            admin.core.create_namespaced_pod(ns, {"metadata": {"name": name, "namespace": ns, "labels": labels}, "spec": spec})

        def delete(name: str) -> subprocess.CompletedProcess[str]:
            return kubectl(state, "delete", "pod", name, "-n", ns, "--dry-run=server", kubeconfig=sa)

        admin.wait(lambda: delete("let-go").returncode == 0 and _refused(delete("let-go-bound")), 60, "the delete policy in force")
        assert "delete-unbound-only" in delete("let-go-bound").stderr
        assert _refused(delete("admitted-only"))
        refused = kubectl(state, "delete", "pod", "system-critical", "-n", "kube-system", "--dry-run=server", kubeconfig=sa)
        assert refused.returncode != 0, refused.stdout
        assert admin.core.read_namespaced_pod("system-critical", "kube-system").metadata.deletion_timestamp is None
    finally:
        admin.core.delete_namespaced_pod("system-critical", "kube-system", grace_period_seconds=0)
        admin.delete_namespace(ns)
        admin.delete_namespace(elsewhere)


def test_service_account_writes_only_opted_in_lists_among_configmaps(chart_cluster: tuple[Path, DevCluster], tmp_path: Path) -> None:
    """Issue 42, item 1: the opted-in lists live in each namespace, so the ServiceAccount may create
    ConfigMaps anywhere (RBAC cannot name what is created): the policy opted-in-lists-only keeps it to
    ConfigMaps named stormtopo-opted-in with stormtopo's label; it reads and lists ConfigMaps only by that
    name. Each tried both ways, as the ServiceAccount, with server-side dry runs."""
    state, admin = chart_cluster
    install(state, render())
    sa = service_account_kubeconfig(state, tmp_path)
    ns = "lists-ns"
    admin.create_namespace(ns)

    def create(name: str, labels: dict[str, str]) -> subprocess.CompletedProcess[str]:
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": ns, "labels": labels},
            "data": {"svc": "RoleSet"},
        }
        return kubectl(state, "create", "--dry-run=server", "-f", "-", stdin=json.dumps(body), kubeconfig=sa)

    try:
        admin.wait(lambda: _refused(create("app-config", dict(MANAGED_BY))), 60, "the policy in force")
        assert "opted-in-lists-only" in create("app-config", dict(MANAGED_BY)).stderr
        assert _refused(create("stormtopo-opted-in", {}))  # without stormtopo's label
        allowed = create("stormtopo-opted-in", dict(MANAGED_BY))
        assert allowed.returncode == 0, allowed.stderr
        # Reads: by that name only.
        every = kubectl(state, "get", "configmaps", "-A", "--field-selector=metadata.name=stormtopo-opted-in", kubeconfig=sa)
        assert every.returncode == 0, every.stderr
        assert _refused(kubectl(state, "get", "configmaps", "-A", kubeconfig=sa))
        assert _refused(kubectl(state, "get", "configmap", "kube-root-ca.crt", "-n", ns, kubeconfig=sa))
        # Watched by name, as every replica's pod webhook follows the lists (operator/optin.py, OptedInList.follow).
        by_name = "fieldSelector=metadata.name%3Dstormtopo-opted-in&labelSelector=app.kubernetes.io%2Fmanaged-by%3Dstormtopo"
        watched = kubectl(state, "get", "--raw", f"/api/v1/configmaps?{by_name}&watch=true&timeoutSeconds=1", kubeconfig=sa)
        assert watched.returncode == 0, watched.stderr
        assert _refused(kubectl(state, "get", "--raw", "/api/v1/configmaps?watch=true&timeoutSeconds=1", kubeconfig=sa))
        # Volcano's scheduler configuration (volcano.schedulerConfigMap): ConfigMaps of that one name, read only.
        conf = kubectl(state, "get", "configmap", SCHEDULER_CONFIGMAP, "-n", VOLCANO_NAMESPACE, kubeconfig=sa)
        assert conf.returncode == 0, conf.stderr
        assert _refused(kubectl(state, "get", "configmap", "kube-root-ca.crt", "-n", VOLCANO_NAMESPACE, kubeconfig=sa))
        assert _refused(kubectl(state, "get", "configmaps", "-n", VOLCANO_NAMESPACE, kubeconfig=sa))
        edit = ["patch", "configmap", SCHEDULER_CONFIGMAP, "-n", VOLCANO_NAMESPACE, "--dry-run=server", "-p", '{"data":{"x":"y"}}']
        assert _refused(kubectl(state, *edit, kubeconfig=sa))
    finally:
        admin.delete_namespace(ns)


# Last in the module: a real `helm install` and uninstall of a second release. Deleting its admission
# policies while this release's stay made kube-apiserver v1.35.3 find no params for this release's
# bindings ("no params found for policy binding"; README, "When things fail"): the tests of the
# policies with params run before it.
def test_helm_upgrade_keeps_the_ca_and_no_admission_fails(chart_cluster: tuple[Path, DevCluster], tmp_path: Path) -> None:
    """Proves (issue 14, item 3): `helm upgrade` of a release with a generated certificate keeps its CA,
    so a webhook serving the installed certificate is trusted throughout: dry-run pod admissions of an
    opted-in StormService, running during two upgrades, are all admitted and mutated by the webhook."""
    state, admin = chart_cluster
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):  # earlier tests', pointing nowhere
        kubectl(state, "delete", kind, f"{RELEASE}-stormtopo", "--ignore-not-found")
    release, namespace, port = "up", "stormtopo-upgrade", processes.free_port()
    helm = [str(components.ensure_binary("helm")), f"--kubeconfig={state / 'kubeconfig'}", "-n", namespace]
    chart = str(REPO / "deploy/helm/stormtopo")

    def run_helm(*args: str) -> None:
        done = subprocess.run([*helm, *args], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr

    run_helm("install", release, chart, "--create-namespace", f"--set-string=webhook.url=https://127.0.0.1:{port}", "--set", CHART_IMAGE)
    secret_name = f"{release}-stormtopo-webhook-tls"
    installed = admin.core.read_namespaced_secret(secret_name, namespace).data
    certs = tmp_path / "tls"
    certs.mkdir()
    for name in ("tls.crt", "tls.key", "ca.crt"):
        (certs / name).write_bytes(base64.b64decode(installed[name]))
    metrics = processes.free_port()
    operator = processes.start(
        tmp_path,
        "upgrade-operator",
        [
            sys.executable,
            "-m",
            "stormtopo.operator",
            f"--kubeconfig={state / 'kubeconfig'}",
            f"--cert-dir={certs}",
            "--webhook-host=127.0.0.1",
            f"--webhook-port={port}",
            f"--metrics-port={metrics}",
            "--no-register-webhook",
        ],
    )
    admitted: list[float] = []
    failures: list[str] = []
    stop = threading.Event()

    def admit_continuously(roleset: str) -> None:
        own = DevCluster(state)  # its own connections: nothing the test does meanwhile waits on them
        i = 0
        while not stop.is_set():
            i += 1
            name = f"u-{i}"
            labels = {"storm-service-name": "load", "roleset-name": roleset, "role-name": "decode"}
            pod: dict[str, Any] = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": "upgrade-ns", "labels": labels},
                "spec": {"containers": [{"name": "c", "image": "x"}]},
            }
            try:
                created = own.core.create_namespaced_pod("upgrade-ns", pod, dry_run="All", _request_timeout=30)
            except client.ApiException as exc:
                failures.append(f"{exc.status}: {exc.body}")
                continue
            except Exception as exc:  # a dead thread would look like a webhook that stopped admitting
                failures.append(f"{name}: {exc!r}")
                continue
            # The webhook fails open: a call that failed (an untrusted certificate) shows as a pod it did not mutate.
            if (created.metadata.annotations or {}).get("volcano.sh/task-spec") == "decode":
                admitted.append(time.monotonic())
            else:
                failures.append(f"{name} was not mutated by the webhook")

    try:
        admin.wait(lambda: http_ok(f"http://127.0.0.1:{metrics}/readyz"), 90, "the operator to be ready")
        admin.create_namespace("upgrade-ns")
        # No AIBrix PodGroup: a pod can then only be unmutated (fail open: an untrusted CA), never held
        # for a gang that does not carry its constraint yet, which would say nothing about the CA.
        request = {MODE: "hard", HIGHEST_TIER: "1"}
        service = stormservice("load", "upgrade-ns", annotations=request, scheduler_name="nobody", volcano_strategy=False)
        admin.create(service)
        roleset = admin.wait(lambda: admin.rolesets("upgrade-ns", "load"), 60, "the RoleSet")[0]["metadata"]["name"]
        admitting = threading.Thread(target=admit_continuously, args=(roleset,), daemon=True)
        admitting.start()
        admin.wait(lambda: len(admitted) >= 5, 60, "admissions before the upgrade")
        for replicas in ("3", "2"):
            run_helm("upgrade", release, chart, "--reuse-values", f"--set=replicaCount={replicas}")
            after_upgrade = len(admitted)
            admin.wait(
                lambda: len(admitted) >= after_upgrade + 5 or failures,  # noqa: B023
                60,
                f"admissions after the upgrade to {replicas} replicas",
            )
            assert failures == [], failures[:3]
        stop.set()
        admitting.join(30)
        upgraded = admin.core.read_namespaced_secret(secret_name, namespace).data
        hooks = admin.api_client.sanitize_for_serialization(
            client.AdmissionregistrationV1Api(admin.api_client).read_mutating_webhook_configuration(f"{release}-stormtopo")
        )["webhooks"]
    finally:
        stop.set()
        processes.stop(operator, kill=True)
        # --no-hooks: the pre-delete Job's pod runs no container under kwok; what it does is tested by
        # test_helm_uninstall_leaves_the_cluster_as_it_was, which runs its command as the Job would.
        subprocess.run([*helm, "uninstall", release, "--no-hooks"], capture_output=True)
    assert failures == [], failures[:3]
    assert len(admitted) >= 15
    assert upgraded == installed
    assert all(h["clientConfig"]["caBundle"] == installed["ca.crt"] for h in hooks)
