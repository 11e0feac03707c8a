"""Tests for pseudo-LSC (multi-label semi-supervised fuzzy subspace clustering)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.stats import chi2_contingency

from streamsemi.algorithms import make_estimator
from streamsemi.algorithms.base import DegenerateInputError, encode_multi_labels
from streamsemi.algorithms.pseudo_lsc import (
    PseudoLSC,
    build_pseudo_labels,
    dispersion,
    fuzzy_chi_square,
    fuzzy_impurity,
    information_gain,
    objective,
    project_binary,
    subspace_distances,
    update_dimension_weights,
)
from streamsemi.core import datasets
from streamsemi.core.features import TextFeaturizer
from streamsemi.evaluation.metrics import macro_auc

# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def reuters():
    """~700 Reuters-21578 stories with one of the 8 most frequent topics (multi-label)."""
    if not datasets.available().get("reuters21578"):
        pytest.skip("reuters21578 corpus not cached")
    d = datasets.load("reuters21578")
    counts = Counter(t for labels in d.labels for t in labels)
    top = [t for t, _ in counts.most_common(8)]
    idx = [i for i, labels in enumerate(d.labels) if set(labels) & set(top)][:700]
    feat = TextFeaturizer()
    X = feat.transform([d.texts[i] for i in idx])
    labels = [sorted(set(d.labels[i]) & set(top)) for i in idx]
    keep = np.flatnonzero(np.diff(X.indptr) > 0)
    return X[keep], [labels[i] for i in keep], top, feat.sketch


@pytest.fixture(scope="module")
def fitted(reuters):
    X, labels, top, _ = reuters
    n_train = 450
    rng = np.random.default_rng(0)
    seeded = rng.random(n_train) < 0.5
    y = [labels[i] if seeded[i] else [] for i in range(n_train)]
    model = PseudoLSC(min_seeds_to_select=0, n_features_selected=300, random_state=0).fit(X[:n_train], y)
    return model, X, labels, top, n_train


# ----------------------------------------------------------------------------- pseudo-labels


def test_pseudo_labels_follow_table_2():
    # Table 2: x1 {t1,t3}, x2 {t1,t2,t4}, x3 {t2}, x4 {t1,t3}, x5 {t2}
    y = [["t1", "t3"], ["t1", "t2", "t4"], ["t2"], ["t1", "t3"], ["t2"], []]
    Y, classes, labeled = encode_multi_labels(y, len(y))
    codes, sets = build_pseudo_labels(Y, labeled)
    assert codes.tolist() == [0, 1, 2, 0, 2, -1]
    named = [tuple(classes[c] for c in s) for s in sets]
    assert named == [("t1", "t3"), ("t1", "t2", "t4"), ("t2",)]


def test_fit_exposes_pseudo_label_sets(fitted):
    model, _, labels, _, n_train = fitted
    seen = {tuple(labels[i]) for i in range(n_train) if model.pseudo_labels_[i] >= 0}
    assert set(model.pseudo_label_sets_) == seen
    assert len(model.pseudo_label_sets_) == len(seen)
    # every seed's pseudo-class is exactly its label set
    for i in np.flatnonzero(model.pseudo_labels_ >= 0)[:50]:
        assert model.pseudo_label_sets_[model.pseudo_labels_[i]] == tuple(labels[i])


# ----------------------------------------------------------------------------- the math


def test_impurity_hand_computed():
    W = np.array([[1.0, 0.0], [0.5, 0.5], [0.0, 1.0], [0.3, 0.7]])
    pseudo = np.array([0, 0, 1, -1])
    # cluster 0: counts (1.5, 0) -> ADC 0; cluster 1: counts (0.5, 1): ADC = 0.5*1 + 1*0.5 = 1,
    # Ent = H(1/3, 2/3); global counts (2, 1): ADC = 2*1 + 1*2 = 4, Ent = H(2/3, 1/3).
    imp = fuzzy_impurity(W, pseudo, 2)
    np.testing.assert_allclose(imp, [0.0, 0.25], atol=1e-12)


def test_impurity_zero_with_a_single_pseudo_class():
    W = np.array([[0.6, 0.4], [0.2, 0.8]])
    np.testing.assert_array_equal(fuzzy_impurity(W, np.array([0, 0]), 1), [0.0, 0.0])


def test_chi_square_matches_contingency_table_for_crisp_memberships():
    rng = np.random.default_rng(3)
    Xd = (rng.random((40, 6)) < 0.4).astype(float)
    Xd[:, 0] = 1.0  # a feature present everywhere has chi2 0
    labels = rng.integers(0, 3, 40)
    W = np.eye(3)[labels]
    df = Xd.sum(axis=0)
    chi = fuzzy_chi_square(sp.csr_matrix(Xd), W, df, n_labeled=40)
    for cl in range(3):
        for i in range(1, 6):
            table = np.array([[np.sum((labels == cl) & (Xd[:, i] == 1)), np.sum((labels != cl) & (Xd[:, i] == 1))],
                              [np.sum((labels == cl) & (Xd[:, i] == 0)), np.sum((labels != cl) & (Xd[:, i] == 0))]])
            expected = chi2_contingency(table, correction=False)[0]
            assert chi[cl, i] == pytest.approx(expected, rel=1e-9)
    np.testing.assert_array_equal(chi[:, 0], 0.0)
    # the multiplier is the number of labeled documents
    np.testing.assert_allclose(fuzzy_chi_square(sp.csr_matrix(Xd), W, df, 10), chi / 4)


def test_expanded_distances_match_brute_force():
    rng = np.random.default_rng(1)
    Xd = (rng.random((30, 12)) < 0.3).astype(float)
    Z = rng.random((4, 12))
    Lam = rng.random((4, 12))
    Lam /= Lam.sum(axis=1, keepdims=True)
    Lq = Lam ** 2.0
    brute = ((Z[None, :, :] - Xd[:, None, :]) ** 2 * Lq[None, :, :]).sum(axis=2)
    np.testing.assert_allclose(subspace_distances(sp.csr_matrix(Xd), Z, Lq), brute, atol=1e-12)
    Wf = rng.random((30, 4))
    brute_e = (Wf.T[:, :, None] * (Z[:, None, :] - Xd[None, :, :]) ** 2).sum(axis=1)
    np.testing.assert_allclose(dispersion(sp.csr_matrix(Xd), Wf, Z), brute_e, atol=1e-12)


def test_expanded_distances_match_brute_force_for_weighted_rows():
    # weighting="tfidf": real-valued rows, the expansions carry the x^2 terms
    rng = np.random.default_rng(3)
    Xd = (rng.random((25, 10)) < 0.4) * rng.random((25, 10)) * 3.0
    Z = rng.random((3, 10))
    Lq = rng.dirichlet(np.ones(10), size=3) ** 2.0
    Xs = sp.csr_matrix(Xd)
    X2 = Xs.multiply(Xs).tocsr()
    brute = ((Z[None, :, :] - Xd[:, None, :]) ** 2 * Lq[None, :, :]).sum(axis=2)
    np.testing.assert_allclose(subspace_distances(Xs, Z, Lq, X2), brute, atol=1e-12)
    Wf = rng.random((25, 3))
    brute_e = (Wf.T[:, :, None] * (Z[:, None, :] - Xd[None, :, :]) ** 2).sum(axis=1)
    np.testing.assert_allclose(dispersion(Xs, Wf, Z, X2), brute_e, atol=1e-12)


def _word_disjoint_corpus(n_classes=6, n_docs=600, seed=0):
    """Single-label documents: each class has its own 30 words (a quarter of a document's
    tokens), the rest are drawn from 500 shared words with Zipf frequencies; lengths
    5-150 tokens, skewed class sizes."""
    rng = np.random.default_rng(seed)
    sizes = rng.dirichlet(np.full(n_classes, 0.7)) * n_docs
    y = np.repeat(np.arange(n_classes), np.maximum(np.round(sizes).astype(int), 4))
    p = 1.0 / np.arange(1, 501)
    p /= p.sum()
    rows, cols, vals = [], [], []
    for j, c in enumerate(y):
        length = int(rng.integers(5, 150))
        own = rng.integers(0, 30, size=max(2, length // 4)) + 500 + 30 * c
        words, counts = np.unique(np.concatenate([own, rng.choice(500, size=length, p=p)]),
                                  return_counts=True)
        rows += [j] * words.size
        cols += list(words)
        vals += list(counts)
    X = sp.csr_matrix((np.array(vals, float), (rows, cols)), shape=(y.size, 500 + 30 * n_classes))
    return X, np.array([f"c{c}" for c in y], dtype=object)


def test_single_label_few_seeds_word_disjoint_classes():
    """With 2 seeds per class, squared-Euclidean distances on binary rows (the
    paper's, ``weighting="binary"``) follow document length and centroid density: 0.78
    accuracy here; the default length-normalised tf-idf rows: 0.98."""
    X, y = _word_disjoint_corpus()
    rng = np.random.default_rng(1)
    seeds = np.concatenate([rng.choice(np.flatnonzero(y == c), 2, replace=False) for c in np.unique(y)])
    y_fit = np.full(y.size, None, dtype=object)
    y_fit[seeds] = y[seeds]
    rest = np.setdiff1d(np.arange(y.size), seeds)
    acc = {w: float(np.mean(PseudoLSC(weighting=w).fit(X, list(y_fit)).predict(X)[rest] == y[rest]))
           for w in ("tfidf", "binary")}
    assert acc["tfidf"] >= 0.95, acc
    assert acc["binary"] <= 0.85, acc


def test_dimension_weight_update_is_the_block_minimiser():
    rng = np.random.default_rng(2)
    E = rng.random((3, 8)) + 0.1
    chi = rng.random((3, 8))
    imp = np.array([0.0, 0.5, 0.2])
    q, gamma = 2.0, 0.5
    Lam = update_dimension_weights(E, imp, chi, gamma, q)
    np.testing.assert_allclose(Lam.sum(axis=1), 1.0)

    def F(L):
        return float((((1 + imp)[:, None] * E + gamma * chi) * L ** q).sum())

    best = F(Lam)
    for _ in range(200):  # any other point of the simplex is no better
        other = rng.dirichlet(np.ones(8), size=3)
        assert F(other) >= best - 1e-12
        assert F(0.9 * Lam + 0.1 * other) >= best - 1e-12


def test_information_gain_prefers_the_predictive_feature():
    y = np.array([1, 1, 1, 1, 0, 0, 0, 0])
    Xd = np.column_stack([y, [1, 0, 1, 0, 1, 0, 1, 0], np.ones(8)])
    Y = sp.csr_matrix(np.column_stack([y, 1 - y]).astype(float))
    ig = information_gain(sp.csr_matrix(Xd.astype(float)), Y)
    # perfectly predictive: ln 2 for each of the two classes; independent or constant: 0
    np.testing.assert_allclose(ig, [2 * np.log(2), 0.0, 0.0], atol=1e-12)


# ----------------------------------------------------------------------------- the fit


def test_objective_never_increases(fitted, reuters):
    model = fitted[0]
    h = np.array(model.objective_history_)
    assert h.size >= 2
    assert np.all(np.diff(h) <= 1e-12 * np.abs(h[:-1]))
    assert h[-1] < h[0]
    # also without the chi-square term, and with a fuzzier membership
    X, labels, _, _ = reuters
    y = [labels[i] if i % 2 else [] for i in range(300)]
    for params in ({"use_chi2": False}, {"fuzzifier": 1.5, "max_iter": 15}):
        m = PseudoLSC(min_seeds_to_select=0, n_features_selected=200, **params).fit(X[:300], y)
        h = np.array(m.objective_history_)
        assert np.all(np.diff(h) <= 1e-12 * np.abs(h[:-1])), params


def test_objective_history_matches_final_state(fitted):
    model, X, _, _, n_train = fitted
    G = model.transform(X[:n_train])
    Lq = model.dimension_weights_ ** model.q
    Wf = model.memberships_ ** model.fuzzifier
    # the last recorded value is Eq. 1 at the returned (W, Z, lambda) with Imp, chi2 at W
    Xsel = project_binary(X[:n_train], model._remap, model.feature_indices_.size)
    chi = fuzzy_chi_square(Xsel, model.memberships_, np.asarray(Xsel.sum(axis=0)).ravel(),
                           int((model.pseudo_labels_ >= 0).sum()))
    F = objective(G, Wf, model.impurity_, Lq, chi, model.gamma)
    assert F == pytest.approx(model.objective_history_[-1], rel=1e-9)


def test_memberships_and_dimension_weights_on_the_simplex(fitted):
    model = fitted[0]
    W, L = model.memberships_, model.dimension_weights_
    assert W.min() >= 0 and L.min() >= 0
    np.testing.assert_allclose(W.sum(axis=1), 1.0, atol=1e-10)
    np.testing.assert_allclose(L.sum(axis=1), 1.0, atol=1e-10)
    assert L.shape == (model.n_clusters_, model.feature_indices_.size)
    assert model.feature_indices_.size == 300


def test_multilabel_predictions_beat_chance(fitted):
    model, X, labels, top, n_train = fitted
    Xte = X[n_train:]
    P = model.predict_proba(Xte)
    assert P.shape == (Xte.shape[0], model.classes_.size)
    assert P.min() >= 0 and P.max() <= 1
    Y = np.array([[int(c in labels[i]) for c in model.classes_] for i in range(n_train, X.shape[0])])
    auc = macro_auc(Y, P)
    assert auc > 0.75, auc
    pred = model.predict(Xte)
    assert model.multilabel_ is True
    assert set(np.unique(pred)) <= {0, 1}
    assert pred.sum(axis=1).min() >= 1          # at least the top label
    assert pred.sum(axis=1).max() >= 2          # some document gets several labels
    assert np.all(pred[np.arange(len(P)), P.argmax(axis=1)] == 1)
    assert model.new_clusters_ == []


def test_decision_rules():
    m = PseudoLSC(decision="threshold", threshold=0.4)
    P = np.array([[0.9, 0.45, 0.1], [0.2, 0.3, 0.1], [0.6, 0.7, 0.65]])
    np.testing.assert_array_equal(m.decide(P), [[1, 1, 0], [0, 1, 0], [1, 1, 1]])
    m = PseudoLSC(decision="rcut")
    # r = round(row sum): 1, 1 (at least one), 2
    np.testing.assert_array_equal(m.decide(P), [[1, 0, 0], [0, 1, 0], [0, 1, 1]])


def test_single_label_input(reuters):
    X, labels, _, _ = reuters
    y = [labels[i][0] if i % 3 == 0 else None for i in range(300)]
    m = PseudoLSC(min_seeds_to_select=0, n_features_selected=200).fit(X[:300], y)
    assert m.multilabel_ is False
    P = m.predict_proba(X[300:400])
    np.testing.assert_allclose(P.sum(axis=1), 1.0, atol=1e-9)
    pred = m.predict(X[300:400])
    assert set(pred) <= set(m.classes_)


def test_determinism(reuters):
    X, labels, _, _ = reuters
    y = [labels[i] if i % 4 == 0 else [] for i in range(250)]
    a = PseudoLSC(min_seeds_to_select=0, n_features_selected=150, n_clusters=40, random_state=3).fit(X[:250], y)
    b = PseudoLSC(min_seeds_to_select=0, n_features_selected=150, n_clusters=40, random_state=3).fit(X[:250], y)
    np.testing.assert_array_equal(a.predict_proba(X[250:350]), b.predict_proba(X[250:350]))
    np.testing.assert_array_equal(a.memberships_, b.memberships_)
    assert a.objective_history_ == b.objective_history_


def test_ablation_flags_change_the_model(reuters):
    X, labels, _, _ = reuters
    y = [labels[i] if i % 2 == 0 else [] for i in range(250)]
    full = PseudoLSC(min_seeds_to_select=0, n_features_selected=150).fit(X[:250], y)
    bare = PseudoLSC(min_seeds_to_select=0, n_features_selected=150, use_impurity=False, use_chi2=False).fit(X[:250], y)
    np.testing.assert_array_equal(bare.impurity_, 0.0)
    assert full.impurity_.max() > 0
    assert not np.allclose(full.dimension_weights_, bare.dimension_weights_)


def test_explain_and_registry(fitted, reuters):
    model = fitted[0]
    sketch = reuters[3]
    words = model.explain(sketch, top_n=5)
    assert set(words) == set(model.classes_)
    assert all(1 <= len(v) <= 5 for v in words.values())
    assert all(isinstance(w, str) and w for v in words.values() for w in v)
    ids = model.explain(None, top_n=3)
    assert all(w.startswith("f") for v in ids.values() for w in v)
    est = make_estimator("pseudo-lsc", kappa=3)
    assert isinstance(est, PseudoLSC) and est.kappa == 3


def test_explain_finds_topic_words(fitted, reuters):
    words = fitted[0].explain(reuters[3], top_n=15)
    assert {"crude", "oil", "opec", "barrels", "petroleum"} & set(words["crude"])
    assert {"grain", "wheat", "tonnes", "corn", "agriculture"} & set(words["grain"])


# ----------------------------------------------------------------------------- degenerate inputs


def test_degenerate_inputs(reuters):
    X, labels, _, _ = reuters
    X = X[:60]
    with pytest.raises(DegenerateInputError, match="no seed labels"):
        PseudoLSC().fit(X, [[] for _ in range(60)])
    with pytest.raises(DegenerateInputError, match="only 1 seeded class"):
        PseudoLSC().fit(X, [["earn"] if i < 10 else [] for i in range(60)])
    with pytest.raises(DegenerateInputError, match="all zero"):
        PseudoLSC().fit(sp.csr_matrix((60, X.shape[1])), [["a"], ["b"]] + [[]] * 58)
    Xe = sp.vstack([X[:59], sp.csr_matrix((1, X.shape[1]))]).tocsr()
    with pytest.raises(DegenerateInputError, match="empty document"):
        PseudoLSC().fit(Xe, labels[:60])
    with pytest.raises(DegenerateInputError, match="larger than the number of documents"):
        PseudoLSC(n_clusters=61).fit(X, labels[:60])
    with pytest.raises(DegenerateInputError, match="y has 3 elements"):
        PseudoLSC().fit(X, [["a"], ["b"], []])
    with pytest.raises(ValueError, match=r"'fuzzifier' parameter of PseudoLSC must be a float in the range \(1.0, inf\)\. Got 1.0 instead"):
        PseudoLSC(fuzzifier=1.0).fit(X, labels[:60])
    with pytest.raises(ValueError, match=r"'decision' parameter of PseudoLSC must be a str among .*Got 'top' instead"):
        PseudoLSC(decision="top").fit(X, labels[:60])
    model = PseudoLSC(min_seeds_to_select=0, n_features_selected=50).fit(X, labels[:60])
    with pytest.raises(ValueError, match="features"):
        model.predict_proba(sp.csr_matrix((2, 10)))


def test_cardinality_decision_matches_the_seeds_label_cardinality(fitted):
    model, X, labels, _, n_train = fitted
    P = np.array([[0.9, 0.45, 0.1], [0.2, 0.3, 0.1], [0.6, 0.7, 0.65], [0.5, 0.2, 0.4]])
    # 1.5 labels per seed on 4 documents: 2 extra labels, the two largest non-top probabilities (0.65, 0.6)
    assert PseudoLSC._calibrated_threshold(P, 1.5) == 0.6
    assert PseudoLSC._calibrated_threshold(P, 1.0) > 1.0, "single-label seeds: only the top class"
    seeded = [labels[i] for i in range(n_train)][: n_train // 2]
    card = PseudoLSC(min_seeds_to_select=0, n_features_selected=300, random_state=0, decision="cardinality").fit(
        X[:n_train], seeded + [[] for _ in range(n_train - len(seeded))])
    assert card.label_cardinality_ == pytest.approx(np.mean([len(s) for s in seeded]))
    sizes = card.predict(X[:n_train]).sum(axis=1)
    assert sizes.mean() == pytest.approx(card.label_cardinality_, abs=1 / n_train), \
        "the fitted documents get the seeds' cardinality"
    assert card.label_cardinality_ > 1.0 and model.threshold_ == 0.5


def test_cached_distance_terms_follow_refits_and_params(reuters):
    """transform() reuses per-model distance terms; a refit or a new q must not see stale ones."""
    X, labels, _, _ = reuters
    y1 = [labels[i] if i % 3 == 0 else [] for i in range(240)]
    y2 = [labels[i] if i % 3 == 1 else [] for i in range(240)]
    for weighting in ("tfidf", "binary"):
        m = PseudoLSC(weighting=weighting, max_iter=5)
        for y in (y1, y2):
            m.fit(X[:240], y)
            m.transform(X[240:260])                                  # fills the cache
            for q in (m.q, 3.0):
                m.set_params(q=q)
                Xv, X2 = m._geometry(X[240:260], project_binary(X[240:260], m._remap, m.feature_indices_.size))
                want = subspace_distances(Xv, m.cluster_centers_, m.dimension_weights_ ** q, X2)
                np.testing.assert_allclose(m.transform(X[240:260]), want, rtol=1e-10, atol=1e-12)
            m.set_params(q=2.0)


def test_a_documents_probabilities_do_not_depend_on_the_rest_of_its_batch(fitted):
    """The distance regulariser scales with the row's own distances, not the batch's largest one (the
    engine scores a model's whole training snapshot at once and new documents in small batches)."""
    model, X, _, _, n_train = fitted
    rows = X[:n_train]
    batch = model.predict_proba(rows)
    alone = np.vstack([model.predict_proba(rows[i:i + 1]) for i in range(rows.shape[0])])
    np.testing.assert_allclose(alone, batch, rtol=1e-12, atol=1e-15)


def test_the_engine_decides_label_sets_from_probabilities_it_already_has(fitted, monkeypatch):
    """engine.predict_indicator with the batch's predict_proba: the same label sets as predict(X), without a
    second prediction; an estimator without ``decide`` still predicts."""
    from streamsemi.engine import predict_indicator

    model, X, _, _, n_train = fitted
    rows = X[n_train:]
    assert model.multilabel_
    expected = predict_indicator(model, rows)
    P = model.predict_proba(rows)
    calls = []
    original = PseudoLSC.predict
    monkeypatch.setattr(PseudoLSC, "predict", lambda self, X: calls.append(1) or original(self, X))
    got = predict_indicator(model, rows, P)
    assert calls == [] and got.dtype == bool and np.array_equal(got, expected)
    assert expected.sum(axis=1).max() > 1, "some documents get several labels"

    class NoDecide:  # a multi-label estimator without decide(): its predict is asked
        multilabel_ = True

        def predict(self, X):
            calls.append(1)
            return expected.astype(int)

    assert np.array_equal(predict_indicator(NoDecide(), rows, P), expected) and calls == [1]
