"""Day one (issue 14, item 5): the operator starts before Volcano's HyperNode CRD exists, keeps serving
the webhook, and uses HyperNodes once the CRD and the switch tree are installed, without a restart."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from stormtopo.core.topology.fabric import parse_topology
from stormtopo.core.topology.hypernodes import hypernode_manifests
from stormtopo.core.vocabulary import HIGHEST_TIER, MODE
from stormtopo.devenv import cluster as dev
from stormtopo.devenv import processes
from stormtopo.devenv.client import DevCluster
from stormtopo.devenv.crds import crd_files
from stormtopo.devenv.workloads import stormservice
from tests.conftest import TOPOLOGY_FILE, stormtopo


@pytest.fixture(scope="module")
def without_volcano_topology(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    state = tmp_path_factory.mktemp("day-one")
    stormtopo("dev", "up", "--state-dir", str(state), "--topology", str(TOPOLOGY_FILE), "--without-operator")
    try:
        yield state
    finally:
        stormtopo("dev", "down", "--state-dir", str(state), check=False)


def _kubectl(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(state / "bin" / "kubectl"), *args], capture_output=True, text=True)


@pytest.mark.timeout(400)
def test_operator_starts_without_the_hypernode_crd_and_uses_it_once_installed(without_volcano_topology: Path) -> None:
    state = without_volcano_topology
    admin = DevCluster(state)
    [hypernode_crd] = [f for f in crd_files() if "hypernodes" in f.name]
    deleted = _kubectl(state, "delete", "-f", str(hypernode_crd), "--wait=true")
    assert deleted.returncode == 0, deleted.stderr
    admin.wait(lambda: _kubectl(state, "get", "hypernodes").returncode != 0, 60, "the HyperNode API to be gone")

    operator = dev.start_operator(state, timeout=120)  # waits for /readyz: it would crash-loop before
    log = state / "logs" / "operator.log"
    assert "HyperNode CRD (topology.volcano.sh) not installed" in log.read_text()

    # The webhook serves: AIBrix's PodGroup of an opted-in StormService is admitted and completed.
    admin.create_namespace("day-one")
    admin.create(stormservice("early", "day-one", annotations={MODE: "soft", HIGHEST_TIER: "1"}))
    group = admin.only(lambda: admin.podgroups("day-one"), "PodGroup", timeout=90)
    assert group["spec"]["networkTopology"]["mode"] == "soft"

    # Volcano's HyperNodes arrive later; the running operator uses them: a tier deeper than any
    # HyperNode is now refused with an Event (it could not know the tiers before).
    applied = _kubectl(state, "apply", "--server-side", "-f", str(hypernode_crd))
    assert applied.returncode == 0, applied.stderr
    _kubectl(state, "wait", "--for=condition=Established", "--timeout=60s", "crd/hypernodes.topology.volcano.sh")
    manifests = yaml.safe_dump_all(hypernode_manifests(parse_topology(TOPOLOGY_FILE.read_text())))
    created = subprocess.run(
        [str(state / "bin" / "kubectl"), "apply", "--server-side", "-f", "-"], input=manifests, capture_output=True, text=True
    )
    assert created.returncode == 0, created.stderr
    admin.create(stormservice("deep", "day-one", annotations={MODE: "hard", HIGHEST_TIER: "9"}))

    def refused() -> bool:
        return any("deeper than any HyperNode" in (e.get("message") or "") for e in admin.events("day-one", "deep"))

    admin.wait(refused, 150, "the operator to learn the HyperNodes and refuse tier 9")
    assert operator.alive(), processes.log_tail(state, "operator")
