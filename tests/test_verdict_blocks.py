"""Verdict blocks: the other algorithms' first verdicts travel to the producer process as one block per
algorithm and chunk, and the process builds the very records the worker would have built one by one."""

from __future__ import annotations

import math
from array import array

import numpy as np
import pytest
from kafka_utils import DEADLINE, Topics, read_topic

from streamsemi.core.messages import (
    VerdictBlockError,
    encode_json,
    encode_key,
    encode_verdict_block,
    expand_verdict_block,
)
from streamsemi.engine import Assignment, ModelSlot, VerdictBlock, _Verdicts
from streamsemi.service import kafka_io
from streamsemi.service.ledger import Output, OutputLedger
from streamsemi.service.producer import BLOCK, decode_batch, encode_batch


def _slot(multilabel: bool, fallback: bool = False, provisional: bool = False) -> ModelSlot:
    classes = np.array(["acq", "earn", "crude", "new-0", "new-1", "money fx"])
    return ModelSlot(model=None, version=4, fitted_at=0.0, classes=classes, new_clusters=frozenset({"new-0", "new-1"}),
                     multilabel=multilabel, explain={"acq": ["shares", "stake"], "new-0": ["oil"], "earn": []},
                     fallback=fallback, provisional=provisional)


def _one_by_one(v: _Verdicts, slot: ModelSlot, positions: list[int], ids: list[str], revs: list[int], ts: float,
                stream: str | None, worker: str) -> list[tuple[bytes, bytes, list]]:
    """What the worker's ``_emit`` makes of the same verdicts: an Assignment each, ``to_message``, ``encode_json``."""
    out = []
    for (label, score, labels, cluster, new), doc_id, rev in zip(v.build(np.asarray(positions, dtype=np.intp)), ids,
                                                               revs, strict=True):
        a = Assignment(doc_id, "cle", slot.version, label, score, labels, cluster, new, slot.explain.get(cluster, []),
                       False, ts, slot.fallback, None, rev, slot.provisional, stream)
        out.append((encode_key(doc_id), encode_json(a.to_message(worker)),
                    [("model_version", str(slot.version).encode()), ("revision", str(rev).encode())]))
    return out


def _block(v: _Verdicts, slot: ModelSlot, positions: list[int], ids: list[str], revs: list[int], ts: float,
           stream: str | None) -> VerdictBlock:
    spec = {"a": "cle", "v": slot.version, "p": False, "pr": slot.provisional, "ts": ts, "fb": slot.fallback,
            "st": stream, "ids": ids, "rev": revs}
    spec.update(v.block_spec(np.asarray(positions, dtype=np.intp)))
    return VerdictBlock(spec, len(ids))


@pytest.mark.parametrize("multilabel", [False, True])
@pytest.mark.parametrize(("fallback", "provisional", "stream"), [(False, False, None), (True, True, "news/fr")])
def test_a_blocks_records_are_the_bytes_the_worker_builds_one_by_one(multilabel, fallback, provisional, stream) -> None:
    rng = np.random.default_rng(11)
    P = rng.dirichlet(np.full(6, 0.3), size=90)
    P[5] = [0.5, 0.5, 0, 0, 0, 0]  # a tie, and probabilities below LABEL_PROB_MIN
    ind = P >= 0.2 if multilabel else None
    if multilabel:
        ind[7] = False  # no label chosen: the most probable one
    slot = _slot(multilabel, fallback, provisional)
    v = _Verdicts(slot, None, P, ind)
    positions = [89, 0, 5, 7, 7, 40, *range(50, 80)]
    ids = [f"d\u00e9-{j}\"\\" for j in range(len(positions))]  # characters JSON escapes
    revs = [j % 3 for j in range(len(positions))]
    block = _block(v, slot, positions, ids, revs, 1795829596.4621, stream)
    assert any(block.spec["new"]) and not all(block.spec["new"])
    expanded = expand_verdict_block(encode_verdict_block({**block.spec, "w": "w-1"}))
    assert expanded == _one_by_one(v, slot, positions, ids, revs, 1795829596.4621, stream, "w-1")
    # the block's assignments (emitted one by one when it cannot travel as a block) are the same verdicts
    assert [encode_json(a.to_message("w-1")) for a in block.assignments()] == [val for _, val, _ in expanded]


def test_what_a_block_cannot_carry_exactly_is_refused_and_a_malformed_block_is_not_expanded() -> None:
    spec = {"a": "cle", "v": 1, "p": False, "pr": False, "ts": 1.0, "fb": False, "st": None, "ids": ["a"],
            "rev": [0], "cl": ["x"], "new": [False], "sc": [0.5], "ln": [["x"]], "lv": [[0.5]], "ex": {}}
    assert len(expand_verdict_block(encode_verdict_block(spec))) == 1
    with pytest.raises(VerdictBlockError):
        encode_verdict_block({**spec, "ids": ["\ud800"]})  # a lone surrogate: orjson refuses it
    with pytest.raises(VerdictBlockError, match="non-finite"):
        encode_verdict_block({**spec, "sc": [math.nan]})  # would come back as null
    with pytest.raises(VerdictBlockError, match="non-finite"):
        encode_verdict_block({**spec, "lv": [[math.inf]]})
    with pytest.raises(ValueError, match="not a verdict block"):
        expand_verdict_block(b"[1]")
    with pytest.raises(ValueError, match="differ in length"):
        expand_verdict_block(encode_verdict_block({**spec, "rev": [0, 1]}))
    with pytest.raises(ValueError, match="missing"):
        expand_verdict_block(encode_verdict_block({k: v for k, v in spec.items() if k != "sc"}))


def _r8_engines():
    from streamsemi.core.datasets import load
    from streamsemi.core.messages import Document
    from streamsemi.engine import Engine, EngineConfig

    ds = load("reuters-r8")
    order = [int(i) for i in np.random.default_rng(8).permutation(len(ds))[:420]]
    engines = []
    for blocks in (False, True):
        eng = Engine(EngineConfig(algorithms=["constrained-kmeans", "cle", "pseudo-lsc", "fsl-ck"],
                                  background_refit=False, n_features=2**12, refit_every_docs=0,
                                  min_docs_first_refit=150, drift_detection=False, min_seed_classes=2,
                                  min_seeds_per_class=1, first_fit_stable_seeds=0, refit_growth=0, refit_idle_s=0,
                                  first_verdicts="primary", random_state=3),
                     clock=lambda: 1795829596.25)
        eng.verdict_blocks = blocks
        for i in order[:40]:
            eng.label(f"r{i}", [ds.labels[i]], text=ds.texts[i])
        eng.process([Document(id=f"r{i}", text=ds.texts[i]) for i in order[:180]])
        assert eng.ready
        engines.append(eng)
    return ds, order, engines


def test_the_engine_emits_the_same_records_as_blocks_as_it_does_as_assignments() -> None:
    from streamsemi.core.messages import Document

    ds, order, (plain, blocked) = _r8_engines()
    records: list[list] = []
    for eng in (plain, blocked):
        eng.deferred_budget_s = 0.05
        got, blocks, n_first = [], [], 0
        for start in range(180, 420, 60):
            res = eng.process([Document(id=f"r{i}", text=ds.texts[i]) for i in order[start:start + 60]],
                              background=False)
            n_first += len(res.assignments)
            assert all(a.primary for a in res.assignments), "the primary alone serves fresh documents"
            while eng.first_verdicts_pending:
                bg = eng.background()
                got.extend(a for a in bg.assignments if not a.primary)
                blocks.extend(bg.blocks)
        assert n_first == 240
        if eng is plain:
            assert not blocks
            records.append(sorted((encode_key(a.id), encode_json(a.to_message("w"))) for a in got))
        else:
            assert eng.primary == plain.primary
            assert not got and {b.algorithm for b in blocks} == set(eng.config.algorithms) - {eng.primary}
            records.append(sorted((k, v) for b in blocks
                                  for k, v, _ in expand_verdict_block(encode_verdict_block({**b.spec, "w": "w"}))))
        assert not eng.partial, "every document has every algorithm's first verdict"
    assert len(records[0]) == 3 * 240 and records[0] == records[1]
    from prometheus_client import generate_latest

    def assigned(eng) -> list[str]:
        return sorted(line for line in generate_latest(eng.telemetry.registry).decode().splitlines()
                      if line.startswith("streamsemi_assign") and "_created" not in line)

    assert assigned(plain) == assigned(blocked), "the assignment metrics count the blocks' verdicts"


def test_a_block_travels_in_a_batch_frame_and_the_process_lands_its_records(broker) -> None:
    spec = {"a": "cle", "v": 2, "p": False, "pr": False, "ts": 5.5, "fb": False, "st": None, "w": "w-9",
            "ids": [f"doc-{i}" for i in range(300)], "rev": [i % 2 for i in range(300)],
            "cl": ["acq"] * 300, "new": [False] * 300, "sc": [0.25 + i / 1000 for i in range(300)],
            "ln": [["acq", "earn"]] * 300, "lv": [[0.7, 0.3]] * 300, "ex": {"acq": ["shares"]}}
    data = encode_verdict_block(spec)
    frame = encode_batch(3, ["t"], array("i", [0, -2, len(data), 0, 0, 1, 1, 0]),
                         [data, b"k", b"v"], 2)
    assert decode_batch(frame) == (3, [("t", BLOCK, data, None), ("t", b"k", b"v", None)])
    t = Topics().create_assignments(broker.bootstrap, 3)
    p = kafka_io.make_process_producer(t.settings(broker.bootstrap))
    try:
        before = p.send(t.assignments, key=b"first", value=b"1")
        block = p.send(t.assignments, key=BLOCK, value=data)
        bad = p.send(t.assignments, key=BLOCK, value=b"not a block")
        after = p.send(t.assignments, key=b"last", value=b"2")
        p.flush(timeout=DEADLINE)
        assert before.succeeded() and block.succeeded() and after.succeeded()
        assert bad.failed() and "not a verdict block" in str(bad.exception), "answered as one failed record"
    finally:
        p.close(timeout=5)
    got = read_topic(broker.bootstrap, t.assignments, expect=302)
    want = {k: (v, h) for k, v, h in expand_verdict_block(data)}
    landed = {r.key: (r.value, list(r.headers)) for r in got if r.key not in (b"first", b"last")}
    assert landed == want and len(got) == 302


class _Future:
    def __init__(self, ok: bool | None) -> None:
        self.is_done, self.ok = ok is not None, ok

    def failed(self) -> bool:
        return self.is_done and not self.ok

    @property
    def exception(self):
        return RuntimeError("x") if self.failed() else None


class _Producer:
    def __init__(self) -> None:
        self.sent: list[tuple] = []
        self.outcome: bool | None = None

    def send(self, topic, key=None, value=None, headers=None):
        self.sent.append((topic, key, value))
        return _Future(self.outcome)

    def ship(self) -> None:
        pass


def test_the_ledger_counts_a_blocks_records_and_sends_a_failed_block_again_whole() -> None:
    ledger = OutputLedger(_Producer)
    ledger.open()
    prod = ledger.producer
    prod.outcome = False
    ledger.send(Output("t", BLOCK, b"spec", None, records=120, nbytes=30_000))
    ledger.send(Output("t", b"k", b"value"))
    assert (ledger.unsettled_records, ledger.unsettled_bytes) == (121, 30_006)
    prod.outcome = True
    assert ledger.resend() == 2
    assert prod.sent[-2:] == [("t", BLOCK, b"spec"), ("t", b"k", b"value")], "the block is sent again as it was"
    assert (ledger.unsettled_records, ledger.unsettled_bytes) == (121, 30_006)
    assert ledger.settle() and (ledger.unsettled_records, ledger.unsettled_bytes) == (0, 0)
