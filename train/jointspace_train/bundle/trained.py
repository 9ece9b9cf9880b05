"""The bundle of a trained model (train --bundle-out, export), optionally measured again through its own graph."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..data import flickr8k
from ..evaluation.reference import record, reference_eval
from ..training.inputs import Features, Prepared
from ..vision import backbones
from ..vision.weights import VisionWeights, graph_file


@dataclass(frozen=True)
class BundleTarget:
    """Where a bundle goes, and whether its test metrics are measured again from the images (--reference-eval)."""

    out: str
    reference_eval: bool = False


def write_bundle(target: BundleTarget, source: VisionWeights, feats: Features, data_root: str, d: Prepared, proj,
                 text, result, say=print, members: list | None = None) -> None:
    """The bundle of a trained model; with --reference-eval its test metrics are measured again from the
    images, through the bundle's own graph. `members`: what each run of a stacked model was (its result)."""
    from ..training.losses import similarity_of
    from . import writer

    s = result.settings
    out = Path(target.out)
    out.mkdir(parents=True, exist_ok=True)
    vis = backbones.vision_section(d.weights, feats.tap_point, feats.crop)
    vis["prepare"] = flickr8k.PREPARATION
    g = graph_file(source, d.weights, feats.tap_point)
    training = training_section(feats, result, members, "trainer, cached features of the training graph")
    writer.write(out, name=out.name, vision=vis, vision_onnx=g, fne_mean=d.mean, fne_std=d.std,
                 projection=proj.fc.weight.detach().numpy(), text=text, tok=d.tok,
                 max_tokens=s["max_tokens"], similarity=similarity_of(s["loss"]), use_abs=s["use_abs"],
                 training=training)
    if target.reference_eval:
        m = reference_eval(out, data_root, "test")
        record(out, m)
        say(f"reference test metrics through the bundle: {m}")
    print(f"bundle written to {out}")


def training_section(feats: Features, result, members: list | None, source: str) -> dict:
    """bundle.json's `training`: the recipe, its settings and the trainer's own figures (`source` says what
    they were measured on)."""
    s = result.settings
    training = {"dataset": "flickr8k", "split": "train", "loss": s["loss"], "crop_mode": feats.crop,
                "tap_point": feats.tap_point, "init_from": result.features.get("init_from"),
                "hyperparameters": s, "best_epoch": result.best_epoch, "train_seconds": result.seconds,
                "dev_metrics": result.dev, "test_metrics": result.test, "test_metrics_source": source}
    if members:
        training["members"] = members
    return training
