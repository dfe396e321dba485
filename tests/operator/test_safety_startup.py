"""Day one (issue 14, item 5): the operator starts without Volcano's HyperNode CRD, and notices it,
and new PodGroup fields, when they are installed later."""

from __future__ import annotations

import asyncio
import threading

import pytest

from stormtopo.kube.client import ApiError
from stormtopo.operator.app import detect_volcano, watch_volcano


class FakeIndex:
    """Stands in for operator.index.Index: counts detections, and lists HyperNodes once 'installed'."""

    def __init__(self) -> None:
        self.installed = False
        self.detections = 0
        self.hypernodes: dict[str, object] = {}
        self.primed_on: threading.Thread | None = None
        self.tree_built = -1  # over how many HyperNodes the tree was built once they were primed

    def detect_volcano_fields(self) -> None:
        self.detections += 1

    def list_hypernodes(self) -> list[dict[str, object]]:
        if not self.installed:
            raise ApiError.of(404, "GET", "/apis/topology.volcano.sh/v1alpha1/hypernodes", "404 page not found")
        return [{"metadata": {"name": "s0"}}]

    def prime(self, hypernodes: list[dict[str, object]]) -> None:
        self.primed_on = threading.current_thread()
        for hypernode in hypernodes:
            self.hypernodes[str(hypernode["metadata"]["name"])] = hypernode  # type: ignore[index]

    async def build_tree(self) -> None:
        self.tree_built = len(self.hypernodes)


def test_a_missing_hypernode_crd_is_a_warning_not_a_crash(caplog: pytest.LogCaptureFixture) -> None:
    index = FakeIndex()
    assert detect_volcano(index) is None  # type: ignore[arg-type]
    assert "HyperNode CRD (topology.volcano.sh) not installed" in caplog.text
    index.installed = True
    assert detect_volcano(index) == [{"metadata": {"name": "s0"}}] and not index.hypernodes  # type: ignore[arg-type]


def test_other_api_errors_are_not_hidden() -> None:
    class Forbidden(FakeIndex):
        def list_hypernodes(self) -> list[dict[str, object]]:
            raise ApiError.of(403, "GET", "/apis/topology.volcano.sh/v1alpha1/hypernodes", "forbidden")

    with pytest.raises(ApiError):
        detect_volcano(Forbidden())  # type: ignore[arg-type]


def test_crds_installed_later_are_picked_up_and_capabilities_re_detected() -> None:
    async def scenario() -> None:
        index = FakeIndex()
        watching = asyncio.create_task(watch_volcano(index, primed=False, interval=0.05))  # type: ignore[arg-type]
        await asyncio.sleep(0.2)
        assert not index.hypernodes  # still missing, and the loop survived every 404
        index.installed = True
        for _ in range(100):
            if index.hypernodes:
                break
            await asyncio.sleep(0.05)
        assert index.hypernodes and index.primed_on is threading.main_thread()  # (listed on a thread, loaded on the loop)
        assert index.tree_built == len(index.hypernodes)  # and the tree built from them before a placement check needs it
        before = index.detections
        await asyncio.sleep(0.2)
        assert index.detections > before  # capabilities keep being re-read (a Volcano upgrade)
        watching.cancel()

    asyncio.run(scenario())


def test_readyz_answers_503_until_the_first_complete_list_is_in_then_ok() -> None:
    """Issue 42, item 4: ready means caught up. While the first list of StormServices and RoleSets is still paging,
    /readyz says 503 (the Service sends it no admission); once the last page is in, the index is caught up and
    /readyz says ok."""
    import asyncio
    import threading
    import urllib.error
    import urllib.request
    from typing import Any, cast

    from stormtopo.operator import app
    from stormtopo.operator.config import OperatorConfig
    from stormtopo.operator.index import Index
    from stormtopo.operator.loops import Loops

    release = threading.Event()

    class Paging:
        def path(self, group_version: object, plural: str) -> str:
            return plural

        def pages(self, path: str) -> Any:
            yield [{"kind": "StormService" if path == "stormservices" else "RoleSet", "metadata": {"namespace": "ns", "name": f"{path}-1"}}]
            release.wait(10)  # the next page is slow to come
            yield [{"metadata": {"namespace": "ns", "name": f"{path}-2", "labels": {"storm-service-name": "stormservices-1"}}}]

    class Drain:
        task = None

        def install(self) -> None:
            pass

    def status(port: int) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as answer:
                return int(answer.status)
        except urllib.error.HTTPError as error:
            return int(error.code)

    async def scenario() -> None:
        index = Index(cast(Any, None))
        config = OperatorConfig(metrics_host="127.0.0.1", metrics_port=0, register_webhook=False)
        ready, kopf_ready = asyncio.Event(), asyncio.Event()
        probes = await app._serve_probes(config, Loops(), ready)
        port = probes.addresses[0][1]
        kopf_ready.set()
        registering = asyncio.create_task(
            app._register_when_watching(config, cast(Any, Paging()), b"", kopf_ready, ready, index, cast(Any, Drain()))
        )
        while ("ns", "stormservices-1") not in index.stormservices:  # the first page is in, the second not yet
            await asyncio.sleep(0.01)
        assert await asyncio.to_thread(status, port) == 503 and not index.caught_up
        release.set()
        await asyncio.wait_for(registering, 10)
        assert index.caught_up and ("ns", "rolesets-2") in index.rolesets
        assert await asyncio.to_thread(status, port) == 200
        await probes.cleanup()

    asyncio.run(scenario())
