"""A new model's scores of its own training snapshot are computed once and read by the revision pass.

The revision pass after a swap, cluster tracking, explanations, the agreement gauge and the
suggestion ranker ask the new model about the documents it was fitted on; the engine
computes those scores once right after the fit (in the fit process when the worker has
one) and must serve exactly the verdicts a fresh prediction would give.
"""

from __future__ import annotations

import numpy as np
import pytest

from streamsemi.algorithms.constrained_kmeans import ConstrainedKMeans
from streamsemi.core.datasets import load
from streamsemi.core.messages import Document
from streamsemi.core.store import Row, rows_to_csr
from streamsemi.engine import Engine, EngineConfig

N_FEATURES = 2**16


@pytest.fixture(scope="module")
def r8():
    ds = load("reuters-r8")
    order = [int(i) for i in np.random.default_rng(11).permutation(len(ds))]
    return ds, order


def _engine(algorithms):
    return Engine(EngineConfig(
        algorithms=algorithms, background_refit=False, n_features=N_FEATURES, refit_every_docs=0, refit_growth=0,
        refit_idle_s=0, min_docs_first_refit=100, min_seed_classes=2, min_seeds_per_class=2, first_fit_stable_seeds=0,
        drift_detection=False, revisions="all", revision_chunk=100, explain_words=0))


def _label(eng, ds, idx, multilabel):
    for i in idx:
        eng.label(f"r{i}", [ds.labels[i]])


def _per_class(ds, idx, n):
    counts, out = {}, []
    for i in idx:
        if counts.get(ds.labels[i], 0) < n:
            counts[ds.labels[i]] = counts.get(ds.labels[i], 0) + 1
            out.append(i)
    return out


def _revisions(eng):
    out = []
    for _ in range(1000):
        got = eng.process([]).revisions
        if not got and not eng.revisions_pending:
            return out
        out.extend(got)
    raise AssertionError("the revision pass did not end")


def _key(a):
    return (a.id, a.algorithm, a.model_version, a.revision, a.label, a.cluster, a.new_cluster, a.primary)


def _same(xs, ys):
    """Same verdicts; scores equal up to the summation order of one batched product against chunks of it."""
    xs, ys = sorted(xs, key=_key), sorted(ys, key=_key)
    assert [_key(a) for a in xs] == [_key(b) for b in ys]
    for a, b in zip(xs, ys, strict=True):
        assert a.labels.keys() == b.labels.keys() and abs(a.score - b.score) < 1e-6
        assert all(abs(a.labels[k] - b.labels[k]) <= 1.001e-6 for k in a.labels)


@pytest.mark.parametrize("algorithms", [["constrained-kmeans", "seeded-kmeans"], ["pseudo-lsc"]])
def test_the_revision_pass_reads_the_snapshot_scores_and_serves_what_a_prediction_would(r8, algorithms, monkeypatch):
    ds, order = r8
    window = order[:500]
    runs = {}
    for scored in (True, False):
        eng = _engine(algorithms)
        _label(eng, ds, _per_class(ds, window, 2), False)
        eng.process([Document(id=f"r{i}", text=ds.texts[i]) for i in window])
        _label(eng, ds, _per_class(ds, window, 6), False)
        eng.request_refit()  # v2, swapped at once (background_refit=False): the pass revises the window
        assert all(s.version == 2 for s in eng.models.values())
        if scored:
            assert all(s.scores is not None and s.scores.proba.shape[0] == len(window) for s in eng.models.values())
        else:
            for s in eng.models.values():
                s.scores = None  # as a model adopted from the models topic: the pass predicts
        predicted = []
        for s in eng.models.values():
            model = s.model
            orig = model.predict_proba
            monkeypatch.setattr(model, "predict_proba", lambda X, orig=orig, rec=predicted: (rec.append(X.shape[0]), orig(X))[1])
        runs[scored] = (_revisions(eng), sum(predicted))
    (with_scores, rows_predicted), (without, rows_without) = runs[True], runs[False]
    assert len(with_scores) > 100
    _same(with_scores, without)
    assert rows_predicted == 0, "every revised document was in the snapshot: no prediction on the polling thread"
    assert rows_without >= len({a.id for a in without}), "the comparison run did predict"


def test_a_document_whose_row_changed_since_the_snapshot_is_predicted_again(r8):
    ds, order = r8
    window = order[:300]
    eng = _engine(["constrained-kmeans"])
    _label(eng, ds, _per_class(ds, window, 4), False)
    eng.process([Document(id=f"r{i}", text=ds.texts[i]) for i in window])
    eng.request_refit()
    slot = eng.models["constrained-kmeans"]
    sc = slot.scores
    doc_id = f"r{window[0]}"
    entry = eng.window.get(doc_id)
    k = sc.index[doc_id]
    assert sc.rows[k] is entry.row
    np.testing.assert_array_equal(sc.proba[k], slot.model.predict_proba(rows_to_csr([entry.row], N_FEATURES))[0])
    # the same id with another row (sent again with another text): not the snapshot's scores
    other = next(i for i in order[300:] if ds.labels[i] != ds.labels[window[0]])
    X_other = eng.featurizer.transform([ds.texts[other]], update_sketch=False)
    new_row = Row.from_csr(X_other, 0)
    copy_row = Row(entry.row.indices.copy(), entry.row.data.copy())
    assert sc.positions([doc_id, doc_id, "unknown"], [entry.row, new_row, entry.row]).tolist() == [k, -1, -1]
    assert sc.positions([doc_id], [copy_row]).tolist() == [-1], "an equal row that is not the snapshot's object"
    X = rows_to_csr([entry.row, new_row], N_FEATURES)
    verdicts = eng._assign_all(eng.models, X, [entry.row, new_row], [doc_id, doc_id])["constrained-kmeans"]
    expected = eng._assign_with(slot, X)  # predicted, no snapshot scores
    assert verdicts == expected
    P = slot.model.predict_proba(X)
    assert not np.allclose(P[0], P[1]), "the test needs two rows the model scores differently"


def test_a_fit_without_snapshot_scores_still_serves(r8, monkeypatch):
    """Scoring the snapshot is best effort: when it fails the model serves and the pass predicts."""
    import streamsemi.engine as engine_mod

    ds, order = r8
    window = order[:300]
    eng = _engine(["constrained-kmeans"])

    def broken(*a, **k):
        raise MemoryError("no room to score")

    monkeypatch.setattr(engine_mod, "score_rows", broken)
    _label(eng, ds, _per_class(ds, window, 4), False)
    first = eng.process([Document(id=f"r{i}", text=ds.texts[i]) for i in window]).assignments
    assert len(first) == len(window) and eng.models["constrained-kmeans"].scores is None
    eng.request_refit()
    revised = _revisions(eng)
    assert len(revised) == len(window) - len(eng.seeds)
    assert isinstance(eng.models["constrained-kmeans"].model, ConstrainedKMeans)
