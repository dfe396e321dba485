"""The scale simulator's results (bench/sim.py), one record a case, layout and setting, as its Go test writes them."""

from __future__ import annotations

from typing import Any


def sim_record(layout: str, seconds: float, one_node: int, used_leaves: int) -> dict[str, Any]:
    """What the Go test reports of one case, layout and setting: four gangs of `seconds` each, `one_node` of
    them on one node, on `used_leaves` leaves."""
    gangs = [
        {"allocate_s": seconds, "one_node": i < one_node, "one_leaf": True, "placed": True, "fits_node": True, "hypernodes": 5}
        for i in range(4)
    ]
    return {
        "case": "64-empty",
        "nodes": 64,
        "start": "empty",
        "layout": layout,
        "setting": "shipped",
        "gangs": gangs,
        "normal_allocate_s": [seconds / 2],
        "normal_placed": 1,
        "normal_opened_nodes": 0,
        "used_nodes": 4,
        "used_leaves": used_leaves,
        "optimum": {
            "one_node_greedy": 4,
            "used_nodes_greedy": 4,
            "used_nodes_lower": 4,
            "used_leaves_greedy": 1,
            "used_leaves_lower": 1,
            "exact": True,
        },
    }
