"""Tests for the constrained Laplacian eigenmap (streamsemi.algorithms.cle)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg as sla
import scipy.sparse as sp

from streamsemi.algorithms.base import DegenerateInputError
from streamsemi.algorithms.cle import (
    CLE,
    contracted_graph,
    knn_graph,
    loo_calibration,
    solve_map,
    top_k_inverted,
    top_k_similar,
    unit_rows,
)
from streamsemi.core.features import TextFeaturizer, l2_normalize_rows

# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def r8_subset():
    """300 Reuters-R8 stories of 3 classes, ~10% seeds, hashed at 2^18."""
    datasets = pytest.importorskip("streamsemi.core.datasets")
    if not datasets.available().get("reuters-r8"):
        pytest.skip("reuters-r8 corpus not cached")
    d = datasets.load("reuters-r8")
    rng = np.random.default_rng(0)
    picked = []
    for cls, n in (("acq", 120), ("crude", 100), ("trade", 80)):
        idx = [i for i, lab in enumerate(d.labels) if lab == cls]
        picked.extend(rng.choice(idx, n, replace=False).tolist())
    picked = np.array(picked)
    rng.shuffle(picked)
    fz = TextFeaturizer()
    X = fz.transform([d.texts[i] for i in picked])
    y_true = np.array([d.labels[i] for i in picked], dtype=object)
    seeds = np.zeros(len(picked), dtype=bool)
    for cls in ("acq", "crude", "trade"):
        members = np.flatnonzero(y_true == cls)
        seeds[rng.choice(members, 10, replace=False)] = True
    y = np.where(seeds, y_true, None)
    return X, y, y_true, seeds, fz.sketch


def toy_counts(groups: list[tuple[int, list[int]]], n_features: int = 64, seed: int = 0) -> sp.csr_matrix:
    """Documents whose terms come from a group-specific vocabulary (4 random terms each)."""
    rng = np.random.default_rng(seed)
    rows = []
    for n_docs, vocab in groups:
        for _ in range(n_docs):
            row = np.zeros(n_features)
            row[rng.choice(vocab, size=min(4, len(vocab)), replace=False)] = rng.integers(1, 4, size=min(4, len(vocab)))
            rows.append(row)
    return sp.csr_matrix(np.array(rows))


# ----------------------------------------------------------------------------- graph


def test_top_k_similar_matches_brute_force():
    X = l2_normalize_rows(toy_counts([(40, list(range(20))), (30, list(range(15, 40)))]))
    dense = (X @ X.T).toarray()
    np.fill_diagonal(dense, -np.inf)
    idx, sim = top_k_similar(X, X, sp.csr_matrix(X.T), 5, exclude_self_offset=0, block_memory_mb=0.001)
    expected = np.sort(dense, axis=1)[:, ::-1][:, :5]
    np.testing.assert_allclose(sim, np.maximum(expected, 0), atol=1e-12)
    np.testing.assert_allclose(np.take_along_axis(dense, idx, axis=1), expected, atol=1e-12)
    assert not np.any(idx == np.arange(X.shape[0])[:, None])


def _assert_same_neighbours(a_idx, a_sim, b_idx, b_sim, Q, R):
    """Same similarity lists; indices may differ only among exactly tied similarities."""
    np.testing.assert_allclose(a_sim, b_sim, rtol=0, atol=1e-12)
    exact = (Q @ R.T).toarray()
    pos = a_sim > 0
    rows = np.nonzero(pos)[0]
    np.testing.assert_allclose(exact[rows, a_idx[pos]], a_sim[pos], atol=1e-12)
    np.testing.assert_allclose(exact[rows, b_idx[pos]], b_sim[pos], atol=1e-12)


def test_inverted_kernel_matches_sparse_blocks_on_real_text(r8_subset):
    X = unit_rows(r8_subset[0], "tf", None)
    XT = sp.csr_matrix(X.T)
    # the graph case: all documents against themselves, self excluded
    b_idx, b_sim = top_k_similar(X, X, XT, 15, exclude_self_offset=0, block_memory_mb=0.1)
    a_idx, a_sim = top_k_inverted(X, XT, 15, exclude_self_offset=0)
    assert not np.any(a_idx[a_sim > 0] == np.nonzero(a_sim > 0)[0])
    _assert_same_neighbours(a_idx, a_sim, b_idx, b_sim, X, X)
    assert np.all(np.diff(a_sim, axis=1) <= 0)  # sorted by decreasing similarity
    # out-of-sample queries against a window
    W, Q = X[:200], X[200:]
    b_idx, b_sim = top_k_similar(Q, W, sp.csr_matrix(W.T), 15)
    a_idx, a_sim = top_k_inverted(Q, sp.csr_matrix(W.T), 15)
    _assert_same_neighbours(a_idx, a_sim, b_idx, b_sim, Q, W)
    assert a_idx.shape == (100, 15) and a_idx.max() < 200


def test_inverted_kernel_both_scans_and_ties_by_index():
    """A query whose posting lists cover the window scans every document, a query of rare
    terms only the documents it touched: both give the exact top k, and tied similarities
    (duplicate documents) come in index order."""
    from streamsemi.algorithms.cle import DENSE_SCAN_RATIO

    rng = np.random.default_rng(5)
    n, m = 400, 60
    dense = (rng.random((n, m)) < 0.08) * rng.integers(1, 4, (n, m))
    dense[:, 0] = 1  # a term in every document: a query with it reads n postings
    dense[rng.choice(n, 40, replace=False)] = dense[7]  # 41 copies of one document: exact ties
    R = l2_normalize_rows(sp.csr_matrix(dense.astype(float)))
    RT = sp.csr_matrix(R.T)
    common = sp.csr_matrix(([1.0, 1.0], ([0, 0], [0, 5])), shape=(1, m))
    df = np.diff(RT.indptr)
    rare = int(np.flatnonzero((df > 0) & (df < n // DENSE_SCAN_RATIO // 2))[0])
    sparse_q = sp.csr_matrix(([1.0], ([0], [rare])), shape=(1, m))
    Q = sp.vstack([l2_normalize_rows(common), sparse_q, R[7]], format="csr")
    assert (Q @ RT).getnnz(axis=1)[1] < n // DENSE_SCAN_RATIO <= df[0]  # one query per path
    for k in (1, 15, 50):
        a_idx, a_sim = top_k_inverted(Q, RT, k)
        b_idx, b_sim = top_k_similar(Q, R, RT, k)
        _assert_same_neighbours(a_idx, a_sim, b_idx, b_sim, Q, R)
        exact = (Q @ R.T).toarray()
        for i in range(Q.shape[0]):
            pos = a_sim[i] > 0
            # the k best by (similarity desc, index asc), exactly
            want = sorted(np.flatnonzero(exact[i] > 0), key=lambda j, i=i: (-exact[i, j], j))[:k]
            assert a_idx[i][pos].tolist() == want
    copies = np.flatnonzero((dense == dense[7]).all(axis=1))
    idx, sim = top_k_inverted(R[7], RT, 15)
    assert idx[0].tolist() == copies[:15].tolist() and np.allclose(sim[0], 1.0)


def test_inverted_kernel_zero_similarity_and_small_window():
    X = l2_normalize_rows(sp.csr_matrix(np.array([[1.0, 0, 0], [1.0, 1, 0], [0, 0, 2]])))
    idx, sim = top_k_inverted(X, sp.csr_matrix(X.T), 5, exclude_self_offset=0)
    assert idx.shape == (3, 2)  # k capped at N - 1
    np.testing.assert_allclose(sim[0], [1 / np.sqrt(2), 0.0])
    assert idx[0, 0] == 1
    np.testing.assert_array_equal(sim[2], 0.0)  # shares no term: no neighbour at all
    q = sp.csr_matrix(([1.0], ([0], [2])), shape=(1, 3))
    idx, sim = top_k_inverted(q, sp.csr_matrix(X.T), 2)
    assert idx[0, 0] == 2 and sim[0, 0] == pytest.approx(1.0) and sim[0, 1] == 0.0


def test_knn_methods_give_the_same_model(r8_subset):
    X, y, _, _, _ = r8_subset
    a = CLE(knn_method="inverted").fit(X, y)
    b = CLE(knn_method="blocks", block_memory_mb=0.5).fit(X, y)
    # the neighbour similarities are identical (test above); the graphs differ only where
    # a k-th neighbour is tied (duplicate stories), i.e. in a handful of edges
    assert a.graph_.nnz == b.graph_.nnz
    assert len((a.graph_ != b.graph_).nonzero()[0]) <= 8
    np.testing.assert_allclose(np.sort(a.graph_.data), np.sort(b.graph_.data), atol=1e-12)
    assert np.corrcoef(a.embedding_.ravel(), b.embedding_.ravel())[0, 1] > 0.999
    assert np.mean(a.labels_ == b.labels_) >= 0.99
    assert np.mean(a.predict(X[:100]) == b.predict(X[:100])) >= 0.98


def test_knn_graph_is_symmetric_union_with_dot_product_weights():
    X = l2_normalize_rows(toy_counts([(25, list(range(12))), (25, list(range(8, 24)))], seed=3))
    W = knn_graph(X, 4)
    assert abs(W - W.T).max() == 0
    dense = (X @ X.T).toarray()
    rows, cols = W.nonzero()
    np.testing.assert_allclose(W.toarray()[rows, cols], dense[rows, cols])
    assert W.diagonal().sum() == 0
    # every edge is in the kNN list of at least one endpoint
    np.fill_diagonal(dense, -np.inf)
    kth = np.sort(dense, axis=1)[:, -4]
    assert np.all((dense[rows, cols] >= kth[rows] - 1e-12) | (dense[rows, cols] >= kth[cols] - 1e-12))


# ----------------------------------------------------------------------------- the subspace trick


def paper_map(W: np.ndarray, codes: np.ndarray, k: int, seed_link: float) -> np.ndarray:
    """Eq. 8-9 verbatim: dense P_k with +-1 columns, modified W_k, second eigenvector of Eq. 9."""
    Wk = W.copy()
    s_k, s_o = codes == k, (codes >= 0) & (codes != k)
    Wk[np.ix_(s_k, s_k)] = seed_link
    Wk[np.ix_(s_o, s_o)] = seed_link
    Wk[np.ix_(s_k, s_o)] = 0.0
    Wk[np.ix_(s_o, s_k)] = 0.0
    D = np.diag(Wk.sum(axis=1))
    L = D - Wk
    unl = np.flatnonzero(codes < 0)
    P = np.zeros((codes.size, 2 + unl.size))
    P[:, 0] = 1.0
    P[s_k, 1] = 1.0
    P[s_o, 1] = -1.0
    P[unl, 2 + np.arange(unl.size)] = 1.0
    vals, vecs = sla.eigh(P.T @ L @ P, P.T @ D @ P)
    return P @ vecs[:, 1]


@pytest.mark.parametrize("seed_link", [1.0, 100.0])
def test_contraction_equals_paper_subspace_trick(seed_link):
    X = l2_normalize_rows(toy_counts([(20, list(range(10))), (20, list(range(6, 18)))], seed=5))
    W = knn_graph(X, 5)
    codes = np.full(40, -1)
    codes[[0, 3, 7]] = 0
    codes[[22, 30]] = 1
    seed = (codes >= 0).astype(float)
    W_unseeded = sp.csr_matrix(W - sp.diags(seed) @ W @ sp.diags(seed))
    for k in (0, 1):
        Wc, node = contracted_graph(W_unseeded, codes, k, seed_link)
        z, lam = solve_map(Wc)
        ours = z[node]
        ref = paper_map(W.toarray(), codes, k, seed_link)
        ref = ref * np.sign(ref[codes == k][0] - ref[(codes >= 0) & (codes != k)][0])
        # both are D-normalised (y^T D y = 1) and oriented the same way
        np.testing.assert_allclose(ours, ref, atol=1e-8)


def test_each_map_puts_class_seeds_on_one_value_and_other_seeds_on_another(r8_subset):
    X, y, _, seeds, _ = r8_subset
    raw = CLE(map_scaling="none").fit(X, y)
    scaled = CLE().fit(X, y)
    for est in (raw, scaled):
        for k, cls in enumerate(est.classes_):
            mine = est.embedding_[(y == cls) & seeds, k]
            others = est.embedding_[(y != cls) & seeds, k]
            assert np.ptp(mine) == 0.0  # exactly one value, by construction (y = P z)
            assert np.ptp(others) == 0.0
            assert mine[0] > others[0]
    np.testing.assert_allclose(scaled.embedding_[seeds].max(axis=1), 1.0, rtol=0, atol=1e-12)
    for k, cls in enumerate(scaled.classes_):
        assert scaled.embedding_[(y == cls) & seeds, k][0] == pytest.approx(1.0, abs=1e-12)
        assert scaled.embedding_[(y != cls) & seeds, k][0] == 0.0


def test_two_class_toy_embedding_separates_classes():
    X = toy_counts([(30, list(range(10))), (30, list(range(10, 20)))], seed=1)
    # a few bridging documents that share words with both groups
    bridge = np.r_[np.zeros(8), np.ones(4), np.zeros(52)][None, :].repeat(2, axis=0)
    bridge[1, 9] = 0
    bridge[0, 12] = 1
    bridge[1, 11] = 2
    X = sp.vstack([X, sp.csr_matrix(bridge)]).tocsr()
    y = np.full(62, None, dtype=object)
    y[[0, 5]] = "a"
    y[[30, 40]] = "b"
    est = CLE(n_neighbors=5).fit(X, y)
    ya = est.embedding_[:, list(est.classes_).index("a")]
    assert ya[:30].min() > ya[30:60].max()
    assert list(est.classes_[est.labels_[:60]]) == ["a"] * 30 + ["b"] * 30


# ----------------------------------------------------------------------------- quality and prediction


def test_quality_on_real_subset_and_oos_agrees_with_fit(r8_subset):
    from streamsemi.evaluation.metrics import accuracy_hungarian

    X, y, y_true, seeds, _ = r8_subset
    est = CLE().fit(X, y)
    fitted = est.classes_[est.labels_]
    assert accuracy_hungarian(y_true[~seeds], fitted[~seeds]) > 0.85
    pred = est.predict(X)
    assert np.mean(pred == fitted) >= 0.9
    P = est.predict_proba(X)
    assert P.shape == (X.shape[0], 3)
    np.testing.assert_allclose(P.sum(axis=1), 1.0)
    # probabilities carry confidence: they rank right predictions above wrong ones (0.74 measured)
    from sklearn.metrics import roc_auc_score

    assert roc_auc_score(pred == y_true, P.max(axis=1)) > 0.65
    np.testing.assert_array_equal(est.classes_[P.argmax(axis=1)], pred)
    # the out-of-sample embedding of training documents tracks the fitted one
    assert np.corrcoef(est.transform(X).ravel(), est.embedding_.ravel())[0, 1] > 0.9


def test_kmeans_assignment_variant(r8_subset):
    from streamsemi.evaluation.metrics import accuracy_hungarian

    X, y, y_true, seeds, _ = r8_subset
    est = CLE(assign="kmeans").fit(X, y)
    fitted = est.classes_[est.labels_]
    assert np.all(fitted[seeds] == y[seeds])
    assert accuracy_hungarian(y_true, fitted) > 0.8
    assert est.cluster_centers_.shape == (3, 3)
    np.testing.assert_array_equal(est.predict(X[:50]), est.classes_[est.predict_proba(X[:50]).argmax(axis=1)])


def test_held_out_documents(r8_subset):
    X, y, y_true, seeds, _ = r8_subset
    train = np.arange(X.shape[0]) < 220
    est = CLE().fit(X[train], y[train])
    acc = np.mean(est.predict(X[~train]) == y_true[~train])
    assert acc > 0.8


def test_the_stored_state_holds_the_fit_rows_once_and_their_transpose_is_derived(r8_subset):
    from streamsemi.service.checkpoint import estimator_state, restore_estimator

    X, y, _, _, _ = r8_subset
    train = np.arange(X.shape[0]) < 220
    est = CLE().fit(X[train], y[train])
    state, arrays = estimator_state(est)
    assert "X_fit_" in state["attrs"] and "X_fit_T_" not in state["attrs"]
    back = restore_estimator(state, arrays)
    np.testing.assert_array_equal(back.predict_proba(X[~train]), est.predict_proba(X[~train]))
    T = back._fit_transpose()
    assert back._fit_transpose() is T  # built once per model
    assert (T != back.X_fit_.T).nnz == 0 and T.format == "csr"
    # a model stored in the older format kept the transpose as an attribute: it is used, and a refit drops it
    old = restore_estimator(state, arrays)
    old.X_fit_T_ = sp.csr_matrix(old.X_fit_.T)
    assert old._fit_transpose() is old.X_fit_T_
    np.testing.assert_array_equal(old.predict_proba(X[~train]), est.predict_proba(X[~train]))
    old.fit(X[~train], y[~train])
    assert not hasattr(old, "X_fit_T_") and old._fit_transpose().shape == (X.shape[1], int((~train).sum()))


def test_explain_uses_member_tfidf(r8_subset):
    X, y, _, _, sketch = r8_subset
    est = CLE().fit(X, y)
    words = est.explain(sketch, top_n=8)
    assert set(words) == {"acq", "crude", "trade"}
    assert all(len(w) == 8 for w in words.values())
    assert "oil" in words["crude"]
    ids = est.explain(None, top_n=3)
    assert all(w.startswith("f") for ws in ids.values() for w in ws)


def test_deterministic(r8_subset):
    X, y, _, _, _ = r8_subset
    a = CLE(random_state=3).fit(X, y)
    b = CLE(random_state=3).fit(X, y)
    np.testing.assert_array_equal(a.embedding_, b.embedding_)
    np.testing.assert_array_equal(a.labels_, b.labels_)
    np.testing.assert_array_equal(a.predict_proba(X[:20]), b.predict_proba(X[:20]))


# ----------------------------------------------------------------------------- structure edge cases


def test_disconnected_graph_isolated_docs_and_seedless_component():
    groups = [(15, list(range(10))), (15, list(range(10, 20))), (12, list(range(20, 30)))]
    X = toy_counts(groups, seed=2).tolil()
    X[14, 5] = 0  # keep the groups' vocabularies disjoint
    iso = sp.lil_matrix((1, 64))
    iso[0, 50] = 3  # a word nobody else uses: an isolated document
    X = sp.vstack([X.tocsr(), iso.tocsr()]).tocsr()
    y = np.full(43, None, dtype=object)
    y[[0, 1]] = "a"
    y[[15]] = "b"
    est = CLE(n_neighbors=4, map_scaling="none").fit(X, y)
    deg = np.diff(est.graph_.indptr)
    assert deg[42] == 0
    # seeds in different components: each map is the exact two-valued component indicator
    np.testing.assert_array_equal(est.eigenvalues_, [0.0, 0.0])
    for k in range(2):
        assert np.ptp(est.embedding_[:15, k]) == 0 and np.ptp(est.embedding_[15:30, k]) == 0
    # the seedless component and the isolated document carry no label information: neutral 0
    np.testing.assert_array_equal(est.embedding_[30:], 0.0)
    assert list(est.classes_[est.labels_[:30]]) == ["a"] * 15 + ["b"] * 15
    # a new document sharing no word with the window gets the neutral embedding
    new = sp.csr_matrix(([1.0], ([0], [60])), shape=(1, 64))
    np.testing.assert_array_equal(est.transform(new), 0.0)
    P = est.predict_proba(new)
    np.testing.assert_allclose(P.sum(), 1.0)


def test_single_seed_class_and_connected_solution():
    X = toy_counts([(20, list(range(12))), (20, list(range(8, 20))), (20, list(range(16, 28)))], seed=4)
    y = np.full(60, None, dtype=object)
    y[3] = "a"  # a class with a single seed
    y[[20, 25, 30]] = "b"
    y[[41, 45, 50, 55]] = "c"
    est = CLE(n_neighbors=6).fit(X, y)
    assert list(est.classes_) == ["a", "b", "c"]
    assert est.embedding_[3, 0] == pytest.approx(1.0)
    assert np.all(est.eigenvalues_ > 0)
    assert est.labels_[3] == 0
    assert np.mean(est.labels_[:20] == 0) > 0.7


def test_n_new_clusters_with_kmeans():
    X = toy_counts([(20, list(range(10))), (20, list(range(10, 20))), (20, list(range(20, 30)))], seed=6)
    y = np.full(60, None, dtype=object)
    y[[0, 1, 2]] = "a"
    y[[20, 21, 22]] = "b"
    est = CLE(n_neighbors=5, assign="kmeans", n_new_clusters=1, discovery="legacy").fit(X, y)
    assert list(est.classes_) == ["a", "b", "new-0"]
    assert est.new_clusters_ == ["new-0"]
    assert np.mean(est.classes_[est.labels_[40:]] == "new-0") > 0.8


# ----------------------------------------------------------------------------- errors


def test_degenerate_inputs():
    X = toy_counts([(10, list(range(10))), (10, list(range(10, 20)))])
    y = np.array(["a"] * 2 + [None] * 8 + ["b"] * 2 + [None] * 8, dtype=object)
    with pytest.raises(DegenerateInputError, match="no seed labels"):
        CLE().fit(X, [None] * 20)
    with pytest.raises(DegenerateInputError, match="at least 2 classes"):
        CLE().fit(X, ["a"] + [None] * 19)
    Xe = X.tolil()
    Xe[4, :] = 0
    with pytest.raises(DegenerateInputError, match="empty document"):
        CLE().fit(Xe.tocsr(), y)
    with pytest.raises(DegenerateInputError, match="all zero"):
        CLE().fit(sp.csr_matrix((20, 64)), y)
    with pytest.raises(DegenerateInputError, match="larger than the number of documents"):
        CLE(assign="kmeans", n_new_clusters=19).fit(X, y)
    with pytest.raises(DegenerateInputError, match="y has 3 elements"):
        CLE().fit(X, ["a", "b", None])
    with pytest.raises(DegenerateInputError, match="non-negative"):
        CLE().fit(-X, y)
    with pytest.raises(ValueError, match="n_new_clusters > 0 with discovery='legacy' needs assign='kmeans' "
                                         ".*got n_new_clusters=1 with assign='calibrated'"):
        CLE(n_new_clusters=1, discovery="legacy").fit(X, y)
    with pytest.raises(ValueError, match=r"'weighting' parameter of CLE must be a str among .*Got 'bm25' instead"):
        CLE(weighting="bm25").fit(X, y)
    with pytest.raises(ValueError, match=r"'knn_method' parameter of CLE must be a str among .*Got 'annoy' instead"):
        CLE(knn_method="annoy").fit(X, y)
    with pytest.raises(ValueError, match=r"'n_neighbors' parameter of CLE must be an int in the range \[1, inf\)\. Got 0 instead"):
        CLE(n_neighbors=0).fit(X, y)
    est = CLE(n_neighbors=3).fit(X, y)
    with pytest.raises(ValueError, match="features"):
        est.predict(sp.csr_matrix((1, 10)))


def test_unit_rows_weightings():
    X = sp.csr_matrix(np.array([[2.0, 0, 1], [0, 3, 0]]))
    tf = unit_rows(X, "tf", None)
    np.testing.assert_allclose(tf.toarray()[0], np.array([2, 0, 1]) / np.sqrt(5))
    with pytest.raises(ValueError):
        unit_rows(X, "nope", None)


def test_loo_calibration_window_fallback_for_few_seed_classes():
    # class 1 has one seed whose out-of-sample value (0.9) is far above where the
    # window's top documents on its map sit; min_seeds=2 takes the member level from the window
    seed_codes = np.array([0, 0, 0, 1])
    loo = np.array([[0.8, 0.1], [0.9, 0.2], [1.0, 0.0], [0.1, 0.9]])
    Y = np.column_stack([np.linspace(0.0, 1.0, 101), np.linspace(0.0, 0.5, 101)])
    off1, sc1 = loo_calibration(loo, seed_codes, 2)
    np.testing.assert_allclose(off1, [0.1, 0.1])
    np.testing.assert_allclose(sc1, [0.8, 0.8])
    off2, sc2 = loo_calibration(loo, seed_codes, 2, Y, min_seeds=2)
    np.testing.assert_allclose(off2, [0.1, 0.1])
    # class 0 (3 seeds) unchanged; class 1: 1 - 0.5 * 1/4 quantile of its map = 0.4375
    np.testing.assert_allclose(sc2, [0.8, 0.4375 - 0.1])
    with pytest.raises(ValueError):
        CLE(loo_min_seeds=0).fit(sp.csr_matrix(np.eye(4)), ["a", "b", None, None])
