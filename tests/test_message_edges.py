"""Message limits at their exact edges and strict JSON output.

Written against survivors of the mutation run on ``streamsemi/core/messages.py``
(benchmarks/results/mutation.md): the label-count bound, the ``ts`` range bounds and
the output encoder's strict, compact JSON were not checked at their edges.
"""

from __future__ import annotations

import json
import math

import pytest

from streamsemi.core.messages import (
    TS_MAX,
    TS_MIN,
    Document,
    Limits,
    Rejected,
    encode_json,
    parse_document,
    validate_labels,
)


def _strict(raw: bytes):
    def no_constants(name: str):
        raise AssertionError(f"non-standard JSON constant {name}")

    return json.loads(raw.decode("utf-8"), parse_constant=no_constants)


def test_label_count_bound_is_inclusive() -> None:
    limits = Limits(max_labels_per_doc=3)
    assert validate_labels(["a", "b", "c"], limits) == ("a", "b", "c")
    assert validate_labels(["a", "b", "c", "d"], limits) == Rejected(
        "invalid_label", "4 labels, max_labels_per_doc=3")


@pytest.mark.parametrize("ts,ok", [(TS_MIN, True), (TS_MAX, True), (TS_MIN - 1, False), (TS_MAX + 1, False),
                                   (0, True), (math.inf, False)])
def test_epoch_ts_range_edges(ts, ok) -> None:
    out = parse_document(json.dumps({"id": "a", "text": "some words", "ts": ts}).encode())
    if ok:
        assert isinstance(out, Document) and out.ts == float(ts)
    else:
        assert isinstance(out, Rejected) and out.reason == "wrong_type"


def test_encode_json_is_strict_compact_utf8() -> None:
    raw = encode_json({"id": "é", "score": 0.5, "labels": {"a": 1}})
    assert raw == '{"id":"é","score":0.5,"labels":{"a":1}}'.encode()
    for bad in (math.nan, math.inf, -math.inf):
        out = _strict(encode_json({"id": "x", "score": bad}))  # never NaN/Infinity tokens
        assert out["id"] == "x" and not isinstance(out["score"], float)
