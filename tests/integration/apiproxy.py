"""An HTTPS proxy in front of the local kube-apiserver that passes every request through, streaming, but
holds the watches of one resource: accepted (200, headers sent) and never answered, a watch that is
blind without failing. What a client of the proxy sees is what a brownout of that one watch looks like."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import yaml
from aiohttp import web

from stormtopo import certificates
from stormtopo.devenv import processes

SESSION = web.AppKey("session", aiohttp.ClientSession)
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding", "host"}


@contextlib.contextmanager
def watch_blackhole(
    state: Path, plural: str, directory: Path, status: int | None = None, blocking: threading.Event | None = None
) -> Iterator[Path]:
    """Serve the proxy on a free local port while the block runs; yields a kubeconfig that goes through it.
    With `status` the watches are answered with it at once (a 503: an outage of that watch) instead of
    held; with `blocking`, only while it is set."""
    config = yaml.safe_load((state / "kubeconfig").read_text())
    upstream = config["clusters"][0]["cluster"]["server"]
    ca = certificates.new_ca("apiproxy-ca")  # not the serving name: a leaf named as its issuer reads as self-signed
    serving = certificates.new_serving_cert(ca, "apiproxy", ["127.0.0.1"])
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tls.crt").write_bytes(serving.cert_pem)
    (directory / "tls.key").write_bytes(serving.key_pem)
    port = processes.free_port()
    loop = asyncio.new_event_loop()
    started = threading.Event()
    stopping: list[asyncio.Event] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        watching = request.query.get("watch") in ("true", "1") and request.path.rstrip("/").endswith(f"/{plural}")
        if watching and (blocking is None or blocking.is_set()) and status is not None:
            failure = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "the API proxy refuses", "code": status}
            return web.json_response(failure, status=status)
        if watching and (blocking is None or blocking.is_set()):
            held = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
            await held.prepare(request)
            await stopping[0].wait()  # never a byte of an event
            return held
        session = request.app[SESSION]
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        body = await request.read()
        async with session.request(request.method, upstream + request.path_qs, headers=headers, data=body or None) as answer:
            passed = {k: v for k, v in answer.headers.items() if k.lower() not in HOP_BY_HOP}
            response = web.StreamResponse(status=answer.status, headers=passed)
            await response.prepare(request)
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    async def serve() -> None:
        stopping.append(asyncio.Event())
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app[SESSION] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=False), timeout=aiohttp.ClientTimeout(total=None))
        app.router.add_route("*", "/{tail:.*}", handle)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(directory / "tls.crt", directory / "tls.key")
        await web.TCPSite(runner, "127.0.0.1", port, ssl_context=tls).start()
        started.set()
        await stopping[0].wait()
        await app[SESSION].close()
        await runner.cleanup()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert started.wait(10), "the API proxy did not start"
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{port}"
    config["clusters"][0]["cluster"]["certificate-authority-data"] = base64.b64encode(ca.cert_pem).decode()
    kubeconfig = directory / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    try:
        yield kubeconfig
    finally:
        loop.call_soon_threadsafe(stopping[0].set)
        thread.join(10)
