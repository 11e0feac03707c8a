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


__all__ = ["lower_priority"]
