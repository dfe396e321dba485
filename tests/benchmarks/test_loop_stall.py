"""The loop-stall benchmark's driver (bench/loop_stall.py): what it measures, on a small cluster (no timing asserted)."""

from __future__ import annotations

from bench import loop_stall


def test_both_runs_drain_every_key_and_report_the_stall_and_the_probe() -> None:
    result = loop_stall.run(40, 2)
    assert result["services"] == 40 and result["rolesets"] == 80
    for run in (result["before"], result["after"]):
        assert run["probes"] > 0 and run["longest_stall_ms"] >= 0 and run["webhook_max_ms"] >= run["webhook_p99_ms"] >= 0
