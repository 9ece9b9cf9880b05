"""`ensemble`: metrics of runs, of their mean similarity and of them stacked, optionally with hubness offsets (the
library's `evaluation.ensemble`)."""
from __future__ import annotations

import argparse

from ..evaluation.ensemble import Ensemble, ensemble
from .options import add_data, add_tap_point, extraction_of, weights_of


def hub_setting(text: str) -> tuple[int, float]:
    try:
        k, alpha = text.split(":")
        return int(k), float(alpha)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not K:ALPHA, e.g. 200:0.5") from None


def ensemble_of(ns: argparse.Namespace) -> Ensemble:
    return Ensemble(weights_of(ns), extraction_of(ns), ns.tap_point, ns.crop, ns.split, tuple(ns.hub or ()),
                    tuple(ns.runs))


def add_ensemble(sub) -> None:
    p = sub.add_parser("ensemble", help="metrics of runs and of their mean similarity, on dev or test")
    add_data(p)
    add_tap_point(p)
    p.add_argument("--split", default="dev", choices=("dev", "test"))
    p.add_argument("--hub", action="append", type=hub_setting, metavar="K:ALPHA",
                   help="also measure search with each image's score offset by -ALPHA x the mean of its K highest "
                        "cosines to the training captions (a hubness correction; repeatable)")
    p.add_argument("runs", nargs="+", help="run dirs (finished, or in progress: their best model so far)")
    p.set_defaults(fn=lambda ns, argv: ensemble(ensemble_of(ns)))
