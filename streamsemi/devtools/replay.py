"""Replaying corpora into Kafka: document order, stratified seed selection, rate limiting."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np

from streamsemi.core.datasets import Dataset


def replay_order(ds: Dataset, order: str = "auto", seed: int = 0, limit: int | None = None) -> np.ndarray:
    """Indices of the documents to replay.

    ``order``: ``"time"`` (by date; corpora with dates), ``"random"`` (seeded
    permutation), ``"corpus"`` (as loaded) or ``"auto"`` (time where the corpus has
    dates, else random).
    """
    n = len(ds)
    if order == "auto":
        order = "time" if ds.dates is not None else "random"
    if order == "time":
        if ds.dates is None:
            raise ValueError(f"corpus {ds.name!r} has no dates; use order 'random' or 'corpus'")
        keys = np.array([d.timestamp() if d is not None else np.inf for d in ds.dates])
        idx = np.argsort(keys, kind="stable")
    elif order == "random":
        idx = np.random.default_rng(seed).permutation(n)
    elif order == "corpus":
        idx = np.arange(n)
    else:
        raise ValueError(f"unknown order {order!r}: use auto, time, random or corpus")
    return idx[:limit] if limit is not None else idx


def primary_label(label: object) -> str | None:
    """The stratification class of a label (first label of a list; None if unlabeled)."""
    if isinstance(label, (list, tuple)):
        return str(label[0]) if label else None
    return None if label in (None, "") else str(label)


def stratified_seeds(ds: Dataset, indices: np.ndarray, fraction: float, seed: int = 0) -> set[int]:
    """A stratified random ``fraction`` of ``indices`` (at least one per class present) to seed."""
    if fraction <= 0:
        return set()
    if fraction > 1:
        raise ValueError("seed fraction must be in (0, 1]")
    rng = np.random.default_rng(seed + 7919)
    by_class: dict[str, list[int]] = {}
    for i in indices:
        c = primary_label(ds.labels[int(i)])
        if c is not None:
            by_class.setdefault(c, []).append(int(i))
    chosen: set[int] = set()
    for c in sorted(by_class):
        members = np.array(by_class[c])
        k = max(1, int(round(fraction * members.size)))
        chosen.update(int(x) for x in rng.choice(members, size=min(k, members.size), replace=False))
    return chosen


def paced(items: list[int], rate: float | None) -> Iterator[int]:
    """Yield ``items`` at ``rate`` per second (as fast as possible when None/0)."""
    if not rate:
        yield from items
        return
    t0 = time.monotonic()
    for k, item in enumerate(items):
        due = t0 + k / rate
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        yield item


def document_message(ds: Dataset, i: int) -> dict:
    """The documents-topic message of corpus document ``i`` (id ``NAME:INDEX``)."""
    msg: dict = {"id": f"{ds.name}:{i}", "text": ds.texts[i], "stream": ds.name}
    if ds.dates is not None and ds.dates[i] is not None:
        msg["ts"] = ds.dates[i].isoformat()
    return msg


def seed_message(ds: Dataset, i: int) -> dict:
    """The control-topic label message for corpus document ``i``."""
    label = ds.labels[i]
    labels = [str(x) for x in label] if isinstance(label, (list, tuple)) else [str(label)]
    return {"op": "label", "id": f"{ds.name}:{i}", "labels": labels}
