"""Refits in a separate process: the polling thread never waits on the GIL of a fit.

The engine's refit thread (:meth:`streamsemi.engine.Engine._refit_round`) stays in the
worker process and keeps its whole completion path there (agreement, explanations,
fallback, the model swap, post-round hooks); only the estimators' ``fit`` calls go to
one long-lived *fit process* (multiprocessing, ``spawn`` context) through
:attr:`Engine.fitter <streamsemi.engine.Engine.fitter>`:

* request: the unfitted estimator (its constructor parameters) and, for a warm start,
  the previous model, both in the checkpoints' safe encoding
  (:func:`streamsemi.service.checkpoint.estimator_state`), the snapshot's CSR arrays,
  the seed targets and the document ids;
* reply: the fitted estimator in the same encoding, re-created in the worker with
  :func:`~streamsemi.service.checkpoint.restore_estimator` (classes only from the
  algorithm registry).

Nothing is pickled: each message is one frame of a JSON header and raw numpy buffers of
numeric / bool / fixed-width string dtypes (:func:`frame_parts` / :func:`unpack`), written
from the arrays' own memory and read into one buffer whose views are the arrays
(:func:`send_frame` / :func:`recv_frame`: the kernel copies with the GIL released). The fit process runs with one BLAS
thread and, by default, a priority that follows what the worker needs (setting
``fit_priority = adaptive``): a higher nice value than the worker (a smaller CPU share,
never none: the polling thread keeps its core, and the fit still progresses on a busy
machine) while a model serves, and the worker's own priority while no model serves yet
or a refit runs and the served model is older than ``model_stale_after_s``: then the
fit *is* the hot path (:meth:`FitProcess.set_urgent`, driven by
:class:`streamsemi.service.freshness.ModelFreshness`). ``idle`` (Linux ``SCHED_IDLE``),
``low`` (always nice 10) and ``normal`` keep one fixed priority.

A fit process that dies (killed, out of memory) is reported (``fit_process_died``
event, ``streamsemi_fit_process_deaths_total``) and started again at once; the fit it
was running fails like any failed fit (the algorithm keeps serving its previous
model, or the fallback when it has none) and the next refit round uses the new
process.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import socket
import struct
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp
from prometheus_client import CollectorRegistry, Counter, Gauge

from streamsemi.core.logs import event
from streamsemi.service.checkpoint import estimator_state, restore_estimator
from streamsemi.service.processes import lower_priority, process_nice, set_process_nice

log = logging.getLogger("streamsemi.service.fitter")

_HEADER = struct.Struct("<Q")
_LENGTH = struct.Struct("<Q")  # a frame on the pipe: its length, then the frame
ALIGN = 64  # arrays start at multiples of this in a frame (aligned views for numpy and numba)
MAX_FRAME_BYTES = 1 << 36
#: requested socket buffers of the pipe, both ends (the kernel caps them at net.core.[rw]mem_max)
PIPE_BUFFER_BYTES = 4 << 20
_ARRAY_KINDS = "biufcUS"
MAX_ERROR_CHARS = 2000
SCORES_PROBA = "scores.proba"          # reply arrays of a request with "scores" (the estimator's are a0, a1, ...)
SCORES_INDICATOR = "scores.indicator"
START_TIMEOUT_S = 120.0


class FitProcessDied(RuntimeError):
    """The fit process ended while (or before) fitting; it has been started again."""


class RemoteFitError(RuntimeError):
    """The estimator's ``fit`` raised in the fit process (the message names the exception)."""


class FitProcessClosed(RemoteFitError):
    """The fit process was closed (the worker is shutting down): the refit round is abandoned, not failed."""

    #: :meth:`streamsemi.engine.Engine._refit_round` stops the round quietly on such an error
    abandons_round = True


# ---------------------------------------------------------------- framing (no pickle)
def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def frame_parts(header: dict[str, Any], arrays: dict[str, np.ndarray]) -> list[Any]:
    """One frame as buffers, without copying the arrays: the 8-byte header length, the JSON header
    (with an array table), then each array's raw bytes at an offset aligned to ``ALIGN`` bytes.

    Raises
    ------
    TypeError
        An array of a dtype that is not numeric, bool or fixed-width string.
    """
    table = []
    blobs: list[np.ndarray] = []
    offset = 0
    for name, a in arrays.items():
        a = np.ascontiguousarray(a)
        if a.dtype.kind not in _ARRAY_KINDS or a.dtype.fields is not None:
            raise TypeError(f"array {name!r} of dtype {a.dtype} cannot be sent")
        offset = _aligned(offset)
        table.append([name, a.dtype.str, list(a.shape), offset, a.nbytes])
        blobs.append(a)
        offset += a.nbytes
    head = json.dumps({**header, "arrays": table}, ensure_ascii=False, separators=(",", ":"),
                      allow_nan=False).encode("utf-8")
    base = _aligned(_HEADER.size + len(head))
    parts: list[Any] = [_HEADER.pack(len(head)) + head + bytes(base - _HEADER.size - len(head))]
    at = 0
    for (_, _, _, off, nbytes), a in zip(table, blobs, strict=True):
        if off > at:
            parts.append(bytes(off - at))
        if nbytes:
            parts.append(a.reshape(-1).view(np.uint8))
        at = off + nbytes
    return parts


def unpack(data: Any) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The header and arrays of one frame (:func:`frame_parts` joined); ValueError when it is malformed.

    The arrays are views of ``data``, which they keep alive (writable when ``data`` is:
    :func:`recv_frame`'s own buffer; estimators may update them in place).
    """
    view = memoryview(data).cast("B")
    if len(view) < _HEADER.size:
        raise ValueError("truncated frame")
    (n,) = _HEADER.unpack_from(view)
    if _HEADER.size + n > len(view):
        raise ValueError("truncated frame")
    header = json.loads(bytes(view[_HEADER.size:_HEADER.size + n]))
    base = _aligned(_HEADER.size + n)
    arrays: dict[str, np.ndarray] = {}
    for name, dtype, shape, offset, nbytes in header.pop("arrays"):
        dt = np.dtype(str(dtype))
        if dt.kind not in _ARRAY_KINDS or dt.fields is not None:
            raise ValueError(f"array {name!r}: dtype {dt} not allowed")
        if (offset < 0 or base + offset + nbytes > len(view)
                or int(np.prod(shape, dtype=np.int64)) * dt.itemsize != nbytes):
            raise ValueError(f"array {name!r}: size does not match the frame")
        a = np.frombuffer(view, dtype=dt, count=nbytes // dt.itemsize if dt.itemsize else 0,
                          offset=base + offset).reshape(shape)
        arrays[str(name)] = a
    return header, arrays


def _write_all(fd: int, buf: Any) -> None:
    mv = memoryview(buf).cast("B")
    while mv:
        n = os.write(fd, mv)  # the GIL is released while the kernel copies
        mv = mv[n:]


def send_frame(conn: Any, parts: list[Any]) -> None:
    """Write one frame (:func:`frame_parts`) to the socket of ``conn`` (its ``fileno()``): its length, then its parts.

    The arrays go from their own memory to the kernel (no joined copy): packing
    a 16-56 MB model reply, and the worker's 11 MB snapshot per algorithm, held the GIL
    the polling thread needs for the copies and their fresh pages.
    """
    fd = conn.fileno()
    _write_all(fd, _LENGTH.pack(sum(memoryview(p).nbytes for p in parts)))
    for p in parts:
        _write_all(fd, p)


def _read_into(fd: int, mv: memoryview) -> None:
    while mv:
        n = os.readv(fd, [mv])  # the GIL is released while the kernel copies (and faults the pages in)
        if n == 0:
            raise EOFError("the pipe closed during a frame")
        mv = mv[n:]


def recv_frame(conn: Any) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Read one :func:`send_frame` frame from ``conn``; the arrays are views of its buffer.

    The frame is read straight into a new numpy buffer (the kernel writes it with the
    GIL released; no Python-side copies). EOFError when the pipe is closed before or
    during a frame, OSError for a length beyond ``MAX_FRAME_BYTES``, ValueError for a
    malformed frame.
    """
    fd = conn.fileno()
    head = bytearray(_LENGTH.size)
    _read_into(fd, memoryview(head))
    (total,) = _LENGTH.unpack(head)
    if total > MAX_FRAME_BYTES:
        raise OSError(f"frame of {total} bytes announced (more than {MAX_FRAME_BYTES})")
    buf = np.empty(total, dtype=np.uint8)
    _read_into(fd, memoryview(buf))
    return unpack(buf)


def _widen(conn: Any) -> None:
    """Ask for ``PIPE_BUFFER_BYTES`` send and receive buffers on the socket of ``conn`` (fewer wake-ups per frame)."""
    try:
        sock = socket.socket(fileno=os.dup(conn.fileno()))
    except OSError:
        return
    try:
        for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            sock.setsockopt(socket.SOL_SOCKET, opt, PIPE_BUFFER_BYTES)
    except OSError:
        pass  # not a socket: the default buffers
    finally:
        sock.close()


def _csr_arrays(X: sp.csr_matrix) -> dict[str, np.ndarray]:
    return {"X.data": X.data, "X.indices": X.indices, "X.indptr": X.indptr}


# ---------------------------------------------------------------- the fit process
def _fit_request(header: dict[str, Any], arrays: dict[str, np.ndarray]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    from streamsemi.engine import fit_estimator, score_rows

    registry = header["registry"]
    shape = tuple(int(x) for x in header["shape"])
    X = sp.csr_matrix((arrays["X.data"], arrays["X.indices"], arrays["X.indptr"]), shape=shape)
    est = restore_estimator(header["estimator"], arrays, registry)
    warm = restore_estimator(header["warm"], arrays, registry) if header.get("warm") else None
    y = [list(v) if isinstance(v, list) else v for v in header["y"]]
    t0 = time.perf_counter()
    fit_estimator(est, X, y, header["doc_ids"], warm)
    seconds = time.perf_counter() - t0
    state, out = estimator_state(est)
    reply: dict[str, Any] = {"estimator": state, "seconds": seconds}
    if header.get("scores"):
        try:
            P, indicator = score_rows(est, X, bool(header.get("multilabel")))
        except Exception as exc:  # noqa: BLE001 - the model is fine; the worker scores what it needs itself
            reply["scores_error"] = _error_text(exc)
        else:
            out[SCORES_PROBA] = P
            if indicator is not None:
                out[SCORES_INDICATOR] = indicator
    return reply, out


def serve(conn: Any, nice: int = 0, idle: bool = False) -> None:
    """The fit process's loop: one request frame in, one reply frame out, until the pipe closes."""
    lower_priority(nice, idle)
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(1)  # one core for fits, the other one for the polling thread
    except ImportError:  # pragma: no cover - threadpoolctl comes with scikit-learn
        pass
    _widen(conn)
    while True:
        try:
            request = recv_frame(conn)
        except (EOFError, OSError):
            return
        except ValueError as exc:  # a malformed frame (not from this package's worker)
            reply = _error_reply(exc)
        else:
            try:
                reply = _fit_request(*request)
            except Exception as exc:  # noqa: BLE001 - reported to the worker as this fit's failure
                reply = _error_reply(exc)
            del request
        try:
            parts = frame_parts(*reply)  # what the safe encoding refuses fails here, before a byte is sent
        except (TypeError, ValueError) as exc:  # a fitted model the safe encoding refuses
            parts = frame_parts(*_error_reply(exc))
        del reply
        try:
            send_frame(conn, parts)
        except (EOFError, OSError):
            return
        del parts


def _error_reply(exc: BaseException) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A fit's failure as the reply frame's content: ``{"error": "Type: message"}`` (bounded), no arrays."""
    return {"error": _error_text(exc)}, {}


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]


def _rss_bytes(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


#: the fit process's CPU priority per value of the ``fit_priority`` setting (:class:`FitProcess` arguments).
#: ``adaptive`` (default): nice 10 while a model serves, the worker's priority while the fit is urgent;
#: ``idle``: Linux ``SCHED_IDLE`` (no CPU at all while other processes want it: on a busy machine the
#: first model may never come); ``low``: always nice 10; ``normal``: always the worker's priority.
FIT_PRIORITY: dict[str, dict[str, Any]] = {"adaptive": {"nice": 10, "idle": False, "adaptive": True},
                                           "idle": {"nice": 10, "idle": True, "adaptive": False},
                                           "low": {"nice": 10, "idle": False, "adaptive": False},
                                           "normal": {"nice": 0, "idle": False, "adaptive": False}}


class FitProcess:
    """A long-lived fit process and the :attr:`Engine.fitter` callable that uses it.

    Parameters
    ----------
    registry : CollectorRegistry, optional
        Where ``streamsemi_fit_process_deaths_total``, ``streamsemi_fit_process_starts_total``
        and ``streamsemi_fit_process_resident_bytes`` are registered.
    nice : int
        Added to the fit process's nice value (lower CPU priority than the worker).
    idle : bool
        Run the fit process under Linux's ``SCHED_IDLE`` policy (:func:`lower_priority`):
        it fits only on CPU that nothing else wants, so on a busy machine it may never
        fit at all (setting ``fit_priority = idle``).
    adaptive : bool
        ``nice`` applies only while the fit is not urgent (:meth:`set_urgent`); an urgent
        fit (no model serves yet, or the served one is stale) runs at the worker's own
        priority. The process starts urgent. Raising the priority again after lowering it
        needs ``CAP_SYS_NICE`` (or an ``RLIMIT_NICE`` allowance); where the OS refuses,
        the idle process is started again at the worker's priority before the next fit
        (``fit_priority_raise_refused`` event, once).
    context : str
        Multiprocessing start method (``spawn`` or ``forkserver``).
    """

    def __init__(self, registry: CollectorRegistry | None = None, nice: int = 10, context: str = "spawn",
                 idle: bool = False, adaptive: bool = False) -> None:
        if context not in ("spawn", "forkserver"):
            raise ValueError(f"context must be 'spawn' or 'forkserver', got {context!r}")
        self.nice = int(nice)
        self.idle = bool(idle)
        self.adaptive = bool(adaptive)
        self.base_nice = os.nice(0)  # the worker's own nice value: an urgent fit runs at it
        self.urgent = True           # adaptive: no model yet when the process starts
        self._raise_refused = False  # the OS refused a higher priority: start a new process instead
        self._ctx = multiprocessing.get_context(context)
        self._lock = threading.Lock()
        self._proc: Any = None
        self._conn: Any = None
        self._closed = False
        self.deaths_seen = 0
        r = registry or CollectorRegistry()
        self.deaths = Counter("streamsemi_fit_process_deaths", "Fit processes that died (restarted at once)", registry=r)
        self.starts = Counter("streamsemi_fit_process_starts", "Fit processes started", registry=r)
        self.rss = Gauge("streamsemi_fit_process_resident_bytes",
                         "Resident memory of the fit process after its last fit", registry=r)
        self.nice_gauge = Gauge("streamsemi_fit_process_nice",
                                "Nice value of the fit process (higher: a smaller CPU share than the worker's)",
                                registry=r)
        self.urgent_gauge = Gauge("streamsemi_fit_urgent",
                                  "1 while the fit runs at the worker's priority (no model yet, or a stale one)",
                                  registry=r)
        self.urgent_gauge.set(1 if self.adaptive else 0)

    @property
    def pid(self) -> int | None:
        """The fit process's pid (None when none runs)."""
        p = self._proc
        return p.pid if p is not None and p.is_alive() else None

    def start(self) -> FitProcess:
        """Start the fit process (it imports the algorithms while the worker connects)."""
        with self._lock:
            if self._proc is None:
                self._spawn()
        return self

    def _spawn(self) -> None:
        parent, child = self._ctx.Pipe(duplex=True)
        # adaptive: the process starts at the worker's priority and is lowered from here (set_urgent)
        nice = 0 if self.adaptive else self.nice
        proc = self._ctx.Process(target=serve, args=(child, nice, self.idle), name="streamsemi-fit", daemon=True)
        proc.start()
        _widen(parent)
        child.close()  # the worker keeps one end only: the fit process's death closes the pipe (EOF)
        self._proc, self._conn = proc, parent
        self._raise_refused = False
        self.starts.inc()
        if self.adaptive and not self.urgent:
            set_process_nice(proc.pid, self.base_nice + self.nice)
        self._show_nice(proc.pid)
        event(log, "fit_process_started", pid=proc.pid, nice=process_nice(proc.pid), urgent=self.urgent)

    def _show_nice(self, pid: int) -> None:
        ni = process_nice(pid)
        if ni is not None:
            self.nice_gauge.set(ni)

    def set_urgent(self, urgent: bool) -> None:
        """Run the fit at the worker's priority (``urgent``) or ``nice`` lower (adaptive mode only).

        Called from the polling thread (:class:`streamsemi.service.freshness.ModelFreshness`)
        whenever the answer changes; it takes effect at once, also during a fit. A no-op
        unless ``adaptive``.
        """
        urgent = bool(urgent)
        if not self.adaptive or urgent == self.urgent:
            return
        self.urgent = urgent
        self.urgent_gauge.set(1 if urgent else 0)
        proc = self._proc
        if proc is None or proc.pid is None:
            return
        target = self.base_nice if urgent else self.base_nice + self.nice
        ok = set_process_nice(proc.pid, target)
        if urgent and not ok and not self._raise_refused:
            self._raise_refused = True
            event(log, "fit_priority_raise_refused", logging.WARNING, pid=proc.pid, nice=process_nice(proc.pid),
                  action="the fit process is started again at the worker's priority before the next fit "
                         "(give the worker CAP_SYS_NICE to raise it during a fit)")
        else:
            event(log, "fit_priority_changed", pid=proc.pid, urgent=urgent, nice=process_nice(proc.pid))
        self._show_nice(proc.pid)

    def _died(self, algorithm: str, exc: BaseException) -> FitProcessDied:
        proc = self._proc
        if proc is not None:
            proc.join(2.0)
            if proc.is_alive():  # the pipe broke but the process lives on: end it, a new one replaces it
                proc.kill()
                proc.join(2.0)
        code = None if proc is None else proc.exitcode
        self._close_pipe()
        self.deaths.inc()
        self.deaths_seen += 1
        event(log, "fit_process_died", logging.ERROR, algorithm=algorithm, exitcode=code,
              error=f"{type(exc).__name__}: {exc}", action="restarted; the models in use keep serving")
        self._spawn()
        return FitProcessDied(f"the fit process died while fitting {algorithm} (exit code {code}); restarted")

    def __call__(self, name: str, est: Any, X: sp.csr_matrix, y: Sequence[Any], doc_ids: Sequence[str],
                 warm_start_from: Any = None, *, scores: bool = False, multilabel: bool = False) -> Any:
        """Fit ``est`` (an unfitted estimator of registry algorithm ``name``) in the fit process; the fitted copy.

        With ``scores``, the fitted model also scores ``X`` there
        (:func:`streamsemi.engine.score_rows`, ``multilabel``: with the ``predict``
        indicator) and the call returns ``(fitted copy, (proba, indicator or None))``, or
        ``(fitted copy, None)`` when scoring failed (logged): the worker does not predict its
        own training snapshot again (:class:`streamsemi.engine.SnapshotScores`).

        Raises
        ------
        FitProcessDied
            The process died (it has been restarted).
        RemoteFitError
            ``fit`` raised there, or the fitted model cannot be sent back.
        """
        X = sp.csr_matrix(X)
        header: dict[str, Any] = {"registry": name, "shape": [int(s) for s in X.shape],
                                  "y": list(y),  # tuples of labels go as JSON arrays
                                  "doc_ids": [str(d) for d in doc_ids], "scores": bool(scores),
                                  "multilabel": bool(multilabel)}
        arrays = _csr_arrays(X)
        header["estimator"], arrays = estimator_state(est, arrays)
        if warm_start_from is not None:
            header["warm"], arrays = estimator_state(warm_start_from, arrays)
        parts = frame_parts(header, arrays)  # what the safe encoding refuses fails here (TypeError), not on the pipe
        del arrays
        with self._lock:
            if self._closed:
                raise FitProcessClosed("the fit process is closed (shutting down)")
            if self._proc is None or not self._proc.is_alive():
                if self._proc is not None:
                    raise self._died(name, RuntimeError("not running before the fit"))
                self._spawn()
            elif self.urgent and self._raise_refused:
                self._restart_idle()  # the OS would not raise the niced process: a new one at the worker's priority
            try:
                send_frame(self._conn, parts)
                del parts
                reply, out = recv_frame(self._conn)
            except (EOFError, OSError, ValueError) as exc:
                if self._closed:
                    raise FitProcessClosed("the fit process was closed during the fit") from exc
                raise self._died(name, exc) from exc
            pid = self._proc.pid
        rss = _rss_bytes(pid)
        if rss is not None:
            self.rss.set(rss)
        if "error" in reply:
            raise RemoteFitError(str(reply["error"]))
        proba, indicator = out.pop(SCORES_PROBA, None), out.pop(SCORES_INDICATOR, None)
        fitted = restore_estimator(reply["estimator"], out, name)
        if not scores:
            return fitted
        if "scores_error" in reply:
            event(log, "snapshot_scores_failed", logging.WARNING, algorithm=name, error=str(reply["scores_error"]))
        return fitted, (None if proba is None else (proba, indicator))

    def _restart_idle(self) -> None:
        """Replace the (idle, lock held) fit process with a new one (at the priority :meth:`_spawn` gives)."""
        proc = self._proc
        self._close_pipe()
        if proc is not None:
            proc.join(2.0)
            if proc.is_alive():
                proc.kill()
                proc.join(2.0)
        self._spawn()

    def close(self, timeout: float = 1.0) -> None:
        """Stop the fit process (a fit in flight fails with :class:`FitProcessClosed`, its result is not waited for).

        An idle process exits when its pipe closes; one that is fitting is killed after
        ``timeout`` seconds (a shutdown does not wait for a fit it would throw away).
        """
        self._closed = True
        proc = self._proc
        # A fit in flight holds the lock and waits in ``recv_bytes`` on the pipe: closing the pipe
        # under it handed that read a closed handle (``TypeError: 'NoneType' object cannot be
        # interpreted as an integer``, logged as the fit's error at every shutdown during a fit).
        # So the pipe is closed only once no fit holds it: an idle process exits at the EOF, a
        # fitting one is killed after ``timeout`` and its fit ends with "closed during the fit".
        idle = self._lock.acquire(blocking=False)
        if idle:
            self._close_pipe()
            self._lock.release()
        if proc is not None:
            proc.join(timeout)
            if proc.is_alive():
                proc.kill()
                proc.join(5.0)
        if not idle and self._lock.acquire(timeout=5.0):  # the fit's read has ended (reply or EOF)
            self._close_pipe()
            self._lock.release()

    def _close_pipe(self) -> None:
        conn = self._conn
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001
                pass
