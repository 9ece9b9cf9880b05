"""The text graph of a closed-form bundle: the caption features of `caption_features` and a linear map, as ONNX.

ids [N, T] int64 and lengths [N] int64 in (docs/bundle.md, the text contract), embedding [N, joint_dim] out:

    embedding = sum over terms of (features_term(ids) @ M_term) + bias      (then / its L2 norm for cosine)

Each term's rows are folded into its map where that is smaller (rows @ M, one gather of joint-width rows), so a
TF-IDF or GloVe caption costs one gather and one small product per token.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .caption_features import Term

OPSET = 17


@dataclass(frozen=True)
class Mapped:
    """A feature block and the map applied to it ([k, joint], or None when the rows are already joint-wide)."""

    term: Term
    map: np.ndarray | None = None

    def folded(self) -> Mapped:
        if self.map is None:
            return self
        k, j = self.map.shape
        vocab = self.term.rows.shape[0]
        if vocab * j <= vocab * k + k * j:
            rows = (self.term.rows.astype(np.float64) @ self.map.astype(np.float64)).astype(np.float32)
            return Mapped(Term(self.term.weight, rows, self.term.norm))
        return self


def embed(blocks: list[Mapped], bias: np.ndarray, normalise: bool, ids: np.ndarray, lengths: np.ndarray):
    """The numpy reference of the graph (what the trainer measures)."""
    from .caption_features import features

    out = np.zeros((len(ids), len(bias)), np.float64)
    for b in blocks:
        f = features(b.term, ids, lengths).astype(np.float64)
        out += f @ b.map if b.map is not None else f
    out += bias
    if normalise:
        n = np.linalg.norm(out, axis=1, keepdims=True)
        out = np.where(n > 0, out / np.where(n > 0, n, 1), 0)
    return out.astype(np.float32)


def build(blocks: list[Mapped], bias: np.ndarray, normalise: bool, path: str | Path) -> None:
    blocks = [b.folded() for b in blocks]
    joint = int(len(bias))
    inits, nodes = [], []

    def const(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(op, inputs, output, **attrs):
        nodes.append(helper.make_node(op, inputs, [output], **attrs))
        return output

    const("zero", np.array(0, np.int64))
    const("one", np.array(1, np.int64))
    const("ax1", np.array([1], np.int64))
    const("ax2", np.array([2], np.int64))
    const("ax0", np.array([0], np.int64))
    const("tiny", np.array(1e-30, np.float32))
    const("unit", np.array(1.0, np.float32))
    shape = node("Shape", ["ids"], "ids_shape")
    t = node("Gather", [shape, "one"], "t_len", axis=0)
    rng = node("Range", ["zero", t, "one"], "positions")
    valid = node("Less", [node("Unsqueeze", [rng, "ax0"], "positions_row"),
                          node("Unsqueeze", ["lengths", "ax1"], "lengths_col")], "valid")
    mask = node("Cast", [valid], "mask", to=TensorProto.FLOAT)
    total = None
    for k, b in enumerate(blocks):
        w = node("Mul", [node("Gather", [const(f"weight{k}", b.term.weight), "ids"], f"w{k}_raw", axis=0), mask],
                 f"w{k}")
        rows = node("Gather", [const(f"rows{k}", b.term.rows), "ids"], f"rows{k}_tok", axis=0)  # [N,T,k]
        w_row = node("Unsqueeze", [w, "ax1"], f"w{k}_row")                                      # [N,1,T]
        s = node("Squeeze", [node("MatMul", [w_row, rows], f"sum{k}_3d"), "ax1"], f"sum{k}")     # [N,k]
        if b.term.norm == "l2":
            same = node("Cast", [node("Equal", [node("Unsqueeze", ["ids", "ax2"], f"ids{k}_col"),
                                                node("Unsqueeze", ["ids", "ax1"], f"ids{k}_row")], f"same{k}_b")],
                        f"same{k}", to=TensorProto.FLOAT)
            q = node("MatMul", [same, node("Unsqueeze", [w, "ax2"], f"w{k}_col")], f"q{k}")       # [N,T,1]
            n2 = node("Squeeze", [node("MatMul", [w_row, q], f"n2{k}_3d"), "ax2"], f"n2{k}")     # [N,1]
            d = node("Sqrt", [node("Max", [n2, "tiny"], f"n2{k}_safe")], f"den{k}")
            s = node("Div", [s, d], f"feat{k}")
        elif b.term.norm == "count":
            c = node("ReduceSum", [w, "ax1"], f"count{k}", keepdims=1)
            s = node("Div", [s, node("Max", [c, "unit"], f"den{k}")], f"feat{k}")
        if b.map is not None:
            s = node("MatMul", [s, const(f"map{k}", np.asarray(b.map, np.float32))], f"mapped{k}")
        total = s if total is None else node("Add", [total, s], f"total{k}")
    out = "embedding" if not normalise else "unnormalised"
    node("Add", [total, const("bias", np.asarray(bias, np.float32))], out)
    if normalise:
        sq = node("ReduceSum", [node("Mul", [out, out], "squares"), "ax1"], "norm2", keepdims=1)
        node("Div", [out, node("Sqrt", [node("Max", [sq, "tiny"], "norm2_safe")], "norm")], "embedding")
    used = {i for n in nodes for i in n.input}  # constants this graph's feature modes do not use would make
    inits = [t for t in inits if t.name in used]  # ONNX Runtime warn at every load
    graph = helper.make_graph(
        nodes, "closed_form_text",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", "T"]),
         helper.make_tensor_value_info("lengths", TensorProto.INT64, ["N"])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["N", joint])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="jointspace",
                              ir_version=9)  # what ONNX Runtime and the server's ort read
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
