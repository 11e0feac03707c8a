"""Cluster id stability across consecutive refits, in process through the Engine.

Reuters R8 (``--dataset``) streams through an :class:`~streamsemi.engine.Engine` with seeds for 5 of the 8
classes (earn, acq, crude, trade, money-fx: ``--seeded``; ``--seed-fraction`` of their documents) and
``n_new_clusters = 3`` (``--n-new``: a number or ``auto``); the window holds ``--window`` documents and a refit runs every
``--every`` documents, so consecutive refits see overlapping windows. After each refit
round the engine's membership of the window (which cluster each document is in) is
recorded, with the public ids (after matching, ``streamsemi.core.clusters``) and with the
algorithm's raw names (before). For every pair of consecutive rounds, on the documents
both windows hold:

- ``kept``: of the documents in a discovered cluster both times, the share whose
  cluster id is the same (target >= 0.95);
- ``overlap``: for every id that is a discovered cluster in both rounds, the Jaccard
  similarity of its members before and after (mean and minimum over ids and rounds;
  target >= 0.5).

Usage::

    python benchmarks/cluster_stability.py [--algorithms constrained-kmeans,semi-ldc] [--docs 6000]

Writes ``benchmarks/results/cluster_stability.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from streamsemi.core.datasets import load
from streamsemi.core.messages import Document
from streamsemi.engine import Engine, EngineConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench  # noqa: E402

SEEDED = ("earn", "acq", "crude", "trade", "money-fx")
OUT = _bench.RESULTS / "cluster_stability.json"
#: ``--smoke``: one algorithm, 600 documents in a 300-document window, a refit every 100, 30% seeds.
SMOKE = ["--algorithms", "constrained-kmeans", "--docs", "600", "--window", "300", "--every", "100",
         "--seed-fraction", "0.3"]
#: ``discovery_info_`` entries of a split fit recorded per round (how many parts, how many continued).
SPLIT_INFO = ("first_level_accepted", "warm_parts", "split_clusters", "parts_tried", "parts_continued",
              "parts_accepted", "parts_continued_accepted")


def _pairs_stats(rounds: list[dict[str, str]]) -> dict[str, float | int | None]:
    """``kept`` and ``overlap`` over consecutive rounds of ``{doc id: cluster}`` maps."""
    both = kept = 0
    overlaps: list[float] = []
    for prev, new in zip(rounds, rounds[1:], strict=False):
        shared = prev.keys() & new.keys()
        in_new = [d for d in shared if prev[d].startswith("new-") and new[d].startswith("new-")]
        both += len(in_new)
        kept += sum(prev[d] == new[d] for d in in_new)
        ids = {prev[d] for d in shared if prev[d].startswith("new-")} & {new[d] for d in shared if new[d].startswith("new-")}
        for c in ids:
            a = {d for d in shared if prev[d] == c}
            b = {d for d in shared if new[d] == c}
            overlaps.append(len(a & b) / len(a | b))
    return {"pairs": max(0, len(rounds) - 1), "docs_new_both_times": both,
            "kept": round(kept / both, 4) if both else None,
            "ids_in_both_rounds": len(overlaps),
            "overlap_mean": round(float(np.mean(overlaps)), 4) if overlaps else None,
            "overlap_min": round(float(np.min(overlaps)), 4) if overlaps else None,
            "ids_overlap_ge_0_5": round(float(np.mean([o >= 0.5 for o in overlaps])), 4) if overlaps else None}


def run(algorithm: str, n_docs: int, window: int, every: int, seed_fraction: float, seed: int,
        min_jaccard: float, discovery: str | None = None, n_new: int | str = 3, split: bool = False,
        dataset: str = "reuters-r8", seeded: tuple[str, ...] = SEEDED) -> dict:
    ds = load(dataset)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(ds))[:n_docs]
    cfg = EngineConfig(algorithms=[algorithm], n_new_clusters=n_new, background_refit=False, window_max_docs=window,
                       refit_every_docs=every, refit_growth=0, refit_idle_s=0, drift_detection=False,
                       min_docs_first_refit=min(window, every), min_seed_classes=5, min_seeds_per_class=3,
                       first_fit_stable_seeds=0, first_fit_max_wait_s=0, revisions="off", random_state=seed,
                       cluster_match_min_jaccard=min_jaccard,
                       algorithm_params={algorithm: {**({"discovery": discovery} if discovery else {}),
                                                     **({"discovery_split": True} if split else {})}})
    eng = Engine(cfg)
    public: list[dict[str, str]] = []
    raw: list[dict[str, str]] = []
    t0 = time.perf_counter()
    seen_version = 0
    k_chosen: list[dict] = []
    for start in range(0, len(order), 100):
        batch = order[start:start + 100]
        eng.process([Document(id=f"r{i}", text=ds.texts[i]) for i in batch])
        for i in batch:
            if ds.labels[i] in seeded and rng.random() < seed_fraction:
                eng.label(f"r{i}", [ds.labels[i]])
        slot = eng.models.get(algorithm)
        if slot is not None and slot.version != seen_version:
            seen_version = slot.version
            k_chosen.append(dict(getattr(slot.model, "__dict__", {}).get("discovery_info_", {"k": len(slot.new_clusters)})))
            m = eng._memberships[algorithm]
            back = {v: k for k, v in slot.renamed.items()}
            public.append({d: m.names[c] for d, c in zip(m.ids, m.codes.tolist(), strict=True)})
            raw.append({d: back.get(m.names[c], m.names[c]) for d, c in zip(m.ids, m.codes.tolist(), strict=True)})
    events = eng.drain_cluster_events()
    counts: dict[str, int] = {}
    for ev in events:
        counts[ev["event"]] = counts.get(ev["event"], 0) + 1
    chosen = [r.get("n_new_chosen") for r in k_chosen]
    return {"algorithm": algorithm, "discovery": discovery or "default", "n_new_clusters": n_new, "split": split,
            "auto_k_per_round": chosen if n_new == "auto" else None,
            "new_clusters_per_round": [r["k"] for r in k_chosen],
            "split_per_round": [{k: r[k] for k in SPLIT_INFO if k in r} for r in k_chosen] if split else None,
            "rounds": len(public), "seconds": round(time.perf_counter() - t0, 1),
            "before_raw_ids": _pairs_stats(raw), "after_matching": _pairs_stats(public),
            "last_round_events": counts}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--algorithms", default="constrained-kmeans,semi-ldc,fsl-ck,d-lda")
    p.add_argument("--docs", type=int, default=6000)
    p.add_argument("--dataset", default="reuters-r8", help="a dataset id (streamsemi.core.datasets)")
    p.add_argument("--seeded", default=",".join(SEEDED), help="the classes that get seeds, comma-separated")
    p.add_argument("--window", type=int, default=2000)
    p.add_argument("--every", type=int, default=500)
    p.add_argument("--seed-fraction", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-jaccard", type=float, default=None, help="default: EngineConfig's")
    p.add_argument("--n-new", default="3", help="n_new_clusters: a number or auto")
    p.add_argument("--split", action="store_true", help="discovery_split=True (split rejected clusters)")
    p.add_argument("--discovery", default=None, help="the algorithms' discovery parameter (calibrated, legacy)")
    p.add_argument("--out", default=None, help=f"default: benchmarks/results/{OUT.name}")
    _bench.add_smoke(p)
    a = _bench.parse(p, argv, SMOKE)
    min_jaccard = EngineConfig.cluster_match_min_jaccard if a.min_jaccard is None else a.min_jaccard
    n_new: int | str = a.n_new if a.n_new == "auto" else int(a.n_new)
    results = []
    for name in a.algorithms.split(","):
        r = run(name, a.docs, a.window, a.every, a.seed_fraction, a.seed, min_jaccard, a.discovery, n_new, a.split,
                a.dataset, tuple(a.seeded.split(",")))
        print(json.dumps(r))
        results.append(r)
    out = {"corpus": a.dataset, "seeded_classes": a.seeded.split(","), "n_new_clusters": n_new, "docs": a.docs,
           "window": a.window, "refit_every_docs": a.every, "seed_fraction": a.seed_fraction, "seed": a.seed,
           "cluster_match_min_jaccard": min_jaccard, "discovery": a.discovery or "default", "split": a.split,
           "results": results, "commit": _bench.commit(),
           "targets": {"kept": ">= 0.95", "overlap": ">= 0.5"}}
    path = Path(a.out) if a.out else _bench.results_dir(a.smoke) / OUT.name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print("wrote", path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
