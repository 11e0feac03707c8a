"""The metrics port and the console under idle and slow clients: threads stay bounded, idle and trickling
connections are closed, /healthz answers while hundreds of connections sit open.

No assertion depends on how fast anything is: each wait is for the event it names, with a deadline far
above what a loaded machine needs (the healthz times are only reported in the messages).
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request

import pytest
from kafka_utils import wait_for
from prometheus_client import CollectorRegistry, Counter

from streamsemi.service import httpserver
from streamsemi.service.httpserver import StatusServer

IDLE = 200
DEADLINE = 60.0


def _get(url: str, timeout: float = DEADLINE) -> tuple[int, bytes, float]:
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read(), time.monotonic() - t0
    except urllib.error.HTTPError as e:
        return e.code, e.read(), time.monotonic() - t0


def _connect(port: int, n: int) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=DEADLINE)
        socks.append(s)
    return socks


def _closed_by_server(s: socket.socket) -> bool:
    """The server closed ``s`` (EOF or reset; a 503 or 408 before the close counts as closed too)."""
    s.settimeout(0.05)
    try:
        while True:
            data = s.recv(4096)
            if not data:
                return True
    except (TimeoutError, BlockingIOError):
        return False
    except OSError:
        return True


def _trickle(socks: list[socket.socket], stop: threading.Event) -> None:
    """A slow client: one byte of a request head per second on each socket, never the end of the head."""
    head = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 10_000
    i = 0
    while not stop.wait(1.0):
        for s in socks:
            try:
                s.send(head[i:i + 1])
            except OSError:
                pass
        i += 1


@pytest.fixture
def status_server():
    registry = CollectorRegistry()
    Counter("bounds_probe_total", "a metric to serve", registry=registry).inc()

    def boom():
        raise RuntimeError("a route that fails")

    server = StatusServer("127.0.0.1", 0, registry, lambda: (True, {"status": "up"}), lambda: (False, {"why": "no model"}),
                          {"/boom": boom}, request_timeout_s=2.0).start()
    yield server
    server.stop()


def test_idle_and_trickling_connections_keep_the_metrics_port_bounded_and_healthz_answers(status_server):
    url = f"http://127.0.0.1:{status_server.port}"
    code, body, baseline = _get(url + "/healthz")
    assert code == 200 and b'"status": "up"' in body
    assert _get(url + "/metrics")[0] == 200
    threads_before = set(threading.enumerate())
    idle = _connect(status_server.port, IDLE)
    slow = _connect(status_server.port, 20)
    stop = threading.Event()
    trickler = threading.Thread(target=_trickle, args=(slow, stop), daemon=True)
    trickler.start()
    try:
        code, body, loaded = _get(url + "/healthz")
        assert code == 200 and b'"ok": true' in body, f"healthz under load: {code} ({baseline:.3f} s unloaded)"
        started = [t.name for t in set(threading.enumerate()) - threads_before - {trickler}]
        assert not [n for n in started if not n.startswith(("status-http", "ThreadPoolExecutor"))], started
        server_threads = [t.name for t in threading.enumerate() if t.name.startswith("status-http")]
        assert len(server_threads) <= 1 + httpserver.WORKERS, server_threads
        # idle connections, and those whose head never ends although bytes keep coming, are closed
        wait_for(lambda: all(_closed_by_server(s) for s in idle + slow), DEADLINE,
                 "the server closing idle and trickling connections")
        assert status_server.timed_out + status_server.evicted >= IDLE + 20, (status_server.timed_out,
                                                                              status_server.evicted)
        wait_for(lambda: status_server.open_connections() == 0, DEADLINE, "no connection left open")
        assert _get(url + "/healthz")[0] == 200, f"(took {loaded:.3f} s under load, {baseline:.3f} s before)"
    finally:
        stop.set()
        trickler.join(5)
        for s in idle + slow:
            s.close()


def test_beyond_max_connections_the_longest_waiting_one_is_closed():
    registry = CollectorRegistry()
    server = StatusServer("127.0.0.1", 0, registry, lambda: (True, {}), lambda: (True, {}), max_connections=10,
                          request_timeout_s=DEADLINE * 2).start()
    try:
        socks = []
        for n in range(1, 16):
            socks.append(_connect(server.port, 1)[0])
            # accepted in order: wait until the server holds this one before opening the next
            wait_for(lambda n=n: server.open_connections() == min(n, 10), DEADLINE, "the connection held")
        wait_for(lambda: all(_closed_by_server(s) for s in socks[:5]), DEADLINE, "the five oldest closed")
        assert not any(_closed_by_server(s) for s in socks[5:]), "the newest ten stay open"
        assert server.evicted == 5 and server.open_connections() == 10
        assert _get(f"http://127.0.0.1:{server.port}/healthz")[0] == 200, "a probe still gets in"
        for s in socks:
            s.close()
    finally:
        server.stop()


def test_bad_requests_get_an_error_and_the_server_goes_on(status_server):
    url = f"http://127.0.0.1:{status_server.port}"

    def raw(data: bytes) -> bytes:
        with socket.create_connection(("127.0.0.1", status_server.port), timeout=DEADLINE) as s:
            s.sendall(data)
            out = b""
            while chunk := s.recv(65536):
                out += chunk
            return out

    assert raw(b"GET /healthz HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.1 200 ")
    assert raw(b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n").endswith(b"\r\n\r\n"), "HEAD: no body"
    assert raw(b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n").startswith(b"HTTP/1.1 405 ")
    assert raw(b"\x16\x03\x01 not http at all\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    assert raw(b"GET / HTTP/1.1\r\n" + b"X: " + b"a" * (httpserver.MAX_REQUEST_BYTES + 10)).startswith(b"HTTP/1.1 431 ")
    assert _get(url + "/boom")[0] == 500
    assert _get(url + "/nope")[0] == 404
    assert _get(url + "/readyz")[:2] == (503, b'{"ok": false, "why": "no model"}')
    code, body, _ = _get(url + "/metrics")
    assert code == 200 and b"bounds_probe_total 1.0" in body


# ---------------------------------------------------------------- the console (uvicorn)
class ConsoleServer:
    """The console's app served with the console's own uvicorn configuration, on a thread."""

    def __init__(self, **bounds) -> None:
        import uvicorn

        from streamsemi.console.app import ConsoleOptions, create_app
        from streamsemi.console.server import uvicorn_config
        from streamsemi.console.state import ConsoleState
        from streamsemi.console.writer import ControlWriter
        from streamsemi.service.config import resolve

        self.writer = ControlWriter(resolve({}, env={}))  # connects on the first post only: none here
        app = create_app(ConsoleState(), self.writer, ConsoleOptions())
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(512)
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn_config(app, **bounds))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> ConsoleServer:
        self.thread.start()
        wait_for(lambda: self.server.started, DEADLINE, "uvicorn started")
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(15)
        self.sock.close()
        self.writer.close()

    def connections(self) -> int:
        return len(self.server.server_state.connections)


def test_idle_and_trickling_connections_leave_the_console_answering_and_are_closed():
    with ConsoleServer(request_timeout_s=2.0) as s:
        url = f"http://127.0.0.1:{s.port}"
        code, _, baseline = _get(url + "/healthz")
        assert code == 200
        threads_before = threading.active_count()
        idle = _connect(s.port, IDLE)
        slow = _connect(s.port, 20)
        stop = threading.Event()
        trickler = threading.Thread(target=_trickle, args=(slow, stop), daemon=True)
        trickler.start()
        try:
            code, body, loaded = _get(url + "/healthz")
            assert code == 200 and body == b"ok", f"healthz with {IDLE} idle connections: {code} {body[:80]!r}"
            code, page, _ = _get(url + "/")
            assert code == 200 and b"<html" in page
            assert threading.active_count() <= threads_before + 1 + 40, "uvicorn's loop and anyio's bounded pool"
            wait_for(lambda: all(_closed_by_server(x) for x in idle + slow), DEADLINE,
                     "the console closing idle and trickling connections")
            wait_for(lambda: s.connections() == 0, DEADLINE, "no connection left open")
            assert _get(url + "/healthz")[0] == 200, f"(took {loaded:.3f} s under load, {baseline:.3f} s before)"
        finally:
            stop.set()
            trickler.join(5)
            for x in idle + slow:
                x.close()


def test_the_console_keeps_at_most_max_connections_open_closing_the_longest_waiting():
    with ConsoleServer(max_connections=10, request_timeout_s=DEADLINE * 2) as s:
        socks = []
        for n in range(1, 16):
            socks.append(_connect(s.port, 1)[0])
            wait_for(lambda n=n: s.connections() == min(n, 10), DEADLINE, "the connection held")
        wait_for(lambda: all(_closed_by_server(x) for x in socks[:5]), DEADLINE, "the five oldest closed")
        assert not any(_closed_by_server(x) for x in socks[5:])
        assert _get(f"http://127.0.0.1:{s.port}/healthz")[0] == 200, "a probe still gets in"
        for x in socks:
            x.close()
