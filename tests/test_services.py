"""Static checks of services/ (Prometheus rules, Grafana dashboard) and deploy/.

promtool validates the scrape configuration, the rules and every alert's unit tests, and
parses every dashboard query; the dashboard, the Compose file, the Dockerfile and the
Kubernetes manifests are checked for structure and for agreeing with each other and with
the daemon (metric names from :class:`streamsemi.core.telemetry.Telemetry`, settings from
:mod:`streamsemi.service.config`). `.ci/install_prometheus.sh` installs promtool.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from streamsemi.core.telemetry import Telemetry
from streamsemi.service import config as ss_config

ROOT = Path(__file__).resolve().parents[1]
PROM_DIR = ROOT / "services" / "prometheus"
RULES_FILE = PROM_DIR / "rules" / "streamsemi.yml"
RULE_TESTS = sorted((PROM_DIR / "tests").glob("*.yml"))
DASHBOARD_FILE = ROOT / "services" / "grafana" / "dashboards" / "streamsemi.json"
GRAFANA_PROV = ROOT / "services" / "grafana" / "provisioning"
COMPOSE_FILE = ROOT / "deploy" / "docker-compose.yml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
K8S = ROOT / "deploy" / "kubernetes"
METRICS_DOC = ROOT / "docs" / "metrics.md"

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (bash .ci/install_prometheus.sh installs it)")

SETTING_NAMES = {s.name for s in ss_config.SETTINGS}
DEFAULTS = {s.name: s.default for s in ss_config.SETTINGS}
GRAFANA_BUILTINS = {"__rate_interval", "__interval", "__range", "__range_s", "__interval_ms"}
METRIC_RE = re.compile(r"\b(streamsemi_[a-z0-9_]+)")


# ----------------------------------------------------------------------------- helpers
def exposed_metrics() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Exposition name -> (type, label names) of every metric the worker registers."""
    from prometheus_client.metrics import MetricWrapperBase

    from streamsemi.service.fitter import FitProcess
    from streamsemi.service.freshness import ModelFreshness

    t = Telemetry()
    fitter = FitProcess(t.registry)  # the worker registers the fit process's metrics beside its own (not started)
    freshness = ModelFreshness(60.0, 90.0, t.registry)  # and the served model's freshness
    out: dict[str, tuple[str, tuple[str, ...]]] = {}
    for m in [*vars(t).values(), *vars(fitter).values(), *vars(freshness).values()]:
        if isinstance(m, MetricWrapperBase):
            name = m._name + ("_total" if m._type == "counter" else "")
            out[name] = (m._type, tuple(m._labelnames))
    return out


def series_names(name: str) -> set[str]:
    """Names of the samples a metric family exposes (histograms: bucket/sum/count)."""
    kind, _ = exposed_metrics()[name]
    if kind == "histogram":
        return {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return {name}


def all_series_names() -> set[str]:
    return set().union(*(series_names(n) for n in exposed_metrics()))


def load_rules() -> dict[str, Any]:
    return yaml.safe_load(RULES_FILE.read_text())


def alert_rules() -> list[dict[str, Any]]:
    return [r for g in load_rules()["groups"] for r in g["rules"] if "alert" in r]


def recorded_series() -> set[str]:
    return {r["record"] for g in load_rules()["groups"] for r in g["rules"] if "record" in r}


def load_dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD_FILE.read_text())


def dashboard_queries(dash: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every panel target."""
    return [(p["title"], t["expr"]) for p in dash["panels"] if p.get("type") != "row"
            for t in p.get("targets", [])]


def substitute_grafana_vars(expr: str, rate_interval: str = "1m") -> str:
    """Replace the dashboard's template variables the way Grafana would for 'All'."""
    expr = expr.replace("$__rate_interval", rate_interval).replace("$__interval", "15s")
    return re.sub(r"\$\{?(job|instance|algorithm)\}?", ".+", expr)


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


def documented_metrics() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Metric table of docs/metrics.md: name -> (type, labels)."""
    out = {}
    for line in METRICS_DOC.read_text().splitlines():
        m = re.match(r"\|\s*`(streamsemi_[a-z0-9_]+)`\s*\|\s*(\w+)\s*\|([^|]*)\|", line)
        if m:
            labels = tuple(re.findall(r"`([a-z_]+)`", m.group(3)))
            out[m.group(1)] = (m.group(2), labels)
    return out


def compose_config() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def _kustomize_fallback(path: Path) -> list[dict[str, Any]]:
    """Minimal kustomize stand-in (resources, components, configMapGenerator literals)."""
    kz = yaml.safe_load((path / "kustomization.yaml").read_text())
    docs: list[dict[str, Any]] = []
    for entry in kz.get("resources", []) + kz.get("components", []):
        p = (path / entry).resolve()
        docs.extend(_kustomize_fallback(p) if p.is_dir() else
                    [d for d in yaml.safe_load_all(p.read_text()) if d])
    for gen in kz.get("configMapGenerator", []):
        data = dict(lit.split("=", 1) for lit in gen.get("literals", []))
        existing = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == gen["name"]]
        if existing and gen.get("behavior") == "merge":
            existing[0]["data"].update(data)
        else:
            docs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": gen["name"]}, "data": data})
    return docs


def kustomize(path: Path) -> list[dict[str, Any]]:
    """Render a kustomization with ``kubectl kustomize`` when available."""
    kubectl = shutil.which("kubectl")
    if kubectl:
        out = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return [d for d in yaml.safe_load_all(out.stdout) if d]
    return _kustomize_fallback(path)


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


# ----------------------------------------------------------------------------- metrics doc
def test_metrics_doc_lists_every_exposed_metric_with_type_and_labels():
    exposed = exposed_metrics()
    documented = documented_metrics()
    assert set(documented) == set(exposed), (
        f"undocumented: {sorted(set(exposed) - set(documented))}, "
        f"documented but not exposed: {sorted(set(documented) - set(exposed))}")
    for name, (kind, labels) in exposed.items():
        assert documented[name] == (kind, labels), f"{name}: doc says {documented[name]}, code has {(kind, labels)}"


def test_metric_naming_conventions():
    for name, (kind, labels) in exposed_metrics().items():
        assert name.startswith("streamsemi_")
        assert (kind == "counter") == name.endswith("_total"), name
        assert kind != "summary", f"{name}: use histograms, not summaries"
        assert not {"id", "doc_id", "document", "key"} & set(labels), f"{name}: unbounded label"
        if "seconds" in name:
            assert name.endswith(("_seconds", "_timestamp_seconds")), name
    assert exposed_metrics()["streamsemi_build_info"] == ("gauge", ("version", "python"))


# ----------------------------------------------------------------------------- prometheus
@needs_promtool
def test_promtool_check_config():
    out = promtool("check", "config", str(PROM_DIR / "prometheus.yml"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 rule files found" in out.stdout + out.stderr or "SUCCESS" in out.stdout


@needs_promtool
def test_promtool_check_rules():
    out = promtool("check", "rules", str(RULES_FILE))
    assert out.returncode == 0, out.stdout + out.stderr
    n_rules = sum(len(g["rules"]) for g in load_rules()["groups"])
    assert f"SUCCESS: {n_rules} rules found" in out.stdout


@needs_promtool
@pytest.mark.parametrize("test_file", RULE_TESTS, ids=[p.stem for p in RULE_TESTS])
def test_promtool_unit_tests(test_file):
    out = promtool("test", "rules", str(test_file))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_every_alert_has_firing_and_quiet_unit_tests():
    positive: set[str] = set()
    negative: set[str] = set()
    for f in RULE_TESTS:
        spec = yaml.safe_load(f.read_text())
        assert spec["rule_files"] == ["../rules/streamsemi.yml"], f
        for case in spec["tests"]:
            for t in case.get("alert_rule_test", []):
                (positive if t.get("exp_alerts") else negative).add(t["alertname"])
    alerts = {r["alert"] for r in alert_rules()}
    assert alerts - positive == set(), f"alerts never shown firing: {sorted(alerts - positive)}"
    assert alerts - negative == set(), f"alerts never shown quiet: {sorted(alerts - negative)}"
    assert (positive | negative) <= alerts, f"tests of unknown alerts: {sorted((positive | negative) - alerts)}"


def test_every_required_alert_exists():
    alerts = {r["alert"]: r for r in alert_rules()}
    exprs = {name: r["expr"] for name, r in alerts.items()}
    required = {
        "worker down": lambda e: "up{" in e,
        "no successful refit": lambda e: "streamsemi_last_successful_refit_timestamp_seconds" in e,
        "refit failures": lambda e: 'outcome="failure"' in e,
        "lag growing": lambda e: "deriv(streamsemi_consumer_lag" in e,
        "dead letters": lambda e: "streamsemi_dead_letters_total" in e,
        "quality": lambda e: "streamsemi_model_agreement" in e or "streamsemi_seed_accuracy" in e,
        "latency burn": lambda e: "document_latency_slo_errors:ratio_rate5m" in e
        and "document_latency_slo_errors:ratio_rate1h" in e,
    }
    for what, pred in required.items():
        assert any(pred(e) for e in exprs.values()), f"no alert for {what}"
    assert {"streamsemi_model_agreement", "streamsemi_seed_accuracy"} <= {
        m for e in exprs.values() for m in METRIC_RE.findall(e)}


def test_alert_metadata_and_runbooks():
    headings = set(re.findall(r"^### (\w+)$", METRICS_DOC.read_text(), flags=re.M))
    for r in alert_rules():
        assert r["labels"]["severity"] in {"critical", "warning"}, r["alert"]
        assert {"summary", "description", "runbook"} <= set(r["annotations"]), r["alert"]
        assert r["annotations"]["runbook"] == f"docs/metrics.md#{r['alert'].lower()}", r["alert"]
        assert r["alert"] in headings, f"docs/metrics.md has no section for {r['alert']}"
        assert 'job="streamsemi"' in r["expr"] or "streamsemi:" in r["expr"], r["alert"]


def test_rules_use_only_exposed_metrics():
    known = all_series_names() | {"up"}
    for g in load_rules()["groups"]:
        for r in g["rules"]:
            for name in METRIC_RE.findall(r["expr"]):
                assert name in known, f"{r.get('alert') or r.get('record')}: unknown metric {name}"
            for name in re.findall(r"\b(streamsemi:[a-z0-9_:]+)", r["expr"]):
                assert name in recorded_series(), name


def test_latency_slo_threshold_is_a_histogram_bucket():
    from streamsemi.core.telemetry import LATENCY_BUCKETS

    bounds = set(re.findall(r'le=~"([^"]+)"', RULES_FILE.read_text()))
    assert bounds == {"2\\\\.5(0*)?"}
    assert 2.5 in LATENCY_BUCKETS


def test_scrape_config_matches_worker_and_rules():
    cfg = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())
    assert cfg["rule_files"] == ["rules/*.yml"]
    assert list(PROM_DIR.glob("rules/*.yml")) == [RULES_FILE]
    (job,) = cfg["scrape_configs"]
    assert job["job_name"] == "streamsemi"
    (target,) = job["static_configs"][0]["targets"]
    host, port = target.split(":")
    assert host in compose_config()["services"]
    assert int(port) == DEFAULTS["metrics_port"] == 9464


def test_prometheusrule_copy_is_in_sync():
    import importlib.util

    spec = importlib.util.spec_from_file_location("render", PROM_DIR / "render_prometheusrule.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    target = K8S / "components" / "monitoring" / "prometheusrule.yaml"
    assert target.read_text() == mod.render(RULES_FILE.read_text()), (
        "run: python services/prometheus/render_prometheusrule.py")
    assert yaml.safe_load(target.read_text())["spec"] == load_rules()
    with pytest.raises(ValueError, match="groups"):
        mod.render("# nothing here\n")


# ----------------------------------------------------------------------------- grafana
def test_dashboard_structure():
    dash = load_dashboard()
    assert dash["uid"] == "streamsemi-worker" and dash["title"]
    assert dash["schemaVersion"] >= 36
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    cells: dict[tuple[int, int], str] = {}
    for p in dash["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = p["title"]
        if p["type"] == "row":
            continue
        assert p["type"] in {"timeseries", "stat"}, p["type"]
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p.get("description"), f"{p['title']} has no description"
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["expr"].strip() and t["datasource"]["uid"] == "${datasource}"
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert variables == {"datasource", "job", "instance", "algorithm"}
    used = set(re.findall(r"\$\{?(\w+)", json.dumps(dash)))
    assert used <= variables | GRAFANA_BUILTINS, f"undefined variables: {used - variables - GRAFANA_BUILTINS}"


def test_dashboard_has_every_required_panel():
    text = "\n".join(e for _, e in dashboard_queries(load_dashboard()))
    required = {
        "throughput": "rate(streamsemi_documents_consumed_total",
        "latency p50": "histogram_quantile(0.5, sum by (le) (rate(streamsemi_document_latency_seconds_bucket",
        "latency p95": "histogram_quantile(0.95, sum by (le) (rate(streamsemi_document_latency_seconds_bucket",
        "latency p99": "histogram_quantile(0.99, sum by (le) (rate(streamsemi_document_latency_seconds_bucket",
        "lag": "streamsemi_consumer_lag{",
        "lag seconds": "streamsemi_consumer_lag_seconds{",
        "refit durations by algorithm": "sum by (le, algorithm) (rate(streamsemi_refit_duration_seconds_bucket",
        "window size": "streamsemi_window_documents{",
        "seeds by class": "sum by (class) (streamsemi_seed_documents",
        "assignments by class": "sum by (class) (rate(streamsemi_assignments_total",
        "new clusters": "streamsemi_new_clusters{",
        "dead letters": "sum by (reason) (rate(streamsemi_dead_letters_total",
        "quality (agreement)": "streamsemi_model_agreement{",
        "quality (seed accuracy)": "streamsemi_seed_accuracy{",
        "fit process deaths": "increase(streamsemi_fit_process_deaths_total{",
        "producer process deaths": "increase(streamsemi_producer_process_deaths_total{",
    }
    missing = [k for k, needle in required.items() if needle not in text]
    assert not missing, f"dashboard lacks: {missing}"


def test_dashboard_uses_only_known_series():
    known = all_series_names() | recorded_series()
    for title, expr in dashboard_queries(load_dashboard()):
        for name in METRIC_RE.findall(expr) + re.findall(r"\b(streamsemi:[a-z0-9_:]+)", expr):
            assert name in known, f"{title}: unknown series {name}"


@needs_promtool
def test_dashboard_queries_parse(tmp_path):
    """promtool parses every query (as recording rules) after variable substitution."""
    queries = dashboard_queries(load_dashboard())
    queries += [(v["name"], "count(" + v["definition"].replace("label_values(", "").rsplit(",", 1)[0] + ")")
                for v in load_dashboard()["templating"]["list"] if v["type"] == "query"]
    queries += [(a["name"], a["expr"]) for a in load_dashboard()["annotations"]["list"] if "expr" in a]
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": substitute_grafana_vars(expr)} for i, (_, expr) in enumerate(queries)]}]}
    f = tmp_path / "dashboard_queries.yml"
    f.write_text(yaml.safe_dump(rules))
    out = promtool("check", "rules", str(f))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(queries)} rules found" in out.stdout


def test_grafana_provisioning_matches_compose():
    ds = yaml.safe_load((GRAFANA_PROV / "datasources" / "prometheus.yml").read_text())
    (source,) = ds["datasources"]
    assert source["type"] == "prometheus" and source["isDefault"] is True
    prov = yaml.safe_load((GRAFANA_PROV / "dashboards" / "streamsemi.yml").read_text())
    (provider,) = prov["providers"]
    assert provider["type"] == "file"
    services = compose_config()["services"]
    assert source["url"] == "http://prometheus:9090" and "prometheus" in services
    mounts = dict(v.rsplit(":", 1)[0].split(":", 1)[::-1] for v in services["grafana"]["volumes"]
                  if v.startswith(".."))
    assert mounts[provider["options"]["path"]] == "../services/grafana/dashboards"
    assert mounts["/etc/grafana/provisioning"] == "../services/grafana/provisioning"
    home = services["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{provider['options']['path']}/{DASHBOARD_FILE.name}"


# ----------------------------------------------------------------------------- compose
def _compose_cli() -> list[str] | None:
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    if shutil.which("docker-compose"):
        return [shutil.which("docker-compose")]
    return None


def test_docker_compose_config_validates():
    cli = _compose_cli()
    if cli is None:
        pytest.skip("neither `docker compose` nor `docker-compose` is installed")
    out = subprocess.run([*cli, "-f", str(COMPOSE_FILE), "--profile", "demo", "config", "-q"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    out = subprocess.run([*cli, "-f", str(COMPOSE_FILE), "--profile", "demo", "config", "--services"],
                         capture_output=True, text=True, timeout=60)
    assert set(out.stdout.split()) == {"kafka", "worker", "producer", "prometheus", "grafana"}


def test_compose_structure():
    services = compose_config()["services"]
    kafka = services["kafka"]
    assert kafka["image"].startswith("apache/kafka:")
    env = kafka["environment"]
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}, "KRaft combined node"
    assert not any("ZOOKEEPER" in k for k in env)
    assert "healthcheck" in kafka
    worker = services["worker"]
    assert (COMPOSE_FILE.parent / worker["build"]["context"] / worker["build"]["dockerfile"]).resolve() == DOCKERFILE
    for name in ("worker", "producer"):
        for key in services[name]["environment"]:
            if key.startswith("STREAMSEMI_"):
                assert key[len("STREAMSEMI_"):].lower() in SETTING_NAMES, f"{name}: {key} is not a setting"
    bootstrap = worker["environment"]["STREAMSEMI_BOOTSTRAP_SERVERS"]
    assert f"PLAINTEXT://{bootstrap}" in env["KAFKA_ADVERTISED_LISTENERS"].split(",")
    assert worker["depends_on"]["kafka"]["condition"] == "service_healthy"
    port = worker["environment"]["STREAMSEMI_METRICS_PORT"]
    assert f"{port}:{port}" in worker["ports"]
    assert worker["environment"]["STREAMSEMI_METRICS_HOST"] == "0.0.0.0"
    for name, svc in services.items():
        for vol in svc.get("volumes", []):
            src = vol.split(":", 1)[0]
            if src.startswith("."):
                assert (COMPOSE_FILE.parent / src).exists(), f"{name}: missing {src}"
    assert "../services/prometheus:/etc/prometheus:ro" in services["prometheus"]["volumes"]
    assert services["producer"]["profiles"] == ["demo"]


# ----------------------------------------------------------------------------- Dockerfile
def dockerfile_instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            out.append((op.upper(), rest.strip()))
    return out


def test_dockerfile():
    ins = dockerfile_instructions()
    froms = [a for op, a in ins if op == "FROM"]
    assert froms and all(re.match(r"python:\$\{PYTHON_VERSION\}-slim", f) for f in froms)
    final_stage = ins[max(i for i, (op, _) in enumerate(ins) if op == "FROM"):]
    users = [a for op, a in final_stage if op == "USER"]
    assert users and users[-1].split(":")[0] not in {"0", "root"}
    (health,) = [a for op, a in final_stage if op == "HEALTHCHECK"]
    assert "/healthz" in health and "STREAMSEMI_METRICS_PORT" in health
    assert ("EXPOSE", str(DEFAULTS["metrics_port"])) in final_stage
    run = " ".join(a for op, a in ins if op == "RUN")
    assert "pip install ." in run and "import crc32c" in run
    assert "crc32c" in (ROOT / "pyproject.toml").read_text()
    entry = [a for op, a in final_stage if op == "ENTRYPOINT"]
    assert json.loads(entry[0]) == ["streamsemi"]
    for op, a in final_stage:
        if op == "ENV":
            for key in re.findall(r"\b(STREAMSEMI_[A-Z_]+)=", a):
                assert key[len("STREAMSEMI_"):].lower() in SETTING_NAMES, key
    ignore = (DOCKERFILE.parent / "Dockerfile.dockerignore").read_text().split()
    for op, a in ins:
        if op == "COPY" and not a.startswith("--from"):
            for src in shlex.split(a)[:-1]:
                assert (ROOT / src).exists(), f"COPY source {src} missing from the repository"
                assert f"!{src.rstrip('/')}" in [i.rstrip("/") for i in ignore], f"{src} excluded by .dockerignore"


# ----------------------------------------------------------------------------- kubernetes
def test_all_deploy_yaml_parses():
    files = sorted(ROOT.joinpath("deploy").rglob("*.yaml")) + sorted(ROOT.joinpath("deploy").rglob("*.yml"))
    assert len(files) >= 10
    for f in files:
        docs = [d for d in yaml.safe_load_all(f.read_text()) if d is not None]
        assert docs, f


@pytest.fixture(scope="module")
def overlay_docs() -> list[dict[str, Any]]:
    return kustomize(K8S / "overlays" / "example")


@pytest.fixture(scope="module")
def base_docs() -> list[dict[str, Any]]:
    return kustomize(K8S / "base")


def test_kubernetes_schemas(base_docs, overlay_docs):
    kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate for schema checks")
    checked = 0
    for doc in base_docs + overlay_docs:
        try:
            kv.validate(doc, "1.30.0", strict=True)
            checked += 1
        except kv.SchemaNotFoundError:
            assert doc["apiVersion"].split("/")[0] in {"monitoring.coreos.com", "keda.sh"}, doc["kind"]
    assert checked >= 11


def test_base_has_no_crds(base_docs):
    kinds = sorted(d["kind"] for d in base_docs)
    assert kinds == ["ConfigMap", "PodDisruptionBudget", "Service", "ServiceAccount", "StatefulSet"]


def test_kubernetes_worker_spec(overlay_docs):
    kinds = {d["kind"] for d in overlay_docs}
    assert kinds == {"Namespace", "ServiceAccount", "ConfigMap", "Service", "StatefulSet",
                     "PodDisruptionBudget", "ServiceMonitor", "PrometheusRule", "ScaledObject"}
    settings = by_kind(overlay_docs, "ConfigMap")["data"]
    for key in settings:
        assert key.startswith("STREAMSEMI_") and key[len("STREAMSEMI_"):].lower() in SETTING_NAMES, key
    sts = by_kind(overlay_docs, "StatefulSet")
    pod = sts["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["envFrom"][0]["configMapRef"]["name"] == by_kind(overlay_docs, "ConfigMap")["metadata"]["name"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["metrics"] == int(settings["STREAMSEMI_METRICS_PORT"])
    assert settings["STREAMSEMI_METRICS_HOST"] == "0.0.0.0"
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    startup = c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"]
    assert startup >= 120, "start-up (imports, JIT, checkpoint) needs minutes"
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(c["resources"][kind])
    grace = pod["terminationGracePeriodSeconds"]
    shutdown = float(settings["STREAMSEMI_SHUTDOWN_GRACE_S"])
    assert grace >= shutdown + 60, "grace must cover shutdown_grace_s plus an in-flight refit"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert settings["STREAMSEMI_STATE_DIR"].startswith("/var/lib/streamsemi/") and "/var/lib/streamsemi" in mounts
    assert "/tmp" in mounts
    assert c["image"] == "registry.example.com/streamsemi:0.1.0"


def test_kubernetes_selectors_and_monitoring(overlay_docs):
    sts = by_kind(overlay_docs, "StatefulSet")
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    svc = by_kind(overlay_docs, "Service")
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert svc["spec"]["publishNotReadyAddresses"] is True, "scrape workers that are not ready yet"
    assert sts["spec"]["serviceName"] == svc["metadata"]["name"] and svc["spec"]["clusterIP"] == "None"
    (port,) = svc["spec"]["ports"]
    assert port["name"] == "metrics" and port["targetPort"] == "metrics"
    pdb = by_kind(overlay_docs, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pdb["spec"]["maxUnavailable"] == 1
    sm = by_kind(overlay_docs, "ServiceMonitor")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert [e["port"] for e in sm["spec"]["endpoints"]] == ["metrics"]
    assert svc["metadata"]["labels"][sm["spec"]["jobLabel"]] == "streamsemi", "alerts select job=streamsemi"
    rule = by_kind(overlay_docs, "PrometheusRule")
    assert rule["spec"] == load_rules()
    assert rule["metadata"]["labels"]["release"] == sm["metadata"]["labels"]["release"]


def test_keda_scaledobject(overlay_docs):
    so = by_kind(overlay_docs, "ScaledObject")
    sts = by_kind(overlay_docs, "StatefulSet")
    settings = by_kind(overlay_docs, "ConfigMap")["data"]
    ref = so["spec"]["scaleTargetRef"]
    assert (ref["kind"], ref["name"]) == ("StatefulSet", sts["metadata"]["name"])
    (trigger,) = so["spec"]["triggers"]
    assert trigger["type"] == "kafka"
    md = trigger["metadata"]
    assert md["bootstrapServers"] == settings["STREAMSEMI_BOOTSTRAP_SERVERS"]
    assert md["consumerGroup"] == settings["STREAMSEMI_GROUP_ID"] == DEFAULTS["group_id"]
    assert md["topic"] == settings["STREAMSEMI_DOCUMENTS_TOPIC"] == DEFAULTS["documents_topic"]
    assert int(md["lagThreshold"]) > 0
    assert 1 <= so["spec"]["minReplicaCount"] <= so["spec"]["maxReplicaCount"] <= DEFAULTS["topic_partitions"]


def test_kustomize_fallback_agrees_with_kubectl():
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl not installed: the fallback renderer is the only one")
    rendered = kustomize(K8S / "overlays" / "example")
    fallback = _kustomize_fallback(K8S / "overlays" / "example")
    assert sorted(d["kind"] for d in rendered) == sorted(d["kind"] for d in fallback)
