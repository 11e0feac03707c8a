"""Engine refits: the model swap is atomic and the triggers fire exactly at their thresholds.

In-process engine (``background_refit=False``, injected clock) on a small synthetic
corpus. Written to kill two mutations that survived the suite (``make mutation``): a model swap
that edits the serving dict in place (``new_models = self.models``) and an off-by-one
count trigger (``>=`` -> ``>``).
"""

from __future__ import annotations

import numpy as np
import pytest

from streamsemi.core.messages import Document
from streamsemi.engine import Engine, EngineConfig

TOPICS = {
    "space": "orbit rocket launch nasa shuttle satellite astronaut moon planet telescope",
    "sport": "football goal match league player coach stadium referee season striker",
    "food": "recipe flour butter oven bake sugar dough pastry kitchen cream",
}
ALGOS = ["constrained-kmeans", "seeded-kmeans"]


class Clock:
    """A wall clock the test moves by hand."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def make_docs(n: int, start: int, rng: np.random.Generator) -> list[tuple[Document, str]]:
    names = sorted(TOPICS)
    out = []
    for i in range(start, start + n):
        topic = names[i % len(names)]
        words = rng.choice(TOPICS[topic].split(), size=12).tolist()
        out.append((Document(id=f"d{i}", text=" ".join(words), ts=0.0, arrival=0.0), topic))
    return out


def engine(clock: Clock, **kw) -> Engine:
    base = dict(algorithms=ALGOS, background_refit=False, n_features=2**12, drift_detection=False,
                refit_every_docs=0, refit_every_s=None, min_docs_first_refit=30, random_state=0,
                refit_growth=0, refit_idle_s=0,  # only the triggers under test
                min_seed_classes=3, min_seeds_per_class=3, first_fit_stable_seeds=0)  # the 3 topics x 3 seeds start the first fit
    base.update(kw)
    return Engine(EngineConfig(**base), clock=clock)


def seeded(eng: Engine, rng: np.random.Generator) -> None:
    """Seeds for every topic, then the first refit (30 documents in the window)."""
    for doc, topic in make_docs(9, 10_000, rng):
        eng.label(doc.id, [topic], text=doc.text)
    eng.process([d for d, _ in make_docs(30, 0, rng)])
    assert eng.refit_count == 1 and eng.ready and eng.docs_since_refit == 0


@pytest.mark.parametrize("n", [1, 7, 50])
def test_count_trigger_fires_exactly_at_refit_every_docs(n) -> None:
    rng = np.random.default_rng(n)
    eng = engine(Clock(), refit_every_docs=n)
    seeded(eng, rng)
    start = 100
    for _ in range(2):  # twice: the counter restarts after each refit
        if n > 1:
            eng.process([d for d, _ in make_docs(n - 1, start, rng)])
            start += n - 1
            assert eng.refit_count == 1 + _, f"no refit after {n - 1} of {n} documents"
            assert eng.docs_since_refit == n - 1
        eng.process([d for d, _ in make_docs(1, start, rng)])
        start += 1
        assert eng.refit_count == 2 + _, f"refit after exactly {n} documents"
        assert eng.docs_since_refit == 0
    # one batch of exactly n documents triggers one refit, too
    eng.process([d for d, _ in make_docs(n, start, rng)])
    assert eng.refit_count == 4 and eng.version == 4


def test_time_trigger_fires_exactly_at_refit_every_s() -> None:
    clock = Clock()
    eng = engine(clock, refit_every_s=60.0)
    seeded(eng, np.random.default_rng(0))
    started = eng.last_refit_start
    clock.t = started + 59.999
    eng.tick()
    assert eng.refit_count == 1
    clock.t = started + 60.0
    eng.tick()
    assert eng.refit_count == 2 and eng.last_refit_start == started + 60.0


def test_refit_swaps_a_new_dict_and_never_touches_the_serving_models() -> None:
    eng = engine(Clock())
    seeded(eng, np.random.default_rng(1))
    serving = eng.models
    before = dict(serving)
    ck = serving["constrained-kmeans"]
    centers = ck.model.cluster_centers_.copy()
    eng.request_refit()
    assert eng.refit_count == 2
    assert eng.models is not serving, "the refit publishes a new dict (one reference swap)"
    assert serving == before and all(serving[a] is before[a] for a in ALGOS), \
        "the dict that was serving is unchanged"
    assert ck.version == 1 and np.array_equal(ck.model.cluster_centers_, centers), \
        "the model that was serving is unchanged"
    for a in ALGOS:
        assert eng.models[a] is not before[a] and eng.models[a].version == 2
        assert eng.models[a].model is not before[a].model


class RefitMidBatch:
    """Wraps a serving model: the first ``predict_proba`` call runs a whole refit first,
    as a background refit finishing while a batch is being assigned would."""

    def __init__(self, model, eng: Engine) -> None:
        self._model = model
        self._eng = eng
        self.fired = False

    def __getattr__(self, name):
        return getattr(self._model, name)

    def predict_proba(self, X):
        if not self.fired:
            self.fired = True
            self._eng.request_refit()
        return self._model.predict_proba(X)


@pytest.mark.parametrize("first_verdicts", ["all", "primary"])
def test_one_batch_is_assigned_by_one_model_version(first_verdicts) -> None:
    rng = np.random.default_rng(2)
    eng = engine(Clock(), first_verdicts=first_verdicts)
    seeded(eng, rng)
    first = eng.models[ALGOS[0]]  # assigned first: the refit lands before the second algorithm's turn
    wrapper = RefitMidBatch(first.model, eng)
    first.model = wrapper
    batch = [d for d, _ in make_docs(20, 200, rng)]
    out = eng.process(batch).assignments
    assert wrapper.fired and eng.refit_count == 2 and eng.version == 2
    assert len(out) == 2 * len(batch)
    versions = {a: {x.model_version for x in out if x.algorithm == a} for a in ALGOS}
    if first_verdicts == "all":
        assert {a.model_version for a in out} == {1}, "a batch never mixes model versions"
    else:  # the primary's verdicts first; the others' follow with the models of their turn (here after the swap)
        assert versions == {ALGOS[0]: {1}, ALGOS[1]: {2}}, "one model version per algorithm in a batch"
        assert [a.algorithm for a in out] == [ALGOS[0]] * len(batch) + [ALGOS[1]] * len(batch)
    later = eng.process([d for d, _ in make_docs(20, 300, rng)]).assignments
    assert {(a.algorithm, a.model_version) for a in later} == {(a, 2) for a in ALGOS}
