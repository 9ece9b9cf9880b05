"""Photos as callers have them: a file path, bytes, a URL for the server to fetch, or base64."""

from __future__ import annotations

import base64
import mimetypes
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal


@dataclass(frozen=True)
class ImageSource:
    """A photo made explicit: `image_file`, `image_bytes`, `image_url` or `image_base64` make one."""

    kind: Literal["bytes", "url", "base64"]
    value: bytes | str
    filename: str = "image"


def image_file(path: str | os.PathLike[str]) -> ImageSource:
    """A photo on disk (read when the request is built)."""
    p = Path(path)
    return ImageSource("bytes", p.read_bytes(), p.name)


def image_bytes(data: bytes | bytearray | memoryview, filename: str = "image") -> ImageSource:
    """A photo's bytes (JPEG, PNG, WebP, GIF or BMP)."""
    return ImageSource("bytes", bytes(data), filename)


def image_url(url: str) -> ImageSource:
    """A photo the server fetches itself (only on a server started with `--url-ingest`; adding images only)."""
    return ImageSource("url", url)


def image_base64(data: str) -> ImageSource:
    """A photo already in base64 (a `data:` URL is taken too)."""
    return ImageSource("base64", data)


# What every operation taking a photo accepts: an ImageSource, bytes, a path (str or os.PathLike), an
# http(s) URL as a str (fetched by the server), or a `data:` URL as a str.
ImageInput = ImageSource | bytes | bytearray | memoryview | str | os.PathLike[str]


def resolve(image: ImageInput) -> ImageSource:
    if isinstance(image, ImageSource):
        return image
    if isinstance(image, bytes | bytearray | memoryview):
        return image_bytes(image)
    if isinstance(image, str):
        if image.startswith(("http://", "https://")):
            return image_url(image)
        if image.startswith("data:"):
            return image_base64(image)
    return image_file(image)


def as_base64(src: ImageSource) -> str:
    if src.kind == "base64":
        return str(src.value)
    if src.kind == "bytes":
        assert isinstance(src.value, bytes)
        return base64.b64encode(src.value).decode()
    raise ValueError("a URL cannot be sent as image data: only adding images takes a URL (the server fetches it)")


def file_part(name: str, src: ImageSource) -> tuple[str, tuple[str, bytes, str]]:
    assert isinstance(src.value, bytes)
    kind = mimetypes.guess_type(src.filename)[0] or "application/octet-stream"
    return (name, (src.filename, src.value, kind))


@dataclass(frozen=True)
class NewImage:
    """One image to add: the photo, and optionally your id for it, its metadata and its captions."""

    image: ImageInput
    external_id: str | None = None
    metadata: Mapping[str, Any] | None = None
    captions: Sequence[str] = field(default_factory=tuple)
