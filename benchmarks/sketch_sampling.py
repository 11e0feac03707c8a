"""What sampling the word sketch costs the explanations (issue 16): every k-th document counted after the warm-up.

The word sketch names hashed features with the words that produced them; the
explanations (top words per class) are read from it. After ``SKETCH_WARMUP`` documents
the worker counts every ``SKETCH_EVERY``-th document only. This replays 20 Newsgroups
in process (constrained k-means, 5% seeds, one fit over the 10,000-document window)
so that half of the classes appear only after the warm-up, and compares each class's
explanation with the one an every-document sketch gives::

    python benchmarks/sketch_sampling.py --every 1,16,32,64 --tag s18

Writes ``benchmarks/results/sketch_sampling[_TAG].json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from streamsemi.core.datasets import load
from streamsemi.core.messages import Document
from streamsemi.engine import SKETCH_WARMUP, Engine, EngineConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput import run_record, save, table  # noqa: E402 - this folder's throughput.py


def explanations(texts: list[str], labels: list[str | None], every: int) -> dict[str, list[str]]:
    """The classes' explanation words after replaying ``texts`` with a sketch that counts every ``every``-th document."""
    eng = Engine(EngineConfig(algorithms=["constrained-kmeans"], background_refit=False, window_max_docs=10000,
                              min_docs_first_refit=9500, refit_every_docs=0, refit_growth=0, refit_idle_s=0,
                              drift_detection=False, first_fit_stable_seeds=0))
    eng.featurizer.sketch_every = every
    for j, label in enumerate(labels):
        if label is not None:
            eng.label(f"d{j}", [label])
    for a in range(0, len(texts), 500):
        eng.process([Document(id=f"d{j}", text=texts[j]) for j in range(a, min(len(texts), a + 500))])
    eng.tick()
    return {str(c): list(w) for c, w in eng.models["constrained-kmeans"].explain.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--every", default="1,16,32,64")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tag", default="")
    args = ap.parse_args()
    ds = load("20newsgroups")
    perm = np.random.default_rng(args.seed).permutation(len(ds))
    classes = sorted(set(ds.labels))
    late = set(classes[len(classes) // 2:])  # these appear only after the warm-up
    early = [int(i) for i in perm if ds.labels[i] not in late][:2 * SKETCH_WARMUP]
    order = early + [int(i) for i in perm if ds.labels[i] in late][:12000 - len(early)]
    texts = [ds.texts[i] for i in order]
    labels = [ds.labels[i] if j % 20 == 0 else None for j, i in enumerate(order)]
    everies = [int(x) for x in args.every.split(",")]
    if everies[0] != 1:
        everies.insert(0, 1)
    got = {k: explanations(texts, labels, k) for k in everies}
    base = got[1]
    rows = {}
    for k in everies[1:]:
        for group, names in (("classes seen in the warm-up", sorted(set(base) - late)),
                             ("classes that appear after it", sorted(set(base) & late))):
            shared = sum(len(set(base[c]) & set(got[k].get(c, []))) for c in names)
            words = sum(len(base[c]) for c in names)
            rows[f"{k} / {group}"] = {"every": k, "group": group, "words_shared": shared, "words": words,
                                      "identical_lists": sum(base[c] == got[k].get(c) for c in names),
                                      "classes": len(names)}
    out = run_record(args, rows=rows, explanations={str(k): v for k, v in got.items()})
    lines = [f"# Word sketch sampling and explanations, {out['when']}", "", f"`{out['command']}`", "",
             f"20 Newsgroups, {len(texts):,} documents, 5% seeds, constrained k-means fitted once on the "
             f"10,000-document window; {len(late)} classes appear only after the first {len(early):,} documents "
             f"(the sketch counts every document of its first {SKETCH_WARMUP:,}). Compared with a sketch of every "
             "document:", ""]
    lines += table(["every k-th document", "classes", "explanation words shared", "identical word lists"],
                   ([r["every"], f"{r['group']} ({r['classes']})", f"{r['words_shared']}/{r['words']}",
                     f"{r['identical_lists']}/{r['classes']}"] for r in rows.values()))
    save("sketch_sampling", args.tag, out, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
