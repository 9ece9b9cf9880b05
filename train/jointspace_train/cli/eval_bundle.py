"""`eval`: a bundle's metrics on a split, from the images (the reference pipeline)."""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from ..evaluation.reference import record, reference_eval
from .options import DEFAULT_DATA


@dataclass(frozen=True)
class Eval:
    bundle: str
    data: str
    split: str
    crop: str | None  # instead of the bundle's crop mode
    record: bool = False  # keep the test figure in bundle.json, as what `jointspace eval` must reproduce
    captions_with: str | None = None
    trained_words: bool = False

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> Eval:
        return cls(ns.bundle, ns.data, ns.split, ns.crop, ns.record, ns.captions_with, ns.trained_words)


def eval_bundle(s: Eval) -> None:
    if s.record and (s.split != "test" or s.crop):
        sys.exit("--record keeps the test split's figure in the bundle's own crop mode: drop --split and --crop")
    if s.record and (s.captions_with or s.trained_words):
        sys.exit("--record keeps the figure of the bundle's own files on the whole split")
    m = reference_eval(s.bundle, s.data, s.split, crop_mode=s.crop, captions_with=s.captions_with,
                       trained_words=s.trained_words)
    print(json.dumps(m, indent=1))
    if s.record:
        record(Path(s.bundle), m)


def add_eval(sub) -> None:
    p = sub.add_parser("eval", help="a bundle's metrics on a split, from the images (reference pipeline)")
    p.add_argument("bundle")
    p.add_argument("--data", default=str(DEFAULT_DATA))
    p.add_argument("--split", default="test", choices=("dev", "test"))
    p.add_argument("--crop", choices=("center", "ten"), help="crop mode instead of the bundle's")
    p.add_argument("--record", action="store_true",
                   help="write the test figure into bundle.json (training.test_metrics), the trained model's kept "
                        "as training.trained_model_test_metrics")
    p.add_argument("--captions-with", metavar="WORDS",
                   help="comma-separated words: search only, by the split's captions holding one of them or its "
                        "plural (the held-out-word experiment, docs/results.md)")
    p.add_argument("--trained-words", action="store_true",
                   help="a whole-vocabulary bundle read through the trained graph it extends (others <unk>)")
    p.set_defaults(fn=lambda ns, argv: eval_bundle(Eval.from_args(ns)))
