"""The dataset's features through a bundle's own vision graphs: every backbone's, in its own crop mode, side by
side in code order (docs/bundle.md, "Several backbones"), each cached under its graph's sha256 as the server
computes it. What the tools that read a bundle's features share: packs of several bundles, the hubness banks,
the labels."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..data import flickr8k
from ..vision import features
from . import contract


def graphs(directory: str | Path) -> list[tuple[Path, dict]]:
    """Each backbone's graph file and vision section, in code order."""
    d = Path(directory)
    m = json.loads((d / "bundle.json").read_text())
    return [(d / v["onnx"], v) for v, _ in contract.backbones(m)]


def dataset_features(directory: str | Path, data: str | Path, cache: str | Path | None = None,
                     threads: int = 0, batch_images: int = 4) -> tuple[dict[str, int], np.ndarray]:
    """An index (image name -> row) and every image's features [N, sum of raw_dim], computed or from the
    cache."""
    names = flickr8k.all_images(data)
    root = Path(data) / "images"
    parts = [features.extract(g, v, root, names, v["crop_mode"], cache, batch_images=batch_images,
                              threads=threads) for g, v in graphs(directory)]
    raw = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
    return dict(zip(names, range(len(names)))), raw
