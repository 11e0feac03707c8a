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

    def committed(self, tp: TopicPartition) -> int | None:
        return self.committed_offsets.get(tp)

    @property
    def committed_offsets(self) -> dict[TopicPartition, int]:
        out: dict[TopicPartition, int] = {}
        for c in self.commits:
            out.update(c)
        return out


class FakeReader:
    """A group-less consumer (``assign`` + ``seek``) over a fixed partition log; ``stop_at`` makes
    it deliver nothing from that offset on (a read cut short), ``fail_at`` raise there."""

    def __init__(self, log: dict[TopicPartition, list[bytes]], batch: int = 4, stop_at: int | None = None,
                 fail_at: int | None = None) -> None:
        self.log, self.batch, self.stop_at, self.fail_at = log, batch, stop_at, fail_at
        self.pos: dict[TopicPartition, int] = {}
        self.closed = False

    def assign(self, tps: list[TopicPartition]) -> None:
        self.pos = {tp: 0 for tp in tps}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.pos[tp] = offset

    def position(self, tp: TopicPartition) -> int:
        return self.pos[tp]

    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> dict[TopicPartition, list[Record]]:
        out = {}
        for tp, at in self.pos.items():
            if self.fail_at is not None and at >= self.fail_at:
                from kafka.errors import KafkaConnectionError
                raise KafkaConnectionError("broker gone")
            end = min(len(self.log[tp]), at + self.batch)
            if self.stop_at is not None:
                end = min(end, max(at, self.stop_at))
            if end > at:
                out[tp] = [Record(o, self.log[tp][o], None, 0) for o in range(at, end)]
                self.pos[tp] = end
        return out

    def close(self, **kwargs: Any) -> None:
        self.closed = True
