"""Seed and held-label bookkeeping (counts, bytes, eviction order) and row stacking.

Written against survivors of the mutation run on ``streamsemi/core/store.py``
(benchmarks/results/mutation.md): replacing a seed or a held label must not leave the
old labels counted, removal must uncount, eviction is oldest first with a replaced
entry counting as new, and stacking rows must not depend on which rows are empty.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from streamsemi.core.store import PendingLabels, Row, SeedStore, rows_to_csr


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
