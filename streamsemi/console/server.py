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

import hashlib
import hmac
import ipaddress
import json
import os
import re
import secrets
import signal
import socket
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
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


#: login sessions: kept at most (the oldest forgotten first), seconds idle and in all before one ends
MAX_SESSIONS = 1000
SESSION_IDLE_S = 2 * 3600
SESSION_MAX_S = 12 * 3600
#: failed logins (or wrong bearer tokens) a client may make per LOGIN_WINDOW_S before it waits LOGIN_LOCKOUT_S
LOGIN_FAILURES = 5
LOGIN_WINDOW_S = 300.0
LOGIN_LOCKOUT_S = 300.0
#: clients whose failures are remembered (least recently failed forgotten first)
MAX_THROTTLED_CLIENTS = 10_000


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).digest()


def token_matches(given: str, token: str) -> bool:
    """``given`` is ``token``, compared in constant time (over SHA-256 digests: the length leaks nothing)."""
    return hmac.compare_digest(_digest(given), _digest(token))


class Sessions:
    """The console's login sessions (a console with an auth token).

    The cookie holds ``ID.MAC``: ID 32 random bytes (URL-safe base64), MAC its HMAC-SHA256 under a
    key derived from the token and a random per-process salt, never the token. A session lives in
    this table (bounded: :data:`MAX_SESSIONS`, oldest first out) until it is idle
    :data:`SESSION_IDLE_S`, :data:`SESSION_MAX_S` after the login, a logout or the process' end.
    Each login makes a new ID (no fixation). A value whose MAC is wrong is refused in constant time
    before the table is looked at.

    Parameters
    ----------
    token : str
        The console's auth token.
    clock : callable
        Monotonic seconds (tests pass a fake).
    """

    def __init__(self, token: str, clock: Callable[[], float] = time.monotonic, max_sessions: int = MAX_SESSIONS,
                 idle_s: float = SESSION_IDLE_S, max_age_s: float = SESSION_MAX_S) -> None:
        salt = secrets.token_bytes(32)
        self._key = hmac.new(token.encode("utf-8", "surrogatepass"), b"streamsemi-console-session\0" + salt,
                             hashlib.sha256).digest()
        self.clock = clock
        self.max_sessions = int(max_sessions)
        self.idle_s = float(idle_s)
        self.max_age_s = float(max_age_s)
        self._live: OrderedDict[str, tuple[float, float]] = OrderedDict()  # id -> (created, last seen)
        self._lock = threading.Lock()

    def _mac(self, sid: str) -> str:
        return hmac.new(self._key, sid.encode("ascii"), hashlib.sha256).hexdigest()

    def create(self) -> str:
        """A new session; returns the cookie value."""
        sid = secrets.token_urlsafe(32)
        now = self.clock()
        with self._lock:
            self._live[sid] = (now, now)
            while len(self._live) > self.max_sessions:
                self._live.popitem(last=False)
        return f"{sid}.{self._mac(sid)}"

    def _id(self, value: str) -> str | None:
        sid, _, mac = value.partition(".")
        if not sid or len(value) > 200 or not sid.isascii():
            return None
        return sid if hmac.compare_digest(mac.encode("ascii", "replace"), self._mac(sid).encode()) else None

    def valid(self, value: str) -> bool:
        """``value`` (a cookie) names a live session; it counts as activity."""
        sid = self._id(value)
        if sid is None:
            return False
        now = self.clock()
        with self._lock:
            times = self._live.get(sid)
            if times is None:
                return False
            if now - times[0] > self.max_age_s or now - times[1] > self.idle_s:
                del self._live[sid]
                return False
            self._live[sid] = (times[0], now)
        return True

    def end(self, value: str) -> None:
        """Log out: the session of ``value`` ends (its cookie is refused from now on)."""
        sid = self._id(value)
        if sid is not None:
            with self._lock:
                self._live.pop(sid, None)

    def __len__(self) -> int:
        return len(self._live)


class LoginThrottle:
    """Failed logins per client: after :data:`LOGIN_FAILURES` within :data:`LOGIN_WINDOW_S` the client
    waits :data:`LOGIN_LOCKOUT_S` (its logins and bearer tokens are refused unchecked, 429). At most
    ``max_clients`` are remembered, the least recently failed forgotten first.

    Parameters
    ----------
    clock : callable
        Monotonic seconds (tests pass a fake).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, failures: int = LOGIN_FAILURES,
                 window_s: float = LOGIN_WINDOW_S, lockout_s: float = LOGIN_LOCKOUT_S,
                 max_clients: int = MAX_THROTTLED_CLIENTS) -> None:
        self.clock = clock
        self.failures = int(failures)
        self.window_s = float(window_s)
        self.lockout_s = float(lockout_s)
        self.max_clients = int(max_clients)
        self._clients: OrderedDict[str, tuple[float, int, float]] = OrderedDict()  # (window start, fails, locked until)
        self._lock = threading.Lock()

    def wait_s(self, client: str) -> float:
        """Seconds ``client`` must wait before its next attempt is checked (0: it may try now)."""
        with self._lock:
            entry = self._clients.get(client)
        return 0.0 if entry is None else max(0.0, entry[2] - self.clock())

    def failed(self, client: str) -> None:
        """``client`` gave a wrong token."""
        now = self.clock()
        with self._lock:
            start, fails, until = self._clients.pop(client, (now, 0, 0.0))
            if now - start > self.window_s:
                start, fails = now, 0
            fails += 1
            if fails >= self.failures:
                start, fails, until = now, 0, now + self.lockout_s
            self._clients[client] = (start, fails, until)
            while len(self._clients) > self.max_clients:
                self._clients.popitem(last=False)

    def __len__(self) -> int:
        return len(self._clients)


_HOST_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,252})$")


def allowed_host_names(bind_host: str, extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    """Host names (besides loopback names and IP addresses) a console's ``Host`` header may carry: the bind
    host when it is a name, this machine's name and ``extra`` (``--allowed-host``); lower case."""
    names = {bind_host.lower(), *(h.lower() for h in extra)}
    if bind_host in ("0.0.0.0", "::", ""):
        names.update({socket.gethostname().lower(), socket.getfqdn().lower()})
    return tuple(sorted(n for n in names if n and not _is_ip(n)))


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]").split("%")[0])
    except ValueError:
        return False
    return True


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
    #: host names the Host header may carry besides loopback names, IP addresses and the bind host's name
    allowed_hosts: tuple[str, ...] = ()
    #: the login cookie is Secure (``__Host-`` prefixed) on http too: the console is behind a TLS proxy
    secure_cookie: bool = False


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
    for name in opts.allowed_hosts:
        if not _HOST_NAME.match(name) or _is_ip(name):
            raise ConfigError(f"setting 'allowed_hosts' (flag --allowed-host): must be a host name (letters, digits, "
                              f"dots and hyphens, no port; IP addresses are always allowed), got {name!r}")
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
        allowed_hosts=allowed_host_names(opts.host, opts.allowed_hosts), secure_cookie=opts.secure_cookie,
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
