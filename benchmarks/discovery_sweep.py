"""Development sweep of the discovery constants on Reuters R52 (issue 18): never on R8.

The discovery protocol's draws of R52 (:func:`streamsemi.evaluation.discovery.make_discovery_draw`:
3 unseeded classes among the 21 with 40 documents or more, 5% stratified seeds of the others),
constrained k-means with ``n_new_clusters="auto"``, one configuration of the module constants of
:mod:`streamsemi.algorithms._discovery` per ``--config`` (``name:SPLIT:SPLIT_MIN_FRACTION:SPLIT_SEPARATION``).
Per run: discovery F1, known-class macro-F1 (and ``n_new_clusters=0``'s), the number of new clusters.

Usage::

    python benchmarks/discovery_sweep.py --runs 6 --config nosplit:0:0.002:0.5 --config split500:1:0.002:0.5

Writes ``benchmarks/results/discovery_r52_sweep.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

import streamsemi.algorithms._discovery as disc
from streamsemi.algorithms import make_estimator
from streamsemi.evaluation import metrics
from streamsemi.evaluation.discovery import UNSEEDED, discovery_f1, make_discovery_draw
from streamsemi.evaluation.protocols import prepare

OUT = Path(__file__).resolve().parent / "results" / "discovery_r52_sweep.json"
DATASET = "reuters-r52"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=6)
    p.add_argument("--config", action="append", required=True, help="name:SPLIT:SPLIT_MIN_FRACTION:SPLIT_SEPARATION")
    p.add_argument("--out", default=str(OUT))
    a = p.parse_args(argv)
    data = prepare([DATASET], seed=0)[DATASET]
    y = np.asarray([str(v) for v in data.labels], dtype=object)
    draws = [make_discovery_draw(data, UNSEEDED[DATASET], run) for run in range(a.runs)]
    n0: list[float] = []
    for run, (_, mask) in enumerate(draws):
        ev = np.flatnonzero(~mask)
        yf = [lab if s else None for lab, s in zip(y, mask, strict=True)]
        pred = make_estimator("constrained-kmeans", n_new_clusters=0, random_state=run).fit(data.X, yf).predict(data.X[ev])
        n0.append(metrics.macro_f1_known(list(y[ev]), [str(v) for v in pred], sorted(set(y[mask]))))
    results = []
    for cfg in a.config:
        name, split, frac, sep = cfg.split(":")
        disc.SPLIT_MIN_FRACTION, disc.SPLIT_SEPARATION = float(frac), float(sep)
        rows = []
        for run, (unseeded, mask) in enumerate(draws):
            ev = np.flatnonzero(~mask)
            yf = [lab if s else None for lab, s in zip(y, mask, strict=True)]
            t0 = time.perf_counter()
            est = make_estimator("constrained-kmeans", n_new_clusters="auto", random_state=run,
                                 discovery_split=split == "1").fit(data.X, yf)
            pred = [str(v) for v in est.predict(data.X[ev])]
            f1, per = discovery_f1(y[ev], pred, unseeded, [str(c) for c in est.new_clusters_])
            known = metrics.macro_f1_known(list(y[ev]), pred, sorted(set(y[mask])))
            rows.append({"run": run, "unseeded": unseeded, "discovery_f1": round(f1, 4),
                         "per_class_f1": {k: round(v, 4) for k, v in per.items()}, "known_macro_f1": round(known, 4),
                         "n0_known_macro_f1": round(n0[run], 4), "n_new_clusters": len(est.new_clusters_),
                         "seconds": round(time.perf_counter() - t0, 1)})
        summary = {"config": name, "discovery_split": split == "1", "SPLIT_MIN_FRACTION": float(frac),
                   "SPLIT_SEPARATION": float(sep),
                   "discovery_f1": round(float(np.mean([r["discovery_f1"] for r in rows])), 4),
                   "known_macro_f1": round(float(np.mean([r["known_macro_f1"] for r in rows])), 4),
                   "n0_known_macro_f1": round(float(np.mean(n0)), 4),
                   "n_new_clusters": round(float(np.mean([r["n_new_clusters"] for r in rows])), 2), "runs": rows}
        print(json.dumps({k: v for k, v in summary.items() if k != "runs"}), flush=True)
        results.append(summary)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"dataset": DATASET, "algorithm": "constrained-kmeans", "n_runs": a.runs,
                                       "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
