"""`export`: the bundle of one finished run, or one stacked bundle of several (no training; the library's
`bundle.from_runs`)."""
from __future__ import annotations

import argparse

from ..bundle.from_runs import Export, export
from ..bundle.trained import BundleTarget
from .options import add_extraction, add_reference_eval, add_wheel, extraction_of


def export_of(ns: argparse.Namespace) -> Export:
    return Export(tuple(ns.run_dirs), BundleTarget(ns.bundle_out, ns.reference_eval), ns.cache, ns.wheel,
                  extraction_of(ns), ns.pack)


def add_export(sub) -> None:
    p = sub.add_parser("export", help="write the bundle of a finished training run (no training); several runs "
                                      "make one stacked bundle")
    p.add_argument("run_dirs", nargs="+", metavar="run_dir")
    p.add_argument("--bundle-out", required=True)
    add_reference_eval(p)
    add_wheel(p)
    add_extraction(p)
    p.add_argument("--pack", help="the pack the runs were trained from (one with FNE statistics), in place of "
                                  "the feature cache: for features extracted on another machine")
    p.set_defaults(fn=lambda ns, argv: export(export_of(ns)))
