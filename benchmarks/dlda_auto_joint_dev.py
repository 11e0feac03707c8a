"""Development check (session 34, not kept): D-LDA with ``n_new_clusters="auto"`` (the calibrated path)
against the paper's joint model given the number of new clusters the calibrated path counted.

Three 4-group 20 Newsgroups tasks no protocol reports (two groups known, two unseeded), 800 documents,
10% and 40% seeds of the known groups, runs 0-1, d-lda protocol scoring (NMI and pairwise F over all
four groups, macro-F1 over the known two). Findings: docs/algorithms/d-lda.md, section
"The number of new clusters from the calibrated path, the clusters from the joint model".

    OMP_NUM_THREADS=1 python benchmarks/dlda_auto_joint_dev.py 800
"""
import sys
from collections import Counter
from dataclasses import replace

import numpy as np

from streamsemi.evaluation import protocols as P
from streamsemi.evaluation.baselines import make_method as make
from streamsemi.evaluation.runner import fitted_single_labels, method_params, score_single

TASKS = {"dev-easyA": ["comp.windows.x", "misc.forsale", "soc.religion.christian", "rec.sport.hockey"],
         "dev-hardB": ["alt.atheism", "soc.religion.christian", "talk.religion.misc", "comp.windows.x"],
         "dev-easyC": ["misc.forsale", "sci.space", "comp.windows.x", "talk.politics.mideast"]}
base = P.DATASETS["20ng-easy1"]
for name, g in TASKS.items():
    P.DATASETS[name] = replace(base, id=name, classes=tuple(g), known=tuple(g[:2]))
proto = P.PROTOCOLS["d-lda"]
max_docs = int(sys.argv[1]) if len(sys.argv) > 1 else 800
data = P.prepare(list(TASKS), max_docs=max_docs)
res = {}
for ds, d in data.items():
    for lab in (10, 40):
        for run in range(2):
            draw = P.make_draw(proto, d, lab, run, 0)
            X = d.X[draw.rows]
            freq = Counter(d.labels)
            y = draw.y_fit_single(freq)
            ev = np.flatnonzero(draw.eval_mask)
            yt = [draw.y_true[i] for i in ev]
            params = method_params(proto, draw, run)
            out = {}
            e = make("d-lda", **params).fit(X, y)  # the true number of unseeded groups (2)
            out["true-k"] = score_single(proto, yt, fitted_single_labels(e, X, ev, False), draw.known)
            a = make("d-lda", **{**params, "n_new_clusters": "auto"}).fit(X, y)  # calibrated path
            k = len(a.new_clusters_)
            out["auto"] = score_single(proto, yt, fitted_single_labels(a, X, ev, False), draw.known)
            h = make("d-lda", **{**params, "n_new_clusters": k}).fit(X, y)  # joint model, the counted number
            out["hybrid"] = score_single(proto, yt, fitted_single_labels(h, X, ev, False), draw.known)
            for m, s in out.items():
                res.setdefault(m, []).append(s)
            print(ds, lab, run, "k=", k, {m: {kk: round(v, 3) for kk, v in s.items()} for m, s in out.items()}, flush=True)
for m, L in res.items():
    print(m, {k: round(float(np.mean([s[k] for s in L])), 3) for k in L[0]})
