"""Caption features for the closed-form methods (linear regression, CCA, normalized CCA, SAE), computed from
the tokenizer's ids so that the bundle's text graph (`feature_graph.py`) can compute exactly the same thing.

A feature block is a *term*: each token id has a weight (0: the token does not count) and a row; the block is
the weighted sum of the caption's rows divided by a normaliser:
- TF-IDF over a dictionary of the most frequent training words: weight = the word's idf, row = the one-hot of
  its dictionary slot, normaliser = the L2 norm of the weighted bag (term frequency is the raw count);
- averaged GloVe: weight = 1 where the word has a vector, row = the vector, normaliser = the number of such
  tokens (a caption with none is the zero vector);
- keyword tags (SAE's auxiliary view): weight = 1 for tag words, row = the tag's one-hot, no normaliser.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import tokenizer

NORMS = ("l2", "count", "none")

# Function words left out of the keyword tags (SAE's stand-in for a photo's user tags).
STOPWORDS = frozenset("""a an the and or but of in on at to for from with by into onto over under up down out off
about as is are was were be been being has have had do does did it its this that these those there here his her
their they them he she him we you i my your our some one two three four several another other while near next
through across along behind front top back each very just""".split())


@dataclass(frozen=True)
class Term:
    weight: np.ndarray  # [V] float32, per token id
    rows: np.ndarray    # [V, k] float32, per token id
    norm: str           # one of NORMS


def word_ids(tok) -> list[int]:
    """Ids of the tokenizer's words (letters or digits; not punctuation, <pad>, <unk>), most frequent first
    (the tokenizer numbers its vocabulary by training frequency)."""
    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    return [i for w, i in vocab if i >= 2 and w.isalnum()]


def vocab_words(tok) -> list[str]:
    """The tokenizer's words in id order."""
    return [w for w, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1])]


def tfidf_term(tok, ids: np.ndarray, lengths: np.ndarray, size: int) -> Term:
    """TF-IDF over the `size` most frequent training words; idf = ln(N / df) over the training captions
    (`ids`, `lengths`)."""
    vocab = tok.get_vocab_size()
    dictionary = np.array(word_ids(tok)[:size], np.int64)
    mask = np.arange(ids.shape[1])[None, :] < lengths[:, None]
    df = np.zeros(vocab, np.int64)
    for row, m in zip(ids, mask):
        df[np.unique(row[m])] += 1
    weight = np.zeros(vocab, np.float32)
    weight[dictionary] = np.log(len(ids) / np.maximum(df[dictionary], 1)).astype(np.float32)
    rows = np.zeros((vocab, len(dictionary)), np.float32)
    rows[dictionary, np.arange(len(dictionary))] = 1.0
    return Term(weight, rows, "l2")


def glove_term(vectors: np.ndarray, found: np.ndarray) -> Term:
    return Term(found.astype(np.float32), np.asarray(vectors, np.float32), "count")


def tag_words(tok, ids: np.ndarray, lengths: np.ndarray, size: int) -> np.ndarray:
    """The `size` words (not stop words) that most training captions use: SAE's keyword tags."""
    words = vocab_words(tok)
    mask = np.arange(ids.shape[1])[None, :] < lengths[:, None]
    df = np.zeros(len(words), np.int64)
    for row, m in zip(ids, mask):
        df[np.unique(row[m])] += 1
    ok = [i for i in word_ids(tok) if words[i] not in STOPWORDS]
    ok.sort(key=lambda i: (-df[i], i))
    return np.array(ok[:size], np.int64)


def tag_term(vocab: int, tags: np.ndarray) -> Term:
    weight = np.zeros(vocab, np.float32)
    weight[tags] = 1.0
    rows = np.zeros((vocab, len(tags)), np.float32)
    rows[tags, np.arange(len(tags))] = 1.0
    return Term(weight, rows, "none")


def encode(tok, captions: list[str], max_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    return tokenizer.encode_batch(tok, captions, max_tokens)


def features(term: Term, ids: np.ndarray, lengths: np.ndarray, batch: int = 256) -> np.ndarray:
    """[N, k] float32: the term's block for each caption, as the text graph computes it."""
    out = []
    for s in range(0, len(ids), batch):
        i, n = ids[s : s + batch], lengths[s : s + batch]
        mask = np.arange(i.shape[1])[None, :] < n[:, None]
        w = term.weight[i] * mask                                    # [B, T]
        x = np.einsum("bt,btk->bk", w, term.rows[i], dtype=np.float32)
        if term.norm == "l2":
            same = (i[:, :, None] == i[:, None, :]).astype(np.float32)
            n2 = np.einsum("bt,bts,bs->b", w, same, w)
            x = x / np.sqrt(np.maximum(n2, 1e-30))[:, None]
        elif term.norm == "count":
            x = x / np.maximum(w.sum(axis=1), 1.0)[:, None]
        out.append(x.astype(np.float32))
    return np.concatenate(out) if out else np.zeros((0, term.rows.shape[1]), np.float32)
