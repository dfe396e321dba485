"""A replaced pod of a placed replica (issue 21): Volcano places it around the replica's running pods,
so a re-created decode returns within its prefill's leaf always, and with `stormtopo.io/prefer-same-node`
to its prefill's node where that node has room (the KV cache then moves over NVLink)."""

from __future__ import annotations

from typing import Any

import pytest

from stormtopo.core.topology.tree import Topology
from stormtopo.core.vocabulary import HIGHEST_TIER, MODE, PREFER_SAME_NODE
from stormtopo.devenv.client import DevCluster
from stormtopo.devenv.workloads import Role, stormservice

PAIR = (Role("prefill", gpus=2), Role("decode", gpus=2))


@pytest.mark.parametrize("same_node", [True, False], ids=["prefer-same-node", "leaf-only"])
def test_a_replaced_decode_returns_to_its_prefills_node_or_at_least_its_leaf(
    cluster: DevCluster, topology: Topology, namespace: str, same_node: bool
) -> None:
    name = f"again-{int(same_node)}-{namespace}"
    annotations = {MODE: "hard", HIGHEST_TIER: "1", **({PREFER_SAME_NODE: "true"} if same_node else {})}
    cluster.create(stormservice(name, namespace, roles=PAIR, annotations=annotations))
    pods = cluster.bound_pods(namespace, f"storm-service-name={name}", 2, timeout=120)
    prefill = next(p for p in pods if p["metadata"]["labels"]["role-name"] == "prefill")
    decode = next(p for p in pods if p["metadata"]["labels"]["role-name"] == "decode")
    cluster.core.delete_namespaced_pod(decode["metadata"]["name"], namespace, grace_period_seconds=0)

    def replaced() -> list[dict[str, Any]]:
        now = cluster.pods(namespace, f"storm-service-name={name},role-name=decode")
        return [p for p in now if p["metadata"]["uid"] != decode["metadata"]["uid"] and p["spec"].get("nodeName")]

    (new,) = cluster.wait(replaced, 120, "the re-created decode bound")
    at, home = new["spec"]["nodeName"], prefill["spec"]["nodeName"]
    leaf = topology.lowest_common_switch([home])
    assert leaf is not None and at in topology.nodes_under(leaf.name), (at, home)  # within the prefill's leaf, always
    if same_node:
        free, _ = cluster.gpu_capacity()
        # The prefill's node had room for it (8 GPUs, the prefill's 2, and the decode's 2 if it is back there).
        assert at == home or free.get(home, 0) < 2, (at, home, free)
