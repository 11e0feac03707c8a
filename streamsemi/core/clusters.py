"""Stable cluster identities across refits, and the lifecycle of clusters.

After every refit round the engine computes, per algorithm, which cluster each
window document falls in (:class:`Membership`). :func:`match_rounds` matches the
new round's discovered clusters (``new-N``) to the previous round's by the window
documents both rounds share: a contingency table of the shared documents, Jaccard
similarity of every (previous, new) pair, and a Hungarian assignment
(:func:`scipy.optimize.linear_sum_assignment`) that maximises the documents that
keep their id among pairs whose Jaccard reaches ``min_jaccard``. A matched cluster
keeps its public id; an unmatched one gets a fresh id from a counter that never
goes back (ids are never reused). Seeded classes keep their names.

Every cluster of the new round, and every previous one that is gone, gets one
:class:`Transition` (MONIC's survive / split / absorb / disappear / emerge):

- ``continued``: matched (a seeded class present in both rounds);
- ``split_from``: new id, and at least ``min_share`` of its shared documents come from
  one previous cluster or class (the ``target``);
- ``born``: new id otherwise, and a seeded class fitted for the first time;
- ``merged_into``: a previous cluster without a match, at least ``min_share`` of whose
  shared documents went to one cluster or class of the new round (the ``target``);
- ``retired``: a previous cluster or class without a match otherwise.

Everything here is pure (numpy / scipy): the engine feeds it predictions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linear_sum_assignment

from streamsemi.core.names import RESERVED_LABEL_PREFIX, check_name

NEW_PREFIX = RESERVED_LABEL_PREFIX
EVENTS = ("born", "continued", "merged_into", "split_from", "retired")


def is_new(name: str) -> bool:
    """A discovered cluster's name (``new-N``); seeded class names never start with ``new-``."""
    return name.startswith(NEW_PREFIX)


def cluster_number(name: str) -> int | None:
    """``N`` of ``new-N`` (a cluster id of :mod:`streamsemi.core.names`), else None."""
    return int(name[len(NEW_PREFIX):]) if check_name("cluster", name) is None else None


@dataclass(frozen=True)
class Transition:
    """What happened to one cluster in a refit round (``event`` in :data:`EVENTS`)."""

    cluster: str
    event: str
    target: str | None = None


@dataclass
class Membership:
    """The cluster of every window document after one refit round.

    Attributes
    ----------
    ids : list of str
        Window document ids (at most ``window_max_docs``).
    codes : ndarray of int32, shape (n,)
        Index into ``names`` of each document's cluster (the top class).
    names : list of str
        Cluster and class names of the model (public ids once renamed).
    scores : ndarray of float32, shape (n,)
        The probability of each document's cluster.
    """

    ids: list[str]
    codes: np.ndarray
    names: list[str]
    scores: np.ndarray

    @classmethod
    def from_proba(cls, ids: Sequence[str], P: np.ndarray, names: Sequence[str]) -> Membership:
        """The top class of every row of the probability matrix ``P`` (columns = ``names``)."""
        P = np.asarray(P, dtype=np.float64)
        if P.shape != (len(ids), len(names)):
            raise ValueError(f"probabilities of shape {P.shape} for {len(ids)} documents and {len(names)} classes")
        codes = P.argmax(axis=1).astype(np.int32) if len(ids) else np.zeros(0, np.int32)
        scores = P[np.arange(len(ids)), codes].astype(np.float32) if len(ids) else np.zeros(0, np.float32)
        return cls(list(ids), codes, [str(n) for n in names], scores)

    def sizes(self) -> np.ndarray:
        """Documents per name (same order as ``names``)."""
        return np.bincount(self.codes, minlength=len(self.names))

    def members(self, name: str, limit: int | None = None) -> list[tuple[str, float]]:
        """``(id, score)`` of the cluster's documents, most central (highest score) first."""
        try:
            k = self.names.index(name)
        except ValueError:
            return []
        idx = np.flatnonzero(self.codes == k)
        order = idx[np.argsort(-self.scores[idx], kind="stable")]
        if limit is not None:
            order = order[:limit]
        return [(self.ids[i], float(self.scores[i])) for i in order]

    def renamed(self, renames: Mapping[str, str]) -> Membership:
        return Membership(self.ids, self.codes, [renames.get(n, n) for n in self.names], self.scores)

    @property
    def nbytes(self) -> int:
        """Accounted bytes (the ids are shared with the window; counted as references)."""
        return int(self.codes.nbytes + self.scores.nbytes + 8 * len(self.ids))


def contingency(prev_codes: np.ndarray, new_codes: np.ndarray, n_prev: int, n_new: int) -> np.ndarray:
    """Documents per (previous cluster, new cluster) pair; both code arrays index the same documents."""
    prev_codes = np.asarray(prev_codes, dtype=np.int64)
    new_codes = np.asarray(new_codes, dtype=np.int64)
    ones = np.ones(len(prev_codes), dtype=np.int64)
    return sp.coo_matrix((ones, (prev_codes, new_codes)), shape=(n_prev, n_new)).toarray()


def jaccard(counts: np.ndarray) -> np.ndarray:
    """Jaccard similarity of every (previous, new) pair from their contingency table."""
    counts = np.asarray(counts, dtype=np.float64)
    union = counts.sum(axis=1, keepdims=True) + counts.sum(axis=0, keepdims=True) - counts
    return np.divide(counts, union, out=np.zeros_like(counts), where=union > 0)


def match(counts: np.ndarray, min_jaccard: float, similarity: np.ndarray | None = None) -> list[tuple[int, int]]:
    """One-to-one (row, column) pairs maximising the shared documents among pairs with Jaccard >= ``min_jaccard``.

    ``similarity``: the pairs' Jaccard similarity when ``counts`` is a block of a larger
    table (whose row and column sums are the clusters' sizes); default ``jaccard(counts)``.
    """
    counts = np.asarray(counts)
    if counts.size == 0:
        return []
    sim = jaccard(counts) if similarity is None else np.asarray(similarity)
    weight = np.where(sim >= min_jaccard, counts, 0)
    rows, cols = linear_sum_assignment(weight, maximize=True)
    return [(int(r), int(c)) for r, c in zip(rows, cols, strict=True) if weight[r, c] > 0]


@dataclass
class Matching:
    """The outcome of :func:`match_rounds`.

    Attributes
    ----------
    renames : dict of str -> str
        Raw name of every discovered cluster of the new round -> its public id.
    transitions : list of Transition
        One per cluster and class of the new round and per previous one that is gone.
    next_id : int
        The counter after the fresh ids handed out (ids below it were used).
    """

    renames: dict[str, str]
    transitions: list[Transition]
    next_id: int


def _shared(prev_ids: Sequence[str], ids: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Positions in ``prev_ids`` and in ``ids`` of the documents both hold."""
    where = {doc_id: i for i, doc_id in enumerate(prev_ids)}
    pos = np.fromiter((where.get(doc_id, -1) for doc_id in ids), dtype=np.int64, count=len(ids))
    new_pos = np.flatnonzero(pos >= 0)
    return pos[new_pos], new_pos


def match_rounds(prev: Membership | None, new: Membership, next_id: int, min_jaccard: float = 0.3,
                 min_share: float = 0.5) -> Matching:
    """Public ids of the new round's clusters and every cluster's transition.

    Parameters
    ----------
    prev : Membership or None
        The previous round (public names), None at the first round.
    new : Membership
        The new round with the algorithm's raw names.
    next_id : int
        The first id never used (fresh ids are ``new-<next_id>``, ``new-<next_id+1>``, ...).
    min_jaccard : float
        A previous and a new discovered cluster match only when the Jaccard similarity of
        their shared documents reaches this.
    min_share : float
        The share of a cluster's shared documents that makes ``split_from`` / ``merged_into``.

    Returns
    -------
    Matching
    """
    names = new.names
    used = [cluster_number(n) for n in (prev.names if prev is not None else [])]
    next_id = max([next_id, *(u + 1 for u in used if u is not None)])
    renames: dict[str, str] = {}
    transitions: list[Transition] = []
    new_k = [k for k, n in enumerate(names) if is_new(n)]
    if prev is None:
        for n in names:
            if is_new(n):
                renames[n] = f"{NEW_PREFIX}{next_id}"
                next_id += 1
                transitions.append(Transition(renames[n], "born"))
            else:
                transitions.append(Transition(n, "born"))
        return Matching(renames, transitions, next_id)

    pi, ni = _shared(prev.ids, new.ids)
    counts = contingency(prev.codes[pi], new.codes[ni], len(prev.names), len(names))
    prev_sizes, new_sizes = counts.sum(axis=1), counts.sum(axis=0)
    prev_k = [i for i, n in enumerate(prev.names) if is_new(n)]
    block = np.ix_(prev_k, new_k)
    pairs = match(counts[block], min_jaccard, jaccard(counts)[block]) if prev_k and new_k else []
    matched_new = {new_k[c]: prev_k[r] for r, c in pairs}
    matched_prev = set(matched_new.values())
    for k in new_k:
        if k in matched_new:
            renames[names[k]] = prev.names[matched_new[k]]
        else:
            renames[names[k]] = f"{NEW_PREFIX}{next_id}"
            next_id += 1
    public = [renames.get(n, n) for n in names]
    prev_known = {n for n in prev.names if not is_new(n)}
    for k, n in enumerate(names):
        if k in matched_new or (not is_new(n) and n in prev_known):
            transitions.append(Transition(public[k], "continued"))
            continue
        if not is_new(n):  # a seeded class fitted for the first time
            transitions.append(Transition(n, "born"))
            continue
        src = int(np.argmax(counts[:, k])) if counts.shape[0] else 0
        if new_sizes[k] > 0 and counts[src, k] >= min_share * new_sizes[k]:
            transitions.append(Transition(public[k], "split_from", prev.names[src]))
        else:
            transitions.append(Transition(public[k], "born"))
    alive = set(public)
    for i, n in enumerate(prev.names):
        if n in alive or i in matched_prev:
            continue
        dst = int(np.argmax(counts[i])) if counts.shape[1] else 0
        if is_new(n) and prev_sizes[i] > 0 and counts[i, dst] >= min_share * prev_sizes[i]:
            transitions.append(Transition(n, "merged_into", public[dst]))
        else:
            transitions.append(Transition(n, "retired"))
    return Matching(renames, transitions, next_id)
