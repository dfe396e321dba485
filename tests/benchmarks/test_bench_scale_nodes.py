from typing import Any

from bench.fabric import fabric_yaml
from bench.scale_nodes import growth, order, summarize, within_leaf
from stormtopo.core.topology.fabric import parse_topology


def _pod(app: str, node: str) -> dict[str, Any]:
    return {"metadata": {"labels": {"app": app}}, "spec": {"nodeName": node}}


def test_within_leaf_counts_services_whose_pods_share_one_leaf() -> None:
    topology = parse_topology(fabric_yaml(1, 2, 2))  # leaf-0-0: gpu-0000, gpu-0001; leaf-0-1: gpu-0002, gpu-0003
    pods = [_pod("a", "gpu-0000"), _pod("a", "gpu-0001"), _pod("b", "gpu-0001"), _pod("b", "gpu-0002")]
    assert within_leaf(pods, topology) == 0.5


def test_order_interleaves_modes_and_alternates_which_goes_first() -> None:
    runs = order(2, [16, 64])
    assert runs == [
        (0, 16, "stormtopo"),
        (0, 16, "plain"),
        (0, 64, "plain"),
        (0, 64, "stormtopo"),
        (1, 16, "plain"),
        (1, 16, "stormtopo"),
        (1, 64, "stormtopo"),
        (1, 64, "plain"),
    ]


def _batches(times: dict[tuple[int, str], list[float]]) -> list[dict[str, Any]]:
    return [{"services": n, "mode": m, "all_bound_s": t} for (n, m), ts in times.items() for t in ts]


def test_summarize_gives_medians_and_the_ratio_with_over_without() -> None:
    out = summarize(_batches({(16, "stormtopo"): [3.0, 5.0, 4.0], (16, "plain"): [2.0, 2.0, 2.0]}))
    assert out["16"]["all_bound_s_median"] == {"stormtopo": 4.0, "plain": 2.0}
    assert out["16"]["ratio_with_without"] == 2.0
    assert out["16"]["per_service_ms_median"] == {"stormtopo": 250.0, "plain": 125.0}


def test_growth_divides_large_by_small_clusters_and_batches() -> None:
    def cluster(nodes: int, scale: float) -> dict[str, Any]:
        by = summarize(
            _batches({(16, "stormtopo"): [2 * scale], (16, "plain"): [scale], (64, "stormtopo"): [8 * scale], (64, "plain"): [4 * scale]})
        )
        return {"nodes": nodes, "by_services": by, "operator_peak_rss_mb": 100.0 * scale, "idle_cores": {"kwok": 0.1 * scale}}

    out = growth([cluster(1024, 1.0), cluster(4096, 3.0)])
    assert out["all_bound_stormtopo_with_nodes"] == {"16": 3.0, "64": 3.0}
    assert out["all_bound_plain_with_services"] == {"1024": 4.0, "4096": 4.0}
    assert out["operator_peak_rss_with_nodes"] == 3.0
    assert out["idle_cores_with_nodes"] == {"kwok": 3.0}


def test_summarize_gives_no_median_for_a_mode_with_an_unfinished_batch() -> None:
    out = summarize([*_batches({(64, "plain"): [40.0]}), {"services": 64, "mode": "stormtopo", "all_bound_s": None}])
    assert out["64"]["all_bound_s_median"] == {"plain": 40.0}
    assert out["64"]["ratio_with_without"] is None
