"""Calibrated discovery of classes nobody seeded, shared by every algorithm with ``n_new_clusters``.

The legacy way an algorithm opened new clusters was to add ``n_new_clusters`` extra
clusters to its own model and let them compete with the seeded classes: they mostly
split the large seeded classes (on Reuters D-LDA's new clusters were 54/54 ``earn``
documents). The calibrated path (``discovery="calibrated"``, the default) separates
the two questions:

1. **Known classes.** The algorithm is fitted exactly as with ``n_new_clusters=0``
   (the same code path: its known-class model is bit-identical) and kept as
   ``known_model_``.
2. **Is a document explained?** In sublinear tf-idf space (idf of the fitting
   window), each seeded class has a centroid (the normalised mean of its seeds) and
   a threshold calibrated on its own seeds: the ``discovery_quantile`` quantile of the
   seeds' leave-one-out cosine similarity to their class centroid (each seed against
   the centroid of the *other* seeds, so a seed does not explain itself), shrunk
   towards the pooled quantile of all seeds for classes with few seeds. A document is
   *unexplained* when its similarity to every known class is below that class's
   threshold. Seeds are always explained.
3. **New clusters among the unexplained documents only.** Spherical k-means
   (k-means++ initialisation, best of ``n_init``) on the unexplained training
   documents; ``n_new_clusters="auto"`` chooses k in ``2..auto_max_clusters`` by the
   cosine silhouette on a bounded sample (no cluster when there are too few
   unexplained documents). Clusters smaller than ``min_cluster_size`` are dissolved
   into the nearest remaining one. Clusters are numbered by decreasing size.
4. **Warm start across refits** (``discovery_init``, set by the engine from the previous
   model with :func:`warm_start_discovery`): the previous fit's clusters (all of them, in
   their order, each pruned to its :data:`WARM_TERMS` largest weights) are the starting
   centroids of this fit's spherical k-means (k-means++ only for clusters beyond them), the
   clusters keep that order, and ``auto`` keeps the previous k unless another k's silhouette
   is higher by :data:`AUTO_HYSTERESIS`. Restarting k-means++ at every refit changed the
   clusters themselves between refits (R8: 82% of the documents in a new cluster in two
   consecutive refits kept their id; 99.7% with the warm start).
5. **Split parts across refits** (``discovery_split`` with a warm start): the previous fit's
   accepted parts start the splitting of the rejected cluster they lie in instead of joining
   the first level, and acceptance has hysteresis (:func:`acceptance_bias`): a cluster or part
   continuing an accepted one passes looser bounds, any other needs a clear margin. A fit
   without a warm start is unchanged. R8 stream, ``auto`` + split: kept 0.90 -> 0.96.

Prediction: the known model's ``predict_proba`` for explained documents; an
unexplained document gets probability 1 spread over the new clusters (a softmax of
its cosine to their centroids at temperature 0.05), 0 on the known classes.

Every array kept is bounded by the number of known classes and new clusters times
the columns the seeds / cluster members use (sparse centroids), plus one idf vector.
"""

from __future__ import annotations

from numbers import Integral, Real
from typing import Any

import numpy as np
import scipy.sparse as sp
from sklearn.base import clone
from sklearn.utils._param_validation import Interval, StrOptions

from streamsemi.algorithms.base import (
    DegenerateInputError,
    check_count_matrix,
    check_n_clusters,
    encode_single_labels,
    new_cluster_names,
    softmax_rows,
    target_list,
)
from streamsemi.core.features import idf_weights, l2_normalize_rows, tfidf

#: ``_parameter_constraints`` entries of every estimator with calibrated discovery.
DISCOVERY_CONSTRAINTS: dict[str, list[Any]] = {
    "n_new_clusters": [Interval(Integral, 0, None, closed="left"), StrOptions({"auto"})],
    "discovery": [StrOptions({"legacy", "calibrated"})],
    "discovery_quantile": [Interval(Real, 0, 1, closed="neither")],
    "discovery_init": [None, "sparse matrix"],
    "discovery_split": ["boolean"],
}
#: Upper bound of k for ``n_new_clusters="auto"``.
AUTO_MAX_CLUSTERS = 10
#: Documents of the silhouette sample (``auto``): the pairwise matrix is this squared.
SILHOUETTE_SAMPLE = 1500
#: Seeds a class needs before its own quantile counts as much as the pooled one.
SHRINK_SEEDS = 10
NEW_TEMPERATURE = 0.05
#: A cluster attracting at least this fraction of the seeds a known class of its size would
#: hold (the window's seed rate times its size) is a part of a known class.
REJECT_RATIO = 1.0
#: A new cluster holds at least this many documents, and this fraction of the window.
MIN_CLUSTER_DOCS = 3
MIN_CLUSTER_FRACTION = 1 / 200
#: ... and a part of a split cluster (``discovery_split``) this fraction of the window.
SPLIT_MIN_FRACTION = 1 / 500
#: A part of a rejected cluster is new only when its members are set apart from the nearest
#: seeded class by this fraction of that class's seed margin (0.5 for the clusters themselves).
SPLIT_SEPARATION = 0.5
#: Warm start: terms kept per previous centroid (the largest weights; bounds ``discovery_init``).
WARM_TERMS = 2000
#: Warm start: at most this many previous centroids start the next fit.
WARM_MAX_CLUSTERS = 64
#: ``auto`` with a warm start keeps the previous k unless another k's silhouette is higher by this.
AUTO_HYSTERESIS = 0.005
#: ``discovery_init`` row norm of a cluster the previous fit rejected (a part of a known class),
#: and of an accepted part of a split cluster (``discovery_split``); the other accepted clusters'
#: rows have norm 1 (:func:`warm_start_centroids`, :func:`warm_kinds`).
REJECTED_NORM = 0.5
PART_NORM = 0.25
#: Warm start with ``discovery_split``: acceptance hysteresis. A cluster continuing one the previous
#: fit accepted needs ``1 - SPLIT_HYSTERESIS`` times the separation and attraction bounds, any
#: other cluster ``1 + SPLIT_HYSTERESIS`` times them (a clear margin); a fit without a warm start
#: is unchanged.
SPLIT_HYSTERESIS = 0.6


def uses_calibrated(est: Any) -> bool:
    """True when ``est`` opens new clusters through this module (``"auto"`` always does)."""
    n_new = getattr(est, "n_new_clusters", 0)
    if isinstance(n_new, str):
        return True
    return int(n_new) > 0 and getattr(est, "discovery", "legacy") == "calibrated"


def legacy_n_new(est: Any) -> int:
    """``n_new_clusters`` as the legacy code path reads it (0 on the calibrated path)."""
    return 0 if uses_calibrated(est) else int(est.n_new_clusters)


# ---------------------------------------------------------------- calibration

def seed_centroids(Xn: sp.csr_matrix, codes: np.ndarray, n_known: int) -> tuple[sp.csr_matrix, np.ndarray]:
    """Sums of the (unit) seed rows per class (sparse, not normalised) and seed counts per class."""
    idx = np.flatnonzero(codes >= 0)
    H = sp.csr_matrix((np.ones(idx.size), (codes[idx], idx)), shape=(n_known, Xn.shape[0]))
    return sp.csr_matrix(H @ Xn), np.bincount(codes[idx], minlength=n_known)


def loo_seed_similarity(Xn: sp.csr_matrix, codes: np.ndarray, sums: sp.csr_matrix) -> np.ndarray:
    """Cosine of each seed (unit row) to the sum of the OTHER seeds of its class (nan: a lone seed).

    ``cos(x, S - x) = (x.S - 1) / ||S - x||`` with ``||S - x||^2 = ||S||^2 - 2 x.S + 1``.
    """
    idx = np.flatnonzero(codes >= 0)
    c = codes[idx]
    dot = np.asarray(Xn[idx].multiply(sums[c]).sum(axis=1)).ravel()
    sq = np.asarray(sums.multiply(sums).sum(axis=1)).ravel()[c]
    norm2 = np.maximum(sq - 2.0 * dot + 1.0, 0.0)
    out = np.full(idx.size, np.nan)
    ok = norm2 > 1e-12
    out[ok] = (dot[ok] - 1.0) / np.sqrt(norm2[ok])
    return out


def class_thresholds(loo: np.ndarray, seed_codes: np.ndarray, n_known: int, quantile: float,
                     shrink: int = SHRINK_SEEDS) -> np.ndarray:
    """Per class: the ``quantile`` of its seeds' leave-one-out similarities, shrunk to the pooled one.

    ``t_c = (n_c q_c + shrink q_all) / (n_c + shrink)`` over the ``n_c`` seeds with a
    defined similarity; a class with none gets the pooled quantile ``q_all``.
    """
    ok = np.isfinite(loo)
    if not ok.any():  # one seed per class: nothing to calibrate on, every document is explained
        return np.full(n_known, -np.inf)
    pooled = float(np.quantile(loo[ok], quantile))
    out = np.full(n_known, pooled)
    for k in range(n_known):  # one small loop over classes
        v = loo[ok & (seed_codes == k)]
        if v.size:
            out[k] = (v.size * float(np.quantile(v, quantile)) + shrink * pooled) / (v.size + shrink)
    return out


def unexplained_mask(S: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """True where every known class's similarity is below its threshold (``S``: docs x classes)."""
    return np.all(S < thresholds[None, :], axis=1)


# ---------------------------------------------------------------- clustering

def _kmeanspp(Z: sp.csr_matrix, k: int, rng: np.random.Generator, prefix: np.ndarray | None = None) -> np.ndarray:
    """k-means++ seeding for cosine: next centre drawn with probability ~ 1 - best similarity;
    ``prefix`` (unit rows) are the first centres."""
    n = Z.shape[0]
    if prefix is not None and prefix.shape[0]:
        rows = [np.asarray(r) for r in prefix]
        best = np.asarray(Z @ prefix.T).max(axis=1)
    else:
        j = int(rng.integers(n))
        rows = [Z[j].toarray().ravel()]
        best = np.asarray(Z @ rows[0]).ravel()
    while len(rows) < k:
        w = np.maximum(1.0 - best, 0.0)
        j = int(rng.integers(n)) if w.sum() <= 0 else int(rng.choice(n, p=w / w.sum()))
        rows.append(Z[j].toarray().ravel())
        best = np.maximum(best, np.asarray(Z @ rows[-1]).ravel())
    return np.vstack(rows[:k])


def spherical_kmeans(Z: sp.csr_matrix, k: int, rng: np.random.Generator, n_init: int = 3,
                     max_iter: int = 30, prefix: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, float]:
    """Spherical k-means of unit rows ``Z``: ``(labels, unit centroids (dense), total similarity)``.

    Best of ``n_init`` k-means++ starts (after the fixed ``prefix`` centres) by total cosine
    similarity to the centroids. When ``prefix`` holds ``k`` rows or more, its first ``k`` rows
    are the only start (a warm start: deterministic, centroid ``j`` continues ``prefix[j]``).
    """
    if prefix is not None and prefix.shape[0] >= k:
        n_init = 1
    best: tuple[np.ndarray, np.ndarray, float] | None = None
    for _ in range(n_init):
        C = prefix[:k].copy() if prefix is not None and prefix.shape[0] >= k else _kmeanspp(Z, k, rng, prefix)
        labels = np.full(Z.shape[0], -1)
        for _ in range(max_iter):
            S = np.asarray(Z @ C.T)
            new = S.argmax(axis=1)
            if np.array_equal(new, labels):
                break
            labels = new
            H = sp.csr_matrix((np.ones(labels.size), (labels, np.arange(labels.size))), shape=(k, Z.shape[0]))
            sums = np.asarray((H @ Z).todense())
            empty = np.asarray(H.sum(axis=1)).ravel() == 0
            sums[empty] = C[empty]
            norms = np.linalg.norm(sums, axis=1, keepdims=True)
            norms[norms == 0] = 1.0
            C = sums / norms
        score = float(np.asarray(Z @ C.T)[np.arange(Z.shape[0]), labels].sum())
        if best is None or score > best[2]:
            best = (labels, C, score)
    assert best is not None
    return best


def cosine_silhouette(Z: sp.csr_matrix, labels: np.ndarray) -> float:
    """Mean silhouette with cosine distance (``Z`` unit rows, dense pairwise matrix: keep Z small)."""
    from sklearn.metrics import silhouette_score

    if np.unique(labels).size < 2 or np.unique(labels).size >= Z.shape[0]:
        return -1.0
    D = 1.0 - np.asarray((Z @ Z.T).todense())
    np.clip(D, 0.0, 2.0, out=D)
    np.fill_diagonal(D, 0.0)
    return float(silhouette_score(D, labels, metric="precomputed"))


def dissolve_small(Z: sp.csr_matrix, labels: np.ndarray, C: np.ndarray, min_size: int | np.ndarray,
                   keep_order: bool = False, return_kept: bool = False) -> tuple[np.ndarray, ...]:
    """Drop clusters with fewer than ``min_size`` members (a number, or one per cluster; their
    members join the nearest kept one); relabel by decreasing size, or (``keep_order``) in the
    clusters' order. Returns ``(labels, centroids)`` and (``return_kept``) the index each kept
    cluster had before."""
    sizes = np.bincount(labels, minlength=C.shape[0])
    keep = np.flatnonzero(sizes >= min_size)
    if keep.size == 0:
        keep = np.array([int(sizes.argmax())])
    if not keep_order:
        keep = keep[np.argsort(-sizes[keep], kind="stable")]
    S = np.asarray(Z @ C[keep].T)
    labels = S.argmax(axis=1)
    H = sp.csr_matrix((np.ones(labels.size), (labels, np.arange(labels.size))), shape=(keep.size, Z.shape[0]))
    sums = np.asarray((H @ Z).todense())
    norms = np.linalg.norm(sums, axis=1, keepdims=True)
    empty = norms[:, 0] == 0
    sums[empty] = C[keep][empty]  # a cluster left empty keeps its centroid
    norms[empty] = 1.0
    return (labels, sums / norms, keep) if return_kept else (labels, sums / norms)


def choose_auto_k(scores: dict[int, float], previous: int | None = None,
                  hysteresis: float = AUTO_HYSTERESIS) -> int:
    """The k of ``n_new_clusters="auto"``: the best silhouette (the smaller k on a tie); with a
    warm start, the ``previous`` k unless another one beats its silhouette by ``hysteresis``."""
    best = max(scores, key=lambda e: (scores[e], -e))
    if previous is not None and previous in scores and scores[best] < scores[previous] + hysteresis:
        return previous
    return best


def cluster_unexplained(Z: sp.csr_matrix, n_new: int | str, rng: np.random.Generator,
                        min_cluster_size: int, init: np.ndarray | None = None,
                        max_clusters: int | None = None, min_k: int = 1) -> tuple[np.ndarray, np.ndarray, dict]:
    """Cluster the unit rows ``Z`` (the unexplained documents, columns restricted by the caller)
    into ``n_new`` clusters.

    ``init``: unit centroids of a previous fit (warm start, over the same columns): centroid
    ``j`` starts at ``init[j]`` (k-means++ only for clusters beyond them), the clusters keep
    that order and ``auto`` keeps ``len(init)`` clusters unless another k's silhouette is
    clearly better (:func:`choose_auto_k`). Without ``init``: k-means++ starts, clusters
    numbered by decreasing size.

    Returns ``(labels, centroids, info)``. ``n_new="auto"``: ``n_new`` in 1..``max_clusters``
    (bounded by the rows) with the best cosine silhouette on at most
    :data:`SILHOUETTE_SAMPLE` rows; ``info["silhouette"]`` maps each tried ``n_new``
    to its score. Clusters under ``min_cluster_size`` members are dissolved.

    ``min_k``: ``auto`` tries no smaller k (the splitting of a cluster keeps the previous parts).
    ``info["origin"]``: for each returned cluster, the ``init`` row it continues (-1: none).
    """
    n = Z.shape[0]
    max_clusters = AUTO_MAX_CLUSTERS if max_clusters is None else max_clusters
    warm = init is not None and init.shape[0] > 0
    info: dict[str, Any] = {"warm_start": int(init.shape[0]) if warm else 0}
    if n_new == "auto":
        hi = int(max(1, min(max_clusters, n // max(min_cluster_size, 1))))
        sample = rng.choice(n, size=min(n, SILHOUETTE_SAMPLE), replace=False)
        scores: dict[int, float] = {}
        fits = {}
        p = int(init.shape[0]) if warm else 0
        # a warm start also tries the previous number of clusters (it may exceed max_clusters:
        # a previous fit with a fixed number of clusters)
        lo = min(min_k, hi)
        for extra in [*range(lo, hi + 1), *([p] if hi < p <= n // max(min_cluster_size, 1) else [])]:
            labels, C, _ = spherical_kmeans(Z, extra, rng, prefix=init[:extra] if warm else None)
            fits[extra] = (labels, C)
            scores[extra] = cosine_silhouette(Z[sample], labels[sample])
        best = choose_auto_k(scores, (p if p in scores else min(p, hi)) if warm else None)
        info.update(n_new_chosen=best, silhouette={str(e): round(v, 4) for e, v in scores.items()})
        labels, C = fits[best]
    else:
        # a warm start keeps every previous cluster (the parts of split clusters start the splitting)
        k = int(min(max(int(n_new), init.shape[0] if warm else 0), n))
        labels, C, _ = spherical_kmeans(Z, k, rng, prefix=init if warm else None)
    p = int(init.shape[0]) if warm else 0
    labels, C, kept = dissolve_small(Z, labels, C, min_cluster_size, keep_order=warm, return_kept=True)
    info["origin"] = np.where(kept < p, kept, -1)
    return labels, C, info


def warm_rows(init: sp.spmatrix | None, cols: np.ndarray) -> np.ndarray | None:
    """Rows of ``discovery_init`` over the columns ``cols``, re-normalised (rows left empty dropped)."""
    if init is None or init.shape[0] == 0:
        return None
    P = np.asarray(sp.csr_matrix(init)[:, cols].todense(), dtype=np.float64)
    norms = np.linalg.norm(P, axis=1)
    P = P[norms > 0] / norms[norms > 0, None]
    return P if P.shape[0] else None


def warm_kinds(init: sp.spmatrix | None, cols: np.ndarray) -> np.ndarray:
    """For each row :func:`warm_rows` keeps, what the previous fit made of that cluster (from the
    row's norm): 0 accepted as new (norm 1), 1 rejected (:data:`REJECTED_NORM`), 2 an accepted
    part of a split cluster (:data:`PART_NORM`)."""
    if init is None or init.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    init = sp.csr_matrix(init)
    nonempty = np.asarray(abs(init[:, cols]).sum(axis=1)).ravel() > 0
    full = np.sqrt(np.asarray(init.multiply(init).sum(axis=1)).ravel())[nonempty]
    return np.where(full > (1.0 + REJECTED_NORM) / 2, 0, np.where(full > (REJECTED_NORM + PART_NORM) / 2, 1, 2))


def warm_start_centroids(prev: Any, n_features: int, top_terms: int = WARM_TERMS,
                         max_clusters: int = WARM_MAX_CLUSTERS) -> sp.csr_matrix | None:
    """The clusters a calibrated fit found (``discovery_all_centroids_``, in their order), as the
    ``discovery_init`` of the next fit: at most ``max_clusters`` rows, each pruned to its
    ``top_terms`` largest weights and re-normalised to norm 1 (a cluster the previous fit
    accepted as new), :data:`REJECTED_NORM` (one it rejected) or :data:`PART_NORM` (an accepted
    part of a split cluster); the fit re-normalises the rows, the norm only tells :func:`warm_kinds`. None when ``prev`` is not a calibrated fit
    with clusters over ``n_features`` columns."""
    C = getattr(prev, "__dict__", {}).get("discovery_all_centroids_")
    if C is None or C.shape[0] == 0 or C.shape[1] != n_features:
        return None
    m = min(C.shape[0], max_clusters)
    index = np.asarray(prev.__dict__.get("discovery_cluster_index_", np.zeros(C.shape[0])))[:m]
    parent = np.asarray(prev.__dict__.get("discovery_parent_", np.full(C.shape[0], -1)))[:m]
    scale = np.where(index < 0, REJECTED_NORM, np.where(parent >= 0, PART_NORM, 1.0))
    C = sp.csr_matrix(C[:max_clusters], dtype=np.float64)
    rows, cols, vals = [], [], []
    for r in range(C.shape[0]):  # one small loop over clusters
        lo, hi = C.indptr[r], C.indptr[r + 1]
        v, c = C.data[lo:hi], C.indices[lo:hi]
        top = np.argsort(-np.abs(v), kind="stable")[:top_terms]
        norm = float(np.linalg.norm(v[top]))
        if norm > 0:
            rows.append(np.full(top.size, r))
            cols.append(c[top])
            vals.append(v[top] * (scale[r] / norm))
    if not rows:
        return None
    out = sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=C.shape)
    keep = np.flatnonzero(np.diff(out.indptr) > 0)
    return sp.csr_matrix(out[keep])


def warm_start_discovery(est: Any, prev: Any, n_features: int) -> bool:
    """Engine hook: set ``est``'s ``discovery_init`` to the clusters ``prev`` (the previous
    fitted model of the same algorithm, or None) found, when ``est`` takes the calibrated path.
    Returns True when a warm start was set."""
    params = est.get_params(deep=False) if hasattr(est, "get_params") else {}
    if prev is None or "discovery_init" not in params or not uses_calibrated(est):
        return False
    init = warm_start_centroids(prev, n_features)
    if init is None:
        return False
    est.set_params(discovery_init=init)
    return True


# ---------------------------------------------------------------- the estimator side

def _sparse_rows(C: np.ndarray, cols: np.ndarray, n_features: int) -> sp.csr_matrix:
    """Dense rows over ``cols`` placed into a sparse (rows x n_features) matrix."""
    full = sp.csr_matrix(C)
    full = sp.csr_matrix((full.data, cols[full.indices], full.indptr), shape=(C.shape[0], n_features))
    full.eliminate_zeros()
    return full


def fit_calibrated(est: Any, X: Any, y: Any, **fit_kw: Any) -> Any:
    """Fit ``est`` with calibrated discovery (see the module docstring); returns ``est``.

    Discovery needs only the seeds (tf-idf of the window), so it comes first; the known-class
    model is then ``clone(est)`` with ``n_new_clusters=0`` fitted on the window without the
    documents of the new clusters (``fit_kw`` passed on, ``doc_ids`` restricted likewise), so
    that a large unseeded class does not pull the seeded classes' model. Sets
    ``known_model_``, ``classes_``, ``new_clusters_``, ``labels_`` (indices into
    ``classes_`` of the training rows), ``n_features_in_`` and the ``discovery_*``
    attributes.
    """
    est._validate_params()
    X = check_count_matrix(X, estimator=est)
    codes, classes = encode_single_labels(y, X.shape[0])
    if est.n_new_clusters != "auto":  # the legacy path's check, the same message
        check_n_clusters(classes.size + int(est.n_new_clusters), X.shape[0])
    X = est._validate_counts(X, reset=True)
    if est.discovery_init is not None and est.discovery_init.shape[1] != X.shape[1]:
        raise ValueError(f"discovery_init has {est.discovery_init.shape[1]} columns, X has {X.shape[1]} features")
    n = X.shape[0]
    known = classes
    idf = idf_weights(X)
    Xn = tfidf(X, idf)
    sums, counts = seed_centroids(Xn, codes, known.size)
    loo = loo_seed_similarity(Xn, codes, sums)
    thr = class_thresholds(loo, codes[codes >= 0], known.size, float(est.discovery_quantile))
    cent = l2_normalize_rows(sums)
    S = np.asarray((Xn @ cent.T).todense())
    unexplained = unexplained_mask(S, thr)
    seeds = codes >= 0
    unexplained[seeds] = False
    rows = np.flatnonzero(unexplained)
    min_size = max(MIN_CLUSTER_DOCS, int(n * MIN_CLUSTER_FRACTION))
    rng = np.random.default_rng(getattr(est, "random_state", 0))
    if rows.size >= max(2 * min_size, 2):
        cols = np.unique(Xn[rows].indices)
        Z = sp.csr_matrix(Xn[rows][:, cols])
        n_new = est.n_new_clusters
        # a fixed number: room for as many parts of known classes, the largest new ones kept
        k = n_new if n_new == "auto" else int(n_new) + known.size
        init = warm_rows(est.discovery_init, cols)
        split = bool(est.discovery_split)
        # split parts carried across refits, acceptance hysteresis: ``auto`` only (a fixed number
        # keeps every previous cluster at the first level, and was stable that way: kept 0.996)
        carry = split and n_new == "auto"
        kinds = warm_kinds(est.discovery_init, cols)
        init_parts = None
        if carry and init is not None:
            # the previous parts of split clusters start the splitting of this fit's clusters
            init_parts = init[kinds == 2] if (kinds == 2).any() else None
            init, kinds = (init[kinds != 2], kinds[kinds != 2]) if (kinds != 2).any() else (None, kinds[:0])
        labels_z, C, info = cluster_unexplained(Z, k, rng, min_size, init)
        origin = info.pop("origin")
        seed_rows = np.flatnonzero(seeds)
        margins = seed_margins(loo, S[seed_rows], codes[seed_rows])
        to_own = np.where(np.isfinite(loo), loo, S[seed_rows, codes[seed_rows]])  # leave-one-out
        # acceptance hysteresis (split with a warm start): 1 - h for a cluster continuing one the
        # previous fit accepted, 1 + h for any other (no warm start: 1 for all)
        hysteresis = carry and est.discovery_init is not None
        bias = acceptance_bias(origin, kinds == 0, hysteresis)

        def accept(lab: np.ndarray, cent: np.ndarray, factor: Any, bias: np.ndarray) -> np.ndarray:
            # a cluster that attracts the seeds of a known class (closer to them than the centroid
            # of their class's other seeds) is a part of that class, not a new class ...
            to_new = np.asarray((Xn[seed_rows] @ _sparse_rows(cent, cols, X.shape[1]).T).todense())
            attracted = to_new.max(axis=1) > to_own
            ok = seed_poor_clusters(to_new.argmax(axis=1)[attracted], cent.shape[0],
                                    np.bincount(lab, minlength=cent.shape[0]), float(seeds.mean()),
                                    REJECT_RATIO * (2.0 - bias))
            # ... and so is one whose members are not set apart from their nearest known class as
            # clearly as that class's seeds are set apart from the other classes
            return ok & separated_clusters(Xn[rows], lab, cent.shape[0], S[rows], margins, factor * bias)

        accepted = accept(labels_z, C, 0.5, bias)
        info.update(first_level_accepted=int(accepted.sum()), warm_parts=0 if init_parts is None else len(init_parts))
        parent = np.full(C.shape[0], -1)
        if split:
            # a rejected cluster can be a mixture: a part of a known class with a small unseeded
            # class (R52: ship with trade and money-fx); its own clusters are judged again
            part_size = max(MIN_CLUSTER_DOCS, int(n * SPLIT_MIN_FRACTION))
            labels_z, C, parent, part_origin = split_rejected(Z, labels_z, C, accepted, rng, part_size, init_parts)
            if (parent >= 0).any():
                # a part continuing an accepted part of the previous fit: 1 - h; another: a new one's margin
                part_bias = np.concatenate([bias, acceptance_bias(part_origin[bias.size:],
                                                                  np.ones(0 if init_parts is None else init_parts.shape[0], dtype=bool),
                                                                  hysteresis)])
                part_ok = accept(labels_z, C, np.where(parent >= 0, SPLIT_SEPARATION, 0.5), part_bias)
                accepted = np.concatenate([accepted, part_ok[accepted.size:]])
                info.update(parts_tried=int((parent >= 0).sum()), parts_continued=int((part_origin >= 0).sum()),
                            parts_accepted=int((part_ok & (parent >= 0)).sum()),
                            parts_continued_accepted=int((part_ok & (part_origin >= 0)).sum()),
                            split_clusters=int(np.unique(parent[parent >= 0]).size))
                labels_z, C, accepted, parent = merge_rejected_parts(labels_z, C, parent, accepted)
    else:
        cols = np.zeros(0, dtype=np.int64)
        labels_z, C, info = np.zeros(rows.size, dtype=np.int64), np.zeros((0, 0)), {}
        accepted = np.zeros(0, dtype=bool)
        parent = np.zeros(0, dtype=np.int64)
    new_rows = np.flatnonzero(accepted[labels_z]) if C.shape[0] else np.zeros(0, dtype=np.int64)
    # the largest (unlabeled members) when n_new_clusters is a number; numbered by decreasing
    # size, or after a warm start in the clusters' order (the previous fit's first)
    acc = np.flatnonzero(accepted)
    sizes = np.bincount(labels_z[new_rows], minlength=C.shape[0])[acc]
    acc = acc[np.argsort(-sizes, kind="stable")]
    acc = acc[np.bincount(labels_z[new_rows], minlength=C.shape[0])[acc] > 0]
    if est.n_new_clusters != "auto":
        acc = acc[: int(est.n_new_clusters)]
    if info.get("warm_start"):
        acc = np.sort(acc)
    new_rows = new_rows[np.isin(labels_z[new_rows], acc)]
    order = np.full(C.shape[0], -1)
    order[acc] = np.arange(acc.size)
    m = int(acc.size)
    # the seeded classes' model, fitted without the new clusters' documents
    keep = np.ones(n, dtype=bool)
    keep[rows[new_rows]] = False
    kept = np.flatnonzero(keep)
    base = clone(est).set_params(n_new_clusters=0, discovery_init=None, discovery_split=False)
    prev = fit_kw.get("warm_start_from")
    if prev is not None:
        fit_kw["warm_start_from"] = getattr(prev, "known_model_", prev)
    if fit_kw.get("doc_ids") is not None:
        ids = list(fit_kw["doc_ids"])
        fit_kw["doc_ids"] = ids if kept.size == n else [ids[i] for i in kept]
    y_list = target_list(y, n)
    if kept.size == n:
        base.fit(X, y, **fit_kw)
    else:
        base.fit(X[kept], [y_list[i] for i in kept], **fit_kw)
    if list(np.asarray(base.classes_, dtype=object)) != list(classes):
        raise DegenerateInputError("the known-class model's classes differ from the seeds' classes")
    est.known_model_ = base
    est.discovery_idf_ = idf
    est.discovery_centroids_ = cent
    est.discovery_thresholds_ = thr
    est.discovery_all_centroids_ = _sparse_rows(C, cols, X.shape[1]) if C.shape[0] else sp.csr_matrix((0, X.shape[1]))
    est.discovery_cluster_index_ = order  # all clusters -> new cluster number, -1: a known-class part
    est.discovery_parent_ = parent  # all clusters -> the cluster a part was split from, -1: not a part
    est.discovery_info_ = {**info, "k": m, "n_clusters_tried": int(C.shape[0]),
                           "n_unexplained": int(unexplained.sum())}
    est.new_clusters_ = new_cluster_names(m)
    est.classes_ = np.array(list(known) + est.new_clusters_, dtype=object)
    labels = np.zeros(n, dtype=np.int64)
    labels[kept] = _known_labels(base, X[kept])
    if m:
        labels[rows[new_rows]] = known.size + order[labels_z[new_rows]]
    est.labels_ = labels
    return est


def predict_proba_calibrated(est: Any, X: Any) -> np.ndarray:
    """``predict_proba`` of a calibrated-discovery fit (columns follow ``est.classes_``)."""
    X = est._validate_counts(X, reset=False)
    P = np.asarray(est.known_model_.predict_proba(X), dtype=np.float64)
    m = len(est.new_clusters_)
    if m == 0:
        return P
    Xn = tfidf(X, est.discovery_idf_)
    S = np.asarray((Xn @ est.discovery_centroids_.T).todense())
    u = np.flatnonzero(unexplained_mask(S, est.discovery_thresholds_))
    out = np.zeros((X.shape[0], P.shape[1] + m))
    out[:, : P.shape[1]] = P
    if u.size:
        N = np.asarray((Xn[u] @ est.discovery_all_centroids_.T).todense())
        nearest = est.discovery_cluster_index_[N.argmax(axis=1)]
        new = nearest >= 0
        acc = np.flatnonzero(est.discovery_cluster_index_ >= 0)
        Na = N[:, acc][:, np.argsort(est.discovery_cluster_index_[acc])]
        out[u[new], : P.shape[1]] = 0.0
        out[u[new], P.shape[1]:] = softmax_rows(Na[new], NEW_TEMPERATURE)
    return out


def _known_labels(base: Any, X: sp.csr_matrix) -> np.ndarray:
    """Class index (into the known model's ``classes_``) of each training row."""
    lab = getattr(base, "labels_", None)
    if lab is None or len(lab) != X.shape[0] or np.asarray(lab).dtype.kind not in "iu":
        lab = np.asarray(base.predict_proba(X)).argmax(axis=1)
    return np.asarray(lab, dtype=np.int64)


def acceptance_bias(origin: np.ndarray, was_accepted: np.ndarray, hysteresis: bool,
                    h: float | None = None) -> np.ndarray:
    """Per cluster, the factor on the bounds a cluster must pass to be new (the separation, and the
    inverse of the seed attraction): ``1 - h`` for a cluster continuing (``origin[j]``: the warm-start
    row it continues, -1: none) one the previous fit accepted (``was_accepted`` per warm-start row),
    ``1 + h`` for any other; all 1 without ``hysteresis`` (``h``: :data:`SPLIT_HYSTERESIS`)."""
    h = SPLIT_HYSTERESIS if h is None else h
    if not hysteresis:
        return np.ones(origin.size)
    prev_ok = np.zeros(origin.size, dtype=bool)
    prev_ok[origin >= 0] = was_accepted[origin[origin >= 0]]
    return np.where(prev_ok, 1.0 - h, 1.0 + h)


def split_rejected(Z: sp.csr_matrix, labels: np.ndarray, C: np.ndarray, accepted: np.ndarray,
                   rng: np.random.Generator, min_size: int, init_parts: np.ndarray | None = None,
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Cluster again (``auto``, parts of at least ``min_size`` rows) the members of every
    rejected cluster of at least ``2 min_size`` rows: its parts are appended (their members move to them; the cluster keeps its centroid).
    ``init_parts`` (unit rows, a warm start): the previous fit's parts; those nearest to a
    rejected cluster's centroid start its splitting (:func:`cluster_unexplained`'s ``init``).
    Returns ``(labels, centroids, parent, origin)``, ``parent[j]`` the cluster part ``j`` was split
    from (-1: not a part), ``origin[j]`` the row of ``init_parts`` part ``j`` continues (-1: none)."""
    labels = labels.copy()
    parts, parent, origin = [C], [np.full(C.shape[0], -1)], [np.full(C.shape[0], -1)]
    k = C.shape[0]
    sizes = np.bincount(labels, minlength=k)
    home = (init_parts @ C.T).argmax(axis=1) if init_parts is not None and C.shape[0] else np.zeros(0, dtype=int)
    for r in np.flatnonzero(~accepted & (sizes >= 2 * min_size)):  # at most one pass over the clusters
        sub = np.flatnonzero(labels == r)
        inside = np.flatnonzero(home == r)
        lab, Cs, info = cluster_unexplained(sp.csr_matrix(Z[sub]), "auto", rng, min_size,
                                            init_parts[inside] if inside.size else None, min_k=inside.size + 1)
        if Cs.shape[0] < 2:
            continue
        parts.append(Cs)
        parent.append(np.full(Cs.shape[0], r))
        o = info["origin"]
        origin.append(np.where(o >= 0, inside[np.maximum(o, 0)] if inside.size else -1, -1))
        labels[sub] = k + lab
        k += Cs.shape[0]
    return labels, np.vstack(parts), np.concatenate(parent), np.concatenate(origin)


def merge_rejected_parts(labels: np.ndarray, C: np.ndarray, parent: np.ndarray,
                         accepted: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The members of rejected parts go back to the cluster they were split from, and those
    parts are dropped: ``(labels, centroids, accepted, parent)`` of the clusters kept, in order."""
    drop = (parent >= 0) & ~accepted
    lab = labels.copy()
    back = drop[lab]
    lab[back] = parent[lab[back]]
    keep = np.flatnonzero(~drop)
    remap = np.full(C.shape[0], -1)
    remap[keep] = np.arange(keep.size)
    return remap[lab], C[keep], accepted[keep], np.where(parent[keep] >= 0, remap[np.maximum(parent[keep], 0)], -1)


def seed_margins(loo: np.ndarray, S_seeds: np.ndarray, seed_codes: np.ndarray) -> np.ndarray:
    """Per known class: the median over its seeds of (leave-one-out similarity to its own class
    minus the best similarity to another class); nan for a class without a usable seed."""
    other = S_seeds.copy()
    other[np.arange(other.shape[0]), seed_codes] = -np.inf
    margin = loo - other.max(axis=1, initial=-1.0)
    out = np.full(S_seeds.shape[1], np.nan)
    for k in range(out.size):  # one small loop over classes
        v = margin[(seed_codes == k) & np.isfinite(margin)]
        if v.size:
            out[k] = float(np.median(v))
    return out


def separated_clusters(Zn: sp.csr_matrix, labels: np.ndarray, k: int, S_members: np.ndarray,
                       class_margin: np.ndarray, factor: float = 0.5) -> np.ndarray:
    """Clusters whose members are set apart from their nearest known class: the mean over members
    of (leave-one-out similarity to their cluster minus the best similarity to a known class) is at
    least ``factor`` times the seed margin (:func:`seed_margins`) of the class nearest to the cluster."""
    H = sp.csr_matrix((np.ones(labels.size), (labels, np.arange(labels.size))), shape=(k, Zn.shape[0]))
    sums = sp.csr_matrix(H @ Zn)
    loo = loo_seed_similarity(Zn, labels, sums)  # each member against the other members
    gap = np.where(np.isfinite(loo), loo, 0.0) - S_members.max(axis=1)
    size = np.maximum(np.bincount(labels, minlength=k), 1)
    mean_gap = np.bincount(labels, weights=gap, minlength=k) / size
    nearest = np.argmax(H @ S_members, axis=1) if S_members.shape[1] else np.zeros(k, dtype=int)
    need = factor * np.nan_to_num(class_margin[np.asarray(nearest).ravel()], nan=0.0)
    return mean_gap >= need


def seed_poor_clusters(seed_cluster: np.ndarray, k: int, size: np.ndarray, seed_rate: float,
                       ratio: float = 0.5) -> np.ndarray:
    """Clusters that are new: they attract fewer seeds (``seed_cluster``: the cluster of each
    attracted seed) than ``max(1, ratio * seed_rate * size)``, where a part of a known class
    of ``size`` documents would attract about ``seed_rate * size``."""
    n_seeds = np.bincount(seed_cluster, minlength=k)
    return n_seeds < np.maximum(1.0, ratio * seed_rate * size)


def explain_weights_calibrated(est: Any) -> sp.csr_matrix:
    """Word weights of a calibrated fit: the known model's, then the new clusters' centroids."""
    W = sp.csr_matrix(est.known_model_._explain_weights())
    acc = np.flatnonzero(est.discovery_cluster_index_ >= 0)
    new = est.discovery_all_centroids_[acc[np.argsort(est.discovery_cluster_index_[acc])]]
    return sp.vstack([W, sp.csr_matrix(new.multiply(est.discovery_idf_[None, :]))], format="csr")


class DiscoveryMixin:
    """``predict_proba`` / ``predict`` / ``explain`` of calibrated fits; the legacy path otherwise.

    Put first among an estimator's bases; the estimator's ``fit`` starts with
    ``if uses_calibrated(self): return fit_calibrated(self, X, y)``. An estimator that
    defines ``predict_proba`` / ``predict`` itself (D-LDA) starts them with
    ``if self._calibrated_fit(): return ...`` instead.
    """

    def _calibrated_fit(self) -> bool:
        return "known_model_" in self.__dict__

    def __getattr__(self, name: str) -> Any:
        # a calibrated fit's other fitted attributes (centroids, projections, ...) are the
        # known-class model's: transform and the like keep working on the seeded classes
        known = self.__dict__.get("known_model_")
        if known is not None and name.endswith("_") and not name.startswith("__"):
            return getattr(known, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def predict_proba(self, X: Any) -> np.ndarray:
        """Class / new-cluster probabilities (columns follow ``classes_``)."""
        if self._calibrated_fit():
            return predict_proba_calibrated(self, X)
        return super().predict_proba(X)  # type: ignore[misc]

    def predict(self, X: Any) -> np.ndarray:
        """Class or ``new-N`` cluster of each row."""
        if self._calibrated_fit():
            return self.classes_[predict_proba_calibrated(self, X).argmax(axis=1)]  # type: ignore[attr-defined]
        return super().predict(X)  # type: ignore[misc]

    def explain(self, sketch: Any = None, top_n: int = 10) -> dict[str, list[str]]:
        """Top words of each class / cluster."""
        if self._calibrated_fit():
            from streamsemi.algorithms.base import explain_weights

            return explain_weights(self.classes_, explain_weights_calibrated(self), sketch, top_n)  # type: ignore[attr-defined]
        return super().explain(sketch, top_n)  # type: ignore[misc]


__all__ = ["DISCOVERY_CONSTRAINTS", "DiscoveryMixin", "uses_calibrated", "legacy_n_new", "fit_calibrated",
           "predict_proba_calibrated", "cluster_unexplained", "spherical_kmeans", "class_thresholds",
           "loo_seed_similarity", "unexplained_mask", "cosine_silhouette"]
