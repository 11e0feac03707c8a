"""FSL benchmark: speed (fit time, peak memory, predict throughput) and quality (protocol ``fsl``).

Usage::

    python benchmarks/bench_fsl.py speed     # -> benchmarks/results/fsl.json
    python benchmarks/bench_fsl.py quality   # -> benchmarks/results/fsl_quality.json

Speed: fit time of each variant on 2k and 10k 20 Newsgroups documents (5 % seeds,
AP variants with their default sample bound), as a ratio to ConstrainedKMeans in
the same run; peak traced memory (tracemalloc, numpy buffers included) of each
fit (measured in the same, traced, fit); predict throughput on 2,000 unseen documents.

Quality (the paper's protocol): Reuters-21578 documents with exactly one topic
among the 10 most frequent ones, and 20 Newsgroups (20 groups); 400 unlabeled
documents plus L labeled ones (L = 10/20 .. 400, drawn at random without regard
to the class, so some classes may have no seed: those become ``new-i`` clusters,
K = number of classes). F-measure and entropy on the 400 unlabeled documents,
averaged over repetitions; "stream" = F-measure of ``predict`` on 1,000 held-out
documents (how the daemon labels new documents between refits). Every FSL
variant is compared with the same clusterer without feature-space learning
(``feature_learning=False``) and with ConstrainedKMeans in the same run.
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

from streamsemi.algorithms.constrained_kmeans import ConstrainedKMeans
from streamsemi.algorithms.fsl import FSL
from streamsemi.core import datasets
from streamsemi.core.features import TextFeaturizer
from streamsemi.evaluation.metrics import entropy, f_measure

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench  # noqa: E402


def load_corpus(name: str, limit: int | None = None) -> tuple:
    """Counts and labels: ``reuters`` (top-10 single-topic) or ``20ng`` (its first ``limit`` documents)."""
    f = TextFeaturizer()
    if name == "reuters":
        d = datasets.load("reuters21578")
        idx = [i for i, lab in enumerate(d.labels) if len(lab) == 1 and d.texts[i].strip()]
        top = [c for c, _ in collections.Counter(d.labels[i][0] for i in idx).most_common(10)]
        idx = [i for i in idx if d.labels[i][0] in top]
        texts, y = [d.texts[i] for i in idx], [d.labels[i][0] for i in idx]
    else:
        d = datasets.load("20newsgroups")
        texts, y = d.texts[:limit], d.labels[:limit]
    X = f.transform(texts)
    y = np.array(y, dtype=object)
    keep = np.diff(X.indptr) > 0
    return X[keep], y[keep], f.sketch


def models(n_new: int, **fsl: object) -> dict:
    out = {"constrained-kmeans": ConstrainedKMeans(n_new_clusters=n_new),
           "seeded-kmeans": ConstrainedKMeans(constrained=False, n_new_clusters=n_new)}
    for v in ("sk", "ck", "ap", "sap"):
        out[f"fsl-{v}"] = FSL(variant=v, n_new_clusters=n_new, **fsl)
        out[f"fsl-{v} (no FSL)"] = FSL(variant=v, n_new_clusters=n_new, feature_learning=False, **fsl)
    return out


def quality(reps: int) -> dict:
    report: dict = {"protocol": "fsl", "reps": reps, "n_unlabeled": 400, "datasets": {}}
    for name, sizes in (("reuters", [10, 50, 100, 200, 300, 400]), ("20ng", [20, 50, 100, 200, 300, 400])):
        X, y, _ = load_corpus(name)
        classes = np.unique(y)
        runs: dict = {}
        for n_lab in sizes:
            for rep in range(reps):
                rng = np.random.default_rng(1000 * rep + n_lab)
                perm = rng.permutation(X.shape[0])
                rows, held = perm[: 400 + n_lab], perm[400 + n_lab: 1400 + n_lab]
                seeds = np.full(rows.size, None, dtype=object)
                seeds[400:] = y[rows[400:]]
                n_new = classes.size - np.unique(seeds[400:]).size
                for mname, m in models(n_new).items():
                    t0 = time.perf_counter()
                    m.fit(X[rows], seeds)
                    dt = time.perf_counter() - t0
                    pred = m.classes_[m.labels_[:400]]
                    stream = m.predict(X[held])
                    runs.setdefault(mname, {}).setdefault(n_lab, []).append(
                        [f_measure(y[rows[:400]], pred), entropy(y[rows[:400]], pred),
                         f_measure(y[held], stream), dt])
                print(name, n_lab, rep, flush=True)
        table = {}
        for mname, by_size in runs.items():
            curve = {n: np.mean(v, axis=0).tolist() for n, v in by_size.items()}
            F = np.array([c[0] for c in curve.values()])
            E = np.array([c[1] for c in curve.values()])
            S = np.array([c[2] for c in curve.values()])
            table[mname] = {"max_f": float(F.max()), "mean_f": float(F.mean()), "min_e": float(E.min()),
                            "mean_e": float(E.mean()), "mean_stream_f": float(S.mean()),
                            "mean_fit_s": float(np.mean([c[3] for c in curve.values()])),
                            "curve": {str(n): {"f": c[0], "e": c[1], "stream_f": c[2]} for n, c in curve.items()}}
        report["datasets"][name] = {"n_docs": int(X.shape[0]), "n_classes": int(classes.size), "models": table}
    return report


def speed(sizes: tuple[int, ...] = (2000, 10000), n_new_docs: int = 2000) -> dict:
    X, y, _ = load_corpus("20ng", None if max(sizes) > 2000 else 4 * (max(sizes) + n_new_docs))
    rng = np.random.default_rng(0)
    perm = rng.permutation(X.shape[0])
    new = X[perm[-n_new_docs:]]
    report: dict = {"corpus": "20newsgroups", "seed_fraction": 0.05, "machine": platform.processor() or platform.machine(),
                    "sizes": {}}
    for n in sizes:
        rows = perm[:n]
        seeds = np.full(n, None, dtype=object)
        seeds[: n // 20] = y[rows[: n // 20]]
        Xw = X[rows]
        out = {}
        for name, m in {"constrained-kmeans": ConstrainedKMeans(),
                        **{f"fsl-{v}": FSL(variant=v) for v in ("sk", "ck", "ap", "sap")}}.items():
            tracemalloc.start()  # numpy-dominated fits: tracing overhead is small
            t0 = time.perf_counter()
            m.fit(Xw, seeds)
            fit_s = time.perf_counter() - t0
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            t0 = time.perf_counter()
            m.predict(new)
            pred_s = time.perf_counter() - t0
            out[name] = {"fit_s": fit_s, "peak_mb": peak / 2**20, "predict_docs_per_s": new.shape[0] / pred_s,
                         "n_iter": int(getattr(m, "n_iter_", 0))}
            print(n, name, out[name], flush=True)
        base = out["constrained-kmeans"]["fit_s"]
        for v in out.values():
            v["ratio_to_ckm"] = v["fit_s"] / base
        report["sizes"][str(n)] = out
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", nargs="?", choices=["speed", "quality"], default="speed")
    ap.add_argument("--reps", type=int, default=3)
    _bench.add_smoke(ap)
    args = ap.parse_args(argv)
    results = _bench.results_dir(args.smoke)
    if args.what == "speed":  # --smoke: 200 documents, 100 to predict
        path = results / "fsl.json"
        report = speed((200,), 100) if args.smoke else speed()
    else:
        path, report = results / "fsl_quality.json", quality(args.reps)
    report["commit"] = _bench.commit()
    path.write_text(json.dumps(report, indent=2) + "\n")
    print("wrote", path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
