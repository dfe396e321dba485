"""Credentials from a kubeconfig or a pod's service account: tokens, client certificates, `exec`
plugins (EKS, GKE, AKS, kubelogin) and the legacy `auth-provider` tokens."""

from __future__ import annotations

import atexit
import base64
import contextlib
import datetime
import json
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class CredentialsError(RuntimeError):
    """The kubeconfig cannot give credentials: missing, malformed, or its login plugin failed."""


EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")


@dataclass(frozen=True)
class IssuedCredential:
    token: str | None
    cert_pem: bytes | None
    key_pem: bytes | None
    expires: float | None  # time.time() seconds; None: valid until the API server says otherwise


def parse_exec_credential(output: str, api_version: str) -> IssuedCredential:
    """An ExecCredential printed by a client-go credential plugin (kubectl's exec protocol)."""
    try:
        credential = json.loads(output)
    except json.JSONDecodeError as exc:
        raise CredentialsError(f"the credential plugin printed no ExecCredential JSON: {exc}") from None
    if not isinstance(credential, dict) or credential.get("kind") != "ExecCredential":
        raise CredentialsError("the credential plugin printed something other than an ExecCredential")
    if credential.get("apiVersion") != api_version:
        raise CredentialsError(f"the credential plugin answered {credential.get('apiVersion')}, the kubeconfig asked for {api_version}")
    status = credential.get("status") or {}
    cert, key = status.get("clientCertificateData"), status.get("clientKeyData")
    if not status.get("token") and not (cert and key):
        raise CredentialsError("the credential plugin's ExecCredential has neither status.token nor a client certificate and key")
    stamp = status.get("expirationTimestamp")
    expires = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() if stamp else None
    return IssuedCredential(status.get("token"), cert.encode() if cert else None, key.encode() if key else None, expires)


class ExecPlugin:
    """A kubeconfig `exec` user (EKS, GKE, AKS, kubelogin): run the command, cache its credential until
    it expires. Thread-safe: the operator calls the API from worker threads."""

    def __init__(self, config: Mapping[str, Any], base: Path, server: str) -> None:
        self.api_version = str(config.get("apiVersion") or "")
        if self.api_version not in EXEC_API_VERSIONS:
            raise CredentialsError(
                f"exec credential plugin apiVersion {self.api_version!r} is not supported; use one of {EXEC_API_VERSIONS}"
            )
        command = str(config.get("command") or "")
        if not command:
            raise CredentialsError("the kubeconfig's exec user names no command")
        # As kubectl: a relative path with a separator is relative to the kubeconfig's directory.
        self.argv = [str(base / command) if os.sep in command and not os.path.isabs(command) else command]
        self.argv += [str(a) for a in config.get("args") or []]
        self.env = {str(e["name"]): str(e["value"]) for e in config.get("env") or []}
        self.install_hint = str(config.get("installHint") or "")
        self.cluster = {"server": server} if config.get("provideClusterInfo") else None
        self.issued: IssuedCredential | None = None
        self._lock = threading.Lock()

    def current(self) -> IssuedCredential:
        with self._lock:
            # Renewed a little early: a token that expires in flight fails the request it rode on.
            if self.issued is None or (self.issued.expires is not None and self.issued.expires - 10 < time.time()):
                self.issued = self._run()
            return self.issued

    def _run(self) -> IssuedCredential:
        spec: dict[str, Any] = {"interactive": False}
        if self.cluster:
            spec["cluster"] = self.cluster
        info = {"apiVersion": self.api_version, "kind": "ExecCredential", "spec": spec}
        env = {**os.environ, **self.env, "KUBERNETES_EXEC_INFO": json.dumps(info)}
        try:
            done = subprocess.run(self.argv, env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            hint = f" ({self.install_hint.strip()})" if self.install_hint else ""
            raise CredentialsError(f"the kubeconfig's credential plugin {self.argv[0]!r} is not installed{hint}") from None
        except subprocess.TimeoutExpired:
            raise CredentialsError(f"the credential plugin {self.argv[0]!r} did not answer within 60 s") from None
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            raise CredentialsError(f"the credential plugin {self.argv[0]!r} exited {done.returncode}: {last}")
        return parse_exec_credential(done.stdout, self.api_version)


def auth_provider_token(provider: Mapping[str, Any], now: float | None = None) -> str:
    """The token an `auth-provider` user (the legacy gcp, azure, oidc plugins) has cached in its
    config. Refreshing it is the plugin's job, which only kubectl of old had; say what to do instead."""
    name = str(provider.get("name") or "unknown")
    config = provider.get("config") or {}
    token = config.get("id-token") if name == "oidc" else config.get("access-token")
    expiry = config.get("expiry")
    expired = False
    if token and expiry:
        try:
            expired = datetime.datetime.fromisoformat(str(expiry).replace("Z", "+00:00")).timestamp() <= (now or time.time())
        except ValueError:
            expired = False  # an unreadable expiry: let the API server judge the token
    if token and not expired:
        return str(token)
    state = "has expired" if token else "has no cached token"
    raise CredentialsError(
        f"the kubeconfig's auth-provider {name!r} {state}, and stormtopo cannot refresh it: switch the user to its "
        "exec credential plugin (gke-gcloud-auth-plugin, kubelogin, aws eks get-token), or run a kubectl command to refresh it"
    )


@dataclass(frozen=True)
class Credentials:
    server: str
    ca_path: str | None = None
    insecure: bool = False
    token: str | None = None
    token_file: str | None = None  # in-cluster: projected tokens rotate, so re-read it
    cert_path: str | None = None
    key_path: str | None = None
    exec_plugin: ExecPlugin | None = None
    in_cluster: bool = False

    def bearer(self) -> str | None:
        if self.exec_plugin is not None:
            return self.exec_plugin.current().token
        if self.token_file:
            return Path(self.token_file).read_text().strip()
        return self.token


_WRITTEN: list[str] = []  # PEM files this process wrote: removed when it exits (310 were found left in /tmp)


def _remove_written() -> None:
    for name in _WRITTEN:
        with contextlib.suppress(OSError):
            os.unlink(name)


atexit.register(_remove_written)


def materialize(data: str | bytes | None, path: str | None, base: Path, encoded: bool = True) -> str | None:
    """A kubeconfig names a file or embeds base64 data; TLS needs a file (private to this user, and
    removed when the process exits)."""
    if data:
        fd, name = tempfile.mkstemp(prefix="stormtopo-", suffix=".pem")
        _WRITTEN.append(name)
        with os.fdopen(fd, "wb") as f:
            f.write(base64.b64decode(data) if encoded else data if isinstance(data, bytes) else data.encode())
        return name
    if path:
        return str((base / path).resolve())
    return None


def kubeconfig_path(kubeconfig: str | None) -> str | None:
    """The kubeconfig to use: the flag, $KUBECONFIG (its first existing file); inside a pod then None (the
    service account); elsewhere ~/.kube/config."""
    if kubeconfig:
        return kubeconfig
    listed = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    if listed:
        return next((p for p in listed if Path(p).exists()), listed[0])
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return None
    home = Path.home() / ".kube" / "config"
    if home.exists():
        return str(home)
    raise CredentialsError("no kubeconfig: pass --kubeconfig, set KUBECONFIG, or create ~/.kube/config (not running in a pod)")


def load_credentials(kubeconfig: str | None, use_context: str | None = None) -> Credentials:
    """From a kubeconfig file (context `use_context`, else its current one), else the pod's service account."""
    path = kubeconfig_path(kubeconfig)
    if not path:
        host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        return Credentials(
            f"https://{host}:{port}", str(SERVICE_ACCOUNT / "ca.crt"), token_file=str(SERVICE_ACCOUNT / "token"), in_cluster=True
        )
    try:
        config = yaml.safe_load(Path(path).read_text()) or {}
    except OSError as exc:
        raise CredentialsError(f"cannot read kubeconfig {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise CredentialsError(f"kubeconfig {path} is not valid YAML: {exc}") from None
    context_name = use_context or config.get("current-context")
    try:
        context = next(c["context"] for c in config.get("contexts") or [] if c["name"] == context_name)
        cluster = next(c["cluster"] for c in config.get("clusters") or [] if c["name"] == context["cluster"])
    except (StopIteration, KeyError, TypeError):
        raise CredentialsError(
            f"kubeconfig {path}: {'context' if use_context else 'its current context'} {context_name!r} "
            "or that context's cluster is not defined"
        ) from None
    user: dict[str, Any] = next((u["user"] for u in config.get("users") or [] if u["name"] == context.get("user")), {}) or {}
    base = Path(path).resolve().parent
    server = cluster["server"].rstrip("/")
    token = user.get("token")
    cert_path = materialize(user.get("client-certificate-data"), user.get("client-certificate"), base)
    key_path = materialize(user.get("client-key-data"), user.get("client-key"), base)
    plugin = None
    if user.get("exec"):
        plugin = ExecPlugin(user["exec"], base, server)
        issued = plugin.current()  # fails here, with the plugin's own message, rather than at the first request
        if issued.cert_pem and issued.key_pem:
            cert_path = materialize(issued.cert_pem, None, base, encoded=False)
            key_path = materialize(issued.key_pem, None, base, encoded=False)
    elif user.get("auth-provider"):
        token = auth_provider_token(user["auth-provider"])
    return Credentials(
        server=server,
        ca_path=materialize(cluster.get("certificate-authority-data"), cluster.get("certificate-authority"), base),
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        token=token,
        token_file=str((base / user["tokenFile"]).resolve()) if user.get("tokenFile") else None,
        cert_path=cert_path,
        key_path=key_path,
        exec_plugin=plugin,
    )
