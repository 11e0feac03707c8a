"""The command line as a user meets it: demo, datasets, label/tail against the real broker."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from kafka_utils import DEADLINE, Topics, read_topic

from streamsemi.devtools.broker import free_port


def run(*args: str, timeout: float = 240, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "streamsemi", *args], capture_output=True, text=True, timeout=timeout,
                          input=stdin)


@pytest.mark.slow
def test_demo_streams_a_real_corpus_and_stops_by_itself():
    out = run("demo", "--docs", "600", "--rate", "400", "--refit-every-docs", "200",
              "--metrics-port", str(free_port()))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "embedded Tansu" in out.stdout and "/metrics" in out.stdout
    assert re.search(r"all 600 documents assigned: latest-label macro-F1 so far [0-9.]+ on \d+ non-seed documents, "
                     r"model v[1-9]", out.stdout), out.stdout
    final = re.search(r"first-emission macro-F1 ([0-9.]+) \| latest-label macro-F1 ([0-9.]+) \(with revisions\) "
                      r"on (\d+) non-seed documents, model v(\d+)", out.stdout)
    assert final, out.stdout
    first, latest, scored = float(final.group(1)), float(final.group(2)), int(final.group(3))
    # the final model version counts the revisions' models too: never below the version of the first emissions
    at_all_assigned = int(re.search(r"all 600 documents assigned: .* model v(\d+)", out.stdout).group(1))
    assert int(final.group(4)) >= at_all_assigned, out.stdout
    revised = re.search(r"(\d+) of them revised by a later model \(v(\d+)\.\.v(\d+)\)", out.stdout)
    if revised:
        assert int(revised.group(1)) <= scored and int(revised.group(3)) <= int(final.group(4)), out.stdout
    n_seeds = int(re.search(r"\(600 documents, (\d+) seeds", out.stdout).group(1))
    assert scored == 600 - n_seeds and first > 0.3 and latest >= first - 0.05, out.stdout
    assert "demo stopped (worker and broker shut down)" in out.stdout


def test_datasets_list_shows_every_corpus():
    out = run("datasets", "list")
    assert out.returncode == 0
    for name in ("20newsgroups", "reuters-r8", "reuters-r52", "reuters21578"):
        assert name in out.stdout


def test_label_unlabel_refit_reach_the_control_topic(broker):
    topics = Topics()
    flags = ["--bootstrap-servers", broker.bootstrap, "--control-topic", topics.control]
    assert run("label", *flags, "--id", "doc-1", "--label", "grain", "--label", "wheat").returncode == 0
    assert run("unlabel", *flags, "--id", "doc-1").returncode == 0
    assert run("refit", *flags).returncode == 0
    bad = run("label", *flags, "--id", "doc-2", "--label", "new-7")
    assert bad.returncode == 2 and "invalid control message" in bad.stderr
    msgs = [json.loads(r.value) for r in read_topic(broker.bootstrap, topics.control, expect=3)]
    ops = sorted((m["op"], m.get("id"), tuple(m.get("labels", ()))) for m in msgs)
    assert ops == [("label", "doc-1", ("grain", "wheat")), ("refit", None, ()), ("unlabel", "doc-1", ())]


def test_label_reads_standard_input_and_refuses_an_unreadable_file_in_one_line(broker, tmp_path):
    """``--file -`` takes the seeds from a pipe (e.g. ``streamsemi tail --live | jq ... |``); a missing file or a
    line that is not a JSON object is one error line naming it (exit 2), never a traceback."""
    topics = Topics()
    flags = ["--bootstrap-servers", broker.bootstrap, "--control-topic", topics.control]
    piped = run("label", *flags, "--file", "-", stdin='{"id": "d1", "labels": ["grain"]}\n\n{"id": "d2", "label": "crude"}\n')
    assert piped.returncode == 0, piped.stderr
    msgs = [json.loads(r.value) for r in read_topic(broker.bootstrap, topics.control, expect=2)]
    assert sorted((m["id"], tuple(m["labels"])) for m in msgs) == [("d1", ("grain",)), ("d2", ("crude",))]
    missing = run("label", *flags, "--file", str(tmp_path / "nope.jsonl"))
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert missing.stderr.strip().splitlines() == [
        f"streamsemi: configuration error: label: cannot read --file {tmp_path / 'nope.jsonl'}: "
        f"[Errno 2] No such file or directory: '{tmp_path / 'nope.jsonl'}'"]
    not_object = run("label", *flags, "--file", "-", stdin='{"id": "d3", "labels": ["grain"]}\n["d4"]\n')
    assert not_object.returncode == 2 and "<stdin>:2: not a JSON object" in not_object.stderr
    assert "Traceback" not in not_object.stderr
    assert len(read_topic(broker.bootstrap, topics.control, idle=1.0)) == 2, "a bad file sends nothing"


def test_tail_prints_json_lines(broker):
    from kafka_utils import producer, send_json

    topics = Topics()
    topics.create(broker.bootstrap)
    p = producer(broker.bootstrap)
    for i in range(3):
        send_json(p, topics.assignments, {"id": f"x{i}", "label": "a"}, key=f"x{i}")
    p.flush()
    out = run("tail", "--bootstrap-servers", broker.bootstrap, "--assignments-topic", topics.assignments,
              "--limit", "3", "--timeout", str(DEADLINE))
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert sorted(m["id"] for m in lines) == ["x0", "x1", "x2"]


def test_tail_shows_tombstones_with_their_key_and_live_reads_a_compacted_topic_as_a_table(broker):
    from kafka_utils import producer

    topics = Topics()
    topics.create(broker.bootstrap)
    p = producer(broker.bootstrap)
    records = [(doc_id, {"id": doc_id, "rank": rank}) for doc_id, rank in (("s1", 0), ("s2", 1), ("s3", 2), ("s1", 5))]
    records += [("s2", None), (None, {"id": "keyless", "rank": 9})]  # s2 was labelled: its suggestion is deleted
    for key, value in records:  # one partition: the order of the table is the order of writing
        p.send(topics.suggestions, key=None if key is None else key.encode(),
               value=None if value is None else json.dumps(value).encode(), partition=0)
    p.flush()
    # --timeout: the quiet time that ends a read, counted from tail's start (its first fetch included): the
    # default 10 s, not 2 s, so that a loaded machine's slow first fetch does not end --live with an empty table
    flags = ["--bootstrap-servers", broker.bootstrap, "--topic", topics.suggestions]
    plain = [json.loads(line) for line in run("tail", *flags, "--limit", "6").stdout.splitlines()]
    assert plain[4] == {"key": "s2", "tombstone": True} and len(plain) == 6
    live = run("tail", *flags, "--live")
    assert live.returncode == 0
    assert [json.loads(line) for line in live.stdout.splitlines()] == [
        {"id": "s3", "rank": 2}, {"id": "s1", "rank": 5}, {"id": "keyless", "rank": 9}]
    newest = run("tail", *flags, "--live", "--limit", "1")
    assert [json.loads(line) for line in newest.stdout.splitlines()] == [{"id": "keyless", "rank": 9}]
    refused = run("tail", *flags, "--live", "--follow")
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        "streamsemi: configuration error: tail: --live prints the table once the topic is read; it cannot --follow"]


def test_unreachable_broker_gives_a_clear_error():
    """One line and exit 1. The commands wait CLI_KAFKA_TIMEOUT_S (10 s), not kafka-python's 30 s: a duration this
    run does not time (a loaded machine stretches it); the in-process ``tail`` test below checks the bootstrap
    timeout asked for."""
    port = free_port()
    out = run("produce", "--bootstrap-servers", f"127.0.0.1:{port}", "--corpus", "reuters-r8", "--limit", "1",
              timeout=DEADLINE)
    assert out.returncode == 1 and f"cannot reach Kafka at 127.0.0.1:{port}" in out.stderr


def test_tail_without_a_broker_or_with_a_bad_limit_is_one_line(monkeypatch, capsys):
    """An unreachable broker makes kafka-python's consumer raise at bootstrap (``KafkaTimeoutError`` after
    ``bootstrap_timeout_ms``, 10 s for ``tail``): one line and exit 1, not a traceback. In process, the
    consumer's failure stands in for the 10-second wait."""
    from kafka.errors import KafkaTimeoutError

    from streamsemi import cli
    from streamsemi.service import kafka_io

    asked = {}

    def unreachable(settings, **overrides):
        asked.update(overrides)
        raise KafkaTimeoutError("Unable to bootstrap from 127.0.0.1:1")

    monkeypatch.setattr(kafka_io, "make_reader", unreachable)
    # past the quick TCP check (tests/test_cli_newcomer.py): a listener that is no Kafka broker
    monkeypatch.setattr(kafka_io, "bootstrap_problem", lambda servers: None)
    assert cli.main(["tail", "--bootstrap-servers", "127.0.0.1:1", "--topic", "streamsemi.suggestions"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "streamsemi: cannot reach Kafka at 127.0.0.1:1 to read streamsemi.suggestions: "
        "KafkaTimeoutError: Unable to bootstrap from 127.0.0.1:1"]
    assert {k: v for k, v in asked.items() if k == "bootstrap_timeout_ms"} == kafka_io.bootstrap_timeout(10000)
    assert cli.main(["tail", "--bootstrap-servers", "127.0.0.1:1", "--limit", "0"]) == 2
    assert "--limit must be at least 1, got 0" in capsys.readouterr().err


def _missing_codec() -> str | None:
    import kafka.codec

    for codec, check in (("snappy", kafka.codec.has_snappy), ("lz4", kafka.codec.has_lz4), ("zstd", kafka.codec.has_zstd)):
        if not check():
            return codec
    return None


def _assert_one_line_config_error(out: subprocess.CompletedProcess, *fragments: str) -> None:
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("streamsemi: configuration error: setting '"), out.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.mark.parametrize("case", ["compression", "heartbeat", "metrics_host", "topic", "state_dir", "env", "port"])
def test_worker_refuses_bad_settings_in_one_line_without_traceback(tmp_path, case):
    """`streamsemi run` as a user starts it: exit 2, one line naming the setting, no traceback."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMSEMI_") or k in ("STREAMSEMI_DATA_DIR", "STREAMSEMI_TANSU")}
    args = ["run", "--bootstrap-servers", f"127.0.0.1:{free_port()}", "--metrics-port", "0"]
    if case == "compression":
        codec = _missing_codec()
        if codec is None:
            pytest.skip("every compression library is installed")
        args += ["--compression", codec]
        expect = ("setting 'compression' (from flag --compression)", f"got '{codec}'")
    elif case == "heartbeat":
        args += ["--heartbeat-interval-ms", "10000", "--session-timeout-ms", "10000"]
        expect = ("setting 'heartbeat_interval_ms'", "got 10000")
    elif case == "metrics_host":
        args += ["--metrics-host", "not a host"]
        expect = ("setting 'metrics_host' (from flag --metrics-host)", "got 'not a host'")
    elif case == "topic":
        args += ["--documents-topic", ""]
        expect = ("setting 'documents_topic' (from flag --documents-topic)", "got ''")
    elif case == "state_dir":
        blocker = tmp_path / "file"
        blocker.write_text("x")
        args += ["--state-dir", str(blocker / "state")]
        expect = ("setting 'state_dir' (from flag --state-dir): must be a writable directory",)
    elif case == "env":
        env["STREAMSEMI_WINDOW_MAXDOCS"] = "5"
        expect = ()
    else:
        args = ["run", "--metrics-port", "99999"]
        expect = ("setting 'metrics_port' (from flag --metrics-port)", "got 99999")
    out = subprocess.run([sys.executable, "-m", "streamsemi", *args], capture_output=True, text=True, timeout=120, env=env)
    if case == "env":
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert out.stderr.strip() == ("streamsemi: configuration error: environment variable STREAMSEMI_WINDOW_MAXDOCS: "
                                      "not a streamsemi setting (did you mean 'STREAMSEMI_WINDOW_MAX_DOCS'?)")
        return
    _assert_one_line_config_error(out, *expect)


def test_worker_whose_metrics_port_is_taken_stops_with_the_setting_named():
    """A check that only the running worker can make (the port is bound by another process)."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = run("run", "--bootstrap-servers", f"127.0.0.1:{free_port()}", "--metrics-port", str(port), timeout=120)
    _assert_one_line_config_error(out, "setting 'metrics_port': must be a port this host can listen on",
                                  f"got 127.0.0.1:{port}")


@pytest.mark.parametrize(("toml", "fragment"), [
    (b"streamsemi = 5\n", "setting 'streamsemi'"),
    (b'log_level = "caf\xe9"\n', "must be UTF-8 text, got byte 0xe9 on line 1"),
    (None, "must be a regular file, got a directory"),
    (b"window_max_docs = [\n", "is not valid TOML"),
])
def test_bad_config_file_is_one_line(tmp_path, toml, fragment):
    path = tmp_path
    if toml is not None:
        path = tmp_path / "s.toml"
        path.write_bytes(toml)
    _assert_one_line_config_error(run("run", "--config", str(path), "--print-config", timeout=60), fragment)


def test_broker_port_out_of_range_is_a_config_error():
    out = run("broker", "--port", "99999", timeout=60)
    _assert_one_line_config_error(out, "setting 'port' (embedded broker): must be a TCP port 1..65535", "got 99999")
