"""The worker's hot path (issue 16): tokenise once, sample the sketch, sparse x dense on used columns only."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from streamsemi.algorithms.base import sparse_dot_t
from streamsemi.core.datasets import load
from streamsemi.core.features import TextFeaturizer, WordSketch, feature_index, make_vectorizer


def test_tokenising_once_gives_the_vectorizers_counts_exactly():
    ds = load("reuters-r8")
    texts = ds.texts[:400] + ["", "the of and", "Ünïcode café naïve " * 3, "x" * 5000]
    for n_features, stop_words in ((2**18, "english"), (2**10, None)):
        got = TextFeaturizer(n_features, stop_words).transform(texts)
        want = sp.csr_matrix(make_vectorizer(n_features, stop_words).transform(texts))
        assert got.dtype == np.float64 and got.shape == want.shape
        assert np.array_equal(got.indptr, want.indptr) and np.array_equal(got.indices, want.indices)
        assert np.array_equal(got.data, want.data)
    with pytest.raises(ValueError):
        TextFeaturizer().transform("a string, not a list")


def test_the_batch_sketch_counts_what_the_per_document_sketch_counted():
    texts = ["wheat wheat grain", "grain corn", "opec oil oil oil", "wheat"]
    f = TextFeaturizer(2**14)
    f.transform(texts)
    per_doc = WordSketch(2**14)
    for t in texts:
        per_doc.update_tokens(f.analyzer(t))
    assert f.sketch.to_dict() == per_doc.to_dict()
    assert f.sketch.words(feature_index("oil", 2**14)) == ["oil"]


def test_sketch_every_counts_every_kth_document_across_batches():
    f = TextFeaturizer(2**14, sketch_every=3)
    batches = [[f"alpha{i}" for i in range(0, 2)], [f"alpha{i}" for i in range(2, 6)], ["alpha6"],
               [f"alpha{i}" for i in range(7, 11)]]
    for b in batches:
        f.transform(b)
    kept = {w for slot in f.sketch._slots.values() for w in slot}
    assert kept == {"alpha0", "alpha3", "alpha6", "alpha9"}
    X = f.transform(["alpha11 beta"], update_sketch=False)
    assert X.nnz == 2 and "alpha11" not in {w for slot in f.sketch._slots.values() for w in slot}
    with pytest.raises(ValueError):
        TextFeaturizer(sketch_every=0)


def test_sparse_dot_t_equals_the_full_product_bit_for_bit():
    rng = np.random.default_rng(0)
    X = sp.random(200, 2**16, density=0.002, format="csr", random_state=1)
    W = rng.standard_normal((7, 2**16))
    assert np.array_equal(sparse_dot_t(X, W), np.asarray(X @ W.T))
    Xu = sp.csr_matrix((X.data[::-1].copy(), X.indices[::-1].copy(), X.indptr), shape=X.shape)
    Xu.has_sorted_indices = False
    assert np.array_equal(sparse_dot_t(Xu, W), np.asarray(Xu @ W.T))
    assert sparse_dot_t(sp.csr_matrix((3, 2**16)), W).shape == (3, 7)
    assert not sparse_dot_t(sp.csr_matrix((3, 2**16)), W).any()
