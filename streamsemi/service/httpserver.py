"""Metrics and health endpoints: ``/metrics``, ``/healthz``, ``/readyz`` (and read-only JSON ``routes``)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from streamsemi.core.errors import ConfigError


class StatusServer:
    """HTTP server on a daemon thread.

    Parameters
    ----------
    host, port : str, int
        Bind address (port 0 = any free port; see :attr:`port` after start).
    registry : CollectorRegistry
    health : callable returning (ok, details)
    ready : callable returning (ok, details)
    routes : mapping path -> callable returning JSON-able data, optional
        Further read-only JSON endpoints (the worker's ``/suggestions``).

    Raises
    ------
    ConfigError
        The host does not resolve or the address cannot be bound (port in use, not an
        address of this host); the message names ``metrics_host`` / ``metrics_port``.
    """

    def __init__(self, host: str, port: int, registry: CollectorRegistry,
                 health: Callable[[], tuple[bool, dict[str, Any]]],
                 ready: Callable[[], tuple[bool, dict[str, Any]]],
                 routes: dict[str, Callable[[], Any]] | None = None) -> None:
        registry_ = registry
        routes_ = dict(routes or {})

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server API
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    body = generate_latest(registry_)
                    self._send(200, body, CONTENT_TYPE_LATEST)
                elif path in ("/healthz", "/readyz"):
                    ok, details = (health if path == "/healthz" else ready)()
                    body = json.dumps({"ok": ok, **details}, default=str).encode()
                    self._send(200 if ok else 503, body, "application/json")
                elif path in routes_:
                    self._send(200, json.dumps(routes_[path](), default=str).encode(), "application/json")
                else:
                    self._send(404, b'{"error": "not found"}', "application/json")

            def _send(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("X-Content-Type-Options", "nosniff")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                return

        try:
            family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        except (OSError, UnicodeError) as exc:
            raise ConfigError(f"setting 'metrics_host': must be an IP address or a resolvable host name, "
                              f"got {host!r} ({exc})") from None

        class Server(ThreadingHTTPServer):
            address_family = family

        try:
            self.httpd = Server((host, port), Handler)
        except OSError as exc:
            raise ConfigError(f"setting 'metrics_port': must be a port this host can listen on, got {host}:{port} "
                              f"({exc.strerror or exc})") from None
        self.httpd.daemon_threads = True
        self.host = host
        self.port = int(self.httpd.server_address[1])
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="status-http", daemon=True)

    def start(self) -> StatusServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
