"""The asyncio client, on `httpx.AsyncClient`: the same operations as `Client` (from `_ops`), awaited."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, TypeVar

import httpx

from . import _ops as ops
from ._core import Call, Core, Emit, RetryEvent, RetryPolicy, Sleep, method_signature
from ._types import ExportLine
from ._version import __version__

P = ParamSpec("P")
T = TypeVar("T")


def _call(flow: Callable[P, ops.Flow[T]]) -> Callable[Concatenate[AsyncClient, P], Coroutine[Any, Any, T]]:
    @functools.wraps(flow)
    async def method(self: AsyncClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._run(flow(*args, **kwargs))

    method.__signature__ = method_signature(flow, "Coroutine[Any, Any, {}]")  # type: ignore[attr-defined]
    return method


def _iter(flow: Callable[P, ops.ItemFlow[T]]) -> Callable[Concatenate[AsyncClient, P], AsyncIterator[T]]:
    @functools.wraps(flow)
    def method(self: AsyncClient, /, *args: P.args, **kwargs: P.kwargs) -> AsyncIterator[T]:
        return self._iterate(flow(*args, **kwargs))

    method.__signature__ = method_signature(flow, "AsyncIterator[{}]")  # type: ignore[attr-defined]
    return method


class AsyncClient:
    """The asyncio twin of `Client`: the same constructor arguments (`http` is an `httpx.AsyncClient`) and the
    same methods, awaited (`iter_*` and `export` are async iterators). Use it as an async context manager, or
    `await client.aclose()`."""

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8080",
        *,
        api_key: str | None = None,
        retry: RetryPolicy | None = None,
        idempotency_keys: bool = True,
        on_retry: Callable[[RetryEvent], None] | None = None,
        timeout: float | httpx.Timeout = 120.0,
        http: httpx.AsyncClient | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._core = Core(base_url, api_key, retry or RetryPolicy(), idempotency_keys, on_retry)
        self._sleep = sleep
        self._http = http or httpx.AsyncClient(
            base_url=base_url, headers=self._core.headers(f"jointspace-client-python/{__version__}"), timeout=timeout
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def _execute(self, call: Call[T]) -> T:
        steps = self._core.attempts(self._http, call)
        outcome: httpx.Response | httpx.TransportError | None = None
        while True:
            try:
                action = steps.send(outcome)
            except StopIteration as done:
                return call.parse(done.value)
            if isinstance(action, Sleep):
                await self._sleep(action.seconds)
                outcome = None
                continue
            try:
                outcome = await self._http.send(action.request, stream=action.stream)
            except httpx.TransportError as e:
                outcome = e

    async def _run(self, flow: ops.Flow[T]) -> T:
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
                await asyncio.sleep(step.seconds)
                answer = None
                continue
            answer = await self._execute(step)

    async def _iterate(self, flow: ops.ItemFlow[T]) -> AsyncIterator[T]:
        answer: Any = None
        while True:
            try:
                step = flow.send(answer)
            except StopIteration:
                return
            if isinstance(step, Sleep):
                await asyncio.sleep(step.seconds)
                answer = None
                continue
            if isinstance(step, Emit):
                answer = None
                yield step.item
            else:
                answer = await self._execute(step)

    async def export(self, collection: str) -> AsyncIterator[ExportLine]:
        """The collection as export lines, streamed (see `Client.export`)."""
        reader = ops.ExportReader(collection)
        response = await self._execute(ops.export_call(collection))
        try:
            async for text in response.aiter_lines():
                line = reader.line(text)
                if line is not None:
                    yield line
            reader.finish()
        finally:
            await response.aclose()

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
