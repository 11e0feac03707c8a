"""Control messages from the console: validated like ``streamsemi label``, then sent and acknowledged."""

from __future__ import annotations

import logging
import threading
from typing import Any

from streamsemi.core.logs import event
from streamsemi.core.messages import (
    ControlMessage,
    Limits,
    Rejected,
    check_outgoing_control,
    encode_json,
)
from streamsemi.service.config import Settings

log = logging.getLogger("streamsemi.console")


def control_limits(settings: Settings) -> Limits:
    """The limits the worker applies to control messages (see ``Worker.__init__``)."""
    return Limits(settings.max_message_bytes, settings.max_text_chars, max_labels_per_doc=settings.max_labels_per_doc)


def check_control(message: dict[str, Any], limits: Limits) -> ControlMessage | Rejected:
    """Validate one control message exactly as ``streamsemi label`` and the worker do (:func:`check_outgoing_control`)."""
    return check_outgoing_control(message, limits)


class ControlWriter:
    """Sends control messages (key = document id) and waits for the broker's acknowledgement.

    Parameters
    ----------
    settings : Settings
        Bootstrap servers, control topic, Kafka security and the validation limits.
    producer : object, optional
        A kafka-python producer (default: :func:`streamsemi.service.kafka_io.make_producer`, made lazily).
    """

    def __init__(self, settings: Settings, producer: Any = None, timeout_s: float = 15.0) -> None:
        self.settings = settings
        self.limits = control_limits(settings)
        self.timeout_s = timeout_s
        self._producer = producer
        self._lock = threading.Lock()
        self.sent = 0

    def validate(self, message: dict[str, Any]) -> str | None:
        """Why ``message`` would be refused (None when it is valid)."""
        parsed = check_control(message, self.limits)
        return parsed.detail if isinstance(parsed, Rejected) else None

    def send(self, message: dict[str, Any]) -> tuple[int, int]:
        """Validate and send one control message; returns its (partition, offset).

        Raises
        ------
        ValueError
            The message is refused by the validation (the reason is the message).
        """
        problem = self.validate(message)
        if problem is not None:
            raise ValueError(problem)
        with self._lock:
            if self._producer is None:
                from streamsemi.service.kafka_io import make_producer

                self._producer = make_producer(self.settings, client_id="streamsemi-console")
            key = message.get("id") or message.get("cluster")
            future = self._producer.send(self.settings.control_topic, key=key.encode() if key else None,
                                         value=encode_json(message))
            meta = future.get(timeout=self.timeout_s)
            self.sent += 1
        event(log, "console_control_sent", op=message.get("op"), partition=meta.partition, offset=meta.offset)
        return meta.partition, meta.offset

    def close(self) -> None:
        with self._lock:
            if self._producer is not None:
                self._producer.close(timeout=5)
                self._producer = None
