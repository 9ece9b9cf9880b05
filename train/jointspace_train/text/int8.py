"""The text graph with int8 GRU matrices (`python -m jointspace_train quantize-text BUNDLE`).

A sentence on the CPU is bound by memory: each GRU step reads the whole recurrent matrix (12 MB in float32 at
1,024-d), and the input projection reads the input matrix (12 MB at the paper's 1,024-d words). ONNX Runtime's
GRU op only takes float32, so the GRU node is replaced by the same recurrence written out as a Loop whose step
multiplies by an int8 copy of the recurrent matrix, after one product of all steps' inputs with an int8 copy of
the input matrix. Each product is MatMulInteger: the weights int8 with a float32 scale per output column, the
activations rounded to uint8 per row (symmetric about 128, a scale per row, so a sentence's codes do not depend
on the sentences batched with it), int32 sums scaled back. On a 2-core AVX2 CPU that form encodes a Flickr8k
caption in 1.8-2.4 ms, against 3.6-4.0 ms for com.microsoft MatMulNBits (8-bit blocks of 32, accuracy level 4),
the form bundles had before: `quantize-text` turns such a graph into this one (`per_column`).
Everything around the GRU node (embedding, the state at each sentence's last token, normalisation) stays as
exported, so the graph keeps the bundle contract: ids [N,T] + lengths [N] -> embedding [N, joint_dim].

The word table is stored in float16 and cast back to float32 after the Gather (only the sentence's rows): at
the paper's 1,024-d words it would be 30 MB in float32, which a committed bundle cannot afford.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from ..bundle import contract

BLOCK_BITS = 8  # MatMulNBits' width in the earlier form (`per_column` reads it)
NOTE = "int8 GRU matrices (MatMulInteger, a scale per output column, uint8 activations per row), {table} word table"
WORD_TABLES = ("float16", "int8")


def _columns(m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """m [N, K] (ONNX's GRU layout: a row per output) -> (B [K, N] int8, MatMulInteger's right operand, and
    scales [N] float32): each output column rounded to 127 steps of its own largest magnitude."""
    scale = np.maximum(np.abs(m).max(axis=1), 1e-12) / 127.0
    q = np.clip(np.round(m / scale[:, None]), -127, 127).astype(np.int8)
    return np.ascontiguousarray(q.T), scale.astype(np.float32)


def _constants(graph: onnx.GraphProto, p: str) -> None:
    """What each product of prefix `p` rounds its activations with (added once per GRU)."""
    if any(i.name == p + "c127" for i in graph.initializer):
        return
    graph.initializer.extend([
        nh.from_array(np.array(127.0, np.float32), p + "c127"), nh.from_array(np.array(128.0, np.float32), p + "c128"),
        nh.from_array(np.array(1e-30, np.float32), p + "tiny"), nh.from_array(np.array(128, np.uint8), p + "zp"),
    ])


def _product(x: str, w: str, s: str, y: str, p: str) -> list[onnx.NodeProto]:
    """y = x @ (w * s): x [..., K] float32 rounded per row to uint8 about 128 (scale max|row| / 127, so
    |code - 128| <= 127 and no clip is needed), times w [K, N] int8, the int32 sums scaled back by the row's
    scale and the column's. `p` is the GRU's prefix (its constants), `y` names the intermediates."""
    t = y + "_"
    return [
        h.make_node("Abs", [x], [t + "abs"]),
        h.make_node("ReduceMax", [t + "abs"], [t + "max"], axes=[-1], keepdims=1),
        h.make_node("Max", [t + "max", p + "tiny"], [t + "max1"]),
        h.make_node("Div", [t + "max1", p + "c127"], [t + "xs"]),
        h.make_node("Div", [x, t + "xs"], [t + "xd"]),
        h.make_node("Round", [t + "xd"], [t + "xr"]),
        h.make_node("Add", [t + "xr", p + "c128"], [t + "xu"]),
        h.make_node("Cast", [t + "xu"], [t + "xq"], to=TP.UINT8),
        h.make_node("MatMulInteger", [t + "xq", w, p + "zp"], [t + "acc"]),
        h.make_node("Cast", [t + "acc"], [t + "accf"], to=TP.FLOAT),
        h.make_node("Mul", [t + "accf", t + "xs"], [t + "rows"]),
        h.make_node("Mul", [t + "rows", s], [y]),
    ]


def int8_text_graph(model: onnx.ModelProto, word_table: str = "float16") -> tuple[onnx.ModelProto, int]:
    """The exported text graph with each GRU node rewritten (one, or one per member of a stacked model) and
    each word table stored in `word_table` ("float16", or "int8" with a float32 scale per word, which a
    stacked bundle needs to stay within the committed budget); returns the model and how many GRUs it has."""
    graph = model.graph
    grus = 0
    # One at a time, found afresh: rewriting one re-lays the node list. The first GRU's names are the ones
    # a single-GRU graph always had.
    while gru := next((n for n in graph.node if n.op_type == "GRU"), None):
        _int8_gru(graph, gru, "q_" if not grus else f"q{grus}_")
        grus += 1
    if not grus and not any(n.op_type == "LSTM" for n in graph.node):
        raise ValueError("no GRU or LSTM node in the text graph")
    # An LSTM keeps ONNX Runtime's float32 LSTM op: only its word table shrinks (no int8 recurrence for it yet).
    _small_word_tables(graph, word_table)
    onnx.checker.check_model(model)
    return model, grus


def _int8_gru(graph: onnx.GraphProto, gru: onnx.NodeProto, p: str) -> None:
    """Replaces one GRU node by the int8 Loop, its additions named with prefix `p`."""
    attrs = {a.name: h.get_attribute_value(a) for a in gru.attribute}
    if attrs.get("linear_before_reset") != 1 or attrs.get("direction", b"forward") not in (b"forward", "forward"):
        raise ValueError(f"only a forward GRU with linear_before_reset=1 (PyTorch's) is handled: {attrs}")
    init = {i.name: nh.to_array(i) for i in graph.initializer}
    x, w, r, b = gru.input[:4]
    h0 = gru.input[5] if len(gru.input) > 5 else ""
    if not h0:
        raise ValueError("the GRU node has no initial state input")
    W, R, B = init[w][0], init[r][0], init[b][0]
    hidden = R.shape[1]
    (w8, ws), (r8, rs) = _columns(W), _columns(R)
    graph.initializer.extend([
        nh.from_array(w8, p + "W8"), nh.from_array(ws, p + "Wcol"), nh.from_array(B[:3 * hidden], p + "Wb"),
        nh.from_array(r8, p + "R8"), nh.from_array(rs, p + "Rcol"), nh.from_array(B[3 * hidden:], p + "Rb"),
        nh.from_array(np.array([hidden] * 3, np.int64), p + "split3"), nh.from_array(np.array(True), p + "true"),
        nh.from_array(np.array([0], np.int64), p + "zero"), nh.from_array(np.array([1], np.int64), p + "one"),
    ])
    _constants(graph, p)
    step = h.make_graph([
        h.make_node("Gather", [p + "XW", p + "i"], [p + "xt"], axis=0),
        *_product(p + "h", p + "R8", p + "Rcol", p + "hr0", p),
        h.make_node("Add", [p + "hr0", p + "Rb"], [p + "hr"]),
        h.make_node("Split", [p + "xt", p + "split3"], [p + "xz", p + "xr", p + "xh"], axis=1),
        h.make_node("Split", [p + "hr", p + "split3"], [p + "hz", p + "hrr", p + "hh"], axis=1),
        h.make_node("Add", [p + "xz", p + "hz"], [p + "z0"]), h.make_node("Sigmoid", [p + "z0"], [p + "z"]),
        h.make_node("Add", [p + "xr", p + "hrr"], [p + "r0"]), h.make_node("Sigmoid", [p + "r0"], [p + "r"]),
        h.make_node("Mul", [p + "r", p + "hh"], [p + "rh"]), h.make_node("Add", [p + "xh", p + "rh"], [p + "n0"]),
        h.make_node("Tanh", [p + "n0"], [p + "n"]),
        # h' = (1 - z) * n + z * h = n + z * (h - n)
        h.make_node("Sub", [p + "h", p + "n"], [p + "d"]), h.make_node("Mul", [p + "z", p + "d"], [p + "zd"]),
        h.make_node("Add", [p + "n", p + "zd"], [p + "hn"]),
        h.make_node("Identity", [p + "hn"], [p + "scan"]),
        h.make_node("Identity", [p + "cond"], [p + "cond_out"]),
    ], "gru_step" if p == "q_" else p + "gru_step",
        [h.make_tensor_value_info(p + "i", TP.INT64, []), h.make_tensor_value_info(p + "cond", TP.BOOL, []),
         h.make_tensor_value_info(p + "h", TP.FLOAT, ["N", hidden])],
        [h.make_tensor_value_info(p + "cond_out", TP.BOOL, []),
         h.make_tensor_value_info(p + "hn", TP.FLOAT, ["N", hidden]),
         h.make_tensor_value_info(p + "scan", TP.FLOAT, ["N", hidden])])
    y, y_h = (list(gru.output) + ["", ""])[:2]
    nodes = [
        *_product(x, p + "W8", p + "Wcol", p + "XW0", p),  # [T, N, 3H]: all steps at once
        h.make_node("Add", [p + "XW0", p + "Wb"], [p + "XW"]),
        h.make_node("Shape", [x], [p + "xshape"]),
        h.make_node("Gather", [p + "xshape", p + "zero"], [p + "T1"], axis=0),
        h.make_node("Squeeze", [p + "T1"], [p + "T"]),
        h.make_node("Squeeze", [h0, p + "zero"], [p + "h0"]),                 # [1, N, H] -> [N, H]
        h.make_node("Loop", [p + "T", p + "true", p + "h0"], [p + "hlast", p + "all"], body=step),
    ]
    if y:
        nodes.append(h.make_node("Unsqueeze", [p + "all", p + "one"], [y]))  # GRU's Y: [T, 1, N, H]
    if y_h:
        nodes.append(h.make_node("Unsqueeze", [p + "hlast", p + "zero"], [y_h]))
    kept = list(graph.node)
    at = kept.index(gru)
    del kept[at]
    del graph.node[:]
    graph.node.extend(kept[:at] + nodes + kept[at:])
    for name in (w, r, b):
        if not any(name in n.input for n in graph.node):
            graph.initializer.remove(next(i for i in graph.initializer if i.name == name))


def _blocks_to_float(codes: np.ndarray, scales: np.ndarray, k: int) -> np.ndarray:
    """MatMulNBits' 8-bit weights (codes [N, K/block, block] uint8 about 128, a float32 scale a block) as the
    float matrix [N, K] they stand for, any padding past K dropped."""
    n = codes.shape[0]
    return ((codes.astype(np.float32) - 128.0) * scales.reshape(n, -1, 1)).reshape(n, -1)[:, :k]


def per_column(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """A graph of the earlier int8 form (each GRU matrix a MatMulNBits of 8-bit blocks) in the per-column form
    above: each block matrix dequantized exactly and rounded again per output column (for bundles whose float
    weights are gone). Returns the model and how many products were rewritten."""
    graph = model.graph
    init = {i.name: i for i in graph.initializer}

    def rewrite(g: onnx.GraphProto) -> int:
        n_done, out = 0, []
        for node in g.node:
            for a in node.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    n_done += rewrite(a.g)
            if node.op_type != "MatMulNBits":
                out.append(node)
                continue
            attrs = {a.name: h.get_attribute_value(a) for a in node.attribute}
            if attrs.get("bits") != BLOCK_BITS or len(node.input) > 3:
                raise ValueError(f"{node.name or node.output[0]}: only 8-bit MatMulNBits without zero points or "
                                 f"bias is handled: {attrs}")
            x, qname, sname = node.input
            p = re.match(r"(q\d*_)", qname).group(1)  # the GRU's prefix
            w8, wcol = qname[:-1] + "8", qname[:-1] + "col"
            if w8 not in init:
                m = _blocks_to_float(nh.to_array(init[qname]), nh.to_array(init[sname]), attrs["K"])
                q, s = _columns(m)
                init[w8], init[wcol] = nh.from_array(q, w8), nh.from_array(s, wcol)
                graph.initializer.extend([init[w8], init[wcol]])
                _constants(graph, p)
            out.extend(_product(x, w8, wcol, node.output[0], p))
            n_done += 1
        del g.node[:]
        g.node.extend(out)
        return n_done

    n = rewrite(graph)
    used = {i for node in _all_nodes(graph) for i in node.input}
    for name in [i.name for i in graph.initializer if i.name not in used]:
        graph.initializer.remove(next(i for i in graph.initializer if i.name == name))
    kept = [o for o in model.opset_import if o.domain != "com.microsoft"]
    del model.opset_import[:]
    model.opset_import.extend(kept)
    onnx.checker.check_model(model)
    return model, n


def _all_nodes(g: onnx.GraphProto):
    for node in g.node:
        yield node
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _all_nodes(a.g)


def int8_rows(t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A word table's int8 form: per row, scale = max|row| / 127 (float32) and the row rounded to int8 steps."""
    scale = (np.maximum(np.abs(t).max(axis=1), 1e-12) / 127.0).astype(np.float32)
    return np.clip(np.round(t / scale[:, None]), -127, 127).astype(np.int8), scale


def _small_word_tables(graph: onnx.GraphProto, kind: str) -> None:
    """Stores each embedding table (a float initializer a Gather reads ids from) as float16, or as int8 rows
    with a float32 scale each; only the sentence's rows are turned back into float32, after the lookup."""
    if kind not in WORD_TABLES:
        raise ValueError(f"word table {kind!r}: one of {', '.join(WORD_TABLES)}")
    tables = {i.name: i for i in graph.initializer if i.data_type == TP.FLOAT and len(i.dims) == 2}
    gathers = [n for n in graph.node if n.op_type == "Gather" and n.input[0] in tables]
    if not gathers:
        raise ValueError("no Gather from a word table in the text graph")
    for k, gather in enumerate(gathers):
        table, p = tables[gather.input[0]], "q_" if k == 0 else f"q{k}_"
        rows, small = gather.output[0], p + ("rows16" if kind == "float16" else "rows8")
        gather.output[0] = small
        at = list(graph.node).index(gather) + 1
        t = nh.to_array(table)
        if kind == "float16":
            table.CopyFrom(nh.from_array(t.astype(np.float16), table.name))
            graph.node.insert(at, h.make_node("Cast", [small], [rows], to=TP.FLOAT))
            continue
        q, scale = int8_rows(t)
        table.CopyFrom(nh.from_array(q, table.name))
        graph.initializer.append(nh.from_array(scale, p + "row_scale"))
        graph.initializer.append(nh.from_array(np.array([-1], np.int64), p + "last_axis"))
        for j, node in enumerate([
            h.make_node("Cast", [small], [p + "rows8f"], to=TP.FLOAT),
            h.make_node("Gather", [p + "row_scale", gather.input[1]], [p + "scales"], axis=0),
            h.make_node("Unsqueeze", [p + "scales", p + "last_axis"], [p + "scales1"]),
            h.make_node("Mul", [p + "rows8f", p + "scales1"], [rows]),
        ]):
            graph.node.insert(at + j, node)


def _ops(model: onnx.ModelProto) -> set[str]:
    return {n.op_type for n in _all_nodes(model.graph)}


def quantize_bundle(directory: str | Path, word_table: str = "float16", cache: str | Path | None = None) -> str:
    """Rewrites a bundle's text graph in place and its manifest's checksums; returns what was done. A float
    graph gets the int8 GRU matrices; a graph of the earlier MatMulNBits form is turned into the per-column
    form (its word table kept as it is). A bundle with the whole GloVe vocabulary has its base graph rewritten
    and its vocabulary graph rebuilt from it (the GloVe package fetched into `cache`)."""
    from . import vocabulary as whole  # it builds on this module's graphs; imported late to keep them apart

    directory = Path(directory)
    manifest = json.loads((directory / "bundle.json").read_text())
    vocab = manifest["text"].get("vocabulary")
    path = directory / (vocab["from"]["onnx"] if vocab else manifest["text"]["onnx"])
    model = onnx.load(str(path))
    ops = _ops(model)
    if "MatMulNBits" in ops:
        model, products = per_column(model)
        table = next(i.data_type for i in model.graph.initializer if i.name == "embed.weight")
        note = NOTE.format(table="int8" if table == TP.INT8 else "float16") + ", rounded from 8-bit blocks of 32"
        grus = products // 2
    elif "Loop" in ops or manifest.get("training", {}).get("text_graph"):
        raise ValueError(f"{path} is already quantized")
    else:
        model, grus = int8_text_graph(model, word_table)
        note = NOTE.format(table=word_table) if grus else f"float32 LSTM, {word_table} word table"
    if grus > 1:
        note = f"{grus} stacked GRUs, each: {note}"
    onnx.save(model, str(path))
    if vocab:
        if cache is None:
            raise ValueError(f"{directory}: its whole-vocabulary graph is rebuilt from GloVe: give a cache")
        whole.build(directory, vocab, cache)
    manifest.setdefault("training", {})["text_graph"] = note
    contract.finish(directory, {k: v for k, v in manifest.items() if k != "files"})
    return note
