"""The broker-reset guard: notice that the broker lost its data and recover from it.

A broker restarted empty shows up as missing topics, a control-topic position past
the log end (reported by :class:`~streamsemi.service.kafka_io.ControlReader` /
:class:`~streamsemi.service.kafka_io.BrokerWatch` through :meth:`BrokerResetGuard.request`)
or a document position past the partition's high watermark
(:meth:`BrokerResetGuard.check_positions`). Recovery (:meth:`BrokerResetGuard.handle`):
topics are created again, offsets that refer to the old log are dropped, partitions
are read from the beginning (also those assigned shortly after), the producer is
replaced and unacknowledged outputs are sent again; seeds and models stay in memory.
Detections of one loss within :data:`RESET_EPISODE_S` count once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kafka import TopicPartition

from streamsemi.core.logs import event
from streamsemi.service import kafka_io
from streamsemi.service.ledger import OutputLedger

log = logging.getLogger("streamsemi.service.broker_reset")

RESET_EPISODE_S = 30.0  # detections of one broker loss within this time count once


class BrokerResetGuard:
    """Detects a broker that lost its data and drives the recovery.

    Parameters
    ----------
    settings : Settings
        For re-creating the topics.
    on_episode : callable, optional
        Called once per reset episode (a metric).
    clock : callable
        Monotonic clock (seconds), injectable for tests.
    """

    def __init__(self, settings: Any, on_episode: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.on_episode = on_episode
        self.clock = clock
        self.requested = threading.Event()
        self.sources: set[str] = set()
        self.last_reset = -1e18
        self.seek_until = -1e18

    def request(self, source: str) -> None:
        """Called (from any thread) when the broker seems to have lost its data."""
        self.sources.add(source)
        self.requested.set()

    @property
    def pending(self) -> bool:
        return self.requested.is_set()

    def check_positions(self, consumer: Any, ledger: OutputLedger) -> list[TopicPartition]:
        """Document partitions whose position is past the high watermark lost their log: read them again.

        Returns the partitions found so (each also requests a reset).
        """
        lost = []
        if consumer is None:
            return lost
        for tp in list(consumer.assignment()):
            hw = consumer.highwater(tp)
            if hw is None:
                continue
            nxt = ledger.next_offset.get(tp)
            pos = self.known_position(consumer, tp)
            if (nxt is not None and nxt > hw) or (pos is not None and pos > hw):
                self.request("documents_topic")
                ledger.forget([tp])
                consumer.seek_to_beginning(tp)
                lost.append(tp)
                event(log, "documents_log_lost", logging.WARNING, topic=tp.topic, partition=tp.partition,
                      processed_up_to=nxt, position=pos, highwater=hw, action="reading the partition from the beginning")
        return lost

    @staticmethod
    def known_position(consumer: Any, tp: TopicPartition) -> int | None:
        """The consumer's fetch position if it is known, without any network call.

        ``KafkaConsumer.position()`` may block on the coordinator, and a JoinGroup reply
        that arrives while the loop is outside ``poll()`` is lost on kafka-python 3.0.12;
        so this reads the subscription state (kafka-python internals; None if they change).
        """
        try:
            position = consumer._subscription.assignment[tp].position
            return None if position is None else int(position.offset)
        except Exception:  # noqa: BLE001 - internals of another version: skip this check
            return None

    def handle(self, consumer: Any, ledger: OutputLedger, **context: Any) -> bool:
        """Recover from a requested reset; True when it starts a new episode (producer replaced, outputs resent).

        ``context`` fields (seeds, model version) go to the ``broker_reset`` event.
        """
        self.requested.clear()
        sources, self.sources = sorted(self.sources), set()
        now = self.clock()
        new_episode = now - self.last_reset > RESET_EPISODE_S
        self.last_reset = now
        try:
            created = kafka_io.ensure_topics(self.settings, timeout_s=10.0)
        except ConnectionError as exc:
            created = []
            event(log, "topics_recreate_failed", logging.WARNING, error=str(exc))
        ledger.forget()
        # Positions (and cached committed offsets) refer to the old logs: read the new ones from the beginning,
        # now and for partitions assigned during this episode.
        self.seek_until = now + RESET_EPISODE_S
        parts = list(consumer.assignment()) if consumer is not None else []
        if parts:
            consumer.seek_to_beginning(*parts)
        if not new_episode:
            return False
        if self.on_episode is not None:
            self.on_episode()
        resent = ledger.replace_producer()
        event(log, "broker_reset", logging.WARNING, sources=sources, topics_created=created, resent=resent,
              **context, action="topics recreated, old offsets dropped, seeds and models kept")
        return True

    def on_assigned(self, consumer: Any, assigned: set[TopicPartition]) -> bool:
        """Partitions assigned shortly after a reset are read from the beginning; True if they were."""
        if assigned and self.clock() < self.seek_until:
            consumer.seek_to_beginning(*assigned)
            event(log, "partitions_read_from_beginning", partitions=sorted(tp.partition for tp in assigned),
                  reason="assigned shortly after a broker reset")
            return True
        return False


REFRESH_EVERY_S = 5.0  # an unassigned member asks for fresh metadata this often


def coordinator_state(consumer: Any) -> str | None:
    """The group coordinator's member state (``stable``, ``rebalancing``, ``unjoined``), None if unknown.

    Reads kafka-python internals without any network call (None if they change).
    """
    try:
        return str(consumer._coordinator.state).rsplit(".", 1)[-1].strip("<>").lower()
    except Exception:  # noqa: BLE001 - internals of another version
        return None


def coordinator_reachable(consumer: Any) -> bool:
    """The consumer knows its group coordinator and is connected to it (kafka-python internals)."""
    try:
        return not consumer._coordinator.coordinator_unknown()
    except Exception:  # noqa: BLE001 - internals of another version
        return False


def request_metadata(consumer: Any) -> bool:
    """Ask the consumer's client to refresh its cluster metadata at its next poll; False if it cannot."""
    try:
        consumer._client.cluster.request_update()
        return True
    except Exception:  # noqa: BLE001 - internals of another version
        return False


def rejoin_limit_s(settings: Any) -> float:
    """How long a member may wait outside its group before it is replaced.

    A coordinator completes or abandons a rebalance within the rebalance timeout
    (kafka-python sends ``max_poll_interval_ms``) plus a session: a member still
    waiting after that will not be answered.
    """
    return (settings.max_poll_interval_ms + settings.session_timeout_ms) / 1000


class AssignmentWatchdog:
    """Notices a documents consumer that stays without partitions and says when to replace it.

    A group member without partitions is normal when the group has more members than
    the topic has partitions: its coordinator state is then ``stable``. Two other
    cases are not, and nothing in kafka-python 3.0.12 ends them by itself:

    * the member joined while its topic did not exist (a broker that came back empty
      and topics not created yet): it is stable with nothing assigned, and would only
      see the topic at its next metadata refresh (``metadata_max_age_ms``, five
      minutes by default). Remedy: ask for metadata every :data:`REFRESH_EVERY_S`.
    * a rejoin that never completes (a JoinGroup reply lost while the loop was
      outside ``poll()``): the state stays ``rebalancing``/``unjoined``. Remedy:
      after ``limit_s`` (:func:`rejoin_limit_s`: longer than any rebalance the
      coordinator may run; a new group's first join takes about 20 s on Tansu) the
      worker closes the consumer and subscribes a new one.

    Parameters
    ----------
    limit_s : float
        How long a member may stay unassigned and not stable before it is replaced.
    clock : callable
        Monotonic clock (seconds), injectable for tests.
    """

    def __init__(self, limit_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit_s = limit_s
        self.clock = clock
        self.since: float | None = None
        self.refreshed = -1e18

    def check(self, consumer: Any) -> str | None:
        """Called once per loop; returns the reason to replace ``consumer``, or None."""
        if consumer is None or consumer.assignment():
            self.since = None
            return None
        now = self.clock()
        if self.since is None:
            self.since = now
        if now - self.refreshed >= REFRESH_EVERY_S:
            self.refreshed = now
            request_metadata(consumer)
        waited = now - self.since
        if waited < self.limit_s:
            return None
        state = coordinator_state(consumer)
        if state is None or state == "stable" or not coordinator_reachable(consumer):
            return None  # a member of a larger group, or a broker that is down: a new consumer would not help
        self.since = now
        return f"no partitions for {waited:.0f} s while its group membership stays {state}"
