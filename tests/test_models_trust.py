"""The models topic's trust boundary: only the refitter's signed, valid models are ever served or adopted.

Without Kafka: :func:`validate_model` on every registry algorithm and on forgeries, the
strict header counts, HMAC-signed chunks through :class:`ModelAssembler`, the
``models_key_file`` settings. Against the embedded broker with real ``streamsemi run
--role`` processes: forged records on the models topic (a 4,000-digit version, the
newest payload replayed under version 1,000,000,000, NaN centroids from writer
``attacker``, permuted class names, centroids of the wrong width, a shadowed method)
change nothing: the assigner keeps serving the leader's model, a refitter elected
afterwards numbers on from the newest verified version and publishes its own model.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import uuid
from collections import defaultdict
from typing import Any

import numpy as np
import pytest
from kafka import KafkaProducer
from kafka_utils import producer, read_topic, send_json, wait_until
from test_estimator_contract import NAMES, corpus, make, targets
from test_roles import (
    CLASSES,
    _docs,
    _events,
    _fitted_engine,
    _publish,
    _Record,
    _role,
    _seed,
    _setup,
    _stop,
    _wait_outputs,
    key_file,
)

from streamsemi.core.errors import ConfigError
from streamsemi.engine import EngineConfig
from streamsemi.service import checkpoint
from streamsemi.service.config import resolve
from streamsemi.service.model_validation import reason_category, validate_model
from streamsemi.service.models_topic import (
    MAX_VERSION,
    ModelAssembler,
    chunk_records,
    decode_publication,
    encode_publication,
    parse_count,
    tombstone_record,
)


# ---------------------------------------------------------------- validate_model
@pytest.fixture(scope="module")
def fitted() -> dict[str, Any]:
    X, y = corpus()
    return {name: make(name).fit(X, targets(name, y)) for name in NAMES}


def _restored(name: str, est: Any) -> Any:
    state, arrays = checkpoint.estimator_state(est)
    return checkpoint.restore_estimator(json.loads(json.dumps(state)), arrays, name)


def test_validate_model_accepts_every_fitted_algorithm_and_its_restored_copy(fitted):
    for name, est in fitted.items():
        classes = [str(c) for c in est.classes_]
        assert validate_model(name, est, classes=classes, n_features=30) is None, name
        assert validate_model(name, _restored(name, est), classes=classes, n_features=30) is None, name


def test_validate_model_refuses_forged_models_with_a_reason(fitted):
    X, y = corpus()

    def ck(**changes: Any) -> Any:
        est = _restored("constrained-kmeans", fitted["constrained-kmeans"])
        for k, v in changes.items():
            setattr(est, k, v(est) if callable(v) else v)
        return est

    nan = ck(cluster_centers_=lambda e: np.where(np.arange(e.cluster_centers_.size).reshape(e.cluster_centers_.shape)
                                                 == 3, np.nan, e.cluster_centers_))
    assert validate_model("constrained-kmeans", nan).startswith("non_finite: ConstrainedKMeans.cluster_centers_")
    narrow = ck(cluster_centers_=lambda e: e.cluster_centers_[:, :10].copy())
    assert validate_model("constrained-kmeans", narrow, n_features=30).startswith("probe: predict_proba failed")
    assert validate_model("constrained-kmeans", ck(), n_features=4096) == \
        "n_features: the model reads 30 features, this process 4096"
    shadowed = ck(predict_proba=1)
    assert validate_model("constrained-kmeans", shadowed) == \
        "shadowed: instance attribute 'predict_proba' hides ConstrainedKMeans.predict_proba"
    assert validate_model("constrained-kmeans", ck(), classes=["beta", "alpha", "gamma"]).startswith("classes: ")
    assert validate_model("constrained-kmeans", ck(classes_=np.array(["a", "a", "b"], dtype=object))) == \
        "classes: classes_ holds the same class twice"
    assert validate_model("constrained-kmeans", make("constrained-kmeans")) == "not_fitted: no classes_"
    # the registry's exact class for the name: not another algorithm's, not a subclass
    assert validate_model("fsl-ck", fitted["constrained-kmeans"]).startswith("class: a ConstrainedKMeans is not FSL")
    sub = type("Sub", (type(fitted["constrained-kmeans"]),), {})()
    sub.__dict__.update(vars(fitted["constrained-kmeans"]))
    assert validate_model("constrained-kmeans", sub).startswith("class: a Sub is not ConstrainedKMeans")
    assert validate_model("no-such", fitted["cle"]).startswith("unknown_algorithm: ")
    # nested estimators are checked too (semi-LDC's PLSA, the ensemble's members)
    ldc = _restored("semi-ldc", fitted["semi-ldc"])
    ldc.plsa_.predict_proba = None
    assert validate_model("semi-ldc", ldc).startswith("shadowed: instance attribute 'predict_proba' hides "
                                                       "ConstrainedPLSA.predict_proba (in SemiLDC.plsa_)")
    ens = _restored("ensemble", fitted["ensemble"])
    member = next(m for m in ens.estimators_ if m is not None)
    member.cluster_centers_ = np.full_like(member.cluster_centers_, np.inf)
    assert validate_model("ensemble", ens).startswith("non_finite: Ensemble.estimators_[")
    # a multi-label model whose predict gives the wrong width
    lsc = _restored("pseudo-lsc", fitted["pseudo-lsc"])
    lsc.classes_ = np.append(lsc.classes_, "extra").astype(object)
    assert validate_model("pseudo-lsc", lsc, n_features=30).startswith("probe: ")
    assert {reason_category(r) for r in ("probe: x", "non_finite: y", "made up")} == {"probe", "non_finite",
                                                                                       "structure"}


def test_validate_model_allows_the_non_finite_values_fits_produce_legitimately(fitted):
    """Discovery thresholds of a class with nothing to calibrate on are -inf; an ensemble member that failed has
    NaN held-out scores. NaN elsewhere, +inf in thresholds, stay refused."""
    est = _restored("constrained-kmeans", fitted["constrained-kmeans"])
    est.discovery_thresholds_ = np.array([-np.inf, 0.2, 0.3])
    assert validate_model("constrained-kmeans", est) is None
    est.discovery_thresholds_ = np.array([np.inf, 0.2, 0.3])
    assert validate_model("constrained-kmeans", est).startswith("non_finite: ConstrainedKMeans.discovery_thresholds_")
    ens = _restored("ensemble", fitted["ensemble"])
    ens.heldout_accuracy_ = ens.heldout_accuracy_.copy()
    ens.heldout_accuracy_[0] = np.nan
    assert validate_model("ensemble", ens) is None
    ens.powers_ = ens.powers_.copy()
    ens.powers_[0] = np.nan
    assert validate_model("ensemble", ens).startswith("non_finite: Ensemble.powers_")


# ---------------------------------------------------------------- headers and signatures, no Kafka
def test_header_counts_are_ascii_digits_below_2_63():
    assert [parse_count(t) for t in ("0", "7", "000000000012", str(MAX_VERSION))] == [0, 7, 12, MAX_VERSION]
    bad = ["", " 7", "7 ", "+7", "-7", "1_000", "7.0", "\u0663", "0x10", str(MAX_VERSION + 1), "9" * 20, "9" * 4000,
           None]
    assert [parse_count(t) for t in bad] == [None] * len(bad)


def _chunks(payload: bytes, version: int, pub: str, key: bytes | None, writer: str = "w1",
            chunk: int = 4096) -> list[_Record]:
    return [_Record(k, v, h) for k, v, h in chunk_records(payload, stream="default", version=version,
                                                          publication_id=pub, chunk_bytes=chunk, writer=writer,
                                                          key=key)]


def _set_header(r: _Record, name: str, value: str) -> _Record:
    return _Record(r.key, r.value, [(k, value.encode() if k == name else v) for k, v in r.headers])


def test_signed_chunks_verify_and_anything_else_is_refused_before_it_is_counted():
    eng = _fitted_engine()
    key, other_key = os.urandom(32), os.urandom(32)
    reasons: list[str] = []
    asm = ModelAssembler(eng.config, max_bytes=10**9, key=key, on_reject=reasons.append)
    good = _chunks(_publish(eng, 3), 3, "good", key)
    assert [asm.feed(r) for r in good][-1].version == 3 and asm.max_seen == 3
    newer = _publish(eng, 4, parent=3)
    forged = [
        _chunks(newer, 4, "unsigned", None),                       # no signature
        _chunks(newer, 4, "other-key", other_key),                 # signed with another key
        [_set_header(r, "version", "1000000000") for r in _chunks(newer, 4, "renumbered", key)],  # header changed
        [_set_header(_chunks(newer, 4, "long", key)[0], "version", "9" * 4000)],  # 4,000 digits
    ]
    tampered = _chunks(newer, 4, "tampered", key)
    tampered[0] = _Record(tampered[0].key, bytes([tampered[0].value[0] ^ 1]) + tampered[0].value[1:],
                          tampered[0].headers)
    forged.append(tampered[:1])                                    # bytes changed after signing
    for records in forged:
        assert all(asm.feed(r) is None for r in records)
    assert asm.latest.publication_id == "good" and asm.max_seen == 3 and not asm.partial and not asm.refused
    assert reasons == ["signature"] * sum(len(records) for records in forged)
    # a signed tombstone removes a version from the index, an unsigned one changes nothing
    assert [v for v, _ in asm.obsolete(keep=0)] == [3]
    asm.feed(_Record(*tombstone_record("default", 3, 0, None)))
    assert [v for v, _ in asm.obsolete(keep=0)] == [3]
    asm.feed(_Record(*tombstone_record("default", 3, 0, key)))
    assert asm.obsolete(keep=0) == []
    # the real next version verifies
    assert [asm.feed(r) for r in _chunks(newer, 4, "next", key)][-1].version == 4


def _serving_version_3(**callbacks: Any) -> tuple[Any, ModelAssembler, bytes]:
    """An engine, an assembler without a key that took its models as version 3 ('good'), and their payload."""
    eng = _fitted_engine()
    asm = ModelAssembler(eng.config, max_bytes=10**9, **callbacks)
    payload = _publish(eng, 3)
    assert [asm.feed(r) for r in _chunks(payload, 3, "good", None)][-1].version == 3
    return eng, asm, payload


def test_without_a_key_versions_are_strict_and_a_payload_must_be_the_publication_its_chunks_announce():
    reasons: list[str] = []
    eng, asm, payload = _serving_version_3(on_reject=reasons.append)
    # a 4,000-digit version with a bad checksum: refused, not counted
    huge = _chunks(b"x", 5, "huge", None)[0]
    huge = _set_header(_set_header(huge, "version", "9" * 4000), "sha256", "0" * 64)
    assert asm.feed(huge) is None and asm.max_seen == 3
    # a chunk of a version that never completes is not counted without a key either
    partial = _chunks(_publish(eng, 8), 8, "partial", None)
    assert asm.feed(partial[0]) is None and asm.max_seen == 3
    # the newest payload replayed under another version, stream or writer
    assert all(asm.feed(r) is None for r in _chunks(payload, 1_000_000_000, "replay", None))
    assert all(asm.feed(r) is None for r in _chunks(payload, 3, "renamed", None, writer="attacker"))
    assert asm.latest.publication_id == "good" and asm.max_seen == 3
    assert reasons == ["bad_headers", "mismatch", "mismatch"]


def _forge(payload: bytes, config: Any, version: int, mutate: Any, writer: str = "attacker") -> bytes:
    header, models, _ = decode_publication(payload, config)
    for slot in models.values():
        mutate(slot)
    meta = header["publication"]
    forged, _ = encode_publication(models, version=version, parent_version=meta["version"], writer=writer,
                                   primary=meta["primary"], n_features=config.n_features, stop_words=config.stop_words,
                                   window=meta["window"], seeds=meta["seeds"])
    return forged


def _nan_centroids(slot: Any) -> None:
    slot.model.cluster_centers_ = np.full_like(slot.model.cluster_centers_, np.nan)


def _narrow_centroids(slot: Any) -> None:
    slot.model.cluster_centers_ = slot.model.cluster_centers_[:, :100].copy()


def _shadowed_method(slot: Any) -> None:
    slot.model.predict_proba = 1


def _permuted_classes(slot: Any) -> None:
    slot.model.classes_ = np.roll(slot.model.classes_, 1)
    slot.classes = np.roll(slot.classes, 1)


def test_an_invalid_model_is_refused_by_category_and_the_previous_one_stays():
    refused: list[str] = []
    eng, asm, payload = _serving_version_3(on_refuse=refused.append)
    for i, mutate in enumerate((_nan_centroids, _narrow_centroids, _shadowed_method)):
        forged = _forge(payload, eng.config, 10 + i, mutate, writer="w1")
        assert all(asm.feed(r) is None for r in _chunks(forged, 10 + i, f"forged{i}", None))
    assert refused == ["non_finite", "probe", "shadowed"]
    assert asm.latest.publication_id == "good" and asm.max_seen == 3


# ---------------------------------------------------------------- settings
def test_models_key_file_is_checked_at_start(tmp_path):
    key = key_file(tmp_path)
    s = resolve({"role": "refit", "models_key_file": key}, env={})
    assert s.models_key_file == key and not s.insecure_models
    assert resolve({"role": "all"}, env={}).role == "all"  # one process: no models topic, no key
    assert resolve({"role": "assign", "insecure_models": "true"}, env={}).insecure_models
    assert resolve({}, env={"STREAMSEMI_MODELS_KEY_FILE": key, "STREAMSEMI_ROLE": "assign"}).models_key_file == key
    for role in ("refit", "assign"):
        with pytest.raises(ConfigError, match=rf"^setting 'models_key_file' \(from default\): role '{role}' signs and "
                                              r"verifies .* or insecure_models \(--insecure-models\) to run without, "
                                              r"got ''$"):
            resolve({"role": role}, env={})
    short = tmp_path / "short.key"
    short.write_bytes(b"x" * 31)
    short.chmod(0o600)
    with pytest.raises(ConfigError, match=r"setting 'models_key_file' \(from flag --models-key-file\): must hold at "
                                          r"least 32 bytes of key material, got .* with 31"):
        resolve({"role": "refit", "models_key_file": str(short)}, env={})
    shared = tmp_path / "shared.key"
    shared.write_bytes(os.urandom(32))
    shared.chmod(0o644)
    with pytest.raises(ConfigError, match=r"must not be readable or writable by others \(chmod 600 .*mode 0644"):
        resolve({"role": "assign", "models_key_file": str(shared)}, env={})
    with pytest.raises(ConfigError, match=r"setting 'models_key_file' .*must be a readable file, got .*missing"):
        resolve({"role": "assign", "models_key_file": str(tmp_path / "missing")}, env={})
    with pytest.raises(ConfigError, match="must be a regular file"):
        resolve({"role": "assign", "models_key_file": str(tmp_path)}, env={})
    with pytest.raises(ConfigError, match=r"setting 'insecure_models' \(from flag --insecure-models\): is set but "
                                          "models_key_file is set too"):
        resolve({"role": "assign", "models_key_file": key, "insecure_models": "true"}, env={})


@pytest.mark.parametrize("role", ["refit", "assign"])
def test_a_role_without_a_key_refuses_to_start_with_one_line(role):
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMSEMI_") or k == "STREAMSEMI_DATA_DIR"}
    out = subprocess.run([sys.executable, "-m", "streamsemi", "run", "--role", role, "--bootstrap-servers",
                          "127.0.0.1:1", "--metrics-port", "0"], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"streamsemi: configuration error: setting 'models_key_file' (from default): role '{role}' signs"), out.stderr


# ---------------------------------------------------------------- real broker, real processes
def _models_records(bootstrap: str, topic: str) -> list[Any]:
    return [r for r in read_topic(bootstrap, topic, idle=1.0) if r.value is not None]


def _newest_payload(records: list[Any]) -> tuple[int, bytes]:
    """The newest complete publication on the topic, assembled from its records as they are."""
    parts: dict[tuple[int, str], dict[int, bytes]] = defaultdict(dict)
    counts: dict[tuple[int, str], int] = {}
    for r in records:
        h = {k: v.decode() for k, v in r.headers}
        key = (int(h["version"]), h["publication"])
        parts[key][int(h["chunk"])] = r.value
        counts[key] = int(h["chunks"])
    version, pub = max(k for k in parts if len(parts[k]) == counts[k])
    return version, b"".join(parts[(version, pub)][i] for i in range(counts[(version, pub)]))


def _send_records(bootstrap: str, topic: str, records: list[tuple[bytes, bytes, list]]) -> None:
    p = KafkaProducer(bootstrap_servers=bootstrap, acks="all", max_request_size=4_000_000)
    try:
        for k, v, h in records:
            p.send(topic, key=k, value=v, headers=h)
        p.flush(60)
    finally:
        p.close()


def _served(outputs: list[dict], ids: list[str]) -> dict[str, dict]:
    want = set(ids)
    return {o["id"]: o for o in outputs if o["id"] in want}


def _correct(served: dict[str, dict]) -> float:
    return sum(o["label"] == CLASSES[int(o["id"].lstrip("abcdefghijklmnopqrstuvwxyz")) % 4]
               for o in served.values()) / max(1, len(served))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["key", "insecure"])
def test_forged_models_topic_records_are_never_served_nor_adopted_and_a_new_leader_numbers_on(broker, tmp_path,
                                                                                               mode):
    """Each attack on the models topic, then a leader election: the assigner keeps the leader's model, the new
    leader continues at the newest verified version + 1 and publishes its own model.

    With a key every forgery fails its signature; with ``--insecure-models`` (which warns at start) the strict
    version, the payload's own version and writer, and model validation still refuse all but the permuted class
    names (which only a signature can tell from a real model, so that one is sent in key mode only)."""
    topics = _setup(broker, partitions=2)
    models_topic = f"{topics.prefix}.models"
    rng = random.Random(5)
    security = [] if mode == "key" else ["--insecure-models"]

    def start(role: str, name: str) -> Any:
        w = _role(broker, topics, role, tmp_path, name)
        if mode == "insecure":
            i = w.cmd.index("--models-key-file")
            del w.cmd[i:i + 2]
            w.cmd += security
        return w.start()

    first = start("refit", "refit-a")
    assigner = start("assign", "assign-0")
    workers = [first, assigner]
    try:
        assert first.wait_metric("streamsemi_refit_leader", 1, timeout=90) == 1
        second = start("refit", "refit-b")
        workers.append(second)
        p = producer(broker.bootstrap)
        _seed(p, topics, rng)
        ids = _docs(p, topics, rng, "a", 150)
        out = _wait_outputs(broker, topics, ids, 120)
        assert set(ids) <= {o["id"] for o in out}
        v1 = max(o["model_version"] for o in out)
        assert second.wait_metric("streamsemi_serving_model_version", v1, timeout=60) == v1
        assert assigner.wait_metric("streamsemi_serving_model_version", v1, timeout=60) == v1

        # the attacks, written straight to the models topic
        legit = _models_records(broker.bootstrap, models_topic)
        version, payload = _newest_payload(legit)
        assert version == v1
        config = EngineConfig(algorithms=["constrained-kmeans"], n_features=4096)
        template = [(k, v) for k, v in legit[0].headers]
        huge = [(k, b"9" * 4000 if k == "version" else b"0" * 64 if k == "sha256" else v) for k, v in template]
        forged: list[tuple[bytes, bytes, list]] = [(b"default/forged/00000", b"x", huge)]
        forged += chunk_records(payload, stream="default", version=1_000_000_000, publication_id=uuid.uuid4().hex,
                                chunk_bytes=20000, writer="refit-a")
        attacks = [_nan_centroids, _narrow_centroids, _shadowed_method] + ([_permuted_classes] if mode == "key" else [])
        for i, mutate in enumerate(attacks):
            v = 2_000_000_000 + i
            forged += chunk_records(_forge(payload, config, v, mutate), stream="default", version=v,
                                    publication_id=uuid.uuid4().hex, chunk_bytes=20000, writer="attacker")
        _send_records(broker.bootstrap, models_topic, forged)
        rejected = 1 + 1 + len(attacks)   # publications (key mode: every record is refused on its own)
        want = len(forged) if mode == "key" else rejected

        def refusals(w: Any) -> float:
            return w.metric("streamsemi_model_publications_rejected_total") or 0

        assert wait_until(lambda: refusals(assigner) >= want and refusals(second) >= want, 60), \
            (refusals(assigner), refusals(second))
        if mode == "key":
            assert assigner.metric("streamsemi_model_publications_rejected_total", {"reason": "signature"}) == want
        else:
            by = {r: assigner.metric("streamsemi_model_publications_rejected_total", {"reason": r}) or 0
                  for r in ("bad_headers", "mismatch", "invalid_model")}
            assert by == {"bad_headers": 1, "mismatch": 1, "invalid_model": 3}, by
            assert {r: assigner.metric("streamsemi_models_refused_total", {"reason": r})
                    for r in ("non_finite", "probe", "shadowed")} == {"non_finite": 1, "probe": 1, "shadowed": 1}
            for w in workers:
                assert [e["setting"] for e in _events(w, "models_insecure")] == ["insecure_models"]

        # the assigner still serves the leader's model: same version, real scores, right labels, no dead letters
        ids2 = _docs(p, topics, rng, "b", 80)
        served = _served(_wait_outputs(broker, topics, ids2, 120), ids2)
        assert set(served) == set(ids2)
        assert {o["model_version"] for o in served.values()} == {v1}
        assert all(isinstance(o["score"], float) for o in served.values()) and _correct(served) >= 0.9
        assert assigner.metric("streamsemi_serving_model_version") == v1
        assert not read_topic(broker.bootstrap, topics.deadletter, idle=1.0)

        # a leader election: the new leader numbers on from the newest verified version, publishes its own model
        first.terminate(timeout=30)
        assert second.wait_metric("streamsemi_refit_leader", 1, timeout=60) == 1
        send_json(p, topics.control, {"op": "refit"})
        p.flush()
        assert wait_until(lambda: (second.metric("streamsemi_models_published_total") or 0) >= 1, 120)
        elected = _events(second, "refit_leader_elected")[-1]
        assert elected["latest_published"] == v1 and elected["next_version"] == v1 + 1
        published = _events(second, "model_published")[0]
        assert published["version"] == v1 + 1 and published["parent_version"] == v1
        assert not [e for e in _events(second, "model_adopted") if e["writer"] != "refit-a"]
        assert assigner.wait_metric("streamsemi_serving_model_version", v1 + 1, timeout=60) == v1 + 1
        ids3 = _docs(p, topics, rng, "c", 80)
        served = _served(_wait_outputs(broker, topics, ids3, 120), ids3)
        assert {o["model_version"] for o in served.values()} == {v1 + 1} and set(served) == set(ids3)
        assert all(isinstance(o["score"], float) for o in served.values()) and _correct(served) >= 0.9
        for w in workers:
            text = w.log_path.read_text(errors="replace")
            assert "OverflowError" not in text and "Traceback" not in text
    finally:
        _stop(*workers)


def test_a_rejected_record_is_logged_with_its_topic_partition_and_offset(caplog):
    """A refused models record's log line says where it is (topic, partition, offset), signed or not."""
    from dataclasses import dataclass

    @dataclass
    class Positioned:
        key: bytes
        value: bytes | None
        headers: list
        topic: str = "streamsemi.models"
        partition: int = 0
        offset: int = 0

    eng = _fitted_engine()
    key = os.urandom(32)
    asm = ModelAssembler(eng.config, max_bytes=10**9, key=key)
    unsigned = _chunks(_publish(eng, 3), 3, "unsigned", None)[0]
    bad_sum = _set_header(_chunks(_publish(eng, 4), 4, "bad", None)[0], "sha256", "0" * 64)
    caplog.set_level("WARNING", logger="streamsemi.service.models_topic")
    asm.feed(Positioned(unsigned.key, unsigned.value, unsigned.headers, partition=2, offset=41))
    ModelAssembler(eng.config, max_bytes=10**9).feed(Positioned(bad_sum.key, bad_sum.value, bad_sum.headers,
                                                                partition=1, offset=7))
    got = [(r.fields["reason"], r.fields["topic"], r.fields["partition"], r.fields["offset"]) for r in caplog.records
           if r.getMessage() == "model_publication_rejected"]
    assert got == [("signature", "streamsemi.models", 2, 41), ("checksum", "streamsemi.models", 1, 7)]


@pytest.mark.parametrize("last", [b"\n", b" ", b"\r", b"\t"])
def test_a_random_key_ending_in_a_whitespace_byte_is_a_whole_key(tmp_path, last):
    """``head -c 32 /dev/urandom`` ends in a line feed or a space about once in 60 keys: every byte is key material,
    so such a key is accepted (it was cut to 31 bytes and refused) and it is the key that signs."""
    from streamsemi.service.config import read_models_key

    path = tmp_path / "models.key"
    raw = os.urandom(31) + last
    path.write_bytes(raw)
    path.chmod(0o600)
    s = resolve({"role": "assign", "instance_id": "a-1", "metrics_port": "0", "models_key_file": str(path)})
    assert s.values["models_key_file"] == str(path)
    assert read_models_key(str(path)) == raw
