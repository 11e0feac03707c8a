"""The command line as a user meets it: demo, datasets, label/tail against the real broker."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from kafka_utils import Topics, read_topic

from streamsemi.devtools.broker import free_port


def run(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "streamsemi", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_demo_streams_a_real_corpus_and_stops_by_itself():
    out = run("demo", "--docs", "600", "--rate", "400", "--refit-every-docs", "200",
              "--metrics-port", str(free_port()))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "embedded Tansu" in out.stdout and "/metrics" in out.stdout
    final = re.search(r"all 600 documents assigned: macro-F1 ([0-9.]+) on (\d+) non-seed documents, model v(\d+)", out.stdout)
    assert final, out.stdout
    assert float(final.group(1)) > 0.3 and int(final.group(3)) >= 1
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
    msgs = [json.loads(r.value) for r in read_topic(broker.bootstrap, topics.control, expect=3, timeout=30)]
    ops = sorted((m["op"], m.get("id"), tuple(m.get("labels", ()))) for m in msgs)
    assert ops == [("label", "doc-1", ("grain", "wheat")), ("refit", None, ()), ("unlabel", "doc-1", ())]


def test_tail_prints_json_lines(broker):
    from kafka_utils import producer, send_json

    topics = Topics()
    topics.create(broker.bootstrap)
    p = producer(broker.bootstrap)
    for i in range(3):
        send_json(p, topics.assignments, {"id": f"x{i}", "label": "a"}, key=f"x{i}")
    p.flush()
    out = run("tail", "--bootstrap-servers", broker.bootstrap, "--assignments-topic", topics.assignments,
              "--limit", "3", "--timeout", "10")
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert sorted(m["id"] for m in lines) == ["x0", "x1", "x2"]


def test_unreachable_broker_gives_a_clear_error():
    port = free_port()
    out = run("produce", "--bootstrap-servers", f"127.0.0.1:{port}", "--corpus", "reuters-r8", "--limit", "1",
              timeout=120)
    assert out.returncode == 1 and f"cannot reach Kafka at 127.0.0.1:{port}" in out.stderr
