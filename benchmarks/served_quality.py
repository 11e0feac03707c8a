"""What users are served: the quality of the output topic of a real worker, against batch.

Five modes (``python benchmarks/served_quality.py MODE ...``):

``served`` (default)
    Starts the embedded broker (Tansu) and ``streamsemi run`` as a separate process
    with its default settings (only ``--algorithms`` is given; with several, the worker's
    default ``primary = auto`` applies; every algorithm's outputs are scored), replays each corpus in a seeded random order (``--docs`` documents, all
    of them when omitted) at full speed (``--rate 0``) and/or at a given rate, with a
    stratified ``--seed-fraction`` of seeds sent on the control topic just before
    their documents, reads the assignments topic until every (document, algorithm)
    pair has an assignment and the topic has been quiet for ``--idle`` seconds, and
    writes per enabled algorithm:

    * ``first``: macro-F1 of the first assignment emitted per (document, algorithm);
    * ``latest``: of the latest one (highest ``revision``, then ``model_version``,
      then arrival) at the end of the stream;
    * ``batch``: the same registry algorithm with the worker's parameters
      (:func:`streamsemi.algorithms.build_estimator`) fitted once in process on all
      the stream's documents, hashed as the worker does
      (:class:`streamsemi.core.features.TextFeaturizer`), with the same seeds;
    * documents served provisionally (outputs with ``"provisional": true``),
      revision messages per document (assignment records beyond the first per
      (document, algorithm)), and latency percentiles.

    Every figure scores the primary label (``label``, or the ``cluster`` name for a
    new cluster, which counts as wrong) of every non-seed document against the
    corpus' primary label with :func:`streamsemi.evaluation.metrics.macro_f1_known`
    over the corpus' classes (so a new-N cluster is a miss, never mapped to a
    class). River's multinomial naive Bayes, prequential on the same stream
    (:func:`streamsemi.evaluation.stream.replay_river`), is the floor.

    Latency = output record timestamp - document record timestamp. The benchmark
    stamps each document record's CreateTime itself at send time
    (``timestamp_ms``); the worker's producer stamps each output record's
    CreateTime when it sends it; the type found on the output records (CreateTime or
    LogAppendTime) is written in the results. "Fresh" documents are those sent after
    the algorithm's first output existed (the others waited for the first model; the primary
    serves before the other algorithms' first models are in, and their first output of those
    documents is a revision).

``engine``
    The same stream replayed in process through :class:`streamsemi.engine.Engine`
    (``background_refit=False``, worker default settings, drift refits off, batches
    of ``--batch`` documents): per model version, when it was fitted (window size,
    seeds, seeded classes) and how many documents it labelled at what macro-F1; and
    what revisions would give: every document in the window at the end re-assigned
    by the last model, and by one more model fitted at the end.

``gating``
    In process too: the first refit is held until the seeds cover K classes with M
    seeds each and the window has ``min_docs`` documents (the settings
    ``min_seed_classes`` / ``min_seeds_per_class`` the implementation will add);
    for each (K, M, min_docs) the served macro-F1 and how long documents waited for
    their first label (in documents, and in seconds at ``--rate``).

``pseudo-lsc``
    Multi-label Reuters-21578 (``--docs`` documents with topics, time order,
    ``--seed-fraction`` seeds): how many label sets pseudo-LSC predicts with more
    than one label and their example-based F1, for its decision rules, against
    constrained k-means (one label per document).

``queue``
    ``served`` (default worker settings, ``--primary`` from ``--primaries``, one run
    each), then a simulated person works the suggestion queue through the
    broker: ``--rounds`` times (or until ``--budget`` labels), the top ``--k`` suggestions of
    the newest model get their corpus labels on the control topic and the worker's next refit
    round is awaited (:func:`queue_annotator`). Scored at the end on the documents neither
    seeded nor labelled from the queue: what the primary serves (the latest record flagged
    ``primary`` per document, whichever algorithm wrote it) and each algorithm's latest
    label; the worker's ``primary_changed`` events and, per round, its seed-accuracy gauges.

Results: ``benchmarks/results/served_quality[_MODE][_TAG].json`` and ``.md``.

Examples::

    python benchmarks/served_quality.py served --corpora r8 --algorithms constrained-kmeans
    python benchmarks/served_quality.py served --corpora r8,20ng --rate 0,200 \\
        --algorithms constrained-kmeans,semi-ldc,cle,d-lda,fsl-ck,pseudo-lsc
    python benchmarks/served_quality.py served --quick          # a smoke check (300 R8 documents)
    python benchmarks/served_quality.py engine --corpora r8,20ng
    python benchmarks/served_quality.py gating --corpora r8,20ng
    python benchmarks/served_quality.py pseudo-lsc --docs 3000 --seed-fraction 0.1
    python benchmarks/served_quality.py queue --corpora r8 --seed-fraction 0.01 \\
        --algorithms constrained-kmeans,semi-ldc,cle --primaries auto,constrained-kmeans --rounds 10 --k 10
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from streamsemi.algorithms import MULTILABEL, build_estimator
from streamsemi.core import datasets
from streamsemi.core.features import TextFeaturizer
from streamsemi.core.messages import Document, encode_json
from streamsemi.devtools.broker import EmbeddedBroker, free_port
from streamsemi.devtools.replay import (
    document_message,
    paced,
    primary_label,
    replay_order,
    seed_message,
    stratified_seeds,
)
from streamsemi.evaluation.metrics import macro_f1_known

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench  # noqa: E402

RESULTS = _bench.RESULTS
CORPORA = {"r8": "reuters-r8", "20ng": "20newsgroups", "r52": "reuters-r52", "r21578": "reuters21578"}
DEFAULT_DOCS = {"r8": None, "20ng": 8000}
SIX = "constrained-kmeans,semi-ldc,cle,d-lda,fsl-ck,pseudo-lsc"


# ---------------------------------------------------------------- the stream
@dataclass
class Stream:
    """A corpus replay: documents in order, which are seeds, their true labels."""

    alias: str
    ds: datasets.Dataset
    order: list[int]
    seeds: set[int]
    seed_fraction: float

    @property
    def ids(self) -> list[str]:
        return [f"{self.ds.name}:{i}" for i in self.order]

    def truth(self, i: int) -> str | None:
        return primary_label(self.ds.labels[i])

    def describe(self) -> dict[str, Any]:
        counts = Counter(self.truth(i) for i in self.order)
        seed_counts = Counter(self.truth(i) for i in self.seeds)
        return {"corpus": self.ds.name, "documents": len(self.order), "seeds": len(self.seeds),
                "seed_fraction": self.seed_fraction, "classes": len(counts),
                "class_sizes": dict(counts.most_common()), "seeds_per_class": dict(seed_counts.most_common())}


def make_stream(alias: str, docs: int | None, seed_fraction: float, seed: int, order: str = "random",
                need_labels: bool = False) -> Stream:
    """``docs`` documents of corpus ``alias`` (non-empty text) in the replay order, with stratified seeds."""
    ds = datasets.load(CORPORA.get(alias, alias))
    idx = [int(i) for i in replay_order(ds, order, seed) if ds.texts[int(i)].strip()
           and (not need_labels or primary_label(ds.labels[int(i)]) is not None)]
    idx = idx[:docs] if docs else idx
    return Stream(alias, ds, idx, stratified_seeds(ds, np.asarray(idx), seed_fraction, seed), seed_fraction)


def score(y_true: list[str], y_pred: list[Any]) -> float:
    """Macro-F1 over the true classes; predictions that are not class names (new-N) are misses."""
    if not y_true:
        return float("nan")
    return macro_f1_known(y_true, [str(p) for p in y_pred], sorted(set(y_true)))


def served_label(msg: dict) -> str:
    """The primary label an output record serves (a new cluster's name when it is not a class)."""
    return str(msg.get("label") if msg.get("label") is not None else msg.get("cluster"))


# ---------------------------------------------------------------- batch and floor
def featurize(stream: Stream) -> tuple[Any, np.ndarray]:
    """Hashed counts of the stream's documents as the worker hashes them, and which rows have terms."""
    X = TextFeaturizer().transform([stream.ds.texts[i] for i in stream.order], update_sketch=False)
    return X, np.diff(X.indptr) > 0


def seeded_stream(alias: str, docs: int | None, seed: int, seed_fraction: float = 0.05,
                  ) -> tuple[Stream, Any, np.ndarray, np.ndarray, list[str | None]]:
    """A stream (:func:`make_stream`) ready for an in-process fit: the stream, its hashed counts
    (:func:`featurize`), the rows with terms, which of them are seeds, and the fit's labels (the
    seeds' classes, None for the others)."""
    st = make_stream(alias, docs, seed_fraction, seed)
    X, keep = featurize(st)
    rows = np.flatnonzero(keep)
    seeded = np.array([st.order[r] in st.seeds for r in rows])
    y = [st.truth(st.order[r]) if s else None for r, s in zip(rows, seeded, strict=True)]
    return st, X, rows, seeded, y


def batch_predictions(stream: Stream, algorithm: str, X: Any, keep: np.ndarray) -> tuple[list[str], float]:
    """The algorithm fitted once on every document with the seeds; primary label per document (kept rows)."""
    rows = np.flatnonzero(keep)
    seeded = [stream.order[r] in stream.seeds for r in rows]
    if algorithm in MULTILABEL:
        raw = [stream.ds.labels[stream.order[r]] for r in rows]
        y: list[Any] = [([str(x) for x in lab] if isinstance(lab, (list, tuple)) else [str(lab)]) if s else []
                        for lab, s in zip(raw, seeded, strict=True)]
    else:
        y = [stream.truth(stream.order[r]) if s else None for r, s in zip(rows, seeded, strict=True)]
    est = build_estimator(algorithm, None, 0, 0)
    t0 = time.perf_counter()
    est.fit(X[rows], y)
    seconds = time.perf_counter() - t0
    P = np.asarray(est.predict_proba(X[rows]))
    classes = np.asarray([str(c) for c in est.classes_], dtype=object)
    return list(classes[P.argmax(axis=1)]), seconds


def river_prequential(stream: Stream) -> float:
    """River MultinomialNB: predict each non-seed document before it passes, learn every seed (macro-F1)."""
    from streamsemi.evaluation.protocols import PROTOCOLS, Draw
    from streamsemi.evaluation.stream import replay_river

    y = [stream.truth(i) for i in stream.order]
    draw = Draw(rows=np.arange(len(stream.order)), y_true=y,
                seed_mask=np.array([i in stream.seeds for i in stream.order]),
                known=sorted(set(y)), n_new=0, classes=sorted(set(y)))
    data = SimpleNamespace(spec=SimpleNamespace(kind="single"), texts=[stream.ds.texts[i] for i in stream.order])
    preq, _, _ = replay_river(PROTOCOLS["semi-ldc"], data, draw, np.arange(len(stream.order)), None)
    return float(preq["macro_f1"])


# ---------------------------------------------------------------- served (broker + worker process)
def _http(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _wait_assigned(port: int, proc: subprocess.Popen, timeout: float = 90.0) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"the worker exited with code {proc.returncode}")
        try:
            _, body = _http(port, "/readyz")
            if json.loads(body).get("partitions_assigned"):
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.3)
    raise RuntimeError("the worker was not assigned its partitions in time")


def _worker_settled(port: int) -> tuple[bool, str]:
    """(settled, fingerprint) from the worker's metrics: no refit running, no revision pending, nothing buffered.

    The fingerprint (model versions) changes when a refit lands: the run ends only when it
    stayed the same, with no new output, for ``--idle`` seconds.
    """
    try:
        _, body = _http(port, "/metrics")
    except OSError:
        return False, ""
    gauges: dict[str, float] = {}
    versions = []
    for line in body.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, value = line.rpartition(" ")
        if name.startswith("streamsemi_model_version{"):
            versions.append(f"{name}={value}")
        try:
            gauges[name] = float(value)
        except ValueError:
            continue
    busy = (gauges.get("streamsemi_refit_in_progress", 0.0) or gauges.get("streamsemi_revisions_pending", 0.0)
            or gauges.get("streamsemi_buffered_documents", 0.0))
    return not busy, ";".join(sorted(versions))


def _worker_events(log_path: Path) -> list[dict]:
    out = []
    for line in log_path.read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get("event") in ("refit_done", "refit_round_done", "refit_failed",
                                                           "fallback_in_use", "drift_detected", "primary_changed"):
            out.append(rec)
    return out


def served_run(stream: Stream, algorithms: list[str], rate: float, idle_s: float, timeout_s: float,
               work_dir: Path, n_assignable: int | None = None, worker_args: Sequence[str] = (),
               annotate: Callable[[dict[str, Any]], Any] | None = None) -> dict[str, Any]:
    """One replay through a worker process; the raw records (not yet scored).

    ``n_assignable``: documents with indexable terms (the others are dead-lettered, never
    assigned); the run waits for an assignment of each of them per algorithm.
    ``worker_args``: more ``streamsemi run`` options. ``annotate``: called once the stream
    has been served and the worker settled, with a context (``producer``, ``topics``,
    ``settings``, ``port``, ``settle``: a function that waits until the worker settles
    again); what it returns is the run's ``annotation``, and the run settles once more.
    """
    from streamsemi.service.config import resolve
    from streamsemi.service.kafka_io import assign_all, ensure_topics, make_producer, make_reader

    broker = EmbeddedBroker(log_file=work_dir / "tansu.log").start()
    prefix = "sq" + uuid.uuid4().hex[:8]
    kinds = ("documents", "control", "assignments", "deadletter") + (("suggestions",) if annotate else ())
    topics = {k: f"{prefix}.{k}" for k in kinds}
    settings = resolve({"bootstrap_servers": broker.bootstrap_servers,
                        **{f"{k}_topic": v for k, v in topics.items()}})
    port = free_port()
    log_path = work_dir / f"worker-{prefix}.log"
    cmd = [sys.executable, "-m", "streamsemi", "run", "--bootstrap-servers", broker.bootstrap_servers,
           "--algorithms", ",".join(algorithms), "--group-id", f"{prefix}-group", "--metrics-port", str(port),
           *[x for k, v in topics.items() for x in (f"--{k}-topic", v)], *worker_args]
    annotation: Any = None
    records: list[tuple[dict, int, int, float]] = []
    stop = threading.Event()
    worker = None
    try:
        ensure_topics(settings)
        with open(log_path, "ab") as fh:
            worker = subprocess.Popen(cmd, stdout=fh, stderr=fh)
        _wait_assigned(port, worker)
        reader = make_reader(settings)
        assign_all(reader, topics["assignments"])

        def read() -> None:
            while not stop.is_set():
                for batch in reader.poll(timeout_ms=300).values():
                    now = time.time()
                    for r in batch:
                        try:
                            records.append((json.loads(r.value), int(r.timestamp), int(r.timestamp_type), now))
                        except (TypeError, ValueError):
                            continue
            reader.close()

        reader_thread = threading.Thread(target=read, name="served-reader", daemon=True)
        reader_thread.start()
        producer = make_producer(settings)
        sent_ms: dict[str, int] = {}
        t_start = time.time()
        for i in paced(stream.order, rate):
            msg = document_message(stream.ds, i)
            if i in stream.seeds:
                sm = seed_message(stream.ds, i)
                producer.send(topics["control"], key=sm["id"].encode(), value=encode_json(sm))
            ms = int(time.time() * 1000)
            producer.send(topics["documents"], key=msg["id"].encode(), value=encode_json(msg), timestamp_ms=ms)
            sent_ms[msg["id"]] = ms
        producer.flush()
        produce_s = time.time() - t_start
        expected = (len(stream.order) if n_assignable is None else n_assignable) * len(algorithms)

        def settle() -> None:
            t0 = time.monotonic()
            seen: tuple[int, str] = (-1, "")
            last_change = time.monotonic()
            while time.monotonic() - t0 < timeout_s:
                if worker.poll() is not None:
                    raise RuntimeError(f"the worker exited with code {worker.returncode}; see {log_path}")
                pairs = {(m["id"], m["algorithm"]) for m, _, _, _ in list(records)}
                settled, versions = _worker_settled(port)
                if (len(records), versions) != seen or not settled:  # a refit or a revision pass is still under way
                    seen, last_change = (len(records), versions), time.monotonic()
                quiet = time.monotonic() - last_change
                if (len(pairs) >= expected and quiet >= idle_s) or quiet >= max(60.0, 4 * idle_s):
                    break  # (the second: a document the worker dead-lettered, e.g. one over the size limits)
                time.sleep(0.5)

        settle()
        if annotate is not None:
            annotation = annotate({"producer": producer, "topics": topics, "settings": settings, "port": port,
                                   "settle": settle})
            settle()
        producer.close()
        stop.set()
        reader_thread.join(10)
    finally:
        stop.set()
        if worker is not None and worker.poll() is None:
            worker.terminate()
            try:
                worker.wait(60)
            except subprocess.TimeoutExpired:
                worker.kill()
        broker.stop()
    return {"records": records, "sent_ms": sent_ms, "t_start": t_start, "produce_s": produce_s,
            "events": _worker_events(log_path), "log": str(log_path), "command": cmd, "annotation": annotation}


def _key(msg: dict, arrival: int) -> tuple:
    return (int(msg.get("revision") or 0), int(msg.get("model_version") or 0), arrival)


def _pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 3) if values else None


def score_served(stream: Stream, algorithms: list[str], run: dict[str, Any], X: Any, keep: np.ndarray,
                 batch_cache: dict[tuple[str, str], tuple[list[str], float]]) -> dict[str, Any]:
    """First / latest / batch, provisional and revision counts, latency, per model version."""
    ids = stream.ids
    idx_of = {doc_id: i for doc_id, i in zip(ids, stream.order, strict=True)}
    nonseed = [doc_id for doc_id, i in zip(ids, stream.order, strict=True)
               if i not in stream.seeds and stream.truth(i) is not None]
    rows_kept = {doc_id for doc_id, k in zip(ids, keep, strict=True) if k}
    out: dict[str, Any] = {}
    ts_types = Counter(t for _, _, t, _ in run["records"])
    for name in algorithms:
        first: dict[str, tuple[dict, int]] = {}
        latest: dict[str, tuple[tuple, dict, int]] = {}
        n_records: Counter[str] = Counter()
        provisional: set[str] = set()
        for k, (msg, ts, _, _) in enumerate(run["records"]):
            if msg.get("algorithm") != name or msg.get("id") not in idx_of:
                continue
            doc_id = msg["id"]
            n_records[doc_id] += 1
            first.setdefault(doc_id, (msg, ts))
            key = _key(msg, k)
            if doc_id not in latest or key > latest[doc_id][0]:
                latest[doc_id] = (key, msg, ts)
            if msg.get("provisional"):
                provisional.add(doc_id)
        scored = [d for d in nonseed if d in first]
        y = [stream.truth(idx_of[d]) for d in scored]
        res: dict[str, Any] = {
            "documents_assigned": len(first), "documents_expected": len(ids),
            "non_seed_scored": len(scored),
            "first": score(y, [served_label(first[d][0]) for d in scored]),
            "latest": score(y, [served_label(latest[d][1]) for d in scored]),
            "provisional_documents": len(provisional),
            "revisions_per_document": (sum(n_records.values()) - len(n_records)) / max(len(n_records), 1),
        }
        if (stream.alias, name) not in batch_cache:
            try:
                batch_cache[(stream.alias, name)] = batch_predictions(stream, name, X, keep)
            except Exception as exc:  # noqa: BLE001 - keep the served figures when the in-process fit fails
                batch_cache[(stream.alias, name)] = ([], -1.0)
                res["batch_error"] = f"{type(exc).__name__}: {exc}"
        bpred, bsec = batch_cache[(stream.alias, name)]
        if bpred:
            bmap = dict(zip([d for d in ids if d in rows_kept], bpred, strict=True))
            bscored = [d for d in nonseed if d in bmap]
            res["batch"] = score([stream.truth(idx_of[d]) for d in bscored], [bmap[d] for d in bscored])
            res["batch_fit_seconds"] = round(bsec, 2)
        else:
            res["batch"] = float("nan")
        # latency: output CreateTime/LogAppendTime - document CreateTime (both stamped on this host)
        if first:
            t_first_out = min(ts for _, ts in first.values())
            lat_all = [(ts - run["sent_ms"][d]) / 1000 for d, (_, ts) in first.items()]
            fresh = [(ts - run["sent_ms"][d]) / 1000 for d, (_, ts) in first.items() if run["sent_ms"][d] >= t_first_out]
            res["latency_s"] = {"p50_all": _pct(lat_all, 50), "p99_all": _pct(lat_all, 99),
                                "fresh_documents": len(fresh), "p50_fresh": _pct(fresh, 50),
                                "p99_fresh": _pct(fresh, 99), "max_fresh": _pct(fresh, 100),
                                "first_output_after_s": round((t_first_out / 1000) - run["t_start"], 2)}
        per_version: dict[int, list[str]] = {}
        for d in scored:
            per_version.setdefault(int(first[d][0].get("model_version") or 0), []).append(d)
        res["per_version"] = {
            str(v): {"documents": len(ds_), "macro_f1": score([stream.truth(idx_of[d]) for d in ds_],
                                                              [served_label(first[d][0]) for d in ds_]),
                     "fallback": sum(1 for d in ds_ if first[d][0].get("fallback"))}
            for v, ds_ in sorted(per_version.items())}
        res["refits"] = [{k: e.get(k) for k in ("version", "documents", "seeds", "seconds", "trigger", "ts")}
                         for e in run["events"] if e.get("event") == "refit_done" and e.get("algorithm") == name]
        out[name] = res
    return {"algorithms": out, "output_timestamp_types": {("LogAppendTime" if t == 1 else "CreateTime"): n
                                                          for t, n in ts_types.items()},
            "produce_seconds": round(run["produce_s"], 2), "worker_log": run["log"],
            "failures": [e for e in run["events"] if e.get("event") in ("refit_failed", "fallback_in_use")][:20],
            "drift_refits": sum(1 for e in run["events"] if e.get("event") == "drift_detected")}


def mode_served(args: argparse.Namespace) -> dict[str, Any]:
    algorithms = args.algorithms.split(",")
    rates = [float(r) for r in args.rate.split(",")]
    work_dir = Path(args.work_dir or "/tmp") / f"served-quality-{uuid.uuid4().hex[:6]}"
    work_dir.mkdir(parents=True, exist_ok=True)
    runs = []
    batch_cache: dict[tuple[str, str], tuple[list[str], float]] = {}
    for alias in args.corpora.split(","):
        stream = make_stream(alias, args.docs if args.docs else DEFAULT_DOCS.get(alias), args.seed_fraction, args.seed)
        X, keep = featurize(stream)
        floor = river_prequential(stream)
        for rate in rates:
            print(f"[served] {alias}: {len(stream.order)} documents, {len(stream.seeds)} seeds, "
                  f"rate {_rate(rate)}, {','.join(algorithms)}", flush=True)
            t0 = time.monotonic()
            raw_path = Path(args.from_raw) if args.from_raw else None
            if raw_path is not None:
                run = json.loads(raw_path.read_text())
            else:
                run = served_run(stream, algorithms, rate, args.idle, args.timeout, work_dir, int(np.sum(keep)),
                                 worker_args=shlex.split(args.worker_args))
                raw_path = work_dir / f"raw-{alias}-{rate:g}.json"
                raw_path.write_text(json.dumps(run))
            print(f"  raw records: {raw_path} (rescore with --from-raw)", flush=True)
            res = score_served(stream, algorithms, run, X, keep, batch_cache)
            res.update(stream=stream.describe(), corpus=alias, rate=rate, river_mnb_prequential=floor,
                       seconds=round(time.monotonic() - t0, 1))
            runs.append(res)
            for name, r in res["algorithms"].items():
                print(f"  {name:20s} first {r['first']:.3f} latest {r['latest']:.3f} batch {r['batch']:.3f} "
                      f"assigned {r['documents_assigned']}/{r['documents_expected']} "
                      f"p99 fresh {r.get('latency_s', {}).get('p99_fresh')}", flush=True)
    return {"runs": runs}


# ---------------------------------------------------------------- queue (a person works the suggestion queue)
def _gauges(port: int, names: Sequence[str]) -> dict[str, dict[str, float]]:
    """``{name: {algorithm: value}}`` of the worker's gauges ``names`` (one read of its ``/metrics``)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, dict[str, float]] = {name: {} for name in names}
    try:
        _, body = _http(port, "/metrics")
    except OSError:
        return out
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            if sample.name in out:
                out[sample.name][sample.labels.get("algorithm", "")] = float(sample.value)
    return out


def queue_annotator(stream: Stream, rounds: int, k: int,
                    budget: int | None = None) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A simulated person at the console's queue: ``rounds`` times, label the top ``k`` suggestions of the newest model.

    ``budget``: at most this many labels in all (the last round is cut short, and the
    rounds stop there).

    Reads the compacted suggestions topic from the start (a tombstone removes an id),
    takes the ``k`` best-ranked suggestions of the newest model version it has not labelled
    yet, sends their corpus labels on the control topic (as ``streamsemi label`` or the
    console do), then waits for the worker's next refit round (``refit_idle_s`` after the
    labels) and for it to settle.
    """
    from streamsemi.service.kafka_io import assign_all, make_reader

    def annotate(ctx: dict[str, Any]) -> dict[str, Any]:
        reader = make_reader(ctx["settings"])
        assign_all(reader, ctx["topics"]["suggestions"])
        board: dict[str, dict | None] = {}
        done: list[str] = []
        log: list[dict[str, Any]] = []

        def drain(quiet_s: float = 3.0, timeout_s: float = 60.0) -> None:
            t0 = last = time.monotonic()
            while time.monotonic() - last < quiet_s and time.monotonic() - t0 < timeout_s:
                for batch in reader.poll(timeout_ms=300).values():
                    for r in batch:
                        key = r.key.decode() if r.key else ""
                        try:
                            board[key] = None if r.value is None else json.loads(r.value)
                        except ValueError:
                            continue
                        last = time.monotonic()

        index = {doc_id: i for doc_id, i in zip(stream.ids, stream.order, strict=True)}
        for r in range(rounds):
            room = k if budget is None else min(k, budget - len(done))
            if room <= 0:
                break
            drain()
            live = [m for m in board.values() if m and m.get("id") not in done]
            if not live:
                log.append({"round": r, "suggestions": 0})
                break
            version = max(int(m["model_version"]) for m in live)
            picked = sorted((m for m in live if int(m["model_version"]) == version), key=lambda m: m["rank"])[:room]
            for m in picked:
                msg = seed_message(stream.ds, index[m["id"]])
                ctx["producer"].send(ctx["topics"]["control"], key=msg["id"].encode(), value=encode_json(msg))
            ctx["producer"].flush()
            done.extend(m["id"] for m in picked)
            _, before = _worker_settled(ctx["port"])
            t0 = time.monotonic()
            while _worker_settled(ctx["port"])[1] == before and time.monotonic() - t0 < 300:
                time.sleep(0.5)   # the labels' refit round (refit_idle_s after them)
            ctx["settle"]()
            gauges = _gauges(ctx["port"], ("streamsemi_primary", "streamsemi_seed_accuracy",
                                           "streamsemi_suggested_seed_accuracy"))
            log.append({"round": r, "model_version": version, "labelled": len(picked),
                        "reasons": dict(Counter(m["reason"] for m in picked)),
                        "primary_right": sum(m["label"] == stream.truth(index[m["id"]]) for m in picked),
                        "primary": [a for a, v in gauges["streamsemi_primary"].items() if v == 1],
                        "seed_accuracy": gauges["streamsemi_seed_accuracy"],
                        "suggested_seed_accuracy": gauges["streamsemi_suggested_seed_accuracy"]})
            print(f"  round {r}: labelled {len(picked)} of version {version} {log[-1]['reasons']}, "
                  f"primary now {log[-1]['primary']}", flush=True)
        reader.close()
        return {"labelled": done, "rounds": log}

    return annotate


def score_queue(stream: Stream, algorithms: list[str], run: dict[str, Any]) -> dict[str, Any]:
    """Macro-F1 of what is served at the end on the documents nobody labelled: the primary's, and each algorithm's."""
    idx_of = {doc_id: i for doc_id, i in zip(stream.ids, stream.order, strict=True)}
    labelled = set(run["annotation"]["labelled"]) if run.get("annotation") else set()
    rest = [d for d, i in idx_of.items() if i not in stream.seeds and d not in labelled and stream.truth(i) is not None]
    latest: dict[str, dict[str, dict]] = {a: {} for a in algorithms}
    served: dict[str, dict] = {}
    for msg, _, _, _ in run["records"]:   # arrival order: one document's records share a partition
        doc_id = msg.get("id")
        if doc_id not in idx_of:
            continue
        if msg.get("algorithm") in latest:
            latest[msg["algorithm"]][doc_id] = msg
        if msg.get("primary"):
            served[doc_id] = msg
    y = [stream.truth(idx_of[d]) for d in rest]
    served_by = Counter(served[d]["algorithm"] for d in rest if d in served)
    return {"documents_scored": len(rest), "labelled_from_queue": len(labelled),
            "served_primary": score(y, [served_label(served[d]) if d in served else None for d in rest]),
            "served_primary_algorithms": dict(served_by),
            "latest": {a: score(y, [served_label(latest[a][d]) if d in latest[a] else None for d in rest])
                       for a in algorithms},
            "primary_changes": [{k: e.get(k) for k in ("previous", "primary", "accuracy", "previous_accuracy", "source")}
                                for e in run["events"] if e.get("event") == "primary_changed"],
            "rounds": run["annotation"]["rounds"] if run.get("annotation") else []}


def mode_queue(args: argparse.Namespace) -> dict[str, Any]:
    """``served`` with a person at the suggestion queue afterwards: one run per ``--primaries`` value."""
    algorithms = args.algorithms.split(",")
    work_dir = Path(args.work_dir or "/tmp") / f"served-queue-{uuid.uuid4().hex[:6]}"
    work_dir.mkdir(parents=True, exist_ok=True)
    runs = []
    for alias in args.corpora.split(","):
        stream = make_stream(alias, args.docs if args.docs else DEFAULT_DOCS.get(alias), args.seed_fraction, args.seed)
        _, keep = featurize(stream)
        for primary in args.primaries.split(","):
            print(f"[queue] {alias}: {len(stream.order)} documents, {len(stream.seeds)} seeds, primary {primary}, "
                  f"{args.rounds} rounds of {args.k} labels, {','.join(algorithms)}", flush=True)
            t0 = time.monotonic()
            run = served_run(stream, algorithms, 0.0, args.idle, args.timeout, work_dir, int(np.sum(keep)),
                             worker_args=["--primary", primary, "--suggestions-top-n", str(max(args.k, 20))],
                             annotate=queue_annotator(stream, args.rounds, args.k, args.budget))
            res = score_queue(stream, algorithms, run)
            res.update(corpus=alias, primary_setting=primary, stream=stream.describe(),
                       seconds=round(time.monotonic() - t0, 1), worker_log=run["log"])
            runs.append(res)
            print(f"  served (primary) {res['served_primary']:.3f} by {res['served_primary_algorithms']}; latest "
                  + ", ".join(f"{a} {v:.3f}" for a, v in res["latest"].items())
                  + f"; primary changes {[(c['previous'], c['primary']) for c in res['primary_changes']]}", flush=True)
    return {"runs": runs}


def queue_markdown(result: dict[str, Any]) -> str:
    algorithms = list(result["runs"][0]["latest"]) if result["runs"] else []
    lines = ["Macro-F1 at the end on the documents neither seeded nor labelled from the queue.", "",
             "| corpus | primary | labelled from queue | served (primary) | served by | "
             + " | ".join(f"latest {a}" for a in algorithms) + " | primary changes |",
             "|---|---|---:|---:|---|" + "---:|" * len(algorithms) + "---|"]
    for r in result["runs"]:
        changes = ", ".join(f"{c['previous']} -> {c['primary']}" for c in r["primary_changes"]) or "none"
        by = ", ".join(f"{a} {n}" for a, n in r["served_primary_algorithms"].items())
        lines.append(f"| {r['corpus']} | {r['primary_setting']} | {r['labelled_from_queue']} | {r['served_primary']:.3f} "
                     f"| {by} | " + " | ".join(f"{r['latest'][a]:.3f}" for a in algorithms) + f" | {changes} |")
    return "\n".join(lines) + "\n"


def _rate(rate: float) -> str:
    return "full speed" if not rate else f"{rate:g}/s"


def served_markdown(result: dict[str, Any]) -> str:
    lines = ["| corpus | rate | algorithm | first | latest | batch | River MNB (preq.) | provisional docs "
             "| revisions/doc | p99 fresh (s) | p99 all (s) | assigned |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for run in result["runs"]:
        for name, r in run["algorithms"].items():
            lat = r.get("latency_s", {})
            lines.append(
                f"| {run['corpus']} ({run['stream']['documents']}) | {_rate(run['rate'])} "
                f"| {name} | {r['first']:.3f} | {r['latest']:.3f} | {r['batch']:.3f} | {run['river_mnb_prequential']:.3f} "
                f"| {r['provisional_documents']} | {r['revisions_per_document']:.3f} | {lat.get('p99_fresh')} "
                f"| {lat.get('p99_all')} | {r['documents_assigned']}/{r['documents_expected']} |")
    lines.append("")
    lines.append("Per model version (first assignments, non-seed documents): documents / macro-F1")
    lines.append("")
    for run in result["runs"]:
        for name, r in run["algorithms"].items():
            parts = [f"v{v}: {x['documents']} / {x['macro_f1']:.3f}" for v, x in r["per_version"].items()]
            lines.append(f"- {run['corpus']} {_rate(run['rate'])} {name}: "
                         + "; ".join(parts))
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- in process: the engine
#: The refit and revision policy of the worker at commit ac1fe4f (``--profiles legacy``): first refit
#: at ``min_docs_first_refit`` documents once 2 classes are seeded, then every ``refit_every_docs``; no growth
#: or idle refits, no revisions. Applied only for the settings the engine in use has.
LEGACY = {"min_seed_classes": 2, "min_seeds_per_class": 1, "first_fit_stable_seeds": 0, "refit_growth": 0.0, "refit_idle_s": 0.0,
          "revisions": "off"}


def _engine(algorithm: str, n_docs: int, profile: str = "legacy", **overrides: Any) -> Any:
    import dataclasses

    from streamsemi.engine import Engine, EngineConfig

    names = {f.name for f in dataclasses.fields(EngineConfig)}
    base = {k: v for k, v in LEGACY.items() if k in names} if profile == "legacy" else {}
    cfg = EngineConfig(algorithms=[algorithm], background_refit=False, drift_detection=False, explain_words=0,
                       max_buffered_docs=max(20000, n_docs + 1), **{**base, **overrides})
    offset = [0.0]
    eng = Engine(cfg, clock=lambda: time.time() + offset[0])
    eng._bench_clock_offset = offset  # engine_replay fast-forwards this to let idle refits happen
    return eng


def engine_replay(stream: Stream, algorithm: str, batch: int, gate: tuple[int, int, int] | None = None,
                  rate: float = 200.0, profile: str = "legacy", **overrides: Any) -> dict[str, Any]:
    """Replay through an in-process Engine; first assignment per document, refit log, revision figures.

    ``gate`` = (K classes, M seeds per class, min_docs): the first refit waits until
    the seeds cover K classes with at least M seeds each and the window holds
    min_docs documents (then refits follow ``refit_every_docs`` as usual); at the
    end of the stream a first refit is forced if the gate never opened.
    """
    ids = stream.ids
    idx_of = {doc_id: i for doc_id, i in zip(ids, stream.order, strict=True)}
    pos_of = {doc_id: p for p, doc_id in enumerate(ids)}
    engine_gate = gate is not None and profile == "current"
    if engine_gate:  # the engine's own settings (min_seed_classes, min_seeds_per_class)
        k, m, min_docs = gate
        overrides.update(min_seed_classes=k, min_seeds_per_class=m, min_docs_first_refit=min_docs)
        gate = None
    elif gate is not None:  # emulated: hold the first refit until the gate opens
        overrides["min_docs_first_refit"] = 10**9
    eng = _engine(algorithm, len(ids), profile, **overrides)
    first: dict[str, tuple[str, int, int]] = {}  # id -> (label, version, position when assigned)
    label_sets: dict[str, set[str]] = {}  # id -> the label set served (multi-label models: the chosen labels)
    refits: list[dict[str, Any]] = []
    fit_seconds = 0.0
    seen_versions = 0

    def note_refit(pos: int, secs: float) -> None:
        nonlocal seen_versions
        slot = eng.models.get(algorithm)
        if slot is not None and slot.version != seen_versions:
            seen_versions = slot.version
            counts = eng.seed_classes()
            refits.append({"version": slot.version, "at_document": pos, "train_documents": slot.n_train,
                           "window": len(eng.window), "seeds": len(eng.seeds), "seeded_classes": len(counts),
                           "seeds_per_class": dict(sorted(counts.items(), key=lambda kv: -kv[1])),
                           "fit_seconds": round(secs, 3)})

    latest: dict[str, tuple[tuple[int, int], str]] = {}
    n_outputs = 0
    n_provisional = 0

    def take(assignments: list[Any], pos: int) -> None:
        nonlocal n_outputs, n_provisional
        for a in assignments:
            n_outputs += 1
            n_provisional += int(bool(getattr(a, "provisional", False)))
            key = (int(getattr(a, "revision", 0) or 0), int(a.model_version))
            if a.id not in latest or key >= latest[a.id][0]:
                latest[a.id] = (key, a.label if a.label is not None else a.cluster)
            if a.id not in first:
                first[a.id] = (a.label if a.label is not None else a.cluster, a.model_version, pos)
                label_sets[a.id] = set(a.labels) if eng.models[algorithm].multilabel else {first[a.id][0]}

    gate_open_at = None
    for start in range(0, len(ids), batch):
        chunk = stream.order[start:start + batch]
        docs = []
        for i in chunk:
            doc_id = f"{stream.ds.name}:{i}"
            if i in stream.seeds:
                lab = stream.ds.labels[i]
                eng.label(doc_id, [str(x) for x in lab] if isinstance(lab, (list, tuple)) else [str(lab)])
            docs.append(Document(id=doc_id, text=stream.ds.texts[i]))
        t0 = time.perf_counter()
        result = eng.process(docs)
        pos = start + len(chunk)
        if gate is not None and not eng.models and gate_open_at is None:
            k, m, min_docs = gate
            counts = eng.seed_classes()
            if len(eng.window) >= min_docs and sum(1 for c in counts.values() if c >= m) >= k:
                gate_open_at = pos
                eng.request_refit("docs")
                result.assignments.extend(eng.flush())
        dt = time.perf_counter() - t0
        fit_seconds += dt
        take(result.assignments + list(getattr(result, "revisions", [])), pos)
        note_refit(pos, dt)
    forced = False
    if not eng.models:
        forced = True
        eng.request_refit("docs")
        take(eng.flush(), len(ids))
        note_refit(len(ids), 0.0)
    # revisions the engine emitted while the worker would wait for the stream to go quiet (refit_idle_s)
    if getattr(eng.config, "revisions", "off") != "off":
        for _ in range(1000):
            before = n_outputs
            eng._bench_clock_offset[0] += 10.0  # the stream is quiet: idle refits may run
            res = eng.process([])
            take(res.assignments + list(getattr(res, "revisions", [])), len(ids))
            if n_outputs == before and not getattr(eng, "revisions_pending", 0):
                break
    # what revisions would give
    last_slot = eng.models[algorithm]
    window_ids = eng.window.ids()

    def relabel(slot: Any) -> dict[str, str]:
        from streamsemi.core.store import rows_to_csr

        X = rows_to_csr(eng.window.rows(), eng.config.n_features)
        return {d: (lab if lab is not None else cl) for d, (lab, _, _, cl, _) in
                zip(window_ids, eng._assign_with(slot, X), strict=True)}

    last_map = relabel(last_slot)
    eng.request_refit("docs")
    final_map = relabel(eng.models[algorithm])
    nonseed = [d for d in ids if idx_of[d] not in stream.seeds and stream.truth(idx_of[d]) is not None and d in first]
    y = [stream.truth(idx_of[d]) for d in nonseed]
    served = [first[d][0] for d in nonseed]
    per_version: dict[int, list[int]] = {}
    for k, d in enumerate(nonseed):
        per_version.setdefault(first[d][1], []).append(k)
    n = len(ids)
    waits = [first[d][2] - min(n, (pos_of[d] // batch + 1) * batch) for d in nonseed]  # documents after its batch
    with_last = [last_map.get(d, first[d][0]) for d in nonseed]
    with_final = [final_map.get(d, first[d][0]) for d in nonseed]
    first_fit_pos = refits[0]["at_document"] if refits else None
    waited = [w for w in waits if w > 0]
    multi_truth = [set(map(str, lab)) if isinstance(lab, (list, tuple)) else {str(lab)}
                   for lab in (stream.ds.labels[idx_of[d]] for d in nonseed)]
    sets = [label_sets[d] for d in nonseed]
    return {
        "algorithm": algorithm, "profile": profile, "served_first": score(y, served),
        "served_latest": score(y, [latest[d][1] for d in nonseed]),
        "revisions_per_document": (n_outputs - len(latest)) / max(len(latest), 1),
        "provisional_outputs": n_provisional,
        "served_example_f1": example_f1(multi_truth, sets),
        "served_single_label_sets": sum(1 for d in nonseed if len(label_sets[d]) == 1),
        "scored_documents": len(nonseed),
        "revised_by_last_model": score(y, with_last), "revised_by_final_refit": score(y, with_final),
        "first_model_documents_revised_by_last_model": score(y, [
            with_last[k] if refits and first[d][1] == refits[0]["version"] else served[k]
            for k, d in enumerate(nonseed)]),
        "later_models_documents_revised_by_last_model": score(y, [
            served[k] if refits and first[d][1] == refits[0]["version"] else with_last[k]
            for k, d in enumerate(nonseed)]),
        "window_at_end": len(window_ids), "forced_first_refit": forced, "first_refit_at_document": first_fit_pos,
        "mean_wait_documents": float(np.mean(waits)) if waits else 0.0,
        "p99_wait_documents": float(np.percentile(waits, 99)) if waits else 0.0,
        "p99_wait_s_at_rate": (float(np.percentile(waits, 99)) / rate
                               + (refits[0]["fit_seconds"] if refits else 0.0)) if waits else 0.0,
        "documents_that_waited": len(waited),
        "refits": refits,
        "per_version": {str(v): {"documents": len(ks), "macro_f1": score([y[k] for k in ks], [served[k] for k in ks]),
                                 "example_f1": example_f1([multi_truth[k] for k in ks], [sets[k] for k in ks]),
                                 "multi_label_truth": sum(1 for k in ks if len(multi_truth[k]) > 1),
                                 "multi_label_served": sum(1 for k in ks if len(sets[k]) > 1)}
                        for v, ks in sorted(per_version.items())},
        "seconds": round(fit_seconds, 2),
    }


def mode_engine(args: argparse.Namespace) -> dict[str, Any]:
    out = []
    for alias in args.corpora.split(","):
        stream = make_stream(alias, args.docs if args.docs else DEFAULT_DOCS.get(alias), args.seed_fraction, args.seed)
        X, keep = featurize(stream)
        ids = [d for d, k in zip(stream.ids, keep, strict=True) if k]
        idx_of = dict(zip(stream.ids, stream.order, strict=True))
        for name in args.algorithms.split(","):
            bpred, _ = batch_predictions(stream, name, X, keep)
            ns = [(d, p) for d, p in zip(ids, bpred, strict=True) if idx_of[d] not in stream.seeds]
            batch = score([stream.truth(idx_of[d]) for d, _ in ns], [p for _, p in ns])
            for profile in args.profiles.split(","):
                r = engine_replay(stream, name, args.batch, profile=profile, **_engine_overrides(args))
                r.update(batch=batch, corpus=alias, stream=stream.describe())
                out.append(r)
                print(f"[engine] {alias} {name} ({profile}): served first {r['served_first']:.3f} latest "
                      f"{r['served_latest']:.3f} | last model on window {r['revised_by_last_model']:.3f} | final "
                      f"refit {r['revised_by_final_refit']:.3f} | batch {batch:.3f} | per version "
                      + "; ".join(f"v{v} {x['documents']} @ {x['macro_f1']:.3f}" for v, x in r["per_version"].items()),
                      flush=True)
    return {"runs": out, "batch_size": args.batch, "refit_every_docs": args.refit_every_docs or "profile default",
            "legacy_profile": LEGACY}


def engine_markdown(result: dict[str, Any]) -> str:
    lines = ["| corpus | algorithm | profile | served (first) | served (latest) | revisions/doc "
             "| only v1's documents re-assigned by the last model "
             "| last model re-assigns window | one more refit at end | batch |"
             " first fit: at doc / window / seeds / classes |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["runs"]:
        f = r["refits"][0] if r["refits"] else {}
        v1 = r.get("first_model_documents_revised_by_last_model")
        lines.append(f"| {r['corpus']} | {r['algorithm']} | {r.get('profile', 'legacy')} | {r['served_first']:.3f} "
                     f"| {r['served_latest']:.3f} | {r['revisions_per_document']:.2f} "
                     f"| {'' if v1 is None else f'{v1:.3f}'} | {r['revised_by_last_model']:.3f} "
                     f"| {r['revised_by_final_refit']:.3f} | {r['batch']:.3f} | {f.get('at_document')} / "
                     f"{f.get('window')} / {f.get('seeds')} / {f.get('seeded_classes')} |")
    lines += ["", "Per model version: documents labelled / macro-F1 (first assignments, non-seed)", ""]
    for r in result["runs"]:
        lines.append(f"- {r['corpus']} {r['algorithm']} ({r.get('profile', 'legacy')}): " + "; ".join(
            f"v{v} {x['documents']} / {x['macro_f1']:.3f}" for v, x in r["per_version"].items()))
    return "\n".join(lines) + "\n"


def _classes_needed(token: str, n_classes: int) -> int:
    """K from ``--gate-classes``: a number, ``0`` (every class) or ``N%`` of the corpus' classes."""
    if token.endswith("%"):
        return max(1, int(round(float(token[:-1]) / 100 * n_classes)))
    k = int(token)
    return n_classes if k == 0 else min(k, n_classes)


def _engine_overrides(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"refit_every_docs": args.refit_every_docs} if args.refit_every_docs else {}
    if args.stable_seeds is not None:
        out["first_fit_stable_seeds"] = args.stable_seeds
    return out


def mode_gating(args: argparse.Namespace) -> dict[str, Any]:
    out = []
    ks = args.gate_classes.split(",")
    ms = [int(x) for x in args.gate_seeds.split(",")]
    mins = [int(x) for x in args.gate_min_docs.split(",")]
    for alias in args.corpora.split(","):
        stream = make_stream(alias, args.docs if args.docs else DEFAULT_DOCS.get(alias), args.seed_fraction, args.seed)
        n_classes = len({stream.truth(i) for i in stream.order})
        for name in args.algorithms.split(","):
            for min_docs in mins:
                for k in ks:
                    kk = _classes_needed(k, n_classes)
                    for m in ms:
                        r = engine_replay(stream, name, args.batch, gate=(kk, m, min_docs), rate=args.gate_rate,
                                          profile=args.profiles.split(",")[0], **_engine_overrides(args))
                        row = {"corpus": alias, "algorithm": name, "profile": r["profile"], "served_latest": r["served_latest"],
                               "min_seed_classes": kk, "min_seeds_per_class": m,
                               "min_docs": min_docs, **{k2: r[k2] for k2 in (
                                   "served_first", "first_refit_at_document", "forced_first_refit",
                                   "documents_that_waited", "mean_wait_documents", "p99_wait_documents",
                                   "p99_wait_s_at_rate", "per_version")},
                               "first_fit": r["refits"][0] if r["refits"] else None}
                        out.append(row)
                        print(f"[gating] {alias} {name} K={kk} M={m} min_docs={min_docs}: served {r['served_first']:.3f}"
                              f" first fit at doc {r['first_refit_at_document']} waited {r['documents_that_waited']}"
                              f" p99 wait {r['p99_wait_documents']:.0f} docs ({r['p99_wait_s_at_rate']:.1f}s at "
                              f"{args.gate_rate:g}/s)", flush=True)
    return {"runs": out, "rate_for_seconds": args.gate_rate, "batch_size": args.batch,
            "refit_every_docs": args.refit_every_docs or "worker default"}


def gating_markdown(result: dict[str, Any]) -> str:
    lines = ["| corpus | algorithm | profile | K classes | M seeds/class | min_docs | served macro-F1 (first) | (latest) "
             f"| first fit at doc | docs that waited | p99 wait (docs) | p99 wait (s at {result['rate_for_seconds']:g}/s) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["runs"]:
        lines.append(f"| {r['corpus']} | {r['algorithm']} | {r.get('profile', 'legacy')} | {r['min_seed_classes']} "
                     f"| {r['min_seeds_per_class']} | {r['min_docs']} | {r['served_first']:.3f} "
                     f"| {r.get('served_latest', r['served_first']):.3f} | {r['first_refit_at_document']}"
                     f"{' (forced)' if r['forced_first_refit'] else ''} | {r['documents_that_waited']} "
                     f"| {r['p99_wait_documents']:.0f} | {r['p99_wait_s_at_rate']:.1f} |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- pseudo-LSC label sets
def example_f1(truth: list[set[str]], pred: list[set[str]]) -> float:
    """Example-based F1: mean over documents of 2|T & P| / (|T| + |P|)."""
    return float(np.mean([2 * len(t & p) / (len(t) + len(p)) if (t or p) else 1.0
                          for t, p in zip(truth, pred, strict=True)]))


def mode_pseudo_lsc(args: argparse.Namespace) -> dict[str, Any]:
    stream = make_stream("r21578", args.docs or 3000, args.seed_fraction, args.seed, order="time", need_labels=True)
    X, keep = featurize(stream)
    rows = np.flatnonzero(keep)
    labels = [[str(x) for x in stream.ds.labels[stream.order[r]]] for r in rows]
    is_seed = np.array([stream.order[r] in stream.seeds for r in rows])
    y = [lab if s else [] for lab, s in zip(labels, is_seed, strict=True)]
    Xk = X[rows]
    ev = np.flatnonzero(~is_seed)
    truth = [set(labels[k]) for k in ev]
    multi_truth = sum(1 for t in truth if len(t) > 1)
    out: dict[str, Any] = {"stream": stream.describe(), "non_seed": int(ev.size), "multi_label_truth": multi_truth,
                           "variants": []}

    def record(name: str, sets: list[set[str]], extra: dict | None = None) -> None:
        row = {"variant": name, "example_f1": example_f1(truth, sets),
               "single_label_sets": sum(1 for s in sets if len(s) == 1),
               "mean_set_size": float(np.mean([len(s) for s in sets])),
               "example_f1_on_multi_truth": example_f1([t for t in truth if len(t) > 1],
                                                       [s for t, s in zip(truth, sets, strict=True) if len(t) > 1]),
               **(extra or {})}
        out["variants"].append(row)
        print(f"[pseudo-lsc] {name:48s} example-F1 {row['example_f1']:.3f} single {row['single_label_sets']}/{ev.size}"
              f" mean |set| {row['mean_set_size']:.2f} F1 on multi-label docs {row['example_f1_on_multi_truth']:.3f}",
              flush=True)

    ck = build_estimator("constrained-kmeans", None, 0, 0)
    ck.fit(Xk, [lab[0] if s else None for lab, s in zip(labels, is_seed, strict=True)])
    Pc = np.asarray(ck.predict_proba(Xk[ev]))
    record("constrained-kmeans (first label of each seed)", [{str(ck.classes_[j])} for j in Pc.argmax(axis=1)])
    base = build_estimator("pseudo-lsc", None, 0, 0)
    t0 = time.perf_counter()
    base.fit(Xk, y)
    fit_s = time.perf_counter() - t0
    P = np.asarray(base.predict_proba(Xk[ev]))
    classes = np.asarray([str(c) for c in base.classes_], dtype=object)
    srt = -np.sort(-P, axis=1)
    out["fit_seconds"] = round(fit_s, 2)
    out["n_clusters"] = int(base.cluster_centers_.shape[0])
    out["pseudo_label_sets"] = len(base.pseudo_label_sets_)
    out["second_probability_quantiles"] = {str(q): round(float(np.quantile(srt[:, 1], q)), 3)
                                           for q in (0.5, 0.9, 0.99)}
    out["second_probability_on_multi_truth_median"] = round(float(np.median(
        srt[[k for k, t in enumerate(truth) if len(t) > 1], 1])), 3) if multi_truth else None

    def sets_from(ind: np.ndarray) -> list[set[str]]:
        return [set(classes[np.flatnonzero(r)]) for r in ind]

    record("pseudo-lsc defaults (threshold 0.5, kappa 10)", sets_from(base.predict(Xk[ev])))
    for thr in (0.4, 0.3, 0.2):
        base.set_params(threshold=thr)
        record(f"pseudo-lsc threshold {thr}", sets_from(base.decide(P)))
    base.set_params(threshold=0.5, decision="rcut")
    record("pseudo-lsc rcut", sets_from(base.decide(P)))
    for ratio in (0.7, 0.5, 0.3):
        record(f"pseudo-lsc relative: P >= {ratio} x top", sets_from(P >= ratio * P.max(axis=1, keepdims=True)))
    # proportional cut: the threshold that gives the seeds' label cardinality on the fitted documents
    t_card = base._calibrated_threshold(np.asarray(base.predict_proba(Xk)), base.label_cardinality_)
    base.set_params(decision="threshold", threshold=min(t_card, 1.0))
    record(f"pseudo-lsc cardinality (seeds' {base.label_cardinality_:.2f} labels/doc: threshold {t_card:.3f})",
           sets_from(base.decide(P)))
    base.set_params(threshold=0.5)
    for kappa in (1, 3):
        base.set_params(kappa=kappa)
        Pk = np.asarray(base.predict_proba(Xk[ev]))
        record(f"pseudo-lsc kappa {kappa} threshold 0.5", sets_from(base.decide(Pk)))
        base.set_params(decision="rcut")
        record(f"pseudo-lsc kappa {kappa} rcut", sets_from(base.decide(Pk)))
        base.set_params(decision="threshold")
    # the stream as served: time order with the documents that have no topic, through the engine
    served = make_stream("r21578", args.docs or 3000, args.seed_fraction, args.seed, order="time")
    out["stream_served"] = {"stream": served.describe(), "runs": []}
    variants: list[tuple[str, dict | None, str, dict]] = [
        ("constrained-kmeans", None, "legacy", {}), ("pseudo-lsc", None, "legacy", {}),
        ("pseudo-lsc", {"threshold": 0.3}, "legacy", {}), ("pseudo-lsc", None, "legacy", {"min_docs_first_refit": 1000}),
        ("constrained-kmeans", None, "current", {}), ("pseudo-lsc", None, "current", {}),
        ("pseudo-lsc", {"threshold": 0.3}, "current", {}), ("pseudo-lsc", {"decision": "cardinality"}, "current", {})]
    for name, params, profile, engine_params in variants:
        r = engine_replay(served, name, args.batch, profile=profile, **engine_params,
                          **({"algorithm_params": {name: params}} if params else {}))
        row = {"algorithm": name, "params": params, "profile": profile, "engine": engine_params, **{k: r[k] for k in (
            "served_example_f1", "served_single_label_sets", "scored_documents", "served_first", "served_latest",
            "revised_by_final_refit", "per_version", "refits")}}
        out["stream_served"]["runs"].append(row)
        print(f"[pseudo-lsc stream] {name} {params or ''} {profile} {engine_params or ''}: example-F1 {r['served_example_f1']:.3f}, single-label sets "
              f"{r['served_single_label_sets']}/{r['scored_documents']}, primary macro-F1 {r['served_first']:.3f}",
              flush=True)
    return out


def pseudo_markdown(result: dict[str, Any]) -> str:
    lines = [f"Reuters-21578, {result['stream']['documents']} documents with topics (time order), "
             f"{result['stream']['seeds']} seeds; {result['non_seed']} scored, {result['multi_label_truth']} of them "
             f"multi-label. pseudo-LSC: {result['n_clusters']} clusters, {result['pseudo_label_sets']} seed label sets; "
             f"2nd-highest class probability quantiles {result['second_probability_quantiles']}.", "",
             "| variant | example-based F1 | single-label sets | mean set size | F1 on multi-label docs |",
             "|---|---|---|---|---|"]
    for v in result["variants"]:
        lines.append(f"| {v['variant']} | {v['example_f1']:.3f} | {v['single_label_sets']} | {v['mean_set_size']:.2f} "
                     f"| {v['example_f1_on_multi_truth']:.3f} |")
    st = result["stream_served"]
    lines += ["", f"As served: the first {st['stream']['documents']} documents in time order (those without a topic "
              f"included, unscored), {st['stream']['seeds']} seeds, through the Engine (worker defaults):", "",
              "| algorithm | params | engine | example-based F1 (first label sets) | single-label sets / scored "
              "| primary-label macro-F1 |", "|---|---|---|---|---|---|"]
    for r in st["runs"]:
        lines.append(f"| {r['algorithm']} | {r['params'] or 'defaults'} | {r['profile']} {r['engine'] or ''} "
                     f"| {r['served_example_f1']:.3f} "
                     f"| {r['served_single_label_sets']} / {r['scored_documents']} | {r['served_first']:.3f} |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- main
def _environment() -> dict[str, Any]:
    def git(*a: str) -> str:
        try:
            return subprocess.run(["git", *a], capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent,
                                  timeout=10).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""

    return {"python": platform.python_version(), "cpus": os.cpu_count(), "commit": git("rev-parse", "HEAD"),
            "uncommitted_engine_or_algorithm_changes": git("status", "--short", "--", "streamsemi").splitlines(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", nargs="?", default="served", choices=("served", "engine", "gating", "pseudo-lsc",
                                                                  "queue"))
    p.add_argument("--corpora", default="r8,20ng", help="comma-separated: r8, 20ng, r52")
    p.add_argument("--docs", type=int, default=None, help="documents per corpus (default: all of R8, 8000 of 20NG)")
    p.add_argument("--rate", default="0", help="comma-separated docs/s; 0 = full speed (served mode)")
    p.add_argument("--algorithms", default="constrained-kmeans", help=f"comma-separated, e.g. {SIX}")
    p.add_argument("--seed-fraction", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0, help="order and seed draw")
    p.add_argument("--idle", type=float, default=10.0,
                   help="served: seconds with no new output, no refit running, no revision pending and the same "
                        "model versions (worker metrics) that end a run (> refit_idle_s + min_refit_interval_s)")
    p.add_argument("--timeout", type=float, default=3600.0, help="served: longest wait after producing")
    p.add_argument("--batch", type=int, default=100, help="engine/gating: documents per Engine.process call")
    p.add_argument("--profiles", default="legacy",
                   help="engine: comma-separated legacy (refit policy of commit ac1fe4f) and/or current (the engine's "
                        "defaults); gating: the first one")
    p.add_argument("--refit-every-docs", type=int, default=0,
                   help="engine/gating: refit_every_docs (default: the worker's default)")
    p.add_argument("--stable-seeds", type=int, default=None,
                   help="engine/gating: first_fit_stable_seeds (default: the engine's default)")
    p.add_argument("--gate-classes", default="2,50%,0",
                   help="gating: K values (N, N%% of the corpus' classes, 0 = every class)")
    p.add_argument("--gate-seeds", default="1,2,3", help="gating: M values")
    p.add_argument("--gate-min-docs", default="200,500", help="gating: min_docs values")
    p.add_argument("--gate-rate", type=float, default=200.0, help="gating: docs/s used to express waits in seconds")
    p.add_argument("--quick", action="store_true", help="a small smoke run (300 R8 documents)")
    p.add_argument("--tag", default="", help="suffix of the result files")
    p.add_argument("--from-raw", default=None,
                   help="served: score the raw records a previous run saved instead of running (one corpus and rate)")
    p.add_argument("--work-dir", default=None, help="served: where worker and broker logs go (default /tmp)")
    p.add_argument("--no-write", action="store_true", help="print only")
    p.add_argument("--primaries", default="auto",
                   help="queue: comma-separated --primary settings, one run each (e.g. auto,constrained-kmeans)")
    p.add_argument("--worker-args", default="",
                   help="served: more `streamsemi run` options, e.g. '--window-max-docs 500' (the batch figure "
                        "still fits on every document)")
    p.add_argument("--rounds", type=int, default=10, help="queue: rounds of labelling")
    p.add_argument("--k", type=int, default=10, help="queue: suggestions labelled per round")
    p.add_argument("--budget", type=int, default=None,
                   help="queue: labels from the queue in all (the last round cut short; default rounds x k)")
    _bench.add_smoke(p)
    args = p.parse_args(argv)
    args.quick = args.quick or args.smoke  # --smoke: the --quick run, its files in a temporary directory
    if args.quick:
        args.corpora, args.docs, args.idle = "r8", args.docs or 300, min(args.idle, 5.0)
        args.gate_classes, args.gate_seeds, args.gate_min_docs = "2", "1", "100"
    t0 = time.monotonic()
    result = {"mode": args.mode, "args": vars(args), "environment": _environment()}
    run, md = {"served": (mode_served, served_markdown), "engine": (mode_engine, engine_markdown),
               "gating": (mode_gating, gating_markdown), "pseudo-lsc": (mode_pseudo_lsc, pseudo_markdown),
               "queue": (mode_queue, queue_markdown)}[args.mode]
    result.update(run(args))
    result["seconds"] = round(time.monotonic() - t0, 1)
    text = md(result)
    print(text)
    if not args.no_write:
        stem = "served_quality" + ("" if args.mode == "served" else "_" + args.mode.replace("-", "_"))
        stem += f"_{args.tag}" if args.tag else ""
        results = _bench.results_dir(args.smoke)
        (results / f"{stem}.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
        (results / f"{stem}.md").write_text(f"# served_quality {args.mode}\n\n`{' '.join(sys.argv)}`\n\n" + text)
        print(f"wrote {results / stem}.json and .md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
