"""What a Pending gang could preempt (issue 41, item 4): the domain gangpreempt's rule would take, with how
many pods of which priority, or why no domain qualifies. On the feature request's tree: leaves s0..s3 of
two 8-GPU nodes each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stormtopo.core.explanation import explain
from stormtopo.core.preemption import PREEMPTABLE, Holder, plan_preemption, rank_of
from stormtopo.core.topology.fabric import parse_topology
from tests import builders

TREE = parse_topology((Path(__file__).resolve().parents[2] / "examples" / "topology" / "aibrix-1730.yaml").read_text())
Pod = dict[str, Any]
NODES = [f"node{i}" for i in range(8)]
FULL = dict.fromkeys(NODES, 0)


def batch(priority: int = 100, gpus: int = 4, preemptable: bool = True) -> tuple[Holder, Holder]:
    """A node held by two pods of 4 GPUs each."""
    return (Holder(gpus, priority, preemptable), Holder(gpus, priority, preemptable))


def test_a_full_cluster_of_lower_priority_batch_offers_one_leaf_and_exactly_its_four_pods() -> None:
    holders = {n: batch() for n in NODES}
    verdict = plan_preemption(TREE, FULL, holders, [8, 8], 1000, 1)
    assert verdict.victims is not None and verdict.protected is None
    assert verdict.victims.tier == 1 and verdict.victims.domain == "s0"  # the first of equals, by name
    assert verdict.victims.by_priority == ((100, 4),) and verdict.victims.gpus == 16
    assert "the fewest victims are in tier-1 s0: preempting 4 pod(s) holding 16 GPUs (4 of priority 100)" in verdict.render()


def test_the_leaf_with_the_fewest_victims_and_the_lowest_priorities_first() -> None:
    holders = {n: batch() for n in NODES}
    holders["node2"] = (Holder(8, 50, True),)  # leaf s1: one pod of 8 on node2, two of 4 on node3
    holders["node4"] = (Holder(4, 10, True), Holder(4, 500, True))  # s2: the lowest first, and only as many as needed
    verdict = plan_preemption(TREE, FULL, holders, [8, 8], 1000, 1)
    assert verdict.victims is not None and verdict.victims.domain == "s1"
    assert verdict.victims.by_priority == ((50, 1), (100, 2))
    half = plan_preemption(TREE, FULL | {"node5": 8}, holders, [4, 8], 1000, 1)  # node5 free: s2 needs one victim
    assert half.victims is not None and half.victims.domain == "s2" and half.victims.by_priority == ((10, 1),)


def test_no_domain_qualifies_when_its_pods_rank_as_high_or_are_not_preemptable() -> None:
    holders = {n: batch(priority=1000) for n in NODES}  # equal priority: never a victim
    for node in ("node0", "node1"):
        holders[node] = batch(priority=100, preemptable=False)
    holders["node1"] = (Holder(4, 100, True), Holder(4, 100, False))
    verdict = plan_preemption(TREE, FULL, holders, [8, 8], 1000, 1)
    assert verdict.victims is None and verdict.protected is not None
    assert verdict.protected.domain == "s0" and verdict.protected.short == 12
    assert verdict.protected.not_preemptable == 12 and verdict.protected.higher == 0
    text = verdict.render()
    assert "no domain qualifies for preemption: in the best, tier-1 s0" in text and "12 GPUs short" in text
    elsewhere = plan_preemption(TREE, FULL, {n: batch(priority=1000) for n in NODES}, [8, 8], 1000, 1)
    assert elsewhere.protected is not None and elsewhere.protected.higher == 16


def test_a_hard_gang_within_tier_two_may_take_a_spine_when_no_leaf_qualifies() -> None:
    holders = {n: batch(priority=1000) for n in NODES} | {"node1": batch(), "node2": batch()}  # s0 and s1 each have one
    verdict = plan_preemption(TREE, FULL, holders, [8, 8], 1000, 2)
    assert verdict.victims is not None and verdict.victims.tier == 2 and verdict.victims.domain == "s4"
    assert plan_preemption(TREE, FULL, holders, [8, 8], 1000, 1).victims is None  # tier 1 only: none


def test_the_explanation_says_what_it_could_preempt_only_when_the_holders_were_read() -> None:
    holders = {n: batch() for n in NODES}
    explained = explain(TREE, FULL, [8, 8], 1, holders, 1000)
    assert not explained.fits and explained.preemption is not None
    assert "the fewest victims are in tier-1 s0: preempting 4 pod(s)" in explained.render()
    assert explain(TREE, FULL, [8, 8], 1).preemption is None
    assert "preempt" not in explain(TREE, FULL, [8, 8], 1).render()


def test_a_pod_ranks_as_volcano_judges_it() -> None:
    def pod(scheduler: str = "volcano", priority: object = 100, marks: dict[str, str] | None = None, label: bool = False) -> Pod:
        spec = {"schedulerName": scheduler, "priority": priority}
        if label:
            return builders.pod("p", None, labels=marks or {}, spec=spec, kind=None)
        return builders.pod("p", None, labels={}, annotations=marks or {}, spec=spec, kind=None)

    assert rank_of(pod()) == (100, True)  # Volcano's default: preemptable
    assert rank_of(pod(priority=None)) == (0, True)
    assert rank_of(pod(scheduler="default-scheduler")) == (100, False)  # no job of Volcano's
    assert rank_of(pod(marks={PREEMPTABLE: "false"})) == (100, False)
    assert rank_of(pod(marks={PREEMPTABLE: "False"}, label=True)) == (100, False)
    assert rank_of(pod(marks={PREEMPTABLE: "T"})) == (100, True)
    assert rank_of(pod(marks={PREEMPTABLE: "yes"})) == (100, False)  # unreadable: false, as strconv.ParseBool fails


def test_victims_are_those_of_the_nodes_the_gang_would_use_not_the_cheapest_of_the_domain() -> None:
    """Eight 1-GPU pods on each node of leaf s0 and s1: the cheapest single pod (priority 5, node2) frees
    no node by itself; a gang of 8 takes one node's eight, not that pod besides."""
    ones = {n: tuple(Holder(1, 30, True) for _ in range(8)) for n in NODES}
    ones["node0"] = tuple(Holder(1, 10, True) for _ in range(8))
    ones["node2"] = (Holder(1, 5, True), *(Holder(1, 30, True) for _ in range(7)))
    verdict = plan_preemption(TREE, FULL, ones, [8], 1000, 1)
    assert verdict.victims is not None and verdict.victims.domain == "s0"
    assert verdict.victims.by_priority == ((10, 8),) and verdict.victims.gpus == 8


def test_a_large_domain_is_judged_in_pods_times_nodes_steps() -> None:
    """16,384 nodes of eight 1-GPU pods under one tier-2 switch, a gang of 40 x 8 GPUs: decided, 320 victims."""
    import time

    from stormtopo.core.topology.tree import NodeSpec, Switch, Topology

    names = [f"n{i:05d}" for i in range(16_384)]
    leaves = {f"l{j}": names[j * 16 : (j + 1) * 16] for j in range(1024)}
    switches = {name: Switch(name, 1, "spine", (), tuple(members)) for name, members in leaves.items()}
    switches["spine"] = Switch("spine", 2, None, tuple(leaves), ())
    nodes = {n: NodeSpec(n, f"l{i // 16}", 8, "96", "1Ti") for i, n in enumerate(names)}
    big = Topology(switches=switches, nodes=nodes, tier_names={})
    held = {n: tuple(Holder(1, 10, True) for _ in range(8)) for n in names}
    started = time.perf_counter()
    verdict = plan_preemption(big, dict.fromkeys(names, 0), held, [8] * 40, 1000, 2)
    seconds = time.perf_counter() - started
    assert verdict.victims is not None and verdict.victims.pods == 320 and verdict.victims.tier == 2
    print(f"\n  16,384 nodes, a gang of 40 x 8: {seconds:.2f} s")


def test_the_explanation_counts_a_victim_of_a_gang_as_its_whole_gang() -> None:
    """Leaf s0 holds, on each node, a pod of gang g (4 running pods, two of them in s3) and a lone pod: taking
    s0 costs g's 4 pods and 2 lone ones. s1's nodes each hold two lone pods: 4. The fewest are s1's."""
    from stormtopo.core.victims import GangSize

    g = (Holder(4, 100, True, "batch/g"), Holder(4, 100, True))
    holders = {n: batch() for n in NODES} | {"node0": g, "node1": g, "node6": g, "node7": g}
    explained = explain(TREE, FULL, [8, 8], 1, holders, 1000, {"batch/g": GangSize(4, 4, 16)})
    assert explained.preemption is not None and explained.preemption.victims is not None
    assert explained.preemption.victims.domain == "s1" and explained.preemption.victims.pods == 4
    alone = explain(TREE, FULL, [8, 8], 1, holders, 1000)  # gangs unknown: each pod alone, s0 first by name
    assert alone.preemption is not None and alone.preemption.victims is not None and alone.preemption.victims.domain == "s0"
