"""A real Prometheus scraping a real worker while a corpus streams through.

Starts the embedded broker, a worker (`streamsemi run`), the Debian Prometheus server
(1 s scrape and rule evaluation, the repository's scrape job and rule file), streams
800 Reuters-R8 documents with 5 % seed labels plus a few malformed messages, then asks
Prometheus' HTTP API to evaluate every dashboard query and every rule. Skipped only when
the `prometheus` binary is missing (`bash .ci/install_prometheus.sh` installs it).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from kafka_utils import DEADLINE, listen_port, wait_for

ROOT = Path(__file__).resolve().parents[1]
PROM_CONFIG = ROOT / "services" / "prometheus" / "prometheus.yml"
RULES_FILE = ROOT / "services" / "prometheus" / "rules" / "streamsemi.yml"
DASHBOARD_FILE = ROOT / "services" / "grafana" / "dashboards" / "streamsemi.json"
METRICS_DOC = ROOT / "docs" / "metrics.md"
PROMETHEUS = shutil.which("prometheus")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(PROMETHEUS is None,
                       reason="prometheus binary not installed: run `bash .ci/install_prometheus.sh`"),
]

N_DOCS = 800
RATE = 60  # documents per second: the stream lasts ~13 s, many 1 s scrapes
BAD_MESSAGES = {  # value -> dead-letter reason
    b"this is not json": "invalid_json",
    b'{"id": "bad-1"}': "missing_field",
    b'{"id": "bad-2", "text": ""}': "empty_text",
    b"\xff\xfe\xfa": "invalid_utf8",
}
# Panels that must show data after the stream (title -> minimum number of series).
MAIN_PANELS = {
    "Workers up": 1,
    "Documents / s": 1,
    "Throughput": 2,
    "Document latency p50 / p95 / p99": 3,
    "Consumer lag (messages)": 1,
    "Refit duration by algorithm (p50 / p95)": 3,
    "Refits by outcome": 1,
    "Model version and refit in progress": 2,
    "Window size": 3,
    "Seed documents by class": 2,
    "Assignments by class": 2,
    "New clusters": 1,
    "Agreement between consecutive models": 1,
    "Seed accuracy (prequential)": 1,
    "Dead letters by reason": len(set(BAD_MESSAGES.values())),
    "Latency SLO error budget burn rate": 1,
}


# ----------------------------------------------------------------------------- helpers
def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


class PromAPI:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}/api/v1"

    def call(self, path: str, **params: Any) -> dict[str, Any]:
        url = f"{self.base}/{path}?{urllib.parse.urlencode(params)}"
        code, body = http_get(url, timeout=10)
        data = json.loads(body)
        assert code in (200, 400, 422), f"{url}: HTTP {code} {body[:300]!r}"
        return data

    def query(self, expr: str, at: float | None = None) -> dict[str, Any]:
        return self.call("query", query=expr, **({"time": at} if at else {}))

    def query_range(self, expr: str, start: float, end: float, step: float = 2) -> dict[str, Any]:
        return self.call("query_range", query=expr, start=start, end=end, step=step)

    def values(self, expr: str) -> list[float]:
        res = self.query(expr)
        assert res["status"] == "success", res
        return [float(s["value"][1]) for s in res["data"]["result"]]


def substitute_grafana_vars(expr: str, rate_interval: str) -> str:
    expr = expr.replace("$__rate_interval", rate_interval).replace("$__interval", "2s")
    return re.sub(r"\$\{?(job|instance|algorithm)\}?", ".+", expr)


def finite_series(result: dict[str, Any]) -> int:
    """Number of series with at least one finite value (matrix or vector result)."""
    n = 0
    for s in result["data"]["result"]:
        vals = s.get("values") or [s["value"]]
        if any(math.isfinite(float(v)) for _, v in vals):
            n += 1
    return n


def documented_types() -> dict[str, str]:
    out = {}
    for line in METRICS_DOC.read_text().splitlines():
        m = re.match(r"\|\s*`(streamsemi_[a-z0-9_]+)`\s*\|\s*(\w+)\s*\|", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


# ----------------------------------------------------------------------------- the stack
class Stack:
    """Broker, worker and Prometheus processes plus what the scenario observed."""

    def __init__(self, workdir: Path) -> None:
        self.dir = workdir
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, Path] = {}
        self.env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        # below the ephemeral range: a port picked there can be taken by an outgoing connection before the bind
        self.broker_port, self.metrics_port, self.prom_port = listen_port(), listen_port(), listen_port()
        while len({self.broker_port, self.metrics_port, self.prom_port}) < 3:
            self.prom_port = listen_port()
        self.bootstrap = f"127.0.0.1:{self.broker_port}"
        self.api = PromAPI(self.prom_port)
        self._stop_probe = threading.Event()

    def start(self, name: str, argv: list[str]) -> subprocess.Popen:
        self.logs[name] = self.dir / f"{name}.log"
        fh = open(self.logs[name], "wb")  # noqa: SIM115 - closed with the process
        p = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=self.env, cwd=self.dir)
        fh.close()
        self.procs[name] = p
        return p

    def all_logs(self) -> list[Path]:
        return list(self.logs.values())

    def prometheus_config(self) -> Path:
        cfg = yaml.safe_load(PROM_CONFIG.read_text())
        cfg["global"].update(scrape_interval="1s", scrape_timeout="1s", evaluation_interval="1s")
        cfg["rule_files"] = [str(RULES_FILE)]
        (job,) = cfg["scrape_configs"]
        job["static_configs"][0]["targets"] = [f"127.0.0.1:{self.metrics_port}"]
        path = self.dir / "prometheus.yml"
        path.write_text(yaml.safe_dump(cfg))
        return path

    def probe_readiness(self) -> None:
        """Call /readyz every 2 s, as a kubelet readiness probe would."""
        while not self._stop_probe.wait(2.0):
            try:
                http_get(f"http://127.0.0.1:{self.metrics_port}/readyz", timeout=2)
            except OSError:
                pass

    def stop_all(self) -> None:
        self._stop_probe.set()
        for p in reversed(list(self.procs.values())):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)


def send_bad_messages(bootstrap: str, topic: str) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        for value in BAD_MESSAGES:
            producer.send(topic, value=value)
        producer.flush(timeout=20)
    finally:
        producer.close(timeout=5)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = Stack(tmp_path_factory.mktemp("prom_integration"))
    py = [sys.executable, "-m", "streamsemi"]
    try:
        s.start("broker", [*py, "broker", "--port", str(s.broker_port)])
        wait_for(lambda: port_open(s.broker_port), DEADLINE, "the broker port", logs=s.all_logs())
        s.start("worker", [*py, "run", "--bootstrap-servers", s.bootstrap, "--metrics-host", "127.0.0.1",
                           "--metrics-port", str(s.metrics_port), "--algorithms", "constrained-kmeans",
                           "--refit-every-docs", "200",
                           # a short stream (800 documents, 42 seeds): first fit early, so that several refits
                           # (model agreement needs two) happen while it runs
                           "--min-seed-classes", "2", "--min-seeds-per-class", "1", "--first-fit-stable-seeds", "0"])
        s.start("prometheus", [PROMETHEUS, f"--config.file={s.prometheus_config()}",
                               f"--storage.tsdb.path={s.dir / 'tsdb'}",
                               f"--web.listen-address=127.0.0.1:{s.prom_port}", "--log.level=warn"])
        wait_for(lambda: http_get(f"http://127.0.0.1:{s.metrics_port}/healthz")[0] == 200, DEADLINE,
                 "worker /healthz", logs=s.all_logs())
        wait_for(lambda: http_get(f"http://127.0.0.1:{s.prom_port}/-/ready")[0] == 200, DEADLINE,
                 "Prometheus /-/ready", logs=s.all_logs())
        threading.Thread(target=s.probe_readiness, daemon=True).start()
        wait_for(lambda: s.api.values('up{job="streamsemi"}') == [1.0], DEADLINE, "a first successful scrape",
                 logs=s.all_logs())

        s.t_start = time.time()
        # two halves: the second starts once a model serves, so that its seeds are judged prequentially
        # however long the first fit takes on a loaded machine (a 12 s first fit once outlasted a 13 s stream)
        half = N_DOCS // 2
        for part, skip in (("produce", 0), ("produce2", half)):
            s.start(part, [*py, "produce", "--bootstrap-servers", s.bootstrap, "--corpus", "reuters-r8",
                           "--skip", str(skip), "--limit", str(half), "--rate", str(RATE), "--seed-fraction", "0.05"])
            if skip == 0:
                send_bad_messages(s.bootstrap, "streamsemi.documents")
            rc = s.procs[part].wait(timeout=DEADLINE)
            assert rc == 0, s.logs[part].read_text()[-3000:]
            if skip == 0:
                wait_for(lambda: max(s.api.values('streamsemi_model_version{job="streamsemi"}'), default=0.0) >= 1,
                         DEADLINE, "a first model", logs=s.all_logs())
        total = N_DOCS + len(BAD_MESSAGES)
        wait_for(lambda: s.api.values('streamsemi_documents_consumed_total{job="streamsemi"}') == [float(total)],
                 DEADLINE, f"Prometheus to see {total} consumed documents", logs=s.all_logs())
        wait_for(lambda: s.api.values('streamsemi_model_agreement{job="streamsemi"}')
                 and s.api.values('streamsemi_seed_accuracy{job="streamsemi"}')
                 and s.api.values('streamsemi_ready{job="streamsemi"}') == [1.0],
                 DEADLINE, "quality signals and readiness", logs=s.all_logs())
        # a few more scrapes with everything in place: Prometheus' own timestamp of its last scrape, not a sleep
        in_place = time.time()
        wait_for(lambda: min(s.api.values('timestamp(up{job="streamsemi"})'), default=0.0) >= in_place + 3,
                 DEADLINE, "three more scrapes", logs=s.all_logs())
        s.t_end = time.time()
        code, body = http_get(f"http://127.0.0.1:{s.metrics_port}/metrics")
        assert code == 200
        s.exposition = body.decode()
        yield s
    finally:
        s.stop_all()


# ----------------------------------------------------------------------------- tests
def test_worker_exposes_every_documented_metric(stack):
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", stack.exposition, flags=re.M))
    documented = documented_types()
    assert documented, "docs/metrics.md has no metric table"
    for name, kind in documented.items():
        assert types.get(name) == kind, f"{name}: documented as {kind}, /metrics says {types.get(name)}"
    ours = {n for n in types if n.startswith("streamsemi_") and not n.endswith("_created")}
    assert ours == set(documented), f"exposed but undocumented: {sorted(ours - set(documented))}"
    assert re.search(r'^streamsemi_build_info\{python="[\d.]+",version="[^"]+"\} 1\.0$', stack.exposition, re.M)


def test_every_dashboard_query_evaluates_and_main_panels_have_data(stack):
    dash = json.loads(DASHBOARD_FILE.read_text())
    seen_main = set()
    for panel in dash["panels"]:
        if panel["type"] == "row":
            continue
        n_series = 0
        for target in panel["targets"]:
            expr = substitute_grafana_vars(target["expr"], "20s")
            inst = stack.api.query(expr, at=stack.t_end)
            assert inst["status"] == "success", f"{panel['title']}: {expr}\n{inst}"
            rng = stack.api.query_range(expr, stack.t_start, stack.t_end, step=2)
            assert rng["status"] == "success", f"{panel['title']}: {expr}\n{rng}"
            n_series += finite_series(rng)
        if panel["title"] in MAIN_PANELS:
            seen_main.add(panel["title"])
            assert n_series >= MAIN_PANELS[panel["title"]], (
                f"panel {panel['title']!r} shows {n_series} series with data, expected >= "
                f"{MAIN_PANELS[panel['title']]}")
    assert seen_main == set(MAIN_PANELS)
    for var in dash["templating"]["list"]:
        if var["type"] != "query":
            continue
        metric, label = re.match(r"label_values\((.*),\s*(\w+)\)$", var["definition"]).groups()
        res = stack.api.call("label/" + label + "/values",
                             **{"match[]": substitute_grafana_vars(metric, "20s")})
        assert res["status"] == "success" and res["data"], f"variable {var['name']} has no values"


def test_dashboard_shows_the_stream(stack):
    api, end = stack.api, stack.t_end
    reasons = {s["metric"]["reason"] for s in api.query(
        'sum by (reason) (streamsemi_dead_letters_total{job="streamsemi"})', at=end)["data"]["result"]}
    assert reasons == set(BAD_MESSAGES.values())
    classes = api.query('sum by (class) (streamsemi_assignments_total{job="streamsemi"})', at=end)
    assert sum(float(s["value"][1]) for s in classes["data"]["result"]) == N_DOCS
    (agree,) = api.values('streamsemi_model_agreement{job="streamsemi"}')
    (acc,) = api.values('streamsemi_seed_accuracy{job="streamsemi"}')
    assert 0.0 <= agree <= 1.0 and 0.0 <= acc <= 1.0
    peak = api.query_range('sum(rate(streamsemi_documents_consumed_total{job="streamsemi"}[5s]))',
                           stack.t_start, end, step=1)
    rates = [float(v) for _, v in peak["data"]["result"][0]["values"]]
    # how fast the stream went is the machine's speed (a measurement, benchmarks/): the panel must show it flow
    assert max(rates) > 0, f"throughput panel never saw the stream: {max(rates)}"


def test_every_rule_evaluates_without_error(stack):
    groups = yaml.safe_load(RULES_FILE.read_text())["groups"]
    for g in groups:
        for rule in g["rules"]:
            res = stack.api.query(rule["expr"], at=stack.t_end)
            assert res["status"] == "success", f"{rule.get('alert') or rule.get('record')}: {res}"

    def all_evaluated() -> list[dict[str, Any]]:
        loaded = [r for g in stack.api.call("rules")["data"]["groups"] for r in g["rules"]]
        return loaded if all(not r["lastEvaluation"].startswith("0001") for r in loaded) else []

    loaded = wait_for(all_evaluated, DEADLINE, "every rule to be evaluated")
    assert len(loaded) == sum(len(g["rules"]) for g in groups)
    bad = [(r["name"], r.get("lastError")) for r in loaded if r["health"] != "ok"]
    assert not bad, bad
    (ratio,) = stack.api.values('streamsemi:document_latency_slo_errors:ratio_rate5m{job="streamsemi"}')
    assert 0.0 <= ratio <= 1.0


def test_no_alert_fires_on_a_healthy_worker(stack):
    alerts = stack.api.call("alerts")["data"]["alerts"]
    firing = [(a["labels"]["alertname"], a["labels"].get("instance")) for a in alerts if a["state"] == "firing"]
    assert not firing, firing


def test_worker_down_alert_after_sigterm(stack):
    """Last: a graceful stop exits 0, and Prometheus turns the target down and the alert pending."""
    worker = stack.procs["worker"]
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=DEADLINE) == 0, stack.logs["worker"].read_text()[-3000:]
    wait_for(lambda: stack.api.values('up{job="streamsemi"}') == [0.0], DEADLINE, "up == 0")

    def pending() -> bool:
        return any(a["labels"]["alertname"] == "StreamsemiWorkerDown" and a["state"] == "pending"
                   for a in stack.api.call("alerts")["data"]["alerts"])

    wait_for(pending, DEADLINE, "StreamsemiWorkerDown to be pending")
