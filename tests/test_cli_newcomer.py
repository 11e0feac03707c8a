"""The command line as a new user meets it: commands that fail say so, promptly, and name what they tried.

Against the real embedded broker (fixture ``broker``) and real ``streamsemi`` processes.
"""

from __future__ import annotations

import json
import logging
import os
import pty
import re
import select
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from kafka_utils import Topics, WorkerProcess, producer, read_topic, send_json

from streamsemi.core import logs

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str, timeout: float = 120) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "streamsemi", *args], capture_output=True, text=True,
                         timeout=timeout, stdin=subprocess.DEVNULL)
    return out, time.monotonic() - t0


def closed_port() -> int:
    """A loopback port nothing listens on (bound and closed again: connections to it are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- refusals before anything is sent
def test_name_with_an_algorithm_nobody_runs_is_refused_and_nothing_is_sent(broker):
    topics = Topics()
    topics.create(broker.bootstrap)
    out, _ = run("name", "new-99", "shipping", "--algorithm", "nope", "--bootstrap-servers", broker.bootstrap,
                 *topics.flags())
    assert out.returncode == 2, out.stdout + out.stderr
    assert "control_sent" not in out.stdout
    assert "unknown algorithm 'nope'" in out.stderr and "constrained-kmeans" in out.stderr, out.stderr
    assert read_topic(broker.bootstrap, topics.control, timeout=5, idle=1.0) == []


@pytest.mark.slow
def test_name_is_checked_against_the_algorithms_the_worker_runs(broker, tmp_path):
    """A registered algorithm the worker does not run: refused from its /readyz, then from the clusters topic;
    a cluster id the topic does not have is refused too."""
    topics = Topics()
    worker = WorkerProcess(broker.bootstrap, topics, ["--algorithms", "constrained-kmeans",
                                                      "--min-docs-first-refit", "30", "--refit-idle-s", "1",
                                                      "--first-fit-stable-seeds", "0"], log_dir=tmp_path).start()
    try:
        assert worker.wait_assigned(120), worker.log_path.read_text()[-3000:]
        url = f"http://127.0.0.1:{worker.metrics_port}"
        flags = ["--bootstrap-servers", broker.bootstrap, *topics.flags()]
        out, _ = run("name", "new-1", "shipping", "--algorithm", "cle", "--worker-url", url, *flags)
        assert out.returncode == 2, out.stdout + out.stderr
        assert "the worker does not run cle (it runs constrained-kmeans; from the worker's" in out.stderr, out.stderr
        assert "/readyz" in out.stderr

        p = producer(broker.bootstrap)
        words = {"grain": "wheat corn harvest", "crude": "oil barrel opec", "trade": "tariff export deficit",
                 "ship": "port vessel cargo"}
        for i in range(80):
            label = list(words)[i % 4]
            send_json(p, topics.documents, {"id": f"d{i}", "text": f"{words[label]} report {i}"}, key=f"d{i}")
            if i < 16:
                send_json(p, topics.control, {"op": "label", "id": f"d{i}", "labels": [label]}, key=f"d{i}")
        p.flush()
        events = read_topic(broker.bootstrap, topics.clusters, expect=4, timeout=180)
        assert len(events) >= 4, worker.log_path.read_text()[-3000:]

        out, _ = run("name", "new-1", "shipping", "--algorithm", "cle", *flags)
        assert out.returncode == 2, out.stdout + out.stderr
        assert f"the worker does not run cle (it runs constrained-kmeans; from the clusters topic {topics.clusters})" \
            in out.stderr, out.stderr
        out, _ = run("name", "new-99", "shipping", "--algorithm", "constrained-kmeans", *flags)
        assert out.returncode == 2, out.stdout + out.stderr
        assert "'new-99' of constrained-kmeans is not on the clusters topic (its discovered clusters: none)" \
            in out.stderr, out.stderr
        assert f"name: checked against the clusters topic {topics.clusters}" in out.stderr, out.stderr
        assert read_topic(broker.bootstrap, topics.control, timeout=10, idle=1.0) != [] and not any(
            json.loads(r.value).get("op") == "name" for r in read_topic(broker.bootstrap, topics.control, timeout=10,
                                                                          idle=1.0)), "a refused name is not sent"
    finally:
        worker.terminate()


def test_a_name_is_judged_by_the_latest_lifecycle_event_of_its_cluster():
    from streamsemi.cli import name_problem

    ck = "constrained-kmeans"
    events = {(None, ck, "grain"): {"event": "born"}, (None, ck, "new-2"): {"event": "continued"},
              (None, ck, "new-1"): {"event": "merged_into", "target": "new-2", "model_version": 4},
              (None, ck, "new-3"): {"event": "retired", "target": None, "model_version": 5}}
    src = "the clusters topic c"
    assert name_problem(ck, "new-2", None, [ck], src, events) is None
    assert name_problem(ck, "new-1", None, [ck], src, events) == "new-1 of constrained-kmeans was merged into new-2 (model v4)"
    assert name_problem(ck, "new-3", None, [ck], src, events) == "new-3 of constrained-kmeans was retired (model v5)"
    assert name_problem(ck, "grain", None, [ck], src, events) == (
        "'grain' of constrained-kmeans is a seeded class, not a discovered cluster (its discovered clusters: new-2)")
    assert name_problem(None, "new-9", None, [ck], src, events) is None, "the primary is the worker's to know"
    assert name_problem("semi-ldc", "new-2", None, [ck], src, events) == (
        "the worker does not run semi-ldc (it runs constrained-kmeans; from the clusters topic c)")
    per_stream = {("news", ck, "new-2"): {"event": "born"}}
    assert name_problem(ck, "new-5", None, [ck], src, per_stream) is None, "per-stream clusters: --stream decides"
    assert "not on the clusters topic" in name_problem(ck, "new-5", "news", [ck], src, per_stream)


def test_produce_refuses_a_rate_that_is_not_positive():
    for rate in ("-1", "0", "nan"):
        out, _ = run("produce", "--corpus", "reuters-r8", "--rate", rate, "--bootstrap-servers", "127.0.0.1:1")
        assert out.returncode == 2, (rate, out.stdout + out.stderr)
        assert f"argument --rate: must be a positive number of documents per second, got {rate}" in out.stderr
        assert "produced" not in out.stdout


# ---------------------------------------------------------------- prompt failures
def test_tail_on_a_missing_topic_gives_up_after_its_timeout(broker):
    out, seconds = run("tail", "--bootstrap-servers", broker.bootstrap, "--topic", f"no.such.{os.getpid()}.topic",
                       "--timeout", "3")
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"topic 'no.such.{os.getpid()}.topic' not found on {broker.bootstrap}" in out.stderr
    assert "--timeout 3 s" in out.stderr
    assert seconds < 20, f"took {seconds:.1f} s for --timeout 3 (it waited a fixed 30 s)"


@pytest.mark.parametrize("command", [
    ["label", "--id", "doc-1", "--label", "grain"],
    ["refit"],
    ["tail", "--timeout", "30"],
    ["produce", "--corpus", "reuters-r8", "--limit", "5"],
])
def test_an_unreachable_broker_is_reported_promptly_with_the_address_tried(command):
    port = closed_port()
    out, seconds = run(*command, "--bootstrap-servers", f"127.0.0.1:{port}")
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"cannot reach Kafka at 127.0.0.1:{port}" in out.stderr, out.stderr
    assert f"tried 127.0.0.1:{port}: Connection refused" in out.stderr, out.stderr
    assert seconds < 10, f"{command[0]}: {seconds:.1f} s to report a refused address"


def test_the_worker_says_at_once_that_the_broker_does_not_answer(tmp_path):
    """``run`` waits for a broker that may be starting, but its first log lines name the address it tried."""
    port = closed_port()
    proc = subprocess.Popen([sys.executable, "-m", "streamsemi", "run", "--bootstrap-servers", f"127.0.0.1:{port}",
                             "--metrics-port", "0", "--no-refit-process"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 10
        seen = []
        while time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stderr], [], [], 0.5)
            if ready:
                line = proc.stderr.readline()
                if not line:
                    break
                seen.append(line)
                if '"kafka_unreachable"' in line:
                    ev = json.loads(line)
                    assert ev["level"] == "warning" and ev["bootstrap_servers"] == f"127.0.0.1:{port}"
                    assert ev["tried"] == f"127.0.0.1:{port}: Connection refused"
                    return
        pytest.fail(f"no kafka_unreachable event within 10 s: {''.join(seen)[-2000:]}")
    finally:
        proc.kill()
        proc.wait()


# ---------------------------------------------------------------- tail --live on the suggestions
def _suggestion(rank: int, doc: str, label: str = "grain", snippet: str = "wheat prices rose") -> dict:
    return {"id": doc, "snippet": snippet, "algorithm": "constrained-kmeans", "label": label,
            "scores": {label: 0.41, "crude": 0.30}, "reason": "uncertain", "priority": 1.0 - rank / 10,
            "rank": rank, "model_version": 3, "ts": 1.0}


def _publish_queue(bootstrap: str, topic: str) -> None:
    """Ranks arrive out of order, one id is superseded (moves from rank 0 to rank 2), one is tombstoned."""
    p = producer(bootstrap)
    for rank, doc in ((3, "d-c"), (0, "d-a"), (1, "d-b"), (4, "d-gone")):
        send_json(p, topic, _suggestion(rank, doc), key=doc)
    send_json(p, topic, _suggestion(2, "d-a", snippet="evil \x1b[31mred\x1b[0m text"), key="d-a")
    p.send(topic, key=b"d-gone", value=None)
    p.flush()
    p.close()


def _tail_under_pty(args: list[str], timeout: float = 60.0) -> str:
    """Run ``streamsemi`` with its standard output on a pseudo-terminal (as in a shell) and return what it printed."""
    master, slave = pty.openpty()
    env = {**os.environ, "COLUMNS": "140"}
    proc = subprocess.Popen([sys.executable, "-m", "streamsemi", *args], stdout=slave, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=env)
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # the child closed its end
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        assert proc.wait(timeout=30) == 0, proc.stderr.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
        proc.stderr.close()
    return b"".join(chunks).decode().replace("\r\n", "\n")


def test_tail_live_prints_the_suggestions_as_a_ranked_table_on_a_terminal_and_json_when_piped(broker):
    topics = Topics()
    _publish_queue(broker.bootstrap, topics.suggestions)
    args = ["tail", "--bootstrap-servers", broker.bootstrap, "--topic", topics.suggestions, "--live", "--timeout", "3"]

    screen = _tail_under_pty(args)
    lines = [ln for ln in screen.splitlines() if ln.strip()]
    assert re.match(r"RANK +ID +LABEL +P +REASON +ALGORITHM +V +SNIPPET$", lines[0]), screen
    ranks = [int(ln.split()[0]) for ln in lines[1:]]
    ids = [ln.split()[1] for ln in lines[1:]]
    assert ranks == [1, 2, 3] and ids == ["d-b", "d-a", "d-c"], screen   # rank order, tombstone left out
    assert "0.41" in lines[1] and "uncertain" in lines[1] and "wheat prices rose" in lines[1]
    assert "\x1b" not in screen and "evil  [31mred [0m text" not in screen, "escape sequences of a document reach the terminal"
    assert "evil [31mred [0m text" in lines[2]

    piped, _ = run(*args)
    assert piped.returncode == 0, piped.stderr
    rows = [json.loads(ln) for ln in piped.stdout.splitlines()]
    assert [(r["rank"], r["id"]) for r in rows] == [(1, "d-b"), (2, "d-a"), (3, "d-c")]

    top, _ = run(*args, "--limit", "2")
    assert [json.loads(ln)["id"] for ln in top.stdout.splitlines()] == ["d-b", "d-a"], "--limit keeps the best ranked"


def test_the_suggestion_table_fits_the_terminal_and_shows_streams():
    from streamsemi.cli import suggestion_table, terminal_text

    rows = [_suggestion(1, "b", snippet="x" * 500), {**_suggestion(0, "a"), "stream": "news"}]
    table = suggestion_table(rows, width=100)
    assert table[0].split()[:2] == ["STREAM", "RANK"]
    assert table[1].split()[:2] == ["1", "b"] and table[2].split()[:3] == ["news", "0", "a"], \
        "per stream (none first), then rank"
    assert all(len(ln) <= 100 for ln in table), table
    assert table[1].endswith("\u2026")
    assert terminal_text("a\tb\n\x07c\x1b[2J", 50) == "a b c [2J"


# ---------------------------------------------------------------- kafka-python's event loop
def test_kafka_pythons_slow_step_warning_is_silenced_at_its_logger_but_its_errors_show():
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    logs.setup("INFO")
    kafka_logger = logging.getLogger("kafka")
    kafka_logger.addHandler(Keep())
    try:
        selector = logging.getLogger("kafka.net.selector")
        selector.warning("Task %r ran for 0.101s (>0.100s threshold). It is blocking the event loop", "t")
        selector.error("Unhandled exception in task %s:", "t")
        logging.getLogger("kafka.conn").warning("connection refused")
        assert [r.getMessage()[:20] for r in seen] == ["Unhandled exception ", "connection refused"]
        assert not logging.getLogger("kafka.net.selector").isEnabledFor(logging.WARNING)
        assert logging.getLogger("kafka").isEnabledFor(logging.WARNING), "only the event loop's logger is quieter"
        logs.setup("DEBUG")
        assert logging.getLogger("kafka.net.selector").isEnabledFor(logging.WARNING)
    finally:
        kafka_logger.handlers[:] = [h for h in kafka_logger.handlers if not isinstance(h, Keep)]
        logs.setup("INFO")


# ---------------------------------------------------------------- the demo's progress lines
def test_a_progress_line_with_nothing_assigned_always_says_what_it_waits_for():
    from streamsemi.devtools.demo import progress_line

    nan = float("nan")
    assert progress_line(0, 0, 0, nan, None, None).endswith(
        "| waiting for the worker to start (its metrics server is not up yet)")
    assert "http://127.0.0.1:1/readyz does not answer" in progress_line(10, 0, 0, nan, None, "http://127.0.0.1:1")
    gate = {"serving": {"waiting": "waiting for the first model: seeds of 3/4 classes (3 seeds each)"},
            "partitions_assigned": True, "window": 500}
    assert progress_line(500, 0, 0, nan, gate, "u").endswith("| waiting for the first model: seeds of 3/4 classes "
                                                             "(3 seeds each)")
    served = {"serving": {"waiting": None}, "partitions_assigned": True, "window": 500, "model_version": 1}
    assert "waiting for the first outputs: model v1 serves" in progress_line(500, 0, 0, nan, served, "u")
    assert "waiting for the worker to join" in progress_line(5, 0, 0, nan, {**served, "partitions_assigned": False}, "u")
    assert progress_line(500, 400, 1, 0.7, served, "u").endswith("macro-F1 (non-seed docs) 0.700"), \
        "a line with progress and nothing waiting has no reason"


def _says_progress_or_reason(lines: list[str]) -> list[str]:
    """The progress lines that show no assigned document and give no reason."""
    bad = []
    for ln in lines:
        m = re.match(r"  sent +(\d+) \| assigned +(\d+) \|", ln)
        if m and int(m.group(2)) == 0 and "| waiting for" not in ln and "| first model fitting" not in ln \
                and "| holding the backlog" not in ln:
            bad.append(ln)
    return bad


@pytest.mark.long
def test_the_demo_never_prints_a_line_without_progress_or_what_it_waits_for():
    out = subprocess.run([sys.executable, "-m", "streamsemi", "demo", "--docs", "1500", "--rate", "200",
                          "--metrics-port", "0", "--console-port", "-1"], capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("  sent ")]
    assert lines and _says_progress_or_reason(lines) == [], out.stdout
    waits = [ln for ln in lines if "| assigned      0 |" in ln]
    assert any("waiting for the first model" in ln or "first model fitting" in ln for ln in waits), out.stdout
    assert re.search(r"all 1500 documents assigned", out.stdout), out.stdout


# ---------------------------------------------------------------- packaging
def test_pyproject_declares_its_license_the_way_current_setuptools_wants():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = meta["project"]
    assert project["license"] == "Apache-2.0", "an SPDX expression (a TOML table is deprecated since setuptools 77)"
    assert project["license-files"] == ["LICENSE"] and (ROOT / "LICENSE").read_text().startswith(
        "\n                                 Apache License")
    requires = meta["build-system"]["requires"]
    bound = next(r for r in requires if r.startswith("setuptools"))
    assert tuple(int(x) for x in re.search(r">=(\d+)", bound).group(1).split(".")) >= (77,), bound
    assert not any("License ::" in c for c in project.get("classifiers", [])), "license classifiers are deprecated"
    assert any(r.startswith("build") for r in project["optional-dependencies"]["test"])


@pytest.mark.long
def test_the_wheel_builds_without_packaging_warnings_and_ships_the_console_files(tmp_path):
    out = subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path), str(ROOT)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    log = out.stdout + out.stderr
    assert not re.search(r"deprecat|SetuptoolsWarning|is deprecated", log, re.IGNORECASE), \
        [ln for ln in log.splitlines() if re.search("deprecat|warning", ln, re.IGNORECASE)]
    import zipfile

    (wheel,) = tmp_path.glob("streamsemi-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("streamsemi/console/templates/queue.html", "streamsemi/console/static/console.js",
                   "streamsemi/cli.py"):
        assert needed in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert not any("__pycache__" in n or n.startswith("tests/") for n in names)


def test_the_worker_status_says_which_first_fit_gate_holds_the_documents():
    """serving_state follows Engine.tick's gates: documents, seed classes, stable seeds, a backlog beyond the
    live stream's records in flight; nothing once the model serves."""
    from streamsemi.core.messages import Document
    from streamsemi.engine import Engine, EngineConfig
    from streamsemi.service.serving_state import serving_state

    t = [1000.0]
    eng = Engine(EngineConfig(algorithms=["constrained-kmeans"], background_refit=False, n_features=2**14,
                              min_docs_first_refit=4, min_seed_classes=2, min_seeds_per_class=2,
                              first_fit_stable_seeds=3, refit_idle_s=0, refit_growth=0, refit_every_docs=0,
                              drift_detection=False, first_fit_max_wait_s=60.0), clock=lambda: t[0])
    topics = ("grain wheat harvest corn crop", "oil crude barrel opec refinery")

    def send(k: int, label: str | None = None) -> dict:
        doc = Document(f"d{k}", f"{topics[k % 2]} item{k}")
        if label:
            eng.label(doc.id, [label], text=doc.text)
        eng.process([doc])
        t[0] += 1.0
        return serving_state(eng)

    assert serving_state(eng)["waiting"] == "waiting for the first model: 0 of 4 documents read into the window"
    s = send(0, "grain")
    assert s["first_fit"]["documents"] == 1 and s["waiting"] == "waiting for the first model: 1 of 4 documents read into the window"
    for k in range(1, 4):
        s = send(k, "oil" if k == 1 else None)
    assert s["waiting"] == ("waiting for the first model: seeds of 0/2 classes (2 seeds each); at most 56 s more")
    s = send(4, "grain")
    s = send(5, "oil")
    assert s["first_fit"]["seed_classes_ready"] == 2
    assert s["waiting"].startswith("waiting for the first model: the seeded classes to stop growing (2 classes, "
                                   "2/3 seeds with no new class; or an idle stream")
    eng.backlog, eng.backlog_in_flight = 40, 50
    assert "backlog" not in serving_state(eng)["waiting"], "a live stream's records in flight are no backlog"
    eng.backlog = 51
    assert serving_state(eng)["waiting"].startswith("waiting for the backlog to be read first: 51 records unread")
    eng.backlog = 0
    s = send(6, "grain")  # the third seed with no new class: the first fit runs (inline here)
    assert eng.models and s["first_fit"] is None and s["waiting"] is None and s["serving"]
