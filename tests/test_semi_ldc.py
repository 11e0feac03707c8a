"""Tests for Semi-LDC and constrained-PLSA (streamsemi.algorithms.semi_ldc)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from streamsemi.algorithms import ConstrainedPLSA, DegenerateInputError, make_estimator
from streamsemi.algorithms.semi_ldc import (
    SemiLDC,
    auto_max_components,
    constrained_kmeans_dense,
    gaussian_prior_bias,
    prior_kmeans_dense,
    randomized_pca,
    soft_lda_projection,
    soft_scatter_matrices,
)
from streamsemi.core.features import TextFeaturizer
from streamsemi.evaluation.metrics import macro_f1

GROUPS = ["comp.graphics", "rec.sport.hockey", "sci.space", "talk.politics.guns"]


@pytest.fixture(scope="module")
def corpus():
    """~400 real 20 Newsgroups posts from 4 groups, hashed, with 10% seeds."""
    from streamsemi.core import datasets

    ds = datasets.load("20newsgroups")
    rng = np.random.default_rng(0)
    labels = np.array(ds.labels, dtype=object)
    idx = np.concatenate([rng.choice(np.flatnonzero(labels == g), 100, replace=False) for g in GROUPS])
    feat = TextFeaturizer()
    X = feat.transform([ds.texts[i] for i in idx])
    keep = np.diff(X.indptr) > 0
    X, y = X[keep], labels[idx][keep]
    seeds = np.full(y.size, None, dtype=object)
    for g in GROUPS:
        members = np.flatnonzero(y == g)
        seeds[rng.choice(members, 10, replace=False)] = g
    return X, y, seeds, feat.sketch


@pytest.fixture(scope="module")
def fitted(corpus):
    X, _, seeds, _ = corpus
    return SemiLDC(random_state=0).fit(X, seeds)


def toy_counts():
    X = sp.csr_matrix(np.array([[3, 1, 0, 0], [2, 2, 0, 0], [0, 0, 2, 3], [0, 1, 3, 1], [1, 0, 0, 4.0]]))
    return X, ["a", None, "b", None, ""]


# -- constrained-PLSA --------------------------------------------------------

def test_plsa_log_likelihood_never_decreases(corpus):
    X, _, seeds, _ = corpus
    for alpha, lam in [(0.01, 1.0), (1.0, 1.0), (0.01, 0.3)]:
        p = ConstrainedPLSA(alpha=alpha, unlabeled_weight=lam, tol=0, max_iter=25).fit(X, seeds)
        obj = np.array(p.objective_history_)
        assert 3 <= obj.size <= 24  # tol=0: runs until no improvement at all, or the cap
        assert np.all(np.diff(obj) >= -1e-8 * np.abs(obj[:-1])), np.diff(obj)
        assert obj[-1] > obj[0]


def test_plsa_stops_on_relative_change_before_cap(corpus):
    X, _, seeds, _ = corpus
    p = ConstrainedPLSA(tol=1e-3, max_iter=200).fit(X, seeds)
    assert p.converged_ and p.n_iter_ < 200
    obj = p.objective_history_
    assert (obj[-1] - obj[-2]) <= 1e-3 * abs(obj[-2])


def test_plsa_seeds_clamped_and_posterior_rows(corpus):
    X, _, seeds, _ = corpus
    p = ConstrainedPLSA().fit(X, seeds)
    Q = p.soft_labels_
    np.testing.assert_allclose(Q.sum(axis=1), 1.0)
    lab = np.flatnonzero(seeds != None)  # noqa: E711
    expected = np.searchsorted(p.classes_, seeds[lab])
    np.testing.assert_array_equal(Q[lab].argmax(axis=1), expected)
    np.testing.assert_array_equal(Q[lab].max(axis=1), 1.0)
    P = p.predict_proba(X)
    assert P.shape == (X.shape[0], 4) and np.allclose(P.sum(axis=1), 1.0)
    assert np.isfinite(p.log_theta_).all()  # smoothing: no ln 0


def test_plsa_alone_beats_chance(corpus):
    X, y, seeds, _ = corpus
    p = ConstrainedPLSA().fit(X, seeds)
    unl = seeds == None  # noqa: E711
    assert macro_f1(y[unl], p.classes_[p.labels_][unl]) > 0.6


# -- building blocks -----------------------------------------------------------

def test_randomized_pca_matches_dense_centred_svd():
    rng = np.random.default_rng(1)
    X = sp.random(60, 40, density=0.2, random_state=2, format="csr") * 5
    mean, V, explained, total = randomized_pca(X, 5, rng, n_oversamples=20, n_iter=6)
    Xc = X.toarray() - X.toarray().mean(axis=0)
    _, s, Vt = np.linalg.svd(Xc, full_matrices=False)
    np.testing.assert_allclose(explained, s[:5] ** 2, rtol=1e-6)
    np.testing.assert_allclose(total, (s ** 2).sum(), rtol=1e-10)
    np.testing.assert_allclose(np.abs(V.T @ Vt[:5].T), np.eye(5), atol=1e-5)
    np.testing.assert_allclose(mean, X.toarray().mean(axis=0))


def test_randomized_pca_in_single_precision_matches_double():
    X = sp.random(300, 120, density=0.1, random_state=4, format="csr") * 3
    m64, V64, e64, t64 = randomized_pca(X, 10, np.random.default_rng(0), dtype=np.float64)
    m32, V32, e32, t32 = randomized_pca(X, 10, np.random.default_rng(0), dtype=np.float32)
    assert V32.dtype == np.float32 and V64.dtype == np.float64
    assert t32 == t64                                   # the total stays in double precision
    np.testing.assert_allclose(e32, e64, rtol=1e-4)
    np.testing.assert_allclose(np.abs(V32.T.astype(np.float64) @ V64), np.eye(10), atol=1e-3)


def test_single_precision_pca_keeps_the_fit(corpus, monkeypatch):
    import streamsemi.algorithms.semi_ldc as module

    X, _, seeds, _ = corpus
    single = SemiLDC().fit(X, seeds)
    monkeypatch.setattr(module, "PCA_DTYPE", np.float64)
    double = SemiLDC().fit(X, seeds)
    assert np.mean(single.labels_ == double.labels_) >= 0.99
    np.testing.assert_allclose(single.transform(X[:50]), double.transform(X[:50]), atol=1e-3)


@pytest.mark.parametrize("block", [4096, 7])   # one block, and 5 blocks of 7 rows (the last one short)
def test_soft_scatter_matches_definitions(block, monkeypatch):
    import streamsemi.algorithms.semi_ldc as module

    monkeypatch.setattr(module, "SCATTER_BLOCK", block)
    rng = np.random.default_rng(3)
    Z = rng.standard_normal((30, 4))
    Z -= Z.mean(axis=0)
    # rows need not sum to 1 (soft_labels="agreement" multiplies two posteriors): B of Eq. 11 is not I
    Q = rng.dirichlet(np.ones(3), size=30) * rng.uniform(0.2, 1.0, size=(30, 1))
    Sb, Sw = soft_scatter_matrices(Z, Q)
    Nc = Q.sum(axis=0)
    means = (Q.T @ Z) / Nc[:, None]
    Sb_ref = sum(Nc[c] * np.outer(means[c], means[c]) for c in range(3)) / Nc.sum()  # Eq. 12
    Sw_ref = sum(Q[i, c] * np.outer(Z[i] - means[c], Z[i] - means[c])
                 for i in range(30) for c in range(3)) / Nc.sum()               # Eq. 13
    np.testing.assert_allclose(Sb, Sb_ref, atol=1e-12)
    np.testing.assert_allclose(Sw, Sw_ref, atol=1e-12)
    A, ev = soft_lda_projection(Sb, Sw, 0.1, 2)
    ridge = 0.1 * np.trace(Sw) / 4
    np.testing.assert_allclose(Sb @ A, (Sw + ridge * np.eye(4)) @ A * ev, atol=1e-10)  # Eq. 14
    assert ev[0] >= ev[1] > 0


def test_constrained_kmeans_keeps_seeds():
    Z = np.array([[0.0, 0], [0.1, 0], [5, 5], [5.1, 5], [0.05, 0.1]])
    codes = np.array([-1, -1, 0, -1, 1])  # seeds deliberately far from their centroid
    labels, C, _ = constrained_kmeans_dense(Z, codes, np.array([[5.0, 5], [0, 0]]), 50)
    assert labels[2] == 0 and labels[4] == 1
    np.testing.assert_array_equal(labels[[0, 1, 3]], [1, 1, 0])


def test_prior_kmeans_moves_the_boundary_towards_the_small_class():
    """Hard EM with priors: between a 400-point and a 40-point Gaussian (equal spread), the
    midpoint rule gives the small class the large one's tail; the Bayes rule does not."""
    rng = np.random.default_rng(0)
    big, small = rng.normal(0.0, 1.0, 400), rng.normal(3.0, 1.0, 40)
    Z = np.concatenate([big, small])[:, None]
    truth = np.r_[np.zeros(400, int), np.ones(40, int)]
    codes = np.full(440, -1)
    codes[[0, 1, 2, 3, 400]] = [0, 0, 0, 0, 1]
    C0 = np.array([[Z[:4].mean()], [Z[400, 0]]])
    plain, _, _ = constrained_kmeans_dense(Z, codes, C0, 100)
    labels, C, bias, _ = prior_kmeans_dense(Z, codes, C0, 100)
    assert (plain == 1).sum() > 60  # nearest centroid over-predicts the small class
    assert 30 <= (labels == 1).sum() <= 55
    assert (labels == truth).mean() > (plain == truth).mean() + 0.03
    # the returned bias is the Bayes rule's 2 s^2 ln pi for the returned assignment
    np.testing.assert_allclose(bias, gaussian_prior_bias(Z, labels, C))
    s2 = ((Z - C[labels]) ** 2).mean()
    np.testing.assert_allclose(bias, 2 * s2 * np.log(np.bincount(labels) / 440))
    unl = codes < 0
    np.testing.assert_array_equal(labels[unl], (bias - (Z - C.T) ** 2).argmax(axis=1)[unl])


def test_skewed_corpus_small_classes_not_over_predicted():
    """Reuters R8 (800 stories, 3% seeds: six classes have one seed): the paper's pipeline
    (PLSA labels, nearest centroid) gives the one-seed classes twice their size and loses
    to constrained k-means; the defaults do not (docs/algorithms/semi-ldc.md, Robustness)."""
    from streamsemi.algorithms.constrained_kmeans import ConstrainedKMeans
    from streamsemi.evaluation.protocols import PROTOCOLS, make_draw, prepare

    p = prepare(["reuters-r8"], max_docs=800, seed=7)["reuters-r8"]
    d = make_draw(PROTOCOLS["robustness"], p, 3, 0, seed=7)
    X, y = p.X[d.rows], d.y_fit_single()
    truth = np.array(d.y_true, dtype=object)
    ev = np.flatnonzero(d.eval_mask)
    seeded = [v for v in y if v is not None]
    one_seed = [c for c in set(seeded) if seeded.count(c) == 1]
    assert len(one_seed) >= 4
    n_true = np.isin(truth[ev], one_seed).sum()

    def run(model):
        pred = model.fit(X, y).predict(X)[ev]
        return macro_f1(list(truth[ev]), list(pred)), np.isin(pred, one_seed).sum()

    f1_old, n_old = run(SemiLDC(soft_labels="plsa", mu=1.0, class_prior="uniform"))
    f1_new, n_new = run(SemiLDC())
    f1_ck, _ = run(ConstrainedKMeans())
    assert n_old > 1.8 * n_true and f1_old < f1_ck - 0.1
    assert n_new < 1.5 * n_true
    assert f1_new > f1_old + 0.1 and f1_new >= f1_ck - 0.02


# -- Semi-LDC ------------------------------------------------------------------

def test_registry_builds_semi_ldc():
    assert isinstance(make_estimator("semi-ldc"), SemiLDC)


def test_fit_beats_chance_and_outputs(corpus, fitted):
    X, y, seeds, _ = corpus
    m = fitted
    unl = seeds == None  # noqa: E711
    f1 = macro_f1(y[unl], m.classes_[m.labels_][unl])
    assert f1 > 0.7, f1  # chance is 0.25 for 4 balanced groups
    assert list(m.classes_) == sorted(GROUPS) and m.new_clusters_ == []
    assert m.cluster_centers_.shape == (4, 3)  # K-1 dimensions
    assert 3 <= m.n_components_ <= 300
    assert m.projection_.shape == (X.shape[1], 3)


def test_seeds_keep_their_class(corpus, fitted):
    _, _, seeds, _ = corpus
    lab = np.flatnonzero(seeds != None)  # noqa: E711
    np.testing.assert_array_equal(fitted.classes_[fitted.labels_[lab]], seeds[lab])
    Q = fitted.plsa_.soft_labels_
    np.testing.assert_array_equal(fitted.classes_[Q[lab].argmax(axis=1)], seeds[lab])


def test_predict_on_training_docs_agrees_with_labels(corpus, fitted):
    X, _, seeds, _ = corpus
    pred = fitted.predict(X)
    unl = seeds == None  # noqa: E711
    np.testing.assert_array_equal(pred[unl], fitted.classes_[fitted.labels_][unl])
    P = fitted.predict_proba(X)
    np.testing.assert_allclose(P.sum(axis=1), 1.0)
    assert P.min() >= 0 and P.max() <= 1
    np.testing.assert_array_equal(fitted.classes_[P.argmax(axis=1)], pred)
    # calibrated, not degenerate: confident on most docs, but not all probabilities 0/1
    assert np.median(P.max(axis=1)) > 0.5 and (P.max(axis=1) < 0.999).any()


def test_predict_unseen_documents(corpus):
    X, y, seeds, _ = corpus
    rng = np.random.default_rng(5)
    order = rng.permutation(X.shape[0])
    train, test = order[:300], order[300:]
    tr_seeds = seeds[train].copy()
    for g in GROUPS:  # make sure every class keeps a seed
        if not (tr_seeds == g).any():
            tr_seeds[np.flatnonzero(y[train] == g)[0]] = g
    m = SemiLDC().fit(X[train], tr_seeds)
    assert macro_f1(y[test], m.predict(X[test])) > 0.65


def test_explain_uses_sketch(corpus, fitted):
    _, _, _, sketch = corpus
    words = fitted.explain(sketch, top_n=8)
    assert set(words) == set(fitted.classes_)
    assert all(len(v) == 8 for v in words.values())
    assert {"space", "nasa", "orbit", "launch", "shuttle"} & set(words["sci.space"])
    assert {"hockey", "game", "team", "nhl", "season", "play"} & set(words["rec.sport.hockey"])
    ids = fitted.explain(None, top_n=3)
    assert all(w.startswith("f") for v in ids.values() for w in v)


def test_deterministic(corpus):
    X, _, seeds, _ = corpus
    a = SemiLDC(random_state=7).fit(X, seeds)
    b = SemiLDC(random_state=7).fit(X, seeds)
    np.testing.assert_array_equal(a.labels_, b.labels_)
    np.testing.assert_array_equal(a.projection_, b.projection_)
    np.testing.assert_array_equal(a.predict_proba(X[:20]), b.predict_proba(X[:20]))


def test_new_clusters(corpus):
    X, y, seeds, _ = corpus
    partial = np.where(seeds == "sci.space", None, seeds)  # nobody seeds sci.space
    m = SemiLDC(n_new_clusters=1, random_state=0, discovery="legacy").fit(X, partial)
    assert list(m.classes_[-1:]) == ["new-0"] and m.new_clusters_ == ["new-0"]
    space = y == "sci.space"
    # the discovered cluster captures the unseeded group (majority of it)
    assert np.mean(m.classes_[m.labels_[space]] == "new-0") > 0.5


def test_paper_variant_without_refinement(corpus):
    X, y, seeds, _ = corpus
    m = SemiLDC(n_refine=0).fit(X, seeds)
    assert m.n_refine_done_ == 0
    unl = seeds == None  # noqa: E711
    assert macro_f1(y[unl], m.classes_[m.labels_][unl]) > 0.6


@pytest.mark.parametrize("weighting", ["tf-l2", "counts"])
def test_other_weightings_run(corpus, weighting):
    X, _, seeds, _ = corpus
    m = SemiLDC(weighting=weighting, max_components=50).fit(X[:200], seeds[:200])
    pred = m.predict(X[:200])
    assert set(pred) <= set(m.classes_) and np.mean(pred == m.classes_[m.labels_]) > 0.9


# -- degenerate inputs ---------------------------------------------------------

@pytest.mark.parametrize("cls", [SemiLDC, ConstrainedPLSA])
def test_degenerate_inputs(cls):
    X, y = toy_counts()
    with pytest.raises(DegenerateInputError, match="no seed labels"):
        cls().fit(X, [None] * 5)
    with pytest.raises(DegenerateInputError, match="only 1 seeded class"):
        cls().fit(X, ["a", None, "a", None, None])
    empty = sp.vstack([X, sp.csr_matrix((1, 4))]).tocsr()
    with pytest.raises(DegenerateInputError, match="empty document"):
        cls().fit(empty, y + [None])
    with pytest.raises(DegenerateInputError, match="all zero"):
        cls().fit(sp.csr_matrix((5, 4)), y)
    with pytest.raises(DegenerateInputError, match="larger than the number of documents"):
        cls(n_new_clusters=4).fit(X, y)
    with pytest.raises(DegenerateInputError, match="y has 3 elements"):
        cls().fit(X, y[:3])


def test_toy_fit_separates_blocks():
    X, y = toy_counts()
    m = SemiLDC().fit(X, y)
    np.testing.assert_array_equal(m.classes_[m.labels_], ["a", "a", "b", "b", "b"])
    np.testing.assert_array_equal(m.predict(X), ["a", "a", "b", "b", "b"])


def test_invalid_parameters():
    X, y = toy_counts()
    with pytest.raises(ValueError, match=r"'weighting' parameter of SemiLDC must be a str among .*Got 'bm25' instead"):
        SemiLDC(weighting="bm25").fit(X, y)
    with pytest.raises(ValueError, match=r"'mu' parameter of SemiLDC must be a float in the range \(0.0, inf\)\. Got 0 instead"):
        SemiLDC(mu=0).fit(X, y)
    with pytest.raises(ValueError, match=r"'alpha' parameter of ConstrainedPLSA must be a float in the range \(0.0, inf\)\. Got 0 instead"):
        ConstrainedPLSA(alpha=0).fit(X, y)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_minus_outer_in_place(dtype):
    from streamsemi.algorithms.semi_ldc import _minus_outer

    rng = np.random.default_rng(3)
    A = rng.standard_normal((7, 4)).astype(dtype)
    u, v = rng.standard_normal(7), rng.standard_normal(4)
    expected = A.astype(np.float64) - np.outer(u, v)
    out = _minus_outer(A, u, v)
    assert out is A                                     # no second vocabulary x l array
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    F = np.asfortranarray(rng.standard_normal((7, 4)))  # not C-contiguous: a plain copy
    np.testing.assert_allclose(_minus_outer(F, u, v), F - np.outer(u, v))


def test_auto_max_components_by_formula():
    # one component per 10 documents, within [300, 1000]
    assert [auto_max_components(n) for n in (5, 500, 1200, 3000, 3009, 7674, 9100, 10_000, 18_820)] == \
        [300, 300, 300, 300, 300, 767, 910, 1000, 1000]
    assert auto_max_components(450, floor=20, ceiling=40, docs_per_component=15) == 30
    assert auto_max_components(10, floor=20, ceiling=40, docs_per_component=15) == 20


def test_auto_max_components_is_applied_to_the_window(corpus, monkeypatch):
    import streamsemi.algorithms.semi_ldc as module

    X, _, seeds, _ = corpus
    seen = []

    def tiny_cap(n_samples):
        seen.append(n_samples)
        return 12

    monkeypatch.setattr(module, "auto_max_components", tiny_cap)
    m = SemiLDC(n_refine=0).fit(X, seeds)
    assert seen == [X.shape[0]]
    assert m.n_components_ <= 12
    fixed = SemiLDC(n_refine=0, max_components=12).fit(X, seeds)
    np.testing.assert_array_equal(m.labels_, fixed.labels_)
    assert m.get_params()["max_components"] == "auto"
    with pytest.raises(ValueError, match=r"'max_components' parameter of SemiLDC must be .*Got 'many' instead"):
        SemiLDC(max_components="many").fit(X, seeds)


def test_calibrate_temperature_flattens_only_when_seeds_disagree():
    from streamsemi.algorithms.semi_ldc import calibrate_temperature

    D2 = np.array([[0.1, 2.0], [2.0, 0.1], [0.2, 1.5], [0.3, 1.0]])
    assert calibrate_temperature(D2, np.array([0, 1, 0, -1]), 0.5) == pytest.approx(0.5)
    wrong = calibrate_temperature(D2, np.array([0, 1, 1, 0]), 0.5)  # one seed nearer class 0
    assert 0.5 < wrong <= 50.0


@pytest.mark.parametrize("soft_labels", ["plsa", "agreement"])
def test_other_soft_labels_fit_and_keep_seeds(corpus, soft_labels):
    X, y, seeds, _ = corpus
    m = SemiLDC(soft_labels=soft_labels, max_components=50).fit(X, seeds)
    lab = seeds != None  # noqa: E711
    np.testing.assert_array_equal(m.classes_[m.labels_][lab], seeds[lab])
    assert macro_f1(y[~lab], m.classes_[m.labels_][~lab]) > 0.8
    np.testing.assert_array_equal(m.predict(X), m.classes_[m._scores(X).argmax(axis=1)])


def test_two_classes_keep_graded_scores(corpus):
    X, y, seeds, _ = corpus
    keep = np.isin(y, ["sci.space", "rec.sport.hockey"])
    m = SemiLDC().fit(X[keep], seeds[keep])
    assert not m.normalized_ and m.cluster_centers_.shape == (2, 1)
    P = m.predict_proba(X[keep])
    assert np.unique(P[:, 0]).size > 10  # graded, not just two values
    unl = seeds[keep] == None  # noqa: E711
    assert macro_f1(y[keep][unl], m.classes_[m.labels_][unl]) > 0.8
