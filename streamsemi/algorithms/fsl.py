"""Feature space learning (FSL; Guan, Wang, Marchese, Yang, Liang & Yang 2018).

FSL wraps a base clusterer in a loop that grows a *feature space* per cluster
from "trust samples", while controlling noise with the burstiness of words:

1. initialise the clusters from the seeds (class means of the seed vectors);
2. cluster with the base algorithm (cosine similarity);
3. pick one trust sample per cluster (Definition 1: Eq. 7 for k-means, Eq. 10
   for affinity propagation); trust samples join the labeled set;
4. keep the trust sample's *rich-information features* (RIFs, Definition 2 /
   Eq. 2: bursty in the document AND frequent in the cluster);
5. update the RIF weights of the cluster's feature space with the decaying
   confidence ``conf_t = (T - t) / T`` (Eq. 3-5);
6. labeled pairs get the maximum similarity in the same cluster and the minimum
   in different clusters;
7. stop when the assignments have not changed for ``patience`` iterations or
   after ``T = max_iter`` iterations.

Four variants (``variant=``): ``"sk"`` FSSK-means (seeds only initialise),
``"ck"`` FSCK-means (seeds and trust samples stay in their cluster in every
assignment step), ``"ap"`` FSAP (affinity propagation on cosine similarity,
labeled self-similarity by Eq. 11) and ``"sap"`` FSSAP (affinity propagation on
the tri-set similarity of Eq. 12-15 with compact seeds and cluster significant
features, Eq. 16). ``feature_learning=False`` runs the same clusterer without
FSL (no trust samples, no feature weights): seeded / constrained k-means
(identical to :class:`~streamsemi.algorithms.constrained_kmeans.ConstrainedKMeans`),
SAP(CC) and SAP, the paper's baselines.

Interpretations (the paper is loose; each choice and why)
---------------------------------------------------------
* **Representation.** Documents are l2-normalised sublinear tf-idf rows (as in
  ConstrainedKMeans) restricted to the columns that occur in the fitting window
  (hashed space has 2^18 columns; the window uses a few ten thousand), so all
  per-cluster arrays are K x (active columns). The *frequencies* of Definition 2
  and Eq. 5 (``n`` and ``m``) are raw term counts, as the paper defines them.
* **How the learned weights act.** The paper says the feature space is "a
  linear combination of the trust-sample RIF vectors and the original space"
  and that the weights are "embedded in the similarity measurement", without a
  formula. Cluster ``k`` gets a per-feature scale ``g_k = 1 + feature_gain *
  w_k`` (``w_k`` the Eq. 5 weights, 0 for features never selected), and the
  similarity of document ``d`` to cluster ``k`` is the cosine computed in
  cluster k's rescaled space, ``cos(d * g_k, c_k * g_k)``
  (:func:`weighted_cosine`). With ``w = 0`` this is the plain cosine, so the
  learned space only ever *adds* emphasis on RIFs, which is the paper's stated
  intent (RIFs span the feature space; other features stay).
* **Eq. 4/5.** Eq. 4's sum is written with ``t`` in the summand, but its closed
  form ``t (1 - (t + 1) / (2T))`` is the sum of ``conf_i`` for ``i = 1..t``;
  we use the closed form. Eq. 5 is applied to the RIFs only; other features keep
  their weight. ``conf_T = 0``, so the last iteration (``t = T``) learns nothing:
  it only clusters with the learned spaces.
* **Trust samples.** Eq. 1/7 would pick the same (labeled) member again and
  again, so the argmax runs over the cluster's members that are not yet labeled
  (not seeds, not earlier trust samples). For the k-means variants the
  membership is the similarity used for the assignment (in the learned space);
  ``argmin ||d - c_k||^2`` equals ``argmax cos`` for unit vectors. For the AP
  variants, Eq. 10's ``s(i, e) + s(e, e)`` is maximised over the unlabeled
  members of each *class* (all AP clusters mapped to one class), so that one
  trust sample per class and iteration is chosen, as for k-means (with a labeled
  exemplar per seed, Eq. 11 would otherwise yield hundreds per iteration).
* **RIFs (Eq. 2).** ``n_*^l >= eta * mean(n_* over d*'s features)`` and
  ``m_k^l >= mu * mean(m_k over the features with m_k > 0)`` where ``m_k`` is the
  summed value of the feature over the members of cluster ``k``
  (:func:`rich_information_features`). The paper calls ``n`` both "frequency"
  and "feature value"; with raw counts (``rif_values="counts"``) the RIFs are
  dominated by corpus-wide bursty words ("mln", "pct", "said": the paper's own
  Table 6 shows such words) and the learned weights *hurt* (Reuters top-10, 20
  labeled: FSCK F 0.66-0.69 vs 0.74 without FSL). The default uses the
  documents' tf-idf values, which discounts those words.
* **Labeled-pair similarity (step 6) for k-means.** k-means has no pairwise
  matrix; the rule becomes: the labeled set (seeds + trust samples) defines the
  initial centres of every outer iteration (same-cluster pairs are merged), and
  in FSCK it is also a hard constraint (labeled documents never leave their
  cluster). In FSSK, as in seeded k-means, labeled documents only initialise.
  Each outer iteration runs a complete k-means (the paper: "after ... a complete
  k-means clustering, the next step is to select the trust samples").
* **AP on a bounded sample.** AP is O(n^2) in memory and time, so it runs on at
  most ``ap_sample`` documents of the window: the labeled documents first (a
  class-stratified subset when there are more than ``ap_sample // 2``; in FSSAP
  all of them, since they are merged into K compact seeds), then a random subset
  of the unlabeled ones. Every other row of the window is assigned to the
  nearest class centre in the learned space (centres = normalised mean of the
  sample members and labeled documents of the class), which is more robust than
  the single nearest exemplar. AP itself is our own vectorised implementation of
  Frey & Dueck's message passing (damping 0.8), which, unlike scikit-learn's,
  still returns the exemplars when it hits ``ap_max_iter`` without converging.
* **Eq. 11.** ``P`` and ``Q`` are the min and max off-diagonal similarity among
  the unlabeled sample documents; unlabeled preference ``P - phi (Q - P)``;
  the labeled preference ``+inf`` is replaced by the finite ``Q + 2 (Q - P)``,
  which provably keeps every labeled point an exemplar (its self-responsibility
  is at least ``2 (Q - P) > 0``) without the NaNs an infinity would cause.
  Labeled pairs: ``Q`` within a class, ``P`` across classes.
* **Clusters without seeds (AP).** AP decides its own number of clusters. An AP
  cluster whose exemplar is unlabeled becomes one of the ``n_new_clusters``
  discovered clusters ``new-i`` if it is among the largest such clusters (at
  least 2 members); every other one is merged into the class of the most
  similar labeled exemplar. With the default ``n_new_clusters=0`` all of them
  are merged, so ``classes_`` are exactly the seeded classes.
* **Tri-set similarity (Eq. 12-15).** Row values are l1-normalised (weighted)
  tf-idf, so ``s(i, j) = alpha * (mass of j on features shared with i) + beta *
  (mass of j's significant features shared with i) - gamma * (mass of i on
  features j lacks)`` lies in ``[-gamma, alpha + beta]``. Our documents have no
  title/abstract, so a document's significant features ``SF`` are its bursty
  features (count >= ``eta`` x its mean count, the same rule as Eq. 2). Compact
  seeds: the labeled documents (seeds + trust samples) of a class are summed
  into one pseudo-document. Eq. 16: an RIF of cluster ``k`` whose cluster
  frequency is at least the mean cluster frequency over the current ``SFC_k``
  joins ``SFC_k``, the significant features of class ``k``'s compact seed.
* **AP similarity in learned spaces.** ``s(i, j)`` is computed in the feature
  space of the class that candidate exemplar ``j`` belonged to in the previous
  iteration (the first iteration uses the plain space).
* **predict / predict_proba.** Nearest class centre in the learned weighted
  space; probabilities are a softmax of those similarities with ``temperature``
  (same default as ConstrainedKMeans). ``explain`` ranks each cluster's learned
  RIF weights first, then its centre's tf-idf weights.
"""

from __future__ import annotations

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
from streamsemi.algorithms.constrained_kmeans import (
    by_size_pass,
    class_means,
    class_scores,
    farthest_point_centroids,
    seed_means,
    several_centroids,
)
from streamsemi.algorithms.ensemble import row_keys
from streamsemi.core.features import idf_weights, l1_normalize_rows, l2_normalize_rows, tfidf

#: Per fitted model, :func:`centre_terms` of its centres and feature scales.
_CENTRE_TERMS: DerivedArrays[tuple[np.ndarray, np.ndarray, np.ndarray]] = DerivedArrays()

VARIANTS = ("sk", "ck", "ap", "sap")


# ----------------------------------------------------------------------------------------------
# Pure functions: the paper's equations
# ----------------------------------------------------------------------------------------------

def confidence(t: int, T: int) -> float:
    """Confidence of the trust samples of iteration ``t`` (Eq. 3): ``(T - t) / T``."""
    return (T - t) / T


def cumulative_confidence(t: int, T: int) -> float:
    """Total confidence up to iteration ``t`` (Eq. 4): ``sum_{i<=t} (T-i)/T = t (1 - (t+1)/(2T))``."""
    return t * (1.0 - (t + 1) / (2.0 * T))


def update_rif_weights(w: np.ndarray, rif: np.ndarray, counts: np.ndarray, t: int, T: int) -> np.ndarray:
    """Eq. 5: ``w_i^t = conf_t / conf_T * w_i^{t-1} + conf_t / conf_T * n_*^i`` for RIFs ``i``.

    Parameters
    ----------
    w : ndarray of shape (n_features,)
        Current weights of one cluster's feature space (unchanged outside ``rif``).
    rif : ndarray of int
        Indices of the rich-information features of the trust sample.
    counts : ndarray
        Their counts ``n_*^i`` in the trust sample (same order as ``rif``).
    t, T : int
        Iteration (1-based) and total number of iterations.

    Returns
    -------
    ndarray
        A new weight vector.
    """
    out = np.array(w, dtype=np.float64, copy=True)
    cum = cumulative_confidence(t, T)
    if cum <= 0 or len(rif) == 0:
        return out
    ratio = confidence(t, T) / cum
    out[rif] = ratio * out[rif] + ratio * np.asarray(counts, dtype=np.float64)  # Eq. 5
    return out


def rich_information_features(doc_features: np.ndarray, doc_counts: np.ndarray,
                              cluster_freq: np.ndarray, eta: float, mu: float) -> np.ndarray:
    """Rich-information features of a trust sample for its cluster (Definition 2, Eq. 2).

    Feature ``l`` of the trust sample ``d*`` is an RIF when
    ``n_*^l >= eta * sum_l n_*^l / L_*`` and ``m_k^l >= mu * sum_p m_k^p / P_k``,
    ``L_*`` being the number of features of ``d*`` and ``P_k`` the number of
    features of the cluster centre (features with ``m_k > 0``).

    Parameters
    ----------
    doc_features : ndarray of int
        Feature indices present in the trust sample.
    doc_counts : ndarray
        Their counts ``n_*`` (positive).
    cluster_freq : ndarray of shape (n_features,)
        Frequency ``m_k`` of every feature in cluster ``k`` (summed member counts).
    eta, mu : float
        Control parameters.

    Returns
    -------
    ndarray of int
        The RIF indices (a subset of ``doc_features``, same order).
    """
    doc_features = np.asarray(doc_features)
    doc_counts = np.asarray(doc_counts, dtype=np.float64)
    if doc_features.size == 0:
        return doc_features.astype(np.int64)
    center = cluster_freq[cluster_freq > 0]
    cluster_threshold = mu * center.mean() if center.size else np.inf
    keep = (doc_counts >= eta * doc_counts.mean()) & (cluster_freq[doc_features] >= cluster_threshold)
    return doc_features[keep].astype(np.int64)


def significant_cluster_features(rif: np.ndarray, cluster_freq: np.ndarray, sfc: np.ndarray) -> np.ndarray:
    """RIFs that join the cluster's significant feature set ``SFC_k`` (Eq. 16).

    An RIF ``i`` joins when ``m_k^i >= sum_{p in SFC_k} m_k^p / |SFC_k|`` (every
    RIF joins an empty ``SFC_k``).
    """
    rif = np.asarray(rif, dtype=np.int64)
    if sfc.size == 0:
        return rif
    return rif[cluster_freq[rif] >= cluster_freq[sfc].mean()]


def centre_terms(C: np.ndarray, G: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The cluster side of :func:`weighted_cosine`, which does not depend on the documents.

    Returns
    -------
    CGG_T : ndarray (m x K)
        ``(c_k * g_k * g_k)`` of every cluster, transposed and C-contiguous (the right-hand
        side of the sparse product: scipy would copy a transposed view in full per call).
    centre_norms : ndarray (K,)
        ``||c_k * g_k||``.
    GG_T : ndarray (m x K)
        ``g_k * g_k`` transposed, for :func:`weighted_doc_norms`.
    """
    GG = G * G
    return np.ascontiguousarray((C * GG).T), np.linalg.norm(C * G, axis=1), np.ascontiguousarray(GG.T)


def weighted_cosine(Xn: sp.csr_matrix, Xn_sq: sp.csr_matrix, C: np.ndarray, G: np.ndarray,
                    doc_norms: np.ndarray | None = None,
                    terms: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Cosine of every row to every cluster centre, each in its cluster's weighted space.

    ``S[i, k] = <x_i * g_k, c_k * g_k> / (||x_i * g_k|| ||c_k * g_k||)``; with
    ``G = 1`` this is the plain cosine.

    Parameters
    ----------
    Xn : csr_matrix (n x m)
        Document rows.
    Xn_sq : csr_matrix (n x m)
        Element-wise square of ``Xn`` (passed in so loops need not recompute it).
    C : ndarray (K x m)
        Cluster centres.
    G : ndarray (K x m)
        Per-cluster feature scales ``g_k``.
    doc_norms : ndarray (n x K), optional
        ``||x_i * g_k||`` (:func:`weighted_doc_norms`), when already known.
    terms : tuple, optional
        :func:`centre_terms` of ``C`` and ``G``, when already known (a fitted model's
        predictions reuse them: computing them is ``O(K m)`` per call).
    """
    CGG_T, centre_norms, GG_T = terms if terms is not None else centre_terms(C, G)
    if doc_norms is None:
        doc_norms = _doc_norms(Xn_sq, GG_T)
    num = np.asarray(Xn @ CGG_T)
    den = doc_norms * centre_norms[None, :]
    out = np.zeros_like(num)
    np.divide(num, den, out=out, where=den > 0)
    return out


def weighted_doc_norms(Xn_sq: sp.csr_matrix, G: np.ndarray) -> np.ndarray:
    """``||x_i * g_k||`` for every row ``i`` and cluster ``k`` (n x K)."""
    return _doc_norms(Xn_sq, np.ascontiguousarray((G * G).T))


def _doc_norms(Xn_sq: sp.csr_matrix, GG_T: np.ndarray) -> np.ndarray:
    return np.sqrt(np.maximum(np.asarray(Xn_sq @ GG_T), 0.0))


def trust_quota_reached(labeled: np.ndarray, seeds: np.ndarray, n_known: int, per_seed: float) -> np.ndarray:
    """Seeded classes whose trust samples already number ``per_seed`` times their seeds.

    Parameters
    ----------
    labeled : ndarray of int (n,)
        Class code of each row in the labeled set (seeds and trust samples), -1 otherwise.
    seeds : ndarray of int (n,)
        Class code of each seed, -1 otherwise.
    n_known : int
    per_seed : float

    Returns
    -------
    ndarray of bool (n_known,)
    """
    n_seeds = np.bincount(seeds[seeds >= 0], minlength=n_known)[:n_known]
    n_labeled = np.bincount(labeled[labeled >= 0], minlength=n_known)[:n_known]
    return n_labeled - n_seeds >= per_seed * n_seeds


def select_trust_samples(score: np.ndarray, labels: np.ndarray, eligible: np.ndarray,
                         n_clusters: int) -> np.ndarray:
    """One trust sample per cluster: the eligible member with the best membership (Eq. 1).

    Parameters
    ----------
    score : ndarray of shape (n,)
        Membership of each row in its own cluster (Eq. 7: similarity to the centre;
        Eq. 10: ``s(i, e) + s(e, e)``).
    labels : ndarray of int, shape (n,)
        Cluster of each row.
    eligible : ndarray of bool, shape (n,)
        Rows that may become trust samples (not yet labeled).
    n_clusters : int

    Returns
    -------
    ndarray of int, shape (n_clusters,)
        Row index of each cluster's trust sample, -1 when it has no eligible member.
    """
    out = np.full(n_clusters, -1, dtype=np.int64)
    if len(labels) == 0:
        return out
    s = np.where(eligible, np.asarray(score, dtype=np.float64), -np.inf)
    for k in range(n_clusters):
        masked = np.where(labels == k, s, -np.inf)
        j = int(np.argmax(masked))
        if np.isfinite(masked[j]):
            out[k] = j
    return out


def ap_preferences(S_offdiag_unlabeled: np.ndarray, labeled: np.ndarray, phi: float) -> tuple[np.ndarray, float, float]:
    """Self-similarities of Eq. 11 and the extreme similarities ``P`` (min), ``Q`` (max).

    Parameters
    ----------
    S_offdiag_unlabeled : ndarray
        Off-diagonal similarities among the unlabeled sample points (any shape).
    labeled : ndarray of bool, shape (n,)
    phi : float
        Adaptive factor of Eq. 11.

    Returns
    -------
    pref : ndarray of shape (n,)
        ``P - phi (Q - P)`` for unlabeled points, ``Q + 2 (Q - P)`` (finite stand-in
        for ``+inf``) for labeled ones.
    P, Q : float
    """
    vals = np.asarray(S_offdiag_unlabeled, dtype=np.float64).ravel()
    if vals.size == 0:
        P, Q = 0.0, 1.0
    else:
        P, Q = float(vals.min()), float(vals.max())
    if Q - P <= 0:
        Q = P + 1.0
    pref = np.where(labeled, Q + 2.0 * (Q - P), P - phi * (Q - P))
    return pref, P, Q


def affinity_propagation(S: np.ndarray, damping: float = 0.8, max_iter: int = 300,
                         convergence_iter: int = 30) -> tuple[np.ndarray, np.ndarray, int]:
    """Affinity propagation (Frey & Dueck 2007), vectorised, minimising Eq. 9.

    ``S`` holds the preferences on its diagonal. Unlike scikit-learn's version it
    returns the current exemplars when ``max_iter`` is reached. It stops once the
    exemplar set has been the same for ``convergence_iter`` rounds; scikit-learn's
    15 rounds with damping 0.9 stop before messages have travelled (a well
    separated blob without a labeled point is missed), hence 30 rounds and 0.8.

    Returns
    -------
    exemplars : ndarray of int
        Exemplar row indices (at least one).
    labels : ndarray of int, shape (n,)
        Index into ``exemplars`` for every row (exemplars point to themselves).
    n_iter : int
    """
    S = np.asarray(S, dtype=np.float64)
    n = S.shape[0]
    ind = np.arange(n)
    A = np.zeros((n, n))
    R = np.zeros((n, n))
    history = np.zeros((convergence_iter, n), dtype=bool)
    it = 0
    for it in range(1, max_iter + 1):  # noqa: B007
        AS = A + S
        idx = np.argmax(AS, axis=1)
        first = AS[ind, idx]
        AS[ind, idx] = -np.inf
        second = AS.max(axis=1)
        Rn = S - first[:, None]
        Rn[ind, idx] = S[ind, idx] - second
        R = damping * R + (1 - damping) * Rn
        Rp = np.maximum(R, 0)
        Rp[ind, ind] = R[ind, ind]
        An = Rp.sum(axis=0)[None, :] - Rp
        dA = An[ind, ind].copy()
        An = np.minimum(An, 0)
        An[ind, ind] = dA
        A = damping * A + (1 - damping) * An
        E = (np.diag(A) + np.diag(R)) > 0
        history[it % convergence_iter] = E
        if it >= convergence_iter and E.any() and (history == E[None, :]).all():
            break
    exemplars = np.flatnonzero(E)
    if exemplars.size == 0:
        exemplars = np.array([int(np.argmax(np.diag(A) + np.diag(R)))])
    labels = np.argmax(S[:, exemplars], axis=1)
    labels[exemplars] = np.arange(exemplars.size)
    return exemplars, labels, it


def triset_similarity(U: sp.csr_matrix, B: sp.csr_matrix, U_cols: sp.csr_matrix, B_cols: sp.csr_matrix,
                      SF_cols: sp.csr_matrix, alpha: float, beta: float, gamma: float) -> np.ndarray:
    """Tri-set similarity of SAP (Eq. 12-15), rows ``i`` against candidate exemplars ``j``.

    ``s(i, j) = alpha sum_{f in CFS(i,j)} u_j^f + beta sum_{f in SCS(i,j)} u_j^f
    - gamma sum_{f in UFS(i,j)} u_i^f`` with ``CFS = F_i & F_j`` (Eq. 12),
    ``UFS = F_i - F_j`` (Eq. 13), ``SCS = F_i & SF_j`` (Eq. 14).

    Parameters
    ----------
    U, B : csr_matrix (n x m)
        l1-normalised values and 0/1 feature indicators of the rows ``i``.
    U_cols, B_cols : csr_matrix (p x m)
        The same for the candidate exemplars ``j``.
    SF_cols : csr_matrix (p x m)
        0/1 indicators of the significant features ``SF_j``.
    """
    cfs = np.asarray((B @ U_cols.T).todense())
    scs = np.asarray((B @ U_cols.multiply(SF_cols).T).todense())
    shared_i = np.asarray((U @ B_cols.T).todense())
    ufs = np.asarray(U.sum(axis=1)).reshape(-1, 1) - shared_i
    return alpha * cfs + beta * scs - gamma * ufs


def bursty_features(X: sp.csr_matrix, eta: float) -> sp.csr_matrix:
    """0/1 matrix of each row's features with count >= ``eta`` x the row's mean count."""
    X = sp.csr_matrix(X)
    lengths = np.diff(X.indptr)
    sums = np.asarray(X.sum(axis=1)).ravel()
    means = sums / np.maximum(lengths, 1)
    keep = X.data >= eta * np.repeat(means, lengths)
    out = sp.csr_matrix((keep.astype(np.float64), X.indices.copy(), X.indptr.copy()), shape=X.shape)
    out.eliminate_zeros()
    return out


def _normalize_rows(C: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(C, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return C / norms


def _indicator(labels: np.ndarray, n_clusters: int, weights: np.ndarray | None = None) -> sp.csr_matrix:
    rows = np.flatnonzero(labels >= 0)
    values = np.ones(rows.size) if weights is None else weights[rows]
    return sp.csr_matrix((values, (labels[rows], rows)), shape=(n_clusters, labels.size))


def _class_sums(X: sp.csr_matrix, labels: np.ndarray, n_clusters: int,
                weights: np.ndarray | None = None) -> np.ndarray:
    """Dense (K x m) sum of the rows of each cluster, each row times ``weights`` (default 1;
    rows with label -1 ignored)."""
    return np.asarray((_indicator(labels, n_clusters, weights) @ X).todense())


# ----------------------------------------------------------------------------------------------
# The estimator
# ----------------------------------------------------------------------------------------------

def seed_agreement(Xn: sp.csr_matrix, codes: np.ndarray, labels: np.ndarray, n_known: int) -> np.ndarray:
    """Rows whose cluster is also the class of the nearest labeled centre (cosine to the mean of
    each class's labeled rows, ``codes >= 0``: the seeds, or the seeds and earlier trust samples).

    A trust sample is taken as a new label of its cluster's class; this check only admits
    rows that the labels the class already has would give the same class, so a cluster
    that has drifted onto a neighbouring class (a one-seed class after one bad round)
    cannot collect that neighbour's documents as its labels. Rows of clusters without
    labels (``new-i``, ``labels >= n_known``) are always admitted.
    """
    S = seed_means(Xn, np.where(codes < n_known, codes, -1), n_known)
    nearest = np.asarray(Xn @ S.T).argmax(axis=1)
    return (labels >= n_known) | (nearest == labels)


ROUND_FOLDS = 3  # folds of the held-out round selection (``round_selection="held-out*"``)
ROUND_BOOTSTRAP = 200  # resamples of the held-out seeds for the standard error of their scores
#: ``round_selection="held-out"``: from this many documents in the fit the default round (kept unless another
#: beats it on held-out seeds) is the first, the base clusterer; below, the last (the paper's loop)
ROUND_FIRST_MIN_DOCS = 2000
ROUND_SELECTIONS = ("held-out", "held-out-all", "held-out-first", "all")


def default_round(selection: str, n_samples: int) -> int:
    """The round ``chosen_rounds`` keeps unless another beats it (``0``: the first, ``-1``: the
    last) for ``round_selection`` ``selection`` and a fit on ``n_samples`` documents.

    ``"held-out"`` (the default) takes the first round from ``ROUND_FIRST_MIN_DOCS`` documents
    on and the last below: the paper's loop was measured on at most 800 documents (400
    unlabeled + up to 400 labeled), and on development draws its later rounds were the gain in
    windows of 500-1,200 documents and a loss in windows of 2,500 and 5,000 and on whole corpora
    of 7,674-18,820 (docs/algorithms/fsl.md, "The default round follows the window's size").
    """
    if selection == "held-out-first" or (selection == "held-out" and n_samples >= ROUND_FIRST_MIN_DOCS):
        return 0
    return -1


class FSL(DiscoveryMixin, ScoresClassifierMixin, TransformerMixin, StreamsemiEstimator):
    """Feature space learning around k-means or affinity propagation (four variants).

    Parameters
    ----------
    variant : {"sk", "ck", "ap", "sap"}, default="ck"
        FSSK-means, FSCK-means, FSAP, FSSAP.
    feature_learning : bool, default=True
        False runs the same clusterer without FSL (no trust samples, no weights).
    max_iter : int, default=10
        ``T``: outer FSL iterations (each a complete clustering).
    patience : int, default=2
        Stop when the assignments have not changed for this many iterations.
    eta, mu : float, default=1.0
        RIF control parameters of Eq. 2 (document burstiness, cluster frequency).
    feature_gain : float, default=1.0
        Scale of the learned weights in the similarity: ``g_k = 1 + feature_gain * w_k``.
    rif_values : {"tfidf", "counts"}, default="tfidf"
        Feature values used as ``n`` and ``m`` in Eq. 2 and Eq. 5: the document's
        l2-normalised tf-idf values (default) or raw term counts.
    trust_new_clusters : bool, default=True
        Also pick trust samples for the discovered ``new-i`` clusters.
    trust_check : {"none", "labeled", "seeds"}, default="none"
        k-means variants: ``"none"`` is the paper's Eq. 7 alone; otherwise a trust sample
        must also be nearest (cosine) to its cluster's class among the means of the
        classes' labeled documents (:func:`seed_agreement`): ``"labeled"`` the seeds and
        the trust samples accepted so far, ``"seeds"`` the seeds only. Fewer wrong trust
        samples on skewed corpora, but no net gain on the robustness protocol and lower
        20NG figures, so not the default: see ``docs/algorithms/fsl.md`` ("Robustness").
    max_trust_per_seed : float or None, default=None
        k-means variants: a seeded class takes trust samples only while it has fewer than
        ``max_trust_per_seed`` times its seed count (None: one per iteration, the paper).
        A class with one seed otherwise gets up to ``max_iter - 1`` trust samples from its
        cluster, which outvote its seed once the cluster drifts to a bigger class.
    round_selection : {"held-out", "held-out-all", "held-out-first", "all"}, default="held-out"
        k-means variants: how many of the ``max_iter`` outer rounds the fit keeps.
        The held-out values first run the outer loop ``ROUND_FOLDS`` times, each time with one
        fold of every class's seeds held out (:func:`held_out_folds`), and score the held-out
        seeds' labels after every round by macro-F1. The round with the highest score
        replaces a default round only when it beats it by more than two standard errors of
        that gain (paired bootstrap, :func:`chosen_rounds`). The default round is the last
        (every round, the paper's loop) for ``"held-out-all"``, the first (the base
        clusterer; FSCK: constrained k-means) for ``"held-out-first"``, and for
        ``"held-out"`` the first from ``ROUND_FIRST_MIN_DOCS`` (2,000) documents on and the
        last below (:func:`default_round`): in small windows the later rounds are FSL's gain,
        on whole corpora they tend to lose (docs/algorithms/fsl.md). ``"all"``: every round,
        the paper, without the ``ROUND_FOLDS`` extra fits.
    prototypes : {"one", "by-size"}, default="one"
        k-means variants, when the fit keeps one outer round (the base clusterer: FSCK is then
        constrained k-means): ``"by-size"`` gives a class several times the mean class size as
        many centroids, as :class:`~streamsemi.algorithms.constrained_kmeans.ConstrainedKMeans`
        does with the same setting (:func:`~streamsemi.algorithms.constrained_kmeans.by_size_pass`;
        a document takes the class of its nearest centroid). No effect when later rounds are
        kept: their learned feature spaces are per class. The daemon builds FSL-CK with
        ``"by-size"`` (:data:`streamsemi.algorithms.DAEMON_PARAMS`), as its constrained k-means.
    warm_start : bool, default=False
        k-means variants: start each outer iteration's k-means from the previous
        centres (False: re-initialise from the labeled set, seeds + trust samples).
    anchor_weight : float > 0, default=1.0
        FSCK (``variant="ck"``): the weight of each labeled document (seed or trust sample)
        in its cluster's centre at every k-means update; every other member weighs 1. Above
        1 the centres stay nearer the labels while the k-means objective pulls them toward
        dense regions that are not the classes (docs/algorithms/fsl.md). No
        effect with ``feature_learning=False`` (constrained k-means stays the baseline).
    n_new_clusters : int, default=0
        Extra clusters for classes nobody seeded (``new-0``...).
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
    kmeans_max_iter : int, default=30
        Assignment/update rounds of each inner k-means run.
    ap_sample : int >= 2, default=1000
        Maximum number of documents on which the AP variants run AP.
    ap_max_iter : int, default=300
        Maximum AP message-passing rounds per FSL iteration.
    ap_damping : float in [0.5, 1), default=0.8
        AP damping factor.
    phi : float, default=0.5
        Adaptive factor of Eq. 11 (unlabeled preference ``P - phi (Q - P)``).
    alpha, beta, gamma : float, default=(1.0, 0.5, 0.5)
        Tri-set similarity factors of Eq. 15 (FSSAP).
    temperature : float, default=0.05
        Softmax temperature for ``predict_proba``.
    random_state : int >= 0 or None, default=0

    Attributes
    ----------
    classes_ : ndarray of str
    new_clusters_ : list of str
    n_features_in_ : int
    columns_ : ndarray of int
        Hashed columns active in the fitting window (the model's coordinate system).
    idf_ : ndarray
        idf of the active columns.
    cluster_centers_ : ndarray (n_classes x n_active)
        Unit-length centres in tf-idf space.
    feature_weights_ : ndarray (n_classes x n_active)
        Learned RIF weights ``w_k`` (Eq. 5); the learned feature space of cluster k
        is the set of features with positive weight.
    feature_scales_ : ndarray (n_classes x n_active)
        ``g_k = 1 + feature_gain * w_k``.
    labels_ : ndarray of int
        Class index of each training row.
    trust_samples_ : list of ndarray
        Row indices of the trust samples chosen at each iteration.
    n_iter_ : int
    rounds_ : int
        k-means variants: the outer rounds the fit was allowed (``max_iter``, or fewer by
        ``round_selection``).
    round_scores_ : ndarray of shape (max_iter,) or None
        k-means variants: held-out macro-F1 after each round (None: not measured).
    round_scores_se_ : ndarray of shape (max_iter,) or None
        Standard error of each round's held-out gain over the default round (see
        ``round_selection``; 0 for the default round itself).
    prototype_centers_ : ndarray of shape (n_prototypes, n_active) or None
        ``prototypes="by-size"`` with one round kept and some class given several centroids:
        the centroids (``cluster_centers_`` are then each class's unit mean); None otherwise.
    prototype_owner_ : ndarray of int, shape (n_prototypes,) or None
        The class of each row of ``prototype_centers_``.
    """

    _parameter_constraints = {
        "variant": [StrOptions(set(VARIANTS))],
        "feature_learning": ["boolean"],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "patience": [Interval(Integral, 1, None, closed="left")],
        "eta": [Interval(Real, 0, None, closed="left")],
        "mu": [Interval(Real, 0, None, closed="left")],
        "feature_gain": [Interval(Real, 0, None, closed="left")],
        **DISCOVERY_CONSTRAINTS,
        "kmeans_max_iter": [Interval(Integral, 1, None, closed="left")],
        "ap_sample": [Interval(Integral, 2, None, closed="left")],
        "ap_max_iter": [Interval(Integral, 1, None, closed="left")],
        "ap_damping": [Interval(Real, 0.5, 1, closed="left")],
        "phi": [Interval(Real, 0, None, closed="left")],
        "alpha": [Interval(Real, 0, None, closed="left")],
        "beta": [Interval(Real, 0, None, closed="left")],
        "gamma": [Interval(Real, 0, None, closed="left")],
        "rif_values": [StrOptions({"tfidf", "counts"})],
        "trust_new_clusters": ["boolean"],
        "warm_start": ["boolean"],
        "anchor_weight": [Interval(Real, 0, None, closed="neither")],
        "trust_check": [StrOptions({"labeled", "seeds", "none"})],
        "round_selection": [StrOptions(set(ROUND_SELECTIONS))],
        "prototypes": [StrOptions({"one", "by-size"})],
        "max_trust_per_seed": [Interval(Real, 0, None, closed="left"), None],
        "temperature": [Interval(Real, 0, None, closed="neither")],
        "random_state": RANDOM_STATE,
    }

    def __init__(self, variant: str = "ck", *, feature_learning: bool = True, max_iter: int = 10,
                 patience: int = 2, eta: float = 1.0, mu: float = 1.0, feature_gain: float = 1.0,
                 n_new_clusters: int | str = 0, discovery: str = "calibrated",
                 discovery_quantile: float = 0.4, discovery_init: Any = None,
                 discovery_split: bool = False, kmeans_max_iter: int = 30, ap_sample: int = 1000,
                 ap_max_iter: int = 300, ap_damping: float = 0.8, phi: float = 0.5,
                 alpha: float = 1.0, beta: float = 0.5, gamma: float = 0.5,
                 rif_values: str = "tfidf", trust_new_clusters: bool = True,
                 warm_start: bool = False, anchor_weight: float = 1.0, trust_check: str = "none",
                 max_trust_per_seed: float | None = None, round_selection: str = "held-out",
                 prototypes: str = "one", temperature: float = 0.05, random_state: int | None = 0) -> None:
        self.variant = variant
        self.feature_learning = feature_learning
        self.max_iter = max_iter
        self.patience = patience
        self.eta = eta
        self.mu = mu
        self.feature_gain = feature_gain
        self.n_new_clusters = n_new_clusters
        self.discovery = discovery
        self.discovery_quantile = discovery_quantile
        self.discovery_init = discovery_init
        self.discovery_split = discovery_split
        self.kmeans_max_iter = kmeans_max_iter
        self.ap_sample = ap_sample
        self.ap_max_iter = ap_max_iter
        self.ap_damping = ap_damping
        self.phi = phi
        self.alpha = alpha
        self.beta = beta
        self.gamma = gamma
        self.rif_values = rif_values
        self.trust_new_clusters = trust_new_clusters
        self.warm_start = warm_start
        self.anchor_weight = anchor_weight
        self.trust_check = trust_check
        self.max_trust_per_seed = max_trust_per_seed
        self.round_selection = round_selection
        self.prototypes = prototypes
        self.temperature = temperature
        self.random_state = random_state

    # -- fit --------------------------------------------------------------------------------------

    def fit(self, X: Any, y: Any) -> FSL:
        """Fit on counts ``X`` with seed labels ``y`` (None/-1/"" = unlabeled)."""
        _CENTRE_TERMS.drop(self)
        if uses_calibrated(self):
            return fit_calibrated(self, X, y)
        X, codes, classes = self._fit_inputs(X, y)
        n_known = classes.size
        n_new = int(self.n_new_clusters)
        rng = np.random.default_rng(self.random_state)
        self.columns_ = np.unique(X.indices)
        Xc = sp.csr_matrix(X[:, self.columns_])
        Xc.sort_indices()
        self.idf_ = idf_weights(Xc)
        Xn = tfidf(Xc, self.idf_)
        Xv = Xc if self.rif_values == "counts" else Xn  # the n and m of Eq. 2 and Eq. 5
        if self.variant in ("sk", "ck"):
            labels, C, W = self._fit_kmeans(Xv, Xn, codes, n_known, n_new, rng)
            n_clusters = n_known + n_new
        else:
            labels, C, W, n_clusters = self._fit_ap(Xc, Xv, Xn, codes, n_known, n_new, rng)
        self.cluster_centers_ = C
        self.feature_weights_ = W
        self.feature_scales_ = 1.0 + float(self.feature_gain) * W
        self.labels_ = labels
        self.new_clusters_ = new_cluster_names(n_clusters - n_known)
        self.classes_ = np.array(list(classes) + self.new_clusters_, dtype=object)
        return self

    def _learn_step(self, Xc: sp.csr_matrix, trust: np.ndarray, labels: np.ndarray, W: np.ndarray,
                    t: int, T: int, sfc: list[np.ndarray] | None = None) -> np.ndarray:
        """Steps 4-5 for the trust samples of one iteration: RIFs (Eq. 2) and weights (Eq. 5)."""
        M = _class_sums(Xc, labels, W.shape[0])  # m_k: cluster frequencies
        W = W.copy()
        for k, row in enumerate(trust):
            if row < 0:
                continue
            lo, hi = Xc.indptr[row], Xc.indptr[row + 1]
            feats, counts = Xc.indices[lo:hi], Xc.data[lo:hi]
            rif = rich_information_features(feats, counts, M[k], self.eta, self.mu)
            W[k] = update_rif_weights(W[k], rif, counts[np.isin(feats, rif)], t, T)
            if sfc is not None:
                sfc[k] = np.union1d(sfc[k], significant_cluster_features(rif, M[k], sfc[k]))
        return W

    def _fit_kmeans(self, Xv: sp.csr_matrix, Xn: sp.csr_matrix, codes: np.ndarray, n_known: int,
                    n_new: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        Xn_sq = Xn.multiply(Xn).tocsr()
        rounds = self._max_rounds()
        self.round_scores_ = self.round_scores_se_ = None
        if self.round_selection != "all" and rounds > 1:
            default = default_round(self.round_selection, codes.size)
            held_out = self._held_out_round_scores(Xv, Xn, Xn_sq, codes, n_known, n_new, default)
            if held_out is not None:
                self.round_scores_, self.round_scores_se_ = held_out
                rounds = chosen_rounds(*held_out, default=default)
        labels, C, W, trust, t, _ = self._kmeans_rounds(Xv, Xn, Xn_sq, codes, n_known, n_new, rng, rounds)
        self.trust_samples_ = trust
        self.n_iter_ = t
        self.rounds_ = rounds
        self.prototype_centers_ = self.prototype_owner_ = None
        if self.prototypes == "by-size" and rounds == 1:   # the base clusterer alone: no learned spaces
            found, owner = by_size_pass(Xn, codes, n_known, (C, labels, 0, 0.0), self.variant == "ck",
                                        int(self.kmeans_max_iter))
            if owner is not None:
                self.prototype_centers_, self.prototype_owner_ = found[0], owner
                labels = owner[found[1]]
                C = class_means(Xn, labels, n_known + n_new, found[0], owner)
        return labels, C, W

    def _max_rounds(self) -> int:
        """``T`` of the outer loop: ``max_iter`` rounds, one without feature learning."""
        return int(self.max_iter) if self.feature_learning else 1

    def _held_out_round_scores(self, Xv: sp.csr_matrix, Xn: sp.csr_matrix, Xn_sq: sp.csr_matrix,
                               codes: np.ndarray, n_known: int, n_new: int, default: int = -1,
                               ) -> tuple[np.ndarray, np.ndarray] | None:
        """Macro-F1 (:func:`macro_f1_by_round`) after each outer round of the held-out seeds of
        all ``ROUND_FOLDS`` folds (:func:`held_out_folds`), each fold's seeds predicted by a fit
        on the other seeds, and the standard error of each round's gain over the ``default``
        round (:func:`gain_se`); None when no seed can be held out."""
        seeds = np.flatnonzero(codes >= 0)
        rng = np.random.default_rng(self.random_state)
        folds = held_out_folds(codes, ROUND_FOLDS, rng, row_keys(Xn, seeds))
        if not (folds >= 0).any():
            return None
        T = self._max_rounds()
        held, predicted = [], []
        for f in range(ROUND_FOLDS):
            out = np.flatnonzero(folds == f)
            if out.size == 0:
                continue
            train = codes.copy()
            train[out] = -1
            *_, history = self._kmeans_rounds(Xv, Xn, Xn_sq, train, n_known, n_new,
                                              np.random.default_rng(self.random_state), T, watch=out)
            held.append(out)
            predicted.append(history)
        history, truth = np.hstack(predicted), codes[np.concatenate(held)]
        return macro_f1_by_round(history, truth), gain_se(history, truth, ROUND_BOOTSTRAP, rng, default)

    def _kmeans_rounds(self, Xv: sp.csr_matrix, Xn: sp.csr_matrix, Xn_sq: sp.csr_matrix, codes: np.ndarray,
                       n_known: int, n_new: int, rng: np.random.Generator, rounds: int,
                       watch: np.ndarray | None = None,
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[np.ndarray], int, np.ndarray]:
        """The outer loop for at most ``rounds`` rounds (the confidence schedule of Eq. 3 keeps
        ``T = max_iter``). Returns labels, centres, weights, trust samples per round, rounds
        run and the labels of the ``watch`` rows after each of the ``rounds`` rounds (a
        stopped loop repeats its last labels)."""
        n, m = Xn.shape
        K = n_known + n_new
        W = np.zeros((K, m))
        lab = codes.copy()  # labeled set: seeds + trust samples (-1 = unlabeled)
        C_prev: np.ndarray | None = None
        labels = np.full(n, -1)
        T = self._max_rounds()
        anchor = float(self.anchor_weight) if self.feature_learning else 1.0  # without FSL: constrained k-means
        watch = np.zeros(0, dtype=np.int64) if watch is None else watch
        history = np.zeros((rounds, watch.size), dtype=np.int64)
        stable = 0
        trust_samples: list[np.ndarray] = []
        t = 0
        for t in range(1, rounds + 1):  # noqa: B007
            G = 1.0 + float(self.feature_gain) * W
            if C_prev is None:
                # step 1 / step 6: centres from the labeled set (same-class pairs merged)
                C = _normalize_rows(_class_sums(Xn, lab, K))
                if n_new:
                    C[n_known:] = farthest_point_centroids(
                        Xn, C[:n_known], np.flatnonzero(codes < 0), n_new, rng)[n_known:]
            elif self.warm_start:
                C = C_prev
            else:
                n_lab = np.bincount(lab[lab >= 0], minlength=K)
                C = _normalize_rows(_class_sums(Xn, lab, K))
                C[n_lab == 0] = C_prev[n_lab == 0]
            fixed = np.flatnonzero(lab >= 0) if self.variant == "ck" else np.zeros(0, dtype=np.int64)
            new_labels, C, sim = _spherical_kmeans(Xn, Xn_sq, C, G, fixed, lab[fixed],
                                                   int(self.kmeans_max_iter), anchor)
            stable = stable + 1 if np.array_equal(new_labels, labels) else 0
            labels = new_labels
            history[t - 1:] = labels[watch]
            C_prev = C
            if stable >= int(self.patience) or t == rounds:
                break
            # Eq. 7: the unlabeled member closest to its centre, in the learned space
            eligible = lab < 0
            if self.trust_check != "none":
                eligible &= seed_agreement(Xn, lab if self.trust_check == "labeled" else codes,
                                           labels, n_known)
            trust = select_trust_samples(sim[np.arange(n), labels], labels, eligible, K)
            if not self.trust_new_clusters:
                trust[n_known:] = -1
            if self.max_trust_per_seed is not None:
                trust[:n_known][trust_quota_reached(lab, codes, n_known, float(self.max_trust_per_seed))] = -1
            trust_samples.append(trust[trust >= 0])
            W = self._learn_step(Xv, trust, labels, W, t, T)
            lab[trust[trust >= 0]] = np.flatnonzero(trust >= 0)
        return labels, C, W, trust_samples, t, history

    # -- affinity propagation variants ------------------------------------------------------------

    def _ap_sample_rows(self, codes: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Labeled rows (all, or class-stratified) and unlabeled rows of the AP sample."""
        bound = int(self.ap_sample)
        labeled = np.flatnonzero(codes >= 0)
        unl = np.flatnonzero(codes < 0)
        if self.variant == "ap" and labeled.size > bound // 2:
            # class-stratified subset keeping at least one document per class
            order = rng.permutation(labeled)
            keep = np.zeros(order.size, dtype=bool)
            _, first = np.unique(codes[order], return_index=True)
            keep[first] = True
            extra = max(bound // 2 - int(keep.sum()), 0)
            keep[np.flatnonzero(~keep)[:extra]] = True
            labeled = np.sort(order[keep])
        n_lab_slots = labeled.size if self.variant == "ap" else np.unique(codes[labeled]).size
        n_unl = min(unl.size, max(bound - n_lab_slots, 2))
        if n_unl < unl.size:
            unl = np.sort(rng.choice(unl, size=n_unl, replace=False))
        return labeled, unl

    def _fit_ap(self, Xc: sp.csr_matrix, Xv: sp.csr_matrix, Xn: sp.csr_matrix, codes: np.ndarray, n_known: int,
                n_new: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        n, m = Xn.shape
        K_max = n_known + n_new
        W = np.zeros((K_max, m))
        lab = codes.copy()  # labeled set: seeds + trust samples
        lab_rows, unl_rows = self._ap_sample_rows(codes, rng)
        sfc: list[np.ndarray] = [np.zeros(0, dtype=np.int64) for _ in range(K_max)]
        T = self._max_rounds()
        prev: np.ndarray | None = None  # window-length labels of the sample, previous iteration
        stable = 0
        self.trust_samples_ = []
        t = 0
        K_used = n_known
        sample_labels = np.full(n, -1)
        for t in range(1, T + 1):  # noqa: B007
            G = 1.0 + float(self.feature_gain) * W
            rows_unl = unl_rows[lab[unl_rows] < 0]
            if self.variant == "ap":
                trust_rows = unl_rows[lab[unl_rows] >= 0]
                lab_now = np.concatenate([lab_rows, trust_rows])
                point_rows = np.concatenate([lab_now, rows_unl])
                point_class = np.concatenate([lab[lab_now], np.full(rows_unl.size, -1)])
            else:
                seed_classes = np.unique(lab[lab >= 0])
                point_rows = np.concatenate([np.full(seed_classes.size, -1), rows_unl])
                point_class = np.concatenate([seed_classes, np.full(rows_unl.size, -1)])
            is_lab = point_class >= 0
            # candidate exemplar j is compared in the space of its class at the last iteration
            space = point_class.copy()
            if prev is not None:
                space[~is_lab] = prev[point_rows[~is_lab]]
            if self.variant == "ap":
                S = self._cosine_sample(Xn, point_rows, space, G)
            else:
                Z = _class_sums(Xc, lab, K_max)[seed_classes]  # compact seeds (summed counts)
                S = self._triset_sample(Xc, Z, seed_classes, rows_unl, space, G, sfc)
            # Eq. 11 preferences; step 6: labeled pairs get the max (same class) / min similarity
            unl_idx = np.flatnonzero(~is_lab)
            sub = S[np.ix_(unl_idx, unl_idx)]
            pref, P, Q = ap_preferences(sub[~np.eye(unl_idx.size, dtype=bool)], is_lab, float(self.phi))
            li = np.flatnonzero(is_lab)
            S[np.ix_(li, li)] = np.where(point_class[li][:, None] == point_class[li][None, :], Q, P)
            np.fill_diagonal(S, pref)
            # deterministic tie-breaking noise, as scikit-learn does
            S = S + (1e-12 * S.std() + 1e-14) * rng.standard_normal(S.shape)
            exemplars, ex_lab, _ = affinity_propagation(S, float(self.ap_damping), int(self.ap_max_iter))
            point_label, K_used = self._map_exemplars(S, exemplars, ex_lab, point_class, n_known, n_new)
            sample_labels = np.full(n, -1)
            sample_labels[rows_unl] = point_label[unl_idx]
            sample_labels[lab >= 0] = lab[lab >= 0]
            stable = stable + 1 if prev is not None and np.array_equal(sample_labels, prev) else 0
            prev = sample_labels
            if stable >= int(self.patience) or t == T or unl_idx.size == 0:
                break
            # Eq. 10: best s(i, e) + s(e, e) among the unlabeled members of each class
            score = S[np.arange(S.shape[0]), exemplars[ex_lab]] + pref[exemplars[ex_lab]]
            local = select_trust_samples(score[unl_idx], point_label[unl_idx],
                                         np.ones(unl_idx.size, dtype=bool), K_max)
            trust = np.where(local >= 0, rows_unl[np.maximum(local, 0)], -1)
            if not self.trust_new_clusters:
                trust[n_known:] = -1
            self.trust_samples_.append(trust[trust >= 0])
            W = self._learn_step(Xv, trust, sample_labels, W, t, T,
                                 sfc if self.variant == "sap" else None)
            lab[trust[trust >= 0]] = np.flatnonzero(trust >= 0)
        self.n_iter_ = t
        # centres from the sample members and all labeled documents; every other row of the
        # window goes to the nearest centre in the learned space
        W = W[:K_used]
        C = _normalize_rows(_class_sums(Xn, sample_labels, K_used))
        sim = weighted_cosine(Xn, Xn.multiply(Xn).tocsr(), C, 1.0 + float(self.feature_gain) * W)
        labels = sim.argmax(axis=1)
        labels[sample_labels >= 0] = sample_labels[sample_labels >= 0]
        return labels, C, W, K_used

    def _map_exemplars(self, S: np.ndarray, exemplars: np.ndarray, ex_lab: np.ndarray,
                       point_class: np.ndarray, n_known: int, n_new: int) -> tuple[np.ndarray, int]:
        """Class of every sample point from its exemplar (seeded, new-i, or merged)."""
        ex_class = point_class[exemplars].copy()
        lab_ex = np.flatnonzero(ex_class >= 0)
        unl_ex = np.flatnonzero(ex_class < 0)
        sizes = np.bincount(ex_lab, minlength=exemplars.size)
        # discovered clusters already held by labeled points (trust samples) keep their index
        next_new = max(n_known, int(point_class.max()) + 1)
        free = n_known + n_new - next_new
        if unl_ex.size and free > 0:
            order = unl_ex[np.argsort(-sizes[unl_ex], kind="stable")]
            order = order[sizes[order] >= 2][:free]
            ex_class[order] = next_new + np.arange(order.size)
            next_new += order.size
        K_used = next_new
        rest = np.flatnonzero(ex_class < 0)
        if rest.size:
            nearest = np.argmax(S[np.ix_(exemplars[rest], exemplars[lab_ex])], axis=1)
            ex_class[rest] = ex_class[lab_ex][nearest]
        return ex_class[ex_lab], K_used

    def _cosine_sample(self, Xn: sp.csr_matrix, rows: np.ndarray, space: np.ndarray,
                       G: np.ndarray) -> np.ndarray:
        """FSAP similarity: cosine, column ``j`` in the feature space of class ``space[j]``."""
        Xs = Xn[rows]
        S = np.empty((rows.size, rows.size))
        for k in np.unique(space):
            cols = np.flatnonzero(space == k)
            Xk = _scale_rows_l2(Xs, None if k < 0 else G[k])
            S[:, cols] = np.asarray((Xk @ Xk[cols].T).todense())
        return S

    def _triset_sample(self, Xc: sp.csr_matrix, Z: np.ndarray, seed_classes: np.ndarray,
                       rows_unl: np.ndarray, space: np.ndarray, G: np.ndarray,
                       sfc: list[np.ndarray]) -> np.ndarray:
        """FSSAP similarity: tri-set (Eq. 15) over compact seeds + unlabeled sample rows."""
        counts = sp.vstack([sp.csr_matrix(Z), Xc[rows_unl]]).tocsr()
        values = tfidf(counts, self.idf_, norm=False)
        B = counts.copy()
        B.data[:] = 1.0
        SF = bursty_features(counts, float(self.eta)).tolil()
        for i, k in enumerate(seed_classes):  # Eq. 16: compact seeds carry SFC_k
            if sfc[k].size:
                SF[i, sfc[k]] = 1.0
        SF = SF.tocsr()
        S = np.empty((counts.shape[0], counts.shape[0]))
        for k in np.unique(space):
            cols = np.flatnonzero(space == k)
            U = _scale_rows_l1(values, None if k < 0 else G[k])
            S[:, cols] = triset_similarity(U, B, U[cols], B[cols], SF[cols],
                                           float(self.alpha), float(self.beta), float(self.gamma))
        return S

    # -- inference --------------------------------------------------------------------------------

    def _scores(self, X: Any) -> np.ndarray:
        X = self._validate_counts(X, reset=False)
        Xn = tfidf(sp.csr_matrix(X[:, self.columns_]), self.idf_)
        P = getattr(self, "prototype_centers_", None)   # absent in models saved before prototypes
        if P is not None:   # one round kept: plain cosine, a class scores its nearest centroid
            return class_scores(sparse_dot_t(Xn, P), self.prototype_owner_, self.cluster_centers_.shape[0])
        C, G = self.cluster_centers_, self.feature_scales_
        terms = _CENTRE_TERMS.get(self, (C, G), lambda: centre_terms(C, G))
        return weighted_cosine(Xn, Xn.multiply(Xn).tocsr(), C, G, terms=terms)

    def _softmax_temperature(self) -> float:
        return float(self.temperature)

    def transform(self, X: Any) -> np.ndarray:
        """Similarity of each row to each class centre in the class's learned space
        (``predict_proba`` is their softmax at ``temperature``)."""
        return self._scores(X)

    def learned_feature_space(self) -> list[np.ndarray]:
        """Hashed column indices of each cluster's learned features (weight > 0), by weight."""
        check_is_fitted(self)
        out = []
        for w in self.feature_weights_:
            pos = np.flatnonzero(w > 0)
            out.append(self.columns_[pos[np.argsort(-w[pos], kind="stable")]])
        return out

    def _fit_summary(self) -> dict[str, Any]:
        """k-means variants: the outer rounds run (``rounds``, of ``max_rounds``), how they were
        chosen and, with a held-out ``round_selection``, the held-out macro-F1 after each round.
        A model restored from a checkpoint without ``rounds_`` (an older format) ran every round."""
        if self.variant not in ("sk", "ck"):
            return {}
        T = self._max_rounds()
        if not hasattr(self, "rounds_"):  # an older checkpoint without rounds_: the paper's loop
            return {"rounds": T, "max_rounds": T, "round_selection": "all", "round_scores": None}
        scores = self.round_scores_
        out = {"rounds": int(self.rounds_), "max_rounds": T, "round_selection": str(self.round_selection),
               "round_scores": None if scores is None else [round(float(v), 4) for v in scores]}
        owner = getattr(self, "prototype_owner_", None)
        if owner is not None:   # the classes given several centroids (prototypes="by-size", one round)
            out["prototypes"] = several_centroids(owner, self.classes_)
        return out

    def _explain_weights(self) -> sp.csr_matrix:
        """Each cluster's learned feature space: RIF weights first, then the centre."""
        W = self.feature_weights_
        wmax = W.max(axis=1, keepdims=True)
        cmax = self.cluster_centers_.max(axis=1, keepdims=True)
        scores = np.where(W > 0, 1.0 + W / np.where(wmax > 0, wmax, 1.0), 0.0) \
            + self.cluster_centers_ / np.where(cmax > 0, cmax, 1.0)
        full = sp.csr_matrix((self.classes_.size, self.n_features_in_))
        full = sp.lil_matrix(full)
        full[:, self.columns_] = scores
        return full.tocsr()


def _spherical_kmeans(Xn: sp.csr_matrix, Xn_sq: sp.csr_matrix, C: np.ndarray, G: np.ndarray,
                      fixed: np.ndarray, fixed_labels: np.ndarray, max_iter: int,
                      fixed_weight: float = 1.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Spherical k-means in the per-cluster weighted spaces; ``fixed`` rows keep their label
    and weigh ``fixed_weight`` in their centre's sum (the other rows 1)."""
    K = C.shape[0]
    labels = np.full(Xn.shape[0], -1)
    weights = None
    if fixed_weight != 1.0 and fixed.size:
        weights = np.ones(Xn.shape[0])
        weights[fixed] = fixed_weight
    norms = weighted_doc_norms(Xn_sq, G)  # G is constant during one clustering
    sim = weighted_cosine(Xn, Xn_sq, C, G, norms)
    for _ in range(max_iter):
        new = sim.argmax(axis=1)
        new[fixed] = fixed_labels
        if np.array_equal(new, labels):
            break
        labels = new
        sums = _class_sums(Xn, labels, K, weights)
        empty = np.bincount(labels, minlength=K) == 0
        sums[empty] = C[empty]  # an emptied cluster keeps its previous centre
        C = _normalize_rows(sums)
        sim = weighted_cosine(Xn, Xn_sq, C, G, norms)
    return labels, C, sim


def _scale_rows_l2(X: sp.csr_matrix, g: np.ndarray | None) -> sp.csr_matrix:
    Y = sp.csr_matrix(X, copy=True)
    if g is not None:
        Y.data *= g[Y.indices]
    return l2_normalize_rows(Y)


def _scale_rows_l1(X: sp.csr_matrix, g: np.ndarray | None) -> sp.csr_matrix:
    Y = sp.csr_matrix(X, copy=True)
    if g is not None:
        Y.data *= g[Y.indices]
    return l1_normalize_rows(Y)


__all__ = ["FSL", "VARIANTS", "confidence", "cumulative_confidence", "update_rif_weights",
           "rich_information_features", "significant_cluster_features", "weighted_cosine", "centre_terms",
           "weighted_doc_norms",
           "select_trust_samples", "trust_quota_reached", "ap_preferences", "affinity_propagation", "triset_similarity",
           "bursty_features"]
