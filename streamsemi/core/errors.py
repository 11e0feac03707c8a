"""The package-wide exception base.

Every exception streamsemi defines for its own failure modes derives from
:class:`StreamsemiError`, so that a caller (the CLI, an embedding application)
can tell "streamsemi refused this input or setting" from a bug or a library
error with one ``except StreamsemiError``. Subclasses usually also derive from
the built-in exception that describes the failure (``ValueError`` for bad
input or settings, ``LookupError`` for an unknown name), so code that catches
those keeps working.
"""

from __future__ import annotations


class StreamsemiError(Exception):
    """Base of every exception defined by streamsemi."""


class ConfigError(StreamsemiError, ValueError):
    """An invalid setting: the message names the setting, the value got and why it is refused.

    Raised at start by :func:`streamsemi.service.config.resolve` (and by the few
    components that check their own arguments, e.g. the embedded broker's port);
    the command line prints it as one line and exits with status 2.
    """


class BrokerError(StreamsemiError, RuntimeError):
    """The embedded broker could not be found or started."""


__all__ = ["BrokerError", "ConfigError", "StreamsemiError"]
