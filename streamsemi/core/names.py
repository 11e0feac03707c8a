"""Names: the one rule for class labels, stream names, cluster ids, algorithm names and instance ids.

Every name that comes from outside (a message field, a setting, a command-line argument)
is checked here, by :func:`check_name`, before it becomes a class, a stream, a metric
label or a key. The rules every kind shares:

- a ``str`` of at least one and at most the kind's number of characters;
- never a path component: not ``.`` or ``..``, no ``/`` and no ``\\``;
- no leading or trailing whitespace;
- no control characters (Unicode category Cc: NUL, tab, line feed ...), format characters
  (Cf: zero-width spaces and joiners, bidirectional overrides, the byte order mark ...),
  lone surrogates (Cs) or line and paragraph separators (Zl, Zp);
- the whole value matches the kind's pattern (:func:`re.fullmatch`: a ``$`` would admit a
  trailing newline).

The kinds (:data:`RULES`):

========== ================================================================== =====
kind       pattern                                                            chars
========== ================================================================== =====
label      ``A-Za-z0-9_`` first, then ``A-Za-z0-9_ .:&+-``, no trailing space;   64
           not ``new-...`` (reserved for discovered clusters)
stream     ``A-Za-z0-9._-``                                                      64
cluster    ``new-N``, ``N`` of 1-9 digits                                        13
algorithm  ``A-Za-z0-9`` first, then ``A-Za-z0-9._-``                           100
instance   any characters the shared rules allow (inner spaces too)             253
========== ================================================================== =====

Bad input in a message is a :class:`~streamsemi.core.messages.Rejected` value built from
:func:`check_name`'s reason; configuration and the command line raise.
:class:`InvalidName` (a ``ValueError``) is what :func:`valid_name`, the typed
constructor, raises.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

#: Unicode categories no name may contain: control, format, surrogate, line and paragraph separators.
FORBIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
#: The prefix of discovered clusters' ids (``new-N``); no class label may start with it.
RESERVED_LABEL_PREFIX = "new-"

#: The default label pattern (full match): inner spaces allowed, no trailing one.
LABEL_PATTERN = r"[A-Za-z0-9_](?:[A-Za-z0-9_ .:&+-]{0,62}[A-Za-z0-9_.:&+-])?"


@dataclass(frozen=True)
class NameRule:
    """What one kind of name must be.

    Attributes
    ----------
    kind : str
        The key of :data:`RULES`.
    max_chars : int
        At most this many characters.
    pattern : str or None
        A regular expression the whole value must match (None: the shared rules only).
    description : str
        The pattern in words, for error messages and docs.
    """

    kind: str
    max_chars: int
    pattern: str | None
    description: str


RULES: dict[str, NameRule] = {
    "label": NameRule("label", 64, LABEL_PATTERN,
                      "a letter, digit or '_' first, then letters, digits, spaces and _ . : & + -, "
                      "not ending with a space"),
    "stream": NameRule("stream", 64, r"[A-Za-z0-9._-]+", "letters, digits and . _ -"),
    "cluster": NameRule("cluster", 13, r"new-[0-9]{1,9}", "a discovered cluster id new-N (N of 1-9 digits)"),
    "algorithm": NameRule("algorithm", 100, r"[A-Za-z0-9][A-Za-z0-9._-]*",
                          "a letter or digit first, then letters, digits and . _ -"),
    "instance": NameRule("instance", 253, None, "any characters the shared rules allow, inner spaces too"),
}
KINDS: tuple[str, ...] = tuple(RULES)


class InvalidName(ValueError):
    """A value that is not a name of its kind.

    Attributes
    ----------
    kind : str
        The kind of name (a key of :data:`RULES`).
    value : object
        The value refused.
    reason : str
        Why (what :func:`check_name` returned).
    """

    def __init__(self, kind: str, value: object, reason: str) -> None:
        self.kind, self.value, self.reason = kind, value, reason
        shown = repr(value[:80]) if isinstance(value, str) else type(value).__name__
        super().__init__(f"{kind} {shown} {reason}")


def _char(c: str) -> str:
    """A character as ``U+000A LINE FEED`` (the name when Unicode has one)."""
    name = unicodedata.name(c, "") or {"\n": "LINE FEED", "\t": "TAB", "\r": "CARRIAGE RETURN", "\x00": "NUL"}.get(c, "")
    return f"U+{ord(c):04X}" + (f" {name}" if name else "")


def check_name(kind: str, value: object, pattern: str | None = None) -> str | None:
    """Why ``value`` is not a name of ``kind`` (None when it is one).

    Parameters
    ----------
    kind : str
        One of :data:`KINDS`: ``label``, ``stream``, ``cluster``, ``algorithm``, ``instance``.
    value : object
        The candidate (anything: a non-string is refused, never raises).
    pattern : str, optional
        Replaces the kind's pattern (a label pattern configured in
        :class:`~streamsemi.core.messages.Limits`); the shared rules and the length
        bound still apply, so a pattern can only narrow what is accepted.

    Returns
    -------
    str or None
        The reason, a phrase that reads after the value (``"must not ..."``), or None.

    Raises
    ------
    KeyError
        ``kind`` is not one of :data:`KINDS` (a programming error, not bad input).
    """
    rule = RULES[kind]
    if not isinstance(value, str):
        return f"must be a string, got {type(value).__name__}"
    if not value:
        return "must not be empty"
    if len(value) > rule.max_chars:
        return f"must have at most {rule.max_chars} characters, got {len(value)}"
    if value in (".", ".."):
        return "must not be '.' or '..' (a path component)"
    if "/" in value or "\\" in value:
        return "must not contain '/' or '\\'"
    for end, c in (("start", value[0]), ("end", value[-1])):
        if c.isspace():
            return f"must not {end} with whitespace ({_char(c)})"
    for i, c in enumerate(value):
        if unicodedata.category(c) in FORBIDDEN_CATEGORIES:
            return f"must not contain control or format characters ({_char(c)} at position {i})"
    rx = rule.pattern if pattern is None else pattern
    if rx is not None and re.fullmatch(rx, value) is None:
        return f"must match {pattern}" if pattern is not None else f"must be {rule.description}"
    if kind == "label" and value.startswith(RESERVED_LABEL_PREFIX):
        return f"must not start with {RESERVED_LABEL_PREFIX!r} (reserved for discovered clusters)"
    return None


def valid_name(kind: str, value: object, pattern: str | None = None) -> str:
    """``value`` if it is a name of ``kind`` (the typed constructor of names).

    Parameters
    ----------
    kind, value, pattern
        As for :func:`check_name`.

    Returns
    -------
    str
        ``value``, unchanged.

    Raises
    ------
    InvalidName
        ``value`` is not a name of ``kind``; its message is ``"<kind> <value> <reason>"``.
    """
    reason = check_name(kind, value, pattern)
    if reason is not None:
        raise InvalidName(kind, value, reason)
    return value  # type: ignore[return-value]  # (a str: check_name refused anything else)


def describe(kind: str) -> str:
    """The rule of ``kind`` in one line, for help texts and error messages."""
    rule = RULES[kind]
    return f"1..{rule.max_chars} characters: {rule.description}"


__all__ = ["FORBIDDEN_CATEGORIES", "KINDS", "LABEL_PATTERN", "RESERVED_LABEL_PREFIX", "RULES", "InvalidName",
           "NameRule", "check_name", "describe", "valid_name"]
