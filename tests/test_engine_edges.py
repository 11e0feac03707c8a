"""Engine parts at their edges: output verdicts from model probabilities, the output message, config
validation, the class cap, the first-fit seed policy and control bookkeeping.

Written against the survivors of the mutation run on ``streamsemi/engine.py``
(benchmarks/results/mutation.md). Fake models with fixed probabilities, no corpus, no fit.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from streamsemi.core.messages import Document, Rejected
from streamsemi.core.store import ENTRY_OVERHEAD_BYTES, str_bytes
from streamsemi.engine import (
    CONTROL_OP_BYTES,
    LABEL_PROB_MIN,
    LABELS_IN_OUTPUT,
    Assignment,
    Engine,
    EngineConfig,
    ModelSlot,
)


class _Fixed:
    """A fitted model whose probabilities (and multi-label indicator) are given."""

    def __init__(self, P, indicator=None) -> None:
        self.P, self.indicator = np.asarray(P, dtype=float), indicator

    def predict_proba(self, X):
        assert X.shape[0] == self.P.shape[0]
        return self.P

    def predict(self, X):
        assert X.shape[0] == self.indicator.shape[0]
        return self.indicator


def _slot(P, classes, new=(), multilabel=False, indicator=None) -> ModelSlot:
    return ModelSlot(_Fixed(P, indicator), 3, 0.0, np.array(classes, dtype=object), frozenset(new), multilabel, {})


def _X(n: int) -> sp.csr_matrix:
    return sp.csr_matrix((n, 4))


def test_single_label_verdicts_keep_likely_labels_and_the_top_one() -> None:
    P = [[0.7, 0.2999, 0.0001, 0.0],
         [LABEL_PROB_MIN, 0.0002, 0.9, 0.0978],
         [0.1, 0.1, 0.1, 0.7]]
    out = Engine._assign_with(_slot(P, ["a", "b", "c", "new-0"], new={"new-0"}), _X(3))
    assert out[0] == ("a", 0.7, {"a": 0.7, "b": 0.2999}, "a", False)
    assert out[1] == ("c", 0.9, {"c": 0.9, "new-0": 0.0978, "a": LABEL_PROB_MIN}, "c", False)
    assert list(out[1][2]) == ["c", "new-0", "a"], "labels ordered by probability"
    assert out[2] == (None, 0.7, {"new-0": 0.7, "a": 0.1, "b": 0.1, "c": 0.1}, "new-0", True)


def test_the_top_label_is_kept_even_below_the_probability_floor() -> None:
    n = 1200  # every class below LABEL_PROB_MIN
    P = np.full((1, n), 1.0 / n)
    P[0, 5] += 1e-9
    ((label, score, labels, cluster, new),) = Engine._assign_with(_slot(P, [f"c{k}" for k in range(n)]), _X(1))
    assert label == cluster == "c5" and score == P[0, 5] and labels == {"c5": round(P[0, 5], 6)}


def test_at_most_labels_in_output_labels_rounded_to_six_decimals() -> None:
    k = LABELS_IN_OUTPUT + 3
    p = np.arange(1, k + 1, dtype=float)
    p[-1] += 1e-7 * 7
    P = (p / p.sum())[None, :]
    ((label, score, labels, _, _),) = Engine._assign_with(_slot(P, [f"c{j}" for j in range(k)]), _X(1))
    assert label == f"c{k - 1}" and score == P[0, -1]
    assert list(labels) == [f"c{j}" for j in range(k - 1, k - 1 - LABELS_IN_OUTPUT, -1)]
    assert all(v == round(P[0, int(c[1:])], 6) for c, v in labels.items())


def test_multilabel_verdicts_follow_the_indicator_or_the_top_class() -> None:
    P = [[0.6, 0.2765433, 0.1234567], [0.2, 0.5, 0.3]]
    slot = _slot(P, ["a", "b", "c"], multilabel=True, indicator=np.array([[1, 0, 1], [0, 0, 0]]))
    out = Engine._assign_with(slot, _X(2))
    assert out == [("a", 0.6, {"a": 0.6, "c": 0.123457}, "a", False), ("b", 0.5, {"b": 0.5}, "b", False)]


def _assignment(**kw) -> Assignment:
    base = dict(id="d1", algorithm="alg", model_version=4, label="grain", score=0.123456789, labels={"grain": 0.5},
                cluster="grain", new_cluster=False, explain=["wheat"], primary=True, ts=12.5)
    base.update(kw)
    return Assignment(**base)


def test_the_output_message() -> None:
    assert _assignment().to_message() == {
        "id": "d1", "algorithm": "alg", "model_version": 4, "revision": 0, "label": "grain", "score": 0.123457,
        "labels": {"grain": 0.5}, "cluster": "grain", "new_cluster": False, "explain": ["wheat"], "primary": True,
        "provisional": False, "ts": 12.5}
    msg = _assignment(fallback=True, revision=2, provisional=True, label=None, new_cluster=True).to_message()
    assert msg["fallback"] is True and msg["revision"] == 2 and msg["provisional"] is True
    assert msg["label"] is None and msg["new_cluster"] is True
    # the worker's id is the last field, after the optional ones (the field order is part of the records' bytes)
    named = _assignment(fallback=True, stream="news").to_message("w-1")
    assert list(named)[-3:] == ["fallback", "stream", "worker"] and named["worker"] == "w-1"
    assert {k: v for k, v in named.items() if k != "worker"} == _assignment(fallback=True, stream="news").to_message()


def test_config_validation_messages_and_primary_default() -> None:
    with pytest.raises(ValueError, match=r"^EngineConfig.algorithms: at least one algorithm is needed$"):
        EngineConfig(algorithms=[])
    with pytest.raises(ValueError, match=r"^EngineConfig.primary: 'x' is not enabled$"):
        EngineConfig(primary="x")
    with pytest.raises(ValueError, match=r"^EngineConfig.revisions: 'some' is not one of \('off', 'changed', 'all'\)$"):
        EngineConfig(revisions="some")
    with pytest.raises(ValueError, match=r"^EngineConfig.revision_chunk: must be >= 1, got 0$"):
        EngineConfig(revision_chunk=0)
    assert EngineConfig(revision_chunk=1).revision_chunk == 1
    assert EngineConfig(algorithms=["seeded-kmeans"]).primary == "seeded-kmeans"
    assert EngineConfig(algorithms=["seeded-kmeans", "constrained-kmeans"]).primary == "auto"
    assert EngineConfig(algorithms=["seeded-kmeans", "constrained-kmeans"], primary="constrained-kmeans").primary \
        == "constrained-kmeans"


def _engine(**kw) -> Engine:
    base = dict(background_refit=False, n_features=2**12, drift_detection=False, refit_every_docs=0, refit_growth=0,
                refit_idle_s=0, min_docs_first_refit=10**6, explain_words=0)
    base.update(kw)
    return Engine(EngineConfig(**base), clock=lambda: 1000.0)


def test_the_class_cap_counts_seeded_and_held_classes_and_is_inclusive() -> None:
    eng = _engine(max_classes=3)
    eng.label("s1", ["a"], text="alpha words here")
    eng.label("held", ["b"])                       # held: its document has not arrived
    assert eng.label("s2", ["a", "c"], text="gamma words here") == [], "a, b, c: exactly max_classes"
    assert eng.label("s3", ["b", "a"], text="beta words here") == [], "known classes only"
    (op, rej), = eng.label("s4", ["d", "a"])
    assert op == {"op": "label", "id": "s4", "labels": ["d", "a"]}
    assert rej == Rejected("invalid_label", "would exceed max_classes=3 classes (seeded and held labels)")
    assert "s4" not in eng.pending and "s4" not in eng.seeds
    two = _engine(max_classes=2)
    two.label("s1", ["a"], text="alpha words here")
    two.label("h1", ["a"])                         # held, of a seeded class: counted once
    assert two.label("s2", ["b"], text="beta words here") == []
    three = _engine(max_classes=2)
    three.label("s1", ["a"], text="alpha words here")
    three.label("h1", ["b"])                       # held, of a class no seed has: counted
    assert [r.reason for _, r in three.label("s2", ["c"], text="gamma words here")] == ["invalid_label"]


def test_seed_policy_counts_classes_with_enough_seeds() -> None:
    eng = _engine(min_seed_classes=2, min_seeds_per_class=2)
    eng.label("a1", ["a"], text="alpha one")
    eng.label("b1", ["b"], text="beta one")
    eng.label("a2", ["a"], text="alpha two")
    assert not eng.seed_policy_met(), "one class with 2 seeds"
    eng.label("b2", ["b"], text="beta two")
    assert eng.seed_policy_met(), "two classes with exactly 2 seeds each"
    eng.unlabel("b2")
    assert not eng.seed_policy_met()


def test_labels_with_text_seed_at_once_and_unlabel_reports_what_it_removed() -> None:
    eng = _engine()
    assert eng.label("t", ["a"], text="some real words", offset=7) == []
    assert eng.seeds.get("t").labels == ("a",) and eng.drain_resolved() == []
    (op, rej), = eng.label("u", ["a"], text="the of and")
    assert op == {"op": "label", "id": "u", "labels": ["a"]}
    assert rej == Rejected("no_terms", "the label's text has no indexable terms")
    assert eng.unlabel("t", offset=8) is True and "t" not in eng.seeds
    assert eng.unlabel("t", offset=9) is False
    eng.label("h", ["b"], offset=10)
    assert eng.control_ops == 2, "one entry per document: its last operation"
    assert eng.unlabel("h") is True and "h" not in eng.pending
    eng.label("n", ["b"])
    assert eng.control_ops == 2, "operations without an offset are not remembered"


def test_a_label_for_a_window_document_is_resolved_with_its_text_and_offset() -> None:
    eng = _engine()
    eng.process([Document(id="w", text="window words here", ts=5.0)])
    assert eng.label("w", ["a", "b"], offset=3) == []
    (r,) = eng.drain_resolved()
    assert (r.id, r.labels, r.text, r.label_offset) == ("w", ("a", "b"), "window words here", 3)
    assert eng.label("w", ["c"], offset=4) == [] and eng.seeds.get("w").labels == ("c",), "a relabel"
    assert eng.drain_resolved() == [], "a relabel of a seed is not resolved again"


def test_remembered_control_operations_are_bounded_in_entries_and_bytes() -> None:
    # reference: one entry per id (its last operation), oldest evicted first while there are more than
    # max_seed_docs + max_pending_labels entries or their bytes exceed that many CONTROL_OP_BYTES; the newest
    # entry is always kept
    eng = _engine(max_seed_docs=2, max_pending_labels=2)
    max_ops = 4
    rng = np.random.default_rng(0)
    pool = [f"{k}-" + "x" * int(n) for k, n in enumerate(rng.choice([1, 100, 143, 300, 900, 2000], size=12))]
    expected: dict[str, int] = {}
    for offset in range(400):
        doc_id = pool[int(rng.integers(len(pool)))]
        if offset % 2:
            eng.unlabel(doc_id, offset=offset)
        else:
            eng.label(doc_id, ["a"], offset=offset)
        expected.pop(doc_id, None)
        expected[doc_id] = offset
        while len(expected) > 1 and (len(expected) > max_ops or sum(
                str_bytes(k) + ENTRY_OVERHEAD_BYTES for k in expected) > max_ops * CONTROL_OP_BYTES):
            del expected[next(iter(expected))]
        got = [(k, off) for k, off, _ in eng.export_state().last_ops]
        assert got == list(expected.items()), offset
    assert eng.control_ops == len(expected)


def test_an_operation_exactly_at_the_byte_budget_is_kept() -> None:
    eng = _engine(max_seed_docs=2, max_pending_labels=1)
    width = CONTROL_OP_BYTES - ENTRY_OVERHEAD_BYTES - str_bytes("")  # one op of exactly CONTROL_OP_BYTES
    ids = [c * width for c in "pqr"]
    for k, doc_id in enumerate(ids):
        eng.unlabel(doc_id, offset=k)
    assert [k for k, _, _ in eng.export_state().last_ops] == ids, "3 x CONTROL_OP_BYTES: at the budget"
    eng.unlabel("s" * 3000, offset=9)
    assert [k for k, _, _ in eng.export_state().last_ops] == ["s" * 3000], "alone over budget: still kept"


def test_unlabel_is_counted_as_a_control_operation() -> None:
    eng = _engine()
    eng.unlabel("x")
    eng.unlabel("y")
    assert eng.telemetry.control.labels("unlabel")._value.get() == 2


def test_without_text_is_replace_without_text_and_meta() -> None:
    """The partial and buffered copies of a document keep every field but its text and meta."""
    import dataclasses

    from streamsemi.core.messages import Document
    from streamsemi.engine import without_text

    doc = Document(id="d1", text="some text", ts=12.5, stream="news", meta={"k": 1}, arrival=99.0,
                   source=("docs", 3, 17))
    assert without_text(doc) == dataclasses.replace(doc, text="", meta=None)
    # a field added to Document must be copied by without_text too: every field set here differs from its default
    assert {f.name for f in dataclasses.fields(Document)} == {"id", "text", "ts", "stream", "meta", "arrival", "source"}
