"""The discovery protocol: can an algorithm find the classes nobody seeded?

``streamsemi evaluate --protocol discovery``. For each dataset (Reuters R8: 3 of its
8 classes unseeded; 20 Newsgroups: 5 of 20; Reuters R52, the development set of the
discovery constants, run only when named: 3 of its 21 classes of 40 documents or more) and each run, the unseeded classes are
drawn at random (seeded by ``(seed, dataset, run)``), the other classes get
stratified seeds (5% of each by default), and every algorithm that takes
``n_new_clusters`` is fitted in these variants:

* ``n0``: ``n_new_clusters=0`` (the known-class reference);
* ``legacy``: ``discovery="legacy"``, ``n_new_clusters`` = the number of unseeded
  classes (new clusters compete with the seeded classes in one model);
* ``calibrated``: ``discovery="calibrated"`` with the true number of unseeded classes;
* ``auto``: ``n_new_clusters="auto"`` (calibrated, the number chosen from the data);
* ``auto-split``: ``auto`` with ``discovery_split=True`` (rejected clusters are clustered
  again and their parts judged: small unseeded classes).

The calibrated fits' known-class model is the ``n0`` code path fitted on the window
without the documents of the new clusters.

Metrics, on the documents that are not seeds:

* ``discovery_f1``: for each unseeded class, the best F1 of any new cluster taken
  as that class; the mean over the unseeded classes (0 for a class no new cluster
  holds);
* ``known_macro_f1``: macro-F1 over the seeded classes, predictions as they are (a
  known-class document put in a new cluster is a miss, an unseeded document put in a
  known class a false positive): :func:`streamsemi.evaluation.metrics.macro_f1_known`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from streamsemi.algorithms import accepts_param, algorithm_class, is_available, make_estimator
from streamsemi.evaluation import metrics
from streamsemi.evaluation.errors import EvaluationError
from streamsemi.evaluation.protocols import PreparedDataset, draw_rng, prepare, stratified_seeds
from streamsemi.evaluation.runner import blas_threads, fitted_single_labels

#: Dataset id -> number of classes left without seeds in every run.
UNSEEDED: dict[str, int] = {"reuters-r8": 3, "20ng": 5, "reuters-r52": 3}
#: Dataset id -> the smallest class (documents) that can be drawn unseeded (R52, the development
#: set of the discovery constants: 21 of its 52 classes have 40 documents or more).
MIN_UNSEEDED_DOCS: dict[str, int] = {"reuters-r52": 40}
#: The datasets run when none is named (R52 is only for choosing constants).
DEFAULT_DATASETS = ("reuters-r8", "20ng")
ALGORITHMS = ("constrained-kmeans", "semi-ldc", "cle", "fsl-ck", "d-lda")
VARIANTS = ("n0", "legacy", "calibrated", "auto", "auto-split")
SEED_PERCENT = 5.0
RUNS = 3
#: --quick: documents per dataset, runs, datasets and algorithms.
QUICK_MAX_DOCS = 1200
QUICK_RUNS = 1
#: Extra parameters of an algorithm in every variant (none by default).
ALGORITHM_PARAMS: dict[str, dict[str, Any]] = {}
#: ... and in the legacy variant: CLE's legacy new clusters need its k-means assignment.
LEGACY_PARAMS: dict[str, dict[str, Any]] = {"cle": {"assign": "kmeans"}}


def discovery_f1(y_true: Sequence[Any], y_pred: Sequence[Any], unseeded: Sequence[str],
                 new_clusters: Sequence[str]) -> tuple[float, dict[str, float]]:
    """Mean over ``unseeded`` classes of the best F1 of any of ``new_clusters``; and per class.

    F1 of cluster ``c`` as class ``u``: ``2 |c & u| / (|c| + |u|)``.
    """
    yt = np.asarray([str(v) for v in y_true])
    yp = np.asarray([str(v) for v in y_pred])
    if yt.shape != yp.shape:
        raise EvaluationError(f"y_true has {yt.size} elements, y_pred has {yp.size}")
    if not len(unseeded):
        raise EvaluationError("no unseeded class to score")
    per: dict[str, float] = {}
    for u in unseeded:
        in_u = yt == str(u)
        best = 0.0
        for c in new_clusters:
            in_c = yp == str(c)
            denom = int(in_u.sum() + in_c.sum())
            if denom:
                best = max(best, 2.0 * int((in_u & in_c).sum()) / denom)
        per[str(u)] = best
    return float(np.mean(list(per.values()))), per


def make_discovery_draw(data: PreparedDataset, n_unseeded: int, run: int, seed: int = 0,
                        seed_percent: float = SEED_PERCENT) -> tuple[list[str], np.ndarray]:
    """``(unseeded classes, seed mask)`` of run ``run``: the classes drawn at random, then
    ``seed_percent`` stratified seeds of every other class."""
    classes = sorted(set(data.labels))
    counts = {c: 0 for c in classes}
    for lab in data.labels:
        counts[lab] += 1
    pool = [c for c in classes if counts[c] >= MIN_UNSEEDED_DOCS.get(data.spec.id, 0)]
    if n_unseeded >= len(classes) - 1 or n_unseeded > len(pool):
        raise EvaluationError(f"{data.spec.id}: {n_unseeded} unseeded of {len(classes)} classes leaves "
                              "fewer than 2 seeded classes")
    crng = draw_rng(seed, data.spec.id, "unseeded", run)
    unseeded = sorted(crng.choice(pool, size=n_unseeded, replace=False).tolist())
    y = np.asarray(data.labels, dtype=object)
    mask = np.zeros(y.size, dtype=bool)
    known_rows = np.flatnonzero(~np.isin(y, unseeded))
    mask[known_rows] = stratified_seeds(y[known_rows], draw_rng(seed, data.spec.id, "seeds", run),
                                        fraction=seed_percent / 100.0)
    return unseeded, mask


def _variant_params(variant: str, n_unseeded: int) -> dict[str, Any]:
    if variant == "n0":
        return {"n_new_clusters": 0}
    if variant == "legacy":
        return {"n_new_clusters": n_unseeded, "discovery": "legacy"}
    if variant == "calibrated":
        return {"n_new_clusters": n_unseeded, "discovery": "calibrated"}
    if variant == "auto":
        return {"n_new_clusters": "auto", "discovery": "calibrated"}
    if variant == "auto-split":
        return {"n_new_clusters": "auto", "discovery": "calibrated", "discovery_split": True}
    raise EvaluationError(f"unknown variant {variant!r}")


def run_draw(data: PreparedDataset, algorithm: str, unseeded: list[str], seed_mask: np.ndarray,
             run: int, variants: Sequence[str] = VARIANTS) -> list[dict[str, Any]]:
    """Fit ``algorithm`` in each variant on one draw; one record per variant."""
    X = data.X
    y_true = [str(v) for v in data.labels]
    y_fit = [lab if s else None for lab, s in zip(y_true, seed_mask, strict=True)]
    known = sorted({lab for lab, s in zip(y_true, seed_mask, strict=True) if s})
    eval_rows = np.flatnonzero(~seed_mask)
    yt_eval = [y_true[i] for i in eval_rows]
    base = {"dataset": data.spec.id, "algorithm": algorithm, "run": run, "unseeded": unseeded,
            "n_docs": int(X.shape[0]), "n_seeds": int(seed_mask.sum())}
    out: list[dict[str, Any]] = []
    for variant in variants:
        rec = {**base, "variant": variant}
        try:
            params = {**ALGORITHM_PARAMS.get(algorithm, {}), **_variant_params(variant, len(unseeded)),
                      **(LEGACY_PARAMS.get(algorithm, {}) if variant == "legacy" else {}), "random_state": run}
            est = make_estimator(algorithm, **params)
            t0 = time.perf_counter()
            est.fit(X, y_fit)
            pred = fitted_single_labels(est, X, eval_rows, False)
            rec["fit_seconds"] = round(time.perf_counter() - t0, 3)
            new = [str(c) for c in getattr(est, "new_clusters_", [])]
            rec["discovery_f1"], rec["per_class_f1"] = discovery_f1(yt_eval, pred, unseeded, new)
            rec["known_macro_f1"] = metrics.macro_f1_known(yt_eval, pred, known)
            rec["n_new_clusters"] = len(new)
            info = getattr(est, "discovery_info_", None)
            if info is not None:
                rec["n_unexplained"] = int(info.get("n_unexplained", 0))
        except Exception as exc:  # noqa: BLE001 - one failing fit must not stop the others
            rec["error"] = f"{type(exc).__name__}: {exc}"
        out.append(rec)
    return out


def aggregate(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and standard deviation over runs per (dataset, algorithm, variant)."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["dataset"], r["algorithm"], r["variant"]), []).append(r)
    out = []
    for (dataset, algorithm, variant), g in groups.items():
        ok = [r for r in g if "error" not in r]
        row: dict[str, Any] = {"dataset": dataset, "algorithm": algorithm, "variant": variant,
                               "runs": len(ok), "failed": len(g) - len(ok)}
        for m in ("discovery_f1", "known_macro_f1", "n_new_clusters", "fit_seconds"):
            vals = [float(r[m]) for r in ok if m in r]
            if vals:
                row[m] = round(float(np.mean(vals)), 4)
                row[m + "_std"] = round(float(np.std(vals)), 4)
        out.append(row)
    return out


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown table of :func:`aggregate` rows, with the known-F1 change against ``n0``."""
    ref = {(r["dataset"], r["algorithm"]): r.get("known_macro_f1") for r in rows if r["variant"] == "n0"}
    lines = ["| dataset | algorithm | variant | discovery F1 | known macro-F1 | vs n0 | new clusters | runs |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        k = r.get("known_macro_f1")
        n0 = ref.get((r["dataset"], r["algorithm"]))
        delta = "" if k is None or n0 is None or r["variant"] == "n0" else f"{k - n0:+.3f}"
        disc = "" if r["variant"] == "n0" or "discovery_f1" not in r else \
            f"{r['discovery_f1']:.3f} ± {r['discovery_f1_std']:.3f}"
        known_cell = "" if k is None else f"{k:.3f} ± {r['known_macro_f1_std']:.3f}"
        lines.append(f"| {r['dataset']} | {r['algorithm']} | {r['variant']} | {disc} | {known_cell} | {delta} | "
                     f"{r.get('n_new_clusters', '')} | {r['runs']}{'' if not r['failed'] else ' (' + str(r['failed']) + ' failed)'} |")
    return "\n".join(lines)


def evaluate_discovery(datasets: Sequence[str] | None = None, algorithms: Sequence[str] | None = None,
                       runs: int = RUNS, max_docs: int | None = None, seed: int = 0,
                       variants: Sequence[str] = VARIANTS, seed_percent: float = SEED_PERCENT,
                       progress: bool = True, threads: int = 1) -> dict[str, Any]:
    """Run the protocol; returns ``{"settings", "records", "summary"}``."""
    from threadpoolctl import threadpool_limits

    datasets = list(datasets or DEFAULT_DATASETS)
    unknown = [d for d in datasets if d not in UNSEEDED]
    if unknown:
        raise EvaluationError(f"the discovery protocol runs on {', '.join(UNSEEDED)}, not {', '.join(unknown)}")
    algos = [a for a in (algorithms or ALGORITHMS) if is_available(a)]
    not_discovering = [a for a in algos if not accepts_param(algorithm_class(a)[0], "discovery")]
    if not_discovering:
        raise EvaluationError(f"algorithm(s) without n_new_clusters discovery: {', '.join(not_discovering)}")
    data = prepare(datasets, max_docs=max_docs, seed=seed)
    records: list[dict[str, Any]] = []
    with threadpool_limits(int(threads or 1)), blas_threads():
        for d in datasets:
            for run in range(runs):
                unseeded, mask = make_discovery_draw(data[d], UNSEEDED[d], run, seed, seed_percent)
                for a in algos:
                    recs = run_draw(data[d], a, unseeded, mask, run, variants)
                    records.extend(recs)
                    if progress:
                        for r in recs:
                            print(f"{d} run {run} {a} {r['variant']}: discovery_f1={r.get('discovery_f1', '-')} "
                                  f"known_macro_f1={r.get('known_macro_f1', '-')} {r.get('error', '')}",
                                  file=sys.stderr, flush=True)
    settings = {"datasets": datasets, "algorithms": algos, "runs": runs, "max_docs": max_docs, "seed": seed,
                "seed_percent": seed_percent, "unseeded": {d: UNSEEDED[d] for d in datasets},
                "variants": list(variants)}
    return {"protocol": "discovery", "settings": settings, "records": records, "summary": aggregate(records)}


def run_from_args(args: argparse.Namespace) -> int:
    """``streamsemi evaluate --protocol discovery [...]``: print the table, write ``--json``."""
    runs = args.runs or (QUICK_RUNS if args.quick else RUNS)
    max_docs = args.max_docs or (QUICK_MAX_DOCS if args.quick else None)
    seed_percent = args.labels[0] if args.labels else SEED_PERCENT
    try:
        result = evaluate_discovery(args.datasets, args.algorithm, runs=runs, max_docs=max_docs,
                                    seed=args.seed, seed_percent=seed_percent,
                                    progress=not args.no_progress, threads=args.threads)
    except EvaluationError as exc:
        print(f"streamsemi evaluate: {exc}", file=sys.stderr)
        return 2
    print(format_table(result["summary"]))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        print(f"wrote {len(result['records'])} records to {args.json}", file=sys.stderr)
    ok = [r for r in result["records"] if "error" not in r]
    return 0 if ok else 1


__all__ = ["UNSEEDED", "ALGORITHMS", "VARIANTS", "discovery_f1", "make_discovery_draw", "run_draw",
           "aggregate", "format_table", "evaluate_discovery", "run_from_args"]
