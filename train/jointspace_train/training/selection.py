"""Model selection for `fit`: the closed-form systems of the other seed papers on the cached features, every
setting of a grid fitted on the training pairs and the best chosen on dev, optionally written as a bundle the
server runs unchanged.

- `linreg` (the course project's baseline): ridge least squares from the caption features (averaged GloVe) to
  the image features, ranked by squared distance (`similarity: euclidean`);
- `cca` (plain CCA, Euclidean distance in the canonical space) and `ncca` (Gong et al.'s normalized CCA: columns
  scaled by the correlations to a power, cosine);
- `sae` (Gong et al.'s stacked auxiliary embedding): an auxiliary normalized CCA between the photos and keyword
  tags, its projections stacked onto both views, then normalized CCA on the stacked views. The auxiliary set is
  a stand-in (no weakly annotated corpus is reachable): the training photos with their five captions reduced to
  keyword tags.

Every map is affine, so the image side is one W and a bias over the FNE code and the text side one ONNX graph
(text/feature_graph.py); the trainer measures the chosen model again through the bundle's own files.
"""
from __future__ import annotations

import itertools
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from ..evaluation import retrieval
from ..text import caption_features, feature_graph
from ..vision import features
from ..vision.weights import VisionWeights, graph_file
from . import closed_form
from .inputs import Extraction, Features, Prepared, prepare
from .run_dirs import open_run

METHODS = ("linreg", "cca", "ncca", "sae")
TEXTS = ("tfidf", "glove100", "glove50")


@dataclass(frozen=True)
class Grid:
    """The settings tried on dev (every combination)."""

    dims: tuple[int, ...]
    powers: tuple[float, ...]
    reg_image: tuple[float, ...]
    reg_text: tuple[float, ...]
    aux_dims: tuple[int, ...]
    aux_powers: tuple[float, ...]
    aux_weights: tuple[float, ...]


@dataclass(frozen=True)
class Fit:
    """What `fit` fits and where it goes: the features, the method, the caption features, the grid, the run dir."""

    source: VisionWeights
    extraction: Extraction
    feats: Features
    method: str
    text: str
    words: int         # TF-IDF dictionary size
    tags: int          # SAE: keyword tags
    grid: Grid
    max_tokens: int
    run_dir: str
    bundle_out: str | None
    argv: tuple[str, ...]


@dataclass
class Model:
    """One fitted candidate: the image side x @ w + bias, the text side's blocks and bias, the similarity."""

    settings: dict
    image_w: np.ndarray | None  # [dim, joint]; None: the identity (linreg's image space is the code itself)
    image_bias: np.ndarray
    text_blocks: list[feature_graph.Mapped]
    text_bias: np.ndarray
    similarity: str            # "cosine" or "euclidean"

    def images(self, x: np.ndarray) -> np.ndarray:
        v = np.asarray(x, np.float64) if self.image_w is None else np.asarray(x, np.float64) @ self.image_w
        return v + self.image_bias

    def texts(self, feats: list[np.ndarray]) -> np.ndarray:
        out = np.zeros((len(feats[0]), len(self.text_bias)))
        for f, b in zip(feats, self.text_blocks):
            out += f @ b.map
        return out + self.text_bias

    def scores(self, x, feats) -> np.ndarray:
        i, t = self.images(x), self.texts(feats)
        return closed_form.cosine(i, t) if self.similarity == "cosine" else closed_form.neg_sqdist(i, t)


@dataclass(frozen=True)
class Views:
    """Each split's image inputs, caption ids and the caption feature blocks (text, and SAE's tags)."""

    x: dict[str, np.ndarray]
    ids: dict[str, np.ndarray]
    lengths: dict[str, np.ndarray]
    owner: dict[str, np.ndarray]
    text: dict[str, np.ndarray]
    tags: dict[str, np.ndarray] | None
    text_term: caption_features.Term
    tag_term: caption_features.Term | None
    tag_ids: np.ndarray | None


def views(s: Fit, d: Prepared) -> Views:
    ids, lengths, owner = {}, {}, {}
    for sp, split in d.splits.items():
        caps, own = split.flat_captions()
        ids[sp], lengths[sp] = caption_features.encode(d.tok, caps, s.max_tokens)
        owner[sp] = np.asarray(own)
    if s.text == "tfidf":
        term = caption_features.tfidf_term(d.tok, ids["train"], lengths["train"], s.words)
    else:
        from ..text import glove

        vectors, found = glove.table(s.text, caption_features.vocab_words(d.tok), s.source.cache)
        words = caption_features.word_ids(d.tok)
        print(f"{s.text}: {found[words].sum()} of {len(words)} training words have a vector "
              f"({100 * found[words].mean():.1f}%)", flush=True)
        term = caption_features.glove_term(vectors, found)
    text = {sp: caption_features.features(term, ids[sp], lengths[sp]) for sp in ids}
    tags = tag_term = tag_ids = None
    if s.method == "sae":
        tag_ids = caption_features.tag_words(d.tok, ids["train"], lengths["train"], s.tags)
        tag_term = caption_features.tag_term(d.tok.get_vocab_size(), tag_ids)
        tags = {sp: caption_features.features(tag_term, ids[sp], lengths[sp]) for sp in ids}
    return Views(d.inputs, ids, lengths, owner, text, tags, term, tag_term, tag_ids)


def candidates(s: Fit, v: Views):
    """Every model of the grid, fitted on the training pairs."""
    g, x, t, own = s.grid, v.x["train"], v.text["train"], v.owner["train"]
    dim = x.shape[1]
    if s.method == "linreg":
        for reg in g.reg_text:
            r = closed_form.fit_ridge(t, x, own, reg)
            yield Model({"reg_text": reg}, None, np.zeros(dim), [feature_graph.Mapped(v.text_term, r.a)],
                        r.x_mean - r.t_mean @ r.a, "euclidean")
        return
    power = g.powers if s.method != "cca" else (0.0,)
    sim = "euclidean" if s.method == "cca" else "cosine"
    if s.method in ("cca", "ncca"):
        problem = closed_form.CCAProblem(x, t, own)
        for rx, ry in itertools.product(g.reg_image, g.reg_text):
            c = problem.fit(rx, ry, max(g.dims))
            for dims, p in itertools.product(g.dims, power):
                img, txt = c.top(dims, p)
                yield Model({"reg_image": rx, "reg_text": ry, "dims": dims, "power": p}, img.w,
                            -img.mean @ img.w, [feature_graph.Mapped(v.text_term, txt.w)], -txt.mean @ txt.w, sim)
        return
    # SAE: the auxiliary embedding between photos and their keyword tags (one row per photo: the union of its
    # captions' tags), stacked onto both views, then normalized CCA on the stacked views.
    photo_tags = np.zeros((len(x), len(v.tag_ids)))
    np.maximum.at(photo_tags, own, (v.tags["train"] > 0).astype(np.float64))
    aux_problem = closed_form.CCAProblem(x, photo_tags, np.arange(len(x)))
    for rx, ry, aux_dims in itertools.product(g.reg_image, g.reg_text, g.aux_dims):
        aux = aux_problem.fit(rx, ry, aux_dims)
        for p_aux, beta in itertools.product(g.aux_powers, g.aux_weights):
            ai, at = aux.top(aux_dims, p_aux)
            xs = np.hstack([x, beta * ai(x)])
            ts = np.hstack([t, beta * at(v.tags["train"])])
            c = closed_form.fit_cca(xs, ts, own, rx, ry, max(g.dims))
            k = t.shape[1]
            for dims, p in itertools.product(g.dims, g.powers):
                img, txt = c.top(dims, p)
                # x -> [x, beta (x - m_a) Wa] -> (. - m) Wf, collapsed to x @ W + b
                w = img.w[:dim] + beta * ai.w @ img.w[dim:]
                b = -img.mean[:dim] @ img.w[:dim] + (-beta * ai.mean @ ai.w - img.mean[dim:]) @ img.w[dim:]
                tb = -txt.mean[:k] @ txt.w[:k] + (-beta * at.mean @ at.w - txt.mean[k:]) @ txt.w[k:]
                blocks = [feature_graph.Mapped(v.text_term, txt.w[:k]),
                          feature_graph.Mapped(v.tag_term, beta * at.w @ txt.w[k:])]
                yield Model({"reg_image": rx, "reg_text": ry, "aux_dims": aux_dims, "aux_power": p_aux,
                             "aux_weight": beta, "dims": dims, "power": p}, w, b, blocks, tb, "cosine")


def feats_of(v: Views, split: str, model: Model) -> list[np.ndarray]:
    return [v.text[split]] + ([v.tags[split]] if len(model.text_blocks) == 2 else [])


def five_caption_metrics(model: Model, v: Views, split: str) -> dict:
    """The course project's variant, marked as such: each image's five captions averaged into one query (the
    features are averaged; every map is affine, so that is the average of the five mapped captions)."""
    own = v.owner[split]
    n = len(v.x[split])
    avg = [np.zeros((n, f.shape[1])) for f in feats_of(v, split, model)]
    for a, f in zip(avg, feats_of(v, split, model)):
        np.add.at(a, own, f)
        a /= np.bincount(own, minlength=n)[:, None]
    return retrieval.metrics(model.scores(v.x[split], avg), np.arange(n))


def run_fit(s: Fit) -> None:
    if s.bundle_out and s.feats.input != "fne":
        sys.exit("--bundle-out: the server computes FNE codes; the single-layer baseline is measured, not served")
    t0 = time.time()
    d = prepare(s.source, s.extraction, s.feats, 1)
    v = views(s, d)
    run, say = open_run(s.run_dir)

    say(f"fit {s.method} {s.text} on {s.feats}: views in {time.time() - t0:.0f} s")
    best, grid = None, []
    t1 = time.time()
    for m in candidates(s, v):
        dev = retrieval.metrics(m.scores(v.x["dev"], feats_of(v, "dev", m)), v.owner["dev"])
        grid.append({"settings": m.settings, "dev": dev})
        say(f"{json.dumps(m.settings)} dev rsum {dev['rsum']:.2f} ({dev['i2t_r1']} / {dev['t2i_r1']})")
        if best is None or dev["rsum"] > best[1]["rsum"]:
            best = (m, dev)
    grid_seconds = time.time() - t1
    model, dev = best
    test = retrieval.metrics(model.scores(v.x["test"], feats_of(v, "test", model)), v.owner["test"])
    result = {"method": s.method, "text": s.text, "features": asdict(s.feats), "settings": model.settings,
              "similarity": model.similarity, "dev": dev, "test": test, "grid": grid, "grid_seconds": grid_seconds,
              "fit_seconds": refit_seconds(s, v, model), "command": "python -m jointspace_train " + " ".join(s.argv)}
    if s.method == "linreg":
        result["test_five_captions_averaged"] = five_caption_metrics(model, v, "test")
    say(f"best {json.dumps(model.settings)}: dev {dev}\ntest {test}")
    if s.feats.input == "fne":  # measured again through its files, and its text cost, bundle kept or not
        result["bundle"] = write(s, d, v, model, result, say)
    (run / "result.json").write_text(json.dumps(result, indent=1) + "\n")


def refit_seconds(s: Fit, v: Views, model: Model) -> float:
    """How long the chosen setting alone takes to fit (the grid fits several)."""
    keys = {"dims": "dims", "powers": "power", "reg_image": "reg_image", "reg_text": "reg_text",
            "aux_dims": "aux_dims", "aux_powers": "aux_power", "aux_weights": "aux_weight"}
    only = {f: (model.settings[k],) if k in model.settings else getattr(s.grid, f) for f, k in keys.items()}
    t = time.time()
    next(candidates(replace(s, grid=Grid(**only)), v))
    return round(time.time() - t, 1)


def text_cost_ms(text_onnx: Path, tok, captions: list[str], max_tokens: int) -> float:
    """Median ms per sentence, one at a time, one ONNX Runtime thread (as docs/results.md measures)."""
    import onnxruntime as ort

    so = features.options(1)
    sess = ort.InferenceSession(str(text_onnx), so, providers=["CPUExecutionProvider"])
    times = []
    for c in captions:
        ids, lengths = caption_features.encode(tok, [c], max_tokens)
        t = time.perf_counter()
        sess.run(None, {"ids": ids, "lengths": lengths})
        times.append(1000 * (time.perf_counter() - t))
    return round(statistics.median(times), 3)


def write(s: Fit, d: Prepared, v: Views, model: Model, result: dict, say) -> dict:
    """The bundle, then its dev and test metrics again through its own files on the cached codes."""
    from ..bundle import contract, pipeline, writer
    from ..data import flickr8k
    from ..vision import backbones

    out = Path(s.bundle_out or Path(s.run_dir) / "bundle")
    vis = backbones.vision_section(d.weights, s.feats.tap_point, s.feats.crop)
    vis["prepare"] = flickr8k.PREPARATION
    dim = v.x["train"].shape[1]
    w = np.eye(dim) if model.image_w is None else model.image_w
    training = {"dataset": "flickr8k", "split": "train", "loss": s.method, "method": s.method, "text": s.text,
                "crop_mode": s.feats.crop, "tap_point": s.feats.tap_point, "init_from": None,
                "hyperparameters": {**model.settings, "tfidf_words": s.words if s.text == "tfidf" else None,
                                    "tags": s.tags if s.method == "sae" else None},
                "train_seconds": result["fit_seconds"], "dev_metrics": result["dev"],
                "test_metrics": result["test"], "command": result["command"]}
    if s.method == "sae":
        training["auxiliary_set"] = ("stand-in: the Flickr8k training photos with their captions reduced to "
                                     f"{s.tags} keyword tags (no weakly annotated corpus is reachable)")
    writer.write_files(out, name=out.name, vision=vis, vision_onnx=graph_file(s.source, d.weights, s.feats.tap_point),
                       fne_mean=d.mean, fne_std=d.std, projection=w.T.astype(np.float32),
                       write_text=lambda p: feature_graph.build(model.text_blocks, model.text_bias,
                                                            model.similarity == "cosine", p),
                       tok=d.tok, max_tokens=s.max_tokens, similarity=model.similarity, use_abs=False,
                       training=training, projection_dtype=np.float32, bias=model.image_bias.astype(np.float32))
    p = pipeline.Pipeline(out, threads=0)
    through = {}
    for sp in ("dev", "test"):
        caps, own = d.splits[sp].flat_captions()
        through[sp] = retrieval.metrics(p.scores(p.project(v.x[sp].astype(np.int8)), p.embed_texts(caps)), own)
    caps, _ = d.splits["test"].flat_captions()
    cost = text_cost_ms(out / "text.onnx", d.tok, caps[:1000], s.max_tokens)
    manifest = json.loads((out / "bundle.json").read_text())
    manifest["training"].update(dev_metrics=through["dev"], test_metrics=through["test"],
                                test_metrics_source="trainer, the bundle's own files on the cached features",
                                text_ms_per_sentence=cost)
    contract.finish(out, manifest)
    say(f"bundle {out}: through its files dev {through['dev']}\ntest {through['test']}\ntext {cost} ms/sentence")
    return {"dir": str(out), "dev": through["dev"], "test": through["test"], "text_ms_per_sentence": cost}
