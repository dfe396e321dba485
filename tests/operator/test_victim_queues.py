"""The queues of exact preemption's victims (operator/victim_queues.py): read a few at once, kept a while, a gone
or refused PodGroup an answer (not taken), an API server that does not answer no answer at all (nothing is
evicted on a half-read cluster)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from stormtopo.kube.errors import ApiError, ApiUnavailable
from stormtopo.operator import victim_queues
from stormtopo.operator.victim_queues import VictimQueues


class FakeApi:
    """GETs of PodGroups, answered from `podgroups` (name -> queue, or an exception to raise), counted."""

    def __init__(self, podgroups: dict[str, Any]) -> None:
        self.podgroups = podgroups
        self.gets: list[str] = []
        self.lock = threading.Lock()

    def get(self, group: tuple[str, str], plural: str, namespace: str, name: str) -> Any:
        assert (group, plural) == (("scheduling.volcano.sh", "v1beta1"), "podgroups")
        with self.lock:
            self.gets.append(f"{namespace}/{name}")
        answer = self.podgroups.get(f"{namespace}/{name}")
        if isinstance(answer, BaseException):
            raise answer
        if isinstance(answer, threading.Event):
            answer.wait(1.0)  # (asyncio.run waits for its threads on the way out)
            return None
        return None if answer is None else {"spec": {"queue": answer} if answer != "-" else {}}


def path(gang: str) -> str:
    return f"/apis/scheduling.volcano.sh/v1beta1/namespaces/{gang.replace('/', '/podgroups/')}"


def test_each_gangs_queue_is_read_once_and_kept_a_gone_or_refused_one_is_no_queue() -> None:
    api = FakeApi({"b/one": "team-b", "b/two": "-", "b/mine": ApiError.of(403, "GET", path("b/mine"), "forbidden")})
    queues = VictimQueues(api)  # type: ignore[arg-type]
    read = asyncio.run(queues.read({"b/one", "b/two", "b/gone", "b/mine"}))
    assert read == {"b/one": "team-b", "b/two": "default", "b/gone": "", "b/mine": ""}  # none named: Volcano's default
    assert sorted(api.gets) == ["b/gone", "b/mine", "b/one", "b/two"]
    again = asyncio.run(queues.read({"b/one", "b/three"}))
    assert again == {"b/one": "team-b", "b/three": ""} and api.gets.count("b/one") == 1  # kept: not read again


@pytest.mark.parametrize(
    "failure",
    [
        ApiError.of(503, "GET", path("b/one"), "unavailable"),
        ApiError.of(429, "GET", path("b/one"), "slow down"),
        ApiUnavailable("GET", path("b/one"), "timed out"),
    ],
)
def test_an_api_server_that_does_not_answer_gives_no_answer_and_nothing_is_kept(failure: Exception) -> None:
    api = FakeApi({"b/one": failure, "b/two": "team-b"})
    queues = VictimQueues(api)  # type: ignore[arg-type]
    assert asyncio.run(queues.read({"b/one", "b/two"})) is None
    api.podgroups["b/one"] = "team-b"
    assert asyncio.run(queues.read({"b/one"})) == {"b/one": "team-b"}  # read again once it answers


def test_a_round_that_outlasts_its_deadline_is_no_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(victim_queues, "ROUND_DEADLINE", 0.2)
    hung = threading.Event()
    try:
        assert asyncio.run(VictimQueues(FakeApi({"b/slow": hung})).read({"b/slow"})) is None  # type: ignore[arg-type]
    finally:
        hung.set()


def test_what_is_kept_is_bounded_the_least_recently_read_go_first() -> None:
    queues = VictimQueues(FakeApi({}), kept=3)  # type: ignore[arg-type]
    for gang in ("b/1", "b/2", "b/3", "b/4"):
        asyncio.run(queues.read({gang}))
    assert list(queues._queues) == ["b/2", "b/3", "b/4"]
