"""Volcano's scheduler configuration as the operator reads it (operator/scheduler_conf.py): advisory, so a
missing, refused, invalid or slow read is no reading, each said once, and a reading is reused CONF_TTL."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest

from stormtopo.devenv.cluster import SCHEDULER_CONF
from stormtopo.kube.errors import ApiError
from stormtopo.operator import scheduler_conf
from stormtopo.operator.scheduler_conf import VolcanoConf, read_scheduler_conf


class FakeApi:
    """Only what the reader calls: a GET of one ConfigMap, answered from `answer` (an exception is raised)."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.gets = 0

    def get(self, group: tuple[str, str], plural: str, namespace: str, name: str) -> Any:
        assert (group, plural, namespace, name) == (("", "v1"), "configmaps", "volcano-system", "volcano-scheduler-configmap")
        self.gets += 1
        if isinstance(self.answer, BaseException):
            raise self.answer
        if isinstance(self.answer, threading.Event):
            self.answer.wait(1.0)  # (asyncio.run waits for its threads on the way out)
            return None
        return self.answer


WHERE = "volcano-system/volcano-scheduler-configmap"


def configmap(text: str) -> dict[str, Any]:
    return {"data": {"volcano-scheduler.conf": text}}


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        (None, "not found"),
        ({"data": {}}, "no such key"),
        (configmap("actions: [unclosed"), "not valid YAML"),
        (ApiError.of(403, "GET", "/api/v1/namespaces/volcano-system/configmaps/volcano-scheduler-configmap", "forbidden"), "403"),
    ],
)
def test_what_cannot_be_read_says_why_naming_the_configmap(answer: Any, problem: str) -> None:
    read = read_scheduler_conf(FakeApi(answer), WHERE)  # type: ignore[arg-type]
    assert isinstance(read, str) and read.startswith(f"ConfigMap {WHERE} key volcano-scheduler.conf: ") and problem in read, read


def test_a_reading_is_reused_for_its_ttl_and_a_failure_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    api = FakeApi(configmap(SCHEDULER_CONF))
    reader = VolcanoConf(api, WHERE)  # type: ignore[arg-type]
    conf = asyncio.run(reader.scheduler())
    assert conf is not None and conf.preempts_for_topology and conf.where == f"ConfigMap {WHERE} key volcano-scheduler.conf"
    assert asyncio.run(reader.scheduler()) is conf and api.gets == 1  # within its TTL: not read again
    assert asyncio.run(reader.scheduler(fresh_within=60.0)) is conf and api.gets == 1  # never staler than the TTL
    asyncio.run(reader.scheduler(fresh_within=0.0))  # a decision that acts on it (narrowing) reads it current
    assert api.gets == 2
    broken = VolcanoConf(FakeApi(None), WHERE, ttl=0.0)  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger=scheduler_conf.__name__):
        assert asyncio.run(broken.scheduler()) is None and asyncio.run(broken.scheduler()) is None
    assert len([r for r in caplog.records if "not found" in r.getMessage()]) == 1
    unread = VolcanoConf(api, "")  # type: ignore[arg-type]
    assert asyncio.run(unread.scheduler()) is None and api.gets == 2  # "" reads nothing


def test_a_read_the_api_server_does_not_answer_keeps_the_last_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    """Slow, throttled or a 5xx: the last reading stands (a Warning does not flip for a moment's outage); with
    none yet, none."""
    monkeypatch.setattr(scheduler_conf, "READ_TIMEOUT", 0.2)
    api = FakeApi(configmap(SCHEDULER_CONF))
    reader = VolcanoConf(api, WHERE, ttl=0.0)  # type: ignore[arg-type]
    good = asyncio.run(reader.scheduler())
    assert good is not None
    api.answer = ApiError.of(503, "GET", "/api/v1/namespaces/volcano-system/configmaps/x", "unavailable")
    assert asyncio.run(reader.scheduler()) is good
    hung = threading.Event()
    api.answer = hung
    try:
        assert asyncio.run(reader.scheduler()) is good
        assert asyncio.run(VolcanoConf(FakeApi(hung), WHERE).scheduler()) is None  # type: ignore[arg-type]
    finally:
        hung.set()
    api.answer = None  # gone: no reading any more
    assert asyncio.run(reader.scheduler()) is None
