"""Leader election on a coordination.k8s.io Lease: every replica serves the webhook, one reconciles.

kopf's peering only pauses operators that see each other; it does not elect. This is the client-go
scheme in a few lines: hold the Lease by renewing it; take it over when its holder has not renewed it
for a whole lease duration; optimistic concurrency (resourceVersion) settles races.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import socket
from collections.abc import Awaitable, Callable

from stormtopo.kube.client import Api, ApiError, micro_time

log = logging.getLogger("stormtopo.leader")
LEASE_NAME = "stormtopo-operator"


def default_identity() -> str:
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


class Leadership:
    """`is_leader` is True while this replica holds the Lease (always True when election is off)."""

    def __init__(self, api: Api | None, namespace: str = "", identity: str = "", duration: int = 15) -> None:
        self.api = api
        self.namespace = namespace
        self.identity = identity or default_identity()
        self.duration = duration
        self.is_leader = api is None
        self.on_elected: Callable[[], Awaitable[None]] | None = None

    async def run(self) -> None:
        if self.api is None:
            return
        while True:
            was = self.is_leader
            try:
                self.is_leader = await asyncio.to_thread(self._try_acquire_or_renew)
            except Exception:  # the API server may be restarting: keep trying, but stop acting as leader
                log.exception("lease %s/%s could not be read or renewed", self.namespace, LEASE_NAME)
                self.is_leader = False
            if self.is_leader != was:
                log.warning(
                    "%s %s leadership of lease %s/%s", self.identity, "took" if self.is_leader else "lost", self.namespace, LEASE_NAME
                )
                if self.is_leader and self.on_elected is not None:
                    await self.on_elected()
            await asyncio.sleep(max(1.0, self.duration / 3))

    def _try_acquire_or_renew(self) -> bool:
        assert self.api is not None
        now = datetime.datetime.now(datetime.UTC)
        stamp = micro_time(now.timestamp())
        lease = self.api.get_lease(self.namespace, LEASE_NAME)
        if lease is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": LEASE_NAME, "namespace": self.namespace},
                "spec": {
                    "holderIdentity": self.identity,
                    "leaseDurationSeconds": self.duration,
                    "acquireTime": stamp,
                    "renewTime": stamp,
                    "leaseTransitions": 0,
                },
            }
            try:
                self.api.create_lease(body)
                return True
            except ApiError as race:
                if race.status == 409:
                    return False
                raise
        spec = lease.setdefault("spec", {})
        renewed = spec.get("renewTime") or spec.get("acquireTime")
        age = (now - datetime.datetime.fromisoformat(renewed)).total_seconds() if renewed else None
        expired = age is None or age > (spec.get("leaseDurationSeconds") or self.duration)
        if spec.get("holderIdentity") != self.identity and not expired:
            return False
        if spec.get("holderIdentity") != self.identity:
            spec["acquireTime"] = stamp
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        spec.update(holderIdentity=self.identity, renewTime=stamp, leaseDurationSeconds=self.duration)
        try:
            self.api.replace_lease(lease)  # carries resourceVersion
            return True
        except ApiError as exc:
            if exc.status == 409:  # someone else renewed or took it first
                return False
            raise
