"""The healing benchmark's pure parts: the churn stream, the within-leaf optimum, and the integrals over samples."""

from __future__ import annotations

import json

import pytest

from bench.healing import Sample, Service, churn, epochs, most_moves_in_an_hour, summarize, within_leaf_optimum


def test_the_stream_is_seeded_and_keeps_about_the_starting_population() -> None:
    stream = churn(live=40, lifetime=3600.0, duration=4 * 3600.0, seed=3)
    assert stream == churn(live=40, lifetime=3600.0, duration=4 * 3600.0, seed=3)
    assert sum(1 for s in stream if s.arrive == 0) == 40
    assert all(s.leave > s.arrive for s in stream)
    spans = epochs(stream, 4 * 3600.0)
    mean = sum(len(alive) * (b - a) for a, b, alive in spans) / (4 * 3600.0)
    assert 25 < mean < 55  # Poisson arrivals at live / lifetime: about `live` at any time


def test_epochs_cut_at_every_arrival_and_departure() -> None:
    stream = [Service("a", "1P1D-1", 0.0, 50.0), Service("b", "1P1D-1", 20.0, 200.0)]
    assert [(a, b, [s.name for s in alive]) for a, b, alive in epochs(stream, 100.0)] == [
        (0.0, 20.0, ["a"]),
        (20.0, 50.0, ["a", "b"]),
        (50.0, 100.0, ["b"]),
    ]


def test_the_optimum_is_every_replica_when_all_fit_each_within_a_leaf() -> None:
    leaves = ((8, 8), (4, 4))
    bound = within_leaf_optimum(leaves, [(8, 8), (4, 4)])
    assert (bound.replicas, bound.exact) == (2, True)


def test_the_optimum_counts_gpus_that_no_single_leaf_offers_as_unusable() -> None:
    # 16 free GPUs in all, but no leaf holds an 8+8 replica: only the two small ones fit.
    leaves = ((8,), (8,))
    bound = within_leaf_optimum(leaves, [(8, 8), (4, 4), (2, 2)])
    assert bound.lower == 2 and bound.replicas == 2 and bound.exact


def test_the_optimum_counts_replicas_by_how_they_pack_not_by_gpus() -> None:
    # Two 6-GPU nodes, one leaf each: a leaf of one 6-GPU node holds one 4+2 replica: both fit. Three 2+2
    # are 12 GPUs, as many as the nodes have, but a node of 6 holds one 2+2 with 2 left: only two fit.
    assert within_leaf_optimum(((6,), (6,)), [(4, 2), (4, 2)]).replicas == 2
    bound = within_leaf_optimum(((6,), (6,)), [(2, 2), (2, 2), (2, 2)])
    assert (bound.replicas, bound.exact) == (2, True)


def test_replicas_of_whole_node_pods_are_bounded_by_the_wholly_free_nodes() -> None:
    # 52 free GPUs hold the four replicas' 40 by count, and each 8+8 fits leaf 0 alone; but only leaf 0
    # has two wholly free nodes, so only one 8+8 fits at once: the optimum is 3, and now known exactly.
    bound = within_leaf_optimum(((8, 8, 6, 6), (6, 6, 6, 6)), [(8, 8), (8, 8), (2, 2), (2, 2)])
    assert (bound.replicas, bound.lower, bound.exact) == (3, 3, True)


def test_a_compact_sample_summarizes_as_the_sample() -> None:
    from bench.healing import compact, expand

    stream = {"a": Service("a", "1P1D-1", 0.0, 1000.0)}
    samples = [Sample(0.0, {"a": _replica(2, True, ["p1-long-uid", "d1-long-uid"])}), Sample(10.0, {"a": _replica(1, True, ["p2", "d2"])})]
    samples.append(Sample(20.0, {}))
    again = [expand(json.loads(json.dumps(compact(s)))) for s in samples]
    assert summarize(again, stream) == summarize(samples, stream)


def _replica(tier: int | None, ready: bool, uids: list[str]) -> dict[str, object]:
    return {"tier": tier, "ready": ready, "uids": uids, "pods": []}


def test_samples_integrate_tier_time_moves_and_unavailability() -> None:
    stream = {"a": Service("a", "1P1D-1", 0.0, 1000.0), "b": Service("b", "1P1D-1", 0.0, 25.0)}
    samples = [
        Sample(0.0, {"a": _replica(2, True, ["p1", "d1"]), "b": _replica(1, True, ["x", "y"])}),
        Sample(10.0, {"a": _replica(None, False, [])}),  # a's pods evicted: not bound, not ready; b gone from the sample
        Sample(20.0, {"a": _replica(1, True, ["p2", "d2"])}),  # a back, within one leaf, on new pods: a move
        Sample(30.0, {"a": _replica(1, True, ["p2", "d2"])}),  # b left at 25: from here it no longer exists
        Sample(40.0, {}),
    ]
    out = summarize(samples, stream, optimum=lambda t: 1 if t < 5 else 2)
    assert out.replica_seconds == pytest.approx(40 + 30)  # a over 0..40, b over 0..30 (sampled: it existed at 20)
    assert out.existing_seconds == out.replica_seconds  # both placed from the first sample
    assert out.within_tier1_seconds == pytest.approx(10 + 20)  # b over 0..10, a over 20..40
    assert out.unavailable_seconds == pytest.approx(10 + 10 + 10)  # a over 10..20; b, once ready, over 10..30
    assert out.optimum_seconds == pytest.approx(1 * 10 + 2 * 20 + 1 * 10)  # bounded by the optimum at 0, then by those placed
    assert out.moves == {"a": [20.0]} and out.moved_wide == 0


def test_a_replica_counts_from_its_first_placement() -> None:
    stream = {"a": Service("a", "1P1D-1", 0.0, 1000.0)}
    waiting, placed = _replica(None, False, []), _replica(1, True, ["p"])
    samples = [Sample(0.0, {}), Sample(10.0, {"a": waiting}), Sample(20.0, {"a": placed}), Sample(30.0, {})]
    out = summarize(samples, stream)
    assert (out.existing_seconds, out.replica_seconds, out.within_tier1_seconds, out.unavailable_seconds) == (30.0, 10.0, 10.0, 0.0)


def test_moves_of_one_replica_within_an_hour() -> None:
    assert most_moves_in_an_hour({}) == 0
    assert most_moves_in_an_hour({"a": [0.0, 3600.0, 7200.0]}) == 1  # an hour apart: never two in one hour
    assert most_moves_in_an_hour({"a": [0.0, 3599.0], "b": [10.0]}) == 2
