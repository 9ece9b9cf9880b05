"""The wire types, as openapi.yaml's `components/schemas` describe them (same names, same keys).

Answers are plain dicts typed as TypedDicts: what the server sends, key for key, so nothing is lost when the
server adds a field. Keys the contract marks optional (or sends only sometimes) are `NotRequired`.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

Mode = Literal["vector", "keyword", "hybrid"]
#: A channel of hybrid search: the photo, the words by meaning, the words as keywords.
Channel = Literal["vector", "text", "keyword"]
Outcome = Literal["created", "replaced", "updated"]
Similarity = Literal["cosine", "order", "euclidean"]
JsonObject = dict[str, Any]


class ErrorDetail(TypedDict):
    status: int
    code: str
    message: str


class ErrorBody(TypedDict):
    error: ErrorDetail


class WeightedTextField(TypedDict):
    """A text field with the weight of its sentences by meaning (0 to 10; 0: keywords only)."""

    field: str
    weight: NotRequired[float]


#: A metadata path (weight 1), or a path with its weight.
TextField = str | WeightedTextField


class Collection(TypedDict):
    name: str
    description: str
    created_at: str
    images: int
    captions: int
    text_fields: NotRequired[list[TextField] | None]
    #: The metadata field naming each image's product; None: every image stands alone.
    group_by: NotRequired[str | None]


class CollectionList(TypedDict):
    collections: list[Collection]


class Caption(TypedDict):
    id: int
    text: str
    created_at: str
    image_id: NotRequired[int | None]
    #: A sentence of the image's text field of this name (caption search finds them); absent when written.
    field: NotRequired[str]


class CaptionList(TypedDict):
    captions: list[Caption]
    total: int


class Image(TypedDict):
    id: int
    metadata: JsonObject
    width: int
    height: int
    bundle_id: str
    created_at: str
    external_id: NotRequired[str | None]
    captions: NotRequired[list[Caption] | None]


class ImageList(TypedDict):
    images: list[Image]
    total: int


class AddedImage(TypedDict):
    index: int
    id: int
    width: int
    height: int
    caption_ids: list[int]
    external_id: NotRequired[str | None]


class ItemError(TypedDict):
    index: int
    url: str
    code: str
    message: str


class AddedImages(TypedDict):
    images: list[AddedImage]
    errors: NotRequired[list[ItemError]]


class AddedCaptions(TypedDict):
    ids: list[int]


class NewCaption(TypedDict):
    text: str
    image_id: NotRequired[int | None]


class UpsertedImage(TypedDict):
    id: int
    external_id: str
    outcome: Outcome
    width: int
    height: int
    caption_ids: list[int]
    previous_id: NotRequired[int | None]


class ChannelScores(TypedDict, total=False):
    """What each channel said of a hybrid or keyword result (a channel that did not reach it is absent)."""

    vector: float
    text: float
    keyword: float


class ChannelWeights(TypedDict):
    vector: float
    text: float
    keyword: float


class Product(TypedDict):
    #: The value of the collection's `group_by` field; absent for an image without one.
    key: NotRequired[str]
    #: The product's photos: the result's image first, then the others by id.
    photos: list[int]


class ImageResult(TypedDict):
    score: float
    similarity: float
    image: Image
    #: Keyword and hybrid modes: what each channel said of this image.
    channels: NotRequired[ChannelScores]
    #: A search grouped by the collection's product key: the product this image is the best photo of.
    product: NotRequired[Product]


class ImageResults(TypedDict):
    results: list[ImageResult]
    mode: Mode
    unknown_words: list[str]
    matches: NotRequired[int | None]
    #: With `matches`: False when counting stopped there (at least that many; the database index).
    matches_exact: NotRequired[bool]
    #: Hybrid: the keyword channel's share of the fused score the search used.
    keyword_weight: NotRequired[float]
    #: Hybrid: every channel's weight in the fusion.
    weights: NotRequired[ChannelWeights]


class CaptionResult(TypedDict):
    score: float
    similarity: float
    caption: Caption


class CaptionResults(TypedDict):
    results: list[CaptionResult]
    unknown_words: list[str]


class EmbedTextResponse(TypedDict):
    dim: int
    embeddings: list[list[float]]


class FneCode(TypedDict):
    dim: int
    packed: str
    plus: int
    minus: int


class EmbedImageResponse(TypedDict):
    dim: int
    embedding: list[float]
    code: FneCode
    width: int
    height: int


class BackboneInfo(TypedDict):
    backbone: str
    crop_mode: str
    fne_dim: int


class BundleInfo(TypedDict):
    id: str
    name: str
    created: str
    similarity: Similarity
    joint_dim: int
    fne_dim: int  # features in the code: every backbone's together
    crop_mode: str  # the first backbone's
    backbones: list[BackboneInfo]  # in code order
    provider: str
    training: JsonObject


class Check(TypedDict):
    ok: bool
    reason: NotRequired[str | None]


class ReadyChecks(TypedDict):
    vision: Check
    text: Check
    database: Check
    index: Check


class Readiness(TypedDict):
    ready: bool
    bundle: bool
    database: bool
    index: bool
    execution_provider: str
    checks: ReadyChecks
    message: NotRequired[str | None]


class Health(TypedDict):
    status: str
    version: str


class ReindexReport(TypedDict):
    images: int
    captions: int
    resumed: int


class SnapshotReport(TypedDict):
    indexes: int


class SyncFailure(TypedDict):
    line: int
    external_id: str
    reason: str


class SyncAction(TypedDict):
    line: int | None
    external_id: str
    action: Literal["add", "replace", "reembed", "update", "delete"]


class SyncReport(TypedDict):
    """What a sync job did (or, in a dry run, would do)."""

    items: int
    added: int
    replaced: int
    reembedded: int
    updated: int
    unchanged: int
    deleted: int
    failed: list[SyncFailure]
    left_without_external_id: int
    photos_embedded: int
    sentences_embedded: int
    refused: NotRequired[str | None]
    seconds: float
    changes: list[SyncAction]


class SyncJob(TypedDict):
    """A catalogue feed's sync, run by the server as a job (`POST /v1/collections/{c}/sync`)."""

    id: int
    collection: str
    state: Literal["queued", "running", "succeeded", "failed"]
    dry_run: bool
    items: int
    done: int
    attempts: int
    created_at: str
    started_at: NotRequired[str | None]
    finished_at: NotRequired[str | None]
    report: NotRequired[SyncReport | None]
    error: NotRequired[str | None]


class ImportReport(TypedDict):
    """What `import_catalogue` did (a client-side summary, not a wire type)."""

    images: int
    captions: int
    batches: int
    replayed_batches: int
    errors: list[ItemError]


# One line of an export (`GET /v1/collections/{c}/export`, application/x-ndjson): one key naming its kind,
# `header`, `image`, `caption` or `end` (docs/api.md, "Export and import").
ExportLine = dict[str, JsonObject]
