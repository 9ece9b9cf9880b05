"""Retrieval metrics as in the papers: R@1/5/10 and median rank, both directions, and their sum (rsum).

Annotation (image -> caption): an image's rank is the best rank among its captions.
Search (caption -> image): each caption is a query with one correct image.
Ranks are 1-based; R@K is the percentage of queries whose rank is <= K.
"""
from __future__ import annotations

import numpy as np

KEYS = ("i2t_r1", "i2t_r5", "i2t_r10", "i2t_medr", "t2i_r1", "t2i_r5", "t2i_r10", "t2i_medr", "rsum")


def ranks_i2t(sims: np.ndarray, owner: np.ndarray) -> np.ndarray:
    """sims [N_img, N_cap]; owner[j] = image of caption j -> best 1-based rank of each image's captions."""
    order = np.argsort(-sims, axis=1, kind="stable")
    hit = owner[order] == np.arange(sims.shape[0])[:, None]
    return hit.argmax(axis=1) + 1


def ranks_t2i(sims: np.ndarray, owner: np.ndarray) -> np.ndarray:
    """1-based rank of each caption's image among all images."""
    order = np.argsort(-sims.T, axis=1, kind="stable")
    return (order == np.asarray(owner)[:, None]).argmax(axis=1) + 1


def summarise(ranks: np.ndarray) -> tuple[float, float, float, float]:
    r = np.asarray(ranks)
    return (100.0 * np.mean(r <= 1), 100.0 * np.mean(r <= 5), 100.0 * np.mean(r <= 10),
            float(np.floor(np.median(r))))


def metrics(sims: np.ndarray, owner) -> dict[str, float]:
    owner = np.asarray(owner)
    i = summarise(ranks_i2t(sims, owner))
    t = summarise(ranks_t2i(sims, owner))
    m = dict(zip(KEYS[:4], i)) | dict(zip(KEYS[4:8], t))
    m["rsum"] = i[0] + i[1] + i[2] + t[0] + t[1] + t[2]
    return {k: round(float(v), 2) for k, v in m.items()}


def hub_bias(bank_sims: np.ndarray, k: int, alpha: float) -> np.ndarray:
    """A per-image score offset for search (caption -> image) that demotes hubs, images that come out near the
    top for many unrelated captions: -alpha times the mean of each image's k highest similarities to a bank of
    captions it does not belong to (the training captions). CSLS (Conneau et al. 2018) without its query-side
    term, which is a constant for one query's ranking. Annotation is unchanged by it (one image's captions all
    move by the same offset). bank_sims: [N_img, N_bank]."""
    if not 0 < k <= bank_sims.shape[1]:
        raise ValueError(f"k={k} must be between 1 and the bank's {bank_sims.shape[1]} captions")
    top = np.partition(bank_sims, -k, axis=1)[:, -k:]
    return -alpha * top.mean(axis=1)
