"""Hashed features and the word sketch that maps them back to words."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from streamsemi.core.features import (
    MAX_WORD_CHARS,
    TextFeaturizer,
    WordSketch,
    feature_index,
    idf_weights,
    l1_normalize_rows,
    l2_normalize_rows,
    tfidf,
)

# docs/reliability.md, "Bounds": worst-case bytes of the word sketch
SKETCH_BYTES_PER_FEATURE = 1536
SKETCH_CACHE_BYTES_PER_WORD = 420


def test_feature_index_matches_the_vectorizer():
    f = TextFeaturizer(n_features=2**12)
    words = ["grain", "wheat", "tonnes", "opec", "barrel", "dividend", "zeitgeist"]
    for w in words:
        X = f.transform([w])
        assert X.indices.tolist() == [feature_index(w, 2**12)], w


def test_sketch_explains_hashed_features_with_words():
    f = TextFeaturizer(n_features=2**14)
    X = f.transform(["wheat wheat grain exports", "crude oil barrel prices opec", "wheat harvest"])
    assert X.shape == (3, 2**14) and X.sum() == 11
    wheat = feature_index("wheat", 2**14)
    assert f.sketch.words(wheat)[0] == "wheat"
    weights = np.zeros(2**14)
    weights[wheat] = 3.0
    weights[feature_index("opec", 2**14)] = 2.0
    weights[feature_index("never-seen-word", 2**14)] = 5.0  # no word recorded: skipped
    assert f.sketch.top_words(weights, 5) == ["wheat", "opec"]


def test_sketch_is_bounded_per_feature_and_keeps_frequent_words():
    # space-saving guarantee: a word seen more than N / k times in a feature is kept
    s = WordSketch(n_features=1, words_per_feature=2)  # every word collides into feature 0
    s.update_tokens(["common"] * 200)
    for i in range(100):
        s.update_tokens([f"rare{i}"])
    words = s.words(0)
    assert len(words) == 2 and words[0] == "common" and words[1] == "rare99"
    restored = WordSketch.from_dict(s.to_dict())
    assert restored.words(0) == words


def test_tfidf_rows_are_unit_length_and_sublinear():
    f = TextFeaturizer(n_features=2**10)
    X = f.transform(["apple apple apple banana", "banana cherry", "the of and"], update_sketch=False)
    T = tfidf(X, idf_weights(X))
    norms = np.sqrt(np.asarray(T.multiply(T).sum(axis=1)).ravel())
    assert np.allclose(norms[:2], 1.0) and norms[2] == 0.0
    row = T[0].toarray().ravel()
    a, b = row[feature_index("apple", 2**10)], row[feature_index("banana", 2**10)]
    idf = idf_weights(X)
    expected = (1 + np.log(3)) * idf[feature_index("apple", 2**10)] / (idf[feature_index("banana", 2**10)])
    assert np.isclose(a / b, expected)


# ---------------------------------------------------------------- bounded in bytes
def _traced(build):
    """(result, bytes still allocated by build()) measured with tracemalloc."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        out = build()
        return out, tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def test_long_unique_tokens_are_hashed_but_not_kept_by_the_sketch():
    # the attack: documents of unique 10,000-character tokens (under every message limit)
    rng = np.random.default_rng(0)
    alphabet = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    texts = [" ".join("".join(rng.choice(alphabet, 10_000)) for _ in range(45)) + " grain wheat" for _ in range(20)]
    f = TextFeaturizer(n_features=2**14)
    X, grown = _traced(lambda: f.transform(texts))
    assert X.sum() == 20 * 47, "long tokens still count as features"
    assert all(len(w) <= MAX_WORD_CHARS for slot in f.sketch._slots.values() for w in slot)
    assert "grain" in f.sketch.words(feature_index("grain", 2**14))
    assert len(f.sketch._index) == 2, "only the short words were looked up"
    assert grown < 2_000_000, f"{grown} bytes kept for 9 MB of unique long tokens"
    short = "x" * MAX_WORD_CHARS
    f.sketch.update_tokens([short, short + "y"])
    assert f.sketch.words(feature_index(short, 2**14)) == [short]
    assert not f.sketch.words(feature_index(short + "y", 2**14))


def test_sketch_worst_case_bytes_per_feature_are_under_the_documented_bound():
    # every slot full with words of MAX_WORD_CHARS astral-plane characters (4 bytes each in a str)
    n = 256
    rng = np.random.default_rng(1)

    words = ["".join(map(chr, rng.integers(0x10000, 0x1F000, MAX_WORD_CHARS))) for _ in range(16 * n)]

    def fill():
        s = WordSketch(n_features=n, words_per_feature=3, index_cache_size=1)
        for w in words:
            s.update_tokens([w])
        for slot in s._slots.values():
            for i, w in enumerate(slot):
                slot[w] = 10**6 + i * n  # counts beyond the small-int cache
        s._index.clear()
        return s

    s, grown = _traced(fill)
    assert len(s) == n and all(len(v) == 3 for v in s._slots.values())
    assert grown / n <= SKETCH_BYTES_PER_FEATURE, f"{grown / n:.0f} bytes per feature"
    cache = WordSketch(n_features=n, index_cache_size=5_000)

    def fill_cache():
        for _ in range(5_000):
            cache._index_of("".join(map(chr, rng.integers(0x10000, 0x1F000, MAX_WORD_CHARS))))
        return cache

    _, grown = _traced(fill_cache)
    assert len(cache._index) == 5_000 and grown / 5_000 <= SKETCH_CACHE_BYTES_PER_WORD, grown / 5_000


def test_restored_sketch_keeps_its_bounds():
    s = WordSketch(n_features=8, words_per_feature=2)
    state = s.to_dict()
    state["slots"] = {"3": {"ok": 2, "y" * (MAX_WORD_CHARS + 1): 5}}
    assert WordSketch.from_dict(state).words(3) == ["ok"]
    for slots in ({"8": {"a": 1}}, {"-1": {"a": 1}}, {"1": {"a": 1, "b": 1, "c": 1}}):
        with pytest.raises(ValueError, match="out of range or holds more"):
            WordSketch.from_dict({**state, "slots": slots})


def test_tfidf_matches_scikit_learn_and_leaves_its_input_alone():
    """The vectorised tf-idf (column scaling and row norms on the stored values) equals
    scikit-learn's sublinear, smoothed, l2-normalised TfidfTransformer, keeps an empty row
    empty and does not modify the counts it was given."""
    import scipy.sparse as sp
    from sklearn.feature_extraction.text import TfidfTransformer

    rng = np.random.default_rng(3)
    dense = rng.poisson(0.4, size=(30, 50)).astype(np.float64)
    dense[4] = 0.0  # an empty document
    X = sp.csr_matrix(dense)
    before = X.copy()
    ours = tfidf(X, idf_weights(X))
    ref = TfidfTransformer(sublinear_tf=True, smooth_idf=True).fit_transform(X)
    assert np.allclose(ours.toarray(), ref.toarray(), rtol=0, atol=1e-12)
    assert ours[4].nnz == 0
    assert np.array_equal(X.toarray(), before.toarray()) and X.nnz == before.nnz
    norms = np.sqrt(np.asarray(ours.multiply(ours).sum(axis=1)).ravel())
    assert np.allclose(norms[np.arange(30) != 4], 1.0)
    # a zero column weight leaves no stored zero behind
    idf = idf_weights(X)
    idf[np.flatnonzero(dense[0])[0]] = 0.0
    assert np.all(tfidf(X, idf).data != 0)
    # l2_normalize_rows copies too
    Y = l2_normalize_rows(X)
    assert np.array_equal(X.toarray(), before.toarray())
    assert np.allclose(Y.toarray(), dense / np.maximum(np.linalg.norm(dense, axis=1, keepdims=True), 1e-300))


def test_l1_normalize_rows_divides_by_row_sums_on_a_copy():
    import scipy.sparse as sp

    dense = np.array([[1.0, 3.0, 0.0], [0.0, 0.0, 0.0], [2.0, 0.0, 2.0]])
    X = sp.csr_matrix(dense)
    Y = l1_normalize_rows(X)
    assert np.allclose(Y.toarray(), [[0.25, 0.75, 0.0], [0.0, 0.0, 0.0], [0.5, 0.0, 0.5]])
    assert np.array_equal(X.toarray(), dense)
    assert l1_normalize_rows(sp.csr_matrix((2, 3))).nnz == 0


def test_row_scalings_sum_duplicate_entries_first():
    """A CSR matrix with two stored values for one (row, column) is scaled as their sum."""
    import scipy.sparse as sp

    dup = sp.csr_matrix((np.array([1.0, 2.0, 4.0]), np.array([0, 0, 1]), np.array([0, 3])), shape=(1, 2))
    canon = sp.csr_matrix(np.array([[3.0, 4.0]]))
    idf = np.array([1.0, 2.0])
    assert np.allclose(tfidf(dup, idf).toarray(), tfidf(canon, idf).toarray())
    assert np.allclose(l2_normalize_rows(dup).toarray(), [[0.6, 0.8]])
    assert np.allclose(l1_normalize_rows(dup).toarray(), [[3 / 7, 4 / 7]])
