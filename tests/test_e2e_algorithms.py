"""Every registered algorithm runs inside the daemon, end to end on the real broker."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from kafka_utils import Topics, WorkerProcess, producer, read_topic, send_json

from streamsemi.algorithms import REGISTRY
from streamsemi.core.datasets import load

pytestmark = pytest.mark.slow

KNOWN = {"earn", "acq", "crude", "grain", "wheat"}
HIDDEN = {"money-fx", "trade"}  # never seeded: D-LDA must put them in new clusters, not force them


@pytest.mark.long
def test_all_algorithms_in_one_worker(broker, tmp_path):
    ds = load("reuters21578")
    by_topic: dict[str, list[int]] = {}
    for i, labels in enumerate(ds.labels):
        if labels and set(labels) <= KNOWN | HIDDEN and ds.texts[i].strip():
            by_topic.setdefault(labels[0], []).append(i)
    docs = sorted(i for t in ("earn", "acq", "crude", "grain", "money-fx", "trade") for i in by_topic[t][:90])
    seeds = [i for k, i in enumerate(docs) if k % 6 == 0 and set(ds.labels[i]) <= KNOWN]
    assert any(len(ds.labels[i]) > 1 for i in seeds), "some seeds are multi-label (grain + wheat)"
    algorithms = list(REGISTRY)
    cfg = tmp_path / "all.toml"
    cfg.write_text(f'algorithms = "{",".join(algorithms)}"\nprimary = "d-lda"\nn_new_clusters = 2\n'
                   "min_docs_first_refit = 500\nrefit_every_docs = 0\n"
                   # one emission per document and algorithm: revisions are tested in test_revisions/test_e2e
                   "revisions = \"off\"\n"
                   "[algorithm_params.cle]\nn_new_clusters = 0\n"
                   "[algorithm_params.d-lda]\nn_sweeps = 200\n")
    topics = Topics()
    topics.create(broker.bootstrap)
    worker = WorkerProcess(broker.bootstrap, topics, ["--config", str(cfg)], log_dir=tmp_path).start()
    try:
        p = producer(broker.bootstrap)
        for i in docs:
            send_json(p, topics.documents, {"id": f"r{i}", "text": ds.texts[i]}, key=f"r{i}")
        for i in seeds:
            send_json(p, topics.control, {"op": "label", "id": f"r{i}", "labels": ds.labels[i]}, key=f"r{i}")
        p.flush()
        msgs = [json.loads(r.value) for r in read_topic(broker.bootstrap, topics.assignments,
                                                        expect=len(docs) * len(algorithms), timeout=400)]
    finally:
        assert worker.terminate() == 0
    per = Counter((m["id"], m["algorithm"]) for m in msgs)
    assert set(per) == {(f"r{i}", a) for i in docs for a in algorithms} and max(per.values()) == 1
    fallback = sorted({m["algorithm"] for m in msgs if m.get("fallback")})
    assert fallback == [], f"algorithms that failed to fit in the daemon: {fallback}"
    by_alg = {a: [m for m in msgs if m["algorithm"] == a] for a in algorithms}
    assert all(m["primary"] for m in by_alg["d-lda"]) and not any(m["primary"] for m in by_alg["cle"])
    new = [m for m in by_alg["d-lda"] if m["new_cluster"]]
    assert new and all(m["label"] is None and m["cluster"].startswith("new-") and m["explain"] for m in new)
    hidden_docs = {f"r{i}" for i in docs if set(ds.labels[i]) <= HIDDEN}
    hidden_in_new = sum(1 for m in new if m["id"] in hidden_docs) / max(1, len(hidden_docs))
    assert hidden_in_new > 0.3, f"only {hidden_in_new:.2f} of the unseeded-class documents went to new clusters"
    multi = [m for m in by_alg["pseudo-lsc"] if len(m["labels"]) > 1]
    assert multi, "pseudo-LSC emits label sets"
    for m in msgs:
        assert 0.0 <= m["score"] <= 1.0
        assert m["label"] is None or m["label"] in KNOWN
