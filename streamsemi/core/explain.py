"""Distinctive words of clusters against the whole window.

The most frequent words of a cluster are the window's most frequent words ("said mln dlrs
pct" for every Reuters cluster). A cluster is named by the words that *distinguish* it: a
word ``t`` of cluster ``c`` scores

    p_c(t) * ln(p_c(t) / p(t)) * ln(1 / p(t))

with ``p_c(t)`` the fraction of the cluster's documents that contain ``t`` and ``p(t)`` the
fraction of all the window's documents that do. The first two factors are the word's
contribution to the Kullback-Leibler divergence of the cluster's document frequencies from
the window's (its lift ``p_c / p``, weighted by how much of the cluster it covers): a word as
common in the cluster as everywhere scores about 0 whatever its frequency, a rare word of a
few members little. The last factor is the word's inverse document frequency in the window:
a word in most documents ("said" in 55% of Reuters stories, over-represented in every
cluster without earnings reports) cannot name a cluster however much of it it covers
(measured on Reuters R8 with its true classes: acq "acquisition acquire stake offer shares",
crude "oil crude barrel barrels opec", without the factor acq starts with "said"). Only
over-represented words (lift > 1) are listed. Computed on the hashed columns and named
through the :class:`streamsemi.core.features.WordSketch`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp


def membership_matrix(labels: Any, n_classes: int) -> sp.csr_matrix:
    """(n_classes x n_docs) 0/1 matrix: from class indices (``-1``: no class) or a (docs x classes)
    0/1 indicator (multi-label)."""
    if sp.issparse(labels) or np.asarray(labels).ndim == 2:
        return sp.csr_matrix((sp.csr_matrix(labels) > 0).T, dtype=np.float64)
    lab = np.asarray(labels, dtype=np.int64).ravel()
    ok = np.flatnonzero((lab >= 0) & (lab < n_classes))
    return sp.csr_matrix((np.ones(ok.size), (lab[ok], ok)), shape=(n_classes, lab.size))


def distinctive_scores(X: sp.spmatrix, membership: Any, n_classes: int) -> sp.csr_matrix:
    """(n_classes x n_features) sparse scores ``p_c(t) ln(p_c(t) / p(t)) ln(1 / p(t))`` where positive.

    Parameters
    ----------
    X : sparse (n_docs x n_features)
        Term counts of the window (only presence is used).
    membership : array of int (n_docs,) or 0/1 matrix (n_docs x n_classes)
        Each document's class index (``-1``: none) or class set.
    n_classes : int
    """
    B = sp.csr_matrix(X, copy=True)
    B.eliminate_zeros()
    B.data[:] = 1.0
    H = membership_matrix(membership, n_classes)
    n = max(B.shape[0], 1)
    p = np.asarray(B.sum(axis=0)).ravel() / n
    size = np.asarray(H.sum(axis=1)).ravel()
    D = sp.csr_matrix(H @ B)                      # documents of each class containing each word
    rows = np.repeat(np.arange(D.shape[0]), np.diff(D.indptr))
    pc = D.data / np.maximum(size[rows], 1.0)
    score = pc * np.log(pc / p[D.indices]) * np.log(1.0 / p[D.indices])
    keep = score > 0
    return sp.csr_matrix((score[keep], (rows[keep], D.indices[keep])), shape=D.shape)


def distinctive_words(X: sp.spmatrix, membership: Any, n_classes: int, sketch: Any = None,
                      top_n: int = 10, scores: sp.csr_matrix | None = None) -> list[list[str]]:
    """The ``top_n`` most distinctive words of each class (see the module docstring).

    Without a ``sketch`` the features are named ``f<index>``; a class without documents has
    no words. ``scores``: :func:`distinctive_scores` of ``X`` and ``membership`` when already
    computed (the engine computes them before it takes the sketch's lock).
    """
    W = distinctive_scores(X, membership, n_classes) if scores is None else scores
    out: list[list[str]] = []
    for k in range(n_classes):  # one row per class, never the whole dense matrix
        lo, hi = W.indptr[k], W.indptr[k + 1]
        cols, vals = W.indices[lo:hi], W.data[lo:hi]
        if sketch is not None:
            row = np.zeros(W.shape[1])
            row[cols] = vals
            out.append(sketch.top_words(row, top_n))
        else:
            order = np.argsort(-vals, kind="stable")[:top_n]
            out.append([f"f{int(j)}" for j in cols[order]])
    return out


def explain_classes(classes: Sequence[Any], X: sp.spmatrix, membership: Any, sketch: Any = None,
                    top_n: int = 10, fallback: dict[str, list[str]] | Callable[[], dict[str, list[str]]] | None = None,
                    scores: sp.csr_matrix | None = None) -> dict[str, list[str]]:
    """``{class: distinctive words}``; a class with no document in the window keeps its
    ``fallback`` words (e.g. the model's own ``explain``; a callable is called only when some
    class has no words). ``scores``: as in :func:`distinctive_words`."""
    words = distinctive_words(X, membership, len(classes), sketch, top_n, scores)
    if callable(fallback):
        fallback = fallback() if not all(words) else None
    fallback = fallback or {}
    return {str(c): (w if w else list(fallback.get(str(c), []))) for c, w in zip(classes, words, strict=True)}


__all__ = ["membership_matrix", "distinctive_scores", "distinctive_words", "explain_classes"]
