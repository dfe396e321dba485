"""The chart as the integration tests use it: rendered by `helm template`, applied as Helm applies it, on a
local control plane started without an operator (the test runs its own, as the chart's Deployment would)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from stormtopo import certificates
from stormtopo.devenv import cluster as dev
from stormtopo.devenv import components, processes
from stormtopo.devenv.client import DevCluster
from stormtopo.kube.client import Api
from stormtopo.operator import webhook
from tests.conftest import CHART_IMAGE, REPO, stormtopo

NAMESPACE = "stormtopo-system"
RELEASE = "rel"
SA = f"{RELEASE}-stormtopo"


@contextmanager
def without_operator(state: Path, topology: Path | None = None) -> Iterator[DevCluster]:
    """`stormtopo dev up --without-operator` in `state` (with `topology`'s nodes and HyperNodes), down again afterwards."""
    stormtopo("dev", "up", "--state-dir", str(state), "--without-operator", *(["--topology", str(topology)] if topology else []))
    try:
        yield DevCluster(state)
    finally:
        stormtopo("dev", "down", "--state-dir", str(state), check=False)


def kubectl(state: Path, *args: str, stdin: str | None = None, kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [str(state / "bin" / "kubectl"), *args]
    if kubeconfig:
        cmd = [str(components.ensure_binary("kubectl")), f"--kubeconfig={kubeconfig}", *args]
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True)


def render(*sets: str, cluster: Path | None = None, api_versions: tuple[str, ...] = ()) -> str:
    """`helm template`; with `cluster` (a state dir) against it, as an install or upgrade renders: `lookup`
    sees the installed objects; with `api_versions`, as for an API server that serves them too."""
    helm = components.ensure_binary("helm")
    cmd = [str(helm), "template", RELEASE, str(REPO / "deploy/helm/stormtopo"), "--namespace", NAMESPACE, "--kube-version", "1.35.3"]
    cmd += [f"--api-versions={v}" for v in api_versions]
    cmd += ["--set", CHART_IMAGE]
    if cluster is not None:
        cmd += ["--dry-run=server", f"--kubeconfig={cluster / 'kubeconfig'}"]
    for s in sets:
        typed = s.partition("=")[2] in ("true", "false") or s.partition("=")[2].isdigit()  # a boolean or a number, as --set reads it
        cmd += ["--set-file" if s.startswith("@") else "--set" if typed else "--set-string", s.lstrip("@")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def without_hooks(rendered: str) -> str:
    """The objects Helm installs: its hooks (the uninstall Job) run only at their event."""
    kept = [d for d in yaml.safe_load_all(rendered) if d and "helm.sh/hook" not in ((d.get("metadata") or {}).get("annotations") or {})]
    return yaml.safe_dump_all(kept)


def hook_of(rendered: str, event: str) -> dict[str, Any]:
    """The hook of a rendered chart that runs at `event` (e.g. pre-delete)."""
    return dict(
        next(
            d
            for d in yaml.safe_load_all(rendered)
            if d and ((d.get("metadata") or {}).get("annotations") or {}).get("helm.sh/hook") == event
        )
    )


def install(state: Path, rendered: str) -> None:
    """Apply a rendered chart as Helm would (server-side validation), its namespace first; no hooks."""
    kubectl(state, "create", "namespace", NAMESPACE)  # may exist: the cluster is shared by this module
    applied = kubectl(
        state, "apply", "--server-side", "--force-conflicts", "--field-manager=helm", "-f", "-", stdin=without_hooks(rendered)
    )
    assert applied.returncode == 0, applied.stderr


def service_account_kubeconfig(state: Path, directory: Path, sa: str = SA, namespace: str = NAMESPACE) -> Path:
    """A kubeconfig that authenticates as the chart's ServiceAccount, with a token from TokenRequest."""
    token = kubectl(state, "create", "token", sa, "-n", namespace, "--duration=1h").stdout.strip()
    assert token
    config = yaml.safe_load((state / "kubeconfig").read_text())
    config["users"][0]["user"] = {"token": token}
    path = directory / "sa-kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


def provided_certificates(directory: Path) -> list[str]:
    """A CA and a serving pair for 127.0.0.1 written to `directory`, and the chart values that provide them."""
    ca = certificates.new_ca("test-ca")
    serving = certificates.new_serving_cert(ca, "webhook", ["127.0.0.1"])
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in {"tls.crt": serving.cert_pem, "tls.key": serving.key_pem, "ca.crt": ca.cert_pem}.items():
        (directory / name).write_bytes(data)
    return [
        "webhook.certMode=provided",
        f"@webhook.provided.tlsCrt={directory / 'tls.crt'}",
        f"@webhook.provided.tlsKey={directory / 'tls.key'}",
        f"@webhook.provided.caCrt={directory / 'ca.crt'}",
    ]


def of_kind(rendered: str, kind: str) -> dict[str, Any]:
    return dict(next(d for d in yaml.safe_load_all(rendered) if d and d["kind"] == kind))


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def run_as_deployment(state: Path, directory: Path, rendered: str, certs: Path, sa: str = SA, namespace: str = NAMESPACE) -> None:
    """`python -m stormtopo.operator` with the rendered Deployment's arguments, under its ServiceAccount's
    token, on the cluster's webhook and metrics ports (kwok's nodes run no container), until ready."""
    ports = json.loads((state / "cluster.json").read_text())["ports"]
    deployment = of_kind(rendered, "Deployment")
    replaced = {
        "--cert-dir": str(certs),
        "--webhook-port": str(ports["operator_webhook"]),
        "--metrics-port": str(ports["operator_metrics"]),
        "--metrics-host": "127.0.0.1",
    }
    args = [
        f"{a.split('=')[0]}={replaced[a.split('=')[0]]}" if a.split("=")[0] in replaced else a
        for a in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    ]
    kubeconfig = service_account_kubeconfig(state, directory, sa, namespace)
    # The chart's flags, then the test suite's shorter periods (dev.operator_args(); the last flag wins).
    argv = [sys.executable, "-m", "stormtopo.operator", f"--kubeconfig={kubeconfig}", "--webhook-host=127.0.0.1"]
    argv += [*args, *dev.operator_args()]
    operator = processes.start(state, "operator", argv, env=dev.operator_env(state))
    DevCluster.wait(
        lambda: operator.alive() and http_ok(f"http://127.0.0.1:{ports['operator_metrics']}/readyz"),
        90,
        "the operator as installed ready",
    )


@contextmanager
def running_as_installed(state: Path, directory: Path, *sets: str) -> Iterator[InstalledOperator]:
    """The cluster's operator replaced by one run as the chart runs it (with these values), and put back."""
    installed = InstalledOperator(state, directory)
    installed.start(*sets)
    try:
        yield installed
    finally:
        installed.stop()


class InstalledOperator:
    """The operator of a running `stormtopo dev up` cluster replaced by one run as the chart's Deployment
    runs it (issue 34: features that write what they did not create are tested as installed): the chart
    applied (its RBAC, admission policies and the operator's admission objects, addressed to a local
    webhook with provided certificates), and `python -m stormtopo.operator` with the Deployment's
    arguments under the ServiceAccount's token, on the cluster's own webhook and metrics ports. `stop`
    puts the cluster's own operator back."""

    def __init__(self, state: Path, directory: Path) -> None:
        self.state = state
        self.directory = directory
        self.rendered = ""
        self.deployment = ""  # the whole chart as rendered, its Deployment included (what restart runs)
        self.sets: tuple[str, ...] = ()

    def start(self, *sets: str) -> None:
        """(Re)start it with these chart values; the first start replaces the cluster's own operator."""
        ports = json.loads((self.state / "cluster.json").read_text())["ports"]
        url = f"https://127.0.0.1:{ports['operator_webhook']}"
        if not self.rendered:  # the cluster's own operator and the webhooks it registered go
            dev.stop_component(self.state, "operator")
            # Its admission policies stay (they match nothing the chart's operator does). Deleting them here
            # made kube-apiserver v1.35.3 find no params for the chart's new bindings for minutes ("no params
            # found for policy binding"; the eviction policy then denied every eviction). Not seen on a fresh
            # install, nor when the chart's own policies are deleted and applied again (checked by hand).
            hooks = [o for o in webhook.configuration(b"", url_base=url) if o["kind"].endswith("WebhookConfiguration")]
            webhook.unregister(Api(str(self.state / "kubeconfig")), hooks)
        else:
            self._keep_log()
            dev.stop_component(self.state, "operator")
        certs = self.directory / "tls"
        rendered = render(*provided_certificates(certs), f"webhook.url={url}", *sets)
        kept = [d for d in yaml.safe_load_all(without_hooks(rendered)) if d and d["kind"] not in ("Deployment", "PodDisruptionBudget")]
        install(self.state, yaml.safe_dump_all(kept))
        self.rendered, self.sets, self.deployment = yaml.safe_dump_all(kept), sets, rendered
        run_as_deployment(self.state, self.directory, rendered, certs)

    def restart(self) -> None:
        """The operator process alone started again, nothing applied (what a test changed in the cluster stays)."""
        self._keep_log()
        dev.stop_component(self.state, "operator")
        run_as_deployment(self.state, self.directory, self.deployment, self.directory / "tls")

    def stop(self) -> None:
        """The chart's webhook configurations deleted and the cluster's own operator started again."""
        self._keep_log()
        dev.stop_component(self.state, "operator")
        if self.rendered:
            # Only the webhook configurations (they name the provided CA, not the cluster's operator's). The
            # policies and RBAC stay, matching only the chart's ServiceAccount: deleting some policies with
            # ConfigMap params while others stay left kube-apiserver v1.35.3 finding no params for the others.
            hooks = [d for d in yaml.safe_load_all(self.rendered) if d and d["kind"].endswith("WebhookConfiguration")]
            kubectl(self.state, "delete", "-f", "-", "--ignore-not-found", stdin=yaml.safe_dump_all(hooks))
            self.rendered = ""
        dev.start_operator(self.state)

    def _keep_log(self) -> None:
        """The operator's log goes on in logs/operator-as-installed.log: the next start writes over
        logs/operator.log, and a failed test is read from it."""
        log = self.state / "logs" / "operator.log"
        if self.rendered and log.exists():
            with (self.state / "logs" / "operator-as-installed.log").open("a") as kept:
                kept.write(log.read_text(errors="replace"))
