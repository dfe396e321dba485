"""What a request to the API server can fail with, typed as kopf types them: callers catch NotFound,
Conflict, Forbidden, Gone, Invalid, TooManyRequests or ServerError where one is an answer, ApiUnavailable
where the server could not be reached, BudgetRefused for an eviction a PodDisruptionBudget forbids, and
KubeError for any of them. Built in one place (ApiError.of):
nothing else compares HTTP statuses by number or reads the response's words to decide."""

from __future__ import annotations

import json
from typing import Any

import urllib3

DISRUPTION_BUDGET_CAUSE = "DisruptionBudget"  # policy/v1 DisruptionBudgetCause: an eviction a budget forbids


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
        """The typed error for a status (ApiError itself for one without a type of its own)."""
        kinds: dict[int, type[ApiError]] = {
            401: Unauthorized,
            403: Forbidden,
            404: NotFound,
            409: Conflict,
            410: Gone,
            422: Invalid,
            429: TooManyRequests,
        }
        kind = kinds.get(status, ServerError if status >= 500 else ApiError)
        error = kind(status, method, path, body)
        if path.endswith("/eviction") and error.refused_by_budget:
            return BudgetRefused(status, method, path, body)
        return error

    @property
    def status_object(self) -> dict[str, Any]:
        """The API server's Status object ({} when the body is not one)."""
        try:
            parsed = json.loads(self.body)
        except ValueError:
            return {}
        return parsed if isinstance(parsed, dict) else {}

    @property
    def message(self) -> str:
        """The API server's own words (its Status object's message), else the start of what it answered."""
        return str(self.status_object.get("message") or "").strip() or self.body.strip()[:300]

    @property
    def unavailable(self) -> bool:
        """The server is starting, draining or timed out (503, 504): the same request may work in a moment."""
        return self.status in (503, 504)

    @property
    def refusal(self) -> bool:
        """A request the server will refuse again as it is (RBAC, a policy, invalid, not found): not a conflict
        (read again and retry), not throttled (429), not the server failing (5xx)."""
        return 400 <= self.status < 500 and not isinstance(self, Conflict | TooManyRequests | BudgetRefused)

    @property
    def reason(self) -> str:
        """The Status object's machine-readable reason (NamespaceTerminating is a cause, not a reason)."""
        return str(self.status_object.get("reason") or "")

    @property
    def causes(self) -> list[str]:
        """The Status object's cause types (details.causes[].type; reason for older servers)."""
        details = self.status_object.get("details") or {}
        return [str(c.get("type") or c.get("reason") or "") for c in details.get("causes") or [] if isinstance(c, dict)]

    @property
    def namespace_terminating(self) -> bool:
        """Nothing can be created in a namespace being deleted; whatever needed it goes with it."""
        return self.status == 403 and ("NamespaceTerminating" in self.causes or "NamespaceTerminating" in self.body)

    @property
    def refused_by_budget(self) -> bool:
        """An eviction a PodDisruptionBudget forbids: 429 with the DisruptionBudget cause, or the 500 the
        Eviction API answers for a pod under more than one budget (that one has no cause to read)."""
        if self.status == 429:
            return DISRUPTION_BUDGET_CAUSE in self.causes or "disruption budget" in self.body.lower()
        return self.status == 500 and "poddisruptionbudget" in self.body.lower()


class Unauthorized(ApiError):
    """HTTP 401: the credentials were not accepted."""


class Forbidden(ApiError):
    """HTTP 403: RBAC or an admission policy refused it (or the namespace is being deleted)."""


class NotFound(ApiError):
    """HTTP 404: the object (or its kind) does not exist."""


class Conflict(ApiError):
    """HTTP 409: it exists already, or it changed since the resourceVersion the request carried."""


class Gone(ApiError):
    """HTTP 410: a watch's resourceVersion is too old; list again."""


class Invalid(ApiError):
    """HTTP 422: the object is not valid (or a precondition it carried no longer holds)."""


class TooManyRequests(ApiError):
    """HTTP 429: API priority and fairness, or an eviction a budget forbids (refused_by_budget)."""


class ServerError(ApiError):
    """HTTP 5xx: the server failed, or is starting (503)."""


class BudgetRefused(ApiError):
    """An eviction a PodDisruptionBudget forbids now (429 with the DisruptionBudget cause, or 500 for a pod under
    several budgets): neither throttling nor an outage; the pod may be evicted once the budget allows."""


class ApiUnavailable(KubeError, urllib3.exceptions.HTTPError):
    """The API server could not be reached or did not answer in time: refused, reset, timed out, TLS
    failed (urllib3's HTTPError family, which is not an OSError). One type for all of them. It stays a
    urllib3 HTTPError, so code that caught those (the CLI: "cannot reach the API server") still does;
    not an OSError, which the CLI reads as a local file's failure. Catch KubeError for any failure."""

    def __init__(self, method: str, path: str, reason: object) -> None:
        super().__init__(f"{method} {path}: API server unavailable: {reason}")
        self.request = f"{method} {path}"
        self.reason = reason
