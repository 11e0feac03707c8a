"""Metrics and health endpoints: ``/metrics``, ``/healthz``, ``/readyz`` (and read-only JSON ``routes``).

Bounded under slow or idle clients: one selector thread accepts connections and reads each
request's head without blocking (at most :data:`MAX_REQUEST_BYTES`, and within
``request_timeout_s`` of the connection's accept: a client that sends nothing, or a byte now
and then, is closed); a complete request goes to a pool of ``workers`` threads that answer
it and close the connection (one request per connection, ``Connection: close``). At most
``max_connections`` connections are open: a new one beyond it closes the connection that has
waited longest for its request to arrive, or is answered 503 when every open connection is
being answered. The threads are 1 + ``workers`` however many clients connect, and a probe of
``/healthz`` is answered while hundreds of idle connections are open.
"""

from __future__ import annotations

import json
import logging
import selectors
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from streamsemi.core.errors import ConfigError
from streamsemi.core.logs import event

log = logging.getLogger("streamsemi.service.httpserver")

#: threads answering requests (the selector thread reads them)
WORKERS = 4
#: open connections at most (each is a socket and its partial request: a few KB)
MAX_CONNECTIONS = 256
#: seconds from a connection's accept to its complete request head, and per send of the answer
REQUEST_TIMEOUT_S = 10.0
#: bytes of a request head (request line and headers); a larger one is answered 431
MAX_REQUEST_BYTES = 16 * 1024

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            431: "Request Header Fields Too Large", 500: "Internal Server Error", 503: "Service Unavailable"}


def _response(code: int, body: bytes, ctype: str = "application/json", head_only: bool = False) -> bytes:
    head = (f"HTTP/1.1 {code} {_REASONS.get(code, 'Error')}\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {len(body)}\r\nX-Content-Type-Options: nosniff\r\nConnection: close\r\n\r\n").encode()
    return head if head_only else head + body


class _Pending:
    """A connection whose request head is still arriving."""

    __slots__ = ("buf", "deadline", "sock")

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.buf = bytearray()


class StatusServer:
    """HTTP server on a daemon thread, bounded in threads and connections (see the module docstring).

    Parameters
    ----------
    host, port : str, int
        Bind address (port 0 = any free port; see :attr:`port` after start).
    registry : CollectorRegistry
    health : callable returning (ok, details)
    ready : callable returning (ok, details)
    routes : mapping path -> callable returning JSON-able data, optional
        Further read-only JSON endpoints (the worker's ``/suggestions``).
    workers : int
        Threads answering requests.
    max_connections : int
        Open connections at most.
    request_timeout_s : float
        Seconds a connection has to send its request head (and each send of the answer may take).

    Raises
    ------
    ConfigError
        The host does not resolve or the address cannot be bound (port in use, not an
        address of this host); the message names ``metrics_host`` / ``metrics_port``.
    """

    def __init__(self, host: str, port: int, registry: CollectorRegistry,
                 health: Callable[[], tuple[bool, dict[str, Any]]],
                 ready: Callable[[], tuple[bool, dict[str, Any]]],
                 routes: dict[str, Callable[[], Any]] | None = None, *, workers: int = WORKERS,
                 max_connections: int = MAX_CONNECTIONS, request_timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self.registry = registry
        self.health = health
        self.ready = ready
        self.routes = dict(routes or {})
        self.max_connections = int(max_connections)
        self.request_timeout_s = float(request_timeout_s)
        try:
            family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        except (OSError, UnicodeError) as exc:
            raise ConfigError(f"setting 'metrics_host': must be an IP address or a resolvable host name, "
                              f"got {host!r} ({exc})") from None
        self.listener = socket.socket(family, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.listener.bind((host, port))
            self.listener.listen(128)
        except OSError as exc:
            self.listener.close()
            raise ConfigError(f"setting 'metrics_port': must be a port this host can listen on, got {host}:{port} "
                              f"({exc.strerror or exc})") from None
        self.listener.setblocking(False)
        self.host = host
        self.port = int(self.listener.getsockname()[1])
        self._selector = selectors.DefaultSelector()
        self._pending: OrderedDict[socket.socket, _Pending] = OrderedDict()  # oldest accepted first
        self._busy = 0  # connections handed to the workers and not closed yet
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=max(1, int(workers)), thread_name_prefix="status-http-worker")
        #: connections closed before their request arrived (timeout or room for a newer one), refused with 503
        self.timed_out = 0
        self.evicted = 0
        self.refused = 0
        self.thread = threading.Thread(target=self._serve, name="status-http", daemon=True)

    def start(self) -> StatusServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self.thread.is_alive():
            self.thread.join(10)
        else:
            self._close_all()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def open_connections(self) -> int:
        """Connections open now (waiting for their request, or being answered)."""
        with self._lock:
            return len(self._pending) + self._busy

    # ------------------------------------------------------------------ the selector thread
    def _serve(self) -> None:
        self._selector.register(self.listener, selectors.EVENT_READ, None)
        try:
            while not self._stop.is_set():
                for key, _ in self._selector.select(timeout=0.25):
                    if key.data is None:
                        self._accept()
                    else:
                        self._read(key.data)
                self._expire(time.monotonic())
        except Exception as exc:  # noqa: BLE001 - reported: the metrics endpoint is down, the worker is not
            event(log, "status_http_failed", logging.ERROR, error=f"{type(exc).__name__}: {exc}"[:300])
        finally:
            self._close_all()

    def _accept(self) -> None:
        for _ in range(64):  # a burst of connections is accepted in turns with reading the others
            try:
                sock, _addr = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of file descriptors: the backlog waits for the next turn
                event(log, "status_http_accept_failed", logging.WARNING, error=str(exc)[:200])
                return
            sock.setblocking(False)
            with self._lock:
                full = len(self._pending) + self._busy >= self.max_connections
            if full and self._pending:
                oldest = next(iter(self._pending.values()))
                self._drop(oldest)
                self.evicted += 1
            elif full:
                self.refused += 1
                try:
                    sock.send(_response(503, b'{"error": "too many connections"}'))
                except OSError:
                    pass
                sock.close()
                continue
            conn = _Pending(sock, time.monotonic() + self.request_timeout_s)
            with self._lock:
                self._pending[sock] = conn
            self._selector.register(sock, selectors.EVENT_READ, conn)

    def _read(self, conn: _Pending) -> None:
        try:
            data = conn.sock.recv(8192)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(conn)
            return
        conn.buf += data
        end = conn.buf.find(b"\r\n\r\n")
        if end < 0:
            end = conn.buf.find(b"\n\n")
        if end < 0 and len(conn.buf) <= MAX_REQUEST_BYTES:
            return
        self._selector.unregister(conn.sock)
        with self._lock:
            del self._pending[conn.sock]
            self._busy += 1
        head = bytes(conn.buf[:end]) if 0 <= end <= MAX_REQUEST_BYTES else None
        self._pool.submit(self._answer, conn.sock, head)

    def _expire(self, now: float) -> None:
        while self._pending:
            conn = next(iter(self._pending.values()))
            if conn.deadline > now:
                return
            self._drop(conn)
            self.timed_out += 1

    def _drop(self, conn: _Pending) -> None:
        try:
            self._selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        with self._lock:
            self._pending.pop(conn.sock, None)
        conn.sock.close()

    def _close_all(self) -> None:
        for conn in list(self._pending.values()):
            self._drop(conn)
        try:
            self._selector.close()
        finally:
            self.listener.close()

    # ------------------------------------------------------------------ the workers
    def _answer(self, sock: socket.socket, head: bytes | None) -> None:
        try:
            sock.settimeout(self.request_timeout_s)
            sock.sendall(self._respond(head))
        except OSError:
            pass  # the client went away or reads too slowly: nothing more to do for it
        finally:
            try:
                sock.close()
            finally:
                with self._lock:
                    self._busy -= 1

    def _respond(self, head: bytes | None) -> bytes:
        if head is None:
            return _response(431, b'{"error": "request head too large"}')
        parts = head.split(b"\r\n", 1)[0].split(b"\n", 1)[0].split()
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
            return _response(400, b'{"error": "bad request line"}')
        method = parts[0]
        if method not in (b"GET", b"HEAD"):
            return _response(405, b'{"error": "only GET and HEAD"}')
        path = parts[1].decode("latin-1").split("?", 1)[0]
        head_only = method == b"HEAD"
        try:
            if path == "/metrics":
                return _response(200, generate_latest(self.registry), CONTENT_TYPE_LATEST, head_only)
            if path in ("/healthz", "/readyz"):
                ok, details = (self.health if path == "/healthz" else self.ready)()
                return _response(200 if ok else 503, json.dumps({"ok": ok, **details}, default=str).encode(),
                                 head_only=head_only)
            if path in self.routes:
                return _response(200, json.dumps(self.routes[path](), default=str).encode(), head_only=head_only)
        except Exception as exc:  # noqa: BLE001 - one failed answer, the server goes on
            event(log, "status_http_error", logging.WARNING, path=path[:200], error=f"{type(exc).__name__}: {exc}"[:300])
            return _response(500, b'{"error": "internal error"}', head_only=head_only)
        return _response(404, b'{"error": "not found"}', head_only=head_only)
