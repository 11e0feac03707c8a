"""Message parsing: every bad input is rejected with a reason, never an exception."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamsemi.core.messages import (
    DEAD_LETTER_ORIGINAL_BYTES,
    REASONS,
    ControlMessage,
    Document,
    Limits,
    Rejected,
    dead_letter,
    encode_json,
    encode_key,
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
        assert obj["op"] in ("label", "unlabel", "refit", "name")
    else:
        assert ctl.reason in REASONS


# ---------------------------------------------------------------- poison pills
@pytest.mark.parametrize("ts", [
    10**400, -(10**400), 10**20, 1e300, -1e300,         # OverflowError in float() / outside datetime's years
    "0001-01-01", "0001-01-01T00:00:00",                # ValueError from timestamp() (local time before year 1)
    "9999-12-31T23:59:59-23:59",                        # OverflowError from timestamp()
])
def test_timestamps_outside_years_1_to_9999_are_rejected_not_raised(ts):
    raw = json.dumps({"id": "a", "text": "hello world", "ts": ts}).encode()
    out = parse_document(raw)
    assert isinstance(out, Rejected) and out.reason == "wrong_type" and "'ts'" in out.detail


def test_timestamps_at_the_edges_of_the_range_parse():
    assert parse_document(enc({"id": "a", "text": "t", "ts": -62135596800})).ts == -62135596800.0
    assert parse_document(enc({"id": "a", "text": "t", "ts": 253402300799})).ts == 253402300799.0
    assert parse_document(enc({"id": "a", "text": "t", "ts": "9999-12-31T00:00:00Z"})).ts == 253402214400.0
    assert parse_document(enc({"id": "a", "text": "t", "ts": "0001-01-02T00:00:00+00:00"})).ts == -62135510400.0


LONE = ["\ud800", "\udfff", "x-\ud800", "\ud83d", "a\udc00b"]


@pytest.mark.parametrize("bad", LONE)
@pytest.mark.parametrize("field", ["id", "text", "stream", "meta"])
def test_lone_surrogates_in_documents_are_rejected_as_invalid_utf8(field, bad):
    obj = {"id": "a", "text": "hello world", field: {"k": [bad]} if field == "meta" else bad}
    raw = json.dumps(obj).encode()  # ensure_ascii: the surrogate travels as a \\uXXXX escape, valid UTF-8 bytes
    assert b"\\ud" in raw
    out = parse_document(raw)
    assert isinstance(out, Rejected) and out.reason == "invalid_utf8" and repr(field) in out.detail, out


@pytest.mark.parametrize("obj", [
    {"op": "label", "id": "x-\ud800", "labels": ["a"]},
    {"op": "label", "id": "x", "labels": ["\ud800"]},
    {"op": "label", "id": "x", "labels": ["a"], "text": "\ud83d"},
    {"op": "label", "id": "x", "labels": ["a"], "origin": "\udfff"},
    {"op": "unlabel", "id": "\ud800"},
    {"op": "label", "id": "x", "labels": ["a"], "\ud800": 1},
])
def test_lone_surrogates_in_control_messages_are_rejected(obj):
    out = parse_control(json.dumps(obj).encode())
    assert isinstance(out, Rejected) and out.reason == "invalid_utf8", out
    assert isinstance(parse_control(json.dumps(obj)), Rejected), "a str value is checked too"


def test_upper_case_surrogate_escapes_and_raw_surrogates_in_a_str_are_rejected():
    upper = b'{"id": "a", "text": "x\\uD800y"}'
    out = parse_document(upper)
    assert isinstance(out, Rejected) and out.reason == "invalid_utf8" and "'text'" in out.detail
    raw_str = '{"id": "a", "text": "x\ud800y"}'  # an actual lone surrogate character in a str (no escape)
    assert "\\u" not in raw_str
    out = parse_document(raw_str)
    assert isinstance(out, Rejected) and out.reason == "invalid_utf8" and "'text'" in out.detail
    assert isinstance(parse_document(b'{"id": "a", "text": "a backslash \\\\ud800 is text"}'), Document)


def test_surrogate_pairs_are_text_not_errors():
    d = parse_document(json.dumps({"id": "\U0001f600", "text": "smile \U0001f600 please"}).encode())  # escaped as a pair
    assert isinstance(d, Document) and d.id == "\U0001f600" and encode_key(d.id) == "\U0001f600".encode()


@pytest.mark.parametrize("label_offset", [-1, 2**63, 10**400])
def test_label_offset_must_be_a_kafka_offset(label_offset):
    raw = json.dumps({"op": "label", "id": "x", "labels": ["a"], "label_offset": label_offset}).encode()
    assert parse_control(raw).reason == "wrong_type"
    ok = json.dumps({"op": "label", "id": "x", "labels": ["a"], "label_offset": 2**63 - 1}).encode()
    assert parse_control(ok).label_offset == 2**63 - 1


# ---------------------------------------------------------------- encoders are total
def test_encode_json_never_raises_and_always_gives_valid_utf8_json():
    cyclic: list = []
    cyclic.append(cyclic)
    deep: list = []
    node = deep
    for _ in range(5000):
        node.append([])
        node = node[0]
    obj = {"id": "x-\ud800", "labels": ["\udfff"], "nan": float("nan"), "inf": float("-inf"),
           "np": np.float32(0.5), "arr": np.arange(3), "obj": object(), "cycle": cyclic, "deep": deep,
           "bytes": b"\xff\x00", 7: "int key", "\ud800": "surrogate key"}
    out = encode_json(obj)
    back = json.loads(out.decode("utf-8"))  # strict UTF-8 and standard JSON (no NaN)
    assert back["id"] == "x-\ufffd" and back["labels"] == ["\ufffd"] and back["nan"] is None and back["inf"] is None
    assert back["np"] == 0.5 and back["arr"] == [0, 1, 2] and back["cycle"] == ["<cycle>"]
    assert back["7"] == "int key" and back["\ufffd"] == "surrogate key"
    assert encode_json({"a": "b"}) == b'{"a":"b"}'
    assert encode_key("x-\ud800") == "x-\ufffd".encode() and encode_key("caf\u00e9") == "caf\u00e9".encode()


def test_dead_letter_of_surrogate_text_and_keys_is_encodable():
    d = dead_letter("x\ud800", "invalid_utf8", "detail \ud800", "t", 0, 1, key="k\udc00")
    back = json.loads(encode_json(d))
    assert back["encoding"] == "base64" and base64.b64decode(back["original"]) == "x\ud800".encode("utf-8", "surrogatepass")
    assert back["key"] and back["detail"] == "detail \ufffd"
    jsonschema.validate(back, schema("deadletter"))


@pytest.mark.parametrize(("raw", "encoding"), [
    (b"\x01" * 900_000, "utf-8"),                 # every byte needs a 6-byte JSON escape
    (b"\xff" * 900_000, "base64"),
    ("\u00e9".encode() * 40_000, "utf-8"),        # a cut inside a 2-byte character is moved before it
])
def test_dead_letter_of_a_huge_record_is_truncated_to_fit_one_produce_request(raw, encoding):
    d = dead_letter(raw, "no_terms", "x", "t", 0, 1)
    assert d["truncated"] is True and d["original_bytes"] == len(raw) and d["encoding"] == encoding
    kept = d["original"].encode() if encoding == "utf-8" else base64.b64decode(d["original"])
    assert raw.startswith(kept) and len(raw) - DEAD_LETTER_ORIGINAL_BYTES <= len(raw) - len(kept) <= len(raw)
    assert len(kept) >= DEAD_LETTER_ORIGINAL_BYTES - 1
    assert len(encode_json(d)) < 1_000_000, "kafka-python's default max_request_size is 1 MiB"
    small = dead_letter(b"abc", "no_terms", "x")
    assert "truncated" not in small and small["original"] == "abc"


def test_cluster_event_key_and_resolved_seed_op_carry_the_stream_only_when_there_is_one():
    from types import SimpleNamespace

    from streamsemi.core.messages import cluster_event_key, resolved_seed_op

    assert cluster_event_key({"algorithm": "cle", "cluster": "new-3"}) == b"cle/new-3"
    assert cluster_event_key({"algorithm": "cle", "cluster": "new-3", "stream": None}) == b"cle/new-3"
    assert cluster_event_key({"algorithm": "cle", "cluster": "acq", "stream": "news"}) == b"news/cle/acq"
    seed = SimpleNamespace(id="d1", labels=("acq",), text="t", origin="resolved", label_offset=7, stream=None)
    assert resolved_seed_op(seed) == {"op": "label", "id": "d1", "labels": ["acq"], "text": "t",
                                      "origin": "resolved", "label_offset": 7}
    seed.stream = "news"
    assert resolved_seed_op(seed)["stream"] == "news"
    seed.label_offset = None
    assert resolved_seed_op(seed) is None, "a seed without its label's offset is not re-emitted"


_JSON_SCALARS = (st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**63 - 1)
                 | st.floats(allow_nan=False, allow_infinity=False) | st.text(st.characters(exclude_categories=("Cs",))))


@settings(max_examples=300, deadline=None)
@given(st.recursive(_JSON_SCALARS, lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(st.characters(exclude_categories=("Cs",)), max_size=8), inner, max_size=4),
                    max_leaves=20))
def test_encode_json_fast_path_parses_to_what_json_dumps_gives(obj):
    """orjson (the fast path) and json.dumps (the former encoder) spell some floats differently
    (0.00001 against 1e-05), but every value parses back the same, as compact UTF-8."""
    out = encode_json(obj)
    assert json.loads(out.decode("utf-8")) == json.loads(json.dumps(obj, ensure_ascii=False))


def test_encode_json_takes_the_former_path_for_what_orjson_refuses():
    """numpy scalars, int keys and integers beyond 64 bits: orjson refuses them, json.dumps gives what it always gave."""
    obj = {"np": np.float64(0.25), 7: "k", "big": 10**30, "f": 1e-05}
    assert encode_json(obj) == b'{"np":0.25,"7":"k","big":1000000000000000000000000000000,"f":1e-05}'
    assert encode_json({"f": 1e-05, "n": float("nan"), "e": "\u00e9"}) == '{"f":0.00001,"n":null,"e":"\u00e9"}'.encode()


def test_encoded_json_holds_no_more_memory_than_its_length() -> None:
    """orjson writes into a 4 KiB buffer its bytes keep: encode_json copies, so a kept output holds its length only
    (the ledger's byte bound counts ``len(value)``; 20,000 unacknowledged outputs would hold 80 MB uncounted)."""
    import tracemalloc

    msgs = [{"id": f"d{i}", "labels": {"grain": 0.5, "wheat": 0.25}, "ts": 12.5} for i in range(2000)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = [encode_json(m) for m in msgs]
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept[0] == b'{"id":"d0","labels":{"grain":0.5,"wheat":0.25},"ts":12.5}'
    assert held <= sum(len(k) + 64 for k in kept), f"{held / len(kept):.0f} bytes held per message"
