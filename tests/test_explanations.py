"""Distinctive explanations: the words that set a cluster apart from the
window, not its most frequent ones (core/explain.py), for every algorithm (D-LDA included)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from streamsemi.algorithms import make_estimator
from streamsemi.algorithms._explain import window_membership
from streamsemi.core.datasets import load
from streamsemi.core.explain import (
    distinctive_scores,
    distinctive_words,
    explain_classes,
    membership_matrix,
)
from streamsemi.core.features import TextFeaturizer


def test_scores_are_lift_weighted_by_coverage_and_idf():
    # columns: 0 in every document, 1 mostly class 0, 2 only class 1, 3 one document of class 0
    X = sp.csr_matrix(np.array([
        [5, 3, 0, 1],
        [5, 2, 0, 0],
        [5, 1, 0, 0],
        [5, 0, 1, 0],
        [5, 1, 2, 0],
        [5, 0, 1, 0],
    ], dtype=float))
    labels = np.array([0, 0, 0, 1, 1, 1])
    W = distinctive_scores(X, labels, 2).toarray()
    n = 6
    p = (X.toarray() > 0).sum(axis=0) / n
    for k in range(2):
        pc = (X.toarray()[labels == k] > 0).mean(axis=0)
        with np.errstate(divide="ignore", invalid="ignore"):
            expect = np.where(pc > 0, pc * np.log(pc / p) * np.log(1 / p), 0.0)
        np.testing.assert_allclose(W[k], np.maximum(expect, 0.0))
    assert W[:, 0].max() == 0.0  # in every document: never distinctive, however frequent
    # f3 (one document, p = 1/6) outranks f1 (4 of 6 documents): 1/3 ln 2 ln 6 > ln 1.5 ln 1.5
    assert distinctive_words(X, labels, 2, top_n=3) == [["f3", "f1"], ["f2"]]


def test_membership_from_labels_or_indicator_and_empty_classes_fall_back():
    labels = np.array([1, -1, 0, 1])
    H = membership_matrix(labels, 3).toarray()
    np.testing.assert_array_equal(H, [[0, 0, 1, 0], [1, 0, 0, 1], [0, 0, 0, 0]])
    ind = sp.csr_matrix(np.array([[0, 1, 0], [0, 0, 0], [1, 0, 0], [0, 1, 0]]))
    np.testing.assert_array_equal(membership_matrix(ind, 3).toarray(), H)
    X = sp.csr_matrix(np.array([[1, 0, 2], [1, 1, 0], [0, 3, 0], [1, 0, 1]], dtype=float))
    out = explain_classes(["a", "b", "new-0"], X, labels, top_n=2, fallback={"new-0": ["kept"], "a": ["unused"]})
    assert out == {"a": ["f1"], "b": ["f2", "f0"], "new-0": ["kept"]}


@pytest.fixture(scope="module")
def r8_window():
    ds = load("reuters-r8")
    idx = np.random.default_rng(0).permutation(len(ds))[:1500]
    feat = TextFeaturizer(n_features=2**16)
    X = feat.transform([ds.texts[i] for i in idx])
    y = np.array([ds.labels[i] for i in idx], dtype=object)
    df = np.asarray((X > 0).sum(axis=0)).ravel() / X.shape[0]
    # words in at least a third of the stories: "reuter said mln dlrs cts vs net" ...
    common = {w for j in np.flatnonzero(df >= 1 / 3) for w in feat.sketch.words(int(j), 1)}
    return X, y, feat.sketch, common


def test_true_reuters_classes_are_named_by_their_own_words(r8_window):
    X, y, sketch, common = r8_window
    assert {"said", "mln", "reuter"} <= common
    classes = sorted(set(y))
    words = dict(zip(classes, distinctive_words(X, np.array([classes.index(c) for c in y]), len(classes), sketch, 5),
                     strict=True))
    assert "oil" in words["crude"][:3] and "trade" in words["trade"][:3] and "grain" in words["grain"][:3]
    assert {"acquisition", "acquire", "stake"} & set(words["acq"][:3])
    assert not any(set(w[:3]) & (common - {"vs", "cts", "net", "shr"}) for c, w in words.items() if c != "earn")


@pytest.mark.parametrize("name", ["d-lda", "constrained-kmeans", "semi-ldc"])
def test_no_cluster_is_named_by_words_frequent_everywhere(r8_window, name):
    """Words frequent in the whole window name no cluster (D-LDA's acq: "said oil dlrs mln pct")."""
    X, y, sketch, common = r8_window
    rng = np.random.default_rng(1)
    seeded = ["acq", "crude", "earn", "money-fx", "trade"]
    ys = np.full(len(y), None, dtype=object)
    for c in seeded:
        pick = rng.choice(np.flatnonzero(y == c), size=max(2, int(0.05 * (y == c).sum())), replace=False)
        ys[pick] = c
    params = {"d-lda": {"n_topics": 32, "min_df": 3, "n_sweeps": 60}, "semi-ldc": {"max_components": 50}}.get(name, {})
    est = make_estimator(name, n_new_clusters="auto", **params).fit(X, ys)
    words = explain_classes(est.classes_, X, window_membership(est, X), sketch, 8)
    assert set(words) == {str(c) for c in est.classes_}
    populated = [str(c) for c, n in zip(est.classes_, np.bincount(window_membership(est, X),
                                                                   minlength=len(est.classes_)), strict=True) if n]
    assert all(words[c] for c in populated)
    everywhere = common - {"vs", "cts", "net", "shr"}   # earn's own words, frequent only because earn is half of R8
    for c in populated:
        assert not set(words[c][:3]) & everywhere, (c, words[c])
