"""Training one pipeline on the cached features (or a pack) into a run dir, optionally writing its bundle (the
`train` command)."""
from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..bundle.trained import BundleTarget, write_bundle
from ..data import flickr8k
from ..vision import images
from ..vision.weights import VisionWeights
from .inputs import Extraction, Features, prepare
from .packs import from_pack, packed_features
from .run_dirs import open_run

if TYPE_CHECKING:
    from .loop import Settings


@dataclass(frozen=True)
class Train:
    """What `train` trains on, how, where its run goes, and the bundle it writes."""

    source: VisionWeights
    extraction: Extraction
    feats: Features
    settings: Settings  # the options given; train.Settings' defaults for the rest
    device: str
    raw_eval: bool
    pack: str | None
    run_dir: str
    init_from: str | None
    bundle: BundleTarget | None
    argv: tuple[str, ...]  # the command line, recorded in result.json


def held_out(d, words: str, min_count: int):
    """`d` with the held-out words taken out of the training and dev captions, and the tokenizer built again
    from what is left (so none of them is in its vocabulary)."""
    from ..text import tokenizer

    forms = flickr8k.held_out_forms(words)
    splits = {k: sp if k == "test" else flickr8k.without_words(sp, forms) for k, sp in d.splits.items()}
    tok = tokenizer.build([c for cs in splits["train"].captions for c in cs], min_count)
    return replace(d, splits=splits, tok=tok)


def run_training(s: Train) -> None:
    import torch

    from .loop import Encoded, evaluate_split, save_result, train
    from .losses import similarity_of

    settings, source, feats = s.settings, s.source, s.feats
    if s.pack:
        if settings.crop_augment or s.bundle:
            sys.exit("--pack holds each image's code, not each crop's, and no FNE statistics: train without "
                     "--crop-augment and --bundle-out, then `export RUN` where the features are")
        d, f = from_pack(s.pack, settings.min_count)
        source, feats = packed_features(f, source)
    else:
        if settings.crop_augment and images.N_CROPS[feats.crop] == 1:
            sys.exit("--crop-augment draws one of each image's crops: it needs --crop ten")
        d = prepare(source, s.extraction, feats, settings.min_count, settings.crop_augment)
    settings = replace(settings, image_input=feats.input)
    if settings.hold_out:
        d = held_out(d, settings.hold_out, settings.min_count)
    enc = {sp: Encoded(d.inputs[sp], d.splits[sp].captions, d.tok, settings.max_tokens,
                       crops=d.train_crops if sp == "train" else None) for sp in d.splits}
    run, say = open_run(s.run_dir)

    say(f"train {feats.input} {feats.tap_point} {feats.crop}: {json.dumps(asdict(settings.resolved()))}")
    init = None
    if s.init_from:
        init = torch.load(Path(s.init_from) / "model.pt", weights_only=True)
        say(f"starting from {s.init_from}")
    recorded = {"tap_point": feats.tap_point, "input": feats.input, "crop": feats.crop, "weights": source.weights,
                "init_from": s.init_from and Path(s.init_from).name}
    vectors = None
    if settings.word_init != "random":
        from ..text import caption_features, glove

        vectors = glove.table(settings.word_init, caption_features.vocab_words(d.tok), source.cache)
        say(f"{settings.word_init}: {int(vectors[1].sum())} of {len(vectors[1])} words have a vector")
    try:
        proj, text, result = train(settings, enc["train"], enc["dev"], d.tok.get_vocab_size(), log=say, init=init,
                                   checkpoint=run / "checkpoint.pt", features=recorded, device=s.device,
                                   raw_eval=s.raw_eval, word_vectors=vectors)
    except ValueError as e:  # a refused run (settings, features, bf16 on this CPU): say why, no traceback
        sys.exit(f"{run}: {e}")
    resolved = settings.resolved()
    result.test = evaluate_split(proj, text, enc["test"], similarity_of(resolved.loss))
    result.command = "python -m jointspace_train " + " ".join(s.argv)
    say(f"best epoch {result.best_epoch}: dev {result.dev}\ntest {result.test}")
    save_result(result, run / "result.json")
    torch.save({"proj": proj.state_dict(), "text": text.state_dict()}, run / "model.pt")
    if s.bundle and feats.input == "fne":
        write_bundle(s.bundle, source, feats, s.extraction.data, d, proj, text, result, say)
