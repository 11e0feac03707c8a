"""streamsemi console without a browser: bounded tables, the state's reading of each topic, start checks,
and the HTTP security rules (CSRF, token, Host) against the app served by uvicorn, writing to the real broker."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import UTC, datetime
from http.cookiejar import CookieJar

import pytest
from kafka_utils import DEADLINE, Topics, read_topic, wait_for

from streamsemi.console.app import ConsoleOptions, create_app, is_loopback_host, safe_next
from streamsemi.console.server import ServeOptions, check_options
from streamsemi.console.state import BoundedTable, Bounds, ConsoleState, margin
from streamsemi.console.writer import ControlWriter
from streamsemi.core.errors import ConfigError


def _j(obj) -> bytes:
    return json.dumps(obj).encode()


# ---------------------------------------------------------------- bounded tables
def test_bounded_table_keeps_the_newest_entries_within_entries_and_bytes():
    t = BoundedTable(max_entries=3, max_bytes=1000)
    for i in range(5):
        t.put(i, f"v{i}", 100)
    assert [k for k, _ in t.items()] == [2, 3, 4] and t.bytes == 300 and t.evicted == 2
    t.put(2, "again", 100)  # rewritten: becomes the newest
    assert [k for k, _ in t.items()] == [3, 4, 2]
    t.put("big", "x", 850)  # bytes bound: the oldest two go
    assert [k for k, _ in t.items()] == [2, "big"] and t.bytes == 950
    t.put("huge", "x", 5000)  # larger than the table: not kept, nothing else lost
    assert "huge" not in t and len(t) == 2
    assert t.pop(2) == "again" and t.bytes == 850 and t.pop("absent") is None
    with pytest.raises(ValueError):
        BoundedTable(0, 10)


def test_state_tables_stay_bounded_under_a_flood():
    st = ConsoleState(Bounds(max_entries=100, max_bytes=60_000))
    for i in range(2000):
        st.ingest("documents", f"d{i}".encode(), _j({"id": f"d{i}", "text": "word " * 50}))
        st.ingest("labels", f"d{i}".encode(), _j({"id": f"d{i}", "label": "a", "cluster": "a", "primary": True,
                                                 "labels": {"a": 0.6, "b": 0.4}}))
    for table in (st.texts, st.labels):
        assert len(table) <= 100 and table.bytes <= 60_000 and table.evicted >= 1900
    o = st.overview()
    assert o["labels_held"] == len(st.labels) and o["classes"][0] == {"name": "a", "documents": len(st.labels),
                                                                      "seeds": 0, "new": False, "stream": None}


def test_counts_kept_incrementally_equal_a_recount_through_replacements_and_evictions():
    from collections import Counter

    st = ConsoleState(Bounds(max_entries=50, max_bytes=200_000))
    for i in range(400):
        doc = f"d{(i * 7) % 90}"  # ids come back: replacements as well as evictions (also into another stream)
        cluster = ["a", "b", "new-0"][(i * 5) % 3]
        m = {"id": doc, "algorithm": ["ck", "dl"][i % 2], "cluster": cluster, "label": None if cluster == "new-0"
             else cluster, "primary": i % 2 == 0, "revision": i % 3, "labels": {cluster: 0.9}, "explain": ["w"]}
        if i % 4:
            m["stream"] = ["news", "tech", "news"][i % 3]
        st.ingest("assignments", doc.encode(), _j(m))
        st.ingest("labels", doc.encode(), _j(m))
        if i % 50 == 0:
            st.ingest("labels", doc.encode(), None)  # a tombstone
    assert st.label_counts == Counter((v.stream, v.cluster) for _, v in st.labels.items())
    assert st.cluster_sizes == Counter((v.stream, k[0], v.cluster) for k, v in st.assignments.items())
    assert {s for s, _ in st.label_counts} == {None, "news", "tech"} and st.streams() == ["news", "tech"]
    assert st.labels.evicted > 0 and st.assignments.evicted > 0
    assert {(r["stream"], r["name"]): r["documents"] for r in st.class_counts()} == dict(st.label_counts)
    for only in ("news", "tech"):
        assert {r["name"]: r["documents"] for r in st.class_counts(only)} == {
            c: n for (s, c), n in st.label_counts.items() if s == only}
        assert st.overview(only)["labels_held"] == sum(1 for _, v in st.labels.items() if v.stream == only)
    assert {r["stream"]: r["labels"] for r in st.overview()["streams"]} == {
        s: sum(1 for _, v in st.labels.items() if v.stream == s) for s in ("news", "tech")}
    view = st.clusters_view()
    assert {(r["stream"], r["algorithm"], r["cluster"]): r["size"] for rows in view.values() for r in rows} \
        == dict(st.cluster_sizes)
    assert set(view) >= {"ck", "news/ck", "tech/dl"}
    assert {r["stream"] for rows in st.clusters_view(only="tech").values() for r in rows} == {"tech"}


# ---------------------------------------------------------------- reading the topics
def test_control_topic_seeds_unlabel_and_a_late_resolved_label():
    st = ConsoleState()
    st.ingest("control", b"d1", _j({"op": "label", "id": "d1", "labels": ["grain"]}), 0, 10)
    st.ingest("control", b"d2", _j({"op": "label", "id": "d2", "labels": ["ship"], "text": "a ship"}), 0, 11)
    assert [s["id"] for s in st.recent_seeds()] == ["d2", "d1"]
    st.ingest("control", b"d1", _j({"op": "unlabel", "id": "d1"}), 0, 12)
    # the worker's resolved copy of the label at offset 10 arrives after the unlabel: the unlabel wins
    st.ingest("control", b"d1", _j({"op": "label", "id": "d1", "labels": ["grain"], "text": "t",
                                    "origin": "resolved", "label_offset": 10}), 0, 13)
    assert [s["id"] for s in st.recent_seeds()] == ["d2"]
    # a label after the unlabel counts again
    st.ingest("control", b"d1", _j({"op": "label", "id": "d1", "labels": ["wheat"]}), 0, 14)
    assert {s["id"]: s["labels"] for s in st.recent_seeds()} == {"d1": ["wheat"], "d2": ["ship"]}
    assert [s["id"] for s in st.recent_seeds()] == ["d1", "d2"], "newest first"
    # the worker's resolved copy of d2's seed is no new seed: d2 keeps its place and time
    before = {s["id"]: s["ts"] for s in st.recent_seeds()}
    st.ingest("control", b"d2", _j({"op": "label", "id": "d2", "labels": ["ship"], "text": "a ship " * 1000,
                                    "origin": "resolved", "label_offset": 11}), 0, 20, timestamp_ms=10**13)
    assert [s["id"] for s in st.recent_seeds()] == ["d1", "d2"]
    assert {s["id"]: s["ts"] for s in st.recent_seeds()} == before
    assert st.seeds.bytes < 3000, "a seed accounts its snippet, not the whole text of its record"
    assert [op["op"] for op in st.recent_ops] == ["label", "label", "unlabel", "label"]
    st.ingest("control", None, b"{not json", 0, 15)
    st.ingest("control", None, _j({"op": "explode"}), 0, 16)
    assert st.counts.malformed["control"] == 2 and st.counts.read["control"] == 8


def test_queue_uses_the_suggestions_topic_and_its_tombstones():
    st = ConsoleState()
    for i, reason in enumerate(["uncertain", "new_cluster", "rare_class"]):
        st.ingest("suggestions", f"s{i}".encode(), _j({"id": f"s{i}", "snippet": f"text {i}", "label": "a",
                                                      "scores": {"a": 0.5, "b": 0.4}, "reason": reason,
                                                      "priority": 1.0 - i / 10, "rank": 2 - i}))
    items, source = st.queue()
    assert source == "suggestions" and [s["id"] for s in items] == ["s2", "s1", "s0"]
    st.ingest("suggestions", b"s1", None)  # tombstone: labelled elsewhere
    st.hide("s2", "skipped")
    assert [s["id"] for s in st.queue()[0]] == ["s0"]
    st.ingest("control", b"s0", _j({"op": "label", "id": "s0", "labels": ["a"]}), 0, 1)
    assert st.queue()[0] == []


def test_queue_without_suggestions_ranks_the_primary_models_least_certain_documents():
    st = ConsoleState()
    probs = {"sure": {"a": 0.9, "b": 0.1}, "torn": {"a": 0.45, "b": 0.44}, "mid": {"b": 0.6, "a": 0.3},
             "no-text": {"a": 0.5, "b": 0.5}}
    for doc_id, p in probs.items():
        if doc_id != "no-text":
            st.ingest("documents", doc_id.encode(), _j({"id": doc_id, "text": f"text of {doc_id}"}))
        st.ingest("labels", doc_id.encode(), _j({"id": doc_id, "label": max(p, key=p.get), "cluster": max(p, key=p.get),
                                                "labels": p, "primary": True, "algorithm": "ck"}))
    items, source = st.queue()
    assert source == "labels" and [s["id"] for s in items] == ["torn", "mid", "sure"]
    assert items[0]["priority"] == pytest.approx(1 - (0.45 - 0.44))
    assert margin((("a", 1.0),)) == 1.0 and margin(()) == 1.0
    assert items[1]["scores"] == (("b", 0.6), ("a", 0.3)), "best first"
    assert st.classes() == ["a", "b"]
    assert ConsoleState().queue() == ([], "none")


def test_streams_seeds_queue_clusters_and_counts_are_kept_per_stream():
    """Per-stream models: the same id in two streams is two seeds; hiding, filters and classes go by stream."""
    st = ConsoleState()
    for stream, cls in (("news", "grain"), ("tech", "graphics")):
        st.ingest("suggestions", b"d1", _j({"id": "d1", "snippet": "x", "rank": 0, "stream": stream}))
        st.ingest("control", b"d9", _j({"op": "label", "id": "d9", "labels": [cls], "stream": stream}), 0, 1)
        st.ingest("clusters", f"{stream}/ck/new-0".encode(), _j({"cluster": "new-0", "algorithm": "ck",
                                                                  "size": 3, "stream": stream}))
    st.ingest("suggestions", b"d2", _j({"id": "d2", "snippet": "y", "rank": 1, "stream": "news"}))
    assert st.streams() == ["news", "tech"] and st.multi_stream()
    # the suggestions topic is keyed by id: d1's latest suggestion (tech) is the one held
    assert [(i["id"], i["stream"]) for i in st.queue()[0]] == [("d1", "tech"), ("d2", "news")]
    assert [i["id"] for i in st.queue(only="news")[0]] == ["d2"]
    st.hide("d1", "skipped", "news")  # another stream's d1: tech's stays
    assert [i["id"] for i in st.queue(only="tech")[0]] == ["d1"]
    st.hide("d1", "skipped", "tech")
    assert [i["id"] for i in st.queue()[0]] == ["d2"]
    assert {(s["stream"], s["id"]): s["labels"] for s in st.recent_seeds()} == {
        ("news", "d9"): ["grain"], ("tech", "d9"): ["graphics"]}
    assert [s["labels"] for s in st.recent_seeds(only="tech")] == [["graphics"]]
    st.ingest("control", b"d9", _j({"op": "unlabel", "id": "d9", "stream": "tech"}), 0, 2)
    assert [s["stream"] for s in st.recent_seeds()] == ["news"], "the unlabel undid tech's seed only"
    assert st.classes("news") == ["grain"] and st.classes("tech") == [] and st.classes() == ["grain"]
    assert [(r["stream"], r["cluster"]) for r in st.new_clusters()] == [("news", "new-0"), ("tech", "new-0")]
    assert [r["stream"] for r in st.new_clusters(only="tech")] == ["tech"]
    st.ingest("assignments", b"d5", _j({"id": "d5", "algorithm": "dl", "cluster": "", "label": None, "model_version": 0,
                                        "provisional": True, "primary": True, "stream": "tech"}))
    assert "tech/dl" not in st.clusters_view(), "a 'no model yet' assignment is in no cluster"
    assert {r["stream"]: (r["seeds"], r["suggestions"]) for r in st.overview()["streams"]} == {
        "news": (1, 1), "tech": (0, 1)}
    assert st.overview("news")["seeds"] == 1 and st.overview("tech")["suggestions"] == 1
    assert st.document("d9", "news")["seed"]["labels"] == ["grain"] and st.document("d9", "tech") is None
    # an invalid stream is malformed (counted, skipped); the streams listed are bounded
    st.ingest("suggestions", b"d3", _j({"id": "d3", "stream": "bad/name"}))
    st.ingest("control", b"d3", _j({"op": "label", "id": "d3", "labels": ["a"], "stream": 7}), 0, 3)
    assert st.counts.malformed == {"suggestions": 1, "control": 1} and "d3" not in st.suggestions
    from streamsemi.console.state import MAX_STREAMS

    for i in range(MAX_STREAMS + 5):
        st.ingest("suggestions", b"z", _j({"id": "z", "stream": f"s{i}"}))
    assert len(st.streams()) == MAX_STREAMS and st.streams_unlisted == 7
    # with per-stream models configured, records and ops without stream are the default stream's
    st = ConsoleState(default_stream="news")
    st.ingest("control", b"d1", _j({"op": "label", "id": "d1", "labels": ["grain"]}), 0, 1)
    st.ingest("suggestions", b"d2", _j({"id": "d2", "stream": "news"}))
    assert st.streams() == ["news"] and not st.multi_stream()
    assert [s["stream"] for s in st.recent_seeds()] == ["news"] and st.queue()[0][0]["stream"] == "news"
    # without: nothing carries a stream and nothing changes
    st = ConsoleState()
    st.ingest("suggestions", b"d2", _j({"id": "d2"}))
    assert st.streams() == [] and st.queue()[0][0]["stream"] is None and not st.overview()["streams"]


def test_clusters_view_from_assignments_then_from_the_clusters_topic():
    st = ConsoleState()
    for i in range(6):
        cluster = "new-0" if i < 2 else "grain"
        st.ingest("documents", f"d{i}".encode(), _j({"id": f"d{i}", "text": f"<b>doc</b> {i}"}))
        st.ingest("assignments", f"d{i}".encode(), _j({
            "id": f"d{i}", "algorithm": "ck", "cluster": cluster, "label": None if i < 2 else "grain",
            "explain": ["wheat", "corn"] if i >= 2 else ["ship"], "model_version": 3, "revision": 0,
            "primary": True, "ts": time.time(), "labels": {}}))
    view = st.clusters_view()
    assert [(r["cluster"], r["size"], r["source"]) for r in view["ck"]] == [("grain", 4, "assignments"),
                                                                           ("new-0", 2, "assignments")]
    assert view["ck"][0]["top_words"] == ["wheat", "corn"] and len(view["ck"][0]["examples"]) == 3
    assert [r["cluster"] for r in st.new_clusters()] == ["new-0"]
    assert st.overview()["model_version"] == {"ck": 3} and st.overview()["primary"] == "ck"
    assert st.docs_per_second() == pytest.approx(6 / 30)
    st.ingest("clusters", b"ck/new-1", _j({"algorithm": "ck", "cluster": "new-1", "event": "born", "size": 9,
                                          "top_words": ["ferry"], "examples": [{"id": "e1", "snippet": "s"}]}))
    assert [(r["cluster"], r["source"]) for r in st.clusters_view()["ck"]] == [("new-1", "clusters topic")]
    st.ingest("clusters", b"ck/new-1", None)
    assert st.clusters_view()["ck"][0]["source"] == "assignments"


# ---------------------------------------------------------------- start checks
def test_worker_metrics_reads_the_stream_and_the_queue_seed_accuracy_apart():
    from prometheus_client import start_http_server

    from streamsemi.console.app import WorkerMetrics
    from streamsemi.core.telemetry import Telemetry

    tel = Telemetry()
    tel.seed_accuracy.labels("constrained-kmeans").set(0.91)
    tel.suggested_seed_accuracy.labels("constrained-kmeans").set(0.35)
    tel.suggested_seed_accuracy.labels("cle").set(0.5)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server, thread = start_http_server(port, addr="127.0.0.1", registry=tel.registry)
    try:
        got = WorkerMetrics(f"http://127.0.0.1:{port}").read()
    finally:
        server.shutdown()
        thread.join(5)
    assert got["available"], got
    assert got["seed_accuracy"] == {"constrained-kmeans": 0.91}
    assert got["suggested_seed_accuracy"] == {"constrained-kmeans": 0.35, "cle": 0.5}


def test_a_non_loopback_bind_needs_a_token_named_in_the_error():
    with pytest.raises(ConfigError, match=r"setting 'auth_token'.*non-loopback.*0\.0\.0\.0"):
        check_options(ServeOptions(host="0.0.0.0"), env={})
    with pytest.raises(ConfigError, match=r"setting 'auth_token' \(from environment STREAMSEMI_CONSOLE_TOKEN\)"):
        check_options(ServeOptions(host="0.0.0.0"), env={"STREAMSEMI_CONSOLE_TOKEN": "short"})
    ok = check_options(ServeOptions(host="0.0.0.0"), env={"STREAMSEMI_CONSOLE_TOKEN": "x" * 20})
    assert ok.auth_token == "x" * 20
    assert check_options(ServeOptions(host="127.0.0.1"), env={}).auth_token is None
    assert check_options(ServeOptions(host="localhost"), env={}).auth_token is None
    with pytest.raises(ConfigError, match="setting 'port'"):
        check_options(ServeOptions(port=70000), env={})
    with pytest.raises(ConfigError, match="setting 'worker_url'"):
        check_options(ServeOptions(worker_url="file:///etc/passwd"), env={})
    assert is_loopback_host("127.0.0.2") and is_loopback_host("::1") and not is_loopback_host("example.com")
    assert safe_next("//evil.example/x") == "/" and safe_next("/queue?x=1") == "/queue?x=1"
    assert safe_next("/\t/evil.example") == "/" and safe_next("/\\evil.example") == "/"


def test_cli_refuses_a_public_bind_without_token():
    out = subprocess.run([sys.executable, "-m", "streamsemi", "console", "--host", "0.0.0.0", "--port", "0"],
                         capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 2
    assert "configuration error: setting 'auth_token'" in out.stderr and "STREAMSEMI_CONSOLE_TOKEN" in out.stderr


# ---------------------------------------------------------------- HTTP: served by uvicorn, writing to the broker
class Served:
    def __init__(self, app) -> None:
        import uvicorn

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> Served:
        self.thread.start()
        wait_for(lambda: self.server.started, DEADLINE, "the console server started", 0.05)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


def _request(url: str, data: dict | None = None, headers: dict | None = None, opener=None):
    body = urllib.parse.urlencode(data).encode() if data is not None else None
    req = urllib.request.Request(url, data=body, headers=headers or {})
    try:
        with (opener or urllib.request.build_opener(_NoRedirect)).open(req, timeout=DEADLINE) as r:
            return r.status, r.read().decode(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), dict(e.headers)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


@pytest.fixture
def console_app(broker):
    topics = Topics()
    topics.create(broker.bootstrap)
    settings = topics.settings(broker.bootstrap)
    state = ConsoleState()
    writer = ControlWriter(settings)
    yield topics, state, writer, settings
    writer.close()


def test_posts_need_the_csrf_token_and_a_same_origin_and_go_through_label_validation(console_app, broker):
    topics, state, writer, settings = console_app
    state.ingest("documents", b"d<1>", _j({"id": "d<1>", "text": "<script>window.x=1</script> wheat"}))
    app = create_app(state, writer, ConsoleOptions(control_topic=topics.control))
    csrf = app.state.csrf_token
    with Served(app) as s:
        code, page, headers = _request(s.url("/doc?id=" + urllib.parse.quote("d<1>")))
        assert code == 200 and "&lt;script&gt;window.x=1&lt;/script&gt;" in page and "<script>window" not in page
        assert "d&lt;1&gt;" in page and "script-src 'self'" in headers["content-security-policy"]
        assert f'name="csrf" value="{csrf}"' in page
        form = {"id": "d<1>", "label": "grain", "next": "/queue"}
        assert _request(s.url("/label"), form)[0] == 403, "no CSRF token"
        assert _request(s.url("/label"), {**form, "csrf": "wrong"})[0] == 403
        assert _request(s.url("/label"), {**form, "csrf": csrf}, {"Origin": "http://evil.example"})[0] == 403
        assert _request(s.url("/label"), {**form, "csrf": csrf}, {"Sec-Fetch-Site": "cross-site"})[0] == 403
        code, _, headers = _request(s.url("/label"), {**form, "label": "new-9", "csrf": csrf})
        assert code == 303 and "err=refused" in headers["location"], "the reserved new- prefix is refused"
        code, _, headers = _request(s.url("/label"), {**form, "csrf": csrf},
                                    {"Origin": f"http://127.0.0.1:{s.port}"})
        assert code == 303 and headers["location"].startswith("/queue?msg=labelled")
        code, _, headers = _request(s.url("/unlabel"), {"id": "d<1>", "csrf": csrf, "next": "//evil.example/"})
        assert code == 303 and headers["location"].startswith("/?msg="), "never redirected off the console"
        assert _request(s.url("/"), headers={"Host": "attacker.example"})[0] == 421, "DNS rebinding: loopback names only"
        assert _request(s.url("/label"), {**form, "csrf": csrf, "pad": "x" * 70_000})[0] == 413
    sent = [json.loads(r.value) for r in read_topic(broker.bootstrap, topics.control, expect=2)]
    assert sent == [{"op": "label", "id": "d<1>", "labels": ["grain"],
                     "text": "<script>window.x=1</script> wheat"}, {"op": "unlabel", "id": "d<1>"}]
    assert writer.sent == 2


def test_with_a_token_every_request_needs_it_and_login_sets_a_strict_cookie(console_app):
    topics, state, writer, settings = console_app
    token = "t0ken-" + "x" * 20
    app = create_app(state, writer, ConsoleOptions(auth_token=token, loopback_only=False))
    with Served(app) as s:
        for path in ("/", "/queue", "/static/console.js", "/doc?id=a"):
            assert _request(s.url(path))[0] == 401, path
        code, page, _ = _request(s.url("/"), headers={"Accept": "text/html"})
        assert code == 401 and 'action="/login"' in page
        assert _request(s.url("/"), headers={"Authorization": "Bearer " + token})[0] == 200
        assert _request(s.url("/"), headers={"Authorization": "Bearer wrong"})[0] == 401
        assert _request(s.url("/"), headers={"Host": "console.example.org"}, )[0] == 421, "DNS rebinding, token or not"
        assert _request(s.url("/login"), {"token": "wrong"})[0] == 401
        code, _, headers = _request(s.url("/login"), {"token": token})
        cookie = headers["set-cookie"]
        assert code == 303 and "HttpOnly" in cookie and "SameSite=strict" in cookie
        jar = CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar), _NoRedirect)
        assert _request(s.url("/login"), {"token": token}, opener=opener)[0] == 303
        code, page, _ = _request(s.url("/seeds"), opener=opener)
        assert code == 200 and "Recent seeds" in page
        # a token is no CSRF token: posts still need the form's
        assert _request(s.url("/refit"), {"next": "/"}, opener=opener)[0] == 403


# ---------------------------------------------------------------- the reader thread on the real broker
def test_reader_backfills_the_streams_and_adopts_a_topic_created_later(broker):
    from kafka_utils import producer, send_json

    from streamsemi.console.reader import TopicReader
    from streamsemi.service.config import resolve
    from streamsemi.service.kafka_io import ensure_topics

    topics = Topics()
    topics.create(broker.bootstrap)
    settings = resolve({"bootstrap_servers": broker.bootstrap, "documents_topic": topics.documents,
                        "control_topic": topics.control, "assignments_topic": topics.assignments,
                        "deadletter_topic": topics.deadletter, "labels_topic": topics.labels,
                        # a suggestions topic that does not exist yet (Topics.create makes the usual one)
                        "suggestions_topic": f"{topics.prefix}.later-suggestions",
                        "clusters_topic": f"{topics.prefix}.clusters"})
    p = producer(broker.bootstrap)
    for i in range(60):  # before the console starts: only the last `backfill` per partition are read
        send_json(p, topics.documents, {"id": f"old{i}", "text": f"old text {i}"}, key=f"old{i}")
    send_json(p, topics.control, {"op": "label", "id": "old0", "labels": ["grain"]}, key="old0")
    p.flush()
    state = ConsoleState()
    reader = TopicReader(settings, state, backfill=4, rescan_s=0.5)
    reader.start()
    try:
        wait_for(lambda: state.counts.read["control"] == 1, DEADLINE, "the control table read from the beginning")
        wait_for(lambda: len(state.texts) == 4 * settings.topic_partitions, DEADLINE, "the last 4 texts per partition")
        assert all(str(k).startswith("old") for k, _ in state.texts.items())
        assert settings.suggestions_topic not in reader.assigned
        # the suggestions topic appears (a worker that publishes them starts): it is adopted and read
        ensure_topics(settings, [settings.suggestions_topic])
        send_json(p, settings.suggestions_topic, {"id": "old7", "snippet": "<b>x</b>", "label": "grain",
                                                  "scores": {"grain": 0.5}, "reason": "uncertain", "priority": 0.5,
                                                  "rank": 0}, key="old7")
        send_json(p, topics.documents, {"id": "new1", "text": "fresh"}, key="new1")
        p.flush()
        wait_for(lambda: "old7" in state.suggestions and "new1" in state.texts, DEADLINE,
                 "the later suggestions topic adopted and read")
        assert state.queue()[1] == "suggestions" and state.queue()[0][0]["snippet"] == "<b>x</b>"
        assert state.counts.read["documents"] == 4 * settings.topic_partitions + 1, "no record read twice"
    finally:
        reader.stop()
        reader.join(10)
    assert not reader.is_alive() and reader.errors == 0


def test_per_stream_console_writes_name_the_stream_of_the_item_through_the_broker(console_app, broker):
    """Per-stream models: a label clicked on a non-default stream's suggestion reaches the control topic with
    that stream (so do unlabel, name and a filtered refit); the queue shows each item's stream and its own
    stream's classes; the stream filter is bounded to the streams seen and escaped."""
    topics, state, writer, settings = console_app
    for stream, doc, cls in (("news", "n1", "grain"), ("tech", "t1", "graphics")):
        state.ingest("documents", doc.encode(), _j({"id": doc, "text": f"text of {doc}", "stream": stream}))
        state.ingest("suggestions", doc.encode(), _j({"id": doc, "snippet": f"text of {doc}", "rank": 0,
                                                     "reason": "uncertain", "stream": stream}))
        state.ingest("control", b"s-" + doc.encode(), _j({"op": "label", "id": "s-" + doc, "labels": [cls],
                                                          "stream": stream}), 0, 1)
    state.ingest("clusters", b"tech/ck/new-0", _j({"cluster": "new-0", "algorithm": "ck", "size": 4, "stream": "tech"}))
    app = create_app(state, writer, ConsoleOptions(control_topic=topics.control))
    csrf = app.state.csrf_token
    with Served(app) as s:
        code, page, _ = _request(s.url("/queue"))
        items = {seg.split('"', 1)[0]: seg for seg in page.split('<li class="suggestion')[1:]
                 for seg in [seg.split('data-id="', 1)[1]]}
        assert code == 200 and set(items) == {"n1", "t1"} and 'id="stream-filter"' in page
        assert '<input type="hidden" name="stream" value="tech">' in items["t1"]
        assert 'value="graphics"' in items["t1"] and 'value="grain"' not in items["t1"], "its own stream's classes"
        code, page, _ = _request(s.url("/queue?stream=tech"))
        assert 'data-id="t1"' in page and 'data-id="n1"' not in page and 'href="/seeds?stream=tech"' in page
        code, page, _ = _request(s.url("/queue?stream=" + urllib.parse.quote("<b>x</b>")))
        assert code == 200 and "&lt;b&gt;x&lt;/b&gt;" in page and "<b>x</b>" not in page
        assert 'data-id="n1"' in page and 'data-id="t1"' in page, "an unknown stream filters nothing"
        code, page, _ = _request(s.url("/seeds"))
        assert '<td class="stream">tech</td>' in page and '<td class="stream">news</td>' in page
        code, page, _ = _request(s.url("/"))
        assert 'id="streams"' in page and 'data-stream="tech"' in page
        code, _, headers = _request(s.url("/label"), {"id": "t1", "label": "graphics", "stream": "tech",
                                                      "csrf": csrf, "next": "/queue?stream=tech"})
        assert code == 303 and headers["location"].startswith("/queue?stream=tech&msg=labelled")
        code, page, _ = _request(s.url("/queue"))
        assert 'data-id="t1"' not in page and 'data-id="n1"' in page, "tech's t1 hidden, news' n1 not"
        assert _request(s.url("/unlabel"), {"id": "t1", "stream": "tech", "csrf": csrf})[0] == 303
        assert _request(s.url("/name"), {"cluster": "new-0", "algorithm": "ck", "label": "gpu", "stream": "tech",
                                         "csrf": csrf})[0] == 303
        assert _request(s.url("/refit"), {"stream": "tech", "csrf": csrf})[0] == 303
        code, _, headers = _request(s.url("/label"), {"id": "t1", "label": "a", "stream": "bad/name", "csrf": csrf})
        assert code == 303 and "err=refused" in headers["location"], "an invalid stream name is refused"
    sent = [json.loads(r.value) for r in read_topic(broker.bootstrap, topics.control, expect=4)]
    by_op = {m["op"]: m for m in sent}  # (keys differ: partitions differ, so only one id's ops are ordered)
    assert len(sent) == 4 and by_op == {
        "label": {"op": "label", "id": "t1", "labels": ["graphics"], "stream": "tech", "text": "text of t1"},
        "unlabel": {"op": "unlabel", "id": "t1", "stream": "tech"},
        "name": {"op": "name", "cluster": "new-0", "label": "gpu", "stream": "tech", "algorithm": "ck"},
        "refit": {"op": "refit", "stream": "tech"}}
    assert [m["op"] for m in sent if m.get("id") == "t1"] == ["label", "unlabel"]


def test_a_console_warns_on_every_page_while_its_broker_is_unreachable_at_start_or_later(tmp_path):
    """Without a reachable Kafka the pages said nothing but "no labels yet"; now each page names the broker and
    the error until the reader connects, and the warning goes away once it has. A broker lost later (kafka-python
    reconnects without raising) brings the warning back until it returns."""
    from kafka_utils import kill_broker, listen_port, start_own_broker

    from streamsemi.console.reader import topic_kinds
    from streamsemi.service.config import resolve
    from streamsemi.service.kafka_io import ensure_topics

    kafka_port = listen_port()  # below the ephemeral range: nothing else takes it before the broker starts
    proc = subprocess.Popen([sys.executable, "-m", "streamsemi", "console", "--bootstrap-servers",
                             f"127.0.0.1:{kafka_port}", "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    broker = None
    try:
        url = json.loads(proc.stdout.readline())["url"]

        def page(path: str) -> str:
            return _request(url.rstrip("/") + path)[1]

        wait_for(lambda: 'id="kafka-down"' in page("/"), DEADLINE, "the warning while Kafka is unreachable")
        for path in ("/", "/queue", "/clusters", "/seeds"):
            body = page(path)
            assert f"Kafka at 127.0.0.1:{kafka_port} cannot be reached" in body and "Unable to bootstrap" in body
        broker = start_own_broker(tmp_path, port=kafka_port)
        # every topic the console reads exists, so its reader stops looking for topics (a failed look-up would
        # raise and warn by itself): only the reader's watch of its connections can see the broker go
        settings = resolve({"bootstrap_servers": f"127.0.0.1:{kafka_port}"})
        ensure_topics(settings, list(topic_kinds(settings)))
        wait_for(lambda: 'id="kafka-down"' not in page("/"), DEADLINE, "no warning once the broker came")
        time.sleep(1.0)
        # a broker lost after the console connected: kafka-python retries without an error, the pages warn anyway
        kill_broker(broker)
        broker = None
        wait_for(lambda: 'id="kafka-down"' in page("/"), DEADLINE, "the warning after the broker went away")
        body = page("/queue")
        assert f"Kafka at 127.0.0.1:{kafka_port} cannot be reached" in body
        assert "no connection to any broker for 5 s" in body
        broker = start_own_broker(tmp_path, port=kafka_port)
        wait_for(lambda: 'id="kafka-down"' not in page("/"), DEADLINE, "no warning once the broker came back")
    finally:
        proc.terminate()
        proc.wait(DEADLINE)
        if broker is not None:
            kill_broker(broker)


# ---------------------------------------------------------------- the pages, from records read off the broker
_FHLBB = "FHLBB changes short term discount note rates"


def _page_records() -> list[tuple[str, str | None, dict]]:
    """(topic kind, key, value) as a worker without per-stream models and ``streamsemi produce`` write them:
    documents carry the corpus as ``stream``, nothing the worker writes does."""
    now = time.time()
    docs = {"r8:1": _FHLBB, "r8:2": _FHLBB, "r8:3": "  fhlbb CHANGES short\tterm discount  note rates ",
            "r8:4": "Wheat <b>exports</b> rose", "r8:5": "Ferry strike closes the port", "r8:6": "Port strike ends"}
    out: list[tuple[str, str | None, dict]] = [
        ("documents", i, {"id": i, "text": t, "stream": "reuters-r8"}) for i, t in docs.items()]
    out += [("control", "r8:4", {"op": "label", "id": "r8:4", "labels": ["grain"]}),
            ("control", "r8:9", {"op": "label", "id": "r8:9", "labels": ["interest"]})]
    for i, label in (("r8:1", "interest"), ("r8:2", "interest"), ("r8:3", "interest"), ("r8:4", "grain"),
                     ("r8:5", None), ("r8:6", None)):
        rec = {"id": i, "algorithm": "ck", "model_version": 5, "revision": 0, "label": label,
               "cluster": label or "new-1", "labels": {label or "new-1": 0.8}, "explain": ["rates"],
               "primary": True, "ts": now}
        out += [("assignments", i, rec), ("labels", i, rec)]
    ex = [{"id": f"r8:{k}", "snippet": s} for k, s in ((1, _FHLBB), (2, _FHLBB), (3, docs["r8:3"]), (7, _FHLBB),
                                                      (8, "Prime rate cut"))]
    events = [
        {"cluster": "interest", "event": "continued", "size": 40, "examples": ex, "top_words": ["rates"]},
        {"cluster": "new-1", "event": "continued", "size": 30, "top_words": ["strike", "port"],
         "examples": [{"id": "r8:5", "snippet": docs["r8:5"]}]},
        {"cluster": "new-2", "event": "split_from", "target": "new-1", "size": 12, "top_words": ["ferry"],
         "examples": [{"id": "r8:6", "snippet": docs["r8:6"]}]},
        {"cluster": "new-3", "event": "merged_into", "target": "grain", "size": 0, "top_words": ["corn"],
         "examples": []},
    ]
    # the events were made before the name op below (a worker that applies it merges new-1 at a later version)
    out += [("clusters", f"ck/{e['cluster']}", {"algorithm": "ck", "model_version": 5, "ts": now - 600, **e})
            for e in events]
    out.append(("control", "new-1", {"op": "name", "algorithm": "ck", "cluster": "new-1", "label": "shipping"}))
    return out


def _send_page_records(broker, topics: Topics) -> int:
    from kafka_utils import producer, send_json

    kinds = {"documents": topics.documents, "control": topics.control, "assignments": topics.assignments,
             "labels": topics.labels, "clusters": topics.clusters}
    p = producer(broker.bootstrap)
    records = _page_records()
    for kind, key, value in records:
        send_json(p, kinds[kind], value, key=key)
    p.flush()
    p.close()
    return len(records)


def _read_into(settings, state: ConsoleState, n: int):
    from streamsemi.console.reader import TopicReader

    reader = TopicReader(settings, state, backfill=1000, rescan_s=0.5)
    reader.start()
    wait_for(lambda: sum(state.counts.read.values()) >= n, DEADLINE, "every record read by the console")
    return reader


def test_document_page_shows_its_seed_class_buttons_and_unlabel_without_the_producers_stream(console_app, broker):
    """A seeded document of a worker without per-stream models (its documents record carries the producer's
    ``stream``): the page shows the seed and when it was given, one button per known class, the new-class box and
    an unlabel button, and no form names a stream; clicking them sends label / unlabel without ``stream``."""
    topics, state, writer, settings = console_app
    n = _send_page_records(broker, topics)
    reader = _read_into(settings, state, n)
    try:
        app = create_app(state, writer, ConsoleOptions(control_topic=topics.control))
        csrf = app.state.csrf_token
        with Served(app) as s:
            code, page, _ = _request(s.url("/doc?id=r8:4"))
            assert code == 200 and 'id="seed-labels">grain<' in page
            assert 'id="seed-when">' + datetime.fromtimestamp(state.seeds.get((None, "r8:4")).ts, UTC).strftime(
                "%Y-%m-%d %H:%M:%S UTC") in page
            buttons = re.findall(r'<button type="submit" class="cls[^"]*" data-class="([^"]+)"', page)
            assert buttons == ["grain", "interest"], "one button per known class (seeded or served)"
            assert 'name="new_label"' in page and 'id="unlabel"' in page and "remove the seed grain" in page
            assert 'name="stream"' not in page, "the worker runs no per-stream models: no form names a stream"
            assert "Wheat &lt;b&gt;exports&lt;/b&gt; rose" in page and "<b>exports" not in page
            code, page, _ = _request(s.url("/doc?id=r8:5"))
            assert 'id="no-seed"' in page and 'id="unlabel"' in page and 'name="stream"' not in page
            code, _, headers = _request(s.url("/label"), {"id": "r8:4", "label": "interest", "csrf": csrf,
                                                          "next": "/doc?id=r8:4"})
            assert code == 303 and headers["location"].startswith("/doc?id=r8%3A4&msg=labelled")
            assert _request(s.url("/unlabel"), {"id": "r8:4", "csrf": csrf, "next": "/doc?id=r8:4"})[0] == 303
    finally:
        reader.stop()
        reader.join(10)
    controls = sum(1 for kind, _, _ in _page_records() if kind == "control")
    sent = [json.loads(r.value) for r in read_topic(broker.bootstrap, topics.control, expect=controls + 2)]
    # (one id's records share a partition: they are in order)
    assert [m for m in sent if m.get("id") == "r8:4"] == [
        {"op": "label", "id": "r8:4", "labels": ["grain"]},
        {"op": "label", "id": "r8:4", "labels": ["interest"], "text": "Wheat <b>exports</b> rose"},
        {"op": "unlabel", "id": "r8:4"}]


def test_document_page_names_the_stream_when_the_worker_says_it_runs_per_stream_models(console_app, broker):
    """The worker's ``/readyz`` lists ``streams`` with per-stream models only: then (and only then) a document's
    form carries the stream of its documents record."""
    from prometheus_client import CollectorRegistry

    from streamsemi.service.httpserver import StatusServer

    topics, state, writer, settings = console_app
    n = _send_page_records(broker, topics)
    reader = _read_into(settings, state, n)
    per_stream = {"streams": {}}
    server = StatusServer("127.0.0.1", 0, CollectorRegistry(), lambda: (True, {}), lambda: (False, dict(per_stream)),
                          {}).start()
    try:
        flat = ConsoleState()  # a worker that runs one model: its /readyz has no "streams"
        per_stream.clear()
        for kind, key, value in _page_records():
            flat.ingest(kind, key.encode() if key else None, _j(value))
        app = create_app(flat, writer, ConsoleOptions(worker_url=f"http://127.0.0.1:{server.port}"))
        with Served(app) as s:
            assert 'name="stream"' not in _request(s.url("/doc?id=r8:5"))[1]
        per_stream["streams"] = {"reuters-r8": {}}
        app = create_app(state, writer, ConsoleOptions(worker_url=f"http://127.0.0.1:{server.port}"))
        with Served(app) as s:
            page = _request(s.url("/doc?id=r8:5"))[1]
            assert '<input type="hidden" name="stream" value="reuters-r8">' in page
    finally:
        server.stop()
        reader.stop()
        reader.join(10)


def test_cluster_pages_drop_repeated_examples_name_split_sources_and_move_named_clusters(console_app, broker):
    """Clusters: examples repeated exactly or after whitespace/case normalisation are shown once (the rest
    counted); a split_from badge names its source; a merged cluster and one named on the control topic are not
    on New clusters; each page says what its document counts count, the overview what each rate is."""
    topics, state, writer, settings = console_app
    n = _send_page_records(broker, topics)
    reader = _read_into(settings, state, n)
    try:
        app = create_app(state, writer, ConsoleOptions(control_topic=topics.control))
        with Served(app) as s:
            code, page, _ = _request(s.url("/clusters"))
            assert code == 200
            row = page.split('data-cluster="interest"', 1)[1].split("</tr>", 1)[0]
            assert row.count("discount note rates") == 1 and "Prime rate cut" in row
            assert "3 more with the same text not shown" in row
            row = page.split('data-cluster="new-2"', 1)[1].split("</tr>", 1)[0]
            assert ">split_from new-1</span>" in row and "most of its documents came from new-1" in row
            row = page.split('data-cluster="new-1"', 1)[1].split("</tr>", 1)[0]
            assert ">named shipping</span>" in row
            assert 'data-cluster="new-3"' not in page, "merged into grain: gone"
            assert "window documents in the cluster at the model version shown" in page
            assert "latest primary label of every document this console holds" in page
            code, page, _ = _request(s.url("/clusters/new"))
            assert [c for c in re.findall(r'<section class="newcluster"[^>]*data-cluster="([^"]+)"', page)] \
                == ["new-2"], "new-1 is named (a class now), new-3 merged"
            assert ">split_from new-1</span>" in page
            code, page, _ = _request(s.url("/"))
            assert ">documents/s assigned</div>" in page and "first primary assignments read from the assignments" \
                in page
            assert "count the worker's window at its latest model" in page
    finally:
        reader.stop()
        reader.join(10)


def test_a_name_the_worker_did_not_apply_brings_its_cluster_back_to_new_clusters():
    """A name op leaves its cluster off New clusters until the worker's models go two versions past it with the
    cluster still there and no seed made of the op (refused: dead-lettered); a seed made of it keeps it off."""
    st = ConsoleState()
    ev = {"algorithm": "ck", "cluster": "new-1", "event": "continued", "size": 9, "top_words": ["x"]}
    st.ingest("clusters", b"ck/new-1", _j({**ev, "model_version": 4, "ts": 100.0}))
    st.ingest("control", b"new-1", _j({"op": "name", "cluster": "new-1", "label": "ships"}), 0, 7,
              timestamp_ms=200_000)
    assert st.new_clusters() == [] and st.clusters_view()["ck"][0]["named"] == "ships", "no algorithm: the primary's"
    st.ingest("clusters", b"ck/new-1", _j({**ev, "model_version": 5, "ts": 300.0}))
    assert st.new_clusters() == [], "the model after the op may have been fitting when it came"
    st.ingest("clusters", b"ck/new-1", _j({**ev, "model_version": 6, "ts": 400.0}))
    [row] = st.new_clusters()
    assert row["cluster"] == "new-1" and row["named"] is None and row["name_refused"] == "ships"
    st.ingest("control", b"d3", _j({"op": "label", "id": "d3", "labels": ["ships"], "origin": "cluster",
                                    "label_offset": 7}), 0, 9)
    assert st.new_clusters() == [], "a seed of the op: applied"
    st.ingest("clusters", b"ck/new-1", _j({**ev, "event": "merged_into", "target": "ships", "size": 0,
                                           "model_version": 7, "ts": 500.0}))
    assert "ck" not in st.clusters_view() and st.new_clusters() == []
