"""Structured logging: one JSON object per line on stderr.

Use ``log.info("event_name", extra={"fields": {...}})`` or the :func:`event`
helper. Document text is never logged at INFO level.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any


class JsonFormatter(logging.Formatter):
    """Format a record as ``{"ts", "level", "logger", "event", ...fields}``."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update(fields)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


#: kafka-python's event loop warns whenever one step of a task takes over 0.1 s ("Task ... It is blocking the
#: event loop"): on a busy 2-core machine it did at every start, about work that is not blocked (its own
#: metadata and connection steps). Its errors (a task's unhandled exception) still show.
KAFKA_EVENT_LOOP_LOGGER = "kafka.net.selector"


def quiet_kafka_event_loop(level: str = "INFO") -> None:
    """Show kafka-python's event-loop logger from ERROR up (its slow-step warnings only at ``DEBUG``)."""
    logging.getLogger(KAFKA_EVENT_LOOP_LOGGER).setLevel(logging.WARNING if level == "DEBUG" else logging.ERROR)


def setup(level: str = "INFO", stream: Any = None) -> None:
    """Route the ``streamsemi`` loggers to ``stream`` (stderr) as JSON lines."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger("streamsemi")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
    for noisy in ("kafka",):
        lg = logging.getLogger(noisy)
        lg.handlers[:] = [handler]
        lg.setLevel(logging.WARNING if level != "DEBUG" else logging.INFO)
        lg.propagate = False
    quiet_kafka_event_loop(level)


def event(logger: logging.Logger, name: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log event ``name`` with structured ``fields``."""
    logger.log(level, name, extra={"fields": fields})


def now() -> float:
    return time.time()
