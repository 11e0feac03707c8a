"""Checks a decoded model before anything serves it: the registry's exact class, its own methods, fitted, finite.

A model restored from bytes (the models topic, a checkpoint) is made only of the
registry's classes and arrays (never pickle), but its *values* are whatever the bytes
said: a NaN centroid serves score null, a centroid matrix of the wrong width or an
instance attribute named ``predict_proba`` fails every document. :func:`validate_model`
refuses such a model with a short reason, so the caller keeps the model it serves.

The reason starts with a category (``unknown_algorithm``, ``class``, ``shadowed``,
``not_fitted``, ``classes``, ``n_features``, ``non_finite``, ``structure``, ``probe``),
a colon and the detail: ``reason.split(":")[0]`` is a bounded metric label
(:func:`reason_category`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from streamsemi.algorithms import AlgorithmNotAvailable, algorithm_class
from streamsemi.algorithms.base import StreamsemiEstimator

#: The categories a reason starts with (metric label values).
CATEGORIES: tuple[str, ...] = ("unknown_algorithm", "class", "shadowed", "not_fitted", "classes", "n_features",
                               "non_finite", "structure", "probe")

#: Attributes whose float values may legitimately be non-finite, and which values:
#: class thresholds of discovery are ``-inf`` for a class whose seeds give nothing to calibrate
#: on (every document is explained); the ensemble's held-out scores are NaN for a member whose
#: fit failed (that member is ``None`` in ``estimators_``).
_NEG_INF_ALLOWED: frozenset[str] = frozenset({"discovery_thresholds_"})
_NAN_ALLOWED: dict[str, frozenset[str]] = {"Ensemble": frozenset({"heldout_accuracy_", "scores_", "weights_"})}

_MAX_DEPTH = 6          # nesting of estimators / containers walked
_MAX_VALUES = 100_000   # container elements walked in one model (a bound on the work)
_PROBE_ROWS = 2


def reason_category(reason: str) -> str:
    """The bounded category of a :func:`validate_model` reason (its text before the first colon)."""
    head = reason.split(":", 1)[0]
    return head if head in CATEGORIES else "structure"


def _own_attributes(est: Any) -> dict[str, Any]:
    try:
        return dict(vars(est))
    except TypeError:
        return {}


def _shadowed(est: Any) -> str | None:
    """An instance attribute that hides an attribute of the class (a method, a property, a constant)."""
    cls = type(est)
    for key in _own_attributes(est):
        if key.startswith("__") or hasattr(cls, key):
            return f"shadowed: instance attribute {key!r} hides {cls.__name__}.{key}"
    return None


class _Walker:
    """Walks the fitted attributes of an estimator (and the estimators nested in them), bounded."""

    def __init__(self, allowed_classes: dict[str, type]) -> None:
        self.allowed = allowed_classes
        self.seen = 0

    def estimator(self, est: Any, where: str, depth: int) -> str | None:
        cls_name = type(est).__name__
        if self.allowed.get(cls_name) is not type(est):
            return f"class: {where} is a {cls_name}, not one of the registry's estimator classes"
        problem = _shadowed(est)
        if problem is not None:
            return f"{problem} (in {where})"
        nan_ok = _NAN_ALLOWED.get(cls_name, frozenset())
        for key, value in _own_attributes(est).items():
            if not key.endswith("_") or key.startswith("_"):
                continue
            problem = self.value(value, f"{where}.{key}", depth + 1, nan_ok=key in nan_ok,
                                 neg_inf_ok=key in _NEG_INF_ALLOWED)
            if problem is not None:
                return problem
        return None

    def value(self, v: Any, where: str, depth: int, *, nan_ok: bool = False, neg_inf_ok: bool = False) -> str | None:
        self.seen += 1
        if self.seen > _MAX_VALUES:
            return f"structure: more than {_MAX_VALUES} values in the fitted attributes"
        if depth > _MAX_DEPTH:
            return f"structure: {where} nested deeper than {_MAX_DEPTH}"
        if isinstance(v, float):
            return None if _finite_ok(np.asarray([v]), nan_ok, neg_inf_ok) else f"non_finite: {where} is {v!r}"
        if isinstance(v, np.ndarray):
            if v.dtype.kind in "fc" and not _finite_ok(v, nan_ok, neg_inf_ok):
                return f"non_finite: {where} holds NaN or infinite values"
            if v.dtype.kind == "O":
                for i, x in enumerate(v.ravel()[:_MAX_VALUES]):
                    problem = self.value(x, f"{where}[{i}]", depth + 1)
                    if problem is not None:
                        return problem
            return None
        if sp.issparse(v):
            data = getattr(v, "data", None)
            if data is not None and data.dtype.kind in "fc" and not _finite_ok(data, nan_ok, neg_inf_ok):
                return f"non_finite: {where} holds NaN or infinite values"
            return None
        if isinstance(v, (list, tuple)):
            for i, x in enumerate(v):
                problem = self.value(x, f"{where}[{i}]", depth + 1, nan_ok=nan_ok, neg_inf_ok=neg_inf_ok)
                if problem is not None:
                    return problem
            return None
        if isinstance(v, dict):
            for k, x in v.items():
                problem = self.value(x, f"{where}[{k!r}]", depth + 1, nan_ok=nan_ok, neg_inf_ok=neg_inf_ok)
                if problem is not None:
                    return problem
            return None
        if isinstance(v, StreamsemiEstimator) or hasattr(v, "get_params"):
            return self.estimator(v, where, depth)
        return None


def _finite_ok(a: np.ndarray, nan_ok: bool, neg_inf_ok: bool) -> bool:
    bad = ~np.isfinite(a)
    if not bad.any():
        return True
    if nan_ok:
        bad &= ~np.isnan(a)
    if neg_inf_ok and a.dtype.kind == "f":
        bad &= ~np.isneginf(a)
    return not bad.any()


def _probe_matrix(n_features: int) -> sp.csr_matrix:
    """Two small documents of term counts spread over the feature space (deterministic)."""
    first = sorted({0, n_features // 3, (2 * n_features) // 3, n_features - 1})
    second = sorted({min(1, n_features - 1), n_features // 2})
    rows = [0] * len(first) + [1] * len(second)
    data = [1.0] * len(first) + [2.0] * len(second)
    return sp.csr_matrix((data, (rows, first + second)), shape=(_PROBE_ROWS, n_features), dtype=np.float64)


def _whitelist() -> dict[str, type]:
    from streamsemi.service.checkpoint import _whitelisted_classes

    return _whitelisted_classes()


def validate_model(name: str, est: Any, *, classes: Sequence[str] | None = None,
                   n_features: int | None = None) -> str | None:
    """Whether a decoded model may be served: ``None`` when it may, else a short reason.

    Parameters
    ----------
    name : str
        The registry name the model was restored as (``meta["registry"]`` of a manifest).
    est : Any
        The restored estimator.
    classes : sequence of str, optional
        The classes the model must have, in order (``classes_`` as text).
    n_features : int, optional
        The width of the feature space the model must read (``n_features_in_`` and a probe
        of two documents through ``predict_proba``).

    Returns
    -------
    str or None
        ``None`` for an acceptable model, else ``"<category>: <detail>"``
        (:data:`CATEGORIES`, :func:`reason_category`): the exact class of ``name`` in the
        registry (not a subclass); no instance attribute hides an attribute of the class
        (``predict_proba``, ``predict``, ``decide``, ``fitted_proba``, ``explain``, ...); fitted
        (``classes_``, ``n_features_in_``); every float array, sparse matrix and float among the
        fitted attributes finite (nested estimators too, each of a registry class); ``classes_``
        one-dimensional, distinct and equal to ``classes`` when given; ``n_features_in_`` equal
        to ``n_features`` and ``predict_proba`` (and ``predict`` of a multi-label model) of a
        probe of that width of the right shape and finite.
    """
    try:
        cls, _ = algorithm_class(name)
    except AlgorithmNotAvailable as exc:
        return f"unknown_algorithm: {exc}"
    if type(est) is not cls:
        return f"class: a {type(est).__name__} is not {cls.__name__}, the class of {name!r}"
    problem = _shadowed(est)
    if problem is not None:
        return problem
    own = _own_attributes(est)
    if "classes_" not in own:
        return "not_fitted: no classes_"
    got = own["classes_"]
    if not isinstance(got, np.ndarray) or got.ndim != 1 or got.size == 0:
        return f"classes: classes_ must be a non-empty one-dimensional array, got {type(got).__name__}"
    names = [str(c) for c in got.tolist()]
    if len(set(names)) != len(names):
        return "classes: classes_ holds the same class twice"
    if classes is not None and names != [str(c) for c in classes]:
        return f"classes: {names[:10]} differ from the expected {[str(c) for c in classes][:10]}"
    width = own.get("n_features_in_")
    if not (isinstance(width, int) and not isinstance(width, bool) and width > 0):
        return f"not_fitted: n_features_in_ must be a positive integer, got {width!r}"
    if n_features is not None and width != n_features:
        return f"n_features: the model reads {width} features, this process {n_features}"
    problem = _Walker(_whitelist()).estimator(est, type(est).__name__, 0)
    if problem is not None:
        return problem
    return _probe(est, len(names), n_features if n_features is not None else width)


def _probe(est: Any, n_classes: int, n_features: int) -> str | None:
    """``predict_proba`` (and a multi-label ``predict``) of two documents: right shape, finite values."""
    X = _probe_matrix(n_features)
    try:
        P = np.asarray(est.predict_proba(X))
    except Exception as exc:  # noqa: BLE001 - any failure means the model cannot serve
        return f"probe: predict_proba failed: {type(exc).__name__}: {str(exc)[:200]}"
    if P.shape != (_PROBE_ROWS, n_classes):
        return f"probe: predict_proba gave shape {P.shape}, expected {(_PROBE_ROWS, n_classes)}"
    if P.dtype.kind not in "fiub" or not np.isfinite(P.astype(np.float64)).all():
        return "probe: predict_proba gave NaN, infinite or non-numeric scores"
    if getattr(est, "multilabel_", False):
        try:
            ind = est.predict(X)
        except Exception as exc:  # noqa: BLE001
            return f"probe: predict failed: {type(exc).__name__}: {str(exc)[:200]}"
        shape = ind.shape if sp.issparse(ind) else np.shape(ind)
        if tuple(shape) != (_PROBE_ROWS, n_classes):
            return f"probe: multi-label predict gave shape {tuple(shape)}, expected {(_PROBE_ROWS, n_classes)}"
    return None


__all__ = ["CATEGORIES", "reason_category", "validate_model"]
