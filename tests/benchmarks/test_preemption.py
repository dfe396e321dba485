"""The preemption bench's pure parts (bench/preemption.py): the exact minimum and the reduction of Volcano's
victims, on a tiny cluster checked by hand."""

from __future__ import annotations

from bench.preemption import Cluster, Gang, Job, Pod, cluster, lost, minimum, reduce, summarise


def job(name: str, priority: int, min_member: int, *pods: tuple[str, int]) -> Job:
    return Job(name, priority, min_member, tuple(Pod(name, i, n, g) for i, (n, g) in enumerate(pods)))


# Two leaves of two nodes, 8 GPUs each, all busy:
#   leaf-a: n1 = small (1 GPU, priority 10) + big (7, priority 10)   n2 = gang-0 (4, priority 20) + peer (4, priority 100)
#   leaf-b: n3 = gang-1 (4, priority 20) + two (2 pods x 2, priority 10, minMember 1)   n4 = top (8, priority 100)
# gang: 2 pods of 4, minMember 2; two: 2 pods, minMember 1 (one may go alone).
TINY = Cluster(
    leaves={"leaf-a": ("n1", "n2"), "leaf-b": ("n3", "n4")},
    spine_of={"leaf-a": "spine", "leaf-b": "spine"},
    jobs=(
        job("small", 10, 1, ("n1", 1)),
        job("big", 10, 1, ("n1", 7)),
        job("gang", 20, 2, ("n2", 4), ("n3", 4)),
        job("peer", 100, 1, ("n2", 4)),
        job("two", 10, 1, ("n3", 2), ("n3", 2)),
        job("top", 100, 1, ("n4", 8)),
    ),
)


def test_a_job_left_below_its_min_member_is_lost_whole() -> None:
    assert {p.name for p in lost(TINY, ["gang-0"])} == {"gang-0", "gang-1"}
    assert {p.name for p in lost(TINY, ["two-0"])} == {"two-0"}  # one of two may go: minMember 1
    assert {p.name for p in lost(TINY, ["two-0", "two-1"])} == {"two-0", "two-1"}


def test_the_fewest_pods_and_the_fewest_gpus_within_one_leaf() -> None:
    # 2 x 4 GPUs within one leaf. leaf-a: n1's big (7 GPUs) frees 7, n1's small 1: both (2 pods) give n1 8,
    # room for both pods; or big alone: n1 has 7 free, one pod, and n2 needs peer gone (priority 100: never).
    # leaf-b: gang-1 (breaks gang: 2 pods lost) frees n3's 4, and two's pods 4 more: n3 holds both pods with
    # gang-1 and both of two's (4 pods); n4 is top's (never). So the fewest pods: 2 (small + big, 8 GPUs), and
    # the fewest GPUs: also 8 (leaf-b's way costs 4 + 4 + 4 = 12, gang-0's GPUs counted as lost).
    hard = Gang((4, 4), "hard")
    fewest = minimum(TINY, hard, "pods")
    assert fewest is not None and (fewest.cost, fewest.victims) == (2, ("big-0", "small-0"))
    least = minimum(TINY, hard, "gpus")
    assert least is not None and least.cost == 8


def test_soft_may_split_the_gang_and_never_takes_equal_priority() -> None:
    # Anywhere: one pod on n1 once big goes (7 free) and the other on n3 once both of two's pods go (4 free):
    # 3 pods; or both on n1 once big and small go: 2 pods.
    soft = minimum(TINY, Gang((4, 4), "soft"), "pods")
    assert soft is not None and soft.cost == 2
    # A gang at priority 10 may take nothing of priority 10 or more: no way.
    assert minimum(TINY, Gang((4, 4), "hard", priority=10), "pods") is None


def test_reduce_counts_broken_gangs_and_leaves() -> None:
    hard = Gang((4, 4), "hard")
    record = {
        "victims": [
            {"pod": "gang-1", "node": "n3", "gpus": 4},
            {"pod": "two-0", "node": "n3", "gpus": 2},
            {"pod": "two-1", "node": "n3", "gpus": 2},
        ],
        "placed": True,
        "nodes": ["n3", "n3"],
        "sessions": [{}, {}],
    }
    out = reduce(TINY, hard, record, minimum(TINY, hard, "pods"), minimum(TINY, hard, "gpus"))
    assert (out["evicted_pods"], out["victim_pods"], out["victim_gpus"]) == (3, 4, 12)  # gang-0 lost with gang-1
    assert out["pods_vs_minimum"] == 2.0 and out["gpus_vs_minimum"] == 1.5
    assert out["victim_leaves"] == ["leaf-b"] and out["placed_leaves"] == ["leaf-b"]
    assert not out["missed"] and not out["evicted_in_vain"]
    [row] = summarise([{"case": "tiny", "nodes": 4, "mode": "hard", **out}])
    assert row["pods_vs_minimum_median"] == 2.0 and row["victims_span_leaves"] == 0.0


def test_generated_clusters_need_preemption() -> None:
    c = cluster(64, 1)
    assert max(c.free().values()) < 4  # no node holds a pod of 4 without a victim
    for shape in ((8, 8), (4, 4)):
        for mode in ("hard", "soft"):
            found = minimum(c, Gang(shape, mode), "pods")
            assert found is not None and found.cost >= 1
