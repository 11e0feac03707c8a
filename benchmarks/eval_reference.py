"""Reference figures of the issue, re-measured: constrained k-means and label spreading.

Batch macro-F1 on the non-seed documents, 1% and 5% seeds, 3 runs, on 20ng-comp5,
20ng-talk4 and reuters-r8, plus River's MultinomialNB and constrained k-means in stream
mode on 20ng-comp5 at 5% (1 run). Writes benchmarks/results/eval_reference.json and .md.

    OMP_NUM_THREADS=1 python benchmarks/eval_reference.py [--runs 3] [--max-docs N]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from streamsemi.evaluation import report
from streamsemi.evaluation.driver import evaluate
from streamsemi.evaluation.protocols import PROTOCOLS

OUT = Path(__file__).resolve().parent / "results"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--max-docs", type=int, default=None)
    a = ap.parse_args()
    p = PROTOCOLS["semi-ldc"]
    t0 = time.perf_counter()
    recs = evaluate(p, methods=["constrained-kmeans", "label-spreading"],
                    datasets=["20ng-comp5", "20ng-talk4", "reuters-r8"], labels=[1, 5], runs=a.runs,
                    max_docs=a.max_docs, progress=False)
    recs += evaluate(p, methods=["constrained-kmeans"], datasets=["20ng-comp5"], labels=[5], runs=1,
                     batch=False, stream=True, max_docs=a.max_docs, progress=False)
    OUT.mkdir(exist_ok=True)
    (OUT / "eval_reference.json").write_text(json.dumps(recs, indent=1) + "\n")
    (OUT / "eval_reference.md").write_text(
        f"# eval_reference\n\nruns={a.runs} max_docs={a.max_docs} wall={time.perf_counter() - t0:.0f}s\n\n"
        "```\n" + report.format_table(recs) + "\n```\n")
    print(report.format_table(recs))


if __name__ == "__main__":
    main()
