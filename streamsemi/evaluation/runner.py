"""Batch runs: draw seeds, fit every method on the same draw, score, aggregate.

One *job* is one (dataset, label amount, run) draw; every method is fitted on it
in turn, so all methods see exactly the same seeds. Jobs run in this process or
in ``jobs`` worker processes (fork: the vectorised datasets are inherited, not
pickled). Scores are computed on the documents that are not seeds.
"""

from __future__ import annotations

import multiprocessing
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from streamsemi.algorithms import MULTILABEL
from streamsemi.evaluation import metrics
from streamsemi.evaluation.baselines import BASELINES, make_method
from streamsemi.evaluation.errors import EvaluationError
from streamsemi.evaluation.protocols import (
    Draw,
    PreparedDataset,
    Protocol,
    label_fraction_of,
    make_draw,
    methods_for,
)

MULTILABEL_ALGORITHMS = MULTILABEL  # one definition, next to the registry

#: Datasets of the current evaluation, set before worker processes fork.
_STATE: dict[str, Any] = {}


@dataclass
class RunOutcome:
    """Scores of one method on one draw.

    Attributes
    ----------
    dataset, method : str
    label_value : float
        The label amount as given (percent or count).
    run : int
    scores : dict
        Metric name -> value (empty when the fit failed).
    fit_seconds : float
        Wall-clock time of ``fit`` (plus ``predict`` where the fitted labels of the
        training rows are not exposed).
    n_labeled, n_scored : int
        Seeds and scored documents of the draw.
    error : str or None
        ``"ExceptionType: message"`` when the method failed on this draw.
    """

    dataset: str
    method: str
    label_value: float
    run: int
    scores: dict[str, float] = field(default_factory=dict)
    fit_seconds: float = 0.0
    n_labeled: int = 0
    n_scored: int = 0
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def is_multilabel_method(name: str, est: Any) -> bool:
    """True when ``est`` takes label lists (``multilabel_`` class attribute or known name)."""
    return name in MULTILABEL_ALGORITHMS or bool(getattr(est, "multilabel_", False))


def method_params(protocol: Protocol, draw: Draw, run: int) -> dict[str, Any]:
    """Constructor parameters a method gets when it accepts them."""
    params: dict[str, Any] = {"random_state": run}
    # always, 0 included: D-LDA's own default opens 2 new clusters, which a draw
    # without unseeded classes must not get
    params["n_new_clusters"] = draw.n_new
    return params


def fitted_single_labels(est: Any, X: Any, rows: np.ndarray, multilabel: bool) -> np.ndarray:
    """Predicted class (or cluster) of ``rows`` of the fitted training matrix ``X``.

    Uses the estimator's fitted assignment ``labels_`` (indices into ``classes_``
    or names) when it covers every training row, else ``predict``; a multi-label
    estimator's prediction is its most probable class.
    """
    classes = np.asarray(est.classes_, dtype=object)
    if multilabel:
        return classes[np.asarray(est.predict_proba(X[rows])).argmax(axis=1)]
    lab = getattr(est, "labels_", None)
    if lab is not None and len(lab) == X.shape[0]:
        lab = np.asarray(lab)
        if lab.dtype.kind in "iu":
            return classes[lab[rows]]
        return lab[rows].astype(object)
    return np.asarray(est.predict(X[rows]), dtype=object)


def aligned_scores(est: Any, X: Any, classes: Sequence[str]) -> np.ndarray:
    """``predict_proba(X)`` with columns reordered to ``classes`` (0 for a missing class)."""
    P = np.asarray(est.predict_proba(X), dtype=np.float64)
    out = np.zeros((X.shape[0], len(classes)))
    index = {c: j for j, c in enumerate(classes)}
    for j, c in enumerate(np.asarray(est.classes_, dtype=object)):
        if str(c) in index:
            out[:, index[str(c)]] = P[:, j]
    return out


def score_single(protocol: Protocol, y_true: Sequence[str], y_pred: Sequence[Any],
                 known: Sequence[str]) -> dict[str, float]:
    """The protocol's single-label metrics (macro-F1 on ``known`` classes for D-LDA)."""
    names = [m for m in protocol.metrics if m in metrics.SINGLE_LABEL_METRICS]
    out = metrics.single_label_scores(y_true, y_pred, [m for m in names if m != "macro_f1"])
    if "macro_f1" in names:
        out["macro_f1"] = (metrics.macro_f1_known(y_true, y_pred, known) if protocol.name == "d-lda"
                           else metrics.macro_f1(y_true, y_pred))
    return {m: out[m] for m in names}


def indicator(y_true: Sequence[Any], classes: Sequence[str]) -> np.ndarray:
    """0/1 matrix (documents x classes) of label lists."""
    index = {c: j for j, c in enumerate(classes)}
    Y = np.zeros((len(y_true), len(classes)), dtype=np.int8)
    for i, labs in enumerate(y_true):
        for t in (labs if isinstance(labs, list) else [labs]):
            if t in index:
                Y[i, index[t]] = 1
    return Y


def chosen_label_sets(est: Any, X: Any, classes: Sequence[str], multilabel: bool) -> np.ndarray:
    """0/1 matrix (documents x ``classes``) of the label sets ``est`` chooses for ``X``.

    A multi-label estimator's ``predict`` (its own threshold rule); a single-label
    one chooses the one class it predicts.
    """
    index = {c: j for j, c in enumerate(classes)}
    out = np.zeros((X.shape[0], len(classes)), dtype=np.int8)
    est_classes = [str(c) for c in np.asarray(est.classes_, dtype=object)]
    if multilabel:
        pred = np.asarray(est.predict(X))
        for j, c in enumerate(est_classes):
            if c in index:
                out[:, index[c]] = pred[:, j] > 0
        return out
    for i, c in enumerate(np.asarray(est.predict(X), dtype=object)):
        if str(c) in index:
            out[i, index[str(c)]] = 1
    return out


AUTO_SUFFIX = " (auto)"


def chooses_new_clusters(method: str) -> bool:
    """``method`` can choose its number of new clusters from the data (``n_new_clusters="auto"``)."""
    from streamsemi.algorithms import AlgorithmNotAvailable, accepts_param, algorithm_class

    if method in BASELINES:
        return False
    try:
        return accepts_param(algorithm_class(method)[0], "discovery")
    except AlgorithmNotAvailable:  # an unavailable algorithm simply has no auto row
        return False


def fit_and_score(protocol: Protocol, method: str, data: PreparedDataset, draw: Draw,
                  label_value: float, run: int, auto_new: bool = False) -> RunOutcome:
    """Fit ``method`` on ``draw`` and score it on the draw's non-seed documents.

    ``auto_new``: with ``n_new_clusters="auto"`` instead of the draw's true number of
    unseeded classes; the outcome's method is ``method + AUTO_SUFFIX``.
    """
    out = RunOutcome(data.spec.id, method + (AUTO_SUFFIX if auto_new else ""), label_value, run,
                     n_labeled=int(draw.seed_mask.sum()), n_scored=int(draw.eval_mask.sum()))
    try:
        X = data.X[draw.rows]
        params = method_params(protocol, draw, run)
        if auto_new:
            params["n_new_clusters"] = "auto"
        est = make_method(method, **params)
        multi_est = is_multilabel_method(method, est)
        if multi_est:
            y_fit: list = draw.y_fit_multi()
        else:
            freq = Counter(t for lab in data.labels for t in (lab if isinstance(lab, list) else [lab]))
            y_fit = draw.y_fit_single(freq)
        eval_rows = np.flatnonzero(draw.eval_mask)
        t0 = time.perf_counter()
        est.fit(X, y_fit)
        if auto_new:  # how many new clusters the data chose (mean over runs in the record)
            out.extra["new_clusters"] = len(getattr(est, "new_clusters_", ()))
        multi_est = multi_est or bool(getattr(est, "multilabel_", False))
        y_true_eval = [draw.y_true[i] for i in eval_rows]
        if data.spec.kind == "multi":
            S = aligned_scores(est, X[eval_rows], draw.classes)
            out.fit_seconds = time.perf_counter() - t0
            Y_eval = indicator(y_true_eval, draw.classes)
            out.scores = {"macro_auc": metrics.macro_auc(Y_eval, S)}
            if "example_f1" in protocol.metrics:
                out.scores["example_f1"] = metrics.example_f1(
                    Y_eval, chosen_label_sets(est, X[eval_rows], draw.classes, multi_est))
        else:
            y_pred = fitted_single_labels(est, X, eval_rows, multi_est)
            out.fit_seconds = time.perf_counter() - t0
            out.scores = score_single(protocol, y_true_eval, y_pred, draw.known)
    except Exception as exc:  # noqa: BLE001 - one failing method must not stop the others
        out.error = f"{type(exc).__name__}: {exc}"
        out.scores = {}
        _STATE.setdefault("tracebacks", []).append(traceback.format_exc())
    return out


def run_job(job: tuple[str, float, int, tuple[str, ...]]) -> list[RunOutcome]:
    """Every method on one (dataset, label amount, run) draw (reads :data:`_STATE`)."""
    dataset_id, label_value, run, methods = job
    protocol: Protocol = _STATE["protocol"]
    data: PreparedDataset = _STATE["data"][dataset_id]
    methods = tuple(methods_for(protocol, data.spec, methods, sorted(MULTILABEL_ALGORITHMS)))
    seed = int(_STATE.get("seed", 0))
    try:
        draw = make_draw(protocol, data, label_value, run, seed)
    except EvaluationError as exc:
        return [RunOutcome(dataset_id, m, label_value, run, error=f"draw failed: {exc}")
                for m in methods]
    with blas_threads():
        outs = [fit_and_score(protocol, m, data, draw, label_value, run) for m in methods]
        if protocol.auto_new_clusters and draw.n_new:
            outs += [fit_and_score(protocol, m, data, draw, label_value, run, auto_new=True)
                     for m in methods if chooses_new_clusters(m)]
        return outs


def blas_threads() -> Any:
    """Context limiting BLAS/OpenMP threads to ``_STATE["threads"]`` (default 1).

    On a shared or busy machine, multi-threaded BLAS inside each fit oversubscribes
    the cores (measured here: a 300-document TruncatedSVD took 16 s with 2 threads
    under load, 1 s with 1 thread); one thread per run is also what ``--jobs``
    parallelism wants.
    """
    from threadpoolctl import threadpool_limits

    return threadpool_limits(int(_STATE.get("threads") or 1))


def run_batch(protocol: Protocol, data: dict[str, PreparedDataset], methods: Sequence[str],
              labels: Sequence[float], runs: int, jobs: int = 1, seed: int = 0,
              progress: bool = True, on_result: Callable[[RunOutcome], None] | None = None,
              job_fn: Callable[[tuple], list[RunOutcome]] = run_job, desc: str = "batch",
              extra_state: dict[str, Any] | None = None) -> list[RunOutcome]:
    """Run every (dataset, label amount, run) job; returns one outcome per method and job.

    ``job_fn`` is :func:`run_job` (batch) or
    :func:`streamsemi.evaluation.stream.run_stream_job` (stream replays).
    """
    from tqdm.auto import tqdm

    _STATE.update(protocol=protocol, data=data, seed=seed, **(extra_state or {}))
    job_list = [(d, float(v), r, tuple(methods)) for d in data for v in labels for r in range(runs)]
    outcomes: list[RunOutcome] = []
    bar = tqdm(total=len(job_list), desc=f"{protocol.name} {desc}", unit="draw", disable=not progress,
               leave=False)
    try:
        if jobs <= 1 or len(job_list) <= 1:
            for job in job_list:
                res = job_fn(job)
                outcomes.extend(res)
                bar.update(1)
        else:
            ctx = multiprocessing.get_context("fork")
            with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
                futures = [pool.submit(job_fn, job) for job in job_list]
                for fut in as_completed(futures):
                    outcomes.extend(fut.result())
                    bar.update(1)
    finally:
        bar.close()
    order = {(d, v, r): k for k, (d, v, r, _) in enumerate(job_list)}
    rank = {m: i for i, m in enumerate(methods)}
    outcomes.sort(key=lambda o: (order[(o.dataset, o.label_value, o.run)],
                                 rank.get(o.method.partition("@")[0], len(rank)), o.method))
    if on_result is not None:
        for o in outcomes:
            on_result(o)
    return outcomes


def aggregate(protocol: Protocol, outcomes: Sequence[RunOutcome], mode: str = "batch"
              ) -> list[dict[str, Any]]:
    """Mean and standard deviation (ddof=0) over runs, one record per metric.

    Records: ``protocol, dataset, algorithm, label_fraction, metric, mean, std,
    runs, fit_seconds`` plus ``mode, label_amount, n_labeled, n_scored``. Failed
    runs are left out (``runs`` counts the successful ones); a group with no
    successful run gives no record.
    """
    groups: dict[tuple[str, str, float], list[RunOutcome]] = {}
    for o in outcomes:
        groups.setdefault((o.dataset, o.method, o.label_value), []).append(o)
    records = []
    for (dataset, method, value), group in groups.items():
        ok = [o for o in group if o.error is None]
        if not ok:
            continue
        for m in protocol.metrics:
            vals = np.array([o.scores[m] for o in ok if m in o.scores], dtype=np.float64)
            if vals.size == 0:
                continue
            records.append({
                "protocol": protocol.name,
                "dataset": dataset,
                "algorithm": method,
                "label_fraction": round(label_fraction_of(protocol, value), 6),
                "metric": m,
                "mean": float(vals.mean()),
                "std": float(vals.std()),
                "runs": int(vals.size),
                "fit_seconds": float(np.mean([o.fit_seconds for o in ok])),
                "mode": mode,
                "label_amount": value,
                "n_labeled": float(np.mean([o.n_labeled for o in ok])),
                "n_scored": float(np.mean([o.n_scored for o in ok])),
            })
            for key in sorted({k for o in ok for k in o.extra}):
                vals_x = [float(o.extra[key]) for o in ok if key in o.extra]
                records[-1][key] = float(np.mean(vals_x))
    return records


def failures(outcomes: Sequence[RunOutcome]) -> list[str]:
    """One line per distinct (method, error) of the failed runs."""
    seen: dict[tuple[str, str], list[RunOutcome]] = {}
    for o in outcomes:
        if o.error is not None:
            seen.setdefault((o.method, o.error), []).append(o)
    return [f"{method} failed on {len(g)} run(s), e.g. {g[0].dataset} labels={g[0].label_value:g} "
            f"run={g[0].run}: {err}" for (method, err), g in seen.items()]
