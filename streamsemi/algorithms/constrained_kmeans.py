"""Constrained spherical k-means (Basu, Banerjee & Mooney 2002) on sublinear tf-idf.

The baseline every paper algorithm must beat, and the daemon's fallback model.
Centroids start at the (normalised) mean of each class's seeds; with
``constrained=True`` (COP/constrained k-means) seeds stay in their class in every
assignment step, with ``constrained=False`` (seeded k-means) seeds only
initialise. Similarity is cosine on l2-normalised sublinear tf-idf rows.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from numbers import Integral, Real
from typing import Any

import numpy as np
import scipy.sparse as sp
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted

from streamsemi.algorithms._discovery import (
    DISCOVERY_CONSTRAINTS,
    DiscoveryMixin,
    fit_calibrated,
    uses_calibrated,
)
from streamsemi.algorithms._heldout import chosen_rounds, gain_se, held_out_folds, macro_f1_by_round
from streamsemi.algorithms.base import (
    RANDOM_STATE,
    DerivedArrays,
    ScoresClassifierMixin,
    StreamsemiEstimator,
    TransformerMixin,
    new_cluster_names,
    sparse_dot_t,
)
from streamsemi.algorithms.ensemble import row_keys
from streamsemi.core.features import idf_weights, l2_normalize_rows, tfidf

#: ``prototypes="by-size"``: seeds per prototype at least (a class's centroids are started from its seeds)
PROTOTYPE_MIN_SEEDS = 10
#: ``seed_weight="held-out"``: the weights compared (1 first: Basu et al., kept unless another beats it),
SEED_WEIGHT_CANDIDATES = (1.0, 8.0)
#: the folds of the seeds hidden in turn, the bootstrap resamples of the held-out seeds for the standard
#: error of the gain, and the standard errors by which the heavier weight must beat 1
SEED_WEIGHT_FOLDS = 3
SEED_WEIGHT_BOOTSTRAP = 200
SEED_WEIGHT_GAIN_Z = 1.0
#: a warm-started fit (``warm_start_from``, the engine's refits of a full window) keeps the previous
#: fit's choice (one fit instead of seven) while the seeds added or removed since that choice are at
#: most this share of its seeds, for at most :data:`SEED_WEIGHT_MAX_AGE` fits after the one that chose
SEED_WEIGHT_KEEP_SEEDS = 0.5
SEED_WEIGHT_MAX_AGE = 4
#: ``seed_exemplars=True``: a seed is one more prototype of its class for the documents whose cosine
#: similarity to it is at least this multiple of the fit's mean similarity of a document to its centroid
#: (chosen on the development corpora of ``benchmarks/active_learning.py``, docs/algorithms/constrained-kmeans.md)
EXEMPLAR_GATE = 1.5
#: rows per block of the exemplar similarities (bounds the sparse block: rows x seeds)
EXEMPLAR_CHUNK_ROWS = 1024
#: per fitted model, its exemplars transposed for prediction (weak keys: not checkpointed, goes with the model)
_EXEMPLARS_T: DerivedArrays[sp.csr_matrix] = DerivedArrays()


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


def prototype_counts(class_sizes: np.ndarray, seed_counts: np.ndarray, min_seeds: int) -> np.ndarray:
    """Prototypes per class for ``prototypes="by-size"``: a class ``r`` times the mean class size
    gets ``round(r)`` centroids, at most one per ``min_seeds`` of its seeds, at least one.

    Spherical k-means gives every centroid a region of comparable spread, so one centroid for a
    class several times the size of the others leaves the class's outlying documents to its
    neighbours (R8: constrained k-means gives acq about 800 earn stories). ``class_sizes`` are
    the documents a one-centroid fit assigns to each class (not the seed counts: seeds picked
    by a person or the suggestion queue are not a stratified sample); a balanced corpus keeps
    one centroid per class (plain constrained k-means).
    """
    sizes = np.asarray(class_sizes, dtype=np.float64)
    seeds = np.asarray(seed_counts, dtype=np.int64)
    if sizes.size == 0 or sizes.sum() <= 0:
        return np.ones(sizes.size, dtype=np.int64)
    by_size = np.rint(sizes / sizes.mean())
    return np.maximum(1, np.minimum(by_size, seeds // max(1, min_seeds))).astype(np.int64)


def split_seeds(Xn: sp.csr_matrix, rows: np.ndarray, m: int, n_iter: int = 10) -> np.ndarray:
    """``m`` unit centroids of the seed rows ``rows``: spherical k-means among them (:func:`lloyd`,
    no constraint), started at their mean and then farthest-first (deterministic). ``m = 1``: their mean.
    """
    S = Xn[rows]
    C = _normalize_dense_rows(np.asarray(S.sum(axis=0)))
    for _ in range(1, m):
        nearest = np.asarray(S @ C.T).max(axis=1)
        C = np.vstack([C, S[int(np.argmin(nearest))].toarray()])
    if m > 1:
        C = lloyd(S, C, np.full(S.shape[0], -1), False, n_iter)[0]
    return C


def prototype_seed_means(Xn: sp.csr_matrix, codes: np.ndarray, m: np.ndarray,
                         rng: np.random.Generator | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Starting centroids, ``m[c]`` for class ``c``, and the class of each.

    Each class's centroids are :func:`split_seeds` of its seeds (of a bootstrap resample of
    them when ``rng`` is given: the restarts of ``n_init``).
    """
    n_classes = len(m)
    blocks, owner = [], []
    for c in range(n_classes):
        rows = np.flatnonzero(codes == c)
        if rng is not None and rows.size:
            rows = rng.choice(rows, size=rows.size, replace=True)
        blocks.append(split_seeds(Xn, rows, int(m[c])) if rows.size
                      else np.zeros((1, Xn.shape[1])))
        owner += [c] * blocks[-1].shape[0]
    return np.vstack(blocks), np.asarray(owner, dtype=np.int64)


def class_means(Xn: sp.csr_matrix, labels: np.ndarray, n_classes: int, prototypes: np.ndarray,
                owner: np.ndarray) -> np.ndarray:
    """Unit mean of each class's rows (:func:`seed_means` of ``labels``); a class without rows: the
    unit mean of its prototypes."""
    C = seed_means(Xn, labels, n_classes)
    for c in np.flatnonzero(np.bincount(labels, minlength=n_classes) == 0):
        C[c] = _normalize_dense_rows(prototypes[owner == c].sum(axis=0, keepdims=True))[0]
    return C


def several_centroids(owner: np.ndarray, classes: np.ndarray) -> dict[str, int]:
    """``{class name: centroids}`` for the classes given more than one (a fit summary's ``prototypes``)."""
    counts = np.bincount(owner, minlength=len(classes))
    return {str(classes[c]): int(n) for c, n in enumerate(counts) if n > 1}


def class_scores(S: np.ndarray, owner: np.ndarray, n_classes: int) -> np.ndarray:
    """Per class, the largest of its centroids' columns of ``S`` (n_rows x n_centroids)."""
    out = np.full((S.shape[0], n_classes), -np.inf)
    for c in range(n_classes):   # a few tens of classes: one vectorised max each
        cols = np.flatnonzero(owner == c)
        if cols.size:
            out[:, c] = S[:, cols].max(axis=1)
    return out


def exemplar_rows(Xn: sp.csr_matrix, codes: np.ndarray) -> tuple[sp.csr_matrix, np.ndarray]:
    """The seeds' unit tf-idf rows ordered by class, and the class code of each."""
    seeds = np.flatnonzero(codes >= 0)
    order = seeds[np.argsort(codes[seeds], kind="stable")]
    return Xn[order], np.asarray(codes[order], dtype=np.int64)


def exemplar_class_scores(Xn: sp.csr_matrix, exemplars_t: sp.csr_matrix, owner: np.ndarray, n_classes: int,
                          min_similarity: float, chunk_rows: int = EXEMPLAR_CHUNK_ROWS) -> np.ndarray:
    """Per row of ``Xn`` (unit tf-idf) and class, the highest cosine similarity to one of the class's
    exemplars that reaches ``min_similarity``; 0 where none does.

    ``exemplars_t`` is the exemplars' matrix transposed, in CSR (n_features x n_exemplars: each
    product then reads only the features of the rows), and ``owner`` the class of each exemplar.
    Computed ``chunk_rows`` rows at a time: the sparse block of similarities is at most
    ``chunk_rows x n_exemplars`` entries.
    """
    out = np.zeros((Xn.shape[0], n_classes))
    if exemplars_t.shape[1] == 0:
        return out
    for lo in range(0, Xn.shape[0], chunk_rows):
        block = sp.coo_matrix(Xn[lo:lo + chunk_rows] @ exemplars_t)
        keep = block.data >= min_similarity
        np.maximum.at(out, (block.row[keep] + lo, owner[block.col[keep]]), block.data[keep])
    return out


def lloyd(Xn: sp.csr_matrix, C: np.ndarray, codes: np.ndarray, constrained: bool,
          max_iter: int, owner: np.ndarray | None = None,
          seed_weight: float = 1.0) -> tuple[np.ndarray, np.ndarray, int, float]:
    """Spherical k-means rounds from centroids ``C``; seeds fixed to their class if ``constrained``.

    ``owner`` (one class code per row of ``C``; None: row ``k`` is class ``k``) lets a class
    have several centroids (prototypes): a constrained seed then goes to the most similar
    centroid of its own class.

    Returns the centroids, the labels (rows of ``C``; the class is ``owner[label]``), the
    rounds run and the objective: the summed cosine similarity of each row to its assigned
    centroid (higher is better).
    """
    n_clusters = C.shape[0]
    seeds = np.flatnonzero(codes >= 0)
    labels = np.full(Xn.shape[0], -1)
    weight = np.ones(Xn.shape[0])
    weight[seeds] = seed_weight
    n_iter = 0
    for n_iter in range(1, max_iter + 1):  # noqa: B007
        if owner is None or not constrained:
            new = np.asarray(Xn @ C.T).argmax(axis=1)
        else:
            S = np.asarray(Xn @ C.T)
            S_seeds = S[seeds]
            S_seeds[owner[None, :] != codes[seeds][:, None]] = -np.inf
            S[seeds] = S_seeds
            new = S.argmax(axis=1)
        if constrained and owner is None:
            new[seeds] = codes[seeds]
        if np.array_equal(new, labels):
            break
        labels = new
        H = sp.csr_matrix((weight, (labels, np.arange(labels.size))), shape=(n_clusters, Xn.shape[0]))
        sums = np.asarray((H @ Xn).todense())
        empty = np.bincount(labels, minlength=n_clusters) == 0
        sums[empty] = C[empty]  # an emptied cluster keeps its previous centroid
        C = _normalize_dense_rows(sums)
    S = np.asarray(Xn @ C.T)
    objective = float(S[np.arange(labels.size), labels].sum())
    return C, labels, n_iter, objective


def by_size_pass(Xn: sp.csr_matrix, codes: np.ndarray, n_known: int,
                 found: tuple[np.ndarray, np.ndarray, int, float], constrained: bool, max_iter: int,
                 rng: np.random.Generator | None = None, seed_weight: float = 1.0,
                 ) -> tuple[tuple[np.ndarray, np.ndarray, int, float], np.ndarray | None]:
    """The second pass of ``prototypes="by-size"`` after the one-centroid fit ``found`` (:func:`lloyd`'s
    result; rows ``n_known:`` of its centroids are discovered clusters): each class gets
    :func:`prototype_counts` centroids, started from its seeds (:func:`prototype_seed_means`; discovered
    clusters start where they ended), and the k-means runs again. Returns that fit and the class of each
    centroid, or ``found`` and None when every class keeps one centroid (a balanced corpus: the plain fit)."""
    n_clusters = found[0].shape[0]
    m = prototype_counts(np.bincount(found[1], minlength=n_clusters)[:n_known],
                         np.bincount(codes[codes >= 0], minlength=n_known), PROTOTYPE_MIN_SEEDS)
    if not (m > 1).any():
        return found, None
    P, owner = prototype_seed_means(Xn, codes, m, rng)
    if n_clusters > n_known:
        P = np.vstack([P, found[0][n_known:]])
        owner = np.r_[owner, np.arange(n_known, n_clusters)]
    return lloyd(Xn, P, codes, constrained, max_iter, owner, seed_weight), owner


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


def seed_set_keys(X: sp.csr_matrix, codes: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """Sorted unique 64-bit keys of the seeds as (content, class) pairs.

    ``X``: the counts (a document's row is the same in any window; its content key is
    :func:`~streamsemi.algorithms.ensemble.row_keys`); ``codes``: class index of each row (-1:
    unlabeled). A seed relabelled to another class gets another key.
    """
    seeds = np.flatnonzero(codes >= 0)
    content = row_keys(X, seeds)[seeds]
    keys = [int.from_bytes(hashlib.blake2b(f"{k}\x1f{classes[c]}".encode(), digest_size=8).digest(), "little")
            for k, c in zip(content.tolist(), codes[seeds].tolist(), strict=True)]   # seeds only
    return np.unique(np.asarray(keys, dtype=np.uint64))


def choice_still_holds(prev_seeds: np.ndarray, seeds: np.ndarray, age: int, *,
                       keep_seeds: float = SEED_WEIGHT_KEEP_SEEDS, max_age: int = SEED_WEIGHT_MAX_AGE) -> bool:
    """Whether a seed weight chosen with seed keys ``prev_seeds`` and kept for ``age`` fits since
    still stands for a fit with seed keys ``seeds``.

    True when the seeds added or removed since the choice are at most ``keep_seeds`` of the
    choice's seeds and the choice has served fewer than ``max_age`` fits after its own. The age
    bound, not the window's turnover, is what re-checks the choice as documents pass: at 1,000
    docs/s a 10,000-document window turns over during one seven-fit refit, so a turnover bound
    would re-choose at every refit.
    """
    changed = np.setdiff1d(prev_seeds, seeds).size + np.setdiff1d(seeds, prev_seeds).size
    return prev_seeds.size > 0 and changed <= keep_seeds * prev_seeds.size and age < max_age


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
    prototypes : {"one", "by-size"}, default="one"
        Centroids per seeded class. ``"one"``: one each (Basu et al.; the evaluation baseline).
        ``"by-size"`` (the worker's default, ``DAEMON_PARAMS``): after the one-centroid fit, a
        class it makes ``r`` times the mean class size gets ``round(r)`` centroids, at most one
        per :data:`PROTOTYPE_MIN_SEEDS` of its seeds (:func:`prototype_counts`), started by
        spherical k-means among its seeds, and the k-means runs again; a document takes the
        class of its most similar centroid. A balanced corpus keeps one per class (the same
        fit as ``"one"``). docs/algorithms/constrained-kmeans.md.
    n_init : int >= 1, default=1
        Runs of the k-means, keeping the one with the highest objective (summed cosine
        similarity of the rows to their centroids, ``objective_``), as scikit-learn's
        ``KMeans(n_init=...)``. The first run starts at the seed means; each further run
        at the means of a bootstrap resample of every class's seeds
        (:func:`bootstrap_seed_means`, drawn from ``random_state``).
    temperature : float, default=0.05
        Softmax temperature turning cosine similarities into ``predict_proba``.
    seed_weight : float >= 1 or "held-out", default=1.0
        How many documents each seed counts for in its class's centroid (1: Basu et al.; the
        weighting of labelled against unlabeled documents of Nigam et al. 2000's EM-lambda).
        ``"held-out"`` (the worker's default, ``DAEMON_PARAMS``): each candidate of
        :data:`SEED_WEIGHT_CANDIDATES` fits the window with each fold of the seeds hidden in turn,
        and the heavier weight replaces 1 only when its macro-F1 on the hidden seeds is higher by
        more than :data:`SEED_WEIGHT_GAIN_Z` bootstrap standard errors (seven fits instead of one;
        a refit from ``warm_start_from`` keeps its choice while the seeds changed little, for at
        most :data:`SEED_WEIGHT_MAX_AGE` fits, :func:`choice_still_holds`).
        docs/algorithms/constrained-kmeans.md.
    seed_exemplars : bool, default=False
        Each seed is also a prototype of its own class: a document whose cosine similarity to a
        seed reaches :data:`EXEMPLAR_GATE` times the fit's mean similarity of a document to its
        centroid (``objective_ / n``), and exceeds its similarity to every centroid, takes that
        seed's class. The close neighbours of a labelled document (its near copies, the posts
        that quote it) follow its label. ``False``: centroids only (Basu et al.; the evaluation
        baseline). ``True`` is the worker's default (``DAEMON_PARAMS``).
        docs/algorithms/constrained-kmeans.md.
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
        Unit-length centroids in tf-idf space (with ``prototypes="by-size"``: the unit mean
        of each class's training rows, which ``explain`` lists).
    prototype_owner_ : ndarray of int, shape (n_prototypes,)
        The cluster (index into ``classes_``) of each centroid the documents are assigned to
        (``arange(n_clusters)`` when every cluster has one: the centroids are ``cluster_centers_``).
    prototype_centers_ : ndarray of shape (n_prototypes, n_features)
        Only when some class has several centroids: the centroids, rows as ``prototype_owner_``.
    labels_ : ndarray of int
        Cluster index of each training row.
    n_iter_ : int
    objective_ : float
        Summed cosine similarity of the training rows to their assigned centroids (the kept run's).
    seed_weight_ : float
        The seed weight of the fit (``seed_weight``, or the one ``"held-out"`` chose).
    seed_weight_scores_ : ndarray of shape (len(SEED_WEIGHT_CANDIDATES),) or None
        ``"held-out"``: each candidate's macro-F1 on the held-out seeds (None otherwise, or when
        no class has two seeds).
    seed_weight_seed_keys_ : ndarray of uint64 or None
        ``"held-out"``: keys of the seeds the weight was chosen with (:func:`seed_set_keys`; a
        warm-started fit compares them with its own).
    seed_weight_age_ : int or None
        ``"held-out"``: fits since the choice (0: chosen by this fit; k > 0: ``warm_start_from``'s
        choice kept without held-out fits).
    exemplars_ : sparse matrix of shape (n_seeds, n_features) or None
        ``seed_exemplars=True``: the seeds' unit tf-idf rows, ordered by class (None otherwise).
    exemplar_owner_ : ndarray of int, shape (n_seeds,) or None
        The class (index into ``classes_``) of each row of ``exemplars_``.
    exemplar_min_similarity_ : float or None
        The similarity from which a seed counts as a prototype (:data:`EXEMPLAR_GATE` times the
        mean similarity of the training rows to their centroids).
    """

    #: the engine passes the previous fit (``warm_start_from``); only the seed weight's choice is kept
    supports_warm_start = True

    _parameter_constraints = {
        "constrained": ["boolean"],
        **DISCOVERY_CONSTRAINTS,
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "n_init": [Interval(Integral, 1, None, closed="left")],
        "prototypes": [StrOptions({"one", "by-size"})],
        "temperature": [Interval(Real, 0, None, closed="neither")],
        "seed_weight": [Interval(Real, 1, None, closed="left"), StrOptions({"held-out"})],
        "seed_exemplars": ["boolean"],
        "random_state": RANDOM_STATE,
    }

    def __init__(self, constrained: bool = True, *, n_new_clusters: int = 0, max_iter: int = 50,
                 temperature: float = 0.05, discovery: str = "calibrated",
                 discovery_quantile: float = 0.4, discovery_init: Any = None,
                 discovery_split: bool = False, prototypes: str = "one", n_init: int = 1,
                 seed_weight: float | str = 1.0, seed_exemplars: bool = False,
                 random_state: int | None = 0) -> None:
        self.constrained = constrained
        self.n_new_clusters = n_new_clusters
        self.discovery = discovery
        self.discovery_quantile = discovery_quantile
        self.discovery_init = discovery_init
        self.discovery_split = discovery_split
        self.max_iter = max_iter
        self.prototypes = prototypes
        self.n_init = n_init
        self.temperature = temperature
        self.seed_weight = seed_weight
        self.seed_exemplars = seed_exemplars
        self.random_state = random_state

    def fit(self, X: Any, y: Any, doc_ids: Sequence[Any] | None = None,
            warm_start_from: ConstrainedKMeans | None = None) -> ConstrainedKMeans:
        """Fit on counts ``X`` with seed labels ``y`` (None/-1 = unlabeled).

        Parameters
        ----------
        X : sparse matrix of shape (n_samples, n_features)
            Term counts.
        y : sequence of length n_samples
            Seed label of each row; None or -1 for unlabeled.
        doc_ids : sequence, optional
            Not used (documents are matched by content); accepted because the engine passes it
            to every warm-starting estimator.
        warm_start_from : ConstrainedKMeans, optional
            The previous fit (the engine passes it for refits of a full window with the same
            seeded classes). With ``seed_weight="held-out"`` its chosen weight is kept without the
            six held-out fits while :func:`choice_still_holds` (the seeds changed by at most
            :data:`SEED_WEIGHT_KEEP_SEEDS`, at most :data:`SEED_WEIGHT_MAX_AGE` fits since the
            choice); nothing else is carried over.

        Returns
        -------
        self : ConstrainedKMeans
        """
        if warm_start_from is not None and not isinstance(warm_start_from, ConstrainedKMeans):
            raise TypeError("warm_start_from must be a fitted ConstrainedKMeans, got "
                            f"{type(warm_start_from).__name__}")
        if uses_calibrated(self):
            return fit_calibrated(self, X, y, doc_ids=doc_ids, warm_start_from=warm_start_from)
        X, codes, classes = self._fit_inputs(X, y)
        n_known = classes.size
        self.idf_ = idf_weights(X)
        Xn = tfidf(X, self.idf_)
        (self.seed_weight_, self.seed_weight_scores_, self.seed_weight_seed_keys_,
         self.seed_weight_age_) = self._seed_weight(X, codes, classes, Xn, warm_start_from)
        best, best_owner = self._lloyd_runs(Xn, codes, n_known, self.seed_weight_)
        C, labels, n_iter, self.objective_ = best
        n_clusters = n_known + int(self.n_new_clusters)
        self.prototype_owner_ = np.arange(n_clusters) if best_owner is None else best_owner
        if best_owner is not None:   # (no copy of the centroids when each class has one: checkpoint bytes)
            self.prototype_centers_ = C
            labels = best_owner[labels]
            C = class_means(Xn, labels, n_clusters, C, best_owner)
        self.cluster_centers_ = C
        self.labels_ = labels
        self.n_iter_ = n_iter
        self.exemplars_ = self.exemplar_owner_ = self.exemplar_min_similarity_ = None
        if self.seed_exemplars:
            self.exemplars_, self.exemplar_owner_ = exemplar_rows(Xn, codes)
            self.exemplar_min_similarity_ = EXEMPLAR_GATE * self.objective_ / max(Xn.shape[0], 1)
            # the training rows a seed reaches past the gate are assigned as predict does (seeds stay in
            # their class); the others keep the k-means assignment, which is predict's on a converged fit
            M = self._exemplar_scores(Xn)
            rows = np.flatnonzero(M.max(axis=1) > 0)
            if self.constrained:
                rows = rows[codes[rows] < 0]
            self.labels_[rows] = np.maximum(self._centroid_scores(Xn[rows]), M[rows]).argmax(axis=1)
        self.new_clusters_ = new_cluster_names(int(self.n_new_clusters))
        self.classes_ = np.array(list(classes) + self.new_clusters_, dtype=object)
        return self

    def _lloyd_runs(self, Xn: sp.csr_matrix, codes: np.ndarray, n_known: int, seed_weight: float,
                    ) -> tuple[tuple[np.ndarray, np.ndarray, int, float], np.ndarray | None]:
        """The ``n_init`` k-means runs (each with its by-size pass): the kept run (:func:`lloyd`'s
        result) and the class of each of its centroids (None: one per class)."""
        rng = np.random.default_rng(self.random_state)
        best: tuple[np.ndarray, np.ndarray, int, float] | None = None
        best_owner: np.ndarray | None = None
        for run in range(int(self.n_init)):
            C = seed_means(Xn, codes, n_known) if run == 0 else bootstrap_seed_means(Xn, codes, n_known, rng)
            if self.n_new_clusters:
                unl = np.flatnonzero(codes < 0)
                C = farthest_point_centroids(Xn, C, unl, int(self.n_new_clusters), rng)
            found, owner = lloyd(Xn, C, codes, self.constrained, int(self.max_iter), seed_weight=seed_weight), None
            if self.prototypes == "by-size":   # a second pass when some class is several times the mean size
                found, owner = by_size_pass(Xn, codes, n_known, found, self.constrained, int(self.max_iter),
                                            rng if run else None, seed_weight)
            if best is None or found[3] > best[3]:
                best, best_owner = found, owner
        assert best is not None
        return best, best_owner

    def warm_start_view(self) -> ConstrainedKMeans:
        """What a warm-started fit reads of this fitted model: its seed-weight choice, without the
        centroids (the engine sends the previous model to the fit process at every refit, and a
        model's centroids are 2 MiB per class at the default 2**18 features).

        Returns
        -------
        view : ConstrainedKMeans
            Unfitted but for ``seed_weight_``, ``seed_weight_scores_``, ``seed_weight_seed_keys_``,
            ``seed_weight_age_`` and, after calibrated discovery, ``known_model_``'s view.
        """
        check_is_fitted(self)
        view = type(self)(**self.get_params(deep=False))
        for name in ("seed_weight_", "seed_weight_scores_", "seed_weight_seed_keys_", "seed_weight_age_"):
            if hasattr(self, name):
                setattr(view, name, getattr(self, name))
        known = getattr(self, "known_model_", None)
        if isinstance(known, ConstrainedKMeans):
            view.known_model_ = known.warm_start_view()
        return view

    def _seed_weight(self, X: sp.csr_matrix, codes: np.ndarray, classes: np.ndarray, Xn: sp.csr_matrix,
                     prev: ConstrainedKMeans | None,
                     ) -> tuple[float, np.ndarray | None, np.ndarray | None, int | None]:
        """The seed weight, its candidates' held-out scores, the keys of the seeds it was chosen with
        and the fits since the choice: ``prev``'s choice one fit older while :func:`choice_still_holds`,
        else a new one (:meth:`_choose_seed_weight`)."""
        if self.seed_weight != "held-out":
            return float(self.seed_weight), None, None, None
        seeds = seed_set_keys(X, codes, classes)
        kept = None if prev is None else getattr(prev, "seed_weight_seed_keys_", None)
        if kept is not None and choice_still_holds(kept, seeds, int(prev.seed_weight_age_)):
            return float(prev.seed_weight_), prev.seed_weight_scores_, kept, int(prev.seed_weight_age_) + 1
        weight, scores = self._choose_seed_weight(Xn, codes, classes.size)
        return weight, scores, seeds, 0

    def _choose_seed_weight(self, Xn: sp.csr_matrix, codes: np.ndarray, n_known: int,
                            ) -> tuple[float, np.ndarray | None]:
        """The seed weight of the fit and, for ``seed_weight="held-out"``, the held-out macro-F1 of
        each candidate of :data:`SEED_WEIGHT_CANDIDATES` (None otherwise, or when no seed can be
        held out: every class has one).

        Each fold of the seeds (:func:`~streamsemi.algorithms._heldout.held_out_folds`, dealt by content)
        is hidden in turn; every candidate weight fits the window without it and predicts its
        seeds. The heavier weight replaces 1 (Basu et al.) only when its held-out macro-F1 is
        higher by more than :data:`SEED_WEIGHT_GAIN_Z` paired-bootstrap standard errors
        (:func:`~streamsemi.algorithms._heldout.chosen_rounds`, candidates for rounds).
        """
        keys = row_keys(Xn, np.flatnonzero(codes >= 0))
        folds = held_out_folds(codes, SEED_WEIGHT_FOLDS, np.random.default_rng(self.random_state), keys)
        if not (folds >= 0).any():
            return SEED_WEIGHT_CANDIDATES[0], None
        history: list[list[np.ndarray]] = [[] for _ in SEED_WEIGHT_CANDIDATES]
        truth = []
        for f in np.unique(folds[folds >= 0]):
            hidden = np.flatnonzero(folds == f)
            fit_codes = codes.copy()
            fit_codes[hidden] = -1
            for j, w in enumerate(SEED_WEIGHT_CANDIDATES):
                (_, labels, _, _), owner = self._lloyd_runs(Xn, fit_codes, n_known, w)
                history[j].append(labels[hidden] if owner is None else owner[labels[hidden]])
            truth.append(codes[hidden])
        H = np.minimum(np.array([np.concatenate(h) for h in history]), n_known)   # a new cluster: no class
        t = np.concatenate(truth)
        scores = macro_f1_by_round(H, t)
        se = gain_se(H, t, SEED_WEIGHT_BOOTSTRAP, np.random.default_rng(self.random_state), reference=0)
        pick = chosen_rounds(scores, se, default=0, z=SEED_WEIGHT_GAIN_Z) - 1
        return SEED_WEIGHT_CANDIDATES[pick], scores

    def _scores(self, X: Any) -> np.ndarray:
        X = self._validate_counts(X, reset=False)
        return self._class_scores(tfidf(X, self.idf_))

    def _class_scores(self, Xn: sp.csr_matrix) -> np.ndarray:
        """Each class's score of every row of ``Xn`` (unit tf-idf): its highest cosine similarity to
        one of the class's centroids or, with exemplars, to one of its seeds past the gate."""
        S = self._centroid_scores(Xn)
        M = self._exemplar_scores(Xn)
        return S if M is None else np.maximum(S, M)

    def _centroid_scores(self, Xn: sp.csr_matrix) -> np.ndarray:
        """Each class's highest cosine similarity of every row of ``Xn`` to one of its centroids."""
        owner = getattr(self, "prototype_owner_", None)   # absent in models saved before prototypes
        if owner is None or owner.size == self.cluster_centers_.shape[0]:
            return sparse_dot_t(Xn, self.cluster_centers_)
        return class_scores(sparse_dot_t(Xn, self.prototype_centers_), owner, self.cluster_centers_.shape[0])

    def _exemplar_scores(self, Xn: sp.csr_matrix) -> np.ndarray | None:
        """:func:`exemplar_class_scores` of ``Xn`` against this model's seeds (None without exemplars)."""
        exemplars = getattr(self, "exemplars_", None)   # absent in models saved before exemplars
        if exemplars is None:
            return None
        E_t = _EXEMPLARS_T.get(self, (exemplars,), lambda: sp.csr_matrix(exemplars.T))
        return exemplar_class_scores(Xn, E_t, self.exemplar_owner_, self.cluster_centers_.shape[0],
                                     float(self.exemplar_min_similarity_))

    def _fit_summary(self) -> dict[str, Any]:
        """``prototypes="by-size"``: the classes given more than one centroid, with their counts;
        ``seed_weight="held-out"``: the weight chosen and each candidate's held-out macro-F1."""
        out: dict[str, Any] = {}
        if self.prototypes == "by-size":
            owner = getattr(self, "prototype_owner_", None)
            out["prototypes"] = several_centroids(owner, self.classes_) if owner is not None else {}
        if self.seed_weight == "held-out":
            scores = getattr(self, "seed_weight_scores_", None)
            out["seed_weight"] = float(getattr(self, "seed_weight_", 1.0))
            out["seed_weight_age"] = int(getattr(self, "seed_weight_age_", 0) or 0)
            out["seed_weight_scores"] = None if scores is None else {
                f"{w:g}": round(float(v), 4) for w, v in zip(SEED_WEIGHT_CANDIDATES, scores, strict=True)}
        return out

    def _softmax_temperature(self) -> float:
        return float(self.temperature)

    def transform(self, X: Any) -> np.ndarray:
        """Cosine similarity of each row to each class: to its centroid, the most similar of its
        centroids (``prototypes="by-size"``) or of its seeds past the gate (``seed_exemplars``);
        ``predict_proba`` is their softmax at ``temperature``."""
        return self._scores(X)

    def _explain_weights(self) -> np.ndarray:
        """The centroids: ``explain`` lists each centroid's top words."""
        return self.cluster_centers_


__all__ = ["ConstrainedKMeans", "l2_normalize_rows"]
