"""Worker settings: defaults < TOML file (``--config``) < environment ``STREAMSEMI_*`` < flags.

Every setting is declared once in :data:`SETTINGS` with its type, default, help and
validation; the CLI flags, environment variables and TOML keys are all derived from
it. An invalid value raises :class:`ConfigError` naming the setting and the reason.
"""

from __future__ import annotations

import argparse
import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENV_PREFIX = "STREAMSEMI_"


class ConfigError(ValueError):
    """An invalid setting; the message names the setting and the reason."""


@dataclass(frozen=True)
class Setting:
    name: str
    kind: type
    default: Any
    help: str
    check: Callable[[Any], str | None] | None = None
    choices: tuple[str, ...] | None = None
    secret: bool = False


def _positive(v: Any) -> str | None:
    return None if v is None or v > 0 else "must be > 0"


def _non_negative(v: Any) -> str | None:
    return None if v is None or v >= 0 else "must be >= 0"


def _fraction(v: Any) -> str | None:
    return None if 0 < v <= 1 else "must be in (0, 1]"


def _port(v: Any) -> str | None:
    return None if 0 <= v <= 65535 else "must be a TCP port 0..65535"


def _power_of_two_features(v: Any) -> str | None:
    return None if 2**10 <= v <= 2**24 else "must be between 1024 and 16777216"


def _bootstrap(v: Any) -> str | None:
    for part in str(v).split(","):
        host, _, port = part.strip().rpartition(":")
        if not host or not port.isdigit():
            return "must be HOST:PORT[,HOST:PORT...]"
    return None


SETTINGS: tuple[Setting, ...] = (
    Setting("bootstrap_servers", str, "127.0.0.1:9092", "Kafka bootstrap servers, HOST:PORT[,HOST:PORT]", _bootstrap),
    Setting("documents_topic", str, "streamsemi.documents", "topic the documents arrive on"),
    Setting("control_topic", str, "streamsemi.control", "topic of seed labels and refit requests"),
    Setting("assignments_topic", str, "streamsemi.assignments", "output topic"),
    Setting("deadletter_topic", str, "streamsemi.deadletter", "topic for malformed messages"),
    Setting("group_id", str, "streamsemi", "consumer group of the documents topic"),
    Setting("topic_partitions", int, 3, "partitions of topics created at start", _positive),
    Setting("replication_factor", int, 1, "replication factor of topics created at start", _positive),
    Setting("security_protocol", str, "PLAINTEXT", "Kafka security protocol",
            choices=("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")),
    Setting("sasl_mechanism", str, "", "SASL mechanism (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)",
            choices=("", "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")),
    Setting("sasl_username", str, "", "SASL user name"),
    Setting("sasl_password", str, "", "SASL password", secret=True),
    Setting("ssl_cafile", str, "", "CA bundle for TLS"),
    Setting("ssl_certfile", str, "", "client certificate for TLS"),
    Setting("ssl_keyfile", str, "", "client key for TLS"),
    Setting("producer_acks", str, "all", "producer acks", choices=("0", "1", "all")),
    Setting("compression", str, "", "producer compression", choices=("", "gzip", "snappy", "lz4", "zstd")),
    Setting("max_poll_records", int, 500, "records per poll", _positive),
    Setting("session_timeout_ms", int, 10000, "consumer group session timeout", _positive),
    Setting("heartbeat_interval_ms", int, 3000, "consumer heartbeat interval", _positive),
    Setting("max_poll_interval_ms", int, 300000, "max time between polls before the client leaves the group", _positive),
    Setting("algorithms", str, "constrained-kmeans", "comma-separated enabled algorithms"),
    Setting("primary", str, "", "primary algorithm (default: the first enabled)"),
    Setting("n_new_clusters", int, 0, "extra clusters for unseeded classes where the algorithm supports it", _non_negative),
    Setting("n_features", int, 2**18, "hashing dimension", _power_of_two_features),
    Setting("stop_words", str, "english", "stop words removed before hashing", choices=("english", "none")),
    Setting("window_max_docs", int, 10000, "documents kept in the refit window", _positive),
    Setting("window_max_age_s", float, 0.0, "drop window documents older than this (0 = no age bound)", _non_negative),
    Setting("max_seed_docs", int, 20000, "seed-labeled documents kept (oldest out)", _positive),
    Setting("max_classes", int, 200, "distinct seeded classes accepted", _positive),
    Setting("max_pending_labels", int, 50000, "labels held for documents not seen yet", _positive),
    Setting("pending_label_ttl_s", float, 3600.0, "expiry of a held label whose document never arrives", _positive),
    Setting("max_buffered_docs", int, 20000, "documents held before the first model exists (consumption pauses beyond)", _positive),
    Setting("refit_every_docs", int, 2000, "refit after this many new documents (0 = off)", _non_negative),
    Setting("refit_every_s", float, 0.0, "refit every this many seconds (0 = off)", _non_negative),
    Setting("min_docs_first_refit", int, 200, "documents needed before the first fit", _positive),
    Setting("min_refit_interval_s", float, 5.0, "minimum time between drift-triggered refits", _non_negative),
    Setting("drift_detection", bool, True, "refit early when ADWIN sees the assignment scores shift"),
    Setting("drift_delta", float, 0.002, "ADWIN confidence parameter", _fraction),
    Setting("metrics_host", str, "127.0.0.1", "address of the metrics/health HTTP server"),
    Setting("metrics_port", int, 9464, "port of the metrics/health HTTP server (0 = any free port)", _port),
    Setting("state_dir", str, "", "directory for checkpoints (empty = no checkpoints)"),
    Setting("checkpoint_interval_s", float, 300.0, "seconds between checkpoints", _positive),
    Setting("shutdown_grace_s", float, 30.0, "maximum time to finish the current batch on SIGTERM", _positive),
    Setting("max_message_bytes", int, 1_000_000, "larger messages are dead-lettered", _positive),
    Setting("max_text_chars", int, 500_000, "longer texts are dead-lettered", _positive),
    Setting("max_labels_per_doc", int, 20, "labels per control message", _positive),
    Setting("explain_words", int, 8, "top words per cluster in outputs", _non_negative),
    Setting("random_state", int, 0, "seed of every algorithm", _non_negative),
    Setting("log_level", str, "INFO", "log level", choices=("DEBUG", "INFO", "WARNING", "ERROR")),
)

_BY_NAME = {s.name: s for s in SETTINGS}


@dataclass
class Settings:
    """Effective worker settings (``values``) and where each came from (``sources``)."""

    values: dict[str, Any]
    sources: dict[str, str] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["values"][name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def algorithm_list(self) -> list[str]:
        return [a.strip() for a in self.values["algorithms"].split(",") if a.strip()]

    @property
    def primary_algorithm(self) -> str:
        return self.values["primary"] or self.algorithm_list[0]

    def redacted(self) -> dict[str, Any]:
        """Values with secrets masked (for --print-config and logs)."""
        return {k: ("***" if k in _BY_NAME and _BY_NAME[k].secret and v else v) for k, v in self.values.items()}


def _coerce(setting: Setting, raw: Any, source: str) -> Any:
    where = f"setting '{setting.name}' (from {source})"
    try:
        if setting.kind is bool:
            if isinstance(raw, bool):
                value: Any = raw
            elif str(raw).strip().lower() in ("1", "true", "yes", "on"):
                value = True
            elif str(raw).strip().lower() in ("0", "false", "no", "off"):
                value = False
            else:
                raise ValueError(f"{raw!r} is not a boolean")
        elif setting.kind is int:
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise ValueError(f"{raw!r} is not an integer")
            value = int(raw)
        elif setting.kind is float:
            if isinstance(raw, bool):
                raise ValueError(f"{raw!r} is not a number")
            value = float(raw)
        else:
            if not isinstance(raw, (str, int, float)) or isinstance(raw, bool):
                raise ValueError(f"{raw!r} is not a string")
            value = str(raw)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if setting.choices is not None and value not in setting.choices:
        raise ConfigError(f"{where}: {value!r} is not one of {', '.join(repr(c) for c in setting.choices)}")
    if setting.check is not None:
        problem = setting.check(value)
        if problem:
            raise ConfigError(f"{where}: {value!r} {problem}")
    return value


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML settings file (top-level keys, or a ``[streamsemi]`` table)."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"setting 'config': file {str(p)!r} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"setting 'config': {str(p)!r} is not valid TOML: {exc}") from None
    data = data.get("streamsemi", data)
    unknown = sorted(set(data) - set(_BY_NAME) - {"algorithm_params"})
    if unknown:
        raise ConfigError(f"setting '{unknown[0]}' (from {p}): unknown setting")
    return data


def resolve(flags: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None,
            config_file: str | Path | None = None) -> Settings:
    """Merge defaults, TOML, environment and flags, validating every value.

    Raises
    ------
    ConfigError
        A value has the wrong type or is out of range, an algorithm is unknown, or
        the primary algorithm is not enabled.
    """
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    env = os.environ if env is None else env
    toml = load_toml(config_file) if config_file else {}
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for s in SETTINGS:
        raw, source = s.default, "default"
        if s.name in toml:
            raw, source = toml[s.name], f"config file {config_file}"
        env_name = ENV_PREFIX + s.name.upper()
        if env_name in env:
            raw, source = env[env_name], f"environment {env_name}"
        if s.name in flags:
            raw, source = flags[s.name], f"flag --{s.name.replace('_', '-')}"
        values[s.name] = _coerce(s, raw, source)
        sources[s.name] = source
    settings = Settings(values, sources)
    settings.values["algorithm_params"] = toml.get("algorithm_params", {})
    _check_algorithms(settings)
    return settings


def _check_algorithms(settings: Settings) -> None:
    from streamsemi.algorithms import AlgorithmNotAvailable, algorithm_class

    names = settings.algorithm_list
    src = settings.sources["algorithms"]
    if not names:
        raise ConfigError(f"setting 'algorithms' (from {src}): at least one algorithm must be enabled")
    if len(set(names)) != len(names):
        raise ConfigError(f"setting 'algorithms' (from {src}): an algorithm is listed twice")
    for name in names:
        try:
            algorithm_class(name)
        except AlgorithmNotAvailable as exc:
            raise ConfigError(f"setting 'algorithms' (from {src}): {exc}") from None
    primary = settings.values["primary"]
    if primary and primary not in names:
        raise ConfigError(f"setting 'primary' (from {settings.sources['primary']}): {primary!r} is not among the enabled algorithms {names}")
    params = settings.values["algorithm_params"]
    if not isinstance(params, dict) or any(not isinstance(v, dict) for v in params.values()):
        raise ConfigError("setting 'algorithm_params': must be a table of tables, e.g. [algorithm_params.semi-ldc]")
    for name in params:
        if name not in names:
            raise ConfigError(f"setting 'algorithm_params': {name!r} is not an enabled algorithm")
    from streamsemi.algorithms import build_estimator

    for name in names:
        try:
            build_estimator(name, params.get(name), settings.values["n_new_clusters"], settings.values["random_state"])
        except (TypeError, ValueError) as exc:
            where = f"algorithm_params.{name}" if name in params else "n_new_clusters"
            raise ConfigError(f"setting '{where}': {name}: {exc}") from None
    if settings.values["sasl_mechanism"] and not settings.values["security_protocol"].startswith("SASL"):
        raise ConfigError("setting 'sasl_mechanism': needs security_protocol SASL_PLAINTEXT or SASL_SSL")
    if settings.values["security_protocol"].startswith("SASL") and not settings.values["sasl_mechanism"]:
        raise ConfigError("setting 'security_protocol': SASL needs sasl_mechanism to be set")
    for key in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
        path = settings.values[key]
        if path and not Path(path).is_file():
            raise ConfigError(f"setting '{key}' (from {settings.sources[key]}): file {path!r} does not exist")


def add_flags(parser: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """Add one ``--flag`` per setting (defaults None so that lower layers show through)."""
    for s in SETTINGS:
        if s.name in skip:
            continue
        flag = "--" + s.name.replace("_", "-")
        if s.kind is bool:
            parser.add_argument(flag, dest=s.name, default=None, action=argparse.BooleanOptionalAction,
                                help=f"{s.help} (default {s.default})")
        else:
            parser.add_argument(flag, dest=s.name, default=None, type=str,
                                help=f"{s.help} (default {s.default!r})")


def flags_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """Setting values given on the command line."""
    return {s.name: getattr(args, s.name) for s in SETTINGS if getattr(args, s.name, None) is not None}


def kafka_security(settings: Settings) -> dict[str, Any]:
    """kafka-python keyword arguments for TLS/SASL."""
    out: dict[str, Any] = {"security_protocol": settings.security_protocol}
    if settings.sasl_mechanism:
        out.update(sasl_mechanism=settings.sasl_mechanism, sasl_plain_username=settings.sasl_username,
                   sasl_plain_password=settings.sasl_password)
    for key in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
        if settings.values[key]:
            out[key] = settings.values[key]
    return out
