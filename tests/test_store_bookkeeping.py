"""Seed and held-label bookkeeping (counts, bytes, eviction order) and row stacking.

Written against survivors of the mutation run on ``streamsemi/core/store.py``
(benchmarks/results/mutation.md): replacing a seed or a held label must not leave the
old labels counted, removal must uncount, eviction is oldest first with a replaced
entry counting as new, and stacking rows must not depend on which rows are empty.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from streamsemi.core.store import PendingLabels, Row, SeedStore, Window, rows_to_csr


def row(*cols: int) -> Row:
    idx = np.asarray(sorted(cols), dtype=np.int32)
    return Row(idx, np.arange(1, idx.size + 1, dtype=np.float32))


def test_replacing_and_removing_a_seed_keeps_counts_and_bytes_exact() -> None:
    s = SeedStore(max_docs=10)
    s.put("d", ("x",), row(1, 2))
    one = s.nbytes
    s.put("d", ("y", "z"), row(1, 2))
    fresh = SeedStore(max_docs=10)
    fresh.put("d", ("y", "z"), row(1, 2))
    assert len(s) == 1 and s.class_counts() == {"y": 1, "z": 1}
    assert s.nbytes == fresh.nbytes > one  # accounted once: the old seed's bytes are gone
    s.put("e", ("y",), row(3))
    assert s.class_counts() == {"y": 2, "z": 1}
    assert s.remove("d") and s.class_counts() == {"y": 1}
    assert s.remove("e") and s.class_counts() == {} and s.nbytes == 0 and len(s) == 0
    assert not s.remove("e")


def test_replacing_a_seed_does_not_double_its_bytes() -> None:
    a, b = SeedStore(max_docs=10), SeedStore(max_docs=10)
    a.put("d", ("x",), row(1, 2))
    a.put("d", ("x",), row(1, 2))
    b.put("d", ("x",), row(1, 2))
    assert a.nbytes == b.nbytes > 0 and a.class_counts() == {"x": 1}


def test_seed_eviction_is_oldest_first_and_a_replaced_seed_is_new() -> None:
    s = SeedStore(max_docs=2)
    assert s.put("a", ("x",), row(1)) == []
    assert s.put("b", ("y",), row(2)) == []
    assert s.put("c", ("x",), row(3)) == ["a"]
    assert s.put("b", ("z",), row(2)) == []          # replaced: b is now the newest
    assert s.put("d", ("x",), row(4)) == ["c"]
    assert [k for k, _ in s.items()] == ["b", "d"]
    assert s.class_counts() == {"z": 1, "x": 1}


def test_re_holding_a_label_replaces_it_and_moves_it_to_the_back() -> None:
    p = PendingLabels(max_items=2, ttl_s=60.0)
    assert p.put("a", ("x",), now=0.0) == []
    assert p.put("b", ("y",), now=0.0) == []
    assert p.put("a", ("z",), now=1.0) == []         # replaces a's label
    assert len(p) == 2 and p.class_counts() == {"y": 1, "z": 1}
    out = p.put("c", ("x",), now=2.0)
    assert [k for k, _ in out] == ["b"], "the oldest held label goes first; a was re-held later"
    assert p.class_counts() == {"z": 1, "x": 1}


def test_rows_to_csr_with_empty_rows_anywhere() -> None:
    rows = [row(), row(3, 5), row(), row(0)]
    X = rows_to_csr(rows, 8)
    expected = np.zeros((4, 8))
    expected[1, [3, 5]] = [1, 2]
    expected[3, 0] = 1
    assert X.shape == (4, 8) and X.dtype == np.float64 and X.nnz == 3
    np.testing.assert_array_equal(X.toarray(), expected)
    empty = rows_to_csr([row(), row()], 8)
    assert empty.shape == (2, 8) and empty.nnz == 0 and empty.dtype == np.float64
    assert sp.isspmatrix_csr(empty) and empty.indptr.tolist() == [0, 0, 0]
    none = rows_to_csr([], 8)
    assert none.shape == (0, 8) and none.nnz == 0


def _one(make, put) -> int:
    probe = make(None)
    put(probe, "a")
    return probe.nbytes


@pytest.mark.parametrize("kind", ["seeds", "pending", "window"])
def test_byte_bound_is_inclusive_and_the_newest_entry_always_stays(kind) -> None:
    make = {"seeds": lambda b: SeedStore(max_docs=100, max_bytes=b),
            "pending": lambda b: PendingLabels(max_items=100, ttl_s=60.0, max_bytes=b),
            "window": lambda b: Window(max_docs=100, max_bytes=b)}[kind]

    def put(store, doc_id):
        if kind == "seeds":
            return store.put(doc_id, ("x",), row(1, 2))
        if kind == "pending":
            return [k for k, _ in store.put(doc_id, ("x",), now=0.0)]
        return store.add(doc_id, row(1, 2), 0.0)

    size = _one(make, put)
    s = make(2 * size)                      # room for exactly two entries
    assert put(s, "a") == [] and put(s, "b") == [] and len(s) == 2 and s.nbytes == 2 * size
    assert put(s, "c") == ["a"] and len(s) == 2
    tight = make(size - 1)                  # not even room for one: the newest stays
    assert put(tight, "a") == [] and len(tight) == 1
    assert put(tight, "b") == ["a"] and len(tight) == 1 and "b" in tight


def test_expiry_edges() -> None:
    p = PendingLabels(max_items=10, ttl_s=60.0)
    p.put("a", ("x",), now=0.0)
    p.put("b", ("y",), now=1.0)
    assert p.expire(59.999) == []
    assert [k for k, _ in p.expire(60.0)] == ["a"], "a held label expires at exactly now + ttl"
    assert len(p) == 1 and p.class_counts() == {"y": 1}
    w = Window(max_docs=10, max_age_s=60.0)
    w.add("old", row(1), ts=0.0)
    w.add("new", row(2), ts=10.0)
    assert w.expire(60.0) == [] and len(w) == 2, "a document exactly max_age_s old stays"
    assert w.expire(60.001) == ["old"] and w.ids() == ["new"]


def test_relabel_keeps_the_byte_account_of_the_seed() -> None:
    s = SeedStore(max_docs=10)
    s.put("doc-1", ("x",), row(1, 2))
    before = s.nbytes
    assert s.relabel("doc-1", ("x",)) and s.nbytes == before
    assert s.relabel("doc-1", ("y",)) and s.class_counts() == {"y": 1} and s.nbytes == before
    assert not s.relabel("missing", ("y",))


def test_held_label_keeps_its_control_offset_and_empty_window_has_no_oldest() -> None:
    p = PendingLabels(max_items=10, ttl_s=60.0)
    p.put("a", ("x",), now=0.0, offset=41)
    held = p.pop("a")
    assert held is not None and held.offset == 41 and held.labels == ("x",)
    assert Window(max_docs=10).oldest_ts() is None


def test_row_from_csr_owns_compact_copies() -> None:
    X = sp.csr_matrix(np.array([[0, 2.0, 0, 3.0], [1.0, 0, 0, 0]]))
    r = Row.from_csr(X, 0)
    assert r.indices.tolist() == [1, 3] and r.data.tolist() == [2.0, 3.0]
    assert r.indices.dtype == np.int32 and r.data.dtype == np.float32
    # a window row must not keep the whole batch matrix alive (nor change with it)
    assert not np.shares_memory(r.indices, X.indices) and not np.shares_memory(r.data, X.data)
