"""The evaluation driver: run a protocol for some methods and aggregate the records.

Used by the ``streamsemi evaluate`` command (:mod:`streamsemi.evaluation.command`),
the results page (:mod:`streamsemi.evaluation.results_page`) and the benchmarks.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

from streamsemi.evaluation.baselines import method_available
from streamsemi.evaluation.protocols import Protocol, prepare
from streamsemi.evaluation.runner import aggregate, failures, run_batch
from streamsemi.evaluation.stream import StreamSettings, run_stream_job, split_mode, stream_methods


def resolve_methods(protocol: Protocol, algorithms: Sequence[str] | None, *, baselines: bool = True,
                    out: TextIO | None = None) -> list[str]:
    """Available requested algorithms followed by the protocol's baselines.

    Parameters
    ----------
    protocol : Protocol
        Supplies the default algorithms (when ``algorithms`` is empty: ``protocol.algorithms``,
        else ``protocol.default_algorithm``) and the baselines.
    algorithms : sequence of str or None
        Registry names requested.
    baselines : bool
        Append the protocol's baselines (those not already requested).
    out : text stream, optional
        Where to print one ``algorithm 'X' is not available: ...`` line per name
        that cannot be loaded (default: standard error).

    Returns
    -------
    list of str
        Method names without duplicates, requested ones first.
    """
    out = out or sys.stderr
    names = list(algorithms or protocol.algorithms or [protocol.default_algorithm])
    methods: list[str] = []
    for name in names:
        ok, why = method_available(name)
        if ok:
            methods.append(name)
        else:
            print(f"algorithm {name!r} is not available: {why}", file=out)
    if baselines:
        methods += [b for b in protocol.baselines if b not in methods]
    return list(dict.fromkeys(methods))


def evaluate(protocol: Protocol, *, methods: Sequence[str], datasets: Sequence[str] | None = None,
             labels: Sequence[float] | None = None, runs: int | None = None, batch: bool = True,
             stream: bool = False, jobs: int = 1, threads: int = 1, max_docs: int | None = None,
             seed: int = 0, stream_settings: StreamSettings | None = None, progress: bool = True,
             out: TextIO | None = None) -> list[dict[str, Any]]:
    """Run ``protocol`` for ``methods``; return the aggregated records (batch, then stream).

    Parameters
    ----------
    protocol : Protocol
        The paper protocol.
    methods : sequence of str
        Algorithms and baselines to run (see :func:`resolve_methods`).
    datasets, labels, runs : optional
        Override the protocol's datasets, label amounts and runs per amount.
    batch : bool
        Fit each draw once on all its documents (the papers' setting).
    stream : bool
        Also replay each draw as a stream through the engine; ``batch=False`` with
        ``stream=True`` runs only the stream replays.
    jobs, threads : int
        Worker processes, and BLAS/OpenMP threads per run.
    max_docs : int, optional
        Stratified subsample of every dataset (quick runs).
    seed : int
        Seed of the draws and subsamples.
    stream_settings : StreamSettings, optional
        Engine settings of the stream replays.
    progress : bool
        Show a progress bar.
    out : text stream, optional
        Where the summary and failure lines go (default: standard error).

    Returns
    -------
    list of dict
        One record per (dataset, method, label amount, metric, mode).
    """
    out = out or sys.stderr
    datasets = list(datasets or protocol.datasets)
    labels = list(labels or protocol.labels)
    runs = int(runs or protocol.runs)
    t0 = time.perf_counter()
    data = prepare(datasets, max_docs=max_docs, seed=seed)
    print(f"{protocol.name}: {', '.join(f'{d} ({len(v)} docs)' for d, v in data.items())} "
          f"vectorised in {time.perf_counter() - t0:.1f}s; methods: {', '.join(methods)}; "
          f"labels {', '.join(f'{v:g}' for v in labels)}"
          f"{'%' if protocol.label_unit == 'percent' else ' labeled docs'}; {runs} run(s)", file=out)
    records: list[dict[str, Any]] = []
    if batch:
        outcomes = run_batch(protocol, data, methods, labels, runs, jobs=jobs, seed=seed,
                             progress=progress, extra_state={"threads": threads})
        for line in failures(outcomes):
            print(line, file=out)
        records = aggregate(protocol, outcomes, "batch")
    if stream:
        smethods = stream_methods(methods)
        if protocol.name == "pseudo-lsc":
            smethods = [m for m in smethods if m != "river-mnb"]
            print("stream mode: the River baseline is single-label; not run for pseudo-lsc", file=out)
        souts = run_batch(protocol, data, smethods, labels, runs, jobs=jobs, seed=seed,
                          progress=progress, job_fn=run_stream_job, desc="stream",
                          extra_state={"stream_settings": stream_settings or StreamSettings(),
                                       "threads": threads})
        for line in failures(souts):
            print(f"stream: {line}", file=out)
        for mode, group in split_mode(souts).items():
            records += aggregate(protocol, group, mode)
    return records
