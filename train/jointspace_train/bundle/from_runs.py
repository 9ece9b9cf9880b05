"""The bundle of one finished run, or one stacked bundle of several (the `export` command; no training)."""
from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

from ..training.inputs import Extraction, Features, prepare
from ..training.packs import backbones_of, from_pack, packed_features
from ..training.run_dirs import finished_run, models_of
from ..vision.weights import VisionWeights, load_weights
from .trained import BundleTarget, write_bundle


@dataclass(frozen=True)
class Export:
    """The runs to export, the bundle they become, and where their features are (the cache, or a pack)."""

    run_dirs: tuple[str, ...]
    bundle: BundleTarget
    cache: str
    wheel: str | None  # the weights are the runs' own
    extraction: Extraction
    pack: str | None = None  # the runs' codes and FNE statistics, in place of the feature cache


def prepare_or_unpack(s: Export, source: VisionWeights, feats: Features, min_count: int):
    """The runs' dataset: from the feature cache, or from a pack that carries its FNE statistics (features
    extracted on another machine; only the weights, for the vision graph, are needed here)."""
    if not s.pack:
        return prepare(source, s.extraction, feats, min_count)
    d, recorded = from_pack(s.pack, min_count)
    if packed_features(recorded, source)[1] != feats:
        sys.exit(f"{s.pack} holds {recorded}, not the runs' features {feats}")
    if backbones_of(s.pack):  # several bundles' codes: each backbone's statistics and graph are the pack's
        return d
    if d.mean is None:
        sys.exit(f"{s.pack}: no FNE statistics (a pack written before they were kept): export where the "
                 f"features are, without --pack")
    return replace(d, weights=load_weights(source))


def export(s: Export) -> None:
    """The bundle of a finished run, from its model.pt and result.json (no training). Several runs make one
    stacked bundle (`model.stack`): their W one above the other and their text encoders side by side, with the
    stacked model's dev and test metrics measured here and each member's result recorded."""
    from ..training.loop import Encoded, evaluate_split
    from ..training.losses import similarity_of
    from ..training.model import stack

    runs = [Path(r) for r in s.run_dirs]
    done = [finished_run(r) for r in runs]
    result = done[0][0]
    f, st0 = result.features, result.settings
    if f["input"] != "fne":
        sys.exit(f"{runs[0]}: a {f['input']} run has no FNE code to put in a bundle")
    for run, (r, _) in zip(runs[1:], done[1:]):
        differ = [k for k in ("tap_point", "crop", "input", "weights") if r.features[k] != f[k]]
        differ += [k for k in ("min_count", "max_tokens") if r.settings[k] != st0[k]]
        differ += ["hold_out"] * (r.settings.get("hold_out", "") != st0.get("hold_out", ""))
        if differ:
            sys.exit(f"{run} differs from {runs[0]} in {', '.join(differ)}: they cannot share one bundle")
    if len(runs) > 1 and any(similarity_of(r.settings["loss"]) != "cosine" for r, _ in done):
        sys.exit("only cosine runs stack into one bundle")
    source = VisionWeights(cache=s.cache, weights=f["weights"], wheel=s.wheel)
    feats = Features(tap_point=f["tap_point"], crop=f["crop"], input=f["input"])
    d = prepare_or_unpack(s, source, feats, st0["min_count"])
    if st0.get("hold_out"):  # the run's tokenizer, which never saw them
        from ..training.run import held_out

        d = held_out(d, st0["hold_out"], st0["min_count"])
    models = models_of(d, [(st["proj"], st["text"]) for _, st in done], [r.settings for r, _ in done])
    if len(runs) == 1:
        return _write(s, source, feats, d, *models[0], result)
    proj, text = stack([p for p, _ in models], [t for _, t in models])
    enc = {sp: Encoded(d.inputs[sp], d.splits[sp].captions, d.tok, st0["max_tokens"]) for sp in ("dev", "test")}
    stacked = replace(result, settings={**st0, "joint_dim": text.joint_dim},
                      dev=evaluate_split(proj, text, enc["dev"], "cosine"),
                      test=evaluate_split(proj, text, enc["test"], "cosine"),
                      seconds=sum(r.seconds for r, _ in done), best_epoch=0)
    members = [{"run": run.name, "settings": r.settings, "best_epoch": r.best_epoch, "dev_metrics": r.dev,
                "test_metrics": r.test} for run, (r, _) in zip(runs, done)]
    _write(s, source, feats, d, proj, text, stacked, members=members)


def _write(s: Export, source: VisionWeights, feats: Features, d, proj, text, result, members=None) -> None:
    """A pack of several bundles' codes makes a bundle of several backbones; anything else, the bundle of the
    training graph."""
    if s.pack and backbones_of(s.pack):
        from . import joined

        return joined.write_bundle(s.bundle, s.pack, feats, d, proj, text, result, members=members)
    return write_bundle(s.bundle, source, feats, s.extraction.data, d, proj, text, result, members=members)
