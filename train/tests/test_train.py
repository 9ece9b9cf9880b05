import numpy as np
import pytest
import torch

from jointspace_train.text import tokenizer
from jointspace_train.training.loop import Encoded, Settings, ema_update, evaluate_split, train
from jointspace_train.training.model import TextEncoder

WORDS = ["red", "green", "blue", "dog", "cat", "car", "tree", "boat"]


def toy_split(n, rng):
    """Each image code marks one 'word' strongly; its captions mention that word."""
    codes, caps = [], []
    for i in range(n):
        k = i % len(WORDS)
        c = rng.integers(-1, 2, 64).astype(np.float32) * 0.2
        c[k * 8 : k * 8 + 8] = 1
        codes.append(c)
        caps.append([f"a {WORDS[k]} thing {j}" for j in range(5)])
    return np.stack(codes), caps


def toy(n_train, n_dev, seed):
    """Encoded train and dev splits of the toy task, and the vocabulary size."""
    rng = np.random.default_rng(seed)
    tr, dv = toy_split(n_train, rng), toy_split(n_dev, rng)
    tok = tokenizer.build([c for cs in tr[1] for c in cs])
    return Encoded(tr[0], tr[1], tok, 16), Encoded(dv[0], dv[1], tok, 16), tok.get_vocab_size()


def test_training_learns_a_toy_task():
    enc_tr, enc_dv, vocab = toy(64, 16, 0)
    s = Settings(loss="PH", joint_dim=16, word_dim=8, lr=5e-3, batch_size=16, epochs=12, patience=3, threads=1)
    proj, text, result = train(s, enc_tr, enc_dv, vocab, log=lambda m: None)
    assert result.best_epoch >= 1
    # 8 distinguishable kinds among 16 dev images: chance R@5 for t2i is ~31%
    assert result.dev["t2i_r5"] > 60, result.dev
    assert evaluate_split(proj, text, enc_dv, "cosine") == result.dev


@pytest.mark.parametrize("knobs", [dict(loss="CE", temperature=0.1), dict(loss="PH", gru_layers=2),
                                   dict(loss="PH", rnn="lstm")])
def test_other_losses_and_encoders_learn_the_toy_task(knobs):
    enc_tr, enc_dv, vocab = toy(64, 16, 0)
    s = Settings(joint_dim=16, word_dim=8, lr=5e-3, batch_size=16, epochs=12, patience=3, threads=1, **knobs)
    proj, text, result = train(s, enc_tr, enc_dv, vocab, log=lambda m: None)
    assert text.rnn.num_layers == s.gru_layers and text.kind == s.rnn
    assert result.dev["t2i_r5"] > 60, result.dev


def test_curriculum_from_a_sum_loss_model_starts_in_the_max_phase():
    enc_tr, enc_dv, vocab = toy(32, 8, 1)
    base = dict(joint_dim=8, word_dim=4, lr=5e-3, batch_size=8, patience=2, threads=1)
    proj, text, r_sh = train(Settings(loss="SH", epochs=2, **base), enc_tr, enc_dv, vocab,
                             log=lambda m: None)
    init = {"proj": proj.state_dict(), "text": text.state_dict()}
    _, _, r_ph = train(Settings(loss="PH", epochs=2, **base), enc_tr, enc_dv, vocab,
                       log=lambda m: None, init=init)
    assert [h["phase"] for h in r_sh.history] == ["sum", "sum"]
    assert [h["phase"] for h in r_ph.history] == ["max", "max"]


def with_crops(enc: Encoded, crops: np.ndarray) -> Encoded:
    enc.crops = crops
    return enc


def noisy_crops(enc: Encoded, n: int, seed: int) -> np.ndarray:
    """[N, n, D] crops that differ from each other and from the images' own inputs."""
    rng = np.random.default_rng(seed)
    base = enc.images.numpy()[:, None]
    return (base + rng.normal(0, 0.5, (base.shape[0], n, base.shape[2]))).astype(np.float32)


@pytest.mark.parametrize("augment,ema", [(False, 0.0), (True, 0.0), (False, 0.9)])
def test_an_interrupted_run_resumes_to_the_same_result(tmp_path, augment, ema):
    enc_tr, enc_dv, vocab = toy(32, 8, 2)
    if augment:
        enc_tr = with_crops(enc_tr, noisy_crops(enc_tr, 4, 0))
    base = dict(loss="SH", joint_dim=8, word_dim=4, lr=5e-3, batch_size=8, patience=9, threads=1,
                crop_augment=augment, ema=ema)
    _, _, whole = train(Settings(epochs=4, **base), enc_tr, enc_dv, vocab, log=lambda m: None)
    ck = tmp_path / "checkpoint.pt"
    train(Settings(epochs=2, **base), enc_tr, enc_dv, vocab, log=lambda m: None, checkpoint=ck)
    said = []
    _, _, resumed = train(Settings(epochs=4, **base), enc_tr, enc_dv, vocab, log=said.append,
                          checkpoint=ck)
    assert said[0].startswith("resuming after epoch 2")
    assert [h["epoch"] for h in resumed.history] == [1, 2, 3, 4]
    assert [h["rsum"] for h in resumed.history] == [h["rsum"] for h in whole.history]
    # A run that stopped at its cap goes on under a higher one, and says so in the settings it records.
    assert "epoch cap 2 -> 4" in said and resumed.settings == whole.settings


def test_a_checkpoint_does_not_resume_under_other_settings(tmp_path):
    enc_tr, enc_dv, vocab = toy(32, 8, 2)
    base = dict(loss="SH", joint_dim=8, word_dim=4, batch_size=8, threads=1, epochs=2)
    ck = tmp_path / "checkpoint.pt"
    train(Settings(lr=5e-3, **base), enc_tr, enc_dv, vocab, log=lambda m: None, checkpoint=ck)
    with pytest.raises(ValueError, match=r"other settings \(lr\)"):
        train(Settings(lr=1e-3, **{**base, "epochs": 3}), enc_tr, enc_dv, vocab, log=lambda m: None,
              checkpoint=ck)


def test_a_checkpoint_from_before_a_setting_existed_counts_it_at_its_default(tmp_path):
    enc_tr, enc_dv, vocab = toy(32, 8, 2)
    base = dict(loss="SH", joint_dim=8, word_dim=4, batch_size=8, threads=1, lr=5e-3)
    ck = tmp_path / "checkpoint.pt"
    train(Settings(epochs=1, **base), enc_tr, enc_dv, vocab, log=lambda m: None, checkpoint=ck)
    state = torch.load(ck, weights_only=False)
    del state["state"]["result"]["settings"]["ema"]  # as written before --ema existed
    torch.save(state, ck)
    with pytest.raises(ValueError, match=r"other settings \(ema\)"):
        train(Settings(epochs=2, ema=0.9, **base), enc_tr, enc_dv, vocab, log=lambda m: None, checkpoint=ck)
    said = []
    train(Settings(epochs=2, **base), enc_tr, enc_dv, vocab, log=said.append, checkpoint=ck)
    assert said[0].startswith("resuming after epoch 1")


def test_a_checkpoint_does_not_resume_on_other_features(tmp_path):
    enc_tr, enc_dv, vocab = toy(32, 8, 2)
    s = dict(loss="SH", joint_dim=8, word_dim=4, batch_size=8, threads=1, lr=5e-3)
    ck = tmp_path / "checkpoint.pt"
    center = {"crop": "center", "tap_point": "post_relu"}
    _, _, r = train(Settings(epochs=1, **s), enc_tr, enc_dv, vocab, log=lambda m: None, checkpoint=ck,
                    features=center)
    assert r.features == center
    with pytest.raises(ValueError, match=r"other settings \(crop\)"):
        train(Settings(epochs=2, **s), enc_tr, enc_dv, vocab, log=lambda m: None, checkpoint=ck,
              features={**center, "crop": "ten"})
    said = []
    train(Settings(epochs=2, **s), enc_tr, enc_dv, vocab, log=said.append, checkpoint=ck, features=center)
    assert said[0].startswith("resuming after epoch 1")


@pytest.mark.parametrize("knob", ["input_dropout", "word_dropout"])
def test_dropout_changes_training(knob):
    enc_tr, enc_dv, vocab = toy(32, 8, 3)
    base = dict(loss="SH", joint_dim=8, word_dim=4, lr=5e-3, batch_size=8, epochs=1, threads=1)
    losses_ = [train(Settings(**{knob: p}, **base), enc_tr, enc_dv, vocab,
                     log=lambda m: None)[2].history[0]["loss"] for p in (0.0, 0.0, 0.5)]
    assert losses_[0] == losses_[1]  # deterministic without it
    assert losses_[2] != losses_[0]


def test_word_dropout_is_off_outside_training():
    text = TextEncoder(10, 4, 6, word_dropout=0.5)
    ids, lengths = torch.tensor([[1, 2, 3], [4, 5, 0]]), torch.tensor([3, 2])
    text.train()
    assert not torch.equal(text(ids, lengths), text(ids, lengths))
    text.eval()
    assert torch.equal(text(ids, lengths), text(ids, lengths))
    assert set(text.state_dict()) == set(TextEncoder(10, 4, 6).state_dict())


def test_weight_decay_shrinks_the_projection_only():
    enc_tr, enc_dv, vocab = toy(32, 8, 3)
    base = dict(loss="SH", joint_dim=8, word_dim=4, lr=5e-3, batch_size=8, epochs=2, threads=1)
    plain = train(Settings(**base), enc_tr, enc_dv, vocab, log=lambda m: None)
    decayed = train(Settings(weight_decay=20.0, **base), enc_tr, enc_dv, vocab, log=lambda m: None)

    def norm(run):
        return float(run[0].fc.weight.norm())

    def emb(run):
        return float(run[1].embed.weight.norm())

    assert norm(decayed) < 0.9 * norm(plain)
    # The text encoder's group has no decay: its embedding table keeps its scale.
    assert abs(emb(decayed) - emb(plain)) < 0.05 * emb(plain)


def test_crop_augmentation_trains_on_the_crops():
    enc_tr, enc_dv, vocab = toy(32, 8, 4)
    base = dict(loss="SH", joint_dim=8, word_dim=4, lr=5e-3, batch_size=8, epochs=2, threads=1)
    plain = train(Settings(**base), enc_tr, enc_dv, vocab, log=lambda m: None)[2]
    # Ten copies of each image's own input: whichever crop is drawn, training is the plain run's, so the
    # augmented run must take each image's crops (not another image's) and draw the same captions.
    same = with_crops(toy(32, 8, 4)[0], np.repeat(enc_tr.images.numpy()[:, None], 10, axis=1))
    copied = train(Settings(crop_augment=True, **base), same, enc_dv, vocab, log=lambda m: None)[2]
    assert [h["loss"] for h in copied.history] == [h["loss"] for h in plain.history]
    noisy = with_crops(toy(32, 8, 4)[0], noisy_crops(enc_tr, 10, 1))
    augmented = train(Settings(crop_augment=True, **base), noisy, enc_dv, vocab, log=lambda m: None)[2]
    assert [h["loss"] for h in augmented.history] != [h["loss"] for h in plain.history]


def test_crop_augmentation_without_crops_is_refused():
    enc_tr, enc_dv, vocab = toy(16, 8, 5)
    with pytest.raises(ValueError, match="per-crop"):
        train(Settings(loss="SH", joint_dim=8, word_dim=4, batch_size=8, epochs=1, threads=1, crop_augment=True),
              enc_tr, enc_dv, vocab, log=lambda m: None)
    with pytest.raises(ValueError, match="do not match"):
        Encoded(enc_tr.images.numpy(), [["a"]] * 16, tokenizer.build(["a"]), 4, crops=np.zeros((16, 10, 3)))


def test_ema_update_is_an_exponential_average():
    avg, cur = [torch.tensor([1.0, 2.0]), torch.tensor([[4.0]])], [torch.tensor([3.0, 2.0]), torch.tensor([[0.0]])]
    ema_update(avg, cur, 0.75)
    assert torch.equal(avg[0], torch.tensor([1.5, 2.0])) and torch.equal(avg[1], torch.tensor([[3.0]]))


def test_the_average_is_what_is_kept_and_the_raw_trajectory_is_unchanged():
    enc_tr, enc_dv, vocab = toy(32, 8, 6)
    # patience above the epochs: no plateau, so nothing ever loads the averaged model into the raw one
    base = dict(loss="SH", joint_dim=8, word_dim=4, lr=5e-3, batch_size=8, epochs=4, patience=9, threads=1)
    plain = train(Settings(**base), enc_tr, enc_dv, vocab, log=lambda m: None)[2]
    proj, text, averaged = train(Settings(ema=0.9, **base), enc_tr, enc_dv, vocab, log=lambda m: None)
    assert [h["raw_rsum"] for h in averaged.history] == [h["rsum"] for h in plain.history]
    assert [h["loss"] for h in averaged.history] == [h["loss"] for h in plain.history]
    # the model returned (and exported) is the best averaged one, and it is not the raw one
    assert evaluate_split(proj, text, enc_dv, "cosine") == averaged.dev
    best = averaged.history[averaged.best_epoch - 1]
    assert best["rsum"] == averaged.dev["rsum"]
    assert [h["rsum"] for h in averaged.history] != [h["raw_rsum"] for h in averaged.history]


def test_without_raw_eval_the_run_keeps_the_same_models():
    enc_tr, enc_dv, vocab = toy(32, 8, 6)
    base = dict(loss="PH", joint_dim=8, word_dim=4, lr=5e-3, batch_size=8, epochs=6, patience=1, threads=1, ema=0.9)
    both = train(Settings(**base), enc_tr, enc_dv, vocab, log=lambda m: None)[2]
    kept = train(Settings(**base), enc_tr, enc_dv, vocab, log=lambda m: None, raw_eval=False)[2]
    assert all("raw_rsum" in h for h in both.history) and not any("raw_rsum" in h for h in kept.history)
    strip = [{k: v for k, v in h.items() if not k.startswith("raw_")} for h in both.history]
    assert strip == kept.history and (kept.best_epoch, kept.dev) == (both.best_epoch, both.dev)


def test_bf16_is_refused_on_a_cpu_without_fast_bf16(monkeypatch):
    import jointspace_train.training.loop as tr

    enc_tr, enc_dv, vocab = toy(16, 8, 8)
    s = Settings(loss="SH", joint_dim=8, word_dim=4, batch_size=8, epochs=1, threads=1, bf16=True)
    monkeypatch.setattr(tr, "cpu_bf16_is_fast", lambda: False)
    with pytest.raises(ValueError, match="without --bf16"):
        train(s, enc_tr, enc_dv, vocab, log=lambda m: None)
    monkeypatch.setattr(tr, "cpu_bf16_is_fast", lambda: True)
    assert train(s, enc_tr, enc_dv, vocab, log=lambda m: None)[2].history[0]["epoch"] == 1


def test_glove_rows_start_the_words_they_know_and_a_narrow_table_is_widened():
    from jointspace_train.training.loop import Settings, text_encoder

    rows = np.arange(6 * 100, dtype=np.float32).reshape(6, 100) / 600
    found = np.array([True, False, True, True, False, True])  # row 0 is padding: never read, left as it was
    s = Settings(word_dim=16, joint_dim=8, word_init="glove100")
    text = text_encoder(s, 6, (rows, found))
    w = text.embed.weight.detach().numpy()
    assert w.shape == (6, 100) and text.lift is not None and text.lift.weight.shape == (16, 100)
    np.testing.assert_array_equal(w[[2, 3, 5]], rows[[2, 3, 5]])
    assert np.abs(w[[0, 1, 4]]).max() <= 0.1  # padding, and the words GloVe lacks: their random start
    # the folded encoder (what export writes) computes the same function
    ids, lengths = torch.tensor([[2, 3, 5], [4, 1, 0]]), torch.tensor([3, 2])
    text.eval()
    with torch.no_grad():
        np.testing.assert_allclose(text.folded()(ids, lengths).numpy(), text(ids, lengths).numpy(), atol=1e-6)
    with pytest.raises(ValueError, match="word vectors"):
        text_encoder(Settings(word_dim=16, joint_dim=8, word_init="glove50"), 6, (rows, found))


def test_frozen_words_do_not_move_for_the_first_epochs_then_do(tmp_path):
    tr, dev, vocab = toy(32, 8, 1)
    rows, found = np.ones((vocab, 50), np.float32), np.ones(vocab, bool)
    s = Settings(loss="MH", joint_dim=8, word_dim=50, word_init="glove50", freeze_words=1, epochs=1, threads=1,
                 batch_size=8, rnn="lstm")
    ck = tmp_path / "checkpoint.pt"
    train(s, tr, dev, vocab, log=lambda m: None, checkpoint=ck, word_vectors=(rows, found))

    def table():  # the weights training has now, not the best epoch's
        return torch.load(ck, weights_only=False)["text"]["embed.weight"].numpy()

    np.testing.assert_array_equal(table()[1:], rows[1:])  # one epoch, frozen for one: GloVe's rows as given
    _, text, _ = train(Settings(**{**s.__dict__, "epochs": 2}), tr, dev, vocab, log=lambda m: None, checkpoint=ck,
                       word_vectors=(rows, found))
    assert np.abs(table()[1:] - rows[1:]).max() > 0 and text.kind == "lstm"
