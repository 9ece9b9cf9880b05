"""The reference image path (docs/bundle.md, "The image path, exactly").

The server implements the same steps in Rust; parity tests compare the two on the fixture images, so every
step here is spelled out in numpy rather than delegated to a library whose resize may differ.
"""
from __future__ import annotations

import io
from functools import lru_cache

import numpy as np
from PIL import Image

N_CROPS = {"center": 1, "ten": 10, "windowed": 2}  # CNN passes per image
CROP_MODES = tuple(N_CROPS)


PREPARE_FILTERS = {"bilinear": Image.Resampling.BILINEAR}


def prepare(rgb: np.ndarray, spec: dict | None) -> np.ndarray:
    """The training photos' preparation (docs/bundle.md, "The preparation"): a squash of the whole photo to
    spec["resize"] = [width, height] with PIL's 8-bit filter. Unchanged without a spec, or at that size."""
    if not spec:
        return rgb
    w, h = spec["resize"]
    if rgb.shape[1] == w and rgb.shape[0] == h:
        return rgb
    return np.asarray(Image.fromarray(rgb).resize((w, h), PREPARE_FILTERS[spec["filter"]]), dtype=np.uint8)


def decode(data: bytes | str) -> np.ndarray:
    """Bytes or a path -> uint8 RGB array [H, W, 3]."""
    src = io.BytesIO(data) if isinstance(data, (bytes, bytearray)) else data
    with Image.open(src) as im:
        return np.asarray(im.convert("RGB"), dtype=np.uint8)


@lru_cache(maxsize=32)
def _resize_weights(n: int, m: int) -> np.ndarray:
    """[m, n] float32 triangle-filter weights taking an axis of length n to length m."""
    scale = n / m
    support = max(scale, 1.0)
    w = np.zeros((m, n), dtype=np.float64)
    for i in range(m):
        c = (i + 0.5) * scale
        lo = max(int(np.floor(c - support)), 0)
        hi = min(int(np.ceil(c + support)), n)
        j = np.arange(lo, hi)
        wt = np.maximum(0.0, 1.0 - np.abs((j + 0.5 - c) / support))
        w[i, lo:hi] = wt / wt.sum()
    return w.astype(np.float32)


def resize(rgb: np.ndarray, size: int) -> np.ndarray:
    """uint8 [H, W, 3] -> float32 [size, size, 3], not rounded back to 8 bits."""
    h, w, _ = rgb.shape
    x = rgb.astype(np.float32)
    x = np.tensordot(_resize_weights(h, size), x, axes=(1, 0))  # rows: [size, W, 3]
    x = np.tensordot(x, _resize_weights(w, size), axes=(1, 1))  # cols: [size, 3, size]
    return np.ascontiguousarray(x.transpose(0, 2, 1))


def crops(img: np.ndarray, input_size: int, mode: str) -> np.ndarray:
    """float32 [R, R, 3] -> [n_crops, input_size, input_size, 3] in the contract's order (`windowed`:
    [2, R, R, 3])."""
    r = img.shape[0]
    s = input_size
    c = (r - s) // 2
    if mode == "center":
        return img[None, c : c + s, c : c + s]
    if mode == "windowed":
        # The whole image and its mirror: the graph reads the ten crops' windows off their feature maps.
        return np.stack([img, img[:, ::-1]])
    if mode != "ten":
        raise ValueError(f"unknown crop mode {mode!r}; expected one of {CROP_MODES}")
    offsets = [(0, 0), (0, r - s), (r - s, 0), (r - s, r - s), (c, c)]
    five = np.stack([img[y : y + s, x : x + s] for y, x in offsets])
    return np.concatenate([five, five[:, :, ::-1]])


def normalise(batch: np.ndarray, color_order: str, mean, scale) -> np.ndarray:
    """[n, S, S, 3] RGB float32 -> NCHW float32 in the graph's colour order."""
    if color_order == "BGR":
        batch = batch[..., ::-1]
    elif color_order != "RGB":
        raise ValueError(f"unknown colour order {color_order!r}")
    x = (batch - np.asarray(mean, np.float32)) * np.asarray(scale, np.float32)
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2), dtype=np.float32)


def preprocess(data: bytes | str, vision: dict, crop_mode: str | None = None) -> np.ndarray:
    """One image -> its crops as the vision graph's input [n_crops, 3, S, S], per the bundle's `vision`
    (prepared first when the bundle says how its training photos were)."""
    img = resize(prepare(decode(data), vision.get("prepare")), vision["resize"])
    cs = crops(img, vision["input_size"], crop_mode or vision["crop_mode"])
    return normalise(cs, vision["color_order"], vision["mean"], vision["scale"])
