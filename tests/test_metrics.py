"""Evaluation metrics: hand-computed small cases and scikit-learn equivalents."""

from __future__ import annotations

import itertools
import math
import warnings
from collections import Counter

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.metrics import (
    adjusted_rand_score,
    f1_score,
    normalized_mutual_info_score,
    roc_auc_score,
)

from streamsemi.core.errors import StreamsemiError
from streamsemi.evaluation import metrics as M
from streamsemi.evaluation.errors import EvaluationError

# classes a,a,a,b,b,c ; clusters: 0 = {a,a,b}, 1 = {a,b}, 2 = {c}
Y_TRUE = ["a", "a", "a", "b", "b", "c"]
Y_PRED = [0, 0, 1, 0, 1, 2]


def test_contingency_counts() -> None:
    C, classes, clusters = M.contingency(Y_TRUE, Y_PRED)
    assert classes.tolist() == ["a", "b", "c"]
    assert clusters.tolist() == ["0", "1", "2"]
    assert C.tolist() == [[2, 1, 0], [1, 1, 0], [0, 0, 1]]


def test_accuracy_hungarian_hand_computed() -> None:
    # best matching a-0 (2), b-1 (1), c-2 (1): 4 of 6
    assert M.accuracy_hungarian(Y_TRUE, Y_PRED) == pytest.approx(4 / 6)
    # cluster names in the opposite order of the classes: the identity matching scores 0, the best 1
    assert M.accuracy_hungarian(["x", "x", "y"], [7, 7, 5]) == 1.0
    # 3 classes, 3 clusters, best matching a-2, b-0, c-1 (a cyclic shift): 5 of 6
    assert M.accuracy_hungarian(["a", "a", "b", "b", "c", "c"], [2, 2, 0, 1, 1, 1]) == pytest.approx(5 / 6)
    # more clusters than classes: only one cluster per class counts
    assert M.accuracy_hungarian(["a", "a", "a", "b"], [3, 3, 1, 0]) == pytest.approx(3 / 4)


def test_macro_f1_majority_mapping_hand_computed() -> None:
    # clusters 0 and 1 both map to 'a' (their majority class), 2 to 'c':
    # a: P=3/5 R=3/3 F=0.75; b: F=0; c: F=1 -> macro 0.5833
    assert M.macro_f1(Y_TRUE, Y_PRED) == pytest.approx((0.75 + 0.0 + 1.0) / 3)
    # class-name predictions are kept as they are, equal to sklearn's macro F1
    yp = ["a", "b", "a", "b", "b", "a"]
    assert M.macro_f1(Y_TRUE, yp) == pytest.approx(f1_score(Y_TRUE, yp, average="macro"))


def test_macro_f1_known_counts_new_clusters_as_misses() -> None:
    y_true = ["k1", "k1", "k2", "k2", "u", "u"]
    y_pred = ["k1", "new-0", "k2", "k2", "k2", "new-0"]
    # k1: P=1 R=1/2 F=2/3; k2: P=2/3 R=1 F=0.8
    assert M.macro_f1_known(y_true, y_pred, ["k1", "k2"]) == pytest.approx((2 / 3 + 0.8) / 2)
    with pytest.raises(ValueError, match="no known class"):
        M.macro_f1_known(y_true, y_pred, [])


def test_nmi_matches_sklearn_and_hand_value() -> None:
    for avg in ("max", "arithmetic"):
        assert M.nmi(Y_TRUE, Y_PRED, avg) == pytest.approx(
            normalized_mutual_info_score(Y_TRUE, [str(v) for v in Y_PRED], average_method=avg))
    # perfect clustering up to renaming
    assert M.nmi(["a", "a", "b", "b"], [1, 1, 0, 0], "max") == pytest.approx(1.0)
    # hand computed: two classes, one cluster -> I = 0
    assert M.nmi(["a", "b"], [0, 0], "arithmetic") == pytest.approx(0.0)
    with pytest.raises(ValueError, match="^unknown NMI normalisation 'median'$"):
        M.nmi(Y_TRUE, Y_PRED, "median")
    # every normalisation scikit-learn knows is accepted and passed through
    y_true, y_pred = ["a"] * 4 + ["b"] * 4, [0, 0, 1, 1, 2, 2, 3, 3]
    for avg in ("geometric", "min"):
        assert M.nmi(y_true, y_pred, avg) == pytest.approx(
            normalized_mutual_info_score(y_true, y_pred, average_method=avg))
    assert M.nmi(y_true, y_pred, "min") == pytest.approx(1.0)  # I = H(true) = min(H)
    with pytest.raises(TypeError):
        M.nmi(y_true, y_pred)  # the normalisation is always explicit


def test_pairwise_prf_hand_computed() -> None:
    # same-cluster pairs: C(3,2)+C(2,2)=4; same-class: C(3,2)+C(2,2)=4;
    # both: cluster0 {a,a,b}: 1 pair (a,a); cluster1 {a,b}: 0 -> tp=1
    p, r, f = M.pairwise_prf(Y_TRUE, Y_PRED)
    assert (p, r) == (pytest.approx(1 / 4), pytest.approx(1 / 4))
    assert f == pytest.approx(0.25)
    # consistent with the adjusted Rand index on a perfect clustering
    assert M.pairwise_prf(["a", "a", "b"], [1, 1, 2])[2] == 1.0 == adjusted_rand_score(["a", "a", "b"], [1, 1, 2])


def test_f_measure_hand_computed() -> None:
    # class a (3): vs cluster0 P=2/3 R=2/3 F=2/3; vs cluster1 P=1/2 R=1/3 F=0.4 -> 2/3
    # class b (2): cluster0 P=1/3 R=1/2 F=0.4; cluster1 P=1/2 R=1/2 F=0.5 -> 0.5
    # class c (1): cluster2 F=1
    expected = 3 / 6 * (2 / 3) + 2 / 6 * 0.5 + 1 / 6 * 1.0
    assert M.f_measure(Y_TRUE, Y_PRED) == pytest.approx(expected)
    assert M.f_measure(["a", "b"], [0, 1]) == 1.0


def test_entropy_hand_computed() -> None:
    # cluster0 {a,a,b}: -(2/3 ln 2/3 + 1/3 ln 1/3); cluster1 {a,b}: ln 2; cluster2: 0; / ln 3
    e0 = -(2 / 3 * math.log(2 / 3) + 1 / 3 * math.log(1 / 3))
    expected = (3 / 6 * e0 + 2 / 6 * math.log(2)) / math.log(3)
    assert M.entropy(Y_TRUE, Y_PRED) == pytest.approx(expected)
    assert M.entropy(["a", "b", "a"], [0, 1, 0]) == 0.0


def test_macro_auc_against_sklearn_and_skips_constant_columns() -> None:
    rng = np.random.default_rng(0)
    Y = rng.integers(0, 2, size=(40, 3))
    Y[:, 2] = 1  # no negatives: skipped
    S = rng.random((40, 3))
    expected = np.mean([roc_auc_score(Y[:, k], S[:, k]) for k in range(2)])
    assert M.macro_auc(Y, S) == pytest.approx(expected)
    assert M.macro_auc(np.array([[1, 0], [0, 1]]), np.array([[0.9, 0.1], [0.2, 0.8]])) == 1.0
    with pytest.raises(ValueError, match="differ in shape"):
        M.macro_auc(Y, S[:, :2])
    with pytest.raises(ValueError, match="both positive and negative"):
        M.macro_auc(np.ones((3, 2)), np.ones((3, 2)))


def test_error_messages() -> None:
    with pytest.raises(EvaluationError, match="^cannot score an empty set of documents$") as err:
        M.contingency([], [])
    assert isinstance(err.value, StreamsemiError) and isinstance(err.value, ValueError)
    with pytest.raises(ValueError, match="^y_true has 1 elements, y_pred has 2$"):
        M.contingency(["a"], [0, 1])
    with pytest.raises(ValueError, match="^y_true has 2 elements, y_pred has 1$"):
        M.macro_f1_known(["a", "b"], ["a"], ["a"])
    with pytest.raises(ValueError, match="^no known class to score$"):
        M.macro_f1_known(["a"], ["a"], [])
    with pytest.raises(ValueError, match="^no class has both positive and negative documents$"):
        M.macro_auc(np.zeros((2, 1)), np.ones((2, 1)))
    with pytest.raises(ValueError, match=r"^label matrix \(2, 1\) and score matrix \(2, 2\) differ in shape$"):
        M.macro_auc(np.zeros((2, 1)), np.ones((2, 2)))
    known = ", ".join(M.SINGLE_LABEL_METRICS)
    with pytest.raises(ValueError) as err:
        M.single_label_scores(["a"], ["a"], ["macro_auc", "bogus"])
    assert str(err.value) == f"not a single-label metric: 'macro_auc', 'bogus' (known: {known}; macro_auc needs scores)"


def test_degenerate_cases_give_defined_values_without_warnings() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no division or undefined-metric warnings in evaluation output
        # every document its own cluster: no same-cluster pair -> pairwise precision 0 (not a division)
        assert M.pairwise_prf(["a", "a", "b"], [0, 1, 2]) == (0.0, 0.0, 0.0)
        # every document its own class: no same-class pair -> recall 0
        assert M.pairwise_prf(["a", "b", "c"], [0, 0, 0]) == (0.0, 0.0, 0.0)
        # a class never predicted scores F1 = 0 (no precision warning)
        assert M.macro_f1(["a", "a", "b"], ["a", "a", "a"]) == pytest.approx((0.8 + 0.0) / 2)
        # a known class with no document and no prediction counts 0
        assert M.macro_f1_known(["k1", "k1"], ["k1", "k1"], ["k1", "k2"]) == pytest.approx(0.5)
        # clusters with members of one class, classes spread over clusters: finite values
        assert M.f_measure(["a", "a", "b", "b"], [0, 1, 2, 3]) == pytest.approx(2 / 3)
        assert M.entropy(["a", "a", "b", "b"], [0, 1, 2, 3]) == 0.0
        assert M.entropy(["a", "b"], [0, 0]) == pytest.approx(1.0)


def test_predicted_class_names_are_kept_not_remapped() -> None:
    # cluster 'b' holds two 'a' documents: a cluster id would map to 'a', a class name stays 'b'
    assert M.map_clusters(["a", "a", "b"], ["b", "b", "b"]).tolist() == ["b", "b", "b"]
    assert M.map_clusters(["a", "a", "b"], ["k", "k", "k"]).tolist() == ["a", "a", "a"]
    assert M.macro_f1(["a", "a", "b"], ["b", "b", "b"]) == pytest.approx((0.0 + 0.5) / 2)


def test_macro_auc_sparse_labels_and_all_negative_columns() -> None:
    rng = np.random.default_rng(3)
    Y = rng.integers(0, 2, size=(30, 4))
    Y[:, 1] = 0  # no positives: skipped
    S = rng.random((30, 4))
    expected = np.mean([roc_auc_score(Y[:, k], S[:, k]) for k in (0, 2, 3)])
    assert M.macro_auc(Y, S) == pytest.approx(expected)
    assert M.macro_auc(sp.csr_matrix(Y), S) == pytest.approx(expected)


# ----------------------------------------------------------------------------- brute force
# Every report metric against a from-scratch computation (all permutations, all pairs, loops)
# on random small cases whose best class/cluster matching is generally not the identity.

def _brute_accuracy(y_true: list, y_pred: list) -> float:
    classes, clusters = sorted(set(y_true)), sorted(set(y_pred))
    n = len(y_true)
    best = 0
    if len(clusters) >= len(classes):
        for perm in itertools.permutations(clusters, len(classes)):
            match = dict(zip(classes, perm, strict=True))
            best = max(best, sum(match[t] == p for t, p in zip(y_true, y_pred, strict=True)))
    else:
        for perm in itertools.permutations(classes, len(clusters)):
            match = dict(zip(clusters, perm, strict=True))
            best = max(best, sum(match[p] == t for t, p in zip(y_true, y_pred, strict=True)))
    return best / n


def _entropy_bits(counts: Counter) -> float:
    n = sum(counts.values())
    return -sum(c / n * math.log(c / n) for c in counts.values() if c)


def _brute_nmi(y_true: list, y_pred: list, norm: str) -> float:
    n = len(y_true)
    ct, cp, joint = Counter(y_true), Counter(y_pred), Counter(zip(y_true, y_pred, strict=True))
    mi = sum(c / n * math.log((c / n) / (ct[t] / n * cp[p] / n)) for (t, p), c in joint.items())
    ht, hp = _entropy_bits(ct), _entropy_bits(cp)
    denom = max(ht, hp) if norm == "max" else (ht + hp) / 2
    return mi / denom if denom else 1.0


def _brute_pairwise_f(y_true: list, y_pred: list) -> float:
    tp = same_pred = same_true = 0
    for i, j in itertools.combinations(range(len(y_true)), 2):
        st, sp_ = y_true[i] == y_true[j], y_pred[i] == y_pred[j]
        tp += st and sp_
        same_pred += sp_
        same_true += st
    p = tp / same_pred if same_pred else 0.0
    r = tp / same_true if same_true else 0.0
    return 2 * p * r / (p + r) if p + r else 0.0


def _brute_f_measure(y_true: list, y_pred: list) -> float:
    n = len(y_true)
    total = 0.0
    for c in set(y_true):
        n_i = y_true.count(c)
        best = 0.0
        for k in set(y_pred):
            n_j = y_pred.count(k)
            n_ij = sum(t == c and p == k for t, p in zip(y_true, y_pred, strict=True))
            if n_ij:
                P, R = n_ij / n_j, n_ij / n_i
                best = max(best, 2 * P * R / (P + R))
        total += n_i / n * best
    return total


def _brute_entropy(y_true: list, y_pred: list) -> float:
    q = len(set(y_true))
    if q < 2:
        return 0.0
    n = len(y_true)
    total = 0.0
    for k in set(y_pred):
        members = Counter(t for t, p in zip(y_true, y_pred, strict=True) if p == k)
        n_j = sum(members.values())
        total += n_j / n * _entropy_bits(members) / math.log(q)
    return total


def _brute_macro_f1(y_true: list, y_pred: list) -> float:
    classes = sorted(set(y_true))
    mapped = []
    for p in y_pred:
        if p in classes:
            mapped.append(p)
        else:
            members = Counter(t for t, q in zip(y_true, y_pred, strict=True) if q == p)
            top = max(members.values())
            mapped.append(min(c for c, v in members.items() if v == top))  # ties: first class
    return float(f1_score(y_true, mapped, labels=classes, average="macro", zero_division=0))


BRUTE = {
    "macro_f1": _brute_macro_f1,
    "accuracy": _brute_accuracy,
    "nmi_max": lambda t, p: _brute_nmi(t, p, "max"),
    "nmi_mean": lambda t, p: _brute_nmi(t, p, "mean"),
    "pairwise_f": _brute_pairwise_f,
    "f_measure": _brute_f_measure,
    "entropy": _brute_entropy,
}


def _random_case(rng: np.random.Generator) -> tuple[list, list]:
    n = int(rng.integers(6, 25))
    k_true, k_pred = int(rng.integers(2, 5)), int(rng.integers(2, 6))
    y_true = [f"c{v}" for v in rng.integers(0, k_true, n)]
    names = rng.permutation(k_pred)  # cluster ids in an order unrelated to the classes
    y_pred = [f"k{names[v]}" for v in rng.integers(0, k_pred, n)]
    # make the prediction informative: most documents follow a random class -> cluster map
    target = {c: f"k{v}" for c, v in zip(sorted(set(y_true)), rng.permutation(max(k_pred, k_true)), strict=False)}
    for i in range(n):
        if rng.random() < 0.7 and y_true[i] in target:
            y_pred[i] = target[y_true[i]]
    return y_true, y_pred


def test_every_report_metric_matches_a_brute_force_computation() -> None:
    rng = np.random.default_rng(7)
    non_identity = 0
    for _ in range(60):
        y_true, y_pred = _random_case(rng)
        got = M.single_label_scores(y_true, y_pred)
        assert list(got) == list(M.SINGLE_LABEL_METRICS) == list(BRUTE)
        for name, fn in BRUTE.items():
            assert got[name] == pytest.approx(fn(y_true, y_pred), abs=1e-12), (name, y_true, y_pred)
        C, _, _ = M.contingency(y_true, y_pred)
        k = min(C.shape)
        non_identity += C[np.arange(k), np.arange(k)].sum() / len(y_true) < got["accuracy"] - 1e-12
    assert non_identity >= 30, "the cases exercise matchings other than the identity"


def test_nmi_normalisations_differ_when_the_entropies_differ() -> None:
    # 2 balanced classes split into 4 pure clusters: I = H(true) = ln 2, H(pred) = ln 4
    y_true = ["a"] * 4 + ["b"] * 4
    y_pred = [0, 0, 1, 1, 2, 2, 3, 3]
    scores = M.single_label_scores(y_true, y_pred, ["nmi_max", "nmi_mean"])
    assert scores["nmi_max"] == pytest.approx(math.log(2) / math.log(4))          # 0.5
    assert scores["nmi_mean"] == pytest.approx(math.log(2) / ((math.log(2) + math.log(4)) / 2))  # 2/3
    for avg, name in (("max", "nmi_max"), ("arithmetic", "nmi_mean")):
        assert scores[name] == pytest.approx(
            normalized_mutual_info_score(y_true, [str(v) for v in y_pred], average_method=avg))


def test_single_label_scores_subset_and_unknown_names() -> None:
    out = M.single_label_scores(Y_TRUE, Y_PRED, ["entropy", "accuracy"])
    assert list(out) == ["entropy", "accuracy"]
    assert out["accuracy"] == pytest.approx(4 / 6)
    assert out["entropy"] == pytest.approx(_brute_entropy(Y_TRUE, [str(v) for v in Y_PRED]))
    with pytest.raises(ValueError, match="not a single-label metric: 'macro_auc'"):
        M.single_label_scores(Y_TRUE, Y_PRED, ["accuracy", "macro_auc"])


def test_accuracy_hungarian_against_all_permutations_of_larger_tables() -> None:
    rng = np.random.default_rng(11)
    for _ in range(30):
        k = int(rng.integers(3, 6))
        n = int(rng.integers(10, 40))
        y_true = [f"c{v}" for v in rng.integers(0, k, n)]
        perm = rng.permutation(k)
        y_pred = [f"k{perm[int(t[1:])]}" if rng.random() < 0.6 else f"k{rng.integers(0, k)}" for t in y_true]
        assert M.accuracy_hungarian(y_true, y_pred) == pytest.approx(_brute_accuracy(y_true, y_pred))
