"""Kubeconfig users of managed clusters (issue 14, item 5): `exec` credential plugins, run as real
processes, and cached `auth-provider` tokens; and the CLI's one-line errors instead of tracebacks."""

from __future__ import annotations

import datetime
import http.server
import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from stormtopo import certificates, cli
from stormtopo.kube.client import Api
from stormtopo.kube.credentials import CredentialsError, IssuedCredential, auth_provider_token, load_credentials

BETA = "client.authentication.k8s.io/v1beta1"
PLUGIN = """\
import json, os, sys
with open(os.environ["CALLS"], "a") as f:
    f.write(json.dumps({"argv": sys.argv[1:], "info": json.loads(os.environ["KUBERNETES_EXEC_INFO"])}) + "\\n")
print(open(os.environ["ANSWER"]).read())
"""


def _kubeconfig(directory: Path, user: dict[str, Any], server: str = "https://127.0.0.1:1") -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "c",
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "clusters": [{"name": "k", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": user}],
    }
    path = directory / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def plugin(tmp_path: Path) -> Iterator[tuple[Path, Path, Path]]:
    """A credential plugin script (real process): it logs each call and prints the answer file."""
    script = tmp_path / "plugins" / "fake-plugin.py"
    script.parent.mkdir()
    script.write_text(PLUGIN)
    yield script, tmp_path / "answer.json", tmp_path / "calls.jsonl"


def _exec_user(script: Path, calls: Path, answer: Path, api_version: str = "client.authentication.k8s.io/v1") -> dict[str, Any]:
    return {
        "exec": {
            "apiVersion": api_version,
            "command": sys.executable,
            "args": [str(script), "--cluster", "prod"],
            "env": [{"name": "CALLS", "value": str(calls)}, {"name": "ANSWER", "value": str(answer)}],
            "interactiveMode": "Never",
        }
    }


def _answer(path: Path, status: dict[str, Any], api_version: str = "client.authentication.k8s.io/v1") -> None:
    path.write_text(json.dumps({"apiVersion": api_version, "kind": "ExecCredential", "status": status}))


def _stamp(seconds_from_now: float) -> str:
    when = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=seconds_from_now)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.mark.parametrize("api_version", ["client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1"])
def test_exec_plugin_token_is_used_and_cached_until_it_expires(plugin: tuple[Path, Path, Path], tmp_path: Path, api_version: str) -> None:
    script, answer, calls = plugin
    _answer(answer, {"token": "tok-1", "expirationTimestamp": _stamp(3600)}, api_version)
    creds = load_credentials(str(_kubeconfig(tmp_path, _exec_user(script, calls, answer, api_version))))
    assert creds.bearer() == "tok-1" and creds.bearer() == "tok-1"
    logged = [json.loads(line) for line in calls.read_text().splitlines()]
    assert len(logged) == 1  # cached: one run for several requests
    assert logged[0]["argv"] == ["--cluster", "prod"]
    assert logged[0]["info"]["kind"] == "ExecCredential" and logged[0]["info"]["apiVersion"] == api_version

    _answer(answer, {"token": "tok-2", "expirationTimestamp": _stamp(3600)}, api_version)
    assert creds.bearer() == "tok-1"  # still valid: not asked again
    assert creds.exec_plugin is not None
    creds.exec_plugin.issued = IssuedCredential("tok-1", None, None, 0.0)  # as if it had expired
    assert creds.bearer() == "tok-2"
    assert len(calls.read_text().splitlines()) == 2


def test_exec_plugin_token_about_to_expire_is_renewed_at_each_use(plugin: tuple[Path, Path, Path], tmp_path: Path) -> None:
    script, answer, calls = plugin
    _answer(answer, {"token": "short", "expirationTimestamp": _stamp(5)})  # inside the 10 s early-renewal margin
    creds = load_credentials(str(_kubeconfig(tmp_path, _exec_user(script, calls, answer))))
    creds.bearer()
    assert len(calls.read_text().splitlines()) == 2


def test_exec_plugin_client_certificate(plugin: tuple[Path, Path, Path], tmp_path: Path) -> None:
    script, answer, calls = plugin
    ca = certificates.new_ca("client-ca")
    pair = certificates.new_serving_cert(ca, "user", ["localhost"])
    _answer(answer, {"clientCertificateData": pair.cert_pem.decode(), "clientKeyData": pair.key_pem.decode()})
    api = Api(str(_kubeconfig(tmp_path, _exec_user(script, calls, answer))))
    assert api.credentials.cert_path and Path(api.credentials.cert_path).read_bytes() == pair.cert_pem
    assert api.credentials.key_path and Path(api.credentials.key_path).read_bytes() == pair.key_pem
    assert api.credentials.bearer() is None


@pytest.mark.parametrize(
    ("status", "stdout", "expected"),
    [
        ({}, None, "neither status.token nor a client certificate"),
        (None, "not json", "no ExecCredential JSON"),
        (
            None,
            json.dumps({"apiVersion": "client.authentication.k8s.io/v1beta1", "kind": "ExecCredential", "status": {"token": "t"}}),
            "asked for",
        ),
    ],
)
def test_exec_plugin_bad_answers_are_clear_errors(
    plugin: tuple[Path, Path, Path], tmp_path: Path, status: dict[str, Any] | None, stdout: str | None, expected: str
) -> None:
    script, answer, calls = plugin
    if status is not None:
        _answer(answer, status)
    else:
        answer.write_text(stdout or "")
    with pytest.raises(CredentialsError, match=expected):
        load_credentials(str(_kubeconfig(tmp_path, _exec_user(script, calls, answer))))


def test_exec_plugin_that_fails_or_is_missing(tmp_path: Path) -> None:
    failing = tmp_path / "fail.py"
    failing.write_text("import sys\nprint('error: you must be logged in to the server', file=sys.stderr)\nsys.exit(3)\n")
    user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": sys.executable, "args": [str(failing)]}}
    with pytest.raises(CredentialsError, match="exited 3: error: you must be logged in"):
        load_credentials(str(_kubeconfig(tmp_path, user)))
    hint = "Install gke-gcloud-auth-plugin: https://cloud.google.com/kubernetes-engine/docs/how-to/cluster-access-for-kubectl"
    missing = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "gke-gcloud-auth-plugin-nowhere", "installHint": hint}}
    with pytest.raises(CredentialsError, match=r"not installed.*Install gke-gcloud-auth-plugin"):
        load_credentials(str(_kubeconfig(tmp_path, missing)))


def test_auth_provider_cached_token_or_a_clear_error() -> None:
    future, past = _stamp(3600), _stamp(-60)
    assert auth_provider_token({"name": "gcp", "config": {"access-token": "ya29.x", "expiry": future}}) == "ya29.x"
    assert auth_provider_token({"name": "azure", "config": {"access-token": "eyJ"}}) == "eyJ"
    assert auth_provider_token({"name": "oidc", "config": {"id-token": "idt"}}) == "idt"
    with pytest.raises(CredentialsError, match=r"'gcp' has expired.*gke-gcloud-auth-plugin"):
        auth_provider_token({"name": "gcp", "config": {"access-token": "old", "expiry": past}})
    with pytest.raises(CredentialsError, match="'azure' has no cached token"):
        auth_provider_token({"name": "azure", "config": {}})


class _Forbidden(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"kind": "Status", "status": "Failure", "message": 'hypernodes is forbidden: User "dev" cannot list'})
        self.send_response(403)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *_: Any) -> None:
        pass


def test_cli_prints_one_line_and_exits_1_on_api_connection_and_kubeconfig_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = http.server.HTTPServer(("127.0.0.1", 0), _Forbidden)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        forbidden = _kubeconfig(tmp_path, {"token": "t"}, server=f"http://127.0.0.1:{server.server_port}")
        assert cli.main(["topology", "show", "--kubeconfig", str(forbidden)]) == 1
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "Traceback" not in err
        assert "stormtopo: GET /api" in err and "HTTP 403" in err and "cannot list" in err and "RBAC" in err
    finally:
        server.shutdown()
        server.server_close()  # connections are refused from now on

    unreachable = tmp_path / "down"
    unreachable.mkdir()
    cfg = _kubeconfig(unreachable, {"token": "t"}, server=f"http://127.0.0.1:{server.server_port}")
    assert cli.main(["topology", "show", "--kubeconfig", str(cfg)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("stormtopo: cannot reach the API server") and err.count("\n") == 0

    assert cli.main(["explain", "ns/name", "--kubeconfig", str(tmp_path / "missing")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("stormtopo: cannot read kubeconfig") and err.count("\n") == 0


def test_pem_files_written_for_embedded_credentials_are_removed_when_the_process_exits(tmp_path: Path) -> None:
    import subprocess

    script = (
        "from pathlib import Path\n"
        "from stormtopo.kube.credentials import materialize\n"
        "name = materialize('UEVN', None, Path('.'))\n"
        "assert Path(name).read_bytes() == b'PEM'\n"
        "print(name)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert not Path(done.stdout.strip()).exists()
