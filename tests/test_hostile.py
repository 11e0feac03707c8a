"""Hostile input: no poison pill, class and memory bounds hold.

In process: the engine's ``max_classes`` bound covers held labels. Through the real
worker process and the embedded broker: the poison pills of the review (a 400-digit
``ts``, ``ts: "0001-01-01"``, lone UTF-16 surrogates in documents and control messages,
a dead letter too large to produce) are dead-lettered and the worker never restarts,
also not after a restart that replays the control topic (which does not dead-letter them a
second time); labels for thousands of unseen
ids with distinct classes cannot seed more than ``max_classes`` classes; and a stream of
thousands of generated hostile messages interleaved with good documents leaves every
good document assigned, every bad message dead-lettered with its reason, and the RSS
growth under the bound of docs/reliability.md.
"""

from __future__ import annotations

import json
import random
import time

import pytest
from kafka import KafkaProducer
from kafka_utils import DEADLINE, Topics, WorkerProcess, read_topic, send_json, wait_for

from streamsemi.core import datasets
from streamsemi.core.messages import Document
from streamsemi.engine import Engine, EngineConfig

# docs/reliability.md, "Bounds": RSS growth allowed while the hostile stream of
# test_generated_hostile_stream_leaves_the_worker_up_and_bounded is processed
HOSTILE_RSS_GROWTH_MIB = 150


@pytest.fixture(scope="module")
def r8():
    return datasets.load("reuters-r8")


# ---------------------------------------------------------------- in process: max_classes covers held labels
def _engine(max_classes: int) -> Engine:
    return Engine(EngineConfig(algorithms=["constrained-kmeans"], background_refit=False, n_features=2**12,
                               refit_every_docs=0, min_docs_first_refit=10**6, drift_detection=False,
                               max_classes=max_classes))


def test_labels_held_for_unseen_ids_cannot_seed_more_than_max_classes():
    e = _engine(max_classes=5)
    dead = []
    for i in range(50):  # the attack: a label with a new class for each of many ids not seen yet
        dead += e.label(f"u{i}", [f"class{i}"], offset=i)
    assert len(e.pending) == 5 and len(dead) == 45
    assert {r.reason for _, r in dead} == {"invalid_label"} and "max_classes=5" in dead[0][1].detail
    assert dead[0][0] == {"op": "label", "id": "u5", "labels": ["class5"]}
    e.process([Document(id=f"u{i}", text=f"grain wheat exports number {i}") for i in range(50)])
    assert set(e.seed_classes()) == {f"class{i}" for i in range(5)}
    assert len(e.seeds) == 5 and not e.drain_dead()
    # held classes free their share of the budget when they become seeds or go
    assert e.label("u9", ["class0"]) == [], "a class already seeded is always accepted"
    assert e.unlabel("u1") and e.unlabel("u2")
    assert e.label("v", ["fresh"]) == [] and e.label("w", ["fresh2"]) == []
    assert e.label("z", ["fresh3"])[0][1].reason == "invalid_label"


def test_a_held_label_over_max_classes_is_dead_lettered_when_its_document_arrives():
    # e.g. labels restored from a checkpoint written under a larger max_classes
    e = _engine(max_classes=2)
    e.label("a", ["x"]), e.label("b", ["y"])
    e.pending.put("c", ("z",), now=e.clock(), offset=7)  # bypasses Engine.label, as a restore does
    e.process([Document(id=k, text=f"grain wheat exports {k}") for k in "abc"])
    assert set(e.seed_classes()) == {"x", "y"} and "c" not in e.seeds
    [(op, rej)] = e.drain_dead()
    assert op == {"op": "label", "id": "c", "labels": ["z"]} and rej.reason == "invalid_label"
    assert [s.id for s in e.drain_resolved()] == ["a", "b"]


# ---------------------------------------------------------------- through the worker and the broker
def _producer(bootstrap: str) -> KafkaProducer:
    return KafkaProducer(bootstrap_servers=bootstrap, linger_ms=10, acks="all", batch_size=256 * 1024,
                         max_request_size=2_000_000)


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _errors(worker: WorkerProcess) -> list[dict]:
    return [e for e in worker.logs() if (e.get("level") in ("error", "critical") and e.get("logger", "").startswith("streamsemi"))
            or ("raw" in e and "Traceback" in e["raw"])]


def _starts(worker: WorkerProcess) -> int:
    return sum(1 for e in worker.logs() if e.get("event") == "worker_starting")


def _assigned_until(bootstrap: str, topic: str, expect: set[str], timeout: float = DEADLINE) -> list[dict]:
    """Every assignment on ``topic`` once all of ``expect`` are assigned (or ``timeout`` passes)."""
    t0 = time.monotonic()
    while True:
        out = [json.loads(r.value) for r in read_topic(bootstrap, topic, idle=2.0)]
        if expect <= {a["id"] for a in out} or time.monotonic() - t0 > timeout:
            return out


def _dead_by_position(bootstrap: str, topic: str, expect: int) -> dict[tuple[str, int, int], dict]:
    dead = [json.loads(r.value) for r in read_topic(bootstrap, topic, expect=expect)]
    return {(d["topic"], d["partition"], d["offset"]): d for d in dead}


POISON_DOCUMENTS = [  # (raw value, expected dead-letter reason)
    (b'{"id":"p1","text":"hello world","ts":1' + b"0" * 400 + b"}", "wrong_type"),
    (b'{"id":"p2","text":"hello world","ts":"0001-01-01"}', "wrong_type"),
    (b'{"id":"x-\\ud800","text":"hello world"}', "invalid_utf8"),
    (b'{"id":"p3","text":"\\ud83d"}', "invalid_utf8"),
    (b'{"id":"p4","text":"grain \\udfff wheat"}', "invalid_utf8"),
    (b"\x01" * 900_000, "invalid_json"),                      # its dead letter must still fit one request
    (b'{"id":"p5","text":"' + b"\\u0001" * 150_000 + b' of the and"}', "no_terms"),
]
POISON_CONTROL = [
    (b'{"op":"label","id":"x-\\ud800","labels":["grain"]}', "invalid_utf8"),
    (b'{"op":"label","id":"d0","labels":["\\ud800"]}', "invalid_utf8"),
    (b'{"op":"label","id":"d0","labels":["grain"],"text":"\\ud83d"}', "invalid_utf8"),
    (b'{"op":"unlabel","id":"\\udfff"}', "invalid_utf8"),
    (b'{"op":"label","id":"d1","labels":["grain"],"origin":"resolved","label_offset":1' + b"0" * 400 + b"}", "wrong_type"),
]


def test_poison_pills_are_dead_lettered_and_survive_a_restart(broker, tmp_path, r8):
    topics = Topics()
    topics.create(broker.bootstrap)
    args = ["--refit-every-docs", "0", "--min-docs-first-refit", "50", "--no-drift-detection",
            "--state-dir", str(tmp_path / "state"), "--checkpoint-interval-s", "1"]
    w = WorkerProcess(broker.bootstrap, topics, args, log_dir=tmp_path).start()
    try:
        assert w.wait_assigned(DEADLINE)
        p = _producer(broker.bootstrap)
        for i, c in enumerate(sorted(set(r8.labels))[:4]):
            send_json(p, topics.control, {"op": "label", "id": f"s{i}", "labels": [c], "text": r8.texts[r8.labels.index(c)]})
        bad = [(p.send(topics.documents, value=raw), reason) for raw, reason in POISON_DOCUMENTS]
        bad += [(p.send(topics.control, value=raw), reason) for raw, reason in POISON_CONTROL]
        good = [f"g{i}" for i in range(100)]
        for i, doc_id in enumerate(good):
            send_json(p, topics.documents, {"id": doc_id, "text": r8.texts[100 + i], "ts": "2024-05-01T00:00:00Z"}, key=doc_id)
        # a good document whose label arrives first: its seed is re-emitted with the text (origin resolved)
        send_json(p, topics.control, {"op": "label", "id": "late", "labels": ["grain"]})
        p.flush()
        send_json(p, topics.documents, {"id": "late", "text": "grain wheat \U0001f33e harvest"}, key="late")
        p.flush()
        where = {(f.get().topic, f.get().partition, f.get().offset): reason for f, reason in bad}
        out = _assigned_until(broker.bootstrap, topics.assignments, {*good, "late"})
        assert {a["id"] for a in out} == {*good, "late"}
        got = _dead_by_position(broker.bootstrap, topics.deadletter, len(where))
        for key, reason in where.items():
            assert key in got, f"no dead letter for {key} ({reason})"
            assert got[key]["reason"] == reason and got[key]["detail"], got[key]
        huge = got[next(k for k, r in where.items() if r == "invalid_json")]
        assert huge["truncated"] is True and huge["original_bytes"] == 900_000
        resolved = [json.loads(r.value) for r in read_topic(broker.bootstrap, topics.control, idle=2.0)
                    if b'"resolved"' in r.value and not r.value.startswith(b'{"op":"label","id":"d1"')]  # d1: our poison
        assert [m["id"] for m in resolved] == ["late"] and "\U0001f33e" in resolved[0]["text"]
        assert w.proc.poll() is None and _starts(w) == 1
        assert w.terminate() == 0
        # the control topic is replayed from the beginning at every start: the poison must not crash the worker,
        # and what the first run dead-lettered is not dead-lettered a second time (state_dir/control_rejections.json)
        w = WorkerProcess(broker.bootstrap, topics, args, log_dir=tmp_path).start()
        assert w.wait_ready(DEADLINE)
        assert (w.wait_metric("streamsemi_control_rejections_replayed_total", len(POISON_CONTROL)) or 0) >= len(POISON_CONTROL)
        time.sleep(2)  # time for a wrong second dead letter to show: a slow machine only weakens this, never fails it
        assert w.proc.poll() is None
        assert w.metric("streamsemi_control_rejections_replayed_total") == len(POISON_CONTROL)
        assert (w.metric("streamsemi_dead_letters_total") or 0) == 0
        again = [json.loads(r.value) for r in read_topic(broker.bootstrap, topics.deadletter, idle=2.0)]
        assert len(again) == len(where), "a replayed control record was dead-lettered twice"
    finally:
        assert w.terminate() == 0
    assert not _errors(w)


def test_labels_for_5000_unseen_ids_with_distinct_classes_seed_at_most_max_classes(broker, tmp_path, r8):
    topics = Topics()
    topics.create(broker.bootstrap)
    w = WorkerProcess(broker.bootstrap, topics, ["--refit-every-docs", "0", "--min-docs-first-refit", "100",
                                                 "--no-drift-detection", "--max-classes", "20"],
                      log_dir=tmp_path).start()
    n = 5000
    try:
        assert w.wait_assigned(DEADLINE)
        p = _producer(broker.bootstrap)
        for i in range(n):
            send_json(p, topics.control, {"op": "label", "id": f"u{i}", "labels": [f"class{i}"]}, key=f"u{i}")
        p.flush()
        wait_for(lambda: (w.metric("streamsemi_dead_letters_total", {"reason": "invalid_label"}) or 0) >= n - 20,
                 DEADLINE, f"{n - 20} labels beyond max_classes dead-lettered", 1.0, logs=[w.log_path])
        for i in range(n):
            send_json(p, topics.documents, {"id": f"u{i}", "text": r8.texts[i % len(r8.texts)]}, key=f"u{i}")
        p.flush()
        out = _assigned_until(broker.bootstrap, topics.assignments, {f"u{i}" for i in range(n)})
        assert {a["id"] for a in out} == {f"u{i}" for i in range(n)}
        assert w.metric("streamsemi_seed_documents") == 20
        _, body = w.get("/readyz")
        assert json.loads(body)["seed_classes"] == 20
        assert w.proc.poll() is None
    finally:
        assert w.terminate() == 0
    assert not _errors(w)


def _hostile(rng: random.Random, j: int) -> tuple[str, bytes, str]:
    """One generated hostile message: (documents | control, value, expected reason)."""
    kind = rng.randrange(12)
    unique = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(8))
    if kind == 0:
        return "documents", b'{"id":"h%d","text":"hello world","ts":%s}' % (j, b"9" * rng.randrange(20, 400)), "wrong_type"
    if kind == 1:
        ts = rng.choice(["0001-01-01", "0001-01-01T00:00:00", "9999-12-31T23:59:59-23:59", -1e308, 2**64])
        return "documents", json.dumps({"id": f"h{j}", "text": "hello world", "ts": ts}).encode(), "wrong_type"
    if kind == 2:
        return "documents", json.dumps({"id": f"h{j}-\ud800", "text": "grain wheat"}).encode(), "invalid_utf8"
    if kind == 3:
        return "documents", json.dumps({"id": f"h{j}", "text": rng.choice(["\ud83d", "a \udc00 b", "\udbff\udbff"])}).encode(), "invalid_utf8"
    if kind == 4:
        return "control", json.dumps({"op": "label", "id": f"h{j}\udfff", "labels": ["grain"]}).encode(), "invalid_utf8"
    if kind == 5:
        return "control", json.dumps({"op": "label", "id": f"h{j}", "labels": [f"c\ud800{j}"]}).encode(), "invalid_utf8"
    if kind == 6:  # deep nesting
        depth = rng.randrange(5000, 100_000)
        return "documents", b'{"id":"h","text":"t","meta":' + b"[" * depth + b"]" * depth + b"}", "invalid_json"
    if kind == 7:  # every type in every field (the values that are wrong for it)
        field = rng.choice(["id", "text", "ts", "stream", "meta"])
        valid = {"id": ("s",), "text": ("s",), "ts": (3.5,), "stream": ("s",), "meta": ({"a": None},)}[field]
        value = rng.choice([v for v in ([1], {"a": None}, 3.5, True, -1e308, "s") if v not in valid])
        return "documents", json.dumps({"id": f"h{j}", "text": "grain wheat", field: value}).encode(), "wrong_type"
    if kind == 8:  # 45 unique 10,000-character tokens, under every limit: assigned, the sketch keeps none
        text = " ".join(unique + str(k) + "q" * 9_990 for k in range(45))
        return "documents", json.dumps({"id": f"long{j}", "text": text + " grain wheat"}).encode(), "good"
    if kind == 9:  # a label with a new class for an id that never comes (held, then over max_classes)
        return "control", json.dumps({"op": "label", "id": f"never{j}", "labels": [f"flood{j}"]}).encode(), "invalid_label"
    if kind == 10:
        return "control", json.dumps({"op": "label", "id": "x", "labels": ["a"], "label_offset": -j - 1}).encode(), "wrong_type"
    return "documents", b'{"id":"h%d","text":"' % j + b"\\ud800" * rng.randrange(1, 50) + b'"}', "invalid_utf8"


@pytest.mark.slow
def test_generated_hostile_stream_leaves_the_worker_up_and_bounded(broker, tmp_path, r8):
    topics = Topics()
    topics.create(broker.bootstrap)
    classes = sorted(set(r8.labels))
    w = WorkerProcess(broker.bootstrap, topics, ["--refit-every-docs", "1000", "--min-docs-first-refit", "200",
                                                 "--no-drift-detection", "--max-classes", str(len(classes)),
                                                 "--window-max-docs", "2000"], log_dir=tmp_path,
                      env={"OMP_NUM_THREADS": "1"}).start()
    rng = random.Random(13)
    n_good, n_bad = 1500, 3000
    try:
        assert w.wait_assigned(DEADLINE)
        p = _producer(broker.bootstrap)
        for c in classes:  # every class seeded before the flood can claim the class budget
            send_json(p, topics.control, {"op": "label", "id": f"s-{c}", "labels": [c], "text": r8.texts[r8.labels.index(c)]})
        p.flush()
        assert w.wait_metric("streamsemi_seed_documents", len(classes)) == len(classes)
        warm = [f"w{i}" for i in range(300)]
        for i, doc_id in enumerate(warm):
            send_json(p, topics.documents, {"id": doc_id, "text": r8.texts[i]}, key=doc_id)
        p.flush()
        assert set(warm) <= {a["id"] for a in _assigned_until(broker.bootstrap, topics.assignments, set(warm))}
        rss0 = _rss_mib(w.proc.pid)
        good = [f"g{i}" for i in range(n_good)]
        bad: list[tuple[object, str]] = []
        long_ids: list[str] = []
        for i, doc_id in enumerate(good):
            send_json(p, topics.documents, {"id": doc_id, "text": r8.texts[(300 + i) % len(r8.texts)]}, key=doc_id)
            for _ in range(n_bad // n_good):
                where, raw, reason = _hostile(rng, len(bad) + len(long_ids))
                topic = topics.documents if where == "documents" else topics.control
                if reason == "good":
                    long_ids.append(json.loads(raw)["id"])
                    p.send(topic, value=raw)
                else:
                    bad.append((p.send(topic, value=raw), reason))
        p.flush()
        positions = {(f.get().topic, f.get().partition, f.get().offset): reason for f, reason in bad}
        expect = set(warm) | set(good) | set(long_ids)
        out = _assigned_until(broker.bootstrap, topics.assignments, expect)
        assert {a["id"] for a in out} == expect, "every good document assigned"
        versions = [(a["id"], a["model_version"]) for a in out]
        assert len(versions) == len(set(versions)), "no restart, so no at-least-once duplicates either"
        got = _dead_by_position(broker.bootstrap, topics.deadletter, len(positions))
        missing = set(positions) - set(got)
        assert not missing, f"{len(missing)} bad messages without a dead letter"
        wrong = [(positions[k], got[k]["reason"]) for k in positions if got[k]["reason"] != positions[k]]
        assert not wrong, wrong[:5]
        assert all(got[k]["detail"] for k in positions)
        growth = _rss_mib(w.proc.pid) - rss0
        assert growth < HOSTILE_RSS_GROWTH_MIB, f"RSS grew by {growth:.0f} MiB"
        assert w.proc.poll() is None and _starts(w) == 1, "the worker never restarted"
        assert w.metric("streamsemi_seed_documents") == len(classes)
    finally:
        assert w.terminate() == 0
    assert not _errors(w)
