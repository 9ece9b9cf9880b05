import json
import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from jointspace_train.bundle import contract, writer
from jointspace_train.text import int8
from jointspace_train.training.model import StackedText, TextEncoder
from jointspace_train.vision import features


def _run(path, ids, lengths):
    # As the server runs it: on a CPU without VNNI, onnxruntime's fast uint8 x int8 sums would saturate.
    sess = ort.InferenceSession(str(path), features.options(), providers=["CPUExecutionProvider"])
    return sess.run(["embedding"], {"ids": ids, "lengths": lengths})[0]


@pytest.mark.parametrize("use_abs,table", [(False, "float16"), (True, "float16"), (False, "int8")])
def test_int8_text_graph_agrees_with_the_float_graph_and_ignores_padding(tmp_path, use_abs, table):
    torch.manual_seed(0)
    text = TextEncoder(50, 8, 32, use_abs=use_abs).eval()
    f32 = tmp_path / "f32.onnx"
    writer.export_text(text, f32)
    model, grus = int8.int8_text_graph(onnx.load(str(f32)), table)
    assert grus == 1 and not any(n.op_type == "GRU" for n in model.graph.node)
    types = {i.name: i.data_type for i in model.graph.initializer}
    want = onnx.TensorProto.FLOAT16 if table == "float16" else onnx.TensorProto.INT8
    assert types["embed.weight"] == want, types
    assert types["q_W8"] == types["q_R8"] == onnx.TensorProto.INT8, types
    q8 = tmp_path / "int8.onnx"
    onnx.save(model, str(q8))
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 12, 40).astype(np.int64)
    ids = np.zeros((40, 13), np.int64)
    for row, n in zip(ids, lengths):
        row[:n] = rng.integers(1, 50, n)
    a, b = _run(f32, ids, lengths), _run(q8, ids, lengths)
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    # The activations are rounded to 8 bits a row: on this 32-d toy about 0.9985 after 12 steps (the shipped
    # 1,024-d model: 0.99997, and the same Flickr8k figures).
    assert cos.min() > 0.998, cos.min()
    assert np.abs(a - b).max() > 0, "the recurrent matrix was not quantized"
    # One sentence at a time, unpadded, gives the batch's rows.
    alone = np.concatenate([_run(q8, ids[i:i + 1, :lengths[i]], lengths[i:i + 1]) for i in range(8)])
    np.testing.assert_allclose(alone, b[:8], atol=1e-6)


def padded_batch(seed, vocab, n=40, width=13):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, width - 1, n).astype(np.int64)
    ids = np.zeros((n, width), np.int64)
    for row, k in zip(ids, lengths):
        row[:k] = rng.integers(1, vocab, k)
    return ids, lengths


def test_a_stacked_text_graph_has_each_gru_and_word_table_quantized(tmp_path):
    torch.manual_seed(2)
    stacked = StackedText([TextEncoder(50, 8, 32).eval(), TextEncoder(50, 8, 16).eval()]).eval()
    f32 = tmp_path / "f32.onnx"
    writer.export_text(stacked, f32)
    model, grus = int8.int8_text_graph(onnx.load(str(f32)))
    assert grus == 2 and not any(n.op_type == "GRU" for n in model.graph.node)
    assert sum(n.op_type == "Loop" for n in model.graph.node) == 2
    halves = [i for i in model.graph.initializer if i.data_type == onnx.TensorProto.FLOAT16]
    assert len(halves) == 2  # both word tables
    q8 = tmp_path / "int8.onnx"
    onnx.save(model, str(q8))
    ids, lengths = padded_batch(3, 50)
    a, b = _run(f32, ids, lengths), _run(q8, ids, lengths)
    assert a.shape == (40, 48)
    np.testing.assert_allclose(np.linalg.norm(b, axis=1), 1.0, atol=1e-5)
    # each member's part is its own encoder's unit vector over sqrt(2)
    for part, n in ((slice(0, 32), 32), (slice(32, 48), 16)):
        cos = (a[:, part] * b[:, part]).sum(1) / np.linalg.norm(a[:, part], axis=1) / np.linalg.norm(b[:, part], axis=1)
        assert cos.min() > 0.999, (n, cos.min())
    with torch.no_grad():
        want = stacked.members[1](torch.from_numpy(ids), torch.from_numpy(lengths)).numpy() / np.sqrt(2)
    np.testing.assert_allclose(a[:, 32:], want, atol=1e-5)


def test_quantize_bundle_rewrites_the_fixture_once_and_keeps_it_valid(repo, tmp_path):
    d = tmp_path / "b"
    shutil.copytree(repo / "models" / "fixture-tiny", d)
    before = json.loads((d / "bundle.json").read_text())
    note = int8.quantize_bundle(d)
    b = contract.read(d)  # checksums verified
    assert b.manifest["files"]["text.onnx"] != before["files"]["text.onnx"]
    assert b.manifest["training"]["text_graph"] == note and "MatMulInteger" in note
    assert "float16 word table" in note
    with pytest.raises(ValueError, match="already quantized"):
        int8.quantize_bundle(d)


def test_an_lstm_graph_keeps_its_float_recurrence_and_shrinks_its_word_table(tmp_path):
    torch.manual_seed(2)
    text = TextEncoder(50, 8, 16, rnn="lstm").eval()
    f32 = tmp_path / "f32.onnx"
    writer.export_text(text, f32)
    model, grus = int8.int8_text_graph(onnx.load(str(f32)), "int8")
    assert grus == 0 and any(n.op_type == "LSTM" for n in model.graph.node)
    assert {i.name: i.data_type for i in model.graph.initializer}["embed.weight"] == onnx.TensorProto.INT8
    q8 = tmp_path / "q.onnx"
    onnx.save(model, str(q8))
    ids, lengths = padded_batch(3, 50)
    a, b = _run(f32, ids, lengths), _run(q8, ids, lengths)
    assert (a * b).sum(1).min() > 0.999 and np.abs(a - b).max() > 0


def _blocks(m, block):
    """The earlier form's rounding: 8-bit codes about 128 with a float32 scale per block of `block` inputs."""
    n, k = m.shape
    blocks = m.reshape(n, k // block, block)
    scale = np.abs(blocks).max(axis=2, keepdims=True) / 127.0
    return (np.round(blocks / scale) + 128).astype(np.uint8), scale.reshape(-1).astype(np.float32)


def test_per_column_turns_an_earlier_matmulnbits_product_into_todays_form(tmp_path):
    from onnx import helper as h
    from onnx import numpy_helper as nh

    rng = np.random.default_rng(4)
    w = rng.normal(size=(48, 64)).astype(np.float32)  # [N, K], as the GRU matrices are laid out
    codes, scales = _blocks(w, 32)
    graph = h.make_graph(
        [h.make_node("MatMulNBits", ["x", "q_Wq", "q_Ws"], ["y"], domain="com.microsoft", K=64, N=48, bits=8,
                     block_size=32, accuracy_level=4)], "g",
        [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["T", "N", 64])],
        [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["T", "N", 48])],
        [nh.from_array(codes, "q_Wq"), nh.from_array(scales, "q_Ws")])
    old = h.make_model(graph, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)])
    old.ir_version = 8
    new, products = int8.per_column(onnx.ModelProto.FromString(old.SerializeToString()))
    assert products == 1
    assert {n.op_type for n in new.graph.node} >= {"MatMulInteger"} and "MatMulNBits" not in {
        n.op_type for n in new.graph.node}
    assert {i.name for i in new.graph.initializer} >= {"q_W8", "q_Wcol"} and "q_Wq" not in {
        i.name for i in new.graph.initializer}
    assert all(o.domain != "com.microsoft" for o in new.opset_import)
    x = rng.normal(size=(3, 5, 64)).astype(np.float32)
    run = lambda m, a: ort.InferenceSession(m.SerializeToString(), features.options(),  # noqa: E731
                                            providers=["CPUExecutionProvider"]).run(None, {"x": a})[0]
    a, b = run(old, x), run(new, x)
    exact = x @ ((codes.astype(np.float32) - 128) * scales.reshape(48, 2, 1)).reshape(48, 64).T
    assert np.abs(b - exact).max() < 0.02 * np.abs(exact).max(), np.abs(b - exact).max()
    assert np.abs(a - exact).max() < 0.02 * np.abs(exact).max()
    # Each row is rounded on its own: a row alone gives what it gives among others.
    np.testing.assert_allclose(run(new, x[:1, :1]), b[:1, :1], atol=1e-6)
