"""The loop-stall benchmark's driver (bench/loop_stall.py): what it measures, on a small cluster (no timing asserted)."""

from __future__ import annotations

from bench import loop_stall


def test_both_runs_drain_every_key_and_report_the_stall_and_the_probe() -> None:
    result = loop_stall.run(40, 2)
    assert result["services"] == 40 and result["rolesets"] == 80
    for run in (result["before"], result["after"]):
        assert run["probes"] > 0 and run["longest_stall_ms"] >= 0 and run["webhook_max_ms"] >= run["webhook_p99_ms"] >= 0


def test_the_longest_lag_is_read_from_two_reads_of_the_histogram() -> None:
    bounds = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, float("inf"))
    before = {b: 10.0 for b in bounds}
    quiet = {b: 15.0 for b in bounds}  # five looks, each under 1 ms
    assert loop_stall._longest_lag(before, quiet) == (0.0, 1.0, 0)
    stalled = {b: 15.0 + (2 if b >= 0.1 else 0) for b in bounds}  # and two between 50 and 100 ms
    assert loop_stall._longest_lag(before, stalled) == (50.0, 100.0, 2)
