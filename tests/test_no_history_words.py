"""Code, tests, scripts and docs say what the project does, never how it was made.

History lives in git, and a decision worth knowing is an entry in docs/decisions.md. This test
scans the tracked files of the package, the tests, the benchmark scripts, the deployment files
and the docs for numbered work sessions or issues, "last session" and the like, and names the
file and line of each. Kafka's and HTTP's sessions (``session_timeout_ms``, ``max_sessions``,
"the console's session cookie") are not history, and neither are the names of the result
records under ``benchmarks/results/`` (data, kept as they were written).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: what is scanned (``git ls-files`` pathspecs) and what is not (path prefixes): the data records, and
#: this file, whose examples are the words it looks for
SCANNED = ("streamsemi", "tests", "benchmarks/*.py", "services", "deploy", ".ci", "docs", "README.md",
           "Makefile", "pyproject.toml")
EXCLUDED = ("benchmarks/results/", "tests/test_no_history_words.py")

# a word, then its number, possibly on the next line of a comment or docstring
_NEXT = r"[ \t]*(?:\n[ \t]*(?:\#:?|//|\*)?[ \t]*)?"
HISTORY = re.compile(
    rf"\bsessions?{_NEXT}[-\#]?[ \t]*(?:<=|>=|==|<|>|=)?[ \t]*\d+"      # a numbered session, "sessions <= 15"
    rf"|\bissues?{_NEXT}\#?\d+"                                          # a numbered issue
    r"|\b(?:last|earlier|this|previous|prior|next)[ \t]+(?:session|issue)s?\b"
    r"|(?:\b|_)the[ \t_]+issue(?:'s\b|[ \t_]+asks)"                      # "the issue's figures", "..._the_issue_asks"
    r"|\btest_issues?_"
    r"|(?<![\w)\]])(?-i:\(s\d{1,3}\))"                                   # a session tag "(s37)", not a call f(s2)
    r"|\b(?:found|fixed|added|measured)[ \t]+in[ \t]+(?:round|session|issue)[ \t]+\d+",
    re.IGNORECASE)


def history_mentions(text: str) -> list[tuple[int, str]]:
    """The history words of ``text``: (line number from 1, the words on one line)."""
    return [(text.count("\n", 0, m.start()) + 1, " ".join(m.group().split())) for m in HISTORY.finditer(text)]


def scanned_files() -> list[str]:
    """The tracked files this test reads, relative to the repository root."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--", *SCANNED], cwd=ROOT, capture_output=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    return [p for p in out.decode().split("\0") if p and not p.startswith(EXCLUDED) and (ROOT / p).is_file()]


#: the words themselves, built so that this file does not say them
S, ISSUE, ISSUE_ = "sess" + "ion", "iss" + "ue", "Iss" + "ue"


@pytest.mark.parametrize(("text", "expected"), [
    (f"x = 1  # measured in {S} 35 on 2 cores\n", [(1, f"measured in {S} 35")]),
    ("a bug found in round 3 of the review\n", [(1, "found in round 3")]),
    (f"a\nb ({ISSUE} 16, docs/throughput.md)\n", [(2, f"{ISSUE} 16")]),
    ("#: centroids by class size (session\n#: 33; on whole corpora)\n", [(1, "session #: 33")]),
    (f'    """Restored from before\n    {S} 30: the loop."""\n', [(2, f"{S} 30")]),
    (f"valid for {S}s <= 15 only\n", [(1, f"{S}s <= 15")]),
    (f"{ISSUE_} #19's target and the issue's figures\n", [(1, f"{ISSUE_} #19"), (1, "the issue's")]),
    (f"as the last {S} left it; FSL's {S}-31 default (s37)\n",
     [(1, f"last {S}"), (1, f"{S}-31"), (1, "(s37)")]),
    ("def test_issue_alerts():\ndef test_panels_the_issue_asks_for():\n", [(1, "test_issue_"), (2, "_the_issue_asks")]),
    ("session_timeout_ms = 10000\nmax_sessions=10\nthe console's session cookie lasts 8 h\n", []),
    ("`benchmarks/results/served_quality_session3.json`, robustness_full_ensemble_s23.json\n", []),
    ("the issues of a consumer group; a session of 10 users; affinity_propagation(S2), f(s2)\n", []),
])
def test_history_mentions_finds_numbered_sessions_and_issues_only(text, expected):
    assert history_mentions(text) == expected


def test_the_scan_reads_the_package_tests_and_docs():
    files = scanned_files()
    for path in ("streamsemi/engine.py", "tests/conftest.py", "README.md", "pyproject.toml", "Makefile",
                 "docs/decisions.md", "benchmarks/soak.py", ".ci/run"):
        assert path in files
    assert not any(p.startswith(EXCLUDED) for p in files)


def test_no_file_says_how_the_project_was_made():
    found = []
    for path in scanned_files():
        try:
            text = (ROOT / path).read_text(encoding="utf-8")
        except UnicodeDecodeError:  # a binary file (an image) has no words
            continue
        found += [f"{path}:{line}: {words}" for line, words in history_mentions(text)]
    assert not found, ("say what the code does and why, not when it was written (history is in git, "
                       "decisions in docs/decisions.md):\n" + "\n".join(found))
