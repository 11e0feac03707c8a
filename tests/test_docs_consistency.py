"""The documentation says what the code and the records say.

* ``docs/results.md`` is exactly what :func:`streamsemi.evaluation.results_page.build_page` writes from
  the records it names, and each of those records states its commit;
* every figure the README quotes equals the one in the record it cites (parsed from the record);
* ``docs/messages.md`` and ``docs/metrics.md`` list every dead-letter reason of the code's own list,
  :data:`streamsemi.core.messages.REASONS`, which holds every reason the code gives.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from streamsemi.core.messages import REASONS
from streamsemi.evaluation import results_page

ROOT = Path(__file__).resolve().parents[1]


def _read(path: str) -> str:
    return (ROOT / path).read_text(encoding="utf-8")


def _record(path: str) -> dict[str, Any]:
    return json.loads(_read(path))


# ----------------------------------------------------------------------------- docs/results.md

def test_results_page_is_what_its_records_give():
    page = results_page.build_page(ROOT)
    assert _read("docs/results.md") == page, "docs/results.md is not what its records give: run `make results`"


def test_results_page_names_every_record_it_reads_with_its_commit():
    page = _read("docs/results.md")
    records = results_page.page_records(ROOT)
    assert len(records) >= 10
    for path in records:
        record = _record(path)
        commit = results_page.record_commit(record)
        assert re.fullmatch(r"[0-9a-f]{7}", commit), f"{path} states no commit"
        assert commit in page, f"docs/results.md does not name the commit {commit} of {path}"
        if not path.startswith(results_page.PAGE_RECORDS):
            assert f"`{path}`" in page, f"docs/results.md does not name {path}"


def test_results_page_changes_when_a_record_does(tmp_path):
    """The page is computed from the records, not copied: a changed figure in a record changes it."""
    for path in results_page.page_records(ROOT):
        target = tmp_path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(_read(path), encoding="utf-8")
    path = results_page.SERVED_QUALITY_RECORDS[0][0]
    record = _record(path)
    record["runs"][0]["algorithms"]["constrained-kmeans"]["first"] = 0.1234
    (tmp_path / path).write_text(json.dumps(record), encoding="utf-8")
    page = results_page.build_page(tmp_path)
    assert page != results_page.build_page(ROOT)
    assert "| 0.123 |" in page


def test_running_a_protocol_into_the_page_records_writes_the_whole_page(tmp_path):
    """``streamsemi evaluate --results-page docs/results.md --records-dir benchmarks/results/page_full
    --protocol NAME`` saves the run and writes the page as ``make results`` would from the new records."""
    for path in results_page.page_records(ROOT):
        target = tmp_path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(_read(path), encoding="utf-8")
    out = tmp_path / "docs" / "results.md"
    out.parent.mkdir()
    tiny = {"pseudo-lsc": {"labels": [50], "runs": 1, "max_docs": 200}}
    records = results_page.generate(out, protocols=["pseudo-lsc"], algorithms=["pseudo-lsc"], progress=False,
                                    settings_override=tiny, records_dir=tmp_path / results_page.PAGE_RECORDS)
    saved = json.loads((tmp_path / results_page.PAGE_RECORDS / "pseudo-lsc.json").read_text(encoding="utf-8"))
    assert saved["mode"] == "full" and saved["records"] == records
    page = out.read_text(encoding="utf-8")
    assert page == results_page.build_page(tmp_path)
    assert "documents: at most 200 per dataset" in page and "## Served quality" in page
    assert results_page.page_root(tmp_path / "elsewhere") is None


# ----------------------------------------------------------------------------- README figures

def _served(corpus: str, field: str) -> Callable[[dict[str, Any]], float]:
    def get(record: dict[str, Any]) -> float:
        run = next(r for r in record["runs"] if r["corpus"] == corpus)
        return run["algorithms"]["constrained-kmeans"][field]
    return get


#: Every figure the README quotes: ``(what, pattern capturing the figure, record cited, value in the record,
#: digits)``. The README must say the record's path next to the figure.
README_FIGURES: tuple[tuple[str, str, str, Callable[[dict[str, Any]], float], int], ...] = tuple(
    (f"served quality, {name} {field}", pattern, "benchmarks/results/served_quality_s37_final.json",
     _served(corpus, field), 3)
    for name, corpus, pattern in (("R8", "r8", r"Reuters R8 at macro-F1 \*\*(\d+\.\d+)\*\*"),
                                  ("20NG", "20ng", r"20 Newsgroups at \*\*(\d+\.\d+)\*\*"))
    for field in ("first", "latest", "batch")  # "first label, latest label and a batch fit alike"
) + (
    ("throughput ratio, constrained k-means against the bare loop",
     r"\*\*(\d+\.\d+)\*\* times\s+the docs/s of a bare Kafka", "benchmarks/results/throughput.json",
     lambda r: r["phases"]["ck"]["ratio"], 2),
)


@pytest.mark.parametrize("what, pattern, record, value, digits", README_FIGURES,
                         ids=[f[0] for f in README_FIGURES])
def test_readme_figure_equals_its_record(what, pattern, record, value, digits):
    readme = _read("README.md")
    found = re.search(pattern, readme)
    assert found, f"the README no longer quotes the {what} (update README_FIGURES with the new wording)"
    paragraph = readme[readme.rfind("\n\n", 0, found.start()): readme.find("\n\n", found.end())]
    assert f"`{record}`" in paragraph, f"the README's {what} does not cite {record}"
    expected = f"{value(_record(record)):.{digits}f}"
    assert found.group(1) == expected, f"README quotes {found.group(1)} for the {what}; {record} says {expected}"


def test_every_bold_figure_of_the_readme_is_checked():
    """A figure the README puts in bold next to a record is one of README_FIGURES (so it cannot drift)."""
    readme = _read("README.md")
    checked = {m.start(1) for _, pattern, *_ in README_FIGURES for m in re.finditer(pattern, readme)}
    for paragraph in re.finditer(r"(?s)(?:(?!\n\n).)+", readme):
        if "benchmarks/results/" not in paragraph.group(0):
            continue
        for m in re.finditer(r"\*\*(\d+\.\d+)\*\*", paragraph.group(0)):
            assert paragraph.start() + m.start(1) in checked, f"README figure {m.group(1)} is not checked"


# ----------------------------------------------------------------------------- dead-letter reasons

def _reasons_in_code() -> set[str]:
    """String-literal reasons of every ``Rejected(reason, ...)`` and ``dead_letter(raw, reason, ...)`` call."""
    found: set[str] = set()
    for path in (ROOT / "streamsemi").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            position = {"Rejected": 0, "dead_letter": 1}.get(name)
            if position is None:
                continue
            args = list(node.args) + [k.value for k in node.keywords if k.arg == "reason"]
            if len(args) > position and isinstance(args[position], ast.Constant) \
                    and isinstance(args[position].value, str):
                found.add(args[position].value)
    return found


def test_the_code_list_of_dead_letter_reasons_is_every_reason_the_code_gives():
    in_code = _reasons_in_code()
    assert len(REASONS) == len(set(REASONS))
    assert in_code - set(REASONS) == set(), "reasons given in the code but missing from messages.REASONS"
    assert set(REASONS) - in_code == set(), "messages.REASONS lists reasons no code gives"


def test_messages_doc_lists_exactly_the_dead_letter_reasons():
    doc = _read("docs/messages.md")
    section = doc[doc.index("## Dead letters"):]
    section = section[: section.find("\n## ", 3) if "\n## " in section[3:] else len(section)]
    listed = re.findall(r"^\| `([a-z0-9_]+)` \|", section, flags=re.MULTILINE)
    assert sorted(listed) == sorted(REASONS), "docs/messages.md's dead-letter table and messages.REASONS differ"


def test_metrics_doc_lists_every_dead_letter_reason():
    doc = _read("docs/metrics.md")
    row = next(line for line in doc.splitlines() if line.startswith("| `streamsemi_dead_letters_total`"))
    missing = [r for r in REASONS if f"`{r}`" not in row]
    assert missing == [], f"docs/metrics.md's streamsemi_dead_letters_total does not list {missing}"


# ----------------------------------------------------------------------------- result files

RESULTS = ROOT / "benchmarks" / "results"
COMMITS = RESULTS / "commits.json"


def _states_commit(record: Any) -> bool:
    return isinstance(record, dict) and bool(record.get("commit") or (record.get("environment") or {}).get("commit"))


def test_every_result_file_states_its_commit():
    """A JSON record says its commit (``commit`` or ``environment.commit``); a file beside such a record
    (the same name, another suffix: its table or plot) shares it; any other file is in commits.json."""
    manifest = json.loads(COMMITS.read_text(encoding="utf-8"))
    files = [p for p in RESULTS.rglob("*") if p.is_file() and p != COMMITS]
    records: dict[Path, Any] = {}
    for p in files:
        if p.suffix == ".json":
            try:
                records[p] = json.loads(p.read_text(encoding="utf-8"))
            except ValueError:
                pass
    missing = [str(p.relative_to(RESULTS)) for p in files
               if not _states_commit(records.get(p)) and not _states_commit(records.get(p.with_suffix(".json")))
               and str(p.relative_to(RESULTS)) not in manifest]
    assert missing == [], f"result files that state no commit: {missing[:20]}"
    assert all(re.fullmatch(r"[0-9a-f]{7,40}", c) for c in manifest.values())
    gone = [name for name in manifest if not (RESULTS / name).exists()]
    assert gone == [], f"commits.json names files that are gone: {gone[:20]}"
