"""Bounded in-memory state: the document window, the seed store and held labels.

Vectors are kept as (indices, values) pairs of one sparse row each so that a
refit snapshot is one concatenation away from a CSR matrix.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp


@dataclass
class Row:
    """One document's hashed counts (sorted column indices and their values)."""

    indices: np.ndarray
    data: np.ndarray

    @classmethod
    def from_csr(cls, X: sp.csr_matrix, i: int) -> Row:
        lo, hi = X.indptr[i], X.indptr[i + 1]
        return cls(X.indices[lo:hi].astype(np.int32, copy=True), X.data[lo:hi].astype(np.float32, copy=True))

    @property
    def nnz(self) -> int:
        return int(self.indices.size)


def rows_to_csr(rows: list[Row], n_features: int) -> sp.csr_matrix:
    """Stack rows into a CSR matrix (float64)."""
    indptr = np.zeros(len(rows) + 1, dtype=np.int64)
    if rows:
        np.cumsum([r.nnz for r in rows], out=indptr[1:])
        indices = np.concatenate([r.indices for r in rows]) if indptr[-1] else np.zeros(0, np.int32)
        data = np.concatenate([r.data for r in rows]).astype(np.float64) if indptr[-1] else np.zeros(0)
    else:
        indices, data = np.zeros(0, np.int32), np.zeros(0)
    return sp.csr_matrix((data, indices, indptr), shape=(len(rows), n_features))


@dataclass
class WindowEntry:
    row: Row
    ts: float          # event time (document ts, else arrival)
    text: str | None   # kept to materialise seeds whose label arrives after the document


class Window:
    """Recent documents, bounded by count and optionally by age (oldest out).

    Parameters
    ----------
    max_docs : int
        Maximum number of documents.
    max_age_s : float or None
        Documents whose event time is older than ``now - max_age_s`` are dropped.
    keep_text_chars : int
        Characters of text kept per document (0 keeps none).
    """

    def __init__(self, max_docs: int, max_age_s: float | None = None, keep_text_chars: int = 20000) -> None:
        self.max_docs = int(max_docs)
        self.max_age_s = max_age_s or None
        self.keep_text_chars = int(keep_text_chars)
        self._entries: OrderedDict[str, WindowEntry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, doc_id: str) -> bool:
        return doc_id in self._entries

    def get(self, doc_id: str) -> WindowEntry | None:
        return self._entries.get(doc_id)

    def add(self, doc_id: str, row: Row, ts: float, text: str | None = None) -> list[str]:
        """Insert (or refresh) a document; return the ids evicted by the count bound."""
        self._entries.pop(doc_id, None)
        kept = text[: self.keep_text_chars] if (text and self.keep_text_chars) else None
        self._entries[doc_id] = WindowEntry(row, ts, kept)
        evicted = []
        while len(self._entries) > self.max_docs:
            evicted.append(self._entries.popitem(last=False)[0])
        return evicted

    def expire(self, now: float) -> list[str]:
        """Drop documents older than the age bound; return their ids."""
        if self.max_age_s is None:
            return []
        cutoff = now - self.max_age_s
        old = [k for k, e in self._entries.items() if e.ts < cutoff]
        for k in old:
            del self._entries[k]
        return old

    def oldest_ts(self) -> float | None:
        return min((e.ts for e in self._entries.values()), default=None)

    def ids(self) -> list[str]:
        return list(self._entries)

    def rows(self) -> list[Row]:
        return [e.row for e in self._entries.values()]

    def items(self) -> Iterable[tuple[str, WindowEntry]]:
        return self._entries.items()


@dataclass
class Seed:
    labels: tuple[str, ...]
    row: Row


class SeedStore:
    """Seed-labeled documents, kept after they leave the window (oldest out beyond ``max_docs``).

    Per-class counts are maintained incrementally (label floods must not cost
    O(seeds) per label).
    """

    def __init__(self, max_docs: int) -> None:
        self.max_docs = int(max_docs)
        self._seeds: OrderedDict[str, Seed] = OrderedDict()
        self._counts: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._seeds)

    def __contains__(self, doc_id: str) -> bool:
        return doc_id in self._seeds

    def get(self, doc_id: str) -> Seed | None:
        return self._seeds.get(doc_id)

    def _count(self, labels: tuple[str, ...], delta: int) -> None:
        for label in labels:
            n = self._counts.get(label, 0) + delta
            if n:
                self._counts[label] = n
            else:
                self._counts.pop(label, None)

    def put(self, doc_id: str, labels: tuple[str, ...], row: Row) -> list[str]:
        """Add or replace a seed; return ids evicted by the bound."""
        self.remove(doc_id)
        self._seeds[doc_id] = Seed(tuple(labels), row)
        self._count(tuple(labels), +1)
        evicted = []
        while len(self._seeds) > self.max_docs:
            old_id, old = self._seeds.popitem(last=False)
            self._count(old.labels, -1)
            evicted.append(old_id)
        return evicted

    def relabel(self, doc_id: str, labels: tuple[str, ...]) -> bool:
        seed = self._seeds.get(doc_id)
        if seed is None:
            return False
        self._count(seed.labels, -1)
        seed.labels = tuple(labels)
        self._count(seed.labels, +1)
        return True

    def remove(self, doc_id: str) -> bool:
        seed = self._seeds.pop(doc_id, None)
        if seed is None:
            return False
        self._count(seed.labels, -1)
        return True

    def items(self) -> Iterable[tuple[str, Seed]]:
        return self._seeds.items()

    def class_counts(self) -> dict[str, int]:
        return dict(self._counts)


@dataclass
class PendingLabel:
    labels: tuple[str, ...]
    expires: float
    offset: int | None


class PendingLabels:
    """Labels that arrived before their document, bounded in count and time."""

    def __init__(self, max_items: int, ttl_s: float) -> None:
        self.max_items = int(max_items)
        self.ttl_s = float(ttl_s)
        self._items: OrderedDict[str, PendingLabel] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, doc_id: str) -> bool:
        return doc_id in self._items

    def put(self, doc_id: str, labels: tuple[str, ...], now: float, offset: int | None = None) -> list[tuple[str, PendingLabel]]:
        """Hold a label; return the (id, label) pairs pushed out by the count bound."""
        self._items.pop(doc_id, None)
        self._items[doc_id] = PendingLabel(tuple(labels), now + self.ttl_s, offset)
        out = []
        while len(self._items) > self.max_items:
            out.append(self._items.popitem(last=False))
        return out

    def pop(self, doc_id: str) -> PendingLabel | None:
        return self._items.pop(doc_id, None)

    def items(self) -> Iterable[tuple[str, PendingLabel]]:
        """Held labels, oldest first."""
        return self._items.items()

    def expire(self, now: float) -> list[tuple[str, PendingLabel]]:
        """Remove and return labels past their expiry (insertion order = expiry order)."""
        out = []
        while self._items:
            doc_id, item = next(iter(self._items.items()))
            if item.expires > now:
                break
            out.append((doc_id, self._items.popitem(last=False)[1]))
        return out
