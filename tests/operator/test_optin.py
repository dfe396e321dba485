"""What the StormService gate may list (issue 20, item 5): a review is checked against the cluster,
the gate never unlists, unconfirmed listings are bounded and expire, and with a client CA only a
caller presenting a certificate it signed is answered. Pure decisions first, then the Gate with a
fake API, then the webhook over real TLS on 127.0.0.1."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import time
import urllib.request
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from stormtopo import certificates
from stormtopo.core.admission import Decision
from stormtopo.core.gate import CONFIRM_SECONDS, REFUTED_LIMIT, UNCONFIRMED_LIMIT, Unconfirmed, confirmed, expiry_verdict, gate_listing
from stormtopo.core.optin import MOVABLE, admission_policy, labelled, listing, opt_in_patch, opted_in_key, split_key
from stormtopo.core.vocabulary import HEAL_ANNOTATION, HIGHEST_TIER, LEND_ROOM_ANNOTATION, MODE, OPTED_IN_LABEL, SCOPE
from stormtopo.devenv import processes, webhook_auth
from stormtopo.devenv.cluster import operator_env
from stormtopo.kube.client import ApiError
from stormtopo.operator import listed_pods, webhook
from stormtopo.operator.optin import GATE_LISTED, NAMES_KEPT, UPDATE_LAG, Gate, ListsSeen, OptedInList
from tests.builders import service_meta

HARD = {MODE: "hard", HIGHEST_TIER: "1"}


# -- what a review may list (pure) ---------------------------------------------------------------
def test_an_opt_in_by_update_is_listed_with_its_scope() -> None:
    stored = service_meta()
    assert gate_listing("UPDATE", service_meta(annotations=HARD), stored, stored)[0] == "RoleSet"
    assert gate_listing("UPDATE", service_meta(annotations={**HARD, SCOPE: "StormService"}), stored, stored)[0] == "StormService"


def test_a_create_lists_nothing_its_role_templates_carry_the_label() -> None:
    """Issue 42, item 1: a new StormService is held by the opt-in label the mutating webhook puts on its
    role templates; the gate lists no create, genuine or made up."""
    want, why = gate_listing("CREATE", service_meta(annotations=HARD), None, None)
    assert want is None and "label" in why
    assert gate_listing("CREATE", service_meta(annotations=HARD), None, service_meta())[0] is None


def test_a_service_that_asks_for_healing_is_listed_as_movable_and_only_then() -> None:
    """The chart's eviction policy lets stormtopo evict pods only of services listed with MOVABLE (issue 34, item 6)."""
    assert listing(service_meta(annotations={**HARD, HEAL_ANNOTATION: " True "})) == "RoleSet" + MOVABLE
    assert listing(service_meta(annotations={**HARD, HEAL_ANNOTATION: "false"})) == "RoleSet"
    assert listing(service_meta(annotations={**HARD, LEND_ROOM_ANNOTATION: "true"})) == "RoleSet"  # lending needs healing
    assert listing(service_meta(annotations={HEAL_ANNOTATION: "true"})) is None  # no topology request: not listed at all
    assert MOVABLE == "+heal"  # the chart's policy (templates/admission-policy.yaml) reads it by this text


def test_the_gate_never_unlists() -> None:
    """A review without annotations once unlisted a genuine opted-in StormService."""
    want, why = gate_listing("UPDATE", service_meta(), service_meta(annotations=HARD), service_meta(annotations=HARD))
    assert want is None and "never unlists" in why


def test_an_update_is_listed_only_if_its_old_object_is_the_stored_one() -> None:
    stored = service_meta(version="7", uid="u-1")
    new = service_meta(annotations=HARD, version="7", uid="u-1")
    assert gate_listing("UPDATE", new, service_meta(version="7", uid="u-1"), stored)[0] == "RoleSet"
    stale = gate_listing("UPDATE", new, service_meta(version="6", uid="u-1"), stored)
    assert stale[0] is None and "stale, replayed or made up" in stale[1]
    other_uid = gate_listing("UPDATE", new, service_meta(version="7", uid="u-made-up"), stored)
    assert other_uid[0] is None
    no_old = gate_listing("UPDATE", new, None, stored)
    assert no_old[0] is None
    made_up = gate_listing("UPDATE", new, service_meta(version="7"), None)
    assert made_up[0] is None and "made up" in made_up[1]


def test_a_version_found_falsely_listed_is_not_listed_again() -> None:
    stored = service_meta(version="7")
    new, old = service_meta(annotations=HARD, version="7"), service_meta(version="7")
    assert gate_listing("UPDATE", new, old, stored, refuted="7")[0] is None
    assert gate_listing("UPDATE", new, old, stored, refuted="5")[0] == "RoleSet"  # an older refutation: a new version


def test_other_operations_and_nameless_reviews_list_nothing() -> None:
    assert gate_listing("DELETE", service_meta(annotations=HARD), None, None)[0] is None
    assert gate_listing("CONNECT", service_meta(annotations=HARD), None, None)[0] is None
    nameless = service_meta(annotations=HARD)
    nameless["metadata"]["name"] = ""
    assert gate_listing("CREATE", nameless, None, None)[0] is None


def test_confirmed_means_stored_with_a_request() -> None:
    assert confirmed(service_meta(annotations=HARD))
    assert confirmed(service_meta(annotations={MODE: "hardd"}))  # invalid, still opted in: the reconciler keeps it listed
    assert not confirmed(service_meta())
    assert not confirmed(None)
    assert expiry_verdict(service_meta(annotations=HARD)) == "keep"
    assert expiry_verdict(service_meta()) == "unlist-refuted"
    assert expiry_verdict(None) == "unlist"
    # What was listed counts, but for `+heal` (the reconciler's to say, not the gate's): another scope is not confirmed.
    assert confirmed(service_meta(annotations=HARD), "RoleSet") and confirmed(service_meta(annotations=HARD), "RoleSet" + MOVABLE)
    assert not confirmed(service_meta(annotations=HARD), "StormService")
    assert expiry_verdict(service_meta(annotations=HARD), "RoleSet" + MOVABLE) == "relist-refuted"
    # Labelled on every role: whether it stays listed (replicas of older, unlabelled templates) is the reconciler's
    # to say from its RoleSets; the gate confirms and keeps what was listed.
    labelled_service = with_roles(service_meta(annotations=HARD), {"metadata": {"labels": {OPTED_IN_LABEL: "true"}}})
    assert confirmed(labelled_service, "RoleSet") and expiry_verdict(labelled_service, "RoleSet") == "keep"
    assert not confirmed(with_roles(service_meta(), {"metadata": {"labels": {OPTED_IN_LABEL: "true"}}}), "RoleSet")  # opted out
    assert expiry_verdict(service_meta(), "RoleSet") == "unlist-refuted"
    # Never widened by the sweep (its read may be stale beside another replica's reconciler): kept.
    assert expiry_verdict(service_meta(annotations={**HARD, HEAL_ANNOTATION: "true"}), "RoleSet") == "keep"


# -- the opt-in label on role templates (pure) ---------------------------------------------------
def with_roles(svc: dict[str, Any], *templates: dict[str, Any] | None) -> dict[str, Any]:
    roles = [{"name": f"r{i}", **({"template": t} if t is not None else {})} for i, t in enumerate(templates)]
    svc["spec"] = {"template": {"spec": {"roles": roles}}}
    return svc


def apply_patch(obj: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """The few JSON patch "add" operations the mutating webhook writes, applied as the API server would."""
    out = json.loads(json.dumps(obj))
    for op in ops:
        assert op["op"] == "add"
        *parents, last = [k.replace("~1", "/").replace("~0", "~") for k in op["path"].split("/")[1:]]
        node: Any = out
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[last] = op["value"]
    return out


def test_a_new_opted_in_service_gets_the_label_on_every_role_template_and_keeps_its_own() -> None:
    """Issue 42, item 1: the create writes nothing but itself; every shape a role template comes in."""
    new = with_roles(service_meta(annotations=HARD), {"metadata": {"labels": {"app": "x"}}}, {"metadata": {}}, {}, None)
    assert not labelled(new) and listing(new) == "RoleSet"
    ops = opt_in_patch("CREATE", new, None)
    patched = apply_patch(new, ops)
    assert labelled(patched) and listing(patched) is None  # held by its label: nothing to list
    assert patched["spec"]["template"]["spec"]["roles"][0]["template"]["metadata"]["labels"] == {"app": "x", OPTED_IN_LABEL: "true"}
    assert opt_in_patch("CREATE", patched, None) == []  # reinvoked: nothing more
    assert opt_in_patch("CREATE", with_roles(service_meta(), {}), None) == []  # never opted in: untouched
    healing = with_roles(service_meta(annotations={**HARD, HEAL_ANNOTATION: "true"}), {"metadata": {"labels": {OPTED_IN_LABEL: "true"}}})
    assert listing(healing) == "RoleSet" + MOVABLE  # listed only for the eviction policy
    assert not labelled(service_meta(annotations=HARD))  # no roles: nothing held by a label, listed as before


def test_a_service_its_owner_labels_in_a_rollout_stays_listed_until_its_last_replica_of_the_old_templates_is_gone() -> None:
    """A service opted in by an update is held by its namespace's list; once its owner puts the label on its role
    templates (a rollout of its own), the label holds its new pods. AIBrix may still make pods of a replica of the
    old templates, which carry no label: listed until none is left."""
    from stormtopo.core.reconciliation import ServiceSnapshot, plan_stormservice
    from stormtopo.core.request import ClusterTiers

    labels = {"metadata": {"labels": {OPTED_IN_LABEL: "true"}}}
    rolled = with_roles(service_meta(annotations=HARD), labels, labels)

    def roleset(name: str, *templates: dict[str, Any]) -> dict[str, Any]:
        meta = {"name": name, "namespace": "ns", "uid": name}
        return {"metadata": meta, "spec": {"roles": [{"name": f"r{i}", "template": t} for i, t in enumerate(templates)]}}

    old, new = roleset("svc-old", {}, labels), roleset("svc-new", labels, labels)
    assert listing(rolled, None, [old, new]) == "RoleSet" and listing(rolled, None, [new]) is None and listing(rolled) is None
    assert listing(rolled, None, [{"metadata": {"name": "x"}, "spec": {}}]) == "RoleSet"  # (roles unknown: listed)
    during = plan_stormservice(ServiceSnapshot(rolled, (old, new), {}, ClusterTiers()))
    after = plan_stormservice(ServiceSnapshot(rolled, (new,), {}, ClusterTiers()))
    assert during.listing.scope == "RoleSet" and after.listing.scope is None


def test_an_update_keeps_the_label_only_where_the_stored_version_had_it_on_every_role() -> None:
    """A re-apply of a manifest without the label (server-side apply drops it) or a new role: labelled
    again, so the update rolls nothing. An opt-in by update: untouched (labelling would roll every
    replica), listed by the gate instead."""
    old = with_roles(service_meta(annotations=HARD), {"metadata": {"labels": {OPTED_IN_LABEL: "true"}}})
    reapplied = with_roles(service_meta(annotations=HARD), {"metadata": {"labels": {"app": "x"}}}, {})
    assert labelled(apply_patch(reapplied, opt_in_patch("UPDATE", reapplied, old)))
    plain_before = with_roles(service_meta(), {"metadata": {"labels": {"app": "x"}}})
    opting = with_roles(service_meta(annotations=HARD), {"metadata": {"labels": {"app": "x"}}})
    assert opt_in_patch("UPDATE", opting, plain_before) == []
    assert gate_listing("UPDATE", opting, plain_before, plain_before)[0] == "RoleSet"
    assert opt_in_patch("DELETE", reapplied, old) == []
    no_roles = with_roles(service_meta(annotations=HARD))  # created with none: the roles added later are labelled
    assert labelled(apply_patch(reapplied, opt_in_patch("UPDATE", reapplied, no_roles)))


# -- the bound and expiry (pure) -----------------------------------------------------------------
def test_unconfirmed_listings_are_bounded() -> None:
    pending = Unconfirmed(limit=3, ttl=10.0)
    for i in range(3):
        assert pending.has_room(f"ns.s{i}")
        assert pending.add(f"ns.s{i}", now=float(i))
    assert not pending.has_room("ns.s3")
    assert pending.has_room("ns.s1")  # already holding a slot
    pending.drop("ns.s0")
    assert pending.has_room("ns.s3")


def test_the_bound_is_per_namespace_under_a_total() -> None:
    """Issue 43, item 4: replays of the StormServices a tenant can read fill its own namespaces' slots only;
    another namespace's genuine opt-in still has room. A total bounds them all."""
    pending = Unconfirmed(limit=2, total=5, ttl=10.0)
    assert pending.add("a.s0", now=0.0) and pending.add("a.s1", now=0.0)
    assert not pending.has_room("a.s2") and pending.has_room("b.s0") and pending.has_room("ab.s0")
    assert pending.in_namespace("a.x") == 2 and pending.in_namespace("ab.x") == 0  # "a." is not a prefix of "ab."
    for key in ("b.s0", "b.s1", "c.s0"):
        assert pending.has_room(key) and pending.add(key, now=1.0)
    assert not pending.has_room("d.s0")  # the total
    pending.drop("c.s0")
    assert pending.has_room("d.s0")


def test_a_tenant_replaying_its_own_services_does_not_make_anothers_opt_in_retry() -> None:
    async def scenario() -> None:
        gate, api, cluster, _ = make_gate(limit=2)
        for name in ("r1", "r2"):  # replays in namespace "attacker": listed, never stored opted in
            assert await gate.review(opting_in(cluster, name, namespace="attacker")) is None
        refused = await gate.review(opting_in(cluster, "r3", namespace="attacker"))
        assert refused is not None and "of this namespace" in refused
        assert await gate.review(opting_in(cluster, "genuine", namespace="victim")) is None
        assert (api.data or {}).get("victim.genuine") == "RoleSet"

    asyncio.run(scenario())


def test_a_repeated_review_does_not_restart_the_clock() -> None:
    """Made-up reviews of one name, repeated, cannot keep it listed past the ttl."""
    pending = Unconfirmed(limit=3, ttl=10.0)
    assert pending.add("ns.a", now=0.0)
    assert not pending.add("ns.a", now=9.0)
    assert pending.due(10.0) == ["ns.a"]


def test_unconfirmed_listings_fall_due_after_the_ttl_oldest_first() -> None:
    pending = Unconfirmed(limit=10, ttl=10.0)
    pending.add("ns.b", now=2.0)
    pending.add("ns.a", now=1.0)
    pending.add("ns.c", now=5.0)
    assert pending.due(10.9) == []
    assert pending.due(11.0) == ["ns.a"]  # 10 s old: due
    assert pending.due(15.0) == ["ns.a", "ns.b", "ns.c"]
    assert Unconfirmed().ttl == CONFIRM_SECONDS and Unconfirmed().limit == UNCONFIRMED_LIMIT


def test_refuted_versions_are_remembered_within_a_bound() -> None:
    pending = Unconfirmed()
    pending.refute("ns.x", None)
    assert "ns.x" not in pending.refuted
    for i in range(REFUTED_LIMIT + 5):
        pending.refute(f"ns.s{i}", str(i))
    assert len(pending.refuted) == REFUTED_LIMIT
    assert "ns.s0" not in pending.refuted and pending.refuted[f"ns.s{REFUTED_LIMIT + 4}"] == str(REFUTED_LIMIT + 4)


# -- the Gate, with a fake API ---------------------------------------------------------------------
class FakeApi:
    """Every namespace's opted-in ConfigMap as the API server would keep them; counts writes (each a
    ConfigMap revision). `data` is what they list together, by opted_in_key (None: no list made yet)."""

    def __init__(self) -> None:
        self.lists: dict[str, dict[str, str]] = {}  # namespace -> its ConfigMap's data
        self.paths: list[str] = []  # the ConfigMaps written, by path
        self.writes = 0
        self.fail = False

    @property
    def data(self) -> dict[str, str] | None:
        if not self.lists:
            return None
        return {opted_in_key(ns, name): value for ns, listed in self.lists.items() for name, value in listed.items()}

    @data.setter
    def data(self, value: Mapping[str, str] | None) -> None:
        self.lists = {}
        for key, scope in (value or {}).items():
            namespace, name = split_key(key)
            self.lists.setdefault(namespace, {})[name] = scope

    def raw_list(self, path: str, **_: str) -> list[dict[str, Any]]:
        return [{"metadata": {"name": "stormtopo-opted-in", "namespace": ns}, "data": dict(d)} for ns, d in self.lists.items()]

    def request(self, method: str, path: str, body: Any = None, content_type: str = "", **_: str) -> Any:
        if self.fail:
            raise ApiError.of(500, method, path, "etcdserver: request timed out")
        namespace = path.split("/namespaces/")[1].split("/")[0]
        listed = self.lists.get(namespace)
        if method == "GET":
            if listed is None:
                raise ApiError.of(404, method, path, "not found")
            return {"data": dict(listed)}
        if method == "PATCH":
            if listed is None:
                raise ApiError.of(404, method, path, "not found")
            changed = dict(listed)
        else:  # POST: create
            if listed is not None:
                raise ApiError.of(409, method, path, "exists")
            changed = {}
        for key, value in (body or {}).get("data", {}).items():
            if value is None:
                changed.pop(key, None)
            else:
                changed[key] = value
        if changed != listed or (body or {}).get("metadata"):  # the gate's mark is a new revision too
            self.writes += 1
        self.lists[namespace] = changed
        self.paths.append(path)
        return {"data": dict(changed)}


class Cluster:
    """StormServices as the index and the API server see them (the index may lag)."""

    def __init__(self) -> None:
        self.index: dict[tuple[str, str], dict[str, Any]] = {}
        self.stored: dict[tuple[str, str], dict[str, Any]] = {}
        self.reads = 0

    def put(self, obj: dict[str, Any], indexed: bool = True) -> None:
        key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        self.stored[key] = obj
        if indexed:
            self.index[key] = obj

    def indexed(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.index.get((namespace, name))

    async def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.reads += 1
        return self.stored.get((namespace, name))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_gate(limit: int = 4, room_wait: float = 0.0) -> tuple[Gate, FakeApi, Cluster, Clock]:
    api, cluster, clock = FakeApi(), Cluster(), Clock()
    gate = Gate(OptedInList(api), cluster.indexed, cluster.read, Unconfirmed(limit=limit, ttl=10.0), clock, room_wait)  # type: ignore[arg-type]
    return gate, api, cluster, clock


def review(operation: str, obj: dict[str, Any], old: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {"uid": "r", "operation": operation, "namespace": obj["metadata"]["namespace"], "object": obj, "oldObject": old, **extra}


def opting_in(cluster: Cluster | None, name: str, namespace: str = "ns", indexed: bool = True) -> dict[str, Any]:
    """The review of an update that opts a plain StormService in (stored at version 7, put in `cluster`)."""
    old = service_meta(name, version="7", uid=f"u-{name}")
    old["metadata"]["namespace"] = namespace
    if cluster is not None:
        cluster.put(old, indexed)
    new = service_meta(name, HARD, version="7", uid=f"u-{name}")
    new["metadata"]["namespace"] = namespace
    return review("UPDATE", new, old)


def opted_in(name: str, version: str = "8") -> dict[str, Any]:
    """The StormService as stored once the update of `opting_in` happened."""
    return service_meta(name, HARD, version=version, uid=f"u-{name}")


def test_made_up_creates_list_nothing_read_nothing_and_take_no_room() -> None:
    """Issues 42 and 43: a thousand creates made up for names nobody uses (or genuine ones) cost no
    write, no API read and no room among the unconfirmed listings; a genuine opt-in by update goes on."""

    async def scenario() -> None:
        gate, api, cluster, _ = make_gate(limit=4)
        answers = [await gate.review(review("CREATE", service_meta(f"made-up-{i}", HARD))) for i in range(1000)]
        assert answers == [None] * 1000
        assert api.data is None and api.writes == 0 and cluster.reads == 0 and gate.unconfirmed.since == {}
        # With roles that reached the gate unlabelled (no policy or webhook labelled them): refused, and still nothing written.
        refused = await gate.review(review("CREATE", with_roles(service_meta("unlabelled", HARD), {})))
        assert refused is not None and OPTED_IN_LABEL in refused and "feature gate" in refused
        labelled_roles = with_roles(service_meta("labelled", HARD), {"metadata": {"labels": {OPTED_IN_LABEL: "true"}}})
        assert await gate.review(review("CREATE", labelled_roles)) is None
        assert api.data is None and api.writes == 0 and cluster.reads == 0
        assert await gate.review(opting_in(cluster, "real")) is None
        assert api.data == {"ns.real": "RoleSet"}

    asyncio.run(scenario())


def test_an_opt_in_is_confirmed_by_its_watch_event_and_frees_its_slot() -> None:
    async def scenario() -> None:
        gate, api, cluster, clock = make_gate(limit=1)
        assert await gate.review(opting_in(cluster, "real")) is None
        assert api.data == {"ns.real": "RoleSet"}
        cluster.put(opted_in("real"))  # its MODIFIED event
        assert await gate.review(opting_in(cluster, "another")) is None  # the slot was freed
        clock.now += 30.0
        cluster.put(opted_in("another"), indexed=False)  # stored, its event late: the API read confirms it
        await gate.sweep()
        assert api.data == {"ns.real": "RoleSet", "ns.another": "RoleSet"}

    asyncio.run(scenario())


def test_each_namespace_keeps_its_own_list_and_the_policy_reads_the_pods_own() -> None:
    """Issue 42, item 1: a listing is one small patch of its own namespace's list, whatever other
    namespaces hold; the pods policy's paramRef names no namespace (the API server reads the list of
    the pod's namespace) and looks the pod's StormService up by its name."""

    async def scenario() -> None:
        gate, api, cluster, _ = make_gate(limit=8)
        for namespace in ("team-a", "team-b"):
            assert await gate.review(opting_in(cluster, "svc", namespace)) is None
        assert api.lists == {"team-a": {"svc": "RoleSet"}, "team-b": {"svc": "RoleSet"}}
        assert set(api.paths) == {f"/api/v1/namespaces/{ns}/configmaps" for ns in ("team-a", "team-b")}  # created, each its own

    asyncio.run(scenario())
    policy, binding = admission_policy()[2:4]
    assert binding["spec"]["paramRef"] == {"name": "stormtopo-opted-in", "parameterNotFoundAction": "Allow"}
    key = next(v["expression"] for v in policy["spec"]["variables"] if v["name"] == "key")
    assert "object.metadata.namespace" not in key and "['storm-service-name']" in key


def test_a_burst_beyond_the_bound_waits_for_the_watch_instead_of_being_refused() -> None:
    """Issue 42, item 2: a burst is not an attack. With the unconfirmed listings at their bound, an opt-in
    waits (up to ROOM_WAIT) for the watch to confirm one, and is listed; beyond that it is refused."""

    async def scenario() -> None:
        gate, api, cluster, _ = make_gate(limit=1, room_wait=2.0)
        assert await gate.review(opting_in(cluster, "first")) is None

        async def its_watch_event() -> None:
            await asyncio.sleep(0.2)
            cluster.put(opted_in("first"))  # stored and watched: confirms the first listing

        event = asyncio.create_task(its_watch_event())
        assert await gate.review(opting_in(cluster, "second")) is None  # waited, then listed
        await event
        assert api.data == {"ns.first": "RoleSet", "ns.second": "RoleSet"}
        refused = await gate.review(opting_in(cluster, "third"))  # nothing confirms "second"
        assert refused is not None and "not confirmed yet" in refused

    asyncio.run(scenario())


def test_a_burst_that_outruns_a_lagging_watch_is_confirmed_by_reading_the_oldest_listings() -> None:
    """A replica just started (or a loaded API server) can lag seconds behind a bulk apply: found on the
    real control plane, a rolling restart during a bulk apply of 200 had creates refused. While a review
    waits for room, the sweep reads the oldest listings from the API server and confirms those stored as
    claimed; a made-up name reads as not found and keeps its slot, so the bound still holds."""

    async def scenario() -> None:
        gate, api, cluster, clock = make_gate(limit=2, room_wait=2.0)
        for name in ("first", "second"):
            assert await gate.review(opting_in(cluster, name)) is None
            cluster.put(opted_in(name), indexed=False)  # stored; its watch event not delivered yet
        await gate.sweep()
        reads = cluster.reads
        await gate.sweep()
        assert cluster.reads == reads  # nobody waits for room: nothing is read before the listings fall due
        clock.now += 1.0
        sweeping = asyncio.create_task(gate.run(interval=0.05))
        try:
            assert await gate.review(opting_in(cluster, "third")) is None  # waited, then listed
        finally:
            sweeping.cancel()
        assert api.data == {"ns.first": "RoleSet", "ns.second": "RoleSet", "ns.third": "RoleSet"}
        assert set(gate.unconfirmed.since) == {"ns.third"}

        gate, api, cluster, clock = make_gate(limit=1, room_wait=0.3)
        assert await gate.review(opting_in(cluster, "refused-after")) is None  # never stored with its request
        clock.now += 1.0
        reads = cluster.reads
        sweeping = asyncio.create_task(gate.run(interval=0.05))
        try:
            refused = await gate.review(opting_in(cluster, "genuine"))
        finally:
            sweeping.cancel()
        assert refused is not None and "not confirmed yet" in refused
        assert set(gate.unconfirmed.since) == {"ns.refused-after"}
        assert cluster.reads - reads == 1  # the listing read once: again only after READ_AGAIN

        # Listings never confirmed do not keep the genuine ones behind them from being read: each is read
        # again only after READ_AGAIN, the next oldest meanwhile.
        gate, api, cluster, clock = make_gate(limit=16, room_wait=2.0)
        for i in range(8):
            assert await gate.review(opting_in(cluster, f"rejected-{i}")) is None
        clock.now += 0.1
        for i in range(8):
            assert await gate.review(opting_in(cluster, f"genuine-{i}")) is None
            cluster.put(opted_in(f"genuine-{i}"), indexed=False)
        clock.now += 1.0
        sweeping = asyncio.create_task(gate.run(interval=0.05))
        try:
            assert await gate.review(opting_in(cluster, "next")) is None
        finally:
            sweeping.cancel()
        assert not any(k.startswith("ns.genuine") for k in gate.unconfirmed.since)

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("namespace", "name"),
    [("victim/configmaps/stormtopo-opted-in#", "realsvc"), ("ns", "a/../../b"), ("NS", "svc"), ("ns", "svc?x=1"), ("n" * 64, "svc")],
)
def test_a_review_naming_no_valid_namespace_or_stormservice_lists_nothing_anywhere(namespace: str, name: str) -> None:
    """Review of issue 42's change: what a review names goes into request paths, so a made-up namespace
    such as "victim/configmaps/stormtopo-opted-in#" must not reach another namespace's list."""

    async def scenario() -> None:
        gate, api, cluster, _ = make_gate()
        forged = service_meta(name, HARD)
        forged["metadata"]["namespace"] = namespace
        assert await gate.review(review("CREATE", forged)) is None
        assert api.data is None and api.paths == [] and cluster.reads == 0

    asyncio.run(scenario())


def test_stale_listings_of_a_namespace_go_in_one_write_however_many() -> None:
    """A list a tenant filled with junk costs one write per resync, not one per key."""
    api = FakeApi()
    api.data = {**{f"ns.junk-{i}": "RoleSet" for i in range(1000)}, "ns.real": "RoleSet"}
    listed = OptedInList(api)  # type: ignore[arg-type]
    listed.refresh()
    asyncio.run(listed.unlist("ns", [f"junk-{i}" for i in range(1000)]))
    assert api.data == {"ns.real": "RoleSet"} and api.writes == 1 and listed.listed == {"ns.real": "RoleSet"}
    asyncio.run(listed.unlist("gone", ["x"]))  # no list in that namespace: nothing to take out, nothing written
    assert api.writes == 1


def test_a_forged_create_or_stale_update_of_another_tenants_service_lists_nothing() -> None:
    async def scenario() -> None:
        gate, api, cluster, _ = make_gate()
        plain = service_meta("plain", version="42", uid="u-plain")
        cluster.put(plain)
        assert await gate.review(review("CREATE", service_meta("plain", HARD))) is None
        for old in (service_meta("plain", version="41", uid="u-plain"), service_meta("plain", version="42", uid="guessed"), None):
            assert await gate.review(review("UPDATE", service_meta("plain", HARD, version="42"), old)) is None
        assert api.data is None and api.writes == 0

    asyncio.run(scenario())


def test_a_sweep_whose_read_was_overtaken_judges_nothing() -> None:
    """The listing is confirmed (or claimed again) while the sweep reads the API server: what it read
    then says nothing of the listing now, and it is left alone."""

    async def scenario() -> None:
        gate, api, cluster, clock = make_gate()
        assert await gate.review(opting_in(cluster, "svc")) is None  # claimed for u-svc
        cluster.put(service_meta("svc", version="3", uid="u-tenant"))  # deleted and made again, plain: contradicted
        real_read = cluster.read

        async def read_while_it_opts_in(namespace: str, name: str) -> dict[str, Any] | None:
            found = await real_read(namespace, name)
            gate.stored = real_read
            opted = service_meta("svc", HARD, version="4", uid="u-tenant")
            assert await gate.review(review("UPDATE", opted, service_meta("svc", version="3", uid="u-tenant"))) is None
            cluster.put(opted)  # stored, and its event confirms the listing at the next review
            assert await gate.review(opting_in(cluster, "other")) is None
            assert "ns.svc" not in gate.unconfirmed.since
            return found

        gate.stored = read_while_it_opts_in
        clock.now += 0.5
        await gate.sweep()
        assert (api.data or {}).get("ns.svc") == "RoleSet"  # the genuine opt-in stays listed

    asyncio.run(scenario())


def test_a_change_still_being_written_is_not_skipped_as_already_so() -> None:
    """An unlisting under way, then the service asks again: written, though the last completed write
    still says it is listed."""
    import threading

    class HeldApi(FakeApi):
        def __init__(self) -> None:
            super().__init__()
            self.release = threading.Event()

        def request(self, method: str, path: str, body: Any = None, content_type: str = "", **kw: str) -> Any:
            self.release.wait(5)
            return super().request(method, path, body, content_type, **kw)

    async def scenario() -> None:
        api = HeldApi()
        api.data = {"ns.x": "RoleSet"}
        listed = OptedInList(api)  # type: ignore[arg-type]
        api.release.set()
        listed.refresh()
        api.release.clear()
        unlisting = asyncio.create_task(listed.record("ns", "x", None))
        await asyncio.sleep(0.05)
        again = asyncio.create_task(listed.record("ns", "x", "RoleSet"))
        await asyncio.sleep(0.05)
        api.release.set()
        await asyncio.gather(unlisting, again)
        assert api.data == {"ns.x": "RoleSet"} and listed.current("ns.x") == "RoleSet"

    asyncio.run(scenario())


def test_a_genuine_opt_in_is_not_taken_back_while_the_watch_lags_a_recreate() -> None:
    """The watch may still show a StormService of the name deleted before the new one (another uid, no
    request) when the new one's genuine opt-in is listed: the API server's answer decides, and keeps it."""

    async def scenario() -> None:
        gate, api, cluster, clock = make_gate()
        cluster.put(service_meta("svc", version="3", uid="u-old"))  # the old one, as the lagging watch still has it
        assert await gate.review(opting_in(cluster, "svc", indexed=False)) is None  # read from the API server
        cluster.put(opted_in("svc"), indexed=False)
        clock.now += 0.5
        await gate.sweep()
        assert api.data == {"ns.svc": "RoleSet"} and "ns.svc" in gate.unconfirmed.since

    asyncio.run(scenario())


def test_a_review_without_annotations_never_unlists() -> None:
    async def scenario() -> None:
        gate, api, cluster, _ = make_gate()
        api.data = {"ns.opted": "RoleSet"}
        cluster.put(service_meta("opted", HARD, version="3"))
        assert await gate.review(review("UPDATE", service_meta("opted", version="3"), service_meta("opted", HARD, version="3"))) is None
        assert await gate.review(review("CREATE", service_meta("opted"))) is None
        assert api.data == {"ns.opted": "RoleSet"} and api.writes == 0

    asyncio.run(scenario())


def test_an_update_of_the_stored_version_is_listed_also_when_the_index_lags() -> None:
    async def scenario() -> None:
        gate, api, cluster, _ = make_gate()
        cluster.put(service_meta("svc", version="5"))
        cluster.put(service_meta("svc", version="6"), indexed=False)  # the index still holds 5
        assert await gate.review(review("UPDATE", service_meta("svc", HARD, version="6"), service_meta("svc", version="6"))) is None
        assert api.data == {"ns.svc": "RoleSet"} and cluster.reads == 1

    asyncio.run(scenario())


def test_a_replayed_update_is_taken_back_and_never_listed_again() -> None:
    """Someone who can read another tenant's StormService forges an update with its current version:
    listed until the watch has shown, UPDATE_LAG after, that no update came (the service still at the
    version the review named as old), then taken back, and that version is never listed again. A genuine
    update whose watch event lags is not taken back: the stored service has moved on."""

    async def scenario() -> None:
        gate, api, cluster, clock = make_gate()
        plain = service_meta("plain", version="9")
        cluster.put(plain)
        forged = review("UPDATE", service_meta("plain", HARD, version="9"), service_meta("plain", version="9"))
        assert await gate.review(forged) is None
        assert api.data == {"ns.plain": "RoleSet"}
        writes = api.writes
        assert await gate.review(forged) is None and api.writes == writes  # repeated at once: no ConfigMap rewrite
        clock.now += UPDATE_LAG - 0.5
        # Repeated later (or the owner's own opt-in from that version): written again with a new mark, so the
        # pod webhook does not take the genuine one for a listing over a second old.
        assert await gate.review(forged) is None and api.writes == writes + 1
        await gate.sweep()
        assert api.data == {"ns.plain": "RoleSet"}  # a moment: the update may be on its way
        clock.now += 0.5
        await gate.sweep()
        assert api.data == {}  # UPDATE_LAG, not CONFIRM_SECONDS
        assert await gate.review(forged) is None
        assert api.data == {}
        cluster.put(service_meta("plain", HARD, version="10"))  # a real opt-in later: a new version, listed
        assert await gate.review(review("UPDATE", service_meta("plain", HARD, version="10"), service_meta("plain", version="10"))) is None
        assert api.data == {"ns.plain": "RoleSet"}

        gate, api, cluster, clock = make_gate()
        cluster.put(service_meta("slow", version="3"))
        assert await gate.review(review("UPDATE", service_meta("slow", HARD, version="3"), service_meta("slow", version="3"))) is None
        cluster.put(service_meta("slow", HARD, version="4"), indexed=False)  # stored; its watch event late
        clock.now += UPDATE_LAG + 1.0
        await gate.sweep()
        assert api.data == {"ns.slow": "RoleSet"}  # the update happened: kept
        reads = cluster.reads
        await gate.sweep()
        assert cluster.reads == reads  # and not read again while its watch event is late

    asyncio.run(scenario())


def test_the_gate_never_lists_heal_so_no_review_makes_pods_evictable() -> None:
    """Issue 43: `+heal` (what lets the eviction policy evict a service's pods) is the reconciler's to write,
    from the stored StormService and its namespace. A forged update adding `stormtopo.io/heal` to an opted-in
    service lists nothing new; a genuine opt-in that asks for healing is listed with its scope only."""

    async def scenario() -> None:
        gate, api, cluster, _ = make_gate()
        stored = service_meta("placed", HARD, version="4")
        cluster.put(stored)
        api.data = {"ns.placed": "RoleSet"}
        forged = review("UPDATE", service_meta("placed", {**HARD, HEAL_ANNOTATION: "true"}, version="4"), stored)
        assert await gate.review(forged) is None
        assert api.data == {"ns.placed": "RoleSet"} and api.writes == 0
        heals = opting_in(cluster, "healer")
        heals["object"]["metadata"]["annotations"][HEAL_ANNOTATION] = "true"
        assert await gate.review(heals) is None
        assert api.data == {"ns.placed": "RoleSet", "ns.healer": "RoleSet"}
        assert gate_listing("UPDATE", heals["object"], heals["oldObject"], heals["oldObject"])[0] == "RoleSet"

    asyncio.run(scenario())


def test_a_burst_in_one_namespace_goes_in_a_few_writes_and_each_caller_returns_once_its_change_is_written() -> None:
    """Issue 42, item 2: what is recorded while a write of the namespace's list is under way goes in the
    next write, together; a failure is every caller's of that write."""
    import threading

    class SlowApi(FakeApi):
        def __init__(self) -> None:
            super().__init__()
            self.release = threading.Event()
            self.bodies: list[Any] = []

        def request(self, method: str, path: str, body: Any = None, content_type: str = "", **kw: str) -> Any:
            self.release.wait(5)
            self.bodies.append((method, (body or {}).get("data")))
            return super().request(method, path, body, content_type, **kw)

    async def scenario() -> None:
        api = SlowApi()
        listed = OptedInList(api)  # type: ignore[arg-type]
        first = asyncio.create_task(listed.record("ns", "s0", "RoleSet"))
        await asyncio.sleep(0.05)  # its write is under way (held): the next 20 gather
        rest = [asyncio.create_task(listed.record("ns", f"s{i}", "RoleSet")) for i in range(1, 21)]
        await asyncio.sleep(0.05)
        assert not any(t.done() for t in [first, *rest])  # nobody returns before its change is written
        api.release.set()
        await asyncio.gather(first, *rest)
        assert api.data == {f"ns.s{i}": "RoleSet" for i in range(21)}
        assert [m for m, _ in api.bodies] == ["PATCH", "POST", "PATCH"]  # none yet: created with s0; then the 20 in one
        assert api.bodies[2][1] == {f"s{i}": "RoleSet" for i in range(1, 21)}
        assert listed._writers == {} and listed._open == {}  # nothing kept per namespace once written
        api.fail = True
        failing = [asyncio.create_task(listed.record("ns", f"t{i}", "RoleSet")) for i in range(3)]
        results = await asyncio.gather(*failing, return_exceptions=True)
        assert all(isinstance(r, ApiError) for r in results)  # the gate refuses each of them

    asyncio.run(scenario())


def test_a_failed_write_refuses_and_releases_its_slot() -> None:
    async def scenario() -> None:
        gate, api, cluster, _ = make_gate(limit=1)
        api.fail = True
        answer = await gate.review(opting_in(cluster, "a"))
        assert answer is not None and "retry" in answer
        assert gate.unconfirmed.since == {}
        api.fail = False
        assert await gate.review(opting_in(cluster, "a")) is None

    asyncio.run(scenario())


def test_a_dry_run_lists_nothing() -> None:
    async def scenario() -> None:
        gate, api, cluster, _ = make_gate()
        assert await gate.review({**opting_in(cluster, "a"), "dryRun": True}) is None
        assert api.data is None

    asyncio.run(scenario())


def test_the_sweep_survives_a_failing_api_server() -> None:
    async def scenario() -> None:
        gate, api, cluster, clock = make_gate()
        assert await gate.review(opting_in(cluster, "a")) is None  # and the update never comes
        clock.now += 20.0
        api.fail = True
        running = asyncio.create_task(gate.run(interval=0.01))
        await asyncio.sleep(0.05)
        assert not running.done() and "ns.a" in gate.unconfirmed.since  # kept: retried next time
        api.fail = False
        for _ in range(200):  # the retry comes after a backoff doubling from the interval: wait for it
            if api.data == {}:
                break
            await asyncio.sleep(0.01)
        assert api.data == {} and gate.unconfirmed.since == {}
        running.cancel()

    asyncio.run(scenario())


# -- the webhook over TLS, with and without a client CA ------------------------------------------
class FakeIndex:
    def __init__(self, api: FakeApi) -> None:
        self.api = api
        self.stormservices: dict[tuple[str, str], dict[str, Any]] = {}
        self.podgroups: dict[str, dict[str, Any]] = {}
        self.asked: list[str] = []

    async def owners_of(self, obj: Mapping[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        return {"metadata": {"name": "svc-roleset-1", "namespace": "ns"}, "spec": {}}, self.stormservices.get(("ns", "svc"))

    def cluster_tiers(self) -> None:
        return None

    async def service_of_group(self, namespace: str, group: str) -> str | None:
        return None

    async def read_podgroup(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.asked.append(name)
        return self.podgroups.get(name)


def _tls_files(tmp_path: Path) -> tuple[str, str, certificates.KeyPair, certificates.KeyPair]:
    server_ca = certificates.new_ca("server-ca")
    serving = certificates.new_serving_cert(server_ca, "webhook", ["127.0.0.1"])
    (tmp_path / "tls.crt").write_bytes(serving.cert_pem)
    (tmp_path / "tls.key").write_bytes(serving.key_pem)
    client_ca = certificates.new_ca("client-ca")
    (tmp_path / "client-ca.crt").write_bytes(client_ca.cert_pem)
    return str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"), server_ca, client_ca


def _post(port: int, path: str, body: dict[str, Any], server_ca: bytes, client: certificates.KeyPair | None, tmp: Path) -> dict[str, Any]:
    context = ssl.create_default_context(cadata=server_ca.decode())
    if client is not None:
        (tmp / "c.crt").write_bytes(client.cert_pem)
        (tmp / "c.key").write_bytes(client.key_pem)
        context.load_cert_chain(str(tmp / "c.crt"), str(tmp / "c.key"))
    req = urllib.request.Request(
        f"https://127.0.0.1:{port}{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, context=context, timeout=10) as answer:
        return dict(json.loads(answer.read())["response"])


def _serve(app: web.Application, context: ssl.SSLContext, port: int) -> tuple[asyncio.AbstractEventLoop, web.AppRunner]:
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port, ssl_context=context).start())
    return loop, runner


@pytest.mark.timeout(60)
def test_with_a_client_ca_the_gate_answers_only_callers_with_its_certificate(tmp_path: Path) -> None:
    cert, key, server_ca, client_ca = _tls_files(tmp_path)
    api = FakeApi()
    index = FakeIndex(api)
    cluster = Cluster()
    gate = Gate(OptedInList(api), cluster.indexed, cluster.read)  # type: ignore[arg-type]
    app = webhook.build_app(index, OptedInList(api), client_ca=str(tmp_path / "client-ca.crt"), gate=gate)  # type: ignore[arg-type]
    context = webhook.tls_context(cert, key, client_ca=str(tmp_path / "client-ca.crt"))
    port = processes.free_port()
    loop, runner = _serve(app, context, port)
    stranger_ca = certificates.new_ca("stranger")
    try:
        body = {"request": opting_in(cluster, "new")}

        def post(client: certificates.KeyPair | None) -> dict[str, Any]:
            return loop.run_until_complete(
                asyncio.to_thread(_post, port, webhook.STORMSERVICES_PATH, body, server_ca.cert_pem, client, tmp_path)
            )

        refused = post(None)
        assert not refused["allowed"] and "presented none" in refused["status"]["message"]
        assert api.data is None
        with pytest.raises((ssl.SSLError, OSError)):  # a certificate from another CA fails the handshake
            post(certificates.new_client_cert(stranger_ca, "someone"))
        assert post(certificates.new_client_cert(client_ca, "kube-apiserver"))["allowed"]
        assert api.data == {"ns.new": "RoleSet"}
        # The mutating webhooks answer without a certificate: they write nothing.
        pod = {"metadata": {"name": "p", "namespace": "ns", "labels": {"storm-service-name": "svc"}}}
        answer = loop.run_until_complete(
            asyncio.to_thread(_post, port, webhook.PODS_PATH, {"request": {"uid": "p", "object": pod}}, server_ca.cert_pem, None, tmp_path)
        )
        assert answer["allowed"]
    finally:
        loop.run_until_complete(runner.cleanup())
        loop.close()


async def _absent(namespace: str, name: str) -> None:
    return None


@pytest.mark.timeout(60)
def test_the_pod_webhook_passes_the_podgroup_of_the_gang_the_pod_joins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the request's validity, admit_pod sees the PodGroup of the gang its scope makes the pod
    join (the replica's, or the StormService's), and no other is read: a RoleSet-scope admission must
    not miss the index, and read through, for a service PodGroup that never exists."""
    seen: list[Mapping[str, Any]] = []

    def fake_admit_pod(
        pod: Any,
        roleset: Any,
        stormservice: Any,
        tiers: Any,
        owner: Any,
        podgroups: Mapping[str, Any],
        exact_preemption: bool = False,
        narrowing: bool = False,
    ) -> Any:
        seen.append(dict(podgroups))
        return Decision()

    monkeypatch.setattr(webhook, "admit_pod", fake_admit_pod)
    cert, key, server_ca, _ = _tls_files(tmp_path)
    api = FakeApi()
    index = FakeIndex(api)
    index.podgroups = {"svc-roleset-1": {"metadata": {"name": "svc-roleset-1"}}, "svc": {"metadata": {"name": "svc"}}}
    app = webhook.build_app(index, OptedInList(api), client_ca="")  # type: ignore[arg-type]
    port = processes.free_port()
    loop, runner = _serve(app, webhook.tls_context(cert, key, client_ca=""), port)
    pod = {"metadata": {"name": "p", "namespace": "ns", "labels": {"storm-service-name": "svc", "roleset-name": "svc-roleset-1"}}}

    def admit() -> None:
        body = {"request": {"uid": "p", "object": pod}}
        loop.run_until_complete(asyncio.to_thread(_post, port, webhook.PODS_PATH, body, server_ca.cert_pem, None, tmp_path))

    try:
        for annotations, gang in (
            (HARD, "svc-roleset-1"),  # valid
            ({MODE: "hard"}, "svc-roleset-1"),  # invalid, scope RoleSet
            ({MODE: "hard", HIGHEST_TIER: "9", SCOPE: "StormService"}, "svc"),  # invalid, scope StormService as written
        ):
            index.stormservices[("ns", "svc")] = service_meta("svc", annotations)
            admit()
            assert set(seen[-1]) == {gang}
        index.podgroups = {}
        admit()
        assert seen[-1] == {}  # none known: none passed
        index.stormservices[("ns", "svc")] = service_meta("svc")  # not opted in: no lookups
        index.asked.clear()
        admit()
        assert seen[-1] == {} and index.asked == []
    finally:
        loop.run_until_complete(runner.cleanup())
        loop.close()


@pytest.mark.timeout(60)
def test_the_pod_webhook_holds_at_the_room_gate_only_while_a_leader_is_known(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Narrowing and exact preemption hold a pod until the leader lets it go: with no leader known to the replica
    answering (a follower whose Lease view has gone stale, a draining leader), the pod goes as it is."""
    seen: list[tuple[bool, bool]] = []

    def fake_admit_pod(*args: Any, exact_preemption: bool = False, narrowing: bool = False) -> Any:
        seen.append(args[6:8] if len(args) > 6 else (exact_preemption, narrowing))
        return Decision()

    monkeypatch.setattr(webhook, "admit_pod", fake_admit_pod)
    cert, key, server_ca, _ = _tls_files(tmp_path)
    api = FakeApi()
    index = FakeIndex(api)
    index.stormservices[("ns", "svc")] = service_meta("svc", HARD)
    known = [True]
    app = webhook.build_app(index, OptedInList(api), client_ca="", exact_preemption=True, narrowing=True, leader_known=lambda: known[0])  # type: ignore[arg-type]
    port = processes.free_port()
    loop, runner = _serve(app, webhook.tls_context(cert, key, client_ca=""), port)
    pod = {"metadata": {"name": "p", "namespace": "ns", "labels": {"storm-service-name": "svc", "roleset-name": "svc-roleset-1"}}}
    try:
        for leader in (True, False, True):
            known[0] = leader
            body = {"request": {"uid": "p", "object": pod}}
            loop.run_until_complete(asyncio.to_thread(_post, port, webhook.PODS_PATH, body, server_ca.cert_pem, None, tmp_path))
        assert seen == [(True, True), (False, False), (True, True)]
    finally:
        loop.run_until_complete(runner.cleanup())
        loop.close()


def test_dev_up_hands_the_operator_the_client_ca(tmp_path: Path) -> None:
    (tmp_path / "pki").mkdir()
    assert webhook.CLIENT_CA_ENV not in operator_env(tmp_path)
    config = webhook_auth.write(tmp_path / "pki")
    assert operator_env(tmp_path)[webhook.CLIENT_CA_ENV] == str(tmp_path / "pki" / webhook_auth.CLIENT_CA)
    assert "WebhookAdmissionConfiguration" in config.read_text()


def test_while_draining_every_answer_closes_its_connection() -> None:
    """A stopping replica answers, and closes each connection after its answer: the API server's next
    review opens a new connection, to a replica that stays (docs/failures.md, Leader lost)."""
    from aiohttp.test_utils import TestClient, TestServer

    async def scenario() -> None:
        api = FakeApi()
        draining = False
        gate = Gate(OptedInList(api), lambda ns, n: None, _absent)  # type: ignore[arg-type]
        app = webhook.build_app(FakeIndex(api), OptedInList(api), client_ca="", gate=gate, draining=lambda: draining)  # type: ignore[arg-type]
        async with TestClient(TestServer(app)) as client:
            body = {"request": review("CREATE", service_meta("new", HARD), dryRun=True)}
            answered = await client.post(webhook.STORMSERVICES_PATH, json=body)
            assert (await answered.json())["response"]["allowed"] and answered.headers.get("Connection", "").lower() != "close"
            draining = True
            answered = await client.post(webhook.STORMSERVICES_PATH, json=body)
            assert (await answered.json())["response"]["allowed"] and answered.headers.get("Connection", "").lower() == "close"

    asyncio.run(scenario())


def test_the_lists_as_watched_follow_each_namespaces_configmap_and_say_since_when() -> None:
    now = [100.0]
    seen = ListsSeen(clock=lambda: now[0])
    seen.on_event(None, {"metadata": {"name": "stormtopo-opted-in", "namespace": "a"}, "data": {"svc": "RoleSet"}})
    now[0] = 105.0
    seen.on_event(
        "MODIFIED", {"metadata": {"name": "stormtopo-opted-in", "namespace": "a"}, "data": {"svc": "RoleSet", "x": "RoleSet+heal"}}
    )
    assert seen.listed_since("a", "svc") == 100.0 and seen.listed_since("a", "x") == 105.0  # kept from when first seen
    assert seen.listed_since("b", "svc") is None
    seen.on_event("MODIFIED", {"metadata": {"name": "stormtopo-opted-in", "namespace": "a"}})  # emptied
    assert seen.listed_since("a", "svc") is None
    seen.on_event(None, {"metadata": {"name": "stormtopo-opted-in", "namespace": "a"}, "data": {"svc": "RoleSet"}})
    seen.on_gone(("a", "stormtopo-opted-in"))  # deleted while the watch was down
    assert seen.listed_since("a", "svc") is None
    seen.on_event(None, {"metadata": {"namespace": "b"}, "data": {"svc": "RoleSet"}})
    seen.on_event("DELETED", {"metadata": {"namespace": "b"}})
    assert seen.listed_since("b", "svc") is None
    # A tenant's own list, filled with junk: a bounded number of names kept.
    seen.on_event(None, {"metadata": {"namespace": "t"}, "data": {f"n{i:06d}": "RoleSet" for i in range(NAMES_KEPT + 10)}})
    assert seen.listed_since("t", "n000000") is not None and seen.listed_since("t", f"n{NAMES_KEPT + 5:06d}") is None


def test_a_followers_old_copy_of_a_listing_is_not_taken_for_one() -> None:
    """Only the leader's resync refreshes `listed`: a follower's gate once listed a service that has opted out
    since; the watch no longer shows it, and it is not taken for listed (no read per pod for ever)."""
    opted_in = OptedInList(FakeApi())  # type: ignore[arg-type]
    opted_in.listed["ns.svc"] = "RoleSet"
    assert opted_in.listed_since("ns", "svc") is None
    opted_in.seen.on_event("MODIFIED", {"metadata": {"namespace": "ns"}, "data": {"svc": "RoleSet"}})
    assert opted_in.listed_since("ns", "svc") is not None


class StoredApi(FakeApi):
    """The API server's copy of one StormService, as the pod webhook reads it; counts the reads."""

    def __init__(self) -> None:
        super().__init__()
        self.stored: dict[str, Any] | None = None
        self.reads = 0
        self.read_at: list[float] = []
        self.fail = False
        self.delay = 0.0

    def get(self, *_: Any) -> dict[str, Any] | None:
        self.reads += 1
        self.read_at.append(time.monotonic())
        stored = self.stored  # as stored when the read reached the API server
        time.sleep(self.delay)
        if self.fail:
            raise ApiError.of(503, "GET", "/x", "unavailable")
        return stored


ADMITTED = {"op": "add", "path": "/metadata/labels/stormtopo.io~1admitted", "value": "true"}


def _pod(labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "labels": {"storm-service-name": "svc", "roleset-name": "svc-roleset-1", **(labels or {})},
        }
    }


def _pod_webhook(scenario: Callable[[Any, StoredApi, OptedInList], Awaitable[None]]) -> None:
    """Run `scenario(client, api, opted_in)` against the pod webhook of an index where svc asks for nothing."""
    from aiohttp.test_utils import TestClient, TestServer

    async def run() -> None:
        api = StoredApi()
        index = FakeIndex(api)
        index.stormservices[("ns", "svc")] = service_meta("svc")  # asks for nothing, as indexed
        opted_in = OptedInList(api)  # type: ignore[arg-type]
        app = webhook.build_app(index, opted_in, client_ca="", gate=Gate(opted_in, lambda ns, n: None, _absent))  # type: ignore[arg-type]
        async with TestClient(TestServer(app)) as client:
            await scenario(client, api, opted_in)

    asyncio.run(run())


async def _answer(client: Any, pod: Mapping[str, Any]) -> dict[str, Any]:
    answer = (await (await client.post(webhook.PODS_PATH, json={"request": {"uid": "p", "object": pod}})).json())["response"]
    answer["ops"] = json.loads(base64.b64decode(answer["patch"])) if "patch" in answer else []
    return dict(answer)


def _listed_long_ago(opted_in: OptedInList) -> None:
    opted_in.seen = ListsSeen(clock=lambda: 1000.0)
    opted_in.seen.on_event("ADDED", {"metadata": {"namespace": "ns"}, "data": {"svc": "RoleSet"}})
    opted_in.seen.clock = lambda: 1000.0 + listed_pods.LISTING_SETTLES + 5


def test_a_pod_the_policy_would_hold_for_nothing_is_marked_admitted_and_only_then() -> None:
    """A plain StormService listed (by another replica's gate, from a review replayed at its current version:
    issue 43, item 4): its new pods would be refused by the policy until the listing is taken back. The pod
    webhook reads the stored service once and, since it asks for nothing, marks the pod admitted. Not listed:
    nothing read, nothing added. The read failing: nothing added (held by the policy, as before)."""

    async def scenario(client: Any, api: StoredApi, opted_in: OptedInList) -> None:
        answer = await _answer(client, _pod())
        assert answer["allowed"] and answer["ops"] == [] and api.reads == 0  # not listed: not read, untouched
        _listed_long_ago(opted_in)
        api.stored = service_meta("svc", version="8")
        answer = await _answer(client, _pod())
        assert answer["allowed"] and answer["ops"] == [ADMITTED] and api.reads == 1
        # A pod still carrying the opt-in label of a service that opted out: the label off, and admitted.
        answer = await _answer(client, _pod({OPTED_IN_LABEL: "true"}))
        assert answer["ops"] == [{"op": "remove", "path": "/metadata/labels/stormtopo.io~1opted-in"}, ADMITTED]
        api.fail = True
        answer = await _answer(client, _pod())
        assert answer["allowed"] and answer["ops"] == []

    _pod_webhook(scenario)


def test_a_listed_service_stored_opted_in_ahead_of_the_index_is_refused_until_caught_up() -> None:
    """The index lags a genuine opt-in: the pod is refused, as the policy would, rather than admitted from the
    stored service while the PodGroup webhook still judges by the index."""

    async def scenario(client: Any, api: StoredApi, opted_in: OptedInList) -> None:
        _listed_long_ago(opted_in)
        api.stored = service_meta("svc", HARD, version="9")
        answer = await _answer(client, _pod())
        assert not answer["allowed"] and "catching up" in answer["status"]["message"]

    _pod_webhook(scenario)


def test_a_young_listing_is_judged_only_once_a_genuine_opt_in_would_be_stored(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gate lists an opt-in before its update is stored: a pod arriving meanwhile is not judged by the
    stored service until the listing is LISTING_SETTLES old (else it would go free, unconstrained)."""
    monkeypatch.setattr(listed_pods, "LISTING_SETTLES", 0.3)

    async def scenario(client: Any, api: StoredApi, opted_in: OptedInList) -> None:
        opted_in.seen.on_event("ADDED", {"metadata": {"namespace": "ns"}, "data": {"svc": "RoleSet"}})
        listed_at = opted_in.seen.listed_since("ns", "svc")
        assert listed_at is not None
        api.stored = service_meta("svc", HARD, version="9")  # stored by the time it is read
        answer = await _answer(client, _pod())
        assert api.read_at[0] - listed_at >= 0.3 - 0.01
        assert not answer["allowed"]

    _pod_webhook(scenario)


def test_the_pods_of_one_listed_service_share_reads_but_never_one_older_than_their_review() -> None:
    """Five pods at once: one read, and one more for those that came while it was under way. A review that
    comes while a read is under way does not take its answer: the service may have opted in since it began."""

    async def scenario(client: Any, api: StoredApi, opted_in: OptedInList) -> None:
        _listed_long_ago(opted_in)
        api.stored, api.delay = service_meta("svc"), 0.3
        answers = await asyncio.gather(*(_answer(client, _pod()) for _ in range(5)))
        assert all(a["ops"] == [ADMITTED] for a in answers) and api.reads <= 2
        api.reads = 0
        first = asyncio.ensure_future(_answer(client, _pod()))
        while api.reads == 0:
            await asyncio.sleep(0.01)
        api.stored = service_meta("svc", HARD, version="9")  # opted in while the first read is under way
        second = await _answer(client, _pod())
        assert (await first)["ops"] == [ADMITTED]
        assert not second["allowed"] and api.reads == 2

    _pod_webhook(scenario)


def test_a_gates_listing_counts_from_now_on_every_replica_even_if_the_name_was_listed() -> None:
    """The gate lists a name already listed (an opt-out not unlisted yet, then an opt-in): no data changes,
    so its write names what it listed, with a new time, and every replica's watch counts that name from
    now. A re-list (a watch gap) counts every name from now too: a listing may have come and gone unseen."""
    now = [100.0]
    seen = ListsSeen(clock=lambda: now[0])
    cm: dict[str, Any] = {"metadata": {"namespace": "ns"}, "data": {"svc": "RoleSet", "other": "RoleSet"}}
    seen.on_event("ADDED", cm)
    now[0] = 200.0
    cm["metadata"]["annotations"] = {GATE_LISTED: json.dumps({"at": 1.0, "names": ["svc"]})}
    seen.on_event("MODIFIED", cm)
    assert seen.listed_since("ns", "svc") == 200.0 and seen.listed_since("ns", "other") == 100.0
    now[0] = 300.0
    seen.on_event(None, cm)  # listed again after a gap
    assert seen.listed_since("ns", "other") == 300.0
    cm["metadata"]["annotations"] = {GATE_LISTED: "{not json"}
    seen.on_event("MODIFIED", cm)  # a tenant's junk marker changes nothing
    assert seen.listed_since("ns", "other") == 300.0
    # What the gate writes: its names and a new time on every write; the reconciler's writes carry none.
    api = FakeApi()
    bodies: list[Any] = []
    request = api.request
    api.request = lambda method, path, body=None, *a, **k: (bodies.append(body), request(method, path, body, *a, **k))[1]  # type: ignore[method-assign]
    opted_in = OptedInList(api)  # type: ignore[arg-type]

    async def write() -> None:
        await opted_in.record("ns", "svc", "RoleSet", force=True, by_gate=True)
        await opted_in.record("ns", "svc", "RoleSet", force=True, by_gate=True)
        await opted_in.record("ns", "third", "RoleSet")

    asyncio.run(write())
    markers = [(b.get("metadata") or {}).get("annotations", {}).get(GATE_LISTED) for b in bodies]
    assert markers[-1] is None and all(markers[:-1]) and len(set(markers[:-1])) == 2  # two writes (the first: a 404, then its create)
    assert all(json.loads(m)["names"] == ["svc"] for m in markers[:-1])


def test_waiting_reviews_are_read_for_fairly_and_forgotten_when_cancelled() -> None:
    """While reviews wait for room, the sweep reads the oldest listings of the namespaces waiting, taking
    turns (one full of replays does not take every read); a waiting review cancelled leaves nothing behind."""
    from stormtopo.operator.optin import fair_share

    assert fair_share(["a.1", "a.2", "a.3", "b.1", "a.4", "b.2"]) == ["a.1", "b.1", "a.2", "b.2", "a.3", "a.4"]

    async def scenario() -> None:
        gate, _, cluster, _ = make_gate(limit=1, room_wait=5.0)
        assert await gate.review(opting_in(cluster, "r1", namespace="attacker")) is None
        waiting = asyncio.create_task(gate.review(opting_in(cluster, "r2", namespace="attacker")))
        await asyncio.sleep(0.1)
        assert gate._waiting == {"attacker": 1}
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert gate._waiting == {}

    asyncio.run(scenario())
