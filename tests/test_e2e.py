"""End to end against the real embedded broker: `streamsemi run` as a separate process."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter

import pytest
from kafka_utils import Topics, WorkerProcess, committed_offsets, producer, read_topic, send_json

from streamsemi.core import datasets
from streamsemi.devtools.replay import replay_order, stratified_seeds
from streamsemi.evaluation.metrics import macro_f1

pytestmark = pytest.mark.slow


def _values(records):
    return [json.loads(r.value) for r in records]


def _produce(bootstrap, topics, *args):
    cmd = [sys.executable, "-m", "streamsemi", "produce", "--bootstrap-servers", bootstrap, *topics.flags(),
           "--corpus", "reuters-r8", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_replay_r8_every_document_assigned_once_per_algorithm(broker, tmp_path):
    """2,000 R8 documents with 5% seeds, then 600 more while refits keep happening."""
    topics = Topics()
    topics.create(broker.bootstrap)
    n_warm, n_more, frac = 2000, 600, 0.05
    # The first model is fitted once the warm-up (the first 2,000 documents) is in the window;
    # documents that arrive before it are buffered and assigned by it.
    worker = WorkerProcess(broker.bootstrap, topics, ["--algorithms", "constrained-kmeans,seeded-kmeans",
                                                      "--min-docs-first-refit", str(n_warm),
                                                      "--refit-every-docs", "200"], log_dir=tmp_path).start()
    ds = datasets.load("reuters-r8")
    order = replay_order(ds, "auto", 0)
    try:
        summary = _produce(broker.bootstrap, topics, "--limit", str(n_warm), "--seed-fraction", str(frac), "--rate", "1000")
        seeds = {f"reuters-r8:{i}" for i in stratified_seeds(ds, order[:n_warm], frac, 0)}
        assert summary["documents"] == n_warm and summary["seeds"] == len(seeds) >= 100
        records = read_topic(broker.bootstrap, topics.assignments, expect=2 * n_warm, timeout=120)
        msgs = _values(records)
        primary = [m for m in msgs if m["primary"]]
        assert {m["algorithm"] for m in primary} == {"constrained-kmeans"}
        assert all(0.0 <= m["score"] <= 1.0 and m["label"] in m["labels"] and m["explain"] for m in primary)
        scored = [m for m in primary if m["id"] not in seeds]
        truth = [ds.labels[int(m["id"].split(":")[1])] for m in scored]
        f1 = macro_f1(truth, [m["label"] for m in scored])
        assert f1 >= 0.75, f"macro-F1 {f1:.3f} of constrained k-means on non-seed R8 documents"
        # more documents flow; a refit happens meanwhile and the model version advances:
        # once the second refit has finished, documents sent afterwards carry version >= 2
        _produce(broker.bootstrap, topics, "--skip", str(n_warm), "--limit", "300", "--rate", "300")
        assert worker.wait_metric("streamsemi_refits_total", 2, timeout=120,
                                  labels={"algorithm": "constrained-kmeans", "outcome": "success"}) >= 2
        _produce(broker.bootstrap, topics, "--skip", str(n_warm + 300), "--limit", str(n_more - 300), "--rate", "300")
        records = read_topic(broker.bootstrap, topics.assignments, expect=2 * (n_warm + n_more), timeout=120)
        msgs = _values(records)
        per = Counter((m["id"], m["algorithm"]) for m in msgs)
        expected_ids = {f"reuters-r8:{int(i)}" for i in order[: n_warm + n_more]}
        assert set(per) == {(i, a) for i in expected_ids for a in ("constrained-kmeans", "seeded-kmeans")}
        assert max(per.values()) == 1, "no duplicates without crashes"
        assert {r.key.decode() for r in records} == {m["id"] for m in msgs}
        late_ids = {f"reuters-r8:{int(i)}" for i in order[n_warm + 300: n_warm + n_more]}
        late = [m["model_version"] for m in msgs if m["primary"] and m["id"] in late_ids]
        assert len(late) == n_more - 300 and min(late) >= 2, "documents arriving later are assigned by a refitted model"
        assert worker.metric("streamsemi_refits_total", {"algorithm": "constrained-kmeans", "outcome": "success"}) >= 3
        assert worker.metric("streamsemi_documents_consumed_total") == n_warm + n_more
        assert worker.metric("streamsemi_seed_documents") == len(seeds)
        code, body = worker.get("/readyz")
        assert code == 200 and json.loads(body)["model_loaded"] is True
        assert worker.get("/healthz")[0] == 200
    finally:
        rc = worker.terminate()
    assert rc == 0, "SIGTERM: clean exit"
    # at-least-once: everything consumed was committed after its outputs were flushed
    committed = committed_offsets(broker.bootstrap, topics.documents, topics.group)
    per_partition = Counter(r.partition for r in read_topic(broker.bootstrap, topics.documents, expect=n_warm + n_more))
    assert {p: committed[p] for p in per_partition} == dict(per_partition)
    logs = worker.logs()
    assert all("raw" not in entry for entry in logs), "every log line is one JSON object"
    assert not any("text" in entry for entry in logs), "document text never appears in info logs"


BAD_DOCS = [
    (b"{not json", "invalid_json"),
    (b"\xff\xfe\x00garbage", "invalid_utf8"),
    (json.dumps({"text": "no id here"}).encode(), "missing_field"),
    (json.dumps({"id": "x1"}).encode(), "missing_field"),
    (json.dumps({"id": 12, "text": "numeric id"}).encode(), "wrong_type"),
    (json.dumps({"id": "x2", "text": ["a", "list"]}).encode(), "wrong_type"),
    (json.dumps(["an", "array"]).encode(), "wrong_type"),
    (json.dumps({"id": "x3", "text": "   "}).encode(), "empty_text"),
    (json.dumps({"id": "x4", "text": "word " * 4000}).encode(), "oversize"),
    (json.dumps({"id": "x5", "text": "the and of !!! a b c ..."}).encode(), "no_terms"),
    (json.dumps({"id": "x6", "text": "fine text", "ts": "yesterday"}).encode(), "wrong_type"),
    (b"", "invalid_json"),
]
BAD_CONTROL = [
    (json.dumps({"op": "explode", "id": "a"}).encode(), "unknown_op"),
    (b"[1,2", "invalid_json"),
    (json.dumps({"op": "label", "id": "a", "labels": "grain"}).encode(), "wrong_type"),
    (json.dumps({"op": "label", "id": "a", "labels": ["bad\nlabel"]}).encode(), "invalid_label"),
    (json.dumps({"op": "label", "id": "ghost-doc", "labels": ["grain"]}).encode(), "label_expired"),
]


def test_bad_messages_go_to_dead_letter_and_good_ones_are_assigned(broker, tmp_path):
    topics = Topics()
    topics.create(broker.bootstrap)
    worker = WorkerProcess(broker.bootstrap, topics, ["--refit-every-docs", "0", "--min-docs-first-refit", "150",
                                                      "--max-message-bytes", "8000", "--pending-label-ttl-s", "5"],
                           log_dir=tmp_path).start()
    ds = datasets.load("reuters-r8")
    good = list(range(300))
    sent = {}  # reason -> send future of the bad document
    try:
        assert worker.wait_assigned(), "the worker joined its group"
        p = producer(broker.bootstrap)
        for k, i in enumerate(good):
            send_json(p, topics.documents, {"id": f"g{i}", "text": ds.texts[i]}, key=f"g{i}")
            if k < 40:
                send_json(p, topics.control, {"op": "label", "id": f"g{i}", "labels": [ds.labels[i]]}, key=f"g{i}")
            if k % 25 == 0 and k // 25 < len(BAD_DOCS):
                sent[BAD_DOCS[k // 25][1]] = p.send(topics.documents, value=BAD_DOCS[k // 25][0])
        for raw, _ in BAD_CONTROL:
            p.send(topics.control, value=raw)
        p.flush()
        out = _values(read_topic(broker.bootstrap, topics.assignments, expect=len(good), timeout=90))
        assert sorted(m["id"] for m in out) == sorted(f"g{i}" for i in good)
        expected = Counter(r for _, r in BAD_DOCS) + Counter(r for _, r in BAD_CONTROL)
        dead = _values(read_topic(broker.bootstrap, topics.deadletter, expect=sum(expected.values()), timeout=30))
        assert Counter(d["reason"] for d in dead) == expected
        for d in dead:
            assert d["detail"] and d["topic"] in (topics.documents, topics.control)
        invalid = next(d for d in dead if d["reason"] == "invalid_utf8")
        meta = sent["invalid_utf8"].get(timeout=30)
        assert invalid["encoding"] == "base64"
        assert (invalid["partition"], invalid["offset"]) == (meta.partition, meta.offset)
        assert worker.metric("streamsemi_dead_letters_total", {"reason": "no_terms"}) == 1
        assert worker.proc.poll() is None, "the worker survived the bad input"
    finally:
        assert worker.terminate() == 0


def test_seeds_survive_a_worker_restart(broker, tmp_path):
    topics = Topics()
    topics.create(broker.bootstrap)
    ds = datasets.load("reuters-r8")
    args = ["--refit-every-docs", "0", "--min-docs-first-refit", "100"]
    first = WorkerProcess(broker.bootstrap, topics, args, log_dir=tmp_path).start()
    p = producer(broker.bootstrap)
    seeded = list(range(0, 400, 8))  # 50 seeds, labels sent AFTER their documents, without text
    try:
        for i in range(400):
            send_json(p, topics.documents, {"id": f"d{i}", "text": ds.texts[i]}, key=f"d{i}")
        p.flush()
        time.sleep(1.0)
        for i in seeded:
            send_json(p, topics.control, {"op": "label", "id": f"d{i}", "labels": [ds.labels[i]]}, key=f"d{i}")
        p.flush()
        read_topic(broker.bootstrap, topics.assignments, expect=400, timeout=90)
        assert first.wait_metric("streamsemi_seed_documents", len(seeded), timeout=30) == len(seeded)
    finally:
        assert first.terminate() == 0
    # The documents were committed; only the control topic can bring the seeds back.
    resolved = [json.loads(r.value) for r in read_topic(broker.bootstrap, topics.control, idle=2)]
    assert sum(1 for m in resolved if m.get("origin") == "resolved" and m.get("text")) == len(seeded)
    second = WorkerProcess(broker.bootstrap, topics, args, log_dir=tmp_path).start()
    try:
        for i in range(400, 600):
            send_json(p, topics.documents, {"id": f"d{i}", "text": ds.texts[i]}, key=f"d{i}")
        p.flush()
        out = _values(read_topic(broker.bootstrap, topics.assignments, expect=600, timeout=90))
        assert {m["id"] for m in out} >= {f"d{i}" for i in range(400, 600)}
        assert second.metric("streamsemi_seed_documents") == len(seeded)
        assert second.metric("streamsemi_dead_letters_total") in (None, 0.0), "no seed expired"
    finally:
        assert second.terminate() == 0
