"""Output producers: kafka-python's with a shorter ``send``, and one whose Kafka work runs in its own process.

* :class:`OutputProducer`: kafka-python's ``KafkaProducer`` with a short path for the
  worker's own records (:class:`KeyPartitioner` hashes a key once for its records).
* :class:`ProcessProducer`: the same interface (``send`` returning a future, ``flush``,
  ``close``) plus :meth:`~ProcessProducer.ship`; the records go in batches through a pipe to
  a long-lived *producer process* (``python -m streamsemi.service.producer``) that hands them to an :class:`OutputProducer`, waits for
  the broker's acknowledgements and answers per batch which records failed. The polling
  thread keeps ~1 us of work per record instead of kafka-python's ~30 us (record
  encoding, one ``FutureRecordMetadata`` per record, the accumulator's locks: a third of
  the constrained k-means worker's polling thread), and it does not wait for the broker's
  round trip: the second core does both.

Nothing is pickled: a batch is one ``send_bytes`` frame (over a socket pair) of a JSON topic table, an int32
length table and the raw key, value and header bytes (:func:`encode_batch` /
:func:`decode_batch`); replies are JSON. A record sent with the key :data:`BLOCK` is a
verdict block (:func:`streamsemi.core.messages.encode_verdict_block`): the process builds
its records (:func:`~streamsemi.core.messages.expand_verdict_block`) and answers for the
block as one record, failed when any of its records failed. This module imports
kafka-python, orjson (through ``streamsemi.core.messages``) and the standard library only,
so the producer process stays small (~30 MB: it does not import numpy, scikit-learn or the
engine).

A producer process that dies is reported (``producer_process_died``) and the records it
had not acknowledged fail (the output ledger sends them again: at-least-once); the next
:meth:`~ProcessProducer.ship` starts a new process.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

from kafka import KafkaProducer, TopicPartition
from kafka.errors import KafkaConfigurationError, KafkaError, KafkaTimeoutError
from kafka.partitioner import DefaultPartitioner, murmur2
from kafka.producer.producer_batch import ProducerBatch
from kafka.producer.record_accumulator import RecordAccumulator

from streamsemi.core import logs
from streamsemi.core.logs import event
from streamsemi.core.messages import expand_verdict_block
from streamsemi.service.processes import lower_priority

log = logging.getLogger("streamsemi.service.producer")


class KeyPartitioner(DefaultPartitioner):
    """kafka-python's default partitioner (murmur2 of the key), hashing a key once for its records.

    The worker sends 2-7 records per document (one assignment per algorithm, the labels
    record), algorithm after algorithm for a poll's documents: the pure-Python murmur2 ran
    for each of them. The hashes of the last ``MAX_KEYS`` keys (of at most ``MAX_KEY_BYTES``
    bytes) are remembered; the partition is the default partitioner's, so records keep
    their partitions.
    """

    MAX_KEYS = 4096
    MAX_KEY_BYTES = 256

    def __init__(self) -> None:
        self._hashes: dict[bytes, int] = {}

    def partition(self, topic: str, key: Any, serialized_key: bytes | None, value: Any, serialized_value: Any,
                  cluster: Any) -> int:
        if serialized_key is None:
            return super().partition(topic, key, serialized_key, value, serialized_value, cluster)
        if topic not in cluster.topics():
            raise ValueError(f"Topic {topic} not found in ClusterMetadata")
        partitions = sorted(cluster.partitions_for_topic(topic))
        return partitions[self.key_hash(serialized_key) % len(partitions)]

    def key_hash(self, key: bytes) -> int:
        """``murmur2(key) & 0x7fffffff``: the record goes to ``sorted(partitions)[key_hash %
        len(partitions)]``, as with the default partitioner (bounded cache: at most ``MAX_KEYS``
        keys of at most ``MAX_KEY_BYTES`` bytes, forgotten all at once when full)."""
        h = self._hashes.get(key)
        if h is None:
            h = murmur2(key) & 0x7fffffff
            if len(key) <= self.MAX_KEY_BYTES:
                if len(self._hashes) >= self.MAX_KEYS:
                    self._hashes.clear()
                self._hashes[key] = h
        return h


def _lean_send_supported() -> bool:
    """Whether the installed kafka-python's accumulator takes what :class:`OutputProducer` hands it.

    kafka-python 3's ``RecordAccumulator.append(tp, timestamp_ms, key, value, headers, now=None,
    abort_on_new_batch=False)`` returns ``(future, batch_is_full, new_batch_created,
    abort_for_new_batch)``; 2.x returned three values and had no ``abort_on_new_batch``.
    """
    try:
        params = list(inspect.signature(RecordAccumulator.append).parameters)
    except (TypeError, ValueError):
        return False
    return params[:6] == ["self", "tp", "timestamp_ms", "key", "value", "headers"] and "abort_on_new_batch" in params


def _batch_append_supported() -> bool:
    """Whether the installed kafka-python's batches are what :meth:`OutputProducer._append_to_open_batch` expects.

    ``RecordAccumulator`` keeps a deque of ``ProducerBatch`` per partition (``_batches``)
    guarded by ``_tp_lock(tp)``; a batch has ``records`` (a ``MemoryRecordsBuilder`` whose
    ``append`` returns None when it is closed or full), ``produce_future``,
    ``max_record_size`` and ``last_append``, and ``try_append`` sets no more than those.
    """
    try:
        src = inspect.getsource(ProducerBatch.try_append)
        init = inspect.getsource(ProducerBatch.__init__)
        acc = inspect.getsource(RecordAccumulator.__init__) + inspect.getsource(RecordAccumulator.append)
    except (OSError, TypeError):
        return False
    return (_lean_send_supported() and "self.records.append(" in src and "self.max_record_size" in src
            and "self.last_append" in src and "self.produce_future" in init and "self._batches" in acc
            and "self._tp_lock(tp)" in acc)


class BatchRecordFuture:
    """The outcome of a record appended to an open batch without its own future (:attr:`OutputProducer.record_futures`).

    kafka-python completes a batch's ``produce_future`` with ``(base offset, timestamp,
    record_exceptions_fn)`` whether the batch succeeded or not: a record failed when the
    batch's future failed or ``record_exceptions_fn`` is set (then it names the record's
    error by its index in the batch), as ``FutureRecordMetadata`` reads it.
    """

    __slots__ = ("batch_future", "index")

    def __init__(self, batch_future: Any, index: int) -> None:
        self.batch_future = batch_future
        self.index = index

    @property
    def is_done(self) -> bool:
        return bool(self.batch_future.is_done)

    def failed(self) -> bool:
        bf = self.batch_future
        return bool(bf.is_done and (bf.failed() or bf.value[2] is not None))

    def succeeded(self) -> bool:
        return bool(self.batch_future.is_done) and not self.failed()

    @property
    def exception(self) -> BaseException | None:
        bf = self.batch_future
        if not bf.is_done:
            return None
        if bf.failed():
            return bf.exception
        fn = bf.value[2]
        return None if fn is None else fn(self.index)


class OutputProducer(KafkaProducer):
    """kafka-python's producer with a shorter ``send`` for the worker's own records.

    ``KafkaProducer.send`` spends about a third of its time on what the worker's records
    never need: argument and header type checks, serializers, the record-size estimate and
    a debug line whose arguments are formatted for every record. For a record with a
    ``bytes`` key and value, no explicit partition or timestamp, a topic whose metadata is
    known, :class:`KeyPartitioner` and well below ``max_request_size``, :meth:`send` hands
    it to the accumulator directly, at the partition ``send`` would choose (measured in
    isolation: ~45 -> ~32 us per record). Anything else, and every record when the installed
    kafka-python's accumulator differs (:func:`_lean_send_supported`), goes through
    ``KafkaProducer.send`` unchanged. ``lean_sends`` counts the short way.

    ``record_futures`` (default True): every record gets kafka-python's own future. False
    (the producer process): a record that fits in its partition's open batch is appended
    to it directly and gets a :class:`BatchRecordFuture` over the batch's
    ``produce_future`` (done when the broker answered for the batch, which is when a
    record's own future would be), without kafka-python's per-record future and its
    callbacks, the in-progress counter and the result tuple. A record that needs a new
    batch goes through the accumulator as before. A record of a batch kafka-python split
    (MESSAGE_TOO_LARGE) keeps the old batch's future, which is never done: the record is
    reported not acknowledged and the worker sends it again (at-least-once).

    ``wake_when_full`` (default True): wake the sender thread whenever the accumulator
    reports a full batch, as ``KafkaProducer.send`` does. kafka-python 3 reports "full"
    for every record appended while a partition has more than one batch queued, so a
    caller that flushes after a burst of sends (the producer process) sets it False:
    the sender is then woken when a new batch is created and by the flush (measured in the
    producer process: the wake-ups were ~10% of its CPU, ``benchmarks/results/producer_process_s17.md``).
    """

    LEAN = _lean_send_supported()
    BATCH_APPEND = _batch_append_supported()
    _MAX_TOPICS = 1024

    def __init__(self, **configs: Any) -> None:
        super().__init__(**configs)
        self.lean_sends = 0
        self.wake_when_full = True
        self.record_futures = True
        self._order: dict[str, tuple[dict, list[TopicPartition]]] = {}  # topic -> (its metadata, partitions in order)
        self._partitioner = partitioner = self.config["partitioner"]
        self._lean = (self.LEAN and isinstance(partitioner, KeyPartitioner)
                      and isinstance(getattr(self._metadata, "_partitions", None), dict)
                      and (self._transaction_manager is None or not self._transaction_manager.is_transactional())
                      and self.config["key_serializer"] is None and self.config["value_serializer"] is None)
        self._size_room = self.config["max_request_size"] - 1024  # batch header + record overhead, with room

    def send(self, topic: str, value: Any = None, key: Any = None, headers: list | None = None,
             partition: int | None = None, timestamp_ms: int | None = None) -> Any:
        if (not self._lean or self._closed or partition is not None or timestamp_ms is not None
                or type(key) is not bytes or type(value) is not bytes or (headers is not None and type(headers) is not list)):
            return super().send(topic, value=value, key=key, headers=headers, partition=partition,
                                timestamp_ms=timestamp_ms)
        parts = self._metadata._partitions.get(topic)  # partition -> metadata; replaced, never changed, on updates
        hsize = 0
        if headers:
            for item in headers:
                if type(item) is not tuple or len(item) != 2 or type(item[0]) is not str or type(item[1]) is not bytes:
                    return super().send(topic, value=value, key=key, headers=headers)
                hsize += 4 * len(item[0]) + len(item[1]) + 10
        if not parts or len(key) + len(value) + hsize > self._size_room:
            return super().send(topic, value=value, key=key, headers=headers)
        known = self._order.get(topic)
        if known is None or known[0] is not parts:  # new metadata for the topic: partitions in order, again
            if len(self._order) >= self._MAX_TOPICS:
                self._order.clear()
            known = self._order[topic] = (parts, [TopicPartition(topic, p) for p in sorted(parts)])
        ordered = known[1]
        tp = ordered[self._partitioner.key_hash(key) % len(ordered)]
        if not self.record_futures and self.BATCH_APPEND:
            future = self._append_to_open_batch(tp, key, value, headers or [])
            if future is not None:
                self.lean_sends += 1
                return future
        future, batch_is_full, new_batch_created, _ = self._accumulator.append(tp, None, key, value, headers or [])
        if new_batch_created or (batch_is_full and self.wake_when_full):
            self._sender.wakeup()
        self.lean_sends += 1
        return future

    def _append_to_open_batch(self, tp: TopicPartition, key: bytes, value: bytes, headers: list) -> Any:
        """Append to ``tp``'s open batch; returns its :class:`BatchRecordFuture`, or None when no open batch has room.

        What ``RecordAccumulator.append`` does when the partition's last batch has room,
        under the same lock, less the per-record future (see ``record_futures``).
        """
        acc = self._accumulator
        with acc._tp_lock(tp):
            dq = acc._batches.get(tp)
            if not dq or acc._closed:
                return None
            last = dq[-1]
            meta = last.records.append(None, key, value, headers)
            if meta is None:  # full, or closed by the sender: a new batch
                return None
            if meta.size > last.max_record_size:
                last.max_record_size = meta.size
            last.last_append = time.monotonic()
            return BatchRecordFuture(last.produce_future, meta.offset)




# ---------------------------------------------------------------- the producer process
class ProducerProcessDied(KafkaError):
    """The producer process ended before acknowledging a record (it is started again at the next ship)."""

    retriable = True


class ProducerStartError(KafkaError):
    """The producer process could not create its Kafka producer (the message says why)."""


_CONFIG, _BATCH, _QUIT = b"c", b"b", b"q"


class _BlockKey:
    """The type of :data:`BLOCK`."""

    def __repr__(self) -> str:
        return "BLOCK"


#: the key of a record that is a verdict block: its value is the block, the process builds the records
BLOCK: Any = _BlockKey()
_BLOCK_KLEN = -2  # a block's key length in the frame's length table
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_BATCH_HEAD = struct.Struct("<QIII")  # batch id, records, topic-table bytes, length-table bytes
MAX_ERROR_CHARS = 500
START_TIMEOUT_S = 60.0
#: requested send buffer of the worker's end of the pipe (Linux doubles it, within net.core.wmem_max)
PIPE_BUFFER_BYTES = 4 << 20


def encode_batch(batch_id: int, topics: list[str], lengths: array, parts: list[bytes], n: int) -> bytes:
    """One batch frame: ``b"b"``, the head, the JSON topic table, the int32 length table, the raw bytes.

    ``lengths`` holds per record ``topic index, key length, value length, header count``
    (-1 for a None key or value, -2 as the key length of a verdict block), then per header
    ``name length, value length``;
    ``parts`` the key, the value, then each header's UTF-8 name and value, in that order;
    ``n`` the number of records.
    """
    table = json.dumps(topics, ensure_ascii=False).encode("utf-8")
    ints = lengths.tobytes()
    return b"".join([_BATCH, _BATCH_HEAD.pack(batch_id, n, len(table), len(ints)), table, ints, *parts])


def decode_batch(data: bytes) -> tuple[int, list[tuple[str, bytes | None, bytes | None, list[tuple[str, bytes]] | None]]]:
    """Inverse of :func:`encode_batch`: ``(batch id, [(topic, key, value, headers), ...])``.

    Records with the same header bytes share one headers list (the worker's records carry
    a few distinct ``model_version`` / ``revision`` pairs per batch); it is never modified.

    Raises
    ------
    ValueError
        A frame whose tables do not match its bytes.
    """
    data = bytes(data)
    if data[:1] != _BATCH or len(data) < 1 + _BATCH_HEAD.size:
        raise ValueError("not a batch frame")
    batch_id, n, tlen, ilen = _BATCH_HEAD.unpack_from(data, 1)
    pos = 1 + _BATCH_HEAD.size
    topics = json.loads(data[pos:pos + tlen])
    pos += tlen
    if ilen % 4:
        raise ValueError("length table is not int32")
    lengths = array("i")
    lengths.frombytes(data[pos:pos + ilen])
    pos += ilen
    ints = lengths.tolist()
    n_ints = len(ints)
    shared: dict[tuple[tuple[int, ...], bytes], list[tuple[str, bytes]]] = {}
    spans: dict[tuple[int, ...], int] = {}  # header length table -> bytes of the headers
    records: list[tuple[str, bytes | None, bytes | None, list[tuple[str, bytes]] | None]] = []
    i = 0
    for _ in range(n):
        if i + 4 > n_ints:
            raise ValueError("length table shorter than its records")
        t, klen, vlen, nh = ints[i], ints[i + 1], ints[i + 2], ints[i + 3]
        i += 4
        key = value = None
        if klen >= 0:
            key = data[pos:pos + klen]
            pos += klen
        elif klen == _BLOCK_KLEN:
            key = BLOCK
        if vlen >= 0:
            value = data[pos:pos + vlen]
            pos += vlen
        headers = None
        if nh:
            if i + 2 * nh > n_ints:
                raise ValueError("length table shorter than its records")
            sizes = tuple(ints[i:i + 2 * nh])
            i += 2 * nh
            span = spans.get(sizes)
            if span is None:
                span = sum(x for x in sizes if x > 0)
                if len(spans) < 1024:
                    spans[sizes] = span
            raw = data[pos:pos + span]
            headers = shared.get((sizes, raw))
            if headers is None:
                headers = []
                at = 0
                for h in range(0, 2 * nh, 2):
                    nl, hl = max(sizes[h], 0), max(sizes[h + 1], 0)
                    headers.append((raw[at:at + nl].decode("utf-8"), raw[at + nl:at + nl + hl]))
                    at += nl + hl
                if len(shared) < 1024:
                    shared[(sizes, raw)] = headers
            pos += span
        records.append((topics[t], key, value, headers))
    if pos > len(data):
        raise ValueError("frame shorter than its length table")
    if pos != len(data) or i != n_ints:
        raise ValueError("frame longer than its length table")
    return batch_id, records


def _error_text(exc: BaseException | None) -> str:
    return (f"{type(exc).__name__}: {exc}" if exc is not None else "unknown error")[:MAX_ERROR_CHARS]


def _failure(f: Any, flush_timeout: float) -> str | None:
    """Why a sent record (a future, the exception its send raised, or a block's list of futures) failed; None: it did not."""
    if isinstance(f, list):
        return next((e for e in (_failure(x, flush_timeout) for x in f) if e is not None), None)
    if isinstance(f, BaseException):
        return _error_text(f)
    if not f.is_done:
        return f"KafkaTimeoutError: not acknowledged within {flush_timeout:g} s"
    if f.failed():
        return _error_text(f.exception)
    return None


def serve(conn: Any, nice: int = 0) -> None:
    """The producer process: a config frame, then batches; replies which records of each batch failed.

    A thread keeps the pipe drained into a queue, so that the worker never blocks on a
    full pipe while this process waits for the broker. The main loop takes every batch
    that arrived, hands its records to an :class:`OutputProducer`, flushes, and answers
    ``[{"id": batch id, "failed": [[record index, error], ...]}, ...]``.
    """
    lower_priority(nice)
    try:
        conf = json.loads(conn.recv_bytes()[1:])
    except (EOFError, OSError, ValueError):
        return
    logs.setup(str(conf.pop("log_level", "INFO")))
    flush_timeout = float(conf.pop("flush_timeout_s", 30.0))
    try:
        producer = OutputProducer(partitioner=KeyPartitioner(), **conf)
    except Exception as exc:  # noqa: BLE001 - reported to the worker, which raises it where it made the producer
        kind = "config" if isinstance(exc, (KafkaConfigurationError, ValueError, TypeError)) else "kafka"
        try:
            conn.send_bytes(json.dumps({"error": _error_text(exc), "kind": kind}).encode())
        except (OSError, EOFError):
            pass
        return
    producer.wake_when_full = False  # every round of frames ends with a flush
    producer.record_futures = False  # the reply is per record, but a batch succeeds or fails whole
    conn.send_bytes(b'{"ready":true}')
    frames: deque[bytes | None] = deque()
    arrived = threading.Condition()

    def read() -> None:
        while True:
            try:
                data: bytes | None = conn.recv_bytes()
            except (EOFError, OSError):
                data = None
            with arrived:
                frames.append(data)
                arrived.notify()
            if data is None or data[:1] == _QUIT:
                return

    threading.Thread(target=read, name="producer-pipe", daemon=True).start()
    stop = orphan = False
    while not stop:
        with arrived:
            while not frames:
                arrived.wait()
            todo = list(frames)
            frames.clear()
        sent: list[tuple[int, list[Any]]] = []
        refused: list[dict[str, Any]] = []
        for frame in todo:
            if frame is None or frame[:1] == _QUIT:
                stop = True
                orphan = frame is None  # the worker is gone: its offsets are not committed, nothing waits for these
                break
            try:
                batch_id, records = decode_batch(frame)
            except (ValueError, UnicodeDecodeError, IndexError, struct.error) as exc:
                event(log, "producer_frame_refused", logging.ERROR, error=_error_text(exc))
                if len(frame) >= 1 + _BATCH_HEAD.size:  # every record of the batch fails: the worker sends them again
                    refused.append({"id": _BATCH_HEAD.unpack_from(frame, 1)[0], "error": _error_text(exc)})
                continue
            futures: list[Any] = []
            for topic, key, value, headers in records:
                try:
                    if key is BLOCK:  # a verdict block: its records, answered as one
                        futures.append([producer.send(topic, key=k, value=v, headers=h)
                                        for k, v, h in expand_verdict_block(value or b"")])
                    else:
                        futures.append(producer.send(topic, key=key, value=value, headers=headers))
                except Exception as exc:  # noqa: BLE001 - this record fails; the worker sends it again
                    futures.append(exc)
            sent.append((batch_id, futures))
        if refused and not orphan:
            try:
                conn.send_bytes(json.dumps(refused).encode())
            except (OSError, EOFError):
                stop = True
        if sent and not orphan:
            try:
                producer.flush(timeout=flush_timeout)
            except KafkaError:
                pass  # what is not acknowledged yet fails below
            reply = []
            for batch_id, futures in sent:
                failed = []
                for i, f in enumerate(futures):
                    error = _failure(f, flush_timeout)
                    if error is not None:
                        failed.append([i, error])
                reply.append({"id": batch_id, "failed": failed})
            try:
                conn.send_bytes(json.dumps(reply).encode())
            except (OSError, EOFError):
                stop = True
    try:
        producer.close(timeout=0 if orphan else flush_timeout)
    except Exception:  # noqa: BLE001 - exiting anyway
        pass


class _Sent:
    """The future of a record handed to a :class:`ProcessProducer` (kafka-python's ``Future`` attributes the ledger reads)."""

    __slots__ = ("is_done", "exception")

    def __init__(self) -> None:
        self.is_done = False
        self.exception: BaseException | None = None

    def failed(self) -> bool:
        return self.is_done and self.exception is not None

    def succeeded(self) -> bool:
        return self.is_done and self.exception is None


class _Child:
    """One producer process, its pipe, the batches it has not answered and the thread that reads its answers."""

    def __init__(self, conf: dict[str, Any], nice: int, on_death: Callable[[_Child], None],
                 on_failed: Callable[[int], None]) -> None:
        # `python -m streamsemi.service.producer FD`, not multiprocessing: a spawned child would import the
        # worker's main script again (the `streamsemi` console script imports the whole CLI: +150 MB, +1.5 s)
        ours, theirs = socket.socketpair()
        # room for a whole batch in the kernel: a send no longer waits for the (niced) process to read
        # (4% of the polling thread waited there); the kernel caps it at net.core.wmem_max
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, PIPE_BUFFER_BYTES)
        env = dict(os.environ)  # the package where the worker found it, also when it is not installed
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH", "")) if p)
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "streamsemi.service.producer", str(theirs.fileno()),
                                          str(int(nice))], pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, close_fds=True, env=env)
        finally:
            theirs.close()  # the worker keeps one end only: the process's death closes the socket (EOF)
        parent = Connection(ours.detach())
        self.conn = parent
        self.cond = threading.Condition()
        self.inflight: dict[int, list[_Sent]] = {}
        self.dead: str | None = None
        self.closing = False
        self.on_death = on_death
        self.on_failed = on_failed
        try:
            parent.send_bytes(_CONFIG + json.dumps(conf).encode())
            if not parent.poll(START_TIMEOUT_S):
                raise ProducerStartError(f"the producer process did not start within {START_TIMEOUT_S:g} s")
            hello = json.loads(parent.recv_bytes())
        except (EOFError, OSError) as exc:
            self.stop(1.0)
            raise ProducerStartError(f"the producer process ended while starting (exit code {self.proc.poll()})") from exc
        except ProducerStartError:
            self.stop(1.0)
            raise
        if "error" in hello:
            self.stop(5.0)
            if hello.get("kind") == "config":
                raise KafkaConfigurationError(str(hello["error"]))
            raise ProducerStartError(str(hello["error"]))
        self.reader = threading.Thread(target=self._read, name="producer-acks", daemon=True)
        self.reader.start()

    @property
    def pid(self) -> int | None:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def _join(self, timeout: float) -> None:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def register(self, batch_id: int, futures: list[_Sent]) -> bool:
        """Remember a batch about to be sent; False (and its records failed) when the process is dead."""
        with self.cond:
            if self.dead is None:
                self.inflight[batch_id] = futures
                return True
            reason = self.dead
        self.on_failed(_fail(futures, ProducerProcessDied(reason)))
        return False

    def _read(self) -> None:
        while True:
            try:
                data = self.conn.recv_bytes()
            except (EOFError, OSError):
                break
            try:
                replies = json.loads(data)
            except ValueError:
                continue
            failed = 0
            with self.cond:
                for r in replies:
                    futures = self.inflight.pop(int(r["id"]), None)
                    if futures is None:
                        continue
                    if "error" in r:  # the whole batch was refused
                        for f in futures:
                            f.exception = KafkaError(str(r["error"]))
                        failed += len(futures)
                    for i, err in r.get("failed", ()):
                        if 0 <= int(i) < len(futures):
                            futures[int(i)].exception = KafkaError(str(err))
                            failed += 1
                    for f in futures:
                        f.is_done = True
                self.cond.notify_all()
            if failed:
                self.on_failed(failed)
        self.mark_dead(self.exit_reason("the producer process closed its pipe"))

    def exit_reason(self, cause: str, wait_s: float = 2.0) -> str:
        """``cause`` with the process's exit code, waiting up to ``wait_s`` for it to exit.

        A broken pipe and the reader's end of file race when the process is killed; either
        way the reason names how the process ended (``exit code -9`` for SIGKILL).
        """
        self._join(wait_s)
        code = self.proc.poll()
        if code is None:
            return f"{cause}; the producer process (pid {self.proc.pid}) is still running"
        return f"{cause}; the producer process exited (exit code {code})"

    def mark_dead(self, reason: str) -> None:
        """Fail every record not answered yet (the ledger sends them again) and report the death unless closing."""
        with self.cond:
            if self.dead is not None:
                return
            self.dead = reason
            pending = [f for futures in self.inflight.values() for f in futures]
            self.inflight.clear()
            self.cond.notify_all()
        self.on_failed(_fail(pending, ProducerProcessDied(reason)))
        if not self.closing:
            self.on_death(self)

    def wait(self, timeout: float | None) -> int:
        """Wait until every batch is answered (or the process is dead); returns the records still unanswered."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cond:
            while self.inflight:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self.cond.wait(left)
            return sum(len(v) for v in self.inflight.values())

    def stop(self, timeout: float) -> None:
        """Ask the process to finish (flush, close) and wait ``timeout`` s; kill it after that."""
        self.closing = True
        try:
            self.conn.send_bytes(_QUIT)
        except (OSError, EOFError, ValueError):
            pass
        self._join(timeout)
        if self.proc.poll() is None:
            self.proc.kill()
            self._join(5.0)
        try:
            self.conn.close()
        except Exception:  # noqa: BLE001
            pass


def _fail(futures: list[_Sent], exc: BaseException) -> int:
    """Fail the futures not done yet; returns how many."""
    n = 0
    for f in futures:
        if not f.is_done:
            f.exception = exc
            f.is_done = True
            n += 1
    return n


class ProcessProducer:
    """A producer whose Kafka work runs in a separate, long-lived process.

    ``send`` appends the record to the current batch and returns its future; a batch goes
    to the producer process when it is full (``max_batch_records``, ``max_batch_bytes``),
    at :meth:`ship` and at :meth:`flush`. The future is done when the process answers the
    batch: acknowledged by the broker, or failed with the process's error
    (:class:`ProducerProcessDied` when the process ended first). Records keep the
    partition of kafka-python's default partitioner (:class:`KeyPartitioner`) and their
    order per partition.

    Parameters
    ----------
    conf : dict
        kafka-python ``KafkaProducer`` settings of plain values (no partitioner, no
        serializers): :func:`streamsemi.service.kafka_io.producer_config`.
    log_level : str
        Level of the producer process's structured log.
    flush_timeout_s : float
        How long the producer process waits for a batch's acknowledgements before it
        answers the records not acknowledged as failed.
    max_batch_records, max_batch_bytes : int
        A batch is shipped when it reaches either.
    nice : int
        Added to the producer process's nice value.
    on_start, on_death : callable, optional
        Called with the process's pid when one starts, and with the reason when one dies
        (metrics).

    Raises
    ------
    kafka.errors.KafkaConfigurationError
        kafka-python refused ``conf`` (in the producer process).
    ProducerStartError
        The producer process could not create its producer (e.g. no broker reachable).
    """

    def __init__(self, conf: dict[str, Any], *, log_level: str = "INFO", flush_timeout_s: float = 30.0,
                 max_batch_records: int = 4096, max_batch_bytes: int = 4 << 20, nice: int = 0,
                 on_start: Callable[[int | None], None] | None = None,
                 on_death: Callable[[str], None] | None = None) -> None:
        self.conf = {**conf, "log_level": log_level, "flush_timeout_s": float(flush_timeout_s)}
        self.max_batch_records = int(max_batch_records)
        self.max_batch_bytes = int(max_batch_bytes)
        self.nice = int(nice)
        self.on_start, self.on_death = on_start, on_death
        self._lock = threading.RLock()  # the current batch and the child
        self._next_id = 0
        self._closed = False
        self.deaths = 0
        self._names: dict[str, bytes] = {}  # header names, UTF-8 (bounded)
        self.failures = 0  # records answered as failed (the output ledger looks for them only when this grows)
        self._reset_batch()
        self._child = self._spawn()

    # ------------------------------------------------------------------ process
    def _spawn(self) -> _Child:
        child = _Child(self.conf, self.nice, self._child_died, self._failed)
        event(log, "producer_process_started", pid=child.pid)
        if self.on_start is not None:
            self.on_start(child.pid)
        return child

    def _child_died(self, child: _Child) -> None:
        self.deaths += 1
        event(log, "producer_process_died", logging.ERROR, pid=child.pid, reason=child.dead,
              action="records not acknowledged are sent again by a new producer process")
        if self.on_death is not None:
            self.on_death(str(child.dead))

    def _failed(self, n: int) -> None:
        with self._lock:
            self.failures += n

    @property
    def pid(self) -> int | None:
        """The producer process's pid (None when it is not running)."""
        c = self._child
        return c.pid if c.dead is None and c.alive else None

    # ------------------------------------------------------------------ records
    def _reset_batch(self) -> None:
        self._topics: dict[str, int] = {}
        self._lengths = array("i")
        self._parts: list[bytes] = []
        self._futures: list[_Sent] = []
        self._bytes = 0

    def send(self, topic: str, value: bytes | None = None, key: bytes | None = None,
             headers: list[tuple[str, bytes]] | None = None, partition: int | None = None,
             timestamp_ms: int | None = None) -> _Sent:
        """Add a record to the current batch; its future is done when the producer process answers for it.

        Raises
        ------
        TypeError
            A key or value that is not ``bytes`` or None, headers that are not ``(str, bytes)``
            pairs, or an explicit partition or timestamp (the default partitioner and the
            append time are used).
        """
        if partition is not None or timestamp_ms is not None:
            raise TypeError("ProcessProducer uses the default partitioner and the append time")
        return self.send_many([(topic, key, value, headers)])[0]

    def send_many(self, records: Sequence[tuple[str, bytes | None, bytes | None, list | None]]) -> list[_Sent]:
        """:meth:`send` of each ``(topic, key, value, headers)`` in order, under one lock; their futures.

        What the worker's emission uses: the records of a loop share a few
        header lists, converted once per list, and the per-call costs are paid once.
        Nothing is added when a record is refused.

        Raises
        ------
        TypeError
            As :meth:`send`, for the first refused record.
        kafka.errors.KafkaError
            The producer is closed.
        """
        # per distinct headers list (a loop's records share a few): its pairs' lengths, parts and bytes, once
        converted: dict[int, tuple[list, int, list[int], list[bytes], int]] = {}
        empty: tuple[None, int, list[int], list[bytes], int] = (None, 0, [], [], 0)
        rows = []
        for topic, key, value, headers in records:
            if ((key is not None and type(key) is not bytes and key is not BLOCK)
                    or (value is not None and type(value) is not bytes)):
                raise TypeError("key and value must be bytes or None")
            if headers:
                got = converted.get(id(headers))
                if got is None or got[0] is not headers:
                    heads = self._heads(headers)
                    got = converted[id(headers)] = (
                        headers, len(heads), [n for name, hv in heads for n in (len(name), len(hv))],
                        [b for pair in heads for b in pair], sum(len(name) + len(hv) for name, hv in heads))
                rows.append((topic, key, value, got))
            else:
                rows.append((topic, key, value, empty))
        futures = [_Sent() for _ in rows]
        with self._lock:
            if self._closed:
                raise KafkaError("the producer is closed")
            topics, parts, lengths = self._topics, self._parts, self._lengths
            for (topic, key, value, (_, n_heads, head_lengths, head_parts, head_bytes)), future in zip(
                    rows, futures, strict=True):
                t = topics.get(topic)
                if t is None:
                    t = topics[topic] = len(topics)
                size = head_bytes
                if key is None:
                    klen = -1
                elif key is BLOCK:
                    klen = _BLOCK_KLEN
                else:
                    klen = len(key)
                    parts.append(key)
                    size += klen
                if value is None:
                    vlen = -1
                else:
                    vlen = len(value)
                    parts.append(value)
                    size += vlen
                lengths.extend((t, klen, vlen, n_heads))
                if n_heads:
                    lengths.extend(head_lengths)
                    parts.extend(head_parts)
                self._futures.append(future)
                self._bytes += size
                if len(self._futures) >= self.max_batch_records or self._bytes >= self.max_batch_bytes:
                    self.ship()  # a new batch: its own topics, parts and lengths
                    topics, parts, lengths = self._topics, self._parts, self._lengths
        return futures

    def _heads(self, headers: list) -> list[tuple[bytes, bytes]]:
        """``(name, value)`` header pairs with UTF-8 names (cached); TypeError unless ``(str, bytes)`` pairs."""
        names = self._names
        heads = []
        for item in headers:
            if type(item) is not tuple or len(item) != 2 or type(item[0]) is not str or type(item[1]) is not bytes:
                raise TypeError("headers must be (str, bytes) pairs")
            name = names.get(item[0])
            if name is None:
                if len(names) >= 256:
                    names.clear()
                name = names[item[0]] = item[0].encode("utf-8")
            heads.append((name, item[1]))
        return heads

    def ship(self) -> None:
        """Hand the current batch to the producer process (started again first if it died); does not wait."""
        with self._lock:
            if not self._futures:
                return
            topics = sorted(self._topics, key=self._topics.__getitem__)
            frame = encode_batch(self._next_id, topics, self._lengths, self._parts, len(self._futures))
            futures, batch_id = self._futures, self._next_id
            self._next_id += 1
            self._reset_batch()
            child = self._child
            if child.dead is not None and not self._closed:
                child.stop(1.0)
                try:
                    child = self._child = self._spawn()
                except KafkaError as exc:  # no broker now: these records fail, the ledger sends them again
                    self.failures += _fail(futures, ProducerProcessDied(f"the producer process could not start again: {exc}"))
                    return
            if not child.register(batch_id, futures):
                return
            try:
                child.conn.send_bytes(frame)
            except (OSError, EOFError, ValueError) as exc:
                child.mark_dead(child.exit_reason(f"the pipe to the producer process broke ({exc})"))

    @property
    def unanswered(self) -> int:
        """Records handed to the producer process and not answered yet, plus those of the current batch."""
        c = self._child
        with c.cond:
            return len(self._futures) + sum(len(v) for v in c.inflight.values())

    def flush(self, timeout: float | None = None) -> None:
        """Ship the current batch and wait until every record is answered (acknowledged or failed).

        Raises
        ------
        kafka.errors.KafkaTimeoutError
            Records still unanswered after ``timeout`` seconds.
        """
        self.ship()
        left = self._child.wait(timeout)
        if left:
            raise KafkaTimeoutError(f"{left} records not answered by the producer process after {timeout} s")

    def close(self, timeout: float | None = None) -> None:
        """Flush (at most ``timeout`` s), then stop the producer process; records not answered fail."""
        if self._closed:
            return
        try:
            self.flush(timeout if timeout is not None else 30.0)
        except KafkaError:
            pass
        with self._lock:
            self._closed = True
            child = self._child
            pending = self._futures
            self._reset_batch()
        self._failed(_fail(pending, KafkaError("the producer was closed")))
        child.stop(max(1.0, timeout or 0.0))
        child.mark_dead("the producer was closed")


if __name__ == "__main__":  # the producer process: python -m streamsemi.service.producer FD NICE
    serve(Connection(int(sys.argv[1])), int(sys.argv[2]) if len(sys.argv) > 2 else 0)
