"""D-LDA: the fit's own verdicts of its training documents against the fold-in's (docs/algorithms/d-lda.md).

Fits D-LDA once per stream (all of R8 and 8,000 20NG documents: the served-quality
streams, 5% stratified seeds, orders 0 and 1) and scores the non-seed documents,
macro-F1: ``fit`` is ``fitted_proba()`` (what the worker serves for its window),
``fold-in`` is ``predict_proba`` of the same rows, ``mean`` their average; ``agree`` is
how often the first two agree. Since session 9 the fit's verdicts are themselves the mean
of the chain and one fold-in (``DLDA._averaged_with_fold_in``); run this file on an older
commit for the chain alone. Results: ``benchmarks/results/dlda_fit_mean.json``.

``python benchmarks/dlda_fit_mean.py``
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from served_quality import score, seeded_stream  # noqa: E402

from streamsemi.algorithms import build_estimator  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "dlda_fit_mean.json"


def macro_f1(P: np.ndarray, classes: np.ndarray, truth: list[str], scored: np.ndarray) -> float:
    return score([t for t, m in zip(truth, scored, strict=True) if m], list(classes[P.argmax(axis=1)][scored]))


def one(alias: str, docs: int | None, seed: int) -> dict:
    st, X, rows, seeded, y = seeded_stream(alias, docs, seed)
    est = build_estimator("d-lda", None, 0, 0)
    t0 = time.perf_counter()
    est.fit(X[rows], y)
    fit_s = time.perf_counter() - t0
    classes = np.asarray([str(c) for c in est.classes_], dtype=object)
    P_fit = np.asarray(est.fitted_proba())
    t0 = time.perf_counter()
    P_fold = np.asarray(est.predict_proba(X[rows]))
    fold_s = time.perf_counter() - t0
    truth = [st.truth(st.order[r]) for r in rows]
    out = {"corpus": alias, "documents": int(rows.size), "order": seed, "fit_s": round(fit_s, 2),
           "fold_in_s": round(fold_s, 2),
           "fit": macro_f1(P_fit, classes, truth, ~seeded), "fold-in": macro_f1(P_fold, classes, truth, ~seeded),
           "mean": macro_f1(0.5 * (P_fit + P_fold), classes, truth, ~seeded),
           "agree": float(np.mean(P_fit.argmax(axis=1) == P_fold.argmax(axis=1)))}
    print(json.dumps(out), flush=True)
    return out


def main() -> int:
    res = [one(alias, docs, seed) for alias, docs in (("r8", None), ("20ng", 8000)) for seed in (0, 1)]
    RESULTS.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
