"""Small helpers shared by the worker's child processes (the fit process, the producer process).

Standard library only: the producer process imports this and stays small.
"""

from __future__ import annotations

import os


def lower_priority(nice: int, idle: bool = False) -> None:
    """Add ``nice`` to this process's nice value (no-op for 0; a refusal by the OS is ignored).

    ``idle``: also move the process to Linux's ``SCHED_IDLE`` policy, under which it runs
    only on a core that no normal process wants (a woken normal thread preempts it at
    once, whatever its nice value). Where the policy does not exist (not Linux) or is
    refused, the nice value alone applies.
    """
    if nice:
        try:
            os.nice(nice)
        except OSError:
            pass
    if idle:
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        except (OSError, AttributeError):
            pass


def set_process_nice(pid: int, nice: int) -> bool:
    """Set the nice value of every thread of process ``pid`` to ``nice`` (clamped to -20..19).

    Linux keeps a nice value per thread (``setpriority(PRIO_PROCESS, tid)`` changes one
    thread), so each task under ``/proc/PID/task`` is set; elsewhere the process's.
    Lowering a nice value (a higher priority) needs ``CAP_SYS_NICE`` or an
    ``RLIMIT_NICE`` allowance: False when the OS refused any thread, True otherwise.
    """
    nice = max(-20, min(19, int(nice)))
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except (OSError, ValueError):
        tids = [pid]
    ok = True
    for tid in tids:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        except ProcessLookupError:
            continue  # the thread (or process) has ended
        except (PermissionError, OSError):
            ok = False
    return ok


def process_nice(pid: int) -> int | None:
    """The nice value of process ``pid``'s main thread (None when it cannot be read)."""
    try:
        return os.getpriority(os.PRIO_PROCESS, pid)
    except OSError:
        return None


__all__ = ["lower_priority", "process_nice", "set_process_nice"]
