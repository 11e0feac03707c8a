"""Bounded JSON parsing for records that anyone who can write to a topic (or a file) controls.

:func:`json.loads` of a 200 KB record of 100,000 nested brackets raises :class:`RecursionError`,
which is no :class:`ValueError`: a reader that catches ``ValueError`` for bad records dies on it,
and reads the same record again after every restart. :func:`orjson.loads` stops at 1,024
levels with its ``JSONDecodeError`` (a ``ValueError``), refuses ``NaN``/``Infinity``, numbers
beyond a double (``1e400``, a 5,000-digit integer), lone UTF-16 surrogates and bytes that are
not UTF-8, and parses integers beyond 64 bits as floats: every number it returns is a finite
int of at most 64 bits or a finite float.

:func:`loads_bounded` parses with orjson and adds a size bound (checked before parsing) and a
nesting bound (``max_depth``, 64 by default: no record streamsemi reads nests more than four
levels). Every refusal is an :class:`UnsafeJSON`, a ``ValueError`` whose :attr:`~UnsafeJSON.reason`
is one short code (:data:`REASONS`) and whose text says why.
"""

from __future__ import annotations

from typing import Any

import orjson

#: nesting levels accepted (containers inside containers); orjson itself stops at 1,024
DEFAULT_MAX_DEPTH = 64
#: bytes (or characters) accepted; larger values are refused before parsing
DEFAULT_MAX_BYTES = 8 * 1024 * 1024

#: the reasons an :class:`UnsafeJSON` names
REASONS = ("no_value", "oversize", "invalid_utf8", "invalid_json", "too_deep", "wrong_type")


class UnsafeJSON(ValueError):
    """A value refused by :func:`loads_bounded`.

    Parameters
    ----------
    reason : str
        One of :data:`REASONS`.
    detail : str
        What was wrong, for a log line or a dead letter (never the value itself).
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def _depth_exceeds(obj: Any, max_depth: int) -> bool:
    """Some container in ``obj`` is nested more than ``max_depth`` levels deep (iterative: no recursion)."""
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


def loads_bounded(data: bytes | bytearray | memoryview | str | None, *, max_depth: int = DEFAULT_MAX_DEPTH,
                  max_bytes: int = DEFAULT_MAX_BYTES) -> Any:
    """Parse one JSON value, refusing what would exhaust the stack, the memory or the caller's arithmetic.

    Parameters
    ----------
    data : bytes, bytearray, memoryview, str or None
        The raw value (UTF-8 bytes, or text).
    max_depth : int
        Most levels of containers accepted (``[[1]]`` has two; a scalar none).
    max_bytes : int
        Longest value accepted, in bytes (characters for a ``str``).

    Returns
    -------
    Any
        The parsed value: dicts, lists, str, bool, None, ints of at most 64 bits, finite floats.

    Raises
    ------
    UnsafeJSON
        ``no_value`` (None or empty), ``oversize``, ``invalid_utf8``, ``invalid_json`` (including
        NaN, Infinity and numbers beyond a double) or ``too_deep``.
    """
    if data is None:
        raise UnsafeJSON("no_value", "the record has no value")
    size = data.nbytes if isinstance(data, memoryview) else len(data)
    if size == 0:
        raise UnsafeJSON("no_value", "the value is empty")
    if size > max_bytes:
        raise UnsafeJSON("oversize", f"{size} bytes, at most {max_bytes}")
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        text = str(exc)
        if "depth limit" in text:
            raise UnsafeJSON("too_deep", f"nested more than {max_depth} levels") from None
        reason = "invalid_utf8" if "UTF-8" in text or "surrogate" in text else "invalid_json"
        raise UnsafeJSON(reason, f"not valid JSON: {text[:200]}") from None
    if isinstance(obj, (dict, list)):
        raw = data.tobytes() if isinstance(data, memoryview) else data
        # a value with no more opening brackets than max_depth cannot nest deeper: no walk
        if raw.count("[" if isinstance(raw, str) else b"[") + raw.count("{" if isinstance(raw, str) else b"{") \
                > max_depth and _depth_exceeds(obj, max_depth):
            raise UnsafeJSON("too_deep", f"nested more than {max_depth} levels")
    return obj


def loads_object(data: bytes | bytearray | memoryview | str | None, *, max_depth: int = DEFAULT_MAX_DEPTH,
                 max_bytes: int = DEFAULT_MAX_BYTES) -> dict[str, Any]:
    """:func:`loads_bounded` of a value that must be a JSON object.

    Raises
    ------
    UnsafeJSON
        As :func:`loads_bounded`, or ``wrong_type`` when the value is not an object.
    """
    obj = loads_bounded(data, max_depth=max_depth, max_bytes=max_bytes)
    if not isinstance(obj, dict):
        raise UnsafeJSON("wrong_type", f"a JSON object is expected, got {type(obj).__name__}")
    return obj


__all__ = ["DEFAULT_MAX_BYTES", "DEFAULT_MAX_DEPTH", "REASONS", "UnsafeJSON", "loads_bounded", "loads_object"]
