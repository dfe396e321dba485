"""Supervised loops (issue 20, item 1): no exception ends one, failures back off, /healthz sees a stuck one."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import urllib3

from stormtopo.kube.client import (
    Api,
    ApiError,
    ApiUnavailable,
    Conflict,
    Forbidden,
    Gone,
    Invalid,
    KubeError,
    NotFound,
    ServerError,
    TooManyRequests,
    Unauthorized,
)
from stormtopo.operator.app import health_response
from stormtopo.operator.events import EventRecorder
from stormtopo.operator.loops import BACKOFF_CAP, HANG_SECONDS, Loop, Loops, backoff, stuck


def test_backoff_doubles_from_one_second_up_to_the_cap_and_is_zero_without_failures() -> None:
    assert [backoff(n) for n in range(8)] == [0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert backoff(10_000) == BACKOFF_CAP  # no overflow after a very long outage
    assert backoff(3, base=0.5, cap=1.5) == 1.5


def test_a_loop_is_stuck_after_three_periods_plus_the_backoff_cap_or_once_its_task_ended() -> None:
    assert stuck(30.0, last_progress=0.0, now=3 * 30 + BACKOFF_CAP, done=False) is None
    reason = stuck(30.0, last_progress=0.0, now=3 * 30 + BACKOFF_CAP + 1, done=False)
    assert reason is not None and "121 s" in reason
    assert stuck(30.0, last_progress=100.0, now=101.0, done=True) == "its task ended"


def test_while_the_api_server_is_away_retries_wait_at_most_five_seconds() -> None:
    """Back within a resync period once it returns: no 30 s backoff left to wait out (issue 32)."""
    loop = Loop("watch", 1.0, started=0.0)
    delays = [loop.failed(ApiUnavailable("GET", "/api/v1/pods", "refused")) for _ in range(8)]
    assert max(delays) == 5.0
    assert loop.failed(ApiError.of(503, "GET", "/apis", "not ready")) == 5.0
    other = Loop("x", 1.0, started=0.0)
    assert max(other.failed(ApiError.of(403, "PATCH", "/apis", "forbidden")) for _ in range(8)) == BACKOFF_CAP


def test_an_iteration_under_way_is_stuck_only_after_the_hang_limit() -> None:
    """Issue 32: a pass waiting behind a long explanation (up to 120 s) is slow, not stuck."""
    assert stuck(1.0, last_progress=0.0, now=150.0, done=False, busy_since=0.0) is None
    reason = stuck(1.0, last_progress=0.0, now=HANG_SECONDS + 1, done=False, busy_since=0.0)
    assert reason is not None and "one iteration running" in reason
    assert stuck(300.0, last_progress=0.0, now=2999.0, done=False, busy_since=0.0) is None  # 10 periods of a slow loop
    # --hang-seconds: the same rule at a shorter limit (tests shorten it with the periods).
    assert stuck(1.0, last_progress=0.0, now=41.0, done=False, busy_since=0.0, hang=40.0) is not None
    assert stuck(1.0, last_progress=0.0, now=39.0, done=False, busy_since=0.0, hang=40.0) is None


def test_a_loop_that_fails_for_ever_is_not_stuck_and_logs_once_per_reason(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 32, items 1 and 2: the API server down, a webhook refusing: every iteration fails, the loop
    runs, /healthz stays 200; the traceback is logged when the reason changes, not at every retry."""

    async def scenario() -> None:
        now = [0.0]
        loops = Loops(clock=lambda: now[0])
        calls: list[int] = []

        async def refused() -> None:
            calls.append(1)
            now[0] += 100.0  # each attempt far apart: 30 attempts span more than any stale limit
            if len(calls) <= 25:
                raise ApiError.of(500, "PATCH", f"/apis/topology.volcano.sh/v1alpha1/hypernodes/s{len(calls)}", "webhook refused")
            raise ApiUnavailable("GET", "/api/v1/pods", "connection refused")

        loop = loops.every("node-tier", 0.001, refused)
        while len(calls) < 30:
            await asyncio.sleep(0.001)
            assert health_response(loops).status == 200, loop.problem(now[0])
        await loops.stop()
        assert loop.failures >= 29 and loop.failures_total >= 29 and loop.last_success is None

    monkeypatch.setattr("stormtopo.operator.loops.backoff", lambda failures, **_: 0.0)  # no waiting in the test
    with caplog.at_level("INFO", logger="stormtopo.loops"):
        asyncio.run(scenario())
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert len(tracebacks) == 2, [r.getMessage() for r in tracebacks]  # one per reason, not one per failure
    assert "webhook refused" in tracebacks[0].getMessage() and "connection refused" in tracebacks[1].getMessage()
    assert any("still failing (10 in a row)" in r.getMessage() for r in caplog.records)


def test_a_success_resets_the_failure_count_and_a_handled_failure_keeps_the_loop_alive() -> None:
    now = [0.0]
    loop = Loop("x", 10.0, started=0.0, clock=lambda: now[0])
    assert loop.failed(RuntimeError("a")) == 1.0 and loop.failed(RuntimeError("b")) == 2.0
    assert loop.last_error == "RuntimeError: b"
    now[0] = 100.0
    assert loop.problem(now[0]) is not None  # 100 s without an iteration, allowed 60
    loop.alive()  # e.g. the event poster retrying an Event while the API server is down
    assert loop.problem(now[0]) is None and loop.failures == 2 and loop.last_success is None
    loop.succeeded()
    assert loop.failures == 0 and loop.last_success == 100.0


def test_every_survives_any_exception_and_goes_on() -> None:
    """The loops of issue 20: urllib3's connection errors are not OSError, and `_every` had no try."""

    async def scenario() -> None:
        loops = Loops()
        calls: list[int] = []

        async def flaky() -> None:
            calls.append(len(calls))
            if len(calls) <= 2:
                raise urllib3.exceptions.NewConnectionError(None, "connection refused")  # type: ignore[arg-type]
            if len(calls) == 3:
                raise KeyError("a bug")

        loop = loops.every("flaky", 0.01, flaky)
        while len(calls) < 5:
            await asyncio.sleep(0.01)
        assert loop.task is not None and not loop.task.done()
        assert loop.failures == 0 and loop.last_success is not None
        ok, report = loops.health()
        assert ok and report["flaky"]["problem"] is None
        await loops.stop()
        assert loop.task.cancelled()

    asyncio.run(scenario(), debug=False)


def test_every_skips_the_work_but_counts_the_iteration_when_not_wanted() -> None:
    async def scenario() -> None:
        loops = Loops()
        calls: list[None] = []

        async def work() -> None:
            calls.append(None)

        loop = loops.every("resync", 0.01, work, when=lambda: False)  # a follower: nothing to resync
        while loop.last_success is None:
            await asyncio.sleep(0.01)
        assert not calls
        await loops.stop()

    asyncio.run(scenario())


def test_every_runs_at_once_when_woken_and_not_again_until_woken_or_due() -> None:
    async def scenario() -> None:
        loops = Loops()
        wake = asyncio.Event()
        calls: list[None] = []

        async def work() -> None:
            calls.append(None)

        loops.every("node-tier", 3600.0, work, wake=wake)  # due only in an hour
        await asyncio.sleep(0.05)
        assert not calls
        wake.set()
        await asyncio.wait_for(_until(lambda: len(calls) == 1), 10)
        await asyncio.sleep(0.05)
        assert len(calls) == 1 and not wake.is_set()  # cleared: the next run waits for the next wake
        wake.set()
        await asyncio.wait_for(_until(lambda: len(calls) == 2), 10)
        await loops.stop()

    asyncio.run(scenario())


def test_woken_passes_start_at_least_min_gap_apart() -> None:
    async def scenario() -> None:
        import itertools
        import time

        loops = Loops()
        wake = asyncio.Event()
        starts: list[float] = []

        async def work() -> None:
            starts.append(time.monotonic())
            wake.set()  # woken again during the pass, as binds arrive while it reads

        wake.set()
        loops.every("node-tier", 3600.0, work, wake=wake, min_gap=0.3)
        await asyncio.wait_for(_until(lambda: len(starts) >= 3), 10)
        await loops.stop()
        assert all(b - a >= 0.29 for a, b in itertools.pairwise(starts)), starts

    asyncio.run(scenario())


def test_stop_ends_a_loop_woken_at_every_pass() -> None:
    # Cancellation must not be lost when it comes as the event is set (asyncio.wait_for on Python 3.11
    # could swallow it: the loop then ran on and stop() never returned). Run in a thread, so a hang fails
    # the test in seconds rather than at the suite's timeout.
    import threading

    async def once() -> None:
        loops = Loops()
        wake = asyncio.Event()
        passes = 0

        async def work() -> None:
            nonlocal passes
            passes += 1
            wake.set()

        wake.set()
        loops.every("node-tier", 3600.0, work, wake=wake)
        while passes < 3:
            await asyncio.sleep(0)
        await loops.stop()

    def scenario() -> None:
        for _ in range(200):
            asyncio.run(once())

    thread = threading.Thread(target=scenario, daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "Loops.stop() did not end a loop woken at every pass"


async def _until(condition: Any) -> None:
    while not condition():
        await asyncio.sleep(0.01)


def test_supervise_restarts_a_stream_that_raises_or_returns() -> None:
    async def scenario() -> None:
        loops = Loops()
        runs: list[int] = []

        async def stream(loop: Loop) -> None:
            runs.append(1)
            loop.succeeded()
            if len(runs) == 1:
                raise ApiUnavailable("WATCH", "/api/v1/pods", "refused")
            if len(runs) == 2:
                return  # a forever-loop that returned
            await asyncio.Event().wait()

        loop = loops.supervise("watch", 1.0, stream)
        for _ in range(400):  # two backoffs: 1 s + 2 s at most
            if len(runs) >= 3:
                break
            await asyncio.sleep(0.01)
        assert len(runs) == 3 and loop.task is not None and not loop.task.done()
        await loops.stop()

    asyncio.run(scenario())


def test_healthz_is_500_with_the_loop_named_when_a_loop_is_stuck_or_dead() -> None:
    async def scenario() -> None:
        now = [0.0]
        loops = Loops(clock=lambda: now[0])

        async def hangs() -> None:
            await asyncio.Event().wait()  # an await that never returns: never completes an iteration

        loops.every("resync", 0.001, hangs)
        loops.every("quick", 0.001, _nothing)
        await asyncio.sleep(0.05)
        response = health_response(loops)
        assert response.status == 200
        now[0] = 3 * 30 + BACKOFF_CAP + 1  # far past three periods and the backoff cap
        await asyncio.sleep(0.05)  # "quick" runs at the new time
        assert health_response(loops).status == 200, health_response(loops).text  # one iteration under way: slow is not stuck
        now[0] = HANG_SECONDS + 1
        await asyncio.sleep(0.05)
        response = health_response(loops)
        assert response.status == 500
        assert response.text is not None
        body = json.loads(response.text)
        assert body["ok"] is False and "one iteration running" in body["loops"]["resync"]["problem"]
        task = loops.loops["quick"].task
        assert task is not None
        task.cancel()  # a dead loop
        await asyncio.sleep(0)
        assert json.loads(health_response(loops).text or "")["loops"]["quick"]["problem"] == "its task ended"
        await loops.stop()

    asyncio.run(scenario())


async def _nothing() -> None:
    return None


def test_two_loops_may_not_share_a_name() -> None:
    async def scenario() -> None:
        loops = Loops()
        loops.every("a", 1.0, _nothing)
        with pytest.raises(ValueError):
            loops.every("a", 1.0, _nothing)
        await loops.stop()

    asyncio.run(scenario())


# -- the API client's typed errors ------------------------------------------------------------------------


class _Refusing:
    def request(self, *args: Any, **kwargs: Any) -> Any:
        raise urllib3.exceptions.NewConnectionError(None, "Failed to establish a new connection: [Errno 111] refused")  # type: ignore[arg-type]


class _Answering:
    def __init__(self, status: int) -> None:
        self.status = status

    def request(self, *args: Any, **kwargs: Any) -> Any:
        return urllib3.response.HTTPResponse(body=b'{"message": "x"}', status=self.status, preload_content=True)


def _api(http: object) -> Api:
    api = Api.__new__(Api)
    api.credentials = type("C", (), {"server": "https://127.0.0.1:1", "bearer": lambda self: None, "exec_plugin": None})()  # type: ignore[assignment]
    api._client_cert = None
    api.http = http  # type: ignore[assignment]
    return api


def test_transport_errors_are_one_typed_error_and_statuses_have_their_own() -> None:
    with pytest.raises(ApiUnavailable) as unavailable:
        _api(_Refusing()).request("GET", "/api/v1/pods")
    assert isinstance(unavailable.value, KubeError) and not isinstance(unavailable.value, ApiError)
    assert "GET /api/v1/pods" in str(unavailable.value)
    with pytest.raises(NotFound) as missing:
        _api(_Answering(404)).request("GET", "/x")
    assert missing.value.status == 404 and isinstance(missing.value, ApiError)  # `exc.status != 404` still works
    with pytest.raises(Conflict):
        _api(_Answering(409)).request("PUT", "/x")
    with pytest.raises(ApiError) as other:
        _api(_Answering(500)).request("GET", "/x")
    assert isinstance(other.value, ServerError) and isinstance(other.value, KubeError)
    kinds = {401: Unauthorized, 403: Forbidden, 410: Gone, 422: Invalid, 429: TooManyRequests, 503: ServerError}
    for status, kind in kinds.items():  # each answer typed in one place (ApiError.of): no status compared by number
        with pytest.raises(kind):
            _api(_Answering(status)).request("GET", "/x")
    with pytest.raises(ApiError) as teapot:
        _api(_Answering(418)).request("GET", "/x")
    assert type(teapot.value) is ApiError
    assert _api(_Answering(404)).get(("", "v1"), "pods", "ns", "gone") is None


def test_an_eviction_refused_by_a_budget_is_read_from_its_cause_not_its_words() -> None:
    from stormtopo.kube.errors import DISRUPTION_BUDGET_CAUSE

    body = json.dumps(
        {"kind": "Status", "reason": "TooManyRequests", "details": {"causes": [{"type": DISRUPTION_BUDGET_CAUSE, "message": "x"}]}}
    )
    assert ApiError.of(429, "POST", "/eviction", body).refused_by_budget
    assert not ApiError.of(429, "POST", "/eviction", json.dumps({"kind": "Status", "reason": "TooManyRequests"})).refused_by_budget  # APF
    several = "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."
    assert ApiError.of(500, "POST", "/eviction", json.dumps({"kind": "Status", "message": several})).refused_by_budget
    assert not ApiError.of(403, "POST", "/eviction", body).refused_by_budget


def test_what_the_api_answered_is_typed_in_one_place() -> None:
    """Issue 44, item 2: callers read a type or a property, never a status number nor the words of a body."""
    from stormtopo.kube.errors import BudgetRefused, Conflict, Forbidden, Gone, NotFound, ServerError, TooManyRequests

    budget = json.dumps({"kind": "Status", "details": {"causes": [{"type": "DisruptionBudget"}]}, "message": "Cannot evict pod"})
    eviction = "/api/v1/namespaces/ns/pods/p/eviction"
    assert isinstance(ApiError.of(429, "POST", eviction, budget), BudgetRefused)
    several = json.dumps({"kind": "Status", "message": "This pod has more than one PodDisruptionBudget"})
    assert isinstance(ApiError.of(500, "POST", eviction, several), BudgetRefused)
    throttled = ApiError.of(429, "POST", eviction, json.dumps({"kind": "Status", "reason": "TooManyRequests"}))
    assert isinstance(throttled, TooManyRequests) and not isinstance(throttled, BudgetRefused)  # API priority and fairness
    assert isinstance(ApiError.of(429, "PATCH", "/api/v1/pods", budget), TooManyRequests)  # no eviction: no budget's refusal
    assert isinstance(ApiError.of(410, "WATCH", "/x", "{}"), Gone)
    assert ApiError.of(403, "GET", "/x", json.dumps({"kind": "Status", "message": " not allowed "})).message == "not allowed"
    assert ApiError.of(502, "GET", "/x", "<html>bad gateway</html>").message == "<html>bad gateway</html>"
    refusals = {status: ApiError.of(status, "PATCH", "/x", "{}").refusal for status in (400, 403, 404, 409, 422, 429, 500, 503)}
    assert refusals == {400: True, 403: True, 404: True, 409: False, 422: True, 429: False, 500: False, 503: False}
    assert not ApiError.of(429, "POST", eviction, budget).refusal  # the budget may allow it later
    unavailable = {status: ApiError.of(status, "GET", "/x", "").unavailable for status in (500, 503, 504)}
    assert unavailable == {500: False, 503: True, 504: True}
    assert isinstance(ApiError.of(503, "GET", "/x", ""), ServerError)
    assert {type(ApiError.of(s, "GET", "/x", "")) for s in (403, 404, 409)} == {Forbidden, NotFound, Conflict}


def test_an_event_waits_out_an_unavailable_api_server_and_a_refused_one_is_dropped() -> None:
    """The Event poster caught only (ApiError, OSError): urllib3's connection errors ended it for good."""

    class FlakyEvents:
        def __init__(self) -> None:
            self.posted: list[str] = []
            self.calls = 0

        def create_event(self, event: dict[str, Any], instance: str) -> None:
            self.calls += 1
            if event["reason"] == "Refused":
                raise ApiError.of(403, "POST", "/events", "namespace is being terminated")
            if self.calls <= 2:
                raise ApiUnavailable("POST", "/events", "connection refused")
            self.posted.append(event["reason"])

    async def scenario() -> None:
        api = FlakyEvents()
        recorder = EventRecorder(api, "test")  # type: ignore[arg-type]
        loops = Loops()
        loop = loops.supervise("event-poster", 10.0, recorder.run)
        obj = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"}}
        recorder(obj, "Warning", "First", "after two refusals")
        recorder(obj, "Warning", "Refused", "dropped")
        recorder(obj, "Normal", "Third", "posted")
        for _ in range(600):
            if len(api.posted) == 2:
                break
            await asyncio.sleep(0.01)
        assert api.posted == ["First", "Third"] and loop.failures == 0
        assert loop.task is not None and not loop.task.done()
        await loops.stop()

    asyncio.run(scenario())


def test_a_walk_over_many_items_lets_the_loop_answer_between_them() -> None:
    """`yielding` hands the event loop on every few items: a webhook answer waits for a few, not for all."""
    from stormtopo.operator.loops import yielding

    async def walk() -> list[str]:
        seen: list[str] = []

        async def answer() -> None:
            seen.append("answer")

        asyncio.get_running_loop().create_task(answer())
        async for item in yielding(range(6), every=2):
            seen.append(str(item))
        return seen

    assert asyncio.run(walk()) == ["0", "answer", "1", "2", "3", "4", "5"]  # not after all six
