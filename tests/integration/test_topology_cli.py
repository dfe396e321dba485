"""`stormtopo topology apply | from-labels | show` and `stormtopo explain` against real API servers (issue 4)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from stormtopo.core.topology.tree import NodeSpec
from stormtopo.core.vocabulary import HIGHEST_TIER, MODE, VOLCANO_TOPOLOGY
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


@pytest.fixture
def refusing(bare: DevCluster) -> Iterator[Callable[[str, str], None]]:
    """Installs ValidatingAdmissionPolicies that make the API server refuse a HyperNode by name, as a
    cluster's own policy or webhook might; removes them afterwards."""
    admission = client.AdmissionregistrationV1Api(bare.api_client)
    made: list[str] = []

    def refuse(name: str, expression: str) -> None:
        rule = {"apiGroups": [VOLCANO_TOPOLOGY[0]], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"], "resources": ["hypernodes"]}
        admission.create_validating_admission_policy(
            {
                "metadata": {"name": name},
                "spec": {
                    "failurePolicy": "Fail",
                    "matchConstraints": {"resourceRules": [rule]},
                    "validations": [{"expression": expression, "message": f"refused by policy {name}"}],
                },
            }
        )
        admission.create_validating_admission_policy_binding(
            {"metadata": {"name": name}, "spec": {"policyName": name, "validationActions": ["Deny"]}}
        )
        made.append(name)

    yield refuse
    for name in made:
        for delete in (admission.delete_validating_admission_policy_binding, admission.delete_validating_admission_policy):
            try:
                delete(name)
            except ApiException as exc:
                if exc.status != 404:  # a test may have removed it already
                    raise


def refused(bare: DevCluster, name: str, dry_run: bool) -> bool:
    """Whether the API server now refuses to create HyperNode `name` (a policy takes a moment to apply)."""
    body = {"apiVersion": "/".join(VOLCANO_TOPOLOGY), "kind": "HyperNode", "metadata": {"name": name}}
    body["spec"] = {"tier": 2, "members": [{"type": "HyperNode", "selector": {"exactMatch": {"name": "x"}}}]}
    try:
        bare.custom.create_cluster_custom_object(*VOLCANO_TOPOLOGY, "hypernodes", body, **({"dry_run": "All"} if dry_run else {}))
    except ApiException as exc:
        if exc.status == 422 and "refused by policy" in str(exc.body):
            return True
        raise
    if not dry_run:
        bare.custom.delete_cluster_custom_object(*VOLCANO_TOPOLOGY, "hypernodes", name)
    return False


def test_apply_that_the_server_refuses_part_way_writes_nothing(
    bare: DevCluster, tmp_path: Path, refusing: Callable[[str, str], None]
) -> None:
    start = tmp_path / "start.yaml"
    start.write_text("switches:\n  rack-x: [n0, n1, n2, n3]\n")
    cli(bare, "topology", "apply", "-f", str(start))
    refusing("refuse-sp-refused", "object.metadata.name != 'sp-refused'")
    bare.wait(lambda: refused(bare, "sp-refused", dry_run=True), 30, "the policy to refuse HyperNode sp-refused")

    # Valid to the client; the server refuses the last write: deleting rack-x and the three writes before
    # sp-refused would all have gone through without the dry run.
    fabric = tmp_path / "fabric.yaml"
    fabric.write_text("switches:\n  sp-ok:\n    lf-ok: [n0, n1]\n  sp-refused:\n    lf-r: [n2, n3]\n")
    proc = cli(bare, "topology", "apply", "-f", str(fabric), check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "would refuse to create HyperNode sp-refused: HTTP 422" in proc.stderr
    assert "refused by policy refuse-sp-refused" in proc.stderr and "nothing was written" in proc.stderr
    assert tiers(bare) == {"rack-x": 1}


def test_a_failure_after_the_dry_run_says_what_was_written_and_a_rerun_finishes(
    bare: DevCluster, tmp_path: Path, refusing: Callable[[str, str], None]
) -> None:
    start = tmp_path / "start.yaml"
    start.write_text("switches:\n  rack-x: [n0, n1, n2, n3]\n")
    cli(bare, "topology", "apply", "-f", str(start))
    # Passes every dry run and refuses the real write: the case no dry run can catch (a race, a policy change).
    refusing("refuse-sp-late", "request.dryRun == true || object.metadata.name != 'sp-late'")
    bare.wait(lambda: refused(bare, "sp-late", dry_run=False), 30, "the policy to refuse HyperNode sp-late")

    fabric = tmp_path / "fabric.yaml"
    fabric.write_text("switches:\n  sp-a2:\n    lf-a2: [n0, n1]\n  sp-late:\n    lf-l: [n2, n3]\n")
    proc = cli(bare, "topology", "apply", "-f", str(fabric), check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "create HyperNode sp-late failed: HTTP 422" in proc.stderr and "refused by policy refuse-sp-late" in proc.stderr
    written = "delete HyperNode rack-x, create HyperNode lf-a2, create HyperNode lf-l, create HyperNode sp-a2"
    assert f"written: {written}\n" in proc.stderr and "not written: create HyperNode sp-late\n" in proc.stderr
    assert tiers(bare) == {"lf-a2": 1, "lf-l": 1, "sp-a2": 2}  # exactly what it said it wrote

    client.AdmissionregistrationV1Api(bare.api_client).delete_validating_admission_policy_binding("refuse-sp-late")
    bare.wait(lambda: cli(bare, "topology", "apply", "-f", str(fabric), check=False).returncode == 0, 30, "a rerun to finish")
    assert tiers(bare) == {"lf-a2": 1, "lf-l": 1, "sp-a2": 2, "sp-late": 2}


def test_show_and_explain_on_a_real_placement(cluster: DevCluster, namespace: str) -> None:
    cluster.create(stormservice("shown", namespace, annotations={MODE: "hard", HIGHEST_TIER: "1"}))
    cluster.bound_pods(namespace, "storm-service-name=shown", 2)
    shown = json.loads(cli(cluster, "topology", "show", "--output", "json").stdout)
    marks = [m for n in shown["nodes"] for m in n["replicas"] if m.startswith(("P ", "D ")) and namespace in m]
    assert len(marks) == 2
    assert {h["name"]: h["tier"] for h in shown["hyperNodes"]}["s6"] == 3
    tree = cli(cluster, "topology", "show").stdout
    # The prefill mark and its replica; the terminal may wrap between them, inside the tree's guides.
    assert "s0" in tree and "GPUs free" in tree and re.search(r"\bP\b[\s│]*" + re.escape(f"{namespace}/shown-roleset"), tree), tree

    out = cli(cluster, "explain", f"{namespace}/shown").stdout
    assert "hard within tier 1" in out and "placed in s" in out and "(tier 1)" in out


def test_explain_says_why_a_replica_is_pending(cluster: DevCluster, namespace: str) -> None:
    for node in ("node0", "node2", "node4", "node6"):
        cluster.create(filler_pod(f"busy-{node}", namespace, node, 4))
    cluster.bound_pods(namespace, "stormtopo.io/filler=true", 4)
    big = (Role("prefill", gpus=6), Role("decode", gpus=6))
    cluster.create(stormservice("stuck", namespace, roles=big, annotations={MODE: "hard", HIGHEST_TIER: "1"}))
    cluster.wait(lambda: len(cluster.pods(namespace, "storm-service-name=stuck")) == 2, 90, "the stuck replica's pods")
    out = cli(cluster, "explain", f"{namespace}/stuck").stdout
    assert "0/2 pods bound" in out and "cannot be placed now" in out and "would fit within tier 2" in out
    assert cli(cluster, "explain", "ns/", check=False).returncode == 2  # not NAMESPACE/NAME
    missing = cli(cluster, "explain", "nope", check=False)  # a bare name: kubectl's default namespace
    assert missing.returncode == 1 and "StormService default/nope not found" in missing.stderr
