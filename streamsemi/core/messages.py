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
from datetime import UTC, datetime
from itertools import islice
from typing import Any

import orjson

from streamsemi.core.names import LABEL_PATTERN, check_name

REASONS = (
    "invalid_json", "invalid_utf8", "missing_field", "wrong_type", "empty_text", "oversize",
    "no_terms", "unknown_op", "invalid_label", "label_expired", "pending_overflow", "processing_error",
    "unknown_cluster", "retired_cluster", "unknown_stream",
)

#: The label pattern (full match; :mod:`streamsemi.core.names` holds the rules every label obeys besides it).
DEFAULT_LABEL_PATTERN = LABEL_PATTERN

# Event times must be representable as a datetime (years 1..9999), as ISO-8601 text or epoch seconds.
TS_MIN = datetime(1, 1, 1, tzinfo=UTC).timestamp()
TS_MAX = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp()
# Kafka offsets are signed 64-bit integers.
OFFSET_MAX = 2**63 - 1
# A dead letter keeps at most this many bytes of the original value (its JSON form stays far
# below the producer's 1 MiB request limit even when every byte needs a 6-byte escape).
DEAD_LETTER_ORIGINAL_BYTES = 65536
DEAD_LETTER_DETAIL_CHARS = 1000
# encode_json's fallback: containers nested deeper than this, or met after this many values,
# are replaced by a marker string (a value shared many times over could otherwise blow up).
JSON_MAX_DEPTH = 64
JSON_MAX_ITEMS = 1_000_000

_SURROGATE = re.compile(r"[\ud800-\udfff]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


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
    """``label`` / ``unlabel`` / ``refit`` / ``name`` operations from the control topic.

    ``label_offset`` is set on seed messages re-emitted by a worker once the
    labeled document's text was known (``origin == "resolved"``): it is the
    control-topic offset of the label operation they complete (of the ``name``
    operation for ``origin == "cluster"``). ``name`` carries ``cluster``, the label in
    ``labels`` (one) and an optional ``algorithm``.
    """

    op: str
    id: str | None = None
    labels: tuple[str, ...] = ()
    text: str | None = None
    origin: str | None = None
    label_offset: int | None = None
    source: Any = None
    cluster: str | None = None
    algorithm: str | None = None
    stream: str | None = None  # per-stream models: the stream the operation is for (None: the default stream)


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
        """The label pattern, compiled (use it with ``fullmatch``; :func:`label_problem` is the whole rule)."""
        return re.compile(self.label_pattern)  # re keeps its own (bounded) cache of compiled patterns

    def label_problem(self, label: object) -> str | None:
        """Why ``label`` is not a class label under these limits (None if it is): :func:`check_name`'s rule
        with :attr:`label_pattern`."""
        return check_name("label", label, None if self.label_pattern == DEFAULT_LABEL_PATTERN else self.label_pattern)


def _decode(raw: bytes | str | None, limits: Limits) -> dict | Rejected:
    if raw is None:
        return Rejected("missing_field", "message has no value")
    from_bytes = isinstance(raw, bytes)
    if from_bytes:
        if len(raw) > limits.max_message_bytes:
            return Rejected("oversize", f"message of {len(raw)} bytes exceeds max_message_bytes={limits.max_message_bytes}")
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            return Rejected("invalid_utf8", f"value is not UTF-8: {exc.reason} at byte {exc.start}")
    elif len(raw) > limits.max_message_bytes:
        return Rejected("oversize", f"message of {len(raw)} characters exceeds max_message_bytes={limits.max_message_bytes}")
    if not raw or raw.isspace():  # (what ``not raw.strip()`` says, without copying the message)
        return Rejected("invalid_json", "empty message")
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        return Rejected("invalid_json", f"not valid JSON: {str(exc)[:200]}")
    if not isinstance(obj, dict):
        return Rejected("wrong_type", f"message must be a JSON object, got {type(obj).__name__}")
    # a lone surrogate comes from a \\uD800-\\uDFFF escape or, in a str given directly, from the text itself
    # (bytes that decoded as UTF-8 hold none); substring tests first: the regex runs only when one could be there
    if ((("\\ud" in raw or "\\uD" in raw) and _SURROGATE_ESCAPE.search(raw))
            or (not from_bytes and _SURROGATE.search(raw))):
        where = _lone_surrogate_field(obj)
        if where is not None:
            return Rejected("invalid_utf8", f"field {where} holds a lone UTF-16 surrogate (an unpaired \\uD800-\\uDFFF "
                                            "escape): it is not Unicode text and cannot be encoded as UTF-8")
    return obj


def _lone_surrogate_field(obj: dict) -> str | None:
    """The top-level field (as ``ascii()``) whose value or nested keys/values hold a lone surrogate, else None.

    JSON escapes can spell a half of a UTF-16 surrogate pair (``"\\ud800"``); Python
    decodes it into a ``str`` that no UTF-8 encoder accepts. Iterative: safe at any depth.
    """
    for key, value in obj.items():
        stack: list[Any] = [key, value]
        while stack:
            item = stack.pop()
            if isinstance(item, str):
                if _SURROGATE.search(item):
                    return ascii(key)[:60]
            elif isinstance(item, dict):
                stack.extend(item.keys())
                stack.extend(item.values())
            elif isinstance(item, list):
                stack.extend(item)
    return None


def _parse_ts(value: Any) -> float | None | Rejected:
    if value is None:
        return None
    if isinstance(value, bool):
        return Rejected("wrong_type", "'ts' must be ISO-8601 text or epoch seconds")
    if isinstance(value, (int, float)):
        # int/float comparisons are exact in Python: a 400-digit integer is out of range, not an OverflowError
        if isinstance(value, float) and not math.isfinite(value):
            return Rejected("wrong_type", "'ts' must be finite")
        if not TS_MIN <= value <= TS_MAX:
            return Rejected("wrong_type", f"'ts' must be epoch seconds between {TS_MIN:.0f} and {TS_MAX:.0f} (years 1..9999)")
        return float(value)
    if isinstance(value, str):
        try:
            ts = datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except (ValueError, OverflowError, OSError):
            # not ISO-8601, or a date whose epoch seconds do not exist here (e.g. 0001-01-01 in local time)
            return Rejected("wrong_type", f"'ts' is not an ISO-8601 time of years 1..9999: {value[:40]!r}")
        if not TS_MIN <= ts <= TS_MAX:
            return Rejected("wrong_type", f"'ts' is outside years 1..9999: {value[:40]!r}")
        return ts
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


def validate_labels(labels: Any, limits: Limits, field: str = "labels") -> tuple[str, ...] | Rejected:
    """Validate a label list: class labels (:mod:`streamsemi.core.names`), at most max_labels_per_doc.

    ``field`` is the message field the labels came from; an ``invalid_label`` rejection names it.
    """
    if not isinstance(labels, list):
        return Rejected("wrong_type", "'labels' must be a list of strings")
    if not labels:
        return Rejected("invalid_label", "'labels' is empty (use op 'unlabel' to remove labels)")
    if len(labels) > limits.max_labels_per_doc:
        return Rejected("invalid_label", f"{len(labels)} labels, max_labels_per_doc={limits.max_labels_per_doc}")
    out: list[str] = []
    for label in labels:
        if not isinstance(label, str):
            return Rejected("wrong_type", "every label must be a string")
        problem = limits.label_problem(label)
        if problem is not None:
            return Rejected("invalid_label", f"'{field}': label {label[:80]!r} {problem}")
        if label not in out:
            out.append(label)
    return tuple(out)


def parse_control(raw: bytes | str | None, limits: Limits = Limits()) -> ControlMessage | Rejected:
    """Parse a control message: ``label`` (with optional ``text``), ``unlabel``, ``refit`` or ``name``.

    Every op may carry ``stream`` (a string: the stream it is for, with per-stream models).
    """
    obj = _decode(raw, limits)
    if isinstance(obj, Rejected):
        return obj
    msg = _parse_control_op(obj, limits)
    stream = obj.get("stream")
    if stream is not None and isinstance(msg, ControlMessage):
        if not isinstance(stream, str):
            return Rejected("wrong_type", f"'stream' must be a string, got {type(stream).__name__}")
        msg.stream = stream
    return msg


def check_outgoing_control(message: dict[str, Any], limits: Limits) -> ControlMessage | Rejected:
    """A control message a client is about to send (``streamsemi label``, ``name``, the console), checked as a worker
    with per-stream models checks it: :func:`parse_control`, and its ``stream`` must be a stream name
    (:mod:`streamsemi.core.names`; ``unknown_stream`` otherwise)."""
    parsed = parse_control(encode_json(message), limits)
    if isinstance(parsed, ControlMessage) and parsed.stream is not None:
        problem = check_name("stream", parsed.stream)
        if problem is not None:
            return Rejected("unknown_stream", f"'stream': {parsed.stream[:80]!r} {problem}")
    return parsed


def _parse_control_op(obj: dict, limits: Limits) -> ControlMessage | Rejected:
    op = obj.get("op")
    if op is None:
        return Rejected("missing_field", "'op' is required")
    if not isinstance(op, str):
        return Rejected("wrong_type", "'op' must be a string")
    if op == "refit":
        return ControlMessage(op="refit")
    if op == "name":
        return _parse_name(obj, limits)
    if op not in ("label", "unlabel"):
        return Rejected("unknown_op", f"unknown op {op[:40]!r}; expected label, unlabel, refit or name")
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
    if label_offset is not None and (not isinstance(label_offset, int) or isinstance(label_offset, bool)
                                     or not 0 <= label_offset <= OFFSET_MAX):
        return Rejected("wrong_type", "'label_offset' must be a Kafka offset (an integer 0..2**63-1)")
    return ControlMessage(op="label", id=doc_id, labels=labels, text=text, origin=origin,
                          label_offset=label_offset)


def _parse_name(obj: dict, limits: Limits) -> ControlMessage | Rejected:
    """``{"op": "name", "cluster": "new-N", "label": str, "algorithm"?: str}``: a discovered cluster becomes a class."""
    for key in ("cluster", "label"):
        if key not in obj:
            return Rejected("missing_field", f"'{key}' is required for op 'name'")
        if not isinstance(obj[key], str):
            return Rejected("wrong_type", f"'{key}' must be a string, got {type(obj[key]).__name__}")
    cluster = obj["cluster"]
    problem = check_name("cluster", cluster)
    if problem is not None:
        return Rejected("unknown_cluster", f"'cluster': {cluster[:80]!r} {problem}")
    labels = validate_labels([obj["label"]], limits, field="label")
    if isinstance(labels, Rejected):
        return labels
    algorithm = obj.get("algorithm")
    if algorithm is not None:
        if not isinstance(algorithm, str):
            return Rejected("wrong_type", f"'algorithm' must be a string, got {type(algorithm).__name__}")
        problem = check_name("algorithm", algorithm)
        if problem is not None:
            return Rejected("wrong_type", f"'algorithm': {algorithm[:80]!r} {problem}")
    return ControlMessage(op="name", labels=labels, cluster=cluster, algorithm=algorithm)


def _raw_bytes(raw: Any) -> bytes | None:
    """The bytes of a record value as received (``str`` via UTF-8, surrogates passed through)."""
    if raw is None or isinstance(raw, bytes):
        return raw
    if isinstance(raw, str):
        return raw.encode("utf-8", "surrogatepass")
    try:
        return bytes(raw)  # bytearray, memoryview
    except (TypeError, ValueError):
        return repr(raw).encode("utf-8", "backslashreplace")


def dead_letter(raw: bytes | str | None, reason: str, detail: str, topic: str | None = None,
                partition: int | None = None, offset: int | None = None, key: bytes | None = None) -> dict:
    """The dead-letter record: original bytes (UTF-8 text, or base64), source position, reason.

    Total: never raises, whatever ``raw``, ``detail`` and ``key`` are. At most
    :data:`DEAD_LETTER_ORIGINAL_BYTES` of the original are kept (then ``truncated`` is
    true and ``original_bytes`` gives the full size), so that the dead letter always
    fits in one produce request: an oversize record must not become an output that can
    never be sent.
    """
    data = _raw_bytes(raw)
    value: dict[str, Any] = {"reason": str(reason), "detail": str(detail)[:DEAD_LETTER_DETAIL_CHARS],
                             "topic": topic, "partition": partition, "offset": offset, "ts": time.time()}
    if data is None:
        value.update(original=None, encoding=None)
    else:
        kept = data[:DEAD_LETTER_ORIGINAL_BYTES]
        try:
            value.update(original=kept.decode("utf-8"), encoding="utf-8")
        except UnicodeDecodeError as exc:
            if len(kept) < len(data) and exc.reason == "unexpected end of data":
                # the cut split a multi-byte character (its first 1-3 bytes end ``kept``): keep the text whole
                kept = kept[:exc.start]
                value.update(original=kept.decode("utf-8"), encoding="utf-8")
            else:
                value.update(original=base64.b64encode(kept).decode("ascii"), encoding="base64")
        if len(kept) < len(data):
            value.update(truncated=True, original_bytes=len(data))
    key_bytes = _raw_bytes(key)
    if key_bytes is not None:
        value["key"] = base64.b64encode(key_bytes[:DEAD_LETTER_ORIGINAL_BYTES]).decode("ascii")
    return value


def _json_safe(obj: Any) -> Any:
    """A JSON-encodable copy of ``obj``.

    Lone surrogates become U+FFFD, non-finite floats null, numpy scalars/arrays Python
    values, bytes text, other objects their ``str``; cycles, nesting deeper than
    :data:`JSON_MAX_DEPTH` and values past the first :data:`JSON_MAX_ITEMS` become
    marker strings.
    """
    budget = [JSON_MAX_ITEMS]
    path: set[int] = set()

    def safe(o: Any, depth: int) -> Any:
        budget[0] -= 1
        if budget[0] < 0:
            return "<truncated>"
        if o is None or isinstance(o, (bool, int)):
            return o
        if isinstance(o, float):
            return o if math.isfinite(o) else None
        if isinstance(o, str):
            return _SURROGATE.sub("\ufffd", o)
        if isinstance(o, (bytes, bytearray)):
            return bytes(o).decode("utf-8", "replace")
        if depth >= JSON_MAX_DEPTH:
            return "<nested too deeply>"
        if isinstance(o, (dict, list, tuple, set, frozenset)):
            if id(o) in path:
                return "<cycle>"
            path.add(id(o))
            try:
                if isinstance(o, dict):
                    return {safe(_text(k), depth): safe(v, depth + 1) for k, v in o.items()}
                return [safe(v, depth + 1) for v in o]
            finally:
                path.discard(id(o))
        tolist = getattr(o, "tolist", None)  # numpy scalars and arrays
        if callable(tolist):
            try:
                return safe(tolist(), depth)
            except Exception:  # noqa: BLE001 - fall back to the text form
                pass
        return safe(_text(o), depth)

    return safe(obj, 0)


def _text(o: Any) -> str:
    try:
        return str(o)
    except Exception:  # noqa: BLE001 - an object whose __str__ raises
        return f"<{type(o).__name__}>"


def encode_json(obj: Any) -> bytes:
    """Compact UTF-8 JSON; total: never raises.

    The fast path is :func:`orjson.dumps` (about 1.5 us per assignment message
    against 19 us for :func:`json.dumps`; its output parses to the same values, and differs
    in text only in how some floats are spelled, e.g. ``0.00001`` for ``1e-05``). NaN and
    infinities become ``null``, as :func:`_json_safe` makes them. What orjson refuses (a
    lone surrogate, a non-str key, a numpy scalar, an integer beyond 64 bits, a cycle,
    nesting deeper than 254) goes the former way: plain :func:`json.dumps`, and a value it
    refuses too is encoded from :func:`_json_safe`'s copy, so that an output record can
    always be built.

    orjson's bytes are copied into bytes of their own length: orjson writes into a 4 KiB
    (or larger) allocation that its result keeps. Measured with ``tracemalloc``
    (docs/decisions.md): a 570-byte assignment held 8,154 bytes, a 49-byte control op 4,098,
    so 20,000 unacknowledged outputs held 160 MB that their byte count did not show; and
    keeping a message cost more than copying it (assignment 2.15 -> 0.71 us, control op
    1.50 -> 0.23 us).
    """
    try:
        return bytes(memoryview(orjson.dumps(obj)))
    except (TypeError, RecursionError):  # orjson.JSONEncodeError is a TypeError
        pass
    try:
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
    except (TypeError, ValueError, RecursionError):  # UnicodeEncodeError is a ValueError
        return json.dumps(_json_safe(obj), ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def encode_key(doc_id: Any) -> bytes:
    """The record key of an output (the document id as UTF-8); total: never raises."""
    if isinstance(doc_id, bytes):
        return doc_id
    text = str(doc_id)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (the only str UTF-8 refuses): replaced, as the regex finds them
        return _SURROGATE.sub("\ufffd", text).encode("utf-8")


def cluster_event_key(ev: dict[str, Any]) -> bytes:
    """Key of a cluster lifecycle event on the compacted clusters topic: ``[stream/]algorithm/cluster``."""
    stream = ev.get("stream")
    return encode_key(f"{stream}/{ev['algorithm']}/{ev['cluster']}" if stream is not None
                      else f"{ev['algorithm']}/{ev['cluster']}")


def resolved_seed_op(seed: Any) -> dict[str, Any] | None:
    """The ``label`` op that re-emits a resolved seed with its text on the control topic, so that restarted and
    other workers rebuild it (``stream`` when it has one); None for a seed without the offset of its label."""
    if seed.label_offset is None:
        return None
    op = {"op": "label", "id": seed.id, "labels": list(seed.labels), "text": seed.text,
          "origin": seed.origin, "label_offset": seed.label_offset}
    if seed.stream is not None:
        op["stream"] = seed.stream
    return op


def assignment_message(doc_id: str, algorithm: str, model_version: int, revision: int, label: str | None,
                       score: float, labels: dict[str, float], cluster: str, new_cluster: bool, explain: list[str],
                       primary: bool, provisional: bool, ts: float, fallback: bool = False,
                       stream: str | None = None, worker: str | None = None) -> dict[str, Any]:
    """The JSON body of an assignment record (``docs/schemas/assignment.schema.json``), fields in wire order.

    The one definition of the message: :meth:`streamsemi.engine.Assignment.to_message` and
    :func:`expand_verdict_block` (the producer process) both build it here, so a verdict
    encoded in either place is the same bytes. ``score`` is rounded to 6 digits here.
    """
    out = {
        "id": doc_id, "algorithm": algorithm, "model_version": model_version, "revision": revision,
        "label": label, "score": round(score, 6) if isinstance(score, (int, float)) else score, "labels": labels,
        "cluster": cluster, "new_cluster": new_cluster, "explain": explain, "primary": primary,
        "provisional": provisional, "ts": ts,
    }
    if fallback:
        out["fallback"] = True
    if stream is not None:
        out["stream"] = stream
    if worker is not None:
        out["worker"] = worker
    return out


class VerdictBlockError(ValueError):
    """The verdicts cannot travel as a block (a value orjson refuses or would change); emit them one by one."""


def encode_verdict_block(spec: dict[str, Any]) -> bytes:
    """One algorithm's verdicts on many documents as one compact JSON value.

    ``spec`` holds what every record shares (``a`` algorithm, ``v`` model version, ``p``
    primary, ``pr`` provisional, ``ts``, ``fb`` fallback; ``st`` stream and ``w`` worker id
    when there is one)
    and per document, in order: ``ids``, ``rev`` (revision), ``cl`` (cluster), ``new``
    (new-cluster flag), ``sc`` (score, unrounded), the label dicts as ``ln`` / ``lv``
    (names and rounded probabilities, a list per document, or flat with ``lc`` counts per
    document) and ``ex`` (the explanation of each cluster present). The producer process
    builds the records from it (:func:`expand_verdict_block`): the polling thread no longer
    builds a dict and a JSON text per record.

    Raises
    ------
    VerdictBlockError
        A value orjson refuses (a lone surrogate, an integer beyond 64 bits) or one that
        would not come back equal (a non-finite float is written as ``null``).
    """
    try:
        data = bytes(memoryview(orjson.dumps(spec)))
    except (TypeError, RecursionError) as exc:
        raise VerdictBlockError(str(exc)) from None
    if b"null" in data and _nonfinite(spec):  # orjson writes NaN and infinities as null (the only nulls the engine's blocks have)
        raise VerdictBlockError("a non-finite float")
    return data


def _nonfinite(spec: dict[str, Any]) -> bool:
    values = [spec.get("ts")] + list(spec.get("sc", ()))
    lv = spec.get("lv", ())
    values += [x for row in lv for x in row] if lv and isinstance(lv[0], list) else list(lv)
    return any(type(x) is float and not math.isfinite(x) for x in values)


def _header_value(n: Any) -> bytes:
    return str(n).encode()


def expand_verdict_block(data: bytes) -> list[tuple[bytes, bytes, list[tuple[str, bytes]]]]:
    """The records of a verdict block (:func:`encode_verdict_block`): ``(key, value, headers)`` per document, in order.

    Each value is ``encode_json(assignment_message(...))`` of the document's verdict, the
    same bytes the worker would have built; the headers are ``model_version`` and
    ``revision``, as the worker's own records carry. Total for a block that
    :func:`encode_verdict_block` made.

    Raises
    ------
    ValueError
        ``data`` is not a verdict block (not JSON, or its per-document lists differ in length).
    """
    try:
        spec = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"not a verdict block: {exc}") from None
    if not isinstance(spec, dict):
        raise ValueError("not a verdict block: not an object")
    try:
        algorithm, version, primary, provisional, ts = spec["a"], spec["v"], spec["p"], spec["pr"], spec["ts"]
    except KeyError as exc:
        raise ValueError(f"not a verdict block: missing {exc}") from None
    rows = verdict_block_rows(spec)
    fallback, stream, worker = bool(spec.get("fb")), spec.get("st"), spec.get("w")
    version_head = ("model_version", _header_value(version))
    heads: dict[Any, list[tuple[str, bytes]]] = {}
    out = []
    for doc_id, rev, label, score, labels, cluster, new, explain in rows:
        headers = heads.get(rev)
        if headers is None:
            headers = heads[rev] = [version_head, ("revision", _header_value(rev))]
        msg = assignment_message(doc_id, algorithm, version, rev, label, score, labels, cluster, new, explain,
                                 primary, provisional, ts, fallback, stream, worker)
        out.append((encode_key(doc_id), encode_json(msg), headers))
    return out


def verdict_block_rows(spec: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Per document of a verdict block (:func:`encode_verdict_block`), in order: ``(id, revision, label, score,
    labels dict, cluster, new_cluster, explanation)``; the label is None for a new cluster.

    Raises
    ------
    ValueError
        A per-document list is missing or of another length, or the label counts do not match.
    """
    try:
        ids, revs, clusters, news, scores = spec["ids"], spec["rev"], spec["cl"], spec["new"], spec["sc"]
        names, values = spec["ln"], spec["lv"]
    except (KeyError, TypeError) as exc:
        raise ValueError(f"not a verdict block: missing {exc}") from None
    n = len(ids)
    counts = spec.get("lc")
    if counts is not None:  # flat label lists: cut per document
        if len(counts) != n or sum(counts) != len(names) or len(names) != len(values):
            raise ValueError("not a verdict block: label counts do not match")
        flat_n, flat_v = iter(names), iter(values)
        names = [list(islice(flat_n, c)) for c in counts]
        values = [list(islice(flat_v, c)) for c in counts]
    if not all(len(x) == n for x in (revs, clusters, news, scores, names, values)):
        raise ValueError("not a verdict block: per-document lists differ in length")
    explain = spec.get("ex") or {}
    return [(doc_id, rev, None if new else cluster, score, dict(zip(ln, lv, strict=True)), cluster, new,
             explain.get(cluster, []))
            for doc_id, rev, cluster, new, score, ln, lv in zip(ids, revs, clusters, news, scores, names, values,
                                                               strict=True)]
