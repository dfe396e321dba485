"""`python -m bench`: one entry point, a subcommand per benchmark, the flag forms of before as aliases, every
results file stamped with its command, commit, machine and versions; bench-quick's last line (pure: no cluster)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import cli, record, sim, suite
from tests.benchmarks.sim_results import sim_record

SUBCOMMANDS = {
    "quick",
    "full",
    "large",
    "expressions",
    "scale",
    "admission",
    "preemption",
    "loop-stall",
    "room-stall",
    "node-tier-stall",
    "collector",
    "optin-creates",
    "memory",
    "uninstall",
    "scale-nodes",
    "foreign-pods",
    "heal",
    "heal-rescore",
    "packing",
    "node-tier",
    "idle",
    "idle-lists",
    "kvflow",
    "hindsight",
    "sim",
    "sim-packing",
    "spread",
}

# make bench-quick's last line: exactly these keys (BENCHMARKS.md, issue 36's contract).
QUICK_KEYS = [
    "hard_tier1_fraction",
    "baseline_tier1_fraction",
    "hard_kv_time_vs_optimal",
    "baseline_kv_time_vs_optimal",
    "hard_kv_time_vs_node_optimal",
    "podgroup_ready_vs_first_pod",
    "webhook_p99_ratio",
    "webhook_p50_ratio",
    "pending_podgroup_writes_vs_baseline",
    "packing_vs_optimal",
    "baseline_packing_vs_optimal",
    "diy_packing_vs_optimal",
    "node_tier_hard_kv_time_vs_node_optimal",
    "node_tier_packing_vs_optimal",
    "node_tier_packing_one_node_where_one_fits",
    "node_tier_hard_tier1_fraction",
    "nodes",
    "seconds",
]


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ([], ["full"]),
        (["--quick"], ["quick"]),
        (["--quick", "--node-tier"], ["quick", "--node-tier"]),
        (["--node-tier"], ["full", "--node-tier"]),
        (["--large"], ["large"]),
        (["--expressions"], ["expressions"]),
        (["--admission"], ["admission"]),
        (["--scale-nodes"], ["scale-nodes"]),
        (["--scale", "1000"], ["scale", "--services", "1000"]),
        (["--scale=500"], ["scale", "--services", "500"]),
        (["--foreign-pods", "--operator-source", "/tmp/x"], ["foreign-pods", "--operator-source", "/tmp/x"]),
        (["--heal"], ["heal"]),
        (["--heal", "--quick", "--seed", "24", "--factor", "20"], ["heal", "--quick", "--seed", "24", "--factor", "20"]),
        (["--sim"], ["sim"]),
        (["sim", "--nodes", "1024=8"], ["sim", "--nodes", "1024=8"]),
        (["--help"], ["--help"]),
    ],
)
def test_the_flag_forms_of_before_are_subcommands(old: list[str], new: list[str]) -> None:
    assert cli.canonical(old) == new


def test_every_subcommand_parses_with_its_defaults() -> None:
    parser = cli.build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command")
    assert set(subparsers.choices) == SUBCOMMANDS  # type: ignore[arg-type]
    for name in SUBCOMMANDS - {"heal-rescore"}:
        args = parser.parse_args([name])
        assert callable(args.run) and args.name is None
    heal = parser.parse_args(cli.canonical(["--heal", "--quick", "--seed", "24"]))
    assert (heal.size, heal.seed, heal.factor, heal.make_room, heal.node_tier) == ("quick", 24, None, False, False)
    assert parser.parse_args(["heal"]).size == "full"
    assert parser.parse_args(["packing", "--quick"]).size == "quick"


def test_seeds_are_written_one_way_everywhere() -> None:
    assert cli.seeds("29") == [29]
    assert cli.seeds("29-32") == [29, 30, 31, 32]
    assert cli.seeds("29,31-32") == [29, 31, 32]
    parser = cli.build_parser()
    assert parser.parse_args(["hindsight", "--seed", "29-30"]).seed == [29, 30]
    assert parser.parse_args(["sim-packing"]).seed == list(range(29, 41))
    with pytest.raises(SystemExit):
        parser.parse_args(["heal", "--seed", "23-24"])  # a churn run takes one stream
    with pytest.raises(SystemExit):
        parser.parse_args(["hindsight", "--seed", "x"])


def _placement(tier1: float) -> dict[str, Any]:
    return {"tier1_fraction": tier1, "kv_time_vs_optimal": 1.0, "kv_time_vs_node_optimal": 1.21}


def _quick_result() -> dict[str, Any]:
    """What the quick run returns, with made-up figures."""
    packing = {"packing_vs_optimal": 1.0, "baseline_packing_vs_optimal": 0.28, "diy_packing_vs_optimal": 0.36}
    return {
        "placement": {"hard": _placement(1.0), "baseline": _placement(0.4)},
        "critical_path": {"ratio_median": 0.8},
        "webhook": {"p99_ratio": 1.4, "p50_ratio": 1.5},
        "churn": {"ratio": 0.0},
        "packing": packing,
        "node_tier": {"placement": {"hard": _placement(1.0)}, "packing": {**packing, "one_node_where_one_fits": 0.95}},
        "nodes": 16,
        "seconds": 180.0,
    }


def test_bench_quick_prints_exactly_its_keys() -> None:
    out = _quick_result()
    assert list(suite.headline(out)) == QUICK_KEYS
    without_node_tier = {k: v for k, v in out.items() if k != "node_tier"}  # quick --node-tier: no second phase
    assert list(suite.headline(without_node_tier)) == [k for k in QUICK_KEYS if not k.startswith("node_tier_")]


def test_make_bench_quick_ends_with_one_json_object(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`python -m bench --quick` (make bench-quick) end to end, the cluster's run replaced by its result."""
    out = {"quick": True, **_quick_result()}
    monkeypatch.setattr(record, "RESULTS", tmp_path)
    monkeypatch.setattr(suite, "run", lambda quick, large=False, node_tier=False: dict(out))
    assert cli.main(["--quick"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert list(json.loads(last)) == QUICK_KEYS
    assert json.loads((tmp_path / "quick.json").read_text())["command"] == "python -m bench quick"


def test_a_result_starts_with_its_command_commit_machine_and_versions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(record, "RESULTS", tmp_path)
    path = record.write("x", "python -m bench quick", {"nodes": 16})
    written = json.loads(path.read_text())
    assert list(written)[:6] == ["command", "commit", "dirty", "machine", "versions", "nodes"]
    assert written["command"] == "python -m bench quick"
    assert written["machine"]["cores"] >= 1 and written["machine"]["memory_gib"] > 0
    assert {"kubernetes", "volcano", "aibrix", "kwok"} <= set(written["versions"])
    assert written["versions"]["kubernetes"].startswith("v1.")


def test_sim_writes_its_rows_stamped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulator's subcommand end to end, the Go test replaced by two records."""
    monkeypatch.setattr(record, "RESULTS", tmp_path)
    monkeypatch.setattr(sim, "run", lambda *args: [sim_record("leaf", 0.1, 2, 1), sim_record("node-bucket", 0.02, 4, 1)])
    assert cli.main(["--sim"]) == 0  # the flag form of before
    written = json.loads((tmp_path / "sim.json").read_text())
    assert written["command"] == "python -m bench sim"
    assert [r["layout"] for r in written["rows"]] == ["leaf", "node-bucket"]
    assert "node-bucket" in (tmp_path / "sim.md").read_text()


def test_no_bench_module_imports_the_entry_point() -> None:
    """The cycle there was (bench.sim imported bench.__main__ for its machine record); .importlinter's
    bench-acyclic contract checks every module, this the one that was."""
    import grimp

    graph = grimp.build_graph("bench")
    for module in graph.modules:
        if module.startswith("bench.") and module not in ("bench.__main__", "bench.cli"):
            assert not graph.chain_exists(importer=module, imported="bench.cli"), module
            assert not graph.chain_exists(importer=module, imported="bench.__main__"), module
