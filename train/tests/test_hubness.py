import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import save_file

from jointspace_train.bundle import contract, hubness, pipeline
from jointspace_train.evaluation import retrieval


def unit(rows):
    rows = np.asarray(rows, np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_the_int8_bank_is_within_half_a_step_of_each_row():
    bank = unit(np.random.default_rng(0).normal(size=(50, 32)))
    q, scales = hubness.quantize(bank)
    assert q.dtype == np.int8 and scales.dtype == np.float32 and np.abs(q).max() == 127
    back = hubness.dequantize(q, scales)
    assert np.all(np.abs(back - bank) <= scales[:, None] / 2 + 1e-7)
    assert np.abs(back - bank).max() > 0, "rounding happened: the test would not see a missing scale"


def test_offsets_are_hub_bias_in_chunks():
    rng = np.random.default_rng(1)
    images, bank = unit(rng.normal(size=(37, 16))), unit(rng.normal(size=(20, 16)))
    want = retrieval.hub_bias(images @ bank.T, 3, 0.5)
    np.testing.assert_allclose(hubness.offsets(images, bank, 3, 0.5, chunk=8), want, rtol=1e-6)
    assert hubness.offsets(images[:0], bank, 3, 0.5).shape == (0,)


def test_choose_draws_a_sorted_subset_by_seed_or_everything():
    caps = [f"c{i}" for i in range(100)]
    a, b = hubness.choose(caps, 10, 0), hubness.choose(caps, 10, 0)
    assert a == b and len(set(a)) == 10 and a == sorted(a, key=caps.index)
    assert hubness.choose(caps, 10, 1) != a
    assert hubness.choose(caps, 500, 0) == caps


@pytest.mark.parametrize("k, alpha", [(0, 0.5), (7, 0.5), (2, -0.1), (2, float("nan"))])
def test_section_refuses_k_outside_the_bank_and_a_bad_alpha(k, alpha):
    with pytest.raises(ValueError):
        hubness.section(6, k, alpha, 0, "")


CAPTIONS = ["a red circle", "a dog on the beach", "two stripes", "a cat", "a park", "a sofa"]


@pytest.fixture
def fixture_copy(repo, tmp_path):
    """The fixture bundle with a bank of six captions (k 2, alpha 0.5), written as `hubness` writes one."""
    d = tmp_path / "b"
    shutil.copytree(repo / "models" / "fixture-tiny", d)
    hubness.write(d / hubness.FILE, pipeline.Pipeline(d).embed_texts(CAPTIONS))
    rewrite(d, lambda m: m.update(hubness=hubness.section(6, 2, 0.5, 0, "test captions")))
    return d


def rewrite(d, edit):
    m = json.loads((d / "bundle.json").read_text())
    edit(m)
    contract.finish(d, {k: v for k, v in m.items() if k != "files"})


def test_the_fixture_bank_is_read_and_offsets_its_search_scores(fixture_copy):
    b = contract.read(fixture_copy)
    assert b.hubness.shape == (6, 16) and "hubness.safetensors" in b.manifest["files"]
    p = pipeline.Pipeline(fixture_copy)
    images = unit(np.random.default_rng(2).normal(size=(3, 16)))
    captions = p.embed_texts(["a red circle", "a dog"])
    off = p.offsets(images)
    np.testing.assert_allclose(off, retrieval.hub_bias(images @ b.hubness.T, 2, 0.5), rtol=1e-6)
    np.testing.assert_allclose(p.scores(images, captions), images @ captions.T + off[:, None], rtol=1e-6)
    # without the section, the offset is zero
    rewrite(fixture_copy, lambda m: m.pop("hubness"))
    assert not pipeline.Pipeline(fixture_copy).offsets(images).any()


def test_a_bad_hubness_section_is_a_load_error_naming_what_is_wrong(fixture_copy):
    rewrite(fixture_copy, lambda m: m["hubness"].update(k=7))
    with pytest.raises(contract.BundleError, match="k=7"):
        contract.read(fixture_copy)
    rewrite(fixture_copy, lambda m: m["hubness"].update(k=2, captions=5))
    with pytest.raises(contract.BundleError, match=r"hubness.safetensors: tensor 'vectors' must be int8 \[5, 16\]"):
        contract.read(fixture_copy)
    rewrite(fixture_copy, lambda m: m["hubness"].update(captions=6) or m.update(similarity="order"))
    with pytest.raises(contract.BundleError, match="offsets cosine scores"):
        contract.read(fixture_copy)


@pytest.mark.parametrize("k, alpha", [(0, 0.5), (6, 0.5), (2, -0.1), (2, float("inf"))])
def test_the_annotation_section_refuses_k_outside_its_images_and_a_bad_alpha(k, alpha):
    with pytest.raises(ValueError, match="images" if k in (0, 6) else "alpha"):
        hubness.annotation(5, k, alpha, "")


def test_the_section_carries_the_annotation_side_only_when_given():
    an = hubness.annotation(5, 2, 0.5, "five images")
    assert an == {"bank": "hubness-images.safetensors", "images": 5, "k": 2, "alpha": 0.5, "source": "five images"}
    assert hubness.section(6, 2, 0.5, 0, "", annotation=an)["annotation"] == an
    assert "annotation" not in hubness.section(6, 2, 0.5, 0, "")


def basis(*weights):
    """A unit vector of the fixture's joint space (16) with these leading coordinates."""
    v = np.zeros(16, np.float32)
    v[: len(weights)] = weights
    return v / np.linalg.norm(v)


# Five images near axis 0: a caption along axis 0 is their hub, one along axis 1 is not.
IMAGE_BANK = np.stack([basis(1, 0, 0, 0, *([0] * k), 0.1) for k in range(5)])


@pytest.fixture
def annotated_copy(fixture_copy):
    """fixture_copy with the annotation side: a bank of five images (k 2, alpha 0.5), as `hubness` writes it."""
    hubness.write(fixture_copy / hubness.IMAGES_FILE, IMAGE_BANK)
    rewrite(fixture_copy, lambda m: m["hubness"].update(annotation=hubness.annotation(5, 2, 0.5, "test images")))
    return fixture_copy


def test_the_annotation_bank_is_read_and_offsets_each_captions_column(annotated_copy):
    b = contract.read(annotated_copy)
    assert b.hubness_images.shape == (5, 16) and "hubness-images.safetensors" in b.manifest["files"]
    np.testing.assert_allclose(b.hubness_images, IMAGE_BANK, atol=1 / 127)
    p = pipeline.Pipeline(annotated_copy)
    captions = np.concatenate([p.embed_texts(["a red circle", "a dog"]), np.stack([basis(1), basis(0, 1)])])
    off = p.caption_offsets(captions)
    np.testing.assert_allclose(off, retrieval.hub_bias(captions @ b.hubness_images.T, 2, 0.5), rtol=1e-6)
    assert off[2] < -0.49 and abs(off[3]) < 1e-6, "the hub caption is demoted, the other is not"
    images = unit(np.random.default_rng(3).normal(size=(3, 16)))
    np.testing.assert_allclose(p.scores(images, captions),
                               images @ captions.T + p.offsets(images)[:, None] + off[None, :], rtol=1e-6)
    # without the annotation side, the captions' offsets are zero and the file is no longer named
    rewrite(annotated_copy, lambda m: m["hubness"].pop("annotation"))
    p = pipeline.Pipeline(annotated_copy)
    assert p.bundle.hubness_images is None and "hubness-images.safetensors" not in p.m["files"]
    assert not p.caption_offsets(captions).any()


def test_caption_offsets_move_an_image_querys_ranking_of_captions_and_no_captions_ranking_of_images(
        annotated_copy):
    p = pipeline.Pipeline(annotated_copy)
    captions = np.stack([basis(1), basis(0, 1), basis(0, 0, 1)])  # the hub, then two that are not
    images = np.stack([basis(0.6, 0.5, 0.1), basis(0.2, 0.3, 0.9), basis(0.5, 0.1, 0.4)])
    plain = images @ captions.T + p.offsets(images)[:, None]  # what the bundle gave without the annotation side
    s = p.scores(images, captions)
    assert plain[0].argmax() == 0 and s[0].argmax() == 1, "image 0's best caption was the hub, and is not now"
    # each caption query (a column) ranks the images as before: its offset moved the whole column
    np.testing.assert_array_equal(np.argsort(-s, axis=0), np.argsort(-plain, axis=0))
    assert (np.argsort(-s, axis=1) != np.argsort(-plain, axis=1)).any()


def test_a_bad_annotation_section_is_a_load_error_naming_what_is_wrong(annotated_copy):
    rewrite(annotated_copy, lambda m: m["hubness"]["annotation"].update(k=6))
    with pytest.raises(contract.BundleError, match="k=6 must be between 1 and the bank's 5 images"):
        contract.read(annotated_copy)
    rewrite(annotated_copy, lambda m: m["hubness"]["annotation"].update(k=2, images=4))
    with pytest.raises(contract.BundleError,
                       match=r"hubness-images.safetensors: tensor 'vectors' must be int8 \[4, 16\]"):
        contract.read(annotated_copy)
    rewrite(annotated_copy, lambda m: m["hubness"]["annotation"].pop("images"))
    with pytest.raises(contract.BundleError, match="hubness.annotation needs bank, images, k and alpha"):
        contract.read(annotated_copy)
    rewrite(annotated_copy, lambda m: m["hubness"]["annotation"].update(images=5))
    assert contract.read(annotated_copy).hubness_images.shape == (5, 16)
    # a bank without its sha256 in files is refused (finish names it; a hand-edited manifest may not)
    m = json.loads((annotated_copy / "bundle.json").read_text())
    del m["files"]["hubness-images.safetensors"]
    (annotated_copy / "bundle.json").write_text(json.dumps(m))
    with pytest.raises(contract.BundleError,
                       match="hubness.annotation.bank 'hubness-images.safetensors' has no sha256 in files"):
        contract.read(annotated_copy)
    # scales that are not finite
    q, scales = hubness.quantize(IMAGE_BANK)
    scales[3] = np.nan
    save_file({"vectors": q, "scales": scales}, str(annotated_copy / hubness.IMAGES_FILE))
    rewrite(annotated_copy, lambda m: None)
    with pytest.raises(contract.BundleError, match=r"hubness-images.safetensors: tensor 'scales' must be finite"):
        contract.read(annotated_copy)


@pytest.mark.parametrize("name", ["fixture-tiny", "fixture-tiny-windowed", "fixture-tiny-effnet"])
def test_the_committed_fixtures_bank_their_own_images_and_parity_has_each_sentences_offset(repo, name, monkeypatch):
    """What the server's parity tests read: a bank of the fixture's own images through its own files (k 2, alpha
    0.5), and each parity sentence's caption offset."""
    from jointspace_train.bundle import fixture

    monkeypatch.chdir(repo)  # parity.json's images_dir is relative to the repository
    d = repo / "models" / name
    p = pipeline.Pipeline(d)
    an = p.m["hubness"]["annotation"]
    assert {k: an[k] for k in ("bank", "images", "k", "alpha")} == \
        {"bank": "hubness-images.safetensors", "images": 8, "k": 2, "alpha": 0.5}
    _, vecs = p.embed_images(fixture.parity_images(d))
    scales = hubness.quantize(vecs)[1]
    assert np.all(np.abs(p.bundle.hubness_images - vecs) <= scales[:, None] / 2 + 1e-6)
    parity = json.loads((d / "parity.json").read_text())
    if name == "fixture-tiny-windowed":
        assert parity["texts"] == []
        return
    texts = [t["text"] for t in parity["texts"]]
    assert len(texts) == 4 and all("offset" in t for t in parity["texts"])
    want = p.caption_offsets(p.embed_texts(texts))
    assert np.all(want < 0)
    np.testing.assert_allclose([t["offset"] for t in parity["texts"]], want, atol=1e-6)


def test_add_annotation_gives_a_fixture_its_image_bank_and_only_adds_the_sentences_offsets(repo, tmp_path,
                                                                                        monkeypatch):
    from jointspace_train.bundle import fixture

    monkeypatch.chdir(repo)
    src, d = repo / "models" / "fixture-tiny", tmp_path / "b"
    shutil.copytree(src, d)
    (d / hubness.IMAGES_FILE).unlink()
    rewrite(d, lambda m: m["hubness"].pop("annotation"))
    before = json.loads((src / "parity.json").read_text())
    stripped = json.loads(json.dumps(before))
    for t in stripped["texts"]:
        del t["offset"]
    (d / "parity.json").write_text(json.dumps(stripped, indent=1) + "\n")
    after = fixture.add_annotation(d)
    assert [t.pop("offset") for t in after["texts"]] == pytest.approx([t["offset"] for t in before["texts"]],
                                                                      abs=1e-6)
    assert after == stripped, "only the sentences' offsets were added"
    m, committed = json.loads((d / "bundle.json").read_text()), json.loads((src / "bundle.json").read_text())
    assert m["hubness"] == committed["hubness"]
    for name, digest in committed["files"].items():
        if name != hubness.IMAGES_FILE:
            assert m["files"][name] == digest, name
    assert contract.read(d).hubness_images.shape == (8, 16)
    # a parity sentence that the bundle does not compute is refused, not given an offset
    stripped["texts"][0]["vector"][0] += 0.01
    (d / "parity.json").write_text(json.dumps(stripped, indent=1) + "\n")
    with pytest.raises(ValueError, match="'a red circle' is not what the bundle computes"):
        fixture.add_annotation(d)
