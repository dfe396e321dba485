"""The webhook's certificate reloads without a restart (issue 14, item 3): a real HTTPS server on
127.0.0.1, its files replaced by a certificate from another CA, and a new client that trusts only the
new CA gets through within seconds, while one trusting only the old CA no longer does."""

from __future__ import annotations

import asyncio
import ssl
import time
from pathlib import Path

from aiohttp import web

from stormtopo import certificates
from stormtopo.devenv import processes
from stormtopo.operator import webhook
from stormtopo.operator.app import CertificateReloader


def _write_pair(directory: Path, ca: certificates.KeyPair) -> None:
    serving = certificates.new_serving_cert(ca, "webhook", ["127.0.0.1"])
    # The key first, then the certificate: a reader between the two sees a mismatched pair.
    (directory / "tls.key").write_bytes(serving.key_pem)
    (directory / "tls.crt").write_bytes(serving.cert_pem)


async def _handshake(port: int, trusted_ca: bytes) -> bool:
    client = ssl.create_default_context(cadata=trusted_ca.decode())
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client)
    except ssl.SSLCertVerificationError:
        return False
    writer.close()
    return True


def test_a_replaced_certificate_serves_new_handshakes_without_a_restart(tmp_path: Path) -> None:
    async def scenario() -> None:
        ca_a, ca_b = certificates.new_ca("ca-a"), certificates.new_ca("ca-b")
        _write_pair(tmp_path, ca_a)
        cert, key = str(tmp_path / "tls.crt"), str(tmp_path / "tls.key")
        context = webhook.tls_context(cert, key)
        reloader = CertificateReloader(context, cert, key, interval=0.1)
        watching = asyncio.create_task(reloader.run())
        runner = web.AppRunner(web.Application())
        await runner.setup()
        port = processes.free_port()
        await web.TCPSite(runner, "127.0.0.1", port, ssl_context=context).start()
        try:
            assert await _handshake(port, ca_a.cert_pem)
            assert not await _handshake(port, ca_b.cert_pem)

            _write_pair(tmp_path, ca_b)
            deadline = time.monotonic() + 10
            while not await _handshake(port, ca_b.cert_pem):
                assert time.monotonic() < deadline, "the new certificate was not served within 10 s"
                await asyncio.sleep(0.1)
            assert not await _handshake(port, ca_a.cert_pem)  # the old CA is no longer what the server shows
            assert reloader.reloads == 1
        finally:
            watching.cancel()
            await runner.cleanup()

    asyncio.run(scenario())


def test_a_half_written_pair_keeps_the_old_certificate(tmp_path: Path) -> None:
    ca = certificates.new_ca("ca")
    _write_pair(tmp_path, ca)
    cert, key = str(tmp_path / "tls.crt"), str(tmp_path / "tls.key")
    reloader = CertificateReloader(webhook.tls_context(cert, key), cert, key)
    other = certificates.new_serving_cert(certificates.new_ca("other"), "webhook", ["127.0.0.1"])
    (tmp_path / "tls.crt").write_bytes(other.cert_pem)  # its key not written yet
    assert not reloader.reload_if_changed()
    (tmp_path / "tls.key").write_bytes(other.key_pem)
    assert reloader.reload_if_changed() and reloader.reloads == 1
    assert not reloader.reload_if_changed()  # unchanged since: nothing to do
