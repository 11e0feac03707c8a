"""Pacing of Python's cyclic garbage collector in the polling process (docs/throughput.md).

The worker keeps about 250,000 objects the collector tracks: the loaded code (functions,
types, modules: about half, never garbage) and, per window document, its row, entry and
small containers. Python's collector scans all of them in every full collection, which it
starts on its own whenever the objects that survived into the oldest generation grew by a
quarter: measured in the six-algorithm worker at 1,000 docs/s with a full window, a full
collection every 4-10 s, each stopping every thread of the process for 120-255 ms (16 in
four minutes; the loop's fresh documents wait meanwhile). Almost nothing they free is a
cycle of ours: the garbage they found were kafka-python's timed-out waits (an exception,
its traceback and the frames and closures it holds), made and dropped within one poll.

:class:`GcPacer` (``gc_full_interval_s``, default 600 s; 0 leaves Python's collector as it
is):

* every :data:`FREEZE_EVERY_S` the young generations are collected (``gc.collect(1)``: the
  loop's young cycles, such as those timed-out waits, a millisecond) and every object
  tracked at that moment is frozen (``gc.freeze()``: moved to the permanent generation,
  which no collection scans; an object there is still freed by reference counting when it
  is not part of a cycle, as the window's rows and documents are when they leave);
* the collections Python still starts on its own then scan only what became old since the
  last freeze;
* every ``gc_full_interval_s`` the frozen objects are released and collected in one full
  collection (``gc_full_collection`` log event, ``streamsemi_gc_full_collections_total``),
  then frozen again: a cycle that formed among frozen objects and became garbage waits at
  most that long, so memory stays bounded.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass

#: Seconds between two freezes of the tracked objects (each after a collection of the young generations).
FREEZE_EVERY_S = 1.0


@dataclass(frozen=True)
class FullCollection:
    """What one paced full collection did."""

    seconds: float
    collected: int
    frozen_before: int
    frozen_after: int


class GcPacer:
    """Freezes the tracked objects every :data:`FREEZE_EVERY_S` and collects them all every ``full_interval_s``.

    Parameters
    ----------
    full_interval_s : float
        Seconds between two full collections of every object (the setting
        ``gc_full_interval_s``); 0 turns the pacer off (:meth:`tick` does nothing).
    freeze_every_s : float
        Seconds between two freezes.
    clock : callable
        Monotonic clock (tests pass their own).
    """

    def __init__(self, full_interval_s: float, *, freeze_every_s: float = FREEZE_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if full_interval_s < 0 or freeze_every_s <= 0:
            raise ValueError("full_interval_s must be >= 0 and freeze_every_s > 0")
        self.full_interval_s = float(full_interval_s)
        self.freeze_every_s = float(freeze_every_s)
        self._clock = clock
        self._last_freeze: float | None = None
        self._next_full: float | None = None
        self.freezes = 0

    @property
    def active(self) -> bool:
        return self.full_interval_s > 0

    def tick(self) -> FullCollection | None:
        """Called once per loop: freeze when due, or the full collection when due (returned, else None)."""
        if not self.active:
            return None
        now = self._clock()
        if self._next_full is None:
            self._next_full = now + self.full_interval_s
        elif now >= self._next_full:
            self._next_full = now + self.full_interval_s
            self._last_freeze = now
            return self.full_collection()
        if self._last_freeze is None or now - self._last_freeze >= self.freeze_every_s:
            self._last_freeze = now
            self.freeze()
        return None

    def freeze(self) -> None:
        """Collect the young generations, then freeze every tracked object."""
        gc.collect(1)
        gc.freeze()
        self.freezes += 1

    @staticmethod
    def full_collection() -> FullCollection:
        """Release the frozen objects, collect every generation, freeze what is left."""
        before = gc.get_freeze_count()
        gc.unfreeze()
        t0 = time.perf_counter()
        collected = gc.collect()
        seconds = time.perf_counter() - t0
        gc.freeze()
        return FullCollection(seconds, collected, before, gc.get_freeze_count())

    def close(self) -> None:
        """Release the frozen objects (Python's collector scans them again): at shutdown, or in a process that goes on."""
        if self.active and self._next_full is not None:
            gc.unfreeze()
            self._last_freeze = self._next_full = None
