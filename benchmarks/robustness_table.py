"""Markdown tables of a robustness-protocol JSON file (issue 19's targets), for docs/results.md.

    python benchmarks/robustness_table.py benchmarks/results/robustness_quick.json
"""

from __future__ import annotations

import json
import sys

from streamsemi.evaluation.protocols import PROTOCOLS
from streamsemi.evaluation.report import target_table


def main(path: str) -> None:
    records = json.loads(open(path, encoding="utf-8").read())
    algos = list(PROTOCOLS["robustness"].algorithms)
    baselines = [b for b in PROTOCOLS["robustness"].baselines if b not in ("constrained-kmeans", "ovr-linear")]
    single = [r for r in records if not r["dataset"].startswith("reuters-multilabel")]
    print("Single-label corpora, macro-F1 on the non-seed documents (**↓**: more than 0.01 below "
          "constrained k-means):\n")
    print("\n".join(target_table(single, algos + baselines)))
    multi = [r for r in records if r["dataset"].startswith("reuters-multilabel")]
    for metric in ("macro_auc", "example_f1"):
        print(f"\nMulti-label Reuters-21578 (top-20 topics), {metric}:\n")
        print("\n".join(target_table(multi, ["pseudo-lsc", "ovr-linear"], metric=metric)))
    ens = [r for r in single if r["algorithm"] == "ensemble"]
    gaps = []
    for e in ens:
        best = max((r for r in single if r["dataset"] == e["dataset"] and r["label_fraction"] == e["label_fraction"]
                    and r["algorithm"] in algos and r["algorithm"] != "ensemble"), key=lambda r: r["mean"])
        gaps.append((e["mean"] - best["mean"], e["dataset"], e["label_fraction"], best["algorithm"]))
    below = [g for g in gaps if g[0] < -0.01]
    print(f"\nensemble minus the best single paper algorithm: mean {sum(g[0] for g in gaps) / max(len(gaps), 1):+.3f}; "
          f"more than 0.01 below on {len(below)} of {len(gaps)} cells"
          + (": " + ", ".join(f"{d} {f * 100:g}% ({g:+.3f} vs {a})" for g, d, f, a in below) if below else ""))


if __name__ == "__main__":
    main(sys.argv[1])
