"""The console's web application: Starlette, server-rendered Jinja2 pages, one small script.

Security (docs/console.md):

- every template variable is escaped (Jinja2 autoescape); the Content-Security-Policy
  allows scripts, styles and images from the console itself only (no inline script);
- every POST carries the per-process CSRF token (hidden form field ``csrf`` or header
  ``X-CSRF-Token``) and, when the browser says where it comes from, a same-origin
  ``Origin`` / ``Sec-Fetch-Site``;
- with an auth token, every request (pages, assets, posts) needs it: the session cookie set by
  ``/login`` (an HMAC-signed random session id, never the token: HttpOnly, SameSite=Strict,
  Path=/, Secure and ``__Host-`` prefixed over https or with ``secure_cookie``; ended by
  ``POST /logout``, after 2 h idle or 12 h) or ``Authorization: Bearer TOKEN``; a client that gives
  5 wrong tokens in 5 minutes waits 5 minutes (429), whatever it sends;
- the ``Host`` header must name a loopback address without a token (loopback only, enforced at
  start), and with one a loopback name, an IP address or one of ``allowed_hosts``: a
  DNS-rebinding page (an attacker's name resolving to this host) cannot read the console.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from streamsemi.console.server import LoginThrottle, Sessions, token_matches
from streamsemi.console.state import ConsoleState
from streamsemi.console.writer import ControlWriter
from streamsemi.core.jsonsafe import loads_object

HERE = Path(__file__).resolve().parent
COOKIE = "streamsemi_console"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
#: keyboard shortcuts 1..9 pick the first nine classes of the queue
SHORTCUT_CLASSES = 9
#: a form post of the console is well under a kilobyte; anything much larger is refused unread
MAX_POST_BYTES = 64 * 1024


@dataclass
class ConsoleOptions:
    """What the app needs besides the state and the writer."""

    auth_token: str | None = None
    worker_url: str | None = None
    loopback_only: bool = True
    bootstrap_servers: str = ""
    control_topic: str = ""
    suggestions_topic: str = "streamsemi.suggestions"
    #: the topic reader's :meth:`~streamsemi.console.reader.TopicReader.status` (None: not shown)
    kafka_status: Callable[[], dict[str, Any]] | None = None
    #: with a token: host names the Host header may carry besides loopback names and IP addresses
    allowed_hosts: tuple[str, ...] = ()
    #: the session cookie is Secure even when the request came over http (behind a TLS proxy)
    secure_cookie: bool = False
    #: monotonic seconds for the sessions and the login throttle (tests pass a fake)
    clock: Callable[[], float] = time.monotonic


def is_loopback_host(host: str) -> bool:
    """``host`` (without port) is ``localhost`` or a loopback IP address."""
    h = host.strip("[]").lower()
    if h == "localhost" or h.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def host_allowed(host: str, token_set: bool, names: tuple[str, ...] = ()) -> bool:
    """The ``Host`` header's host (without port) may reach the console: a loopback name or address; with a
    token also any IP address (a page of another origin cannot make a browser send one) and ``names``."""
    if is_loopback_host(host):
        return True
    if not token_set:
        return False
    h = host.strip("[]").lower()
    try:
        ipaddress.ip_address(h.split("%")[0])
        return True
    except ValueError:
        return h in names


def _host_of(header: str) -> str:
    if header.startswith("["):
        return header[1:].partition("]")[0]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def safe_next(value: str | None, default: str = "/") -> str:
    """A local path to go back to after a post (never another site)."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return default
    if any(ord(c) <= 32 or ord(c) == 127 for c in value):
        return default  # browsers drop tabs and newlines: "/\t/evil.example" would become "//evil.example"
    return value


class WorkerMetrics:
    """The worker's quality signals from its ``/metrics`` (cached for a second or two)."""

    NAMES = ("streamsemi_model_agreement", "streamsemi_seed_accuracy", "streamsemi_documents_consumed_total",
             "streamsemi_documents_assigned_total", "streamsemi_dead_letters_total", "streamsemi_window_documents",
             "streamsemi_consumer_lag", "streamsemi_new_clusters", "streamsemi_primary", "streamsemi_model_version",
             "streamsemi_refits_total", "streamsemi_seed_documents", "streamsemi_suggested_seed_accuracy")

    def __init__(self, url: str | None, timeout_s: float = 1.5) -> None:
        if url is not None and urllib.parse.urlsplit(url).scheme not in ("http", "https"):
            raise ValueError(f"worker URL must be http(s)://HOST:PORT, got {url!r}")
        self.url = url.rstrip("/") if url else None
        self.timeout_s = timeout_s
        self._cached: tuple[float, dict[str, Any]] | None = None
        self._last_count: tuple[float, float] | None = None
        self._streams: tuple[float, bool | None] | None = None

    def per_stream(self) -> bool | None:
        """Whether the worker runs per-stream models, from its ``/readyz`` (which lists ``streams`` with them only).

        Returns
        -------
        bool or None
            None without a worker URL or when the worker does not answer with a JSON object
            (cached for 10 s either way).
        """
        if self.url is None:
            return None
        now = time.monotonic()
        if self._streams is not None and now - self._streams[0] < 10.0:
            return self._streams[1]
        found: bool | None = None
        try:
            try:
                with urllib.request.urlopen(self.url + "/readyz", timeout=self.timeout_s) as r:  # noqa: S310 - http(s) checked
                    body = r.read(1_000_000)
            except urllib.error.HTTPError as exc:  # 503 while not ready: the same JSON body
                with exc:
                    body = exc.read(1_000_000)
            info = loads_object(body)
            found = isinstance(info.get("streams"), dict)
        except (OSError, ValueError):
            found = None
        self._streams = (now, found)
        return found

    def read(self) -> dict[str, Any]:
        if self.url is None:
            return {"available": False, "error": "no --worker-url given"}
        now = time.monotonic()
        if self._cached is not None and now - self._cached[0] < 2.0:
            return self._cached[1]
        from prometheus_client.parser import text_string_to_metric_families

        out: dict[str, Any] = {"available": True, "url": self.url}
        try:
            with urllib.request.urlopen(self.url + "/metrics", timeout=self.timeout_s) as r:  # noqa: S310 - http(s) checked
                body = r.read(8_000_000).decode("utf-8", "replace")
            samples: dict[str, list[tuple[dict[str, str], float]]] = {}
            for fam in text_string_to_metric_families(body):
                for s in fam.samples:
                    if s.name in self.NAMES:
                        samples.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
        except (OSError, ValueError) as exc:
            out = {"available": False, "url": self.url, "error": f"{type(exc).__name__}: {exc}"[:300]}
            self._cached = (now, out)
            return out

        def per_alg(name: str) -> dict[str, float]:
            return {lb.get("algorithm", ""): v for lb, v in samples.get(name, [])}

        def total(name: str) -> float:
            return sum(v for _, v in samples.get(name, []))

        consumed = total("streamsemi_documents_consumed_total")
        rate = None
        if self._last_count is not None and now - self._last_count[0] > 0.5:
            rate = max(0.0, (consumed - self._last_count[1]) / (now - self._last_count[0]))
        self._last_count = (now, consumed)
        out.update(agreement=per_alg("streamsemi_model_agreement"), seed_accuracy=per_alg("streamsemi_seed_accuracy"),
                   suggested_seed_accuracy=per_alg("streamsemi_suggested_seed_accuracy"),
                   new_clusters=per_alg("streamsemi_new_clusters"), model_version=per_alg("streamsemi_model_version"),
                   primary=[a for a, v in per_alg("streamsemi_primary").items() if v == 1.0],
                   consumed=consumed, assigned=total("streamsemi_documents_assigned_total"),
                   dead_letters=total("streamsemi_dead_letters_total"), window=total("streamsemi_window_documents"),
                   lag=total("streamsemi_consumer_lag"), refits=total("streamsemi_refits_total"),
                   seeds=total("streamsemi_seed_documents"), docs_per_s=rate)
        self._cached = (now, out)
        return out


def _fmt_ts(ts: float) -> str:
    try:
        return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):
        return "?"


def create_app(state: ConsoleState, writer: ControlWriter, options: ConsoleOptions) -> Starlette:
    """The Starlette application (see the module docstring for its security rules)."""
    env = Environment(loader=FileSystemLoader(str(HERE / "templates")), autoescape=select_autoescape(default=True),
                      trim_blocks=True, lstrip_blocks=True)
    env.filters["ts"] = _fmt_ts
    csrf_token = secrets.token_urlsafe(32)
    metrics = WorkerMetrics(options.worker_url)
    token = options.auth_token
    sessions = Sessions(token, options.clock) if token is not None else None
    throttle = LoginThrottle(options.clock)

    def cookie_name(request: Request) -> str:
        return "__Host-" + COOKIE if secure(request) else COOKIE

    def secure(request: Request) -> bool:
        return options.secure_cookie or request.url.scheme == "https"

    def client_of(request: Request) -> str:
        return request.client.host if request.client else "?"

    def throttled(request: Request, wait_s: float) -> Response:
        retry = {"Retry-After": str(max(1, int(wait_s + 0.999)))}
        if "text/html" in request.headers.get("accept", ""):
            resp = render(request, "login.html", status=429, failed=True)
            resp.headers.update(retry)
            return resp
        return PlainTextResponse(f"too many wrong tokens: try again in {retry['Retry-After']} s", 429, headers=retry)

    def render(request: Request, template: str, status: int = 200, *, only: str | None = None, **ctx: Any) -> HTMLResponse:
        err = request.query_params.get("err")
        asked = request.query_params.get("stream")
        if asked and only is None:
            err = f"no stream {asked[:80]!r} seen: showing every stream"
        body = env.get_template(template).render(
            csrf=csrf_token, path=request.url.path, full_path=_full_path(request), msg=request.query_params.get("msg"),
            err=err, auth=token is not None, streams=state.streams(), multi=state.multi_stream(), only=only,
            kafka=options.kafka_status() if options.kafka_status is not None else None,
            kafka_servers=options.bootstrap_servers,
            q=("?" + urllib.parse.urlencode({"stream": only})) if only else "", **ctx)
        return HTMLResponse(body, status_code=status)

    def only_of(request: Request) -> str | None:
        """The page's stream filter: query parameter ``stream``, one of the streams seen (else no filter)."""
        asked = request.query_params.get("stream")
        return asked if asked and asked in state.streams() else None

    def _full_path(request: Request) -> str:
        q = request.url.query
        return request.url.path + ("?" + q if q else "")

    def back(request: Request, form: Any, **params: str) -> RedirectResponse:
        target = safe_next(form.get("next") if form is not None else None)
        base, _, query = target.partition("?")
        kept = [(k, v) for k, v in urllib.parse.parse_qsl(query) if k not in ("msg", "err")]
        kept += [(k, v) for k, v in params.items()]
        return RedirectResponse(base + ("?" + urllib.parse.urlencode(kept) if kept else ""), status_code=303)

    # ------------------------------------------------------------ pages
    async def overview(request: Request) -> Response:
        only = only_of(request)
        return render(request, "overview.html", only=only, o=await run_in_threadpool(state.overview, only),
                      worker=await run_in_threadpool(metrics.read),
                      bootstrap=options.bootstrap_servers, control_topic=options.control_topic)

    async def clusters(request: Request) -> Response:
        only = only_of(request)
        views = await run_in_threadpool(lambda: state.clusters_view(only=only))
        return render(request, "clusters.html", only=only, views=views)

    async def new_clusters(request: Request) -> Response:
        only = only_of(request)
        return render(request, "new_clusters.html", only=only, rows=await run_in_threadpool(state.new_clusters, only))

    def with_classes(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Each item with the classes of its own stream (the buttons that label it) and their shortcuts."""
        per: dict[str | None, list[str]] = {}
        for it in items:
            if it["stream"] not in per:
                per[it["stream"]] = state.classes(it["stream"])
            it["classes"] = per[it["stream"]]
            it["shortcuts"] = min(SHORTCUT_CLASSES, len(it["classes"]))
        return items

    async def queue(request: Request) -> Response:
        only = only_of(request)
        items, source = await run_in_threadpool(lambda: state.queue(only=only))
        items = await run_in_threadpool(with_classes, items)
        return render(request, "queue.html", only=only, items=items, source=source,
                      suggestions_topic=options.suggestions_topic)

    async def seeds(request: Request) -> Response:
        only = only_of(request)
        ops = [op for op in reversed(state.recent_ops) if only is None or op.get("stream") == only]
        return render(request, "seeds.html", only=only, seeds=state.recent_seeds(only=only), ops=ops)

    async def learn_streams() -> None:
        """Ask the worker (its ``/readyz``) whether it runs per-stream models, until something says so."""
        if not state.per_stream() and await run_in_threadpool(metrics.per_stream):
            state.note_worker_streams(True)

    async def doc(request: Request) -> Response:
        doc_id = request.query_params.get("id", "").strip()
        only = only_of(request)
        await learn_streams()  # the form carries a stream only for a worker with per-stream models
        found = state.document(doc_id, only) if doc_id else None
        classes = state.classes(found["stream"]) if found is not None else []
        current = set(found["seed"]["labels"]) if found is not None and found["seed"] else set()
        return render(request, "doc.html", only=only, doc_id=doc_id, d=found, classes=classes, current=current,
                      status=404 if doc_id and found is None else 200)

    # ------------------------------------------------------------ writes
    async def _send(request: Request, form: Any, message: dict[str, Any], done: str) -> Response:
        try:
            partition, offset = await run_in_threadpool(writer.send, message)
        except ValueError as exc:
            return back(request, form, err=f"refused: {exc}")
        except Exception as exc:  # noqa: BLE001 - Kafka trouble: tell the person, keep serving
            return back(request, form, err=f"not sent ({type(exc).__name__}): {exc}"[:300])
        return back(request, form, msg=f"{done} (control topic partition {partition}, offset {offset})")

    def stream_of(form: Any, msg: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        """``msg`` with the form's ``stream`` (the stream of the item acted on; none: the default stream's)."""
        stream = str(form.get("stream", "")).strip() or None
        return ({**msg, "stream": stream} if stream else msg), stream

    def where(stream: str | None) -> str:
        return f" (stream {stream})" if stream else ""

    async def label(request: Request) -> Response:
        form = request.state.form
        doc_id = str(form.get("id", "")).strip()
        new = str(form.get("new_label", "")).strip()
        lab = new or str(form.get("label", "")).strip()
        if not doc_id or not lab:
            return back(request, form, err="a document id and a class are needed")
        msg, stream = stream_of(form, {"op": "label", "id": doc_id, "labels": [lab]})
        text, complete = state.text_of(doc_id, stream)
        if text and complete:
            msg["text"] = text  # a worker that no longer holds the document still gets the seed
        resp = await _send(request, form, msg, f"labelled {doc_id} as {lab}{where(stream)}")
        if "err=" not in resp.headers.get("location", ""):
            state.hide(doc_id, "labeled", stream)
        return resp

    async def skip(request: Request) -> Response:
        form = request.state.form
        doc_id = str(form.get("id", "")).strip()
        stream = stream_of(form, {})[1]
        if doc_id:
            state.hide(doc_id, "skipped", stream)
        return back(request, form, msg=f"skipped {doc_id}{where(stream)}")

    async def unlabel(request: Request) -> Response:
        form = request.state.form
        doc_id = str(form.get("id", "")).strip()
        msg, stream = stream_of(form, {"op": "unlabel", "id": doc_id})
        return await _send(request, form, msg, f"removed the seed of {doc_id}{where(stream)}")

    async def refit(request: Request) -> Response:
        msg, stream = stream_of(request.state.form, {"op": "refit"})
        return await _send(request, request.state.form, msg, f"refit requested{where(stream)}")

    async def name(request: Request) -> Response:
        form = request.state.form
        cluster = str(form.get("cluster", "")).strip()
        algorithm = str(form.get("algorithm", "")).strip()
        lab = str(form.get("label", "")).strip()
        if not cluster or not lab:
            return back(request, form, err="a cluster and a name are needed")
        msg, stream = stream_of(form, {"op": "name", "cluster": cluster, "label": lab})
        if algorithm:
            msg["algorithm"] = algorithm
        return await _send(request, form, msg, f"named {cluster} {lab}{where(stream)}")

    # ------------------------------------------------------------ auth
    async def login_page(request: Request) -> Response:
        return render(request, "login.html", status=401 if token else 200)

    async def login(request: Request) -> Response:
        if token is None or sessions is None:
            return RedirectResponse("/", status_code=303)
        wait_s = throttle.wait_s(client_of(request))
        if wait_s > 0:
            return throttled(request, wait_s)
        form = await request.form(max_files=0, max_fields=10, max_part_size=4096)
        if not token_matches(str(form.get("token", "")), token):
            throttle.failed(client_of(request))
            return render(request, "login.html", status=401, failed=True)
        resp = RedirectResponse("/", status_code=303)
        resp.set_cookie(cookie_name(request), sessions.create(), max_age=int(sessions.max_age_s), httponly=True,
                        samesite="strict", path="/", secure=secure(request))
        return resp

    async def logout(request: Request) -> Response:
        if sessions is not None:
            sessions.end(request.cookies.get(cookie_name(request), ""))
        resp = RedirectResponse("/login" if token is not None else "/", status_code=303)
        resp.delete_cookie(cookie_name(request), path="/", httponly=True, samesite="strict", secure=secure(request))
        return resp

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def favicon(request: Request) -> Response:
        return Response(status_code=204)

    routes = [
        Route("/", overview), Route("/clusters", clusters), Route("/clusters/new", new_clusters),
        Route("/queue", queue), Route("/seeds", seeds), Route("/doc", doc), Route("/healthz", healthz), Route("/favicon.ico", favicon),
        Route("/label", label, methods=["POST"]), Route("/skip", skip, methods=["POST"]),
        Route("/unlabel", unlabel, methods=["POST"]), Route("/refit", refit, methods=["POST"]),
        Route("/name", name, methods=["POST"]),
        Route("/login", login_page, methods=["GET"]), Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Mount("/static", app=StaticFiles(directory=str(HERE / "static")), name="static"),
    ]

    class Guard(BaseHTTPMiddleware):
        """Host check, token check, CSRF check and security headers, for every request."""

        async def dispatch(self, request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
            resp = await self._check(request, call_next)
            resp.headers["Content-Security-Policy"] = CSP
            resp.headers["X-Content-Type-Options"] = "nosniff"
            resp.headers["X-Frame-Options"] = "DENY"
            resp.headers["Referrer-Policy"] = "no-referrer"
            resp.headers["Cache-Control"] = "no-store"
            return resp

        async def _check(self, request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
            host = _host_of(request.headers.get("host", ""))
            if not host_allowed(host, token is not None, options.allowed_hosts):
                if token is None:
                    return PlainTextResponse("this console answers loopback host names only (no auth token set)", 421)
                return PlainTextResponse("this console does not answer this host name (see --allowed-host)", 421)
            public = request.url.path in ("/login", "/healthz")
            if token is not None and not public and request.headers.get("authorization", "").lower().startswith("bearer "):
                wait_s = throttle.wait_s(client_of(request))  # a locked-out client's bearer token is not checked
                if wait_s > 0:
                    return throttled(request, wait_s)
            if token is not None and not public and not _authorized(request):
                if request.method == "GET" and "text/html" in request.headers.get("accept", ""):
                    return render(request, "login.html", status=401)
                return PlainTextResponse("authentication required", 401)
            if request.method == "POST":
                length = request.headers.get("content-length")
                if length is None or not length.isdigit():
                    return PlainTextResponse("a post needs a Content-Length", 411)
                if int(length) > MAX_POST_BYTES:
                    return PlainTextResponse(f"a post carries at most {MAX_POST_BYTES} bytes", 413)
            if request.method == "POST" and request.url.path != "/login":
                problem = await _csrf_problem(request)
                if problem:
                    return PlainTextResponse(f"forbidden: {problem}", 403)
            return await call_next(request)

    def _authorized(request: Request) -> bool:
        """A live session cookie, or ``Authorization: Bearer TOKEN`` (a wrong bearer token counts as a failed login)."""
        assert token is not None and sessions is not None
        auth = request.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            if token_matches(auth[7:].strip(), token):
                return True
            throttle.failed(client_of(request))
            return False
        return sessions.valid(request.cookies.get(cookie_name(request), ""))

    async def _csrf_problem(request: Request) -> str | None:
        site = request.headers.get("sec-fetch-site")
        if site is not None and site not in ("same-origin", "none"):
            return f"cross-site request (Sec-Fetch-Site: {site})"
        origin = request.headers.get("origin")
        if origin is not None and origin != "null":
            own = f"{request.url.scheme}://{request.headers.get('host', '')}"
            if origin != own:
                return "the Origin is not this console"
        form = await request.form(max_files=0, max_fields=50, max_part_size=64 * 1024)
        request.state.form = form
        given = request.headers.get("x-csrf-token") or str(form.get("csrf", ""))
        if not given or not hmac.compare_digest(given.encode(), csrf_token.encode()):
            return "missing or wrong CSRF token (reload the page)"
        return None

    app = Starlette(routes=routes, middleware=[Middleware(Guard)])
    app.state.csrf_token = csrf_token
    return app
