"""Stable cluster ids: the matching of consecutive rounds on constructed cases (streamsemi.core.clusters)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from streamsemi.core.clusters import (
    Membership,
    Transition,
    cluster_number,
    contingency,
    jaccard,
    match,
    match_rounds,
)
from streamsemi.core.datasets import load
from streamsemi.core.messages import Document
from streamsemi.engine import Engine, EngineConfig
from streamsemi.service import checkpoint


def membership(groups: dict[str, list[int]], prefix: str = "d") -> Membership:
    """A membership from ``{cluster: [document numbers]}`` (scores decrease with the document number)."""
    names = list(groups)
    ids, codes, scores = [], [], []
    for k, name in enumerate(names):
        for d in groups[name]:
            ids.append(f"{prefix}{d}")
            codes.append(k)
            scores.append(1.0 / (1 + d))
    return Membership(ids, np.asarray(codes, np.int32), names, np.asarray(scores, np.float32))


def events(m) -> dict[str, tuple[str, str | None]]:
    return {t.cluster: (t.event, t.target) for t in m.transitions}


def test_first_round_numbers_discovered_clusters_from_the_counter_and_every_cluster_is_born():
    m = match_rounds(None, membership({"acq": [1, 2], "new-0": [3], "new-1": [4]}), next_id=5)
    assert m.renames == {"new-0": "new-5", "new-1": "new-6"} and m.next_id == 7
    assert events(m) == {"acq": ("born", None), "new-5": ("born", None), "new-6": ("born", None)}


def test_identical_rounds_keep_every_id_and_continue():
    prev = membership({"acq": range(0, 10), "new-4": range(10, 30), "new-7": range(30, 40)})
    new = membership({"acq": range(0, 10), "new-0": range(10, 30), "new-1": range(30, 40)})
    m = match_rounds(prev, new, next_id=8)
    assert m.renames == {"new-0": "new-4", "new-1": "new-7"} and m.next_id == 8
    assert events(m) == {"acq": ("continued", None), "new-4": ("continued", None), "new-7": ("continued", None)}


def test_permuted_raw_names_follow_the_documents_not_the_names():
    prev = membership({"new-0": range(0, 20), "new-1": range(20, 35), "new-2": range(35, 60)})
    new = membership({"new-0": range(35, 60), "new-1": range(0, 20), "new-2": range(20, 35)})
    m = match_rounds(prev, new, next_id=3)
    assert m.renames == {"new-0": "new-2", "new-1": "new-0", "new-2": "new-1"}
    assert {e for e, _ in events(m).values()} == {"continued"} and m.next_id == 3


def test_overlapping_windows_match_on_the_shared_documents_only():
    # the window slid: documents 0-9 left, 100-119 arrived; the clusters are the same on what both hold
    prev = membership({"new-0": range(0, 30), "new-1": range(30, 60)})
    new = membership({"new-0": [*range(30, 60), *range(100, 110)], "new-1": [*range(10, 30), *range(110, 120)]})
    m = match_rounds(prev, new, next_id=2)
    assert m.renames == {"new-0": "new-1", "new-1": "new-0"}


def test_split_keeps_the_id_on_the_larger_part_and_the_other_part_splits_from_it():
    prev = membership({"earn": range(0, 10), "new-3": range(10, 110)})
    new = membership({"earn": range(0, 10), "new-0": range(10, 75), "new-1": range(75, 110)})
    m = match_rounds(prev, new, next_id=4)
    assert m.renames == {"new-0": "new-3", "new-1": "new-4"} and m.next_id == 5
    assert events(m) == {"earn": ("continued", None), "new-3": ("continued", None), "new-4": ("split_from", "new-3")}


def test_merge_keeps_the_larger_id_and_the_other_is_merged_into_it():
    prev = membership({"new-0": range(0, 60), "new-1": range(60, 100)})
    new = membership({"new-0": range(0, 100)})
    m = match_rounds(prev, new, next_id=2)
    assert m.renames == {"new-0": "new-0"} and m.next_id == 2
    assert events(m) == {"new-0": ("continued", None), "new-1": ("merged_into", "new-0")}


def test_disappear_retires_a_cluster_whose_documents_scatter_and_absorb_into_a_class_is_merged_into_it():
    prev = membership({"acq": range(0, 30), "crude": range(30, 60), "earn": range(200, 210), "new-0": range(60, 90),
                       "new-1": range(90, 100)})
    # new-0's documents scatter over acq, crude and earn (none holds half); new-1's all go to crude
    new = membership({"acq": [*range(0, 30), *range(60, 70)], "crude": [*range(30, 60), *range(70, 80), *range(90, 100)],
                      "earn": [*range(200, 210), *range(80, 90)]})
    m = match_rounds(prev, new, next_id=2)
    assert m.renames == {} and m.next_id == 2
    assert events(m) == {"acq": ("continued", None), "crude": ("continued", None), "earn": ("continued", None),
                         "new-0": ("retired", None), "new-1": ("merged_into", "crude")}


def test_emerge_gives_a_fresh_id_never_used_before():
    prev = membership({"acq": range(0, 50), "new-0": range(50, 60)})
    # new-0 gone (its documents left the window), a new group of new documents: a fresh id, not new-0 again
    new = membership({"acq": range(0, 50), "new-0": range(200, 230)})
    m = match_rounds(prev, new, next_id=1)
    assert m.renames == {"new-0": "new-1"} and m.next_id == 2
    assert events(m) == {"acq": ("continued", None), "new-1": ("born", None), "new-0": ("retired", None)}


def test_a_cluster_carved_out_of_a_seeded_class_splits_from_it_and_a_new_class_is_born():
    prev = membership({"acq": range(0, 100), "new-0": range(100, 140)})
    new = membership({"acq": range(0, 70), "new-0": range(70, 100), "shipping": range(100, 140)})
    m = match_rounds(prev, new, next_id=1)
    ev = events(m)
    assert ev["new-1"] == ("split_from", "acq") and ev["shipping"] == ("born", None)
    assert ev["new-0"] == ("merged_into", "shipping")


def test_below_min_jaccard_no_match():
    prev = membership({"new-0": range(0, 100)})
    new = membership({"new-0": range(0, 20), "new-1": range(20, 40), "new-2": range(40, 60), "new-3": range(60, 100)})
    m = match_rounds(prev, new, next_id=1, min_jaccard=0.5)
    assert m.renames == {"new-0": "new-1", "new-1": "new-2", "new-2": "new-3", "new-3": "new-4"}
    assert events(m)["new-0"] == ("retired", None)
    # no part holds half of new-0 (retired), each part came all from it
    assert all(events(m)[f"new-{k}"] == ("split_from", "new-0") for k in range(1, 5))
    m = match_rounds(prev, new, next_id=1, min_jaccard=0.4)
    assert m.renames["new-3"] == "new-0"  # 40 of 100 documents: Jaccard 0.4


def test_jaccard_counts_every_document_of_both_clusters_not_only_those_in_discovered_clusters():
    # new-3 had 35 documents; 34 of them went to a seeded class, 1 stays with 68 others in the new round's new-0:
    # inside the discovered block the pair looks like the only candidate, its Jaccard is 1/103
    prev = membership({"acq": range(0, 100), "new-3": range(100, 135)})
    new = membership({"acq": [*range(0, 100), *range(100, 134)], "new-0": [134, *range(200, 268)]})
    m = match_rounds(prev, new, next_id=4)
    assert m.renames == {"new-0": "new-4"}
    assert events(m)["new-3"] == ("merged_into", "acq")


def test_the_counter_never_goes_below_an_id_in_use():
    prev = membership({"new-9": range(0, 10)})
    m = match_rounds(prev, membership({"new-0": range(50, 60)}), next_id=0)
    assert m.renames == {"new-0": "new-10"} and m.next_id == 11


def test_hungarian_maximises_the_documents_that_keep_their_id():
    # greedy on the largest pair would give new-0 -> a (50) and leave b with nothing: 50 kept;
    # the assignment a -> y, b -> x keeps 45 + 40 = 85
    counts = np.array([[50, 45], [40, 0]])
    assert sorted(match(counts, 0.0)) == [(0, 1), (1, 0)]


def test_contingency_and_jaccard_values():
    c = contingency(np.array([0, 0, 1, 1, 1]), np.array([0, 1, 1, 1, 0]), 2, 2)
    assert c.tolist() == [[1, 1], [1, 2]]
    assert jaccard(c)[1, 1] == pytest.approx(2 / 4) and jaccard(c)[0, 0] == pytest.approx(1 / 3)


def test_membership_members_are_most_central_first_and_bounded():
    m = Membership.from_proba(["a", "b", "c"], np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]]), ["x", "new-1"])
    assert m.members("x") == [("a", pytest.approx(0.9)), ("c", pytest.approx(0.6))]
    assert m.members("x", limit=1) == [("a", pytest.approx(0.9))] and m.members("zz") == []
    assert m.sizes().tolist() == [2, 1]
    with pytest.raises(ValueError):
        Membership.from_proba(["a"], np.ones((2, 2)), ["x", "y"])


def test_cluster_number_and_transition():
    assert cluster_number("new-12") == 12 and cluster_number("acq") is None and cluster_number("new-x") is None
    assert Transition("new-1", "born").target is None


# ---------------------------------------------------------------- through the engine (ids in outputs, events, restarts)
SEEDED = ("earn", "acq", "crude", "trade", "money-fx")
SCHEMA = Path(__file__).resolve().parent.parent / "docs" / "schemas" / "cluster-event.schema.json"


@pytest.fixture(scope="module")
def r8():
    ds = load("reuters-r8")
    return ds, [int(i) for i in np.random.default_rng(0).permutation(len(ds))[:2400]]


def engine_cfg(**kw) -> EngineConfig:
    base = dict(algorithms=["constrained-kmeans"], n_new_clusters=3, background_refit=False, n_features=2**16,
                window_max_docs=800, refit_every_docs=200, refit_growth=0, refit_idle_s=0, drift_detection=False,
                min_docs_first_refit=200, min_seed_classes=5, min_seeds_per_class=1, first_fit_stable_seeds=0,
                first_fit_max_wait_s=0, revisions="changed",
                algorithm_params={"constrained-kmeans": {"discovery": "legacy"}})  # always 3 discovered clusters
    base.update(kw)
    return EngineConfig(**base)


def stream(eng: Engine, ds, idx, rounds: list, emitted: list) -> None:
    """Process ``idx`` in batches of 50 with seeds for 1 in 3 documents of the seeded classes; record each round."""
    for start in range(0, len(idx), 50):
        batch = idx[start:start + 50]
        res = eng.process([Document(id=f"r{i}", text=ds.texts[i]) for i in batch])
        for i in batch:
            if ds.labels[i] in SEEDED and i % 3 == 0:
                eng.label(f"r{i}", [ds.labels[i]])
        slot = eng.models.get("constrained-kmeans")
        emitted.extend((slot.version if slot else 0, a) for a in res.assignments + res.revisions)
        if slot is not None and (not rounds or rounds[-1][0] != slot.version):
            rounds.append((slot.version, slot, eng.drain_cluster_events()))


def test_engine_outputs_carry_stable_public_ids_and_events_follow_the_schema(r8, tmp_path):
    ds, order = r8
    eng = Engine(engine_cfg())
    rounds: list = []
    emitted: list = []
    stream(eng, ds, order[:1600], rounds, emitted)
    assert len(rounds) >= 5
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text()))
    gone: set[str] = set()
    for k, (version, slot, evs) in enumerate(rounds):
        public = {str(c) for c in slot.classes}
        assert slot.new_clusters <= public and set(slot.explain) <= public
        assert all(raw != pub for raw, pub in slot.renamed.items())
        for ev in evs:
            validator.validate(ev)
            assert ev["model_version"] == version and ev["algorithm"] == "constrained-kmeans"
        current = {ev["cluster"] for ev in evs if ev["event"] not in ("merged_into", "retired")}
        assert current == public, "one event per cluster and class of the round"
        assert not (current & gone), f"round {version}: an id came back after it was retired: {current & gone}"
        gone |= {ev["cluster"] for ev in evs if ev["event"] in ("merged_into", "retired")}
        for ev in evs:
            if ev["event"] == "continued" and k:
                assert ev["cluster"] in {str(c) for c in rounds[k - 1][1].classes}
        if k == 0:
            assert {ev["event"] for ev in evs} == {"born"}
    last = eng._memberships["constrained-kmeans"]
    sizes = dict(zip(last.names, last.sizes().tolist(), strict=True))
    for ev in rounds[-1][2]:
        assert ev["size"] == (0 if ev["event"] in ("merged_into", "retired") else sizes[ev["cluster"]])
        assert all(ex["id"] in set(last.ids) for ex in ev["examples"])
    assert sum(ev["size"] for ev in rounds[-1][2]) == len(last.ids) == 800
    for _, a in emitted:  # every output names the public ids of the model that assigned it
        slot = next(s for v, s, _ in rounds if v == a.model_version)
        assert a.cluster in {str(c) for c in slot.classes} and a.new_cluster == a.cluster.startswith("new-")
        assert a.explain == slot.explain.get(a.cluster, [])
    used = {int(c[4:]) for _, s, _ in rounds for c in s.new_clusters}
    assert used and eng.export_state().cluster_ids["constrained-kmeans"] == max(used | {int(g[4:]) for g in gone}) + 1

    # a restart from a checkpoint keeps the counter and matches the next round against the restored model
    checkpoint.save(eng, tmp_path)
    again = Engine(engine_cfg())
    checkpoint.restore(again, tmp_path)
    restored = again.models["constrained-kmeans"]
    assert [str(c) for c in restored.classes] == [str(c) for c in eng.models["constrained-kmeans"].classes]
    assert again.export_state().cluster_ids == eng.export_state().cluster_ids
    counter = eng.export_state().cluster_ids["constrained-kmeans"]
    before = set(restored.new_clusters)
    more: list = []
    stream(again, ds, order[1600:1800], more, [])
    after = set(more[-1][1].new_clusters)
    assert all(int(c[4:]) >= counter for c in after - before), "ids never reused"
    # the same round without the restart names the same clusters the same way
    same: list = []
    stream(eng, ds, order[1600:1800], same, [])
    assert more[-1][0] == same[-1][0] and after == set(same[-1][1].new_clusters)


def test_engine_warm_starts_calibrated_discovery_and_ids_hold_across_rounds_and_a_restart(r8, tmp_path):
    """Calibrated discovery (the default): each refit's clustering starts at the previous model's clusters."""
    from streamsemi.algorithms._discovery import warm_start_centroids

    ds, order = r8
    cfg = dict(algorithm_params={}, min_seeds_per_class=3)
    eng = Engine(engine_cfg(**cfg))
    rounds: list = []
    stream(eng, ds, order[:1600], rounds, [])
    assert len(rounds) >= 5
    n_features = eng.config.n_features
    assert rounds[0][1].model.discovery_init is None
    both = kept = 0
    for (_, before, _), (_, after, _) in zip(rounds, rounds[1:], strict=False):
        expected = warm_start_centroids(before.model, n_features)
        init = after.model.discovery_init
        assert expected is not None and init is not None
        assert init.shape == expected.shape and abs(init - expected).max() == 0
        assert after.model.discovery_info_["warm_start"] >= 1
    # the public ids over the rounds: the documents in a new cluster in two consecutive rounds keep it
    members: list[dict[str, str]] = []
    eng2 = Engine(engine_cfg(**cfg))
    for start in range(0, 1600, 50):
        batch = order[start:start + 50]
        eng2.process([Document(id=f"r{i}", text=ds.texts[i]) for i in batch])
        for i in batch:
            if ds.labels[i] in SEEDED and i % 3 == 0:
                eng2.label(f"r{i}", [ds.labels[i]])
        m = eng2._memberships.get("constrained-kmeans")
        if m is not None and (not members or members[-1].get("_v") != str(eng2.models["constrained-kmeans"].version)):
            members.append({"_v": str(eng2.models["constrained-kmeans"].version),
                            **{d: m.names[c] for d, c in zip(m.ids, m.codes.tolist(), strict=True)}})
    for prev, new in zip(members, members[1:], strict=False):
        docs = [d for d in prev.keys() & new.keys() if d != "_v" and prev[d].startswith("new-") and new[d].startswith("new-")]
        both += len(docs)
        kept += sum(prev[d] == new[d] for d in docs)
    assert both >= 50 and kept / both >= 0.95, (kept, both)
    # a restart from a checkpoint warm-starts from the restored model
    checkpoint.save(eng, tmp_path)
    again = Engine(engine_cfg(**cfg))
    checkpoint.restore(again, tmp_path)
    restored = again.models["constrained-kmeans"]
    for start in range(1600, 1800, 50):
        before = again.models["constrained-kmeans"]
        again.process([Document(id=f"r{i}", text=ds.texts[i]) for i in order[start:start + 50]])
        if again.models["constrained-kmeans"].version != before.version:
            break
    assert before is restored, "the first refit after the restart follows the restored model"
    refit = again.models["constrained-kmeans"]
    assert refit.version > restored.version
    assert abs(refit.model.discovery_init - warm_start_centroids(restored.model, n_features)).max() == 0
