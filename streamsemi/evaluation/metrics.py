"""Clustering and classification quality metrics, implemented once.

All functions take plain label sequences (any hashable values). Cluster ids in
``y_pred`` need not be class names; where a metric needs a correspondence it says
which one it builds (majority mapping or Hungarian matching).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linear_sum_assignment
from scipy.special import xlogy
from sklearn.metrics import f1_score, normalized_mutual_info_score, roc_auc_score

from streamsemi.evaluation.errors import EvaluationError


def contingency(y_true: Sequence[Any], y_pred: Sequence[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Contingency table ``C[i, j]`` = #docs of class ``classes[i]`` in cluster ``clusters[j]``."""
    yt = np.asarray([str(v) for v in y_true])
    yp = np.asarray([str(v) for v in y_pred])
    if yt.shape != yp.shape:
        raise EvaluationError(f"y_true has {yt.size} elements, y_pred has {yp.size}")
    if yt.size == 0:
        raise EvaluationError("cannot score an empty set of documents")
    classes, ti = np.unique(yt, return_inverse=True)
    clusters, pi = np.unique(yp, return_inverse=True)
    C = np.zeros((classes.size, clusters.size))
    np.add.at(C, (ti, pi), 1.0)
    return C, classes, clusters


def map_clusters(y_true: Sequence[Any], y_pred: Sequence[Any]) -> np.ndarray:
    """Relabel predictions as classes.

    A predicted value that is itself a class name is kept (semi-supervised
    algorithms predict seeded class names); any other cluster id is mapped to the
    majority true class of its members.
    """
    C, classes, clusters = contingency(y_true, y_pred)
    names = set(classes.tolist())
    mapping = {c: (c if c in names else classes[int(np.argmax(C[:, j]))]) for j, c in enumerate(clusters)}
    return np.asarray([mapping[str(v)] for v in y_pred])


def macro_f1(y_true: Sequence[Any], y_pred: Sequence[Any]) -> float:
    """Macro-averaged F1 over the true classes after :func:`map_clusters`."""
    yt = np.asarray([str(v) for v in y_true])
    yp = map_clusters(yt, y_pred)
    return float(f1_score(yt, yp, labels=np.unique(yt), average="macro", zero_division=0))


def macro_f1_known(y_true: Sequence[Any], y_pred: Sequence[Any], known: Sequence[Any]) -> float:
    """Macro-F1 over the ``known`` classes only, predictions taken as they are (D-LDA).

    Per known class ``k``: precision over all documents predicted ``k`` (of any
    true class), recall over all documents of class ``k``; a document of a known
    class put into a new cluster counts as missed. No cluster mapping is done.
    """
    yt = np.asarray([str(v) for v in y_true])
    yp = np.asarray([str(v) for v in y_pred])
    if yt.shape != yp.shape:
        raise EvaluationError(f"y_true has {yt.size} elements, y_pred has {yp.size}")
    labels = np.asarray(sorted({str(k) for k in known}))
    if labels.size == 0:
        raise EvaluationError("no known class to score")
    return float(f1_score(yt, yp, labels=labels, average="macro", zero_division=0))


def accuracy_hungarian(y_true: Sequence[Any], y_pred: Sequence[Any]) -> float:
    """Accuracy under the best one-to-one class/cluster matching (Kuhn-Munkres)."""
    C, _, _ = contingency(y_true, y_pred)
    rows, cols = linear_sum_assignment(C, maximize=True)
    return float(C[rows, cols].sum() / C.sum())


def nmi(y_true: Sequence[Any], y_pred: Sequence[Any], average: str) -> float:
    """Normalised mutual information; ``average`` is ``"max"`` (CLE) or ``"arithmetic"`` (D-LDA)."""
    if average not in {"max", "arithmetic", "geometric", "min"}:
        raise EvaluationError(f"unknown NMI normalisation {average!r}")
    yt = [str(v) for v in y_true]
    yp = [str(v) for v in y_pred]
    return float(normalized_mutual_info_score(yt, yp, average_method=average))


def pairwise_prf(y_true: Sequence[Any], y_pred: Sequence[Any]) -> tuple[float, float, float]:
    """Pairwise precision, recall and F over all unordered document pairs.

    A pair is positive when both documents share a cluster (prediction) or a class
    (truth). Precision = same-class pairs among same-cluster pairs; recall = the
    converse. Undefined ratios (no pairs) count as 0.
    """
    C, _, _ = contingency(y_true, y_pred)

    def pairs(a: np.ndarray) -> float:  # ordered pairs: twice the unordered ones, same ratios
        return float((a * (a - 1)).sum())

    tp = pairs(C)
    pred = pairs(C.sum(axis=0))
    true = pairs(C.sum(axis=1))
    p = tp / pred if pred else 0.0
    r = tp / true if true else 0.0
    f = 2 * p * r / (p + r) if p + r else 0.0
    return p, r, f


def f_measure(y_true: Sequence[Any], y_pred: Sequence[Any]) -> float:
    """Clustering F-measure (Larsen & Aone; Steinbach et al.), as used by the FSL paper.

    ``F = sum_i (n_i / n) max_j F(i, j)`` with ``F(i, j) = 2 P R / (P + R)``,
    ``P = n_ij / n_j`` and ``R = n_ij / n_i`` for class ``i`` and cluster ``j``.
    """
    C, _, _ = contingency(y_true, y_pred)
    n_i = C.sum(axis=1, keepdims=True)
    n_j = C.sum(axis=0, keepdims=True)
    P = C / n_j
    R = C / n_i
    F = np.divide(2 * P * R, P + R, out=np.zeros_like(C), where=C > 0)
    return float((n_i.ravel() / C.sum() * F.max(axis=1)).sum())


def entropy(y_true: Sequence[Any], y_pred: Sequence[Any]) -> float:
    """Size-weighted cluster entropy, normalised by ``log(#classes)`` into [0, 1] (lower is better).

    ``E = sum_j (n_j / n) * (-1 / log q) sum_i p_ij log p_ij``, ``p_ij = n_ij / n_j``.
    """
    C, classes, _ = contingency(y_true, y_pred)
    if classes.size < 2:
        return 0.0
    n_j = C.sum(axis=0)
    E_j = -xlogy(C / n_j, C / n_j).sum(axis=0) / np.log(classes.size)
    return float((n_j / C.sum() * E_j).sum())


def macro_auc(Y_true: Any, scores: Any) -> float:
    """Macro ROC AUC over the classes (columns) that have both positives and negatives."""
    Y = Y_true.toarray() if sp.issparse(Y_true) else np.asarray(Y_true)
    S = np.asarray(scores, dtype=np.float64)
    if Y.shape != S.shape:
        raise EvaluationError(f"label matrix {Y.shape} and score matrix {S.shape} differ in shape")
    aucs = [roc_auc_score(Y[:, k], S[:, k]) for k in range(Y.shape[1]) if 0 < Y[:, k].sum() < Y.shape[0]]
    if not aucs:
        raise EvaluationError("no class has both positive and negative documents")
    return float(np.mean(aucs))


def example_f1(Y_true: Any, Y_pred: Any) -> float:
    """Example-based F1 of label sets: mean over documents of ``2 |T & P| / (|T| + |P|)``.

    ``Y_true`` and ``Y_pred`` are 0/1 indicator matrices (documents x classes, dense or
    sparse); a document with an empty true set and an empty predicted set scores 1.
    """
    T = (Y_true.toarray() if sp.issparse(Y_true) else np.asarray(Y_true)) > 0
    P = (Y_pred.toarray() if sp.issparse(Y_pred) else np.asarray(Y_pred)) > 0
    if T.shape != P.shape:
        raise EvaluationError(f"label matrix {T.shape} and prediction matrix {P.shape} differ in shape")
    if T.shape[0] == 0:
        raise EvaluationError("cannot score an empty set of documents")
    both = (T & P).sum(axis=1).astype(np.float64)
    sizes = (T.sum(axis=1) + P.sum(axis=1)).astype(np.float64)
    per_doc = np.divide(2.0 * both, sizes, out=np.ones_like(sizes), where=sizes > 0)
    return float(per_doc.mean())


def nmi_max(y_true: Sequence[Any], y_pred: Sequence[Any]) -> float:
    """NMI normalised by the larger of the two entropies (the CLE paper's NMI)."""
    return nmi(y_true, y_pred, "max")


def nmi_mean(y_true: Sequence[Any], y_pred: Sequence[Any]) -> float:
    """NMI normalised by the arithmetic mean of the two entropies (the D-LDA paper's NMI)."""
    return nmi(y_true, y_pred, "arithmetic")


def pairwise_f(y_true: Sequence[Any], y_pred: Sequence[Any]) -> float:
    """Pairwise F of :func:`pairwise_prf`."""
    return pairwise_prf(y_true, y_pred)[2]


#: Single-label metrics by their report name (the names protocols list in ``metrics``).
SINGLE_LABEL_METRICS: dict[str, Callable[[Sequence[Any], Sequence[Any]], float]] = {
    "macro_f1": macro_f1,
    "accuracy": accuracy_hungarian,
    "nmi_max": nmi_max,
    "nmi_mean": nmi_mean,
    "pairwise_f": pairwise_f,
    "f_measure": f_measure,
    "entropy": entropy,
}


def single_label_scores(y_true: Sequence[Any], y_pred: Sequence[Any],
                        names: Sequence[str] | None = None) -> dict[str, float]:
    """Single-label metrics by report name.

    Parameters
    ----------
    y_true, y_pred : sequences
        True classes and predicted classes or cluster ids.
    names : sequence of str, optional
        Report names (keys of :data:`SINGLE_LABEL_METRICS`); all of them by default.

    Returns
    -------
    dict
        ``{name: value}`` in the order of ``names``.

    Raises
    ------
    EvaluationError
        For a name that is not a single-label metric (``macro_auc`` needs scores).
    """
    names = list(SINGLE_LABEL_METRICS if names is None else names)
    unknown = [n for n in names if n not in SINGLE_LABEL_METRICS]
    if unknown:
        raise EvaluationError(f"not a single-label metric: {', '.join(map(repr, unknown))} "
                         f"(known: {', '.join(SINGLE_LABEL_METRICS)}; macro_auc needs scores)")
    return {n: float(SINGLE_LABEL_METRICS[n](y_true, y_pred)) for n in names}
