"""What a request to the API server can fail with, typed as kopf types them: callers catch NotFound or
Conflict where either is an answer, ApiUnavailable where the server could not be reached, and KubeError
for any of them."""

from __future__ import annotations

import urllib3


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
