"""What the sync and async clients share, written once: a request as data (`Call`), the retry policy and the
attempt loop as a state machine that does no I/O itself (`attempts`), and the request builder. Each client
only carries out the two actions the machine asks for, sending and sleeping, in its own way
(`httpx.Client` and `time.sleep`; `httpx.AsyncClient` and `asyncio.sleep`)."""

from __future__ import annotations

import inspect
import json
import random
import time
import uuid
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import httpx

from ._errors import ConnectionFailed, JointspaceError, error_from, retry_after

T = TypeVar("T")

# A multipart file part as httpx takes it: (field name, (file name, bytes, content type)).
FilePart = tuple[str, tuple[str, bytes, str]]


@dataclass(frozen=True)
class Call(Generic[T]):
    """One API request, as data: built by the operations in `_ops`, sent by either client."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    params: Mapping[str, str | int | float] | None = None
    json: Any = None
    files: Sequence[FilePart] | None = None
    data: Mapping[str, str | list[str]] | None = None
    # A raw body (a catalogue feed) and its content type.
    content: bytes | None = None
    content_type: str | None = None
    # A POST that writes (adding images, captions, collections; admin): it takes an Idempotency-Key, and is safe
    # to send again after a lost answer only with one.
    write: bool = False
    idempotency_key: str | None = None
    # Statuses answered without raising (readiness answers 503 with a body worth reading).
    ok: tuple[int, ...] = (200, 201, 204)
    # Streamed answers (the export): the response is handed over unread.
    stream: bool = False


@dataclass(frozen=True)
class Emit(Generic[T]):
    """A flow's item for the caller of an iterator (a page's result, an export line)."""

    item: T


@dataclass(frozen=True)
class RetryPolicy:
    """When a request is sent again.

    Retried: 429 (the server refused it before doing anything, so always safe) and 503 (timed out, or the
    database or an index was unavailable; on a POST write only with its idempotency key) after the
    `Retry-After` the server asked for (or the backoff when it names none); 409 `idempotency_in_flight` (the
    first request with the same key is still running); and failed connections, with exponential backoff and
    jitter. A 503 or a connection lost after the request was sent is retried only where that cannot apply a
    write twice: reads, searches, PUT/PATCH/DELETE, and POST writes carrying an Idempotency-Key (the clients
    give every POST write one by default).

    The budget bounds both the attempts (`max_attempts`, the first included) and the time (`max_seconds`, from
    the first attempt until the next would start): a wait that would pass it is not made, and the error is
    raised at once (`RateLimited` for a 429, with `retry_after` saying what the server asked for)."""

    max_attempts: int = 5
    max_seconds: float = 60.0
    backoff: float = 0.25
    max_backoff: float = 8.0

    def wait(self, attempt: int) -> float:
        """The wait before attempt `attempt + 1` when the server named none: exponential, with jitter."""
        ceiling: float = min(self.max_backoff, self.backoff * 2.0 ** (attempt - 1))
        return ceiling * (0.5 + random.random() / 2)


NO_RETRY = RetryPolicy(max_attempts=1)


@dataclass(frozen=True)
class RetryEvent:
    """Given to `on_retry` before each wait: which attempt failed, how, and how long the client now waits."""

    method: str
    path: str
    attempt: int
    delay: float
    status: int | None
    code: str
    error: JointspaceError


@dataclass(frozen=True)
class Send:
    request: httpx.Request
    stream: bool


@dataclass(frozen=True)
class Sleep:
    seconds: float


# The attempt loop as a generator: yields Send (receives the httpx.Response, or the httpx.TransportError it
# raised) and Sleep (receives None); returns the successful response or raises the error.
Attempts = Generator["Send | Sleep", "httpx.Response | httpx.TransportError | None", httpx.Response]

# Connection errors raised before any byte of the request left: always safe to send again.
_NEVER_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


@dataclass
class Core:
    """The part of a client that does no I/O: settings, request building, the attempt loop."""

    base_url: str
    api_key: str | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    idempotency_keys: bool = True
    on_retry: Callable[[RetryEvent], None] | None = None
    clock: Callable[[], float] = time.monotonic

    def headers(self, user_agent: str) -> dict[str, str]:
        h = {"user-agent": user_agent, "accept": "application/json"}
        if self.api_key:
            h["authorization"] = f"Bearer {self.api_key}"
        return h

    def build(self, http: httpx.Client | httpx.AsyncClient, call: Call[Any], key: str | None) -> httpx.Request:
        headers: dict[str, str] = {}
        content: bytes | None = None
        if key is not None:
            headers["idempotency-key"] = key
        if call.json is not None:
            # Encoded once here, the same bytes on every attempt: the server's idempotency fingerprint is the body.
            content = json.dumps(call.json, separators=(",", ":"), ensure_ascii=False).encode()
            headers["content-type"] = "application/json"
        elif call.content is not None:
            content = call.content
            headers["content-type"] = call.content_type or "application/octet-stream"
        if call.stream:
            headers["accept"] = "application/x-ndjson"
        return http.build_request(
            call.method,
            call.path,
            params=dict(call.params) if call.params else None,
            content=content,
            files=list(call.files) if call.files else None,
            data=dict(call.data) if call.data else None,
            headers=headers,
        )

    def attempts(self, http: httpx.Client | httpx.AsyncClient, call: Call[Any]) -> Attempts:
        key = call.idempotency_key
        if call.write and key is None and self.idempotency_keys:
            key = str(uuid.uuid4())
        # Sending again after the server may have acted is safe for all but an unkeyed POST write.
        safe = not call.write or key is not None
        policy = self.retry
        start = self.clock()
        attempt = 0
        while True:
            attempt += 1
            outcome = yield Send(self.build(http, call, key), call.stream)
            if isinstance(outcome, httpx.Response):
                if outcome.status_code in call.ok:
                    return outcome
                if call.stream:
                    outcome.read()
                error = error_from(outcome, attempt)
                # A 503 on a keyed POST write is safe to send again: the request timeout's keeps the write's
                # answer for the same key, and any other (`unavailable`) comes before anything is stored.
                retryable = (
                    outcome.status_code == 429
                    or (outcome.status_code == 503 and safe)
                    or error.code == "idempotency_in_flight"
                )
                asked = retry_after(outcome)
                delay = asked if asked is not None else policy.wait(attempt)
            else:
                assert isinstance(outcome, httpx.TransportError)
                error = ConnectionFailed(
                    f"{call.method} {call.path}: {type(outcome).__name__}: {outcome}",
                    code="connection_failed",
                    attempts=attempt,
                )
                error.__cause__ = outcome
                retryable = safe or isinstance(outcome, _NEVER_SENT)
                delay = policy.wait(attempt)
            if not retryable or attempt >= policy.max_attempts or self.clock() - start + delay > policy.max_seconds:
                raise error
            if self.on_retry is not None:
                self.on_retry(RetryEvent(call.method, call.path, attempt, delay, error.status, error.code, error))
            yield Sleep(delay)


def method_signature(flow: Callable[..., Any], returns: str) -> inspect.Signature:
    """A client method's signature for help() and IDEs: the operation's, with `self` first and the answer as
    the method gives it (`returns` wraps the flow's result type, e.g. "Iterator[{}]")."""
    sig = inspect.signature(flow)
    ret = str(sig.return_annotation)
    inner = ret[ret.index("[") + 1 : -1] if "[" in ret else ret
    self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)
    return sig.replace(parameters=[self_param, *sig.parameters.values()], return_annotation=returns.format(inner))
