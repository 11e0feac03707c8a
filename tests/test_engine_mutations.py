"""The engine's refit triggers, refit rounds, revisions, document processing and labels, at their edges.

Written against the survivors of the mutation run on ``streamsemi/engine.py``
(benchmarks/results/mutation.md), and kept fast enough to run for every mutant: the fitted
algorithms are replaced by a nearest-centroid estimator (``build_estimator`` patched), so a
refit takes milliseconds, and a test can make an algorithm fail, block or count its fits.
The centroid model is exact on the three synthetic topics, so every verdict is known.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
from kafka import TopicPartition
from kafka_utils import DEADLINE, wait_for
from sklearn.preprocessing import normalize

import streamsemi.engine as engine_mod
from streamsemi.core.messages import Document, Rejected
from streamsemi.engine import Engine, EngineConfig
from streamsemi.service.worker import Worker

TOPICS = {
    "food": "recipe flour butter oven bake sugar dough pastry kitchen cream",
    "space": "orbit rocket launch nasa shuttle satellite astronaut moon planet telescope",
    "sport": "football goal match league player coach stadium referee season striker",
}
NAMES = sorted(TOPICS)
CK, SK = "constrained-kmeans", "seeded-kmeans"


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class Lab:
    """Builds the fake estimators and controls them: failures, a gate that blocks fits, a record of fits."""

    def __init__(self) -> None:
        self.fail: set[str] = set()
        self.fail_predict = False
        self.gate: threading.Event | None = None
        self.fits: list[tuple[str, int, int]] = []   # (algorithm, rows, seeds)
        self.on_fit = None
        self.wrong: set[str] = set()                 # algorithms whose verdicts are always a wrong class
        self.probe_gate: threading.Event | None = None  # blocks fits with fewer than all_seeds seeds (probes)
        self.all_seeds = 0
        self.new_clusters: dict[str, list[str]] = {}   # reported as discovered clusters (not predicted)
        self.pc = 0.0                                  # a perf_counter that only predictions advance
        self.pc_per_doc = 0.0

    def build(self, name, params=None, n_new_clusters=0, random_state=None):
        return Centroid(self, name)


class Centroid:
    """Nearest seed centroid (cosine); probabilities proportional to the similarity plus a small floor."""

    supports_warm_start = False

    def __init__(self, lab: Lab, name: str) -> None:
        self.lab, self.name = lab, name

    def fit(self, X, y):
        lab = self.lab
        lab.fits.append((self.name, X.shape[0], sum(1 for c in y if c is not None)))
        if lab.on_fit is not None:
            lab.on_fit(self.name)
        if lab.gate is not None:
            assert lab.gate.wait(DEADLINE)
        if lab.probe_gate is not None and sum(1 for c in y if c is not None) < lab.all_seeds:
            assert lab.probe_gate.wait(DEADLINE)
        if self.name in lab.fail:
            raise ValueError(f"{self.name} cannot fit")
        self.classes_ = np.array(sorted({c for c in y if c is not None}), dtype=object)
        Xn = normalize(X)
        rows = [[i for i, c in enumerate(y) if c == k] for k in self.classes_]
        self.C = normalize(np.vstack([np.asarray(Xn[r].mean(axis=0)).ravel() for r in rows]))
        self.new_clusters_ = list(lab.new_clusters.get(self.name, []))
        return self

    def explain(self, sketch, n_words):
        return {c: [f"{c}-word"] for c in self.classes_}

    def predict_proba(self, X):
        if self.lab.fail_predict:
            raise RuntimeError("predict failed")
        self.lab.pc += self.lab.pc_per_doc * X.shape[0]
        S = np.asarray(normalize(X) @ self.C.T) + 1e-3
        if self.name in self.lab.wrong:
            S = np.roll(S, 1, axis=1)
        return S / S.sum(axis=1, keepdims=True)


@pytest.fixture
def lab(monkeypatch) -> Lab:
    lab = Lab()
    monkeypatch.setattr(engine_mod, "build_estimator", lab.build)
    return lab


def text(topic: str, i: int) -> str:
    words = TOPICS[topic].split()
    return " ".join(words[(i + j) % len(words)] for j in range(6))


def docs(n: int, start: int = 0, ts: float | None = 0.0) -> list[Document]:
    """Documents ``d<start>`` ... cycling through the topics (``d<i>`` is of topic ``NAMES[i % 3]``)."""
    return [Document(id=f"d{i}", text=text(NAMES[i % 3], i), ts=ts, arrival=0.0) for i in range(start, start + n)]


def topic_of(doc_id: str) -> str:
    return NAMES[int(doc_id[1:]) % 3]


def make(clock: Clock | None = None, **kw) -> Engine:
    base = dict(algorithms=[CK, SK], primary=CK, background_refit=False, n_features=2**10, drift_detection=False,
                refit_every_docs=0, refit_growth=0, refit_idle_s=0, first_fit_max_wait_s=0, min_docs_first_refit=6,
                min_seed_classes=3, min_seeds_per_class=1, first_fit_stable_seeds=0, explain_words=0,
                revision_chunk=4)
    base.update(kw)
    return Engine(EngineConfig(**base), clock=clock or Clock())


def seed_topics(eng: Engine, per_topic: int = 1, names=NAMES) -> None:
    for k, name in enumerate(names):
        for j in range(per_topic):
            eng.label(f"s{name}{j}", [name], text=text(name, 100 + k + j))


def sample(metric, **labels) -> float:
    for fam in metric.collect():
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue
            if all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


def observed(hist, **labels) -> tuple[float, float]:
    """(count, sum) of a histogram's observations."""
    values = {}
    for fam in hist.collect():
        for s in fam.samples:
            if all(s.labels.get(k) == v for k, v in labels.items()):
                values[s.name.rsplit("_", 1)[-1]] = s.value
    return values["count"], values["sum"]


def triggers(eng: Engine) -> dict[str, float]:
    out = {}
    for fam in eng.telemetry.refit_triggers.collect():
        for s in fam.samples:
            if s.name.endswith("_total"):
                out[s.labels["trigger"]] = s.value
    return out


def events(caplog, name: str, level: int | None = None) -> list[dict]:
    """Fields of the ``name`` events (all of them at ``level`` when given)."""
    found = [r for r in caplog.records if r.getMessage() == name]
    assert level is None or all(r.levelno == level for r in found), [r.levelname for r in found]
    return [r.fields for r in found]


def duration(seconds, within: float) -> bool:
    """A logged duration: float seconds rounded to milliseconds, at most ``within`` (the wall time the test
    measured around the call that logged it: milliseconds logged as seconds would exceed it, a slow machine not)."""
    return isinstance(seconds, float) and 0.0 <= seconds <= within + 0.001 and seconds == round(seconds, 3)


# ---------------------------------------------------------------------------------------------- tick: first fit
def test_first_fit_at_exactly_min_docs_with_the_seed_policy(lab) -> None:
    eng = make(min_docs_first_refit=6)
    seed_topics(eng)
    eng.process(docs(5))
    assert not eng.models and lab.fits == []
    res = eng.process(docs(1, 5))
    assert eng.ready and eng.refit_count == 1 and triggers(eng) == {"docs": 1}
    assert len(res.assignments) == 2 * 6, "the buffered documents and the new one, by both algorithms"
    assert {a.label for a in res.assignments if a.id == "d5"} == {topic_of("d5")}
    assert not eng.models[CK].provisional


def test_first_fit_waits_for_the_policy_then_the_buffer_or_idle_or_max_wait(lab) -> None:
    # one class short of the policy: only a full buffer, an idle stream or the longest wait start the first fit
    clock = Clock()
    eng = make(clock, max_buffered_docs=8, min_docs_first_refit=6)
    seed_topics(eng, names=NAMES[:2])
    eng.process(docs(7))
    assert not eng.models
    eng.process(docs(1, 7))
    assert triggers(eng) == {"buffer_full": 1} and eng.models[CK].provisional
    assert sample(eng.telemetry.refits_skipped, reason="not_enough_seeds") == 0

    idle = make(clock, refit_idle_s=3.0, min_docs_first_refit=6)
    seed_topics(idle, names=NAMES[:2])
    clock.t = 2000.0
    idle.process(docs(5))
    clock.t = 2003.0
    idle.tick()
    assert not idle.models, "idle, but fewer than min_docs_first_refit documents"
    idle.process(docs(1, 5))   # at 2003: idle counts from here
    clock.t = 2005.999
    idle.tick()
    assert not idle.models
    clock.t = 2006.0
    idle.tick()
    assert triggers(idle) == {"idle": 1} and idle.models[CK].provisional

    wait = make(clock, first_fit_max_wait_s=30.0, min_docs_first_refit=6)
    seed_topics(wait, names=NAMES[:2])
    clock.t = 3000.0
    wait.process(docs(2))
    clock.t = 3020.0
    wait.process(docs(3, 2))
    clock.t = 3030.0
    wait.tick()
    assert not wait.models, "30 s after the first document, but 5 documents"
    wait.process(docs(1, 5))
    assert triggers(wait) == {"max_wait": 1}, "measured from the first document, not the latest"

    early = make(clock, first_fit_max_wait_s=30.0, min_docs_first_refit=6)
    seed_topics(early, names=NAMES[:2])
    clock.t = 4000.0
    early.process(docs(6))
    clock.t = 4029.999
    early.tick()
    assert not early.models
    clock.t = 4030.0
    early.tick()
    assert triggers(early) == {"max_wait": 1}


def test_first_fit_waits_for_the_seeded_classes_to_stop_growing(lab) -> None:
    eng = make(first_fit_stable_seeds=2)
    seed_topics(eng)
    eng.process(docs(6))
    assert not eng.models
    eng.label("x1", ["food"], text=text("food", 1))
    eng.process([])
    assert not eng.models, "one seed without a new class"
    eng.label("x2", ["space"], text=text("space", 2))
    eng.process([])
    assert eng.ready and triggers(eng) == {"docs": 1}


def test_first_fit_triggers_skipped_for_one_seeded_class_are_not_counted(lab) -> None:
    clock = Clock()
    cases = {"docs": dict(min_seed_classes=1), "idle": dict(refit_idle_s=3.0),
             "max_wait": dict(first_fit_max_wait_s=30.0)}
    for trigger, kw in cases.items():
        eng = make(clock, **kw)
        eng.label("s", ["food"], text=text("food", 1))
        clock.t = 5000.0
        eng.process(docs(6))
        clock.t = 5030.0
        eng.tick()
        assert not eng.models and eng.last_refit_start == 5030.0, trigger  # the trigger fired (and was skipped)
        assert sample(eng.telemetry.refits_skipped, reason="not_enough_seeds") == 0, trigger


def test_the_first_fit_waits_for_documents_still_on_the_broker(lab) -> None:
    clock = Clock()
    eng = make(clock, first_fit_max_wait_s=30.0, max_buffered_docs=10)
    seed_topics(eng)
    eng.backlog = 1
    eng.process(docs(6))
    clock.t = 1029.999
    eng.tick()
    assert not eng.models, "one more document waits on the broker"
    clock.t = 1030.0
    eng.tick()
    assert triggers(eng) == {"docs": 1}, "not longer than first_fit_max_wait_s after the first document"
    full = make(clock, first_fit_max_wait_s=30.0, max_buffered_docs=6)
    seed_topics(full)
    full.backlog = 50
    full.process(docs(6))
    assert triggers(full) == {"docs": 1}, "not with a full buffer"
    off = make(clock, first_fit_max_wait_s=0, max_buffered_docs=100)
    seed_topics(off)
    off.backlog = 5
    off.process(docs(6))
    clock.t += 10_000
    off.tick()
    assert not off.models, "first_fit_max_wait_s = 0: waits for the backlog"
    early = make(clock, min_docs_first_refit=0, first_fit_max_wait_s=1.0)
    seed_topics(early)
    early.backlog = 5
    early.tick()
    assert not early.models, "no document yet: nothing waited"
    early.backlog = 0
    early.tick()
    assert early.ready


# ---------------------------------------------------------------------------------------------- tick: later refits
def test_growth_trigger_at_exactly_refit_growth_times_the_last_fit_window(lab) -> None:
    eng = make(refit_growth=2.0, window_max_docs=100)
    seed_topics(eng)
    eng.process(docs(6))
    assert eng.refit_count == 1 and triggers(eng) == {"docs": 1}
    eng.process(docs(5, 6))
    assert eng.refit_count == 1, "11 < 2 x 6"
    eng.process(docs(1, 11))
    assert eng.refit_count == 2 and triggers(eng)["growth"] == 1 and lab.fits[-1][1] == 12 + 3
    eng.process(docs(11, 12))
    assert eng.refit_count == 2
    eng.process(docs(1, 23))
    assert eng.refit_count == 3


def test_growth_trigger_not_on_a_full_window(lab) -> None:
    eng = make(refit_growth=2.0, window_max_docs=12)
    seed_topics(eng)
    eng.process(docs(6))
    eng.process(docs(6, 6))
    assert len(eng.window) == 12 and eng.refit_count == 1, "a full window does not grow"


def test_idle_refit_after_documents_or_a_seed_change_and_the_minimum_interval(lab) -> None:
    clock = Clock()
    eng = make(clock, refit_idle_s=3.0, min_refit_interval_s=5.0)
    seed_topics(eng)
    eng.process(docs(6))
    assert eng.refit_count == 1 and eng.last_refit_start == 1000.0
    clock.t = 1001.0
    eng.process(docs(2, 6))
    clock.t = 1003.999
    eng.tick()
    assert eng.refit_count == 1, "not idle yet"
    clock.t = 1004.0
    eng.tick()
    assert eng.refit_count == 1, "idle, but 4 s < min_refit_interval_s since the last refit"
    clock.t = 1005.0
    eng.tick()
    assert eng.refit_count == 2 and triggers(eng)["idle"] == 1
    clock.t = 1100.0
    eng.tick()
    assert eng.refit_count == 2, "nothing new since"
    eng.label("d0", ["space"])           # a relabel changes the seeds
    clock.t = 1200.0
    eng.tick()
    assert eng.refit_count == 3
    clock.t = 1300.0
    assert eng.unlabel("nothing-here") is False
    eng.tick()
    assert eng.refit_count == 3, "an unlabel that removed nothing changes nothing"
    assert eng.unlabel("d0") is True
    clock.t = 1400.0
    eng.tick()
    assert eng.refit_count == 4 and triggers(eng)["idle"] == 3


def test_a_count_refit_resets_the_count_and_the_seed_change(lab) -> None:
    clock = Clock()
    eng = make(clock, refit_every_docs=3, refit_idle_s=3.0, min_refit_interval_s=0.0)
    seed_topics(eng)
    eng.process(docs(6))
    eng.label("d1", ["food"])
    eng.process(docs(3, 6))
    assert eng.refit_count == 2 and triggers(eng) == {"docs": 2} and eng.docs_since_refit == 0
    clock.t = 1010.0
    eng.tick()
    assert eng.refit_count == 2, "the count refit took the relabel with it"


def test_growth_after_a_fit_on_a_single_document(lab) -> None:
    eng = make(refit_growth=2.0, min_docs_first_refit=1)
    seed_topics(eng)
    eng.process(docs(1))
    assert eng.refit_count == 1
    eng.process(docs(1, 1))
    assert eng.refit_count == 2 and triggers(eng) == {"docs": 1, "growth": 1}, "2 >= 2 x 1 document"


def test_no_probes_when_the_window_doubled_during_a_round_on_one_document(lab) -> None:
    lab.gate = threading.Event()
    eng = make(primary=None, background_refit=True, refit_growth=2.0, min_docs_first_refit=1, max_buffered_docs=100)
    seed_topics(eng, per_topic=2)
    try:
        eng.process(docs(1))
        eng.process(docs(1, 1))                                   # 2 >= 2 x 1 during the round
    finally:
        lab.gate.set()
    assert eng.wait_for_refit(DEADLINE) and eng.version == 1 and probe_fits(lab, 6) == []


def test_time_refits_are_counted_as_time_and_quiet_idle_skips_are_not(lab) -> None:
    clock = Clock()
    eng = make(clock, refit_every_s=60.0)
    seed_topics(eng)
    eng.process(docs(6))
    clock.t = 1060.0
    eng.tick()
    assert triggers(eng) == {"docs": 1, "time": 1}
    idle = make(clock, refit_idle_s=3.0, min_refit_interval_s=0.0, min_seed_classes=2)
    seed_topics(idle, names=NAMES[:2])
    idle.process(docs(6))
    assert idle.ready and idle.refit_count == 1
    idle.unlabel(f"s{NAMES[1]}0")                                  # one seeded class left
    clock.t += 10.0
    idle.tick()
    assert idle.refit_count == 1 and idle.last_refit_start == clock.t, "the idle trigger fired and was skipped"
    assert sample(idle.telemetry.refits_skipped, reason="not_enough_seeds") == 0


def test_tick_expires_held_labels_with_their_reason(lab) -> None:
    clock = Clock()
    eng = make(clock, pending_label_ttl_s=60.0)
    eng.label("ghost", ["food", "space"], offset=3)
    assert sample(eng.telemetry.pending) == 1
    clock.t = 1059.999
    eng.tick()
    assert eng.drain_dead() == [] and "ghost" in eng.pending
    clock.t = 1060.0
    eng.tick()
    assert eng.drain_dead() == [({"op": "label", "id": "ghost", "labels": ["food", "space"]},
                                 Rejected("label_expired", "document 'ghost' did not arrive within "
                                                           "pending_label_ttl_s=60.0"))]
    assert sample(eng.telemetry.pending) == 0


def test_window_gauges_and_age_expiry_forget_what_was_served(lab) -> None:
    clock = Clock()
    eng = make(clock, window_max_age_s=100.0, revisions="all")
    eng.tick()
    assert sample(eng.telemetry.window) == 0 and sample(eng.telemetry.window_age) == 0
    seed_topics(eng)
    eng.process(docs(6, ts=950.0))
    eng.process(docs(2, 6, ts=990.0))
    assert sample(eng.telemetry.window) == 8
    assert sample(eng.telemetry.window_age) == 0, "the age gauge scans the window at most once a second"
    clock.t += 1.0
    eng.tick()
    assert sample(eng.telemetry.window_age) == 51.0
    clock.t = 1050.5
    eng.tick()                                   # d0..d5 are older than 100 s
    assert sorted(eng.window.ids()) == ["d6", "d7"] and sample(eng.telemetry.window_age) == pytest.approx(60.5)
    eng.request_refit()
    revised = [a for chunk in drain(eng) for a in chunk]
    assert sorted({a.id for a in revised}) == ["d6", "d7"], "documents that left the window are not revised"
    future = make(clock)
    future.process(docs(1, ts=5000.0))
    assert sample(future.telemetry.window_age) == 0, "a document from the future has no negative age"


# ---------------------------------------------------------------------------------------------- process
def test_process_windows_good_documents_with_event_time_or_arrival(lab) -> None:
    clock = Clock(500.0)
    eng = make(clock, refit_every_docs=3)
    seed_topics(eng)
    batch = [Document(id="a", text=text("food", 0), ts=12.0, arrival=99.0),
             Document(id="b", text="the of and !!!", ts=1.0),
             Document(id="c", text=text("space", 1), ts=None, arrival=77.0)]
    res = eng.process(batch)
    assert [(d.id, r) for d, r in res.rejected] == [
        ("b", Rejected("no_terms", "the text has no indexable terms (only stop words, digits or punctuation)"))]
    assert eng.window.get("a").ts == 12.0 and eng.window.get("c").ts == 77.0 and "b" not in eng.window
    assert eng.docs_since_refit == 2 and eng.refit_count == 0, "rejected documents are not counted"
    assert eng.window.get("a").text == text("food", 0)


def test_a_held_label_becomes_a_seed_when_its_document_arrives(lab) -> None:
    eng = make()
    eng.label("d4", ["sport"], offset=11)
    assert sample(eng.telemetry.pending) == 1 and "d4" not in eng.seeds
    eng.process(docs(6))
    assert eng.seeds.get("d4").labels == ("sport",) and "d4" not in eng.pending
    assert sample(eng.telemetry.pending) == 0
    (r,) = eng.drain_resolved()
    assert (r.id, r.labels, r.text, r.label_offset) == ("d4", ("sport",), text(topic_of("d4"), 4), 11)


def test_documents_wait_while_the_first_model_is_fitted_then_follow_the_buffer(lab) -> None:
    lab.gate = threading.Event()
    eng = make(background_refit=True, max_buffered_docs=100)
    seed_topics(eng)
    try:
        assert eng.process(docs(6)).assignments == [] and eng.refitting
        assert eng.process(docs(2, 6)).assignments == [] and len(eng.buffer) == 8
    finally:
        lab.gate.set()
    assert eng.wait_for_refit(DEADLINE)
    out = eng.process(docs(1, 8)).assignments
    assert [a.id for a in out if a.algorithm == CK] == [f"d{i}" for i in range(9)], "buffer first, in order"
    assert len(eng.buffer) == 0


def test_a_backlog_is_assigned_in_chunks_of_flush_chunk_per_call(lab, monkeypatch) -> None:
    monkeypatch.setattr(engine_mod, "FLUSH_CHUNK", 4)
    eng = make(min_docs_first_refit=10)
    seed_topics(eng)
    assert eng.process(docs(9)).assignments == []
    got = [[a.id for a in eng.process(batch).assignments if a.algorithm == CK] for batch in (docs(1, 9), [], [], [])]
    assert got == [["d0", "d1", "d2", "d3"], ["d4", "d5", "d6", "d7"], ["d8", "d9"], []]
    assert len(eng.buffer) == 0 and sample(eng.telemetry.buffered) == 0


def test_a_failing_revision_pass_is_abandoned_and_fresh_documents_go_on(lab, caplog) -> None:
    caplog.set_level(logging.INFO, logger="streamsemi.engine")
    eng = make(revisions="all")
    seed_topics(eng)
    eng.process(docs(9))
    eng.request_refit()
    assert eng.revisions_pending == 0
    eng.process([])      # the pass starts: first chunk of 4
    assert eng.revisions_pending == 5
    for slot in eng.models.values():
        slot.scores = None  # a model without its snapshot's scores (adopted, restored) predicts in the pass
    lab.fail_predict = True
    res = eng.process([])
    assert res.revisions == [] and eng.revisions_pending == 0 and sample(eng.telemetry.revisions_pending) == 0
    (ev,) = events(caplog, "revision_failed", logging.WARNING)
    assert ev == {"error": "RuntimeError: predict failed",
                  "action": "pass abandoned; the next model swap starts a new one", "left": 1}
    lab.fail_predict = False
    assert len(eng.process(docs(1, 9)).assignments) == 2 and eng.process([]).revisions == []


# ---------------------------------------------------------------------------------------------- label
def test_a_resolved_label_never_undoes_a_newer_unlabel(lab) -> None:
    eng = make()
    eng.unlabel("x", offset=9)
    eng.label("x", ["food"], text=text("food", 1), origin="resolved", label_offset=5)
    assert "x" not in eng.seeds, "unlabel at 9 is newer than the label at 5"
    eng.unlabel("y", offset=4)
    eng.label("y", ["food"], text=text("food", 1), origin="resolved", label_offset=5)
    assert eng.seeds.get("y").labels == ("food",), "the label at 5 is newer than the unlabel at 4"
    eng.label("z", ["food"], offset=9)
    eng.label("z", ["space"], text=text("space", 1), origin="resolved", label_offset=5)
    assert eng.seeds.get("z").labels == ("food",) and "z" not in eng.pending, "the held label's labels win"
    ops = {k: (off, op) for k, off, op in eng.export_state().last_ops}
    assert ops == {"x": (9, "unlabel"), "y": (4, "unlabel"), "z": (9, "label")}, "resolved labels are not ops"
    eng.label("w", ["food"], text=text("food", 1), origin="resolved", offset=30, label_offset=None)
    assert eng.seeds.get("w").labels == ("food",) and "w" not in {k for k, _, _ in eng.export_state().last_ops}
    assert sample(eng.telemetry.control, op="label") == 5
    eng.label("v", ["food"], text=text("food", 1), origin="resolved", label_offset=None)
    assert eng.seeds.get("v").labels == ("food",), "no offset to compare: the label applies"
    eng.unlabel("u", offset=40)
    eng.label("u", ["food"], text=text("food", 1), origin="resolved", label_offset=None)
    assert eng.seeds.get("u").labels == ("food",)


def test_a_resolved_label_does_not_replace_a_seed_and_takes_the_held_labels(lab) -> None:
    eng = make()
    eng.label("s", ["food"], text=text("food", 1))
    eng.label("s", ["space"], text=text("space", 1), origin="resolved", label_offset=1)
    assert eng.seeds.get("s").labels == ("food",)
    eng.label("h", ["sport"], offset=2)                      # held: its document has not arrived
    eng.label("h", ["space"], text=text("space", 3), origin="resolved", label_offset=1)
    assert eng.seeds.get("h").labels == ("sport",) and "h" not in eng.pending
    assert sample(eng.telemetry.pending) == 1, "the gauge is refreshed by later operations"


def test_labels_with_text_for_held_or_seeded_documents(lab) -> None:
    clock = Clock()
    eng = make(clock, refit_idle_s=1.0, min_refit_interval_s=0.0)
    eng.label("h", ["sport"])
    assert eng.label("h", ["food"], text=text("food", 2)) == []
    assert eng.seeds.get("h").labels == ("food",) and "h" not in eng.pending
    seed_topics(eng)
    eng.process(docs(6))
    assert eng.refit_count == 1
    assert eng.label("sfood0", ["space", "food"]) == []
    assert eng.seeds.get("sfood0").labels == ("space", "food") and eng.drain_resolved() == []
    assert sample(eng.telemetry.seeds, **{"class": "space"}) == 2 and sample(eng.telemetry.seeds, **{"class": "food"}) == 2
    clock.t = 1010.0
    eng.tick()
    assert eng.refit_count == 2, "a relabelled seed changes the seeds (idle refit)"


def test_held_labels_over_the_bound_are_dead_lettered_with_the_reason(lab) -> None:
    eng = make(max_pending_labels=2)
    assert eng.label("p1", ["food"], offset=1) == []
    assert eng.label("p2", ["space"], offset=2) == []
    out = eng.label("p3", ["sport"], offset=3)
    assert out == [({"op": "label", "id": "p1", "labels": ["food"]},
                    Rejected("pending_overflow", "more than max_pending_labels=2 labels "
                                                 f"(or {eng.pending.max_bytes} accounted bytes) wait for their documents"))]
    assert sample(eng.telemetry.pending) == 2 and sorted(k for k, _ in eng.pending.items()) == ["p2", "p3"]


# ---------------------------------------------------------------------------------------------- _start_refit
def test_a_refit_without_two_seeded_classes_is_skipped_and_restarts_the_count(lab) -> None:
    clock = Clock()
    eng = make(clock, refit_every_docs=4, max_buffered_docs=3)
    eng.label("a", ["food"], text=text("food", 1))
    clock.t = 1007.0
    eng.process(docs(3))                       # buffer full: a quiet first-fit trigger
    assert not eng.models and sample(eng.telemetry.refits_skipped, reason="not_enough_seeds") == 0
    assert eng.docs_since_refit == 0 and eng.last_refit_start == 1007.0
    eng.request_refit()
    assert sample(eng.telemetry.refits_skipped, reason="not_enough_seeds") == 1 and triggers(eng) == {}
    assert eng.version == 0 and lab.fits == []


def test_a_refit_while_one_runs_is_queued_once_and_further_ones_counted(lab) -> None:
    lab.gate = threading.Event()
    eng = make(background_refit=True)
    seed_topics(eng)
    eng.process(docs(6))
    try:
        assert eng.refitting and sample(eng.telemetry.refit_in_progress) == 1
        assert eng._refit_thread.name == "refit-1" and eng._refit_thread.daemon, "never holds the process at exit"
        assert eng.version == 1 and eng.docs_since_refit == 0
        eng.request_refit()
        eng.request_refit("drift")
        assert sample(eng.telemetry.refits_skipped, reason="busy") == 1, "one queued, the next one counted"
        eng._start_refit("idle", quiet=True)
        assert sample(eng.telemetry.refits_skipped, reason="busy") == 1, "a quiet trigger is not counted"
        assert triggers(eng) == {"docs": 1} and eng.version == 1
    finally:
        lab.gate.set()
    assert eng.wait_for_refit(DEADLINE) and sample(eng.telemetry.refit_in_progress) == 0
    eng.tick()                                  # the queued trigger starts now
    assert eng.wait_for_refit(DEADLINE)
    assert triggers(eng) == {"docs": 1, "request": 1} and eng.version == 2 and eng.refit_count == 2
    eng.tick()
    assert eng.wait_for_refit(DEADLINE) and eng.refit_count == 2, "queued once"


def test_a_refit_snapshot_holds_the_window_and_seeds_outside_it(lab) -> None:
    eng = make(window_max_docs=6)
    seed_topics(eng, per_topic=2)
    eng.label("d0", ["food"])
    eng.process(docs(6))
    assert lab.fits[-2:] == [(CK, 6 + 6, 7), (SK, 12, 7)]
    eng.process(docs(3, 6))                 # d0..d2 leave the window; the seed d0 stays in the snapshot
    eng.request_refit()
    assert lab.fits[-1] == (SK, 6 + 6 + 1, 7) and eng.version == 2


# ---------------------------------------------------------------------------------------------- _refit_round
def test_refit_round_publishes_telemetry_and_events(lab, caplog) -> None:
    caplog.set_level(logging.INFO, logger="streamsemi.engine")
    clock = Clock(1234.0)
    eng = make(clock)
    seed_topics(eng)
    t0 = time.perf_counter()
    eng.process(docs(6))
    spent = time.perf_counter() - t0
    for alg in (CK, SK):
        assert sample(eng.telemetry.refits, algorithm=alg, outcome="success") == 1
        assert sample(eng.telemetry.refits, algorithm=alg, outcome="failure") == 0
        assert sample(eng.telemetry.model_version, algorithm=alg) == 1
        assert sample(eng.telemetry.last_refit, algorithm=alg) == 1234.0
        assert sample(eng.telemetry.new_clusters, algorithm=alg) == 0
        count, total = observed(eng.telemetry.refit_duration, algorithm=alg)
        assert count == 1 and 0 <= total <= spent
    done = events(caplog, "refit_done", logging.INFO)
    assert [(e["algorithm"], e["version"], e["documents"], e["seeds"], e["trigger"], e["new_clusters"]) for e in done] \
        == [(CK, 1, 9, 3, "docs", 0), (SK, 1, 9, 3, "docs", 0)]
    assert all(duration(e["seconds"], spent) for e in done)
    (rd,) = events(caplog, "refit_round_done", logging.INFO)
    assert rd["version"] == 1 and rd["failed"] == [] and duration(rd["seconds"], spent)
    assert eng.refit_count == 1
    eng._rank_suggestions = lambda snap: 0.25041                  # label suggestions, ranked after the fits
    t0 = time.perf_counter()
    eng.request_refit()
    spent = time.perf_counter() - t0
    rd = events(caplog, "refit_round_done")[-1]
    assert rd["suggestions_seconds"] == 0.25 and 0.25 <= rd["seconds"] <= 0.25 + spent + 0.001, \
        "the round's time includes them"
    assert isinstance(rd["seconds"], float) and rd["seconds"] == round(rd["seconds"], 3)


def test_a_failed_algorithm_keeps_its_model_or_gets_the_fallback(lab, caplog) -> None:
    caplog.set_level(logging.INFO, logger="streamsemi.engine")
    lab.fail = {SK}
    eng = make()
    seed_topics(eng)
    t0 = time.perf_counter()
    out = eng.process(docs(6)).assignments
    spent = time.perf_counter() - t0
    slot = eng.models[SK]
    assert slot.fallback and slot.version == 1 and slot.model is eng.models[CK].model and not eng.models[CK].fallback
    assert all(a.fallback for a in out if a.algorithm == SK) and len(out) == 12
    assert eng.last_refit_error == {SK: "ValueError: seeded-kmeans cannot fit"}
    assert sample(eng.telemetry.refits, algorithm=SK, outcome="failure") == 1
    assert sample(eng.telemetry.refits, algorithm=SK, outcome="success") == 0
    assert sample(eng.telemetry.model_version, algorithm=SK) == 0
    (failed,) = events(caplog, "refit_failed", logging.WARNING)
    assert failed["algorithm"] == SK and failed["version"] == 1 and failed["error"] == "ValueError: seeded-kmeans cannot fit"
    assert duration(failed["seconds"], spent)
    assert events(caplog, "fallback_in_use", logging.WARNING) == [{"algorithm": SK, "version": 1}]
    assert events(caplog, "refit_round_done")[0]["failed"] == [SK]
    lab.fail = set()
    eng.request_refit()
    assert not eng.models[SK].fallback and eng.models[SK].version == 2 and eng.last_refit_error == {}
    lab.fail = {SK}
    eng.request_refit()
    assert eng.models[SK].version == 2 and not eng.models[SK].fallback, "a failed refit keeps the model in use"
    assert eng.models[CK].version == 3 and eng.refit_count == 3
    assert len(events(caplog, "fallback_in_use")) == 1


def test_a_failed_fit_logs_its_duration_in_milliseconds(lab, caplog, monkeypatch) -> None:
    caplog.set_level(logging.INFO, logger="streamsemi.engine")
    ticks = iter(np.arange(10_000) * 0.01234)
    monkeypatch.setattr(engine_mod, "time", SimpleNamespace(perf_counter=lambda: float(next(ticks)), time=time.time))
    lab.fail = {SK}
    eng = make(algorithms=[SK, CK], primary=CK)
    seed_topics(eng)
    eng.process(docs(6))
    (failed,) = events(caplog, "refit_failed")
    assert failed["seconds"] == 0.012, "one clock step of 0.01234 s, rounded to milliseconds"
    (done,) = events(caplog, "refit_done")
    assert done["seconds"] == 0.012


def test_the_fallback_is_fitted_when_it_is_not_enabled_or_nothing_serves(lab, caplog) -> None:
    caplog.set_level(logging.INFO, logger="streamsemi.engine")
    lab.fail = {SK}
    eng = make(algorithms=[SK], primary=SK)
    seed_topics(eng)
    out = eng.process(docs(6)).assignments
    assert eng.models[SK].fallback and [f[0] for f in lab.fits] == [SK, CK] and len(out) == 6
    assert {a.label for a in out if a.id == "d2"} == {topic_of("d2")}
    lab.fail = {SK, CK}
    none = make(algorithms=[SK], primary=SK)
    seed_topics(none)
    assert none.process(docs(6)).assignments == [] and not none.models and none.refit_count == 1
    assert events(caplog, "fallback_failed", logging.ERROR) == [{"error": "constrained-kmeans cannot fit"}]
    assert len(none.buffer) == 6


def test_a_failure_of_the_first_algorithm_does_not_stop_the_others(lab, caplog) -> None:
    caplog.set_level(logging.INFO, logger="streamsemi.engine")
    lab.fail = {SK}
    lab.new_clusters = {CK: ["new-0", "new-1"]}
    eng = make(algorithms=[SK, CK], primary=SK)  # the primary is fitted first in every round
    seed_topics(eng)
    out = eng.process(docs(6)).assignments
    assert [f[0] for f in lab.fits] == [SK, CK] and not eng.models[CK].fallback and eng.models[SK].fallback
    assert eng.models[SK].model is eng.models[CK].model and len(out) == 12
    assert sample(eng.telemetry.new_clusters, algorithm=CK) == 2 and sample(eng.telemetry.new_clusters, algorithm=SK) == 0
    assert [e["new_clusters"] for e in events(caplog, "refit_done")] == [2]


def test_first_round_models_are_published_together_later_ones_as_fitted(lab) -> None:
    eng = make(revisions="off")
    seen: list[tuple[str, dict]] = []
    lab.on_fit = lambda name: seen.append((name, {a: s.version for a, s in eng.models.items()}))
    seed_topics(eng)
    eng.process(docs(6))
    assert seen == [(CK, {}), (SK, {})], "without revisions no algorithm serves before every one has a model"
    eng.request_refit()
    assert seen[2:] == [(CK, {CK: 1, SK: 1}), (SK, {CK: 2, SK: 1})]


def test_first_round_the_primary_serves_alone_and_the_others_verdicts_come_as_revisions(lab) -> None:
    eng = make(algorithms=[SK, CK], primary=CK)  # revisions "changed" (the default)
    seen: list[tuple[str, dict, bool]] = []
    lab.on_fit = lambda name: seen.append((name, {a: s.version for a, s in eng.models.items()}, eng.serving))
    seed_topics(eng)
    out = eng.process(docs(6)).assignments
    # the primary fits first and serves before the second algorithm's fit starts
    assert seen == [(CK, {}, False), (SK, {CK: 1}, True)]
    assert eng.ready and len(out) == 12 and {a.algorithm for a in out if a.primary} == {CK}
    lab.fail = {SK}
    fresh = make(algorithms=[SK, CK], primary=CK, background_refit=True)
    gate = threading.Event()
    lab.on_fit = lambda name: gate.wait(DEADLINE) if name == SK else None
    seed_topics(fresh)
    first = fresh.process(docs(6)).assignments  # d0-d5 buffered (or served if the primary's fit was that quick)
    wait_for(lambda: CK in fresh.models, DEADLINE, "the primary's first model", 0.01)
    assert fresh.serving and not fresh.ready and fresh.refitting
    first += fresh.process(docs(3, start=6)).assignments  # the buffered d0-d5, then d6-d8
    assert sorted((a.id, a.algorithm, a.revision) for a in first) == [(f"d{i}", CK, 0) for i in range(9)], \
        "documents are served by the primary while the other algorithm still fits"
    assert fresh.process([]).revisions == [], "no revision without a model of the missing algorithm"
    fresh.label("d7", [topic_of("d7")])  # a seed now: it still gets the other algorithm's first verdict
    gate.set()
    assert fresh.wait_for_refit(DEADLINE) and fresh.ready and fresh.models[SK].fallback
    revised = [a for chunk in drain(fresh) for a in chunk]
    assert {a.id for a in revised if a.algorithm == SK} == {f"d{i}" for i in range(9)}
    assert all(a.revision >= 1 for a in revised if a.algorithm == SK)
    assert not [a for a in revised if a.id == "d7" and a.algorithm == CK], "a seed's served verdicts are not revised"
    # documents_assigned_total counts every document once per algorithm, the late first verdicts included
    assert sample(fresh.telemetry.assigned, algorithm=SK) == sample(fresh.telemetry.assigned, algorithm=CK) == 9


def test_documents_the_primary_served_alone_are_held_until_every_algorithm_judged_them(lab) -> None:
    # a window of 8: the documents served while the other algorithm fits leave it before its model is in
    eng = make(algorithms=[SK, CK], primary=CK, background_refit=True, window_max_docs=8, max_buffered_docs=12)
    gate = threading.Event()
    lab.on_fit = lambda name: gate.wait(DEADLINE) if name == SK else None
    seed_topics(eng)
    out = eng.process(docs(6)).assignments
    wait_for(lambda: CK in eng.models, DEADLINE, "the primary's first model", 0.01)
    tp = TopicPartition("documents", 0)
    out += eng.process([replace(d, source=(tp, 100 + i)) for i, d in enumerate(docs(10, start=6))]).assignments
    served = {f"d{i}" for i in range(16)}
    # their offsets hold the worker's commits back, as buffered documents' do (a crash reads them again)
    assert Worker._held(SimpleNamespace(engine=eng)) == {tp: 100}
    assert {a.id for a in out} == served and {a.algorithm for a in out} == {CK}
    assert set(eng.partial) == served and {d.id for d in eng.partial_docs} == served
    assert eng.buffer_full, "held documents count against the pre-model buffer (backpressure)"
    assert not served <= set(eng.window.ids()), "some of them left the window"
    gate.set()
    assert eng.wait_for_refit(DEADLINE) and eng.ready
    revised = [a for chunk in drain(eng) for a in chunk]
    assert sorted(a.id for a in revised if a.algorithm == SK) == sorted(served), "every one judged by SK once"
    assert not eng.partial and eng.partial_bytes == 0 and not eng.buffer_full
    assert Worker._held(SimpleNamespace(engine=eng)) == {}
    assert len(eng._served) <= 8 and set(eng._served) <= set(eng.window.ids())


def test_the_agreement_gauge_is_the_share_of_window_documents_in_the_same_class(lab) -> None:
    eng = make()
    seed_topics(eng)
    eng.process(docs(9))
    # swap two classes' seeds: space and sport documents change class, food ones do not
    eng.label("sspace0", ["sport"])
    eng.label("ssport0", ["space"])
    eng.request_refit()
    assert sample(eng.telemetry.agreement, algorithm=CK) == pytest.approx(3 / 9)
    assert sample(eng.telemetry.agreement, algorithm=SK) == pytest.approx(3 / 9)


def test_agreement_is_sampled_evenly_from_a_large_window(lab, monkeypatch) -> None:
    monkeypatch.setattr(engine_mod, "AGREEMENT_SAMPLE", 5)
    eng = make()
    seed_topics(eng)
    eng.process(docs(13))                # sample: d0, d3, d6, d9, d12 (all food) of the 13 window documents
    eng.label("sspace0", ["sport"])
    eng.label("ssport0", ["space"])
    eng.request_refit()
    assert sample(eng.telemetry.agreement, algorithm=CK) == 1.0


# ---------------------------------------------------------------------------------------------- revisions
def drain(eng: Engine, limit: int = 100) -> list[list]:
    chunks = []
    for _ in range(limit):
        got = eng.process([]).revisions
        if not got and not eng.revisions_pending:
            break
        chunks.append(got)
    return chunks


def test_revisions_after_a_class_swap_exactly_the_changed_documents_in_chunks(lab, caplog) -> None:
    caplog.set_level(logging.INFO, logger="streamsemi.engine")
    eng = make(revision_chunk=4)
    seed_topics(eng)
    first = eng.process(docs(12)).assignments
    assert {a.id: a.label for a in first if a.algorithm == CK} == {f"d{i}": topic_of(f"d{i}") for i in range(12)}
    eng.label("sspace0", ["sport"])
    eng.label("ssport0", ["space"])
    eng.request_refit()
    chunks = drain(eng)
    changed = [f"d{i}" for i in range(12) if topic_of(f"d{i}") != "food"]
    assert [len({a.id for a in c}) for c in chunks] == [2, 3, 3], "4 documents looked at per call, food unchanged"
    revised = [a for c in chunks for a in c]
    assert sorted({a.id for a in revised}) == sorted(changed)
    swap = {"space": "sport", "sport": "space"}
    assert all(a.label == swap[topic_of(a.id)] and a.revision == 1 and a.model_version == 2 for a in revised)
    assert sorted((a.id, a.algorithm) for a in revised) == sorted((d, alg) for d in changed for alg in (CK, SK))
    assert all(a.primary == (a.algorithm == CK) for a in revised) and all(a.document is None for a in revised)
    assert eng.revisions_sent == 16
    assert sample(eng.telemetry.revisions, algorithm=CK) == 8 and sample(eng.telemetry.revisions, algorithm=SK) == 8
    assert events(caplog, "revision_pass_started") == [{"model_version": 2, "documents": 12, "primary": CK}]
    assert events(caplog, "revision_pass_done") == [{"model_version": 2}]
    # the next swap revises again, with revision 2
    eng.label("sspace0", ["space"])
    eng.label("ssport0", ["sport"])
    eng.request_refit()
    again = [a for c in drain(eng) for a in c]
    assert {a.revision for a in again} == {2} and {a.label for a in again if a.id == "d1"} == {"space"}


def test_revisions_all_mode_skips_seeds_and_counts_every_verdict(lab) -> None:
    eng = make(revisions="all", revision_chunk=100)
    seed_topics(eng)
    eng.process(docs(6))
    eng.label("d0", ["food"])          # a window document becomes a seed: not revised
    eng.request_refit()
    (chunk,) = drain(eng)
    assert sorted({a.id for a in chunk}) == [f"d{i}" for i in range(1, 6)]
    assert len(chunk) == 10 and {a.revision for a in chunk} == {1} and eng.revisions_sent == 10
    assert eng.revisions_pending == 0 and sample(eng.telemetry.revisions_pending) == 0


def test_revisions_off_and_not_before_the_first_model(lab) -> None:
    off = make(revisions="off")
    seed_topics(off)
    off.process(docs(6))
    off.request_refit()
    assert drain(off) == [] and off.revisions_pending == 0
    waiting = make(min_docs_first_refit=100)
    waiting.process(docs(6))
    assert waiting.process([]).revisions == []


def test_a_revision_pass_follows_the_newest_models(lab) -> None:
    eng = make(revision_chunk=2, revisions="all")
    seed_topics(eng)
    eng.process(docs(8))
    eng.request_refit()
    first = eng.process([]).revisions
    assert {a.model_version for a in first} == {2} and eng.revisions_pending == 6
    eng.request_refit()
    rest = [a for c in drain(eng) for a in c]
    assert {a.model_version for a in rest} == {3}
    assert sorted({a.id for a in rest}) == [f"d{i}" for i in range(8)], "the new pass covers every document again"
    assert {a.id: a.revision for a in rest}["d0"] == 2 and {a.id: a.revision for a in rest}["d7"] == 1


# ---------------------------------------------------------------------------------------------- primary = auto
def probe_fits(lab: Lab, n_seeds: int) -> list[str]:
    """Algorithms fitted with a fold of the seeds held out."""
    return [name for name, _, seeds in lab.fits if seeds < n_seeds]


def test_primary_auto_k_fold_probes_a_running_mean_over_the_folds(lab, caplog) -> None:
    caplog.set_level(logging.INFO, logger="streamsemi.engine")
    lab.wrong = {SK}
    eng = make(primary=None, algorithms=[SK, CK])
    assert eng.primary == SK
    seed_topics(eng, per_topic=3)
    eng.label("sfood3", ["food"], text=text("food", 7))          # 10 seeds: folds of 3, 3 and 4
    out = eng.process(docs(6)).assignments
    assert probe_fits(lab, 10) == [SK, CK] and [n for n, _, k in lab.fits if k == 10 - 3] == [SK, CK]
    assert eng.held_out_accuracy() == {SK: 0.0, CK: 1.0} and eng._held_out_checks() == {SK: 3, CK: 3}
    assert eng.primary == CK and {a.algorithm for a in out if a.primary} == {CK}
    assert events(caplog, "primary_changed") == [{"previous": SK, "primary": CK, "accuracy": 1.0,
                                                   "previous_accuracy": 0.0, "source": "k-fold"}]
    lab.wrong = set()
    eng.request_refit()                                           # version 2: fold 2 (3 seeds)
    assert eng.held_out_accuracy() == {SK: pytest.approx(1 / 3), CK: 1.0}
    eng.request_refit()                                           # version 3: fold 0 (4 seeds)
    assert eng.held_out_accuracy() == {SK: pytest.approx(5 / 9), CK: 1.0} and eng._held_out_checks() == {SK: 4, CK: 4}
    eng.request_refit()                                           # version 4: fold 1 again; checks keep the largest
    assert eng._held_out_checks() == {SK: 4, CK: 4} and eng.primary == CK
    assert len(probe_fits(lab, 10)) == 8


def test_primary_auto_probes_only_while_prequential_checks_are_few_and_snapshots_small(lab, monkeypatch) -> None:
    monkeypatch.setattr(engine_mod, "PRIMARY_KFOLD_MAX_DOCS", 16)
    eng = make(primary=None, window_max_docs=100)
    seed_topics(eng, per_topic=2)
    eng.process(docs(9))                                          # 9 + 6 seeds = 15 rows: probes
    assert len(probe_fits(lab, 6)) == 2
    eng.process(docs(1, 9))
    eng.request_refit()                                           # 16 rows: probes
    assert len(probe_fits(lab, 6)) == 4
    eng.process(docs(1, 10))
    eng.request_refit()                                           # 17 rows, an estimate exists: no probes
    assert len(probe_fits(lab, 6)) == 4 and eng.refit_count == 3
    eng._kfold_accuracy.clear()
    eng.request_refit()                                           # 17 rows, no estimate yet: probes
    assert len(probe_fits(lab, 6)) == 6
    small = make(primary=None)
    seed_topics(small, per_topic=2)
    small.process(docs(6))
    for name in (CK, SK):
        small._seed_checks[name].extend([True] * engine_mod.PRIMARY_MIN_CHECKS)
    small.request_refit()
    assert len(probe_fits(lab, 6)) == 8, "enough prequential checks: no more probes"
    small._seed_checks[SK].pop()
    small.request_refit()
    assert len(probe_fits(lab, 6)) == 10, "one algorithm short of the checks: probes"
    one = make(primary=CK)
    seed_topics(one, per_topic=2)
    one.process(docs(6))
    assert len(probe_fits(lab, 6)) == 10, "a fixed primary: no probes"


def test_no_probes_in_a_round_that_a_growth_refit_follows(lab) -> None:
    lab.gate = threading.Event()
    eng = make(primary=None, background_refit=True, refit_growth=2.0, max_buffered_docs=100, window_max_docs=100)
    seed_topics(eng, per_topic=2)
    try:
        eng.process(docs(6))                                      # round 1 on 6 documents, blocked
        eng.process(docs(6, 6))                                   # the window doubles during it
    finally:
        lab.gate.set()
    assert eng.wait_for_refit(DEADLINE) and eng.version == 1 and probe_fits(lab, 6) == []
    eng.process([])
    assert eng.version == 2 and eng.wait_for_refit(DEADLINE)
    assert len(probe_fits(lab, 6)) == 2, "the growth round probes"
    lab.gate = None
    eng.process(docs(11, 12))
    assert eng.wait_for_refit(DEADLINE) and eng.version == 2, "22 < 2 x 12"
    eng.process(docs(1, 23))
    assert eng.wait_for_refit(DEADLINE) and eng.version == 3 and triggers(eng) == {"docs": 1, "growth": 2}


def test_a_probe_that_fails_is_logged_and_a_failed_algorithm_is_not_probed(lab, caplog) -> None:
    caplog.set_level(logging.INFO, logger="streamsemi.engine")
    lab.fail = {SK}
    eng = make(primary=None, algorithms=[SK, CK])
    seed_topics(eng, per_topic=2)
    eng.process(docs(6))
    assert probe_fits(lab, 6) == [CK] and events(caplog, "holdout_failed") == []
    assert eng.held_out_accuracy() == {CK: 1.0}
    lab.fail = set()
    lab.on_fit = lambda name: (_ for _ in ()).throw(RuntimeError("probe broke")) if lab.fits[-1][2] < 6 else None
    eng.request_refit()
    assert [e["algorithm"] for e in events(caplog, "holdout_failed", logging.WARNING)] == [SK, CK]
    assert events(caplog, "holdout_failed")[0]["error"] == "probe broke"
    assert eng.held_out_accuracy() == {CK: 1.0} and eng.models[SK].version == 2, "the round itself succeeded"


def test_too_few_seeds_for_a_fold_leave_the_estimate_alone(lab) -> None:
    eng = make(primary=None)
    seed_topics(eng)
    eng.label("x", ["food"], text=text("food", 4))
    eng.label("y", ["food"], text=text("food", 5))
    eng.process(docs(6))                                         # 5 seeds < 2 x PRIMARY_KFOLD
    assert eng.ready and probe_fits(lab, 5) == [] and eng.held_out_accuracy() == {}


def test_a_failing_agreement_is_logged_and_the_new_model_serves(lab, caplog) -> None:
    caplog.set_level(logging.INFO, logger="streamsemi.engine")
    eng = make(algorithms=[CK], primary=CK)
    seed_topics(eng)
    eng.process(docs(6))

    def breaks_predictions(name):
        lab.fail_predict = True

    lab.on_fit = breaks_predictions
    eng.request_refit()
    assert events(caplog, "agreement_failed", logging.WARNING) == [{"algorithm": CK, "error": "predict failed"}]
    assert eng.models[CK].version == 2 and sample(eng.telemetry.agreement, algorithm=CK) == 0


def test_a_backlog_waits_for_the_growth_refit_fitted_on_it(lab) -> None:
    clock = Clock()
    lab.gate = threading.Event()
    eng = make(clock, background_refit=True, refit_growth=2.0, max_buffered_docs=100, window_max_docs=100)
    seed_topics(eng)
    eng.process(docs(6))                                          # round 1 on 6 documents, blocked
    eng.process(docs(12, 6))                                      # a backlog of 12 arrives: 18 >= 2 x (6 + 3 seeds)
    lab.gate.set()
    assert eng.wait_for_refit(DEADLINE) and eng.version == 1
    lab.gate = threading.Event()
    try:
        out = eng.process([]).assignments                         # the growth round (18 documents) starts
        assert eng.version == 2 and eng.refitting and eng.holding_backlog
        assert out == [] and len(eng.buffer) == 18, "the backlog waits for the model fitted on it"
        clock.t += 30.0
        assert eng.holding_backlog, "30 s: still waiting"
        clock.t += 0.001
        assert not eng.holding_backlog, "never longer than BACKLOG_HOLD_MAX_S"
        clock.t -= 30.001
    finally:
        lab.gate.set()
    assert eng.wait_for_refit(DEADLINE)
    out = eng.process([]).assignments
    assert len(out) == 2 * 18 and {a.model_version for a in out} == {2}


def test_a_backlog_does_not_wait_for_a_refit_on_a_window_that_did_not_grow_enough(lab) -> None:
    lab.gate = threading.Event()
    eng = make(background_refit=True, refit_growth=2.0, max_buffered_docs=100, window_max_docs=100)
    seed_topics(eng)
    eng.process(docs(6))
    eng.process(docs(4, 6))
    lab.gate.set()
    assert eng.wait_for_refit(DEADLINE)
    lab.gate = threading.Event()
    try:
        eng.request_refit()                                       # on 10 documents: < 2 x (6 + 3 seeds)
        assert eng.refitting and not eng.holding_backlog
        out = eng.process([]).assignments
        assert len(out) == 2 * 10 and {a.model_version for a in out} == {1}
    finally:
        lab.gate.set()
    assert eng.wait_for_refit(DEADLINE)


def test_a_provisional_flag_change_alone_is_revised(lab) -> None:
    eng = make(min_seeds_per_class=2, max_buffered_docs=6, revision_chunk=100)
    seed_topics(eng)                                              # 1 seed per class: policy not met
    first = eng.process(docs(6)).assignments
    assert triggers(eng) == {"buffer_full": 1} and all(a.provisional for a in first)
    seed_topics(eng, per_topic=2)                                 # the same classes, 2 seeds each
    eng.request_refit()
    (chunk,) = drain(eng)
    assert sorted({a.id for a in chunk}) == [f"d{i}" for i in range(6)] and len(chunk) == 12
    assert not any(a.provisional for a in chunk) and all(a.label == topic_of(a.id) for a in chunk)


def test_a_primary_change_alone_re_emits_the_new_primary_verdicts(lab) -> None:
    eng = make(primary=None, algorithms=[SK, CK], revision_chunk=100)
    seed_topics(eng, per_topic=2)
    eng.process(docs(6))
    assert eng.primary == SK, "equal held-out accuracy: the first algorithm stays"
    eng._seed_checks[SK].extend([True, False] * 50)
    eng._seed_checks[CK].extend([True] * 100)
    eng.request_refit()
    (chunk,) = drain(eng)
    assert eng.primary == CK
    assert sorted((a.id, a.algorithm, a.primary) for a in chunk) == [(f"d{i}", CK, True) for i in range(6)]


def test_the_primary_chosen_after_the_probes_is_re_emitted_without_a_new_version(lab) -> None:
    lab.wrong = {SK}
    lab.probe_gate, lab.all_seeds = threading.Event(), 6
    eng = make(primary=None, algorithms=[SK, CK], background_refit=True, revision_chunk=100)
    seed_topics(eng, per_topic=2)
    try:
        first = eng.process(docs(6))
        # the refit thread may swap the first models in during this very call: CK's first verdicts then come
        # as this call's revisions (they were dropped here: a flaky failure on a busy machine)
        out = first.assignments + first.revisions
        # each first model serves as soon as it is fitted (the primary's first): on a busy machine CK's lands after ready
        wait_for(lambda: eng.ready and CK in eng.models, DEADLINE, "both first models", 0.01)
        step = eng.process([])                                     # the first models serve during the probes
        # (the primary's first model may have served d0-d5 alone: CK's first verdicts then come as revisions)
        out += step.assignments + step.revisions
        assert eng.ready and eng.refitting and {a.algorithm for a in out if a.primary} == {SK}
        assert sorted((a.id, a.algorithm) for a in out) == sorted((f"d{i}", n) for i in range(6) for n in (SK, CK))
        assert eng.process([]).revisions == []
    finally:
        lab.probe_gate.set()
    assert eng.wait_for_refit(DEADLINE) and eng.version == 1
    (chunk,) = drain(eng)
    assert eng.primary == CK
    assert sorted((a.id, a.algorithm, a.primary, a.model_version) for a in chunk) == \
        [(f"d{i}", CK, True, 1) for i in range(6)]


def test_a_revision_carries_the_new_models_whole_verdict(lab) -> None:
    clock = Clock(1500.0)
    lab.fail = {SK}
    eng = make(clock, revisions="all", explain_words=3, revision_chunk=100, min_seeds_per_class=2, max_buffered_docs=6)
    seed_topics(eng)                                              # 1 seed per class: provisional models
    eng.process(docs(6))
    clock.t = 1600.0
    eng.request_refit()
    assert set(eng.models[CK].explain) == set(NAMES) and all(eng.models[CK].explain.values())
    del eng.models[CK].explain["sport"]                           # a cluster without words: explain []
    (chunk,) = drain(eng)
    assert len(chunk) == 12
    X = engine_mod.rows_to_csr([eng.window.get(f"d{i}").row for i in range(6)], eng.config.n_features)
    for alg in (CK, SK):
        slot = eng.models[alg]
        assert slot.provisional and slot.fallback == (alg == SK)
        expected = {}
        for i, (label, score, labels, cluster, new) in enumerate(Engine._assign_with(slot, X)):
            expected[f"d{i}"] = {
                "id": f"d{i}", "algorithm": alg, "model_version": slot.version, "revision": 1, "label": label,
                "score": round(score, 6), "labels": labels, "cluster": cluster, "new_cluster": new,
                "explain": slot.explain.get(cluster, []), "primary": alg == CK,
                "provisional": True, "ts": 1600.0, **({"fallback": True} if alg == SK else {})}
        assert {a.id: a.to_message() for a in chunk if a.algorithm == alg} == expected


def test_a_revision_budget_sizes_the_chunks_from_the_last_chunks_cost(lab, monkeypatch) -> None:
    monkeypatch.setattr(engine_mod, "time", SimpleNamespace(perf_counter=lambda: lab.pc, time=time.time))
    monkeypatch.setattr(engine_mod, "REVISION_PROBE", 3)
    # models without their snapshot's scores (as adopted or restored ones): every revised document is predicted
    monkeypatch.setattr(engine_mod, "score_rows", lambda *a: None)
    eng = make(revisions="all", revision_chunk=100)
    seed_topics(eng)
    eng.process(docs(20))
    eng.revision_budget_s = 0.11
    lab.pc_per_doc = 0.01                      # 2 algorithms: 0.02 s per document revised
    eng.request_refit()
    sizes = [len({a.id for a in chunk}) for chunk in drain(eng)]
    assert sizes == [3, 5, 5, 5, 2], "3 to measure, then 0.11 s / 0.02 s per document"


def test_the_revision_budget_counts_the_callers_cost_of_emitting_a_chunk(lab, monkeypatch) -> None:
    """With snapshot scores assigning costs ~nothing: the chunk is sized by what emitting it cost the worker."""
    monkeypatch.setattr(engine_mod, "time", SimpleNamespace(perf_counter=lambda: lab.pc, time=time.time))
    monkeypatch.setattr(engine_mod, "REVISION_PROBE", 3)
    eng = make(revisions="all", revision_chunk=100)
    seed_topics(eng)
    eng.process(docs(24))
    eng.revision_budget_s = 0.11
    lab.pc_per_doc = 0.0                       # read from the snapshot's scores: no prediction cost
    eng.request_refit()
    assert all(s.scores is not None for s in eng.models.values())
    sizes = []
    for _ in range(20):
        chunk = eng.process([]).revisions
        if not chunk and not eng.revisions_pending:
            break
        n = len({a.id for a in chunk})
        sizes.append(n)
        assert len(chunk) == 2 * n             # revisions = all: both algorithms' verdicts
        eng.note_emit(0.01 * len(chunk), len(chunk))  # the worker: 0.01 s to send one record
    assert sizes == [3, 5, 5, 5, 5, 1], "0.11 s / (2 records x 0.01 s) of emitting per document"
    eng.note_emit(5.0, 0)                      # nothing emitted: ignored
    assert eng._record_emit_cost == 0.01


def test_a_named_clusters_seed_read_back_is_not_a_seed_change(lab) -> None:
    clock = Clock()
    eng = make(clock, refit_idle_s=1.0, min_refit_interval_s=0.0)
    seed_topics(eng)
    eng.process(docs(6))
    eng.label("c1", ["food"], text=text("food", 9), origin="cluster", offset=5)   # the worker names a cluster
    clock.t += 10.0
    eng.tick()
    assert eng.refit_count == 2 and eng.seeds.get("c1").labels == ("food",)
    assert eng.label("c1", ["food"], text=text("food", 9), origin="cluster", offset=5) == []  # read back
    clock.t += 10.0
    eng.tick()
    assert eng.refit_count == 2, "the same seed again: nothing changed"
    eng.label("c1", ["space"], text=text("food", 9), origin="cluster", offset=6)  # renamed
    assert eng.seeds.get("c1").labels == ("space",)
    clock.t += 10.0
    eng.tick()
    assert eng.refit_count == 3
    eng.label("c1", ["space"], text=text("food", 9), offset=7)                    # a person's label: applied
    clock.t += 10.0
    eng.tick()
    assert eng.refit_count == 4


def test_a_sparse_multilabel_indicator_gives_the_dense_ones_verdicts() -> None:
    import scipy.sparse as sp

    from streamsemi.engine import ModelSlot

    class Multi:
        def __init__(self, indicator) -> None:
            self.indicator = indicator

        def predict_proba(self, X):
            return np.array([[0.6, 0.3, 0.1], [0.2, 0.5, 0.3]])

        def predict(self, X):
            return self.indicator

    dense = np.array([[1, 0, 1], [0, 0, 0]])
    classes = np.array(["a", "b", "c"], dtype=object)
    verdicts = [Engine._assign_with(ModelSlot(Multi(ind), 1, 0.0, classes, frozenset(), True, {}), sp.csr_matrix((2, 4)))
                for ind in (dense, sp.csr_matrix(dense))]
    assert verdicts[0] == verdicts[1] == [("a", 0.6, {"a": 0.6, "c": 0.1}, "a", False), ("b", 0.5, {"b": 0.5}, "b", False)]


# ---------------------------------------------------------------- first verdicts
def _messages(out) -> set[tuple]:
    """What a consumer reads, without the time stamp: (id, algorithm, revision, label, cluster, primary, version)."""
    return {(a.id, a.algorithm, a.revision, a.label, a.cluster, a.primary, a.model_version) for a in out}


def test_first_verdicts_primary_serves_the_primary_first_then_the_others_within_the_budget(lab, monkeypatch) -> None:
    monkeypatch.setattr(engine_mod, "time", SimpleNamespace(perf_counter=lambda: lab.pc, time=time.time))
    monkeypatch.setattr(engine_mod, "score_rows", lambda *a: None)  # every document predicted (no snapshot scores)
    monkeypatch.setattr(engine_mod, "REVISION_PROBE", 3)
    ref = make()  # the same documents with every verdict at once
    seed_topics(ref)
    ref.process(docs(6))
    want = _messages(ref.process(docs(12, 100)).assignments)
    eng = make()
    seed_topics(eng)
    lab.pc_per_doc = 0.01                      # one algorithm predicting: 0.01 s per document
    eng.process(docs(6))                       # no budget yet: all first verdicts now, 0.01 s per document measured
    assert eng.ready and not eng.partial
    eng.deferred_budget_s = 0.05
    batch = docs(12, 100)
    fresh = eng.process(batch).assignments
    # 0.05 s x (1 + DEFERRED_PRESSURE x fill^2) / 0.01 s per document; fill = partial / max_buffered_docs (20,000)
    assert [a.algorithm for a in fresh] == [CK] * 12 + [SK] * 5, "the primary on every document, then the budget"
    assert all(a.primary and a.document is not None for a in fresh[:12])
    assert [a.id for a in fresh[12:]] == [f"d{i}" for i in range(100, 105)] and not any(a.primary for a in fresh[12:])
    assert [d.id for d in eng.partial_docs] == [f"d{i}" for i in range(105, 112)], "held back until judged"
    assert eng.first_verdicts_pending == 7 and sample(eng.telemetry.first_verdicts_pending) == 7
    got = list(fresh)
    sizes = []
    while eng.first_verdicts_pending:
        chunk = eng.process([]).assignments
        sizes.append(len(chunk))
        got += chunk
    assert sizes == [5, 2]
    assert _messages(got) == want, "the same messages as every verdict at once, revision 0"
    assert not eng.partial and not eng.partial_docs
    assert sample(eng.telemetry.assigned, algorithm=SK) == sample(ref.telemetry.assigned, algorithm=SK)


def test_first_verdicts_pressure_grows_the_budget_with_the_partial_documents(lab, monkeypatch) -> None:
    monkeypatch.setattr(engine_mod, "time", SimpleNamespace(perf_counter=lambda: lab.pc, time=time.time))
    monkeypatch.setattr(engine_mod, "score_rows", lambda *a: None)  # every document predicted (no snapshot scores)
    eng = make(max_buffered_docs=40)
    seed_topics(eng)
    lab.pc_per_doc = 0.01
    eng.process(docs(6))                       # measures 0.01 s per document
    eng.deferred_budget_s = 0.02
    out = eng.process(docs(20, 200)).assignments
    # 20 partial of at most 40: fill 0.5, budget 0.02 x (1 + 9 x 0.5^2) = 0.065 s -> 6 documents
    assert sum(1 for a in out if a.algorithm == SK) == 6
    assert eng.first_verdicts_pending == 14


def test_first_verdicts_all_and_in_process_return_every_verdict_in_the_call(lab) -> None:
    for mode in ("all", "primary"):
        eng = make(first_verdicts=mode)
        seed_topics(eng)
        eng.process(docs(6))
        out = eng.process(docs(9, 100)).assignments   # no budget (in process): everything now
        assert sorted((a.id, a.algorithm) for a in out) == sorted((f"d{i}", alg) for i in range(100, 109)
                                                                  for alg in (CK, SK)), mode
        assert not eng.partial and eng.first_verdicts_pending == 0


def test_a_deferred_verdict_of_a_new_primary_is_a_revision(lab) -> None:
    eng = make()
    seed_topics(eng)
    eng.process(docs(6))
    eng.deferred_budget_s = 1e-9               # one document per call
    eng.process(docs(3, 100))
    eng.primary = SK                           # primary = auto chose another algorithm meanwhile
    out = [a for _ in range(4) for a in eng.process([]).assignments]
    assert {(a.id, a.algorithm, a.primary, a.revision) for a in out} == {
        (f"d{i}", SK, True, 1) for i in (101, 102)}, "d100 was completed in the first call, before the change"
    assert not eng.partial


def test_first_verdicts_of_a_document_dropped_meanwhile_are_not_computed(lab) -> None:
    eng = make()
    seed_topics(eng)
    eng.process(docs(6))
    eng.deferred_budget_s = 1e-9
    batch = docs(4, 100)
    for d in batch:
        d.source = ("tp", int(d.id[1:]))
    eng.process(batch)
    assert eng.first_verdicts_pending == 3
    eng.drop_buffered(lambda d: d.source is not None and d.source[1] >= 102)   # revoked partitions
    out = [a for _ in range(3) for a in eng.process([]).assignments]
    assert [(a.id, a.algorithm) for a in out] == [("d101", SK)]
    assert eng.first_verdicts_pending == 0 and not eng.partial


def test_first_verdicts_setting_is_validated() -> None:
    with pytest.raises(ValueError, match="first_verdicts"):
        EngineConfig(algorithms=[CK, SK], first_verdicts="later")


def test_a_revision_pass_keeps_a_quarter_of_the_budget_while_first_verdicts_take_the_rest(lab, monkeypatch) -> None:
    monkeypatch.setattr(engine_mod, "time", SimpleNamespace(perf_counter=lambda: lab.pc, time=time.time))
    monkeypatch.setattr(engine_mod, "score_rows", lambda *a: None)
    monkeypatch.setattr(engine_mod, "REVISION_PROBE", 3)
    eng = make(revisions="all", revision_chunk=100)
    seed_topics(eng)
    eng.process(docs(20))                      # every verdict now (no budget); first verdicts cost 0 s here
    eng.revision_budget_s = 0.2
    lab.pc_per_doc = 0.01
    eng.request_refit()
    assert len({a.id for a in eng.process([]).revisions}) == 3   # probe: 2 algorithms x 0.01 s per revised document
    out = eng.process(docs(30, 100))           # 30 deferred first verdicts at the measured 0 s: all, 0.3 s > 0.2 s
    assert sum(1 for a in out.assignments if a.algorithm == SK) == 30
    assert len({a.id for a in out.revisions}) == 2, "0.2 s / 4 left for the pass: 2 documents at 0.02 s"


def test_partial_min_offsets_follow_the_partial_documents_and_stay_bounded(lab) -> None:
    """The worker's commit hold-back without scanning the partial documents: equal to the scan, always."""
    eng = make()
    seed_topics(eng)
    eng.process(docs(6))
    eng.deferred_budget_s = 1e-9               # one deferred document per call
    rng = np.random.default_rng(0)

    def scan() -> dict:
        out: dict = {}
        for d in eng.partial_docs:
            out[d.source[0]] = min(d.source[1], out.get(d.source[0], d.source[1]))
        return out

    offsets = {"a": 0, "b": 0}
    for step in range(60):
        batch = docs(int(rng.integers(0, 5)), 1000 + 10 * step)
        for d in batch:
            tp = "a" if rng.random() < 0.5 else "b"
            d.source = (tp, offsets[tp])
            offsets[tp] += 1
        if step % 7 == 3 and eng.partial:      # a document sent again: held at its new offset
            again = next(iter(eng.partial))
            d = Document(id=again, text=text(topic_of(again), 1), ts=0.0, arrival=0.0, source=("a", offsets["a"]))
            offsets["a"] += 1
            batch.append(d)
        if step == 40:
            eng.drop_buffered(lambda d: d.source[0] == "b")   # partition b revoked
        eng.process(batch)
        assert eng.partial_min_offsets() == scan(), step
    while eng.partial:
        eng.process([])
    assert eng.partial_min_offsets() == {} and not eng._partial_heaps and not eng._partial_gone


def test_prequential_seed_checks_run_in_batches_by_count_or_time(lab, monkeypatch) -> None:
    monkeypatch.setattr(engine_mod, "SEED_CHECK_BATCH", 8)
    clock = Clock()
    eng = make(clock)
    seed_topics(eng)
    eng.process(docs(6))
    assert eng.ready
    checked = lambda: sum(len(v) for v in eng._seed_checks.values())  # noqa: E731
    base = checked()
    for i, name in enumerate(NAMES):              # 3 seeds after the model: fewer than a batch
        eng.label(f"late{i}", [name], text=text(name, 300 + i))
    eng.process([])
    assert checked() == base, "6 pending (3 seeds of the first fit) < SEED_CHECK_BATCH, no time passed: not yet"
    clock.t += engine_mod.SEED_CHECK_EVERY_S
    eng.process([])
    assert checked() == base + 3 * 2, "the time is up: every algorithm judged the 3 seeds"
    for i in range(8):                            # a full batch: at once
        eng.label(f"more{i}", [NAMES[i % 3]], text=text(NAMES[i % 3], 400 + i))
    eng.process([])
    assert checked() == base + 11 * 2
    eng.label("last", [NAMES[0]], text=text(NAMES[0], 500))
    assert eng.held_out_accuracy() is not None and checked() == base + 12 * 2, "a primary choice checks first"


def test_deferred_first_verdicts_that_fail_never_raise_nor_hold_commits_forever(lab, caplog) -> None:
    eng = make()
    seed_topics(eng)
    eng.process(docs(6))
    eng.deferred_budget_s = 1e-9               # one deferred document per call
    out = eng.process(docs(3, 100), background=False)
    assert [(a.id, a.algorithm) for a in out.assignments] == [(f"d{i}", CK) for i in range(100, 103)]
    assert eng.first_verdicts_pending == 3, "background=False: nothing but the fresh documents"
    assert [(a.id, a.algorithm) for a in eng.background().assignments] == [("d100", SK)]
    lab.fail_predict = True                    # the other algorithm's predictions now fail
    with caplog.at_level(logging.WARNING, logger="streamsemi.engine"):
        got = eng.background()
    assert got.assignments == [] and "first_verdict_failed" in caplog.text
    assert sample(eng.telemetry.first_verdicts_failed) == 1 and "d101" not in eng.partial, "released, not held"
    lab.fail_predict = False
    assert [(a.id, a.algorithm) for a in eng.background().assignments] == [("d102", SK)]
    assert not eng.partial and eng.first_verdicts_pending == 0
