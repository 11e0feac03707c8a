"""Label efficiency of the suggestions, and what ranking costs a refit round.

``python benchmarks/active_learning.py curves`` (default): in process through
:class:`streamsemi.engine.Engine` (``background_refit=False``, every refit trigger off,
the whole corpus in the window). A simulated annotator (the corpus' true labels) starts
from the same stratified seeds in both arms (``--initial`` per class) and after every
refit labels ``--k`` more documents:

* ``suggested``: the top ``k`` of the engine's suggestion list (rank order), as a person
  working the console's queue would;
* ``random``: ``k`` documents drawn uniformly from the unlabelled ones.

After each refit the primary model's label of every non-seed document is scored
against the corpus label (macro-F1 over the corpus' classes,
:func:`streamsemi.evaluation.metrics.macro_f1_known`). The reference is one fit with a
uniformly random 5% of the corpus as seeds (``--reference``; the same algorithms and
``--algorithm-params`` as the arms). Every figure is the mean over ``--seeds`` random
seeds (document order, initial seeds, random draws). The target: the
``suggested`` curve reaches the 5%-random macro-F1 with at most 2% of the documents
labelled.

How the target is measured: the curve has a checkpoint at exactly
``floor(--target-fraction * N)`` labels (:func:`checkpoints`; the batch that would cross it
is cut short, :func:`batch_size`, so one refit happens there), and "at 2%" is the
macro-F1 of that point (:func:`at_fraction`), not of the last multiple of ``k`` below it.
"Reached at" is the first checkpoint whose mean macro-F1 is >= the reference
(:func:`first_reaching`, no interpolation between checkpoints).

``python benchmarks/active_learning.py cost``: a 10,000-document 20NG window with
``--cost-seeds`` random seeds; per algorithm set, the refit round's time without and
with the ranking (``Engine.last_suggestion_seconds``) and their ratio (target < 10%).

Corpora: ``r8`` (Reuters R8, 7,674 documents) and ``20ng-comp`` (the five comp.* groups
of 20 Newsgroups, 4,869 documents) are the evaluation corpora of the target. Development
corpora (the target does not report them; the ranker's constants are chosen on them):
``20ng-talk`` (talk.*, 3,252 documents, 4 classes), ``20ng-rec`` (rec.*, 3,978),
``20ng-sci`` (sci.*, 3,952) and ``20ng-skew`` (R8's eight class sizes on 20NG documents outside comp.*,
7,674 documents: :data:`SKEW_CLASSES`). Results: ``benchmarks/results/active_learning.json``,
``.md`` and ``.png`` (matplotlib), ``active_learning_cost.json`` / ``.md``.

The ranking's constants (:mod:`streamsemi.core.suggestions`: ``DIVERSITY``, ``POOL_FACTOR``,
``CANDIDATE_SAMPLE``, ``DENSITY_POWER``, ``COVERAGE_POWER``, ``WEIGHTS``) were chosen with this script's
development options (``--arms suggested``, ``--weights``, ``--diversity``, ``--pool-factor``, ...) on the
development corpora only, never on r8 or 20ng-comp: the runs and their figures are in
docs/decisions.md ("Label suggestions") and the figures users read in docs/suggestions.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.metrics import f1_score

from streamsemi.core import suggestions as sg
from streamsemi.core.datasets import load
from streamsemi.core.messages import Document
from streamsemi.core.store import rows_to_csr
from streamsemi.engine import Engine, EngineConfig
from streamsemi.evaluation.metrics import macro_f1_known

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench  # noqa: E402

#: ``--smoke``: 300 R8 documents, one seed draw, 5 labels per refit up to 10% of them.
SMOKE = ["--corpora", "r8", "--seeds", "0", "--max-docs", "300", "--initial", "1", "--k", "5",
         "--max-fraction", "0.1", "--target-fraction", "0.05", "--cost-docs", "300", "--cost-seeds", "30",
         "--cost-rounds", "1", "--cost-algorithms", "constrained-kmeans"]
#: evaluation corpora (the label-efficiency target) and development corpora (the ranker's constants are chosen on these only)
CORPORA = {"r8": ("reuters-r8", None), "20ng-comp": ("20newsgroups", "comp."),
           "20ng-talk": ("20newsgroups", "talk."), "20ng-sci": ("20newsgroups", "sci."),
           "20ng-rec": ("20newsgroups", "rec.")}
#: development corpus with R8's class sizes (earn 3,923, acq 2,292, crude 374, trade 326, money-fx 293,
#: interest 271, ship 144, grain 51) on 20NG documents outside comp.*: the two large classes merge
#: groups (rec.*; sci.crypt/electronics/med), two pairs of small classes are confusable (the two
#: politics groups; religion and atheism, like money-fx and interest). A fixed draw (seed 0).
SKEW_CLASSES = (("rec.", ("rec.",), 3923), ("sci-3", ("sci.crypt", "sci.electronics", "sci.med"), 2292),
                ("talk.politics.guns", ("talk.politics.guns",), 374),
                ("talk.politics.misc", ("talk.politics.misc",), 326),
                ("talk.religion.misc", ("talk.religion.misc",), 293), ("alt.atheism", ("alt.atheism",), 271),
                ("sci.space", ("sci.space",), 144), ("misc.forsale", ("misc.forsale",), 51))
CORPORA["20ng-skew"] = ("20newsgroups", "skew")
SIX = ["constrained-kmeans", "semi-ldc", "cle", "d-lda", "fsl-ck", "pseudo-lsc"]


def corpus(name: str) -> tuple[list[str], list[str]]:
    """Texts and labels of a benchmark corpus."""
    dataset, prefix = CORPORA[name]
    ds = load(dataset)
    if prefix == "skew":
        rng = np.random.default_rng(0)
        labels = np.asarray([str(lb) for lb in ds.labels])
        texts, out = [], []
        for cls, groups, size in SKEW_CLASSES:
            rows = np.flatnonzero(np.any([np.char.startswith(labels.astype(str), g) for g in groups], axis=0))
            for i in np.sort(rng.choice(rows, size=min(size, rows.size), replace=False)):
                texts.append(ds.texts[i])
                out.append(cls)
        return texts, out
    keep = [i for i, lb in enumerate(ds.labels) if prefix is None or str(lb).startswith(prefix)]
    return [ds.texts[i] for i in keep], [str(ds.labels[i]) for i in keep]


def engine_config(algorithms: list[str], n_docs: int, top_n: int, **kw: Any) -> EngineConfig:
    """In-process engine: whole corpus in the window, refits only on request, no revisions."""
    base = dict(algorithms=algorithms, background_refit=False, window_max_docs=max(n_docs, 1),
                max_buffered_docs=max(n_docs, 1), refit_every_docs=0, refit_growth=0, refit_idle_s=0,
                drift_detection=False, revisions="off", min_docs_first_refit=1, min_seed_classes=2,
                min_seeds_per_class=1, first_fit_stable_seeds=0, first_fit_max_wait_s=0, explain_words=0,
                suggestions_top_n=top_n)
    base.update(kw)
    return EngineConfig(**base)


def windowed(texts: list[str], order: np.ndarray, cfg: EngineConfig) -> tuple[Engine, list[str]]:
    """An engine whose window holds the corpus (``order``); returns it and the ids in the window.

    The window is exactly full, as a worker's sliding window is in steady state (refits of a full
    window warm-start, e.g. constrained k-means keeps its seed-weight choice): when the engine
    rejects a document (20NG comp.* has one whose only word is the stop word "how"), it is built again with
    the window's size set to the documents it took.
    """
    eng = Engine(cfg)
    ids = [f"d{i}" for i in order]
    for lo in range(0, len(order), 2000):
        eng.absorb([Document(id=ids[j], text=texts[order[j]]) for j in range(lo, min(lo + 2000, len(order)))])
    took = np.fromiter((k in eng.window for k in ids), dtype=bool, count=len(ids))
    n = int(took.sum())
    if 0 < n < cfg.window_max_docs:
        return windowed(texts, order[took], replace(cfg, window_max_docs=n, max_buffered_docs=n))
    return eng, [k for k, t in zip(ids, took, strict=True) if t]


def predictions(eng: Engine, ids: list[str]) -> tuple[list[str], np.ndarray]:
    """The window's non-seed documents and the primary model's label of each."""
    rest = [k for k in ids if k not in eng.seeds]
    slot = eng.models[eng.primary]
    X = rows_to_csr([eng.window.get(k).row for k in rest], eng.config.n_features)
    return rest, np.asarray([str(c) for c in slot.classes])[np.asarray(slot.model.predict_proba(X)).argmax(axis=1)]


def score(eng: Engine, ids: list[str], truth: dict[str, str], classes: list[str]) -> float:
    """Macro-F1 of the primary model's labels of the window's non-seed documents."""
    rest, pred = predictions(eng, ids)
    return macro_f1_known([truth[k] for k in rest], list(pred), classes)


def class_report(y_true: list[str], y_pred: list[str], classes: list[str],
                 seeds: dict[str, int]) -> dict[str, dict[str, Any]]:
    """Per class: F1, documents predicted and true, seeds, and the 3 true classes it takes most documents from.

    ``--per-class``: where a curve loses to the reference (a class whose centroid took
    another's documents shows as many predicted, a low F1 and where they came from).
    """
    yt, yp = np.asarray(y_true, dtype=object), np.asarray(y_pred, dtype=object)
    f1 = f1_score(yt, yp, labels=classes, average=None, zero_division=0.0)
    out: dict[str, dict[str, Any]] = {}
    for c, f in zip(classes, f1, strict=True):
        taken = sorted(Counter(yt[(yp == c) & (yt != c)].tolist()).items(), key=lambda kv: (-kv[1], str(kv[0])))[:3]
        out[c] = {"f1": round(float(f), 4), "predicted": int(np.sum(yp == c)), "true": int(np.sum(yt == c)),
                  "seeds": int(seeds.get(c, 0)), "taken_from": {str(k): int(v) for k, v in taken}}
    return out


def report_of(eng: Engine, ids: list[str], truth: dict[str, str], classes: list[str]) -> dict[str, dict[str, Any]]:
    """:func:`class_report` of the engine's primary model on the window's non-seed documents."""
    rest, pred = predictions(eng, ids)
    return class_report([truth[k] for k in rest], list(pred), classes, eng.seeds.class_counts())


def stratified(ids: list[str], truth: dict[str, str], per_class: int, rng: np.random.Generator,
               fraction: float | None = None) -> list[str]:
    """``per_class`` random documents of each class, or (``fraction``) ``max(1, round(fraction * n_c))`` of each."""
    out = []
    for c in sorted(set(truth.values())):
        members = [k for k in ids if truth[k] == c]
        size = per_class if fraction is None else max(1, int(round(fraction * len(members))))
        out.extend(rng.choice(members, size=min(size, len(members)), replace=False).tolist())
    return out


def run_arm(arm: str, texts: list[str], labels: list[str], seed: int, args: argparse.Namespace) -> list[dict]:
    """One learning curve: (labels, fraction, macro-F1, suggestion reasons) after each refit."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(texts))
    cfg = engine_config([a.strip() for a in args.algorithms.split(",")], len(texts), max(args.k, 1),
                        random_state=seed, algorithm_params=json.loads(args.algorithm_params or "{}"))
    eng, ids = windowed(texts, order, cfg)
    truth = {f"d{i}": labels[i] for i in order}
    classes = sorted(set(labels))
    for k in stratified(ids, truth, args.initial, np.random.default_rng(seed + 1000),
                        getattr(args, "initial_fraction", None)):
        eng.label(k, [truth[k]])
    budget = int(round(args.max_fraction * len(ids)))
    stops = checkpoints(len(ids), budget, args.target_fraction)
    draw = np.random.default_rng(seed + 2000)
    curve = []
    while True:
        eng.check_seeds()  # the new labels judged by the models that have not seen them (the worker's loop does it)
        t0 = time.perf_counter()
        eng.request_refit("request")
        fit_s = time.perf_counter() - t0
        eng.suggestion_updates()
        n_labels = len(eng.seeds)
        reasons: dict[str, int] = {}
        curve.append({"labels": n_labels, "fraction": n_labels / len(ids), "macro_f1": score(eng, ids, truth, classes),
                      "refit_s": round(fit_s, 3), "suggest_s": round(eng.last_suggestion_seconds, 3)})
        if getattr(args, "per_class", False) and n_labels == stops[0]:   # the target checkpoint (2%)
            curve[-1]["classes"] = report_of(eng, ids, truth, classes)
        if len(eng.config.algorithms) > 1:  # the weight of each other algorithm's vote in this round's ranking
            curve[-1]["credibility"] = {a: round(eng.vote_credibility(a), 4) for a in eng.config.algorithms
                                        if a != eng.primary}
        if n_labels >= budget:
            break
        k = batch_size(n_labels, args.k, stops)
        if arm == "suggested":
            picked = [m["id"] for m in eng.suggestions()][:k]
            for m in eng.suggestions()[:k]:
                reasons[m["reason"]] = reasons.get(m["reason"], 0) + 1
        else:
            open_ids = [x for x in ids if x not in eng.seeds]
            picked = draw.choice(open_ids, size=k, replace=False).tolist()
        curve[-1]["next_reasons"] = reasons
        if not picked:
            break
        for doc_id in picked:
            eng.label(doc_id, [truth[doc_id]])
    return curve


def checkpoints(n_docs: int, budget: int, target_fraction: float) -> list[int]:
    """Label counts a curve must stop at: ``floor(target_fraction * n_docs)`` and the budget.

    Between them the annotator labels ``k`` documents per refit; a batch that would cross a
    checkpoint is cut short so that one refit happens exactly there.
    """
    at_target = int(np.floor(target_fraction * n_docs + 1e-9))
    return sorted({c for c in (at_target, budget) if 0 < c <= budget} | {budget})


def batch_size(n_labels: int, k: int, stops: list[int]) -> int:
    """Documents to label next: ``k``, cut short at the next checkpoint of ``stops``."""
    return min(k, next((c for c in stops if c > n_labels), n_labels) - n_labels)


def reference(texts: list[str], labels: list[str], seed: int, fraction: float, algorithms: list[str],
              algorithm_params: dict[str, dict[str, Any]] | None = None,
              detail: dict[str, Any] | None = None) -> float:
    """Macro-F1 of one fit with a uniformly random ``fraction`` of the corpus as seeds (the same
    algorithms and parameters as the arms); ``detail`` (a dict) gets its :func:`class_report`."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(texts))
    eng, ids = windowed(texts, order, engine_config(algorithms, len(texts), 0, random_state=seed,
                                                    algorithm_params=algorithm_params or {}))
    truth = {f"d{i}": labels[i] for i in order}
    n = int(round(fraction * len(ids)))
    for k in np.random.default_rng(seed + 3000).choice(ids, size=n, replace=False):
        eng.label(str(k), [truth[str(k)]])
    eng.request_refit("request")
    if detail is not None:
        detail.update(report_of(eng, ids, truth, sorted(set(labels))))
    return score(eng, ids, truth, sorted(set(labels)))


def at_fraction(curve: list[dict], fraction: float) -> float:
    """Macro-F1 of the last point with at most ``fraction`` of the documents labelled."""
    ok = [p for p in curve if p["fraction"] <= fraction + 1e-9]
    return ok[-1]["macro_f1"] if ok else float("nan")


def first_reaching(curve: list[dict], target: float) -> float | None:
    """The smallest labelled fraction whose macro-F1 reaches ``target`` (None: never)."""
    return next((p["fraction"] for p in curve if p["macro_f1"] >= target), None)


def mean_curve(curves: list[list[dict]]) -> list[dict]:
    """Point-wise mean over seeds (curves of the same length: the same label counts)."""
    n = min(len(c) for c in curves)
    return [{"labels": float(np.mean([c[i]["labels"] for c in curves])),
             "fraction": float(np.mean([c[i]["fraction"] for c in curves])),
             "macro_f1": float(np.mean([c[i]["macro_f1"] for c in curves])),
             "sd": float(np.std([c[i]["macro_f1"] for c in curves]))} for i in range(n)]


def cmd_curves(args: argparse.Namespace) -> dict:
    seeds = [int(s) for s in args.seeds.split(",")]
    algorithms = [a.strip() for a in args.algorithms.split(",")]
    out: dict[str, Any] = {"settings": {k: v for k, v in vars(args).items() if k != "func"}, "corpora": {}}
    for name in args.corpora.split(","):
        texts, labels = corpus(name)
        if args.max_docs and args.max_docs < len(texts):  # a fixed subsample, in corpus order
            keep = np.sort(np.random.default_rng(0).choice(len(texts), args.max_docs, replace=False))
            texts, labels = [texts[i] for i in keep], [labels[i] for i in keep]
        t0 = time.perf_counter()
        res: dict[str, Any] = {"documents": len(texts), "classes": len(set(labels)), "arms": {}}
        for arm in args.arms.split(","):
            res["arms"][arm] = {"per_seed": [run_arm(arm, texts, labels, s, args) for s in seeds]}
            res["arms"][arm]["mean"] = mean_curve(res["arms"][arm]["per_seed"])
        params = json.loads(args.algorithm_params or "{}")
        details: list[dict[str, Any]] = [{} for _ in seeds]
        refs = [reference(texts, labels, s, args.reference, algorithms, params,
                          detail=d if args.per_class else None) for s, d in zip(seeds, details, strict=True)]
        res["reference"] = {"fraction": args.reference, "per_seed": refs, "mean": float(np.mean(refs))}
        if args.per_class:
            res["reference"]["classes_per_seed"] = details
        empty = {"mean": [{"labels": 0, "fraction": 0.0, "macro_f1": float("nan"), "sd": 0.0}]}
        sug, rnd = res["arms"].get("suggested", empty)["mean"], res["arms"].get("random", empty)["mean"]
        target = res["reference"]["mean"]
        res["target"] = {
            "reference_macro_f1": target,
            "suggested_at_2pct": at_fraction(sug, args.target_fraction),
            "random_at_2pct": at_fraction(rnd, args.target_fraction),
            "suggested_reaches_reference_at": first_reaching(sug, target),
            "random_reaches_reference_at": first_reaching(rnd, target),
            "met": at_fraction(sug, args.target_fraction) >= target,
            # development summary: mean macro-F1 of the suggested curve's points up to 2% (less noisy than one point)
            "suggested_mean_to_2pct": float(np.mean([p["macro_f1"] for p in sug
                                                      if p["fraction"] <= args.target_fraction + 1e-9])),
        }
        res["seconds"] = round(time.perf_counter() - t0, 1)
        out["corpora"][name] = res
        print(json.dumps({"corpus": name, **res["target"], "seconds": res["seconds"]}), flush=True)
    return out


def curves_markdown(out: dict) -> str:
    s = out["settings"]
    lines = ["# Label efficiency of the suggestions", "",
             f"`python benchmarks/active_learning.py curves --corpora {s['corpora']} --seeds {s['seeds']} "
             f"--k {s['k']} --initial {s['initial']} --algorithms {s['algorithms']}"
             + (f" --initial-fraction {s['initial_fraction']}" if s.get("initial_fraction") else "") + "`", "",
             "Macro-F1 of the primary model on the non-seed documents after each refit, mean (sd) over the seeds; "
             "both arms start from "
             + (f"{s['initial_fraction']:.1%} of each class" if s.get("initial_fraction")
                else f"{s['initial']} stratified seeds per class")
             + f" and label {s['k']} documents per refit.", ""]
    for name, res in out["corpora"].items():
        t = res["target"]
        lines += [f"## {name} ({res['documents']} documents, {res['classes']} classes)", "",
                  f"Reference: {s['reference']:.0%} uniformly random seeds give macro-F1 "
                  f"{t['reference_macro_f1']:.3f} (per seed: "
                  + ", ".join(f"{v:.3f}" for v in res["reference"]["per_seed"]) + ").", "",
                  "| labels | % of corpus | suggested | random |", "|---:|---:|---:|---:|"]
        none = {"mean": [{"macro_f1": float("nan"), "sd": 0.0}] * len(res["arms"].get("suggested", {"mean": []})["mean"])}
        for a, b in zip(res["arms"].get("suggested", none)["mean"], res["arms"].get("random", none)["mean"],
                        strict=False):
            lines.append(f"| {a['labels']:.0f} | {100 * a['fraction']:.2f} | {a['macro_f1']:.3f} ({a['sd']:.3f}) | "
                         f"{b['macro_f1']:.3f} ({b['sd']:.3f}) |")
        reach = t["suggested_reaches_reference_at"]
        rreach = t["random_reaches_reference_at"]
        lines += ["", f"At 2% labels: suggested {t['suggested_at_2pct']:.3f}, random {t['random_at_2pct']:.3f}; "
                  f"the reference is reached with suggestions at "
                  + (f"{100 * reach:.2f}%" if reach is not None else "no point of the curve")
                  + ", with random labels at " + (f"{100 * rreach:.2f}%" if rreach is not None else "no point of the curve")
                  + f". Target (suggested at 2% >= reference): **{'met' if t['met'] else 'missed'}**.", ""]
        lines += per_class_markdown(res)
    return "\n".join(lines) + "\n"


def per_class_markdown(res: dict) -> list[str]:
    """``--per-class``: mean per-class F1 and predicted documents, suggested at the target point against the reference."""
    at_target = [next((p["classes"] for p in curve if "classes" in p), None)
                 for curve in res["arms"].get("suggested", {}).get("per_seed", [])]
    refs = res["reference"].get("classes_per_seed")
    if not refs or not at_target or any(r is None for r in at_target):
        return []
    lines = ["Per class (mean over the seeds): F1 and documents predicted, suggested at the target point "
             "against the reference; the class each takes most documents from in the suggested runs.", "",
             "| class | true | suggested F1 | reference F1 | suggested predicted | reference predicted | "
             "suggested seeds | takes most from |", "|---|---:|---:|---:|---:|---:|---:|---|"]
    for c in refs[0]:
        def mean(reports: list[dict], key: str, c: str = c) -> float:
            return float(np.mean([r[c][key] for r in reports]))
        taken: dict[str, int] = {}
        for r in at_target:
            for k, v in r[c]["taken_from"].items():
                taken[k] = taken.get(k, 0) + v
        most = max(taken, key=taken.get) if taken else ""
        lines.append(f"| {c} | {mean(refs, 'true'):.0f} | {mean(at_target, 'f1'):.3f} | {mean(refs, 'f1'):.3f} | "
                     f"{mean(at_target, 'predicted'):.0f} | {mean(refs, 'predicted'):.0f} | {mean(at_target, 'seeds'):.1f} | "
                     + (f"{most} ({taken[most] / len(at_target):.0f})" if most else "") + " |")
    return lines + [""]


def plot(out: dict, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    names = list(out["corpora"])
    fig, axes = plt.subplots(1, len(names), figsize=(6 * len(names), 4.2), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        res = out["corpora"][name]
        for arm, style in (("suggested", "-o"), ("random", "--s")):
            if arm not in res["arms"]:
                continue
            m = res["arms"][arm]["mean"]
            x = [100 * p["fraction"] for p in m]
            y = np.array([p["macro_f1"] for p in m])
            sd = np.array([p["sd"] for p in m])
            ax.plot(x, y, style, ms=3, label=arm)
            ax.fill_between(x, y - sd, y + sd, alpha=0.15)
        ax.axhline(res["reference"]["mean"], color="grey", lw=1, ls=":",
                   label=f"{100 * res['reference']['fraction']:.0f}% random seeds")
        ax.axvline(2.0, color="red", lw=0.8, ls=":")
        ax.set_title(f"{name}: {res['documents']} documents")
        ax.set_xlabel("labelled documents (% of corpus)")
        ax.set_ylabel("macro-F1 (non-seed documents)")
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def cmd_cost(args: argparse.Namespace) -> dict:
    """Refit round time without and with ranking on a 10,000-document window."""
    ds = load("20newsgroups")
    rng = np.random.default_rng(0)
    order = rng.permutation(len(ds))[: args.cost_docs]
    texts = [ds.texts[i] for i in range(len(ds))]
    truth = {f"d{i}": str(ds.labels[i]) for i in order}
    out: dict[str, Any] = {"documents": int(order.size), "seeds": args.cost_seeds, "runs": []}
    for algs in args.cost_algorithms.split(";"):
        algorithms = [a.strip() for a in algs.split(",")]
        row: dict[str, Any] = {"algorithms": algorithms, "rounds": []}
        eng, ids = windowed(texts, order, engine_config(algorithms, int(order.size), args.cost_top_n))
        for k in np.random.default_rng(1).choice(ids, size=args.cost_seeds, replace=False):
            eng.label(str(k), [truth[str(k)]])
        for _ in range(args.cost_rounds):
            t0 = time.perf_counter()
            eng.request_refit("request")
            total = time.perf_counter() - t0
            rank_s = eng.last_suggestion_seconds
            row["rounds"].append({"round_s": round(total - rank_s, 3), "ranking_s": round(rank_s, 4),
                                  "ratio": round(rank_s / max(total - rank_s, 1e-9), 4)})
        row["median_ratio"] = float(np.median([r["ratio"] for r in row["rounds"]]))
        out["runs"].append(row)
        print(json.dumps(row), flush=True)
    return out


def cost_markdown(out: dict, argv: str) -> str:
    lines = ["# What ranking the suggestions adds to a refit round", "", f"`python benchmarks/active_learning.py {argv}`",
             "", f"20 Newsgroups, {out['documents']} documents in the window, {out['seeds']} random seeds; "
             "round = every algorithm's fit (and the engine's own extras: agreement, k-fold probes), "
             "ranking = `Engine._rank_suggestions` (a random sample of 2,000 unlabelled window documents: the primary "
             "model on all of them, the others on up to 2,000, coverage, the pool's kernel k-means and the diversity "
             "pass). The machine was shared with other jobs on its 2 cores: the round times vary with the load.", "", "| algorithms | refit round (s) | ranking (s) | ratio (median) |",
             "|---|---:|---:|---:|"]
    for r in out["runs"]:
        rounds = r["rounds"]
        lines.append(f"| {', '.join(r['algorithms'])} | {np.median([x['round_s'] for x in rounds]):.2f} | "
                     f"{np.median([x['ranking_s'] for x in rounds]):.3f} | {100 * r['median_ratio']:.1f}% |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", nargs="?", default="curves", choices=("curves", "cost"))
    p.add_argument("--corpora", default="r8,20ng-comp")
    p.add_argument("--max-docs", type=int, default=None, help="curves: a fixed subsample of each corpus")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--algorithms", default="constrained-kmeans")
    p.add_argument("--k", type=int, default=10, help="documents labelled per refit")
    p.add_argument("--initial", type=int, default=2, help="stratified seeds per class to start from")
    p.add_argument("--initial-fraction", type=float, default=None,
                   help="start instead from this stratified fraction of each class (at least 1 per class)")
    p.add_argument("--max-fraction", type=float, default=0.03, help="label budget (fraction of the corpus)")
    p.add_argument("--target-fraction", type=float, default=0.02,
                   help="labelled fraction the target is judged at (a refit happens at exactly its floor)")
    p.add_argument("--reference", type=float, default=0.05, help="random seed fraction of the reference")
    p.add_argument("--out", default="active_learning")
    p.add_argument("--arms", default="suggested,random")
    p.add_argument("--per-class", action="store_true",
                   help="record per-class F1, predicted counts and confusions at the target point and of the reference")
    p.add_argument("--weights", default="", help="ranking variant: JSON of reason weights (development runs)")
    p.add_argument("--density-power", type=float, default=None, help="ranking variant (development runs)")
    p.add_argument("--coverage-power", type=float, default=None, help="ranking variant (development runs)")
    p.add_argument("--pool-balance", default=None, choices=sg.POOL_BALANCE_MODES,
                   help="ranking variant (development runs)")
    p.add_argument("--diversity", default=None, choices=sg.DIVERSITY_MODES, help="ranking variant (development runs)")
    p.add_argument("--pool-factor", type=int, default=None, help="ranking variant (development runs)")
    p.add_argument("--candidate-sample", type=int, default=None, help="ranking variant (development runs)")
    p.add_argument("--algorithm-params", default="",
                   help='JSON {algorithm: {parameter: value}} for the refits of both arms, e.g. '
                        '\'{"constrained-kmeans": {"warm_start": false}}\' (development runs)')
    p.add_argument("--cost-docs", type=int, default=10000)
    p.add_argument("--cost-seeds", type=int, default=200)
    p.add_argument("--cost-rounds", type=int, default=3)
    p.add_argument("--cost-top-n", type=int, default=50)
    p.add_argument("--cost-algorithms", default="constrained-kmeans;constrained-kmeans,seeded-kmeans,semi-ldc")
    _bench.add_smoke(p)
    args = _bench.parse(p, argv, SMOKE)
    if args.weights:
        sg.WEIGHTS.update(json.loads(args.weights))
    if args.density_power is not None:
        sg.DENSITY_POWER = args.density_power
    if args.coverage_power is not None:
        sg.COVERAGE_POWER = args.coverage_power
    if args.diversity is not None:
        sg.DIVERSITY = args.diversity
    if args.pool_factor is not None:
        sg.POOL_FACTOR = args.pool_factor
    if args.pool_balance is not None:
        sg.POOL_BALANCE = args.pool_balance
    if args.candidate_sample is not None:
        sg.CANDIDATE_SAMPLE = args.candidate_sample
    results = _bench.results_dir(args.smoke)
    raw = " ".join(sys.argv[1:] if argv is None else argv)
    if args.mode == "cost":
        out = {**cmd_cost(args), "commit": _bench.commit()}
        (results / f"{args.out}_cost.json").write_text(json.dumps(out, indent=1))
        (results / f"{args.out}_cost.md").write_text(cost_markdown(out, raw))
        print(cost_markdown(out, raw))
        print(f"wrote {results / args.out}_cost.json and .md")
        return 0
    out = {**cmd_curves(args), "commit": _bench.commit()}
    (results / f"{args.out}.json").write_text(json.dumps(out, indent=1))
    (results / f"{args.out}.md").write_text(curves_markdown(out))
    print(curves_markdown(out))
    print(f"wrote {results / args.out}.json and .md")
    if plot(out, results / f"{args.out}.png"):
        print(f"plot: {results / (args.out + '.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
