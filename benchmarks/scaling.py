"""Roles: assigners' docs/s with 1 and 2 processes, and the cost of publishing a model.

``assign`` phase
    One embedded broker; a constrained k-means model fitted in this process on
    ``--fit-docs`` 20 Newsgroups documents (5% seeds) is published to the models
    topic (:class:`ModelPublisher`, as the refit leader does). Then for k = 1 and 2:
    k ``streamsemi run --role assign`` processes on a fresh ``--partitions``-partition
    documents topic, started and ready (partitions assigned, the model swapped in:
    ``/readyz`` 200) before the clock starts; ``--docs`` documents are sent at full
    speed; docs/s = documents / (last first-output record - first document record)
    (``throughput.rate_of``, outputs read on the labels topic: one primary output per
    document). The speed-up is docs/s(2) / docs/s(1).
``publish`` phase
    For each window size (``--windows``, default 10,000 and 50,000 documents; 20NG
    cycled with unique ids past its 18,846 documents) and each algorithm, the model is
    fitted in this process (an Engine with that one algorithm, 5% seeds), then
    published to the models topic and read back: encoded bytes, chunks of
    ``--chunk-bytes``, encode + send seconds (acknowledged), and read + verify +
    decode seconds by a :class:`ModelsReader` from the start of a fresh topic.

Results: ``benchmarks/results/scaling[_TAG].json`` and ``.md`` (the command at the top);
the publish rows are written as each one finishes.

Examples::

    python benchmarks/scaling.py                                 # both phases
    python benchmarks/scaling.py --phases assign --docs 20000
    python benchmarks/scaling.py --phases publish --windows 10000 --algorithms constrained-kmeans,cle
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import _bench  # noqa: E402
from throughput import CORPUS, Corpus, OutputReader, _http_json, rate_of, send  # noqa: E402

#: ``--smoke``: 200 documents through one and two assigners of 2 partitions (a model fitted on 200), and
#: constrained k-means published at a 200-document window.
SMOKE = ["--docs", "200", "--partitions", "2", "--fit-docs", "200", "--windows", "200",
         "--algorithms", "constrained-kmeans"]
ALL = ("constrained-kmeans,seeded-kmeans,semi-ldc,cle,d-lda,fsl-sk,fsl-ck,fsl-ap,fsl-sap,pseudo-lsc,ensemble")


_KEY: list[str] = []


def models_key_file() -> str:
    """A models-topic signing key made for this run (mode 600), shared by the publisher and the assigners."""
    if not _KEY:
        path = Path(tempfile.mkdtemp(prefix="streamsemi-scaling-")) / "models.key"
        path.write_bytes(os.urandom(32))
        path.chmod(0o600)
        _KEY.append(str(path))
    return _KEY[0]


def settings_for(bootstrap: str, prefix: str, **extra: Any) -> Any:
    from streamsemi.service.config import resolve

    return resolve({"bootstrap_servers": bootstrap, "models_key_file": models_key_file(),
                    "documents_topic": f"{prefix}.documents",
                    "control_topic": f"{prefix}.control", "assignments_topic": f"{prefix}.assignments",
                    "deadletter_topic": f"{prefix}.deadletter", "labels_topic": f"{prefix}.labels",
                    "models_topic": f"{prefix}.models", "refit_leader_topic": f"{prefix}.leader",
                    "group_id": f"{prefix}-group", **extra})


def fitted_engine(corpus: Corpus, algorithm: str, n_docs: int, seed_fraction: float = 0.05) -> tuple[Any, float]:
    """An Engine with ``algorithm`` fitted on ``n_docs`` corpus documents (cycled), and the fit's seconds."""
    from streamsemi.core.messages import Document
    from streamsemi.engine import Engine, EngineConfig

    eng = Engine(EngineConfig(algorithms=[algorithm], background_refit=False, window_max_docs=n_docs,
                              max_buffered_docs=n_docs, refit_growth=0, refit_every_docs=0, refit_idle_s=0,
                              revisions="off", drift_detection=False, first_fit_max_wait_s=0))
    eng.refits_enabled = False
    rng = corpus.rng
    docs, seeds = [], []
    for j in range(n_docs):
        i = corpus.order[j % len(corpus.order)]
        doc_id = f"w{j}"
        docs.append(Document(id=doc_id, text=corpus.texts[i]))
        if corpus.labels[i] is not None and rng.random() < seed_fraction:
            seeds.append((doc_id, corpus.labels[i]))
    for k in range(0, len(docs), 5000):
        eng.learn(docs[k:k + 5000])
    for doc_id, label in seeds:
        eng.label(doc_id, [label])
    eng.refits_enabled = True
    t0 = time.perf_counter()
    eng.request_refit()
    return eng, time.perf_counter() - t0


def publish_once(bootstrap: str, eng: Any, chunk_bytes: int) -> dict[str, Any]:
    """Publish ``eng.models`` to a fresh models topic and read it back; sizes and seconds."""
    from streamsemi.service.models_topic import ModelPublisher, ModelsReader
    from streamsemi.service.roles import ensure_role_topics

    s = settings_for(bootstrap, "p" + uuid.uuid4().hex[:8], model_chunk_bytes=chunk_bytes)
    ensure_role_topics(s)
    pub = ModelPublisher(s, "bench")
    try:
        info = pub.publish(eng.models, version=1, parent_version=None, primary=eng.primary,
                           n_features=eng.config.n_features, stop_words=eng.config.stop_words,
                           window={"documents": len(eng.window)}, seeds=len(eng.seeds))
    finally:
        pub.close()
    reader = ModelsReader(s, eng.config)
    t0 = time.perf_counter()
    reader.start()
    while reader.latest() is None and time.perf_counter() - t0 < 600:
        time.sleep(0.05)
    read_s = time.perf_counter() - t0
    got = reader.latest()
    reader.stop()
    return {"bytes": info["bytes"], "chunks": info["chunks"], "encode_s": info["encode_seconds"],
            "publish_s": info["seconds"], "read_decode_s": round(read_s, 3) if got is not None else None,
            "round_trip_ok": got is not None and set(got.models) == set(eng.models)}


def publish_phase(args: argparse.Namespace, bootstrap: str, corpus: Corpus, out: dict, save: Any) -> None:
    rows = out.setdefault("publish", [])
    for window in [int(w) for w in args.windows.split(",")]:
        for alg in args.algorithms.split(","):
            t0 = time.perf_counter()
            try:
                eng, fit_s = fitted_engine(corpus, alg, window)
                row = {"algorithm": alg, "window": window, "fit_s": round(fit_s, 2),
                       **publish_once(bootstrap, eng, args.chunk_bytes)}
            except Exception as exc:  # noqa: BLE001 - one algorithm's failure is a row, not the end
                row = {"algorithm": alg, "window": window, "error": f"{type(exc).__name__}: {exc}"[:300]}
            row["total_s"] = round(time.perf_counter() - t0, 1)
            rows.append(row)
            print(json.dumps(row), flush=True)
            save()


def assign_phase(args: argparse.Namespace, bootstrap: str, corpus: Corpus, out: dict, save: Any) -> None:
    from kafka import KafkaProducer

    from streamsemi.devtools.broker import free_port
    from streamsemi.service.kafka_io import ensure_topics
    from streamsemi.service.models_topic import ModelPublisher
    from streamsemi.service.roles import ensure_role_topics

    eng, fit_s = fitted_engine(corpus, "constrained-kmeans", args.fit_docs)
    rows = out.setdefault("assign", [])
    for k in (1, 2):
        prefix = "a" + uuid.uuid4().hex[:8]
        s = settings_for(bootstrap, prefix, topic_partitions=args.partitions)
        ensure_topics(s)
        ensure_role_topics(s)
        pub = ModelPublisher(s, "bench")
        pub.publish(eng.models, version=1, parent_version=None, primary=eng.primary, n_features=eng.config.n_features,
                    stop_words=eng.config.stop_words, window={"documents": len(eng.window)}, seeds=len(eng.seeds))
        pub.close()
        procs, ports, logs = [], [], []
        for j in range(k):
            port = free_port()
            log = open(Path(tempfile.gettempdir()) / f"scaling-{prefix}-{j}.log", "wb")  # noqa: SIM115
            cmd = [sys.executable, "-m", "streamsemi", "run", "--role", "assign", "--instance-id", f"assign-{j}",
                   "--bootstrap-servers", bootstrap, "--algorithms", "constrained-kmeans",
                   "--metrics-port", str(port), "--session-timeout-ms", "6000", "--heartbeat-interval-ms", "1000"]
            for name in ("documents_topic", "control_topic", "assignments_topic", "deadletter_topic", "labels_topic",
                         "models_topic", "refit_leader_topic", "group_id", "models_key_file"):
                cmd += ["--" + name.replace("_", "-"), s.values[name]]
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=log))
            ports.append(port)
            logs.append(log)
        try:
            t0 = time.monotonic()
            while time.monotonic() - t0 < 120:
                bodies = [_readyz(p) if procs[j].poll() is None else "" for j, p in enumerate(ports)]
                ready = [b.startswith("{") and json.loads(b).get("model_loaded") and json.loads(b).get(
                    "partitions_assigned") for b in bodies]
                if all(ready):
                    break
                time.sleep(0.5)
            else:
                raise RuntimeError(f"assigners not ready: {bodies}")
            time.sleep(2.0)  # the group settled (no rebalance in the measured window)
            reader = OutputReader(s, s.labels_topic)
            producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=10, batch_size=256 * 1024, acks=1)
            msgs = corpus.messages(prefix, args.docs, 0, 0.0)
            sent = send(producer, {"documents": s.documents_topic}, msgs)
            producer.close()
            ok = reader.wait_for(list(sent), timeout=600, alive=lambda ps=procs: all(p.poll() is None for p in ps))
            reader.close()
            if not ok:
                raise RuntimeError("not every document got its output")
            row = {"assign_processes": k, "partitions": args.partitions, **rate_of(sent, reader.first)}
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
            for log in logs:
                log.close()
        rows.append(row)
        print(json.dumps(row), flush=True)
        save()
    if len(rows) >= 2:
        out["speedup_2_over_1"] = round(rows[-1]["docs_per_s"] / rows[-2]["docs_per_s"], 2)


def _readyz(port: int) -> str:
    try:
        return _http_json(port, "/readyz")
    except OSError:  # not listening yet
        return ""


def markdown(result: dict[str, Any]) -> str:
    lines = [f"# Roles: assign scaling and model publication ({result['environment']['when']})", "",
             "```", result["command"], "```", "", f"Environment: {json.dumps(result['environment'])}", ""]
    if result.get("assign"):
        lines += ["## Assign processes", "", "| processes | partitions | documents | seconds | docs/s |", "|---|---|---|---|---|"]
        for r in result["assign"]:
            lines.append(f"| {r['assign_processes']} | {r['partitions']} | {r['documents']} | {r['seconds']} | "
                         f"{r['docs_per_s']} |")
        if "speedup_2_over_1" in result:
            lines += ["", f"Speed-up 2 over 1: **{result['speedup_2_over_1']}x**"]
        lines.append("")
    if result.get("publish"):
        lines += ["## Publishing a model", "", "| algorithm | window | fit s | bytes | chunks | encode s | encode+send s | "
                  "read+decode s | round trip |", "|---|---|---|---|---|---|---|---|---|"]
        for r in result["publish"]:
            if "error" in r:
                lines.append(f"| {r['algorithm']} | {r['window']} | error: {r['error'][:80]} | | | | | | |")
            else:
                lines.append(f"| {r['algorithm']} | {r['window']} | {r['fit_s']} | {r['bytes']:,} | {r['chunks']} | "
                             f"{r['encode_s']} | {r['publish_s']} | {r['read_decode_s']} | {r['round_trip_ok']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--phases", default="assign,publish")
    p.add_argument("--docs", type=int, default=20000, help="documents per assign measurement")
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--fit-docs", type=int, default=3000, help="documents the served model is fitted on")
    p.add_argument("--windows", default="10000,50000")
    p.add_argument("--algorithms", default=ALL)
    p.add_argument("--chunk-bytes", type=int, default=900_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tag", default="")
    _bench.add_smoke(p)
    args = _bench.parse(p, argv, SMOKE)
    from streamsemi.devtools.broker import EmbeddedBroker

    results = _bench.results_dir(args.smoke)
    name = "scaling" + (f"_{args.tag}" if args.tag else "")
    out: dict[str, Any] = {"command": "python benchmarks/scaling.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                           "commit": _bench.commit(), "environment": {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                           "cpus": os.cpu_count(), "python": platform.python_version(),
                                           "corpus": CORPUS, "broker": "embedded Tansu"}}

    def save() -> None:
        (results / f"{name}.json").write_text(json.dumps(out, indent=2) + "\n")
        (results / f"{name}.md").write_text(markdown(out))

    corpus = Corpus(args.seed)
    broker = EmbeddedBroker(log_file=Path(tempfile.gettempdir()) / f"{name}-tansu.log").start()
    try:
        if "assign" in args.phases:
            assign_phase(args, broker.bootstrap_servers, corpus, out, save)
        if "publish" in args.phases:
            publish_phase(args, broker.bootstrap_servers, corpus, out, save)
    finally:
        broker.stop()
    save()
    print(markdown(out))
    print(f"wrote {results / name}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
