"""Streams: a model's answer as it is written, for those who watch a run.

A provider streams every call (harness.providers.base); each piece of text
is handed to the request's ``on_text``, which here is a :class:`Tap`: it
publishes the pieces, a few milliseconds' worth at a time, to the run's
stream. With ``HARNESS_REDIS_URL`` that is a Redis stream per run (key
``harness:stream:{run_id}:{incarnation}``, capped at :data:`MAX_ENTRIES`
entries, expiring ``HARNESS_STREAM_TTL`` seconds after its last write);
without, the table ``harness_stream`` of the run store, which the sweeper
trims after the same time.

The stream is a view, never the record: a step's recorded answer is the
whole response, recorded and billed once as before, and nothing a reader
does or a stream loses changes it. What makes the view honest is the
``attempt`` of each piece: the step's attempts and retries together, so no
two calls of a step share one. A call is made only when no earlier call of
the step was recorded (a recorded response is served from its record, with
nothing streamed), so when a call begins, every earlier attempt's pieces are
known never to be recorded: its tap's first write says so, a ``discard``
for each earlier attempt, before its own first piece. A retried turn whose
step a user's message takes is never called again under that step: the
runner says it for its calls when the message is taken
(harness.engine.conversation).

Readers (:mod:`harness.streams.feed`) merge the run's stream with its
flight recorder into one sequence of events (``token``, ``discard``,
``step``, ``end``), each with an id that resumes after it: the API's
``GET /api/runs/{id}/events`` (Server-Sent Events) and ``harness follow``.
"""

from __future__ import annotations

from harness.streams.publish import (
    FLUSH_INTERVAL,
    MAX_ENTRIES,
    RedisSink,
    Sink,
    StoreSink,
    Tap,
    stream_key,
)

__all__ = [
    "FLUSH_INTERVAL",
    "MAX_ENTRIES",
    "RedisSink",
    "Sink",
    "StoreSink",
    "Tap",
    "stream_key",
]
