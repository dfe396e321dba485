"""Executes the writes a planner decided, through the API client, counting each in the metrics."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from stormtopo.core.writes import CreatePodGroup, LabelPod, PatchPod, PatchPodGroup, Write
from stormtopo.kube.client import Api, ApiError
from stormtopo.operator import metrics

log = logging.getLogger("stormtopo.writer")


async def execute(api: Api, writes: Iterable[Write]) -> None:
    for write in writes:
        match write:
            case CreatePodGroup(body):
                if await asyncio.to_thread(api.create_podgroup, dict(body)):
                    metrics.PODGROUP_WRITES.labels("create").inc()
            case PatchPodGroup(namespace, name, ops):
                await asyncio.to_thread(api.patch_podgroup, namespace, name, [dict(op) for op in ops])
                metrics.PODGROUP_WRITES.labels("patch").inc()
            case LabelPod(namespace, name, labels):
                await asyncio.to_thread(api.label_pod, namespace, name, dict(labels))
            case PatchPod(namespace, name, ops):
                try:
                    await asyncio.to_thread(api.patch_pod, namespace, name, [dict(op) for op in ops])
                except ApiError as exc:
                    if exc.status == 404:
                        continue  # gone
                    if exc.status != 422:
                        raise
                    # Released already (its "test" op failed), or a patch the API server refuses: say which.
                    log.warning("pod %s/%s not patched: %s", namespace, name, exc)
