"""Label suggestions: the ranking functions on constructed cases, the board's bounds, the engine hook, a real worker."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jsonschema
import numpy as np
import pytest
import scipy.sparse as sp
from kafka_utils import DEADLINE, Topics, WorkerProcess, producer, read_topic, send_json, wait_for

from streamsemi.core import datasets
from streamsemi.core import suggestions as sg
from streamsemi.core.messages import Document
from streamsemi.engine import PRIMARY_MIN_CHECKS, Engine, EngineConfig

SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "docs/schemas/suggestion.schema.json").read_text())


def distinct_rows(n: int, d: int = 64) -> sp.csr_matrix:
    """``n`` documents with no term in common (cosine 0 between any two)."""
    return sp.csr_matrix((np.ones(n), (np.arange(n), np.arange(n))), shape=(n, d))


def view(P, classes=("a", "b", "c"), new=(), rows=None, name="primary"):
    return sg.ModelView(name, np.asarray(P, dtype=float), list(classes), frozenset(new), rows)


# ---------------------------------------------------------------- pure functions
def test_margins_are_the_gap_between_the_two_best_classes():
    P = np.array([[0.5, 0.5, 0.0], [0.9, 0.1, 0.0], [0.3, 0.1, 0.6]])
    assert np.allclose(sg.margins(P), [0.0, 0.8, 0.3])
    assert np.allclose(sg.margins(np.ones((2, 1))), [1.0, 1.0])


def test_disagreement_is_the_share_of_other_algorithms_that_differ():
    primary = np.array(["a", "a", "b"], dtype=object)
    others = [np.array(["a", "b", "c"], dtype=object), np.array(["b", "b", "b"], dtype=object)]
    assert np.allclose(sg.disagreement(primary, others), [0.5, 1.0, 0.5])
    assert np.allclose(sg.disagreement(primary, []), [0, 0, 0])


def test_disagreement_weighs_each_vote_without_handing_its_share_to_the_others():
    primary = np.array(["a", "a", "b"], dtype=object)
    others = [np.array(["a", "b", "c"], dtype=object), np.array(["b", "b", "b"], dtype=object)]
    # the second algorithm's vote is worth 0.25: row 0 only it disagrees on, row 1 both, row 2 only the first
    assert np.allclose(sg.disagreement(primary, others, [1.0, 0.25]), [0.125, 0.625, 0.5])
    assert np.allclose(sg.disagreement(primary, others, [1.0, 1.0]), sg.disagreement(primary, others))
    assert np.allclose(sg.disagreement(primary, others, [0.0, 0.0]), [0, 0, 0])


@pytest.mark.parametrize(("wins", "losses", "expected"), [
    (0, 0, 1.0),            # no record: a full vote
    (5, 5, 1.0),            # right as often as the primary where they disagree
    (9, 1, 1.0),            # better than the primary: capped at a full vote
    (0, 10, 2 / 12),        # always wrong where it disagrees
    (2, 8, 2 * 3 / 12),
])
def test_credibility_is_twice_the_laplace_estimate_of_winning_a_disagreement(wins, losses, expected):
    assert sg.credibility(wins, losses) == pytest.approx(expected)


def test_credibility_rejects_negative_counts():
    with pytest.raises(ValueError, match="wins and losses must be >= 0, got -1 and 0"):
        sg.credibility(-1, 0)


def test_an_algorithm_without_credibility_does_not_lift_a_confident_document():
    P = [[0.95, 0.05, 0.0]] * 3 + [[0.7, 0.3, 0.0]]
    votes = [[0.0, 1.0, 0.0], [1.0, 0, 0], [1.0, 0, 0], [1.0, 0, 0]]
    trusted = sg.ModelView("other", np.asarray(votes), ["a", "b", "c"])
    doubted = sg.ModelView("other", np.asarray(votes), ["a", "b", "c"], credibility=sg.credibility(0, 30))
    args = (["d0", "d1", "d2", "d3"], distinct_rows(4), view(P))
    assert sg.rank(*args, [trusted], {"a": 9, "b": 9, "c": 9}, 1, 1, density=False)[0].id == "d0"
    # worth 2/32 of a vote, d0's disagreement (0.8 x 1/16) no longer beats d3's margin (1 - 0.4)
    out = sg.rank(*args, [doubted], {"a": 9, "b": 9, "c": 9}, 1, 1, density=False)
    assert out[0].id == "d3" and out[0].reason == "uncertain"


def test_rare_class_scores_weight_classes_by_how_few_seeds_they_have():
    P = np.array([[0.9, 0.1, 0.0], [0.1, 0.9, 0.0], [0.0, 0.2, 0.8]])
    s = sg.rare_class_scores(P, ["a", "b", "new-1"], {"a": 10, "b": 1}, frozenset({"new-1"}), rare_below=5)
    # a has 10 seeds (not rare), b has 1 of 5 (weight 0.8), new-1 is a discovered cluster (not a class)
    assert np.allclose(s, [0.1 * 0.8, 0.9 * 0.8, 0.2 * 0.8])


def test_typicality_is_the_cosine_to_the_group_mean():
    X = sg.normalize_rows(sp.csr_matrix(np.array([[1.0, 0, 0], [1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0]])))
    t = sg.typicality(X, np.array([0, 0, 1, 1]))
    # group 0: two identical rows (cosine 1); group 1: two orthogonal rows (each 1/sqrt(2) from their mean)
    assert np.allclose(t, [1.0, 1.0, 2 ** -0.5, 2 ** -0.5])


def test_coverage_is_the_distance_to_the_nearest_seed():
    X = sg.normalize_rows(sp.csr_matrix(np.array([[1.0, 0, 0], [0, 1.0, 0], [1.0, 1.0, 0]])))
    seeds = sg.normalize_rows(sp.csr_matrix(np.array([[2.0, 0, 0], [0, 0, 1.0]])))
    assert np.allclose(sg.coverage(X, seeds), [0.0, 1.0, 1 - 2 ** -0.5])
    assert np.allclose(sg.coverage(X, seeds[:0]), [1, 1, 1])


def test_the_coverage_factor_prefers_documents_far_from_the_seeds():
    # d0 and d1 equally uncertain; d0 repeats a seed's terms, d1 does not
    X = sp.csr_matrix(np.array([[1.0, 0, 0], [0, 1.0, 0]]))
    P = [[0.5, 0.5, 0], [0.5, 0.5, 0]]
    seeds = sp.csr_matrix(np.array([[3.0, 0, 0]]))
    out = sg.rank(["d0", "d1"], X, view(P), [], {"a": 9, "b": 9}, 1, 1, density=False, seeds_X=seeds,
                  coverage_power=1.0)
    assert out[0].id == "d1"
    out = sg.rank(["d0", "d1"], X, view(P), [], {"a": 9, "b": 9}, 1, 1, density=False, seeds_X=seeds,
                  coverage_power=0.0)
    assert out[0].id == "d0", "without the factor the tie goes to the first row"


def test_rank_orders_by_margin_when_nothing_else_differs():
    P = [[0.6, 0.4, 0.0], [0.98, 0.01, 0.01], [0.34, 0.33, 0.33], [0.8, 0.2, 0.0]]
    out = sg.rank(["d0", "d1", "d2", "d3"], distinct_rows(4), view(P), [], {"a": 9, "b": 9, "c": 9}, 4, 7,
                  density=False, max_similarity=0.99)
    assert [s.id for s in out] == ["d2", "d0", "d3", "d1"]
    assert [s.rank for s in out] == [0, 1, 2, 3]
    assert {s.reason for s in out} == {"uncertain"} and {s.model_version for s in out} == {7}
    assert out[0].scores == {"a": 0.34, "b": 0.33, "c": 0.33} and out[0].label == "a"
    assert all(len(s.scores) <= 3 for s in out)


def test_disagreement_of_the_enabled_algorithms_lifts_a_confident_document():
    P = [[0.95, 0.05, 0.0]] * 3 + [[0.7, 0.3, 0.0]]
    other = view([[0.0, 1.0, 0.0], [1.0, 0, 0], [1.0, 0, 0], [1.0, 0, 0]], name="other")
    out = sg.rank(["d0", "d1", "d2", "d3"], distinct_rows(4), view(P), [other], {"a": 9, "b": 9, "c": 9}, 2, 1,
                  density=False)
    assert out[0].id == "d0" and out[0].reason == "disagreement"
    # the other algorithm asked about a sample only: rows outside it count as agreeing
    sampled = view([[0.0, 1.0, 0.0]], rows=np.array([3]), name="other")
    out = sg.rank(["d0", "d1", "d2", "d3"], distinct_rows(4), view(P), [sampled], {"a": 9, "b": 9, "c": 9}, 1, 1,
                  density=False)
    assert out[0].id == "d3" and out[0].reason == "disagreement"


def test_near_duplicates_are_never_suggested_together():
    X = distinct_rows(4).tolil()
    X[1, 0] = 1.0
    X[1, 1] = 0.0   # d1 = d0 (the same terms)
    P = [[0.5, 0.5, 0.0], [0.5, 0.5, 0.0], [0.6, 0.4, 0.0], [0.9, 0.1, 0.0]]
    out = sg.rank(["d0", "d1", "d2", "d3"], sp.csr_matrix(X), view(P), [], {"a": 9, "b": 9}, 3, 1, density=False)
    ids = [s.id for s in out]
    assert ids == ["d0", "d2", "d3"], "d1 is a near-duplicate of d0: skipped although it ranks second"


def test_suggestions_spread_over_the_predicted_classes():
    # the four most uncertain documents are all predicted 'a'; with two suggestions, one goes to each class
    P = [[0.5, 0.5, 0]] * 4 + [[0.3, 0.7, 0]] * 2
    out = sg.rank([f"d{i}" for i in range(6)], distinct_rows(6), view(P), [], {"a": 9, "b": 9}, 2, 1, density=False,
                  diversity="classes")
    assert sorted(s.label for s in out) == ["a", "b"]
    # the second pass fills the list beyond the per-class share
    out = sg.rank([f"d{i}" for i in range(6)], distinct_rows(6), view(P), [], {"a": 9, "b": 9}, 5, 1, density=False,
                  diversity="classes")
    assert len(out) == 5 and len({s.id for s in out}) == 5


def test_top_rows_orders_by_priority_with_ties_by_row():
    pr = np.array([0.2, 0.9, 0.5, 0.9, 0.1])
    assert sg.top_rows(pr, 3).tolist() == [1, 3, 2]
    assert sg.top_rows(pr, 10).tolist() == [1, 3, 2, 0, 4]
    assert sg.top_rows(pr, 0).size == 0


def test_balanced_pool_takes_each_class_in_turn_and_lists_it_by_priority():
    pr = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.1])
    groups = np.array([0, 0, 0, 0, 1, 1, 2])
    # round one: each class's best (rows 0, 4, 6); round two: row 1 before row 5 (higher priority)
    assert sg.balanced_top_rows(pr, groups, 4).tolist() == [0, 1, 4, 6]
    assert sg.balanced_top_rows(pr, groups, 5).tolist() == [0, 1, 4, 5, 6]
    assert sg.balanced_top_rows(pr, groups, 99).tolist() == [0, 1, 2, 3, 4, 5, 6]
    assert sg.balanced_top_rows(pr, groups, 0).size == 0
    # one class: the same pool as by priority; ties within a class: lower row first
    assert sg.balanced_top_rows(pr, np.zeros(7, dtype=int), 3).tolist() == sg.top_rows(pr, 3).tolist()
    assert sg.balanced_top_rows(np.array([0.5, 0.5, 0.5]), np.array([1, 1, 0]), 2).tolist() == [0, 2]


def test_the_pool_balance_decides_which_rows_the_diversity_pass_sees():
    X = sp.csr_matrix(np.eye(6))
    pr = np.array([1.0, 0.9, 0.8, 0.7, 0.2, 0.1])
    groups = np.array([0, 0, 0, 0, 1, 1])
    kw = dict(max_similarity=0.9, diversity="classes", pool=2)
    # by priority the pool is rows 0 and 1 (class 0 only); balanced, rows 0 and 4
    assert sg.select_diverse(pr, X, groups, 2, balance="priority", **kw).tolist() == [0, 1]
    assert sg.select_diverse(pr, X, groups, 2, balance="classes", **kw).tolist() == [0, 4]
    with pytest.raises(ValueError, match="balance must be one of"):
        sg.select_diverse(pr, X, groups, 2, balance="sideways", **kw)


def three_topics() -> sp.csr_matrix:
    """Six documents in three pairs: each pair shares its terms (cosine 0.8), pairs share none."""
    X = np.zeros((6, 6))
    for i in range(6):
        X[i, 2 * (i // 2)] = 0.5 if i % 2 else 1.0
        X[i, 2 * (i // 2) + 1] = 1.0 if i % 2 else 0.5
    return sg.normalize_rows(sp.csr_matrix(X))


def test_pool_clusters_groups_similar_rows_and_starts_at_the_heaviest():
    Xn = three_topics()
    G = (Xn @ Xn.T).toarray()
    labels = sg.pool_clusters(G, np.ones(6), 3)
    assert labels[0] == labels[1] and labels[2] == labels[3] and labels[4] == labels[5]
    assert len(set(labels.tolist())) == 3
    # two clusters for three topics, equal weights: pairs are never split
    labels = sg.pool_clusters(G, np.ones(6), 2)
    assert labels.tolist() == [0, 0, 1, 1, 0, 0]
    # weights pull centres: a heavy pair gets a centre per row (weighted farthest-first: 5 * 0.2 > 0.1 * 1)
    labels = sg.pool_clusters(G, np.array([0.1, 0.1, 5.0, 5.0, 0.1, 0.1]), 2)
    assert labels[2] != labels[3]
    # never more clusters than distinct rows; empty pool
    assert sg.pool_clusters(np.ones((3, 3)), np.ones(3), 3).tolist() == [0, 0, 0]
    assert sg.pool_clusters(np.zeros((0, 0)), np.zeros(0), 2).size == 0


def test_cluster_diversity_takes_the_best_of_each_cluster_of_the_pool():
    Xn = three_topics()
    # the two most uncertain documents are one topic (cosine 0.8 < max_similarity: not near-duplicates)
    pr = np.array([1.0, 0.95, 0.5, 0.4, 0.3, 0.2])
    by_class = sg.select_diverse(pr, Xn, np.zeros(6, dtype=int), 3, max_similarity=0.9, diversity="classes")
    assert by_class.tolist() == [0, 1, 2], "one predicted class: priority order"
    by_cluster = sg.select_diverse(pr, Xn, np.zeros(6, dtype=int), 3, max_similarity=0.9, diversity="clusters")
    assert by_cluster.tolist() == [0, 2, 4], "one per topic, the most uncertain of each"
    with pytest.raises(ValueError, match="diversity"):
        sg.select_diverse(pr, Xn, np.zeros(6, dtype=int), 3, diversity="both")


def test_centre_similarity_is_the_weighted_mean_cosine_to_the_cluster():
    G = np.array([[1.0, 0.5, 0.0], [0.5, 1.0, 0.0], [0.0, 0.0, 1.0]])
    out = sg.centre_similarity(G, np.array([1.0, 3.0, 1.0]), np.array([0, 0, 1]))
    assert np.allclose(out, [(1.0 + 3 * 0.5) / 4, (0.5 + 3 * 1.0) / 4, 1.0])


def test_centre_diversity_takes_the_most_central_member_of_each_cluster():
    # two topics of three documents; the most uncertain of each topic is its least central member
    X = sp.csr_matrix(np.array([[1, 0, 0], [0.9, 0.3, 0], [1, 0.1, 0], [0, 0, 1], [0.1, 0, 1], [0.3, 0, 1]]))
    Xn = sg.normalize_rows(X)
    pr = np.array([1.0, 0.9, 0.8, 0.7, 0.6, 0.5])
    groups = np.zeros(6, dtype=int)
    assert sg.select_diverse(pr, Xn, groups, 2, max_similarity=1.1, diversity="clusters").tolist() == [0, 3]
    # the most central of each cluster (rows 2 and 4), listed in priority order
    assert sg.select_diverse(pr, Xn, groups, 2, max_similarity=1.1, diversity="centres").tolist() == [2, 4]
    # a pinned row (a discovered cluster's representative) is taken whatever its centrality
    pinned = np.array([False, True, False, False, False, False])
    assert sg.select_diverse(pr, Xn, groups, 2, max_similarity=1.1, diversity="centres",
                             pinned=pinned).tolist() == [1, 4]


def test_a_likely_member_of_a_class_with_few_seeds_is_a_rare_class_suggestion():
    P = [[0.97, 0.03, 0.0], [0.03, 0.97, 0.0], [0.96, 0.04, 0.0]]
    out = sg.rank(["d0", "d1", "d2"], distinct_rows(3), view(P, classes=("a", "b")[:2] + ("c",)), [],
                  {"a": 50, "b": 1, "c": 50}, 1, 1, density=False)
    assert out[0].id == "d1" and out[0].reason == "rare_class"


def test_the_most_typical_document_of_a_discovered_cluster_comes_first():
    # d1..d3 are in new-1; d2 and d3 share terms (typical), d1 is an outlier; d0 is the most uncertain
    X = sp.csr_matrix(np.array([[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 1], [0, 0, 1, 1.2]], dtype=float))
    P = [[0.5, 0.5], [0.1, 0.9], [0.05, 0.95], [0.2, 0.8]]
    out = sg.rank(["d0", "d1", "d2", "d3"], X, view(P, classes=("a", "new-1"), new=("new-1",)), [], {"a": 9}, 2, 1,
                  max_similarity=0.999)
    assert out[0].reason == "new_cluster" and out[0].id in ("d2", "d3") and out[0].label == "new-1"
    assert [s.reason for s in out].count("new_cluster") == 1, "one representative per discovered cluster"


def test_rank_bounds_and_empty_input():
    assert sg.rank([], distinct_rows(0), view(np.zeros((0, 3))), [], {}, 5, 1) == []
    assert sg.rank(["d0"], distinct_rows(1), view([[1, 0, 0]]), [], {}, 0, 1) == []
    P = np.random.default_rng(0).dirichlet(np.ones(3), size=500)
    X = sp.random(500, 300, density=0.05, format="csr", random_state=0)
    out = sg.rank([f"d{i}" for i in range(500)], X, view(P), [], {}, 20, 1)
    assert len(out) == 20 and len({s.id for s in out}) == 20
    assert all(out[i].priority >= 0 for i in range(20))


def test_disagreement_sample_is_bounded_and_keeps_the_least_certain_rows():
    P = np.random.default_rng(1).dirichlet(np.ones(4), size=5000)
    rows = sg.disagreement_sample(P, 1000)
    assert rows.size <= 1000 and np.all(np.diff(rows) > 0)
    least = np.argsort(sg.margins(P))[:500]
    assert set(least) <= set(rows)
    assert np.array_equal(sg.disagreement_sample(P[:10], 1000), np.arange(10))


def test_candidate_sample_bounds_the_ranked_documents_and_changes_with_the_round():
    assert np.array_equal(sg.candidate_sample(10, 20, seed=1), np.arange(10))
    a, b = sg.candidate_sample(10000, 2000, seed=1), sg.candidate_sample(10000, 2000, seed=2)
    assert a.size == b.size == 2000 and np.all(np.diff(a) > 0) and a.max() < 10000
    assert np.array_equal(a, sg.candidate_sample(10000, 2000, seed=1)), "the same round, the same sample"
    assert not np.array_equal(a, b), "each round ranks a fresh sample"


# ---------------------------------------------------------------- the board: bounds, tombstones
def suggestion(i: int, label: str = "a") -> sg.Suggestion:
    return sg.Suggestion(f"d{i}", "constrained-kmeans", label, {label: 0.5}, "uncertain", 1.0 - i / 100, i, 3)


def test_board_publishes_top_n_then_tombstones_what_leaves_the_list_or_gets_labelled():
    board = sg.SuggestionBoard(3)
    texts = {f"d{i}": "word " * 200 for i in range(10)}
    open_ids = set(texts)
    board.offer([suggestion(i) for i in range(5)])
    out = board.updates(texts.get, open_ids.__contains__, 100.0)
    assert [k for k, _ in out] == ["d0", "d1", "d2"] and all(m is not None for _, m in out)
    for _, m in out:
        jsonschema.validate(m, SCHEMA)
        assert len(m["snippet"]) <= 300 and m["ts"] == 100.0
    assert board.updates(texts.get, open_ids.__contains__, 101.0) == [], "nothing changed, nothing sent"
    open_ids.discard("d1")  # labelled (or left the window)
    assert board.updates(texts.get, open_ids.__contains__, 102.0) == [("d1", None)]
    # a new ranking: d0 drops out, d2 stays; ranks are renumbered over the open documents
    board.offer([suggestion(2), suggestion(1), suggestion(7)])
    out = dict(board.updates(texts.get, open_ids.__contains__, 103.0))
    assert out.pop("d0") is None
    assert {k: m["rank"] for k, m in out.items()} == {"d2": 0, "d7": 1}
    assert set(board.published) == {"d2", "d7"}


def test_board_tombstones_what_a_previous_run_left_behind():
    board = sg.SuggestionBoard(3)
    texts = {f"d{i}": "text" for i in range(10)}
    assert board.adopt(["old1", "d5", "d6"]) == 3
    # before a ranking: ids that are not open (no document, or labelled) go at once, open ones wait
    assert board.updates(texts.get, texts.__contains__, 1.0) == [("old1", None)]
    assert board.stale == {"d5", "d6"}
    # the first ranking keeps the ids it lists and tombstones the others
    board.offer([suggestion(5), suggestion(1)])
    out = board.updates(texts.get, texts.__contains__, 2.0)
    assert ("d6", None) in out and ("d5", None) not in out and board.stale == set()
    assert [k for k, m in out if m is not None] == ["d5", "d1"]
    # bounded: at most STALE_FACTOR * top_n ids are remembered (the newest)
    many = [f"x{i}" for i in range(1000)]
    assert board.adopt(many) == sg.STALE_FACTOR * 3 and "x999" in board.stale and "x0" not in board.stale


def test_board_remembers_what_it_suggested_within_a_bound():
    board = sg.SuggestionBoard(2)
    texts = {f"d{i}": "text" for i in range(200)}
    open_ids = set(texts)
    assert not board.was_suggested("d0"), "nothing published yet"
    board.offer([suggestion(0), suggestion(1), suggestion(2)])
    board.updates(texts.get, open_ids.__contains__, 1.0)
    assert board.was_suggested("d0") and board.was_suggested("d1") and not board.was_suggested("d2")
    open_ids.discard("d0")   # labelled: tombstoned, and still known to have come from the queue
    board.updates(texts.get, open_ids.__contains__, 2.0)
    assert "d0" not in board.published and board.was_suggested("d0")
    board.offer([suggestion(5), suggestion(6)])   # d1 leaves the list: a label of it later still came from it
    board.updates(texts.get, open_ids.__contains__, 3.0)
    assert board.was_suggested("d1") and board.was_suggested("d5")
    # bounded: RECENT_FACTOR * top_n ids besides the published ones, the newest kept
    for r in range(100):
        board.offer([suggestion(10 + 2 * (r % 90)), suggestion(11 + 2 * (r % 90))])
        board.updates(texts.get, open_ids.__contains__, 4.0 + r)
    assert len(board._recent) <= sg.RECENT_FACTOR * 2
    assert not board.was_suggested("d0") and board.was_suggested("d187")
    board.adopt(["old"])   # a previous run's suggestion counts too
    assert board.was_suggested("old")


def test_board_is_bounded_in_bytes():
    board = sg.SuggestionBoard(50, max_bytes=3 * (sg.SUGGESTION_OVERHEAD_BYTES + 400))
    texts = {f"d{i}": "é" * 1000 for i in range(50)}
    board.offer([suggestion(i) for i in range(50)])
    out = board.updates(texts.get, lambda k: True, 1.0)
    assert 1 <= len(out) <= 3 and board.nbytes <= board.max_bytes
    assert board.nbytes == sum(sg.message_bytes(m) for m in board.published.values())


# ---------------------------------------------------------------- the engine hook
@pytest.fixture(scope="module")
def r8():
    ds = datasets.load("reuters-r8")
    order = np.random.default_rng(5).permutation(len(ds))[:1500]
    return ds, [int(i) for i in order]


def seeded_engine(r8, n_docs: int, n_seeds: int, **kw) -> Engine:
    """An engine with the first ``n_docs`` R8 documents in its window, the first ``n_seeds`` of them seeds."""
    ds, order = r8
    eng = Engine(engine_cfg(**kw))
    eng.process([Document(id=f"r{i}", text=ds.texts[i]) for i in order[:n_docs]])
    for i in order[:n_seeds]:
        eng.label(f"r{i}", [ds.labels[i]])
    return eng


def engine_cfg(**kw) -> EngineConfig:
    base = dict(algorithms=["constrained-kmeans", "seeded-kmeans"], background_refit=False, n_features=2**16,
                refit_every_docs=0, min_docs_first_refit=100, drift_detection=False, min_seed_classes=2,
                min_seeds_per_class=1, first_fit_stable_seeds=0, refit_growth=0, refit_idle_s=0, revisions="off",
                suggestions_top_n=30)
    base.update(kw)
    return EngineConfig(**base)


def test_engine_ranks_after_a_refit_round_and_tombstones_labelled_and_evicted_documents(r8):
    ds, order = r8
    eng = Engine(engine_cfg(window_max_docs=1200))
    eng.process([Document(id=f"r{i}", text=ds.texts[i]) for i in order[:1000]])
    seeds = order[:40]
    for i in seeds:
        eng.label(f"r{i}", [ds.labels[i]])
    assert eng.suggestion_updates() == [], "no model, no suggestions"
    eng.request_refit()
    out = eng.suggestion_updates()
    msgs = [m for _, m in out]
    assert len(msgs) == 30 and all(m is not None for m in msgs)
    for m in msgs:
        jsonschema.validate(m, SCHEMA)
    assert [m["rank"] for m in msgs] == list(range(30))
    assert {m["id"] for m in msgs}.isdisjoint({f"r{i}" for i in seeds}), "seeds are never suggested"
    assert {m["model_version"] for m in msgs} == {eng.models[eng.primary].version}
    assert {m["algorithm"] for m in msgs} == {eng.primary}
    by_id = {f"r{i}": i for i in order}
    assert all(m["snippet"] == sg.snippet(ds.texts[by_id[m["id"]]]) for m in msgs)
    assert eng.suggestions() == msgs
    # near-duplicates: no two suggestions whose term vectors have cosine above the threshold
    rows = sg.normalize_rows(eng.featurizer.transform([ds.texts[by_id[m["id"]]] for m in msgs], update_sketch=False))
    G = (rows @ rows.T).toarray()
    assert (G[~np.eye(len(msgs), dtype=bool)] <= sg.MAX_SIMILARITY + 1e-9).all()
    # a seed for a suggested document: a tombstone at the next call, and only for it
    first = msgs[0]["id"]
    eng.label(first, [ds.labels[by_id[first]]])
    assert eng.suggestion_updates() == [(first, None)]
    # documents pushed out of the window: tombstones
    eng.process([Document(id=f"n{i}", text=ds.texts[i]) for i in order[1000:1500]])
    gone = [m["id"] for m in msgs[1:] if m["id"] not in eng.window]
    assert gone and sorted(k for k, m in eng.suggestion_updates() if m is None) == sorted(gone)
    # the next round replaces the list (the remaining old ones that dropped out are tombstoned)
    eng.request_refit()
    out = eng.suggestion_updates()
    assert len([m for _, m in out if m is not None]) == 30
    assert len(eng.suggestion_board.published) == 30
    assert eng.last_suggestion_seconds > 0


def test_engine_without_suggestions_ranks_nothing(r8):
    eng = seeded_engine(r8, 300, 30, suggestions_top_n=0)
    eng.request_refit()
    assert eng.ready and eng.suggestion_updates() == [] and eng.last_suggestion_seconds == 0.0


def test_a_failing_ranking_keeps_the_refit(r8, monkeypatch):
    eng = seeded_engine(r8, 300, 30)

    def broken(*a, **k):
        raise RuntimeError("ranking bug")

    monkeypatch.setattr(sg, "rank", broken)
    eng.request_refit()
    assert eng.ready and eng.suggestion_updates() == []


def test_engine_weighs_votes_by_who_was_right_on_unseen_seeds(r8, monkeypatch):
    ds, order = r8
    eng = seeded_engine(r8, 1000, 40)
    eng.request_refit()
    assert eng.vote_credibility("seeded-kmeans") == 1.0, "no record yet: a full vote"
    new = order[40:140]
    for i in new:
        eng.label(f"r{i}", [ds.labels[i]])
    eng.check_seeds()
    paired = list(eng._paired_checks)
    assert len(paired) == len(new) and all(set(p) == {"constrained-kmeans", "seeded-kmeans"} for p in paired)
    # the paired record is the same verdicts as each algorithm's prequential accuracy
    for name in ("constrained-kmeans", "seeded-kmeans"):
        assert [p[name] for p in paired] == list(eng._seed_checks[name])[-len(new):]
    wins = sum(p["seeded-kmeans"] and not p["constrained-kmeans"] for p in paired)
    losses = sum(p["constrained-kmeans"] and not p["seeded-kmeans"] for p in paired)
    assert eng.vote_credibility("seeded-kmeans") == pytest.approx(sg.credibility(wins, losses))
    # a record the other algorithm loses: its vote reaches the ranking weighed down
    eng._paired_checks.clear()
    eng._paired_checks.extend([{"constrained-kmeans": True, "seeded-kmeans": False}] * 10)
    seen = []
    real_rank = sg.rank

    def spy(ids, X, primary, others, *a, **k):
        seen.append({v.name: v.credibility for v in others})
        return real_rank(ids, X, primary, others, *a, **k)

    monkeypatch.setattr(sg, "rank", spy)
    eng.request_refit()
    assert seen == [{"seeded-kmeans": pytest.approx(2 / 12)}]
    gauge = eng.telemetry.registry.get_sample_value("streamsemi_suggestion_vote_weight", {"algorithm": "seeded-kmeans"})
    assert gauge == pytest.approx(2 / 12), "the weight is on the worker's metrics"
    # the primary changes: the new primary's gauge reads 1, not the weight it had as a voter
    eng.primary = "seeded-kmeans"
    eng.request_refit()
    assert eng.telemetry.registry.get_sample_value("streamsemi_suggestion_vote_weight",
                                                   {"algorithm": "seeded-kmeans"}) == 1.0


def test_seeds_labelled_from_the_queue_do_not_judge_the_stream_accuracy_nor_the_primary(r8):
    ds, order = r8
    eng = seeded_engine(r8, 1000, 40, primary="auto")
    eng.request_refit()
    queued = [m["id"] for _, m in eng.suggestion_updates() if m is not None]
    truth = {f"r{i}": ds.labels[i] for i in order}
    for doc_id in queued:
        eng.label(doc_id, [truth[doc_id]])
    eng.check_seeds()
    assert len(queued) >= PRIMARY_MIN_CHECKS
    assert eng._kfold_accuracy and eng.held_out_accuracy() == eng._kfold_accuracy, "queue seeds alone: k-fold"
    others = [f"r{i}" for i in order[40:1000] if f"r{i}" not in set(queued)][:50]
    for doc_id in others:
        eng.label(doc_id, [truth[doc_id]])
    eng.check_seeds()
    for name in ("constrained-kmeans", "seeded-kmeans"):
        assert len(eng._suggested_checks[name]) == len(queued) == 30
        assert len(eng._seed_checks[name]) == len(others)
    # each gauge reads its own record
    reg = eng.telemetry.registry
    for gauge, record in (("streamsemi_seed_accuracy", eng._seed_checks),
                          ("streamsemi_suggested_seed_accuracy", eng._suggested_checks)):
        got = reg.get_sample_value(gauge, {"algorithm": "constrained-kmeans"})
        assert got == pytest.approx(np.mean(record["constrained-kmeans"]))
    # both kinds reach the record that weighs the suggestions' votes
    assert len(eng._paired_checks) == len(queued) + len(others)
    # the queue's documents are the primary's hard ones: a record where only they tell the algorithms apart
    # does not move the primary; the same record on seeds the queue did not pick does
    primary, other = eng.primary, next(a for a in eng.config.algorithms if a != eng.primary)
    for name, hits in ((primary, [False] * 200), (other, [True] * 200)):
        eng._suggested_checks[name].extend(hits)
        eng._seed_checks[name].clear()
        eng._seed_checks[name].extend([True, False] * 50)
    eng._choose_primary()
    assert eng.primary == primary
    eng._seed_checks[primary].extend([False] * 200)
    eng._seed_checks[other].extend([True] * 200)
    eng._choose_primary()
    assert eng.primary == other


@pytest.mark.parametrize(("host", "served"), [("127.0.0.1", True), ("localhost", True), ("::1", True),
                                             ("0.0.0.0", False), ("10.1.2.3", False), ("::", False)])
def test_suggestions_route_only_on_a_loopback_metrics_host(host, served):
    """Snippets are document text and the metrics server has no token: worker and refitter serve
    ``/suggestions`` on a loopback address only."""
    from streamsemi.service.config import resolve
    from streamsemi.service.worker import suggestion_routes

    eng = Engine(EngineConfig(algorithms=["constrained-kmeans"]))
    routes = suggestion_routes(resolve({"metrics_host": host}), eng)
    assert (routes == {"/suggestions": eng.suggestions}) is served


# ---------------------------------------------------------------- a real worker on the embedded broker
def test_worker_publishes_suggestions_after_its_first_refit_and_a_seed_tombstones_one(broker, tmp_path):
    topics = Topics()
    suggestions_topic = topics.suggestions
    worker = WorkerProcess(broker.bootstrap, topics, ["--refit-every-docs", "0", "--min-docs-first-refit", "150",
                                                      "--suggestions-top-n", "10", "--refit-growth", "0"],
                           log_dir=tmp_path)
    ds = datasets.load("reuters-r8")
    p = producer(broker.bootstrap)
    # a suggestion a previous run left behind: the worker tombstones it (its document is not in the window)
    ghost = {"id": "ghost", "snippet": "old", "algorithm": "constrained-kmeans", "label": "grain",
             "scores": {"grain": 0.5}, "reason": "uncertain", "priority": 0.5, "rank": 0, "model_version": 1, "ts": 1.0}
    topics.create(broker.bootstrap)
    send_json(p, suggestions_topic, ghost, key="ghost")
    p.flush()
    worker.start()
    try:
        assert worker.wait_assigned(), "the worker joined its group"
        seeded = set()
        for k in range(300):
            send_json(p, topics.documents, {"id": f"g{k}", "text": ds.texts[k]}, key=f"g{k}")
            if k < 40:
                send_json(p, topics.control, {"op": "label", "id": f"g{k}", "labels": [ds.labels[k]]}, key=f"g{k}")
                seeded.add(f"g{k}")
        p.flush()
        records = [r for r in read_topic(broker.bootstrap, suggestions_topic, expect=12)
                   if r.key != b"ghost"]
        msgs = [json.loads(r.value) for r in records if r.value is not None]
        assert len(msgs) >= 10
        for m, r in zip(msgs, records, strict=False):
            jsonschema.validate(m, SCHEMA)
            assert r.key.decode() == m["id"]
        assert {m["id"] for m in msgs}.isdisjoint(seeded) and {m["rank"] for m in msgs[:10]} == set(range(10))
        code, body = worker.get("/suggestions")
        assert code == 200 and {m["id"] for m in json.loads(body)} == {m["id"] for m in msgs[:10]}
        target = msgs[0]["id"]
        send_json(p, topics.control, {"op": "label", "id": target, "labels": [ds.labels[int(target[1:])]]},
                  key=target)
        p.flush()

        def tombstoned() -> bool:
            recs = read_topic(broker.bootstrap, suggestions_topic, idle=1.0)
            return any(r.key.decode() == target and r.value is None for r in recs)

        wait_for(tombstoned, DEADLINE, "the suggested document's tombstone once it is a seed", 1.0)
        wait_for(lambda: target not in worker.get("/suggestions")[1], DEADLINE, "the seed off the worker's queue")
        ghost_records = [r for r in read_topic(broker.bootstrap, suggestions_topic, idle=1.0)
                         if r.key == b"ghost"]
        assert ghost_records[-1].value is None, "a suggestion left by a previous run is tombstoned"
        # the queue's seed is judged apart: it does not count toward the stream's held-out accuracy
        ck = {"algorithm": "constrained-kmeans"}
        wait_for(lambda: worker.metric("streamsemi_suggested_seed_accuracy", ck) is not None, DEADLINE,
                 "the queue seed's accuracy")
        assert worker.metric("streamsemi_seed_accuracy", ck) is None, "no seed from outside the queue was judged"

        def ranked_after_the_seed() -> bool:   # the seed's refit round published its list: none pending
            listed = json.loads(worker.get("/suggestions")[1])
            return bool(listed) and min(m["model_version"] for m in listed) >= 2 and not worker.metric(
                "streamsemi_refit_in_progress")

        wait_for(ranked_after_the_seed, DEADLINE, "the queue ranked by the seed's model")
        ever = {r.key.decode() for r in read_topic(broker.bootstrap, suggestions_topic, idle=1.0)}
        other = next(f"g{k}" for k in range(299, 40, -1) if f"g{k}" not in ever)
        send_json(p, topics.control, {"op": "label", "id": other, "labels": [ds.labels[int(other[1:])]]}, key=other)
        p.flush()
        wait_for(lambda: worker.metric("streamsemi_seed_accuracy", ck) is not None, DEADLINE,
                 "the accuracy of a seed from outside the queue")
        assert worker.proc.poll() is None
    finally:
        assert worker.terminate() == 0


def _benchmark_module(name: str = "active_learning"):
    """``benchmarks/<name>.py`` imported as a module (registered in ``sys.modules``: the
    dataclasses of served_quality look their module up)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"{name}_bench", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_label_efficiency_curves_stop_at_exactly_the_target_fraction():
    al = _benchmark_module()
    # 20NG comp.*: floor(0.02 * 4869) = 97, budget round(0.03 * 4869) = 146
    assert al.checkpoints(4869, 146, 0.02) == [97, 146]
    assert al.checkpoints(7674, 230, 0.02) == [153, 230]
    assert al.checkpoints(500, 10, 0.02) == [10], "floor(0.02 * 500) = 10 is the budget itself"
    assert al.checkpoints(100, 1, 0.5) == [1], "a target past the budget is no checkpoint"
    # the curve's batches: k per refit, cut short at the checkpoint, then k again
    n, k, stops = 10, 10, al.checkpoints(4869, 146, 0.02)
    seen = [n]
    while n < stops[-1]:
        n += al.batch_size(n, k, stops)
        seen.append(n)
    assert al.batch_size(146, 10, stops) == 0, "nothing past the budget"
    assert seen[8:12] == [90, 97, 107, 117] and seen[-1] == 146
    curve = [{"fraction": c / 4869, "macro_f1": f} for c, f in ((90, 0.70), (97, 0.80), (107, 0.75))]
    assert al.at_fraction(curve, 0.02) == 0.80 and al.first_reaching(curve, 0.78) == 97 / 4869


def test_label_efficiency_window_is_exactly_full_when_the_engine_rejects_a_document():
    al = _benchmark_module()
    texts = ["how", *[f"grain wheat harvest {i}" if i % 2 else f"oil crude barrel {i}" for i in range(9)]]
    order = np.arange(len(texts))[::-1]
    eng, ids = al.windowed(texts, order, al.engine_config(["constrained-kmeans"], len(texts), 5))
    # the stop-word-only document is rejected; the others fill the window to its size, so refits warm-start
    assert "d0" not in ids and ids == [f"d{i}" for i in order if i != 0]
    assert len(eng.window) == eng.config.window_max_docs == len(texts) - 1


def test_queue_benchmark_scores_what_the_primary_serves_on_documents_nobody_labelled():
    sq = _benchmark_module("served_quality")
    ds = datasets.load("reuters-r8")
    order = list(range(6))
    stream = sq.Stream("r8", ds, order, {0}, 0.01)
    ids = stream.ids
    truth = [stream.truth(i) for i in order]
    wrong = next(c for c in sorted(set(ds.labels)) if c != truth[3])

    def rec(i, alg, label, primary):
        return ({"id": ids[i], "algorithm": alg, "label": label, "primary": primary}, 0, 0, 0.0)

    records = [rec(i, "a", truth[i], True) for i in range(6)] + [rec(i, "b", truth[i], False) for i in range(6)]
    # the primary moves to b, which serves a wrong label of document 3 from then on; document 2 is labelled
    records += [rec(3, "a", truth[3], False), rec(3, "b", wrong, True)]
    run = {"records": records, "events": [{"event": "primary_changed", "previous": "a", "primary": "b"}],
           "annotation": {"labelled": [ids[2]], "rounds": []}}
    res = sq.score_queue(stream, ["a", "b"], run)
    assert res["documents_scored"] == 4 and res["labelled_from_queue"] == 1   # not the seed, not the labelled one
    rest = [truth[i] for i in (1, 3, 4, 5)]
    assert res["served_primary"] == pytest.approx(sq.score(rest, [truth[1], wrong, truth[4], truth[5]]))
    assert res["served_primary"] < 1.0 and res["latest"]["a"] == 1.0
    assert res["served_primary_algorithms"] == {"a": 3, "b": 1}
    assert res["primary_changes"][0]["primary"] == "b"


def test_class_report_counts_f1_predictions_and_where_a_class_takes_documents_from():
    al = _benchmark_module()
    y_true = ["a", "a", "a", "b", "b", "c"]
    y_pred = ["a", "b", "b", "b", "b", "b"]
    rep = al.class_report(y_true, y_pred, ["a", "b", "c"], {"a": 2, "b": 1})
    assert rep["a"] == {"f1": pytest.approx(2 * 1 / (1 + 3), abs=1e-4), "predicted": 1, "true": 3, "seeds": 2,
                        "taken_from": {}}
    assert rep["b"]["predicted"] == 5 and rep["b"]["f1"] == pytest.approx(2 * 2 / 7, abs=1e-4)
    assert rep["b"]["taken_from"] == {"a": 2, "c": 1}, "b took two of a's documents and c's one"
    assert rep["c"] == {"f1": 0.0, "predicted": 0, "true": 1, "seeds": 0, "taken_from": {}}
