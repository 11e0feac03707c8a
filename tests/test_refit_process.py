"""Refits in a separate process (streamsemi/service/fitter.py): same models, no pickle, deaths reported and survived."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading

import numpy as np
import pytest
import scipy.sparse as sp
from kafka_utils import DEADLINE, alive, scheduling, wait_for

from streamsemi.algorithms import build_estimator
from streamsemi.core.datasets import load
from streamsemi.core.features import TextFeaturizer
from streamsemi.core.messages import Document
from streamsemi.engine import Engine, EngineConfig, fit_estimator
from streamsemi.service.fitter import (
    FIT_PRIORITY,
    FitProcess,
    FitProcessClosed,
    FitProcessDied,
    RemoteFitError,
    frame_parts,
    unpack,
)

CK = "constrained-kmeans"


@pytest.fixture(scope="module")
def r8():
    ds = load("reuters-r8")
    order = [int(i) for i in np.random.default_rng(5).permutation(len(ds))]
    return ds, order


@pytest.fixture(scope="module")
def fitter():
    f = FitProcess(nice=0).start()
    yield f
    f.close()


def _xy(ds, order, n=400, every=8):
    X = TextFeaturizer(2**14).transform([ds.texts[i] for i in order[:n]], update_sketch=False)
    keep = np.flatnonzero(np.diff(X.indptr) > 0)
    X = X[keep]
    y = [ds.labels[order[k]] if j % every == 0 else None for j, k in enumerate(keep)]
    return X, y, [f"r{order[k]}" for k in keep]


def pack(header, arrays) -> bytearray:
    """One frame as the fit process's pipe carries it (without the length): the parts joined, writable."""
    return bytearray(b"".join(bytes(p) for p in frame_parts(header, arrays)))


def test_frames_round_trip_arrays_without_pickle():
    arrays = {"a": np.arange(6, dtype=np.int32).reshape(2, 3), "b": np.array(["x", "yz"]), "c": np.zeros(0)}
    header, back = unpack(pack({"k": [1, "two", None]}, arrays))
    assert header == {"k": [1, "two", None]}
    for k, a in arrays.items():
        assert back[k].dtype == a.dtype and back[k].shape == a.shape and np.array_equal(back[k], a)
        assert back[k].flags.writeable
    with pytest.raises(TypeError):
        pack({}, {"o": np.array([{"x": 1}], dtype=object)})  # object arrays would need pickle
    frame = bytearray(pack({}, {"a": np.arange(4)}))
    bad = json.dumps({"arrays": [["a", "|O", [4], 0, 32]]}).encode()
    with pytest.raises(ValueError, match="not allowed"):
        unpack(len(bad).to_bytes(8, "little") + bad + bytes(frame[-32:]))
    with pytest.raises(ValueError, match="size"):
        unpack(bytes(frame[:-8]))


def test_frames_go_through_the_pipe_from_and_into_the_arrays_own_memory():
    """send_frame writes the arrays as they are (no joined copy); recv_frame reads the frame into one
    buffer whose aligned, writable views are the arrays; a pipe closed mid-frame is EOFError, an
    announced length beyond MAX_FRAME_BYTES is OSError (never allocated)."""
    import socket

    import streamsemi.service.fitter as fitter_mod

    rng = np.random.default_rng(0)
    arrays = {"big": rng.random((1000, 700)), "i": np.arange(7, dtype=np.int8), "s": np.array(["ab", "c"]),
              "empty": np.zeros((0, 3)), "f32": np.arange(5, dtype=np.float32), "strided": np.arange(20.0)[::2]}
    ours, theirs = socket.socketpair()
    try:
        parts = fitter_mod.frame_parts({"k": "v"}, arrays)
        assert any(isinstance(p, np.ndarray) and np.shares_memory(p, arrays["big"]) for p in parts), "not copied"
        writer = threading.Thread(target=fitter_mod.send_frame, args=(theirs, parts))
        writer.start()
        header, back = fitter_mod.recv_frame(ours)
        writer.join(10)
        assert header == {"k": "v"}
        buffer = back["big"].base
        while buffer is not None and getattr(buffer, "base", None) is not None:
            buffer = buffer.base
        for k, a in arrays.items():
            assert back[k].dtype == a.dtype and back[k].shape == a.shape and np.array_equal(back[k], a)
            assert back[k].flags.writeable and back[k].flags.aligned
            if back[k].size:
                assert (back[k].ctypes.data - back["big"].ctypes.data) % fitter_mod.ALIGN == 0
        assert np.shares_memory(back["big"], np.frombuffer(memoryview(buffer), dtype=np.uint8)), "views of one buffer"
        back["big"][0, 0] = -1.0  # the receiver may update them in place
        # the same frame joined in memory
        h2, b2 = unpack(pack({"k": "v"}, arrays))
        assert h2 == header and all(np.array_equal(b2[k], arrays[k]) for k in arrays)

        theirs.sendall(fitter_mod._LENGTH.pack(1000) + b"x" * 10)
        theirs.shutdown(socket.SHUT_WR)
        with pytest.raises(EOFError):
            fitter_mod.recv_frame(ours)
    finally:
        ours.close()
        theirs.close()
    ours, theirs = socket.socketpair()
    try:
        theirs.sendall(fitter_mod._LENGTH.pack(fitter_mod.MAX_FRAME_BYTES + 1))
        with pytest.raises(OSError, match="more than"):
            fitter_mod.recv_frame(ours)
    finally:
        ours.close()
        theirs.close()


def test_a_malformed_request_is_a_fit_error_and_the_process_serves_on(r8, fitter):
    """A frame the fit process cannot parse gets an error reply (the pipe stays in step): the next fit works."""
    import streamsemi.service.fitter as fitter_mod

    ds, order = r8
    X, y, ids = _xy(ds, order, n=120)
    with fitter._lock:
        fitter_mod.send_frame(fitter._conn, [fitter_mod._HEADER.pack(5) + b"{nope"])
        reply, arrays = fitter_mod.recv_frame(fitter._conn)
    assert "error" in reply and "JSONDecodeError" in reply["error"] and arrays == {}
    pid = fitter.pid
    model = fitter(CK, build_estimator(CK, None, 0, 0), X, y, ids)
    assert model.predict(X).shape == (X.shape[0],) and fitter.pid == pid


@pytest.mark.parametrize("name", [CK, "d-lda"])
def test_the_fit_process_fits_the_same_model_as_in_process(r8, fitter, name):
    ds, order = r8
    X, y, ids = _xy(ds, order)
    local = build_estimator(name, None, 0, 0)
    fit_estimator(local, X, y, ids)
    remote = fitter(name, build_estimator(name, None, 0, 0), X, y, ids)
    assert type(remote) is type(local) and list(remote.classes_) == list(local.classes_)
    np.testing.assert_allclose(remote.predict_proba(X), local.predict_proba(X), rtol=1e-9, atol=1e-12)


def test_the_fit_process_keeps_the_seed_weight_choice_from_the_previous_models_view(r8, fitter):
    ds, order = r8
    X, y, ids = _xy(ds, order)
    first = fitter(CK, build_estimator(CK, None, 0, 0), X, y, ids)
    assert first.seed_weight == "held-out" and first.seed_weight_age_ == 0
    again = fitter(CK, build_estimator(CK, None, 0, 0), X, y, ids, first.warm_start_view())
    assert again.seed_weight_age_ == 1 and again.seed_weight_ == first.seed_weight_
    np.testing.assert_array_equal(again.seed_weight_seed_keys_, first.seed_weight_seed_keys_)
    np.testing.assert_allclose(again.predict_proba(X), first.predict_proba(X), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", [CK, "pseudo-lsc"])
def test_the_fit_process_scores_the_snapshot_as_the_fitted_model_would(r8, fitter, name):
    """scores=True: the fitted copy and its predict_proba (and a multi-label model's predict) of X, computed there."""
    ds, order = r8
    X, y, ids = _xy(ds, order)
    multilabel = name == "pseudo-lsc"
    if multilabel:
        y = [[v] if v is not None else [] for v in y]
    remote, scored = fitter(name, build_estimator(name, None, 0, 0), X, y, ids, scores=True, multilabel=multilabel)
    proba, indicator = scored
    assert proba.dtype == np.float64 and proba.shape == (X.shape[0], len(remote.classes_))
    np.testing.assert_allclose(proba, remote.predict_proba(X), rtol=1e-9, atol=1e-12)
    if multilabel:
        expected = remote.predict(X)
        expected = expected.toarray() if sp.issparse(expected) else np.asarray(expected)
        assert indicator.dtype == bool and np.array_equal(indicator, expected.astype(bool))
    else:
        assert indicator is None
    assert fitter(name, build_estimator(name, None, 0, 0), X, y, ids).classes_.size >= 2, "without scores: the model"


def test_a_fit_error_in_the_fit_process_is_raised_in_the_worker(r8, fitter):
    ds, order = r8
    X, _, ids = _xy(ds, order, n=50)
    with pytest.raises(RemoteFitError, match="DegenerateInputError: y has"):
        fitter(CK, build_estimator(CK, None, 0, 0), X, [None] * (X.shape[0] - 1), ids)  # wrong length of y
    X2, y2, ids2 = _xy(ds, order, n=120)
    assert fitter(CK, build_estimator(CK, None, 0, 0), X2, y2, ids2).classes_.size >= 2  # still serving


def _engine(fitter, **kw):
    base = dict(algorithms=[CK], background_refit=True, n_features=2**14, refit_every_docs=0,
                min_docs_first_refit=150, drift_detection=False, min_seed_classes=2, min_seeds_per_class=1,
                first_fit_stable_seeds=0, refit_growth=0, refit_idle_s=0, min_refit_interval_s=0.0)
    base.update(kw)
    eng = Engine(EngineConfig(**base))
    eng.fitter = fitter
    return eng


def _feed(eng, ds, idx, seed_every=6):
    out = eng.process([Document(id=f"r{i}", text=ds.texts[i]) for i in idx])
    for j, i in enumerate(idx):
        if j % seed_every == 0:
            eng.label(f"r{i}", [ds.labels[i]])
    return out


def test_kill_9_of_the_fit_process_is_reported_restarted_and_old_models_keep_serving(r8, caplog):
    ds, order = r8
    fitter = FitProcess(nice=0).start()
    try:
        eng = _engine(fitter)
        _feed(eng, ds, order[:200])
        eng.tick()
        assert eng.wait_for_refit(DEADLINE) and eng.ready
        v1 = eng.models[CK].version
        deaths = fitter.deaths._value.get()
        # kill -9 while idle: the next refit finds the pipe broken
        old_pid = fitter.pid
        os.kill(old_pid, signal.SIGKILL)
        wait_for(lambda: not alive(old_pid), DEADLINE, "the killed fit process gone")
        with caplog.at_level(logging.ERROR, logger="streamsemi.service.fitter"):
            _feed(eng, ds, order[200:260])
            eng.request_refit()
            assert eng.wait_for_refit(DEADLINE)
        assert fitter.deaths._value.get() == deaths + 1
        died = [r for r in caplog.records if r.getMessage() == "fit_process_died"]
        assert len(died) == 1 and died[0].fields["algorithm"] == CK and died[0].fields["exitcode"] == -signal.SIGKILL
        assert eng.models[CK].version == v1, "the failed round keeps the model in use"
        assert CK in eng.last_refit_error and "FitProcessDied" in eng.last_refit_error[CK]
        served = _feed(eng, ds, order[260:300]).assignments
        assert served and {a.model_version for a in served} == {v1}
        assert fitter.pid is not None and fitter.pid != old_pid, "restarted at once"
        # the restarted process fits the next round
        eng.request_refit()
        assert eng.wait_for_refit(DEADLINE)
        assert eng.models[CK].version > v1 and CK not in eng.last_refit_error
        served = _feed(eng, ds, order[300:330]).assignments
        assert {a.model_version for a in served} == {eng.models[CK].version}
    finally:
        fitter.close()


def _long_fit_running(fitter, X, y, ids) -> tuple[threading.Thread, dict]:
    """A D-LDA fit on a thread, in flight (it holds the fit process' pipe): ``result`` gets its "model" or
    "error" when it ends."""
    result: dict = {}

    def fit() -> None:
        try:
            # 100x the default sweeps: a fit that outlasts the test's kill or close on any machine (200 sweeps
            # on these 400 documents take well under a second to ~2 s)
            result["model"] = fitter("d-lda", build_estimator("d-lda", {"n_sweeps": 20000}, 0, 0), X, y, ids)
        except Exception as exc:  # noqa: BLE001
            result["error"] = exc

    t = threading.Thread(target=fit)
    t.start()
    wait_for(lambda: fitter._lock.locked() or result, DEADLINE, "the fit sent to the fit process", 0.02)
    assert t.is_alive() and fitter._lock.locked(), f"the fit is still running: {result}"
    return t, result


def test_kill_9_during_a_fit_fails_that_fit_only(r8):
    ds, order = r8
    X, y, ids = _xy(ds, order, n=400)
    fitter = FitProcess(nice=0).start()
    try:
        fitter(CK, build_estimator(CK, None, 0, 0), X, y, ids)  # started and warm
        t, result = _long_fit_running(fitter, X, y, ids)
        old_pid = fitter.pid
        os.kill(old_pid, signal.SIGKILL)
        t.join(DEADLINE)
        assert isinstance(result.get("error"), FitProcessDied) and "model" not in result
        assert fitter.deaths._value.get() == 1 and fitter.pid not in (None, old_pid)
        assert list(fitter(CK, build_estimator(CK, None, 0, 0), X, y, ids).classes_)  # the new process fits
    finally:
        fitter.close()


def test_close_during_a_fit_ends_that_fit_with_remote_fit_error(r8, monkeypatch):
    """A shutdown during a fit: the fit fails with RemoteFitError (it closed the pipe under the
    fit's read before, which raised TypeError), the process is gone, later fits are refused."""
    import streamsemi.service.fitter as fitter_mod

    ds, order = r8
    X, y, ids = _xy(ds, order, n=400)
    fitter = FitProcess(nice=0).start()
    fitter(CK, build_estimator(CK, None, 0, 0), X, y, ids)  # started and warm

    class Watched:  # the worker's end of the pipe, noting a close() while the fit reads or writes it
        def __init__(self, conn) -> None:
            self.conn, self.busy, self.closed_under_fit = conn, False, False

        def fileno(self) -> int:
            return self.conn.fileno()

        def close(self) -> None:
            self.closed_under_fit |= self.busy
            self.conn.close()

    send, recv = fitter_mod.send_frame, fitter_mod.recv_frame

    def sending(conn, parts) -> None:
        conn.busy = True
        send(conn, parts)

    def receiving(conn):
        try:
            return recv(conn)
        finally:
            conn.busy = False

    monkeypatch.setattr(fitter_mod, "send_frame", sending)
    monkeypatch.setattr(fitter_mod, "recv_frame", receiving)
    pipe = fitter._conn = Watched(fitter._conn)
    t, result = _long_fit_running(fitter, X, y, ids)
    proc = fitter._proc
    fitter.close(timeout=0.2)
    t.join(DEADLINE)
    assert not t.is_alive() and "model" not in result
    assert type(result.get("error")) is FitProcessClosed, repr(result.get("error"))
    assert "closed during the fit" in str(result["error"])
    assert not pipe.closed_under_fit, "the pipe was closed under the fit's read (a race: TypeError or OSError)"
    assert not proc.is_alive() and fitter.deaths._value.get() == 0, "a shutdown is not a death"
    with pytest.raises(RemoteFitError, match="closed"):
        fitter(CK, build_estimator(CK, None, 0, 0), X, y, ids)


def test_a_round_whose_fit_process_closed_is_abandoned_not_failed(r8, caplog):
    """At shutdown the fit process closes under a refit round: the round stops with one refit_abandoned
    event; no refit_failed warnings, no failure counts, the models in use stay."""
    ds, order = r8
    fitter = FitProcess(nice=0).start()
    try:
        eng = _engine(fitter, algorithms=[CK, "semi-ldc"], background_refit=False)
        _feed(eng, ds, order[:200])
        eng.tick()
        assert eng.ready
        before = dict(eng.models)
        fitter.close()
        _feed(eng, ds, order[200:260])
        with caplog.at_level(logging.INFO, logger="streamsemi.engine"):
            eng.request_refit()
        events = [r for r in caplog.records if r.name == "streamsemi.engine"]
        abandoned = [r for r in events if r.getMessage() == "refit_abandoned"]
        assert len(abandoned) == 1 and abandoned[0].fields["algorithms"] == [CK, "semi-ldc"]
        assert abandoned[0].levelno == logging.INFO and "closed" in abandoned[0].fields["reason"]
        assert not [r for r in events if r.getMessage() in ("refit_failed", "refit_round_done", "fallback_failed")]
        assert eng.models == before and not eng.last_refit_error
        assert eng.telemetry.refits.labels(CK, "failure")._value.get() == 0
    finally:
        fitter.close()


def test_engine_with_the_fit_process_serves_the_same_assignments_as_in_process(r8, fitter):
    ds, order = r8
    outs = []
    for f in (None, fitter):
        eng = _engine(f, background_refit=False)
        got = _feed(eng, ds, order[:200]).assignments
        got += _feed(eng, ds, order[200:300]).assignments
        outs.append([(a.id, a.label, a.cluster, round(a.score, 9), a.model_version) for a in got])
    assert outs[0] and outs[0] == outs[1]


def test_closed_fit_process_refuses_fits(r8):
    ds, order = r8
    X, y, ids = _xy(ds, order, n=60)
    f = FitProcess(nice=0).start()
    f.close()
    with pytest.raises(RemoteFitError):
        f(CK, build_estimator(CK, None, 0, 0), sp.csr_matrix(X), y, ids)
    with pytest.raises(ValueError):
        FitProcess(context="fork")
    assert issubclass(FitProcessDied, RuntimeError)


def test_a_revision_pass_with_a_time_budget_sizes_its_chunks_from_their_cost(r8):
    from streamsemi.engine import REVISION_PROBE

    ds, order = r8
    eng = _engine(None, background_refit=False, revision_chunk=400)
    _feed(eng, ds, order[:300])
    for _ in range(20):
        eng.process([])  # the first fit, the buffer's assignments, any revision pass
    assert eng.ready and not eng.revisions_pending and len(eng._served) > 200
    assert eng._revision_limit(None) == 400  # no budget: revision_chunk
    eng.revision_budget_s = 0.1
    eng.request_refit()
    eng.process([])
    version = eng.models[CK].version
    judged = sum(1 for e in eng._served.values() if e.verdicts[0] is not None and e.verdicts[0][3] == version)
    assert judged == REVISION_PROBE, "the first chunk with a budget is a probe"
    assert eng.revisions_pending > 0 and eng._revision_cost is not None
    eng._revision_cost = 0.001
    assert eng._revision_limit(0.1) == 100
    eng._revision_cost = 10.0
    assert eng._revision_limit(0.1) == 1
    eng._revision_cost = 1e-6
    assert eng._revision_limit(0.1) == 400
    while eng.revisions_pending:
        eng.process([])
    assert eng.revisions_pending == 0


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux scheduling policies")
@pytest.mark.parametrize("priority, policy, nice", [("idle", "SCHED_IDLE", 10), ("low", "SCHED_OTHER", 10),
                                                    ("normal", "SCHED_OTHER", 0)])
def test_fit_priority_sets_the_fit_process_policy_and_nice(priority, policy, nice, r8):
    """fit_priority=idle: the fit process runs under SCHED_IDLE (the polling thread never waits for a core behind it);
    low: nice 10; normal: the worker's own priority. Each still fits."""
    base = os.nice(0)
    f = FitProcess(**FIT_PRIORITY[priority]).start()
    try:
        X, y, ids = _xy(*r8, n=200)
        est = build_estimator(CK, None, 0, 0)
        fitted = f(CK, est, X, y, ids)
        assert fitted.predict(X[:5]).shape == (5,)
        pol, ni = scheduling(f.pid)
        assert pol == getattr(os, policy)
        assert ni == min(19, base + nice)
    finally:
        f.close()


def _thread_nices(pid: int) -> set[int]:
    return {os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir(f"/proc/{pid}/task")}


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux scheduling policies")
def test_adaptive_fit_priority_follows_urgency_and_never_uses_sched_idle(r8):
    """fit_priority=adaptive: the process starts at the worker's priority (no model yet: the fit is the hot path),
    every one of its threads goes to nice +10 when the fit is not urgent and back when it is; never SCHED_IDLE."""
    base = os.nice(0)
    f = FitProcess(**FIT_PRIORITY["adaptive"]).start()
    try:
        assert scheduling(f.pid) == (os.SCHED_OTHER, base)
        X, y, ids = _xy(*r8, n=200)
        est = build_estimator(CK, None, 0, 0)
        assert f(CK, est, X, y, ids).predict(X[:5]).shape == (5,)
        f.set_urgent(False)
        assert _thread_nices(f.pid) == {min(19, base + 10)}
        assert scheduling(f.pid)[0] == os.SCHED_OTHER
        assert f.nice_gauge._value.get() == min(19, base + 10)
        assert f(CK, est, X, y, ids).predict(X[:5]).shape == (5,)  # the niced process still fits
        if os.geteuid() == 0:  # raising a priority again needs CAP_SYS_NICE
            f.set_urgent(True)
            assert _thread_nices(f.pid) == {base}
            assert f.urgent_gauge._value.get() == 1
    finally:
        f.close()


def test_adaptive_fit_starts_a_new_process_when_the_os_refuses_a_higher_priority(r8, monkeypatch):
    """Without CAP_SYS_NICE a niced process cannot be raised again: the next urgent fit runs in a new process started
    at the worker's priority (and the fit succeeds)."""
    import streamsemi.service.fitter as fitter_mod

    f = FitProcess(**FIT_PRIORITY["adaptive"]).start()
    try:
        f.set_urgent(False)
        first = f.pid
        monkeypatch.setattr(fitter_mod, "set_process_nice", lambda pid, nice: False)  # what an unprivileged OS answers
        f.set_urgent(True)
        assert f.pid == first  # nothing is killed during the (possible) fit
        X, y, ids = _xy(*r8, n=200)
        assert f(CK, build_estimator(CK, None, 0, 0), X, y, ids).predict(X[:3]).shape == (3,)
        assert f.pid is not None and f.pid != first
        assert os.getpriority(os.PRIO_PROCESS, f.pid) == os.nice(0)
    finally:
        f.close()
