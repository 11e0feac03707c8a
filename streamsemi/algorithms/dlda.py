"""D-LDA, double-latent-layered LDA for semi-defined classification (Zhuang et al., ICDM 2010).

Seeds cover only some classes; the documents of classes nobody seeded come out
as new clusters (``new-N``) instead of being forced into a known class. Every
token i of document d has a document class z_i (K = known classes +
``n_new_clusters``) and a word topic y_i (L topics)::

    theta_d ~ Dir(alpha)  (classes per document)   z_i ~ theta_d
    pi_k    ~ Dir(delta)  (topics per class)       y_i ~ pi_{z_i}
    phi_l   ~ Dir(beta)   (words per topic)        w_i ~ phi_{y_i}

The posterior is explored by collapsed Gibbs sampling with the two-step update of
the paper (Eq. 4: z given y, Eq. 5: y given z; exact conditionals derived in
``docs/algorithms/d-lda.md``), compiled with numba (``_dlda_gibbs``; the y step
uses the exact SparseLDA-style bucket decomposition, ~1.6x faster than the dense
reference kernel that samples the same conditionals). Tokens of
seeded documents keep z fixed to their class (Algorithm 1, step 3a). A document's
class is ``argmax_k O_dk`` (Eq. 6), here on O_dk averaged over the last
``n_average`` sweeps.

Streaming: ``fit(X, y, doc_ids, warm_start_from=previous)`` reuses the previous
token states of unchanged documents, initialises only new documents by fold-in
with the previous pi/phi, runs ``warm_sweeps`` sweeps, and keeps new-cluster names
stable (Hungarian matching of consecutive fits' clusters by document overlap).
New documents between refits are labelled by fold-in sampling with pi and phi
fixed. All fitted state is plain numpy arrays (checkpointable with ``np.savez``).
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Integral, Real
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linear_sum_assignment
from sklearn.base import ClassifierMixin
from sklearn.utils._param_validation import Interval, RealNotInt, StrOptions
from sklearn.utils.validation import check_is_fitted

from streamsemi.algorithms import _dlda_gibbs as gibbs
from streamsemi.algorithms._discovery import (
    DISCOVERY_CONSTRAINTS,
    DiscoveryMixin,
    fit_calibrated,
    predict_proba_calibrated,
    uses_calibrated,
)
from streamsemi.algorithms.base import (
    NEW_CLUSTER_PREFIX,
    RANDOM_STATE,
    DegenerateInputError,
    DerivedArrays,
    StreamsemiEstimator,
    check_n_clusters,
    encode_single_labels,
)

_MAX_TOPICS = 32767  # z and y are stored as int16

# phi_.T in C order per fitted model, for the fold-in kernel: outside the estimator's __dict__
# so that predict does not change the estimator (nor add an L x V array to its checkpoints)
_PHI_T: DerivedArrays[np.ndarray] = DerivedArrays()
_CLASS_WORD_T: DerivedArrays[np.ndarray] = DerivedArrays()


# --------------------------------------------------------------------------- math helpers


def estimate_pi(nkl: np.ndarray, delta: float) -> np.ndarray:
    """pi_kl = (O_kl + delta) / sum_l (O_kl + delta)  (Section III-A, parameter estimates)."""
    P = nkl.astype(np.float64) + delta
    return P / P.sum(axis=1, keepdims=True)


def estimate_phi(nvl: np.ndarray, beta: float) -> np.ndarray:
    """phi_lv = (O_lv + beta) / sum_v (O_lv + beta), returned as (L x V)."""
    P = nvl.T.astype(np.float64) + beta
    return P / P.sum(axis=1, keepdims=True)


def class_proba(counts: np.ndarray, alpha: float | np.ndarray) -> np.ndarray:
    """theta_dk = (O_dk + alpha_k) / sum_k (O_dk + alpha_k)  (Eq. 22), row-wise."""
    P = np.asarray(counts, dtype=np.float64) + alpha
    return P / P.sum(axis=1, keepdims=True)


def prune_vocabulary(X: sp.csr_matrix, min_df: int | float) -> np.ndarray:
    """Hashed columns kept as words: document frequency >= ``min_df``.

    An int is an absolute count (the paper used 15 on 20 Newsgroups, ~19,000
    documents), capped at ``max(2, N // 1000)`` so that a smaller window keeps its
    words (from N = 15,000 documents on, 15 applies in full); a float in (0, 1) is a
    fraction of the documents (rounded up). A cap of ``N // 100`` is too low:
    on 1,200-document development draws it pruned the words of single-seed classes
    (a 6-token seed document), see docs/algorithms/d-lda.md.
    """
    n = X.shape[0]
    if isinstance(min_df, float) and 0.0 < min_df < 1.0:
        threshold = int(np.ceil(min_df * n))
    else:
        threshold = min(int(min_df), max(2, n // 1000))
    df = np.bincount(X.indices, minlength=X.shape[1])
    return np.flatnonzero(df >= max(threshold, 1)).astype(np.int64)


def capped_counts(X: sp.csr_matrix, max_doc_tokens: int) -> np.ndarray:
    """Integer token counts of the CSR entries of ``X`` after the length cap.

    Counts are rounded to the nearest integer (at least 1 for a positive entry).
    A document longer than ``max_doc_tokens`` tokens has every count scaled by
    ``max_doc_tokens / length`` and floored, keeping at least one token per
    distinct word (so its length is at most ``max_doc_tokens`` + its number of
    distinct words, and its word proportions are preserved up to rounding).
    """
    c = np.maximum(np.rint(X.data), 1.0)
    if not max_doc_tokens or max_doc_tokens <= 0:
        return c.astype(np.int64)
    row = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))
    lengths = np.bincount(row, weights=c, minlength=X.shape[0])
    scale = np.where(lengths > max_doc_tokens, max_doc_tokens / np.maximum(lengths, 1.0), 1.0)
    return np.maximum(np.floor(c * scale[row] + 1e-9), 1.0).astype(np.int64)


def tokens_from_counts(X: sp.csr_matrix, lookup: np.ndarray, max_doc_tokens: int
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Expand a CSR count matrix into the token arrays of the sampler.

    Parameters
    ----------
    X : csr_matrix with sorted indices
    lookup : ndarray of int, shape (n_features,)
        Compact word index of each hashed column, -1 for a pruned column.
    max_doc_tokens : int
        Length cap (see :func:`capped_counts`).

    Returns
    -------
    ptr : ndarray of int64, shape (N + 1,)
        Tokens of document d are ``ptr[d]:ptr[d + 1]``.
    w : ndarray of int32
        Compact word index per token (ascending inside a document).
    col : ndarray of int32
        Hashed column per token.
    """
    indptr, words, cols, counts = word_counts(X, lookup, max_doc_tokens)
    w = np.repeat(words.astype(np.int32), counts)
    col = np.repeat(cols.astype(np.int32), counts)
    row = np.repeat(np.arange(X.shape[0]), np.diff(indptr))
    lengths = np.bincount(row, weights=counts, minlength=X.shape[0]).astype(np.int64)
    ptr = np.zeros(X.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths, out=ptr[1:])
    return ptr, w, col


def word_counts(X: sp.csr_matrix, lookup: np.ndarray, max_doc_tokens: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The kept words of each row of ``X`` with their capped counts (what :func:`tokens_from_counts` expands).

    Returns ``(indptr, words, cols, counts)``: the entries of row ``d`` are
    ``indptr[d]:indptr[d + 1]``, with their compact word index (``lookup``), hashed
    column and integer count after the length cap (:func:`capped_counts`).
    """
    words = lookup[X.indices]
    keep = words >= 0
    Xk = sp.csr_matrix((X.data[keep], X.indices[keep], _kept_indptr(X.indptr, keep)), shape=X.shape)
    return Xk.indptr, words[keep], Xk.indices, capped_counts(Xk, max_doc_tokens)


def _kept_indptr(indptr: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """CSR indptr after dropping the entries where ``keep`` is False."""
    c = np.concatenate([[0], np.cumsum(keep)])
    return c[indptr]


def match_clusters(overlap: np.ndarray, new_sizes: np.ndarray, old_sizes: np.ndarray,
                   threshold: float) -> np.ndarray:
    """Match new clusters (rows) to old clusters (columns) by document overlap.

    Hungarian assignment maximising the total overlap; a matched pair is kept when
    its overlap coefficient ``overlap / min(new size, old size)`` (sizes counted on
    the documents common to both fits) is at least ``threshold``.

    Returns
    -------
    ndarray of int, shape (n_new,)
        Matched old column per new row, -1 if unmatched.
    """
    out = np.full(overlap.shape[0], -1, dtype=np.int64)
    if overlap.size == 0:
        return out
    rows, cols = linear_sum_assignment(overlap, maximize=True)
    for r, c in zip(rows, cols, strict=True):
        denom = min(new_sizes[r], old_sizes[c])
        if overlap[r, c] > 0 and denom > 0 and overlap[r, c] / denom >= threshold:
            out[r] = c
    return out


def doc_tokens(ptr: np.ndarray, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Token layout of the documents ``docs``: their own ``ptr`` and the positions of their
    tokens in the full token arrays."""
    lengths = np.diff(ptr)[docs]
    sub_ptr = np.zeros(docs.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=sub_ptr[1:])
    return sub_ptr, np.repeat(ptr[docs] - sub_ptr[:-1], lengths) + np.arange(sub_ptr[-1])


def pin_seeded_tokens(z: np.ndarray, ptr: np.ndarray, fixed: np.ndarray) -> None:
    """Set the class state of every seeded document's tokens to its class (in place)."""
    seeded_tok = np.repeat(fixed >= 0, np.diff(ptr))
    z[seeded_tok] = np.repeat(fixed, np.diff(ptr))[seeded_tok]


def seed_votes(ptr: np.ndarray, w: np.ndarray, codes: np.ndarray, pi: np.ndarray,
               phi: np.ndarray, n_known: int) -> np.ndarray:
    """Which document class each seed's words are most likely under.

    ``votes[c, k]`` counts the seeds of known class ``c`` whose kept words have the
    highest log-likelihood under class ``k``'s word distribution ``pi_k @ phi``
    (the Eq. 6 mixture with theta concentrated on one class), the seeds' own class
    constraint ignored.
    """
    K = pi.shape[0]
    seeded = np.flatnonzero(codes >= 0)
    votes = np.zeros((n_known, K))
    sub_ptr, idx = doc_tokens(ptr, seeded)
    lengths = np.diff(sub_ptr)
    if seeded.size == 0 or idx.size == 0:
        return votes
    rows = np.repeat(np.arange(seeded.size), lengths)
    C = sp.csr_matrix((np.ones(idx.size), (rows, w[idx])), shape=(seeded.size, phi.shape[1]))
    loglik = np.asarray(C @ np.log(np.maximum(pi @ phi, 1e-300)).T)
    has = lengths > 0
    np.add.at(votes, (codes[seeded][has], loglik[has].argmax(axis=1)), 1.0)
    return votes


def align_seeded_classes(votes: np.ndarray) -> np.ndarray | None:
    """Order of the document classes that gives every known class the class its seeds vote for.

    A collapsed Gibbs chain with new clusters can settle with a known class's slot
    holding another group (its seeds are fixed there, but its pi mixes their topics with
    the other group's) while a new-cluster slot holds the known class's unlabeled
    documents: on a 20NG easy1 draw (800 documents, 10% seeds) comp.graphics' slot took
    176 talk.politics.guns documents and ``new-1`` 174 comp.graphics ones. A Hungarian
    assignment of known classes to slots by the seeds' votes (ties go to the slot the
    class has) finds this.

    Parameters
    ----------
    votes : ndarray of shape (n_known, K)
        :func:`seed_votes`.

    Returns
    -------
    ndarray of int of shape (K,) or None
        ``order[new slot] = old slot``: known classes first (in their order), then the
        slots no known class took, in their old order; None when every known class keeps
        its slot.
    """
    n_known, K = votes.shape
    gain = votes + 0.5 * np.eye(n_known, K)  # identity on ties
    _, cols = linear_sum_assignment(gain, maximize=True)
    if np.array_equal(cols, np.arange(n_known)):
        return None
    taken = set(cols.tolist())
    return np.asarray(cols.tolist() + [k for k in range(K) if k not in taken], dtype=np.int64)


# --------------------------------------------------------------------------- estimator


class DLDA(DiscoveryMixin, ClassifierMixin, StreamsemiEstimator):
    """Double-latent-layered LDA: classify seeded classes, discover new ones.

    Parameters
    ----------
    n_new_clusters : int, default=2
        Document classes for unseeded classes (reported as ``new-N``).
    discovery : {"legacy", "calibrated"}, default="legacy"
        How a given number of new clusters is found (no effect with ``n_new_clusters=0``;
        ``n_new_clusters="auto"`` always uses the calibrated path): ``"legacy"``: the
        paper's method, the new document classes inside the joint topic model, as
        described above; ``"calibrated"`` fits the seeded classes as with
        ``n_new_clusters=0`` and clusters only the documents no seeded class explains
        (:mod:`streamsemi.algorithms._discovery`). ``"legacy"`` is D-LDA's default (the
        other algorithms default to ``"calibrated"``): on the d-lda protocol's
        development tasks (20ng-easy2..4, difficult2..4, 800 documents, 10% and 40%
        seeds) it is above the calibrated path on all 12 cells (NMI +0.10 to +0.46,
        docs/algorithms/d-lda.md), and on the discovery protocol the two are close.
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
    n_topics : int, default=128
        Word topics L (paper: 128).
    alpha, delta, beta : float, default=0.2, 0.4, 0.01
        Symmetric Dirichlet priors on classes per document, topics per class and
        words per topic (paper values). Small delta suits very different
        classes, large delta similar ones (paper Section III-C).
    n_sweeps : int, default=200
        Gibbs sweeps of a cold fit (paper: 2000).
    warm_sweeps : int, default=30
        Sweeps of a warm-started refit.
    n_average : int, default=10
        Last sweeps whose O_dk are averaged for the Eq. 6 assignment.
    fold_in_sweeps : int, default=10
        Fold-in passes per new document (``predict``): at most this many CVB0 passes
        (``fold_in="cvb0"``), or this many Gibbs sweeps with the last half averaged
        (``fold_in="gibbs"``). The fit's own fold-in of its training documents is always
        Gibbs.
    fold_in : {"cvb0", "gibbs"}, default="cvb0"
        How ``predict`` folds a new document in with pi and phi fixed: ``"cvb0"`` iterates
        the expected class counts to a fixed point (deterministic,
        :func:`~._dlda_gibbs.fold_in_cvb0`), ``"gibbs"`` samples each token's class
        (:func:`~._dlda_gibbs.fold_in_collapsed`; docs/decisions.md compares the two).
    fold_in_tol : float, default=0.01
        CVB0 stops on a document after a pass that moved less than this share of its
        tokens' class mass.
    min_df : int or float, default=15
        Document-frequency threshold on the hashed columns (paper: 15), capped at
        ``max(2, N // 1000)`` for windows under 15,000 documents; a float in (0, 1)
        is a fraction of the documents.
    init : {"seeds", "random"}, default="seeds"
        Start of a cold fit's chain with ``n_new_clusters=0`` (every class seeded):
        ``"seeds"`` samples the seeded documents alone for ``seed_init_sweeps`` sweeps
        and initialises every other document by fold-in with their pi and phi;
        ``"random"`` is Algorithm 1's random start (always used with new clusters).
    seed_init_sweeps : int, default=50
        Sweeps of the seeded documents alone for ``init="seeds"``.
    class_prior : {"seeds", "uniform"}, default="seeds"
        Prior of theta with ``n_new_clusters=0``: ``"seeds"`` spreads the paper's total
        mass ``K alpha`` over the classes by the seeds' (add-one smoothed) class
        proportions, ``"uniform"`` is the paper's symmetric ``alpha`` (always used with
        new clusters).
    max_doc_tokens : int, default=1000
        Length cap: longer documents have their counts scaled down (see
        :func:`capped_counts`). 0 disables the cap.
    cluster_match_threshold : float, default=0.3
        Minimum overlap coefficient for a new cluster to inherit a previous
        fit's cluster name.
    random_state : int >= 0 or None, default=0

    Attributes
    ----------
    classes_ : ndarray of str
        Known classes (sorted), then the new clusters' names.
    new_clusters_ : list of str
    n_features_in_ : int
    n_known_ : int
    labels_ : ndarray of int
        Class index (into ``classes_``) of each training document.
    doc_class_proba_ : ndarray (N x K)
        theta of each training document from the averaged O_dk.
    alpha_ : ndarray (K,)
        Per-class Dirichlet prior of theta used by the fit and the fold-in.
    pi_ : ndarray (K x L)
        Topics per class. ``phi_`` : ndarray (L x V), words per topic.
    vocab_ : ndarray of int64
        Hashed columns of the V words.
    doc_ids_, doc_hash_, doc_ptr_, tok_col_, tok_z_, tok_y_ : ndarray
        Token state of the fit, reused by a warm-started refit.
    next_cluster_id_ : int
        Next never-used ``new-N`` number.
    converted_clusters_ : ndarray of str, shape (n, 2)
        ``[old new-cluster name, known class]`` for previous new clusters that
        were seeded and became known classes in this fit.
    n_sweeps_run_ : int
    n_realigned_ : int
        Known classes moved to the slot their seeds vote for after the sampling
        (:func:`align_seeded_classes`; the chain then ran ``max(warm_sweeps, n_average)``
        more sweeps, counted in ``n_sweeps_run_``); 0 when none moved.
    warm_started_ : bool
    """

    #: predict_proba runs in a compiled kernel that releases the GIL (the engine predicts on a helper thread)
    predict_releases_gil = True

    supports_warm_start = True

    _parameter_constraints = {
        **DISCOVERY_CONSTRAINTS,
        "n_topics": [Interval(Integral, 1, _MAX_TOPICS, closed="both")],
        "alpha": [Interval(Real, 0, None, closed="neither")],
        "delta": [Interval(Real, 0, None, closed="neither")],
        "beta": [Interval(Real, 0, None, closed="neither")],
        "n_sweeps": [Interval(Integral, 1, None, closed="left")],
        "warm_sweeps": [Interval(Integral, 0, None, closed="left")],
        "n_average": [Interval(Integral, 1, None, closed="left")],
        "fold_in_sweeps": [Interval(Integral, 0, None, closed="left")],
        "fold_in": [StrOptions({"cvb0", "gibbs"})],
        "fold_in_tol": [Interval(Real, 0, None, closed="left")],
        "min_df": [Interval(Integral, 1, None, closed="left"), Interval(RealNotInt, 0, 1, closed="neither")],
        "max_doc_tokens": [Interval(Integral, 0, None, closed="left")],
        "cluster_match_threshold": [Interval(Real, 0, 1, closed="both")],
        "init": [StrOptions({"seeds", "random"})],
        "seed_init_sweeps": [Interval(Integral, 0, None, closed="left")],
        "class_prior": [StrOptions({"seeds", "uniform"})],
        "random_state": RANDOM_STATE,
    }

    def __init__(self, n_new_clusters: int | str = 2, *, discovery: str = "legacy",
                 discovery_quantile: float = 0.4, discovery_init: Any = None,
                 discovery_split: bool = False, n_topics: int = 128, alpha: float = 0.2,
                 delta: float = 0.4, beta: float = 0.01, n_sweeps: int = 200,
                 warm_sweeps: int = 30, n_average: int = 10, fold_in_sweeps: int = 10,
                 fold_in: str = "cvb0", fold_in_tol: float = 0.01, min_df: int | float = 15, max_doc_tokens: int = 1000,
                 cluster_match_threshold: float = 0.3, init: str = "seeds",
                 seed_init_sweeps: int = 50, class_prior: str = "seeds", random_state: int | None = 0) -> None:
        self.n_new_clusters = n_new_clusters
        self.discovery = discovery
        self.discovery_quantile = discovery_quantile
        self.discovery_init = discovery_init
        self.discovery_split = discovery_split
        self.n_topics = n_topics
        self.alpha = alpha
        self.delta = delta
        self.beta = beta
        self.n_sweeps = n_sweeps
        self.warm_sweeps = warm_sweeps
        self.n_average = n_average
        self.fold_in_sweeps = fold_in_sweeps
        self.fold_in = fold_in
        self.fold_in_tol = fold_in_tol
        self.min_df = min_df
        self.max_doc_tokens = max_doc_tokens
        self.cluster_match_threshold = cluster_match_threshold
        self.init = init
        self.seed_init_sweeps = seed_init_sweeps
        self.class_prior = class_prior
        self.random_state = random_state

    def _seed(self, salt: int) -> int:
        base = 0 if self.random_state is None else int(self.random_state)
        return int((base * 0x9E3779B1 + salt * 0x85EBCA77 + 1) % (2**63))

    # ------------------------------------------------------------------ fit

    def fit(self, X: Any, y: Any, doc_ids: Sequence[Any] | None = None,
            warm_start_from: DLDA | None = None) -> DLDA:
        """Fit by collapsed Gibbs sampling.

        Parameters
        ----------
        X : sparse matrix (N x M)
            Non-negative term counts.
        y : sequence
            Seed label per row, None/-1/"" for unlabeled.
        doc_ids : sequence of hashable, optional
            One id per row (compared as ``str``); needed for warm starting and
            kept in ``doc_ids_`` for the next refit.
        warm_start_from : DLDA, optional
            A fitted DLDA (the previous refit). Unchanged documents (same id, same
            counts) keep their token states, new documents are initialised by
            fold-in with its pi/phi, and ``warm_sweeps`` sweeps are run.
        """
        if uses_calibrated(self):
            return fit_calibrated(self, X, y, doc_ids=doc_ids, warm_start_from=warm_start_from)
        self._validate_params()
        X = self._validate_counts(X, reset=True)
        X.sum_duplicates()
        X.sort_indices()
        N = X.shape[0]
        n_new = int(self.n_new_clusters)
        codes, known = encode_single_labels(y, N, min_classes=1 if n_new >= 1 else 2)
        n_known = known.size
        K = n_known + n_new
        check_n_clusters(K, N)
        L = int(self.n_topics)
        if doc_ids is not None:
            ids = np.asarray([str(v) for v in doc_ids])
            if ids.size != N:
                raise DegenerateInputError(f"doc_ids has {ids.size} elements but X has {N} rows")
            if np.unique(ids).size != N:
                raise DegenerateInputError("doc_ids contains duplicate ids")
        else:
            ids = np.asarray([str(i) for i in range(N)])
        prev = warm_start_from
        if prev is not None:
            check_is_fitted(prev)
            if doc_ids is None:
                raise ValueError("warm_start_from needs doc_ids to match documents across fits")

        vocab = prune_vocabulary(X, self.min_df)
        if vocab.size == 0:
            raise DegenerateInputError(
                f"no feature occurs in at least min_df={self.min_df} documents; lower min_df")
        lookup = np.full(X.shape[1], -1, dtype=np.int64)
        lookup[vocab] = np.arange(vocab.size)
        ptr, w, col = tokens_from_counts(X, lookup, int(self.max_doc_tokens))
        if ptr[-1] == 0:
            raise DegenerateInputError("no tokens left after vocabulary pruning")
        V = vocab.size
        doc_hash = gibbs.row_hashes(X.indptr, X.indices, X.data)
        T = int(ptr[-1])
        z = np.full(T, -1, dtype=np.int16)
        yt = np.full(T, -1, dtype=np.int16)
        fixed = codes.astype(np.int64)  # -1 = free document
        self.alpha_ = self._seed_alpha(codes, n_known, n_new)

        converted: list[tuple[str, str]] = []
        warm = (prev is not None and prev.pi_.shape[1] == L
                and prev.n_features_in_ == X.shape[1])
        next_id = int(prev.next_cluster_id_) if prev is not None else 0
        if warm:
            zmap, converted = self._class_map(prev, known, n_new, codes, ids)
            foldin_docs = self._transfer(prev, ids, doc_hash, ptr, col, z, yt, zmap)
            # pi/phi of the previous fit mapped onto this fit's classes and words
            pi0 = np.full((K, L), 1.0 / L)
            for k_old, k_new in enumerate(zmap):
                if k_new >= 0:
                    pi0[k_new] = prev.pi_[k_old]
            phiT0 = np.ones((V, L))
            old_pos = np.searchsorted(prev.vocab_, vocab)
            old_pos = np.minimum(old_pos, prev.vocab_.size - 1)
            in_old = prev.vocab_[old_pos] == vocab
            phiT0[in_old] = prev.phi_[:, old_pos[in_old]].T
            pin_seeded_tokens(z, ptr, fixed)  # seeded documents: z fixed to the label, whatever the previous state
            # partly known documents (new words, vanished classes) and new documents
            need = np.flatnonzero(np.maximum.reduceat(
                np.r_[(z < 0) | (yt < 0), False].astype(np.int8), ptr[:-1].clip(max=T))
                * (np.diff(ptr) > 0))
            init_docs = np.union1d(need, foldin_docs)
            if init_docs.size:
                self._fold_in_subset(init_docs, ptr, w, z, yt, fixed, pi0, phiT0,
                                     int(self.fold_in_sweeps), self._seed(3))
            sweeps = int(self.warm_sweeps)
        else:
            gibbs.random_init(ptr, z, yt, fixed, K, L, self._seed(1))
            if self.init == "seeds" and n_new == 0:
                self._seed_init(ptr, w, z, yt, fixed, K, L, V)
            sweeps = int(self.n_sweeps)

        n_avg = max(1, min(int(self.n_average), sweeps)) if sweeps else 0
        acc, nk = self._sample(ptr, w, z, yt, fixed, K, L, V, sweeps, n_avg, self._seed(2))
        self.n_realigned_ = 0
        if n_new and sweeps and n_known:
            order = align_seeded_classes(seed_votes(ptr, w, fixed, self.pi_, self.phi_, n_known))
            if order is not None:  # move each known class to the slot its seeds vote for, then sample on
                inv = np.empty(K, dtype=np.int64)
                inv[order] = np.arange(K)
                placed = z >= 0
                z[placed] = inv[z[placed]]
                pin_seeded_tokens(z, ptr, fixed)
                more = max(int(self.warm_sweeps), n_avg)
                acc, nk = self._sample(ptr, w, z, yt, fixed, K, L, V, more, n_avg, self._seed(7))
                sweeps += more
                self.n_realigned_ = int((order[:n_known] != np.arange(n_known)).sum())
        if sweeps:
            acc = self._averaged_with_fold_in(acc, ptr, w, fixed)
        lengths = np.diff(ptr)
        empty = lengths == 0
        if empty.any():  # no kept word: corpus-level class proportions
            acc[empty] = nk / nk.sum()
        labels = acc.argmax(axis=1)
        seeded = fixed >= 0
        labels[seeded] = fixed[seeded]  # (all their tokens are in that class anyway)

        # names of the new clusters: stable across refits (document overlap matching)
        names = self._name_clusters(prev, ids, labels, n_known, n_new, next_id, converted)
        next_id = max([next_id] + [int(nm[len(NEW_CLUSTER_PREFIX):]) + 1 for nm in names])

        self.n_known_ = n_known
        self.new_clusters_ = list(names)
        self.classes_ = np.asarray(list(known) + list(names), dtype=str)
        self.labels_ = labels.astype(np.int64)
        self.doc_class_proba_ = class_proba(acc, self.alpha_)
        self.scores_ = acc[np.arange(N), labels] / np.maximum(lengths, 1)
        self.vocab_ = vocab
        self.doc_ids_ = ids
        self.doc_hash_ = doc_hash
        self.doc_ptr_ = ptr
        self.tok_col_ = col
        self.tok_z_ = z
        self.tok_y_ = yt
        self.seed_codes_ = codes.astype(np.int64)
        self.next_cluster_id_ = int(next_id)
        self.converted_clusters_ = (np.asarray(converted, dtype=str) if converted
                                    else np.zeros((0, 2), dtype=str))
        self.n_sweeps_run_ = sweeps
        self.warm_started_ = bool(warm)
        return self

    # ------------------------------------------------------------------ warm-start helpers

    @staticmethod
    def _class_map(prev: DLDA, known: np.ndarray, n_new: int, codes: np.ndarray,
                   ids: np.ndarray) -> tuple[np.ndarray, list[tuple[str, str]]]:
        """Map the previous fit's classes onto this fit's class indices.

        * a previous known class still seeded keeps its meaning;
        * a previous new cluster whose documents now carry (mostly) a newly seeded
          label becomes that known class (``converted``);
        * the other previous new clusters fill this fit's new-cluster slots in
          order (their names are then confirmed by :meth:`_name_clusters`);
        * anything else maps to -1 (its tokens are re-initialised).
        """
        n_known = known.size
        prev_classes = [str(c) for c in prev.classes_]
        prev_known = set(prev_classes[: int(prev.n_known_)])
        lookup = {c: i for i, c in enumerate(known)}
        zmap = np.full(len(prev_classes), -1, dtype=np.int64)
        for k_old, name in enumerate(prev_classes[: int(prev.n_known_)]):
            zmap[k_old] = lookup.get(name, -1)
        # previous assignment of the documents seeded with a label new to this fit
        prev_pos = {d: i for i, d in enumerate(prev.doc_ids_.tolist())}
        converted: list[tuple[str, str]] = []
        taken: set[int] = set()
        fresh_labels = [c for c in known if c not in prev_known]
        votes = []
        for c in fresh_labels:
            rows = np.flatnonzero(codes == lookup[c])
            old = [int(prev.labels_[prev_pos[d]]) for d in ids[rows].tolist() if d in prev_pos]
            in_new = [k for k in old if k >= int(prev.n_known_)]
            if in_new:
                k_old, count = np.unique(in_new, return_counts=True)
                j = int(np.argmax(count))
                votes.append((int(count[j]), c, int(k_old[j]), len(old)))
        for count, c, k_old, n_prev in sorted(votes, reverse=True):
            # the majority of the label's seeds known to the previous fit were in k_old
            if k_old not in taken and 2 * count > n_prev:
                taken.add(k_old)
                zmap[k_old] = lookup[c]
                converted.append((prev_classes[k_old], c))
        slot = n_known
        for k_old in range(int(prev.n_known_), len(prev_classes)):
            if k_old not in taken and slot < n_known + n_new:
                zmap[k_old] = slot
                slot += 1
        return zmap, converted

    def _transfer(self, prev: DLDA, ids: np.ndarray, doc_hash: np.ndarray, ptr: np.ndarray,
                  col: np.ndarray, z: np.ndarray, yt: np.ndarray, zmap: np.ndarray) -> np.ndarray:
        """Copy token states of unchanged documents; return the documents to fold in."""
        prev_pos = {d: i for i, d in enumerate(prev.doc_ids_.tolist())}
        old_idx = np.asarray([prev_pos.get(d, -1) for d in ids.tolist()], dtype=np.int64)
        same = old_idx >= 0
        same[same] = prev.doc_hash_[old_idx[same]] == doc_hash[same]
        new_docs = np.flatnonzero(same)
        gibbs.transfer_states(ptr, col, prev.doc_ptr_, prev.tok_col_, prev.tok_z_, prev.tok_y_,
                              new_docs, old_idx[new_docs], zmap.astype(np.int64), z, yt)
        return np.flatnonzero(~same)

    def _seed_alpha(self, codes: np.ndarray, n_known: int, n_new: int) -> np.ndarray:
        """Per-class Dirichlet prior of theta: ``alpha * K * p_k``.

        With ``class_prior="seeds"`` and every class seeded (``n_new == 0``), ``p_k`` is
        the seeds' class proportion with add-one smoothing, ``(n_k + 1) / (n + K)``: the
        same total mass ``K alpha`` as the paper's symmetric prior, spread by class size
        (an asymmetric Dirichlet, Wallach et al., NIPS 2009). Otherwise ``p_k = 1 / K``.
        """
        K = n_known + n_new
        if self.class_prior == "seeds" and n_new == 0:
            n_k = np.bincount(codes[codes >= 0], minlength=K).astype(np.float64)
            p = (n_k + 1.0) / (n_k.sum() + K)
        else:
            p = np.full(K, 1.0 / K)
        return float(self.alpha) * K * p

    def _sample(self, ptr: np.ndarray, w: np.ndarray, z: np.ndarray, yt: np.ndarray, fixed: np.ndarray,
                K: int, L: int, V: int, sweeps: int, n_avg: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """Run ``sweeps`` sweeps of the chain from the states ``z``/``yt`` (in place), set ``pi_``
        and ``phi_`` from the final counts; return the O_dk averaged over the last ``n_avg``
        sweeps (the counts themselves with no sweep) and the class totals."""
        ndk, nkl, nk, nvl, nl = gibbs.build_counts(ptr, w, z, yt, K, L, V)
        acc = np.zeros((ptr.size - 1, K))
        if sweeps:
            gibbs.gibbs_sweeps_sparse(ptr, w, z, yt, (fixed < 0).astype(np.uint8), ndk, nkl, nk, nvl, nl,
                                      self.alpha_, float(self.beta), float(self.delta),
                                      sweeps, n_avg, seed, acc)
            acc /= n_avg
        else:
            acc[:] = ndk
        self.pi_ = estimate_pi(nkl, float(self.delta))
        self.phi_ = estimate_phi(nvl, float(self.beta))
        return acc, nk

    def _averaged_with_fold_in(self, acc: np.ndarray, ptr: np.ndarray, w: np.ndarray,
                               fixed: np.ndarray) -> np.ndarray:
        """The chain's O_dk of the training documents averaged with their collapsed fold-in under the final pi, phi.

        Both are Monte Carlo estimates of the same posterior over each document's
        classes (Eqs. 4-5): the chain's from its last ``n_average`` sweeps, whose word
        topics were still moving, the fold-in's (:func:`~._dlda_gibbs.fold_in_collapsed`)
        with pi and phi fixed at their final estimate. Their mean has less variance than
        either, at the cost of one fold-in (0.1 s for 7,600 R8 documents, 0.7 s for 8,000
        20NG documents against a 14-68 s fit). Fits on all of R8 and 8,000 20NG documents
        (the served-quality streams) with 5% seeds, orders 0 and 1, macro-F1 of the non-seed
        documents, chain alone / fold-in alone / this mean: R8 0.681 / 0.685 / 0.692 and
        0.736 / 0.739 / 0.739, 20NG 0.735 / 0.744 / 0.746 and 0.720 / 0.727 / 0.730. Seeded
        documents keep the chain's counts (every token is pinned to its class there).
        """
        sweeps = int(self.fold_in_sweeps)
        if not sweeps:
            return acc
        n_avg = max(1, sweeps // 2)
        # the final pi, phi: _class_word_T caches M for the predictions that follow; alpha_ directly (_class_alpha
        # checks that the fit has ended)
        fold = gibbs.fold_in_collapsed(ptr, w, self._class_word_T(), np.asarray(self.alpha_, dtype=np.float64),
                                       sweeps, n_avg, self._seed(8)) / n_avg
        out = 0.5 * (acc + fold)
        seeded = fixed >= 0
        out[seeded] = acc[seeded]
        return out

    def _class_alpha(self) -> np.ndarray:
        """The fitted per-class prior (symmetric for a model saved before ``alpha_`` existed)."""
        check_is_fitted(self)
        a = getattr(self, "alpha_", None)
        return np.full(self.pi_.shape[0], float(self.alpha)) if a is None else a

    def _seed_init(self, ptr: np.ndarray, w: np.ndarray, z: np.ndarray, yt: np.ndarray,
                   fixed: np.ndarray, K: int, L: int, V: int) -> None:
        """Start the chain from the seeds: sample the seeded documents alone, then fold in the others.

        The seeded documents' tokens (z fixed to their class) are sampled for
        ``seed_init_sweeps`` sweeps on their own; pi and phi estimated from them then
        initialise every unlabelled document by fold-in (``fold_in_sweeps``), so the
        joint chain starts in the mode the seeds define instead of a random one
        (random_init has already set the tokens' states; they are overwritten here).
        """
        seeded = np.flatnonzero(fixed >= 0)
        free_docs = np.flatnonzero((fixed < 0) & (np.diff(ptr) > 0))
        if seeded.size == 0 or free_docs.size == 0:
            return
        sub_ptr, idx = doc_tokens(ptr, seeded)
        sz, sy = z[idx].copy(), yt[idx].copy()
        sw = w[idx]
        ndk, nkl, nk, nvl, nl = gibbs.build_counts(sub_ptr, sw, sz, sy, K, L, V)
        acc = np.zeros((seeded.size, K))
        gibbs.gibbs_sweeps_sparse(sub_ptr, sw, sz, sy, np.zeros(seeded.size, dtype=np.uint8),
                                  ndk, nkl, nk, nvl, nl, self.alpha_, float(self.beta),
                                  float(self.delta), int(self.seed_init_sweeps), 1,
                                  self._seed(5), acc)
        z[idx] = sz
        yt[idx] = sy
        pi0 = estimate_pi(nkl, float(self.delta))
        phiT0 = np.ascontiguousarray(estimate_phi(nvl, float(self.beta)).T)
        tok_free = np.repeat(fixed < 0, np.diff(ptr))
        z[tok_free] = -1
        yt[tok_free] = -1
        self._fold_in_subset(free_docs, ptr, w, z, yt, fixed, pi0, phiT0,
                             int(self.fold_in_sweeps), self._seed(6))

    def _fold_in_subset(self, docs: np.ndarray, ptr: np.ndarray, w: np.ndarray, z: np.ndarray,
                        yt: np.ndarray, fixed: np.ndarray, pi: np.ndarray, phiT: np.ndarray,
                        sweeps: int, seed: int) -> None:
        """Fold-in (pi, phi fixed) the tokens of ``docs``, writing their z/y in place."""
        sub_ptr, idx = doc_tokens(ptr, docs)
        sz, sy = z[idx].copy(), yt[idx].copy()
        gibbs.fold_in(sub_ptr, w[idx], sz, sy, fixed[docs], pi, phiT, self.alpha_,
                      sweeps, max(1, sweeps // 2), seed)
        z[idx] = sz
        yt[idx] = sy

    def _name_clusters(self, prev: DLDA | None, ids: np.ndarray, labels: np.ndarray,
                       n_known: int, n_new: int, next_id: int,
                       converted: list[tuple[str, str]]) -> list[str]:
        """Names of this fit's new-cluster slots (stable across refits)."""
        names: list[str | None] = [None] * n_new
        if prev is not None and n_new:
            retired = {old for old, _ in converted}
            prev_new = [str(c) for c in prev.classes_[int(prev.n_known_):] if str(c) not in retired]
            if prev_new:
                prev_pos = {d: i for i, d in enumerate(prev.doc_ids_.tolist())}
                old_idx = np.asarray([prev_pos.get(d, -1) for d in ids.tolist()], dtype=np.int64)
                common = np.flatnonzero(old_idx >= 0)
                old_names = np.asarray(prev.classes_, dtype=str)[prev.labels_[old_idx[common]]]
                col_of = {nm: j for j, nm in enumerate(prev_new)}
                oc = np.asarray([col_of.get(nm, -1) for nm in old_names.tolist()], dtype=np.int64)
                nc = labels[common] - n_known
                both = (oc >= 0) & (nc >= 0)
                overlap = np.zeros((n_new, len(prev_new)))
                np.add.at(overlap, (nc[both], oc[both]), 1.0)
                new_sizes = np.bincount(nc[nc >= 0], minlength=n_new).astype(float)
                old_sizes = np.bincount(oc[oc >= 0], minlength=len(prev_new)).astype(float)
                match = match_clusters(overlap, new_sizes, old_sizes,
                                       float(self.cluster_match_threshold))
                for r, c in enumerate(match):
                    if c >= 0:
                        names[r] = prev_new[c]
        out = []
        for r in range(n_new):
            if names[r] is None:
                names[r] = f"{NEW_CLUSTER_PREFIX}{next_id}"
                next_id += 1
            out.append(str(names[r]))
        return out

    # ------------------------------------------------------------------ prediction

    def _phiT(self) -> np.ndarray:
        phi = self.phi_  # a refit or restore replaces phi_
        return _PHI_T.get(self, (phi,), lambda: np.ascontiguousarray(phi.T))

    def _class_word_T(self) -> np.ndarray:
        """``(pi @ phi).T`` (V x K, contiguous): p(word | class), the fold-in's per-token weights (cached)."""
        phi, pi = self.phi_, self.pi_
        return _CLASS_WORD_T.get(self, (phi, pi), lambda: np.ascontiguousarray(self._phiT() @ np.asarray(pi).T))

    def fold_in_tokens(self, X: Any) -> tuple[np.ndarray, np.ndarray]:
        """Token layout of ``X`` for the fold-in kernels: ``(ptr, w)`` over the kept vocabulary (capped counts)."""
        X, lookup = self._kept_lookup(X)
        ptr, w, _ = tokens_from_counts(X, lookup, int(self.max_doc_tokens))
        return ptr, w

    def fold_in_words(self, X: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Distinct-word layout of ``X`` for :func:`~._dlda_gibbs.fold_in_cvb0`: ``(ptr, w, counts)``."""
        X, lookup = self._kept_lookup(X)
        ptr, w, _, c = word_counts(X, lookup, int(self.max_doc_tokens))
        return ptr.astype(np.int64), w.astype(np.int64), c.astype(np.float64)

    def _kept_lookup(self, X: Any) -> tuple[sp.csr_matrix, np.ndarray]:
        """Validated ``X`` (summed duplicates, sorted indices) and the compact index of each column (-1: pruned)."""
        X = self._validate_counts(X, reset=False)
        X.sum_duplicates()
        X.sort_indices()
        lookup = np.full(X.shape[1], -1, dtype=np.int64)
        lookup[self.vocab_] = np.arange(self.vocab_.size)
        return X, lookup

    def _fold_in_counts(self, X: Any) -> tuple[np.ndarray, np.ndarray]:
        """(Expected) O_dk of each row with pi and phi fixed, and its kept token count.

        ``fold_in="cvb0"`` (default; :func:`~._dlda_gibbs.fold_in_cvb0`): the expected
        counts at the CVB0 fixed point of the collapsed conditional
        ``p(z_i = k | z_-i) ∝ (O_dk + alpha_k) M_kv`` (Eqs. 4-5 with the word topics
        summed out). Measured against ``"gibbs"`` on 3,000 held-out documents of fits with
        stratified-by-order seeds (``benchmarks/dlda_fold_in.py``, kept in git: docs/decisions.md, one core): macro-F1
        20NG (5,000 fitted, 5% seeds) 0.656 -> 0.661, R8 (4,500, 2%) 0.576 -> 0.577, R52
        (5,000, 5%) 0.241 -> 0.251, in 2.1-2.4x less time (20NG 0.120 -> 0.056 s); no
        sampling noise.

        ``fold_in="gibbs"`` (:func:`~._dlda_gibbs.fold_in_collapsed`): the same posterior
        sampled, O_dk averaged over the last half of ``fold_in_sweeps``. Measured against
        the z-and-y sampler on 3,000 held-out documents (fits on 5,000 20NG documents with
        5% seeds and 4,500 R8 documents with 2%): 10-18x faster, macro-F1 0.656 vs 0.624
        (20NG) and 0.576 vs 0.558 (R8); the two agree on 81% / 94% of the documents, more
        than the z-and-y sampler with another seed agrees with itself (78% / 93%).
        """
        if self.fold_in == "cvb0":
            ptr, w, c = self.fold_in_words(X)
            acc = gibbs.fold_in_cvb0(ptr, w, c, self._class_word_T(), self._class_alpha(),
                                     int(self.fold_in_sweeps), float(self.fold_in_tol))
            row = np.repeat(np.arange(ptr.size - 1), np.diff(ptr))
            return acc, np.bincount(row, weights=c, minlength=ptr.size - 1)
        ptr, w = self.fold_in_tokens(X)
        sweeps = int(self.fold_in_sweeps)
        n_avg = max(1, sweeps // 2)
        acc = gibbs.fold_in_collapsed(ptr, w, self._class_word_T(), self._class_alpha(), sweeps, n_avg,
                                      self._seed(4))
        if sweeps:
            acc /= n_avg
        return acc, np.diff(ptr)

    def predict_proba(self, X: Any) -> np.ndarray:
        """theta of each row by fold-in: normalised (O_dk + alpha), O_dk expected (``fold_in``).

        A row with no known word gets the uniform distribution.
        """
        if self._calibrated_fit():
            return predict_proba_calibrated(self, X)
        acc, _ = self._fold_in_counts(X)
        return class_proba(acc, self._class_alpha())

    def fitted_proba(self) -> np.ndarray | None:
        """The fitted chain's document-class distributions of the training rows (``doc_class_proba_``).

        What the fold-in of ``predict_proba`` approximates for those rows, without its cost
        (10,000 20NG documents: 9.3 s of fold-in after a 73 s fit; the chain's labels scored
        macro-F1 0.734 on the non-seed documents, the fold-in's 0.718). None for a
        calibrated-discovery fit.
        """
        check_is_fitted(self)
        if self._calibrated_fit():
            return None
        return np.asarray(self.doc_class_proba_, dtype=np.float64)

    def decision_function(self, X: Any) -> np.ndarray:
        """Score O_dk / document length of the fold-in (rows sum to 1, 0 for no known word);
        a calibrated-discovery fit scores by ``predict_proba``."""
        if self._calibrated_fit():
            return predict_proba_calibrated(self, X)
        acc, lengths = self._fold_in_counts(X)
        return acc / np.maximum(lengths, 1)[:, None]

    def predict(self, X: Any) -> np.ndarray:
        """Class or new-cluster name of each row (Eq. 6 on the fold-in counts)."""
        if self._calibrated_fit():
            return self.classes_[predict_proba_calibrated(self, X).argmax(axis=1)]
        proba = self.predict_proba(X)
        return self.classes_[proba.argmax(axis=1)]

    def class_word_weights(self) -> np.ndarray:
        """p(word | class) = pi_k @ phi over the kept words (K x V)."""
        check_is_fitted(self)
        return self.pi_ @ self.phi_

    def _explain_weights(self) -> sp.csr_matrix:
        """``p(word | class) = pi_k @ phi`` placed at the kept words' hashed columns."""
        W = self.class_word_weights()
        K = W.shape[0]
        cols = np.tile(self.vocab_, K)
        rows = np.repeat(np.arange(K), self.vocab_.size)
        return sp.csr_matrix((W.ravel(), (rows, cols)), shape=(K, int(self.n_features_in_)))


__all__ = ["DLDA", "align_seeded_classes", "seed_votes", "estimate_pi", "estimate_phi", "class_proba",
           "prune_vocabulary", "capped_counts", "tokens_from_counts", "word_counts", "match_clusters"]
