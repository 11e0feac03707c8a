"""Markdown tables of a robustness-protocol record: every algorithm against constrained k-means.

    python benchmarks/robustness_table.py [benchmarks/results/page_full/robustness.json]

The file is either a list of records (``streamsemi evaluate --protocol robustness --json FILE``) or a
results-page protocol run (``benchmarks/results/page_full/robustness.json``: its ``records``). Prints the
single-label table (macro-F1 on the non-seed documents), the multi-label tables (macro ROC AUC and
example-based F1) and how far the ensemble is from the best single paper algorithm.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench  # noqa: E402

from streamsemi.evaluation.protocols import PROTOCOLS  # noqa: E402
from streamsemi.evaluation.report import target_table  # noqa: E402

DEFAULT = _bench.RESULTS / "page_full" / "robustness.json"


def load_records(path: Path) -> list[dict]:
    """The records of ``path``: a JSON list of records, or a protocol run holding them under ``records``."""
    data = json.loads(path.read_text(encoding="utf-8"))
    return data["records"] if isinstance(data, dict) else data


def tables(records: list[dict]) -> list[str]:
    """The markdown lines of the tables of ``records``."""
    algos = list(PROTOCOLS["robustness"].algorithms)
    baselines = [b for b in PROTOCOLS["robustness"].baselines if b not in ("constrained-kmeans", "ovr-linear")]
    single = [r for r in records if not r["dataset"].startswith("reuters-multilabel")]
    lines = ["Single-label corpora, macro-F1 on the non-seed documents (**↓**: more than 0.01 below "
             "constrained k-means):", "", *target_table(single, algos + baselines)]
    multi = [r for r in records if r["dataset"].startswith("reuters-multilabel")]
    for metric in ("macro_auc", "example_f1"):
        lines += ["", f"Multi-label Reuters-21578 (top-20 topics), {metric}:", "",
                  *target_table(multi, ["pseudo-lsc", "ovr-linear"], metric=metric)]
    gaps = []
    for e in (r for r in single if r["algorithm"] == "ensemble"):
        best = max((r for r in single if r["dataset"] == e["dataset"] and r["label_fraction"] == e["label_fraction"]
                    and r["algorithm"] in algos and r["algorithm"] != "ensemble"), key=lambda r: r["mean"])
        gaps.append((e["mean"] - best["mean"], e["dataset"], e["label_fraction"], best["algorithm"]))
    below = [g for g in gaps if g[0] < -0.01]
    lines += ["", f"ensemble minus the best single paper algorithm: mean "
              f"{sum(g[0] for g in gaps) / max(len(gaps), 1):+.3f}; more than 0.01 below on {len(below)} of "
              f"{len(gaps)} cells" + (": " + ", ".join(f"{d} {f * 100:g}% ({g:+.3f} vs {a})" for g, d, f, a in below)
                                      if below else "")]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path", nargs="?", type=Path, default=DEFAULT, help=f"the record (default: {DEFAULT.name} "
                    "of benchmarks/results/page_full)")
    _bench.add_smoke(ap)
    args = ap.parse_args(argv)
    records = load_records(args.path)
    if args.smoke:  # one corpus of the record: the same tables, a fraction of the rows
        first = records[0]["dataset"].split("-w500")[0].split("-short30")[0]
        records = [r for r in records if r["dataset"].startswith(first) or r["dataset"].startswith("reuters-multilabel")]
    print("\n".join(tables(records)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
