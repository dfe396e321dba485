"""The opted-in list: the ConfigMap the admission policy reads to know which StormServices' pods
must have been admitted by stormtopo (see core/optin.py for why it exists)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from stormtopo.core.optin import listing_change, opted_in_configmap, opted_in_key
from stormtopo.core.vocabulary import OPTED_IN_CONFIGMAP
from stormtopo.kube.client import MERGE_PATCH, Api, ApiError

log = logging.getLogger("stormtopo.optedin")


class OptedInList:
    def __init__(self, api: Api, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        self.listed: dict[str, str] = {}  # as last read or written by this replica
        self._absent: set[str] = set()  # keys absent from the index at the last check

    @property
    def path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/configmaps/{OPTED_IN_CONFIGMAP}"

    def refresh(self) -> None:
        """Read the list (other replicas' webhooks add to it too)."""
        try:
            self.listed = dict((self.api.request("GET", self.path) or {}).get("data") or {})
        except ApiError as exc:
            if exc.status != 404:
                raise
            self.listed = {}

    def set(self, namespace: str, stormservice: str, want: str | None, force: bool = False) -> None:
        """List a StormService with its scope, or unlist it (None); writes only on a change unless
        `force` (this replica's copy of the list may be stale)."""
        key = opted_in_key(namespace, stormservice)
        change = {key: want} if force else listing_change(self.listed, key, want)
        if change is None:
            return
        try:
            self.api.request("PATCH", self.path, {"data": change}, MERGE_PATCH)
        except ApiError as exc:
            if exc.status != 404:
                raise
            if want is None:
                return
            try:
                self.api.request(
                    "POST", f"/api/v1/namespaces/{self.namespace}/configmaps", {**opted_in_configmap(self.namespace), "data": change}
                )
            except ApiError as exists:
                if exists.status != 409:
                    raise
                # Another replica (or this one's other admission) created it meanwhile: add to theirs.
                self.api.request("PATCH", self.path, {"data": change}, MERGE_PATCH)
        if want is None:
            self.listed.pop(key, None)
        else:
            self.listed[key] = want

    async def aset(self, namespace: str, stormservice: str, want: str | None, force: bool = False) -> None:
        if force or listing_change(self.listed, opted_in_key(namespace, stormservice), want) is not None:
            await asyncio.to_thread(self.set, namespace, stormservice, want, force)

    def stale(self, present: Mapping[str, object]) -> list[str]:
        """Listed keys whose StormService was absent at this and the previous check (`present`: the
        keys of the StormServices known now): deleted while stormtopo was down, or never created
        (the gate lists a StormService before it exists). Two checks, so one just created survives."""
        absent = {key for key in self.listed if key not in present}
        gone = sorted(absent & self._absent)
        self._absent = absent - set(gone)
        return gone

    async def keep(self, namespace: str, stormservice: str, want: str | None) -> None:
        """As aset, from reconciliation: a failure is logged and retried at the next resync, and
        never stops the PodGroups from being reconciled (the list is the outage safety net)."""
        try:
            await self.aset(namespace, stormservice, want)
        except (ApiError, OSError) as exc:
            log.warning("could not update the opted-in list for %s/%s: %s", namespace, stormservice, exc)
