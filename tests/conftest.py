"""pytest fixtures: one local control plane per test session, one namespace per test.

The cluster runs the user's topology (examples/topology/aibrix-1730.yaml: 8 GPU nodes under s0..s6).
Set STORMTOPO_TEST_STATE_DIR to reuse a cluster you started yourself with `stormtopo dev up`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from stormtopo.core.topology.fabric import parse_topology
from stormtopo.core.topology.tree import Topology

REPO = Path(__file__).resolve().parents[1]
TOPOLOGY_FILE = REPO / "examples" / "topology" / "aibrix-1730.yaml"
# The chart renders only with an image (nothing publishes one): the tests name one, as docs/install.md does.
CHART_IMAGE = "image.repository=registry.example.com/stormtopo"

# The operators the tests start (dev up's, the chart's as installed, restarts) run with shorter periods than
# production's (operator/config.py): the same behaviour, seen sooner. A test that needs another period
# passes its own flag after these (the last one wins). STORMTOPO_OPERATOR_ARGS set outside keeps its value.
TEST_PERIODS = {"resync-seconds": 5.0, "heal-interval": 2.0, "spread-give-up": 30.0, "volcano-recheck-seconds": 5.0, "drain-seconds": 1.0}
os.environ.setdefault("STORMTOPO_OPERATOR_ARGS", " ".join(f"--{flag}={value:g}" for flag, value in TEST_PERIODS.items()))

# `make test` runs two pytest-xdist workers, each with its own session cluster: each keeps to its own slice
# of ports (devenv/processes.py free_port), so two clusters starting at once never pick the same one.
if os.environ.get("PYTEST_XDIST_WORKER", "").startswith("gw") and os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    os.environ["STORMTOPO_PORT_SLICE"] = f"{os.environ['PYTEST_XDIST_WORKER'][2:]}/{os.environ['PYTEST_XDIST_WORKER_COUNT']}"


def stormtopo(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "stormtopo.cli", *args], capture_output=True, text=True, cwd=REPO)
    if check and proc.returncode != 0:
        raise AssertionError(f"stormtopo {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="session")
def topology() -> Topology:
    return parse_topology(TOPOLOGY_FILE.read_text())


@pytest.fixture(scope="session")
def cluster_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    given = os.environ.get("STORMTOPO_TEST_STATE_DIR")
    if given:
        yield Path(given)
        return
    state = tmp_path_factory.mktemp("cluster")
    stormtopo("dev", "up", "--state-dir", str(state), "--topology", str(TOPOLOGY_FILE))
    try:
        yield state
    finally:
        stormtopo("dev", "down", "--state-dir", str(state), check=False)


@pytest.fixture(scope="session")
def cluster(cluster_dir: Path):  # type: ignore[no-untyped-def]
    from stormtopo.devenv.client import DevCluster

    return DevCluster(cluster_dir)


@pytest.fixture
def namespace(cluster) -> Iterator[str]:  # type: ignore[no-untyped-def]
    name = f"t-{uuid.uuid4().hex[:8]}"
    cluster.create_namespace(name)
    yield name
    cluster.delete_namespace(name, wait=120)
