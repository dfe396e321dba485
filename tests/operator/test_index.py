"""What the operator's index keeps of an object (pure: no API calls)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from stormtopo.core.optin import labelled, listing
from stormtopo.core.vocabulary import HIGHEST_TIER, MODE, OPTED_IN_LABEL
from stormtopo.operator.index import LAST_APPLIED, service_key_of, slim
from tests.builders import pod, service


def test_slim_keeps_what_reconciliation_reads_and_drops_the_bulk() -> None:
    roleset = {
        "apiVersion": "orchestration.aibrix.ai/v1alpha1",
        "kind": "RoleSet",
        "metadata": {
            "name": "svc-roleset-abc",
            "namespace": "ns",
            "labels": {"storm-service-name": "svc"},
            "annotations": {LAST_APPLIED: "{...the whole object...}", "keep": "me"},
            "managedFields": [{"manager": "aibrix"}],
        },
        "spec": {
            "schedulingStrategy": {"volcanoSchedulingStrategy": {}},
            "roles": [
                {
                    "name": "prefill",
                    "replicas": 2,
                    "podGroupSize": 2,
                    "template": {
                        "metadata": {"labels": {"a": "b"}},
                        "spec": {"containers": [{"name": "c", "image": "x", "env": [{"name": "E"}], "resources": {"limits": {"g": "1"}}}]},
                    },
                }
            ],
        },
        "status": {"replicas": 1},
    }
    kept = slim(roleset)
    assert kept["metadata"]["annotations"] == {"keep": "me"}
    assert "managedFields" not in kept["metadata"] and "status" not in kept
    assert kept["spec"]["schedulingStrategy"] == {"volcanoSchedulingStrategy": {}}
    assert kept["spec"]["roles"] == [
        {"name": "prefill", "replicas": 2, "podGroupSize": 2, "template": {"spec": {"containers": [{"resources": {"limits": {"g": "1"}}}]}}}
    ]
    assert roleset["metadata"]["annotations"][LAST_APPLIED]  # the watched object itself is not changed
    assert service_key_of(roleset) == ("ns", "svc")


def test_slim_keeps_the_opt_in_label_of_role_templates_so_a_labelled_service_stays_unlisted() -> None:
    """Found by `python -m bench optin-creates`: the index dropped role templates' metadata, and the
    reconciler listed 8,372 of 10,000 services created labelled."""
    svc = service({MODE: "hard", HIGHEST_TIER: "1"})
    for role in svc["spec"]["template"]["spec"]["roles"]:
        role["template"]["metadata"]["labels"][OPTED_IN_LABEL] = "true"
    kept = slim(svc)
    assert labelled(kept) and listing(kept) is None
    assert all(r["template"]["metadata"] == {"labels": {OPTED_IN_LABEL: "true"}} for r in kept["spec"]["template"]["spec"]["roles"])
    plain = slim(service({MODE: "hard", HIGHEST_TIER: "1"}, name="plain"))
    assert not labelled(plain) and listing(plain) == "RoleSet"  # opted in by an update: listed


def test_slim_keeps_a_podgroups_phase_and_conditions_for_placement_reports() -> None:
    podgroup = {
        "kind": "PodGroup",
        "metadata": {"name": "g", "namespace": "ns"},
        "spec": {"minMember": 2},
        "status": {"phase": "Pending", "conditions": [{"type": "Unschedulable", "status": "True"}], "running": 0},
    }
    assert slim(podgroup)["status"] == {"phase": "Pending", "conditions": [{"type": "Unschedulable", "status": "True"}]}
    assert slim(podgroup)["spec"] == {"minMember": 2}


def test_service_of_a_roleset_without_the_label_comes_from_its_owner() -> None:
    roleset = {"metadata": {"name": "r", "namespace": "ns", "ownerReferences": [{"kind": "StormService", "name": "svc"}]}}
    assert service_key_of(roleset) == ("ns", "svc")


def test_a_relist_forgets_what_was_deleted_while_the_watch_was_down_but_not_what_came_since() -> None:
    from stormtopo.operator.index import Index

    index = Index(api=None)  # type: ignore[arg-type]  # observe and prune make no API calls
    svc = {"kind": "StormService", "metadata": {"name": "svc", "namespace": "ns"}}
    roleset = {"kind": "RoleSet", "metadata": {"name": "svc-roleset-a", "namespace": "ns", "labels": {"storm-service-name": "svc"}}}
    index.observe("StormService", None, svc)
    index.observe("RoleSet", None, roleset)
    mark = index.mark()  # the list starts; then a new RoleSet arrives before the list answers
    newer = {"kind": "RoleSet", "metadata": {"name": "svc-roleset-b", "namespace": "ns", "labels": {"storm-service-name": "svc"}}}
    index.observe("RoleSet", None, newer)
    assert asyncio.run(index.prune("RoleSet", listed=set(), mark=mark)) == [("ns", "svc-roleset-a")]
    assert [r["metadata"]["name"] for r in index.rolesets_of("ns", "svc")] == ["svc-roleset-b"]
    assert asyncio.run(index.prune("StormService", listed={("ns", "svc")}, mark=mark)) == []
    assert ("ns", "svc") in index.stormservices


def test_a_prune_of_many_keys_lets_the_loop_run_between_slices_and_keeps_what_came_meanwhile() -> None:
    """A re-list of 100,000 admitted pods must not hold the webhooks for its whole walk (30 ms in one go): the keys are
    judged a slice at a time, each as it is when judged, so a pod observed again meanwhile is kept."""
    from stormtopo.operator.index import PRUNE_SLICE, Index

    index = Index(api=None)  # type: ignore[arg-type]
    count = 2 * PRUNE_SLICE + 10
    for i in range(count):
        index.observe("Pod", None, pod(f"p-{i:05d}", "prefill", replica="r"))
    index.observe("RoleSet", None, {"kind": "RoleSet", "metadata": {"name": "r", "namespace": "ns"}})
    mark = index.mark()

    async def relist() -> tuple[list[tuple[str, str]], int]:
        ran_at: list[int] = []

        async def meanwhile() -> None:  # an event delivered while the prune walks
            ran_at.append(len(index.pods))
            index.observe("Pod", "MODIFIED", pod(f"p-{count - 1:05d}", "prefill", replica="r"))

        task = asyncio.get_running_loop().create_task(meanwhile())
        gone = await index.prune("Pod", listed=set(), mark=mark)
        await task
        return gone, ran_at[0]

    gone, pods_when_it_ran = asyncio.run(relist())
    assert 0 < count - pods_when_it_ran < count  # it ran between two slices, not before nor after the walk
    assert len(gone) == count - 1 and ("ns", f"p-{count - 1:05d}") not in gone
    assert list(index.pods) == [("ns", f"p-{count - 1:05d}")]
    assert ("ns", "r") in index.rolesets  # another kind's keys are not walked, nor forgotten


def test_what_a_prune_forgets_is_told_at_once_not_after_a_name_came_back() -> None:
    """The review: told after the whole walk, a StormService pruned in the first slice and created again under its name
    before the walk ended had the new one forgotten (taken off its namespace's opted-in list)."""
    from stormtopo.operator.index import PRUNE_SLICE, Index

    index = Index(api=None)  # type: ignore[arg-type]
    for i in range(2 * PRUNE_SLICE):
        index.observe("StormService", None, {"metadata": {"namespace": "ns", "name": f"s-{i:05d}"}})
    mark = index.mark()
    told: list[tuple[tuple[str, str], bool]] = []

    async def relist() -> None:
        async def recreated() -> None:  # s-00000, pruned in the first slice, comes back before the walk ends
            index.observe("StormService", "ADDED", {"metadata": {"namespace": "ns", "name": "s-00000", "uid": "new"}})

        task = asyncio.get_running_loop().create_task(recreated())
        await index.prune("StormService", set(), mark, lambda key: told.append((key, key in index.stormservices)))
        await task

    asyncio.run(relist())
    assert (("ns", "s-00000"), False) in told  # told while it was gone
    assert all(not present for _, present in told)  # never of a key present again
    assert index.stormservices[("ns", "s-00000")]["metadata"]["uid"] == "new"


def test_the_opted_in_list_forgets_a_stormservice_only_after_two_checks_without_it() -> None:
    from stormtopo.operator.optin import OptedInList

    listed = OptedInList(api=None)  # type: ignore[arg-type]  # stale() makes no API calls
    listed.listed = {"ns.gone": "RoleSet", "ns.here": "RoleSet", "ns.new": "RoleSet"}
    assert listed.stale({"ns.here": None}) == []  # first check: maybe just created by the gate
    assert listed.stale({"ns.here": None, "ns.new": None}) == ["ns.gone"]
    assert listed.stale({"ns.here": None, "ns.new": None}) == []


def test_cluster_tiers_follow_hypernode_events_and_the_schema() -> None:
    from typing import Any, cast

    from stormtopo.operator.index import Index

    index = Index(cast(Any, None))  # no API call: HyperNodes arrive as events

    def hypernode(name: str, tier: int, tier_name: str = "") -> dict[str, Any]:
        spec: dict[str, Any] = {"tier": tier, **({"tierName": tier_name} if tier_name else {})}
        return {"metadata": {"name": name}, "spec": spec}

    index.observe("HyperNode", "ADDED", hypernode("leaf0", 1, "leaf"))
    assert index.cluster_tiers().tiers == {1}
    assert index.cluster_tiers() is index.cluster_tiers()  # computed once while nothing changes
    index.observe("HyperNode", "ADDED", hypernode("spine0", 2, "spine"))
    assert index.cluster_tiers().tiers == {1, 2} and index.cluster_tiers().tier_names == {"leaf", "spine"}
    index.observe("HyperNode", "DELETED", hypernode("spine0", 2, "spine"))
    assert index.cluster_tiers().tiers == {1}
    assert index.cluster_tiers().has_network_topology  # schema unknown: every field assumed
    index.podgroup_schema = {"properties": {"spec": {"properties": {}}}}  # a Volcano without networkTopology
    assert not index.cluster_tiers().has_network_topology


def test_listing_when_another_replica_creates_the_list_first() -> None:
    """Two webhooks list their StormServices at once while the ConfigMap does not exist yet: the one
    whose create loses (409) adds to the other's list instead of refusing its StormService."""
    import asyncio
    from typing import Any, cast

    from stormtopo.kube.client import Conflict, NotFound
    from stormtopo.operator.optin import OptedInList

    calls: list[str] = []
    stored: dict[str, str] = {}

    class Racing:
        def request(self, method: str, path: str, body: Any = None, *_: Any, **__: Any) -> Any:
            calls.append(method)
            if method == "PATCH" and calls.count("PATCH") == 1:
                raise NotFound(404, method, path, "not found")  # not created yet
            if method == "POST":
                stored.update({"other": "StormService"})  # the other replica's create landed first
                raise Conflict(409, method, path, "already exists")
            assert path == "/api/v1/namespaces/ns/configmaps/stormtopo-opted-in"  # the service's own namespace
            stored.update(body["data"])
            return {"data": dict(stored)}

    listed = OptedInList(cast(Any, Racing()))
    asyncio.run(listed.record("ns", "svc", "StormService"))
    assert calls == ["PATCH", "POST", "PATCH"]
    assert stored == {"other": "StormService", "svc": "StormService"} and listed.listed == {"ns.svc": "StormService"}


def test_pods_freed_counts_only_admitted_pods_that_left_a_node() -> None:
    from stormtopo.operator.index import Index

    index = Index(api=None)  # type: ignore[arg-type]  # observe makes no API calls

    index.observe("Pod", "ADDED", pod("bound", "prefill", "node0"))
    index.observe("Pod", "ADDED", pod("pending", "prefill", None))
    assert index.pods_freed == 0
    index.observe("Pod", "DELETED", pod("pending", "prefill", None))  # it held no node
    assert index.pods_freed == 0
    moved: list[None] = []
    index.on_pods_moved = lambda: moved.append(None)
    index.observe("Pod", "DELETED", pod("bound", "prefill", "node0"))
    assert index.pods_freed == 1 and len(moved) == 1
    index.observe("Pod", "ADDED", pod("again", "prefill", "node1"))
    index.observe("Pod", "MODIFIED", pod("again", "prefill", "node1"))  # already bound: no news
    assert index.pods_bound == 2 and len(moved) == 2


def test_the_first_list_fills_in_only_what_the_watch_has_not_delivered() -> None:
    """Issue 42, item 4: ready means caught up. The first list adds what the watch has not delivered yet;
    an event (newer, or a deletion) wins over the list, which may be older."""
    from typing import Any, cast

    from stormtopo.operator.index import Index

    index = Index(cast(Any, None))
    index.observe("StormService", "MODIFIED", service(name="watched", version="9"))
    index.observe("StormService", None, service(name="deleted", version="3"))
    index.observe("StormService", "DELETED", service(name="deleted", version="4"))
    listed = [service(name="watched", version="5"), service(name="deleted", version="3"), service(name="listed-only", version="6")]
    assert index.catch_up("StormService", listed) == 1
    assert set(index.stormservices) == {("ns", "watched"), ("ns", "listed-only")}
    assert index.stormservices[("ns", "watched")]["metadata"]["resourceVersion"] == "9"  # the event's, not the list's


def test_no_opted_in_key_is_judged_stale_before_the_first_complete_list() -> None:
    import asyncio
    from typing import Any, cast

    from stormtopo.operator.index import Index
    from stormtopo.operator.optin import OptedInList
    from stormtopo.operator.reconciliation import Reconciler

    class Listed(OptedInList):
        def refresh(self) -> None:
            self.listed = {"ns.not-seen-yet": "RoleSet"}

    index = Index(cast(Any, None))
    listed = Listed(api=cast(Any, None))
    reconciler = Reconciler(index, cast(Any, None), cast(Any, None), listed)
    for _ in range(3):  # three resyncs before the first list is in: nothing judged absent
        asyncio.run(reconciler.refresh_opted_in())
    assert listed._absent == set()
    index.caught_up = True
    asyncio.run(reconciler.refresh_opted_in())
    assert listed._absent == {"ns.not-seen-yet"}  # now it counts, once (a second check unlists it)


def test_the_rolesets_of_a_service_share_one_copy_of_its_spec_and_the_last_to_go_takes_it() -> None:
    """Issue 42, item 5: the index keeps each distinct StormService and RoleSet spec once (BENCHMARKS.md, "Memory")."""
    from stormtopo.operator.index import Index

    index = Index(None)  # type: ignore[arg-type]
    svc = service()
    rolesets = [
        {"kind": "RoleSet", "metadata": {"name": f"svc-roleset-{i}", "namespace": "ns", "labels": {"storm-service-name": "svc"}}}
        | {"spec": json.loads(json.dumps(svc["spec"]["template"]["spec"]))}  # each its own copy, as the API sends them
        for i in range(3)
    ]
    for roleset in rolesets:
        index.observe("RoleSet", "ADDED", roleset)
    kept = [index.rolesets[("ns", f"svc-roleset-{i}")]["spec"] for i in range(3)]
    assert kept[0] is kept[1] is kept[2] and len(index._specs) == 1
    assert kept[0] == slim(rolesets[0])["spec"]  # the same content as before sharing
    changed = json.loads(json.dumps(rolesets[0]))
    changed["spec"]["roles"][0]["replicas"] = 2
    index.observe("RoleSet", "MODIFIED", changed)
    assert len(index._specs) == 2 and index.rolesets[("ns", "svc-roleset-0")]["spec"]["roles"][0]["replicas"] == 2
    assert index.rolesets[("ns", "svc-roleset-1")]["spec"]["roles"][0]["replicas"] == 1  # the others keep theirs
    for i in range(3):
        index.observe("RoleSet", "DELETED", rolesets[i])
    assert len(index._specs) == 0  # nothing kept for objects that are gone


def test_a_slim_pod_keeps_its_content_with_its_strings_interned_and_its_bound_spec_shared() -> None:
    def served(name: str) -> dict[str, Any]:
        """Pod `name` as the API server sends it (decoded afresh: no string shared), with what slim drops."""
        conditions = [
            {"type": "Ready", "status": "True"},
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": "t", "lastProbeTime": None},
        ]
        status = {"phase": "Running", "conditions": conditions}
        obj = pod(name, None, "node-1", labels={"role-name": "decode"}, spec={"containers": [{"name": "c"}]}, status=status)
        obj["metadata"]["managedFields"] = [{}]
        return json.loads(json.dumps(obj))

    a, b = slim(served("a")), slim(served("b"))
    assert a["metadata"] == {"name": "a", "namespace": "ns", "labels": {"role-name": "decode"}}
    assert a["status"] == {"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": "t"}]}
    assert a["spec"] == {"nodeName": "node-1"} and a["spec"] is b["spec"]
    assert a["metadata"]["labels"]["role-name"] is b["metadata"]["labels"]["role-name"]
    unscheduled = served("c")
    unscheduled["spec"].pop("nodeName")
    unscheduled["status"]["conditions"][1] |= {"status": "False", "reason": "Unschedulable", "message": "0/8 nodes"}
    assert slim(unscheduled)["status"]["conditions"][0]["message"] == "0/8 nodes"  # why it waits, while it waits


def test_the_stormservices_in_play_follow_their_annotations_and_deletions() -> None:
    """What healing and the node tier look at: the opted-in services, and those still carrying move records
    (one that opted out mid-move still counts against the cap); never the others."""
    from stormtopo.operator.index import Index

    index = Index(api=None)  # type: ignore[arg-type]  # observe makes no API calls

    for name in ("plain-a", "plain-b"):
        index.observe("StormService", None, service(name=name))
    index.observe("StormService", None, service({"volcano.sh/network-topology-mode": "hard"}, name="asks"))
    assert list(index.stormservices_in_play()) == [("ns", "asks")]
    index.observe("StormService", "MODIFIED", service({"volcano.sh/network-topology-mode": "soft"}, name="plain-a"))
    assert list(index.stormservices_in_play()) == [("ns", "asks"), ("ns", "plain-a")]
    index.observe("StormService", "MODIFIED", service(name="asks"))  # opted out
    index.observe("StormService", "DELETED", service({"volcano.sh/network-topology-mode": "soft"}, name="plain-a"))
    assert index.stormservices_in_play() == {}
    assert len(index.stormservices) == 2
    index.observe("StormService", "MODIFIED", service({"stormtopo.io/moves": "{}"}, name="asks"))  # opted out, its records kept
    assert list(index.stormservices_in_play()) == [("ns", "asks")]


def test_a_stormservice_whose_roleset_prefix_another_shares_is_found_both_ways_and_forgotten_once_gone() -> None:
    """Issue 43, item 3: AIBrix names RoleSets "<stormservice>-roleset-" cut to 58 characters; of two services
    whose names agree that far, the eviction policy could not tell the pods apart, so neither is movable."""
    from stormtopo.operator.index import Index

    index = Index(api=None)  # type: ignore[arg-type]  # observe makes no API calls
    long_a, long_b = (
        "inference-prod-use1-llama-70b-prefill-decode-disaggregated-a",
        "inference-prod-use1-llama-70b-prefill-decode-disaggregated-b",
    )
    assert len(long_a) == 60 and long_a[:58] == long_b[:58]  # "<name>-roleset-" cut to 58: the same for both
    for name in (long_a, long_b, "short", "other"):
        index.observe("StormService", "ADDED", service(name=name))
    index.observe("StormService", "ADDED", service(name=long_b, namespace="elsewhere"))
    assert index.roleset_prefix_shared("ns", long_a) == long_b and index.roleset_prefix_shared("ns", long_b) == long_a
    assert index.roleset_prefix_shared("ns", "short") is None and index.roleset_prefix_shared("elsewhere", long_b) is None
    index.observe("StormService", "ADDED", service(name="short-roleset-x"))  # its pods begin "short-roleset-": taken for short's
    assert index.roleset_prefix_shared("ns", "short") == "short-roleset-x"
    assert index.roleset_prefix_shared("ns", "short-roleset-x") == "short"  # both ways: the policy matches either's pods by prefix
    assert index.prefix_neighbours("ns", long_b) == [long_a] and index.prefix_neighbours("ns", "short-roleset-x") == ["short"]
    assert index.prefix_neighbours("ns", "other") == []
    index.observe("StormService", "DELETED", service(name=long_b))
    assert index.roleset_prefix_shared("ns", long_a) is None
    index.observe("StormService", "MODIFIED", service(name=long_a))  # an update keeps one entry
    index.observe("StormService", "DELETED", service(name=long_a))
    assert index.roleset_prefix_shared("ns", long_a) is None


_LONG = "inference-prod-use1-llama-70b-prefill-decode-disaggregated"
# StormService names whose RoleSet name prefixes begin one another every way (AIBrix cuts them to 58).
TWIN_NAMES = (f"{_LONG}-a", f"{_LONG}-b", _LONG[:44], f"{_LONG[:44]}-roleset-x", "short", "short-roleset-x", "short-roleset-x-roleset-y")


def test_the_commands_plain_scan_finds_the_same_prefix_neighbours_as_the_index() -> None:
    """`stormtopo heal --dry-run` scans the namespace's names once (core/movable.py shares_prefix_with); the operator
    bisects its sorted prefixes: over names made to share prefixes every way, they agree."""
    import itertools

    from stormtopo.core.movable import shares_prefix_with
    from stormtopo.operator.index import Index

    names = [*TWIN_NAMES, "shorter", "sho"]
    for chosen in itertools.chain.from_iterable(itertools.combinations(names, k) for k in (2, 3, 4)):
        index = Index(api=None)  # type: ignore[arg-type]  # observe makes no API calls
        for name in chosen:
            index.observe("StormService", "ADDED", service(name=name))
        for name in chosen:
            found = shares_prefix_with(name, chosen)
            assert (found is None) == (index.roleset_prefix_shared("ns", name) is None), (name, chosen)
            assert found is None or found in index.prefix_neighbours("ns", name), (name, chosen)


def test_prefix_sharing_of_a_whole_namespace_finds_whom_the_plain_scan_finds() -> None:
    """The dry run's O(n log n) pass over a namespace (core/movable.py prefix_sharing) against the scan per name."""
    import itertools
    import random

    from stormtopo.core.movable import prefix_sharing, shares_prefix_with

    pool = [*TWIN_NAMES, "s", "sh"]
    cases = [list(c) for k in (1, 2, 3, 4) for c in itertools.combinations(pool, k)]
    rng = random.Random(7)
    cases += [rng.sample(pool, rng.randint(2, len(pool))) for _ in range(200)]
    for names in cases:
        assert prefix_sharing(names) == {n for n in names if shares_prefix_with(n, names) is not None}, names


def test_the_operator_reads_the_clusters_default_class_with_the_others() -> None:
    from typing import cast

    from stormtopo.core.priority import DEFAULT_CLASS
    from stormtopo.operator.index import Index

    class Api:
        def list_objects(self, group: tuple[str, str], plural: str) -> list[dict[str, Any]]:
            return [
                {"metadata": {"name": "batch"}, "value": 100},
                {"metadata": {"name": "everyone"}, "value": 1000, "globalDefault": True},
            ]

    index = Index(cast(Any, Api()))
    index.read_priority_classes()
    assert dict(index.priority_values) == {DEFAULT_CLASS: 1000, "batch": 100, "everyone": 1000}


def _leaf(name: str, nodes: list[str], version: str) -> dict[str, Any]:
    members = [{"type": "Node", "selector": {"exactMatch": {"name": n}}} for n in nodes]
    return {"metadata": {"name": name, "resourceVersion": version}, "spec": {"tier": 1, "members": members}}


def test_a_hypernode_delivered_again_at_the_same_version_changes_nothing_a_new_version_does() -> None:
    """A watch restart or a re-list delivers every HyperNode again: at 16,384 nodes a tree rebuilt whole for that is
    30 to 55 ms of the loop, and everything planned over the tree would be planned again for nothing."""
    from stormtopo.operator.index import Index

    index = Index(api=None)  # type: ignore[arg-type]
    index.observe("HyperNode", "ADDED", _leaf("leaf-a", ["n1"], "7"))
    tree, changes = index.topology(), index.hypernode_changes
    index.observe("HyperNode", None, _leaf("leaf-a", ["n1"], "7"))
    assert index.hypernode_changes == changes and index.topology() is tree
    index.observe("HyperNode", "MODIFIED", _leaf("leaf-a", ["n1", "n2"], "8"))
    assert index.hypernode_changes == changes + 1 and sorted(index.topology().nodes) == ["n1", "n2"]
    index.observe("HyperNode", "MODIFIED", {"metadata": {"name": "leaf-a"}, "spec": {"tier": 1, "members": []}})
    assert index.topology().nodes == {}  # no version to compare: taken as a change


def test_the_tree_built_on_a_thread_is_the_one_the_loop_would_build_and_is_dropped_if_stale() -> None:
    from stormtopo.operator.index import Index

    index = Index(api=None)  # type: ignore[arg-type]
    index.observe("HyperNode", "ADDED", _leaf("leaf-a", ["n1", "n2"], "1"))
    index.observe("HyperNode", "ADDED", _leaf("leaf-b", ["n3"], "1"))
    asyncio.run(index.build_tree())
    built = index.topology()  # read without a build: the thread's
    assert {n: s.switch for n, s in built.nodes.items()} == {"n1": "leaf-a", "n2": "leaf-a", "n3": "leaf-b"}
    asyncio.run(index.build_tree())
    assert index.topology() is built  # nothing changed: not built again

    async def changed_meanwhile() -> None:
        building = asyncio.get_running_loop().create_task(index.build_tree())
        await asyncio.sleep(0)  # the build has begun on its thread
        index.observe("HyperNode", "MODIFIED", _leaf("leaf-b", ["n3", "n4"], "2"))
        await building

    asyncio.run(changed_meanwhile())
    assert index.topology().nodes["n4"].switch == "leaf-b"  # the stale build was not kept: the loop built this one
