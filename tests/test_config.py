"""Settings: precedence, validation messages that name the setting, --print-config."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from streamsemi.service.config import ConfigError, resolve


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


@pytest.mark.parametrize(("flags", "env", "message"), [
    ({"window_max_docs": "0"}, {}, "setting 'window_max_docs' (from flag --window-max-docs): 0 must be > 0"),
    ({"window_max_docs": "many"}, {}, "setting 'window_max_docs'"),
    ({}, {"STREAMSEMI_METRICS_PORT": "70000"}, "setting 'metrics_port' (from environment STREAMSEMI_METRICS_PORT): 70000 must be a TCP port"),
    ({"algorithms": "constrained-kmeans,nope"}, {}, "setting 'algorithms' (from flag --algorithms): unknown algorithm 'nope'"),
    ({"algorithms": ""}, {}, "setting 'algorithms'"),
    ({"primary": "cle"}, {}, "setting 'primary' (from flag --primary): 'cle' is not among the enabled algorithms"),
    ({"bootstrap_servers": "localhost"}, {}, "setting 'bootstrap_servers' (from flag --bootstrap-servers)"),
    ({"log_level": "LOUD"}, {}, "setting 'log_level' (from flag --log-level): 'LOUD' is not one of"),
    ({"drift_detection": "maybe"}, {}, "setting 'drift_detection'"),
    ({"security_protocol": "SASL_SSL"}, {}, "setting 'security_protocol': SASL needs sasl_mechanism"),
    ({"ssl_cafile": "/nonexistent/ca.pem"}, {}, "setting 'ssl_cafile' (from flag --ssl-cafile): file '/nonexistent/ca.pem' does not exist"),
])
def test_invalid_settings_name_the_setting_and_reason(flags, env, message):
    with pytest.raises(ConfigError) as exc:
        resolve(flags, env=env)
    assert message in str(exc.value)


def test_bad_toml_and_unknown_keys(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("window_max_docs = [")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        resolve({}, env={}, config_file=bad)
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("windw_max_docs = 3\n")
    with pytest.raises(ConfigError, match="setting 'windw_max_docs'.*unknown setting"):
        resolve({}, env={}, config_file=unknown)
    with pytest.raises(ConfigError, match="does not exist"):
        resolve({}, env={}, config_file=tmp_path / "missing.toml")
    params = tmp_path / "params.toml"
    params.write_text("[algorithm_params.cle]\nk = 3\n")
    with pytest.raises(ConfigError, match="'cle' is not an enabled algorithm"):
        resolve({}, env={}, config_file=params)


def test_cli_print_config_and_config_error_exit_code():
    out = subprocess.run([sys.executable, "-m", "streamsemi", "run", "--print-config", "--window-max-docs", "5",
                          "--sasl-password", "hunter2"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["settings"]["window_max_docs"] == 5 and data["sources"]["window_max_docs"] == "flag --window-max-docs"
    assert data["settings"]["sasl_password"] == "***", "secrets are masked"
    bad = subprocess.run([sys.executable, "-m", "streamsemi", "run", "--refit-every-docs", "-1"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    assert "configuration error: setting 'refit_every_docs' (from flag --refit-every-docs): -1 must be >= 0" in bad.stderr


def test_algorithm_parameters_are_checked_at_start(tmp_path):
    typo = tmp_path / "typo.toml"
    typo.write_text('algorithms = "constrained-kmeans"\n[algorithm_params.constrained-kmeans]\nmax_iterations = 3\n')
    with pytest.raises(ConfigError, match=r"setting 'algorithm_params.constrained-kmeans': .*max_iterations"):
        resolve({}, env={}, config_file=typo)
    with pytest.raises(ConfigError, match="setting 'n_new_clusters': cle: n_new_clusters > 0 needs assign='kmeans'"):
        resolve({"algorithms": "cle", "n_new_clusters": "2"}, env={})
    ok = tmp_path / "ok.toml"
    ok.write_text('algorithms = "cle"\nn_new_clusters = 2\n[algorithm_params.cle]\nassign = "kmeans"\n')
    assert resolve({}, env={}, config_file=ok).algorithm_params == {"cle": {"assign": "kmeans"}}
