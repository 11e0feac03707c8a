"""Fake kafka-python clients for unit tests of the worker's parts (integration tests use the real broker)."""

from __future__ import annotations

from collections import namedtuple
from typing import Any

from kafka import TopicPartition
from kafka.future import Future

Record = namedtuple("Record", "offset value key timestamp")


class FakeProducer:
    """``send`` returns futures the test resolves (``ack``/``fail``); ``broken`` makes ``send`` raise."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, bytes, Future]] = []
        self.broken: Exception | None = None
        self.auto_ack = False
        self.closed = False

    def send(self, topic: str, key: bytes | None = None, value: bytes = b"", headers: Any = None) -> Future:
        if self.broken is not None:
            raise self.broken
        f = Future()
        self.sent.append((topic, key, value, f))
        if self.auto_ack:
            f.success(None)
        return f

    def ack(self, n: int | None = None) -> None:
        for _, _, _, f in [s for s in self.sent if not s[3].is_done][:n]:
            f.success(None)

    def fail(self, exc: Exception) -> None:
        for _, _, _, f in self.sent:
            if not f.is_done:
                f.failure(exc)

    def flush(self, timeout: float | None = None) -> None:
        if self.auto_ack:
            self.ack()

    def close(self, timeout: float | None = None) -> None:
        self.closed = True

    def values(self, topic: str) -> list[bytes]:
        return [v for t, _, v, _ in self.sent if t == topic]


class FakeConsumer:
    """A group consumer with a fixed assignment: ``feed`` queues records for the next ``poll``."""

    def __init__(self, tps: list[TopicPartition], highwater: dict[TopicPartition, int] | None = None) -> None:
        self.tps = list(tps)
        self.hw = dict(highwater or {})
        self.queue: list[dict[TopicPartition, list[Record]]] = []
        self.commits: list[dict[TopicPartition, int]] = []
        self.seeks: list[TopicPartition] = []
        self.paused_parts: set[TopicPartition] = set()
        self.poll_timeouts: list[int] = []

    def feed(self, tp: TopicPartition, values: list[bytes], start: int = 0) -> None:
        self.queue.append({tp: [Record(start + i, v, None, 0) for i, v in enumerate(values)]})

    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> dict[TopicPartition, list[Record]]:
        self.poll_timeouts.append(timeout_ms)
        return self.queue.pop(0) if self.queue else {}

    def assignment(self) -> set[TopicPartition]:
        return set(self.tps)

    def highwater(self, tp: TopicPartition) -> int | None:
        return self.hw.get(tp)

    def commit(self, offsets: dict) -> None:
        self.commits.append({tp: om.offset for tp, om in offsets.items()})

    def seek_to_beginning(self, *tps: TopicPartition) -> None:
        self.seeks.extend(tps)

    def pause(self, *tps: TopicPartition) -> None:
        self.paused_parts |= set(tps)

    def resume(self, *tps: TopicPartition) -> None:
        self.paused_parts -= set(tps)

    def paused(self) -> set[TopicPartition]:
        return set(self.paused_parts)

    @property
    def committed_offsets(self) -> dict[TopicPartition, int]:
        out: dict[TopicPartition, int] = {}
        for c in self.commits:
            out.update(c)
        return out
