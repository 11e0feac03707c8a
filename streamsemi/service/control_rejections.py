"""Control records that were dead-lettered stay dead-lettered once, across restarts.

The worker reads the whole control topic at every start (the seeds are rebuilt from
it), so a malformed or rejected control record would be dead-lettered again by every
start: the dead-letter topic and ``streamsemi_dead_letters_total`` would grow with
each deploy although nothing new arrived. With a ``state_dir`` the worker remembers
which control records it dead-lettered in ``<state_dir>/control_rejections.json``: a
fingerprint per record (partition, offset and a hash of the raw value, so that a
broker that lost its log and reuses the offset for another record is not mistaken for
the old one). A replayed record whose fingerprint is known is still applied as usual
(a label rejected then may be accepted now) but no dead letter is written again;
``streamsemi_control_rejections_replayed_total`` counts them.

At-least-once: a fingerprint becomes known (:meth:`RejectedControl.settle`) only once
every output handed to the producer before it, its dead letter included, was
acknowledged; a process death before that dead-letters the record again at the next
start (a duplicate, never a loss). The file is written with an atomic rename at most
every ``checkpoint_interval_s`` and at shutdown. Bounded: at most ``max_entries``
fingerprints are kept, the oldest forgotten first (a forgotten record is dead-lettered
again after a restart). Without a state dir nothing is remembered (the behaviour
before: a dead letter per start).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import uuid
from collections import OrderedDict
from pathlib import Path

from streamsemi.core.jsonsafe import loads_object
from streamsemi.core.logs import event
from streamsemi.service.checkpoint import read_regular_file

log = logging.getLogger("streamsemi.service.control_rejections")

FILE = "control_rejections.json"
MAX_ENTRIES = 10_000
#: bytes of one fingerprint in the file and in memory (partition:offset:24 hex digits, plus bookkeeping)
ENTRY_BYTES = 120
MAX_FILE_BYTES = MAX_ENTRIES * ENTRY_BYTES


def fingerprint(partition: int, offset: int, value: bytes | None) -> str:
    """``"partition:offset:hash"`` of one control record (BLAKE2b, 96 bits, of the raw value)."""
    digest = hashlib.blake2b(value if value is not None else b"\x00null", digest_size=12).hexdigest()
    return f"{int(partition)}:{int(offset)}:{digest}"


def _valid(fp: object) -> bool:
    if not isinstance(fp, str) or len(fp) > 64:
        return False
    parts = fp.split(":")
    return (len(parts) == 3 and parts[0].isdigit() and parts[1].isdigit() and len(parts[2]) == 24
            and all(c in "0123456789abcdef" for c in parts[2]))


class RejectedControl:
    """Fingerprints of the control records already dead-lettered (``<state_dir>/control_rejections.json``).

    Parameters
    ----------
    state_dir : str, Path or None
        Where the file lives; None: nothing is remembered (:meth:`known` is always False).
    topic : str
        The control topic; a file written for another topic is ignored.
    max_entries : int
        Fingerprints kept (oldest forgotten first); the pending ones are bounded alike.

    Attributes
    ----------
    replayed : int
        Replayed records not dead-lettered again since start.
    """

    def __init__(self, state_dir: str | Path | None, topic: str, max_entries: int = MAX_ENTRIES) -> None:
        self.path = Path(state_dir) / FILE if state_dir else None
        self.topic = topic
        self.max_entries = int(max_entries)
        self._known: OrderedDict[str, None] = OrderedDict()
        self._pending: OrderedDict[str, None] = OrderedDict()
        self._dirty = False
        self.replayed = 0

    def __len__(self) -> int:
        return len(self._known)

    def load(self) -> int:
        """Read the fingerprints a previous run left; returns how many (an unreadable file is ignored)."""
        if self.path is None or not self.path.is_file():
            return 0
        try:
            doc = loads_object(read_regular_file(self.path, MAX_FILE_BYTES), max_bytes=MAX_FILE_BYTES)
            if not isinstance(doc.get("entries"), list):
                raise ValueError("expected an object with a list 'entries'")
            if doc.get("topic") != self.topic:
                event(log, "control_rejections_other_topic", logging.WARNING, path=str(self.path),
                      topic=str(doc.get("topic"))[:200], control_topic=self.topic, action="ignored")
                return 0
            entries = [fp for fp in doc["entries"] if _valid(fp)][-self.max_entries:]
        except (OSError, ValueError) as exc:  # (an UnsafeJSON is a ValueError naming its reason)
            event(log, "control_rejections_unreadable", logging.WARNING, path=str(self.path),
                  error=f"{type(exc).__name__}: {exc}", action="ignored: rejected control records are dead-lettered again")
            return 0
        self._known = OrderedDict.fromkeys(entries)
        return len(entries)

    def known(self, fp: str) -> bool:
        """The record was dead-lettered (and acknowledged) before: count it as replayed."""
        if fp in self._known:
            self.replayed += 1
            return True
        return False

    def add(self, fp: str) -> None:
        """Its dead letter was handed to the producer (known after :meth:`settle`)."""
        if self.path is None:
            return
        self._pending[fp] = None
        while len(self._pending) > self.max_entries:
            self._pending.popitem(last=False)

    def settle(self) -> None:
        """Every output sent so far is acknowledged: the pending fingerprints become known."""
        if not self._pending:
            return
        for fp in self._pending:
            self._known[fp] = None
            self._known.move_to_end(fp)
        self._pending.clear()
        while len(self._known) > self.max_entries:
            self._known.popitem(last=False)
        self._dirty = True

    def save(self) -> bool:
        """Write the known fingerprints if they changed (atomic rename); True if written."""
        if self.path is None or not self._dirty:
            return False
        tmp = self.path.with_name(f".{FILE}.{uuid.uuid4().hex}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps({"topic": self.topic, "entries": list(self._known)}), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            event(log, "control_rejections_write_failed", logging.WARNING, path=str(self.path),
                  error=f"{type(exc).__name__}: {exc}", action="kept in memory; retried at the next save")
            return False
        self._dirty = False
        return True
