"""A bundle measured from the images themselves, through its own files (the reference pipeline)."""
from __future__ import annotations

from pathlib import Path

from .. import data, evaluate, features


def reference_eval(bundle_dir, data_root, split: str, threads: int = 0, crop_mode: str | None = None) -> dict:
    """Metrics of a bundle computed from the images themselves, through `pipeline.Pipeline`; `crop_mode`
    overrides the bundle's (to measure what another mode would cost or gain with the same model)."""
    from .. import pipeline

    p = pipeline.Pipeline(bundle_dir, threads)
    sp = data.load_split(data_root, split)
    v = p.m["vision"]
    raw = features.extract(p.bundle.path("vision.onnx"), v, Path(data_root) / "images", sp.images,
                           crop_mode or v["crop_mode"])
    caps, owner = sp.flat_captions()
    return evaluate.metrics(p.scores(p.project(p.codes(raw)), p.embed_texts(caps)), owner)
