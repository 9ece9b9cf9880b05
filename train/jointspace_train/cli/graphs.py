"""`vision-export` (write an FNE vision graph), `rebuild-vision` (a bundle's vision.onnx from its weights),
`windowed` (a copy of a bundle under the windowed crop mode; these two: the library's `bundle.vision`) and
`quantize-vision` (a copy with int8 convolutions)."""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from ..bundle.vision import GpuCopy, RebuildVision, Windowed, gpu_copy, rebuild_vision, windowed
from ..vision import backbones, features
from ..vision.backbones import vgg16
from ..vision.weights import VisionWeights, load_weights
from .options import DEFAULT_DATA, add_weights, add_wheel, weights_of


@dataclass(frozen=True)
class VisionExport:
    source: VisionWeights
    tap_point: str
    taps: str
    out: str
    windowed_from: int | None

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> VisionExport:
        return cls(weights_of(ns), ns.tap_point, ns.taps, ns.out, ns.windowed_from)


def vision_export(s: VisionExport) -> None:
    w = load_weights(s.source)
    backbones.save(backbones.build(w, s.tap_point, s.taps, windowed_from=s.windowed_from), s.out)
    print(f"{s.out}: {len(backbones.tap_list(w, s.tap_point, s.taps))} taps, "
          f"sha256 {features.sha256_file(s.out)}")


def add_vision_export(sub) -> None:
    p = sub.add_parser("vision-export", help="write an FNE vision graph")
    add_weights(p)
    p.add_argument("--tap-point", default="post_relu", choices=vgg16.TAP_POINTS)
    p.add_argument("--taps", default="all", choices=("all", "last"), help="all layers (FNE) or the last (baseline)")
    p.add_argument("--out", required=True)
    p.add_argument("--windowed-from", type=int, metavar="R",
                   help="the windowed crop mode's graph: takes the whole R x R image (docs/bundle.md)")
    p.set_defaults(fn=lambda ns, argv: vision_export(VisionExport.from_args(ns)))


def windowed_of(ns: argparse.Namespace) -> Windowed:
    return Windowed(ns.cache, ns.wheel, ns.bundle, ns.out, ns.compare, ns.data)


def add_windowed(sub) -> None:
    p = sub.add_parser("windowed", help="copy a ten-crop bundle under the windowed crop mode (two passes)")
    add_wheel(p)
    p.add_argument("bundle")
    p.add_argument("--out", required=True)
    p.add_argument("--compare", type=int, default=0, metavar="N",
                   help="then compare its features and codes with the real ten crops' on N test photos")
    p.add_argument("--data", default=str(DEFAULT_DATA))
    p.set_defaults(fn=lambda ns, argv: windowed(windowed_of(ns)))


def add_gpu_copy(sub) -> None:
    p = sub.add_parser("gpu-copy", help="copy a bundle for a GPU: float convolutions (int8 dropped), a crop mode, "
                                        "float16 if asked")
    add_wheel(p)
    p.add_argument("bundle")
    p.add_argument("--out", required=True)
    p.add_argument("--crop-mode", choices=("ten", "center", "windowed"),
                   help="for every backbone (default: each backbone's own)")
    p.add_argument("--half", action="store_true", help="float16 convolutions (float32 input and output)")
    p.set_defaults(fn=lambda ns, argv: gpu_copy(GpuCopy(ns.cache, ns.wheel, ns.bundle, ns.out, ns.crop_mode,
                                                        ns.half)))


@dataclass(frozen=True)
class QuantizeVision:
    bundle: str
    out: str
    calibration: int
    seed: int
    compare: int
    data: str
    name: str | None = None

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> QuantizeVision:
        return cls(ns.bundle, ns.out, ns.calibration, ns.seed, ns.compare, ns.data, ns.name)


def quantize_vision(s: QuantizeVision) -> None:
    from ..vision import int8

    photos = int8.calibration_photos(s.data, s.calibration, s.seed)
    m = int8.quantize(s.bundle, s.out, photos,
                             f"Flickr8k training photos drawn with seed {s.seed}", name=s.name)
    print(f"{s.out}: {m['name']}, vision.onnx sha256 {m['files'][m['vision']['onnx']]}")
    if s.compare:
        d = Path(s.data)
        test = [d / "images" / n for n in (d / "Flickr_8k.testImages.txt").read_text().split()[: s.compare]]
        print(json.dumps(int8.compare(s.bundle, s.out, test), indent=1))


def add_quantize_vision(sub) -> None:
    p = sub.add_parser("quantize-vision", help="copy a bundle with its vision graph's convolutions in int8")
    p.add_argument("bundle")
    p.add_argument("--out", required=True)
    p.add_argument("--calibration", type=int, default=16, metavar="N", help="training photos to calibrate on")
    p.add_argument("--name", help="the copy's bundle name (default: the source's with '-int8')")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compare", type=int, default=0, metavar="N",
                   help="then compare its features and codes with the float graph's on N test photos")
    p.add_argument("--data", default=str(DEFAULT_DATA))
    p.set_defaults(fn=lambda ns, argv: quantize_vision(QuantizeVision.from_args(ns)))


def rebuild_of(ns: argparse.Namespace) -> RebuildVision:
    return RebuildVision(ns.cache, ns.wheel, ns.bundle)


def add_rebuild_vision(sub) -> None:
    p = sub.add_parser("rebuild-vision", help="rebuild a bundle's vision.onnx from its recorded weights")
    add_wheel(p)
    p.add_argument("bundle")
    p.set_defaults(fn=lambda ns, argv: rebuild_vision(rebuild_of(ns)))
