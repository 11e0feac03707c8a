"""Stream mode: replay a draw's documents through the daemon's engine, in process.

The documents of a draw are replayed in time order (Reuters-21578 by date;
corpora without dates in a seeded random order) through
:class:`streamsemi.engine.Engine`, the same window, seed store and refit code the
Kafka worker runs. A seed's label is sent (``Engine.label``) just before its
document (``Engine.process``), so labels are revealed as the stream passes.
Refits run synchronously (``background_refit=False``) and drift-triggered refits
are off, so a replay is deterministic.

Two figures per method:

* **prequential**: every non-seed document scored by the model that existed when
  it arrived (the engine assigns a batch before refitting on it). Documents that
  arrived before the first model existed (the engine buffers them and assigns
  them with the first model, which was fitted on them) are left out, for every
  method alike; their number is ``n_warmup``.
* **final**: after the stream, one more refit, then the final model assigns every
  non-seed document of the draw (the ones that left the window too).

The streaming baseline is River's online multinomial naive Bayes
(``BagOfWords | MultinomialNB``): it predicts each document before it passes and
learns from each seed as it passes (``learn_one``); its final figure is the last
model's prediction on every document. It is single-label only.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from streamsemi.evaluation import metrics
from streamsemi.evaluation.errors import EvaluationError
from streamsemi.evaluation.protocols import Draw, PreparedDataset, Protocol, draw_rng, make_draw
from streamsemi.evaluation.runner import (
    _STATE,
    MULTILABEL_ALGORITHMS,
    RunOutcome,
    aligned_scores,
    blas_threads,
    indicator,
    score_single,
)

RIVER_BASELINE = "river-mnb"
#: What users are served (single-label corpora): first emission, latest label with revisions, batch on the same draw.
SERVED_MODES = ("first", "latest", "batch")
WARMUP = object()


@dataclass
class StreamSettings:
    """Engine settings of a replay.

    Attributes
    ----------
    batch_size : int
        Documents per ``Engine.process`` call.
    refit_every_docs : int
        Refit after this many new documents.
    window_max_docs : int
        Window size (documents).
    min_docs_first_refit : int
        Documents needed before the first model.
    """

    batch_size: int = 20
    refit_every_docs: int = 500
    window_max_docs: int = 10000
    min_docs_first_refit: int = 200


def stream_order(data: PreparedDataset, draw: Draw, rng: np.random.Generator) -> np.ndarray:
    """Positions (into ``draw.rows``) in replay order: by date when the corpus has dates."""
    if data.dates is not None:
        dates = [data.dates[r] for r in draw.rows]
        keyed = [(d is None, d.timestamp() if d is not None else 0.0, k) for k, d in enumerate(dates)]
        return np.array([k for _, _, k in sorted(keyed)], dtype=np.int64)
    return rng.permutation(draw.rows.size)


def _score(protocol: Protocol, data: PreparedDataset, draw: Draw, positions: Sequence[int],
           preds: Sequence[Any] | None = None, scores: np.ndarray | None = None) -> dict[str, float]:
    y_true = [draw.y_true[k] for k in positions]
    if data.spec.kind == "multi":
        return {"macro_auc": metrics.macro_auc(indicator(y_true, draw.classes), scores)}
    return score_single(protocol, y_true, list(preds), draw.known)


def replay_engine(protocol: Protocol, data: PreparedDataset, draw: Draw, order: np.ndarray,
                  algorithm: str, run: int, settings: StreamSettings
                  ) -> tuple[dict[str, float], dict[str, float], dict[str, Any]]:
    """Replay the draw through an :class:`~streamsemi.engine.Engine` running ``algorithm``.

    Returns
    -------
    prequential, final : dict
        Metric name -> value.
    info : dict
        ``seconds`` (whole replay), ``refits``, ``n_warmup``, ``fallback`` (fraction
        of prequential assignments made by the fallback model),
        ``prequential_positions`` (the positions scored prequentially) and, for
        single-label corpora, what users are served: ``first`` (the first emission of
        every non-seed document, buffered ones included), ``latest`` (its latest
        assignment at the end of the stream, revisions included, after one more refit
        as an idle worker does) and ``batch`` (the algorithm fitted once on the whole
        draw with the same seeds), each a metric dict, and ``revisions`` (revised
        assignments emitted).
    """
    from streamsemi.core.messages import Document
    from streamsemi.engine import Engine, EngineConfig

    multi = data.spec.kind == "multi"
    clock_value = [0.0]
    cfg = EngineConfig(
        algorithms=[algorithm], n_new_clusters=draw.n_new, window_max_docs=settings.window_max_docs,
        max_seed_docs=max(20000, int(draw.seed_mask.sum()) + 1), refit_every_docs=settings.refit_every_docs,
        refit_every_s=None, min_docs_first_refit=settings.min_docs_first_refit,
        drift_detection=False, background_refit=False, random_state=run, explain_words=0,
        max_buffered_docs=max(20000, draw.rows.size + 1))
    eng = Engine(cfg, clock=lambda: clock_value[0])
    ids = [data.doc_ids[draw.rows[k]] for k in range(draw.rows.size)]
    pos_of = {doc_id: k for k, doc_id in enumerate(ids)}
    X_draw = data.X[draw.rows]
    pred: dict[int, Any] = {}
    multi_scores: dict[int, np.ndarray] = {}
    fallback_hits = 0
    first: dict[int, str] = {}
    latest: dict[int, str] = {}
    n_revisions = 0
    t0 = time.perf_counter()
    for start in range(0, order.size, settings.batch_size):
        chunk = order[start:start + settings.batch_size]
        ready_before = eng.ready
        slot_before = eng.models.get(algorithm)
        docs = []
        for k in chunk:
            clock_value[0] = float(start)
            if draw.seed_mask[k]:
                lab = draw.y_true[k]
                eng.label(ids[k], list(lab) if isinstance(lab, list) else [lab])
            docs.append(Document(id=ids[k], text=data.texts[draw.rows[k]], ts=float(start),
                                 arrival=float(start)))
        result = eng.process(docs)
        if multi and ready_before and slot_before is not None:
            S = aligned_scores(slot_before.model, X_draw[chunk], draw.classes)
            for j, k in enumerate(chunk):
                multi_scores[int(k)] = S[j]
        for a in result.revisions:
            latest[pos_of[a.id]] = a.cluster
            n_revisions += 1
        for a in result.assignments:
            k = pos_of[a.id]
            first.setdefault(k, a.cluster)
            latest[k] = a.cluster
            if k in pred:
                continue
            in_chunk = ready_before and a.document is not None and a.id in {ids[c] for c in chunk}
            pred[k] = a.cluster if in_chunk else WARMUP
            fallback_hits += int(bool(a.fallback) and in_chunk)
    eng.request_refit()
    for a in eng.flush():
        pred.setdefault(pos_of[a.id], WARMUP)
        first.setdefault(pos_of[a.id], a.cluster)
        latest[pos_of[a.id]] = a.cluster
    while True:  # the revision pass of the last model, to its end
        revised = eng.process([]).revisions
        for a in revised:
            latest[pos_of[a.id]] = a.cluster
        n_revisions += len(revised)
        if not eng.revisions_pending:
            break
    seconds = time.perf_counter() - t0
    slot = eng.models.get(algorithm)
    if slot is None:
        raise EvaluationError(f"the engine never fitted {algorithm!r} (fewer than 2 seeded classes?)")
    scored = [k for k in range(draw.rows.size)
              if not draw.seed_mask[k] and k in pred and pred[k] is not WARMUP]
    n_warmup = sum(1 for k in range(draw.rows.size) if not draw.seed_mask[k] and pred.get(k) is WARMUP)
    eval_pos = np.flatnonzero(draw.eval_mask)
    if multi:
        scored = [k for k in scored if k in multi_scores]
        preq = _score(protocol, data, draw, scored, scores=np.array([multi_scores[k] for k in scored]))
        fin = _score(protocol, data, draw, eval_pos, scores=aligned_scores(slot.model, X_draw[eval_pos],
                                                                           draw.classes))
    else:
        preq = _score(protocol, data, draw, scored, preds=[pred[k] for k in scored])
        P = np.asarray(slot.model.predict_proba(X_draw[eval_pos]))
        final_pred = np.asarray(slot.classes, dtype=object)[P.argmax(axis=1)]
        fin = _score(protocol, data, draw, eval_pos, preds=final_pred)
    info = {"seconds": seconds, "refits": eng.refit_count, "n_warmup": n_warmup,
            "fallback": fallback_hits / max(len(scored), 1) if scored else 0.0,
            "final_fallback": bool(slot.fallback), "prequential_positions": scored,
            "revisions": n_revisions}
    if not multi:
        served = [int(k) for k in eval_pos if k in first]
        info["first"] = _score(protocol, data, draw, served, preds=[first[k] for k in served])
        info["latest"] = _score(protocol, data, draw, served, preds=[latest[k] for k in served])
        info["batch"] = _score(protocol, data, draw, eval_pos, preds=_batch_predictions(algorithm, draw, X_draw, eval_pos,
                                                                                        run, eng.config))
    return preq, fin, info


def _batch_predictions(algorithm: str, draw: Draw, X: Any, positions: np.ndarray, run: int, cfg: Any) -> list[str]:
    """The algorithm fitted once on the whole draw with the stream's seeds (single-label): its class per position."""
    from streamsemi.algorithms import build_estimator

    est = build_estimator(algorithm, cfg.algorithm_params.get(algorithm), cfg.n_new_clusters, run)
    y = [draw.y_true[k] if draw.seed_mask[k] else None for k in range(draw.rows.size)]
    est.fit(X, y)
    P = np.asarray(est.predict_proba(X[positions]))
    return list(np.asarray([str(c) for c in est.classes_], dtype=object)[P.argmax(axis=1)])


def replay_river(protocol: Protocol, data: PreparedDataset, draw: Draw, order: np.ndarray,
                 positions: Sequence[int] | None) -> tuple[dict[str, float], dict[str, float], float]:
    """River's online multinomial naive Bayes: predict each document, then learn it if a seed.

    ``positions`` restricts the prequential score to the same documents as the
    engine's (None: every non-seed document).
    """
    from river.feature_extraction import BagOfWords
    from river.naive_bayes import MultinomialNB
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    if data.spec.kind == "multi":
        raise EvaluationError("the River baseline is single-label")
    model = BagOfWords(lowercase=True, stop_words=set(ENGLISH_STOP_WORDS)) | MultinomialNB(alpha=1.0)
    texts = [data.texts[r] for r in draw.rows]
    fallback = Counter(draw.y_true[k] for k in np.flatnonzero(draw.seed_mask)).most_common(1)
    pred: dict[int, Any] = {}
    t0 = time.perf_counter()
    learned = False
    for k in order:
        k = int(k)
        if not draw.seed_mask[k]:
            p = model.predict_one(texts[k]) if learned else None
            pred[k] = p if p is not None else "(none)"
        else:
            model.learn_one(texts[k], draw.y_true[k])
            learned = True
    eval_pos = np.flatnonzero(draw.eval_mask)
    final = []
    for k in eval_pos:
        p = model.predict_one(texts[int(k)])
        final.append(p if p is not None else (fallback[0][0] if fallback else "(none)"))
    seconds = time.perf_counter() - t0
    scored = list(positions) if positions is not None else eval_pos.tolist()
    preq = _score(protocol, data, draw, scored, preds=[pred[k] for k in scored])
    fin = _score(protocol, data, draw, eval_pos, preds=final)
    return preq, fin, seconds


def run_stream_job(job: tuple[str, float, int, tuple[str, ...]]) -> list[RunOutcome]:
    """Stream replays of one (dataset, label amount, run) draw for every method.

    Returns, per method, outcomes with ``method`` suffixed ``@prequential`` and
    ``@final``, and for single-label corpora ``@first``, ``@latest`` and ``@batch``
    (what users are served: first emission, latest label with revisions, batch on the
    same draw); :func:`split_mode` splits them.
    """
    dataset_id, label_value, run, methods = job
    protocol: Protocol = _STATE["protocol"]
    data: PreparedDataset = _STATE["data"][dataset_id]
    settings: StreamSettings = _STATE.get("stream_settings", StreamSettings())
    seed = int(_STATE.get("seed", 0))
    with blas_threads():
        return _stream_job(protocol, data, dataset_id, label_value, run, methods, settings, seed)


def _stream_job(protocol: Protocol, data: PreparedDataset, dataset_id: str, label_value: float,
                run: int, methods: Sequence[str], settings: StreamSettings, seed: int
                ) -> list[RunOutcome]:
    draw = make_draw(protocol, data, label_value, run, seed)
    order = stream_order(data, draw, draw_rng(seed, dataset_id, "order", run))
    common = {"n_labeled": int(draw.seed_mask.sum()), "n_scored": int(draw.eval_mask.sum())}
    outcomes: list[RunOutcome] = []
    positions: list[int] | None = None
    engine_methods = [m for m in methods if m != RIVER_BASELINE]
    for m in engine_methods:
        try:
            preq, fin, info = replay_engine(protocol, data, draw, order, m, run, settings)
        except Exception as exc:  # noqa: BLE001 - one failing method must not stop the others
            err = f"{type(exc).__name__}: {exc}"
            outcomes += [RunOutcome(dataset_id, f"{m}@{mode}", label_value, run, error=err, **common)
                         for mode in ("prequential", "final")]
            continue
        if positions is None:
            positions = info["prequential_positions"]
        extra = {k: info[k] for k in ("refits", "n_warmup", "fallback", "final_fallback", "revisions")}
        outcomes += [
            RunOutcome(dataset_id, f"{m}@prequential", label_value, run, preq, info["seconds"],
                       common["n_labeled"], len(info["prequential_positions"]), extra=extra),
            RunOutcome(dataset_id, f"{m}@final", label_value, run, fin, info["seconds"], extra=extra,
                       **common)]
        outcomes += [RunOutcome(dataset_id, f"{m}@{mode}", label_value, run, info[mode], info["seconds"],
                                extra=extra, **common) for mode in SERVED_MODES if mode in info]
    if RIVER_BASELINE in methods:
        try:
            preq, fin, seconds = replay_river(protocol, data, draw, order, positions)
            outcomes += [
                RunOutcome(dataset_id, f"{RIVER_BASELINE}@prequential", label_value, run, preq, seconds,
                           common["n_labeled"], len(positions) if positions is not None
                           else common["n_scored"]),
                RunOutcome(dataset_id, f"{RIVER_BASELINE}@final", label_value, run, fin, seconds,
                           **common)]
        except Exception as exc:  # noqa: BLE001
            err = f"{type(exc).__name__}: {exc}"
            outcomes += [RunOutcome(dataset_id, f"{RIVER_BASELINE}@{mode}", label_value, run, error=err,
                                    **common) for mode in ("prequential", "final")]
    return outcomes


def split_mode(outcomes: Sequence[RunOutcome]) -> dict[str, list[RunOutcome]]:
    """Group ``method@mode`` outcomes by ``stream-<mode>``, with plain method names."""
    out: dict[str, list[RunOutcome]] = {"stream-prequential": [], "stream-final": []}
    for o in outcomes:
        method, _, mode = o.method.partition("@")
        out.setdefault(f"stream-{mode}", []).append(RunOutcome(o.dataset, method, o.label_value, o.run, o.scores,
                                                o.fit_seconds, o.n_labeled, o.n_scored, o.error,
                                                dict(o.extra)))
    return out


def stream_methods(methods: Sequence[str]) -> list[str]:
    """Methods that can run in the engine (registry algorithms) plus the River baseline."""
    from streamsemi.algorithms import REGISTRY

    out = [m for m in methods if m in REGISTRY]
    return out + [RIVER_BASELINE]


__all__ = ["StreamSettings", "stream_order", "replay_engine", "replay_river", "run_stream_job",
           "split_mode", "stream_methods", "RIVER_BASELINE", "MULTILABEL_ALGORITHMS"]
