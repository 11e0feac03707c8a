"""Unit tests of the output ledger, the broker-reset guard and the in-flight marker (fake Kafka clients)."""

from __future__ import annotations

import json

import pytest
from kafka import TopicPartition
from kafka.errors import KafkaTimeoutError
from kafka_fakes import FakeConsumer, FakeProducer

from streamsemi.service import kafka_io
from streamsemi.service.broker_reset import (
    RESET_EPISODE_S,
    AssignmentWatchdog,
    BrokerResetGuard,
    coordinator_reachable,
    coordinator_state,
    request_metadata,
)
from streamsemi.service.config import resolve
from streamsemi.service.inflight import InFlightMarker
from streamsemi.service.ledger import Output, OutputLedger

TP0, TP1 = TopicPartition("docs", 0), TopicPartition("docs", 1)


def _ledger():
    producers: list[FakeProducer] = []
    resent: list[int] = []

    def factory():
        producers.append(FakeProducer())
        return producers[-1]

    led = OutputLedger(factory, on_resend=resent.append)
    led.open()
    return led, producers, resent


def test_commit_waits_until_every_output_is_acknowledged():
    led, (p,), _ = _ledger()
    c = FakeConsumer([TP0, TP1])
    led.send(Output("out", b"a", b"1"))
    led.send(Output("out", b"b", b"2"))
    led.advance([(TP0, 4), (TP0, 5), (TP1, 9)])
    assert not led.commit_if_settled(c) and c.commits == []
    p.ack(1)
    assert not led.commit_if_settled(c) and c.commits == [], "one output is still in flight"
    p.ack()
    assert led.commit_if_settled(c)
    assert c.commits == [{TP0: 6, TP1: 10}]
    assert led.commit_if_settled(c) and len(c.commits) == 1, "nothing new: no second commit"


def test_an_output_whose_send_fails_is_sent_again_and_holds_the_commit():
    led, (p,), resent = _ledger()
    c = FakeConsumer([TP0])
    p.broken = KafkaTimeoutError("no metadata")
    out = led.send(Output("out", None, b"x"))
    led.advance([(TP0, 0)])
    assert out.failed and not led.commit_if_settled(c) and c.commits == []
    p.broken = None
    assert led.resend() == 1 and resent == [1] and len(p.sent) == 1
    p.fail(KafkaTimeoutError("expired"))  # the broker never acknowledged it
    assert not led.commit_if_settled(c) and c.commits == []
    assert led.resend() == 1 and len(p.sent) == 2
    p.ack()
    assert led.commit_if_settled(c) and c.commits == [{TP0: 1}]
    assert led.resend() == 0


def test_buffered_documents_hold_their_partition_back_and_offsets_never_go_back():
    led, _, _ = _ledger()
    c = FakeConsumer([TP0, TP1])
    led.advance([(TP0, 10), (TP1, 3)])
    led.advance([(TP0, 2)])
    assert led.next_offset == {TP0: 11, TP1: 4}
    assert led.commit_if_settled(c, held={TP0: 7})
    assert c.commits == [{TP0: 7, TP1: 4}]
    led.commit_if_settled(c, held={}, only={TP1})
    assert len(c.commits) == 1, "only TP1, unchanged"
    led.commit_if_settled(c, held={})
    assert c.commits[-1] == {TP0: 11}
    led.forget([TP0])
    assert led.next_offset == {TP1: 4} and led.committed == {TP1: 4}


def test_replace_producer_sends_every_unacknowledged_output_again():
    led, producers, resent = _ledger()
    led.send(Output("out", None, b"done"))
    producers[0].ack()
    led.send(Output("out", None, b"waiting"))
    assert led.replace_producer() == 1 and resent == [1]
    assert producers[0].closed and len(producers) == 2
    assert producers[1].values("out") == [b"waiting"]


# ---------------------------------------------------------------- broker-reset guard
class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def guard(monkeypatch):
    calls = []
    monkeypatch.setattr(kafka_io, "ensure_topics", lambda settings, timeout_s=30.0: calls.append(1) or ["docs"])
    episodes = []
    clock = _Clock()
    g = BrokerResetGuard(resolve({}), on_episode=lambda: episodes.append(clock.t), clock=clock)
    return g, calls, episodes, clock


def test_a_position_past_the_high_watermark_requests_a_reset_and_rereads_the_partition(guard):
    g, _, _, _ = guard
    led, _, _ = _ledger()
    c = FakeConsumer([TP0, TP1], highwater={TP0: 50, TP1: 3})
    led.advance([(TP0, 40), (TP1, 20)])
    assert g.check_positions(c, led) == [TP1]
    assert g.pending and g.sources == {"documents_topic"}
    assert c.seeks == [TP1] and TP1 not in led.next_offset and led.next_offset[TP0] == 41


def test_one_loss_counts_once_per_episode(guard):
    g, ensure_calls, episodes, clock = guard
    led, producers, _ = _ledger()
    c = FakeConsumer([TP0])
    led.send(Output("out", None, b"pending"))
    led.advance([(TP0, 5)])
    g.request("control_topic")
    assert g.handle(c, led, seeds=3) is True
    assert episodes == [1000.0] and len(producers) == 2 and producers[1].values("out") == [b"pending"]
    assert led.next_offset == {} and c.seeks == [TP0] and not g.pending
    clock.t += RESET_EPISODE_S / 2
    g.request("documents_topic")
    assert g.handle(c, led) is False, "the same loss seen again"
    assert episodes == [1000.0] and len(producers) == 2 and len(ensure_calls) == 2
    assert g.on_assigned(c, {TP1}) and c.seeks[-1] == TP1, "assigned during the episode: read from the beginning"
    clock.t += RESET_EPISODE_S * 2
    assert not g.on_assigned(c, {TP1})
    g.request("control_topic")
    assert g.handle(c, led) is True and len(episodes) == 2


def test_known_position_reads_the_subscription_state_or_gives_up():
    class Pos:
        offset = 12

    class State:
        position = Pos()

    class Sub:
        assignment = {TP0: State()}

    class C:
        _subscription = Sub()

    assert BrokerResetGuard.known_position(C(), TP0) == 12
    assert BrokerResetGuard.known_position(C(), TP1) is None
    assert BrokerResetGuard.known_position(object(), TP0) is None


# ---------------------------------------------------------------- in-flight marker
def test_inflight_marker_names_the_batch_until_it_is_processed(tmp_path):
    m = InFlightMarker(tmp_path)
    m.begin([(TP0, 5), (TP0, 7), (TP1, 2)])
    body = json.loads((tmp_path / "inflight.json").read_text())
    assert sorted(body["ranges"]) == [["docs", 0, 5, 7], ["docs", 1, 2, 2]] and body["attempts"] == 0
    m.end()
    assert not (tmp_path / "inflight.json").exists()
    m2 = InFlightMarker(tmp_path)
    m2.load()
    assert m2.suspects == {} and m2.crashes == 0


def test_a_record_that_kills_the_process_alone_twice_is_poison(tmp_path):
    InFlightMarker(tmp_path).begin([(TP0, 5), (TP0, 9)])  # died in a batch
    first = InFlightMarker(tmp_path)
    first.load()
    assert first.is_suspect(TP0, 7) and not first.is_suspect(TP0, 10) and first.poison is None
    first.begin([(TP0, 5)])
    first.end()
    first.begin([(TP0, 6)])  # died processing offset 6 alone
    second = InFlightMarker(tmp_path)
    second.load()
    assert second.crashes == 1 and second.poison is None, "one death alone may be bad luck (a kill)"
    second.begin([(TP0, 6)])  # alone again, died again
    third = InFlightMarker(tmp_path)
    third.load()
    assert third.crashes == 2 and third.is_poison(TP0, 6) and not third.is_poison(TP0, 5)
    third.done(TP0, 6)
    assert third.poison is None and third.suspects == {}


@pytest.mark.parametrize("content", [b"{", b"[" * 100000, json.dumps({"ranges": 5}).encode(),
                                     json.dumps({"ranges": [["docs", 0, 1, 2]], "attempts": "x"}).encode()])
def test_an_unreadable_marker_is_ignored(tmp_path, content):
    (tmp_path / "inflight.json").write_bytes(content)
    m = InFlightMarker(tmp_path)
    m.load()
    assert m.suspects == {} and m.poison is None and not (tmp_path / "inflight.json").exists()


def test_without_a_state_dir_the_marker_does_nothing(tmp_path):
    m = InFlightMarker(None)
    m.begin([(TP0, 1)])
    m.load()
    assert m.suspects == {} and list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- assignment watchdog
class _Member:
    """A consumer seen through the kafka-python internals the watchdog reads."""

    class _State:
        def __init__(self, name: str) -> None:
            self.name = name

        def __str__(self) -> str:
            return f"MemberState.{self.name.upper()}"

    def __init__(self, state: str, parts=(), coordinator=True) -> None:
        outer = self
        self.parts, self.refreshes = set(parts), 0

        class Coordinator:
            @property
            def state(self):
                return _Member._State(outer.state)

            def coordinator_unknown(self):
                return not outer.coordinator

        class Cluster:
            def request_update(self):
                outer.refreshes += 1

        class Client:
            cluster = Cluster()

        self.state, self.coordinator = state, coordinator
        self._coordinator, self._client = Coordinator(), Client()

    def assignment(self):
        return self.parts


def test_watchdog_replaces_only_a_member_stuck_outside_its_group():
    clock = _Clock()
    wd = AssignmentWatchdog(30.0, clock=clock)
    stuck = _Member("rebalancing")
    assert wd.check(stuck) is None and stuck.refreshes == 1, "unassigned: fresh metadata asked at once"
    clock.t += 29.0
    assert wd.check(stuck) is None and stuck.refreshes == 2
    clock.t += 2.0
    reason = wd.check(stuck)
    assert reason == "no partitions for 31 s while its group membership stays rebalancing"
    assert wd.check(stuck) is None, "the wait starts again for the new member"
    # a member of a group with more members than partitions is stable: never replaced, metadata every 5 s
    idle, wd2 = _Member("stable"), AssignmentWatchdog(30.0, clock=clock)
    for _ in range(40):
        assert wd2.check(idle) is None
        clock.t += 2.5
    assert idle.refreshes == 20
    # a broker that is down: a new consumer would not help
    down, wd3 = _Member("unjoined", coordinator=False), AssignmentWatchdog(30.0, clock=clock)
    wd3.check(down)
    clock.t += 100
    assert wd3.check(down) is None
    down.coordinator = True
    assert wd3.check(down).endswith("stays unjoined")
    # partitions assigned: the wait is over and nothing is asked
    ok, wd4 = _Member("stable", parts={TP0}), AssignmentWatchdog(30.0, clock=clock)
    wd4.since = clock.t - 1000
    assert wd4.check(ok) is None and wd4.since is None and ok.refreshes == 0


def test_watchdog_reads_the_installed_kafka_python(broker):
    """The internals the watchdog reads exist on the installed kafka-python (or it would silently do nothing)."""
    from kafka import KafkaConsumer

    c = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id="watchdog-internals", enable_auto_commit=False)
    try:
        c.subscribe(["watchdog-internals"])
        assert coordinator_state(c) == "unjoined"
        assert request_metadata(c) is True and c._client.cluster.need_update, "a refresh at the next poll"
        for _ in range(10):
            c.poll(timeout_ms=300)
            if coordinator_state(c) == "rebalancing":
                break
        # Tansu answers a new group's JoinGroup after about 20 s: the member waits in "rebalancing"
        assert coordinator_state(c) in ("rebalancing", "stable") and coordinator_reachable(c)
    finally:
        c.close()


# ---------------------------------------------------------------- asynchronous producer (the producer process)
class ShippingProducer(FakeProducer):
    """A producer that ships without waiting, like streamsemi.service.producer.ProcessProducer."""

    def __init__(self) -> None:
        super().__init__()
        self.ships = 0

    def ship(self) -> None:
        self.ships += 1


def _async_ledger():
    producers: list[ShippingProducer] = []

    def factory():
        producers.append(ShippingProducer())
        return producers[-1]

    led = OutputLedger(factory)
    led.open()
    return led, producers


def test_commit_acknowledged_commits_the_newest_advance_whose_outputs_and_all_earlier_ones_are_acknowledged():
    led, (p,) = _async_ledger()
    assert led.asynchronous
    c = FakeConsumer([TP0, TP1])
    led.send(Output("out", b"a", b"1"))
    led.advance([(TP0, 4)])                      # epoch 0: offsets {TP0: 5}
    led.send(Output("out", b"b", b"22"))
    led.send(Output("out", b"c", b"333"))
    led.advance([(TP0, 5), (TP1, 9)])            # epoch 1: {TP0: 6, TP1: 10}
    led.send(Output("out", b"d", b"4"))
    led.advance([(TP1, 10)])                     # epoch 2: {TP0: 6, TP1: 11}
    led.ship()
    assert p.ships == 1 and led.unsettled_bytes == 1 + 1 + 1 + 2 + 1 + 3 + 1 + 1
    assert not led.commit_acknowledged(c) and c.commits == [], "nothing acknowledged yet"
    p.sent[0][3].success(None)
    p.sent[3][3].success(None)                   # epoch 2's output, but epoch 1's are not acknowledged
    assert not led.commit_acknowledged(c)
    assert c.commits == [{TP0: 5}], "only the first advance is covered"
    assert led.unsettled_bytes == (1 + 2) + (1 + 3) + (1 + 1), "b, c and d: d is acknowledged but behind b (head only)"
    p.sent[1][3].success(None)
    assert not led.commit_acknowledged(c) and c.commits == [{TP0: 5}], "one output of epoch 1 is still in flight"
    p.sent[2][3].success(None)
    assert led.commit_acknowledged(c), "every output acknowledged"
    assert c.commits == [{TP0: 5}, {TP0: 6, TP1: 11}] and not led.marks


def test_a_failed_output_sent_again_keeps_holding_back_the_advance_it_belongs_to():
    led, (p,) = _async_ledger()
    c = FakeConsumer([TP0])
    led.send(Output("out", b"a", b"1"))
    led.advance([(TP0, 0)])                      # epoch 0
    led.send(Output("out", b"b", b"2"))
    led.advance([(TP0, 1)])                      # epoch 1
    p.sent[0][3].failure(KafkaTimeoutError("lost"))
    p.sent[1][3].success(None)
    assert led.resend() == 1
    assert [o.epoch for o in led.unsettled if o.key == b"a"] == [0], "the resent output keeps its first epoch"
    led.send(Output("out", b"c", b"3"))
    led.advance([(TP0, 2)])                      # epoch 2
    p.sent[3][3].success(None)                   # the new output: acknowledged before the resent one
    assert not led.commit_acknowledged(c) and c.commits == [], "offset 0's output is not acknowledged"
    p.sent[2][3].success(None)
    assert led.commit_acknowledged(c) and c.commits == [{TP0: 3}]


def test_commit_acknowledged_respects_held_offsets_and_forgets_revoked_partitions():
    led, (p,) = _async_ledger()
    c = FakeConsumer([TP0, TP1])
    led.send(Output("out", b"a", b"1"))
    led.advance([(TP0, 7), (TP1, 3)])            # epoch 0
    led.send(Output("out", b"b", b"2"))
    led.advance([(TP0, 8)])                      # epoch 1
    led.forget([TP1])                            # TP1 revoked: never committed from an old mark
    p.sent[0][3].success(None)
    assert not led.commit_acknowledged(c, held={TP0: 6})
    assert c.commits == [{TP0: 6}], "held back to the oldest buffered document; nothing of TP1"
    led.forget()
    assert not led.marks and not led.next_offset


def test_marks_are_bounded_and_dropping_the_oldest_only_delays_commits():
    led, (p,) = _async_ledger()
    led.MAX_MARKS = 5
    c = FakeConsumer([TP0])
    led.send(Output("out", b"a", b"1"))
    for off in range(20):
        led.advance([(TP0, off)])
        led.send(Output("out", b"k", b"v"))
    assert len(led.marks) == 5 and [e for e, _ in led.marks] == list(range(15, 20))
    for _, _, _, f in p.sent[:10]:
        f.success(None)                          # outputs of epochs 0-9: their marks were dropped
    assert not led.commit_acknowledged(c) and c.commits == [], "no remaining mark is covered: no commit"
    for _, _, _, f in p.sent[10:17]:
        f.success(None)                          # now epochs up to 16 are acknowledged
    assert not led.commit_acknowledged(c) and c.commits == [{TP0: 17}]


class CountingProducer(ShippingProducer):
    """Counts failed records, as ProcessProducer does (``failures``): the ledger scans for them only when it grew."""

    def __init__(self) -> None:
        super().__init__()
        self.failures = 0


def test_resend_scans_only_when_the_producer_counts_a_new_failure_or_a_send_raised():
    led = OutputLedger(CountingProducer)
    led.open()
    p = led.producer
    for i in range(5):
        led.send(Output("out", b"k%d" % i, b"v"))
    p.sent[1][3].failure(KafkaTimeoutError("lost"))
    assert led.resend() == 0, "the producer counted no failure: no scan"
    p.failures += 1
    assert led.resend() == 1 and p.sent[-1][1] == b"k1"
    p.broken = KafkaTimeoutError("no metadata")
    led.send(Output("out", b"x", b"v"))           # the send raises: a failed output
    p.broken = None
    assert led.resend() == 1 and p.sent[-1][1] == b"x", "a send that raised is found without a producer count"
    assert led.resend() == 0


class _ManyProducer(FakeProducer):
    """A producer with ``send_many`` (as ProcessProducer): one call per group of outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def send_many(self, records):
        self.calls += 1
        if self.broken is not None:
            raise self.broken
        return [self.send(topic, key=key, value=value, headers=headers) for topic, key, value, headers in records]


@pytest.mark.parametrize("many", [True, False])
def test_send_many_tracks_every_output_as_send_does_and_a_failed_call_is_sent_again(many):
    led = OutputLedger(_ManyProducer if many else FakeProducer)
    led.open()
    p = led.producer
    c = FakeConsumer([TP0])
    outs = [Output("out", b"k%d" % i, b"v" * i, [("model_version", b"1")]) for i in range(1, 4)]
    led.send_many(outs)
    assert [s[:3] for s in p.sent] == [("out", b"k1", b"v"), ("out", b"k2", b"vv"), ("out", b"k3", b"vvv")]
    assert [o.future for o in outs] == [s[3] for s in p.sent] and led.unsettled == outs
    assert led.unsettled_bytes == sum(o.nbytes for o in outs) and all(o.epoch == led.epoch for o in outs)
    assert getattr(p, "calls", 1) == 1
    led.advance([(TP0, 0)])
    p.ack(2)
    assert not led.commit_if_settled(c), "the third output is not acknowledged"
    p.ack()
    assert led.commit_if_settled(c) and c.commits == [{TP0: 1}]
    p.broken = KafkaTimeoutError("no metadata")
    more = [Output("out", b"x", b"1"), Output("out", b"y", b"2")]
    led.send_many(more)
    assert all(o.failed for o in more) and led.unsettled[-2:] == more
    p.broken = None
    assert led.resend() == 2 and [s[1] for s in p.sent[-2:]] == [b"x", b"y"]


# ---------------------------------------------------------------- asynchronous commits
class AsyncCommitConsumer(FakeConsumer):
    """A consumer with ``commit_async``: the test runs the callbacks (kafka-python runs them in ``poll``)."""

    def __init__(self, tps) -> None:
        super().__init__(tps)
        self.async_commits: list[tuple[dict, object]] = []

    def commit_async(self, offsets, callback=None):
        self.async_commits.append(({tp: om.offset for tp, om in offsets.items()}, (offsets, callback)))

    def answer(self, i: int, response: object = None) -> None:
        offsets, callback = self.async_commits[i][1]
        callback(offsets, response)


def _acknowledged_advance(led, producer, positions) -> None:
    """One output sent for the records at ``positions``, the advance past them, the output acknowledged."""
    led.send(Output("out", b"k", b"v"))
    led.advance(positions)
    producer.sent[-1][3].success(None)


def test_per_loop_commits_do_not_wait_and_a_confirmed_offset_is_not_sent_again():
    led, (p,) = _async_ledger()
    c = AsyncCommitConsumer([TP0])
    _acknowledged_advance(led, p, [(TP0, 4)])
    assert led.commit_acknowledged(c, wait=False)
    assert c.commits == [] and [o for o, _ in c.async_commits] == [{TP0: 5}], "sent without waiting"
    assert led.committed == {}, "not confirmed yet"
    led.commit_acknowledged(c, wait=False)
    assert len(c.async_commits) == 1, "an offset waiting for confirmation is not sent again"
    c.answer(0)
    assert led.committed == {TP0: 5} and led.take_commit_errors() == []
    led.commit_acknowledged(c, wait=False)
    assert len(c.async_commits) == 1 and c.commits == []
    _acknowledged_advance(led, p, [(TP0, 9)])
    led.commit_acknowledged(c, wait=False)
    assert [o for o, _ in c.async_commits] == [{TP0: 5}, {TP0: 10}]


def test_a_failed_asynchronous_commit_is_reported_and_committed_again():
    from kafka.errors import CommitFailedError

    led, (p,) = _async_ledger()
    c = AsyncCommitConsumer([TP0, TP1])
    _acknowledged_advance(led, p, [(TP0, 4), (TP1, 1)])
    led.commit_acknowledged(c, wait=False)
    c.answer(0, CommitFailedError("rebalanced"))
    errors = led.take_commit_errors()
    assert len(errors) == 1 and "rebalanced" in str(errors[0]) and led.take_commit_errors() == []
    assert led.committed == {}
    led.commit_acknowledged(c, wait=False)
    assert [o for o, _ in c.async_commits] == [{TP0: 5, TP1: 2}] * 2, "the same offsets, sent again"
    c.answer(1)
    assert led.committed == {TP0: 5, TP1: 2}


def test_a_waiting_commit_sends_what_an_asynchronous_commit_has_not_confirmed():
    """Revocation, checkpoint and shutdown commits wait: what only an unconfirmed asynchronous commit covered is
    committed again (it may never be confirmed: the consumer closes), what is confirmed is not."""
    led, (p,) = _async_ledger()
    c = AsyncCommitConsumer([TP0, TP1])
    _acknowledged_advance(led, p, [(TP0, 4), (TP1, 7)])
    led.commit_acknowledged(c, wait=False)
    c.answer(0)
    _acknowledged_advance(led, p, [(TP0, 6)])
    led.commit_acknowledged(c, wait=False)       # {TP0: 7} sent, never confirmed
    assert [o for o, _ in c.async_commits][-1] == {TP0: 7}
    assert led.commit_if_settled(c)
    assert c.commits == [{TP0: 7}], "the unconfirmed offset, synchronously; TP1's confirmed one is not sent again"
    assert led.committed == {TP0: 7, TP1: 8}
    c.answer(1)                                   # the late confirmation changes nothing
    assert led.committed == {TP0: 7, TP1: 8}
    led.forget([TP1])
    c.answer(0)                                   # a confirmation after a revocation does not bring TP1 back
    assert TP1 not in led.committed


def test_a_consumer_without_commit_async_commits_and_waits():
    led, (p,) = _async_ledger()
    c = FakeConsumer([TP0])
    _acknowledged_advance(led, p, [(TP0, 2)])
    assert led.commit_acknowledged(c, wait=False)
    assert c.commits == [{TP0: 3}] and led.committed == {TP0: 3}
