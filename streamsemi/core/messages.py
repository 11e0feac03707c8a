"""Wire formats: parsing documents and control messages, building outputs and dead letters.

Parsing never raises on bad input: it returns either a parsed message or a
:class:`Rejected` with a machine-readable reason (a dead-letter metric label) and a
human-readable detail. The JSON Schemas in ``docs/schemas/`` describe the same
formats.
"""

from __future__ import annotations

import base64
import json
import math
import re
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

REASONS = (
    "invalid_json", "invalid_utf8", "missing_field", "wrong_type", "empty_text", "oversize",
    "no_terms", "unknown_op", "invalid_label", "label_expired", "pending_overflow",
)

DEFAULT_LABEL_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_ .:/&+-]{0,63}$"


@dataclass
class Document:
    """A document to classify."""

    id: str
    text: str
    ts: float | None = None
    stream: str | None = None
    meta: dict | None = None
    arrival: float = field(default_factory=time.time)
    source: Any = None  # (topic, partition, offset) when read from Kafka


@dataclass
class ControlMessage:
    """``label`` / ``unlabel`` / ``refit`` operations from the control topic.

    ``label_offset`` is set on seed messages re-emitted by a worker once the
    labeled document's text was known (``origin == "resolved"``): it is the
    control-topic offset of the label operation they complete.
    """

    op: str
    id: str | None = None
    labels: tuple[str, ...] = ()
    text: str | None = None
    origin: str | None = None
    label_offset: int | None = None
    source: Any = None


@dataclass
class Rejected:
    """A message that cannot be processed; it goes to the dead-letter topic."""

    reason: str
    detail: str


@dataclass(frozen=True)
class Limits:
    """Validation limits (all configurable through the worker settings)."""

    max_message_bytes: int = 1_000_000
    max_text_chars: int = 500_000
    max_id_chars: int = 512
    max_labels_per_doc: int = 20
    label_pattern: str = DEFAULT_LABEL_PATTERN

    def label_regex(self) -> re.Pattern[str]:
        return _compiled(self.label_pattern)


_REGEX_CACHE: dict[str, re.Pattern[str]] = {}


def _compiled(pattern: str) -> re.Pattern[str]:
    rx = _REGEX_CACHE.get(pattern)
    if rx is None:
        rx = _REGEX_CACHE[pattern] = re.compile(pattern)
    return rx


def _decode(raw: bytes | str | None, limits: Limits) -> dict | Rejected:
    if raw is None:
        return Rejected("missing_field", "message has no value")
    if isinstance(raw, bytes):
        if len(raw) > limits.max_message_bytes:
            return Rejected("oversize", f"message of {len(raw)} bytes exceeds max_message_bytes={limits.max_message_bytes}")
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            return Rejected("invalid_utf8", f"value is not UTF-8: {exc.reason} at byte {exc.start}")
    elif len(raw) > limits.max_message_bytes:
        return Rejected("oversize", f"message of {len(raw)} characters exceeds max_message_bytes={limits.max_message_bytes}")
    if not raw.strip():
        return Rejected("invalid_json", "empty message")
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        return Rejected("invalid_json", f"not valid JSON: {str(exc)[:200]}")
    if not isinstance(obj, dict):
        return Rejected("wrong_type", f"message must be a JSON object, got {type(obj).__name__}")
    return obj


def _parse_ts(value: Any) -> float | None | Rejected:
    if value is None:
        return None
    if isinstance(value, bool):
        return Rejected("wrong_type", "'ts' must be ISO-8601 text or epoch seconds")
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            return Rejected("wrong_type", "'ts' must be finite")
        return float(value)
    if isinstance(value, str):
        try:
            dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return Rejected("wrong_type", f"'ts' is not ISO-8601: {value[:40]!r}")
        return dt.timestamp()
    return Rejected("wrong_type", "'ts' must be ISO-8601 text or epoch seconds")


def _check_id(obj: dict, limits: Limits) -> str | Rejected:
    if "id" not in obj:
        return Rejected("missing_field", "'id' is required")
    doc_id = obj["id"]
    if not isinstance(doc_id, str):
        return Rejected("wrong_type", f"'id' must be a string, got {type(doc_id).__name__}")
    if not doc_id or len(doc_id) > limits.max_id_chars:
        return Rejected("wrong_type", f"'id' must have 1..{limits.max_id_chars} characters")
    return doc_id


def parse_document(raw: bytes | str | None, limits: Limits = Limits()) -> Document | Rejected:
    """Parse a document message ``{"id", "text", "ts"?, "stream"?, "meta"?}``."""
    obj = _decode(raw, limits)
    if isinstance(obj, Rejected):
        return obj
    doc_id = _check_id(obj, limits)
    if isinstance(doc_id, Rejected):
        return doc_id
    if "text" not in obj:
        return Rejected("missing_field", "'text' is required")
    text = obj["text"]
    if not isinstance(text, str):
        return Rejected("wrong_type", f"'text' must be a string, got {type(text).__name__}")
    if not text.strip():
        return Rejected("empty_text", "'text' is empty")
    if len(text) > limits.max_text_chars:
        return Rejected("oversize", f"'text' has {len(text)} characters, max_text_chars={limits.max_text_chars}")
    ts = _parse_ts(obj.get("ts"))
    if isinstance(ts, Rejected):
        return ts
    stream = obj.get("stream")
    if stream is not None and not isinstance(stream, str):
        return Rejected("wrong_type", "'stream' must be a string")
    meta = obj.get("meta")
    if meta is not None and not isinstance(meta, dict):
        return Rejected("wrong_type", "'meta' must be an object")
    return Document(id=doc_id, text=text, ts=ts, stream=stream, meta=meta)


def validate_labels(labels: Any, limits: Limits) -> tuple[str, ...] | Rejected:
    """Validate a label list: strings matching the label pattern, at most max_labels_per_doc."""
    if not isinstance(labels, list):
        return Rejected("wrong_type", "'labels' must be a list of strings")
    if not labels:
        return Rejected("invalid_label", "'labels' is empty (use op 'unlabel' to remove labels)")
    if len(labels) > limits.max_labels_per_doc:
        return Rejected("invalid_label", f"{len(labels)} labels, max_labels_per_doc={limits.max_labels_per_doc}")
    rx = limits.label_regex()
    out: list[str] = []
    for label in labels:
        if not isinstance(label, str):
            return Rejected("wrong_type", "every label must be a string")
        if not rx.match(label) or label.startswith("new-"):
            return Rejected("invalid_label", f"label {label[:80]!r} does not match {limits.label_pattern} (or uses the reserved 'new-' prefix)")
        if label not in out:
            out.append(label)
    return tuple(out)


def parse_control(raw: bytes | str | None, limits: Limits = Limits()) -> ControlMessage | Rejected:
    """Parse a control message: ``label`` (with optional ``text``), ``unlabel`` or ``refit``."""
    obj = _decode(raw, limits)
    if isinstance(obj, Rejected):
        return obj
    op = obj.get("op")
    if op is None:
        return Rejected("missing_field", "'op' is required")
    if not isinstance(op, str):
        return Rejected("wrong_type", "'op' must be a string")
    if op == "refit":
        return ControlMessage(op="refit")
    if op not in ("label", "unlabel"):
        return Rejected("unknown_op", f"unknown op {op[:40]!r}; expected label, unlabel or refit")
    doc_id = _check_id(obj, limits)
    if isinstance(doc_id, Rejected):
        return doc_id
    if op == "unlabel":
        return ControlMessage(op="unlabel", id=doc_id)
    if "labels" not in obj:
        return Rejected("missing_field", "'labels' is required for op 'label'")
    labels = validate_labels(obj["labels"], limits)
    if isinstance(labels, Rejected):
        return labels
    text = obj.get("text")
    if text is not None:
        if not isinstance(text, str):
            return Rejected("wrong_type", "'text' must be a string")
        if not text.strip():
            return Rejected("empty_text", "'text' is empty")
        if len(text) > limits.max_text_chars:
            return Rejected("oversize", f"'text' has {len(text)} characters, max_text_chars={limits.max_text_chars}")
    origin = obj.get("origin")
    label_offset = obj.get("label_offset")
    if origin is not None and not isinstance(origin, str):
        return Rejected("wrong_type", "'origin' must be a string")
    if label_offset is not None and (not isinstance(label_offset, int) or isinstance(label_offset, bool)):
        return Rejected("wrong_type", "'label_offset' must be an integer")
    return ControlMessage(op="label", id=doc_id, labels=labels, text=text, origin=origin,
                          label_offset=label_offset)


def dead_letter(raw: bytes | str | None, reason: str, detail: str, topic: str | None = None,
                partition: int | None = None, offset: int | None = None, key: bytes | None = None) -> dict:
    """The dead-letter record: original bytes (UTF-8 text, or base64), source position, reason."""
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogatepass")
    value: dict[str, Any] = {"reason": reason, "detail": detail, "topic": topic, "partition": partition,
                             "offset": offset, "ts": time.time()}
    if raw is None:
        value.update(original=None, encoding=None)
    else:
        try:
            value.update(original=raw.decode("utf-8"), encoding="utf-8")
        except UnicodeDecodeError:
            value.update(original=base64.b64encode(raw).decode("ascii"), encoding="base64")
    if key is not None:
        value["key"] = base64.b64encode(key).decode("ascii")
    return value


def encode_json(obj: dict) -> bytes:
    """Compact UTF-8 JSON."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
