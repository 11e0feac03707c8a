"""``streamsemi evaluate``: argument parsing; the driver is :mod:`streamsemi.evaluation.driver`.

Usage::

    streamsemi evaluate --protocol P [--algorithm A,B,...] [--datasets D,...] [--labels 1,5]
                        [--runs R] [--stream] [--json FILE] [--plot FILE] [--jobs J]
                        [--max-docs N] [--seed S] [--quick]
    streamsemi evaluate --results-page docs/results.md [--quick]

See ``docs/evaluation.md``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from streamsemi.evaluation import report, results_page
from streamsemi.evaluation.driver import evaluate, resolve_methods
from streamsemi.evaluation.protocols import DATASETS, PROTOCOLS
from streamsemi.evaluation.stream import StreamSettings

#: ``--quick`` with ``--protocol``: documents per dataset (stratified subsample) and runs.
QUICK_MAX_DOCS = 1200
QUICK_RUNS = 1


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _floats(value: str) -> list[float]:
    try:
        return [float(v) for v in _csv(value)]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {value!r}") from exc


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Add the ``evaluate`` options to ``parser``."""
    parser.add_argument("--protocol", choices=sorted([*PROTOCOLS, "discovery"]),
                        help="the paper protocol to run (required unless --results-page); discovery: "
                             "unseeded classes found as new clusters (streamsemi/evaluation/discovery.py)")
    parser.add_argument("--algorithm", type=_csv, default=None,
                        help="algorithms by registry name, comma-separated (default: the protocol's "
                             "own algorithm); the protocol's baselines always run too")
    parser.add_argument("--datasets", type=_csv, default=None,
                        help=f"dataset ids (default: the protocol's); known: {', '.join(DATASETS)}")
    parser.add_argument("--labels", type=_floats, default=None,
                        help="label amounts: percent of the documents (1,5 = 1%% and 5%%); for the "
                             "fsl protocol, numbers of labeled documents")
    parser.add_argument("--runs", type=int, default=None, help="runs (seed draws) per label amount")
    parser.add_argument("--stream", action="store_true",
                        help="also replay each draw as a stream through the engine (prequential "
                             "and end-of-stream figures, River MultinomialNB baseline)")
    parser.add_argument("--json", metavar="FILE", help="write the result records as JSON")
    parser.add_argument("--plot", metavar="FILE", help="write metric vs label fraction as PNG")
    parser.add_argument("--jobs", type=int, default=1, help="parallel worker processes")
    parser.add_argument("--threads", type=int, default=1,
                        help="BLAS/OpenMP threads per run (default 1: no oversubscription)")
    parser.add_argument("--max-docs", type=int, default=None,
                        help="subsample every dataset to at most N documents (stratified): quick runs")
    parser.add_argument("--seed", type=int, default=0, help="seed of the draws and subsamples")
    parser.add_argument("--no-baselines", action="store_true",
                        help="run only the requested algorithms (default: baselines always run)")
    parser.add_argument("--refit-every", type=int, default=500,
                        help="stream mode: refit after this many documents")
    parser.add_argument("--window", type=int, default=10000, help="stream mode: window size (documents)")
    parser.add_argument("--stream-batch", type=int, default=20,
                        help="stream mode: documents per Engine.process call")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--results-page", metavar="FILE",
                        help="regenerate the results page (every protocol, every available "
                             "algorithm, against the baselines) into FILE")
    parser.add_argument("--records-dir", metavar="DIR", default=None,
                        help="with --results-page: save each protocol run in DIR/<protocol>.json and write "
                             "the page from every protocol saved there in the same mode (full mode one "
                             "protocol at a time: add --protocol NAME)")
    parser.add_argument("--quick", action="store_true",
                        help="with --results-page: reduced settings (subsampled documents, fewer "
                             f"runs and label amounts); with --protocol: 1 run and at most "
                             f"{QUICK_MAX_DOCS} documents per dataset unless --runs/--max-docs say "
                             "otherwise")


def run(args: argparse.Namespace) -> int:
    """Execute ``streamsemi evaluate``; returns the exit status."""
    if getattr(args, "results_page", None):
        return results_page.generate_from_args(args)
    if not args.protocol:
        print("streamsemi evaluate: --protocol is required (or --results-page FILE)", file=sys.stderr)
        return 2
    if args.protocol == "discovery":
        from streamsemi.evaluation import discovery

        return discovery.run_from_args(args)
    protocol = PROTOCOLS[args.protocol]
    if args.datasets:
        unknown = [d for d in args.datasets if d not in DATASETS]
        if unknown:
            print(f"unknown dataset id(s): {', '.join(unknown)}; known: {', '.join(DATASETS)}",
                  file=sys.stderr)
            return 2
        wrong = [d for d in args.datasets if protocol.name != "robustness"
                 and (DATASETS[d].kind == "multi") != (protocol.name == "pseudo-lsc")]
        if wrong:
            print(f"dataset(s) {', '.join(wrong)} do not fit protocol {protocol.name} "
                  f"(multi-label datasets go with pseudo-lsc only)", file=sys.stderr)
            return 2
    if args.runs is not None and args.runs < 1:
        print(f"--runs must be >= 1, got {args.runs}", file=sys.stderr)
        return 2
    methods = resolve_methods(protocol, args.algorithm, baselines=not args.no_baselines)
    if not methods:
        print("nothing to run: no requested algorithm is available and --no-baselines was given",
              file=sys.stderr)
        return 1
    if args.quick:
        args.runs = args.runs or QUICK_RUNS
        args.max_docs = args.max_docs or QUICK_MAX_DOCS
    settings = StreamSettings(batch_size=args.stream_batch, refit_every_docs=args.refit_every,
                              window_max_docs=args.window)
    records = evaluate(protocol, methods=methods, datasets=args.datasets, labels=args.labels,
                       runs=args.runs, stream=args.stream, jobs=args.jobs, threads=args.threads,
                       max_docs=args.max_docs, seed=args.seed, stream_settings=settings,
                       progress=not args.no_progress)
    print(report.format_table(records))
    if args.json:
        report.write_json(records, args.json)
        print(f"wrote {len(records)} records to {args.json}", file=sys.stderr)
    if args.plot:
        if records:
            report.plot(records, args.plot)
            print(f"wrote plot {args.plot}", file=sys.stderr)
        else:
            print("no results to plot", file=sys.stderr)
    return 0 if records else 1


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m streamsemi.evaluation.command``: the same as ``streamsemi evaluate``."""
    parser = argparse.ArgumentParser(prog="streamsemi evaluate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    configure_parser(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
