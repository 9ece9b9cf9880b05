"""The FNE vision graph's backbones: VGG16 (`vgg16`) and EfficientNet-Lite2 (`effnet`), each a weights type
and a graph builder over the pieces they share (`common`), and the dispatch between them by a weights
object's `backbone` name: the graph of either, and the bundle manifest's `vision` section describing it.

Nothing in `vgg16`, `effnet` or `common` imports this module back: they import `common` alone."""
from __future__ import annotations

import onnx

from . import effnet, vgg16
from .common import OPSET, save, tap_list, window_weights

__all__ = ["OPSET", "build", "effnet", "module", "save", "tap_list", "vgg16", "vision_section", "window_weights"]


def module(backbone: str):
    """The module building the graph of a weights object whose `backbone` is this name: `vgg16` for "vgg16",
    `effnet` for any other (EfficientNet-Lite2's, or an EfficientNet-Lite-shaped fixture's)."""
    return vgg16 if backbone == "vgg16" else effnet


def build(weights, tap_point: str = "post_relu", taps: str = "all", input_size: int | None = None,
          windowed_from: int | None = None) -> onnx.ModelProto:
    """The FNE graph of either backbone (VGG16 in `vgg16`, EfficientNet-Lite2 in `effnet`), at the weights' own
    crop size unless told otherwise."""
    size = input_size or weights.input_size
    return module(weights.backbone).build_graph(weights, tap_point, taps, input_size=size,
                                                windowed_from=windowed_from)


def vision_section(weights, tap_point: str, crop_mode: str) -> dict:
    """The bundle manifest's `vision` section for a graph built by `build(weights, tap_point)`."""
    taps = tap_list(weights, tap_point)
    return {"backbone": weights.backbone, "weights": weights.source, "input_size": weights.input_size,
            "resize": weights.resize,
            "crop_mode": crop_mode, "color_order": weights.color_order, "mean": list(weights.mean),
            "scale": list(weights.scale), "tap_point": tap_point, "taps": taps,
            "raw_dim": sum(t["channels"] for t in taps), "input_name": "images", "output_name": "features"}
