"""pseudo-LSC: pseudo-label based multi-label semi-supervised fuzzy subspace clustering.

Ahmed, Khan & Oza, "Pseudo-label generation for multi-label text classification"
(``papers/pseudo-lsc.txt``; spec: ``ALGORITHMS.md`` section 5).

The model minimises (Eq. 1)::

    F(W, Z, L) = sum_l (1 + Imp_l) sum_j w_lj^f sum_i lambda_li^q (z_li - x_ji)^2
                 + gamma sum_l sum_i lambda_li^q chi2_li

over fuzzy memberships ``w`` (each document's row on the simplex, fuzzifier
``f``), per-cluster dimension weights ``lambda`` (each cluster's row on the
simplex, exponent ``q``) and centroids ``z``, on binary features selected by
information gain on the seeds. ``Imp_l`` is the fuzzy impurity of cluster ``l``
over *pseudo-labels* (every distinct label set among the seeds, Table 2),
normalised by the impurity of the whole seed set; ``chi2_li`` is a chi-square
statistic of (cluster, feature) computed from membership-weighted counts.

Implementation notes (where the paper is vague):

* Distances are expanded algebraically. For binary ``x``,
  ``sum_i lambda_li^q (z_li - x_ji)^2 = sum_i lambda_li^q z_li^2
  + sum_i x_ji lambda_li^q (1 - 2 z_li)``, i.e. a length-k vector plus one
  sparse (N x m) @ dense (m x k) product. The per-(cluster, feature) dispersion
  ``sum_j w_lj^f (z_li - x_ji)^2 = S_l z_li^2 + P_li (1 - 2 z_li)`` with
  ``S_l = sum_j w_lj^f`` and ``P = W^f.T @ X``. Nothing of size k x m x N exists.
* Eq. 3 is the minimiser of Eq. 1 over ``w`` with ``Imp`` and ``chi2`` held at
  their current values, so it includes the factor ``(1 + Imp_l)`` (the paper's
  printed Eq. 3 drops it). Because ``Imp`` and ``chi2`` themselves depend on
  ``w``, that step alone does not guarantee a decrease of the true objective:
  the new memberships are accepted along a backtracking line search
  ``w <- w + t (w_new - w)`` (t = 1, 1/2, ...; convex combinations stay on the
  simplex) only when Eq. 1 does not increase. The ``z`` (Eq. 4) and ``lambda``
  (Eq. 2) steps are exact block minimisers. Hence the tracked objective
  (``objective_history_``) never increases.
* ``weighting="tfidf"`` (default; the paper uses binary ``x``): rows are
  length-normalised ``(1 + log tf) idf`` vectors; the expansions then carry the
  ``x^2`` terms (``X^2 @ Lq.T`` and ``W^f.T @ X^2``); Eq. 2-4 are unchanged.
* Chi-square counts (Sec. 3.4) are the fuzzy 2 x 2 contingency table of
  (membership in cluster l) x (feature i present):
  ``s1 = sum_j w_lj x_ji``, ``s2 = sum_j (1 - w_lj) x_ji``,
  ``s3 = sum_j w_lj (1 - x_ji)``, ``s4 = sum_j (1 - w_lj)(1 - x_ji)``, so that
  ``s1 s4 - s2 s3 = N s1 - n_l df_i``; the multiplier is the number of labeled
  documents, as in the paper.
* ADC_l with fuzzy counts ``c_lt = sum_{seeds j} w_lj [pseudo(j) = t]`` is
  ``sum_t c_lt (L_l - c_lt)`` (``L_l = sum_t c_lt``); ``Ent_l`` uses
  ``p_t^l = c_lt / L_l``.
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Integral, Real
from typing import Any

import numpy as np
import scipy.sparse as sp
from sklearn.base import ClassifierMixin
from sklearn.utils._param_validation import Interval, StrOptions

from streamsemi.algorithms.base import (
    RANDOM_STATE,
    DegenerateInputError,
    DerivedArrays,
    StreamsemiEstimator,
    TransformerMixin,
    check_n_clusters,
    encode_multi_labels,
    target_list,
)

_TINY = 1e-300
#: Per fitted model, the prediction-side terms of the subspace distances (weak keys:
#: an entry goes with its model; bounded by the number of live models).
_DISTANCE_TERMS: DerivedArrays[tuple[np.ndarray, np.ndarray, np.ndarray]] = DerivedArrays()
_LOG_FLOOR = 1e-12


# --------------------------------------------------------------------------- labels


def _is_multilabel_input(y: Sequence[Any]) -> bool:
    """True when ``y`` holds label collections (lists/tuples/sets/arrays)."""
    return any(isinstance(v, (list, tuple, set, frozenset, np.ndarray)) for v in y)


def build_pseudo_labels(Y: sp.csr_matrix, labeled: np.ndarray) -> tuple[np.ndarray, list[tuple[int, ...]]]:
    """Pseudo-labels of Sec. 4 / Table 2: one pseudo-class per distinct seed label set.

    Parameters
    ----------
    Y : csr_matrix of shape (n_samples, n_classes)
        0/1 label indicator.
    labeled : ndarray of bool
        Rows that are seeds.

    Returns
    -------
    codes : ndarray of int, shape (n_samples,)
        Pseudo-class of each row (-1 for unlabeled rows); pseudo-classes are
        numbered in order of first appearance (p_1 is the first seed's set).
    sets : list of tuple of int
        The class indices making up each pseudo-class.
    """
    Y = sp.csr_matrix(Y)
    codes = np.full(Y.shape[0], -1, dtype=np.int64)
    lookup: dict[tuple[int, ...], int] = {}
    sets: list[tuple[int, ...]] = []
    for j in np.flatnonzero(labeled):
        key = tuple(sorted(int(c) for c in Y.indices[Y.indptr[j]:Y.indptr[j + 1]]))
        if key not in lookup:
            lookup[key] = len(sets)
            sets.append(key)
        codes[j] = lookup[key]
    return codes, sets


# --------------------------------------------------------------------------- features


def information_gain(Xb: sp.csr_matrix, Y: sp.csr_matrix) -> np.ndarray:
    """Information gain of every binary feature, summed over the classes.

    For each class ``c`` (a binary variable, so that multi-label seeds count for
    each of their classes) ``IG_c(i) = H(Y_c) - H(Y_c | X_i)``; the score of a
    feature is ``sum_c IG_c(i)``.

    Parameters
    ----------
    Xb : csr_matrix of shape (n_seeds, n_features)
        Binary presence of each feature in each seed.
    Y : csr_matrix of shape (n_seeds, n_classes)
        0/1 label indicator of the seeds.

    Returns
    -------
    ndarray of shape (n_features,)
    """
    n = float(Xb.shape[0])
    df = np.asarray(Xb.sum(axis=0)).ravel()                       # documents with the feature
    nc = np.asarray(Y.sum(axis=0)).ravel()                        # documents of each class
    joint = np.asarray((Y.T @ Xb).todense())                     # class & feature (p x M)

    def h2(pos: np.ndarray, tot: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            p = np.where(tot > 0, pos / np.maximum(tot, _TINY), 0.0)
            p = np.clip(p, 0.0, 1.0)
            out = -(p * np.log(np.where(p > 0, p, 1.0)) + (1 - p) * np.log(np.where(p < 1, 1 - p, 1.0)))
        return out

    prior = h2(nc, np.full_like(nc, n))[:, None]
    cond = (df / n)[None, :] * h2(joint, df[None, :]) + ((n - df) / n)[None, :] * h2(
        nc[:, None] - joint, (n - df)[None, :])
    return np.maximum(prior - cond, 0.0).sum(axis=0)


def select_features(X: sp.csr_matrix, Y: sp.csr_matrix, labeled: np.ndarray,
                    n_features: int | None) -> np.ndarray:
    """Hashed columns with the highest information gain on the seeds (sorted ids).

    Only columns present in at least one seed are candidates; when fewer than
    ``n_features`` exist all of them are kept. ``None`` keeps every candidate.
    """
    seeds = np.flatnonzero(labeled)
    Xs = X[seeds]
    present = np.flatnonzero(np.bincount(Xs.indices, minlength=X.shape[1]) > 0)
    if n_features is None or present.size <= n_features:
        return present
    Xs = binarize(Xs[:, present])
    ig = information_gain(Xs, Y[seeds])
    order = np.argsort(-ig, kind="stable")[:n_features]
    return np.sort(present[order])


def binarize(X: sp.spmatrix) -> sp.csr_matrix:
    """0/1 presence matrix (CSR float64) of a non-negative matrix."""
    X = sp.csr_matrix(X, dtype=np.float64, copy=True)
    X.eliminate_zeros()
    X.data[:] = 1.0
    return X


def project_values(X: sp.csr_matrix, remap: np.ndarray, m: int) -> sp.csr_matrix:
    """Positive entries of ``X`` restricted to the selected columns (``remap[col]`` = new id or -1)."""
    X = sp.csr_matrix(X)
    cols = remap[X.indices]
    keep = (cols >= 0) & (X.data > 0)
    rows = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))[keep]
    indptr = np.zeros(X.shape[0] + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=X.shape[0]), out=indptr[1:])
    out = sp.csr_matrix((X.data[keep].astype(np.float64), cols[keep], indptr), shape=(X.shape[0], m))
    out.sort_indices()
    return out


def project_binary(X: sp.csr_matrix, remap: np.ndarray, m: int) -> sp.csr_matrix:
    """Binary rows restricted to the selected columns (``remap[col]`` = new id or -1)."""
    out = project_values(X, remap, m)
    out.data[:] = 1.0
    return out


# --------------------------------------------------------------------------- the math


def subspace_distances(Xb: sp.csr_matrix, Z: np.ndarray, Lq: np.ndarray,
                       X2: sp.csr_matrix | None = None) -> np.ndarray:
    """``G_jl = sum_i lambda_li^q (z_li - x_ji)^2`` (N x k).

    Expanded: ``sum_i Lq z^2 - 2 X @ (Lq z).T + X^2 @ Lq.T``; for binary ``x``
    (``X2`` None, x^2 = x) that is ``sum_i Lq z^2 + X @ (Lq (1 - 2z)).T``.
    ``X2`` is the element-wise square of ``Xb`` when the rows are not binary.
    """
    a = (Lq * Z * Z).sum(axis=1)
    if X2 is None:
        G = np.asarray(Xb @ (Lq * (1.0 - 2.0 * Z)).T) + a[None, :]
    else:
        G = np.asarray(X2 @ Lq.T) - 2.0 * np.asarray(Xb @ (Lq * Z).T) + a[None, :]
    return np.maximum(G, 0.0)


def dispersion(Xb: sp.csr_matrix, Wf: np.ndarray, Z: np.ndarray,
               X2: sp.csr_matrix | None = None) -> np.ndarray:
    """``E_li = sum_j w_lj^f (z_li - x_ji)^2`` (k x m), expanded as ``S z^2 - 2 z P + P2``
    with ``P = W^f.T @ X`` and ``P2 = W^f.T @ X^2`` (``= P`` for binary rows, ``X2`` None)."""
    S = Wf.sum(axis=0)
    P = np.asarray(Xb.T @ Wf).T
    P2 = P if X2 is None else np.asarray(X2.T @ Wf).T
    return np.maximum(S[:, None] * Z * Z - 2.0 * Z * P + P2, 0.0)


def fuzzy_impurity(W: np.ndarray, pseudo: np.ndarray, n_pseudo: int) -> np.ndarray:
    """Normalised impurity ``Imp_l = ADC_l Ent_l / (ADC Ent)_global`` (Sec. 3.3).

    Fuzzy counts ``c_lt = sum_j w_lj [pseudo(j) = t]`` over the seeds;
    ``ADC_l = sum_t c_lt (L_l - c_lt)``, ``Ent_l = -sum_t p log p`` with
    ``p = c_lt / L_l``. The global impurity uses the seed counts of every
    pseudo-class (the same formula with all memberships equal to 1); when it is
    zero (a single pseudo-class) every ``Imp_l`` is 0.

    Parameters
    ----------
    W : ndarray of shape (n_samples, k)
        Memberships.
    pseudo : ndarray of int, shape (n_samples,)
        Pseudo-class per row, -1 for unlabeled.
    n_pseudo : int
    """
    seeds = np.flatnonzero(pseudo >= 0)
    onehot = sp.csr_matrix((np.ones(seeds.size), (seeds, pseudo[seeds])),
                           shape=(W.shape[0], n_pseudo))
    C = np.asarray(onehot.T @ W).T                       # k x P fuzzy counts
    imp = _adc_entropy(C)
    glob = _adc_entropy(C.sum(axis=0, keepdims=True))[0]
    if glob <= 0:
        return np.zeros(W.shape[1])
    return imp / glob


def _adc_entropy(C: np.ndarray) -> np.ndarray:
    L = C.sum(axis=1)
    adc = L * L - (C * C).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = C / np.maximum(L, _TINY)[:, None]
        ent = -(p * np.log(np.where(p > 0, p, 1.0))).sum(axis=1)
    return np.maximum(adc, 0.0) * ent


def fuzzy_chi_square(Xb: sp.csr_matrix, W: np.ndarray, df: np.ndarray, n_labeled: int) -> np.ndarray:
    """Membership-weighted chi-square per (cluster, feature) (Sec. 3.4), k x m.

    ``chi2 = n_labeled (s1 s4 - s2 s3)^2 / ((s1+s3)(s2+s4)(s1+s2)(s3+s4))`` with
    fuzzy counts; ``s1 s4 - s2 s3 = N s1 - n_l df``, ``s1+s3 = n_l``,
    ``s2+s4 = N - n_l``, ``s1+s2 = df``, ``s3+s4 = N - df``.
    """
    N = float(W.shape[0])
    s1 = np.asarray(Xb.T @ W).T
    nl = W.sum(axis=0)
    num = (N * s1 - nl[:, None] * df[None, :]) ** 2
    den = (nl * (N - nl))[:, None] * (df * (N - df))[None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        chi = np.where(den > 0, num / np.maximum(den, _TINY), 0.0)
    return float(n_labeled) * chi


def update_centroids(Xb: sp.csr_matrix, Wf: np.ndarray, Z_old: np.ndarray) -> np.ndarray:
    """Eq. 4: ``z_li = sum_j w_lj^f x_ji / sum_j w_lj^f`` (a cluster with no mass keeps its z)."""
    S = Wf.sum(axis=0)
    P = np.asarray(Xb.T @ Wf).T
    Z = Z_old.copy()
    ok = S > _TINY
    Z[ok] = P[ok] / S[ok, None]
    return Z


def update_dimension_weights(E: np.ndarray, imp: np.ndarray, chi2: np.ndarray | None,
                             gamma: float, q: float) -> np.ndarray:
    """Eq. 2: ``lambda_li = 1 / (M_li sum_i' 1/M_li')``,
    ``M_li = ((1 + Imp_l) E_li + gamma chi2_li)^(1/(q-1))`` (computed in log space)."""
    A = (1.0 + imp)[:, None] * E
    if chi2 is not None and gamma:
        A = A + gamma * chi2
    return _inverse_power_simplex(A, q, axis=1)


def update_memberships(G: np.ndarray, imp: np.ndarray, f: float) -> np.ndarray:
    """Eq. 3: ``w_lj = 1 / (N_lj sum_l' 1/N_l'j)``, ``N_lj = ((1 + Imp_l) G_jl)^(1/(f-1))``
    (N x k, rows on the simplex)."""
    return _inverse_power_simplex((1.0 + imp)[None, :] * G, f, axis=1)


def _inverse_power_simplex(A: np.ndarray, exponent: float, axis: int) -> np.ndarray:
    """Normalise ``A^(-1/(exponent-1))`` along ``axis`` (stable, zeros handled by a floor)."""
    scale = A.max(axis=axis, keepdims=True)
    floor = _LOG_FLOOR * np.where(scale > 0, scale, 1.0) + _TINY
    logits = -np.log(A + floor) / (exponent - 1.0)
    logits -= logits.max(axis=axis, keepdims=True)
    np.exp(logits, out=logits)
    logits /= logits.sum(axis=axis, keepdims=True)
    return logits


def objective(G: np.ndarray, Wf: np.ndarray, imp: np.ndarray, Lq: np.ndarray,
              chi2: np.ndarray | None, gamma: float) -> float:
    """Eq. 1 from the distances ``G`` (N x k) and ``W^f``."""
    val = float(((1.0 + imp) * (Wf * G).sum(axis=0)).sum())
    if chi2 is not None and gamma:
        val += float(gamma * (Lq * chi2).sum())
    return val


# --------------------------------------------------------------------------- estimator


class PseudoLSC(ClassifierMixin, TransformerMixin, StreamsemiEstimator):
    """Pseudo-label based semi-supervised fuzzy subspace clustering (multi-label).

    Parameters
    ----------
    n_clusters : int or None, default=None
        Number of subspace clusters k. None: ``max(2 * n_classes, n_pseudo)``
        where ``n_pseudo`` is the number of distinct seed label sets, capped at
        ``max_clusters`` and at the number of documents.
    max_clusters : int, default=200
        Upper bound for the automatic k.
    n_features_selected : int or None, default=1000
        Binary features kept, by information gain on the seeds (the paper: 1000);
        None keeps every hashed column present in a seed.
    min_seeds_to_select : int, default=500
        With fewer seeds than this the information-gain selection is skipped and
        every hashed column present in a seed is kept (an extension: information
        gain ranked on 12-60 seeds kept noise; see docs/algorithms/pseudo-lsc.md).
        0 always selects (the paper).
    fuzzifier : float, default=1.1
        Membership exponent f > 1 (closer to 1 = crisper memberships).
    q : float, default=2.0
        Dimension-weight exponent q > 1.
    gamma : float, default=0.5
        Weight of the chi-square term (the paper: 0.5).
    use_impurity : bool, default=True
        Include the ``(1 + Imp_l)`` factor (False for the ablation).
    use_chi2 : bool, default=True
        Include the chi-square term (False for the ablation).
    kappa : int, default=10
        Nearest clusters used for prediction.
    decision : {"threshold", "rcut", "cardinality"}, default="threshold"
        How ``predict`` turns probabilities into a label set: every class with
        probability >= ``threshold``; or the ``r`` most probable classes where
        ``r = round(sum of probabilities)`` (the expected number of labels of the
        nearest clusters); or ``"cardinality"`` (proportional cut): one threshold,
        ``threshold_``, chosen at fit so that the mean label-set size over the fitted
        documents equals the seeds' label cardinality (mean labels per seed). The
        most probable class is always predicted.
    threshold : float, default=0.5
        The threshold of ``decision = "threshold"``.
    weighting : {"tfidf", "binary"}, default="tfidf"
        The document vectors ``x_j`` of Eq. 1-4 over the selected features:
        ``"binary"`` is the paper's 0/1 presence; ``"tfidf"`` (an extension, see
        docs/algorithms/pseudo-lsc.md) is ``(1 + log tf) idf`` scaled so that every
        row has squared length ``row_scale_**2`` (the mean number of selected
        features per fitted document, which keeps the data term of Eq. 1 on the
        binary scale against ``gamma`` chi2). Binary squared-Euclidean distances
        grow with a document's length and a centroid's density, so on single-label
        corpora with few seeds most documents went to a few clusters. Feature
        selection (information gain) and the chi-square term use binary presence
        either way.
    max_iter : int, default=50
    tol : float, default=1e-4
        Stop when the relative decrease of the objective falls below ``tol``.
    random_state : int >= 0 or None, default=0
        Seed for the centroids not initialised from seeds.

    Attributes
    ----------
    classes_ : ndarray of str
    new_clusters_ : list of str (always empty)
    n_features_in_ : int
    multilabel_ : bool
        True when ``y`` was given as label lists (not scikit-learn's indicator matrix,
        hence no ``multi_label`` classifier tag); with scalar labels the model
        behaves as a single-label classifier (``predict`` returns class names,
        ``predict_proba`` rows sum to 1).
    feature_indices_ : ndarray of int
        Selected hashed columns.
    cluster_centers_ : ndarray (k x m)
    dimension_weights_ : ndarray (k x m), rows on the simplex
    memberships_ : ndarray (n_samples x k), rows on the simplex
    cluster_label_dist_ : ndarray (k x n_classes)
        Membership-weighted fraction of each cluster's seeds carrying each class.
    impurity_ : ndarray (k,)
    pseudo_label_sets_ : list of tuple of str
    objective_history_ : list of float
    n_iter_ : int
    label_cardinality_ : float
        Mean number of labels per seed.
    idf_ : ndarray of shape (n_selected,)
        Smoothed idf of the selected features on the fitted documents (``weighting="tfidf"``).
    row_scale_ : float
        Length of every ``weighting="tfidf"`` row.
    threshold_ : float
        Threshold ``predict`` uses: ``threshold``, or the calibrated one of
        ``decision = "cardinality"`` (above 1 when the seeds have one label each).
    """

    _parameter_constraints = {
        "n_clusters": [Interval(Integral, 2, None, closed="left"), None],
        "max_clusters": [Interval(Integral, 2, None, closed="left")],
        "n_features_selected": [Interval(Integral, 1, None, closed="left"), None],
        "min_seeds_to_select": [Interval(Integral, 0, None, closed="left")],
        "fuzzifier": [Interval(Real, 1, None, closed="neither")],
        "q": [Interval(Real, 1, None, closed="neither")],
        "gamma": [Interval(Real, 0, None, closed="left")],
        "use_impurity": ["boolean"],
        "use_chi2": ["boolean"],
        "kappa": [Interval(Integral, 1, None, closed="left")],
        "decision": [StrOptions({"threshold", "rcut", "cardinality"})],
        "threshold": [Interval(Real, 0, 1, closed="both")],
        "weighting": [StrOptions({"binary", "tfidf"})],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "tol": [Interval(Real, 0, None, closed="left")],
        "random_state": RANDOM_STATE,
    }

    def __init__(self, n_clusters: int | None = None, *, max_clusters: int = 200,
                 n_features_selected: int | None = 1000,
                 min_seeds_to_select: int = 500, fuzzifier: float = 1.1, q: float = 2.0,
                 gamma: float = 0.5, use_impurity: bool = True, use_chi2: bool = True,
                 kappa: int = 10, decision: str = "threshold", threshold: float = 0.5,
                 weighting: str = "tfidf", max_iter: int = 50, tol: float = 1e-4,
                 random_state: int | None = 0) -> None:
        self.n_clusters = n_clusters
        self.max_clusters = max_clusters
        self.n_features_selected = n_features_selected
        self.min_seeds_to_select = min_seeds_to_select
        self.fuzzifier = fuzzifier
        self.q = q
        self.gamma = gamma
        self.use_impurity = use_impurity
        self.use_chi2 = use_chi2
        self.kappa = kappa
        self.decision = decision
        self.threshold = threshold
        self.weighting = weighting
        self.max_iter = max_iter
        self.tol = tol
        self.random_state = random_state

    # ----------------------------------------------------------------- fitting

    def fit(self, X: Any, y: Any) -> PseudoLSC:
        """Fit on counts ``X`` and seeds ``y`` (label lists, [] = unlabeled; or scalars)."""
        self._validate_params()
        _DISTANCE_TERMS.drop(self)
        X = self._validate_counts(X, reset=True)
        y = target_list(y)
        multilabel = _is_multilabel_input(y)
        Y, classes, labeled = encode_multi_labels(y, X.shape[0])
        N = X.shape[0]
        pseudo, pseudo_sets = build_pseudo_labels(Y, labeled)
        n_pseudo = len(pseudo_sets)
        k = self._n_clusters(classes.size, n_pseudo, N)
        check_n_clusters(k, N)
        if k < 2:
            raise DegenerateInputError(f"at least 2 clusters are needed, got n_clusters={k}")

        n_select = self.n_features_selected
        if int(labeled.sum()) < int(self.min_seeds_to_select):
            n_select = None          # too few seeds to rank features: keep every seed feature
        self.n_features_selected_ = n_select
        feats = select_features(X, Y, labeled, n_select)
        if feats.size < 2:
            raise DegenerateInputError("the seeds have fewer than 2 distinct features")
        remap = np.full(X.shape[1], -1, dtype=np.int64)
        remap[feats] = np.arange(feats.size)
        Xb = project_binary(X, remap, feats.size)
        if Xb.nnz == 0:
            raise DegenerateInputError("no document has any of the selected features")
        df = np.asarray(Xb.sum(axis=0)).ravel()
        n_labeled = int(labeled.sum())

        self.idf_ = np.log((1.0 + N) / (1.0 + df)) + 1.0
        self._remap = remap
        self.row_scale_ = float(np.sqrt(max(Xb.nnz / max(N, 1), 1.0)))
        Xv, X2 = self._geometry(X, Xb)
        rng = np.random.default_rng(self.random_state)
        Z = self._init_centroids(Xv, pseudo, n_pseudo, k, rng)
        Z, Lam, W, imp, history = self._optimise(Xb, Z, pseudo, n_pseudo, df, n_labeled, Xv, X2)

        seeds = np.flatnonzero(labeled)
        mass = W[seeds].sum(axis=0)
        Qnum = np.asarray(Y[seeds].T @ W[seeds]).T
        prior = np.asarray(Y[seeds].mean(axis=0)).ravel()
        Q = np.where(mass[:, None] > 1e-12, Qnum / np.maximum(mass, _TINY)[:, None], prior[None, :])

        self.new_clusters_: list[str] = []
        self.multilabel_ = bool(multilabel)
        self.feature_indices_ = feats
        self._remap = remap
        self.cluster_centers_ = Z
        self.dimension_weights_ = Lam
        self.memberships_ = W
        self.impurity_ = imp
        self.cluster_label_dist_ = Q
        self.cluster_seed_mass_ = mass
        self.pseudo_labels_ = pseudo
        self.pseudo_label_sets_ = [tuple(str(classes[c]) for c in s) for s in pseudo_sets]
        self.objective_history_ = history
        self.n_iter_ = len(history) - 1
        self.n_clusters_ = k
        self.classes_ = np.array(list(classes), dtype=object)
        self.label_cardinality_ = float(np.asarray(Y[seeds].sum(axis=1)).mean()) if len(seeds) else 1.0
        self.threshold_ = float(self.threshold)
        if self.decision == "cardinality":
            self.threshold_ = self._calibrated_threshold(self.predict_proba(X), self.label_cardinality_)
        return self

    @staticmethod
    def _calibrated_threshold(P: np.ndarray, cardinality: float) -> float:
        """The threshold that gives ``cardinality`` labels per document on average (top class always on).

        The ``round((cardinality - 1) * n)`` largest non-top probabilities are the
        extra labels; the threshold is the smallest of them (above 1: no extra label).
        """
        n = P.shape[0]
        extra = int(round((cardinality - 1.0) * n))
        if n == 0 or extra <= 0 or P.shape[1] < 2:
            return 1.0 + 1e-9
        rest = np.array(P, dtype=np.float64)
        rest[np.arange(n), rest.argmax(axis=1)] = -np.inf
        flat = rest.ravel()
        extra = min(extra, n * (P.shape[1] - 1))
        value = float(np.partition(flat, flat.size - extra)[flat.size - extra])
        return max(value, _TINY)

    def _geometry(self, X: sp.csr_matrix, Xb: sp.csr_matrix) -> tuple[sp.csr_matrix, sp.csr_matrix | None]:
        """The rows the distances use, and their element-wise square (None: binary rows).

        ``weighting="tfidf"``: ``(1 + log tf) idf`` on the selected features, each row
        scaled to unit length (``idf_`` from the fitted documents).
        """
        if self.weighting == "binary":
            return Xb, None
        Xv = project_values(X, self._remap, Xb.shape[1])
        Xv.data = (1.0 + np.log(Xv.data)) * self.idf_[Xv.indices]
        nnz = np.diff(Xv.indptr)
        norms = np.sqrt(np.bincount(np.repeat(np.arange(Xv.shape[0]), nnz), weights=Xv.data ** 2,
                                    minlength=Xv.shape[0]))
        norms[norms <= 0] = 1.0
        Xv.data *= self.row_scale_ / np.repeat(norms, nnz)
        X2 = sp.csr_matrix((Xv.data * Xv.data, Xv.indices, Xv.indptr), shape=Xv.shape)
        return Xv, X2

    def _n_clusters(self, n_classes: int, n_pseudo: int, n_samples: int) -> int:
        if self.n_clusters is not None:
            return int(self.n_clusters)
        return int(min(max(2 * n_classes, n_pseudo), int(self.max_clusters), n_samples))

    def _init_centroids(self, Xb: sp.csr_matrix, pseudo: np.ndarray, n_pseudo: int, k: int,
                        rng: np.random.Generator) -> np.ndarray:
        """Seed means of the largest pseudo-classes, then farthest-first documents.

        Centroids are shrunk 10% towards the global feature frequency so that no
        coordinate starts at exactly 0 or 1.
        """
        seeds = np.flatnonzero(pseudo >= 0)
        counts = np.bincount(pseudo[seeds], minlength=n_pseudo)
        order = np.argsort(-counts, kind="stable")[:k]
        H = sp.csr_matrix((np.ones(seeds.size), (pseudo[seeds], seeds)), shape=(n_pseudo, Xb.shape[0]))
        C = np.asarray((H @ Xb).todense())[order] / counts[order, None]
        n_more = k - C.shape[0]
        if n_more > 0:
            C = np.vstack([C, _farthest_documents(Xb, C, n_more, rng)])
        mean = np.asarray(Xb.mean(axis=0)).ravel()
        return 0.9 * C + 0.1 * mean[None, :]

    def _optimise(self, Xb: sp.csr_matrix, Z: np.ndarray, pseudo: np.ndarray, n_pseudo: int,
                  df: np.ndarray, n_labeled: int, Xv: sp.csr_matrix | None = None,
                  X2: sp.csr_matrix | None = None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[float]]:
        """Alternate Eq. 4, Eq. 2 and Eq. 3 (with line search) until Eq. 1 stalls.

        ``Xv``/``X2``: the rows of the distances and their squares (binary ``Xb`` by default);
        the chi-square term always counts binary presence (``Xb``).
        """
        if Xv is None:
            Xv, X2 = Xb, None
        f, q, gamma = float(self.fuzzifier), float(self.q), float(self.gamma)
        use_chi = bool(self.use_chi2) and gamma > 0
        k, m = Z.shape

        def stats(W: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
            imp = fuzzy_impurity(W, pseudo, n_pseudo) if self.use_impurity else np.zeros(k)
            chi = fuzzy_chi_square(Xb, W, df, n_labeled) if use_chi else None
            return imp, chi

        Lam = np.full((k, m), 1.0 / m)
        Lq = Lam ** q
        G = subspace_distances(Xv, Z, Lq, X2)
        W = update_memberships(G, np.zeros(k), f)
        imp, chi2 = stats(W)
        Wf = W ** f
        F = objective(G, Wf, imp, Lq, chi2, gamma)
        history = [F]
        for _ in range(int(self.max_iter)):
            Z = update_centroids(Xv, Wf, Z)                                   # Eq. 4
            Lam = update_dimension_weights(dispersion(Xv, Wf, Z, X2), imp, chi2, gamma, q)  # Eq. 2
            Lq = Lam ** q
            G = subspace_distances(Xv, Z, Lq, X2)
            F_zl = objective(G, Wf, imp, Lq, chi2, gamma)
            W_new = update_memberships(G, imp, f)                             # Eq. 3
            W, imp, chi2, Wf, F_new = self._line_search(W, W_new, G, Lq, F_zl, stats, f, gamma,
                                                        imp, chi2, Wf)
            F_prev = history[-1]
            history.append(F_new)
            if F_prev - F_new <= float(self.tol) * abs(F_prev):
                break
        return Z, Lam, W, imp, history

    @staticmethod
    def _line_search(W, W_new, G, Lq, F_cur, stats, f, gamma, imp, chi2, Wf):
        """Accept ``W + t (W_new - W)`` for the largest t in 1, 1/2, ... 1/2^8 that
        does not increase Eq. 1 (Imp and chi2 recomputed); else keep ``W``."""
        t = 1.0
        for _ in range(9):
            Wt = W_new if t == 1.0 else W + t * (W_new - W)
            imp_t, chi_t = stats(Wt)
            Wf_t = Wt ** f
            F_t = objective(G, Wf_t, imp_t, Lq, chi_t, gamma)
            if F_t <= F_cur:
                return Wt, imp_t, chi_t, Wf_t, F_t
            t *= 0.5
        return W, imp, chi2, Wf, F_cur

    # ----------------------------------------------------------------- prediction

    def _distances(self, X: Any) -> np.ndarray:
        X = self._validate_counts(X, reset=False)
        Xb = project_binary(X, self._remap, self.feature_indices_.size)
        Xv, X2 = self._geometry(X, Xb)
        a, B1, B2 = self._distance_terms()
        if X2 is None:
            G = np.asarray(Xv @ B1) + a[None, :]
        else:
            G = np.asarray(X2 @ B2) - 2.0 * np.asarray(Xv @ B1) + a[None, :]
        return np.maximum(G, 0.0)

    def _distance_terms(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The model's parts of :func:`subspace_distances`, computed once per fitted model:
        ``a = sum_i Lq z^2`` and the (m x k) right-hand sides of the sparse products
        (binary rows: ``(Lq (1 - 2z)).T``; weighted rows: ``(Lq z).T`` and ``Lq.T``).
        Kept outside the estimator's attributes (not checkpointed; rebuilt after a refit)."""
        Z, Lam = self.cluster_centers_, self.dimension_weights_
        q, weighting = float(self.q), self.weighting

        def build() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            Lq = Lam ** q
            a = (Lq * Z * Z).sum(axis=1)
            if weighting == "binary":
                return a, np.ascontiguousarray((Lq * (1.0 - 2.0 * Z)).T), np.empty((0, 0))
            return a, np.ascontiguousarray((Lq * Z).T), np.ascontiguousarray(Lq.T)

        return _DISTANCE_TERMS.get(self, (Z, Lam, q, weighting), build)

    def transform(self, X: Any) -> np.ndarray:
        """Subspace distance of each row to each cluster (n x k)."""
        return self._distances(X)

    def predict_proba(self, X: Any) -> np.ndarray:
        """Per-class probabilities: label distributions of the ``kappa`` nearest clusters,
        weighted by inverse subspace distance (columns follow ``classes_``)."""
        D = self._distances(X)
        k = D.shape[1]
        kappa = min(int(self.kappa), k)
        if kappa < k:
            nn = np.argpartition(D, kappa - 1, axis=1)[:, :kappa]
        else:
            nn = np.broadcast_to(np.arange(k), D.shape)
        d = np.take_along_axis(D, nn, axis=1)
        # the regulariser scales with each row's own distances: a document's probabilities do not depend on
        # the other documents of the batch (they did through the batch's largest distance)
        inv = 1.0 / (d + 1e-12 * np.maximum(D.max(axis=1, keepdims=True), 1e-300) + _TINY)
        inv /= inv.sum(axis=1, keepdims=True)
        P = np.einsum("nk,nkc->nc", inv, self.cluster_label_dist_[nn])
        return np.clip(P, 0.0, 1.0)

    def decide(self, P: np.ndarray) -> np.ndarray:
        """0/1 label sets from probabilities (the ``decision`` rule; top class always on)."""
        P = np.asarray(P, dtype=np.float64)
        out = np.zeros(P.shape, dtype=np.int64)
        if self.decision in ("threshold", "cardinality"):
            out[P >= float(self.threshold_ if self.decision == "cardinality" else self.threshold)] = 1
        else:
            r = np.clip(np.rint(P.sum(axis=1)).astype(np.int64), 1, P.shape[1])
            order = np.argsort(-P, axis=1, kind="stable")
            ranks = np.empty_like(order)
            np.put_along_axis(ranks, order, np.arange(P.shape[1])[None, :].repeat(P.shape[0], 0), axis=1)
            out[ranks < r[:, None]] = 1
        out[np.arange(P.shape[0]), P.argmax(axis=1)] = 1
        return out

    def predict(self, X: Any) -> np.ndarray:
        """Multi-label: 0/1 indicator over ``classes_``; single-label fit: class names."""
        P = self.predict_proba(X)
        if not self.multilabel_:
            return self.classes_[P.argmax(axis=1)]
        return self.decide(P)

    def _explain_weights(self) -> sp.csr_matrix:
        """Top words per class: lift of the class's centroid over the mean document.

        The class centroid is ``zbar_c = sum_l R_lc z_l`` with ``R_lc`` the share of
        class c's (membership-weighted) seed mass held by cluster l; a feature's
        score is ``(zbar_ci - mean_i)_+ / sqrt(mean_i + 1e-3)``, which favours words
        frequent in the class and rare overall. (Dimension weights are not used:
        they are largest on low-dispersion, mostly *absent* features, which make
        poor descriptions.)
        """
        Q = self.cluster_label_dist_ * self.cluster_seed_mass_[:, None]       # k x p
        R = Q / np.maximum(Q.sum(axis=0, keepdims=True), _TINY)
        Zc = self.cluster_centers_
        mean = (self.memberships_.sum(axis=0) @ Zc) / self.memberships_.shape[0]
        V = np.maximum(R.T @ Zc - mean[None, :], 0.0) / np.sqrt(mean + 1e-3)[None, :]   # p x m
        p, m = V.shape
        return sp.csr_matrix((V.ravel(), (np.repeat(np.arange(p), m), np.tile(self.feature_indices_, p))),
                             shape=(p, self.n_features_in_))


def _farthest_documents(Xb: sp.csr_matrix, C: np.ndarray, n_new: int,
                        rng: np.random.Generator) -> np.ndarray:
    """Farthest-first traversal over the documents (squared Euclidean, binary rows),
    among a random sample of at most 5000 candidates (ties broken by ``rng``)."""
    n = Xb.shape[0]
    cand = rng.permutation(n)[:5000]
    Xc = Xb[cand]
    sq = np.asarray(Xc.multiply(Xc).sum(axis=1)).ravel()
    if C.shape[0]:
        d = (sq[:, None] - 2.0 * np.asarray(Xc @ C.T) + (C * C).sum(axis=1)[None, :]).min(axis=1)
    else:
        d = np.full(cand.size, np.inf)
        d[0] = -1.0
    d = d + 1e-9 * rng.random(cand.size)
    out = []
    for _ in range(n_new):
        j = int(np.argmax(d))
        row = Xc[j].toarray().ravel()
        out.append(row)
        d = np.minimum(d, sq - 2.0 * np.asarray(Xc @ row).ravel() + row @ row)
        d[j] = -np.inf
    return np.array(out)


__all__ = ["PseudoLSC", "build_pseudo_labels", "fuzzy_impurity", "fuzzy_chi_square",
           "information_gain", "subspace_distances", "dispersion", "objective"]
