"""Helpers for tests against the real embedded broker: topics, worker processes, reading topics."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kafka import KafkaAdminClient, KafkaProducer, TopicPartition
from kafka.admin import NewTopic

from streamsemi.devtools.broker import EmbeddedBroker, free_port, port_free
from streamsemi.service.config import resolve
from streamsemi.service.kafka_io import assign_all, ensure_topics, make_reader


@dataclass
class BrokerHandle:
    broker: EmbeddedBroker

    @property
    def bootstrap(self) -> str:
        return self.broker.bootstrap_servers


@dataclass
class Topics:
    """Unique topic names and group for one test."""

    prefix: str = field(default_factory=lambda: "t" + uuid.uuid4().hex[:10])

    @property
    def documents(self) -> str:
        return f"{self.prefix}.documents"

    @property
    def control(self) -> str:
        return f"{self.prefix}.control"

    @property
    def assignments(self) -> str:
        return f"{self.prefix}.assignments"

    @property
    def deadletter(self) -> str:
        return f"{self.prefix}.deadletter"

    @property
    def labels(self) -> str:
        return f"{self.prefix}.labels"

    @property
    def clusters(self) -> str:
        return f"{self.prefix}.clusters"

    @property
    def suggestions(self) -> str:
        return f"{self.prefix}.suggestions"

    @property
    def group(self) -> str:
        return f"{self.prefix}-group"

    def flags(self) -> list[str]:
        return ["--documents-topic", self.documents, "--control-topic", self.control,
                "--assignments-topic", self.assignments, "--deadletter-topic", self.deadletter,
                "--labels-topic", self.labels, "--clusters-topic", self.clusters,
                "--suggestions-topic", self.suggestions]

    def settings(self, bootstrap: str) -> Any:
        return resolve({"bootstrap_servers": bootstrap, "documents_topic": self.documents,
                        "control_topic": self.control, "assignments_topic": self.assignments,
                        "deadletter_topic": self.deadletter, "labels_topic": self.labels,
                        "clusters_topic": self.clusters, "suggestions_topic": self.suggestions})

    def create(self, bootstrap: str) -> None:
        ensure_topics(self.settings(bootstrap))

    def create_assignments(self, bootstrap: str, partitions: int) -> Topics:
        """Create the assignments topic alone, with ``partitions`` partitions (producer tests); returns self."""
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            admin.create_topics([NewTopic(self.assignments, partitions, 1)])
        finally:
            admin.close()
        return self


def producer(bootstrap: str) -> KafkaProducer:
    return KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks="all")


def send_json(p: KafkaProducer, topic: str, obj: Any, key: str | None = None) -> None:
    p.send(topic, key=key.encode() if key else None, value=json.dumps(obj).encode())


# A bound on failure, never a pass condition: anything that involves a fit or a broker round trip may take
# minutes on a loaded machine (2 cores shared by several test runs), and a wait returns as soon as its event comes.
DEADLINE = 240.0


def wait_for(predicate: Any, deadline: float, what: str, interval: float = 0.3, logs: Any = ()) -> Any:
    """Poll ``predicate`` until it returns a truthy value, and return that value.

    Parameters
    ----------
    predicate : callable
        Called with no argument; an exception it raises counts as "not yet" (a broker or an HTTP
        endpoint that is not up yet) and is reported if the deadline passes.
    deadline : float
        Seconds before giving up: a bound on failure (use :data:`DEADLINE` for anything that
        involves a fit or a broker round trip), never a pass condition.
    what : str
        The event waited for, named in the failure message.
    interval : float
        Seconds between calls.
    logs : iterable of Path
        Files whose last 3,000 characters the failure message includes (a worker's log).

    Raises
    ------
    AssertionError
        When ``deadline`` passes first: names ``what``, the deadline, the predicate's last value
        or exception and the log tails.
    """
    end = time.monotonic() + deadline
    last: Any = None
    last_exc: Exception | None = None
    while True:
        try:
            last = predicate()
            if last:
                return last
        except Exception as exc:  # noqa: BLE001 - retried until the deadline, reported after it
            last_exc = exc
        if time.monotonic() >= end:
            break
        time.sleep(interval)
    tails = "\n".join(f"--- {Path(p).name}\n{Path(p).read_text(errors='replace')[-3000:]}"
                      for p in logs if Path(p).exists())
    raise AssertionError(f"timed out after {deadline:.0f} s waiting for {what} (last value: {last!r:.300}, "
                         f"last error: {last_exc!r})" + (f"\n{tails}" if tails else ""))


def read_topic(bootstrap: str, topic: str, expect: int | None = None, timeout: float = DEADLINE,
               idle: float = 3.0) -> list[Any]:
    """All records of ``topic`` from the beginning.

    With ``expect``: until ``expect`` records arrived (or ``timeout`` passed: fewer records).
    Without: until the reader has caught up with every partition's high-water mark as the broker
    last reported it, and no record came for ``idle`` seconds since then. The quiet time counts
    from the first fetch answer, not from the call: on a loaded machine joining and the first fetch
    can take longer than ``idle``, and an empty answer before them means nothing.
    """
    settings = resolve({"bootstrap_servers": bootstrap})
    c = make_reader(settings)
    tps = assign_all(c, topic)
    out: list[Any] = []
    t0 = time.monotonic()
    last: float | None = None  # when the last record came, or when the reader first caught up
    try:
        while time.monotonic() - t0 < timeout:
            batch = c.poll(timeout_ms=300)
            for records in batch.values():
                out.extend(records)
                if records:
                    last = time.monotonic()
            if expect is not None:
                if len(out) >= expect:
                    break
                continue
            highs = [c.highwater(tp) for tp in tps]
            caught_up = all(h is not None for h in highs) and all(c.position(tp) >= h for tp, h in zip(tps, highs, strict=True))
            if not caught_up:
                continue
            if last is None:
                last = time.monotonic()
            if time.monotonic() - last >= idle:
                break
    finally:
        c.close()
    return out


def read_table(bootstrap: str, topic: str, timeout: float = DEADLINE, idle: float = 1.0) -> dict[str, dict]:
    """A compacted topic as its readers see it: the last JSON value per key, keys whose last record is a
    tombstone left out."""
    table: dict[str, dict] = {}
    for r in read_topic(bootstrap, topic, timeout=timeout, idle=idle):
        key = r.key.decode()
        table.pop(key, None)
        if r.value is not None:
            table[key] = json.loads(r.value)
    return table


def committed_offsets(bootstrap: str, topic: str, group: str) -> dict[int, int | None]:
    from kafka import KafkaConsumer

    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        parts = c.partitions_for_topic(topic) or set()
        return {p: c.committed(TopicPartition(topic, p)) for p in sorted(parts)}
    finally:
        c.close()


def listen_port() -> int:
    """A free port below the kernel's ephemeral range, for a process started later to listen on.

    ``free_port`` hands out a port from the ephemeral range, which the outgoing Kafka connections
    of every process also draw from: between the pick and the worker's bind one of them can take
    it (seen once in CI: the refitter stopped with "metrics_port ... Address already in use").
    """
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return free_port()
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(max(1024, low - 12000), low)
        if port_free("127.0.0.1", port):
            return port
    return free_port()


class WorkerProcess:
    """``streamsemi run`` as a separate process."""

    def __init__(self, bootstrap: str, topics: Topics, extra: list[str] | None = None, log_dir: Path | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.metrics_port = listen_port()
        self.cmd = [sys.executable, "-m", "streamsemi", "run", "--bootstrap-servers", bootstrap,
                    "--group-id", topics.group, *topics.flags(), "--metrics-port", str(self.metrics_port),
                    "--session-timeout-ms", "6000", "--heartbeat-interval-ms", "1000", *(extra or [])]
        self.log_path = (log_dir or Path("/tmp")) / f"worker-{uuid.uuid4().hex[:6]}.log"
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen | None = None

    def start(self) -> WorkerProcess:
        self.log = open(self.log_path, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=self.log, env=self.env)
        return self

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}{path}", timeout=2) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        """Sum of the samples called ``name`` whose labels include ``labels`` (None if absent)."""
        from prometheus_client.parser import text_string_to_metric_families

        try:
            _, body = self.get("/metrics")
        except OSError:
            return None
        total = None
        for fam in text_string_to_metric_families(body):
            for s in fam.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in (labels or {}).items()):
                    total = (total or 0.0) + s.value
        return total

    def wait_ready(self, timeout: float = DEADLINE) -> bool:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            try:
                code, _ = self.get("/readyz")
                if code == 200:
                    return True
            except OSError:
                pass
            if self.proc is not None and self.proc.poll() is not None:
                return False
            time.sleep(0.3)
        return False

    def wait_assigned(self, timeout: float = DEADLINE) -> bool:
        """Wait until the worker's consumer has partitions (from /readyz details)."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            try:
                _, body = self.get("/readyz")
                if json.loads(body).get("partitions_assigned"):
                    return True
            except (OSError, ValueError):
                pass
            if self.proc is not None and self.proc.poll() is not None:
                return False
            time.sleep(0.3)
        return False

    def wait_metric(self, name: str, at_least: float, timeout: float = DEADLINE,
                    labels: dict[str, str] | None = None) -> float | None:
        t0 = time.monotonic()
        value = None
        while time.monotonic() - t0 < timeout:
            value = self.metric(name, labels)
            if value is not None and value >= at_least:
                return value
            time.sleep(0.3)
        return value

    def terminate(self, timeout: float = DEADLINE) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def logs(self) -> list[dict]:
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                out.append({"raw": line})
        return out


# ---------------------------------------------------------------- reliability helpers (tests/test_reliability.py)
def start_own_broker(log_dir: Path, port: int | None = None) -> EmbeddedBroker:
    """A separate broker for a test that stops, kills or restarts it (never the session broker)."""
    return EmbeddedBroker(port=port, log_file=log_dir / "tansu.log").start()


def kill_broker(b: EmbeddedBroker) -> None:
    """SIGKILL the broker (it keeps nothing: Tansu is memory-only)."""
    if b.proc is not None:
        b.proc.kill()
        b.proc.wait(10)
        b.proc = None


def id_positions(bootstrap: str, topic: str, expect: int | None = None, timeout: float = DEADLINE) -> dict[str, tuple[int, int]]:
    """``{document id: (partition, offset)}`` of the JSON documents on ``topic``."""
    out: dict[str, tuple[int, int]] = {}
    for r in read_topic(bootstrap, topic, expect=expect, timeout=timeout):
        try:
            doc_id = json.loads(r.value)["id"]
        except (ValueError, KeyError, TypeError):
            continue
        out[doc_id] = (r.partition, r.offset)
    return out


def assigned_ids(bootstrap: str, topic: str, expect: int | None = None, timeout: float = DEADLINE,
                 idle: float = 3.0) -> list[str]:
    """Document ids of every assignment record on ``topic`` (with repeats)."""
    return [json.loads(r.value)["id"] for r in read_topic(bootstrap, topic, expect=expect, timeout=timeout, idle=idle)]


def wait_until(predicate: Any, timeout: float, interval: float = 0.3) -> bool:
    """True as soon as ``predicate()`` is truthy, False once ``timeout`` passed: for a caller that handles the
    timeout itself; a test that asserts the event waits with :func:`wait_for` (which names what it waited for)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


def alive(pid: int) -> bool:
    """The process runs (not gone, not a zombie waiting to be reaped): read from /proc, so nothing is reaped."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def scheduling(pid: int) -> tuple[int, int]:
    """``(scheduling policy, nice value)`` of a process, read from /proc/PID/stat (fields 41 and 19)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[38]), int(fields[16])
