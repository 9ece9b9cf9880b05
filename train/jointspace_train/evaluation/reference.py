"""A bundle measured from the images themselves, through its own files (the reference pipeline), and that figure
recorded in the bundle as the one its files give."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from ..bundle import contract
from ..data import flickr8k
from ..vision import features
from . import retrieval

RECORDED_SOURCE = "trainer, the bundle's own files run over the test images"


def reference_eval(bundle_dir, data_root, split: str, threads: int = 0, crop_mode: str | None = None,
                   captions_with: str | None = None, trained_words: bool = False) -> dict:
    """Metrics of a bundle computed from the images themselves, through `pipeline.Pipeline`; `crop_mode`
    overrides the bundle's (to measure what another mode would cost or gain with the same model).
    `captions_with` (comma-separated words, plurals included): search only, by the captions holding one of them,
    among all the split's images (the held-out-word experiment); `trained_words`: through the graph the
    bundle's whole vocabulary extends."""
    from ..bundle import pipeline

    p = pipeline.Pipeline(bundle_dir, threads, trained_words)
    contract.single_backbone(p.m, bundle_dir, "the reference evaluation")
    sp = flickr8k.load_split(data_root, split)
    v = p.m["vision"]
    raw = features.extract(p.bundle.path("vision.onnx"), v, Path(data_root) / "images", sp.images,
                           crop_mode or v["crop_mode"])
    caps, owner = sp.flat_captions()
    if captions_with is None:
        return retrieval.metrics(p.scores(p.project(p.codes(raw)), p.embed_texts(caps)), owner)
    forms = flickr8k.held_out_forms(captions_with)
    words = [set(re.findall(r"\w+", c.lower())) for c in caps]
    keep = [i for i, w in enumerate(words) if forms & w]
    images = p.project(p.codes(raw))
    r = retrieval.summarise(retrieval.ranks_t2i(p.scores(images, p.embed_texts([caps[i] for i in keep])),
                                              np.asarray(owner)[keep]))
    out = {"captions": len(keep), **{k: round(float(x), 2) for k, x in zip(retrieval.KEYS[4:8], r)}}
    # The word alone ("a guitar"): of the 10 first images, the share whose captions use it (or its plural), and
    # that share by chance; whether any of them does (R@10); one query per word the split's captions use.
    precision, chance, hit = [], [], []
    for word in flickr8k.held_out_words(captions_with):
        own = flickr8k.held_out_forms(word)
        relevant = {owner[i] for i, w in enumerate(words) if own & w}
        if not relevant:
            continue
        top = np.argsort(-p.scores(images, p.embed_texts([f"a {word}"]))[:, 0], kind="stable")[:10]
        precision.append(len(relevant & set(top.tolist())) / 10)
        chance.append(len(relevant) / len(images))
        hit.append(bool(relevant & set(top.tolist())))
    out |= {"word_queries": len(precision), "word_p_at_10": round(100 * float(np.mean(precision)), 2),
            "word_p_at_10_chance": round(100 * float(np.mean(chance)), 2),
            "word_r_at_10": round(100 * float(np.mean(hit)), 2)}
    return out


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
    contract.finish(out, manifest)
