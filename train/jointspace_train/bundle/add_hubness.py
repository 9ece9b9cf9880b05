"""A cosine bundle given a hubness bank (and optionally the annotation side's bank of images), with its dev and test
metrics recorded with them (the `hubness` command)."""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from ..data import flickr8k
from ..evaluation import retrieval
from ..training.inputs import Extraction, dataset_features, select
from ..vision.weights import VisionWeights, load_weights, recorded_weights
from . import contract, own_features


@dataclass(frozen=True)
class Hubness:
    """The bundle, its banks' settings, and the features its vision graph gives the dataset."""

    cache: str
    weights: str | None  # None: the weights the bundle records (`vision.weights`)
    wheel: str | None
    extraction: Extraction
    captions: int
    k: int
    alpha: float
    seed: int
    bundle: str
    image_k: int | None = None  # the annotation side (a bank of all the training images): both or neither
    image_alpha: float | None = None


def give_hubness_bank(s: Hubness) -> None:
    """Gives a cosine bundle a hubness bank (docs/bundle.md, "The hubness section"): --captions training captions
    drawn by --seed, embedded by the bundle's own text graph; k and alpha as given (choose them on dev with
    `ensemble --hub`, scaling k with the bank's size). With --image-k and --image-alpha, also the annotation
    side's bank: every training image's unit vector through the bundle's own files (FNE statistics, W) from the
    cached features of its vision graph; without them, a previous annotation side is dropped. Then the bundle is
    measured on dev and test through its own files (FNE statistics, W, text graph, banks) on those cached
    features, with the offsets and without, and `training.test_metrics` becomes the figure with them: what
    `jointspace eval` must reproduce."""
    from . import hubness, pipeline

    d = Path(s.bundle)
    p = pipeline.Pipeline(d)
    m = p.m
    if m["similarity"] != "cosine":
        sys.exit(f"{d}: hubness offsets cosine scores; this bundle's similarity is {m['similarity']!r}")
    if (s.image_k is None) != (s.image_alpha is None):
        sys.exit("--image-k and --image-alpha go together (the annotation side's bank), or neither")
    train = flickr8k.load_split(s.extraction.data, "train")
    caps, _ = train.flat_captions()
    chosen = hubness.choose(caps, s.captions, s.seed)
    dataset = m["training"]["dataset"]
    try:
        annotation = None if s.image_k is None else hubness.annotation(
            len(train.images), s.image_k, s.image_alpha,
            f"the {len(train.images)} training images of {dataset}, embedded by this bundle's own files")
        section = hubness.section(len(chosen), s.k, s.alpha, s.seed,
                                  f"{len(chosen)} of the {len(caps)} training captions ({dataset}), "
                                  f"drawn with seed {s.seed}, embedded by this bundle's text graph",
                                  annotation=annotation)
    except ValueError as e:
        sys.exit(f"{d}: {e}")
    if len(contract.backbones(m)) > 1:
        # Several backbones: each one's features through its own graph, as the server computes them.
        index, raw = own_features.dataset_features(d, s.extraction.data, s.cache, s.extraction.ort_threads,
                                                   s.extraction.batch_images)

        def vectors(names: list[str]):
            return p.project(p.codes(raw[[index[n] for n in names]]))
    else:
        source = (VisionWeights(s.cache, s.weights, s.wheel) if s.weights
                  else recorded_weights(d, m["vision"], s.cache, s.wheel))
        w = load_weights(source)
        index, raw, _ = dataset_features(source, s.extraction, w, m["vision"]["crop_mode"])

        def vectors(names: list[str]):
            return p.project(p.codes(select(raw[[index[n] for n in names]], w, m["vision"]["tap_point"], "all")))

    # The banks are written once the features are there, and bundle.json right after them.
    hubness.write(d / hubness.FILE, p.embed_texts(chosen))
    if annotation is not None:
        hubness.write(d / hubness.IMAGES_FILE, vectors(train.images))
    else:
        (d / hubness.IMAGES_FILE).unlink(missing_ok=True)  # a previous annotation side's, no longer named
    manifest = {k: v for k, v in m.items() if k != "files"}
    manifest["hubness"] = section
    contract.finish(d, manifest)

    p = pipeline.Pipeline(d)
    measured = {}
    for split in ("dev", "test"):
        sp = flickr8k.load_split(s.extraction.data, split)
        vecs = vectors(sp.images)
        caps, owner = sp.flat_captions()
        cvecs = p.embed_texts(caps)
        measured[split] = {"plain": retrieval.metrics(pipeline.similarities(vecs, cvecs, "cosine"), owner),
                           "hubness": retrieval.metrics(p.scores(vecs, cvecs), owner)}
    manifest["hubness"]["dev_metrics"] = measured["dev"]["hubness"]
    manifest["hubness"]["dev_metrics_without"] = measured["dev"]["plain"]
    manifest["training"]["test_metrics"] = measured["test"]["hubness"]
    manifest["training"]["test_metrics_without_hubness"] = measured["test"]["plain"]
    banks = "hubness banks of captions and images" if annotation is not None else "hubness bank"
    manifest["training"]["test_metrics_source"] = ("trainer: the bundle's own files (FNE statistics, W, text graph, "
                                                   f"{banks}) on the cached features of its vision graph")
    contract.finish(d, manifest)
    print(json.dumps(measured))
