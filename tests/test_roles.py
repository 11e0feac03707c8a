"""Roles: one refitter per stream, many assigners, the same model everywhere.

The publication format is checked without Kafka (encode -> chunks -> assembler ->
decode); the roles run as real ``streamsemi run --role ...`` processes against the
embedded broker.
"""

from __future__ import annotations

import json
import random
import time
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import pytest
from kafka_utils import (
    DEADLINE,
    Topics,
    WorkerProcess,
    producer,
    read_table,
    read_topic,
    send_json,
    wait_for,
    wait_until,
)

from streamsemi.core.messages import Document
from streamsemi.engine import Engine, EngineConfig
from streamsemi.service.config import resolve
from streamsemi.service.kafka_io import ensure_topics
from streamsemi.service.models_topic import (
    ModelAssembler,
    ModelsTopicError,
    chunk_records,
    decode_publication,
    encode_publication,
)

CLASSES = ("grain", "crude", "money", "ships")


def key_file(tmp_path) -> str:
    """A models key file (32 random bytes, mode 600) in ``tmp_path``: roles refuse to start without one."""
    import os

    path = tmp_path / "models.key"
    if not path.exists():
        path.write_bytes(os.urandom(32))
        path.chmod(0o600)
    return str(path)


def _vocab(cls: str) -> list[str]:
    return [f"{cls}{w}" for w in ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
                                  "juliet", "kilo", "lima", "mike", "november", "oscar", "papa")]


COMMON = ["market", "report", "today", "company", "price", "week", "said", "year"]


def _text(rng: random.Random, cls: str) -> str:
    return " ".join(rng.choices(_vocab(cls), k=12) + rng.choices(COMMON, k=6))


def _fitted_engine(n: int = 240, algorithms: tuple[str, ...] = ("constrained-kmeans",)) -> Engine:
    rng = random.Random(3)
    eng = Engine(EngineConfig(algorithms=list(algorithms), background_refit=False, min_docs_first_refit=20,
                              min_seed_classes=2, first_fit_stable_seeds=0, refit_growth=0, n_features=2**12))
    docs = [Document(id=f"d{i}", text=_text(rng, CLASSES[i % 4])) for i in range(n)]
    for i in range(16):
        eng.label(f"s{i}", [CLASSES[i % 4]], _text(rng, CLASSES[i % 4]))
    eng.process(docs)
    eng.request_refit()
    assert eng.ready
    return eng


@dataclass
class _Record:
    key: bytes
    value: bytes | None
    headers: list
    offset: int = 0


def _records(payload: bytes, version: int, pub: str, chunk: int, key: bytes | None = None) -> list[_Record]:
    return [_Record(k, v, h) for k, v, h in chunk_records(payload, stream="default", version=version,
                                                          publication_id=pub, chunk_bytes=chunk, writer="w1",
                                                          key=key)]


def _publish(eng: Engine, version: int, parent: int | None = None) -> bytes:
    payload, _ = encode_publication(eng.models, version=version, parent_version=parent, writer="w1",
                                    primary=eng.primary, n_features=eng.config.n_features,
                                    stop_words=eng.config.stop_words, window={"documents": len(eng.window)},
                                    seeds=len(eng.seeds))
    return payload


def test_publication_round_trip_through_chunks_predicts_the_same():
    eng = _fitted_engine(algorithms=("constrained-kmeans", "seeded-kmeans"))
    payload = _publish(eng, 7, parent=6)
    records = _records(payload, 7, "p1", chunk=4096)
    assert len(records) == -(-len(payload) // 4096) >= 2
    asm = ModelAssembler(eng.config, max_bytes=10**9)
    done = [asm.feed(r) for r in records]
    assert all(d is None for d in done[:-1]) and done[-1] is not None
    pub = done[-1]
    assert (pub.version, pub.parent_version, pub.writer, pub.chunks) == (7, 6, "w1", len(records))
    assert set(pub.models) == {"constrained-kmeans", "seeded-kmeans"}
    header = pub.header["publication"]
    assert header["algorithms"] == ["constrained-kmeans", "seeded-kmeans"] and header["seeds"] == 16
    # the decoded models label every window document exactly as the originals
    X = eng.window.rows()
    from streamsemi.core.store import rows_to_csr
    Xm = rows_to_csr(X, eng.config.n_features)
    for name, slot in eng.models.items():
        np.testing.assert_allclose(pub.models[name].model.predict_proba(Xm), slot.model.predict_proba(Xm))
        assert pub.models[name].version == slot.version
    # serving it from another engine: same labels, global version in the outputs
    other = Engine(EngineConfig(algorithms=["constrained-kmeans", "seeded-kmeans"], n_features=2**12,
                                revisions="off", drift_detection=False))
    other.adopt_models(pub.models, pub.version, pub.primary)
    rng = random.Random(9)
    probe = [Document(id=f"p{i}", text=_text(rng, CLASSES[i % 4])) for i in range(40)]
    served = {(a.id, a.algorithm): (a.label, a.model_version) for a in other.serve(probe).assignments}
    own = {(a.id, a.algorithm): (a.label, a.model_version) for a in eng.process(probe).assignments}
    assert served == own and len(served) == 80
    assert other.window.ids() == [] and other.version == 7


def test_assembler_rejects_corruption_keeps_the_newest_and_bounds_memory():
    eng = _fitted_engine()
    payload = _publish(eng, 3)
    asm = ModelAssembler(eng.config, max_bytes=10**9)
    bad = _records(payload, 3, "bad", chunk=2048)
    bad[1].value = bytes([bad[1].value[0] ^ 1]) + bad[1].value[1:]  # corrupted chunk
    assert all(asm.feed(r) is None for r in bad)
    assert asm.latest is None and ("bad" not in [k[1] for k in asm.partial])
    good = _records(payload, 3, "good", chunk=2048)
    assert [asm.feed(r) for r in good][-1].publication_id == "good"
    # an older version arriving later is ignored; a newer one replaces
    old = _records(_publish(eng, 2), 2, "old", chunk=2048)
    assert all(asm.feed(r) is None for r in old) and asm.latest.version == 3
    newer = _records(_publish(eng, 5, parent=3), 5, "new", chunk=2048)
    assert [asm.feed(r) for r in newer][-1].version == 5 and asm.max_seen == 5
    # same version published twice (a deposed leader): the later one in the log wins
    again = _records(_publish(eng, 5, parent=3), 5, "again", chunk=2048)
    assert [asm.feed(r) for r in again][-1].publication_id == "again"
    # too large for max_model_bytes: refused before buffering
    small = ModelAssembler(eng.config, max_bytes=1000)
    assert all(small.feed(r) is None for r in good) and not small.partial and small.latest is None
    # obsolete versions for tombstones, and a tombstone removes one
    assert [v for v, _ in asm.obsolete(keep=1)] == [3]
    asm.feed(_Record(b"default/000000000003/00000", None, []))
    assert asm.obsolete(keep=1) == []
    # other settings: refused with the reason
    with pytest.raises(ModelsTopicError, match="n_features"):
        decode_publication(payload, EngineConfig(n_features=2**13))


def test_publisher_and_reader_through_the_broker_with_tombstones(broker):
    """Chunks, headers and tombstones through real Kafka: the reader ends on the newest version, old ones deleted."""
    from streamsemi.service.models_topic import ModelPublisher, ModelsReader
    from streamsemi.service.roles import ensure_role_topics

    eng = _fitted_engine()
    topics = Topics()
    s = resolve({"bootstrap_servers": broker.bootstrap, "models_topic": f"{topics.prefix}.models",
                 "refit_leader_topic": f"{topics.prefix}.leader", "model_chunk_bytes": 8192})
    assert sorted(ensure_role_topics(s)) == sorted([s.models_topic, s.refit_leader_topic])
    pub = ModelPublisher(s, "w1")
    seen = ModelsReader(s, eng.config)
    seen.start()
    try:
        infos = []
        for version in (1, 2, 3):
            infos.append(pub.publish(eng.models, version=version, parent_version=version - 1 or None,
                                     primary=eng.primary, n_features=eng.config.n_features,
                                     stop_words=eng.config.stop_words, window={"documents": 1}, seeds=16,
                                     obsolete=seen.obsolete(keep=1) if version == 3 else []))
            wait_for(lambda v=version: seen.latest() is not None and seen.latest().version == v, DEADLINE,
                     f"the reader sees version {version}")
        assert infos[0]["chunks"] == -(-infos[0]["bytes"] // 8192) > 1
        assert seen.latest().parent_version == 2
        wait_for(seen.caught_up.is_set, DEADLINE, "the reader caught up")
        # v1's chunks were tombstoned when v3 was published: the reader forgot it, v2 and v3 remain
        wait_for(lambda: [v for v, _ in seen.obsolete(keep=0)] == [2, 3], DEADLINE, "v1 forgotten, v2 and v3 kept")
        records = read_topic(broker.bootstrap, s.models_topic, idle=1.0)
        tombstones = [r.key.decode() for r in records if r.value is None]
        assert sorted(tombstones) == [f"default/000000000001/{i:05d}" for i in range(infos[0]["chunks"])]
        # a reader started now (the embedded broker does not compact) takes the newest version too
        late = ModelsReader(s, eng.config)
        late.start()
        wait_for(lambda: late.caught_up.is_set() and late.latest() is not None, DEADLINE, "a late reader's model")
        assert late.latest().version == 3 and late.max_seen() == 3
        late.stop()
    finally:
        seen.stop()
        pub.close()


def test_the_refitter_chooses_primary_auto_and_publishes_it_before_its_held_out_probes_end(broker, monkeypatch):
    """A refitter assigns nothing, and assignment is where an engine chose ``primary = auto``: the leader kept
    publishing the first algorithm as the primary whatever its held-out seeds said, and the assigners served it
    (here pseudo-LSC, held-out accuracy 0.64, over constrained k-means, 0.82; a worker serves the latter).
    And the leader publishes a round once its models are in, not after the probes that follow (one more fit of
    every algorithm: 66 s of a 124 s round with the ensemble), as a worker serves them."""
    import dataclasses

    from streamsemi.core.datasets import load
    from streamsemi.service.models_topic import ModelsReader
    from streamsemi.service.roles import Refitter, ensure_role_topics, round_fitted

    r8 = load("reuters-r8")

    def refitted() -> Engine:
        # one centroid per class: the held-out fold probed here is 0.81 for it against pseudo-LSC's 0.66 (with
        # centroids by class size, the worker's default, this fold is 0.66 too: the test is about roles, not models)
        e = Engine(EngineConfig(algorithms=["pseudo-lsc", "constrained-kmeans"], primary="auto",
                                background_refit=False, window_max_docs=3000, refit_every_docs=0, refit_growth=0,
                                refit_idle_s=0, drift_detection=False, first_fit_max_wait_s=0, min_docs_first_refit=1,
                                algorithm_params={"constrained-kmeans": {"prototypes": "one"}}))
        for i in range(0, 2000, 10):
            e.label(f"d{i}", [r8.labels[i]])
        e.absorb([Document(f"d{i}", r8.texts[i]) for i in range(2000)], update_sketch=True)
        e.request_refit()  # the round (and its held-out probes) ran; nothing has judged the new models yet
        return e

    # the refitter's windowing loop chooses after a swap
    eng = refitted()
    assert eng.primary == "pseudo-lsc"
    eng.learn([Document("late", r8.texts[2100])])
    assert eng.primary == "constrained-kmeans"
    # and the leader chooses before it publishes, whatever ran in between
    eng = refitted()
    acc = eng.held_out_accuracy()
    assert acc["constrained-kmeans"] > acc["pseudo-lsc"] + 0.1 and eng.primary == "pseudo-lsc"
    topics = Topics()
    s = resolve({"bootstrap_servers": broker.bootstrap, "models_topic": f"{topics.prefix}.models",
                 "refit_leader_topic": f"{topics.prefix}.leader", "algorithms": "pseudo-lsc,constrained-kmeans"})
    ensure_role_topics(s)
    refitter = Refitter(s)
    refitter.engine, refitter.leading = eng, True
    reader = ModelsReader(s, eng.config)
    reader.start()
    try:
        # the round still runs (its probes): a model of it still missing holds the publication back ...
        monkeypatch.setattr(Engine, "refitting", property(lambda self: True))
        models = eng.models
        eng.models = {**models, "pseudo-lsc": dataclasses.replace(models["pseudo-lsc"], version=0)}
        assert not round_fitted(eng)
        refitter._publish_if_due()
        eng.models = models
        assert round_fitted(eng)
        time.sleep(1.0)  # time for a wrong publication to arrive: a slow machine only weakens this, never fails it
        assert reader.latest() is None
        # ... and once every model of it is in, it is published without waiting for the round's end
        refitter._publish_if_due()
        wait_for(lambda: reader.latest() is not None, DEADLINE, "the publication")
        assert reader.latest().primary == "constrained-kmeans" == eng.primary
    finally:
        reader.stop()
        refitter.publisher.close()


def test_role_settings_are_checked_at_start(tmp_path):
    from streamsemi.core.errors import ConfigError
    from streamsemi.service.config import instance_name
    from streamsemi.service.roles import AssignWorker, Refitter, make_worker
    from streamsemi.service.worker import Worker

    with pytest.raises(ConfigError, match=r"setting 'role' \(from flag --role\): must be one of 'all', 'refit', 'assign', got 'fit'"):
        resolve({"role": "fit"})
    with pytest.raises(ConfigError, match="setting 'model_chunk_bytes'.*1024..100000000"):
        resolve({"model_chunk_bytes": "100"})
    with pytest.raises(ConfigError, match="setting 'models_topic'.*distinct"):
        resolve({"models_topic": "streamsemi.documents"})
    key = key_file(tmp_path)
    s = resolve({"role": "assign", "instance_id": "a-1", "metrics_port": "0", "models_key_file": key})
    assert instance_name(s) == "a-1" and instance_name(resolve({})).endswith(f"-{__import__('os').getpid()}")
    assert [type(make_worker(resolve({"role": r, "metrics_port": "0", "models_key_file": key})))
            for r in ("all", "refit", "assign")] == [
        Worker, Refitter, AssignWorker]
    a = AssignWorker(s)
    assert a.settings.revisions == "off" and not a.settings.drift_detection and not a.engine.refits_enabled
    assert a.fitter is None  # assigners never fit


# ---------------------------------------------------------------- real broker, real processes
ROLE_ARGS = ["--algorithms", "constrained-kmeans", "--min-docs-first-refit", "60", "--min-seed-classes", "4",
             "--min-seeds-per-class", "3", "--first-fit-stable-seeds", "0", "--refit-growth", "0",
             "--refit-idle-s", "0", "--refit-every-docs", "100000", "--n-features", "4096",
             "--model-chunk-bytes", "20000"]


def _setup(broker, partitions: int = 6) -> Topics:
    topics = Topics()
    base = {"bootstrap_servers": broker.bootstrap, "documents_topic": topics.documents,
            "control_topic": topics.control, "assignments_topic": topics.assignments,
            "deadletter_topic": topics.deadletter, "labels_topic": topics.labels}
    ensure_topics(resolve({**base, "topic_partitions": partitions}), [topics.documents])
    ensure_topics(resolve({**base, "topic_partitions": 3}))
    return topics


def _role(broker, topics: Topics, role: str, tmp_path, name: str) -> WorkerProcess:
    extra = ["--role", role, "--instance-id", name, "--models-key-file", key_file(tmp_path),
             "--models-topic", f"{topics.prefix}.models",
             "--refit-leader-topic", f"{topics.prefix}.leader", *ROLE_ARGS]
    return WorkerProcess(broker.bootstrap, topics, extra, log_dir=tmp_path)


def _seed(p, topics: Topics, rng: random.Random) -> None:
    for i in range(20):
        cls = CLASSES[i % 4]
        send_json(p, topics.control, {"op": "label", "id": f"seed{i}", "labels": [cls], "text": _text(rng, cls)},
                  key=f"seed{i}")


def _docs(p, topics: Topics, rng: random.Random, prefix: str, n: int) -> list[str]:
    ids = []
    for i in range(n):
        doc_id = f"{prefix}{i}"
        send_json(p, topics.documents, {"id": doc_id, "text": _text(rng, CLASSES[i % 4])}, key=doc_id)
        ids.append(doc_id)
    p.flush()
    return ids


def _outputs(broker, topics: Topics) -> list[dict]:
    return [json.loads(r.value) for r in read_topic(broker.bootstrap, topics.assignments, idle=2.0)]


def _wait_outputs(broker, topics: Topics, ids: list[str], timeout: float = DEADLINE) -> list[dict]:
    want = set(ids)
    got: list[dict] = []

    def done() -> bool:
        nonlocal got
        got = _outputs(broker, topics)
        return want <= {o["id"] for o in got}

    wait_until(done, timeout, interval=2.0)
    return got


def _events(w: WorkerProcess, name: str) -> list[dict]:
    return [e for e in w.logs() if e.get("event") == name]


def _stop(*workers: WorkerProcess) -> None:
    for w in workers:
        try:
            w.terminate(timeout=20)
        except Exception:  # noqa: BLE001
            w.kill()


@pytest.mark.slow
def test_one_refitter_three_assigners_same_labels_a_rebalance_without_loss_and_the_leaders_queue(broker, tmp_path):
    """Every document gets its output; per model version every worker gives one document the same label.

    Then an assigner joins and one leaves (SIGTERM) while documents flow: none is lost. The leader ranks
    and publishes the suggestion queue (docs/suggestions.md); the assigner that joins later holds no window and must
    not tombstone it at its start; a seed of a suggested document removes its suggestion.
    """
    topics = _setup(broker)
    rng = random.Random(1)
    refit = _role(broker, topics, "refit", tmp_path, "refit-a").start()
    assigners = [_role(broker, topics, "assign", tmp_path, f"assign-{k}").start() for k in range(3)]
    workers = [refit, *assigners]
    try:
        assert all(w.wait_assigned(DEADLINE) for w in assigners)
        p = producer(broker.bootstrap)
        _seed(p, topics, rng)
        ids = _docs(p, topics, rng, "a", 300)
        out = _wait_outputs(broker, topics, ids)
        assert {o["id"] for o in out} >= set(ids), "documents without outputs"
        version = max(o["model_version"] for o in out)
        assert all(o["worker"] in {"assign-0", "assign-1", "assign-2"} for o in out)
        assert len({o["worker"] for o in out}) == 3  # six partitions over three assigners
        # the same documents through every partition: every assigner labels each of them
        probes = [(f"probe{i}", _text(rng, CLASSES[i % 4])) for i in range(20)]
        for part in range(6):
            for doc_id, text in probes:
                p.send(topics.documents, key=doc_id.encode(), value=json.dumps({"id": doc_id, "text": text}).encode(),
                       partition=part)
        p.flush()
        out = _wait_outputs(broker, topics, [d for d, _ in probes])
        wait_for(lambda: sum(1 for o in _outputs(broker, topics) if o["id"].startswith("probe")) >= 120, DEADLINE,
                 "every assigner's outputs of the probes", 2.0)
        out = _outputs(broker, topics)
        labels: dict[tuple[str, int], set[str]] = defaultdict(set)
        workers_of: dict[tuple[str, int], set[str]] = defaultdict(set)
        for o in out:
            labels[(o["id"], o["model_version"])].add(o["label"])
            workers_of[(o["id"], o["model_version"])].add(o["worker"])
        assert all(len(v) == 1 for v in labels.values()), {k: v for k, v in labels.items() if len(v) > 1}
        shared = [k for k, ws in workers_of.items() if k[0].startswith("probe") and len(ws) == 3]
        assert len(shared) >= 10, "the probes were not labelled by every assigner with one model version"
        served = [a.metric("streamsemi_serving_model_version", {"role": "assign"}) for a in assigners]
        assert served == [float(version)] * 3
        assert refit.metric("streamsemi_serving_model_version", {"role": "refit"}) == version
        assert refit.metric("streamsemi_refit_leader") == 1
        wait_for(lambda: len(read_table(broker.bootstrap, topics.suggestions)) >= 10, DEADLINE, "the queue", 1.0)
        queue = read_table(broker.bootstrap, topics.suggestions)
        assert set(queue) <= set(ids), "suggestions are window documents, never seeds"
        assert all(m["id"] == k and m["algorithm"] == "constrained-kmeans" and m["reason"] for k, m in queue.items())
        code, body = refit.get("/suggestions")
        assert code == 200 and {m["id"] for m in json.loads(body)} == set(queue)

        # rebalance: one joins, one leaves, documents keep flowing
        late = _role(broker, topics, "assign", tmp_path, "assign-3").start()
        workers.append(late)
        more = _docs(p, topics, rng, "b", 200)
        assert late.wait_assigned(DEADLINE)
        assert assigners[0].terminate(timeout=DEADLINE) == 0
        more += _docs(p, topics, rng, "c", 200)
        out = _wait_outputs(broker, topics, more)
        missing = set(more) - {o["id"] for o in out}
        assert not missing, f"{len(missing)} documents lost in the rebalance"
        assert any(o["worker"] == "assign-3" for o in out if o["id"] in set(more))
        assert set(read_table(broker.bootstrap, topics.suggestions)) == set(queue), "an assigner touched the queue"
        assert not any(_events(w, "suggestions_adopted") for w in [*assigners, late])
        target = min(queue, key=lambda k: queue[k]["rank"])
        send_json(p, topics.control, {"op": "label", "id": target, "labels": [CLASSES[int(target[1:]) % 4]]},
                  key=target)
        p.flush()
        wait_for(lambda: target not in read_table(broker.bootstrap, topics.suggestions), DEADLINE, "the tombstone", 1.0)
        wait_for(lambda: target not in refit.get("/suggestions")[1], DEADLINE, "the refitter's queue without it")
    finally:
        _stop(*workers)


@pytest.mark.long
@pytest.mark.slow
def test_refitter_kill9_failover_continues_from_the_latest_published_model(broker, tmp_path):
    topics = _setup(broker, partitions=2)
    rng = random.Random(2)
    first = _role(broker, topics, "refit", tmp_path, "refit-a").start()
    assigner = _role(broker, topics, "assign", tmp_path, "assign-0").start()
    workers = [first, assigner]
    try:
        assert first.wait_metric("streamsemi_refit_leader", 1) == 1
        second = _role(broker, topics, "refit", tmp_path, "refit-b").start()
        workers.append(second)
        p = producer(broker.bootstrap)
        _seed(p, topics, rng)
        ids = _docs(p, topics, rng, "a", 150)
        out = _wait_outputs(broker, topics, ids)
        assert {o["id"] for o in out} >= set(ids)
        v1 = max(o["model_version"] for o in out)
        # the standby adopts what the leader publishes
        assert second.wait_metric("streamsemi_serving_model_version", v1) == v1
        assert second.metric("streamsemi_refit_leader") == 0
        first.kill()  # kill -9 mid-stream
        ids2 = _docs(p, topics, rng, "b", 100)   # the assigner keeps serving the last model meanwhile
        # how fast the standby takes over is the group's session timeout plus the machine's speed (a measurement)
        assert second.wait_metric("streamsemi_refit_leader", 1) == 1, "no new refitter after the leader's kill"
        send_json(p, topics.control, {"op": "refit"})
        p.flush()
        assert (second.wait_metric("streamsemi_models_published_total", 1) or 0) >= 1
        elected = _events(second, "refit_leader_elected")[-1]
        assert elected["latest_published"] == v1 and elected["next_version"] == v1 + 1
        published = _events(second, "model_published")[0]
        assert published["version"] == v1 + 1 and published["parent_version"] == v1
        assert published["window"] >= 250  # it kept the window the dead leader had, plus what came since
        # it took the dead leader's suggestion queue over: what is not ranked again is tombstoned
        assert _events(second, "suggestions_adopted")[-1]["ids"] >= 1

        def queue_is_the_new_leaders() -> bool:
            ranked = {m["id"] for m in json.loads(second.get("/suggestions")[1])}
            return bool(ranked) and set(read_table(broker.bootstrap, topics.suggestions)) == ranked

        wait_for(queue_is_the_new_leaders, DEADLINE, "the new leader's queue on the topic", 1.0)
        assert assigner.wait_metric("streamsemi_serving_model_version", v1 + 1) == v1 + 1
        ids3 = _docs(p, topics, rng, "c", 50)
        out = _wait_outputs(broker, topics, ids + ids2 + ids3)
        assert {o["id"] for o in out} >= set(ids + ids2 + ids3), "documents lost in the failover"
        assert {o["model_version"] for o in out if o["id"] in set(ids3)} == {v1 + 1}
    finally:
        _stop(*workers)


# ---------------------------------------------------------------- Kubernetes: the roles overlay
def test_kubernetes_roles_overlay_refitters_and_lag_scaled_assigners():
    import shutil
    import subprocess
    from pathlib import Path

    import yaml

    from streamsemi.service.config import SETTINGS

    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed (kustomize patches need it)")
    root = Path(__file__).resolve().parent.parent / "deploy" / "kubernetes" / "overlays" / "roles"
    out = subprocess.run([kubectl, "kustomize", str(root)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(["Namespace", "ServiceAccount", "ConfigMap", "Service", "Service", "Deployment",
                            "StatefulSet", "PodDisruptionBudget", "PodDisruptionBudget", "ScaledObject",
                            "PrometheusRule", "ServiceMonitor"])
    by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    settings = next(d for d in docs if d["kind"] == "ConfigMap")["data"]
    names = {s.name for s in SETTINGS}
    assert all(k.startswith("STREAMSEMI_") and k[11:].lower() in names for k in settings)

    def env(workload: dict) -> dict[str, str]:
        (c,) = workload["spec"]["template"]["spec"]["containers"]
        assert c["envFrom"][0]["configMapRef"]["name"] == next(d for d in docs if d["kind"] == "ConfigMap")["metadata"]["name"]
        return {e["name"]: e.get("value") for e in c["env"]}

    refit = by[("StatefulSet", "streamsemi")]
    assign = by[("Deployment", "streamsemi-assign")]
    assert refit["spec"]["replicas"] == 2 and env(refit)["STREAMSEMI_ROLE"] == "refit"
    assert env(assign)["STREAMSEMI_ROLE"] == "assign" and env(assign)["STREAMSEMI_STATE_DIR"] == ""
    # distinct pods: neither controller selects the other's pods
    refit_labels = refit["spec"]["template"]["metadata"]["labels"]
    assign_labels = assign["spec"]["template"]["metadata"]["labels"]
    assert not refit["spec"]["selector"]["matchLabels"].items() <= assign_labels.items()
    assert not assign["spec"]["selector"]["matchLabels"].items() <= refit_labels.items()
    # both are scraped by the one ServiceMonitor (job="streamsemi")
    sm = next(d for d in docs if d["kind"] == "ServiceMonitor")
    services = [d for d in docs if d["kind"] == "Service"]
    assert all(sm["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items() for s in services)
    assert sorted(any(s["spec"]["selector"].items() <= lab.items() for s in services)
                  for lab in (refit_labels, assign_labels)) == [True, True]
    # KEDA scales the assigners on the documents lag, never beyond the partitions
    so = next(d for d in docs if d["kind"] == "ScaledObject")
    assert so["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "streamsemi-assign"}
    (trigger,) = so["spec"]["triggers"]
    assert trigger["metadata"]["consumerGroup"] == settings["STREAMSEMI_GROUP_ID"]
    assert trigger["metadata"]["topic"] == settings["STREAMSEMI_DOCUMENTS_TOPIC"]
    assert 1 <= so["spec"]["minReplicaCount"] <= so["spec"]["maxReplicaCount"] <= int(settings["STREAMSEMI_TOPIC_PARTITIONS"])
    assert int(settings["STREAMSEMI_MODEL_CHUNK_BYTES"]) < 1_048_588  # Kafka's default max.message.bytes
    # both roles read the signing key from the same Secret, mounted with nothing for others (the start check)
    for workload in (refit, assign):
        spec = workload["spec"]["template"]["spec"]
        (c,) = spec["containers"]
        path = env(workload)["STREAMSEMI_MODELS_KEY_FILE"]
        (mount,) = [m for m in c["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
        (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
        assert volume["secret"]["secretName"] == "streamsemi-models-key" and volume["secret"]["defaultMode"] & 0o007 == 0
