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


def test_prototype_counts_follow_the_class_sizes_capped_by_the_seeds():
    from streamsemi.algorithms.constrained_kmeans import prototype_counts

    # mean size 1675: 4000 -> round(2.39) = 2, the small classes 1 (never 0)
    assert prototype_counts([4000, 2000, 400, 300], [80, 40, 8, 6], 5).tolist() == [2, 1, 1, 1]
    # balanced classes: one each (plain constrained k-means)
    assert prototype_counts([500, 480, 520], [25, 24, 26], 5).tolist() == [1, 1, 1]
    # a large class with few seeds: at most one prototype per 5 of its seeds
    assert prototype_counts([9000, 500, 500], [9, 30, 30], 5).tolist() == [1, 1, 1]
    assert prototype_counts([9000, 500, 500], [10, 30, 30], 5).tolist() == [2, 1, 1]
    assert prototype_counts([], [], 5).tolist() == []


def bimodal_corpus(seed=0):
    """Class A = two topics (1,000 + 200 documents), class B = one topic (100) sharing words with A's second."""
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)

    def docs(words, n):
        X = np.zeros((n, 40))
        for i in range(n):
            np.add.at(X[i], rng.choice(words, size=8), 1)
            np.add.at(X[i], rng.integers(30, 40, size=2), 1)   # background words
        return X

    X = sp.csr_matrix(np.vstack([docs(np.arange(0, 10), 1000), docs(np.arange(10, 20), 200),
                                 docs(np.arange(14, 24), 100)]))
    y = np.array(["A"] * 1200 + ["B"] * 100, dtype=object)
    seeds = np.r_[rng.choice(1000, 50, replace=False), 1000 + rng.choice(200, 10, replace=False),
                  1200 + rng.choice(100, 5, replace=False)]
    ys = np.full(len(y), None, dtype=object)
    ys[seeds] = y[seeds]
    return X, y, ys, seeds


def test_a_large_class_of_two_topics_gets_a_centroid_for_each():
    X, y, ys, seeds = bimodal_corpus()
    one = make_estimator("constrained-kmeans").fit(X, ys)
    assert (one.predict(X[1000:1200]) == "B").mean() > 0.9, "one centroid: A's second topic goes to B"
    m = make_estimator("constrained-kmeans", prototypes="by-size").fit(X, ys)
    assert m.prototype_owner_.tolist() == [0, 0, 1] and m.prototype_centers_.shape == (3, 40)
    assert m.cluster_centers_.shape == (2, 40), "one centre per class (explain) whatever the prototypes"
    assert (m.predict(X[1000:1200]) == "A").mean() > 0.95 and (m.predict(X[1200:]) == "B").mean() > 0.95
    fitted = m.classes_[m.labels_]
    assert (fitted[seeds] == y[seeds]).all(), "seeds stay in their class (any centroid of it)"
    assert (m.predict(X) == fitted).mean() > 0.99, "predict on training rows agrees with the fit"
    P = m.predict_proba(X[:50])
    assert P.shape == (50, 2) and np.allclose(P.sum(axis=1), 1)
    S = m.transform(X[:5])   # per class, its most similar prototype
    assert S.shape == (5, 2)
    assert m.fit_summary() == {"prototypes": {"A": 2}} and one.fit_summary() == {}
    # a seed stays in its class even when another class's centroid is nearer (a mislabelled A document)
    wrong = ys.copy()
    stray = int(np.setdiff1d(np.arange(1000), seeds)[0])
    wrong[stray] = "B"
    w = make_estimator("constrained-kmeans", prototypes="by-size").fit(X, wrong)
    assert w.prototype_owner_.tolist() == [0, 0, 1] and w.classes_[w.labels_[stray]] == "B"
    assert w.predict(X[stray]) == ["A"], "a new document like it goes to the nearest centroid"
    restarted = make_estimator("constrained-kmeans", prototypes="by-size", n_init=3).fit(X, ys)
    assert restarted.objective_ >= m.objective_ - 1e-9, "restarts keep the best objective"


def test_by_size_on_balanced_classes_is_plain_constrained_kmeans(r8):
    X, y, ys, seeds = r8
    keep = np.flatnonzero(np.isin(y, ["crude", "trade", "money-fx", "interest"]))   # comparable sizes
    rng = np.random.default_rng(3)
    ys4 = np.full(keep.size, None, dtype=object)
    for c in np.unique(y[keep]):   # 24 seeds each: enough for two prototypes, were a class large
        rows = rng.choice(np.flatnonzero(y[keep] == c), size=24, replace=False)
        ys4[rows] = c
    one = make_estimator("constrained-kmeans").fit(X[keep], ys4)
    by = make_estimator("constrained-kmeans", prototypes="by-size").fit(X[keep], ys4)
    assert np.array_equal(one.labels_, by.labels_) and np.allclose(one.cluster_centers_, by.cluster_centers_)
    assert by.prototype_owner_.tolist() == list(range(4))


def test_by_size_helps_the_skewed_r8_sample_and_old_models_still_predict(r8):
    X, y, ys, seeds = r8
    unl = np.setdiff1d(np.arange(len(y)), seeds)
    one = make_estimator("constrained-kmeans").fit(X, ys)
    by = make_estimator("constrained-kmeans", prototypes="by-size").fit(X, ys)
    counts = dict(zip(*np.unique(by.classes_[by.prototype_owner_], return_counts=True), strict=True))
    assert counts["earn"] > 1 and counts["grain"] == 1, counts
    f_one, f_by = macro_f1(y[unl], one.predict(X[unl])), macro_f1(y[unl], by.predict(X[unl]))
    assert f_by > f_one, (f_by, f_one)
    assert not hasattr(one, "prototype_centers_"), "one centroid per class: no second copy of the centroids"
    # a model saved before prototypes existed has no prototype attribute
    del one.prototype_owner_
    assert (one.predict(X[unl]) == one.classes_[one.labels_][unl]).mean() > 0.97
    with pytest.raises(ValueError, match="prototypes"):
        make_estimator("constrained-kmeans", prototypes="many").fit(X, ys)


def test_the_daemon_builds_prototypes_by_size_and_the_evaluation_baseline_keeps_one():
    from streamsemi.algorithms import build_estimator
    from streamsemi.evaluation.baselines import make_method

    assert build_estimator("constrained-kmeans", None, 0, 0).prototypes == "by-size"
    assert build_estimator("constrained-kmeans", {"prototypes": "one"}, 0, 0).prototypes == "one"
    assert build_estimator("seeded-kmeans", None, 0, 0).prototypes == "one"
    assert make_estimator("constrained-kmeans").prototypes == "one"
    assert make_method("constrained-kmeans").prototypes == "one", "the paper algorithms' baseline: Basu et al."
    assert build_estimator("constrained-kmeans", None, 0, 0).seed_weight == "held-out"
    assert make_estimator("constrained-kmeans").seed_weight == 1.0
    assert make_method("constrained-kmeans").seed_weight == 1.0, "Basu et al.: a seed counts as one document"


def test_a_by_size_model_survives_a_checkpoint():
    from streamsemi.service.checkpoint import estimator_state, restore_estimator

    X, y, ys, seeds = bimodal_corpus()
    m = make_estimator("constrained-kmeans", prototypes="by-size", seed_weight="held-out").fit(X, ys)
    state, arrays = estimator_state(m)
    back = restore_estimator(state, arrays, "constrained-kmeans")
    assert back.prototypes == "by-size" and back.prototype_owner_.tolist() == [0, 0, 1]
    assert back.fit_summary() == m.fit_summary() and back.fit_summary()["seed_weight_scores"] is not None
    assert np.array_equal(back.predict(X), m.predict(X)) and np.allclose(back.predict_proba(X), m.predict_proba(X))


def test_each_seed_weighs_seed_weight_documents_in_its_class_centroid(r8):
    from streamsemi.core.features import tfidf

    X, y, ys, seeds = r8
    for w in (1.0, 8.0):
        m = make_estimator("constrained-kmeans", seed_weight=w).fit(X, ys)
        Xn = tfidf(X, m.idf_)
        weight = np.ones(len(y))
        weight[seeds] = w
        for k in range(len(m.classes_)):
            rows = np.flatnonzero(m.labels_ == k)
            c = np.asarray(Xn[rows].T @ weight[rows]).ravel()
            assert np.allclose(m.cluster_centers_[k], c / np.linalg.norm(c)), (w, m.classes_[k])
    plain = make_estimator("constrained-kmeans").fit(X, ys)
    heavy = make_estimator("constrained-kmeans", seed_weight=8.0).fit(X, ys)
    assert not np.array_equal(plain.labels_, heavy.labels_), "weighted seeds move the centroids"
    with pytest.raises(ValueError, match="seed_weight"):
        make_estimator("constrained-kmeans", seed_weight=0.5).fit(X, ys)


def test_held_out_seed_weight_scores_each_candidate_on_seeds_it_did_not_see(r8):
    from sklearn.metrics import f1_score

    from streamsemi.algorithms import constrained_kmeans as ck
    from streamsemi.algorithms._heldout import held_out_folds
    from streamsemi.algorithms.ensemble import row_keys
    from streamsemi.core.features import idf_weights, tfidf

    X, y, ys, seeds = r8
    m = make_estimator("constrained-kmeans", seed_weight="held-out").fit(X, ys)
    # the same folds, each candidate fitted without them: macro-F1 of the hidden seeds
    classes = np.unique(ys[seeds].astype(str))
    codes = np.full(len(y), -1)
    codes[seeds] = np.searchsorted(classes, ys[seeds].astype(str))
    Xn = tfidf(X, idf_weights(X))
    folds = held_out_folds(codes, ck.SEED_WEIGHT_FOLDS, np.random.default_rng(0), row_keys(Xn, np.flatnonzero(codes >= 0)))
    expected = []
    for w in ck.SEED_WEIGHT_CANDIDATES:
        truth, pred = [], []
        for f in range(ck.SEED_WEIGHT_FOLDS):
            hidden = folds == f
            fit = make_estimator("constrained-kmeans", seed_weight=w).fit(X, np.where(hidden, None, ys))
            truth += list(y[hidden])
            pred += list(fit.classes_[fit.labels_[hidden]])
        # macro-F1 over the classes held out (a class with one seed is never hidden)
        expected.append(f1_score(truth, pred, labels=sorted(set(truth)), average="macro", zero_division=0.0))
    assert np.allclose(m.seed_weight_scores_, expected), (m.seed_weight_scores_, expected)
    assert m.seed_weight_ in ck.SEED_WEIGHT_CANDIDATES
    if m.seed_weight_ != 1.0:
        assert expected[1] > expected[0], "a heavier weight is chosen only when it scores higher"
    fixed = make_estimator("constrained-kmeans", seed_weight=m.seed_weight_).fit(X, ys)
    assert np.array_equal(m.labels_, fixed.labels_) and np.allclose(m.cluster_centers_, fixed.cluster_centers_)
    summary = m.fit_summary()
    assert summary["seed_weight"] == m.seed_weight_
    assert summary["seed_weight_scores"] == {f"{w:g}": round(float(v), 4)
                                             for w, v in zip(ck.SEED_WEIGHT_CANDIDATES, expected, strict=True)}


def test_held_out_seed_weight_stays_one_without_evidence(r8, monkeypatch):
    from streamsemi.algorithms import constrained_kmeans as ck

    X, y, ys, seeds = r8
    one_each = np.full(len(y), None, dtype=object)
    for c in np.unique(y):   # one seed per class: nothing can be held out
        one_each[seeds[ys[seeds] == c][0]] = c
    m = make_estimator("constrained-kmeans", seed_weight="held-out").fit(X, one_each)
    assert m.seed_weight_ == 1.0 and m.seed_weight_scores_ is None
    assert m.fit_summary()["seed_weight_scores"] is None
    # the first candidate is kept unless another beats it by the margin: on this sample weight 1
    # scores higher than 8 on held-out seeds, so with 8 first it takes over, unless the margin is impossible
    monkeypatch.setattr(ck, "SEED_WEIGHT_CANDIDATES", (8.0, 1.0))
    m = make_estimator("constrained-kmeans", seed_weight="held-out").fit(X, ys)
    assert m.seed_weight_scores_[1] > m.seed_weight_scores_[0] and m.seed_weight_ == 1.0
    monkeypatch.setattr(ck, "SEED_WEIGHT_GAIN_Z", 1e9)
    assert make_estimator("constrained-kmeans", seed_weight="held-out").fit(X, ys).seed_weight_ == 8.0


def test_the_held_out_choice_holds_while_the_seeds_change_little_for_a_few_fits():
    from streamsemi.algorithms import constrained_kmeans as ck
    from streamsemi.algorithms.constrained_kmeans import choice_still_holds, seed_set_keys

    prev = np.arange(8, dtype=np.uint64)
    assert choice_still_holds(prev, prev, 0)
    four = np.concatenate([prev[2:], [np.uint64(50), np.uint64(51)]])  # 2 removed, 2 added: 4 of 8 changed
    assert choice_still_holds(prev, four, 0)
    five = np.concatenate([prev[3:], [np.uint64(50), np.uint64(51)]])  # 5 of 8: more than half
    assert not choice_still_holds(prev, five, 0)
    assert choice_still_holds(prev, prev, ck.SEED_WEIGHT_MAX_AGE - 1)
    assert not choice_still_holds(prev, prev, ck.SEED_WEIGHT_MAX_AGE), "a choice serves a bounded number of fits"
    assert not choice_still_holds(prev[:0], prev[:0], 0), "no seeds: nothing was chosen"
    # a seed relabelled to another class is another seed
    import scipy.sparse as sp

    X = sp.csr_matrix(np.array([[1.0, 0, 2], [0, 3, 0], [1, 1, 1]]))
    classes = np.array(["x", "y"], dtype=object)
    a = seed_set_keys(X, np.array([0, 1, -1]), classes)
    b = seed_set_keys(X, np.array([1, 1, -1]), classes)
    assert a.size == 2 and np.intersect1d(a, b).size == 1
    # the same seeds in another row order, with other unlabeled rows: the same keys
    order = np.array([2, 1, 0])
    assert np.array_equal(seed_set_keys(sp.vstack([X[order], X[[2]]]).tocsr(), np.array([-1, 1, 0, -1]), classes), a)


def test_a_warm_refit_keeps_the_held_out_seed_weight_without_held_out_fits(r8, monkeypatch):
    from streamsemi.algorithms import constrained_kmeans as ck
    from streamsemi.service.checkpoint import estimator_state, restore_estimator

    X, y, ys, seeds = r8
    first = make_estimator("constrained-kmeans", seed_weight="held-out").fit(X, ys)
    assert first.seed_weight_age_ == 0 and first.seed_weight_scores_ is not None
    calls = []
    choose = ck.ConstrainedKMeans._choose_seed_weight
    monkeypatch.setattr(ck.ConstrainedKMeans, "_choose_seed_weight", lambda self, *a: calls.append(1) or choose(self, *a))
    rng = np.random.default_rng(5)
    unl = np.setdiff1d(np.arange(len(y)), seeds)

    def refit(rows, labels, warm):
        return make_estimator("constrained-kmeans", seed_weight="held-out").fit(X[rows], labels[rows], warm_start_from=warm)

    # the same seeds, 60% of the unlabeled documents gone, the rest in another order; from a checkpoint
    state, arrays = estimator_state(first)
    back = restore_estimator(state, arrays, "constrained-kmeans")
    rows = rng.permutation(np.concatenate([seeds, rng.choice(unl, int(0.4 * unl.size), replace=False)]))
    m = refit(rows, ys, back)
    assert calls == [] and m.seed_weight_age_ == 1 and m.fit_summary()["seed_weight_age"] == 1
    assert m.seed_weight_ == first.seed_weight_ and np.array_equal(m.seed_weight_scores_, first.seed_weight_scores_)
    fixed = make_estimator("constrained-kmeans", seed_weight=first.seed_weight_).fit(X[rows], ys[rows])
    assert np.array_equal(m.labels_, fixed.labels_), "the kept weight is the one the model is fitted with"
    # the choice's own keys travel on, so that changes add up from the choice
    assert np.array_equal(m.seed_weight_seed_keys_, first.seed_weight_seed_keys_)
    # 40% more seeds: kept; 60% more: chosen again
    more = ys.copy()
    extra = rng.choice(unl, int(0.6 * seeds.size), replace=False)
    more[extra[: int(0.4 * seeds.size)]] = y[extra[: int(0.4 * seeds.size)]]
    assert refit(np.arange(len(y)), more, first).seed_weight_age_ == 1 and calls == []
    more[extra] = y[extra]
    m = refit(np.arange(len(y)), more, first)
    assert m.seed_weight_age_ == 0 and calls == [1]
    # the same seeds: SEED_WEIGHT_MAX_AGE fits keep the choice, the next one chooses again
    chain = [first]
    for _ in range(ck.SEED_WEIGHT_MAX_AGE + 1):
        chain.append(refit(np.arange(len(y)), ys, chain[-1]))
    assert [c.seed_weight_age_ for c in chain] == [*range(ck.SEED_WEIGHT_MAX_AGE + 1), 0] and calls == [1, 1]
    # a fixed weight neither keeps nor stores a choice
    fixed = make_estimator("constrained-kmeans", seed_weight=8.0).fit(X, ys, warm_start_from=first)
    assert fixed.seed_weight_ == 8.0 and fixed.seed_weight_seed_keys_ is None and calls == [1, 1]
    with pytest.raises(TypeError, match="warm_start_from must be a fitted ConstrainedKMeans"):
        make_estimator("constrained-kmeans").fit(X, ys, warm_start_from=object())


def test_a_warm_start_view_carries_the_choice_and_not_the_centroids(r8):
    from sklearn.exceptions import NotFittedError

    from streamsemi.service.checkpoint import estimator_state

    X, y, ys, seeds = r8
    with pytest.raises(NotFittedError):
        make_estimator("constrained-kmeans", seed_weight="held-out").warm_start_view()
    m = make_estimator("constrained-kmeans", seed_weight="held-out").fit(X, ys)
    view = m.warm_start_view()
    assert not hasattr(view, "cluster_centers_") and not hasattr(view, "idf_")
    assert view.get_params() == m.get_params()
    assert np.array_equal(view.seed_weight_seed_keys_, m.seed_weight_seed_keys_) and view.seed_weight_age_ == 0
    state, arrays = estimator_state(view)
    assert sum(a.nbytes for a in arrays.values()) < 0.01 * sum(a.nbytes for a in estimator_state(m)[1].values())
    a = make_estimator("constrained-kmeans", seed_weight="held-out").fit(X, ys, warm_start_from=view)
    b = make_estimator("constrained-kmeans", seed_weight="held-out").fit(X, ys, warm_start_from=m)
    assert a.seed_weight_age_ == b.seed_weight_age_ == 1 and np.array_equal(a.labels_, b.labels_)
    # calibrated discovery: the seeded classes' model is what the next fit reads
    auto = make_estimator("constrained-kmeans", seed_weight="held-out", n_new_clusters="auto").fit(X, ys)
    v = auto.warm_start_view()
    assert not hasattr(v.known_model_, "cluster_centers_") and v.known_model_.seed_weight_ == auto.known_model_.seed_weight_
    again = make_estimator("constrained-kmeans", seed_weight="held-out", n_new_clusters="auto").fit(X, ys, warm_start_from=v)
    assert again.known_model_.seed_weight_age_ == 1


def test_exemplar_class_scores_keep_each_class_s_best_seed_past_the_gate():
    import scipy.sparse as sp

    from streamsemi.algorithms.constrained_kmeans import exemplar_class_scores, exemplar_rows
    from streamsemi.core.features import l2_normalize_rows

    rng = np.random.default_rng(3)
    Xn = l2_normalize_rows(sp.csr_matrix(rng.random((9, 12)) * (rng.random((9, 12)) < 0.4)))
    codes = np.array([-1, 1, -1, 0, 1, -1, -1, 0, -1])
    E, owner = exemplar_rows(Xn, codes)
    assert owner.tolist() == [0, 0, 1, 1] and np.allclose(E.toarray(), Xn[[3, 7, 1, 4]].toarray())
    sims = Xn.toarray() @ E.toarray().T
    gate = float(np.median(sims))
    want = np.zeros((9, 3))
    for c in (0, 1):
        s = np.where(sims[:, owner == c] >= gate, sims[:, owner == c], 0.0)
        want[:, c] = s.max(axis=1)
    E_t = sp.csr_matrix(E.T)
    for chunk in (1, 4, 2048):
        assert np.allclose(exemplar_class_scores(Xn, E_t, owner, 3, gate, chunk_rows=chunk), want)
    assert not exemplar_class_scores(Xn, E_t[:, :0], owner[:0], 3, gate).any()


def near_copies_corpus(seed=0):
    """Topics A (words 0-29) and B (30-59), 200 documents each, 20 seeds each; one A seed written with B's
    words (a story B's centroid would take), three near copies of it (true class A, unlabelled) and a
    "cousin" that shares four of its words."""
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)

    def doc(words):
        x = np.zeros(70)
        np.add.at(x, words, 1)
        np.add.at(x, rng.integers(60, 70, size=2), 1)   # background words
        return x

    rows = [doc(rng.choice(30, 8)) for _ in range(200)] + [doc(30 + rng.choice(30, 8)) for _ in range(200)]
    odd_words = 30 + rng.choice(30, 10, replace=False)
    odd = np.zeros(70)
    odd[odd_words] = 2
    copies = [odd + np.eye(70)[60 + i] for i in range(3)]
    cousin = doc(np.r_[odd_words[:4], odd_words[:4], 30 + rng.choice(30, 4)])
    X = sp.csr_matrix(np.vstack(rows + [odd] + copies + [cousin]))
    y = np.array(["A"] * 200 + ["B"] * 200 + ["A"] * 4 + ["B"], dtype=object)
    ys = np.full(len(y), None, dtype=object)
    seeds = np.r_[rng.choice(200, 20, replace=False), 200 + rng.choice(200, 20, replace=False), 400]
    ys[seeds] = y[seeds]
    return X, y, ys


def test_the_near_copies_of_a_labelled_document_follow_its_label():
    from streamsemi.algorithms.constrained_kmeans import EXEMPLAR_GATE

    X, y, ys = near_copies_corpus()
    copies, cousin = [401, 402, 403], 404
    plain = make_estimator("constrained-kmeans", prototypes="by-size").fit(X, ys)
    ex = make_estimator("constrained-kmeans", prototypes="by-size", seed_exemplars=True).fit(X, ys)
    assert plain.exemplars_ is None and ex.exemplars_.shape == (41, 70)
    assert ex.exemplar_min_similarity_ == pytest.approx(EXEMPLAR_GATE * ex.objective_ / X.shape[0])
    assert list(plain.predict(X[copies])) == ["B"] * 3, "the centroids alone put the copies with B"
    assert list(ex.predict(X[copies])) == ["A"] * 3
    # the fitted assignment follows the exemplars as predict does; seeds stay in their class
    assert np.array_equal(ex.classes_[ex.labels_], ex.predict(X))
    seeded = np.flatnonzero(ys != None)  # noqa: E711
    assert np.array_equal(ex.classes_[ex.labels_[seeded]], ys[seeded].astype(str))
    # the cousin is more like the odd seed than like B's centroid, but not past the gate: it stays with B
    from streamsemi.core.features import tfidf

    c = tfidf(X[[cousin]], ex.idf_)
    to_odd = float((c @ tfidf(X[[400]], ex.idf_).T).toarray()[0, 0])
    to_b = float(ex.transform(X[[cousin]])[0, list(ex.classes_).index("B")])
    assert to_b < to_odd < ex.exemplar_min_similarity_, (to_b, to_odd, ex.exemplar_min_similarity_)
    assert ex.predict(X[[cousin]])[0] == "B"
    # a model saved before exemplars existed predicts with its centroids
    del ex.exemplars_
    assert list(ex.predict(X[copies])) == ["B"] * 3
    with pytest.raises(ValueError, match="seed_exemplars"):
        make_estimator("constrained-kmeans", seed_exemplars="yes").fit(X, ys)


def test_exemplars_survive_a_checkpoint_and_stay_out_of_the_warm_start_view():
    from streamsemi.algorithms import build_estimator
    from streamsemi.evaluation.baselines import make_method
    from streamsemi.service.checkpoint import estimator_state, restore_estimator

    assert build_estimator("constrained-kmeans", None, 0, 0).seed_exemplars is True
    assert make_estimator("constrained-kmeans").seed_exemplars is False
    assert make_method("constrained-kmeans").seed_exemplars is False, "the baselines keep Basu et al."
    X, y, ys = near_copies_corpus()
    m = build_estimator("constrained-kmeans", None, 0, 0).fit(X, ys)
    state, arrays = estimator_state(m)
    back = restore_estimator(state, arrays, "constrained-kmeans")
    assert (back.exemplars_ != m.exemplars_).nnz == 0 and back.exemplar_owner_.tolist() == m.exemplar_owner_.tolist()
    assert np.allclose(back.predict_proba(X), m.predict_proba(X)) and list(back.predict(X[[401]])) == ["A"]
    view = m.warm_start_view()
    assert not hasattr(view, "exemplars_") and not hasattr(view, "exemplar_owner_")
