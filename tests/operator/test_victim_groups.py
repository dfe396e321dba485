"""The PodGroups of exact preemption's victims (operator/victim_groups.py): read a few at once, kept a while, a
gone or refused one an answer (not taken), an API server that does not answer no answer at all (nothing is
evicted on a half-read cluster)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from stormtopo.core.preempting import UNREADABLE, VictimGroup
from stormtopo.kube.errors import ApiError, ApiUnavailable
from stormtopo.operator import victim_groups
from stormtopo.operator.victim_groups import VictimGroups


class FakeApi:
    """GETs of PodGroups, answered from `podgroups` (name -> queue, "-" for none, (queue, class), or an exception
    to raise), counted."""

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
        if answer is None:
            return None
        made = {"creationTimestamp": "2020-01-01T00:00:00Z"}  # long ago: any class it names is read by now
        if isinstance(answer, tuple):
            return {"metadata": made, "spec": {"queue": answer[0], "priorityClassName": answer[1]}}
        return {"metadata": made, "spec": {"queue": answer} if answer != "-" else {}}


def path(gang: str) -> str:
    return f"/apis/scheduling.volcano.sh/v1beta1/namespaces/{gang.replace('/', '/podgroups/')}"


def test_each_gangs_podgroup_is_read_once_and_kept_a_gone_or_refused_one_is_unreadable() -> None:
    forbidden = ApiError.of(403, "GET", path("b/mine"), "forbidden")
    api = FakeApi({"b/one": "team-b", "b/two": "-", "b/mine": forbidden, "b/high": ("team-b", "inference-high")})
    groups = VictimGroups(api)  # type: ignore[arg-type]
    read = asyncio.run(groups.read({"b/one", "b/two", "b/gone", "b/mine", "b/high"}))
    assert read == {
        "b/one": VictimGroup("team-b"),
        "b/two": VictimGroup("default"),  # none named: Volcano's default queue
        "b/gone": UNREADABLE,
        "b/mine": UNREADABLE,
        "b/high": VictimGroup("team-b", "inference-high"),
    }
    assert sorted(api.gets) == ["b/gone", "b/high", "b/mine", "b/one", "b/two"]
    again = asyncio.run(groups.read({"b/one", "b/three"}))
    assert again == {"b/one": VictimGroup("team-b"), "b/three": UNREADABLE} and api.gets.count("b/one") == 1  # kept


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
    groups = VictimGroups(api)  # type: ignore[arg-type]
    assert asyncio.run(groups.read({"b/one", "b/two"})) is None
    api.podgroups["b/one"] = "team-b"
    assert asyncio.run(groups.read({"b/one"})) == {"b/one": VictimGroup("team-b")}  # read again once it answers


def test_a_round_that_outlasts_its_deadline_is_no_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(victim_groups, "ROUND_DEADLINE", 0.2)
    hung = threading.Event()
    try:
        assert asyncio.run(VictimGroups(FakeApi({"b/slow": hung})).read({"b/slow"})) is None  # type: ignore[arg-type]
    finally:
        hung.set()


def test_what_is_kept_is_bounded_the_least_recently_read_go_first() -> None:
    groups = VictimGroups(FakeApi({}), kept=3)  # type: ignore[arg-type]
    for gang in ("b/1", "b/2", "b/3", "b/4"):
        asyncio.run(groups.read({gang}))
    assert list(groups._groups) == ["b/2", "b/3", "b/4"]
