"""Shared input validation, label encoding and explanation helpers for the algorithms.

Every algorithm in :mod:`streamsemi.algorithms` is a scikit-learn estimator with

* ``fit(X, y)``: ``X`` a sparse non-negative count matrix (documents x hashed
  features); ``y`` array-like, one element per row: a class label, or ``None`` /
  ``-1`` / ``""`` for an unlabeled row. Multi-label estimators take a list of
  label lists (empty list = unlabeled).
* ``predict(X)``, ``predict_proba(X)`` for rows seen or unseen in ``fit``;
  ``classes_``: the column labels of ``predict_proba`` (str).
* ``new_clusters_``: the subset of ``classes_`` that are discovered clusters,
  not seeded classes (named ``new-0``, ``new-1``, ...); empty when none.
* ``explain(sketch=None, top_n=10)``: class -> top words (through a
  :class:`streamsemi.core.features.WordSketch`; without one, feature ids ``f123``).
* ``multilabel_``: True for multi-label estimators, whose ``predict`` returns a
  0/1 indicator matrix over ``classes_``.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

NEW_CLUSTER_PREFIX = "new-"


class DegenerateInputError(ValueError):
    """Input that an algorithm cannot fit meaningfully (no seeds, one class, ...)."""


def is_unlabeled(value: Any) -> bool:
    """True for the markers of an unlabeled row: None, -1, "", NaN."""
    if value is None:
        return True
    if isinstance(value, str):
        return value == ""
    if isinstance(value, numbers.Real):
        return bool(value == -1 or (isinstance(value, float) and np.isnan(value)))
    return False


def check_count_matrix(X: Any, allow_empty_rows: bool = False, name: str = "X") -> sp.csr_matrix:
    """Validate a non-negative count matrix and return it as CSR float64.

    Raises
    ------
    DegenerateInputError
        If the matrix has no rows, is all zero, has negative entries, or (unless
        ``allow_empty_rows``) has an empty row.
    """
    X = sp.csr_matrix(X, dtype=np.float64)
    if X.shape[0] == 0:
        raise DegenerateInputError(f"{name} has no rows")
    if X.nnz and X.data.min() < 0:
        raise DegenerateInputError(f"{name} must be non-negative term counts")
    if not np.isfinite(X.data).all():
        raise DegenerateInputError(f"{name} contains NaN or infinite values")
    if X.nnz == 0 or not X.data.any():
        raise DegenerateInputError(f"{name} is all zero: no document has any term")
    if not allow_empty_rows:
        empty = np.flatnonzero(np.diff(X.indptr) == 0)
        if empty.size:
            raise DegenerateInputError(
                f"{name} has {empty.size} empty document(s) (no terms), first at row {int(empty[0])}"
            )
    return X


def check_predict_matrix(X: Any, n_features_in: int) -> sp.csr_matrix:
    """Rows to score with a fitted model: CSR float64 with the fitted number of columns."""
    X = sp.csr_matrix(X, dtype=np.float64)
    if X.shape[1] != n_features_in:
        raise ValueError(f"X has {X.shape[1]} features, the model was fitted on {n_features_in}")
    return X


def encode_single_labels(y: Sequence[Any], n_samples: int, min_classes: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Encode seed labels.

    Returns
    -------
    codes : ndarray of int, shape (n_samples,)
        Class index per row, -1 for unlabeled rows.
    classes : ndarray of str
        Sorted class names; ``codes`` index into it.

    Raises
    ------
    DegenerateInputError
        Length mismatch, no seeds, or fewer than ``min_classes`` classes.
    """
    y = list(y)
    if len(y) != n_samples:
        raise DegenerateInputError(f"y has {len(y)} elements but X has {n_samples} rows")
    labels = [None if is_unlabeled(v) else str(v) for v in y]
    classes = np.array(sorted({v for v in labels if v is not None}), dtype=object)
    if classes.size == 0:
        raise DegenerateInputError("no seed labels: at least one labeled document per class is needed")
    if classes.size < min_classes:
        raise DegenerateInputError(
            f"only {classes.size} seeded class ({classes[0]!r}); at least {min_classes} classes are needed"
        )
    lookup = {c: i for i, c in enumerate(classes)}
    codes = np.array([-1 if v is None else lookup[v] for v in labels], dtype=np.int64)
    return codes, classes


def encode_multi_labels(y: Sequence[Any], n_samples: int, min_classes: int = 2) -> tuple[sp.csr_matrix, np.ndarray, np.ndarray]:
    """Encode multi-label seeds (each element a list of labels; a scalar is one label).

    Returns
    -------
    Y : csr_matrix of shape (n_samples, n_classes)
        0/1 indicator of each row's labels.
    classes : ndarray of str
    labeled : ndarray of bool, shape (n_samples,)
    """
    y = list(y)
    if len(y) != n_samples:
        raise DegenerateInputError(f"y has {len(y)} elements but X has {n_samples} rows")
    sets: list[list[str]] = []
    for v in y:
        if isinstance(v, (list, tuple, set, frozenset, np.ndarray)):
            sets.append(sorted({str(x) for x in v if not is_unlabeled(x)}))
        else:
            sets.append([] if is_unlabeled(v) else [str(v)])
    classes = np.array(sorted({c for s in sets for c in s}), dtype=object)
    if classes.size == 0:
        raise DegenerateInputError("no seed labels: at least one labeled document is needed")
    if classes.size < min_classes:
        raise DegenerateInputError(
            f"only {classes.size} seeded class ({classes[0]!r}); at least {min_classes} classes are needed"
        )
    lookup = {c: i for i, c in enumerate(classes)}
    rows = [i for i, s in enumerate(sets) for _ in s]
    cols = [lookup[c] for s in sets for c in s]
    Y = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(n_samples, classes.size))
    labeled = np.array([bool(s) for s in sets])
    return Y, classes, labeled


def check_n_clusters(n_clusters: int, n_samples: int) -> None:
    """Raise if more clusters are requested than there are documents."""
    if n_clusters > n_samples:
        raise DegenerateInputError(
            f"K = {n_clusters} clusters is larger than the number of documents N = {n_samples}"
        )


def new_cluster_names(n: int, start: int = 0) -> list[str]:
    """Names of discovered clusters: ``new-<start>``, ``new-<start+1>``, ..."""
    return [f"{NEW_CLUSTER_PREFIX}{start + i}" for i in range(n)]


def softmax_rows(S: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Row-wise softmax of ``S / temperature`` (numerically stable)."""
    Z = np.asarray(S, dtype=np.float64) / temperature
    Z = Z - Z.max(axis=1, keepdims=True)
    np.exp(Z, out=Z)
    Z /= Z.sum(axis=1, keepdims=True)
    return Z


def explain_weights(classes: Sequence[str], weights: Any, sketch: Any = None, top_n: int = 10) -> dict[str, list[str]]:
    """Top words per class from a (n_classes x n_features) weight matrix.

    Parameters
    ----------
    classes : sequence of str
        Row labels of ``weights``.
    weights : ndarray or sparse matrix
        Non-negative feature weights per class (e.g. centroids, topic-term probabilities).
    sketch : WordSketch, optional
        Maps feature indices to words; without it, features are named ``f<index>``.
    top_n : int
        Words per class.
    """
    W = weights.toarray() if sp.issparse(weights) else np.asarray(weights)
    out: dict[str, list[str]] = {}
    for k, name in enumerate(classes):
        row = np.asarray(W[k], dtype=np.float64).ravel()
        if sketch is not None:
            out[str(name)] = sketch.top_words(row, top_n)
        else:
            pos = np.flatnonzero(row > 0)
            order = pos[np.argsort(-row[pos], kind="stable")][:top_n]
            out[str(name)] = [f"f{int(j)}" for j in order]
    return out
