"""The engine's own structures are bounded in bytes, not only in entries.

The stores' bounds are tested in tests/test_store.py; these are the two structures the
engine keeps itself: the pre-model buffer and the per-document control-op bookkeeping.
"""

from __future__ import annotations

from streamsemi.core.messages import Document
from streamsemi.core.store import ENTRY_OVERHEAD_BYTES, str_bytes
from streamsemi.engine import BUFFER_BYTES_PER_DOC, CONTROL_OP_BYTES, Engine, EngineConfig


def cfg(**kw) -> EngineConfig:
    base = dict(algorithms=["constrained-kmeans"], background_refit=False, n_features=2**18,
                refit_every_docs=0, min_docs_first_refit=10**6, drift_detection=False,
                refit_growth=0, refit_idle_s=0, first_fit_stable_seeds=0)
    base.update(kw)
    return EngineConfig(**base)


def wide_text(k: int, n_terms: int) -> str:
    """A text of ``n_terms`` distinct words (a wide term row), unique to document ``k``."""
    return " ".join(f"w{k}x{j}" for j in range(n_terms))


def test_buffered_documents_keep_no_text_and_the_buffer_fills_by_bytes():
    eng = Engine(cfg(max_buffered_docs=10))
    budget = 10 * BUFFER_BYTES_PER_DOC
    n = 0
    while not eng.buffer_full:
        eng.process([Document(f"d{n}", wide_text(n, 3000), meta={"big": "m" * 5000})])
        n += 1
        assert n < 10, "the buffer must be full by bytes before it is full by count"
    assert len(eng.buffer) == n < eng.config.max_buffered_docs
    # accounted bytes: exactly id + row + entry overhead per document, over the budget now, under it one doc earlier
    expected = [str_bytes(d.id) + row.nbytes + ENTRY_OVERHEAD_BYTES for d, row in eng.buffer]
    assert eng.buffer_bytes == sum(expected) >= budget > sum(expected[:-1])
    # no text or meta is held twice: the buffer drops them, the window keeps the text
    assert all(d.text == "" and d.meta is None for d, _ in eng.buffer)
    assert eng.window.get("d0").text.startswith("w0x0 w0x1")
    # dropping documents (revoked partitions) recounts the bytes
    eng.drop_buffered(lambda d: d.id in {"d0", "d1"})
    assert eng.buffer_bytes == sum(expected[2:])
    assert not eng.buffer_full


def test_the_buffer_is_emptied_and_its_bytes_reset_by_the_first_model():
    eng = Engine(cfg(max_buffered_docs=50, min_docs_first_refit=40, min_seed_classes=2, min_seeds_per_class=1, first_fit_stable_seeds=0))
    texts = {"a": "grain wheat harvest corn crop", "b": "oil crude barrel opec refinery"}
    for k in range(39):
        eng.process([Document(f"d{k}", f"{texts['ab'[k % 2]]} item{k}")])
    assert len(eng.buffer) == 39 and eng.buffer_bytes > 0
    eng.label("d0", ["grain"])
    eng.label("d1", ["oil"])
    out = eng.process([Document("d39", f"{texts['b']} item39")]).assignments
    assert eng.ready and len(eng.buffer) == 0 and eng.buffer_bytes == 0
    assert {a.id for a in out} == {f"d{k}" for k in range(40)}


def test_control_op_bookkeeping_is_bounded_in_bytes_and_keeps_the_newest():
    eng = Engine(cfg(max_seed_docs=5, max_pending_labels=5))  # at most 10 entries, 10 x CONTROL_OP_BYTES bytes
    long_ids = [f"{k:03d}" + "x" * 400 for k in range(20)]
    for offset, doc_id in enumerate(long_ids):
        eng.unlabel(doc_id, offset)
    per_op = str_bytes(long_ids[0]) + ENTRY_OVERHEAD_BYTES
    fit = (10 * CONTROL_OP_BYTES) // per_op
    assert fit < 10  # the byte bound is the one that binds here
    assert eng.control_ops == fit
    assert eng.export_state().last_ops == [(i, 20 - fit + n, "unlabel") for n, i in enumerate(long_ids[-fit:])]
    # short ids: the entry bound binds
    for offset, doc_id in enumerate(f"s{k}" for k in range(30)):
        eng.unlabel(doc_id, 100 + offset)
    assert eng.control_ops == 10
    assert [op[0] for op in eng.export_state().last_ops] == [f"s{k}" for k in range(20, 30)]
