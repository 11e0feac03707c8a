"""streamsemi evaluate: protocols end to end on small real-corpus subsets, stream mode,
unavailable algorithms, results page."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from streamsemi.algorithms import REGISTRY
from streamsemi.evaluation import command, protocols, results_page
from streamsemi.evaluation.protocols import PROTOCOLS, make_draw, prepare

FIELDS = {"protocol", "dataset", "algorithm", "label_fraction", "metric", "mean", "std", "runs",
          "fit_seconds"}


def run_cli(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    command.configure_parser(p)
    return command.run(p.parse_args(argv))


def run_json(tmp_path: Path, argv: list[str]) -> list[dict]:
    out = tmp_path / "r.json"
    assert run_cli(argv + ["--json", str(out), "--no-progress"]) == 0
    records = json.loads(out.read_text())
    assert isinstance(records, list) and records
    fits: dict[tuple, float] = {}
    for r in records:
        assert FIELDS <= set(r), r
        assert r["runs"] >= 1 and 0.0 <= r["mean"] <= 1.0
        # values in [0, 1]: std (ddof=0) is 0 for one run and at most half the range otherwise
        assert r["std"] == 0.0 if r["runs"] == 1 else 0.0 <= r["std"] <= 0.5, r
        assert 0.0 < r["fit_seconds"] < 600.0, r
        # every metric of a (dataset, method, amount, mode) comes from the same fits
        key = (r["dataset"], r["algorithm"], r["label_fraction"], r.get("mode"))
        assert fits.setdefault(key, r["fit_seconds"]) == r["fit_seconds"], r
    return records


@pytest.fixture(scope="module")
def talk() -> protocols.PreparedDataset:
    return prepare(["20ng-talk4"], max_docs=300)["20ng-talk4"]


# ----------------------------------------------------------------------------- draws

def test_dataset_subsets_follow_the_papers() -> None:
    assert protocols.DATASETS["20ng-easy1"].classes == ("comp.graphics", "rec.autos", "sci.crypt",
                                                         "talk.politics.guns")
    assert protocols.DATASETS["20ng-difficult4"].known == ("talk.politics.guns", "talk.politics.mideast")
    assert set(PROTOCOLS["cle"].datasets) == {f"reuters-top30-r{r}" for r in range(2, 7)}
    data = prepare(["reuters-top10", "reuters-multilabel20"], max_docs=400)
    top10 = data["reuters-top10"]
    assert len(top10.classes) == 10 and {"earn", "acq", "crude"} <= set(top10.classes)
    assert all(isinstance(lab, str) for lab in top10.labels)
    multi = data["reuters-multilabel20"]
    assert len(multi.classes) <= 20 and all(isinstance(lab, list) and lab for lab in multi.labels)
    assert len(top10) <= 400 and np.all(np.diff(top10.X.indptr) > 0)


def test_stratified_seeds_cover_every_class_and_are_deterministic(talk) -> None:
    p = PROTOCOLS["semi-ldc"]
    d1 = make_draw(p, talk, 1, run=0)
    d2 = make_draw(p, talk, 1, run=0)
    d3 = make_draw(p, talk, 1, run=1)
    assert np.array_equal(d1.seed_mask, d2.seed_mask)
    assert not np.array_equal(d1.seed_mask, d3.seed_mask)
    seeded = Counter(np.asarray(d1.y_true, dtype=object)[d1.seed_mask])
    assert set(seeded) == set(talk.classes) and min(seeded.values()) >= 1
    d5 = make_draw(p, talk, 5, run=0)
    sizes = Counter(talk.labels)
    seeded5 = Counter(np.asarray(d5.y_true, dtype=object)[d5.seed_mask])
    assert all(seeded5[c] == max(1, round(0.05 * sizes[c])) for c in sizes)
    y = d5.y_fit_single()
    assert sum(v is not None for v in y) == d5.seed_mask.sum()


def test_dlda_and_fsl_and_cle_draws() -> None:
    data = prepare(["20ng-easy1", "reuters-top10", "reuters-top30-r3"], max_docs=500)
    dl = make_draw(PROTOCOLS["d-lda"], data["20ng-easy1"], 20, run=0)
    seeded = set(np.asarray(dl.y_true, dtype=object)[dl.seed_mask])
    assert seeded == {"comp.graphics", "rec.autos"} and dl.n_new == 2
    fs = make_draw(PROTOCOLS["fsl"], data["reuters-top10"], 20, run=0)
    assert fs.seed_mask.sum() == 20 and fs.eval_mask.sum() == min(400, len(data["reuters-top10"]) - 20)
    c1 = make_draw(PROTOCOLS["cle"], data["reuters-top30-r3"], 3, run=4)
    c2 = make_draw(PROTOCOLS["cle"], data["reuters-top30-r3"], 9, run=4)
    assert len(c1.classes) == 3 and c1.classes == c2.classes  # same classes for every label amount
    assert protocols.label_fraction_of(PROTOCOLS["fsl"], 400) == 0.5


def test_aggregate_mean_std_and_failed_runs() -> None:
    from streamsemi.evaluation.runner import RunOutcome, aggregate

    p = PROTOCOLS["cle"]  # metrics: accuracy, nmi_max
    outs = [RunOutcome("d", "m", 5, 0, {"accuracy": 0.5, "nmi_max": 0.2}, 1.0, 10, 90),
            RunOutcome("d", "m", 5, 1, {"accuracy": 0.9, "nmi_max": 0.4}, 3.0, 12, 88),
            RunOutcome("d", "m", 5, 2, {}, 9.0, 11, 89, error="ValueError: boom"),
            RunOutcome("d", "bad", 5, 0, {}, 1.0, 10, 90, error="ValueError: boom")]
    records = aggregate(p, outs, "batch")
    assert [(r["algorithm"], r["metric"]) for r in records] == [("m", "accuracy"), ("m", "nmi_max")]
    acc, nmi = records
    assert acc["mean"] == pytest.approx(0.7) and acc["std"] == pytest.approx(0.2) and acc["runs"] == 2
    assert nmi["mean"] == pytest.approx(0.3) and nmi["std"] == pytest.approx(0.1)
    assert acc["fit_seconds"] == 2.0 and acc["n_labeled"] == 11.0 and acc["n_scored"] == 89.0
    assert acc["label_fraction"] == 0.05 and acc["mode"] == "batch"


def test_evaluate_is_keyword_only() -> None:
    from streamsemi.evaluation.driver import evaluate

    with pytest.raises(TypeError, match="positional"):
        evaluate(PROTOCOLS["semi-ldc"], ["constrained-kmeans"])


# ----------------------------------------------------------------------------- protocols

@pytest.mark.parametrize("protocol,extra,metrics", [
    ("semi-ldc", ["--datasets", "20ng-talk4", "--labels", "2,5"], {"macro_f1"}),
    ("cle", ["--datasets", "reuters-top30-r2", "--labels", "5"], {"accuracy", "nmi_max"}),
    ("d-lda", ["--datasets", "20ng-easy2", "--labels", "30"], {"nmi_mean", "pairwise_f", "macro_f1"}),
    ("fsl", ["--datasets", "reuters-top10", "--labels", "20"], {"f_measure", "entropy"}),
    ("pseudo-lsc", [], {"macro_auc"}),
])
def test_protocol_end_to_end(tmp_path, protocol, extra, metrics) -> None:
    records = run_json(tmp_path, ["--protocol", protocol, "--algorithm", "constrained-kmeans",
                                  "--runs", "1", "--max-docs", "300"] + extra)
    p = PROTOCOLS[protocol]
    assert {r["metric"] for r in records} == metrics
    assert {r["protocol"] for r in records} == {protocol}
    assert {r["algorithm"] for r in records} == {"constrained-kmeans", *p.baselines}
    assert all(r["mode"] == "batch" and r["runs"] == 1 for r in records)
    if protocol == "semi-ldc":
        assert sorted({r["label_fraction"] for r in records}) == [0.02, 0.05]
    if protocol == "fsl":
        assert {round(r["label_fraction"], 4) for r in records} == {round(20 / 420, 4)}
        assert {r["n_labeled"] for r in records} == {20.0}
    if protocol == "pseudo-lsc":
        assert {r["label_fraction"] for r in records} == {0.5}
        ovr = next(r for r in records if r["algorithm"] == "ovr-linear")
        assert ovr["mean"] > 0.8  # one-vs-rest on half of Reuters: far better than chance


def test_batch_quality_on_real_subset_and_table(tmp_path, capsys) -> None:
    records = run_json(tmp_path, ["--protocol", "semi-ldc", "--algorithm", "constrained-kmeans",
                                  "--datasets", "20ng-talk4", "--labels", "5", "--runs", "2",
                                  "--max-docs", "600", "--plot", str(tmp_path / "p.png")])
    by = {r["algorithm"]: r for r in records}
    assert by["constrained-kmeans"]["runs"] == 2
    assert by["constrained-kmeans"]["mean"] > 0.5  # 4 talk.* groups: chance is ~0.25
    assert by["constrained-kmeans"]["n_labeled"] == pytest.approx(30, abs=2)
    out = capsys.readouterr().out
    assert "constrained-kmeans" in out and "label-spreading" in out and "macro_f1" in out
    png = (tmp_path / "p.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_unavailable_algorithm_gives_a_line_not_a_crash(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setitem(REGISTRY, "ghost", ("streamsemi.algorithms.no_such_module", "Ghost", {}))
    records = run_json(tmp_path, ["--protocol", "semi-ldc", "--algorithm", "ghost,nosuch",
                                  "--datasets", "20ng-talk4", "--labels", "5", "--runs", "1",
                                  "--max-docs", "200"])
    err = capsys.readouterr().err
    assert "algorithm 'ghost' is not available" in err
    assert "algorithm 'nosuch' is not available: unknown algorithm" in err
    assert {r["algorithm"] for r in records} == set(PROTOCOLS["semi-ldc"].baselines)
    assert run_cli(["--protocol", "semi-ldc", "--algorithm", "ghost", "--no-baselines",
                    "--no-progress"]) == 1


def test_failing_method_is_reported_and_others_still_scored(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setitem(REGISTRY, "broken", ("streamsemi.evaluation.baselines", "SupervisedLinear",
                                             {"C": -1.0}))
    records = run_json(tmp_path, ["--protocol", "semi-ldc", "--algorithm", "broken,constrained-kmeans",
                                  "--datasets", "20ng-talk4", "--labels", "5", "--runs", "1",
                                  "--max-docs", "200", "--no-baselines"])
    assert {r["algorithm"] for r in records} == {"constrained-kmeans"}
    assert "broken failed on 1 run(s)" in capsys.readouterr().err


def test_bad_arguments() -> None:
    from streamsemi.core.errors import StreamsemiError

    with pytest.raises(StreamsemiError, match="unknown dataset id"):
        prepare(["nope"])
    assert run_cli(["--protocol", "semi-ldc", "--datasets", "nope"]) == 2
    assert run_cli(["--protocol", "semi-ldc", "--datasets", "reuters-multilabel20"]) == 2
    assert run_cli([]) == 2


# ----------------------------------------------------------------------------- stream

def test_stream_mode_gives_prequential_and_final(tmp_path) -> None:
    records = run_json(tmp_path, ["--protocol", "semi-ldc", "--algorithm", "constrained-kmeans",
                                  "--datasets", "20ng-talk4", "--labels", "10", "--runs", "1",
                                  "--max-docs", "400", "--stream", "--refit-every", "100",
                                  "--no-baselines"])
    modes = {(r["algorithm"], r["mode"]): r for r in records}
    assert set(modes) == {("constrained-kmeans", "batch"), ("constrained-kmeans", "stream-prequential"),
                          ("constrained-kmeans", "stream-final"), ("river-mnb", "stream-prequential"),
                          ("river-mnb", "stream-final"), ("constrained-kmeans", "stream-first"),
                          ("constrained-kmeans", "stream-latest"), ("constrained-kmeans", "stream-batch")}
    # what users are served: latest labels (revisions, one more refit at the end) reach the batch figure
    served = {m: modes[("constrained-kmeans", f"stream-{m}")]["mean"] for m in ("first", "latest", "batch")}
    assert served["batch"] == pytest.approx(modes[("constrained-kmeans", "batch")]["mean"], abs=0.02)
    assert served["latest"] == pytest.approx(modes[("constrained-kmeans", "stream-final")]["mean"], abs=0.02)
    assert served["first"] < served["latest"] and modes[("constrained-kmeans", "stream-latest")]["revisions"] > 0
    preq = modes[("constrained-kmeans", "stream-prequential")]
    final = modes[("constrained-kmeans", "stream-final")]
    assert preq["refits"] >= 3 and preq["n_warmup"] > 0 and preq["fallback"] == 0.0
    assert preq["n_scored"] == final["n_scored"] - preq["n_warmup"]
    # the final model refits on the whole stream (window > stream): the batch figure
    assert final["mean"] == pytest.approx(modes[("constrained-kmeans", "batch")]["mean"], abs=0.02)
    assert final["mean"] > 0.5
    assert modes[("river-mnb", "stream-prequential")]["n_scored"] == preq["n_scored"]


def test_stream_order_by_date_for_reuters() -> None:
    from streamsemi.evaluation.stream import stream_order

    data = prepare(["reuters-top10"], max_docs=200)["reuters-top10"]
    draw = make_draw(PROTOCOLS["semi-ldc"], data, 5, run=0)
    order = stream_order(data, draw, np.random.default_rng(0))
    dates = [data.dates[draw.rows[k]] for k in order if data.dates[draw.rows[k]] is not None]
    assert dates == sorted(dates) and sorted(order.tolist()) == list(range(draw.rows.size))


# ----------------------------------------------------------------------------- results page

def test_results_page_regenerates(tmp_path) -> None:
    out = tmp_path / "results.md"
    override = {"semi-ldc": {"datasets": ["20ng-talk4"], "labels": [5], "runs": 1, "max_docs": 300,
                             "stream": (["20ng-talk4"], [5])}}
    records = results_page.generate(out, quick=True, protocols=["semi-ldc"],
                                    algorithms=["constrained-kmeans", "ghost"], progress=False,
                                    settings_override=override)
    text = out.read_text()
    assert text.startswith("# Results")
    assert "streamsemi evaluate --results-page docs/results.md --quick" in text
    assert "## semi-ldc" in text and "**20ng-talk4**, macro_f1" in text
    assert "| *paper: Semi-LDC (Table V)* | *0.793* |" in text
    assert "semi-ldc: not available: ghost" in text
    row = next(line for line in text.splitlines() if line.startswith("| constrained-kmeans |"))
    ck = next(r for r in records if r["algorithm"] == "constrained-kmeans" and r["mode"] == "batch")
    assert f"{ck['mean']:.3f}" in row
    assert "constrained-kmeans [stream-prequential]" in text and "river-mnb [stream-final]" in text


def test_results_page_flag_dispatches(monkeypatch, tmp_path) -> None:
    calls = {}

    def fake(path, **kw):
        calls.update(path=path, **kw)
        return []

    monkeypatch.setattr(results_page, "generate", fake)
    assert run_cli(["--results-page", str(tmp_path / "x.md"), "--quick", "--no-progress"]) == 0
    assert calls["path"] == str(tmp_path / "x.md") and calls["quick"] is True
