"""The in-process engine: buffering, seeds, refits, fallback, drift, bounds."""

from __future__ import annotations

import numpy as np
import pytest

from streamsemi.core.datasets import load
from streamsemi.core.messages import Document
from streamsemi.core.store import rows_to_csr
from streamsemi.engine import Engine, EngineConfig


@pytest.fixture(scope="module")
def r8():
    ds = load("reuters-r8")
    order = np.random.default_rng(3).permutation(len(ds))
    return ds, [int(i) for i in order]


def docs(ds, idx, prefix="r"):
    return [Document(id=f"{prefix}{i}", text=ds.texts[i]) for i in idx]


def sample(metric, **labels):
    for fam in metric.collect():
        for s in fam.samples:
            if s.name.endswith("_total") or s.name == fam.name:
                if all(s.labels.get(k) == v for k, v in labels.items()):
                    return s.value
    return 0.0


def cfg(**kw):
    base = dict(algorithms=["constrained-kmeans", "seeded-kmeans"], background_refit=False, n_features=2**16,
                refit_every_docs=0, min_docs_first_refit=100, drift_detection=False,
                min_seed_classes=2, min_seeds_per_class=1, first_fit_stable_seeds=0, refit_growth=0, refit_idle_s=0)  # test_revisions.py has these
    base.update(kw)
    return EngineConfig(**base)


def test_documents_before_the_first_model_are_buffered_then_assigned_once(r8):
    ds, order = r8
    eng = Engine(cfg(min_docs_first_refit=150))
    first = order[:120]
    assert eng.process(docs(ds, first)).assignments == []
    assert len(eng.buffer) == 120 and not eng.ready
    for i in first[:40]:
        eng.label(f"r{i}", [ds.labels[i]])
    out = eng.process(docs(ds, order[120:160])).assignments
    assert eng.ready and not eng.buffer
    ids = [(a.id, a.algorithm) for a in out]
    assert len(ids) == len(set(ids)) == 2 * 160
    assert sum(a.primary for a in out) == 160 and {a.model_version for a in out} == {1}


def test_labels_before_and_after_documents_and_with_text(r8):
    ds, order = r8
    eng = Engine(cfg())
    a, b, c = order[:3]
    eng.label(f"r{a}", [ds.labels[a]], offset=10)                    # before its document
    assert len(eng.pending) == 1 and len(eng.seeds) == 0
    eng.process(docs(ds, [a, b]))
    assert len(eng.pending) == 0 and f"r{a}" in eng.seeds
    eng.label(f"r{b}", ["custom"], offset=11)                           # after its document
    eng.label("elsewhere", ["grain"], text=ds.texts[c])                 # self-contained seed
    assert {f"r{b}", "elsewhere"} <= set(dict(eng.seeds.items()))
    resolved = eng.drain_resolved()
    assert [(r.id, r.label_offset) for r in resolved] == [(f"r{a}", 10), (f"r{b}", 11)]
    assert resolved[0].text == ds.texts[a], "resolved seeds carry the text so other workers and restarts get them"
    assert eng.drain_resolved() == []
    # a resolved message older than a later unlabel is ignored on replay
    fresh = Engine(cfg())
    fresh.label("x", ["grain"], offset=1)
    fresh.unlabel("x", offset=2)
    assert fresh.label("x", ["grain"], text=ds.texts[a], origin="resolved", label_offset=1) == []
    assert "x" not in fresh.seeds
    # ... but a resolved message completes a held label
    again = Engine(cfg())
    again.label("y", ["grain"], offset=5)
    again.label("y", ["grain"], text=ds.texts[a], origin="resolved", label_offset=5)
    assert "y" in again.seeds and "y" not in again.pending


def test_unlabel_expiry_overflow_and_class_cap(r8):
    ds, order = r8
    now = [1000.0]
    eng = Engine(cfg(pending_label_ttl_s=10, max_pending_labels=2, max_classes=3), clock=lambda: now[0])
    eng.process(docs(ds, order[:5]))
    eng.label(f"r{order[0]}", ["a"])
    assert eng.unlabel(f"r{order[0]}") and f"r{order[0]}" not in eng.seeds
    eng.label("p1", ["a"])
    eng.label("p2", ["b"])
    out = eng.label("p3", ["c"])
    assert [(op["id"], rej.reason) for op, rej in out] == [("p1", "pending_overflow")]
    now[0] += 11
    eng.tick()
    assert sorted((op["id"], rej.reason) for op, rej in eng.drain_dead()) == [("p2", "label_expired"), ("p3", "label_expired")]
    for k, lab in enumerate(["a", "b", "c"]):
        assert eng.label(f"r{order[k + 1]}", [lab]) == []
    rej = eng.label(f"r{order[4]}", ["d"])
    assert rej and rej[0][1].reason == "invalid_label" and "max_classes=3" in rej[0][1].detail


def test_no_terms_documents_are_rejected():
    eng = Engine(cfg())
    res = eng.process([Document(id="e", text="the of and !!!")])
    assert [(d.id, r.reason) for d, r in res.rejected] == [("e", "no_terms")] and len(eng.window) == 0


def test_refit_skipped_without_two_seeded_classes(r8):
    ds, order = r8
    eng = Engine(cfg(min_docs_first_refit=10))
    eng.label(f"r{order[0]}", ["earn"])
    eng.process(docs(ds, order[:20]))
    eng.request_refit()
    assert not eng.models and sample(eng.telemetry.refits_skipped, reason="not_enough_seeds") >= 1


def test_failing_algorithm_uses_the_fallback_and_is_reported(r8):
    ds, order = r8
    eng = Engine(cfg(algorithm_params={"seeded-kmeans": {"n_new_clusters": 10**6}}))
    for i in order[:30]:
        eng.label(f"r{i}", [ds.labels[i]])
    out = eng.process(docs(ds, order[:150])).assignments
    seeded = [a for a in out if a.algorithm == "seeded-kmeans"]
    assert len(seeded) == 150 and all(a.fallback for a in seeded)
    assert not any(a.fallback for a in out if a.algorithm == "constrained-kmeans")
    assert "larger than the number of documents" in eng.last_refit_error["seeded-kmeans"]
    assert sample(eng.telemetry.refits, algorithm="seeded-kmeans", outcome="failure") == 1
    assert seeded[0].to_message()["fallback"] is True


def test_window_bound_keeps_seeds_that_left_the_window(r8):
    ds, order = r8
    eng = Engine(cfg(window_max_docs=100, min_docs_first_refit=50))
    for i in order[:20]:
        eng.label(f"r{i}", [ds.labels[i]])
    eng.process(docs(ds, order[:300]))
    assert len(eng.window) == 100 and len(eng.seeds) == 20
    snap = eng._snapshot("test")
    assert snap.X.shape[0] == 100 + sum(1 for i in order[:20] if f"r{i}" not in eng.window)
    assert sum(1 for lb in snap.seed_labels if lb) == 20


def test_background_refit_swaps_models_while_documents_flow(r8):
    ds, order = r8
    eng = Engine(cfg(background_refit=True, refit_every_docs=200, min_docs_first_refit=100))
    for i in order[:60]:
        eng.label(f"r{i}", [ds.labels[i]])
    seen = {}  # each document's first verdict per algorithm
    served_during_a_refit = 0  # fresh documents assigned while a background refit was running
    # the primary's first model may serve alone: the other algorithm's first verdicts of those
    # documents then come with its first model, in the revision pass (docs/messages.md)
    for k in range(0, 1200, 100):
        refitting = eng.refitting
        res = eng.process(docs(ds, order[k:k + 100]))
        fresh = {f"r{i}" for i in order[k:k + 100]}
        if refitting:
            served_during_a_refit += sum(1 for a in res.assignments if a.id in fresh)
        for a in res.assignments + res.revisions:
            seen.setdefault((a.id, a.algorithm), a.model_version)
        if k in (200, 500, 800):  # let the running refit end, however slow the machine: the next batches meet its model
            assert eng.wait_for_refit(300)
    assert served_during_a_refit > 0, "documents are assigned while the next model fits, not held for it"
    assert eng.wait_for_refit(300)
    for _ in range(200):  # the flush and the revision pass end in a bounded number of calls, not in a time
        for a in eng.flush() + eng.process([]).revisions:
            seen.setdefault((a.id, a.algorithm), a.model_version)
        eng.tick()
        assert eng.wait_for_refit(300)
        if len(seen) == 2400:
            break
    assert len(seen) == 2400
    versions = [seen[(f"r{i}", "constrained-kmeans")] for i in order[:1200]]
    other = [seen[(f"r{i}", "seeded-kmeans")] for i in order[:1200]]
    # each algorithm's model is published when it is fitted: one version per batch and algorithm
    for k in range(0, 1200, 100):
        assert len(set(versions[k:k + 100])) == 1 and len(set(other[k:k + 100])) == 1, "one version per batch"
    assert other == sorted(other) and other[0] >= 1
    assert versions == sorted(versions) and versions[0] >= 1, "versions never go back along the stream"
    assert len(set(versions)) >= 3 and max(versions) <= min(s.version for s in eng.models.values())
    # the agreement gauge: share of window documents the old and the new model put in the same class
    assert eng.wait_for_refit(300) and not eng.refitting
    old = eng.models["constrained-kmeans"]
    eng.request_refit()
    assert eng.wait_for_refit(300) and eng.models["constrained-kmeans"] is not old
    X = rows_to_csr(eng.window.rows(), eng.config.n_features)
    idx = np.linspace(0, X.shape[0] - 1, min(X.shape[0], 1000)).astype(int)
    expected = np.mean(old.model.predict(X[idx]) == eng.models["constrained-kmeans"].model.predict(X[idx]))
    assert sample(eng.telemetry.agreement, algorithm="constrained-kmeans") == pytest.approx(expected)


def test_drift_triggers_an_early_refit(r8):
    ds, order = r8
    ng = load("20newsgroups")
    eng = Engine(cfg(drift_detection=True, drift_delta=0.01, min_refit_interval_s=0.0, algorithms=["constrained-kmeans"]))
    for i in order[:60]:
        eng.label(f"r{i}", [ds.labels[i]])
    for lo in range(0, 800, 100):  # polls: after the first fit, fresh R8 documents set the detector's baseline
        eng.process(docs(ds, order[lo:lo + 100]))
    assert sample(eng.telemetry.refit_triggers, trigger="drift") == 0, "no drift within one topic mix"
    before = eng.refit_count
    ng_idx = np.random.default_rng(0).permutation(len(ng))[:800]
    for lo in range(0, 800, 100):
        eng.process([Document(id=f"n{i}", text=ng.texts[i]) for i in ng_idx[lo:lo + 100]])
    assert sample(eng.telemetry.refit_triggers, trigger="drift") >= 1 and eng.refit_count > before


def test_no_drift_refit_on_a_stationary_stream_across_refits():
    """Drift is a change of the fresh documents' scores under one model. The detector ran across models:
    the first model's scores of the buffered documents it was fitted on, and each swap's change of
    confidence, read as drift on a stream whose topics do not change (2 drift refits per 6,000 20NG
    documents here before)."""
    ng = load("20newsgroups")
    order = np.random.default_rng(0).permutation(len(ng))[:6000]
    eng = Engine(cfg(drift_detection=True, min_refit_interval_s=0.0, algorithms=["constrained-kmeans"],
                     refit_every_docs=2000, min_docs_first_refit=2000, window_max_docs=10000))
    rng = np.random.default_rng(1)
    for lo in range(0, len(order), 300):
        idx = order[lo:lo + 300]
        for i in idx:
            if rng.random() < 0.05:
                eng.label(f"n{i}", [str(ng.labels[i])], text=ng.texts[i])
        eng.process([Document(id=f"n{i}", text=ng.texts[i]) for i in idx])
    assert sample(eng.telemetry.refit_triggers, trigger="docs") >= 2, "refits swapped models during the stream"
    assert sample(eng.telemetry.refit_triggers, trigger="drift") == 0


def test_prequential_seed_accuracy(r8):
    ds, order = r8
    eng = Engine(cfg(algorithms=["constrained-kmeans"]))
    for i in order[:60]:
        eng.label(f"r{i}", [ds.labels[i]])
    eng.process(docs(ds, order[:400]))
    for i in order[400:500]:
        eng.label(f"r{i}", [ds.labels[i]], text=ds.texts[i])
    eng.flush()
    acc = sample(eng.telemetry.seed_accuracy, algorithm="constrained-kmeans")
    assert 0.5 < acc <= 1.0


def test_refit_done_carries_what_each_fit_chose_and_ensemble_weights_are_exported(r8, caplog, monkeypatch):
    """FSL's rounds and the ensemble's member weights reach the log (``fit``) and the ensemble's weights
    the ``streamsemi_ensemble_member_weight`` gauge; a summary that fails never fails the refit."""
    import logging

    from streamsemi.algorithms.fsl import FSL

    caplog.set_level(logging.INFO, logger="streamsemi.engine")
    ds, order = r8
    algs = ["constrained-kmeans", "fsl-ck", "ensemble"]
    eng = Engine(cfg(algorithms=algs, min_docs_first_refit=300,
                     algorithm_params={"ensemble": {"members": ["constrained-kmeans", "fsl-ck"]}}))
    for i in order[:60]:
        eng.label(f"r{i}", [ds.labels[i]])
    eng.process(docs(ds, order[:300]))
    done = {r.fields["algorithm"]: r.fields for r in caplog.records if r.getMessage() == "refit_done"}
    assert set(done) == set(algs)
    # the worker's constrained k-means names the classes it gave several centroids (R8: the large ones)
    several = done["constrained-kmeans"]["fit"]["prototypes"]
    assert several and set(several) <= {"earn", "acq"} and all(n > 1 for n in several.values()), several
    fsl = eng.models["fsl-ck"].model
    assert done["fsl-ck"]["fit"] == fsl.fit_summary() and done["fsl-ck"]["fit"]["rounds"] == fsl.rounds_
    ens = eng.models["ensemble"].model
    weights = done["ensemble"]["fit"]["weights"]
    assert weights == ens.fit_summary()["weights"] and set(weights) == {"constrained-kmeans", "fsl-ck"}
    for member, w in zip(ens.members_, ens.weights_, strict=True):
        assert sample(eng.telemetry.member_weight, algorithm="ensemble", member=member) == pytest.approx(w, abs=5e-5)
    assert sample(eng.telemetry.member_weight, algorithm="fsl-ck") == 0.0, "only ensembles export weights"

    def broken(self):
        raise RuntimeError("no summary")

    monkeypatch.setattr(FSL, "_fit_summary", broken)
    caplog.clear()
    eng.request_refit()
    done = {r.fields["algorithm"]: r.fields for r in caplog.records if r.getMessage() == "refit_done"}
    assert done["fsl-ck"]["fit"] == {"error": "RuntimeError: no summary"}
    assert eng.models["fsl-ck"].version == 2 and not eng.models["fsl-ck"].fallback
    assert sample(eng.telemetry.refits, algorithm="fsl-ck", outcome="success") == 2


def test_the_worker_model_gives_a_labelled_story_s_near_copy_its_label(r8):
    """The daemon's constrained k-means takes seeds as exemplars (``seed_exemplars``): a story the
    centroids put in the wrong class is labelled, and a near copy arriving after the refit gets the
    label; with ``seed_exemplars = false`` the refitted centroids still misplace some of the copies."""
    ds, order = r8
    window, seeds = order[:600], order[:600:20]

    def engine(params):
        eng = Engine(cfg(algorithms=["constrained-kmeans"], min_docs_first_refit=600, algorithm_params=params))
        for i in seeds:
            eng.label(f"r{i}", [ds.labels[i]])
        eng.process(docs(ds, window))
        return eng

    def served(eng, i, tag):
        text = ds.texts[i] + " the company said"
        out = eng.process([Document(id=f"copy-{tag}-{i}", text=text)]).assignments
        return next(a.cluster for a in out if a.primary)

    plain = engine({"constrained-kmeans": {"seed_exemplars": False}})
    assert eng_version(plain) == 1
    wrong = [i for i in window if i not in seeds and served(plain, i, "probe") != ds.labels[i]]
    assert len(wrong) >= 5, "the sample must have stories the centroids misplace"
    ex = engine({})
    assert ex.models["constrained-kmeans"].model.seed_exemplars is True, "the worker's default"
    picked = wrong[:10]
    for eng in (plain, ex):
        for i in picked:
            eng.label(f"r{i}", [ds.labels[i]])
        eng.request_refit()
        assert eng_version(eng) == 2
    assert [served(ex, i, "after") for i in picked] == [ds.labels[i] for i in picked]
    still = [i for i in picked if served(plain, i, "after") != ds.labels[i]]
    assert len(still) >= 2, f"without exemplars some copies keep the centroids' wrong class: {still}"


def eng_version(eng):
    return eng.models["constrained-kmeans"].version
