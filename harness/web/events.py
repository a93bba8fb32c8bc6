"""A run as it happens, over HTTP: ``GET /api/runs/{id}/events``, a
Server-Sent Events stream of its answers as they are written and its
transitions (harness.streams.feed says what each event is)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Header, Query
from fastapi.responses import StreamingResponse

from harness.reads import Reads
from harness.streams.feed import MAX_ID, Cursor, Sources, follow
from harness.web.routing import Problems, RunId

_DESCRIBED = """\
The run's events until it ends, as Server-Sent Events (`text/event-stream`):

- `token` `{"step", "attempt", "text"}`: a piece of a model step's answer as
  the provider writes it, in order. `attempt` counts every call of the step.
- `discard` `{"step", "attempt"}`: that attempt's pieces will not be recorded
  (its worker died, its call is retried): drop what it wrote.
- `step`: a transition, as an item of `GET /api/runs/{id}/history`.
- `end` `{"status"}`: the run has ended (completed with no message waiting,
  failed, cancelled); the stream closes. A completed run that gets a message
  moves again: open the stream anew.

Every event has an `id`; reconnecting with `Last-Event-ID` (or `?after=ID`)
resumes after it, with no event given twice. A comment (`: keepalive`) comes after 15 quiet
seconds. The pieces are a view: the recorded answer is the whole response,
in the step's `result`, whatever the stream showed."""

_EXAMPLE = (
    'id: 3:1733331000000-0\nevent: token\ndata: {"step":0,"attempt":1,"text":"Hello"}\n\n'
    'id: 5:1733331000000-0\nevent: step\ndata: {"id":5,"run_id":"r1","version":3,...}\n\n'
    'id: 6:1733331000000-0\nevent: end\ndata: {"status":"completed"}\n\n'
)


def event_routes(
    router: APIRouter, reads: Reads, redis_url: str | None, problems: Problems
) -> None:
    """The event stream of a run."""
    sources = Sources(reads.store, redis_url)

    @router.get(
        "/runs/{run_id}/events",
        response_class=StreamingResponse,
        description=_DESCRIBED,
        responses={
            **problems,
            200: {
                "description": "The run's events",
                "content": {
                    "text/event-stream": {"schema": {"type": "string"}, "example": _EXAMPLE}
                },
            },
        },
    )
    async def events(
        run_id: RunId,
        last_event_id: Annotated[
            str | None,
            Header(max_length=MAX_ID, description="The id of the last event you have"),
        ] = None,
        after: Annotated[
            str | None,
            Query(
                max_length=MAX_ID,
                description="As Last-Event-ID, for a client that cannot set headers "
                "(a browser's first EventSource); the header wins when both are given",
            ),
        ] = None,
    ) -> StreamingResponse:
        """Follow the run: its answers as they are written, its transitions."""
        header = Cursor.parse(last_event_id) if last_event_id else None
        cursor = header or Cursor.parse(after, "after")
        run = await asyncio.to_thread(reads.run, run_id)  # a run that is not: 404

        async def body() -> AsyncIterator[bytes]:
            source, recorder = sources.open(run), sources.recorder()
            async for event in follow(reads.store, source, run, cursor, recorder=recorder):
                yield event.encode()

        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(body(), media_type="text/event-stream", headers=headers)
