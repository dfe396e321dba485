"""Whether a replica's pods could run on a node at all, GPUs aside (issue 34, item 4): taints and
tolerations, nodeSelector, required node affinity, and every other resource requested."""

from __future__ import annotations

from typing import Any

from stormtopo.core.node_fit import NodeFacts, milli, nodes_for, pod_requests, why_not

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def spec(**extra: Any) -> dict[str, Any]:
    requests = extra.pop("requests", {"nvidia.com/gpu": "8", "cpu": "4", "memory": "64Gi"})
    return {"containers": [{"name": "c", "resources": {"requests": requests}}], **extra}


def node(labels: dict[str, str] | None = None, taints: tuple[dict[str, str], ...] = (), **left: str) -> NodeFacts:
    have = {"cpu": "64", "memory": "512Gi", **left}
    return NodeFacts(labels or {}, taints, {r: milli(v) for r, v in have.items()})


def test_quantities_in_thousandths() -> None:
    assert milli("500m") == 500 and milli("2") == 2000 and milli("1Gi") == 1024**3 * 1000 and milli("x") == 0
    init = {"containers": [{"resources": {"requests": {"cpu": "1"}}}, {"resources": {"requests": {"cpu": "500m"}}}]}
    init["initContainers"] = [{"resources": {"requests": {"cpu": "2", "memory": "1Gi"}}}]
    assert pod_requests(init) == {"cpu": 2000, "memory": milli("1Gi")}  # an init container runs alone: the larger


def test_a_taint_needs_a_toleration() -> None:
    tainted = node(taints=(GPU_TAINT,))
    assert "not tolerated" in why_not(spec(), "n", tainted)
    assert why_not(spec(tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}]), "n", tainted) == ""
    assert why_not(spec(tolerations=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]), "n", tainted) == ""
    assert why_not(spec(tolerations=[{"operator": "Exists"}]), "n", tainted) == ""  # tolerates everything
    assert "not tolerated" in why_not(
        spec(tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}]), "n", tainted
    )
    soft = node(taints=({"key": "k", "value": "v", "effect": "PreferNoSchedule"},))
    assert why_not(spec(), "n", soft) == ""  # a preference only


def test_selector_and_required_affinity() -> None:
    a100 = node({"gpu": "a100", "rack": "3"})
    assert why_not(spec(nodeSelector={"gpu": "a100"}), "n", a100) == ""
    assert "nodeSelector" in why_not(spec(nodeSelector={"gpu": "h100"}), "n", a100)
    term = {"matchExpressions": [{"key": "rack", "operator": "Gt", "values": ["2"]}, {"key": "gpu", "operator": "NotIn", "values": ["t4"]}]}
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}
    assert why_not(spec(affinity=affinity), "n", a100) == ""
    assert why_not(spec(affinity=affinity), "n", node({"gpu": "a100", "rack": "1"})) == "required node affinity"
    by_name = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n7"]}]}
    named = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [by_name]}}}
    assert why_not(spec(affinity=named), "n7", a100) == "" and why_not(spec(affinity=named), "n8", a100) != ""


def test_every_other_resource_must_be_left_counting_what_the_replica_frees() -> None:
    rdma = spec(requests={"nvidia.com/gpu": "8", "rdma/hca": "1", "cpu": "4"})
    assert "rdma/hca" in why_not(rdma, "n", node())  # the node has no RDMA device at all
    assert why_not(rdma, "n", node(**{"rdma/hca": "1"})) == ""
    full_cpu = node(cpu="2")
    assert "cpu" in why_not(spec(), "n", full_cpu)
    assert why_not(spec(), "n", full_cpu, freed={"cpu": 2000}) == ""  # its own pod there leaves
    assert why_not(spec(requests={"nvidia.com/gpu": "8"}), "n", node(cpu="0")) == ""  # GPUs are the packing's


def test_a_node_counts_only_if_every_pod_of_the_replica_could_run_there() -> None:
    nodes = {"tainted": node(taints=(GPU_TAINT,)), "plain": node(), "small": node(cpu="1")}
    tolerant = spec(tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}])
    assert nodes_for([tolerant, tolerant], nodes) == {"tainted", "plain"}
    assert nodes_for([tolerant, spec()], nodes) == {"plain"}  # the decode pod does not tolerate the taint
    assert nodes_for([tolerant], nodes, freed={"small": {"cpu": 4000}}) == {"tainted", "plain", "small"}


def test_stormtopos_own_pins_by_node_are_not_where_the_pods_could_run() -> None:
    from stormtopo.core.node_fit import without_pins

    pin = {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n0"]}
    zone = {"key": "zone", "operator": "In", "values": ["a"]}
    terms = [{"matchExpressions": [zone, pin]}]
    narrowed = without_pins(
        spec(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}})
    )
    assert why_not(narrowed, "n9", node({"zone": "a"})) == ""  # the pin is gone, the user's zone stays
    assert why_not(narrowed, "n9", node({"zone": "b"})) == "required node affinity"
    by_name = [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n0"]}]}]
    only_pins = without_pins(
        spec(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": by_name}}})
    )
    assert why_not(only_pins, "n9", node()) == ""
