"""Settings: precedence, one source of defaults, and every invalid setting refused at start
with a message that names the setting, the value it got and why."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from streamsemi.core.errors import BrokerError, ConfigError, StreamsemiError
from streamsemi.engine import EngineConfig
from streamsemi.service import config as ss_config
from streamsemi.service.config import ENGINE_DEFAULTS, ENV_NOT_SETTINGS, SETTINGS, resolve

PACKAGE = Path(__file__).resolve().parents[1] / "streamsemi"


def refused(flags=None, env=None, config_file=None) -> str:
    """The message of the ConfigError that ``resolve`` raises."""
    with pytest.raises(ConfigError) as exc:
        resolve(flags or {}, env={} if env is None else env, config_file=config_file)
    return str(exc.value)


def test_precedence_flags_over_env_over_toml_over_defaults(tmp_path):
    cfg = tmp_path / "s.toml"
    cfg.write_text('window_max_docs = 111\nrefit_every_docs = 222\nlog_level = "DEBUG"\n'
                   'algorithms = "constrained-kmeans,seeded-kmeans"\n'
                   '[algorithm_params.seeded-kmeans]\nmax_iter = 7\n')
    env = {"STREAMSEMI_REFIT_EVERY_DOCS": "333", "STREAMSEMI_LOG_LEVEL": "WARNING"}
    s = resolve({"log_level": "ERROR"}, env=env, config_file=cfg)
    assert s.window_max_docs == 111 and s.sources["window_max_docs"].startswith("config file")
    assert s.refit_every_docs == 333 and s.sources["refit_every_docs"] == "environment STREAMSEMI_REFIT_EVERY_DOCS"
    assert s.log_level == "ERROR" and s.sources["log_level"] == "flag --log-level"
    assert s.max_seed_docs == 20000 and s.sources["max_seed_docs"] == "default"
    assert s.algorithm_list == ["constrained-kmeans", "seeded-kmeans"] and s.primary_algorithm == "constrained-kmeans"
    assert s.algorithm_params == {"seeded-kmeans": {"max_iter": 7}}


def test_a_streamsemi_table_holds_the_settings(tmp_path):
    cfg = tmp_path / "s.toml"
    cfg.write_text('[streamsemi]\nwindow_max_docs = 123\n[streamsemi.algorithm_params.constrained-kmeans]\nmax_iter = 9\n')
    s = resolve({}, env={}, config_file=cfg)
    assert s.window_max_docs == 123 and s.algorithm_params == {"constrained-kmeans": {"max_iter": 9}}


# ------------------------------------------------------------------ one source of defaults
def test_engine_defaults_come_from_engine_config():
    """Every EngineConfig field is a setting (or explicitly engine-only) with the same default."""
    by_name = {s.name: s for s in SETTINGS}
    engine_fields = {f.name for f in dataclasses.fields(EngineConfig)}
    assert set(ENGINE_DEFAULTS) == engine_fields - ss_config.ENGINE_ONLY_FIELDS
    for name, default in ENGINE_DEFAULTS.items():
        assert by_name[name].default == default, name
    # and the round trip: the engine a worker builds from default settings is EngineConfig()
    built = EngineConfig.from_settings(resolve({}, env={}))
    assert dataclasses.asdict(built) == dataclasses.asdict(EngineConfig())
    # a non-default value goes through too (the test is not comparing two constants)
    assert EngineConfig.from_settings(resolve({"window_max_age_s": "60", "primary": ""}, env={})).window_max_age_s == 60.0


# ------------------------------------------------------------------ values: types and ranges
@pytest.mark.parametrize(("flags", "env", "message"), [
    ({"window_max_docs": "0"}, {}, "setting 'window_max_docs' (from flag --window-max-docs): must be > 0, got 0"),
    ({"window_max_docs": "many"}, {}, "setting 'window_max_docs' (from flag --window-max-docs): must be an integer, got 'many'"),
    ({"checkpoint_interval_s": "nan"}, {}, "setting 'checkpoint_interval_s' (from flag --checkpoint-interval-s): must be a finite number, got 'nan'"),
    ({}, {"STREAMSEMI_METRICS_PORT": "70000"},
     "setting 'metrics_port' (from environment STREAMSEMI_METRICS_PORT): must be a TCP port 1..65535 (or 0 for any free port), got 70000"),
    ({"metrics_port": "99999"}, {}, "setting 'metrics_port' (from flag --metrics-port): must be a TCP port 1..65535 (or 0 for any free port), got 99999"),
    ({"metrics_port": "-1"}, {}, "setting 'metrics_port' (from flag --metrics-port): must be a TCP port"),
    ({"bootstrap_servers": "localhost"}, {}, "setting 'bootstrap_servers' (from flag --bootstrap-servers): must be HOST:PORT[,HOST:PORT...] with ports 1..65535, got 'localhost'"),
    ({"bootstrap_servers": "kafka:99999"}, {}, "setting 'bootstrap_servers' (from flag --bootstrap-servers): must be HOST:PORT[,HOST:PORT...] with ports 1..65535, got 'kafka:99999'"),
    ({"bootstrap_servers": "kafka:0"}, {}, "with ports 1..65535, got 'kafka:0'"),
    ({"bootstrap_servers": "a:9092,not a host:9092"}, {}, "setting 'bootstrap_servers' (from flag --bootstrap-servers): must be an IP address or a host name"),
    ({"bootstrap_servers": "::1:9092"}, {}, "must write an IPv6 address in brackets"),
    ({"algorithms": "constrained-kmeans,nope"}, {}, "setting 'algorithms' (from flag --algorithms): unknown algorithm 'nope'"),
    ({"algorithms": ""}, {}, "setting 'algorithms' (from flag --algorithms): must name at least one algorithm, got ''"),
    ({"algorithms": "cle,cle"}, {}, "setting 'algorithms' (from flag --algorithms): must list each algorithm once, got 'cle' twice"),
    ({"primary": "cle"}, {}, "setting 'primary' (from flag --primary): 'cle' is not among the enabled algorithms"),
    ({"log_level": "LOUD"}, {}, "setting 'log_level' (from flag --log-level): must be one of 'DEBUG', 'INFO', 'WARNING', 'ERROR', got 'LOUD'"),
    ({"drift_detection": "maybe"}, {}, "setting 'drift_detection' (from flag --drift-detection): must be a boolean, got 'maybe'"),
    ({"random_state": str(2**32)}, {}, "setting 'random_state' (from flag --random-state): must be in 0..4294967295, got 4294967296"),
    ({"group_id": " "}, {}, "setting 'group_id' (from flag --group-id): must not be empty, got ' '"),
    ({"fetch_max_wait_ms": "0"}, {}, "setting 'fetch_max_wait_ms' (from flag --fetch-max-wait-ms): must be in 1..10000, got 0"),
    ({"producer_nice": "20"}, {}, "setting 'producer_nice' (from flag --producer-nice): must be in 0..19, got 20"),
    ({"fit_priority": "high"}, {}, "setting 'fit_priority' (from flag --fit-priority): must be one of 'adaptive', 'idle', 'low', 'normal', got 'high'"),
])
def test_invalid_settings_name_the_setting_and_reason(flags, env, message):
    assert message in refused(flags, env)


def test_ipv6_and_several_bootstrap_servers_are_accepted():
    s = resolve({"bootstrap_servers": "[::1]:9092,kafka-0.kafka.svc:9093,my_broker:19092", "metrics_port": "0"}, env={})
    assert s.bootstrap_servers.startswith("[::1]") and s.metrics_port == 0


# ------------------------------------------------------------------ topics
@pytest.mark.parametrize(("flags", "message"), [
    ({"documents_topic": ""}, "setting 'documents_topic' (from flag --documents-topic): must be a Kafka topic name: 1..249 characters of a-z A-Z 0-9 . _ -, got ''"),
    ({"control_topic": "my topic"}, "setting 'control_topic' (from flag --control-topic): must be a Kafka topic name"),
    ({"assignments_topic": "out/put"}, "setting 'assignments_topic' (from flag --assignments-topic): must be a Kafka topic name"),
    ({"deadletter_topic": "x" * 250}, "setting 'deadletter_topic' (from flag --deadletter-topic): must be a Kafka topic name: 1..249"),
    ({"documents_topic": "."}, "setting 'documents_topic' (from flag --documents-topic): must be a Kafka topic name other than '.' and '..', got '.'"),
    ({"documents_topic": ".."}, "other than '.' and '..', got '..'"),
    ({"documents_topic": "dökumente"}, "setting 'documents_topic' (from flag --documents-topic): must be a Kafka topic name"),
    ({"control_topic": "streamsemi.documents"},
     "setting 'control_topic' (from flag --control-topic): must be distinct from the other topics, got 'streamsemi.documents', the same topic as documents_topic"),
    ({"deadletter_topic": "streamsemi_assignments"},
     "setting 'deadletter_topic' (from flag --deadletter-topic): must be distinct from the other topics, got 'streamsemi_assignments', a name that collides"),
])
def test_topic_names_are_legal_and_distinct(flags, message):
    assert message in refused(flags)


def test_longest_legal_topic_name_is_accepted():
    assert resolve({"documents_topic": "a-b_c." + "x" * 243}, env={}).documents_topic.endswith("x")


# ------------------------------------------------------------------ Kafka client settings
def test_compression_codec_needs_its_library(monkeypatch):
    import kafka.codec

    monkeypatch.setattr(kafka.codec, "has_snappy", lambda: False)
    assert ("setting 'compression' (from flag --compression): must be a codec whose Python package is installed, "
            "got 'snappy' (needs 'python-snappy'") in refused({"compression": "snappy"})
    monkeypatch.setattr(kafka.codec, "has_snappy", lambda: True)
    assert resolve({"compression": "snappy"}, env={}).compression == "snappy"
    assert resolve({"compression": "gzip"}, env={}).compression == "gzip"
    assert "got 'brotli'" in refused({"compression": "brotli"})


@pytest.mark.parametrize(("hb", "session", "ok"), [("10000", "10000", False), ("20000", "10000", False),
                                                  ("3334", "10000", False), ("3333", "10000", True),
                                                  ("1000", "6000", True)])
def test_heartbeat_must_be_at_most_a_third_of_the_session_timeout(hb, session, ok):
    flags = {"heartbeat_interval_ms": hb, "session_timeout_ms": session}
    if ok:
        assert resolve(flags, env={}).heartbeat_interval_ms == int(hb)
    else:
        assert (f"setting 'heartbeat_interval_ms' (from flag --heartbeat-interval-ms): must be at most a third of "
                f"session_timeout_ms ({session}) as Kafka recommends, got {hb}") in refused(flags)


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    key, cert = tmp_path / "client.key", tmp_path / "client.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=streamsemi-test"], check=True, capture_output=True, timeout=60)
    return key, cert


def test_sasl_and_tls_combinations(tmp_path):
    sasl = {"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN"}
    assert "setting 'security_protocol' (from flag --security-protocol): SASL_SSL needs sasl_mechanism to be set, got ''" in refused(
        {"security_protocol": "SASL_SSL"})
    assert ("setting 'sasl_mechanism' (from flag --sasl-mechanism): needs security_protocol SASL_PLAINTEXT or SASL_SSL, "
            "got security_protocol 'PLAINTEXT'") in refused({"sasl_mechanism": "PLAIN"})
    assert "setting 'sasl_username' (from default): must be set for SASL PLAIN, got ''" in refused(sasl)
    assert "setting 'sasl_password' (from default): must be set for SASL PLAIN, got ''" in refused({**sasl, "sasl_username": "u"})
    assert "setting 'sasl_password' (from environment STREAMSEMI_SASL_PASSWORD): is set but security_protocol is 'PLAINTEXT'" in refused(
        {}, {"STREAMSEMI_SASL_PASSWORD": "secret"})
    s = resolve({**sasl, "sasl_username": "u", "sasl_password": "p"}, env={})
    assert ss_config.kafka_security(s) == {"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN",
                                           "sasl_plain_username": "u", "sasl_plain_password": "p"}

    tls = {"security_protocol": "SSL"}
    assert "setting 'ssl_cafile' (from flag --ssl-cafile): must be a readable file, got '/nonexistent/ca.pem' (No such file or directory)" in refused(
        {**tls, "ssl_cafile": "/nonexistent/ca.pem"})
    assert f"setting 'ssl_cafile' (from flag --ssl-cafile): must be a readable file, got a directory {str(tmp_path)!r}" in refused(
        {**tls, "ssl_cafile": str(tmp_path)})
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    assert f"setting 'ssl_cafile' (from flag --ssl-cafile): must hold PEM CA certificates, got {str(junk)!r}" in refused(
        {**tls, "ssl_cafile": str(junk)})
    assert "setting 'ssl_certfile' (from flag --ssl-certfile): must be a PEM certificate with its unencrypted key" in refused(
        {**tls, "ssl_certfile": str(junk)})
    key, cert = _self_signed(tmp_path)
    assert "setting 'ssl_cafile' (from flag --ssl-cafile): is set but security_protocol is 'PLAINTEXT': TLS would not be used" in refused(
        {"ssl_cafile": str(cert)})
    assert "setting 'ssl_keyfile' (from flag --ssl-keyfile): needs ssl_certfile" in refused({**tls, "ssl_keyfile": str(key)})
    other_key = tmp_path / "other.key"
    subprocess.run(["openssl", "genrsa", "-out", str(other_key), "2048"], check=True, capture_output=True, timeout=60)
    assert "setting 'ssl_keyfile' (from flag --ssl-keyfile): must be a PEM certificate with its unencrypted key" in refused(
        {**tls, "ssl_certfile": str(cert), "ssl_keyfile": str(other_key)})
    good = resolve({**tls, "ssl_cafile": str(cert), "ssl_certfile": str(cert), "ssl_keyfile": str(key)}, env={})
    assert ss_config.kafka_security(good)["ssl_keyfile"] == str(key)


# ------------------------------------------------------------------ metrics address, state dir
@pytest.mark.parametrize("host", ["not a host", "nope.invalid", "", "-bad-", "a..b"])
def test_metrics_host_must_be_an_ip_or_resolve(host):
    assert "setting 'metrics_host' (from flag --metrics-host): must be an IP address or a" in refused({"metrics_host": host})
    assert f"got {host!r}" in refused({"metrics_host": host})


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "::1", "localhost"])
def test_metrics_host_accepts_ips_and_resolvable_names(host):
    assert resolve({"metrics_host": host}, env={}).metrics_host == host


def test_state_dir_is_created_and_must_be_writable(tmp_path):
    new = tmp_path / "a" / "b"
    assert resolve({"state_dir": str(new)}, env={}).state_dir == str(new) and new.is_dir()
    assert list(new.iterdir()) == [], "the write check leaves nothing behind"
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert f"setting 'state_dir' (from flag --state-dir): must be a directory, got {str(a_file)!r}, which is a file" in refused(
        {"state_dir": str(a_file)})
    assert f"setting 'state_dir' (from flag --state-dir): must be a writable directory, got {str(a_file / 'sub')!r}" in refused(
        {"state_dir": str(a_file / "sub")})
    # a directory that exists and cannot be written to, even by root
    assert "setting 'state_dir' (from environment STREAMSEMI_STATE_DIR): must be a writable directory, got '/proc'" in refused(
        {}, {"STREAMSEMI_STATE_DIR": "/proc"})


# ------------------------------------------------------------------ environment
def test_misspelled_environment_variables_are_refused_with_the_closest_name():
    assert ("environment variable STREAMSEMI_WINDOW_MAXDOCS: not a streamsemi setting "
            "(did you mean 'STREAMSEMI_WINDOW_MAX_DOCS'?)") in refused({}, {"STREAMSEMI_WINDOW_MAXDOCS": "5"})
    assert "STREAMSEMI_BOOTSTRAP_SERVER: not a streamsemi setting (did you mean 'STREAMSEMI_BOOTSTRAP_SERVERS'?)" in refused(
        {}, {"STREAMSEMI_BOOTSTRAP_SERVER": "k:9092"})
    assert "environment variable STREAMSEMI_XYZZY: not a streamsemi setting" in refused({}, {"STREAMSEMI_XYZZY": "1"})
    env = {name: "x" for name in ENV_NOT_SETTINGS} | {"STREAMSEMI_BOOTSTRAP_SERVERS": "k:9092", "OTHER_VAR": "1"}
    assert resolve({}, env=env).bootstrap_servers == "k:9092"


def test_every_streamsemi_variable_the_package_reads_is_a_setting_or_allowlisted():
    settings_env = {ss_config.env_name(s.name) for s in SETTINGS}
    found = set()
    for path in PACKAGE.rglob("*.py"):
        found |= set(re.findall(r"\bSTREAMSEMI_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(encoding="utf-8")))
    assert "STREAMSEMI_DATA_DIR" in found and "STREAMSEMI_TANSU" in found
    assert found - settings_env <= set(ENV_NOT_SETTINGS), found - settings_env - set(ENV_NOT_SETTINGS)


def test_unknown_flag_names_are_refused():
    assert "setting 'windw_max_docs' (from flags): unknown setting (did you mean 'window_max_docs'?)" in refused(
        {"windw_max_docs": 3})


# ------------------------------------------------------------------ TOML file
def test_toml_file_problems_name_the_file_or_key(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("window_max_docs = [")
    assert f"setting 'config' (file {str(bad)!r}): is not valid TOML" in refused(config_file=bad)
    assert (f"setting 'config' (file {str(tmp_path / 'missing.toml')!r}): must be an existing file, got a path that does not exist"
            in refused(config_file=tmp_path / "missing.toml"))
    assert f"setting 'config' (file {str(tmp_path)!r}): must be a regular file, got a directory" in refused(config_file=tmp_path)
    latin1 = tmp_path / "latin1.toml"
    latin1.write_bytes(b'group_id = "streamsemi"\nlog_level = "caf\xe9"\n')
    assert f"setting 'config' (file {str(latin1)!r}): must be UTF-8 text, got byte 0xe9 on line 2" in refused(config_file=latin1)
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("windw_max_docs = 3\n")
    assert "setting 'windw_max_docs' (from " in refused(config_file=unknown)
    assert "unknown setting (did you mean 'window_max_docs'?)" in refused(config_file=unknown)
    params = tmp_path / "params.toml"
    params.write_text("[algorithm_params.cle]\nk = 3\n")
    assert "setting 'algorithm_params' (from config file " in refused(config_file=params)
    assert "'cle' is not an enabled algorithm (enabled: constrained-kmeans)" in refused(config_file=params)


@pytest.mark.parametrize(("text", "message"), [
    ("streamsemi = 5\n", "setting 'streamsemi' (from {p}): must be a table of settings ([streamsemi]), got 5"),
    ("streamsemi = \"x\"\n", "setting 'streamsemi' (from {p}): must be a table of settings ([streamsemi]), got 'x'"),
    ("log_level = \"INFO\"\n[streamsemi]\nwindow_max_docs = 5\n",
     "setting 'log_level' (from {p}): must be inside the [streamsemi] table"),
    ("algorithm_params = 5\n", "setting 'algorithm_params' (from {p}): must be a table of tables, e.g. [algorithm_params.semi-ldc], got 5"),
    ("[algorithm_params]\nconstrained-kmeans = 3\n",
     "setting 'algorithm_params.constrained-kmeans' (from {p}): must be a table of the algorithm's parameters"),
    ("window_max_docs = [1, 2]\n", "setting 'window_max_docs' (from config file {p}): must be an integer, got [1, 2]"),
    ("group_id = { a = 1 }\n", "setting 'group_id' (from config file {p}): must be a string, got {{'a': 1}}"),
    ("drift_detection = 2024-01-01\n", "setting 'drift_detection' (from config file {p}): must be a boolean, got datetime.date(2024, 1, 1)"),
    ("window_max_docs = 10.5\n", "setting 'window_max_docs' (from config file {p}): must be an integer, got 10.5"),
    ("window_max_docs = true\n", "setting 'window_max_docs' (from config file {p}): must be an integer, got True"),
])
def test_toml_tables_must_have_the_right_shape(tmp_path, text, message):
    p = tmp_path / "s.toml"
    p.write_text(text)
    assert message.format(p=p) in refused(config_file=p)


# ------------------------------------------------------------------ algorithm parameters
@pytest.mark.parametrize(("table", "message"), [
    ('max_iter = "lots"', "setting 'algorithm_params.constrained-kmeans.max_iter' (from config file {p}): constrained-kmeans: "
                          "The 'max_iter' parameter of ConstrainedKMeans must be an int in the range [1, inf). Got 'lots' instead."),
    ("max_iter = -5", "setting 'algorithm_params.constrained-kmeans.max_iter' (from config file {p}): constrained-kmeans: "
                      "The 'max_iter' parameter of ConstrainedKMeans must be an int in the range [1, inf). Got -5 instead."),
    ("max_iterations = 3", "setting 'algorithm_params.constrained-kmeans.max_iterations' (from config file {p}): "
                           "constrained-kmeans: ConstrainedKMeans.__init__() got an unexpected keyword argument 'max_iterations'"),
])
def test_algorithm_parameters_are_checked_at_start_and_named(tmp_path, table, message):
    p = tmp_path / "algo.toml"
    p.write_text(f'algorithms = "constrained-kmeans"\n[algorithm_params.constrained-kmeans]\n{table}\n')
    assert message.format(p=p) in refused(config_file=p)


def test_algorithm_parameter_errors_from_worker_settings(tmp_path):
    legacy = tmp_path / "legacy.toml"
    legacy.write_text('algorithms = "cle"\n[algorithm_params.cle]\ndiscovery = "legacy"\n')
    assert "cle: n_new_clusters > 0 with discovery='legacy' needs assign='kmeans'" in refused(
        {"n_new_clusters": "2"}, config_file=legacy)
    explicit = tmp_path / "explicit.toml"
    explicit.write_text('algorithms = "cle"\nn_new_clusters = 2\n[algorithm_params.cle]\nassign = "calibrated"\n'
                        'discovery = "legacy"\n')
    assert "setting 'algorithm_params.cle.assign' (from config file " in refused(config_file=explicit)
    ok = tmp_path / "ok.toml"
    ok.write_text('algorithms = "cle"\nn_new_clusters = 2\n[algorithm_params.cle]\nassign = "kmeans"\n')
    assert resolve({}, env={}, config_file=ok).algorithm_params == {"cle": {"assign": "kmeans"}}
    # calibrated discovery (the default) takes any assign, and n_new_clusters = "auto"
    assert resolve({"algorithms": "cle", "n_new_clusters": "2"}, env={}).n_new_clusters == 2
    assert resolve({"algorithms": "cle,d-lda", "n_new_clusters": "auto"}, env={}).n_new_clusters == "auto"


def test_n_new_clusters_is_a_count_or_auto(tmp_path):
    toml = tmp_path / "auto.toml"
    toml.write_text('n_new_clusters = "auto"\n')
    assert resolve({}, env={}, config_file=toml).n_new_clusters == "auto"
    assert resolve({}, env={"STREAMSEMI_N_NEW_CLUSTERS": "AUTO"}).n_new_clusters == "auto"
    assert ("setting 'n_new_clusters' (from flag --n-new-clusters): must be an integer or one of 'auto', "
            "got 'many'") in refused({"n_new_clusters": "many"})
    assert "setting 'n_new_clusters' (from flag --n-new-clusters): must be >= 0, got -1" in refused({"n_new_clusters": "-1"})
    legacy = tmp_path / "legacy.toml"
    legacy.write_text('n_new_clusters = "auto"\n[algorithm_params.constrained-kmeans]\ndiscovery = "fast"\n')
    assert "'discovery' parameter of ConstrainedKMeans must be a str among" in refused(config_file=legacy)


# ------------------------------------------------------------------ errors
def test_error_classes_share_the_package_base():
    from streamsemi.core.datasets import DatasetError
    from streamsemi.devtools.broker import BrokerError as BrokerErrorReexported

    assert issubclass(ConfigError, StreamsemiError) and issubclass(ConfigError, ValueError)
    assert issubclass(BrokerError, StreamsemiError) and BrokerErrorReexported is BrokerError
    assert issubclass(DatasetError, StreamsemiError)
    assert ss_config.ConfigError is ConfigError


# ------------------------------------------------------------------ through the CLI
def test_cli_print_config_and_config_error_exit_code():
    out = subprocess.run([sys.executable, "-m", "streamsemi", "run", "--print-config", "--window-max-docs", "5",
                          "--sasl-password", "hunter2", "--security-protocol", "SASL_PLAINTEXT", "--sasl-mechanism",
                          "PLAIN", "--sasl-username", "u"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["settings"]["window_max_docs"] == 5 and data["sources"]["window_max_docs"] == "flag --window-max-docs"
    assert data["settings"]["sasl_password"] == "***", "secrets are masked"
