"""Speed benchmark: Semi-LDC fit/predict vs ConstrainedKMeans on 20 Newsgroups windows.

Run on demand (not a test)::

    OMP_NUM_THREADS=1 python benchmarks/bench_semi_ldc.py [--sizes 2000,10000,50000]

For every window size N the 20NG posts are hashed (2^18 features, the daemon's
featurizer), N documents are drawn (seed 0) with 5% stratified seed labels, and each
algorithm is fitted in a fresh subprocess so that its peak resident memory
(``ru_maxrss``) is its own. Windows larger than the corpus (18,821 posts) are built by
*replication with binomial thinning*: copy ``r`` of the corpus keeps each term
occurrence with probability 0.9 (numpy seed ``r``), so copies are near-duplicates
rather than identical rows; empty rows are dropped. Predict throughput is measured on
5,000 documents outside the window (for windows covering the corpus: thinned copies
with another seed), best of 3 repetitions.

Writes ``benchmarks/results/semi_ldc.json`` (and prints a table): fit seconds, predict
docs/s, peak RSS, and each as a ratio to ConstrainedKMeans in the same run.

``--quality`` instead runs the quality comparison of ``docs/algorithms/semi-ldc.md``:
20NG comp.* (5 groups) and talk.* (4 groups), empty posts dropped, seeds drawn per
class (``max(1, round(f * N_c))``, numpy seed = run index 0..2) at f = 1..5%; SemiLDC
(defaults, ``random_state`` = run index) and ConstrainedKMeans on the same draws;
macro-F1 on the unlabeled documents. Writes ``benchmarks/results/semi_ldc.quality.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench  # noqa: E402

RESULTS = _bench.RESULTS / "semi_ldc.json"
QUALITY = _bench.RESULTS / "semi_ldc.quality.json"
PAPER = {"comp": [0.532, 0.647, 0.671, 0.709, 0.715], "talk": [0.640, 0.733, 0.766, 0.784, 0.793]}
N_PREDICT = 5000
SEED_FRACTION = 0.05


def thinned_copy(X: sp.csr_matrix, seed: int, keep: float = 0.9) -> tuple[sp.csr_matrix, np.ndarray]:
    """Binomially thin every count (each occurrence kept with probability ``keep``).

    Returns the thinned matrix without its empty rows, and the mask of kept rows.
    """
    rng = np.random.default_rng(seed)
    Y = X.copy()
    Y.data = rng.binomial(Y.data.astype(np.int64), keep).astype(np.float64)
    Y.eliminate_zeros()
    nonempty = np.diff(Y.indptr) > 0
    return sp.csr_matrix(Y[nonempty]), nonempty


def build_corpus(path: Path) -> None:
    """Hash 20NG once and save counts + labels for the subprocesses."""
    from streamsemi.core import datasets
    from streamsemi.core.features import TextFeaturizer

    ds = datasets.load("20newsgroups")
    X = TextFeaturizer().transform(ds.texts, update_sketch=False)
    y = np.array(ds.labels, dtype=object)
    keep = np.diff(X.indptr) > 0
    sp.save_npz(path / "X.npz", sp.csr_matrix(X[keep]))
    np.save(path / "y.npy", y[keep], allow_pickle=True)


def window(X: sp.csr_matrix, y: np.ndarray, n: int) -> tuple[sp.csr_matrix, np.ndarray, sp.csr_matrix]:
    """(window counts, labels, predict batch) of size ``n`` (see module docstring)."""
    rng = np.random.default_rng(0)
    if n < X.shape[0] - N_PREDICT:
        order = rng.permutation(X.shape[0])
        return X[order[:n]], y[order[:n]], X[order[n:n + N_PREDICT]]
    blocks, labels, r = [X], [y], 1
    while sum(b.shape[0] for b in blocks) < n:
        Xr, kept = thinned_copy(X, r)
        blocks.append(Xr)
        labels.append(y[kept])
        r += 1
    Xw = sp.vstack(blocks).tocsr()
    yw = np.concatenate(labels)
    order = rng.permutation(Xw.shape[0])[:n]
    pred = thinned_copy(X, 1000)[0][:N_PREDICT]
    return Xw[order], yw[order], pred


def rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def child(data: Path, algo: str, n: int) -> dict:
    """Fit and time one algorithm on one window (runs in its own process)."""
    from streamsemi.algorithms import make_estimator

    X = sp.load_npz(data / "X.npz").tocsr()
    y = np.load(data / "y.npy", allow_pickle=True)
    Xw, yw, Xp = window(X, y, n)
    del X
    seeds = stratified_seeds(yw, SEED_FRACTION, 0)
    rss_before = rss_mb()
    est = make_estimator(algo, random_state=0)
    t0 = time.perf_counter()
    est.fit(Xw, seeds)
    fit_s = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        est.predict_proba(Xp)
        est.predict(Xp)
        times.append(time.perf_counter() - t0)
    # predict() and predict_proba() are both timed; throughput counts one call's worth
    t0 = time.perf_counter()
    for _ in range(3):
        est.predict(Xp)
    pred_s = (time.perf_counter() - t0) / 3
    return {"algorithm": algo, "n_docs": int(Xw.shape[0]), "nnz": int(Xw.nnz),
            "n_features": int(Xw.shape[1]), "fit_s": fit_s,
            "predict_docs_per_s": Xp.shape[0] / pred_s,
            "predict_and_proba_docs_per_s": Xp.shape[0] / min(times),
            "peak_rss_mb": peak, "rss_before_fit_mb": rss_before,
            "peak_rss_over_baseline_mb": peak - rss_before}


def stratified_seeds(y: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """``max(1, round(fraction * N_c))`` seeds per class, drawn with numpy seed ``seed``."""
    rng = np.random.default_rng(seed)
    out = np.full(y.size, None, dtype=object)
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        out[rng.choice(idx, max(1, int(round(fraction * idx.size))), replace=False)] = c
    return out


def quality(params: dict, runs: int = 3) -> None:
    """SemiLDC vs ConstrainedKMeans macro-F1 on 20NG comp.* and talk.* (see docstring)."""
    from streamsemi.algorithms.constrained_kmeans import ConstrainedKMeans
    from streamsemi.algorithms.semi_ldc import SemiLDC
    from streamsemi.core import datasets
    from streamsemi.core.features import TextFeaturizer
    from streamsemi.evaluation.metrics import macro_f1

    ds = datasets.load("20newsgroups")
    X = TextFeaturizer().transform(ds.texts, update_sketch=False)
    y = np.array(ds.labels, dtype=object)
    rows = []
    for group in ("comp", "talk"):
        mask = np.array([lab.startswith(group + ".") for lab in y]) & (np.diff(X.indptr) > 0)
        Xg, yg = X[mask], y[mask]
        for i, frac in enumerate((0.01, 0.02, 0.03, 0.04, 0.05)):
            r: dict[str, list[float]] = {"semi_ldc": [], "plsa_only": [], "ckm": [], "fit_s": [],
                                         "mean_confidence": [], "accuracy": []}
            for run in range(runs):
                seeds = stratified_seeds(yg, frac, run)
                unl = np.array([v is None for v in seeds])
                t0 = time.perf_counter()
                est = SemiLDC(random_state=run, **params).fit(Xg, seeds)
                r["fit_s"].append(time.perf_counter() - t0)
                r["semi_ldc"].append(macro_f1(yg[unl], est.classes_[est.labels_][unl]))
                r["plsa_only"].append(macro_f1(yg[unl], est.plsa_.classes_[est.plsa_.labels_][unl]))
                P = est.predict_proba(Xg[unl])
                r["mean_confidence"].append(float(P.max(axis=1).mean()))
                r["accuracy"].append(float(np.mean(est.classes_[P.argmax(axis=1)] == yg[unl])))
                ck = ConstrainedKMeans(random_state=run).fit(Xg, seeds)
                r["ckm"].append(macro_f1(yg[unl], ck.classes_[ck.labels_][unl]))
            row = {"group": group, "n_docs": int(Xg.shape[0]), "label_fraction": frac,
                   "paper_semi_ldc": PAPER[group][i]}
            for k, v in r.items():
                row[k] = float(np.mean(v))
                row[k + "_sd"] = float(np.std(v))
            rows.append(row)
            print(f"{group} {frac:.2f}  semi-ldc {row['semi_ldc']:.3f}±{row['semi_ldc_sd']:.3f}  "
                  f"ckm {row['ckm']:.3f}±{row['ckm_sd']:.3f}  plsa {row['plsa_only']:.3f}  "
                  f"paper {row['paper_semi_ldc']:.3f}  conf {row['mean_confidence']:.3f} "
                  f"acc {row['accuracy']:.3f}", flush=True)
    out = {"benchmark": "bench_semi_ldc --quality", "params": params, "runs": runs,
           "command": "OMP_NUM_THREADS=1 python benchmarks/bench_semi_ldc.py --quality"
                      + (f" --params '{json.dumps(params)}'" if params else ""),
           "rows": rows}
    path = QUALITY if not params else QUALITY.with_name("semi_ldc.quality-variant.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="2000,10000,50000")
    ap.add_argument("--algorithms", default="semi-ldc,constrained-kmeans")
    ap.add_argument("--quality", action="store_true", help="run the macro-F1 comparison instead")
    ap.add_argument("--params", default="{}", help="SemiLDC parameters (JSON) for --quality")
    ap.add_argument("--child", nargs=3, metavar=("DATA", "ALGO", "N"), help=argparse.SUPPRESS)
    _bench.add_smoke(ap)
    args = _bench.parse(ap, argv, ["--sizes", "200"])  # --smoke: one 200-document window
    if args.child:
        print(json.dumps(child(Path(args.child[0]), args.child[1], int(args.child[2]))))
        return 0
    if args.quality:
        quality(json.loads(args.params))
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    algos = args.algorithms.split(",")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        build_corpus(Path(tmp))
        for n in sizes:
            for algo in algos:
                out = subprocess.run([sys.executable, __file__, "--child", tmp, algo, str(n)],
                                     check=True, capture_output=True, text=True)
                row = json.loads(out.stdout.strip().splitlines()[-1])
                rows.append(row)
                print(f"N={row['n_docs']:>6} {algo:<20} fit {row['fit_s']:7.2f}s  "
                      f"predict {row['predict_docs_per_s']:9.0f} docs/s  "
                      f"peak RSS {row['peak_rss_mb']:7.0f} MB (+{row['peak_rss_over_baseline_mb']:.0f})",
                      flush=True)
    base = {r["n_docs"]: r for r in rows if r["algorithm"] == "constrained-kmeans"}
    for r in rows:
        b = base.get(r["n_docs"])
        if b and r["algorithm"] != "constrained-kmeans":
            r["fit_ratio_vs_ckm"] = r["fit_s"] / b["fit_s"]
            r["predict_ratio_vs_ckm"] = r["predict_docs_per_s"] / b["predict_docs_per_s"]
            r["peak_rss_ratio_vs_ckm"] = r["peak_rss_mb"] / b["peak_rss_mb"]
    result = {
        "benchmark": "bench_semi_ldc", "commit": _bench.commit(),
        "command": "OMP_NUM_THREADS=1 python benchmarks/bench_semi_ldc.py --sizes " + args.sizes,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "omp_num_threads": os.environ.get("OMP_NUM_THREADS")},
        "targets": {"fit_10k_s": 30, "predict_docs_per_s": 20000, "peak_rss_50k_mb": 2048},
        "window_method": "random draw from 20NG (seed 0); beyond the corpus, replicated copies "
                         "with binomial thinning p=0.9 (seed = copy index); 5% stratified seeds",
        "rows": rows,
    }
    path = _bench.results_dir(args.smoke) / RESULTS.name
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
