"""Regenerate ``docs/results.md``: every protocol, its algorithms against the baselines.

The committed page is written from the records it names, without running anything::

    make results        # python -m streamsemi.evaluation.results_page --from-records

:func:`build_page` reads the protocol runs saved in ``benchmarks/results/page_full/`` and the
served-quality, label-suggestion and discovery records of :data:`SERVED_QUALITY_RECORDS`,
:data:`SUGGESTION_RECORDS` and :data:`DISCOVERY_RECORDS`; every section names its record and the
commit it was made at (:func:`page_records` lists them all). ``--check`` exits 1 when
``docs/results.md`` is not what the records give.

Running the protocols (either form)::

    streamsemi evaluate --results-page docs/results.md [--quick] [--jobs 2] [--algorithm A,B]
    python -m streamsemi.evaluation.results_page [--out docs/results.md] [--quick] [--jobs 2]

Full mode uses each protocol's own settings (labels, runs, all documents) and
replays the semi-ldc datasets as streams; ``--quick`` subsamples documents and
uses fewer runs and label amounts (minutes instead of hours). The page states
the settings it was made with, and puts the papers' own figures beside ours.

Full mode takes hours, so it can be made one protocol at a time::

    streamsemi evaluate --results-page docs/results.md --records-dir benchmarks/results/page_full --protocol cle

runs ``cle`` only, saves its records with their commit, date, settings and wall time in
``DIR/cle.json``, and writes the page from every protocol saved in ``DIR`` in the same
mode (each section names the commit that made it; a protocol not run yet says so). With
``DIR = benchmarks/results/page_full``, ``make results`` then writes the committed page.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import platform
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from streamsemi.evaluation import report
from streamsemi.evaluation.driver import evaluate, resolve_methods
from streamsemi.evaluation.protocols import PROTOCOLS
from streamsemi.evaluation.stream import StreamSettings

#: Algorithms run under each protocol by default (besides the protocol's baselines).
PAGE_ALGORITHMS: dict[str, tuple[str, ...]] = {
    "semi-ldc": ("semi-ldc", "cle", "fsl-ck"),
    "cle": ("cle",),
    "d-lda": ("d-lda",),
    "fsl": ("fsl-sk", "fsl-ck", "fsl-ap", "fsl-sap"),
    "pseudo-lsc": ("pseudo-lsc",),
    "robustness": PROTOCOLS["robustness"].algorithms,
}


def page_settings(quick: bool) -> dict[str, dict[str, Any]]:
    """Per-protocol settings of the page: ``datasets, labels, runs, max_docs, stream``.

    ``stream`` is ``(datasets, labels)`` replayed as streams, or None.
    """
    if not quick:
        out = {p: {"datasets": None, "labels": None, "runs": None, "max_docs": None, "stream": None}
               for p in PROTOCOLS}
        out["semi-ldc"]["stream"] = (["20ng-comp5", "20ng-talk4", "reuters-top10"], [1, 5])
        return out
    return {
        "semi-ldc": {"datasets": None, "labels": [1, 5], "runs": 2, "max_docs": 1500,
                     "stream": (["20ng-comp5", "reuters-top10"], [5])},
        "cle": {"datasets": ["reuters-top30-r2", "reuters-top30-r4", "reuters-top30-r6"],
                "labels": [3, 9], "runs": 3, "max_docs": 2000, "stream": None},
        "d-lda": {"datasets": ["20ng-easy1", "20ng-difficult1"], "labels": [10, 40], "runs": 1,
                  "max_docs": 800, "stream": None},
        "fsl": {"datasets": None, "labels": [20, 100, 400], "runs": 2, "max_docs": None, "stream": None},
        "pseudo-lsc": {"datasets": None, "labels": None, "runs": 1, "max_docs": 2000, "stream": None},
        "robustness": {"datasets": None, "labels": None, "runs": 1, "max_docs": 1200, "stream": None},
    }


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=False, cwd=Path(__file__).resolve().parent).stdout.strip() or "?"
    except OSError:
        return "?"


def _describe(settings: dict[str, Any], protocol: str) -> str:
    p = PROTOCOLS[protocol]
    labels = settings["labels"] or list(p.labels)
    unit = "%" if p.label_unit == "percent" else " labeled"
    parts = [f"datasets: {', '.join(settings['datasets'] or p.datasets)}",
             f"labels: {', '.join(f'{v:g}{unit}' for v in labels)}",
             f"runs: {settings['runs'] or p.runs}",
             f"documents: {'all' if settings['max_docs'] is None else 'at most ' + str(settings['max_docs']) + ' per dataset (stratified subsample)'}"]
    if settings["stream"]:
        ds, lab = settings["stream"]
        parts.append(f"stream replay: {', '.join(ds)} at {', '.join(f'{v:g}%' for v in lab)}")
    return "; ".join(parts)


def _mode(quick: bool) -> str:
    return "quick" if quick else "full"


def save_protocol_run(records_dir: str | Path, run: dict[str, Any]) -> Path:
    """Write one protocol's run (:func:`generate`'s ``runs`` entry) to ``records_dir/<protocol>.json``."""
    path = Path(records_dir) / f"{run['protocol']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(run, indent=1) + "\n", encoding="utf-8")
    return path


def load_protocol_runs(records_dir: str | Path, quick: bool) -> dict[str, dict[str, Any]]:
    """The saved runs in ``records_dir`` made in the mode of ``quick``, by protocol (unreadable files,
    other modes and unknown protocols are left out)."""
    out: dict[str, dict[str, Any]] = {}
    for name in PROTOCOLS:
        path = Path(records_dir) / f"{name}.json"
        try:
            run = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if (isinstance(run, dict) and run.get("protocol") == name and run.get("mode") == _mode(quick)
                and isinstance(run.get("records"), list)):
            out[name] = run
    return out


def generate(out_path: str | Path, *, quick: bool = False, protocols: Sequence[str] | None = None,
             algorithms: Sequence[str] | None = None, jobs: int = 1, seed: int = 0,
             progress: bool = True, json_path: str | Path | None = None,
             settings_override: dict[str, dict[str, Any]] | None = None,
             records_dir: str | Path | None = None) -> list[dict[str, Any]]:
    """Run the protocols and write the markdown page; return all records.

    Parameters
    ----------
    out_path : path
        Markdown file to write.
    quick : bool
        Reduced settings (:func:`page_settings`).
    protocols : sequence of str, optional
        Subset of protocols (default: all five).
    algorithms : sequence of str, optional
        Algorithms for every protocol (default: :data:`PAGE_ALGORITHMS`).
    jobs : int
        Worker processes.
    json_path : path, optional
        Also write the records as JSON.
    settings_override : dict, optional
        Per-protocol settings replacing :func:`page_settings` entries (tests).
    records_dir : path, optional
        Save each protocol run here (:func:`save_protocol_run`) and write the page from every
        protocol saved here in the same mode, not only those run now (:func:`load_protocol_runs`).
        When it is a root's ``benchmarks/results/page_full`` (the page's own records) and the mode is
        full, the whole page is written from that root's records (:func:`build_page`).
    """
    settings = page_settings(quick)
    for k, v in (settings_override or {}).items():
        settings[k] = {**settings.get(k, {}), **v}
    names = list(protocols or PROTOCOLS)
    records: list[dict[str, Any]] = []
    runs: dict[str, dict[str, Any]] = {}
    for name in names:
        p = PROTOCOLS[name]
        s = settings[name]
        t0, commit = time.perf_counter(), _git_commit()  # the code the run starts with
        methods = resolve_methods(p, algorithms or PAGE_ALGORITHMS[name])
        wanted = list(algorithms or PAGE_ALGORITHMS[name])
        missing = [a for a in wanted if a not in methods]
        recs = evaluate(p, methods=methods, datasets=s["datasets"], labels=s["labels"],
                        runs=s["runs"], jobs=jobs, max_docs=s["max_docs"], seed=seed, progress=progress)
        if s.get("stream"):
            ds, lab = s["stream"]
            recs += evaluate(p, methods=methods, datasets=ds, labels=lab, runs=s["runs"],
                             batch=False, stream=True, jobs=jobs, max_docs=s["max_docs"],
                             seed=seed, stream_settings=StreamSettings(), progress=progress)
        records += recs
        runs[name] = {"protocol": name, "mode": _mode(quick), "settings": _describe(s, name),
                      "commit": commit, "generated": _now(), "wall_s": time.perf_counter() - t0,
                      "notes": [f"{name}: not available: {', '.join(missing)}"] if missing else [],
                      "records": recs}
        if records_dir is not None:
            save_protocol_run(records_dir, runs[name])
    if json_path:
        report.write_json(records, json_path)
    if records_dir is not None:
        root = page_root(records_dir)
        if root is not None and not quick:  # the page's own records: the whole page, as make results writes it
            Path(out_path).write_text(build_page(root), encoding="utf-8")
            return records
        runs = {**load_protocol_runs(records_dir, quick), **runs}
        names = [n for n in PROTOCOLS if n in runs or n in PAGE_ALGORITHMS]
    page = render(runs, names, quick, per_protocol_commit=records_dir is not None)
    Path(out_path).write_text(page + hand_written_sections(out_path, page), encoding="utf-8")
    return records


def page_root(records_dir: str | Path) -> Path | None:
    """The root whose ``benchmarks/results/page_full`` is ``records_dir`` (the page's own records), or None."""
    path = Path(records_dir).resolve()
    root = path.parents[2] if len(path.parents) > 2 else None
    return root if root is not None and (root / PAGE_RECORDS).resolve() == path else None


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def hand_written_sections(path: str | Path, page: str) -> str:
    """The ``## `` sections of the existing file at ``path`` that ``page`` does not have (the
    hand-written ones: robustness, served quality, discovery, ...), kept in their order."""
    try:
        old = Path(path).read_text(encoding="utf-8")
    except OSError:
        return ""
    generated = {line for line in page.splitlines() if line.startswith("## ")}
    parts = re.split(r"(?m)^(?=## )", old)[1:]
    kept = [part.rstrip() + "\n" for part in parts if part.splitlines()[0] not in generated]
    return "".join("\n" + part for part in kept)


def render(runs: dict[str, dict[str, Any]], protocols: Sequence[str], quick: bool, *,
           per_protocol_commit: bool = False, from_records: bool = False) -> str:
    """The markdown page of the protocol ``runs`` (:func:`generate`), sections in the order of
    ``protocols``; a protocol without a run says it has not been run in this mode yet.

    ``from_records``: the header of the committed page (:func:`build_page`), which names the records
    and no date or commit of its own.
    """
    cmd = "streamsemi evaluate --results-page docs/results.md" + (" --quick" if quick else "")
    if per_protocol_commit:
        cmd += " --records-dir DIR --protocol NAME"
    if from_records:
        made = [f"Generated by `make results` from the records under `benchmarks/results/` that each section "
                f"names, with the commit each was made at (a protocol's run: `{cmd}` with "
                f"`DIR = {PAGE_RECORDS}`; see [evaluation.md](evaluation.md) for the protocols, metrics and "
                "baselines). Do not edit by hand: a test checks that this page is what the records give.", "",
                "- mode: **full**; each protocol's section names the commit and date of its own run"]
    else:
        made = [f"Generated by `{cmd}` (see [evaluation.md](evaluation.md) for the protocols, metrics and "
                "baselines). Do not edit by hand: regenerate it whenever an algorithm lands.", "",
                f"- mode: **{'quick (reduced settings, indicative only)' if quick else 'full'}**",
                f"- generated: {_now()}, commit {_git_commit()}, Python {platform.python_version()}, "
                f"{platform.machine()}" + ("; each protocol's section names the commit and date of its own run "
                                           "(one protocol at a time, `--records-dir`)" if per_protocol_commit else "")]
    lines = [
        "# Results",
        "",
        *made,
        "- every score is computed on the documents that are NOT seeds; mean ± std (ddof=0) over runs",
        "- `fit s`: mean seconds of one fit (batch) or of the whole replay including every refit "
        "(stream)",
        "- *italic rows*: the papers' own figures, from their tables (different preprocessing, "
        "splits and implementations: a reference, not a like-for-like comparison)",
        "- stream rows: `[stream-prequential]` each document scored by the model that existed when it "
        "arrived; `[stream-final]` the model at the end of the stream on every document",
        "",
    ]
    for name in protocols:
        p = PROTOCOLS[name]
        lines += [f"## {name}", "", f"{p.paper}. {p.description}", ""]
        run = runs.get(name)
        if run is None:
            lines += [f"(not run in {_mode(quick)} mode yet: `streamsemi evaluate --results-page docs/results.md"
                      f"{' --quick' if quick else ''} --records-dir DIR --protocol {name}`)", ""]
            continue
        made = f" Commit {run['commit']}, {run['generated']}." if per_protocol_commit else ""
        lines += [f"Settings: {run['settings']}. Wall time: {run['wall_s']:.0f} s.{made}", ""]
        notes = run.get("notes", [])  # in the section of the protocol they are about
        lines += [f"> {n}" for n in notes] + ([""] if notes else [])
        tables = report.markdown_tables(run["records"], name)
        lines += tables if tables else ["(no results)", ""]
    return "\n".join(lines).rstrip() + "\n"


# ----------------------------------------------------------------------------- the page from its records

#: The repository root (``docs/`` and ``benchmarks/results/`` are under it).
ROOT = Path(__file__).resolve().parents[2]
#: The protocol runs of the page (:func:`save_protocol_run`, full mode).
PAGE_RECORDS = "benchmarks/results/page_full"
#: What the worker serves: ``(record, what was run)``; records of ``benchmarks/served_quality.py served``.
SERVED_QUALITY_RECORDS: tuple[tuple[str, str], ...] = (
    ("benchmarks/results/served_quality_s37_final.json",
     "The worker's defaults (constrained k-means with the daemon's parameters), R8 and 8,000 20NG documents"),
    ("benchmarks/results/served_quality_s21_six.json",
     "Six algorithms in one worker (`--algorithms constrained-kmeans,semi-ldc,cle,d-lda,fsl-ck,pseudo-lsc`), "
     "before constrained k-means and FSL-CK got centroids by class size"),
)
#: Label efficiency of the suggestions: records of ``benchmarks/active_learning.py curves``.
SUGGESTION_RECORDS: tuple[str, ...] = ("benchmarks/results/active_learning.json",
                                       "benchmarks/results/active_learning_seeds30.json")
#: Discovered clusters: records of ``streamsemi evaluate --protocol discovery``.
DISCOVERY_RECORDS: tuple[str, ...] = ("benchmarks/results/discovery_r8.json",
                                      "benchmarks/results/discovery_20ng_full.json")


def page_records(root: str | Path = ROOT) -> list[str]:
    """Every record :func:`build_page` reads, as paths relative to ``root`` (the protocol runs first)."""
    runs = sorted(f"{PAGE_RECORDS}/{name}.json" for name in PROTOCOLS
                  if (Path(root) / PAGE_RECORDS / f"{name}.json").exists())
    return [*runs, *(path for path, _ in SERVED_QUALITY_RECORDS), *SUGGESTION_RECORDS, *DISCOVERY_RECORDS]


def record_commit(record: dict[str, Any]) -> str:
    """The commit a record states (``commit``, or ``environment.commit``), short form; ``"?"`` if none."""
    commit = record.get("commit") or (record.get("environment") or {}).get("commit") or "?"
    return str(commit)[:7]


def _load(root: Path, path: str) -> dict[str, Any]:
    return json.loads((root / path).read_text(encoding="utf-8"))


def _f(value: Any, digits: int = 3) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _pct(value: Any) -> str:
    return "not reached" if value is None else f"{100 * value:.2f}%"


def served_quality_section(root: Path) -> list[str]:
    """``## Served quality``: one table per record of :data:`SERVED_QUALITY_RECORDS`."""
    lines = ["## Served quality", "",
             "What a real worker serves, measured by `benchmarks/served_quality.py served`: the embedded broker "
             "and `streamsemi run` as a separate process, each corpus replayed in a seeded random order with 5% "
             "stratified seeds sent on the control topic just before their documents. `first` is the macro-F1 "
             "of the first assignment of every non-seed document, `latest` of its last revision, `batch` of the "
             "same algorithm fitted once on the whole stream; River's MultinomialNB scored prequentially on the "
             "same stream is the streaming reference. How first-label latency trades against first-label "
             "quality: [served-quality.md](served-quality.md).", ""]
    for path, title in SERVED_QUALITY_RECORDS:
        rec = _load(root, path)
        date = (rec.get("environment") or {}).get("date", "")
        lines += [f"**{title}**: `{path}`, commit {record_commit(rec)}, {date}.", "",
                  "| corpus | documents | rate | algorithm | first | latest | batch | River MNB | "
                  "p99 to first output (s) | assigned |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for run in rec["runs"]:
            rate = "full speed" if not run["rate"] else f"{run['rate']:g} docs/s"
            for name, a in run["algorithms"].items():
                lines.append(f"| {run['corpus']} | {run['stream']['documents']:,} | {rate} | {name} | "
                             f"{_f(a['first'])} | {_f(a['latest'])} | {_f(a['batch'])} | "
                             f"{_f(run['river_mnb_prequential'])} | {_f(a['latency_s']['p99_all'], 1)} | "
                             f"{a['documents_assigned']:,}/{a['documents_expected']:,} |")
        lines.append("")
    return lines


def suggestions_section(root: Path) -> list[str]:
    """``## Label suggestions``: the label-efficiency targets of every record of :data:`SUGGESTION_RECORDS`."""
    first = _load(root, SUGGESTION_RECORDS[0])["settings"]
    at = f"{100 * first['target_fraction']:g}%"
    lines = ["## Label suggestions", "",
             "Label efficiency of the suggestion queue, measured by `benchmarks/active_learning.py curves` in "
             f"process through the engine ({first['algorithms']}, the whole corpus in the window): a simulated "
             f"annotator (the corpus' labels) starts from {first['initial']} stratified seeds per class and after "
             f"every refit labels the top {first['k']} suggestions (`suggested`) or {first['k']} random unlabelled "
             "documents (`random`); macro-F1 of the non-seed documents, mean over the seed draws. The reference "
             f"is one fit with {100 * first['reference']:g}% uniformly random seeds; the target is `suggested` at "
             f"{at} of the documents labelled reaching it. How the queue is ranked: "
             "[suggestions.md](suggestions.md).", "",
             f"| seeds | corpus | documents | {100 * first['reference']:g}% random seeds | suggested at {at} | "
             f"random at {at} | suggested reaches the reference at | random reaches it at | target | record (commit) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for path in SUGGESTION_RECORDS:
        rec = _load(root, path)
        for corpus, res in rec["corpora"].items():
            t = res["target"]
            lines.append(f"| {rec['settings']['seeds']} | {corpus} | {res['documents']:,} | "
                         f"{_f(t['reference_macro_f1'])} | {_f(t['suggested_at_2pct'])} | {_f(t['random_at_2pct'])} | "
                         f"{_pct(t['suggested_reaches_reference_at'])} | {_pct(t['random_reaches_reference_at'])} | "
                         f"{'met' if t['met'] else 'missed'} | `{path}` ({record_commit(rec)}) |")
    return [*lines, ""]


def discovery_section(root: Path) -> list[str]:
    """``## Discovery``: discovery F1 and known-class macro-F1 of every record of :data:`DISCOVERY_RECORDS`."""
    lines = ["## Discovery", "",
             "`streamsemi evaluate --protocol discovery` ([evaluation.md](evaluation.md), method and limits: "
             "[algorithms/discovery.md](algorithms/discovery.md)): each run draws which classes get no seed, 5% "
             "stratified seeds for the others; every algorithm fitted as `n0` (`n_new_clusters=0`), `legacy` and "
             "`calibrated` (given the true number of unseeded classes), `auto` and `auto-split` (`auto` with "
             "`discovery_split=True`). Discovery F1: for each unseeded class the best F1 of any new cluster, mean "
             "over the unseeded classes; known macro-F1: over the seeded classes; both on the non-seed "
             "documents, mean ± std over runs.", ""]
    for path in DISCOVERY_RECORDS:
        rec = _load(root, path)
        st = rec["settings"]
        unseeded = ", ".join(f"{d}: {n}" for d, n in st["unseeded"].items())
        lines += [f"**{', '.join(st['datasets'])}** ({st['runs']} runs, unseeded classes {unseeded}): `{path}`, "
                  f"commit {record_commit(rec)}.", "",
                  "| algorithm | variant | discovery F1 | known macro-F1 | new clusters | fit s |",
                  "|---|---|---|---|---|---|"]
        for row in rec["summary"]:
            lines.append(f"| {row['algorithm']} | {row['variant']} | {row['discovery_f1']:.3f} ± "
                         f"{row['discovery_f1_std']:.3f} | {row['known_macro_f1']:.3f} ± {row['known_macro_f1_std']:.3f} "
                         f"| {row['n_new_clusters']:.1f} | {row['fit_seconds']:.1f} |")
        lines.append("")
    return lines


def build_page(root: str | Path = ROOT) -> str:
    """The whole ``docs/results.md`` from the records it names (:func:`page_records`); runs nothing.

    The same records always give the same page: no date or commit of the machine that writes it,
    only those the records state.
    """
    root = Path(root)
    runs = load_protocol_runs(root / PAGE_RECORDS, quick=False)
    page = render(runs, list(PROTOCOLS), quick=False, per_protocol_commit=True, from_records=True)
    extra = [*served_quality_section(root), *suggestions_section(root), *discovery_section(root)]
    return page + "\n" + "\n".join(extra).rstrip() + "\n"


def check_page(path: str | Path, root: str | Path = ROOT) -> bool:
    """Whether the file at ``path`` is what :func:`build_page` gives."""
    try:
        return Path(path).read_text(encoding="utf-8") == build_page(root)
    except OSError:
        return False



def generate_from_args(args: argparse.Namespace) -> int:
    """Entry from ``streamsemi evaluate --results-page FILE``."""
    generate(args.results_page, quick=bool(getattr(args, "quick", False)),
             protocols=[args.protocol] if getattr(args, "protocol", None) else None,
             algorithms=args.algorithm, jobs=args.jobs, seed=args.seed,
             progress=not args.no_progress, json_path=args.json,
             records_dir=getattr(args, "records_dir", None))
    print(f"wrote {args.results_page}", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m streamsemi.evaluation.results_page``."""
    parser = argparse.ArgumentParser(prog="python -m streamsemi.evaluation.results_page",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="docs/results.md")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--protocol", action="append", choices=sorted(PROTOCOLS))
    parser.add_argument("--algorithm", type=lambda v: [x for x in v.split(",") if x], default=None)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    parser.add_argument("--records-dir", default=None)
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--from-records", action="store_true",
                        help="write the page from the records it names (build_page), running nothing")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when --out is not what the records give (runs nothing)")
    a = parser.parse_args(argv)
    if a.check:
        if check_page(a.out):
            return 0
        print(f"{a.out} is not what its records give: run `make results`", file=sys.stderr)
        return 1
    if a.from_records:
        Path(a.out).write_text(build_page(), encoding="utf-8")
        print(f"wrote {a.out} from {len(page_records())} records", file=sys.stderr)
        return 0
    generate(a.out, quick=a.quick, protocols=a.protocol, algorithms=a.algorithm, jobs=a.jobs,
             seed=a.seed, progress=not a.no_progress, json_path=a.json, records_dir=a.records_dir)
    print(f"wrote {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
