"""Watch streams, read a line at a time.

A watch response is one JSON event per line and never ends until the server's timeout: it must be
parsed as it arrives, never read whole. urllib3 (the rest of the client) would hold a worker thread
per open watch for minutes; this uses aiohttp on the event loop instead, with the same TLS context and
credentials as `Api`. Failures map to the client's typed errors: ApiError (and its NotFound,
Conflict) for an HTTP error status, ApiUnavailable for anything that kept the server from answering.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from typing import Any

import aiohttp

from stormtopo.kube.client import JSON, USER_AGENT, Api, ApiError, ApiUnavailable

READ_SLACK = 30  # seconds of silence beyond the server's own timeout before a watch counts as dead


class WatchStreams:
    """One aiohttp session for every watch of the process."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # Created on first use: an aiohttp session belongs to the running event loop.
            connector = aiohttp.TCPConnector(ssl=self.api.ssl_context, limit=16)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def events(self, path: str, resource_version: str, timeout_seconds: int, **query: str) -> AsyncGenerator[dict[str, Any], None]:
        """The events of one watch request from `resource_version`, with bookmarks, until the server
        ends it after `timeout_seconds`. Use inside contextlib.aclosing, so the connection is closed
        when the caller stops early."""
        headers = {"Accept": JSON, "User-Agent": USER_AGENT}
        token = await asyncio.to_thread(self.api.credentials.bearer)  # an exec plugin may run a command
        if token:
            headers["Authorization"] = f"Bearer {token}"
        params = {
            **query,
            "watch": "true",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
            **({"resourceVersion": resource_version} if resource_version else {}),
        }
        # No total timeout: a watch is long by design. A connection that stays silent past the server's
        # own timeout (a stopped or wedged API server) is dropped.
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=timeout_seconds + READ_SLACK)
        try:
            async with self._client().get(f"{self.api.credentials.server}{path}", params=params, headers=headers, timeout=timeout) as resp:
                if resp.status >= 400:
                    raise ApiError.of(resp.status, "GET", path, await resp.text(errors="replace"))
                buffer = bytearray()
                async for chunk in resp.content.iter_any():
                    buffer += chunk
                    while (end := buffer.find(b"\n")) >= 0:
                        line = bytes(buffer[:end])
                        del buffer[: end + 1]
                        if line.strip():
                            yield json.loads(line)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ApiUnavailable("WATCH", path, exc) from exc
