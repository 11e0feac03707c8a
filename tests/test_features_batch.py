"""The worker's hot path: tokenise once, sample the sketch, sparse x dense on used columns only."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.utils import murmurhash3_32

from streamsemi.algorithms.base import sparse_dot_t
from streamsemi.core._hashing import _murmur3_32, hash_ascii_counts, stop_word_table
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


def test_the_compiled_kernel_matches_the_vectorizer_on_edge_cases_and_interleaved_unicode_rows():
    texts = ["A", "ab", "AB_cd 9x x9 _a a_ __", "The THE the", "don't stop-words", "tab\tnew\nline\r\x00nul",
             "Ünïcode café", "", "   ", "x" * 3000 + " yy", "1234 56 7", "mixed ÄSCII ascii", "end_at_end_"]
    rng = np.random.default_rng(3)
    alphabet = np.array(list("abcXYZ019_ -.,'\n"))
    texts += ["".join(rng.choice(alphabet, size=int(rng.integers(0, 80)))) for _ in range(300)]
    for n_features, stop_words in ((2**18, "english"), (2**5, None), (1, "english")):
        f = TextFeaturizer(n_features, stop_words)
        got = f.transform(texts)
        want = sp.csr_matrix(make_vectorizer(n_features, stop_words).transform(texts))
        assert np.array_equal(got.indptr, want.indptr) and np.array_equal(got.indices, want.indices)
        assert np.array_equal(got.data, want.data)
    assert TextFeaturizer(2**10).transform([]).shape == (0, 2**10)


def test_kernel_murmurhash_is_scikit_learns_for_every_tail_length():
    rng = np.random.default_rng(0)
    for n in list(range(0, 12)) + [63, 64, 65]:
        for _ in range(20):
            b = rng.integers(0, 256, size=n, dtype=np.uint8)
            assert _murmur3_32(b, 0, n) == murmurhash3_32(b.tobytes(), seed=0, positive=False)


def test_kernel_drops_stop_words_by_their_bytes_not_only_their_hash():
    table = stop_word_table(["the", "and", "café"])  # a non-ASCII stop word cannot match an ASCII token
    assert len(table[0]) == 2 and list(table[0]) == sorted(table[0])
    buf = np.frombuffer(b"the and then andy", dtype=np.uint8)
    indptr, indices, data = hash_ascii_counts(buf, np.array([0, len(buf)]), 2**18, *table)
    want = sorted(feature_index(w, 2**18) for w in ("then", "andy"))
    assert list(indptr) == [0, 2] and list(indices) == want and list(data) == [1.0, 1.0]
    # a table whose hash equals a token's but whose bytes differ keeps the token
    h, ptr, words = stop_word_table(["zz"])
    fake = (np.array([murmurhash3_32("qq", seed=0, positive=False)], dtype=np.int32), ptr, words)
    _, indices, _ = hash_ascii_counts(np.frombuffer(b"qq", dtype=np.uint8), np.array([0, 2]), 2**18, *fake)
    assert list(indices) == [feature_index("qq", 2**18)]


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


def test_the_sketch_counts_every_document_of_its_warm_up_then_every_kth():
    f = TextFeaturizer(2**14, sketch_every=4, sketch_warmup=5)
    for b in ([f"w{i}" for i in range(0, 3)], [f"w{i}" for i in range(3, 9)], [f"w{i}" for i in range(9, 20)]):
        f.transform(b)
    kept = {w for slot in f.sketch._slots.values() for w in slot}
    assert kept == {"w0", "w1", "w2", "w3", "w4", "w5", "w9", "w13", "w17"}
    with pytest.raises(ValueError):
        TextFeaturizer(sketch_warmup=-1)


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
