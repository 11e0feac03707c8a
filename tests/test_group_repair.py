"""A consumer group whose every member left rejoins on the embedded broker (service/group_repair.py).

The broker keeps a departed leader when the follower leaves first and the leader leaves while the
group re-forms (before it rejoined);
new members then never get a partition. The test makes that happen on purpose, checks that
the new member sees the stuck signature, then lets the repair act and waits for the
partitions.
"""

from __future__ import annotations

import threading
import uuid

from kafka import KafkaAdminClient, KafkaConsumer
from kafka.admin import NewTopic
from kafka_utils import DEADLINE, wait_for

from streamsemi.service.group_repair import install


class Member(threading.Thread):
    """One group consumer polled by its own thread; the repair runs only once ``repair`` is set."""

    def __init__(self, bootstrap: str, topic: str, group: str) -> None:
        super().__init__(daemon=True)
        self.consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, session_timeout_ms=6000,
                                      heartbeat_interval_ms=1000, auto_offset_reset="earliest",
                                      enable_auto_commit=False)
        self.guard = install(self.consumer)
        assert self.guard is not None
        self.repair = threading.Event()
        self.stop_event = threading.Event()
        self.assigned: set = set()
        self.start()

    def run(self) -> None:
        while not self.stop_event.is_set():
            self.consumer.poll(timeout_ms=300)
            self.assigned = set(self.consumer.assignment())
            if self.repair.is_set():
                self.guard.check()
        self.consumer.close()  # leaves the group (LeaveGroup)

    def leave(self) -> None:
        self.stop_event.set()
        self.join(30)

    @property
    def is_leader(self) -> bool:
        last = self.guard._last_join
        return last is not None and last[1] == last[2]


def test_new_members_get_partitions_after_the_leader_left_last(broker):
    topic, group = "gr" + uuid.uuid4().hex[:8], "gr" + uuid.uuid4().hex[:8]
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    admin.create_topics([NewTopic(topic, 4, 1)])
    admin.close()
    a, b = Member(broker.bootstrap, topic, group), Member(broker.bootstrap, topic, group)
    wait_for(lambda: a.assigned and b.assigned and len(a.assigned | b.assigned) == 4, DEADLINE,
             "both first members assigned")
    leader, follower = (a, b) if a.is_leader else (b, a)
    assert leader.is_leader and not follower.is_leader
    follower.leave()  # the group starts to re-form with the leader still in it ...
    leader.leave()    # ... and the leader leaves before it has: the broker keeps it as the group's leader
    c = Member(broker.bootstrap, topic, group)
    try:
        # without the repair the new member is told to follow the departed leader, generation after generation
        ghost = wait_for(lambda: c.guard.pending, DEADLINE, "the departed-leader signature")
        assert ghost == leader.guard._last_join[2]
        assert not c.assigned
        c.repair.set()
        wait_for(lambda: len(c.assigned) == 4, DEADLINE, "the new member assigned every partition")
        assert c.guard.repairs >= 1
    finally:
        c.leave()


def test_a_healthy_group_is_never_repaired(broker):
    """Members that come and go in a group with a live leader never show the signature."""
    topic, group = "gr" + uuid.uuid4().hex[:8], "gr" + uuid.uuid4().hex[:8]
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    admin.create_topics([NewTopic(topic, 4, 1)])
    admin.close()
    a = Member(broker.bootstrap, topic, group)
    a.repair.set()
    wait_for(lambda: len(a.assigned) == 4, DEADLINE, "the first member assigned")
    b = Member(broker.bootstrap, topic, group)
    b.repair.set()
    wait_for(lambda: a.assigned and b.assigned and len(a.assigned | b.assigned) == 4, DEADLINE, "two members split")
    b.leave()
    wait_for(lambda: len(a.assigned) == 4, DEADLINE, "the first member holding every partition again")
    assert a.guard.repairs == 0 and b.guard.repairs == 0
    a.leave()
