"""ConstrainedKMeans against a plain, loop-by-loop reference of the algorithm on small random data.

Written against the survivors of the mutation run on
``streamsemi/algorithms/constrained_kmeans.py`` (benchmarks/results/mutation.md): the
R8 tests check quality, not the exact centroids, iterations, farthest-first
initialisation or the emptied-cluster rule. The reference below follows the module
docstring and ALGORITHMS.md step by step (dense, Python loops; tiny inputs only).
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from streamsemi.algorithms.constrained_kmeans import (
    ConstrainedKMeans,
    bootstrap_seed_means,
    farthest_point_centroids,
    seed_means,
)


def _unit(v: np.ndarray) -> np.ndarray:
    n = np.sqrt((v * v).sum())
    return v / n if n > 0 else v


def _ref_tfidf(counts: np.ndarray, idf: np.ndarray) -> np.ndarray:
    out = np.zeros(counts.shape)
    for i, row in enumerate(counts):
        w = np.array([(1 + np.log(c)) * idf[j] if c > 0 else 0.0 for j, c in enumerate(row)])
        out[i] = _unit(w)
    return out


def _ref_idf(counts: np.ndarray) -> np.ndarray:
    n = counts.shape[0]
    return np.array([np.log((1 + n) / (1 + (counts[:, j] > 0).sum())) + 1 for j in range(counts.shape[1])])


def _reference(counts: np.ndarray, y: list, constrained: bool, n_new: int, max_iter: int, random_state: int):
    classes = sorted({c for c in y if c is not None})
    codes = np.array([classes.index(c) if c is not None else -1 for c in y])
    Xn = _ref_tfidf(counts, _ref_idf(counts))
    C = [_unit(Xn[codes == k].sum(axis=0)) for k in range(len(classes))]
    if n_new:
        unl = np.flatnonzero(codes < 0)
        jitter = 1e-12 * np.random.default_rng(random_state).random(unl.size)
        best = np.array([max(Xn[i] @ c for c in C) for i in unl]) + jitter
        for _ in range(n_new):
            j = int(np.argmin(best))
            C.append(Xn[unl[j]].copy())
            best = np.array([max(b, Xn[i] @ C[-1]) for b, i in zip(best, unl, strict=True)])
            best[j] = np.inf
    C = np.array(C)
    labels = np.full(len(y), -1)
    n_iter = 0
    for it in range(1, max_iter + 1):
        n_iter = it
        new = np.array([int(np.argmax([Xn[i] @ c for c in C])) for i in range(len(y))])
        if constrained:
            new[codes >= 0] = codes[codes >= 0]
        if (new == labels).all():
            break
        labels = new
        C = np.array([_unit(Xn[labels == k].sum(axis=0)) if (labels == k).any() else C[k] for k in range(len(C))])
    return C, labels, n_iter, classes + [f"new-{i}" for i in range(n_new)]


def _data(seed: int, n: int = 40, m: int = 15):
    rng = np.random.default_rng(seed)
    counts = rng.poisson(0.6, size=(n, m)) * (rng.random((n, m)) < 0.5)
    counts[np.arange(n), rng.integers(0, m, n)] += 1  # no empty document
    y: list = [None] * n
    for i, c in zip(rng.choice(n, size=9, replace=False), "aaabbbccc", strict=True):
        y[i] = c
    return counts, y


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(("constrained", "n_new", "max_iter"), [
    (True, 0, 50), (False, 0, 50), (True, 2, 50), (False, 1, 50), (True, 0, 1), (False, 2, 2), (True, 3, 3),
])
def test_fit_matches_the_reference(seed, constrained, n_new, max_iter) -> None:
    counts, y = _data(seed)
    C, labels, n_iter, classes = _reference(counts, y, constrained, n_new, max_iter, random_state=seed)
    m = ConstrainedKMeans(constrained, n_new_clusters=n_new, max_iter=max_iter, random_state=seed,
                          discovery="legacy")
    m.fit(sp.csr_matrix(counts), y)
    assert list(m.classes_) == classes and m.new_clusters_ == classes[3:]
    assert np.allclose(m.idf_, _ref_idf(counts))
    assert m.n_iter_ == n_iter and np.array_equal(m.labels_, labels)
    assert np.allclose(m.cluster_centers_, C, atol=1e-12)
    S = m.transform(sp.csr_matrix(counts[:7]))
    assert np.allclose(S, _ref_tfidf(counts[:7], m.idf_) @ C.T)
    P = m.predict_proba(sp.csr_matrix(counts[:7]))
    E = np.exp((S - S.max(axis=1, keepdims=True)) / m.temperature)
    assert np.allclose(P, E / E.sum(axis=1, keepdims=True))
    assert np.array_equal(m.predict(sp.csr_matrix(counts[:7])), np.array(classes, dtype=object)[S.argmax(axis=1)])
    assert m._explain_weights() is m.cluster_centers_


def test_constrained_fit_converges_with_seeds_in_their_class_and_stops_when_stable() -> None:
    counts, y = _data(11)
    m = ConstrainedKMeans(max_iter=100).fit(sp.csr_matrix(counts), y)
    seeds = [i for i, c in enumerate(y) if c is not None]
    assert [m.classes_[m.labels_[i]] for i in seeds] == [y[i] for i in seeds]
    assert 1 < m.n_iter_ < 100
    again = ConstrainedKMeans(max_iter=m.n_iter_).fit(sp.csr_matrix(counts), y)
    assert np.array_equal(again.labels_, m.labels_) and again.n_iter_ == m.n_iter_


def test_an_emptied_cluster_keeps_its_previous_centroid() -> None:
    # seeded k-means: the "b" seed is the same text as the "a" seed, so every document ties between the two
    # centroids and goes to "a" (the first); cluster "b" empties and its centroid must stay the seed mean
    # (not become a zero or NaN row)
    counts = np.array([[4, 1, 0], [4, 1, 0], [3, 1, 0], [1, 1, 1], [0, 0, 3]])
    y = ["a", "b", None, "c", None]
    one = ConstrainedKMeans(False, max_iter=1).fit(sp.csr_matrix(counts), y)
    assert list(one.labels_) == [0, 0, 0, 2, 2], "after one round, cluster b is empty"
    Xn = _ref_tfidf(counts, _ref_idf(counts))
    assert np.allclose(one.cluster_centers_[1], Xn[1]) and np.isfinite(one.cluster_centers_).all()
    assert np.allclose(one.cluster_centers_[0], _unit(Xn[:3].sum(axis=0)))
    m = ConstrainedKMeans(False, max_iter=5).fit(sp.csr_matrix(counts), y)
    C, labels, n_iter, _ = _reference(counts, y, False, 0, 5, 0)
    assert np.array_equal(m.labels_, labels) and np.allclose(m.cluster_centers_, C) and m.n_iter_ == n_iter
    assert labels[1] == 1, "the kept centroid wins its seed back in the next round"


def test_seed_means_are_unit_means_of_each_class() -> None:
    Xn = sp.csr_matrix(np.array([[1.0, 0, 0], [0, 1.0, 0], [0.6, 0.8, 0], [0, 0, 1.0]]))
    C = seed_means(Xn, np.array([0, 0, -1, 2]), 4)
    s = np.sqrt(0.5)
    assert np.allclose(C, [[s, s, 0], [0, 0, 0], [0, 0, 1], [0, 0, 0]]), "no seeds: a zero row, not NaN"


def test_farthest_point_centroids_pick_the_least_similar_candidates_in_turn() -> None:
    Xn = sp.csr_matrix(np.array([[1.0, 0, 0], [0.8, 0.6, 0], [0, 1.0, 0], [0, 0.6, 0.8], [0, 0, 1.0]]))
    C = np.array([[1.0, 0, 0]])
    rng = np.random.default_rng(0)
    out = farthest_point_centroids(Xn, C, np.array([1, 2, 3, 4]), 2, rng)
    # similarity to e0: 0.8, 0, 0, 0 -> row 2 (ties broken by rng among 2, 3, 4 -- all three at 0)
    first = out[1]
    assert out.shape == (3, 3) and np.array_equal(out[0], C[0])
    assert any(np.allclose(first, Xn[i].toarray().ravel()) for i in (2, 3, 4))
    # the second is the candidate least similar to both e0 and the first
    rows = Xn.toarray()
    best = {i: max(rows[i] @ C[0], rows[i] @ first) for i in (1, 2, 3, 4) if not np.allclose(rows[i], first)}
    assert np.allclose(out[2], rows[min(best, key=best.get)])
    assert farthest_point_centroids(Xn, C, np.array([1, 2]), 0, rng) is C
    start = farthest_point_centroids(Xn, np.zeros((0, 3)), np.array([0, 4]), 2, np.random.default_rng(1))
    assert start.shape == (2, 3) and {tuple(r) for r in start} == {(1.0, 0, 0), (0, 0, 1.0)}


def test_ties_in_the_farthest_first_traversal_are_broken_by_random_state() -> None:
    # every candidate is orthogonal to the seeded centroid: the choice is the rng's
    Xn = sp.csr_matrix(np.eye(6)[1:])
    C = np.eye(6)[:1]
    picks = set()
    for seed in range(8):
        out = farthest_point_centroids(Xn, C, np.arange(5), 1, np.random.default_rng(seed))
        first = int(np.argmin(np.random.default_rng(seed).random(5)))
        assert np.array_equal(out[1], np.eye(6)[1 + first]), seed
        picks.add(first)
    assert len(picks) > 1, "the case must let the seed decide"
    fits = {tuple(ConstrainedKMeans(n_new_clusters=1, random_state=s, discovery="legacy").fit(
        sp.csr_matrix(np.eye(6, dtype=int)), ["a", "b", None, None, None, None]).cluster_centers_[2].round(6))
        for s in range(8)}
    assert len(fits) > 1, "random_state reaches the traversal"


def test_new_clusters_start_at_unlabeled_documents_only() -> None:
    # the two "a" seeds are orthogonal, so each is only 0.71 similar to its class mean, while every unlabeled
    # document is close to a seeded centroid: seeds must still never become a new cluster's start
    counts = np.array([[3, 0, 0, 0], [0, 3, 0, 0], [0, 0, 3, 0], [2, 2, 0, 0], [0, 0, 3, 1], [2, 2, 0, 1]])
    y = ["a", "a", "b", None, None, None]
    m = ConstrainedKMeans(n_new_clusters=1, max_iter=1, discovery="legacy").fit(sp.csr_matrix(counts), y)
    C, labels, _, _ = _reference(counts, y, True, 1, 1, 0)
    assert np.allclose(m.cluster_centers_, C) and np.array_equal(m.labels_, labels)
    Xn = _ref_tfidf(counts, _ref_idf(counts))
    assert not np.allclose(m.cluster_centers_[2], Xn[0]) and not np.allclose(m.cluster_centers_[2], Xn[1])


def test_the_last_cluster_emptied_keeps_its_centroid() -> None:
    counts = np.array([[4, 1, 0], [4, 1, 0], [3, 1, 0], [0, 1, 3]])
    y = ["a", "b", None, None]  # b's seed ties with a's: after one round cluster b (the last) is empty
    m = ConstrainedKMeans(False, max_iter=1).fit(sp.csr_matrix(counts), y)
    assert list(m.labels_) == [0, 0, 0, 0] and m.cluster_centers_.shape == (2, 3)
    assert np.allclose(m.cluster_centers_[1], _ref_tfidf(counts, _ref_idf(counts))[1])


def test_documented_defaults() -> None:
    assert ConstrainedKMeans().get_params() == {"constrained": True, "n_new_clusters": 0, "max_iter": 50,
                                                "temperature": 0.05, "random_state": 0,
                                                "discovery": "calibrated", "discovery_quantile": 0.4,
                                                "discovery_init": None, "discovery_split": False, "n_init": 1,
                                                "prototypes": "one", "seed_weight": 1.0, "seed_exemplars": False}
    assert ConstrainedKMeans(random_state=7).random_state == 7


def test_predict_needs_a_fit_and_never_refits_the_width() -> None:
    from sklearn.exceptions import NotFittedError

    counts, y = _data(2)
    with pytest.raises(NotFittedError):
        ConstrainedKMeans().predict(sp.csr_matrix(counts))
    m = ConstrainedKMeans().fit(sp.csr_matrix(counts), y)
    with pytest.raises(ValueError):
        m.predict(sp.csr_matrix(counts[:, :-1]))
    assert m.n_features_in_ == counts.shape[1]


def test_bootstrap_seed_means_average_a_resample_of_each_class_s_own_seeds() -> None:
    Xn = sp.csr_matrix(np.array([[1.0, 0, 0], [0, 1.0, 0], [0.6, 0.8, 0], [0, 0, 1.0]]))
    codes = np.array([0, 0, -1, 1])
    s = np.sqrt(0.5)
    seen = set()
    for seed in range(40):
        C = bootstrap_seed_means(Xn, codes, 3, np.random.default_rng(seed))
        assert np.allclose(C[1], [0, 0, 1]), "a one-seed class draws its only seed"
        assert np.allclose(C[2], 0), "no seeds: a zero row"
        row = tuple(np.round(C[0], 6))
        # two draws from {e1, e2}: e1 twice, e2 twice or one of each; the unlabeled row never enters
        assert row in {(1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (round(s, 6), round(s, 6), 0.0)}, row
        seen.add(row)
    assert len(seen) == 3
    again = bootstrap_seed_means(Xn, codes, 3, np.random.default_rng(5))
    assert np.array_equal(again, bootstrap_seed_means(Xn, codes, 3, np.random.default_rng(5)))


@pytest.mark.parametrize("seed", range(4))
def test_n_init_keeps_the_run_with_the_highest_objective(seed) -> None:
    counts, y = _data(seed, n=60)
    one = ConstrainedKMeans(n_init=1).fit(sp.csr_matrix(counts), y)
    C, labels, _, _ = _reference(counts, y, True, 0, 50, 0)
    Xn = _ref_tfidf(counts, _ref_idf(counts))
    assert np.isclose(one.objective_, sum(Xn[i] @ C[labels[i]] for i in range(len(y))))
    many = ConstrainedKMeans(n_init=6, random_state=seed).fit(sp.csr_matrix(counts), y)
    assert many.objective_ > one.objective_ + 1e-6, "on these data a bootstrap restart beats the seed-mean run"
    fitted = many.cluster_centers_[many.labels_]
    assert np.isclose(many.objective_, float(np.sum(Xn * fitted))), "objective_ belongs to the kept run"
    seeds = np.flatnonzero([c is not None for c in y])
    assert list(many.classes_[many.labels_[seeds]]) == [y[i] for i in seeds]
    same = ConstrainedKMeans(n_init=6, random_state=seed).fit(sp.csr_matrix(counts), y)
    assert np.array_equal(same.labels_, many.labels_)
