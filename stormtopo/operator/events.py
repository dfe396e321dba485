"""Kubernetes Events on the objects they are about, posted by the operator's own API client.

kopf.event() works only inside kopf's handler tasks, and the reconciliation runs in the work queues'
workers. Events are queued and posted by one task, so a burst of a thousand costs a thousand small
queue entries and one connection, and a slow API server never holds up reconciliation.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from stormtopo.kube.client import Api, ApiError, ApiUnavailable, ServerError, TooManyRequests
from stormtopo.operator.loops import Loop, backoff

log = logging.getLogger("stormtopo.events")
# What the reconciler and the placement reporter call: (object, Normal|Warning, reason, message).
Report = Callable[[Mapping[str, Any], str, str, str], None]
MAX_QUEUED = 10_000  # beyond this, Events are dropped (and logged): they are information, not state
IDLE_BEAT = 10.0  # an idle poster reports itself alive this often
EVENT_RETRY_CAP = 10.0  # an Event waiting for the API server is retried at least this often


class EventRecorder:
    def __init__(self, api: Api, instance: str) -> None:
        self.api = api
        self.instance = instance
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(MAX_QUEUED)

    def __call__(self, obj: Mapping[str, Any], event_type: str, reason: str, message: str) -> None:
        """Queue an Event about `obj` (type Normal or Warning); returns at once."""
        meta = obj["metadata"]
        involved = {
            "apiVersion": obj.get("apiVersion"),
            "kind": obj.get("kind"),
            "name": meta["name"],
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
        }
        try:
            self._queue.put_nowait({"involvedObject": involved, "type": event_type, "reason": reason, "message": message})
        except asyncio.QueueFull:
            log.warning("event queue full; dropped %s %s on %s/%s: %s", event_type, reason, involved["namespace"], meta["name"], message)

    async def run(self, loop: Loop) -> None:
        """Post queued Events forever (supervised by `loops`). While the API server cannot be reached
        or fails (5xx), the Event waits and is retried with a backoff, so an outage loses none; an
        Event the API refuses (the namespace is being deleted) is dropped."""
        getter: asyncio.Task[dict[str, Any]] | None = None
        try:
            while True:
                # One get() kept across idle beats: cancelling a get that has just taken an Event
                # (wait_for's timeout) could drop it.
                getter = getter or asyncio.ensure_future(self._queue.get())
                done, _ = await asyncio.wait({getter}, timeout=IDLE_BEAT)
                if not done:
                    loop.succeeded()  # idle is healthy
                    continue
                event, getter = getter.result(), None
                await self._post(event, loop)
        finally:
            if getter is not None:
                getter.cancel()

    async def _post(self, event: dict[str, Any], loop: Loop) -> None:
        failures = 0
        while True:
            try:
                await asyncio.to_thread(self.api.create_event, event, self.instance)
                loop.succeeded()
                return
            except ApiError as exc:
                if not isinstance(exc, (ServerError, TooManyRequests)):
                    log.warning("could not post %s event on %s: %s", event["reason"], event["involvedObject"]["name"], exc)
                    return
                failures += 1
            except (ApiUnavailable, OSError):
                failures += 1
            loop.alive()
            delay = backoff(failures, cap=EVENT_RETRY_CAP)
            log.warning("API server unavailable: %s event on %s waits %.0f s", event["reason"], event["involvedObject"]["name"], delay)
            await asyncio.sleep(delay)
