"""D-LDA's discovery on development tasks: two comparisons, the same draws and scoring.

**Default** (session 5): its own joint model ("legacy") against the shared calibrated path, on
the d-lda protocol's development tasks of that time (the quick results page reported 20ng-easy1
and 20ng-difficult1; these are the other six), 800 documents, 10% and 40% seeds of the two known
groups, run 0, the true number (2) of unseeded groups:

    OMP_NUM_THREADS=1 python benchmarks/dlda_discovery_dev.py \
        20ng-easy2,20ng-easy3,20ng-easy4,20ng-difficult2,20ng-difficult3,20ng-difficult4

**--auto-joint** (session 34, not kept): ``n_new_clusters="auto"`` (the calibrated path) against
the paper's joint model given the number of new clusters the calibrated path counted, and the
true number, on three 4-group 20 Newsgroups tasks no protocol reports (:data:`DEV_TASKS`, two
groups known), runs 0-1 (docs/algorithms/d-lda.md, "The number of new clusters from the
calibrated path, the clusters from the joint model"; output
``benchmarks/results/dlda_auto_joint_dev_s34.txt``):

    OMP_NUM_THREADS=1 python benchmarks/dlda_discovery_dev.py --auto-joint

Both print NMI (arithmetic mean), pairwise F and known-class macro-F1 of each variant.
"""
import sys
from collections.abc import Iterator
from dataclasses import replace

import numpy as np

from streamsemi.evaluation.baselines import make_method
from streamsemi.evaluation.protocols import DATASETS, PROTOCOLS, make_draw, prepare
from streamsemi.evaluation.runner import fitted_single_labels, method_params, score_single

p = PROTOCOLS["d-lda"]
#: --auto-joint: 4-group tasks of the 20NG groups, the first two known
DEV_TASKS = {"dev-easyA": ["comp.windows.x", "misc.forsale", "soc.religion.christian", "rec.sport.hockey"],
             "dev-hardB": ["alt.atheism", "soc.religion.christian", "talk.religion.misc", "comp.windows.x"],
             "dev-easyC": ["misc.forsale", "sci.space", "comp.windows.x", "talk.politics.mideast"]}


def draws(datasets: list[str], runs: int) -> Iterator[tuple]:
    """``(dataset, seed rate, run, draw, X, eval rows, true labels of the eval rows)``, 800 documents."""
    data = prepare(datasets, max_docs=800, seed=0)
    for ds in data:
        for lab in (10, 40):
            for run in range(runs):
                draw = make_draw(p, data[ds], lab, run, 0)
                ev = np.flatnonzero(draw.eval_mask)
                yield ds, lab, run, draw, data[ds].X[draw.rows], ev, [draw.y_true[i] for i in ev]


def score(est, X, ev, yt, draw) -> dict[str, float]:
    return score_single(p, yt, fitted_single_labels(est, X, ev, False), draw.known)


def rounded(sc: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 3) for k, v in sc.items()}


def default_comparison(datasets: list[str]) -> None:
    for ds, lab, run, draw, X, ev, yt in draws(datasets, 1):
        for discovery in ("calibrated", "legacy"):
            est = make_method("d-lda", **{**method_params(p, draw, run), "discovery": discovery})
            est.fit(X, draw.y_fit_single())
            print(ds, lab, "d-lda", discovery, rounded(score(est, X, ev, yt, draw)), flush=True)


def auto_joint_comparison() -> None:
    base = DATASETS["20ng-easy1"]
    for name, groups in DEV_TASKS.items():
        DATASETS[name] = replace(base, id=name, classes=tuple(groups), known=tuple(groups[:2]))
    res: dict[str, list[dict[str, float]]] = {}
    for ds, lab, run, draw, X, ev, yt in draws(list(DEV_TASKS), 2):
        y = draw.y_fit_single()
        params = method_params(p, draw, run)
        true_k = make_method("d-lda", **params).fit(X, y)  # the true number of unseeded groups (2)
        auto = make_method("d-lda", **{**params, "n_new_clusters": "auto"}).fit(X, y)  # calibrated path
        k = len(auto.new_clusters_)
        joint = make_method("d-lda", **{**params, "n_new_clusters": k}).fit(X, y)  # joint model, the counted number
        out = {"true-k": score(true_k, X, ev, yt, draw), "auto": score(auto, X, ev, yt, draw),
               "hybrid": score(joint, X, ev, yt, draw)}
        for m, s in out.items():
            res.setdefault(m, []).append(s)
        print(ds, lab, run, "k=", k, {m: rounded(s) for m, s in out.items()}, flush=True)
    for m, scores in res.items():
        print(m, {k: round(float(np.mean([s[k] for s in scores])), 3) for k in scores[0]})


if __name__ == "__main__":
    if sys.argv[1:] == ["--auto-joint"]:
        auto_joint_comparison()
    else:
        default_comparison(sys.argv[1].split(","))
