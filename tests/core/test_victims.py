"""The fewest victims (issue 41, item 3): the search finds what trying every set of candidates finds, a gang's
pods counted whole once it falls below its minimum."""

from __future__ import annotations

import random
from itertools import combinations

import pytest

from stormtopo.core.packing import fits
from stormtopo.core.victims import Candidate, Fewest, GangSize, cost_of, fewest_victims


def test_one_gang_across_two_nodes_is_cheaper_than_two_strangers() -> None:
    """Two pods of 8: node a and b each hold half of gang g (2 pods, minimum 2) and one stranger of 4. Taking g
    costs its 2 pods; taking the two strangers costs 2 as well but frees too little; g's pods and a stranger
    on one node would cost 3."""
    candidates = {
        "a": [Candidate(4, 10, "g"), Candidate(4, 10)],
        "b": [Candidate(4, 10, "g"), Candidate(4, 10)],
    }
    gangs = {"g": GangSize(running=2, min_member=2, gpus=8)}
    found = fewest_victims(["a", "b"], {"a": 0, "b": 0}, candidates, [4, 4], gangs)
    assert found is not None and found.chosen == (("a", 0), ("b", 0)) and found.cost == (2, 8, 20)


def test_a_gang_with_slack_loses_one_pod_without_it_only_whole() -> None:
    candidates = {"a": [Candidate(4, 10, "g"), Candidate(4, 30)]}
    slack = fewest_victims(["a"], {"a": 4}, candidates, [8], {"g": GangSize(3, 2, 12)})
    assert slack is not None and slack.chosen == (("a", 0),) and slack.lost == ((10, 1),)
    whole = fewest_victims(["a"], {"a": 4}, candidates, [8], {"g": GangSize(3, 3, 12)})
    assert whole is not None and whole.chosen == (("a", 1),) and whole.lost == ((30, 1),)  # one pod of 30, not g's 3


def test_of_equal_counts_the_lowest_priorities() -> None:
    candidates = {"a": [Candidate(4, 30), Candidate(4, 10)], "b": [Candidate(8, 20)]}
    found = fewest_victims(["a", "b"], {"a": 4, "b": 0}, candidates, [8])
    assert found is not None and found.chosen == (("a", 1),)


def test_the_fewest_gpus_first_takes_two_small_pods_where_the_fewest_pods_take_one_large() -> None:
    """The replica needs 4 GPUs on one node: node a frees them by its one 8-GPU pod, node b by its 1- and 2-GPU
    pods beside 1 GPU free. Fewest pods: a's one pod (8 GPUs lost). Fewest GPUs: b's two (3 GPUs lost)."""
    candidates = {"a": [Candidate(8, 10)], "b": [Candidate(1, 10), Candidate(2, 10)]}
    free = {"a": 0, "b": 1}
    pods_first = fewest_victims(["a", "b"], free, candidates, [4])
    assert pods_first is not None and pods_first.chosen == (("a", 0),) and pods_first.cost == (1, 8, 10)
    gpus_first = fewest_victims(["a", "b"], free, candidates, [4], fewest=Fewest.GPUS)
    assert gpus_first is not None and gpus_first.chosen == (("b", 0), ("b", 1)) and gpus_first.cost == (2, 3, 20)


def test_none_when_nothing_frees_enough() -> None:
    assert fewest_victims(["a"], {"a": 2}, {"a": [Candidate(4, 10)]}, [8]) is None


def _brute_force(
    nodes: list[str],
    free: dict[str, int],
    candidates: dict[str, list[Candidate]],
    pods: list[int],
    gangs: dict[str, GangSize],
    fewest: Fewest = Fewest.PODS,
) -> tuple[int, int, int] | None:
    every = [(n, i) for n in nodes for i in range(len(candidates.get(n, [])))]
    best: tuple[int, int, int] | None = None
    for k in range(len(every) + 1):
        for chosen in combinations(every, k):
            room = dict(free)
            for n, i in chosen:
                room[n] += candidates[n][i].gpus
            if not fits([room[n] for n in nodes], pods):
                continue
            cost, _ = cost_of(chosen, candidates, gangs)
            if best is None or fewest.rank(cost) < fewest.rank(best):
                best = cost
    return best


@pytest.mark.parametrize("fewest", list(Fewest))
def test_the_search_matches_every_set_tried_on_small_fragmented_domains(fewest: Fewest) -> None:
    """The fewest pods first (the default), or the fewest GPUs first: the same cost as trying every set."""
    rng = random.Random(41)
    for case in range(150):
        nodes = [f"n{i}" for i in range(rng.randint(2, 4))]
        free = dict.fromkeys(nodes, 0)
        candidates: dict[str, list[Candidate]] = {n: [] for n in nodes}
        gangs: dict[str, GangSize] = {}
        for n in nodes:
            left = 8
            while left > 0 and sum(len(c) for c in candidates.values()) < 12:
                gpus = min(left, rng.choice((1, 2, 4, 4, 8)))
                if rng.random() < 0.15:
                    free[n] += gpus
                else:
                    gang = rng.choice((None, None, "g0", "g1", "g2"))
                    candidates[n].append(Candidate(gpus, rng.choice((10, 20, 30)) if gang is None else 10 + int(gang[1]), gang))
                left -= gpus
        for gang in ("g0", "g1", "g2"):
            members = [c for cs in candidates.values() for c in cs if c.gang == gang]
            if members:
                gangs[gang] = GangSize(len(members), rng.randint(1, len(members)), sum(c.gpus for c in members))
        pods = rng.choice(([8], [8, 8], [4, 4], [4, 8], [2, 2, 4], [4, 4, 4, 4]))
        found = fewest_victims(nodes, free, candidates, pods, gangs, fewest=fewest)
        exact = _brute_force(nodes, free, candidates, pods, gangs, fewest)
        assert (fewest.rank(found.cost) if found else None) == (fewest.rank(exact) if exact else None), (
            f"case {case}: {nodes} {free} {candidates} {gangs} {pods}"
        )
        if found is not None:  # and what it chose does let the gang fit
            room = dict(free)
            for n, i in found.chosen:
                room[n] += candidates[n][i].gpus
            assert fits([room[n] for n in nodes], pods)
