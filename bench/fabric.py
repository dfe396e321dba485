"""Synthetic 3-tier fabrics and a realistic fragmentation of them, for the benchmarks (seeded)."""

from __future__ import annotations

import random

import yaml


def fabric_yaml(spines: int, leaves_per_spine: int, nodes_per_leaf: int, gpus: int = 8) -> str:
    """A description (stormtopo's topology format): core -> spines -> leaves -> nodes."""
    tree: dict[str, object] = {}
    n = 0
    for s in range(spines):
        leaves: dict[str, list[str]] = {}
        for leaf in range(leaves_per_spine):
            leaves[f"leaf-{s}-{leaf}"] = [f"gpu-{n + i:04d}" for i in range(nodes_per_leaf)]
            n += nodes_per_leaf
        tree[f"spine-{s}"] = leaves
    return yaml.safe_dump(
        {"tierNames": {1: "leaf", 2: "spine", 3: "core"}, "nodeDefaults": {"gpus": gpus}, "switches": {"core": tree}}, sort_keys=False
    )


def fragmentation(nodes: list[str], seed: int, gpus: int = 8) -> dict[str, int]:
    """GPUs already in use per node: mostly busy, unevenly, as a cluster looks after hours of churn."""
    rng = random.Random(seed)
    used = {}
    for node in nodes:
        u = rng.choices([0, 2, 4, 6, 7, 8], weights=[2, 1, 2, 2, 2, 3])[0]
        if u:
            used[node] = min(u, gpus)
    return used
