"""Tests for FSL (feature space learning): the paper's equations and the four variants."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.exceptions import NotFittedError

from streamsemi.algorithms import DegenerateInputError, make_estimator
from streamsemi.algorithms.constrained_kmeans import ConstrainedKMeans
from streamsemi.algorithms.fsl import (
    FSL,
    ROUND_FIRST_MIN_DOCS,
    _spherical_kmeans,
    affinity_propagation,
    ap_preferences,
    bursty_features,
    chosen_rounds,
    confidence,
    cumulative_confidence,
    default_round,
    gain_se,
    held_out_folds,
    macro_f1_by_round,
    rich_information_features,
    seed_agreement,
    select_trust_samples,
    significant_cluster_features,
    triset_similarity,
    trust_quota_reached,
    update_rif_weights,
    weighted_cosine,
    weighted_doc_norms,
)
from streamsemi.core.features import tfidf
from streamsemi.evaluation.metrics import accuracy_hungarian

VARIANTS = ["sk", "ck", "ap", "sap"]


# ------------------------------------------------------------------ the equations, by hand

def test_rif_selection_matches_definition_2():
    # trust sample d*: features 0..3 with counts 1, 1, 4, 6 -> mean count 3
    feats = np.array([0, 1, 2, 3])
    counts = np.array([1.0, 1.0, 4.0, 6.0])
    # cluster frequencies; features with m > 0: 0, 2, 3, 5 -> mean (10 + 2 + 8 + 5) / 4 = 6.25
    m = np.array([10.0, 0.0, 2.0, 8.0, 0.0, 5.0])
    # eta = mu = 1: bursty in d* = {2, 3}; frequent in cluster = {0, 3} -> RIF = {3}
    assert rich_information_features(feats, counts, m, 1.0, 1.0).tolist() == [3]
    # eta = 0.5 (n >= 1.5): {2, 3}; mu = 0.3 (m >= 1.875): {0, 2, 3, 5} -> {2, 3}
    assert rich_information_features(feats, counts, m, 0.5, 0.3).tolist() == [2, 3]
    # a feature of the cluster that d* lacks (5) is never an RIF of d*
    assert 5 not in rich_information_features(feats, counts, m, 0.0, 0.0).tolist()
    # eta large: nothing is bursty enough
    assert rich_information_features(feats, counts, m, 3.0, 0.0).size == 0


def test_confidence_eq3_and_eq4():
    assert confidence(1, 10) == pytest.approx(0.9)
    assert confidence(10, 10) == 0.0
    for t in range(1, 11):
        assert cumulative_confidence(t, 10) == pytest.approx(sum(confidence(i, 10) for i in range(1, t + 1)))


def test_weights_follow_eq5():
    T = 10
    w0 = np.array([0.5, 0.0, 0.0, 7.0])
    # t = 1: conf_1 / conf_T = 0.9 / 0.9 = 1 -> w = w + n on the RIFs, others unchanged
    w1 = update_rif_weights(w0, np.array([0, 2]), np.array([2.0, 3.0]), 1, T)
    np.testing.assert_allclose(w1, [2.5, 0.0, 3.0, 7.0])
    # t = 2: conf_2 = 0.8, conf_T = 0.9 + 0.8 = 1.7
    w2 = update_rif_weights(w1, np.array([0, 1]), np.array([1.0, 4.0]), 2, T)
    r = 0.8 / 1.7
    np.testing.assert_allclose(w2, [r * 2.5 + r * 1.0, r * 4.0, 3.0, 7.0])
    np.testing.assert_allclose(w0, [0.5, 0.0, 0.0, 7.0])  # input not modified
    # t = T: zero confidence, the RIFs get weight 0
    np.testing.assert_allclose(update_rif_weights(w1, np.array([0]), np.array([5.0]), T, T),
                               [0.0, 0.0, 3.0, 7.0])


def test_trust_samples_are_members_with_best_membership():
    score = np.array([0.9, 0.5, 0.7, 0.95, 0.2, 0.6, 0.99])
    labels = np.array([0, 0, 0, 1, 1, 1, 2])
    eligible = np.array([False, True, True, True, True, True, False])
    trust = select_trust_samples(score, labels, eligible, 4)
    # cluster 0: row 0 is labeled already, best eligible is row 2 (0.7 > 0.5)
    # cluster 1: row 3; cluster 2: only member not eligible; cluster 3: empty
    assert trust.tolist() == [2, 3, -1, -1]
    rng = np.random.default_rng(0)
    for _ in range(20):
        score = rng.random(50)
        labels = rng.integers(0, 5, 50)
        eligible = rng.random(50) > 0.3
        trust = select_trust_samples(score, labels, eligible, 5)
        for k, row in enumerate(trust):
            members = np.flatnonzero((labels == k) & eligible)
            if members.size == 0:
                assert row == -1
            else:
                assert labels[row] == k and eligible[row]
                assert score[row] == score[members].max()


def test_seed_agreement_admits_rows_their_class_labels_would_give():
    Xn = sp.csr_matrix(np.array([[1.0, 0, 0], [0, 1, 0], [0.9, 0.1, 0], [0.1, 0.9, 0],
                                 [0.8, 0.2, 0], [0, 0, 1.0]]))
    Xn = sp.csr_matrix(Xn.multiply(1 / np.sqrt(Xn.multiply(Xn).sum(axis=1))))
    codes = np.array([0, 1, -1, -1, -1, -1])
    # row 2 clustered with class 1 but nearest class 0's seed: refused; row 5 in a new cluster: admitted
    labels = np.array([0, 1, 1, 1, 0, 2])
    np.testing.assert_array_equal(seed_agreement(Xn, codes, labels, 2),
                                  [True, True, False, True, True, True])
    # labels >= n_known in ``codes`` (trust samples of new clusters) do not count as a class
    codes_new = np.array([0, 1, -1, -1, -1, 2])
    np.testing.assert_array_equal(seed_agreement(Xn, codes_new, labels, 2),
                                  [True, True, False, True, True, True])


def test_trust_check_keeps_wrong_trust_samples_out_on_a_skewed_corpus():
    """Reuters R8 (1,200 stories, 3% seeds, six one-seed classes): the paper's Eq. 7 alone lets
    drifted one-seed clusters take other classes' documents as labels; the check takes fewer
    and scores higher (docs/algorithms/fsl.md, Robustness)."""
    from streamsemi.evaluation.metrics import macro_f1
    from streamsemi.evaluation.protocols import PROTOCOLS, make_draw, prepare

    p = prepare(["reuters-r8"], max_docs=1200, seed=7)["reuters-r8"]
    d = make_draw(PROTOCOLS["robustness"], p, 3, 0, seed=7)
    X, y = p.X[d.rows], d.y_fit_single()
    truth = np.array(d.y_true, dtype=object)
    ev = np.flatnonzero(d.eval_mask)
    out = {}
    for check in ("none", "labeled"):
        m = FSL(trust_check=check, anchor_weight=1.0).fit(X, y)   # the paper's unanchored k-means
        ts = np.concatenate(m.trust_samples_)
        wrong = int((truth[ts] != m.classes_[m.labels_[ts]]).sum())
        out[check] = (macro_f1(list(truth[ev]), list(m.predict(X)[ev])), wrong)
    assert out["labeled"][1] < out["none"][1]
    assert out["labeled"][0] > out["none"][0] + 0.02


@pytest.mark.parametrize("anchor", [1.0, 10.0])
def test_spherical_kmeans_centres_weigh_fixed_rows_by_the_anchor(anchor):
    rng = np.random.default_rng(3)
    Xd = np.abs(rng.normal(size=(40, 12))) + np.repeat(np.eye(2, 12) * 3, 20, axis=0)
    Xd /= np.linalg.norm(Xd, axis=1, keepdims=True)
    Xn = sp.csr_matrix(Xd)
    fixed = np.array([0, 1, 20, 21])
    C0 = Xd[[0, 20]]
    labels, C, sim = _spherical_kmeans(Xn, Xn.multiply(Xn).tocsr(), C0, np.ones((2, 12)), fixed,
                                       np.array([0, 0, 1, 1]), 100, anchor)
    assert (labels[fixed] == [0, 0, 1, 1]).all()
    w = np.ones(40)
    w[fixed] = anchor
    for k in range(2):   # the converged centre is the anchor-weighted mean of its members
        mean = (w[labels == k, None] * Xd[labels == k]).sum(axis=0)
        np.testing.assert_allclose(C[k], mean / np.linalg.norm(mean), atol=1e-12)
    np.testing.assert_allclose(sim, Xd @ C.T, atol=1e-12)


def test_anchor_weight_moves_fsck_centres_and_leaves_the_baseline_alone(corpus):
    Xtr, seeds, *_ = corpus
    plain = FSL(variant="ck", max_iter=3, anchor_weight=1.0).fit(Xtr, seeds)
    anchored = FSL(variant="ck", max_iter=3, anchor_weight=10.0).fit(Xtr, seeds)
    lab = np.flatnonzero(seeds != None)  # noqa: E711
    assert (plain.columns_ == anchored.columns_).all()
    Xs = tfidf(sp.csr_matrix(Xtr[lab][:, plain.columns_]), plain.idf_)
    own = np.asarray(Xs @ anchored.cluster_centers_.T)
    plain_own = np.asarray(Xs @ plain.cluster_centers_.T)
    codes = np.searchsorted(plain.classes_, seeds[lab].astype(str))
    # anchored centres lie nearer their own seeds than the plain ones do
    assert own[np.arange(lab.size), codes].sum() > plain_own[np.arange(lab.size), codes].sum()
    a = FSL(variant="ck", feature_learning=False, anchor_weight=10.0).fit(Xtr, seeds)
    b = ConstrainedKMeans().fit(Xtr, seeds)
    assert (a.classes_[a.labels_] == b.classes_[b.labels_]).all()
    np.testing.assert_allclose(a.cluster_centers_, np.asarray(b.cluster_centers_)[:, a.columns_], atol=1e-10)
    with pytest.raises(ValueError, match="anchor_weight"):
        FSL(anchor_weight=0.0).fit(Xtr, seeds)


def test_significant_cluster_features_eq16():
    m = np.array([5.0, 1.0, 3.0, 9.0])
    assert significant_cluster_features(np.array([0, 1]), m, np.zeros(0, dtype=int)).tolist() == [0, 1]
    # mean over SFC = {2, 3} is 6: only feature 3 (9) and not 0 (5) qualify
    assert significant_cluster_features(np.array([0, 3]), m, np.array([2, 3])).tolist() == [3]


def test_weighted_cosine():
    X = sp.csr_matrix(np.array([[3.0, 4.0, 0.0], [0.0, 0.0, 2.0]]))
    Xn = sp.csr_matrix(X / np.linalg.norm(X.toarray(), axis=1, keepdims=True))
    C = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 1.0]]) / np.array([[1.0], [np.sqrt(2)]])
    G1 = np.ones_like(C)
    np.testing.assert_allclose(weighted_cosine(Xn, Xn.multiply(Xn).tocsr(), C, G1), Xn.toarray() @ C.T)
    # scaling feature 0 by 2 in cluster 0's space: doc 0 -> (6, 4, 0), cos to (1,0,0) = 6 / sqrt(52)
    G = G1.copy()
    G[0, 0] = 2.0
    S = weighted_cosine(Xn, Xn.multiply(Xn).tocsr(), C, G)
    assert S[0, 0] == pytest.approx(6 / np.sqrt(52))
    assert S[0, 1] == pytest.approx((Xn.toarray() @ C.T)[0, 1])


def test_triset_similarity_by_hand():
    # i has features {0, 1}, j has {1, 2}; l1 values
    U = sp.csr_matrix(np.array([[0.5, 0.5, 0.0], [0.0, 0.25, 0.75]]))
    B = sp.csr_matrix((U.toarray() > 0).astype(float))
    SF = sp.csr_matrix(np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]))
    S = triset_similarity(U, B, U, B, SF, 1.0, 2.0, 3.0)
    # s(0, 1): CFS = {1} -> u_1^1 = 0.25; SCS = F_0 & SF_1 = {1} -> 0.25; UFS = {0} -> u_0^0 = 0.5
    assert S[0, 1] == pytest.approx(1 * 0.25 + 2 * 0.25 - 3 * 0.5)
    # s(1, 0): CFS = {1} -> u_0^1 = 0.5; SCS = F_1 & SF_0 = {} ; UFS = {2} -> 0.75
    assert S[1, 0] == pytest.approx(0.5 - 3 * 0.75)
    # self: all shared, no unilateral features
    assert S[0, 0] == pytest.approx(1.0 + 2 * 0.5)


def test_bursty_features():
    X = sp.csr_matrix(np.array([[1.0, 1.0, 4.0, 0.0], [2.0, 0.0, 0.0, 2.0]]))
    assert bursty_features(X, 1.0).toarray().tolist() == [[0, 0, 1, 0], [1, 0, 0, 1]]


def test_ap_preferences_eq11_and_labeled_points_are_exemplars():
    rng = np.random.default_rng(1)
    pts = np.vstack([rng.normal(0, 0.1, (10, 2)), rng.normal(5, 0.1, (10, 2)), rng.normal((0, 5), 0.1, (10, 2))])
    S = -((pts[:, None, :] - pts[None, :, :]) ** 2).sum(-1)
    labeled = np.zeros(30, dtype=bool)
    labeled[[0, 1, 10]] = True
    off = S[np.ix_(~labeled, ~labeled)][~np.eye(27, dtype=bool)]
    pref, P, Q = ap_preferences(off, labeled, 0.5)
    assert P == off.min() and Q == off.max()
    assert pref[2] == pytest.approx(P - 0.5 * (Q - P))
    assert pref[0] == pytest.approx(Q + 2 * (Q - P))
    S2 = S.copy()
    np.fill_diagonal(S2, np.where(labeled, pref, -2.0))
    exemplars, labels, _ = affinity_propagation(S2)
    assert {0, 1, 10} <= set(exemplars.tolist())
    # the third blob, with no labeled point, still gets its own exemplar
    groups = exemplars[labels]
    assert set(groups[20:]).isdisjoint(set(groups[:20]))
    assert len(set(groups[:10])) <= 2 and len(set(groups[10:20])) == 1


# ------------------------------------------------------------------ real-corpus subset

@pytest.fixture(scope="module")
def corpus():
    from streamsemi.core import datasets
    from streamsemi.core.features import TextFeaturizer

    d = datasets.load("20newsgroups")
    groups = ["rec.sport.hockey", "sci.space", "talk.politics.mideast", "comp.graphics"]
    rng = np.random.default_rng(0)
    idx = np.array([i for i, lab in enumerate(d.labels) if lab in groups])
    idx = rng.choice(idx, 360, replace=False)
    f = TextFeaturizer(n_features=2**16)
    X = f.transform([d.texts[i] for i in idx])
    y = np.array([d.labels[i] for i in idx], dtype=object)
    keep = np.diff(X.indptr) > 0
    X, y = X[keep], y[keep]
    train, test = np.arange(X.shape[0]) < 240, np.arange(X.shape[0]) >= 240
    seeds = np.full(int(train.sum()), None, dtype=object)
    seeds[:40] = y[train][:40]
    return X[train], seeds, y[train], X[test], y[test], f.sketch


@pytest.mark.parametrize("variant", VARIANTS)
def test_variants_fit_predict_beat_chance(corpus, variant):
    Xtr, seeds, ytr, Xte, yte, sketch = corpus
    m = make_estimator(f"fsl-{variant}", max_iter=5).fit(Xtr, seeds)
    assert isinstance(m, FSL) and m.variant == variant
    assert sorted(m.classes_) == sorted(set(seeds[seeds != None]))  # noqa: E711
    assert m.new_clusters_ == []
    pred_tr = m.classes_[m.labels_]
    assert accuracy_hungarian(ytr, pred_tr) > 0.6  # chance is 0.25 with 4 groups
    P = m.predict_proba(Xte)
    assert P.shape == (Xte.shape[0], m.classes_.size)
    np.testing.assert_allclose(P.sum(axis=1), 1.0)
    pred = m.predict(Xte)
    assert (pred == m.classes_[P.argmax(axis=1)]).all()
    assert np.mean(pred == yte) > 0.6
    words = m.explain(sketch, top_n=5)
    assert set(words) == set(m.classes_) and all(len(v) == 5 for v in words.values())
    # learned feature space: weights only on features of the window, some learned
    assert m.feature_weights_.shape == m.cluster_centers_.shape
    assert (m.feature_weights_ >= 0).all() and (m.feature_weights_ > 0).any()
    assert len(m.trust_samples_) >= 1


def test_explain_shows_topic_words(corpus):
    Xtr, seeds, *_, sketch = corpus
    words = FSL(variant="ck", max_iter=5).fit(Xtr, seeds).explain(sketch, top_n=15)
    assert {"space", "nasa", "launch", "orbit", "shuttle"} & set(words["sci.space"])
    assert {"hockey", "game", "team", "nhl", "season", "play"} & set(words["rec.sport.hockey"])


def test_fsck_seeds_and_trust_samples_stay_in_their_class(corpus):
    Xtr, seeds, *_ = corpus
    m = FSL(variant="ck", max_iter=6).fit(Xtr, seeds)
    lab = np.flatnonzero(seeds != None)  # noqa: E711
    assert (m.classes_[m.labels_[lab]] == seeds[lab]).all()
    # each trust sample keeps the cluster it had when it was chosen
    assert m.trust_samples_
    first = m.trust_samples_[0]
    again = FSL(variant="ck", max_iter=2).fit(Xtr, seeds)
    assert (m.labels_[first] == again.labels_[first]).all()


def test_without_feature_learning_matches_constrained_kmeans(corpus):
    Xtr, seeds, *_ = corpus
    a = FSL(variant="ck", feature_learning=False).fit(Xtr, seeds)
    b = ConstrainedKMeans().fit(Xtr, seeds)
    assert (a.classes_[a.labels_] == b.classes_[b.labels_]).all()
    assert not a.feature_weights_.any() and a.trust_samples_ == []
    s = FSL(variant="sk", feature_learning=False).fit(Xtr, seeds)
    t = ConstrainedKMeans(constrained=False).fit(Xtr, seeds)
    assert (s.classes_[s.labels_] == t.classes_[t.labels_]).all()


@pytest.mark.parametrize("variant", ["ck", "sap"])
def test_deterministic(corpus, variant):
    Xtr, seeds, _, Xte, *_ = corpus
    a = FSL(variant=variant, max_iter=4, ap_sample=150, random_state=3).fit(Xtr, seeds)
    b = FSL(variant=variant, max_iter=4, ap_sample=150, random_state=3).fit(Xtr, seeds)
    assert (a.labels_ == b.labels_).all()
    np.testing.assert_array_equal(a.predict_proba(Xte), b.predict_proba(Xte))
    np.testing.assert_array_equal(a.feature_weights_, b.feature_weights_)


def test_ap_sample_bound_and_new_clusters(corpus):
    Xtr, seeds, *_ = corpus
    m = FSL(variant="ap", ap_sample=100, max_iter=3, n_new_clusters=1, discovery="legacy").fit(Xtr, seeds)
    assert m.labels_.shape == (Xtr.shape[0],)
    assert len(m.new_clusters_) <= 1
    assert list(m.classes_[: m.classes_.size - len(m.new_clusters_)]) == sorted(set(seeds[:40]))
    k = FSL(variant="ck", max_iter=3, n_new_clusters=2, discovery="legacy").fit(Xtr, seeds)
    assert k.new_clusters_ == ["new-0", "new-1"] and k.classes_[-1] == "new-1"


def test_degenerate_inputs():
    X = sp.csr_matrix(np.array([[1.0, 2.0, 0.0], [0.0, 1.0, 3.0], [2.0, 0.0, 1.0]]))
    with pytest.raises(DegenerateInputError, match="no seed labels"):
        FSL().fit(X, [None, None, None])
    with pytest.raises(DegenerateInputError, match="only 1 seeded class"):
        FSL().fit(X, ["a", "a", None])
    with pytest.raises(DegenerateInputError, match="empty document"):
        FSL().fit(sp.csr_matrix(np.array([[1.0, 0.0], [0.0, 0.0], [0.0, 2.0]])), ["a", "b", None])
    with pytest.raises(DegenerateInputError, match="all zero"):
        FSL().fit(sp.csr_matrix((3, 4)), ["a", "b", None])
    with pytest.raises(DegenerateInputError, match="larger than the number of documents"):
        FSL(n_new_clusters=2).fit(X, ["a", "b", None])
    with pytest.raises(DegenerateInputError, match="elements but X has"):
        FSL().fit(X, ["a", "b"])
    with pytest.raises(ValueError, match=r"'variant' parameter of FSL must be a str among .*Got 'xx' instead"):
        FSL(variant="xx").fit(X, ["a", "b", None])
    m = FSL(variant="ap").fit(X, ["a", "b", None])
    with pytest.raises(ValueError, match="features"):
        m.predict(sp.csr_matrix((1, 5)))


def test_trust_quota_counts_trust_samples_against_seeds():
    seeds = np.array([0, 1, 1, -1, -1, -1, -1, -1])
    labeled = np.array([0, 1, 1, 0, -1, 1, 2, -1])  # class 0: 1 seed + 1 trust; class 1: 2 seeds + 1 trust
    assert trust_quota_reached(labeled, seeds, 2, 1.0).tolist() == [True, False]
    assert trust_quota_reached(labeled, seeds, 2, 0.5).tolist() == [True, True]
    assert trust_quota_reached(labeled, seeds, 2, 2.0).tolist() == [False, False]
    assert trust_quota_reached(seeds, seeds, 2, 0.0).tolist() == [True, True]


def test_max_trust_per_seed_bounds_each_class_trust_samples(corpus):
    Xtr, seeds, *_ = corpus
    m = FSL(max_iter=8, patience=8, trust_new_clusters=False).fit(Xtr, seeds)
    capped = FSL(max_iter=8, patience=8, trust_new_clusters=False, max_trust_per_seed=0.2).fit(Xtr, seeds)
    n_seeds = {c: int((seeds == c).sum()) for c in capped.classes_}
    got = {c: 0 for c in capped.classes_}
    for rows in capped.trust_samples_:
        for c in capped.classes_[capped.labels_[rows]]:
            got[c] += 1
    assert all(got[c] <= np.ceil(0.2 * n_seeds[c]) for c in got), (got, n_seeds)  # none once at the quota
    uncapped = sum(len(r) for r in m.trust_samples_)
    assert sum(got.values()) < uncapped  # the bound bites on this corpus


def test_weighted_cosine_with_precomputed_terms_and_prediction_cache(corpus):
    from streamsemi.algorithms import fsl as fsl_module

    rng = np.random.default_rng(3)
    Xn = sp.random(30, 40, density=0.2, format="csr", random_state=1)
    C, G = rng.random((4, 40)), 1.0 + rng.random((4, 40))
    Xn_sq = Xn.multiply(Xn).tocsr()
    plain = weighted_cosine(Xn, Xn_sq, C, G)
    np.testing.assert_array_equal(weighted_cosine(Xn, Xn_sq, C, G, terms=fsl_module.centre_terms(C, G)), plain)
    np.testing.assert_array_equal(weighted_cosine(Xn, Xn_sq, C, G, weighted_doc_norms(Xn_sq, G)), plain)
    dense = Xn.toarray()
    ref = dense @ (C * G * G).T
    den = np.sqrt((dense[:, None, :] ** 2 * G[None] ** 2).sum(axis=2)) * np.linalg.norm(C * G, axis=1)[None]
    np.testing.assert_allclose(plain, np.divide(ref, den, out=np.zeros_like(ref), where=den > 0))
    Xtr, seeds, ytr, Xte, *_ = corpus
    m = FSL(max_iter=3).fit(Xtr, seeds)
    first = m.predict_proba(Xte)
    assert m in fsl_module._CENTRE_TERMS
    np.testing.assert_array_equal(m.predict_proba(Xte), first)  # from the cached terms
    m.fit(Xtr[::-1], seeds[::-1])  # a refit drops the cached terms of the former model
    fresh = FSL(max_iter=3).fit(Xtr[::-1], seeds[::-1])
    np.testing.assert_array_equal(m.predict_proba(Xte), fresh.predict_proba(Xte))


# ------------------------------------------------------------------ held-out round selection

def test_held_out_folds_keep_every_class_seeded_in_every_fit():
    rng = np.random.default_rng(0)
    # class 0: 7 seeds, class 1: 2, class 2: 1 (never held out), class 3: 3; 20 unlabeled rows
    codes = np.array([0] * 7 + [1] * 2 + [2] + [3] * 3 + [-1] * 20)
    codes = codes[rng.permutation(codes.size)]
    for seed in range(5):
        folds = held_out_folds(codes, 3, np.random.default_rng(seed))
        assert (folds[codes < 0] == -1).all()
        assert (folds[codes == 2] == -1).all(), "a one-seed class keeps its seed in every fit"
        for c, s in ((0, 7), (1, 2), (3, 3)):
            assert (folds[codes == c] >= 0).all()
            for f in range(3):
                held = int(((codes == c) & (folds == f)).sum())
                assert held <= -(-s // 3) and s - held >= 1
    keys = np.arange(codes.size, dtype=np.uint64) * np.uint64(7919) + np.uint64(1)
    a = held_out_folds(codes, 3, np.random.default_rng(1), keys)
    p = np.random.default_rng(9).permutation(codes.size)
    b = held_out_folds(codes[p], 3, np.random.default_rng(1), keys[p])
    np.testing.assert_array_equal(a[p], b, err_msg="dealt by content: the same folds in any row order")


def test_macro_f1_by_round_counts_precision_and_the_chosen_round():
    truth = np.array([0, 0, 0, 0, 1])
    history = np.array([[0, 0, 0, 0, 1],    # both classes right: 1
                        [0, 0, 0, 0, 0],    # class 0 takes class 1's row: (8/9 + 0) / 2
                        [1, 0, 0, 0, 1],    # (6/7 + 2/3) / 2: class 1 loses precision
                        [2, 0, 0, 0, 1]])   # a class not held out takes a row: (6/7 + 1) / 2
    np.testing.assert_allclose(macro_f1_by_round(history, truth),
                               [1.0, 4 / 9, (6 / 7 + 2 / 3) / 2, (6 / 7 + 1) / 2])
    assert chosen_rounds(np.array([0.9, 0.5, 0.875])) == 1
    assert chosen_rounds(np.array([0.5, 0.9, 0.9, 0.7])) == 3, "the later of equal rounds"
    assert chosen_rounds(np.array([0.8])) == 1
    assert chosen_rounds(np.array([0.7, 0.7, 0.7])) == 3, "no gain over the last round: every round"
    # the best round replaces the last only when its gain exceeds two standard errors of it
    scores = np.array([0.70, 0.62, 0.66, 0.65])
    assert chosen_rounds(scores, np.array([0.02, 0.0, 0.0, 0.0])) == 1, "a gain of 2.5 standard errors"
    assert chosen_rounds(scores, np.array([0.03, 0.0, 0.0, 0.0])) == 4, "a gain of 1.7 standard errors"
    assert chosen_rounds(np.array([0.60, 0.66, 0.62]), np.array([0.0, 0.015, 0.0])) == 2
    # with the first round as the default (large windows) the later rounds must beat it instead
    assert chosen_rounds(np.array([0.60, 0.66, 0.62]), np.array([0.0, 0.015, 0.0]), default=0) == 2
    assert chosen_rounds(np.array([0.60, 0.66, 0.62]), np.array([0.0, 0.04, 0.0]), default=0) == 1, "1.5 SE"
    assert chosen_rounds(np.array([0.7, 0.7, 0.7]), default=0) == 1, "no gain over the first round: one round"
    assert chosen_rounds(np.array([0.9, 0.5, 0.875]), default=0) == 1
    assert chosen_rounds(np.array([0.5, 0.9, 0.9, 0.7]), default=0) == 3


def test_the_default_round_is_the_first_from_the_window_size_on_and_the_last_below():
    big, small = ROUND_FIRST_MIN_DOCS, ROUND_FIRST_MIN_DOCS - 1
    assert default_round("held-out", big) == 0 and default_round("held-out", small) == -1
    assert default_round("held-out-all", big) == default_round("held-out-all", small) == -1
    assert default_round("held-out-first", big) == default_round("held-out-first", small) == 0
    assert 1200 < ROUND_FIRST_MIN_DOCS <= 2500, "between the windows where the rounds won and where they lost"


def test_gain_se_is_paired_and_zero_for_identical_rounds():
    rng = np.random.default_rng(0)
    truth = rng.integers(0, 3, 60)
    same = np.stack([truth, truth, truth])
    np.testing.assert_array_equal(gain_se(same, truth, 50, np.random.default_rng(1)), 0.0)
    noisy = np.where(rng.random(60) < 0.3, (truth + 1) % 3, truth)
    history = np.stack([noisy, noisy, truth])
    se = gain_se(history, truth, 200, np.random.default_rng(1))
    assert se[2] == 0.0 and se[0] == se[1] > 0.0
    assert se[0] < 0.2
    first = gain_se(history, truth, 200, np.random.default_rng(1), reference=0)
    assert first[0] == first[1] == 0.0 and first[2] == se[0], "against the first round: the same paired spread"


def test_round_selection_scores_held_out_seeds_it_did_not_train_on(corpus, monkeypatch):
    Xtr, seeds, *_ = corpus
    calls = []
    original = FSL._kmeans_rounds

    def spy(self, Xv, Xn, Xn_sq, codes, n_known, n_new, rng, rounds, watch=None):
        calls.append((codes.copy(), rounds, None if watch is None else watch.copy()))
        return original(self, Xv, Xn, Xn_sq, codes, n_known, n_new, rng, rounds, watch)

    monkeypatch.setattr(FSL, "_kmeans_rounds", spy)
    m = FSL(variant="ck", max_iter=6).fit(Xtr, seeds)
    folds, final = calls[:-1], calls[-1]
    assert len(folds) == 3 and final[2] is None
    held = np.concatenate([w for _, _, w in folds])
    assert np.unique(held).size == held.size and np.isin(held, np.flatnonzero(seeds != None)).all()  # noqa: E711
    for codes, rounds, watch in folds:
        assert rounds == 6 and (codes[watch] == -1).all(), "a held-out seed is not a seed of its fold's fit"
        assert (codes >= 0).sum() == (seeds != None).sum() - watch.size  # noqa: E711
    assert m.round_scores_.shape == m.round_scores_se_.shape == (6,)
    assert ((m.round_scores_ >= 0) & (m.round_scores_ <= 1)).all() and (m.round_scores_se_ >= 0).all()
    assert final[1] == m.rounds_ == chosen_rounds(m.round_scores_, m.round_scores_se_) and m.n_iter_ <= m.rounds_


@pytest.mark.parametrize("rounds", [1, 6])
def test_the_chosen_number_of_rounds_is_the_final_fits(corpus, monkeypatch, rounds):
    """One round is constrained k-means; every round is the paper's loop (round_selection="all")."""
    Xtr, seeds, _, Xte, _, _ = corpus
    monkeypatch.setattr("streamsemi.algorithms.fsl.chosen_rounds", lambda *scores, **kw: rounds)
    m = FSL(variant="ck", max_iter=6).fit(Xtr, seeds)
    assert m.rounds_ == rounds and m.round_scores_ is not None
    if rounds == 1:
        ref = ConstrainedKMeans().fit(Xtr, seeds)
        assert m.trust_samples_ == [] and not m.feature_weights_.any()
        assert (m.classes_[m.labels_] == ref.classes_[ref.labels_]).all()
    else:
        ref = FSL(variant="ck", max_iter=6, round_selection="all").fit(Xtr, seeds)
        assert ref.round_scores_ is None and ref.rounds_ == 6
        np.testing.assert_array_equal(m.labels_, ref.labels_)
        np.testing.assert_array_equal(m.predict_proba(Xte), ref.predict_proba(Xte))


def test_the_fit_summary_names_the_rounds_run_and_an_old_checkpoint_restores_as_the_papers_loop(corpus, monkeypatch):
    """The worker logs ``fit_summary()`` at each refit; a model checkpointed in the older format has no
    ``rounds_`` and must still restore, predict as it did and summarise as the paper's loop."""
    from streamsemi.service.checkpoint import estimator_state, restore_estimator

    Xtr, seeds, _, Xte, _, _ = corpus
    monkeypatch.setattr("streamsemi.algorithms.fsl.chosen_rounds", lambda *scores, **kw: 2)
    m = FSL(variant="ck", max_iter=6).fit(Xtr, seeds)
    summary = m.fit_summary()
    assert summary == {"rounds": 2, "max_rounds": 6, "round_selection": "held-out",
                       "round_scores": [round(float(v), 4) for v in m.round_scores_]}
    assert len(summary["round_scores"]) == 6
    assert FSL(variant="ck", max_iter=4, round_selection="all").fit(Xtr, seeds).fit_summary() == {
        "rounds": 4, "max_rounds": 4, "round_selection": "all", "round_scores": None}
    assert FSL(variant="ck", max_iter=4, feature_learning=False).fit(Xtr, seeds).fit_summary()["max_rounds"] == 1
    assert FSL(variant="ap").fit(Xtr, seeds).fit_summary() == {}
    with pytest.raises(NotFittedError):
        FSL().fit_summary()
    state, arrays = estimator_state(m)
    for name in ("rounds_", "round_scores_", "round_scores_se_"):
        del state["attrs"][name]  # the older format
    state["params"].pop("round_selection")
    old = restore_estimator(state, arrays)
    np.testing.assert_array_equal(old.predict_proba(Xte), m.predict_proba(Xte))
    assert old.fit_summary() == {"rounds": 6, "max_rounds": 6, "round_selection": "all", "round_scores": None}


@pytest.mark.parametrize(("min_docs", "reference"), [(10**9, -1), (0, 0)])
def test_the_window_size_picks_the_round_the_others_must_beat(corpus, monkeypatch, min_docs, reference):
    """Below ROUND_FIRST_MIN_DOCS the later rounds are the default and an earlier one must beat the last;
    from it on constrained k-means (round 1) is, and a later round must beat it: the standard errors are
    of the gain over that round and the choice follows it."""
    Xtr, seeds, *_ = corpus
    monkeypatch.setattr("streamsemi.algorithms.fsl.ROUND_FIRST_MIN_DOCS", min_docs)
    m = FSL(variant="ck", max_iter=6).fit(Xtr, seeds)
    assert m.round_scores_se_[reference] == 0.0 and m.round_scores_se_.max() > 0.0
    assert m.rounds_ == chosen_rounds(m.round_scores_, m.round_scores_se_, default=reference)
    forced = FSL(variant="ck", max_iter=6, round_selection="held-out-first" if reference == 0 else "held-out-all")
    assert forced.fit(Xtr, seeds).rounds_ == m.rounds_


# -- prototypes="by-size": FSCK's one-round fit is constrained k-means with centroids by class size --------

@pytest.mark.parametrize("n_new", [0, 1])
def test_one_round_fsck_by_size_is_constrained_kmeans_by_size(n_new):
    from test_constrained_kmeans import bimodal_corpus

    X, y, ys, seeds = bimodal_corpus()
    params = {"n_new_clusters": n_new, "discovery": "legacy"} if n_new else {}
    m = FSL(variant="ck", feature_learning=False, prototypes="by-size", **params).fit(X, ys)
    ref = ConstrainedKMeans(prototypes="by-size", **params).fit(X, ys)
    one = FSL(variant="ck", feature_learning=False, **params).fit(X, ys)
    assert m.prototype_owner_.tolist() == ref.prototype_owner_.tolist() == [0, 0, 1] + [2] * n_new
    assert (m.classes_[m.labels_] == ref.classes_[ref.labels_]).all()
    assert np.array_equal(m.predict(X), ref.predict(X))
    if not n_new:   # (with a new cluster, that cluster takes part of A's second topic, as in ConstrainedKMeans)
        assert (m.predict(X[1000:1200]) == "A").mean() > 0.95, "A's second topic keeps its class"
        assert (one.predict(X[1000:1200]) == "B").mean() > 0.9
    assert one.prototype_centers_ is None
    assert m.cluster_centers_.shape[0] == 2 + n_new and m.transform(X[:4]).shape == (4, 2 + n_new)
    assert m.fit_summary()["prototypes"] == {"A": 2} and "prototypes" not in one.fit_summary()


def test_by_size_has_no_effect_when_later_rounds_are_kept(corpus, monkeypatch):
    Xtr, seeds, _, Xte, _, _ = corpus
    monkeypatch.setattr("streamsemi.algorithms.fsl.chosen_rounds", lambda *scores, **kw: 6)
    a = FSL(variant="ck", max_iter=6, prototypes="by-size").fit(Xtr, seeds)
    b = FSL(variant="ck", max_iter=6).fit(Xtr, seeds)
    assert a.rounds_ == 6 and a.prototype_centers_ is None
    np.testing.assert_array_equal(a.predict_proba(Xte), b.predict_proba(Xte))


def test_the_daemon_builds_fsl_ck_by_size_and_a_by_size_model_survives_a_checkpoint():
    from test_constrained_kmeans import bimodal_corpus

    from streamsemi.algorithms import build_estimator
    from streamsemi.service.checkpoint import estimator_state, restore_estimator

    assert build_estimator("fsl-ck", None, 0, 0).prototypes == "by-size"
    assert build_estimator("fsl-ck", {"prototypes": "one"}, 0, 0).prototypes == "one"
    assert make_estimator("fsl-ck").prototypes == "one", "the Python API and the evaluation keep the paper's"
    X, y, ys, seeds = bimodal_corpus()
    m = FSL(variant="ck", feature_learning=False, prototypes="by-size").fit(X, ys)
    state, arrays = estimator_state(m)
    back = restore_estimator(state, arrays, "fsl-ck")
    assert back.prototype_owner_.tolist() == [0, 0, 1]
    assert np.array_equal(back.predict(X), m.predict(X)) and np.allclose(back.predict_proba(X), m.predict_proba(X))
    del back.prototype_centers_, back.prototype_owner_   # a model saved before prototypes existed
    assert (back.predict(X[:1000]) == "A").all()
