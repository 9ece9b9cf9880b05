"""The closed-form methods (training/closed_form.py), their caption features (text/caption_features.py) and text graph
(text/feature_graph.py)."""
import json
import shutil

import numpy as np
import onnxruntime as ort
import pytest
from safetensors.numpy import load_file, save_file

from jointspace_train.bundle import contract, pipeline
from jointspace_train.text import caption_features, feature_graph, tokenizer
from jointspace_train.training import closed_form


def pairs(seed=0, n_img=400, dx=6, dy=5):
    """Images with two captions each; the first two latent factors shared by both views."""
    r = np.random.default_rng(seed)
    z = r.normal(size=(n_img, 2))
    x = np.hstack([z, r.normal(size=(n_img, dx - 2))]) @ r.normal(size=(dx, dx))
    owner = np.repeat(np.arange(n_img), 2)
    zc = z[owner] + 0.3 * r.normal(size=(len(owner), 2))
    y = np.hstack([zc, r.normal(size=(len(owner), dy - 2))]) @ r.normal(size=(dy, dy))
    return x, y, owner


def test_cca_of_one_dimensional_views_is_their_correlation():
    r = np.random.default_rng(3)
    x = r.normal(size=(50, 1))
    y = 0.6 * x + r.normal(size=(50, 1))
    c = closed_form.fit_cca(x, y, np.arange(50), 0.0, 0.0)
    assert c.corr[0] == pytest.approx(abs(np.corrcoef(x[:, 0], y[:, 0])[0, 1]), abs=1e-9)


def test_cca_whitens_each_view_and_sorts_correlations():
    x, y, owner = pairs()
    c = closed_form.fit_cca(x, y, owner, 0.0, 0.0)
    xp = c.image(x)[owner]  # over the pairs, as the fit counts them
    yp = c.text(y)
    np.testing.assert_allclose(np.cov(xp, rowvar=False, bias=True), np.eye(xp.shape[1]), atol=1e-8)
    np.testing.assert_allclose(np.cov(yp, rowvar=False, bias=True), np.eye(yp.shape[1]), atol=1e-8)
    # the k-th pair of directions is correlated by corr[k], different pairs not at all
    np.testing.assert_allclose(xp.T @ yp / len(owner), np.diag(c.corr), atol=1e-8)
    assert np.all(np.diff(c.corr) <= 0) and np.all((c.corr >= 0) & (c.corr <= 1))
    assert c.corr[0] > 0.9 and c.corr[2] < 0.2  # two shared factors, the rest noise


def test_normalized_cca_scales_columns_by_correlation_powers():
    x, y, owner = pairs()
    c = closed_form.fit_cca(x, y, owner, 0.1, 0.1)
    img, txt = c.top(3, 4.0)
    np.testing.assert_allclose(img.w, c.image.w[:, :3] * c.corr[:3] ** 4)
    np.testing.assert_allclose(txt.w, c.text.w[:, :3] * c.corr[:3] ** 4)
    plain, _ = c.top(3)
    np.testing.assert_allclose(plain.w, c.image.w[:, :3])


def test_ridge_without_penalty_is_least_squares():
    x, y, owner = pairs()
    r = closed_form.fit_ridge(y, x, owner, 0.0)
    design = np.hstack([y, np.ones((len(y), 1))])
    coef, *_ = np.linalg.lstsq(design, x[owner], rcond=None)
    np.testing.assert_allclose(r(y), design @ coef, atol=1e-9)
    shrunk = closed_form.fit_ridge(y, x, owner, 10.0)
    assert np.linalg.norm(shrunk.a) < np.linalg.norm(r.a)


def test_neg_sqdist_and_cosine():
    a = np.array([[1.0, 0.0], [0.0, 2.0]])
    b = np.array([[1.0, 1.0], [0.0, 0.0]])
    np.testing.assert_allclose(closed_form.neg_sqdist(a, b), [[-1.0, -1.0], [-2.0, -4.0]])
    np.testing.assert_allclose(closed_form.cosine(a, b), [[np.sqrt(0.5), 0.0], [np.sqrt(0.5), 0.0]])


@pytest.fixture
def tok():
    return tokenizer.build(["a dog runs on the grass .", "a dog and a dog", "the cat sleeps", "red car"])


def test_tfidf_is_the_l2_normalised_weighted_bag(tok):
    ids, lengths = caption_features.encode(tok, ["a dog runs on the grass .", "a dog and a dog", "the cat sleeps",
                                         "red car"], 64)
    term = caption_features.tfidf_term(tok, ids, lengths, 5)
    dictionary = caption_features.word_ids(tok)[:5]
    assert all(tok.id_to_token(i).isalnum() for i in dictionary)
    ids2, len2 = caption_features.encode(tok, ["dog dog a ."], 64)
    f = caption_features.features(term, ids2, len2)[0]
    dog, a = tok.token_to_id("dog"), tok.token_to_id("a")
    bag = np.zeros(len(dictionary))
    idf = {w: np.log(4 / df) for w, df in (("dog", 2), ("a", 2))}
    bag[dictionary.index(dog)] = 2 * idf["dog"]
    bag[dictionary.index(a)] = idf["a"]
    np.testing.assert_allclose(f, bag / np.linalg.norm(bag), rtol=1e-6)


def test_text_graph_computes_the_trainers_features(tok, tmp_path):
    r = np.random.default_rng(0)
    v = tok.get_vocab_size()
    ids, lengths = caption_features.encode(tok, ["a dog runs on the grass .", "a dog and a dog", "the cat sleeps"], 64)
    tfidf = caption_features.tfidf_term(tok, ids, lengths, 6)
    vectors = r.normal(size=(v, 4)).astype(np.float32)
    found = r.random(v) > 0.3
    glove = caption_features.glove_term(vectors, found)
    tags = caption_features.tag_term(v, caption_features.tag_words(tok, ids, lengths, 3))
    blocks = [feature_graph.Mapped(tfidf, r.normal(size=(6, 3))),      # folded into [V, 3] rows
              feature_graph.Mapped(glove, r.normal(size=(4, 3))),      # kept as a product: [V, 4] then [4, 3]
              feature_graph.Mapped(tags, r.normal(size=(3, 3)))]
    bias = r.normal(size=3)
    queries = ["a dog and a red car", "cat", "zebra", "the the grass grass dog ."]
    qi, ql = caption_features.encode(tok, queries, 64)
    for normalise in (False, True):
        path = tmp_path / f"text{normalise}.onnx"
        feature_graph.build(blocks, bias, normalise, path)
        got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
            None, {"ids": qi, "lengths": ql})[0]
        np.testing.assert_allclose(got, feature_graph.embed(blocks, bias, normalise, qi, ql), atol=1e-5)
        # padded in a batch or alone: the same vector
        for k, q in enumerate(queries):
            one = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
                None, dict(zip(("ids", "lengths"), caption_features.encode(tok, [q], 64))))[0]
            np.testing.assert_allclose(one[0], got[k], atol=1e-6)
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_the_text_graph_carries_only_the_constants_it_uses(tok, tmp_path):
    """An unused initializer makes ONNX Runtime warn at every load of the bundle."""
    import onnx

    ids, lengths = caption_features.encode(tok, ["a dog runs on the grass ."], 64)
    term = caption_features.tfidf_term(tok, ids, lengths, 4)
    feature_graph.build([feature_graph.Mapped(term, np.ones((4, 2)))], np.zeros(2), True, tmp_path / "t.onnx")
    g = onnx.load(str(tmp_path / "t.onnx")).graph
    assert {t.name for t in g.initializer} <= {i for n in g.node for i in n.input}


def test_an_affine_euclidean_bundle_round_trips(repo, tmp_path):
    """A projection bias and `similarity: euclidean` (the closed-form bundles): read back, the image vector is
    W . code + bias as it is, and scores are -||c - i||^2."""
    d = tmp_path / "b"
    shutil.copytree(repo / "models" / "fixture-tiny", d)
    w = load_file(str(d / "projection.safetensors"))["weight"]
    bias = np.linspace(-1, 1, w.shape[0]).astype(np.float32)
    contract.write_projection(d / "projection.safetensors", w, w.dtype, bias)
    m = json.loads((d / "bundle.json").read_text())
    m.pop("hubness")
    m["files"].pop("hubness.safetensors")
    m["similarity"] = "euclidean"
    contract.finish(d, {k: v for k, v in m.items() if k != "files"})
    p = pipeline.Pipeline(d)
    np.testing.assert_array_equal(p.bundle.bias, bias)
    codes = np.array([[1, 0, -1] * (w.shape[1] // 3) + [0] * (w.shape[1] % 3)], np.int8)
    np.testing.assert_allclose(p.project(codes)[0], codes[0].astype(np.float32) @ w.astype(np.float32).T + bias,
                               rtol=1e-6)
    caps = p.embed_texts(["a dog"])
    np.testing.assert_allclose(p.scores(p.project(codes), caps),
                               -((p.project(codes)[:, None, :] - caps[None]) ** 2).sum(-1), rtol=1e-5)
    save_file({"weight": w, "bias": bias[:-1]}, str(d / "projection.safetensors"))
    contract.finish(d, {k: v for k, v in json.loads((d / "bundle.json").read_text()).items() if k != "files"})
    with pytest.raises(contract.BundleError, match="'bias' must be"):
        contract.read(d)
