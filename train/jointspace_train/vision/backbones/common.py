"""What the backbones' graph builders share: the opset, the windowed crop mode's weights, the tap list, the
spatial-mean nodes every tap ends in, and the model every graph is finished into."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

OPSET = 17


def window_weights(side: int, stride: int, input_size: int) -> np.ndarray:
    """[side/stride, side/stride] float32: how much each cell of a feature map at `stride` over a `side` image
    counts towards the mean, over the five crops of `input_size` (four corners, centre), of each crop's
    spatial mean: the number of crop windows covering the cell over (5 x window area). Exact for a network
    whose every stride up to `stride` divides the crop offsets, except at crop borders, where a real crop
    is padded with zeros and the window sees the pixels beyond it."""
    c = (side - input_size) // 2
    offsets = [(0, 0), (0, side - input_size), (side - input_size, 0),
               (side - input_size, side - input_size), (c, c)]
    for o in (0, c, side - input_size):
        if o % stride:
            raise ValueError(f"crop offset {o} is not a multiple of the stride {stride}: no windowed mode")
    n, w = side // stride, input_size // stride
    cover = np.zeros((n, n), np.float64)
    for y, x in offsets:
        cover[y // stride : y // stride + w, x // stride : x // stride + w] += 1
    return (cover / (5 * w * w)).astype(np.float32)


def tap_list(weights, tap_point: str, taps: str = "all") -> list[dict]:
    """The bundle's `vision.taps` for a graph built with the same arguments."""
    t = weights.taps()
    if taps == "last":
        t = t[-1:]
    return t + t if tap_point == "both" else t


def add_initializer(inits: list, name: str, arr) -> None:
    inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))


def spatial_mean(nodes: list, inits: list, x: str, name: str, window: np.ndarray | None = None) -> str:
    """Appends the nodes taking feature map `x` [N, C, H, W] to its spatial mean "<name>_mean" [N, C] and
    returns that name: a global average pool, or with `window` (`window_weights`) the window-weighted sum."""
    if window is not None:
        add_initializer(inits, f"{name}_window", window[None, None])
        add_initializer(inits, f"{name}_axes", np.array([2, 3], np.int64))
        nodes.append(helper.make_node("Mul", [x, f"{name}_window"], [f"{name}_weighted"]))
        nodes.append(helper.make_node("ReduceSum", [f"{name}_weighted", f"{name}_axes"], [f"{name}_mean"],
                                      keepdims=0))
    else:
        nodes.append(helper.make_node("GlobalAveragePool", [x], [f"{name}_gap"]))
        nodes.append(helper.make_node("Flatten", [f"{name}_gap"], [f"{name}_mean"], axis=1))
    return f"{name}_mean"


def finish(graph: onnx.GraphProto) -> onnx.ModelProto:
    """The checked model of a backbone's graph (opset `OPSET`, IR version 8)."""
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="jointspace_train")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def save(model: onnx.ModelProto, path: str | Path) -> None:
    Path(path).write_bytes(model.SerializeToString(deterministic=True))
