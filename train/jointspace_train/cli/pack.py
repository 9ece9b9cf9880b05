"""`pack`: every split's FNE codes and captions in one folder of a few MB (the library's `training.packs`)."""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from ..training import packs
from ..training.inputs import Extraction, Features
from ..vision.weights import VisionWeights
from .options import DEFAULT_DATA, add_data, add_tap_point, extraction_of, weights_of


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


def add_pack_bundles(sub) -> None:
    p = sub.add_parser("pack-bundles", help="every split's codes through several bundles' own vision graphs, side "
                                            "by side: the pack a bundle with several backbones trains from")
    p.add_argument("bundles", nargs="+", metavar="bundle",
                   help="bundles of one backbone each, in code order (their graphs and crop modes are used)")
    p.add_argument("--data", default=str(DEFAULT_DATA))
    p.add_argument("--batch-images", type=int, default=4)
    p.add_argument("--ort-threads", type=int, default=0, help="ONNX Runtime's threads (0: one per core)")
    p.add_argument("--out", required=True)
    p.set_defaults(fn=lambda ns, argv: packs.pack_bundles(ns.bundles, ns.data, ns.cache, ns.out, ns.ort_threads,
                                                          ns.batch_images))
