import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto

from jointspace_train.bundle import contract
from jointspace_train.bundle.vision import GpuCopy, gpu_copy
from jointspace_train.vision.half import half_graph


def run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(["features"], {s.get_inputs()[0].name: x})[0]


@pytest.mark.parametrize("bundle", ["fixture-tiny", "fixture-tiny-windowed", "fixture-tiny-effnet"])
def test_the_float16_graph_gives_the_float32_features_to_float16_rounding(repo, bundle):
    model = onnx.load(repo / "models" / bundle / "vision.onnx")
    half = half_graph(model)
    convs = [t for t in half.graph.initializer if t.name.endswith("_W") or t.name.endswith("_weight")]
    assert convs and all(t.data_type == TensorProto.FLOAT16 for t in convs)
    assert half.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert half.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    side = model.graph.input[0].type.tensor_type.shape.dim[2].dim_value
    rng = np.random.default_rng(0)
    x = (rng.random((3, 3, side, side), dtype=np.float32) - 0.5) * 200
    want, got = run(model, x), run(half, x)
    assert got.dtype == np.float32 and got.shape == want.shape
    cos = (want * got).sum(1) / np.linalg.norm(want, axis=1) / np.linalg.norm(got, axis=1)
    assert cos.min() > 0.9999
    # Once is enough: halving the half graph changes nothing.
    assert half_graph(half) is half
    # float16 rounds: close, not equal (a graph left in float32 would be equal).
    assert not np.array_equal(want, got)
    assert (np.linalg.norm(want - got, axis=1) / np.linalg.norm(want, axis=1)).max() < 0.01


def copied(src, out, half=True):
    """`gpu-copy` of bundle `src` into `out` (weights fetched under out's folder); the copy's and the source's
    manifests."""
    gpu_copy(GpuCopy(cache=str(out.parent / "cache"), wheel=None, bundle=str(src), out=str(out), crop_mode=None,
                     half=half))
    return json.loads((out / "bundle.json").read_text()), json.loads((src / "bundle.json").read_text())


def test_gpu_copy_keeps_the_bundle_but_the_graph(repo, tmp_path):
    out = tmp_path / "half"
    m, s = copied(repo / "models" / "fixture-tiny-windowed", out)
    assert m["name"] == f"{s['name']}-windowed-float16"
    assert m["fne"] == s["fne"] and m["projection"] == s["projection"]
    assert m["files"][m["vision"]["onnx"]] != s["files"][s["vision"]["onnx"]]
    assert {k: v for k, v in m["files"].items() if k != "vision.onnx"} == \
        {k: v for k, v in s["files"].items() if k != "vision.onnx"}
    contract.read(out)  # every checksum holds
    graph = onnx.load(out / "vision.onnx")
    assert any(t.data_type == TensorProto.FLOAT16 for t in graph.graph.initializer)


def test_gpu_copy_copies_every_backbone(repo, tmp_path):
    """A bundle of several backbones: each graph in float16, each in its own crop mode, the rest the source's."""
    src = repo / "models" / "fixture-tiny-two"
    out = tmp_path / "half"
    m, s = copied(src, out)
    graphs = [v["onnx"] for v, _ in contract.backbones(s)]
    assert graphs == ["vision.onnx", "vision-effnet.onnx"]
    assert m["name"] == f"{s['name']}-ten+windowed-float16"
    assert [v["crop_mode"] for v, _ in contract.backbones(m)] == ["ten", "windowed"]
    assert [f for _, f in contract.backbones(m)] == [f for _, f in contract.backbones(s)]
    assert m["projection"] == s["projection"] and m["text"] == s["text"]
    for g in graphs:
        assert m["files"][g] != s["files"][g], g
        assert any(t.data_type == TensorProto.FLOAT16 for t in onnx.load(out / g).graph.initializer), g
    assert {k: v for k, v in m["files"].items() if k not in graphs} == \
        {k: v for k, v in s["files"].items() if k not in graphs}
    contract.read(out)  # every checksum holds
    # A float16 copy of a float32 copy names its own form once.
    full, _ = copied(src, tmp_path / "full", half=False)
    again, _ = copied(tmp_path / "full", tmp_path / "again")
    assert full["name"] == f"{s['name']}-ten+windowed-float32"
    assert again["name"] == f"{s['name']}-ten+windowed-float16"
