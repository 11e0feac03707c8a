"""The estimator contract every algorithm follows, and the helpers they share.

Every algorithm in :mod:`streamsemi.algorithms` derives from
:class:`StreamsemiEstimator` (a scikit-learn ``BaseEstimator``) and offers

* ``fit(X, y)``: ``X`` a sparse non-negative count matrix (documents x hashed
  features); ``y`` array-like, one element per row: a class label, or ``None`` /
  ``-1`` / ``""`` for an unlabeled row. Multi-label estimators take a list of
  label lists (empty list = unlabeled).
* ``predict(X)``, ``predict_proba(X)`` for rows seen or unseen in ``fit``;
  ``classes_``: the column labels of ``predict_proba`` (str).
* ``new_clusters_``: the subset of ``classes_`` that are discovered clusters,
  not seeded classes (named ``new-0``, ``new-1``, ...); empty when none.
* ``explain(sketch=None, top_n=10)``: class -> top words (through a
  :class:`streamsemi.core.features.WordSketch`; without one, feature ids ``f123``).
* ``multilabel_``: True for multi-label estimators, whose ``predict`` returns a
  0/1 indicator matrix over ``classes_``.

and the scikit-learn conventions: a constructor that only stores its (keyword-only
after the first) parameters, declarative ``_parameter_constraints`` checked at the
start of ``fit`` (and by :func:`streamsemi.algorithms.build_estimator` before a
worker starts), ``NotFittedError`` before ``fit``, ``n_features_in_``, and one
input check (:func:`check_counts`) shared by ``fit`` and every scoring method.
"""

from __future__ import annotations

import numbers
import weakref
from collections.abc import Callable, Sequence
from numbers import Integral
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, ClassifierMixin, TransformerMixin
from sklearn.utils._param_validation import Interval
from sklearn.utils._tags import Tags
from sklearn.utils.validation import check_array, check_is_fitted

from streamsemi.core.errors import StreamsemiError

NEW_CLUSTER_PREFIX = "new-"

#: Constraint of every algorithm's ``random_state``: a non-negative int or None (the
#: seeds go to ``np.random.default_rng``).
RANDOM_STATE: list[Any] = [Interval(Integral, 0, None, closed="left"), None]


class DegenerateInputError(StreamsemiError, ValueError):
    """Input an algorithm cannot use: not a finite non-negative count matrix, or one it
    cannot fit meaningfully (no seeds, one class, empty documents, ...)."""


def is_unlabeled(value: Any) -> bool:
    """True for the markers of an unlabeled row: None, -1, "", NaN."""
    if value is None:
        return True
    if isinstance(value, str):
        return value == ""
    if isinstance(value, numbers.Real):
        return bool(value == -1 or (isinstance(value, float) and np.isnan(value)))
    return False


def _first_entry(X: sp.csr_matrix, mask: np.ndarray) -> str:
    """``"<value> at row i, column j"`` for the first stored entry of ``X`` where ``mask`` holds."""
    p = int(np.flatnonzero(mask)[0])
    row = int(np.searchsorted(X.indptr, p, side="right") - 1)
    return f"{float(X.data[p])!r} at row {row}, column {int(X.indices[p])}"


def check_counts(X: Any, n_features_in: int | None = None, estimator: Any = None,
                 name: str = "X") -> sp.csr_matrix:
    """The input check of every algorithm: a 2-D finite non-negative matrix, as CSR float64.

    Sparse (any format) and dense input are accepted; a CSR float64 matrix is not
    copied.

    Parameters
    ----------
    X : array-like or sparse matrix of shape (n_samples, n_features)
    n_features_in : int, optional
        The width the estimator was fitted on (not checked when None).
    estimator : estimator, optional
        Named in the messages.

    Raises
    ------
    ValueError
        Not a non-empty 2-D numeric matrix, or a width other than ``n_features_in``.
    DegenerateInputError
        NaN, infinite or negative entries (the message shows the first one).
    """
    if not (type(X) is sp.csr_matrix and X.dtype == np.float64 and X.shape[0] and X.shape[1]):
        # what check_array gives a non-empty CSR float64 matrix is the matrix itself: the worker's own input
        # skips its ~50 us per call (several calls per algorithm and loop); anything else goes through it
        X = check_array(X, accept_sparse="csr", dtype=np.float64, ensure_all_finite=False,
                        estimator=estimator, input_name=name)
        X = sp.csr_matrix(X)
    if not np.isfinite(X.data).all():
        raise DegenerateInputError(
            f"{name} contains NaN or inf: term counts must be finite, got "
            f"{_first_entry(X, ~np.isfinite(X.data))}")
    if X.nnz and X.data.min() < 0:
        raise DegenerateInputError(
            f"Negative values in data passed to {name}: it must be non-negative term counts, got "
            f"{_first_entry(X, X.data < 0)}")
    if n_features_in is not None and X.shape[1] != n_features_in:
        who = type(estimator).__name__ if estimator is not None else "the model"
        raise ValueError(f"{name} has {X.shape[1]} features, but {who} is expecting "
                         f"{n_features_in} features as input.")
    return X


def check_count_matrix(X: Any, allow_empty_rows: bool = False, name: str = "X",
                       estimator: Any = None) -> sp.csr_matrix:
    """:func:`check_counts`, then what a fit needs: some terms and (unless
    ``allow_empty_rows``) no empty document.

    Raises
    ------
    DegenerateInputError
        If the matrix is all zero, has NaN, infinite or negative entries, or (unless
        ``allow_empty_rows``) has an empty row.
    """
    X = check_counts(X, estimator=estimator, name=name)
    if X.nnz == 0 or not X.data.any():
        raise DegenerateInputError(f"{name} is all zero: no document has any term")
    if not allow_empty_rows:
        empty = np.flatnonzero(np.diff(X.indptr) == 0)
        if empty.size:
            raise DegenerateInputError(
                f"{name} has {empty.size} empty document(s) (no terms), first at row {int(empty[0])}"
            )
    return X


class StreamsemiEstimator(BaseEstimator):
    """Base of every algorithm: tags, parameter validation, input check, ``explain``.

    Estimators with a ``transform`` also derive from :class:`TransformerMixin`
    (``fit_transform``, transformer tags). Subclasses declare ``_parameter_constraints`` (scikit-learn's ``Interval`` /
    ``StrOptions`` style); constraints between parameters go in
    :meth:`_check_param_combination`. ``fit`` starts with ``self._validate_params()``
    and ``X = self._validate_counts(X, reset=True)``; every scoring method checks its
    input with ``self._validate_counts(X, reset=False)``. An estimator is fitted once
    it has ``classes_`` (set last by every ``fit``).
    """

    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {}

    def __sklearn_tags__(self) -> Tags:
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        tags.input_tags.positive_only = True
        tags.input_tags.allow_nan = False
        tags.target_tags.required = True
        return tags

    def __sklearn_is_fitted__(self) -> bool:
        return hasattr(self, "classes_")

    def _validate_params(self) -> None:
        """Check every parameter against ``_parameter_constraints``, then their combination.

        Raises
        ------
        sklearn.utils._param_validation.InvalidParameterError
            (a ``ValueError`` and ``TypeError``) naming the parameter and the value got.
        """
        super()._validate_params()
        self._check_param_combination()

    def _check_param_combination(self) -> None:
        """Constraints between parameters (none by default); raise ``ValueError``."""

    def _validate_counts(self, X: Any, *, reset: bool) -> sp.csr_matrix:
        """The input of ``fit`` (``reset=True``: also needs terms in every document, sets
        ``n_features_in_``) or of a fitted model (``reset=False``: ``NotFittedError``
        before ``fit``, width checked against ``n_features_in_``)."""
        if reset:
            X = check_count_matrix(X, estimator=self)
            self.n_features_in_ = X.shape[1]
            return X
        check_is_fitted(self)
        # models restored from checkpoints written before n_features_in_ was set everywhere
        # have no width to check against
        return check_counts(X, getattr(self, "n_features_in_", None), estimator=self)

    def _fit_inputs(self, X: Any, y: Any) -> tuple[sp.csr_matrix, np.ndarray, np.ndarray]:
        """Start of a single-label ``fit``: parameters, counts, seeds, and room for the
        ``n_new_clusters`` extra clusters. Returns ``(X, codes, classes)`` as
        :func:`encode_single_labels`."""
        self._validate_params()
        X = self._validate_counts(X, reset=True)
        codes, classes = encode_single_labels(y, X.shape[0])
        n_new = int(getattr(self, "n_new_clusters", 0))
        check_n_clusters(classes.size + n_new, X.shape[0])
        n_unlabeled = int((codes < 0).sum())
        if n_new > n_unlabeled:
            raise DegenerateInputError(
                f"n_new_clusters = {n_new} exceeds the number of unlabeled documents ({n_unlabeled})")
        return X, codes, classes

    def fitted_proba(self) -> np.ndarray | None:
        """Class probabilities of the rows ``fit`` was given, as the fit inferred them, or None.

        Rows in fit order, columns following ``classes_``. Estimators whose fit already
        infers every training row (D-LDA's chain, CLE's embedding) return those, so that the
        engine does not score its training snapshot again with ``predict_proba``
        (:func:`streamsemi.engine.score_rows`); None (the default): it does.
        """
        check_is_fitted(self)
        return None

    def fit_summary(self) -> dict[str, Any]:
        """What the last fit chose from the data, for the worker's ``refit_done`` log event.

        Small and JSON-safe (ints, floats, strings, lists and dicts of them): e.g. FSL's number
        of outer rounds, the ensemble's member weights. Empty (the default) when the
        estimator chooses nothing a person running the worker needs to see.

        Raises
        ------
        sklearn.exceptions.NotFittedError
            Before ``fit``.
        """
        check_is_fitted(self)
        known = getattr(self, "known_model_", None)  # calibrated discovery: the known-class model chose it
        return known.fit_summary() if known is not None else self._fit_summary()

    def _fit_summary(self) -> dict[str, Any]:
        """The estimator's part of :meth:`fit_summary` (fitted; ``{}`` by default)."""
        return {}

    def _explain_weights(self) -> Any:
        """(n_classes x n_features_in_) non-negative word weights per class (dense or sparse)."""
        raise NotImplementedError

    def explain(self, sketch: Any = None, top_n: int = 10) -> dict[str, list[str]]:
        """Top words of each class / cluster (see :func:`explain_weights`).

        Parameters
        ----------
        sketch : WordSketch, optional
            Maps feature indices to words; without it, features are named ``f<index>``.
        top_n : int
            Words per class.
        """
        check_is_fitted(self)
        return explain_weights(self.classes_, self._explain_weights(), sketch, top_n)



_T = TypeVar("_T")


class DerivedArrays(Generic[_T]):
    """Per fitted model, values derived from its fitted attributes for prediction (transposed or
    combined arrays), kept outside the estimator (not checkpointed, ``predict`` leaves it as it
    was) and rebuilt when a source changes.

    Weak keys: an entry goes with its model. ``get(est, sources, build)`` returns the value
    built for the same ``sources`` (arrays compared by identity: a refit or a restore replaces
    them; other values by equality), else ``build()``, remembered.
    """

    def __init__(self) -> None:
        self._entries: weakref.WeakKeyDictionary[Any, tuple[tuple[Any, ...], _T]] = weakref.WeakKeyDictionary()

    def get(self, est: Any, sources: tuple[Any, ...], build: Callable[[], _T]) -> _T:
        hit = self._entries.get(est)
        if hit is None or len(hit[0]) != len(sources) or not all(
                a is b or (not isinstance(a, np.ndarray) and a == b) for a, b in zip(hit[0], sources, strict=True)):
            hit = (sources, build())
            self._entries[est] = hit
        return hit[1]

    def drop(self, est: Any) -> None:
        """Forget ``est``'s value (its ``fit`` replaces the sources anyway; this frees it at once)."""
        self._entries.pop(est, None)

    def __contains__(self, est: Any) -> bool:
        return est in self._entries


__all__ = ["RANDOM_STATE", "DerivedArrays", "DegenerateInputError", "StreamsemiEstimator", "ScoresClassifierMixin",
           "TransformerMixin", "check_counts", "check_count_matrix", "encode_single_labels",
           "encode_multi_labels", "check_n_clusters", "new_cluster_names", "softmax_rows",
           "explain_weights", "is_unlabeled", "target_list"]


class ScoresClassifierMixin(ClassifierMixin):
    """``predict`` and ``predict_proba`` of an estimator that scores every class.

    Subclasses implement ``_scores(X)`` (n_samples x n_classes, larger = more likely,
    input checked there) and ``_softmax_temperature()``; ``predict`` is the argmax of
    the scores and ``predict_proba`` their row-wise softmax at that temperature, so
    ``predict`` is the argmax of ``predict_proba``.
    """

    def _scores(self, X: Any) -> np.ndarray:
        raise NotImplementedError

    def _softmax_temperature(self) -> float:
        return 1.0

    def predict_proba(self, X: Any) -> np.ndarray:
        """Softmax of the class scores (columns follow ``classes_``)."""
        return softmax_rows(self._scores(X), self._softmax_temperature())

    def predict(self, X: Any) -> np.ndarray:
        """Class (or ``new-N`` cluster) with the highest score."""
        scores = self._scores(X)
        return self.classes_[scores.argmax(axis=1)]


def target_list(y: Any, n_samples: int | None = None) -> list[Any]:
    """``y`` as a list, one element per row (array-likes included); a missing ``y``, or one whose
    length is not ``n_samples``, is an error."""
    if y is None:
        raise DegenerateInputError("requires y to be passed, but the target y is None: give one seed "
                                   "label per row (None, -1 or \"\" for an unlabeled row)")
    if not isinstance(y, (list, tuple, np.ndarray)) and hasattr(y, "__array__"):
        y = np.asarray(y)  # array-likes without __iter__ (pandas-like wrappers)
    y = list(y)
    if n_samples is not None and len(y) != n_samples:
        raise DegenerateInputError(f"y has {len(y)} elements but X has {n_samples} rows")
    return y


def _seeded_classes(names: set[str], min_classes: int) -> np.ndarray:
    """Sorted class names of the seeds; at least ``min_classes`` of them."""
    classes = np.array(sorted(names), dtype=object)
    if classes.size == 0:
        raise DegenerateInputError("no seed labels: at least one labeled document per class is needed")
    if classes.size < min_classes:
        raise DegenerateInputError(
            f"only {classes.size} seeded class ({classes[0]!r}); at least {min_classes} classes are needed"
        )
    return classes


def encode_single_labels(y: Sequence[Any], n_samples: int, min_classes: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Encode seed labels.

    Returns
    -------
    codes : ndarray of int, shape (n_samples,)
        Class index per row, -1 for unlabeled rows.
    classes : ndarray of str
        Sorted class names; ``codes`` index into it.

    Raises
    ------
    DegenerateInputError
        Length mismatch, no seeds, or fewer than ``min_classes`` classes.
    """
    labels = [None if is_unlabeled(v) else str(v) for v in target_list(y, n_samples)]
    classes = _seeded_classes({v for v in labels if v is not None}, min_classes)
    lookup = {c: i for i, c in enumerate(classes)}
    codes = np.array([-1 if v is None else lookup[v] for v in labels], dtype=np.int64)
    return codes, classes


def encode_multi_labels(y: Sequence[Any], n_samples: int, min_classes: int = 2) -> tuple[sp.csr_matrix, np.ndarray, np.ndarray]:
    """Encode multi-label seeds (each element a list of labels; a scalar is one label).

    Returns
    -------
    Y : csr_matrix of shape (n_samples, n_classes)
        0/1 indicator of each row's labels.
    classes : ndarray of str
    labeled : ndarray of bool, shape (n_samples,)
    """
    sets: list[list[str]] = []
    for v in target_list(y, n_samples):
        if isinstance(v, (list, tuple, set, frozenset, np.ndarray)):
            sets.append(sorted({str(x) for x in v if not is_unlabeled(x)}))
        else:
            sets.append([] if is_unlabeled(v) else [str(v)])
    classes = _seeded_classes({c for s in sets for c in s}, min_classes)
    lookup = {c: i for i, c in enumerate(classes)}
    rows = [i for i, s in enumerate(sets) for _ in s]
    cols = [lookup[c] for s in sets for c in s]
    Y = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(n_samples, classes.size))
    labeled = np.array([bool(s) for s in sets])
    return Y, classes, labeled


def check_n_clusters(n_clusters: int, n_samples: int) -> None:
    """Raise if more clusters are requested than there are documents."""
    if n_clusters > n_samples:
        raise DegenerateInputError(
            f"K = {n_clusters} clusters is larger than the number of documents N = {n_samples}"
        )


def new_cluster_names(n: int, start: int = 0) -> list[str]:
    """Names of discovered clusters: ``new-<start>``, ``new-<start+1>``, ..."""
    return [f"{NEW_CLUSTER_PREFIX}{start + i}" for i in range(n)]


def sparse_dot_t(X: sp.spmatrix, W: np.ndarray) -> np.ndarray:
    """``X @ W.T`` (dense, n x k) for a sparse ``X`` (n x d) and a dense ``W`` (k x d), on ``X``'s non-zero columns only.

    scipy copies a non-contiguous dense operand in full (``W.T`` of a k x 2^18 centroid
    matrix: 40 MB per call); only the columns the batch uses are gathered here. Each
    row's products are summed in the same order as ``X @ W.T``: the result is identical.
    """
    X = sp.csr_matrix(X)
    cols, inv = np.unique(X.indices, return_inverse=True)
    Xs = sp.csr_matrix((X.data, inv.reshape(-1).astype(X.indices.dtype, copy=False), X.indptr),
                       shape=(X.shape[0], cols.size))
    return np.asarray(Xs @ np.ascontiguousarray(W[:, cols].T))


def softmax_rows(S: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Row-wise softmax of ``S / temperature`` (numerically stable)."""
    Z = np.asarray(S, dtype=np.float64) / temperature
    Z = Z - Z.max(axis=1, keepdims=True)
    np.exp(Z, out=Z)
    Z /= Z.sum(axis=1, keepdims=True)
    return Z


def explain_weights(classes: Sequence[str], weights: Any, sketch: Any = None, top_n: int = 10) -> dict[str, list[str]]:
    """Top words per class from a (n_classes x n_features) weight matrix.

    Parameters
    ----------
    classes : sequence of str
        Row labels of ``weights``.
    weights : ndarray or sparse matrix
        Non-negative feature weights per class (e.g. centroids, topic-term probabilities).
    sketch : WordSketch, optional
        Maps feature indices to words; without it, features are named ``f<index>``.
    top_n : int
        Words per class.
    """
    W = sp.csr_matrix(weights) if sp.issparse(weights) else np.asarray(weights)
    out: dict[str, list[str]] = {}
    for k, name in enumerate(classes):
        # one row at a time: a sparse (classes x 2^18 hashed features) matrix is never densified
        row = W[k].toarray().ravel() if sp.issparse(W) else np.asarray(W[k], dtype=np.float64).ravel()
        row = row.astype(np.float64, copy=False)
        if sketch is not None:
            out[str(name)] = sketch.top_words(row, top_n)
        else:
            pos = np.flatnonzero(row > 0)
            order = pos[np.argsort(-row[pos], kind="stable")][:top_n]
            out[str(name)] = [f"f{int(j)}" for j in order]
    return out
