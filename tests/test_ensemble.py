"""The ``ensemble`` algorithm: seed folds, held-out accuracy, softmax weights, weighted probabilities.

The estimator contract (parameters, input checks, scikit-learn's checks) is tested for
every registry name, ``ensemble`` included, in ``test_estimator_contract.py``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp

from streamsemi.algorithms import REGISTRY, make_estimator
from streamsemi.algorithms.base import DegenerateInputError
from streamsemi.algorithms.ensemble import (
    DEFAULT_MEMBERS,
    DEFAULT_PRIOR,
    Ensemble,
    accuracy_weights,
    heldout_scores,
    pool_members,
    row_keys,
    seed_folds,
    shrink_to_prior,
    temper,
    tempering_powers,
)
from streamsemi.algorithms.semi_ldc import SemiLDC

CLASSES = ["alpha", "beta", "gamma"]


def corpus(seed: int = 0, noise: float = 0.6) -> tuple[sp.csr_matrix, list]:
    """90 documents of 3 topics (10 own words each) with shared noise words, 8 seeds per topic."""
    rng = np.random.default_rng(seed)
    topic = np.repeat(np.arange(3), 30)
    counts = rng.poisson(noise, (90, 40))
    for k in range(3):
        rows = np.flatnonzero(topic == k)
        counts[np.ix_(rows, np.arange(10 * k, 10 * k + 10))] += rng.poisson(0.8, (rows.size, 10))
    counts[np.arange(90), 10 * topic + np.arange(90) % 10] += 1
    y = [CLASSES[t] if i % 30 < 8 else None for i, t in enumerate(topic)]
    return sp.csr_matrix(counts.astype(np.float64)), y


def test_seed_folds_deal_every_class_round_robin():
    codes = np.array([0] * 7 + [1] * 2 + [-1] * 5 + [2] * 4)
    folds = seed_folds(codes, 3, np.random.default_rng(0))
    assert (folds[codes < 0] == -1).all()
    assert set(np.bincount(folds[codes >= 0])) <= {4, 5}  # 13 seeds in 3 folds: sizes differ by <= 1
    for c, n in ((0, 7), (1, 2), (2, 4)):
        per_fold = np.bincount(folds[codes == c], minlength=3)
        assert per_fold.sum() == n and per_fold.max() - per_fold.min() <= 1
    assert not np.array_equal(folds, seed_folds(codes, 3, np.random.default_rng(1)))


def test_folds_follow_the_seeds_contents_so_any_row_order_gives_the_same_model():
    X, y = corpus()
    codes = np.array([CLASSES.index(v) if v else -1 for v in y])
    seeds = np.flatnonzero(codes >= 0)
    keys = row_keys(X, seeds)
    assert (keys[codes < 0] == 0).all() and np.unique(keys[seeds]).size == seeds.size
    perm = np.random.default_rng(3).permutation(codes.size)
    # the same rows elsewhere, and their indices stored in another order: the same keys
    Xp = sp.csr_matrix(X[perm])
    Xp.indices, Xp.data = Xp.indices.copy(), Xp.data.copy()
    for r in range(Xp.shape[0]):
        lo, hi = Xp.indptr[r], Xp.indptr[r + 1]
        Xp.indices[lo:hi], Xp.data[lo:hi] = Xp.indices[lo:hi][::-1], Xp.data[lo:hi][::-1]
    Xp.has_sorted_indices = False
    np.testing.assert_array_equal(row_keys(Xp, np.flatnonzero(codes[perm] >= 0)), keys[perm])
    folds = seed_folds(codes, 3, np.random.default_rng(0), keys=keys)
    np.testing.assert_array_equal(seed_folds(codes[perm], 3, np.random.default_rng(0), keys=keys[perm]), folds[perm])
    assert set(np.bincount(folds[seeds])) <= {8, 9}  # round-robin as without keys: 26 seeds, 3 folds
    assert not np.array_equal(folds, seed_folds(codes, 3, np.random.default_rng(1), keys=keys))  # another salt
    members = ["constrained-kmeans", "fsl-ck", "cle"]
    a = Ensemble(members, temperature=0.05, random_state=0).fit(X, y)
    b = Ensemble(members, temperature=0.05, random_state=0).fit(X[perm], [y[i] for i in perm])
    np.testing.assert_array_equal(a.heldout_correct_, b.heldout_correct_)
    np.testing.assert_allclose(a.weights_, b.weights_)
    np.testing.assert_allclose(a.predict_proba(X)[perm], b.predict_proba(X[perm]), atol=1e-9)


def test_accuracy_weights_are_a_softmax_and_skip_failed_members():
    w = accuracy_weights(np.array([0.9, 0.8, np.nan]), 0.05)
    assert w[2] == 0.0 and w.sum() == pytest.approx(1.0)
    assert w[1] / w[0] == pytest.approx(np.exp(-0.1 / 0.05))
    np.testing.assert_allclose(accuracy_weights(np.array([0.2, 0.9]), 1e6), [0.5, 0.5], rtol=1e-5)
    with pytest.raises(DegenerateInputError, match="no ensemble member could be fitted"):
        accuracy_weights(np.array([np.nan, np.nan]), 0.05)


def test_heldout_scores_follow_their_formulas():
    # two members, three classes with 6 / 3 / 1 scored held-out seeds; member 0 puts every seed
    # into the large class, member 1 gets 4 + 2 + 1 right and puts 2 of the large class's seeds in
    # the second, 1 of the second's in the large
    support = np.array([6.0, 3.0, 1.0])
    correct = np.array([[6.0, 0.0, 0.0], [4.0, 2.0, 1.0]])
    predicted = np.array([[10.0, 0.0, 0.0], [5.0, 4.0, 1.0]])
    np.testing.assert_allclose(heldout_scores(correct, predicted, support, "accuracy"), [0.6, 0.7])
    np.testing.assert_allclose(heldout_scores(correct, predicted, support, "balanced_accuracy"),
                               [1 / 3, (4 / 6 + 2 / 3 + 1) / 3])
    f1 = heldout_scores(correct, predicted, support, "macro_f1")
    np.testing.assert_allclose(f1, [(12 / 16) / 3, (8 / 11 + 4 / 7 + 1.0) / 3])
    # a class without scored seeds is not averaged, whatever was predicted into it
    np.testing.assert_allclose(
        heldout_scores(np.array([[2.0, 0.0]]), np.array([[2.0, 3.0]]), np.array([5.0, 0.0]), "macro_f1"), [4 / 7])
    assert heldout_scores(correct, predicted, np.zeros(3), "macro_f1").tolist() == [0.0, 0.0]


def test_d_lda_is_not_a_default_member_but_can_be_named():
    # measured on development draws (docs/algorithms/ensemble.md): its held-out accuracy ranks first on
    # skewed corpora while its macro-F1 ranks last
    assert "d-lda" not in DEFAULT_MEMBERS and "cle" in DEFAULT_MEMBERS
    X, y = corpus()
    assert Ensemble(random_state=0).fit(X, y).members_ == list(DEFAULT_MEMBERS)
    ens = Ensemble(["constrained-kmeans", "d-lda"], random_state=0).fit(X, y)
    assert ens.members_ == ["constrained-kmeans", "d-lda"] and ens.weights_.sum() == pytest.approx(1.0)


def test_semi_ldc_member_keeps_the_300_cap_unless_member_params_say_otherwise():
    # docs/algorithms/ensemble.md: the auto cap is Semi-LDC's own default, not the member's
    assert SemiLDC().max_components == "auto"
    assert Ensemble()._make_member("semi-ldc").get_params()["max_components"] == 300
    assert Ensemble()._make_member("cle").get_params() == make_estimator("cle", n_new_clusters=0,
                                                                           random_state=0).get_params()
    own = Ensemble(member_params={"semi-ldc": {"max_components": "auto", "mu": 1.0}})._make_member("semi-ldc")
    assert own.get_params()["max_components"] == "auto" and own.get_params()["mu"] == 1.0
    X, y = corpus()
    ens = Ensemble(["semi-ldc", "constrained-kmeans"], random_state=0).fit(X, y)
    assert ens.estimators_[0].get_params()["max_components"] == 300


def test_fsl_member_runs_the_papers_loop_unless_member_params_say_otherwise():
    # DEFAULT_MEMBER_PARAMS says why: held-out round selection is FSL's own default, not the member's
    assert make_estimator("fsl-ck").round_selection == "held-out"
    X, y = corpus()
    ens = Ensemble(["fsl-ck", "constrained-kmeans"], random_state=0).fit(X, y)
    assert ens.estimators_[0].round_selection == "all" and ens.estimators_[0].round_scores_ is None
    own = Ensemble(["fsl-ck", "constrained-kmeans"], random_state=0,
                   member_params={"fsl-ck": {"round_selection": "held-out"}}).fit(X, y)
    assert own.estimators_[0].round_scores_ is not None


def test_constrained_kmeans_member_has_centroids_by_class_size_unless_member_params_say_otherwise():
    # DEFAULT_MEMBER_PARAMS says why: the baseline's own default stays Basu et al.'s one centroid
    from test_constrained_kmeans import bimodal_corpus

    assert make_estimator("constrained-kmeans").prototypes == "one"
    assert Ensemble()._make_member("constrained-kmeans").prototypes == "by-size"
    one = {"constrained-kmeans": {"prototypes": "one"}}
    assert Ensemble(member_params=one)._make_member("constrained-kmeans").prototypes == "one"
    X, y, ys, seeds = bimodal_corpus()
    ens = Ensemble(["constrained-kmeans"], random_state=0).fit(X, ys)
    assert ens.estimators_[0].prototype_owner_.tolist() == [0, 0, 1]
    assert (ens.predict(X[1000:1200]) == "A").mean() > 0.95, "class A's second topic stays A"
    plain = Ensemble(["constrained-kmeans"], member_params=one, random_state=0).fit(X, ys)
    assert (plain.predict(X[1000:1200]) == "B").mean() > 0.9


@pytest.mark.parametrize("score", ["accuracy", "balanced_accuracy", "macro_f1"])
def test_heldout_scores_weights_and_probabilities_are_what_the_docstring_says(score):
    X, y = corpus()
    # skewed seeds: alpha 8, beta 4, gamma 1 (gamma's single seed cannot be predicted when held out)
    y = [v if v == "alpha" or (v == "beta" and i % 30 < 4) or (v == "gamma" and i % 30 < 1) else None
         for i, v in enumerate(y)]
    members = ["constrained-kmeans", "fsl-ck"]
    ens = Ensemble(members, n_folds=3, temperature=0.05, heldout_score=score, prior_seeds=0, random_state=4).fit(X, y)
    codes = np.array([CLASSES.index(v) if v else -1 for v in y])
    folds = seed_folds(codes, 3, np.random.default_rng(4), keys=row_keys(X, np.flatnonzero(codes >= 0)))
    labels = np.array(y, dtype=object)
    expected = []
    for m, name in enumerate(members):
        hits = {c: [] for c in CLASSES}
        put = {c: 0 for c in CLASSES}  # held-out seeds predicted as c
        for f in range(3):
            trained = {labels[i] for i in np.flatnonzero((codes >= 0) & (folds != f))}
            held = [i for i in np.flatnonzero(folds == f) if labels[i] in trained]
            y_fold = labels.copy()
            y_fold[folds == f] = None
            est = make_estimator(name, n_new_clusters=0, random_state=4).fit(X, list(y_fold))
            for i, p in zip(held, est.predict(X[held]), strict=True):
                hits[labels[i]].append(p == labels[i])
                put[p] += 1
        assert hits["gamma"] == [] and len(hits["alpha"]) == 8 and len(hits["beta"]) == 4
        assert ens.heldout_predicted_[m].tolist() == [put[c] for c in CLASSES]
        assert ens.heldout_correct_[m].tolist() == [sum(hits[c]) for c in CLASSES]
        scored = [h for h in hits.values() if h]
        if score == "accuracy":
            expected.append(np.mean([x for h in scored for x in h]))
        elif score == "balanced_accuracy":
            expected.append(np.mean([np.mean(h) for h in scored]))
        else:
            expected.append(np.mean([2 * sum(hits[c]) / (len(hits[c]) + put[c]) for c in CLASSES if hits[c]]))
    assert ens.heldout_support_.tolist() == [8, 4, 0]
    np.testing.assert_allclose(ens.heldout_accuracy_, expected)
    np.testing.assert_allclose(ens.weights_, accuracy_weights(np.array(expected), 0.05))
    Xq, _ = corpus(seed=1)
    full = [make_estimator(n, n_new_clusters=0, random_state=4).fit(X, y) for n in members]
    # pooling="tempered": each member's probabilities raised to the power that brings its mean top
    # probability on the fit window to the members' average, then the weighted mean
    tops = [est.predict_proba(X).max(axis=1).mean() for est in full]
    for est, a in zip(full, ens.powers_, strict=True):
        Pa = est.predict_proba(X) ** a
        assert (Pa / Pa.sum(axis=1, keepdims=True)).max(axis=1).mean() == pytest.approx(np.mean(tops), abs=1e-6)
    P = 0
    for w, est, a in zip(ens.weights_, full, ens.powers_, strict=True):
        Pa = est.predict_proba(Xq) ** a
        P = P + w * Pa / Pa.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(ens.predict_proba(Xq), P, rtol=1e-6)
    mean = sum(w * est.predict_proba(Xq) for w, est in zip(ens.weights_, full, strict=True))
    mean_ens = Ensemble(members, n_folds=3, temperature=0.05, heldout_score=score, prior_seeds=0,
                        pooling="mean", random_state=4).fit(X, y)
    assert mean_ens.powers_.tolist() == [1.0, 1.0]
    np.testing.assert_allclose(mean_ens.predict_proba(Xq), mean)
    assert list(ens.classes_) == CLASSES and ens.new_clusters_ == []


def test_single_seed_classes_give_equal_weights_without_a_prior():
    X, y = corpus()
    y = [v if i % 30 == 0 else None for i, v in enumerate(y)]  # one seed per class
    ens = Ensemble(["constrained-kmeans", "fsl-ck"], prior_seeds=0).fit(X, y)
    assert ens.heldout_accuracy_.tolist() == [0.0, 0.0] and ens.weights_.tolist() == [0.5, 0.5]


def test_shrink_to_prior_counts_the_prior_as_seeds():
    score, prior = np.array([0.8, 0.5, np.nan]), np.array([0.0, 0.1, 0.2])
    np.testing.assert_allclose(shrink_to_prior(score, 10, prior, 5), [8 / 15, 5.5 / 15, np.nan])
    np.testing.assert_allclose(shrink_to_prior(score, 0, prior, 5), [0.0, 0.1, np.nan])  # nothing scored: the prior
    np.testing.assert_allclose(shrink_to_prior(score, 10, prior, 0), score)  # no prior: the seeds
    np.testing.assert_allclose(shrink_to_prior(score, 0, prior, 0), score)


def test_the_prior_decides_without_scored_seeds_and_yields_to_many():
    X, y = corpus()
    members = ["constrained-kmeans", "fsl-ck"]
    one = [v if i % 30 == 0 else None for i, v in enumerate(y)]  # one seed per class: nothing can be scored
    ens = Ensemble(members, prior={"fsl-ck": 0.05}, prior_seeds=3, temperature=0.02).fit(X, one)
    assert ens.heldout_scored_ == 0
    np.testing.assert_allclose(ens.scores_, [0.0, 0.05])
    np.testing.assert_allclose(ens.weights_, accuracy_weights(np.array([0.0, 0.05]), 0.02))
    assert ens.weights_[1] > 0.9
    plain = Ensemble(members, prior_seeds=0).fit(X, y)  # 8 seeds per class
    shrunk = Ensemble(members, prior={"constrained-kmeans": -0.2, "fsl-ck": 0.3}, prior_seeds=4).fit(X, y)
    n = shrunk.heldout_scored_
    assert n == 24
    np.testing.assert_allclose(shrunk.heldout_accuracy_, plain.heldout_accuracy_)
    np.testing.assert_allclose(shrunk.scores_, (n * plain.heldout_accuracy_ + 4 * np.array([-0.2, 0.3])) / (n + 4))
    np.testing.assert_allclose(shrunk.weights_, accuracy_weights(shrunk.scores_, 0.02))
    default = Ensemble(members, prior_seeds=4).fit(X, one)  # prior=None: DEFAULT_PRIOR
    np.testing.assert_allclose(default.scores_, [DEFAULT_PRIOR[m] for m in members])


def test_tempering_lets_the_heavier_member_keep_its_first_choice():
    # a spread-out member (CLE's label-propagation scores) with most of the weight against a sharp one
    spread = np.array([[0.30, 0.25, 0.25, 0.20], [0.10, 0.60, 0.20, 0.10], [0.40, 0.20, 0.20, 0.20]])
    sharp = np.array([[0.001, 0.001, 0.99, 0.008], [0.001, 0.001, 0.99, 0.008], [0.97, 0.01, 0.01, 0.01]])
    w = np.array([0.9, 0.1])
    mean = pool_members([spread, sharp], w)
    np.testing.assert_allclose(mean, 0.9 * spread + 0.1 * sharp)
    assert mean.argmax(axis=1).tolist() == [2, 1, 0]  # in row 0 the sharp member overrules the heavy one
    powers = tempering_powers([spread, sharp])
    target = (spread.max(axis=1).mean() + sharp.max(axis=1).mean()) / 2
    assert powers[0] > 1 > powers[1]  # the spread member is sharpened, the sharp one softened
    for P, a in zip([spread, sharp], powers, strict=True):
        assert temper(P, a).max(axis=1).mean() == pytest.approx(target, abs=1e-6)
        # tempering keeps each member's order of classes within a row
        assert (np.argsort(temper(P, a), axis=1) == np.argsort(P, axis=1)).all()
    pooled = pool_members([spread, sharp], w, powers)
    np.testing.assert_allclose(pooled, 0.9 * temper(spread, powers[0]) + 0.1 * temper(sharp, powers[1]))
    assert pooled.argmax(axis=1).tolist() == [0, 1, 0]
    np.testing.assert_allclose(pooled.sum(axis=1), 1.0)
    np.testing.assert_allclose(temper(spread, 1.0), spread)
    # a member alone keeps its probabilities; weight 0 is skipped; no weight at all is refused
    np.testing.assert_allclose(pool_members([spread, sharp], np.array([1.0, 0.0]), powers), temper(spread, powers[0]))
    with pytest.raises(DegenerateInputError, match="no ensemble member has weight"):
        pool_members([spread], np.array([0.0]))


def test_a_model_from_an_earlier_checkpoint_without_powers_pools_by_the_mean():
    from streamsemi.service.checkpoint import estimator_state, restore_estimator

    X, y = corpus()
    ens = Ensemble(["constrained-kmeans", "fsl-ck"], temperature=1.0, random_state=0).fit(X, y)
    assert not np.allclose(ens.powers_, 1.0)
    state, arrays = estimator_state(ens)
    restored = restore_estimator(state, arrays)
    np.testing.assert_allclose(restored.predict_proba(X), ens.predict_proba(X))
    del state["attrs"]["powers_"]  # the older format, without tempering powers
    old = restore_estimator(state, arrays)
    mean = sum(w * e.predict_proba(X) for w, e in zip(ens.weights_, ens.estimators_, strict=True))
    np.testing.assert_allclose(old.predict_proba(X), mean)


def test_the_engine_scores_the_fit_window_from_the_fit_without_predicting_again(monkeypatch):
    from streamsemi.engine import score_rows
    from streamsemi.service.checkpoint import estimator_state, restore_estimator

    X, y = corpus()
    ens = Ensemble(["constrained-kmeans", "fsl-ck", "cle"], temperature=0.05, random_state=0).fit(X, y)
    assert (ens.weights_ > 0).sum() >= 2
    kept = ens.fitted_proba()
    np.testing.assert_array_equal(kept, ens.predict_proba(X))  # the same numbers, not close ones
    calls = []
    monkeypatch.setattr(Ensemble, "predict_proba", lambda self, X: calls.append(X) or kept)
    P, ind = score_rows(ens, X, multilabel=False)
    assert calls == [] and ind is None
    np.testing.assert_array_equal(P, kept)
    monkeypatch.undo()
    # a refit replaces them; a restored model, a plain mean or a lone member keeps none: the engine predicts
    ens.fit(X, [lb if i % 2 else None for i, lb in enumerate(y)])
    assert ens.fitted_proba() is not kept
    np.testing.assert_array_equal(ens.fitted_proba(), ens.predict_proba(X))
    state, arrays = estimator_state(ens)
    assert restore_estimator(state, arrays).fitted_proba() is None
    assert Ensemble(["constrained-kmeans", "fsl-ck"], pooling="mean").fit(X, y).fitted_proba() is None
    assert Ensemble(["constrained-kmeans"]).fit(X, y).fitted_proba() is None


def test_tempering_powers_stop_at_their_bounds():
    uniform = np.full((3, 4), 0.25)  # no power changes a uniform row: its mean top stays 0.25
    sharp = np.array([[0.97, 0.01, 0.01, 0.01]] * 3)
    powers = tempering_powers([uniform, sharp], bounds=(0.01, 100.0))
    assert powers[0] == pytest.approx(100.0)
    assert temper(sharp, powers[1]).max(axis=1).mean() == pytest.approx((0.25 + 0.97) / 2, abs=1e-6)


def test_a_member_that_cannot_fit_gets_no_weight(monkeypatch):
    monkeypatch.setitem(REGISTRY, "broken", ("streamsemi.algorithms.constrained_kmeans",
                                             "ConstrainedKMeans", {"max_iter": 0}))
    X, y = corpus()
    ens = Ensemble(["broken", "constrained-kmeans"]).fit(X, y)
    assert "broken" in ens.member_errors_ and "max_iter" in ens.member_errors_["broken"]
    assert np.isnan(ens.heldout_accuracy_[0]) and ens.weights_.tolist() == [0.0, 1.0]
    alone = make_estimator("constrained-kmeans").fit(X, y)
    np.testing.assert_allclose(ens.predict_proba(X), alone.predict_proba(X))
    assert ens.fit_summary() == {"weights": {"broken": 0.0, "constrained-kmeans": 1.0},
                                 "heldout_scores": {"broken": None,
                                                    "constrained-kmeans": round(float(ens.heldout_accuracy_[1]), 4)},
                                 "heldout_seeds": ens.heldout_scored_, "failed": ["broken"]}


def test_the_fit_summary_gives_each_members_weight_and_held_out_score():
    X, y = corpus()
    ens = Ensemble(["constrained-kmeans", "fsl-ck", "cle"], temperature=0.05, random_state=0).fit(X, y)
    summary = ens.fit_summary()
    assert summary["weights"] == {n: round(float(w), 4) for n, w in zip(ens.members_, ens.weights_, strict=True)}
    assert sum(summary["weights"].values()) == pytest.approx(1.0, abs=1e-3)
    assert summary["heldout_scores"] == {n: round(float(a), 4)
                                         for n, a in zip(ens.members_, ens.heldout_accuracy_, strict=True)}
    assert summary["heldout_seeds"] == 24 and summary["failed"] == []
    json.dumps(summary)  # the refit_done log event carries it


def test_new_clusters_of_a_member_are_dropped_and_rows_renormalised():
    X, y = corpus()
    # legacy discovery always opens the asked-for cluster (calibrated discovery may keep none on this small corpus)
    params = {"constrained-kmeans": {"n_new_clusters": 1, "discovery": "legacy"}}
    ens = Ensemble(["constrained-kmeans"], member_params=params).fit(X, y)
    member = ens.estimators_[0]
    assert list(member.classes_) == [*CLASSES, "new-0"]
    P = ens.predict_proba(X)
    Pm = member.predict_proba(X)[:, :3]
    np.testing.assert_allclose(P, Pm / Pm.sum(axis=1, keepdims=True))


@pytest.mark.parametrize("members,message", [
    ([], "at least one algorithm"),
    (["ensemble"], "single-label registry algorithms"),
    (["pseudo-lsc"], "single-label registry algorithms"),
    (["nosuch"], "single-label registry algorithms"),
])
def test_bad_members_are_refused(members, message):
    X, y = corpus()
    with pytest.raises(ValueError, match=message):
        Ensemble(members).fit(X, y)
    with pytest.raises(ValueError, match="member_params names algorithms that are not members"):
        Ensemble(["cle"], member_params={"fsl-ck": {}}).fit(X, y)
