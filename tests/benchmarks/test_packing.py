"""The packing bench's node-level figure (pure: over a result as the run writes it)."""

from __future__ import annotations

from bench.packing import one_node_where_one_fits, packing_vs_optimal


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
