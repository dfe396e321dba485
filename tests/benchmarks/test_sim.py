"""The scale simulator's driver (bench/sim.py): the spec it hands the Go test, and how it reduces the results."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench import sim
from bench.fabric import fragmentation
from bench.packing import arrivals
from stormtopo.devenv import cluster
from tests.benchmarks.sim_results import sim_record


def test_the_spec_carries_the_shipped_conf_the_packing_stream_and_the_fragmentation(tmp_path: Path) -> None:
    spec = sim.spec({64: (5, 2, ("leaf", "node-bucket"))}, ["empty", "fragmented"], ["shipped", "normal-pod-off"], tmp_path / "out")
    assert spec["scheduler_conf"] == cluster.SCHEDULER_CONF
    assert [s["name"] for s in spec["settings"]] == ["shipped", "normal-pod-off"]
    assert spec["settings"][1]["args"] == {"hypernode.binpack.normal-pod.enable": False}
    empty, fragmented = spec["cases"]
    assert empty["init_used"] == [0] * 64
    used = fragmentation([f"node-{i:05d}" for i in range(64)], seed=sim.FRAGMENTATION_SEED)
    assert fragmented["init_used"] == [used.get(f"node-{i:05d}", 0) for i in range(64)]
    assert [g["pods"] for g in empty["gangs"]] == [list(a.pod_gpus) for a in arrivals(5, seed=sim.STREAM_SEED)]
    assert len(empty["normal"]) == 2 and all(g["name"].startswith("plain-") for g in empty["normal"])
    assert empty["layouts"] == ["leaf", "node-bucket"] and empty["batch"] == 1


def test_rows_are_ratios_against_leaf_only_in_the_same_case() -> None:
    rows = sim.summarise([sim_record("leaf", 0.1, 2, 1), sim_record("node-all", 0.4, 4, 2)])
    leaf, node_all = rows
    assert (leaf["node_level"], leaf["packing"], leaf["allocate_vs_leaf"]) == (0.5, 1.0, 1.0)
    assert (node_all["node_level"], node_all["packing"], node_all["allocate_vs_leaf"], node_all["plain_vs_leaf"]) == (1.0, 0.5, 4.0, 4.0)
    assert node_all["allocate_vs_leaf_multi_node"] is None  # no replica of the stream needed more than a node
    table = sim.table(rows)
    assert "| 64 | empty | shipped | node-all | 4/4 | 4/4 | 1.0 |" in table


def test_sizes_default_and_override() -> None:
    assert sim._sizes(None) == sim.DEFAULT_SIZES
    assert sim._sizes("1024=8,128") == {1024: (8, 32, sim.LAYOUTS), 128: (16, 4, sim.LAYOUTS)}


def test_the_packing_spec_is_the_full_packing_run_per_seed_and_rule(tmp_path: Path) -> None:
    spec = sim.packing_spec([29, 30], ["", "fewest"], tmp_path / "out", replicas=5)
    names = [c["name"] for c in spec["cases"]]
    assert names[:4] == ["29/empty/shipped", "29/empty/fewest", "29/fragmented/shipped", "29/fragmented/fewest"] and len(names) == 8
    first = spec["cases"][0]
    assert (first["nodes"], first["leaf_size"], first["leaves_per_spine"]) == (64, 8, 8)
    assert first["layouts"] == ["leaf", "node-bucket"] and spec["cases"][1]["layouts"] == ["node-bucket"]
    assert [g["pods"] for g in first["gangs"]] == [list(a.pod_gpus) for a in arrivals(5, seed=29)]
    assert spec["cases"][1]["opening"] == "fewest" and first["opening"] == ""


def test_packing_rows_count_up_to_the_first_replica_not_within_its_leaf() -> None:
    def gang(placed: bool, one_leaf: bool, one_node: bool, fits: bool) -> dict[str, Any]:
        return {"placed": placed, "one_leaf": one_leaf, "one_node": one_node, "fits_free_node": fits}

    gangs = [gang(True, True, True, True), gang(True, True, False, True), gang(True, True, False, False), gang(False, False, False, True)]
    gangs.append(gang(True, True, True, True))  # after the first miss: not counted
    rows = sim.packing_rows([{"case": "29/fragmented/shipped", "layout": "node-bucket", "gangs": gangs, "list_changes": 10}])
    assert rows == [
        {
            "seed": 29,
            "start": "fragmented",
            "rule": "shipped",
            "before_first_wait": 3,
            "one_node_where_one_fits": 0.5,
            "list_changes_per_replica": 2.0,
        }
    ]


def test_repeated_packing_cases_are_numbered_and_read_back_as_one(tmp_path: Path) -> None:
    spec = sim.packing_spec([29], [""], tmp_path / "out", replicas=2, repeats=2)
    assert [c["name"] for c in spec["cases"]] == [
        "29/empty/shipped#0",
        "29/fragmented/shipped#0",
        "29/empty/shipped#1",
        "29/fragmented/shipped#1",
    ]
    rows = sim.packing_rows([{"case": "29/empty/shipped#1", "layout": "leaf", "gangs": []}])
    assert rows[0]["seed"] == 29 and rows[0]["rule"] == "leaf only" and rows[0]["before_first_wait"] == 0
