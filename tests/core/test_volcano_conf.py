"""Volcano's scheduler configuration as stormtopo reads it (core/volcano_conf.py): does anything preempt for a
job with a network topology, and what a Pending replica's explanation says when nothing does (issue 41)."""

from __future__ import annotations

import pytest
import yaml

from stormtopo.core.explanation import explain
from stormtopo.core.preemption import Holder
from stormtopo.core.topology.fabric import parse_topology
from stormtopo.core.volcano_conf import SchedulerConfError, parse_scheduler_conf
from stormtopo.devenv.cluster import SCHEDULER_CONF
from tests.conftest import TOPOLOGY_FILE

TREE = parse_topology(TOPOLOGY_FILE.read_text())  # leaves s0..s3 of two 8-GPU nodes each
FULL = dict.fromkeys(TREE.nodes, 0)  # no GPU free


def batch(priority: int = 100) -> tuple[Holder, Holder]:
    """A node held by two preemptable pods of 4 GPUs each."""
    return (Holder(4, priority, True), Holder(4, priority, True))


WITHOUT = 'actions: "enqueue, allocate, preempt, backfill"\ntiers:\n- plugins:\n  - name: priority\n  - name: gang\n'


def test_the_dev_clusters_configuration_preempts_for_a_topology_job_and_volcanos_default_does_not() -> None:
    dev = parse_scheduler_conf(SCHEDULER_CONF, "the file")
    assert dev.preempts_for_topology and dev.no_topology_preemption() is None
    assert "network-topology-aware" in dev.plugins and dev.actions[:2] == ("enqueue", "allocate")
    default = parse_scheduler_conf(WITHOUT, "ConfigMap volcano-system/volcano-scheduler-configmap key volcano-scheduler.conf")
    assert not default.preempts_for_topology
    why = default.no_topology_preemption()
    assert why is not None
    assert "runs no gangpreempt (ConfigMap volcano-system/volcano-scheduler-configmap key volcano-scheduler.conf: actions enqueue," in why
    assert 'set actions: "enqueue, allocate, preempt, gangpreempt, backfill" (docs/install.md#priority-and-preemption)' in why


def test_gangpreempt_goes_right_after_allocate_and_preempt_before_it_wherever_they_were() -> None:
    conf = parse_scheduler_conf(yaml.safe_dump({"actions": "enqueue, gangpreempt, allocate, backfill, preempt"}), "f")
    assert conf.actions_with_preemption() == ("enqueue", "allocate", "preempt", "gangpreempt", "backfill")
    assert parse_scheduler_conf("actions: allocate\n", "f").actions_with_preemption() == ("allocate", "preempt", "gangpreempt")


@pytest.mark.parametrize(("text", "problem"), [("actions: [unclosed", "not valid YAML"), ("- a list\n", "not a mapping")])
def test_a_text_vc_scheduler_would_not_load_is_an_error_saying_what_is_wrong(text: str, problem: str) -> None:
    with pytest.raises(SchedulerConfError, match=problem):
        parse_scheduler_conf(text, "f")


def test_a_pending_replica_whose_victims_nothing_would_take_says_so_instead_of_naming_them_as_taken() -> None:
    holders: dict[str, tuple[Holder, ...]] = {n: batch() for n in TREE.nodes}
    without = parse_scheduler_conf(WITHOUT, "ConfigMap volcano-system/volcano-scheduler-configmap key volcano-scheduler.conf")
    text = explain(TREE, FULL, [8, 8], 1, holders, 1000, volcano=without).render()
    assert "the fewest victims would be in tier-1 s0: 4 pod(s) holding 16 GPUs (4 of priority 100); but Volcano's scheduler runs" in text
    assert "so nothing is preempted for it" in text and "gangpreempt may take more" not in text
    with_it = explain(TREE, FULL, [8, 8], 1, holders, 1000, volcano=parse_scheduler_conf(SCHEDULER_CONF, "f")).render()
    assert with_it == explain(TREE, FULL, [8, 8], 1, holders, 1000).render()  # as without a reading
    assert "preempting 4 pod(s) holding 16 GPUs (4 of priority 100); Volcano's gangpreempt may take more" in with_it
    # No victims to name: no domain qualifies whatever Volcano runs, and that is what it says.
    equal = {n: batch(priority=1000) for n in TREE.nodes}
    assert "no domain qualifies" in explain(TREE, FULL, [8, 8], 1, equal, 1000, volcano=without).render()
