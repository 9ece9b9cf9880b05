"""The bundle's hubness offset for search (docs/bundle.md, "The hubness section"), trainer side.

Some images come out near the top for many captions that are not theirs (hubs). Each image gets a search-score
offset of -alpha x the mean of its k highest cosines to a bank of training captions, which no served image owns;
a caption query then scores an image by cosine + offset. The bank is the unit vectors of a random subset of the
training captions from the bundle's own text graph, stored int8 with a float32 scale per row (max|row| / 127):
what the server reads back is exactly `vectors * scales`, which is also what the trainer uses.

The annotation side (the section's optional `annotation`) is the mirror image: each caption gets -alpha x the mean
of its k highest cosines to a bank of training images (their unit vectors through the bundle's own files, stored
the same way), and an image query scores a caption by cosine + that offset.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

from ..evaluation import retrieval
from .filemode import shareable

FILE = "hubness.safetensors"
IMAGES_FILE = "hubness-images.safetensors"  # the annotation side's bank, of training images


def quantize(bank: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[N, D] float -> (int8 [N, D], float32 scales [N]) with row r = q[r] * scales[r] up to rounding."""
    bank = np.asarray(bank, np.float32)
    scales = (np.maximum(np.abs(bank).max(axis=1), 1e-12) / 127.0).astype(np.float32)
    q = np.clip(np.round(bank / scales[:, None]), -127, 127).astype(np.int8)
    return q, scales


def dequantize(q: np.ndarray, scales: np.ndarray) -> np.ndarray:
    return q.astype(np.float32) * scales[:, None]


def write(path: str | Path, bank: np.ndarray) -> None:
    q, scales = quantize(bank)
    save_file({"vectors": q, "scales": scales}, str(path))
    shareable(path)


def read(path: str | Path, rows: int, joint_dim: int) -> np.ndarray:
    """A bank as the server uses it, float32 [rows, joint_dim] (rows: its captions, or its images for the
    annotation side's); ValueError says what is wrong."""
    t = load_file(str(path))
    q, s = t.get("vectors"), t.get("scales")
    if q is None or q.dtype != np.int8 or q.shape != (rows, joint_dim):
        raise ValueError(f"tensor 'vectors' must be int8 [{rows}, {joint_dim}], "
                         f"found {None if q is None else (q.dtype, q.shape)}")
    if s is None or s.dtype != np.float32 or s.shape != (rows,) or not np.all(np.isfinite(s)):
        raise ValueError(f"tensor 'scales' must be finite float32 [{rows}]")
    return dequantize(q, s)


def offsets(images: np.ndarray, bank: np.ndarray, k: int, alpha: float, chunk: int = 1024) -> np.ndarray:
    """Each image's search offset, float32 [N] (images: unit vectors [N, D]); in chunks of images, so a whole
    dataset against a 10,000-caption bank needs 40 MB at a time, not N x 40 KB. Generic in its sides: captions'
    vectors against a bank of images give the captions' (annotation) offsets."""
    out = [retrieval.hub_bias(np.asarray(images[i : i + chunk], np.float32) @ bank.T, k, alpha)
           for i in range(0, len(images), chunk)]
    return np.concatenate(out).astype(np.float32) if out else np.zeros(0, np.float32)


def choose(captions: list[str], n: int, seed: int) -> list[str]:
    """`n` of the captions, drawn without replacement by `seed` (all of them, in order, when n >= their count)."""
    if n >= len(captions):
        return list(captions)
    pick = np.random.default_rng(seed).choice(len(captions), n, replace=False)
    return [captions[i] for i in np.sort(pick)]


def _check(rows: int, what: str, k: int, alpha: float) -> None:
    if not 0 < k <= rows:
        raise ValueError(f"k={k} must be between 1 and the bank's {rows} {what}")
    if not (np.isfinite(alpha) and alpha >= 0):
        raise ValueError(f"alpha={alpha} must be a finite number >= 0")


def annotation(images: int, k: int, alpha: float, source: str) -> dict:
    """The section's optional `annotation` (each caption's offset against a bank of `images` training images)."""
    _check(images, "images", k, alpha)
    return {"bank": IMAGES_FILE, "images": int(images), "k": int(k), "alpha": float(alpha), "source": source}


def section(captions: int, k: int, alpha: float, seed: int, source: str, annotation: dict | None = None) -> dict:
    """The bundle's `hubness` section; `annotation` (from `annotation(...)`) adds the captions' side."""
    _check(captions, "captions", k, alpha)
    out = {"bank": FILE, "captions": int(captions), "k": int(k), "alpha": float(alpha), "seed": int(seed),
           "source": source}
    if annotation is not None:
        out["annotation"] = annotation
    return out
