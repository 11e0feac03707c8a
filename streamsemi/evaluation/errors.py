"""The evaluation layer's exception."""

from __future__ import annotations

from streamsemi.core.errors import StreamsemiError


class EvaluationError(StreamsemiError, ValueError):
    """An evaluation request that cannot be carried out.

    Unknown dataset ids, a draw the data cannot supply (too few classes or seeds),
    labels a metric cannot score (empty, mismatched lengths, unknown normalisation),
    a replay whose engine never fitted. A ``ValueError`` too, so callers that catch
    bad input that way keep working.
    """


__all__ = ["EvaluationError"]
