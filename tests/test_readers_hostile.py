"""One bad record is one bad record: readers of topics and files skip it, count it, say why, and go on.

The console (its reader thread on the real broker, its pages served by uvicorn), ``streamsemi tail``,
the in-flight marker and the control-rejections file, fed records nobody's schema allows: JSON nested
100,000 levels, numbers beyond a double, NaN, bytes that are not UTF-8, null, lists for objects,
fields of the wrong type. The parser they share is :mod:`streamsemi.core.jsonsafe`.
"""

from __future__ import annotations

import json
import logging

import pytest
from kafka_utils import Topics, producer, wait_for
from test_console import Served, _request

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
