import json
import shutil

import numpy as np
import pytest

from jointspace_train import bundle, evaluate, hubness, pipeline


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
    want = evaluate.hub_bias(images @ bank.T, 3, 0.5)
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
    bundle.finish(d, {k: v for k, v in m.items() if k != "files"})


def test_the_fixture_bank_is_read_and_offsets_its_search_scores(fixture_copy):
    b = bundle.read(fixture_copy)
    assert b.hubness.shape == (6, 16) and "hubness.safetensors" in b.manifest["files"]
    p = pipeline.Pipeline(fixture_copy)
    images = unit(np.random.default_rng(2).normal(size=(3, 16)))
    captions = p.embed_texts(["a red circle", "a dog"])
    off = p.offsets(images)
    np.testing.assert_allclose(off, evaluate.hub_bias(images @ b.hubness.T, 2, 0.5), rtol=1e-6)
    np.testing.assert_allclose(p.scores(images, captions), images @ captions.T + off[:, None], rtol=1e-6)
    # without the section, the offset is zero
    rewrite(fixture_copy, lambda m: m.pop("hubness"))
    assert not pipeline.Pipeline(fixture_copy).offsets(images).any()


def test_a_bad_hubness_section_is_a_load_error_naming_what_is_wrong(fixture_copy):
    rewrite(fixture_copy, lambda m: m["hubness"].update(k=7))
    with pytest.raises(bundle.BundleError, match="k=7"):
        bundle.read(fixture_copy)
    rewrite(fixture_copy, lambda m: m["hubness"].update(k=2, captions=5))
    with pytest.raises(bundle.BundleError, match=r"hubness.safetensors: tensor 'vectors' must be int8 \[5, 16\]"):
        bundle.read(fixture_copy)
    rewrite(fixture_copy, lambda m: m["hubness"].update(captions=6) or m.update(similarity="order"))
    with pytest.raises(bundle.BundleError, match="offsets cosine scores"):
        bundle.read(fixture_copy)
