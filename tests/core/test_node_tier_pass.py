"""One pass of the node tier (core/node_tier_pass.py), with no shell: nothing new plans nothing,
and what is said is said once per change."""

from __future__ import annotations

from dataclasses import replace

from stormtopo.core.node_tier_pass import NodeTierMemory, NodeTierReading, plan_off, plan_pass, refusals_to_say


def test_a_pass_over_what_the_last_one_carried_out_plans_nothing_and_a_named_leaf_is_said_once() -> None:
    reading = NodeTierReading((), 3, {"n1": 8}, {"n1": 8}, named_leaves=frozenset({"nowhere"}))
    first = plan_pass(reading, NodeTierMemory())
    assert first.planned is not None and first.said == ("--node-tier-leaf=nowhere is not used: no HyperNode has this name",)
    carried = replace(first.memory, planned=first.planned)  # the shell, once written
    again = plan_pass(reading, carried)
    assert again.planned is None and again.writes == () and again.said == ()
    moved = plan_pass(replace(reading, free={"n1": 4}), carried)  # GPUs taken on n1: planned again
    assert moved.planned is not None and moved.planned != first.planned
    unwritten = plan_pass(reading, first.memory)  # a write that failed is planned again (planned kept only once written)
    assert unwritten.planned == first.planned


def test_a_template_without_a_gpu_count_is_said_once_per_generation_and_forgotten_with_its_service() -> None:
    role = {
        "name": "decode",
        "replicas": 1,
        "template": {"spec": {"containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "x"}}}]}},
    }
    meta = {"namespace": "ns", "name": "svc", "generation": 1, "annotations": {"volcano.sh/network-topology-mode": "hard"}}
    service = {"metadata": meta, "spec": {"replicas": 1, "template": {"spec": {"roles": [role]}}}}
    reading = NodeTierReading((), 1, {}, {}, (service,), keep_runs=True)
    first = plan_pass(reading, NodeTierMemory())
    assert len(first.said) == 1 and first.said[0].startswith("StormService ns/svc: no GPU count in its template")
    assert plan_pass(reading, first.memory).said == ()
    gone = plan_pass(replace(reading, stormservices=()), first.memory)
    assert gone.memory.warned == frozenset()


def test_off_puts_the_leaves_back_once_per_change_of_the_hypernodes() -> None:
    off = plan_off([], 7, NodeTierMemory())
    assert off.planned == (7,)
    assert plan_off([], 7, replace(off.memory, planned=off.planned)).planned is None


def test_a_refusal_is_said_once_per_kind_until_a_pass_writes_without_one() -> None:
    refused = [("s1", "patch", "denied"), ("s2", "delete", "denied")]
    said, memory = refusals_to_say(refused, NodeTierMemory())
    assert said == refused
    again, memory = refusals_to_say([("s1", "patch", "denied"), ("s2", "create", "denied")], memory)
    assert again == [("s2", "create", "denied")]


def test_labels_read_anew_that_changed_plan_the_list_again() -> None:
    """A labelMatch leaf selects by node labels: a new version of them (Index.node_reads) is a new plan."""
    reading = NodeTierReading((), 3, {"n1": 8}, {"n1": 8}, node_labels={"n1": {"rack": "a"}}, node_reads=1)
    first = plan_pass(reading, NodeTierMemory())
    carried = first.carried_out(first.memory)
    assert plan_pass(reading, carried).planned is None
    assert plan_pass(replace(reading, node_labels={"n1": {"rack": "b"}}, node_reads=2), carried).planned is not None
