"""Worker settings: defaults < TOML file (``--config``) < environment ``STREAMSEMI_*`` < flags.

Every setting is declared once in :data:`SETTINGS` with its type, default, help and
validation; the CLI flags, environment variables and TOML keys are all derived from
it. The defaults of the engine's settings come from
:class:`streamsemi.engine.EngineConfig` (:data:`ENGINE_DEFAULTS`), the one place they are
written. :func:`resolve` checks every value at start (types, ranges, Kafka client
combinations, topic names, the metrics address, the state directory, the TOML file's
shape, unknown ``STREAMSEMI_*`` variables, each algorithm's parameters) and raises
:class:`ConfigError` naming the setting, the value it got and why it is refused, so a
setting that would fail later never gets past the start.
"""

from __future__ import annotations

import argparse
import difflib
import ipaddress
import math
import os
import re
import socket
import ssl
import stat
import tempfile
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from streamsemi.core.errors import ConfigError
from streamsemi.core.names import check_name, describe
from streamsemi.engine import EngineConfig

ENV_PREFIX = "STREAMSEMI_"

#: ``STREAMSEMI_*`` variables that are read but are not settings of :data:`SETTINGS`.
ENV_NOT_SETTINGS: dict[str, str] = {
    "STREAMSEMI_DATA_DIR": "corpus cache directory (streamsemi.core.datasets)",
    "STREAMSEMI_TANSU": "path of the tansu binary (streamsemi.devtools.broker)",
    "STREAMSEMI_CONSOLE_TOKEN": "auth token of `streamsemi console` (streamsemi.console.server)",
}

#: EngineConfig fields that are not worker settings (set in code, not by the operator).
ENGINE_ONLY_FIELDS = frozenset({"algorithm_params", "background_refit", "keep_text_chars"})

#: Settings whose "off"/"none" value is spelled differently in EngineConfig (None there).
_ENGINE_NONE = {"primary": "", "stop_words": "none", "window_max_age_s": 0.0, "refit_every_s": 0.0}


def _engine_defaults() -> dict[str, Any]:
    """EngineConfig's defaults, spelled as settings (lists comma-joined, None as the "off" value)."""
    out: dict[str, Any] = {}
    for f in fields(EngineConfig):
        if f.name in ENGINE_ONLY_FIELDS:
            continue
        value = f.default_factory() if f.default is MISSING else f.default  # type: ignore[misc]
        if value is None:
            value = _ENGINE_NONE[f.name]
        elif isinstance(value, list):
            value = ",".join(value)
        out[f.name] = value
    return out


#: Default of every engine setting, taken from :class:`EngineConfig`.
ENGINE_DEFAULTS: dict[str, Any] = _engine_defaults()


@dataclass(frozen=True)
class Setting:
    """One worker setting: name (also the flag, env and TOML key), type, default, help, check.

    ``check`` returns None for a valid value or the reason it is refused
    ("must be > 0"); the value got is appended to the message.
    """

    name: str
    kind: type
    default: Any
    help: str
    check: Callable[[Any], str | None] | None = None
    choices: tuple[str, ...] | None = None
    secret: bool = False
    words: tuple[str, ...] = ()  # accepted as they are besides values of ``kind`` (n_new_clusters: "auto")


def _positive(v: Any) -> str | None:
    return None if v > 0 else "must be > 0"


def _non_negative(v: Any) -> str | None:
    return None if v >= 0 else "must be >= 0"


def _fraction(v: Any) -> str | None:
    return None if 0 < v <= 1 else "must be in (0, 1]"


def _nice_increment(v: Any) -> str | None:
    return None if 0 <= v <= 19 else "must be in 0..19"


def _listen_port(v: Any) -> str | None:
    return None if 0 <= v <= 65535 else "must be a TCP port 1..65535 (or 0 for any free port)"


def _hashing_dimension(v: Any) -> str | None:
    return None if 2**10 <= v <= 2**24 else "must be in 1024..16777216"


def _seed(v: Any) -> str | None:
    return None if 0 <= v < 2**32 else "must be in 0..4294967295"


_HOST_LABEL = re.compile(r"^(?!-)[A-Za-z0-9_-]{1,63}(?<!-)$")


def host_problem(host: str) -> str | None:
    """Why ``host`` is not an IP literal or a syntactically valid host name (None if it is)."""
    h = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ipaddress.ip_address(h)
        return None
    except ValueError:
        pass
    name = h[:-1] if h.endswith(".") else h
    if not name or len(name) > 253 or not all(_HOST_LABEL.fullmatch(label) for label in name.split(".")):
        return "must be an IP address or a host name (letters, digits, '-', '_' and dots)"
    return None


def _bootstrap(v: Any) -> str | None:
    for part in str(v).split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            return "must be HOST:PORT[,HOST:PORT...] with ports 1..65535"
        if ":" in host and not host.startswith("["):
            return "must write an IPv6 address in brackets, [ADDRESS]:PORT"
        problem = host_problem(host)
        if problem:
            return f"{problem} in HOST:PORT[,HOST:PORT...]"
    return None


_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


def topic_problem(name: str) -> str | None:
    """Why ``name`` is not a legal Kafka topic name (None if it is)."""
    if name in (".", ".."):
        return "must be a Kafka topic name other than '.' and '..'"
    if not _TOPIC.fullmatch(name):
        return "must be a Kafka topic name: 1..249 characters of a-z A-Z 0-9 . _ -"
    return None


def _non_empty(v: Any) -> str | None:
    return None if str(v).strip() else "must not be empty"


STREAM_NAME_RULE = describe("stream")


def stream_name_problem(name: str) -> str | None:
    """Why ``name`` is not a stream name (None if it is; :mod:`streamsemi.core.names`): it becomes part of model and
    cluster keys."""
    return check_name("stream", name)


def _stream_name(v: Any) -> str | None:
    problem = stream_name_problem(str(v))
    return None if problem is None else f"must be a stream name ({STREAM_NAME_RULE}); it {problem}"


def stream_list(value: str) -> list[str]:
    """The names of the ``streams`` setting (``["*"]`` for any; ``[]`` when per-stream models are off)."""
    return [n.strip() for n in str(value).split(",") if n.strip()]


def _stream_list(v: Any) -> str | None:
    names = stream_list(v)
    if names == ["*"] or not names:
        return None
    for n in names:
        problem = stream_name_problem(n)
        if problem:
            return f"must be '*' or comma-separated stream names ({STREAM_NAME_RULE}); {n[:80]!r} {problem}"
    if len(set(names)) != len(names):
        return "must list each stream once"
    return None


E = ENGINE_DEFAULTS
SETTINGS: tuple[Setting, ...] = (
    Setting("bootstrap_servers", str, "127.0.0.1:9092", "Kafka bootstrap servers, HOST:PORT[,HOST:PORT]", _bootstrap),
    Setting("documents_topic", str, "streamsemi.documents", "topic the documents arrive on", topic_problem),
    Setting("control_topic", str, "streamsemi.control", "topic of seed labels and refit requests", topic_problem),
    Setting("assignments_topic", str, "streamsemi.assignments", "output topic", topic_problem),
    Setting("deadletter_topic", str, "streamsemi.deadletter", "topic for malformed messages", topic_problem),
    Setting("labels_topic", str, "streamsemi.labels",
            "compacted topic of the latest primary assignment per document (key = id)", topic_problem),
    Setting("suggestions_topic", str, "streamsemi.suggestions",
            "compacted topic of the documents most worth labelling (key = id, docs/suggestions.md)", topic_problem),
    Setting("clusters_topic", str, "streamsemi.clusters",
            "compacted topic of cluster lifecycle events (key = algorithm/cluster, docs/clusters.md)", topic_problem),
    Setting("group_id", str, "streamsemi", "consumer group of the documents topic", _non_empty),
    Setting("models_topic", str, "streamsemi.models",
            "roles: compacted topic the refitter publishes every model version to (chunked)", topic_problem),
    Setting("refit_leader_topic", str, "streamsemi.refit-leader",
            "roles: single-partition topic whose consumer group elects the one active refitter", topic_problem),
    Setting("role", str, "all", "all = one process does everything; refit = window, seeds, fits, publishes models "
            "(one active, elected; others stand by); assign = serves the latest published model",
            choices=("all", "refit", "assign")),
    Setting("instance_id", str, "", "this process's name in outputs ('worker') and metrics (empty = host-pid)",
            lambda v: None if v == "" else check_name("instance", v)),
    Setting("streams", str, "", "per-stream models: comma-separated names of the streams (a document's 'stream' field) "
            "windowed, seeded and fitted apart, or '*' for any name up to max_streams; empty = one model for every "
            "document (the 'stream' field is ignored)", _stream_list),
    Setting("default_stream", str, "default", "with streams: the stream of documents and control messages without "
            "a 'stream' field", _stream_name),
    Setting("max_streams", int, 8, "with streams: at most this many streams (each keeps its own window, seeds and "
            "models: memory up to max_streams x window_max_docs documents); documents of others are dead-lettered",
            lambda v: None if 1 <= v <= 1000 else "must be in 1..1000"),
    Setting("model_chunk_bytes", int, 900_000,
            "roles: models are published in chunks of at most this many bytes (below the broker's max.message.bytes)",
            lambda v: None if 1024 <= v <= 100_000_000 else "must be in 1024..100000000"),
    Setting("max_model_bytes", int, 1_000_000_000,
            "roles: larger model publications are refused by the reader (bounds its memory)", _positive),
    Setting("models_key_file", str, "",
            "roles: file of the shared secret (at least 32 bytes, no access for others: chmod 600) that signs every "
            "models-topic publication (HMAC-SHA256); refit and assign refuse to start without it unless "
            "insecure_models (docs/reliability.md, Trust boundaries)"),
    Setting("insecure_models", bool, False,
            "roles: run refit/assign without models_key_file: publications are unsigned and anyone who can write the "
            "models topic can make every assigner serve a model of their own (a warning at start)"),
    Setting("topic_partitions", int, 3, "partitions of topics created at start", _positive),
    Setting("replication_factor", int, 1, "replication factor of topics created at start", _positive),
    Setting("security_protocol", str, "PLAINTEXT", "Kafka security protocol",
            choices=("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")),
    Setting("sasl_mechanism", str, "", "SASL mechanism (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)",
            choices=("", "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")),
    Setting("sasl_username", str, "", "SASL user name"),
    Setting("sasl_password", str, "", "SASL password", secret=True),
    Setting("ssl_cafile", str, "", "CA bundle for TLS (PEM)"),
    Setting("ssl_certfile", str, "", "client certificate for TLS (PEM, may hold the key too)"),
    Setting("ssl_keyfile", str, "", "client key for TLS (PEM, unencrypted)"),
    Setting("producer_acks", str, "all", "producer acks", choices=("0", "1", "all")),
    Setting("compression", str, "", "producer compression (the codec's Python package must be installed)",
            choices=("", "gzip", "snappy", "lz4", "zstd")),
    Setting("max_poll_records", int, 500, "records per poll", _positive),
    Setting("fetch_max_wait_ms", int, 100,
            "longest the broker may hold a fetch of the documents topic that finds no new record; the embedded "
            "broker (Tansu) holds it this long even when records arrive meanwhile, so it bounds a fresh "
            "document's wait at its log end (Kafka's own default is 500)",
            lambda v: None if 1 <= v <= 10000 else "must be in 1..10000"),
    Setting("session_timeout_ms", int, 10000, "consumer group session timeout", _positive),
    Setting("heartbeat_interval_ms", int, 3000, "consumer heartbeat interval (at most a third of the session timeout)",
            _positive),
    Setting("max_poll_interval_ms", int, 300000, "max time between polls before the client leaves the group", _positive),
    Setting("algorithms", str, E["algorithms"], "comma-separated enabled algorithms"),
    Setting("primary", str, E["primary"], "primary algorithm, or 'auto' (best held-out seed accuracy; default when "
            "several are enabled, else the one enabled)"),
    Setting("n_new_clusters", int, E["n_new_clusters"],
            "clusters for unseeded classes where the algorithm supports it, or 'auto' (chosen from the "
            "documents no seeded class explains)", _non_negative, words=("auto",)),
    Setting("n_features", int, E["n_features"], "hashing dimension", _hashing_dimension),
    Setting("stop_words", str, E["stop_words"], "stop words removed before hashing", choices=("english", "none")),
    Setting("window_max_docs", int, E["window_max_docs"], "documents kept in the refit window", _positive),
    Setting("window_max_age_s", float, E["window_max_age_s"], "drop window documents older than this (0 = no age bound)",
            _non_negative),
    Setting("max_seed_docs", int, E["max_seed_docs"], "seed-labeled documents kept (oldest out)", _positive),
    Setting("max_classes", int, E["max_classes"], "distinct seeded classes accepted", _positive),
    Setting("max_pending_labels", int, E["max_pending_labels"], "labels held for documents not seen yet", _positive),
    Setting("pending_label_ttl_s", float, E["pending_label_ttl_s"], "expiry of a held label whose document never arrives",
            _positive),
    Setting("max_buffered_docs", int, E["max_buffered_docs"],
            "documents held before the first model exists (consumption pauses beyond)", _positive),
    Setting("refit_every_docs", int, E["refit_every_docs"], "refit after this many new documents (0 = off)", _non_negative),
    Setting("refit_every_s", float, E["refit_every_s"], "refit every this many seconds (0 = off)", _non_negative),
    Setting("min_docs_first_refit", int, E["min_docs_first_refit"], "documents needed before the first fit", _positive),
    Setting("min_seed_classes", int, E["min_seed_classes"],
            "classes the seeds must cover (with min_seeds_per_class each) before the first fit", _positive),
    Setting("min_seeds_per_class", int, E["min_seeds_per_class"], "seeds per class counted by min_seed_classes",
            _positive),
    Setting("first_fit_stable_seeds", int, E["first_fit_stable_seeds"],
            "the first fit also waits until this many seeds in a row introduced no new class (0 = off)",
            _non_negative),
    Setting("first_fit_max_wait_s", float, E["first_fit_max_wait_s"],
            "fit the first model anyway this long after the first document when the seed policy is not met yet "
            "(its outputs are provisional; 0 = wait for the policy, a full buffer or an idle stream)", _non_negative),
    Setting("refit_growth", float, E["refit_growth"],
            "refit when the window grew by this factor since the last fit, until it is full (0 = off)",
            lambda v: None if v == 0 or v > 1 else "must be 0 (off) or > 1"),
    Setting("refit_idle_s", float, E["refit_idle_s"],
            "refit when no document arrived for this long and documents or seeds arrived since the last fit (0 = off)",
            _non_negative),
    Setting("revisions", str, E["revisions"], "revised assignments after a refit: for changed verdicts, all, or off",
            choices=("off", "changed", "all")),
    Setting("revision_chunk", int, E["revision_chunk"], "window documents re-assigned per loop during a revision pass",
            _positive),
    Setting("first_verdicts", str, E["first_verdicts"],
            "a fresh document's first assignment: by the primary alone, the other algorithms' after the loop's "
            "fresh documents (primary), or by every algorithm at once (all)", choices=("primary", "all")),
    Setting("min_refit_interval_s", float, E["min_refit_interval_s"], "minimum time between drift-triggered refits",
            _non_negative),
    Setting("drift_detection", bool, E["drift_detection"], "refit early when ADWIN sees the primary model's scores of fresh documents shift (one detector per model)"),
    Setting("drift_delta", float, E["drift_delta"], "ADWIN confidence parameter", _fraction),
    Setting("metrics_host", str, "127.0.0.1", "address of the metrics/health HTTP server (IP or resolvable name)"),
    Setting("metrics_port", int, 9464, "port of the metrics/health HTTP server (0 = any free port)", _listen_port),
    Setting("state_dir", str, "", "directory for checkpoints, created if missing (empty = no checkpoints)"),
    Setting("checkpoint_interval_s", float, 300.0, "seconds between checkpoints", _positive),
    Setting("shutdown_grace_s", float, 30.0, "maximum time to finish the current batch on SIGTERM", _positive),
    Setting("refit_process", bool, True, "fit the models in a separate process (the polling thread never waits on "
            "a fit; docs/throughput.md)"),
    Setting("fit_priority", str, "adaptive",
            "CPU priority of the fit process (refit_process): adaptive (nice 10 while a model serves, the worker's "
            "own priority while no model serves yet or a refit runs on a stale model: see model_stale_after_s), "
            "low (always nice 10), normal (always the worker's priority) or idle (Linux SCHED_IDLE: fits only on "
            "CPU nothing else wants; on a busy machine the first model may never come; docs/throughput.md)",
            choices=("adaptive", "idle", "low", "normal")),
    Setting("model_stale_after_s", float, 60.0,
            "a refit that runs while the served model is older than this is urgent (the fit process gets the "
            "worker's priority), the model counts as stale (streamsemi_model_stale, /readyz reason); no model "
            "first_fit_max_wait_s + this after the first document: the first model is late", _positive),
    Setting("producer_process", bool, True, "produce the outputs from a separate process (the polling thread hands "
            "them over in batches and does not wait for the broker; docs/throughput.md)"),
    Setting("producer_nice", int, 10,
            "added to the producer process's nice value (producer_process): the polling thread preempts it when "
            "both want a core; it batches and is not latency-bound (docs/throughput.md)", _nice_increment),
    Setting("gc_full_interval_s", float, 600.0,
            "seconds between full collections of Python's garbage collector in the worker; between them the "
            "objects it tracks are frozen every second, so that it does not stop the loop for 0.1-0.25 s every "
            "few seconds to scan the window (docs/throughput.md; 0 = Python's own schedule)", _non_negative),
    Setting("max_unacked_outputs", int, 20_000, "outputs handed to the producer and not acknowledged yet before "
            "consumption pauses (producer_process)", _positive),
    Setting("max_unacked_bytes", int, 64 * 1024 * 1024, "bytes of outputs not acknowledged yet before consumption "
            "pauses (producer_process)", _positive),
    Setting("max_message_bytes", int, 1_000_000, "larger messages are dead-lettered", _positive),
    Setting("max_text_chars", int, 500_000, "longer texts are dead-lettered", _positive),
    Setting("max_labels_per_doc", int, 20, "labels per control message", _positive),
    Setting("explain_words", int, E["explain_words"], "top words per cluster in outputs", _non_negative),
    Setting("cluster_match_min_jaccard", float, E["cluster_match_min_jaccard"],
            "a discovered cluster keeps its id across refits when its window documents overlap the previous "
            "cluster's with at least this Jaccard similarity (docs/clusters.md)", _fraction),
    Setting("name_max_seeds", int, E["name_max_seeds"],
            "op 'name': the cluster's most central documents that become seeds of the class", _positive),
    Setting("suggestions_top_n", int, E["suggestions_top_n"],
            "documents suggested for labelling after each refit round (0 = off)",
            lambda v: None if 0 <= v <= 1000 else "must be in 0..1000"),
    Setting("random_state", int, E["random_state"], "seed of every algorithm", _seed),
    Setting("log_level", str, "INFO", "log level", choices=("DEBUG", "INFO", "WARNING", "ERROR")),
)
del E

_BY_NAME = {s.name: s for s in SETTINGS}
TOPIC_SETTINGS = ("documents_topic", "control_topic", "assignments_topic", "deadletter_topic", "labels_topic",
                  "models_topic", "refit_leader_topic", "clusters_topic", "suggestions_topic")
ENGINE_SETTINGS = tuple(ENGINE_DEFAULTS)
_TOML_ONLY = ("algorithm_params",)


def env_name(setting: str) -> str:
    """The environment variable of ``setting`` (``STREAMSEMI_`` + upper case)."""
    return ENV_PREFIX + setting.upper()


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

    def where(self, name: str) -> str:
        """``setting 'NAME' (from SOURCE)``: the start of every message about a setting."""
        src = self.sources.get(name)
        return f"setting '{name}'" + (f" (from {src})" if src else "")


def _suggest(word: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


_KIND_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}


def _coerce(setting: Setting, raw: Any, source: str) -> Any:
    where = f"setting '{setting.name}' (from {source})"
    also = f" or one of {', '.join(repr(w) for w in setting.words)}" if setting.words else ""
    wrong = f"{where}: must be {_KIND_NAMES[setting.kind]}{also}, got {raw!r}"
    if not isinstance(raw, (str, int, float)):   # a TOML table, array or date
        raise ConfigError(wrong)
    value: Any
    text = str(raw).strip().lower()
    if isinstance(raw, str) and text in setting.words:
        return text
    if setting.kind is bool:
        if isinstance(raw, bool) or text in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            value = raw if isinstance(raw, bool) else text in ("1", "true", "yes", "on")
        else:
            raise ConfigError(wrong)
    elif isinstance(raw, bool):   # TOML true/false where a number or a string is expected
        raise ConfigError(wrong)
    elif setting.kind is int:
        if isinstance(raw, float) and not raw.is_integer():
            raise ConfigError(wrong)
        try:
            value = int(raw)
        except (ValueError, OverflowError):
            raise ConfigError(wrong) from None
    elif setting.kind is float:
        try:
            value = float(raw)
        except ValueError:
            raise ConfigError(wrong) from None
        if not math.isfinite(value):
            raise ConfigError(f"{where}: must be a finite number, got {raw!r}")
    else:
        value = str(raw)
    if setting.choices is not None and value not in setting.choices:
        raise ConfigError(f"{where}: must be one of {', '.join(repr(c) for c in setting.choices)}, got {value!r}")
    if setting.check is not None:
        problem = setting.check(value)
        if problem:
            raise ConfigError(f"{where}: {problem}, got {value!r}")
    return value


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML settings file (top-level keys, or all of them in a ``[streamsemi]`` table).

    Raises
    ------
    ConfigError
        The file is missing, not a regular file, unreadable, not UTF-8, not TOML, or
        has a key that is not a setting or a value of the wrong shape.
    """
    p = Path(path)
    where = f"setting 'config' (file {str(p)!r})"
    if not p.exists():
        raise ConfigError(f"{where}: must be an existing file, got a path that does not exist")
    if not p.is_file():
        raise ConfigError(f"{where}: must be a regular file, got a {'directory' if p.is_dir() else 'special file'}")
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{where}: cannot be read: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(f"{where}: must be UTF-8 text, got byte 0x{raw[exc.start]:02x} on line {line}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: is not valid TOML: {exc}") from None
    src = f"from {p}"
    if "streamsemi" in data:
        table = data["streamsemi"]
        if not isinstance(table, dict):
            raise ConfigError(f"setting 'streamsemi' ({src}): must be a table of settings ([streamsemi]), got {table!r}")
        others = sorted(set(data) - {"streamsemi"})
        if others:
            raise ConfigError(f"setting '{others[0]}' ({src}): must be inside the [streamsemi] table when the file "
                              f"has one (keys outside it would be ignored), got {others[0]} = {data[others[0]]!r} "
                              "at the top level")
        data = table
    known = [*_BY_NAME, *_TOML_ONLY]
    for key in data:
        if key not in known:
            raise ConfigError(f"setting '{key}' ({src}): unknown setting{_suggest(key, known)}")
    params = data.get("algorithm_params", {})
    if not isinstance(params, dict):
        raise ConfigError(f"setting 'algorithm_params' ({src}): must be a table of tables, e.g. "
                          f"[algorithm_params.semi-ldc], got {params!r}")
    for name, table in params.items():
        if not isinstance(table, dict):
            raise ConfigError(f"setting 'algorithm_params.{name}' ({src}): must be a table of the algorithm's "
                              f"parameters ([algorithm_params.{name}]), got {table!r}")
    return data


def _check_env(env: Mapping[str, str]) -> None:
    known = [env_name(s.name) for s in SETTINGS]
    for key in sorted(env):
        if key.startswith(ENV_PREFIX) and key not in known and key not in ENV_NOT_SETTINGS:
            hint = _suggest(key, known + list(ENV_NOT_SETTINGS))
            raise ConfigError(f"environment variable {key}: not a streamsemi setting{hint}")


def resolve(flags: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None,
            config_file: str | Path | None = None) -> Settings:
    """Merge defaults, TOML, environment and flags, validating every value.

    The state directory is created when missing (and checked to be writable).

    Parameters
    ----------
    flags : mapping of setting name -> value, optional
        Highest precedence (``None`` values are ignored).
    env : mapping, optional
        The environment (default ``os.environ``); every ``STREAMSEMI_*`` name in it
        must be a setting or one of :data:`ENV_NOT_SETTINGS`.
    config_file : path, optional
        TOML file (:func:`load_toml`).

    Raises
    ------
    ConfigError
        Names the setting, the value got and the reason: a wrong type or range, an
        unknown setting or ``STREAMSEMI_*`` variable, an unknown algorithm or invalid
        algorithm parameter, an illegal or repeated topic name, an inconsistent
        Kafka client setting, a metrics host that does not resolve, an unusable state
        directory or TOML file.
    """
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    for key in flags:
        if key not in _BY_NAME:
            raise ConfigError(f"setting '{key}' (from flags): unknown setting{_suggest(key, list(_BY_NAME))}")
    env = os.environ if env is None else env
    _check_env(env)
    toml = load_toml(config_file) if config_file else {}
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for s in SETTINGS:
        raw, source = s.default, "default"
        if s.name in toml:
            raw, source = toml[s.name], f"config file {config_file}"
        if env_name(s.name) in env:
            raw, source = env[env_name(s.name)], f"environment {env_name(s.name)}"
        if s.name in flags:
            raw, source = flags[s.name], f"flag --{s.name.replace('_', '-')}"
        values[s.name] = _coerce(s, raw, source)
        sources[s.name] = source
    settings = Settings(values, sources)
    settings.values["algorithm_params"] = toml.get("algorithm_params", {})
    settings.sources["algorithm_params"] = f"config file {config_file}" if "algorithm_params" in toml else "default"
    _check_algorithms(settings)
    _check_topics(settings)
    _check_kafka_client(settings)
    _check_metrics_host(settings)
    _check_state_dir(settings)
    _check_streams(settings)
    _check_models_key(settings)
    return settings


def _check_streams(settings: Settings) -> None:
    names = stream_list(settings.values["streams"])
    if not names or names == ["*"]:
        return
    allowed = set(names) | {settings.values["default_stream"]}
    if len(allowed) > settings.values["max_streams"]:
        raise ConfigError(f"{settings.where('streams')}: must name at most max_streams={settings.values['max_streams']} "
                          f"streams (the default stream {settings.values['default_stream']!r} included), "
                          f"got {len(allowed)}")


def _check_algorithms(settings: Settings) -> None:
    from streamsemi.algorithms import AlgorithmNotAvailable, algorithm_class, build_estimator

    names = settings.algorithm_list
    where = settings.where("algorithms")
    if not names:
        raise ConfigError(f"{where}: must name at least one algorithm, got {settings.algorithms!r}")
    if len(set(names)) != len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise ConfigError(f"{where}: must list each algorithm once, got {twice!r} twice")
    for name in names:
        try:
            algorithm_class(name)
        except AlgorithmNotAvailable as exc:
            raise ConfigError(f"{where}: {exc}") from None
    primary = settings.values["primary"]
    if primary and primary != "auto" and primary not in names:
        raise ConfigError(f"{settings.where('primary')}: {primary!r} is not among the enabled algorithms {names}")
    params = settings.values["algorithm_params"]
    for name in params:
        if name not in names:
            raise ConfigError(f"{settings.where('algorithm_params')}: {name!r} is not an enabled algorithm "
                              f"(enabled: {', '.join(names)}){_suggest(name, names)}")
    for name in names:
        given = params.get(name) or {}
        try:
            build_estimator(name, given, settings.values["n_new_clusters"], settings.values["random_state"])
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{_param_where(settings, name, given, str(exc))}: {name}: {exc}") from None


def _param_where(settings: Settings, algorithm: str, given: Mapping[str, Any], message: str) -> str:
    """The setting an estimator's parameter error is about: ``algorithm_params.NAME.PARAM`` or a worker setting."""
    m = re.search(r"The '(\w+)' parameter|keyword argument '(\w+)'", message)
    named = [p for p in (m.group(1) or m.group(2),) if p] if m else []
    mentioned = named + [p for p in given if re.search(rf"\b{re.escape(p)}\b", message)]
    src = settings.sources.get("algorithm_params")
    for param in mentioned:
        if param in given:
            return f"setting 'algorithm_params.{algorithm}.{param}' (from {src})"
    for worker_setting in ("n_new_clusters", "random_state"):
        if worker_setting in mentioned or re.search(rf"\b{worker_setting}\b", message):
            return settings.where(worker_setting)
    return f"setting 'algorithm_params.{algorithm}' (from {src})"


def _check_topics(settings: Settings) -> None:
    seen: dict[str, str] = {}
    for name in TOPIC_SETTINGS:
        topic = settings.values[name]
        # Kafka refuses topics whose names differ only in '.' vs '_' (they collide in its metric names).
        key = topic.replace(".", "_")
        if key in seen:
            other = seen[key]
            how = "the same topic as" if settings.values[other] == topic else "a name that collides ('.' = '_' in Kafka) with"
            raise ConfigError(f"{settings.where(name)}: must be distinct from the other topics, got {topic!r}, "
                              f"{how} {other} ({settings.values[other]!r})")
        seen[key] = name


_CODEC_PACKAGES = {"snappy": ("has_snappy", "python-snappy"), "lz4": ("has_lz4", "lz4"),
                   "zstd": ("has_zstd", "zstandard")}


def _readable_file(settings: Settings, key: str) -> None:
    path = settings.values[key]
    try:
        with open(path, "rb") as fh:
            fh.read(1)
    except IsADirectoryError:
        raise ConfigError(f"{settings.where(key)}: must be a readable file, got a directory {path!r}") from None
    except OSError as exc:
        raise ConfigError(f"{settings.where(key)}: must be a readable file, got {path!r} "
                          f"({exc.strerror or exc})") from None


def _check_kafka_client(settings: Settings) -> None:
    v = settings.values
    codec = v["compression"]
    if codec in _CODEC_PACKAGES:
        import kafka.codec  # noqa: PLC0415 - the service layer's Kafka client; only when compression is set

        check, package = _CODEC_PACKAGES[codec]
        if not getattr(kafka.codec, check)():
            raise ConfigError(f"{settings.where('compression')}: must be a codec whose Python package is installed, "
                              f"got {codec!r} (needs {package!r}: pip install {package})")
    hb, session = v["heartbeat_interval_ms"], v["session_timeout_ms"]
    if hb * 3 > session:
        raise ConfigError(f"{settings.where('heartbeat_interval_ms')}: must be at most a third of session_timeout_ms "
                          f"({session}) as Kafka recommends, got {hb}")
    protocol, mechanism = v["security_protocol"], v["sasl_mechanism"]
    sasl = protocol.startswith("SASL")
    if mechanism and not sasl:
        raise ConfigError(f"{settings.where('sasl_mechanism')}: needs security_protocol SASL_PLAINTEXT or SASL_SSL, "
                          f"got security_protocol {protocol!r}")
    if sasl and not mechanism:
        raise ConfigError(f"{settings.where('security_protocol')}: {protocol} needs sasl_mechanism to be set, got ''")
    for key in ("sasl_username", "sasl_password"):
        if sasl and not v[key]:
            raise ConfigError(f"{settings.where(key)}: must be set for SASL {mechanism}, got ''")
        if v[key] and not sasl:
            raise ConfigError(f"{settings.where(key)}: is set but security_protocol is {protocol!r}: it would be "
                              "ignored (use SASL_PLAINTEXT or SASL_SSL with a sasl_mechanism)")
    tls = protocol in ("SSL", "SASL_SSL")
    for key in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
        if not v[key]:
            continue
        if not tls:
            raise ConfigError(f"{settings.where(key)}: is set but security_protocol is {protocol!r}: TLS would not be "
                              "used (use SSL or SASL_SSL)")
        _readable_file(settings, key)
    if v["ssl_keyfile"] and not v["ssl_certfile"]:
        raise ConfigError(f"{settings.where('ssl_keyfile')}: needs ssl_certfile (the certificate of this key), got ''")
    if v["ssl_cafile"]:
        try:
            ssl.create_default_context(cafile=v["ssl_cafile"])
        except (ssl.SSLError, ValueError) as exc:
            raise ConfigError(f"{settings.where('ssl_cafile')}: must hold PEM CA certificates, got "
                              f"{v['ssl_cafile']!r} ({exc})") from None
    if v["ssl_certfile"]:
        try:
            ssl.create_default_context().load_cert_chain(v["ssl_certfile"], v["ssl_keyfile"] or None,
                                                         password=lambda: b"")
        except (ssl.SSLError, ValueError) as exc:
            key = "ssl_keyfile" if v["ssl_keyfile"] else "ssl_certfile"
            raise ConfigError(f"{settings.where(key)}: must be a PEM certificate with its unencrypted key, got "
                              f"{v['ssl_certfile']!r} / {v['ssl_keyfile'] or '(key in the certificate file)'!r} "
                              f"({exc})") from None


def _check_metrics_host(settings: Settings) -> None:
    host = settings.values["metrics_host"]
    where = settings.where("metrics_host")
    problem = host_problem(host)
    if problem:
        raise ConfigError(f"{where}: {problem}, got {host!r}")
    try:
        ipaddress.ip_address(host)
        return
    except ValueError:
        pass
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise ConfigError(f"{where}: must be an IP address or a resolvable host name, got {host!r} ({exc})") from None


MODELS_KEY_MIN_BYTES = 32
MODELS_KEY_MAX_BYTES = 4096


def read_models_key(path: str) -> bytes:
    """The key material of a models key file: every byte of it.

    A random key may end in any byte (``head -c 32 /dev/urandom`` ends in a line feed or a space
    about once in 60 keys), so nothing is stripped: the refitter and the assigners read the same file.

    Raises
    ------
    OSError
        The file cannot be read.
    """
    with open(path, "rb") as fh:
        return fh.read(MODELS_KEY_MAX_BYTES + 1)


def _check_models_key(settings: Settings) -> None:
    """``models_key_file``: a regular file, no permission for others, 32..4096 bytes of key; roles need one."""
    v = settings.values
    path, role = v["models_key_file"], v["role"]
    where = settings.where("models_key_file")
    if not path:
        if role in ("refit", "assign") and not v["insecure_models"]:
            raise ConfigError(f"{where}: role {role!r} signs and verifies every models-topic publication and needs a "
                              "key file (create one: head -c 32 /dev/urandom > models.key; chmod 600 models.key), or "
                              "insecure_models (--insecure-models) to run without, got ''")
        return
    if v["insecure_models"]:
        raise ConfigError(f"{settings.where('insecure_models')}: is set but models_key_file is set too ({path!r}): "
                          "publications would be signed and verified all the same (drop one of them)")
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ConfigError(f"{where}: must be a readable file, got {path!r} ({exc.strerror or exc})") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{where}: must be a regular file, got {path!r}")
    if st.st_mode & 0o007:
        raise ConfigError(f"{where}: must not be readable or writable by others (chmod 600 {path}), got {path!r} "
                          f"with mode {stat.S_IMODE(st.st_mode):04o}")
    try:
        key = read_models_key(path)
    except OSError as exc:
        raise ConfigError(f"{where}: must be a readable file, got {path!r} ({exc.strerror or exc})") from None
    if len(key) < MODELS_KEY_MIN_BYTES:
        raise ConfigError(f"{where}: must hold at least {MODELS_KEY_MIN_BYTES} bytes of key material, got {path!r} "
                          f"with {len(key)} (head -c 32 /dev/urandom > {path})")
    if len(key) > MODELS_KEY_MAX_BYTES:
        raise ConfigError(f"{where}: must hold at most {MODELS_KEY_MAX_BYTES} bytes of key material, got {path!r} "
                          "with more")


def _check_state_dir(settings: Settings) -> None:
    path = settings.values["state_dir"]
    if not path:
        return
    where = settings.where("state_dir")
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{where}: must be a directory, got {path!r}, which is a file")
    try:
        p.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=p, prefix=".write-check-"):
            pass
    except OSError as exc:
        raise ConfigError(f"{where}: must be a writable directory, got {path!r} ({exc.strerror or exc})") from None


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


def instance_name(settings: Settings) -> str:
    """This process's name in outputs and metrics: ``instance_id``, else ``<host>-<pid>`` (the pod name on Kubernetes)."""
    return settings.values.get("instance_id") or f"{socket.gethostname()}-{os.getpid()}"


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


__all__ = ["ENGINE_DEFAULTS", "ENV_NOT_SETTINGS", "SETTINGS", "ConfigError", "Setting", "Settings", "add_flags",
           "flags_from_args", "host_problem", "instance_name", "kafka_security", "load_toml", "resolve", "topic_problem"]
