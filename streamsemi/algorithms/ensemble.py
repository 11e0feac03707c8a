"""An ensemble of the registry's single-label algorithms, weighted by held-out seed accuracy.

No single algorithm wins on every corpus (docs/results.md): semi-LDC loses to constrained
k-means on Reuters top-10, CLE and FSL on R8, ... The seeds themselves say which
member suits the window at hand. :class:`Ensemble`

1. splits the seeds of every class round-robin into ``n_folds`` folds (after a
   seeded shuffle, so every fold holds seeds of the large classes; the shuffle orders
   the seeds by a salted hash of their contents, so the same window in any row order
   gets the same folds);
2. for each fold, refits every member on all documents with that fold's seeds
   hidden (they become unlabeled rows) and records which hidden seeds it predicts
   right (``predict`` of those rows). A hidden seed whose class has no seed left in
   the fold is not scored: no member can predict it, so it would only flatten every
   member's score alike (with one seed per class nothing is scored and the weights
   are equal). Summed over folds: each member's held-out accuracy ``a_m``
   (``heldout_score``);
3. shrinks it toward each member's prior advantage ``p_m`` (:data:`DEFAULT_PRIOR`,
   measured on development draws) as if ``prior_seeds`` more seeds had scored it:
   ``s_m = (n a_m + prior_seeds p_m) / (n + prior_seeds)`` with ``n`` scored seeds
   (:func:`shrink_to_prior`; with none scored the prior decides);
   then weights the members by a softmax of that score,
   ``w_m = exp((s_m - max_j s_j) / temperature) / sum(...)``: at the default
   temperature of 0.02 a member 0.05 below the best keeps ``exp(-2.5) = 8%`` of
   the best one's weight, one 0.1 below keeps 0.7%; ``temperature`` large gives
   the plain average, small the held-out winner;
4. refits every member once on all seeds and pools their ``predict_proba`` with
   those weights over the seeded classes (columns of discovered ``new-N`` clusters are
   dropped and each member's rows renormalised: members are built with
   ``n_new_clusters=0`` where they take it, so there are none by default). The members'
   probabilities are on different scales (CLE's label-propagation scores have a mean top
   probability of 0.13-0.34 in 500-document R52 windows, Semi-LDC's 0.95-0.98), so under a
   plain weighted mean a sharp member with 3% of the weight overrules a spread one with
   94%. By default (``pooling="tempered"``) each member's probabilities are first raised
   to a power ``a_m`` and renormalised (temperature scaling, ``1 / a_m`` the temperature),
   ``a_m`` chosen at fit time so that the member's mean top probability over the window
   equals the members' average one (:func:`tempering_powers`, :func:`temper`); each member
   keeps its own ranking of confident and doubtful documents. ``pooling="mean"`` is the
   plain weighted mean.

Cost: ``(n_folds + 1)`` fits of every member. A member that fails on the full
seeds (``DegenerateInputError`` on a tiny window, ...) gets weight 0 and is
listed in ``member_errors_``; one that fails on a fold scores 0 on that fold's
seeds.
"""

from __future__ import annotations

import hashlib
from numbers import Integral, Real
from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted

from streamsemi.algorithms.base import (
    RANDOM_STATE,
    DegenerateInputError,
    DerivedArrays,
    ScoresClassifierMixin,
    StreamsemiEstimator,
)

#: The single-label paper algorithms but D-LDA, and the baseline they must beat. D-LDA is not a
#: default member: it is the best of the five former members in no cell of the robustness
#: protocol (quick or full mode) and is 0.089 below their mean on the development draws, yet
#: on skewed corpora its class prior from the seed proportions puts most held-out seeds in the large
#: classes, so its held-out *accuracy* ranks first while its macro-F1 ranks last: it took 0.97 of the
#: weight on full-size R52 at 1%. Without it the ensemble was within 0.01 of the best member on all 12
#: full-size development draws (seed 7, 1.5% / 3%; with it 6 of 12 more than 0.01 below, mean -0.031)
#: and unchanged on the 24 draws of 1,200 documents (``benchmarks/ensemble_dev.py`` (in git: docs/decisions.md);
#: docs/algorithms/ensemble.md). ``members=[..., "d-lda"]`` still takes it.
DEFAULT_MEMBERS: tuple[str, ...] = ("semi-ldc", "cle", "fsl-ck", "constrained-kmeans")

#: Parameters of members that differ from their own defaults (``member_params`` overrides them).
#: Semi-LDC keeps a PCA cap of 300 instead of its own ``max_components="auto"``: on the
#: 8 full-size development draws (seed 7, 1.5% / 3%, ``benchmarks/ensemble_dev.py`` (in git: docs/decisions.md)) the ensemble
#: with the auto-cap member was 0.037 below its best member on top-30 1.5% (its held-out
#: *accuracy* passed CLE's while its macro-F1 did not: mean -0.001) and with the 300 cap within
#: 0.01 on all 8 (mean +0.005); the member is fitted ``n_folds + 1`` times, and the cap of 300
#: makes those fits 1.5-3x cheaper on whole corpora. docs/algorithms/ensemble.md.
#: FSL-CK keeps the paper's full loop (``round_selection="all"``): with its held-out round
#: selection as a member, the ensemble's full-mode robustness column was 5 cells more than 0.01 below the
#: best single algorithm instead of 4 (mean gap -0.002 instead of +0.001; Reuters top-30-short30 1%
#: 0.508 -> 0.477) and its fits took 1.6x as long: the ensemble already weighs its members on held-out
#: seeds, and the selected member is nearer constrained k-means, which the ensemble also holds
#: (``benchmarks/results/robustness_full_ensemble_s30_rounds.json``). FSL's own default round by window size as a member gave
#: the same mean on whole-corpus development draws at 1.5-1.8x the fit time (docs/algorithms/ensemble.md).
#: Constrained k-means gives a class several times the mean class size as many centroids
#: (``prototypes="by-size"``, as in the daemon): on the whole-corpus development draws (seed 7,
#: R8 / R52 / top-30 at 2% and 3%) the ensemble gained +0.023 to +0.050 on five of six draws and
#: +0.000 on the sixth; the robustness protocol's baseline stays the one-centroid algorithm.
DEFAULT_MEMBER_PARAMS: dict[str, dict[str, Any]] = {"semi-ldc": {"max_components": 300},
                                                    "fsl-ck": {"round_selection": "all"},
                                                    "constrained-kmeans": {"prototypes": "by-size"}}

#: Each member's mean macro-F1 minus the mean of five members (these four and D-LDA) on the same draw, over the 24
#: development draws of ``benchmarks/ensemble_dev.py`` (in git: docs/decisions.md) (seed 7; 1.5/2/3% seeds; 1,200 documents of
#: R8, 20NG, R52, Reuters top-30, R8 and 20NG and top-30 in 500-document windows, R52 cut to 30
#: words; ``benchmarks/results/ensemble_dev.json``). Draws the robustness protocol does not report.
DEFAULT_PRIOR: dict[str, float] = {"semi-ldc": 0.018, "cle": 0.062, "d-lda": -0.089, "fsl-ck": 0.017,
                                   "constrained-kmeans": -0.008}


def seed_folds(codes: np.ndarray, n_folds: int, rng: np.random.Generator,
               keys: np.ndarray | None = None) -> np.ndarray:
    """Fold of every seed row (``-1`` for unlabeled rows): each class's seeds, shuffled, are
    dealt round-robin, the deal of each class starting where the previous one stopped, so
    fold sizes differ by at most one and a class with ``s`` seeds is in ``min(s, n_folds)``
    folds.

    ``keys`` (uint64 per row, :func:`row_keys`): the shuffle is the order of the keys mixed
    with one salt drawn from ``rng``, so the deal follows the seeds' contents, not their
    positions: the same window in any row order gets the same folds (rows with equal keys,
    identical documents, keep their order).
    """
    folds = np.full(codes.size, -1, dtype=np.int64)
    salt = np.uint64(rng.integers(0, 2**63)) if keys is not None else None
    start = 0
    for c in np.unique(codes[codes >= 0]):
        members = np.flatnonzero(codes == c)
        if keys is None:
            members = rng.permutation(members)
        else:
            members = members[np.argsort(_mix(keys[members] ^ salt), kind="stable")]
        folds[members] = (start + np.arange(members.size)) % n_folds
        start = (start + members.size) % n_folds
    return folds


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a salted key order that is a fresh shuffle for every salt."""
    x = np.asarray(x, dtype=np.uint64).copy()
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return x


def row_keys(X: sp.csr_matrix, rows: np.ndarray) -> np.ndarray:
    """A 64-bit hash of the content (column indices and values) of each of ``rows`` of ``X``
    (0 for the other rows): equal rows get equal keys whatever their position."""
    keys = np.zeros(X.shape[0], dtype=np.uint64)
    indptr = X.indptr
    for r in rows:  # seeds only: a few thousand short rows
        lo, hi = indptr[r], indptr[r + 1]
        order = np.argsort(X.indices[lo:hi], kind="stable")
        h = hashlib.blake2b(np.asarray(X.indices[lo:hi][order], dtype=np.int64).tobytes(), digest_size=8)
        h.update(np.asarray(X.data[lo:hi][order], dtype=np.float64).tobytes())
        keys[r] = int.from_bytes(h.digest(), "little")
    return keys


def accuracy_weights(accuracy: np.ndarray, temperature: float) -> np.ndarray:
    """Softmax of held-out accuracies at ``temperature`` (sums to 1; NaN accuracy = weight 0)."""
    acc = np.asarray(accuracy, dtype=np.float64)
    ok = np.isfinite(acc)
    if not ok.any():
        raise DegenerateInputError("no ensemble member could be fitted")
    w = np.zeros(acc.size)
    w[ok] = np.exp((acc[ok] - acc[ok].max()) / temperature)
    return w / w.sum()


def temper(P: np.ndarray, power: float) -> np.ndarray:
    """``P ** power`` with every row scaled to sum 1 (computed in log space; zeros stay 0 for
    ``power > 0``; ``power = 1`` returns the rows of ``P`` renormalised)."""
    return _temper_log(_log(P), power)


def _log(P: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log(np.asarray(P, dtype=np.float64))


def _temper_log(logP: np.ndarray, power: float) -> np.ndarray:
    """:func:`temper` from ``log P`` (the bisection of :func:`tempering_powers` takes the log once)."""
    Z = power * logP
    Z -= Z.max(axis=1, keepdims=True)
    E = np.exp(Z)
    return E / E.sum(axis=1, keepdims=True)


def mean_top(P: np.ndarray) -> float:
    """Mean over rows of the largest probability."""
    return float(np.asarray(P).max(axis=1).mean())


def tempering_powers(probas: list[np.ndarray], *, bounds: tuple[float, float] = (1e-3, 1e3)) -> np.ndarray:
    """Each member's power ``a_m`` such that ``mean_top(temper(P_m, a_m))`` equals the mean over
    members of ``mean_top(P_m)``.

    ``mean_top(temper(P, a))`` does not decrease with ``a``: as ``a -> 0`` every row tends to
    uniform over its non-zero entries, as ``a`` grows to uniform over the entries tied at its
    maximum. So the power is found by bisection on ``log a`` within ``bounds``; a target the
    member cannot reach gets the nearer bound.

    Parameters
    ----------
    probas : list of ndarray of shape (n_samples, n_classes)
        Each member's probabilities of the same documents (the fit window).
    bounds : (float, float)
        Smallest and largest power.

    Returns
    -------
    ndarray of shape (n_members,)
    """
    target = float(np.mean([mean_top(P) for P in probas]))
    lo_b, hi_b = np.log(bounds[0]), np.log(bounds[1])
    powers = np.ones(len(probas))
    for m, P in enumerate(probas):
        logP = _log(P)
        lo, hi = lo_b, hi_b
        if mean_top(_temper_log(logP, np.exp(hi))) <= target:
            powers[m] = np.exp(hi)
            continue
        if mean_top(_temper_log(logP, np.exp(lo))) >= target:
            powers[m] = np.exp(lo)
            continue
        for _ in range(40):  # the bracket on log a shrinks from 13.8 to 13.8 / 2**40
            mid = 0.5 * (lo + hi)
            if mean_top(_temper_log(logP, np.exp(mid))) < target:
                lo = mid
            else:
                hi = mid
        powers[m] = np.exp(0.5 * (lo + hi))
    return powers


def pool_members(probas: list[np.ndarray], weights: np.ndarray, powers: np.ndarray | None = None) -> np.ndarray:
    """Pool the members' class probabilities with their weights (rows sum to 1).

    Parameters
    ----------
    probas : list of ndarray of shape (n_samples, n_classes)
        Each member's probabilities over the same classes (rows sum to 1).
    weights : ndarray of shape (n_members,)
        The members' weights (sum 1; a member with weight 0 is skipped).
    powers : ndarray of shape (n_members,) or None
        Each member's tempering power (:func:`tempering_powers`): ``sum_m w_m temper(P_m, a_m)``.
        None: the plain weighted mean ``sum_m w_m P_m``.

    Returns
    -------
    ndarray of shape (n_samples, n_classes)
    """
    powers = np.ones(len(probas)) if powers is None else np.asarray(powers, dtype=np.float64)
    used = [(float(w), P, float(a)) for w, P, a in zip(weights, probas, powers, strict=True) if w > 0]
    if not used:
        raise DegenerateInputError("no ensemble member has weight")
    out = sum(w * (np.asarray(P, dtype=np.float64) if a == 1.0 else temper(P, a)) for w, P, a in used)
    return out / out.sum(axis=1, keepdims=True)


def shrink_to_prior(score: np.ndarray, n: int, prior: np.ndarray, prior_seeds: float) -> np.ndarray:
    """``(n * score + prior_seeds * prior) / (n + prior_seeds)``: a held-out score from ``n`` seeds
    shrunk toward the prior as if ``prior_seeds`` more seeds had scored it (NaN stays NaN; with
    ``n + prior_seeds == 0`` the score itself)."""
    score = np.asarray(score, dtype=np.float64)
    if n + prior_seeds <= 0:
        return score.copy()
    return (n * score + prior_seeds * np.asarray(prior, dtype=np.float64)) / (n + prior_seeds)


def heldout_scores(correct: np.ndarray, predicted: np.ndarray, support: np.ndarray, score: str) -> np.ndarray:
    """Each member's held-out score from its per-class counts over the held-out seeds.

    Parameters
    ----------
    correct : ndarray of shape (n_members, n_classes)
        Held-out seeds of class ``k`` the member predicted right.
    predicted : ndarray of shape (n_members, n_classes)
        Held-out seeds the member predicted as class ``k`` (right or wrong).
    support : ndarray of shape (n_classes,)
        Scored held-out seeds of class ``k``.
    score : {"accuracy", "balanced_accuracy", "macro_f1"}
        ``accuracy``: ``sum_k correct_k / sum_k support_k``; ``balanced_accuracy``: the mean
        over classes with support of ``correct_k / support_k``; ``macro_f1``: the mean over
        classes with support of ``F1_k = 2 correct_k / (support_k + predicted_k)`` (a member
        that puts the seeds of small classes into a large one loses both their recall and the
        large class's precision, which accuracy does not see).

    Returns
    -------
    ndarray of shape (n_members,)
        All 0 when no seed could be scored (every class had a single seed).
    """
    correct = np.asarray(correct, dtype=np.float64)
    support = np.asarray(support, dtype=np.float64)
    if not support.any():
        return np.zeros(correct.shape[0])
    if score == "accuracy":
        return correct.sum(axis=1) / support.sum()
    has = support > 0
    if score == "balanced_accuracy":
        return (correct[:, has] / support[has]).mean(axis=1)
    f1 = 2.0 * correct[:, has] / (support[has] + np.asarray(predicted, dtype=np.float64)[:, has])
    return f1.mean(axis=1)


#: per fitted ensemble, the pooled probabilities of its fit window (:meth:`Ensemble.fitted_proba`)
_FITTED_PROBA: DerivedArrays[np.ndarray | None] = DerivedArrays()


class Ensemble(ScoresClassifierMixin, StreamsemiEstimator):
    """Single-label algorithms' probabilities pooled with weights from held-out seeds.

    Parameters
    ----------
    members : list of str or None, default=None
        Registry names of single-label algorithms (None: :data:`DEFAULT_MEMBERS`).
    n_folds : int >= 2, default=3
        Folds of the seeds for the held-out accuracy.
    temperature : float > 0, default=0.02
        Softmax temperature over the members' held-out accuracies.
    member_params : dict or None, default=None
        ``{registry name: {parameter: value}}`` passed to the members, over
        :data:`DEFAULT_MEMBER_PARAMS` (Semi-LDC with ``max_components=300``, FSL-CK with
        ``round_selection="all"``, constrained k-means with ``prototypes="by-size"``).
    prior : dict or None, default=None
        ``{member: advantage}``: what each member is expected to score above the members'
        average before any seed of the window is seen (None: :data:`DEFAULT_PRIOR`,
        measured on development draws; a member it does not name gets 0).
    prior_seeds : float >= 0, default=30
        How many held-out seeds the prior counts as: a member's score is
        ``(hits + prior_seeds * prior) / (scored + prior_seeds)``, so with few scored
        seeds (one seed per class: none) the prior decides, with many the seeds do.
        0: the held-out score alone. With ``heldout_score="balanced_accuracy"`` the
        count is of scored classes instead of seeds. 30 was chosen on development draws (seeds 8 and
        9 of ``benchmarks/ensemble_dev.py`` (in git: docs/decisions.md); docs/algorithms/ensemble.md): mean gap to
        the best member -0.015 / -0.020 against -0.028 / -0.042 without the prior.
    heldout_score : {"accuracy", "balanced_accuracy", "macro_f1"}, default="accuracy"
        Held-out score of a member (:func:`heldout_scores`): the share of the held-out
        seeds it gets right, the mean over classes of that share per class, or the
        macro-F1 of its held-out predictions. The last two follow macro-F1 more closely
        but rest on one or two seeds per small class: on development draws (R8 and 20NG,
        seed 7, 2%/3% seeds, 1,200 documents) the ensemble was 0.016 below the best member
        on average with ``accuracy`` (worst 0.037) and 0.028 (worst 0.139) with
        ``balanced_accuracy``; on the 24 + 12 draws of ``benchmarks/ensemble_dev.py`` (in git: docs/decisions.md)
        ``macro_f1`` was below the best member by more than 0.01 on 16 + 6
        draws, ``accuracy`` on 9 + 0 (default members).
    pooling : {"tempered", "mean"}, default="tempered"
        How the members' probabilities are combined (:func:`pool_members`): each member's
        probabilities tempered to the members' average mean top probability on the fit
        window (:func:`tempering_powers`), then the weighted mean; or the plain weighted
        mean. ``tempered`` was chosen on development draws no protocol reports (seed 7;
        docs/algorithms/ensemble.md): ensemble minus the best member, mean
        over 24 draws of 1,200 documents, 36 full-size 500-document-window and 30-word
        draws and 8 whole-corpus draws: +0.002 / +0.003 / +0.006 against -0.003 / -0.004
        / +0.003 with ``mean``.
    random_state : int >= 0 or None, default=0
        Seed of the fold split, passed to every member that takes one.

    Attributes
    ----------
    classes_ : ndarray of str
        The seeded classes.
    new_clusters_ : list of str
        Always empty.
    members_ : list of str
        The members, in order.
    estimators_ : list
        Each member fitted on all seeds (None where the fit failed).
    heldout_accuracy_ : ndarray of shape (n_members,)
        Accuracy on the held-out seeds (NaN where the full fit failed).
    heldout_scored_ : int
        Held-out seeds that could be scored (their class kept a seed in the fold).
    heldout_correct_ : ndarray of shape (n_members, n_classes)
        Scored held-out seeds of each class each member predicted right.
    heldout_predicted_ : ndarray of shape (n_members, n_classes)
        Scored held-out seeds each member predicted as each class.
    heldout_support_ : ndarray of shape (n_classes,)
        Scored held-out seeds of each class.
    scores_ : ndarray of shape (n_members,)
        The score the weights are a softmax of: the held-out score shrunk toward the
        prior (``prior_seeds``); NaN where the full fit failed.
    weights_ : ndarray of shape (n_members,)
        The members' weights (sum 1).
    powers_ : ndarray of shape (n_members,)
        Each member's tempering power (1 for ``pooling="mean"`` and for failed members).
    member_errors_ : dict
        Member -> ``"ExceptionType: message"`` of a failed full fit.
    n_features_in_ : int
    """

    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        "members": [list, None],
        "n_folds": [Interval(Integral, 2, None, closed="left")],
        "temperature": [Interval(Real, 0, None, closed="neither")],
        "member_params": [dict, None],
        "prior": [dict, None],
        "prior_seeds": [Interval(Real, 0, None, closed="left")],
        "heldout_score": [StrOptions({"balanced_accuracy", "accuracy", "macro_f1"})],
        "pooling": [StrOptions({"tempered", "mean"})],
        "random_state": RANDOM_STATE,
    }

    def __init__(self, members: list[str] | None = None, *, n_folds: int = 3, temperature: float = 0.02,
                 member_params: dict[str, dict[str, Any]] | None = None, prior: dict[str, float] | None = None,
                 prior_seeds: float = 30.0, heldout_score: str = "accuracy", pooling: str = "tempered",
                 random_state: int | None = 0) -> None:
        self.members = members
        self.n_folds = n_folds
        self.temperature = temperature
        self.member_params = member_params
        self.prior = prior
        self.prior_seeds = prior_seeds
        self.heldout_score = heldout_score
        self.pooling = pooling
        self.random_state = random_state

    def _member_names(self) -> list[str]:
        return list(DEFAULT_MEMBERS if self.members is None else self.members)

    def _check_param_combination(self) -> None:
        from streamsemi.algorithms import MULTILABEL, REGISTRY

        names = self._member_names()
        if not names:
            raise ValueError("members must name at least one algorithm, got []")
        bad = [n for n in names if n not in REGISTRY or n == "ensemble" or n in MULTILABEL]
        if bad:
            raise ValueError(f"members must be single-label registry algorithms other than 'ensemble', "
                             f"got {bad}")
        unknown = sorted(set(self.member_params or {}) - set(names))
        if unknown:
            raise ValueError(f"member_params names algorithms that are not members: {unknown}")

    def _make_member(self, name: str) -> Any:
        from streamsemi.algorithms import accepts_param, algorithm_class

        cls, fixed = algorithm_class(name)
        if accepts_param(cls, "n_new_clusters"):
            fixed["n_new_clusters"] = 0
        if accepts_param(cls, "random_state"):
            fixed["random_state"] = self.random_state
        fixed.update(DEFAULT_MEMBER_PARAMS.get(name, {}))
        fixed.update((self.member_params or {}).get(name, {}))
        return cls(**fixed)

    def fit(self, X: Any, y: Any) -> Ensemble:
        """Score every member on held-out seeds, then fit each on all seeds.

        Parameters
        ----------
        X : sparse matrix of shape (n_samples, n_features)
            Term counts.
        y : array-like of shape (n_samples,)
            Seed label per row; None / -1 / "" for unlabeled rows.
        """
        X, codes, classes = self._fit_inputs(X, y)
        names = self._member_names()
        rng = np.random.default_rng(self.random_state)
        # dealt by the seeds' contents: a worker's window holds documents in the order they were consumed,
        # which differs between runs and between workers; the held-out weights should not
        folds = seed_folds(codes, int(self.n_folds), rng, keys=row_keys(X, np.flatnonzero(codes >= 0)))
        labels = np.where(codes >= 0, classes[np.maximum(codes, 0)], None).astype(object)
        # correct[m, k]: member m's correct predictions of held-out seeds of class k;
        # scored[k]: held-out seeds of class k whose class kept a seed in the fold's fit
        correct = np.zeros((len(names), classes.size))
        predicted = np.zeros((len(names), classes.size))  # held-out seeds each member put in class k
        scored = np.zeros(classes.size)
        for f in range(int(self.n_folds)):
            train_classes = np.unique(codes[(codes >= 0) & (folds != f)])
            # a held-out seed of a class with no seed left in the fold cannot be predicted by any
            # member: scoring it would only flatten every member's score alike
            held = np.flatnonzero((folds == f) & np.isin(codes, train_classes))
            if held.size == 0 or train_classes.size < 2:
                continue
            scored += np.bincount(codes[held], minlength=classes.size)
            y_fold = labels.copy()
            y_fold[folds == f] = None
            for m, name in enumerate(names):
                try:
                    pred = self._make_member(name).fit(X, y_fold).predict(X[held])
                except (DegenerateInputError, ValueError):
                    continue  # scores 0 on this fold's seeds
                pred = np.asarray(pred, dtype=object)
                hit = pred == labels[held]
                correct[m] += np.bincount(codes[held], weights=hit.astype(np.float64), minlength=classes.size)
                predicted[m] += (pred[:, None] == classes[None, :]).sum(axis=0)
        self.heldout_correct_, self.heldout_predicted_, self.heldout_support_ = correct, predicted, scored
        accuracy = heldout_scores(correct, predicted, scored, self.heldout_score)
        self.estimators_: list[Any] = []
        self.member_errors_: dict[str, str] = {}
        for m, name in enumerate(names):
            try:
                self.estimators_.append(self._make_member(name).fit(X, labels))
            except (DegenerateInputError, ValueError) as exc:
                self.estimators_.append(None)
                self.member_errors_[name] = f"{type(exc).__name__}: {exc}"
                accuracy[m] = np.nan
        n_scored = int(scored.sum()) if self.heldout_score in ("accuracy", "macro_f1") else int((scored > 0).sum())
        self.scores_ = shrink_to_prior(accuracy, n_scored, self._prior_of(names), float(self.prior_seeds))
        self.weights_ = accuracy_weights(self.scores_, float(self.temperature))
        self.heldout_accuracy_ = accuracy
        self.heldout_scored_ = int(scored.sum())
        self.members_ = names
        self.new_clusters_: list[str] = []
        self.classes_ = classes
        self.powers_ = np.ones(len(names))
        fitted = [m for m, est in enumerate(self.estimators_) if est is not None]
        _FITTED_PROBA.drop(self)
        if self.pooling == "tempered" and len(fitted) > 1:
            probas = {m: self._member_proba(self.estimators_[m], X) for m in fitted}
            self.powers_[fitted] = tempering_powers([probas[m] for m in fitted])
            # the pooled probabilities of the fit window come from the members' probabilities the powers
            # needed: the engine's scores of its snapshot (fitted_proba) then cost no second prediction
            used = self._used_members()
            pooled = pool_members([probas[m] for m in used], self.weights_[used], self.powers_[used])
            _FITTED_PROBA.get(self, (self.powers_, self.weights_), lambda: pooled)
        return self

    def _used_members(self) -> list[int]:
        """Members that take part in the pooling: fitted, with a positive weight."""
        return [m for m, est in enumerate(self.estimators_) if est is not None and self.weights_[m] > 0]

    def fitted_proba(self) -> np.ndarray | None:
        """``predict_proba`` of the rows the model was fitted on, kept from ``fit`` (tempered
        pooling computes every member's probabilities of them), or None when ``fit`` did not
        keep them (plain mean pooling, one member, a model restored from a checkpoint).

        Equal to ``predict_proba(X_fit)``; kept outside the fitted attributes
        (:class:`~streamsemi.algorithms.base.DerivedArrays`), so checkpoints and
        publications do not grow.
        """
        check_is_fitted(self)
        return _FITTED_PROBA.get(self, (getattr(self, "powers_", None), self.weights_), lambda: None)

    def _fit_summary(self) -> dict[str, Any]:
        """Each member's weight and held-out score (a member whose fit failed: weight 0, score
        ``None``, named in ``failed``), and how many held-out seeds were scored."""

        def num(v: float) -> float | None:
            return None if not np.isfinite(v) else round(float(v), 4)

        return {"weights": {n: num(w) for n, w in zip(self.members_, self.weights_, strict=True)},
                "heldout_scores": {n: num(a) for n, a in zip(self.members_, self.heldout_accuracy_, strict=True)},
                "heldout_seeds": int(self.heldout_scored_), "failed": sorted(self.member_errors_)}

    def _prior_of(self, names: list[str]) -> np.ndarray:
        prior = DEFAULT_PRIOR if self.prior is None else self.prior
        return np.array([float(prior.get(n, 0.0)) for n in names])

    def _member_proba(self, est: Any, X: Any) -> np.ndarray:
        """``est.predict_proba(X)`` over ``classes_`` (new clusters dropped, rows renormalised)."""
        P = np.asarray(est.predict_proba(X), dtype=np.float64)
        index = {str(c): j for j, c in enumerate(est.classes_)}
        out = np.zeros((X.shape[0], self.classes_.size))
        for k, c in enumerate(self.classes_):
            if str(c) in index:
                out[:, k] = P[:, index[str(c)]]
        total = out.sum(axis=1, keepdims=True)
        return np.divide(out, total, out=np.full_like(out, 1.0 / self.classes_.size), where=total > 0)

    def predict_proba(self, X: Any) -> np.ndarray:
        """The members' class probabilities pooled with their weights (:func:`pool_members`;
        columns follow ``classes_``)."""
        X = self._validate_counts(X, reset=False)
        used = self._used_members()
        # a model restored from a checkpoint of an earlier version has no powers_: it pools by the plain mean
        powers = getattr(self, "powers_", None)
        return pool_members([self._member_proba(self.estimators_[m], X) for m in used],
                            self.weights_[used], None if powers is None else powers[used])

    def _scores(self, X: Any) -> np.ndarray:
        return self.predict_proba(X)

    def _explain_weights(self) -> np.ndarray:
        """Members' word weights, each row scaled to sum 1, averaged with the members' weights."""
        W = np.zeros((self.classes_.size, int(self.n_features_in_)))
        for w, est in zip(self.weights_, self.estimators_, strict=True):
            if est is None or w == 0:
                continue
            M = est._explain_weights()
            M = np.asarray(M.todense() if hasattr(M, "todense") else M, dtype=np.float64)
            M = np.maximum(M, 0.0)
            index = {str(c): j for j, c in enumerate(est.classes_)}
            for k, c in enumerate(self.classes_):
                if str(c) in index:
                    row = M[index[str(c)]]
                    W[k] += w * row / max(row.sum(), 1e-300)
        return W


__all__ = ["DEFAULT_MEMBERS", "DEFAULT_MEMBER_PARAMS", "Ensemble", "accuracy_weights", "heldout_scores",
           "pool_members", "row_keys", "seed_folds", "temper", "tempering_powers"]
