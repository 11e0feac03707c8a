"""The worker's hot path: the same partitions, metrics and verdicts as the code it replaces."""

from __future__ import annotations

import numpy as np
import pytest
from kafka.errors import MessageSizeTooLargeError
from kafka.partitioner import DefaultPartitioner, murmur2
from kafka_utils import DEADLINE, Topics, read_topic
from prometheus_client import generate_latest

from streamsemi.core.telemetry import Telemetry
from streamsemi.service.config import resolve
from streamsemi.service.kafka_io import (
    KeyPartitioner,
    OutputProducer,
    make_document_consumer,
    make_producer,
)


class _Cluster:
    """The two ClusterMetadata calls a partitioner makes, for fixed topics."""

    def __init__(self, partitions: dict[str, int]) -> None:
        self.parts = {t: set(range(n)) for t, n in partitions.items()}

    def topics(self) -> set[str]:
        return set(self.parts)

    def partitions_for_topic(self, topic: str) -> set[int]:
        return self.parts[topic]

    def available_partitions_for_topic(self, topic: str) -> set[int]:
        return self.parts[topic]


def test_key_partitioner_chooses_the_default_partitioners_partition() -> None:
    cluster = _Cluster({"a": 1, "b": 3, "c": 12})
    ours, default = KeyPartitioner(), DefaultPartitioner()
    rng = np.random.default_rng(0)
    keys = [bytes(rng.integers(0, 256, size=int(rng.integers(0, 40)), dtype=np.uint8)) for _ in range(300)]
    spread = set()
    for key in keys:
        for topic in ("c", "a", "c", "b", "c"):  # the records of one document, then the next document's
            got = ours.partition(topic, key, key, None, b"v", cluster)
            assert got == default.partition(topic, key, key, None, b"v", cluster)
            spread.add((topic, got))
    assert {p for t, p in spread if t == "c"} == set(range(12))
    for topic in ("a", "c"):  # algorithm after algorithm: every key again (remembered hashes), then a long key
        for key in keys + [b"x" * 300]:
            assert ours.partition(topic, key, key, None, b"v", cluster) == default.partition(topic, key, key, None,
                                                                                              b"v", cluster)
    assert len(ours._hashes) == len(set(keys)) and b"x" * 300 not in ours._hashes
    small = KeyPartitioner()
    small.MAX_KEYS = 5
    for key in keys[:12]:
        assert small.key_hash(key) == murmur2(key) & 0x7fffffff and len(small._hashes) <= 5
    assert ours.partition("b", None, None, None, b"v", cluster) in {0, 1, 2}
    with pytest.raises(ValueError):
        ours.partition("missing", b"k", b"k", None, b"v", cluster)


def _seed_gauge(t: Telemetry) -> dict[str, float]:
    out = {}
    for line in generate_latest(t.registry).decode().splitlines():
        if line.startswith("streamsemi_seed_documents{"):
            out[line.split('"')[1]] = float(line.rpartition(" ")[2])
    return out


def test_seed_counts_gauge_follows_every_update() -> None:
    t = Telemetry(max_class_labels=2)
    t.set_seed_counts({"a": 1})
    assert _seed_gauge(t) == {"a": 1.0}
    t.set_seed_counts({"a": 2, "b": 1, "c": 4, "d": 1})   # beyond 2 classes: summed into "other"
    assert _seed_gauge(t) == {"a": 2.0, "b": 1.0, "other": 5.0}
    t.set_seed_counts({"b": 3})                            # classes gone: their series go
    assert _seed_gauge(t) == {"b": 3.0}
    t.set_seed_counts({})
    assert _seed_gauge(t) == {}


def test_gil_releasing_predictions_run_on_the_helper_thread_with_the_same_verdicts(monkeypatch) -> None:
    import threading

    from streamsemi.algorithms.cle import CLE
    from streamsemi.algorithms.dlda import DLDA
    from streamsemi.core.datasets import load
    from streamsemi.core.messages import Document
    from streamsemi.engine import Engine, EngineConfig

    ds = load("reuters-r8")
    order = [int(i) for i in np.random.default_rng(5).permutation(len(ds))[:260]]
    eng = Engine(EngineConfig(algorithms=["constrained-kmeans", "d-lda", "cle"], background_refit=False,
                              n_features=2**12, refit_every_docs=0, min_docs_first_refit=150, drift_detection=False,
                              min_seed_classes=2, min_seeds_per_class=1, first_fit_stable_seeds=0, refit_growth=0,
                              refit_idle_s=0))
    for i in order[:40]:
        eng.label(f"r{i}", [ds.labels[i]], text=ds.texts[i])
    eng.process([Document(id=f"r{i}", text=ds.texts[i]) for i in order[:180]])
    assert eng.ready
    assert DLDA.predict_releases_gil and CLE.predict_releases_gil
    from streamsemi.algorithms.constrained_kmeans import ConstrainedKMeans

    threads: dict[str, set[str]] = {}
    rows_predicted: dict[str, int] = {}
    helper_started = threading.Event()
    for cls in (DLDA, CLE):
        original = cls.predict_proba

        def spy(self, X, _original=original, _name=cls.__name__):
            threads.setdefault(_name, set()).add(threading.current_thread().name)
            rows_predicted[_name] = rows_predicted.get(_name, 0) + X.shape[0]
            if threading.current_thread().name.startswith("predict"):
                helper_started.set()
            return _original(self, X)

        monkeypatch.setattr(cls, "predict_proba", spy)
    # the polling thread's own work (constrained k-means) lasts until the helper has taken a prediction:
    # without it, on a busy machine the helper may not get the GIL before this thread takes everything back
    ck_original = ConstrainedKMeans.predict_proba

    def slow_ck(self, X):
        helper_started.wait(DEADLINE)
        return ck_original(self, X)

    monkeypatch.setattr(ConstrainedKMeans, "predict_proba", slow_ck)
    X = eng.featurizer.transform([ds.texts[i] for i in order[180:]], update_sketch=False)
    parallel = eng._assign_all(eng.models, X)
    assert set(threads) == {"DLDA", "CLE"}
    assert any(name.startswith("predict") for names in threads.values() for name in names), "the helper thread"
    assert rows_predicted == {"DLDA": X.shape[0], "CLE": X.shape[0]}, "each row is predicted once"
    sequential = {a: Engine._assign_with(slot, X) for a, slot in eng.models.items()}
    assert parallel.keys() == sequential.keys()
    for a in parallel:  # the same verdicts; D-LDA's fastmath sums may differ in the last bits between threads
        for p_, s_ in zip(parallel[a], sequential[a], strict=True):
            assert (p_[0], p_[3], p_[4], p_[2].keys()) == (s_[0], s_[3], s_[4], s_[2].keys())
            assert p_[1] == pytest.approx(s_[1], abs=1e-12)
            assert all(abs(p_[2][k] - s_[2][k]) <= 1.01e-6 for k in p_[2])
    assert len(parallel["cle"]) == X.shape[0]


def test_explanations_are_scored_outside_the_sketch_lock_and_the_fallback_runs_only_when_needed(monkeypatch) -> None:
    import scipy.sparse as sp

    import streamsemi.engine as engine_mod
    from streamsemi.core.datasets import load
    from streamsemi.core.explain import distinctive_scores, explain_classes
    from streamsemi.core.messages import Document
    from streamsemi.engine import Engine, EngineConfig

    X = sp.csr_matrix(np.array([[1, 2, 0, 0], [1, 0, 3, 0], [0, 0, 1, 1], [1, 1, 0, 0]], dtype=float))
    labels = np.array([0, 0, 1, 0])
    calls = []

    def fallback():
        calls.append(1)
        return {"c": ["kept"]}

    plain = explain_classes(["a", "b", "c"], X, labels, top_n=2, fallback={"c": ["kept"]})
    assert explain_classes(["a", "b", "c"], X, labels, top_n=2, fallback=fallback,
                           scores=distinctive_scores(X, labels, 3)) == plain and plain["c"] == ["kept"]
    assert calls == [1]
    assert explain_classes(["a", "b"], X, labels, top_n=2, fallback=fallback) == \
        explain_classes(["a", "b"], X, labels, top_n=2) and calls == [1], "every class has words: not called"

    ds = load("reuters-r8")
    eng = Engine(EngineConfig(algorithms=["constrained-kmeans"], background_refit=False, n_features=2**12,
                              refit_every_docs=0, min_docs_first_refit=100, drift_detection=False, min_seed_classes=2,
                              min_seeds_per_class=1, first_fit_stable_seeds=0, refit_growth=0, refit_idle_s=0))
    locked = []

    def spy(*args):
        locked.append(eng.sketch_lock.locked())
        return distinctive_scores(*args)

    monkeypatch.setattr(engine_mod, "distinctive_scores", spy)
    for i in range(30):
        eng.label(f"r{i}", [ds.labels[i]], text=ds.texts[i])
    eng.process([Document(id=f"r{i}", text=ds.texts[i]) for i in range(150)])
    assert eng.ready and locked == [False]
    assert any(eng.models["constrained-kmeans"].explain.values())


def test_output_producer_short_send_lands_records_where_kafka_producer_would(broker) -> None:
    """The worker's producer hands its own records to the accumulator directly; with the
    installed kafka-python every plain record takes that way, lands at the default partitioner's
    partition with its key, value and headers, and anything else goes through KafkaProducer.send."""
    assert OutputProducer.LEAN, "the installed kafka-python's accumulator changed: the short send is off"
    t = Topics().create_assignments(broker.bootstrap, 5)
    p = make_producer(t.settings(broker.bootstrap))
    try:
        assert isinstance(p, OutputProducer) and p._lean
        rng = np.random.default_rng(3)
        keys = [b"doc-%d" % i for i in range(200)] + [bytes(rng.integers(0, 256, size=9, dtype=np.uint8)) for _ in range(20)]
        futures = [p.send(t.assignments, key=k, value=b"v" + k, headers=[("model_version", b"7"), ("revision", b"0")])
                   for k in keys]
        assert p.lean_sends == len(keys)
        p.send(t.assignments, key=b"tomb", value=None)  # a tombstone: KafkaProducer.send
        p.send(t.assignments, key=b"p0", value=b"explicit", partition=0)
        assert p.lean_sends == len(keys)
        with pytest.raises(MessageSizeTooLargeError):  # past max_request_size: KafkaProducer.send's own check
            p.send(t.assignments, key=b"big", value=b"x" * (p.config["max_request_size"] + 1))
        p.flush(timeout=DEADLINE)
        assert all(f.is_done and f.succeeded() for f in futures)
        # metadata updates replace a topic's partition map: the short send follows the new one
        p._metadata._partitions = {**p._metadata._partitions,
                                   t.assignments: {q: m for q, m in p._metadata._partitions[t.assignments].items() if q < 2}}
        later = [b"later-%d" % i for i in range(40)]
        for k in later:
            p.send(t.assignments, key=k, value=b"v" + k)
        p.flush(timeout=DEADLINE)
        assert p.lean_sends == len(keys) + len(later)
    finally:
        p.close(timeout=5)
    records = read_topic(broker.bootstrap, t.assignments, expect=len(keys) + 2 + len(later))
    got = {r.key: r for r in records}
    assert len(got) == len(keys) + 2 + len(later)
    assert all(got[k].partition == (murmur2(k) & 0x7fffffff) % 2 for k in later)
    for k in keys:
        r = got[k]
        assert r.value == b"v" + k and list(r.headers) == [("model_version", b"7"), ("revision", b"0")]
        assert r.partition == (murmur2(k) & 0x7fffffff) % 5  # kafka-python's DefaultPartitioner
    assert got[b"tomb"].value is None and got[b"p0"].partition == 0
    assert len({got[k].partition for k in keys}) == 5


def _label_dicts_as_before(P: np.ndarray, classes: list[str]) -> list[dict[str, float]]:
    """``Engine._assign_with``'s label dicts as the per-document reference builds them (round() per value)."""
    from streamsemi.engine import LABEL_PROB_MIN, LABELS_IN_OUTPUT

    top = P.argmax(axis=1)
    order = np.argsort(-P, axis=1)[:, :LABELS_IN_OUTPUT]
    vals = np.take_along_axis(P, order, axis=1)
    keep = (vals >= LABEL_PROB_MIN) | (order == top[:, None])
    return [{classes[j]: round(x, 6) for j, x, m in zip(js, xs, ms, strict=True) if m}
            for js, xs, ms in zip(order.tolist(), vals.tolist(), keep.tolist(), strict=True)]


@pytest.mark.parametrize("n_classes", [2, 7, 20, 60])
def test_label_dicts_are_the_ones_built_per_document(n_classes) -> None:
    """The vectorised label dicts (slices of the sorted labels) equal the per-document ones: same
    labels, same order, same rounded values; rows with tiny probabilities, ties and NaN included."""
    from streamsemi.engine import Engine, ModelSlot

    rng = np.random.default_rng(n_classes)
    P = np.vstack([rng.dirichlet(np.full(n_classes, a), size=200) for a in (0.05, 0.3, 3.0)])
    P[0] = 1.0 / n_classes  # every label tied
    P[1, :] = 0.0
    P[1, -1] = 1.0  # one label, the others 0 (below LABEL_PROB_MIN)
    P[2, :] = 1e-4
    P[2, 1] = np.nan  # the "most probable" label is NaN and sorted last: the kept labels are no prefix
    classes = [f"c{i}" for i in range(n_classes)]
    slot = ModelSlot(model=None, version=1, fitted_at=0.0, classes=np.array(classes), new_clusters=frozenset({"c1"}),
                     multilabel=False, explain={})
    got = Engine._assign_with(slot, None, P)
    want = _label_dicts_as_before(P, classes)
    assert len(got) == len(want)
    for (label, score, labels, cluster, new), expected, row in zip(got, want, P, strict=True):
        assert list(labels) == list(expected)
        assert [repr(v) for v in labels.values()] == [repr(v) for v in expected.values()]
        k = int(row.argmax())
        assert cluster == classes[k] and new == (classes[k] == "c1") and label == (None if new else classes[k])
        assert score == row[k] or (np.isnan(score) and np.isnan(row[k]))
    # the NaN row: its "most probable" label sorts last (kept only if it is among the first 10)
    assert list(got[2][2]) == (["c1"] if n_classes <= 10 else [])
    assert len(got[0][2]) == min(n_classes, 10)


@pytest.mark.parametrize("n_classes", [2, 7, 20])
def test_multilabel_label_dicts_are_the_ones_built_per_document(n_classes) -> None:
    """Multi-label verdicts (pseudo-LSC): each row's dict holds its chosen labels in class order with
    round(p, 6), the most probable label when none is chosen; the flat map() build equals a dict per row."""
    from streamsemi.engine import Engine, ModelSlot

    rng = np.random.default_rng(n_classes)
    P = rng.dirichlet(np.full(n_classes, 0.3), size=300)
    ind = P >= rng.uniform(0.05, 0.5, size=(300, 1))
    ind[:20] = False  # rows with no label chosen
    ind[20, :] = True  # every label chosen
    classes = [f"c{i}" for i in range(n_classes)]
    slot = ModelSlot(model=None, version=1, fitted_at=0.0, classes=np.array(classes), new_clusters=frozenset(),
                     multilabel=True, explain={})
    got = Engine._assign_with(slot, None, P, ind)
    for (label, score, labels, cluster, new), p, chosen in zip(got, P, ind, strict=True):
        k = int(p.argmax())
        js = np.flatnonzero(chosen).tolist() or [k]
        assert labels == {classes[j]: round(float(p[j]), 6) for j in js} and list(labels) == [classes[j] for j in js]
        assert (label, cluster, new, score) == (classes[k], classes[k], False, p[k])


@pytest.mark.parametrize("multilabel", [False, True])
def test_verdicts_built_for_some_rows_equal_those_rows_of_the_full_build(multilabel) -> None:
    """A revision chunk builds the full verdicts of the rows that changed only (``_Verdicts.build(positions)``):
    the same verdicts as building every row and picking those; clusters and new flags come for every row."""
    from streamsemi.engine import ModelSlot, _Verdicts

    rng = np.random.default_rng(3)
    P = rng.dirichlet(np.full(6, 0.4), size=120)
    ind = P >= 0.2 if multilabel else None
    classes = np.array(["a", "b", "c", "d", "new-0", "new-1"])
    slot = ModelSlot(model=None, version=1, fitted_at=0.0, classes=classes, new_clusters=frozenset({"new-0", "new-1"}),
                     multilabel=multilabel, explain={})
    full = _Verdicts(slot, None, P, ind).build()
    lazy = _Verdicts(slot, None, P, ind)
    assert lazy.clusters == [v[3] for v in full] and lazy.news == [v[4] for v in full]
    assert any(lazy.news) and not all(lazy.news)
    for positions in ([], [0], [119, 3, 50, 3], list(range(0, 120, 7))):
        assert lazy.build(np.asarray(positions, dtype=np.intp)) == [full[j] for j in positions]


def test_documents_consumer_asks_the_broker_to_hold_an_empty_fetch_for_fetch_max_wait_ms(broker) -> None:
    """The embedded broker answers a fetch at the log end only after ``fetch_max_wait_ms``, even when
    records arrive meanwhile (measured: docs/decisions.md): the documents consumer takes the setting
    (default 100 ms, not kafka-python's 500), which bounds a fresh document's wait there."""
    t = Topics()
    assert t.settings(broker.bootstrap).fetch_max_wait_ms == 100
    for wait in (50, 120):
        s = resolve({"bootstrap_servers": broker.bootstrap, "group_id": t.group, "fetch_max_wait_ms": str(wait)}, env={})
        consumer = make_document_consumer(s)
        try:
            assert consumer.config["fetch_max_wait_ms"] == wait
        finally:
            consumer.close()


@pytest.mark.parametrize("n", [0, 1, 63, 64, 65, 255, 256, 257, 1000])
def test_helper_chunks_cover_the_rows_in_order_in_few_chunks(n) -> None:
    """The helper thread's chunks of an ``n``-row prediction: consecutive, covering every row once, at most
    ``HELPER_CHUNKS`` of them, each of at least ``HELPER_CHUNK_MIN`` rows but the last."""
    import itertools

    from streamsemi.engine import HELPER_CHUNK_MIN, HELPER_CHUNKS, helper_chunks

    parts = helper_chunks(n)
    assert parts[0].start == 0 and parts[-1].stop == n
    assert all(a.stop == b.start for a, b in itertools.pairwise(parts))
    assert 1 <= len(parts) <= HELPER_CHUNKS
    assert all(p.stop - p.start >= HELPER_CHUNK_MIN for p in parts[:-1])
    if n >= HELPER_CHUNKS * HELPER_CHUNK_MIN:
        assert len(parts) == HELPER_CHUNKS


def test_the_polling_thread_takes_back_unstarted_chunks_and_the_verdicts_equal_one_prediction(monkeypatch) -> None:
    """While the helper thread is held in its first chunk, the polling thread predicts the other chunks
    itself (from the last) and waits for that one only; the verdicts equal one prediction of all rows."""
    import threading

    import scipy.sparse as sp

    from streamsemi.engine import Engine, ModelSlot, helper_chunks

    rng = np.random.default_rng(3)
    W = rng.random((6, 4))
    calls: list[tuple[str, int, int]] = []
    release, helper_in = threading.Event(), threading.Event()

    class Heavy:
        predict_releases_gil = True

        def predict_proba(self, X):
            name = threading.current_thread().name
            if name.startswith("predict"):
                helper_in.set()
                release.wait(DEADLINE)  # the helper stays in its first chunk until the polling thread is done
            else:
                helper_in.wait(DEADLINE)  # (the helper has taken its first chunk before this thread takes any back)
            calls.append((name, X.shape[0], int(X[0, 0]) if X.shape[0] else -1))
            P = np.exp(X @ W)
            return P / P.sum(axis=1, keepdims=True)

    n = 300
    X = sp.csr_matrix(np.hstack([np.arange(n)[:, None], rng.random((n, 5))]))
    slot = ModelSlot(Heavy(), 1, 0.0, np.array(["a", "b", "c", "d"]), frozenset(), False, {})
    eng = Engine.__new__(Engine)
    eng.config = type("C", (), {"algorithms": ["heavy"]})()
    timer = threading.Timer(0.5, release.set)
    timer.start()
    try:
        got = eng._assign_all({"heavy": slot}, X)["heavy"]
    finally:
        release.set()
        timer.cancel()
    parts = helper_chunks(n)
    helper = [c for c in calls if c[0].startswith("predict")]
    mine = [c for c in calls if not c[0].startswith("predict")]
    assert len(helper) == 1 and helper[0][1:] == (parts[0].stop, 0), "the helper predicted its first chunk only"
    assert [c[2] for c in mine] == [p.start for p in reversed(parts[1:])], "the rest here, from the last"
    assert sum(c[1] for c in calls) == n
    assert got == Engine._assign_with(slot, X)
