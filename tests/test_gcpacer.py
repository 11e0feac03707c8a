"""The paced garbage collector of the polling process (streamsemi.service.gcpacer, setting gc_full_interval_s)."""

from __future__ import annotations

import gc
import weakref

import pytest

from streamsemi.service.config import ConfigError, resolve
from streamsemi.service.gcpacer import GcPacer


class Node:
    """A collectable object; ``cycle()`` makes two of them refer to each other."""

    def __init__(self) -> None:
        self.other: Node | None = None


def cycle() -> tuple[Node, weakref.ref]:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return a, weakref.ref(b)


class Clock:
    """A settable clock: ``clock.now`` is what the pacer reads."""

    now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    gc.unfreeze()
    return Clock()


def test_young_cycles_are_collected_before_the_objects_are_frozen(clock):
    pacer = GcPacer(600, clock=clock)
    a, ref = cycle()
    del a  # garbage, but only a collection finds it
    assert ref() is not None
    assert pacer.tick() is None
    assert ref() is None, "the young generations are collected before the freeze"
    assert gc.get_freeze_count() > 0 and pacer.freezes == 1


def test_a_frozen_object_that_is_not_in_a_cycle_is_still_freed_when_dropped(clock):
    pacer = GcPacer(600, clock=clock)
    row = Node()  # like a window row: no cycle
    ref = weakref.ref(row)
    pacer.tick()
    assert gc.is_tracked(row) and gc.get_freeze_count() > 0
    del row
    assert ref() is None, "reference counting frees frozen objects"


def test_frozen_cycles_wait_for_the_paced_full_collection(clock):
    pacer = GcPacer(600, freeze_every_s=1.0, clock=clock)
    a, ref = cycle()
    pacer.tick()  # frozen while alive
    del a
    gc.collect()  # Python's own full collection does not scan frozen objects
    clock.now += 1.0
    assert pacer.tick() is None  # a freeze, not a full collection
    assert ref() is not None
    clock.now += 599.0
    full = pacer.tick()
    assert full is not None and full.collected >= 2 and full.seconds >= 0.0
    assert ref() is None, "the full collection releases the frozen objects and collects them"
    assert full.frozen_before > 0 and full.frozen_after > 0, "what is left is frozen again"
    assert pacer.tick() is None, "the next full collection is one interval later"


def test_freezes_follow_the_cadence(clock):
    pacer = GcPacer(600, freeze_every_s=1.0, clock=clock)
    pacer.tick()
    clock.now += 0.5
    pacer.tick()
    assert pacer.freezes == 1
    clock.now += 0.5
    pacer.tick()
    assert pacer.freezes == 2


def test_an_interval_of_zero_leaves_the_collector_alone(clock):
    pacer = GcPacer(0, clock=clock)
    a, ref = cycle()
    assert pacer.tick() is None
    assert gc.get_freeze_count() == 0 and pacer.freezes == 0
    del a
    gc.collect()
    assert ref() is None


def test_close_releases_the_frozen_objects(clock):
    pacer = GcPacer(600, clock=clock)
    a, ref = cycle()
    pacer.tick()
    del a
    pacer.close()
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert ref() is None


def test_the_setting_is_validated_at_start():
    with pytest.raises(ConfigError) as exc:
        resolve({"gc_full_interval_s": "-1"}, env={})
    assert "setting 'gc_full_interval_s' (from flag --gc-full-interval-s): must be >= 0, got -1" in str(exc.value)
    assert resolve({}, env={}).gc_full_interval_s == 600.0
    assert resolve({}, env={"STREAMSEMI_GC_FULL_INTERVAL_S": "0"}).gc_full_interval_s == 0.0
