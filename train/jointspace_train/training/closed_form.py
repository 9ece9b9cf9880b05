"""Closed-form joint spaces: ridge regression (the course project's baseline), CCA and normalized CCA (Gong et
al.), in float64. Every map is affine, `(x - mean) @ W`, so a bundle's image side is one matrix and a bias.

Pairs are given as one row per image (`x`, [N_img, dx]) and one row per caption (`y`, [N_cap, dy]) with
`owner[j]` the image of caption j: an image with five captions counts five times, as five pairs would.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Affine:
    """x -> (x - mean) @ w: [d] and [d, k]."""

    mean: np.ndarray
    w: np.ndarray

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return (np.asarray(x, np.float64) - self.mean) @ self.w

    def then(self, w: np.ndarray) -> Affine:
        return Affine(self.mean, self.w @ w)

    def scaled(self, s: np.ndarray) -> Affine:
        return Affine(self.mean, self.w * s)


def _pair_moments(x, y, owner):
    """Means and covariances over the pairs (image row repeated once per caption)."""
    owner = np.asarray(owner)
    n = len(owner)
    reps = np.bincount(owner, minlength=len(x)).astype(np.float64)
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    mx = reps @ x / n
    my = y.mean(axis=0)
    xc, yc = x - mx, y - my
    cxx = (xc * reps[:, None]).T @ xc / n
    ysum = np.zeros((len(x), y.shape[1]))
    np.add.at(ysum, owner, yc)
    cxy = xc.T @ ysum / n
    cyy = yc.T @ yc / n
    return mx, my, cxx, cxy, cyy


@dataclass(frozen=True)
class Ridge:
    """Caption features -> image features: (t - t_mean) @ a + x_mean."""

    t_mean: np.ndarray
    a: np.ndarray
    x_mean: np.ndarray

    def __call__(self, t: np.ndarray) -> np.ndarray:
        return (np.asarray(t, np.float64) - self.t_mean) @ self.a + self.x_mean


def fit_ridge(t: np.ndarray, x: np.ndarray, owner, reg: float) -> Ridge:
    """Multi-response least squares with a ridge of `reg` x the mean variance of t (0: plain least squares)."""
    mx, mt, cxx, cxt, ctt = _pair_moments(x, t, owner)
    lam = reg * np.trace(ctt) / len(ctt)
    a = np.linalg.solve(ctt + lam * np.eye(len(ctt)), cxt.T)
    return Ridge(mt, a, mx)


def _inv_sqrt(eig: tuple[np.ndarray, np.ndarray], reg: float) -> np.ndarray:
    """(C + reg x mean eigenvalue x I)^(-1/2), symmetric, from C's eigendecomposition."""
    vals, vecs = eig
    vals = np.maximum(vals, 0)
    vals = vals + reg * vals.sum() / len(vals)
    return (vecs / np.sqrt(vals)) @ vecs.T


@dataclass(frozen=True)
class CCA:
    """Both views' maps to the canonical space (all directions, strongest first) and the correlations."""

    image: Affine
    text: Affine
    corr: np.ndarray

    def top(self, c: int, power: float = 0.0) -> tuple[Affine, Affine]:
        """The first `c` directions, each column scaled by its correlation to `power` (normalized CCA: 4;
        plain CCA: 0)."""
        s = self.corr[:c] ** power
        return (Affine(self.image.mean, self.image.w[:, :c] * s), Affine(self.text.mean, self.text.w[:, :c] * s))


class CCAProblem:
    """The training pairs' moments and each view's eigendecomposition, computed once for every ridge tried."""

    def __init__(self, x: np.ndarray, y: np.ndarray, owner):
        self.mx, self.my, cxx, self.cxy, cyy = _pair_moments(x, y, owner)
        self.eig_x, self.eig_y = np.linalg.eigh(cxx), np.linalg.eigh(cyy)

    def fit(self, reg_x: float, reg_y: float, dims: int | None = None) -> CCA:
        """Regularised CCA: whiten each view (ridge reg x the mean eigenvalue), then the SVD of the whitened
        cross-covariance. Projections have unit variance on the (regularised) training pairs and the canonical
        correlations come out sorted, in [0, 1]."""
        kx, ky = _inv_sqrt(self.eig_x, reg_x), _inv_sqrt(self.eig_y, reg_y)
        u, s, vt = np.linalg.svd(kx @ self.cxy @ ky, full_matrices=False)
        k = len(s) if dims is None else min(dims, len(s))
        return CCA(Affine(self.mx, kx @ u[:, :k]), Affine(self.my, ky @ vt[:k].T), np.clip(s[:k], 0.0, 1.0))


def fit_cca(x: np.ndarray, y: np.ndarray, owner, reg_x: float, reg_y: float, dims: int | None = None) -> CCA:
    return CCAProblem(x, y, owner).fit(reg_x, reg_y, dims)


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[N_a, N_b] cosine similarities (a zero row scores 0)."""
    def unit(v):
        n = np.linalg.norm(v, axis=1, keepdims=True)
        return np.where(n > 0, v / np.where(n > 0, n, 1), 0)
    return unit(np.asarray(a, np.float64)) @ unit(np.asarray(b, np.float64)).T


def neg_sqdist(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[N_a, N_b] of -||a_i - b_j||^2."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return -((a * a).sum(1)[:, None] - 2 * a @ b.T + (b * b).sum(1)[None, :])
