"""The operator's Kubernetes API access: plain JSON over HTTPS, one function per request.

Deliberately not the official client: its typed models cost the operator about 50 MB of memory on
import alone and several times the CPU per object (measured in BENCHMARKS.md). Async code calls
these through asyncio.to_thread.
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import urllib3
import yaml

from stormtopo.core.vocabulary import AIBRIX, GPU, ROLESET_LABEL, VOLCANO_SCHEDULING

USER_AGENT = "stormtopo-operator"
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
JSON = "application/json"
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"


class KubeError(Exception):
    """Any failure of a request to the API server: it answered with an error (ApiError), or it could
    not be reached in time (ApiUnavailable). A long-running loop catches this and retries."""


class ApiError(KubeError, RuntimeError):
    """The API server answered with an HTTP error status."""

    def __init__(self, status: int, method: str, path: str, body: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {body[:500]}")
        self.request = f"{method} {path}"
        self.status = status
        self.body = body

    @staticmethod
    def of(status: int, method: str, path: str, body: str) -> ApiError:
        """The typed error for a status: NotFound, Conflict, or ApiError itself."""
        kind = {404: NotFound, 409: Conflict}.get(status, ApiError)
        return kind(status, method, path, body)

    @property
    def namespace_terminating(self) -> bool:
        """Nothing can be created in a namespace being deleted; whatever needed it goes with it."""
        return self.status == 403 and "NamespaceTerminating" in self.body


class NotFound(ApiError):
    """HTTP 404: the object (or its kind) does not exist."""


class Conflict(ApiError):
    """HTTP 409: it exists already, or it changed since the resourceVersion the request carried."""


class ApiUnavailable(KubeError, urllib3.exceptions.HTTPError):
    """The API server could not be reached or did not answer in time: refused, reset, timed out, TLS
    failed (urllib3's HTTPError family, which is not an OSError). One type for all of them. It stays a
    urllib3 HTTPError, so code that caught those (the CLI: "cannot reach the API server") still does;
    not an OSError, which the CLI reads as a local file's failure. Catch KubeError for any failure."""

    def __init__(self, method: str, path: str, reason: object) -> None:
        super().__init__(f"{method} {path}: API server unavailable: {reason}")
        self.request = f"{method} {path}"
        self.reason = reason


PAGE_SIZE = 250  # objects per list request


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


def _materialize(data: str | bytes | None, path: str | None, base: Path, encoded: bool = True) -> str | None:
    """A kubeconfig names a file or embeds base64 data; TLS needs a file."""
    if data:
        fd, name = tempfile.mkstemp(prefix="stormtopo-", suffix=".pem")
        with os.fdopen(fd, "wb") as f:
            f.write(base64.b64decode(data) if encoded else data if isinstance(data, bytes) else data.encode())
        return name
    if path:
        return str((base / path).resolve())
    return None


def kubeconfig_path(kubeconfig: str | None) -> str | None:
    """The kubeconfig to use, as kubectl finds it: the flag, $KUBECONFIG (its first existing file), then
    ~/.kube/config; None inside a pod without either (the service account)."""
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


def load_credentials(kubeconfig: str | None) -> Credentials:
    """From a kubeconfig file (its current context), else the pod's service account."""
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
    context_name = config.get("current-context")
    try:
        context = next(c["context"] for c in config.get("contexts") or [] if c["name"] == context_name)
        cluster = next(c["cluster"] for c in config.get("clusters") or [] if c["name"] == context["cluster"])
    except (StopIteration, KeyError, TypeError):
        raise CredentialsError(
            f"kubeconfig {path}: its current context {context_name!r} or that context's cluster is not defined"
        ) from None
    user: dict[str, Any] = next((u["user"] for u in config.get("users") or [] if u["name"] == context.get("user")), {}) or {}
    base = Path(path).resolve().parent
    server = cluster["server"].rstrip("/")
    token = user.get("token")
    cert_path = _materialize(user.get("client-certificate-data"), user.get("client-certificate"), base)
    key_path = _materialize(user.get("client-key-data"), user.get("client-key"), base)
    plugin = None
    if user.get("exec"):
        plugin = ExecPlugin(user["exec"], base, server)
        issued = plugin.current()  # fails here, with the plugin's own message, rather than at the first request
        if issued.cert_pem and issued.key_pem:
            cert_path = _materialize(issued.cert_pem, None, base, encoded=False)
            key_path = _materialize(issued.key_pem, None, base, encoded=False)
    elif user.get("auth-provider"):
        token = auth_provider_token(user["auth-provider"])
    return Credentials(
        server=server,
        ca_path=_materialize(cluster.get("certificate-authority-data"), cluster.get("certificate-authority"), base),
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        token=token,
        token_file=str((base / user["tokenFile"]).resolve()) if user.get("tokenFile") else None,
        cert_path=cert_path,
        key_path=key_path,
        exec_plugin=plugin,
    )


class Api:
    def __init__(self, kubeconfig: str | None = None) -> None:
        self.credentials = load_credentials(kubeconfig)
        self.in_cluster = self.credentials.in_cluster
        creds = self.credentials
        ctx = ssl.create_default_context(cafile=creds.ca_path)
        if creds.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if creds.cert_path:
            ctx.load_cert_chain(creds.cert_path, creds.key_path)
        self.ssl_context = ctx
        self._client_cert = creds.exec_plugin.issued if creds.exec_plugin else None
        self.http = urllib3.PoolManager(maxsize=32, ssl_context=ctx, timeout=urllib3.Timeout(connect=5, read=30), retries=False)

    def _renew_client_certificate(self) -> None:
        """An exec plugin's client certificate expires too: load the new one for the next connections."""
        plugin = self.credentials.exec_plugin
        if plugin is None:
            return
        issued = plugin.current()
        if issued is not self._client_cert and issued.cert_pem and issued.key_pem:
            cert = _materialize(issued.cert_pem, None, Path("."), encoded=False)
            key = _materialize(issued.key_pem, None, Path("."), encoded=False)
            assert cert and key
            self.ssl_context.load_cert_chain(cert, key)
            self.http.clear()  # pooled connections still present the old certificate
        self._client_cert = issued

    def request(self, method: str, path: str, body: Any = None, content_type: str = JSON, **query: str) -> Any:
        self._renew_client_certificate()
        headers = {"Accept": JSON, "User-Agent": USER_AGENT}
        token = self.credentials.bearer()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body).encode()
        url = f"{self.credentials.server}{path}" + (f"?{urlencode(query)}" if query else "")
        try:
            response = self.http.request(method, url, body=data, headers=headers)
        except urllib3.exceptions.HTTPError as exc:
            raise ApiUnavailable(method, path, getattr(exc, "reason", None) or exc) from exc
        if response.status >= 400:
            raise ApiError.of(response.status, method, path, response.data.decode(errors="replace"))
        return json.loads(response.data) if response.data else None

    # -- reads ---------------------------------------------------------------------------------
    @staticmethod
    def path(group_version: tuple[str, str], plural: str, namespace: str | None = None, name: str | None = None) -> str:
        group, version = group_version
        out = f"/apis/{group}/{version}" if group else f"/api/{version}"
        if namespace:
            out += f"/namespaces/{namespace}"
        out += f"/{plural}"
        return f"{out}/{name}" if name else out

    def get(self, group_version: tuple[str, str], plural: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        try:
            return dict(self.request("GET", self.path(group_version, plural, namespace, name)))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def list_objects(
        self, group_version: tuple[str, str], plural: str, namespace: str | None = None, label_selector: str = ""
    ) -> list[dict[str, Any]]:
        query = {"labelSelector": label_selector} if label_selector else {}
        return self.raw_list(self.path(group_version, plural, namespace), **query)

    def raw_list(self, path: str, **query: str) -> list[dict[str, Any]]:
        return [item for page in self.pages(path, **query) for item in page]

    def pages(self, path: str, **query: str) -> Iterator[list[dict[str, Any]]]:
        """A list, a page at a time: a caller that reduces each page never holds every pod or node of
        a large cluster at once (a full pod list of 4,000 pods is tens of MB once parsed)."""
        token = ""
        while True:
            page = self.request("GET", path, **query, limit=str(PAGE_SIZE), **({"continue": token} if token else {})) or {}
            yield list(page.get("items", []))
            token = (page.get("metadata") or {}).get("continue") or ""
            if not token:
                return

    def crd_schema(self, name: str) -> dict[str, Any] | None:
        crd = self.get(("apiextensions.k8s.io", "v1"), "customresourcedefinitions", None, name)
        if crd is None:
            return None
        served = [v for v in crd["spec"]["versions"] if v.get("served")]
        return dict(served[-1].get("schema", {}).get("openAPIV3Schema") or {}) if served else None

    def free_gpus(self, resource: str = GPU) -> dict[str, int]:
        """Free GPUs per node: allocatable minus what bound, unfinished pods request."""
        free = self.gpu_totals(resource)
        bound = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
        for page in self.pages("/api/v1/pods", fieldSelector=bound):
            for pod in page:
                node = pod["spec"].get("nodeName")
                if node in free:
                    for c in pod["spec"].get("containers") or []:
                        free[node] -= _quantity(((c.get("resources") or {}).get("requests") or {}).get(resource, "0"))
        return free

    def gpu_totals(self, resource: str = GPU) -> dict[str, int]:
        return {
            n["metadata"]["name"]: _quantity((n.get("status", {}).get("allocatable") or {}).get(resource, "0"))
            for page in self.pages("/api/v1/nodes")
            for n in page
        }

    def pods_of_group(self, namespace: str, roleset: str) -> list[dict[str, Any]]:
        return self.raw_list(f"/api/v1/namespaces/{namespace}/pods", labelSelector=f"{ROLESET_LABEL}={roleset}")

    def node_labels(self) -> dict[str, dict[str, str]]:
        return {n["metadata"]["name"]: dict(n["metadata"].get("labels") or {}) for n in self.raw_list("/api/v1/nodes")}

    # -- writes --------------------------------------------------------------------------------
    def create_podgroup(self, body: dict[str, Any]) -> bool:
        """Create a PodGroup; False if it exists already (another writer won the race) or its
        namespace is being deleted."""
        try:
            self.request("POST", self.path(VOLCANO_SCHEDULING, "podgroups", body["metadata"]["namespace"]), body)
            return True
        except ApiError as exc:
            if exc.status == 409 or exc.namespace_terminating:
                return False
            raise

    def patch_podgroup(self, namespace: str, name: str, ops: list[dict[str, Any]]) -> None:
        self.request("PATCH", self.path(VOLCANO_SCHEDULING, "podgroups", namespace, name), ops, JSON_PATCH)

    def server_side_apply(self, path: str, body: dict[str, Any], field_manager: str = "stormtopo") -> None:
        """Create or update an object by server-side apply: stormtopo owns exactly the fields it sets."""
        self.request("PATCH", path, body, APPLY_PATCH, fieldManager=field_manager, force="true")

    def patch_pod(self, namespace: str, name: str, ops: list[dict[str, Any]]) -> None:
        self.request("PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}", ops, JSON_PATCH)

    def label_pod(self, namespace: str, name: str, labels: dict[str, str]) -> None:
        self.request("PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}", {"metadata": {"labels": labels}}, MERGE_PATCH)

    def annotate_stormservice(self, namespace: str, name: str, key: str, value: str, resource_version: str | None = None) -> None:
        """Merge-patch one annotation: stormtopo's own key, nothing else of the StormService. With a
        resourceVersion the patch applies only to that version (409 otherwise): a read-modify-write."""
        meta: dict[str, Any] = {"annotations": {key: value}}
        if resource_version:
            meta["resourceVersion"] = resource_version
        self.request("PATCH", self.path(AIBRIX, "stormservices", namespace, name), {"metadata": meta}, MERGE_PATCH)

    def create_event(self, event: Mapping[str, Any], instance: str) -> None:
        """A core/v1 Event: `event` has involvedObject, type, reason and message."""
        involved = event["involvedObject"]
        now = micro_time()
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{involved['name']}.", "namespace": involved["namespace"] or "default"},
            **event,
            "source": {"component": "stormtopo"},
            "reportingComponent": "stormtopo",
            "reportingInstance": instance,
            "firstTimestamp": now[:19] + "Z",
            "lastTimestamp": now[:19] + "Z",
            "count": 1,
        }
        self.request("POST", f"/api/v1/namespaces/{body['metadata']['namespace']}/events", body)

    # -- leases --------------------------------------------------------------------------------
    def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.get(("coordination.k8s.io", "v1"), "leases", namespace, name)

    def create_lease(self, body: dict[str, Any]) -> None:
        self.request("POST", self.path(("coordination.k8s.io", "v1"), "leases", body["metadata"]["namespace"]), body)

    def replace_lease(self, body: dict[str, Any]) -> None:
        """PUT carries resourceVersion: a concurrent renewal makes it fail with 409."""
        meta = body["metadata"]
        self.request("PUT", self.path(("coordination.k8s.io", "v1"), "leases", meta["namespace"], meta["name"]), body)


def micro_time(when: float | None = None) -> str:
    """A Kubernetes MicroTime (RFC 3339, microseconds, UTC)."""
    t = time.time() if when is None else when
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int((t % 1) * 1e6):06d}Z"


def _quantity(text: str) -> int:
    return int(float(str(text)))  # GPU counts are whole numbers
