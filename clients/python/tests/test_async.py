"""The asyncio client: the same operations as the blocking one (it drives the same flows), checked end to end,
and that both clients expose every operation of openapi.yaml."""

from __future__ import annotations

import asyncio
import inspect
import re
import time
import uuid

import pytest

from conftest import FAST_RETRY, KEYS, PHOTOS, REPO, Server
from jointspace_client import (
    AsyncClient,
    Client,
    Conflict,
    NewImage,
    NotFound,
    RateLimited,
    RetryEvent,
    RetryPolicy,
)

# openapi.yaml's operationId -> the client method (the page's routes, metrics and the spec itself are not the API's
# business data and have no method).
METHODS = {
    "create_collection": "create_collection", "list_collections": "list_collections",
    "get_collection": "get_collection", "delete_collection": "delete_collection",
    "export_collection": "export", "sync_collection": "sync_feed", "get_sync_job": "get_sync_job",
    "add_images": "add_images", "list_images": "list_images",
    "get_image": "get_image", "delete_image": "delete_image", "patch_image": "patch_image",
    "get_image_by_external_id": "get_image_by_external_id", "upsert_image": "upsert_image",
    "delete_image_by_external_id": "delete_image_by_external_id", "thumbnail": "thumbnail",
    "add_captions": "add_captions", "list_captions": "list_captions", "delete_caption": "delete_caption",
    "search_images": "search_images", "search_captions": "search_captions", "embed_text": "embed_text",
    "embed_image": "embed_image", "bundle": "bundle", "reindex": "reindex", "snapshot": "snapshot",
    "healthz": "health", "readyz": "ready",
}  # fmt: skip
NO_METHOD = {"page", "page_file", "metrics", "openapi"}


def test_every_operation_of_the_contract_has_a_method_in_both_clients() -> None:
    ops = set(re.findall(r"operationId: (\w+)", (REPO / "openapi.yaml").read_text()))
    assert ops - NO_METHOD == set(METHODS), "openapi.yaml and the client's operations differ"
    public = {n for n in dir(Client) if not n.startswith("_")} - {"close"}
    assert public == {n for n in dir(AsyncClient) if not n.startswith("_")} - {"aclose"}
    for name in METHODS.values():
        assert name in public
        sync_params = list(inspect.signature(getattr(Client, name)).parameters)
        assert sync_params == list(inspect.signature(getattr(AsyncClient, name)).parameters)


def test_async_client_end_to_end(server: Server) -> None:
    async def run() -> None:
        async with AsyncClient(server.url, api_key=KEYS["admin"], retry=FAST_RETRY) as c:
            name = "t-" + uuid.uuid4().hex[:12]
            made = await c.create_collection(name, text_fields=[])
            assert made["text_fields"] == []
            try:
                added = await c.add_images(
                    name, [NewImage(p, external_id=f"a-{n}", captions=["a dog runs on the beach"])
                           for n, p in enumerate(PHOTOS[:4])]
                )  # fmt: skip
                ids = [i["id"] for i in added["images"]]
                with pytest.raises(Conflict):
                    await c.add_image(name, PHOTOS[4], external_id="a-0")
                # Concurrent requests on one client.
                images = await asyncio.gather(*(c.get_image(name, i) for i in ids))
                assert [i["external_id"] for i in images] == ["a-0", "a-1", "a-2", "a-3"]
                listed = [i["id"] async for i in c.iter_images(name, page_size=3)]
                assert listed == ids
                found = await c.search_images(name, text="a dog", k=4, mode="vector")
                paged = [r["image"]["id"] async for r in c.iter_search_images(name, text="a dog", mode="vector",
                                                                              page_size=3)]  # fmt: skip
                assert paged == [r["image"]["id"] for r in found["results"]]
                by_photo = await c.search_images(name, image=PHOTOS[1], k=1)
                assert by_photo["results"][0]["image"]["id"] == ids[1]
                up = await c.upsert_image(name, "a-1", PHOTOS[1], metadata={"v": 2})
                assert (up["outcome"], up["id"]) == ("updated", ids[1])
                assert (await c.patch_image(name, ids[1], metadata={"w": 1}))["metadata"] == {"v": 2, "w": 1}
                [cap] = (await c.add_captions(name, ["a cat"], image_id=ids[0]))["ids"]
                assert cap in [x["id"] async for x in c.iter_captions(name, image_id=ids[0])]
                await c.delete_caption(name, cap)
                assert len(await c.annotate(name, PHOTOS[0], k=2)) == 2
                assert (await c.embed_text(["a dog"]))["dim"] == (await c.bundle())["joint_dim"]
                lines = [line async for line in c.export(name)]
                assert lines[-1]["end"] == {"images": 4, "captions": 0}  # counts the captions without an image
                await c.delete_image_by_external_id(name, "a-3")
                with pytest.raises(NotFound):
                    await c.get_image(name, ids[3])
                assert (await c.thumbnail(name, ids[0]))[:2] == b"\xff\xd8"
            finally:
                await c.delete_collection(name)
            with pytest.raises(NotFound):
                await c.get_collection(name)

    asyncio.run(run())


def test_async_429_retried_then_budget_exhausted(server: Server, admin: Client, collection: str) -> None:
    async def run() -> None:
        events: list[RetryEvent] = []
        async with AsyncClient(
            server.url, api_key=KEYS["limited-async"], retry=FAST_RETRY, on_retry=events.append
        ) as c:
            await c.get_collection(collection)
            start = time.monotonic()
            # A request without a body: a 429 sent before a body was read can be lost as a reset connection
            # (README, "Retries"), and then it is the backoff, not Retry-After, that the client waits.
            assert (await c.list_images(collection))["total"] == 1
            assert time.monotonic() - start >= 0.9
        assert [(e.status, e.code) for e in events] == [(429, "rate_limited")]
        await asyncio.sleep(1.1)  # the bucket's token back
        tight = RetryPolicy(max_attempts=2, max_seconds=0.5)
        async with AsyncClient(server.url, api_key=KEYS["limited-async"], retry=tight) as c:
            await c.get_collection(collection)
            with pytest.raises(RateLimited) as e:
                await c.get_collection(collection)
            assert e.value.retry_after is not None and e.value.retry_after >= 1

    admin.add_image(collection, PHOTOS[0])
    asyncio.run(run())
