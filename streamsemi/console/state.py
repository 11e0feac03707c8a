"""The console's view of the topics: bounded tables filled from records, and the pages' data.

Kafka-free: :class:`ConsoleState` takes ``(topic kind, key, raw value, partition, offset,
timestamp)`` tuples from the reader thread and answers the pages. Every table is bounded
in entries AND bytes (:class:`BoundedTable`: least recently written first out); a page
that counts over a table says how many entries it holds and whether older ones were
dropped. A malformed record is counted and skipped, never raised.
"""

from __future__ import annotations

import heapq
import math
import sys
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from streamsemi.core.jsonsafe import loads_object
from streamsemi.service.config import stream_name_problem

#: kinds of topic the reader feeds in
KINDS = ("documents", "assignments", "labels", "control", "clusters", "suggestions")

#: characters of a document's text kept (the snippet shown is shorter)
TEXT_CHARS = 2000
SNIPPET_CHARS = 400
#: bytes accounted per entry besides its text (measured with tracemalloc: a table entry of an id and a
#: short value); a Verdict (an assignment's tuple with its three best scores and interned words, at most
#: ~900 bytes measured) is accounted VERDICT_BYTES plus its id; a parsed JSON record kept whole
#: (clusters, suggestions) PARSED_FACTOR times its record's size
ENTRY_OVERHEAD = 350
VERDICT_BYTES = 1000
PARSED_FACTOR = 4
#: the newest entries scanned for the top words and examples of clusters and for the fallback queue
SCAN_NEWEST = 5000
#: documents/s is measured over this many seconds of assignment timestamps
RATE_WINDOW_S = 30.0
#: algorithms tracked by name (the topics are untrusted: a flood of made-up names stays bounded)
MAX_ALGORITHMS = 64
MAX_NAME_CHARS = 100
#: streams tracked by name (the stream filter and the per-stream counts); the worker's own bound is max_streams
MAX_STREAMS = 64
#: classes kept per assignment (best first): the queue's margin needs two, the pages show three
SCORES_KEPT = 3


class BoundedTable:
    """An insertion-ordered map bounded in entries and in (estimated) bytes.

    Parameters
    ----------
    max_entries : int
        At most this many entries; the least recently written goes first.
    max_bytes : int
        At most this many bytes by the sizes given to :meth:`put`.
    """

    def __init__(self, max_entries: int, max_bytes: int,
                 on_remove: Callable[[Hashable, Any], None] | None = None) -> None:
        if max_entries < 1 or max_bytes < 1:
            raise ValueError("a bounded table needs max_entries >= 1 and max_bytes >= 1")
        self.on_remove = on_remove
        self.max_entries = int(max_entries)
        self.max_bytes = int(max_bytes)
        self._data: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self.bytes = 0
        self.evicted = 0

    def put(self, key: Hashable, value: Any, size: int, keep_place: bool = False) -> None:
        """Insert or replace ``key``, then evict down to the bounds.

        The entry becomes the newest, unless ``keep_place`` and it was present already
        (an update of an old entry that should not look recent).
        """
        if keep_place and key in self._data:
            old_value, old_size = self._data[key]
            size = max(1, int(size))
            self._data[key] = (value, size)
            self.bytes += size - old_size
            if self.on_remove is not None:
                self.on_remove(key, old_value)
            self._evict()
            return
        old = self._data.pop(key, None)
        if old is not None:
            self.bytes -= old[1]
            if self.on_remove is not None:
                self.on_remove(key, old[0])
        size = max(1, int(size))
        if size > self.max_bytes:
            self.evicted += 1
            return  # larger than the whole table: not kept
        self._data[key] = (value, size)
        self.bytes += size
        self._evict()

    def _evict(self) -> None:
        while len(self._data) > self.max_entries or self.bytes > self.max_bytes:
            k, (v, s) = self._data.popitem(last=False)
            self.bytes -= s
            self.evicted += 1
            if self.on_remove is not None:
                self.on_remove(k, v)

    def pop(self, key: Hashable) -> Any:
        old = self._data.pop(key, None)
        if old is None:
            return None
        self.bytes -= old[1]
        if self.on_remove is not None:
            self.on_remove(key, old[0])
        return old[0]

    def get(self, key: Hashable, default: Any = None) -> Any:
        item = self._data.get(key)
        return default if item is None else item[0]

    def __contains__(self, key: Hashable) -> bool:
        return key in self._data

    def __len__(self) -> int:
        return len(self._data)

    def items(self) -> Iterator[tuple[Hashable, Any]]:
        """Oldest first."""
        for k, (v, _) in self._data.items():
            yield k, v

    def newest(self, n: int) -> list[tuple[Hashable, Any]]:
        out = []
        for k in reversed(self._data):
            out.append((k, self._data[k][0]))
            if len(out) >= n:
                break
        return out


@dataclass(frozen=True)
class Bounds:
    """Entries and bytes per table (``--max-entries``, ``--max-mb``)."""

    max_entries: int = 50_000
    max_bytes: int = 32 * 1024 * 1024


@dataclass
class Seed:
    """A seed label as the control topic last said it (``offset`` orders one id's operations)."""

    labels: tuple[str, ...]
    offset: int
    ts: float
    text: str | None = None
    stream: str | None = None


class Named(NamedTuple):
    """A ``name`` control op as read: the class it names, its offset and time, and the newest model version
    of its algorithm seen when it was read (the worker's next model or the one after carries the name)."""

    label: str
    offset: int
    ts: float
    version_seen: int


@dataclass
class Counts:
    """Records read per kind, and those skipped as malformed."""

    read: Counter = field(default_factory=Counter)
    malformed: Counter = field(default_factory=Counter)


def _str_list(v: Any, limit: int) -> list[str]:
    return [str(x) for x in v[:limit]] if isinstance(v, list) else []


def _float(v: Any, default: float = 0.0) -> float:
    """``v`` as a finite float (a bool, a string, NaN, an infinity or an int beyond a double: ``default``)."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return default
    try:
        f = float(v)
    except OverflowError:
        return default
    return f if math.isfinite(f) else default


def _int(v: Any, default: int = 0) -> int:
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else default


def _name(v: Any) -> str:
    """A class, cluster, algorithm or word: interned (they repeat across thousands of entries)."""
    return sys.intern(str(v)[:MAX_NAME_CHARS])


def _scores(v: Any, keep: int = SCORES_KEPT) -> tuple[tuple[str, float], ...]:
    """The ``keep`` most likely classes of a ``{class: probability}`` object, best first."""
    if not isinstance(v, dict):
        return ()
    pairs = sorted(((_name(k), _float(p)) for k, p in list(v.items())[:50]), key=lambda kv: -kv[1])
    return tuple(pairs[:keep])


def _str(v: Any, limit: int = MAX_NAME_CHARS) -> str:
    return v[:limit] if isinstance(v, str) else ""


#: what a record's field may hold, by the name its schema gives the type (docs/schemas/)
_IS: dict[str, Callable[[Any], bool]] = {
    "a string": lambda v: isinstance(v, str),
    "an integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "a number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
    "a boolean": lambda v: isinstance(v, bool),
    "a list": lambda v: isinstance(v, list),
    "an object": lambda v: isinstance(v, dict),
}


def _field(m: dict, name: str, kind: str, default: Any = None) -> Any:
    """Field ``name`` of record ``m`` (``default`` when missing or null).

    Raises
    ------
    ValueError
        The field holds another type than ``kind`` (a key of :data:`_IS`): the record is skipped.
    """
    v = m.get(name)
    if v is None:
        return default
    if not _IS[kind](v):
        raise ValueError(f"field {name!r} must be {kind}, got {type(v).__name__}")
    return v


def _items(m: dict, name: str, kind: str, limit: int) -> list[Any]:
    """The first ``limit`` items of list field ``name``, each of type ``kind`` (else ValueError)."""
    items = _field(m, name, "a list", [])[:limit]
    if not all(_IS[kind](x) for x in items):
        raise ValueError(f"field {name!r} must be a list of {kind.split(' ', 1)[1]}s")
    return items


def _probabilities(m: dict, name: str) -> dict[str, float]:
    """Object field ``name`` of ``{class: probability}`` (at most 50 classes kept; else ValueError)."""
    obj = _field(m, name, "an object", {})
    out = {}
    for k, p in list(obj.items())[:50]:
        if not _IS["a number"](p):
            raise ValueError(f"field {name!r} must map classes to numbers, got {type(p).__name__} for a class")
        out[_name(k)] = float(p)
    return out


#: words and examples kept per cluster event, characters of a document id kept in an example or suggestion
MAX_WORDS = 50
MAX_EXAMPLES = 20
MAX_ID_CHARS = 1000
#: a name op the worker has not applied by this many model versions after it was read was refused (dead letter)
NAME_APPLIED_WITHIN = 2


def _normalised(text: str) -> str:
    """``text`` with runs of whitespace as one space, trimmed and case-folded: what makes two examples the same."""
    return " ".join(text.split()).casefold()


def distinct_examples(examples: list[dict[str, Any]], limit: int) -> tuple[list[dict[str, Any]], int]:
    """The first ``limit`` examples whose snippets differ after whitespace and case normalisation.

    Returns
    -------
    (list, int)
        The examples kept (in their order) and how many of the others repeated a kept one.
    """
    seen: set[str] = set()
    kept: list[dict[str, Any]] = []
    repeats = 0
    for e in examples:
        norm = _normalised(e["snippet"])
        if norm in seen:
            repeats += 1
        elif len(kept) < limit:
            seen.add(norm)
            kept.append(e)
    return kept, repeats


def _with_stream(entry: dict[str, Any], m: dict) -> dict[str, Any]:
    """``entry`` with the record's ``stream`` (checked by :meth:`ConsoleState._stream` before)."""
    if m.get("stream") is not None:
        entry["stream"] = m["stream"]
    return entry


def cluster_entry(m: dict) -> dict[str, Any]:
    """What the console keeps of a clusters-topic event: each field the pages read, of the type
    docs/schemas/cluster-event.schema.json gives it, and nothing else.

    Raises
    ------
    ValueError
        A field of another type (``examples`` that are not objects with string ``id`` and ``snippet``...).
    """
    examples = [{"id": _field(e, "id", "a string", "")[:MAX_ID_CHARS],
                 "snippet": _field(e, "snippet", "a string", "")[:SNIPPET_CHARS]}
                for e in _items(m, "examples", "an object", MAX_EXAMPLES)]
    label = _field(m, "label", "a string")
    target = _field(m, "target", "a string")
    return _with_stream({
        "cluster": _field(m, "cluster", "a string", "")[:MAX_NAME_CHARS],
        "algorithm": _field(m, "algorithm", "a string", "")[:MAX_NAME_CHARS],
        "event": _field(m, "event", "a string", "")[:MAX_NAME_CHARS],
        "target": None if target is None else target[:MAX_NAME_CHARS],
        "label": None if label is None else label[:MAX_NAME_CHARS],
        "model_version": _field(m, "model_version", "an integer", 0), "size": _field(m, "size", "an integer", 0),
        "ts": float(_field(m, "ts", "a number", 0.0)),
        "top_words": [_name(w) for w in _items(m, "top_words", "a string", MAX_WORDS)], "examples": examples,
    }, m)


def suggestion_entry(m: dict) -> dict[str, Any]:
    """What the console keeps of a suggestions-topic record: each field the pages read, of the type
    docs/schemas/suggestion.schema.json gives it, and nothing else.

    Raises
    ------
    ValueError
        A field of another type (a score that is not a number, a rank that is not an integer...).
    """
    label = _field(m, "label", "a string")
    return _with_stream({
        "id": _field(m, "id", "a string", ""), "snippet": _field(m, "snippet", "a string", "")[:TEXT_CHARS],
        "algorithm": _field(m, "algorithm", "a string", "")[:MAX_NAME_CHARS],
        "label": None if label is None else label[:MAX_NAME_CHARS],
        "reason": _field(m, "reason", "a string", "")[:MAX_NAME_CHARS],
        "priority": float(_field(m, "priority", "a number", 0.0)), "rank": _field(m, "rank", "an integer", 10**9),
        "model_version": _field(m, "model_version", "an integer", 0), "ts": float(_field(m, "ts", "a number", 0.0)),
        "scores": _probabilities(m, "scores"),
    }, m)


def margin(scores: tuple[tuple[str, float], ...]) -> float:
    """Top probability minus the second (1.0 with a single class); ``scores`` best first."""
    if not scores:
        return 1.0
    return scores[0][1] - (scores[1][1] if len(scores) > 1 else 0.0)


class Verdict(NamedTuple):
    """What the console keeps of an assignment (a tuple: a fraction of the parsed record's memory)."""

    algorithm: str
    label: str | None
    cluster: str
    score: float
    scores: tuple[tuple[str, float], ...]
    explain: tuple[str, ...]
    model_version: int
    revision: int
    provisional: bool
    stream: str | None = None


class ConsoleState:
    """Everything the pages show, filled by :meth:`ingest` (thread-safe).

    Parameters
    ----------
    bounds : Bounds
        Entries and bytes of each table.
    clock : callable
        Epoch seconds (tests pass a fake).
    default_stream : str, optional
        With per-stream models (the ``streams`` setting), the stream of records without
        ``stream`` (control ops sent without one go to it); None: such records have no
        stream (a deployment without per-stream models, where nothing carries one).

    Records may carry ``stream`` (per-stream models, docs/scaling.md): seeds, the queue's
    hidden marks and the counts are kept per stream (a document id is unique within its
    stream); the labels, suggestions and texts tables are keyed by id as their topics are.
    The views take an optional ``stream`` filter.
    """

    def __init__(self, bounds: Bounds | None = None, clock: Callable[[], float] = time.time,
                 default_stream: str | None = None) -> None:
        self.bounds = bounds = bounds or Bounds()
        self.clock = clock
        self.default_stream = default_stream
        #: streams seen in records (at most MAX_STREAMS names; later ones are counted, not listed)
        self.stream_names: dict[str, None] = {} if default_stream is None else {default_stream: None}
        self.streams_unlisted = 0
        self.lock = threading.RLock()
        b = (bounds.max_entries, bounds.max_bytes)
        self.texts = BoundedTable(*b)          # id -> (text[:TEXT_CHARS], complete, stream)
        # counts kept up to date as entries come and go (the pages do not scan the tables for them)
        self.label_counts: Counter = Counter()     # (stream, class or cluster) -> documents whose latest primary label it is
        self.cluster_sizes: Counter = Counter()    # (stream, algorithm, cluster) -> documents whose latest assignment it is
        self.labels = BoundedTable(*b, on_remove=lambda k, v: self._count(
            self.label_counts, (v.stream, v.cluster or v.label or "?")))
        self.assignments = BoundedTable(*b, on_remove=lambda k, v: self._count(
            self.cluster_sizes, (v.stream, k[0], v.cluster)))
        self.seeds = BoundedTable(*b)          # (stream, id) -> Seed
        self.unlabeled = BoundedTable(*b)      # (stream, id) -> offset of the latest unlabel (orders late resolved labels)
        self.clusters = BoundedTable(*b)       # "[stream/]algorithm/cluster" -> clusters-topic value
        self.suggestions = BoundedTable(*b)    # id -> suggestions-topic value
        self.hidden = BoundedTable(*b)         # (stream, id) -> why the console hides it from the queue (labeled, skipped)
        self.named = BoundedTable(*b)          # (stream, algorithm or "", cluster) -> Named: the latest name op for it
        self.names_applied = BoundedTable(*b)  # (stream, class, name op offset) of the seeds a worker made of a name op
        self.recent_ops: deque[dict[str, Any]] = deque(maxlen=200)  # control operations, newest last
        self.fresh_ts: deque[tuple[float, str | None]] = deque(maxlen=100_000)  # (ts, stream) of fresh primaries
        self.model_version: dict[str, int] = {}                      # algorithm -> newest model version seen
        self.stream_versions: dict[tuple[str | None, str], int] = {}  # (stream, algorithm) -> its newest version
        self.cluster_versions: dict[tuple[str | None, str], int] = {}  # (stream, algorithm) -> newest cluster event's
        self.primary_algorithm: str | None = None
        #: the worker runs per-stream models: configured (``default_stream``), told by the worker (its ``/readyz``)
        #: or seen in a record it wrote (only per-stream models put ``stream`` in outputs; a documents record's
        #: ``stream`` is the producer's and says nothing about the worker)
        self.worker_streams = False
        self.counts = Counts()
        self.topics_seen: set[str] = set()
        self._cache: dict[str, tuple[float, Any]] = {}

    @staticmethod
    def _count(counter: Counter, key: Hashable, by: int = -1) -> None:
        n = counter[key] + by
        if n > 0:
            counter[key] = n
        else:
            del counter[key]

    # ---------------------------------------------------------------- streams
    def _stream(self, m: dict) -> str | None:
        """The stream of record ``m`` (its ``stream``, else the default stream); an invalid one raises ValueError.

        Any record but a document that carries a stream says the worker runs per-stream models.
        """
        v = m.get("stream")
        if v is None:
            return self.default_stream
        self.worker_streams = True
        if v in self.stream_names:  # (checked when first seen)
            return v
        if not isinstance(v, str) or stream_name_problem(v):
            raise ValueError("'stream' is not a stream name")
        if v not in self.stream_names:
            if len(self.stream_names) >= MAX_STREAMS:
                self.streams_unlisted += 1
            else:
                self.stream_names[v] = None
        return sys.intern(v)

    def streams(self) -> list[str]:
        """The streams seen (sorted; at most MAX_STREAMS): the values the stream filter accepts."""
        with self.lock:
            return sorted(self.stream_names)

    def multi_stream(self) -> bool:
        """More than one stream seen: the pages show a stream column and the filter."""
        return len(self.stream_names) > 1

    def per_stream(self) -> bool:
        """The worker runs per-stream models (configured, told by the worker, or seen in its records)."""
        return self.default_stream is not None or self.worker_streams

    def note_worker_streams(self, per_stream: bool) -> None:
        """What the worker says of itself (its ``/readyz`` lists ``streams`` with per-stream models only)."""
        with self.lock:
            if per_stream and not self.worker_streams:
                self.worker_streams = True
                self._cache.clear()

    # ---------------------------------------------------------------- ingest
    def ingest(self, kind: str, key: bytes | None, raw: bytes | None, partition: int = 0, offset: int = 0,
               timestamp_ms: int | None = None) -> str | None:
        """Apply one record of topic kind ``kind``; a malformed record is counted and skipped.

        Returns
        -------
        str or None
            Why the record was skipped (its content only: never raised), None when it was applied.
        """
        with self.lock:
            self.counts.read[kind] += 1
            self.topics_seen.add(kind)
            self._cache.clear()
            try:
                handler = getattr(self, f"_on_{kind}")
                ok = handler(key, raw, partition, offset, timestamp_ms)
                why = None if ok is not False else "missing field or wrong type"
            except Exception as exc:  # noqa: BLE001 - whatever a record holds, it is one skipped record
                why = f"{type(exc).__name__}: {exc}"[:300]
            if why is not None:
                self.counts.malformed[kind] += 1
            return why

    @staticmethod
    def _json(raw: bytes | None) -> dict | None:
        """The record's JSON object (None for a tombstone); anything else raises UnsafeJSON (a ValueError)."""
        return None if raw is None else loads_object(raw)

    @staticmethod
    def _size(key: bytes | None, raw: bytes | None) -> int:
        return len(key or b"") + len(raw or b"") + ENTRY_OVERHEAD

    def _on_documents(self, key, raw, partition, offset, ts_ms) -> bool:
        m = self._json(raw)
        if m is None or not isinstance(m.get("id"), str) or not isinstance(m.get("text"), str):
            return False
        # the producer's stream: kept with the text, listed only when the worker runs per-stream models
        stream = m.get("stream")
        if stream is not None and (not isinstance(stream, str) or stream_name_problem(stream)):
            raise ValueError("'stream' is not a stream name")
        stream = self._stream(m) if stream is not None and self.per_stream() else stream
        text = m["text"]
        kept = text[:TEXT_CHARS]
        self.texts.put(m["id"], (kept, len(kept) == len(text), stream),
                       len(m["id"]) + len(kept.encode()) + ENTRY_OVERHEAD)
        return True

    def _verdict(self, m: dict) -> Verdict:
        """An assignment (or labels) record as kept; a field of another type than
        docs/schemas/assignment.schema.json gives it raises ValueError (the record is skipped)."""
        label = _field(m, "label", "a string")
        return Verdict(_name(_field(m, "algorithm", "a string", "")), None if label is None else _name(label),
                       _name(_field(m, "cluster", "a string", "")), float(_field(m, "score", "a number", 0.0)),
                       _scores(_probabilities(m, "labels")),
                       tuple(_name(w) for w in _items(m, "explain", "a string", 10)),
                       _field(m, "model_version", "an integer", 0), _field(m, "revision", "an integer", 0),
                       _field(m, "provisional", "a boolean", False), self._stream(m))

    def _on_assignments(self, key, raw, partition, offset, ts_ms) -> bool:
        m = self._json(raw)
        if m is None or not isinstance(m.get("id"), str) or not isinstance(m.get("algorithm"), str):
            return False
        s = self._verdict(m)
        alg = s.algorithm
        if alg in self.model_version or len(self.model_version) < MAX_ALGORITHMS:
            self.model_version[alg] = max(self.model_version.get(alg, 0), s.model_version)
            if s.stream in self.stream_names:  # listed streams only: bounded by MAX_STREAMS x MAX_ALGORITHMS
                self.stream_versions[(s.stream, alg)] = max(self.stream_versions.get((s.stream, alg), 0),
                                                            s.model_version)
        if m.get("primary") is True:
            self.primary_algorithm = alg
            if s.revision == 0:
                ts = m.get("ts")
                self.fresh_ts.append((_float(ts, (ts_ms or 0) / 1000.0), s.stream))
        self.assignments.put((alg, m["id"]), s, VERDICT_BYTES + 2 * len(m["id"]))
        if (alg, m["id"]) in self.assignments:
            self._count(self.cluster_sizes, (s.stream, alg, s.cluster), +1)
        return True

    def _on_labels(self, key, raw, partition, offset, ts_ms) -> bool:
        m = self._json(raw)
        if m is None:
            if key:
                self.labels.pop(key.decode("utf-8", "replace"))
            return True
        if not isinstance(m.get("id"), str):
            return False
        s = self._verdict(m)
        self.labels.put(m["id"], s, VERDICT_BYTES + 2 * len(m["id"]))
        if m["id"] in self.labels:
            self._count(self.label_counts, (s.stream, s.cluster or s.label or "?"), +1)
        return True

    def _on_control(self, key, raw, partition, offset, ts_ms) -> bool:
        m = self._json(raw)
        if m is None:
            return False
        op = m.get("op")
        ts = (ts_ms or 0) / 1000.0 or self.clock()
        doc_id = m.get("id") if isinstance(m.get("id"), str) else None
        stream = self._stream(m)
        key = (stream, doc_id)
        # one document's operations share a partition (key = id): offsets order them
        order = (partition, offset)
        if op == "label" and doc_id and isinstance(m.get("labels"), list):
            labels = tuple(_items(m, "labels", "a string", 1000))
            resolved = m.get("origin") == "resolved" and isinstance(m.get("label_offset"), int)
            effective = (partition, m["label_offset"]) if resolved else order
            undone = self.unlabeled.get(key)
            if undone is not None and undone > effective:
                return True  # a resolved copy of a label that a later unlabel removed
            text = m.get("text") if isinstance(m.get("text"), str) else None
            prev = self.seeds.get(key)
            if text is None and prev is not None:
                text = prev.text
            if resolved and prev is not None:
                ts = prev.ts  # the worker's copy of a seed (with its text) is not a new seed
            text = text[:SNIPPET_CHARS] if text else None
            self.seeds.put(key, Seed(labels, offset, ts, text, stream),
                           len(doc_id) + (len(text.encode()) if text else 0) + ENTRY_OVERHEAD + 100,
                           keep_place=resolved)
            self.hidden.put(key, "labeled", len(doc_id) + ENTRY_OVERHEAD)
            if not resolved:
                self.recent_ops.append({"op": "label", "id": doc_id, "labels": list(labels), "ts": ts,
                                        "stream": stream})
            if m.get("origin") == "cluster" and isinstance(m.get("label_offset"), int) and labels:
                # a seed the worker made of a name op: that name was applied
                applied = (stream, labels[0], m["label_offset"])
                self.names_applied.put(applied, True, len(labels[0]) + ENTRY_OVERHEAD)
            return True
        if op == "unlabel" and doc_id:
            self.seeds.pop(key)
            self.unlabeled.put(key, order, len(doc_id) + ENTRY_OVERHEAD)
            self.recent_ops.append({"op": "unlabel", "id": doc_id, "ts": ts, "stream": stream})
            return True
        if op == "name" and isinstance(m.get("cluster"), str) and isinstance(m.get("label"), str):
            alg = _str(m.get("algorithm"))
            served = alg or self.primary_algorithm  # (None: not known yet, any algorithm's versions count)
            versions = [v for (s, a), v in self.cluster_versions.items() if s == stream and served in (None, a)]
            versions += [v for (s, a), v in self.stream_versions.items() if stream and s == stream and served in (None, a)]
            versions += [v for a, v in self.model_version.items() if not stream and served in (None, a)]
            seen = max(versions, default=0)
            name_key = (stream, alg, _str(m["cluster"]))
            self.named.put(name_key, Named(_str(m["label"]), offset, ts, seen),
                           len(name_key[1]) + len(name_key[2]) + ENTRY_OVERHEAD + 100)
        if op in ("refit", "name"):
            self.recent_ops.append({"op": op, **{k: _str(m[k]) for k in ("algorithm", "cluster", "label") if k in m},
                                    "ts": ts, "stream": stream})
            return True
        return False

    def _on_clusters(self, key, raw, partition, offset, ts_ms) -> bool:
        m = self._json(raw)
        k = key.decode("utf-8", "replace") if key else None
        if m is None:
            if k:
                self.clusters.pop(k)
            return True
        if not isinstance(m.get("cluster"), str):
            return False
        stream = self._stream(m)
        k = k or "/".join([*([stream] if stream else []), str(m.get("algorithm", "")), m["cluster"]])
        entry = cluster_entry(m)
        self.clusters.put(k, entry, PARSED_FACTOR * self._size(key, raw))
        vkey = (stream, entry["algorithm"])
        if vkey in self.cluster_versions or len(self.cluster_versions) < MAX_STREAMS * MAX_ALGORITHMS:
            self.cluster_versions[vkey] = max(self.cluster_versions.get(vkey, 0), entry["model_version"])
        return True

    def _on_suggestions(self, key, raw, partition, offset, ts_ms) -> bool:
        m = self._json(raw)
        if m is None:  # tombstone: labelled (or no longer suggested)
            if key:
                self.suggestions.pop(key.decode("utf-8", "replace"))
            return True
        if not isinstance(m.get("id"), str):
            return False
        self._stream(m)  # a valid stream (or none), and listed
        self.suggestions.put(m["id"], suggestion_entry(m), PARSED_FACTOR * self._size(key, raw))
        return True

    # ---------------------------------------------------------------- local marks
    def hide(self, doc_id: str, why: str, stream: str | None = None) -> None:
        """Take a document of ``stream`` out of the queue at once (labelled or skipped from this console)."""
        with self.lock:
            self.hidden.put((stream, doc_id), why, len(doc_id) + ENTRY_OVERHEAD)
            self._cache.clear()

    # ---------------------------------------------------------------- views
    # ``only``: a stream filter (one of :meth:`streams`), None for every stream
    def text_of(self, doc_id: str, stream: str | None = None) -> tuple[str | None, bool]:
        """The document's text as read (at most TEXT_CHARS) and whether it is complete."""
        with self.lock:
            t = self.texts.get(doc_id)
            if t is not None:
                return t[0], t[1]
            seed = self.seeds.get((stream, doc_id))
            if seed is not None and seed.text:
                return seed.text, False
            sug = self.suggestions.get(doc_id)
            if sug is not None and isinstance(sug.get("snippet"), str):
                return sug["snippet"], False
            return None, False

    def docs_per_second(self, only: str | None = None) -> float:
        with self.lock:
            now = self.clock()
            n = sum(1 for t, s in self.fresh_ts if now - RATE_WINDOW_S <= t <= now + 5 and (only is None or s == only))
        return n / RATE_WINDOW_S

    def classes(self, only: str | None = None) -> list[str]:
        """Known classes (seeded, or served by the primary model) of stream ``only`` (None: every stream), sorted."""
        with self.lock:
            found = {c for (s, c) in self.label_counts if (only is None or s == only)
                     and not c.startswith("new-") and c != "?"}
            for (s, _), seed in self.seeds.items():
                if only is None or s == only:
                    found.update(seed.labels)
        return sorted(found)

    def class_counts(self, only: str | None = None) -> list[dict[str, Any]]:
        """Per stream and class (or discovered cluster): documents whose latest primary label it is, and seeds."""
        with self.lock:
            docs = Counter({k: n for k, n in self.label_counts.items() if only is None or k[0] == only})
            seeds: Counter = Counter()
            for (s, _), seed in self.seeds.items():
                if only is None or s == only:
                    seeds.update((s, c) for c in seed.labels)
        keys = sorted(set(docs) | set(seeds), key=lambda k: (k[1].startswith("new-"), -docs[k], k[1], k[0] or ""))
        return [{"name": c, "stream": s, "documents": docs[(s, c)], "seeds": seeds[(s, c)], "new": c.startswith("new-")}
                for s, c in keys]

    def stream_counts(self) -> list[dict[str, Any]]:
        """Per stream seen: labels held, seeds, suggestions and its model versions (the overview's stream table)."""
        with self.lock:
            per: dict[str | None, dict[str, Any]] = {
                s: {"stream": s, "labels": 0, "seeds": 0, "suggestions": 0, "model_version": {}}
                for s in self.stream_names}
            for (s, _), n in self.label_counts.items():
                if s in per:
                    per[s]["labels"] += n
            for (s, _), _seed in self.seeds.items():
                if s in per:
                    per[s]["seeds"] += 1
            for _, m in self.suggestions.items():
                s = self._stream(m)
                if s in per:
                    per[s]["suggestions"] += 1
            for (s, alg), v in self.stream_versions.items():
                if s in per:
                    per[s]["model_version"][alg] = v
        return [per[s] for s in sorted(per, key=lambda x: x or "")]

    def overview(self, only: str | None = None) -> dict[str, Any]:
        with self.lock:
            if only is None:
                versions, labels_held = self.model_version.copy(), len(self.labels)
                seeds, suggestions = len(self.seeds), len(self.suggestions)
            else:
                versions = {alg: v for (s, alg), v in self.stream_versions.items() if s == only}
                labels_held = sum(n for (s, _), n in self.label_counts.items() if s == only)
                seeds = sum(1 for (s, _), _seed in self.seeds.items() if s == only)
                suggestions = sum(1 for _, m in self.suggestions.items() if self._stream(m) == only)
            return {
                "docs_per_s": self.docs_per_second(only), "model_version": versions,
                "primary": self.primary_algorithm, "classes": self.class_counts(only),
                "labels_held": labels_held, "labels_evicted": self.labels.evicted,
                "seeds": seeds, "suggestions": suggestions,
                "streams": self.stream_counts() if self.multi_stream() else [],
                "streams_unlisted": self.streams_unlisted,
                "read": dict(self.counts.read), "malformed": dict(self.counts.malformed),
                "bytes": sum(t.bytes for t in self._tables()),
            }

    def _tables(self) -> list[BoundedTable]:
        return [self.texts, self.labels, self.assignments, self.seeds, self.unlabeled, self.clusters,
                self.suggestions, self.hidden, self.named, self.names_applied]

    def _name_of(self, stream: str | None, alg: str, cluster: str) -> Named | None:
        """The latest name op read for ``cluster`` of ``alg`` (one without ``algorithm`` names the primary's)."""
        named = self.named.get((stream, alg, cluster))
        if named is None and (self.primary_algorithm in (None, alg)):
            named = self.named.get((stream, "", cluster))
        return named

    def clusters_view(self, examples: int = 3, words: int = 10,
                      only: str | None = None) -> dict[str, list[dict[str, Any]]]:
        """Per algorithm (``stream/algorithm`` for a stream's), its clusters: size, top words and example documents.

        From the clusters topic where it has entries for a stream's algorithm (size: the window
        documents of the cluster at the event's model version; merged and retired clusters are
        left out); otherwise built from the assignments held (size = documents whose latest
        assignment is in the cluster, kept up to date as entries come and go; top words and
        examples = the most frequent explanation words and the latest documents among the newest
        SCAN_NEWEST assignments). Examples are at most ``examples`` documents whose texts differ
        after whitespace and case normalisation (``repeats``: how many repeated one of them).

        Every row carries its ``stream`` and ``algorithm``, ``event`` and ``target`` (the source of
        a ``split_from``), and ``named``: the class a name op read from the control topic gives
        it while the worker has not merged it yet (None when there is none, or when no seed the
        worker made of that op was read and an event made after it, ``NAME_APPLIED_WITHIN``
        model versions on, still has the cluster: then ``name_refused`` holds the name the worker
        did not apply).
        """
        with self.lock:
            cached = self._cache.get(f"clusters/{only}")
            if cached is not None:
                return cached[1]
            out: dict[tuple[str | None, str], list[dict[str, Any]]] = {}
            from_topic: dict[tuple[str | None, str], list[dict[str, Any]]] = {}
            for k, m in self.clusters.items():
                stream = self._stream(m)
                if only is not None and stream != only:
                    continue
                parts = str(k).split("/")
                alg = str(m.get("algorithm") or (parts[-2] if len(parts) > 1 else ""))
                if m.get("event") in ("retired", "merged_into"):
                    continue  # gone (a named cluster is merged into its class)
                exs, repeats = distinct_examples(
                    [{"id": str(e.get("id")), "snippet": str(e.get("snippet", ""))[:SNIPPET_CHARS]}
                     for e in (m.get("examples") or []) if isinstance(e, dict)], examples)
                version = _int(m.get("model_version"))
                named = self._name_of(stream, alg, m["cluster"])
                # refused: no seed made of it, and an event made after the op, NAME_APPLIED_WITHIN versions on,
                # still has the cluster (an applied name makes it merged_into the class)
                refused = (named is not None and (stream, named.label, named.offset) not in self.names_applied
                           and _float(m.get("ts")) > named.ts and version >= named.version_seen + NAME_APPLIED_WITHIN)
                from_topic.setdefault((stream, alg), []).append({
                    "cluster": m["cluster"], "size": _int(m.get("size")), "top_words": _str_list(m.get("top_words"), words),
                    "examples": exs, "repeats": repeats, "new": str(m["cluster"]).startswith("new-"),
                    "event": str(m.get("event", "")), "target": m.get("target"), "model_version": version,
                    "source": "clusters topic", "name": m.get("label") if isinstance(m.get("label"), str) else None,
                    "named": named.label if named is not None and not refused else None,
                    "name_refused": named.label if refused else None, "stream": stream, "algorithm": alg})
            sizes: dict[tuple[str | None, str], Counter] = {}
            for (stream, alg, c), n in self.cluster_sizes.items():
                # (cluster "": a stream's "no model yet" assignments, docs/messages.md: in no cluster)
                if c and (stream, alg) not in from_topic and (only is None or stream == only):
                    sizes.setdefault((stream, alg), Counter())[c] = n
            # top words and examples: from the newest assignments only (a page must not scan the whole table)
            word_counts: dict[tuple[str | None, str, str], Counter] = {}
            recent: dict[tuple[str | None, str, str], list[dict[str, Any]]] = {}
            seen_texts: dict[tuple[str | None, str, str], set[str]] = {}
            repeats_of: Counter = Counter()
            for (alg, doc_id), s in self.assignments.newest(SCAN_NEWEST):
                if (s.stream, alg) in sizes:
                    key = (s.stream, alg, s.cluster)
                    word_counts.setdefault(key, Counter()).update(s.explain)
                    held = self.texts.get(doc_id)
                    if held is None:
                        continue
                    norm = _normalised(held[0][:SNIPPET_CHARS])
                    seen = seen_texts.setdefault(key, set())
                    if norm in seen:
                        repeats_of[key] += 1
                    elif len(seen) < examples:  # at most `examples` texts per cluster: bounded
                        seen.add(norm)
                        recent.setdefault(key, []).append({"id": doc_id, "snippet": held[0][:SNIPPET_CHARS]})
            for (stream, alg), counter in sizes.items():
                rows = []
                for c, n in counter.most_common():
                    named = self._name_of(stream, alg, c)
                    rows.append({
                        "cluster": c, "size": n, "new": c.startswith("new-"), "event": "", "target": None,
                        "top_words": [w for w, _ in word_counts.get((stream, alg, c), Counter()).most_common(words)],
                        "examples": recent.get((stream, alg, c), []), "repeats": repeats_of[(stream, alg, c)],
                        "model_version": None, "source": "assignments", "name": None,
                        "named": named.label if named is not None else None, "name_refused": None,
                        "stream": stream, "algorithm": alg})
                out[(stream, alg)] = rows
            for key, rows in from_topic.items():
                out[key] = sorted(rows, key=lambda r: (-r["size"], r["cluster"]))
            result = {(alg if stream is None else f"{stream}/{alg}"): rows
                      for (stream, alg), rows in sorted(out.items(), key=lambda kv: (kv[0][0] or "", kv[0][1]))}
            self._cache[f"clusters/{only}"] = (self.clock(), result)
            return result

    def new_clusters(self, only: str | None = None) -> list[dict[str, Any]]:
        """Discovered clusters (``new-N``) of every algorithm (of stream ``only``) still to be named, largest first.

        A cluster named by a name op on the control topic is a class now and is left out, unless the
        worker's models went on without applying that name (``name_refused``).
        """
        rows = [r for rs in self.clusters_view(only=only).values() for r in rs if r["new"] and not r["named"]]
        return sorted(rows, key=lambda r: (-r["size"], r["stream"] or "", r["algorithm"], r["cluster"]))

    def queue(self, limit: int = 20, only: str | None = None) -> tuple[list[dict[str, Any]], str]:
        """The suggestion queue (of stream ``only``; every stream's when None) and where it comes from.

        The worker's suggestions topic when it has entries; otherwise the primary model's
        least certain documents (smallest margin between its two best classes) among the
        newest SCAN_NEWEST labels held, as long as their text was read. Documents labelled or skipped
        here are left out. Each item carries its ``stream``: the console's writes for it name it.
        """
        with self.lock:
            items: list[dict[str, Any]] = []
            if len(self.suggestions):
                for doc_id, m in self.suggestions.items():
                    stream = self._stream(m)
                    if (only is not None and stream != only) or (stream, doc_id) in self.hidden \
                            or (stream, doc_id) in self.seeds:
                        continue
                    items.append({"id": doc_id, "snippet": str(m.get("snippet", ""))[:SNIPPET_CHARS],
                                  "label": m.get("label") if isinstance(m.get("label"), str) else None,
                                  "scores": _scores(m.get("scores")), "reason": str(m.get("reason", "")),
                                  "priority": _float(m.get("priority")), "rank": _int(m.get("rank"), 10**9),
                                  "algorithm": str(m.get("algorithm", "")), "stream": stream})
                items = heapq.nsmallest(limit, items, key=lambda s: (s["rank"], -s["priority"]))
                if items or only is None:
                    return items, "suggestions"
            ranked = heapq.nsmallest(limit, ((margin(s.scores), doc_id, s) for doc_id, s in
                                             self.labels.newest(SCAN_NEWEST)
                                             if (only is None or s.stream == only)
                                             and (s.stream, doc_id) not in self.hidden
                                             and (s.stream, doc_id) not in self.seeds and doc_id in self.texts),
                                     key=lambda t: (t[0], t[1]))
            items = [{"id": doc_id, "snippet": self.texts.get(doc_id)[0][:SNIPPET_CHARS],
                      "label": s.label or s.cluster, "scores": s.scores, "reason": "uncertain",
                      "priority": 1.0 - m, "rank": 0, "algorithm": s.algorithm, "stream": s.stream}
                     for m, doc_id, s in ranked]
            return items, ("labels" if items else "none")

    def recent_seeds(self, limit: int = 50, only: str | None = None) -> list[dict[str, Any]]:
        """The newest seeds (of stream ``only``), at most ``limit``, from at most SCAN_NEWEST of the table."""
        with self.lock:
            found = self.seeds.newest(limit) if only is None else [
                (k, s) for k, s in self.seeds.newest(SCAN_NEWEST) if k[0] == only][:limit]
            return [{"id": k[1], "stream": k[0], "labels": list(s.labels), "ts": s.ts,
                     "snippet": (s.text or "")[:SNIPPET_CHARS]} for k, s in found]

    def document(self, doc_id: str, stream: str | None = None) -> dict[str, Any] | None:
        """Everything held about one document (of ``stream``, else of the stream its records name; None: nothing)."""
        with self.lock:
            held = self.texts.get(doc_id)
            primary = self.labels.get(doc_id)
            sug = self.suggestions.get(doc_id)
            if stream is None:
                # a documents record's stream is the producer's: it is the document's stream for per-stream
                # models only (without them the worker's outputs and seeds carry none)
                named = [primary.stream if primary else None, held[2] if held and self.per_stream() else None,
                         self._stream(sug) if sug else None, self.default_stream]
                stream = next((s for s in named if s is not None), None)
            text, complete = self.text_of(doc_id, stream)
            per_alg = [s for s in (self.assignments.get((alg, doc_id)) for alg in self.model_version) if s]
            seed = self.seeds.get((stream, doc_id))
            if text is None and primary is None and not per_alg and seed is None and sug is None:
                return None
            return {"id": doc_id, "stream": stream, "text": text, "complete": complete, "primary": primary,
                    "assignments": sorted(per_alg, key=lambda s: s.algorithm),
                    "seed": {"labels": list(seed.labels), "ts": seed.ts} if seed else None, "suggestion": sug}
