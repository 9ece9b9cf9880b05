"""One exception hierarchy for every refusal: each carries the API's stable `code`, its `message` (what to
change) and the HTTP `status`, as the error body `{"error": {"status", "code", "message"}}` says."""

from __future__ import annotations

import json
from typing import Any

import httpx


class JointspaceError(Exception):
    """Base of every error this client raises about a request.

    `status` is the HTTP status (None when no answer came: `ConnectionFailed`), `code` the API's stable
    machine-readable kind (`not_found`, `rate_limited`, `invalid_image`, ...), `message` the server's
    explanation, `retry_after` the seconds its `Retry-After` asked for (429, 503, 409 in flight), and
    `request_id` the server's `x-request-id` (quote it when reporting a problem)."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str = "",
        retry_after: float | None = None,
        request_id: str | None = None,
        attempts: int = 1,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.retry_after = retry_after
        self.request_id = request_id
        self.attempts = attempts

    def __str__(self) -> str:
        where = f"{self.status} {self.code}" if self.status is not None else self.code
        tries = f" (after {self.attempts} attempts)" if self.attempts > 1 else ""
        return f"{where}: {self.message}{tries}"


class ConnectionFailed(JointspaceError):
    """No answer: the connection failed or timed out (after the retries that were safe to make)."""


class InvalidRequest(JointspaceError):
    """400 (malformed), 415 or 422: the request cannot be carried out as given; sending it again will not help."""


class UnsupportedMediaType(InvalidRequest):
    """415: a content type the operation does not read, or bytes that are not a supported image."""


class IdempotencyKeyReused(InvalidRequest):
    """422 `idempotency_key_reused`: the Idempotency-Key was used for a different request in the last 24 hours."""


class Unauthorized(JointspaceError):
    """401: no API key, or not a valid one."""


class Forbidden(JointspaceError):
    """403: the key's role or collections do not allow this."""


class NotFound(JointspaceError):
    """404: no such collection, image, caption or route."""


class RequestTimeout(JointspaceError):
    """408: the body did not arrive within the server's body-read timeout; nothing was applied."""


class Conflict(JointspaceError):
    """409: a name or external id taken, or an Idempotency-Key still running or abandoned."""


class IdempotencyInFlight(Conflict):
    """409 `idempotency_in_flight`: the first request with this key still runs (retried after Retry-After)."""


class IdempotencyAbandoned(Conflict):
    """409 `idempotency_abandoned`: the server running the first request with this key stopped; it may or may
    not have been applied. Check, then send it again with a new key."""


class PayloadTooLarge(JointspaceError):
    """413: the body, or an image in it, is over the server's limit (the message states it)."""


class RateLimited(JointspaceError):
    """429: the key is over its rate (`rate_limited`) or the inference queue is full (`overloaded`); raised once
    the retry budget cannot cover the `Retry-After` the server asked for."""


class ServerError(JointspaceError):
    """A 5xx other than 503."""


class Unavailable(ServerError):
    """503: the request ran past the server's timeout, or the database is busy or unreachable."""


_BY_STATUS: dict[int, type[JointspaceError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    408: RequestTimeout,
    409: Conflict,
    413: PayloadTooLarge,
    415: UnsupportedMediaType,
    422: InvalidRequest,
    429: RateLimited,
    503: Unavailable,
}

_BY_CODE: dict[str, type[JointspaceError]] = {
    "idempotency_key_reused": IdempotencyKeyReused,
    "idempotency_in_flight": IdempotencyInFlight,
    "idempotency_abandoned": IdempotencyAbandoned,
}


def retry_after(response: httpx.Response) -> float | None:
    """The answer's `Retry-After` in seconds (the server sends whole seconds), or None."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        # An HTTP date: this server never sends one, but a proxy in front might.
        from email.utils import parsedate_to_datetime

        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        import datetime

        return max(0.0, (when - datetime.datetime.now(datetime.UTC)).total_seconds())


def error_from(response: httpx.Response, attempts: int = 1) -> JointspaceError:
    """The exception for an answer that is not a success, read from its error body."""
    status = response.status_code
    code, message = "", ""
    try:
        body: Any = json.loads(response.content)
        detail = body["error"]
        code, message = str(detail["code"]), str(detail["message"])
    except (ValueError, KeyError, TypeError):
        message = response.text[:500] or response.reason_phrase
        code = {404: "not_found"}.get(status, "http_error")
    cls = _BY_CODE.get(code) or _BY_STATUS.get(status) or (ServerError if status >= 500 else JointspaceError)
    return cls(
        message,
        status=status,
        code=code,
        retry_after=retry_after(response),
        request_id=response.headers.get("x-request-id"),
        attempts=attempts,
    )
