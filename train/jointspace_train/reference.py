"""A bundle measured from the images themselves, through its own files (the reference pipeline), and that figure
recorded in the bundle as the one its files give."""
from __future__ import annotations

import json
from pathlib import Path

from . import bundle as bundle_mod
from . import data, evaluate, features

RECORDED_SOURCE = "trainer, the bundle's own files run over the test images"


def reference_eval(bundle_dir, data_root, split: str, threads: int = 0, crop_mode: str | None = None) -> dict:
    """Metrics of a bundle computed from the images themselves, through `pipeline.Pipeline`; `crop_mode`
    overrides the bundle's (to measure what another mode would cost or gain with the same model)."""
    from . import pipeline

    p = pipeline.Pipeline(bundle_dir, threads)
    sp = data.load_split(data_root, split)
    v = p.m["vision"]
    raw = features.extract(p.bundle.path("vision.onnx"), v, Path(data_root) / "images", sp.images,
                           crop_mode or v["crop_mode"])
    caps, owner = sp.flat_captions()
    return evaluate.metrics(p.scores(p.project(p.codes(raw)), p.embed_texts(caps)), owner)


def record(out: Path, metrics: dict) -> None:
    """`training.test_metrics` becomes the bundle's own figure (after `quantize-text`, say, the trained model's
    figure on cached features is no longer what its files give); the trained model's stays beside it."""
    manifest = json.loads((out / "bundle.json").read_text())
    manifest = {k: v for k, v in manifest.items() if k != "files"}
    training = manifest["training"]
    if training.get("test_metrics_source") != RECORDED_SOURCE:
        training["trained_model_test_metrics"] = training.get("test_metrics")
    training["test_metrics"] = metrics
    training["test_metrics_source"] = RECORDED_SOURCE
    bundle_mod.finish(out, manifest)
