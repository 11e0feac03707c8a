"""What a refit round costs the worker's polling process besides the fits (issue 16), against a baseline tree.

Two measurements, each run for this tree and for ``--baseline`` (a commit exported with
``git archive`` to a temporary folder), alternating ``--repeats`` times, every run in its
own interpreter, on 20 Newsgroups:

* ``revision``: an in-process engine (``background_refit=False``) with ``--algorithms``
  serves ``--docs`` documents (5% seeds), then after each of three refits (60 more seeds
  each) runs the whole revision pass (``Engine._revise`` until the pass is empty):
  microseconds per document of the pass and the verdicts it emitted (the same in both
  trees: the pass's output does not change).
* ``transfer``: one :class:`~streamsemi.service.fitter.FitProcess` (``SCHED_IDLE``) fits each
  of ``--algorithms`` on a ``--docs``-document snapshot (5% seeds) with its snapshot scores,
  as a refit round does; per fit, the CPU seconds of the worker's side (``time.thread_time``
  of the calling thread, user and system: framing, the pipe, re-creating the model) and, from a thread that
  does nothing but count, the longest and total stalls over 2 ms: the time the GIL was held
  by the fit call, which the polling thread would have waited for.

Ratios are this tree / the baseline (medians over the repeats)::

    python benchmarks/refit_costs.py --baseline 2b269df --tag s20

Writes ``benchmarks/results/refit_costs[_TAG].json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput import run_record, save, table  # noqa: E402 - this folder's throughput.py

ROOT = Path(__file__).resolve().parent.parent
SEED_FRACTION = 0.05


def _corpus(n: int) -> tuple[list[str], list[str]]:
    import numpy as np

    from streamsemi.core.datasets import load

    ds = load("20newsgroups")
    order = np.random.default_rng(0).permutation(len(ds.texts))[:n]
    return [ds.texts[i] for i in order], [str(ds.labels[i]) for i in order]


def measure_revision(algorithms: list[str], n_docs: int) -> dict[str, Any]:
    """Per refit: documents in the pass, verdicts emitted, microseconds per document."""
    from streamsemi.core.messages import Document
    from streamsemi.engine import Engine, EngineConfig

    texts, labels = _corpus(n_docs)
    cfg = EngineConfig(algorithms=algorithms, background_refit=False, window_max_docs=n_docs,
                       max_buffered_docs=n_docs, refit_every_docs=0, refit_growth=0, refit_idle_s=0,
                       drift_detection=False, min_docs_first_refit=1, min_seed_classes=2, min_seeds_per_class=1,
                       first_fit_stable_seeds=0, first_fit_max_wait_s=0, explain_words=0, random_state=0)
    eng = Engine(cfg)
    docs = [Document(id=f"d{i}", text=t) for i, t in enumerate(texts)]
    n_seeds = int(SEED_FRACTION * n_docs)
    for d in docs[:n_seeds]:
        eng.label(d.id, [labels[int(d.id[1:])]])
    first = n_docs // 6
    eng.absorb(docs[:first])
    eng.request_refit("request")
    for lo in range(first, n_docs, 500):
        eng.process(docs[lo:lo + 500], background=False)
        while eng.background().assignments:  # every algorithm's first verdicts, as the worker completes them
            pass
    passes = []
    for r in range(3):
        for d in docs[n_seeds + 60 * r:n_seeds + 60 * (r + 1)]:
            eng.label(d.id, [labels[int(d.id[1:])]])
        eng.request_refit("request")
        eng._on_swap()
        t0 = time.perf_counter()
        eng._start_pass(eng.models)
        n = len(eng._pass_ids)
        emitted = 0
        while eng._pass_ids:
            emitted += len(eng._revise(None))
        seconds = time.perf_counter() - t0
        passes.append({"documents": n, "emitted": emitted, "us_per_doc": round(1e6 * seconds / max(n, 1), 2)})
    return {"passes": passes}


def measure_transfer(algorithms: list[str], n_docs: int) -> dict[str, Any]:
    """Per algorithm: the worker side's CPU seconds of one fit call and the GIL stalls it caused."""
    import gc

    import numpy as np

    from streamsemi.algorithms import MULTILABEL, build_estimator
    from streamsemi.core.features import TextFeaturizer
    from streamsemi.service.fitter import FitProcess

    texts, labels = _corpus(n_docs)
    X = TextFeaturizer().transform(texts, update_sketch=False)
    rng = np.random.default_rng(1)
    seeded = rng.random(n_docs) < SEED_FRACTION
    ids = [f"d{i}" for i in range(n_docs)]
    stalls: list[float] = []
    stop = threading.Event()

    def ticker() -> None:  # counts; a gap over 2 ms is time another thread of this process held the GIL
        last = time.perf_counter()
        while not stop.is_set():
            for _ in range(200):
                pass
            now = time.perf_counter()
            if now - last > 0.002:
                stalls.append(now - last)
            last = now

    fitter = FitProcess(idle=True).start()
    out: dict[str, Any] = {}
    try:
        for warm in (True, False):  # the first round of fits imports and compiles: not measured
            for name in algorithms:
                multi = name in MULTILABEL
                y = [[lb] if s else [] for lb, s in zip(labels, seeded, strict=True)] if multi else \
                    [lb if s else None for lb, s in zip(labels, seeded, strict=True)]
                est = build_estimator(name, n_new_clusters=0, random_state=0)
                gc.collect()
                gc.disable()  # the interpreter's own collections would show as stalls
                stalls.clear()
                t = threading.Thread(target=ticker, daemon=True)
                stop.clear()
                t.start()
                cpu0, t0 = time.thread_time(), time.perf_counter()
                fitter(name, est, X, y, ids, scores=True, multilabel=multi)
                wall, cpu = time.perf_counter() - t0, time.thread_time() - cpu0
                stop.set()
                t.join()
                gc.enable()
                if not warm:
                    out[name] = {"wall_s": round(wall, 3), "thread_cpu_s": round(cpu, 4),
                                 "stalls": len(stalls), "stall_total_ms": round(1e3 * sum(stalls), 1),
                                 "stall_max_ms": round(1e3 * max(stalls, default=0.0), 1)}
    finally:
        fitter.close()
    return out


def _one(tree: Path, mode: str, algorithms: str, docs: int) -> dict[str, Any]:
    code = (f"import sys, json; sys.path.insert(0, {str(tree)!r}); sys.path.insert(1, {str(Path(__file__).parent)!r}); "
            f"import refit_costs as m; print(json.dumps(m.measure_{mode}({algorithms.split(',')!r}, {docs})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tree, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{mode} in {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", required=True, help="commit to compare with (exported with git archive)")
    p.add_argument("--modes", default="revision,transfer")
    p.add_argument("--revision-algorithms", default="constrained-kmeans,semi-ldc,fsl-ck,pseudo-lsc")
    p.add_argument("--transfer-algorithms", default="constrained-kmeans,semi-ldc,cle,fsl-ck,pseudo-lsc")
    p.add_argument("--revision-docs", type=int, default=6000)
    p.add_argument("--transfer-docs", type=int, default=10000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tag", default="")
    args = p.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    with tempfile.TemporaryDirectory(prefix="refit-costs-") as tmp:
        base = Path(tmp)
        archive = subprocess.run(["git", "archive", args.baseline], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
        runs: dict[str, dict[str, list[Any]]] = {m: {"this": [], "baseline": []} for m in modes}
        for r in range(args.repeats):
            for mode in modes:
                algs = args.revision_algorithms if mode == "revision" else args.transfer_algorithms
                docs = args.revision_docs if mode == "revision" else args.transfer_docs
                for which, tree in (("this", ROOT), ("baseline", base)):
                    print(f"run {r + 1}/{args.repeats} {mode} {which}", flush=True)
                    runs[mode][which].append(_one(tree, mode, algs, docs))
    out = run_record(args, runs=runs)
    lines = ["# What a refit round costs the polling process besides the fits", "",
             f"`{out['command']}`", "", f"This tree: {out['environment'].get('commit')}; baseline: {args.baseline}. "
             f"Medians over {args.repeats} alternating runs, each in its own interpreter.", ""]
    if "revision" in runs:
        rows = []
        for k in range(3):
            this = [r["passes"][k] for r in runs["revision"]["this"]]
            base_ = [r["passes"][k] for r in runs["revision"]["baseline"]]
            a = statistics.median(x["us_per_doc"] for x in this)
            b = statistics.median(x["us_per_doc"] for x in base_)
            rows.append([k + 1, this[0]["documents"], f"{this[0]['emitted']} / {base_[0]['emitted']}", b, a,
                         f"{a / b:.2f}"])
        lines += ["## Revision pass after a refit", "",
                  f"{args.revision_docs} 20NG documents served by {args.revision_algorithms}; us per document of the whole pass.", "",
                  *table(["refit", "documents", "verdicts emitted (this / baseline)", "baseline us/doc",
                          "this us/doc", "ratio"], rows), ""]
    if "transfer" in runs:
        rows = []
        for name in runs["transfer"]["this"][0]:
            def med(which: str, key: str, name: str = name) -> float:
                return statistics.median(r[name][key] for r in runs["transfer"][which])
            rows.append([name, med("baseline", "thread_cpu_s"), med("this", "thread_cpu_s"),
                         f"{med('this', 'thread_cpu_s') / med('baseline', 'thread_cpu_s'):.2f}",
                         med("baseline", "stall_total_ms"), med("this", "stall_total_ms"),
                         med("baseline", "stall_max_ms"), med("this", "stall_max_ms")])
        lines += ["## A fit in the fit process, seen from the worker", "",
                  f"{args.transfer_docs}-document 20NG snapshot, {SEED_FRACTION:.0%} seeds, with snapshot scores. CPU: "
                  "the calling thread's, user and system (framing, pipe reads and writes, re-creating the model); stalls: gaps over 2 ms of a thread that only counts.", "",
                  *table(["algorithm", "baseline CPU s", "this CPU s", "ratio", "baseline stalls ms",
                          "this stalls ms", "baseline longest ms", "this longest ms"], rows), ""]
    save("refit_costs", args.tag, out, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
