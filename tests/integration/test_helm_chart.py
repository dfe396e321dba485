"""The Helm chart renders, applies with server-side validation, and its ServiceAccount is enough, and
no more than enough, for the operator: run under that identity, with two replicas and leader election
(issues 6 and 7)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from stormtopo import certificates
from stormtopo.core.topology.fabric import parse_topology
from stormtopo.core.topology.hypernodes import hypernode_manifests
from stormtopo.core.vocabulary import HIGHEST_TIER, MODE
from stormtopo.devenv import components, processes
from stormtopo.devenv.client import DevCluster
from stormtopo.devenv.nodes import node_manifests
from stormtopo.devenv.workloads import Role, stormservice
from tests.conftest import REPO, stormtopo

NAMESPACE = "stormtopo-system"
RELEASE = "rel"
SA = f"{RELEASE}-stormtopo"


@pytest.fixture(scope="module")
def chart_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, DevCluster]]:
    state = tmp_path_factory.mktemp("chart")
    stormtopo("dev", "up", "--state-dir", str(state), "--without-operator")
    try:
        yield state, DevCluster(state)
    finally:
        stormtopo("dev", "down", "--state-dir", str(state), check=False)


def kubectl(state: Path, *args: str, stdin: str | None = None, kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [str(state / "bin" / "kubectl"), *args]
    if kubeconfig:
        cmd = [str(components.ensure_binary("kubectl")), f"--kubeconfig={kubeconfig}", *args]
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True)


def render(*sets: str) -> str:
    helm = components.ensure_binary("helm")
    cmd = [str(helm), "template", RELEASE, str(REPO / "deploy/helm/stormtopo"), "--namespace", NAMESPACE, "--kube-version", "1.35.3"]
    for s in sets:
        cmd += ["--set-string" if not s.startswith("@") else "--set-file", s.lstrip("@")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_chart_renders_for_every_certificate_mode_and_rejects_a_bad_one() -> None:
    generated = list(yaml.safe_load_all(render()))
    kinds = sorted(d["kind"] for d in generated if d)
    assert kinds == sorted(
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "Deployment",
            "MutatingWebhookConfiguration",
            "Role",
            "RoleBinding",
            "Secret",
            "Service",
            "Service",
            "ServiceAccount",
        ]
    )
    deployment = next(d for d in generated if d and d["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] >= 2 and "--leader-elect" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    cm = [d["kind"] for d in yaml.safe_load_all(render("webhook.certMode=certManager")) if d]
    assert "Certificate" in cm and "Secret" not in cm
    helm = components.ensure_binary("helm")
    bad = subprocess.run(
        [str(helm), "template", "x", str(REPO / "deploy/helm/stormtopo"), "--kube-version", "1.35.3", "--set", "webhook.certMode=nope"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode != 0 and "must be generated, certManager or provided" in bad.stderr


def test_operator_under_the_charts_service_account_with_leader_election(chart_cluster: tuple[Path, DevCluster], tmp_path: Path) -> None:
    state, admin = chart_cluster
    port = processes.free_port()
    ca = certificates.new_ca("test-ca")
    serving = certificates.new_serving_cert(ca, "webhook", ["127.0.0.1"])
    certs = tmp_path / "tls"
    certs.mkdir()
    for name, data in {"tls.crt": serving.cert_pem, "tls.key": serving.key_pem, "ca.crt": ca.cert_pem}.items():
        (certs / name).write_bytes(data)
    rendered = render(
        "webhook.certMode=provided",
        f"@webhook.provided.tlsCrt={certs / 'tls.crt'}",
        f"@webhook.provided.tlsKey={certs / 'tls.key'}",
        f"@webhook.provided.caCrt={certs / 'ca.crt'}",
        f"webhook.url=https://127.0.0.1:{port}",
    )
    assert kubectl(state, "create", "namespace", NAMESPACE).returncode == 0
    applied = kubectl(state, "apply", "--server-side", "--field-manager=helm", "-f", "-", stdin=rendered)
    assert applied.returncode == 0, applied.stderr

    token = kubectl(state, "create", "token", SA, "-n", NAMESPACE, "--duration=1h").stdout.strip()
    config = yaml.safe_load((state / "kubeconfig").read_text())
    config["users"][0]["user"] = {"token": token}
    sa_kubeconfig = tmp_path / "sa-kubeconfig"
    sa_kubeconfig.write_text(yaml.safe_dump(config))
    # Least privilege, negatively: no Secrets, no writes to what others own.
    who = f"system:serviceaccount:{NAMESPACE}:{SA}"
    for verb, resource in (
        ("get", "secrets"),
        ("list", "secrets"),
        ("delete", "stormservices.orchestration.aibrix.ai"),
        ("delete", "pods"),
        ("patch", "nodes"),
        ("create", "hypernodes.topology.volcano.sh"),
    ):
        assert kubectl(state, "auth", "can-i", verb, resource, "-A", f"--as={who}").stdout.strip() == "no", (verb, resource)
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

    first = operator("op-a")
    time.sleep(2)
    second = operator("op-b")
    try:
        leases = client.CoordinationV1Api(admin.api_client)

        def lease() -> dict:  # type: ignore[type-arg]
            return dict(admin.api_client.sanitize_for_serialization(leases.read_namespaced_lease("stormtopo-operator", NAMESPACE)))

        admin.wait(lambda: _holder(lease) == "op-a", 30, "op-a to lead")
        admin.create_namespace("chart-ns")
        big = (Role("prefill", gpus=6), Role("decode", gpus=6))
        admin.create(stormservice("sa-svc", "chart-ns", roles=big, annotations={MODE: "hard", HIGHEST_TIER: "1"}, volcano_strategy=False))
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
    finally:
        for p in (first, second):
            processes.stop(p, kill=True)


def _holder(read) -> str:  # type: ignore[no-untyped-def]
    try:
        return str(read()["spec"]["holderIdentity"])
    except Exception:
        return ""
