"""Message limits at their exact edges and strict JSON output.

Written against survivors of the mutation run on ``streamsemi/core/messages.py``
(benchmarks/results/mutation.md): the label-count bound, the ``ts`` range bounds and
the output encoder's strict, compact JSON were not checked at their edges.
"""

from __future__ import annotations

import base64
import json
import math
import time

import numpy as np
import pytest

from streamsemi.core.messages import (
    DEAD_LETTER_DETAIL_CHARS,
    DEAD_LETTER_ORIGINAL_BYTES,
    JSON_MAX_DEPTH,
    JSON_MAX_ITEMS,
    TS_MAX,
    TS_MIN,
    ControlMessage,
    Document,
    Limits,
    Rejected,
    dead_letter,
    encode_json,
    encode_key,
    parse_control,
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


# ---------------------------------------------------------------- dead letters: cutting and truncation
ORIG = DEAD_LETTER_ORIGINAL_BYTES


def test_dead_letter_keeps_a_record_of_exactly_the_limit_whole() -> None:
    d = dead_letter(b"a" * ORIG, "oversize", "x")
    assert d["original"] == "a" * ORIG and d["encoding"] == "utf-8"
    assert "truncated" not in d and "original_bytes" not in d


def test_dead_letter_cuts_one_byte_over_the_limit() -> None:
    d = dead_letter(b"a" * (ORIG + 1), "oversize", "x")
    assert d["original"] == "a" * ORIG and d["encoding"] == "utf-8"
    assert d["truncated"] is True and d["original_bytes"] == ORIG + 1


@pytest.mark.parametrize(("char", "kept"), [(c, k) for c in ("\u00e9", "\u20ac", "\U0001f600")  # 2, 3, 4 bytes
                                            for k in range(1, len(c.encode()))])
def test_a_cut_inside_a_multibyte_character_moves_before_it(char, kept) -> None:
    head = ORIG - kept  # the limit falls after ``kept`` bytes of the character
    raw = b"a" * head + char.encode() + b"tail"
    d = dead_letter(raw, "oversize", "x")
    assert d["encoding"] == "utf-8" and d["original"] == "a" * head
    assert d["truncated"] is True and d["original_bytes"] == len(raw)


def test_a_character_ending_exactly_at_the_limit_is_kept() -> None:
    raw = b"a" * (ORIG - 4) + "\U0001f600".encode() + b"tail"
    d = dead_letter(raw, "oversize", "x")
    assert d["original"] == "a" * (ORIG - 4) + "\U0001f600" and d["truncated"] is True


@pytest.mark.parametrize("raw", [
    b"a" * (ORIG - 1) + b"\xff" + b"tail",        # an invalid byte (not a cut character) just before the cut
    b"a" * (ORIG - 5) + b"\xf0\x9f" + b"a" * 10,  # a broken character 5 bytes before the cut: not the cut's fault
    b"\xff" + b"a" * ORIG,                         # invalid at the start of a long record
])
def test_invalid_utf8_in_a_truncated_record_is_base64(raw) -> None:
    d = dead_letter(raw, "invalid_utf8", "x")
    assert d["encoding"] == "base64" and base64.b64decode(d["original"]) == raw[:ORIG]
    assert d["truncated"] is True and d["original_bytes"] == len(raw)


def test_a_short_record_ending_inside_a_character_is_base64_not_cut() -> None:
    raw = b"abc" + "\u20ac".encode()[:2]  # nothing was cut: the record itself is broken
    d = dead_letter(raw, "invalid_utf8", "x")
    assert d["encoding"] == "base64" and base64.b64decode(d["original"]) == raw and "truncated" not in d


def test_dead_letter_detail_is_cut_and_fields_are_strings() -> None:
    d = dead_letter(b"x", 5, "d" * (DEAD_LETTER_DETAIL_CHARS + 1), "t", 3, 9)
    assert d["detail"] == "d" * DEAD_LETTER_DETAIL_CHARS and d["reason"] == "5"
    assert dead_letter(b"x", "r", 12)["detail"] == "12"
    assert (d["topic"], d["partition"], d["offset"]) == ("t", 3, 9) and "key" not in d
    assert isinstance(d["ts"], float) and abs(d["ts"] - time.time()) < 60
    none = dead_letter(None, "missing_field", "no value")
    assert none["original"] is None and none["encoding"] is None and "truncated" not in none


@pytest.mark.parametrize(("key", "expected"), [
    (b"k\xff", b"k\xff"),
    ("caf\u00e9", "caf\u00e9".encode()),
    ("k\udc00", "k\udc00".encode("utf-8", "surrogatepass")),
    (bytearray(b"ab"), b"ab"),
    (memoryview(b"cd"), b"cd"),
    (b"k" * (ORIG + 7), b"k" * ORIG),
])
def test_dead_letter_key_is_base64_of_its_bytes_cut_to_the_limit(key, expected) -> None:
    assert base64.b64decode(dead_letter(b"x", "r", "d", key=key)["key"]) == expected


@pytest.mark.parametrize(("raw", "expected"), [
    ("caf\u00e9", "caf\u00e9"),
    (bytearray(b"abc"), "abc"),
    (memoryview(b"abc"), "abc"),
])
def test_dead_letter_of_text_and_buffer_values(raw, expected) -> None:
    d = dead_letter(raw, "r", "d")
    assert d["original"] == expected and d["encoding"] == "utf-8"


class _Odd:
    def __repr__(self) -> str:
        return "odd-\ud800"  # a repr holding a lone surrogate


def test_dead_letter_of_a_value_without_bytes_keeps_its_repr() -> None:
    d = dead_letter(_Odd(), "processing_error", "d", key=_Odd())
    assert d["original"] == "odd-\\ud800" and d["encoding"] == "utf-8"
    assert base64.b64decode(d["key"]) == b"odd-\\ud800"
    assert dead_letter(1.5, "r", "d")["original"] == "1.5"
    assert dead_letter(-1, "r", "d")["original"] == "-1"  # bytes(-1) is a ValueError
    json.loads(encode_json(d))


# ---------------------------------------------------------------- the fallback JSON encoder
def _fallback(obj) -> object:
    """``obj`` through encode_json with a lone surrogate beside it, which forces the fallback path
    (orjson and json.dumps refuse it; a NaN only made json.dumps refuse)."""
    out = _strict(encode_json([obj, "\udfff"]))
    assert out[1] == "\ufffd"
    return out[0]


_OBJ = object()


@pytest.mark.parametrize(("bad", "safe"), [
    (_OBJ, str(_OBJ)),    # TypeError in json.dumps
    ({"a"}, ["a"]),       # TypeError
    (math.nan, None),     # ValueError (allow_nan=False)
    ("x\ud800", "x\ufffd"),  # UnicodeEncodeError (a ValueError) when encoding to UTF-8
    (_Odd(), "odd-\ufffd"),  # TypeError; its str form holds a lone surrogate
], ids=["object", "set", "nan", "lone-surrogate", "odd-str"])
def test_each_kind_of_refused_value_takes_the_fallback_alone(bad, safe) -> None:
    assert _strict(encode_json({"v": bad, "w": "\u00e9"})) == {"v": safe, "w": "\u00e9"}


def test_cycles_and_deep_nesting_alone_take_the_fallback() -> None:
    cyclic: dict = {}
    cyclic["self"] = cyclic
    assert _strict(encode_json(cyclic)) == {"self": "<cycle>"}  # ValueError in json.dumps
    deep: list = ["leaf"]
    for _ in range(5000):
        deep = [deep]
    assert _depth(_strict(encode_json(deep))) == (JSON_MAX_DEPTH, "<nested too deeply>")  # RecursionError


def test_fallback_output_is_compact_utf8() -> None:
    assert encode_json({"k": ["\u00e9", 1], "n": math.nan}) == '{"k":["\u00e9",1],"n":null}'.encode()


def test_fallback_keeps_shared_values_that_are_not_cycles() -> None:
    shared = [1, {"a": 2}]
    assert _fallback({"x": shared, "y": shared, "z": (shared,)}) == {"x": [1, {"a": 2}], "y": [1, {"a": 2}],
                                                                   "z": [[1, {"a": 2}]]}


def test_fallback_converts_values() -> None:
    class BadStr:
        def __str__(self) -> str:
            raise RuntimeError("no text")

    class BadToList:
        def tolist(self):
            raise RuntimeError("no list")

        def __str__(self) -> str:
            return "bad-tolist"

    class NotCallable:
        tolist = 3

        def __str__(self) -> str:
            return "not-callable"

    out = _fallback({"b": b"a\xffb", "ba": bytearray(b"xy"), "t": (1, 2.5), "s": {"one"}, "f": frozenset({2}),
                     "inf": -math.inf, "np": np.float32(0.5), "arr": np.array([[1, 2], [3, 4]]), "bool": True,
                     "none": None, "bs": BadStr(), "btl": BadToList(), "nc": NotCallable(), 3: "int", None: "none",
                     ("a", 1): "tuple", "\udfff": "sur", "big": 10**30})
    assert out == {"b": "a\ufffdb", "ba": "xy", "t": [1, 2.5], "s": ["one"], "f": [2], "inf": None, "np": 0.5,
                   "arr": [[1, 2], [3, 4]], "bool": True, "none": None, "bs": "<BadStr>", "btl": "bad-tolist",
                   "nc": "not-callable", "3": "int", "None": "none", "('a', 1)": "tuple", "\ufffd": "sur",
                   "big": 10**30}


def _depth(value) -> tuple[int, object]:
    """Levels of lists around the innermost value."""
    n = 0
    while isinstance(value, list):
        value, n = value[0], n + 1
    return n, value


def test_fallback_expands_containers_down_to_the_depth_limit() -> None:
    deep: list = ["leaf"]
    for _ in range(JSON_MAX_DEPTH + 10):
        deep = [deep]
    assert _depth(_fallback(deep)) == (JSON_MAX_DEPTH - 1, "<nested too deeply>")  # [deep, surrogate] is one level
    scalar: object = 7
    for _ in range(JSON_MAX_DEPTH - 1):
        scalar = [scalar]
    assert _depth(_fallback(scalar)) == (JSON_MAX_DEPTH - 1, 7), "a scalar below the last container is kept"
    arr: object = np.array([5])
    for _ in range(JSON_MAX_DEPTH - 2):
        arr = [arr]
    assert _depth(_fallback(arr)) == (JSON_MAX_DEPTH - 1, 5), "an array counts as the container it becomes"
    nested: object = "leaf"
    for _ in range(JSON_MAX_DEPTH + 10):
        nested = {"k": nested}
    levels, out = 0, _fallback(nested)
    while isinstance(out, dict):
        out, levels = out["k"], levels + 1
    assert (levels, out) == (JSON_MAX_DEPTH - 1, "<nested too deeply>"), "a dict's values are one level down"


def test_fallback_replaces_values_past_the_item_budget() -> None:
    values = ["\udfff"] + [math.nan] * (JSON_MAX_ITEMS - 1)  # the list itself is the first value
    out = _strict(encode_json(values))  # (the lone surrogate makes orjson and json.dumps refuse it)
    assert len(out) == JSON_MAX_ITEMS and out[0] == "\ufffd" and out[-2] is None and out[-1] == "<truncated>"
    assert out.count("<truncated>") == 1


# ---------------------------------------------------------------- record keys
@pytest.mark.parametrize(("doc_id", "key"), [
    ("d-1", b"d-1"), ("caf\u00e9", "caf\u00e9".encode()), ("x\ud800y", "x\ufffdy".encode()),
    (b"\xffraw", b"\xffraw"), (42, b"42"), (None, b"None"), (1.5, b"1.5"),
])
def test_encode_key_of_any_id(doc_id, key) -> None:
    assert encode_key(doc_id) == key


# ---------------------------------------------------------------- every rejection: reason and exact detail
LONG = "z" * 100
LIMITS = Limits(max_message_bytes=200, max_text_chars=10, max_id_chars=5, max_labels_per_doc=2)
SURROGATE_TAIL = ("holds a lone UTF-16 surrogate (an unpaired \\uD800-\\uDFFF escape): it is not Unicode text and "
                  "cannot be encoded as UTF-8")
TS_TEXT = "'ts' must be ISO-8601 text or epoch seconds"


def _doc(**fields) -> str:
    return json.dumps({"id": "a", "text": "words", **fields})


def _label(**fields) -> str:
    return json.dumps({"op": "label", "id": "a", "labels": ["x"], **fields})


@pytest.mark.parametrize(("raw", "reason", "detail"), [
    (None, "missing_field", "message has no value"),
    (b"x" * 201, "oversize", "message of 201 bytes exceeds max_message_bytes=200"),
    ("x" * 201, "oversize", "message of 201 characters exceeds max_message_bytes=200"),
    (b'{"id": "\xff"}', "invalid_utf8", "value is not UTF-8: invalid start byte at byte 8"),
    (b" \n\t ", "invalid_json", "empty message"),
    ("{", "invalid_json", "not valid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
    ("[1]", "wrong_type", "message must be a JSON object, got list"),
    ('"s"', "wrong_type", "message must be a JSON object, got str"),
    (json.dumps({"text": "t"}), "missing_field", "'id' is required"),
    (json.dumps({"id": 1.5, "text": "t"}), "wrong_type", "'id' must be a string, got float"),
    (json.dumps({"id": "", "text": "t"}), "wrong_type", "'id' must have 1..5 characters"),
    (json.dumps({"id": "abcdef", "text": "t"}), "wrong_type", "'id' must have 1..5 characters"),
    (json.dumps({"id": "a"}), "missing_field", "'text' is required"),
    (json.dumps({"id": "a", "text": ["t"]}), "wrong_type", "'text' must be a string, got list"),
    (json.dumps({"id": "a", "text": " \t"}), "empty_text", "'text' is empty"),
    (json.dumps({"id": "a", "text": "x" * 11}), "oversize", "'text' has 11 characters, max_text_chars=10"),
    (_doc(ts=True), "wrong_type", TS_TEXT),
    (_doc(ts=[1]), "wrong_type", TS_TEXT),
    ('{"id": "a", "text": "words", "ts": Infinity}', "wrong_type", "'ts' must be finite"),
    (_doc(ts=1e300), "wrong_type", "'ts' must be epoch seconds between -62135596800 and 253402300799 (years 1..9999)"),
    (_doc(ts=LONG), "wrong_type", f"'ts' is not an ISO-8601 time of years 1..9999: {'z' * 40!r}"),
    (_doc(ts="0001-01-01T00:00:00+01:00"), "wrong_type",
     "'ts' is outside years 1..9999: '0001-01-01T00:00:00+01:00'"),
    (_doc(ts="0001-01-01T00:00:00.000000+01:00:00.000000"), "wrong_type",
     "'ts' is outside years 1..9999: '0001-01-01T00:00:00.000000+01:00:00.0000'"),
    (_doc(stream=1), "wrong_type", "'stream' must be a string"),
    (_doc(meta="m"), "wrong_type", "'meta' must be an object"),
    (_doc(**{"k" * 70: "\ud800"}), "invalid_utf8", f"field {ascii('k' * 70)[:60]} {SURROGATE_TAIL}"),
])
def test_document_rejections_have_their_exact_detail(raw, reason, detail) -> None:
    assert parse_document(raw, LIMITS) == Rejected(reason, detail)


@pytest.mark.parametrize(("raw", "reason", "detail"), [
    (json.dumps({"id": "a"}), "missing_field", "'op' is required"),
    (json.dumps({"op": ["label"]}), "wrong_type", "'op' must be a string"),
    (json.dumps({"op": LONG}), "unknown_op", f"unknown op {'z' * 40!r}; expected label, unlabel, refit or name"),
    (json.dumps({"op": "unlabel"}), "missing_field", "'id' is required"),
    (json.dumps({"op": "label", "id": "a"}), "missing_field", "'labels' is required for op 'label'"),
    (_label(labels="x"), "wrong_type", "'labels' must be a list of strings"),
    (_label(labels=[]), "invalid_label", "'labels' is empty (use op 'unlabel' to remove labels)"),
    (_label(labels=["a", "b", "c"]), "invalid_label", "3 labels, max_labels_per_doc=2"),
    (_label(labels=["a", 1]), "wrong_type", "every label must be a string"),
    (_label(labels=[LONG]), "invalid_label", f"'labels': label {'z' * 80!r} must have at most 64 characters, got 100"),
    (_label(labels=["new-1"]), "invalid_label",
     "'labels': label 'new-1' must not start with 'new-' (reserved for discovered clusters)"),
    (_label(text=3), "wrong_type", "'text' must be a string"),
    (_label(text="  "), "empty_text", "'text' is empty"),
    (_label(text="x" * 11), "oversize", "'text' has 11 characters, max_text_chars=10"),
    (_label(origin=5), "wrong_type", "'origin' must be a string"),
    (_label(label_offset=-1), "wrong_type", "'label_offset' must be a Kafka offset (an integer 0..2**63-1)"),
    (_label(label_offset=True), "wrong_type", "'label_offset' must be a Kafka offset (an integer 0..2**63-1)"),
])
def test_control_rejections_have_their_exact_detail(raw, reason, detail) -> None:
    assert parse_control(raw, LIMITS) == Rejected(reason, detail)


def test_limits_are_inclusive_for_ids_texts_and_str_messages() -> None:
    assert parse_document(json.dumps({"id": "abcde", "text": "x" * 10}), LIMITS).id == "abcde"
    assert parse_control(_label(text="x" * 10), LIMITS).text == "x" * 10
    at_limit = json.dumps({"id": "a", "text": "t", "meta": {"k": ""}})
    at_limit = at_limit.replace('""', '"' + "y" * (200 - len(at_limit)) + '"')
    assert len(at_limit) == 200 and isinstance(parse_document(at_limit, LIMITS), Document)


def test_parsed_messages_keep_every_field() -> None:
    d = parse_document(_doc(ts="2020-01-01Z", stream="s1", meta={"k": [1]}))
    assert (d.id, d.text, d.ts, d.stream, d.meta) == ("a", "words", 1577836800.0, "s1", {"k": [1]})
    assert parse_control(_label(labels=["x", "y", "x"], text="the text", origin="resolved", label_offset=0)) == \
        ControlMessage(op="label", id="a", labels=("x", "y"), text="the text", origin="resolved", label_offset=0)
    assert parse_control(_label()) == ControlMessage(op="label", id="a", labels=("x",))
    assert parse_control(json.dumps({"op": "unlabel", "id": "b"})) == ControlMessage(op="unlabel", id="b")
    assert parse_control(json.dumps({"op": "refit", "id": "ignored"})) == ControlMessage(op="refit")


@pytest.mark.parametrize(("text", "ts"), [
    ("0001-01-01T00:00:00+00:00", TS_MIN), ("9999-12-31T23:59:59+00:00", TS_MAX),
    ("9999-12-31T23:59:59Z", TS_MAX), ("2020-01-01Z", 1577836800.0),
])
def test_iso_ts_range_is_inclusive_and_z_means_utc(text, ts) -> None:
    assert parse_document(_doc(ts=text)).ts == ts


def test_a_custom_label_pattern_is_used() -> None:
    limits = Limits(label_pattern=r"^[a-z]{2}$")
    assert validate_labels(["ab", "cd"], limits) == ("ab", "cd")
    assert validate_labels(["abc"], limits) == Rejected(
        "invalid_label", "'labels': label 'abc' must match ^[a-z]{2}$")
    assert limits.label_regex().pattern == r"^[a-z]{2}$"


def test_fast_path_keys_are_json_dumps_keys() -> None:
    # the fallback would name these keys "True"/"None"/"1.5": the fast path must be the one taken
    assert encode_json({True: 1, None: 2, 1.5: 3}) == b'{"true":1,"null":2,"1.5":3}'
