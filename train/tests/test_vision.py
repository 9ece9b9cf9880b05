import hashlib

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F

from jointspace_train.vision import backbones, features
from jointspace_train.vision.backbones import vgg16
from tv_layout import torchvision_layout

SMALL = ((3, 3), (4, 4), (4, 4, 4), (5, 5, 5), (6, 6, 6))


def torch_reference(w: vgg16.VggWeights, x: np.ndarray, tap_point: str) -> np.ndarray:
    """An independent computation of the FNE taps with torch ops."""
    h = torch.from_numpy(x)
    outs = []
    ends = set(np.cumsum([len(b) for b in w.blocks]) - 1)
    for i, (_, wt, b) in enumerate(w.convs):
        pre = F.conv2d(h, torch.from_numpy(wt), torch.from_numpy(b), padding=1)
        h = F.relu(pre)
        outs.append((pre if tap_point == "pre_relu" else h).mean(dim=(2, 3)))
        if i in ends:
            h = F.max_pool2d(h, 2)
    h = h.flatten(1)
    for _, wt, b in w.fcs:
        pre = h @ torch.from_numpy(wt).T + torch.from_numpy(b)
        h = F.relu(pre)
        outs.append(pre if tap_point == "pre_relu" else h)
    return torch.cat(outs, 1).numpy()


@pytest.mark.parametrize("tap_point", ["pre_relu", "post_relu"])
def test_graph_matches_torch_reference_with_fc_layers(tmp_path, tap_point):
    w = vgg16.random_vgg(SMALL, seed=3, fc=10)
    path = tmp_path / "g.onnx"
    backbones.save(vgg16.build_graph(w, tap_point), path)
    x = np.random.default_rng(0).normal(0, 50, (2, 3, 224, 224)).astype(np.float32)
    got = features.session(path).run(None, {"images": x})[0]
    want = torch_reference(w, x, tap_point)
    assert got.shape == (2, sum(sum(b) for b in SMALL) + 20)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_both_and_last(tmp_path):
    w = vgg16.random_vgg(SMALL, seed=4)
    x = np.random.default_rng(1).normal(0, 50, (1, 3, 224, 224)).astype(np.float32)
    run = {}
    for tp, taps in [("both", "all"), ("pre_relu", "all"), ("post_relu", "all"), ("post_relu", "last")]:
        p = tmp_path / f"{tp}-{taps}.onnx"
        backbones.save(vgg16.build_graph(w, tp, taps), p)
        run[tp, taps] = features.session(p).run(None, {"images": x})[0]
    d = sum(sum(b) for b in SMALL)
    np.testing.assert_allclose(run["both", "all"][:, :d], run["pre_relu", "all"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(run["both", "all"][:, d:], run["post_relu", "all"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(run["post_relu", "last"], run["post_relu", "all"][:, -6:], rtol=1e-5, atol=1e-5)
    assert (run["post_relu", "all"] >= 0).all() and (run["pre_relu", "all"] < 0).any()


def test_build_is_byte_reproducible():
    w = vgg16.random_vgg(SMALL, seed=5)
    a = vgg16.build_graph(w, "post_relu").SerializeToString(deterministic=True)
    b = vgg16.build_graph(vgg16.random_vgg(SMALL, seed=5), "post_relu").SerializeToString(deterministic=True)
    assert hashlib.sha256(a).digest() == hashlib.sha256(b).digest()


def test_torchvision_state_dict_layout_gives_the_papers_12416():
    # torchvision vgg16: features.{0,2,5,...}.weight, classifier.0 (fc6) and .3 (fc7); shapes only, no memory
    sd, cin, idx = {}, 3, 0
    for block in vgg16.VGG16_BLOCKS:
        for cout in block:
            sd[f"features.{idx}.weight"] = np.broadcast_to(np.float32(0), (cout, cin, 3, 3))
            sd[f"features.{idx}.bias"] = np.zeros(cout, np.float32)
            cin, idx = cout, idx + 2
        idx += 1  # the max-pool's slot
    sd["classifier.0.weight"] = np.broadcast_to(np.float32(0), (4096, 512 * 7 * 7))
    sd["classifier.0.bias"] = np.zeros(4096, np.float32)
    sd["classifier.3.weight"] = np.broadcast_to(np.float32(0), (4096, 4096))
    sd["classifier.3.bias"] = np.zeros(4096, np.float32)
    sd["classifier.6.weight"] = np.broadcast_to(np.float32(0), (1000, 4096))  # the ImageNet head: not a tap
    w = vgg16.from_torchvision(sd)
    taps = backbones.tap_list(w, "post_relu")
    assert [t["name"] for t in taps][-3:] == ["block5_conv3", "fc6", "fc7"]
    assert sum(t["channels"] for t in taps) == 12416
    assert sum(t["channels"] for t in taps[:13]) == 4224
    assert w.color_order == "RGB"


def test_torchvision_loader_runs_a_small_network(tmp_path):
    # a torchvision-layout state dict of a narrow VGG: the loader's key mapping feeds the same builder
    ref = vgg16.random_vgg(SMALL, seed=6, fc=8)
    w = vgg16.from_torchvision(torchvision_layout(ref))
    w.blocks = SMALL
    x = np.random.default_rng(2).normal(0, 1, (1, 3, 224, 224)).astype(np.float32)
    p = tmp_path / "tv.onnx"
    backbones.save(vgg16.build_graph(w, "post_relu"), p)
    np.testing.assert_allclose(features.session(p).run(None, {"images": x})[0],
                               torch_reference(ref, x, "post_relu"), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("tap_point", ["both", "post_relu"])
def test_the_pytorch_network_gives_the_onnx_graphs_features(tmp_path, tap_point):
    from jointspace_train.vision import pytorch

    w = vgg16.random_vgg(SMALL, seed=5, fc=7)
    path = tmp_path / "g.onnx"
    backbones.save(vgg16.build_graph(w, tap_point), path)
    x = np.random.default_rng(1).normal(0, 50, (3, 3, 224, 224)).astype(np.float32)
    want = features.session(path).run(None, {"images": x})[0]
    got = pytorch.runner(w, tap_point, "cpu")(x)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    # a different network is told apart: the comparison above can fail
    other = pytorch.runner(vgg16.random_vgg(SMALL, seed=6, fc=7), tap_point, "cpu")(x)
    assert np.abs(other - want).max() > 1e-2 * np.abs(want).max()


def test_the_bfloat16_network_is_close_to_the_graph_but_not_equal(tmp_path):
    from jointspace_train.vision import pytorch

    w = vgg16.random_vgg(SMALL, seed=5)
    path = tmp_path / "g.onnx"
    backbones.save(vgg16.build_graph(w, "both"), path)
    x = np.random.default_rng(1).normal(0, 50, (3, 3, 224, 224)).astype(np.float32)
    want = features.session(path).run(None, {"images": x})[0]
    got = pytorch.runner(w, "both", "cpu", bf16=True)(x)
    assert got.dtype == np.float32 and got.shape == want.shape
    rel = np.linalg.norm(got - want) / np.linalg.norm(want)
    # bfloat16 keeps 8 bits of mantissa: close to the graph, yet not the graph's float32 features
    assert 1e-5 < rel < 2e-2


def _one_node_graph(path, op: str) -> None:
    """A graph of one node: Relu (float) or QuantizeLinear (what an int8 graph starts its products with)."""
    from onnx import TensorProto, helper

    inputs = ["x", "s", "z"] if op == "QuantizeLinear" else ["x"]
    out = TensorProto.UINT8 if op == "QuantizeLinear" else TensorProto.FLOAT
    inits = [helper.make_tensor("s", TensorProto.FLOAT, [], [1.0]), helper.make_tensor("z", TensorProto.UINT8, [], [0])]
    g = helper.make_graph([helper.make_node(op, inputs, ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", out, [2])], inits if op == "QuantizeLinear" else [])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_bfloat16_and_integer_features_are_cached_apart(tmp_path):
    g, q = tmp_path / "g.onnx", tmp_path / "q.onnx"
    _one_node_graph(g, "Relu")
    _one_node_graph(q, "QuantizeLinear")
    exact = features.cache_dir(g, ["a.jpg"], "ten", tmp_path)
    approx = features.cache_dir(g, ["a.jpg"], "ten", tmp_path, tag="bf16")
    assert exact != approx and exact.name.replace("-ten-", "-ten-bf16-") == approx.name
    # An int8 graph's features come from a product that does not saturate, apart from any made on one that did.
    assert "-ten-precise-" in features.cache_dir(q, ["a.jpg"], "ten", tmp_path).name


def windowed_reference(w: vgg16.VggWeights, x: np.ndarray, side: int, crop: int) -> np.ndarray:
    """The five crops' spatial means of each post-ReLU map of the whole image, cut window by window."""
    h = torch.from_numpy(x)
    outs, stride = [], 1
    ends = set(np.cumsum([len(b) for b in w.blocks]) - 1)
    c = (side - crop) // 2
    origins = [(0, 0), (0, side - crop), (side - crop, 0), (side - crop, side - crop), (c, c)]
    for i, (_, wt, b) in enumerate(w.convs):
        h = F.relu(F.conv2d(h, torch.from_numpy(wt), torch.from_numpy(b), padding=1))
        n = crop // stride
        means = [h[:, :, y // stride : y // stride + n, x // stride : x // stride + n].mean(dim=(2, 3))
                 for y, x in origins]
        outs.append(torch.stack(means).mean(dim=0))
        if i in ends:
            h = F.max_pool2d(h, 2)
            stride *= 2
    return torch.cat(outs, 1).numpy()


def test_windowed_graph_averages_the_five_crop_windows(tmp_path):
    w = vgg16.random_vgg(SMALL, seed=7)
    path = tmp_path / "w.onnx"
    backbones.save(vgg16.build_graph(w, "post_relu", windowed_from=256), path)
    x = np.random.default_rng(1).normal(0, 50, (2, 3, 256, 256)).astype(np.float32)
    got = features.session(path).run(None, {"images": x})[0]
    np.testing.assert_allclose(got, windowed_reference(w, x, 256, 224), rtol=1e-4, atol=1e-4)
    # Not the plain mean over the whole map: the windows weigh the centre more.
    whole = torch_reference(w, x, "post_relu")
    assert np.abs(got - whole).max() > 1e-3


def test_windowed_needs_strides_that_divide_the_crop_offsets():
    assert backbones.window_weights(256, 16, 224).sum() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="not a multiple of the stride"):
        backbones.window_weights(250, 16, 224)
    with pytest.raises(ValueError, match="convolutions only"):
        vgg16.build_graph(vgg16.random_vgg(SMALL, seed=1, fc=4), "post_relu", windowed_from=256)


def test_precise_path_only_without_vnni(monkeypatch):
    # The server asks for onnxruntime's precise uint8 x int8 path only where the CPU has no VNNI; so does the trainer.
    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    assert features.has_vnni("flags\t: fpu sse2 avx2 avx512f avx512_vnni\n")
    assert features.has_vnni("flags\t: fpu sse2 avx2 avx_vnni\n")
    assert not features.has_vnni("flags\t: fpu sse2 avx2 fma f16c\n")
    monkeypatch.setattr("platform.machine", lambda: "aarch64")
    assert features.has_vnni("flags\t: fp asimd\n")
