"""The caption tokenizer: one Hugging Face `tokenizer.json`, written here and loaded by the server too."""
from __future__ import annotations

from collections import Counter

import numpy as np
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

PAD, UNK = "<pad>", "<unk>"


def _base(vocab: dict[str, int]) -> Tokenizer:
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tok.normalizer = normalizers.Lowercase()
    # \w+ | [^\w\s]+ : words, and punctuation as tokens of its own.
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok


def build(captions: list[str], min_count: int = 1) -> Tokenizer:
    """Word-level vocabulary of the given (training) captions; words seen fewer than min_count times -> <unk>."""
    splitter = _base({PAD: 0, UNK: 1})
    counts: Counter[str] = Counter()
    for c in captions:
        counts.update(w for w, _ in splitter.pre_tokenizer.pre_tokenize_str(splitter.normalizer.normalize_str(c)))
    vocab = {PAD: 0, UNK: 1}
    for word, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if n >= min_count:
            vocab[word] = len(vocab)
    return _base(vocab)


def load(path) -> Tokenizer:
    return Tokenizer.from_file(str(path))


def encode_batch(tok: Tokenizer, captions: list[str], max_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded ids [N, T] int64 and lengths [N] int64 (a caption with no tokens gets one <unk>)."""
    ids = [e.ids[:max_tokens] or [tok.token_to_id(UNK)] for e in tok.encode_batch(captions)]
    lengths = np.array([len(i) for i in ids], np.int64)
    out = np.zeros((len(ids), int(lengths.max()) if len(ids) else 0), np.int64)
    for row, i in zip(out, ids):
        row[: len(i)] = i
    return out, lengths
