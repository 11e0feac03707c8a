"""The output ledger: outputs sent and not yet acknowledged, and the document offsets they cover.

At-least-once (docs/reliability.md): a document partition's offset advances
(:meth:`OutputLedger.advance`) only after the outputs of its records were handed to
the producer, and offsets are committed (:meth:`OutputLedger.commit_if_settled`) only
when every output sent so far is acknowledged by the broker. An output whose send
failed stays in the ledger and is sent again (:meth:`OutputLedger.resend`); a
document still buffered by the engine (no model yet) holds its partition back
(``held`` offsets).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kafka import TopicPartition
from kafka.future import Future
from kafka.structs import OffsetAndMetadata

from streamsemi.core.logs import event

log = logging.getLogger("streamsemi.service.ledger")


class Output:
    """One output record and the future of its last send."""

    __slots__ = ("topic", "key", "value", "headers", "future")

    def __init__(self, topic: str, key: bytes | None, value: bytes, headers: list | None = None) -> None:
        self.topic, self.key, self.value, self.headers = topic, key, value, headers
        self.future: Any = None

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
    """

    def __init__(self, producer_factory: Callable[[], Any], on_resend: Callable[[int], None] | None = None) -> None:
        self.producer_factory = producer_factory
        self.on_resend = on_resend
        self.producer: Any = None
        self.next_offset: dict[TopicPartition, int] = {}
        self.committed: dict[TopicPartition, int] = {}
        self.unsettled: list[Output] = []

    # ------------------------------------------------------------------ producer
    def open(self) -> None:
        """Create the producer."""
        self.producer = self.producer_factory()

    def send(self, out: Output) -> Output:
        """Send one output, remembering it until the broker acknowledges it."""
        try:
            out.future = self.producer.send(out.topic, key=out.key, value=out.value, headers=out.headers)
        except Exception as exc:  # noqa: BLE001 - e.g. no metadata while a topic is being recreated: send again later
            out.future = Future().failure(exc)
        self.unsettled.append(out)
        return out

    def flush(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for the outputs sent so far (raises the producer's KafkaError)."""
        self.producer.flush(timeout=timeout)

    def settle(self) -> bool:
        """Forget acknowledged outputs; True when every output sent so far is acknowledged."""
        self.unsettled = [o for o in self.unsettled if not o.acknowledged]
        return not self.unsettled

    @property
    def unacknowledged(self) -> int:
        """Outputs whose send is still in flight (not failed, not acknowledged)."""
        return sum(1 for o in self.unsettled if o.future is not None and not o.future.is_done)

    def resend(self) -> int:
        """Send again the outputs whose send failed; returns how many."""
        failed = [o for o in self.unsettled if o.failed]
        if not failed:
            return 0
        keep = set(map(id, failed))
        self.unsettled = [o for o in self.unsettled if id(o) not in keep]
        event(log, "outputs_resent", logging.WARNING, records=len(failed),
              error=str(next((o.future.exception for o in failed if o.future is not None), None)))
        self._resent(len(failed))
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
        for o in pending:
            self.send(o)
        self._resent(len(pending))
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

    def safe_offsets(self, held: Mapping[TopicPartition, int] | None = None) -> dict[TopicPartition, int]:
        """Offsets that may be committed: ``next_offset``, held back to the oldest buffered document."""
        held = held or {}
        return {tp: min(nxt, held.get(tp, nxt)) for tp, nxt in self.next_offset.items()}

    def commit(self, consumer: Any, held: Mapping[TopicPartition, int] | None = None,
               only: set[TopicPartition] | None = None) -> dict[TopicPartition, int]:
        """Commit the safe offsets that changed (of ``only`` when given); returns what was committed.

        Does not look at acknowledgements: use :meth:`commit_if_settled`.
        """
        todo = {tp: off for tp, off in self.safe_offsets(held).items()
                if (only is None or tp in only) and self.committed.get(tp) != off}
        if todo:
            consumer.commit({tp: OffsetAndMetadata(off, "", -1) for tp, off in todo.items()})
            self.committed.update(todo)
        return todo

    def commit_if_settled(self, consumer: Any, held: Mapping[TopicPartition, int] | None = None,
                          only: set[TopicPartition] | None = None) -> bool:
        """Commit when every output sent so far is acknowledged; True if it was (and the commit was made)."""
        if not self.settle():
            return False
        self.commit(consumer, held, only)
        return True

    def forget(self, tps: Iterable[TopicPartition] | None = None) -> None:
        """Drop processed and committed offsets (of ``tps``, or all): revoked partitions, a lost log."""
        if tps is None:
            self.next_offset.clear()
            self.committed.clear()
            return
        for tp in tps:
            self.next_offset.pop(tp, None)
            self.committed.pop(tp, None)
