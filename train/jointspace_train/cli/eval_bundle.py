"""`eval`: a bundle's metrics on a split, from the images (the reference pipeline)."""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

from .options import DEFAULT_DATA
from .reference import reference_eval


@dataclass(frozen=True)
class Eval:
    bundle: str
    data: str
    split: str
    crop: str | None  # instead of the bundle's crop mode

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> Eval:
        return cls(ns.bundle, ns.data, ns.split, ns.crop)


def eval_bundle(s: Eval) -> None:
    print(json.dumps(reference_eval(s.bundle, s.data, s.split, crop_mode=s.crop), indent=1))


def add_eval(sub) -> None:
    p = sub.add_parser("eval", help="a bundle's metrics on a split, from the images (reference pipeline)")
    p.add_argument("bundle")
    p.add_argument("--data", default=str(DEFAULT_DATA))
    p.add_argument("--split", default="test", choices=("dev", "test"))
    p.add_argument("--crop", choices=("center", "ten"), help="crop mode instead of the bundle's")
    p.set_defaults(fn=lambda ns, argv: eval_bundle(Eval.from_args(ns)))
