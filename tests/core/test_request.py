"""Parsing a StormService's network-topology annotations (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stormtopo.core.request import ClusterTiers, Mode, RequestError, Scope, TierLimit, parse_request
from stormtopo.core.vocabulary import HIGHEST_TIER, HIGHEST_TIER_NAME, MODE, REPLICA_HIGHEST_TIER, REQUEST_ANNOTATIONS, SCOPE

CLUSTER = ClusterTiers(frozenset({1, 2, 3}), frozenset({"leaf", "spine", "core"}))


def test_no_annotations_is_not_opted_in() -> None:
    assert parse_request({}, CLUSTER) is None
    assert parse_request({"app": "x", "volcano.sh/queue-name": "q"}, CLUSTER) is None


def test_hard_tier_one() -> None:
    request = parse_request({MODE: "hard", HIGHEST_TIER: "1"}, CLUSTER)
    assert request is not None
    assert request.mode is Mode.HARD and request.limit == TierLimit(tier=1) and request.scope is Scope.ROLESET
    assert request.network_topology() == {"mode": "hard", "highestTierAllowed": 1}


def test_soft_needs_no_tier_and_tier_name_maps_to_highest_tier_name() -> None:
    soft = parse_request({MODE: "soft"}, CLUSTER)
    assert soft is not None and soft.network_topology() == {"mode": "soft"}
    named = parse_request({MODE: "hard", HIGHEST_TIER_NAME: "spine"}, CLUSTER)
    assert named is not None and named.network_topology() == {"mode": "hard", "highestTierName": "spine"}


@pytest.mark.parametrize(
    ("annotations", "names"),
    [
        ({MODE: "strict", HIGHEST_TIER: "1"}, [MODE, "'strict'", "hard or soft"]),
        ({MODE: "hard", HIGHEST_TIER: "0"}, [HIGHEST_TIER, "'0'", "1 to 3"]),
        ({MODE: "hard", HIGHEST_TIER: "-1"}, [HIGHEST_TIER, "'-1'", "1 to 3"]),
        ({MODE: "hard", HIGHEST_TIER: "abc"}, [HIGHEST_TIER, "'abc'", "1 to 3"]),
        ({MODE: "hard", HIGHEST_TIER: "4"}, [HIGHEST_TIER, "deeper than any HyperNode", "1 to 3"]),
        ({MODE: "hard", HIGHEST_TIER_NAME: "rack"}, [HIGHEST_TIER_NAME, "'rack'", "core, leaf, spine"]),
        ({MODE: "hard", HIGHEST_TIER: "1", HIGHEST_TIER_NAME: "leaf"}, [HIGHEST_TIER, HIGHEST_TIER_NAME, "one of them"]),
        ({MODE: "hard", HIGHEST_TIER: "1", SCOPE: "Cluster"}, [SCOPE, "'Cluster'", "RoleSet", "StormService"]),
        ({HIGHEST_TIER: "1"}, [MODE, "missing"]),
        ({MODE: "hard"}, [MODE, HIGHEST_TIER]),
        ({MODE: "hard", HIGHEST_TIER: "2", REPLICA_HIGHEST_TIER: "1"}, [REPLICA_HIGHEST_TIER, "StormService"]),
        ({MODE: "hard", HIGHEST_TIER: "1", SCOPE: "StormService", REPLICA_HIGHEST_TIER: "2"}, [REPLICA_HIGHEST_TIER, "1 to 1"]),
    ],
)
def test_bad_input_names_the_annotation_the_value_and_what_is_accepted(annotations: dict[str, str], names: list[str]) -> None:
    with pytest.raises(RequestError) as caught:
        parse_request(annotations, CLUSTER)
    message = str(caught.value)
    for expected in names:
        assert expected in message


def test_volcano_too_old_for_tier_names_and_subgroups_is_said_plainly() -> None:
    old = ClusterTiers(frozenset({1, 2}), frozenset(), has_tier_name_field=False, has_subgroup_policy=False)
    with pytest.raises(RequestError, match=r"upgrade Volcano to 1\.14"):
        parse_request({MODE: "hard", HIGHEST_TIER_NAME: "leaf"}, old)
    with pytest.raises(RequestError, match="subGroupPolicy"):
        parse_request({MODE: "hard", HIGHEST_TIER: "2", SCOPE: "StormService", REPLICA_HIGHEST_TIER: "1"}, old)


def test_volcano_without_network_topology_is_named() -> None:
    ancient = ClusterTiers(frozenset({1}), has_network_topology=False)
    with pytest.raises(RequestError, match=r"upgrade Volcano to 1\.12"):
        parse_request({MODE: "hard", HIGHEST_TIER: "1"}, ancient)


def test_nested_placement() -> None:
    request = parse_request({MODE: "hard", HIGHEST_TIER: "2", SCOPE: "StormService", REPLICA_HIGHEST_TIER: "1"}, CLUSTER)
    assert request is not None
    assert request.network_topology() == {"mode": "hard", "highestTierAllowed": 2}
    assert request.replica_network_topology() == {"mode": "hard", "highestTierAllowed": 1}


@pytest.mark.parametrize("text", ["\u00b9", "\u0663", "\u00b22", "1.0", "+1", " ", "0"])
def test_a_tier_that_only_looks_like_a_number_is_explained_not_crashed_on(text: str) -> None:
    # str.isdigit() accepts superscripts and other scripts' digits, which int() refuses (found by hypothesis in CI).
    with pytest.raises(RequestError) as error:
        parse_request({MODE: "hard", HIGHEST_TIER: text}, None)
    assert any(HIGHEST_TIER in p and "accepted" in p for p in error.value.problems)


values = st.one_of(
    st.sampled_from(["hard", "soft", "Hard", "", " hard ", "1", "2", "3", "4", "0", "-1", "abc", "leaf", "RoleSet", "StormService"]),
    st.text(max_size=12),
    st.sampled_from(["\u00b9", "\u0663", "\uff11", "2\u200b"]),
    st.integers(-5, 10).map(str),
)
annotation_sets = st.dictionaries(st.sampled_from([*REQUEST_ANNOTATIONS, "other/key"]), values, max_size=6)


@settings(max_examples=1500, deadline=None)
@given(annotation_sets, st.booleans())
def test_parser_either_accepts_a_consistent_request_or_explains_every_problem(annotations: dict[str, str], know_cluster: bool) -> None:
    cluster = CLUSTER if know_cluster else None
    try:
        request = parse_request(annotations, cluster)
    except RequestError as exc:
        assert exc.problems, "an error must say what is wrong"
        for problem in exc.problems:
            assert ("annotation" in problem and "accepted" in problem) or "missing" in problem or "needs" in problem
        return
    if request is None:
        assert not any(k in annotations for k in REQUEST_ANNOTATIONS)
        return
    topology = request.network_topology()
    assert topology["mode"] in ("hard", "soft")
    assert not ("highestTierAllowed" in topology and "highestTierName" in topology)
    if topology["mode"] == "hard":
        assert "highestTierAllowed" in topology or "highestTierName" in topology
    tier = topology.get("highestTierAllowed")
    if tier is not None:
        assert isinstance(tier, int) and tier >= 1
        if cluster is not None:
            assert tier <= 3


def test_a_tier_name_is_refused_when_no_hypernode_has_a_tier_name() -> None:
    # Volcano drops an unknown highestTierName silently and the gang runs unconstrained.
    with pytest.raises(RequestError) as caught:
        parse_request({MODE: "hard", HIGHEST_TIER_NAME: "leaf"}, ClusterTiers(frozenset({1, 2})))
    assert "no HyperNode of this cluster has a tierName" in str(caught.value) and HIGHEST_TIER in str(caught.value)


def test_the_request_a_podgroup_records_is_data_read_back_as_written_and_the_sentence_before_it_too() -> None:
    """Issue 44, item 2: `stormtopo.io/request` is JSON with a version; the sentence the release before wrote is read."""
    import json

    from stormtopo.core.request import Mode, Scope, TierLimit, TopologyRequest, recorded_request

    for request in (
        TopologyRequest(Mode.HARD, TierLimit(tier=1)),
        TopologyRequest(Mode.HARD, TierLimit(tier_name="leaf"), spread=TierLimit(tier=2)),
        TopologyRequest(Mode.SOFT, TierLimit()),
        TopologyRequest(Mode.SOFT, TierLimit(tier=3), Scope.STORMSERVICE, replica_limit=TierLimit(tier=1)),
    ):
        record = request.record()
        assert json.loads(record)["v"] == 1 and "within" not in record
        back = recorded_request(record, (("highestTierAllowed", 1),))
        assert back is not None and (back.mode, back.limit, back.defaults) == (request.mode, request.limit, (("highestTierAllowed", 1),))
        old = recorded_request(request.describe())  # as the release before wrote it: a sentence of scope RoleSet, no spread
        if request.scope is Scope.ROLESET and request.spread is None:
            assert old is not None and (old.mode, old.limit) == (request.mode, request.limit)
        else:
            assert old is None  # (the sentence's reader never read these; the record does)
    assert json.loads(TopologyRequest(Mode.HARD, TierLimit(tier=2), spread=TierLimit(tier_name="spine")).record()) == {
        "v": 1, "mode": "hard", "highestTierAllowed": 2, "scope": "RoleSet", "spread": {"highestTierName": "spine"}
    }  # fmt: skip


def test_a_tier_name_is_resolved_one_way_for_a_request_and_for_the_tree() -> None:
    """Issue 44, item 3: one resolver (core/tier.py tier_of_name): the highest tier carrying the name, else None."""
    from stormtopo.core.request import ClusterTiers, TierLimit
    from stormtopo.core.tier import tier_of_name
    from stormtopo.core.topology.tree import Topology

    named = (("leaf", 1), ("spine", 2), ("leaf", 3))
    assert [tier_of_name(n, named) for n in ("leaf", "spine", "core", None, "")] == [3, 2, None, None, None]
    cluster = ClusterTiers(frozenset({1, 2, 3}), frozenset({"leaf", "spine"}), tier_of_name=tuple(sorted(named)))
    tree = Topology({}, {}, {1: "leaf", 2: "spine", 3: "leaf"})
    for name in ("leaf", "spine", "core"):
        assert cluster.number(TierLimit(tier_name=name)) == tree.tier_of_name(name) == tier_of_name(name, named)
