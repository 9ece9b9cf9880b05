import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from jointspace_train.bundle import writer
from jointspace_train.text import tokenizer
from jointspace_train.training.model import TextEncoder


@pytest.mark.parametrize("layers,rnn,table_dim", [(1, "gru", None), (2, "gru", None), (1, "lstm", None),
                                                  (2, "lstm", None), (1, "gru", 4), (1, "lstm", 4)])
def test_text_onnx_matches_torch_and_padding_changes_nothing(tmp_path, layers, rnn, table_dim):
    # Two layers: training reads the top layer's final state, the graph the top layer's output at the last token.
    # An LSTM's state is (h, c): training must read h. A narrow table (GloVe's width) is folded at export.
    torch.manual_seed(0)
    text = TextEncoder(30, 6, 12, use_abs=False, layers=layers, rnn=rnn, table_dim=table_dim).eval()
    path = tmp_path / "text.onnx"
    writer.export_text(text, path)
    ops = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert rnn.upper() in ops and "MatMul" not in ops, ops  # one recurrent node; the widening is in the table
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    sentences = [[5, 7, 9, 11, 13, 2, 3], [4, 4], [29], [8, 6, 10]]
    lengths = np.array([len(s) for s in sentences], np.int64)
    ids = np.zeros((4, 9), np.int64)  # padded beyond the longest, too
    for row, s in zip(ids, sentences):
        row[: len(s)] = s
    batch = sess.run(["embedding"], {"ids": ids, "lengths": lengths})[0]
    assert batch.shape == (4, 12)
    for k, s in enumerate(sentences):
        one = sess.run(["embedding"], {"ids": np.array([s], np.int64), "lengths": np.array([len(s)], np.int64)})[0]
        np.testing.assert_allclose(batch[k], one[0], atol=1e-6)
    with torch.no_grad():
        ref = text(torch.from_numpy(ids), torch.from_numpy(lengths)).numpy()
    np.testing.assert_allclose(batch, ref, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(batch, axis=1), 1, atol=1e-5)


def test_abs_option_is_inside_the_graph(tmp_path):
    torch.manual_seed(1)
    text = TextEncoder(10, 4, 8, use_abs=True).eval()
    writer.export_text(text, tmp_path / "t.onnx")
    out = ort.InferenceSession(str(tmp_path / "t.onnx")).run(
        None, {"ids": np.array([[2, 3, 4]], np.int64), "lengths": np.array([3], np.int64)})[0]
    assert (out >= 0).all() and abs(np.linalg.norm(out) - 1) < 1e-5


def test_tokenizer_ids_feed_the_graph(tmp_path):
    tok = tokenizer.build(["a dog runs", "a cat sleeps"])
    ids, lengths = tokenizer.encode_batch(tok, ["A dog sleeps .", "cat"], 8)
    assert ids.shape == (2, 4) and lengths.tolist() == [4, 1]
