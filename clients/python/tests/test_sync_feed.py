"""Catalogue feeds through both clients, against the real server: a feed as text, its job followed to the end,
a rerun that changes nothing, a dry run of a withdrawal, a feed by URL, and a bad line refused with nothing
queued."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest

from conftest import KEYS, PHOTOS, Server
from jointspace_client import AsyncClient, Client, InvalidRequest


def feed(*items: tuple[str, str, int]) -> str:
    """JSON lines: (id, title, photo) per product, the photos as data: URLs."""
    lines = []
    for ext, title, photo in items:
        data = base64.b64encode(PHOTOS[photo].read_bytes()).decode()
        lines.append(json.dumps({"id": ext, "title": title, "image": f"data:image/png;base64,{data}"}))
    return "\n".join(lines)


def test_a_feed_is_synced_by_a_job_and_a_rerun_changes_nothing(admin: Client, collection: str, photo_host: str) -> None:
    three = feed(("sku-1", "Red shoe", 0), ("sku-2", "Blue bag", 1), ("sku-3", "Straw hat", 2))
    job = admin.sync_feed(collection, three)
    assert job["state"] in ("queued", "running")
    done = admin.wait_sync_job(collection, job["id"], poll=0.1, timeout=60)
    assert done["state"] == "succeeded", done
    report = done["report"]
    assert report is not None
    assert (report["added"], report["photos_embedded"]) == (3, 3)
    assert {i["external_id"] for i in admin.list_images(collection)["images"]} == {"sku-1", "sku-2", "sku-3"}

    again = admin.wait_sync_job(collection, admin.sync_feed(collection, three.encode())["id"], poll=0.1, timeout=60)
    assert again["report"] is not None and again["report"]["unchanged"] == 3

    # Withdrawing one of three (33%) needs the share raised; a dry run says so and writes nothing.
    one = feed(("sku-1", "Red shoe", 0), ("sku-2", "Blue bag", 1))
    dry = admin.sync_feed(collection, one, dry_run=True, max_delete_share=0.34)
    dry = admin.wait_sync_job(collection, dry["id"], poll=0.1, timeout=60)
    assert dry["dry_run"] and dry["report"] is not None
    assert [c["action"] for c in dry["report"]["changes"]] == ["delete"]
    assert admin.get_collection(collection)["images"] == 3

    # By URL: a CSV at the photo host would need a file there; the server fetches, so a refused type is named.
    with pytest.raises(InvalidRequest) as bad:
        admin.sync_feed(collection, '{"id": "x"}')
    assert "line 1: no `image`" in bad.value.message
    with pytest.raises(InvalidRequest) as fetched:
        admin.sync_feed(collection, url=f"{photo_host}/missing.csv")
    assert fetched.value.code == "url_status"


def test_the_async_client_follows_a_job_too(server: Server, admin: Client, collection: str) -> None:
    async def run() -> None:
        async with AsyncClient(server.url, api_key=KEYS["admin"]) as c:
            job = await c.sync_feed(collection, feed(("sku-9", "Belt", 3)), format="jsonl")
            done = await c.wait_sync_job(collection, job["id"], poll=0.1, timeout=60)
            assert done["state"] == "succeeded", done
            assert done["report"] is not None and done["report"]["added"] == 1

    asyncio.run(run())
