"""Evaluation metrics: hand-computed small cases and scikit-learn equivalents."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.metrics import (
    adjusted_rand_score,
    f1_score,
    normalized_mutual_info_score,
    roc_auc_score,
)

from streamsemi.evaluation import metrics as M

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
    # a permutation of cluster names does not matter
    assert M.accuracy_hungarian(["x", "x", "y"], [5, 5, 7]) == 1.0


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
    assert M.nmi(["a", "a", "b", "b"], [1, 1, 0, 0]) == pytest.approx(1.0)
    # hand computed: two classes, one cluster -> I = 0
    assert M.nmi(["a", "b"], [0, 0], "arithmetic") == pytest.approx(0.0)
    with pytest.raises(ValueError, match="unknown NMI"):
        M.nmi(Y_TRUE, Y_PRED, "median")


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


def test_all_single_label_names_and_errors() -> None:
    out = M.all_single_label(Y_TRUE, Y_PRED)
    assert sorted(out) == sorted(["macro_f1", "accuracy", "nmi_max", "nmi_mean", "pairwise_f",
                                  "f_measure", "entropy"])
    assert out["accuracy"] == pytest.approx(4 / 6)
    with pytest.raises(ValueError, match="empty"):
        M.contingency([], [])
    with pytest.raises(ValueError, match="elements"):
        M.contingency(["a"], [0, 1])
