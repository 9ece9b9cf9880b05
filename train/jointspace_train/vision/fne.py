"""Full-Network Embedding: z-score against training statistics, then cut to {-1, 0, +1}.

Codes are stored packed, two bit-planes per code (docs/bundle.md, "The packed ternary code"), so the
trainer's caches and the server's database hold the same bytes.
"""
from __future__ import annotations

import numpy as np

THRESHOLDS = (-0.25, 0.15)
STD_EPS = 1e-6


def stats(train_features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-feature mean and (population) std over the training split, accumulated in float64."""
    f = np.asarray(train_features, np.float64)
    return f.mean(axis=0).astype(np.float32), f.std(axis=0).astype(np.float32)


def zscore(features: np.ndarray, mean: np.ndarray, std: np.ndarray, std_eps: float = STD_EPS) -> np.ndarray:
    """(f - mean) / std, with 0 wherever std <= std_eps (a constant feature carries no information)."""
    live = std > std_eps
    safe = np.where(live, std, 1.0).astype(np.float32)
    return np.where(live, (np.asarray(features, np.float32) - mean) / safe, np.float32(0)).astype(np.float32)


def ternary(z: np.ndarray, thresholds=THRESHOLDS) -> np.ndarray:
    """int8 codes: -1 where z < lo, +1 where z > hi, else 0 (the thresholds themselves give 0)."""
    lo, hi = thresholds
    return ((z > hi).astype(np.int8) - (z < lo).astype(np.int8)).astype(np.int8)


def encode(features, mean, std, thresholds=THRESHOLDS, std_eps: float = STD_EPS) -> np.ndarray:
    return ternary(zscore(features, mean, std, std_eps), thresholds)


def pack(codes: np.ndarray) -> np.ndarray:
    """int8 [..., D] -> uint8 [..., 2 * ceil(D / 8)]: the +1 plane, then the -1 plane, LSB first."""
    codes = np.asarray(codes)
    pos = np.packbits(codes == 1, axis=-1, bitorder="little")
    neg = np.packbits(codes == -1, axis=-1, bitorder="little")
    return np.concatenate([pos, neg], axis=-1)


def unpack(packed: np.ndarray, dim: int) -> np.ndarray:
    packed = np.asarray(packed, np.uint8)
    half = packed.shape[-1] // 2
    if packed.shape[-1] != 2 * ((dim + 7) // 8):
        raise ValueError(f"packed code of {packed.shape[-1]} bytes does not hold {dim} features")
    pos = np.unpackbits(packed[..., :half], axis=-1, count=dim, bitorder="little").astype(bool)
    neg = np.unpackbits(packed[..., half:], axis=-1, count=dim, bitorder="little").astype(bool)
    if np.any(pos & neg):
        raise ValueError("invalid packed code: a feature is both +1 and -1")
    return pos.astype(np.int8) - neg.astype(np.int8)
