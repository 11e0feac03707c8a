"""The output ledger at its edges: acknowledgement states, resends, producer replacement, commits.

Written against the survivors of the mutation run on ``streamsemi/service/ledger.py``
(benchmarks/results/mutation.md); fake Kafka clients, no broker.
"""

from __future__ import annotations

import logging

import pytest
from kafka import TopicPartition
from kafka.errors import KafkaTimeoutError
from kafka.future import Future
from kafka.structs import OffsetAndMetadata
from kafka_fakes import FakeConsumer, FakeProducer

from streamsemi.service.ledger import Output, OutputLedger

TP0, TP1, TP2 = TopicPartition("docs", 0), TopicPartition("docs", 1), TopicPartition("docs", 2)


class _Events(logging.Handler):
    """The ledger's log events (name, level, fields), whatever the logging setup of other tests."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.seen: list[tuple[str, int, dict]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append((record.getMessage(), record.levelno, dict(getattr(record, "fields", {}))))


@pytest.fixture
def events():
    logger = logging.getLogger("streamsemi.service.ledger")
    handler, level = _Events(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield handler.seen
    logger.removeHandler(handler)
    logger.setLevel(level)


class _Producer(FakeProducer):
    """Records the arguments of ``send``, ``flush`` and ``close``."""

    def __init__(self, close_error: Exception | None = None) -> None:
        super().__init__()
        self.calls: list[tuple] = []
        self.close_error = close_error

    def send(self, topic, key=None, value=b"", headers=None):
        self.calls.append(("send", topic, key, value, headers))
        return super().send(topic, key=key, value=value, headers=headers)

    def flush(self, timeout=None):
        self.calls.append(("flush", timeout))

    def close(self, timeout=None):
        self.calls.append(("close", timeout))
        super().close(timeout)
        if self.close_error is not None:
            raise self.close_error


class _Consumer(FakeConsumer):
    """Keeps the committed ``OffsetAndMetadata`` values themselves."""

    def __init__(self, tps) -> None:
        super().__init__(tps)
        self.raw_commits: list[dict] = []

    def commit(self, offsets: dict) -> None:
        self.raw_commits.append(dict(offsets))
        super().commit(offsets)


def _ledger(close_error: Exception | None = None, on_resend: bool = True):
    producers: list[_Producer] = []
    resent: list[int] = []

    def factory():
        producers.append(_Producer(close_error))
        return producers[-1]

    led = OutputLedger(factory, on_resend=resent.append if on_resend else None)
    led.open()
    return led, producers, resent


def _future(state: str) -> Future:
    f = Future()
    if state == "ok":
        f.success(None)
    elif state == "failed":
        f.failure(KafkaTimeoutError("x"))
    return f


@pytest.mark.parametrize(("state", "acknowledged", "failed"), [
    (None, False, True),         # never sent (the send raised before a future existed)
    ("pending", False, False),
    ("ok", True, False),
    ("failed", False, True),
])
def test_output_states(state, acknowledged, failed) -> None:
    out = Output("t", b"k", b"v")
    if state is not None:
        out.future = _future(state)
    assert (out.acknowledged, out.failed) == (acknowledged, failed)


def test_output_keeps_its_fields() -> None:
    out = Output("t", b"k", b"v", [("h", b"1")])
    assert (out.topic, out.key, out.value, out.headers, out.future) == ("t", b"k", b"v", [("h", b"1")], None)
    assert Output("t", None, b"v").headers is None


def test_send_passes_the_record_and_counts_in_flight_outputs() -> None:
    led, (p,), _ = _ledger()
    a = led.send(Output("out", b"k", b"v", [("h", b"1")]))
    assert p.calls == [("send", "out", b"k", b"v", [("h", b"1")])] and a.future is p.sent[0][3]
    led.send(Output("out", None, b"w"))
    assert led.unacknowledged == 2 and len(led.unsettled) == 2
    p.ack(1)
    assert led.unacknowledged == 1
    p.fail(KafkaTimeoutError("expired"))
    assert led.unacknowledged == 0, "a failed send is not in flight"
    assert not led.settle() and led.unsettled == [led.unsettled[0]] and led.unsettled[0].value == b"w"
    led.flush(2.5)
    assert p.calls[-1] == ("flush", 2.5)


def test_a_send_that_raises_becomes_a_failed_output() -> None:
    led, (p,), _ = _ledger()
    p.broken = KafkaTimeoutError("no metadata")
    out = led.send(Output("out", None, b"x"))
    assert out.failed and not out.acknowledged and out.future.is_done
    assert out.future.exception is p.broken and led.unsettled == [out] and led.unacknowledged == 0


def test_resend_sends_failed_outputs_again_in_order_and_logs_the_error(events) -> None:
    led, (p,), resent = _ledger()
    outs = [led.send(Output("out", None, v)) for v in (b"a", b"b", b"c", b"d")]
    p.ack(1)        # a: acknowledged
    p.sent[2][3].failure(KafkaTimeoutError("first"))   # c failed
    p.sent[3][3].failure(KafkaTimeoutError("second"))  # d failed; b still in flight
    assert led.resend() == 2 and resent == [2]
    assert p.values("out")[4:] == [b"c", b"d"]
    assert led.unsettled == [outs[0], outs[1], outs[2], outs[3]], "acknowledged and in-flight outputs stay"
    assert all(not o.failed for o in outs)
    name, level, fields = events[-1]
    assert (name, level) == ("outputs_resent", logging.WARNING)
    assert fields == {"records": 2, "error": "KafkaTimeoutError: first"}
    assert led.resend() == 0 and resent == [2] and len(events) == 1, "nothing failed: no resend, no event"


def test_resend_of_outputs_that_never_got_a_future() -> None:
    led, (p,), resent = _ledger()
    out = Output("out", None, b"x")
    led.unsettled.append(out)  # e.g. restored from a crash before its send
    assert led.resend() == 1 and p.values("out") == [b"x"] and out.future is not None


def test_replace_producer_resends_every_unacknowledged_output_in_order() -> None:
    led, producers, resent = _ledger(close_error=RuntimeError("broker gone"))
    outs = [led.send(Output("out", None, v)) for v in (b"a", b"b", b"c")]
    producers[0].ack(1)
    producers[0].sent[2][3].failure(KafkaTimeoutError("x"))
    assert led.replace_producer() == 2 and resent == [2], "in flight and failed are both sent again"
    assert producers[0].calls[-1] == ("close", 0) and producers[0].closed, "the close error is swallowed"
    assert led.producer is producers[1] and producers[1].values("out") == [b"b", b"c"]
    assert led.unsettled == [outs[1], outs[2]]
    assert led.replace_producer() == 2 and resent == [2, 2] and len(producers) == 3


def test_replace_producer_with_nothing_pending_does_not_count_a_resend() -> None:
    led, producers, resent = _ledger()
    led.send(Output("out", None, b"a"))
    producers[0].ack()
    assert led.replace_producer() == 0 and resent == [] and led.unsettled == []
    quiet, _, _ = _ledger(on_resend=False)
    quiet.send(Output("out", None, b"a"))
    assert quiet.replace_producer() == 1, "no on_resend callback: still resent"


def test_close() -> None:
    led, (p,), _ = _ledger()
    led.close(1.5)
    assert p.calls == [("close", 1.5)]
    OutputLedger(FakeProducer).close(1.0)  # never opened: nothing to close


def test_advance_keeps_the_highest_next_offset_per_partition() -> None:
    led, _, _ = _ledger()
    led.advance([(TP0, 0)])
    assert led.next_offset == {TP0: 1}, "offset 0 gives next offset 1"
    led.advance([(TP0, 5), (TP0, 3), (TP1, 7)])
    led.advance([(TP1, 6), (TP0, 5)])
    assert led.next_offset == {TP0: 6, TP1: 8}
    assert led.safe_offsets() == {TP0: 6, TP1: 8} and led.safe_offsets(None) == led.safe_offsets({})
    assert led.safe_offsets({TP0: 2, TP1: 9, TP2: 1}) == {TP0: 2, TP1: 8}, "held back, never forward"


def test_commit_sends_offset_and_metadata_of_changed_partitions_only() -> None:
    led, _, _ = _ledger()
    c = _Consumer([TP0, TP1])
    assert led.commit(c) == {} and c.raw_commits == [], "nothing processed: no commit call"
    led.advance([(TP0, 4), (TP1, 0)])
    assert led.commit(c, only={TP1}) == {TP1: 1}
    assert c.raw_commits == [{TP1: OffsetAndMetadata(1, "", -1)}] and led.committed == {TP1: 1}
    assert led.commit(c, held={TP0: 2}) == {TP0: 2} and led.committed == {TP0: 2, TP1: 1}
    assert led.commit(c, held={TP0: 2}) == {} and len(c.raw_commits) == 2
    led.send(Output("out", None, b"x"))  # commit() itself does not look at acknowledgements
    assert led.commit(c) == {TP0: 5} and c.raw_commits[-1] == {TP0: OffsetAndMetadata(5, "", -1)}


def test_commit_if_settled_commits_nothing_while_an_output_is_unacknowledged() -> None:
    led, (p,), _ = _ledger()
    c = _Consumer([TP0])
    led.advance([(TP0, 9)])
    led.send(Output("out", None, b"x"))
    assert led.commit_if_settled(c, only={TP0}) is False and c.raw_commits == []
    p.ack()
    assert led.commit_if_settled(c, held={TP0: 3}, only={TP0}) is True and c.commits == [{TP0: 3}]
    assert led.commit_if_settled(c, only={TP1}) is True and len(c.commits) == 1, "only other partitions"


def test_forget_drops_offsets_of_some_or_all_partitions() -> None:
    led, _, _ = _ledger()
    c = _Consumer([TP0, TP1, TP2])
    led.advance([(TP0, 1), (TP1, 2), (TP2, 3)])
    led.commit(c)
    led.forget([TP1, TopicPartition("other", 0)])
    assert led.next_offset == {TP0: 2, TP2: 4} and led.committed == {TP0: 2, TP2: 4}
    led.forget()
    assert led.next_offset == {} and led.committed == {}
    led.advance([(TP0, 1)])
    assert led.commit(c) == {TP0: 2}, "a forgotten commit is made again"
