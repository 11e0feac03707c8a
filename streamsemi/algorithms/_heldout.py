"""Choosing among candidate fits by their macro-F1 on held-out seeds.

Shared by FSL's round selection (``round_selection="held-out"``: the candidates are its outer
rounds) and constrained k-means' seed weight (``seed_weight="held-out"``: the candidates are the
weights). Each fold of the seeds is hidden in turn (:func:`held_out_folds`), every candidate
predicts the hidden seeds (rows of a ``history``), and a candidate replaces the default one only
when it beats it by a number of paired-bootstrap standard errors (:func:`gain_se`,
:func:`chosen_rounds`).
"""

from __future__ import annotations

import numpy as np

from streamsemi.algorithms.ensemble import heldout_scores, seed_folds

ROUND_GAIN_Z = 2.0  # standard errors by which the best candidate must beat the default one (one-sided, about 2%)


def held_out_folds(codes: np.ndarray, n_folds: int, rng: np.random.Generator,
                   keys: np.ndarray | None = None) -> np.ndarray:
    """Fold of every seed row that may be held out, ``-1`` for the others: each class's seeds
    dealt round-robin over ``n_folds`` folds (the ensemble's deal,
    :func:`streamsemi.algorithms.ensemble.seed_folds`, by content when ``keys`` are given),
    except the seed of a class that has only one, which stays in every fit. A class with
    ``s >= 2`` seeds keeps at least ``s - ceil(s / n_folds) >= 1`` of them in each fit.
    """
    folds = seed_folds(codes, n_folds, rng, keys)
    seeded = codes >= 0
    counts = np.bincount(codes[seeded], minlength=int(codes.max(initial=-1)) + 1)
    folds[seeded & (counts[np.where(seeded, codes, 0)] < 2)] = -1
    return folds


def macro_f1_by_round(history: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """Macro-F1 of each row of ``history`` (rounds x held-out rows, class codes) against
    ``truth``, over the classes in ``truth`` (the ensemble's held-out macro-F1,
    :func:`~streamsemi.algorithms.ensemble.heldout_scores`, with rounds for members): a class
    that takes other classes' rows loses precision, which recall alone does not see."""
    history = np.asarray(history, dtype=np.int64)
    truth = np.asarray(truth, dtype=np.int64)
    R = history.shape[0]
    K = int(max(history.max(initial=0), truth.max(initial=0))) + 1
    offsets = (np.arange(R, dtype=np.int64) * K)[:, None]
    right = history == truth[None, :]
    tp = np.bincount((history + offsets)[right], minlength=R * K).reshape(R, K)
    predicted = np.bincount((history + offsets).ravel(), minlength=R * K).reshape(R, K)
    return heldout_scores(tp, predicted, np.bincount(truth, minlength=K), "macro_f1")


def gain_se(history: np.ndarray, truth: np.ndarray, n_boot: int, rng: np.random.Generator,
            reference: int = -1) -> np.ndarray:
    """Bootstrap standard error of each round's :func:`macro_f1_by_round` minus the
    ``reference`` round's (default: the last), over ``n_boot`` resamples of the held-out rows
    (with replacement; paired: both rounds scored on the same resample)."""
    n = truth.size
    draws = np.stack([macro_f1_by_round(history[:, idx], truth[idx])
                      for idx in (rng.integers(0, n, n) for _ in range(n_boot))])
    return (draws - draws[:, [reference]]).std(axis=0)


def chosen_rounds(scores: np.ndarray, se: np.ndarray | None = None, default: int = -1,
                  z: float = ROUND_GAIN_Z) -> int:
    """Number of outer rounds to keep (1-based). The best round by held-out score (the latest
    of equal ones) replaces the ``default`` round (``-1``: the last, the paper's full loop;
    ``0``: the first, the base clusterer) only when it beats it by more than ``z``
    (``ROUND_GAIN_Z``) standard errors ``se`` of that gain (paired bootstrap against the default
    round, :func:`gain_se`): the default is left only on evidence. The best of ``max_iter`` rounds
    is the maximum of several noisy scores, hence two standard errors rather than one."""
    scores = np.asarray(scores, dtype=np.float64)
    best = int(scores.size - 1 - np.argmax(scores[::-1]))
    ref = int(default) % scores.size
    margin = 0.0 if se is None else z * float(se[best])
    return best + 1 if scores[best] - scores[ref] > margin else ref + 1
