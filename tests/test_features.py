"""Hashed features and the word sketch that maps them back to words."""

from __future__ import annotations

import numpy as np

from streamsemi.core.features import TextFeaturizer, WordSketch, feature_index, idf_weights, tfidf


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
