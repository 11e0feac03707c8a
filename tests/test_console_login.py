"""The console's login with an auth token (OWASP session management): what the cookie holds and its flags,
logout and expiry, throttled wrong tokens, the Host check with and without a token. Served by uvicorn."""

from __future__ import annotations

import urllib.parse
from html.parser import HTMLParser

import pytest
from test_console import Served, _request

from streamsemi.console import server as console_server
from streamsemi.console.app import ConsoleOptions, create_app, host_allowed
from streamsemi.console.server import (
    LoginThrottle,
    ServeOptions,
    Sessions,
    check_options,
    token_matches,
)
from streamsemi.console.state import ConsoleState
from streamsemi.console.writer import ControlWriter
from streamsemi.core.errors import ConfigError
from streamsemi.service.config import resolve

TOKEN = "s3cret-console-token-" + "x" * 12


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def served():
    """(app server, clock) of a console with a token and a fake clock (the writer never connects here)."""
    clock = Clock()
    writer = ControlWriter(resolve({}, env={}))

    def make(**options):
        app = create_app(ConsoleState(), writer, ConsoleOptions(auth_token=TOKEN, loopback_only=False, clock=clock,
                                                                **options))
        return Served(app), app

    yield make, clock
    writer.close()


def _cookie(headers: dict) -> tuple[str, str, dict[str, str]]:
    """(name, value, attributes) of a Set-Cookie header."""
    first, *attrs = [p.strip() for p in headers["set-cookie"].split(";")]
    name, _, value = first.partition("=")
    return name, value, {a.partition("=")[0].lower(): a.partition("=")[2] for a in attrs}


def _login(s: Served, token: str = TOKEN, headers: dict | None = None) -> tuple[int, dict]:
    code, _, h = _request(s.url("/login"), {"token": token}, headers)
    return code, h


def test_the_cookie_holds_a_signed_session_id_never_the_token_with_strict_flags(served):
    make, _ = served
    s, _app = make()
    with s:
        code, headers = _login(s)
        assert code == 303 and headers["location"] == "/"
        name, value, attrs = _cookie(headers)
        assert name == "streamsemi_console"
        assert TOKEN not in value and urllib.parse.quote(TOKEN) not in value, "the cookie never holds the token"
        sid, _, mac = value.partition(".")
        assert len(sid) >= 43 and len(mac) == 64, "32 random bytes and an HMAC-SHA256"
        assert "httponly" in attrs and attrs["samesite"].lower() == "strict" and attrs["path"] == "/"
        assert int(attrs["max-age"]) == console_server.SESSION_MAX_S and "secure" not in attrs, "plain http"
        assert _request(s.url("/seeds"), headers={"Cookie": f"{name}={value}"})[0] == 200
        assert _cookie(_login(s)[1])[1] != value, "a new session id at every login"
        # the token itself, or a session id with a forged MAC, is no session
        assert _request(s.url("/seeds"), headers={"Cookie": f"{name}={TOKEN}"})[0] == 401
        assert _request(s.url("/seeds"), headers={"Cookie": f"{name}={sid}.{'0' * 64}"})[0] == 401
        assert _request(s.url("/seeds"), headers={"Authorization": f"Bearer {TOKEN}"})[0] == 200


def test_behind_a_tls_proxy_the_cookie_is_secure_and_host_prefixed(served):
    make, _ = served
    s, _app = make(secure_cookie=True)
    with s:
        code, headers = _login(s)
        name, value, attrs = _cookie(headers)
        assert code == 303 and name == "__Host-streamsemi_console" and "secure" in attrs and attrs["path"] == "/"
        assert "domain" not in attrs


def test_logout_ends_the_session_and_sessions_expire(served):
    make, clock = served
    s, app = make()
    with s:
        name, value, _ = _cookie(_login(s)[1])
        jar = {"Cookie": f"{name}={value}"}
        csrf = app.state.csrf_token
        assert _request(s.url("/logout"), {"next": "/"}, jar)[0] == 403, "a logout is a post like any other: CSRF"
        code, _, headers = _request(s.url("/logout"), {"csrf": csrf}, jar)
        assert code == 303 and headers["location"] == "/login"
        gone = _cookie(headers)
        assert gone[0] == name and gone[1] in ("", '""') and gone[2].get("max-age") == "0"
        assert _request(s.url("/seeds"), headers=jar)[0] == 401, "the old cookie is refused after the logout"
        # idle too long, then too old however active
        name, value, _ = _cookie(_login(s)[1])
        jar = {"Cookie": f"{name}={value}"}
        clock.now += console_server.SESSION_IDLE_S - 1
        assert _request(s.url("/seeds"), headers=jar)[0] == 200
        clock.now += console_server.SESSION_IDLE_S + 1
        assert _request(s.url("/seeds"), headers=jar)[0] == 401, "idle for longer than SESSION_IDLE_S"
        name, value, _ = _cookie(_login(s)[1])
        jar = {"Cookie": f"{name}={value}"}
        start = clock.now
        while clock.now + console_server.SESSION_IDLE_S / 2 - start <= console_server.SESSION_MAX_S:
            clock.now += console_server.SESSION_IDLE_S / 2
            assert _request(s.url("/seeds"), headers=jar)[0] == 200, "active: never idle for long"
        clock.now += console_server.SESSION_IDLE_S / 2
        assert _request(s.url("/seeds"), headers=jar)[0] == 401, "older than SESSION_MAX_S"


def _logout_form(html: str) -> tuple[str, str, dict[str, str]] | None:
    """(method, action, fields) of the page's logout form (the one posting to /logout), or None."""
    class Forms(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.forms: list[tuple[str, str, dict[str, str]]] = []

        def handle_starttag(self, tag: str, attrs: list) -> None:
            a = dict(attrs)
            if tag == "form":
                self.forms.append(((a.get("method") or "get").lower(), a.get("action") or "", {}))
            elif tag == "input" and self.forms and a.get("name"):
                self.forms[-1][2][a["name"]] = a.get("value") or ""

    parser = Forms()
    parser.feed(html)
    found = [f for f in parser.forms if f[1] == "/logout"]
    assert len(found) <= 1, found
    return found[0] if found else None


@pytest.mark.parametrize("page", ["/", "/queue", "/clusters", "/clusters/new", "/seeds", "/doc?id=x"])
def test_every_page_has_a_logout_form_that_ends_the_session(served, page):
    make, _ = served
    s, app = make()
    with s:
        name, value, _ = _cookie(_login(s)[1])
        jar = {"Cookie": f"{name}={value}"}
        code, body, _ = _request(s.url(page), headers=jar)
        assert code == (404 if page.startswith("/doc") else 200)   # no document x: its page says so
        form = _logout_form(body)
        assert form is not None, "no logout form on the page"
        method, action, fields = form
        assert method == "post" and fields == {"csrf": app.state.csrf_token}
        code, _, headers = _request(s.url(action), fields, jar)   # what the button sends
        assert code == 303 and headers["location"] == "/login"
        assert _request(s.url(page), headers=jar)[0] == 401, "the session ended"


def test_without_a_token_there_is_no_session_and_no_logout_form():
    writer = ControlWriter(resolve({}, env={}))
    try:
        with Served(create_app(ConsoleState(), writer, ConsoleOptions())) as s:
            code, body, _ = _request(s.url("/seeds"))
            assert code == 200 and "<form" in body and _logout_form(body) is None
    finally:
        writer.close()


def test_wrong_tokens_are_throttled_per_client_then_the_client_may_try_again(served):
    make, clock = served
    s, _app = make()
    with s:
        for _ in range(console_server.LOGIN_FAILURES - 1):
            assert _login(s, "wrong-token-" + "y" * 10)[0] == 401
        assert _request(s.url("/"), headers={"Authorization": "Bearer nope"})[0] == 401, "a bearer guess counts too"
        code, headers = _login(s)
        assert code == 429 and int(headers["retry-after"]) == console_server.LOGIN_LOCKOUT_S, \
            "locked out: even the right token is not checked"
        assert _request(s.url("/seeds"), headers={"Authorization": f"Bearer {TOKEN}"})[0] == 429
        code, page, _ = _request(s.url("/login"), {"token": TOKEN}, {"Accept": "text/html"})
        assert code == 429 and 'action="/login"' in page
        clock.now += console_server.LOGIN_LOCKOUT_S + 1
        assert _login(s)[0] == 303, "the lockout ends"


def test_the_login_throttle_and_the_sessions_are_bounded_and_per_client():
    clock = Clock()
    throttle = LoginThrottle(clock, failures=3, window_s=60, lockout_s=30, max_clients=100)
    for _ in range(3):
        throttle.failed("10.0.0.1")
    assert throttle.wait_s("10.0.0.1") == 30 and throttle.wait_s("10.0.0.2") == 0, "per client"
    throttle.failed("10.0.0.3")
    clock.now += 61
    throttle.failed("10.0.0.3")
    throttle.failed("10.0.0.3")
    assert throttle.wait_s("10.0.0.3") == 0, "failures older than the window are forgotten"
    for i in range(1000):
        throttle.failed(f"192.0.2.{i}")
    assert len(throttle) == 100
    sessions = Sessions(TOKEN, clock, max_sessions=10)
    values = [sessions.create() for _ in range(11)]
    assert len(sessions) == 10 and not sessions.valid(values[0]) and all(sessions.valid(v) for v in values[1:])
    other = Sessions(TOKEN, clock)
    assert not other.valid(values[5]), "a key per process (and per token): a restart ends every session"
    assert token_matches(TOKEN, TOKEN) and not token_matches(TOKEN[:-1], TOKEN) and not token_matches("", TOKEN)


def test_the_host_header_is_checked_with_or_without_a_token(served):
    assert host_allowed("127.0.0.1", False) and host_allowed("localhost", False) and host_allowed("::1", False)
    assert not host_allowed("10.0.0.5", False) and not host_allowed("evil.example", False)
    assert host_allowed("10.0.0.5", True) and host_allowed("fe80::1", True), "an IP: no rebinding possible"
    assert not host_allowed("evil.example", True)
    assert host_allowed("Console.Example.org".lower(), True, ("console.example.org",))
    make, _ = served
    s, _app = make(allowed_hosts=("console.example.org",))
    with s:
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        assert _request(s.url("/"), headers={**bearer, "Host": "attacker.example"})[0] == 421
        assert _request(s.url("/login"), {"token": TOKEN}, {"Host": "attacker.example:8765"})[0] == 421
        assert _request(s.url("/"), headers={**bearer, "Host": "console.example.org:8765"})[0] == 200
        assert _request(s.url("/"), headers={**bearer, "Host": "192.0.2.7:8765"})[0] == 200


@pytest.mark.parametrize("name", ["has space", "host:8080", "-leading", "192.0.2.1", ""])
def test_an_allowed_host_that_is_no_host_name_is_refused_at_start(name):
    with pytest.raises(ConfigError, match=r"setting 'allowed_hosts' \(flag --allowed-host\): must be a host name"):
        check_options(ServeOptions(allowed_hosts=(name,)), env={})
    assert check_options(ServeOptions(allowed_hosts=("console.example.org",)), env={}).allowed_hosts
