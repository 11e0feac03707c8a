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
chunk's index and count, its SHA-256, the whole payload's SHA-256, the writer and, with
a key (``models_key_file``), an HMAC-SHA256 ``signature`` of all of these and the chunk's
bytes (:func:`chunk_signature`). After a new
version the publisher sends tombstones for the chunks of versions older than the
previous one, so a compacting cluster keeps the last two versions (the embedded
broker does not compact: readers take the newest complete publication anyway).

A reader (:class:`ModelsReader`) reads the topic from the beginning, keeps the
chunks of at most :data:`MAX_PARTIAL` publications newer than the newest complete
one (bounded in bytes by ``max_model_bytes`` each), verifies every chunk and the
whole, decodes, validates every model (:func:`streamsemi.service.model_validation.validate_model`)
and offers the newest complete publication. With a key, a record whose signature does
not verify is refused before anything of it is looked at (its version is not counted);
versions are decimal digits below 2**63 (:func:`parse_count`); the version, stream and
writer inside the payload must be those of its chunks. Two publications of the same
version (a deposed refitter that had not noticed yet) resolve to the later one in the
log, which every reader sees in the same order.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import math
import re
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
from streamsemi.service.config import Settings, read_models_key
from streamsemi.service.kafka_io import assign_all, make_producer, make_reader
from streamsemi.service.model_validation import reason_category, validate_model

log = logging.getLogger("streamsemi.service.models_topic")

KIND = "streamsemi-model-publication"
HEADER_LEN_BYTES = 8
MAX_PARTIAL = 3            # publications being assembled at once (newer than the newest complete one)
MAX_INDEX = 1000           # (stream, version) -> chunk count entries remembered for tombstones
DEFAULT_STREAM = "default"
SEND_TIMEOUT_S = 60.0
MAX_VERSION = 2**63 - 1    # versions are signed 64-bit integers (a gauge holds them exactly enough, Kafka tools too)
MAX_CHUNKS = 1_000_000
SIGNATURE_CONTEXT = b"streamsemi-models-v1"
_DIGITS = re.compile(r"[0-9]{1,19}")
_SIGNED_HEADERS = ("stream", "version", "publication", "chunk", "chunks", "sha256", "total_sha256", "total_bytes",
                   "writer")
_SIGNATURE_LOG_FIRST = 10      # signature failures logged one by one, then one event per _SIGNATURE_LOG_EVERY
_SIGNATURE_LOG_EVERY = 1000


class ModelsTopicError(StreamsemiError):
    """A publication that is malformed, corrupted, too large or made for other settings."""


def parse_count(text: str | None, maximum: int = MAX_VERSION) -> int | None:
    """A header's non-negative integer: ASCII digits only, at most 19 of them, at most ``maximum``; else None.

    ``int()`` alone takes ``" 7"``, ``"+7"``, ``"1_000"``, other scripts' digits and
    thousands of digits (a version no gauge can hold).
    """
    if text is None or not _DIGITS.fullmatch(text):
        return None
    value = int(text)
    return value if value <= maximum else None


def models_key(settings: Settings) -> bytes | None:
    """The key of ``models_key_file`` (checked at start by the configuration), or None without one."""
    path = settings.values.get("models_key_file") or ""
    return read_models_key(path) if path else None


def chunk_signature(key: bytes, fields: dict[str, str], value: bytes | None) -> str:
    """HMAC-SHA256 (hex) of a record's signed header fields (:data:`_SIGNED_HEADERS`, as sent) and its value.

    A tombstone (``value`` None) signs its fields and the marker ``tombstone``. The
    fields are length-prefixed, so no two different records give the same message.
    """
    mac = hmac.new(key, SIGNATURE_CONTEXT, hashlib.sha256)
    for name in _SIGNED_HEADERS:
        raw = fields.get(name, "").encode("utf-8")
        mac.update(b"%d:%s=" % (len(raw), name.encode()))
        mac.update(raw)
    if value is None:
        mac.update(b"|tombstone")
    else:
        mac.update(b"|%d:" % len(value))
        mac.update(value)
    return mac.hexdigest()


def _sign(headers: list[tuple[str, bytes]], key: bytes | None, value: bytes | None) -> list[tuple[str, bytes]]:
    if key is None:
        return headers
    fields = {k: v.decode("utf-8") for k, v in headers}
    return [*headers, ("signature", chunk_signature(key, fields, value).encode())]


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


def _position(record: Any) -> dict[str, Any]:
    """``topic``, ``partition`` and ``offset`` of a consumer record, for a log line (None where unknown)."""
    return {k: getattr(record, k, None) for k in ("topic", "partition", "offset")}


def chunk_records(payload: bytes, *, stream: str, version: int, publication_id: str, chunk_bytes: int,
                  writer: str = "", key: bytes | None = None) -> list[tuple[bytes, bytes, list[tuple[str, bytes]]]]:
    """``(key, value, headers)`` of every chunk of ``payload``, signed with ``key`` when given."""
    if not 0 <= version <= MAX_VERSION:
        raise ModelsTopicError(f"version {version} outside 0..{MAX_VERSION}")
    total = hashlib.sha256(payload).hexdigest().encode()
    n = max(1, math.ceil(len(payload) / chunk_bytes))
    out = []
    for i in range(n):
        part = payload[i * chunk_bytes:(i + 1) * chunk_bytes]
        headers = [("stream", stream.encode()), ("version", str(version).encode()),
                   ("publication", publication_id.encode()), ("chunk", str(i).encode()), ("chunks", str(n).encode()),
                   ("sha256", hashlib.sha256(part).hexdigest().encode()), ("total_sha256", total),
                   ("total_bytes", str(len(payload)).encode()), ("writer", writer.encode())]
        out.append((chunk_key(stream, version, i), part, _sign(headers, key, part)))
    return out


def tombstone_record(stream: str, version: int, index: int,
                     key: bytes | None = None) -> tuple[bytes, None, list[tuple[str, bytes]]]:
    """``(key, None, headers)`` deleting one chunk (compaction), signed with ``key`` when given."""
    headers = [("stream", stream.encode()), ("version", str(version).encode()), ("chunk", str(index).encode())]
    return chunk_key(stream, version, index), None, _sign(headers, key, None)


def chunk_key(stream: str, version: int, index: int) -> bytes:
    return f"{stream}/{version:012d}/{index:05d}".encode()


# ---------------------------------------------------------------- publishing
class ModelPublisher:
    """Publishes model versions to the models topic and tombstones the old ones (the refitter's side)."""

    def __init__(self, settings: Settings, writer: str, stream: str = DEFAULT_STREAM) -> None:
        self.settings = settings
        self.writer = writer
        self.stream = stream
        self.key = models_key(settings)
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
                                chunk_bytes=self.settings.model_chunk_bytes, writer=self.writer, key=self.key)
        producer = self._producer()
        topic = self.settings.models_topic
        futures = [producer.send(topic, key=k, value=v, headers=h) for k, v, h in records]
        producer.flush(SEND_TIMEOUT_S)
        for f in futures:
            f.get(timeout=SEND_TIMEOUT_S)
        for old_version, n in obsolete:
            for i in range(n):
                k, v, h = tombstone_record(self.stream, old_version, i, self.key)
                producer.send(topic, key=k, value=v, headers=h)
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

    With ``key``, every record must carry a verifying ``signature`` (:func:`chunk_signature`);
    one that does not is refused (``signature``) before its headers are parsed. ``max_seen``
    counts the versions of verified records only: signed chunks with a key, complete,
    decoded and validated publications without one. ``on_reject(reason)`` counts refused
    publications, ``on_refuse(category)`` the ones refused for a model that fails
    :func:`~streamsemi.service.model_validation.validate_model` (the newest accepted one stays).
    """

    def __init__(self, config: Any, max_bytes: int, stream: str = DEFAULT_STREAM,
                 on_reject: Any = None, key: bytes | None = None, on_refuse: Any = None) -> None:
        self.config = config
        self.max_bytes = max_bytes
        self.stream = stream
        self.on_reject = on_reject
        self.on_refuse = on_refuse
        self.key = key
        self.latest: Publication | None = None
        self.max_seen = 0
        self.partial: OrderedDict[tuple[int, str], _Partial] = OrderedDict()
        self.index: OrderedDict[int, int] = OrderedDict()   # version -> chunks of complete publications
        self.refused: set[tuple[int, str]] = set()
        self.unverified = 0
        self._record: Any = None

    def _reject(self, key: tuple[int, str], reason: str, detail: str) -> None:
        self.partial.pop(key, None)
        if key not in self.refused:
            if len(self.refused) > MAX_INDEX:
                self.refused.clear()
            self.refused.add(key)
            event(log, "model_publication_rejected", logging.WARNING, version=key[0], publication=key[1],
                  reason=reason, detail=detail[:300], **_position(self._record))
            if self.on_reject:
                self.on_reject(reason)

    def _unverified(self, record: Any, why: str) -> None:
        """A record without a verifying signature: counted and (rate-limited) logged, nothing of it kept."""
        self.unverified += 1
        n = self.unverified
        if n <= _SIGNATURE_LOG_FIRST or n % _SIGNATURE_LOG_EVERY == 0:
            event(log, "model_publication_rejected", logging.WARNING, reason="signature", detail=why,
                  unverified_records=n, **_position(record))
        if self.on_reject:
            self.on_reject("signature")

    def _verified(self, record: Any, h: dict[str, str]) -> bool:
        if self.key is None:
            return True
        sig = h.get("signature")
        if sig is None:
            self._unverified(record, "no signature (models_key_file is set: every record must be signed)")
            return False
        want = chunk_signature(self.key, h, record.value)
        if not hmac.compare_digest(want.encode(), sig.encode("utf-8", "replace")):
            self._unverified(record, "signature does not verify with models_key_file")
            return False
        return True

    def feed(self, record: Any) -> Publication | None:
        """Take one record of the models topic; returns a publication when this record completed a newer one."""
        self._record = record  # where a rejection's log line says the record was
        h = _headers(record)
        if h.get("stream", DEFAULT_STREAM) != self.stream and record.value is not None:
            return None
        if record.value is None:   # a tombstone: that version's chunks are gone
            if self.key is not None and not self._verified_tombstone(record, h):
                return None
            try:
                _, v, _ = record.key.decode().split("/")
            except (AttributeError, ValueError, UnicodeDecodeError):
                return None
            version = parse_count(v)
            if version is not None:
                self.index.pop(version, None)
            return None
        if not self._verified(record, h):
            return None
        version, chunk, n = parse_count(h.get("version")), parse_count(h.get("chunk")), parse_count(h.get("chunks"))
        total_bytes = parse_count(h.get("total_bytes"))
        pub, sha, total_sha = h.get("publication"), h.get("sha256"), h.get("total_sha256")
        if None in (version, chunk, n, total_bytes, pub, sha, total_sha):
            self._reject((-1, "?"), "bad_headers", f"record at offset {getattr(record, 'offset', '?')}: "
                         "missing headers or counts that are not decimal digits below 2**63")
            return None
        key = (version, pub)
        if key in self.refused:
            return None
        if self.key is not None:
            self.max_seen = max(self.max_seen, version)   # signed: a refitter's version, even when it never completes
        cur = self.latest
        if cur is not None and (version < cur.version or (version == cur.version and pub == cur.publication_id)):
            return None
        if not (0 <= chunk < n <= MAX_CHUNKS) or total_bytes > self.max_bytes or n > total_bytes + 1:
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
        problem = _mismatch(header, version, self.stream, h.get("writer"))
        if problem is not None:
            self._reject(key, "mismatch", problem)
            return None
        problem = self._invalid_model(header, models)
        if problem is not None:
            self._reject(key, "invalid_model", problem)
            return None
        pub_obj = Publication(self.stream, version, meta.get("parent_version"), pub, str(meta.get("writer")),
                              meta.get("primary"), models, header, len(payload), n, skipped)
        self.latest = pub_obj
        self.max_seen = max(self.max_seen, version)
        self.index[version] = n
        while len(self.index) > MAX_INDEX:
            self.index.popitem(last=False)
        for k in [k for k in self.partial if k[0] < version]:
            del self.partial[k]
        return pub_obj

    def _verified_tombstone(self, record: Any, h: dict[str, str]) -> bool:
        sig = h.get("signature")
        return sig is not None and hmac.compare_digest(chunk_signature(self.key, h, None).encode(),
                                                       sig.encode("utf-8", "replace"))

    def _invalid_model(self, header: dict[str, Any], models: dict[str, Any]) -> str | None:
        """The first decoded model :func:`validate_model` refuses, logged once and counted by category."""
        registry = {m["algorithm"]: m["registry"] for m in header["models"]}
        for name, slot in models.items():
            reason = validate_model(registry.get(name, name), slot.model, classes=None,
                                    n_features=self.config.n_features)
            if reason is not None:
                detail = f"{name}: {reason}"
                event(log, "model_refused", logging.WARNING, algorithm=name, stream=self.stream,
                      version=header["publication"]["version"], writer=str(header["publication"].get("writer")),
                      reason=reason_category(reason), detail=detail[:300])
                if self.on_refuse:
                    self.on_refuse(reason_category(reason))
                return detail
        return None

    def obsolete(self, keep: int = 2) -> list[tuple[int, int]]:
        """``(version, chunks)`` of complete publications older than the newest ``keep`` (to tombstone)."""
        versions = sorted(self.index)
        return [(v, self.index[v]) for v in versions[:max(0, len(versions) - keep)]]


def _mismatch(header: dict[str, Any], version: int, stream: str, writer: str | None) -> str | None:
    """Why a decoded payload is not the publication its chunks announce (version, stream, writer), or None."""
    meta = header["publication"]
    inner = meta.get("version")
    if inner != version or header.get("model_version") != version:
        return f"chunks announce version {version}, the payload holds {str(inner)[:30]}"
    if meta.get("stream", DEFAULT_STREAM) != stream:
        return f"chunks of stream {stream!r}, the payload is of {str(meta.get('stream'))[:60]!r}"
    if writer is not None and meta.get("writer") != writer:
        return f"chunks written by {writer[:60]!r}, the payload names {str(meta.get('writer'))[:60]!r}"
    parent = meta.get("parent_version")
    if parent is not None and not (isinstance(parent, int) and 0 <= parent < version):
        return f"parent version {str(parent)[:30]} is not below {version}"
    for m in header["models"]:
        v = m.get("version")
        if not (isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_VERSION):
            return f"model {str(m.get('algorithm'))[:60]} of version {str(v)[:30]}, outside 0..2**63-1"
    return None


class ModelsReader(threading.Thread):
    """Reads the models topic from the beginning (group-less) and keeps the newest complete publication.

    ``latest()`` returns it; ``caught_up`` is set once the reader reached the end of the
    topic at least once; ``max_seen()`` is the highest verified version (a new refitter
    numbers its models above it: :class:`ModelAssembler`).
    """

    def __init__(self, settings: Settings, config: Any, on_error: Any = None, on_reject: Any = None,
                 on_refuse: Any = None) -> None:
        super().__init__(name="models-reader", daemon=True)
        self.settings = settings
        self.key = models_key(settings)
        self.on_refuse = on_refuse
        self.assembler = ModelAssembler(config, settings.max_model_bytes, on_reject=on_reject, key=self.key,
                                        on_refuse=on_refuse)
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
