"""The operator's own list+watch (issue 20, item 2), against a small HTTP server that speaks the API's
list and watch protocol: selected on the server, paged, streamed a line at a time, re-listed on 410."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from aiohttp import web

from stormtopo.kube.client import Api
from stormtopo.kube.watch import WatchStreams
from stormtopo.operator.loops import Loops
from stormtopo.operator.watch import ListWatch
from tests.kube.kubeconfig import kubeconfig_for

SELECTOR = "stormtopo.io/admitted"


def _pod(name: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv}}


class FakeApiServer:
    """Lists pods a page at a time; the first watch sends an event split across chunks, a bookmark and
    a 410; pod b is deleted meanwhile; the second watch sends one event and stays open."""

    def __init__(self) -> None:
        self.requests: list[dict[str, str]] = []
        self.lists = 0
        self.watches = 0
        self.done = asyncio.Event()  # ends the open watch at the end of the test

    async def pods(self, request: web.Request) -> web.StreamResponse:
        query = dict(request.query)
        self.requests.append(query)
        assert query["labelSelector"] == SELECTOR  # selected on the server, never in the client
        if query.get("watch") != "true":
            assert query["limit"]
            self.lists += 1
            if self.lists == 1 and not query.get("continue"):
                return web.json_response({"metadata": {"resourceVersion": "10", "continue": "page2"}, "items": [_pod("a", "5")]})
            if self.lists == 2:
                return web.json_response({"metadata": {"resourceVersion": "10"}, "items": [_pod("b", "6")]})
            return web.json_response({"metadata": {"resourceVersion": "20"}, "items": [_pod("a", "5"), _pod("c", "11")]})
        assert query["allowWatchBookmarks"] == "true"
        self.watches += 1
        response = web.StreamResponse()
        await response.prepare(request)
        if self.watches == 1:
            assert query["resourceVersion"] == "10"
            line = json.dumps({"type": "ADDED", "object": {"kind": "Pod", **_pod("c", "11")}}).encode() + b"\n"
            await response.write(line[:15])  # a line split across chunks
            await asyncio.sleep(0.05)
            await response.write(line[15:])
            bookmark = {"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {"resourceVersion": "12"}}}
            await response.write(json.dumps(bookmark).encode() + b"\n")
            gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}
            await response.write(json.dumps(gone).encode() + b"\n")
            return response
        assert query["resourceVersion"] == "20"
        await response.write(json.dumps({"type": "MODIFIED", "object": {"kind": "Pod", **_pod("a", "21")}}).encode() + b"\n")
        await self.done.wait()
        return response


async def serving(pods: Any, directory: Path) -> tuple[web.AppRunner, Api]:
    """`pods` answering /api/v1/pods on a local port, and the operator's client with a kubeconfig for it."""
    app = web.Application()
    app.router.add_get("/api/v1/pods", pods)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, Api(str(kubeconfig_for(directory, f"http://127.0.0.1:{runner.addresses[0][1]}")))


def test_lists_a_page_at_a_time_watches_from_its_version_and_relists_after_410(tmp_path: Path) -> None:
    async def scenario() -> None:
        server = FakeApiServer()
        runner, api = await serving(server.pods, tmp_path)
        streams = WatchStreams(api)
        seen: list[tuple[str | None, str, str]] = []
        gone: list[tuple[str, str]] = []
        watcher = ListWatch(
            api,
            streams,
            "Pod",
            "v1",
            "/api/v1/pods",
            SELECTOR,
            lambda kind, obj: seen.append((kind, obj["metadata"]["name"], obj["kind"])),
            gone.append,
        )
        loops = Loops()
        loop = loops.supervise("watch-pods", 330, watcher.run)
        try:
            for _ in range(200):
                if ("MODIFIED", "a", "Pod") in seen:
                    break
                await asyncio.sleep(0.02)
        finally:
            await loops.stop()
            await streams.close()
            server.done.set()
            await runner.cleanup()
        assert seen == [
            (None, "a", "Pod"),  # the first list, two pages; listed items get their kind
            (None, "b", "Pod"),
            ("ADDED", "c", "Pod"),  # the event split across two chunks
            (None, "a", "Pod"),  # the re-list after 410
            (None, "c", "Pod"),
            ("MODIFIED", "a", "Pod"),  # watched from the re-list's version
        ]
        assert gone == [("ns", "b")]  # deleted while the watch was expired: the re-list no longer has it
        assert watcher.known == {("ns", "a"), ("ns", "c")} and watcher.resource_version == "21"
        assert loop.failures == 0 and loop.last_success is not None
        assert server.requests[1]["continue"] == "page2"

    asyncio.run(scenario())


def test_a_refused_connection_is_retried_with_a_backoff(tmp_path: Path) -> None:
    """No API server at all: the stream fails with ApiUnavailable, the supervisor keeps it going."""

    async def scenario() -> None:
        kubeconfig = kubeconfig_for(tmp_path, "http://127.0.0.1:9")  # discard port: refused
        api = Api(str(kubeconfig))
        streams = WatchStreams(api)
        watcher = ListWatch(api, streams, "Pod", "v1", "/api/v1/pods", SELECTOR, lambda kind, obj: None, lambda key: None)
        watcher.resource_version = "5"  # straight to the (aiohttp) watch
        loops = Loops()
        loop = loops.supervise("watch-pods", 330, watcher.run)
        for _ in range(300):
            if loop.failures >= 2:
                break
            await asyncio.sleep(0.01)
        assert loop.failures >= 2 and "ApiUnavailable" in loop.last_error
        assert loop.task is not None and not loop.task.done()
        await loops.stop()
        await streams.close()

    asyncio.run(scenario())


def test_a_kind_not_served_yet_is_listed_again_within_seconds_not_the_30_s_cap(tmp_path: Path) -> None:
    """Right after kube-apiserver restarts it answers 404 for a CRD's kind for a few seconds: the list is
    retried after 1 s, 2 s ... (issue 32: the watches resume with the API server), not after 30 s."""

    async def scenario() -> None:
        asked: list[float] = []
        done = asyncio.Event()

        async def pods(request: web.Request) -> web.StreamResponse:
            if request.query.get("watch") == "true":
                response = web.StreamResponse()
                await response.prepare(request)
                await done.wait()
                return response
            asked.append(asyncio.get_running_loop().time())
            if len(asked) <= 2:
                return web.json_response({"kind": "Status", "code": 404, "reason": "NotFound"}, status=404)
            return web.json_response({"metadata": {"resourceVersion": "7"}, "items": [_pod("a", "5")]})

        app = web.Application()
        app.router.add_get("/api/v1/pods", pods)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        port = runner.addresses[0][1]
        kubeconfig = kubeconfig_for(tmp_path, f"http://127.0.0.1:{port}")
        api = Api(str(kubeconfig))
        streams = WatchStreams(api)
        seen: list[str] = []
        watcher = ListWatch(
            api, streams, "Pod", "v1", "/api/v1/pods", SELECTOR, lambda kind, obj: seen.append(obj["metadata"]["name"]), lambda key: None
        )
        loops = Loops()
        loop = loops.supervise("watch-pods", 330, watcher.run)
        try:
            for _ in range(1000):  # waits on the list, up to 20 s on a loaded machine
                if seen:
                    break
                await asyncio.sleep(0.02)
        finally:
            await loops.stop()
            await streams.close()
            done.set()
            await runner.cleanup()
        assert seen == ["a"] and len(asked) == 3
        assert 0.9 <= asked[1] - asked[0] < 10 and 1.9 <= asked[2] - asked[1] < 12  # 1 s, then 2 s; never the 30 s cap
        assert loop.failures == 0  # a kind not served is not a failure of this loop

    asyncio.run(scenario())


def test_a_forbidden_watch_lists_again_rather_than_stay_at_its_last_list(tmp_path: Path) -> None:
    """RBAC granting list but not watch (the chart before it granted watch on nodes): the reading must not
    stay frozen at its first list while the loop fails: the next try lists again."""

    async def scenario() -> None:
        lists: list[int] = []

        async def nodes(request: web.Request) -> web.StreamResponse:
            if request.query.get("watch") == "true":
                return web.json_response({"kind": "Status", "code": 403, "reason": "Forbidden"}, status=403)
            lists.append(1)
            return web.json_response({"metadata": {"resourceVersion": str(len(lists))}, "items": []})

        app = web.Application()
        app.router.add_get("/api/v1/nodes", nodes)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        api = Api(str(kubeconfig_for(tmp_path, f"http://127.0.0.1:{runner.addresses[0][1]}")))
        streams = WatchStreams(api)
        watcher = ListWatch(api, streams, "Node", "v1", "/api/v1/nodes", "", lambda kind, obj: None, lambda key: None)
        loops = Loops()
        loop = loops.supervise("watch-nodes", 330, watcher.run)
        try:
            for _ in range(1000):  # the supervisor's backoff: 1 s, then 2 s
                if len(lists) >= 2:
                    break
                await asyncio.sleep(0.02)
        finally:
            await loops.stop()
            await streams.close()
            await runner.cleanup()
        assert len(lists) >= 2 and loop.failures_total >= 1 and "403" in loop.last_error

    asyncio.run(scenario())


def test_a_watch_answering_error_is_a_failure_of_its_loop_retried_and_the_watch_resumes(tmp_path: Path) -> None:
    """Issue 42, item 6: a watch whose stream answers ERROR (an API server failing over: 500 "leader changed", or a
    403 while RBAC is being changed) ends that watch as a failure the loop counts and backs off from; the next
    try lists and watches again, and the loop never dies nor counts as stuck."""

    class Failing:
        def __init__(self) -> None:
            self.watches = 0
            self.done = asyncio.Event()

        async def pods(self, request: web.Request) -> web.StreamResponse:
            if request.query.get("watch") != "true":
                return web.json_response({"metadata": {"resourceVersion": "10"}, "items": [_pod("a", "5")]})
            self.watches += 1
            response = web.StreamResponse()
            await response.prepare(request)
            if self.watches <= 2:
                code, reason = (500, "InternalError") if self.watches == 1 else (403, "Forbidden")
                error = {
                    "type": "ERROR",
                    "object": {"kind": "Status", "code": code, "reason": reason, "message": "etcdserver: leader changed"},
                }
                await response.write(json.dumps(error).encode() + b"\n")
                return response
            await response.write(json.dumps({"type": "MODIFIED", "object": {"kind": "Pod", **_pod("a", "21")}}).encode() + b"\n")
            await self.done.wait()
            return response

    async def scenario() -> None:
        server = Failing()
        runner, api = await serving(server.pods, tmp_path)
        streams = WatchStreams(api)
        seen: list[tuple[str | None, str]] = []
        watcher = ListWatch(
            api, streams, "Pod", "v1", "/api/v1/pods", SELECTOR, lambda k, o: seen.append((k, o["metadata"]["resourceVersion"])), print
        )
        loops = Loops()
        loop = loops.supervise("watch-pods", 330, watcher.run)
        failures = 0
        try:
            for _ in range(500):  # the backoff after two failures: 1 s, then 2 s
                failures = max(failures, loop.failures)
                if ("MODIFIED", "21") in seen:
                    break
                await asyncio.sleep(0.02)
            healthy, report = loops.health()
        finally:
            await loops.stop()
            await streams.close()
            server.done.set()
            await runner.cleanup()
        assert ("MODIFIED", "21") in seen and server.watches == 3
        assert failures == 2  # each ERROR a failure of the loop, backed off from
        assert loop.failures == 0 and loop.last_success is not None  # the watch that works counts as the loop working again
        assert healthy, report

    asyncio.run(scenario())
