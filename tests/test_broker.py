"""The embedded broker: its tansu child never outlives `streamsemi broker`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kafka_utils import DEADLINE, alive, wait_for

from streamsemi.core.errors import BrokerError, ConfigError
from streamsemi.devtools.broker import EmbeddedBroker, free_port, port_free, wait_for_port

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")


def _children(pid: int) -> list[int]:
    """Live (not zombie) processes whose parent is ``pid``."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def test_kill9_of_streamsemi_broker_takes_its_tansu_child_down():
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "streamsemi", "broker", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tansu: list[int] = []
    try:
        line = proc.stdout.readline()
        assert json.loads(line) == {"event": "broker_started", "bootstrap_servers": f"127.0.0.1:{port}"}, (
            line + proc.stderr.read())
        wait_for(lambda: _children(proc.pid), DEADLINE, "the tansu child")
        tansu = _children(proc.pid)
        assert len(tansu) == 1 and "tansu" in Path(f"/proc/{tansu[0]}/cmdline").read_bytes().decode(errors="replace")
        assert wait_for_port("127.0.0.1", port, DEADLINE) and not port_free("127.0.0.1", port)

        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(DEADLINE)
        wait_for(lambda: not alive(tansu[0]), DEADLINE, "tansu gone after the kill of `streamsemi broker`", 0.05)
        wait_for(lambda: port_free("127.0.0.1", port), DEADLINE, f"port {port} free after the kill", 0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for pid in tansu:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_sigterm_stops_the_broker_and_frees_the_port():
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "streamsemi", "broker", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "broker_started" in proc.stdout.readline()
        tansu = _children(proc.pid)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(DEADLINE) == 0
        assert all(not alive(pid) for pid in tansu)
        assert port_free("127.0.0.1", port)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_a_taken_port_and_bad_arguments_are_refused_before_starting(tmp_path):
    with EmbeddedBroker(log_file=tmp_path / "tansu.log") as first:
        with pytest.raises(BrokerError, match=f"{first.bootstrap_servers} is already in use"):
            EmbeddedBroker(port=first.port).start()
    with pytest.raises(ConfigError, match=r"setting 'port' \(embedded broker\): must be a TCP port .*got 70000"):
        EmbeddedBroker(port=70000)
    with pytest.raises(ConfigError, match=r"setting 'host' \(embedded broker\): .*got 'not a host'"):
        EmbeddedBroker(host="not a host")


def test_a_broker_that_exits_at_once_is_reported(tmp_path, monkeypatch):
    fake = tmp_path / "tansu"
    fake.write_text("#!/bin/sh\necho 'bad flag' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("STREAMSEMI_TANSU", str(fake))
    t0 = time.monotonic()
    with pytest.raises(BrokerError, match="exited with status 3 before listening"):
        EmbeddedBroker(log_file=tmp_path / "log").start(timeout=2 * DEADLINE)
    # a bound on failure, not a speed: waiting for the whole timeout would take twice as long as this
    assert time.monotonic() - t0 < DEADLINE, "an exited broker is noticed without waiting for the whole timeout"


def test_a_sigterm_while_the_broker_starts_stops_it_cleanly():
    """The handler is in place before the broker starts: a SIGTERM right after ``broker_started`` (here: during
    ``start()`` itself) stops the command with exit code 0 and stops the broker, instead of killing the process."""
    script = """
import argparse, os, signal, sys
import streamsemi.devtools.broker as b
class Fake:
    bootstrap_servers = "127.0.0.1:1"
    stopped = False
    def __init__(self, port, host): pass
    def start(self):
        os.kill(os.getpid(), signal.SIGTERM)   # arrives before broker_started is printed
        return self
    def alive(self): return True
    def stop(self): print("STOPPED", flush=True)
b.EmbeddedBroker = Fake
from streamsemi.cli import cmd_broker
sys.exit(cmd_broker(argparse.Namespace(port=1, host="127.0.0.1")))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, (out.returncode, out.stderr[-500:])
    assert "broker_started" in out.stdout and out.stdout.strip().endswith("STOPPED")
