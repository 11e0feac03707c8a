"""Bounded in-memory state: the document window, the seed store and held labels.

Vectors are kept as (indices, values) pairs of one sparse row each so that a
refit snapshot is one concatenation away from a CSR matrix.

Every store is bounded in entries *and* in bytes: each entry's size is accounted
when it is stored (:func:`row_bytes`, :func:`str_bytes` and a fixed per-entry
overhead measured with ``tracemalloc``, rounded up) and the oldest entries go when
either bound is passed. The default byte budgets are derived from the entry bounds
(``max_docs * *_BYTES_PER_DOC``), so existing settings keep their meaning and a
stream of maximal entries cannot exceed them; docs/reliability.md lists the bounds.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

# Bytes of Python/numpy overhead, measured with tracemalloc on CPython 3.11 and rounded up.
ROW_OVERHEAD_BYTES = 384       # Row object, its __dict__ and two ndarray headers (payload excluded)
ENTRY_OVERHEAD_BYTES = 320     # an entry object and its OrderedDict node
# Default byte budgets per entry of the count bound (average entry size allowed).
WINDOW_BYTES_PER_DOC = 32 * 1024   # a typical news document: ~3 KiB (row + kept text)
SEED_BYTES_PER_DOC = 16 * 1024     # rows only (no text)
PENDING_BYTES_PER_LABEL = 1024     # a typical held label: ~0.5 KiB


def str_bytes(s: str | None) -> int:
    """Bytes of a ``str`` object (0 for None): 1, 2 or 4 bytes per character plus its header."""
    return 0 if s is None else sys.getsizeof(s)


def labels_bytes(labels: tuple[str, ...]) -> int:
    """Bytes of a label tuple and its strings."""
    return sys.getsizeof(labels) + sum(sys.getsizeof(lb) for lb in labels)


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

    @property
    def nbytes(self) -> int:
        """Accounted bytes: both arrays' payload plus :data:`ROW_OVERHEAD_BYTES`."""
        return int(self.indices.nbytes + self.data.nbytes) + ROW_OVERHEAD_BYTES


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
    nbytes: int = 0    # accounted size (id, row, text, overhead)


class Window:
    """Recent documents, bounded by count, by bytes and optionally by age (oldest out).

    Parameters
    ----------
    max_docs : int
        Maximum number of documents.
    max_age_s : float or None
        Documents whose event time is older than ``now - max_age_s`` are dropped.
    keep_text_chars : int
        Characters of text kept per document (0 keeps none).
    max_bytes : int, optional
        Byte budget of the accounted entries (id, row, kept text, overhead); default
        ``max_docs * WINDOW_BYTES_PER_DOC``. The newest document is always kept, so the
        bound is ``max_bytes`` plus at most one entry.
    """

    def __init__(self, max_docs: int, max_age_s: float | None = None, keep_text_chars: int = 20000,
                 max_bytes: int | None = None) -> None:
        self.max_docs = int(max_docs)
        self.max_age_s = max_age_s or None
        self.keep_text_chars = int(keep_text_chars)
        self.max_bytes = int(max_bytes) if max_bytes is not None else self.max_docs * WINDOW_BYTES_PER_DOC
        self._entries: OrderedDict[str, WindowEntry] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        """Accounted bytes of every entry."""
        return self._bytes

    def __contains__(self, doc_id: str) -> bool:
        return doc_id in self._entries

    def get(self, doc_id: str) -> WindowEntry | None:
        return self._entries.get(doc_id)

    def add(self, doc_id: str, row: Row, ts: float, text: str | None = None) -> list[str]:
        """Insert (or refresh) a document; return the ids evicted by the count or byte bound."""
        old = self._entries.pop(doc_id, None)
        if old is not None:
            self._bytes -= old.nbytes
        kept = text[: self.keep_text_chars] if (text and self.keep_text_chars) else None
        size = str_bytes(doc_id) + str_bytes(kept) + row.nbytes + ENTRY_OVERHEAD_BYTES
        self._entries[doc_id] = WindowEntry(row, ts, kept, size)
        self._bytes += size
        evicted = []
        while len(self._entries) > self.max_docs or (self._bytes > self.max_bytes and len(self._entries) > 1):
            k, e = self._entries.popitem(last=False)
            self._bytes -= e.nbytes
            evicted.append(k)
        return evicted

    def expire(self, now: float) -> list[str]:
        """Drop documents older than the age bound; return their ids."""
        if self.max_age_s is None:
            return []
        cutoff = now - self.max_age_s
        old = [k for k, e in self._entries.items() if e.ts < cutoff]
        for k in old:
            self._bytes -= self._entries.pop(k).nbytes
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
    nbytes: int = 0    # accounted size (id, labels, row, overhead)


class SeedStore:
    """Seed-labeled documents, kept after they leave the window (oldest out beyond ``max_docs`` or ``max_bytes``).

    Per-class counts are maintained incrementally (label floods must not cost
    O(seeds) per label).

    Parameters
    ----------
    max_docs : int
        Maximum number of seeds.
    max_bytes : int, optional
        Byte budget of the accounted seeds (id, labels, row, overhead); default
        ``max_docs * SEED_BYTES_PER_DOC``. The newest seed is always kept.
    """

    def __init__(self, max_docs: int, max_bytes: int | None = None) -> None:
        self.max_docs = int(max_docs)
        self.max_bytes = int(max_bytes) if max_bytes is not None else self.max_docs * SEED_BYTES_PER_DOC
        self._seeds: OrderedDict[str, Seed] = OrderedDict()
        self._counts: dict[str, int] = {}
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._seeds)

    @property
    def nbytes(self) -> int:
        """Accounted bytes of every seed."""
        return self._bytes

    @staticmethod
    def _size(doc_id: str, labels: tuple[str, ...], row: Row) -> int:
        return str_bytes(doc_id) + labels_bytes(labels) + row.nbytes + ENTRY_OVERHEAD_BYTES

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
        labels = tuple(labels)
        seed = self._seeds[doc_id] = Seed(labels, row, self._size(doc_id, labels, row))
        self._bytes += seed.nbytes
        self._count(labels, +1)
        evicted = []
        while len(self._seeds) > self.max_docs or (self._bytes > self.max_bytes and len(self._seeds) > 1):
            old_id, old = self._seeds.popitem(last=False)
            self._count(old.labels, -1)
            self._bytes -= old.nbytes
            evicted.append(old_id)
        return evicted

    def relabel(self, doc_id: str, labels: tuple[str, ...]) -> bool:
        seed = self._seeds.get(doc_id)
        if seed is None:
            return False
        self._count(seed.labels, -1)
        seed.labels = tuple(labels)
        self._count(seed.labels, +1)
        self._bytes -= seed.nbytes
        seed.nbytes = self._size(doc_id, seed.labels, seed.row)
        self._bytes += seed.nbytes
        return True

    def remove(self, doc_id: str) -> bool:
        seed = self._seeds.pop(doc_id, None)
        if seed is None:
            return False
        self._count(seed.labels, -1)
        self._bytes -= seed.nbytes
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
    nbytes: int = 0    # accounted size (id, labels, overhead)


class PendingLabels:
    """Labels that arrived before their document, bounded in count, bytes and time.

    The classes named by held labels are counted (:meth:`class_counts`) so that the
    engine can bound seeded plus held classes together (``max_classes``).

    Parameters
    ----------
    max_items : int
        Maximum number of held labels.
    ttl_s : float
        A held label expires this long after it arrived.
    max_bytes : int, optional
        Byte budget of the accounted held labels (id, labels, overhead); default
        ``max_items * PENDING_BYTES_PER_LABEL``. The newest is always kept.
    """

    def __init__(self, max_items: int, ttl_s: float, max_bytes: int | None = None) -> None:
        self.max_items = int(max_items)
        self.ttl_s = float(ttl_s)
        self.max_bytes = int(max_bytes) if max_bytes is not None else self.max_items * PENDING_BYTES_PER_LABEL
        self._items: OrderedDict[str, PendingLabel] = OrderedDict()
        self._counts: dict[str, int] = {}
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, doc_id: str) -> bool:
        return doc_id in self._items

    @property
    def nbytes(self) -> int:
        """Accounted bytes of every held label."""
        return self._bytes

    def class_counts(self) -> dict[str, int]:
        """Held labels per class."""
        return dict(self._counts)

    def _forget(self, item: PendingLabel) -> None:
        self._bytes -= item.nbytes
        for label in item.labels:
            n = self._counts[label] - 1
            if n:
                self._counts[label] = n
            else:
                del self._counts[label]

    def put(self, doc_id: str, labels: tuple[str, ...], now: float, offset: int | None = None) -> list[tuple[str, PendingLabel]]:
        """Hold a label; return the (id, label) pairs pushed out by the count or byte bound."""
        self.pop(doc_id)
        labels = tuple(labels)
        item = self._items[doc_id] = PendingLabel(labels, now + self.ttl_s, offset,
                                                  str_bytes(doc_id) + labels_bytes(labels) + ENTRY_OVERHEAD_BYTES)
        self._bytes += item.nbytes
        for label in labels:
            self._counts[label] = self._counts.get(label, 0) + 1
        out = []
        while len(self._items) > self.max_items or (self._bytes > self.max_bytes and len(self._items) > 1):
            old_id, old = self._items.popitem(last=False)
            self._forget(old)
            out.append((old_id, old))
        return out

    def pop(self, doc_id: str) -> PendingLabel | None:
        item = self._items.pop(doc_id, None)
        if item is not None:
            self._forget(item)
        return item

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
            self._items.popitem(last=False)
            self._forget(item)
            out.append((doc_id, item))
        return out
