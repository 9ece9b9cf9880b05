"""`features`: extract (resumably) the raw features of train/dev/test into the cache."""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from ..training.inputs import Extraction, dataset_features
from ..vision.weights import VisionWeights, load_weights
from .options import add_data, extraction_of, weights_of


@dataclass(frozen=True)
class ExtractFeatures:
    source: VisionWeights
    extraction: Extraction
    crop: str

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> ExtractFeatures:
        return cls(weights_of(ns), extraction_of(ns), ns.crop)


def extract_features(s: ExtractFeatures) -> None:
    w = load_weights(s.source)
    _, f, _ = dataset_features(s.source, s.extraction, w, s.crop)
    of = f"{s.extraction.vision_graph}'s own graph" if s.extraction.vision_graph else s.crop
    print(f"features {f.shape} for {s.extraction.data} ({of})")


def add_features(sub) -> None:
    p = sub.add_parser("features", help="extract (resumably) the raw features of train/dev/test")
    add_data(p)
    p.set_defaults(fn=lambda ns, argv: extract_features(ExtractFeatures.from_args(ns)))
