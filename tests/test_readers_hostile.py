"""One bad record is one bad record: readers of topics and files skip it, count it, say why, and go on.

The console (its reader thread on the real broker, its pages served by uvicorn), ``streamsemi tail``,
the in-flight marker and the control-rejections file, fed records nobody's schema allows: JSON nested
100,000 levels, numbers beyond a double, NaN, bytes that are not UTF-8, null, lists for objects,
fields of the wrong type. The parser they share is :mod:`streamsemi.core.jsonsafe`.
"""

from __future__ import annotations

import json
import logging
import random
import subprocess
import sys

import pytest
from kafka_utils import DEADLINE, Topics, WorkerProcess, producer, read_topic, send_json, wait_for
from test_console import Served, _request
from test_hostile import _assigned_until, _dead_by_position, _errors, _producer, _starts
from test_roles import CLASSES, _docs, _events, _role, _seed, _setup, _stop, _text, _wait_outputs

from streamsemi.console.app import ConsoleOptions, create_app
from streamsemi.console.reader import TopicReader
from streamsemi.console.state import ConsoleState
from streamsemi.console.writer import ControlWriter
from streamsemi.core.jsonsafe import UnsafeJSON, loads_bounded, loads_object

DEEP = b"[" * 100_000 + b"]" * 100_000
BIG = b"1" + b"0" * 400  # an integer beyond a double (json.loads: an int that float() overflows on)

#: (kind, value): each one record that must be skipped, counted and logged, and leave every page answering 200
HOSTILE = {
    "nested_document": ("documents", b'{"id": "deep", "text": "x", "meta": ' + DEEP + b"}"),
    "nested_suggestion": ("suggestions", b'{"id": "deep", "scores": ' + DEEP + b"}"),
    "document_not_utf8": ("documents", b'{"id": "u", "text": "caf\xe9 \xff"}'),
    "document_null": ("documents", b"null"),
    "document_list": ("documents", b'[{"id": "l", "text": "a list"}]'),
    "document_stream_number": ("documents", b'{"id": "s", "text": "t", "stream": 7}'),
    "assignment_huge_score": ("assignments", b'{"id": "h", "algorithm": "ck", "cluster": "grain", "score": ' + BIG + b"}"),
    "assignment_nan": ("assignments", b'{"id": "n", "algorithm": "ck", "cluster": "grain", "score": NaN}'),
    "assignment_wrong_version": ("assignments", b'{"id": "v", "algorithm": "ck", "cluster": "c", "model_version": "7"}'),
    "label_infinity": ("labels", b'{"id": "i", "algorithm": "ck", "cluster": "c", "labels": {"c": Infinity}}'),
    "label_explain_dict": ("labels", b'{"id": "e", "algorithm": "ck", "cluster": "c", "explain": {"w": 1}}'),
    "control_labels_objects": ("control", b'{"op": "label", "id": "o", "labels": [{"class": "grain"}]}'),
    "control_keys_missing": ("control", b"{}"),
    "cluster_examples_object": ("clusters", b'{"algorithm": "ck", "cluster": "c9", "size": 3, "examples": {"id": "x"}}'),
    "cluster_examples_number": ("clusters", b'{"algorithm": "ck", "cluster": "c8", "examples": 5}'),
    "cluster_size_text": ("clusters", b'{"algorithm": "ck", "cluster": "c7", "size": "many"}'),
    "cluster_missing_cluster": ("clusters", b'{"algorithm": "ck", "size": 3}'),
    "suggestion_score_text": ("suggestions", b'{"id": "t", "scores": {"grain": "high"}, "priority": 0.5, "rank": 0}'),
    "suggestion_huge_priority": ("suggestions", b'{"id": "p", "snippet": "s", "priority": ' + BIG + b', "rank": 0}'),
    "suggestion_list_scores": ("suggestions", b'{"id": "q", "scores": [0.5, 0.2], "rank": 1}'),
}

PAGES = ("/", "/clusters", "/clusters/new", "/queue", "/seeds", "/doc?id=good1", "/doc?id=deep")


def _good_records(topics: Topics) -> list[tuple[str, str, dict]]:
    """(topic, key, value) of good records of every kind, sent after the hostile ones."""
    return [
        (topics.documents, "good1", {"id": "good1", "text": "wheat <b>harvest</b> record crop"}),
        (topics.documents, "good2", {"id": "good2", "text": "oil prices rise"}),
        (topics.assignments, "good1", {"id": "good1", "algorithm": "ck", "cluster": "grain", "label": "grain",
                                       "score": 0.9, "labels": {"grain": 0.9, "crude": 0.1}, "explain": ["wheat"],
                                       "model_version": 3, "revision": 0, "primary": True, "provisional": False}),
        (topics.labels, "good1", {"id": "good1", "algorithm": "ck", "cluster": "grain", "label": "grain", "score": 0.9,
                                  "labels": {"grain": 0.9}, "model_version": 3, "revision": 0}),
        (topics.clusters, "ck/grain", {"algorithm": "ck", "cluster": "grain", "event": "continued", "size": 41,
                                       "top_words": ["wheatword"], "examples": [{"id": "good1", "snippet": "wheat"}]}),
        (topics.suggestions, "good2", {"id": "good2", "snippet": "oil prices rise", "algorithm": "ck", "label": "crude",
                                       "scores": {"crude": 0.5, "grain": 0.4}, "reason": "uncertain", "priority": 0.9,
                                       "rank": 0}),
        (topics.control, "good3", {"op": "label", "id": "good3", "labels": ["crude"]}),
    ]


def _topic(topics: Topics, kind: str) -> str:
    return getattr(topics, kind)


# ---------------------------------------------------------------- the parser
@pytest.mark.parametrize(("raw", "reason"), [
    (DEEP, "too_deep"),                                  # orjson's own limit (1,024 levels)
    (b"[" * 65 + b"]" * 65, "too_deep"),                 # past max_depth, under orjson's
    (b'{"a": ' * 70 + b"1" + b"}" * 70, "too_deep"),
    (BIG, "invalid_json"), (b"1e400", "invalid_json"), (b"NaN", "invalid_json"), (b"-Infinity", "invalid_json"),
    (b'"\xff"', "invalid_utf8"), (b'"\\ud800"', "invalid_utf8"), ("\ud800", "invalid_utf8"),
    (b"", "no_value"), (None, "no_value"), (b"{", "invalid_json"), (b"x" * 101, "oversize"),
])
def test_loads_bounded_refuses_with_a_reason(raw, reason):
    with pytest.raises(UnsafeJSON) as info:
        loads_bounded(raw, max_bytes=100 if reason == "oversize" else 1_000_000)
    assert info.value.reason == reason and isinstance(info.value, ValueError)
    assert str(info.value).startswith(reason + ": ")


def test_loads_bounded_accepts_values_at_the_bounds():
    assert loads_bounded(b"[" * 64 + b"]" * 64, max_depth=64) is not None
    assert loads_bounded(b'{"k": "' + b"[" * 500 + b'"}') == {"k": "[" * 500}, "brackets in strings are text"
    assert loads_bounded(b"18446744073709551615") == 2**64 - 1
    assert isinstance(loads_bounded(b"18446744073709551616"), float), "beyond 64 bits: a (finite) float"
    assert loads_bounded(memoryview(b'{"x": [1, 2.5, null, true]}')) == {"x": [1, 2.5, None, True]}
    assert loads_object('{"t": "caf\u00e9"}') == {"t": "caf\u00e9"}
    with pytest.raises(UnsafeJSON, match="wrong_type: a JSON object is expected, got list"):
        loads_object(b"[]")


# ---------------------------------------------------------------- the console's state and pages
@pytest.fixture
def console_app(broker):
    topics = Topics()
    topics.create(broker.bootstrap)
    settings = topics.settings(broker.bootstrap)
    writer = ControlWriter(settings)
    yield topics, settings, writer
    writer.close()


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_each_hostile_record_is_skipped_with_a_reason_and_every_page_answers(name, console_app):
    topics, settings, writer = console_app
    kind, raw = HOSTILE[name]
    state = ConsoleState()
    why = state.ingest(kind, b"k", raw, 0, 5)
    assert why, f"{name}: skipped with a reason"
    assert state.counts.malformed[kind] == 1
    for topic, key, value in _good_records(topics):
        kind_of = next(k for k in ("documents", "assignments", "labels", "clusters", "suggestions", "control")
                       if _topic(topics, k) == topic)
        assert state.ingest(kind_of, key.encode(), json.dumps(value).encode(), 0, 6) is None, (kind_of, value)
    assert state.ingest(kind, b"k", raw, 0, 7), "and again"
    with Served(create_app(state, writer, ConsoleOptions())) as s:
        for path in PAGES:
            code, page, _ = _request(s.url(path))
            assert code == (404 if path == "/doc?id=deep" else 200), (name, path, code, page[-500:])
        assert "wheat &lt;b&gt;harvest&lt;/b&gt;" in _request(s.url("/doc?id=good1"))[1]
        assert "oil prices rise" in _request(s.url("/queue"))[1]
    assert sum(state.counts.malformed.values()) == 2


def test_a_deeply_nested_record_does_not_wedge_the_console_reader(console_app, broker, caplog):
    """Every hostile record is on the topics before the console starts (a restart reads them again in its
    backfill): the reader skips each once, the good records after them appear on the pages, and no page
    says Kafka cannot be reached."""
    topics, settings, writer = console_app
    p = producer(broker.bootstrap)
    positions = {}
    for name, (kind, raw) in HOSTILE.items():
        positions[name] = p.send(_topic(topics, kind), key=name.encode(), value=raw)
    p.flush()
    positions = {name: (f.get().topic, f.get().partition, f.get().offset) for name, f in positions.items()}
    for topic, key, value in _good_records(topics):
        p.send(topic, key=key.encode(), value=json.dumps(value).encode())
    p.flush()
    p.close()
    caplog.set_level(logging.WARNING, logger="streamsemi.console")
    for run in ("first start", "restart"):
        caplog.clear()
        state = ConsoleState()
        reader = TopicReader(settings, state, backfill=1000, rescan_s=0.5)
        reader.start()
        try:
            wait_for(lambda st=state: "good1" in st.texts and "good2" in st.suggestions and len(st.seeds) == 1
                     and len(st.clusters) == 1 and "good1" in st.labels, 60, f"the good records ({run})")
            app = create_app(state, writer, ConsoleOptions(kafka_status=reader.status))
            with Served(app) as s:
                for path in PAGES:
                    code, page, _ = _request(s.url(path))
                    assert code in (200, 404) and 'id="kafka-down"' not in page, (run, path, code)
                code, page, _ = _request(s.url("/doc?id=good1"))
                assert code == 200 and "wheat &lt;b&gt;harvest&lt;/b&gt;" in page
                code, page, _ = _request(s.url("/clusters"))
                assert code == 200 and "wheatword" in page
            wait_for(lambda r=reader: r.skipped == len(HOSTILE), 30, "every hostile record skipped")
        finally:
            reader.stop()
            reader.join(10)
        assert reader.errors == 0 and reader.status()["connected"] and reader.status()["skipped"] == len(HOSTILE)
        assert sum(state.counts.malformed.values()) == len(HOSTILE)
        skipped = [r.fields for r in caplog.records if r.getMessage() == "console_record_skipped"]
        logged = {(f["topic"], f["partition"], f["offset"]): f["reason"] for f in skipped}
        assert set(logged) == set(positions.values()), run
        where = {v: k for k, v in positions.items()}
        assert "too_deep" in logged[positions["nested_document"]]
        assert "field 'examples' must be a list" in logged[positions["cluster_examples_object"]]
        assert "field 'scores' must map classes to numbers" in logged[positions["suggestion_score_text"]]
        assert all(r for r in logged.values()), where
        assert not [r for r in caplog.records if r.getMessage() == "console_reader_error"]


def test_skipped_records_are_logged_at_a_bounded_rate(console_app, caplog):
    from kafka import TopicPartition

    from streamsemi.console import reader as reader_mod

    topics, settings, writer = console_app
    reader = TopicReader(settings, ConsoleState())
    caplog.set_level(logging.WARNING, logger="streamsemi.console")
    tp = TopicPartition(topics.documents, 0)
    for offset in range(500):
        reader._skip(tp, offset, "documents", "UnsafeJSON: too_deep")
    lines = [r.fields for r in caplog.records if r.getMessage() == "console_record_skipped"]
    assert reader.skipped == 500 and len(lines) == reader_mod.SKIP_LOGS_PER_WINDOW
    assert [f["offset"] for f in lines] == list(range(reader_mod.SKIP_LOGS_PER_WINDOW))
    reader._skip_window = (reader._skip_window[0] - reader_mod.SKIP_LOG_WINDOW_S, reader._skip_window[1])
    reader._skip(tp, 500, "documents", "UnsafeJSON: too_deep")
    last = [r.fields for r in caplog.records if r.getMessage() == "console_record_skipped"][-1]
    assert last["offset"] == 500 and last["suppressed"] == 500 - reader_mod.SKIP_LOGS_PER_WINDOW


# ---------------------------------------------------------------- streamsemi tail
def _tail(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "streamsemi", "tail", *args], capture_output=True, text=True,
                          timeout=240)


def test_tail_skips_a_bad_record_says_where_and_prints_the_good_ones_one_per_line(broker):
    topics = Topics()
    topics.create(broker.bootstrap)
    p = producer(broker.bootstrap)
    sent = [("a", b'{"id": "a", "n": 1}'), ("deep", b'{"id": "deep", "x": ' + DEEP + b"}"),
            ("b", b'{\n  "id": "b",\n  "n": 2\n}'), ("bytes", b'{"id": "\xff"}'), ("nan", b'{"id": "nan", "x": NaN}'),
            ("c", '{"id": "c", "t": "caf\u00e9"}'.encode()), ("b", b"not json at all")]
    futures = [p.send(topics.documents, key=k.encode(), value=v) for k, v in sent]
    p.flush()
    where = {(f.get().partition, f.get().offset): k for f, (k, _) in zip(futures, sent, strict=True)}
    p.close()
    flags = ["--bootstrap-servers", broker.bootstrap, "--topic", topics.documents, "--timeout", "3"]
    out = _tail(*flags)
    assert out.returncode == 0, out.stderr
    lines = {json.loads(line)["id"]: line for line in out.stdout.splitlines()}  # (one JSON object per line)
    assert sorted(lines) == ["a", "b", "c"] and len(out.stdout.splitlines()) == 3
    assert lines["b"] == '{"id":"b","n":2}' and lines["c"] == '{"id": "c", "t": "caf\u00e9"}'
    events = [json.loads(line) for line in out.stderr.splitlines() if line.startswith("{")]
    skipped = {(e["partition"], e["offset"]): e["reason"] for e in events if e["event"] == "tail_record_skipped"}
    assert all(e["topic"] == topics.documents for e in events)
    by_key = {where[k]: r for k, r in skipped.items()}
    assert by_key == {"deep": "too_deep", "bytes": "invalid_utf8", "nan": "invalid_json", "b": "invalid_json"}
    assert [e["skipped"] for e in events if e["event"] == "tail_records_skipped"] == [4]
    # read as a table: the key whose latest value is unreadable has no row
    live = _tail(*flags, "--live")
    assert live.returncode == 0, live.stderr
    assert sorted(json.loads(line)["id"] for line in live.stdout.splitlines()) == ["a", "c"]


# ---------------------------------------------------------------- files: the in-flight marker, the control rejections
def test_one_bad_range_of_the_inflight_marker_leaves_the_others_marked(tmp_path, caplog):
    from kafka import TopicPartition

    from streamsemi.service.inflight import MARKER, InFlightMarker

    good = ["docs", 0, 10, 19]
    for bad in (["docs", 1, 5], ["docs", 1, 9, 3], ["docs", -1, 0, 1], [1, 2, 3, 4], ["docs", 1, 2.5, 3], "x",
                ["docs", 1, True, 3]):
        (tmp_path / MARKER).write_text(json.dumps({"ranges": [bad, good], "attempts": 0}))
        caplog.clear()
        marker = InFlightMarker(tmp_path)
        marker.load()
        assert marker.suspects == {TopicPartition("docs", 0): (10, 19)}, bad
        assert marker.is_suspect(TopicPartition("docs", 0), 15) and marker.crashes == 1
        assert [r.fields["skipped"] for r in caplog.records if r.getMessage() == "inflight_marker_ranges_skipped"] == [1]
    for raw, reason in ((b'{"ranges": ' + DEEP + b"}", "too_deep"), (b'{"ranges": [], "attempts": NaN}', "invalid_json"),
                        (b"\xff\xfe", "invalid_utf8"), (b"[]", "wrong_type")):
        (tmp_path / MARKER).write_bytes(raw)
        caplog.clear()
        marker = InFlightMarker(tmp_path)
        marker.load()
        assert marker.suspects == {} and not (tmp_path / MARKER).exists(), "an unreadable marker is ignored"
        errors = [r.fields["error"] for r in caplog.records if r.getMessage() == "inflight_marker_unreadable"]
        assert len(errors) == 1 and f"UnsafeJSON: {reason}: " in errors[0], errors


def test_an_unreadable_control_rejections_file_names_its_reason(tmp_path, caplog):
    from streamsemi.service.control_rejections import FILE, RejectedControl, fingerprint

    fp = fingerprint(0, 3, b"x")
    (tmp_path / FILE).write_text(json.dumps({"topic": "ctl", "entries": [fp, 7, "0:1:zz", [fp]]}))
    assert RejectedControl(tmp_path, "ctl").load() == 1, "bad entries skipped, the good one kept"
    for raw, reason in ((b'{"topic": "ctl", "entries": [' + DEEP + b"]}", "too_deep"),
                        (b'{"topic": "ctl", "entries": [1e400]}', "invalid_json"), (b"null", "wrong_type")):
        (tmp_path / FILE).write_bytes(raw)
        caplog.clear()
        assert RejectedControl(tmp_path, "ctl").load() == 0
        errors = [r.fields["error"] for r in caplog.records if r.getMessage() == "control_rejections_unreadable"]
        assert len(errors) == 1 and f"UnsafeJSON: {reason}: " in errors[0], errors


# ---------------------------------------------------------------- the worker's control reader (a real worker process)
#: (value, dead-letter reason): control records no control message can be; each one must be one dead letter
HOSTILE_CONTROL = [
    (DEEP, "invalid_json"),
    (b'{"op": "label", "id": "n1", "labels": ' + DEEP + b"}", "invalid_json"),
    (b'{"op": "name", "cluster": "new-1", "label": "x", "algorithm": ' + DEEP + b"}", "invalid_json"),
    (b'{"op": "label", "id": "n2", "labels": ["grain"], "label_offset": ' + b"9" * 5000 + b"}", "invalid_json"),
    (b'{"op": "unlabel", "id": ' + b"1" * 5000 + b"}", "invalid_json"),
    (b'{"op": "label", "id": "n3", "labels": ["grain"], "label_offset": ' + BIG + b"}", "wrong_type"),
    (b'{"op": "label", "id": "n4", "labels": ["grain"], "label_offset": 1e400}', "wrong_type"),
    (b'{"op": "label", "id": "n5", "labels": ["grain"], "label_offset": NaN}', "wrong_type"),
    (b'{"op": "label", "id": "n6", "labels": ["grain"], "stream": 1e400}', "wrong_type"),
    (b'{"op": "label", "id": "n7\xff", "labels": ["grain"]}', "invalid_utf8"),
    (b'\xff\xfe{"op": "refit"}', "invalid_utf8"),
    (b'{"op": "label", "id": "n8", "labels": ["grain\\n"]}', "invalid_label"),
]


def test_hostile_control_records_are_dead_lettered_and_the_worker_goes_on_also_after_a_restart(broker, tmp_path):
    """Nesting of 100,000 levels, numbers of 5,000 digits and beyond a double, NaN, bytes that are not UTF-8 on the
    control topic, before and between the seeds: one dead letter each (its position, its reason, counted), every seed
    and every document applied, the worker never restarted; a restart replays the topic and goes on the same way."""
    rng = random.Random(11)
    topics = Topics()
    topics.create(broker.bootstrap)
    args = ["--refit-every-docs", "0", "--min-docs-first-refit", "40", "--no-drift-detection", "--n-features", "4096",
            "--state-dir", str(tmp_path / "state"), "--checkpoint-interval-s", "1"]
    w = WorkerProcess(broker.bootstrap, topics, args, log_dir=tmp_path).start()
    try:
        assert w.wait_assigned(DEADLINE)
        p = _producer(broker.bootstrap)
        bad = []
        for i in range(12):   # a hostile record before each seed: a reader that stops at one loses the seeds after it
            raw, reason = HOSTILE_CONTROL[i % len(HOSTILE_CONTROL)]
            bad.append((p.send(topics.control, value=raw), reason))
            cls = CLASSES[i % 4]
            send_json(p, topics.control, {"op": "label", "id": f"seed{i}", "labels": [cls], "text": _text(rng, cls)},
                      key=f"seed{i}")
        p.flush()
        where = {(f.get().topic, f.get().partition, f.get().offset): reason for f, reason in bad}
        assert w.wait_metric("streamsemi_seed_documents", 12) == 12, "every seed after a hostile record applied"
        good = [f"g{i}" for i in range(120)]
        for i, doc_id in enumerate(good):
            send_json(p, topics.documents, {"id": doc_id, "text": _text(rng, CLASSES[i % 4])}, key=doc_id)
        p.flush()
        assert {a["id"] for a in _assigned_until(broker.bootstrap, topics.assignments, set(good))} == set(good)
        got = _dead_by_position(broker.bootstrap, topics.deadletter, len(where))
        assert {k: got[k]["reason"] for k in where if k in got} == where
        assert all(got[k]["detail"] for k in where)
        for reason in set(where.values()):
            assert w.metric("streamsemi_dead_letters_total", {"reason": reason}) == \
                sum(r == reason for r in where.values()), reason
        pid = w.proc.pid
        assert w.proc.poll() is None and _starts(w) == 1, "the worker never restarted"
        assert w.metric("streamsemi_fit_process_deaths_total") == 0
        assert w.metric("streamsemi_producer_process_deaths_total") == 0
        assert w.proc.pid == pid
        assert w.terminate() == 0
        assert not _errors(w)

        # the control topic is replayed at every start: the same records, and the worker goes on
        w = WorkerProcess(broker.bootstrap, topics, args, log_dir=tmp_path).start()
        assert w.wait_ready(DEADLINE)
        assert w.wait_metric("streamsemi_control_rejections_replayed_total", len(where)) == len(where)
        assert w.metric("streamsemi_seed_documents") == 12
        more = [f"h{i}" for i in range(40)]
        for i, doc_id in enumerate(more):
            send_json(p, topics.documents, {"id": doc_id, "text": _text(rng, CLASSES[i % 4])}, key=doc_id)
        p.flush()
        assert set(more) <= {a["id"] for a in _assigned_until(broker.bootstrap, topics.assignments, set(more))}
        assert w.proc.poll() is None and _starts(w) == 1
        assert (w.metric("streamsemi_dead_letters_total") or 0) == 0, "nothing dead-lettered a second time"
    finally:
        assert w.terminate() == 0
    assert not _errors(w)


#: (value, dead-letter reason): documents no document can be
POISON_DOCS = [
    (b'{"id": "p1", "text": "t", "meta": ' + DEEP + b"}", "invalid_json"),
    (b'{"id": "p2", "text": "t", "ts": ' + b"9" * 5000 + b"}", "invalid_json"),
    (b'{"id": "p3", "text": "t", "ts": 1e400}', "wrong_type"),
    (b'{"id": "p4", "text": "caf\xe9"}', "invalid_utf8"),
    (b'[{"id": "p5", "text": "a list"}]', "wrong_type"),
]


# ---------------------------------------------------------------- every topic a worker reads, at once (roles)
def _hostile_models(template: list[tuple[str, bytes]]) -> list[tuple[bytes | None, bytes | None, list]]:
    """Records for the models topic that no refitter wrote: (key, value, headers)."""
    def headers(**change: bytes) -> list[tuple[str, bytes]]:
        return [(k, change.get(k, v)) for k, v in template if k not in change or change[k] is not None]

    return [
        (b"default/1/0", b"x", headers(version=b"9" * 4000, sha256=b"0" * 64)),       # the version that stopped refits
        (b"default/1000000000/0", b"x", headers(version=b"1000000000")),             # a far-future version
        (b"default/2/0", b"x", [(k, v) for k, v in template if k != "signature"]),  # unsigned
        (b"default/3/0", DEEP, headers(chunks=b"\xff\xfe", version=b"\xff")),         # not UTF-8, a deep value
        (b"default/4/0", b"\xff" * 1000, []),                                        # no headers at all
        (b"not/a/key/at/all", None, []),                                             # an unsigned tombstone
        (None, BIG, headers(signature=b"0" * 64)),                                   # a signature that does not verify
    ]


@pytest.mark.slow
def test_hostile_records_on_every_topic_a_worker_reads_lose_no_document_and_restart_nothing(broker, tmp_path):
    """A refitter (documents, control and models topics) and an assigner (documents and models topics) while
    hostile records land on all three between good documents: every good document assigned, each hostile document
    and control record dead-lettered with its reason, each models record refused and counted, neither process
    restarted nor any of their fit or producer processes dead; then a refit publishes a new model and the assigner
    serves it (publication continues after the hostile models records)."""
    from test_models_trust import _models_records, _send_records

    topics = _setup(broker, partitions=2)
    models_topic = f"{topics.prefix}.models"
    rng = random.Random(17)
    refit = _role(broker, topics, "refit", tmp_path, "refit-a").start()
    assign = _role(broker, topics, "assign", tmp_path, "assign-0").start()
    try:
        assert refit.wait_metric("streamsemi_refit_leader", 1, timeout=DEADLINE) == 1
        p = _producer(broker.bootstrap)
        _seed(p, topics, rng)
        first = _docs(p, topics, rng, "a", 120)
        assert set(first) <= {o["id"] for o in _wait_outputs(broker, topics, first)}
        v1 = assign.metric("streamsemi_serving_model_version")
        assert v1 is not None and v1 >= 1
        pids = (refit.proc.pid, assign.proc.pid)

        records = _models_records(broker.bootstrap, models_topic)
        forged = _hostile_models([(k, v) for k, v in records[0].headers])
        before = {w: w.metric("streamsemi_model_publications_rejected_total") or 0 for w in (refit, assign)}
        bad = []
        good = []
        for i in range(60):
            doc_id = f"b{i}"
            send_json(p, topics.documents, {"id": doc_id, "text": _text(rng, CLASSES[i % 4])}, key=doc_id)
            good.append(doc_id)
            if i < len(HOSTILE_CONTROL):
                raw, reason = HOSTILE_CONTROL[i]
                bad.append((p.send(topics.control, value=raw), reason))
            if i < len(POISON_DOCS):
                raw, reason = POISON_DOCS[i]
                bad.append((p.send(topics.documents, value=raw), reason))
            if i == 30:
                p.flush()
                _send_records(broker.bootstrap, models_topic, forged)
        p.flush()
        where = {(f.get().topic, f.get().partition, f.get().offset): reason for f, reason in bad}
        assert set(good) <= {o["id"] for o in _wait_outputs(broker, topics, good)}, "every good document assigned"
        got: dict = {}

        def all_dead() -> bool:
            nonlocal got
            got = {(d["topic"], d["partition"], d["offset"]): d for d in
                   (json.loads(r.value) for r in read_topic(broker.bootstrap, topics.deadletter, idle=1.0))}
            return set(where) <= set(got)

        wait_for(all_dead, DEADLINE, "a dead letter for every hostile document and control record")
        assert {k: got[k]["reason"] for k in where} == where
        signed = len([f for f in forged if f[1] is not None])   # an unsigned tombstone is dropped uncounted
        for w in (refit, assign):   # every models record refused, by each reader
            assert wait_for(lambda w=w: (w.metric("streamsemi_model_publications_rejected_total") or 0)
                            - before[w] >= signed, DEADLINE, "the hostile models records refused")
            assert w.metric("streamsemi_model_publications_rejected_total", {"reason": "signature"}) \
                - before[w] == signed
        assert assign.metric("streamsemi_serving_model_version") == v1, "no forged model adopted"

        # model publication goes on: a refit, a new version, served by the assigner
        send_json(p, topics.control, {"op": "refit"})
        p.flush()
        assert assign.wait_metric("streamsemi_serving_model_version", v1 + 1, timeout=DEADLINE) == v1 + 1
        last = _docs(p, topics, rng, "c", 40)
        served = {o["id"]: o for o in _wait_outputs(broker, topics, last) if o["id"] in set(last)}
        assert set(served) == set(last) and {o["model_version"] for o in served.values()} == {v1 + 1}
        assert (refit.proc.pid, assign.proc.pid) == pids and refit.proc.poll() is None and assign.proc.poll() is None
        assert len(_events(refit, "refitter_starting")) == 1 and _starts(assign) == 1, "no process restarted"
        # the assigner's producer process (neither role fits in a process of its own; the refitter produces itself)
        assert assign.metric("streamsemi_producer_process_deaths_total") == 0
        assert assign.metric("streamsemi_producer_process_starts_total") == 1
        for w in (refit, assign):
            text = w.log_path.read_text(errors="replace")
            assert "Traceback" not in text and "OverflowError" not in text and "RecursionError" not in text
    finally:
        _stop(refit, assign)
    assert not _errors(refit) and not _errors(assign)


def test_the_clusters_table_of_the_name_command_skips_a_deeply_nested_record(broker):
    """``streamsemi name`` reads the clusters topic (cluster_table): a record nested 100,000 levels or not UTF-8
    before the cluster's event is skipped, the cluster is still found."""
    from streamsemi.cli import cluster_table

    topics = Topics()
    topics.create(broker.bootstrap)
    p = producer(broker.bootstrap)
    for raw in (DEEP, b'{"algorithm": "ck", "cluster": "new-2", "size": ' + DEEP + b"}", b'{"algorithm": "\xff"}'):
        p.send(topics.clusters, key=b"ck/new-2", value=raw)
    send_json(p, topics.clusters, {"algorithm": "ck", "cluster": "new-1", "event": "discovered", "size": 12},
              key="ck/new-1")
    p.flush()
    table = cluster_table(topics.settings(broker.bootstrap), timeout_s=DEADLINE)
    assert list(table) == [(None, "ck", "new-1")] and table[(None, "ck", "new-1")]["size"] == 12
