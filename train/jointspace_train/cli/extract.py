"""`features`: extract (resumably) the raw features of train/dev/test into the cache."""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from .options import Extraction, VisionWeights, add_data
from .prepare import dataset_features
from .weights import load_weights


@dataclass(frozen=True)
class ExtractFeatures:
    source: VisionWeights
    extraction: Extraction
    crop: str

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> ExtractFeatures:
        return cls(VisionWeights.from_args(ns), Extraction.from_args(ns), ns.crop)


def extract_features(s: ExtractFeatures) -> None:
    w = load_weights(s.source)
    _, f, _ = dataset_features(s.source, s.extraction, w, s.crop)
    print(f"features {f.shape} for {s.extraction.data} ({s.crop})")


def add_features(sub) -> None:
    p = sub.add_parser("features", help="extract (resumably) the raw features of train/dev/test")
    add_data(p)
    p.set_defaults(fn=lambda ns, argv: extract_features(ExtractFeatures.from_args(ns)))
