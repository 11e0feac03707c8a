"""What every maintained benchmark shares: the ``--smoke`` mode, where results go, the commit measured.

Not a benchmark itself (the leading underscore keeps it out of ``tests/test_benchmarks_smoke.py``'s glob).

``--smoke`` runs a benchmark on tiny data (a few hundred documents, one repeat) so that a test can
check in seconds that it still runs and prints its figures; its result files go to a fresh temporary
directory, never under ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
SMOKE_HELP = ("run on tiny data in seconds (a check that the benchmark works, not a measurement); "
              "result files go to a temporary directory, not benchmarks/results/")


def add_smoke(parser: argparse.ArgumentParser) -> None:
    """Add the ``--smoke`` flag to ``parser``."""
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None, smoke_preset: Sequence[str]
          ) -> argparse.Namespace:
    """Parse ``argv``; with ``--smoke``, parse it again after ``smoke_preset`` (flags given win).

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The benchmark's parser (with :func:`add_smoke` applied).
    argv : sequence of str, optional
        The arguments (default: ``sys.argv[1:]``).
    smoke_preset : sequence of str
        Options that make the run tiny, e.g. ``["--docs", "200"]``; put before ``argv`` so that
        an option given on the command line overrides its preset value.
    """
    import sys

    given = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(given)
    if getattr(args, "smoke", False):
        args = parser.parse_args([*smoke_preset, *given])
    return args


def results_dir(smoke: bool) -> Path:
    """``benchmarks/results/`` (created if missing), or a fresh temporary directory for a smoke run."""
    if smoke:
        return Path(tempfile.mkdtemp(prefix="streamsemi-bench-smoke-"))
    RESULTS.mkdir(parents=True, exist_ok=True)
    return RESULTS


def commit() -> str:
    """The short commit of the checkout the benchmark runs in (``"?"`` outside a git tree)."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             check=False, cwd=Path(__file__).resolve().parent).stdout.strip()
    except OSError:
        return "?"
    return out or "?"
