"""The in-flight marker: which document records were being processed when the process died.

An exception while processing a record is caught by the worker (the record is
dead-lettered with ``processing_error``). A record that kills the process instead
(a native crash, the kernel's OOM killer, ``os._exit`` in a library) would be read
again after every restart and kill it again. So, with a ``state_dir``, the worker
writes ``<state_dir>/inflight.json`` (the offset ranges of the batch) before
processing a batch and removes it once the batch's outputs were handed to the
producer. A marker found at start means the previous run died while processing
those records: they are processed one at a time, each with its own marker, and a
record that was being processed alone when the process died
:data:`POISON_AFTER` times is dead-lettered without being processed again.

The marker is written with an atomic rename but not fsync'ed: a process death
keeps it (the page cache survives), a machine crash may lose it (the batch is then
processed normally again). Without a state dir there is no marker: writing one to
the consumer group's committed-offset metadata would cost a synchronous commit (a
broker round trip) before every batch; docs/reliability.md lists this limit.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from pathlib import Path

from kafka import TopicPartition

from streamsemi.core.jsonsafe import loads_object
from streamsemi.core.logs import event
from streamsemi.service.checkpoint import read_regular_file

log = logging.getLogger("streamsemi.service.inflight")

MARKER = "inflight.json"
POISON_AFTER = 2  # deaths while processing one record alone before it is dead-lettered
MAX_MARKER_BYTES = 1_000_000


def _range(entry: object) -> tuple[TopicPartition, tuple[int, int]] | None:
    """One ``[topic, partition, first, last]`` entry of the marker, None when it is not one."""
    if not isinstance(entry, list) or len(entry) != 4:
        return None
    t, p, a, b = entry
    if not isinstance(t, str) or not all(isinstance(x, int) and not isinstance(x, bool) for x in (p, a, b)):
        return None
    return (TopicPartition(t, p), (a, b)) if p >= 0 and 0 <= a <= b else None


class InFlightMarker:
    """``<state_dir>/inflight.json``: offset ranges of the records being processed.

    Parameters
    ----------
    state_dir : str, Path or None
        Where the marker lives; None disables it (every method is then a no-op).
    poison_after : int
        Deaths while one record was processed alone before it is declared poison.

    Attributes
    ----------
    suspects : dict
        ``TopicPartition -> (first, last)`` offsets of the batch a previous run died in.
    poison : tuple or None
        ``(TopicPartition, offset)`` of the record that killed the process ``poison_after`` times.
    crashes : int
        How many times in a row the process died with the marker found at start.
    """

    def __init__(self, state_dir: str | Path | None, poison_after: int = POISON_AFTER) -> None:
        self.path = Path(state_dir) / MARKER if state_dir else None
        self.poison_after = int(poison_after)
        self.suspects: dict[TopicPartition, tuple[int, int]] = {}
        self.poison: tuple[TopicPartition, int] | None = None
        self.crashes = 0
        self._single: tuple[TopicPartition, int] | None = None
        self._written = False

    def load(self) -> None:
        """Read the marker a previous run left (it died while processing those records)."""
        if self.path is None or not self.path.is_file():
            return
        try:
            doc = loads_object(read_regular_file(self.path, MAX_MARKER_BYTES), max_bytes=MAX_MARKER_BYTES)
            entries = doc.get("ranges")
            if not isinstance(entries, list):
                raise ValueError(f"'ranges' must be a list, got {type(entries).__name__}")
            ranges = [r for r in map(_range, entries) if r is not None]
            attempts = doc.get("attempts", 0)
            if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 0:
                raise ValueError(f"attempts must be a non-negative integer, got {str(attempts)[:50]}")
        except (OSError, ValueError) as exc:  # (an UnsafeJSON is a ValueError naming its reason)
            event(log, "inflight_marker_unreadable", logging.WARNING, path=str(self.path),
                  error=f"{type(exc).__name__}: {exc}", action="ignored")
            self.clear()
            return
        if len(ranges) < len(entries):  # one bad range is one bad range: the others still mark their records
            event(log, "inflight_marker_ranges_skipped", logging.WARNING, path=str(self.path),
                  skipped=len(entries) - len(ranges), kept=len(ranges),
                  reason="a range must be [topic, partition, first, last] with 0 <= first <= last")
        self.suspects = dict(ranges)
        self.crashes = attempts + 1
        if len(ranges) == 1 and ranges[0][1][0] == ranges[0][1][1]:
            self._single = (ranges[0][0], ranges[0][1][0])
            if self.crashes >= self.poison_after:
                self.poison = self._single
        event(log, "inflight_marker_found", logging.WARNING, crashes=self.crashes,
              ranges=[[tp.topic, tp.partition, a, b] for tp, (a, b) in ranges],
              poison=None if self.poison is None else [self.poison[0].partition, self.poison[1]],
              action="the previous run died while processing these records: they are processed one at a time")

    def is_suspect(self, tp: TopicPartition, offset: int) -> bool:
        r = self.suspects.get(tp)
        return r is not None and r[0] <= offset <= r[1]

    def is_poison(self, tp: TopicPartition, offset: int) -> bool:
        return self.poison is not None and self.poison == (tp, offset)

    def done(self, tp: TopicPartition, offset: int) -> None:
        """``offset`` of ``tp`` is handled: a partition's suspects end at their last offset."""
        r = self.suspects.get(tp)
        if r is not None and offset >= r[1]:
            del self.suspects[tp]
        if self.poison is not None and self.poison == (tp, offset):
            self.poison = None

    def begin(self, positions: list[tuple[TopicPartition, int]]) -> None:
        """Records at ``positions`` are about to be processed (one range per partition)."""
        if self.path is None or not positions:
            return
        ranges: dict[TopicPartition, list[int]] = {}
        for tp, off in positions:
            r = ranges.setdefault(tp, [off, off])
            r[0], r[1] = min(r[0], off), max(r[1], off)
        attempts = 0
        if len(positions) == 1 and positions[0] == self._single:
            attempts = self.crashes  # the same record alone again: count the deaths
        body = {"ranges": [[tp.topic, tp.partition, a, b] for tp, (a, b) in ranges.items()], "attempts": attempts}
        self._write(json.dumps(body).encode())

    def end(self) -> None:
        """The records of the last :meth:`begin` are processed."""
        if self._written:
            self.clear()

    def clear(self) -> None:
        if self.path is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        except OSError as exc:
            event(log, "inflight_marker_failed", logging.WARNING, error=str(exc))
        self._written = False

    def _write(self, data: bytes) -> None:
        assert self.path is not None
        tmp = self.path.with_name(f".{MARKER}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(data)
            os.replace(tmp, self.path)
            self._written = True
        except OSError as exc:  # a full disk must not stop processing: the marker is a safety net
            event(log, "inflight_marker_failed", logging.WARNING, error=str(exc))
            tmp.unlink(missing_ok=True)
