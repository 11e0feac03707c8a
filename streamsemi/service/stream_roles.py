"""Roles with per-stream models: the models topic keyed by stream, one version sequence per stream.

With ``streams`` set, ``streamsemi run --role refit | assign`` (:func:`streamsemi.service.roles.make_worker`)
runs these subclasses of :mod:`streamsemi.service.roles`:

* :class:`StreamRefitter`: the window, seeds and refits of every stream
  (:class:`~streamsemi.service.streams.StreamEngines`); the leader publishes each
  stream's refit rounds to the models topic under that stream's keys
  (``<stream>/<version>/<chunk>``, header ``stream``), each stream's versions monotonic
  on their own and across failovers (a new leader numbers each stream above every
  version any chunk of that stream announced). Standbys adopt every stream's
  publications. A stream's round is published once it ended, independently of the
  others.
* :class:`StreamAssignWorker`: keeps the newest complete publication of every stream and
  assigns each document with its stream's model (documents of a stream without a model
  yet are buffered, bounded; a refused stream is dead-lettered ``unknown_stream``).

:class:`StreamModelsReader` assembles publications per stream (one
:class:`~streamsemi.service.models_topic.ModelAssembler` each, at most ``max_streams``).
"""

from __future__ import annotations

import logging
from typing import Any

from streamsemi.core.logs import event
from streamsemi.core.messages import Rejected, dead_letter, encode_json, parse_control
from streamsemi.service.config import Settings, stream_list, stream_name_problem
from streamsemi.service.models_topic import (
    DEFAULT_STREAM,
    ModelAssembler,
    ModelPublisher,
    ModelsReader,
    Publication,
    _headers,
)
from streamsemi.service.roles import AssignWorker, Refitter, round_fitted
from streamsemi.service.streams import StreamEngines

log = logging.getLogger("streamsemi.service.stream_roles")


class StreamModelsReader(ModelsReader):
    """:class:`ModelsReader` of every stream: one assembler per stream of the ``streams`` setting (bounded)."""

    def __init__(self, settings: Settings, config: Any, on_error: Any = None, on_reject: Any = None,
                 on_refuse: Any = None) -> None:
        super().__init__(settings, config, on_error, on_reject, on_refuse)
        names = stream_list(settings.streams)
        self.any = names == ["*"]
        self.allowed = frozenset([*names, settings.default_stream])
        self.max_streams = settings.max_streams
        self.config = config
        self.on_reject = on_reject
        self.assemblers: dict[str, ModelAssembler] = {}

    def _assembler(self, stream: str) -> ModelAssembler | None:
        asm = self.assemblers.get(stream)
        if asm is None and not stream_name_problem(stream) and (self.any or stream in self.allowed) \
                and len(self.assemblers) < self.max_streams:
            asm = self.assemblers[stream] = ModelAssembler(self.config, self.settings.max_model_bytes, stream=stream,
                                                           on_reject=self.on_reject, key=self.key,
                                                           on_refuse=self.on_refuse)
        return asm

    def _feed(self, record: Any) -> Publication | None:
        if record.value is None:
            try:
                stream = record.key.decode().split("/")[0]
            except (AttributeError, UnicodeDecodeError):
                return None
        else:
            stream = _headers(record).get("stream", DEFAULT_STREAM)
        asm = self._assembler(stream)
        return asm.feed(record) if asm is not None else None

    def latest_all(self) -> dict[str, Publication]:
        """The newest complete publication of every stream that has one."""
        with self.lock:
            return {name: a.latest for name, a in self.assemblers.items() if a.latest is not None}

    def max_seen_of(self, stream: str) -> int:
        with self.lock:
            asm = self.assemblers.get(stream)
            return asm.max_seen if asm is not None else 0

    def obsolete_of(self, stream: str, keep: int = 2) -> list[tuple[int, int]]:
        with self.lock:
            asm = self.assemblers.get(stream)
            return asm.obsolete(keep) if asm is not None else []


def _drop_default_series(telemetry: Any, role: str, worker: str, default_stream: str) -> None:
    """RoleMetrics starts a ``stream="default"`` series; with streams named otherwise it would stay at 0."""
    if default_stream != DEFAULT_STREAM:
        try:
            telemetry.serving_model_version.remove(role, worker, DEFAULT_STREAM)
        except KeyError:
            pass


class StreamRefitter(Refitter):
    """A refit-role process with per-stream models (module docstring)."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        s = self.settings
        self.engine: Any = StreamEngines.from_settings(s, self.telemetry, self.instance_id, "refit")
        self.engine.refits_enabled = False
        _drop_default_series(self.telemetry, "refit", self.instance_id, s.default_stream)
        self.publishers: dict[str, ModelPublisher] = {}
        self.published_versions: dict[str, int] = {}
        self.published_rounds: dict[str, int] = {}
        self.adopted_ids: dict[str, str] = {}

    def _make_models_reader(self) -> StreamModelsReader:
        return StreamModelsReader(self.settings, self.engine.config, on_error=self.broker_error,
                                  on_reject=lambda reason: self.roles.rejected.labels(reason).inc(),
                                  on_refuse=lambda reason: self.roles.refused.labels(reason).inc())

    def shutdown(self) -> None:
        super().shutdown()
        for p in self.publishers.values():
            p.close()

    # ------------------------------------------------------------------ leadership and adoption
    def _leadership(self) -> None:
        reader = self.models_reader
        elected = self.election.is_leader
        if elected and not self.leading:
            if not reader.caught_up.is_set():
                return  # number above every published version: read the models topic to its end first
            for pub in reader.latest_all().values():
                self._adopt_publication(pub)
                self.published_versions[pub.stream] = max(self.published_versions.get(pub.stream, 0), pub.version)
            self._number_above_published()
            self.published_rounds = {}  # a round that ended while the leadership moved is published now
            self.leading = True
            self.engine.refits_enabled = True
            self.roles.leader.labels(self.instance_id).set(1)
            event(log, "refit_leader_elected", worker=self.instance_id, latest_published=self.published_versions,
                  streams=sorted(self.engine.engines))
            self._take_over_suggestions()
        elif not elected and self.leading:
            self.leading = False
            self.engine.refits_enabled = False
            self.roles.leader.labels(self.instance_id).set(0)
            event(log, "refit_leadership_lost", logging.WARNING, worker=self.instance_id,
                  published_versions=self.published_versions)

    def _number_above_published(self) -> None:
        """Every stream's next version above any version a chunk of that stream announced (also new streams)."""
        for name, e in self.engine.engines.items():
            if not e.refitting:
                e.version = max(e.version, self.models_reader.max_seen_of(name))

    def _adopt(self) -> None:
        for stream, pub in self.models_reader.latest_all().items():
            if pub.publication_id == self.adopted_ids.get(stream):
                continue
            if self.leading and (pub.writer == self.instance_id or pub.version <= self.published_versions.get(stream, 0)):
                self.adopted_ids[stream] = pub.publication_id
                continue
            self._adopt_publication(pub)

    def _adopt_publication(self, pub: Publication) -> None:
        if pub.publication_id == self.adopted_ids.get(pub.stream):
            return
        eng = self.engine.engine(pub.stream)
        if eng is None:
            return
        eng.adopt_models(pub.models, pub.version, pub.primary)
        self.adopted_ids[pub.stream] = pub.publication_id
        self.roles.serving(pub.version, pub.stream)
        event(log, "model_adopted", stream=pub.stream, version=pub.version, writer=pub.writer, leader=self.leading)

    # ------------------------------------------------------------------ publication
    def _publish_if_due(self) -> None:
        """The leader publishes each stream's refit round once it ended (one stream never waits for another)."""
        if not self.leading:
            return
        self._number_above_published()
        for name, e in list(self.engine.engines.items()):
            if not e.ready or not round_fitted(e):
                continue
            if not e.refitting:
                if e.refit_count == self.published_rounds.get(name):
                    continue
                self.published_rounds[name] = e.refit_count
            version = max(slot.version for slot in e.models.values())
            published = self.published_versions.get(name, 0)
            if version <= published:
                continue
            publisher = self.publishers.get(name)
            if publisher is None:
                publisher = self.publishers[name] = ModelPublisher(self.settings, self.instance_id, stream=name)
            window = {"documents": len(e.window), "oldest_ts": e.window.oldest_ts(),
                      "max_docs": e.config.window_max_docs, "n_train": max(slot.n_train for slot in e.models.values())}
            try:
                info = publisher.publish(e.models, version=version, parent_version=published or None,
                                         primary=e.refresh_primary(), n_features=e.config.n_features,
                                         stop_words=e.config.stop_words, window=window, seeds=len(e.seeds),
                                         obsolete=self.models_reader.obsolete_of(name, keep=1))
            except Exception as exc:  # noqa: BLE001 - published again at the next step
                self.published_rounds[name] = -1
                self.broker_error("produce")
                event(log, "model_publish_failed", logging.WARNING, stream=name, version=version,
                      error=f"{type(exc).__name__}: {exc}")
                continue
            self.published_versions[name] = version
            self.roles.serving(version, name)
            self.roles.published.labels(name).inc()
            self.roles.publish_bytes.labels(name).set(info["bytes"])
            self.roles.publish_seconds.labels(name).set(info["seconds"])
            event(log, "model_published", worker=self.instance_id, stream=name, parent_version=published or None,
                  **info, algorithms=sorted(e.models), seeds=len(e.seeds), window=len(e.window))

    # ------------------------------------------------------------------ control
    def _apply_control(self) -> None:
        if self.control is None:
            return
        dead = []
        topic = self.settings.control_topic
        for raw, partition, offset, key in self.control.drain():
            msg = parse_control(raw, self.limits)
            if isinstance(msg, Rejected):
                dead.append((dead_letter(raw, msg.reason, msg.detail, topic, partition, offset, key), msg))
                continue
            if msg.op == "name" and (not self.leading or self.control.replayed(partition, offset)):
                continue  # the leader's clusters; standbys rebuild its seeds from the control topic
            dead.extend((dead_letter(encode_json(op), rej.reason, rej.detail, topic, partition, offset), rej)
                        for op, rej in self.engine.apply_control(msg, offset))
        self._send_dead(dead)


class StreamAssignWorker(AssignWorker):
    """An assign-role process with per-stream models: each document served by its stream's newest published model."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        _drop_default_series(self.telemetry, "assign", self.instance_id, self.settings.default_stream)
        self.adopted_ids: dict[str, str] = {}

    def _make_models_reader(self) -> StreamModelsReader:
        return StreamModelsReader(self.settings, self.engine.config, on_error=self.broker_error,
                                  on_reject=lambda reason: self.roles.rejected.labels(reason).inc(),
                                  on_refuse=lambda reason: self.roles.refused.labels(reason).inc())

    def _swap(self) -> None:
        reader = self.models_reader
        if reader is None:
            return
        for stream, pub in reader.latest_all().items():
            if pub.publication_id == self.adopted_ids.get(stream):
                continue
            eng = self.engine.engine(stream)
            if eng is None:
                continue
            eng.adopt_models(pub.models, pub.version, pub.primary)
            self.adopted_ids[stream] = pub.publication_id
            self.roles.serving(pub.version, stream)
            self.roles.swaps.labels(stream).inc()
            event(log, "model_swapped", stream=stream, version=pub.version, writer=pub.writer, primary=eng.primary)


__all__ = ["StreamAssignWorker", "StreamModelsReader", "StreamRefitter"]
