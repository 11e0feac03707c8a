"""Small helpers shared by the worker's child processes (the fit process, the producer process).

Standard library only: the producer process imports this and stays small.
"""

from __future__ import annotations

import os


def lower_priority(nice: int) -> None:
    """Add ``nice`` to this process's nice value (no-op for 0; a refusal by the OS is ignored)."""
    if nice:
        try:
            os.nice(nice)
        except OSError:
            pass


__all__ = ["lower_priority"]
