"""Compiled tokenise-and-hash kernel for ASCII texts (docs/throughput.md).

:class:`~streamsemi.core.features.TextFeaturizer` turns texts into the counts of
scikit-learn's ``HashingVectorizer(lowercase=True, token_pattern=r"(?u)\\b\\w\\w+\\b",
stop_words=..., alternate_sign=False, norm=None)``. In Python that is a regular
expression, a lower-cased copy, a list of token strings, a stop-word filter and
scikit-learn's hashing loop for every document: most of the worker's time per
document. For a text that is pure ASCII the same counts come from one pass over its
bytes here:

* the texts are lower-cased (``str.lower``, as the vectorizer's preprocessor) and
  encoded by the caller; a token is a maximal run of ``[a-z0-9_]`` of at least two
  characters (what ``\\b\\w\\w+\\b`` matches in an ASCII string: ``\\w`` is
  ``[A-Za-z0-9_]`` there and a run of one character is skipped);
* a stop word is dropped (the hash of the token selects candidates in a sorted table,
  the bytes decide);
* the token's column is scikit-learn's: signed 32-bit MurmurHash3 (x86_32, seed 0) of
  its UTF-8 bytes, absolute value modulo ``n_features``, with scikit-learn's special
  case for ``INT32_MIN`` (``sklearn/feature_extraction/_hashing_fast.pyx``);
* a row's columns are sorted and summed (``FeatureHasher``'s ``sum_duplicates``).

Texts with any non-ASCII character keep the Python path (Unicode ``\\w`` and
``str.lower`` need Unicode tables). ``tests/test_features.py`` checks the kernel
against ``HashingVectorizer.transform`` on real corpora and on constructed edge cases.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from numba import njit

_INT32_MIN = -(2**31)


@njit(cache=True, inline="always")
def _rotl32(x: np.uint32, r: int) -> np.uint32:
    return np.uint32((x << np.uint32(r)) | (x >> np.uint32(32 - r)))


@njit(cache=True)
def _murmur3_32(buf: np.ndarray, start: int, end: int) -> np.int32:
    """Signed MurmurHash3 x86_32 (seed 0) of ``buf[start:end]`` (what ``murmurhash3_32(bytes, 0)`` returns)."""
    c1 = np.uint32(0xCC9E2D51)
    c2 = np.uint32(0x1B873593)
    h = np.uint32(0)
    n = end - start
    nblocks = n // 4
    for b in range(nblocks):
        i = start + 4 * b
        k = (np.uint32(buf[i]) | (np.uint32(buf[i + 1]) << np.uint32(8))
             | (np.uint32(buf[i + 2]) << np.uint32(16)) | (np.uint32(buf[i + 3]) << np.uint32(24)))
        k = np.uint32(k * c1)
        k = _rotl32(k, 15)
        k = np.uint32(k * c2)
        h = np.uint32(h ^ k)
        h = _rotl32(h, 13)
        h = np.uint32(np.uint32(h * np.uint32(5)) + np.uint32(0xE6546B64))
    tail = start + 4 * nblocks
    k = np.uint32(0)
    rem = n & 3
    if rem >= 3:
        k = np.uint32(k ^ (np.uint32(buf[tail + 2]) << np.uint32(16)))
    if rem >= 2:
        k = np.uint32(k ^ (np.uint32(buf[tail + 1]) << np.uint32(8)))
    if rem >= 1:
        k = np.uint32(k ^ np.uint32(buf[tail]))
        k = np.uint32(k * c1)
        k = _rotl32(k, 15)
        k = np.uint32(k * c2)
        h = np.uint32(h ^ k)
    h = np.uint32(h ^ np.uint32(n))
    h = np.uint32(h ^ (h >> np.uint32(16)))
    h = np.uint32(h * np.uint32(0x85EBCA6B))
    h = np.uint32(h ^ (h >> np.uint32(13)))
    h = np.uint32(h * np.uint32(0xC2B2AE35))
    h = np.uint32(h ^ (h >> np.uint32(16)))
    return np.int32(h)


@njit(cache=True, inline="always")
def _is_word(c: np.uint8) -> bool:
    return (97 <= c <= 122) or (65 <= c <= 90) or (48 <= c <= 57) or c == 95


@njit(cache=True)
def _is_stop(buf: np.ndarray, start: int, n: int, h: np.int32, stop_hash: np.ndarray, stop_ptr: np.ndarray,
             stop_buf: np.ndarray) -> bool:
    """``buf[start:start + n]`` (hash ``h``) is a stop word (the table is sorted by hash; equal hashes compared by bytes)."""
    i = np.searchsorted(stop_hash, h)
    while i < stop_hash.shape[0] and stop_hash[i] == h:
        s, e = stop_ptr[i], stop_ptr[i + 1]
        if e - s == n:
            same = True
            for j in range(n):
                if stop_buf[s + j] != buf[start + j]:
                    same = False
                    break
            if same:
                return True
        i += 1
    return False


@njit(cache=True, nogil=True)
def hash_ascii_counts(buf: np.ndarray, bounds: np.ndarray, n_features: int, stop_hash: np.ndarray,
                      stop_ptr: np.ndarray, stop_buf: np.ndarray):  # pragma: no cover - compiled
    """Hashed term counts of the lower-cased ASCII texts ``buf[bounds[d]:bounds[d + 1]]`` as CSR arrays.

    ``buf`` must already be lower-case (``str.lower`` before encoding: the caller's
    one C-speed pass), so a token is hashed where it lies.

    Returns ``(indptr, indices, data)``: int64, int32 (sorted per row), float64 counts.
    """
    n_docs = bounds.shape[0] - 1
    cap = buf.shape[0] // 3 + n_docs + 1  # a token takes >= 2 bytes and one separator
    indices = np.empty(cap, dtype=np.int32)
    data = np.empty(cap, dtype=np.float64)
    indptr = np.zeros(n_docs + 1, dtype=np.int64)
    cols = np.empty(cap, dtype=np.int32)
    out = 0
    for d in range(n_docs):
        pos, end = bounds[d], bounds[d + 1]
        n_tok = 0
        while pos < end:
            if not _is_word(buf[pos]):
                pos += 1
                continue
            start = pos
            while pos < end and _is_word(buf[pos]):
                pos += 1
            n = pos - start
            if n < 2:
                continue
            h = _murmur3_32(buf, start, start + n)
            if stop_hash.shape[0] and _is_stop(buf, start, n, h, stop_hash, stop_ptr, stop_buf):
                continue
            if h == _INT32_MIN:
                col = (2147483647 - (n_features - 1)) % n_features
            else:
                col = abs(np.int64(h)) % n_features
            cols[n_tok] = col
            n_tok += 1
        row = cols[:n_tok]
        row.sort()
        i = 0
        while i < n_tok:
            j = i + 1
            while j < n_tok and row[j] == row[i]:
                j += 1
            indices[out] = row[i]
            data[out] = j - i
            out += 1
            i = j
        indptr[d + 1] = out
    return indptr, indices[:out].copy(), data[:out].copy()


def stop_word_table(words: Iterable[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(hashes, offsets, bytes)`` of ASCII stop words sorted by their MurmurHash3, for :func:`hash_ascii_counts`.

    Non-ASCII stop words can never match an ASCII token and are left out.
    """
    from sklearn.utils import murmurhash3_32

    encoded = sorted((murmurhash3_32(w, seed=0, positive=False), w.encode("ascii")) for w in set(words) if w.isascii())
    hashes = np.array([h for h, _ in encoded], dtype=np.int32)
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(b) for _, b in encoded])
    data = np.frombuffer(b"".join(b for _, b in encoded), dtype=np.uint8).copy()
    return hashes, offsets, data
