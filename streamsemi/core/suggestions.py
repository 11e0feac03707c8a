"""Label suggestions: which window documents a person should label next, and why.

After every refit round the engine ranks the window's unlabelled documents with the
pure, vectorised functions of this module (:func:`rank`) and the worker publishes the
top ``suggestions_top_n`` to the compacted suggestions topic (docs/suggestions.md).
Four reasons, each a score in [0, 1] per document:

``uncertain``
    ``1 - margin``: the primary model's two best classes are close (margin sampling,
    Scheffer et al. 2001).
``disagreement``
    the share of the other enabled algorithms whose class differs from the primary's
    (query by committee, Seung et al. 1992), each vote weighted by how often that algorithm
    was right where it and the primary disagreed on seeds neither had seen
    (:func:`credibility`); measured on a bounded sample of the window.
``rare_class``
    the probability of a class with fewer than ``rare_below`` seeds, weighted by how
    few it has (a label there adds most to the seeds).
``new_cluster``
    the most typical document of each discovered (unseeded) cluster of any algorithm:
    naming it turns the cluster into a class.

The priority of a document is the weighted sum of its scores, times its typicality
(cosine to the mean of its predicted class, information density: Settles & Craven
2008), so that outliers do not crowd the queue, times its coverage (one minus its
largest cosine to a seeded document), so that regions the seeds already cover give way
to those they do not; the reason is the largest weighted score. Diversity (diverse
mini-batch active learning, Zhdanov 2019): the ``POOL_FACTOR * top_n`` candidates of
highest priority are clustered into ``top_n`` clusters (kernel k-means on their cosines,
weighted by priority, :func:`pool_clusters`) and a first pass takes from each cluster the
member nearest its weighted centre, skipping any whose cosine to an already chosen one
exceeds ``max_similarity`` (near-duplicates); a second pass fills the list in priority
order (``diversity="classes"``: the groups are the predicted classes instead, and the
first pass takes an equal share per class in priority order). Cost: the candidates are a random sample of at most
``CANDIDATE_SAMPLE`` unlabelled window documents (a new one each round); one
``predict_proba`` of the primary model on them, the others' on at most
``DISAGREEMENT_SAMPLE``, sparse products, a kernel k-means and a greedy pass over at most
``POOL_FACTOR * top_n`` candidates.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

REASONS = ("uncertain", "disagreement", "rare_class", "new_cluster")
#: weights of the reasons' scores in the priority (new-cluster representatives first)
WEIGHTS = {"uncertain": 1.0, "disagreement": 0.8, "rare_class": 0.6, "new_cluster": 2.0}
SNIPPET_CHARS = 300
SCORES_IN_MESSAGE = 3
MAX_TOP_N = 1000
CANDIDATE_SAMPLE = 2000      # window documents ranked per round (a fresh random sample each round)
DISAGREEMENT_SAMPLE = 2000   # documents the other algorithms are asked about (half: the least certain)
# POOL_FACTOR and DIVERSITY were chosen on development corpora only (20NG talk.* and rec.*, seeds 40-45;
# checked on sci.*), never on the evaluation corpora R8 and 20NG comp.*: benchmarks/active_learning.py
POOL_FACTOR = 4              # candidates considered by the diversity pass per suggestion
#: how the diversity pass spreads the list: "classes" (an equal share per predicted class), "clusters"
#: (one per cluster of the candidate pool, weighted kernel k-means: Zhdanov's diverse mini-batch AL)
DIVERSITY = "centres"
#: "centres": the clusters of "clusters", but each cluster's member nearest its weighted centre (Zhdanov's choice)
DIVERSITY_MODES = ("classes", "clusters", "centres")
#: how the pool of candidates is drawn: "priority" (the highest priorities overall) or "classes" (round
#: robin over the predicted classes: each class's best, then each class's second best, ...). "classes"
#: was tried for R8's skew and was not better on the development corpora (20NG talk.*,
#: rec.*, sci.* and 20ng-skew, R8's class sizes on 20NG documents) nor on fresh R8 seeds: not the default
POOL_BALANCE = "priority"
POOL_BALANCE_MODES = ("priority", "classes")
POOL_KMEANS_ITER = 10        # assignment rounds of the pool's kernel k-means
MAX_SIMILARITY = 0.8         # cosine of term counts above which two documents are near-duplicates
RARE_BELOW = 5               # classes with fewer seeds than this are rare
DENSITY_POWER = 1.0          # exponent of the typicality factor of the priority
COVERAGE_POWER = 1.0         # exponent of the coverage factor (distance to the nearest seed)
SEED_SAMPLE = 2000           # seeds compared against for the coverage factor (the newest)
#: accounted bytes per published suggestion beyond its strings (dict, floats, bookkeeping)
SUGGESTION_OVERHEAD_BYTES = 1024
#: default byte budget per published suggestion (overhead, a 300-character snippet, id, labels)
MESSAGE_BYTES_BUDGET = 4096
STALE_FACTOR = 20            # ids of a previous run's suggestions remembered per suggestion (adopt)
#: ids of earlier published suggestions remembered per suggestion (:meth:`SuggestionBoard.was_suggested`)
RECENT_FACTOR = 20


@dataclass(frozen=True)
class Suggestion:
    """One ranked document (the message without its snippet and time, :func:`to_message`)."""

    id: str
    algorithm: str
    label: str
    scores: dict[str, float]
    reason: str
    priority: float
    rank: int
    model_version: int


@dataclass
class ModelView:
    """What ranking needs of one algorithm's model: its probabilities on some window rows.

    Attributes
    ----------
    name : str
    proba : ndarray (n_rows, n_classes)
    classes : sequence of str
    new_clusters : frozenset of str
        Class names that are discovered clusters (no seed).
    rows : ndarray of int or None
        Candidate rows ``proba`` belongs to (None: every candidate row).
    credibility : float
        Weight in [0, 1] of this algorithm's vote in ``disagreement`` (:func:`credibility`;
        1: a full vote).
    """

    name: str
    proba: np.ndarray
    classes: Sequence[str]
    new_clusters: frozenset[str] = frozenset()
    rows: np.ndarray | None = None
    credibility: float = 1.0


def margins(P: np.ndarray) -> np.ndarray:
    """Difference between the two largest values of each row (1 for a single column).

    Parameters
    ----------
    P : ndarray (n, k)

    Returns
    -------
    ndarray (n,) in [0, 1] for probabilities
    """
    P = np.asarray(P, dtype=np.float64)
    if P.shape[1] < 2:
        return np.ones(P.shape[0])
    top2 = np.partition(P, P.shape[1] - 2, axis=1)[:, -2:]
    return np.abs(top2[:, 1] - top2[:, 0])


def disagreement(primary: np.ndarray, others: Sequence[np.ndarray],
                 weights: Sequence[float] | None = None) -> np.ndarray:
    """Share of the ``others`` whose label differs from ``primary``'s, per row, each vote weighted.

    Parameters
    ----------
    primary : ndarray (n,) of labels
    others : sequence of ndarray (n,) of labels (the other algorithms, same rows)
    weights : sequence of float in [0, 1], optional
        Weight of each other algorithm's vote (:func:`credibility`; default 1 each). The
        share is ``sum_a w_a [label_a != primary] / len(others)``: a vote worth less
        lowers the score, it does not hand its share to the other votes.

    Returns
    -------
    ndarray (n,) in [0, 1] (zeros without others)
    """
    primary = np.asarray(primary)
    if not others:
        return np.zeros(primary.shape[0])
    differs = np.stack([np.asarray(o) != primary for o in others]).astype(np.float64)
    if weights is not None:
        differs *= np.clip(np.asarray(weights, dtype=np.float64), 0.0, 1.0)[:, None]
    return differs.mean(axis=0)


def credibility(wins: int, losses: int) -> float:
    """Weight of another algorithm's vote against the primary's, from their record on unseen seeds.

    ``wins``: seeds (labels neither model had been fitted on: the engine's prequential
    checks) the other algorithm got right and the primary wrong; ``losses``: the reverse.
    The weight is twice the Laplace estimate of the chance that the other algorithm is
    right when the two disagree, capped at 1: ``min(1, 2 (wins + 1) / (wins + losses + 2))``.
    No record (or an even one) gives a full vote; an algorithm that loses its
    disagreements with the primary loses its say in ``disagreement``, because its votes
    then point at documents where it is the one that is wrong. (Query by committee
    assumes members as good as each other; a member weighted by its record is the usual
    remedy when they are not.)

    Parameters
    ----------
    wins, losses : int >= 0

    Returns
    -------
    float in (0, 1]
    """
    if wins < 0 or losses < 0:
        raise ValueError(f"wins and losses must be >= 0, got {wins} and {losses}")
    return min(1.0, 2.0 * (wins + 1) / (wins + losses + 2))


def rare_class_scores(P: np.ndarray, classes: Sequence[str], seed_counts: Mapping[str, int],
                      new_clusters: frozenset[str] = frozenset(), rare_below: int = RARE_BELOW) -> np.ndarray:
    """Per row, the largest ``P[:, c] * (1 - seeds(c) / rare_below)`` over seeded classes ``c`` with few seeds.

    Discovered clusters are not classes (their documents are ``new_cluster`` suggestions).

    Returns
    -------
    ndarray (n,) in [0, 1]
    """
    w = np.array([0.0 if (c in new_clusters or rare_below <= 0)
                  else max(0.0, 1.0 - seed_counts.get(c, 0) / rare_below) for c in classes])
    if not w.any():
        return np.zeros(P.shape[0])
    return (np.asarray(P, dtype=np.float64) * w).max(axis=1)


def normalize_rows(X: sp.spmatrix) -> sp.csr_matrix:
    """A copy of ``X`` (CSR, float64) with rows scaled to unit L2 norm (empty rows stay zero)."""
    X = sp.csr_matrix(X, dtype=np.float64, copy=True)
    lengths = np.diff(X.indptr)
    norms = np.sqrt(np.bincount(np.repeat(np.arange(X.shape[0]), lengths), weights=X.data ** 2,
                                minlength=X.shape[0]))
    norms[norms == 0] = 1.0
    X.data /= np.repeat(norms, lengths)
    return X


def typicality(Xn: sp.csr_matrix, groups: np.ndarray) -> np.ndarray:
    """Cosine of each (unit-norm) row to the mean of the rows of its group, in [0, 1].

    The group means are dense over the columns the rows use (hashed columns: a few
    tens of thousands of the 2^18), so the cost is one sparse-dense product.

    Parameters
    ----------
    Xn : csr_matrix (n, d), rows of unit norm (non-negative)
    groups : ndarray (n,) of int group codes
    """
    n = Xn.shape[0]
    if n == 0 or Xn.nnz == 0:
        return np.zeros(n)
    used = np.zeros(Xn.shape[1], dtype=bool)
    used[Xn.indices] = True
    compact = np.cumsum(used) - 1   # column -> its index among the used columns (no sort)
    Xc = sp.csr_matrix((Xn.data, compact[Xn.indices], Xn.indptr), shape=(n, int(used.sum())))
    k = int(groups.max()) + 1
    H = sp.csr_matrix((np.ones(n), (groups, np.arange(n))), shape=(k, n))
    means = np.asarray((H @ Xc).todense())
    norms = np.linalg.norm(means, axis=1)
    norms[norms == 0] = 1.0
    means /= norms[:, None]
    S = np.asarray(Xc @ means.T)   # (n, k), k small
    return np.clip(S[np.arange(n), groups], 0.0, 1.0)


def coverage(Xn: sp.csr_matrix, Sn: sp.csr_matrix) -> np.ndarray:
    """``1 -`` the largest cosine of each (unit-norm) row of ``Xn`` to a (unit-norm) seed row of ``Sn``.

    Documents close to an existing seed teach a model little that the seed did not;
    at most the last :data:`SEED_SAMPLE` seed rows are compared.

    Returns
    -------
    ndarray (n,) in [0, 1]
    """
    if Sn.shape[0] == 0 or Xn.shape[0] == 0:
        return np.ones(Xn.shape[0])
    Sn = Sn[-SEED_SAMPLE:]
    S = Xn @ Sn.T
    best = np.asarray(S.max(axis=1).todense()).ravel() if sp.issparse(S) else np.asarray(S).max(axis=1)
    return np.clip(1.0 - best, 0.0, 1.0)


def cluster_representatives(P: np.ndarray, columns: Sequence[int], weight: np.ndarray | None = None,
                            per_cluster: int = 1) -> dict[int, np.ndarray]:
    """The rows most typical of each column in ``columns`` among the rows whose argmax it is.

    Typical = largest ``P[:, j] * weight`` (``weight`` e.g. :func:`typicality`).

    Returns
    -------
    dict column -> ndarray of at most ``per_cluster`` row indices (best first; absent if no row has it)
    """
    if not len(columns):
        return {}
    top = np.asarray(P).argmax(axis=1)
    out: dict[int, np.ndarray] = {}
    for j in columns:
        rows = np.flatnonzero(top == j)
        if rows.size == 0:
            continue
        s = P[rows, j] * (weight[rows] if weight is not None else 1.0)
        out[int(j)] = rows[np.argsort(-s, kind="stable")[:per_cluster]]
    return out


def top_rows(priority: np.ndarray, pool: int) -> np.ndarray:
    """The ``pool`` rows of highest priority, priority descending (ties: lower row first)."""
    n = priority.shape[0]
    pool = min(n, pool)
    if pool <= 0:
        return np.zeros(0, dtype=np.int64)
    cand = np.argpartition(-priority, pool - 1)[:pool] if pool < n else np.arange(n)
    return cand[np.lexsort((cand, -priority[cand]))]


def balanced_top_rows(priority: np.ndarray, groups: np.ndarray, pool: int) -> np.ndarray:
    """The ``pool`` rows taken round robin over ``groups`` by priority, priority descending.

    Every group's highest priority first, then every group's second highest, and so on (within
    a round: higher priority first), so that no group (predicted class) fills the pool alone:
    class-balanced uncertainty sampling for skewed classes (Ertekin et al. 2007; Bengar et al.
    2022). Groups with fewer rows stop contributing when they run out.

    Parameters
    ----------
    priority : ndarray (n,)
    groups : ndarray (n,) of int
    pool : int

    Returns
    -------
    ndarray of at most ``pool`` row indices, priority descending (ties: lower row first)
    """
    n = priority.shape[0]
    pool = min(n, pool)
    if pool <= 0:
        return np.zeros(0, dtype=np.int64)
    rows = np.arange(n)
    by_group = np.lexsort((rows, -priority, groups))              # group, then priority descending
    g = groups[by_group]
    starts = np.r_[0, np.flatnonzero(g[1:] != g[:-1]) + 1]
    rank_in_group = rows - np.repeat(starts, np.diff(np.r_[starts, n]))
    order = by_group[np.lexsort((by_group, -priority[by_group], rank_in_group))]
    cand = order[:pool]
    return cand[np.lexsort((cand, -priority[cand]))]


def pool_clusters(G: np.ndarray, weights: np.ndarray, k: int, n_iter: int = POOL_KMEANS_ITER) -> np.ndarray:
    """Weighted kernel k-means of a small candidate pool given its cosine Gram matrix.

    Zhdanov (2019), "Diverse mini-batch active learning": cluster the most informative
    candidates into as many clusters as documents wanted, weighted by informativeness,
    and take one document per cluster. Deterministic: the first centre is the row of
    largest weight, each next one the row maximising ``weight * (1 - cosine to the
    nearest centre)`` (a weighted farthest-first traversal), then at most ``n_iter``
    assignment rounds in the kernel space (no dense centroids: the pool is small).

    Parameters
    ----------
    G : ndarray (m, m)
        Cosine similarities of the pool's (unit-norm) rows.
    weights : ndarray (m,)
        Non-negative weights (the priorities); all-zero weights count as equal.
    k : int
        Clusters (at most ``m``).
    n_iter : int

    Returns
    -------
    ndarray (m,) of int cluster codes in ``[0, k)``
    """
    G = np.asarray(G, dtype=np.float64)
    m = G.shape[0]
    k = max(1, min(int(k), m))
    if m == 0:
        return np.zeros(0, dtype=np.int64)
    w = np.clip(np.asarray(weights, dtype=np.float64), 0.0, None)
    w = w + (1e-9 * max(float(w.max()), 1.0))   # every row counts a little (zero priorities)
    centres = [int(np.argmax(w))]
    far = 1.0 - G[centres[0]]
    for _ in range(1, k):
        j = int(np.argmax(w * far))
        if far[j] <= 0.0:
            break   # the rest duplicate a centre
        centres.append(j)
        far = np.minimum(far, 1.0 - G[j])
    labels = np.asarray(G[:, centres].argmax(axis=1), dtype=np.int64)
    labels[centres] = np.arange(len(centres))
    k = len(centres)
    rows = np.arange(m)
    for _ in range(n_iter):
        H = np.zeros((m, k))
        H[rows, labels] = w
        mass = H.sum(axis=0)
        GH = G @ H                                   # (m, k): weighted similarity to each cluster's members
        within = np.einsum("ik,ik->k", H, GH)         # weighted similarity inside each cluster
        with np.errstate(divide="ignore", invalid="ignore"):
            # squared kernel distance to the weighted centre, minus the row's own constant term
            dist = within / mass ** 2 - 2.0 * GH / mass
        dist[:, mass == 0] = np.inf
        new = dist.argmin(axis=1)
        if np.array_equal(new, labels):
            break
        labels = new
    _, codes = np.unique(labels, return_inverse=True)
    return codes.astype(np.int64)


def centre_similarity(G: np.ndarray, weights: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Per row, its weighted mean cosine to the members of its cluster (itself included).

    Proportional to the row's cosine to the cluster's weighted centre (kernel form:
    ``sum_j w_j G[i, j] / sum_j w_j`` over the members ``j``).

    Parameters
    ----------
    G : ndarray (m, m) cosine similarities
    weights : ndarray (m,) non-negative
    labels : ndarray (m,) int cluster codes

    Returns
    -------
    ndarray (m,)
    """
    m = G.shape[0]
    if m == 0:
        return np.zeros(0)
    w = np.clip(np.asarray(weights, dtype=np.float64), 0.0, None) + 1e-12
    k = int(labels.max()) + 1
    H = np.zeros((m, k))
    H[np.arange(m), labels] = w
    return (np.asarray(G) @ H)[np.arange(m), labels] / H.sum(axis=0)[labels]


def select_diverse(priority: np.ndarray, Xn: sp.csr_matrix, groups: np.ndarray, top_n: int,
                   max_similarity: float = MAX_SIMILARITY, pool: int | None = None,
                   diversity: str | None = None, pinned: np.ndarray | None = None,
                   balance: str | None = None) -> np.ndarray:
    """Greedy choice of ``top_n`` rows by priority without near-duplicates, spread over groups.

    A row is skipped when its cosine (rows of ``Xn`` have unit norm) to a chosen row
    exceeds ``max_similarity``. A first pass takes at most ``ceil(top_n / groups present
    in the pool)`` rows per group; a second pass fills the list from the rest. The
    groups are ``groups`` (the predicted classes) with ``diversity="classes"``, or the
    ``top_n`` clusters of the pool (:func:`pool_clusters`, weighted by priority) with
    ``diversity="clusters"``: then the first pass takes the highest priority of each cluster.

    Parameters
    ----------
    priority : ndarray (n,)
    Xn : csr_matrix (n, d), unit-norm rows
    groups : ndarray (n,) of int
    top_n : int
    max_similarity : float
    pool : int, optional
        Only the ``pool`` highest priorities are considered (default ``POOL_FACTOR * top_n``).
    diversity : {"classes", "clusters", "centres"}, optional
        Default :data:`DIVERSITY`. ``"centres"``: the clusters of ``"clusters"``, the first
        pass taking each cluster's member nearest its weighted centre (:func:`centre_similarity`).
    pinned : ndarray (n,) of bool, optional
        ``"centres"``: rows the first pass takes before any other (discovered clusters'
        representatives), whatever their cluster's centre.
    balance : {"priority", "classes"}, optional
        How the pool is drawn (default :data:`POOL_BALANCE`): the highest priorities
        (:func:`top_rows`), or round robin over ``groups`` (:func:`balanced_top_rows`; a
        development variant, not better on the development corpora: benchmarks/active_learning.py).

    Returns
    -------
    ndarray of row indices, best first
    """
    n = priority.shape[0]
    if n == 0 or top_n <= 0:
        return np.zeros(0, dtype=np.int64)
    pool = min(n, pool or max(POOL_FACTOR * top_n, top_n))
    balance = POOL_BALANCE if balance is None else balance
    if balance not in POOL_BALANCE_MODES:
        raise ValueError(f"balance must be one of {POOL_BALANCE_MODES}, not {balance!r}")
    cand = balanced_top_rows(priority, groups, pool) if balance == "classes" else top_rows(priority, pool)
    G = np.asarray((Xn[cand] @ Xn[cand].T).todense())
    mode = DIVERSITY if diversity is None else diversity
    if mode not in DIVERSITY_MODES:
        raise ValueError(f"diversity must be one of {DIVERSITY_MODES}, not {mode!r}")
    g = groups[cand] if mode == "classes" else pool_clusters(G, priority[cand], top_n)
    first = np.arange(pool)
    if mode == "centres":   # first pass: pinned rows, then the rows nearest their cluster's weighted centre
        pin = np.zeros(pool) if pinned is None else np.asarray(pinned, dtype=bool)[cand].astype(np.float64)
        first = first[np.lexsort((first, -centre_similarity(G, priority[cand], g), -pin))]
    share = math.ceil(top_n / max(1, np.unique(g).size))
    chosen: list[int] = []
    taken = np.zeros(pool, dtype=bool)
    blocked = np.zeros(pool, dtype=bool)   # near-duplicate of a chosen row
    per_group: dict[int, int] = {}
    for capped in (True, False):
        for i in (first if capped else range(pool)):
            if len(chosen) >= top_n:
                break
            if taken[i] or blocked[i]:
                continue
            if capped and per_group.get(int(g[i]), 0) >= share:
                continue
            taken[i] = True
            chosen.append(i)
            per_group[int(g[i])] = per_group.get(int(g[i]), 0) + 1
            blocked |= G[i] > max_similarity
        if capped:   # the list is in priority order (the first pass' picks, then the second's)
            chosen.sort()
    return cand[np.asarray(chosen, dtype=np.int64)]


def rank(ids: Sequence[str], X: sp.spmatrix, primary: ModelView, others: Sequence[ModelView],
         seed_counts: Mapping[str, int], top_n: int, model_version: int, *,
         max_similarity: float = MAX_SIMILARITY, rare_below: int = RARE_BELOW,
         weights: Mapping[str, float] | None = None, density: bool = True,
         density_power: float | None = None, seeds_X: sp.spmatrix | None = None,
         coverage_power: float | None = None, diversity: str | None = None) -> list[Suggestion]:
    """Rank candidate documents for labelling.

    Parameters
    ----------
    ids : sequence of str
        Candidate (unlabelled window) documents.
    X : sparse matrix (n, d)
        Their term counts.
    primary : ModelView
        The primary model's probabilities on every candidate (``rows`` None).
    others : sequence of ModelView
        The other enabled algorithms, each on the candidate rows ``rows`` (a sample).
    seed_counts : mapping class -> seeds
    top_n : int
    model_version : int
    max_similarity, rare_below : see :func:`select_diverse`, :func:`rare_class_scores`
    weights : mapping reason -> weight (default :data:`WEIGHTS`)
    density : bool
        Multiply the priority by the typicality of the document in its predicted class.
    density_power : float, optional
        Exponent of the typicality factor (default :data:`DENSITY_POWER`).
    seeds_X : sparse matrix (m, d), optional
        Term counts of the seeded documents: the priority is multiplied by
        ``coverage ** coverage_power`` (:func:`coverage`), favouring regions no seed covers.
    coverage_power : float, optional
        Default :data:`COVERAGE_POWER` (0 = no coverage factor).
    diversity : {"classes", "clusters"}, optional
        How the list is spread (:func:`select_diverse`; default :data:`DIVERSITY`).

    Returns
    -------
    list of Suggestion, rank 0 first (at most ``top_n``)
    """
    n = len(ids)
    if n == 0 or top_n <= 0:
        return []
    w = dict(WEIGHTS, **(weights or {}))
    P = np.asarray(primary.proba, dtype=np.float64)
    classes = [str(c) for c in primary.classes]
    top = P.argmax(axis=1)
    Xn = normalize_rows(X)
    typical = typicality(Xn, top) if density else np.ones(n)
    scores = np.zeros((len(REASONS), n))
    scores[0] = 1.0 - np.clip(margins(P), 0.0, 1.0)
    primary_labels = np.asarray(classes, dtype=object)[top]
    votes: list[np.ndarray] = []
    for view in others:
        rows = np.arange(n) if view.rows is None else np.asarray(view.rows)
        vote = primary_labels.copy()           # rows outside the sample: no disagreement known
        vote[rows] = np.asarray([str(c) for c in view.classes], dtype=object)[np.asarray(view.proba).argmax(axis=1)]
        votes.append(vote)
    scores[1] = disagreement(primary_labels, votes, [view.credibility for view in others])
    scores[2] = rare_class_scores(P, classes, seed_counts, primary.new_clusters, rare_below)
    # new clusters: the most typical document of each discovered cluster, of every algorithm
    for view in (primary, *others):
        cols = [j for j, c in enumerate(view.classes) if str(c) in view.new_clusters]
        rows = np.arange(n) if view.rows is None else np.asarray(view.rows)
        reps = cluster_representatives(np.asarray(view.proba), cols, typical[rows])
        for picked in reps.values():
            scores[3, rows[picked]] = 1.0
    weighted = scores * np.array([w[r] for r in REASONS])[:, None]
    # representatives are typical by construction: their weight is added after the density factor
    power = DENSITY_POWER if density_power is None else density_power
    priority = weighted[:3].sum(axis=0) * typical ** power
    cpow = COVERAGE_POWER if coverage_power is None else coverage_power
    if cpow and seeds_X is not None and seeds_X.shape[0]:
        priority *= coverage(Xn, normalize_rows(seeds_X)) ** cpow
    priority += weighted[3]
    order = select_diverse(priority, Xn, top, min(top_n, MAX_TOP_N), max_similarity, diversity=diversity,
                           pinned=scores[3] > 0)
    reason = weighted.argmax(axis=0)
    out = []
    for r, i in enumerate(order):
        row = P[i]
        best = np.argsort(-row, kind="stable")[:SCORES_IN_MESSAGE]
        out.append(Suggestion(str(ids[i]), primary.name, classes[int(top[i])],
                              {classes[int(j)]: round(float(row[j]), 6) for j in best},
                              REASONS[int(reason[i])], round(float(priority[i]), 6), r, int(model_version)))
    return out


def candidate_sample(n: int, size: int | None = None, seed: int = 0) -> np.ndarray:
    """Sorted indices of at most ``size`` of ``n`` candidates, drawn at random (``seed``: the model version).

    Ranking every document of a large window would cost a ``predict_proba`` of the whole
    window per round (constrained k-means: a third of its refit on 10,000 documents); a
    fresh sample each round bounds the cost and still lets every document be suggested
    (random subsampling before uncertainty sampling: Ertekin et al. 2007).
    """
    size = CANDIDATE_SAMPLE if size is None else size
    if n <= size:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, size=size, replace=False))


def disagreement_sample(P: np.ndarray, size: int = DISAGREEMENT_SAMPLE) -> np.ndarray:
    """Rows the other algorithms are asked about: the ``size // 2`` smallest margins, then evenly spaced rows.

    Returns
    -------
    ndarray of at most ``size`` sorted row indices (every row when there are fewer)
    """
    n = P.shape[0]
    if n <= size:
        return np.arange(n)
    half = size // 2
    uncertain = np.argpartition(margins(P), half - 1)[:half]
    rest = np.setdiff1d(np.arange(n), uncertain)
    spaced = rest[np.linspace(0, rest.size - 1, size - half).astype(np.int64)]
    return np.union1d(uncertain, spaced)


class SuggestionBoard:
    """The suggestions published last and the changes to publish (upserts and tombstones).

    The refit thread :meth:`offer` s a new ranking (one reference assignment); the
    polling thread turns it into messages with :meth:`updates`. Bounded: at most
    ``top_n`` published entries and ``max_bytes`` accounted bytes (lower ranks are
    dropped first); the ids published earlier (:meth:`was_suggested`) at most
    ``RECENT_FACTOR * top_n`` (the newest; ids are at most 512 characters, so at most
    about 10 MB at the largest ``top_n``, 1,000).

    Parameters
    ----------
    top_n : int
    max_bytes : int, optional
        Default ``top_n * MESSAGE_BYTES_BUDGET``.
    """

    def __init__(self, top_n: int, max_bytes: int | None = None) -> None:
        self.top_n = int(top_n)
        self.max_bytes = int(max_bytes) if max_bytes is not None else self.top_n * MESSAGE_BYTES_BUDGET
        self.published: dict[str, dict[str, Any]] = {}
        self.nbytes = 0
        self.stale: set[str] = set()   # ids a previous run published (adopt): tombstoned when not re-ranked
        self._offered: list[Suggestion] | None = None
        # ids published before (insertion order = last published): a label of one came from the queue
        self._recent: dict[str, None] = {}

    def was_suggested(self, doc_id: str) -> bool:
        """Whether ``doc_id`` is, or lately was, on the published list (this run's or, adopted, the previous one's).

        A seed labelled from the queue is a document the primary model was unsure of (or the
        others disagreed on): the engine keeps its prequential check apart from the others,
        which estimate the accuracy on the stream (``Engine.held_out_accuracy``).
        """
        return doc_id in self.published or doc_id in self._recent or doc_id in self.stale

    def _remember(self, ids: Iterable[str]) -> None:
        recent = self._recent
        for k in ids:
            recent.pop(k, None)
            recent[k] = None
        excess = len(recent) - RECENT_FACTOR * max(self.top_n, 1)
        if excess > 0:
            for k in list(itertools.islice(recent, excess)):
                del recent[k]

    def offer(self, ranked: list[Suggestion]) -> None:
        """A new ranking (from any thread): published at the next :meth:`updates`."""
        self._offered = ranked

    def adopt(self, ids: Sequence[str]) -> int:
        """Ids whose suggestion a previous run left on the topic; returns how many are kept.

        They get a tombstone at the first :meth:`updates` where they are not open
        (no document in the window, or a seed), or at the first new ranking that does
        not list them. At most ``STALE_FACTOR * top_n`` (the newest) are kept.
        """
        keep = [k for k in ids if k not in self.published][-STALE_FACTOR * max(self.top_n, 1):]
        self.stale = set(keep)
        return len(self.stale)

    def forget(self) -> None:
        """Drop the published entries without tombstones (their topic was lost with the broker's data)."""
        self.published, self.nbytes = {}, 0

    def updates(self, text_of: Callable[[str], str | None], is_open: Callable[[str], bool],
                now: float) -> list[tuple[str, dict[str, Any] | None]]:
        """Messages to publish now: ``(id, message)`` upserts and ``(id, None)`` tombstones.

        A new ranking replaces the published list (tombstones for the ids that left it,
        ranks renumbered over the documents still open); without one, published
        documents that are no longer open (labelled, or out of the window) get a tombstone.

        Parameters
        ----------
        text_of : callable id -> text or None
        is_open : callable id -> bool
            The document is still in the window and has no seed label.
        now : float
            Time stamp of the messages.
        """
        ranked, self._offered = self._offered, None
        out: list[tuple[str, dict[str, Any] | None]] = []
        if ranked is None:
            if self.stale:
                stale_gone = sorted(k for k in self.stale if not is_open(k))
                self.stale.difference_update(stale_gone)
                out.extend((k, None) for k in stale_gone)
            gone = [k for k in self.published if not is_open(k)]
            if gone:   # a new dict: readers on other threads (HTTP) iterate the published one unlocked
                gone_set = set(gone)
                self._remember(gone)
                self.published = {k: m for k, m in self.published.items() if k not in gone_set}
                self.nbytes = sum(message_bytes(m) for m in self.published.values())
                out.extend((k, None) for k in gone)
            return out
        new: dict[str, dict[str, Any]] = {}
        nbytes = 0
        for s in ranked[: self.top_n]:
            if s.id in new or not is_open(s.id):
                continue
            msg = to_message(s, text_of(s.id), now)
            msg["rank"] = len(new)
            size = message_bytes(msg)
            if nbytes + size > self.max_bytes:
                break
            new[s.id] = msg
            nbytes += size
        out.extend((k, None) for k in self.published if k not in new)
        out.extend((k, None) for k in sorted(self.stale) if k not in new)
        self.stale = set()
        out.extend(new.items())
        self._remember(self.published)
        self.published, self.nbytes = new, nbytes
        return out


def snippet(text: str | None, chars: int = SNIPPET_CHARS) -> str:
    """The first ``chars`` characters of ``text`` with whitespace runs collapsed ("" for None)."""
    if not text:
        return ""
    return " ".join(text[: chars * 2].split())[:chars]


def to_message(s: Suggestion, text: str | None, ts: float) -> dict[str, Any]:
    """JSON body of a suggestion record (docs/schemas/suggestion.schema.json)."""
    return {"id": s.id, "snippet": snippet(text), "algorithm": s.algorithm, "label": s.label, "scores": s.scores,
            "reason": s.reason, "priority": s.priority, "rank": s.rank, "model_version": s.model_version, "ts": ts}


def message_bytes(msg: Mapping[str, Any]) -> int:
    """Accounted bytes of a kept suggestion message (its strings plus a fixed overhead)."""
    strings = [msg["id"], msg["snippet"], msg["algorithm"], msg["label"], *msg["scores"]]
    return SUGGESTION_OVERHEAD_BYTES + sum(len(s.encode("utf-8", "replace")) for s in strings)


__all__ = ["MAX_TOP_N", "REASONS", "ModelView", "Suggestion", "SuggestionBoard", "centre_similarity", "cluster_representatives", "coverage",
           "candidate_sample", "disagreement", "disagreement_sample",
           "margins", "message_bytes", "normalize_rows", "pool_clusters", "rank", "rare_class_scores", "select_diverse", "snippet",
           "to_message", "top_rows", "typicality"]
