"""Prometheus metrics of the worker (one registry per worker/engine instance).

docs/metrics.md lists every metric. Label cardinality is bounded: class names
only for seeded classes up to ``max_class_labels`` (others become ``other``,
discovered clusters ``new``), never document ids.
"""

from __future__ import annotations

import platform
import threading
from collections.abc import Sequence

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

from streamsemi import __version__

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
REFIT_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1200)


def observe_many(histogram: Histogram, values: Sequence[float]) -> None:
    """``histogram.observe(v)`` for every ``v`` of ``values``, with one increment per bucket.

    The worker observes a latency per fresh document (one ``observe`` per document was 1% of
    the polling thread). Uses prometheus_client's ``Histogram`` internals (``_upper_bounds``,
    ``_buckets``, ``_sum``; a bucket counts the values up to its bound, as ``observe``);
    without them (another version), or for a few values, it calls ``observe``.
    """
    bounds, buckets, total = (getattr(histogram, a, None) for a in ("_upper_bounds", "_buckets", "_sum"))
    if bounds is None or buckets is None or total is None or len(values) < 8:
        for v in values:
            histogram.observe(v)
        return
    v = np.asarray(values, dtype=np.float64)
    total.inc(float(v.sum()))
    # observe: the first bucket whose bound is >= the value (a NaN falls in none)
    counts = np.bincount(np.searchsorted(np.asarray(bounds, dtype=np.float64), v[~np.isnan(v)], side="left"),
                         minlength=len(bounds))[:len(bounds)]
    for i in np.flatnonzero(counts).tolist():
        buckets[i].inc(int(counts[i]))


class Telemetry:
    """All worker metrics, registered on ``registry`` (a fresh one by default).

    Parameters
    ----------
    registry : CollectorRegistry, optional
    max_class_labels : int
        Distinct class label values exported before the rest are folded into ``other``.
    """

    def __init__(self, registry: CollectorRegistry | None = None, max_class_labels: int = 50) -> None:
        self.registry = registry or CollectorRegistry()
        self.max_class_labels = max_class_labels
        self._classes: set[str] = set()
        self._lock = threading.Lock()
        r = self.registry
        if registry is None:
            ProcessCollector(registry=r)  # process_* (CPU, resident memory, start time) for this worker
        self.build_info = Gauge("streamsemi_build_info", "Build information (always 1)", ["version", "python"], registry=r)
        self.build_info.labels(__version__, platform.python_version()).set(1)
        self.consumed = Counter("streamsemi_documents_consumed", "Document messages read from the documents topic", registry=r)
        self.assigned = Counter("streamsemi_documents_assigned", "Documents assigned, per algorithm", ["algorithm"], registry=r)
        self.assignments = Counter("streamsemi_assignments", "Assignments by algorithm and class (bounded)", ["algorithm", "class"], registry=r)
        self.new_clusters = Gauge("streamsemi_new_clusters", "Discovered (unseeded) clusters in the current model", ["algorithm"], registry=r)
        self.member_weight = Gauge("streamsemi_ensemble_member_weight",
                                   "Weight of each member of an ensemble algorithm in its current model",
                                   ["algorithm", "member"], registry=r)
        self.dead_letters = Counter("streamsemi_dead_letters", "Messages sent to the dead-letter topic, by reason", ["reason"], registry=r)
        self.control = Counter("streamsemi_control_messages", "Control messages applied, by op", ["op"], registry=r)
        self.control_rejections_replayed = Counter(
            "streamsemi_control_rejections_replayed",
            "Dead letters of replayed control records not written again (an earlier run wrote them)", registry=r)
        self.seeds = Gauge("streamsemi_seed_documents", "Seed-labeled documents held, by class (bounded)", ["class"], registry=r)
        self._seed_counts: dict[str, int] = {}  # what self.seeds exports (set_seed_counts)
        self.pending = Gauge("streamsemi_pending_labels", "Labels waiting for their document", registry=r)
        self.window = Gauge("streamsemi_window_documents", "Documents in the refit window", registry=r)
        self.window_age = Gauge("streamsemi_window_age_seconds", "Age of the oldest window document", registry=r)
        self.buffered = Gauge("streamsemi_buffered_documents", "Documents waiting for the first model", registry=r)
        self.refit_duration = Histogram("streamsemi_refit_duration_seconds", "Refit time per algorithm", ["algorithm"],
                                        buckets=REFIT_BUCKETS, registry=r)
        self.refits = Counter("streamsemi_refits", "Refits per algorithm and outcome", ["algorithm", "outcome"], registry=r)
        self.refit_triggers = Counter("streamsemi_refit_triggers", "Refit triggers, by cause", ["trigger"], registry=r)
        self.refits_skipped = Counter("streamsemi_refits_skipped", "Refit triggers not acted on, by reason", ["reason"], registry=r)
        self.refit_in_progress = Gauge("streamsemi_refit_in_progress", "1 while a refit runs", registry=r)
        self.last_refit = Gauge("streamsemi_last_successful_refit_timestamp_seconds", "Time of the last successful refit",
                                ["algorithm"], registry=r)
        self.model_version = Gauge("streamsemi_model_version", "Version of the model in use", ["algorithm"], registry=r)
        self.latency = Histogram("streamsemi_document_latency_seconds", "Time from a document's arrival at the worker to its output",
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.lag = Gauge("streamsemi_consumer_lag", "Messages behind the partition's high watermark", ["topic", "partition"], registry=r)
        self.lag_seconds = Gauge("streamsemi_consumer_lag_seconds", "Age of the newest processed record", registry=r)
        self.agreement = Gauge("streamsemi_model_agreement", "Share of window documents on which consecutive models agree",
                               ["algorithm"], registry=r)
        self.seed_accuracy = Gauge("streamsemi_seed_accuracy",
                                   "Accuracy of the model in use on seeds labeled after it was fitted (prequential)",
                                   ["algorithm"], registry=r)
        self.suggested_seed_accuracy = Gauge("streamsemi_suggested_seed_accuracy",
                                             "Accuracy of the model in use on seeds labelled from the suggestion queue "
                                             "after it was fitted (prequential; hard documents by design)",
                                             ["algorithm"], registry=r)
        self.suggestion_vote_weight = Gauge("streamsemi_suggestion_vote_weight",
                                            "Weight of this algorithm's vote in the suggestions' disagreement "
                                            "(its record against the primary on unseen seeds; 1 = a full vote)",
                                            ["algorithm"], registry=r)
        self.revisions = Counter("streamsemi_revisions", "Revised assignments emitted after a model swap, per algorithm",
                                 ["algorithm"], registry=r)
        self.revisions_pending = Gauge("streamsemi_revisions_pending",
                                       "Window documents the running revision pass has still to re-assign", registry=r)
        self.first_verdicts_pending = Gauge(
            "streamsemi_first_verdicts_pending",
            "Documents the primary served whose other algorithms' first verdicts are still to come", registry=r)
        self.first_verdicts_failed = Counter(
            "streamsemi_first_verdicts_failed",
            "Documents the primary served whose other algorithms' verdicts failed even alone (released without them)",
            registry=r)
        self.primary = Gauge("streamsemi_primary", "1 for the primary algorithm, 0 for the other enabled ones",
                             ["algorithm"], registry=r)
        self.broker_errors = Counter("streamsemi_broker_errors", "Kafka client errors, by kind", ["kind"], registry=r)
        self.ready = Gauge("streamsemi_ready", "1 when partitions are assigned and a model is loaded", registry=r)
        self.broker_resets = Counter("streamsemi_broker_resets",
                                     "Broker data losses detected (topics or logs gone) and recovered from", registry=r)
        self.output_resends = Counter("streamsemi_output_resends", "Output records sent again after a failed or lost send",
                                      registry=r)
        # the producer process (streamsemi.service.producer, producer_process = true)
        self.producer_process_starts = Counter("streamsemi_producer_process_starts", "Producer processes started",
                                               registry=r)
        self.producer_process_deaths = Counter("streamsemi_producer_process_deaths",
                                               "Producer processes that died (replaced at the next batch; the records "
                                               "they had not acknowledged are sent again)", registry=r)
        # the paced garbage collector (streamsemi.service.gcpacer, gc_full_interval_s)
        self.gc_full_collections = Counter("streamsemi_gc_full_collections",
                                           "Paced full collections of Python's garbage collector", registry=r)
        self.gc_full_collection_seconds = Gauge("streamsemi_gc_full_collection_seconds",
                                                "Duration of the last paced full garbage collection", registry=r)
        self.checkpoints = Counter("streamsemi_checkpoints", "Checkpoints written, by outcome", ["outcome"], registry=r)
        self.last_checkpoint = Gauge("streamsemi_last_checkpoint_timestamp_seconds", "Time of the last checkpoint written",
                                     registry=r)
        self.checkpoint_bytes = Gauge("streamsemi_checkpoint_bytes", "Size of the last checkpoint written", registry=r)
        # roles (streamsemi.service.roles, docs/scaling.md); set only by refit- and assign-role processes
        self.serving_model_version = Gauge(
            "streamsemi_serving_model_version",
            "Model version served (assign), last published (refit leader) or adopted (refit standby)",
            ["role", "worker", "stream"], registry=r)
        self.refit_leader = Gauge("streamsemi_refit_leader", "1 on the refitter elected to fit and publish, else 0",
                                  ["worker"], registry=r)
        self.models_published = Counter("streamsemi_models_published", "Model versions published to the models topic",
                                        ["stream"], registry=r)
        self.model_publication_bytes = Gauge("streamsemi_model_publication_bytes", "Size of the last model publication",
                                             ["stream"], registry=r)
        self.model_publication_seconds = Gauge("streamsemi_model_publication_seconds",
                                               "Time to encode and send the last model publication", ["stream"],
                                               registry=r)
        self.model_swaps = Counter("streamsemi_model_swaps", "Newer published models taken into use", ["stream"],
                                   registry=r)
        self.model_publications_rejected = Counter("streamsemi_model_publications_rejected",
                                                   "Model publications refused by the reader, by reason", ["reason"],
                                                   registry=r)
        self.models_refused = Counter("streamsemi_models_refused", "Model publications refused because a model failed "
                                      "validation, by its category (the previous model keeps serving)", ["reason"],
                                      registry=r)

    def class_label(self, name: str | None, new_cluster: bool = False) -> str:
        """Bounded label value for a class name."""
        if new_cluster:
            return "new"
        if name is None:
            return "none"
        with self._lock:
            if name in self._classes:
                return name
            if len(self._classes) < self.max_class_labels:
                self._classes.add(name)
                return name
        return "other"

    def set_seed_counts(self, counts: dict[str, int]) -> None:
        """Export seed counts per class (bounded; the rest summed into ``other``)."""
        folded: dict[str, int] = {}
        for name, n in counts.items():
            key = self.class_label(name)
            folded[key] = folded.get(key, 0) + n
        # only what changed (called for every seed: clearing re-created every class's child gauge)
        with self._lock:
            before, self._seed_counts = self._seed_counts, folded
        for key in before.keys() - folded.keys():
            self.seeds.remove(key)
        for key, n in folded.items():
            if before.get(key) != n:
                self.seeds.labels(key).set(n)
