"""Message parsing: every bad input is rejected with a reason, never an exception."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamsemi.core.messages import (
    REASONS,
    ControlMessage,
    Document,
    Limits,
    Rejected,
    dead_letter,
    parse_control,
    parse_document,
)

SCHEMAS = Path(__file__).resolve().parent.parent / "docs" / "schemas"


def schema(name: str) -> dict:
    return json.loads((SCHEMAS / f"{name}.schema.json").read_text())


def enc(obj) -> bytes:
    return json.dumps(obj).encode()


def test_good_document_parses_with_iso_and_epoch_timestamps():
    d = parse_document(enc({"id": "a", "text": "hello world", "ts": "2020-01-02T03:04:05Z", "meta": {"k": 1}}))
    assert isinstance(d, Document) and d.id == "a" and d.ts == 1577934245.0 and d.meta == {"k": 1}
    assert parse_document(enc({"id": "a", "text": "x y", "ts": 12.5})).ts == 12.5


@pytest.mark.parametrize(("raw", "reason"), [
    (b"{", "invalid_json"),
    (b"", "invalid_json"),
    (b"\xff\xfe", "invalid_utf8"),
    (enc([1, 2]), "wrong_type"),
    (enc({"text": "t"}), "missing_field"),
    (enc({"id": "a"}), "missing_field"),
    (enc({"id": 5, "text": "t"}), "wrong_type"),
    (enc({"id": "", "text": "t"}), "wrong_type"),
    (enc({"id": "a", "text": 5}), "wrong_type"),
    (enc({"id": "a", "text": " \n "}), "empty_text"),
    (enc({"id": "a", "text": "t", "ts": "noon"}), "wrong_type"),
    (enc({"id": "a", "text": "t", "ts": True}), "wrong_type"),
    (enc({"id": "a", "text": "t", "meta": []}), "wrong_type"),
    (enc({"id": "a", "text": "t", "stream": 3}), "wrong_type"),
    (None, "missing_field"),
])
def test_bad_documents_are_rejected_with_their_reason(raw, reason):
    out = parse_document(raw)
    assert isinstance(out, Rejected) and out.reason == reason and out.detail


def test_size_limits():
    limits = Limits(max_message_bytes=100, max_text_chars=10)
    assert parse_document(enc({"id": "a", "text": "x" * 200}), limits).reason == "oversize"
    assert parse_document(enc({"id": "a", "text": "x" * 20}), limits).reason == "oversize"
    assert isinstance(parse_document(enc({"id": "a", "text": "x" * 10}), limits), Document)


def test_control_messages():
    m = parse_control(enc({"op": "label", "id": "d1", "labels": ["grain", "wheat", "grain"]}))
    assert isinstance(m, ControlMessage) and m.labels == ("grain", "wheat")
    assert parse_control(enc({"op": "unlabel", "id": "d1"})).op == "unlabel"
    assert parse_control(enc({"op": "refit"})).op == "refit"
    r = parse_control(enc({"op": "label", "id": "d", "labels": ["a"], "text": "t", "origin": "resolved", "label_offset": 4}))
    assert r.text == "t" and r.origin == "resolved" and r.label_offset == 4


@pytest.mark.parametrize(("obj", "reason"), [
    ({"op": "drop"}, "unknown_op"),
    ({"id": "x"}, "missing_field"),
    ({"op": 3}, "wrong_type"),
    ({"op": "label", "id": "x"}, "missing_field"),
    ({"op": "label", "id": "x", "labels": "a"}, "wrong_type"),
    ({"op": "label", "id": "x", "labels": []}, "invalid_label"),
    ({"op": "label", "id": "x", "labels": [1]}, "wrong_type"),
    ({"op": "label", "id": "x", "labels": ["x" * 65]}, "invalid_label"),
    ({"op": "label", "id": "x", "labels": ["new-3"]}, "invalid_label"),
    ({"op": "label", "id": "x", "labels": ["a\u0000b"]}, "invalid_label"),
    ({"op": "label", "id": "x", "labels": [f"l{i}" for i in range(21)]}, "invalid_label"),
    ({"op": "label", "id": "x", "labels": ["a"], "text": ""}, "empty_text"),
    ({"op": "label", "id": "x", "labels": ["a"], "label_offset": "3"}, "wrong_type"),
    ({"op": "unlabel"}, "missing_field"),
])
def test_bad_control_messages(obj, reason):
    out = parse_control(enc(obj))
    assert isinstance(out, Rejected) and out.reason == reason, out


def test_dead_letter_keeps_original_bytes_and_position():
    d = dead_letter(b"\xff\x00", "invalid_utf8", "bad", "topic", 2, 17, key=b"k")
    assert d["encoding"] == "base64" and base64.b64decode(d["original"]) == b"\xff\x00"
    assert (d["topic"], d["partition"], d["offset"], d["reason"]) == ("topic", 2, 17, "invalid_utf8")
    jsonschema.validate(d, schema("deadletter"))
    t = dead_letter(b'{"a": 1}', "missing_field", "x", "t", 0, 1)
    assert t["original"] == '{"a": 1}' and t["encoding"] == "utf-8"
    assert set(schema("deadletter")["properties"]["reason"]["enum"]) == set(REASONS)


def test_parser_and_schemas_agree_on_examples():
    doc_schema, ctl_schema = schema("document"), schema("control")
    good_docs = [{"id": "a", "text": "t"}, {"id": "a", "text": "t", "ts": 3, "stream": "s", "meta": {}}]
    bad_docs = [{"id": "a"}, {"id": 1, "text": "t"}, {"id": "a", "text": "  "}]
    for obj in good_docs:
        jsonschema.validate(obj, doc_schema)
        assert isinstance(parse_document(enc(obj)), Document)
    for obj in bad_docs:
        assert not jsonschema.Draft202012Validator(doc_schema).is_valid(obj)
        assert isinstance(parse_document(enc(obj)), Rejected)
    good_ctl = [{"op": "label", "id": "a", "labels": ["money-fx"]}, {"op": "unlabel", "id": "a"}, {"op": "refit"}]
    bad_ctl = [{"op": "label", "id": "a", "labels": ["new-1"]}, {"op": "label", "id": "a", "labels": []}, {"op": "x"}]
    for obj in good_ctl:
        jsonschema.validate(obj, ctl_schema)
        assert isinstance(parse_control(enc(obj)), ControlMessage)
    for obj in bad_ctl:
        assert not jsonschema.Draft202012Validator(ctl_schema).is_valid(obj)
        assert isinstance(parse_control(enc(obj)), Rejected)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=30),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_parsers_never_raise_on_arbitrary_bytes(raw):
    for parse in (parse_document, parse_control):
        out = parse(raw)
        assert isinstance(out, (Document, ControlMessage, Rejected))
        if isinstance(out, Rejected):
            assert out.reason in REASONS


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["id", "text", "ts", "meta", "stream", "op", "labels", "origin", "label_offset"]),
                       json_values, max_size=6))
def test_parsers_never_raise_on_arbitrary_json_objects(obj):
    raw = json.dumps(obj).encode()
    doc = parse_document(raw)
    if isinstance(doc, Document):
        assert isinstance(obj["id"], str) and isinstance(obj["text"], str) and obj["text"].strip()
    else:
        assert doc.reason in REASONS
    ctl = parse_control(raw)
    if isinstance(ctl, ControlMessage):
        assert obj["op"] in ("label", "unlabel", "refit")
    else:
        assert ctl.reason in REASONS
