"""The text graph with int8 GRU matrices (`python -m jointspace_train quantize-text BUNDLE`).

A sentence on the CPU is bound by memory: each GRU step reads the whole recurrent matrix (12 MB in float32 at
1,024-d), and the input projection reads the input matrix (12 MB at the paper's 1,024-d words). ONNX Runtime's
GRU op only takes float32, so the GRU node is replaced by the same recurrence written out as a Loop whose step
multiplies by an 8-bit copy of the recurrent matrix, after one product of all steps' inputs with an 8-bit copy
of the input matrix (com.microsoft MatMulNBits, blocks of 32 along the input, one float32 scale each, int8
arithmetic: accuracy_level 4). Everything around the GRU node
(embedding, the state at each sentence's last token, normalisation) stays as exported, so the graph keeps the
bundle contract: ids [N,T] + lengths [N] -> embedding [N, joint_dim].

The word table is stored in float16 and cast back to float32 after the Gather (only the sentence's rows): at
the paper's 1,024-d words it would be 30 MB in float32, which a committed bundle cannot afford.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from ..bundle import contract

BITS = 8
NOTE = ("int8 recurrent matrix (MatMulNBits, 8 bits, block {block}, accuracy_level 4), "
        "int8 input matrix (block 32), {table} word table")
WORD_TABLES = ("float16", "int8")


def _quantize(m: np.ndarray, block: int):
    """m [N, K] -> (codes [N, ceil(K/block), block] uint8 with zero point 128, scales [N*ceil(K/block)]
    float32); a K that is not a multiple of the block is padded with zeros, as MatMulNBits expects."""
    n, k = m.shape
    m = np.pad(m, ((0, 0), (0, -k % block)))
    blocks = m.reshape(n, -1, block)
    scale = np.maximum(np.abs(blocks).max(axis=2, keepdims=True), 1e-12) / 127.0
    q = np.clip(np.round(blocks / scale), -128, 127).astype(np.int32) + 128
    return q.astype(np.uint8), scale.reshape(-1).astype(np.float32)


def int8_text_graph(model: onnx.ModelProto, word_table: str = "float16") -> tuple[onnx.ModelProto, list[int]]:
    """The exported text graph with each GRU node rewritten (one, or one per member of a stacked model) and
    each word table stored in `word_table` ("float16", or "int8" with a float32 scale per word, which a
    stacked bundle needs to stay within the committed budget); returns the model and each GRU's block size."""
    graph = model.graph
    blocks = []
    # One at a time, found afresh: rewriting one re-lays the node list. The first GRU's names are the ones
    # a single-GRU graph always had.
    while gru := next((n for n in graph.node if n.op_type == "GRU"), None):
        blocks.append(_int8_gru(graph, gru, "q_" if not blocks else f"q{len(blocks)}_"))
    if not blocks and not any(n.op_type == "LSTM" for n in graph.node):
        raise ValueError("no GRU or LSTM node in the text graph")
    # An LSTM keeps ONNX Runtime's float32 LSTM op: only its word table shrinks (no int8 recurrence for it yet).
    _small_word_tables(graph, word_table)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(h.make_opsetid("com.microsoft", 1))
    onnx.checker.check_model(model)
    return model, blocks


def _int8_gru(graph: onnx.GraphProto, gru: onnx.NodeProto, p: str) -> int:
    """Replaces one GRU node by the int8 Loop, its additions named with prefix `p`; returns its block size."""
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
    block = next((bs for bs in (32, 16) if hidden % bs == 0), None)
    if block is None:
        raise ValueError(f"hidden size {hidden} is not a multiple of 16")
    codes, scales = _quantize(R, block)
    wcodes, wscales = _quantize(W, 32)
    graph.initializer.extend([
        nh.from_array(wcodes, p + "Wq"), nh.from_array(wscales, p + "Ws"), nh.from_array(B[:3 * hidden], p + "Wb"),
        nh.from_array(codes, p + "Rq"), nh.from_array(scales, p + "Rs"), nh.from_array(B[3 * hidden:], p + "Rb"),
        nh.from_array(np.array([hidden] * 3, np.int64), p + "split3"), nh.from_array(np.array(True), p + "true"),
        nh.from_array(np.array([0], np.int64), p + "zero"), nh.from_array(np.array([1], np.int64), p + "one"),
    ])
    step = h.make_graph([
        h.make_node("Gather", [p + "XW", p + "i"], [p + "xt"], axis=0),
        h.make_node("MatMulNBits", [p + "h", p + "Rq", p + "Rs"], [p + "hr0"], domain="com.microsoft",
                    K=hidden, N=3 * hidden, bits=BITS, block_size=block, accuracy_level=4),
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
        h.make_node("MatMulNBits", [x, p + "Wq", p + "Ws"], [p + "XW0"], domain="com.microsoft",  # [T, N, 3H]:
                    K=W.shape[1], N=3 * hidden, bits=BITS, block_size=32, accuracy_level=4),  # all steps at once
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
    return block


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


def quantize_bundle(directory: str | Path, word_table: str = "float16") -> str:
    """Rewrites a bundle's text graph in place and its manifest's checksums; returns what was done."""
    directory = Path(directory)
    manifest = json.loads((directory / "bundle.json").read_text())
    path = directory / manifest["text"]["onnx"]
    model = onnx.load(str(path))
    if any(n.op_type == "Loop" for n in model.graph.node) or manifest.get("training", {}).get("text_graph"):
        raise ValueError(f"{path} is already quantized")
    model, blocks = int8_text_graph(model, word_table)
    onnx.save(model, str(path))
    note = (NOTE.format(block="/".join(map(str, sorted(set(blocks)))), table=word_table) if blocks
            else f"float32 LSTM, {word_table} word table")
    if len(blocks) > 1:
        note = f"{len(blocks)} stacked GRUs, each: {note}"
    manifest.setdefault("training", {})["text_graph"] = note
    contract.finish(directory, {k: v for k, v in manifest.items() if k != "files"})
    return note
