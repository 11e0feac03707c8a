"""Baselines that ``streamsemi evaluate`` always runs beside the algorithms.

They follow the algorithms' small estimator interface (``fit(X_counts, y)`` with
``None`` for unlabeled rows, ``predict``, ``predict_proba``, ``classes_``), so the
runner treats baselines and algorithms alike. All of them work on sublinear
tf-idf of the counts (idf from all rows given to ``fit``: the unlabeled text is
available to every method).

* ``constrained-kmeans`` / ``seeded-kmeans``: the registry's ConstrainedKMeans.
* ``label-spreading``: scikit-learn's ``LabelSpreading(kernel="knn")``. It needs
  dense input, so tf-idf is first reduced to ``n_components`` dimensions with
  ``TruncatedSVD`` (LSA) and l2-normalised.
* ``self-training``: ``SelfTrainingClassifier`` (``k_best`` criterion) around a
  class-balanced logistic regression on tf-idf.
* ``supervised-linear``: the same logistic regression trained on the seeds only.

The single-label logistic regressions have no intercept: with a handful of seeds of
imbalanced classes the intercept learned the seed class priors and swamped the text
(Reuters top-10, 5% seeds: macro-F1 0.21 with an intercept, 0.52 without).
* ``two-step`` (D-LDA protocol): the D-LDA paper's two-step method: a logistic
  regression on the known classes' seeds; documents whose top probability is
  below ``threshold`` are clustered by spherical k-means into ``n_new_clusters``
  new clusters.
* ``ovr-linear`` (pseudo-LSC protocol): one-vs-rest logistic regression on the
  multi-label seeds.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.cluster import KMeans
from sklearn.decomposition import TruncatedSVD
from sklearn.linear_model import LogisticRegression
from sklearn.multiclass import OneVsRestClassifier
from sklearn.preprocessing import normalize
from sklearn.semi_supervised import LabelSpreading, SelfTrainingClassifier

from streamsemi.algorithms.base import (
    DegenerateInputError,
    check_count_matrix,
    encode_multi_labels,
    encode_single_labels,
    new_cluster_names,
)
from streamsemi.core.features import idf_weights, tfidf


class _TfidfBaseline(ClassifierMixin, BaseEstimator):
    """Shared tf-idf handling: ``idf_`` from the fit rows, sublinear tf, l2 rows."""

    def _fit_tfidf(self, X: Any) -> sp.csr_matrix:
        X = check_count_matrix(X)
        # Only the columns that occur in the fit rows matter to a linear model or an
        # SVD; dropping the others (most of the 2^18 hashed columns) saves memory and time.
        self.columns_ = np.unique(X.indices)
        Xc = sp.csr_matrix(X[:, self.columns_])
        self.idf_ = idf_weights(Xc)
        return tfidf(Xc, self.idf_)

    def _tfidf(self, X: Any) -> sp.csr_matrix:
        Xc = sp.csr_matrix(sp.csr_matrix(X, dtype=np.float64)[:, self.columns_])
        return tfidf(Xc, self.idf_)

    def predict(self, X: Any) -> np.ndarray:
        """Class of each row (the column of ``predict_proba`` with the highest score)."""
        return self.classes_[self.predict_proba(X).argmax(axis=1)]


class SupervisedLinear(_TfidfBaseline):
    """Logistic regression on the seeds only.

    Parameters
    ----------
    C : float
        Inverse l2 regularisation strength.
    random_state : int or None
    """

    def __init__(self, C: float = 10.0, random_state: int | None = 0) -> None:
        self.C = C
        self.random_state = random_state

    def _linear(self, **params: Any) -> LogisticRegression:
        """The logistic regression of this baseline (no intercept, see the module docstring)."""
        return LogisticRegression(C=self.C, max_iter=300, fit_intercept=False,
                                  random_state=self.random_state, **params)

    def _fit_model(self, Xt: sp.csr_matrix, codes: np.ndarray) -> Any:
        """The fitted model on tf-idf rows ``Xt`` with class codes (-1 = unlabeled)."""
        seeds = codes >= 0
        return self._linear().fit(Xt[seeds], codes[seeds])

    def fit(self, X: Any, y: Any) -> SupervisedLinear:
        """Fit on the labeled rows of ``X`` (all rows give the idf)."""
        Xt = self._fit_tfidf(X)
        codes, classes = encode_single_labels(y, Xt.shape[0])
        self.model_ = self._fit_model(Xt, codes)
        self.classes_ = classes
        self.new_clusters_: list[str] = []
        return self

    def predict_proba(self, X: Any) -> np.ndarray:
        """Class probabilities (columns follow ``classes_``)."""
        return self.model_.predict_proba(self._tfidf(X))


class SelfTraining(SupervisedLinear):
    """Self-training: scikit-learn ``SelfTrainingClassifier`` with ``criterion="k_best"``.

    Each round the class-balanced logistic regression is refitted on the seeds and
    the pseudo-labels so far, and the ``k`` unlabeled rows it is most sure of are
    pseudo-labeled, ``k = ceil(pseudo_fraction * n_unlabeled / max_iter)``: after
    ``max_iter`` rounds ``pseudo_fraction`` of the unlabeled rows carry a
    pseudo-label. Ranking rows by confidence needs no calibrated probability (the
    threshold criterion did: the logistic regression's probabilities with a handful
    of seeds rarely reach 0.9, so 0 pseudo-labels were added on 20ng-comp5 and the
    rows equalled supervised-linear). ``class_weight="balanced"`` keeps the classes'
    total weight equal in every round, so a large class that wins the first
    rounds' pseudo-labels does not swamp the others (unbalanced, the 1% Reuters
    top-10 draws collapsed to one class: macro-F1 0.08).

    Parameters
    ----------
    C : float
        Inverse l2 regularisation of the logistic regression.
    pseudo_fraction : float in (0, 1]
        Share of the unlabeled rows pseudo-labeled after ``max_iter`` rounds.
    max_iter : int
        Self-training rounds.
    random_state : int or None

    Attributes
    ----------
    n_pseudo_labels_ : int
        Unlabeled rows that received a pseudo-label.
    """

    def __init__(self, C: float = 10.0, pseudo_fraction: float = 0.5, max_iter: int = 10,
                 random_state: int | None = 0) -> None:
        self.C = C
        self.pseudo_fraction = pseudo_fraction
        self.max_iter = max_iter
        self.random_state = random_state

    def _fit_model(self, Xt: sp.csr_matrix, codes: np.ndarray) -> Any:
        """Self-train on all rows; unlabeled rows are pseudo-labeled round by round."""
        n_unlabeled = int((codes < 0).sum())
        k = max(1, int(np.ceil(self.pseudo_fraction * n_unlabeled / self.max_iter)))
        model = SelfTrainingClassifier(self._linear(class_weight="balanced"), criterion="k_best",
                                       k_best=k, max_iter=self.max_iter)
        model.fit(Xt, codes)
        self.n_pseudo_labels_ = int(((model.labeled_iter_ > 0) & (codes < 0)).sum())
        return model


class LabelSpreadingLSA(_TfidfBaseline):
    """Label spreading with the knn kernel on LSA-reduced tf-idf.

    Parameters
    ----------
    n_components : int
        TruncatedSVD dimensions (label spreading needs dense input; the hashed
        tf-idf has 2^18 columns).
    n_neighbors : int
        Neighbours of the knn graph.
    alpha : float
        Clamping factor (0: keep the seeds' labels, 1: replace them).
    random_state : int or None
    """

    def __init__(self, n_components: int = 100, n_neighbors: int = 10, alpha: float = 0.2,
                 random_state: int | None = 0) -> None:
        self.n_components = n_components
        self.n_neighbors = n_neighbors
        self.alpha = alpha
        self.random_state = random_state

    def fit(self, X: Any, y: Any) -> LabelSpreadingLSA:
        """Reduce all rows with SVD, spread the seeds' labels over the knn graph."""
        Xt = self._fit_tfidf(X)
        codes, classes = encode_single_labels(y, Xt.shape[0])
        k = int(min(self.n_components, Xt.shape[0] - 1, Xt.shape[1] - 1))
        if k < 1:
            raise DegenerateInputError("label spreading needs at least 2 documents")
        self.svd_ = TruncatedSVD(n_components=k, random_state=self.random_state).fit(Xt)
        Z = normalize(self.svd_.transform(Xt))
        n_neighbors = int(min(self.n_neighbors, Xt.shape[0] - 1))
        self.model_ = LabelSpreading(kernel="knn", n_neighbors=n_neighbors, alpha=self.alpha,
                                     max_iter=100)
        with warnings.catch_warnings():  # isolated points: 0/0 in sklearn's normaliser
            warnings.simplefilter("ignore", RuntimeWarning)
            self.model_.fit(Z, codes)
        self.classes_ = classes
        self.new_clusters_: list[str] = []
        self.labels_ = self.model_.transduction_.astype(np.int64)
        return self

    def predict_proba(self, X: Any) -> np.ndarray:
        """Class distributions (from the knn neighbours in the fitted graph)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            P = self.model_.predict_proba(normalize(self.svd_.transform(self._tfidf(X))))
        P = np.nan_to_num(P, nan=1.0 / len(self.classes_))
        return P / P.sum(axis=1, keepdims=True)


class TwoStep(_TfidfBaseline):
    """The D-LDA paper's two-step method: classify confident documents, cluster the rest.

    Parameters
    ----------
    n_new_clusters : int
        Clusters for the documents the classifier is not confident about.
    threshold : float
        Minimum top class probability to accept the classifier's label.
    C : float
        Inverse l2 regularisation of the logistic regression.
    random_state : int or None
    """

    def __init__(self, n_new_clusters: int = 2, threshold: float = 0.8, C: float = 10.0,
                 random_state: int | None = 0) -> None:
        self.n_new_clusters = n_new_clusters
        self.threshold = threshold
        self.C = C
        self.random_state = random_state

    def fit(self, X: Any, y: Any) -> TwoStep:
        """Train on the seeds, then cluster the low-confidence rows."""
        Xt = self._fit_tfidf(X)
        codes, classes = encode_single_labels(y, Xt.shape[0])
        seeds = codes >= 0
        self.model_ = LogisticRegression(C=self.C, max_iter=300, fit_intercept=False,
                                         random_state=self.random_state)
        self.model_.fit(Xt[seeds], codes[seeds])
        P = self.model_.predict_proba(Xt)
        labels = P.argmax(axis=1)
        low = np.flatnonzero((P.max(axis=1) < self.threshold) & ~seeds)
        n_new = int(self.n_new_clusters)
        self.new_clusters_ = new_cluster_names(n_new)
        self.classes_ = np.array(list(classes) + self.new_clusters_, dtype=object)
        self.cluster_centers_ = np.zeros((0, Xt.shape[1]))
        if n_new and low.size >= n_new:
            km = KMeans(n_clusters=n_new, n_init=3, random_state=self.random_state).fit(Xt[low])
            labels[low] = classes.size + km.labels_
            self.cluster_centers_ = normalize(km.cluster_centers_)
        self.labels_ = labels
        return self

    def predict_proba(self, X: Any) -> np.ndarray:
        """Known-class probabilities, or a one-hot new cluster below the threshold."""
        Xt = self._tfidf(X)
        P = self.model_.predict_proba(Xt)
        n_new = self.cluster_centers_.shape[0]
        out = np.zeros((Xt.shape[0], P.shape[1] + len(self.new_clusters_)))
        out[:, : P.shape[1]] = P
        if n_new:
            low = np.flatnonzero(P.max(axis=1) < self.threshold)
            if low.size:
                nearest = np.asarray(Xt[low] @ self.cluster_centers_.T).argmax(axis=1)
                out[low] = 0.0
                out[low, P.shape[1] + nearest] = 1.0
        return out


class OneVsRestLinear(_TfidfBaseline):
    """One-vs-rest logistic regression on multi-label seeds.

    Parameters
    ----------
    C : float
    random_state : int or None
    """

    multilabel_ = True

    def __init__(self, C: float = 10.0, random_state: int | None = 0) -> None:
        self.C = C
        self.random_state = random_state

    def fit(self, X: Any, y: Any) -> OneVsRestLinear:
        """Fit on the labeled rows (y: lists of labels, [] = unlabeled)."""
        Xt = self._fit_tfidf(X)
        Y, classes, labeled = encode_multi_labels(y, Xt.shape[0])
        self.model_ = OneVsRestClassifier(
            LogisticRegression(C=self.C, max_iter=300, random_state=self.random_state))
        self.model_.fit(Xt[labeled], Y[labeled].toarray().astype(int))
        self.classes_ = classes
        self.new_clusters_: list[str] = []
        return self

    def predict_proba(self, X: Any) -> np.ndarray:
        """Per-class probabilities (rows do not sum to 1)."""
        return self.model_.predict_proba(self._tfidf(X))

    def predict(self, X: Any) -> np.ndarray:
        """0/1 indicator matrix over ``classes_`` (probability >= 0.5)."""
        return (self.predict_proba(X) >= 0.5).astype(int)


BASELINES: dict[str, type] = {
    "label-spreading": LabelSpreadingLSA,
    "self-training": SelfTraining,
    "supervised-linear": SupervisedLinear,
    "two-step": TwoStep,
    "ovr-linear": OneVsRestLinear,
}


def make_method(name: str, **params: Any) -> Any:
    """Estimator for a baseline name or an algorithm registry name.

    Raises
    ------
    streamsemi.algorithms.AlgorithmNotAvailable
        Unknown name, or an algorithm whose module does not import.
    """
    if name in BASELINES:
        cls = BASELINES[name]
        accepted = cls().get_params()
        return cls(**{k: v for k, v in params.items() if k in accepted})
    from streamsemi.algorithms import algorithm_class

    cls, fixed = algorithm_class(name)
    est = cls(**fixed)
    accepted = est.get_params() if hasattr(est, "get_params") else {}
    extra = {k: v for k, v in params.items() if k in accepted}
    return cls(**{**fixed, **extra}) if extra else est


def method_available(name: str) -> tuple[bool, str]:
    """``(True, "")`` or ``(False, reason)`` for a method name."""
    if name in BASELINES:
        return True, ""
    from streamsemi.algorithms import AlgorithmNotAvailable, algorithm_class

    try:
        algorithm_class(name)
    except AlgorithmNotAvailable as exc:
        return False, str(exc)
    return True, ""
