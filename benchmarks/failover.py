"""Roles under failure: scale to zero and back, kill -9 of an assigner, kill -9 of the active refitter.

Every phase runs ``streamsemi run --role ...`` processes on one embedded broker (Tansu),
with the worker's defaults apart from the group timing the tests use (a 6 s session timeout,
heartbeat 1 s) and a signing key made for the run.

``zero``
    A constrained k-means model (fitted in this process on ``--fit-docs`` 20 Newsgroups
    documents, 5% seeds) is published to the models topic. Then ``--rounds`` times:
    ``--assigners`` new assign processes start in the *same* group, ``--docs`` documents
    are sent at once (they wait on the broker), every one of them must get its output;
    then every assigner is stopped (SIGTERM: each leaves the group) before the next round
    starts new ones. Figures per round: seconds from the new processes' start to the
    first output and to the last (outputs' CreateTime), documents without output.
``assigner-kill``
    Two assigners serve a stream of ``--rate`` docs/s for ``--seconds``; a third of the
    way in one is killed (SIGKILL). Figures: the worst latency (first output - document
    record, CreateTime) of the documents sent after the kill (a document on one of the
    killed process's partitions waits until the group gives them to the survivor), and
    documents without output.
``refit-kill``
    A refitter, a standby refitter and one assigner; a stream of ``--rate`` docs/s with 5%
    seeds (until the failover is seen, at most ``--deadline`` seconds) and a refit every
    ``--refit-every-docs`` documents. Once the assigner serves
    version ``--kill-at-version`` (2), the active refitter is killed (SIGKILL). Figures: seconds from the
    kill until the assigner serves a version newer than the last one it served before the
    kill, whether the version it serves ever went back (sampled every 0.25 s from its
    /metrics), documents without output.

Results: ``benchmarks/results/failover[_TAG].json`` and ``.md`` (the command at the top).

Examples::

    python benchmarks/failover.py                         # all three phases (~6 minutes on 2 cores)
    python benchmarks/failover.py --phases zero --rounds 5
    python benchmarks/failover.py --smoke                 # seconds: a check that it runs
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _bench  # noqa: E402
from scaling import fitted_engine, settings_for  # noqa: E402
from throughput import Corpus, OutputReader, send  # noqa: E402

ROLE_SETTINGS = ("documents_topic", "control_topic", "assignments_topic", "deadletter_topic", "labels_topic",
                 "models_topic", "refit_leader_topic", "group_id", "models_key_file")


class Role:
    """One ``streamsemi run --role ROLE`` process with its metrics port and log."""

    def __init__(self, settings: Any, role: str, name: str, work: Path, extra: list[str] = ()) -> None:
        from streamsemi.devtools.broker import free_port

        self.port = free_port()
        self.log_path = work / f"{name}-{uuid.uuid4().hex[:4]}.log"
        cmd = [sys.executable, "-m", "streamsemi", "run", "--role", role, "--instance-id", name,
               "--bootstrap-servers", settings.bootstrap_servers, "--algorithms", "constrained-kmeans",
               "--metrics-port", str(self.port), "--session-timeout-ms", "6000", "--heartbeat-interval-ms", "1000",
               *extra]
        for k in ROLE_SETTINGS:
            cmd += ["--" + k.replace("_", "-"), settings.values[k]]
        self.cmd = cmd
        self.log = open(self.log_path, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log)
        self.started = time.time()

    def gauge(self, name: str) -> float | None:
        """The sum of metric ``name``'s samples on /metrics (None when absent or not answering)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2) as r:
                body = r.read().decode()
        except OSError:
            return None
        total = None
        for line in body.splitlines():
            if line.startswith(name) and (line[len(name)] in " {"):
                try:
                    total = (total or 0.0) + float(line.rpartition(" ")[2])
                except ValueError:
                    continue
        return total

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def _producer(bootstrap: str) -> Any:
    from kafka import KafkaProducer

    return KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks=1)


def _publish(s: Any, eng: Any) -> None:
    from streamsemi.service.models_topic import ModelPublisher

    pub = ModelPublisher(s, "bench")
    try:
        pub.publish(eng.models, version=1, parent_version=None, primary=eng.primary, n_features=eng.config.n_features,
                    stop_words=eng.config.stop_words, window={"documents": len(eng.window)}, seeds=len(eng.seeds))
    finally:
        pub.close()


def _topics(bootstrap: str, **extra: Any) -> Any:
    from streamsemi.service.kafka_io import ensure_topics
    from streamsemi.service.roles import ensure_role_topics

    s = settings_for(bootstrap, "f" + uuid.uuid4().hex[:8], **extra)
    ensure_topics(s)
    ensure_role_topics(s)
    return s


def phase_zero(args: argparse.Namespace, bootstrap: str, corpus: Corpus, work: Path) -> dict[str, Any]:
    eng, _ = fitted_engine(corpus, "constrained-kmeans", args.fit_docs)
    s = _topics(bootstrap, topic_partitions=args.partitions)
    _publish(s, eng)
    reader = OutputReader(s, s.labels_topic)
    rounds = []
    try:
        for r in range(args.rounds):
            roles = [Role(s, "assign", f"assign-{r}-{j}", work) for j in range(args.assigners)]
            t0 = min(x.started for x in roles)
            producer = _producer(bootstrap)
            sent = send(producer, {"documents": s.documents_topic}, corpus.messages(f"z{r}", args.docs, r * args.docs, 0.0))
            producer.close()
            reader.wait_for(list(sent), timeout=args.deadline, alive=lambda rs=roles: all(x.alive() for x in rs))
            got = [reader.first[k] / 1000 for k in sent if k in reader.first]
            row = {"round": r + 1, "assigners": args.assigners, "documents": len(sent),
                   "without_output": len(sent) - len(got),
                   "first_output_s": round(min(got) - t0, 2) if got else None,
                   "last_output_s": round(max(got) - t0, 2) if got else None,
                   "repairs": sum(1 for x in roles for line in x.log_path.read_text(errors="replace").splitlines()
                                  if '"consumer_group_departed_leader"' in line)}
            for x in roles:
                x.stop()  # every member leaves the group: scaled to zero
            rounds.append(row)
            print(json.dumps(row), flush=True)
    finally:
        reader.close()
    return {"rounds": rounds}


def _stream(bootstrap: str, topic: str, control: str, corpus: Corpus, prefix: str, rate: float, seconds: float,
            seed_fraction: float, sent: dict[bytes, int], stop: threading.Event) -> None:
    producer = _producer(bootstrap)
    n = int(rate * seconds)
    msgs = corpus.messages(prefix, n, 0, seed_fraction)
    t0 = time.monotonic()
    for j, (key, value, seed) in enumerate(msgs):
        if stop.is_set():
            break
        delay = t0 + j / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        if seed is not None:
            producer.send(control, key=key, value=seed)
        ms = int(time.time() * 1000)
        producer.send(topic, key=key, value=value, timestamp_ms=ms)
        sent[key] = ms
    producer.flush()
    producer.close()


def phase_assigner_kill(args: argparse.Namespace, bootstrap: str, corpus: Corpus, work: Path) -> dict[str, Any]:
    eng, _ = fitted_engine(corpus, "constrained-kmeans", args.fit_docs)
    s = _topics(bootstrap, topic_partitions=args.partitions)
    _publish(s, eng)
    roles = [Role(s, "assign", f"assign-k{j}", work) for j in range(2)]
    reader = OutputReader(s, s.labels_topic)
    try:
        deadline = time.monotonic() + args.deadline
        while not all((x.gauge("streamsemi_ready") or 0) >= 1 for x in roles):
            if time.monotonic() > deadline:
                raise RuntimeError("the assigners were not ready in time")
            time.sleep(0.5)
        sent: dict[bytes, int] = {}
        stop = threading.Event()
        t = threading.Thread(target=_stream, args=(bootstrap, s.documents_topic, s.control_topic, corpus, "k",
                                                   args.rate, args.seconds, 0.0, sent, stop), daemon=True)
        t.start()
        time.sleep(args.seconds / 3)
        killed_at = time.time()
        roles[0].stop(signal.SIGKILL)
        t.join()
        reader.wait_for(list(sent), timeout=args.deadline, alive=roles[1].alive)
        after = [(reader.first[k] - ms) / 1000 for k, ms in sent.items() if ms / 1000 >= killed_at and k in reader.first]
        return {"documents": len(sent), "without_output": sum(1 for k in sent if k not in reader.first),
                "after_kill": len(after), "worst_latency_after_kill_s": round(max(after), 2) if after else None,
                "rate": args.rate}
    finally:
        reader.close()
        for x in roles:
            x.stop()


def phase_refit_kill(args: argparse.Namespace, bootstrap: str, corpus: Corpus, work: Path) -> dict[str, Any]:
    s = _topics(bootstrap, topic_partitions=args.partitions)
    refit = ["--refit-every-docs", str(args.refit_every_docs)]
    leader = Role(s, "refit", "refit-a", work, refit)
    deadline = time.monotonic() + args.deadline
    while (leader.gauge("streamsemi_refit_leader") or 0) < 1:  # the first refitter leads: the standby starts after
        if time.monotonic() > deadline or not leader.alive():
            raise RuntimeError("the first refitter was not elected in time")
        time.sleep(0.5)
    standby = Role(s, "refit", "refit-b", work, refit)
    assigner = Role(s, "assign", "assign-r", work)
    reader = OutputReader(s, s.labels_topic)
    versions: list[tuple[float, float]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            v = assigner.gauge("streamsemi_serving_model_version")
            if v is not None:
                versions.append((time.time(), v))
            stop.wait(0.25)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    sent: dict[bytes, int] = {}
    halt = threading.Event()  # the stream runs until the failover is seen (at most --deadline seconds)
    streamer = threading.Thread(target=_stream, args=(bootstrap, s.documents_topic, s.control_topic, corpus, "r",
                                                      args.rate, max(args.seconds, args.deadline), 0.05, sent, halt),
                                daemon=True)
    try:
        streamer.start()
        while not versions or versions[-1][1] < args.kill_at_version:
            if time.monotonic() > deadline or not streamer.is_alive():
                raise RuntimeError(f"the assigner did not serve version {args.kill_at_version} while the stream ran")
            time.sleep(0.25)
        before = versions[-1][1]
        killed_at = time.time()
        leader.stop(signal.SIGKILL)
        while versions[-1][1] <= before and time.monotonic() < deadline:
            time.sleep(0.25)
        recovered = next((t for t, v in versions if t >= killed_at and v > before), None)
        halt.set()
        streamer.join()
        reader.wait_for(list(sent), timeout=args.deadline, alive=assigner.alive)
        seq = [v for _, v in versions]
        return {"documents": len(sent), "without_output": sum(1 for k in sent if k not in reader.first),
                "version_before_kill": before, "versions_seen": sorted(set(seq)),
                "failover_s": round(recovered - killed_at, 2) if recovered else None,
                "version_went_back": any(b < a for a, b in zip(seq, seq[1:], strict=False)),
                "standby_leads": (standby.gauge("streamsemi_refit_leader") or 0) >= 1}
    finally:
        stop.set()
        halt.set()
        reader.close()
        for x in (leader, standby, assigner):
            x.stop()


def markdown(result: dict[str, Any]) -> str:
    lines = ["# Failover: roles on the embedded broker", "", f"`{result['command']}` at {result['commit']}", ""]
    if "zero" in result:
        lines += ["## Scale to zero and back", "",
                  "| round | assigners | documents | first output (s) | last output (s) | without output | "
                  "departed-leader repairs |", "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['round']} | {r['assigners']} | {r['documents']} | {r['first_output_s']} | "
                  f"{r['last_output_s']} | {r['without_output']} | {r['repairs']} |" for r in result["zero"]["rounds"]]
    if "assigner-kill" in result:
        r = result["assigner-kill"]
        lines += ["", "## kill -9 of an assigner", "",
                  f"{r['documents']} documents at {r['rate']:.0f} docs/s, {r['without_output']} without output; "
                  f"worst latency of the {r['after_kill']} sent after the kill: {r['worst_latency_after_kill_s']} s"]
    if "refit-kill" in result:
        r = result["refit-kill"]
        lines += ["", "## kill -9 of the active refitter", "",
                  f"assigner served v{r['version_before_kill']:.0f} at the kill; a newer version {r['failover_s']} s "
                  f"later; versions seen {[int(v) for v in r['versions_seen']]}, went back: {r['version_went_back']}; "
                  f"{r['documents']} documents, {r['without_output']} without output"]
    return "\n".join(lines) + "\n"


PHASES = {"zero": phase_zero, "assigner-kill": phase_assigner_kill, "refit-kill": phase_refit_kill}
SMOKE = ["--rounds", "1", "--docs", "100", "--fit-docs", "300", "--seconds", "40", "--rate", "50",
         "--refit-every-docs", "100", "--partitions", "2", "--kill-at-version", "1"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--phases", default="zero,assigner-kill,refit-kill", help=f"any of {', '.join(PHASES)}")
    ap.add_argument("--rounds", type=int, default=5, help="zero: scale-to-zero-and-back rounds")
    ap.add_argument("--assigners", type=int, default=2, help="zero: assign processes per round")
    ap.add_argument("--docs", type=int, default=400, help="zero: documents per round")
    ap.add_argument("--fit-docs", type=int, default=2000, help="documents of the published model")
    ap.add_argument("--partitions", type=int, default=8, help="partitions of the documents topic")
    ap.add_argument("--rate", type=float, default=200.0, help="kill phases: docs/s of the stream")
    ap.add_argument("--seconds", type=float, default=60.0, help="kill phases: seconds of the stream")
    ap.add_argument("--refit-every-docs", type=int, default=1000, help="refit-kill: the refitters' cadence")
    ap.add_argument("--kill-at-version", type=int, default=2,
                    help="refit-kill: the leader is killed once the assigner serves this version")
    ap.add_argument("--deadline", type=float, default=300.0, help="seconds before a phase gives up")
    ap.add_argument("--seed", type=int, default=0, help="document order")
    ap.add_argument("--tag", default="", help="suffix of the result files")
    _bench.add_smoke(ap)
    args = _bench.parse(ap, argv, SMOKE)
    from streamsemi.devtools.broker import EmbeddedBroker

    out_dir = _bench.results_dir(args.smoke)
    work = Path(tempfile.mkdtemp(prefix="streamsemi-failover-"))
    corpus = Corpus(args.seed)
    result: dict[str, Any] = {"command": "python benchmarks/failover.py " + " ".join(
        sys.argv[1:] if argv is None else argv), "commit": _bench.commit(), "cpus": os.cpu_count()}
    for name in [p for p in args.phases.split(",") if p]:
        broker = EmbeddedBroker(log_file=work / f"tansu-{name}.log").start()
        try:
            result[name] = PHASES[name](args, broker.bootstrap_servers, corpus, work)
        finally:
            broker.stop()
        print(json.dumps({name: result[name]}), flush=True)
    tag = "failover" + (f"_{args.tag}" if args.tag else "")
    (out_dir / f"{tag}.json").write_text(json.dumps(result, indent=2) + "\n")
    (out_dir / f"{tag}.md").write_text(markdown(result))
    print(markdown(result))
    print(f"wrote {out_dir / tag}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
