"""How much constrained k-means' batch macro-F1 on R8 depends on which documents are seeds.

``python benchmarks/ck_seed_draws.py [--fraction 0.023] [--draws 8]``: R8 hashed as the worker
hashes it (:class:`streamsemi.core.features.TextFeaturizer`), ``--draws`` stratified seed draws
(:func:`streamsemi.devtools.replay.stratified_seeds`, seeds 0..draws-1) of ``--fraction`` of the
corpus; per draw, constrained k-means' macro-F1 and per-class F1 on the non-seed documents and
how many documents it puts in each class. The served-queue runs of session 26
(docs/results.md, "Working the queue through the daemon") ended at 0.748 in one run and
0.843-0.855 in four others; this shows the same spread without the daemon: a low draw is a
small class whose centroid drifts onto other classes' documents.
Results: ``benchmarks/results/ck_seed_draws.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import numpy as np
from primary_criterion import seeded_predictions  # benchmarks/ is on the path when run as a script
from sklearn.metrics import f1_score

from streamsemi.core import datasets
from streamsemi.core.features import TextFeaturizer
from streamsemi.devtools.replay import stratified_seeds

RESULTS = Path(__file__).parent / "results"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fraction", type=float, default=0.023)
    p.add_argument("--draws", type=int, default=8)
    args = p.parse_args(argv)
    ds = datasets.load("reuters-r8")
    n = len(ds.texts)
    X = TextFeaturizer().transform(list(ds.texts), update_sketch=False)
    y = np.array([str(lb) for lb in ds.labels])
    classes = sorted(set(y))
    rows = []
    for draw in range(args.draws):
        seeds = np.array(sorted(stratified_seeds(ds, np.arange(n), args.fraction, draw)))
        rest = np.setdiff1d(np.arange(n), seeds)
        pred_rest = seeded_predictions(X, y, seeds, "constrained-kmeans", rest)
        f1 = f1_score(y[rest], pred_rest, labels=classes, average=None)
        rows.append({"draw": draw, "seeds": int(seeds.size), "macro_f1": round(float(f1.mean()), 4),
                     "class_f1": {c: round(float(v), 3) for c, v in zip(classes, f1, strict=True)},
                     "seeds_per_class": dict(Counter(y[seeds].tolist())),
                     "predicted": dict(Counter(pred_rest.tolist())), "true": dict(Counter(y[rest].tolist()))})
        print(f"draw {draw}: macro-F1 {rows[-1]['macro_f1']:.3f} "
              + " ".join(f"{c}={v:.2f}" for c, v in rows[-1]["class_f1"].items()), flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "ck_seed_draws.json").write_text(json.dumps({"args": vars(args), "draws": rows}, indent=1) + "\n")
    lines = [f"Constrained k-means on R8, {args.fraction:.1%} stratified seeds, macro-F1 and per-class F1 "
             "(non-seed documents); predicted / true documents of the worst class.", "",
             "| draw | macro-F1 | worst class | its F1 | its seeds | predicted / true |", "|---:|---:|---|---:|---:|---|"]
    for r in rows:
        worst = min(r["class_f1"], key=r["class_f1"].get)
        lines.append(f"| {r['draw']} | {r['macro_f1']:.3f} | {worst} | {r['class_f1'][worst]:.2f} | "
                     f"{r['seeds_per_class'].get(worst, 0)} | {r['predicted'].get(worst, 0)} / {r['true'][worst]} |")
    (RESULTS / "ck_seed_draws.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {RESULTS / 'ck_seed_draws'}.json and .md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
