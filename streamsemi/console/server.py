"""Start the console: check the bind address and token, start the reader thread, serve with uvicorn.

uvicorn gives an idle keep-alive connection :data:`KEEP_ALIVE_S` but a new connection that sends
nothing, or a request that trickles in a byte at a time, forever; and its ``limit_concurrency``
counts idle connections, so 64 of them made every page (``/healthz`` too) answer 503. The console
serves with :func:`uvicorn_config`: its protocol gives each request :data:`REQUEST_TIMEOUT_S` from
its first byte (from the accept for a new connection) to its last byte of body, and keeps at most
:data:`MAX_CONNECTIONS` open: a new one beyond it closes the connection that has waited longest for
its request (when every open connection is being answered, the new one is closed). The event loop
is one thread; the pages' blocking work runs in anyio's bounded thread pool (40 threads).
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import socket
import sys
from dataclasses import dataclass
from typing import Any

from streamsemi.console.state import Bounds, ConsoleState
from streamsemi.core.errors import ConfigError
from streamsemi.service.config import Settings, stream_list

TOKEN_ENV = "STREAMSEMI_CONSOLE_TOKEN"
MIN_TOKEN_CHARS = 16
#: seconds a request has from its first byte (a new connection: from the accept) to the end of its body
REQUEST_TIMEOUT_S = 10.0
#: seconds an idle keep-alive connection is kept
KEEP_ALIVE_S = 5
#: connections open at most (each costs a few KB in the event loop)
MAX_CONNECTIONS = 256


def bounded_protocol(request_timeout_s: float = REQUEST_TIMEOUT_S, max_connections: int = MAX_CONNECTIONS) -> type:
    """uvicorn's h11 protocol with a deadline per request and a bound on open connections (see the module)."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    settled = (h11.DONE, h11.MUST_CLOSE, h11.CLOSED, h11.ERROR)

    class BoundedH11Protocol(H11Protocol):
        _deadline: Any = None
        _since = 0.0

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                waiting = [c for c in self.connections if c is not self and getattr(c, "_deadline", None) is not None]
                if not waiting:  # every other connection is being answered: this one waits no turn
                    self.transport.close()
                    return
                oldest = min(waiting, key=lambda c: c._since)
                oldest._disarm()
                oldest.transport.close()
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._deadline is None and self.conn.their_state is h11.IDLE:
                self._arm()  # the next request on a keep-alive connection
            super().data_received(data)
            if self.conn.their_state in settled:
                self._disarm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._since = self.loop.time()
            self._deadline = self.loop.call_later(request_timeout_s, self._expired)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expired(self) -> None:
            self._deadline = None
            if not self.transport.is_closing():
                self.transport.close()

    return BoundedH11Protocol


def uvicorn_config(app: Any, *, request_timeout_s: float = REQUEST_TIMEOUT_S,
                   max_connections: int = MAX_CONNECTIONS) -> Any:
    """The ``uvicorn.Config`` the console serves ``app`` with (bounded as the module docstring says)."""
    import uvicorn

    return uvicorn.Config(app, log_level="warning", access_log=False, server_header=False,
                          http=bounded_protocol(request_timeout_s, max_connections),
                          limit_concurrency=2 * max_connections, timeout_keep_alive=KEEP_ALIVE_S,
                          h11_max_incomplete_event_size=16 * 1024)


@dataclass
class ServeOptions:
    """The console's own settings (``streamsemi console --help``)."""

    host: str = "127.0.0.1"
    port: int = 8765
    auth_token: str | None = None
    worker_url: str | None = None
    max_entries: int = 50_000
    max_mb: float = 32.0
    backfill: int = 20_000


def _addresses(host: str) -> list[str]:
    try:
        return sorted({info[4][0] for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)})
    except (OSError, UnicodeError) as exc:
        raise ConfigError(f"setting 'host' (flag --host): must be an IP address or a resolvable host name, "
                          f"got {host!r} ({exc})") from None


def binds_loopback_only(host: str) -> bool:
    """Every address ``host`` resolves to is a loopback address."""
    addrs = _addresses(host)
    return bool(addrs) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addrs)


def check_options(opts: ServeOptions, env: dict[str, str] | None = None) -> ServeOptions:
    """Validate the console's settings; the token comes from ``--auth-token`` or the environment.

    Raises
    ------
    ConfigError
        Naming the setting: a non-loopback ``host`` without ``auth_token``, a short token, a
        port outside 0..65535, bounds that are not positive, a worker URL that is not http(s).
    """
    env = os.environ if env is None else env
    token = opts.auth_token if opts.auth_token is not None else env.get(TOKEN_ENV)
    source = "flag --auth-token" if opts.auth_token is not None else f"environment {TOKEN_ENV}"
    if token is not None and len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(f"setting 'auth_token' (from {source}): must have at least {MIN_TOKEN_CHARS} characters, "
                          f"got {len(token)}")
    if not 0 <= opts.port <= 65535:
        raise ConfigError(f"setting 'port' (flag --port): must be a TCP port 1..65535 (or 0 for any free port), "
                          f"got {opts.port}")
    if not binds_loopback_only(opts.host) and token is None:
        raise ConfigError(f"setting 'auth_token' (flag --auth-token or environment {TOKEN_ENV}): required when the "
                          f"console binds a non-loopback address, got host {opts.host!r} and no token")
    for name, value in (("max_entries", opts.max_entries), ("max_mb", opts.max_mb), ("backfill", opts.backfill)):
        if not value > 0:
            raise ConfigError(f"setting '{name}' (flag --{name.replace('_', '-')}): must be positive, got {value}")
    if opts.worker_url is not None and not opts.worker_url.startswith(("http://", "https://")):
        raise ConfigError(f"setting 'worker_url' (flag --worker-url): must be http://HOST:PORT of the worker's "
                          f"metrics server, got {opts.worker_url!r}")
    return ServeOptions(**{**opts.__dict__, "auth_token": token})


def bind_socket(host: str, port: int) -> socket.socket:
    """The listening socket (so that port 0 gives a known free port before serving)."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"setting 'port' (flag --port): must be a port this host can listen on, got {host}:{port} "
                          f"({exc.strerror or exc})") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def serve(settings: Settings, opts: ServeOptions) -> int:
    """Run the console until SIGINT/SIGTERM."""
    try:
        import uvicorn

        from streamsemi.console.app import ConsoleOptions, create_app
    except ImportError as exc:
        raise ConfigError(f"streamsemi console needs the console extra (pip install 'streamsemi[console]'): "
                          f"{exc}") from None
    from streamsemi.console.reader import TopicReader, topic_kinds
    from streamsemi.console.writer import ControlWriter

    opts = check_options(opts)
    sock = bind_socket(opts.host, opts.port)
    # with per-stream models (settings streams / default_stream, from --config or the environment), records and
    # ops without stream belong to the default stream: the console counts them there and names it in its writes
    default_stream = settings.default_stream if stream_list(settings.streams) else None
    state = ConsoleState(Bounds(max_entries=opts.max_entries, max_bytes=int(opts.max_mb * 1024 * 1024)),
                         default_stream=default_stream)
    reader = TopicReader(settings, state, backfill=opts.backfill)
    writer = ControlWriter(settings)
    app = create_app(state, writer, ConsoleOptions(
        auth_token=opts.auth_token, worker_url=opts.worker_url, loopback_only=opts.auth_token is None,
        bootstrap_servers=settings.bootstrap_servers, control_topic=settings.control_topic,
        suggestions_topic={k: t for t, k in topic_kinds(settings).items()}["suggestions"], kafka_status=reader.status))
    port = sock.getsockname()[1]
    shown = f"[{opts.host}]" if ":" in opts.host else opts.host
    reader.start()
    print(json.dumps({"event": "console_started", "url": f"http://{shown}:{port}/",
                      "auth": opts.auth_token is not None, "bootstrap_servers": settings.bootstrap_servers}),
          flush=True)
    server = uvicorn.Server(uvicorn_config(app))
    # uvicorn handles SIGINT/SIGTERM (graceful shutdown), then raises the signal again for the handler that was
    # installed before it: a no-op here, so that a stop on request ends the process with status 0
    previous = {s: signal.signal(s, lambda _s, _f: None) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run(sockets=[sock])
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        reader.stop()
        writer.close()
        sock.close()
        reader.join(timeout=5)
    print(json.dumps({"event": "console_stopped"}), file=sys.stderr, flush=True)
    return 0
