"""Summarise a mutmut run: per-module counts and every surviving mutant's diff.

``make mutation`` runs mutmut (configured in ``[tool.mutmut]`` of pyproject.toml) on a
copy of the committed tree, then calls this script on that copy::

    python benchmarks/mutation_report.py /tmp/streamsemi-mutation

Writes ``benchmarks/results/mutation.json`` (counts per module and per mutated function,
survivor names) and ``benchmarks/results/mutation_survivors.md`` (the diff of each
survivor). A run restricted to some functions (``MUTANTS=...``) replaces the figures of
those functions only: the other functions of the module keep theirs from earlier runs.
Why the remaining survivors are equivalent or harmless is written by hand in
``benchmarks/results/mutation.md``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench  # noqa: E402

OUT = _bench.RESULTS

# mutmut 3 exit-code meaning (mutmut/stats.py); anything else is "suspicious"
STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", 34: "skipped",
          35: "suspicious", 36: "timeout", 37: "caught by type check", -24: "timeout", 24: "timeout",
          152: "timeout", 255: "timeout", -11: "segfault", -9: "segfault", None: "not checked"}


def collect(root: Path) -> dict[str, dict[str, str]]:
    """``{module file: {mutant name: status}}`` from mutmut's ``*.py.meta`` files."""
    out: dict[str, dict[str, str]] = {}
    for meta in sorted((root / "mutants").rglob("*.py.meta")):
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        module = str(meta.relative_to(root / "mutants"))[: -len(".meta")]
        out[module] = {name: STATUS.get(code, "suspicious") for name, code in sorted(codes.items())}
    return out


def diff(root: Path, mutmut: str, name: str) -> str:
    """The changed lines of mutant ``name`` (``mutmut show``; empty when mutmut cannot be run)."""
    try:
        shown = subprocess.run([mutmut, "show", name], cwd=root, capture_output=True, text=True, check=False)
    except OSError:
        return ""
    return "\n".join(line for line in shown.stdout.splitlines() if line[:2] in ("- ", "+ ", "@@"))


def function_of(mutant: str) -> str:
    """The mutated function of a mutant name (``module.xǁClassǁmethod__mutmut_12`` -> ``module.xǁClassǁmethod``)."""
    return mutant.rsplit("__mutmut_", 1)[0]


def _diffs(path: Path) -> dict[str, list[str]]:
    """``{survivor: lines}`` of the ``### name`` entries of an earlier survivors file."""
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in path.read_text().splitlines() if path.exists() else []:
        if line.startswith("## "):
            current = None
        elif line.startswith("### "):
            current = out.setdefault(line[4:].strip(), [])
        elif current is not None:
            current.append(line)
    return out


def _totals(functions: dict[str, dict], n_module: int) -> dict:
    counts: Counter[str] = Counter()
    for f in functions.values():
        counts.update({k: v for k, v in f.items() if isinstance(v, int) and k != "mutants"})
    checked = sum(f["mutants"] for f in functions.values())
    survivors = sorted(n for f in functions.values() for n in f["survivors"])
    return {"mutants": checked, **dict(sorted(counts.items())), "not checked": max(0, n_module - checked),
            "survived_pct": round(100 * len(survivors) / checked, 1), "survivors": survivors,
            "functions": dict(sorted(functions.items()))}


def smoke_root() -> Path:
    """A temporary directory shaped like a mutmut run: one module, one killed and one surviving mutant."""
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="streamsemi-mutation-smoke-"))
    meta = root / "mutants" / "streamsemi" / "core" / "example.py.meta"
    meta.parent.mkdir(parents=True)
    meta.write_text(json.dumps({"exit_code_by_key": {"streamsemi.core.example.x_f__mutmut_1": 1,
                                                     "streamsemi.core.example.x_f__mutmut_2": 0}}))
    return root


def main(argv: list[str] | None = None) -> int:
    global OUT
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", type=Path, nargs="?", help="directory mutmut ran in (holds mutants/)")
    ap.add_argument("--mutmut", default=str(Path(sys.executable).with_name("mutmut")))
    _bench.add_smoke(ap)
    a = ap.parse_args(argv)
    if a.smoke:  # a made-up run of two mutants, reported into a temporary directory
        a.root, OUT = a.root or smoke_root(), _bench.results_dir(True)
    elif a.root is None:
        ap.error("the directory mutmut ran in is required (or --smoke)")
    modules = collect(a.root)
    old = json.loads((OUT / "mutation.json").read_text()) if (OUT / "mutation.json").exists() else {}
    old_diffs = _diffs(OUT / "mutation_survivors.md")
    summary = dict(old)
    diffs: dict[str, list[str]] = {}
    for module, statuses in modules.items():
        checked = {n: s for n, s in statuses.items() if s != "not checked"}
        if not checked:
            continue
        per_function: dict[str, Counter[str]] = {}
        for name, status in checked.items():
            per_function.setdefault(function_of(name), Counter())[status] += 1
        functions = {f: {"mutants": sum(c.values()), **dict(sorted(c.items())),
                         "survivors": sorted(n for n in checked if function_of(n) == f and checked[n] == "survived")}
                     for f, c in per_function.items()}
        # functions this run did not mutate keep their figures from earlier runs
        functions.update({f: v for f, v in old.get(module, {}).get("functions", {}).items() if f not in functions})
        summary[module] = _totals(functions, len(statuses))
        for name in summary[module]["survivors"]:
            if name in checked:
                diffs[name] = ["```diff", diff(a.root, a.mutmut, name), "```"]
    OUT.mkdir(exist_ok=True)
    summary = dict(sorted(summary.items()))
    survivors_md = ["# Surviving mutants (generated by benchmarks/mutation_report.py)", "",
                    "Diffs of each survivor from the latest run that mutated its function (functions not "
                    "mutated in the latest run keep their survivors from an earlier one, as mutation.json "
                    "keeps their figures).", ""]
    for module, s in summary.items():
        survivors_md += [f"## {module}: {len(s['survivors'])} of {s['mutants']} survived ({s['survived_pct']}%)", ""]
        for name in s["survivors"]:
            body = (diffs.get(name) or [line for line in old_diffs.get(name, []) if line.strip()]
                    or ["(no diff kept from the run that found it: `mutmut show` on that run's copy)"])
            survivors_md += [f"### {name}", "", *body, ""]
    (OUT / "mutation.json").write_text(json.dumps(summary, indent=1) + "\n")
    (OUT / "mutation_survivors.md").write_text("\n".join(survivors_md).rstrip() + "\n")
    for module, s in summary.items():
        print(f"{module:<45} {s['mutants']:>5} mutants  {len(s['survivors']):>4} survived  ({s['survived_pct']}%)")
        for f, v in s.get("functions", {}).items():
            print(f"    {f.split('.')[-1]:<41} {v['mutants']:>5} mutants  {len(v['survivors']):>4} survived")
    print(f"wrote {OUT / 'mutation.json'} and {OUT / 'mutation_survivors.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
