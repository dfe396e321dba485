"""The KV-transfer flow simulation's pure parts: max-min fair sharing and transfer times on a small fabric."""

from __future__ import annotations

import pytest
import yaml

from bench.fabric import fabric_yaml
from bench.kvflow import Fabric, Pod, Replica, Request, max_min_rates, percentile, simulate
from stormtopo.core.topology.fabric import parse_topology
from stormtopo.demo import DEFAULT_KV_CONFIG
from stormtopo.kvtransfer import parse_kv_model

KV = parse_kv_model(yaml.safe_load(DEFAULT_KV_CONFIG.read_text()))
GB = 1e9


def test_a_single_flow_gets_its_bottleneck_bandwidth() -> None:
    rates = max_min_rates({"f": ["nic", "uplink", "far-nic"]}, {"nic": 50.0, "uplink": 20.0, "far-nic": 100.0})
    assert rates == {"f": pytest.approx(20.0)}


def test_two_flows_on_one_link_share_it_equally() -> None:
    rates = max_min_rates({"a": ["link"], "b": ["link"]}, {"link": 10.0})
    assert rates == {"a": pytest.approx(5.0), "b": pytest.approx(5.0)}


def test_max_min_fairness_on_three_links() -> None:
    # The classic example: a long flow crosses links 1 and 2; one short flow on each link; link 3 holds a
    # flow alone. Link 1 (capacity 1) is the bottleneck of the long flow and of s1: 0.5 each. Link 2
    # (capacity 2) gives s2 what the long flow leaves: 1.5. Link 3 is s3's alone: 3.
    rates = max_min_rates(
        {"long": ["l1", "l2"], "s1": ["l1"], "s2": ["l2"], "s3": ["l3"]},
        {"l1": 1.0, "l2": 2.0, "l3": 3.0},
    )
    assert rates == {"long": pytest.approx(0.5), "s1": pytest.approx(0.5), "s2": pytest.approx(1.5), "s3": pytest.approx(3.0)}
    # Max-min fair: no link is over capacity, and every flow crosses a full link on which it is the largest.
    assert rates["long"] + rates["s1"] <= 1.0 + 1e-9 and rates["long"] + rates["s2"] <= 2.0 + 1e-9


def test_a_lone_transfer_takes_the_modeled_time_of_its_tier() -> None:
    topology = parse_topology(fabric_yaml(2, 2, 2))
    fabric = Fabric(topology, KV, oversubscription=4)
    # Two 8-GPU pods on two nodes of one leaf: eight NICs of 50 GB/s each, nothing else on the fabric.
    replica = Replica(((Pod("p", "gpu-0000", 8),),), (Pod("d", "gpu-0001", 8),))
    (seconds,) = simulate(fabric, [replica], [Request(0.0, 0, 0, 0)])
    assert seconds == pytest.approx(KV.request_bytes / (8 * 50 * GB) + 3e-6)


def test_two_transfers_through_an_oversubscribed_uplink_share_it() -> None:
    topology = parse_topology(fabric_yaml(2, 2, 2))  # leaves of 2 nodes x 8 GPUs: 800 GB/s of NICs
    fabric = Fabric(topology, KV, oversubscription=4)  # so 200 GB/s up from each leaf
    across = [Replica(((Pod(f"p{i}", f"gpu-000{i}", 8),),), (Pod(f"d{i}", f"gpu-000{i + 2}", 8),)) for i in range(2)]
    times = simulate(fabric, across, [Request(0.0, 0, 0, 0), Request(0.0, 1, 0, 0)])
    expected = KV.request_bytes / (100 * GB) + KV.seconds(2) - KV.request_bytes / (KV.link(2).bandwidth_gbps * GB)
    assert times == [pytest.approx(expected), pytest.approx(expected)]


def test_percentile_is_a_value_of_the_sample() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 99), percentile(values, 100)) == (50.0, 99.0, 100.0)
