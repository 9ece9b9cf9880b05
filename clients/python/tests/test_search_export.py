"""Search, annotation, embedding, export, import and the system operations, against the real server."""

from __future__ import annotations

import base64
import json
import uuid
from pathlib import Path

import pytest

from conftest import PHOTOS
from jointspace_client import Client, InvalidRequest, NewImage, NotFound, image_base64

CAPTIONS = [
    "a red circle",
    "a blue square",
    "a dog runs on the beach",
    "a cat sleeps on the sofa",
    "children play football in the park",
    "black stripes on white",
]


@pytest.fixture
def stocked(admin: Client, collection: str) -> tuple[str, list[int]]:
    """Six photos with metadata and captions."""
    added = admin.add_images(
        collection,
        [
            NewImage(p, external_id=f"sku-{n}", metadata={"n": n, "kind": "shoe" if n < 3 else "bag"},
                     captions=[CAPTIONS[n]])
            for n, p in enumerate(PHOTOS[:6])
        ],
    )  # fmt: skip
    return collection, [i["id"] for i in added["images"]]


def test_search_by_sentence_with_filter_mode_and_paging(admin: Client, stocked: tuple[str, list[int]]) -> None:
    collection, ids = stocked
    # A collection with captions searches a sentence in hybrid mode by default, leaning on the keywords by the
    # share of its six words the model does not know; each result says what each channel made of it.
    default = admin.search_images(collection, text="a dog running on the beach", k=6)
    assert default["mode"] == "hybrid" and len(default["results"]) == 6
    assert abs(default["keyword_weight"] - (0.2 + 0.8 * len(default["unknown_words"]) / 6)) < 1e-6
    assert abs(sum(default["weights"].values()) - 1.0) < 1e-6
    assert all("vector" in r["channels"] for r in default["results"])
    whole = admin.search_images(collection, text="a dog running on the beach", k=6, mode="vector")
    order = [r["image"]["id"] for r in whole["results"]]
    assert sorted(order) == sorted(ids)
    scores = [r["score"] for r in whole["results"]]
    assert scores == sorted(scores, reverse=True)
    second = admin.search_images(collection, text="a dog running on the beach", k=2, offset=2, mode="vector")
    assert [r["image"]["id"] for r in second["results"]] == order[2:4]
    # The iterator pages by k and offset, and gives what one big page gives, in the same order.
    assert [r["image"]["id"] for r in admin.iter_search_images(collection, text="a dog running on the beach",
                                                                 mode="vector", page_size=4)] == order  # fmt: skip
    assert len(list(admin.iter_search_images(collection, text="a dog", page_size=2, limit=3))) == 3
    shoes = admin.search_images(collection, text="a dog", filter={"kind": "shoe"}, k=10)
    assert shoes.get("matches") == 3 and {r["image"]["id"] for r in shoes["results"]} == set(ids[:3])
    assert shoes.get("matches_exact") is True
    counted = admin.search_images(collection, text="a dog", filter={"kind": "shoe"}, k=1, exact_matches=True)
    assert counted.get("matches") == 3 and counted.get("matches_exact") is True and len(counted["results"]) == 1
    bags = list(admin.iter_search_images(collection, text="a dog", filter={"kind": {"$in": ["bag"]}}, page_size=1))
    assert {r["image"]["id"] for r in bags} == set(ids[3:])
    cut = scores[2]
    high = admin.search_images(collection, text="a dog running on the beach", k=6, min_score=cut, mode="vector")
    assert [r["image"]["id"] for r in high["results"]] == order[:3]
    cut_pages = admin.iter_search_images(collection, text="a dog running on the beach", mode="vector", min_score=cut,
                                         page_size=2)  # fmt: skip
    assert [r["image"]["id"] for r in cut_pages] == order[:3]
    words = admin.search_images(collection, text="sku-4", mode="keyword", k=3)
    assert words["mode"] == "keyword" and words["results"][0]["image"]["id"] == ids[4]
    hybrid = admin.search_images(collection, text="sofa", mode="hybrid", keyword_weight=1.0, k=1)
    assert hybrid["mode"] == "hybrid" and hybrid["results"][0]["image"]["id"] == ids[3]
    with pytest.raises(InvalidRequest):
        admin.search_images(collection, text="a dog", keyword_weight=2.0)
    with pytest.raises(InvalidRequest):
        admin.search_images(collection, text="a dog", image_id=ids[0])
    with pytest.raises(NotFound):
        admin.search_images("no-such-collection", text="a dog")


def test_products_with_several_photos_come_once(admin: Client) -> None:
    name = "g-" + uuid.uuid4().hex[:12]
    made = admin.create_collection(name, text_fields=["title"], group_by="product_id")
    try:
        assert made["group_by"] == "product_id"
        photos = [
            NewImage(PHOTOS[0], external_id="p1", metadata={"product_id": "p1", "title": "Espadrille canvas"}),
            NewImage(PHOTOS[1], external_id="p1~2", metadata={"product_id": "p1"}),
            NewImage(PHOTOS[2], external_id="p2", metadata={"product_id": "p2", "title": "Loafer"}),
        ]
        ids = [i["id"] for i in admin.add_images(name, photos)["images"]]
        found = admin.search_images(name, text="a photo of a shoe", k=10)
        assert sorted(r["product"].get("key", "") for r in found["results"]) == ["p1", "p2"]
        first = next(r for r in found["results"] if r["product"].get("key") == "p1")
        assert sorted(first["product"]["photos"]) == sorted(ids[:2])
        assert first["product"]["photos"][0] == first["image"]["id"]
        one_by_one = admin.search_images(name, text="a photo of a shoe", k=10, group=False)
        assert len(one_by_one["results"]) == 3
        assert all("product" not in r for r in one_by_one["results"])
    finally:
        admin.delete_collection(name)


def test_search_by_photo_and_by_stored_image(admin: Client, stocked: tuple[str, list[int]]) -> None:
    collection, ids = stocked
    for query in (PHOTOS[2], PHOTOS[2].read_bytes(), image_base64(base64.b64encode(PHOTOS[2].read_bytes()).decode())):
        found = admin.search_images(collection, image=query, k=1)
        assert found["results"][0]["image"]["id"] == ids[2]
        assert found["results"][0]["similarity"] > 0.99
    # A multipart photo query takes the other fields too.
    filtered = admin.search_images(collection, image=PHOTOS[2], k=5, filter={"kind": "bag"})
    assert filtered.get("matches") == 3 and ids[2] not in [r["image"]["id"] for r in filtered["results"]]
    similar = admin.search_images(collection, image_id=ids[2], k=10)
    assert ids[2] not in [r["image"]["id"] for r in similar["results"]] and len(similar["results"]) == 5
    paged = [r["image"]["id"] for r in admin.iter_search_images(collection, image_id=ids[2], page_size=2)]
    assert paged == [r["image"]["id"] for r in similar["results"]]


def test_caption_search_and_annotation(admin: Client, stocked: tuple[str, list[int]]) -> None:
    collection, ids = stocked
    [lonely] = admin.add_captions(collection, ["a lonely sentence"])["ids"]
    # The fixture bundle is too small to describe photos well: these check the operations, not the model.
    best = admin.annotate(collection, PHOTOS[1], k=7)
    assert len(best) == 7 and lonely in [r["caption"]["id"] for r in best]
    scores = [r["score"] for r in best]
    assert scores == sorted(scores, reverse=True)
    ranking = [r["caption"]["id"] for r in best]
    uploaded = admin.search_captions(collection, image=PHOTOS[1].read_bytes(), k=3, offset=2)
    assert [r["caption"]["id"] for r in uploaded["results"]] == ranking[2:5]
    b64 = image_base64(base64.b64encode(PHOTOS[1].read_bytes()).decode())
    assert [r["caption"]["id"] for r in admin.search_captions(collection, image=b64, k=7)["results"]] == ranking
    # A stored image is the same photo: the same captions in the same order.
    by_id = admin.search_captions(collection, image_id=ids[1], k=7)
    assert [r["caption"]["id"] for r in by_id["results"]] == ranking
    by_text = admin.search_captions(collection, text="a dog runs on the zzzqx", k=7)
    assert len(by_text["results"]) == 7 and by_text["unknown_words"] == ["zzzqx"]
    texts = [r["caption"]["text"] for r in admin.iter_search_captions(collection, text="a dog", page_size=3)]
    assert sorted(texts) == sorted([*CAPTIONS, "a lonely sentence"])
    top = admin.search_captions(collection, text="a dog", k=7)["results"]
    assert texts == [r["caption"]["text"] for r in top]
    assert len(list(admin.iter_search_captions(collection, image=PHOTOS[1], page_size=2, limit=5))) == 5


def test_embed_text_and_image(admin: Client) -> None:
    info = admin.bundle()
    vectors = admin.embed_text(["a dog", "a red shoe"])
    assert vectors["dim"] == info["joint_dim"] and len(vectors["embeddings"]) == 2
    assert all(len(v) == info["joint_dim"] for v in vectors["embeddings"])
    photo = admin.embed_image(PHOTOS[0])
    assert photo["dim"] == info["joint_dim"] and (photo["width"], photo["height"]) == (224, 224)
    assert photo["code"]["dim"] == info["fne_dim"]
    again = admin.embed_image(image_base64(base64.b64encode(PHOTOS[0].read_bytes()).decode()))
    assert again["code"]["packed"] == photo["code"]["packed"]
    with pytest.raises(InvalidRequest):
        admin.embed_text([""])


def test_export_streams_the_collection(admin: Client, stocked: tuple[str, list[int]]) -> None:
    collection, ids = stocked
    admin.add_captions(collection, ["without an image"])
    lines = list(admin.export(collection))
    kinds = [next(iter(line)) for line in lines]
    assert kinds == ["header"] + ["image"] * 6 + ["caption", "end"]
    assert lines[0]["header"]["collection"] == collection
    assert {line["image"]["external_id"] for line in lines[1:7]} == {f"sku-{n}" for n in range(6)}
    assert lines[-1]["end"] == {"images": 6, "captions": 1}
    with pytest.raises(NotFound):
        list(admin.export("no-such-collection"))


def test_import_a_catalogue_and_run_it_again(admin: Client, collection: str, tmp_path: Path, photo_host: str) -> None:
    folder = tmp_path / "photos"
    folder.mkdir()
    lines = []
    for n, p in enumerate(PHOTOS[:5]):
        (folder / p.name).write_bytes(p.read_bytes())
        lines.append(
            {"path": f"photos/{p.name}", "external_id": f"cat-{n}", "metadata": {"n": n}, "captions": [f"c{n}"]}
        )
    lines.append({"url": f"{photo_host}/missing.png", "external_id": "cat-5"})
    lines.append({"url": f"{photo_host}/{PHOTOS[5].name}", "external_id": "cat-6"})
    catalogue = tmp_path / "catalogue.jsonl"
    catalogue.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    report = admin.import_catalogue(collection, catalogue, batch=2)
    assert (report["images"], report["captions"], report["batches"], report["replayed_batches"]) == (6, 5, 4, 0)
    assert [(e["index"], e["code"]) for e in report["errors"]] == [(5, "url_status")]
    assert admin.get_image_by_external_id(collection, "cat-3")["metadata"] == {"n": 3}
    # Again: every batch has the same Idempotency-Key as before, so the server replays it; nothing is doubled.
    again = admin.import_catalogue(collection, catalogue, batch=2)
    assert (again["images"], again["replayed_batches"]) == (6, 4)
    assert admin.get_collection(collection)["images"] == 6
    with pytest.raises(ValueError, match="line 2"):
        admin.import_catalogue(collection, [{"url": "https://example.com/a.png"}, {"nothing": 1}])


def test_system_and_admin_operations(admin: Client, stocked: tuple[str, list[int]]) -> None:
    assert admin.health()["status"] == "ok"
    ready = admin.ready()
    assert ready["ready"] is True and ready["checks"]["database"]["ok"] is True
    info = admin.bundle()
    assert info["id"].startswith("fixture-tiny") and info["similarity"] in ("cosine", "order", "euclidean")
    report = admin.reindex()
    assert report == {"images": 0, "captions": 0, "resumed": 0}  # every vector is already this bundle's
    assert admin.snapshot()["indexes"] >= 2
