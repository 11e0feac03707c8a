"""Every benchmark script still runs: ``--help``, then ``python benchmarks/X.py --smoke`` on tiny data.

The scripts are found by globbing ``benchmarks/*.py`` (``_``-prefixed helpers left out), so a new
benchmark is covered without touching this file. A smoke run must exit 0, print its figures and
the result files it wrote, and write nothing under ``benchmarks/results/``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
RESULTS = BENCHMARKS / "results"
SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_"))
#: A figure as the scripts print them (0.568, 1,818.2, 300), not part of a word or a path.
FIGURE = re.compile(r"(?<![\w/.-])\d+(?:[.,]\d+)*(?![\w/-])")
WROTE = re.compile(r"^wrote (\S+)", re.MULTILINE)


def results_listing() -> dict[str, float]:
    """Every file under benchmarks/results/ with its modification time."""
    return {str(p.relative_to(RESULTS)): p.stat().st_mtime for p in RESULTS.rglob("*") if p.is_file()}


def test_every_benchmark_script_is_found():
    assert len(SCRIPTS) >= 10 and "served_quality.py" in SCRIPTS and "throughput.py" in SCRIPTS
    assert "_bench.py" not in SCRIPTS


@pytest.mark.long
@pytest.mark.parametrize("script", SCRIPTS)
def test_benchmark_answers_help_and_runs_its_smoke_mode(script: str) -> None:
    shown = subprocess.run([sys.executable, str(BENCHMARKS / script), "--help"], cwd=ROOT, capture_output=True,
                           text=True, timeout=120, check=False)
    assert shown.returncode == 0, f"{script} --help exited {shown.returncode}: {shown.stderr[-2000:]}"
    assert "--smoke" in shown.stdout, f"{script} --help does not offer --smoke"
    before = results_listing()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(BENCHMARKS / script), "--smoke"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900, check=False)
    tail = f"\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, f"{script} --smoke exited {proc.returncode}{tail}"
    printed = WROTE.sub("", re.sub(r"\S*streamsemi-[\w-]+\S*", "", proc.stdout))  # not the paths it wrote
    assert FIGURE.search(printed), f"{script} --smoke printed no figure{tail}"
    for path in WROTE.findall(proc.stdout):
        written = Path(path)
        assert written.exists() and written.stat().st_size > 0, f"{script} says it wrote {path}{tail}"
        assert RESULTS not in written.resolve().parents, f"a smoke run wrote {path} under benchmarks/results/"
    assert results_listing() == before, f"{script} --smoke changed benchmarks/results/"

