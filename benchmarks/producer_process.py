"""CPU per output record of the worker's Kafka producer, by way of sending (issue 16, session 17).

The six-algorithm worker writes 7 records per document (an assignment per algorithm and
the labels record); its producer process spent ~19 us of CPU per record, about a core at
the worker's full speed on a 2-core machine. One run on one embedded broker (Tansu),
variants interleaved ``--repeats`` times, each sending ``--docs`` documents x
``--per-doc`` records of a worker-like assignment (~400 bytes, two headers) to a topic
of ``--partitions`` partitions and flushing:

* ``kafka-python``: :class:`~streamsemi.service.producer.OutputProducer` as before session
  17 (kafka-python's future per record, the sender woken for every "full" append);
* ``wake per new batch``: ``wake_when_full=False``;
* ``open-batch append``: also ``record_futures=False`` (the producer process's way since
  session 17);
* ``producer process``: the records through :class:`~streamsemi.service.producer.ProcessProducer`
  as the worker ships them (the child's CPU, which includes :func:`decode_batch`).

CPU = ``time.process_time`` of this process (the sending thread and kafka-python's
sender thread) or of the producer process (``/proc``); the broker's CPU is written too.
Ratios are to ``kafka-python`` of the same run::

    python benchmarks/producer_process.py --tag s17

Results: ``benchmarks/results/producer_process[_TAG].json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from kafka.admin import KafkaAdminClient, NewTopic

from streamsemi.devtools.broker import EmbeddedBroker
from streamsemi.service.producer import KeyPartitioner, OutputProducer, ProcessProducer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput import cpu_seconds, run_record, save, table  # noqa: E402 - this folder's throughput.py

RESULTS = Path(__file__).parent / "results"
VALUE = (b'{"id":"doc-0000001","algorithm":"semi-ldc","model_version":3,"revision":0,"label":"comp.graphics",'
         b'"score":0.812345,"labels":{"comp.graphics":0.812345,"comp.windows.x":0.101234},"cluster":"comp.graphics",'
         b'"new_cluster":false,"explain":["image","graphics","file","jpeg","format","color","program","gif"],'
         b'"primary":false,"provisional":false,"ts":1764260000.123,"worker":"w1234"}')
HEADERS = [("model_version", b"3"), ("revision", b"0")]
VARIANTS = {"kafka-python": (True, True), "wake per new batch": (True, False), "open-batch append": (False, False)}


def _send_all(send: Any, topics: tuple[str, str], docs: int, per_doc: int, ship: Any = None, chunk: int = 500) -> None:
    for start in range(0, docs, chunk):
        for d in range(start, min(docs, start + chunk)):
            key = b"doc-%07d" % d
            send(topics[0], VALUE, key, HEADERS)
            for _ in range(per_doc - 1):
                send(topics[1], VALUE, key, HEADERS)
        if ship is not None:
            ship()


def measure(p: Any, topics: tuple[str, str], args: argparse.Namespace, broker_pid: int,
            child_pid: int | None = None) -> dict[str, float]:
    """Send ``args.docs`` x ``args.per_doc`` records through ``p`` and flush; CPU of this process, or of ``child_pid``."""
    futures: list[Any] = []
    ship = getattr(p, "ship", None)

    def send(topic: str, value: bytes, key: bytes, headers: list) -> None:
        futures.append(p.send(topic, value=value, key=key, headers=headers))

    def cpu() -> float:
        return time.process_time() if child_pid is None else cpu_seconds(child_pid)[0]

    _send_all(send, topics, 200, args.per_doc, ship)  # metadata, connections
    p.flush(timeout=60)
    futures.clear()
    b0, c0, m0, t0 = cpu_seconds(broker_pid)[0], cpu(), time.process_time(), time.perf_counter()
    _send_all(send, topics, args.docs, args.per_doc, ship)
    p.flush(timeout=120)
    wall, used = time.perf_counter() - t0, cpu() - c0
    main, broker = time.process_time() - m0, cpu_seconds(broker_pid)[0] - b0
    if not all(f.is_done and not f.failed() for f in futures):
        raise RuntimeError("a record was not acknowledged")
    n = args.docs * args.per_doc
    return {"records": n, "wall_s": round(wall, 3), "cpu_s": round(used, 3), "sender_cpu_s": round(main, 3),
            "broker_cpu_s": round(broker, 3), "cpu_us_per_record": round(1e6 * used / n, 2),
            "records_per_s": round(n / wall)}


def run_in_process(conf: dict[str, Any], topics: tuple[str, str], args: argparse.Namespace, record_futures: bool,
                   wake_when_full: bool, broker_pid: int) -> dict[str, float]:
    p = OutputProducer(partitioner=KeyPartitioner(), **conf)
    p.record_futures, p.wake_when_full = record_futures, wake_when_full
    try:
        return measure(p, topics, args, broker_pid)
    finally:
        p.close(timeout=10)


def run_process(conf: dict[str, Any], topics: tuple[str, str], args: argparse.Namespace, broker_pid: int) -> dict[str, float]:
    p = ProcessProducer(conf)
    try:
        assert p.pid is not None
        return measure(p, topics, args, broker_pid, child_pid=p.pid)
    finally:
        p.close(timeout=10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=20_000)
    ap.add_argument("--per-doc", type=int, default=7, help="records per document (six algorithms: 7)")
    ap.add_argument("--partitions", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tag", default="")
    args = ap.parse_args()
    broker = EmbeddedBroker().start()
    try:
        bootstrap = f"{broker.host}:{broker.port}"
        topics = ("bench.labels", "bench.assignments")
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        admin.create_topics([NewTopic(t, args.partitions, 1) for t in topics])
        admin.close()
        conf = dict(bootstrap_servers=bootstrap, acks="all", linger_ms=10, batch_size=128 * 1024,
                    enable_idempotence=True, client_id="bench", max_request_size=1_048_576)  # the worker's
        assert broker.proc is not None
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in [*VARIANTS, "producer process"]}
        for _ in range(args.repeats):
            for name, (futures, wake) in VARIANTS.items():
                runs[name].append(run_in_process(conf, topics, args, futures, wake, broker.proc.pid))
            runs["producer process"].append(run_process(conf, topics, args, broker.proc.pid))
    finally:
        broker.stop()
    base = min(r["cpu_us_per_record"] for r in runs["kafka-python"])
    rows = {name: {"cpu_us_per_record_min": min(r["cpu_us_per_record"] for r in rs),
                   "cpu_us_per_record_runs": [r["cpu_us_per_record"] for r in rs],
                   "records_per_s_max": max(r["records_per_s"] for r in rs),
                   "broker_cpu_us_per_record": round(1e6 * min(r["broker_cpu_s"] for r in rs) / rs[0]["records"], 2),
                   "cpu_ratio_to_kafka_python": round(min(r["cpu_us_per_record"] for r in rs) / base, 2)}
            for name, rs in runs.items()}
    out = run_record(args, variants=rows, runs=runs)
    lines = [f"# Producer CPU per record, {out['when']}", "", f"`{out['command']}`", "",
             f"{args.docs:,} documents x {args.per_doc} records (~{len(VALUE)} bytes, 2 headers), "
             f"{args.partitions} partition(s), {args.repeats} interleaved runs; min over the runs.", ""]
    lines += table(["way", "CPU us / record", "ratio to kafka-python", "records/s (max)", "broker CPU us / record"],
                   ([name, f"{r['cpu_us_per_record_min']} ({', '.join(map(str, r['cpu_us_per_record_runs']))})",
                     r["cpu_ratio_to_kafka_python"], f"{r['records_per_s_max']:,}", r["broker_cpu_us_per_record"]]
                    for name, r in rows.items()))
    save("producer_process", args.tag, out, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
