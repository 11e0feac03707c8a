"""Semi-supervised Linear Discriminant Clustering (Liu et al., IEEE T-Cyb 2014).

Pipeline (the paper's Algorithm 2):

1. :class:`ConstrainedPLSA` (Algorithm 1) turns the seeds into soft labels ``Q``
   (N x K) for every document: an EM fit of the PLSA *clustering* model (a mixture
   of multinomials, Eq. 4-6) with the seeds' rows of ``Q`` clamped to their class.
   By default (``soft_labels="constrained-kmeans"``) the labels that train the first
   LDA are instead those of constrained k-means on tf-idf, which do not hand a
   one-seed class a sub-cluster of a large one on skewed corpora; PLSA still
   provides the topics of :meth:`SemiLDC.explain`.
2. PCA of the (tf-idf weighted) documents, centred implicitly so that the sparse
   matrix is never densified; enough components for ``pca_variance`` of the
   variance, capped at ``max_components`` (by default one component per 10
   documents of the window, within 300-1000: :func:`auto_max_components`).
3. Soft LDA (Eq. 8-14): soft between/within scatter matrices from ``Q`` and the
   regularised generalised eigenproblem ``S_b a = lambda (S_w + mu I) a``; the
   ``K - 1`` leading eigenvectors form the projection ``A``.
4. Constrained k-means (Basu et al. 2002) in the projected space, seeds fixed; by
   default with class priors (the Bayes rule of a shared-variance Gaussian mixture,
   ``class_prior="assignment"``), which the paper's nearest-centroid step lacks.

New documents are projected with the stored (composed) basis and assigned to the
nearest centroid (plus the class-prior bias); ``predict_proba`` is the posterior of a
shared isotropic Gaussian per cluster whose variance is estimated on the training
assignment.

Every place where the paper is silent and this module had to choose is listed in
``docs/algorithms/semi-ldc.md``.
"""

from __future__ import annotations

from numbers import Integral, Real
from typing import Any

import numpy as np
import scipy.linalg
import scipy.sparse as sp
from scipy.special import logsumexp
from sklearn.utils._param_validation import Interval, StrOptions

from streamsemi.algorithms._discovery import (
    DISCOVERY_CONSTRAINTS,
    DiscoveryMixin,
    fit_calibrated,
    uses_calibrated,
)
from streamsemi.algorithms.base import (
    RANDOM_STATE,
    DegenerateInputError,
    ScoresClassifierMixin,
    StreamsemiEstimator,
    TransformerMixin,
    new_cluster_names,
)
from streamsemi.algorithms.constrained_kmeans import farthest_point_centroids, lloyd, seed_means
from streamsemi.core.features import idf_weights, l1_normalize_rows, l2_normalize_rows, tfidf

WEIGHTINGS = ("tfidf", "tf-l2", "counts")


# ---------------------------------------------------------------------------
# Constrained-PLSA: small pure functions (Algorithm 1, Eq. 4-6)
# ---------------------------------------------------------------------------

def observed_columns(X: sp.csr_matrix, min_df: int = 1) -> np.ndarray:
    """Indices of the columns that occur in at least ``min_df`` rows of ``X``."""
    df = np.bincount(X.indices, minlength=X.shape[1])
    return np.flatnonzero(df >= max(1, int(min_df)))


def row_normalize_l1(X: sp.csr_matrix) -> sp.csr_matrix:
    """Divide every row by its sum (Algorithm 1, line 2); empty rows stay zero."""
    return l1_normalize_rows(X)


def seed_topic_init(Xl1: sp.csr_matrix, codes: np.ndarray, n_classes: int,
                    background: np.ndarray, mix: float) -> np.ndarray:
    """Initial topic-term matrix Theta (Algorithm 1, line 3), smoothed.

    ``Theta_k`` is the mean of the l1-normalised seed rows of class ``k`` (the
    paper), mixed with the corpus unigram ``background`` (weight ``mix``) so that
    no term starts with probability 0 (``ln 0`` in Eq. 4).
    """
    idx = np.flatnonzero(codes >= 0)
    H = sp.csr_matrix((np.ones(idx.size), (codes[idx], idx)), shape=(n_classes, Xl1.shape[0]))
    counts = np.asarray(H.sum(axis=1)).ravel()
    means = np.asarray((H @ Xl1).todense()) / counts[:, None]
    return (1.0 - mix) * means + mix * background[None, :]


def plsa_e_step(X: sp.csr_matrix, log_theta: np.ndarray, log_pz: np.ndarray,
                codes: np.ndarray, unlabeled_weight: float = 1.0) -> tuple[np.ndarray, float]:
    """E-step (Eq. 4) in log space with the seeds clamped (Algorithm 1, lines 7-9).

    Returns
    -------
    Q : ndarray of shape (N, K)
        ``Q_ik = P(z_k | x_i)``; rows of seeds are one-hot on their class.
    loglik : float
        The log-likelihood of the current parameters under the same constraint:
        ``sum_unlabeled log sum_k P(z_k) P(x_i|z_k) + sum_seeds log P(z_y) P(x_i|z_y)``
        (the multinomial coefficient, constant in the parameters, is dropped); the
        unlabeled part is multiplied by ``unlabeled_weight`` (Nigam et al.'s EM-lambda).
    """
    L = np.asarray(X @ log_theta.T) + log_pz[None, :]      # ln P(z_k) + sum_j n_ij ln Theta_kj
    norm = logsumexp(L, axis=1)
    Q = np.exp(L - norm[:, None])
    seeds = np.flatnonzero(codes >= 0)
    unl = codes < 0
    loglik = float(unlabeled_weight * norm[unl].sum() + L[seeds, codes[seeds]].sum())
    Q[seeds] = 0.0
    Q[seeds, codes[seeds]] = 1.0
    return Q, loglik


def plsa_m_step(X: sp.csr_matrix, Q: np.ndarray, alpha: float, beta: float,
                row_weight: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """M-step (Eq. 5, 6) with additive smoothing (MAP under Dirichlet priors).

    ``P(z_k) ∝ sum_i r_i Q_ik + beta`` and ``Theta_kj ∝ sum_i r_i Q_ik n(x_i, w_j) + alpha``
    with row weights ``r`` (1 for the paper; ``unlabeled_weight`` on unlabeled rows).
    Returns ``(log_theta, log_pz)``.
    """
    if row_weight is not None:
        Q = Q * row_weight[:, None]
    T = np.asarray((sp.csr_matrix(Q.T) @ X).todense()) + alpha      # Eq. 6 numerator
    T /= T.sum(axis=1, keepdims=True)
    pz = Q.sum(axis=0) + beta                                        # Eq. 5 numerator
    pz /= pz.sum()
    return np.log(T), np.log(pz)


def plsa_log_prior(log_theta: np.ndarray, log_pz: np.ndarray, alpha: float, beta: float) -> float:
    """Log Dirichlet prior density (up to a constant) that the smoothed M-step maximises with."""
    return float(alpha * log_theta.sum() + beta * log_pz.sum())


# ---------------------------------------------------------------------------
# PCA with implicit centring, soft LDA, constrained k-means: pure functions
# ---------------------------------------------------------------------------

def randomized_pca(X: sp.csr_matrix, n_components: int, rng: np.random.Generator,
                   n_oversamples: int = 10, n_iter: int = 4,
                   dtype: Any = np.float64) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """Truncated PCA of a sparse matrix without densifying it (Halko et al. 2011).

    The centred matrix ``Xc = X - 1 m^T`` is only used through products
    ``Xc @ B = X @ B - 1 (m @ B)`` and ``Xc.T @ C = X.T @ C - m (1^T C)``.
    ``dtype`` is the precision of those products and of the dense ``N x l`` and
    ``M x l`` factors (``np.float32`` halves their memory and the time of the sparse
    products; ``total`` and the ``l x l`` eigenproblem stay in double precision).

    Returns
    -------
    mean : ndarray (M,)
    components : ndarray (M, d)
        Orthonormal principal directions, by decreasing variance.
    explained : ndarray (d,)
        Squared singular values (sum of squares of the scores along each direction).
    total : float
        Total sum of squares of the centred data, ``||X||_F^2 - N ||m||^2``.
    """
    N, M = X.shape
    mean = np.asarray(X.mean(axis=0)).ravel()
    total = float(X.multiply(X).sum() - N * mean @ mean)
    k = int(min(n_components, N - 1, M))
    if k < 1:
        raise DegenerateInputError("PCA needs at least two distinct documents")
    ell = min(k + n_oversamples, min(N, M))
    dtype = np.dtype(dtype)
    if X.dtype != dtype:
        X = X.astype(dtype)
    mean = mean.astype(dtype, copy=False)
    XT = sp.csr_matrix(X.T)

    def xc(B: np.ndarray) -> np.ndarray:           # Xc @ B  (N x l), centred in place
        out = np.asarray(X @ B)
        out -= (mean @ B)[None, :]
        return out

    def xct(C: np.ndarray) -> np.ndarray:          # Xc.T @ C  (M x l)
        return _minus_outer(np.asarray(XT @ C), mean, C.sum(axis=0))

    Y = xc(rng.standard_normal((M, ell)).astype(dtype, copy=False))
    for _ in range(n_iter):                          # power iterations, LU-renormalised
        Y = scipy.linalg.lu(Y, permute_l=True, overwrite_a=True, check_finite=False)[0]
        Y = xc(xct(Y))
    Qy = scipy.linalg.qr(Y, mode="economic", overwrite_a=True, check_finite=False)[0]
    del Y
    Bt = xct(Qy)                                     # (Q^T Xc)^T, M x l
    # SVD of the small factor through its l x l Gram matrix (cheaper than an M x l SVD)
    evals, Ub = np.linalg.eigh((Bt.T @ Bt).astype(np.float64))
    order = np.argsort(-evals, kind="stable")
    evals = np.maximum(evals[order], 0.0)
    s = np.sqrt(evals)
    rel = max(1e-6, float(np.sqrt(np.finfo(dtype).eps)))   # below it: rounding noise, not variance
    keep = s > s[0] * rel if s[0] > 0 else np.zeros(s.size, dtype=bool)
    k = int(min(k, keep.sum()))
    if k < 1:
        raise DegenerateInputError("PCA found no variance: all documents are identical")
    V = Bt @ (Ub[:, order[:k]] / s[:k]).astype(dtype)
    del Bt
    # deterministic signs: largest-magnitude loading of each component positive
    signs = np.sign(V[np.abs(V).argmax(axis=0), np.arange(k)])
    signs[signs == 0] = 1.0
    V *= signs
    return mean, V, s[:k] ** 2, total


def _minus_outer(A: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``A - outer(u, v)`` computed in place (BLAS ``ger``) when ``A`` is C-contiguous.

    ``A`` is the ``vocabulary x l`` factor of the randomized PCA; ``np.outer`` would
    allocate a second one (hundreds of MB for a whole-corpus window).
    """
    if A.flags.c_contiguous and A.dtype in (np.float64, np.float32):
        ger = scipy.linalg.get_blas_funcs("ger", (A,))
        # A.T is Fortran-ordered (l x M): A.T -= v u^T updates A itself
        out = ger(-1.0, v.astype(A.dtype, copy=False), u.astype(A.dtype, copy=False), a=A.T, overwrite_a=1)
        if np.shares_memory(out, A):
            return A
        return np.ascontiguousarray(out.T)
    return A - np.outer(u, v)


def n_components_for_variance(explained: np.ndarray, total: float, fraction: float,
                              minimum: int) -> int:
    """Smallest number of leading components that explain ``fraction`` of ``total``.

    When even all computed components fall short (the cap binds), all are kept;
    never fewer than ``minimum`` (bounded by what was computed).
    """
    if total <= 0:
        return int(min(max(minimum, 1), explained.size))
    ratio = np.cumsum(explained) / total
    reached = np.flatnonzero(ratio >= fraction)
    d = int(reached[0]) + 1 if reached.size else explained.size
    return int(min(max(d, minimum), explained.size))


PCA_DTYPE = np.float32                # precision of the randomized PCA's dense factors (see randomized_pca)
AUTO_COMPONENTS = (300, 1000, 10)     # floor, ceiling, documents per component
SCATTER_BLOCK = 4096                  # rows per block of the within-class scatter product


def auto_max_components(n_samples: int, floor: int = AUTO_COMPONENTS[0],
                        ceiling: int = AUTO_COMPONENTS[1],
                        docs_per_component: int = AUTO_COMPONENTS[2]) -> int:
    """PCA cap of ``max_components="auto"``: ``n_samples // docs_per_component`` within ``[floor, ceiling]``.

    The soft LDA (Eq. 12-14) estimates a ``d x d`` within-class scatter from the ``N``
    documents, so ``d`` may grow with the window while ``N / d`` stays near 10 documents
    per dimension. The floor is the fixed cap chosen on 1,200-document windows (table B
    of docs/algorithms/semi-ldc.md), so windows up to 3,000 documents keep it; the
    ceiling bounds the ``N x d`` and ``vocabulary x d`` dense PCA factors (time and memory).
    """
    return int(min(max(int(n_samples) // docs_per_component, floor), ceiling))


def soft_scatter_matrices(Z: np.ndarray, Q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Soft between- and within-class scatter matrices (Eq. 8-13).

    ``Z`` is zero-mean data (N x d), ``Q`` soft labels (N x K).
    ``N~_c = sum_i Q_ic``, ``N~ = sum_c N~_c`` (Eq. 8); ``D = diag(1/N~_c)`` (Eq. 10);
    ``B = diag(sum_c Q_ic)`` (Eq. 11);
    ``S_b = Z^T Q D Q^T Z / N~`` (Eq. 12); ``S_w = Z^T (B - Q D Q^T) Z / N~`` (Eq. 13).
    """
    Nc = Q.sum(axis=0)                                   # Eq. 8
    Nt = float(Nc.sum())
    if np.any(Nc <= 0):
        raise DegenerateInputError("a class has zero soft mass: no document belongs to it")
    M = Z.T @ Q                                          # d x K: N~_c m~_c (Eq. 9)
    Sb = (M / Nc[None, :]) @ M.T / Nt                    # Eq. 12
    b = Q.sum(axis=1)                                    # Eq. 11 diagonal
    Sw = np.zeros((Z.shape[1], Z.shape[1]))
    for start in range(0, Z.shape[0], SCATTER_BLOCK):    # Z^T B Z by row blocks: no N x d copy
        Zb = Z[start:start + SCATTER_BLOCK]
        Sw += (Zb.T * b[start:start + SCATTER_BLOCK][None, :]) @ Zb
    Sw = Sw / Nt - Sb                                    # Eq. 13
    Sw = (Sw + Sw.T) / 2.0
    Sb = (Sb + Sb.T) / 2.0
    return Sb, Sw


def soft_lda_projection(Sb: np.ndarray, Sw: np.ndarray, mu: float, n_dims: int) -> tuple[np.ndarray, np.ndarray]:
    """Leading ``n_dims`` solutions of ``S_b a = lambda (S_w + mu I) a`` (Eq. 14).

    ``mu`` is relative: the ridge added is ``mu * trace(S_w) / d``, so that it does
    not depend on the scale of the features. Returns ``(A, eigenvalues)`` with the
    eigenvalues in descending order; ``A^T (S_w + ridge I) A = I``.
    """
    d = Sw.shape[0]
    ridge = mu * max(float(np.trace(Sw)) / d, np.finfo(float).tiny)
    evals, evecs = scipy.linalg.eigh(Sb, Sw + ridge * np.eye(d))
    order = np.argsort(-evals, kind="stable")[:n_dims]
    A = evecs[:, order]
    signs = np.sign(A[np.abs(A).argmax(axis=0), np.arange(A.shape[1])])
    signs[signs == 0] = 1.0
    return A * signs, evals[order]


def _sq_distances(Z: np.ndarray, C: np.ndarray) -> np.ndarray:
    d2 = (Z * Z).sum(axis=1)[:, None] - 2.0 * Z @ C.T + (C * C).sum(axis=1)[None, :]
    return np.maximum(d2, 0.0)


def constrained_kmeans_dense(Z: np.ndarray, codes: np.ndarray, C0: np.ndarray,
                             max_iter: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Constrained k-means (Basu et al. 2002) on dense rows, seeds fixed to their class.

    Starts from centroids ``C0``; alternates nearest-centroid assignment (seeds keep
    ``codes``) and mean updates until the assignment stops changing. The returned
    labels are the assignment to the returned centroids. An emptied cluster keeps
    its previous centroid.
    """
    labels, C, _, n_iter = _dense_kmeans(Z, codes, C0, max_iter, prior=False)
    return labels, C, n_iter


def gaussian_prior_bias(Z: np.ndarray, labels: np.ndarray, C: np.ndarray) -> np.ndarray:
    """Per-class score offset ``2 s^2 ln pi_c`` of the Bayes rule of a shared-variance Gaussian mixture.

    With one isotropic Gaussian per class, shared per-dimension variance ``s^2`` and class
    priors ``pi_c``, the posterior is ``p(c | z) ∝ pi_c exp(-||z - mu_c||^2 / (2 s^2))``, so the
    Bayes (MAP) class is ``argmax_c -||z - mu_c||^2 + 2 s^2 ln pi_c`` — the rule LDA itself
    uses, where the paper's nearest-centroid step (Algorithm 2, line 10) drops the prior.
    ``pi_c`` is the current assignment's share of class ``c`` (seeds included, so it never
    falls below the seeds' share and never reaches 0) and ``s^2`` the mean squared distance
    to the assigned centroid per dimension (the maximum-likelihood estimates given
    ``labels``).
    """
    N, d = Z.shape
    counts = np.bincount(labels, minlength=C.shape[0]).astype(np.float64)
    d2 = ((Z - C[labels]) ** 2).sum(axis=1)
    s2 = max(float(d2.mean()) / max(d, 1), 1e-12)
    return 2.0 * s2 * np.log(np.maximum(counts, 1.0) / N)


def prior_kmeans_dense(Z: np.ndarray, codes: np.ndarray, C0: np.ndarray,
                       max_iter: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Constrained k-means with class priors: hard (classification) EM of a shared-variance Gaussian mixture.

    Like :func:`constrained_kmeans_dense` (seeds fixed to their class, centroids the means
    of their members), but a document goes to ``argmin_c ||z - c_c||^2 - b_c`` with the
    bias ``b = 2 s^2 ln pi`` of :func:`gaussian_prior_bias` re-estimated from the current
    assignment every iteration. The first assignment is the nearest centroid of ``C0``.

    Returns ``(labels, centroids, bias, n_iter)``; ``labels`` is the argmax of
    ``-||z - c||^2 + bias`` for the returned centroids and bias (seeds: their class).
    """
    return _dense_kmeans(Z, codes, C0, max_iter, prior=True)


def _dense_kmeans(Z: np.ndarray, codes: np.ndarray, C0: np.ndarray, max_iter: int,
                  prior: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """The loop of :func:`constrained_kmeans_dense` (``prior=False``: bias 0) and :func:`prior_kmeans_dense`."""
    seeds = np.flatnonzero(codes >= 0)
    C = C0.copy()
    labels = _sq_distances(Z, C).argmin(axis=1)
    labels[seeds] = codes[seeds]
    bias = np.zeros(C.shape[0])
    n_iter = 0
    for n_iter in range(1, max_iter + 1):  # noqa: B007
        counts = np.bincount(labels, minlength=C.shape[0]).astype(np.float64)
        sums = np.zeros_like(C)
        np.add.at(sums, labels, Z)
        nonempty = counts > 0
        C[nonempty] = sums[nonempty] / counts[nonempty, None]
        if prior:
            bias = gaussian_prior_bias(Z, labels, C)
            new = (_sq_distances(Z, C) - bias[None, :]).argmin(axis=1)
        else:
            new = _sq_distances(Z, C).argmin(axis=1)
        new[seeds] = codes[seeds]
        if np.array_equal(new, labels):
            break
        labels = new
    return labels, C, bias, n_iter


def kmeans_soft_labels(Xn: sp.csr_matrix, codes: np.ndarray, n_classes: int,
                       max_iter: int = 50) -> np.ndarray:
    """One-hot labels of constrained spherical k-means on the unit rows ``Xn`` (Basu et al. 2002).

    The alternative first stage of :class:`SemiLDC` (``soft_labels="constrained-kmeans"``):
    centroids start at the seeds' unit means, seeds stay in their class (as
    :class:`~streamsemi.algorithms.constrained_kmeans.ConstrainedKMeans`). Returns an
    (N x n_classes) 0/1 matrix in place of constrained-PLSA's ``Q``.
    """
    _, labels, _, _ = lloyd(Xn, seed_means(Xn, codes, n_classes), codes, True, max_iter)
    Q = np.zeros((Xn.shape[0], n_classes))
    Q[np.arange(labels.size), labels] = 1.0
    return Q


def calibrate_temperature(D2: np.ndarray, codes: np.ndarray, t0: float,
                          max_factor: float = 100.0) -> float:
    """Softmax temperature for ``p(k|x) ∝ exp(-D2_k / T)``, fitted on the seeds.

    ``T`` minimises the cross-entropy of the seeds' classes (the only labels there
    are) over ``[t0, max_factor * t0]``, where ``t0 = 2 sigma^2`` is the shared
    isotropic Gaussian's value. When the seeds are all nearest to their own centroid
    the optimum is the lower bound, i.e. the Gaussian posterior.
    """
    from scipy.optimize import minimize_scalar

    seeds = np.flatnonzero(codes >= 0)
    if seeds.size == 0 or t0 <= 0:
        return float(max(t0, 1e-12))
    Ds = D2[seeds]

    def nll(log_t: float) -> float:
        L = -Ds / np.exp(log_t)
        return float(-(L[np.arange(seeds.size), codes[seeds]] - logsumexp(L, axis=1)).mean())

    lo, hi = np.log(t0), np.log(t0 * max_factor)
    res = minimize_scalar(nll, bounds=(lo, hi), method="bounded", options={"xatol": 1e-3})
    best = float(res.x) if nll(float(res.x)) < nll(lo) else lo
    return float(np.exp(best))


def _weight(X: sp.csr_matrix, weighting: str, idf: np.ndarray | None) -> sp.csr_matrix:
    """Document representation fed to PCA/LDA (see ``SemiLDC.weighting``)."""
    if weighting == "tfidf":
        return tfidf(X, idf)
    if weighting == "tf-l2":
        return tfidf(X, np.ones(X.shape[1]))
    if weighting == "counts":
        return sp.csr_matrix(X, dtype=np.float64)
    raise ValueError(f"unknown weighting {weighting!r}; choose one of {WEIGHTINGS}")


# ---------------------------------------------------------------------------
# Estimators
# ---------------------------------------------------------------------------

class ConstrainedPLSA(ScoresClassifierMixin, StreamsemiEstimator):
    """Constrained-PLSA (Algorithm 1): a seeded mixture-of-multinomials topic model.

    The PLSA clustering model (each document belongs to one topic) fitted by EM on
    raw term counts, with seed documents clamped to their class in every E-step.
    Computed in log space on the sparse matrix; the M-step is smoothed (MAP with
    Dirichlet priors), so the monotone objective is the penalised log-likelihood
    ``loglik + alpha sum ln Theta + beta sum ln P(z)``.

    Parameters
    ----------
    alpha : float, default=0.01
        Additive smoothing of topic-term counts (Eq. 6).
    beta : float, default=1.0
        Additive smoothing of topic sizes (Eq. 5).
    init_mix : float, default=0.9
        Weight of the corpus unigram mixed into the seed-mean initial topics
        (0.9 measured best of 0.1 / 0.5 / 0.9 on 20NG, see docs/algorithms/semi-ldc.md).
    tol : float, default=1e-5
        Stop when the relative objective improvement is below ``tol``.
    max_iter : int, default=100
        Cap on EM iterations.
    min_df : int >= 1, default=1
        Terms occurring in fewer training documents are ignored.
    unlabeled_weight : float, default=1.0
        Weight of unlabeled documents in the likelihood (1 = the paper; < 1 is
        Nigam et al.'s EM-lambda, limiting how far unlabeled data pull the topics).
    tf : {"raw", "log1p"}, default="raw"
        Term frequencies the multinomials see: raw counts (the paper) or
        ``ln(1 + n)`` (dampens burstiness, Rennie et al. 2003).
    n_new_clusters : int, default=0
        Extra unseeded topics, initialised from the unlabeled documents least
        similar to every seeded class (see ``_new_topic_init``); reported as
        ``new-0``, ...
    random_state : int >= 0 or None, default=0
        Tie-breaking seed for the extra topics' initialisation.

    Attributes
    ----------
    classes_ : ndarray of str
    new_clusters_ : list of str
    n_features_in_ : int
    columns_ : ndarray of int
        Feature indices modelled (the vocabulary of the fitting window).
    log_theta_ : ndarray (K, len(columns_))
        ln P(w | z) over ``columns_``.
    log_pz_ : ndarray (K,)
    soft_labels_ : ndarray (N, K)
        ``Q`` of the training documents.
    labels_ : ndarray of int
        ``argmax Q`` per training document (seeds: their class).
    objective_history_ : list of float
        Penalised log-likelihood before each M-step (non-decreasing).
    log_likelihood_history_ : list of float
        Unpenalised log-likelihood part.
    n_iter_ : int
    converged_ : bool
    """

    _parameter_constraints = {
        "alpha": [Interval(Real, 0, None, closed="neither")],   # an unsmoothed M-step gives ln 0
        "beta": [Interval(Real, 0, None, closed="left")],
        "init_mix": [Interval(Real, 0, 1, closed="right")],
        "tol": [Interval(Real, 0, None, closed="left")],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "min_df": [Interval(Integral, 1, None, closed="left")],
        "unlabeled_weight": [Interval(Real, 0, 1, closed="right")],
        "tf": [StrOptions({"raw", "log1p"})],
        "n_new_clusters": [Interval(Integral, 0, None, closed="left")],
        "random_state": RANDOM_STATE,
    }

    def __init__(self, alpha: float = 0.01, *, beta: float = 1.0, init_mix: float = 0.9,
                 tol: float = 1e-5, max_iter: int = 100, min_df: int = 1,
                 unlabeled_weight: float = 1.0, tf: str = "raw",
                 n_new_clusters: int = 0, random_state: int | None = 0) -> None:
        self.alpha = alpha
        self.unlabeled_weight = unlabeled_weight
        self.tf = tf
        self.beta = beta
        self.init_mix = init_mix
        self.tol = tol
        self.max_iter = max_iter
        self.min_df = min_df
        self.n_new_clusters = n_new_clusters
        self.random_state = random_state

    def fit(self, X: Any, y: Any) -> ConstrainedPLSA:
        """Fit on counts ``X`` with seed labels ``y`` (None/-1/"" = unlabeled)."""
        X, codes, classes = self._fit_inputs(X, y)
        self._fit(X, codes, classes)
        return self

    def _fit(self, X: sp.csr_matrix, codes: np.ndarray, classes: np.ndarray) -> None:
        """EM on checked counts and encoded seeds (parameters validated by the caller)."""
        rng = np.random.default_rng(self.random_state)
        cols = observed_columns(X, self.min_df)
        if cols.size == 0:
            raise DegenerateInputError(f"no term occurs in at least min_df={self.min_df} documents")
        Xs = self._tf(sp.csr_matrix(X[:, cols]))
        n_known = classes.size
        n_new = int(self.n_new_clusters)
        K = n_known + n_new
        Xl1 = row_normalize_l1(Xs)
        bg = np.asarray(Xs.sum(axis=0)).ravel()
        bg /= bg.sum()
        seed_rows = np.flatnonzero(codes >= 0)
        if np.any(np.asarray(Xs[seed_rows].sum(axis=1)).ravel() == 0):
            raise DegenerateInputError("a seed document has no term in the modelled vocabulary")
        theta = seed_topic_init(Xl1, codes, n_known, bg, float(self.init_mix))
        if n_new:
            theta = np.vstack([theta, self._new_topic_init(Xs, Xl1, codes, n_known, n_new, bg, rng)])
        log_theta = np.log(theta)
        log_pz = np.full(K, -np.log(K))                  # P(z_k) = 1/K (Algorithm 1, line 4)
        alpha, beta, lam = float(self.alpha), float(self.beta), float(self.unlabeled_weight)
        row_weight = None if lam == 1.0 else np.where(codes < 0, lam, 1.0)
        objective: list[float] = []
        loglik_hist: list[float] = []
        converged = False
        n_iter = 0
        Q = None
        for n_iter in range(1, int(self.max_iter) + 1):  # noqa: B007
            Q, ll = plsa_e_step(Xs, log_theta, log_pz, codes, lam)
            obj = ll + (plsa_log_prior(log_theta, log_pz, alpha, beta) if n_iter > 1 else 0.0)
            if n_iter > 1:  # the first parameters are the initial guess, not an M-step result
                loglik_hist.append(ll)
                objective.append(obj)
                if len(objective) >= 2 and (objective[-1] - objective[-2]) <= self.tol * abs(objective[-2]):
                    converged = True
                    break
            log_theta, log_pz = plsa_m_step(Xs, Q, alpha, beta, row_weight)
        self.columns_ = cols
        self.log_theta_ = log_theta
        self.log_pz_ = log_pz
        self.soft_labels_ = Q
        labels = Q.argmax(axis=1)
        labels[seed_rows] = codes[seed_rows]
        self.labels_ = labels
        self.objective_history_ = objective
        self.log_likelihood_history_ = loglik_hist
        self.n_iter_ = n_iter
        self.converged_ = converged
        self.n_features_in_ = X.shape[1]
        self.new_clusters_ = new_cluster_names(n_new)
        self.classes_ = np.array(list(classes) + self.new_clusters_, dtype=object)

    def _new_topic_init(self, Xs: sp.csr_matrix, Xl1: sp.csr_matrix, codes: np.ndarray,
                        n_known: int, n_new: int, bg: np.ndarray,
                        rng: np.random.Generator) -> np.ndarray:
        """Initial Theta rows of the unseeded topics.

        The unlabeled documents least similar (tf-idf cosine) to every seeded class
        mean, as many as an average class (``N_unlabeled / K``), are the candidates;
        ``n_new`` anchors are picked farthest-first among them, each candidate joins
        its most similar anchor, and a topic starts at its group's mean l1 row.
        """
        Xn = tfidf(Xs, idf_weights(Xs))
        C = seed_means(Xn, codes, n_known)
        unl = np.flatnonzero(codes < 0)
        best = np.asarray(Xn[unl] @ C.T).max(axis=1)
        n_cand = max(n_new, unl.size // (n_known + n_new))
        cand = unl[np.argsort(best, kind="stable")[:n_cand]]
        anchors = farthest_point_centroids(Xn, C, cand, n_new, rng)[n_known:]
        group = np.asarray(Xn[cand] @ anchors.T).argmax(axis=1)
        out = np.empty((n_new, Xs.shape[1]))
        for k in range(n_new):
            rows = cand[group == k]
            mean = np.asarray(Xl1[rows].mean(axis=0)).ravel() if rows.size else anchors[k] / anchors[k].sum()
            out[k] = (1.0 - self.init_mix) * mean + self.init_mix * bg
        return out

    def _tf(self, X: sp.csr_matrix) -> sp.csr_matrix:
        if self.tf == "log1p":
            X = X.copy()
            np.log1p(X.data, out=X.data)
        return X

    def _scores(self, X: Any) -> np.ndarray:
        """``ln P(z) + sum_j n_j ln Theta_zj``: ``predict_proba`` is the topic posterior
        ``P(z | x)`` (Eq. 4) of any document, no clamping."""
        X = self._validate_counts(X, reset=False)
        # terms outside the fitting vocabulary are ignored (equal for every topic)
        Xs = self._tf(sp.csr_matrix(X[:, self.columns_]))
        return np.asarray(Xs @ self.log_theta_.T) + self.log_pz_[None, :]

    def _explain_weights(self) -> np.ndarray:
        """Distinctive words of each topic from Theta.

        Term ``j`` of topic ``k`` is scored ``Theta_kj ln(Theta_kj / mean_k' Theta_k'j)``
        (its contribution to the topic's KL divergence from the average topic), so
        that words frequent in every topic do not dominate.
        """
        theta = np.exp(self.log_theta_)
        score = theta * (self.log_theta_ - np.log(theta.mean(axis=0))[None, :])
        W = np.zeros((theta.shape[0], self.n_features_in_))
        W[:, self.columns_] = np.maximum(score, 0.0)
        return W


class SemiLDC(DiscoveryMixin, ScoresClassifierMixin, TransformerMixin, StreamsemiEstimator):
    """Semi-supervised Linear Discriminant Clustering (Algorithm 2).

    Parameters
    ----------
    weighting : {"tfidf", "tf-l2", "counts"}, default="tfidf"
        Document representation fed to PCA and soft LDA: sublinear tf-idf with l2
        rows (idf from the fitting window), l2-normalised sublinear tf, or raw counts.
        Constrained-PLSA always sees raw counts.
    pca_variance : float, default=0.9
        Fraction of variance the PCA keeps (paper: 90%).
    max_components : int or "auto", default="auto"
        Cap on PCA components (hashed text needs thousands for 90%). ``"auto"``: one
        component per 10 documents of the fitting window, at least 300 and at most 1000
        (:func:`auto_max_components`; whole-corpus fits gain from more than a fixed 300, docs/algorithms/semi-ldc.md).
    pca_min_df : int, default=2
        PCA/LDA use only terms occurring in at least this many training documents.
    pca_n_iter : int, default=4
        Power iterations of the randomized PCA.
    mu : float, default=3.0
        Regularisation of Eq. 14, relative to the mean eigenvalue of S_w (3.0 chosen on
        the robustness development draws with ``soft_labels="constrained-kmeans"``; 1.0
        was the best value with PLSA labels on the semi-ldc protocol's corpora).
    normalize_projection : bool, default=True
        l2-normalise the projected documents before constrained k-means (cosine
        k-means in the LDA space); False uses the plain Euclidean projection. Ignored
        for two clusters (K - 1 = 1 dimension), where normalising would leave only the
        sign and make every score one of two values.
    plsa_alpha, plsa_beta, plsa_init_mix, plsa_tol, plsa_max_iter :
        Parameters of the :class:`ConstrainedPLSA` that produces the soft labels.
    kmeans_max_iter : int, default=100
    n_refine : int, default=3
        Extra LDA/k-means rounds (an extension, not in the paper): soft LDA is refitted
        on the previous round's cluster assignment (hard labels, seeds fixed) and
        constrained k-means re-run in the new space. 0 gives the paper's Algorithm 2;
        stops early when the assignment no longer changes.
    n_new_clusters : int, default=0
        Extra clusters for classes nobody seeded (extra PLSA topics, LDA uses them
        as classes, k-means starts them at their soft means).
    discovery : {"calibrated", "legacy"}, default="calibrated"
        How new clusters are found (no effect with ``n_new_clusters=0``): ``"calibrated"``
        fits the seeded classes as with ``n_new_clusters=0`` and clusters only the
        documents no seeded class explains (:mod:`streamsemi.algorithms._discovery`);
        ``"legacy"``: the extra clusters inside the algorithm, as described above.
    discovery_quantile : float in (0, 1), default=0.4
        Calibrated discovery: the quantile of a class's seeds' similarity below which a
        document is not explained by that class.
    discovery_init : sparse matrix of shape (n_clusters, n_features) or None, default=None
        Calibrated discovery: unit centroids that start the clustering of the unexplained
        documents (a warm start; the engine passes the previous fit's clusters,
        :func:`~streamsemi.algorithms._discovery.warm_start_discovery`).
    discovery_split : bool, default=False
        Calibrated discovery: cluster again the members of every rejected cluster and judge
        its parts (finds small unseeded classes hidden in a mixture, at the cost of more and
        less stable new clusters; :func:`~streamsemi.algorithms._discovery.split_rejected`).
    class_prior : {"assignment", "uniform"}, default="assignment"
        Class priors in the final assignment. ``"assignment"``: the Bayes rule of a
        shared-variance Gaussian mixture in the projected space, ``argmax_c -||y - c_c||^2
        + 2 s^2 ln pi_c`` with ``pi_c`` and ``s^2`` re-estimated from the current assignment
        at every k-means iteration (hard EM, :func:`prior_kmeans_dense`); without it the
        whitened LDA space gives a small class as much room as a large one (see
        ``docs/algorithms/semi-ldc.md``, "Robustness"). ``"uniform"``: the paper's plain
        nearest centroid (constrained k-means).
    soft_labels : {"constrained-kmeans", "plsa", "agreement"}, default="constrained-kmeans"
        The class labels the first soft LDA is trained on (Algorithm 2, line 2).
        ``"plsa"``: the paper's constrained-PLSA posteriors ``Q``. ``"constrained-kmeans"``:
        the one-hot assignment of constrained spherical k-means on the same tf-idf rows
        (:func:`kmeans_soft_labels`); on skewed corpora PLSA gives a one-seed class a
        sub-cluster of a large class and the LDA then separates exactly that wrong
        group. ``"agreement"``: PLSA's ``Q`` restricted to the documents on which both
        agree (the others get no weight in the first LDA). PLSA is fitted in every case
        (its topics drive :meth:`explain`), and its ``Q`` is used whatever this setting
        when the legacy discovery adds clusters inside the algorithm (its extra topics
        are what finds them). The choice and its figures are in
        ``docs/algorithms/semi-ldc.md`` ("Robustness").
    random_state : int >= 0 or None, default=0

    Attributes
    ----------
    classes_ : ndarray of str
    new_clusters_ : list of str
    n_features_in_ : int
    plsa_ : ConstrainedPLSA
        The fitted soft-label model (its Theta drives :meth:`explain`).
    idf_ : ndarray (n_features,)
    n_components_ : int
        PCA dimension kept.
    explained_variance_ratio_ : float
        Variance fraction of the kept components.
    projection_ : ndarray (n_features, n_dims)
        Composed PCA basis times LDA matrix A (zero rows outside the PCA vocabulary).
    offset_ : ndarray (n_dims,)
        ``mean @ projection_`` (the implicit centring).
    lda_eigenvalues_ : ndarray (K - 1,)
    cluster_centers_ : ndarray (K, n_dims)
    labels_ : ndarray of int
        Cluster index of each training row (seeds: their class).
    class_bias_ : ndarray (K,)
        ``2 s^2 ln pi_c`` added to the scores (zeros with ``class_prior="uniform"``).
    sigma2_ : float
        Per-dimension variance of the training documents around their centroid.
    temperature_ : float
        Softmax temperature of ``predict_proba`` (see :func:`calibrate_temperature`).
    n_iter_ : int
        Constrained k-means iterations (last round).
    n_refine_done_ : int
        Refinement rounds actually run.
    normalized_ : bool
        Whether projected rows are l2-normalised (``normalize_projection`` and K > 2).
    """

    _parameter_constraints = {
        "weighting": [StrOptions(set(WEIGHTINGS))],
        "pca_variance": [Interval(Real, 0, 1, closed="right")],
        "max_components": [Interval(Integral, 1, None, closed="left"), StrOptions({"auto"})],
        "pca_min_df": [Interval(Integral, 1, None, closed="left")],
        "pca_n_iter": [Interval(Integral, 0, None, closed="left")],
        "mu": [Interval(Real, 0, None, closed="neither")],              # Eq. 14 regularisation
        "normalize_projection": ["boolean"],
        **{f"plsa_{k}": v for k, v in ConstrainedPLSA._parameter_constraints.items()
           if k in ("alpha", "beta", "init_mix", "tol", "max_iter")},
        "kmeans_max_iter": [Interval(Integral, 1, None, closed="left")],
        "n_refine": [Interval(Integral, 0, None, closed="left")],
        "class_prior": [StrOptions({"assignment", "uniform"})],
        "soft_labels": [StrOptions({"plsa", "constrained-kmeans", "agreement"})],
        **DISCOVERY_CONSTRAINTS,
        "random_state": RANDOM_STATE,
    }

    def __init__(self, weighting: str = "tfidf", *, pca_variance: float = 0.9,
                 max_components: int | str = "auto", pca_min_df: int = 2, pca_n_iter: int = 4,
                 mu: float = 3.0, normalize_projection: bool = True,
                 plsa_alpha: float = 0.01, plsa_beta: float = 1.0, plsa_init_mix: float = 0.9,
                 plsa_tol: float = 1e-5, plsa_max_iter: int = 100, kmeans_max_iter: int = 100,
                 n_refine: int = 3, class_prior: str = "assignment",
                 soft_labels: str = "constrained-kmeans", discovery: str = "calibrated", discovery_quantile: float = 0.4, discovery_init: Any = None,
                 discovery_split: bool = False,
                 n_new_clusters: int | str = 0,
                 random_state: int | None = 0) -> None:
        self.weighting = weighting
        self.n_refine = n_refine
        self.class_prior = class_prior
        self.soft_labels = soft_labels
        self.pca_variance = pca_variance
        self.max_components = max_components
        self.pca_min_df = pca_min_df
        self.pca_n_iter = pca_n_iter
        self.mu = mu
        self.normalize_projection = normalize_projection
        self.plsa_alpha = plsa_alpha
        self.plsa_beta = plsa_beta
        self.plsa_init_mix = plsa_init_mix
        self.plsa_tol = plsa_tol
        self.plsa_max_iter = plsa_max_iter
        self.kmeans_max_iter = kmeans_max_iter
        self.n_new_clusters = n_new_clusters
        self.discovery = discovery
        self.discovery_quantile = discovery_quantile
        self.discovery_init = discovery_init
        self.discovery_split = discovery_split
        self.random_state = random_state

    # -- fitting -----------------------------------------------------------
    def fit(self, X: Any, y: Any) -> SemiLDC:
        """Fit on counts ``X`` with seed labels ``y`` (None/-1/"" = unlabeled)."""
        if uses_calibrated(self):
            return fit_calibrated(self, X, y)
        X, codes, classes = self._fit_inputs(X, y)
        rng = np.random.default_rng(self.random_state)
        n_known = classes.size
        K = n_known + int(self.n_new_clusters)

        # 1. soft labels (Algorithm 2, line 2)
        plsa = ConstrainedPLSA(alpha=self.plsa_alpha, beta=self.plsa_beta,
                               init_mix=self.plsa_init_mix, tol=self.plsa_tol,
                               max_iter=self.plsa_max_iter, n_new_clusters=self.n_new_clusters,
                               random_state=self.random_state)
        plsa._fit(X, codes, classes)
        Q = plsa.soft_labels_

        # 2. PCA with implicit centring (line 3)
        self.idf_ = idf_weights(X)
        W = _weight(X, self.weighting, self.idf_)
        cols = observed_columns(W, self.pca_min_df)
        if cols.size < 2:
            cols = observed_columns(W, 1)
        Ws = sp.csr_matrix(W[:, cols])
        cap = (auto_max_components(Ws.shape[0]) if self.max_components == "auto"
               else int(self.max_components))
        n_comp = max(cap, K - 1)
        mean, V, explained, total = randomized_pca(Ws, n_comp, rng, n_iter=int(self.pca_n_iter),
                                                   dtype=PCA_DTYPE)
        d = n_components_for_variance(explained, total, float(self.pca_variance), K - 1)
        V = V[:, :d]
        Ws = Ws.astype(V.dtype, copy=False)
        Z = np.asarray(Ws @ V, dtype=np.float64) - (mean @ V).astype(np.float64)[None, :]
        del Ws
        if self.soft_labels in ("constrained-kmeans", "agreement") and K == n_known:
            Xn = W if self.weighting == "tfidf" else tfidf(X, self.idf_)
            Qk = kmeans_soft_labels(Xn, codes, n_known)
            # "agreement": only documents on which PLSA and k-means agree (and the seeds) train the first LDA
            Q = Qk if self.soft_labels == "constrained-kmeans" else Q * Qk

        labels = None
        self.normalized_ = bool(self.normalize_projection) and K - 1 >= 2
        self.n_refine_done_ = 0
        for round_ in range(int(self.n_refine) + 1):
            if round_ > 0:  # refinement: LDA on the previous assignment (extension)
                Q = np.eye(K)[labels]
            # 3. soft LDA (lines 4-8, Eq. 8-14)
            Sb, Sw = soft_scatter_matrices(Z, Q)
            A, evals = soft_lda_projection(Sb, Sw, float(self.mu), K - 1)
            # 4. project (line 9) and constrained k-means (line 10)
            self.offset_ = (mean @ V) @ A
            Y = self._embed_weighted(Z @ A + self.offset_[None, :])
            C0 = self._initial_centroids(Y, codes, Q, n_known)
            previous = labels
            if self.class_prior == "assignment":
                labels, C, bias, n_iter = prior_kmeans_dense(Y, codes, C0, int(self.kmeans_max_iter))
            else:
                labels, C, n_iter = constrained_kmeans_dense(Y, codes, C0, int(self.kmeans_max_iter))
                bias = np.zeros(K)
            self.n_refine_done_ = round_
            if previous is not None and np.array_equal(previous, labels):
                break
        P = np.zeros((X.shape[1], A.shape[1]))
        P[cols] = V @ A.astype(V.dtype)
        self.projection_ = P

        d2 = _sq_distances(Y, C)[np.arange(Y.shape[0]), labels]
        self.sigma2_ = max(float(d2.mean()) / Y.shape[1], 1e-12)
        self.temperature_ = calibrate_temperature(_sq_distances(Y, C) - bias[None, :], codes,
                                                  2.0 * self.sigma2_)
        self.class_bias_ = bias
        self.plsa_ = plsa
        self.n_components_ = d
        self.explained_variance_ratio_ = float(explained[:d].sum() / total) if total > 0 else 1.0
        self.lda_eigenvalues_ = evals
        self.cluster_centers_ = C
        self.labels_ = labels
        self.n_iter_ = n_iter
        self.new_clusters_ = list(plsa.new_clusters_)
        self.classes_ = np.array(list(classes) + self.new_clusters_, dtype=object)
        return self

    def _embed_weighted(self, WP: Any) -> np.ndarray:
        """Centre a projected weighted matrix and optionally l2-normalise its rows."""
        Y = np.asarray(WP) - self.offset_[None, :]
        if self.normalized_:
            norms = np.linalg.norm(Y, axis=1, keepdims=True)
            norms[norms == 0] = 1.0
            Y = Y / norms
        return Y

    def _initial_centroids(self, Y: np.ndarray, codes: np.ndarray, Q: np.ndarray,
                           n_known: int) -> np.ndarray:
        """Seeded classes start at their seeds' mean (Basu et al.); new ones at their soft mean."""
        idx = np.flatnonzero(codes >= 0)
        counts = np.bincount(codes[idx], minlength=n_known).astype(np.float64)
        C = np.zeros((Q.shape[1], Y.shape[1]))
        np.add.at(C, codes[idx], Y[idx])
        C[:n_known] /= counts[:, None]
        if Q.shape[1] > n_known:
            Qn = Q[:, n_known:]
            C[n_known:] = (Qn.T @ Y) / np.maximum(Qn.sum(axis=0), 1e-12)[:, None]
        return C

    # -- inference ---------------------------------------------------------
    def transform(self, X: Any) -> np.ndarray:
        """Project documents (counts) into the K-1 dimensional soft-LDA space."""
        return self._transform(X)

    def _transform(self, X: Any) -> np.ndarray:
        # transform without scikit-learn's set_output wrapper (its checks cost ~20 us per predict call)
        X = self._validate_counts(X, reset=False)
        return self._embed_weighted(_weight(X, self.weighting, self.idf_) @ self.projection_)

    def _scores(self, X: Any) -> np.ndarray:
        """Minus the squared distance to each centroid in the LDA space, plus the class bias.

        ``predict`` is the argmax of ``-||y - c_k||^2 + b_k`` (``b = class_bias_``, the
        ``2 s^2 ln pi_k`` of the class priors; zero for the paper's nearest centroid) and
        ``predict_proba`` is ``p(k | x) ∝ exp((-||y - c_k||^2 + b_k) / T)`` with
        ``T = temperature_``: the posterior of a shared isotropic Gaussian per cluster with
        priors, flattened where the seeds show that the assignment is less certain than
        the Gaussian claims.
        """
        D2 = _sq_distances(self._transform(X), self.cluster_centers_)  # _transform checks fitted
        return self.class_bias_[None, :] - D2

    def _softmax_temperature(self) -> float:
        return float(self.temperature_)

    def _fit_summary(self) -> dict[str, Any]:
        """The PCA dimension kept (``n_components``), the variance it explains and the
        refinement iterations run."""
        return {"n_components": int(self.n_components_),
                "explained_variance": round(float(self.explained_variance_ratio_), 4),
                "n_iter": int(self.n_iter_)}

    def _explain_weights(self) -> np.ndarray:
        """Top words per class from the constrained-PLSA Theta (see ConstrainedPLSA)."""
        return self.plsa_._explain_weights()


__all__ = ["ConstrainedPLSA", "SemiLDC", "constrained_kmeans_dense", "gaussian_prior_bias",
           "l2_normalize_rows", "prior_kmeans_dense",
           "plsa_e_step", "plsa_m_step", "randomized_pca", "soft_lda_projection",
           "soft_scatter_matrices"]
