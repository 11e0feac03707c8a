"""Soak benchmark: a long replay through a real worker process on the embedded broker.

Measures, for ``--documents`` documents (R8 texts cycled with unique ids, a seed label
every ``--seed-every``) with a refit every ``--refit-every`` documents:

* the worker's resident memory (VmRSS from /proc/<pid>/status) over time;
* the consumer lag (``streamsemi_consumer_lag``) and how long after each refit it is
  back to zero;
* error logs of the worker (streamsemi's own, and kafka-python's).

Run on demand (it takes minutes)::

    python benchmarks/soak.py                      # 200,000 documents
    python benchmarks/soak.py --documents 20000    # a quick check

Results: ``benchmarks/results/soak.json`` (``--out`` to change).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from kafka import KafkaProducer
from prometheus_client.parser import text_string_to_metric_families

from streamsemi.core import datasets
from streamsemi.devtools.broker import EmbeddedBroker, free_port
from streamsemi.service.config import resolve
from streamsemi.service.kafka_io import ensure_topics

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench  # noqa: E402

#: ``--smoke``: 300 documents at 300 docs/s, a refit every 100.
SMOKE = ["--documents", "300", "--refit-every", "100", "--rate", "300", "--seed-every", "10"]


def rss_kib(pid: int) -> int | None:
    """Resident set size of ``pid`` in KiB (None once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def scrape(port: int) -> dict[str, float]:
    """A few worker metrics (summed over labels)."""
    want = {"streamsemi_consumer_lag", "streamsemi_documents_assigned_total", "streamsemi_refits_total",
            "streamsemi_refit_in_progress", "streamsemi_documents_consumed_total", "streamsemi_window_documents",
            "streamsemi_seed_documents", "streamsemi_checkpoints_total"}
    out: dict[str, float] = {}
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            body = r.read().decode()
    except OSError:
        return out
    for fam in text_string_to_metric_families(body):
        for s in fam.samples:
            if s.name in want:
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def produce(bootstrap: str, names: dict[str, str], n: int, rate: float, seed_every: int, progress: dict) -> None:
    ds = datasets.load("reuters-r8")
    p = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=256 * 1024, acks=1)
    t0 = time.monotonic()
    for j in range(n):
        k = j % len(ds.texts)
        doc_id = f"s{j}"
        p.send(names["documents"], key=doc_id.encode(), value=json.dumps({"id": doc_id, "text": ds.texts[k]}).encode())
        if j % seed_every == 0:
            p.send(names["control"], key=doc_id.encode(),
                   value=json.dumps({"op": "label", "id": doc_id, "labels": [ds.labels[k]]}).encode())
        progress["sent"] = j + 1
        if (j + 1) % 500 == 0:
            ahead = (j + 1) / rate - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)
    p.flush()
    p.close()
    progress["done"] = time.monotonic()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--documents", type=int, default=200_000)
    ap.add_argument("--refit-every", type=int, default=5000)
    ap.add_argument("--rate", type=float, default=1500.0, help="documents per second produced")
    ap.add_argument("--seed-every", type=int, default=50)
    ap.add_argument("--algorithms", default="constrained-kmeans")
    ap.add_argument("--out", default=None, help="default: benchmarks/results/soak.json")
    _bench.add_smoke(ap)
    args = _bench.parse(ap, argv, SMOKE)

    work = Path(tempfile.mkdtemp(prefix="streamsemi-soak-"))
    broker = EmbeddedBroker(log_file=work / "tansu.log").start()
    prefix = f"soak{int(time.time())}"
    names = {k: f"{prefix}.{k}" for k in ("documents", "control", "assignments", "deadletter")}
    settings = resolve({"bootstrap_servers": broker.bootstrap_servers, "documents_topic": names["documents"],
                        "control_topic": names["control"], "assignments_topic": names["assignments"],
                        "deadletter_topic": names["deadletter"]})
    ensure_topics(settings)
    port = free_port()
    cmd = [sys.executable, "-m", "streamsemi", "run", "--bootstrap-servers", broker.bootstrap_servers,
           "--group-id", f"{prefix}-group", "--documents-topic", names["documents"], "--control-topic", names["control"],
           "--assignments-topic", names["assignments"], "--deadletter-topic", names["deadletter"],
           "--metrics-port", str(port), "--algorithms", args.algorithms, "--refit-every-docs", str(args.refit_every),
           "--state-dir", str(work / "state"), "--checkpoint-interval-s", "60"]
    log_path = work / "worker.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    with open(log_path, "wb") as log:
        worker = subprocess.Popen(cmd, stdout=log, stderr=log, env=env)
    samples: list[dict] = []
    progress: dict = {"sent": 0}
    t0 = time.monotonic()
    try:
        time.sleep(3.0)
        prod = threading.Thread(target=produce, args=(broker.bootstrap_servers, names, args.documents, args.rate,
                                                      args.seed_every, progress), daemon=True)
        prod.start()
        n_algos = len(args.algorithms.split(","))
        deadline = time.monotonic() + args.documents / args.rate * 3 + 600
        finished = 0.0
        while time.monotonic() < deadline:
            m = scrape(port)
            samples.append({"t": round(time.monotonic() - t0, 2), "rss_mib": round((rss_kib(worker.pid) or 0) / 1024, 1),
                            "sent": progress["sent"], **{k.replace("streamsemi_", ""): v for k, v in m.items()}})
            if worker.poll() is not None:
                break
            if "done" in progress and m.get("streamsemi_documents_assigned_total", 0) >= args.documents * n_algos:
                finished = finished or time.monotonic()
                if time.monotonic() - finished > 5.0:  # a few samples after the end (lag back to zero)
                    break
            time.sleep(1.0)
        exit_code = None
        worker.terminate()
        try:
            exit_code = worker.wait(60)
        except subprocess.TimeoutExpired:
            worker.kill()
    finally:
        if worker.poll() is None:
            worker.kill()
        broker.stop()

    events = []
    for line in log_path.read_text(errors="replace").splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            events.append({"raw": line})
    t_start = min((e["ts"] for e in events if "ts" in e), default=0.0)
    wall0 = time.time() - (time.monotonic() - t0)  # wall clock of t0
    refits = [e for e in events if e.get("event") == "refit_round_done"]
    lag_back = []
    for e in refits:
        t_rel = e["ts"] - wall0
        after = [s for s in samples if s["t"] >= t_rel]
        zero = next((s for s in after if s.get("consumer_lag", 1) == 0), None)
        lag_back.append(None if zero is None else round(zero["t"] - t_rel, 1))
    own_errors = [e for e in events if e.get("level") in ("error", "critical") and str(e.get("logger", "")).startswith("streamsemi")]
    all_errors = [e for e in events if e.get("level") in ("error", "critical") or "Traceback" in e.get("raw", "")]
    rss = [s["rss_mib"] for s in samples if s["rss_mib"]]
    assigned = samples[-1].get("documents_assigned_total", 0) if samples else 0

    def rss_at(frac: float) -> float | None:
        target = args.documents * frac
        s = next((s for s in samples if s.get("documents_consumed_total", 0) >= target), None)
        return s["rss_mib"] if s else None

    result = {
        "commit": _bench.commit(),
        "parameters": {"documents": args.documents, "refit_every": args.refit_every, "rate": args.rate,
                       "seed_every": args.seed_every, "algorithms": args.algorithms, "window_max_docs": 10000},
        "seconds": round(samples[-1]["t"], 1) if samples else None,
        "documents_assigned": assigned,
        "exit_code": exit_code,
        "refits": len(refits),
        "refit_seconds": [e.get("seconds") for e in refits],
        "lag_back_to_zero_s": lag_back,
        "lag_back_to_zero_max_s": max((x for x in lag_back if x is not None), default=None),
        "refits_without_lag_zero_after": sum(1 for x in lag_back if x is None),
        "rss_mib": {"min": min(rss, default=None), "max": max(rss, default=None),
                    "at_25pct": rss_at(0.25), "at_50pct": rss_at(0.5), "at_75pct": rss_at(0.75),
                    "at_100pct": rss_at(1.0)},
        "rss_curve": [{"t": s["t"], "consumed": s.get("documents_consumed_total"), "rss_mib": s["rss_mib"]}
                      for s in samples[:: max(1, len(samples) // 200)]],
        "max_lag": max((s.get("consumer_lag", 0) for s in samples), default=None),
        "error_logs_streamsemi": len(own_errors),
        "error_logs_all": len(all_errors),
        "first_errors": [str(e)[:300] for e in all_errors[:5]],
        "checkpoints": samples[-1].get("checkpoints_total") if samples else None,
        "log_start_ts": t_start,
    }
    out = Path(args.out) if args.out else _bench.results_dir(args.smoke) / "soak.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    summary = {k: v for k, v in result.items() if k not in ("rss_curve", "refit_seconds", "lag_back_to_zero_s")}
    print(json.dumps(summary, indent=2))
    print("wrote", out)
    return 0 if assigned >= args.documents and not own_errors else 1


if __name__ == "__main__":
    sys.exit(main())
