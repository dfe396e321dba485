"""The image's installation, run (issue 22). The Dockerfile's steps are replayed into clean virtualenvs
(tests/deploy/dockerfile.py): the wheel built from a copy of the sources, then the lock installed with
--require-hashes and the wheel with --no-deps. That virtualenv holds the lock, stormtopo and nothing else, and
its operator, started with the Deployment's arguments as `helm template` renders them, under the chart's
ServiceAccount, places an opted-in StormService's replica within one leaf on the local control plane."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from stormtopo.core.topology.tree import Topology
from stormtopo.core.vocabulary import DOMAIN_LABEL_PREFIX, HIGHEST_TIER, MODE
from stormtopo.devenv import processes
from stormtopo.devenv.workloads import Role, filler_pod, stormservice
from tests.conftest import TOPOLOGY_FILE
from tests.deploy import dockerfile, lock
from tests.integration.chart import http_ok, install, of_kind, provided_certificates, render, service_account_kubeconfig, without_operator

PIP_CACHE = Path.home() / ".cache" / "stormtopo" / "pip"  # the downloads, kept between runs, never in the checkout
BASE = {"pip", "setuptools", "wheel"}  # in every Python image and virtualenv, beside what the Dockerfile installs
# Run by the image's Python from a directory outside the repository: what is installed, where stormtopo is
# imported from, and which installed distributions stormtopo's requirements reach (markers as they evaluate here).
# (packaging is pip's own copy: the image has pip, not packaging.)
INSPECT = """
import json, importlib.metadata as md, stormtopo
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name as name

installed = {name(d.metadata["Name"]): d.version for d in md.distributions()}
reached, todo = set(), ["stormtopo"]
while todo:
    for req in map(Requirement, md.requires(todo.pop()) or []):
        if req.marker and not req.marker.evaluate({"extra": ""}):
            continue
        if name(req.name) not in reached:
            reached.add(name(req.name))
            todo.append(name(req.name))
print(json.dumps({"installed": installed, "reached": sorted(reached), "stormtopo": stormtopo.__file__}))
"""


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> dockerfile.Image:
    return dockerfile.replay(tmp_path_factory.mktemp("image"), PIP_CACHE)


def test_the_image_holds_the_lock_and_stormtopo_and_nothing_else(image: dockerfile.Image, tmp_path: Path) -> None:
    env = dockerfile.clean_env(**image.env)
    done = subprocess.run([str(image.python), "-c", INSPECT], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    seen: dict[str, Any] = json.loads(done.stdout)
    assert Path(seen["stormtopo"]).is_relative_to(image.venv), seen["stormtopo"]  # the wheel's, not the checkout's
    pins = {p.name: p.version for p in lock.read(lock.OPERATOR.read_text()).values()}
    installed = {n: v for n, v in seen["installed"].items() if n not in BASE}
    assert installed == {**pins, "stormtopo": installed["stormtopo"]}
    # By the installed metadata (not the lock's comments): every pin is needed, and nothing needed is missing.
    assert set(seen["reached"]) == set(pins)
    assert "kubernetes" not in installed and "rich" not in installed  # the cli extra stays out of the image


def test_the_installed_operator_run_as_the_chart_runs_it_places_a_replica_within_a_leaf(
    image: dockerfile.Image, topology: Topology, tmp_path: Path
) -> None:
    state = tmp_path / "cluster"
    with without_operator(state, TOPOLOGY_FILE) as admin:
        port, metrics = processes.free_port(), processes.free_port()
        certs = tmp_path / "tls"
        rendered = render(*provided_certificates(certs), f"webhook.url=https://127.0.0.1:{port}")
        install(state, rendered)
        pod = of_kind(rendered, "Deployment")["spec"]["template"]["spec"]
        [container] = pod["containers"]
        assert "command" not in container  # the image's ENTRYPOINT runs, with the chart's arguments
        # What must differ outside a pod, and nothing else: the ports (the chart's may be taken on this
        # machine), loopback for metrics (nothing here listens beyond it), the certificate directory (the
        # chart mounts the same three files from its Secret at /tls), and two additions: --kubeconfig (in a
        # pod, the ServiceAccount's mounted token; here a token of that ServiceAccount) and --webhook-host
        # (in a pod, every address; here loopback).
        local = {"--webhook-port": str(port), "--metrics-host": "127.0.0.1", "--metrics-port": str(metrics), "--cert-dir": str(certs)}
        args = [f"{flag}={local[flag]}" if (flag := a.split("=", 1)[0]) in local else a for a in container["args"]]
        assert {a.split("=", 1)[0] for a in container["args"]} >= set(local), container["args"]
        args += [f"--kubeconfig={service_account_kubeconfig(state, tmp_path)}", "--webhook-host=127.0.0.1"]
        env = dockerfile.clean_env(**image.env, **{e["name"]: _env_value(e, "wheel-operator-0") for e in container["env"]})
        operator = processes.start(tmp_path, "wheel-operator", [str(image.python), *image.entrypoint[1:], *args], env=env)
        try:
            ready = f"http://127.0.0.1:{metrics}{container['readinessProbe']['httpGet']['path']}"
            admin.wait(lambda: http_ok(ready), 90, "the installed operator to be ready")

            # Only leaf s3 has two nodes with 6 GPUs free; node0, node2 and node4 each have 6 too, across leaves.
            admin.create_namespace("wheel")
            for node in ("node1", "node3", "node5"):
                admin.create(filler_pod(f"busy-{node}", "wheel", node, 8))
            for node in ("node0", "node2", "node4", "node6", "node7"):
                admin.create(filler_pod(f"some-{node}", "wheel", node, 2))
            admin.bound_pods("wheel", "stormtopo.io/filler=true", 8)
            big = (Role("prefill", gpus=6), Role("decode", gpus=6))
            admin.create(stormservice("img", "wheel", roles=big, annotations={MODE: "hard", HIGHEST_TIER: "1"}))

            group = admin.only(lambda: admin.podgroups("wheel"), "PodGroup", timeout=90)
            assert group["spec"]["networkTopology"] == {"mode": "hard", "highestTierAllowed": 1}
            pods = admin.bound_pods("wheel", "storm-service-name=img", 2, timeout=120)
            nodes = sorted(p["spec"]["nodeName"] for p in pods)
            assert nodes == ["node6", "node7"], nodes
            leaf = topology.lowest_common_switch(nodes)
            assert leaf is not None and leaf.tier == 1
            label = f"{DOMAIN_LABEL_PREFIX}1"  # the leaf, written on each bound pod by the operator

            def labelled() -> bool:
                return all(p["metadata"]["labels"].get(label) == leaf.name for p in admin.pods("wheel", "storm-service-name=img"))

            admin.wait(labelled, 60, f"the pods labelled {label}={leaf.name}")

            def counted() -> bool:  # after the labels and the placement record, which are written first
                with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5) as response:
                    exported = response.read().decode()
                return bool(re.search(r'^stormtopo_replicas_placed_total\{tier="1"\} [1-9]', exported, re.M))

            admin.wait(counted, 30, "the placement counted in stormtopo_replicas_placed_total")
        except Exception:
            print(processes.log_tail(tmp_path, "wheel-operator", 60))
            raise
        finally:
            processes.stop(operator, kill=True)


def _env_value(entry: dict[str, Any], pod_name: str) -> str:
    """A container env entry's value outside a pod: the downward API's pod name is the one field the chart uses."""
    if "value" in entry:
        return str(entry["value"])
    assert entry["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}, entry
    return pod_name
