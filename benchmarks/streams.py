"""Per-stream models: the cost of routing by stream, in process, no Kafka.

For the same documents (R8, cycled with unique ids) and the same fitted models, the
docs/s of ``process()`` in batches of ``--batch`` (the worker's ``max_poll_records``):

* ``engine``: one :class:`~streamsemi.engine.Engine` (the default path, ``streams`` empty);
* ``streams=K``: :class:`~streamsemi.service.streams.StreamEngines` with K streams, the
  documents spread round-robin over them (each stream has its own engine, seeds and
  model, fitted on its share of the window).

Refits are off during the measurement (the models fitted before the clock starts), so
the figure is vectorising + assigning + the routing; revisions off. Each variant is run
``--repeats`` times, the variants interleaved; the median is reported (with the load average).

``blocking`` (``--blocking-window``): :func:`measure_blocking`, the time to a small stream's
first model alone and while a big stream refits, through the real fit process.

Results: ``benchmarks/results/streams[_TAG].json`` and ``.md`` (the command at the top).

Example::

    python benchmarks/streams.py --docs 6000 --streams 1,2,8
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from streamsemi.core import datasets
from streamsemi.core.messages import Document
from streamsemi.core.telemetry import Telemetry
from streamsemi.engine import Engine, EngineConfig
from streamsemi.service.streams import StreamEngines

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench  # noqa: E402

#: ``--smoke``: 300 documents in batches of 100 (200 windowed first), 1 and 2 streams, once, no blocking run.
SMOKE = ["--docs", "300", "--batch", "100", "--warm", "200", "--streams", "1,2", "--repeats", "1",
         "--blocking-window", "0"]


def _config() -> EngineConfig:
    return EngineConfig(algorithms=["constrained-kmeans"], background_refit=False, min_docs_first_refit=50,
                        min_seed_classes=2, first_fit_stable_seeds=0, refit_growth=0, refit_every_docs=0,
                        refit_idle_s=0, first_fit_max_wait_s=0, drift_detection=False, revisions="off",
                        suggestions_top_n=0, window_max_docs=5000)


def _docs(ds: datasets.Dataset, n: int, offset: int, streams: int) -> list[Document]:
    out = []
    for k in range(n):
        i = (offset + k) % len(ds.texts)
        out.append(Document(id=f"d{offset + k}", text=ds.texts[i],
                            stream=None if streams == 0 else f"s{k % streams}"))
    return out


def _prepared(ds: datasets.Dataset, streams: int, warm: int) -> Engine | StreamEngines:
    """An engine (streams = 0) or K stream engines, each with seeds and a fitted model."""
    if streams == 0:
        eng: Engine | StreamEngines = Engine(_config(), Telemetry())
    else:
        eng = StreamEngines(_config(), Telemetry(), ["*"], "s0", max(streams, 1), worker="bench")
    for k in range(0, 400):
        i = k * 7 % len(ds.texts)
        name = None if streams == 0 else f"s{k % streams}"
        msg_engine = eng if streams == 0 else eng.engine(name)
        msg_engine.label(f"seed{k}", [ds.labels[i]], ds.texts[i], offset=k)
    eng.process(_docs(ds, warm, 10**7, streams))   # first fits (seed policy met, window >= 50)
    eng.request_refit("bench")
    assert eng.ready, "every stream has a model"
    while eng.buffer:   # the documents buffered before the first fit: assigned before the clock starts
        eng.process([])
    return eng


def measure(ds: datasets.Dataset, streams: int, n_docs: int, batch: int, warm: int) -> dict:
    eng = _prepared(ds, streams, warm)
    docs = _docs(ds, n_docs, 0, streams)
    t0 = time.perf_counter()
    assigned = rejected = 0
    for start in range(0, n_docs, batch):
        result = eng.process(docs[start:start + batch])
        assigned += len(result.assignments)
        rejected += len(result.rejected)   # no_terms (a few R8 texts)
    seconds = time.perf_counter() - t0
    return {"docs_per_s": n_docs / seconds, "assigned": assigned, "rejected": rejected, "seconds": seconds}


def _ng_docs(ds: datasets.Dataset, idx: list[int], stream: str, prefix: str) -> list[Document]:
    return [Document(id=f"{prefix}{k}", text=ds.texts[i], stream=stream) for k, i in enumerate(idx)]


def measure_blocking(window: int, algorithms: list[str]) -> dict:
    """Time to a small stream's first model: alone, and while a big stream refits, through the real fit process.

    Stream ``big`` has a first model on ``window`` 20NG documents (5% seeds), then refits
    (every algorithm, one fit each); ``small`` (400 R8 documents, 40 seeds) starts its first
    round while big's refit is fitting. Fits go through one :class:`FitProcess`, as in the worker.
    """
    import random

    from streamsemi.service.fitter import FitProcess

    ng, r8 = datasets.load("20newsgroups"), datasets.load("reuters-r8")
    rng = random.Random(0)
    calls: list[tuple[str, int, float, float]] = []
    fitter = FitProcess(nice=0).start()

    def recorded(name, est, X, y, doc_ids, warm=None):
        t0 = time.monotonic()
        out = fitter(name, est, X, y, doc_ids, warm)
        calls.append((name, X.shape[0], t0, time.monotonic()))
        return out

    def engines() -> StreamEngines:
        cfg = EngineConfig(algorithms=list(algorithms), primary=algorithms[0], min_docs_first_refit=50,
                           min_seed_classes=2, first_fit_stable_seeds=0, refit_growth=0, refit_every_docs=0,
                           refit_idle_s=0, first_fit_max_wait_s=0, drift_detection=False, revisions="off",
                           suggestions_top_n=0, window_max_docs=window, max_buffered_docs=window)
        se = StreamEngines(cfg, Telemetry(), ["big", "small"], "big", 2, worker="bench")
        se.fitter = recorded
        return se

    small_idx = rng.sample(range(len(r8.texts)), 400)

    def small_first_model(se: StreamEngines) -> float:
        for k, i in enumerate(small_idx[:40]):
            se.engine("small").label(f"s{k}", [r8.labels[i]], r8.texts[i], offset=k)
        t0 = time.monotonic()
        se.process(_ng_docs(r8, small_idx, "small", "s"))
        while not se.engines["small"].ready:
            time.sleep(0.01)
            se.process([])
        return time.monotonic() - t0

    try:
        alone = small_first_model(engines())
        se = engines()
        big_idx = rng.sample(range(len(ng.texts)), window)
        big = se.engine("big")
        for k, i in enumerate(big_idx[:: 20]):
            big.label(f"b{k}", [ng.labels[i]], None, offset=k)
        se.process(_ng_docs(ng, big_idx, "big", "b"))
        assert se.wait_for_refit(3600) and big.ready
        calls.clear()
        t_big = time.monotonic()
        se.request_refit()
        while not any(c for c in calls) and not (fitter.pid and big.refitting and time.monotonic() - t_big > 0.5):
            time.sleep(0.01)
        during = small_first_model(se)
        assert se.wait_for_refit(3600)
        big_fits = [round(c[3] - c[2], 3) for c in calls if c[1] > 1000]
        return {"window": window, "algorithms": algorithms, "small_first_model_alone_s": round(alone, 3),
                "small_first_model_during_big_refit_s": round(during, 3), "big_fit_seconds": big_fits,
                "big_round_s": round(max(c[3] for c in calls if c[1] > 1000) - t_big, 3)}
    finally:
        fitter.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=6000)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--warm", type=int, default=2000, help="documents windowed before the first fit")
    ap.add_argument("--streams", default="1,2,8", help="stream counts to measure besides the single engine")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--blocking-window", type=int, default=10000,
                    help="window of the big stream in the blocking measurement (0 = skip it)")
    ap.add_argument("--blocking-algorithms", default="constrained-kmeans,seeded-kmeans")
    ap.add_argument("--tag", default="")
    _bench.add_smoke(ap)
    args = _bench.parse(ap, argv, SMOKE)
    ds = datasets.load("reuters-r8")
    variants = [0] + [int(x) for x in args.streams.split(",") if x.strip()]
    runs: dict[int, list[dict]] = {k: [] for k in variants}
    load = [os.getloadavg()[0]]
    for _ in range(args.repeats):   # variants interleaved: a busy machine's drift hits them alike
        for k in variants:
            r = measure(ds, k, args.docs, args.batch, args.warm)
            assert r["assigned"] + r["rejected"] == args.docs
            runs[k].append(r)
            print(json.dumps({"streams": k, "docs_per_s": round(r["docs_per_s"], 1)}), flush=True)
        load.append(os.getloadavg()[0])
    rows = []
    for k in variants:
        rate = statistics.median(r["docs_per_s"] for r in runs[k])
        rows.append({"variant": "engine" if k == 0 else f"streams={k}", "streams": k, "docs_per_s": round(rate, 1),
                     "runs": [round(r["docs_per_s"], 1) for r in runs[k]]})
    blocking = (measure_blocking(args.blocking_window, args.blocking_algorithms.split(","))
                if args.blocking_window else None)
    print(json.dumps({"blocking": blocking}), flush=True)
    base = rows[0]["docs_per_s"]
    for r in rows:
        r["relative"] = round(r["docs_per_s"] / base, 3)
    command = "python benchmarks/streams.py " + " ".join(argv if argv is not None else sys.argv[1:])
    out = {"command": command.strip(), "commit": _bench.commit(), "python": platform.python_version(), "machine": platform.machine(),
           "docs": args.docs, "batch": args.batch, "repeats": args.repeats, "load_average_1min": load, "rows": rows,
           "blocking": blocking}
    results = _bench.results_dir(args.smoke)
    name = "streams" + (f"_{args.tag}" if args.tag else "")
    (results / f"{name}.json").write_text(json.dumps(out, indent=2) + "\n")
    lines = [f"`{out['command']}`", "", f"R8, {args.docs} documents in batches of {args.batch}, constrained k-means, "
             f"median of {args.repeats} (variants interleaved; 1-minute load average {min(load):.1f}..{max(load):.1f} "
             "on this shared 2-core machine)", "", "| variant | docs/s | vs one engine | runs |", "|---|---|---|---|"]
    lines += [f"| {r['variant']} | {r['docs_per_s']:,.0f} | {r['relative']:.2f} | {', '.join(map(str, r['runs']))} |"
              for r in rows]
    if blocking:
        b = blocking
        lines += ["", f"Blocking: a stream's first model (400 R8 documents, 40 seeds, {', '.join(b['algorithms'])}) "
                  f"through the one fit process: {b['small_first_model_alone_s']} s alone, "
                  f"{b['small_first_model_during_big_refit_s']} s while a stream with a {b['window']:,}-document 20NG "
                  f"window refits (its fits {b['big_fit_seconds']} s, its round {b['big_round_s']} s)."]
    (results / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {results / name}.json and .md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
