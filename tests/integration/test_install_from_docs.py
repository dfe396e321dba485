"""Installed from the docs alone (issue 45, item 1): every command in docs/install.md's code blocks runs as
written, in order, on a local control plane without an operator, and the install ends with the page's own
check (`stormtopo doctor`) printing what the page shows.

Substituted, and only these:
- the image: `docker build ... && docker push ...` cannot run (no container engine here); the operator runs
  from this checkout instead, as the chart's Deployment would run the image (its arguments, its
  ServiceAccount's token), tests/integration/test_wheel_install.py proving the image holds the same files;
- the cluster: Volcano's configuration and controllers as their installs leave them (the local control
  plane runs them as processes), its nodes carry the fabric's labels (`net.example.com/spine`, `net.example.com/leaf`) that
  `topology from-labels` reads, `fabric.yaml` is the feature request's tree, the commands reach it through
  KUBECONFIG, and `helm install` gets the values that let kube-apiserver (a process on this machine, outside
  any pod network) call a webhook on 127.0.0.1: its URL and a certificate for that address.
Every command runs in a shell, from a directory that holds the checkout's files, with a fresh virtualenv's
bin first on PATH (what `pip install './[cli]'` installs is what the later commands run).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from stormtopo.core.topology.fabric import parse_topology
from stormtopo.devenv import components
from stormtopo.devenv.client import DevCluster
from tests.conftest import REPO, TOPOLOGY_FILE
from tests.integration.chart import kubectl, provided_certificates, run_as_deployment, without_operator

PAGE = REPO / "docs" / "install.md"
LEVELS = ("net.example.com/spine", "net.example.com/leaf")


@dataclass(frozen=True)
class Block:
    line: int  # of its opening fence
    lang: str
    body: str

    def commands(self) -> list[str]:
        """Its commands: lines joined where they end in a backslash; a console block's after its `$ `."""
        text = re.sub(r"\\\n\s*", "", self.body)
        lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
        if self.lang == "console":
            return [line[2:] for line in lines if line.startswith("$ ")]
        return lines

    def output(self) -> list[str]:
        """A console block's output: its lines that are not commands."""
        return [line for line in self.body.splitlines() if line.strip() and not line.startswith("$ ")]


def blocks(text: str) -> list[Block]:
    found = []
    for match in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.MULTILINE | re.DOTALL):
        found.append(Block(text[: match.start()].count("\n") + 1, match.group(1), match.group(2)))
    return found


def runnable(page: str) -> list[tuple[Block, str]]:
    """Every command of the page's shell and console blocks, in order."""
    return [(block, command) for block in blocks(page) if block.lang in ("sh", "console") for command in block.commands()]


def same(line: str) -> str:
    """A line of the doctor's, without what differs from one install to the next: who leads, and when it renewed."""
    return re.sub(r"held by \S+, renewed \d+ s ago", "held by POD, renewed N s ago", line.rstrip())


def test_the_page_has_the_commands_this_test_substitutes() -> None:
    """A change of the page that this test would no longer follow fails here first, naming the line."""
    commands = [c for _, c in runnable(PAGE.read_text())]
    assert any(c.startswith("docker build") for c in commands)
    assert "pip install './[cli]'" in commands
    assert any(c.startswith("helm install stormtopo deploy/helm/stormtopo") for c in commands)
    assert commands[-1] == "stormtopo doctor"
    for block, command in runnable(PAGE.read_text()):
        word = command.split()[0]
        assert word in ("docker", "pip", "stormtopo", "helm", "kubectl"), f"docs/install.md line {block.line}: {command}"


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    with without_operator(tmp_path_factory.mktemp("install-from-docs"), TOPOLOGY_FILE) as cluster:
        yield cluster


def _fabric_labels(cluster: DevCluster) -> None:
    """The cluster substituted: each node carries its leaf and spine as the fabric's tooling would label it."""
    tree = parse_topology(TOPOLOGY_FILE.read_text())
    for node in tree.nodes:
        leaf = tree.switches[tree.nodes[node].switch]
        spine = tree.switches[leaf.parent] if leaf.parent else None
        labels = [f"{LEVELS[1]}={leaf.name}", *([f"{LEVELS[0]}={spine.name}"] if spine else [])]
        done = kubectl(cluster.state_dir, "label", "node", node, "--overwrite", *labels)
        assert done.returncode == 0, done.stderr


def _installed_as_their_charts_install_them(state: Path) -> None:
    """The cluster substituted: the local control plane runs Volcano and AIBrix as processes; a cluster
    has what their own installs leave, which `stormtopo doctor` reads: vc-scheduler's configuration in
    Volcano's ConfigMap (here the file the local vc-scheduler runs) and their controllers' Deployments
    (scaled to none: the processes are the controllers)."""
    conf = (state / "volcano-scheduler.conf").read_text()

    def deployment(namespace: str, name: str, image: str) -> dict[str, object]:
        labels = {"app": name}
        template = {"metadata": {"labels": labels}, "spec": {"containers": [{"name": name, "image": image}]}}
        spec = {"replicas": 0, "selector": {"matchLabels": labels}, "template": template}
        return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": namespace}, "spec": spec}

    objects: list[dict[str, object]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "volcano-system"}},
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "aibrix-system"}},
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "volcano-scheduler-configmap", "namespace": "volcano-system"},
            "data": {"volcano-scheduler.conf": conf},
        },
        deployment("volcano-system", "volcano-scheduler", f"docker.io/volcanosh/vc-scheduler:{components.VOLCANO_VERSION}"),
        deployment("volcano-system", "volcano-controllers", f"docker.io/volcanosh/vc-controller-manager:{components.VOLCANO_VERSION}"),
        deployment("aibrix-system", "aibrix-controller-manager", f"aibrix/controller-manager:{components.AIBRIX_VERSION}"),
    ]
    done = kubectl(state, "apply", "-f", "-", stdin=yaml.safe_dump_all(objects))
    assert done.returncode == 0, done.stderr


def _workdir(directory: Path) -> Path:
    """A directory holding the checkout's files (links), as a user's clone would: the page's relative paths
    resolve there, and what pip's build writes stays there."""
    work = directory / "checkout"
    work.mkdir()
    for entry in REPO.iterdir():
        if entry.name not in (".git", ".venv", "build") and not entry.name.endswith(".egg-info"):
            (work / entry.name).symlink_to(entry)
    (work / "fabric.yaml").write_text(TOPOLOGY_FILE.read_text())
    return work


@pytest.mark.timeout(900)
def test_docs_install_md_followed_literally_ends_with_what_its_check_shows(bare: DevCluster, tmp_path: Path) -> None:
    cluster, state = bare, bare.state_dir
    _fabric_labels(cluster)
    _installed_as_their_charts_install_them(state)
    work = _workdir(tmp_path)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    helm = components.ensure_binary("helm")
    env = {
        **os.environ,
        "PATH": f"{venv / 'bin'}{os.pathsep}{helm.parent}{os.pathsep}{state / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        "KUBECONFIG": str(state / "kubeconfig"),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "VIRTUAL_ENV": str(venv),
    }
    env.pop("PYTHONPATH", None)  # what pip installed, not this checkout's modules, runs the commands
    webhook_port = json.loads((state / "cluster.json").read_text())["ports"]["operator_webhook"]
    certs = tmp_path / "tls"
    cluster_values = [f"--set=webhook.url=https://127.0.0.1:{webhook_port}"]
    for value in provided_certificates(certs):
        cluster_values.append(f"--set-file={value[1:]}" if value.startswith("@") else f"--set={value}")
    timings: list[tuple[str, float]] = []
    doctor: subprocess.CompletedProcess[str] | None = None
    for block, command in runnable(PAGE.read_text()):
        if command.startswith("docker "):
            continue  # the image: substituted (this module's docstring)
        if command.startswith("helm install"):
            command = f"{command} {' '.join(cluster_values)}"
        started = time.monotonic()
        if command == "stormtopo doctor":
            name = _release_service_account(state)
            rendered = subprocess.run(
                [str(helm), "get", "manifest", "stormtopo", "-n", "stormtopo-system"], env=env, capture_output=True, text=True, check=True
            ).stdout
            run_as_deployment(state, tmp_path, rendered, certs, sa=name, namespace="stormtopo-system")
        done = subprocess.run(["bash", "-c", command], cwd=work, env=env, capture_output=True, text=True, timeout=600)
        timings.append((command, time.monotonic() - started))
        if command == "stormtopo doctor":
            doctor = done
            continue
        assert done.returncode == 0, f"docs/install.md line {block.line}: {command}\n{done.stdout}\n{done.stderr}"
    print("\n" + "\n".join(f"  {seconds:6.1f} s  {command}" for command, seconds in timings))
    assert doctor is not None
    print(doctor.stdout)
    shown = next(b for b in blocks(PAGE.read_text()) if b.lang == "console" and "stormtopo doctor" in b.commands())
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert [same(line) for line in doctor.stdout.splitlines() if line.strip()] == [same(line) for line in shown.output()], (
        f"docs/install.md line {shown.line} shows what `stormtopo doctor` does not print on a fresh install:\n{doctor.stdout}"
    )
    leaves = yaml.safe_load(kubectl(state, "get", "hypernodes", "-o", "yaml").stdout)["items"]
    assert {h["spec"]["tier"] for h in leaves} == {1, 2}  # the tree from the labels, as the page's second command writes it


def _release_service_account(state: Path) -> str:
    found = kubectl(state, "get", "serviceaccounts", "-n", "stormtopo-system", "-o", "yaml")
    names = [sa["metadata"]["name"] for sa in yaml.safe_load(found.stdout)["items"] if sa["metadata"]["name"] != "default"]
    assert len(names) == 1, names
    return str(names[0])
