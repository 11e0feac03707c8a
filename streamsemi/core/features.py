"""Hashed term-count features and the word sketch that explains them.

Documents become non-negative term-count vectors through the hashing trick
(scikit-learn's :class:`~sklearn.feature_extraction.text.HashingVectorizer`), so
there is no vocabulary to grow in a stream that runs for months. Because a hashed
feature has no name, :class:`WordSketch` keeps, for every feature index, the few
words that produced it most often (a bounded space-saving sketch). Algorithms
report their clusters' top features; the sketch turns them back into words.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from itertools import chain
from typing import Any

import numpy as np
import scipy.sparse as sp
from sklearn.feature_extraction import FeatureHasher
from sklearn.feature_extraction.text import HashingVectorizer
from sklearn.utils import murmurhash3_32

from streamsemi.core._hashing import hash_ascii_counts, stop_word_table

DEFAULT_N_FEATURES = 2**18
# Words longer than this are hashed into the features as usual but never kept by the word
# sketch (URLs, base64 blobs, adversarial 10,000-character tokens): the sketch is bounded in
# bytes, not only in words, and a long word would not help an explanation anyway.
MAX_WORD_CHARS = 64


def make_vectorizer(n_features: int = DEFAULT_N_FEATURES, stop_words: str | None = "english") -> HashingVectorizer:
    """Return the hashing vectorizer that produces raw, non-negative term counts.

    Parameters
    ----------
    n_features : int
        Hashing dimension (number of columns).
    stop_words : {"english", None}
        Stop-word list removed before hashing.
    """
    return HashingVectorizer(
        n_features=n_features,
        alternate_sign=False,
        norm=None,
        stop_words=stop_words,
        lowercase=True,
        dtype=np.float64,
    )


def feature_index(token: str, n_features: int) -> int:
    """Column that ``HashingVectorizer(alternate_sign=False)`` gives ``token``.

    Mirrors scikit-learn's ``_hashing_fast``: signed 32-bit murmurhash3 with seed 0,
    absolute value modulo ``n_features`` (with its special case for ``INT32_MIN``).
    """
    h = murmurhash3_32(token, seed=0, positive=False)
    if h == -(2**31):
        return (2**31 - 1 - (n_features - 1)) % n_features
    return abs(h) % n_features


class WordSketch:
    """Bounded map from hashed feature index to the words that produced it.

    Each feature keeps at most ``words_per_feature`` words with approximate counts
    (space-saving: a new word replaces the rarest one and inherits its count + 1).
    The number of tracked features is at most the hashing dimension and words longer
    than ``max_word_chars`` are never kept, so memory is bounded by
    ``n_features * words_per_feature`` words of at most ``max_word_chars`` characters
    (docs/reliability.md gives the bytes), plus the lookup cache of at most
    ``index_cache_size`` such words.

    Parameters
    ----------
    n_features : int
        Hashing dimension, the same as the vectorizer's.
    words_per_feature : int
        Words kept per feature.
    index_cache_size : int
        Maximum number of cached word -> feature lookups (cleared when full).
    max_word_chars : int
        Longer words are ignored by the sketch (they still count in the features).
    """

    def __init__(self, n_features: int = DEFAULT_N_FEATURES, words_per_feature: int = 3,
                 index_cache_size: int = 100_000, max_word_chars: int = MAX_WORD_CHARS) -> None:
        if words_per_feature < 1:
            raise ValueError("words_per_feature must be >= 1")
        if max_word_chars < 1:
            raise ValueError("max_word_chars must be >= 1")
        self.n_features = int(n_features)
        self.words_per_feature = int(words_per_feature)
        self.index_cache_size = int(index_cache_size)
        self.max_word_chars = int(max_word_chars)
        self._slots: dict[int, dict[str, int]] = {}
        self._index: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._slots)

    def _index_of(self, word: str) -> int:
        idx = self._index.get(word)
        if idx is None:
            if len(self._index) >= self.index_cache_size:
                self._index.clear()
            idx = feature_index(word, self.n_features)
            self._index[word] = idx
        return idx

    def update_tokens(self, tokens: Iterable[str]) -> None:
        """Count ``tokens`` (already analysed words) into the sketch; words over ``max_word_chars`` are skipped."""
        limit = self.max_word_chars
        for word, count in Counter(tokens).items():
            if len(word) > limit:
                continue
            slot = self._slots.setdefault(self._index_of(word), {})
            if word in slot:
                slot[word] += count
            elif len(slot) < self.words_per_feature:
                slot[word] = count
            else:
                rare = min(slot, key=slot.__getitem__)
                slot[word] = slot.pop(rare) + count

    def words(self, feature: int, n: int | None = None) -> list[str]:
        """Words seen for ``feature``, most frequent first."""
        slot = self._slots.get(int(feature), {})
        ranked = sorted(slot, key=lambda w: (-slot[w], w))
        return ranked if n is None else ranked[:n]

    def top_words(self, weights: np.ndarray, n: int = 10) -> list[str]:
        """The best word of each of the ``n`` highest-weighted features.

        Features with weight <= 0 or with no recorded word are skipped; words are
        not repeated.
        """
        w = np.asarray(weights, dtype=np.float64).ravel()
        positive = np.flatnonzero(w > 0)
        order = positive[np.argsort(-w[positive], kind="stable")]
        out: list[str] = []
        seen: set[str] = set()
        for f in order:
            for word in self.words(int(f), 1):
                if word not in seen:
                    seen.add(word)
                    out.append(word)
            if len(out) >= n:
                break
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable state (for checkpoints)."""
        return {
            "n_features": self.n_features,
            "words_per_feature": self.words_per_feature,
            "slots": {str(k): v for k, v in self._slots.items()},
        }

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> WordSketch:
        """Rebuild a sketch from :meth:`to_dict` output, validating its shape.

        The bounds hold for a restored sketch too: a slot outside ``[0, n_features)``
        or with more than ``words_per_feature`` words is refused (``ValueError``);
        words over :data:`MAX_WORD_CHARS` (from a sketch written before the bound
        existed) are dropped.
        """
        sketch = cls(int(state["n_features"]), int(state["words_per_feature"]))
        for key, slot in state["slots"].items():
            if not isinstance(slot, dict):
                raise ValueError("word sketch slot must be an object")
            index = int(key)
            if not 0 <= index < sketch.n_features or len(slot) > sketch.words_per_feature:
                raise ValueError(f"word sketch slot {key!r} is out of range or holds more than "
                                 f"{sketch.words_per_feature} words")
            kept = {str(w): int(c) for w, c in slot.items() if len(str(w)) <= sketch.max_word_chars}
            if kept:
                sketch._slots[index] = kept
        return sketch


class TextFeaturizer:
    """Texts -> hashed count matrix, updating a :class:`WordSketch` on the way.

    Parameters
    ----------
    n_features : int
        Hashing dimension.
    stop_words : {"english", None}
        Stop words removed before hashing.
    sketch : WordSketch, optional
        Sketch to update; a new one is created when omitted.
    sketch_every : int
        After the first ``sketch_warmup`` documents, count every ``sketch_every``-th
        document into the sketch (1: all). The sketch
        only has to name the frequent words of the features that explain a cluster, and
        counting the words was the costliest per-document step of the worker.
    """

    def __init__(self, n_features: int = DEFAULT_N_FEATURES, stop_words: str | None = "english",
                 sketch: WordSketch | None = None, sketch_every: int = 1, sketch_warmup: int = 0) -> None:
        if sketch_every < 1:
            raise ValueError("sketch_every must be >= 1")
        if sketch_warmup < 0:
            raise ValueError("sketch_warmup must be >= 0")
        self.sketch_every = int(sketch_every)
        self.sketch_warmup = int(sketch_warmup)
        self._sketch_phase = 0  # documents seen modulo sketch_every (after the warm-up)
        self._sketched_all = 0  # documents of the warm-up counted so far
        self.vectorizer = make_vectorizer(n_features, stop_words)
        self.analyzer = self.vectorizer.build_analyzer()
        # the vectorizer's own hasher: hashing the analysed tokens gives exactly HashingVectorizer.transform's
        # counts (binary=False, norm=None), so every text is tokenised once for the counts and the sketch
        self.hasher = FeatureHasher(n_features=self.vectorizer.n_features, input_type="string",
                                    dtype=self.vectorizer.dtype, alternate_sign=self.vectorizer.alternate_sign)
        self.sketch = sketch if sketch is not None else WordSketch(n_features)
        self._stop_table = stop_word_table(self.vectorizer.get_stop_words() or ())

    @property
    def n_features(self) -> int:
        return int(self.vectorizer.n_features)

    def transform(self, texts: Sequence[str], update_sketch: bool = True) -> sp.csr_matrix:
        """Hashed term counts (``len(texts)`` x ``n_features``, CSR, float64).

        Identical to ``make_vectorizer(...).transform(texts)``. ASCII texts are tokenised
        and hashed by the compiled kernel of :mod:`streamsemi.core._hashing` (one pass
        over their bytes); other texts are analysed in Python and their tokens hashed by
        the vectorizer's own hasher. With ``update_sketch``, the words of every
        ``sketch_every``-th document are counted into the word sketch as one batch
        (:meth:`WordSketch.update_tokens`).
        """
        if isinstance(texts, str):
            raise ValueError("Iterable over raw text documents expected, string object received.")
        texts = list(texts)
        n = len(texts)
        if n == 0:
            return sp.csr_matrix((0, self.n_features), dtype=np.float64)
        tokens: dict[int, list[str]] = {}
        if update_sketch:
            every = self.sketch_every
            head = min(n, self.sketch_warmup - self._sketched_all)  # every document while the sketch warms up
            self._sketched_all += head
            sampled = chain(range(head), range(head + (-self._sketch_phase) % every, n, every))
            self._sketch_phase = (self._sketch_phase + n - head) % every
            for i in sampled:
                tokens[i] = self.analyzer(texts[i])
            if tokens:
                self.sketch.update_tokens(chain.from_iterable(tokens.values()))
        ascii_ = [type(t) is str and t.isascii() for t in texts]
        fast = [i for i in range(n) if ascii_[i]]
        slow = [i for i in range(n) if not ascii_[i]] if len(fast) < n else []
        parts, order = [], []
        if fast:
            chunk = [texts[i] for i in fast]
            buf = np.frombuffer("".join(chunk).lower().encode("ascii"), dtype=np.uint8)
            bounds = np.zeros(len(chunk) + 1, dtype=np.int64)
            np.cumsum([len(t) for t in chunk], out=bounds[1:])
            indptr, indices, data = hash_ascii_counts(buf, bounds, self.n_features, *self._stop_table)
            parts.append(sp.csr_matrix((data, indices, indptr), shape=(len(chunk), self.n_features)))
            order.extend(fast)
        if slow:
            analysed = [tokens[i] if i in tokens else self.analyzer(texts[i]) for i in slow]
            parts.append(sp.csr_matrix(self.hasher.transform(analysed), dtype=np.float64))
            order.extend(slow)
        X = parts[0] if len(parts) == 1 else sp.csr_matrix(sp.vstack(parts, format="csr")[np.argsort(order)])
        return X


def idf_weights(X: sp.spmatrix) -> np.ndarray:
    """Smoothed inverse document frequency of every column of a count matrix.

    ``idf_j = ln((1 + N) / (1 + df_j)) + 1`` (scikit-learn's ``smooth_idf``).
    """
    X = sp.csr_matrix(X)
    df = np.bincount(X.indices, minlength=X.shape[1]).astype(np.float64)
    return np.log((1.0 + X.shape[0]) / (1.0 + df)) + 1.0


def tfidf(X: sp.spmatrix, idf: np.ndarray, sublinear_tf: bool = True, norm: bool = True) -> sp.csr_matrix:
    """Sublinear tf-idf with l2-normalised rows (empty rows stay zero).

    Parameters
    ----------
    X : sparse matrix
        Non-negative term counts.
    idf : ndarray of shape (n_features,)
        Column weights, typically from :func:`idf_weights` on the fitting window.
    sublinear_tf : bool
        Replace a count ``c`` by ``1 + ln c``.
    norm : bool
        l2-normalise rows.
    """
    X = sp.csr_matrix(X, dtype=np.float64, copy=True)
    X.sum_duplicates()  # the stored values are worked on directly: one per (row, column)
    X.eliminate_zeros()
    if sublinear_tf:
        np.log(X.data, out=X.data)
        X.data += 1.0
    # column scaling on the stored values (the batch's hot path: no diagonal matrix product)
    X.data *= np.asarray(idf, dtype=np.float64)[X.indices]
    X.eliminate_zeros()  # a zero idf weight leaves no explicit zero behind (as the product did)
    return _l2_normalize_csr_inplace(X) if norm else X


def l2_normalize_rows(X: sp.spmatrix) -> sp.csr_matrix:
    """Scale every non-empty row of a sparse matrix to unit Euclidean length."""
    return _l2_normalize_csr_inplace(sp.csr_matrix(X, dtype=np.float64, copy=True))


def l1_normalize_rows(X: sp.spmatrix) -> sp.csr_matrix:
    """Divide every non-empty row of a sparse matrix by its sum (a copy; empty rows stay zero)."""
    X = sp.csr_matrix(X, dtype=np.float64, copy=True)
    X.sum_duplicates()
    if X.nnz:
        rows = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))
        sums = np.bincount(rows, weights=X.data, minlength=X.shape[0])
        sums[sums == 0] = 1.0
        X.data /= sums[rows]
    return X


def _l2_normalize_csr_inplace(X: sp.csr_matrix) -> sp.csr_matrix:
    """:func:`l2_normalize_rows` on ``X``'s own stored values (``X`` must be a CSR matrix
    of float64 that the caller owns): per-row sums of squares by one ``bincount``."""
    n = X.shape[0]
    X.sum_duplicates()
    if X.nnz == 0:
        return X
    rows = np.repeat(np.arange(n), np.diff(X.indptr))
    norms = np.sqrt(np.bincount(rows, weights=X.data * X.data, minlength=n))
    norms[norms == 0] = 1.0
    X.data /= norms[rows]
    return X
