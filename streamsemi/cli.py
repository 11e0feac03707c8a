"""The ``streamsemi`` command line: broker, run, produce, label, unlabel, refit, tail, console, demo,
datasets, evaluate, state."""

from __future__ import annotations

import argparse
import json
import math
import shutil
import signal
import sys
import time
from collections.abc import Iterable
from typing import Any

from streamsemi import __version__
from streamsemi.core.errors import StreamsemiError
from streamsemi.core.jsonsafe import UnsafeJSON, loads_bounded
from streamsemi.service.config import ConfigError, Settings, add_flags, flags_from_args, resolve

TOPIC_FLAGS = ("documents_topic", "control_topic", "assignments_topic", "deadletter_topic", "labels_topic",
               "clusters_topic", "suggestions_topic")


#: how long a command (produce, label, tail, ...) waits for an unreachable broker before it says so; the worker
#: waits 30 s at start (a broker may still be starting), kafka-python's own default
CLI_KAFKA_TIMEOUT_S = 10.0
#: ``name`` reads the clusters topic to learn which algorithms the worker runs for at most this long
CLUSTERS_READ_TIMEOUT_S = 15.0


def positive_number(what: str) -> Any:
    """An argparse ``type``: a finite number above 0 (``--rate -1`` is refused with the value, not run at full speed).

    Parameters
    ----------
    what : str
        What the number is, for the message (``"documents per second"``).

    Returns
    -------
    callable
        ``str -> float``, raising :class:`argparse.ArgumentTypeError` for anything else.
    """
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number of {what}, got {text!r}") from None
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"must be a positive number of {what}, got {text}")
        return value

    return parse


def bootstrap_problem(bootstrap_servers: str) -> str | None:
    """:func:`streamsemi.service.kafka_io.bootstrap_problem` (imported when a command talks to Kafka)."""
    from streamsemi.service import kafka_io

    return kafka_io.bootstrap_problem(bootstrap_servers)


def require_kafka(settings: Settings, what: str) -> None:
    """Raise :class:`ConnectionError` naming the addresses tried when no bootstrap server accepts a connection
    (a TCP connection each, :data:`~streamsemi.service.kafka_io.BOOTSTRAP_CONNECT_TIMEOUT_S` at most).

    Parameters
    ----------
    settings : Settings
        Its ``bootstrap_servers`` are tried.
    what : str
        What the command wanted to do, for the message (``"send to streamsemi.control"``).
    """
    problem = bootstrap_problem(settings.bootstrap_servers)
    if problem is not None:
        raise ConnectionError(f"cannot reach Kafka at {settings.bootstrap_servers} to {what} (tried {problem})")


def _client_settings(args: argparse.Namespace) -> Settings:
    flags = {k: getattr(args, k, None) for k in ("bootstrap_servers", *TOPIC_FLAGS)}
    return resolve(flags, config_file=getattr(args, "config", None))


def _add_client_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootstrap-servers", dest="bootstrap_servers", default=None,
                   help="Kafka bootstrap servers HOST:PORT (env STREAMSEMI_BOOTSTRAP_SERVERS)")
    for name in TOPIC_FLAGS:
        p.add_argument("--" + name.replace("_", "-"), dest=name, default=None, help=f"override {name}")
    p.add_argument("--config", default=None, help="TOML settings file")


def _producer(settings: Settings) -> Any:
    from streamsemi.service.kafka_io import make_producer

    return make_producer(settings)


# ---------------------------------------------------------------- commands
def cmd_broker(args: argparse.Namespace) -> int:
    from streamsemi.devtools.broker import EmbeddedBroker

    stop = {"now": False}

    def handler(_s: int, _f: Any) -> None:
        stop["now"] = True

    # before "broker_started": a SIGTERM sent as soon as that line is read must stop the broker cleanly
    # (it killed this process with the default action, leaving the Tansu child behind)
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    broker = EmbeddedBroker(port=args.port, host=args.host).start()
    print(json.dumps({"event": "broker_started", "bootstrap_servers": broker.bootstrap_servers}), flush=True)
    try:
        while not stop["now"] and broker.alive():
            time.sleep(0.2)
    finally:
        broker.stop()
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from streamsemi.core import logs

    settings = resolve(flags_from_args(args), config_file=args.config)
    if args.print_config:
        print(json.dumps({"settings": settings.redacted(), "sources": settings.sources}, indent=2, default=str))
        return 0
    logs.setup(settings.log_level)
    from streamsemi.service.roles import make_worker

    worker = make_worker(settings)  # --role all (Worker), refit or assign (docs/scaling.md)
    worker.install_signal_handlers()
    return worker.run()


def cmd_produce(args: argparse.Namespace) -> int:
    from streamsemi.core import datasets
    from streamsemi.core.messages import encode_json
    from streamsemi.devtools.replay import (
        document_message,
        paced,
        replay_order,
        seed_message,
        stratified_seeds,
    )
    from streamsemi.service.kafka_io import ensure_topics

    settings = _client_settings(args)
    ds = datasets.load(args.corpus)
    order = replay_order(ds, args.order, args.seed)
    order = order[args.skip: None if args.limit is None else args.skip + args.limit]
    seeds = stratified_seeds(ds, order, args.seed_fraction, args.seed)
    require_kafka(settings, f"produce to {settings.documents_topic}")
    ensure_topics(settings, timeout_s=CLI_KAFKA_TIMEOUT_S)
    producer = _producer(settings)
    n_docs = n_seeds = 0
    t0 = time.monotonic()
    for i in paced([int(x) for x in order], args.rate):
        msg = document_message(ds, i)
        producer.send(settings.documents_topic, key=msg["id"].encode(), value=encode_json(msg))
        n_docs += 1
        if i in seeds:
            sm = seed_message(ds, i)
            producer.send(settings.control_topic, key=sm["id"].encode(), value=encode_json(sm))
            n_seeds += 1
    producer.flush()
    producer.close()
    print(json.dumps({"event": "produced", "corpus": ds.name, "documents": n_docs, "seeds": n_seeds,
                      "seconds": round(time.monotonic() - t0, 2), "topic": settings.documents_topic}))
    return 0


def _checked_control(messages: list[dict], stream: str | None = None) -> list[dict]:
    """``messages`` with ``stream`` added where they have none, each checked as a worker checks it (labels, cluster
    ids, algorithm and stream names: :mod:`streamsemi.core.names`); a :class:`ConfigError` for the first refused."""
    from streamsemi.core.messages import Limits, Rejected, check_outgoing_control

    limits = Limits()
    if stream is not None:  # per-stream models (docs/scaling.md): messages without their own stream get this one
        messages = [m if "stream" in m else {**m, "stream": stream} for m in messages]
    for m in messages:
        parsed = check_outgoing_control(m, limits)
        if isinstance(parsed, Rejected):
            raise ConfigError(f"invalid control message {m}: {parsed.detail}")
    return messages


def _send_control(settings: Settings, messages: list[dict], stream: str | None = None) -> None:
    from streamsemi.core.messages import encode_json
    from streamsemi.service.kafka_io import ensure_topics

    messages = _checked_control(messages, stream)  # refused before anything is read or sent
    require_kafka(settings, f"send to {settings.control_topic}")
    ensure_topics(settings, [settings.control_topic], timeout_s=CLI_KAFKA_TIMEOUT_S)
    producer = _producer(settings)
    for m in messages:
        key = m.get("id")
        producer.send(settings.control_topic, key=key.encode() if key else None, value=encode_json(m))
    producer.flush()
    producer.close()
    print(json.dumps({"event": "control_sent", "messages": len(messages), "topic": settings.control_topic}))


def label_messages(lines: Iterable[str], source: str) -> list[dict]:
    """``label`` control messages from JSON lines ``{id, labels | label, text?, stream?}`` (blank lines skipped).

    A line that is not a JSON object is a :class:`ConfigError` naming ``source`` and the line
    number; the messages themselves are validated when sent (as every control message is).
    """
    messages: list[dict] = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise ConfigError(f"{source}:{lineno}: not JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise ConfigError(f"{source}:{lineno}: not a JSON object ({{\"id\": ..., \"labels\": [...]}})")
        labels = obj.get("labels", [obj["label"]] if "label" in obj else None)
        msg = {"op": "label", "id": obj.get("id"), "labels": labels}
        if obj.get("text"):
            msg["text"] = obj["text"]
        if "stream" in obj:
            msg["stream"] = obj["stream"]
        messages.append(msg)
    return messages


def cmd_label(args: argparse.Namespace) -> int:
    settings = _client_settings(args)
    messages: list[dict] = []
    if args.file == "-":
        messages = label_messages(sys.stdin, "<stdin>")
    elif args.file:
        try:
            with open(args.file, encoding="utf-8") as fh:
                messages = label_messages(fh, args.file)
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"label: cannot read --file {args.file}: {exc}") from None
    if args.id:
        if not args.label:
            raise ConfigError("label: --label is required with --id")
        msg = {"op": "label", "id": args.id, "labels": args.label}
        if args.text:
            msg["text"] = args.text
        messages.append(msg)
    if not messages:
        raise ConfigError("label: give --id ID --label L, or --file seeds.jsonl")
    _send_control(settings, messages, args.stream)
    return 0


def cmd_unlabel(args: argparse.Namespace) -> int:
    _send_control(_client_settings(args), [{"op": "unlabel", "id": args.id}], args.stream)
    return 0


def cmd_refit(args: argparse.Namespace) -> int:
    _send_control(_client_settings(args), [{"op": "refit"}], args.stream)
    return 0


def cluster_table(settings: Settings, timeout_s: float = CLUSTERS_READ_TIMEOUT_S) -> dict[tuple[Any, str, str], dict]:
    """The clusters topic read to its end as a table: ``(stream, algorithm, cluster) -> latest lifecycle event``.

    Parameters
    ----------
    settings : Settings
        Its ``clusters_topic`` and bootstrap servers.
    timeout_s : float
        Longest read (a missing topic counts as empty after it).

    Returns
    -------
    dict
        The latest event per key (``stream`` None without per-stream models); records that are not
        JSON objects with ``algorithm`` and ``cluster`` are skipped.
    """
    from kafka.errors import KafkaError

    from streamsemi.service.kafka_io import assign_all, bootstrap_timeout, make_reader

    deadline = time.monotonic() + timeout_s
    table: dict[tuple[Any, str, str], dict] = {}
    consumer = make_reader(settings, client_id="streamsemi-cli-clusters",
                           **bootstrap_timeout(int(CLI_KAFKA_TIMEOUT_S * 1000)))
    try:
        if settings.clusters_topic not in consumer.topics():
            return table  # no worker has written cluster events here yet
        try:
            tps = assign_all(consumer, settings.clusters_topic, timeout_s=timeout_s)
        except ConnectionError:
            return table
        left = set(tps)
        while left and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=300, max_records=5000).values():
                for r in records:
                    try:
                        ev = loads_bounded(r.value) if r.value is not None else None
                    except UnsafeJSON:  # one bad record (nested too deeply, not UTF-8, ...) is one skipped record
                        continue
                    if isinstance(ev, dict) and isinstance(ev.get("algorithm"), str) and isinstance(ev.get("cluster"), str):
                        table[(ev.get("stream"), ev["algorithm"], ev["cluster"])] = ev
            # read to each partition's high watermark (end_offsets is wrong on some brokers; docs/reliability.md)
            left = {tp for tp in left if consumer.highwater(tp) is None or consumer.position(tp) < consumer.highwater(tp)}
    except KafkaError:
        return table
    finally:
        consumer.close()
    return table


def name_problem(algorithm: str | None, cluster: str, stream: str | None, running: list[str] | None,
                 source: str, events: dict[tuple[Any, str, str], dict]) -> str | None:
    """Why ``name CLUSTER LABEL --algorithm A`` would be refused by the worker, or None.

    Parameters
    ----------
    algorithm : str or None
        ``--algorithm`` (None: the worker's primary, not known here).
    cluster : str
        The cluster id named.
    stream : str or None
        ``--stream``.
    running : list of str or None
        The algorithms the worker runs (None: not known).
    source : str
        Where ``running`` came from, for the message.
    events : dict
        :func:`cluster_table` (may be empty).

    Returns
    -------
    str or None
        A sentence naming what is wrong and where that was read.
    """
    from streamsemi.algorithms import REGISTRY

    if algorithm is not None and algorithm not in REGISTRY:
        return f"unknown algorithm {algorithm!r} (known: {', '.join(sorted(REGISTRY))})"
    if algorithm is not None and running is not None and algorithm not in running:
        return f"the worker does not run {algorithm} (it runs {', '.join(running) or 'nothing'}; from {source})"
    if algorithm is None or not events or (stream is None and any(s is not None for s, _a, _c in events)):
        return None  # the primary is not known here; per-stream clusters need --stream
    mine = {c: ev for (s, a, c), ev in events.items() if a == algorithm and (stream is None or s == stream)}
    if not mine:
        return None  # no lifecycle event of this algorithm yet: the worker decides
    from streamsemi.core.clusters import cluster_number

    ev = mine.get(cluster)
    if ev is None or cluster_number(cluster) is None:
        found = sorted((c for c, e in mine.items()
                        if cluster_number(c) is not None and e.get("event") not in ("retired", "merged_into")),
                       key=lambda c: cluster_number(c) or 0)
        what = "a seeded class, not a discovered cluster" if ev is not None else "not on the clusters topic"
        return (f"{cluster!r} of {algorithm} is {what} (its discovered clusters: {', '.join(found) or 'none'})")
    if ev.get("event") in ("retired", "merged_into"):
        target = f" into {ev['target']}" if ev.get("target") else ""
        return f"{cluster} of {algorithm} was {ev['event'].replace('_into', '')}{target} (model v{ev.get('model_version')})"
    return None


def cmd_name(args: argparse.Namespace) -> int:
    from streamsemi.service.serving_state import worker_status

    settings = _client_settings(args)
    msg = {"op": "name", "cluster": args.cluster, "label": args.label}
    if args.algorithm:
        msg["algorithm"] = args.algorithm
    _checked_control([msg], args.stream)  # a bad label, cluster id or stream name: refused before Kafka is asked
    running: list[str] | None = None
    source = ""
    problem = name_problem(args.algorithm, args.cluster, args.stream, None, "", {})  # an unknown name: no Kafka
    if problem is None and args.worker_url:
        status = worker_status(args.worker_url, timeout_s=CLI_KAFKA_TIMEOUT_S)
        if status is None:
            raise ConnectionError(f"name: the worker at {args.worker_url} does not answer (its /readyz)")
        if isinstance(status.get("algorithms"), list):
            running, source = [str(a) for a in status["algorithms"]], f"the worker's {args.worker_url}/readyz"
    if problem is None:
        require_kafka(settings, f"read {settings.clusters_topic}")
        events = cluster_table(settings)
        if running is None and events:
            running = sorted({a for (_s, a, _c) in events})
            source = f"the clusters topic {settings.clusters_topic}"
        problem = name_problem(args.algorithm, args.cluster, args.stream, running, source, events)
        # say what the check rests on: a worker that has not fitted yet has written no cluster events
        print(f"streamsemi: name: checked against {source} ({len(events)} cluster events read)" if running is not None
              else f"streamsemi: name: no cluster events on {settings.clusters_topic} and no --worker-url: "
                   "the worker checks the name (refusals go to the dead-letter topic)", file=sys.stderr)
    if problem is not None:
        print(f"streamsemi: name refused, nothing sent: {problem}", file=sys.stderr)
        return 2
    _send_control(settings, [msg], args.stream)
    return 0


#: skipped records ``streamsemi tail`` reports one by one on stderr (then only their count, at the end)
TAIL_SKIPS_SHOWN = 100


def tail_line(key: bytes | None, value: bytes | None) -> str:
    """One record as ``streamsemi tail`` prints it: its JSON value on one line (as sent; compacted when the
    value spans lines), or for a tombstone (null value, a compacted topic's delete)
    ``{"key": ..., "tombstone": true}`` so the deleted key shows.

    Raises
    ------
    UnsafeJSON
        The value is no bounded JSON value (not UTF-8, not JSON, NaN, nested deeper than 64 levels...):
        ``streamsemi tail`` skips the record and says so on stderr.
    """
    if value is None:
        return json.dumps({"key": None if key is None else key.decode("utf-8", "replace"), "tombstone": True})
    obj = loads_bounded(value)
    if b"\n" in value or b"\r" in value:
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return value.decode("utf-8")


def _tail_skipped(record: Any, exc: UnsafeJSON, skipped: int) -> None:
    """Report one skipped record on stderr (a JSON line: topic, partition, offset, reason)."""
    if skipped <= TAIL_SKIPS_SHOWN:
        print(json.dumps({"event": "tail_record_skipped", "topic": record.topic, "partition": record.partition,
                          "offset": record.offset, "reason": exc.reason, "detail": exc.detail}), file=sys.stderr)


def keep_latest(table: dict[Any, bytes | None], key: bytes | None, value: bytes | None) -> None:
    """Update ``table`` (a compacted topic read as a table) with one record: the key's last value moves to the
    end; a keyless record is a row of its own."""
    k: Any = key if key is not None else object()
    table.pop(k, None)
    table[k] = value


def terminal_text(text: Any, width: int) -> str:
    """``text`` for one table cell: control characters (escape sequences of untrusted documents) as spaces,
    whitespace runs collapsed, cut to ``width`` characters with an ellipsis."""
    clean = " ".join("".join(ch if ch.isprintable() else " " for ch in str(text)).split())
    return clean if len(clean) <= width else clean[: max(0, width - 1)] + "\u2026"


def is_suggestion(value: Any) -> bool:
    """A suggestion record's value (docs/schemas/suggestion.schema.json): an object with an ``id``, an int
    ``rank``, the ``algorithm`` and the ``reason``."""
    return (isinstance(value, dict) and isinstance(value.get("id"), str) and isinstance(value.get("rank"), int)
            and not isinstance(value.get("rank"), bool) and isinstance(value.get("algorithm"), str)
            and isinstance(value.get("reason"), str))


def ranked_suggestions(values: list[dict]) -> list[dict]:
    """Suggestions in queue order: per stream (none first), rank 0 first."""
    return sorted(values, key=lambda v: (str(v.get("stream") or ""), v["rank"]))


def suggestion_table(values: list[dict], width: int = 100) -> list[str]:
    """The suggestion queue as a text table for a terminal, one line per suggestion in rank order.

    Parameters
    ----------
    values : list of dict
        Suggestion records (:func:`is_suggestion`), any order.
    width : int
        Terminal columns: the snippet takes what the other columns leave (at least 20).

    Returns
    -------
    list of str
        A header line, then ``RANK  ID  LABEL  P  REASON  ALGORITHM  V  SNIPPET`` rows (``STREAM`` first
        with per-stream models); document text shown without control characters.
    """
    rows = ranked_suggestions(values)
    streams = any(v.get("stream") for v in rows)
    head = (["STREAM"] if streams else []) + ["RANK", "ID", "LABEL", "P", "REASON", "ALGORITHM", "V"]
    cells: list[list[str]] = []
    for v in rows:
        scores = v.get("scores") if isinstance(v.get("scores"), dict) else {}
        p = scores.get(v.get("label"))
        cells.append(([terminal_text(v.get("stream") or "", 16)] if streams else []) + [
            str(v["rank"]), terminal_text(v["id"], 32), terminal_text(v.get("label") or "", 20),
            f"{p:.2f}" if isinstance(p, (int, float)) else "", terminal_text(v.get("reason") or "", 12),
            terminal_text(v.get("algorithm") or "", 20), str(v.get("model_version", ""))])
    widths = [max(len(h), *(len(c[k]) for c in cells)) if cells else len(h) for k, h in enumerate(head)]
    snippet_w = max(20, width - sum(widths) - 2 * len(widths) - 1)

    def line(parts: list[str], last: str) -> str:
        return "  ".join(p.rjust(w) if h in ("RANK", "P", "V") else p.ljust(w)
                         for p, w, h in zip(parts, widths, head, strict=True)) + "  " + last

    out = [line(head, "SNIPPET").rstrip()]
    out += [line(c, terminal_text(v.get("snippet") or "", snippet_w)).rstrip() for c, v in zip(cells, rows, strict=True)]
    return out


def cmd_tail(args: argparse.Namespace) -> int:
    from kafka.errors import KafkaError

    from streamsemi.service.kafka_io import assign_all, bootstrap_timeout, make_reader

    if args.live and args.follow:
        raise ConfigError("tail: --live prints the table once the topic is read; it cannot --follow")
    if args.limit is not None and args.limit < 1:
        raise ConfigError(f"tail: --limit must be at least 1, got {args.limit}")
    if args.format == "table" and not args.live:
        raise ConfigError("tail: --format table needs --live (a table is the topic read to its end)")
    settings = _client_settings(args)
    topic = args.topic or settings.assignments_topic
    require_kafka(settings, f"read {topic}")
    try:
        consumer = make_reader(settings, **bootstrap_timeout(int(CLI_KAFKA_TIMEOUT_S * 1000)))
    except KafkaError as exc:
        raise ConnectionError(f"cannot reach Kafka at {settings.bootstrap_servers} to read {topic}: "
                              f"{exc}") from None
    try:
        assign_all(consumer, topic, timeout_s=args.timeout)
    except ConnectionError:
        consumer.close()
        raise ConnectionError(f"topic {topic!r} not found on {settings.bootstrap_servers} (no partitions within "
                              f"--timeout {args.timeout:g} s)") from None
    seen = skipped = 0
    last = time.monotonic()
    table: dict[Any, bytes | None] = {}  # --live: the latest value per key (what compaction would keep)
    try:
        while args.live or args.limit is None or seen < args.limit:
            batch = consumer.poll(timeout_ms=500)
            if batch:
                last = time.monotonic()
            for records in batch.values():
                for r in records:
                    try:
                        line = tail_line(r.key, r.value)
                    except UnsafeJSON as exc:
                        skipped += 1
                        _tail_skipped(r, exc, skipped)
                        if args.live:  # the key's latest value is unreadable: the table has no row for it
                            keep_latest(table, r.key, None)
                        continue
                    if args.live:
                        keep_latest(table, r.key, r.value)
                        continue
                    sys.stdout.write(line + "\n")
                    seen += 1
                    if args.limit is not None and seen >= args.limit:
                        break
            sys.stdout.flush()
            if not args.follow and time.monotonic() - last > args.timeout:
                break
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()
    if skipped:
        print(json.dumps({"event": "tail_records_skipped", "topic": topic, "skipped": skipped,
                          "shown": min(skipped, TAIL_SKIPS_SHOWN)}), file=sys.stderr, flush=True)
    if args.live:
        rows = [v for v in table.values() if v is not None]  # tombstoned keys left out
        parsed = []
        for value in rows:
            try:
                parsed.append(json.loads(value))
            except ValueError:
                parsed.append(None)
        if rows and all(is_suggestion(v) for v in parsed):
            # the suggestion queue: in rank order (the newest value per id), a table on a terminal
            queue = ranked_suggestions(parsed)[: args.limit]
            if args.format == "table" or (args.format == "auto" and sys.stdout.isatty()):
                lines = suggestion_table(queue, shutil.get_terminal_size((120, 24)).columns)
            else:
                lines = [json.dumps(v, ensure_ascii=False) for v in queue]
        else:
            lines = [v.decode("utf-8", "replace") for v in (rows[-args.limit:] if args.limit is not None else rows)]
        for text in lines:
            sys.stdout.write(text + "\n")
        sys.stdout.flush()
    return 0


def cmd_console(args: argparse.Namespace) -> int:
    from streamsemi.console.server import ServeOptions, serve

    settings = _client_settings(args)
    problem = bootstrap_problem(settings.bootstrap_servers)
    if problem is not None:  # the console starts all the same: its pages show the broker's status
        print(f"streamsemi console: cannot reach Kafka at {settings.bootstrap_servers} (tried {problem}); "
              "starting anyway, its pages show when the broker answers", file=sys.stderr, flush=True)
    return serve(settings, ServeOptions(
        host=args.host, port=args.port, auth_token=args.auth_token, worker_url=args.worker_url,
        max_entries=args.max_entries, max_mb=args.max_mb, backfill=args.backfill,
        allowed_hosts=tuple(args.allowed_host or ()), secure_cookie=args.secure_cookie))


def cmd_demo(args: argparse.Namespace) -> int:
    from streamsemi.devtools.demo import run_demo

    if args.bootstrap_servers:
        problem = bootstrap_problem(args.bootstrap_servers)
        if problem is not None:
            raise ConnectionError(f"cannot reach Kafka at {args.bootstrap_servers} for the demo (tried {problem})")
    return run_demo(args)


def cmd_datasets(args: argparse.Namespace) -> int:
    from streamsemi.core import datasets

    if args.action == "list":
        have = datasets.available()
        for name, desc in datasets.CORPORA.items():
            print(f"{name:14s} {'cached ' if have[name] else 'missing'}  {desc}")
        print(f"cache: {datasets.cache_dir()}")
        return 0
    names = list(datasets.CORPORA) if args.name == "all" else [args.name]
    for name in names:
        ds = datasets.load(name)
        print(json.dumps({"event": "dataset_ready", "name": name, "documents": len(ds),
                          "path": str(datasets.fetch(name))}))
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from streamsemi.evaluation import command

    return command.run(args)


def cmd_state(args: argparse.Namespace) -> int:
    from streamsemi.service.checkpoint import inspect_command

    return inspect_command(args)


# ---------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="streamsemi", description="Streaming semi-supervised text classification on Kafka")
    parser.add_argument("--version", action="version", version=f"streamsemi {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("broker", help="run the embedded Kafka-protocol broker (Tansu) in the foreground")
    p.add_argument("--port", type=int, default=9092)
    p.add_argument("--host", default="127.0.0.1")
    p.set_defaults(func=cmd_broker)

    p = sub.add_parser("run", help="run the worker")
    p.add_argument("--config", default=None, help="TOML settings file")
    p.add_argument("--print-config", action="store_true", help="print the effective settings and exit")
    add_flags(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("produce", help="replay a corpus into the documents topic (and seeds into the control topic)")
    _add_client_flags(p)
    p.add_argument("--corpus", required=True)
    p.add_argument("--limit", type=int, default=None, help="documents to send")
    p.add_argument("--skip", type=int, default=0, help="skip this many documents of the replay order first")
    p.add_argument("--rate", type=positive_number("documents per second"), default=None,
                   help="documents per second, above 0 (default: as fast as possible)")
    p.add_argument("--seed-fraction", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--order", default="auto", choices=("auto", "time", "random", "corpus"))
    p.set_defaults(func=cmd_produce)

    p = sub.add_parser("label", help="send seed labels")
    _add_client_flags(p)
    p.add_argument("--id")
    p.add_argument("--label", action="append")
    p.add_argument("--text", default=None, help="the document's text (for documents the worker has not seen)")
    p.add_argument("--file", default=None, help="JSON lines: {id, labels|label, text?, stream?}; - reads standard input")
    p.add_argument("--stream", default=None, help="per-stream models: the stream it is for (default: default_stream)")
    p.set_defaults(func=cmd_label)

    p = sub.add_parser("unlabel", help="remove a seed label")
    _add_client_flags(p)
    p.add_argument("--id", required=True)
    p.add_argument("--stream", default=None, help="per-stream models: the stream it is for (default: default_stream)")
    p.set_defaults(func=cmd_unlabel)

    p = sub.add_parser("refit", help="ask the workers to refit now")
    _add_client_flags(p)
    p.add_argument("--stream", default=None, help="per-stream models: the stream it is for (default: default_stream; without it: every stream)")
    p.set_defaults(func=cmd_refit)

    p = sub.add_parser("name", help="turn a discovered cluster into a class: its most central documents become seeds")
    _add_client_flags(p)
    p.add_argument("cluster", help="a discovered cluster id, new-N (see the clusters topic)")
    p.add_argument("label", help="the class name (an existing class gets the documents added)")
    p.add_argument("--algorithm", default=None,
                   help="whose cluster (default: the primary algorithm); refused before sending when the worker "
                        "does not run it (read from --worker-url's /readyz, else the clusters topic)")
    p.add_argument("--worker-url", default=None,
                   help="the worker's metrics server (e.g. http://127.0.0.1:9464): which algorithms it runs")
    p.add_argument("--stream", default=None, help="per-stream models: the stream it is for (default: default_stream)")
    p.set_defaults(func=cmd_name)

    p = sub.add_parser("tail", help="print the output topic from the beginning, one JSON object per line")
    _add_client_flags(p)
    p.add_argument("--topic", default=None, help="topic to print (default: the assignments topic)")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--timeout", type=positive_number("seconds"), default=10.0,
                   help="stop after this many idle seconds (and give up on a topic that does not exist after it)")
    p.add_argument("--follow", action="store_true")
    p.add_argument("--live", action="store_true",
                   help="read the topic as a table (a compacted topic: suggestions, clusters, labels): the latest "
                        "value per key, deleted keys left out; --limit keeps the newest rows (the suggestions: "
                        "the best ranked, in rank order)")
    p.add_argument("--format", choices=("auto", "table", "json"), default="auto",
                   help="--live on the suggestions: a ranked table on a terminal, JSON lines when piped (auto)")
    p.set_defaults(func=cmd_tail)

    p = sub.add_parser("console", help="web console: suggestions, clusters, seeds; writes control messages")
    _add_client_flags(p)
    p.add_argument("--host", default="127.0.0.1", help="bind address (anything but loopback needs --auth-token)")
    p.add_argument("--port", type=int, default=8765, help="port (0 = any free port)")
    p.add_argument("--auth-token", default=None, help="token every request needs (env STREAMSEMI_CONSOLE_TOKEN)")
    p.add_argument("--worker-url", default=None, help="the worker's metrics server, e.g. http://127.0.0.1:9464")
    p.add_argument("--allowed-host", action="append", default=None, metavar="NAME",
                   help="a host name browsers use for the console (its Host header; repeatable); loopback names, "
                        "IP addresses and the --host name are always accepted")
    p.add_argument("--secure-cookie", action="store_true",
                   help="mark the login cookie Secure (and __Host-): the console is served behind a TLS proxy")
    p.add_argument("--max-entries", type=int, default=50_000, help="entries per in-memory table")
    p.add_argument("--max-mb", type=float, default=32.0, help="MiB per in-memory table")
    p.add_argument("--backfill", type=int, default=20_000,
                   help="records per partition read back from the end of the documents/assignments/labels topics")
    p.set_defaults(func=cmd_console)

    p = sub.add_parser("demo", help="embedded broker + worker + a real corpus streaming through, with live progress")
    p.add_argument("--corpus", default="reuters-r8")
    p.add_argument("--docs", type=int, default=None, help="stop after this many documents are assigned")
    p.add_argument("--rate", type=positive_number("documents per second"), default=200.0)
    p.add_argument("--seed-fraction", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--algorithms", default="constrained-kmeans")
    p.add_argument("--refit-every-docs", type=int, default=500)
    p.add_argument("--port", type=int, default=None, help="broker port (default: a free one)")
    p.add_argument("--metrics-port", type=int, default=9464)
    p.add_argument("--console-port", type=int, default=8765, help="port of the web console (-1 = no console)")
    p.add_argument("--bootstrap-servers", default=None, help="use this Kafka instead of the embedded broker")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("datasets", help="list or fetch corpora")
    dsub = p.add_subparsers(dest="action", required=True)
    dsub.add_parser("list")
    f = dsub.add_parser("fetch")
    f.add_argument("name", help="corpus name or 'all'")
    p.set_defaults(func=cmd_datasets)

    p = sub.add_parser("evaluate", help="run a paper's protocol against the baselines")
    try:
        from streamsemi.evaluation import command as eval_command

        eval_command.configure_parser(p)
    except ImportError as exc:
        p.set_defaults(eval_unavailable=str(exc))
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("state", help="inspect checkpoints")
    ssub = p.add_subparsers(dest="action", required=True)
    i = ssub.add_parser("inspect")
    i.add_argument("dir")
    p.set_defaults(func=cmd_state)
    return parser


def main(argv: list[str] | None = None) -> int:
    from streamsemi.core.logs import quiet_kafka_event_loop

    quiet_kafka_event_loop()  # commands that do not set up logging (tail, label ...) print kafka-python's warnings
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "eval_unavailable", None):
        print(f"streamsemi evaluate is not available: {args.eval_unavailable}", file=sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"streamsemi: configuration error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except (StreamsemiError, ConnectionError) as exc:
        # streamsemi's own failures (broker, datasets, checkpoints, algorithms) and an unreachable
        # Kafka: one line instead of a traceback; anything else is a bug and keeps its traceback
        print(f"streamsemi: {_one_line(exc)}", file=sys.stderr)
        return 1


def _one_line(exc: BaseException) -> str:
    """The exception's message on one line (TOML and library messages may span several)."""
    return " ".join(str(exc).split()) or type(exc).__name__


if __name__ == "__main__":
    raise SystemExit(main())
