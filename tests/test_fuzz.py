"""Property-based fuzzing: arbitrary bytes and JSON values through parsing and every encoder the worker uses.

For any input, document and control parsing return a value (never raise), and every
output the worker would build from the result encodes to strict UTF-8 JSON: the
output key (:func:`encode_key`), the assignment message, the dead letter (from the raw
bytes, and from the re-encoded document), and the re-emitted seed message.
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamsemi.core.messages import (
    REASONS,
    ControlMessage,
    Document,
    Rejected,
    dead_letter,
    encode_json,
    encode_key,
    parse_control,
    parse_document,
)
from streamsemi.engine import Assignment

FIELDS = ["id", "text", "ts", "stream", "meta", "op", "labels", "origin", "label_offset"]

# every JSON type, with lone surrogates, huge numbers and non-finite floats
texts = st.text(max_size=20) | st.sampled_from(["\ud800", "x-\ud800", "\udfff", "\ud83d", "grain wheat", "new-1", ""])
numbers = (st.integers() | st.integers(min_value=10**300, max_value=10**400) | st.floats(allow_nan=True)
           | st.sampled_from([-62135596801, 253402300800, 2**63, -1]))
json_values = st.recursive(
    st.none() | st.booleans() | numbers | texts,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(texts, children, max_size=4),
    max_leaves=12,
)
fields = st.dictionaries(st.sampled_from(FIELDS) | texts, json_values, max_size=7)


def _strict(data: bytes) -> object:
    """Decode as strict UTF-8 JSON (no NaN, no lone surrogate)."""
    text = data.decode("utf-8")
    return json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))


def _raw(obj: object) -> bytes:
    # what a producer may send: JSON with \\u escapes (lone surrogates too), NaN, deep nesting
    return json.dumps(obj, allow_nan=True).encode("ascii")


def _check_every_output(raw: bytes) -> None:
    doc = parse_document(raw)
    assert isinstance(doc, (Document, Rejected))
    if isinstance(doc, Rejected):
        assert doc.reason in REASONS and doc.detail
        _strict(encode_json(dead_letter(raw, doc.reason, doc.detail, "documents", 0, 1, key=raw[:20])))
    else:
        encode_key(doc.id).decode("utf-8")
        a = Assignment(doc.id, "constrained-kmeans", 1, "grain", 0.5, {"grain": 0.5}, "grain", False,
                       [doc.text[:10]], True, 1.0, document=doc)
        _strict(encode_json(a.to_message()))
        _strict(encode_json(dead_letter(encode_json({"id": doc.id, "text": doc.text}), "no_terms", "x", "d", 0, 1)))
        _strict(encode_json({"op": "label", "id": doc.id, "labels": ["grain"], "text": doc.text,
                             "origin": "resolved", "label_offset": 3}))
    ctl = parse_control(raw)
    assert isinstance(ctl, (ControlMessage, Rejected))
    if isinstance(ctl, Rejected):
        assert ctl.reason in REASONS and ctl.detail
        _strict(encode_json(dead_letter(raw, ctl.reason, ctl.detail, "control", 0, 1, key=raw[:20])))
    elif ctl.op == "label":
        encode_key(ctl.id).decode("utf-8")
        _strict(encode_json({"op": "label", "id": ctl.id, "labels": list(ctl.labels)}))  # an engine rejection
        msg = {"op": "label", "id": ctl.id, "labels": list(ctl.labels), "text": ctl.text or "t",
               "origin": "resolved", "label_offset": ctl.label_offset or 0}
        _strict(encode_json(msg))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400))
def test_arbitrary_bytes_never_raise_anywhere(raw):
    _check_every_output(raw)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fields)
def test_arbitrary_json_objects_never_raise_anywhere(obj):
    _check_every_output(_raw(obj))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.fixed_dictionaries({"id": texts, "text": texts}, optional={f: json_values for f in FIELDS if f not in ("id", "text")}))
def test_documents_with_every_type_in_every_field(obj):
    _check_every_output(_raw(obj))
    doc = parse_document(_raw(obj))
    if isinstance(doc, Document):  # what passes is encodable as it is: nothing downstream needs a repair
        for value in (doc.id, doc.text, doc.stream or ""):
            value.encode("utf-8")


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=1, max_value=200_000), st.sampled_from(["[", "{\"a\":"]))
def test_deep_nesting_never_raises(depth, opener):
    closer = "]" if opener == "[" else "}"
    raw = ('{"id":"a","text":"grain","meta":' + opener * depth + "1" * (opener == "{\"a\":") + closer * depth + "}").encode()
    _check_every_output(raw)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_encode_json_is_total_on_any_value(value):
    _strict(encode_json({"v": value, "nested": [value, {"k": value}]}))
    encode_key(value if isinstance(value, str) else str(value)).decode("utf-8")


timestamps = numbers | st.sampled_from(["0001-01-01", "0001-01-01T00:00:00", "9999-12-31T23:59:59-23:59",
                                        "2024-02-30", "2024-01-01T00:00:00Z"]) | st.text(max_size=30) | json_values


@settings(max_examples=300, deadline=None)
@given(timestamps)
def test_any_timestamp_is_a_time_in_range_or_a_rejection(ts):
    raw = _raw({"id": "a", "text": "grain wheat", "ts": ts})
    doc = parse_document(raw)
    if isinstance(doc, Document):
        assert doc.ts is None or -62135596800 <= doc.ts <= 253402300799
    else:
        assert doc.reason in ("wrong_type", "invalid_utf8") and "'ts'" in doc.detail, doc  # utf8: a lone surrogate
    _check_every_output(raw)
