"""What each Volcano release's PodGroup CRD allows, read from the CRDs as shipped (../shared/upstream-crds)."""

from __future__ import annotations

import pytest

from stormtopo.core.capabilities import cluster_tiers
from stormtopo.core.jsonpatch import set_spec_fields
from stormtopo.core.podgroup import desired_fields
from stormtopo.core.request import RequestError, parse_request
from stormtopo.core.vocabulary import HIGHEST_TIER, HIGHEST_TIER_NAME, MODE, REPLICA_HIGHEST_TIER, SCOPE
from tests.core.volcano_crds import podgroup_schema

HYPERNODES = [{"spec": {"tier": 1, "tierName": "leaf"}}, {"spec": {"tier": 2, "tierName": "spine"}}]
RELEASES = ["v1.12.4", "v1.13.3", "v1.14.4", "v1.15.1", "v1.16.0-alpha.1"]


@pytest.mark.parametrize("release", RELEASES)
def test_each_release_offers_what_its_crd_has(release: str) -> None:
    tiers = cluster_tiers(HYPERNODES, podgroup_schema(release))
    new = release >= "v1.14"
    assert tiers.has_network_topology
    assert tiers.has_tier_name_field is new and tiers.has_subgroup_policy is new
    assert dict(tiers.network_topology_defaults) == ({"mode": "hard"} if new else {"mode": "hard", "highestTierAllowed": 1})


@pytest.mark.parametrize("release", ["v1.12.4", "v1.13.3"])
def test_before_1_14_tier_names_and_nesting_are_refused_naming_the_volcano_they_need(release: str) -> None:
    tiers = cluster_tiers(HYPERNODES, podgroup_schema(release))
    with pytest.raises(RequestError, match=r"upgrade Volcano to 1\.14 or newer"):
        parse_request({MODE: "hard", HIGHEST_TIER_NAME: "leaf"}, tiers)
    with pytest.raises(RequestError, match=r"upgrade Volcano to 1\.14 or newer"):
        parse_request({MODE: "hard", HIGHEST_TIER: "2", SCOPE: "StormService", REPLICA_HIGHEST_TIER: "1"}, tiers)
    assert parse_request({MODE: "hard", HIGHEST_TIER: "1"}, tiers) is not None


@pytest.mark.parametrize("release", RELEASES)
def test_a_soft_request_without_a_tier_matches_what_the_api_server_stores(release: str) -> None:
    """1.12 and 1.13 default highestTierAllowed to 1: the desired spec must include it, or the operator
    would patch the PodGroup forever."""
    tiers = cluster_tiers(HYPERNODES, podgroup_schema(release))
    request = parse_request({MODE: "soft"}, tiers)
    assert request is not None
    roleset_spec = {"roles": [{"name": "prefill"}, {"name": "decode"}]}
    defaulted = {**dict(tiers.network_topology_defaults), "mode": "soft"}  # what the API server stores
    stored = {"minMember": 2, "minTaskMember": {"prefill": 1, "decode": 1}, "networkTopology": defaulted}
    assert set_spec_fields(stored, desired_fields(request, roleset_spec)) == []
