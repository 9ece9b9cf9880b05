"""Packs: every split's FNE codes and captions in one folder of a few MB (`pack`), and reading such a folder back
(`from_pack`), to train on a machine that has neither the photos nor the feature cache."""
from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..data import flickr8k
from ..vision import features, fne
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


def pack_bundles(bundles: list[str], data: str, cache: str | None, out: str | Path, threads: int = 0,
                 batch_images: int = 4) -> None:
    """Every split's codes through several bundles' own vision graphs, side by side in the order given: what a
    bundle with several backbones trains from (`train --pack`, then `export RUN --pack` writes it). Each
    backbone's FNE statistics are measured again on the training split of its own graph's features (a windowed
    or int8 graph's features are not the float ten crops' its bundle was cut with) and kept for the export,
    with the bundle and graph they came from."""
    from safetensors.numpy import save_file

    from ..bundle import contract, own_features

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    splits = {s: flickr8k.load_split(data, s) for s in ("train", "dev", "test")}
    codes: dict[str, list[np.ndarray]] = {s: [] for s in splits}
    recorded = []
    for i, b in enumerate(bundles):
        m = json.loads((Path(b) / "bundle.json").read_text())
        if len(contract.backbones(m)) != 1:
            sys.exit(f"{b}: name the bundles of one backbone each")
        v, f = m["vision"], m["fne"]
        index, raw = own_features.dataset_features(b, data, cache, threads, batch_images)
        rows = {s: [index[n] for n in sp.images] for s, sp in splits.items()}
        mean, std = fne.stats(raw[rows["train"]])
        for s, r in rows.items():
            codes[s].append(fne.encode(raw[r], mean, std, tuple(f["thresholds"]), f["std_eps"]))
        stats = f"fne-{i}.safetensors"
        save_file({"mean": mean, "std": std}, str(out / stats))
        recorded.append({"bundle": str(Path(b).resolve()), "vision": v,
                         "fne": {**f, "stats": stats, "dim": int(raw.shape[1])},
                         "graph_sha256": features.sha256_file(Path(b) / v["onnx"])})
    inputs = {s: np.concatenate(c, axis=1) for s, c in codes.items()}
    save_file({s: fne.pack(x) for s, x in inputs.items()}, str(out / "codes.safetensors"))
    vs = [r["vision"] for r in recorded]
    manifest = {"format": 1,
                "features": {"tap_point": "+".join(sorted({v["tap_point"] for v in vs})), "input": "fne",
                             "crop": "+".join(v["crop_mode"] for v in vs),
                             "weights": "+".join(v["weights"] for v in vs)},
                "dim": int(inputs["train"].shape[1]), "backbones": recorded,
                "splits": {s: {"images": v.images, "captions": v.captions} for s, v in splits.items()}}
    (out / "pack.json").write_text(json.dumps(manifest))
    print(f"{out}: {', '.join(f'{s} {len(x)}' for s, x in inputs.items())} codes of "
          f"{' + '.join(str(r['fne']['dim']) for r in recorded)} features ({manifest['features']['crop']})")


def backbones_of(directory) -> list[dict] | None:
    """The backbones a pack of several bundles was made from (`pack_bundles`), or None for a pack of one."""
    return json.loads((Path(directory) / "pack.json").read_text()).get("backbones")


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
