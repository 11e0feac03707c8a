"""D-LDA's discovery default (session 5): its own joint model ("legacy") against the shared calibrated path.

On the d-lda protocol's development tasks (the quick results page reports 20ng-easy1 and
20ng-difficult1; these are the other six), 800 documents, 10% and 40% seeds of the two known
groups, run 0, the true number (2) of unseeded groups:

    OMP_NUM_THREADS=1 python benchmarks/dlda_discovery_dev.py \
        20ng-easy2,20ng-easy3,20ng-easy4,20ng-difficult2,20ng-difficult3,20ng-difficult4

prints NMI (arithmetic mean), pairwise F and known-class macro-F1 of each variant.
"""
import sys

import numpy as np

from streamsemi.evaluation.baselines import make_method
from streamsemi.evaluation.protocols import PROTOCOLS, make_draw, prepare
from streamsemi.evaluation.runner import fitted_single_labels, method_params, score_single

p = PROTOCOLS["d-lda"]
data = prepare(sys.argv[1].split(","), max_docs=800, seed=0)
for ds in data:
    for lab in (10, 40):
        draw = make_draw(p, data[ds], lab, 0, 0)
        X = data[ds].X[draw.rows]
        ev = np.flatnonzero(draw.eval_mask)
        yt = [draw.y_true[i] for i in ev]
        for name, extra in (("d-lda", {"discovery": "calibrated"}), ("d-lda", {"discovery": "legacy"}),
                            ):
            est = make_method(name, **{**method_params(p, draw, 0), **extra})
            est.fit(X, draw.y_fit_single())
            pred = fitted_single_labels(est, X, ev, False)
            sc = score_single(p, yt, pred, draw.known)
            print(ds, lab, name, extra["discovery"], {k: round(v, 3) for k, v in sc.items()}, flush=True)
