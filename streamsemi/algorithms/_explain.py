"""Which window documents each class / cluster of a fitted estimator holds (for
:func:`streamsemi.core.explain.explain_classes`, the distinctive words the engine publishes)."""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp


def window_membership(est: Any, X: sp.spmatrix, multilabel: bool = False,
                      scored: tuple[np.ndarray, np.ndarray | None] | None = None) -> Any:
    """Class index (into ``est.classes_``) of each row of ``X``, the training window of ``est``.

    The fitted assignment ``labels_`` when it covers every row (no extra scoring), else the
    argmax of ``predict_proba``; a multi-label estimator's ``predict`` indicator matrix.
    ``scored``: ``(predict_proba(X), predict(X) indicator or None)`` already computed
    (:func:`streamsemi.engine.score_rows`), used instead of predicting again.
    """
    if multilabel:
        ind = scored[1] if scored is not None and scored[1] is not None else est.predict(X)
        return sp.csr_matrix(np.asarray(ind) > 0)
    lab = getattr(est, "labels_", None)
    if lab is not None and len(lab) == X.shape[0] and np.asarray(lab).dtype.kind in "iu":
        return np.asarray(lab, dtype=np.int64)
    return np.asarray(est.predict_proba(X) if scored is None else scored[0]).argmax(axis=1)


__all__ = ["window_membership"]
