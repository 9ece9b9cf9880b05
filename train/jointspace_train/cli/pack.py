"""`pack`: every split's FNE codes and captions in one folder of a few MB (the library's `training.packs`)."""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from ..training import packs
from ..training.inputs import Extraction, Features
from ..vision.weights import VisionWeights
from .options import add_data, add_tap_point, extraction_of, weights_of


@dataclass(frozen=True)
class Pack:
    source: VisionWeights
    extraction: Extraction
    feats: Features  # "fne": codes (and the statistics they were cut with); "l2-last": the baseline's inputs
    out: str

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> Pack:
        return cls(weights_of(ns), extraction_of(ns), Features(ns.tap_point, ns.crop, ns.input), ns.out)


def pack(s: Pack) -> None:
    packs.pack(s.source, s.extraction, s.feats, s.out)


def add_pack(sub) -> None:
    p = sub.add_parser("pack", help="every split's FNE codes and captions in a few MB, to train elsewhere")
    add_data(p)
    add_tap_point(p)
    p.add_argument("--input", default="fne", choices=("fne", "l2-last"),
                   help="FNE codes, or the single-layer baseline's inputs (float16)")
    p.add_argument("--out", required=True)
    p.set_defaults(fn=lambda ns, argv: pack(Pack.from_args(ns)))
