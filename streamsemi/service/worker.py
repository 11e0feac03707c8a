"""The Kafka worker: consume, parse, vectorise, window, refit, assign, emit, commit.

Data flow (docs/architecture.md): documents are polled from a consumer group on
the documents topic; control messages are read by :class:`ControlReader` from
every partition of the control topic; the :class:`~streamsemi.engine.Engine`
does the rest. Offsets are committed only after the outputs (assignments and
dead letters) of the polled batch are produced and acknowledged (at-least-once);
a document still buffered (no model yet) holds back its partition's commit, and so
does an output whose send failed or is not acknowledged yet (it is sent again).

Reliability (docs/reliability.md): the engine's state is checkpointed to
``state_dir`` (:mod:`streamsemi.service.checkpoint`) every ``checkpoint_interval_s`` and at
shutdown, and restored at start. A broker that lost its data (restarted empty) is
detected (missing topics, a control-topic position past the log end, a document
offset past the high watermark): topics are created again, offsets that refer to the
old log are dropped, the producer is replaced and unacknowledged outputs are sent
again; seeds and models stay in memory.
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
from kafka.future import Future
from kafka.structs import OffsetAndMetadata

from streamsemi.core.logs import event
from streamsemi.core.messages import (
    ControlMessage,
    Limits,
    Rejected,
    dead_letter,
    encode_json,
    parse_control,
    parse_document,
)
from streamsemi.core.telemetry import Telemetry
from streamsemi.engine import Assignment, Engine, EngineConfig
from streamsemi.service import checkpoint
from streamsemi.service.config import Settings
from streamsemi.service.httpserver import StatusServer
from streamsemi.service.kafka_io import (
    BrokerWatch,
    ControlReader,
    ensure_topics,
    make_document_consumer,
    make_producer,
    make_reader,
)

log = logging.getLogger("streamsemi.service.worker")

RESET_EPISODE_S = 30.0  # detections of one broker loss within this time count once
FLUSH_TIMEOUT_S = 10.0


class _Out:
    """One output record and the future of its last send."""

    __slots__ = ("topic", "key", "value", "headers", "future")

    def __init__(self, topic: str, key: bytes | None, value: bytes, headers: list | None) -> None:
        self.topic, self.key, self.value, self.headers = topic, key, value, headers
        self.future: Any = None


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def on_partitions_revoked(self, revoked: Any) -> None:
        self.worker.on_revoked(set(revoked))

    def on_partitions_assigned(self, assigned: Any) -> None:
        event(log, "partitions_assigned", partitions=sorted(f"{tp.topic}:{tp.partition}" for tp in assigned))
        self.worker.on_assigned(set(assigned))


class Worker:
    """Long-running streamsemi worker.

    Parameters
    ----------
    settings : Settings
        Effective settings (:func:`streamsemi.service.config.resolve`).
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
        self.unsettled: list[_Out] = []   # outputs not acknowledged yet (commits wait for them)
        self.watch: BrokerWatch | None = None
        self.reset_requested = threading.Event()
        self.reset_sources: set[str] = set()
        self.last_reset = -1e18
        self.reset_seek_until = -1e18
        self.last_checkpoint = time.monotonic()
        self.restore_report: checkpoint.RestoreReport | None = None
        self.checkpointer = (checkpoint.Checkpointer(settings.state_dir, self._checkpoint_done, self._checkpoint_failed)
                             if settings.state_dir else None)
        self.checkpoint_signature: tuple | None = None
        self.records_seen = 0
        self.catchup_from: dict[TopicPartition, int] = {}   # checkpoint offsets not caught up yet
        self.catchup_todo: set[TopicPartition] = set()
        t = self.telemetry
        self.m_resets, self.m_resends, self.m_checkpoints = t.broker_resets, t.output_resends, t.checkpoints
        self.m_checkpoint_ts, self.m_checkpoint_bytes = t.last_checkpoint, t.checkpoint_bytes

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

    def on_broker_reset(self, source: str) -> None:
        """Called (from any thread) when the broker seems to have lost its data."""
        self.reset_sources.add(source)
        self.reset_requested.set()

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
              metrics=f"http://{s.metrics_host}:{self.http.port}/metrics", state_dir=s.state_dir or None)
        if s.state_dir:
            self.restore_report = checkpoint.restore(self.engine, s.state_dir)
            self.catchup_from = {TopicPartition(t, p): o for (t, p), o in self.restore_report.offsets.items()
                                 if t == s.documents_topic}
            if self.restore_report.status == "restored":
                self.checkpoint_signature = self._signature()  # nothing new to write yet
            if self.engine.models and not self.engine.ready:
                self.engine.request_refit("restore")  # rebuild the models that could not be restored
        self.last_checkpoint = time.monotonic()
        self.producer = self._make_producer()
        self.control = ControlReader(s, on_error=self.broker_error, on_reset=self.on_broker_reset)
        self.control.start()
        self.watch = BrokerWatch(s, on_reset=self.on_broker_reset, on_error=self.broker_error)
        self.watch.start()
        self.consumer = make_document_consumer(s)
        self.consumer.subscribe([s.documents_topic], listener=_Rebalance(self))

    def _make_producer(self) -> Any:
        # Never auto-create topics with the broker's defaults; do not block the loop for a minute on metadata.
        return make_producer(self.settings, allow_auto_create_topics=False, max_block_ms=10000)

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
        grace = self.settings.shutdown_grace_s
        try:
            if self.producer is not None:
                self._resend()
                self.producer.flush(timeout=max(1.0, grace * 0.5))
            if self.consumer is not None and self._settle():
                self._commit()
            elif self.consumer is not None:
                event(log, "shutdown_outputs_unacknowledged", logging.WARNING, records=len(self.unsettled),
                      action="not committing; their documents are processed again at the next start")
        except Exception as exc:  # noqa: BLE001
            event(log, "shutdown_commit_failed", logging.WARNING, error=str(exc))
        if self.watch is not None:
            self.watch.stop()
        self._checkpoint("shutdown", wait=True)
        for closer in (self.consumer, self.producer):
            if closer is not None:
                try:
                    closer.close(timeout=max(0.5, min(5.0, grace - (time.monotonic() - t0) - 0.5)))
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
        if self.reset_requested.is_set():
            self._handle_broker_reset()
        if self.catchup_todo:
            self._catch_up()
        self._check_positions()
        self._resend()
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
        self.records_seen += n
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
            self.producer.flush(timeout=FLUSH_TIMEOUT_S)
        except KafkaError as exc:
            self.broker_error("produce")
            event(log, "flush_failed", logging.WARNING, error=f"{type(exc).__name__}: {exc}",
                  unacknowledged=sum(1 for o in self.unsettled if not o.future.is_done))
        try:
            if self._settle():
                self._commit()
                if (self.checkpointer and time.monotonic() - self.last_checkpoint >= self.settings.checkpoint_interval_s
                        and self.consumer.assignment()):  # not while joining: keep this thread in poll()
                    self._checkpoint("interval")
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

    def _send(self, out: _Out) -> None:
        """Send one output, remembering it until the broker acknowledges it."""
        try:
            out.future = self.producer.send(out.topic, key=out.key, value=out.value, headers=out.headers)
        except Exception as exc:  # noqa: BLE001 - e.g. no metadata while a topic is being recreated: send again later
            out.future = Future().failure(exc)
        self.unsettled.append(out)

    def _settle(self) -> bool:
        """Forget acknowledged outputs; True when every output sent so far is acknowledged."""
        keep = []
        for out in self.unsettled:
            f = out.future
            if f is None or not f.is_done or f.failed():
                keep.append(out)
        self.unsettled = keep
        return not keep

    def _resend(self) -> None:
        """Send again the outputs whose send failed (after a broker error or a producer replacement)."""
        failed = [o for o in self.unsettled if o.future is None or (o.future.is_done and o.future.failed())]
        if not failed:
            return
        self.unsettled = [o for o in self.unsettled if o not in failed]
        event(log, "outputs_resent", logging.WARNING, records=len(failed),
              error=str(next((o.future.exception for o in failed if o.future is not None), None)))
        self.m_resends.inc(len(failed))
        for o in failed:
            self._send(o)

    def _emit(self, assignments: list[Assignment], dead: list[tuple[dict, Rejected]]) -> None:
        s = self.settings
        now = time.time()
        for a in assignments:
            self._send(_Out(s.assignments_topic, a.id.encode("utf-8"), encode_json(a.to_message()),
                            [("model_version", str(a.model_version).encode())]))
            if a.primary and a.document is not None:
                self.telemetry.latency.observe(max(0.0, now - a.document.arrival))
        for value, rej in dead:
            self.telemetry.dead_letters.labels(rej.reason).inc()
            self._send(_Out(s.deadletter_topic, None, encode_json(value), None))
            event(log, "dead_letter", logging.DEBUG, reason=rej.reason, detail=rej.detail,
                  topic=value.get("topic"), partition=value.get("partition"), offset=value.get("offset"))

    def _reemit_resolved(self) -> None:
        for seed in self.engine.drain_resolved():
            if seed.label_offset is None:
                continue
            msg = {"op": "label", "id": seed.id, "labels": list(seed.labels), "text": seed.text,
                   "origin": "resolved", "label_offset": seed.label_offset}
            self._send(_Out(self.settings.control_topic, seed.id.encode("utf-8"), encode_json(msg), None))

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
            self.producer.flush(timeout=FLUSH_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001
            event(log, "revoke_flush_failed", logging.WARNING, error=str(exc))
        try:
            if self._settle():
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
        reason = "no model yet" if self.engine.buffer_full else ("outputs not acknowledged" if self.unsettled else None)
        if reason and not self.paused and parts:
            self.consumer.pause(*parts)
            self.paused = True
            event(log, "consumption_paused", buffered=len(self.engine.buffer), unacknowledged=len(self.unsettled),
                  reason=reason)
        elif self.paused and reason is None:
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

    # ------------------------------------------------------------------ broker loss
    def _check_positions(self) -> None:
        """A document partition whose position is past its high watermark lost its log: read it again."""
        if self.consumer is None:
            return
        for tp in list(self.consumer.assignment()):
            hw = self.consumer.highwater(tp)
            if hw is None:
                continue
            nxt = self.next_offset.get(tp)
            pos = self._known_position(tp)
            if (nxt is not None and nxt > hw) or (pos is not None and pos > hw):
                self.on_broker_reset("documents_topic")
                self.next_offset.pop(tp, None)
                self.committed.pop(tp, None)
                self.consumer.seek_to_beginning(tp)
                event(log, "documents_log_lost", logging.WARNING, topic=tp.topic, partition=tp.partition,
                      processed_up_to=nxt, position=pos, highwater=hw, action="reading the partition from the beginning")

    def _known_position(self, tp: TopicPartition) -> int | None:
        """The consumer's fetch position if it is known, without any network call.

        ``KafkaConsumer.position()`` may block on the coordinator, and a JoinGroup reply
        that arrives while the loop is outside ``poll()`` is lost on kafka-python 3.0.12;
        so this reads the subscription state (kafka-python internals; None if they change).
        """
        try:
            state = self.consumer._subscription.assignment[tp]
            position = state.position
            return None if position is None else int(position.offset)
        except Exception:  # noqa: BLE001 - internals of another version: skip this check
            return None

    def _handle_broker_reset(self) -> None:
        """The broker lost its data: recreate topics, forget old offsets, replace the producer, send again."""
        self.reset_requested.clear()
        sources, self.reset_sources = sorted(self.reset_sources), set()
        now = time.monotonic()
        new_episode = now - self.last_reset > RESET_EPISODE_S
        self.last_reset = now
        try:
            created = ensure_topics(self.settings, timeout_s=10.0)
        except ConnectionError as exc:
            created = []
            event(log, "topics_recreate_failed", logging.WARNING, error=str(exc))
        self.next_offset.clear()
        self.committed.clear()
        # Positions (and cached committed offsets) refer to the old logs: read the new ones from the beginning,
        # now and for partitions assigned during this episode.
        self.reset_seek_until = now + RESET_EPISODE_S
        parts = list(self.consumer.assignment()) if self.consumer is not None else []
        if parts:
            self.consumer.seek_to_beginning(*parts)
        if not new_episode:
            return
        self.m_resets.inc()
        old = self.producer
        self.producer = self._make_producer()
        try:
            old.close(timeout=0)
        except Exception:  # noqa: BLE001 - the old producer talks to a log that no longer exists
            pass
        pending = [o for o in self.unsettled if not (o.future is not None and o.future.is_done and not o.future.failed())]
        self.unsettled = []
        for o in pending:
            self._send(o)
        self.m_resends.inc(len(pending))
        event(log, "broker_reset", logging.WARNING, sources=sources, topics_created=created, resent=len(pending),
              seeds=len(self.engine.seeds), model_version=self.engine.version,
              action="topics recreated, old offsets dropped, seeds and models kept")

    # ------------------------------------------------------------------ checkpoints
    def _signature(self) -> tuple:
        e = self.engine
        return (e.version, e.refit_count, len(e.window), len(e.seeds), len(e.pending), len(e._last_op),
                tuple(sorted((n, m.version) for n, m in e.models.items())), self.records_seen)

    def _checkpoint(self, reason: str, wait: bool = False) -> None:
        """Write a checkpoint in the background (or wait for it, at shutdown); skipped when nothing changed."""
        if self.checkpointer is None:
            return
        self.last_checkpoint = time.monotonic()
        if wait:
            self.checkpointer.wait(max(1.0, self.settings.shutdown_grace_s / 2))
        sig = self._signature()
        if sig == self.checkpoint_signature:
            return
        offsets = [[tp.topic, tp.partition, off] for tp, off in self.next_offset.items()]
        if self.checkpointer.submit(self.engine, reason, offsets):
            self.checkpoint_signature = sig
        if wait:
            self.checkpointer.wait(max(1.0, self.settings.shutdown_grace_s / 2))

    def _checkpoint_done(self, info: dict) -> None:
        self.m_checkpoints.labels("success").inc()
        self.m_checkpoint_ts.set(time.time())
        self.m_checkpoint_bytes.set(info["bytes"])
        event(log, "checkpoint_written", reason=info["reason"], path=info["path"], bytes=info["bytes"],
              seconds=info["seconds"], model_version=info["model_version"], skipped_models=info["skipped_models"],
              **info["counts"])

    def _checkpoint_failed(self, exc: Exception, reason: str) -> None:
        self.checkpoint_signature = None
        self.m_checkpoints.labels("failure").inc()
        event(log, "checkpoint_failed", logging.ERROR, reason=reason, error=f"{type(exc).__name__}: {exc}")

    # ------------------------------------------------------------------ window catch-up after a restore
    def on_assigned(self, assigned: set[TopicPartition]) -> None:
        self.catchup_todo |= {tp for tp in assigned if tp in self.catchup_from}
        if assigned and time.monotonic() < self.reset_seek_until:
            self.consumer.seek_to_beginning(*assigned)
            event(log, "partitions_read_from_beginning", partitions=sorted(tp.partition for tp in assigned),
                  reason="assigned shortly after a broker reset")

    def _catch_up(self) -> None:
        """Read back into the window the documents committed after the restored checkpoint was taken.

        They were assigned already (no output now), but the window must hold them:
        a seed label replayed from the control topic finds its document there. Without
        this a label applied after its document, whose re-emitted seed was lost in a
        crash, would wait forever.
        """
        todo, self.catchup_todo = self.catchup_todo, set()
        ranges: dict[TopicPartition, tuple[int, int]] = {}
        for tp in todo:
            start = self.catchup_from.pop(tp, None)
            try:
                end = self.consumer.committed(tp)
            except KafkaError as exc:
                event(log, "catch_up_failed", logging.WARNING, partition=tp.partition, error=str(exc))
                continue
            if start is not None and end is not None and end > start:
                ranges[tp] = (start, end)
        if not ranges:
            return
        t0 = time.monotonic()
        reader = make_reader(self.settings, client_id="streamsemi-catchup")
        docs = []
        try:
            reader.assign(list(ranges))
            for tp, (start, _) in ranges.items():
                reader.seek(tp, start)
            left = dict(ranges)
            while left and time.monotonic() - t0 < 30:
                for tp, records in reader.poll(timeout_ms=500, max_records=5000).items():
                    for r in records:
                        if tp in left and r.offset < left[tp][1]:
                            parsed = parse_document(r.value, self.limits)
                            if not isinstance(parsed, Rejected):
                                docs.append(parsed)
                for tp in list(left):
                    if reader.position(tp) >= left[tp][1]:
                        del left[tp]
        finally:
            reader.close()
        n = self.engine.absorb(docs)
        self._reemit_resolved()
        event(log, "window_caught_up", documents=n, partitions=sorted(tp.partition for tp in ranges),
              seconds=round(time.monotonic() - t0, 3), incomplete=sorted(tp.partition for tp in left))
