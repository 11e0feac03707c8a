"""The Kafka worker: consume, parse, vectorise, window, refit, assign, emit, commit.

Data flow (docs/architecture.md): documents are polled from a consumer group on
the documents topic; control messages are read by :class:`ControlReader` from
every partition of the control topic; the :class:`~streamsemi.engine.Engine`
does the rest. :meth:`Worker.step` delegates: poll -> parse -> ``engine.process``
-> emit into the :class:`~streamsemi.service.ledger.OutputLedger` -> commit once
every output is acknowledged -> checkpoint now and then.

At-least-once: a record's offset advances only after its outputs (assignments and
dead letters) were handed to the producer, and offsets are committed only once
every output is acknowledged; a document still buffered (no model yet) holds back
its partition's commit, an output whose send failed is sent again.

Processing errors are a designed path: when ``engine.process`` raises on a batch,
its documents are processed again one at a time and the one that raises is
dead-lettered (``processing_error`` with the exception type); an exception that
escapes a step never commits the records it was handling. A record that kills the
process is found after the restart through the in-flight marker
(:mod:`streamsemi.service.inflight`).

Reliability (docs/reliability.md): the engine's state is checkpointed to
``state_dir`` (:mod:`streamsemi.service.checkpoint`) every ``checkpoint_interval_s`` and at
shutdown, and restored at start. A broker that lost its data (restarted empty) is
handled by the :class:`~streamsemi.service.broker_reset.BrokerResetGuard`.
"""

from __future__ import annotations

import ipaddress
import logging
import signal
import threading
import time
from collections import defaultdict
from typing import Any

from kafka import ConsumerRebalanceListener, TopicPartition
from kafka.errors import CommitFailedError, KafkaError

from streamsemi.core import suggestions as sg
from streamsemi.core.logs import event
from streamsemi.core.messages import (
    ControlMessage,
    Document,
    Limits,
    Rejected,
    VerdictBlockError,
    cluster_event_key,
    dead_letter,
    encode_json,
    encode_key,
    encode_verdict_block,
    parse_control,
    parse_document,
    resolved_seed_op,
)
from streamsemi.core.telemetry import Telemetry, observe_many
from streamsemi.engine import Assignment, Engine, EngineConfig, VerdictBlock
from streamsemi.service import checkpoint, group_repair, kafka_io
from streamsemi.service.broker_reset import AssignmentWatchdog, BrokerResetGuard, rejoin_limit_s
from streamsemi.service.config import Settings, instance_name
from streamsemi.service.control_rejections import RejectedControl, fingerprint
from streamsemi.service.fitter import FIT_PRIORITY, FitProcess
from streamsemi.service.freshness import ModelFreshness
from streamsemi.service.gcpacer import GcPacer
from streamsemi.service.httpserver import StatusServer
from streamsemi.service.inflight import InFlightMarker
from streamsemi.service.kafka_io import (
    BrokerWatch,
    ControlReader,
    assign_all,
    ensure_topics,
    make_document_consumer,
    make_reader,
)
from streamsemi.service.ledger import Output, OutputLedger
from streamsemi.service.producer import BLOCK
from streamsemi.service.serving_state import serving_state
from streamsemi.service.streams import StreamEngines, StreamsCheckpointer

log = logging.getLogger("streamsemi.service.worker")

FLUSH_TIMEOUT_S = 10.0
CATCH_UP_MAX_S = 30.0  # seconds a start spends reading back documents committed after its checkpoint (Worker._catch_up)
CATCH_UP_RETRY_S = 30.0  # a catch-up cut short is tried again after this long while the partition stays assigned
REVISION_BUDGET_S = 0.1  # seconds of revision work per loop (Engine.revision_budget_s)
REVISION_BUDGET_BUSY_S = 0.02  # ... while documents wait on the broker: fresh documents first
DEFERRED_BUDGET_S = 0.1  # seconds of the other algorithms' first verdicts per loop (Engine.deferred_budget_s)
# what a record of a verdict block adds to the block's own bytes (field names, shared values, headers): its
# output's byte count for max_unacked_bytes is estimated as the block's bytes + this per record
BLOCK_RECORD_BYTES = 250
MAX_ERROR_CHARS = 500

Position = tuple[TopicPartition, int]


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def on_partitions_revoked(self, revoked: Any) -> None:
        self.worker.on_revoked(set(revoked))

    def on_partitions_assigned(self, assigned: Any) -> None:
        event(log, "partitions_assigned", partitions=sorted(f"{tp.topic}:{tp.partition}" for tp in assigned))
        self.worker.on_assigned(set(assigned))


def _loopback(host: str) -> bool:
    """``host`` is a loopback address or ``localhost``."""
    h = host.strip("[]")
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def _close_quietly(client: Any, **kwargs: Any) -> None:
    """``client.close(**kwargs)``; a failure to close is not worth more than the close itself."""
    try:
        client.close(**kwargs)
    except Exception:  # noqa: BLE001
        pass


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]


def suggestion_routes(settings: Settings, engine: Any) -> dict[str, Any]:
    """The metrics server's ``/suggestions`` route (the published queue as JSON), only on a loopback
    ``metrics_host``: it carries document snippets and that server has no token."""
    return {"/suggestions": engine.suggestions} if _loopback(settings.metrics_host) else {}


def live_suggestion_ids(settings: Settings, timeout_s: float = 10.0) -> list[str]:
    """The ids with a live suggestion on ``settings.suggestions_topic`` (the newest last).

    Reads the compacted topic once (at most ``timeout_s``): a tombstone removes its id,
    and at most ``STALE_FACTOR * suggestions_top_n`` (the newest) are kept. A broker
    failure is logged (``suggestions_adopt_failed``) and returns what was read.
    """
    t0 = time.monotonic()
    bound = sg.STALE_FACTOR * settings.suggestions_top_n
    live: dict[str, bool] = {}
    reader = None
    try:
        reader = make_reader(settings, client_id="streamsemi-suggestions")
        tps = assign_all(reader, settings.suggestions_topic, timeout_s=timeout_s)
        end = reader.end_offsets(tps)
        left = {tp for tp in tps if end.get(tp)}
        while left and time.monotonic() - t0 < timeout_s:
            for records in reader.poll(timeout_ms=300, max_records=5000).values():
                for r in records:
                    if r.key is None:
                        continue
                    key = r.key.decode("utf-8", "replace")
                    live.pop(key, None)
                    if r.value is not None:
                        live[key] = True
                        if len(live) > bound:
                            live.pop(next(iter(live)))
            left = {tp for tp in left if reader.position(tp) < end[tp]}
    except (KafkaError, ConnectionError) as exc:
        event(log, "suggestions_adopt_failed", logging.WARNING, error=_error(exc))
    finally:
        if reader is not None:
            reader.close()
    return list(live)


def adopt_suggestions(settings: Settings, engine: Any, timeout_s: float = 10.0) -> None:
    """Hand the suggestions a previous ranker left on the topic to ``engine``'s board (no-op with ``suggestions_top_n = 0``).

    The board tombstones them: at once those not open in the window (out of it, or
    seeded), the others at its first ranking unless ranked again. Called by a worker at
    start and by a refitter when it becomes the leader (the previous leader's queue).
    """
    if not settings.suggestions_top_n:
        return
    t0 = time.monotonic()
    n = engine.suggestion_board.adopt(live_suggestion_ids(settings, timeout_s))
    event(log, "suggestions_adopted", ids=n, seconds=round(time.monotonic() - t0, 3))


class Worker:
    """Long-running streamsemi worker.

    One loop iteration (:meth:`step`) reads like the data flow: recover from a
    broker loss if one was noticed, poll, parse, ``engine.process``, emit the outputs
    into the :class:`~streamsemi.service.ledger.OutputLedger`, flush, commit once
    every output is acknowledged, checkpoint now and then.

    Parameters
    ----------
    settings : Settings
        Effective settings (:func:`streamsemi.service.config.resolve`).
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.instance_id = instance_name(settings)  # the 'worker' field of every output
        self.limits = Limits(settings.max_message_bytes, settings.max_text_chars,
                             max_labels_per_doc=settings.max_labels_per_doc)
        self.telemetry = t = Telemetry(max_class_labels=min(settings.max_classes, 100))
        # per-stream models (setting streams, service/streams.py): one engine per stream behind the engine's interface
        self.streams = StreamEngines.from_settings(settings, t, self.instance_id, settings.role)
        self.engine = self.streams or Engine(EngineConfig.from_settings(settings), self.telemetry)
        # fits run in a separate process (service/fitter.py): the polling thread never waits on a fit's GIL
        self.fitter = (FitProcess(t.registry, **FIT_PRIORITY[settings.fit_priority]) if settings.refit_process
                       else None)
        self.engine.fitter = self.fitter
        # the served model's age and the fit's urgency (service/freshness.py): drives the fit process's priority
        self.freshness = ModelFreshness(settings.model_stale_after_s,
                                        settings.first_fit_max_wait_s + settings.model_stale_after_s, t.registry)
        self.engine.revision_budget_s = REVISION_BUDGET_S  # a revision pass never holds fresh documents long
        self.engine.backlog_in_flight = settings.max_poll_records  # a live stream's lag is no backlog to wait for
        self.engine.deferred_budget_s = DEFERRED_BUDGET_S
        if settings.producer_process and isinstance(self.engine, Engine):
            # the other algorithms' first verdicts go to the producer process as blocks: it builds
            # their records, the polling thread does not
            self.engine.verdict_blocks = True
        self.stop_event = threading.Event()
        self.consumer: Any = None
        self.control: ControlReader | None = None
        self.http: StatusServer | None = None
        self.watch: BrokerWatch | None = None
        self.ledger = OutputLedger(self._make_producer, on_resend=t.output_resends.inc)
        self.resets = BrokerResetGuard(settings, on_episode=t.broker_resets.inc)
        self.assignment_watch = AssignmentWatchdog(rejoin_limit_s(settings))
        self.group_repair: group_repair.GhostLeaderRepair | None = None
        self.inflight = InFlightMarker(settings.state_dir or None)
        # control records dead-lettered by an earlier run are not dead-lettered again when the topic is replayed
        self.rejections = RejectedControl(settings.state_dir or None, settings.control_topic)
        # Python's full collections scan the window's objects: paced, instead of a 0.1-0.25 s stop every few seconds
        self.gc = GcPacer(settings.gc_full_interval_s)
        self.rejections_saved = time.monotonic()
        self.last_loop = time.time()
        self.paused = False
        self.pause_reason: str | None = None
        self.newest_record_ts: float | None = None
        self.last_checkpoint = time.monotonic()
        self.restore_report: checkpoint.RestoreReport | None = None
        self.checkpointer = ((StreamsCheckpointer if self.streams else checkpoint.Checkpointer)(
            settings.state_dir, self._checkpoint_done, self._checkpoint_failed) if settings.state_dir else None)
        self.checkpoint_signature: tuple | None = None
        self.records_seen = 0
        self.catchup_from: dict[TopicPartition, int] = {}   # checkpoint offsets not caught up yet
        self.catchup_todo: set[TopicPartition] = set()
        self.catchup_end: dict[TopicPartition, int] = {}    # committed offset at the assignment: a retry's end
        self.catchup_retry_at: float | None = None          # monotonic time of the next try (CATCH_UP_RETRY_S)

    @property
    def producer(self) -> Any:
        return self.ledger.producer

    # ------------------------------------------------------------------ health
    def health(self) -> tuple[bool, dict[str, Any]]:
        age = time.time() - self.last_loop
        return age < max(60.0, self.settings.max_poll_interval_ms / 1000), {"loop_age_s": round(age, 3)}

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        assigned = bool(self.consumer is not None and self.consumer.assignment())
        ok = assigned and self.engine.ready
        self.telemetry.ready.set(1 if ok else 0)
        fresh = self.freshness.last
        info: dict[str, Any] = {"partitions_assigned": assigned, "model_loaded": self.engine.ready,
                                **self.engine.stats(), "refit_errors": self.engine.last_refit_error,
                                "model_age_s": round(fresh.model_age_s, 3),
                                "first_model_wait_s": (None if fresh.first_model_wait_s is None
                                                       else round(fresh.first_model_wait_s, 3)),
                                "fit_urgent": fresh.urgent}
        # what buffered documents wait for (the demo's progress line) and the algorithms a `name` may address
        info.update(algorithms=list(self.settings.algorithm_list), serving=serving_state(self.engine))
        reason = fresh.reason()
        if reason is not None:
            info["reason"] = reason
        return ok, info

    def _update_freshness(self) -> None:
        """The served model's age and whether the fit is urgent (service/freshness.py); the fit's priority follows."""
        e = self.engine
        f = self.freshness.update(time.monotonic(), serving=e.serving, version=e.version, refitting=e.refitting,
                                  documents_seen=self.records_seen > 0)
        if self.fitter is not None:
            self.fitter.set_urgent(f.urgent)

    def broker_error(self, kind: str) -> None:
        self.telemetry.broker_errors.labels(kind).inc()

    def on_broker_reset(self, source: str) -> None:
        """Called (from any thread) when the broker seems to have lost its data."""
        self.resets.request(source)

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
                                 self.readiness, suggestion_routes(s, self.engine)).start()
        if self.fitter is not None:
            self.fitter.start()  # it imports the algorithms while the worker connects
        created = ensure_topics(s)
        event(log, "worker_starting", bootstrap_servers=s.bootstrap_servers, group=s.group_id,
              algorithms=s.algorithm_list, primary="auto" if self.engine.auto_primary else self.engine.primary,
              revisions=s.revisions, labels_topic=s.labels_topic, topics_created=created,
              metrics=f"http://{s.metrics_host}:{self.http.port}/metrics", state_dir=s.state_dir or None)
        if s.state_dir:
            self._restore()
            self.inflight.load()
            known = self.rejections.load()
            if known:
                event(log, "control_rejections_loaded", records=known,
                      action="these control records are not dead-lettered again when the topic is replayed")
        self._adopt_suggestions()
        self.last_checkpoint = time.monotonic()
        self.ledger.open()
        self.control = ControlReader(s, on_error=self.broker_error, on_reset=self.on_broker_reset)
        self.control.start()
        self.watch = BrokerWatch(s, on_reset=self.on_broker_reset, on_error=self.broker_error)
        self.watch.start()
        self.consumer = self._subscribe()

    def _subscribe(self) -> Any:
        consumer = make_document_consumer(self.settings)
        consumer.subscribe([self.settings.documents_topic], listener=_Rebalance(self))
        # the embedded broker can keep a departed member as the group's leader (service/group_repair.py)
        self.group_repair = group_repair.install(
            consumer, on_repair=lambda _leader: self.telemetry.broker_errors.labels("departed_leader").inc())
        return consumer

    def _restore(self) -> None:
        s = self.settings
        self.restore_report = (self.streams.restore(s.state_dir) if self.streams is not None
                               else checkpoint.restore(self.engine, s.state_dir))
        self.catchup_from = {TopicPartition(t, p): o for (t, p), o in self.restore_report.offsets.items()
                             if t == s.documents_topic}
        if self.restore_report.status == "restored":
            self.checkpoint_signature = self._signature()  # nothing new to write yet
        if self.engine.models and not self.engine.ready:
            self.engine.request_refit("restore")  # rebuild the models that could not be restored

    def _make_producer(self) -> Any:
        # Looked up on the module at each call (tests inject producer faults there). Never auto-create topics with
        # the broker's defaults; do not block the loop for a minute on metadata.
        if self.settings.producer_process:
            # outputs produced by a separate process (service/producer.py)
            t = self.telemetry
            return kafka_io.make_process_producer(self.settings, nice=self.settings.producer_nice,
                                                  on_start=lambda _pid: t.producer_process_starts.inc(),
                                                  on_death=lambda _reason: t.producer_process_deaths.inc())
        return kafka_io.make_producer(self.settings, allow_auto_create_topics=False, max_block_ms=10000)

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
        """Flush outputs, commit, leave the group, stop threads (bounded by shutdown_grace_s).

        Only offsets of records whose outputs were sent are committed (an exception
        that escaped :meth:`step` leaves the records it was handling uncommitted).
        """
        t0 = time.monotonic()
        grace = self.settings.shutdown_grace_s
        try:
            if self.producer is not None:
                self.ledger.resend()
                self.ledger.flush(max(1.0, grace * 0.5))
            if self.consumer is not None and not self.ledger.commit_if_settled(self.consumer, self._held()):
                event(log, "shutdown_outputs_unacknowledged", logging.WARNING, records=self.ledger.unsettled_records,
                      action="not committing; their documents are processed again at the next start")
            elif self.consumer is not None:
                self.rejections.settle()
            self.rejections.save()
        except Exception as exc:  # noqa: BLE001
            event(log, "shutdown_commit_failed", logging.WARNING, error=str(exc))
        if self.watch is not None:
            self.watch.stop()
        self._checkpoint("shutdown", wait=True)
        # bounded by what is left of the grace period (KafkaConsumer.close takes timeout_ms, KafkaProducer.close
        # seconds); the consumer commits nothing here: every commit above went through the ledger
        def left() -> float:
            return max(0.5, min(5.0, grace - (time.monotonic() - t0) - 0.5))

        if self.consumer is not None:
            _close_quietly(self.consumer, autocommit=False, timeout_ms=int(left() * 1000))
        if self.producer is not None:
            _close_quietly(self.producer, timeout=left())
        if self.control is not None:
            self.control.stop()
        if self.fitter is not None:
            self.fitter.close()
        if self.http is not None:
            self.http.stop()
        self.gc.close()
        event(log, "worker_stopped", seconds=round(time.monotonic() - t0, 3), **self.engine.stats())

    # ------------------------------------------------------------------ one iteration
    def step(self) -> None:
        """poll -> parse -> engine.process -> emit -> flush -> commit if settled -> checkpoint now and then."""
        self.last_loop = time.time()
        self._guard_broker()
        if self.catchup_todo:
            self._catch_up()
        elif self.catchup_retry_at is not None and time.monotonic() >= self.catchup_retry_at:
            self._retry_catch_up()
        self.ledger.resend()
        self._apply_control()
        records = self._poll()
        # a revision pass runs on what the fresh documents leave: less of it while documents wait on the broker
        self.engine.revision_budget_s = REVISION_BUDGET_BUSY_S if self.engine.backlog else REVISION_BUDGET_S
        # the other algorithms' first verdicts: DEFERRED_BUDGET_S per loop (grown by how many wait), also while
        # documents wait: the fresh outputs are handed over before this work (_background), so it delays only the
        # next poll; with the busy revision budget (0.02 s) the loop's fixed costs ate a third of it
        self.engine.deferred_budget_s = DEFERRED_BUDGET_S
        if records is not None:
            self._process(records)
            self._emit_suggestions()
            if self.ledger.asynchronous:
                self.ledger.ship()  # the fresh outputs go now, before the background work of this loop
            self._background()
            if self.ledger.asynchronous:
                self.ledger.ship()  # the producer process sends; acknowledgements come back while this thread goes on
            else:
                self._flush()
            self._commit_and_checkpoint()
        self._update_flow_control()
        self._update_lag()
        self._update_freshness()
        self.readiness()  # keeps streamsemi_ready current without anyone polling /readyz
        self._pace_gc()

    def _pace_gc(self) -> None:
        full = self.gc.tick()
        if full is not None:
            self.telemetry.gc_full_collections.inc()
            self.telemetry.gc_full_collection_seconds.set(full.seconds)
            event(log, "gc_full_collection", seconds=round(full.seconds, 4), collected=full.collected,
                  frozen_before=full.frozen_before, frozen_after=full.frozen_after)

    def _guard_broker(self) -> None:
        if self.resets.pending:
            self.resets.handle(self.consumer, self.ledger, seeds=len(self.engine.seeds),
                               model_version=self.engine.version)
        self.resets.check_positions(self.consumer, self.ledger)
        if self.group_repair is not None and self.group_repair.consumer is self.consumer:
            self.group_repair.check()
        reason = self.assignment_watch.check(self.consumer)
        if reason is not None:
            self._replace_consumer(reason)

    def _replace_consumer(self, reason: str) -> None:
        """Close a documents consumer stuck outside its group and subscribe a new one.

        It holds no partitions, so there is nothing to commit: the new member starts
        from the group's committed offsets (at-least-once, as after a restart).
        """
        try:
            fresh = self._subscribe()
        except Exception as exc:  # noqa: BLE001 - keep the old consumer, try again after the next wait
            event(log, "documents_consumer_replace_failed", logging.WARNING, reason=reason, error=_error(exc))
            return
        old, self.consumer, self.paused = self.consumer, fresh, False
        _close_quietly(old, autocommit=False, timeout_ms=2000)  # a consumer stuck in its group may fail to leave it
        self.telemetry.broker_errors.labels("rejoin").inc()
        event(log, "documents_consumer_replaced", logging.WARNING, reason=reason,
              action="a new member joins the group and reads from the committed offsets")

    def _poll(self) -> list[tuple[TopicPartition, Any]] | None:
        """Records of one poll, in partition order; None when the poll failed."""
        try:
            # a revision pass in progress or buffered documents to assign: do not wait for records, the loop goes
            # on with the next chunk
            eng = self.engine
            wait_ms = 0 if (eng.revisions_pending or eng.first_verdicts_pending
                            or (eng.buffer and eng.serving and not eng.holding_backlog)) else 500
            if self.pause_reason == "outputs not acknowledged" and self.ledger.asynchronous:
                wait_ms = min(wait_ms, 20)  # paused until the producer process answers: look again soon
            polled = self.consumer.poll(timeout_ms=wait_ms, max_records=self.settings.max_poll_records)
        except KafkaError as exc:
            self.broker_error("poll")
            event(log, "poll_failed", logging.WARNING, error=_error(exc))
            time.sleep(1.0)
            return None
        records = [(tp, r) for tp, rs in polled.items() for r in rs]
        self.telemetry.consumed.inc(len(records))
        self.records_seen += len(records)
        for _, r in records:
            if r.timestamp is not None and r.timestamp > 0:
                ts = r.timestamp / 1000
                self.newest_record_ts = ts if self.newest_record_ts is None else max(self.newest_record_ts, ts)
        return records

    def _process(self, records: list[tuple[TopicPartition, Any]]) -> None:
        """Handle a poll's records: as one batch, or one at a time if a previous run died among them."""
        if any(self.inflight.is_suspect(tp, r.offset) for tp, r in records):
            for tp, r in records:
                if self.inflight.is_poison(tp, r.offset):
                    self._dead_letter_poison(tp, r)
                else:
                    self._handle([(tp, r)])
                self.inflight.done(tp, r.offset)
        else:
            self._handle(records)

    def _handle(self, records: list[tuple[TopicPartition, Any]]) -> None:
        """parse -> engine.process -> emit; then the records' offsets may be committed.

        The in-flight marker names the records while they are processed; an
        exception while processing them is a designed path (:meth:`_process_docs`).
        """
        docs, dead = self._parse(records)
        positions = [(tp, r.offset) for tp, r in records]
        self.inflight.begin(positions)
        assignments, failed = self._process_docs(docs)
        raw = {(tp, r.offset): r for tp, r in records}
        for doc, exc in failed:
            tp, offset = doc.source
            r = raw[(tp, offset)]
            dead.append((dead_letter(r.value, "processing_error", _error(exc), tp.topic, tp.partition, offset, r.key),
                         Rejected("processing_error", _error(exc))))
        for op, rej in self.engine.drain_dead():
            dead.append((dead_letter(encode_json(op), rej.reason, rej.detail, self.settings.control_topic), rej))
        t_emit = time.perf_counter()
        self._emit(assignments, dead)
        # the cost per record sizes the deferred first verdicts and revision chunks (_background)
        self.engine.note_emit(time.perf_counter() - t_emit, len(assignments))
        self._reemit_resolved()
        self._emit_cluster_events()
        self.ledger.advance(positions)  # every record has its outputs sent (or is buffered: _held)
        self.inflight.end()

    def _parse(self, records: list[tuple[TopicPartition, Any]]) -> tuple[list[Document], list[tuple[dict, Rejected]]]:
        docs: list[Document] = []
        dead: list[tuple[dict, Rejected]] = []
        for tp, r in records:
            try:
                parsed = parse_document(r.value, self.limits)
            except Exception as exc:  # noqa: BLE001 - a parser bug must not stop the worker
                parsed = Rejected("processing_error", _error(exc))
            if isinstance(parsed, Rejected):
                dead.append((dead_letter(r.value, parsed.reason, parsed.detail, tp.topic, tp.partition, r.offset, r.key),
                             parsed))
            else:
                parsed.source = (tp, r.offset)
                docs.append(parsed)
        return docs, dead

    def _process_docs(self, docs: list[Document]) -> tuple[list[Assignment], list[tuple[Document, BaseException]]]:
        """``engine.process(docs)`` of the fresh documents; when it raises, each document again on its own.

        Returns the assignments and the documents whose processing raised (with the
        exception); rejected documents become dead letters on the way (``no_terms``).
        Revisions and deferred first verdicts come from :meth:`_background`.
        """
        try:
            result = self._engine_process(docs)
        except Exception as exc:  # noqa: BLE001 - a record that breaks processing is dead-lettered, not fatal
            if len(docs) == 1:
                event(log, "processing_failed", logging.WARNING, error=_error(exc), id=docs[0].id,
                      partition=docs[0].source[0].partition, offset=docs[0].source[1], action="dead-lettered")
                return [], [(docs[0], exc)]
            event(log, "batch_processing_failed", logging.WARNING, error=_error(exc), records=len(docs),
                  action="processing the batch's documents one at a time" if docs else "skipped this tick")
            assignments: list[Assignment] = []
            failed: list[tuple[Document, BaseException]] = []
            for doc in docs:
                got, bad = self._process_docs([doc])
                assignments.extend(got)
                failed.extend(bad)
            return assignments, failed
        dead = []
        for doc, rej in result.rejected:
            tp, offset = doc.source
            raw = encode_json({"id": doc.id, "text": doc.text, **({"stream": doc.stream} if doc.stream else {})})
            dead.append((dead_letter(raw, rej.reason, rej.detail, tp.topic, tp.partition, offset), rej))
        if dead:
            self._emit([], dead)
        return result.assignments, []

    def _engine_process(self, docs: list[Document]) -> Any:
        """``engine.process`` of the fresh documents alone (the ``assign`` role serves without a window:
        streamsemi.service.roles); the deferred first verdicts and revisions follow in :meth:`_background`."""
        return self.engine.process(docs, background=False)

    def _engine_background(self) -> Any:
        """``engine.background()``: None where there is none (the ``assign`` role)."""
        return self.engine.background()

    def _background(self) -> None:
        """The other algorithms' deferred first verdicts and a revision chunk, after the fresh outputs were handed over.

        They belong to no record of this poll: a deferred document's own offset is held
        back until its verdicts are acknowledged (:meth:`_held`), revisions hold nothing.
        """
        try:
            result = self._engine_background()
        except Exception as exc:  # noqa: BLE001 - Engine.background catches its own failures; this is a last guard
            event(log, "background_failed", logging.WARNING, error=_error(exc))
            return
        blocks = getattr(result, "blocks", None) or []
        if result is None or not (result.assignments or result.revisions or blocks):
            return
        t_emit = time.perf_counter()
        self._emit(result.assignments, [])
        self._emit_blocks(blocks)
        self._emit(result.revisions, [])
        self.engine.note_emit(time.perf_counter() - t_emit, len(result.assignments) + len(result.revisions)
                              + sum(b.count for b in blocks))

    def _emit_blocks(self, blocks: list[VerdictBlock]) -> None:
        """Verdict blocks to the assignments topic: one output each, whose records the producer process builds
        (the same bytes as :meth:`_emit`'s); one record at a time through :meth:`_emit` when the producer is
        not a process or a block cannot travel as one (:class:`VerdictBlockError`)."""
        if not blocks:
            return
        if not self.ledger.asynchronous:
            self._emit([a for b in blocks for a in b.assignments()], [])
            return
        topic, outs = self.settings.assignments_topic, []
        for block in blocks:
            block.spec["w"] = self.instance_id
            try:
                data = encode_verdict_block(block.spec)
            except VerdictBlockError:
                self._emit(block.assignments(), [])
                continue
            outs.append(Output(topic, BLOCK, data, None, records=block.count,
                               nbytes=len(data) + block.count * BLOCK_RECORD_BYTES))
        if outs:
            self.ledger.send_many(outs)

    def _dead_letter_poison(self, tp: TopicPartition, r: Any) -> None:
        """A record that killed the process every time it was processed alone: dead-letter it, unprocessed."""
        detail = f"the worker process died {self.inflight.crashes} times while processing this record alone"
        event(log, "poison_record", logging.ERROR, topic=tp.topic, partition=tp.partition, offset=r.offset,
              crashes=self.inflight.crashes, action="dead-lettered without processing")
        self._emit([], [(dead_letter(r.value, "processing_error", detail, tp.topic, tp.partition, r.offset, r.key),
                         Rejected("processing_error", detail))])
        self.ledger.advance([(tp, r.offset)])
        self.inflight.clear()

    def _flush(self) -> None:
        try:
            self.ledger.flush(FLUSH_TIMEOUT_S)
        except KafkaError as exc:
            self.broker_error("produce")
            event(log, "flush_failed", logging.WARNING, error=_error(exc), unacknowledged=self.ledger.unacknowledged)

    def _commit_and_checkpoint(self) -> None:
        """Commit what is safe; now and then save the control rejections and checkpoint.

        With the producer process (``ledger.asynchronous``) each loop commits the offsets
        whose outputs are acknowledged so far (:meth:`OutputLedger.commit_acknowledged`);
        before a checkpoint (it records ``next_offset``) or a save of the rejections (they
        name dead letters as sent) it waits for every output, as the plain producer does at
        every loop.
        """
        try:
            interval = self.settings.checkpoint_interval_s
            if self.ledger.asynchronous:
                now = time.monotonic()
                if (now - self.rejections_saved < interval
                        and not (self.checkpointer and now - self.last_checkpoint >= interval)):
                    settled = self.ledger.commit_acknowledged(self.consumer, self._held(), wait=False)
                    for exc in self.ledger.take_commit_errors():  # an earlier loop's commit: sent again meanwhile
                        self.broker_error("commit")
                        event(log, "commit_failed", logging.WARNING, error=_error(exc), waited=False)
                    if settled:
                        self.rejections.settle()
                    return
                self.ledger.flush(FLUSH_TIMEOUT_S)
            if self.ledger.commit_if_settled(self.consumer, self._held()):
                self.rejections.settle()
                if time.monotonic() - self.rejections_saved >= self.settings.checkpoint_interval_s:
                    self.rejections.save()
                    self.rejections_saved = time.monotonic()
                if (self.checkpointer and time.monotonic() - self.last_checkpoint >= self.settings.checkpoint_interval_s
                        and self.consumer.assignment()):  # not while joining: keep this thread in poll()
                    self._checkpoint("interval")
        except CommitFailedError as exc:
            self.broker_error("commit")
            event(log, "commit_failed", logging.WARNING, error=str(exc))
        except KafkaError as exc:
            self.broker_error("produce")
            event(log, "flush_failed", logging.WARNING, error=_error(exc))

    def _held(self) -> dict[TopicPartition, int]:
        """The oldest offset per partition of documents the engine still buffers (no model yet), or that the
        primary served alone while another algorithm's first model is not in yet."""
        held: dict[TopicPartition, int] = dict(self.engine.partial_min_offsets())
        for doc, _ in self.engine.buffer:
            if doc.source is not None:
                tp, off = doc.source
                held[tp] = min(off, held.get(tp, off))
        return held

    def _apply_control(self) -> None:
        if self.control is None:
            return
        dead: list[tuple[dict, Rejected]] = []
        fingerprints = []
        for raw, partition, offset, key in self.control.drain():
            msg = parse_control(raw, self.limits)
            if isinstance(msg, Rejected):
                rejected = [(dead_letter(raw, msg.reason, msg.detail, self.settings.control_topic, partition, offset, key),
                             msg)]
            elif msg.op == "name" and self.control.replayed(partition, offset):
                continue  # applied before this start: the seeds it made are on the control topic (origin "cluster")
            else:
                rejected = [(dead_letter(encode_json(op), rej.reason, rej.detail, self.settings.control_topic, partition,
                                         offset), rej) for op, rej in self._apply(msg, offset)]
            if not rejected:
                continue
            fp = fingerprint(partition, offset, raw)
            if self.rejections.known(fp):  # dead-lettered by an earlier run (the control topic is replayed at start)
                self.telemetry.control_rejections_replayed.inc(len(rejected))
                continue
            dead.extend(rejected)
            fingerprints.append(fp)
        if dead:
            self._emit([], dead)
        for fp in fingerprints:  # known once every output so far is acknowledged (_commit_and_checkpoint)
            self.rejections.add(fp)

    def _apply(self, msg: ControlMessage, offset: int) -> list[tuple[dict, Rejected]]:
        if self.streams is not None:
            return self.streams.apply_control(msg, offset)
        if msg.op == "refit":
            self.engine.request_refit("request")
            return []
        if msg.op == "unlabel":
            self.engine.unlabel(msg.id, offset)
            return []
        if msg.op == "name":
            return self.engine.name_cluster(msg.cluster, msg.labels[0], msg.algorithm, offset)
        return self.engine.label(msg.id, msg.labels, msg.text, offset, msg.origin, msg.label_offset)

    def _emit(self, assignments: list[Assignment], dead: list[tuple[dict, Rejected]]) -> None:
        s = self.settings
        now = time.time()
        heads: dict[tuple[int, int], list] = {}  # one headers list per (model version, revision): never modified
        worker, assignments_topic, labels_topic = self.instance_id, s.assignments_topic, s.labels_topic
        outs: list[Output] = []
        arrivals: list[float] = []
        for a in assignments:
            key, value = encode_key(a.id), encode_json(a.to_message(worker))
            headers = heads.get((a.model_version, a.revision))
            if headers is None:
                headers = heads[(a.model_version, a.revision)] = [("model_version", str(a.model_version).encode()),
                                                                  ("revision", str(a.revision).encode())]
            outs.append(Output(assignments_topic, key, value, headers))
            if a.primary:  # the labels topic: the latest primary assignment per document (compacted)
                outs.append(Output(labels_topic, key, value, headers))
                if a.document is not None:
                    arrivals.append(a.document.arrival)
        self.ledger.send_many(outs)  # in order, one call
        if arrivals:
            observe_many(self.telemetry.latency, [max(0.0, now - t) for t in arrivals])
        for value, rej in dead:
            self.telemetry.dead_letters.labels(rej.reason).inc()
            self.ledger.send(Output(s.deadletter_topic, None, encode_json(value), None))
            event(log, "dead_letter", logging.DEBUG, reason=rej.reason, detail=rej.detail,
                  topic=value.get("topic"), partition=value.get("partition"), offset=value.get("offset"))

    def _adopt_suggestions(self, timeout_s: float = 10.0) -> None:
        """The ids a previous run left on the suggestions topic: tombstoned unless ranked again (docs/suggestions.md)."""
        adopt_suggestions(self.settings, self.engine, timeout_s)

    def _emit_suggestions(self) -> None:
        """Label suggestions after a refit round, tombstones for labelled ones (compacted topic, key = id)."""
        topic = self.settings.suggestions_topic
        for doc_id, msg in self.engine.suggestion_updates():
            self.ledger.send(Output(topic, encode_key(doc_id), None if msg is None else encode_json(msg), None))

    def _reemit_resolved(self) -> None:
        for seed in self.engine.drain_resolved():
            msg = resolved_seed_op(seed)
            if msg is not None:
                self.ledger.send(Output(self.settings.control_topic, encode_key(seed.id), encode_json(msg), None))

    def _emit_cluster_events(self) -> None:
        """Cluster lifecycle events of the refit rounds since the last call (compacted, key = [stream/]algorithm/cluster)."""
        for ev in self.engine.drain_cluster_events():
            self.ledger.send(Output(self.settings.clusters_topic, cluster_event_key(ev), encode_json(ev), None))

    # ------------------------------------------------------------------ partitions
    def on_revoked(self, revoked: set[TopicPartition]) -> None:
        """Flush and commit what was processed for ``revoked``; forget their buffered documents."""
        try:
            self.ledger.flush(FLUSH_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001
            event(log, "revoke_flush_failed", logging.WARNING, error=str(exc))
        try:
            self.ledger.commit_if_settled(self.consumer, self._held(), only=revoked)
        except Exception as exc:  # noqa: BLE001
            event(log, "revoke_commit_failed", logging.WARNING, error=str(exc))
        dropped = self.engine.drop_buffered(lambda d: d.source is not None and d.source[0] in revoked)
        self.ledger.forget(revoked)
        event(log, "partitions_revoked", partitions=sorted(f"{tp.topic}:{tp.partition}" for tp in revoked),
              dropped_buffered=dropped)

    def on_assigned(self, assigned: set[TopicPartition]) -> None:
        self.catchup_todo |= {tp for tp in assigned if tp in self.catchup_from}
        for tp in assigned:
            self.catchup_end.pop(tp, None)  # a new assignment looks the committed offset up again
        self.resets.on_assigned(self.consumer, assigned)

    def _update_flow_control(self) -> None:
        parts = self.consumer.assignment()
        ledger, s = self.ledger, self.settings
        unacked = (ledger.unsettled_records > s.max_unacked_outputs or ledger.unsettled_bytes > s.max_unacked_bytes
                   if ledger.asynchronous else bool(ledger.unsettled))
        full = self.engine.buffer_full
        reason = ("no model yet" if full and len(self.engine.buffer) else "first verdicts pending" if full
                  else "outputs not acknowledged" if unacked else None)
        self.pause_reason = reason
        if reason and not self.paused and parts:
            self.consumer.pause(*parts)
            self.paused = True
            event(log, "consumption_paused", buffered=len(self.engine.buffer),
                  unacknowledged=self.ledger.unsettled_records, reason=reason)
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
            pos = self.ledger.next_offset.get(tp)
            if pos is None:
                continue
            lags[tp.partition] = max(0, hw - pos)
            self.telemetry.lag.labels(tp.topic, str(tp.partition)).set(lags[tp.partition])
        # a backlog (documents, and seeds for them on the control topic) is read before the first fit (Engine.tick)
        self.engine.backlog = sum(lags.values()) + (self.control.backlog() if self.control is not None else 0)
        if self.newest_record_ts is not None:
            self.telemetry.lag_seconds.set(max(0.0, time.time() - self.newest_record_ts) if any(lags.values()) else 0.0)

    # ------------------------------------------------------------------ checkpoints
    def _signature(self) -> tuple:
        e = self.engine
        return (e.version, e.refit_count, len(e.window), len(e.seeds), len(e.pending), e.control_ops,
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
        if self.checkpointer.submit(self.engine, reason, self._checkpoint_offsets()):
            self.checkpoint_signature = sig
        if wait:
            self.checkpointer.wait(max(1.0, self.settings.shutdown_grace_s / 2))

    def _checkpoint_offsets(self) -> list[list[Any]]:
        """The document offsets a checkpoint records: the window holds every document before them.

        That is the next offset to process, except for a partition restored from an
        earlier checkpoint and not caught up yet (:meth:`_catch_up` runs after the
        partition is assigned): it keeps the restored offset, because the documents
        between it and the committed offset are missing from this window too. Without
        this a checkpoint written between the assignment and the catch-up (or at a
        shutdown before the assignment) moved the next start's catch-up past them, and
        a seed label for one of them waited forever.
        """
        offsets = dict(self.ledger.next_offset)
        for tp, start in self.catchup_from.items():
            offsets[tp] = min(start, offsets.get(tp, start))
        return [[tp.topic, tp.partition, off] for tp, off in offsets.items()]

    def _checkpoint_done(self, info: dict) -> None:
        t = self.telemetry
        t.checkpoints.labels("success").inc()
        t.last_checkpoint.set(time.time())
        t.checkpoint_bytes.set(info["bytes"])
        event(log, "checkpoint_written", reason=info["reason"], path=info["path"], bytes=info["bytes"],
              seconds=info["seconds"], model_version=info["model_version"], skipped_models=info["skipped_models"],
              **info["counts"])

    def _checkpoint_failed(self, exc: Exception, reason: str) -> None:
        self.checkpoint_signature = None
        self.telemetry.checkpoints.labels("failure").inc()
        event(log, "checkpoint_failed", logging.ERROR, reason=reason, error=_error(exc))

    # ------------------------------------------------------------------ window catch-up after a restore
    def _catch_up(self) -> None:
        """Read back into the window the documents committed after the restored checkpoint was taken.

        They were assigned already (no output now), but the window must hold them:
        a seed label replayed from the control topic finds its document there. Without
        this a label applied after its document, whose re-emitted seed was lost in a
        crash, would wait forever.

        A partition's read starts at most ``window_max_docs`` records before its committed
        offset: older documents could not stay in the window. What could not be read (the
        committed offset unknown, a broker error, or more than ``CATCH_UP_MAX_S`` of reading)
        stays in ``catchup_from`` from where the reading stopped: checkpoints record that
        offset (:meth:`_checkpoint_offsets`), so the next start reads the rest (again at most a
        window's worth before the committed offset); while the partition stays assigned the
        worker tries again every ``CATCH_UP_RETRY_S`` (:meth:`_retry_catch_up`), up to the
        committed offset it found at the assignment (``catchup_end``: later commits are this
        process's own documents, already in the window), and the partition's next assignment
        tries again too.
        """
        todo, self.catchup_todo = self.catchup_todo, set()
        self.catchup_retry_at = None
        ranges: dict[TopicPartition, tuple[int, int]] = {}
        for tp in todo:
            start = self.catchup_from.get(tp)
            end = self.catchup_end.get(tp)
            if end is None:
                try:
                    end = self.consumer.committed(tp)
                except KafkaError as exc:
                    event(log, "catch_up_failed", logging.WARNING, partition=tp.partition, error=str(exc))
                    continue
                if end is not None:
                    self.catchup_end[tp] = end
            if start is not None and end is not None and end > start:
                # a window of N documents keeps at most this partition's newest N: older ones would only
                # be evicted by the newer ones read after them (per-stream windows: one per stream, no cut)
                ranges[tp] = (start if self.streams is not None else max(start, end - self.settings.window_max_docs),
                              end)
            else:
                self._caught_up(tp)   # nothing was committed after the checkpoint
        if not ranges:
            self._schedule_catch_up_retry()
            return
        t0 = time.monotonic()
        docs = []
        reached = {tp: start for tp, (start, _) in ranges.items()}
        left = dict(ranges)
        reader = None
        try:
            reader = make_reader(self.settings, client_id="streamsemi-catchup")
            reader.assign(list(ranges))
            for tp, (start, _) in ranges.items():
                reader.seek(tp, start)
            while left and time.monotonic() - t0 < CATCH_UP_MAX_S:
                for tp, records in reader.poll(timeout_ms=500, max_records=5000).items():
                    for r in records:
                        if tp in left and r.offset < left[tp][1]:
                            parsed = parse_document(r.value, self.limits)
                            if not isinstance(parsed, Rejected):
                                docs.append(parsed)
                for tp in list(left):
                    reached[tp] = reader.position(tp)
                    if reached[tp] >= left[tp][1]:
                        del left[tp]
        except KafkaError as exc:
            event(log, "catch_up_failed", logging.WARNING, partitions=sorted(tp.partition for tp in left),
                  error=_error(exc))
        finally:
            if reader is not None:
                _close_quietly(reader)
        for tp in ranges:
            if tp in left:
                self.catchup_from[tp] = max(self.catchup_from[tp], min(reached[tp], left[tp][1]))
            else:
                self._caught_up(tp)
        n = self.engine.absorb(docs)
        self._reemit_resolved()
        event(log, "window_caught_up", documents=n, partitions=sorted(tp.partition for tp in ranges),
              seconds=round(time.monotonic() - t0, 3), incomplete=sorted(tp.partition for tp in left))
        self._schedule_catch_up_retry()

    def _schedule_catch_up_retry(self) -> None:
        """Try again in ``CATCH_UP_RETRY_S`` if an assigned partition is still not caught up."""
        self.catchup_retry_at = (time.monotonic() + CATCH_UP_RETRY_S
                                 if self.catchup_from.keys() & self.consumer.assignment() else None)

    def _retry_catch_up(self) -> None:
        """Read again what an earlier catch-up of the assigned partitions could not (:meth:`_catch_up`)."""
        self.catchup_retry_at = None
        self.catchup_todo |= self.catchup_from.keys() & self.consumer.assignment()
        if self.catchup_todo:
            event(log, "catch_up_retry", partitions=sorted(tp.partition for tp in self.catchup_todo))
            self._catch_up()

    def _caught_up(self, tp: TopicPartition) -> None:
        self.catchup_from.pop(tp, None)
        self.catchup_end.pop(tp, None)
