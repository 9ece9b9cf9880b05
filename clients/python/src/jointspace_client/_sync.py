"""The blocking client, on `httpx.Client`. Its methods are the operations of `_ops`, driven here."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, TypeVar

import httpx

from . import _ops as ops
from ._core import Call, Core, Emit, RetryEvent, RetryPolicy, Sleep, method_signature
from ._types import ExportLine
from ._version import __version__

P = ParamSpec("P")
T = TypeVar("T")


def _call(flow: Callable[P, ops.Flow[T]]) -> Callable[Concatenate[Client, P], T]:
    @functools.wraps(flow)
    def method(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._run(flow(*args, **kwargs))

    method.__signature__ = method_signature(flow, "{}")  # type: ignore[attr-defined]
    return method


def _iter(flow: Callable[P, ops.ItemFlow[T]]) -> Callable[Concatenate[Client, P], Iterator[T]]:
    @functools.wraps(flow)
    def method(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> Iterator[T]:
        return self._iterate(flow(*args, **kwargs))

    method.__signature__ = method_signature(flow, "Iterator[{}]")  # type: ignore[attr-defined]
    return method


class Client:
    """A jointspace API client (blocking; `AsyncClient` is the asyncio twin with the same methods).

    `base_url` is the server (`http://localhost:8080`); `api_key` is sent as `Authorization: Bearer`.
    `retry` bounds the retries of 429, 503 and failed connections (`RetryPolicy`; `NO_RETRY` turns them off);
    `idempotency_keys` gives every POST that writes a fresh Idempotency-Key, so that a retry never applies it
    twice; `on_retry` is called before each wait. `timeout` is httpx's (seconds; photo uploads run the CNN).
    Pass `http` to bring your own `httpx.Client` (its base URL and headers are then yours to set).
    Use it as a context manager, or call `close()`."""

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8080",
        *,
        api_key: str | None = None,
        retry: RetryPolicy | None = None,
        idempotency_keys: bool = True,
        on_retry: Callable[[RetryEvent], None] | None = None,
        timeout: float | httpx.Timeout = 120.0,
        http: httpx.Client | None = None,
    ) -> None:
        self._core = Core(base_url, api_key, retry or RetryPolicy(), idempotency_keys, on_retry)
        self._http = http or httpx.Client(
            base_url=base_url, headers=self._core.headers(f"jointspace-client-python/{__version__}"), timeout=timeout
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _execute(self, call: Call[T]) -> T:
        steps = self._core.attempts(self._http, call)
        outcome: httpx.Response | httpx.TransportError | None = None
        while True:
            try:
                action = steps.send(outcome)
            except StopIteration as done:
                return call.parse(done.value)
            if isinstance(action, Sleep):
                time.sleep(action.seconds)
                outcome = None
                continue
            try:
                outcome = self._http.send(action.request, stream=action.stream)
            except httpx.TransportError as e:
                outcome = e

    def _run(self, flow: ops.Flow[T]) -> T:
        answer: Any = None
        while True:
            try:
                step = flow.send(answer)
            except StopIteration as done:
                result: T = done.value
                return result
            if isinstance(step, Emit):
                raise TypeError("an operation emitted an item; iterators go through _iterate")
            if isinstance(step, Sleep):
                time.sleep(step.seconds)
                answer = None
                continue
            answer = self._execute(step)

    def _iterate(self, flow: ops.ItemFlow[T]) -> Iterator[T]:
        answer: Any = None
        while True:
            try:
                step = flow.send(answer)
            except StopIteration:
                return
            if isinstance(step, Sleep):
                time.sleep(step.seconds)
                answer = None
                continue
            if isinstance(step, Emit):
                answer = None
                yield step.item
            else:
                answer = self._execute(step)

    def export(self, collection: str) -> Iterator[ExportLine]:
        """The collection as export lines (`{"header": ...}`, `{"image": ...}`, `{"caption": ...}`, `{"end": ...}`),
        streamed from `GET /v1/collections/{c}/export`, read at one point in time by the server. Raises
        `JointspaceError` (code `export_incomplete`) when the stream ends without its `end` line."""
        reader = ops.ExportReader(collection)
        response = self._execute(ops.export_call(collection))
        try:
            for text in response.iter_lines():
                line = reader.line(text)
                if line is not None:
                    yield line
            reader.finish()
        finally:
            response.close()

    create_collection = _call(ops.create_collection)
    list_collections = _call(ops.list_collections)
    get_collection = _call(ops.get_collection)
    delete_collection = _call(ops.delete_collection)
    add_image = _call(ops.add_image)
    add_images = _call(ops.add_images)
    upsert_image = _call(ops.upsert_image)
    patch_image = _call(ops.patch_image)
    get_image = _call(ops.get_image)
    get_image_by_external_id = _call(ops.get_image_by_external_id)
    delete_image = _call(ops.delete_image)
    delete_image_by_external_id = _call(ops.delete_image_by_external_id)
    list_images = _call(ops.list_images)
    iter_images = _iter(ops.iter_images)
    thumbnail = _call(ops.thumbnail)
    add_captions = _call(ops.add_captions)
    list_captions = _call(ops.list_captions)
    iter_captions = _iter(ops.iter_captions)
    delete_caption = _call(ops.delete_caption)
    search_images = _call(ops.search_images)
    iter_search_images = _iter(ops.iter_search_images)
    search_captions = _call(ops.search_captions)
    iter_search_captions = _iter(ops.iter_search_captions)
    annotate = _call(ops.annotate)
    embed_text = _call(ops.embed_text)
    embed_image = _call(ops.embed_image)
    import_catalogue = _call(ops.import_catalogue)
    bundle = _call(ops.bundle)
    health = _call(ops.health)
    ready = _call(ops.ready)
    reindex = _call(ops.reindex)
    snapshot = _call(ops.snapshot)
    sync_feed = _call(ops.sync_feed)
    get_sync_job = _call(ops.get_sync_job)
    wait_sync_job = _call(ops.wait_sync_job)
