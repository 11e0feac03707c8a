"""The Kafka worker: consume, parse, vectorise, window, refit, assign, emit, commit.

Data flow (docs/architecture.md): documents are polled from a consumer group on
the documents topic; control messages are read by :class:`ControlReader` from
every partition of the control topic; the :class:`~streamsemi.engine.Engine`
does the rest. Offsets are committed only after the outputs (assignments and
dead letters) of the polled batch are produced and flushed (at-least-once); a
document still buffered (no model yet) holds back its partition's commit.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections import defaultdict
from typing import Any

from kafka import ConsumerRebalanceListener, TopicPartition
from kafka.errors import CommitFailedError, KafkaError
from kafka.structs import OffsetAndMetadata

from streamsemi.config import Settings
from streamsemi.engine import Assignment, Engine, EngineConfig
from streamsemi.httpserver import StatusServer
from streamsemi.kafka_io import (
    ControlReader,
    ensure_topics,
    make_document_consumer,
    make_producer,
)
from streamsemi.logs import event
from streamsemi.messages import (
    ControlMessage,
    Limits,
    Rejected,
    dead_letter,
    encode_json,
    parse_control,
    parse_document,
)
from streamsemi.telemetry import Telemetry

log = logging.getLogger("streamsemi.worker")


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def on_partitions_revoked(self, revoked: Any) -> None:
        self.worker.on_revoked(set(revoked))

    def on_partitions_assigned(self, assigned: Any) -> None:
        event(log, "partitions_assigned", partitions=sorted(f"{tp.topic}:{tp.partition}" for tp in assigned))


class Worker:
    """Long-running streamsemi worker.

    Parameters
    ----------
    settings : Settings
        Effective settings (:func:`streamsemi.config.resolve`).
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.limits = Limits(settings.max_message_bytes, settings.max_text_chars,
                             max_labels_per_doc=settings.max_labels_per_doc)
        self.telemetry = Telemetry(max_class_labels=min(settings.max_classes, 100))
        self.engine = Engine(EngineConfig.from_settings(settings), self.telemetry)
        self.stop_event = threading.Event()
        self.consumer: Any = None
        self.producer: Any = None
        self.control: ControlReader | None = None
        self.http: StatusServer | None = None
        self.next_offset: dict[TopicPartition, int] = {}
        self.committed: dict[TopicPartition, int] = {}
        self.last_loop = time.time()
        self.paused = False
        self.newest_record_ts: float | None = None

    # ------------------------------------------------------------------ health
    def health(self) -> tuple[bool, dict[str, Any]]:
        age = time.time() - self.last_loop
        return age < max(60.0, self.settings.max_poll_interval_ms / 1000), {"loop_age_s": round(age, 3)}

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        assigned = bool(self.consumer is not None and self.consumer.assignment())
        ok = assigned and self.engine.ready
        self.telemetry.ready.set(1 if ok else 0)
        return ok, {"partitions_assigned": assigned, "model_loaded": self.engine.ready, **self.engine.stats(),
                    "refit_errors": self.engine.last_refit_error}

    def broker_error(self, kind: str) -> None:
        self.telemetry.broker_errors.labels(kind).inc()

    # ------------------------------------------------------------------ lifecycle
    def install_signal_handlers(self) -> None:
        def handler(signum: int, _frame: Any) -> None:
            event(log, "signal", signal=signal.Signals(signum).name)
            self.stop_event.set()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def start(self) -> None:
        s = self.settings
        self.http = StatusServer(s.metrics_host, s.metrics_port, self.telemetry.registry, self.health,
                                 self.readiness).start()
        created = ensure_topics(s)
        event(log, "worker_starting", bootstrap_servers=s.bootstrap_servers, group=s.group_id,
              algorithms=s.algorithm_list, primary=s.primary_algorithm, topics_created=created,
              metrics=f"http://{s.metrics_host}:{self.http.port}/metrics")
        self.producer = make_producer(s)
        self.control = ControlReader(s, on_error=self.broker_error)
        self.control.start()
        self.consumer = make_document_consumer(s)
        self.consumer.subscribe([s.documents_topic], listener=_Rebalance(self))

    def run(self) -> int:
        """Run until SIGTERM/SIGINT (or :meth:`stop`); returns the exit code."""
        self.start()
        try:
            while not self.stop_event.is_set():
                self.step()
        finally:
            self.shutdown()
        return 0

    def stop(self) -> None:
        self.stop_event.set()

    def shutdown(self) -> None:
        """Flush outputs, commit, leave the group, stop threads (bounded by shutdown_grace_s)."""
        t0 = time.monotonic()
        try:
            if self.producer is not None:
                self.producer.flush(timeout=self.settings.shutdown_grace_s)
            if self.consumer is not None:
                self._commit()
        except Exception as exc:  # noqa: BLE001
            event(log, "shutdown_commit_failed", logging.WARNING, error=str(exc))
        for closer in (self.consumer, self.producer):
            if closer is not None:
                try:
                    closer.close(timeout=max(1.0, self.settings.shutdown_grace_s - (time.monotonic() - t0)))
                except TypeError:
                    closer.close()
                except Exception:  # noqa: BLE001
                    pass
        if self.control is not None:
            self.control.stop()
        if self.http is not None:
            self.http.stop()
        event(log, "worker_stopped", seconds=round(time.monotonic() - t0, 3), **self.engine.stats())

    # ------------------------------------------------------------------ one iteration
    def step(self) -> None:
        self.last_loop = time.time()
        self._apply_control()
        try:
            polled = self.consumer.poll(timeout_ms=500, max_records=self.settings.max_poll_records)
        except KafkaError as exc:
            self.broker_error("poll")
            event(log, "poll_failed", logging.WARNING, error=f"{type(exc).__name__}: {exc}")
            time.sleep(1.0)
            return
        docs = []
        dead: list[tuple[dict, Any]] = []
        n = 0
        for tp, records in polled.items():
            for r in records:
                n += 1
                parsed = parse_document(r.value, self.limits)
                if isinstance(parsed, Rejected):
                    dead.append((dead_letter(r.value, parsed.reason, parsed.detail, tp.topic, tp.partition, r.offset, r.key), parsed))
                else:
                    parsed.source = (tp, r.offset)
                    docs.append(parsed)
                self.next_offset[tp] = r.offset + 1
                if r.timestamp is not None and r.timestamp > 0:
                    ts = r.timestamp / 1000
                    self.newest_record_ts = ts if self.newest_record_ts is None else max(self.newest_record_ts, ts)
        self.telemetry.consumed.inc(n)
        result = self.engine.process(docs)
        for doc, rej in result.rejected:
            tp, offset = doc.source
            raw = encode_json({"id": doc.id, "text": doc.text})
            dead.append((dead_letter(raw, rej.reason, rej.detail, tp.topic, tp.partition, offset), rej))
        for op, rej in self.engine.drain_dead():
            dead.append((dead_letter(encode_json(op), rej.reason, rej.detail, self.settings.control_topic), rej))
        self._emit(result.assignments, dead)
        self._reemit_resolved()
        try:
            self.producer.flush(timeout=30)
            self._commit()
        except CommitFailedError as exc:
            self.broker_error("commit")
            event(log, "commit_failed", logging.WARNING, error=str(exc))
        except KafkaError as exc:
            self.broker_error("produce")
            event(log, "flush_failed", logging.WARNING, error=f"{type(exc).__name__}: {exc}")
        self._update_flow_control()
        self._update_lag()
        self.readiness()  # keeps streamsemi_ready current without anyone polling /readyz

    def _apply_control(self) -> None:
        if self.control is None:
            return
        dead = []
        for raw, partition, offset, key in self.control.drain():
            msg = parse_control(raw, self.limits)
            if isinstance(msg, Rejected):
                dead.append((dead_letter(raw, msg.reason, msg.detail, self.settings.control_topic, partition, offset, key), msg))
                continue
            for op, rej in self._apply(msg, offset):
                dead.append((dead_letter(encode_json(op), rej.reason, rej.detail, self.settings.control_topic, partition, offset), rej))
        if dead:
            self._emit([], dead)

    def _apply(self, msg: ControlMessage, offset: int) -> list[tuple[dict, Rejected]]:
        if msg.op == "refit":
            self.engine.request_refit("request")
            return []
        if msg.op == "unlabel":
            self.engine.unlabel(msg.id, offset)
            return []
        return self.engine.label(msg.id, msg.labels, msg.text, offset, msg.origin, msg.label_offset)

    def _emit(self, assignments: list[Assignment], dead: list[tuple[dict, Rejected]]) -> None:
        s = self.settings
        now = time.time()
        for a in assignments:
            self.producer.send(s.assignments_topic, key=a.id.encode("utf-8"), value=encode_json(a.to_message()),
                               headers=[("model_version", str(a.model_version).encode())])
            if a.primary and a.document is not None:
                self.telemetry.latency.observe(max(0.0, now - a.document.arrival))
        for value, rej in dead:
            self.telemetry.dead_letters.labels(rej.reason).inc()
            self.producer.send(s.deadletter_topic, value=encode_json(value))
            event(log, "dead_letter", logging.DEBUG, reason=rej.reason, detail=rej.detail,
                  topic=value.get("topic"), partition=value.get("partition"), offset=value.get("offset"))

    def _reemit_resolved(self) -> None:
        for seed in self.engine.drain_resolved():
            if seed.label_offset is None:
                continue
            msg = {"op": "label", "id": seed.id, "labels": list(seed.labels), "text": seed.text,
                   "origin": "resolved", "label_offset": seed.label_offset}
            self.producer.send(self.settings.control_topic, key=seed.id.encode("utf-8"), value=encode_json(msg))

    # ------------------------------------------------------------------ offsets
    def _safe_offsets(self) -> dict[TopicPartition, int]:
        held: dict[TopicPartition, int] = {}
        for doc, _ in self.engine.buffer:
            if doc.source is not None:
                tp, off = doc.source
                held[tp] = min(off, held.get(tp, off))
        return {tp: held.get(tp, nxt) for tp, nxt in self.next_offset.items()}

    def _commit(self, only: set[TopicPartition] | None = None) -> None:
        todo = {tp: off for tp, off in self._safe_offsets().items()
                if (only is None or tp in only) and self.committed.get(tp) != off}
        if not todo:
            return
        self.consumer.commit({tp: OffsetAndMetadata(off, "", -1) for tp, off in todo.items()})
        self.committed.update(todo)

    def on_revoked(self, revoked: set[TopicPartition]) -> None:
        """Flush and commit what was processed for ``revoked``; forget their buffered documents."""
        try:
            self.producer.flush(timeout=30)
            self._commit(revoked)
        except Exception as exc:  # noqa: BLE001
            event(log, "revoke_commit_failed", logging.WARNING, error=str(exc))
        dropped = self.engine.drop_buffered(lambda d: d.source is not None and d.source[0] in revoked)
        for tp in revoked:
            self.next_offset.pop(tp, None)
            self.committed.pop(tp, None)
        event(log, "partitions_revoked", partitions=sorted(f"{tp.topic}:{tp.partition}" for tp in revoked),
              dropped_buffered=dropped)

    def _update_flow_control(self) -> None:
        parts = self.consumer.assignment()
        if self.engine.buffer_full and not self.paused and parts:
            self.consumer.pause(*parts)
            self.paused = True
            event(log, "consumption_paused", buffered=len(self.engine.buffer), reason="no model yet")
        elif self.paused and not self.engine.buffer_full:
            self.consumer.resume(*self.consumer.paused())
            self.paused = False
            event(log, "consumption_resumed")

    def _update_lag(self) -> None:
        lags: dict[int, int] = defaultdict(int)
        for tp in self.consumer.assignment():
            hw = self.consumer.highwater(tp)
            if hw is None:
                continue
            pos = self.next_offset.get(tp)
            if pos is None:
                continue
            lags[tp.partition] = max(0, hw - pos)
            self.telemetry.lag.labels(tp.topic, str(tp.partition)).set(lags[tp.partition])
        if self.newest_record_ts is not None:
            self.telemetry.lag_seconds.set(max(0.0, time.time() - self.newest_record_ts) if any(lags.values()) else 0.0)
