"""The first fit of a slow, steady stream: the seed policy may never be met, the stream is never
idle and the buffer fills slowly, so ``first_fit_max_wait_s`` bounds how long nothing is served."""

from __future__ import annotations

import pytest

from streamsemi.core.messages import Document
from streamsemi.engine import Engine, EngineConfig

TOPICS = ("grain wheat harvest corn crop farm", "oil crude barrel opec refinery pipeline")


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def steady_stream(max_wait: float) -> tuple[Engine, Clock, list]:
    clock = Clock()
    eng = Engine(EngineConfig(algorithms=["constrained-kmeans"], background_refit=False, n_features=2**14,
                              min_docs_first_refit=5, min_seed_classes=5, min_seeds_per_class=1,
                              first_fit_stable_seeds=0, refit_idle_s=3.0, refit_growth=0, refit_every_docs=0,
                              drift_detection=False, first_fit_max_wait_s=max_wait), clock=clock)
    return eng, clock, []


def feed(eng: Engine, clock: Clock, out: list, k: int) -> None:
    """One document a second (never idle for refit_idle_s); the first two are seeds of two classes."""
    doc = Document(f"d{k}", f"{TOPICS[k % 2]} item{k}")
    if k < 2:
        eng.label(doc.id, ["grain" if k % 2 == 0 else "oil"], text=doc.text)
    out.extend(eng.process([doc]).assignments)
    clock.t += 1.0


def test_a_steady_stream_below_the_seed_policy_is_served_provisionally_after_the_max_wait():
    eng, clock, out = steady_stream(max_wait=10.0)
    for k in range(10):  # documents at t = 0 .. 9 s after the first
        feed(eng, clock, out, k)
    assert not eng.models and out == [] and len(eng.buffer) == 10
    feed(eng, clock, out, 10)  # t = 10 s: the wait is over
    assert eng.ready and eng.version == 1
    assert sorted(a.id for a in out) == sorted(f"d{k}" for k in range(11))
    assert all(a.provisional for a in out)
    assert {a.label for a in out if a.id in {"d4", "d6"}} == {"grain"}


@pytest.mark.parametrize("max_wait", [0.0, 500.0])
def test_without_the_max_wait_the_first_fit_waits_for_the_policy(max_wait):
    eng, clock, out = steady_stream(max_wait=max_wait)
    for k in range(60):
        feed(eng, clock, out, k)
    assert not eng.models and out == [] and len(eng.buffer) == 60


def backlog_engine(max_wait: float = 30.0, max_buffered: int = 20000) -> tuple[Engine, Clock]:
    """Seed policy met by the first documents (2 classes x 1 seed, no stability wait), idle after 3 s."""
    clock = Clock()
    eng = Engine(EngineConfig(algorithms=["constrained-kmeans"], background_refit=False, n_features=2**14,
                              min_docs_first_refit=5, min_seed_classes=2, min_seeds_per_class=1,
                              first_fit_stable_seeds=0, refit_idle_s=3.0, refit_growth=0, refit_every_docs=0,
                              drift_detection=False, first_fit_max_wait_s=max_wait,
                              max_buffered_docs=max_buffered), clock=clock)
    return eng, clock


def test_a_backlog_on_the_broker_is_read_before_the_first_fit():
    """Documents waiting unread (consumer lag) hold the seed gate: the first model is fitted on all of them."""
    eng, clock = backlog_engine()
    out: list = []
    for k in range(20):
        eng.backlog = 20 - k - 1  # what the worker's consumer lag says after this batch
        feed(eng, clock, out, k)
        clock.t -= 0.9  # a backlog arrives fast: 0.1 s per document, never idle
        if k < 19:
            assert not eng.models, f"fitted with {eng.backlog} documents still on the broker (document {k})"
    assert eng.version == 1 and eng.models["constrained-kmeans"].n_train == 20
    assert sorted(a.id for a in out) == sorted(f"d{k}" for k in range(20))


def test_without_a_backlog_the_seed_gate_fits_at_once():
    eng, clock = backlog_engine()
    out: list = []
    for k in range(6):
        feed(eng, clock, out, k)
    assert eng.version == 1 and eng.models["constrained-kmeans"].n_train == 5, "fitted when the gate was met (5 docs)"


@pytest.mark.parametrize("how", ["max_wait", "buffer_full"])
def test_a_backlog_never_holds_the_first_fit_past_the_wait_or_a_full_buffer(how):
    eng, clock = backlog_engine(max_wait=10.0, max_buffered=10**6 if how == "max_wait" else 8)
    out: list = []
    eng.backlog = 10**6  # an endless backlog
    for k in range(8):
        feed(eng, clock, out, k)  # one document a second
    if how == "buffer_full":
        assert eng.version == 1 and eng.models["constrained-kmeans"].n_train == 8
    else:
        assert not eng.models
        for k in range(8, 11):
            feed(eng, clock, out, k)
        assert eng.version == 1 and eng.models["constrained-kmeans"].n_train == 11, "fitted at 10 s after the first"
