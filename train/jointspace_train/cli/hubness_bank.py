"""`hubness`: give a cosine bundle a hubness bank (and optionally the annotation side's bank of images) and record
its dev and test metrics with them (the library's `bundle.add_hubness`)."""
from __future__ import annotations

import argparse

from ..bundle.add_hubness import Hubness, give_hubness_bank
from .options import add_extraction, add_wheel, extraction_of


def hubness_of(ns: argparse.Namespace) -> Hubness:
    return Hubness(ns.cache, ns.weights, ns.wheel, extraction_of(ns), ns.captions, ns.k, ns.alpha, ns.seed, ns.bundle,
                   ns.image_k, ns.image_alpha)


def add_hubness(sub) -> None:
    p = sub.add_parser("hubness", help="give a cosine bundle a hubness bank (a search-score offset per image; "
                                       "with --image-k/--image-alpha also one per caption for annotation) and "
                                       "record its dev and test metrics with them")
    p.add_argument("--weights", help="the vision weights (as `train --weights`); default: the bundle's own")
    add_wheel(p)
    add_extraction(p)
    p.add_argument("--captions", type=int, default=10000, help="training captions in the bank")
    p.add_argument("--k", type=int, required=True, help="each image's offset is the mean of its K best bank cosines")
    p.add_argument("--alpha", type=float, required=True, help="... times -ALPHA")
    p.add_argument("--seed", type=int, default=0, help="which captions are drawn")
    p.add_argument("--image-k", type=int,
                   help="the annotation side: each caption's offset is the mean of its IMAGE_K best cosines to a "
                        "bank of all the training images (with --image-alpha; without both, no such bank)")
    p.add_argument("--image-alpha", type=float, help="... times -IMAGE_ALPHA")
    p.add_argument("bundle")
    p.set_defaults(fn=lambda ns, argv: give_hubness_bank(hubness_of(ns)))
