"""The worker's constrained k-means with seeds weighted 1, 8, or chosen on held-out seeds (docs/algorithms/constrained-kmeans.md).

Fits the worker's constrained k-means (:func:`streamsemi.algorithms.build_estimator`, its
``DAEMON_PARAMS``) once per stream and seed weight: all of R8 and 8,000 20NG documents, the
served-quality streams (5% stratified seeds), orders 0-3; macro-F1 of the non-seed documents,
the weight ``"held-out"`` chose with each candidate's held-out macro-F1, and the CPU seconds of
the fit. Results: ``benchmarks/results/ck_seed_weight.json``.

``OMP_NUM_THREADS=1 python benchmarks/ck_seed_weight.py``
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from served_quality import score, seeded_stream  # noqa: E402

from streamsemi.algorithms import build_estimator  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "ck_seed_weight.json"
WEIGHTS: tuple[float | str, ...] = (1.0, 8.0, "held-out")


def one(alias: str, docs: int | None, seed: int) -> dict:
    st, X, rows, seeded, y = seeded_stream(alias, docs, seed)
    truth = [t for t, s in zip((st.truth(st.order[r]) for r in rows), seeded, strict=True) if not s]
    out: dict = {"corpus": alias, "documents": int(rows.size), "order": seed}
    for w in WEIGHTS:
        est = build_estimator("constrained-kmeans", {"seed_weight": w}, 0, 0)
        t0 = time.process_time()
        est.fit(X[rows], y)
        cpu = time.process_time() - t0
        pred = est.classes_[est.labels_][~seeded]
        out[str(w)] = {"macro_f1": round(score(truth, list(pred)), 4), "cpu_s": round(cpu, 2),
                       **{k: v for k, v in est.fit_summary().items() if k.startswith("seed_weight")}}
    print(json.dumps(out), flush=True)
    return out


def main() -> int:
    runs = [one(alias, docs, seed) for alias, docs in (("r8", None), ("20ng", 8000)) for seed in range(4)]
    RESULTS.write_text(json.dumps(runs, indent=1) + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
