"""python -m jointspace_train <command>: vision-export, features, train, export, hubness, eval, fixture, check, ...

Each command's module adds its parser, turns the parsed options into a typed, frozen settings object at once (the
library's own settings type where a library function takes it: `training.selection.Fit`, `training.run.Train`, ...) and
calls the library; nothing past that boundary sees the argparse Namespace, and no library module imports cli/
(tests/test_imports.py)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..vision import features
from .bundle_tools import (
    add_check,
    add_fixture,
    add_labels,
    add_prepare,
    add_quantize_text,
    add_rebuild_labels,
    add_rebuild_text,
    add_text_vocab,
)
from .ensemble import add_ensemble
from .eval_bundle import add_eval
from .export_runs import add_export
from .extract import add_features
from .fit import add_fit
from .graphs import add_gpu_copy, add_quantize_vision, add_rebuild_vision, add_vision_export, add_windowed
from .hubness_bank import add_hubness
from .pack import add_pack, add_pack_bundles
from .photos_cmd import add_photos
from .report import add_report
from .run_parts import add_join_run, add_split_run
from .training import add_train

__all__ = ["main", "parser"]

# in the order `--help` lists them
COMMANDS = (add_vision_export, add_rebuild_vision, add_windowed, add_gpu_copy, add_quantize_vision, add_features,
            add_train, add_fit,
            add_export, add_eval, add_ensemble, add_hubness, add_pack, add_pack_bundles, add_split_run, add_join_run,
            add_fixture, add_report, add_quantize_text, add_text_vocab, add_rebuild_text, add_labels,
            add_rebuild_labels, add_prepare, add_photos, add_check)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m jointspace_train")
    ap.add_argument("--cache", default=str(features.default_cache()), help="feature/graph cache (outside git)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for add in COMMANDS:
        add(sub)
    return ap


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser().parse_args(argv)
    Path(args.cache).mkdir(parents=True, exist_ok=True)
    args.fn(args, argv)
