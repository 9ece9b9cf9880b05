"""A float16 copy of an FNE vision graph, for a GPU's tensor cores: the convolutions and their feature maps in
float16, each tap's spatial mean cast back to float32 where the graph leaves the feature maps, and the graph's
input and outputs float32, so the server feeds and reads it as any other.

The windowed crop mode's taps weight each position by its share of the five crops (`window_weights`): weights
of about 1/50,000, below float16's normal range. Here they are scaled to at most 1 and the weighted map is
averaged (GlobalAveragePool, which stays within range where a sum of a 256 x 256 map would not); the float32
side puts the scale back. A feature map never crosses to float32 whole, only its [N, C] mean.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def half_graph(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` (an FNE graph of `backbones.build`) with float16 arithmetic up to each tap's mean; a graph already in
    float16 is returned as it is."""
    if any(t.data_type == TensorProto.FLOAT16 for t in model.graph.initializer):
        return model
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    inits = {t.name: t for t in g.initializer}
    producers = {o: n for n in g.node for o in n.output}
    nodes, extra_inits = [], []
    # The taps' means, each produced in float16 and read in float32 by everything downstream of it.
    means = [n.output[0] for n in g.node if n.output[0].endswith("_mean")]
    for n in g.node:
        if n.op_type == "ReduceSum" and n.output[0] in means:
            nodes.extend(_windowed_mean(n, producers[n.input[0]], inits, extra_inits))
        elif n.output[0] in means:
            n.output[0] += "_16"
            nodes.append(n)
            nodes.append(_cast(n.output[0], n.output[0][:-3], TensorProto.FLOAT, f"{n.output[0]}_to32"))
        else:
            nodes.append(n)
    # Nodes that read the float32 means (the concatenation, a classifier head) keep float32 weights.
    wide = _downstream(nodes, set(means))
    keep32 = {i for n in nodes if id(n) in wide for i in n.input}
    for t in list(g.initializer) + extra_inits:
        if t.data_type == TensorProto.FLOAT and t.name not in keep32 and not t.name.endswith("_scale32"):
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float16), t.name))
    (inp,) = [i.name for i in g.input if i.name not in inits]
    for n in nodes:
        n.input[:] = [f"{inp}_16" if i == inp else i for i in n.input]
    nodes.insert(0, _cast(inp, f"{inp}_16", TensorProto.FLOAT16, f"{inp}_to16"))
    del g.node[:]
    g.node.extend(_ordered(nodes, {inp} | set(inits) | {t.name for t in extra_inits}))
    g.initializer.extend(extra_inits)
    # The windowed taps' ReduceSum axes are read by no one now.
    used = {i for n in g.node for i in n.input}
    kept = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(kept)
    del g.value_info[:]
    onnx.checker.check_model(m)
    return m


def _cast(src: str, dst: str, to: int, name: str) -> onnx.NodeProto:
    return helper.make_node("Cast", [src], [dst], to=to, name=name)


def _windowed_mean(reduce: onnx.NodeProto, mul: onnx.NodeProto, inits: dict, extra: list) -> list:
    """The windowed tap `Mul(x, window) -> ReduceSum` as `Mul(x, window / s) -> GlobalAveragePool` in float16,
    and the factor `s * H * W` applied in float32 after the cast, giving the tap's mean in float32. The pool
    sums in float32 (cuDNN's); CUDA's float16 ReduceMean did not: on VGG16's 256 x 256 maps it turned a
    quarter of the codes' features (docs/benchmarks.md, "GPU")."""
    (wname,) = [i for i in mul.input if i.endswith("_window")]
    w = numpy_helper.to_array(inits[wname]).astype(np.float64)
    s = float(w.max())
    inits[wname].CopyFrom(numpy_helper.from_array((w / s).astype(np.float32), wname))
    mean = reduce.output[0]
    scale = helper.make_tensor(f"{mean}_scale32", TensorProto.FLOAT, [], [s * w.shape[-1] * w.shape[-2]])
    extra.append(scale)
    return [
        helper.make_node("GlobalAveragePool", [reduce.input[0]], [f"{mean}_pool16"], name=f"{mean}_pool"),
        helper.make_node("Flatten", [f"{mean}_pool16"], [f"{mean}_avg16"], axis=1, name=f"{mean}_flat"),
        helper.make_node("Cast", [f"{mean}_avg16"], [f"{mean}_avg32"], to=TensorProto.FLOAT, name=f"{mean}_cast"),
        helper.make_node("Mul", [f"{mean}_avg32", scale.name], [mean], name=f"{mean}_scale"),
    ]


def _downstream(nodes: list, names: set) -> set:
    """ids of the nodes that read `names` or anything computed from them."""
    seen, reached, changed = set(names), set(), True
    while changed:
        changed = False
        for n in nodes:
            if id(n) not in reached and any(i in seen for i in n.input):
                reached.add(id(n))
                seen.update(n.output)
                changed = True
    return reached


def _ordered(nodes: list, known: set) -> list:
    """`nodes` in an order where each reads only what is known or made before it (ONNX requires it)."""
    out, left, known = [], list(nodes), set(known)
    while left:
        ready = [n for n in left if all(i in known or not i for i in n.input)]
        if not ready:
            raise ValueError("the graph has a cycle or an input nobody makes")
        for n in ready:
            out.append(n)
            known.update(n.output)
        left = [n for n in left if all(id(n) != id(r) for r in ready)]
    return out
