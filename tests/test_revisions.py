"""Revised assignments, the first-model seed policy, refit cadence and ``primary = auto``."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from kafka_utils import DEADLINE, wait_for

from streamsemi.core.datasets import load
from streamsemi.core.messages import Document
from streamsemi.core.store import rows_to_csr
from streamsemi.engine import (
    FLUSH_CHUNK,
    PRIMARY_HYSTERESIS,
    PRIMARY_MIN_CHECKS,
    Engine,
    EngineConfig,
)


@pytest.fixture(scope="module")
def r8():
    ds = load("reuters-r8")
    order = np.random.default_rng(5).permutation(len(ds))
    return ds, [int(i) for i in order]


def docs(ds, idx):
    return [Document(id=f"r{i}", text=ds.texts[i]) for i in idx]


def cfg(**kw):
    base = dict(algorithms=["constrained-kmeans"], background_refit=False, n_features=2**16, refit_every_docs=0,
                refit_growth=0, refit_idle_s=0, min_docs_first_refit=100, min_seed_classes=2, min_seeds_per_class=2, first_fit_stable_seeds=0,
                drift_detection=False, revision_chunk=100, explain_words=0)
    base.update(kw)
    return EngineConfig(**base)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def seed(eng, ds, idx):
    for i in idx:
        eng.label(f"r{i}", [ds.labels[i]])


def by_class(ds, idx, per_class, classes=None):
    out, counts = [], {}
    for i in idx:
        c = ds.labels[i]
        if (classes is None or c in classes) and counts.get(c, 0) < per_class:
            counts[c] = counts.get(c, 0) + 1
            out.append(i)
    return out


def drain(eng, limit=1000):
    """Revision chunks until the pass ends."""
    chunks = []
    for _ in range(limit):
        got = eng.process([]).revisions
        if not got and not eng.revisions_pending:
            break
        chunks.append(got)
    return chunks


def hold_back_fit(eng, algorithm):
    """``algorithm``'s refits wait until the returned event is set (its probe fits do not)."""
    release = threading.Event()
    fit_one = eng._fit_one

    def held(name, snap, probe=False):
        if name == algorithm and not probe:
            release.wait(DEADLINE)
        return fit_one(name, snap, probe)

    eng._fit_one = held
    return release


def emitted(assignments):
    return {(a.id, a.algorithm): a for a in assignments}


def test_after_a_swap_exactly_the_changed_verdicts_are_revised_in_bounded_chunks(r8):
    ds, order = r8
    eng = Engine(cfg())
    window = order[:600]
    seed(eng, ds, by_class(ds, window, 2, {"earn", "acq"}))
    first = eng.process(docs(ds, window)).assignments
    assert {a.model_version for a in first} == {1} and {a.revision for a in first} == {0}
    last = {a.id: a.cluster for a in first}
    seeds_v2 = by_class(ds, window, 8)
    seed(eng, ds, seeds_v2)
    eng.request_refit()
    slot = eng.models["constrained-kmeans"]
    assert slot.version == 2
    ids = eng.window.ids()
    now = {d: c for d, (_, _, _, c, _) in zip(ids, eng._assign_with(slot, rows_to_csr(eng.window.rows(), 2**16)),
                                               strict=True)}
    expected = {d for d in ids if now[d] != last[d] and d not in eng.seeds}
    assert len(expected) > 50, "the test needs a second model that disagrees with the first on many documents"
    chunks = drain(eng)
    revised = [a for c in chunks for a in c]
    assert {a.id for a in revised} == expected and len(revised) == len(expected), "changed ones, once each"
    assert all(a.revision == 1 and a.model_version == 2 and a.cluster == now[a.id] for a in revised)
    assert not {a.id for a in revised} & {f"r{i}" for i in seeds_v2}, "seeds are not revised"
    assert max(len({a.id for a in c}) for c in chunks) <= 100, "at most revision_chunk documents per call"
    assert eng.revisions_pending == 0 and eng.process([]).revisions == []
    assert eng.telemetry.revisions_pending._value.get() == 0
    # the next swap revises again only what changed since, with revision 2
    seed(eng, ds, by_class(ds, order[600:3000], 4))
    eng.request_refit()
    again = [a for c in drain(eng) for a in c]
    assert all(a.revision == (2 if a.id in expected else 1) and a.model_version == 3 for a in again)


@pytest.mark.parametrize("mode", ["all", "off"])
def test_revision_modes_all_and_off(r8, mode):
    ds, order = r8
    eng = Engine(cfg(revisions=mode, algorithms=["constrained-kmeans", "seeded-kmeans"]))
    window = order[:300]
    seeds = by_class(ds, window, 3)
    seed(eng, ds, seeds)
    eng.process(docs(ds, window))
    eng.request_refit()
    revised = [a for c in drain(eng) for a in c]
    if mode == "off":
        assert revised == [] and eng.revisions_pending == 0
        return
    nonseed = {f"r{i}" for i in window} - {f"r{i}" for i in seeds}
    assert sorted((a.id, a.algorithm) for a in revised) == sorted(
        (d, a) for d in nonseed for a in ("constrained-kmeans", "seeded-kmeans"))
    assert {a.revision for a in revised} == {1} and sum(a.primary for a in revised) == len(nonseed)


def test_a_newer_swap_restarts_the_pass_with_the_newest_models(r8):
    ds, order = r8
    eng = Engine(cfg(revisions="all", revision_chunk=50))
    window = order[:400]
    seed(eng, ds, by_class(ds, window, 2, {"earn", "acq"}))
    eng.process(docs(ds, window))
    eng.request_refit()
    chunk = eng.process([]).revisions
    assert len(chunk) == 50 and {a.model_version for a in chunk} == {2}
    eng.request_refit()   # v3 while the v2 pass is running
    rest = [a for c in drain(eng) for a in c]
    assert {a.model_version for a in rest} == {3}
    assert len({a.id for a in rest}) == len(rest) == len(window) - len(eng.seeds), "every document, by v3"
    revs = {a.id: a.revision for a in rest}
    assert all(revs[a.id] == 2 for a in chunk) and sum(r == 1 for r in revs.values()) == len(rest) - 50


def test_documents_that_leave_the_window_are_forgotten(r8):
    ds, order = r8
    eng = Engine(cfg(window_max_docs=150, revisions="all"))
    seed(eng, ds, by_class(ds, order[:150], 3))
    eng.process(docs(ds, order[:150]))
    eng.process(docs(ds, order[150:400]))
    assert len(eng._served) <= 150 and set(eng._served) <= set(eng.window.ids())
    eng.request_refit()
    revised = {a.id for c in drain(eng) for a in c}
    assert revised and revised <= set(eng.window.ids())


def test_first_fit_waits_for_the_seed_policy_and_a_provisional_model_is_revised(r8):
    ds, order = r8
    eng = Engine(cfg(min_seed_classes=3, min_seeds_per_class=2, max_buffered_docs=400))
    window = order[:300]
    seed(eng, ds, by_class(ds, window, 5, {"earn", "acq"}))
    assert eng.process(docs(ds, window)).assignments == []
    assert not eng.models and not eng.seed_policy_met(), "2 classes seeded: the first fit waits"
    out = eng.process(docs(ds, order[300:400])).assignments   # the buffer is full: fit anyway
    assert len(out) == 400 and all(a.provisional for a in out)
    assert eng.models["constrained-kmeans"].provisional
    assert all(m["provisional"] is True and m["revision"] == 0 for m in (a.to_message() for a in out))
    seed(eng, ds, by_class(ds, order[:400], 3, {"crude", "trade"}))
    assert eng.seed_policy_met()
    eng.request_refit()
    assert not eng.models["constrained-kmeans"].provisional
    revised = [a for c in drain(eng) for a in c]
    assert {a.id for a in revised} == {a.id for a in out} - set(dict(eng.seeds.items())), \
        "every provisional assignment is replaced"
    assert not any(a.provisional for a in revised) and {a.revision for a in revised} == {1}


def test_first_fit_as_soon_as_the_policy_is_met(r8):
    ds, order = r8
    eng = Engine(cfg(min_seed_classes=2, min_seeds_per_class=3))
    seed(eng, ds, by_class(ds, order[:200], 2, {"earn", "acq"}))
    assert eng.process(docs(ds, order[:200])).assignments == [] and not eng.models
    seed(eng, ds, by_class(ds, order[:200], 3, {"earn"})[2:3] + by_class(ds, order[:200], 3, {"acq"})[2:3])
    out = eng.process([]).assignments
    assert len(out) == 200 and not any(a.provisional for a in out)


def test_idle_and_growth_triggers(r8):
    ds, order = r8
    clock = Clock()
    eng = Engine(cfg(refit_idle_s=2.0, refit_growth=2.0, min_refit_interval_s=0.0, window_max_docs=5000), clock=clock)
    seed(eng, ds, by_class(ds, order[:100], 3))
    eng.process(docs(ds, order[:100]))
    assert eng.version == 1 and eng._last_fit_window == 100
    eng.process(docs(ds, order[100:190]))
    assert eng.version == 1, "190 < 2 x 100"
    eng.process(docs(ds, order[190:200]))
    assert eng.version == 2 and eng.telemetry.refit_triggers.labels("growth")._value.get() == 1
    eng.process(docs(ds, order[200:250]))
    clock.t += 1.0
    eng.process([])
    assert eng.version == 2, "not idle long enough"
    clock.t += 1.5
    eng.process([])
    assert eng.version == 3 and eng.telemetry.refit_triggers.labels("idle")._value.get() == 1
    clock.t += 10
    eng.process([])
    assert eng.version == 3, "nothing arrived since the idle refit"
    seed(eng, ds, by_class(ds, order[200:250], 1))
    clock.t += 10
    eng.process([])
    assert eng.version == 4, "new seeds since the last fit"


def test_an_idle_stream_fits_a_provisional_first_model(r8):
    ds, order = r8
    clock = Clock()
    eng = Engine(cfg(refit_idle_s=2.0, min_seed_classes=5), clock=clock)
    seed(eng, ds, by_class(ds, order[:150], 3, {"earn", "acq"}))
    eng.process(docs(ds, order[:150]))
    assert not eng.models
    clock.t += 2.5
    out = eng.process([]).assignments
    assert len(out) == 150 and all(a.provisional for a in out)


def test_primary_auto_follows_held_out_accuracy_with_hysteresis(r8):
    ds, order = r8
    algs = ["constrained-kmeans", "seeded-kmeans"]
    eng = Engine(cfg(algorithms=algs, revisions="changed"))
    assert eng.config.primary == "auto" and eng.primary == "constrained-kmeans"
    assert eng.telemetry.primary.labels("constrained-kmeans")._value.get() == 1
    window = order[:300]
    seed(eng, ds, by_class(ds, window, 3))
    out = eng.process(docs(ds, window)).assignments
    assert {a.algorithm for a in out if a.primary} == {eng.primary}

    def checks(ck, sk, n=100):
        for name, p in (("constrained-kmeans", ck), ("seeded-kmeans", sk)):
            eng._seed_checks[name].clear()
            eng._seed_checks[name].extend([True] * int(p * n) + [False] * (n - int(p * n)))

    start = eng.primary
    other = algs[1 - algs.index(start)]
    acc = {start: 0.80, other: 0.80 + PRIMARY_HYSTERESIS / 2}
    checks(acc["constrained-kmeans"], acc["seeded-kmeans"])
    assert min(len(eng._seed_checks[a]) for a in algs) >= PRIMARY_MIN_CHECKS
    eng.request_refit()
    eng.process([])
    assert eng.primary == start, "within the hysteresis: no flap"
    acc = {start: 0.70, other: 0.80}
    checks(acc["constrained-kmeans"], acc["seeded-kmeans"], n=36)
    eng.request_refit()
    eng.process([])
    assert eng.primary == start, "0.08 apart on 36 seeds: within two standard errors (1/6), no switch"
    checks(acc["constrained-kmeans"], acc["seeded-kmeans"], n=200)
    eng.request_refit()
    chunks = drain(eng)
    assert eng.primary == other
    assert eng.telemetry.primary.labels(other)._value.get() == 1
    assert eng.telemetry.primary.labels(start)._value.get() == 0
    revised = [a for c in chunks for a in c if a.primary]
    nonseed = {f"r{i}" for i in window} - set(dict(eng.seeds.items()))
    assert {a.id for a in revised} == nonseed and {a.algorithm for a in revised} == {other}, \
        "the new primary's verdict is re-emitted with primary: true for every document"
    fresh = eng.process(docs(ds, order[300:320])).assignments
    assert {a.algorithm for a in fresh if a.primary} == {other}


def test_primary_auto_before_enough_prequential_checks_uses_k_fold(r8):
    ds, order = r8
    eng = Engine(cfg(algorithms=["constrained-kmeans", "seeded-kmeans"]))
    seed(eng, ds, by_class(ds, order[:400], 6))
    eng.process(docs(ds, order[:400]))
    assert max(len(c) for c in eng._seed_checks.values()) < PRIMARY_MIN_CHECKS
    acc = eng.held_out_accuracy()
    assert acc == eng._kfold_accuracy and set(acc) == {"constrained-kmeans", "seeded-kmeans"}
    assert all(0.5 <= v <= 1.0 for v in acc.values()), "one fold of the seeds, predicted by a model fitted without it"
    n = min(eng._kfold_checks.values())
    assert n == len(eng.seeds) // 3, "one fold of the seeds"
    beats = acc["seeded-kmeans"] >= acc["constrained-kmeans"] + max(PRIMARY_HYSTERESIS, 1 / np.sqrt(n))
    assert eng.primary == ("seeded-kmeans" if beats else "constrained-kmeans")


def test_config_checks():
    with pytest.raises(ValueError, match="revisions"):
        EngineConfig(revisions="sometimes")
    with pytest.raises(ValueError, match="revision_chunk"):
        EngineConfig(revision_chunk=0)
    assert EngineConfig(algorithms=["constrained-kmeans"]).primary == "constrained-kmeans"
    assert EngineConfig(algorithms=["constrained-kmeans", "seeded-kmeans"]).primary == "auto"


def test_first_fit_waits_until_the_seeded_classes_stop_growing(r8):
    ds, order = r8
    eng = Engine(cfg(min_seed_classes=2, min_seeds_per_class=1, first_fit_stable_seeds=4))
    earn = by_class(ds, order, 6, {"earn"})
    acq = by_class(ds, order, 6, {"acq"})
    crude = by_class(ds, order, 1, {"crude"})
    others = [i for i in order if i not in set(earn + acq + crude)][:200]
    assert eng.process(docs(ds, others + earn + acq + crude)).assignments == []
    seed(eng, ds, earn[:2] + acq[:2])             # acq's first seed was new: 1 seed since
    assert eng.process([]).assignments == []
    assert eng.seed_policy_met() and not eng.seed_classes_stable() and not eng.models
    seed(eng, ds, earn[2:4])                      # 3 seeds since a new class
    seed(eng, ds, crude)                          # a new class: the count starts again
    seed(eng, ds, earn[4:6] + acq[2:3])           # 3
    assert eng.process([]).assignments == [] and not eng.models, "the seeded classes still grow"
    seed(eng, ds, acq[3:4])                       # 4 seeds in a row brought no new class
    out = eng.process([]).assignments
    assert eng.models and len(out) == 213
    assert eng.models["constrained-kmeans"].n_train == 213 and not any(a.provisional for a in out)


def test_no_second_first_fit_is_queued_while_the_first_runs(r8):
    ds, order = r8
    eng = Engine(cfg(background_refit=True, refit_every_docs=0))
    release = threading.Event()
    rounds = eng._refit_round

    def slow_round(snap):
        release.wait(DEADLINE)
        rounds(snap)

    eng._refit_round = slow_round
    seed(eng, ds, by_class(ds, order[:300], 3, {"earn", "acq"}))
    eng.process(docs(ds, order[:150]))
    assert eng.refitting
    for k in range(150, 450, 50):                 # documents keep arriving during the first fit
        eng.process(docs(ds, order[k:k + 50]))
    assert eng._refit_queued is None, "no refit queued on the first fit's small window"
    release.set()
    assert eng.wait_for_refit(DEADLINE)
    out = eng.process([]).assignments
    assert eng.version == 1 and {a.model_version for a in out} == {1} and len(out) == 450


def test_each_algorithm_model_is_published_as_soon_as_it_is_fitted(r8):
    ds, order = r8
    algs = ["constrained-kmeans", "seeded-kmeans"]
    eng = Engine(cfg(algorithms=algs))
    seed(eng, ds, by_class(ds, order[:300], 3))
    eng.process(docs(ds, order[:300]))
    assert {s.version for s in eng.models.values()} == {1}
    release = hold_back_fit(eng, "seeded-kmeans")
    eng.config.background_refit = True
    eng.request_refit()
    wait_for(lambda: eng.models["constrained-kmeans"].version == 2, DEADLINE, "constrained-kmeans' model v2", 0.02)
    assert eng.models["constrained-kmeans"].version == 2 and eng.models["seeded-kmeans"].version == 1, \
        "the fast algorithm's model serves before the slow one is fitted"
    out = eng.process(docs(ds, order[300:340])).assignments
    assert {(a.algorithm, a.model_version) for a in out} == {("constrained-kmeans", 2), ("seeded-kmeans", 1)}
    release.set()
    assert eng.wait_for_refit(DEADLINE) and eng.refit_count == 2
    out = eng.process(docs(ds, order[340:360])).assignments
    assert {(a.algorithm, a.model_version) for a in out} == {(a, 2) for a in algs}


def test_dlda_starts_cold_while_the_window_grows_or_the_classes_change(r8, monkeypatch):
    from streamsemi.algorithms.dlda import DLDA

    ds, order = r8
    warm: list[bool] = []
    fit = DLDA.fit

    def recording_fit(self, X, y, doc_ids=None, warm_start_from=None):
        warm.append(warm_start_from is not None)
        return fit(self, X, y, doc_ids=doc_ids, warm_start_from=warm_start_from)

    monkeypatch.setattr(DLDA, "fit", recording_fit)
    eng = Engine(cfg(algorithms=["d-lda"], window_max_docs=200, min_docs_first_refit=100,
                     algorithm_params={"d-lda": {"n_sweeps": 10, "warm_sweeps": 5, "n_topics": 16, "min_df": 2}}))
    pool = order[:400]
    seed(eng, ds, by_class(ds, pool, 3, {"earn", "acq"}))
    eng.process(docs(ds, pool[:100]))             # v1 on 100 documents
    eng.process(docs(ds, pool[100:200]))
    eng.request_refit()                           # v2: the window grew 100 -> 200 (full)
    eng.process(docs(ds, pool[200:260]))
    eng.request_refit()                           # v3: full window, v2 fitted on a full window, same classes
    seed(eng, ds, by_class(ds, pool[200:260], 1, {"crude", "trade", "money-fx", "interest", "ship", "grain"})[:1])
    eng.request_refit()                           # v4: a new seeded class
    assert eng.version == 4
    assert warm == [False, False, True, False]


def test_a_large_buffer_is_assigned_in_chunks_in_arrival_order(r8):
    ds, order = r8
    n = 2 * FLUSH_CHUNK + 300
    eng = Engine(cfg(max_buffered_docs=n + 100, min_docs_first_refit=n))
    seed(eng, ds, by_class(ds, order[:n], 3))
    assert eng.process(docs(ds, order[:n - 1])).assignments == []
    got = eng.process(docs(ds, order[n - 1:n])).assignments      # the first fit: one chunk is assigned
    assert eng.ready and len(got) == FLUSH_CHUNK and len(eng.buffer) == n - FLUSH_CHUNK
    got += eng.process(docs(ds, order[n:n + 5])).assignments     # fresh documents wait behind the buffer
    assert len(got) == 2 * FLUSH_CHUNK
    while eng.buffer:
        got += eng.process([]).assignments
    assert [a.id for a in got] == [f"r{i}" for i in order[:n + 5]]
    assert eng.buffer_bytes == 0


def test_a_backlog_waits_for_the_growth_refit_fitted_on_it(r8):
    ds, order = r8
    eng = Engine(cfg(background_refit=True, refit_growth=2.0, max_buffered_docs=5000))
    gates = {1: threading.Event(), 2: threading.Event()}
    rounds = eng._refit_round

    def slow_round(snap):
        gates[snap.version].wait(DEADLINE)
        rounds(snap)

    eng._refit_round = slow_round
    seed(eng, ds, by_class(ds, order[:2500], 3))
    eng.process(docs(ds, order[:100]))            # the first fit starts on 100 documents
    for k in range(100, 2500, 400):               # the backlog arrives while it runs
        eng.process(docs(ds, order[k:k + 400]))
    gates[1].set()
    assert eng.wait_for_refit(DEADLINE) and eng.version == 1
    out = eng.process([]).assignments             # v1 is in; the growth refit on 2,500 documents starts
    assert eng.version == 2 and eng.refitting and eng.holding_backlog
    assert out == [] and len(eng.buffer) == 2500, "the backlog is not labelled by the model fitted on 100 documents"
    fresh = eng.process(docs(ds, order[2500:2510])).assignments
    assert fresh == [] and len(eng.buffer) == 2510
    gates[2].set()
    assert eng.wait_for_refit(DEADLINE)
    got = []
    while eng.buffer:
        got += eng.process([]).assignments
    assert len(got) == 2510 and {a.model_version for a in got} == {2}
    assert [a.id for a in got] == [f"r{i}" for i in order[:2510]]


def test_first_models_serve_while_the_primary_probes_run(r8):
    ds, order = r8
    eng = Engine(cfg(algorithms=["constrained-kmeans", "seeded-kmeans"], background_refit=True))
    release = threading.Event()
    probe = eng._holdout_accuracy
    probing = threading.Event()

    def slow_probe(name, snap):
        probing.set()
        release.wait(DEADLINE)
        return probe(name, snap)

    eng._holdout_accuracy = slow_probe
    seed(eng, ds, by_class(ds, order[:300], 3))
    eng.process(docs(ds, order[:300]))
    assert probing.wait(DEADLINE) and eng.refitting
    out = eng.process([]).assignments
    assert eng.ready and len(out) == 2 * 300, "the first models serve before the k-fold probes end"
    assert not eng._kfold_accuracy
    served = eng.models
    release.set()
    assert eng.wait_for_refit(DEADLINE)
    assert set(eng._kfold_accuracy) == {"constrained-kmeans", "seeded-kmeans"}
    assert eng.models is not served and eng.models == served, "same models, a new dict: the primary is chosen again"


def test_no_primary_probes_in_a_round_a_growth_refit_follows_at_once(r8):
    ds, order = r8
    eng = Engine(cfg(algorithms=["constrained-kmeans", "seeded-kmeans"], background_refit=True, refit_growth=2.0,
                     max_buffered_docs=5000))
    gate = threading.Event()
    rounds = eng._refit_round

    def slow_first(snap):
        if snap.version == 1:
            gate.wait(DEADLINE)
        rounds(snap)

    eng._refit_round = slow_first
    seed(eng, ds, by_class(ds, order[:1000], 3))
    eng.process(docs(ds, order[:100]))            # round 1 on 100 documents
    for k in range(100, 1000, 300):               # a backlog arrives during it
        eng.process(docs(ds, order[k:k + 300]))
    gate.set()
    assert eng.wait_for_refit(DEADLINE) and eng.version == 1
    assert not eng._kfold_accuracy, "round 1 skipped its probes: the growth round follows at once"
    eng.process([])                               # the growth round on 1,000 documents starts and probes
    assert eng.version == 2 and eng.wait_for_refit(DEADLINE)
    assert set(eng._kfold_accuracy) == {"constrained-kmeans", "seeded-kmeans"}
    got = []
    while eng.buffer:
        got += eng.process([]).assignments
    assert {a.model_version for a in got} == {2}, "the backlog waited for the growth round's models"


def test_a_revision_pass_predicts_only_with_the_models_that_changed(r8):
    """After one algorithm's swap the pass re-judges the window with that algorithm alone: the others' verdicts
    are from their current models already (re-predicting with every algorithm would be wasted work)."""
    ds, order = r8
    algs = ["constrained-kmeans", "seeded-kmeans"]
    eng = Engine(cfg(algorithms=algs))
    seed(eng, ds, by_class(ds, order[:300], 3))
    eng.process(docs(ds, order[:300]))
    eng.process(docs(ds, order[300:360]))  # judged by the v1 models, outside their training snapshot
    rows_predicted = {a: 0 for a in algs}

    def counting(name):
        model = eng.models[name].model
        real = model.predict_proba

        def predict_proba(X):
            rows_predicted[name] += X.shape[0]
            return real(X)
        model.predict_proba = predict_proba

    release = hold_back_fit(eng, "seeded-kmeans")
    eng._run_seed_checks = lambda force=False: None  # only the revision pass predicts here
    counting("seeded-kmeans")
    eng.config.background_refit = True
    seed(eng, ds, by_class(ds, order[:360], 6))
    eng.request_refit()
    wait_for(lambda: eng.models["constrained-kmeans"].version == 2, DEADLINE, "constrained-kmeans' model v2", 0.02)
    assert eng.models["seeded-kmeans"].version == 1
    first_pass = [a for c in drain(eng) for a in c]
    assert first_pass and {(a.algorithm, a.model_version) for a in first_pass} == {("constrained-kmeans", 2)}
    assert rows_predicted["seeded-kmeans"] == 0, "seeded-kmeans' verdicts are its current model's: not predicted again"
    release.set()
    assert eng.wait_for_refit(DEADLINE) and eng.models["seeded-kmeans"].version == 2
    counting("constrained-kmeans")
    second_pass = [a for c in drain(eng) for a in c]
    assert second_pass and {(a.algorithm, a.model_version) for a in second_pass} == {("seeded-kmeans", 2)}
    assert rows_predicted["constrained-kmeans"] == 0
    # every non-seed verdict is what a full re-judgement with the current models gives
    ids, rows = eng.window.ids(), eng.window.rows()
    full = eng._assign_all(eng.models, rows_to_csr(rows, 2**16), rows, ids)
    for k, name in enumerate(algs):
        assert all(eng._served[d].verdicts[k][:4:3] == (v[3], 2) for d, v in zip(ids, full[name], strict=True)
                   if d not in eng.seeds), name


@pytest.mark.parametrize("n_new_clusters", [0, "auto"])
def test_the_workers_constrained_kmeans_keeps_its_seed_weight_choice_on_a_full_window(r8, n_new_clusters, monkeypatch):
    ds, order = r8
    eng = Engine(cfg(window_max_docs=300, min_docs_first_refit=300, n_new_clusters=n_new_clusters))
    pool = order[:700]
    first = by_class(ds, pool[:300], 6, {"earn", "acq", "crude", "trade"})
    assert len(first) == 24
    seed(eng, ds, first)

    from streamsemi.algorithms.constrained_kmeans import ConstrainedKMeans

    sent = []
    fit = ConstrainedKMeans.fit

    def recording_fit(self, X, y, doc_ids=None, warm_start_from=None):
        if warm_start_from is not None:   # the previous model's view, not its centroids
            sent.append(hasattr(warm_start_from, "cluster_centers_"))
        return fit(self, X, y, doc_ids=doc_ids, warm_start_from=warm_start_from)

    monkeypatch.setattr(ConstrainedKMeans, "fit", recording_fit)

    def choice():
        m = eng.models["constrained-kmeans"].model
        m = getattr(m, "known_model_", m)   # calibrated discovery: the seeded classes' model
        assert m.seed_weight == "held-out", "the worker's default"
        return m.seed_weight_age_

    eng.process(docs(ds, pool[:300]))          # v1 on a full window: chosen
    assert eng.version == 1 and choice() == 0
    eng.process(docs(ds, pool[300:360]))
    eng.request_refit()                        # v2: 20% of the window new, the same seeds: kept
    assert eng.version == 2 and choice() == 1
    added = by_class(ds, pool[300:360], 8, {"earn", "acq"})
    assert len(added) == 16
    seed(eng, ds, added)
    eng.request_refit()                        # v3: 16 seeds more than the 24 of the choice: chosen afresh
    assert eng.version == 3 and choice() == 0
    assert sent and not any(sent)
