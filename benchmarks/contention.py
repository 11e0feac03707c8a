"""The worker on a busy machine: time to first output and to every document assigned, with N busy neighbours.

One run per value of ``--busy`` (default 0, 1, 2, 4), each on a fresh embedded broker:

1. N busy processes start at normal priority (``python -c "while True: pass"``, the
   neighbours of a shared node) and stay busy for the whole phase;
2. ``streamsemi run`` starts as a process with its defaults (``--fit-priority`` if given);
3. ``--docs`` Reuters R8 documents with ``--seed-fraction`` stratified seeds (each seed's
   label on the control topic just before its document) are sent at full speed;
4. once every document has its first output (or ``--deadline`` seconds passed),
   ``--fresh`` more documents (R8 texts under new ids) arrive at ``--fresh-rate`` docs/s:
   their latency is what a served stream sees on that machine.

Figures per phase, from the records' CreateTime stamps (document record, first output
record on the labels topic): time to the first output and to 99% / 100% of the documents
assigned, counted from the first document sent; the fresh documents' latency p50 / p99;
the served model's age (``streamsemi_model_age_seconds``, sampled every second) and the
fit process's nice value while the phase ran. Outputs are read after each phase stands
still, not while it streams (a live reader would take CPU from the worker).

Results: ``benchmarks/results/contention[_TAG].json`` and ``.md`` (the command at the top).

Examples::

    python benchmarks/contention.py                            # busy 0,1,2,4 (~5 minutes on 2 cores)
    python benchmarks/contention.py --busy 2 --fit-priority idle --deadline 120 --tag idle
    python benchmarks/contention.py --smoke                    # seconds: a check that it runs
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bench import add_smoke, commit, parse, results_dir  # noqa: E402
from served_quality import make_stream  # noqa: E402

from streamsemi.core.messages import encode_json  # noqa: E402
from streamsemi.devtools.broker import EmbeddedBroker, free_port  # noqa: E402
from streamsemi.devtools.replay import document_message, paced, seed_message  # noqa: E402

BUSY_LOOP = "while True: pass"


def _metrics(port: int) -> dict[str, float]:
    """The worker's unlabelled gauges (name -> value); {} when /metrics does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            body = r.read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for line in body.splitlines():
        if line.startswith("#") or "{" in line or not line.strip():
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[name] = float(value)
        except ValueError:
            continue
    return out


def _assigned(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
            return bool(json.loads(r.read()).get("partitions_assigned"))
    except urllib.error.HTTPError as e:
        try:
            return bool(json.loads(e.read()).get("partitions_assigned"))
        except ValueError:
            return False
    except (OSError, ValueError):
        return False


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def read_first_outputs(settings: Any, topic: str, want: set[str], deadline: float) -> dict[str, int]:
    """First output record's CreateTime (ms) per document id of ``want`` on ``topic``, read from the beginning."""
    from streamsemi.service.kafka_io import assign_all, make_reader

    reader = make_reader(settings)
    assign_all(reader, topic)
    first: dict[str, int] = {}
    quiet_since = time.monotonic()
    try:
        while time.monotonic() < deadline and not want <= first.keys():
            got = reader.poll(timeout_ms=500)
            if not got:
                if time.monotonic() - quiet_since > 5.0:
                    break  # nothing more on the topic
                continue
            quiet_since = time.monotonic()
            for batch in got.values():
                for r in batch:
                    key = r.key.decode() if r.key else None
                    if key in want and key not in first:
                        first[key] = int(r.timestamp)
    finally:
        reader.close()
    return first


def phase(n_busy: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """One broker, N busy neighbours, one worker process: the figures of the module docstring."""
    from streamsemi.service.config import resolve
    from streamsemi.service.kafka_io import ensure_topics, make_producer

    stream = make_stream("r8", args.docs, args.seed_fraction, args.seed)
    broker = EmbeddedBroker(log_file=work / f"tansu-{n_busy}.log").start()
    prefix = "ct" + uuid.uuid4().hex[:8]
    topics = {k: f"{prefix}.{k}" for k in ("documents", "control", "assignments", "deadletter", "labels")}
    settings = resolve({"bootstrap_servers": broker.bootstrap_servers, **{f"{k}_topic": v for k, v in topics.items()}})
    port = free_port()
    log_path = work / f"worker-{n_busy}.log"
    cmd = [sys.executable, "-m", "streamsemi", "run", "--bootstrap-servers", broker.bootstrap_servers,
           "--group-id", f"{prefix}-group", "--metrics-port", str(port),
           *[x for k, v in topics.items() for x in (f"--{k}-topic", v)]]
    if args.fit_priority:
        cmd += ["--fit-priority", args.fit_priority]
    busy: list[subprocess.Popen] = []
    worker = None
    samples: list[tuple[float, dict[str, float]]] = []
    stop = threading.Event()
    try:
        ensure_topics(settings)
        busy = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(n_busy)]
        with open(log_path, "ab") as fh:
            worker = subprocess.Popen(cmd, stdout=fh, stderr=fh)
        t_wait = time.monotonic()
        while not _assigned(port):
            if worker.poll() is not None:
                raise RuntimeError(f"the worker exited with code {worker.returncode}; see {log_path}")
            if time.monotonic() - t_wait > 300:
                raise RuntimeError("the worker was not assigned its partitions within 300 s")
            time.sleep(0.3)

        def sample() -> None:
            while not stop.is_set():
                m = _metrics(port)
                if m:
                    samples.append((time.time(), m))
                stop.wait(1.0)

        sampler = threading.Thread(target=sample, name="contention-sampler", daemon=True)
        sampler.start()
        producer = make_producer(settings)
        sent: dict[str, int] = {}
        for i in stream.order:
            msg = document_message(stream.ds, i)
            if i in stream.seeds:
                sm = seed_message(stream.ds, i)
                producer.send(topics["control"], key=sm["id"].encode(), value=encode_json(sm))
            ms = int(time.time() * 1000)
            producer.send(topics["documents"], key=msg["id"].encode(), value=encode_json(msg), timestamp_ms=ms)
            sent[msg["id"]] = ms
        producer.flush()
        t0 = min(sent.values()) / 1000
        deadline = t0 + args.deadline
        # wait until the worker has assigned every document (its counter), or the deadline
        want = len(sent)
        while time.time() < deadline:
            if worker.poll() is not None:
                raise RuntimeError(f"the worker exited with code {worker.returncode}; see {log_path}")
            m = samples[-1][1] if samples else {}
            done = m.get("streamsemi_documents_consumed_total", 0) - m.get("streamsemi_buffered_documents", 0)
            if done >= want and not m.get("streamsemi_buffered_documents", 0):
                break
            time.sleep(1.0)
        fresh_sent: dict[str, int] = {}
        if args.fresh:
            texts = [stream.ds.texts[i] for i in stream.order]
            for k, _ in enumerate(paced(range(args.fresh), args.fresh_rate)):
                doc_id = f"fresh-{prefix}-{k}"
                ms = int(time.time() * 1000)
                producer.send(topics["documents"], key=doc_id.encode(),
                              value=encode_json({"id": doc_id, "text": texts[k % len(texts)]}), timestamp_ms=ms)
                fresh_sent[doc_id] = ms
            producer.flush()
            time.sleep(2.0)
        producer.close()
        stop.set()
        sampler.join(5)
        ran_s = time.time() - t0
        for p in busy:  # the neighbours stop before the outputs are read (the figures are record stamps)
            p.kill()
        first = read_first_outputs(settings, topics["labels"], set(sent) | set(fresh_sent), time.time() + 120)
    finally:
        stop.set()
        for p in busy:
            if p.poll() is None:
                p.kill()
        if worker is not None and worker.poll() is None:
            worker.terminate()
            try:
                worker.wait(60)
            except subprocess.TimeoutExpired:
                worker.kill()
        broker.stop()
    lat_all = sorted((first[d] - sent[d]) / 1000 for d in sent if d in first)
    since_start = sorted((first[d] / 1000 - t0) for d in sent if d in first)
    n = len(sent)
    fresh_lat = [(first[d] - fresh_sent[d]) / 1000 for d in fresh_sent if d in first]
    ages = [m.get("streamsemi_model_age_seconds") for _, m in samples if "streamsemi_model_age_seconds" in m]
    nices = sorted({m.get("streamsemi_fit_process_nice") for _, m in samples if "streamsemi_fit_process_nice" in m})

    def at_share(q: float) -> float | None:
        k = int(np.ceil(q * n))
        return since_start[k - 1] if len(since_start) >= k > 0 else None

    return {"busy": n_busy, "documents": n, "seeds": len(stream.seeds), "assigned": len(lat_all),
            "first_output_s": since_start[0] if since_start else None,
            "assigned_99_s": at_share(0.99), "assigned_all_s": at_share(1.0),
            "phase_s": round(ran_s, 1),
            "fresh": len(fresh_sent), "fresh_assigned": len(fresh_lat),
            "fresh_p50_s": _pct(fresh_lat, 50), "fresh_p99_s": _pct(fresh_lat, 99),
            "model_age_max_s": max(ages) if ages else None,
            "model_age_median_s": float(np.median(ages)) if ages else None,
            "fit_nice_seen": nices, "load_at_end": list(os.getloadavg()), "command": cmd, "log": str(log_path)}


def _f(v: Any, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def markdown(result: dict[str, Any]) -> str:
    lines = [f"# Contention: {result['documents']} R8 documents, {result['seed_fraction']:.0%} seeds, "
             f"fit_priority {result['fit_priority'] or 'default'}",
             "", f"`{result['command']}` at {result['commit']}", "",
             "| busy processes | first output (s) | 99% assigned (s) | all assigned (s) | assigned | "
             "fresh p50 / p99 (s) | model age max (s) | fit nice |",
             "|---|---|---|---|---|---|---|---|"]
    for p in result["phases"]:
        lines.append(f"| {p['busy']} | {_f(p['first_output_s'])} | {_f(p['assigned_99_s'])} | "
                     f"{_f(p['assigned_all_s'])} | {p['assigned']} of {p['documents']} | "
                     f"{_f(p['fresh_p50_s'], 3)} / {_f(p['fresh_p99_s'], 3)} | {_f(p['model_age_max_s'])} | "
                     f"{', '.join(str(int(x)) for x in p['fit_nice_seen']) or '-'} |")
    quiet = next((p for p in result["phases"] if p["busy"] == 0), None)
    if quiet and quiet["first_output_s"] and any(p["busy"] and p["first_output_s"] for p in result["phases"]):
        lines += ["", "First output against the quiet machine's: " + ", ".join(
            f"{p['busy']} busy {p['first_output_s'] / quiet['first_output_s']:.2f}x"
            for p in result["phases"] if p["busy"] and p["first_output_s"])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--busy", default="0,1,2,4", help="numbers of busy neighbour processes, one phase each")
    ap.add_argument("--docs", type=int, default=3000, help="R8 documents sent at full speed")
    ap.add_argument("--seed-fraction", type=float, default=0.05, help="stratified seed labels among them")
    ap.add_argument("--seed", type=int, default=0, help="replay order and seed draw")
    ap.add_argument("--fresh", type=int, default=1000, help="documents sent once served, at --fresh-rate")
    ap.add_argument("--fresh-rate", type=float, default=200.0, help="docs/s of the fresh documents")
    ap.add_argument("--deadline", type=float, default=300.0, help="seconds from the first document to give up")
    ap.add_argument("--fit-priority", default="", help="the worker's --fit-priority (default: its own default)")
    ap.add_argument("--tag", default="", help="suffix of the result files")
    add_smoke(ap)
    args = parse(ap, argv, ["--busy", "0", "--docs", "300", "--fresh", "50", "--deadline", "120"])
    out_dir = results_dir(args.smoke)
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="streamsemi-contention-"))
    phases = []
    for n in [int(x) for x in args.busy.split(",") if x.strip()]:
        p = phase(n, args, work)
        print(f"busy {n}: first output {_f(p['first_output_s'])} s, 99% {_f(p['assigned_99_s'])} s, "
              f"all {_f(p['assigned_all_s'])} s ({p['assigned']} of {p['documents']}), fresh p99 "
              f"{_f(p['fresh_p99_s'], 3)} s, model age max {_f(p['model_age_max_s'])} s", flush=True)
        phases.append(p)
    result = {"command": "python benchmarks/contention.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "commit": commit(), "documents": args.docs, "seed_fraction": args.seed_fraction,
              "fit_priority": args.fit_priority, "cpus": os.cpu_count(), "phases": phases}
    name = "contention" + (f"_{args.tag}" if args.tag else "")
    (out_dir / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    (out_dir / f"{name}.md").write_text(markdown(result))
    print(markdown(result))
    print(f"wrote {out_dir / name}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
