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
    plain = {"constrained-kmeans", *p.baselines}
    if protocol == "d-lda":  # also every method that can choose the number of new clusters, with "auto"
        assert {r["algorithm"] for r in records} == plain | {"constrained-kmeans (auto)", "seeded-kmeans (auto)"}
        auto = [r for r in records if r["algorithm"].endswith(" (auto)")]
        assert all(0 <= r["new_clusters"] <= 20 for r in auto)
        assert not any("new_clusters" in r for r in records if r not in auto)
    else:
        assert {r["algorithm"] for r in records} == plain
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
    assert text.index("## semi-ldc") < text.index("> semi-ldc: not available: ghost"), "in its protocol's section"
    row = next(line for line in text.splitlines() if line.startswith("| constrained-kmeans |"))
    ck = next(r for r in records if r["algorithm"] == "constrained-kmeans" and r["mode"] == "batch")
    assert f"{ck['mean']:.3f}" in row
    assert "constrained-kmeans [stream-prequential]" in text and "river-mnb [stream-final]" in text


def test_results_page_full_mode_one_protocol_at_a_time(tmp_path) -> None:
    """Full mode takes hours: each protocol run is saved in the records directory and the page is written
    from every saved protocol of the same mode, each section naming its commit."""
    out, records_dir = tmp_path / "results.md", tmp_path / "runs"
    tiny = {"semi-ldc": {"datasets": ["20ng-talk4"], "labels": [5], "runs": 1, "max_docs": 200, "stream": None},
            "pseudo-lsc": {"labels": [50], "runs": 1, "max_docs": 200}}
    first = results_page.generate(out, quick=True, protocols=["semi-ldc"], algorithms=["constrained-kmeans"],
                                  progress=False, settings_override=tiny, records_dir=records_dir)
    saved = json.loads((records_dir / "semi-ldc.json").read_text())
    assert saved["mode"] == "quick" and saved["protocol"] == "semi-ldc" and saved["records"] == first
    assert saved["commit"] and saved["wall_s"] > 0 and "documents: at most 200" in saved["settings"]
    # a run saved in the other mode is never mixed in
    results_page.save_protocol_run(records_dir, {**saved, "protocol": "cle", "mode": "full"})
    results_page.generate(out, quick=True, protocols=["pseudo-lsc"], algorithms=["pseudo-lsc"], progress=False,
                          settings_override=tiny, records_dir=records_dir)
    text = out.read_text()
    sections = {part.splitlines()[0]: part for part in text.split("\n## ")[1:]}
    assert list(sections) == ["semi-ldc", "cle", "d-lda", "fsl", "pseudo-lsc", "robustness"]
    ck = next(r for r in first if r["algorithm"] == "constrained-kmeans")
    assert f"Commit {saved['commit']}, {saved['generated']}." in sections["semi-ldc"]
    assert f"| constrained-kmeans | {ck['mean']:.3f}" in sections["semi-ldc"]  # kept from the first run
    assert "| pseudo-lsc |" in sections["pseudo-lsc"]
    for name in ("cle", "d-lda", "fsl", "robustness"):
        assert f"(not run in quick mode yet: `streamsemi evaluate --results-page docs/results.md --quick " \
               f"--records-dir DIR --protocol {name}`)" in sections[name]
    assert "each protocol's section names the commit" in text


def test_results_page_flag_dispatches(monkeypatch, tmp_path) -> None:
    calls = {}

    def fake(path, **kw):
        calls.update(path=path, **kw)
        return []

    monkeypatch.setattr(results_page, "generate", fake)
    assert run_cli(["--results-page", str(tmp_path / "x.md"), "--quick", "--no-progress"]) == 0
    assert calls["path"] == str(tmp_path / "x.md") and calls["quick"] is True


# ----------------------------------------------------------------------------- robustness protocol

def test_robustness_protocol_lists_every_corpus_in_every_setting() -> None:
    p = PROTOCOLS["robustness"]
    assert set(p.datasets) == {base + suffix for base in ("reuters-r52", "20ng", "reuters-top30",
                                                          "reuters-r8", "reuters-multilabel20")
                               for suffix in ("", "-w500", "-short30")}
    assert p.labels == (1, 5) and p.runs == 3
    assert {"semi-ldc", "cle", "d-lda", "fsl-ck", "pseudo-lsc", "ensemble"} <= set(p.algorithms)
    assert protocols.DATASETS["reuters-r8-w500"].window == 500
    assert protocols.DATASETS["20ng-short30"].max_words == 30
    assert protocols.DATASETS["reuters-top30"].draw_classes is None
    # no dataset of a paper protocol, except two corpora in another label regime: all of 20NG
    # (FSL: 400 documents, 10-400 labels) and multi-label Reuters (pseudo-LSC: 50% seeds)
    paper = {d for name, q in PROTOCOLS.items() if name != "robustness" for d in q.datasets}
    assert paper & set(p.datasets) == {"20ng", "reuters-multilabel20"}


def test_short_text_keeps_the_first_words() -> None:
    assert protocols.short_text("  a b\n\tc  d e ", 3) == "a b c"
    assert protocols.short_text("one two", 30) == "one two"
    assert protocols.short_text("", 5) == ""
    data = prepare(["reuters-r8", "reuters-r8-short30"], max_docs=150)
    full, short = data["reuters-r8"], data["reuters-r8-short30"]
    assert all(len(t.split()) <= 30 for t in short.texts)
    by_id = dict(zip(full.doc_ids, full.texts, strict=True))
    # the same stories (same subsample), cut; documents without a term after the cut are dropped
    assert set(short.doc_ids) <= set(by_id) and len(short) >= 0.95 * len(full)
    assert all(protocols.short_text(by_id[i], 30) == t for i, t in zip(short.doc_ids, short.texts, strict=True))
    long = [k for k, t in enumerate(short.texts) if len(by_id[short.doc_ids[k]].split()) > 60]
    assert long and all(short.X[k].sum() < full.X[full.doc_ids.index(short.doc_ids[k])].sum() for k in long)


def test_small_window_draws_500_documents_per_run() -> None:
    p = PROTOCOLS["robustness"]
    data = prepare(["reuters-r8-w500"], max_docs=900)["reuters-r8-w500"]
    d1 = make_draw(p, data, 1, run=0)
    d5 = make_draw(p, data, 5, run=0)
    other = make_draw(p, data, 1, run=1)
    assert d1.rows.size == 500 and np.array_equal(d1.rows, d5.rows)  # one window per run
    assert not np.array_equal(d1.rows, other.rows)
    assert set(d1.classes) == set(data.classes)  # stratified: every class is in the window
    assert set(np.asarray(d1.y_true, dtype=object)[d1.seed_mask]) == set(d1.classes)
    assert d5.seed_mask.sum() > d1.seed_mask.sum()
    multi = prepare(["reuters-multilabel20-w500"], max_docs=900)["reuters-multilabel20-w500"]
    dm = make_draw(p, multi, 5, run=0)
    assert dm.rows.size == 500 and dm.seed_mask.sum() == 25
    assert dm.y_true == [multi.labels[i] for i in dm.rows]


def test_example_f1_against_brute_force() -> None:
    from streamsemi.evaluation.metrics import example_f1

    rng = np.random.default_rng(0)
    T = rng.random((200, 6)) < 0.25
    P = rng.random((200, 6)) < 0.3
    T[:5] = False
    P[:3] = False  # rows 0-2: both empty (score 1); rows 3-4: empty truth, some prediction
    brute = []
    for t, p in zip(T, P, strict=True):
        ts, ps = set(np.flatnonzero(t)), set(np.flatnonzero(p))
        brute.append(1.0 if not ts and not ps else 2 * len(ts & ps) / (len(ts) + len(ps)))
    assert example_f1(T.astype(int), P.astype(int)) == pytest.approx(np.mean(brute))
    assert example_f1(T, T) == 1.0
    import scipy.sparse as sp

    assert example_f1(sp.csr_matrix(T.astype(int)), P) == pytest.approx(np.mean(brute))


def test_robustness_runs_dlda_without_new_clusters_and_methods_fit_the_dataset() -> None:
    from streamsemi.algorithms import MULTILABEL
    from streamsemi.evaluation.baselines import make_method
    from streamsemi.evaluation.runner import method_params

    p = PROTOCOLS["robustness"]
    data = prepare(["reuters-r8"], max_docs=300)["reuters-r8"]
    draw = make_draw(p, data, 5, run=0)
    assert draw.n_new == 0
    assert make_method("d-lda", **method_params(p, draw, 0)).n_new_clusters == 0
    methods = ["semi-ldc", "pseudo-lsc", "ensemble", "constrained-kmeans", "ovr-linear", "self-training"]
    single = protocols.methods_for(p, protocols.DATASETS["reuters-r8"], methods, sorted(MULTILABEL))
    multi = protocols.methods_for(p, protocols.DATASETS["reuters-multilabel20-short30"], methods,
                                  sorted(MULTILABEL))
    assert single == ["semi-ldc", "pseudo-lsc", "ensemble", "constrained-kmeans", "self-training"]
    assert multi == ["pseudo-lsc", "constrained-kmeans", "ovr-linear"]
    assert protocols.methods_for(PROTOCOLS["semi-ldc"], protocols.DATASETS["20ng"], methods) == methods


def test_robustness_end_to_end(tmp_path) -> None:
    records = run_json(tmp_path, ["--protocol", "robustness", "--algorithm", "pseudo-lsc,constrained-kmeans",
                                  "--datasets", "reuters-r8-short30,reuters-multilabel20-w500",
                                  "--labels", "5", "--quick", "--max-docs", "700"])
    by = {(r["dataset"], r["algorithm"], r["metric"]): r for r in records}
    assert {m for d, _, m in by if d == "reuters-r8-short30"} == {"macro_f1"}
    assert {(a, m) for d, a, m in by if d == "reuters-multilabel20-w500"} == {
        (a, m) for a in ("pseudo-lsc", "constrained-kmeans", "ovr-linear") for m in ("macro_auc", "example_f1")}
    assert {a for d, a, _ in by if d == "reuters-r8-short30"} == {
        "pseudo-lsc", "constrained-kmeans", "seeded-kmeans", "label-spreading", "self-training",
        "supervised-linear"}
    assert all(r["runs"] == 1 for r in records)  # --quick: one run
    assert by[("reuters-multilabel20-w500", "constrained-kmeans", "macro_auc")]["n_scored"] == 475
    # a single-label method chooses one label per story: its example F1 is below 1 on multi-label truth
    assert 0.2 < by[("reuters-multilabel20-w500", "constrained-kmeans", "example_f1")]["mean"] < 1.0
    assert by[("reuters-r8-short30", "constrained-kmeans", "macro_f1")]["mean"] > 0.4


def test_chosen_label_sets_of_single_and_multi_label_estimators() -> None:
    from streamsemi.evaluation.runner import chosen_label_sets

    class Fixed:
        def __init__(self, classes, pred):
            self.classes_ = np.array(classes, dtype=object)
            self.pred = pred

        def predict(self, X):
            return self.pred

    X = np.zeros((3, 2))
    single = Fixed(["b", "a"], np.array(["a", "b", "a"], dtype=object))
    np.testing.assert_array_equal(chosen_label_sets(single, X, ["a", "b", "c"], False),
                                  [[1, 0, 0], [0, 1, 0], [1, 0, 0]])
    multi = Fixed(["c", "a"], np.array([[1, 1], [0, 0], [0, 1]]))
    np.testing.assert_array_equal(chosen_label_sets(multi, X, ["a", "b", "c"], True),
                                  [[1, 0, 1], [0, 0, 0], [1, 0, 0]])


def test_self_training_adds_pseudo_labels_and_differs_from_supervised(talk) -> None:
    from streamsemi.evaluation.baselines import SelfTraining, SupervisedLinear

    draw = make_draw(PROTOCOLS["semi-ldc"], talk, 5, run=0)
    X, y = talk.X[draw.rows], draw.y_fit_single()
    st = SelfTraining().fit(X, y)
    n_unl = int(draw.eval_mask.sum())
    assert st.n_pseudo_labels_ == 10 * int(np.ceil(0.5 * n_unl / 10))
    assert SelfTraining(pseudo_fraction=0.2).fit(X, y).n_pseudo_labels_ == 10 * int(np.ceil(0.2 * n_unl / 10))
    sup = SupervisedLinear().fit(X, y)
    ev = np.flatnonzero(draw.eval_mask)
    assert (st.predict(X[ev]) != sup.predict(X[ev])).any()
    assert len(set(st.predict(X[ev]))) == len(talk.classes)  # no collapse to the large classes


def test_target_table_marks_algorithms_below_the_baseline() -> None:
    from streamsemi.evaluation.report import target_table

    def rec(dataset, frac, algorithm, mean, metric="macro_f1"):
        return {"dataset": dataset, "label_fraction": frac, "algorithm": algorithm, "metric": metric,
                "mean": mean, "mode": "batch"}

    records = [rec("r8", 0.01, "constrained-kmeans", 0.80), rec("r8", 0.01, "cle", 0.789),
               rec("r8", 0.01, "semi-ldc", 0.70), rec("r8", 0.05, "constrained-kmeans", 0.90),
               rec("r8", 0.05, "cle", 0.95), rec("r8", 0.05, "semi-ldc", 0.40, metric="macro_auc")]
    lines = target_table(records, ["semi-ldc", "cle"])
    assert lines[0] == "| dataset | labels | constrained-kmeans | semi-ldc | cle | below baseline |"
    assert lines[2] == "| r8 | 1% | 0.800 | 0.700 **↓** | 0.789 **↓** | 2 |"
    assert lines[3] == "| r8 | 5% | 0.900 |  | 0.950 | 0 |"
    assert target_table(records, ["cle"], tolerance=0.02)[2] == "| r8 | 1% | 0.800 | 0.789 | 0 |"
