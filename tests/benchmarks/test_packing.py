"""The packing bench's node-level figure (pure: over a result as the run writes it)."""

from __future__ import annotations

from bench.packing import kv_time_vs_node_optimal, one_node_where_one_fits, packing_vs_optimal
from stormtopo.kvtransfer import parse_kv_model

KV = parse_kv_model(
    {
        "tiers": {0: {"bandwidth_gbps": 400, "latency_us": 0}, 1: {"bandwidth_gbps": 50, "latency_us": 0}},
        "kv_bytes_per_token": 1,
        "prompt_tokens": 400,
    }
)


def result(empty: tuple[int, int, int, int], fragmented: tuple[int, int, int, int]) -> dict[str, object]:
    """(optimum, within tier before the first miss, fit one node, on one node) per start."""

    def start(optimum: int, within: int, fit: int, one: int) -> dict[str, object]:
        mode = {"within_tier1_before_first_miss": within, "fit_one_node": fit, "on_one_node": one}
        return {"optimum": {"replicas": optimum}, "modes": {"hard": mode}}

    return {"empty": start(*empty), "fragmented": start(*fragmented)}


def test_both_starts_are_summed() -> None:
    out = result((55, 55, 41, 41), (24, 22, 18, 15))
    assert packing_vs_optimal(out, "hard") == round(77 / 79, 4)
    assert one_node_where_one_fits(out, "hard") == round(56 / 59, 4)


def test_nothing_that_fits_one_node_is_no_figure() -> None:
    assert one_node_where_one_fits(result((1, 1, 0, 0), (1, 0, 0, 0)), "hard") is None


def test_kv_time_counts_the_replicas_before_the_first_miss_against_one_node_where_one_fit() -> None:
    # Tier 0 takes 1 ns a byte here, tier 1 8 ns: one replica on one node, one that fit one node placed
    # across two (8 against 1), one that fit no node within its leaf (8 against 8); the replica after
    # the first miss is not counted.
    def start(replicas: list[tuple[int, bool]], within: int) -> dict[str, object]:
        placed = [{"tier": tier, "fits_one_node": fits} for tier, fits in replicas]
        return {"modes": {"hard": {"replicas": placed, "within_tier1_before_first_miss": within}}}

    out = {"empty": start([(0, True), (1, True)], 2), "fragmented": start([(1, False), (2, True)], 1)}
    assert kv_time_vs_node_optimal(out, "hard", KV) == round((1 + 8 + 8) / (1 + 1 + 8), 4)
