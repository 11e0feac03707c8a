"""The models topic: every model version the refitter publishes, chunked and checksummed, never pickled.

One *publication* is the dict of fitted models of one refit round (one per enabled
algorithm) with its global ``version``. Its payload is a checkpoint manifest
(:func:`streamsemi.service.checkpoint.validate_manifest` checks it) holding only the
model files, plus a ``publication`` block (stream, version, parent version, writer,
primary algorithm, window bounds, seed count, algorithms)::

    payload = 8-byte big-endian header length | header JSON | model files in header["files"] order

The model files are the checkpoint's safe encoding (:func:`checkpoint.encode_models`:
JSON + ``.npz`` read with ``allow_pickle=False``; classes only from the registry).
The payload is cut into records of at most ``model_chunk_bytes`` (below the broker's
``max.message.bytes``), keyed ``<stream>/<version:012d>/<chunk:05d>`` on a
single-partition compacted topic, each with headers naming the publication, the
chunk's index and count, its SHA-256 and the whole payload's SHA-256. After a new
version the publisher sends tombstones for the chunks of versions older than the
previous one, so a compacting cluster keeps the last two versions (the embedded
broker does not compact: readers take the newest complete publication anyway).

A reader (:class:`ModelsReader`) reads the topic from the beginning, keeps the
chunks of at most :data:`MAX_PARTIAL` publications newer than the newest complete
one (bounded in bytes by ``max_model_bytes`` each), verifies every chunk and the
whole, decodes, and offers the newest complete publication. Two publications of the
same version (a deposed refitter that had not noticed yet) resolve to the later one
in the log, which every reader sees in the same order.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from streamsemi import __version__
from streamsemi.core.errors import StreamsemiError
from streamsemi.core.logs import event
from streamsemi.service import checkpoint
from streamsemi.service.config import Settings
from streamsemi.service.kafka_io import assign_all, make_producer, make_reader

log = logging.getLogger("streamsemi.service.models_topic")

KIND = "streamsemi-model-publication"
HEADER_LEN_BYTES = 8
MAX_PARTIAL = 3            # publications being assembled at once (newer than the newest complete one)
MAX_INDEX = 1000           # (stream, version) -> chunk count entries remembered for tombstones
DEFAULT_STREAM = "default"
SEND_TIMEOUT_S = 60.0


class ModelsTopicError(StreamsemiError):
    """A publication that is malformed, corrupted, too large or made for other settings."""


@dataclass
class Publication:
    """A decoded, verified model publication."""

    stream: str
    version: int
    parent_version: int | None
    publication_id: str
    writer: str
    primary: str | None
    models: dict[str, Any]
    header: dict[str, Any]
    payload_bytes: int
    chunks: int
    skipped: dict[str, str] = field(default_factory=dict)


# ---------------------------------------------------------------- encoding
def encode_publication(models: dict[str, Any], *, version: int, parent_version: int | None, writer: str,
                       primary: str | None, n_features: int, stop_words: str | None, window: dict[str, Any],
                       seeds: int, stream: str = DEFAULT_STREAM) -> tuple[bytes, dict[str, Any]]:
    """Payload bytes and header of one publication of ``models`` (algorithm -> ModelSlot)."""
    files, meta, skipped = checkpoint.encode_models(models)
    for m in meta:
        m["provisional"] = bool(getattr(models[m["algorithm"]], "provisional", False))
    header = {
        "format": checkpoint.FORMAT, "format_version": checkpoint.FORMAT_VERSION, "created": time.time(),
        "streamsemi_version": __version__, "n_features": int(n_features), "stop_words": stop_words,
        "model_version": int(version),
        "counts": {"models": len(meta), "seeds": int(seeds), "window": int(window.get("documents", 0))},
        "models": meta, "skipped_models": skipped,
        "files": {name: {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)} for name, data in files.items()},
        "publication": {"kind": KIND, "stream": stream, "version": int(version),
                        "parent_version": None if parent_version is None else int(parent_version),
                        "writer": writer, "primary": primary, "window": window, "seeds": int(seeds),
                        "algorithms": sorted(models)},
    }
    head = json.dumps(header, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
    payload = len(head).to_bytes(HEADER_LEN_BYTES, "big") + head + b"".join(files[name] for name in header["files"])
    return payload, header


def decode_publication(payload: bytes, config: Any) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    """``(header, models, skipped)`` of a verified payload, for an engine with ``config``.

    Raises
    ------
    ModelsTopicError
        Bad framing, a header that is not a valid manifest, a file whose size or
        SHA-256 differs, or other ``n_features`` / ``stop_words`` than ``config``.
    """
    if len(payload) < HEADER_LEN_BYTES:
        raise ModelsTopicError("payload shorter than its header length")
    hlen = int.from_bytes(payload[:HEADER_LEN_BYTES], "big")
    if hlen <= 0 or HEADER_LEN_BYTES + hlen > len(payload):
        raise ModelsTopicError(f"header length {hlen} outside the payload of {len(payload)} bytes")
    try:
        header = checkpoint._loads(payload[HEADER_LEN_BYTES:HEADER_LEN_BYTES + hlen], "publication header")
        checkpoint.validate_manifest(header, "publication header")
    except checkpoint.CheckpointError as exc:
        raise ModelsTopicError(str(exc)) from None
    pub = header.get("publication")
    if not isinstance(pub, dict) or pub.get("kind") != KIND or not isinstance(pub.get("version"), int):
        raise ModelsTopicError("publication header without a valid 'publication' block")
    if header["n_features"] != config.n_features or header["stop_words"] != config.stop_words:
        raise ModelsTopicError(f"models made with n_features={header['n_features']}, stop_words="
                               f"{header['stop_words']!r}; this process uses n_features={config.n_features}, "
                               f"stop_words={config.stop_words!r}")
    files: dict[str, bytes] = {}
    at = HEADER_LEN_BYTES + hlen
    for name, meta in header["files"].items():
        data = payload[at:at + meta["bytes"]]
        if len(data) != meta["bytes"] or hashlib.sha256(data).hexdigest() != meta["sha256"]:
            raise ModelsTopicError(f"{name}: size or checksum differs from the header")
        files[name] = data
        at += meta["bytes"]
    if at != len(payload):
        raise ModelsTopicError(f"{len(payload) - at} bytes after the last file")
    models, skipped = checkpoint.decode_models(config, header, files)
    for m in header["models"]:
        slot = models.get(m["algorithm"])
        if slot is not None:
            slot.provisional = bool(m.get("provisional", False))
    return header, models, skipped


def chunk_records(payload: bytes, *, stream: str, version: int, publication_id: str,
                  chunk_bytes: int) -> list[tuple[bytes, bytes, list[tuple[str, bytes]]]]:
    """``(key, value, headers)`` of every chunk of ``payload``."""
    total = hashlib.sha256(payload).hexdigest().encode()
    n = max(1, math.ceil(len(payload) / chunk_bytes))
    out = []
    for i in range(n):
        part = payload[i * chunk_bytes:(i + 1) * chunk_bytes]
        headers = [("stream", stream.encode()), ("version", str(version).encode()),
                   ("publication", publication_id.encode()), ("chunk", str(i).encode()), ("chunks", str(n).encode()),
                   ("sha256", hashlib.sha256(part).hexdigest().encode()), ("total_sha256", total),
                   ("total_bytes", str(len(payload)).encode())]
        out.append((chunk_key(stream, version, i), part, headers))
    return out


def chunk_key(stream: str, version: int, index: int) -> bytes:
    return f"{stream}/{version:012d}/{index:05d}".encode()


# ---------------------------------------------------------------- publishing
class ModelPublisher:
    """Publishes model versions to the models topic and tombstones the old ones (the refitter's side)."""

    def __init__(self, settings: Settings, writer: str, stream: str = DEFAULT_STREAM) -> None:
        self.settings = settings
        self.writer = writer
        self.stream = stream
        self.producer: Any = None

    def _producer(self) -> Any:
        if self.producer is None:
            chunk = self.settings.model_chunk_bytes
            self.producer = make_producer(self.settings, client_id="streamsemi-models",
                                          max_request_size=max(1_048_576, chunk + 65536), linger_ms=5,
                                          batch_size=max(16384, min(chunk + 4096, 1_048_576)))
        return self.producer

    def publish(self, models: dict[str, Any], *, version: int, parent_version: int | None, primary: str | None,
                n_features: int, stop_words: str | None, window: dict[str, Any], seeds: int,
                obsolete: list[tuple[int, int]] = ()) -> dict[str, Any]:
        """Send every chunk of one publication and wait for their acknowledgements; tombstone ``obsolete``.

        ``obsolete`` lists ``(version, chunks)`` of publications to delete (compaction).
        Returns ``{"version", "bytes", "chunks", "seconds", "encode_seconds", "publication"}``.

        Raises
        ------
        KafkaError
            A chunk was not acknowledged (the caller publishes again later).
        """
        t0 = time.perf_counter()
        payload, _ = encode_publication(models, version=version, parent_version=parent_version, writer=self.writer,
                                        primary=primary, n_features=n_features, stop_words=stop_words,
                                        window=window, seeds=seeds, stream=self.stream)
        t_enc = time.perf_counter() - t0
        pub_id = uuid.uuid4().hex
        records = chunk_records(payload, stream=self.stream, version=version, publication_id=pub_id,
                                chunk_bytes=self.settings.model_chunk_bytes)
        producer = self._producer()
        topic = self.settings.models_topic
        futures = [producer.send(topic, key=k, value=v, headers=h) for k, v, h in records]
        producer.flush(SEND_TIMEOUT_S)
        for f in futures:
            f.get(timeout=SEND_TIMEOUT_S)
        for old_version, n in obsolete:
            for i in range(n):
                producer.send(topic, key=chunk_key(self.stream, old_version, i), value=None)
        if obsolete:
            producer.flush(SEND_TIMEOUT_S)
        return {"version": version, "bytes": len(payload), "chunks": len(records), "publication": pub_id,
                "seconds": round(time.perf_counter() - t0, 3), "encode_seconds": round(t_enc, 3)}

    def close(self) -> None:
        if self.producer is not None:
            try:
                self.producer.close(timeout=5)
            except Exception:  # noqa: BLE001
                pass
            self.producer = None


# ---------------------------------------------------------------- reading
class _Partial:
    __slots__ = ("chunks", "n", "total_sha", "total_bytes", "bytes")

    def __init__(self, n: int, total_sha: str, total_bytes: int) -> None:
        self.chunks: dict[int, bytes] = {}
        self.n = n
        self.total_sha = total_sha
        self.total_bytes = total_bytes
        self.bytes = 0


def _headers(record: Any) -> dict[str, str]:
    out = {}
    for k, v in record.headers or []:
        try:
            out[str(k)] = v.decode("utf-8") if isinstance(v, bytes) else str(v)
        except UnicodeDecodeError:
            continue
    return out


class ModelAssembler:
    """Assembles publications from chunk records (no Kafka here: :class:`ModelsReader` feeds it).

    Bounded: at most :data:`MAX_PARTIAL` publications in progress, each at most
    ``max_bytes``; an index of at most :data:`MAX_INDEX` (stream, version) -> chunk counts
    (what the publisher tombstones).
    """

    def __init__(self, config: Any, max_bytes: int, stream: str = DEFAULT_STREAM,
                 on_reject: Any = None) -> None:
        self.config = config
        self.max_bytes = max_bytes
        self.stream = stream
        self.on_reject = on_reject
        self.latest: Publication | None = None
        self.max_seen = 0
        self.partial: OrderedDict[tuple[int, str], _Partial] = OrderedDict()
        self.index: OrderedDict[int, int] = OrderedDict()   # version -> chunks of complete publications
        self.refused: set[tuple[int, str]] = set()

    def _reject(self, key: tuple[int, str], reason: str, detail: str) -> None:
        self.partial.pop(key, None)
        if key not in self.refused:
            if len(self.refused) > MAX_INDEX:
                self.refused.clear()
            self.refused.add(key)
            event(log, "model_publication_rejected", logging.WARNING, version=key[0], publication=key[1],
                  reason=reason, detail=detail[:300])
            if self.on_reject:
                self.on_reject(reason)

    def feed(self, record: Any) -> Publication | None:
        """Take one record of the models topic; returns a publication when this record completed a newer one."""
        h = _headers(record)
        if h.get("stream", DEFAULT_STREAM) != self.stream and record.value is not None:
            return None
        if record.value is None:   # a tombstone: that version's chunks are gone
            try:
                _, v, _ = record.key.decode().split("/")
                self.index.pop(int(v), None)
            except (AttributeError, ValueError, UnicodeDecodeError):
                pass
            return None
        try:
            version, chunk, n = int(h["version"]), int(h["chunk"]), int(h["chunks"])
            pub, sha, total_sha, total_bytes = h["publication"], h["sha256"], h["total_sha256"], int(h["total_bytes"])
        except (KeyError, ValueError):
            self._reject((-1, "?"), "bad_headers", f"record at offset {getattr(record, 'offset', '?')}")
            return None
        key = (version, pub)
        if key in self.refused:
            return None
        self.max_seen = max(self.max_seen, version)
        cur = self.latest
        if cur is not None and (version < cur.version or (version == cur.version and pub == cur.publication_id)):
            return None
        if not (0 <= chunk < n) or total_bytes > self.max_bytes or n > total_bytes + 1:
            self._reject(key, "too_large" if total_bytes > self.max_bytes else "bad_headers",
                         f"chunk {chunk} of {n}, {total_bytes} bytes (max_model_bytes={self.max_bytes})")
            return None
        if hashlib.sha256(record.value).hexdigest() != sha:
            self._reject(key, "checksum", f"chunk {chunk} of version {version}")
            return None
        part = self.partial.get(key)
        if part is None:
            part = self.partial[key] = _Partial(n, total_sha, total_bytes)
            while len(self.partial) > MAX_PARTIAL:
                old, _ = self.partial.popitem(last=False)
                event(log, "model_publication_dropped", logging.WARNING, version=old[0],
                      reason=f"more than {MAX_PARTIAL} publications in progress")
        if chunk not in part.chunks:
            part.chunks[chunk] = record.value
            part.bytes += len(record.value)
        if part.bytes > part.total_bytes:
            self._reject(key, "bad_headers", "chunks larger than the announced total")
            return None
        if len(part.chunks) < part.n:
            return None
        del self.partial[key]
        payload = b"".join(part.chunks[i] for i in range(part.n))
        if hashlib.sha256(payload).hexdigest() != part.total_sha:
            self._reject(key, "checksum", f"whole payload of version {version}")
            return None
        try:
            header, models, skipped = decode_publication(payload, self.config)
        except Exception as exc:  # noqa: BLE001 - a bad publication is skipped, never fatal
            self._reject(key, "undecodable", f"{type(exc).__name__}: {exc}")
            return None
        meta = header["publication"]
        pub_obj = Publication(self.stream, version, meta.get("parent_version"), pub, str(meta.get("writer")),
                              meta.get("primary"), models, header, len(payload), n, skipped)
        self.latest = pub_obj
        self.index[version] = n
        while len(self.index) > MAX_INDEX:
            self.index.popitem(last=False)
        for k in [k for k in self.partial if k[0] < version]:
            del self.partial[k]
        return pub_obj

    def obsolete(self, keep: int = 2) -> list[tuple[int, int]]:
        """``(version, chunks)`` of complete publications older than the newest ``keep`` (to tombstone)."""
        versions = sorted(self.index)
        return [(v, self.index[v]) for v in versions[:max(0, len(versions) - keep)]]


class ModelsReader(threading.Thread):
    """Reads the models topic from the beginning (group-less) and keeps the newest complete publication.

    ``latest()`` returns it; ``caught_up`` is set once the reader reached the end of the
    topic at least once; ``max_seen()`` is the highest version any chunk announced (a
    new refitter numbers its models above it).
    """

    def __init__(self, settings: Settings, config: Any, on_error: Any = None, on_reject: Any = None) -> None:
        super().__init__(name="models-reader", daemon=True)
        self.settings = settings
        self.assembler = ModelAssembler(config, settings.max_model_bytes, on_reject=on_reject)
        self.on_error = on_error
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.caught_up = threading.Event()
        self.publications = 0

    def latest(self) -> Publication | None:
        with self.lock:
            return self.assembler.latest

    def max_seen(self) -> int:
        with self.lock:
            return self.assembler.max_seen

    def obsolete(self, keep: int = 2) -> list[tuple[int, int]]:
        with self.lock:
            return self.assembler.obsolete(keep)

    def run(self) -> None:
        chunk = self.settings.model_chunk_bytes
        while not self.stop_event.is_set():
            consumer = None
            try:
                consumer = make_reader(self.settings, client_id="streamsemi-models", allow_auto_create_topics=False,
                                       max_partition_fetch_bytes=max(2 * 1_048_576, 2 * chunk),
                                       fetch_max_bytes=max(64 * 1_048_576, 4 * chunk))
                tps = assign_all(consumer, self.settings.models_topic)
                while not self.stop_event.is_set():
                    batch = consumer.poll(timeout_ms=500, max_records=50)
                    for _, records in sorted(batch.items(), key=lambda kv: kv[0].partition):
                        for r in records:
                            with self.lock:
                                done = self._feed(r)
                            if done is not None:
                                self.publications += 1
                                event(log, "model_publication_read", version=done.version, bytes=done.payload_bytes,
                                      chunks=done.chunks, writer=done.writer, skipped=done.skipped or None)
                    if not batch and not self.caught_up.is_set():
                        highs = [consumer.highwater(tp) for tp in tps]
                        if all(hw is not None and consumer.position(tp) >= hw for tp, hw in zip(tps, highs, strict=True)):
                            self.caught_up.set()
            except Exception as exc:  # noqa: BLE001 - keep reading after broker trouble
                event(log, "models_reader_error", logging.WARNING, error=f"{type(exc).__name__}: {exc}")
                if self.on_error:
                    self.on_error("models")
                self.stop_event.wait(1.0)
            finally:
                if consumer is not None:
                    try:
                        consumer.close()
                    except Exception:  # noqa: BLE001
                        pass

    def _feed(self, record: Any) -> Publication | None:
        """One record to the assembler (per-stream readers route it by stream: streamsemi.service.stream_roles)."""
        return self.assembler.feed(record)

    def stop(self) -> None:
        self.stop_event.set()
