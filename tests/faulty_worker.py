"""``streamsemi run`` with faults injected at the boundaries, for reliability tests (never used in production).

Environment variables (document ids, matched exactly):

* ``FAULT_RAISE_ID``: ``Engine.process`` raises RuntimeError for a batch holding this document;
* ``FAULT_KILL_ID``: the process SIGKILLs itself while processing a batch holding this document;
* ``FAULT_NOACK_ID``: the producer (wrapped at ``kafka_io.make_producer``) never acknowledges this
  document's assignment (its future never completes; nothing is sent);
* ``FAULT_SENDFAIL_ID``: sending this document's assignment raises KafkaTimeoutError.

The two producer faults wrap the in-process producer, so with them the worker runs with
``producer_process`` off (``STREAMSEMI_PRODUCER_PROCESS=false``); the producer process's
own failures are tested in tests/test_producer_process.py.

Usage: ``python tests/faulty_worker.py run --bootstrap-servers ...`` (the arguments of ``streamsemi``).
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from kafka.errors import KafkaTimeoutError
from kafka.future import Future

from streamsemi import cli
from streamsemi.engine import Engine
from streamsemi.service import kafka_io

RAISE_ID = os.environ.get("FAULT_RAISE_ID")
KILL_ID = os.environ.get("FAULT_KILL_ID")
NOACK_ID = os.environ.get("FAULT_NOACK_ID")
SENDFAIL_ID = os.environ.get("FAULT_SENDFAIL_ID")

_real_process = Engine.process


def _process(self: Engine, docs: Any, **kw: Any) -> Any:
    ids = {d.id for d in docs}
    if KILL_ID in ids:
        os.kill(os.getpid(), signal.SIGKILL)
    if RAISE_ID in ids:
        raise RuntimeError(f"injected failure for {RAISE_ID}")
    return _real_process(self, docs, **kw)


class _FaultyProducer:
    def __init__(self, real: Any, assignments_topic: str) -> None:
        self.real, self.topic = real, assignments_topic

    def send(self, topic: str, key: bytes | None = None, value: Any = None, headers: Any = None) -> Any:
        doc_id = key.decode() if key else None
        if topic == self.topic and doc_id is not None:
            if doc_id == NOACK_ID:
                return Future()  # never completes
            if doc_id == SENDFAIL_ID:
                raise KafkaTimeoutError(f"injected send failure for {doc_id}")
        return self.real.send(topic, key=key, value=value, headers=headers)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


_real_make_producer = kafka_io.make_producer


def _make_producer(settings: Any, **overrides: Any) -> Any:
    return _FaultyProducer(_real_make_producer(settings, **overrides), settings.assignments_topic)


if RAISE_ID or KILL_ID:
    Engine.process = _process
if NOACK_ID or SENDFAIL_ID:
    kafka_io.make_producer = _make_producer
    os.environ["STREAMSEMI_PRODUCER_PROCESS"] = "false"

if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[1:]))
