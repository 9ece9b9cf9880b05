"""Packs: every split's FNE codes and captions in one folder of a few MB (`pack`), and reading such a folder back
(`from_pack`), to train on a machine that has neither the photos nor the feature cache."""
from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..data import flickr8k
from ..vision import fne
from ..vision.weights import VisionWeights
from .inputs import Extraction, Features, Prepared, prepare


def pack_features(source: VisionWeights, feats: Features) -> dict:
    """The feature choices a pack records (pack.json's "features")."""
    return {"tap_point": feats.tap_point, "input": feats.input, "crop": feats.crop, "weights": source.weights}


def packed_features(recorded: dict, source: VisionWeights) -> tuple[VisionWeights, Features]:
    """The feature choices a pack was made with, in place of the options (`pack_features` read back)."""
    return (replace(source, weights=recorded["weights"]),
            Features(tap_point=recorded["tap_point"], crop=recorded["crop"], input=recorded["input"]))


def pack(source: VisionWeights, extraction: Extraction, feats: Features, out: str | Path) -> None:
    """Every split's FNE codes (packed, 2 bits a feature) and captions in one folder of a few MB: what training
    needs, for a machine that has neither the photos nor the feature cache (a GPU machine that only the
    repository travels to). `train --pack DIR` trains from it; the bundle is exported here, where the features
    are (`export RUN`)."""
    from safetensors.numpy import save_file

    d = prepare(source, extraction, feats, 1)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if feats.input == "fne":
        save_file({sp: fne.pack(x.astype(np.int8)) for sp, x in d.inputs.items()}, str(out / "codes.safetensors"))
        # The statistics the codes were cut with: a run trained from the pack is exported with them
        # (`export RUN --pack DIR`), so its bundle encodes photos as the codes it learnt from were.
        save_file({"mean": d.mean, "std": d.std}, str(out / "fne.safetensors"))
    else:
        save_file({sp: x.astype(np.float16) for sp, x in d.inputs.items()}, str(out / "inputs.safetensors"))
    manifest = {"format": 1, "features": pack_features(source, feats),
                "dim": int(d.inputs["train"].shape[1]),
                "splits": {sp: {"images": v.images, "captions": v.captions} for sp, v in d.splits.items()}}
    (out / "pack.json").write_text(json.dumps(manifest))
    size = sum(f.stat().st_size for f in out.iterdir()) / 2**20
    print(f"{out}: {', '.join(f'{sp} {len(x)}' for sp, x in d.inputs.items())} {feats.input} inputs of "
          f"{manifest['dim']} features ({feats.crop}, {feats.tap_point}), {size:.1f} MiB")


def from_pack(directory, min_count: int) -> tuple[Prepared, dict]:
    """What `prepare` gives, read from a `pack` folder (no weights; the FNE statistics where the pack has
    them), and the feature choices it was made with."""
    from safetensors.numpy import load_file

    from ..text import tokenizer

    d = Path(directory)
    m = json.loads((d / "pack.json").read_text())
    if m.get("format") != 1:
        sys.exit(f"{d}: pack format {m.get('format')!r}, this trainer reads 1")
    splits = {s: flickr8k.Split(s, v["images"], v["captions"]) for s, v in m["splits"].items()}
    mean = std = None
    if m["features"]["input"] == "fne":
        codes = load_file(str(d / "codes.safetensors"))
        inputs = {s: fne.unpack(codes[s], m["dim"]).astype(np.float32) for s in splits}
        if (d / "fne.safetensors").exists():
            st = load_file(str(d / "fne.safetensors"))
            mean, std = st["mean"], st["std"]
    else:
        raw = load_file(str(d / "inputs.safetensors"))
        inputs = {s: raw[s].astype(np.float32) for s in splits}
    tok = tokenizer.build([c for cs in splits["train"].captions for c in cs], min_count)
    return Prepared(weights=None, splits=splits, mean=mean, std=std, inputs=inputs, train_crops=None,
                    tok=tok), m["features"]
