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

from stormtopo.kube.client import Api, ApiError

log = logging.getLogger("stormtopo.events")
# What the reconciler and the placement reporter call: (object, Normal|Warning, reason, message).
Report = Callable[[Mapping[str, Any], str, str, str], None]
MAX_QUEUED = 10_000  # beyond this, Events are dropped (and logged): they are information, not state


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

    async def run(self) -> None:
        while True:
            event = await self._queue.get()
            try:
                await asyncio.to_thread(self.api.create_event, event, self.instance)
            except (ApiError, OSError) as exc:  # e.g. the namespace is being deleted
                log.warning("could not post %s event on %s: %s", event["reason"], event["involvedObject"]["name"], exc)
