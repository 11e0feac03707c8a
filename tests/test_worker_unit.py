"""Worker.step with fake Kafka clients: processing errors are a designed path, offsets follow outputs."""

from __future__ import annotations

import json

import pytest
from kafka import TopicPartition
from kafka.structs import OffsetAndMetadata
from kafka_fakes import FakeConsumer, FakeProducer, FakeReader

from streamsemi.core.datasets import load
from streamsemi.engine import Engine, EngineConfig
from streamsemi.service import worker as worker_module
from streamsemi.service.config import resolve
from streamsemi.service.worker import REVISION_BUDGET_BUSY_S, REVISION_BUDGET_S, Worker


@pytest.fixture(scope="module")
def r8():
    return load("reuters-r8")


def _worker(r8, tmp_path=None, **settings):
    flags = {"state_dir": str(tmp_path)} if tmp_path is not None else {}
    flags.update(settings)
    w = Worker(resolve(flags))
    w.engine = Engine(EngineConfig(background_refit=False, min_docs_first_refit=1, refit_every_docs=0,
                                   drift_detection=False, min_seed_classes=2, min_seeds_per_class=1, first_fit_stable_seeds=0), w.telemetry)
    for i in range(40):  # seeds with text: the first documents get a model at once
        w.engine.label(f"s{i}", [r8.labels[i]], text=r8.texts[i])
    tp = TopicPartition(w.settings.documents_topic, 0)
    w.consumer = FakeConsumer([tp])
    w.ledger.producer = FakeProducer()
    w.ledger.producer.auto_ack = True
    return w, tp


def _doc(r8, i, doc_id=None):
    return json.dumps({"id": doc_id or f"d{i}", "text": r8.texts[100 + i]}).encode()


def _dead(w):
    return [json.loads(v) for v in w.ledger.producer.values(w.settings.deadletter_topic)]


def _assigned(w):
    return {json.loads(v)["id"] for v in w.ledger.producer.values(w.settings.assignments_topic)}


def _failing_on(w, bad_id, calls=None):
    real = w.engine.process

    def process(docs, **kw):
        if calls is not None:
            calls.append([d.id for d in docs])
        if any(d.id == bad_id for d in docs):
            raise RuntimeError(f"cannot process {bad_id}")
        return real(docs, **kw)

    w.engine.process = process


def test_a_document_that_makes_processing_raise_is_dead_lettered_and_the_batch_goes_on(r8):
    w, tp = _worker(r8)
    calls: list[list[str]] = []
    _failing_on(w, "bad", calls)
    values = [_doc(r8, i, "bad" if i == 2 else None) for i in range(6)]
    w.consumer.feed(tp, values)
    w.step()
    assert calls[0] == ["d0", "d1", "bad", "d3", "d4", "d5"] and calls[1:] == [[x] for x in calls[0]], \
        "the batch, then its documents one at a time"
    assert _assigned(w) == {"d0", "d1", "d3", "d4", "d5"}
    (dead,) = _dead(w)
    assert dead["reason"] == "processing_error" and dead["detail"] == "RuntimeError: cannot process bad"
    assert (dead["topic"], dead["partition"], dead["offset"]) == (tp.topic, 0, 2)
    assert dead["original"] == values[2].decode()
    assert w.telemetry.dead_letters.labels("processing_error")._value.get() == 1
    assert w.consumer.committed_offsets == {tp: 6}, "every record has its outcome: the batch is committed"


def test_an_exception_that_escapes_a_step_never_commits_its_records(r8):
    w, tp = _worker(r8)
    w.consumer.feed(tp, [_doc(r8, i) for i in range(3)])
    w.step()
    assert w.consumer.committed_offsets == {tp: 3}
    w.consumer.feed(tp, [_doc(r8, i) for i in range(3, 8)], start=3)

    def broken_emit(assignments, dead):
        raise MemoryError("out of memory while emitting")

    w._emit = broken_emit
    with pytest.raises(MemoryError):
        w.step()
    w.shutdown()  # the clean-stop path commits what was processed, and nothing else
    assert w.consumer.committed_offsets == {tp: 3}, "records 3..7 were parsed but their outputs never sent"


def test_documents_are_committed_only_after_their_outputs_are_acknowledged(r8):
    w, tp = _worker(r8)
    w.ledger.producer.auto_ack = False
    w.consumer.feed(tp, [_doc(r8, i) for i in range(4)])
    w.step()
    assert _assigned(w) == {"d0", "d1", "d2", "d3"} and w.consumer.commits == []
    assert w.paused, "consumption pauses while outputs wait for acknowledgements"
    w.ledger.producer.ack()
    w.step()
    assert w.consumer.committed_offsets == {tp: 4} and not w.paused


def test_a_record_that_killed_the_process_is_processed_alone_then_dead_lettered(r8, tmp_path):
    # a previous run died twice while processing offset 1 alone
    (tmp_path / "inflight.json").write_text(json.dumps({"ranges": [["streamsemi.documents", 0, 1, 1]], "attempts": 1}))
    w, tp = _worker(r8, tmp_path)
    assert tp.topic == "streamsemi.documents"
    w.inflight.load()
    calls: list[list[str]] = []
    _failing_on(w, "never", calls)
    w.consumer.feed(tp, [_doc(r8, i) for i in range(4)])
    w.step()
    assert calls == [["d0"], ["d2"], ["d3"]], "the poison record is never processed again"
    (dead,) = _dead(w)
    assert dead["reason"] == "processing_error" and dead["offset"] == 1 and "died 2 times" in dead["detail"]
    assert _assigned(w) == {"d0", "d2", "d3"} and w.consumer.committed_offsets == {tp: 4}
    assert not (tmp_path / "inflight.json").exists()
    w.consumer.feed(tp, [_doc(r8, i) for i in range(4, 7)], start=4)
    w.step()
    assert calls[-1] == ["d4", "d5", "d6"], "back to whole batches"


def test_a_batch_in_flight_at_a_crash_is_processed_one_record_at_a_time(r8, tmp_path):
    w, tp = _worker(r8, tmp_path)
    markers = []
    real_process = w.engine.process

    def process(docs, **kw):
        markers.append(json.loads((tmp_path / "inflight.json").read_text()))
        return real_process(docs, **kw)

    w.engine.process = process
    w.consumer.feed(tp, [_doc(r8, i) for i in range(3)])
    w.step()
    assert markers == [{"ranges": [[tp.topic, 0, 0, 2]], "attempts": 0}], "the marker names the batch while it runs"
    assert not (tmp_path / "inflight.json").exists(), "and is gone once its outputs are sent"
    (tmp_path / "inflight.json").write_text(json.dumps({"ranges": [[tp.topic, 0, 3, 5]], "attempts": 0}))
    w.inflight.load()
    w.consumer.feed(tp, [_doc(r8, i) for i in range(3, 7)], start=3)
    w.step()
    assert [m["ranges"] for m in markers[1:]] == [[[tp.topic, 0, k, k]] for k in range(3, 7)]
    assert _assigned(w) == {f"d{i}" for i in range(7)} and not _dead(w)


def test_a_revision_pass_gets_a_smaller_budget_while_documents_wait_on_the_broker(r8):
    w, tp = _worker(r8)
    w.consumer = FakeConsumer([tp], highwater={tp: 100})
    w.consumer.feed(tp, [_doc(r8, i) for i in range(6)])
    w.step()
    assert w.engine.backlog == 94 and w.engine.revision_budget_s == REVISION_BUDGET_S, "nothing waited before the poll"
    w.step()
    assert w.engine.revision_budget_s == REVISION_BUDGET_BUSY_S < REVISION_BUDGET_S
    w.consumer.hw[tp] = 6  # caught up
    w.step()
    w.step()
    assert w.engine.backlog == 0 and w.engine.revision_budget_s == REVISION_BUDGET_S


def test_a_documents_consumer_stuck_outside_its_group_is_replaced_and_the_new_one_serves(r8, caplog):
    from streamsemi.service.broker_reset import AssignmentWatchdog

    w, tp = _worker(r8)

    class Stuck(FakeConsumer):
        class _coordinator:  # noqa: N801 - the kafka-python internals the watchdog reads
            state = "<rebalancing>"

            @staticmethod
            def coordinator_unknown():
                return False

        closed: list[dict] = []

        def close(self, **kw):
            self.closed.append(kw)

    stuck = Stuck([])
    w.consumer = stuck
    fresh = FakeConsumer([tp])
    w._subscribe = lambda: fresh
    clock = [0.0]
    w.assignment_watch = AssignmentWatchdog(60.0, clock=lambda: clock[0])
    w.step()
    assert w.consumer is stuck, "not before the limit"
    clock[0] = 61.0
    with caplog.at_level("WARNING", logger="streamsemi.service.worker"):
        w.step()
    assert w.consumer is fresh and stuck.closed == [{"autocommit": False, "timeout_ms": 2000}]
    assert w.telemetry.broker_errors.labels("rejoin")._value.get() == 1
    (ev,) = [r.fields for r in caplog.records if r.getMessage() == "documents_consumer_replaced"]
    assert ev["reason"] == "no partitions for 61 s while its group membership stays rebalancing"
    fresh.feed(tp, [_doc(r8, i) for i in range(3)])
    w.step()
    assert _assigned(w) == {"d0", "d1", "d2"} and fresh.committed_offsets == {tp: 3}


def test_shutdown_closes_the_consumer_within_the_grace_period_without_committing(r8):
    w, tp = _worker(r8)
    closed = []
    w.consumer.close = lambda **kw: closed.append(kw)
    w.shutdown()
    ((kw,),) = [closed]
    assert kw["autocommit"] is False and 500 <= kw["timeout_ms"] <= 5000, "kafka-python takes timeout_ms"
    assert w.ledger.producer.closed


class _ShippingProducer(FakeProducer):
    """Ships without waiting, like the producer process (streamsemi.service.producer.ProcessProducer)."""

    def __init__(self) -> None:
        super().__init__()
        self.ships = self.flushes = 0
        self.shipped_at: list[int] = []  # records sent when each ship happened

    def ship(self) -> None:
        self.ships += 1
        self.shipped_at.append(len(self.sent))

    def flush(self, timeout: float | None = None) -> None:
        self.flushes += 1
        super().flush(timeout)


def test_with_the_producer_process_the_loop_ships_commits_what_is_acknowledged_and_pauses_past_the_bound(r8):
    w, tp = _worker(r8)
    w.ledger.producer = p = _ShippingProducer()
    w.consumer.feed(tp, [_doc(r8, i) for i in range(4)])
    w.step()  # the first model: assignments, labels, clusters and suggestions records
    assert p.ships == 2 and p.flushes == 0, "handed over (the fresh outputs, then the background work's), not waited for"
    assert _assigned(w) == {"d0", "d1", "d2", "d3"} and w.consumer.commits == []
    p.ack()
    w.step()
    assert w.consumer.committed_offsets == {tp: 4}
    w.consumer.feed(tp, [_doc(r8, i) for i in range(4, 8)], start=4)
    w.step()
    first = len(w.ledger.unsettled)
    assert first >= 8 and not w.paused, "4 assignments + 4 labels records (and what a refit adds), under the bound"
    w.settings.values["max_unacked_outputs"] = first
    w.consumer.feed(tp, [_doc(r8, i) for i in range(8, 12)], start=8)
    w.step()
    assert len(w.ledger.unsettled) >= first + 8 and w.paused, "past max_unacked_outputs: consumption pauses"
    p.ack(first)  # the outputs of documents 4-7
    w.step()
    assert w.consumer.committed_offsets == {tp: 8}, "offsets of the acknowledged poll, not of the next one"
    assert not w.paused
    p.ack()
    w.step()
    assert w.consumer.committed_offsets == {tp: 12} and p.flushes == 0


def test_documents_the_primary_served_alone_hold_the_commit_until_every_algorithm_judged_them(r8):
    """first_verdicts = primary: labels first; the other algorithm's verdicts follow, and only then the commit."""
    w, tp = _worker(r8)
    w.engine = Engine(EngineConfig(algorithms=["constrained-kmeans", "seeded-kmeans"], primary="constrained-kmeans",
                                   background_refit=False, min_docs_first_refit=1, refit_every_docs=0,
                                   refit_growth=0, refit_idle_s=0, drift_detection=False, min_seed_classes=2,
                                   min_seeds_per_class=1, first_fit_stable_seeds=0), w.telemetry)
    for i in range(40):
        w.engine.label(f"s{i}", [r8.labels[i]], text=r8.texts[i])
    w.consumer.feed(tp, [_doc(r8, i) for i in range(2)])
    w.step()  # the first model; every first verdict (no cost measured yet beyond the budget)
    w.step()
    assert w.consumer.committed_offsets == {tp: 2}
    w.engine._deferred_cost = 1.0  # one second per document: the 0.1 s budget judges one document per loop
    w.ledger.producer = p = _ShippingProducer()
    p.auto_ack = True
    w.consumer.feed(tp, [_doc(r8, i) for i in range(2, 6)], start=2)
    w.step()
    assert p.ships == 2
    shipped_first = [(t, json.loads(v)["algorithm"]) for t, _, v, _ in p.sent[:p.shipped_at[0]]
                     if t == w.settings.assignments_topic]
    assert shipped_first == [(w.settings.assignments_topic, "constrained-kmeans")] * 4, \
        "the primary's assignments are handed over before the other algorithm's verdicts are computed"

    def ids(algorithm):
        return [json.loads(v)["id"] for v in w.ledger.producer.values(w.settings.assignments_topic)
                if json.loads(v)["algorithm"] == algorithm]

    labels = [json.loads(v)["id"] for v in w.ledger.producer.values(w.settings.labels_topic)]
    assert labels[-4:] == ["d2", "d3", "d4", "d5"], "every document's label at once"
    assert ids("seeded-kmeans")[-1] == "d2" and "d3" not in ids("seeded-kmeans")
    assert w.consumer.committed_offsets == {tp: 3}, "not past the first document still waiting for a verdict"
    assert w.engine.first_verdicts_pending == 3
    for k in (4, 5):
        w.engine._deferred_cost = 1.0  # (each chunk measures its own cost)
        w.step()
        assert ids("seeded-kmeans")[-1] == f"d{k - 1}" and w.consumer.committed_offsets == {tp: k}
    w.step()
    assert ids("seeded-kmeans")[-4:] == ["d2", "d3", "d4", "d5"]
    assert w.consumer.committed_offsets == {tp: 6} and w.engine.first_verdicts_pending == 0
    assert w.consumer.poll_timeouts[-3:] == [0, 0, 0], "no wait for records while verdicts are pending"
    w.step()
    assert w.consumer.poll_timeouts[-1] == 500


def test_the_loop_paces_the_garbage_collector(r8, caplog):
    import gc

    from streamsemi.service.gcpacer import GcPacer

    now = [0.0]
    w, tp = _worker(r8)
    w.gc = GcPacer(w.settings.gc_full_interval_s, clock=lambda: now[0])
    gc.unfreeze()
    w.consumer.feed(tp, [_doc(r8, i) for i in range(3)])
    w.step()
    assert gc.get_freeze_count() > 0, "a step freezes the tracked objects"
    now[0] += w.settings.gc_full_interval_s
    with caplog.at_level("INFO", logger="streamsemi.service.worker"):
        w.step()
    (ev,) = [r.fields for r in caplog.records if r.getMessage() == "gc_full_collection"]
    assert ev["frozen_before"] > 0 and ev["frozen_after"] > 0 and ev["seconds"] >= 0
    assert w.telemetry.registry.get_sample_value("streamsemi_gc_full_collections_total") == 1.0
    w.shutdown()
    assert gc.get_freeze_count() == 0, "shutdown releases them"


def test_without_gc_pacing_the_loop_leaves_the_collector_alone(r8):
    import gc

    w, tp = _worker(r8, gc_full_interval_s="0")
    gc.unfreeze()
    w.consumer.feed(tp, [_doc(r8, i) for i in range(3)])
    w.step()
    assert gc.get_freeze_count() == 0


@pytest.mark.parametrize("priority, idle, nice, adaptive", [("adaptive", False, 10, True), ("idle", True, 10, False),
                                                             ("low", False, 10, False), ("normal", False, 0, False)])
def test_fit_priority_setting_reaches_the_fit_process(priority, idle, nice, adaptive):
    """The worker's fit process gets the priority of the fit_priority setting (default adaptive: never SCHED_IDLE)."""
    w = Worker(resolve({} if priority == "adaptive" else {"fit_priority": priority}))
    assert (w.fitter.idle, w.fitter.nice, w.fitter.adaptive) == (idle, nice, adaptive)
    assert Worker(resolve({"refit_process": "false"})).fitter is None


def test_every_fresh_document_served_adds_one_latency_observation(r8):
    """The latency histogram counts one observation per fresh document's primary verdict (observed per
    batch), none for a seed's or a revision's record; their sum is the documents' waits."""
    w, tp = _worker(r8)
    w.consumer.feed(tp, [_doc(r8, i) for i in range(12)])
    w.step()
    w.consumer.feed(tp, [_doc(r8, i) for i in range(12, 15)])
    w.step()
    get = w.telemetry.registry.get_sample_value
    assert _assigned(w) >= {f"d{i}" for i in range(15)}
    assert get("streamsemi_document_latency_seconds_count") == 15
    assert get("streamsemi_document_latency_seconds_bucket", {"le": "+Inf"}) == 15
    assert 0.0 <= get("streamsemi_document_latency_seconds_sum") < 15 * 60


def test_with_the_producer_process_per_loop_commits_do_not_wait_and_a_failed_one_is_reported_and_sent_again(r8, caplog):
    """The loop's commits go through ``commit_async`` when the consumer has it (the commit no longer waits a
    broker round trip per loop); a failure, read in a later loop, is counted, logged and committed again;
    the shutdown commit waits and covers what was never confirmed."""
    import logging

    from kafka.errors import CommitFailedError

    w, tp = _worker(r8)
    w.ledger.producer = p = _ShippingProducer()
    sent: list[tuple[dict, object]] = []
    w.consumer.commit_async = lambda offsets, callback=None: sent.append((offsets, callback))
    w.consumer.feed(tp, [_doc(r8, i) for i in range(4)])
    w.step()
    p.ack()
    w.step()
    assert w.consumer.commits == [] and [{t: om.offset for t, om in o.items()} for o, _ in sent] == [{tp: 4}]
    offsets, callback = sent[0]
    callback(offsets, CommitFailedError("group rebalanced"))  # kafka-python runs it in a later poll
    with caplog.at_level(logging.WARNING, logger="streamsemi.service.worker"):
        w.step()
    assert w.telemetry.registry.get_sample_value("streamsemi_broker_errors_total", {"kind": "commit"}) == 1
    assert any(r.getMessage() == "commit_failed" and "group rebalanced" in r.fields["error"] and r.fields["waited"] is False
               for r in caplog.records)
    assert [{t: om.offset for t, om in o.items()} for o, _ in sent] == [{tp: 4}, {tp: 4}], "sent again"
    w.shutdown()
    assert w.consumer.commits == [{tp: 4}], "the shutdown commit waits: the second one was never confirmed"


def _restored(r8, state, **settings):
    w, tp = _worker(r8, state, **settings)
    w._restore()
    return w, tp


def _checkpointed_at_10(r8, state):
    """A worker that processed offsets 0..9 and checkpointed (and then, say, was killed)."""
    w1, tp = _worker(r8, state)
    w1.consumer.feed(tp, [_doc(r8, i) for i in range(10)])
    w1.step()
    w1._checkpoint("interval", wait=True)
    return tp


def test_a_checkpoint_written_before_the_catch_up_keeps_the_restored_offset(r8, tmp_path):
    """Seen once under load (kill -9 test): a restarted worker checkpointed after processing its first records
    but before reading back the documents its predecessor committed after its own checkpoint; the next start
    caught up from the new offset only, and the labels of the skipped documents waited forever."""
    state = tmp_path / "state"
    tp = _checkpointed_at_10(r8, state)
    # w1 then processed and committed offsets 10..19 and was killed before its next checkpoint
    w2, _ = _restored(r8, state)
    assert w2.catchup_from == {tp: 10}
    poll = w2.consumer.poll

    def assigning_poll(**kw):  # as in kafka-python: the assignment callback runs inside poll()
        w2.on_assigned({tp})
        return poll(**kw)

    w2.consumer.poll = assigning_poll
    w2.consumer.feed(tp, [_doc(r8, i, f"n{i}") for i in range(20, 30)], start=20)
    w2.step()  # processes 20..29 and checkpoints; the catch-up of 10..19 would run at the next step
    assert w2.catchup_todo == {tp} and w2.ledger.next_offset[tp] == 30
    w2._checkpoint("interval", wait=True)  # w2 is killed now
    w3, _ = _restored(r8, state)
    assert "n25" in w3.engine.window
    assert w3.catchup_from == {tp: 10}, "the next start still reads back offsets 10..19"


def test_a_shutdown_before_the_assignment_keeps_the_restored_offset(r8, tmp_path):
    state = tmp_path / "state"
    tp = _checkpointed_at_10(r8, state)
    w2, _ = _restored(r8, state)
    w2.engine.label("late", [r8.labels[0]], text=r8.texts[0])  # something new, so the shutdown writes a checkpoint
    w2._checkpoint("shutdown", wait=True)
    w3, _ = _restored(r8, state)
    assert w3.catchup_from == {tp: 10}


def _commit(w, tp, offset):
    w.consumer.commit({tp: OffsetAndMetadata(offset, "", -1)})


def _catching_up(r8, tmp_path, monkeypatch, settings=None, **reader):
    """A worker restored from a checkpoint at offset 10 whose predecessor committed up to 20."""
    state = tmp_path / "state"
    tp = _checkpointed_at_10(r8, state)
    w, _ = _restored(r8, state, **(settings or {}))
    _commit(w, tp, 20)
    log = {tp: [_doc(r8, i) for i in range(30)]}
    fake = FakeReader(log, **reader)
    monkeypatch.setattr(worker_module, "make_reader", lambda *a, **k: fake)
    w.engine.label("d15", [r8.labels[115]])  # held: d15 is not in the restored window
    w.on_assigned({tp})
    return w, tp, fake


def test_the_catch_up_reads_back_the_committed_range_and_its_held_label_becomes_a_seed(r8, tmp_path, monkeypatch):
    w, tp, fake = _catching_up(r8, tmp_path, monkeypatch)
    assert "d15" in w.engine.pending
    w._catch_up()
    assert all(f"d{i}" in w.engine.window for i in range(20)) and "d20" not in w.engine.window
    assert "d15" in w.engine.seeds and "d15" not in w.engine.pending
    assert w.catchup_from == {} and fake.closed
    assert w._checkpoint_offsets() == []


@pytest.mark.parametrize("cut", ["time", "error"])
def test_a_catch_up_cut_short_keeps_the_rest_for_the_next_start(r8, tmp_path, monkeypatch, cut):
    if cut == "time":
        monkeypatch.setattr(worker_module, "CATCH_UP_MAX_S", 0.3)
        w, tp, fake = _catching_up(r8, tmp_path, monkeypatch, stop_at=14)
    else:
        w, tp, fake = _catching_up(r8, tmp_path, monkeypatch, fail_at=14)
    w._catch_up()  # no exception escapes
    assert "d12" in w.engine.window and "d15" not in w.engine.window and "d15" in w.engine.pending
    assert w.catchup_from == {tp: 14} and fake.closed
    assert w._checkpoint_offsets() == [[tp.topic, tp.partition, 14]], "the next start reads 14..19"
    w.on_assigned({tp})  # the partition's next assignment reads the rest
    fake.stop_at = fake.fail_at = None
    w._catch_up()
    assert "d15" in w.engine.seeds and w.catchup_from == {}


def test_the_catch_up_reads_at_most_a_window_of_documents_per_partition(r8, tmp_path, monkeypatch):
    """Older documents would be evicted by the newer ones read after them."""
    w, tp, fake = _catching_up(r8, tmp_path, monkeypatch, settings={"window_max_docs": 4})
    w._catch_up()
    assert [f"d{i}" in w.engine.window for i in range(10, 20)] == [False] * 6 + [True] * 4
    assert w.catchup_from == {}


def test_a_catch_up_cut_short_is_tried_again_while_the_partition_stays_assigned(r8, tmp_path, monkeypatch):
    """A broker error during the read-back must not leave a seed waiting until the next restart."""
    monkeypatch.setattr(worker_module, "CATCH_UP_RETRY_S", 0.0)
    w, tp, fake = _catching_up(r8, tmp_path, monkeypatch, fail_at=14)
    w.step()  # the catch-up fails at 14; the retry is scheduled
    assert w.catchup_from == {tp: 14} and w.catchup_retry_at is not None and "d15" in w.engine.pending
    # meanwhile this process commits its own documents: a retry must not read them back as the predecessor's
    _commit(w, tp, 30)
    fake.fail_at = None
    w.step()
    assert "d15" in w.engine.seeds and "d19" in w.engine.window and "d25" not in w.engine.window
    assert w.catchup_from == {} and w.catchup_end == {} and w.catchup_retry_at is None


def test_no_catch_up_retry_for_a_partition_that_was_revoked(r8, tmp_path, monkeypatch):
    w, tp, fake = _catching_up(r8, tmp_path, monkeypatch, fail_at=14)
    w.consumer.tps = []  # the partition moved to another worker before the read-back
    w._catch_up()
    assert w.catchup_from == {tp: 14} and w.catchup_retry_at is None, "kept for the next assignment or start"
    w.consumer.tps = [tp]
    w.on_assigned({tp})
    fake.fail_at = None
    w._catch_up()
    assert "d15" in w.engine.seeds and w.catchup_from == {}


def test_nothing_committed_after_the_checkpoint_leaves_nothing_to_catch_up(r8, tmp_path, monkeypatch):
    w, tp, fake = _catching_up(r8, tmp_path, monkeypatch)
    _commit(w, tp, 10)  # the predecessor was killed right after its checkpoint
    w._catch_up()
    assert w.catchup_from == {} and w.catchup_end == {} and w.catchup_retry_at is None and not fake.pos
