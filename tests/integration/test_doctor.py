"""`stormtopo doctor` on the local control plane: no error on the healthy dev cluster, then each check on a
cluster that has its problem (an error line and exit 1, or a warning and exit 0), and the cluster put back after
each."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from stormtopo.core.diagnosis import (
    AIBRIX_NAMESPACE,
    CONTROLLER_CONFIG_KEY,
    CONTROLLER_CONFIGMAP,
    SCHEDULER_CONFIG_KEY,
    SCHEDULER_CONFIGMAP,
    VOLCANO_NAMESPACE,
)
from stormtopo.core.optin import PODGROUPS_POLICY
from stormtopo.core.topology.tree import Topology
from stormtopo.core.vocabulary import (
    HIGHEST_TIER,
    MANAGED_BY_LABEL,
    MODE,
    NODE_TIER_LABEL,
    OPERATOR_NAME,
    REQUEST_ANNOTATION,
    TOPOLOGY_SOURCE_LABEL,
    VOLCANO_SCHEDULING,
    VOLCANO_TOPOLOGY,
)
from stormtopo.devenv import cluster as dev
from stormtopo.devenv import components
from stormtopo.devenv.client import DevCluster
from stormtopo.devenv.workloads import stormservice
from stormtopo.kube.errors import ApiError
from stormtopo.operator.leader import LEASE_NAME
from tests.conftest import stormtopo
from tests.integration.chart import kubectl

HARD_LEAF = {MODE: "hard", HIGHEST_TIER: "1"}


def doctor(cluster_dir: Path, *args: str) -> tuple[int, list[dict[str, Any]]]:
    """Exit code and findings of `python -m stormtopo.cli doctor -o json`."""
    proc = stormtopo("doctor", "--kubeconfig", str(cluster_dir / "kubeconfig"), "-o", "json", *args, check=False)
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    return proc.returncode, json.loads(proc.stdout)["checks"]


def errors(findings: list[dict[str, Any]], check: str, level: str = "error") -> list[str]:
    return [f"{f['found']} -- {f['todo']}" for f in findings if f["check"] == check and f["level"] == level]


def warnings(findings: list[dict[str, Any]], check: str) -> list[str]:
    return errors(findings, check, "warning")


def run_kubectl(cluster_dir: Path, *args: str, stdin: str | None = None) -> str:
    proc = kubectl(cluster_dir, *args, stdin=stdin)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@contextlib.contextmanager
def present(cluster_dir: Path, *objects: dict[str, Any]) -> Iterator[None]:
    """`objects` created as a user would (kubectl), deleted again on the way out."""
    text = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)})
    run_kubectl(cluster_dir, "create", "-f", "-", stdin=text)
    try:
        yield
    finally:
        run_kubectl(cluster_dir, "delete", "--ignore-not-found", "-f", "-", stdin=text)


def namespaces(cluster_dir: Path, *names: str) -> None:
    """Volcano's and AIBrix's install namespaces, which the dev cluster (processes, not Deployments) lacks; kept."""
    for name in names:
        proc = kubectl(cluster_dir, "create", "namespace", name)
        assert proc.returncode == 0 or "AlreadyExists" in proc.stderr, proc.stderr


def deployment(namespace: str, name: str, image: str) -> dict[str, Any]:
    """A controller Deployment as Volcano's or AIBrix's install leaves it, scaled to 0: the doctor reads its image."""
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": name, "image": image}]}},
        },
    }


def hypernode(name: str, tier: int, members: list[dict[str, Any]], labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "/".join(VOLCANO_TOPOLOGY),
        "kind": "HyperNode",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"tier": tier, "members": members},
    }


def member(kind: str, name: str) -> dict[str, Any]:
    return {"type": kind, "selector": {"exactMatch": {"name": name}}}


def placed(cluster: DevCluster, namespace: str) -> str:
    """An opted-in StormService with its one replica bound; its name."""
    name = f"doctor-{namespace}"
    cluster.create(stormservice(name, namespace, annotations=HARD_LEAF))
    cluster.bound_pods(namespace, f"storm-service-name={name}", 2, timeout=120)
    return name


def test_the_healthy_dev_cluster_has_no_error(cluster: DevCluster, cluster_dir: Path, namespace: str) -> None:
    placed(cluster, namespace)
    text = stormtopo("doctor", "--kubeconfig", str(cluster_dir / "kubeconfig"), check=False)
    assert text.returncode == 0, text.stdout + text.stderr
    *lines, summary = text.stdout.splitlines()
    assert lines and all(line.split()[0] in ("ok", "warning") for line in lines), text.stdout
    assert summary.startswith("0 error(s)")
    # `dev up` keeps vc-scheduler's configuration where Volcano's chart does (its file holds the same): read there.
    where = f"ConfigMap {VOLCANO_NAMESPACE}/{SCHEDULER_CONFIGMAP} key {SCHEDULER_CONFIG_KEY}"
    assert any(line.split()[:2] == ["ok", "scheduler-config"] and where in line for line in lines), text.stdout

    conf = cluster_dir / "volcano-scheduler.conf"
    code, findings = doctor(cluster_dir, "--scheduler-config", str(conf))
    assert code == 0 and all(f["level"] in ("ok", "warning") for f in findings), findings
    (scheduler,) = [f for f in findings if f["check"] == "scheduler-config" and f["found"].startswith(f"file {conf}")]
    assert "network-topology-aware" in scheduler["found"] and scheduler["level"] in ("ok", "warning")
    (podgroups,) = [f for f in findings if f["check"] == "podgroups"]
    assert podgroups["level"] == "ok" and "checked" in podgroups["found"], podgroups

    # kubectl's plugin runs the same parser (the kubeconfig from $KUBECONFIG).
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    run = [str(components.ensure_binary("kubectl")), "stormtopo", "doctor", "-o", "json"]
    plugin = subprocess.run(run, capture_output=True, text=True, env=env, timeout=120)
    assert plugin.returncode == 0, plugin.stdout + plugin.stderr
    assert {f["check"] for f in json.loads(plugin.stdout)["checks"]} == {f["check"] for f in findings}


def test_a_node_with_a_second_parent_is_an_error(cluster: DevCluster, cluster_dir: Path, topology: Topology) -> None:
    node = sorted(topology.nodes)[0]
    name = f"doctor-{uuid.uuid4().hex[:6]}"
    cluster.create(hypernode(name, 1, [member("Node", node)]))
    try:
        code, findings = doctor(cluster_dir)
    finally:
        cluster.custom.delete_cluster_custom_object(*VOLCANO_TOPOLOGY, "hypernodes", name)
    assert code == 1
    (error,) = errors(findings, "hypernodes")
    assert (
        f"node {node} (in " in error
        and name in error
        and topology.nodes[node].switch in error
        and "two parents" in error
        and "remove it from all but one" in error
    )


def test_hypernodes_naming_one_another_are_an_error(cluster_dir: Path) -> None:
    """A cycle: Volcano refuses to build the tree (and places no topology gang until it is gone)."""
    tag = uuid.uuid4().hex[:6]
    upper, lower = f"doctor-up-{tag}", f"doctor-down-{tag}"
    with present(cluster_dir, hypernode(upper, 3, [member("HyperNode", lower)]), hypernode(lower, 2, [member("HyperNode", upper)])):
        code, findings = doctor(cluster_dir)
    assert code == 1
    (error,) = errors(findings, "hypernodes")
    assert "HyperNodes name one another in a cycle" in error and upper in error and lower in error, error
    assert "remove the member that points back up the tree" in error


def test_a_scheduler_config_without_network_topology_aware_is_an_error(cluster_dir: Path, tmp_path: Path) -> None:
    conf = yaml.safe_load(dev.SCHEDULER_CONF)
    for tier in conf["tiers"]:
        tier["plugins"] = [p for p in tier["plugins"] if p["name"] != "network-topology-aware"]
    path = tmp_path / "volcano-scheduler.conf"
    path.write_text(yaml.safe_dump(conf))
    code, findings = doctor(cluster_dir, "--scheduler-config", str(path))
    assert code == 1
    (error,) = errors(findings, "scheduler-config")
    assert f"file {path}" in error and "network-topology-aware plugin is not enabled" in error and "add `- name:" in error
    missing = stormtopo(
        "doctor", "--kubeconfig", str(cluster_dir / "kubeconfig"), "--scheduler-config", str(tmp_path / "none"), check=False
    )
    assert missing.returncode == 2 and "--scheduler-config" in missing.stderr


def test_an_opted_in_podgroup_without_its_constraint_is_an_error(cluster: DevCluster, cluster_dir: Path, namespace: str) -> None:
    """With the operator stopped (its webhooks fail open; the admission policy only keeps a PodGroup that still
    carries stormtopo's request annotation), the annotation and then networkTopology are taken off a replica's
    PodGroup; the operator, started again, puts both back."""
    name = placed(cluster, namespace)
    roleset = cluster.only(lambda: cluster.rolesets(namespace, name), f"RoleSet of {name}")
    group = roleset["metadata"]["name"]
    dev.stop_component(cluster_dir, "operator", kill=True)
    try:
        annotation = "/metadata/annotations/" + REQUEST_ANNOTATION.replace("~", "~0").replace("/", "~1")
        cluster.api.patch_podgroup(namespace, group, [{"op": "remove", "path": annotation}])

        def stripped() -> bool:
            spec = cluster.api.get(VOLCANO_SCHEDULING, "podgroups", namespace, group) or {}
            if "networkTopology" not in (spec.get("spec") or {}):
                return True
            try:  # AIBrix may rewrite the spec in between: then read again
                cluster.api.patch_podgroup(namespace, group, [{"op": "remove", "path": "/spec/networkTopology"}])
            except ApiError:
                return False
            return False

        cluster.wait(stripped, 30, f"PodGroup {group} without networkTopology")
        code, findings = doctor(cluster_dir)
    finally:
        dev.start_operator(cluster_dir)
    assert code == 1
    (error,) = errors(findings, "podgroups")
    assert f"StormService {namespace}/{name}: PodGroup {group} has no networkTopology" in error and "stormtopo explain" in error

    def restored() -> bool:
        podgroup = cluster.api.get(VOLCANO_SCHEDULING, "podgroups", namespace, group) or {}
        return (podgroup.get("spec") or {}).get("networkTopology") == {"mode": "hard", "highestTierAllowed": 1}

    cluster.wait(restored, 60, f"the operator to give PodGroup {group} its networkTopology back")


def test_volcano_and_aibrix_releases_are_read_from_their_controllers_images(cluster_dir: Path) -> None:
    """Before 1.12 is an error (no PodGroup networkTopology), an untested release a warning, a tested one ok."""
    namespaces(cluster_dir, VOLCANO_NAMESPACE, AIBRIX_NAMESPACE)
    scheduler = deployment(VOLCANO_NAMESPACE, "volcano-scheduler", "docker.io/volcanosh/vc-scheduler:v1.11.2")
    aibrix = deployment(AIBRIX_NAMESPACE, "aibrix-controller-manager", "aibrix/controller-manager:v0.5.0")
    with present(cluster_dir, scheduler, aibrix):
        code, findings = doctor(cluster_dir)
        assert code == 1
        (error,) = errors(findings, "versions")
        assert f"Volcano v1.11.2 ({VOLCANO_NAMESPACE}/volcano-scheduler) has no PodGroup networkTopology" in error, error
        assert any(
            f"AIBrix v0.5.0 ({AIBRIX_NAMESPACE}/aibrix-controller-manager) was not tested" in w for w in warnings(findings, "versions")
        )

        run_kubectl(
            cluster_dir,
            "-n",
            VOLCANO_NAMESPACE,
            "set",
            "image",
            "deployment/volcano-scheduler",
            "volcano-scheduler=docker.io/volcanosh/vc-scheduler:v1.15.1",
        )
        code, findings = doctor(cluster_dir)
    assert code == 0 and not errors(findings, "versions"), findings
    assert any(f["level"] == "ok" and f["found"].startswith("Volcano v1.15.1 (") for f in findings if f["check"] == "versions"), findings


def test_the_scheduler_configuration_is_read_where_volcanos_install_keeps_it(cluster_dir: Path) -> None:
    """Volcano's chart keeps vc-scheduler's configuration in a ConfigMap (as `stormtopo dev up` does): read there,
    task-topology is an error (it panics vc-scheduler); the dev cluster's own configuration, there, is not."""
    conf = yaml.safe_load(dev.SCHEDULER_CONF)
    conf["tiers"][-1]["plugins"].append({"name": "task-topology"})
    (_, configmap) = dev.scheduler_conf_objects(yaml.safe_dump(conf))
    run_kubectl(cluster_dir, "apply", "--server-side", "--field-manager=stormtopo-dev", "-f", "-", stdin=json.dumps(configmap))
    try:
        code, findings = doctor(cluster_dir)
        assert code == 1
        (error,) = errors(findings, "scheduler-config")
        assert f"ConfigMap {VOLCANO_NAMESPACE}/{SCHEDULER_CONFIGMAP} key {SCHEDULER_CONFIG_KEY}" in error and "task-topology" in error, (
            error
        )
        assert "remove task-topology" in error
    finally:  # (only the ConfigMap: the scheduler's file never had it)
        (_, configmap) = dev.scheduler_conf_objects(dev.SCHEDULER_CONF)
        run_kubectl(cluster_dir, "apply", "--server-side", "--field-manager=stormtopo-dev", "-f", "-", stdin=json.dumps(configmap))
    code, findings = doctor(cluster_dir)
    assert code == 0 and not errors(findings, "scheduler-config"), findings
    assert any(f"ConfigMap {VOLCANO_NAMESPACE}/{SCHEDULER_CONFIGMAP}" in f["found"] for f in findings if f["check"] == "scheduler-config")


def test_missing_members_mixed_depths_and_discovery_beside_the_node_tier_are_warnings(cluster_dir: Path) -> None:
    """A tier-2 HyperNode that Volcano's label discovery wrote, right above a node (where the seed's tier 2 is two
    levels above them), naming a tier-0 HyperNode of the node tier whose node does not exist, while discovery is
    enabled in Volcano's controller configuration: three warnings, no error, exit 0."""
    namespaces(cluster_dir, VOLCANO_NAMESPACE)
    tag = uuid.uuid4().hex[:6]
    node, ghost, tier0, leaf = f"doctor-node-{tag}", f"doctor-ghost-{tag}", f"doctor-{tag}.node", f"doctor-leaf-{tag}"
    controller = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": CONTROLLER_CONFIGMAP, "namespace": VOLCANO_NAMESPACE},
        "data": {CONTROLLER_CONFIG_KEY: yaml.safe_dump({"networkTopologyDiscovery": [{"source": "label", "enabled": True}]})},
    }
    spare = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}, "spec": {"unschedulable": True}}
    # The cluster's operator runs with the node tier off, which gives a leaf naming a tier-0 HyperNode of its own
    # its node back within 5 s (the tree the doctor must read would be gone): stopped while it reads.
    dev.stop_component(cluster_dir, "operator")
    try:
        with present(
            cluster_dir,
            controller,
            spare,
            hypernode(tier0, 0, [member("Node", ghost)], {NODE_TIER_LABEL: "true", MANAGED_BY_LABEL: OPERATOR_NAME}),
            hypernode(leaf, 2, [member("Node", node), member("HyperNode", tier0)], {TOPOLOGY_SOURCE_LABEL: "label"}),
        ):
            code, findings = doctor(cluster_dir)
    finally:
        dev.start_operator(cluster_dir)
    assert code == 0 and not errors(findings, "hypernodes"), findings
    said = warnings(findings, "hypernodes")
    assert any(f"{tier0} names node {ghost}" in w and "do not exist" in w for w in said), said
    assert any(f"tier 2 is 1 level above the nodes at {leaf} but 2 levels above" in w for w in said), said
    (discovery,) = [w for w in said if "discovery" in w]
    assert f"source label in ConfigMap {VOLCANO_NAMESPACE}/{CONTROLLER_CONFIGMAP}" in discovery, discovery
    assert f"discovered leaves naming tier-0 HyperNodes (named with --node-tier-leaf): {leaf}" in discovery, discovery
    assert "leave discovered leaves out of --node-tier-leaf" in discovery


def test_a_policy_binding_deleted_is_an_error_and_a_second_copy_without_a_ca_a_warning(cluster_dir: Path) -> None:
    """The binding that keeps constrained PodGroups, deleted (as a careless cleanup would); a copy of the gate's
    webhook configuration (a second install) that names a Service without a caBundle and matches nothing."""
    binding = json.loads(run_kubectl(cluster_dir, "get", "validatingadmissionpolicybinding", PODGROUPS_POLICY, "-o", "json"))
    kept = {k: v for k, v in binding["metadata"].items() if k in ("name", "labels", "annotations")}
    copy: dict[str, Any] = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": f"doctor-copy-{uuid.uuid4().hex[:6]}"},
        "webhooks": [
            {
                "name": "stormservices.stormtopo.io",
                "clientConfig": {"service": {"namespace": "stormtopo-system", "name": "stormtopo-webhook", "path": "/validate"}},
                "rules": [],  # matches nothing: the copy is never called
                "failurePolicy": "Ignore",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
            }
        ],
    }
    # What the doctor says of this cluster's admission objects first: the session's cluster may hold another install's
    # copies too (an operator run as the chart runs it leaves the chart's policies and bindings, prefixed "rel-").
    _, before = doctor(cluster_dir)
    try:
        # Another writer may put the binding back meanwhile (the operator registers its admission objects again when
        # its certificate changes): the doctor must find it missing whenever it is, so delete it until it stays gone.
        for _ in range(3):
            run_kubectl(cluster_dir, "delete", "validatingadmissionpolicybinding", PODGROUPS_POLICY, "--ignore-not-found")
            with present(cluster_dir, copy):
                code, findings = doctor(cluster_dir)
            back = run_kubectl(cluster_dir, "get", "validatingadmissionpolicybinding", PODGROUPS_POLICY, "--ignore-not-found", "-o", "name")
            if code == 1 or not back.strip():
                break
    finally:
        if not run_kubectl(cluster_dir, "get", "validatingadmissionpolicybinding", PODGROUPS_POLICY, "--ignore-not-found", "-o", "name"):
            run_kubectl(cluster_dir, "create", "-f", "-", stdin=json.dumps({**binding, "metadata": kept}))
    assert code == 1
    (error,) = errors(findings, "webhooks")
    assert f"not registered: ValidatingAdmissionPolicyBinding *{PODGROUPS_POLICY}" in error, error
    assert "may strip networkTopology" in error and "install the chart" in error
    said = " ".join(warnings(findings, "webhooks"))
    assert "registered more than once" in said and copy["metadata"]["name"] in said, said
    assert f"of ValidatingWebhookConfiguration {copy['metadata']['name']} has no caBundle" in said, said

    code, findings = doctor(cluster_dir)
    assert not errors(findings, "webhooks"), findings
    assert warnings(findings, "webhooks") == warnings(before, "webhooks"), findings  # as it was: the copy gone, the binding back


def test_a_lease_nobody_renews_is_an_error(cluster_dir: Path, namespace: str) -> None:
    """An operator with leader election whose replicas are all gone: its Lease, last renewed an hour ago."""
    hour_ago = (datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": LEASE_NAME, "namespace": namespace},
        "spec": {"holderIdentity": "stormtopo-operator-7d9f-gone", "leaseDurationSeconds": 15, "renewTime": hour_ago},
    }
    code, findings = doctor(cluster_dir)
    assert [f["level"] for f in findings if f["check"] == "leader"] == ["warning"], findings  # dev up runs one replica, no Lease
    with present(cluster_dir, lease):
        code, findings = doctor(cluster_dir)
    assert code == 1
    (error,) = errors(findings, "leader")
    assert f"Lease {namespace}/{LEASE_NAME}: last renewed 36" in error and "by stormtopo-operator-7d9f-gone" in error, error
    assert "no replica leads" in error and f"check the operator's pods in {namespace}" in error
