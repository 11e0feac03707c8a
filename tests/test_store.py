"""Window, seed store and held labels stay within their bounds."""

from __future__ import annotations

import gc
import tracemalloc

import numpy as np
import scipy.sparse as sp

from streamsemi.core.store import (
    PENDING_BYTES_PER_LABEL,
    SEED_BYTES_PER_DOC,
    WINDOW_BYTES_PER_DOC,
    PendingLabels,
    Row,
    SeedStore,
    Window,
    rows_to_csr,
)


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


# ---------------------------------------------------------------- bounded in bytes ("every structure bounded in bytes")
ASTRAL = "\U0001f600"
TABLE_BYTES = 64  # docs/reliability.md: hash-table bytes per entry of a store's count bound  # a character that makes a str take 4 bytes per character


def big_row(nnz: int, seed: int = 0) -> Row:
    return Row(np.arange(seed, seed + nnz, dtype=np.int32), np.ones(nnz, dtype=np.float32))


def traced(fill):
    """Bytes still allocated after ``fill()`` (tracemalloc; numpy reports its buffers too)."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        store = fill()
        gc.collect()  # also empties the interpreter's free lists (freed objects kept for reuse)
        return store, tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def max_id(i: int) -> str:
    return (ASTRAL * 512)[: 512 - 8] + f"{i:08d}"  # max_id_chars characters, 4 bytes each


def test_window_is_bounded_in_bytes_and_the_accounting_covers_the_measured_size():
    budget = 3_000_000
    entry = 0

    def fill():
        nonlocal entry
        w = Window(max_docs=10**6, keep_text_chars=20_000, max_bytes=budget)
        for i in range(120):
            w.add(max_id(i), big_row(2000, i), float(i), ASTRAL * 20_000 + f"{i}")  # text cut to keep_text_chars
            entry = max(entry, w.get(max_id(i)).nbytes)
        return w

    w, measured = traced(fill)
    assert 0 < len(w) < 120 and w.ids()[-1] == max_id(119), "oldest out, newest kept"
    assert w.nbytes <= budget, "the byte bound holds"
    assert measured <= w.nbytes + TABLE_BYTES * 120, f"accounting ({w.nbytes}) under the measured size ({measured})"
    assert measured <= budget + entry + TABLE_BYTES * 120
    for doc_id in w.ids():
        w.add(doc_id, row(1), 0.0)  # refresh with a small entry: the bytes follow
    assert w.nbytes == sum(e.nbytes for _, e in w.items())
    w.max_age_s = 10
    w.expire(now=1e9)
    assert len(w) == 0 and w.nbytes == 0


def test_one_entry_larger_than_the_budget_is_kept_alone():
    w = Window(max_docs=10, max_bytes=100)
    w.add("a", row(1), 0.0)
    assert w.add("b", row(1), 0.0) == ["a"] and w.ids() == ["b"]


def test_default_byte_budgets_derive_from_the_entry_bounds():
    assert Window(10).max_bytes == 10 * WINDOW_BYTES_PER_DOC
    assert SeedStore(10).max_bytes == 10 * SEED_BYTES_PER_DOC
    assert PendingLabels(10, 1.0).max_bytes == 10 * PENDING_BYTES_PER_LABEL


def test_seed_store_is_bounded_in_bytes_and_counts_stay_exact():
    budget = 1_000_000

    def fill():
        s = SeedStore(max_docs=10**6, max_bytes=budget)
        for i in range(200):
            s.put(max_id(i), tuple(f"c{i % 7}-" + "x" * 60 for _ in range(1)), big_row(4000, i))
        return s

    s, measured = traced(fill)
    # a dict's table is not shrunk after deletions: TABLE_BYTES per entry ever held (<= the count bound)
    assert 0 < len(s) < 200 and s.nbytes <= budget and measured <= s.nbytes + TABLE_BYTES * 200
    counts: dict[str, int] = {}
    for _, seed in s.items():
        for lb in seed.labels:
            counts[lb] = counts.get(lb, 0) + 1
    assert s.class_counts() == counts, "evictions by bytes keep the class counts"
    doc_id = next(iter(dict(s.items())))
    before = s.nbytes
    assert s.relabel(doc_id, ("a",) * 1)
    assert s.nbytes < before and s.nbytes == sum(seed.nbytes for _, seed in s.items())
    for k in [k for k, _ in s.items()]:
        s.remove(k)
    assert s.nbytes == 0 and s.class_counts() == {}


def test_held_labels_are_bounded_in_bytes_with_maximal_entries():
    budget = 500_000
    labels = tuple(f"{k:02d}" + "L" * 62 for k in range(20))  # max_labels_per_doc labels of 64 characters

    def fill():
        p = PendingLabels(max_items=10**6, ttl_s=60, max_bytes=budget)
        pushed: list[int] = []
        for i in range(300):
            pushed += [int(k[-8:]) for k, _ in p.put(max_id(i), tuple(lb[:32] + lb[32:] for lb in labels), now=float(i))]
        return p, pushed

    (p, pushed), measured = traced(fill)
    assert len(p) + len(pushed) == 300 and pushed == list(range(len(pushed))), "oldest pushed out first"
    assert p.nbytes <= budget and measured <= p.nbytes + TABLE_BYTES * 300


def test_held_labels_count_their_classes():
    p = PendingLabels(max_items=2, ttl_s=10)
    p.put("a", ("x", "y"), now=0)
    p.put("b", ("y",), now=1)
    assert p.class_counts() == {"x": 1, "y": 2}
    p.put("a", ("z",), now=2)  # replaced: counted once, as the new labels
    assert p.class_counts() == {"y": 1, "z": 1}
    assert [k for k, _ in p.put("c", ("w",), now=3)] == ["b"]  # pushed out by the count bound
    assert p.class_counts() == {"z": 1, "w": 1}
    assert [k for k, _ in p.expire(now=12.5)] == ["a"] and p.class_counts() == {"w": 1}
    p.pop("c")
    assert p.class_counts() == {} and p.nbytes == 0
