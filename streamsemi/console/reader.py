"""The console's reader thread: one group-less consumer (``assign()``) over the topics it shows.

Tables (control, clusters, suggestions) are read from the beginning; streams (documents,
assignments, labels) from at most ``backfill`` records before the end of each partition,
so that a console started on a long-running deployment does not replay the whole history
(the tables are bounded anyway). Topics that do not exist yet (the clusters and suggestions
topics before their worker runs) are looked for again every ``rescan_s`` and adopted when
they appear.

A record is one record: whatever its value holds (nesting 100,000 levels deep, numbers beyond a
double, bytes that are not UTF-8, fields of the wrong type), :meth:`ConsoleState.ingest` skips and
counts it, and the reader logs ``console_record_skipped`` with its topic, partition, offset and the
reason (at most :data:`SKIP_LOGS_PER_WINDOW` lines per :data:`SKIP_LOG_WINDOW_S`, the others counted
in the next line's ``suppressed``) and goes on with the next record.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from kafka import TopicPartition

from streamsemi.console.state import ConsoleState
from streamsemi.core.logs import event
from streamsemi.service.config import Settings
from streamsemi.service.kafka_io import bootstrap_timeout, make_reader

log = logging.getLogger("streamsemi.console")

#: kinds read from the beginning (tables whose every key matters)
FROM_BEGINNING = ("control", "clusters", "suggestions")


def topic_kinds(settings: Settings) -> dict[str, str]:
    """topic name -> kind. The clusters and suggestions topics come from settings when they exist."""
    v = settings.values
    return {
        v["documents_topic"]: "documents",
        v["assignments_topic"]: "assignments",
        v["labels_topic"]: "labels",
        v["control_topic"]: "control",
        v.get("clusters_topic") or "streamsemi.clusters": "clusters",
        v.get("suggestions_topic") or "streamsemi.suggestions": "suggestions",
    }


#: how long the reader waits for a broker before it reports the failure and tries again (kafka-python: 30 s)
BOOTSTRAP_TIMEOUT_MS = 10_000
#: seconds with no open connection to any broker after which a connected reader reports Kafka unreachable
#: (kafka-python reconnects by itself and raises nothing, so a broker lost after start was never shown)
DISCONNECTED_AFTER_S = 5.0
#: skipped records logged one by one per window; beyond, counted in the next line's ``suppressed``
SKIP_LOGS_PER_WINDOW = 20
SKIP_LOG_WINDOW_S = 60.0


def broker_connections(consumer: Any) -> float | None:
    """Open broker connections of a kafka-python client (its ``connection-count`` metric); None when
    the client does not report it (metrics disabled), which counts as connected."""
    try:
        value = consumer.metrics().get("consumer-metrics", {}).get("connection-count")
    except Exception:  # noqa: BLE001 - a metric that cannot be read says nothing about the broker
        return None
    return None if value is None else float(value)


class TopicReader(threading.Thread):
    """Feeds :class:`ConsoleState` from the topics, on a daemon thread.

    Parameters
    ----------
    settings : Settings
    state : ConsoleState
    backfill : int
        Records per partition read back from the end of the stream topics at start.
    rescan_s : float
        Seconds between looks for topics not yet assigned.
    """

    def __init__(self, settings: Settings, state: ConsoleState, backfill: int = 20_000, rescan_s: float = 5.0) -> None:
        super().__init__(name="console-reader", daemon=True)
        self.settings = settings
        self.state = state
        self.backfill = backfill
        self.rescan_s = rescan_s
        self.kinds = topic_kinds(settings)
        self.stop_event = threading.Event()
        self.caught_up = threading.Event()
        self.assigned: set[str] = set()
        self.errors = 0
        #: records skipped as malformed (the state counts them per kind too)
        self.skipped = 0
        self._skip_window = (0.0, 0)   # (window start, lines logged in it)
        self._skips_unlogged = 0
        #: a client to Kafka is up (set once one bootstraps, cleared by a failure) and the last failure's text
        self.connected = False
        self.last_error: str | None = None
        # stream partitions whose first fetch is checked against the high watermark: a broker whose
        # ListOffsets answer is behind its log (the embedded Tansu reports one past the last batch's
        # base) would otherwise make the console replay the whole stream
        self._check_backfill: set[TopicPartition] = set()
        #: the next offset to read per partition (a reconnect goes on from there: nothing read twice)
        self._next: dict[TopicPartition, int] = {}

    def _assign_new(self, consumer: Any) -> None:
        present = consumer.topics()
        new = [t for t in self.kinds if t in present and t not in self.assigned]
        if not new:
            return
        positions = {tp: consumer.position(tp) for tp in consumer.assignment()}
        tps_new = [TopicPartition(t, p) for t in new for p in sorted(consumer.partitions_for_topic(t) or ())]
        if not tps_new:
            return
        consumer.assign(list(positions) + tps_new)
        for tp, pos in positions.items():
            consumer.seek(tp, pos)
        starts = consumer.beginning_offsets(tps_new)
        ends = consumer.end_offsets(tps_new)
        for tp in tps_new:
            if tp in self._next:  # assigned again after a reconnect: go on where this reader was
                consumer.seek(tp, self._next[tp])
            elif self.kinds[tp.topic] in FROM_BEGINNING:
                consumer.seek(tp, starts[tp])
            else:
                consumer.seek(tp, max(starts[tp], ends[tp] - self.backfill))
                self._check_backfill.add(tp)
        self.assigned.update(new)
        event(log, "console_topics_assigned", topics=sorted(new))

    def run(self) -> None:
        while not self.stop_event.is_set():
            consumer = None
            try:
                consumer = make_reader(self.settings, client_id="streamsemi-console", allow_auto_create_topics=False,
                                       **bootstrap_timeout(BOOTSTRAP_TIMEOUT_MS))
                self.connected, self.last_error = True, None
                self.assigned.clear()
                self._check_backfill.clear()
                last_scan = 0.0
                down_since: float | None = None
                while not self.stop_event.is_set():
                    down_since = self._watch_connection(consumer, down_since)
                    if time.monotonic() - last_scan >= self.rescan_s and len(self.assigned) < len(self.kinds):
                        self._assign_new(consumer)
                        last_scan = time.monotonic()
                    if not consumer.assignment():
                        self.stop_event.wait(0.5)
                        continue
                    batch = consumer.poll(timeout_ms=300, max_records=5000)
                    for tp, records in batch.items():
                        kind = self.kinds[tp.topic]
                        if tp in self._check_backfill:
                            self._check_backfill.discard(tp)
                            hw = consumer.highwater(tp)
                            if hw is not None and records and records[0].offset < hw - self.backfill:
                                consumer.seek(tp, hw - self.backfill)
                                continue
                        for r in records:
                            why = self.state.ingest(kind, r.key, r.value, tp.partition, r.offset, r.timestamp)
                            self._next[tp] = r.offset + 1
                            if why is not None:
                                self._skip(tp, r.offset, kind, why)
                    if not batch and not self.caught_up.is_set():
                        self.caught_up.set()
            except Exception as exc:  # noqa: BLE001 - keep reading after broker trouble
                self.errors += 1
                self.connected, self.last_error = False, f"{type(exc).__name__}: {exc}"[:500]
                event(log, "console_reader_error", logging.WARNING, error=self.last_error)
                self.stop_event.wait(1.0)
            finally:
                if consumer is not None:
                    try:
                        consumer.close()
                    except Exception:  # noqa: BLE001
                        pass

    def _skip(self, tp: TopicPartition, offset: int, kind: str, why: str) -> None:
        """Count one skipped record and log it (rate-limited: a topic full of bad records floods no log)."""
        self.skipped += 1
        now = time.monotonic()
        start, logged = self._skip_window
        if now - start >= SKIP_LOG_WINDOW_S:
            start, logged = now, 0
        if logged >= SKIP_LOGS_PER_WINDOW:
            self._skips_unlogged += 1
            self._skip_window = (start, logged)
            return
        event(log, "console_record_skipped", logging.WARNING, topic=tp.topic, partition=tp.partition, offset=offset,
              kind=kind, reason=why, skipped=self.skipped, suppressed=self._skips_unlogged)
        self._skips_unlogged = 0
        self._skip_window = (start, logged + 1)

    def _watch_connection(self, consumer: Any, down_since: float | None) -> float | None:
        """Mark the reader disconnected after :data:`DISCONNECTED_AFTER_S` without a broker connection, and
        connected again once one is open; returns when the connections went (None while some are open)."""
        n = broker_connections(consumer)
        now = time.monotonic()
        if n is None or n > 0:
            if not self.connected:
                self.connected, self.last_error = True, None
                event(log, "console_reader_reconnected")
            return None
        if down_since is None:
            return now
        if self.connected and now - down_since >= DISCONNECTED_AFTER_S:
            self.errors += 1
            self.connected = False
            self.last_error = (f"no connection to any broker for {DISCONNECTED_AFTER_S:.0f} s "
                               "(the reader keeps trying)")
            event(log, "console_reader_error", logging.WARNING, error=self.last_error)
        return down_since

    def status(self) -> dict[str, Any]:
        """``connected``, the last ``error`` (None after a successful connection), how many ``errors`` and
        records ``skipped`` as malformed: every console page warns when Kafka cannot be reached, instead of
        showing empty tables."""
        return {"connected": self.connected, "error": self.last_error, "errors": self.errors, "skipped": self.skipped}

    def stop(self) -> None:
        self.stop_event.set()
