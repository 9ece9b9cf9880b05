import json
import os
import shutil
import stat

import numpy as np
import pytest

from jointspace_train.bundle import contract, pipeline


def _copy(repo, tmp_path, name: str):
    d = tmp_path / name
    shutil.copytree(repo / "models" / name, d)
    return d


@pytest.fixture
def fixture_copy(repo, tmp_path):
    return _copy(repo, tmp_path, "fixture-tiny")


def test_round_trip(fixture_copy):
    b = contract.read(fixture_copy)
    m = b.manifest
    assert m["format"] == 1 and set(m["files"]) == {"vision.onnx", "fne.safetensors", "projection.safetensors",
                                                    "text.onnx", "tokenizer.json", "hubness.safetensors",
                                                    "hubness-images.safetensors"}
    assert b.hubness.shape == (6, 16) and b.hubness_images.shape == (8, 16)
    assert b.fne_mean.shape == (m["fne"]["dim"],) and b.projection.shape == (16, m["fne"]["dim"])
    # rewriting the manifest from the same files gives the same checksums
    again = contract.finish(fixture_copy, {k: v for k, v in m.items() if k != "files"})
    assert again["files"] == m["files"]


@pytest.fixture
def two_copy(repo, tmp_path):
    return _copy(repo, tmp_path, "fixture-tiny-two")


def test_two_backbones_round_trip(two_copy):
    b = contract.read(two_copy)
    m = b.manifest
    assert [(v["crop_mode"], f["dim"]) for v, f in contract.backbones(m)] == [("ten", 144), ("windowed", 248)]
    assert contract.code_dim(m) == 392 and b.projection.shape == (16, 392)
    assert [(x.mean.shape, x.std.shape) for x in b.backbones] == [((144,), (144,)), ((248,), (248,))]
    assert b.fne_mean is b.backbones[0].mean
    assert {"vision-effnet.onnx", "fne-effnet.safetensors"} <= set(m["files"])
    # rewriting the manifest from the same files gives the same checksums, the extra backbone's included
    again = contract.finish(two_copy, {k: v for k, v in m.items() if k != "files"})
    assert again["files"] == m["files"]
    assert contract.read(two_copy).manifest["extra_backbones"] == m["extra_backbones"]


def _edit(directory, change) -> None:
    m = json.loads((directory / "bundle.json").read_text())
    change(m)
    (directory / "bundle.json").write_text(json.dumps(m))


def test_a_bad_extra_backbone_is_refused_naming_its_file(repo, two_copy):
    # the first backbone's statistics (144) where the second's (248) are due, under a matching checksum
    shutil.copyfile(two_copy / "fne.safetensors", two_copy / "fne-effnet.safetensors")
    m = {k: v for k, v in json.loads((two_copy / "bundle.json").read_text()).items() if k != "files"}
    contract.finish(two_copy, m)
    with pytest.raises(contract.BundleError, match=r"fne-effnet.safetensors: tensor 'mean' must be float32 \[248\]"):
        contract.read(two_copy)
    shutil.copyfile(repo / "models/fixture-tiny-two/fne-effnet.safetensors", two_copy / "fne-effnet.safetensors")
    contract.finish(two_copy, m)
    contract.read(two_copy)

    def unlisted(m):
        del m["files"]["vision-effnet.onnx"]

    _edit(two_copy, unlisted)
    with pytest.raises(contract.BundleError, match="vision-effnet.onnx .* has no sha256 in files"):
        contract.read(two_copy)
    contract.finish(two_copy, m)
    _edit(two_copy, lambda m: m["extra_backbones"][0]["fne"].update(dim=200))
    with pytest.raises(contract.BundleError, match=r"extra_backbones\[0\].fne.dim 200 != extra_backbones\[0\]"):
        contract.read(two_copy)


def test_two_backbones_take_only_a_crop_mode_they_share(repo):
    p = pipeline.Pipeline(repo / "models" / "fixture-tiny-two")
    assert p.crop_modes() == ["ten", "windowed"]
    with pytest.raises(ValueError, match="their own modes"):
        p.crop_modes("ten")


def test_checksum_failure_names_the_file(fixture_copy):
    p = fixture_copy / "projection.safetensors"
    data = bytearray(p.read_bytes())
    data[-1] ^= 1
    p.write_bytes(bytes(data))
    with pytest.raises(contract.BundleError, match="projection.safetensors: sha256"):
        contract.read(fixture_copy)


def test_missing_file_and_bad_shape(fixture_copy):
    (fixture_copy / "text.onnx").unlink()
    with pytest.raises(contract.BundleError, match="text.onnx: missing"):
        contract.read(fixture_copy)


def test_manifest_shape_disagreement(fixture_copy):
    m = json.loads((fixture_copy / "bundle.json").read_text())
    m["projection"]["joint_dim"] = 32
    (fixture_copy / "bundle.json").write_text(json.dumps(m))
    with pytest.raises(contract.BundleError, match="expected"):
        contract.read(fixture_copy)


@pytest.mark.parametrize("name", ["fixture-tiny", "fixture-tiny-order", "fixture-tiny-two"])
def test_fixture_parity_file_is_what_the_trainer_computes(repo, name):
    """parity.json is what the server is checked against; it must not drift from the trainer's code."""
    import base64

    from jointspace_train.vision import fne

    parity = json.loads((repo / "models" / name / "parity.json").read_text())
    p = pipeline.Pipeline(repo / "models" / name)
    for case in parity["images"]:
        # "ten+windowed": each backbone in its own crop mode
        mode = None if "+" in case["crop_mode"] else case["crop_mode"]
        codes, vecs = p.embed_images([repo / parity["images_dir"] / case["image"]], mode)
        assert "+".join(p.crop_modes(mode)) == case["crop_mode"]
        assert base64.b64decode(case["code"]) == fne.pack(codes[0]).tobytes(), case["image"]
        np.testing.assert_allclose(vecs[0], case["vector"], atol=1e-6)
        np.testing.assert_allclose(p.offsets(vecs), [case["offset"]], atol=1e-6)
    texts = p.embed_texts([t["text"] for t in parity["texts"]])
    np.testing.assert_allclose(texts, [t["vector"] for t in parity["texts"]], atol=1e-6)
    if p.m["similarity"] == "order":
        # |unit vectors| on both sides, and S(c, i) = -||max(0, c - i)||^2 of every sentence and image.
        assert (texts >= 0).all() and np.allclose(np.linalg.norm(texts, axis=1), 1, atol=1e-6)
        s = parity["order_scores"]
        _, images = p.embed_images([repo / parity["images_dir"] / n for n in s["images"]])
        want = -np.square(np.maximum(0, texts[None, :, :] - images[:, None, :])).sum(-1)
        np.testing.assert_allclose(s["scores"], want, atol=1e-6)
        assert s["texts"] == [t["text"] for t in parity["texts"]]


def test_weight_files_are_readable_by_other_users(tmp_path):
    # The server in the container runs as another user than the trainer; safetensors alone writes 0600.
    old = os.umask(0o022)
    try:
        contract.write_fne(tmp_path / "fne.safetensors", np.zeros(4), np.ones(4))
        contract.write_projection(tmp_path / "projection.safetensors", np.zeros((2, 4)))
    finally:
        os.umask(old)
    for name in ("fne.safetensors", "projection.safetensors"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644, name


def test_preparation_is_checked_and_recorded(fixture_copy):
    m = contract.read(fixture_copy).manifest
    assert m["vision"]["prepare"] == {"resize": [224, 224], "filter": "bilinear"}
    for bad in ({"resize": [224], "filter": "bilinear"}, {"resize": [0, 224], "filter": "bilinear"},
                {"resize": [224, 224], "filter": "lanczos"}, {"resize": [224, 224]},
                {"resize": [224, 224], "filter": "bilinear", "extra": 1},
                {"resize": [True, 224], "filter": "bilinear"}):
        manifest = {k: v for k, v in m.items() if k != "files"}
        manifest["vision"] = {**m["vision"], "prepare": bad}
        contract.finish(fixture_copy, manifest)
        with pytest.raises(contract.BundleError, match="vision.prepare must be"):
            contract.read(fixture_copy)
    # Without the section there is no preparation, as in bundles written before it existed.
    manifest = {k: v for k, v in m.items() if k != "files"}
    manifest["vision"] = {k: v for k, v in m["vision"].items() if k != "prepare"}
    contract.finish(fixture_copy, manifest)
    assert "prepare" not in contract.read(fixture_copy).vision
