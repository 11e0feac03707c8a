"""Kafka clients: topic creation, producer and consumer construction, the control reader."""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import KafkaConfigurationError, KafkaError, TopicAlreadyExistsError

from streamsemi.core.errors import ConfigError
from streamsemi.core.logs import event
from streamsemi.service.config import Settings, kafka_security
from streamsemi.service.producer import KeyPartitioner, OutputProducer, ProcessProducer

log = logging.getLogger("streamsemi.kafka")

T = TypeVar("T")


def _client(make: Callable[..., T], **conf: Any) -> T:
    """Construct a kafka-python client; a configuration it refuses becomes a :class:`ConfigError`.

    :func:`streamsemi.service.config.resolve` checks the settings kafka-python would
    refuse (codec libraries, heartbeat vs session timeout, TLS files) at start; this is
    the backstop for a combination it does not know about, so that it is reported in
    one line instead of a traceback.
    """
    try:
        return make(**conf)
    except KafkaConfigurationError as exc:
        raise ConfigError(f"Kafka client settings refused by kafka-python ({make.__name__}): {exc}") from None


#: Topic configs of the topics created at start (the labels topic is a table: the latest value per key).
TOPIC_CONFIGS = {"labels_topic": {"cleanup.policy": "compact"}, "clusters_topic": {"cleanup.policy": "compact"},
                 "suggestions_topic": {"cleanup.policy": "compact"}}


def topics_of(settings: Settings) -> list[str]:
    return [settings.documents_topic, settings.control_topic, settings.assignments_topic, settings.deadletter_topic,
            settings.labels_topic, settings.clusters_topic, settings.suggestions_topic]


def topic_configs(settings: Settings, topic: str) -> dict[str, str]:
    """Configs a topic is created with (``cleanup.policy=compact`` for the labels topic)."""
    return next((conf for name, conf in TOPIC_CONFIGS.items() if settings.values.get(name) == topic), {})


#: the quick reachability check (bootstrap_problem): seconds for a TCP connection to one bootstrap server
#: (kafka-python retries a refused or silent address until its bootstrap timeout, and then names no address)
BOOTSTRAP_CONNECT_TIMEOUT_S = 3.0


def bootstrap_problem(bootstrap_servers: str, timeout_s: float = BOOTSTRAP_CONNECT_TIMEOUT_S) -> str | None:
    """What a TCP connection to each bootstrap server got, or None as soon as one connects.

    Parameters
    ----------
    bootstrap_servers : str
        ``HOST:PORT[,HOST:PORT...]`` (checked by the settings: IPv6 hosts in brackets).
    timeout_s : float
        Seconds per address.

    Returns
    -------
    str or None
        ``"127.0.0.1:1: Connection refused"`` (one entry per address, ``; ``-separated) when none
        connects; None when one does (TLS and SASL are left to the Kafka client).
    """
    tried = []
    for part in bootstrap_servers.split(","):
        address = part.strip()
        host, _, port = address.rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
                return None
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            tried.append(f"{address}: {reason}")
    return "; ".join(tried)


def bootstrap_timeout(ms: int, client: type = KafkaConsumer) -> dict[str, int]:
    """``{"bootstrap_timeout_ms": ms}`` when the installed kafka-python's ``client`` has that setting (its
    default is 30 s), else ``{}``: how long a client waits for an unreachable broker."""
    return {"bootstrap_timeout_ms": ms} if "bootstrap_timeout_ms" in getattr(client, "DEFAULT_CONFIG", {}) else {}


def ensure_topics(settings: Settings, topics: list[str] | None = None, timeout_s: float = 30.0) -> list[str]:
    """Create missing topics (explicitly: auto-created topics get the broker's defaults). Returns those created."""
    topics = topics or topics_of(settings)
    return create_missing_topics(settings, {t: (settings.topic_partitions, topic_configs(settings, t)) for t in topics},
                                 timeout_s)


def create_missing_topics(settings: Settings, specs: dict[str, tuple[int, dict[str, str]]], timeout_s: float = 30.0,
                          what: str = "topics") -> list[str]:
    """Create each topic of ``specs`` (name -> (partitions, configs)) that does not exist; returns those created.

    Retries an unreachable broker until ``timeout_s``, then raises ConnectionError naming ``what``.
    """
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    problem = bootstrap_problem(settings.bootstrap_servers)
    if problem is not None:  # said at once, not when the wait for a broker that may be starting ends
        event(log, "kafka_unreachable", logging.WARNING, bootstrap_servers=settings.bootstrap_servers, tried=problem,
              action=f"retrying for {timeout_s:g} s to create {what}")
    while time.monotonic() < deadline:
        # one bootstrap may not outlast the deadline (kafka-python's own default is 30 s)
        wait = bootstrap_timeout(max(1000, int((deadline - time.monotonic()) * 1000)), KafkaAdminClient)
        try:
            admin = _client(KafkaAdminClient, bootstrap_servers=settings.bootstrap_servers,
                            client_id="streamsemi-admin", request_timeout_ms=10000, **wait, **kafka_security(settings))
            try:
                existing = set(admin.list_topics())
                created = []
                for t, (partitions, conf) in specs.items():
                    if t in existing:
                        continue
                    try:
                        admin.create_topics([NewTopic(t, partitions, settings.replication_factor, topic_configs=conf)])
                        created.append(t)
                    except TopicAlreadyExistsError:
                        pass
                return created
            finally:
                admin.close()
        except KafkaError as exc:
            last = exc
            time.sleep(0.5)
    raise ConnectionError(f"cannot reach Kafka at {settings.bootstrap_servers} to create {what}: {last}")


def producer_config(settings: Settings, **overrides: Any) -> dict[str, Any]:
    """kafka-python producer settings of plain values for outputs (batched, idempotent with acks=all).

    No partitioner: :func:`make_producer` and the producer process add :class:`KeyPartitioner`.
    """
    acks: Any = settings.producer_acks if settings.producer_acks == "all" else int(settings.producer_acks)
    conf: dict[str, Any] = dict(
        bootstrap_servers=settings.bootstrap_servers, acks=acks, linger_ms=10, batch_size=128 * 1024,
        enable_idempotence=settings.producer_acks == "all", client_id="streamsemi-producer",
        max_request_size=max(1_048_576, settings.max_message_bytes * 2),
        **kafka_security(settings),
    )
    if settings.compression:
        conf["compression_type"] = settings.compression
    conf.update(overrides)
    return conf


def make_producer(settings: Settings, **overrides: Any) -> KafkaProducer:
    """Producer for outputs, dead letters and control messages (batched, idempotent with acks=all)."""
    return _client(OutputProducer, **{"partitioner": KeyPartitioner(), **producer_config(settings, **overrides)})


def make_process_producer(settings: Settings, **kw: Any) -> ProcessProducer:
    """The worker's output producer when ``producer_process`` is on: the Kafka work in its own process.

    ``kw`` goes to :class:`~streamsemi.service.producer.ProcessProducer` (``on_start``,
    ``on_death``, batch bounds); kafka-python refusing the settings is a :class:`ConfigError`.
    """
    conf = producer_config(settings, allow_auto_create_topics=False, max_block_ms=10000)
    try:
        return ProcessProducer(conf, log_level=settings.log_level, **kw)
    except KafkaConfigurationError as exc:
        raise ConfigError(f"Kafka client settings refused by kafka-python (KafkaProducer): {exc}") from None


def make_document_consumer(settings: Settings) -> KafkaConsumer:
    """Group consumer of the documents topic; offsets committed by the worker after outputs are flushed."""
    return _client(
        KafkaConsumer, bootstrap_servers=settings.bootstrap_servers, group_id=settings.group_id, client_id="streamsemi-worker",
        enable_auto_commit=False, auto_offset_reset="earliest", max_poll_records=settings.max_poll_records,
        fetch_max_wait_ms=settings.fetch_max_wait_ms,
        session_timeout_ms=settings.session_timeout_ms, heartbeat_interval_ms=settings.heartbeat_interval_ms,
        max_poll_interval_ms=settings.max_poll_interval_ms, allow_auto_create_topics=False,
        fetch_max_bytes=64 * 1024 * 1024, max_partition_fetch_bytes=max(1_048_576, settings.max_message_bytes * 2),
        **kafka_security(settings),
    )


def make_reader(settings: Settings, **overrides: Any) -> KafkaConsumer:
    """Group-less consumer (for assign() + seek)."""
    conf: dict[str, Any] = dict(bootstrap_servers=settings.bootstrap_servers, group_id=None, enable_auto_commit=False,
                                auto_offset_reset="earliest", client_id="streamsemi-reader",
                                fetch_max_bytes=64 * 1024 * 1024,
                                max_partition_fetch_bytes=max(1_048_576, settings.max_message_bytes * 2),
                                **kafka_security(settings))
    conf.update(overrides)
    return _client(KafkaConsumer, **conf)


def assign_all(consumer: KafkaConsumer, topic: str, timeout_s: float = 30.0, from_beginning: bool = True) -> list[TopicPartition]:
    """Assign every partition of ``topic`` to a group-less consumer."""
    deadline = time.monotonic() + timeout_s
    while True:
        parts = consumer.partitions_for_topic(topic)
        if parts:
            break
        if time.monotonic() > deadline:
            raise ConnectionError(f"topic {topic!r} has no partitions visible after {timeout_s}s")
        consumer.topics()
        time.sleep(0.2)
    tps = [TopicPartition(topic, p) for p in sorted(parts)]
    consumer.assign(tps)
    if from_beginning:
        consumer.seek_to_beginning(*tps)
    return tps


class ControlReader(threading.Thread):
    """Reads the WHOLE control topic from the beginning (all partitions, no group) into a queue.

    Every worker sees every seed, and seeds survive restarts because the topic
    is replayed at start. Items are ``(raw bytes, partition, offset, key)``.
    """

    def __init__(self, settings: Settings, on_error: Any = None, on_reset: Any = None) -> None:
        super().__init__(name="control-reader", daemon=True)
        self.settings = settings
        self.queue: queue.Queue[tuple[bytes | None, int, int, bytes | None]] = queue.Queue(maxsize=100_000)
        self.stop_event = threading.Event()
        self.caught_up = threading.Event()
        self.on_error = on_error
        self.on_reset = on_reset
        self.consumer: KafkaConsumer | None = None
        self.replay_end: dict[int, int] | None = None  # positions once the history was read (caught_up)
        self.lag = 0  # control records known to wait unread on the broker (after the last poll)

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                self.consumer = make_reader(self.settings, client_id="streamsemi-control", allow_auto_create_topics=False)
                tps = assign_all(self.consumer, self.settings.control_topic)
                high: dict[TopicPartition, int] = {}
                while not self.stop_event.is_set():
                    batch = self.consumer.poll(timeout_ms=500, max_records=2000)
                    for tp, records in batch.items():
                        for r in records:
                            self.queue.put((r.value, tp.partition, r.offset, r.key))
                    if self._lost_log(tps, high):
                        break  # assign again (the topic may have come back with another partition count)
                    self.lag = self._unread(tps)
                    if not batch and not self.caught_up.is_set():
                        if all(self.consumer.position(tp) >= (self.consumer.highwater(tp) or 0) for tp in tps):
                            # the history read at start ends here (positions, not the broker's end offsets: the
                            # embedded broker reports a multi-record batch's end as its first offset + 1)
                            self.replay_end = {tp.partition: int(self.consumer.position(tp)) for tp in tps}
                            event(log, "control_history_read", topic=self.settings.control_topic,
                                  positions={str(p): o for p, o in sorted(self.replay_end.items())})
                            self.caught_up.set()
            except Exception as exc:  # noqa: BLE001 - keep reading after broker trouble
                event(log, "control_reader_error", logging.WARNING, error=f"{type(exc).__name__}: {exc}")
                if self.on_error:
                    self.on_error("control")
                self.stop_event.wait(1.0)
            finally:
                if self.consumer is not None:
                    try:
                        self.consumer.close()
                    except Exception:  # noqa: BLE001
                        pass
                    self.consumer = None

    def _unread(self, tps: list[TopicPartition]) -> int:
        """Records between the reader's position and the high watermark (this thread's consumer state only)."""
        assert self.consumer is not None
        total = 0
        for tp in tps:
            hw = self.consumer.highwater(tp)
            pos = self.consumer.position(tp) if hw is not None else None
            if pos is not None:
                total += max(0, hw - pos)
        return total

    def backlog(self) -> int:
        """Control records not applied yet: unread on the broker plus read and queued."""
        return self.lag + self.queue.qsize()

    def replayed(self, partition: int, offset: int) -> bool:
        """The record was read with the control topic's history at start (before the reader first caught up)."""
        ends = self.replay_end
        return ends is None or offset < ends.get(partition, 0)

    def _lost_log(self, tps: list[TopicPartition], high: dict[TopicPartition, int]) -> bool:
        """Detect a broker that lost the topic's log (restarted empty) and replay it from the beginning.

        On a real cluster a partition's high watermark never goes down and the
        reader's position never passes it. A broker that forgot its data shows
        both; an ``assign()`` consumer would otherwise wait silently past the end.
        """
        assert self.consumer is not None
        lost = []
        seen: dict[TopicPartition, int] = {}
        for tp in tps:
            hw = self.consumer.highwater(tp)
            if hw is None:
                continue
            seen[tp] = hw
            pos = self.consumer.position(tp)
            if (pos is not None and pos > hw) or hw < high.get(tp, 0):
                lost.append(tp)
        if not lost:
            high.update(seen)
            return False
        high.clear()
        event(log, "control_log_lost", logging.WARNING, topic=self.settings.control_topic,
              partitions=sorted(tp.partition for tp in lost), action="replaying the control topic from the beginning")
        if self.on_reset:
            self.on_reset("control_topic")
        return True

    def drain(self, limit: int = 10_000) -> list[tuple[bytes | None, int, int, bytes | None]]:
        out = []
        while len(out) < limit:
            try:
                out.append(self.queue.get_nowait())
            except queue.Empty:
                break
        return out

    def stop(self) -> None:
        self.stop_event.set()


class BrokerWatch(threading.Thread):
    """Checks every ``interval_s`` that the worker's topics exist; recreates missing ones.

    A topic that disappears means the cluster lost it (or an operator deleted it):
    it is created again with the configured partitions and ``on_reset(source)`` is
    called so that the worker can drop offsets that refer to the old log.
    """

    def __init__(self, settings: Settings, on_reset: Any = None, on_error: Any = None, interval_s: float = 2.0) -> None:
        super().__init__(name="broker-watch", daemon=True)
        self.settings = settings
        self.on_reset = on_reset
        self.on_error = on_error
        self.interval_s = interval_s
        self.stop_event = threading.Event()
        self.checks = 0

    def check(self, admin: KafkaAdminClient) -> list[str]:
        """One check: the topics found missing (and created again)."""
        topics = topics_of(self.settings)
        existing = set(admin.list_topics())
        missing = [t for t in topics if t not in existing]
        self.checks += 1
        if missing:
            event(log, "topics_missing", logging.WARNING, topics=missing, action="creating them again")
            ensure_topics(self.settings, missing)
            if self.on_reset:
                self.on_reset("topics_missing")
        return missing

    def run(self) -> None:
        admin: KafkaAdminClient | None = None
        while not self.stop_event.wait(self.interval_s):
            try:
                if admin is None:
                    admin = _client(KafkaAdminClient, bootstrap_servers=self.settings.bootstrap_servers,
                                    client_id="streamsemi-watch", request_timeout_ms=10000,
                                    **kafka_security(self.settings))
                self.check(admin)
            except Exception as exc:  # noqa: BLE001 - broker trouble: report and try again
                if self.on_error:
                    self.on_error("watch")
                event(log, "broker_watch_failed", logging.DEBUG, error=f"{type(exc).__name__}: {exc}")
                if admin is not None:
                    try:
                        admin.close()
                    except Exception:  # noqa: BLE001
                        pass
                    admin = None
        if admin is not None:
            try:
                admin.close()
            except Exception:  # noqa: BLE001
                pass

    def stop(self) -> None:
        self.stop_event.set()
