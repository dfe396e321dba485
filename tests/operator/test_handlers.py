"""The kopf shell: what the operator registers, and what it tells kopf it does not need."""

from __future__ import annotations

from typing import Any, cast

import kopf
import pytest

from stormtopo.core.vocabulary import STORMSERVICE_LABEL
from stormtopo.operator import handlers
from stormtopo.operator.leader import Leadership
from tests.builders import service


def _registry() -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    unused = cast(Any, None)  # registration only keeps these: nothing is called before kopf runs
    handlers.register(registry, unused, unused, unused, Leadership(None, "default", "test", 15))
    return registry


def test_only_raw_event_handlers_so_kopf_needs_no_diff_base() -> None:
    """NoDiffBase tells kopf nothing ever changed: right only while no change or daemon handler exists
    (an on.update handler would never fire). Adding one must fail here, not silently in a cluster."""
    registry = _registry()
    assert len(registry._watching.get_all_handlers()) == 3  # StormServices, RoleSets, HyperNodes: pods and PodGroups are not kopf's
    assert not registry._changing.get_all_handlers()
    assert not registry._spawning.get_all_handlers()
    assert not registry._indexing.get_all_handlers()


def test_no_diff_base_keeps_no_copy_of_an_object() -> None:
    storage = handlers.NoDiffBase()
    body = kopf.Body({"metadata": {"name": "p", "annotations": {"a": "b"}}, "spec": {"x": [1, 2]}})
    assert storage.build(body=body) == {}
    assert storage.fetch(body=body) is None
    patch = kopf.Patch()
    storage.store(body=body, patch=patch, essence=kopf.BodyEssence())
    assert not patch  # never writes kopf's last-handled annotation into a user's object


def test_the_operator_uses_it() -> None:
    settings = kopf.OperatorSettings()
    handlers._configure(settings)
    assert isinstance(settings.persistence.diffbase_storage, handlers.NoDiffBase)


def test_the_index_knows_what_a_list_has_that_the_watch_missed_and_not_what_came_since() -> None:
    from stormtopo.operator.index import Index

    index = Index(api=cast(Any, None))
    index.observe("StormService", None, service(name="held", version="1"))
    index.observe("StormService", None, service(name="changed", version="1"))
    index.observe("StormService", None, service(name="deleted-since", version="1"))
    mark = index.mark()  # the re-list begins
    index.observe("StormService", "MODIFIED", service(name="newer-since", version="9"))
    index.observe("StormService", "DELETED", service(name="deleted-since", version="1"))
    assert not index.missed("StormService", service(name="held", version="1"), mark)
    assert index.missed("StormService", service(name="changed", version="2"), mark)  # its MODIFIED never came
    assert index.missed("StormService", service(name="new", version="5"), mark)  # its ADDED never came
    assert not index.missed("StormService", service(name="newer-since", version="8"), mark)  # an event since wins
    assert not index.missed("StormService", service(name="deleted-since", version="1"), mark)  # a deletion since wins
    index.relisted("StormService", mark)
    assert index.missed("StormService", service(name="deleted-since", version="1"), index.mark())  # listed by a later list: there again


def test_a_relist_delivers_the_stormservices_and_rolesets_a_blind_watch_missed() -> None:
    """kopf's StormService watch refused (a 403) or failing (5xx) for long while lists work: the re-list
    follows what it has that the watch did not deliver, as the event would have (recorded and queued),
    counts it, and shows it in /healthz; what the watch did deliver is not followed again."""
    import asyncio

    from stormtopo.operator.index import Index
    from stormtopo.operator.loops import Loops

    lists: dict[str, list[dict[str, Any]]] = {
        "stormservices": [service(name="seen", version="1"), service(name="missed", version="4")],
        "rolesets": [
            {"metadata": {"name": "missed-roleset-a", "namespace": "ns", "resourceVersion": "5", "labels": {STORMSERVICE_LABEL: "missed"}}}
        ],
        "hypernodes": [{"metadata": {"name": "s0", "resourceVersion": "2"}}, {"metadata": {"name": "s9", "resourceVersion": "3"}}],
    }

    class Api:
        @staticmethod
        def path(group_version: tuple[str, str], plural: str) -> str:
            return plural

        def pages(self, path: str, **_: Any) -> Any:
            return iter([lists.get(path, [])])

    index = Index(api=cast(Any, Api()))
    index.observe("StormService", None, service(name="seen", version="1"))
    index.observe("HyperNode", None, {"kind": "HyperNode", "metadata": {"name": "s0", "resourceVersion": "2"}})
    loops = Loops()
    operator = handlers.Operator(index, cast(Any, None), cast(Any, None), Leadership(None, "default", "test", 15), loops)
    loops.note("kopf-watches", operator.watch_report)
    asyncio.run(operator.relist(cast(Any, Api())))
    assert ("ns", "missed") in index.stormservices and ("ns", "missed-roleset-a") in index.rolesets and "s9" in index.hypernodes
    assert operator.watch_missed == {"StormService": 1, "RoleSet": 1, "HyperNode": 1}
    assert len(operator.stormservices) == 1  # queued: the one that was missed (its RoleSet queues the same service)
    healthy, report = loops.health()
    assert healthy and report["kopf-watches"]["missed, delivered by the re-list"] == {"HyperNode": 1, "RoleSet": 1, "StormService": 1}
    asyncio.run(operator.relist(cast(Any, Api())))  # delivered once: the next re-list finds nothing missed
    assert operator.watch_missed == {"StormService": 1, "RoleSet": 1, "HyperNode": 1}
    assert loops.health()[1]["kopf-watches"]["behind"] == []
    # The StormService watch down for good: every re-list finds new ones it missed. Two in a row: behind, said in
    # /healthz and the gauge the StormtopoWatchBehind alert reads; /healthz stays healthy (a restart fixes no 403).
    from stormtopo.operator import metrics

    for n in (5, 6):
        lists["stormservices"].append(service(name=f"missed-{n}", version=str(n)))
        asyncio.run(operator.relist(cast(Any, Api())))
        behind = loops.health()[1]["kopf-watches"]["behind"]
        assert behind == ([] if n == 5 else ["StormService"])
    assert metrics.WATCH_BEHIND.labels("StormService")._value.get() == 1 and metrics.WATCH_BEHIND.labels("RoleSet")._value.get() == 0
    healthy, _ = loops.health()
    assert healthy
    asyncio.run(operator.relist(cast(Any, Api())))  # the watch delivers again: nothing missed, no longer behind
    assert loops.health()[1]["kopf-watches"]["behind"] == [] and metrics.WATCH_BEHIND.labels("StormService")._value.get() == 0


def test_a_stormservice_come_or_gone_by_any_path_requeues_those_whose_roleset_prefix_it_shares() -> None:
    """The second review of issue 43, item 3: a name delivered by kopf's first list (no event type), by the
    re-list (MODIFIED), or pruned, changes whether another service is movable, as ADDED and DELETED do."""
    from stormtopo.operator.index import Index

    class Queue:
        def __init__(self) -> None:
            self.keys: list[Any] = []

        def add(self, key: Any) -> None:
            self.keys.append(key)

    class Reconciler:
        def forget(self, key: Any) -> None:
            pass

    index = Index(api=cast(Any, None))
    leadership = Leadership(None, "default", "test", 15)  # no API: election off, it leads
    operator = handlers.Operator(index, cast(Any, Reconciler()), cast(Any, None), leadership, cast(Any, None))
    operator.stormservices = cast(Any, Queue())
    operator.follow("StormService", {"type": None}, service(name="short", version="1"))
    operator.follow("StormService", {"type": "MODIFIED"}, service(name="short-roleset-x", version="2"))  # first seen by a re-list
    assert ("ns", "short") in operator.stormservices.keys  # type: ignore[attr-defined]
    operator.stormservices.keys.clear()  # type: ignore[attr-defined]
    operator.follow("StormService", {"type": "MODIFIED"}, service(name="short-roleset-x", version="3"))  # known: nothing changes
    assert ("ns", "short") not in operator.stormservices.keys  # type: ignore[attr-defined]
    index.observe("StormService", "DELETED", service(name="short-roleset-x", version="3"))
    operator.forget("StormService", ("ns", "short-roleset-x"))  # pruned by a re-list
    assert ("ns", "short") in operator.stormservices.keys  # type: ignore[attr-defined]

    # A RoleSet gone queues its StormService too: with its last replica of unlabelled templates gone, the service
    # leaves its namespace's list (core/optin.py listing), not only at the next resync.
    class Reporter:
        def forget(self, key: Any) -> None:
            pass

    operator.reporter = cast(Any, Reporter())
    operator.stormservices.keys.clear()  # type: ignore[attr-defined]
    roleset = {"kind": "RoleSet", "metadata": {"name": "short-roleset-a", "namespace": "ns", "labels": {"storm-service-name": "short"}}}
    operator.follow("RoleSet", {"type": "DELETED"}, roleset)
    assert operator.stormservices.keys == [("ns", "short")]  # type: ignore[attr-defined]


def test_kopf_retries_a_watch_through_an_outage_of_any_length(monkeypatch: pytest.MonkeyPatch) -> None:
    """kopf's own request loop, given stormtopo's settings: 200 failed attempts in a row (over an hour and a half
    of refused connections, at 30 s apart) and the next one answered; kopf escalates none of them, so its watch
    task lives on (a watch kopf gives up is never started again)."""
    import asyncio

    import aiohttp
    from kopf._cogs.clients import api as kopf_api
    from kopf._cogs.clients import errors as kopf_errors

    settings = kopf.OperatorSettings()
    handlers._configure(settings)
    slept: list[float] = []
    answered = object()

    class Session:
        closed = False
        attempts = 0

        async def request(self, **_: Any) -> object:
            self.attempts += 1
            if self.attempts <= 200:
                raise aiohttp.ClientConnectionError("connection refused")
            return answered

    class Context:
        server = "https://127.0.0.1:1"
        session = Session()

        def add_response(self, response: object) -> None:
            pass

    async def no_check(response: object) -> None:
        pass

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    async def attempt() -> object:
        request = kopf_api.request.__wrapped__  # type: ignore[attr-defined]  # without the vault: the context is given
        return await request("get", "/apis", settings=settings, context=Context(), logger=logging.getLogger("test"))

    import logging

    monkeypatch.setattr(kopf_errors, "check_response", no_check)
    monkeypatch.setattr(asyncio, "sleep", sleep)  # kopf's waits, counted rather than waited
    assert asyncio.run(attempt()) is answered
    assert len(slept) == 200 and slept[:9] == [1, 1, 2, 3, 5, 8, 13, 21, 30] and max(slept) == 30
    assert sum(slept) > 90 * 60
