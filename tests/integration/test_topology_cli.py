"""`stormtopo topology apply | from-labels | show` and `stormtopo explain` against real API servers (issue 4)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from stormtopo.core.topology.tree import NodeSpec
from stormtopo.core.vocabulary import HIGHEST_TIER, MODE
from stormtopo.devenv.client import DevCluster
from stormtopo.devenv.nodes import node_manifest
from stormtopo.devenv.workloads import Role, filler_pod, stormservice
from tests.conftest import stormtopo

RACKS = {  # node -> (spine label, leaf label)
    "n0": ("sp-a", "lf-1"),
    "n1": ("sp-a", "lf-1"),
    "n2": ("sp-a", "lf-2"),
    "n3": ("sp-b", "lf-3"),
}


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    """A cluster of its own (no operator): these tests rewrite its HyperNodes."""
    state = tmp_path_factory.mktemp("topo-cli")
    stormtopo("dev", "up", "--state-dir", str(state), "--without-operator")
    try:
        client = DevCluster(state)
        for name, (spine, leaf) in RACKS.items():
            node = node_manifest(NodeSpec(name, leaf, 8, "32", "256Gi"))
            node["metadata"]["labels"] |= {"net.example.com/spine": spine, "net.example.com/leaf": leaf}
            client.create(node)
        yield client
    finally:
        stormtopo("dev", "down", "--state-dir", str(state), check=False)


def cli(cluster: DevCluster, *args: str, check: bool = True):  # type: ignore[no-untyped-def]
    return stormtopo(*args, "--kubeconfig", str(cluster.kubeconfig), check=check)


def tiers(cluster: DevCluster) -> dict[str, int]:
    return {h["metadata"]["name"]: h["spec"]["tier"] for h in cluster.hypernodes()}


def test_from_labels_builds_the_tree_and_apply_replaces_and_prunes_it(bare: DevCluster, tmp_path: Path) -> None:
    dry = cli(bare, "topology", "from-labels", "--levels", "net.example.com/spine,net.example.com/leaf", "--dry-run")
    assert "+ create HyperNode lf-1 (tier 1)" in dry.stdout and "nothing written" in dry.stdout
    assert tiers(bare) == {}
    cli(bare, "topology", "from-labels", "--levels", "net.example.com/spine,net.example.com/leaf")
    assert tiers(bare) == {"lf-1": 1, "lf-2": 1, "lf-3": 1, "sp-a": 2, "sp-b": 2}
    again = cli(bare, "topology", "from-labels", "--levels", "net.example.com/spine,net.example.com/leaf")
    assert "no changes" in again.stdout

    flat = tmp_path / "flat.yaml"
    flat.write_text("switches:\n  rack-x: [n0, n1, n2, n3]\n")
    out = cli(bare, "topology", "apply", "-f", str(flat))
    assert "- delete HyperNode sp-a" in out.stdout
    assert tiers(bare) == {"rack-x": 1}


def test_bad_inputs_name_the_offending_item_and_change_nothing(bare: DevCluster, tmp_path: Path) -> None:
    before = tiers(bare)
    missing = tmp_path / "missing.yaml"
    missing.write_text("switches:\n  top:\n    a: [n0, n1]\n    b: [n2, ghost]\n")
    proc = cli(bare, "topology", "apply", "-f", str(missing), check=False)
    assert proc.returncode == 2 and "ghost (line 4)" in proc.stderr and "nothing was changed" in proc.stderr
    twice = tmp_path / "twice.yaml"
    twice.write_text("switches:\n  a: [n0, n1]\n  b: [n1, n2]\n")
    proc = cli(bare, "topology", "apply", "-f", str(twice), check=False)
    assert proc.returncode == 2 and "line 3: node 'n1' appears twice" in proc.stderr
    proc = cli(bare, "topology", "from-labels", "--levels", "net.example.com/leaf,net.example.com/spine", check=False)
    assert proc.returncode == 2 and "has two parents" in proc.stderr  # upside down: sp-a would sit under lf-1 and lf-2
    assert tiers(bare) == before


def test_show_and_explain_on_a_real_placement(cluster: DevCluster, namespace: str) -> None:
    cluster.create(stormservice("shown", namespace, annotations={MODE: "hard", HIGHEST_TIER: "1"}))
    cluster.bound_pods(namespace, "storm-service-name=shown", 2)
    shown = json.loads(cli(cluster, "topology", "show", "--output", "json").stdout)
    marks = [m for n in shown["nodes"] for m in n["replicas"] if m.startswith(("P ", "D ")) and namespace in m]
    assert len(marks) == 2
    assert {h["name"]: h["tier"] for h in shown["hyperNodes"]}["s6"] == 3
    tree = cli(cluster, "topology", "show").stdout
    assert "s0" in tree and "GPUs free" in tree and f"P {namespace}/shown-roleset" in tree.replace("\n", " ")

    out = cli(cluster, "explain", f"{namespace}/shown").stdout
    assert "hard within tier 1" in out and "placed in s" in out and "(tier 1)" in out


def test_explain_says_why_a_replica_is_pending(cluster: DevCluster, namespace: str) -> None:
    for node in ("node0", "node2", "node4", "node6"):
        cluster.create(filler_pod(f"busy-{node}", namespace, node, 4))
    cluster.bound_pods(namespace, "stormtopo.io/filler=true", 4)
    big = (Role("prefill", gpus=6), Role("decode", gpus=6))
    cluster.create(stormservice("stuck", namespace, roles=big, annotations={MODE: "hard", HIGHEST_TIER: "1"}))
    cluster.wait(lambda: len(cluster.pods(namespace, "storm-service-name=stuck")) == 2, 30, "the stuck replica's pods")
    out = cli(cluster, "explain", f"{namespace}/stuck").stdout
    assert "0/2 pods bound" in out and "cannot be placed now" in out and "would fit within tier 2" in out
    assert cli(cluster, "explain", "nope", check=False).returncode == 2
