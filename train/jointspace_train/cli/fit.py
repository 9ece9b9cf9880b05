"""`fit`: the closed-form systems of the other seed papers on the cached features, chosen on dev, optionally
written as a bundle the server runs unchanged (the library's `training.selection`)."""
from __future__ import annotations

import argparse

from ..training import selection
from ..training.inputs import Features
from .options import add_data, add_tap_point, extraction_of, weights_of


def fit_of(ns: argparse.Namespace, argv: list[str]) -> selection.Fit:
    grid = selection.Grid(tuple(ns.dims), tuple(ns.power), tuple(ns.reg_image), tuple(ns.reg_text),
                          tuple(ns.aux_dims), tuple(ns.aux_power), tuple(ns.aux_weight))
    feats = Features(tap_point=ns.tap_point, crop=ns.crop, input=ns.input)
    return selection.Fit(weights_of(ns), extraction_of(ns), feats, ns.method, ns.text, ns.words, ns.tags, grid,
                         ns.max_tokens, ns.run_dir, ns.bundle_out, tuple(argv))


def add_fit(sub) -> None:
    p = sub.add_parser("fit", help="closed-form systems (linear regression, CCA, normalized CCA, SAE), chosen "
                                   "on dev; optionally a bundle")
    add_data(p)
    add_tap_point(p)
    p.add_argument("--input", default="fne", choices=("fne", "l2-last"),
                   help="FNE codes, or the single-layer baseline (L2-normalised last-layer means)")
    p.add_argument("--method", required=True, choices=selection.METHODS)
    p.add_argument("--text", default="tfidf", choices=selection.TEXTS,
                   help="caption features: TF-IDF over the most frequent training words, or averaged GloVe")
    p.add_argument("--words", type=int, default=3000, help="TF-IDF dictionary size (the paper: 3,000)")
    p.add_argument("--tags", type=int, default=1000, help="SAE: keyword tags of the auxiliary view")
    p.add_argument("--dims", type=int, nargs="+", default=[96], help="CCA directions kept (the paper: 96)")
    p.add_argument("--power", type=float, nargs="+", default=[4.0],
                   help="normalized CCA: columns scaled by the correlations to this power (the paper: 4)")
    p.add_argument("--reg-image", type=float, nargs="+", default=[0.1],
                   help="ridge on the image covariance, times its mean eigenvalue")
    p.add_argument("--reg-text", type=float, nargs="+", default=[0.1],
                   help="ridge on the text covariance (linreg: on the regressors'), times its mean eigenvalue")
    p.add_argument("--aux-dims", type=int, nargs="+", default=[96], help="SAE: auxiliary CCA directions")
    p.add_argument("--aux-power", type=float, nargs="+", default=[4.0], help="SAE: the auxiliary CCA's power")
    p.add_argument("--aux-weight", type=float, nargs="+", default=[1.0],
                   help="SAE: scale of the stacked auxiliary block against the original features")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--run-dir", required=True, help="where log.txt and result.json go")
    p.add_argument("--bundle-out", help="write the chosen model's bundle here (models/<name>) instead of into "
                                        "the run dir")
    p.set_defaults(fn=lambda ns, argv: selection.run_fit(fit_of(ns, argv)))
