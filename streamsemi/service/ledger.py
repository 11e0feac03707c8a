"""The output ledger: outputs sent and not yet acknowledged, and the document offsets they cover.

At-least-once (docs/reliability.md): a document partition's offset advances
(:meth:`OutputLedger.advance`) only after the outputs of its records were handed to
the producer, and offsets are committed (:meth:`OutputLedger.commit_if_settled`) only
when every output sent so far is acknowledged by the broker. An output whose send
failed stays in the ledger and is sent again (:meth:`OutputLedger.resend`); a
document still buffered by the engine (no model yet) holds its partition back
(``held`` offsets).

With a producer that does not wait (:class:`~streamsemi.service.producer.ProcessProducer`,
``asynchronous``), the worker does not flush at every poll: :meth:`ship` hands the
outputs over, and :meth:`commit_acknowledged` commits the offsets of the last
:meth:`advance` whose outputs, and all outputs sent before them, are acknowledged
(``marks``: the offsets after each advance, with the epoch of its outputs). Those
per-loop commits do not wait for the broker (``wait=False``: the consumer's
``commit_async``); every other commit (a revocation, a checkpoint, the
shutdown) waits, and first commits again what an asynchronous commit has not confirmed.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kafka import TopicPartition
from kafka.future import Future
from kafka.structs import OffsetAndMetadata

from streamsemi.core.logs import event

log = logging.getLogger("streamsemi.service.ledger")


class Output:
    """One output record and the future of its last send.

    Or a block of records that the producer builds (``records`` > 1: a verdict
    block, ``key`` :data:`~streamsemi.service.producer.BLOCK`, ``nbytes`` its estimated size):
    acknowledged when all of them are, sent again whole when one failed.
    """

    __slots__ = ("topic", "key", "value", "headers", "future", "epoch", "nbytes", "records")

    def __init__(self, topic: str, key: Any, value: bytes, headers: list | None = None, *,
                 records: int = 1, nbytes: int | None = None) -> None:
        self.topic, self.key, self.value, self.headers = topic, key, value, headers
        self.future: Any = None
        self.epoch: int | None = None  # the ledger's epoch at the first send (kept when sent again)
        self.records = records
        # key and value bytes
        self.nbytes = (len(value) if value else 0) + (len(key) if type(key) is bytes else 0) if nbytes is None else nbytes

    @property
    def acknowledged(self) -> bool:
        f = self.future
        return f is not None and f.is_done and not f.failed()

    @property
    def failed(self) -> bool:
        f = self.future
        return f is None or (f.is_done and f.failed())


class OutputLedger:
    """Outputs sent but not acknowledged, processed and committed document offsets.

    Parameters
    ----------
    producer_factory : callable
        Returns a new producer (kafka-python ``KafkaProducer`` interface: ``send``,
        ``flush``, ``close``); called by :meth:`open` and :meth:`replace_producer`.
    on_resend : callable, optional
        Called with the number of outputs sent again (a metric).

    Attributes
    ----------
    next_offset : dict
        ``TopicPartition -> next offset`` of the records whose outputs were sent.
    committed : dict
        ``TopicPartition -> offset`` last committed by this ledger.
    unsettled : list of Output
        Outputs sent and not acknowledged yet (their send may have failed).
    unsettled_bytes : int
        Key and value bytes of ``unsettled`` (as of the last :meth:`send` / :meth:`settle`).
    unsettled_records : int
        Records of ``unsettled`` (a block counts its records).
    """

    #: advances remembered for :meth:`commit_acknowledged` (the oldest are dropped: fewer commit points, never unsafe)
    MAX_MARKS = 10_000
    #: failed asynchronous commits kept until :meth:`take_commit_errors` (the oldest are dropped)
    MAX_COMMIT_ERRORS = 100

    def __init__(self, producer_factory: Callable[[], Any], on_resend: Callable[[int], None] | None = None) -> None:
        self.producer_factory = producer_factory
        self.on_resend = on_resend
        self.producer: Any = None
        self.next_offset: dict[TopicPartition, int] = {}
        self.committed: dict[TopicPartition, int] = {}
        self.unsettled: list[Output] = []
        self.unsettled_bytes = 0
        self.unsettled_records = 0
        self.epoch = 0
        self.marks: deque[tuple[int, dict[TopicPartition, int]]] = deque()
        # outputs were sent again since ``unsettled`` was last empty: their epochs are out of send order
        self._reordered = False
        self._send_errors = 0       # sends that raised since the last scan for failed outputs
        self._failures_seen = 0     # the producer's ``failures`` count at that scan
        # asynchronous commits sent and not confirmed yet (``committed`` holds confirmed ones only)
        self._committing: dict[TopicPartition, int] = {}
        self._commit_errors: deque[BaseException] = deque(maxlen=self.MAX_COMMIT_ERRORS)

    @property
    def asynchronous(self) -> bool:
        """Whether the producer ships without waiting (:meth:`ship`; commits by :meth:`commit_acknowledged`)."""
        return hasattr(self.producer, "ship")

    # ------------------------------------------------------------------ producer
    def open(self) -> None:
        """Create the producer."""
        self.producer = self.producer_factory()

    def send(self, out: Output) -> Output:
        """Send one output, remembering it until the broker acknowledges it."""
        if out.epoch is None:
            out.epoch = self.epoch
        try:
            out.future = self.producer.send(out.topic, key=out.key, value=out.value, headers=out.headers)
        except Exception as exc:  # noqa: BLE001 - e.g. no metadata while a topic is being recreated: send again later
            out.future = Future().failure(exc)
            self._send_errors += 1
        self.unsettled.append(out)
        self.unsettled_bytes += out.nbytes
        self.unsettled_records += out.records
        return out

    def send_many(self, outs: list[Output]) -> None:
        """:meth:`send` of every output in order, in one call of the producer's ``send_many`` when it has one.

        When that call raises, every output of it gets the failure (sent again later, as
        a failed :meth:`send`).
        """
        many = getattr(self.producer, "send_many", None)
        if many is None:
            for out in outs:
                self.send(out)
            return
        epoch = self.epoch
        for out in outs:
            if out.epoch is None:
                out.epoch = epoch
        try:
            futures = many([(out.topic, out.key, out.value, out.headers) for out in outs])
        except Exception as exc:  # noqa: BLE001 - as in send: the resend path takes them
            failed = Future().failure(exc)
            for out in outs:
                out.future = failed
            self._send_errors += len(outs)
        else:
            for out, future in zip(outs, futures, strict=True):
                out.future = future
        self.unsettled.extend(outs)
        self.unsettled_bytes += sum(out.nbytes for out in outs)
        self.unsettled_records += sum(out.records for out in outs)

    def ship(self) -> None:
        """Hand the outputs sent so far to an asynchronous producer (no wait); nothing to do for a plain one."""
        ship = getattr(self.producer, "ship", None)
        if ship is not None:
            ship()

    def flush(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for the outputs sent so far (raises the producer's KafkaError)."""
        self.producer.flush(timeout=timeout)

    def settle(self) -> bool:
        """Forget the acknowledged outputs at the head of ``unsettled``; True when every output sent so far is acknowledged.

        Only the head: the cost is the number of newly acknowledged outputs, not the
        number in flight (thousands with the producer process, at every loop). An
        acknowledged output behind one that is not stays until that one is acknowledged
        or sent again (:meth:`resend`), so ``unsettled`` can over-count, never under-count.
        """
        u = self.unsettled
        i, freed, records, n = 0, 0, 0, len(u)
        while i < n and u[i].acknowledged:
            freed += u[i].nbytes
            records += u[i].records
            i += 1
        if i:
            del u[:i]
            self.unsettled_bytes -= freed
            self.unsettled_records -= records
        if not u:
            self._reordered = False
        return not u

    @property
    def unacknowledged(self) -> int:
        """Outputs whose send is still in flight (not failed, not acknowledged)."""
        return sum(1 for o in self.unsettled if o.future is not None and not o.future.is_done)

    def _may_have_failed(self) -> bool:
        """False when no output can have failed since the last scan: no send raised and the producer counts no new
        failure (``failures``, kept by :class:`~streamsemi.service.producer.ProcessProducer`); a producer
        without that count is scanned every time."""
        failures = getattr(self.producer, "failures", None)
        return failures is None or failures != self._failures_seen or self._send_errors > 0

    def resend(self) -> int:
        """Send again the outputs whose send failed; returns how many."""
        if not self.unsettled or not self._may_have_failed():
            return 0
        self._failures_seen = getattr(self.producer, "failures", 0) or 0
        self._send_errors = 0
        failed = [o for o in self.unsettled if o.failed]
        if not failed:
            return 0
        keep = set(map(id, failed))
        self.unsettled = [o for o in self.unsettled if id(o) not in keep]
        self.unsettled_bytes -= sum(o.nbytes for o in failed)
        self.unsettled_records -= sum(o.records for o in failed)
        self._reordered = True
        event(log, "outputs_resent", logging.WARNING, records=sum(o.records for o in failed),
              error=str(next((o.future.exception for o in failed if o.future is not None), None)))
        self._resent(sum(o.records for o in failed))
        for o in failed:
            self.send(o)
        return len(failed)

    def replace_producer(self) -> int:
        """A new producer (the old one talks to a log that no longer exists); every unacknowledged output is sent again."""
        old, self.producer = self.producer, self.producer_factory()
        try:
            old.close(timeout=0)
        except Exception:  # noqa: BLE001 - the old producer's broker is gone
            pass
        pending = [o for o in self.unsettled if not o.acknowledged]
        self.unsettled = []
        self.unsettled_bytes = 0
        self.unsettled_records = 0
        self._reordered = bool(pending)
        self._failures_seen, self._send_errors = 0, 0
        for o in pending:
            self.send(o)
        self._resent(sum(o.records for o in pending))
        return len(pending)

    def _resent(self, n: int) -> None:
        if n and self.on_resend is not None:
            self.on_resend(n)

    def close(self, timeout: float) -> None:
        if self.producer is not None:
            self.producer.close(timeout=timeout)

    # ------------------------------------------------------------------ offsets
    def advance(self, positions: Iterable[tuple[TopicPartition, int]]) -> None:
        """Records at ``(partition, offset)`` have their outputs sent: their partitions may commit past them."""
        for tp, offset in positions:
            if offset + 1 > self.next_offset.get(tp, -1):
                self.next_offset[tp] = offset + 1
        self.marks.append((self.epoch, dict(self.next_offset)))
        if len(self.marks) > self.MAX_MARKS:
            self.marks.popleft()
        self.epoch += 1

    def safe_offsets(self, held: Mapping[TopicPartition, int] | None = None,
                     upto: Mapping[TopicPartition, int] | None = None) -> dict[TopicPartition, int]:
        """Offsets that may be committed: ``next_offset`` (or ``upto``), held back to the oldest buffered document."""
        held = held or {}
        base = self.next_offset if upto is None else upto
        return {tp: min(nxt, held.get(tp, nxt)) for tp, nxt in base.items()}

    def commit(self, consumer: Any, held: Mapping[TopicPartition, int] | None = None,
               only: set[TopicPartition] | None = None,
               upto: Mapping[TopicPartition, int] | None = None, *, wait: bool = True) -> dict[TopicPartition, int]:
        """Commit the safe offsets that changed (of ``only`` when given; ``upto`` instead of ``next_offset``).

        ``wait=False``: with the consumer's ``commit_async`` (when it has one), the commit
        does not wait for the broker; its outcome is read when the consumer runs the
        callback (in its ``poll``, on this thread): a confirmed offset joins ``committed``,
        a failed commit is kept for :meth:`take_commit_errors` and its offsets are committed
        again by the next call. An offset waiting for confirmation is not sent again by
        another ``wait=False`` call; a waiting commit sends what is not confirmed.

        Returns what was committed (or sent). Does not look at acknowledgements: use
        :meth:`commit_if_settled` or :meth:`commit_acknowledged`.
        """
        asynchronous = not wait and hasattr(consumer, "commit_async")
        known = {**self.committed, **self._committing} if asynchronous else self.committed
        todo = {tp: off for tp, off in self.safe_offsets(held, upto).items()
                if (only is None or tp in only) and known.get(tp) != off}
        if not todo:
            return todo
        offsets = {tp: OffsetAndMetadata(off, "", -1) for tp, off in todo.items()}
        if asynchronous:
            self._committing.update(todo)
            consumer.commit_async(offsets, callback=self._async_committed)
            return todo
        consumer.commit(offsets)
        self.committed.update(todo)
        for tp, off in todo.items():  # what waited for confirmation is covered now
            if self._committing.get(tp, off + 1) <= off:
                del self._committing[tp]
        return todo

    def _async_committed(self, offsets: Mapping[TopicPartition, Any], response: Any) -> None:
        """``commit_async``'s callback (run by the consumer on the polling thread)."""
        failed = isinstance(response, BaseException)
        for tp, om in offsets.items():
            if self._committing.get(tp) == om.offset:
                del self._committing[tp]
            if not failed and tp in self.next_offset and om.offset > self.committed.get(tp, -1):
                self.committed[tp] = om.offset  # (a revoked partition, forgotten meanwhile, stays forgotten)
        if failed:
            self._commit_errors.append(response)

    def take_commit_errors(self) -> list[BaseException]:
        """The failures of asynchronous commits since the last call (their offsets are committed again)."""
        out = list(self._commit_errors)
        self._commit_errors.clear()
        return out

    def commit_if_settled(self, consumer: Any, held: Mapping[TopicPartition, int] | None = None,
                          only: set[TopicPartition] | None = None) -> bool:
        """Commit when every output sent so far is acknowledged; True if it was (and the commit was made)."""
        if not self.settle():
            return False
        self.commit(consumer, held, only)
        self.marks.clear()
        return True

    def commit_acknowledged(self, consumer: Any, held: Mapping[TopicPartition, int] | None = None, *,
                            wait: bool = True) -> bool:
        """Commit the offsets of the last advance whose outputs and every earlier output are acknowledged.

        ``wait``: as :meth:`commit` (the worker's per-loop commits do not wait).

        Outputs keep the epoch of their first send (:meth:`send`), and each :meth:`advance`
        closes an epoch with the offsets it reached: the offsets of the newest mark older
        than every unacknowledged output's epoch are safe (an output that failed and was
        sent again still holds its epoch back). Returns True when every output is
        acknowledged (then ``next_offset`` itself is committed, as :meth:`commit_if_settled`).
        """
        if self.settle():
            self.commit(consumer, held, wait=wait)
            self.marks.clear()
            return True
        # in send order the epochs never decrease, and the head is not acknowledged (settle): the head's epoch is
        # the oldest of the outputs not acknowledged, unless outputs were sent again (then look at all of them)
        u = self.unsettled
        oldest = (min(o.epoch if o.epoch is not None else self.epoch for o in u) if self._reordered
                  else (u[0].epoch if u[0].epoch is not None else self.epoch))
        best = None
        while self.marks and self.marks[0][0] < oldest:
            best = self.marks.popleft()[1]
        if best is not None:
            self.commit(consumer, held, upto=best, wait=wait)
        return False

    def forget(self, tps: Iterable[TopicPartition] | None = None) -> None:
        """Drop processed and committed offsets (of ``tps``, or all): revoked partitions, a lost log."""
        if tps is None:
            self.next_offset.clear()
            self.committed.clear()
            self._committing.clear()
            self.marks.clear()
            return
        tps = set(tps)
        for tp in tps:
            self.next_offset.pop(tp, None)
            self.committed.pop(tp, None)
            self._committing.pop(tp, None)
        for _, offsets in self.marks:  # a revoked partition's offsets are never committed from an old mark
            for tp in tps:
                offsets.pop(tp, None)
