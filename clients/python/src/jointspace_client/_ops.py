"""Every operation, written once for both clients: what it sends and how its answer is read.

An operation is a generator (a `Flow`): it yields the `Call`s it needs and is sent each one's parsed answer;
an iterator also yields `Emit`s, the items its caller gets. The sync and async clients drive the same
generators, so no request is built in two places. Docstrings here are the clients' method docstrings.
"""

from __future__ import annotations

import enum
import hashlib
import json
import os
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeAlias, TypeVar
from urllib.parse import quote

import httpx

from ._core import Call, Emit, FilePart, Sleep
from ._errors import JointspaceError
from ._images import ImageInput, ImageSource, NewImage, as_base64, file_part, image_file, resolve
from ._types import (
    AddedCaptions,
    AddedImage,
    AddedImages,
    BundleInfo,
    Caption,
    CaptionList,
    CaptionResult,
    CaptionResults,
    Channel,
    Collection,
    CollectionList,
    EmbedImageResponse,
    EmbedTextResponse,
    ExportLine,
    Health,
    Image,
    ImageList,
    ImageResult,
    ImageResults,
    ImportReport,
    ItemError,
    Mode,
    NewCaption,
    Readiness,
    ReindexReport,
    SnapshotReport,
    SyncJob,
    TextField,
    UpsertedImage,
)

T = TypeVar("T")
# An operation: yields the calls it needs (receiving each one's parsed answer), and the pauses it makes
# (receiving None), and returns its result.
Flow: TypeAlias = Generator[Call[Any] | Emit[Any] | Sleep, Any, T]
# An iterator: yields calls and pauses as a Flow does, and `Emit`s, the items its caller gets.
ItemFlow: TypeAlias = Generator[Call[Any] | Emit[T] | Sleep, Any, None]
Filter = Mapping[str, Any]


class _Unset(enum.Enum):
    UNSET = "UNSET"


# "Leave as it is" for PATCH fields where None means "remove".
UNSET = _Unset.UNSET


def one(call: Call[T]) -> Flow[T]:
    """The flow of a single request: its parsed answer."""
    answer: T = yield call
    return answer


def _json(r: httpx.Response) -> Any:
    return r.json()


def _nothing(r: httpx.Response) -> None:
    return None


def _seg(part: str | int) -> str:
    # Every path segment percent-encoded, `/` included (external ids may hold one: "shoes%2Fsku-9").
    return quote(str(part), safe="")


def _col(collection: str) -> str:
    return f"/v1/collections/{_seg(collection)}"


def _dump(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _drop_none(d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


# --- collections ---------------------------------------------------------------------------------------------


def create_collection(
    name: str,
    *,
    description: str | None = None,
    text_fields: Sequence[TextField] | None = None,
    group_by: str | None = None,
    idempotency_key: str | None = None,
) -> Flow[Collection]:
    """Create a collection (admin key). `text_fields` (even `[]`) makes sentence searches hybrid by default
    and names the metadata fields searched by meaning and as keywords, each a path or `{"field": path,
    "weight": w}` (docs/api.md, "Hybrid search"); `group_by` names the
    metadata field whose value is each image's product, so an image search returns each product once
    (docs/api.md, "Products with several photos"). 409 `Conflict` when the name is taken."""
    body = _drop_none(
        {
            "name": name,
            "description": description,
            "text_fields": None if text_fields is None else list(text_fields),
            "group_by": group_by,
        }
    )
    call = Call[Collection]("POST", "/v1/collections", _json, json=body, write=True, idempotency_key=idempotency_key)
    return one(call)


def list_collections() -> Flow[list[Collection]]:
    """Every collection the key may see, with its image and caption counts."""

    def parse(r: httpx.Response) -> list[Collection]:
        body: CollectionList = r.json()
        return body["collections"]

    return one(Call[list[Collection]]("GET", "/v1/collections", parse))


def get_collection(name: str) -> Flow[Collection]:
    """One collection with its counts; `NotFound` when there is none by that name."""
    return one(Call[Collection]("GET", _col(name), _json))


def delete_collection(name: str) -> Flow[None]:
    """Delete a collection with every image and caption in it (admin key)."""
    return one(Call[None]("DELETE", _col(name), _nothing))


# --- images --------------------------------------------------------------------------------------------------


def _item_fields(item: NewImage) -> dict[str, Any]:
    return _drop_none(
        {
            "external_id": item.external_id,
            "metadata": None if item.metadata is None else dict(item.metadata),
            "captions": list(item.captions) or None,
        }
    )


def _add_call(
    collection: str,
    items: Sequence[NewImage],
    all_or_nothing: bool,
    idempotency_key: str | None,
    parse: Callable[[httpx.Response], T],
) -> Call[T]:
    if not items:
        raise ValueError("add at least one image")
    sources = [resolve(i.image) for i in items]
    path = f"{_col(collection)}/images"
    if all(s.kind == "bytes" for s in sources) and not all_or_nothing:
        # Bytes go as multipart file parts: no base64 inflation.
        files = [file_part("image", s) for s in sources]
        data: dict[str, str | list[str]] = {}
        if len(items) == 1:
            it = items[0]
            if it.external_id is not None:
                data["external_id"] = it.external_id
            if it.metadata is not None:
                data["metadata"] = _dump(dict(it.metadata))
            if it.captions:
                data["caption"] = list(it.captions)
        else:
            data["items"] = _dump([_item_fields(it) for it in items])
        return Call("POST", path, parse, files=files, data=data, write=True, idempotency_key=idempotency_key)
    images = []
    for item, src in zip(items, sources, strict=True):
        entry = _item_fields(item)
        if src.kind == "url":
            entry["url"] = src.value
        else:
            entry["data"] = as_base64(src)
        images.append(entry)
    body: dict[str, Any] = {"images": images}
    if all_or_nothing:
        body["all_or_nothing"] = True
    return Call("POST", path, parse, json=body, write=True, idempotency_key=idempotency_key)


def add_images(
    collection: str,
    images: Sequence[NewImage],
    *,
    all_or_nothing: bool = False,
    idempotency_key: str | None = None,
) -> Flow[AddedImages]:
    """Add a batch of images (at most the server's `--max-batch`, 64), stored all or nothing, searchable when
    this returns. Photos given as bytes or paths go as multipart; a batch with a URL (fetched by a server
    started with `--url-ingest`) or base64 goes as JSON. Images given by URL may fail one by one: the others
    are stored and the failures listed in `errors` (unless `all_or_nothing`); when nothing is stored the
    answer is `InvalidRequest` (422). The request carries an Idempotency-Key (yours, or a fresh UUID), so the
    client's retries never store a photo twice."""
    return one(_add_call(collection, images, all_or_nothing, idempotency_key, _json))


def add_image(
    collection: str,
    image: ImageInput,
    *,
    external_id: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    captions: Sequence[str] = (),
    idempotency_key: str | None = None,
) -> Flow[AddedImage]:
    """Add one image: a path, bytes, an http(s) URL for the server to fetch, or an `ImageSource`; with your
    `external_id` (unique in the collection: 409 `Conflict` when taken), `metadata` (a JSON object searches
    filter on) and `captions`. Returns its id, size and caption ids."""

    def parse(r: httpx.Response) -> AddedImage:
        body: AddedImages = r.json()
        return body["images"][0]

    item = NewImage(image, external_id, metadata, tuple(captions))
    return one(_add_call(collection, [item], False, idempotency_key, parse))


def upsert_image(
    collection: str,
    external_id: str,
    image: ImageInput,
    *,
    metadata: Mapping[str, Any] | None = None,
    captions: Sequence[str] = (),
) -> Flow[UpsertedImage]:
    """Make the image with your `external_id` this photo, metadata and captions (PUT by external id).
    `outcome` says what happened: `created` (201), `updated` (the same photo: metadata replaced, captions made
    what was sent, same id) or `replaced` (a new photo under a new id; `previous_id` names the old one).
    Idempotent by itself, so retried safely without a key. The photo is sent as bytes (no URL)."""
    src = resolve(image)
    path = f"{_col(collection)}/images/by-external-id/{_seg(external_id)}"
    if src.kind == "bytes":
        data: dict[str, str | list[str]] = {}
        if metadata is not None:
            data["metadata"] = _dump(dict(metadata))
        if captions:
            data["caption"] = list(captions)
        return one(Call[UpsertedImage]("PUT", path, _json, files=[file_part("image", src)], data=data))
    body = _drop_none(
        {"data": as_base64(src), "metadata": None if metadata is None else dict(metadata), "captions": list(captions)}
    )
    return one(Call[UpsertedImage]("PUT", path, _json, json=body))


def patch_image(
    collection: str,
    image_id: int,
    *,
    metadata: Mapping[str, Any] | _Unset = UNSET,
    external_id: str | None | _Unset = UNSET,
) -> Flow[Image]:
    """Change what describes an image, never its photo: `metadata` is a JSON merge patch (keys given replace
    theirs, nested objects merge, a key set to None is removed), `external_id` sets it (None removes it; 409
    `Conflict` if another image has it). Omitted arguments leave things as they are. Returns the image."""
    body: dict[str, Any] = {}
    if not isinstance(metadata, _Unset):
        body["metadata"] = dict(metadata)
    if not isinstance(external_id, _Unset):
        body["external_id"] = external_id
    return one(Call[Image]("PATCH", f"{_col(collection)}/images/{_seg(image_id)}", _json, json=body))


def get_image(collection: str, image_id: int) -> Flow[Image]:
    """One image with its captions."""
    return one(Call[Image]("GET", f"{_col(collection)}/images/{_seg(image_id)}", _json))


def get_image_by_external_id(collection: str, external_id: str) -> Flow[Image]:
    """One image, by your id, with its captions."""
    return one(Call[Image]("GET", f"{_col(collection)}/images/by-external-id/{_seg(external_id)}", _json))


def delete_image(collection: str, image_id: int) -> Flow[None]:
    """Delete an image with its captions."""
    return one(Call[None]("DELETE", f"{_col(collection)}/images/{_seg(image_id)}", _nothing))


def delete_image_by_external_id(collection: str, external_id: str) -> Flow[None]:
    """Delete the image with your id, with its captions."""
    return one(Call[None]("DELETE", f"{_col(collection)}/images/by-external-id/{_seg(external_id)}", _nothing))


def _list_images_call(
    collection: str, filter: Filter | None, external_id: str | None, offset: int, limit: int
) -> Call[ImageList]:
    params: dict[str, str | int] = {"offset": offset, "limit": limit}
    if filter is not None:
        params["filter"] = _dump(dict(filter))
    if external_id is not None:
        params["external_id"] = external_id
    return Call[ImageList]("GET", f"{_col(collection)}/images", _json, params=params)


def list_images(
    collection: str,
    *,
    filter: Filter | None = None,
    external_id: str | None = None,
    offset: int = 0,
    limit: int = 100,
) -> Flow[ImageList]:
    """One page of images (`limit` at most 1000), oldest first, with `total`, the count of all that match.
    `filter` is a metadata filter in MongoDB's syntax (docs/api.md, "Filters")."""
    return one(_list_images_call(collection, filter, external_id, offset, limit))


def iter_images(
    collection: str,
    *,
    filter: Filter | None = None,
    external_id: str | None = None,
    page_size: int = 100,
) -> ItemFlow[Image]:
    """Every image (matching `filter`), fetched a page at a time by offset. Images added or deleted while
    iterating may shift the pages (an image seen twice or not at all), as with any offset paging."""
    offset = 0
    while True:
        page: ImageList = yield from one(_list_images_call(collection, filter, external_id, offset, page_size))
        for image in page["images"]:
            yield Emit(image)
        offset += len(page["images"])
        if not page["images"] or offset >= page["total"]:
            return


def thumbnail(collection: str, image_id: int) -> Flow[bytes]:
    """The image's thumbnail: JPEG bytes, the longest side at most 256 px."""

    def parse(r: httpx.Response) -> bytes:
        return r.content

    return one(Call[bytes]("GET", f"{_col(collection)}/images/{_seg(image_id)}/thumbnail", parse))


# --- captions ------------------------------------------------------------------------------------------------


def add_captions(
    collection: str,
    captions: Sequence[str | NewCaption],
    *,
    image_id: int | None = None,
    idempotency_key: str | None = None,
) -> Flow[AddedCaptions]:
    """Add captions: strings (of `image_id` when given, else standing alone, as annotation candidates) or
    `{"text": ..., "image_id": ...}` dicts. Returns their ids in order."""
    items: list[dict[str, Any]] = []
    for c in captions:
        if isinstance(c, str):
            items.append(_drop_none({"text": c, "image_id": image_id}))
        else:
            items.append(dict(c))
    return one(
        Call[AddedCaptions](
            "POST",
            f"{_col(collection)}/captions",
            _json,
            json={"captions": items},
            write=True,
            idempotency_key=idempotency_key,
        )
    )


def _list_captions_call(collection: str, image_id: int | None, offset: int, limit: int) -> Call[CaptionList]:
    params: dict[str, str | int] = {"offset": offset, "limit": limit}
    if image_id is not None:
        params["image_id"] = image_id
    return Call[CaptionList]("GET", f"{_col(collection)}/captions", _json, params=params)


def list_captions(
    collection: str, *, image_id: int | None = None, offset: int = 0, limit: int = 100
) -> Flow[CaptionList]:
    """One page of captions (of one image when `image_id` is given), with `total`."""
    return one(_list_captions_call(collection, image_id, offset, limit))


def iter_captions(collection: str, *, image_id: int | None = None, page_size: int = 100) -> ItemFlow[Caption]:
    """Every caption (of one image when `image_id` is given), a page at a time."""
    offset = 0
    while True:
        page: CaptionList = yield from one(_list_captions_call(collection, image_id, offset, page_size))
        for caption in page["captions"]:
            yield Emit(caption)
        offset += len(page["captions"])
        if not page["captions"] or offset >= page["total"]:
            return


def delete_caption(collection: str, caption_id: int) -> Flow[None]:
    """Delete one caption."""
    return one(Call[None]("DELETE", f"{_col(collection)}/captions/{_seg(caption_id)}", _nothing))


# --- search --------------------------------------------------------------------------------------------------


def _search_call(
    path: str,
    parse: Callable[[httpx.Response], T],
    *,
    text: str | None,
    image: ImageInput | None,
    image_id: int | None,
    k: int | None,
    offset: int | None,
    filter: Filter | None = None,
    mode: Mode | None = None,
    keyword_weight: float | None = None,
    channels: Sequence[Channel] | None = None,
    min_score: float | None = None,
    group: bool | None = None,
    exact_matches: bool | None = None,
) -> Call[T]:
    fields: dict[str, Any] = _drop_none(
        {
            "text": text,
            "image_id": image_id,
            "k": k,
            "offset": offset,
            "filter": None if filter is None else dict(filter),
            "mode": mode,
            "keyword_weight": keyword_weight,
            "channels": None if channels is None else list(channels),
            "min_score": min_score,
            "group": group,
            "exact_matches": exact_matches,
        }
    )
    src: ImageSource | None = None if image is None else resolve(image)
    if src is not None and src.kind == "bytes":
        # A photo query as multipart: the fields as form fields, `filter` as JSON text.
        as_json = ("filter", "channels", "group", "exact_matches")
        data = {k: _dump(v) if k in as_json else str(v) for k, v in fields.items()}
        files: list[FilePart] = [file_part("image", src)]
        return Call("POST", path, parse, files=files, data=data)
    if src is not None:
        fields["image"] = as_base64(src)
    return Call("POST", path, parse, json=fields)


def _search_pages(page: Callable[[int], Call[Any]], page_size: int, limit: int | None, cut: bool) -> ItemFlow[Any]:
    """A search's results one by one, `page_size` a page by offset, until they run out or `limit` were handed
    out. A short page is the last, except under `min_score` (`cut`): it shortens pages anywhere in hybrid and
    keyword modes (it cuts on similarity there, not on the score the results are ordered by)."""
    offset, handed = 0, 0
    while True:
        results = (yield from one(page(offset)))["results"]
        for result in results:
            yield Emit(result)
            handed += 1
            if limit is not None and handed >= limit:
                return
        if not results or (len(results) < page_size and not cut):
            return
        offset += page_size


def search_images(
    collection: str,
    *,
    text: str | None = None,
    image: ImageInput | None = None,
    image_id: int | None = None,
    k: int | None = None,
    offset: int | None = None,
    filter: Filter | None = None,
    mode: Mode | None = None,
    keyword_weight: float | None = None,
    channels: Sequence[Channel] | None = None,
    min_score: float | None = None,
    group: bool | None = None,
    exact_matches: bool | None = None,
) -> Flow[ImageResults]:
    """Images for a sentence (`text`), a photo (`image`: path, bytes, base64) or a stored image
    (`image_id`, left out of its own results): exactly one. `k` results (default 10) after `offset`,
    best first; `filter` on metadata (then `matches` counts the images it admits); `mode` `vector`,
    `keyword` or `hybrid` for sentences (`keyword_weight` weighs the keyword channel in hybrid, `channels`
    picks which of `vector`, `text` and `keyword` it fuses; each result's `channels` says what each found);
    `min_score` leaves out weaker results. In a collection with a product key each product comes once, with
    its `product` (`key`, `photos`), and `matches` counts products; `group=False` returns photos one by one.
    Under the database index `matches` may stop counting at 10,000 or more (`matches_exact` false: at least
    that many); `exact_matches=True` counts them all."""
    return one(
        _search_call(
            f"{_col(collection)}/images/search",
            _json,
            text=text,
            image=image,
            image_id=image_id,
            k=k,
            offset=offset,
            filter=filter,
            mode=mode,
            keyword_weight=keyword_weight,
            channels=channels,
            min_score=min_score,
            group=group,
            exact_matches=exact_matches,
        )
    )


def iter_search_images(
    collection: str,
    *,
    text: str | None = None,
    image: ImageInput | None = None,
    image_id: int | None = None,
    filter: Filter | None = None,
    mode: Mode | None = None,
    keyword_weight: float | None = None,
    channels: Sequence[Channel] | None = None,
    min_score: float | None = None,
    group: bool | None = None,
    page_size: int = 10,
    limit: int | None = None,
) -> ItemFlow[ImageResult]:
    """`search_images` as an iterator over results, best first, fetching `page_size` at a time (`k` and
    `offset` paging) until the results run out or `limit` results were handed out. Each page is a new search
    (a photo query runs the CNN again for each page: prefer a larger `page_size` there)."""

    def page(offset: int) -> Call[ImageResults]:
        return _search_call(
            f"{_col(collection)}/images/search",
            _json,
            text=text,
            image=image,
            image_id=image_id,
            k=page_size,
            offset=offset,
            filter=filter,
            mode=mode,
            keyword_weight=keyword_weight,
            channels=channels,
            min_score=min_score,
            group=group,
        )

    return _search_pages(page, page_size, limit, min_score is not None)


def search_captions(
    collection: str,
    *,
    text: str | None = None,
    image: ImageInput | None = None,
    image_id: int | None = None,
    k: int | None = None,
    offset: int | None = None,
    min_score: float | None = None,
) -> Flow[CaptionResults]:
    """Captions for a photo (annotation: `image` or a stored `image_id`) or for a sentence (`text`)."""
    return one(
        _search_call(
            f"{_col(collection)}/captions/search",
            _json,
            text=text,
            image=image,
            image_id=image_id,
            k=k,
            offset=offset,
            min_score=min_score,
        )
    )


def iter_search_captions(
    collection: str,
    *,
    text: str | None = None,
    image: ImageInput | None = None,
    image_id: int | None = None,
    min_score: float | None = None,
    page_size: int = 10,
    limit: int | None = None,
) -> ItemFlow[CaptionResult]:
    """`search_captions` as an iterator, `page_size` results a page, until they run out or `limit`."""

    def page(offset: int) -> Call[CaptionResults]:
        return _search_call(
            f"{_col(collection)}/captions/search",
            _json,
            text=text,
            image=image,
            image_id=image_id,
            k=page_size,
            offset=offset,
            min_score=min_score,
        )

    return _search_pages(page, page_size, limit, min_score is not None)


def annotate(collection: str, image: ImageInput, *, k: int = 5) -> Flow[list[CaptionResult]]:
    """The `k` captions of the collection that describe a photo best (caption search by image)."""

    def parse(r: httpx.Response) -> list[CaptionResult]:
        body: CaptionResults = r.json()
        return body["results"]

    path = f"{_col(collection)}/captions/search"
    return one(_search_call(path, parse, text=None, image=image, image_id=None, k=k, offset=None))


# --- embedding -----------------------------------------------------------------------------------------------


def embed_text(texts: Sequence[str]) -> Flow[EmbedTextResponse]:
    """Sentences to vectors in the joint space (one batch)."""
    return one(Call[EmbedTextResponse]("POST", "/v1/embed/text", _json, json={"texts": list(texts)}))


def embed_image(image: ImageInput) -> Flow[EmbedImageResponse]:
    """A photo to its vector in the joint space and its packed ternary FNE code."""
    src = resolve(image)
    if src.kind == "bytes":
        return one(Call[EmbedImageResponse]("POST", "/v1/embed/image", _json, files=[file_part("image", src)]))
    return one(Call[EmbedImageResponse]("POST", "/v1/embed/image", _json, json={"image": as_base64(src)}))


# --- export and import ---------------------------------------------------------------------------------------


def _stream(r: httpx.Response) -> httpx.Response:
    return r


def export_call(collection: str) -> Call[httpx.Response]:
    return Call[httpx.Response]("GET", f"{_col(collection)}/export", _stream, stream=True)


class ExportReader:
    """Reads an export's lines, and knows whether it ended as an export must (an `end` line whose counts
    agree with the lines seen): a stream cut short raises `JointspaceError` rather than ending quietly."""

    def __init__(self, collection: str) -> None:
        self.collection = collection
        self.images = 0
        self.captions = 0
        self.ended = False

    def line(self, text: str) -> ExportLine | None:
        if not text.strip():
            return None
        line: ExportLine = json.loads(text)
        if "image" in line:
            self.images += 1
        elif "caption" in line:
            self.captions += 1
        elif "end" in line:
            end = line["end"]
            if (end.get("images"), end.get("captions")) != (self.images, self.captions):
                raise JointspaceError(
                    f"the export of {self.collection!r} says {end} but held {self.images} images and "
                    f"{self.captions} captions",
                    code="export_incomplete",
                )
            self.ended = True
        return line

    def finish(self) -> None:
        if not self.ended:
            raise JointspaceError(
                f"the export of {self.collection!r} ended without its `end` line: it was cut short",
                code="export_incomplete",
            )


def _catalogue_lines(
    catalogue: str | os.PathLike[str] | Iterable[Mapping[str, Any]], base_dir: str | os.PathLike[str] | None
) -> tuple[list[Mapping[str, Any]], Path]:
    if isinstance(catalogue, str | os.PathLike):
        path = Path(catalogue)
        lines = [json.loads(t) for t in path.read_text().splitlines() if t.strip()]
        return lines, Path(base_dir) if base_dir is not None else path.parent
    return list(catalogue), Path(base_dir) if base_dir is not None else Path.cwd()


def _catalogue_item(n: int, line: Mapping[str, Any], base: Path) -> NewImage:
    known = {"path", "url", "data", "external_id", "metadata", "captions"}
    if not isinstance(line, Mapping) or set(line) - known:
        raise ValueError(f"catalogue line {n + 1}: expected an object with keys among {sorted(known)}: {line!r}")
    given = [k for k in ("path", "url", "data") if k in line]
    if len(given) != 1:
        raise ValueError(f"catalogue line {n + 1}: give exactly one of path, url and data")
    source: ImageSource | str
    if "path" in line:
        source = image_file(base / line["path"])
    elif "url" in line:
        source = ImageSource("url", str(line["url"]))
    else:
        source = ImageSource("base64", str(line["data"]))
    return NewImage(source, line.get("external_id"), line.get("metadata"), tuple(line.get("captions") or ()))


def _batch_key(collection: str, items: Sequence[NewImage]) -> str:
    # The same batch of the same catalogue gets the same key: running an import again within the server's
    # 24 hours replays the batches it stored instead of storing them twice.
    h = hashlib.sha256(collection.encode() + b"\0")
    for it in items:
        src = resolve(it.image)
        h.update(_dump(_item_fields(it)).encode() + b"\0" + src.kind.encode() + b"\0")
        h.update(src.value if isinstance(src.value, bytes) else src.value.encode())
        h.update(b"\0")
    return "import-" + h.hexdigest()[:48]


def import_catalogue(
    collection: str,
    catalogue: str | os.PathLike[str] | Iterable[Mapping[str, Any]],
    *,
    batch: int = 16,
    base_dir: str | os.PathLike[str] | None = None,
) -> Flow[ImportReport]:
    """Add a catalogue: JSON lines (a file, or the parsed lines) of `{"path": ..., "external_id": ...,
    "metadata": {...}, "captions": [...]}`, with `url` (fetched by the server) or `data` (base64) in place of
    `path`; paths are relative to the file's folder (or `base_dir`). Sent `batch` images per request, each
    batch under an Idempotency-Key derived from its content, so running the same import again (after a crash,
    within 24 hours) replays the batches already stored instead of adding them twice. Images given by URL that
    failed are listed in `errors` with their line (`index`, 0-based). An export file is restored by
    `jointspace import` on the server's machine (it holds codes, not photos; the API has no import route)."""
    if batch < 1:
        raise ValueError("batch must be at least 1")
    lines, base = _catalogue_lines(catalogue, base_dir)
    items = [_catalogue_item(n, line, base) for n, line in enumerate(lines)]
    report = ImportReport(images=0, captions=0, batches=0, replayed_batches=0, errors=[])

    def parse(r: httpx.Response) -> tuple[AddedImages, bool]:
        return r.json(), r.headers.get("idempotent-replayed") == "true"

    for start in range(0, len(items), batch):
        chunk = items[start : start + batch]
        added, replayed = yield from one(_add_call(collection, chunk, False, _batch_key(collection, chunk), parse))
        report["batches"] += 1
        report["replayed_batches"] += int(replayed)
        report["images"] += len(added["images"])
        report["captions"] += sum(len(a["caption_ids"]) for a in added["images"])
        for e in added.get("errors", []):
            # The index in the catalogue, not in the batch.
            report["errors"].append(
                ItemError(index=start + e["index"], url=e["url"], code=e["code"], message=e["message"])
            )
    return report


# --- catalogue feeds -----------------------------------------------------------------------------------------

_FEED_TYPES = {"csv": "text/csv", "jsonl": "application/x-ndjson"}


def sync_feed(
    collection: str,
    feed: str | bytes | os.PathLike[str] | None = None,
    *,
    url: str | None = None,
    format: str | None = None,
    dry_run: bool = False,
    max_delete_share: float | None = None,
    skip_failed: bool = False,
    id_field: str | None = None,
    image_field: str | None = None,
    captions_field: str | None = None,
    caption_fields: Sequence[str] | None = None,
    number_fields: Sequence[str] | None = None,
    idempotency_key: str | None = None,
) -> Flow[SyncJob]:
    """Make the collection equal to a catalogue feed, run by the server as a job (write key): `feed` is its text
    or bytes, or a path to a file (`format` "csv" or "jsonl", else by the file's extension, else by its first
    character), or `url` names where the server fetches it (URL ingest on). Photos are http(s) or data: URLs.
    The feed is read whole first: a bad line raises `InvalidRequest` naming it, and nothing is queued; a
    second sync of a collection while one runs raises `Conflict`. Returns the queued job; `wait_sync_job`
    follows it to its end (docs/api.md, "Over HTTP" under "Keeping a catalogue feed in sync")."""
    if (feed is None) == (url is None):
        raise ValueError("give the feed or its url, one of them")
    params: dict[str, str | int | float] = {}
    for name, value in (
        ("max_delete_share", max_delete_share),
        ("id_field", id_field),
        ("image_field", image_field),
        ("captions_field", captions_field),
    ):
        if value is not None:
            params[name] = value
    for name, flag in (("dry_run", dry_run), ("skip_failed", skip_failed)):
        if flag:
            params[name] = "true"
    for name, fields in (("caption_fields", caption_fields), ("number_fields", number_fields)):
        if fields:
            params[name] = ",".join(fields)
    path = f"{_col(collection)}/sync"
    if url is not None:
        call = Call[SyncJob](
            "POST",
            path,
            _json,
            params=params,
            json={"url": url},
            write=True,
            idempotency_key=idempotency_key,
            ok=(202,),
        )
        return one(call)
    if isinstance(feed, os.PathLike):
        file = Path(feed)
        body = file.read_bytes()
        format = format or {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl"}.get(file.suffix.lower())
    else:
        body = feed.encode() if isinstance(feed, str) else bytes(feed or b"")
    if format is None:
        format = "jsonl" if body.lstrip()[:1] == b"{" else "csv"
    if format not in _FEED_TYPES:
        raise ValueError(f"format is csv or jsonl, not {format!r}")
    call = Call[SyncJob](
        "POST",
        path,
        _json,
        params=params,
        content=body,
        content_type=_FEED_TYPES[format],
        write=True,
        idempotency_key=idempotency_key,
        ok=(202,),
    )
    return one(call)


def get_sync_job(collection: str, job_id: int) -> Flow[SyncJob]:
    """A sync job: its state (`queued`, `running`, `succeeded`, `failed`), progress and, once finished, its report."""
    return one(Call[SyncJob]("GET", f"{_col(collection)}/sync/{_seg(job_id)}", _json))


def wait_sync_job(collection: str, job_id: int, *, poll: float = 0.5, timeout: float | None = None) -> Flow[SyncJob]:
    """Follow a sync job until it has `succeeded` or `failed` (polling every `poll` seconds); the finished job.
    Raises `TimeoutError` after `timeout` seconds (None: no limit)."""
    waited = 0.0
    while True:
        job: SyncJob = yield from get_sync_job(collection, job_id)
        if job["state"] in ("succeeded", "failed"):
            return job
        if timeout is not None and waited >= timeout:
            raise TimeoutError(f"sync job {job_id} is still {job['state']} after {timeout} s")
        yield Sleep(poll)
        waited += poll


# --- system and admin ----------------------------------------------------------------------------------------


def bundle() -> Flow[BundleInfo]:
    """The loaded model bundle: id, similarity, execution provider, the trainer's metrics."""
    return one(Call[BundleInfo]("GET", "/v1/bundle", _json))


def health() -> Flow[Health]:
    """Liveness (`/healthz`, no key): `{"status": "ok"}`, or the reason an inference worker died (503)."""
    return one(Call[Health]("GET", "/healthz", _json, ok=(200, 503)))


def ready() -> Flow[Readiness]:
    """Readiness (`/readyz`, no key), part by part; `ready` is False (a 503) with each failing part's reason."""
    return one(Call[Readiness]("GET", "/readyz", _json, ok=(200, 503)))


def reindex(*, idempotency_key: str | None = None) -> Flow[ReindexReport]:
    """Recompute every vector of another bundle with the loaded one (admin key)."""
    return one(Call[ReindexReport]("POST", "/v1/admin/reindex", _json, write=True, idempotency_key=idempotency_key))


def snapshot(*, idempotency_key: str | None = None) -> Flow[SnapshotReport]:
    """Write the index snapshots now (admin key)."""
    return one(Call[SnapshotReport]("POST", "/v1/admin/snapshot", _json, write=True, idempotency_key=idempotency_key))
