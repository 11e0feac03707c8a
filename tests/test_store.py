"""Window, seed store and held labels stay within their bounds."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from streamsemi.core.store import PendingLabels, Row, SeedStore, Window, rows_to_csr


def row(*cols: int) -> Row:
    return Row(np.array(cols, dtype=np.int32), np.ones(len(cols), dtype=np.float32))


def test_window_count_bound_evicts_oldest_and_refresh_moves_to_newest():
    w = Window(max_docs=3)
    for i in range(3):
        assert w.add(f"d{i}", row(i), ts=float(i)) == []
    assert w.add("d0", row(9), ts=3.0) == []  # re-delivered document: refreshed, not duplicated
    assert w.add("d3", row(3), ts=4.0) == ["d1"]
    assert w.ids() == ["d2", "d0", "d3"] and len(w) == 3
    assert w.get("d0").row.indices.tolist() == [9]


def test_window_age_bound():
    w = Window(max_docs=10, max_age_s=100)
    w.add("old", row(1), ts=0.0)
    w.add("new", row(2), ts=150.0)
    assert w.expire(now=160.0) == ["old"] and w.ids() == ["new"]
    assert w.oldest_ts() == 150.0
    assert Window(10).expire(now=1e12) == [], "no age bound configured"


def test_window_keeps_bounded_text():
    w = Window(max_docs=2, keep_text_chars=4)
    w.add("a", row(1), 0.0, "abcdefgh")
    assert w.get("a").text == "abcd"
    w0 = Window(max_docs=2, keep_text_chars=0)
    w0.add("a", row(1), 0.0, "abcdefgh")
    assert w0.get("a").text is None


def test_seed_store_bound_relabel_remove_and_counts():
    s = SeedStore(max_docs=2)
    s.put("a", ("x",), row(1))
    s.put("b", ("x", "y"), row(2))
    assert s.put("c", ("y",), row(3)) == ["a"]
    assert s.class_counts() == {"x": 1, "y": 2}
    assert s.relabel("b", ("z",)) and s.class_counts() == {"z": 1, "y": 1}
    assert not s.relabel("missing", ("z",))
    assert s.remove("c") and not s.remove("c") and len(s) == 1


def test_pending_labels_expire_in_order_and_overflow():
    p = PendingLabels(max_items=2, ttl_s=10)
    assert p.put("a", ("x",), now=0) == []
    assert p.put("b", ("y",), now=5) == []
    overflow = p.put("c", ("z",), now=6)
    assert [k for k, _ in overflow] == ["a"]
    assert [k for k, _ in p.expire(now=15.5)] == ["b"]
    assert "c" in p and p.pop("c").labels == ("z",) and len(p) == 0


def test_rows_to_csr_roundtrip():
    X = sp.csr_matrix(np.array([[0, 2, 0, 1], [0, 0, 0, 0], [3, 0, 0, 0]], dtype=float))
    rows = [Row.from_csr(X, i) for i in range(3)]
    Y = rows_to_csr(rows, 4)
    assert (Y != X).nnz == 0 and Y.shape == (3, 4)
    assert rows_to_csr([], 4).shape == (0, 4)
