"""Roles: one refitter per stream, many assigners, the same model everywhere (``streamsemi run --role``).

``all`` (the default) is the single process of :class:`~streamsemi.service.worker.Worker`.
With roles, Kafka carries the work (docs/scaling.md):

* ``refit`` (:class:`Refitter`): every refit-role process reads every documents
  partition (``assign()``, no group) and the whole control topic, and keeps the
  window and the seeds; exactly one of them, the *leader*, fits and publishes each
  model version to the models topic (:mod:`streamsemi.service.models_topic`). The
  leader is elected through Kafka: the refit-role processes are the members of the
  consumer group ``<group_id>.refit`` on the single-partition ``refit_leader_topic``,
  and the owner of partition 0 leads; when it dies the group protocol hands the
  partition to another member (session timeout). Standbys stay hot: they window every
  document, apply every label and adopt every published model, so a new leader
  continues from the latest published model, numbering above every version any
  chunk on the topic announced (versions are global and monotonic across failovers).
* ``assign`` (:class:`AssignWorker`): members of the documents consumer group, any
  number; they hold no window and no seeds, read the newest complete model from the
  models topic at start and swap to a newer one atomically between polls. Their
  outputs carry the global ``model_version`` and ``worker`` (the instance id).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any

from kafka import ConsumerRebalanceListener, KafkaConsumer, TopicPartition
from kafka.errors import KafkaError

from streamsemi.core.logs import event
from streamsemi.core.messages import (
    Limits,
    Rejected,
    cluster_event_key,
    dead_letter,
    encode_json,
    encode_key,
    parse_control,
    parse_document,
    resolved_seed_op,
)
from streamsemi.core.telemetry import Telemetry
from streamsemi.engine import Engine, EngineConfig
from streamsemi.service import group_repair
from streamsemi.service.config import Settings, instance_name, kafka_security
from streamsemi.service.httpserver import StatusServer
from streamsemi.service.kafka_io import (
    ControlReader,
    assign_all,
    create_missing_topics,
    ensure_topics,
    make_producer,
    make_reader,
)
from streamsemi.service.models_topic import (
    DEFAULT_STREAM,
    MAX_VERSION,
    ModelPublisher,
    ModelsReader,
    Publication,
)
from streamsemi.service.worker import Worker, adopt_suggestions, suggestion_routes

log = logging.getLogger("streamsemi.service.roles")

LEADER_PARTITION = 0


def role_settings(settings: Settings) -> Settings:
    """Settings of a role process: no revisions (no window on assigners), no drift refits (fits are the leader's).

    The refitter fits on a thread of its own process (it serves nothing, so nothing waits on a fit).
    """
    return Settings({**settings.values, "revisions": "off", "drift_detection": False, "refit_process": False},
                    dict(settings.sources))


def ensure_role_topics(settings: Settings, timeout_s: float = 30.0) -> list[str]:
    """Create the models topic (1 partition, compacted) and the leader topic (1 partition) if missing.

    Explicitly, before any client names them (the embedded broker auto-creates a topic
    named in a metadata request, with 4 partitions).
    """
    specs = {settings.models_topic: (1, {"cleanup.policy": "compact"}), settings.refit_leader_topic: (1, {})}
    return create_missing_topics(settings, specs, timeout_s, what="the role topics")


def warn_if_insecure(settings: Settings, role: str) -> None:
    """The warning event of a role process started with ``insecure_models`` (no key: publications unsigned)."""
    if settings.values.get("insecure_models") and not settings.values.get("models_key_file"):
        event(log, "models_insecure", logging.WARNING, role=role, setting="insecure_models",
              detail="models-topic publications are neither signed nor verified: anyone who can write "
                     f"{settings.models_topic!r} can make the assigners serve a model of their own; "
                     "set models_key_file (docs/reliability.md, Trust boundaries)")


def round_fitted(e: Engine) -> bool:
    """Whether a refit leader may publish ``e.models``: no round runs, or the running one has every enabled
    algorithm's new model in and only its held-out probes are left (``primary = auto``: one more fit per
    algorithm, which a worker serves the new models during). A round whose algorithm failed is published
    when it ends, with that algorithm's fallback."""
    if not e.refitting:
        return True
    models = e.models
    if not models or not set(e.config.algorithms) <= set(models):
        return False
    version = max(slot.version for slot in models.values())
    return all(models[a].version == version and not models[a].fallback for a in e.config.algorithms)


class RoleMetrics:
    """The role metrics of :class:`~streamsemi.core.telemetry.Telemetry` for one process (role, worker name).

    ``streamsemi_serving_model_version{role, worker, stream}``: the model version an
    assigner serves, or the version a refitter published last (standbys: adopted);
    ``streamsemi_refit_leader{worker}``: 1 on the active refitter;
    ``streamsemi_models_refused_total{reason}``: publications whose model failed
    :func:`~streamsemi.service.model_validation.validate_model` (reason: its category).
    """

    def __init__(self, telemetry: Telemetry, role: str, worker: str) -> None:
        t = telemetry
        self.role, self.worker = role, worker
        self.version = t.serving_model_version
        self.leader = t.refit_leader
        self.published = t.models_published
        self.publish_bytes = t.model_publication_bytes
        self.publish_seconds = t.model_publication_seconds
        self.swaps = t.model_swaps
        self.rejected = t.model_publications_rejected
        self.refused = t.models_refused
        self.version.labels(role, worker, DEFAULT_STREAM).set(0)
        if role == "refit":
            self.leader.labels(worker).set(0)

    def serving(self, version: int, stream: str = DEFAULT_STREAM) -> None:
        self.version.labels(self.role, self.worker, stream).set(float(min(max(int(version), 0), MAX_VERSION)))


# ---------------------------------------------------------------- assign
class AssignWorker(Worker):
    """A member of the documents consumer group that serves the newest published model (no window, no seeds).

    Everything of :class:`Worker` (at-least-once ledger, dead letters, flow control,
    broker loss) except that documents go through :meth:`Engine.serve` and the
    models come from the models topic, swapped between polls.
    """

    def __init__(self, settings: Settings) -> None:
        super().__init__(role_settings(settings))
        self.engine.refits_enabled = False
        self.roles = RoleMetrics(self.telemetry, "assign", self.instance_id)
        self.models_reader: ModelsReader | None = None
        self.adopted: str | None = None

    def start(self) -> None:
        warn_if_insecure(self.settings, "assign")
        ensure_role_topics(self.settings)
        self.models_reader = self._make_models_reader()
        self.models_reader.start()
        super().start()
        if self.control is not None:  # assigners keep no seeds: the control topic is the refitter's
            self.control.stop()
            self.control = None

    def _make_models_reader(self) -> ModelsReader:
        return ModelsReader(self.settings, self.engine.config, on_error=self.broker_error,
                            on_reject=lambda reason: self.roles.rejected.labels(reason).inc(),
                            on_refuse=lambda reason: self.roles.refused.labels(reason).inc())

    def _adopt_suggestions(self, timeout_s: float = 10.0) -> None:
        """Nothing: the queue is the leading refitter's (an assigner holds no window, so adopting would
        tombstone every suggestion on the topic)."""

    def step(self) -> None:
        self._swap()
        super().step()

    def _engine_process(self, docs: list[Any]) -> Any:
        return self.engine.serve(docs)

    def _engine_background(self) -> Any:
        return None  # no window: no revision pass; serve() judges every algorithm at once

    def _swap(self) -> None:
        pub = self.models_reader.latest() if self.models_reader is not None else None
        if pub is None or pub.publication_id == self.adopted:
            return
        missing = [a for a in self.engine.config.algorithms if a not in pub.models]
        self.engine.adopt_models(pub.models, pub.version, pub.primary)
        self.adopted = pub.publication_id
        self.roles.serving(pub.version)
        self.roles.swaps.labels(pub.stream).inc()
        event(log, "model_swapped", version=pub.version, writer=pub.writer, primary=self.engine.primary,
              missing_algorithms=missing or None)

    def shutdown(self) -> None:
        super().shutdown()
        if self.models_reader is not None:
            self.models_reader.stop()


# ---------------------------------------------------------------- refit
class _Leadership(ConsumerRebalanceListener):
    def __init__(self, election: LeaderElection) -> None:
        self.election = election

    def on_partitions_revoked(self, revoked: Any) -> None:
        self.election.leader.clear()

    def on_partitions_assigned(self, assigned: Any) -> None:
        leads = TopicPartition(self.election.topic, LEADER_PARTITION) in set(assigned)
        event(log, "refit_election_assigned", worker=self.election.instance_id, leader=leads)
        if leads:
            self.election.leader.set()
        else:
            self.election.leader.clear()


class LeaderElection(threading.Thread):
    """Membership of the consumer group ``<group_id>.refit`` on the single-partition leader topic.

    The member that owns partition 0 leads (``leader`` is set). The thread polls
    steadily so that the membership holds; closing the consumer leaves the group, so a
    stopped leader hands over after one rebalance, a killed one after the session
    timeout.
    """

    def __init__(self, settings: Settings, instance_id: str, on_error: Any = None) -> None:
        super().__init__(name="refit-election", daemon=True)
        self.settings = settings
        self.topic = settings.refit_leader_topic
        self.instance_id = instance_id
        self.on_error = on_error
        self.leader = threading.Event()
        self.stop_event = threading.Event()

    @property
    def is_leader(self) -> bool:
        return self.leader.is_set()

    def run(self) -> None:
        s = self.settings
        while not self.stop_event.is_set():
            consumer = None
            try:
                consumer = KafkaConsumer(
                    bootstrap_servers=s.bootstrap_servers, group_id=f"{s.group_id}.refit",
                    client_id=f"streamsemi-refit-{self.instance_id}", enable_auto_commit=False,
                    auto_offset_reset="earliest", session_timeout_ms=s.session_timeout_ms,
                    heartbeat_interval_ms=s.heartbeat_interval_ms, max_poll_interval_ms=s.max_poll_interval_ms,
                    allow_auto_create_topics=False, **kafka_security(s))
                consumer.subscribe([self.topic], listener=_Leadership(self))
                # a fully restarted refitter group can keep its departed leader on the embedded broker
                repair = group_repair.install(consumer)
                while not self.stop_event.is_set():
                    consumer.poll(timeout_ms=500)
                    if repair is not None:
                        repair.check()
            except Exception as exc:  # noqa: BLE001 - stand down and try again
                self.leader.clear()
                event(log, "refit_election_error", logging.WARNING, error=f"{type(exc).__name__}: {exc}")
                if self.on_error:
                    self.on_error("election")
                self.stop_event.wait(1.0)
            finally:
                self.leader.clear()
                if consumer is not None:
                    try:
                        consumer.close()
                    except Exception:  # noqa: BLE001
                        pass

    def stop(self, timeout: float = 10.0) -> None:
        self.stop_event.set()
        self.join(timeout)


class Refitter:
    """A refit-role process: hot standby, or the elected leader that fits and publishes (module docstring).

    Parameters
    ----------
    settings : Settings
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = s = role_settings(settings)
        self.instance_id = instance_name(s)
        self.limits = Limits(s.max_message_bytes, s.max_text_chars, max_labels_per_doc=s.max_labels_per_doc)
        self.telemetry = Telemetry(max_class_labels=min(s.max_classes, 100))
        self.engine = Engine(EngineConfig.from_settings(s), self.telemetry)
        self.engine.refits_enabled = False
        self.roles = RoleMetrics(self.telemetry, "refit", self.instance_id)
        self.stop_event = threading.Event()
        self.election: LeaderElection | None = None
        self.models_reader: ModelsReader | None = None
        self.control: ControlReader | None = None
        self.documents: Any = None
        self.producer: Any = None
        self.publisher = ModelPublisher(s, self.instance_id)
        self.http: StatusServer | None = None
        self.leading = False
        self.adopted: str | None = None
        self.published_version = 0
        self.published_refits = 0
        self.last_loop = time.time()

    # ------------------------------------------------------------------ health
    def health(self) -> tuple[bool, dict[str, Any]]:
        age = time.time() - self.last_loop
        return age < 60.0, {"loop_age_s": round(age, 3)}

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        caught_up = bool(self.models_reader is not None and self.models_reader.caught_up.is_set())
        ok = caught_up and (not self.leading or self.engine.ready or not self.engine.models)
        self.telemetry.ready.set(1 if ok else 0)
        return ok, {"leader": self.leading, "models_topic_read": caught_up, "published_version": self.published_version,
                    **self.engine.stats()}

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
        warn_if_insecure(s, "refit")
        self.http = StatusServer(s.metrics_host, s.metrics_port, self.telemetry.registry, self.health,
                                 self.readiness, suggestion_routes(s, self.engine)).start()
        ensure_topics(s)
        ensure_role_topics(s)
        event(log, "refitter_starting", worker=self.instance_id, algorithms=s.algorithm_list,
              models_topic=s.models_topic, leader_topic=s.refit_leader_topic,
              metrics=f"http://{s.metrics_host}:{self.http.port}/metrics")
        self.models_reader = self._make_models_reader()
        self.models_reader.start()
        self.control = ControlReader(s, on_error=self.broker_error)
        self.control.start()
        self.documents = make_reader(s, client_id=f"streamsemi-refit-{self.instance_id}",
                                     allow_auto_create_topics=False, max_poll_records=s.max_poll_records)
        tps = assign_all(self.documents, s.documents_topic)
        self._seek_window(tps)
        self.election = LeaderElection(s, self.instance_id, on_error=self.broker_error)
        self.election.start()

    def _make_models_reader(self) -> ModelsReader:
        return ModelsReader(self.settings, self.engine.config, on_error=self.broker_error,
                            on_reject=lambda reason: self.roles.rejected.labels(reason).inc(),
                            on_refuse=lambda reason: self.roles.refused.labels(reason).inc())

    def _seek_window(self, tps: list[TopicPartition]) -> None:
        """Start each partition ``window_max_docs`` records before its end (the window holds no more).

        ``end_offsets`` may be low on some brokers (the embedded one): then more is read
        and the window's bound drops the surplus.
        """
        n = self.settings.window_max_docs
        try:
            begin = self.documents.beginning_offsets(tps)
            end = self.documents.end_offsets(tps)
        except KafkaError as exc:
            event(log, "window_seek_failed", logging.WARNING, error=str(exc), action="reading from the beginning")
            return
        for tp in tps:
            self.documents.seek(tp, max(begin.get(tp, 0) or 0, (end.get(tp, 0) or 0) - n))

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
        """Leave the election first (a standby takes over after one rebalance), then stop the rest."""
        t0 = time.monotonic()
        if self.election is not None:
            self.election.stop()
        self.engine.refits_enabled = False
        self.roles.leader.labels(self.instance_id).set(0)
        for closer in (self.documents, self.producer):
            if closer is not None:
                try:
                    closer.close()
                except Exception:  # noqa: BLE001
                    pass
        self.publisher.close()
        for thread in (self.control, self.models_reader):
            if thread is not None:
                thread.stop()
        if self.http is not None:
            self.http.stop()
        event(log, "refitter_stopped", seconds=round(time.monotonic() - t0, 3), **self.engine.stats())

    # ------------------------------------------------------------------ one iteration
    def step(self) -> None:
        """leadership -> adopt published models -> publish a finished round -> control -> documents."""
        self.last_loop = time.time()
        self._leadership()
        self._adopt()
        self._publish_if_due()
        self._apply_control()
        try:
            polled = self.documents.poll(timeout_ms=500, max_records=self.settings.max_poll_records)
        except KafkaError as exc:
            self.broker_error("poll")
            event(log, "poll_failed", logging.WARNING, error=str(exc))
            time.sleep(1.0)
            return
        docs = []
        for _, records in polled.items():
            self.telemetry.consumed.inc(len(records))
            for r in records:
                parsed = parse_document(r.value, self.limits)
                if not isinstance(parsed, Rejected):  # the assigners dead-letter bad documents
                    docs.append(parsed)
        self.engine.learn(docs)
        self._settle_control_outputs()
        self.readiness()

    def _leadership(self) -> None:
        assert self.election is not None and self.models_reader is not None
        elected = self.election.is_leader
        if elected and not self.leading:
            if not self.models_reader.caught_up.is_set():
                return  # number above every published version: read the models topic to its end first
            pub = self.models_reader.latest()
            if pub is not None:
                self._adopt_publication(pub)
            e = self.engine
            e.version = max(e.version, self.models_reader.max_seen())
            self.published_version = max(self.published_version, pub.version if pub is not None else 0)
            self.published_refits = -1  # a round that ended while the leadership moved is published now
            self.leading = True
            e.refits_enabled = True
            self.roles.leader.labels(self.instance_id).set(1)
            event(log, "refit_leader_elected", worker=self.instance_id, latest_published=self.published_version,
                  next_version=e.version + 1, window=len(e.window), seeds=len(e.seeds))
            self._take_over_suggestions()
        elif not elected and self.leading:
            self.leading = False
            self.engine.refits_enabled = False
            self.roles.leader.labels(self.instance_id).set(0)
            event(log, "refit_leadership_lost", logging.WARNING, worker=self.instance_id,
                  published_version=self.published_version)

    def _take_over_suggestions(self) -> None:
        """A new leader takes the suggestion queue over: what the topic holds (a previous leader's, or its own from
        an earlier term) is tombstoned unless its rounds rank it again, as a restarted worker does."""
        adopt_suggestions(self.settings, self.engine)

    def _adopt(self) -> None:
        """Standbys (and a leader that sees a newer version than its own) take published models into their engine."""
        pub = self.models_reader.latest() if self.models_reader is not None else None
        if pub is None or pub.publication_id == self.adopted:
            return
        if self.leading and (pub.writer == self.instance_id or pub.version <= self.published_version):
            self.adopted = pub.publication_id
            return
        self._adopt_publication(pub)

    def _adopt_publication(self, pub: Publication) -> None:
        if pub.publication_id == self.adopted:
            return
        self.engine.adopt_models(pub.models, pub.version, pub.primary)
        self.adopted = pub.publication_id
        self.roles.serving(pub.version)
        event(log, "model_adopted", version=pub.version, writer=pub.writer, leader=self.leading)

    def _publish_if_due(self) -> None:
        """The leader publishes a refit round once its models are in: when the round ends, or earlier when only
        its held-out probes (``primary = auto``) are left (checked before any new round can start)."""
        e = self.engine
        if not self.leading or not e.ready or not round_fitted(e):
            return
        if not e.refitting:
            if e.refit_count == self.published_refits:
                return
            self.published_refits = e.refit_count
        version = max(slot.version for slot in e.models.values())
        if version <= self.published_version:
            return
        oldest = e.window.oldest_ts()
        window = {"documents": len(e.window), "oldest_ts": oldest, "max_docs": e.config.window_max_docs,
                  "n_train": max(slot.n_train for slot in e.models.values())}
        # the reader knows the versions published so far: keep the newest of them, the new one makes two
        obsolete = self.models_reader.obsolete(keep=1) if self.models_reader is not None else []
        try:
            info = self.publisher.publish(e.models, version=version, parent_version=self.published_version or None,
                                          primary=e.refresh_primary(), n_features=e.config.n_features,
                                          stop_words=e.config.stop_words, window=window, seeds=len(e.seeds),
                                          obsolete=obsolete)
        except Exception as exc:  # noqa: BLE001 - published again after the next round
            self.published_refits = -1  # retry at the next step
            self.broker_error("produce")
            event(log, "model_publish_failed", logging.WARNING, version=version, error=f"{type(exc).__name__}: {exc}")
            return
        parent, self.published_version = self.published_version, version
        self.roles.serving(version)
        self.roles.published.labels(DEFAULT_STREAM).inc()
        self.roles.publish_bytes.labels(DEFAULT_STREAM).set(info["bytes"])
        self.roles.publish_seconds.labels(DEFAULT_STREAM).set(info["seconds"])
        event(log, "model_published", worker=self.instance_id, parent_version=parent or None, **info,
              algorithms=sorted(e.models), seeds=len(e.seeds), window=len(e.window))

    # ------------------------------------------------------------------ control
    def _apply_control(self) -> None:
        if self.control is None:
            return
        dead = []
        for raw, partition, offset, key in self.control.drain():
            msg = parse_control(raw, self.limits)
            if isinstance(msg, Rejected):
                dead.append((dead_letter(raw, msg.reason, msg.detail, self.settings.control_topic, partition, offset,
                                         key), msg))
                continue
            if msg.op == "refit":
                self.engine.request_refit("request")
            elif msg.op == "unlabel":
                self.engine.unlabel(msg.id, offset)
            elif msg.op == "name":  # the leader's clusters (standbys rebuild its seeds from the control topic)
                if self.leading and not self.control.replayed(partition, offset):
                    dead.extend((dead_letter(encode_json(op), rej.reason, rej.detail, self.settings.control_topic,
                                             partition, offset), rej)
                                for op, rej in self.engine.name_cluster(msg.cluster, msg.labels[0], msg.algorithm,
                                                                        offset))
            else:
                for op, rej in self.engine.label(msg.id, msg.labels, msg.text, offset, msg.origin, msg.label_offset):
                    dead.append((dead_letter(encode_json(op), rej.reason, rej.detail, self.settings.control_topic,
                                             partition, offset), rej))
        self._send_dead(dead)

    def _settle_control_outputs(self) -> None:
        """The leader re-emits resolved seeds, dead-letters expired labels and publishes its suggestion queue;
        standbys drop theirs (no duplicates; they rank nothing, so their boards stay empty)."""
        resolved = self.engine.drain_resolved()
        dead = self.engine.drain_dead()
        clusters = self.engine.drain_cluster_events()
        if not self.leading:
            return
        for doc_id, msg in self.engine.suggestion_updates():  # after each round, tombstones between (docs/suggestions.md)
            self._send(self.settings.suggestions_topic, encode_key(doc_id), None if msg is None else encode_json(msg))
        for ev in clusters:  # lifecycle events of the leader's refit rounds (docs/clusters.md)
            self._send(self.settings.clusters_topic, cluster_event_key(ev), encode_json(ev))
        for seed in resolved:
            msg = resolved_seed_op(seed)
            if msg is not None:
                self._send(self.settings.control_topic, encode_key(seed.id), encode_json(msg))
        self._send_dead([(dead_letter(encode_json(op), rej.reason, rej.detail, self.settings.control_topic), rej)
                         for op, rej in dead])

    def _send_dead(self, dead: list[tuple[dict, Rejected]]) -> None:
        if not self.leading:
            return
        for value, rej in dead:
            self.telemetry.dead_letters.labels(rej.reason).inc()
            self._send(self.settings.deadletter_topic, None, encode_json(value))

    def _send(self, topic: str, key: bytes | None, value: bytes) -> None:
        try:
            if self.producer is None:
                self.producer = make_producer(self.settings, allow_auto_create_topics=False, max_block_ms=10000)
            self.producer.send(topic, key=key, value=value)
        except KafkaError as exc:
            self.broker_error("produce")
            event(log, "send_failed", logging.WARNING, topic=topic, error=str(exc))


def make_worker(settings: Settings) -> Any:
    """The process of ``settings.role``: :class:`Worker` (all), :class:`Refitter` or :class:`AssignWorker`."""
    role = settings.role
    if settings.streams and role in ("refit", "assign"):  # per-stream models (streamsemi.service.stream_roles)
        from streamsemi.service import stream_roles

        return (stream_roles.StreamRefitter if role == "refit" else stream_roles.StreamAssignWorker)(settings)
    if role == "refit":
        return Refitter(settings)
    if role == "assign":
        return AssignWorker(settings)
    return Worker(settings)
