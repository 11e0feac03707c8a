"""Per-stream models: one :class:`~streamsemi.engine.Engine` per stream (setting ``streams``, docs/scaling.md).

Documents carry an optional ``stream`` field; with ``streams`` set, each stream is
windowed, seeded and fitted apart: :class:`StreamEngines` holds one engine per stream
(created when the stream's first document or control message arrives, at most
``max_streams``) and exposes to :class:`~streamsemi.service.worker.Worker` what it uses
of a single engine:

* :meth:`StreamEngines.process` routes a batch by stream (each stream's documents in
  their order), runs every stream's engine (its time-driven work runs even without
  documents) and tags the outputs with their ``stream``; a document of a stream that is
  not allowed, has no valid name or is beyond ``max_streams`` is rejected
  (``unknown_stream``: the worker dead-letters it and goes on);
* :meth:`StreamEngines.apply_control` applies a control message to its stream's engine
  (no ``stream``: the default stream; op ``refit`` without ``stream``: every stream);
* suggestions, cluster events, resolved seeds and expired labels of every stream,
  tagged with their stream; counts summed over streams.

Refits of one stream never block another's: every engine has its own refit thread and
triggers, and the fits that go through the worker's single fit process
(:mod:`streamsemi.service.fitter`) are served one at a time, the fits of streams
without a model first, then in arrival order (:class:`FairFitter`): a stream's first
model waits for at most the one fit running (and the first models of streams that
came before it), a later refit for the fits queued before it (at most one per other
stream); serving never waits on a fit.

A stream's pre-model buffer never stalls another stream: consumption pauses (backpressure,
the single-engine behaviour) only for a full buffer whose stream can fit (seeds of two
classes: the full buffer starts its first fit at once). A stream whose buffer is full while it
cannot fit *spills*: its further documents are windowed (not buffered) and emitted at once
as "no model yet" assignments (``label`` null, ``cluster`` "", ``model_version`` 0,
``provisional`` true), which the revision pass after its first model revises (``revision``
1, the model's verdict); so the other streams keep flowing and every document still has an
output before its offset is committed. With ``revisions = off`` nothing would revise them:
such a stream pauses consumption as before.

Memory: each stream's engine has the bounds of one engine (``window_max_docs``,
``max_seed_docs``, ``max_pending_labels``, ``max_buffered_docs``, in entries and bytes), so
the whole is bounded by ``max_streams`` times them.

Checkpoints (:class:`StreamsCheckpointer`): each stream's state in the standard format
under ``<state_dir>/streams/stream=<hex of its UTF-8 name>/``
(:func:`~streamsemi.service.checkpoint.stream_dir_name`: never the name itself), all written
together with the same offsets; :meth:`StreamEngines.restore` restores every stream found
there (a directory of the earlier layout, named by the stream, is renamed to its encoded
name first; a checkpoint at the root, from a run without streams, becomes the default
stream's).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from streamsemi.core.logs import event
from streamsemi.core.messages import ControlMessage, Document, Rejected
from streamsemi.core.names import valid_name
from streamsemi.core.telemetry import Telemetry
from streamsemi.engine import Assignment, Engine, EngineConfig, ProcessResult, ResolvedSeed
from streamsemi.service import checkpoint
from streamsemi.service.config import Settings, stream_list, stream_name_problem

log = logging.getLogger("streamsemi.service.streams")

ANY = "*"
STREAMS_DIR = checkpoint.STREAMS_DIR


class FairFitter:
    """Serve the calls of ``fit`` (the worker's fit process) one at a time: first models first, then in arrival order.

    A plain lock lets the thread that just released it take it again at once, so a
    stream fitting several algorithms in a row could keep another stream's first fit
    waiting for its whole round. Here a fit waits only for the fit running and those
    queued before it, and the fits of a stream without a model yet (``first``) go
    before the others: a stream's first model waits for at most one fit of an
    established stream (each engine fits one algorithm at a time). Between two fits of
    such a first round the fit process is free for an instant; ``first_round_active``
    (true while a stream without a model is inside its refit round) keeps the other
    streams' fits waiting then too, or they would slip in before the round's next fit.
    """

    #: How often a fit held back by another stream's first round looks again (the round's end is not signalled).
    RECHECK_S = 0.05

    def __init__(self, fit: Callable[..., Any], first_round_active: Callable[[], bool] | None = None) -> None:
        self.fit = fit
        self.first_round_active = first_round_active
        self._cond = threading.Condition()
        self._next = 0
        self._busy = False
        self._waiting: set[tuple[int, int]] = set()

    def run(self, first: bool, *args: Any, **kwargs: Any) -> Any:
        """``fit(*args, **kwargs)`` when its turn comes (``first``: for a stream without a model yet)."""
        with self._cond:
            key = (0 if first else 1, self._next)
            self._next += 1
            self._waiting.add(key)
            while (self._busy or min(self._waiting) != key
                   or (not first and self.first_round_active is not None and self.first_round_active())):
                self._cond.wait(self.RECHECK_S)
            self._waiting.discard(key)
            self._busy = True
        try:
            return self.fit(*args, **kwargs)
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.run(False, *args, **kwargs)


def _collect(stream: str, result: ProcessResult, assignments: list[Assignment], revisions: list[Assignment]) -> None:
    """``result``'s assignments and revisions, tagged with their ``stream``, appended to the lists."""
    for a in result.assignments:
        a.stream = stream
    for a in result.revisions:
        a.stream = stream
    assignments.extend(result.assignments)
    revisions.extend(result.revisions)


class _Broadcast:
    """An engine setting the worker sets on :class:`StreamEngines`: kept there and passed on to every stream's
    engine, those that exist and those created later."""

    names: list[str] = []

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name
        _Broadcast.names.append(name)

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        return self if obj is None else obj.__dict__[self.name]

    def __set__(self, obj: Any, value: Any) -> None:
        obj.__dict__[self.name] = value
        for e in obj.__dict__.get("engines", {}).values():
            setattr(e, self.name, value)


class _StreamFit:
    """A stream engine's :attr:`Engine.fitter`: its fits through the shared :class:`FairFitter`."""

    def __init__(self, fair: FairFitter, engine: Engine) -> None:
        self.fair, self.engine = fair, engine

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fair.run(not self.engine.ready, *args, **kwargs)


class _Union:
    """The entries of one attribute of every stream's engine, read-only (``len``, truth, iteration)."""

    def __init__(self, owner: StreamEngines, attr: str) -> None:
        self.owner, self.attr = owner, attr

    def _parts(self) -> list[Any]:
        return [getattr(e, self.attr) for e in list(self.owner.engines.values())]

    def __len__(self) -> int:
        return sum(len(p) for p in self._parts())

    def __bool__(self) -> bool:
        return any(len(p) for p in self._parts())

    def __iter__(self) -> Iterator[Any]:
        for p in self._parts():
            yield from p


class _Boards:
    """``suggestion_board.adopt`` of the worker: each id goes to the stream whose window holds it."""

    def __init__(self, owner: StreamEngines) -> None:
        self.owner = owner

    def adopt(self, ids: Sequence[str]) -> int:
        owner = self.owner
        default = owner.default_engine
        per: dict[int, list[str]] = {}
        engines = list(owner.engines.values())
        for k in ids:
            holder = next((e for e in engines if k in e.window), default)
            per.setdefault(id(holder), []).append(k)
        return sum(e.suggestion_board.adopt(per.get(id(e), [])) for e in engines)


class StreamEngines:
    """One engine per stream, behind the interface the worker uses of one engine (module docstring).

    Parameters
    ----------
    config : EngineConfig
        Every stream's engine configuration (bounds are per stream).
    telemetry : Telemetry
        Shared by the streams' engines: counters add up; :meth:`process` sets the window,
        buffer, held-label and seed gauges to the sums over streams, and
        ``streamsemi_serving_model_version{role, worker, stream}`` per stream.
    streams : sequence of str
        Allowed stream names, or ``["*"]`` for any valid name.
    default_stream : str
        The stream of documents and control messages without ``stream``.
    max_streams : int
        Bound on the number of streams (engines).
    worker, role : str
        Label values of the per-stream model version metric.

    Raises
    ------
    ValueError
        ``max_streams`` below 1, or (:class:`~streamsemi.core.names.InvalidName`) a name of ``streams`` or
        ``default_stream`` that is not a stream name.
    """

    def __init__(self, config: EngineConfig, telemetry: Telemetry, streams: Sequence[str], default_stream: str,
                 max_streams: int, worker: str = "", role: str = "all") -> None:
        if max_streams < 1:
            raise ValueError(f"max_streams must be >= 1, got {max_streams}")
        names = list(streams)
        self.any = names == [ANY]
        for name in ([] if self.any else names) + [default_stream]:
            valid_name("stream", name)  # InvalidName (a ValueError) for a name no document could be routed to
        self.allowed = frozenset() if self.any else frozenset([*names, default_stream])
        self.config = config
        self.telemetry = telemetry
        self.default_stream = default_stream
        self.max_streams = max_streams
        self.worker, self.role = worker, role
        self.engines: dict[str, Engine] = {}
        self.unknown = 0  # documents and control messages refused (unknown_stream)
        self.unserved = 0  # documents emitted "no model yet" by a stream whose full buffer cannot fit (spilled)
        self._spilling: set[str] = set()
        self._fitter: FairFitter | None = None
        self.revision_budget_s: float | None = None
        self.deferred_budget_s: float | None = None
        self.backlog = 0          # documents waiting on the broker: every stream's first fit waits (they may be its own)
        self.backlog_in_flight = 0  # ... when more than this many (Engine.backlog_in_flight)
        self.refits_enabled = True  # False: no stream starts a refit (assigners; a standby refitter, stream_roles)
        self._seed_total = -1
        self.default_engine = self.engine(default_stream)
        if self.default_engine is None:  # pragma: no cover - the default is always admitted
            raise ValueError(f"default stream {default_stream!r} is not a valid stream name")
        self.window = _Union(self, "window")
        self.seeds = _Union(self, "seeds")
        self.pending = _Union(self, "pending")
        self.buffer = _Union(self, "buffer")
        self.partial_docs = _Union(self, "partial_docs")
        self.suggestion_board = _Boards(self)

    @classmethod
    def from_settings(cls, settings: Settings, telemetry: Telemetry, worker: str = "",
                      role: str = "all") -> StreamEngines | None:
        """The streams of ``settings`` (None when ``streams`` is empty: one engine for every document)."""
        names = stream_list(settings.streams)
        if not names:
            return None
        return cls(EngineConfig.from_settings(settings), telemetry, names, settings.default_stream,
                   settings.max_streams, worker, role)

    # ------------------------------------------------------------------ routing
    def route(self, stream: str | None) -> str | Rejected:
        """The stream a message with ``stream`` goes to (its engine exists afterwards), or why it is refused."""
        name = self.default_stream if stream is None else stream
        if name in self.engines:
            return name
        problem = stream_name_problem(name)
        if problem:
            return Rejected("unknown_stream", f"stream {name[:80]!r} is not a stream name: it {problem}")
        if not self.any and name not in self.allowed:
            return Rejected("unknown_stream", f"stream {name!r} is not one of the configured streams "
                                              f"({', '.join(sorted(self.allowed))})")
        if self.engine(name) is None:
            return Rejected("unknown_stream", f"stream {name!r}: max_streams={self.max_streams} streams exist already "
                                              f"({', '.join(sorted(self.engines)[:20])})")
        return name

    def engine(self, name: str) -> Engine | None:
        """The engine of stream ``name``, created if the stream is admitted and the bound allows; else None."""
        eng = self.engines.get(name)
        if eng is not None:
            return eng
        if stream_name_problem(name) or (not self.any and name not in self.allowed) or len(self.engines) >= self.max_streams:
            return None
        eng = Engine(self.config, self.telemetry)
        eng.fitter = None if self._fitter is None else _StreamFit(self._fitter, eng)
        for setting in _Broadcast.names:
            setattr(eng, setting, getattr(self, setting))
        self.engines[name] = eng
        self.telemetry.serving_model_version.labels(self.role, self.worker, name).set(0)
        event(log, "stream_created", stream=name, streams=len(self.engines), max_streams=self.max_streams)
        return eng

    # ------------------------------------------------------------------ settings the worker makes
    @property
    def fitter(self) -> FairFitter | None:
        return self._fitter

    @fitter.setter
    def fitter(self, fit: Callable[..., Any] | None) -> None:
        self._fitter = None if fit is None else (fit if isinstance(fit, FairFitter)
                                                 else FairFitter(fit, self._first_round_active))
        for e in self.engines.values():
            e.fitter = None if self._fitter is None else _StreamFit(self._fitter, e)

    def _first_round_active(self) -> bool:
        """A stream without a model is inside its refit round (its next fit goes before other streams')."""
        return any(not e.ready and e.refitting for e in list(self.engines.values()))

    revision_budget_s = _Broadcast()
    deferred_budget_s = _Broadcast()
    backlog = _Broadcast()
    backlog_in_flight = _Broadcast()
    refits_enabled = _Broadcast()

    # ------------------------------------------------------------------ documents
    def _group(self, docs: Sequence[Document]) -> tuple[dict[str, list[Document]], list[tuple[Document, Rejected]]]:
        """``docs`` by stream (each stream's in their order) and the refused ones (``unknown_stream``)."""
        groups: dict[str, list[Document]] = {}
        rejected: list[tuple[Document, Rejected]] = []
        for doc in docs:
            name = self.route(doc.stream)
            if isinstance(name, Rejected):
                self.unknown += 1
                rejected.append((doc, name))
            else:
                groups.setdefault(name, []).append(doc)
        return groups, rejected

    def serve(self, docs: Sequence[Document]) -> ProcessResult:
        """:meth:`Engine.serve` per stream (the ``assign`` role: published models, no window)."""
        groups, rejected = self._group(docs)
        assignments: list[Assignment] = []
        for name, eng in list(self.engines.items()):
            result = eng.serve(groups.get(name, ()))
            for a in result.assignments:
                a.stream = name
            assignments.extend(result.assignments)
            rejected.extend(result.rejected)
        self.publish_gauges()
        return ProcessResult(assignments, rejected)

    def learn(self, docs: Sequence[Document]) -> int:
        """:meth:`Engine.learn` per stream (the ``refit`` role); documents of refused streams are skipped."""
        groups, _ = self._group(docs)
        n = sum(eng.learn(groups.get(name, ())) for name, eng in list(self.engines.items()))
        self.publish_gauges(versions=False)
        return n

    def process(self, docs: Sequence[Document], *, background: bool = True) -> ProcessResult:
        """Route ``docs`` by stream and run every stream's engine; outputs tagged with their stream.

        Each stream's documents keep their order; the assignments come stream by
        stream (in the order the streams were created), then every stream's revisions.
        ``background``: as :meth:`Engine.process` (the worker calls :meth:`background` later).
        """
        groups, rejected = self._group(docs)
        assignments: list[Assignment] = []
        revisions: list[Assignment] = []
        for name, eng in list(self.engines.items()):
            group = groups.get(name, ())
            if group and self.spills(eng):
                # what the buffer still holds is buffered; the rest is windowed and emitted "no model yet"
                room = max(0, 0 if eng.buffer_full else self.config.max_buffered_docs - len(eng.buffer))
                if room < len(group):
                    group, spilled = group[:room], group[room:]
                    assignments.extend(self._unserved(name, eng, spilled, rejected))
            elif name in self._spilling and not self.spills(eng):
                self._spilling.discard(name)
                event(log, "stream_spill_ended", stream=name, ready=eng.ready, buffered=len(eng.buffer))
            result = eng.process(group, background=background)
            _collect(name, result, assignments, revisions)
            rejected.extend(result.rejected)
        self.publish_gauges()
        return ProcessResult(assignments, rejected, revisions)

    def background(self) -> ProcessResult:
        """:meth:`Engine.background` of every stream, outputs tagged with their stream."""
        assignments: list[Assignment] = []
        revisions: list[Assignment] = []
        for name, eng in list(self.engines.items()):
            _collect(name, eng.background(), assignments, revisions)
        self.publish_gauges()
        return ProcessResult(assignments, [], revisions)

    @staticmethod
    def spills(eng: Engine) -> bool:
        """Whether the further documents of ``eng``'s stream spill once its buffer is full (module docstring).

        It has no model and cannot fit one (seeds of fewer than two classes: its first fit
        would not start), and revisions are on (its first model revises what it spilled).
        """
        return not eng.ready and len(eng.seeds.class_counts()) < 2 and eng.config.revisions != "off"

    def _unserved(self, name: str, eng: Engine, docs: Sequence[Document],
                  rejected: list[tuple[Document, Rejected]]) -> list[Assignment]:
        """Window ``docs`` of stream ``name`` and their "no model yet" assignments (one per algorithm)."""
        eng.absorb(docs, update_sketch=True)
        held = [d for d in docs if d.id in eng.window]
        kept = {d.id for d in held}
        for d in docs:
            if d.id not in kept:
                rejected.append((d, Rejected("no_terms", "the text has no indexable terms "
                                                         "(only stop words, digits or punctuation)")))
        eng.track_unserved([d.id for d in held])
        if name not in self._spilling:
            self._spilling.add(name)
            event(log, "stream_spilling", logging.WARNING, stream=name, buffered=len(eng.buffer),
                  seed_classes=len(eng.seeds.class_counts()),
                  action="its buffer is full and it cannot fit: further documents get 'no model yet' "
                         "assignments, revised by its first model; the other streams keep flowing")
        self.unserved += len(held)
        now = eng.clock()
        algorithms = eng.config.algorithms
        return [Assignment(d.id, alg, 0, None, 0.0, {}, "", False, [], alg == eng.primary, now, False, d, 0, True,
                           stream=name) for d in held for alg in algorithms]

    def absorb(self, docs: Sequence[Document], update_sketch: bool = False) -> int:
        """Put already-assigned documents back into their stream's window (documents of refused streams skipped)."""
        groups: dict[str, list[Document]] = {}
        for doc in docs:
            name = self.route(doc.stream)
            if not isinstance(name, Rejected):
                groups.setdefault(name, []).append(doc)
        return sum(self.engines[name].absorb(group, update_sketch) for name, group in groups.items())

    def drop_buffered(self, predicate: Callable[[Document], bool]) -> int:
        return sum(e.drop_buffered(predicate) for e in self.engines.values())

    # ------------------------------------------------------------------ control
    def apply_control(self, msg: ControlMessage, offset: int) -> list[tuple[dict, Rejected]]:
        """Apply ``msg`` to its stream's engine; ``(op, rejection)`` pairs for the dead-letter topic."""
        if msg.op == "refit" and msg.stream is None:
            self.request_refit("request")
            return []
        name = self.route(msg.stream)
        if isinstance(name, Rejected):
            self.unknown += 1
            op = {"op": msg.op, "id": msg.id, "labels": list(msg.labels) or None, "cluster": msg.cluster,
                  "stream": msg.stream}
            return [({k: v for k, v in op.items() if v is not None}, name)]
        eng = self.engines[name]
        if msg.op == "refit":
            eng.request_refit("request")
            return []
        if msg.op == "unlabel":
            eng.unlabel(msg.id, offset)
            out: list[tuple[dict, Rejected]] = []
        elif msg.op == "name":
            out = eng.name_cluster(msg.cluster, msg.labels[0], msg.algorithm, offset)
        else:
            out = eng.label(msg.id, msg.labels, msg.text, offset, msg.origin, msg.label_offset)
        for op, _ in out:
            op["stream"] = name
        self._seed_total = -1  # the seed gauge is recomputed
        return out

    def request_refit(self, trigger: str = "request") -> None:
        """A refit of every stream (``restore``: of the streams restored without all their models)."""
        for e in self.engines.values():
            if trigger != "restore" or (e.models and not e.ready):
                e.request_refit(trigger)

    def name_cluster(self, cluster: str, label: str, algorithm: str | None = None,
                     offset: int | None = None) -> list[tuple[dict, Rejected]]:
        """Op ``name`` without a stream: the default stream's cluster."""
        return self.default_engine.name_cluster(cluster, label, algorithm, offset)

    # ------------------------------------------------------------------ outputs besides assignments
    def drain_dead(self) -> list[tuple[dict, Rejected]]:
        out = []
        for name, e in self.engines.items():
            for op, rej in e.drain_dead():
                op["stream"] = name
                out.append((op, rej))
        return out

    def drain_resolved(self) -> list[ResolvedSeed]:
        out = []
        for name, e in self.engines.items():
            for seed in e.drain_resolved():
                seed.stream = name
                out.append(seed)
        return out

    def drain_cluster_events(self) -> list[dict[str, Any]]:
        out = []
        for name, e in self.engines.items():
            for ev in e.drain_cluster_events():
                ev["stream"] = name
                out.append(ev)
        return out

    def suggestion_updates(self) -> list[tuple[str, dict[str, Any] | None]]:
        out = []
        for name, e in self.engines.items():
            for doc_id, msg in e.suggestion_updates():
                if msg is not None:
                    msg["stream"] = name
                out.append((doc_id, msg))
        return out

    def suggestions(self) -> list[dict[str, Any]]:
        """Every stream's published suggestions, best ranks first."""
        out = []
        for name, e in self.engines.items():
            out.extend({**m, "stream": name} for m in e.suggestions())
        return sorted(out, key=lambda m: (m["rank"], m["stream"]))

    # ------------------------------------------------------------------ state
    @property
    def ready(self) -> bool:
        """Every stream that exists has a model for every enabled algorithm."""
        return all(e.ready for e in self.engines.values())

    @property
    def serving(self) -> bool:
        """Every stream that exists assigns its documents (:attr:`Engine.serving`)."""
        return all(e.serving for e in self.engines.values())

    @property
    def refitting(self) -> bool:
        return any(e.refitting for e in self.engines.values())

    @property
    def holding_backlog(self) -> bool:
        return any(e.holding_backlog for e in self.engines.values())

    @property
    def buffer_full(self) -> bool:
        """A stream that can fit has a full pre-model buffer: consumption pauses until its first fit (then resumes).

        A full buffer of a stream that cannot fit pauses nothing: that stream spills (module docstring).
        """
        return any(e.buffer_full and not self.spills(e) for e in self.engines.values())

    @property
    def revisions_pending(self) -> int:
        return sum(e.revisions_pending for e in self.engines.values())

    def partial_min_offsets(self) -> dict[Any, int]:
        """:meth:`Engine.partial_min_offsets` over every stream (the oldest per partition)."""
        out: dict[Any, int] = {}
        for e in self.engines.values():
            for tp, off in e.partial_min_offsets().items():
                out[tp] = min(off, out.get(tp, off))
        return out

    @property
    def first_verdicts_pending(self) -> int:
        return sum(e.first_verdicts_pending for e in self.engines.values())

    def note_emit(self, seconds: float, records: int) -> None:
        """:meth:`Engine.note_emit`: one cost per record for every stream (they share the producer)."""
        for e in self.engines.values():
            e.note_emit(seconds, records)

    @property
    def control_ops(self) -> int:
        return sum(e.control_ops for e in self.engines.values())

    @property
    def version(self) -> int:
        """The highest model version of any stream (versions count per stream)."""
        return max((e.version for e in self.engines.values()), default=0)

    @property
    def refit_count(self) -> int:
        return sum(e.refit_count for e in self.engines.values())

    @property
    def models(self) -> dict[str, Any]:
        """Every stream's models, keyed ``stream/algorithm``."""
        return {f"{name}/{alg}": slot for name, e in self.engines.items() for alg, slot in e.models.items()}

    @property
    def auto_primary(self) -> bool:
        return self.default_engine.auto_primary

    @property
    def primary(self) -> str:
        return self.default_engine.primary

    @property
    def last_refit_error(self) -> dict[str, str]:
        return {f"{name}/{alg}": err for name, e in self.engines.items() for alg, err in e.last_refit_error.items()}

    def wait_for_refit(self, timeout: float | None = None) -> bool:
        """Block until every stream's running refit ended (True), or ``timeout`` passed (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for e in list(self.engines.values()):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not e.wait_for_refit(left):
                return False
        return True

    def serving_version(self, name: str) -> int:
        """The version of the model stream ``name`` serves (its primary's; 0 before the first)."""
        e = self.engines.get(name)
        if e is None or not e.models:
            return 0
        slot = e.models.get(e.primary)
        return slot.version if slot is not None else max(s.version for s in e.models.values())

    def publish_gauges(self, versions: bool = True) -> None:
        """Gauges summed over streams (engines write their own values to the shared ones) and versions per stream.

        ``versions=False`` (the refit role): the per-stream version gauge is the published version, set there.
        """
        t = self.telemetry
        engines = list(self.engines.items())
        t.window.set(sum(len(e.window) for _, e in engines))
        t.buffered.set(sum(len(e.buffer) for _, e in engines))
        t.pending.set(sum(len(e.pending) for _, e in engines))
        t.revisions_pending.set(sum(e.revisions_pending for _, e in engines))
        t.first_verdicts_pending.set(sum(e.first_verdicts_pending for _, e in engines))
        seeds = sum(len(e.seeds) for _, e in engines)
        if seeds != self._seed_total:
            counts: dict[str, int] = {}
            for _, e in engines:
                for cls, n in e.seeds.class_counts().items():
                    counts[cls] = counts.get(cls, 0) + n
            t.set_seed_counts(counts)
            self._seed_total = seeds
        if not versions:
            return
        per_alg: dict[str, int] = {}
        for name, e in engines:
            t.serving_model_version.labels(self.role, self.worker, name).set(self.serving_version(name))
            for alg, slot in e.models.items():
                per_alg[alg] = max(per_alg.get(alg, 0), slot.version)
        for alg, v in per_alg.items():
            t.model_version.labels(alg).set(v)

    def stats(self) -> dict[str, Any]:
        """Counts summed over streams, and each stream's own."""
        per = {name: e.stats() for name, e in self.engines.items()}
        total: dict[str, Any] = {
            "window": len(self.window), "seeds": len(self.seeds), "pending_labels": len(self.pending),
            "buffered": len(self.buffer), "model_version": self.version, "refits": self.refit_count,
            "ready": self.ready, "refitting": self.refitting,
            "seed_classes": len({c for e in self.engines.values() for c in e.seeds.class_counts()}),
            "unknown_stream": self.unknown, "unserved": self.unserved, "spilling": sorted(self._spilling),
            "streams": per,
        }
        return total

    # ------------------------------------------------------------------ checkpoints
    def restore(self, state_dir: str | Path) -> checkpoint.RestoreReport:
        """Restore every stream checkpointed under ``<state_dir>/streams/`` (module docstring); one merged report.

        A stream directory of a stream that is no longer allowed, or beyond
        ``max_streams``, is left alone (logged). Offsets are the lowest per partition
        over the restored streams, so that the window catch-up covers every stream.
        """
        root = Path(state_dir)
        base = root / STREAMS_DIR
        reports: dict[str, checkpoint.RestoreReport] = {}
        for name in checkpoint.stream_roots(root):  # links skipped, the earlier layout migrated
            eng = None if stream_name_problem(name) else self.engine(name)
            if eng is None:
                event(log, "stream_checkpoint_skipped", logging.WARNING, stream=name[:80],
                      reason="not an allowed stream, or beyond max_streams")
                continue
            reports[name] = checkpoint.restore(eng, root, stream=name)
        if self.default_stream not in reports and checkpoint.read_latest(root)[0] is not None:
            # a checkpoint from a run without streams: the default stream's
            reports[self.default_stream] = checkpoint.restore(self.default_engine, root)
        done = {n: r for n, r in reports.items() if r.status == "restored"}
        status = "restored" if done else ("unusable" if any(r.status == "unusable" for r in reports.values())
                                          else "missing")
        merged = checkpoint.RestoreReport(status, path=str(base),
                                          problems=[f"{n}: {p}" for n, r in reports.items() for p in r.problems])
        for name, r in done.items():
            for key, n in r.counts.items():
                merged.counts[key] = merged.counts.get(key, 0) + n
            merged.models.update({f"{name}/{alg}": v for alg, v in r.models.items()})
            merged.skipped_models.update({f"{name}/{alg}": why for alg, why in r.skipped_models.items()})
            merged.model_version = max(merged.model_version, r.model_version)
            for key, off in r.offsets.items():
                merged.offsets[key] = min(off, merged.offsets.get(key, off))
        self._seed_total = -1  # (the worker asks request_refit("restore") for streams restored without every model)
        self.publish_gauges()
        event(log, "streams_restored", streams=sorted(done), status=status)
        return merged


class StreamsCheckpointer(checkpoint.Checkpointer):
    """:class:`~streamsemi.service.checkpoint.Checkpointer` of every stream (``<state_dir>/streams/stream=<hex>/``).

    One background thread writes every stream's checkpoint, each with the same offsets;
    ``on_done`` gets the sums (bytes, counts) and the highest model version.
    """

    def submit(self, engine: Any, reason: str, offsets: list[list[Any]] | None = None) -> bool:
        if self.busy:
            return False
        states = {name: e.export_state() for name, e in engine.engines.items()}
        self._thread = threading.Thread(target=self._run_streams, args=(states, offsets, reason),
                                        name="checkpoint", daemon=True)
        self._thread.start()
        return True

    def _run_streams(self, states: dict[str, Any], offsets: list[list[Any]] | None, reason: str) -> None:
        t0 = time.perf_counter()
        total: dict[str, Any] = {"reason": reason, "path": str(self.state_dir / STREAMS_DIR), "bytes": 0,
                                 "counts": {}, "model_version": 0, "skipped_models": [], "streams": {}}
        try:
            for name, state in states.items():
                cap = checkpoint.encode(state, offsets)
                info = checkpoint.write(self.state_dir, cap, stream=name)
                total["bytes"] += info["bytes"]
                for key, n in cap.manifest["counts"].items():
                    total["counts"][key] = total["counts"].get(key, 0) + n
                total["model_version"] = max(total["model_version"], cap.manifest["model_version"])
                total["skipped_models"] += [f"{name}/{x['algorithm']}" for x in cap.skipped]
                total["streams"][name] = info["path"]
        except Exception as exc:  # noqa: BLE001 - reported, never fatal
            if self.on_error:
                self.on_error(exc, reason)
            return
        total["seconds"] = round(time.perf_counter() - t0, 3)
        if self.on_done:
            self.on_done(total)


__all__ = ["ANY", "STREAMS_DIR", "FairFitter", "StreamEngines", "StreamsCheckpointer"]
