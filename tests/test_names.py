"""Names (streamsemi.core.names): class labels, stream names, cluster ids, algorithm names, instance ids.

The rules, for every kind of name and the hostile values (a trailing newline, surrounding
whitespace, zero-width and bidi characters, path components, NUL, tab, empty, too long);
then through the real paths: the control-message parser and its JSON Schema, the settings,
``streamsemi label`` / ``name`` (refused before anything is sent, status 2), the console's
writer, stream routing, and two workers on the embedded broker (a seed labelled
``"grain\\n"`` and documents of stream ``..`` are dead-lettered with their reason while the
good documents around them are all assigned).
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from streamsemi.algorithms import REGISTRY
from streamsemi.core.clusters import cluster_number
from streamsemi.core.errors import ConfigError
from streamsemi.core.messages import ControlMessage, Limits, Rejected, parse_control
from streamsemi.core.names import KINDS, RULES, InvalidName, check_name, valid_name
from streamsemi.core.telemetry import Telemetry
from streamsemi.engine import EngineConfig
from streamsemi.service.config import resolve

#: a legal name of each kind, from which the hostile variants are made
BASE = {"label": "grain", "stream": "news", "cluster": "new-3", "algorithm": "constrained-kmeans",
        "instance": "worker-1"}


def _hostile(kind: str) -> list[tuple[str, object]]:
    """(what, value) pairs no name of ``kind`` may be."""
    b, n = BASE[kind], RULES[kind].max_chars
    return [
        ("trailing newline", b + "\n"), ("leading space", " " + b), ("trailing space", b + " "),
        ("zero-width space", b[:2] + "\u200b" + b[2:]), ("bidi override", "\u202e" + b),
        ("byte order mark", "\ufeff" + b), ("line separator", b + "\u2028" + b),
        ("dot", "."), ("dot dot", ".."), ("slash", b[:1] + "/" + b[1:]), ("backslash", b[:1] + "\\" + b[1:]),
        ("empty", ""), ("too long", (b * n)[:n] + b[-1]), ("NUL", b[:2] + "\x00" + b[2:]),
        ("tab", b[:2] + "\t" + b[2:]), ("not a string", 3), ("None", None),
    ]


HOSTILE = [(kind, what, value) for kind in KINDS for what, value in _hostile(kind)]

#: names legal today that stay legal
LEGAL = {
    "label": ["grain", "money-fx", "comp.sys.ibm.pc.hardware", "a b", "x:y&z+w_1", "_", "g" * 64, "Grain2"],
    "stream": ["news", "a.b_c-1", "s" * 64, "..a", "a..b"],
    "cluster": ["new-1", "new-0", "new-123456789"],
    "algorithm": sorted(REGISTRY),
    "instance": ["w1", "host-123", "my pod 1", "w" * 253, "wörker"],
}


@pytest.mark.parametrize(("kind", "what", "value"), HOSTILE, ids=[f"{k}-{w}" for k, w, _ in HOSTILE])
def test_hostile_values_are_no_name_of_any_kind(kind, what, value) -> None:
    reason = check_name(kind, value)
    assert isinstance(reason, str) and reason.startswith("must"), (what, reason)
    with pytest.raises(InvalidName) as exc:
        valid_name(kind, value)
    assert isinstance(exc.value, ValueError) and (exc.value.kind, exc.value.reason) == (kind, reason)
    assert str(exc.value).startswith(f"{kind} ") and str(exc.value).endswith(reason)


@pytest.mark.parametrize(("kind", "value"), [(k, v) for k in KINDS for v in LEGAL[k]])
def test_legal_names_are_accepted_unchanged(kind, value) -> None:
    assert check_name(kind, value) is None
    assert valid_name(kind, value) == value


@pytest.mark.parametrize(("kind", "value", "reason"), [
    ("label", "grain\n", "must not end with whitespace (U+000A LINE FEED)"),
    ("label", " grain", "must not start with whitespace (U+0020 SPACE)"),
    ("label", "gr\u200bain", "must not contain control or format characters (U+200B ZERO WIDTH SPACE at position 2)"),
    ("label", "\u202egrain", "must not contain control or format characters "
                             "(U+202E RIGHT-TO-LEFT OVERRIDE at position 0)"),
    ("label", "gr\tain", "must not contain control or format characters (U+0009 TAB at position 2)"),
    ("label", "gr\x00ain", "must not contain control or format characters (U+0000 NUL at position 2)"),
    ("label", "..", "must not be '.' or '..' (a path component)"),
    ("label", "a/b", "must not contain '/' or '\\'"),
    ("label", "", "must not be empty"),
    ("label", "g" * 65, "must have at most 64 characters, got 65"),
    ("label", "new-7", "must not start with 'new-' (reserved for discovered clusters)"),
    ("label", "-grain", "must be a letter, digit or '_' first, then letters, digits, spaces and _ . : & + -, "
                        "not ending with a space"),
    ("stream", ".", "must not be '.' or '..' (a path component)"),
    ("stream", "a b", "must be letters, digits and . _ -"),
    ("cluster", "new-3\n", "must not end with whitespace (U+000A LINE FEED)"),
    ("cluster", "new-\u0663", "must be a discovered cluster id new-N (N of 1-9 digits)"),
    ("instance", 7, "must be a string, got int"),
])
def test_the_reason_says_what_is_wrong(kind, value, reason) -> None:
    assert check_name(kind, value) == reason


def test_a_label_pattern_narrows_the_rule_and_never_widens_it() -> None:
    assert check_name("label", "abc", pattern=r"[a-z]{2}") == "must match [a-z]{2}"
    assert check_name("label", "ab", pattern=r"[a-z]{2}") is None
    assert check_name("label", "grain\n", pattern=r"^grain$") is not None   # fullmatch: "$" admits no newline
    assert check_name("label", "a/b", pattern=r".+") == "must not contain '/' or '\\'"
    assert check_name("label", "x" * 65, pattern=r".+") == "must have at most 64 characters, got 65"
    limits = Limits(label_pattern=r"^[a-z]{2}$")
    assert limits.label_problem("ab") is None and limits.label_problem("ab\n") is not None


# ---------------------------------------------------------------- control messages: the parser and its schema
def _label_op(label: object) -> str:
    return json.dumps({"op": "label", "id": "d1", "labels": [label], "text": "wheat harvest"})


LABEL_HOSTILE = [(w, v) for w, v in _hostile("label") if isinstance(v, str)]


@pytest.mark.parametrize(("what", "label"), LABEL_HOSTILE, ids=[w for w, _ in LABEL_HOSTILE])
def test_a_label_op_with_a_hostile_label_is_rejected_naming_the_field(what, label) -> None:
    rej = parse_control(_label_op(label))
    assert rej == Rejected("invalid_label", f"'labels': label {label[:80]!r} {check_name('label', label)}")


@pytest.mark.parametrize(("what", "label"), LABEL_HOSTILE, ids=[w for w, _ in LABEL_HOSTILE])
def test_a_name_op_with_a_hostile_label_is_rejected_naming_the_field(what, label) -> None:
    rej = parse_control(json.dumps({"op": "name", "cluster": "new-1", "label": label}))
    assert rej == Rejected("invalid_label", f"'label': label {label[:80]!r} {check_name('label', label)}")


def test_a_name_op_refuses_hostile_cluster_ids_and_algorithm_names() -> None:
    rej = parse_control(json.dumps({"op": "name", "cluster": "new-1\n", "label": "shipping"}))
    assert rej == Rejected("unknown_cluster", "'cluster': 'new-1\\n' must not end with whitespace (U+000A LINE FEED)")
    rej = parse_control(json.dumps({"op": "name", "cluster": "new-1", "label": "shipping",
                                    "algorithm": "constrained-kmeans\n"}))
    assert rej == Rejected("wrong_type", "'algorithm': 'constrained-kmeans\\n' must not end with whitespace "
                                         "(U+000A LINE FEED)")
    rej = parse_control(json.dumps({"op": "name", "cluster": "new-1", "label": "shipping", "algorithm": ".."}))
    assert rej.reason == "wrong_type" and "'..' must not be '.' or '..'" in rej.detail
    assert parse_control(json.dumps({"op": "name", "cluster": "new-1", "label": "shipping", "algorithm": 5})) == \
        Rejected("wrong_type", "'algorithm' must be a string, got int")
    ok = parse_control(json.dumps({"op": "name", "cluster": "new-12", "label": "ship ping", "algorithm": "fsl-ck"}))
    assert ok == ControlMessage(op="name", labels=("ship ping",), cluster="new-12", algorithm="fsl-ck")


def test_cluster_numbers_are_read_from_whole_cluster_ids_only() -> None:
    assert cluster_number("new-3") == 3 and cluster_number("new-123456789") == 123456789
    assert cluster_number("new-3\n") is None and cluster_number("new-\u0663") is None  # (ARABIC-INDIC DIGIT THREE)
    assert cluster_number("new-3 ") is None and cluster_number("grain") is None


def test_the_control_schema_refuses_the_labels_the_parser_refuses() -> None:
    schema = json.loads((Path(__file__).resolve().parent.parent / "docs" / "schemas" / "control.schema.json")
                        .read_text())
    v = jsonschema.Draft202012Validator(schema)
    for _, label in LABEL_HOSTILE + [("reserved", "new-2")]:
        assert not v.is_valid({"op": "label", "id": "d", "labels": [label]}), repr(label)
        assert not v.is_valid({"op": "name", "cluster": "new-1", "label": label}), repr(label)
    for label in LEGAL["label"]:
        assert v.is_valid({"op": "label", "id": "d", "labels": [label]}), label
        assert v.is_valid({"op": "name", "cluster": "new-1", "label": label}), label
    assert not v.is_valid({"op": "name", "cluster": "new-1\n", "label": "x"})
    assert not v.is_valid({"op": "name", "cluster": "new-1", "label": "x", "algorithm": "cle\n"})
    assert v.is_valid({"op": "name", "cluster": "new-1", "label": "x", "algorithm": "cle"})


# ---------------------------------------------------------------- configuration, command line, console, routing
@pytest.mark.parametrize(("setting", "bad", "good"), [
    ("streams", "news,..", "news, a.b_c-1"), ("streams", "news,.", "news,..a"),
    ("default_stream", "..", "news"), ("default_stream", "news\n", "news"),
    ("instance_id", "w1\n", "my pod 1"), ("instance_id", "w/1", "w-1"), ("instance_id", "\u202ew1", "wörker"),
    ("documents_topic", "docs\n", "docs"),
])
def test_a_bad_name_in_the_settings_fails_at_start_naming_the_setting(setting, bad, good) -> None:
    assert resolve({setting: good, "metrics_port": "0"}).values[setting] == good
    with pytest.raises(ConfigError, match=rf"^setting '{setting}' \(from flag --{setting.replace('_', '-')}\): must"):
        resolve({setting: bad, "metrics_port": "0"})


@pytest.mark.parametrize(("argv", "says"), [
    (["name", "new-1", "grain\n"], "'label': label 'grain\\n' must not end with whitespace"),
    (["name", "new-1\n", "grain"], "'cluster': 'new-1\\n' must not end with whitespace"),
    (["name", "new-1", "grain", "--algorithm", "cle\n"], "'algorithm': 'cle\\n' must not end with whitespace"),
    (["label", "--id", "d1", "--label", "grain\n"], "'labels': label 'grain\\n' must not end with whitespace"),
    (["label", "--id", "d1", "--label", "gr\u200bain"], "U+200B ZERO WIDTH SPACE"),
    (["label", "--id", "d1", "--label", "grain", "--stream", ".."], "'stream': '..' must not be '.' or '..'"),
    (["name", "new-1", "grain", "--stream", "a/b"], "'stream': 'a/b' must not contain '/'"),
])
def test_the_cli_refuses_a_bad_name_before_sending(argv, says, capsys) -> None:
    from streamsemi.cli import main

    # nothing listens on port 1: a command that got past the check would fail to connect instead (status 1)
    code = main([*argv, "--bootstrap-servers", "127.0.0.1:1"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("streamsemi: configuration error: invalid control message") and says in err, err


def test_the_console_refuses_what_the_worker_would_dead_letter() -> None:
    from streamsemi.console.writer import ControlWriter

    w = ControlWriter(resolve({"metrics_port": "0"}), producer=object())  # never used: validation comes first
    assert w.validate({"op": "name", "cluster": "new-1", "label": "grain\n"}) == \
        "'label': label 'grain\\n' must not end with whitespace (U+000A LINE FEED)"
    assert w.validate({"op": "label", "id": "d", "labels": ["grain"], "stream": ".."}) == \
        "'stream': '..' must not be '.' or '..' (a path component)"
    assert w.validate({"op": "label", "id": "d", "labels": ["grain"], "stream": "news"}) is None
    with pytest.raises(ValueError, match="must not end with whitespace"):
        w.send({"op": "label", "id": "d", "labels": ["grain\n"]})


def _any_streams():
    from streamsemi.service.streams import StreamEngines

    config = EngineConfig(algorithms=["constrained-kmeans"], background_refit=False, n_features=2**12,
                          drift_detection=False)
    return StreamEngines(config, Telemetry(), ["*"], "default", 8, worker="w1")


@pytest.mark.parametrize("stream", ["..", ".", "news\n", " news", "a/b", "a\\b", "ne\u200bws", "n\x00ews", ""])
def test_a_stream_that_is_no_name_is_routed_nowhere_even_with_any_stream(stream) -> None:
    se = _any_streams()
    got = se.route(stream)
    assert isinstance(got, Rejected) and got.reason == "unknown_stream"
    assert got.detail == f"stream {stream[:80]!r} is not a stream name: it {check_name('stream', stream)}"
    assert set(se.engines) == {"default"}
    assert se.route("news") == "news" and set(se.engines) == {"default", "news"}


def test_stream_engines_refuse_names_that_are_no_stream_names() -> None:
    from streamsemi.service.streams import StreamEngines

    config = EngineConfig(algorithms=["constrained-kmeans"], background_refit=False, n_features=2**12)
    for names, default in ((["news", ".."], "news"), (["news"], "news\n")):
        with pytest.raises(InvalidName):
            StreamEngines(config, Telemetry(), names, default, 8)


# ---------------------------------------------------------------- through a worker on the embedded broker
@pytest.fixture(scope="module")
def r8():
    from streamsemi.core import datasets

    return datasets.load("reuters-r8")


def _dead_letters(bootstrap: str, topic: str, expect: int) -> dict[tuple[str, int, int], dict]:
    from kafka_utils import read_topic

    dead = [json.loads(r.value) for r in read_topic(bootstrap, topic, expect=expect, timeout=120)]
    return {(d["topic"], d["partition"], d["offset"]): d for d in dead}


def _assigned(bootstrap: str, topic: str, expect: set[str], timeout: float = 180.0) -> list[dict]:
    """Every assignment on ``topic`` once all of ``expect`` are assigned (or ``timeout`` passes)."""
    import time

    from kafka_utils import read_topic

    t0 = time.monotonic()
    while True:
        out = [json.loads(r.value) for r in read_topic(bootstrap, topic, timeout=30, idle=2.0)]
        if expect <= {a["id"] for a in out} or time.monotonic() - t0 > timeout:
            return out


def _errors(worker) -> list[dict]:
    return [e for e in worker.logs() if (e.get("level") in ("error", "critical") and e.get("logger", "").startswith("streamsemi"))
            or "Traceback" in e.get("raw", "")]


def _seeds(r8, classes: list[str]) -> list[dict]:
    return [{"op": "label", "id": f"s-{c}", "labels": [c], "text": r8.texts[r8.labels.index(c)]} for c in classes]


def test_a_seed_labelled_grain_newline_is_dead_lettered_and_the_documents_around_it_are_assigned(broker, tmp_path, r8):
    from kafka_utils import Topics, WorkerProcess, producer, send_json

    topics = Topics()
    topics.create(broker.bootstrap)
    classes = ["acq", "crude", "earn", "grain"]
    w = WorkerProcess(broker.bootstrap, topics, ["--refit-every-docs", "0", "--min-docs-first-refit", "40",
                                                 "--no-drift-detection"], log_dir=tmp_path).start()
    good = [f"g{i}" for i in range(80)]
    try:
        assert w.wait_assigned(60)
        p = producer(broker.bootstrap)
        for msg in _seeds(r8, classes):
            send_json(p, topics.control, msg, key=msg["id"])
        grain_text = r8.texts[[i for i, c in enumerate(r8.labels) if c == "grain"][1]]
        for i, doc_id in enumerate(good[:40]):
            send_json(p, topics.documents, {"id": doc_id, "text": r8.texts[200 + 37 * i]}, key=doc_id)
        bad = [p.send(topics.control, key=b"bad-seed", value=json.dumps(
                   {"op": "label", "id": "bad-seed", "labels": ["grain\n"], "text": grain_text}).encode()),
               p.send(topics.control, key=b"new-1", value=json.dumps(
                   {"op": "name", "cluster": "new-1", "label": "grain\n"}).encode())]
        for i, doc_id in enumerate(good[40:], 40):
            send_json(p, topics.documents, {"id": doc_id, "text": r8.texts[200 + 37 * i]}, key=doc_id)
        p.flush()
        where = [(m.topic, m.partition, m.offset) for m in (f.get(timeout=30) for f in bad)]
        out = _assigned(broker.bootstrap, topics.assignments, set(good))
        assert {a["id"] for a in out} == set(good)
        served = {a["label"] for a in out} | {k for a in out for k in a["labels"]}
        assert served - {None} <= set(classes), served
        dead = _dead_letters(broker.bootstrap, topics.deadletter, 2)
        assert set(dead) == set(where)
        label_op, name_op = (dead[k] for k in where)
        assert label_op["reason"] == name_op["reason"] == "invalid_label"
        assert label_op["detail"] == "'labels': label 'grain\\n' must not end with whitespace (U+000A LINE FEED)"
        assert name_op["detail"] == "'label': label 'grain\\n' must not end with whitespace (U+000A LINE FEED)"
        assert w.metric("streamsemi_dead_letters_total", {"reason": "invalid_label"}) == 2
        assert w.proc.poll() is None
    finally:
        assert w.terminate() == 0
    assert not _errors(w)


def test_documents_of_stream_dot_dot_are_dead_lettered_with_any_stream_allowed(broker, tmp_path, r8):
    from kafka_utils import Topics, WorkerProcess, producer, send_json

    topics = Topics()
    topics.create(broker.bootstrap)
    w = WorkerProcess(broker.bootstrap, topics, ["--streams", "*", "--max-streams", "4", "--refit-every-docs", "0",
                                                 "--min-docs-first-refit", "40", "--no-drift-detection",
                                                 "--state-dir", str(tmp_path / "state")], log_dir=tmp_path).start()
    good = [f"g{i}" for i in range(60)]
    streams = ["..", ".", "news\n", "a/b", "ne\u200bws"]
    try:
        assert w.wait_assigned(60)
        p = producer(broker.bootstrap)
        for msg in _seeds(r8, ["acq", "crude", "earn", "grain"]):
            send_json(p, topics.control, msg, key=msg["id"])
        bad = []
        for i, doc_id in enumerate(good):
            send_json(p, topics.documents, {"id": doc_id, "text": r8.texts[300 + 41 * i]}, key=doc_id)
            if i % 10 == 5:
                stream = streams[len(bad) % len(streams)]
                bad.append((p.send(topics.documents, key=f"b{i}".encode(), value=json.dumps(
                    {"id": f"b{i}", "text": r8.texts[300 + 41 * i], "stream": stream}).encode()), stream))
        bad.append((p.send(topics.control, key=b"s-x", value=json.dumps(
            {"op": "label", "id": "s-x", "labels": ["grain"], "text": "wheat", "stream": ".."}).encode()), ".."))
        p.flush()
        where = {(m.topic, m.partition, m.offset): stream for m, stream in ((f.get(timeout=30), s) for f, s in bad)}
        out = _assigned(broker.bootstrap, topics.assignments, set(good))
        assert {a["id"] for a in out} == set(good), "a good document was not assigned"
        dead = _dead_letters(broker.bootstrap, topics.deadletter, len(where))
        assert set(dead) == set(where)
        for key, stream in where.items():
            assert dead[key]["reason"] == "unknown_stream"
            assert dead[key]["detail"] == f"stream {stream!r} is not a stream name: it {check_name('stream', stream)}"
        _, body = w.get("/readyz")
        assert set(json.loads(body)["streams"]) == {"default"}, "an engine was made for a stream that is no name"
        assert w.proc.poll() is None
    finally:
        assert w.terminate() == 0
    assert not _errors(w)
