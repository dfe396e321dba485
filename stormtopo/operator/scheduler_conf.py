"""Volcano's scheduler configuration, read where Volcano's chart keeps it (a ConfigMap), for a Pending replica's
explanation: whether anything there preempts for a job with a network topology (core/volcano_conf.py).

Read only when an explanation is about to be said, at most once every CONF_TTL seconds: a cluster with no Pending hard
replica never reads it, whatever its size. What is not there to read (no such ConfigMap or key, no right to
it, text vc-scheduler would not load) leaves the explanation as it is without it, logged when the reason
changes. A read the API server does not answer (slow, throttled, a 5xx) keeps the last reading: a Warning
does not change, and is not said again, for a moment's outage.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from stormtopo.core.volcano_conf import SCHEDULER_CONFIG_KEY, SchedulerConf, SchedulerConfError, parse_scheduler_conf
from stormtopo.kube.client import Api
from stormtopo.kube.errors import Forbidden, NotFound

log = logging.getLogger(__name__)

CONF_TTL = 10.0  # seconds a reading is reused: one small read at most this often, only while explaining
READ_TIMEOUT = 5.0  # an explanation waits no longer for it (a slow API server): said as without it


def read_scheduler_conf(api: Api, configmap: str) -> SchedulerConf | str:
    """The configuration in ConfigMap `configmap` (NAMESPACE/NAME), or why there is none to read. A read the
    API server did not answer raises (KubeError)."""
    namespace, _, name = configmap.partition("/")
    where = f"ConfigMap {configmap} key {SCHEDULER_CONFIG_KEY}"
    try:
        found = api.get(("", "v1"), "configmaps", namespace, name)
    except NotFound:
        found = None
    except Forbidden as exc:
        return f"{where}: {exc}"
    if found is None:
        return f"{where}: not found"
    text = (found.get("data") or {}).get(SCHEDULER_CONFIG_KEY)
    if not isinstance(text, str):
        return f"{where}: no such key"
    try:
        return parse_scheduler_conf(text, where)
    except SchedulerConfError as exc:
        return f"{where}: {exc}"


@dataclass
class VolcanoConf:
    """The last reading of the ConfigMap (--volcano-scheduler-configmap; "" reads none)."""

    api: Api
    configmap: str
    ttl: float = CONF_TTL
    _read_at: float = float("-inf")
    _conf: SchedulerConf | None = None
    _said: str | None = field(default=None, repr=False)  # the last problem logged

    async def scheduler(self, fresh_within: float | None = None) -> SchedulerConf | None:
        """The configuration, read again if the last reading is older than the TTL (or `fresh_within` seconds:
        a decision that acts on it, rarer than an explanation, wants it current)."""
        if not self.configmap:
            return None
        now = time.monotonic()
        if now - self._read_at < min(self.ttl, fresh_within if fresh_within is not None else self.ttl):
            return self._conf
        self._read_at = now
        try:
            read = await asyncio.wait_for(asyncio.to_thread(read_scheduler_conf, self.api, self.configmap), READ_TIMEOUT)
        except Exception as exc:  # advisory: an explanation is never held up by it for long, nor fails with it
            log.info("Volcano's scheduler configuration (ConfigMap %s) was not read (%r): the last reading stands", self.configmap, exc)
            return self._conf
        if isinstance(read, str):
            if read != self._said:
                log.info("Volcano's scheduler configuration is not read (%s): explanations do not say whether it preempts", read)
                self._said = read
            self._conf = None
        else:
            self._said, self._conf = None, read
        return self._conf
