"""pseudo-LSC benchmarks: speed/memory (``speed``) and the Reuters quality protocol (``quality``).

Run on demand (not part of the test suite)::

    OMP_NUM_THREADS=1 python benchmarks/bench_pseudo_lsc.py speed
    OMP_NUM_THREADS=1 python benchmarks/bench_pseudo_lsc.py quality
    OMP_NUM_THREADS=1 python benchmarks/bench_pseudo_lsc.py stream

Each mode stores its section ("speed", "quality", "stream") in
``benchmarks/results/pseudo_lsc.json``, keeping the other sections.

``speed``: fit time of :class:`PseudoLSC` and :class:`ConstrainedKMeans` on the same
2k / 10k / 50k documents (10% seeds), each measurement in a fresh subprocess so that
its peak RSS is its own; predict throughput on 10k unseen documents. The corpus is
the pool of reuters21578 (21,578 stories) + 20newsgroups (18,821 posts) texts with
empty documents dropped; 50k documents need more than the pool holds, so the pool is
cycled (documents repeat, which does not change the cost per document).

``quality``: the ``pseudo-lsc`` protocol. reuters21578 documents with at least one of
the 20 most frequent topics (labels restricted to those 20), seeded 50/50 split, macro
ROC AUC over the 20 topics on the test half, for several seed fractions of the train
half (the rest of the train half is unlabeled) and several random splits. Same run:
pseudo-LSC, pseudo-LSC without impurity and chi-square (SCAD2-like ablation), without
chi-square only, a one-vs-rest logistic regression on sublinear tf-idf of the seeds,
and ConstrainedKMeans on label-powerset classes (score of a topic = summed
probability of the label sets containing it).

``stream``: documents in date order; a window of the last 5,000 documents with 10%
of them seeded is refitted every 1,000 documents and labels the next 1,000 unseen
ones with ``predict_proba``; macro AUC over all labelled-ahead documents.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench  # noqa: E402

RESULTS = _bench.RESULTS


# --------------------------------------------------------------------------- data


def reuters_top20() -> tuple[Any, list[list[str]], list[str], list]:
    """Counts, labels restricted to the 20 most frequent topics, the topics, dates."""
    from streamsemi.core import datasets
    from streamsemi.core.features import TextFeaturizer

    d = datasets.load("reuters21578")
    counts = Counter(t for labels in d.labels for t in labels)
    top = [t for t, _ in counts.most_common(20)]
    topset = set(top)
    idx = [i for i, labels in enumerate(d.labels) if set(labels) & topset]
    X = TextFeaturizer().transform([d.texts[i] for i in idx], update_sketch=False)
    labels = [sorted(set(d.labels[i]) & topset) for i in idx]
    dates = [d.dates[i] if d.dates else None for i in idx]
    keep = np.flatnonzero(np.diff(X.indptr) > 0)
    return X[keep], [labels[i] for i in keep], top, [dates[i] for i in keep]


def pooled_corpus(n: int) -> tuple[Any, list[list[str]]]:
    """``n`` documents from reuters21578 + 20newsgroups (cycled when n exceeds the pool)."""
    from streamsemi.core import datasets
    from streamsemi.core.features import TextFeaturizer

    r = datasets.load("reuters21578")
    g = datasets.load("20newsgroups")
    texts = list(r.texts) + list(g.texts)
    labels = [list(x) for x in r.labels] + [[str(x)] for x in g.labels]
    rng = np.random.default_rng(0)
    order = rng.permutation(len(texts))
    order = np.resize(order, n)
    X = TextFeaturizer().transform([texts[i] for i in order], update_sketch=False)
    labels = [labels[i] for i in order]
    keep = np.flatnonzero(np.diff(X.indptr) > 0)
    return X[keep], [labels[i] for i in keep]


def seed_subset(labels: list[list[str]], frac: float, rng: np.random.Generator) -> list[list[str]]:
    """Keep the labels of a random ``frac`` of the labelled documents, [] elsewhere."""
    has = np.flatnonzero([bool(x) for x in labels])
    chosen = set(rng.choice(has, size=max(2, int(round(frac * has.size))), replace=False).tolist())
    return [labels[i] if i in chosen else [] for i in range(len(labels))]


# --------------------------------------------------------------------------- speed


def _speed_worker(algo: str, n: int, n_test: int = 10_000) -> dict[str, Any]:
    from streamsemi.algorithms.constrained_kmeans import ConstrainedKMeans
    from streamsemi.algorithms.pseudo_lsc import PseudoLSC

    X, labels = pooled_corpus(n + n_test)
    Xtr, Xte = X[:n], X[n:n + n_test]
    y = seed_subset(labels[:n], 0.10, np.random.default_rng(1))
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out: dict[str, Any] = {"algo": algo, "n_docs": int(Xtr.shape[0]), "n_seeds": sum(bool(v) for v in y)}
    if algo == "pseudo-lsc":
        model = PseudoLSC(random_state=0)
        t0 = time.perf_counter()
        model.fit(Xtr, y)
        out["fit_s"] = time.perf_counter() - t0
        out["n_clusters"] = int(model.n_clusters_)
        out["n_classes"] = int(model.classes_.size)
        out["n_iter"] = int(model.n_iter_)
        t0 = time.perf_counter()
        model.predict_proba(Xte)
        dt = time.perf_counter() - t0
        out["predict_docs_per_s"] = Xte.shape[0] / dt
    else:
        y1 = [v[0] if v else None for v in y]
        model = ConstrainedKMeans(random_state=0)
        t0 = time.perf_counter()
        model.fit(Xtr, y1)
        out["fit_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        model.predict_proba(Xte)
        out["predict_docs_per_s"] = Xte.shape[0] / (time.perf_counter() - t0)
    out["rss_before_fit_mb"] = rss0
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def run_speed(sizes: list[int], n_test: int = 10_000) -> dict[str, Any]:
    rows = []
    for n in sizes:
        for algo in ("constrained-kmeans", "pseudo-lsc"):
            proc = subprocess.run([sys.executable, __file__, "_speed_worker", algo, str(n), str(n_test)],
                                  capture_output=True, text=True, check=True)
            row = json.loads(proc.stdout.strip().splitlines()[-1])
            print(row, flush=True)
            rows.append(row)
    summary = []
    for n in sizes:
        a = [r for r in rows if r["algo"] == "pseudo-lsc"][sizes.index(n)]
        b = [r for r in rows if r["algo"] == "constrained-kmeans"][sizes.index(n)]
        summary.append({"n_docs": a["n_docs"], "pseudo_lsc_fit_s": round(a["fit_s"], 3),
                        "constrained_kmeans_fit_s": round(b["fit_s"], 3),
                        "ratio": round(a["fit_s"] / b["fit_s"], 2),
                        "pseudo_lsc_peak_rss_mb": round(a["peak_rss_mb"]),
                        "pseudo_lsc_predict_docs_per_s": round(a["predict_docs_per_s"])})
    return {"corpus": "reuters21578 + 20newsgroups pool (cycled beyond 40,399 docs), 10% seeds",
            "commit": _bench.commit(), "predicted_docs": n_test,
            "threads": os.environ.get("OMP_NUM_THREADS", "unset"), "runs": rows, "summary": summary}


# --------------------------------------------------------------------------- quality


def _label_matrix(labels: list[list[str]], top: list[str]) -> np.ndarray:
    return np.array([[int(t in s) for t in top] for s in labels])


def _scores(classes: Any, P: np.ndarray, top: list[str]) -> np.ndarray:
    cols = {str(c): i for i, c in enumerate(classes)}
    return np.column_stack([P[:, cols[t]] if t in cols else np.zeros(P.shape[0]) for t in top])


def score_methods(Xtr: Any, ytr: list[list[str]], Xte: Any, top: list[str],
                  methods: list[str]) -> dict[str, np.ndarray]:
    """Per-topic scores of each method on ``Xte`` (n_test x 20)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.multiclass import OneVsRestClassifier

    from streamsemi.algorithms.constrained_kmeans import ConstrainedKMeans
    from streamsemi.algorithms.pseudo_lsc import PseudoLSC
    from streamsemi.core.features import idf_weights, tfidf

    out: dict[str, np.ndarray] = {}
    seeds = np.flatnonzero([bool(v) for v in ytr])
    for name in methods:
        t0 = time.perf_counter()
        if name.startswith("pseudo-lsc"):
            params = {"pseudo-lsc": {}, "pseudo-lsc-no-imp-no-chi2": {"use_impurity": False, "use_chi2": False},
                      "pseudo-lsc-no-chi2": {"use_chi2": False}}[name]
            m = PseudoLSC(random_state=0, **params).fit(Xtr, ytr)
            out[name] = _scores(m.classes_, m.predict_proba(Xte), top)
        elif name == "ovr-logreg":
            idf = idf_weights(Xtr)
            Ys = _label_matrix([ytr[i] for i in seeds], top)
            present = Ys.sum(axis=0) > 0
            clf = OneVsRestClassifier(LogisticRegression(C=10.0, max_iter=1000))
            clf.fit(tfidf(Xtr[seeds], idf), Ys[:, present])
            S = np.zeros((Xte.shape[0], len(top)))
            S[:, present] = clf.predict_proba(tfidf(Xte, idf))
            out[name] = S
        elif name == "constrained-kmeans-lp":
            y1 = ["+".join(v) if v else None for v in ytr]
            m = ConstrainedKMeans(random_state=0).fit(Xtr, y1)
            P = m.predict_proba(Xte)
            S = np.zeros((Xte.shape[0], len(top)))
            for c, cls in enumerate(m.classes_):
                for t in str(cls).split("+"):
                    S[:, top.index(t)] += P[:, c]
            out[name] = S
        print(f"    {name}: {time.perf_counter() - t0:.1f}s", flush=True)
    return out


METHODS = ["pseudo-lsc", "pseudo-lsc-no-chi2", "pseudo-lsc-no-imp-no-chi2", "ovr-logreg",
           "constrained-kmeans-lp"]


def run_quality(fractions: list[float], splits: list[int]) -> dict[str, Any]:
    from streamsemi.evaluation.metrics import macro_auc

    X, labels, top, _ = reuters_top20()
    rows = []
    for split in splits:
        rng = np.random.default_rng(split)
        perm = rng.permutation(X.shape[0])
        half = X.shape[0] // 2
        tr, te = perm[:half], perm[half:]
        Yte = _label_matrix([labels[j] for j in te], top)
        for frac in fractions:
            ytr = seed_subset([labels[j] for j in tr], frac, np.random.default_rng(100 + split))
            print(f"split {split} seed fraction {frac}", flush=True)
            scores = score_methods(X[tr], ytr, X[te], top, METHODS)
            for name, S in scores.items():
                auc = macro_auc(Yte, S)
                rows.append({"split": split, "seed_fraction": frac, "method": name, "macro_auc": auc})
                print(f"  {name:28s} {auc:.4f}", flush=True)
    table = {}
    for frac in fractions:
        for name in METHODS:
            v = [r["macro_auc"] for r in rows if r["seed_fraction"] == frac and r["method"] == name]
            table.setdefault(str(frac), {})[name] = {"mean": round(float(np.mean(v)), 4),
                                                     "std": round(float(np.std(v)), 4)}
    return {"protocol": "pseudo-lsc: reuters21578, 20 most frequent topics, 50/50 split, macro ROC AUC",
            "n_docs": int(X.shape[0]), "topics": top, "splits": splits, "runs": rows, "table": table}


def run_stream(window: int = 5000, step: int = 1000, frac: float = 0.10) -> dict[str, Any]:
    from streamsemi.evaluation.metrics import macro_auc

    X, labels, top, dates = reuters_top20()
    order = sorted(range(X.shape[0]), key=lambda i: (dates[i] is None, dates[i] or 0, i))
    X = X[order]
    labels = [labels[i] for i in order]
    rng = np.random.default_rng(0)
    seeded = rng.random(len(labels)) < frac
    y_all = [labels[i] if seeded[i] else [] for i in range(len(labels))]
    Ss: dict[str, list[np.ndarray]] = {}
    Ys = []
    for start in range(window, X.shape[0], step):
        lo = start - window
        end = min(start + step, X.shape[0])
        scores = score_methods(X[lo:start], y_all[lo:start], X[start:end], top,
                               ["pseudo-lsc", "ovr-logreg", "constrained-kmeans-lp"])
        for name, S in scores.items():
            Ss.setdefault(name, []).append(S)
        Ys.append(_label_matrix(labels[start:end], top))
    Y = np.vstack(Ys)
    res = {name: round(macro_auc(Y, np.vstack(v)), 4) for name, v in Ss.items()}
    print(res)
    return {"protocol": f"date order, window {window}, refit every {step}, {frac:.0%} seeds, "
                        "predict the next documents before they enter the window",
            "n_predicted": int(Y.shape[0]), "macro_auc": res}


def save_section(name: str, res: dict[str, Any], results: Path = RESULTS) -> Path:
    """Write ``res`` under ``name`` in ``results/pseudo_lsc.json``, keeping other sections."""
    path = results / "pseudo_lsc.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    if "speed" not in data and "summary" in data:  # an older file holding only the speed run
        data = {"speed": data}
    data[name] = {**res, "commit": _bench.commit()}
    path.write_text(json.dumps(data, indent=2))
    return path


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", nargs="?", default="speed", choices=("speed", "quality", "stream", "_speed_worker"),
                    help="_speed_worker ALGO N N_TEST: (internal) one measurement, in its own process")
    ap.add_argument("values", nargs="*", help="speed: window sizes (default 2000 10000 50000)")
    _bench.add_smoke(ap)
    args = ap.parse_args(argv)
    if args.mode == "_speed_worker":
        algo, n, n_test = args.values
        print(json.dumps(_speed_worker(algo, int(n), int(n_test))))
        return 0
    results = _bench.results_dir(args.smoke)
    if args.mode == "speed":  # --smoke: 200 documents, 100 predicted
        sizes = [200] if args.smoke else [int(v) for v in args.values] or [2000, 10_000, 50_000]
        path = save_section("speed", run_speed(sizes, 100 if args.smoke else 10_000), results)
    elif args.mode == "quality":
        path = save_section("quality", run_quality([0.01, 0.05, 0.10, 0.5], [0, 1, 2]), results)
    else:
        path = save_section("stream", run_stream(), results)
    print("wrote", path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
