"""Collections, images and captions through the blocking client, against the real server."""

from __future__ import annotations

import base64
import uuid

import pytest

from conftest import PHOTOS
from jointspace_client import (
    UNSET,
    Client,
    Conflict,
    InvalidRequest,
    NewImage,
    NotFound,
    TextField,
    image_base64,
    image_bytes,
    image_file,
    image_url,
)


def test_collections_create_list_get_delete(admin: Client) -> None:
    name = "c-" + uuid.uuid4().hex[:10]
    fields: list[TextField] = ["title", "brand.name", {"field": "description", "weight": 0.5}]
    made = admin.create_collection(name, description="shoes and bags", text_fields=fields)
    assert (made["name"], made["description"], made["text_fields"]) == (name, "shoes and bags", fields)
    assert (made["images"], made["captions"]) == (0, 0)
    assert name in [c["name"] for c in admin.list_collections()]
    assert admin.get_collection(name)["description"] == "shoes and bags"
    with pytest.raises(Conflict) as taken:
        admin.create_collection(name)
    assert (taken.value.status, taken.value.code) == (409, "conflict")
    admin.delete_collection(name)
    with pytest.raises(NotFound) as gone:
        admin.get_collection(name)
    assert (gone.value.status, gone.value.code) == (404, "not_found")
    assert name in gone.value.message
    with pytest.raises(InvalidRequest) as bad:
        admin.create_collection("Not A Name")
    assert bad.value.status == 422


def test_add_images_every_way(admin: Client, collection: str, photo_host: str) -> None:
    path = admin.add_image(collection, PHOTOS[0], external_id="sku-path", metadata={"color": "red"}, captions=["a"])
    assert path["external_id"] == "sku-path" and len(path["caption_ids"]) == 1
    as_str = admin.add_image(collection, str(PHOTOS[1]), external_id="sku-str")
    raw = admin.add_image(collection, PHOTOS[2].read_bytes(), external_id="sku-bytes", captions=["b", "c"])
    assert len(raw["caption_ids"]) == 2
    b64 = base64.b64encode(PHOTOS[3].read_bytes()).decode()
    encoded = admin.add_image(collection, image_base64(b64), external_id="sku-b64")
    data_url = admin.add_image(collection, "data:image/png;base64," + b64, external_id="sku-data-url")
    by_url = admin.add_image(collection, f"{photo_host}/{PHOTOS[4].name}", external_id="sku-url", captions=["d"])
    ids = [x["id"] for x in (path, as_str, raw, encoded, data_url, by_url)]
    assert len(set(ids)) == 6
    # Sizes come from the photos themselves: the same photo gives the same size whichever way it was sent.
    assert (encoded["width"], encoded["height"]) == (data_url["width"], data_url["height"])
    got = admin.get_image(collection, path["id"])
    assert got["metadata"] == {"color": "red"} and [c["text"] for c in got["captions"] or []] == ["a"]
    assert admin.get_collection(collection)["images"] == 6


def test_batches_multipart_json_and_url_failures(admin: Client, collection: str, photo_host: str) -> None:
    files = admin.add_images(
        collection,
        [
            NewImage(image_file(PHOTOS[0]), external_id="m-0", metadata={"n": 0}, captions=["zero"]),
            NewImage(image_bytes(PHOTOS[1].read_bytes(), "one.png"), external_id="m-1", metadata={"n": 1}),
        ],
    )
    assert [i["external_id"] for i in files["images"]] == ["m-0", "m-1"] and "errors" not in files
    assert admin.get_image_by_external_id(collection, "m-1")["metadata"] == {"n": 1}
    mixed = admin.add_images(
        collection,
        [
            NewImage(image_url(f"{photo_host}/{PHOTOS[2].name}"), external_id="u-0"),
            NewImage(image_url(f"{photo_host}/no-such.png"), external_id="u-1"),
            NewImage(PHOTOS[3], external_id="u-2"),
        ],
    )
    assert [(i["index"], i["external_id"]) for i in mixed["images"]] == [(0, "u-0"), (2, "u-2")]
    [error] = mixed.get("errors", [])
    assert (error["index"], error["code"]) == (1, "url_status")
    with pytest.raises(InvalidRequest) as none_stored:
        admin.add_images(
            collection,
            [NewImage(PHOTOS[4], external_id="a-0"), NewImage(f"{photo_host}/no-such.png", external_id="a-1")],
            all_or_nothing=True,
        )
    assert none_stored.value.code == "url_status"
    with pytest.raises(NotFound):
        admin.get_image_by_external_id(collection, "a-0")
    with pytest.raises(Conflict) as taken:
        admin.add_image(collection, PHOTOS[5], external_id="m-0")
    assert taken.value.status == 409


def test_get_list_and_page_images(admin: Client, collection: str) -> None:
    added = admin.add_images(
        collection,
        [
            NewImage(p, external_id=f"shoes/{n}", metadata={"n": n, "even": n % 2 == 0})
            for n, p in enumerate(PHOTOS[:5])
        ],
    )
    ids = [i["id"] for i in added["images"]]
    # An external id with a slash is percent-encoded in the path.
    assert admin.get_image_by_external_id(collection, "shoes/3")["id"] == ids[3]
    page = admin.list_images(collection, offset=1, limit=2)
    assert page["total"] == 5 and [i["id"] for i in page["images"]] == ids[1:3]
    assert [i["id"] for i in admin.iter_images(collection, page_size=2)] == ids
    evens = admin.list_images(collection, filter={"even": True})
    assert evens["total"] == 3 and {i["id"] for i in evens["images"]} == {ids[0], ids[2], ids[4]}
    assert [i["id"] for i in admin.iter_images(collection, filter={"n": {"$gte": 3}}, page_size=1)] == ids[3:]
    assert [i["id"] for i in admin.list_images(collection, external_id="shoes/2")["images"]] == [ids[2]]
    with pytest.raises(InvalidRequest) as bad:
        admin.list_images(collection, filter={"n": {"$gtx": 1}})
    assert bad.value.code == "invalid_filter"
    jpeg = admin.thumbnail(collection, ids[0])
    assert jpeg[:3] == b"\xff\xd8\xff"


def test_patch_upsert_and_delete(admin: Client, collection: str) -> None:
    first = admin.add_image(collection, PHOTOS[0], metadata={"price": 10, "sale": True, "brand": {"name": "acme"}})
    patched = admin.patch_image(
        collection, first["id"], metadata={"price": 12.5, "sale": None, "brand": {"tier": 2}}, external_id="p-1"
    )
    assert patched["metadata"] == {"price": 12.5, "brand": {"name": "acme", "tier": 2}}
    assert patched["external_id"] == "p-1"
    assert admin.patch_image(collection, first["id"], external_id=None).get("external_id") is None
    assert admin.patch_image(collection, first["id"], metadata={"x": 1}, external_id=UNSET)["metadata"]["x"] == 1
    other = admin.add_image(collection, PHOTOS[1], external_id="taken")
    with pytest.raises(Conflict):
        admin.patch_image(collection, first["id"], external_id="taken")

    created = admin.upsert_image(collection, "up/1", PHOTOS[2], metadata={"v": 1}, captions=["one", "two"])
    assert created["outcome"] == "created" and len(created["caption_ids"]) == 2
    updated = admin.upsert_image(
        collection, "up/1", image_base64(base64.b64encode(PHOTOS[2].read_bytes()).decode()), captions=["two"]
    )
    assert (updated["outcome"], updated["id"]) == ("updated", created["id"])
    assert updated["caption_ids"] == created["caption_ids"][1:]  # the kept caption keeps its id
    assert admin.get_image(collection, created["id"])["metadata"] == {}
    replaced = admin.upsert_image(collection, "up/1", PHOTOS[3].read_bytes(), metadata={"v": 3})
    assert replaced["outcome"] == "replaced" and replaced.get("previous_id") == created["id"]
    with pytest.raises(NotFound):
        admin.get_image(collection, created["id"])
    with pytest.raises(ValueError):
        admin.upsert_image(collection, "up/2", image_url("https://example.com/a.jpg"))

    admin.delete_image(collection, other["id"])
    admin.delete_image_by_external_id(collection, "up/1")
    for gone in (
        lambda: admin.get_image(collection, other["id"]),
        lambda: admin.get_image_by_external_id(collection, "up/1"),
    ):
        with pytest.raises(NotFound):
            gone()
    with pytest.raises(NotFound):
        admin.delete_image(collection, other["id"])
    assert [i["id"] for i in admin.iter_images(collection)] == [first["id"]]


def test_captions_add_list_page_delete(admin: Client, collection: str) -> None:
    image = admin.add_image(collection, PHOTOS[0], captions=["a dog on the beach"])
    ids = admin.add_captions(collection, ["a brown dog", "sand and sea"], image_id=image["id"])["ids"]
    loose = admin.add_captions(collection, ["a standalone sentence", {"text": "another", "image_id": image["id"]}])[
        "ids"
    ]
    assert len(ids) == 2 and len(loose) == 2
    mine = admin.list_captions(collection, image_id=image["id"])
    assert mine["total"] == 4
    assert {c["text"] for c in mine["captions"]} == {"a dog on the beach", "a brown dog", "sand and sea", "another"}
    everything = list(admin.iter_captions(collection, page_size=2))
    assert len(everything) == 5 and len({c["id"] for c in everything}) == 5
    standalone = next(c for c in everything if c["id"] == loose[0])
    assert standalone.get("image_id") is None
    admin.delete_caption(collection, ids[0])
    assert ids[0] not in [c["id"] for c in admin.iter_captions(collection)]
    with pytest.raises(NotFound):
        admin.delete_caption(collection, ids[0])
    with pytest.raises(InvalidRequest):
        admin.add_captions(collection, ["   "])
