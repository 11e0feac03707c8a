"""False drift alarms on stationary streams and the delay to a real topic switch (in process).

``python benchmarks/drift_alarms.py`` streams documents through
:class:`streamsemi.engine.Engine` (``background_refit=False``: refits run in the
``process`` call that triggers them, so runs are deterministic) with the worker's drift
settings (``drift_detection``, ``drift_delta``), a refit every ``--refit-every``
documents, polls of ``--batch`` documents and ``--seed-fraction`` seeds labelled as their
documents arrive (as the worker sees a control topic fed alongside the stream):

``stationary``
    A shuffled corpus (``--corpora``): its topic mix never changes, so every drift refit
    is a false alarm. Written: drift refits per run and the documents at which they fired.
``switch``
    ``--switch-after`` shuffled Reuters R8 documents, then shuffled 20 Newsgroups
    documents (new words and topics, no seeds for them): written, the documents from the
    switch to the first drift refit (None: not detected within ``--after-switch``).

Results: ``benchmarks/results/drift_alarms[_TAG].json`` and ``.md``. To compare two trees,
run it on an export of each (``git archive REV | tar -x -C DIR; PYTHONPATH=DIR python
DIR/benchmarks/drift_alarms.py --tag ...``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from streamsemi.core.datasets import load
from streamsemi.core.messages import Document
from streamsemi.engine import Engine, EngineConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench  # noqa: E402

#: ``--smoke``: R8 only, one seed, 400 documents (the switch after 300, 200 after it), a refit every 100.
SMOKE = ["--corpora", "r8", "--seeds", "0", "--docs", "400", "--switch-after", "300", "--after-switch", "200",
         "--refit-every", "100", "--batch", "50", "--seed-fraction", "0.2"]
CORPORA = {"20ng": "20newsgroups", "r8": "reuters-r8"}


def engine(args: argparse.Namespace, seed: int) -> Engine:
    return Engine(EngineConfig(
        algorithms=[args.algorithm], background_refit=False, refit_every_docs=args.refit_every, refit_growth=0,
        refit_idle_s=0, drift_detection=True, drift_delta=args.drift_delta, min_refit_interval_s=0.0,
        revisions="off", min_seed_classes=2, min_seeds_per_class=1, first_fit_stable_seeds=0, first_fit_max_wait_s=0,
        min_docs_first_refit=args.refit_every, random_state=seed, explain_words=0, suggestions_top_n=0))


def drift_count(eng: Engine) -> float:
    return eng.telemetry.refit_triggers.labels("drift")._value.get()


def stream(eng: Engine, texts: list[str], labels: list[str | None], ids: list[str], batch: int,
           seed_fraction: float, rng: np.random.Generator) -> list[int]:
    """Feed the documents poll by poll (seeds first); the positions (documents fed) after which a drift refit started."""
    fired = []
    for lo in range(0, len(texts), batch):
        for j in range(lo, min(lo + batch, len(texts))):
            if labels[j] is not None and rng.random() < seed_fraction:
                eng.label(ids[j], [labels[j]], text=texts[j])
        before = drift_count(eng)
        eng.process([Document(id=ids[j], text=texts[j]) for j in range(lo, min(lo + batch, len(texts)))])
        if drift_count(eng) > before:
            fired.append(min(lo + batch, len(texts)))
    return fired


def stationary(args: argparse.Namespace, corpus: str, seed: int) -> dict[str, Any]:
    ds = load(CORPORA[corpus])
    order = np.random.default_rng(seed).permutation(len(ds))[:args.docs]
    eng = engine(args, seed)
    fired = stream(eng, [ds.texts[i] for i in order], [str(ds.labels[i]) for i in order],
                   [f"{corpus}-{i}" for i in order], args.batch, args.seed_fraction, np.random.default_rng(seed + 1))
    return {"corpus": corpus, "seed": seed, "documents": len(order), "refits": eng.refit_count,
            "drift_refits": len(fired), "fired_at": fired}


def switch(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    r8, ng = load("reuters-r8"), load("20newsgroups")
    a = np.random.default_rng(seed).permutation(len(r8))[:args.switch_after]
    b = np.random.default_rng(seed + 7).permutation(len(ng))[:args.after_switch]
    texts = [r8.texts[i] for i in a] + [ng.texts[i] for i in b]
    labels: list[str | None] = [str(r8.labels[i]) for i in a] + [None] * len(b)
    ids = [f"r8-{i}" for i in a] + [f"20ng-{i}" for i in b]
    eng = engine(args, seed)
    fired = stream(eng, texts, labels, ids, args.batch, args.seed_fraction, np.random.default_rng(seed + 1))
    after = [f - len(a) for f in fired if f > len(a)]
    return {"seed": seed, "before_switch": len(a), "drift_refits_before_switch": sum(1 for f in fired if f <= len(a)),
            "detected_after_docs": after[0] if after else None, "fired_at": fired}


def markdown(result: dict[str, Any]) -> str:
    lines = ["# Drift alarms", "", f"`{result['command']}`", "", f"Commit {result['commit']}; {result['when']}.", "",
             "## Stationary streams (every drift refit is a false alarm)", "",
             "| corpus | seed | documents | refits | drift refits | fired after (documents) |", "|---|---:|---:|---:|---:|---|"]
    for r in result["stationary"]:
        lines.append(f"| {r['corpus']} | {r['seed']} | {r['documents']:,} | {r['refits']} | {r['drift_refits']} | "
                     f"{', '.join(f'{x:,}' for x in r['fired_at']) or '-'} |")
    total = sum(r["drift_refits"] for r in result["stationary"])
    docs = sum(r["documents"] for r in result["stationary"])
    lines += ["", f"False alarms: {total} in {docs:,} documents.", "",
              "## A switch from Reuters R8 to 20 Newsgroups", "",
              "| seed | documents before | drift refits before | detected after (documents) |", "|---:|---:|---:|---:|"]
    for r in result["switch"]:
        lines.append(f"| {r['seed']} | {r['before_switch']:,} | {r['drift_refits_before_switch']} | "
                     f"{r['detected_after_docs'] if r['detected_after_docs'] is not None else 'not detected'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpora", default="20ng,r8")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--docs", type=int, default=18000, help="stationary: documents per run (at most the corpus)")
    ap.add_argument("--switch-after", type=int, default=4000)
    ap.add_argument("--after-switch", type=int, default=3000)
    ap.add_argument("--algorithm", default="constrained-kmeans")
    ap.add_argument("--refit-every", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=300)
    ap.add_argument("--seed-fraction", type=float, default=0.05)
    ap.add_argument("--drift-delta", type=float, default=EngineConfig.drift_delta)
    ap.add_argument("--tag", default="")
    ap.add_argument("--commit", default="", help="commit measured, when run from an exported tree (no .git)")
    _bench.add_smoke(ap)
    args = _bench.parse(ap, argv, SMOKE)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    commit = args.commit or _bench.commit()
    result: dict[str, Any] = {"command": "python benchmarks/drift_alarms.py " + " ".join(argv or sys.argv[1:]),
                              "commit": commit, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                              "args": vars(args), "stationary": [], "switch": []}
    for corpus in [c.strip() for c in args.corpora.split(",") if c.strip()]:
        for seed in seeds:
            result["stationary"].append(stationary(args, corpus, seed))
            print(json.dumps(result["stationary"][-1]), flush=True)
    for seed in seeds:
        result["switch"].append(switch(args, seed))
        print(json.dumps(result["switch"][-1]), flush=True)
    results = _bench.results_dir(args.smoke)
    stem = "drift_alarms" + (f"_{args.tag}" if args.tag else "")
    (results / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    (results / f"{stem}.md").write_text(markdown(result))
    print(markdown(result))
    print(f"wrote {results / stem}.json and .md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
