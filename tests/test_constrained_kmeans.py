"""ConstrainedKMeans: the baseline and fallback."""

from __future__ import annotations

import numpy as np
import pytest

from streamsemi.algorithms import DegenerateInputError, make_estimator
from streamsemi.core.datasets import load
from streamsemi.core.features import TextFeaturizer
from streamsemi.evaluation.metrics import macro_f1


@pytest.fixture(scope="module")
def r8():
    ds = load("reuters-r8")
    idx = np.random.default_rng(0).permutation(len(ds))[:1500]
    X = TextFeaturizer(n_features=2**16).transform([ds.texts[i] for i in idx])
    y = np.array([ds.labels[i] for i in idx], dtype=object)
    rng = np.random.default_rng(1)
    seeds = np.concatenate([rng.choice(np.flatnonzero(y == c), size=max(1, int(0.05 * (y == c).sum())), replace=False)
                            for c in np.unique(y)])
    ys = np.full(len(y), None, dtype=object)
    ys[seeds] = y[seeds]
    return X, y, ys, seeds


def test_beats_chance_and_seeds_stay_in_their_class(r8):
    X, y, ys, seeds = r8
    m = make_estimator("constrained-kmeans").fit(X, ys)
    fitted = m.classes_[m.labels_]
    assert (fitted[seeds] == y[seeds]).all()
    unl = np.setdiff1d(np.arange(len(y)), seeds)
    f1 = macro_f1(y[unl], m.predict(X[unl]))
    assert f1 > 0.6, f1  # chance for 8 imbalanced classes is ~0.1
    P = m.predict_proba(X[:20])
    S = m.transform(X[:20])  # softmax of the cosine similarities / temperature
    assert np.allclose(P.sum(axis=1), 1) and np.allclose(np.log(P / P[:, :1]), (S - S[:, :1]) / m.temperature)
    assert (m.predict(X[unl]) == fitted[unl]).mean() > 0.97, "predict on training rows agrees with the fit"
    words = m.explain(None, 5)
    assert set(words) == set(m.classes_) and all(len(w) == 5 for w in words.values())


def test_seeded_kmeans_lets_seeds_move_and_is_deterministic(r8):
    X, y, ys, seeds = r8
    a = make_estimator("seeded-kmeans").fit(X, ys)
    b = make_estimator("seeded-kmeans").fit(X, ys)
    assert np.array_equal(a.labels_, b.labels_)
    assert not a.constrained


def test_new_clusters_take_unseeded_documents(r8):
    X, y, ys, seeds = r8
    ys2 = ys.copy()
    ys2[np.isin(ys2, ["earn", "acq"])] = None  # only six classes seeded
    m = make_estimator("constrained-kmeans", n_new_clusters=2, discovery="legacy").fit(X, ys2)
    assert list(m.new_clusters_) == ["new-0", "new-1"] and list(m.classes_[-2:]) == ["new-0", "new-1"]
    pred = m.predict(X)
    in_new = np.isin(pred, m.new_clusters_)
    assert np.isin(y[in_new], ["earn", "acq"]).mean() > 0.7, "new clusters collect the unseeded classes"


@pytest.mark.parametrize(("y_fn", "message"), [
    (lambda n: [None] * n, "no seed labels"),
    (lambda n: ["a"] + [None] * (n - 1), "only 1 seeded class"),
    (lambda n: ["a", "b"], "y has 2 elements"),
])
def test_degenerate_labels(r8, y_fn, message):
    X = r8[0][:30]
    with pytest.raises(DegenerateInputError, match=message):
        make_estimator("constrained-kmeans").fit(X, y_fn(30))


def test_degenerate_matrices():
    import scipy.sparse as sp

    with pytest.raises(DegenerateInputError, match="all zero"):
        make_estimator("constrained-kmeans").fit(sp.csr_matrix((3, 10)), ["a", "b", None])
    X = sp.csr_matrix(np.array([[1.0, 0], [0, 1.0], [0, 0]]))
    with pytest.raises(DegenerateInputError, match="empty document"):
        make_estimator("constrained-kmeans").fit(X, ["a", "b", None])
    X = sp.csr_matrix(np.eye(3))
    with pytest.raises(DegenerateInputError, match="larger than the number of documents"):
        make_estimator("constrained-kmeans", n_new_clusters=2).fit(X, ["a", "b", None])
