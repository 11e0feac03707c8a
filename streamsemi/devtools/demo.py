"""``streamsemi demo``: the embedded broker, a worker process and a real corpus, with live progress.

The demo starts Tansu on a free port (unless ``--bootstrap-servers`` is given),
starts ``streamsemi run`` as a separate process, replays the corpus into the
documents topic at ``--rate`` with stratified seed labels on the control topic,
and reads the assignments topic to show documents assigned, the model version
and the running macro-F1 against the corpus' true labels (non-seed documents,
primary algorithm). While documents wait, each progress line says for what, from the
worker's ``/readyz`` (``serving.waiting``: the first model's seed and document gates, a fit
running, a backlog being read). Ctrl-C (or ``--docs N`` assigned) stops everything.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

from streamsemi.core import datasets
from streamsemi.core.messages import encode_json
from streamsemi.devtools.replay import (
    document_message,
    paced,
    primary_label,
    replay_order,
    seed_message,
    stratified_seeds,
)
from streamsemi.evaluation.metrics import macro_f1
from streamsemi.service.config import resolve
from streamsemi.service.kafka_io import assign_all, ensure_topics, make_producer, make_reader
from streamsemi.service.serving_state import worker_status


def _print(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def worker_metrics_url(log_path: str) -> str | None:
    """The worker's metrics server as its ``worker_starting`` log event names it (``--metrics-port 0``: any port).

    Parameters
    ----------
    log_path : str
        The worker's log file (JSON events, one a line).

    Returns
    -------
    str or None
        ``http://HOST:PORT``, or None until the worker has logged it.
    """
    try:
        with open(log_path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if '"worker_starting"' not in line:
                    continue
                try:
                    url = json.loads(line).get("metrics")
                except ValueError:
                    continue
                if isinstance(url, str) and url.endswith("/metrics"):
                    return url[: -len("/metrics")]
    except OSError:
        return None
    return None


def progress_line(sent: int, assigned: int, version: int, f1: float, status: dict[str, Any] | None,
                  worker_url: str | None) -> str:
    """One line of the demo's progress: counts, and what the worker waits for while documents wait.

    Parameters
    ----------
    sent, assigned : int
        Documents sent to the documents topic and first assignments read back.
    version : int
        The newest model version seen on the assignments topic.
    f1 : float
        Running macro-F1 of the non-seed documents (nan before the first).
    status : dict or None
        The worker's ``/readyz`` JSON (:func:`streamsemi.service.serving_state.worker_status`), None when
        it did not answer.
    worker_url : str or None
        The worker's metrics server (None: not known yet).

    Returns
    -------
    str
        The counts, then ``| <reason>`` whenever documents wait (from the worker's ``serving.waiting``),
        so that no line shows zero progress without saying why.
    """
    line = f"  sent {sent:6d} | assigned {assigned:6d} | model v{version} | macro-F1 (non-seed docs) {f1:.3f}"
    reason = None
    if status is None:
        if assigned < sent or not assigned:
            reason = ("waiting for the worker to start (its metrics server is not up yet)" if worker_url is None
                      else f"waiting for the worker's status ({worker_url}/readyz does not answer)")
    else:
        serving = status.get("serving") if isinstance(status.get("serving"), dict) else {}
        reason = serving.get("waiting")
        if not status.get("partitions_assigned") and (reason is None or not status.get("window")):
            reason = "waiting for the worker to join its consumer group (partitions not assigned yet)"
        if reason is None and not assigned:
            if not sent:
                reason = "waiting for the first documents to be sent"
            elif not status.get("window"):
                reason = "waiting for the first documents to reach the worker"
            else:
                reason = (f"waiting for the first outputs: model v{status.get('model_version', 0)} serves, "
                          "its assignments are on their way")
        if reason and status.get("refit_errors"):
            reason += f" (refit errors: {', '.join(sorted(status['refit_errors']))}; see the worker log)"
    return line + (f" | {reason}" if reason else "")


def _start_console(args: argparse.Namespace, bootstrap: str, settings: Any, log_fh: Any) -> tuple[Any, str]:
    """``streamsemi console`` beside the worker: (process or None, the line to print about it)."""
    port = getattr(args, "console_port", 8765)
    if port is None or port < 0:
        return None, "  console: off (--console-port -1)"
    cmd = [sys.executable, "-m", "streamsemi", "console", "--bootstrap-servers", bootstrap, "--port", str(port),
           "--worker-url", f"http://127.0.0.1:{args.metrics_port}",
           "--documents-topic", settings.documents_topic, "--control-topic", settings.control_topic,
           "--assignments-topic", settings.assignments_topic, "--deadletter-topic", settings.deadletter_topic]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log_fh, start_new_session=True)
    ready, _, _ = select.select([proc.stdout], [], [], 30.0)
    line = proc.stdout.readline() if ready else b""
    try:
        url = json.loads(line)["url"]
    except (ValueError, KeyError, TypeError):
        proc.kill()
        proc.wait()
        return None, ("  console: did not start (pip install 'streamsemi[console]'; port "
                      f"{port} free?); see the worker log")
    return proc, f"  console: {url}   (suggestions, clusters, seeds; Ctrl-C stops it too)"


def run_demo(args: argparse.Namespace) -> int:
    from streamsemi.devtools.broker import EmbeddedBroker

    ds = datasets.load(args.corpus)
    order = [int(i) for i in replay_order(ds, "auto", args.seed) if ds.texts[int(i)].strip()][: args.docs]
    seeds = stratified_seeds(ds, order, args.seed_fraction, args.seed)
    broker = None
    if args.bootstrap_servers:
        bootstrap = args.bootstrap_servers
    else:
        broker = EmbeddedBroker(port=args.port).start()
        bootstrap = broker.bootstrap_servers
    run_id = uuid.uuid4().hex[:8]
    settings = resolve({"bootstrap_servers": bootstrap, "algorithms": args.algorithms,
                        "documents_topic": f"demo.{run_id}.documents", "control_topic": f"demo.{run_id}.control",
                        "assignments_topic": f"demo.{run_id}.assignments", "deadletter_topic": f"demo.{run_id}.deadletter"})
    log_path = os.path.join(tempfile.gettempdir(), f"streamsemi-demo-{run_id}.log")
    worker = None
    console = None
    stop = threading.Event()

    def on_signal(_s: int, _f: Any) -> None:
        stop.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        ensure_topics(settings)
        cmd = [sys.executable, "-m", "streamsemi", "run", "--bootstrap-servers", bootstrap,
               "--algorithms", args.algorithms, "--group-id", f"demo-{run_id}",
               "--documents-topic", settings.documents_topic, "--control-topic", settings.control_topic,
               "--assignments-topic", settings.assignments_topic, "--deadletter-topic", settings.deadletter_topic,
               "--refit-every-docs", str(args.refit_every_docs), "--metrics-port", str(args.metrics_port),
               # a live stream at --rate, not a backlog: the documents that arrive while the first model is
               # fitted are labelled by it as soon as it is in (revisions follow), not held for the growth refit
               # fitted on them (Engine.holding_backlog: a slow first fit let the window double, and the first
               # labels waited one more fit); refit_every_docs keeps refitting as the window grows
               "--refit-growth", "0",
               "--session-timeout-ms", "6000", "--heartbeat-interval-ms", "1000", "--min-docs-first-refit",
               str(min(2000, max(300, len(order) // 3)))]
        with open(log_path, "ab") as log_fh:
            worker = subprocess.Popen(cmd, stdout=log_fh, stderr=log_fh, start_new_session=True)
        _print(f"streamsemi demo: broker {bootstrap}{' (embedded Tansu)' if broker else ''}, worker pid {worker.pid}, "
               f"corpus {ds.name} ({len(order)} documents, {len(seeds)} seeds, {args.rate:g} docs/s)")
        _print((f"  metrics: http://127.0.0.1:{args.metrics_port}/metrics   health: /healthz /readyz"
                if args.metrics_port else "  metrics: any free port (--metrics-port 0), shown once the worker is up")
               + f"   worker log: {log_path}")
        with open(log_path, "ab") as log_fh:
            console, console_line = _start_console(args, bootstrap, settings, log_fh)
        _print(console_line)

        sent = {"docs": 0}

        def produce() -> None:
            producer = make_producer(settings)
            for i in paced(order, args.rate):
                if stop.is_set():
                    break
                msg = document_message(ds, i)
                producer.send(settings.documents_topic, key=msg["id"].encode(), value=encode_json(msg))
                if i in seeds:
                    sm = seed_message(ds, i)
                    producer.send(settings.control_topic, key=sm["id"].encode(), value=encode_json(sm))
                sent["docs"] += 1
            producer.flush()
            producer.close()

        threading.Thread(target=produce, name="demo-producer", daemon=True).start()
        reader = make_reader(settings)
        assign_all(reader, settings.assignments_topic)
        truth: dict[str, str] = {}
        pred: dict[str, str] = {}
        first: dict[str, str] = {}
        used_version: dict[str, int] = {}
        revised_by: dict[str, int] = {}
        last_record = time.monotonic()
        reported = False
        version = 0
        assigned = 0
        last_print = 0.0
        done_at = None
        worker_url: str | None = None
        while not stop.is_set():
            for records in reader.poll(timeout_ms=500).values():
                for r in records:
                    try:
                        msg = json.loads(r.value)
                    except (TypeError, ValueError):
                        continue
                    if not msg.get("primary"):
                        continue
                    last_record = time.monotonic()
                    doc_id = msg["id"]
                    if int(msg.get("revision") or 0) > 0:   # a revised label: the latest one counts
                        version = max(version, int(msg.get("model_version", 0)))
                        if doc_id in pred:
                            pred[doc_id] = msg.get("label") or msg.get("cluster")
                            revised_by[doc_id] = int(msg.get("model_version", 0))
                        continue
                    assigned += 1
                    idx = int(doc_id.rsplit(":", 1)[1])
                    version = max(version, int(msg.get("model_version", 0)))
                    if idx not in seeds:
                        true = primary_label(ds.labels[idx])
                        if true is not None:
                            truth[doc_id] = true
                            pred[doc_id] = first[doc_id] = msg.get("label") or msg.get("cluster")
                            used_version[doc_id] = int(msg.get("model_version", 0))
            now = time.monotonic()
            if worker.poll() is not None:
                _print(f"the worker exited with code {worker.returncode}; see {log_path}")
                return 1
            if now - last_print >= 1.0:
                last_print = now
                ids = list(pred)
                f1 = macro_f1([truth[i] for i in ids], [pred[i] for i in ids]) if ids else float("nan")
                if worker_url is None:
                    worker_url = worker_metrics_url(log_path)
                    if worker_url is not None and not args.metrics_port:  # --metrics-port 0: now it is known
                        _print(f"  metrics: {worker_url}/metrics   health: /healthz /readyz")
                status = worker_status(worker_url, timeout_s=2.0) if worker_url else None
                _print(progress_line(sent["docs"], assigned, version, f1, status, worker_url))
            if assigned >= len(order) and done_at is None:
                done_at = now
                ids = list(pred)
                f1 = macro_f1([truth[i] for i in ids], [pred[i] for i in ids]) if ids else float("nan")
                _print(f"all {len(order)} documents assigned: latest-label macro-F1 so far {f1:.3f} on {len(ids)} non-seed documents, model v{version}")
                for v in sorted(set(used_version.values())):
                    vi = [i for i in ids if used_version[i] == v]
                    _print(f"  assigned by model v{v}: {len(vi):6d} documents, macro-F1 {macro_f1([truth[i] for i in vi], [first[i] for i in vi]):.3f}")
            if done_at is not None and not reported and now - last_record >= 6.0:  # revisions have settled
                reported = True
                ids = list(pred)
                if ids:
                    y = [truth[i] for i in ids]
                    _print(f"first-emission macro-F1 {macro_f1(y, [first[i] for i in ids]):.3f} | latest-label "
                           f"macro-F1 {macro_f1(y, [pred[i] for i in ids]):.3f} (with revisions) on {len(ids)} "
                           f"non-seed documents, model v{version}")
                    if revised_by:
                        _print(f"  {len(revised_by)} of them revised by a later model "
                               f"(v{min(revised_by.values())}..v{max(revised_by.values())}): a refit with more "
                               "documents and seeds changed their label")
                if args.docs is not None:
                    break
                _print("  (still running: Ctrl-C to stop)")
        reader.close()
        return 0
    finally:
        stop.set()
        if console is not None and console.poll() is None:
            console.send_signal(signal.SIGTERM)
            try:
                console.wait(15)
            except subprocess.TimeoutExpired:
                console.kill()
        if worker is not None and worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                worker.kill()
        if broker is not None:
            broker.stop()
        for s, h in old.items():
            signal.signal(s, h)
        _print("demo stopped (worker and broker shut down)")
