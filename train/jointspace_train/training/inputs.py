"""The dataset's model inputs from the cached features: what training, export and the ensembles share."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..data import flickr8k
from ..vision import backbones, features, fne
from ..vision.weights import VisionWeights, graph_file, load_weights


@dataclass(frozen=True)
class Extraction:
    """The dataset's root and how its images run through the vision graph."""

    data: str
    batch_images: int = 4
    ort_threads: int = 0
    device: str = "ort"
    prep_workers: int = 1
    # A bundle whose own vision graph makes the features (e.g. a windowed int8 copy): the model then learns the
    # codes the server will compute with that graph, not the float ten crops'. Its crop mode and tap point rule.
    vision_graph: str | None = None


@dataclass(frozen=True)
class Features:
    """Which of the dataset's features a model reads: the tap point, the crop mode and the image input
    ("fne" codes, or "l2-last", the single-layer baseline)."""

    tap_point: str
    crop: str
    input: str


def dataset_features(source: VisionWeights, extraction: Extraction, weights, crop: str,
                     per_crop: bool = False):
    """Raw features of train/dev/test from the "both" graph (pre- and post-ReLU taps in one pass; a network
    with one tap point, its graph), or from a bundle's own graph (`Extraction.vision_graph`): an index (image
    name -> row), the crops' mean [N, D], and with `per_crop` each crop's row [N, n_crops, D]."""
    names = flickr8k.all_images(extraction.data)
    run, tag = None, ""
    if extraction.vision_graph:
        graph, v, crop = _bundle_graph(extraction, weights)
    else:
        tap_point = "both" if "both" in weights.tap_points else weights.tap_points[0]
        graph = graph_file(source, weights, tap_point)
        v = backbones.vision_section(weights, tap_point, crop)
        # Every bundle records this preparation and the server applies it, so the features trained on are made
        # from photos prepared the same way (a no-op on Flickr8k's own 224x224 photos: their cached features
        # stand).
        v["prepare"] = flickr8k.PREPARATION
        if extraction.device != "ort":
            from ..vision import pytorch

            if weights.backbone != "vgg16":
                raise SystemExit(f"--extract-device {extraction.device}: only VGG16 has a PyTorch twin; use 'ort'")
            device, bf16 = extraction.device.removesuffix("-bf16"), extraction.device.endswith("-bf16")
            tag = "bf16" if bf16 else ""
            run = pytorch.runner(weights, "both", device, bf16=bf16, threads=extraction.ort_threads)
    f = features.extract(graph, v, Path(extraction.data) / "images", names, crop, cache=source.cache,
                         batch_images=extraction.batch_images, threads=extraction.ort_threads, run=run,
                         prep_workers=extraction.prep_workers, tag=tag)
    crops = features.crops_of(graph, names, crop, source.cache, tag) if per_crop else None
    return dict(zip(names, range(len(names)))), f, crops


def _taps_width(weights) -> int:
    """Columns of one tap point's features (every layer)."""
    return sum(t["channels"] for t in weights.taps())


def _bundle_graph(extraction: Extraction, weights) -> tuple[Path, dict, str]:
    """The graph, vision section and crop mode of `--vision-graph`'s bundle: one tap point's columns, computed
    with ONNX Runtime as the server computes them (cached under that graph's sha256)."""
    import json

    b = Path(extraction.vision_graph)
    v = json.loads((b / "bundle.json").read_text())["vision"]
    if extraction.device != "ort":
        raise SystemExit(f"--vision-graph {b}: its features come from its own ONNX graph; use --extract-device ort")
    if v["raw_dim"] != _taps_width(weights):
        raise SystemExit(f"--vision-graph {b}: {v['raw_dim']} features, not the {weights.backbone} taps' width")
    return b / v["onnx"], v, v["crop_mode"]


def select(raw: np.ndarray, weights, tap_point: str, layer: str) -> np.ndarray:
    """Columns of the "both" features (or of a one-tap-point network's): every layer (FNE) or only the last,
    pre- or post-ReLU."""
    if tap_point not in weights.tap_points:
        raise ValueError(f"{weights.backbone} has no {tap_point} taps (it has {', '.join(weights.tap_points)})")
    part = raw
    # "both" features hold the two tap points' columns side by side; a bundle graph's (`--vision-graph`) one.
    if "both" in weights.tap_points and raw.shape[-1] == 2 * _taps_width(weights):
        half = raw.shape[-1] // 2
        part = raw[..., :half] if tap_point == "pre_relu" else raw[..., half:]
    if layer == "last":
        return part[..., -weights.taps()[-1]["channels"]:]
    return part


@dataclass(frozen=True)
class Prepared:
    """A dataset ready for training: the weights, the splits, the FNE statistics (train split), every split's
    image inputs, the training images' per-crop inputs (with crop augmentation), the tokenizer. A pack has no
    weights, statistics or crops."""

    weights: object | None  # backbones.vgg16.VggWeights or backbones.effnet.EffNetWeights
    splits: dict[str, flickr8k.Split]
    mean: np.ndarray | None
    std: np.ndarray | None
    inputs: dict[str, np.ndarray]
    train_crops: np.ndarray | None
    tok: Any  # a tokenizers.Tokenizer


def prepare(source: VisionWeights, extraction: Extraction, feats: Features, min_count: int,
            crop_augment: bool = False) -> Prepared:
    """What training and export share, from the cached features: the weights, the splits, the FNE statistics
    (train split), every split's image inputs, the training images' per-crop inputs, the tokenizer."""
    from ..text import tokenizer
    from .loop import l2_rows

    w = load_weights(source)
    index, raw, per_crop = dataset_features(source, extraction, w, feats.crop, per_crop=crop_augment)
    splits = {s: flickr8k.load_split(extraction.data, s) for s in ("train", "dev", "test")}
    rows = {s: [index[n] for n in sp.images] for s, sp in splits.items()}
    layer = "last" if feats.input == "l2-last" else "all"
    x = select(raw, w, feats.tap_point, layer)
    # FNE statistics come from the crops' mean, which is what the bundle (and the server) encodes.
    mean, std = fne.stats(x[rows["train"]])

    def image_inputs(f):
        if feats.input == "fne":
            return fne.encode(f, mean, std)
        # the single-layer baseline: L2-normalised raw features of the last layer
        flat = np.asarray(f, np.float32).reshape(-1, f.shape[-1])
        return l2_rows(flat).reshape(f.shape)

    inputs = {s: image_inputs(x[r]).astype(np.float32) for s, r in rows.items()}
    train_crops = None
    if crop_augment:
        # Per-crop inputs of the training images, 1,000 images at a time (the float16 rows are 1.3 GB).
        tr = rows["train"]
        train_crops = np.concatenate([image_inputs(select(per_crop[tr[k : k + 1000]], w, feats.tap_point, layer))
                                      for k in range(0, len(tr), 1000)])
    tok = tokenizer.build([c for cs in splits["train"].captions for c in cs], min_count)
    return Prepared(weights=w, splits=splits, mean=mean, std=std, inputs=inputs, train_crops=train_crops, tok=tok)
