"""The bundle of a model trained on a pack of several bundles' codes (`pack-bundles`): one backbone per source
bundle, each with its graph (and int8 calibration ranges) as that bundle has it and the FNE statistics the pack
measured, one projection over the whole code (docs/bundle.md, "Several backbones")."""
from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

from safetensors.numpy import load_file

from ..training.inputs import Features, Prepared
from ..vision import features
from . import contract, writer
from .trained import BundleTarget, training_section


def write_bundle(target: BundleTarget, pack: str | Path, feats: Features, d: Prepared, proj, text, result,
                 say=print, members: list | None = None) -> None:
    from ..training.losses import similarity_of

    if target.reference_eval:
        sys.exit("--reference-eval reads one backbone's graph; measure a bundle of several with `jointspace eval`")
    pack, out = Path(pack), Path(target.out)
    backbones = json.loads((pack / "pack.json").read_text())["backbones"]
    for b in backbones:  # the codes were made by these graphs: refuse a source bundle changed since
        got = features.sha256_file(Path(b["bundle"]) / b["vision"]["onnx"])
        if got != b["graph_sha256"]:
            sys.exit(f"{b['bundle']}: its vision graph has sha256 {got}, the pack's codes came from "
                     f"{b['graph_sha256']}: pack again")
    for b in backbones[1:]:
        if "quantization" in b["vision"]:
            sys.exit(f"{b['bundle']}: an int8 graph after the first backbone has calibration ranges the bundle "
                     "cannot name yet; put it first")
    s = result.settings
    first, src = backbones[0], Path(backbones[0]["bundle"])
    st = load_file(str(pack / first["fne"]["stats"]))
    vision = {k: v for k, v in first["vision"].items() if k != "onnx"}
    training = training_section(feats, result, members, "trainer, the pack's codes of each backbone's own graph")
    training["backbones_from"] = [Path(b["bundle"]).name for b in backbones]
    out.mkdir(parents=True, exist_ok=True)
    ranges = vision.get("quantization", {}).get("ranges")
    if ranges:  # named in bundle.json by the writer
        shutil.copyfile(src / ranges, out / ranges)
    writer.write(out, name=out.name, vision=vision, vision_onnx=src / first["vision"]["onnx"], fne_mean=st["mean"],
                 fne_std=st["std"], projection=proj.fc.weight.detach().numpy(), text=text, tok=d.tok,
                 max_tokens=s["max_tokens"], similarity=similarity_of(s["loss"]), use_abs=s["use_abs"],
                 training=training)
    m = {k: v for k, v in json.loads((out / "bundle.json").read_text()).items() if k != "files"}
    extra = []
    for b in backbones[1:]:
        v = dict(b["vision"])
        tag = re.sub(r"[^a-z0-9]+", "-", v["backbone"].lower()).strip("-")  # a file name's part
        v["onnx"] = f"vision-{tag}.onnx"
        shutil.copyfile(Path(b["bundle"]) / b["vision"]["onnx"], out / v["onnx"])
        f = {**b["fne"], "stats": f"fne-{tag}.safetensors"}
        shutil.copyfile(pack / b["fne"]["stats"], out / f["stats"])
        extra.append({"vision": v, "fne": f})
    if extra:
        m["extra_backbones"] = extra
    contract.finish(out, m)
    contract.read(out)
    say(f"bundle written to {out}: {' + '.join(str(f['dim']) for _, f in contract.backbones(m))} features")
