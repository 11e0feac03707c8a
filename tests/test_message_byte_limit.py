"""The byte-size limit of messages on its own (the text-length limit set far above it).

Documents and control messages arrive as bytes from Kafka: ``max_message_bytes`` counts
bytes, so a text of multi-byte characters is rejected for its bytes even though it is well
under ``max_text_chars``, and a message one byte under (or at) the limit passes.
"""

from __future__ import annotations

import json

import pytest

from streamsemi.core.messages import (
    ControlMessage,
    Document,
    Limits,
    Rejected,
    parse_control,
    parse_document,
)

LIMIT = 120
LIMITS = Limits(max_message_bytes=LIMIT, max_text_chars=100_000)


def sized(template: dict, field: str, n_bytes: int, char: str = "x") -> bytes:
    """``template`` with ``field`` padded so that the UTF-8 message has exactly ``n_bytes`` bytes."""
    empty = json.dumps({**template, field: ""}, ensure_ascii=False).encode()
    width = len(char.encode())
    room = n_bytes - len(empty)
    assert room >= 0 and room % width == 0, "choose sizes the padding character can fill"
    raw = json.dumps({**template, field: char * (room // width)}, ensure_ascii=False).encode()
    assert len(raw) == n_bytes
    return raw


@pytest.mark.parametrize("size", [LIMIT - 1, LIMIT])
def test_document_at_or_under_the_byte_limit_passes(size) -> None:
    doc = parse_document(sized({"id": "a", "text": ""}, "text", size), LIMITS)
    assert isinstance(doc, Document) and doc.id == "a"
    assert len(json.dumps({"id": "a", "text": doc.text}).encode()) == size


def test_document_one_byte_over_the_limit_is_rejected_for_its_bytes() -> None:
    raw = sized({"id": "a", "text": ""}, "text", LIMIT + 1)
    out = parse_document(raw, LIMITS)
    assert out == Rejected("oversize", f"message of {LIMIT + 1} bytes exceeds max_message_bytes={LIMIT}")


def test_multibyte_text_is_measured_in_bytes_not_characters() -> None:
    # 3-byte characters: the whole message is 2 bytes over the limit with far fewer characters
    raw = sized({"id": "a", "text": ""}, "text", LIMIT + 2, char="€")
    assert len(raw.decode()) < LIMIT
    out = parse_document(raw, LIMITS)
    assert isinstance(out, Rejected) and out.reason == "oversize"
    assert f"{LIMIT + 2} bytes exceeds max_message_bytes={LIMIT}" in out.detail
    ok = sized({"id": "a", "text": ""}, "text", LIMIT - 1, char="€")
    assert isinstance(parse_document(ok, LIMITS), Document)


def test_control_message_byte_limit() -> None:
    template = {"op": "label", "id": "d1", "labels": ["grain"], "text": ""}
    ok = parse_control(sized(template, "text", LIMIT), LIMITS)
    assert isinstance(ok, ControlMessage) and ok.labels == ("grain",)
    out = parse_control(sized(template, "text", LIMIT + 1), LIMITS)
    assert out == Rejected("oversize", f"message of {LIMIT + 1} bytes exceeds max_message_bytes={LIMIT}")
