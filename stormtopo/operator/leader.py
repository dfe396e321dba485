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

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from stormtopo.operator.kube import Api

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
        leases = client.CoordinationV1Api(self.api.client)
        now = datetime.datetime.now(datetime.UTC)
        try:
            lease = leases.read_namespaced_lease(LEASE_NAME, self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            body = client.V1Lease(
                metadata=client.V1ObjectMeta(name=LEASE_NAME, namespace=self.namespace),
                spec=client.V1LeaseSpec(
                    holder_identity=self.identity,
                    lease_duration_seconds=self.duration,
                    acquire_time=now,
                    renew_time=now,
                    lease_transitions=0,
                ),
            )
            try:
                leases.create_namespaced_lease(self.namespace, body)
                return True
            except ApiException as race:
                if race.status == 409:
                    return False
                raise
        spec = lease.spec
        holder = spec.holder_identity
        renewed = spec.renew_time or spec.acquire_time
        expired = renewed is None or (now - renewed).total_seconds() > (spec.lease_duration_seconds or self.duration)
        if holder != self.identity and not expired:
            return False
        if holder != self.identity:
            spec.acquire_time = now
            spec.lease_transitions = (spec.lease_transitions or 0) + 1
        spec.holder_identity = self.identity
        spec.renew_time = now
        spec.lease_duration_seconds = self.duration
        try:
            leases.replace_namespaced_lease(LEASE_NAME, self.namespace, lease)  # carries resourceVersion
            return True
        except ApiException as exc:
            if exc.status == 409:  # someone else renewed or took it first
                return False
            raise
