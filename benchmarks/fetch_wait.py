"""How long a fresh record waits at the documents topic's log end, by ``fetch_max_wait_ms`` (issue 16).

A consumer at the log end sends a fetch that finds no new record; Kafka answers it as
soon as a record arrives (``fetch_min_bytes`` = 1), but the embedded broker (Tansu)
holds it for the whole ``fetch_max_wait_ms`` whatever arrives meanwhile. This measures
that wait on the embedded broker, in one run for each value of ``--waits`` (the first,
Kafka's default 500, is the baseline):

* records are produced at ``--rate`` docs/s for ``--seconds`` to a fresh one-partition
  topic, stamped with their CreateTime;
* the worker's documents consumer (:func:`streamsemi.service.kafka_io.make_document_consumer`,
  group, subscribe) polls them in a loop that sleeps ``--work-ms`` after every poll (the
  worker's processing);
* latency of a record = the poll's return time - its CreateTime; p50 / p99 / max;
* idle cost: the same loop with nothing produced for ``--idle-seconds``, the process's
  CPU seconds per second (every empty fetch is a request and a response).

Results: ``benchmarks/results/fetch_wait[_TAG].json`` and ``.md``. ::

    python benchmarks/fetch_wait.py
    python benchmarks/fetch_wait.py --waits 500,100,50 --seconds 20 --tag long
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).parent / "results"


def measure(bootstrap: str, wait_ms: int, rate: float, seconds: float, work_ms: float,
            idle_seconds: float) -> dict[str, Any]:
    """One value of ``fetch_max_wait_ms``: latency at ``rate`` docs/s and idle CPU of the poll loop."""
    from kafka import KafkaProducer

    from streamsemi.service.config import resolve
    from streamsemi.service.kafka_io import create_missing_topics, make_document_consumer

    topic = f"fetchwait-{wait_ms}-{uuid.uuid4().hex[:6]}"
    settings = resolve({"bootstrap_servers": bootstrap, "group_id": topic, "fetch_max_wait_ms": str(wait_ms)}, env={})
    create_missing_topics(settings, {topic: (1, {})})
    consumer = make_document_consumer(settings)
    consumer.subscribe([topic])
    deadline = time.monotonic() + 30
    while not consumer.assignment():
        consumer.poll(timeout_ms=200)
        if time.monotonic() > deadline:
            raise RuntimeError(f"the consumer of {topic} got no partition in 30 s")
    # idle: nothing arrives, every fetch comes back empty after fetch_max_wait_ms
    cpu0, t0 = time.process_time(), time.monotonic()
    while time.monotonic() - t0 < idle_seconds:
        consumer.poll(timeout_ms=500)
    idle_cpu = (time.process_time() - cpu0) / max(1e-9, time.monotonic() - t0)

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    stop = threading.Event()
    sent = [0]

    def send() -> None:
        start = time.monotonic()
        while not stop.is_set():
            delay = start + sent[0] / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            producer.send(topic, value=b"x" * 1000, timestamp_ms=int(time.time() * 1000))
            sent[0] += 1

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    lat: list[float] = []
    t_end = time.monotonic() + seconds
    while time.monotonic() < t_end:
        polled = consumer.poll(timeout_ms=500, max_records=settings.max_poll_records)
        now_ms = time.time() * 1000
        for records in polled.values():
            lat.extend((now_ms - r.timestamp) / 1000 for r in records)
        time.sleep(work_ms / 1000)
    stop.set()
    sender.join(5)
    producer.close()
    consumer.close()
    arr = np.array(lat)
    return {"fetch_max_wait_ms": wait_ms, "records": len(lat), "sent": sent[0],
            "latency_s": {q: round(float(np.percentile(arr, v)), 3) if len(arr) else None
                          for q, v in (("p50", 50), ("p99", 99), ("max", 100))},
            "idle_cpu_share": round(idle_cpu, 4)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--waits", default="500,200,100,50,20", help="values of fetch_max_wait_ms (the first is the baseline)")
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--work-ms", type=float, default=40.0, help="sleep after every poll (the worker's processing)")
    ap.add_argument("--idle-seconds", type=float, default=10.0)
    ap.add_argument("--tag", default="")
    args = ap.parse_args(argv)
    # this folder's throughput.py: the host, the commit and the stack's package versions
    from throughput import _environment

    from streamsemi.devtools.broker import EmbeddedBroker

    waits = [int(w) for w in args.waits.split(",")]
    broker = EmbeddedBroker().start()
    try:
        rows = []
        for w in waits:
            rows.append(measure(broker.bootstrap_servers, w, args.rate, args.seconds, args.work_ms, args.idle_seconds))
            print(json.dumps(rows[-1]), flush=True)
    finally:
        broker.stop()
    base = rows[0]["latency_s"]["p99"]
    for r in rows:
        r["p99_ratio_to_baseline"] = round(r["latency_s"]["p99"] / base, 3) if base and r["latency_s"]["p99"] else None
    command = "python benchmarks/fetch_wait.py " + " ".join(sys.argv[1:] if argv is None else argv)
    out = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "command": command.strip(), "args": vars(args),
           "environment": _environment(), "rows": rows}
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = "fetch_wait" + (f"_{args.tag}" if args.tag else "")
    (RESULTS / f"{stem}.json").write_text(json.dumps(out, indent=1) + "\n")
    lines = [f"# A fresh record's wait at the log end, by fetch_max_wait_ms ({out['when']})", "",
             f"`{out['command']}`", "",
             f"Embedded broker (Tansu), {args.rate:g} docs/s for {args.seconds:g} s, {args.work_ms:g} ms of work after "
             f"every poll; idle: {args.idle_seconds:g} s with nothing produced. Packages: "
             + ", ".join(f"{k} {v}" for k, v in out["environment"]["packages"].items()) + ".", "",
             "| fetch_max_wait_ms | records | p50 (s) | p99 (s) | max (s) | p99 / baseline | idle CPU share |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lat = r["latency_s"]
        lines.append(f"| {r['fetch_max_wait_ms']} | {r['records']} | {lat['p50']} | {lat['p99']} | {lat['max']} | "
                     f"{r['p99_ratio_to_baseline']} | {r['idle_cpu_share']:.2%} |")
    (RESULTS / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
