"""Raw vision features for a dataset: the vision graph over every image's crops, averaged per image.

Resumable: rows land in a memory-mapped .npy under the cache (outside git) and a done-mask is replaced
atomically after each batch, so an interrupted run picks up where it stopped. The cache key is the graph's
sha256 and the crop mode, so a different graph never reuses stale rows.

With ten crops each crop's row is kept too (`crops.npy`, float16 [N, 10, D]): the trainer can then draw one
crop per image per epoch as augmentation, while dev, test and the server use the mean over the ten.
"""
from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from . import fne, images


def default_cache() -> Path:
    return Path(os.environ.get("JOINTSPACE_CACHE", Path.home() / ".cache" / "jointspace"))


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def has_vnni(cpuinfo: str | None = None) -> bool:
    """Whether the CPU has a VNNI dot product (AVX-512 or AVX), as the server asks (crates/embed/src/runtime.rs);
    a machine that is not x86 counts as having it, as there."""
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64"):
        return True
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), [])
    return "avx512_vnni" in flags or "avx_vnni" in flags


def options(threads: int = 0):
    """ONNX Runtime's session options as the server sets them. On an x86 CPU without VNNI, onnxruntime's
    uint8 x int8 product sums pairs in int16 and saturates, which moved a fifth of the VGG16 bundle's ternary
    codes; its precise path does not. With VNNI, which never saturates, both paths give the same features and the
    precise one takes twice as long (0.20 against 0.10 s a photo through the VGG16 bundle's int8 graph), so it is
    asked for only without."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if not has_vnni():
        so.add_session_config_entry("session.x64quantprecision", "1")
    if threads:
        so.intra_op_num_threads = threads
    return so


def session(graph: str | Path, threads: int = 0):
    import onnxruntime as ort

    return ort.InferenceSession(str(graph), options(threads), providers=["CPUExecutionProvider"])


def _integer(graph: str | Path) -> bool:
    """Whether the graph multiplies in integers (an int8 graph), whose cached features must come from a product
    that does not saturate (above)."""
    import onnx

    ops = {n.op_type for n in onnx.load(str(graph)).graph.node}
    return bool(ops & {"QuantizeLinear", "QLinearConv", "ConvInteger", "MatMulInteger"})


def embed_images(sess, vision: dict, paths, crop_mode: str) -> np.ndarray:
    """[len(paths), raw_dim]: one graph run for all crops of all the given images."""
    x = np.concatenate([images.preprocess(str(p), vision, crop_mode) for p in paths])
    out = sess.run([vision["output_name"]], {vision["input_name"]: x})[0]
    return out.reshape(len(paths), -1, out.shape[1]).mean(axis=1, dtype=np.float32)


def cache_dir(graph: str | Path, names: list[str], crop_mode: str, cache: str | Path | None = None,
              tag: str = "") -> Path:
    """Keyed by the graph's sha256, the crop mode and the image list, so nothing stale is ever reused; `tag`
    keeps features computed only approximately as the graph would (bfloat16) apart from the exact ones."""
    digest = sha256_file(graph)[:16]
    which = hashlib.sha256("\n".join(names).encode()).hexdigest()[:8]
    mode = f"{crop_mode}-{tag}" if tag else crop_mode
    if _integer(graph):  # not the saturating uint8 x int8 sums of caches made before `options`
        mode += "-precise"
    return Path(cache or default_cache()) / f"features-{digest}-{mode}-{which}"


def extract(graph: str | Path, vision: dict, image_dir: str | Path, names: list[str], crop_mode: str,
            cache: str | Path | None = None, batch_images: int = 4, threads: int = 0,
            progress: bool = True, run=None, prep_workers: int = 1, tag: str = "") -> np.ndarray:
    """Features [len(names), raw_dim] float32 for `names` (files in image_dir), computed or from the cache.

    `run` computes the graph's output from its input in place of an ONNX Runtime session over `graph` (the same
    network in PyTorch on a GPU: `pytorch.runner`); the cache is still keyed by the graph's sha256, as the
    features are that graph's (with `tag` naming an approximation such as bfloat16). `prep_workers` threads
    decode and crop the next batches meanwhile."""
    out_dir = cache_dir(graph, names, crop_mode, cache, tag)
    out_dir.mkdir(parents=True, exist_ok=True)
    dim = vision["raw_dim"]
    manifest = out_dir / "names.json"
    fpath, dpath, cpath = out_dir / "features.npy", out_dir / "done.npy", out_dir / "crops.npy"
    n_crops = images.N_CROPS[crop_mode]
    if manifest.exists() and json.loads(manifest.read_text()) == names and fpath.exists():
        feats = np.load(fpath, mmap_mode="r+")
        done = np.load(dpath) if dpath.exists() else np.zeros(len(names), bool)
    else:
        manifest.write_text(json.dumps(names))
        feats = np.lib.format.open_memmap(fpath, mode="w+", dtype=np.float32, shape=(len(names), dim))
        done = np.zeros(len(names), bool)
        np.save(dpath, done)
    per_crop = None
    if n_crops > 1:
        if cpath.exists():
            per_crop = np.load(cpath, mmap_mode="r+")
        else:
            # A cache written before crops were kept: its rows have no per-crop part, so they are redone.
            per_crop = np.lib.format.open_memmap(cpath, mode="w+", dtype=np.float16,
                                                 shape=(len(names), n_crops, dim))
            done[:] = False
    todo = np.flatnonzero(~done)
    if len(todo):
        if run is None:
            sess = session(graph, threads)

            def run(x):
                return sess.run([vision["output_name"]], {vision["input_name"]: x})[0]

        batches = [todo[i : i + batch_images] for i in range(0, len(todo), batch_images)]
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=len(names), initial=int(done.sum()), unit="img", desc=f"features {crop_mode}")
        image_dir = Path(image_dir)

        def prep(idx):
            return idx, np.concatenate([images.preprocess(str(image_dir / names[i]), vision, crop_mode) for i in idx])

        # Decode and crop the next batches on threads while the runtime works on this one.
        with ThreadPoolExecutor(prep_workers) as pool:
            ahead = max(prep_workers, 1)
            pending = [pool.submit(prep, b) for b in batches[:ahead]]
            for k in range(len(batches)):
                idx, x = pending.pop(0).result()
                if k + ahead < len(batches):
                    pending.append(pool.submit(prep, batches[k + ahead]))
                y = run(x).reshape(len(idx), -1, dim)
                feats[idx] = y.mean(axis=1, dtype=np.float32)
                feats.flush()
                if per_crop is not None:
                    per_crop[idx] = y
                    per_crop.flush()
                done[idx] = True
                tmp = out_dir / "done.tmp.npy"
                np.save(tmp, done)
                os.replace(tmp, dpath)
                if bar:
                    bar.update(len(idx))
        if bar:
            bar.close()
    return np.asarray(feats)


def crops_of(graph: str | Path, names: list[str], crop_mode: str, cache: str | Path | None = None,
             tag: str = "") -> np.ndarray:
    """The per-crop rows [len(names), n_crops, D] float16 (memory-mapped) that `extract` kept for a crop mode
    with more than one crop; call `extract` first."""
    path = cache_dir(graph, names, crop_mode, cache, tag) / "crops.npy"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no per-crop features; run `features --crop {crop_mode}` first")
    return np.load(path, mmap_mode="r")


def compare_graphs(v: dict, f: dict, mean: np.ndarray, std: np.ndarray, reference: tuple[Path, str],
                   other: tuple[Path, str], paths) -> dict:
    """How far graph `other`'s features and codes are from graph `reference`'s on `paths` (each graph with
    its crop mode), under one bundle's `vision` and `fne` sections and FNE statistics: the relative L2
    difference of the features, overall and per tap, and the code features that flip."""
    a = embed_images(session(reference[0]), v, paths, reference[1])
    w = embed_images(session(other[0]), v, paths, other[1])
    ca, cw = (fne.encode(x, mean, std, f["thresholds"], f["std_eps"]) for x in (a, w))

    def difference(sl: slice) -> np.ndarray:
        return np.linalg.norm(a[:, sl] - w[:, sl], axis=1) / np.maximum(np.linalg.norm(a[:, sl], axis=1), 1e-12)

    taps, off = {}, 0
    for t in v["taps"]:
        sl = slice(off, off + t["channels"])
        taps[t["name"]] = {"feature_difference": round(float(difference(sl).mean()), 4),
                           "code_flips": round(float((ca[:, sl] != cw[:, sl]).mean()), 4)}
        off += t["channels"]
    flips = (ca != cw).mean(axis=1)
    return {"photos": len(paths), "feature_difference_mean": round(float(difference(slice(None)).mean()), 4),
            "code_flips_mean": round(float(flips.mean()), 4), "code_flips_max": round(float(flips.max()), 4),
            "taps": taps}
