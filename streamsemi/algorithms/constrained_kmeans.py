"""Constrained spherical k-means (Basu, Banerjee & Mooney 2002) on sublinear tf-idf.

The baseline every paper algorithm must beat, and the daemon's fallback model.
Centroids start at the (normalised) mean of each class's seeds; with
``constrained=True`` (COP/constrained k-means) seeds stay in their class in every
assignment step, with ``constrained=False`` (seeded k-means) seeds only
initialise. Similarity is cosine on l2-normalised sublinear tf-idf rows.
"""

from __future__ import annotations

from numbers import Integral, Real
from typing import Any

import numpy as np
import scipy.sparse as sp
from sklearn.utils._param_validation import Interval

from streamsemi.algorithms._discovery import (
    DISCOVERY_CONSTRAINTS,
    DiscoveryMixin,
    fit_calibrated,
    uses_calibrated,
)
from streamsemi.algorithms.base import (
    RANDOM_STATE,
    ScoresClassifierMixin,
    StreamsemiEstimator,
    TransformerMixin,
    new_cluster_names,
    sparse_dot_t,
)
from streamsemi.core.features import idf_weights, l2_normalize_rows, tfidf


def _normalize_dense_rows(C: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(C, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return C / norms


def seed_means(Xn: sp.csr_matrix, codes: np.ndarray, n_classes: int) -> np.ndarray:
    """Unit-length mean of the seed rows of each class (dense, n_classes x M)."""
    idx = np.flatnonzero(codes >= 0)
    H = sp.csr_matrix((np.ones(idx.size), (codes[idx], idx)), shape=(n_classes, Xn.shape[0]))
    return _normalize_dense_rows(np.asarray((H @ Xn).todense()))


def bootstrap_seed_means(Xn: sp.csr_matrix, codes: np.ndarray, n_classes: int,
                         rng: np.random.Generator) -> np.ndarray:
    """Unit-length mean of a bootstrap resample of each class's seed rows (dense, n_classes x M).

    Each class draws as many of its seeds, with replacement, as it has; a seed drawn
    ``t`` times weighs ``t`` in its class's mean. The restarts of
    :class:`ConstrainedKMeans` (``n_init > 1``) start from these instead of
    :func:`seed_means`.
    """
    idx = np.flatnonzero(codes >= 0)
    cls = codes[idx]
    order = np.argsort(cls, kind="stable")
    idx, cls = idx[order], cls[order]
    starts = np.searchsorted(cls, np.arange(n_classes))
    sizes = np.bincount(cls, minlength=n_classes)
    # one uniform draw per seed: the position within its own class's block
    pos = starts[cls] + np.floor(rng.random(idx.size) * sizes[cls]).astype(np.int64)
    weights = np.bincount(pos, minlength=idx.size).astype(float)
    H = sp.csr_matrix((weights, (cls, idx)), shape=(n_classes, Xn.shape[0]))
    return _normalize_dense_rows(np.asarray((H @ Xn).todense()))


def lloyd(Xn: sp.csr_matrix, C: np.ndarray, codes: np.ndarray, constrained: bool,
          max_iter: int) -> tuple[np.ndarray, np.ndarray, int, float]:
    """Spherical k-means rounds from centroids ``C``; seeds fixed to their class if ``constrained``.

    Returns the centroids, the labels, the rounds run and the objective: the summed cosine
    similarity of each row to its assigned centroid (higher is better).
    """
    n_clusters = C.shape[0]
    seeds = np.flatnonzero(codes >= 0)
    labels = np.full(Xn.shape[0], -1)
    n_iter = 0
    for n_iter in range(1, max_iter + 1):  # noqa: B007
        new = np.asarray(Xn @ C.T).argmax(axis=1)
        if constrained:
            new[seeds] = codes[seeds]
        if np.array_equal(new, labels):
            break
        labels = new
        H = sp.csr_matrix((np.ones(labels.size), (labels, np.arange(labels.size))),
                          shape=(n_clusters, Xn.shape[0]))
        sums = np.asarray((H @ Xn).todense())
        empty = np.asarray(H.sum(axis=1)).ravel() == 0
        sums[empty] = C[empty]  # an emptied cluster keeps its previous centroid
        C = _normalize_dense_rows(sums)
    S = np.asarray(Xn @ C.T)
    objective = float(S[np.arange(labels.size), labels].sum())
    return C, labels, n_iter, objective


def farthest_point_centroids(Xn: sp.csr_matrix, C: np.ndarray, candidates: np.ndarray, n_new: int,
                             rng: np.random.Generator) -> np.ndarray:
    """Add ``n_new`` centroids at the candidate rows least similar to existing ones.

    The first extra centroid is the candidate whose best similarity to the seeded
    centroids is lowest; each next one is chosen likewise against all centroids so
    far (a deterministic farthest-first traversal, ties broken by ``rng``).
    """
    best = np.asarray(Xn[candidates] @ C.T).max(axis=1) if C.shape[0] else np.zeros(candidates.size)
    best = best + 1e-12 * rng.random(best.size)
    out = []
    for _ in range(n_new):
        j = int(np.argmin(best))
        row = Xn[candidates[j]].toarray().ravel()
        out.append(row)
        best = np.maximum(best, np.asarray(Xn[candidates] @ row).ravel())
        best[j] = np.inf
    return np.vstack([C, np.array(out)]) if out else C


class ConstrainedKMeans(DiscoveryMixin, ScoresClassifierMixin, TransformerMixin, StreamsemiEstimator):
    """Constrained (or seeded) spherical k-means on sublinear tf-idf.

    Parameters
    ----------
    constrained : bool, default=True
        Keep seeds in their class at every assignment step (constrained k-means);
        False gives seeded k-means (seeds only initialise the centroids).
    n_new_clusters : int or "auto", default=0
        Clusters for classes nobody seeded, reported as ``new-0``, ``new-1``, ...
        (``"auto"``: chosen from the data, calibrated discovery).
    discovery : {"calibrated", "legacy"}, default="calibrated"
        How new clusters are found (no effect with ``n_new_clusters=0``):
        ``"calibrated"`` fits the seeded classes as with ``n_new_clusters=0`` and
        clusters only the documents no seeded class explains
        (:mod:`streamsemi.algorithms._discovery`); ``"legacy"`` adds the extra
        centroids to the k-means, initialised farthest-first among unlabeled documents.
    discovery_quantile : float in (0, 1), default=0.4
        Calibrated discovery: the quantile of a class's seeds' similarity below
        which a document is not explained by that class.
    discovery_init : sparse matrix of shape (n_clusters, n_features) or None, default=None
        Calibrated discovery: unit centroids that start the clustering of the unexplained
        documents (a warm start; the engine passes the previous fit's clusters,
        :func:`~streamsemi.algorithms._discovery.warm_start_discovery`).
    discovery_split : bool, default=False
        Calibrated discovery: cluster again the members of every rejected cluster and judge
        its parts (finds small unseeded classes hidden in a mixture, at the cost of more and
        less stable new clusters; :func:`~streamsemi.algorithms._discovery.split_rejected`).
    max_iter : int, default=50
        Maximum assignment/update rounds.
    n_init : int >= 1, default=1
        Runs of the k-means, keeping the one with the highest objective (summed cosine
        similarity of the rows to their centroids, ``objective_``), as scikit-learn's
        ``KMeans(n_init=...)``. The first run starts at the seed means; each further run
        at the means of a bootstrap resample of every class's seeds
        (:func:`bootstrap_seed_means`, drawn from ``random_state``).
    temperature : float, default=0.05
        Softmax temperature turning cosine similarities into ``predict_proba``.
    random_state : int >= 0 or None, default=0
        Tie-breaking seed for the extra clusters' initialisation.

    Attributes
    ----------
    classes_ : ndarray of str
        Seeded classes followed by discovered clusters.
    new_clusters_ : list of str
    n_features_in_ : int
    idf_ : ndarray of shape (n_features,)
    cluster_centers_ : ndarray of shape (n_clusters, n_features)
        Unit-length centroids in tf-idf space.
    labels_ : ndarray of int
        Cluster index of each training row.
    n_iter_ : int
    objective_ : float
        Summed cosine similarity of the training rows to their assigned centroids (the kept run's).
    """

    _parameter_constraints = {
        "constrained": ["boolean"],
        **DISCOVERY_CONSTRAINTS,
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "n_init": [Interval(Integral, 1, None, closed="left")],
        "temperature": [Interval(Real, 0, None, closed="neither")],
        "random_state": RANDOM_STATE,
    }

    def __init__(self, constrained: bool = True, *, n_new_clusters: int = 0, max_iter: int = 50,
                 temperature: float = 0.05, discovery: str = "calibrated",
                 discovery_quantile: float = 0.4, discovery_init: Any = None,
                 discovery_split: bool = False, n_init: int = 1, random_state: int | None = 0) -> None:
        self.constrained = constrained
        self.n_new_clusters = n_new_clusters
        self.discovery = discovery
        self.discovery_quantile = discovery_quantile
        self.discovery_init = discovery_init
        self.discovery_split = discovery_split
        self.max_iter = max_iter
        self.n_init = n_init
        self.temperature = temperature
        self.random_state = random_state

    def fit(self, X: Any, y: Any) -> ConstrainedKMeans:
        """Fit on counts ``X`` with seed labels ``y`` (None/-1 = unlabeled)."""
        if uses_calibrated(self):
            return fit_calibrated(self, X, y)
        X, codes, classes = self._fit_inputs(X, y)
        n_known = classes.size
        rng = np.random.default_rng(self.random_state)
        self.idf_ = idf_weights(X)
        Xn = tfidf(X, self.idf_)
        best: tuple[np.ndarray, np.ndarray, int, float] | None = None
        for run in range(int(self.n_init)):
            C = seed_means(Xn, codes, n_known) if run == 0 else bootstrap_seed_means(Xn, codes, n_known, rng)
            if self.n_new_clusters:
                unl = np.flatnonzero(codes < 0)
                C = farthest_point_centroids(Xn, C, unl, int(self.n_new_clusters), rng)
            found = lloyd(Xn, C, codes, self.constrained, int(self.max_iter))
            if best is None or found[3] > best[3]:
                best = found
        assert best is not None
        C, labels, n_iter, self.objective_ = best
        self.cluster_centers_ = C
        self.labels_ = labels
        self.n_iter_ = n_iter
        self.new_clusters_ = new_cluster_names(int(self.n_new_clusters))
        self.classes_ = np.array(list(classes) + self.new_clusters_, dtype=object)
        return self

    def _scores(self, X: Any) -> np.ndarray:
        X = self._validate_counts(X, reset=False)
        return sparse_dot_t(tfidf(X, self.idf_), self.cluster_centers_)

    def _softmax_temperature(self) -> float:
        return float(self.temperature)

    def transform(self, X: Any) -> np.ndarray:
        """Cosine similarity of each row to each centroid (``predict_proba`` is their softmax
        at ``temperature``)."""
        return self._scores(X)

    def _explain_weights(self) -> np.ndarray:
        """The centroids: ``explain`` lists each centroid's top words."""
        return self.cluster_centers_


__all__ = ["ConstrainedKMeans", "l2_normalize_rows"]
