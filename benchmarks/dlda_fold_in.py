"""D-LDA's fold-in: CVB0, Gibbs with the word topics summed out, and Gibbs sampling z and y (issue 16).

Fits D-LDA on ``--docs`` documents of a corpus with a fraction of stratified-by-order seeds,
then labels ``--held-out`` unseen documents with each fold-in (pi, phi fixed; the
estimator's ``fold_in_sweeps``, averaging and ``fold_in_tol``): seconds, macro-F1 of the
held-out documents, how often two agree, and how often the z-and-y sampler agrees with
itself under another seed (the Monte Carlo floor). ``collapsed`` is ``fold_in="gibbs"``
(the default of sessions 8-16), ``cvb0`` the default since session 17::

    OMP_NUM_THREADS=1 python benchmarks/dlda_fold_in.py --corpus 20newsgroups --docs 5000 --every 20
    OMP_NUM_THREADS=1 python benchmarks/dlda_fold_in.py --corpus reuters-r8 --docs 4500 --every 50
    OMP_NUM_THREADS=1 python benchmarks/dlda_fold_in.py --corpus reuters-r52 --docs 5000 --every 20

Appends one entry per run to ``benchmarks/results/dlda_fold_in.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from sklearn.metrics import f1_score

from streamsemi.algorithms import _dlda_gibbs as gibbs
from streamsemi.algorithms import build_estimator
from streamsemi.algorithms.dlda import class_proba
from streamsemi.core.datasets import load
from streamsemi.core.features import TextFeaturizer
from streamsemi.engine import fit_estimator

OUT = Path(__file__).parent / "results" / "dlda_fold_in.json"


def z_and_y_proba(est, X, seed: int) -> np.ndarray:
    """``predict_proba`` as before session 8: the fold-in that samples each token's topic too."""
    ptr, w = est.fold_in_tokens(X)
    T = int(ptr[-1])
    sweeps = int(est.fold_in_sweeps)
    n_avg = max(1, sweeps // 2)
    acc = gibbs.fold_in(ptr, w, np.full(T, -1, np.int16), np.full(T, -1, np.int16),
                        np.full(X.shape[0], -1, dtype=np.int64), est.pi_, est._phiT(), est._class_alpha(),
                        sweeps, n_avg, seed)
    return class_proba(acc / n_avg, est._class_alpha())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", default="20newsgroups")
    ap.add_argument("--docs", type=int, default=5000)
    ap.add_argument("--held-out", type=int, default=3000)
    ap.add_argument("--every", type=int, default=20, help="every n-th fitted document is a seed")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    ds = load(args.corpus)
    order = np.random.default_rng(args.seed).permutation(len(ds))
    feat = TextFeaturizer(2**18)
    fit_idx, held_idx = order[:args.docs], order[args.docs:args.docs + args.held_out]
    X = feat.transform([ds.texts[i] for i in fit_idx], update_sketch=False)
    Xh = feat.transform([ds.texts[i] for i in held_idx], update_sketch=False)
    truth = np.array([ds.labels[i] for i in held_idx])
    y = [ds.labels[i] if j % args.every == 0 else None for j, i in enumerate(fit_idx)]
    est = build_estimator("d-lda", None, 0, 0)
    t0 = time.perf_counter()
    fit_estimator(est, X, y, [str(i) for i in fit_idx])
    fit_s = time.perf_counter() - t0
    classes = np.asarray(est.classes_)
    est.set_params(fold_in="gibbs")
    est.predict_proba(Xh[:5])  # compiled
    z_and_y_proba(est, Xh[:5], 0)
    t0 = time.perf_counter()
    P_new = est.predict_proba(Xh)
    new_s = time.perf_counter() - t0
    est.set_params(fold_in="cvb0")
    est.predict_proba(Xh[:5])
    t0 = time.perf_counter()
    P_cvb = est.predict_proba(Xh)
    cvb_s = time.perf_counter() - t0
    seed = int(est._seed(4))
    t0 = time.perf_counter()
    P_old = z_and_y_proba(est, Xh, seed)
    old_s = time.perf_counter() - t0
    P_old2 = z_and_y_proba(est, Xh, seed + 1)

    def f1(P: np.ndarray) -> float:
        return float(f1_score(truth, classes[P.argmax(axis=1)], average="macro"))

    row = {"corpus": args.corpus, "docs": args.docs, "held_out": int(len(held_idx)), "seed_every": args.every,
           "fit_seconds": round(fit_s, 1), "collapsed_seconds": round(new_s, 3), "z_and_y_seconds": round(old_s, 3),
           "speed_up": round(old_s / new_s, 1), "cvb0_seconds": round(cvb_s, 3),
           "cvb0_speed_up_over_collapsed": round(new_s / cvb_s, 1), "macro_f1_cvb0": round(f1(P_cvb), 3),
           "agree_cvb0_collapsed": round(float(np.mean(P_cvb.argmax(1) == P_new.argmax(1))), 3),
           "fold_in_sweeps": int(est.fold_in_sweeps), "fold_in_tol": float(est.fold_in_tol),
           "macro_f1_collapsed": round(f1(P_new), 3),
           "macro_f1_z_and_y": round(f1(P_old), 3), "macro_f1_z_and_y_other_seed": round(f1(P_old2), 3),
           "agree_collapsed_z_and_y": round(float(np.mean(P_new.argmax(1) == P_old.argmax(1))), 3),
           "agree_z_and_y_two_seeds": round(float(np.mean(P_old.argmax(1) == P_old2.argmax(1))), 3)}
    print(json.dumps(row))
    runs = json.loads(OUT.read_text()) if OUT.exists() else []
    OUT.write_text(json.dumps(runs + [row], indent=1) + "\n")


if __name__ == "__main__":
    main()
