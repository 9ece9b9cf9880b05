"""The model bundle, Python side (docs/bundle.md): write it with checksums, read it back verified.

A bundle loads fully or not at all; every failure names the file and what was expected.
"""
from __future__ import annotations

import datetime as dt
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from safetensors.numpy import load_file, save_file

from ..vision.features import sha256_file
from ..vision.images import PREPARE_FILTERS
from . import hubness
from .filemode import shareable

FORMAT = 1
# cosine: unit vectors; order: Vendrov et al.'s S on |unit vectors|; euclidean: -||c - i||^2 on the vectors as
# they are (the closed-form regression and plain CCA)
SIMILARITIES = ("cosine", "order", "euclidean")


class BundleError(Exception):
    pass


def now() -> str:
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def write_fne(path, mean: np.ndarray, std: np.ndarray) -> None:
    save_file({"mean": np.asarray(mean, np.float32), "std": np.asarray(std, np.float32)}, str(path))
    shareable(path)


def write_projection(path, weight: np.ndarray, dtype=np.float16, bias: np.ndarray | None = None) -> None:
    """W [joint_dim, fne_dim] and, for affine maps (the closed-form methods), a bias [joint_dim] (float32)."""
    tensors = {"weight": np.ascontiguousarray(weight, dtype)}
    if bias is not None:
        tensors["bias"] = np.ascontiguousarray(bias, np.float32)
    save_file(tensors, str(path))
    shareable(path)


def copy_except_vision(src: str | Path, out: str | Path, manifest: dict, every_backbone: bool = False) -> dict:
    """Copies every file `manifest` (bundle `src`'s) names but the vision graph (with `every_backbone`, every
    backbone's) into `out`; returns the manifest without `files`, for the caller to change, write the new graphs
    beside and `finish`."""
    src, out = Path(src), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    m = {k: v for k, v in manifest.items() if k != "files"}
    graphs = {v["onnx"] for v, _ in backbones(m)} if every_backbone else {m["vision"]["onnx"]}
    for name in manifest["files"]:
        if name not in graphs:
            shutil.copyfile(src / name, out / name)
    return m


def backbones(manifest: dict) -> list[tuple[dict, dict]]:
    """Every backbone's (vision, fne) sections in code order: `vision`/`fne` first, then `extra_backbones`
    (docs/bundle.md, "Several backbones")."""
    extra = manifest.get("extra_backbones") or []
    return [(manifest["vision"], manifest["fne"])] + [(b["vision"], b["fne"]) for b in extra]


def code_dim(manifest: dict) -> int:
    """Features in the whole ternary code: every backbone's fne.dim."""
    return sum(f["dim"] for _, f in backbones(manifest))


def where(i: int) -> str:
    """Backbone `i`'s place in bundle.json, as messages name it: "" for the first, "extra_backbones[i-1]."."""
    return "" if i == 0 else f"extra_backbones[{i - 1}]."


def single_backbone(manifest: dict, directory, what: str) -> None:
    """Refuses a bundle with several backbones for a tool that reads one backbone's feature cache."""
    n = len(backbones(manifest))
    if n > 1:
        raise SystemExit(f"{directory}: {what} reads one backbone's features; this bundle has {n} backbones")


def finish(directory: str | Path, manifest: dict) -> dict:
    """Fill in format/created/files (sha256 of every named file) and write bundle.json."""
    directory = Path(directory)
    manifest = {"format": FORMAT, "created": manifest.get("created") or now(), **manifest}
    named = [name for v, f in backbones(manifest) for name in (v["onnx"], f["stats"])]
    named += [manifest["projection"]["weights"], manifest["text"]["onnx"], manifest["text"]["tokenizer"]]
    vocabulary = manifest["text"].get("vocabulary")
    if vocabulary:  # the whole-vocabulary graph's sources (textvocab)
        named += [vocabulary["from"]["onnx"], vocabulary["from"]["tokenizer"], vocabulary["map"]]
    if "ranges" in manifest["vision"].get("quantization", {}):
        named.append(manifest["vision"]["quantization"]["ranges"])
    if "hubness" in manifest:
        named.append(manifest["hubness"]["bank"])
        if "annotation" in manifest["hubness"]:
            named.append(manifest["hubness"]["annotation"]["bank"])
    if "labels" in manifest:
        named += [manifest["labels"][k] for k in ("weights", "from") if k in manifest["labels"]]
    manifest["files"] = {n: sha256_file(directory / n) for n in named}
    (directory / "bundle.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def record_preparation(directory: str | Path, width: int, height: int, filter: str) -> None:
    """Sets vision.prepare (a new vision id: codes stored under the old one must be re-embedded, which only
    changes photos of another size than the prepared one), and reads the bundle back as a check."""
    manifest = read(directory).manifest
    manifest = {k: v for k, v in manifest.items() if k != "files"}
    manifest["vision"]["prepare"] = {"resize": [width, height], "filter": filter}
    finish(directory, manifest)
    read(directory)


@dataclass
class Backbone:
    """One backbone: its vision and fne sections and its FNE statistics."""

    vision: dict
    fne: dict
    mean: np.ndarray
    std: np.ndarray


@dataclass
class Bundle:
    directory: Path
    manifest: dict
    fne_mean: np.ndarray  # the first backbone's statistics (`backbones` has every backbone's)
    fne_std: np.ndarray
    projection: np.ndarray  # [joint_dim, code_dim] float32
    bias: np.ndarray | None = None  # [joint_dim] float32: added to W . code before normalisation, if present
    hubness: np.ndarray | None = None  # the search-offset bank, float32 [captions, joint_dim], if the bundle has one
    # the annotation side's bank (hubness.annotation), float32 [images, joint_dim], if the bundle has one
    hubness_images: np.ndarray | None = None
    backbones: list[Backbone] | None = None  # in code order, the first's statistics being fne_mean/fne_std

    @property
    def vision(self) -> dict:
        return self.manifest["vision"]

    def path(self, key: str) -> Path:
        section, field = key.split(".")
        return self.directory / self.manifest[section][field]


def _io_shapes(path: Path) -> dict[str, list]:
    g = onnx.load(str(path), load_external_data=False).graph
    return {v.name: [d.dim_value or d.dim_param for d in v.type.tensor_type.shape.dim]
            for v in list(g.input) + list(g.output)}


def read(directory: str | Path) -> Bundle:
    directory = Path(directory)
    mf = directory / "bundle.json"
    if not mf.exists():
        raise BundleError(f"{mf}: missing; a bundle is a directory holding bundle.json")
    m = json.loads(mf.read_text())
    if m.get("format") != FORMAT:
        raise BundleError(f"{mf}: format {m.get('format')!r}, this reader knows format {FORMAT}")
    for name, digest in m["files"].items():
        p = directory / name
        if not p.exists():
            raise BundleError(f"{p}: missing (named in bundle.json)")
        got = sha256_file(p)
        if got != digest:
            raise BundleError(f"{p}: sha256 {got} does not match bundle.json's {digest}")
    pr, t = m["projection"], m["text"]
    read_backbones = [_backbone(directory, m, i, v, f) for i, (v, f) in enumerate(backbones(m))]
    tshapes = _io_shapes(directory / t["onnx"])
    out = tshapes.get(t["output_name"])
    if out is None or out[-1] != pr["joint_dim"]:
        raise BundleError(f"{directory / t['onnx']}: output {t['output_name']!r} is {out}, "
                          f"expected [N, {pr['joint_dim']}]")
    dim = code_dim(m)
    tensors = load_file(str(directory / pr["weights"]))
    w = tensors.get("weight")
    if w is None or w.shape != (pr["joint_dim"], dim) or w.dtype not in (np.float16, np.float32):
        raise BundleError(f"{directory / pr['weights']}: tensor 'weight' must be float16/float32 "
                          f"[{pr['joint_dim']}, {dim}], found {None if w is None else (w.dtype, w.shape)}")
    bias = tensors.get("bias")
    if bias is not None and (bias.shape != (pr["joint_dim"],) or bias.dtype not in (np.float16, np.float32)):
        raise BundleError(f"{directory / pr['weights']}: tensor 'bias' must be float16/float32 "
                          f"[{pr['joint_dim']}], found {(bias.dtype, bias.shape)}")
    if m["similarity"] not in SIMILARITIES:
        raise BundleError(f"{mf}: similarity must be one of {', '.join(map(repr, SIMILARITIES))}")
    if m["similarity"] == "euclidean" and pr["abs"]:
        raise BundleError(f"{mf}: projection.abs is for order embeddings; a euclidean bundle's vectors are used "
                          "as they are")
    if "labels" in m and not 0 <= m["labels"].get("code_start", -1) < dim:
        raise BundleError(f"{mf}: labels.code_start must be in 0..{dim} (the code: every backbone's fne.dim)")
    first = read_backbones[0]
    return Bundle(directory, m, first.mean, first.std, w.astype(np.float32),
                  bias=None if bias is None else bias.astype(np.float32), hubness=_hubness(directory, m),
                  hubness_images=_hubness_images(directory, m), backbones=read_backbones)


def _backbone(directory: Path, m: dict, i: int, v: dict, f: dict) -> Backbone:
    """Backbone `i` checked as the first always was: its files listed, taps against raw_dim against fne.dim, its
    preparation, its graph's input and output shapes, its statistics' shapes."""
    mf, at = directory / "bundle.json", where(i)
    for name in (v["onnx"], f["stats"]):
        if name not in m["files"]:
            raise BundleError(f"{mf}: {name} ({at}vision.onnx or {at}fne.stats) has no sha256 in files")
    if sum(tap["channels"] for tap in v["taps"]) != v["raw_dim"]:
        raise BundleError(f"{mf}: {at}vision.taps add up to {sum(x['channels'] for x in v['taps'])}, "
                          f"{at}vision.raw_dim is {v['raw_dim']}")
    if f["dim"] != v["raw_dim"]:
        raise BundleError(f"{mf}: {at}fne.dim {f['dim']} != {at}vision.raw_dim {v['raw_dim']}")
    _check_prepare(mf, v.get("prepare"), at)
    shapes = _io_shapes(directory / v["onnx"])
    side = v["resize"] if v["crop_mode"] == "windowed" else v["input_size"]  # windowed: the whole image
    want = {v["input_name"]: ["N", 3, side, side], v["output_name"]: ["N", v["raw_dim"]]}
    for name, shape in want.items():
        got = shapes.get(name)
        if got is None or [g if isinstance(g, int) else "N" for g in got] != shape:
            raise BundleError(f"{directory / v['onnx']}: tensor {name!r} has shape {got}, expected {shape}")
    stats = load_file(str(directory / f["stats"]))
    for k in ("mean", "std"):
        if k not in stats or stats[k].shape != (f["dim"],) or stats[k].dtype != np.float32:
            raise BundleError(f"{directory / f['stats']}: tensor {k!r} must be float32 [{f['dim']}]")
    return Backbone(v, f, stats["mean"], stats["std"])


def _hubness(directory: Path, m: dict) -> np.ndarray | None:
    """The optional hubness section (docs/bundle.md): checked as strictly as the rest."""
    hb = m.get("hubness")
    if hb is None:
        return None
    mf = directory / "bundle.json"
    if m["similarity"] != "cosine":
        raise BundleError(f"{mf}: hubness offsets cosine scores; this bundle's similarity is {m['similarity']!r}")
    if hb.get("bank") not in m["files"]:
        raise BundleError(f"{mf}: hubness.bank {hb.get('bank')!r} has no sha256 in files")
    try:
        hubness.section(hb["captions"], hb["k"], hb["alpha"], hb.get("seed", 0), "")
        return hubness.read(directory / hb["bank"], hb["captions"], m["projection"]["joint_dim"])
    except (KeyError, TypeError) as e:
        raise BundleError(f"{mf}: hubness needs bank, captions, k and alpha ({e!r})") from None
    except ValueError as e:
        raise BundleError(f"{directory / hb['bank']}: {e}") from None


def _hubness_images(directory: Path, m: dict) -> np.ndarray | None:
    """The hubness section's optional `annotation` (the captions' offsets against a bank of training images),
    checked as `_hubness` checks the captions' bank (which has been checked already)."""
    an = m.get("hubness", {}).get("annotation")
    if an is None:
        return None
    mf = directory / "bundle.json"
    if not isinstance(an, dict):
        raise BundleError(f"{mf}: hubness.annotation must be an object, not {an!r}")
    if an.get("bank") not in m["files"]:
        raise BundleError(f"{mf}: hubness.annotation.bank {an.get('bank')!r} has no sha256 in files")
    try:
        hubness.annotation(an["images"], an["k"], an["alpha"], "")
        return hubness.read(directory / an["bank"], an["images"], m["projection"]["joint_dim"])
    except (KeyError, TypeError) as e:
        raise BundleError(f"{mf}: hubness.annotation needs bank, images, k and alpha ({e!r})") from None
    except ValueError as e:
        raise BundleError(f"{directory / an['bank']}: {e}") from None


def _check_prepare(mf: Path, prep, at: str = "") -> None:
    """`vision.prepare`, when present: {"resize": [width, height], "filter": one the server implements}."""
    if prep is None:
        return
    ok = (isinstance(prep, dict) and set(prep) == {"resize", "filter"} and isinstance(prep["resize"], list)
          and len(prep["resize"]) == 2
          and all(isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 16384 for n in prep["resize"])
          and prep["filter"] in PREPARE_FILTERS)
    if not ok:
        raise BundleError(f"{mf}: {at}vision.prepare must be {{\"resize\": [width, height] in 1..16384, \"filter\": "
                          f"one of {sorted(PREPARE_FILTERS)}}}, not {prep!r}")
