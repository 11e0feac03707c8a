"""Smoke test of an installed streamsemi (run by .ci/wheel_smoke.sh from a fresh venv outside the clone).

Uses only the installed package's ``streamsemi`` command (and the standard library): the embedded
broker, a worker, 300 documents of Reuters R8 with seeds, one label from the command line, a
console page and one label from the console, ``streamsemi tail``. Every wait has a generous
deadline (a busy 2-core machine); a failure prints what it waited for and the logs' tails.
"""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

DEADLINE_S = 240.0
BIN = Path(sys.executable).parent
STREAMSEMI = str(BIN / "streamsemi")
LOGS = Path(tempfile.mkdtemp(prefix="streamsemi-wheel-smoke-"))
procs: list[tuple[str, subprocess.Popen]] = []


def say(msg: str) -> None:
    print(f"wheel smoke: {msg}", flush=True)


def fail(msg: str) -> None:
    say(f"FAILED: {msg}")
    for log in sorted(LOGS.glob("*.log")):
        print(f"--- {log.name} (last 3000 characters)\n{log.read_text(errors='replace')[-3000:]}", flush=True)
    raise SystemExit(1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(name: str, *args: str, stdout: int | None = None) -> subprocess.Popen:
    log = open(LOGS / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen([STREAMSEMI, *args], stdout=stdout or log, stderr=log, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    procs.append((name, proc))
    return proc


def cli(*args: str, timeout: float = DEADLINE_S) -> str:
    out = subprocess.run([STREAMSEMI, *args], capture_output=True, text=True, timeout=timeout,
                         stdin=subprocess.DEVNULL)
    if out.returncode != 0:
        fail(f"streamsemi {' '.join(args)} exited {out.returncode}: {out.stderr[-2000:]}")
    return out.stdout


def wait_for(what: str, check, timeout: float = DEADLINE_S):  # noqa: ANN001
    t0 = time.monotonic()
    last = None
    while time.monotonic() - t0 < timeout:
        for name, p in procs:
            if p.poll() is not None:
                fail(f"{name} exited with {p.returncode} while waiting for {what}")
        try:
            last = check()
        except (OSError, ValueError) as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(0.5)
    fail(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r:.300})")


def get_json(url: str) -> dict:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as exc:  # /readyz answers 503 with its JSON until a model serves
        return json.loads(exc.read())


def main() -> None:
    here = Path.cwd().resolve()
    import streamsemi  # the installed package, not a checkout

    pkg = Path(streamsemi.__file__).resolve()
    if "site-packages" not in pkg.parts:
        fail(f"streamsemi is imported from {pkg}, not from the installed wheel")
    say(f"streamsemi {streamsemi.__version__} from {pkg.parent} (cwd {here})")

    port, metrics, console_port = free_port(), free_port(), free_port()
    broker = start("broker", "broker", "--port", str(port), stdout=subprocess.PIPE)
    line = broker.stdout.readline().decode()
    if '"broker_started"' not in line:
        fail(f"the embedded broker did not start ([broker] extra): {line!r}")
    bootstrap = json.loads(line)["bootstrap_servers"]
    say(f"broker at {bootstrap}")

    start("worker", "run", "--bootstrap-servers", bootstrap, "--metrics-port", str(metrics),
          "--algorithms", "constrained-kmeans", "--min-docs-first-refit", "100", "--first-fit-stable-seeds", "0",
          "--refit-idle-s", "2", "--session-timeout-ms", "6000", "--heartbeat-interval-ms", "1000")
    readyz = f"http://127.0.0.1:{metrics}/readyz"
    wait_for("the worker's partitions", lambda: get_json(readyz).get("partitions_assigned"))

    produced = json.loads(cli("produce", "--bootstrap-servers", bootstrap, "--corpus", "reuters-r8", "--limit", "300",
                              "--seed-fraction", "0.1").strip().splitlines()[-1])
    if produced["documents"] != 300:
        fail(f"produced {produced}")
    say(f"produced {produced['documents']} documents, {produced['seeds']} seeds")
    status = wait_for("the first model (readyz ok)", lambda: (s := get_json(readyz)).get("ok") and s)
    say(f"model v{status['model_version']} serves; window {status['window']}, seeds {status['seeds']}")

    def primary_ids() -> set[str]:
        out = cli("tail", "--bootstrap-servers", bootstrap, "--timeout", "3")
        return {m["id"] for m in map(json.loads, out.splitlines()) if m.get("primary")}

    def all_assigned() -> set[str] | None:
        got = primary_ids()
        return got if len(got) >= 300 else None

    ids = wait_for("300 documents assigned (streamsemi tail)", all_assigned)
    say(f"tail: {len(ids)} documents assigned")

    seeds_before = get_json(readyz)["seeds"]
    unlabelled = sorted(ids)[0]
    cli("label", "--bootstrap-servers", bootstrap, "--id", unlabelled, "--label", "grain")
    wait_for("the command-line label applied", lambda: get_json(readyz)["seeds"] >= seeds_before + 1)
    say(f"label {unlabelled} -> grain applied")

    console = start("console", "console", "--bootstrap-servers", bootstrap, "--port", str(console_port),
                    "--worker-url", f"http://127.0.0.1:{metrics}", stdout=subprocess.PIPE)
    started = json.loads(console.stdout.readline().decode() or "{}")
    url = started.get("url")
    if not url:
        fail("the console did not start ([console] extra)")
    jar = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))

    def page(path: str) -> str:
        with jar.open(url.rstrip("/") + path, timeout=10) as r:
            return r.read().decode()

    queue = wait_for("the console's queue page", lambda: page("/queue"))
    csrf = re.search(r'data-csrf="([^"]+)"', queue)
    if not csrf or "console.css" not in queue:
        fail("the queue page has no CSRF token or stylesheet (templates/static files missing from the wheel?)")
    with jar.open(url.rstrip("/") + "/static/console.css", timeout=10) as r:
        if r.status != 200 or not r.read():
            fail("the console's stylesheet is not served")
    seeds_before = get_json(readyz)["seeds"]
    other = sorted(ids)[1]
    form = urllib.parse.urlencode({"id": other, "label": "crude", "csrf": csrf.group(1), "next": "/queue"}).encode()
    with jar.open(urllib.request.Request(url.rstrip("/") + "/label", data=form, method="POST"), timeout=10) as r:
        final = r.geturl()
    if "err=" in final:
        fail(f"the console refused the label: {urllib.parse.unquote(final)}")
    wait_for("the console's label applied", lambda: get_json(readyz)["seeds"] >= seeds_before + 1)
    say(f"console label {other} -> crude applied")

    table = cli("tail", "--bootstrap-servers", bootstrap, "--topic", "streamsemi.suggestions", "--live",
                "--timeout", "3")
    rows = [json.loads(x) for x in table.splitlines()]
    if [r["rank"] for r in rows] != sorted(r["rank"] for r in rows):
        fail(f"tail --live piped: not in rank order: {[r['rank'] for r in rows]}")
    say(f"tail --live: {len(rows)} suggestions in rank order")
    say("OK")


if __name__ == "__main__":
    try:
        main()
    finally:
        for _name, p in reversed(procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for _name, p in reversed(procs):
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        shutil.rmtree(LOGS, ignore_errors=True)
